"""Scenario model: the built-in default, YAML + flag overrides, derived sizes, pipeline splits."""

from __future__ import annotations

from pathlib import Path

import pytest

from topologies.inputs import UserInputError
from workloads.pipeline_layout import virtual_stage_layer_counts
from workloads.scenario import DEFAULT_SCENARIO, build_config, load_scenario_config


def test_default_scenario_is_the_issue_default(default_scenario) -> None:
    sc = default_scenario
    p = sc.par
    assert (sc.model.name, sc.system.name, sc.gpus, sc.precision.value) == ("kimi-k2", "gb300-nvl72", 256, "mxfp8")
    assert (p.tp, p.pp, p.vpp, p.ep, p.micro_batch_size, p.global_batch_size, p.seq_length) == (1, 4, 4, 64, 2, 4096, 4096)
    assert (sc.optimizer.kind, sc.optimizer.resolved_distribution) == ("muon", "layer_wise")
    assert (sc.dp, sc.expert_dp, sc.num_microbatches) == (64, 1, 32)
    assert sc.tokens_per_step == 4096 * 4096


def test_yaml_file_then_flags_override_it(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(
        "model: llama3-70b\nsystem: gb200-nvl72\ngpus: 64\nprecision: fp8-cs\n"
        "parallelism: {tp: 4, pp: 4, vpp: 5, micro_batch_size: 1, global_batch_size: 256, seq_length: 8192}\n"
        "optimizer: {kind: adamw}\n", encoding="utf-8")
    cfg = load_scenario_config(f, {"tp": "2", "optimizer": "muon", "recompute": "full"})
    sc = cfg.resolve()
    assert (sc.par.tp, sc.par.pp, sc.par.vpp, sc.par.recompute) == (2, 4, 5, "full")
    assert sc.optimizer.kind == "muon" and sc.optimizer.resolved_distribution == "layer_wise"
    assert sc.dp == 64 // (2 * 4) and sc.num_microbatches == 256 // sc.dp
    assert sc.par.uses_sequence_parallel  # default on with tp > 1


def test_model_and_system_paths_in_a_scenario_file_may_be_relative_to_it(tmp_path: Path, monkeypatch) -> None:
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "my-model.yaml").write_text((root / "workloads/data/models/llama3-8b.yaml").read_text())
    (tmp_path / "my-system.yaml").write_text((root / "topologies/data/systems/dgx-h100.yaml").read_text())
    f = tmp_path / "s.yaml"
    f.write_text("model: my-model.yaml\nsystem: my-system.yaml\ngpus: 8\nprecision: fp8-cs\n"
                 "parallelism: {pp: 1, vpp: 1, ep: 1, micro_batch_size: 1, global_batch_size: 128,"
                 " seq_length: 8192}\n", encoding="utf-8")
    monkeypatch.chdir(root)  # not the scenario's directory
    sc = load_scenario_config(f).resolve()
    assert (sc.model.name, sc.system.name) == ("llama3-8b", "dgx-h100")


def test_with_updates_revalidates(default_scenario) -> None:
    sc = default_scenario.with_updates(optimizer="adamw", gpus=512)
    assert sc.optimizer.resolved_distribution == "element_wise" and sc.dp == 128
    with pytest.raises(UserInputError, match="ep 5 does not divide"):
        default_scenario.with_updates(ep=5)
    with pytest.raises(UserInputError, match="unknown scenario setting 'tensor_parallel'"):
        default_scenario.with_updates(tensor_parallel=2)


@pytest.mark.parametrize(("flags", "message"), [
    ({"optimizer": "muon", "distribution": "element_wise"}, "muon cannot use the element_wise"),
    ({"optimizer": "adamw", "distribution": "layer_wise"}, "layer_wise distributed optimizer is for muon"),
    ({"fsdp": 8}, "Megatron-FSDP"),
    ({"vpp": 2, "pp": 1, "gpus": 64}, "vpp > 1 needs pp > 1"),
    ({"cp": 2, "seq_length": 4095, "gpus": 512}, "seq_length divisible by 2·cp"),
    ({"gpus_per_domain": 80}, "gpus_per_domain 80 exceeds"),
])
def test_cross_field_rules(flags: dict, message: str) -> None:
    with pytest.raises(UserInputError, match=message) as info:
        build_config(DEFAULT_SCENARIO.model_dump(), flags).resolve()
    assert "\n" not in str(info.value)


def test_dense_model_rejects_expert_parallelism() -> None:
    with pytest.raises(UserInputError, match="no experts"):
        build_config({}, {"model": "llama3-8b", "gpus": 8, "ep": 2, "global_batch_size": 8, "seq_length": 128}).resolve()


def test_pipeline_splits() -> None:
    assert virtual_stage_layer_counts(32, 4, 2) == [4] * 8
    kimi = virtual_stage_layer_counts(61, 4, 4)  # 61 layers: balanced, lighter first and last
    assert sum(kimi) == 61 and max(kimi) - min(kimi) == 1 and kimi[0] == kimi[-1] == min(kimi)
    # Llama 3.1 405B on pp 16 x vpp 8 (measured on GB200): the embedding and the loss each take a
    # virtual stage of their own, as with Megatron's account_for_embedding/loss_in_pipeline_split
    llama = virtual_stage_layer_counts(126, 16, 8)
    assert sum(llama) == 126 and llama[0] == llama[-1] == 0 and set(llama[1:-1]) == {1}
    with pytest.raises(UserInputError, match="exceed"):
        virtual_stage_layer_counts(126, 16, 8, "even")
    with pytest.raises(UserInputError, match=r"\+ 2 \(embedding and loss\)"):
        virtual_stage_layer_counts(61, 16, 4)
    with pytest.raises(UserInputError, match="valid vpp: 1, 2, 4, 8"):
        virtual_stage_layer_counts(32, 4, 3)


def test_measured_405b_layout_resolves() -> None:
    sc = build_config({"model": "llama3.1-405b", "system": "gb200-nvl72", "gpus": 256, "precision": "fp8-cs"},
                      {"optimizer": "adamw", "tp": 4, "pp": 16, "vpp": 8, "ep": 1, "micro_batch_size": 1,
                       "global_batch_size": 1536, "seq_length": 8192}).resolve()
    assert sc.virtual_stage_layers[0] == 0 and sum(sc.virtual_stage_layers) == 126
