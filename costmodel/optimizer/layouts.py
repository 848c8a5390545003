"""Buffer layouts and ownership: Megatron's buckets and the layer-wise assignments (spec §3, §4.1).

Inputs are numpy arrays over the parameters of one buffer in **backprop order** (``numel`` in
elements of the local TP shard, ``cost`` = Megatron's NS cost proxy max·min², or numel for
non-2-D parameters). Outputs are bucket spans and owner arrays; nothing here knows about time.

* :func:`ddp_buckets`: DDP buckets. With the distributed optimizer every parameter starts on a
  64-element boundary and each bucket end is padded to a multiple of lcm(dp, 128); without it
  (plain DDP: legacy layer-wise, replicated) nothing is padded. A bucket closes once it holds
  ``bucket_size`` elements (``None`` = one bucket).
* :func:`shard_param_numel`: parameter elements (padding excluded) in each rank's equal shard of
  an element-wise bucket.
* :func:`whole_param_owner`: legacy layer-wise ownership of whole parameters: ``ping_pong``
  (stable ascending sort by numel, owners 0,1,…,d−1,d−1,…,0,0,1,…), ``lpt`` (descending cost,
  least-loaded rank) or ``none`` (layout order dealt round-robin: no balancing).
* :func:`layer_wise_buckets`: the current layout (``_compute_per_buffer_param_layout``): chunking,
  per-chunk assignment (LPT by cost with the 1.3× cap and loads persisting across chunks), 64-aligned
  starts, shard padding to lcm(64, lcm(d,128)/d); a parameter never crosses a shard boundary.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

PARAM_ALIGN = 64  # elements: parameter starts in distributed-optimizer buffers
LPT_CAP = 1.3  # a shard stops being an LPT candidate beyond 1.3 × the chunk's mean shard size
STRATEGIES = ("none", "ping_pong", "lpt")


def round_up(value: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is ≥ ``value``."""
    return -(-value // multiple) * multiple


def default_bucket_size(dp: int) -> int:
    """Megatron's default bucket size in elements: max(40e6, 1e6·dp)."""
    return max(40_000_000, 1_000_000 * dp)


@dataclass(frozen=True, eq=False)
class BucketSpan:
    """Parameters ``first:stop`` of a buffer form one bucket of ``numel`` padded elements.

    ``starts`` are the parameters' offsets relative to the bucket start; ``owner`` (layer-wise
    only) the dp rank stepping each parameter.
    """

    first: int
    stop: int
    numel: int
    used: int
    starts: np.ndarray
    owner: np.ndarray | None = None


def ddp_buckets(numel: np.ndarray, dp: int, bucket_size: int | None, distributed_optimizer: bool) -> list[BucketSpan]:
    """DDP buckets over ``numel`` (backprop order); see the module docstring for the padding."""
    align = PARAM_ALIGN if distributed_optimizer else 1
    end_pad = math.lcm(dp, 128) if distributed_optimizer else 1
    limit = bucket_size if bucket_size is not None else math.inf
    out: list[BucketSpan] = []
    first, cursor, starts = 0, 0, []
    sizes = numel.tolist()
    for i, n in enumerate(sizes):
        start = round_up(cursor, align)
        starts.append(start)
        cursor = start + n
        if cursor >= limit:
            out.append(BucketSpan(first, i + 1, round_up(cursor, end_pad), sum(sizes[first:i + 1]), np.array(starts)))
            first, cursor, starts = i + 1, 0, []
    if starts:
        out.append(BucketSpan(first, len(sizes), round_up(cursor, end_pad), sum(sizes[first:]), np.array(starts)))
    return out


def shard_param_numel(span: BucketSpan, numel: np.ndarray, dp: int) -> np.ndarray:
    """Parameter elements in each of the ``dp`` equal shards of an element-wise bucket."""
    sizes = numel[span.first:span.stop].astype(np.int64)
    starts = span.starts.astype(np.int64)
    before = np.concatenate(([0], np.cumsum(sizes)))

    def covered(x: np.ndarray) -> np.ndarray:  # parameter elements below offset x
        idx = np.searchsorted(starts, x, side="right") - 1
        safe = np.maximum(idx, 0)
        inside = np.minimum(x - starts[safe], sizes[safe])
        return np.where(idx < 0, 0, before[safe] + inside)

    bounds = np.arange(dp + 1, dtype=np.int64) * (span.numel // dp)
    return np.diff(covered(bounds))


def ping_pong_owner(count: int, d: int) -> np.ndarray:
    """Owner of the i-th item in ping-pong order 0,1,…,d−1,d−1,…,0,0,1,…"""
    cycle, pos = np.divmod(np.arange(count), d)
    return np.where(cycle % 2 == 0, pos, d - 1 - pos)


def round_robin_owner(count: int, d: int) -> np.ndarray:
    """No balancing: the ``count`` items in layout order dealt round-robin, 0, 1, ..., d-1, 0, 1, ..."""
    return np.arange(count, dtype=np.int64) % d


def lpt_owner(cost: np.ndarray, d: int, loads: np.ndarray | None = None) -> np.ndarray:
    """Greedy LPT: items by descending cost onto the least-loaded rank (ties: lowest rank)."""
    loads = np.zeros(d) if loads is None else loads
    owner = np.empty(len(cost), dtype=np.int64)
    for i in np.argsort(-cost, kind="stable"):
        r = int(np.argmin(loads))
        owner[i] = r
        loads[r] += cost[i]
    return owner


def whole_param_owner(numel: np.ndarray, cost: np.ndarray, d: int, strategy: str) -> np.ndarray:
    """Legacy layer-wise owner of each whole parameter (no buffer constraint)."""
    if strategy == "ping_pong":
        owner = np.empty(len(numel), dtype=np.int64)
        owner[np.argsort(numel, kind="stable")] = ping_pong_owner(len(numel), d)
        return owner
    if strategy == "lpt":
        return lpt_owner(cost.astype(np.float64), d)
    if strategy == "none":
        return round_robin_owner(len(numel), d)
    raise ValueError(f"unknown load balance {strategy!r}; valid: {', '.join(STRATEGIES)}")


def shard_pad_multiple(d: int) -> int:
    """Shard sizes are multiples of lcm(64, lcm(d,128)/d), so buckets are multiples of lcm(d,128)."""
    return math.lcm(PARAM_ALIGN, math.lcm(d, 128) // d)


def _aligned(x: np.ndarray | int) -> np.ndarray:
    return -(-np.asarray(x) // PARAM_ALIGN) * PARAM_ALIGN


def _assign_chunk(numel: np.ndarray, cost: np.ndarray, d: int, loads: np.ndarray,
                  strategy: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Place one chunk on d shards; returns (owner, start within shard, shard cursors); ``loads`` updated.

    Scalar walk over Python numbers (the same IEEE additions in the same order as an array walk:
    loads are accumulated item by item, ties go to the lowest rank).
    """
    n = len(numel)
    sizes: list[int] = numel.tolist()
    costs: list[float] = cost.astype(np.float64).tolist()
    load: list[float] = loads.astype(np.float64).tolist()
    owner = [0] * n
    start = [0] * n
    cursors = [0] * d
    if strategy == "lpt":
        order: list[int] = np.argsort(-cost, kind="stable").tolist()
        cap = LPT_CAP * float(numel.sum()) / d
        if d == 1:
            for i in order:
                at = -(-cursors[0] // PARAM_ALIGN) * PARAM_ALIGN
                start[i] = at
                cursors[0] = at + sizes[i]
                load[0] += costs[i]
        else:
            # least-loaded rank that fits under the cap (ties: lowest rank) from a heap of (load, rank):
            # the same choice as scanning every rank, in O(log d) per item while most ranks fit
            padded = [0] * d
            heap = [(load[k], k) for k in range(d)]
            heapq.heapify(heap)
            for i in order:
                size = sizes[i]
                skipped = []
                while heap and padded[heap[0][1]] + size > cap:
                    skipped.append(heapq.heappop(heap))
                if heap:
                    r = heapq.heappop(heap)[1]
                else:  # nothing fits under the cap: the shortest shard
                    r = min(range(d), key=cursors.__getitem__)
                    skipped = [e for e in skipped if e[1] != r]
                for e in skipped:
                    heapq.heappush(heap, e)
                at = padded[r]
                owner[i], start[i] = r, at
                cursors[r] = at + size
                padded[r] = -(-cursors[r] // PARAM_ALIGN) * PARAM_ALIGN
                load[r] += costs[i]
                heapq.heappush(heap, (load[r], r))
    else:
        if strategy == "ping_pong":
            order = np.argsort(numel, kind="stable").tolist()
            for i, r in zip(order, ping_pong_owner(n, d).tolist(), strict=True):
                owner[i] = r
        elif strategy == "none":
            order = list(range(n))
            owner = round_robin_owner(n, d).tolist()
        else:
            raise ValueError(f"unknown load balance {strategy!r}; valid: {', '.join(STRATEGIES)}")
        for i in order:
            r = owner[i]
            at = -(-cursors[r] // PARAM_ALIGN) * PARAM_ALIGN
            start[i] = at
            cursors[r] = at + sizes[i]
            load[r] += costs[i]
    loads[:] = load
    return np.array(owner, dtype=np.int64), np.array(start, dtype=np.int64), np.array(cursors, dtype=np.int64)


def _padded_shard(cursors: np.ndarray, d: int) -> int:
    return round_up(max(int(cursors.max()), 1), shard_pad_multiple(d))


def _absorbable(numel: np.ndarray, cost: np.ndarray, nxt: int, d: int, loads: np.ndarray, strategy: str) -> bool:
    """Whether a next parameter of ``nxt`` elements fits into the chunk's existing shard padding."""
    _, _, cursors = _assign_chunk(numel, cost, d, loads.copy(), strategy)
    return bool((_aligned(cursors) + nxt <= _padded_shard(cursors, d)).any())


_LAYER_WISE_MEMO: OrderedDict[tuple[bytes, bytes, int, int | None, str], list[BucketSpan]] = OrderedDict()
_LAYER_WISE_MEMO_SIZE = 512


def clear_memo() -> None:
    """Forget the memoised layer-wise layouts."""
    _LAYER_WISE_MEMO.clear()


def layer_wise_buckets(numel: np.ndarray, cost: np.ndarray, d: int, bucket_size: int | None,
                       strategy: str = "lpt") -> list[BucketSpan]:
    """The current layer-wise layout of one buffer (memoised on the buffer's contents: identical
    chunks of other stages and plans share it; the spans' arrays are read-only)."""
    numel = np.ascontiguousarray(numel, dtype=np.int64)
    cost = np.ascontiguousarray(cost, dtype=np.float64)
    key = (numel.tobytes(), cost.tobytes(), d, bucket_size, strategy)
    hit = _LAYER_WISE_MEMO.get(key)
    if hit is not None:
        _LAYER_WISE_MEMO.move_to_end(key)
        return list(hit)
    spans = _layer_wise_buckets(numel, cost, d, bucket_size, strategy)
    for span in spans:
        span.starts.setflags(write=False)
        if span.owner is not None:
            span.owner.setflags(write=False)
    _LAYER_WISE_MEMO[key] = spans
    if len(_LAYER_WISE_MEMO) > _LAYER_WISE_MEMO_SIZE:
        _LAYER_WISE_MEMO.popitem(last=False)
    return list(spans)


def _layer_wise_buckets(numel: np.ndarray, cost: np.ndarray, d: int, bucket_size: int | None,
                        strategy: str) -> list[BucketSpan]:
    """The current layer-wise layout of one buffer (§4.1): whole parameters per shard.

    Parameters are walked in backprop order into chunks; a chunk closes once it holds at least
    max(bucket_size, ⌊0.9·d·max numel⌋) elements and the next parameter cannot be absorbed into the
    chunk's shard padding. Each chunk becomes one bucket of d equal, padded shards; ``starts`` are
    bucket-relative offsets (owner·shard + start within the shard).
    """
    if len(numel) == 0:
        return []
    numel = numel.astype(np.int64)
    cost = cost.astype(np.float64)
    limit = math.inf if bucket_size is None else bucket_size
    threshold = max(limit, int(0.9 * d * int(numel.max())))
    loads = np.zeros(d)
    bounds = [0]
    acc = 0
    for i, n in enumerate(numel.tolist()):
        lo = bounds[-1]
        if i > lo and acc >= threshold and not _absorbable(numel[lo:i], cost[lo:i], n, d, loads, strategy):
            _assign_chunk(numel[lo:i], cost[lo:i], d, loads, strategy)  # commit the closed chunk's loads
            bounds.append(i)
            acc = 0
        acc += n
    bounds.append(len(numel))
    loads = np.zeros(d)
    out = []
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        owner, start, cursors = _assign_chunk(numel[lo:hi], cost[lo:hi], d, loads, strategy)
        shard = _padded_shard(cursors, d)
        out.append(BucketSpan(lo, hi, shard * d, int(numel[lo:hi].sum()), owner * shard + start, owner))
    return out
