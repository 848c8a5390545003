"""Buffer layouts: Megatron's DDP / distributed-optimizer buckets and the layer-wise assignments.

Pure functions over :class:`LayoutItem` (name, numel, Newton–Schulz cost), given in **backprop
order** (reverse of definition order), as Megatron lays out its buffers (§3, §4.1 of the spec):

* :func:`ddp_buckets` — DDP buckets. With the distributed optimizer every parameter starts on a
  64-element boundary and every bucket end is padded to a multiple of lcm(dp, 128); without it
  (plain DDP, legacy layer-wise) nothing is padded. A bucket closes once it holds ``bucket_size``
  elements.
* :func:`assign_whole_params` — legacy layer-wise ownership of whole parameters: ``none``
  (round-robin in the given order), ``ping_pong`` (stable sort ascending by numel, owners
  0,1,…,d−1,d−1,…,0,0,1,…) or ``lpt`` (descending cost, least-loaded rank).
* :func:`layer_wise_buckets` — the current per-buffer layout (``_compute_per_buffer_param_layout``):
  chunking rule (:func:`close_chunk_before`, our reconstruction of Megatron's closure), per-chunk assignment (LPT by max·min² with the 1.3× cap and persistent loads),
  64-aligned starts, shard padding to lcm(64, lcm(d,128)/d), no parameter crossing a shard.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

LoadBalance = Literal["none", "ping_pong", "lpt"]
PARAM_ALIGN = 64  # elements: parameter starts in distributed-optimizer buffers
LPT_CAP = 1.3  # a shard may grow to 1.3 × the chunk's mean shard size before it stops being a candidate


@dataclass(frozen=True)
class LayoutItem:
    """A parameter as a layout sees it: elements and Newton–Schulz cost (max·min², or numel)."""

    name: str
    numel: int
    cost: int


@dataclass(frozen=True)
class Slot:
    """Where a parameter lives in its bucket: ``start`` is relative to the bucket start."""

    name: str
    start: int
    numel: int
    owner: int | None = None  # dp rank that steps it (layer-wise), None = sharded element-wise

    @property
    def end(self) -> int:
        """One past the last element (bucket-relative)."""
        return self.start + self.numel


@dataclass(frozen=True)
class BucketLayout:
    """One bucket: ``numel`` padded elements at ``offset`` in its buffer, split into ``dp`` shards."""

    index: int
    offset: int
    numel: int
    dp: int
    slots: tuple[Slot, ...]

    @property
    def shard_numel(self) -> int:
        """Elements of one rank's equal shard."""
        return self.numel // self.dp

    @property
    def used_numel(self) -> int:
        """Parameter elements (padding excluded)."""
        return sum(s.numel for s in self.slots)

    def shard_range(self, rank: int) -> tuple[int, int]:
        """[start, end) of ``rank``'s equal shard, relative to the bucket start."""
        return rank * self.shard_numel, (rank + 1) * self.shard_numel

    def owned_slots(self, rank: int) -> list[Slot]:
        """Slots whose whole parameter ``rank`` owns."""
        return [s for s in self.slots if s.owner == rank]


def round_up(value: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is ≥ ``value``."""
    return -(-value // multiple) * multiple


def default_bucket_size(dp: int) -> int:
    """Megatron's default bucket size in elements: max(40e6, 1e6·dp)."""
    return max(40_000_000, 1_000_000 * dp)


def ddp_buckets(items: Sequence[LayoutItem], dp: int, bucket_size: int,
                distributed_optimizer: bool) -> list[BucketLayout]:
    """DDP buckets over ``items`` (backprop order); see the module docstring for the padding."""
    align = PARAM_ALIGN if distributed_optimizer else 1
    end_pad = math.lcm(dp, 128) if distributed_optimizer else 1
    buckets: list[BucketLayout] = []
    slots: list[Slot] = []
    offset = cursor = 0  # cursor is relative to the bucket start

    def close() -> None:
        nonlocal offset, cursor, slots
        numel = round_up(cursor, end_pad)
        buckets.append(BucketLayout(len(buckets), offset, numel, dp, tuple(slots)))
        offset += numel
        cursor, slots = 0, []

    for item in items:
        start = round_up(cursor, align)
        slots.append(Slot(item.name, start, item.numel))
        cursor = start + item.numel
        if cursor >= bucket_size:
            close()
    if slots:
        close()
    return buckets


def ping_pong_rank(index: int, d: int) -> int:
    """Owner of the ``index``-th item in ping-pong order 0,1,…,d−1,d−1,…,0,0,1,…"""
    cycle, pos = divmod(index, d)
    return pos if cycle % 2 == 0 else d - 1 - pos


def assign_whole_params(items: Sequence[LayoutItem], d: int, strategy: LoadBalance) -> dict[str, int]:
    """Owner rank of every item (legacy layer-wise: whole parameters, no buffer constraint)."""
    if strategy == "none":
        return {it.name: i % d for i, it in enumerate(items)}
    if strategy == "ping_pong":
        ordered = sorted(items, key=lambda it: it.numel)  # stable: ties keep the given order
        return {it.name: ping_pong_rank(i, d) for i, it in enumerate(ordered)}
    if strategy == "lpt":
        loads = [0] * d
        out: dict[str, int] = {}
        for it in sorted(items, key=lambda it: -it.cost):
            rank = min(range(d), key=lambda r: (loads[r], r))
            out[it.name] = rank
            loads[rank] += it.cost
        return out
    raise ValueError(f"unknown load balance '{strategy}'")


@dataclass
class _Shards:
    """Mutable per-chunk placement state (cursors in elements, loads persist across chunks)."""

    d: int
    loads: list[int]
    cursors: list[int]
    placed: list[list[tuple[LayoutItem, int]]]

    @classmethod
    def fresh(cls, d: int, loads: list[int]) -> _Shards:
        return cls(d, loads, [0] * d, [[] for _ in range(d)])

    def place(self, item: LayoutItem, rank: int) -> None:
        start = round_up(self.cursors[rank], PARAM_ALIGN)
        self.placed[rank].append((item, start))
        self.cursors[rank] = start + item.numel
        self.loads[rank] += item.cost


def shard_pad_multiple(d: int) -> int:
    """Shard sizes are multiples of lcm(64, lcm(d,128)/d), so buckets are multiples of lcm(d,128)."""
    return math.lcm(PARAM_ALIGN, math.lcm(d, 128) // d)


def _assign_chunk(chunk: Sequence[LayoutItem], d: int, loads: list[int], strategy: LoadBalance) -> _Shards:
    """Place one chunk's items on the d shards with ``strategy`` (``loads`` updated in place)."""
    state = _Shards.fresh(d, loads)
    if strategy == "none":
        for i, it in enumerate(chunk):
            state.place(it, i % d)
    elif strategy == "ping_pong":
        for i, it in enumerate(sorted(chunk, key=lambda it: it.numel)):
            state.place(it, ping_pong_rank(i, d))
    elif strategy == "lpt":
        cap = LPT_CAP * sum(it.numel for it in chunk) / d
        for it in sorted(chunk, key=lambda it: -it.cost):
            fits = [r for r in range(d) if round_up(state.cursors[r], PARAM_ALIGN) + it.numel <= cap]
            if fits:
                rank = min(fits, key=lambda r: (state.loads[r], r))
            else:
                rank = min(range(d), key=lambda r: (state.cursors[r], r))
            state.place(it, rank)
    else:
        raise ValueError(f"unknown load balance '{strategy}'")
    return state


def _padded_shard(state: _Shards) -> int:
    return round_up(max(max(state.cursors), 1), shard_pad_multiple(state.d))


def close_chunk_before(chunk_numel: int, chunk_largest: int, numel: int, d: int, bucket_size: int) -> bool:
    """Whether a non-empty chunk closes before a parameter of ``numel`` elements (Megatron's rule).

    Our reconstruction of ``LayerWiseDistributedOptimizer._compute_per_buffer_param_layout`` (issue 13
    item 5; Megatron-Core 0.18's source is not available, 0.16.x has no such layout): the chunk
    (``chunk_numel`` elements, largest parameter ``chunk_largest`` — the largest **in the chunk**) closes once it holds at least
    ``max(bucket_size, floor(0.9·d·chunk_largest))`` elements and the parameter cannot be absorbed.
    Absorption is Megatron's element-count estimate, not a replay of the assignment: estimated shard
    ``S = round_up(max(ceil(C/d), M), shard_pad_multiple(d))``; absorbable iff ``numel <= d·S − C``
    and ``numel <= S``.
    """
    if chunk_numel < max(bucket_size, int(0.9 * d * chunk_largest)):
        return False
    shard = round_up(max(-(-chunk_numel // d), chunk_largest), shard_pad_multiple(d))
    return not (numel <= d * shard - chunk_numel and numel <= shard)


def layer_wise_buckets(items: Sequence[LayoutItem], d: int, bucket_size: int,
                       strategy: LoadBalance = "lpt") -> list[BucketLayout]:
    """The current layer-wise layout of one buffer: whole parameters per shard (§4.1).

    Items are walked in backprop order into chunks (closed by :func:`close_chunk_before`); each
    chunk becomes one bucket of d equal, padded shards (assignment with loads persisting across chunks).
    """
    if not items:
        return []
    chunks: list[list[LayoutItem]] = [[]]
    for it in items:
        cur = chunks[-1]
        if cur and close_chunk_before(sum(c.numel for c in cur), max(c.numel for c in cur), it.numel, d, bucket_size):
            chunks.append([])
        chunks[-1].append(it)
    return _build_buckets(chunks, d, strategy)


def _build_buckets(chunks: list[list[LayoutItem]], d: int, strategy: LoadBalance) -> list[BucketLayout]:
    """Replay the chunk assignments (loads persist across chunks) and pad every shard."""
    loads = [0] * d
    buckets: list[BucketLayout] = []
    offset = 0
    for chunk in chunks:
        state = _assign_chunk(chunk, d, loads, strategy)
        shard = _padded_shard(state)
        slots = [Slot(it.name, r * shard + start, it.numel, owner=r)
                 for r in range(d) for it, start in state.placed[r]]
        buckets.append(BucketLayout(len(buckets), offset, shard * d, d, tuple(slots)))
        offset += shard * d
    return buckets


def padding_overhead(buckets: Sequence[BucketLayout]) -> float:
    """Padded elements over parameter elements, minus one (0.0 = no padding)."""
    used = sum(b.used_numel for b in buckets)
    total = sum(b.numel for b in buckets)
    return total / used - 1 if used else 0.0


def with_owners(bucket: BucketLayout, owners: dict[str, int]) -> BucketLayout:
    """The same bucket with whole-parameter owners filled in (legacy layer-wise)."""
    slots = tuple(Slot(s.name, s.start, s.numel, owners[s.name]) for s in bucket.slots)
    return BucketLayout(bucket.index, bucket.offset, bucket.numel, bucket.dp, slots)
