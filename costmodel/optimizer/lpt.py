"""Greedy LPT placement of whole parameters on ``d`` shards, with identical parameters in batches.

The rule (Megatron's layer-wise layouts, :mod:`costmodel.optimizer.layouts`): parameters in
descending cost order (stable), each onto the least-loaded shard (ties: the lowest shard) among
those it fits on under ``cap`` elements (its 64-aligned start plus its size); when it fits on none,
onto the shard whose cursor is lowest. Loads persist across calls (``loads`` is updated in place).

A model has thousands of identical matrices (the expert copies of its layers), which come out of
the cost sort next to each other. :func:`lpt_place` walks them as runs of identical (size, cost)
items: a short run item by item (a heap of (load, shard)), a long one in one step. For ``k``
identical items of cost ``c`` the greedy picks are the ``k`` smallest of the slots ``(load_r + j·c,
r)``, ``j`` below the number of items shard ``r`` can still take under the cap (``m_r``): with
``load_r = c·q_r + ρ_r`` a slot is ``(level q_r + j, ρ_r, r)``, so the level where the count of
slots reaches ``k`` is found by bisection and the slots are taken in (level, ρ, shard) order. The
arithmetic is exact in integers; the batches are used only while every load stays below 2⁵³, where
the scalar walk's float additions are exact too, so both give the same placement to the bit.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

PARAM_ALIGN = 64  # elements: parameter starts in distributed-optimizer buffers
BATCH_WORK = 1024  # a run of k items on d shards goes in one step when k·d reaches this
EXACT_LIMIT = 2 ** 53  # loads below this are exact integers in float64


def _aligned(size: int) -> int:
    return -(-size // PARAM_ALIGN) * PARAM_ALIGN


class _Shards:
    """Per-shard state: loads (integer-valued floats), 64-aligned fill, cursor (end of the last item)."""

    def __init__(self, loads: np.ndarray, cap: float | None) -> None:
        self.d = len(loads)
        self.load: list[float] = loads.astype(np.float64).tolist()
        self.padded = [0] * self.d
        self.cursor = [0] * self.d
        self.cap = cap
        self.heap = [(x, r) for r, x in enumerate(self.load)]
        heapq.heapify(self.heap)

    def place_one(self, size: int, cost: float) -> tuple[int, int]:
        """(shard, start) of one item: the least-loaded shard it fits on, else the lowest cursor."""
        heap, cap, padded = self.heap, self.cap, self.padded
        if cap is not None and min(padded) + size > cap:  # fits nowhere: the shortest shard, heap untouched
            return self._put(min(range(self.d), key=self.cursor.__getitem__), size, cost)
        skipped = []
        while heap and heap[0][0] != self.load[heap[0][1]]:  # stale entry
            heapq.heappop(heap)
        while heap and cap is not None and padded[heap[0][1]] + size > cap:
            skipped.append(heapq.heappop(heap))
            while heap and heap[0][0] != self.load[heap[0][1]]:
                heapq.heappop(heap)
        if heap:
            r = heapq.heappop(heap)[1]
        else:  # nothing fits under the cap: the shortest shard
            r = min(range(self.d), key=self.cursor.__getitem__)
            skipped = [e for e in skipped if e[1] != r]
        for e in skipped:
            heapq.heappush(heap, e)
        return self._put(r, size, cost)

    def _put(self, r: int, size: int, cost: float) -> tuple[int, int]:
        """(shard, start) of an item put on shard ``r``; its heap entry is pushed anew (the old one
        is stale: loads only grow, so a stale entry never matches the shard's load again)."""
        at = self.padded[r]
        self.cursor[r] = at + size
        self.padded[r] = _aligned(at + size)
        self.load[r] += cost
        heapq.heappush(self.heap, (self.load[r], r))
        return r, at

    def place_run(self, k: int, size: int, cost: int) -> tuple[np.ndarray, np.ndarray, int]:
        """(shards, starts) of the first items of a run of ``k`` identical items that fit under the
        cap (all of them without a cap), in placement order, and how many that is."""
        d = self.d
        load = np.array(self.load, dtype=np.float64).astype(np.int64)
        padded = np.array(self.padded, dtype=np.int64)
        step = _aligned(size)
        if self.cap is None:
            room = np.full(d, k, dtype=np.int64)
        else:
            free = math.floor(self.cap) - size - padded
            room = np.where(free >= 0, free // max(step, 1) + 1, 0) if step else np.where(free >= 0, k, 0)
            room = np.minimum(room, k)
        fit = int(min(k, int(room.sum())))
        if fit == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), 0
        level0, rho = np.divmod(load, cost)
        live = room > 0
        lo, hi = int(level0[live].min()), int((level0 + room - 1)[live].max())
        while lo < hi:  # the smallest level at which the slots up to it reach ``fit``
            mid = (lo + hi) // 2
            if int(np.clip(mid - level0 + 1, 0, room).sum()) >= fit:
                hi = mid
            else:
                lo = mid + 1
        taken = np.clip(lo - level0, 0, room)  # slots below the level
        extra = fit - int(taken.sum())
        if extra:  # slots at the level, by (ρ, shard)
            at_level = np.flatnonzero((level0 <= lo) & (taken < room))
            at_level = at_level[np.lexsort((at_level, rho[at_level]))][:extra]
            taken[at_level] += 1
        shard = np.repeat(np.arange(d, dtype=np.int64), taken)
        j = np.arange(fit, dtype=np.int64) - np.repeat(np.cumsum(taken) - taken, taken)
        order = np.lexsort((shard, rho[shard], level0[shard] + j))
        shard, j = shard[order], j[order]
        starts = padded[shard] + j * step
        used = taken > 0
        cursor = np.array(self.cursor, dtype=np.int64)
        cursor[used] = padded[used] + (taken[used] - 1) * step + size
        self.cursor = cursor.tolist()
        self.padded = (padded + taken * step).tolist()
        self.load = (load + taken * cost).astype(np.float64).tolist()
        self.heap = [(x, r) for r, x in enumerate(self.load)]
        heapq.heapify(self.heap)
        return shard, starts, fit


def _one_per_shard(sizes: list[int], costs: list[float], load: list[float]) -> list[int] | None:
    """The shard of every item when the greedy provably puts them one per shard, else None.

    With at most ``d`` items, every shard equally loaded, every size and cost positive (and a cost
    that raises a load: not lost to rounding), item k of the descending-cost order (stable) goes on
    shard k: the shards before it are more loaded, and if it fits on no empty shard under the cap it
    fits on no used one either, where the lowest cursor is again the first empty shard's. The
    caller adds the costs to the loads and stacks each item at start 0."""
    n, d = len(sizes), len(load)
    if n == 0 or n > d or min(sizes) <= 0 or min(costs) <= 0:
        return None
    level = load[0]
    if any(x != level for x in load) or not level + min(costs) > level:
        return None
    owner = [0] * n
    for k, i in enumerate(sorted(range(n), key=lambda i: -costs[i])):
        owner[i] = k
    return owner


def lpt_place_small(sizes: list[int], costs: list[float], load: list[float],
                    cap: float | None) -> tuple[list[int], list[int], list[int]]:
    """:func:`lpt_place` on plain lists, item by item (no batches, no heap): (shard, start within
    the shard, shard cursors) of every item; ``load`` (one float per shard) is updated in place.

    For the many small chunks of a layer-wise buffer (a few items on a few shards), where numpy's
    per-call overhead dominates. The same rule and the same float additions in the same order as
    :meth:`_Shards.place_one` (least-loaded fitting shard, ties to the lowest; else the lowest
    cursor), so the placement is the same to the bit."""
    d = len(load)
    padded, cursor = [0] * d, [0] * d
    owner, start = [0] * len(sizes), [0] * len(sizes)
    one = _one_per_shard(sizes, costs, load)
    if one is not None:
        for i, r in enumerate(one):
            cursor[r] = sizes[i]
            load[r] += costs[i]
        return one, start, cursor
    shards = range(d)
    top = 0  # max(padded): while it plus an item's size is under the cap, every shard fits
    for i in sorted(range(len(sizes)), key=lambda i: -costs[i]):  # stable: ties in input order
        size = sizes[i]
        # the least-loaded fitting shard, ties to the lowest (min and index keep the first of equals);
        # if nothing fits under the cap, the shortest shard
        if cap is None or top + size <= cap:
            r = load.index(min(load))
        else:
            fits = [r for r in shards if padded[r] + size <= cap]
            r = min(fits, key=load.__getitem__) if fits else min(shards, key=cursor.__getitem__)
        at = padded[r]
        owner[i], start[i] = r, at
        cursor[r] = at + size
        padded[r] = _aligned(at + size)
        top = max(top, padded[r])
        load[r] += costs[i]
    return owner, start, cursor


def lpt_place(numel: np.ndarray, cost: np.ndarray, loads: np.ndarray,
              cap: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(shard, start within the shard, shard cursors) of every item, by greedy LPT (module
    docstring); ``loads`` (one per shard) is updated in place. ``cap`` None: no cap (every shard fits)."""
    n, d = len(numel), len(loads)
    if n <= d:  # perhaps one item per shard (_one_per_shard): no walk at all
        sizes_l = np.asarray(numel, dtype=np.int64).tolist()
        costs_l = np.asarray(cost, dtype=np.float64).tolist()
        load = loads.astype(np.float64).tolist()
        one = _one_per_shard(sizes_l, costs_l, load)
        if one is not None:
            cursor = np.zeros(d, dtype=np.int64)
            cursor[one] = sizes_l
            loads[one] += costs_l  # one addition per shard
            return np.array(one, dtype=np.int64), np.zeros(n, dtype=np.int64), cursor
    if n * d < BATCH_WORK:  # no run can be batched: the plain-list walk (same placement)
        load = loads.astype(np.float64).tolist()
        owner_l, start_l, cursor_l = lpt_place_small(np.asarray(numel, dtype=np.int64).tolist(),
                                                     np.asarray(cost, dtype=np.float64).tolist(), load, cap)
        loads[:] = load
        return (np.array(owner_l, dtype=np.int64), np.array(start_l, dtype=np.int64),
                np.array(cursor_l, dtype=np.int64))
    sizes = np.asarray(numel, dtype=np.int64)
    costs = np.asarray(cost, dtype=np.float64)
    order = np.argsort(-costs, kind="stable")
    owner = np.empty(n, dtype=np.int64)
    start = np.empty(n, dtype=np.int64)
    state = _Shards(loads, cap)
    batches = bool(n) and float(loads.max(initial=0.0)) + float(costs.sum()) < EXACT_LIMIT \
        and bool(np.all(costs == np.floor(costs))) and bool(np.all(costs > 0))
    s_o, c_o = sizes[order], costs[order]
    cuts = np.flatnonzero((s_o[1:] != s_o[:-1]) | (c_o[1:] != c_o[:-1])) + 1 if n else np.zeros(0, dtype=np.int64)
    bounds = [0, *cuts.tolist(), n] if n else [0]
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        idx = order[a:b]
        size, c = int(s_o[a]), float(c_o[a])
        done = 0
        if batches and (b - a) * d >= BATCH_WORK:
            shards, starts, done = state.place_run(b - a, size, int(c))
            owner[idx[:done]] = shards
            start[idx[:done]] = starts
        for i in idx[done:].tolist():
            owner[i], start[i] = state.place_one(size, c)
    loads[:] = state.load
    return owner, start, np.array(state.cursor, dtype=np.int64)
