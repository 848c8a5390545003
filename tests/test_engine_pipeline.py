"""Pipeline schedules: Megatron's order, the bubble formula, closed form vs simulation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.des.engine import simulate
from costmodel.optimizer.plan_types import OptimizerPlan
from costmodel.pipeline import (
    bubble_fraction,
    interleaved_phase_s,
    pipeline_time_s,
    schedule_makespan_s,
    schedule_order,
)
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


def _chunks(pass_s: list[list[tuple[float, float]]], m: int) -> StepStructure:
    """``pass_s[stage][chunk]`` = (forward, backward) seconds per micro-batch; no communication."""
    pp, vpp = len(pass_s), len(pass_s[0])
    base = _uniform(pp, vpp, m)
    stages = tuple(StageCost(stage=s, chunks=tuple(ChunkCost(s, c, 1, PassCost(f), PassCost(b))
                                                   for c, (f, b) in enumerate(pass_s[s])), buckets=(),
                             optimizer_compute_s=0.0, optimizer_tp_s=0.0) for s in range(pp))
    return StepStructure(**{**base.__dict__, "stages": stages})


def _closed(pass_s: list[list[tuple[float, float]]], m: int) -> float:
    """The closed form alone (m x busiest stage + fill), without the per-chunk passes."""
    vpp = len(pass_s[0])
    work = [sum(f + b for f, b in s) for s in pass_s]
    return pipeline_time_s(work, [sum(f for f, _ in s) / vpp for s in pass_s], [sum(b for _, b in s) / vpp for s in pass_s],
                           m, vpp, 0.0)


def test_interleaved_phase_by_hand() -> None:
    # pp 2, vpp 2, 2 micro-batches; virtual stage 1 (rank 1, chunk 0) takes 3 s per pass, the others 1 s.
    # rank 0: F(v0,0) 0-1, F(v0,1) 1-2, F(v2,0) 4-5 (after F(v1,0) 1-4), F(v2,1) 7-8 (after F(v1,1) 4-7),
    #         B(v2,0) 9-10, B(v2,1) 11-12, B(v0,0) 14-15, B(v0,1) 17-18
    # rank 1: F(v1,0) 1-4, F(v1,1) 4-7, F(v3,0) 7-8, B(v3,0) 8-9, F(v3,1) 9-10, B(v3,1) 10-11,
    #         B(v1,0) 11-14, B(v1,1) 14-17
    passes = [[(1.0, 1.0), (1.0, 1.0)], [(3.0, 3.0), (1.0, 1.0)]]
    assert interleaved_phase_s(passes, 2) == pytest.approx(18.0, rel=1e-12)
    assert simulate(_chunks(passes, 2), record=False, steps=1).step_ends_s[0] == pytest.approx(18.0, rel=1e-12)


def test_unequal_virtual_stages_stall_the_interleaved_order() -> None:
    # pp 4, vpp 3: layers per virtual stage 1,1,1,1 | 2,2,1,1 | 1,1,2,2 (1 s forward, 2 s backward per layer):
    # every rank holds 4 layers (12 s per micro-batch), yet the wrap-around gives no slack, so each group of 4
    # micro-batches takes 60 s instead of 48 s: the closed form (m x 12 s + fill) is 25 % short; the DES agrees
    layers = [1, 1, 1, 1, 2, 2, 1, 1, 1, 1, 2, 2]
    passes = [[(1.0 * layers[c * 4 + r], 2.0 * layers[c * 4 + r]) for c in range(3)] for r in range(4)]
    m = 32
    des = simulate(_chunks(passes, m), record=False, steps=1).step_ends_s[0]
    assert interleaved_phase_s(passes, m) == pytest.approx(des, rel=1e-12)
    assert interleaved_phase_s(passes, m + 4) - interleaved_phase_s(passes, m) == pytest.approx(60.0, rel=1e-12)
    assert _closed(passes, m) == pytest.approx(32 * 12.0 + 12.0, rel=1e-12)
    assert _closed(passes, m) < 0.85 * des
    work = [12.0] * 4
    assert pipeline_time_s(work, [4.0 / 3] * 4, [8.0 / 3] * 4, m, 3, 0.0, passes) == pytest.approx(des, rel=1e-12)


@pytest.mark.parametrize(("pp", "vpp", "m"), [(4, 3, 64), (4, 3, 66), (3, 2, 45), (8, 2, 80)])
def test_steady_state_extrapolation_equals_the_whole_order(pp: int, vpp: int, m: int) -> None:
    layers = [1 + (v * 7 % 3 == 0) for v in range(pp * vpp)]
    passes = [[(0.5 * layers[c * pp + r], 1.1 * layers[c * pp + r]) for c in range(vpp)] for r in range(pp)]
    assert interleaved_phase_s(passes, m) == pytest.approx(schedule_makespan_s(passes, m), rel=1e-12)


def test_lower_bound_by_hand_and_below_the_longest_path() -> None:
    # the 2x2 case above (18 s): rank 0 works 4 s per micro-batch, rank 1 8 s; the floor is
    # max(2 x 4, 2 x 8 + rank 0's chunk-0 forward and backward 1 + 1) = 18 s (here the longest path itself);
    # the closed form: 2 x 8 + fill (rank 0's mean chunk forward 1 + rank 1's mean chunk backward 2) = 19 s
    from costmodel.pipeline import pipeline_lower_bound_s

    passes = [[(1.0, 1.0), (1.0, 1.0)], [(3.0, 3.0), (1.0, 1.0)]]
    work, cf, cb = [4.0, 8.0], [1.0, 2.0], [1.0, 2.0]
    assert pipeline_time_s(work, cf, cb, 2, 2, 0.0) == pytest.approx(19.0, rel=1e-12)  # closed form
    assert pipeline_lower_bound_s(work, cf, cb, 2, 2, 0.0, passes) == pytest.approx(18.0, rel=1e-12)
    assert pipeline_lower_bound_s(work, cf, cb, 2, 2, 0.0, passes) <= pipeline_time_s(work, cf, cb, 2, 2, 0.0, passes)


@pytest.mark.parametrize(("pp", "vpp", "m"), [(4, 3, 32), (4, 3, 30), (3, 2, 45), (8, 2, 80), (2, 4, 7)])
def test_lower_bound_never_exceeds_the_phase(pp: int, vpp: int, m: int) -> None:
    from costmodel.pipeline import pipeline_lower_bound_s

    for seed in range(5):
        layers = [1 + ((v * 7 + seed) % 3 == 0) + (v == 0) for v in range(pp * vpp)]
        passes = [[(0.5 * layers[c * pp + r], 1.1 * layers[c * pp + r]) for c in range(vpp)] for r in range(pp)]
        work = [sum(f + b for f, b in p) for p in passes]
        cf = [sum(f for f, _ in p) / vpp for p in passes]
        cb = [sum(b for _, b in p) / vpp for p in passes]
        for p2p in (0.0, 0.05):
            phase = pipeline_time_s(work, cf, cb, m, vpp, p2p, passes)
            assert pipeline_lower_bound_s(work, cf, cb, m, vpp, p2p, passes) <= phase * (1 + 1e-12)
