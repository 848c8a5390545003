"""``run_plan``: search, screen, re-rank the head with the DES, sensitivity, explanations.

Steps (each stage honours Ctrl-C: what was found so far is kept and ``interrupted`` is set):

1. the space (:mod:`costmodel.planner.space`) under the pins, with layouts whose weights and
   gradients alone exceed the memory budget dropped (:mod:`costmodel.planner.memory_bound`);
2. the screen (:mod:`costmodel.planner.screen`) with the analytic engine on ``jobs`` processes;
3. the discrete-event engine on the ``top_k`` best plans (and on the reference scenario); the head
   is re-ranked by DES time, and the reference goes first when its DES time beats every head plan;
4. sensitivity of the ranking to the calibration's factor uncertainty
   (:mod:`costmodel.planner.sensitivity`) and the "why not" explanations
   (:mod:`costmodel.planner.explain`).

The memory budget is ``(1 - headroom) x`` the GPU's usable HBM; a plan is listed only when the
memory model's total for its most loaded GPU is within it and the scenario validator accepts it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from costmodel.planner.cluster import open_pool
from costmodel.planner.evaluate import (
    Evaluation,
    Evaluator,
    MemoryFn,
    StepEngine,
    default_memory_fn,
    report_terms,
)
from costmodel.planner.explain import explain, explanation_json
from costmodel.planner.memory_bound import weights_and_grads_bytes
from costmodel.planner.pins import Pins
from costmodel.planner.pool import default_jobs, evaluator, relaxed_gc, set_evaluators
from costmodel.planner.ranking import pareto_front
from costmodel.planner.result import PlanResult, PlanRow, ReferenceOut, SpaceStats, plan_row
from costmodel.planner.screen import Progress, Screen, start_first_bounds
from costmodel.planner.sensitivity import (
    factor_sigmas,
    run_sensitivity,
    sample_tasks,
    summarise,
    task_sample,
)
from costmodel.planner.space import (
    Candidate,
    build_scenario,
    default_values,
    enumerate_groups,
    first_candidates,
    structure_grid,
)
from topologies.inputs import UserInputError
from workloads.weight_memory import min_weight_bytes_per_element

if TYPE_CHECKING:
    from costmodel.calibrate.profile import CalibrationProfile
    from costmodel.report import StepReport
    from workloads.scenario import Scenario, ScenarioConfig

ReportFn = Callable[["Scenario"], "StepReport | UntimedReport"]


@dataclass(frozen=True)
class PlanOptions:
    pins: Pins = field(default_factory=Pins)
    headroom: float = 0.1  # fraction of HBM kept free
    top_k: int = 5  # plans re-ranked with the DES (0 = none)
    limit: int = 10  # rows listed
    jobs: int = 0  # worker processes (0 = every core)
    samples: int = 16  # sensitivity draws (0 = none)
    sensitivity_plans: int = 8
    assumed_sigma: float | None = None  # relative 1-sigma for factors without a fitted one
    seed: int = 0
    explain: tuple[str, ...] = ()
    exhaustive: bool = False
    max_rank_expansions: int = 600  # groups expanded to decide the reference's rank (Kimi K2 on 256 GPUs: 122)
    max_rank_evaluations: int = 2000  # undecided groups evaluated for it (Kimi K2, 256 GPUs: 694; more: a sampled estimate)
    scheduler: str | None = None  # Dask scheduler address: screen on its workers instead of local processes


@dataclass
class PlanOutcome:
    result: PlanResult
    evaluations: list[Evaluation]  # every timed evaluation (scatter)
    best_report: StepReport | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def memory_budget_bytes(base: Scenario, headroom: float) -> float:
    """Usable memory per GPU for a plan: (1 - headroom) x the GPU's HBM, in bytes."""
    if not 0 <= headroom < 1:
        raise UserInputError(f"--memory-headroom: must be in [0, 1), the fraction of HBM kept free (got {headroom})")
    return (1.0 - headroom) * base.system.gpu.hbm_bytes


@dataclass(frozen=True)
class UntimedReport:
    """A DES StepReport without its timeline events, and the raw timeline as tuples: what a worker
    sends back (:func:`costmodel.des.engine.run_des_untimed`); :meth:`full` is the StepReport
    ``predict(scenario, "des")`` gives, made only for the plan that needs it (the best)."""

    report: StepReport
    raw: list[Any]

    @property
    def step_time_s(self) -> float:
        """The DES step time in seconds."""
        return self.report.step_time_s

    def full(self) -> StepReport:
        """The StepReport with its timeline events."""
        from costmodel.des.engine import with_timeline

        return with_timeline(self.report, self.raw)


def _default_des(scenario: Scenario) -> UntimedReport:
    from costmodel.des.engine import run_des_untimed

    return UntimedReport(*run_des_untimed(scenario))


def _full_report(report: Any) -> Any:
    """A des_fn's report as a StepReport (an :class:`UntimedReport` with its events put in)."""
    return report.full() if isinstance(report, UntimedReport) else report


def task_des(cand: Candidate) -> tuple[Candidate, float, Any]:
    """(candidate, DES step time s, the des_fn's report: a StepReport or an :class:`UntimedReport`)
    for one plan (a pool task)."""
    ev = evaluator("screen")
    report = evaluator("des_fn")(build_scenario(ev.base, cand))
    return cand, float(report.step_time_s), report


def task_after_screen(item: tuple[Any, ...]) -> tuple[Any, ...]:
    """A pool task of the phase after the screen: ``("des", candidate)`` -> ``("des", candidate, DES
    step time s, StepReport)``; ``("sample", k, task)`` -> ``("sample", k, step times s)`` of the
    sensitivity's draw ``k`` (:func:`costmodel.planner.sensitivity.task_sample`)."""
    if item[0] == "des":
        return ("des", *task_des(item[1]))
    return "sample", item[1], task_sample(item[2])


def _sensitivity_candidates(plans: list[Evaluation], head: int, n: int, des_todo: list[Candidate]) -> list[Candidate]:
    """The plans the sensitivity may rank, known before the DES re-ranks the head: the final top ``n``
    is drawn from the first ``max(n, head)`` plans and the reference (which joins the head when its
    DES time beats every head plan's)."""
    return list(dict.fromkeys([e.candidate for e in plans[:max(n, head)]] + des_todo[head:]))


def des_chunk_passes(base: Scenario, cand: Candidate) -> int:
    """Forward and backward model-chunk passes the DES of ``cand`` simulates per step (count):
    2 x pp stages x vpp chunks x microbatches. Its run time grows with it (a pp8 vpp7 plan of Kimi K2
    on 256 GPUs: 7,168 passes, 1.3 s CPU; pp4 vpp8: 2,048, 0.4 s), so the pool starts the longest first."""
    dp = max(base.gpus // (cand.tp * cand.pp * cand.cp), 1)
    microbatches = max(base.par.global_batch_size // (cand.mbs * dp), 1)
    return 2 * cand.pp * cand.vpp * microbatches


def _des_and_draws(pool: Any, todo: list[Candidate], tasks: list[Any], des: dict[Candidate, tuple[float, Any]],
                   times_by_draw: dict[int, list[float]], progress: Progress | None) -> tuple[float, float]:
    """Run the DES of ``todo`` and the sensitivity draws ``tasks`` as one pool stream, filling ``des``
    (candidate -> (DES step time s, report)) and ``times_by_draw`` (draw index -> step times s) as
    results arrive (a KeyboardInterrupt leaves what is done). Returns (seconds until the last DES
    result, seconds the draws took beyond it)."""
    t0 = time.perf_counter()
    t_des = t_draws = 0.0
    if progress and todo:
        progress("discrete-event engine", 0, len(todo))
    items = [("des", c) for c in todo] + [("sample", k, t) for k, t in enumerate(tasks)]
    for out in pool.map(task_after_screen, items):
        if out[0] == "des":
            des[out[1]] = (out[2], out[3])
            t_des = time.perf_counter() - t0
            if progress:
                progress("discrete-event engine", len(des), len(todo))
        else:
            times_by_draw[out[1]] = out[2]
            t_draws = time.perf_counter() - t0
    return t_des, max(t_draws - t_des, 0.0)


def _no_fit_note(screen: Screen, budget_bytes: float, hbm_bytes: float, recomputes: list[str]) -> str | None:
    """When every screened layout is out of memory: the one needing the least (memory per GPU in GB, 1e9 bytes,
    and its excess over the budget) and what could make a plan fit; None when none was out of memory. Layouts
    whose weights and gradients alone exceed the budget are not screened (the statistics count them)."""
    ooms = [s.failure for s in screen.states if s.failure is not None and s.failure.status == "oom"]
    if not ooms:
        return None
    f = min(ooms, key=lambda e: e.memory_bytes)
    remedies = ["more GPUs (--gpus)"]
    if "full" not in recomputes:
        remedies.append("--recompute full")
    if f.memory_bytes <= hbm_bytes and budget_bytes < hbm_bytes:
        remedies.append("a smaller --memory-headroom")
    return (f"no screened layout fits in memory: the one needing the least, {f.candidate.label()}, needs "
            f"{f.memory_bytes / 1e9:,.1f} GB per GPU, {(f.memory_bytes - budget_bytes) / 1e9:,.1f} GB over the "
            f"{budget_bytes / 1e9:,.1f} GB budget; {', '.join(remedies[:-1])}{' or ' if len(remedies) > 1 else ''}"
            f"{remedies[-1]} may fit")


def _empty_space_error(base: Scenario, pins: Pins) -> UserInputError:
    """Why the pins and bounds leave no candidate at all (a search whose layouts merely do not fit in
    memory is an empty answer with a note, not this error)."""
    vals = default_values(base, pins)
    empty = [k for k, v in vals.items() if not v]
    if empty:
        return UserInputError(f"the pins and bounds leave no value for {', '.join(empty)}")
    tp, pp, vpp, cp, ep, etp, mbs = (int(vals[k][0]) for k in ("tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch_size"))
    first = Candidate(tp, pp, vpp, cp, ep, etp, mbs, str(vals["recompute"][0]), base.optimizer.kind,
                      base.optimizer.resolved_distribution)
    try:
        build_scenario(base, first)
    except UserInputError as err:
        return UserInputError(f"no configuration in the search space passes the scenario validator, e.g. {err}")
    return UserInputError("no configuration in the search space passes the scenario validator")


def scenario_from_config(config: ScenarioConfig) -> Scenario:
    """The scenario of ``config`` *without* validating it (as ``ScenarioConfig.resolve`` loads it).

    The planner's base need not be valid itself: every candidate replaces the searched settings
    and is validated on its own.
    """
    from topologies.hardware import load_system
    from workloads.models import resolve_model
    from workloads.scenario import Scenario

    model = resolve_model(config.model)
    if config.mtp_layers is not None and config.mtp_layers != model.mtp_layers:
        model = model.model_copy(update={"mtp_layers": config.mtp_layers})
    return Scenario(config=config, system=load_system(config.system), model=model)


@relaxed_gc()
def run_plan(base: Scenario, options: PlanOptions, reference_error: str | None = None, engine: StepEngine | None = None,
             memory_fn: MemoryFn | None = None, des_fn: ReportFn | None = None,
             profile: CalibrationProfile | None = None, calibration_label: str = "datasheet defaults",
             progress: Progress | None = None) -> PlanOutcome:
    """Plan over the space around ``base`` (calibration applied; see :func:`scenario_from_config`).

    ``base`` itself is ranked as the reference scenario unless ``reference_error`` says why it is
    not valid.
    ``engine`` / ``memory_fn`` / ``des_fn`` default to the real models (tests inject stubs).
    """
    from costmodel.planner.fast_analytic import FastAnalytic

    t_start = time.perf_counter()
    reference_ok = reference_error is None
    engine = engine or FastAnalytic()
    memory_fn = memory_fn or default_memory_fn()
    des_fn = des_fn or _default_des
    jobs = options.jobs or default_jobs()
    budget = memory_budget_bytes(base, options.headroom)
    notes: list[str] = []

    grid, raw = structure_grid(base, options.pins)
    lb = weights_and_grads_bytes(base.model, grid, base.optimizer.grad_bytes, base.par.pipeline_split,
                                 min_weight_bytes_per_element(base))
    if base.par.fsdp:  # Megatron-FSDP shards weights and gradients over at most gpus/(tp·pp) ranks
        lb = lb / (base.gpus / (grid[:, 0] * grid[:, 1]))
    grid_ok = grid[lb <= budget]
    recomputes = default_values(base, options.pins)["recompute"]
    first = first_candidates(options.pins, grid_ok, recomputes[0]) if recomputes else []
    if not first and (len(grid_ok) or not len(grid) or not recomputes):  # no group at all: the pins leave nothing
        raise _empty_space_error(base, options.pins)
    if not len(grid_ok):  # a search with an empty answer, as when every screened layout is out of memory
        notes.append(f"no layout fits in memory: the weights and gradients alone need at least {lb.min() / 1e9:,.1f} "
                     f"GB per GPU, over the {budget / 1e9:,.1f} GB budget; more GPUs (--gpus) may fit")

    screen_ev = Evaluator(base, engine, memory_fn, budget)
    set_evaluators(screen=screen_ev, des_fn=des_fn)
    keep = max(options.limit, options.top_k, options.sensitivity_plans, 1)
    des: dict[Candidate, tuple[float, Any]] = {}
    t_des = t_sens = 0.0
    sensitivity = None
    interrupted = False
    with open_pool(jobs, options.scheduler) as pool:
        jobs = pool.jobs
        # the workers price the first bounds while this process builds the groups and the reference
        first_bounds = start_first_bounds(pool, first)
        ref_eval = screen_ev.evaluate(Candidate.from_scenario(base)) if reference_ok else None
        ref_time = ref_eval.step_time_s if ref_eval is not None and ref_eval.fits else None
        groups = enumerate_groups(base, options.pins, grid_ok)
        screen = Screen(groups, pool, keep, progress, options.exhaustive, ref_time, options.max_rank_expansions,
                        options.max_rank_evaluations, options.seed, first_bounds)
        sres = screen.run()
        interrupted = sres.interrupted
        plans = sorted((s.best for s in screen.states if s.best is not None),
                       key=lambda e: (e.step_time_s, e.memory_bytes, e.candidate.label()))
        head = plans[:options.top_k]
        todo: list[Candidate] = []
        if not interrupted and head:
            todo = [e.candidate for e in head]
            if ref_time is not None and ref_eval is not None and ref_eval.candidate not in todo:
                todo.append(ref_eval.candidate)
        sigmas, source = factor_sigmas(profile, base.system.name, base.system.efficiency, options.assumed_sigma)
        drawn: list[Candidate] = []  # every plan the sensitivity may rank (the DES decides which)
        if not interrupted and options.samples > 0 and sigmas:
            drawn = _sensitivity_candidates(plans, len(head), options.sensitivity_plans, todo)
        tasks = sample_tasks(drawn, sigmas, options.samples, options.seed) if len(drawn) >= 2 else []
        times_by_draw: dict[int, list[float]] = {}
        if todo or tasks:  # the DES runs and the draws share the pool: the draws fill the DES's last round
            try:
                longest_first = sorted(todo, key=lambda c: -des_chunk_passes(base, c))  # stable: ties keep rank order
                t_des, t_sens = _des_and_draws(pool, longest_first, tasks, des, times_by_draw, progress)
            except KeyboardInterrupt:
                interrupted = True
                pool.close(terminate=True)
        ranked, ref_joined = _final_order(plans, head, des, ref_eval)
        if ref_joined:
            notes.append("the reference scenario's DES time beats every DES-ranked head plan: it is listed first")
        if not interrupted and options.samples > 0 and len(ranked) >= 2:
            top = ranked[:options.sensitivity_plans]
            cands, nominal = [e.candidate for e in top], [e.step_time_s for e in top]
            where = {c: i for i, c in enumerate(drawn)}
            if tasks and len(times_by_draw) == len(tasks) and all(c in where for c in cands):
                per_draw = [[times_by_draw[k][where[c]] for c in cands] for k in range(len(tasks))]
                sensitivity = summarise(cands, nominal, sigmas, source, per_draw)
            else:  # skipped (no sigma), or plans the draws did not cover
                t0 = time.perf_counter()
                try:
                    sensitivity = run_sensitivity(cands, nominal, sigmas, source, pool.map, options.samples,
                                                  options.seed)
                except KeyboardInterrupt:
                    interrupted = True
                    pool.close(terminate=True)
                t_sens += time.perf_counter() - t0
    explanations = []
    try:
        explanations = [explanation_json(explain(q, screen, screen_ev, ranked)) for q in options.explain]
    except KeyboardInterrupt:
        interrupted = True
    if not ranked and not interrupted:
        note = _no_fit_note(screen, budget, base.system.gpu.hbm_bytes, recomputes)
        if note:
            notes.append(note)
    if sres.bound_violations:
        notes.append(f"{sres.bound_violations} step times fell below their pipeline bound: pruning may have missed plans")
    rows = _rows(ranked[:options.limit], des, ref_eval)
    if any(r.settings.get("tp_mode") == "blockwise" for r in rows):
        notes.append("blockwise Newton-Schulz orthogonalises each TP shard on its own: a different update than "
                     "full-matrix Muon (pin --tp-mode duplicated,distributed to exclude it)")
    reference = _reference(ref_eval, reference_error, rows, ranked, sres.reference_rank, des)
    reference.rank_estimate = sres.reference_rank_estimate if reference.rank is None else None
    evaluations = list(sres.evaluations) + ([ref_eval] if ref_eval is not None and ref_eval.timed else [])
    front = _pareto(evaluations, des, ref_eval)
    best_report = _full_report(des[ranked[0].candidate][1]) if ranked and ranked[0].candidate in des else None
    if ranked and best_report is None and not interrupted and hasattr(engine, "report"):
        best_report = engine.report(build_scenario(base, ranked[0].candidate))
    if best_report is not None:  # the engines saw an already calibrated system: say which profile
        best_report = best_report.model_copy(update={"calibration": calibration_label})
    total = time.perf_counter() - t_start
    covered = sres.candidates
    stats = SpaceStats(
        raw_combinations=raw * max(len(default_values(base, options.pins)["recompute"]), 1),
        valid_layouts=len(grid), layouts_over_memory_by_weights=int(len(grid) - len(grid_ok)),
        layouts_screened=sres.layouts, groups=sres.groups, candidates=sres.candidates,
        bounds_computed=sres.bounds_computed, groups_expanded=sres.groups_expanded,
        groups_infeasible=sres.groups_infeasible, candidates_evaluated=sres.candidates_evaluated,
        candidates_pruned=(sres.candidates_proven_slower if sres.interrupted  # only what the search examined
                           else max(covered - sres.candidates_evaluated, 0)),
        candidates_unexamined=sres.candidates_unexamined if sres.interrupted else 0, bound_violations=sres.bound_violations,
        threshold_s=sres.threshold_s if math.isfinite(sres.threshold_s) else None, jobs=jobs,
        screening_wall_s=sres.wall_s,
        engine_calls_per_s=(sres.bounds_computed + sres.candidates_evaluated) / max(sres.wall_s, 1e-9),
        candidates_per_s=covered / max(sres.wall_s, 1e-9) if not sres.interrupted else 0.0,
        des_wall_s=t_des, sensitivity_wall_s=t_sens, total_wall_s=total,
    )
    if interrupted:
        notes.append("interrupted: the ranking holds what was found before the interruption")
    result = PlanResult(
        scenario=base.config.model_dump(mode="json"), calibration=calibration_label, pins=options.pins.describe(),
        memory_headroom_fraction=options.headroom, memory_budget_bytes=budget, ranking=rows, reference=reference,
        pareto_front=front, best=rows[0] if rows else None,
        best_report=best_report.to_json_dict() if best_report is not None else None,
        sensitivity=dataclasses.asdict(sensitivity) if sensitivity is not None else None,
        explain=explanations, stats=stats, interrupted=interrupted, notes=notes,
    )
    return PlanOutcome(result=result, evaluations=evaluations, best_report=best_report)


def _final_order(plans: list[Evaluation], head: list[Evaluation], des: dict[Candidate, tuple[float, Any]],
                 ref: Evaluation | None) -> tuple[list[Evaluation], bool]:
    """Head re-ranked by DES time, then the rest by analytic time. The reference joins the head (as
    its first plan) only when its DES time beats every head plan's; otherwise it keeps its analytic
    rank (plans past the head have no DES time to compare with)."""
    timed_head = [e for e in head if e.candidate in des]
    if not timed_head:
        return plans, False
    joined = False
    in_head = ref is not None and any(e.candidate == ref.candidate for e in head)
    if (ref is not None and not in_head and ref.candidate in des
            and des[ref.candidate][0] < min(des[e.candidate][0] for e in timed_head)):
        timed_head.append(ref)
        joined = True
    timed_head.sort(key=lambda e: des[e.candidate][0])
    rest = [e for e in plans[len(head):] if not (joined and ref is not None and e.candidate == ref.candidate)]
    untimed = [e for e in head if e.candidate not in des]
    return timed_head + untimed + rest, joined


def _rows(ranked: list[Evaluation], des: dict[Candidate, tuple[float, Any]], ref: Evaluation | None) -> list[PlanRow]:
    return [plan_row(e, rank=k, des_step_time_s=des[e.candidate][0] if e.candidate in des else None,
                     reference=ref is not None and e.candidate == ref.candidate)
            for k, e in enumerate(ranked, 1)]


def _reference(ref: Evaluation | None, error: str | None, rows: list[PlanRow], ranked: list[Evaluation],
               screen_rank: tuple[int, int] | None, des: dict[Candidate, tuple[float, Any]]) -> ReferenceOut:
    if error is not None or ref is None:
        return ReferenceOut(status="invalid", message=f"the given scenario is not valid ({error}); it is not ranked")
    label = ref.candidate.label()
    if not ref.fits:
        return ReferenceOut(label=label, status=ref.status, message=ref.message)
    for row in rows:
        if row.reference:
            return ReferenceOut(label=label, status="ok", rank=row.rank, row=row)
    # the ranked list is complete only in its head: past it, count the plans the screen proved faster
    head = len(rows)
    position = next((k for k, e in enumerate(ranked[:head], 1) if e.candidate == ref.candidate), None)
    des_t = des[ref.candidate][0] if ref.candidate in des else None
    if position is not None:
        rank, rank_range = position, None
    elif screen_rank is not None and screen_rank[0] == screen_rank[1]:
        rank, rank_range = screen_rank[0], None
    else:
        rank, rank_range = None, screen_rank
    row = plan_row(ref, rank=rank, des_step_time_s=des_t, reference=True, rank_range=rank_range)
    return ReferenceOut(label=label, status="ok", rank=rank, rank_range=rank_range, row=row)


def _pareto(evaluations: list[Evaluation], des: dict[Candidate, tuple[float, Any]],
            ref: Evaluation | None) -> list[PlanRow]:
    ok = {e.candidate: e for e in evaluations if e.fits and e.timed}
    pts = list(ok.values())
    if not pts:
        return []
    idx = pareto_front(np.array([e.step_time_s for e in pts]), np.array([e.memory_bytes for e in pts]))
    return [plan_row(pts[i], des_step_time_s=des[pts[i].candidate][0] if pts[i].candidate in des else None,
                     reference=ref is not None and pts[i].candidate == ref.candidate, pareto=True)
            for i in idx]


__all__ = ["PlanOptions", "PlanOutcome", "memory_budget_bytes", "report_terms", "run_plan"]
