"""The per-rank fused-Adam values of element-wise buckets, made together (:func:`adam_rows`), and
the element-wise buckets of every buffer of a plan with their values, in one pass
(:func:`prepare_element_wise`).

Internal to :mod:`costmodel.optimizer`. Each rank's fused-Adam values on its equal shard of a
padded DDP bucket (parameter elements, shard pieces, multi-tensor chunks, launches, seconds) have
one implementation, :func:`adam_rows`: each bucket sits at its own offset of one address line (so
one ``searchsorted`` finds every shard boundary's parameter) and every value is the same integer
or elementwise float operation whatever the other buckets (a bucket alone is the line of that
one bucket). Megatron-FSDP's shards (:meth:`StageBuilder.adam_shards`: every buffer of a stage)
and a buffer's buckets not memoised (:meth:`StageBuilder.element_wise`) call it too. The
buckets of a buffer and their values are memoised per plan on the parameters' sizes,
shared-embedding flags, the group size, the bucket size and the Adam kernels
(``Timer.element_wise_spans``, :meth:`StageBuilder.element_wise`); :func:`prepare_element_wise`
lays out the buckets of every buffer of every distinct stage of a plan first and computes all
their values at once (instead of some forty numpy calls per bucket). The stages then find every
bucket memoised and add them in their own order.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from costmodel.optimizer import kernel_sequence as ks
from costmodel.optimizer import layouts as lay
from costmodel.optimizer.buffers import _Buffer
from costmodel.optimizer.timer import Timer
from workloads.comm import CollectiveCall


class _GroupSizes(Protocol):
    def size(self, group: str) -> int: ...


class BuilderView(Protocol):
    """What :func:`adam_rows`, :func:`prepare_element_wise` and :mod:`spans_batch` read of a
    :class:`stage_builder.StageBuilder` (which calls them: a protocol, not an import)."""

    @property
    def grid(self) -> _GroupSizes: ...

    @property
    def timer(self) -> Timer: ...

    @property
    def adam(self) -> ks.AdamBytes: ...

    def bucket_size(self, chunk: int, stage: int | None = None) -> int | None: ...

    def per_tensor(self, buf: _Buffer) -> tuple[np.ndarray, list[tuple[CollectiveCall, ...]]]: ...

def element_wise_key(numel: np.ndarray, isolate: np.ndarray, gs: int, bucket_size: int | None,
                     piece_kernels: tuple) -> tuple:
    """The key of ``Timer.element_wise_spans`` (a selection's padded DDP buckets and per-rank Adam
    values): what they depend on, the items' sizes (elements) and shared-embedding flags, the group
    size, the bucket size (elements) and the Adam kernels; :meth:`StageBuilder.element_wise` and
    :func:`prepare_element_wise` both use it."""
    return numel.tobytes(), isolate.tobytes(), gs, bucket_size, piece_kernels


_Selection = tuple[tuple, np.ndarray, np.ndarray, int, "int | None"]
# (memo key, item sizes, shared-embedding flags, ranks, bucket size in elements)


def _todo(builder: BuilderView, stages: list[tuple[int, list[_Buffer]]], muon_apart: bool) -> list[_Selection]:
    """The element-wise selections of the buffers of ``stages`` whose buckets are not memoised
    yet (their non-Muon items if ``muon_apart``, else all; the first of each memo key only)."""
    memo, grid = builder.timer.element_wise_spans, builder.grid
    todo: list[_Selection] = []
    keys: set[tuple] = set()
    for s, buffers in stages:
        for buf in buffers:
            sel = buf.adam_items if muon_apart else buf.all_items
            if len(sel) == 0:
                continue
            gs, bucket_size = grid.size(buf.group), builder.bucket_size(buf.chunk, s)
            numel, isolate = buf.numel[sel], buf.shared[sel]
            key = element_wise_key(numel, isolate, gs, bucket_size, builder.adam.piece_kernels)
            if key in memo or key in keys:
                continue
            keys.add(key)
            todo.append((key, numel, isolate, gs, bucket_size))
    return todo


def memoise_element_wise(builder: BuilderView, selections: list[_Selection]) -> None:
    """Lay out the padded DDP buckets of each selection (memo key, item sizes, shared-embedding
    flags, ranks, bucket size) and memoise them (``builder.timer.element_wise_spans``) with their
    per-rank Adam values, made for all of them in one :func:`adam_rows` call."""
    laid = [(key, numel, lay.ddp_buckets(numel, gs, bucket_size, distributed_optimizer=True, isolate=isolate), gs)
            for key, numel, isolate, gs, bucket_size in selections]
    buckets = [(span, numel, gs) for _, numel, spans, gs in laid for span in spans]
    rows = adam_rows(builder, buckets) if buckets else np.zeros((8, 0))
    at = 0
    for key, _, spans, gs in laid:
        made = []
        for span in spans:
            made.append((span, rows[:, at:at + gs]))
            at += gs
        builder.timer.element_wise_spans[key] = made


def adam_rows(builder: BuilderView, buckets: list[tuple[lay.BucketSpan, np.ndarray, int]]) -> np.ndarray:
    """Per-rank values of :data:`stage_builder.ADAM_SHARD_COLUMNS` (parameter elements twice,
    shard pieces, multi-tensor chunks, norm pieces and chunks, launches, seconds) of fused Adam on
    each rank's equal shard of every bucket (span, its buffer's item sizes, ranks), side by side:
    8 × (ranks of all buckets), each bucket's ranks in order. A rank's pieces are the live
    parameters intersecting its shard; its elements those of the parameters (padding excluded)."""
    ranks = [gs for _, _, gs in buckets]
    starts, sizes, points, pieces_first, pieces_last = [], [], [], [], []
    offset = block = 0
    for span, numel, gs in buckets:
        size = numel[span.first:span.stop].astype(np.int64)
        start = span.starts.astype(np.int64)
        shard = span.numel // gs
        starts.append(start + offset)
        sizes.append(size)
        points.append(offset + np.arange(gs + 1, dtype=np.int64) * shard)  # the shard boundaries
        live = size > 0  # the shards each live parameter intersects
        s = start[live]
        pieces_first.append(block + s // shard)
        pieces_last.append(block + (s + size[live] - 1) // shard + 1)
        offset += span.numel
        block += gs + 1
    g_start, g_size, x = np.concatenate(starts), np.concatenate(sizes), np.concatenate(points)
    before = np.concatenate(([0], np.cumsum(g_size)))
    # parameter elements below each boundary (within a bucket, the same differences as the
    # bucket's own line), differenced within each bucket
    idx = np.searchsorted(g_start, x, side="right") - 1
    safe = np.maximum(idx, 0)
    covered = np.where(idx < 0, 0, before[safe] + np.minimum(x - g_start[safe], g_size[safe]))
    within = np.ones(len(x), dtype=bool)
    within[np.cumsum([gs + 1 for gs in ranks]) - 1] = False  # a bucket's last boundary starts no shard
    per_rank = (covered[1:] - covered[:-1])[within[:-1]].astype(np.float64)
    # pieces: +1 at each parameter's first shard, -1 after its last; every
    # bucket's block sums to zero, so one running sum restarts at each block
    n = block
    counts = np.bincount(np.concatenate(pieces_first), minlength=n) - np.bincount(np.concatenate(pieces_last), minlength=n)
    pieces = np.cumsum(counts)[within].astype(np.float64)
    chunks = ks.shard_chunks(pieces, per_rank)
    per_kernel = len(builder.adam.piece_kernels)
    piece_s = sum((builder.timer.floored_s(pieces, b * per_rank) for b in builder.adam.piece_kernels),
                  np.zeros(len(pieces)))
    return np.stack([per_rank, per_rank, pieces, chunks, pieces, chunks, per_kernel * pieces, piece_s])


def prepare_element_wise(builder: BuilderView, stages: list[tuple[int, list[_Buffer]]], muon_apart: bool) -> None:
    """Memoise (:func:`memoise_element_wise`) the element-wise buckets and Adam values of every
    buffer of ``stages`` ((stage, its buffers) of a plan) not memoised yet, all in one pass
    (``muon_apart``: the buffers' non-Muon items, as the current layer-wise layout steps them;
    else every item); ``builder`` (any StageBuilder of the plan) gives the bucket sizes and the timer."""
    memoise_element_wise(builder, _todo(builder, stages, muon_apart))
