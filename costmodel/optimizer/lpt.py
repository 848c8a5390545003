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
``load_r = c·q_r + ρ_r`` a slot is ``(level q_r + j, ρ_r, r)``: the slots are taken in (level, ρ,
shard) order, level after level (between two consecutive ``q_r`` or ``q_r + m_r`` the same shards
offer a slot at every level, so whole stretches of levels are one repeated shard order). The
arithmetic is exact in integers; the batches are used only while every load stays below 2⁵³, where
the scalar walk's float additions are exact too, so both give the same placement to the bit.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

PARAM_ALIGN = 64  # elements: parameter starts in distributed-optimizer buffers
BATCH_WORK = 4096  # below n·d = this (n items, d shards): the plain-list walk (runs dealt round robin where it can)
BATCH_RUN = 64  # a run of k identical items goes in one step when k reaches this ...
BATCH_SHARDS = 1  # ... and k·BATCH_SHARDS reaches d (a step costs O(d) Python work, a single placement O(log d))
RUN_ARRAYS = 64  # a batched run of this many items or more is laid out with numpy, a shorter one on lists
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

    def seed_one_per_shard(self, sizes: list[int], costs: list[float]) -> int:
        """Place the first ``d`` items of the cost order (``sizes``, ``costs``) one per shard, item k
        on shard k at start 0, when :func:`_one_per_shard` proves the greedy does (a greedy placement
        does not depend on the items after it); returns how many items that is (``d``, else 0)."""
        one = _one_per_shard(sizes, costs, self.load)
        if one is None or one != list(range(self.d)):
            return 0
        for r in range(self.d):
            self.cursor[r] = sizes[r]
            self.padded[r] = _aligned(sizes[r])
            self.load[r] += costs[r]
        self.heap = [(x, r) for r, x in enumerate(self.load)]
        heapq.heapify(self.heap)
        return self.d

    def place_one(self, size: int, cost: float) -> tuple[int, int]:
        """(shard, start) of one item: the least-loaded shard it fits on, else the lowest cursor."""
        heap, cap, padded, load = self.heap, self.cap, self.padded, self.load
        while heap[0][0] != load[heap[0][1]]:  # stale entries dropped
            heapq.heappop(heap)
        if cap is None or padded[heap[0][1]] + size <= cap:  # the least-loaded shard fits: it is the pick
            return self._put(heapq.heappop(heap)[1], size, cost)
        if min(padded) + size > cap:  # fits nowhere: the shortest shard, heap untouched
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
        cap (all of them without a cap), in placement order, and how many that is.

        Shard ``r`` offers the slots ``(level q_r + j, ρ_r, r)`` for ``j`` below its room ``m_r``
        (``load_r = c·q_r + ρ_r``); the slots are taken in that order. Between two consecutive
        values of the ``q_r`` and ``q_r + m_r`` the shards offering a slot at every level are the
        same, so the order is a few segments of one fixed shard order (by ρ, then shard) repeated:
        a few numpy operations per segment."""
        d, step = self.d, _aligned(size)
        padded = self.padded
        load = [int(x) for x in self.load]
        if self.cap is None:
            room = [k] * d
        else:
            top = math.floor(self.cap) - size
            room = [min(k, (top - p) // max(step, 1) + 1 if step else k) if top - p >= 0 else 0 for p in padded]
        fit = min(k, sum(room))
        if fit == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), 0
        split = [divmod(x, cost) for x in load]
        ranked = sorted((r for r in range(d) if room[r] > 0), key=lambda r: (split[r][1], r))  # by (ρ, shard)
        bounds = sorted({split[r][0] for r in ranked} | {split[r][0] + room[r] for r in ranked})
        # the item of stretch level lo + t on shard r is its (lo + t - q_r)-th: start padded_r + that·step
        segments: list[tuple[list[int], int, int, int]] = []  # (shard order, first level, levels, items)
        left = fit
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=False):  # levels lo..hi-1 offer the same shards
            active = [r for r in ranked if split[r][0] <= lo < split[r][0] + room[r]]
            if not active:
                continue
            reps = min(hi - lo, left // len(active))
            part = reps + 1 if reps < hi - lo and left > reps * len(active) else reps  # + the last, partial level
            take = min(left, part * len(active))
            segments.append((active, lo, part, take))
            left -= take
            if left == 0:
                break
        if fit < RUN_ARRAYS:  # few items: plain lists
            seq_l: list[int] = []
            for active, _, part, take in segments:
                seq_l += (active * part)[:take]
            nxt = list(padded)
            starts_l = []
            for r in seq_l:
                starts_l.append(nxt[r])
                nxt[r] += step
            taken = [0] * d
            for r in seq_l:
                taken[r] += 1
            seq, starts = np.array(seq_l, dtype=np.int64), np.array(starts_l, dtype=np.int64)
        else:  # the item of level lo + t on shard r is its (lo + t - q_r)-th: start padded_r + that·step
            shard_parts, start_parts = [], []
            for active, lo, part, take in segments:
                first = np.array([padded[r] + (lo - split[r][0]) * step for r in active], dtype=np.int64)
                levels = np.arange(part, dtype=np.int64)[:, None] * step + first[None, :]
                shard_parts.append(np.tile(np.array(active, dtype=np.int64), part)[:take])
                start_parts.append(levels.ravel()[:take])
            seq, starts = np.concatenate(shard_parts), np.concatenate(start_parts)
            taken = np.bincount(seq, minlength=d).tolist()
        # only the shards that took items change; each gets a heap entry with its new load (the old
        # one is stale: the costs are > 0 here, so loads only grow), as _put does
        cursor, loads, heap = self.cursor, self.load, self.heap
        for r in range(d):
            t = taken[r]
            if t:
                cursor[r] = padded[r] + (t - 1) * step + size
                padded[r] += t * step
                loads[r] = float(load[r] + t * cost)
                heapq.heappush(heap, (loads[r], r))
        return seq, starts, fit


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
    order = sorted(range(len(sizes)), key=lambda i: -costs[i])  # stable: ties in input order
    j, n = 0, len(order)
    while j < n:
        size, c = sizes[order[j]], costs[order[j]]
        e = j + 1  # order[j:e]: a run of identical items
        while e < n and sizes[order[e]] == size and costs[order[e]] == c:
            e += 1
        if e - j >= d and _deal_run(order[j:e], size, c, load, padded, cursor, cap, owner, start):
            j = e
            continue
        for i in order[j:e]:
            # the least-loaded fitting shard, ties to the lowest (min and index keep the first of equals);
            # if nothing fits under the cap, the shortest shard
            r = load.index(min(load))
            if cap is not None and padded[r] + size > cap:  # the least loaded does not fit
                fits = [r for r in shards if padded[r] + size <= cap]
                r = min(fits, key=load.__getitem__) if fits else min(shards, key=cursor.__getitem__)
            at = padded[r]
            owner[i], start[i] = r, at
            cursor[r] = at + size
            padded[r] = _aligned(at + size)
            load[r] += c
        j = e
    return owner, start, cursor


def _deal_run(run: list[int], size: int, cost: float, load: list[float], padded: list[int], cursor: list[int],
              cap: float | None, owner: list[int], start: list[int]) -> bool:
    """Place a run of identical items (``run``: their positions, in cost order) as the walk of
    :func:`lpt_place_small` does, in one step, when it provably deals them round robin: every shard
    equally loaded, each round of ``d`` items raising the load (``level + cost > level``: the d
    shards then pass from one level to the next in shard order, the lowest of the least loaded
    first) and no item beyond the cap on its shard (the least-loaded shard is then always the pick).
    Item ``j`` goes on shard ``j mod d`` at its 64-aligned fill plus ``(j div d)`` aligned sizes;
    a shard taking ``m`` items ends at the load the walk's ``m`` additions give. Returns False
    (nothing placed) otherwise."""
    d, k = len(load), len(run)
    levels = [load[0]]
    if any(x != levels[0] for x in load):
        return False
    for _ in range(-(-k // d)):
        if not levels[-1] + cost > levels[-1]:
            return False
        levels.append(levels[-1] + cost)
    step = _aligned(size)  # fills are multiples of 64: each item moves its shard's fill by this
    taken = [k // d + (r < k % d) for r in range(d)]
    if cap is not None and any(m and padded[r] + (m - 1) * step + size > cap for r, m in enumerate(taken)):
        return False
    for r in range(d):
        at = padded[r]
        for i in run[r::d]:
            owner[i], start[i] = r, at
            at += step
        if taken[r]:
            cursor[r] = at - step + size
            padded[r] = at
            load[r] = levels[taken[r]]
    return True


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
    if n * d < BATCH_WORK:  # the plain-list walk (same placement)
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
    head = state.seed_one_per_shard(s_o[:d].tolist(), c_o[:d].tolist()) if n > d > 1 else 0
    if head:  # the first d items of the cost order, one per shard in that order (_one_per_shard)
        owner[order[:head]] = np.arange(head)
        start[order[:head]] = 0
    cuts = np.flatnonzero((s_o[head + 1:] != s_o[head:-1]) | (c_o[head + 1:] != c_o[head:-1])) + head + 1
    bounds = [head, *cuts.tolist(), n] if n > head else [head]
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        idx = order[a:b]
        size, c = int(s_o[a]), float(c_o[a])
        done = 0
        if batches and b - a >= BATCH_RUN and BATCH_SHARDS * (b - a) >= d:
            shards, starts, done = state.place_run(b - a, size, int(c))
            owner[idx[:done]] = shards
            start[idx[:done]] = starts
        for i in idx[done:].tolist():
            owner[i], start[i] = state.place_one(size, c)
    loads[:] = state.load
    return owner, start, np.array(state.cursor, dtype=np.int64)
