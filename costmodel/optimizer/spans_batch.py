"""The layer-wise spans effects of every buffer of a plan, made in one pass (:func:`prepare_spans_effects`).

Internal to :mod:`costmodel.optimizer.plan`. What stepping a buffer's layer-wise spans adds to its
stage (per-rank sums, owners, buckets: :class:`stage_builder._SpansEffect`) is memoised per plan
on the buffer's per-item arrays, group size, bucket size and strategy (``Timer.spans_effects``).
Made buffer by buffer (:meth:`StageBuilder._spans_effect`), each effect pays a few dozen numpy
calls and a Python walk of the buffer's distinct tensors. Here the effects of every buffer of
every distinct stage of a plan are made before the stages are built, all at once: the Muon rows
of the buffers' distinct tensors are gathered into one table, one ``bincount`` sums every span of
every buffer (each bin adds the same items in the same order as the buffer's own
:meth:`_Role.span_sums`: the same floats), one ``maximum.reduceat`` gives every span's last
backprop position. The stages then find every effect in the memo
(:meth:`StageBuilder.layer_wise_current`) and add them in their own order, as before.
"""

from __future__ import annotations

import numpy as np

from costmodel.optimizer import layouts as lay
from costmodel.optimizer.buffers import _Buffer
from costmodel.optimizer.stage_builder import COLUMNS, StageBuilder, _SpansEffect
from workloads.comm import CollectiveCall

_Todo = tuple[tuple, _Buffer, np.ndarray, list[lay.BucketSpan], int]  # (memo key, buffer, Muon items, spans, ranks)


def _partition(spans: list[lay.BucketSpan], items: int) -> bool:
    """Whether ``spans`` cover ``items`` items in order, each with an owner per item (and owners
    >= 0, checked by :func:`prepare_spans_effects` for all buffers at once: what
    :meth:`StageBuilder._spans_effect` requires; otherwise the buffer is stepped span by span)."""
    if not spans or spans[0].first != 0 or spans[-1].stop != items:
        return False
    if any(a.stop != b.first for a, b in zip(spans[:-1], spans[1:], strict=True)):
        return False
    return all(span.owner is not None and len(span.owner) == span.stop - span.first for span in spans)


def _todo(builder: StageBuilder, stages: list[tuple[int, list[_Buffer]]], strategy: str) -> list[_Todo]:
    """The layer-wise buffers of ``stages`` whose effect is not memoised yet, with their layouts
    (the first of each memo key only; buffers whose spans are not a partition are left out)."""
    memo, grid = builder.timer.spans_effects, builder.grid
    todo: list[_Todo] = []
    keys: set[tuple] = set()
    for s, buffers in stages:
        for buf in buffers:
            sel = np.flatnonzero(buf.muon)
            if len(sel) == 0:
                continue
            gs, bucket_size = grid.size(buf.group), builder.bucket_size(buf.chunk, s)
            key = (id(buf.numel), len(sel), gs, bucket_size, strategy)  # StageBuilder.layer_wise_current's
            hit = memo.get(key)
            if key in keys or (hit is not None and hit[0] is buf.numel):
                continue
            spans = lay.layer_wise_layout(buf.numel[sel], buf.cost[sel], gs, bucket_size, strategy,
                                          isolate=buf.shared[sel])
            if _partition(spans, len(sel)):
                keys.add(key)
                todo.append((key, buf, sel, spans, gs))
    return todo


def _muon_rows(builder: StageBuilder, todo: list[_Todo]) -> tuple[np.ndarray, list[int],
                                                                  list[list[tuple[CollectiveCall, ...]]]]:
    """(rows of :data:`COLUMNS` of the buffers' distinct tensors, each buffer's first row in it,
    each buffer's TP calls per distinct tensor): :meth:`StageBuilder._per_tensor`'s values (Muon
    tensors' rows; a non-Muon tensor's row is never read here: zeros, no calls)."""
    rows: list[np.ndarray] = []
    firsts: list[int] = []
    calls: list[list[tuple[CollectiveCall, ...]]] = []
    zero = np.zeros(len(COLUMNS))
    for _, buf, _, _, _ in todo:
        muon = np.zeros(len(buf.unique), dtype=bool)
        muon[buf.tid] = buf.muon
        firsts.append(len(rows))
        own: list[tuple[CollectiveCall, ...]] = []
        for t, m in zip(buf.unique, muon.tolist(), strict=True):
            if m:
                row, c = builder.muon_item(t)
                rows.append(row)
                own.append(c)
            else:
                rows.append(zero)
                own.append(())
        calls.append(own)
    return np.array(rows, dtype=np.float64).reshape(len(rows), len(COLUMNS)), firsts, calls


def prepare_spans_effects(builder: StageBuilder, stages: list[tuple[int, list[_Buffer]]], strategy: str) -> None:
    """Memoise (``builder.timer.spans_effects``) the layer-wise spans effect of every buffer of
    ``stages`` ((stage, its buffers) of a plan) not memoised yet, all in one pass; ``builder``
    (any StageBuilder of the plan) gives the bucket sizes and the distinct tensors' rows."""
    todo = _todo(builder, stages, strategy)
    if not todo:
        return
    table, firsts, calls = _muon_rows(builder, todo)
    ncol = len(COLUMNS)
    owners: list[np.ndarray] = []
    lengths: list[int] = []
    span_base: list[int] = []  # per span: its first bin (in ranks) in the plan's bincount
    item_first: list[int] = []  # per span: its first item in the concatenated items
    row_of, positions = [], []
    bins = items = 0
    for (_, buf, sel, spans, gs), first in zip(todo, firsts, strict=True):
        row_of.append(buf.tid[sel] + first)
        positions.append(buf.position[sel])
        for j, span in enumerate(spans):
            assert span.owner is not None  # _partition
            owners.append(span.owner)
            lengths.append(span.stop - span.first)
            span_base.append(bins + j * gs)
            item_first.append(items + span.first)
        bins += len(spans) * gs
        items += len(sel)
    owner = np.concatenate(owners)
    if bool((owner < 0).any()):  # never for layer-wise layouts; else every stage goes buffer by buffer
        return
    span_of = np.repeat(np.arange(len(lengths)), lengths)
    index = ((np.array(span_base, dtype=np.int64)[span_of] + owner)[:, None] * ncol + np.arange(ncol)).ravel()
    sums = np.bincount(index, weights=table[np.concatenate(row_of)].ravel(), minlength=bins * ncol)
    readies = np.maximum.reduceat(np.concatenate(positions), item_first).tolist()
    at = spans_at = items = 0
    for (key, buf, sel, spans, gs), own_calls in zip(todo, calls, strict=True):
        n, size = len(spans), len(spans) * gs * ncol
        block = sums[at:at + size]
        effect_sums = block.reshape(gs, ncol).T if n == 1 else block.reshape(n, gs, ncol).transpose(0, 2, 1)
        buckets = [(span.numel, span.used, ready)
                   for span, ready in zip(spans, readies[spans_at:spans_at + n], strict=True)]
        effect = _SpansEffect(effect_sums, sel, owner[items:items + len(sel)], own_calls, buckets)
        builder.timer.spans_effects[key] = (buf.numel, effect)
        at, spans_at, items = at + size, spans_at + n, items + len(sel)
