"""Screening the search space: pipeline bounds first, then best-first expansion of groups.

A *group* (:class:`~costmodel.planner.space.Group`) is a parallel layout + recompute mode +
optimizer kind; its members differ only in optimizer choices (layout, load balance, TP mode,
hiding). A group's *plan* is its fastest member that fits in memory. The screen

1. computes every layout's pipeline bound (the engine's forward/backward phase, a lower bound on
   every member's step time: ``StepEngine.pipeline_bound_s``). Recompute only adds work, so the
   first recompute mode's bound stands in for the others until they are needed;
2. expands groups best-bound-first (every member: memory, then step time) until the best
   remaining bound is no better than the ``keep``-th best plan: every group not expanded is
   provably slower than every listed plan;
3. ranks the reference scenario: a group not expanded whose bound is below the reference step
   time is evaluated through up to ``REP_TRIES`` fitting members, in the order of the optimizer
   choices that won the most expanded groups (each an upper bound on its plan); only when that does
   not decide is the group expanded (up to ``max_rank_expansions``). When more than
   ``max_rank_evaluations`` groups are undecided (a reference far down the ranking), a seeded random
   sample of them is decided and the rank is reported as a range with a sampled estimate.

Bounds are checked whenever a real time meets them; violations are counted and reported.
``exhaustive`` expands every group.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from costmodel.planner.evaluate import Evaluation
from costmodel.planner.pool import TaskPool
from costmodel.planner.rounds import RoundRunner
from costmodel.planner.screen_tasks import task_bounds, task_first_bounds, task_round
from costmodel.planner.space import Candidate, Group

Progress = Callable[[str, int, int], None]
BOUND_TOLERANCE = 1e-9  # relative slack when checking a bound against a real time
CHUNK = 256  # layouts per bound task
REP_TRIES = 3  # members timed per group before expanding it, when ranking the reference
BATCH_PER_JOB = 8  # groups popped per worker and round of the best-first search
AHEAD_ROUNDS = 2  # rounds of groups handed to the pool ahead of need (RoundRunner); Kimi K2 / 256 GPUs: all used


@dataclass(slots=True)
class GroupState:
    group: Group
    bound_s: float = math.inf
    own_bound: bool = False  # False: inherited from the layout's first recompute mode
    expanded: bool = False
    best: Evaluation | None = None  # fastest fitting member (exact once expanded)
    rep: Evaluation | None = None  # preferred fitting member (upper bound on the plan)
    failure: Evaluation | None = None  # why no member fits (invalid / smallest out-of-memory)

    @property
    def infeasible(self) -> bool:
        return self.failure is not None and self.best is None


@dataclass
class ScreenResult:
    evaluations: list[Evaluation] = field(default_factory=list)  # every timed member
    layouts: int = 0
    groups: int = 0
    candidates: int = 0
    bounds_computed: int = 0
    groups_expanded: int = 0
    groups_infeasible: int = 0
    candidates_evaluated: int = 0
    bound_violations: int = 0
    threshold_s: float = math.inf
    reference_rank: tuple[int, int] | None = None  # (best case, worst case); equal when exact
    reference_rank_estimate: int | None = None  # from a random sample when the range is wide
    interrupted: bool = False
    wall_s: float = 0.0
    candidates_proven_slower: int = 0  # members of groups never expanded whose bound is at least the threshold
    candidates_unexamined: int = 0  # members of groups neither expanded, infeasible nor proven slower


# ----------------------------------------------------------------------------- the first bound pass
def bound_order(structure: tuple[int, ...]) -> tuple[int, ...]:
    """Sort key of the bound passes: neighbouring layouts share per-layer costs (the engine caches
    them): tp, cp, mbs, ep and etp slowest (a layer's operations), then pp (its micro-batch count),
    vpp fastest; a bound task holds a run of them, so the workers rarely price the same layer twice."""
    tp, pp, vpp, cp, ep, etp, mbs = structure
    return tp, cp, mbs, ep, etp, pp, vpp


def start_first_bounds(pool: TaskPool, cands: list[Candidate]) -> tuple[int, Iterator[Any]]:
    """Hand the first bound pass to the pool now (one candidate per layout, its first recompute
    mode: :func:`costmodel.planner.space.first_candidates`), while the caller builds the groups;
    :class:`Screen` takes the returned (count, results) as ``first_bounds``."""
    ordered = sorted(cands, key=lambda c: bound_order((c.tp, c.pp, c.vpp, c.cp, c.ep, c.etp, c.mbs)))
    return len(ordered), pool.start_map(task_first_bounds, _shape_chunks(ordered))


def _shape_chunks(ordered: list[Candidate]) -> list[list[Candidate]]:
    """``ordered`` (in :func:`bound_order`) cut into tasks of one (tp, cp, mbs) each, at most
    ``2 x CHUNK`` layouts, cut between expert layouts (ep, etp) where one must be cut: the layers
    without an MoE block (priced per tp, cp, mbs and micro-batch count) and each MoE layer template
    (per tp, cp, mbs, ep, etp) are then priced by one worker, not by both (cut at fixed sizes, a
    Kimi K2 search on 256 GPUs spent 12 % more CPU on its bounds with 2 workers than in one
    process). An expert layout with more than ``2 x CHUNK`` layouts is cut at fixed sizes."""
    runs: list[list[Candidate]] = []  # the layouts of one (tp, cp, mbs, ep, etp), in order
    last: tuple[int, ...] | None = None
    for c in ordered:
        key = (c.tp, c.cp, c.mbs, c.ep, c.etp)
        if key != last:
            runs.append([])
            last = key
        runs[-1].append(c)
    chunks: list[list[Candidate]] = []
    for run in runs:
        shape = (run[0].tp, run[0].cp, run[0].mbs)
        if chunks and (chunks[-1][0].tp, chunks[-1][0].cp, chunks[-1][0].mbs) == shape \
                and len(chunks[-1]) + len(run) <= 2 * CHUNK:
            chunks[-1].extend(run)
            continue
        chunks.extend(run[k:k + 2 * CHUNK] for k in range(0, len(run), 2 * CHUNK))
    return chunks


# ----------------------------------------------------------------------------- the screen
class Screen:
    """Best-first screening of groups on a :class:`TaskPool`."""

    def __init__(self, groups: list[Group], pool: TaskPool, keep: int, progress: Progress | None = None,
                 exhaustive: bool = False, reference_time_s: float | None = None,
                 max_rank_expansions: int = 600, max_rank_evaluations: int = 2000, seed: int = 0,
                 first_bounds: tuple[int, Iterator[Any]] | None = None) -> None:
        self.states = [GroupState(g) for g in groups]  # (slots: a search holds one per group, ~10^5)
        self.first_bounds = first_bounds  # the first bound pass, already handed to the pool (start_first_bounds)
        self.pool = pool
        self.keep = max(keep, 1)
        self.progress = progress or (lambda *_: None)
        self.exhaustive = exhaustive
        self.reference_time_s = reference_time_s
        self.max_rank_expansions = max_rank_expansions
        self.max_rank_evaluations = max_rank_evaluations
        self.seed = seed
        self.result = ScreenResult(groups=len(groups), candidates=sum(len(g.choices) for g in groups))
        self._units: dict[tuple[Any, ...], list[int]] = {}
        units = self._units
        for i, g in enumerate(groups):  # groups of a layout are consecutive (enumerate_groups)
            key = (g.structure, g.recompute)  # Group.layout_key
            members = units.get(key)
            if members is None:
                units[key] = [i]
            else:
                members.append(i)
        self.result.layouts = len(self._units)
        self._best: list[float] = []  # max-heap (negated) of the keep best plan times
        self._wins: dict[tuple[Any, ...], int] = {}  # (kind, optimizer choice) -> groups it won

    # --- bookkeeping
    def threshold_s(self) -> float:
        """A group whose bound is at least this cannot hold a listed plan."""
        if self.exhaustive:
            return math.inf
        return -self._best[0] if len(self._best) >= self.keep else math.inf

    def _check(self, bound_s: float, e: Evaluation) -> None:
        if e.timed and e.step_time_s < bound_s * (1 - BOUND_TOLERANCE):
            self.result.bound_violations += 1

    def _set_bound(self, unit: tuple[Any, ...], bound_s: float, failure: Evaluation | None) -> None:
        self.result.bounds_computed += 1
        for i in self._units[unit]:
            s = self.states[i]
            if math.isfinite(s.bound_s) and bound_s < s.bound_s * (1 - BOUND_TOLERANCE):
                self.result.bound_violations += 1  # recompute made the bound smaller
            s.bound_s, s.own_bound = bound_s, True
            if failure is not None:
                s.failure = failure

    def _apply_members(self, i: int, timed: list[Evaluation], failure: Evaluation | None, expanded: bool) -> None:
        s = self.states[i]
        for e in timed:
            self._check(s.bound_s, e)
            self.result.evaluations.append(e)
        fits = [e for e in timed if e.fits]
        if expanded:
            s.expanded = True
            self.result.groups_expanded += 1
        if fits:
            best = min(fits, key=lambda e: (e.step_time_s, e.memory_bytes))
            if s.rep is None:
                s.rep = best
            if expanded:
                s.best = best
                key = (best.candidate.optimizer, (best.candidate.layout, best.candidate.tp_mode,
                                                  best.candidate.load_balance, best.candidate.hide))
                self._wins[key] = self._wins.get(key, 0) + 1
                heapq.heappush(self._best, -best.step_time_s)
                if len(self._best) > self.keep:
                    heapq.heappop(self._best)
        elif failure is not None or not timed:
            s.failure = failure or s.failure
            if expanded:
                s.expanded = True

    # --- passes
    def _bound_pass(self, units: list[tuple[Any, ...]], label: str) -> None:
        items = [(self._units[u][0], self.states[self._units[u][0]].group) for u in units]
        chunks = [items[k:k + CHUNK] for k in range(0, len(items), CHUNK)]
        results = ([(self.states[i].group.layout_key, bound, failure) for i, bound, failure in chunk]
                   for chunk in self.pool.map(task_bounds, chunks))
        self._take_bounds(results, len(items), label)

    def _take_bounds(self, results: Iterable[list[tuple[Any, ...]]], total: int, label: str) -> None:
        """Record bound results (lists of (layout key, bound, failure)) as they arrive."""
        done = 0
        self.progress(label, 0, total)
        for chunk in results:
            for unit, bound, failure in chunk:
                self._set_bound(unit, bound, failure)
            done += len(chunk)
            self.progress(label, done, total)

    def _inherit(self) -> list[tuple[Any, ...]]:
        """Later recompute modes take the first mode's bound; layouts still needing one are returned."""
        by_structure: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
        for unit in self._units:
            by_structure.setdefault(unit[0], []).append(unit)
        pending = []
        for units in by_structure.values():
            bound = math.inf
            for unit in units:  # none, selective, full
                s = self.states[self._units[unit][0]]
                if s.own_bound:
                    bound = s.bound_s if math.isfinite(s.bound_s) else bound
                    continue
                if math.isfinite(bound):
                    for i in self._units[unit]:
                        self.states[i].bound_s = bound
                else:
                    pending.append(unit)
        return pending

    def run(self) -> ScreenResult:
        """Screen every group (Ctrl-C: stop and keep what was found)."""
        start = time.perf_counter()
        try:
            if self.first_bounds is not None:  # handed to the pool before the groups were built
                total, results = self.first_bounds
                self.first_bounds = None
                self._take_bounds(results, total, "pipeline bounds")
            else:
                seen: set[tuple[Any, ...]] = set()
                first = []
                for unit in self._units:
                    if unit[0] not in seen:
                        seen.add(unit[0])
                        first.append(unit)
                first.sort(key=lambda u: bound_order(u[0]))
                self._bound_pass(first, "pipeline bounds")
            while pending := self._inherit():
                self._bound_pass(pending, "pipeline bounds (recompute)")
            self._best_first(lambda: self.threshold_s(), "expanding best groups")
            self._rank_reference()
        except KeyboardInterrupt:
            self.result.interrupted = True
            self.pool.close(terminate=True)
        res = self.result
        res.threshold_s = self.threshold_s()
        res.groups_infeasible = sum(1 for s in self.states if s.infeasible)
        undecided = [s for s in self.states if not s.expanded and s.failure is None]
        proven = [s for s in undecided if math.isfinite(s.bound_s) and s.bound_s >= res.threshold_s]
        res.candidates_proven_slower = sum(len(s.group.choices) for s in proven)
        res.candidates_unexamined = sum(len(s.group.choices) for s in undecided) - res.candidates_proven_slower
        res.candidates_evaluated = len(res.evaluations)
        res.wall_s = time.perf_counter() - start
        return res

    def _open(self, limit: Callable[[], float], only: set[int] | None = None) -> list[tuple[float, int]]:
        lim = limit()  # constant while the heap is built
        heap = [(s.bound_s, i) for i, s in enumerate(self.states)
                if not s.expanded and s.failure is None and s.bound_s < lim and (only is None or i in only)]
        heapq.heapify(heap)
        return heap

    def _best_first(self, limit: Callable[[], float], label: str, decide: Callable[[GroupState], bool] | None = None,
                    only: set[int] | None = None, likely: Callable[[GroupState], bool] | None = None) -> int:
        """Expand groups in bound order while bound < limit(); ``decide`` may skip a group (True =
        settled without expanding, after its representative). Returns the number expanded.

        With several workers, the groups the next rounds would pop as things stand are handed to the
        pool behind each round's tasks (:class:`RoundRunner`; with ``decide``, those ``likely`` says
        it will expand): the rounds and their decisions are the same, the workers no longer wait."""
        heap = self._open(limit, only)
        batch_size = BATCH_PER_JOB * self.pool.jobs
        runner = RoundRunner(self.pool, task_round)
        ahead = (decide is None or likely is not None) and self.pool.jobs > 1
        done = expanded = 0
        while heap and heap[0][0] < limit():
            bounds: list[tuple[Any, ...]] = []
            reps: list[tuple[tuple[Any, ...], Group, float, int]] = []  # id: (index, choices, target)
            full: list[tuple[int, Group]] = []
            while heap and heap[0][0] < limit() and len(bounds) + len(reps) + len(full) < batch_size:
                _, i = heapq.heappop(heap)
                s = self.states[i]
                if not s.own_bound:
                    bounds.append(s.group.layout_key)
                elif decide is not None and s.rep is None:
                    reps.append(self._rep_item(i, limit()))
                elif decide is None or not decide(s):
                    full.append((i, s.group))
            units = list(dict.fromkeys(bounds))
            firsts = [self._units[u][0] for u in units]
            runner.submit(self._round_tasks([u for u, i in zip(units, firsts, strict=True)
                                             if not runner.known(("bounds", i))],
                                            [r for r in reps if not runner.known(("reps", r[0]))],
                                            [g for g in full if not runner.known(("expand", g[0]))]))
            if ahead:
                runner.submit(self._tasks_ahead(heap, limit(), AHEAD_ROUNDS * batch_size, runner, likely))
            # one round's results, applied bounds first, then representatives, then expansions.
            # The bounds are of layouts none of this round's groups belongs to (those have their
            # own), so applying them before, after or between the members' results gives the same states.
            got = runner.take([("bounds", i) for i in firsts] + [("reps", r[0]) for r in reps]
                              + [("expand", g[0]) for g in full])
            for i in firsts:
                _, bound, failure = got[("bounds", i)]
                self._set_bound(self.states[i].group.layout_key, bound, failure)
            for r in reps:
                _, timed, failure = got[("reps", r[0])]
                self._apply_members(r[0][0], timed, failure, expanded=False)
            for i, _ in full:
                _, timed, failure = got[("expand", i)]
                self._apply_members(i, timed, failure, expanded=True)
            if units:
                self.progress("pipeline bounds (recompute)", len(units), len(units))
            expanded += len(full)
            done += len(reps) + len(full)
            for i in {*(item[0][0] for item in reps), *(item[0] for item in full)} | {
                    j for u in units for j in self._units[u]}:
                s = self.states[i]
                if not s.expanded and s.failure is None and s.bound_s < limit():
                    heapq.heappush(heap, (s.bound_s, i))
            self.progress(label, done, done + len(heap))
        runner.finish()  # work done ahead and not needed: the pool is free for the next pass
        return expanded

    def _rep_item(self, i: int, target_s: float) -> tuple[tuple[Any, ...], Group, float, int]:
        """The representative task item of group ``i``: its id holds what the result depends on."""
        group = self._preferred(self.states[i].group)
        return (i, group.choices, target_s), group, target_s, REP_TRIES

    def _round_tasks(self, units: list[tuple[Any, ...]], reps: list[tuple[tuple[Any, ...], Group, float, int]],
                     full: list[tuple[int, Group]]) -> list[tuple[str, list[Any]]]:
        """One stream for the three kinds of task of a round: no barrier between them."""
        return ([("bounds", t) for t in self._bound_tasks(units)] + [("reps", t) for t in self._tasks(reps)]
                + [("expand", t) for t in self._tasks(full)])

    def _tasks_ahead(self, heap: list[tuple[float, int]], limit_s: float, batch_size: int, runner: RoundRunner,
                     likely: Callable[[GroupState], bool] | None) -> list[tuple[str, list[Any]]]:
        """The tasks of the groups the next round pops if this round moves neither the threshold nor
        any bound (the next ``batch_size`` heap entries below ``limit_s``), less those already known.
        The heap is left as it was (entries popped and pushed back: the same pops follow)."""
        peeked: list[tuple[float, int]] = []
        while heap and heap[0][0] < limit_s and len(peeked) < batch_size:
            peeked.append(heapq.heappop(heap))
        for entry in peeked:
            heapq.heappush(heap, entry)
        units: list[tuple[Any, ...]] = []
        full: list[tuple[int, Group]] = []
        reps: dict[tuple[Any, ...], tuple[tuple[Any, ...], Group, float, int]] = {}
        for _, i in peeked:
            s = self.states[i]
            if not s.own_bound:
                if not runner.known(("bounds", self._units[s.group.layout_key][0])):
                    units.append(s.group.layout_key)
            elif likely is not None and s.rep is None:
                item = self._rep_item(i, limit_s)
                if not runner.known(("reps", item[0])):
                    reps[item[0]] = item
            elif not s.expanded and (likely is None or likely(s)) and not runner.known(("expand", i)):
                full.append((i, s.group))
        return self._round_tasks(list(dict.fromkeys(units)), list(reps.values()),
                                 list({i: (i, g) for i, g in full}.values()))

    def _preferred(self, group: Group) -> Group:
        """The group with its optimizer choices ordered by how often each won an expanded group."""
        wins = self._wins
        order = sorted(group.choices, key=lambda ch: -wins.get((group.kind, ch), 0))
        return dataclasses.replace(group, choices=tuple(order))

    def _tasks(self, items: list[Any]) -> list[list[Any]]:
        """Split items into about one task per worker, keeping groups that share an optimizer plan
        (same tp, pp, vpp, ep, etp) together so that a worker builds each plan once."""
        if not items:
            return []
        by_plan: dict[tuple[int, ...], list[Any]] = {}
        for item in items:
            st = item[1].structure
            by_plan.setdefault((st[0], st[1], st[2], st[4], st[5]), []).append(item)
        tasks: list[list[Any]] = [[] for _ in range(min(self.pool.jobs, len(by_plan)))]
        for members in sorted(by_plan.values(), key=len, reverse=True):
            min(tasks, key=len).extend(members)
        return [t for t in tasks if t]

    def _bound_tasks(self, units: list[tuple[Any, ...]]) -> list[list[tuple[int, Group]]]:
        """The bound tasks of a round's ``units`` (layout keys): in :func:`bound_order`, cut into tasks
        of :data:`CHUNK` layouts at most."""
        if not units:
            return []
        units = sorted(units, key=lambda u: bound_order(u[0]))
        items = [(self._units[u][0], self.states[self._units[u][0]].group) for u in units]
        return [items[k:k + CHUNK] for k in range(0, len(items), CHUNK)]

    def _faster(self, s: GroupState, ref: float) -> bool:
        plan = s.best if s.expanded else s.rep  # exact plan, or an upper bound on it
        return plan is not None and plan.step_time_s < ref

    def _rank_reference(self) -> None:
        """Rank of the reference: 1 + the number of plans strictly faster.

        Exact when at most ``max_rank_evaluations`` groups are undecided (bound below the reference's
        time, no member known to beat it); otherwise a seeded random sample of them is decided and
        the rank is a range with a sampled estimate.
        """
        ref = self.reference_time_s
        if ref is None or not math.isfinite(ref):
            return
        pre = sum(1 for s in self.states if self._faster(s, ref))
        open_ = [i for i, s in enumerate(self.states)
                 if not s.expanded and s.failure is None and s.bound_s < ref and not self._faster(s, ref)]
        only: set[int] | None = None
        if len(open_) > self.max_rank_evaluations:
            only = set(random.Random(self.seed).sample(open_, self.max_rank_evaluations))
        budget = [self.max_rank_expansions]

        def settled(s: GroupState) -> bool:  # True: decided without expanding the group
            if self._faster(s, ref) or budget[0] <= 0:
                return True
            budget[0] -= 1
            return False

        self._best_first(lambda: ref, "ranking the reference", decide=settled, only=only,
                         likely=lambda s: budget[0] > 0 and not self._faster(s, ref))
        decided = [i for i in (only if only is not None else open_) if self._faster(self.states[i], ref)]
        undecided = [i for i in (only if only is not None else open_)
                     if not self._faster(self.states[i], ref) and self._might_beat(self.states[i], ref)]
        unsampled = len(open_) - len(only) if only is not None else 0
        low = pre + len(decided) + 1
        self.result.reference_rank = (low, low + len(undecided) + unsampled)
        if only is not None:
            share = len(decided) / len(only)
            self.result.reference_rank_estimate = pre + 1 + round(share * len(open_))

    def _might_beat(self, s: GroupState, ref: float) -> bool:
        if s.expanded or s.failure is not None or s.bound_s >= ref:
            return False
        return s.rep is None or s.rep.step_time_s >= ref
