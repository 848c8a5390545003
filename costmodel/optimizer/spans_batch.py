"""The layer-wise spans effects of buffers, made together (:func:`spans_effects`), and of every
buffer of a plan in one pass (:func:`prepare_spans_effects`).

Internal to :mod:`costmodel.optimizer`. What stepping a buffer's layer-wise spans adds to its
stage (per-rank sums, owners, buckets: :class:`_SpansEffect`) is memoised per plan on the
buffer's per-item arrays, group size, bucket size and strategy (``Timer.spans_effects``).
:func:`spans_effects` is its one implementation: the Muon rows of the buffers' distinct tensors
are gathered into one table, one ``bincount`` sums every span of every buffer (each bin adds its
span's items in order, by owner: what one :meth:`_Role.add_owned` per span adds), one
``maximum.reduceat`` gives every span's last backprop position. A stage meeting a buffer whose
effect is not memoised asks for that one buffer (:func:`memoise_spans_effects`);
:func:`prepare_spans_effects` asks for every buffer of every distinct stage of a plan before the
stages are built (one pass instead of a few dozen numpy calls per buffer). The stages then find
every effect in the memo (:meth:`StageBuilder.layer_wise_current`) and add them in their own
order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodel.optimizer import layouts as lay
from costmodel.optimizer.buffers import _Buffer
from costmodel.optimizer.ew_batch import BuilderView
from costmodel.optimizer.plan_types import COLUMNS
from workloads.comm import CollectiveCall

_Item = tuple[_Buffer, np.ndarray, list[lay.BucketSpan], int]  # (buffer, its Muon items, their spans, ranks)


@dataclass(frozen=True, eq=False)
class _SpansEffect:
    """What stepping a buffer's layer-wise spans adds to a stage (:meth:`StageBuilder.layer_wise_current`):
    the same for every buffer of a plan with the same per-item arrays, group size, bucket size and
    strategy (the equal chunks of a plan's stages), whose parameter names alone differ."""

    sums: np.ndarray  # per-rank sums of COLUMNS: columns x ranks (one span), spans x columns x ranks
    picked: np.ndarray  # the Muon items stepped (positions in the buffer)
    owners: np.ndarray  # their owners
    calls: list[tuple[CollectiveCall, ...]]  # TP calls per distinct tensor of the buffer
    buckets: list[tuple[int, int, int]]  # per span: (padded numel, used numel, last backprop position)


def partition(spans: list[lay.BucketSpan], items: int) -> bool:
    """Whether ``spans`` cover ``items`` items in order, each with an owner per item (owners >= 0
    are checked by :func:`spans_effects`): what a spans effect requires; otherwise the buffer is
    stepped span by span (:meth:`StageBuilder.layer_wise_current`)."""
    if not spans or spans[0].first != 0 or spans[-1].stop != items:
        return False
    if any(a.stop != b.first for a, b in zip(spans[:-1], spans[1:], strict=True)):
        return False
    return all(span.owner is not None and len(span.owner) == span.stop - span.first for span in spans)


def spans_key(buf: _Buffer, sel: np.ndarray, gs: int, bucket_size: int | None, strategy: str) -> tuple:
    """The key of ``Timer.spans_effects`` (a buffer's layer-wise spans effect; the entry holds
    ``buf.numel``, so the id is not reused): the per-item arrays by identity (equal chunks of a plan
    share them), the Muon items stepped, the group size, the bucket size (elements) and the strategy;
    :meth:`StageBuilder.layer_wise_current` and :func:`prepare_spans_effects` both use it."""
    return id(buf.numel), len(sel), gs, bucket_size, strategy


_Request = tuple[tuple, _Buffer, np.ndarray, int, "int | None"]  # (memo key, buffer, Muon items, ranks, bucket size)


def _todo(builder: BuilderView, stages: list[tuple[int, list[_Buffer]]], strategy: str) -> list[_Request]:
    """The layer-wise buffers of ``stages`` whose effect is not memoised yet (the first of each
    memo key only)."""
    memo, grid = builder.timer.spans_effects, builder.grid
    todo: list[_Request] = []
    keys: set[tuple] = set()
    for s, buffers in stages:
        for buf in buffers:
            sel = buf.muon_items
            if len(sel) == 0:
                continue
            gs, bucket_size = grid.size(buf.group), builder.bucket_size(buf.chunk, s)
            key = spans_key(buf, sel, gs, bucket_size, strategy)
            hit = memo.get(key)
            if key in keys or (hit is not None and hit[0] is buf.numel):
                continue
            keys.add(key)
            todo.append((key, buf, sel, gs, bucket_size))
    return todo


def _tensor_rows(builder: BuilderView, items: list[_Item], ncol: int) -> tuple[np.ndarray, list[int],
                                                                              list[list[tuple[CollectiveCall, ...]]]]:
    """(rows of ``ncol`` columns (:data:`COLUMNS`) of the buffers' distinct tensors, each buffer's
    first row in it, each buffer's TP calls per distinct tensor): :meth:`StageBuilder.per_tensor` of
    each buffer, stacked (only the Muon tensors' rows are read here)."""
    tables: list[np.ndarray] = []
    firsts: list[int] = []
    calls: list[list[tuple[CollectiveCall, ...]]] = []
    at = 0
    for buf, _, _, _ in items:
        per, own = builder.per_tensor(buf)
        firsts.append(at)
        at += len(per)
        tables.append(per)
        calls.append(own)
    return (np.concatenate(tables) if tables else np.zeros((0, ncol))), firsts, calls


def spans_effects(builder: BuilderView, items: list[_Item]) -> list[_SpansEffect] | None:
    """The :class:`_SpansEffect` of each item (buffer, its Muon items ``sel``, their layer-wise spans,
    which must be a :func:`partition` of ``sel``, the group's ranks): every span's items stepped whole
    by their owners (per-rank sums of their rows, in item order per span), made for all items in one
    pass; None when an owner is < 0 (never for layer-wise layouts: the buffers are then stepped span
    by span). ``builder`` (any StageBuilder of the plan) gives the Muon tensors' rows."""
    ncol = len(COLUMNS)
    table, firsts, calls = _tensor_rows(builder, items, ncol)
    owners: list[np.ndarray] = []
    lengths: list[int] = []
    span_base: list[int] = []  # per span: its first bin (in ranks) in the bincount
    item_first: list[int] = []  # per span: its first item in the concatenated items
    row_of, positions = [], []
    bins = at = 0
    for (buf, sel, spans, gs), first in zip(items, firsts, strict=True):
        row_of.append(buf.tid[sel] + first)
        positions.append(buf.position[sel])
        for j, span in enumerate(spans):
            assert span.owner is not None  # partition
            owners.append(span.owner)
            lengths.append(span.stop - span.first)
            span_base.append(bins + j * gs)
            item_first.append(at + span.first)
        bins += len(spans) * gs
        at += len(sel)
    owner = np.concatenate(owners)
    if bool((owner < 0).any()):
        return None
    span_of = np.repeat(np.arange(len(lengths)), lengths)
    index = ((np.array(span_base, dtype=np.int64)[span_of] + owner)[:, None] * ncol + np.arange(ncol)).ravel()
    sums = np.bincount(index, weights=table[np.concatenate(row_of)].ravel(), minlength=bins * ncol)
    readies = np.maximum.reduceat(np.concatenate(positions), item_first).tolist()
    out: list[_SpansEffect] = []
    at = spans_at = first_item = 0
    for (_, sel, spans, gs), own_calls in zip(items, calls, strict=True):
        n, size = len(spans), len(spans) * gs * ncol
        block = sums[at:at + size]
        effect_sums = block.reshape(gs, ncol).T if n == 1 else block.reshape(n, gs, ncol).transpose(0, 2, 1)
        buckets = [(span.numel, span.used, ready)
                   for span, ready in zip(spans, readies[spans_at:spans_at + n], strict=True)]
        out.append(_SpansEffect(effect_sums, sel, owner[first_item:first_item + len(sel)], own_calls, buckets))
        at, spans_at, first_item = at + size, spans_at + n, first_item + len(sel)
    return out


def memoise_spans_effects(builder: BuilderView, requests: list[_Request], strategy: str) -> None:
    """Lay out each request's buffer (memo key, buffer, its Muon items, ranks, bucket size) under
    ``strategy`` and memoise (``builder.timer.spans_effects``) the effects of those whose spans are a
    :func:`partition` of their items, made in one :func:`spans_effects` call (none when an owner is
    < 0); a buffer left out is stepped span by span (:meth:`StageBuilder.layer_wise_current`)."""
    keys, items = [], []
    for key, buf, sel, gs, bucket_size in requests:
        spans = lay.layer_wise_layout(buf.numel[sel], buf.cost[sel], gs, bucket_size, strategy,
                                      isolate=buf.shared[sel])
        if partition(spans, len(sel)):
            keys.append(key)
            items.append((buf, sel, spans, gs))
    effects = spans_effects(builder, items) if items else None
    if effects is None:
        return
    for key, (buf, _, _, _), effect in zip(keys, items, effects, strict=True):
        builder.timer.spans_effects[key] = (buf.numel, effect)


def prepare_spans_effects(builder: BuilderView, stages: list[tuple[int, list[_Buffer]]], strategy: str) -> None:
    """Memoise (:func:`memoise_spans_effects`) the layer-wise spans effect of every buffer of
    ``stages`` ((stage, its buffers) of a plan) not memoised yet, all in one pass; ``builder``
    (any StageBuilder of the plan) gives the bucket sizes and the distinct tensors' rows."""
    memoise_spans_effects(builder, _todo(builder, stages, strategy), strategy)
