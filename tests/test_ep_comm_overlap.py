"""EP all-to-all overlap (Megatron --overlap-moe-expert-parallel-comm) in both engines and the planner bound."""

from __future__ import annotations

import pytest

from costmodel.analytic import run_analytic
from costmodel.des import run_des
from costmodel.pipeline import paired_pass_share, warmup_passes
from costmodel.planner.bound import fast_pipeline_bound_s
from costmodel.planner.fast_analytic import FastAnalytic
from topologies.inputs import UserInputError
from workloads.scenario import DEFAULT_SCENARIO, build_config


def _scenario(**flags: object):  # noqa: ANN202
    return build_config(DEFAULT_SCENARIO.model_dump(), dict(flags)).resolve()


def test_paired_share_follows_the_schedule() -> None:
    assert warmup_passes(4, 4, 32, 0) == 2 * 3 + 3 * 4
    assert paired_pass_share(4, 4, 32) == pytest.approx((128 - 18) / 128)
    assert paired_pass_share(1, 1, 8) == pytest.approx(7 / 8)  # without pipelining one F and one B run alone
    assert paired_pass_share(8, 1, 4) == 0.0  # all warm-up: nothing to pair


def test_overlap_hides_ep_comm_up_to_the_paired_compute_in_both_engines() -> None:
    off, on = _scenario(), _scenario(ep_comm_overlap=True)
    for engine in (run_analytic, run_des):
        a, b = engine(off), engine(on)
        assert a.breakdown_s.exposed_comm["ep"] > 1.0  # seconds: EP64 dispatch/combine of Kimi K2
        assert b.breakdown_s.exposed_comm.get("ep", 0.0) < 0.3 * a.breakdown_s.exposed_comm["ep"]
        assert b.step_time_s < a.step_time_s
    assert run_des(on).step_time_s == pytest.approx(run_analytic(on).step_time_s, rel=0.02)


def test_planner_bound_equals_engine_with_overlap() -> None:
    engine = FastAnalytic()
    for flags in ({"ep_comm_overlap": True}, {"ep_comm_overlap": True, "pp": 8, "vpp": 2, "ep": 32}, {"ep_comm_overlap": False}):
        sc = _scenario(**flags)
        assert fast_pipeline_bound_s(sc) == pytest.approx(engine.engine_pipeline_bound_s(sc), rel=1e-12)


@pytest.mark.parametrize(("flags", "message"), [
    ({"ep": 1, "model": "llama3-8b", "gpus": 8, "pp": 1, "vpp": 1, "ep_comm_overlap": True}, "needs ep > 1"),
    ({"vpp": 1, "ep_comm_overlap": True}, "needs vpp > 1"),
])
def test_overlap_rules_are_one_line_errors(flags: dict, message: str) -> None:
    with pytest.raises(UserInputError, match=message) as info:
        _scenario(**flags)
    assert "\n" not in str(info.value)


def test_cached_layer_costs_follow_the_schedule_under_overlap() -> None:
    """Layouts differing only in vpp share layer shapes but not the paired share: no stale cache."""
    from costmodel import step_structure
    from costmodel.planner import bound

    def fresh(sc):  # noqa: ANN001, ANN202
        step_structure._KIND_CACHE.clear()
        bound._KIND_COSTS.clear()
        return run_analytic(sc).step_time_s, fast_pipeline_bound_s(sc)

    expected = {vpp: fresh(_scenario(ep_comm_overlap=True, vpp=vpp)) for vpp in (2, 4, 8)}
    assert len({round(t, 9) for t, _ in expected.values()}) == 3  # the paired share differs
    for vpp in (8, 2, 8, 4, 2):  # warm caches, in an order that would reuse stale entries
        sc = _scenario(ep_comm_overlap=True, vpp=vpp)
        assert run_analytic(sc).step_time_s == pytest.approx(expected[vpp][0], rel=1e-12)
        assert fast_pipeline_bound_s(sc) == pytest.approx(expected[vpp][1], rel=1e-12)
