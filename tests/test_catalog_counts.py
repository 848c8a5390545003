"""Parameter and FLOP counts against ../shared/data/models.md §5.6 and flops-convention.md."""

from __future__ import annotations

import pytest

from workloads.flops import model_flops_per_token, newton_schulz_cost_proxy, newton_schulz_flops
from workloads.inventory import active_params, build_inventory
from workloads.models import load_model

# models.md §5.6 (billions): total, active incl. embedding+head, active excl.
PARAMS_B = {
    "llama3-8b": (8.03, 8.03, 6.98),
    "llama3-70b": (70.55, 70.55, 68.45),
    "llama3.1-405b": (405.85, 405.85, 401.65),
    "qwen3-30b-a3b": (30.53, 3.35, 2.73),
    "qwen3-235b-a22b": (235.09, 22.19, 20.95),
    "deepseek-v3": (671.03, 37.55, 35.70),
    "kimi-k2": (1026.41, 32.86, 30.51),
}

# flops-convention.md "Exact totals in FLOPs per token" (TP 1)
FLOPS_PER_TOKEN = {
    ("llama3-8b", 8192): 51_470_401_536,
    ("llama3-70b", 8192): 449_222_541_312,
    ("llama3.1-405b", 8192): 2_523_955_986_432,
    ("qwen3-30b-a3b", 4096): 23_006_281_728,
    ("qwen3-235b-a22b", 4096): 148_034_813_952,
    ("deepseek-v3", 4096): 249_812_054_016,
    ("deepseek-v3-mtp", 4096): 259_992_950_784,
    ("kimi-k2", 4096): 204_477_394_944,
}


@pytest.mark.parametrize("name", sorted(PARAMS_B))
def test_parameter_counts_within_half_percent(name: str) -> None:
    model = load_model(name)
    total, active, active_excl = PARAMS_B[name]
    assert build_inventory(model).params_total / 1e9 == pytest.approx(total, rel=5e-3)
    assert active_params(model) / 1e9 == pytest.approx(active, rel=5e-3)
    assert active_params(model, include_embeddings=False) / 1e9 == pytest.approx(active_excl, rel=5e-3)


def test_glm5_parameter_counts_without_its_mtp_layer() -> None:
    """models.md §5.6 counts GLM-5 without the DSA indexer and without the MTP layer:
    742.36B total, 40.24B active with embedding and head, 38.33B without."""
    model = load_model("glm-5").model_copy(update={"mtp_layers": 0})
    assert build_inventory(model).params_total / 1e9 == pytest.approx(742.36, rel=5e-4)
    assert active_params(model) / 1e9 == pytest.approx(40.24, rel=5e-4)
    assert active_params(model, include_embeddings=False) / 1e9 == pytest.approx(38.33, rel=5e-4)


@pytest.mark.parametrize(("name", "seq"), sorted(FLOPS_PER_TOKEN))
def test_flops_per_token_within_0p2_percent(name: str, seq: int) -> None:
    assert model_flops_per_token(load_model(name), seq) == pytest.approx(FLOPS_PER_TOKEN[(name, seq)], rel=2e-3)


def test_vocab_padding_changes_flops_with_tp() -> None:
    ds = load_model("deepseek-v3")
    assert ds.padded_vocab_size(2) == 130_560 and ds.padded_vocab_size(4) == 133_120
    assert model_flops_per_token(ds, 4096, tp=8) > model_flops_per_token(ds, 4096, tp=1)


def test_newton_schulz_flops_formulas() -> None:
    # 4 m^2 n + 2 m^3 per step with m = min dim; the transpose makes shape order irrelevant
    assert newton_schulz_flops(256, 1024, steps=5) == 5 * (4 * 256**2 * 1024 + 2 * 256**3)
    assert newton_schulz_flops(1024, 256, steps=5) == newton_schulz_flops(256, 1024, steps=5)
    assert newton_schulz_flops(512, 512, steps=1, use_syrk=True) == 3 * 512**3 + 512**3
    assert newton_schulz_flops(512, 512, steps=1) == 30 * 512**3 / 5
    assert newton_schulz_cost_proxy(100, 300) == 300 * 100 * 100


def test_catalog_table_shows_every_name_whole_at_80_columns(run_cli) -> None:
    from topologies.hardware import system_names
    from workloads.models import model_names

    result = run_cli("catalog")
    assert result.exit_code == 0, result.output
    words = result.stdout.replace("│", " ").split()
    for name in [*system_names(), *model_names()]:
        assert name in words, name
