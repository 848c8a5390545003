"""Megatron pipeline layouts and the embedding/loss accounting in the split, against hand counts."""

from __future__ import annotations

import pytest

from topologies.inputs import UserInputError
from workloads.pipeline_layout import StageSplit, parse_pipeline_layout, virtual_stage_layer_counts
from workloads.scenario import build_config

DSV3 = {"model": "deepseek-v3", "system": "gb300-nvl72", "gpus": 256, "precision": "mxfp8", "tp": 1, "pp": 2,
        "vpp": 8, "ep": 32, "micro_batch_size": 1, "global_batch_size": 4096, "seq_length": 4096,
        "optimizer": "adamw", "mtp_layers": 1}


def test_string_and_list_forms() -> None:
    stages = parse_pipeline_layout("Et*4|(t*4|)*14tmL")
    assert len(stages) == 16 and stages[0] == "Etttt" and stages[-1] == "tmL"
    assert all(st == "tttt" for st in stages[1:-1])
    assert parse_pipeline_layout("[['embedding', 'decoder'], ['decoder', 'mtp', 'loss']]") == ("Et", "tmL")
    with pytest.raises(UserInputError, match="use E, t, m, L"):
        parse_pipeline_layout("Ex*4")


def test_layout_drives_the_virtual_stages_of_a_scenario() -> None:
    sc = build_config({}, {**DSV3, "pipeline_model_parallel_layout": "Et*4|(t*4|)*14tmL"}).resolve()
    assert sc.virtual_stage_layers == [4] * 15 + [1]  # 61 = 15 x 4 + 1; MTP and loss share the last stage
    balanced = build_config({}, DSV3).resolve().virtual_stage_layers
    assert balanced != sc.virtual_stage_layers and sum(balanced) == 61
    with pytest.raises(UserInputError, match="16 virtual stages; pp·vpp = 8"):
        build_config({}, {**DSV3, "vpp": 4, "pipeline_model_parallel_layout": "Et*4|(t*4|)*14tmL"}).resolve()
    with pytest.raises(UserInputError, match="places 0 MTP layers; the model has 1"):
        build_config({}, {**DSV3, "pipeline_model_parallel_layout": "Et*4|(t*4|)*14tL"}).resolve()


def test_embedding_and_loss_accounted_in_the_split() -> None:
    # Llama 3.1 405B: 126 layers + embedding + loss = 128 = pp 16 x vpp 8 -> first and last stage hold none
    split = StageSplit(account_for_embedding=True, account_for_loss=True)
    counts = virtual_stage_layer_counts(126, 16, 8, split)
    assert counts[0] == 0 and counts[-1] == 0 and set(counts[1:-1]) == {1} and sum(counts) == 126
    # Qwen3-235B: 94 + 2 = 96 over pp 8 x vpp 4 = 32 -> 3 per stage, the first and last 2
    counts = virtual_stage_layer_counts(94, 8, 4, split)
    assert counts[0] == 2 and counts[-1] == 2 and counts[1:-1] == [3] * 30
    with pytest.raises(UserInputError, match="not divisible by pp·vpp = 32"):
        virtual_stage_layer_counts(95, 8, 4, split)
