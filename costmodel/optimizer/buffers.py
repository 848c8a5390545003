"""One model chunk's parameters as Megatron's gradient buffers, per distinct tensor.

Internal to :mod:`costmodel.optimizer.stage_builder`. A chunk's parameters are walked in backprop
order (the reverse of definition order) and split into buffers by data-parallel group (dense over
``dp`` = dp×cp, experts over ``expert_dp``) and, with ``fp8_param_gather``, by parameter dtype (as
Megatron keys its buffers by (param dtype, grad dtype)). An *item* is one parameter of a buffer (one
expert copy of an expert tensor).

The tensors come as the inventory's runs (:class:`workloads.inventory.TensorRun`): every layer of
a run holds the same tensors, so a buffer's per-item arrays are one layer's pattern tiled over the
layers, every item points at one of the buffer's few distinct tensors (``unique``, ``tid``), and
parameter names are listed only when asked for (:attr:`_Buffer.names`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from topologies.identity_memo import IdentityMemo
from workloads.flops import newton_schulz_cost_proxy
from workloads.inventory import TensorRun, TensorSpec

GROUPS = ("dp", "expert_dp")
Fp8Of = Callable[[TensorSpec, "int | None"], bool]  # (tensor, its layer) -> is an FP8 parameter


@dataclass(frozen=True)
class _Part:
    """Consecutive layers of one run (backprop order) contributing the same items to a buffer:
    per layer, ``pattern`` = (template index in the run, template, copies, position in the layer)."""

    run: TensorRun
    layers: tuple[int | None, ...]
    prefixes: tuple[str, ...]
    pattern: tuple[tuple[int, TensorSpec, int, int], ...]
    position: int  # chunk position of the first layer's first item
    per_layer: int  # items of one layer, all buffers of the chunk together


@dataclass(frozen=True, eq=False)
class _Buffer:
    """Parameters of one buffer (stage, chunk, dp group, dtype) in backprop order.

    Per item: ``numel`` (local elements), ``cost`` (Megatron's Newton-Schulz cost proxy, numel for
    non-matrices), ``muon``, ``position`` (index in the chunk's backprop order: bucket readiness),
    ``shared`` (Megatron's ``shared_embedding``) and ``tid`` (its tensor in ``unique``).
    """

    chunk: int
    group: str
    numel: np.ndarray
    cost: np.ndarray
    muon: np.ndarray
    position: np.ndarray
    unique: tuple[TensorSpec, ...] = ()
    tid: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    shared: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    fp8: bool = False  # FP8 parameters (fp8_param_gather): their own buffer, param dtype uint8
    parts: tuple[_Part, ...] = field(default=(), repr=False)

    @cached_property
    def names(self) -> list[str]:
        """Parameter name of every item (expert copies numbered as Megatron's local experts)."""
        out: list[str] = []
        for part in self.parts:
            suffixes = part.run.suffixes
            for prefix in part.prefixes:
                for j, t, copies, _ in part.pattern:
                    name = prefix + suffixes[j]
                    out += [f"{name}{k}" for k in reversed(range(copies))] if t.num_experts > 1 else [name] * copies
        return out

    @cached_property
    def muon_items(self) -> np.ndarray:
        """Positions of the Muon items (read-only; a plan's passes and stages all select them)."""
        return _read_only(np.flatnonzero(self.muon))

    @cached_property
    def adam_items(self) -> np.ndarray:
        """Positions of the other items (read-only)."""
        return _read_only(np.flatnonzero(~self.muon))

    @cached_property
    def all_items(self) -> np.ndarray:
        """Positions of every item, 0 .. n-1 (read-only)."""
        return _read_only(np.arange(len(self.numel)))

    @property
    def tensors(self) -> list[TensorSpec]:
        """The distinct tensor of every item."""
        return [self.unique[i] for i in self.tid.tolist()]


def _read_only(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def param_cost(t: TensorSpec) -> int:
    """Megatron's load-balancing cost of one copy of ``t``: max·min² of its local shard, numel otherwise."""
    shape = t.local_shape
    return newton_schulz_cost_proxy(*shape) if len(shape) == 2 else t.local_numel


def _segments(run: TensorRun, fp8_of: Fp8Of | None) -> list[tuple[tuple, tuple, tuple[bool, ...]]]:
    """The run's layers in backprop order, cut where a template's FP8-ness changes: (layers,
    prefixes, FP8 flag per template) per segment."""
    layers, prefixes = run.layers[::-1], run.prefixes[::-1]
    if fp8_of is None:
        return [(layers, prefixes, (False,) * len(run.templates))]
    out: list[tuple[tuple, tuple, tuple[bool, ...]]] = []
    start = 0
    flags = tuple(fp8_of(t, layers[0]) for t in run.templates)
    for k in range(1, len(layers) + 1):
        nxt = tuple(fp8_of(t, layers[k]) for t in run.templates) if k < len(layers) else None
        if nxt != flags:
            out.append((layers[start:k], prefixes[start:k], flags))
            start, flags = k, nxt  # type: ignore[assignment]
    return out


def chunk_buffers(runs: tuple[TensorRun, ...], chunk: int, kind: str, fp8_params: Fp8Of | None = None) -> list[_Buffer]:
    """Split one chunk's runs (definition order) into dense and expert buffers, backprop order.

    ``fp8_params`` (fp8_param_gather active): which tensors, in which layer, are FP8 parameters
    (:func:`workloads.fp8_params.is_fp8_param`); they get buffers of their own.
    """
    return make_buffers([(chunk, kind, chunk_parts(runs, fp8_params))])[0]


_Parts = list[tuple[str, bool, list[_Part]]]  # (dp group, FP8 parameters, parts) per buffer of a chunk


def chunk_parts(runs: tuple[TensorRun, ...], fp8_params: Fp8Of | None = None) -> _Parts:
    """The parts of each buffer of one chunk's runs (:func:`chunk_buffers` without the arrays)."""
    keys = [(g, f) for g in GROUPS for f in ((True, False) if fp8_params else (False,))]
    parts: dict[tuple[str, bool], list[_Part]] = {k: [] for k in keys}
    pos = 0
    for run in reversed(runs):
        trained = [(j, t) for j, t in reversed(list(enumerate(run.templates))) if t.optimizer != "none"]
        if not trained:
            continue
        for layers, prefixes, flags in _segments(run, fp8_params):
            pattern: dict[tuple[str, bool], list[tuple[int, TensorSpec, int, int]]] = {}
            offset = 0
            for j, t in trained:
                pattern.setdefault((t.dp_group, flags[j]), []).append((j, t, t.experts_per_rank, offset))
                offset += t.experts_per_rank
            for key, pat in pattern.items():
                parts[key].append(_Part(run, layers, prefixes, tuple(pat), pos, offset))
            pos += offset * len(layers)
    return [(g, f, parts[(g, f)]) for g, f in keys if parts[(g, f)]]


_Arrays = tuple[tuple[TensorSpec, ...], np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
_ARRAYS: IdentityMemo[_Arrays] = IdentityMemo(4096)  # keyed by the parts' structure and their tensors


def clear_memo() -> None:
    """Forget the memoised per-item arrays."""
    _ARRAYS.clear()


def make_buffers(chunks: list[tuple[int, str, _Parts]]) -> list[list[_Buffer]]:
    """The buffers of several chunks ((chunk, optimizer kind, :func:`chunk_parts`) each), their
    per-item arrays (one layer's pattern tiled over each part's layers) made for all of them at once.

    The arrays are memoised on what they depend on: per part its layer count, positions and pattern
    of tensors (by identity); the equal chunks of a plan's stages share them (read-only). Names come
    from each buffer's own parts."""
    keyed = []
    missing: dict[tuple, tuple[list[_Part], str, list[TensorSpec]]] = {}
    for _, kind, bufs in chunks:
        for _, _, parts in bufs:
            key = (kind, tuple((len(p.layers), p.position, p.per_layer,
                                tuple((copies, at) for _, _, copies, at in p.pattern)) for p in parts))
            tensors = [t for p in parts for _, t, _, _ in p.pattern]
            keyed.append((key, tensors))
            if _ARRAYS.get(key, *tensors) is None:
                missing.setdefault((key, *map(id, tensors)), (parts, kind, tensors))
    if missing:
        for (key, *_), (_, _, tensors), arrays in zip(missing, missing.values(), _arrays(list(missing.values())),
                                                        strict=True):
            _ARRAYS.put(arrays, key, *tensors)
    out, at = [], 0
    for chunk, kind, bufs in chunks:
        made = []
        for group, fp8, parts in bufs:
            key, tensors = keyed[at]
            at += 1
            hit = _ARRAYS.get(key, *tensors)
            if hit is None:  # the memo was emptied at its limit meanwhile
                hit = _ARRAYS.put(_arrays([(parts, kind, tensors)])[0], key, *tensors)
            unique, numel, cost, muon, position, tid, shared = hit
            made.append(_Buffer(chunk=chunk, group=group, numel=numel, cost=cost, muon=muon, position=position,
                                unique=unique, tid=tid, shared=shared, fp8=fp8, parts=tuple(parts)))
        out.append(made)
    return out


def _arrays(buffers: list[tuple[list[_Part], str, list[TensorSpec]]]) -> list[_Arrays]:
    """(distinct tensors, numel, cost, muon, position, tid, shared) of the items of each buffer's
    parts (and optimizer kind), read-only, for all the buffers in one pass: part ``p`` of layers
    ``L_p`` and a pattern of ``k_p`` items gives item ``j`` of its ``L_p·k_p`` the pattern's entry
    ``j mod k_p`` in layer ``j div k_p``."""
    uniques: list[list[TensorSpec]] = []
    ids: list[int] = []  # the pattern entries of every part: tensor (index in its buffer's uniques) ...
    offsets: list[int] = []  # ... and position in the layer
    sizes, reps, bases, firsts, steps, rows_at = [], [], [], [], [], []
    per_rows: list[tuple] = []
    for parts, kind, _ in buffers:
        index: dict[int, int] = {}
        unique: list[TensorSpec] = []
        for part in parts:
            bases.append(len(ids))
            for _, t, copies, at in part.pattern:
                u = index.get(id(t))
                if u is None:
                    u = index[id(t)] = len(unique)
                    unique.append(t)
                ids += [u] * copies
                offsets += range(at, at + copies)
            sizes.append(len(ids) - bases[-1])
            reps.append(len(part.layers))
            firsts.append(part.position)
            steps.append(part.per_layer)
            rows_at.append(len(per_rows))
        per_rows += [(t.local_numel, param_cost(t), kind == "muon" and t.optimizer == "muon", t.shared_embedding)
                     for t in unique]
        uniques.append(unique)
    k, layers = np.array(sizes, dtype=np.int64), np.array(reps, dtype=np.int64)
    items = k * layers
    n = int(items.sum())
    owner_part = np.repeat(np.arange(len(k)), items)
    local = np.arange(n, dtype=np.int64) - (np.cumsum(items) - items)[owner_part]
    layer, entry = np.divmod(local, k[owner_part])
    entry += np.array(bases, dtype=np.int64)[owner_part]
    tid = np.array(ids, dtype=np.int64)[entry]
    position = np.array(firsts, dtype=np.int64)[owner_part] + np.array(steps, dtype=np.int64)[owner_part] * layer \
        + np.array(offsets, dtype=np.int64)[entry]
    per = np.array(per_rows, dtype=np.float64).reshape(len(per_rows), 4)
    row = tid + np.array(rows_at, dtype=np.int64)[owner_part]
    numel, cost, muon, shared = per[row, 0].astype(np.int64), per[row, 1], per[row, 2] > 0, per[row, 3] > 0
    for a in (numel, cost, muon, position, tid, shared):
        a.setflags(write=False)  # the buffers' arrays are read-only views of these
    out: list[_Arrays] = []
    bounds = np.cumsum(items).tolist()
    lo = part_at = 0
    for (parts, _, _), unique in zip(buffers, uniques, strict=True):
        part_at += len(parts)
        hi = bounds[part_at - 1]
        out.append((tuple(unique), numel[lo:hi], cost[lo:hi], muon[lo:hi], position[lo:hi], tid[lo:hi], shared[lo:hi]))
        lo = hi
    return out
