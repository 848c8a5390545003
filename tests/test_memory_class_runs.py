"""The activation memory's shortcuts equal the per-layer, per-stage answers.

:func:`workloads.activation_memory._layer_table` prices one layer per run of layers of the same
class (kept in BF16, MoE) and repeats it; here every layer is priced on its own
(:func:`workloads.activation_memory._memo_bytes_of`) and the two lists must be equal, on models
whose class changes at the first MoE layer, the BF16 first and last layers and the MTP layers.
"""

from __future__ import annotations

import pytest

from workloads.activation_memory import (
    _all_stages_bytes,
    _layer_table,
    _memo_bytes_of,
    activation_bytes_by_stage,
    stage_activation_bytes,
)
from workloads.scenario import DEFAULT_SCENARIO, build_config


def _scenario(**flags: object):
    base = dict(gpus=64, tp=1, pp=4, vpp=1, ep=8, cp=1, micro_batch_size=1, global_batch_size=256, seq_length=4096)
    return build_config(DEFAULT_SCENARIO.model_dump(), base | flags).resolve()


@pytest.mark.parametrize("flags", [
    {"model": "deepseek-v3-mtp"},
    {"model": "deepseek-v3-mtp", "precision": "fp8-cs", "first_last_layers_bf16": True,
     "num_layers_at_start_in_bf16": 2, "num_layers_at_end_in_bf16": 3},
    {"model": "kimi-k2", "precision": "mxfp8", "first_last_layers_bf16": True,
     "num_layers_at_start_in_bf16": 1, "num_layers_at_end_in_bf16": 0},
    {"model": "llama3-8b", "ep": 1, "precision": "fp8-cs", "first_last_layers_bf16": True,
     "num_layers_at_start_in_bf16": 0, "num_layers_at_end_in_bf16": 2},
    {"model": "llama3-8b", "ep": 1, "pp": 8, "vpp": 2, "recompute": "full", "recompute_method": "block",
     "recompute_num_layers": 1},
    {"model": "llama3-8b", "ep": 1, "pp": 1, "cpu_offloading": True, "cpu_offloading_num_layers": 3},
])
def test_layer_table_is_the_per_layer_bytes(flags: dict[str, object]) -> None:
    sc = _scenario(**flags)
    model = sc.model
    layers = model.num_layers + model.mtp_layers
    memo: dict = {}
    table = _layer_table(sc, {})
    assert table == [_memo_bytes_of(sc, i, memo) for i in range(layers)]
    if "recompute" not in flags and "cpu_offloading" not in flags:  # cases chosen for their class changes
        assert len(set(table)) >= 2  # the model's layers fall in more than one class
    by_stage = activation_bytes_by_stage(sc)  # every stage at once, chunks of the same classes summed once
    assert len(by_stage) == sc.par.pp
    assert _all_stages_bytes(sc, share_chunks=False) == by_stage  # each chunk summed on its own
    assert [stage_activation_bytes(sc, s) for s in range(sc.par.pp)] == list(by_stage)
