"""Per model × system defaults: ``--model M [--system S]`` alone is valid, and says where its layout
came from; a conflict with an inherited value names it and its source (issue 14, item 1).

The tests read the shipped table instead of hard-coding layouts: the lead regenerates it
(``python tools/scenario_defaults.py``) when models and systems change.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topologies.hardware import Precision, load_system, system_names
from workloads.models import model_names
from workloads.scenario_defaults import (
    fallback_defaults,
    layered_config,
    load_table,
    lookup_defaults,
    resolve_layered,
)

ROOT = Path(__file__).resolve().parents[1]


def test_every_catalogue_pair_has_exactly_one_default_entry() -> None:
    """If this fails after adding a model or a system: run python tools/scenario_defaults.py."""
    table = load_table()
    for model in model_names():
        for system in system_names():
            entries = [e for e in table.entries if e.model == model and e.system == system]
            assert entries, f"no defaults for {model} on {system}: run python tools/scenario_defaults.py"
            assert sum(e.default for e in entries) == 1, (model, system)
            supported = load_system(system).gpu.supported_precisions
            assert all(e.precision in supported for e in entries), (model, system)
            for e in entries:
                assert e.source and (e.kind != "recipe" or "mb-" in e.source), e  # recipe entries cite their run


@pytest.mark.parametrize("model", model_names())
def test_predict_model_alone_and_on_every_system(run_cli, model: str) -> None:
    """Acceptance: ``predict --model M`` and ``predict --model M --system S`` for every S, each
    printing the layout it picked and its source, and each fitting in memory."""
    res = run_cli("predict", "--model", model)
    assert res.exit_code == 0, res.output
    chosen = lookup_defaults(model, "gb300-nvl72")
    assert chosen is not None and "layout from" in res.stdout and chosen.kind in res.stdout, res.stdout
    for system in system_names():
        args = ["predict", "--model", model, "--system", system, "--json"]
        res = run_cli(*args)
        assert res.exit_code == 0, (args, res.output)
        data = json.loads(res.stdout)
        chosen = lookup_defaults(model, system)
        assert chosen is not None and data["layout"]["defaults"]["source"] == chosen.source
        memory = data["memory"]
        assert memory["fits"], (args, f"{memory['total_bytes'] / 1e9:.1f} GB of {memory['capacity_bytes'] / 1e9:.0f} GB")


def test_every_entry_fits_in_memory_and_a_recipe_entry_carries_its_settings() -> None:
    """Every entry of the table (each precision, not only the defaults) fits as predict judges it,
    with the default optimizer (Muon); a recipe entry names the recipe settings it carries."""
    from workloads.memory import memory_breakdown

    for e in load_table().entries:
        sc = resolve_layered(layered_config(None, {"model": e.model, "system": e.system, "precision": e.precision.value}))
        mem = memory_breakdown(sc)
        assert sc.optimizer.kind == "muon" and mem.fits(), (
            f"{e.model} on {e.system} ({e.precision.value}, {e.kind}): {mem.total_bytes / 1e9:.1f} GB of "
            f"{mem.capacity_bytes / 1e9:.0f} GB")
        if e.kind == "recipe":
            assert "recipe settings as '--release" in e.source and (e.runtime or e.optimizer), e.source


def test_a_recipe_default_predicts_its_run_as_release_would() -> None:
    """``predict --model M --system S`` on a recipe default is the scenario ``--release R`` of its run
    gives (the run's recipe settings are in the table), so adding ``--release R`` changes nothing."""
    import re

    from cli.common import resolve_release_scenario, resolve_with_layout
    from workloads.recipe_settings import recipe_for

    checked = 0
    for e in load_table().entries:
        found = re.search(r"Megatron-Bridge (\S+) performance recipe, published run (\S+)", e.source)
        if e.kind != "recipe" or found is None or "MTP layer" in e.source:  # --release would apply the run's MTP
            continue
        release, run_id = found.groups()
        choice = recipe_for(e.model, e.system, release, e.gpus, e.precision.value)
        if choice is None or choice.run_id != run_id:
            continue
        flags = {"model": e.model, "system": e.system, "precision": e.precision.value}
        plain, _ = resolve_with_layout(None, flags)
        with_release, _, settings = resolve_release_scenario(None, flags, release)
        assert settings is not None and settings.choice.run_id == run_id
        assert plain.config.model_dump() == with_release.config.model_dump(), (e.model, e.system, e.precision.value)
        checked += 1
    assert checked >= 10


def test_json_names_the_defaults_and_what_the_user_set(run_cli) -> None:
    data = json.loads(run_cli("predict", "--model", "llama3-70b", "--system", "dgx-h100", "--mbs", "1", "--json").stdout)
    layout = data["layout"]
    assert layout["defaults"]["model"] == "llama3-70b" and layout["defaults"]["system"] == "dgx-h100"
    assert layout["defaults"]["source"] and "micro_batch_size" in layout["set_by_user"]
    assert "tp" in layout["inherited"] and data["scenario"]["precision"] == layout["defaults"]["precision"]


def test_conflict_with_an_inherited_value_names_it_and_its_source(run_cli) -> None:
    """Kimi K2 on GB300 inherits vpp 4 (NVIDIA's published run): --pp 1 conflicts with it."""
    chosen = lookup_defaults("kimi-k2", "gb300-nvl72")
    assert chosen is not None and chosen.parallelism["vpp"] > 1
    res = run_cli("predict", "--pp", "1")
    assert res.exit_code == 2
    err = res.stderr.strip()
    assert "\n" not in err and err.startswith("error: vpp > 1 needs pp > 1"), err
    assert f"vpp {chosen.parallelism['vpp']}" in err and "not set by you" in err
    assert "defaults of kimi-k2 on gb300-nvl72" in err and "--vpp" in err


def test_a_value_the_user_set_is_not_blamed_on_the_defaults(run_cli) -> None:
    res = run_cli("predict", "--model", "llama3-70b", "--ep", "8")
    assert res.exit_code == 2 and "ep and etp must be 1" in res.stderr and "not set by you" not in res.stderr


def test_switching_system_takes_that_systems_defaults() -> None:
    """plan --system dgx-h100 must not keep GB300's mxfp8 (H100 has no MXFP8) or its batch silently."""
    from cli.cmd_plan import _base_and_reference

    base, _, _, layered = _base_and_reference(None, {"system": "dgx-h100"})
    chosen = lookup_defaults("kimi-k2", "dgx-h100")
    assert chosen is not None
    assert base.precision == chosen.precision and base.precision in base.system.gpu.supported_precisions
    assert base.gpus == chosen.gpus
    assert base.par.global_batch_size == chosen.parallelism["global_batch_size"]
    assert "defaults of kimi-k2 on dgx-h100" in layered.summary()


def test_a_named_precision_picks_that_precisions_entry() -> None:
    pairs = {}
    for e in load_table().entries:
        pairs.setdefault((e.model, e.system), []).append(e)
    model, system, entry = next((m, s, e) for (m, s), es in pairs.items() if len(es) > 1 for e in es if not e.default)
    layered = layered_config(None, {"model": model, "system": system, "precision": entry.precision.value})
    sc = resolve_layered(layered)
    assert sc.precision == entry.precision and sc.gpus == entry.gpus
    assert all(getattr(sc.par, k) == v for k, v in entry.parallelism.items())


def test_scenario_file_layers_over_the_defaults(tmp_path: Path) -> None:
    """A file without a parallelism section takes the pair's; with one, its own (missing fields at
    Megatron's defaults); a file that sets no precision takes the pair's, never GB300's mxfp8."""
    f = tmp_path / "s.yaml"
    f.write_text("model: llama3-8b\nsystem: dgx-h100\n", encoding="utf-8")
    from workloads.scenario import read_scenario_file

    chosen = lookup_defaults("llama3-8b", "dgx-h100")
    assert chosen is not None
    layered = layered_config(read_scenario_file(f), {}, file=str(f))
    sc = resolve_layered(layered)
    assert sc.precision == chosen.precision and sc.gpus == chosen.gpus
    f.write_text("model: llama3-8b\nsystem: dgx-h100\ngpus: 8\nparallelism: {global_batch_size: 64, seq_length: 2048}\n",
                 encoding="utf-8")
    layered = layered_config(read_scenario_file(f), {"tp": "2"}, file=str(f))
    sc = resolve_layered(layered)
    assert (sc.par.tp, sc.par.pp, sc.par.vpp, sc.par.global_batch_size) == (2, 1, 1, 64)
    assert layered.origin["tp"] == "flag" and layered.origin["pp"] == "built-in"
    assert layered.origin["global_batch_size"] == "file" and layered.origin["precision"] == "defaults"


def test_unknown_pair_falls_back_and_says_so(tmp_path: Path, run_cli) -> None:
    """A model file with a name the table does not know gets a minimal layout that says what it is."""
    text = (ROOT / "workloads/data/models/llama3-8b.yaml").read_text(encoding="utf-8")
    (tmp_path / "mini.yaml").write_text(text.replace("name: llama3-8b", "name: my-llama"), encoding="utf-8")
    res = run_cli("predict", "--model", str(tmp_path / "mini.yaml"), "--system", "dgx-b200", "--json")
    assert res.exit_code == 0, res.output
    defaults = json.loads(res.stdout)["layout"]["defaults"]
    assert defaults["kind"] == "fallback" and "no shipped defaults" in defaults["source"]
    fb = fallback_defaults("my-llama", load_system("dgx-h100"))
    assert fb.precision == Precision.FP8_CS and fb.gpus == 8


def test_recipe_settings_of_the_defaults_layout_drop_when_the_user_changes_it() -> None:
    """DeepSeek-V3's GB300 default carries its recipe's pipeline layout for pp 2 vpp 8: with --pp 4
    --vpp 4 the layout no longer applies and is dropped (as --release drops it), not an error."""
    chosen = lookup_defaults("deepseek-v3", "gb300-nvl72")
    assert chosen is not None and chosen.kind == "recipe" and chosen.parallelism.get("pipeline_model_parallel_layout")
    same = layered_config(None, {"model": "deepseek-v3"})
    assert same.config.parallelism.pipeline_model_parallel_layout == chosen.parallelism["pipeline_model_parallel_layout"]
    layered = layered_config(None, {"model": "deepseek-v3", "pp": "4", "vpp": "4"})
    sc = resolve_layered(layered)
    assert sc.par.pipeline_model_parallel_layout is None and layered.origin["pipeline_model_parallel_layout"] == "built-in"
    assert (sc.par.pp, sc.par.vpp) == (4, 4)


def test_plan_candidates_of_another_layout_drop_the_defaults_pipeline_layout() -> None:
    """``plan --model deepseek-v3`` searches pp and vpp: the GB300 default's recipe layout (pp 2 vpp 8)
    must not make every other candidate invalid."""
    from costmodel.planner.space import candidate_config, normalised

    base = layered_config(None, {"model": "deepseek-v3"}).config
    other = candidate_config(base, normalised(1, 4, 4, 1, 32, 1, 1, "selective", "muon", "layer_wise", "current",
                                              None, "lpt", False)).resolve()
    assert other.par.pipeline_model_parallel_layout is None and (other.par.pp, other.par.vpp) == (4, 4)
    own = candidate_config(base, normalised(1, 2, 8, 1, 32, 1, 1, "selective", "muon", "layer_wise", "current",
                                            None, "lpt", False)).resolve()
    assert own.par.pipeline_model_parallel_layout == base.parallelism.pipeline_model_parallel_layout


def test_sequence_parallel_off_from_a_tp1_recipe_does_not_carry_to_tp_above_1() -> None:
    """Llama 3 8B's GB300 default is a tp-1 recipe run with sequence_parallel false (moot at tp 1; the
    Bridge recipes turn it on with tp > 1). --tp 4 gets Megatron's default (on), as do the planner's
    tp > 1 candidates; the recipe's tp 1 and an explicit --sequence-parallel off keep it off."""
    from costmodel.planner.space import candidate_config, normalised

    chosen = lookup_defaults("llama3-8b", "gb300-nvl72")
    assert chosen is not None and chosen.parallelism["tp"] == 1 and chosen.parallelism["sequence_parallel"] is False
    assert resolve_layered(layered_config(None, {"model": "llama3-8b"})).par.uses_sequence_parallel is False
    tp4 = layered_config(None, {"model": "llama3-8b", "tp": "4"})
    assert tp4.origin["sequence_parallel"] == "built-in" and resolve_layered(tp4).par.uses_sequence_parallel
    off = layered_config(None, {"model": "llama3-8b", "tp": "4", "sequence_parallel": "false"})
    assert resolve_layered(off).par.uses_sequence_parallel is False
    base = layered_config(None, {"model": "llama3-8b"}).config

    def candidate(tp: int):  # noqa: ANN202
        return candidate_config(base, normalised(tp, 1, 1, 1, 1, 1, 1, "none", "muon", "layer_wise", "current",
                                                 None, "lpt", False)).resolve()

    assert candidate(2).par.uses_sequence_parallel and not candidate(1).par.uses_sequence_parallel


def test_why_muon_needs_more_memory_than_adamw_on_an_mxfp8_recipe() -> None:
    """Llama 3 70B on 64 GB300, MXFP8, the 26.04.01 recipe (tp1 pp4 vpp5, fp8_param_gather with the
    gradient buffer reused for the parameter gather): AdamW keeps MXFP8 primary weights (rowwise +
    columnwise, 2·(1 + 1/32) B per GEMM element), Muon keeps bf16 weights (2 B) plus Transformer
    Engine's MXFP8 copy, because Megatron-Core 0.16.1 runs Muon without the distributed optimizer
    (muon.py: 'muon with dist optimizer is not supported'), whose Float16OptimizerWithFloat16Params
    takes only fp16/bf16/fp32 parameters; FP8 primary weights exist only with the element-wise
    distributed optimizer or Megatron-FSDP. Hand calculation of the difference on the fullest stage:
    + 2 B × GEMM elements (the bf16 copy) - 4 B × params / dp (AdamW's second moment, Muon has one
    fp32 momentum), the layer-wise legacy ping-pong imbalance aside."""
    from cli.common import resolve_release_scenario
    from workloads.inventory import inventory_for
    from workloads.memory import memory_breakdown
    from workloads.weight_memory import low_precision_gemm

    flags = {"model": "llama3-70b", "system": "gb300-nvl72", "precision": "mxfp8", "gpus": "64", "tp": "1", "pp": "4",
             "vpp": "5", "ep": "1", "micro_batch_size": "1", "global_batch_size": "256", "seq_length": "8192"}
    muon, _, _ = resolve_release_scenario(None, flags | {"optimizer": "muon"}, "26.04.01")
    adamw, _, _ = resolve_release_scenario(None, flags | {"optimizer": "adamw"}, "26.04.01")
    m, a = memory_breakdown(muon), memory_breakdown(adamw)
    assert m.stage == a.stage and muon.optimizer.fp8_param_gather and muon.dp == 16
    tensors = inventory_for(muon).stage_tensors(m.stage)
    params = sum(t.rank_numel for t in tensors)
    gemm = sum(t.rank_numel for t in tensors if low_precision_gemm(muon, t))
    mxfp8 = 2 * (1 + 1 / 32)
    assert m.weights_bytes == pytest.approx(2 * params) and m.weight_buffers_bytes == pytest.approx(mxfp8 * gemm)
    assert a.weights_bytes == pytest.approx(mxfp8 * gemm + 2 * (params - gemm)) and a.weight_buffers_bytes == 0
    assert a.optimizer_state_bytes == pytest.approx(12 * params / 16, rel=1e-3)
    assert m.optimizer_state_bytes == pytest.approx(8 * params / 16, rel=0.05)  # ping-pong: whole params per rank
    extra = (m.persistent_bytes - a.persistent_bytes) - (2 * gemm - 4 * params / 16)
    assert abs(extra) < 0.05 * 8 * params / 16  # only the ping-pong imbalance of the Muon state remains
    assert m.total_bytes > m.capacity_bytes > a.total_bytes  # hence the default is the NVFP4 recipe


def test_terminal_layout_source_drops_file_paths_and_refs_but_json_keeps_them() -> None:
    """The 'layout from' row wrapped into ellipsis-cut file paths at 80 columns: the terminal line
    drops the parenthesised paths and git refs (``--json`` keeps the full source)."""
    from workloads.scenario_defaults import without_path_groups

    text = ("recipe, published run R (workloads/data/x.csv) with its settings (f.csv, Org/Repo@abc (v0.4.0); "
            "30 of 67 differ) and (PP4 DP64; blog) kept")
    assert without_path_groups(text) == "recipe, published run R with its settings and (PP4 DP64; blog) kept"
    assert without_path_groups("unbalanced (a/b") == "unbalanced (a/b"


STALE_TOLERANCE = 0.02
"""How far (relative) a search default's prediction may drift from the step time stored when it was
generated before the entry counts as stale: past that, the model has changed enough that the stored
layout may no longer be the planner's best."""


def test_a_search_default_still_predicts_what_it_was_chosen_for(run_cli) -> None:
    """A ``search`` entry is the best plan under the model that generated it, and its source states
    the step time it had then. If the model moves that prediction by more than 2 %, the stored layout
    is stale (it may no longer be the best plan, and ``predict --model M --system S`` would quietly
    give users a layout the planner no longer picks): run ``python tools/scenario_defaults.py``."""
    import re

    stale, checked = [], 0
    for e in load_table().entries:
        found = re.search(r"([\d.]+) s/step when generated", e.source)
        if e.kind != "search" or found is None:
            continue
        res = run_cli("predict", "--model", e.model, "--system", e.system, "--precision", e.precision.value, "--json")
        assert res.exit_code == 0, res.output
        now_s, then_s = json.loads(res.stdout)["step_time_s"], float(found.group(1))
        checked += 1
        if abs(now_s / then_s - 1) > STALE_TOLERANCE:
            stale.append(f"{e.model} on {e.system} ({e.precision.value}): {then_s:.3f} s when generated, {now_s:.3f} s now")
    assert checked >= 10
    assert not stale, "stale search defaults (run python tools/scenario_defaults.py): " + "; ".join(stale)
