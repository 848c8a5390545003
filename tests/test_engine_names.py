"""Both engines give the same exposed time the same name, and absurd results are flagged.

At 100,352 GPUs the hidden parameter all-gather of Kimi K2 (``hide_param_gather`` on) outlasts the first forward passes: the
analytic engine books the delay as ``dp_param``; the DES booked it as "pipeline bubble" on every
stage downstream of the one that waited (its activations came late). The DES now passes the
sender's parameter-gather delay along with its activations, so both call it ``dp_param``.

Without ``average_in_collective`` every gradient bucket is scaled by 1/dp on the compute stream
before its reduction (MCore ``start_grad_sync``, from the backward hook with ``overlap_grad_reduce``),
which at this scale (layer-wise buckets padded to d × the largest parameter) takes ~14 s on stage 0
and ~7 s on the others. Those kernels run inside each chunk's last backward and so delay the drain
along the pipeline: both engines model that chain and book it as ``dp_grad`` (the DES used to book
the downstream waits as bubble, the analytic engine added only the largest stage's scaling).
"""

from __future__ import annotations

import pytest

from costmodel.engine import predict
from costmodel.report import Breakdown, OptimizerReport, Stats, StepReport
from costmodel.report_builder import sanity_warnings


@pytest.fixture(scope="module")
def huge(default_scenario):
    sc = default_scenario.with_updates(gpus=100_352, global_batch_size=1_605_632, hide_param_gather=True,
                                       average_in_collective=True)
    return predict(sc, "analytic"), predict(sc, "des")


@pytest.fixture(scope="module")
def huge_prescaled(default_scenario):
    sc = default_scenario.with_updates(gpus=100_352, global_batch_size=1_605_632, hide_param_gather=True,
                                       average_in_collective=False)
    return sc, predict(sc, "analytic"), predict(sc, "des")


def _large_parts(b: Breakdown, step_s: float) -> set[str]:
    parts = {"compute": b.compute, "pipeline bubble": b.pipeline_bubble, "optimizer": b.optimizer,
             **{f"exposed {k}": v for k, v in b.exposed_comm.items()}}
    return {k for k, v in parts.items() if v > 0.02 * step_s}


def test_parameter_gather_delay_has_one_name_in_both_engines(huge) -> None:
    ana, des = huge
    a, d = ana.breakdown_s, des.breakdown_s
    assert a.exposed_comm["dp_param"] > 10 * a.pipeline_bubble
    assert d.exposed_comm["dp_param"] > 10 * d.pipeline_bubble, d
    assert d.exposed_comm["dp_param"] == pytest.approx(a.exposed_comm["dp_param"], rel=0.05)
    assert _large_parts(a, ana.step_time_s) == _large_parts(d, des.step_time_s)


def test_gradient_prescaling_has_one_name_in_both_engines(huge_prescaled) -> None:
    """The scaling of the 1/dp pre-scaled buckets of all virtual stages lies on the drain (the last
    micro-batch's backward through them all): at least Σ over the stages of their scaling is exposed
    gradient synchronisation in both engines, not compute and not pipeline bubble."""
    from costmodel.step_structure import build_step_structure

    sc, ana, des = huge_prescaled
    scaling_s = sum(s.grad_prescale_s for s in build_step_structure(sc).stages)
    assert scaling_s > 20.0  # the mechanism matters at this scale
    a, d = ana.breakdown_s, des.breakdown_s
    for b in (a, d):
        assert b.exposed_comm["dp_grad"] > scaling_s
        assert b.pipeline_bubble < 0.02 * scaling_s and b.compute < 0.5 * scaling_s
    assert d.exposed_comm["dp_grad"] == pytest.approx(a.exposed_comm["dp_grad"], rel=0.05)
    assert des.step_time_s == pytest.approx(ana.step_time_s, rel=0.05)
    assert _large_parts(a, ana.step_time_s) == _large_parts(d, des.step_time_s)


def test_absurd_mfu_is_flagged_by_both_engines(huge) -> None:
    for report in huge:
        assert report.mfu_fraction < 0.05
        assert any(w.startswith("MFU ") and "under 5 %" in w for w in report.warnings), report.warnings


def _report(mfu: float, padding_pct: float | None) -> StepReport:
    opt = OptimizerReport(kind="muon", distribution="layer_wise", per_rank_compute_s=Stats(min=0, mean=0, max=0),
                          imbalance_ratio=1.0, exposed_s=0.0, hidden_s=0.0, padding_overhead_pct=padding_pct)
    return StepReport(engine="analytic", scenario={}, step_time_s=10.0, tokens_per_s_per_gpu=1.0,
                      model_tflops_per_gpu=1.0, mfu_fraction=mfu, memory_per_gpu_bytes=0.0, optimizer=opt,
                      breakdown_s=Breakdown(compute=0.3, exposed_comm={"dp_grad": 9.5}, other=0.2))


def test_sanity_warnings_name_the_cause() -> None:
    assert sanity_warnings(_report(0.3, 20.0)) == []
    low = sanity_warnings(_report(0.03, None))
    assert len(low) == 1 and "MFU 3.0 %" in low[0] and "exposed dp_grad" in low[0]
    padded = sanity_warnings(_report(0.3, 232.0))
    assert len(padded) == 1 and "padding 232 %" in padded[0]


def test_layer_wise_padding_bytes_by_hand() -> None:
    """Megatron allocates the gradient (fp32) and parameter (bf16) buffers at the padded bucket size: a
    layer-wise bucket of 64 x 10 elements holding 100 parameter elements pads 540 elements, 540 x (4 + 2)
    = 3,240 B per GPU; element-wise buckets are not counted; with MXFP8 parameters in the gradient buffer
    only the gradient bytes count (2,160 B)."""
    from costmodel.optimizer.plan_types import Bucket, OptimizerPlan, StageOptimizerPlan
    from costmodel.report_builder import layer_wise_padding_bytes

    def bucket(kind: str, numel: int, used: int) -> Bucket:
        return Bucket(stage=1, chunk=0, dp_group="dp", group_size=64, numel=numel, grad_bytes=4 * numel,
                      param_bytes=2 * numel, reduce_op="reduce_scatter", gather_op="all_gather", used_numel=used,
                      kind=kind)

    stages = (StageOptimizerPlan(stage=0, buckets=(), ranks=(), collectives=()),
              StageOptimizerPlan(stage=1, buckets=(bucket("layer_wise", 640, 100), bucket("element_wise", 640, 600)),
                                 ranks=(), collectives=()))
    plan = OptimizerPlan(kind="muon", distribution="layer_wise", layout="current", tp_mode=None, load_balance="lpt",
                         stages=stages)
    assert layer_wise_padding_bytes(plan) == (1, 3240.0)
    assert layer_wise_padding_bytes(plan, params_in_grad_buffer=True) == (1, 2160.0)
    padded = sanity_warnings(_report(0.3, 232.0), (1, 153.7e9))
    assert len(padded) == 2 and "padding takes 153.7 GB more per GPU on stage 1" in padded[1]
    assert sanity_warnings(_report(0.3, 20.0), (0, 0.9e9)) == []


def test_schedule_warnings_for_a_partial_interleaved_group() -> None:
    from costmodel.report_builder import schedule_warnings

    assert schedule_warnings(4, 5, 8) == [] and schedule_warnings(4, 1, 5) == []
    (warning,) = schedule_warnings(4, 5, 5)
    assert warning.startswith("5 micro-batches on pp 4 with interleaving leave a partial last group of 1")
