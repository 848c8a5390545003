"""The element-wise buckets of every buffer of a plan and their Adam values, made in one pass
(:func:`prepare_element_wise`).

Internal to :mod:`costmodel.optimizer.plan`. The padded DDP buckets of a buffer's element-wise
parameters and each rank's fused-Adam values on its equal shard of each bucket
(:meth:`StageBuilder._adam_shard_rows`) are memoised per plan on the parameters' sizes,
shared-embedding flags, the group size, the bucket size and the Adam kernels
(``Timer.element_wise_spans``, :meth:`StageBuilder.element_wise`). Made bucket by bucket, each
bucket's values take some forty numpy calls on arrays of a few dozen elements. Here the buckets of
every buffer of every distinct stage of a plan are laid out first, then the values of all of them
are computed at once along one axis of (bucket, rank) pairs: each bucket sits at its own offset of
one address line (so one ``searchsorted`` finds every shard boundary's parameter), and every
value is the same integer or the same elementwise float operation as the bucket's own: the same
numbers. The stages then find every bucket memoised and add them in their own order, as before.
"""

from __future__ import annotations

import numpy as np

from costmodel.optimizer import kernel_sequence as ks
from costmodel.optimizer import layouts as lay
from costmodel.optimizer.buffers import _Buffer
from costmodel.optimizer.stage_builder import StageBuilder

_Todo = tuple[tuple, np.ndarray, list[lay.BucketSpan], int]  # (memo key, item sizes, buckets, ranks)


def _todo(builder: StageBuilder, stages: list[tuple[int, list[_Buffer]]], muon_apart: bool) -> list[_Todo]:
    """The element-wise selections of the buffers of ``stages`` whose buckets are not memoised
    yet (their non-Muon items if ``muon_apart``, else all), with their buckets (the first of each
    memo key only)."""
    memo, grid = builder.timer.element_wise_spans, builder.grid
    todo: list[_Todo] = []
    keys: set[tuple] = set()
    for s, buffers in stages:
        for buf in buffers:
            sel = np.flatnonzero(~buf.muon) if muon_apart else np.arange(len(buf.numel))
            if len(sel) == 0:
                continue
            gs, bucket_size = grid.size(buf.group), builder.bucket_size(buf.chunk, s)
            numel, isolate = buf.numel[sel], buf.shared[sel]
            key = (numel.tobytes(), isolate.tobytes(), gs, bucket_size, builder.adam.piece_kernels)  # element_wise's
            if key in memo or key in keys:
                continue
            keys.add(key)
            todo.append((key, numel, lay.ddp_buckets(numel, gs, bucket_size, distributed_optimizer=True,
                                                     isolate=isolate), gs))
    return todo


def _adam_rows(builder: StageBuilder, buckets: list[tuple[lay.BucketSpan, np.ndarray, int]]) -> np.ndarray:
    """:meth:`StageBuilder._adam_shard_rows` of every bucket (span, its buffer's item sizes, ranks),
    side by side: 8 × (ranks of all buckets), each bucket's ranks in order."""
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
        live = size > 0  # element_wise_shard_pieces: the shards each live parameter intersects
        s = start[live]
        pieces_first.append(block + s // shard)
        pieces_last.append(block + (s + size[live] - 1) // shard + 1)
        offset += span.numel
        block += gs + 1
    g_start, g_size, x = np.concatenate(starts), np.concatenate(sizes), np.concatenate(points)
    before = np.concatenate(([0], np.cumsum(g_size)))
    # shard_param_numel: parameter elements below each boundary (within a bucket, the same
    # differences as the bucket's own line), differenced within each bucket
    idx = np.searchsorted(g_start, x, side="right") - 1
    safe = np.maximum(idx, 0)
    covered = np.where(idx < 0, 0, before[safe] + np.minimum(x - g_start[safe], g_size[safe]))
    within = np.ones(len(x), dtype=bool)
    within[np.cumsum([gs + 1 for gs in ranks]) - 1] = False  # a bucket's last boundary starts no shard
    per_rank = (covered[1:] - covered[:-1])[within[:-1]].astype(np.float64)
    # element_wise_shard_pieces: +1 at each parameter's first shard, -1 after its last; every
    # bucket's block sums to zero, so one running sum restarts at each block
    n = block
    counts = np.bincount(np.concatenate(pieces_first), minlength=n) - np.bincount(np.concatenate(pieces_last), minlength=n)
    pieces = np.cumsum(counts)[within].astype(np.float64)
    chunks = ks.shard_chunks(pieces, per_rank)
    per_kernel = len(builder.adam.piece_kernels)
    piece_s = sum((builder.timer.floored_s(pieces, b * per_rank) for b in builder.adam.piece_kernels),
                  np.zeros(len(pieces)))
    return np.stack([per_rank, per_rank, pieces, chunks, pieces, chunks, per_kernel * pieces, piece_s])


def prepare_element_wise(builder: StageBuilder, stages: list[tuple[int, list[_Buffer]]], muon_apart: bool) -> None:
    """Memoise (``builder.timer.element_wise_spans``) the element-wise buckets and Adam values of
    every buffer of ``stages`` ((stage, its buffers) of a plan) not memoised yet, all in one pass
    (``muon_apart``: the buffers' non-Muon items, as the current layer-wise layout steps them;
    else every item); ``builder`` (any StageBuilder of the plan) gives the bucket sizes and the timer."""
    todo = _todo(builder, stages, muon_apart)
    buckets = [(span, numel, gs) for _, numel, spans, gs in todo for span in spans]
    if not buckets:
        return
    rows = _adam_rows(builder, buckets)
    at = 0
    for key, _, spans, gs in todo:
        made = []
        for span in spans:
            made.append((span, rows[:, at:at + gs]))
            at += gs
        builder.timer.element_wise_spans[key] = made
