"""Pipeline schedules: Megatron's order, the bubble formula, closed form vs simulation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.des.engine import simulate
from costmodel.optimizer.plan_types import OptimizerPlan
from costmodel.pipeline import bubble_fraction, pipeline_time_s, schedule_order
from costmodel.step_structure import ChunkCost, PassCost, StageCost, StepStructure


@given(pp=st.integers(1, 6), vpp=st.integers(1, 4), groups=st.integers(1, 4))
@settings(max_examples=40, deadline=None)
def test_every_rank_runs_each_pass_once_forward_first(pp: int, vpp: int, groups: int) -> None:
    m = pp * groups if vpp > 1 else groups
    for rank in range(pp):
        order = schedule_order(pp, vpp, m, rank)
        seen = [(p.kind, p.microbatch, p.chunk) for p in order]
        assert len(seen) == len(set(seen)) == 2 * m * vpp
        pos = {k: i for i, k in enumerate(seen)}
        for mb in range(m):
            for c in range(vpp):
                assert pos[("F", mb, c)] < pos[("B", mb, c)]


def test_first_rank_warms_up_as_megatron() -> None:
    order = schedule_order(4, 2, 8, 0)
    warmup = 2 * (4 - 0 - 1) + (2 - 1) * 4
    assert all(p.kind == "F" for p in order[:warmup]) and order[warmup + 1].kind == "B"
    assert [(p.microbatch, p.chunk) for p in order[:8]] == [(0, 0), (1, 0), (2, 0), (3, 0), (0, 1), (1, 1), (2, 1), (3, 1)]
    last = schedule_order(4, 1, 8, 3)
    assert [p.kind for p in last[:4]] == ["F", "B", "F", "B"]


def _uniform(pp: int, vpp: int, m: int, f: float = 1.0, b: float = 2.0) -> StepStructure:
    """Identical chunks (fixed per-micro-batch cost), no communication, no optimizer."""
    stages = tuple(StageCost(stage=s, chunks=tuple(ChunkCost(s, c, 1, PassCost(f / vpp), PassCost(b / vpp))
                                                   for c in range(vpp)), buckets=(), optimizer_compute_s=0.0,
                             optimizer_tp_s=0.0) for s in range(pp))
    plan = OptimizerPlan(kind="adamw", distribution="element_wise", layout=None, tp_mode=None, load_balance=None, stages=())
    return StepStructure(pp=pp, vpp=vpp, microbatches=m, stages=stages, p2p_s=0.0, p2p_latency_s=0.0, p2p_bytes=0.0,
                         p2p_link="network", overlap=False, overlap_grad_reduce=False, hide_param_gather=False,
                         compute_slowdown=0.0, plan=plan)


@pytest.mark.parametrize(("pp", "vpp", "m"), [(4, 1, 4), (4, 1, 8), (4, 2, 8), (4, 4, 16), (2, 3, 4), (8, 2, 16)])
def test_simulated_bubble_matches_the_schedule_formula(pp: int, vpp: int, m: int) -> None:
    st = _uniform(pp, vpp, m)
    busy = m * 3.0  # per-micro-batch cost (f + b) x micro-batches
    res = simulate(st, record=False, steps=1)
    assert (res.step_ends_s[0] - busy) / busy == pytest.approx(bubble_fraction(pp, vpp, m), rel=1e-9)
    closed = pipeline_time_s([3.0] * pp, [1.0 / vpp] * pp, [2.0 / vpp] * pp, m, vpp, 0.0)
    assert closed == pytest.approx(res.step_ends_s[0], rel=1e-9)


@pytest.mark.parametrize(("pp", "vpp", "m"), [(4, 1, 4), (4, 2, 8), (8, 4, 16)])
def test_doubling_microbatches_halves_the_bubble_fraction(pp: int, vpp: int, m: int) -> None:
    fractions = []
    for mm in (m, 2 * m):
        res = simulate(_uniform(pp, vpp, mm), record=False, steps=1)
        fractions.append((res.step_ends_s[0] - 3.0 * mm) / (3.0 * mm))
    assert fractions[1] == pytest.approx(fractions[0] / 2, rel=1e-9)
    assert fractions[0] == pytest.approx((pp - 1) / (vpp * m), rel=1e-9)


@pytest.mark.parametrize(("pp", "vpp", "m", "d"), [(4, 1, 8, 0.05), (4, 2, 8, 0.05), (4, 4, 16, 0.02), (2, 1, 4, 0.1), (8, 1, 32, 0.1), (3, 2, 6, 0.2)])
def test_closed_form_with_transfers_tracks_the_simulation(pp: int, vpp: int, m: int, d: float) -> None:
    st = _uniform(pp, vpp, m)
    st = StepStructure(**{**st.__dict__, "p2p_s": d})
    res = simulate(st, record=False, steps=1)
    closed = pipeline_time_s([3.0] * pp, [1.0 / vpp] * pp, [2.0 / vpp] * pp, m, vpp, d)
    assert closed == pytest.approx(res.step_ends_s[0], rel=1e-9)
