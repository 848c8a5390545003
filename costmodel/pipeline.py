"""Megatron's pipeline schedules: 1F1B and interleaved (virtual-pipeline) 1F1B.

:func:`schedule_order` gives the order in which one pipeline rank runs its forward and backward
passes (Megatron-Core ``schedules.py``): warm-up forwards, a steady 1F1B phase, cool-down
backwards. Interleaving uses Megatron's schedule table: micro-batches in groups of ``pp`` (the
``microbatch_group_size_per_vp_stage`` default), every chunk of a group before the next group;
backwards visit chunks in reverse. Warm-up length per rank: ``pp - rank - 1`` (1F1B) or
``2·(pp - rank - 1) + (vpp - 1)·pp`` (interleaved), capped at the number of passes.

:func:`bubble_fraction` is the schedule's idle fraction ``(pp - 1) / (vpp · m)`` and
:func:`pipeline_time_s` the duration of the forward/backward phase used by the analytic engine
(the discrete-event engine simulates the order with its transfers and link sharing).

With interleaving the closed form ``m · busiest stage + fill`` is not enough: Megatron's order is
static and its wrap-around (virtual stage ``v`` on rank ``pp-1`` feeds ``v+1`` on rank 0, exactly
``pp`` forwards later in rank 0's table) leaves no slack, so when the virtual stages differ (61
layers on 48 virtual stages: 1 or 2 layers each) the critical rank waits on its neighbours every
group of micro-batches, and the phase is longer than its busiest rank's work. :func:`interleaved_phase_s`
takes the longest path through the order's dependencies (each rank's passes in order; a forward
after the previous virtual stage's forward, a backward after the next virtual stage's backward and
its own forward): a few groups simulated, the rest at the steady state's per-group increment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

Pass = Literal["F", "B"]


@dataclass(frozen=True)
class ScheduledPass:
    """One forward ("F") or backward ("B") pass of a micro-batch through one chunk."""

    kind: Pass
    microbatch: int
    chunk: int


def bubble_fraction(pp: int, vpp: int, microbatches: int) -> float:
    """Idle fraction of the schedule relative to the busy time: (pp - 1) / (vpp · m)."""
    return (pp - 1) / (vpp * microbatches)


def _table(microbatches: int, vpp: int, group: int) -> list[tuple[int, int]]:
    """Megatron's (micro-batch, chunk) order of forward passes for one rank."""
    table: list[tuple[int, int]] = []
    for first in range(0, microbatches, group):
        last = min(first + group, microbatches)
        table.extend((mb, c) for c in range(vpp) for mb in range(first, last))
    return table


def warmup_passes(pp: int, vpp: int, microbatches: int, rank: int) -> int:
    """Forward passes pipeline ``rank`` runs before its first backward (Megatron-Core's schedules)."""
    if vpp == 1:
        return min(pp - rank - 1, microbatches)
    return min(2 * (pp - rank - 1) + (vpp - 1) * pp, microbatches * vpp)


def paired_pass_share(pp: int, vpp: int, microbatches: int) -> float:
    """Share of the passes of the busiest-warm-up rank (0) that run as forward-backward pairs.

    Megatron's EP overlap (``--overlap-moe-expert-parallel-comm``) merges a forward and a backward
    of different micro-batches in the steady 1F1B phase; warm-up forwards and cool-down backwards
    (at least one each, also without pipelining) run alone.
    """
    total = microbatches * vpp
    return max(0, total - max(1, warmup_passes(pp, vpp, microbatches, 0))) / total


def schedule_order(pp: int, vpp: int, microbatches: int, rank: int) -> list[ScheduledPass]:
    """Forward/backward passes of pipeline ``rank`` in execution order."""
    total = microbatches * vpp
    warmup = warmup_passes(pp, vpp, microbatches, rank)
    if vpp == 1:
        fwd = [(mb, 0) for mb in range(microbatches)]
        bwd = fwd
    else:
        fwd = _table(microbatches, vpp, pp)
        bwd = [(mb, vpp - 1 - c) for mb, c in fwd]
    order = [ScheduledPass("F", *fwd[i]) for i in range(warmup)]
    for i in range(total - warmup):
        order.append(ScheduledPass("F", *fwd[warmup + i]))
        order.append(ScheduledPass("B", *bwd[i]))
    order.extend(ScheduledPass("B", *bwd[i]) for i in range(total - warmup, total))
    return order


def p2p_exposed_s(pp: int, vpp: int, microbatches: int, p2p_s: float) -> float:
    """Seconds the schedule waits on point-to-point transfers of ``p2p_s`` seconds each.

    Interleaved: the first micro-batch's activation crosses all ``pp·vpp - 1`` virtual-stage
    boundaries in the fill and its gradient again in the drain: ``2 (pp·vpp - 1) p2p_s``.
    1F1B: the same fill and drain plus, in the steady state, the round trip of the in-flight
    micro-batches: ``(2 (pp-1) m / pp + 2 (pp-2)) p2p_s`` in total. Both hold (and are checked
    against the discrete-event schedule) while a transfer is shorter than a chunk's forward pass;
    longer transfers make the schedule latency-bound and are left to the DES.
    """
    if pp <= 1 or p2p_s <= 0:
        return 0.0
    if vpp > 1:
        return 2 * (pp * vpp - 1) * p2p_s
    return (2 * (pp - 1) * microbatches / pp + 2 * (pp - 2)) * p2p_s


@dataclass(frozen=True)
class _OrderGraph:
    """Megatron's interleaved order of one (pp, vpp, m) as flat arrays, per rank: each pass's slot in a
    table of finish times (forward of virtual stage ``v``, micro-batch ``mb`` at ``v·m + mb``; backward
    at ``nv·m + v·m + mb``), the slot it waits for (-1: none), and (chunk, 0 forward / 1 backward) to look
    its seconds up."""

    own: tuple[tuple[int, ...], ...]
    dep: tuple[tuple[int, ...], ...]
    kind: tuple[tuple[tuple[int, int], ...], ...]
    slots: int


@lru_cache(maxsize=256)
def _order_graph(pp: int, vpp: int, microbatches: int) -> _OrderGraph:
    """:class:`_OrderGraph` of :func:`schedule_order` (cached: it depends on the sizes only, and building
    it costs more than walking it)."""
    nv, m = pp * vpp, microbatches
    own, dep, kind = [], [], []
    for r in range(pp):
        o, d, k = [], [], []
        for p in schedule_order(pp, vpp, m, r):
            v = p.chunk * pp + r
            if p.kind == "F":
                o.append(v * m + p.microbatch)
                d.append((v - 1) * m + p.microbatch if v > 0 else -1)
            else:
                o.append(nv * m + v * m + p.microbatch)
                d.append(nv * m + (v + 1) * m + p.microbatch if v < nv - 1 else v * m + p.microbatch)
            k.append((p.chunk, 0 if p.kind == "F" else 1))
        own.append(tuple(o))
        dep.append(tuple(d))
        kind.append(tuple(k))
    return _OrderGraph(tuple(own), tuple(dep), tuple(kind), 2 * nv * m)


def schedule_makespan_s(pass_s: Sequence[Sequence[tuple[float, float]]], microbatches: int) -> float | None:
    """Seconds from the first forward to the last backward of Megatron's interleaved order with
    ``pass_s[stage][chunk]`` = (forward, backward) seconds of one micro-batch and instant transfers
    (None when the order cannot run to its end: :func:`schedule_order` builds it for whole groups of
    ``pp`` micro-batches; a partial last group can wait on a pass scheduled after it)."""
    pp, vpp = len(pass_s), len(pass_s[0])
    graph = _order_graph(pp, vpp, microbatches)
    done = [-1.0] * graph.slots  # finish time per pass (-1: not yet)
    durations = [[pass_s[r][c][k] for c, k in graph.kind[r]] for r in range(pp)]
    pos, free = [0] * pp, [0.0] * pp
    moved = True
    while moved:
        moved = False
        for r in range(pp):
            own, dep, dur, i, t = graph.own[r], graph.dep[r], durations[r], pos[r], free[r]
            n = len(own)
            while i < n:
                d = dep[i]
                ready = done[d] if d >= 0 else 0.0
                if ready < 0.0:
                    break
                t = (t if t > ready else ready) + dur[i]
                done[own[i]] = t
                i += 1
            if i != pos[r]:
                moved = True
                pos[r], free[r] = i, t
    if any(pos[r] != len(graph.own[r]) for r in range(pp)):
        return None
    return max(free)


def interleaved_phase_s(pass_s: Sequence[Sequence[tuple[float, float]]], microbatches: int) -> float | None:
    """Seconds of the forward/backward phase of the interleaved order with per-chunk passes.

    ``pass_s[stage][chunk]``: (forward, backward) compute-stream seconds of one micro-batch through
    that chunk; transfers are instant (:func:`p2p_exposed_s` adds them). The longest path through the
    order (:func:`schedule_makespan_s`); beyond three groups of ``pp`` micro-batches the schedule is
    nearly periodic (a max-plus system), so ``m`` is simulated as ``m - q·pp`` micro-batches plus ``q``
    times the increment one more group adds: equal to the whole order in the tests and on 61 of the 64
    interleaved catalogue defaults (at 1x and 3x their batch), within 0.32 % on the other three, whose
    transient lasts longer. None when the order does not run to its end (:func:`schedule_makespan_s`).
    """
    pp, m = len(pass_s), microbatches
    extra = max(0, m // pp - 3)
    if extra <= 1:
        return schedule_makespan_s(pass_s, m)
    base = m - extra * pp
    t_a = schedule_makespan_s(pass_s, base)
    t_b = schedule_makespan_s(pass_s, base + pp)
    if t_a is None or t_b is None:
        return None
    return t_b + (extra - 1) * (t_b - t_a)


def pipeline_time_s(stage_work_s: Sequence[float], chunk_fwd_s: Sequence[float], chunk_bwd_s: Sequence[float],
                    microbatches: int, vpp: int, p2p_s: float,
                    pass_s: Sequence[Sequence[tuple[float, float]]] | None = None) -> float:
    """Seconds of the forward/backward phase of one step.

    ``stage_work_s[s]``: compute-stream seconds per micro-batch of stage ``s`` (all chunks);
    ``chunk_fwd_s`` / ``chunk_bwd_s``: mean seconds of one chunk's forward / backward per stage;
    ``p2p_s``: one point-to-point transfer. The busiest stage sets the steady state
    (``m · max work``); filling and draining the pipeline adds ``pp - 1`` chunk forwards and
    backwards (the bubble: ``(pp-1)/(vpp·m)`` of the busy time for uniform stages) and the
    transfers of :func:`p2p_exposed_s`. With ``vpp > 1`` and ``pass_s`` (per stage and chunk:
    forward, backward seconds), the phase is the interleaved order's longest path
    (:func:`interleaved_phase_s`) plus the transfers: unequal virtual stages stall the wrap-around
    (the closed form when that order does not run to its end: a partial group of micro-batches).
    """
    pp = len(stage_work_s)
    busiest = max(stage_work_s)
    if pp == 1:
        return microbatches * busiest
    if vpp > 1 and pass_s is not None:
        phase = interleaved_phase_s(pass_s, microbatches)
        if phase is not None:
            return phase + p2p_exposed_s(pp, vpp, microbatches, p2p_s)
    fill = sum(chunk_fwd_s[:-1]) + sum(chunk_bwd_s[1:])
    return microbatches * busiest + fill + p2p_exposed_s(pp, vpp, microbatches, p2p_s)


def pipeline_lower_bound_s(stage_work_s: Sequence[float], chunk_fwd_s: Sequence[float], chunk_bwd_s: Sequence[float],
                           microbatches: int, vpp: int, p2p_s: float,
                           pass_s: Sequence[Sequence[tuple[float, float]]] | None = None) -> float:
    """A lower bound (seconds) on :func:`pipeline_time_s` with the same arguments that simulates nothing:
    what the planner prunes with (it prices thousands of layouts; the interleaved order's longest path
    costs milliseconds each).

    Equal to :func:`pipeline_time_s` without interleaving. With ``vpp > 1`` and ``pass_s``: the smaller of
    the closed form (what :func:`pipeline_time_s` falls back to when the order cannot run) and the
    longest path's floor ``max_r (m · W_r + Σ_{j<r} (F_j0 + B_j0))`` plus the transfers, where ``W_r`` is
    rank ``r``'s work per micro-batch and ``F_j0``, ``B_j0`` rank ``j``'s first chunk's passes: rank ``r``
    cannot start before the first micro-batch's forward has crossed chunk 0 of the ranks before it, runs
    all its passes one after another, and its last pass (chunk 0's last backward) still has to cross
    chunk 0 of those ranks backwards.
    """
    closed = pipeline_time_s(stage_work_s, chunk_fwd_s, chunk_bwd_s, microbatches, vpp, p2p_s)
    if vpp == 1 or pass_s is None or len(stage_work_s) == 1:
        return closed
    floor = before = 0.0
    for passes in pass_s:
        floor = max(floor, microbatches * sum(f + b for f, b in passes) + before)
        before += passes[0][0] + passes[0][1]
    return min(closed, floor + p2p_exposed_s(len(pass_s), vpp, microbatches, p2p_s))
