"""TP communication overlap (Megatron --tp-comm-overlap) and the dataset's recipe settings."""

from __future__ import annotations

import pytest

from costmodel.analytic import run_analytic
from costmodel.calibrate.fit import FitSettings
from costmodel.des import run_des
from topologies.inputs import UserInputError
from workloads.scenario import build_config

LLAMA_TP4 = {"model": "llama3.1-405b", "system": "gb300-nvl72", "gpus": 256, "precision": "fp8-cs",
             "tp": 4, "pp": 8, "vpp": 4, "ep": 1, "etp": 1, "micro_batch_size": 1, "global_batch_size": 1536,
             "seq_length": 8192, "optimizer": "adamw"}


def _scenario(**flags: object):  # noqa: ANN202
    return build_config({}, {**LLAMA_TP4, **flags}).resolve()


def test_overlap_hides_tp_comm_in_both_engines_alike() -> None:
    off, on = _scenario(), _scenario(tp_comm_overlap=True)
    exposed = {}
    for engine in (run_analytic, run_des):
        tp_off = engine(off).breakdown_s.exposed_comm["tp"]
        tp_on = engine(on).breakdown_s.exposed_comm.get("tp", 0.0)
        assert tp_off > 1.0  # seconds: TP=4 sequence-parallel collectives of a 405B model are visible
        assert tp_on < 0.5 * tp_off  # the per-GEMM overlap (costmodel.tp_overlap) hides most of it
        assert engine(on).step_time_s < engine(off).step_time_s
        exposed[engine] = tp_on
    assert exposed[run_des] == pytest.approx(exposed[run_analytic], rel=0.05, abs=0.05)


def test_overlap_needs_sequence_parallelism() -> None:
    with pytest.raises(UserInputError, match="tp_comm_overlap needs sequence parallelism") as info:
        _scenario(tp_comm_overlap=True, sequence_parallel=False)
    assert "\n" not in str(info.value)
    assert _scenario(tp_comm_overlap=True, tp=1, pp=16, vpp=2, gpus=256).par.tp_comm_overlap  # tp 1: nothing to hide


def test_fit_settings_folds() -> None:
    assert FitSettings().folds == 0 and "leave one configuration out" in FitSettings().heldout_scheme
    assert "5-fold" in FitSettings(folds=5).heldout_scheme
    with pytest.raises(ValueError, match="folds must be 0"):
        FitSettings(folds=1)
