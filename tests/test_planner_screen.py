"""Planner logic with the stub engine: pruning is exact, nothing infeasible is listed, Pareto,
sensitivity, explain, Ctrl-C, parallel = serial."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_planner_stubs import StubEngine, stub_des, stub_memory

from costmodel.calibrate.profile import CalibrationProfile, SystemCalibration
from costmodel.planner.pins import parse_pins
from costmodel.planner.plan import PlanOptions, memory_budget_bytes, run_plan
from costmodel.planner.ranking import kendall_tau, pareto_front
from costmodel.planner.screen import CHUNK, _shape_chunks
from costmodel.planner.space import Candidate, build_scenario
from topologies.inputs import UserInputError

PINS = {"tp": "1,2", "pp": "2,4,8", "vpp": "1,2,4", "cp": "1", "ep": "16,32,64", "etp": "1",
        "micro_batch_size": "1,2"}


def _plan(base, pins=None, bounds=None, engine=None, **kw):
    options = PlanOptions(pins=parse_pins(PINS if pins is None else pins, bounds), **({"jobs": 1, "samples": 0} | kw))
    return run_plan(base, options, engine=engine or StubEngine(), memory_fn=stub_memory, des_fn=stub_des)


def _key(row):
    return row.label, round(row.step_time_s, 12)


def test_pruned_screen_equals_exhaustive(default_scenario) -> None:
    pruned = _plan(default_scenario, limit=8, top_k=0).result
    full = _plan(default_scenario, limit=8, top_k=0, exhaustive=True).result
    assert [_key(r) for r in pruned.ranking] == [_key(r) for r in full.ranking]
    assert pruned.reference.rank == full.reference.rank and pruned.reference.rank is not None
    assert pruned.stats.candidates_pruned > 0 and pruned.stats.bound_violations == 0
    assert full.stats.candidates_evaluated > pruned.stats.candidates_evaluated


def test_no_infeasible_plan_is_ever_listed(default_scenario) -> None:
    for headroom in (0.1, 0.45):
        res = _plan(default_scenario, headroom=headroom, top_k=2).result
        budget = memory_budget_bytes(default_scenario, headroom)
        listed = [*res.ranking, *res.pareto_front] + ([res.reference.row] if res.reference.row else [])
        assert res.ranking
        for row in listed:
            s = row.settings
            cand = Candidate(s["tp"], s["pp"], s["vpp"], s["cp"], s["ep"], s["etp"], s["micro_batch_size"],
                             s["recompute"], s["optimizer"], s["distribution"], s.get("layer_wise_layout"),
                             s.get("tp_mode"), s.get("load_balance"), s.get("hide_param_gather"))
            sc = build_scenario(default_scenario, cand)  # the validator accepts it
            assert stub_memory(sc).total_bytes <= budget
            assert row.memory_per_gpu_bytes <= budget
        assert res.stats.groups_infeasible > 0 or headroom == 0.1


def test_reference_is_ranked_and_best_des_not_worse(default_scenario) -> None:
    res = _plan(default_scenario, top_k=3).result
    ref = res.reference
    assert ref.status == "ok" and ref.row is not None and ref.rank is not None and ref.rank >= 1
    assert res.best is not None and res.best.des_step_time_s is not None
    assert ref.row.des_step_time_s is not None
    assert res.best.des_step_time_s <= ref.row.des_step_time_s
    des_head = [r.des_step_time_s for r in res.ranking if r.des_step_time_s is not None]
    assert des_head == sorted(des_head)


def test_parallel_screen_equals_serial(default_scenario) -> None:
    one = _plan(default_scenario, top_k=2).result
    two = _plan(default_scenario, top_k=2, jobs=2).result
    assert [_key(r) for r in one.ranking] == [_key(r) for r in two.ranking]
    assert one.reference.rank == two.reference.rank
    assert two.stats.jobs == 2


def test_ctrl_c_keeps_partial_ranking(default_scenario) -> None:
    out = _plan(default_scenario, engine=StubEngine(interrupt_after=40), top_k=3)
    res = out.result
    assert res.interrupted and any("interrupted" in n for n in res.notes)
    assert res.ranking and all(r.des_step_time_s is None for r in res.ranking)


def test_pareto_front_matches_brute_force() -> None:
    rng = np.random.default_rng(3)
    t, m = rng.uniform(1, 2, 300).round(2), rng.uniform(0, 1, 300).round(2)
    front = set(pareto_front(t, m).tolist())
    for i in range(len(t)):
        dominated = any((t[j] <= t[i] and m[j] <= m[i]) and (t[j] < t[i] or m[j] < m[i]) for j in range(len(t)))
        duplicate_first = any(t[j] == t[i] and m[j] == m[i] for j in range(i))
        assert (i in front) == (not dominated and not duplicate_first)


def test_kendall_tau() -> None:
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)


def test_sensitivity_samples_calibration_uncertainty(default_scenario) -> None:
    profile = CalibrationProfile(name="test", systems={"gb300-nvl72": SystemCalibration(
        factors={"gemm_fp8": 0.6}, uncertainty={"gemm_fp8": 0.03, "newton_schulz_gemm": 0.2, "alltoall_bandwidth": 0.1})})
    options = PlanOptions(pins=parse_pins(PINS), jobs=1, samples=12, top_k=0)
    res = run_plan(default_scenario, options, engine=StubEngine(), memory_fn=stub_memory, des_fn=stub_des,
                   profile=profile).result
    s = res.sensitivity
    assert s["samples"] == 12 and set(s["sigmas"]) == {"gemm_fp8", "newton_schulz_gemm", "alltoall_bandwidth"}
    assert 0.0 <= s["top1_stability_fraction"] <= 1.0 and -1.0 <= s["kendall_tau_min"] <= s["kendall_tau_mean"] <= 1.0
    assert len(s["mean_rank"]) == len(s["plans"]) == options.sensitivity_plans
    tiny = CalibrationProfile(name="tiny", systems={"gb300-nvl72": SystemCalibration(uncertainty={"gemm_fp8": 1e-9})})
    res = run_plan(default_scenario, options, engine=StubEngine(), memory_fn=stub_memory, des_fn=stub_des,
                   profile=tiny).result
    assert res.sensitivity["top1_stability_fraction"] == 1.0
    none = _plan(default_scenario, samples=4).result
    assert none.sensitivity["samples"] == 0 and "no factor uncertainties" in none.sensitivity["note"]


def test_explain_invalid_memory_ranked_and_outside(default_scenario) -> None:
    out = _plan(default_scenario, top_k=0, explain=("tp=3", "tp=1,pp=2,ep=16,micro_batch_size=2", "tp=2,pp=8",
                                                    "pp=16", "optimizer=adamw,hide=off"))
    by = {e["query"]: e for e in out.result.explain}
    assert by["tp=3"]["verdict"] == "invalid" and "tp·pp·cp" in by["tp=3"]["message"]
    oom = by["tp=1,pp=2,ep=16,micro_batch_size=2"]
    assert oom["verdict"] == "out_of_memory" and "GB over the" in oom["message"]
    ranked = by["tp=2,pp=8"]
    assert ranked["verdict"] == "ranked" and ranked["rank"] > 1 and ranked["delta_breakdown_s"]["exposed_comm"]["tp"] > 0
    assert "loses" in ranked["message"] and "comm:tp" in ranked["message"]
    outside = by["pp=16"]
    assert not outside["in_space"] and outside["verdict"] in ("ranked", "out_of_memory", "invalid")
    if outside["verdict"] != "ranked":  # only one configuration was tried: never "the smallest"
        assert "outside the search space" in outside["message"] and "the smallest" not in outside["message"]
    adamw = by["optimizer=adamw,hide_param_gather=False"]
    assert adamw["plan"] is not None and "adamw no-hide" in adamw["plan"]


def test_empty_space_is_one_clear_error(default_scenario) -> None:
    with pytest.raises(UserInputError, match="passes the scenario validator.*tp 3"):
        _plan(default_scenario, pins={"tp": "3", "pp": "1"})
    with pytest.raises(UserInputError, match="memory-headroom"):
        _plan(default_scenario, headroom=1.2)


def test_space_whose_weights_alone_exceed_memory_is_an_empty_answer(default_scenario) -> None:
    """Not an error (exit code 2) but a search with no answer, as when every screened layout is out of memory."""
    res = _plan(default_scenario, pins={"pp": "1", "ep": "1", "etp": "1"}).result
    assert res.ranking == [] and res.best is None
    assert res.stats.layouts_over_memory_by_weights == res.stats.valid_layouts > 0
    assert [n for n in res.notes if n.startswith("no layout fits in memory: the weights and gradients alone")]


def test_result_numbers_are_consistent(default_scenario) -> None:
    res = _plan(default_scenario, top_k=2, limit=5).result
    assert len(res.ranking) == 5 and [r.rank for r in res.ranking] == [1, 2, 3, 4, 5]
    for r in res.ranking:
        assert math.isclose(r.breakdown_s.total_s, r.step_time_s, rel_tol=1e-9)
        assert r.limiter
    st = res.stats
    assert st.candidates == st.candidates_evaluated + st.candidates_pruned
    assert st.valid_layouts <= st.raw_combinations


def test_far_reference_gets_a_range_holding_its_exact_rank(default_scenario) -> None:
    exact = _plan(default_scenario, top_k=0, exhaustive=True).result.reference.rank
    res = _plan(default_scenario, top_k=0, max_rank_evaluations=10).result
    ref = res.reference
    assert ref.rank is None and ref.rank_range is not None and ref.rank_estimate is not None
    assert ref.rank_range[0] <= exact <= ref.rank_range[1]
    assert ref.rank_range[0] <= ref.rank_estimate <= ref.rank_range[1]


def test_des_runs_longest_first_with_the_same_answer(default_scenario) -> None:
    from costmodel.planner.plan import des_chunk_passes

    # Kimi K2 defaults: 256 GPUs, global batch 4,096. pp8 vpp7 mbs2: dp 32, 64 microbatches, 2·8·7·64
    # passes; pp4 vpp8 mbs2: dp 64, 32 microbatches; tp2 pp4 vpp2 cp2 mbs4: dp 16, 64 microbatches.
    def cand(tp, pp, vpp, cp, mbs):  # noqa: ANN001, ANN202
        return Candidate(tp, pp, vpp, cp, 64, 1, mbs, "none", "muon", "layer_wise")

    assert default_scenario.gpus == 256 and default_scenario.par.global_batch_size == 4096
    assert des_chunk_passes(default_scenario, cand(1, 8, 7, 1, 2)) == 7168
    assert des_chunk_passes(default_scenario, cand(1, 4, 8, 1, 2)) == 2048
    assert des_chunk_passes(default_scenario, cand(2, 4, 2, 2, 4)) == 1024
    order: list[tuple[int, int, int]] = []

    def recording_des(sc):  # noqa: ANN001, ANN202
        order.append((sc.par.pp, sc.par.vpp, sc.num_microbatches))
        return stub_des(sc)

    options = PlanOptions(pins=parse_pins(PINS), jobs=1, samples=0, top_k=6)
    res = run_plan(default_scenario, options, engine=StubEngine(), memory_fn=stub_memory, des_fn=recording_des).result
    passes = [2 * pp * vpp * m for pp, vpp, m in order]
    assert len(order) >= 6 and len(set(passes)) > 1 and passes == sorted(passes, reverse=True)
    head = [r for r in res.ranking if r.des_step_time_s is not None]
    assert [r.des_step_time_s for r in head] == sorted(r.des_step_time_s for r in head)  # re-ranked by DES time


_TIMING_STATS = {"screening_wall_s", "engine_calls_per_s", "candidates_per_s", "des_wall_s", "sensitivity_wall_s",
                 "total_wall_s"}


@pytest.mark.parametrize("rank_limits", [{}, {"max_rank_expansions": 2}, {"max_rank_evaluations": 10}])
def test_working_ahead_makes_the_same_search(default_scenario, monkeypatch, rank_limits) -> None:
    """Groups handed to the workers rounds ahead change when work runs, not what the search decides:
    the same plans, reference rank (exact, or range and estimate when the expansions or evaluations
    run out), counts (groups expanded, members evaluated, bounds) and pareto front as a search that
    waits for each round before handing out the next. (Here both passes expand groups: 62 for the
    list, 133 / 2 / 7 to rank the reference.)"""
    import costmodel.planner.screen as screen

    ahead = _plan(default_scenario, top_k=2, jobs=2, limit=6, **rank_limits).result
    monkeypatch.setattr(screen, "AHEAD_ROUNDS", 0)
    waiting = _plan(default_scenario, top_k=2, jobs=2, limit=6, **rank_limits).result
    assert [_key(r) for r in ahead.ranking] == [_key(r) for r in waiting.ranking]
    assert ahead.reference == waiting.reference
    assert [_key(r) for r in ahead.pareto_front] == [_key(r) for r in waiting.pareto_front]
    counts = {k: v for k, v in vars(ahead.stats).items() if k not in _TIMING_STATS}
    assert counts == {k: v for k, v in vars(waiting.stats).items() if k not in _TIMING_STATS}
    assert counts["groups_expanded"] > 0


def _square(task):
    kind, items = task
    return kind, [(i, i * i) for i, in items]


def test_round_runner_hands_back_results_by_key() -> None:
    from costmodel.planner.pool import TaskPool
    from costmodel.planner.rounds import RoundRunner

    with TaskPool(2) as pool:
        runner = RoundRunner(pool, _square)
        runner.submit([("a", [(1,), (2,)]), ("b", [(3,)])])
        runner.submit([("a", [(4,)])])  # ahead of need
        assert runner.known(("a", 4)) and not runner.known(("b", 4))
        assert runner.take([("a", 2), ("b", 3)]) == {("a", 2): (2, 4), ("b", 3): (3, 9)}
        assert runner.take([("a", 4)]) == {("a", 4): (4, 16)}
        assert runner.known(("a", 1)) and not runner.known(("a", 2))  # taken results are forgotten
        with pytest.raises(KeyError):
            runner.take([("c", 1)])
        runner.finish()
        assert not runner.known(("a", 1))


def test_first_bound_tasks_keep_each_expert_layout_on_one_worker() -> None:
    # tp 1 / cp 1 / mbs 1 with expert layouts of 300 and 400 layouts (pp x vpp variants), then 1,100 of
    # another (tp 2): 300 + 400 > 2 x CHUNK = 512, so the first two go to two tasks whole; the last is
    # larger than a task and is cut at 512 layouts
    def layouts(tp: int, ep: int, n: int) -> list[Candidate]:
        return [Candidate(tp, pp, 1, 1, ep, 1, 1, "none", "muon", "layer_wise") for pp in range(n)]

    ordered = layouts(1, 8, 300) + layouts(1, 16, 400) + layouts(2, 8, 1100)
    chunks = _shape_chunks(ordered)
    assert CHUNK == 256
    assert [len(c) for c in chunks] == [300, 400, 512, 512, 76]
    assert [c for chunk in chunks for c in chunk] == ordered
    small = layouts(1, 8, 100) + layouts(1, 16, 100) + layouts(1, 32, 400)  # 100 + 100 fit one task, not + 400
    assert [len(c) for c in _shape_chunks(small)] == [200, 400]
    shapes = layouts(1, 8, 10) + layouts(2, 8, 10)  # another (tp, cp, mbs): another task however small
    assert [len(c) for c in _shape_chunks(shapes)] == [10, 10]
