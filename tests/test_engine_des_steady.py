"""The DES steady-state shortcut (record=False, many micro-batches) matches the full simulation."""

from __future__ import annotations

import pytest

from costmodel.des import run_des
from workloads.scenario import DEFAULT_SCENARIO, build_config

CASES = [
    {"model": "qwen3-30b-a3b", "system": "dgx-h100", "gpus": 32, "pp": 2, "vpp": 2, "ep": 8, "tp": 1,
     "global_batch_size": 16 * 16, "micro_batch_size": 1, "seq_length": 2048, "precision": "fp8-cs"},
    {"model": "llama3-8b", "system": "gb300-nvl72", "gpus": 16, "pp": 4, "vpp": 1, "tp": 2, "ep": 1,
     "global_batch_size": 2 * 27, "micro_batch_size": 1, "seq_length": 2048, "precision": "mxfp8",
     "optimizer": "muon"},
]


@pytest.mark.parametrize("overrides", CASES)
def test_steady_state_extrapolation_matches_full_run(overrides: dict) -> None:
    sc = build_config(DEFAULT_SCENARIO.model_dump(), overrides).resolve()
    assert sc.num_microbatches > 6 * sc.par.pp  # long enough for the shortcut to apply
    full = run_des(sc, record=True)
    fast = run_des(sc, record=False)
    assert fast.step_time_s == pytest.approx(full.step_time_s, rel=5e-3)
    assert fast.breakdown_s.compute == pytest.approx(full.breakdown_s.compute, rel=5e-3)
    assert fast.events == [] and full.events
