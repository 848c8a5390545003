"""The optimizer plan contract between the optimizer models and the step engines.

An :class:`OptimizerPlan` says, per pipeline stage, how gradients are reduced and parameters
gathered (``buckets``, in backprop order), what optimizer work every GPU of the stage does
(``ranks``) and every collective one GPU issues per step (``collectives``, byte-exact, in the
:class:`workloads.comm.CollectiveCall` convention shared with the reference backend).
Engines schedule bucket collectives themselves (overlap with backward / next forward); the
optimizer step's own time on a GPU is ``RankWork.total_s``.

Ranks. A GPU of a stage is both a dense data-parallel rank (group ``dp`` = dp×cp, index
``g // tp`` in Megatron's tp-cp-dp order) and an expert data-parallel rank (group ``expert_dp``,
index ``g // (etp·ep)`` in the etp-ep-edp order). GPUs with the same pair of indices do identical
work, so ``ranks`` holds one :class:`RankWork` per distinct pair (``multiplicity`` GPUs each);
``rank`` is the first GPU (stage-local index) of that class.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any, Literal

import numpy as np

from workloads.comm import CollectiveCall, merge_calls

COLUMNS = ("owned", "flops", "ns_s", "tp_s", "ew_s", "kernels", "ns_kernels", "muon_items", "adam_pieces",
           "adam_chunks", "adam_numel", "norm_pieces", "norm_chunks", "items")
"""Per-rank accumulators of a role: owned elements, NS FLOPs and GPU seconds, TP comm seconds, GPU
seconds and launches of the per-tensor kernels (NS GEMM launches apart), Muon tensors stepped,
fused-Adam shard pieces / chunks / elements, gradient-norm pieces / chunks, whole items owned."""


@dataclass(frozen=True)
class Bucket:
    """One gradient/parameter bucket of one pipeline stage (sizes are whole-bucket, all ranks)."""

    stage: int
    chunk: int
    dp_group: Literal["dp", "expert_dp"]
    group_size: int
    numel: int  # padded elements in the bucket
    grad_bytes: int  # numel x grad element size (nccl-tests size of the reduce)
    param_bytes: int  # numel x param element size (nccl-tests size of the gather)
    reduce_op: Literal["reduce_scatter", "all_reduce"] | None  # None: reduced elsewhere (Megatron-FSDP per layer)
    gather_op: Literal["all_gather", "all_gather_v"] | None
    order: int = 0  # position in backprop order within the stage (0 = reduced first)
    used_numel: int = 0  # parameter elements (numel minus padding)
    kind: Literal["element_wise", "layer_wise", "ddp"] = "element_wise"
    param_dtype: Literal["bf16", "fp8"] = "bf16"  # what the parameter gather moves (fp8: FP8 parameters' uint8 data)
    param_gathers: int = 1  # all-gathers of param_bytes each (2: MXFP8 rowwise + columnwise on Megatron-FSDP)
    instances: int = 1  # distributed-optimizer instances: reduce and gather within one, all-reduce across
    averaged: bool = False  # average_in_collective with a scaling factor of 1: the reduction averages, no pre-scaling

    @classmethod
    def from_fields(cls, values: dict[str, Any], order: int) -> Bucket:
        """The Bucket of field values ``values`` (every field but ``order``) at position ``order``,
        built without the frozen ``__init__``'s per-field ``object.__setattr__`` (the same object,
        faster: a layer-wise expert buffer has dozens of buckets per stage)."""
        assert cls is Bucket and len(values) == len(_BUCKET_FIELDS) - 1 and "order" not in values \
            and _BUCKET_FIELDS.issuperset(values)
        b = object.__new__(cls)
        b.__dict__.update(values)
        b.__dict__["order"] = order
        return b

    def at_order(self, order: int) -> Bucket:
        """This bucket at position ``order`` (``replace(self, order=order)``, without the frozen
        ``__init__``: the buckets of a layer-wise expert buffer are mostly alike)."""
        b = object.__new__(Bucket)
        b.__dict__.update(self.__dict__)
        b.__dict__["order"] = order
        return b

    @property
    def prescaled(self) -> bool:
        """Whether Megatron-Core's ``start_grad_sync`` scales this bucket by its gradient scaling factor
        (1/dp) before reducing it: every reduced bucket over more than one rank, unless ``averaged``
        (``average_in_collective`` makes the factor 1 for dense buckets, and for expert buckets whose
        expert-data-parallel group is the dense one). Buckets reduced elsewhere (Megatron-FSDP per
        layer) are not scaled here."""
        return (not self.averaged and self.reduce_op is not None and self.group_size * self.instances > 1
                and self.numel > 0)

    @property
    def reduce_group(self) -> str:
        """Group kind of the reduction and the gather: the dp group, or one instance of it."""
        return self.dp_group if self.instances == 1 else f"{self.dp_group}_instance"

    @property
    def across_group(self) -> str:
        """Group kind across the instances (the all-reduce of each rank's reduced shard)."""
        return f"{self.dp_group}_across"

    @property
    def across_bytes(self) -> int:
        """Bytes of the all-reduce across instances: one rank's reduced shard (nccl-tests size)."""
        return self.grad_bytes // self.group_size if self.instances > 1 else 0


@dataclass(frozen=True)
class RankWork:
    """Optimizer-step work of one GPU (seconds are modelled times on that GPU).

    The step is a stream of kernels (:mod:`costmodel.optimizer.kernel_sequence`) issued eagerly
    after the gradient-norm synchronisation: ``newton_schulz_s`` and ``elementwise_s`` are GPU
    seconds (each kernel at least ``kernel_min_s``), ``issue_s`` the host seconds to issue the
    ``kernels`` launches; the step takes the larger of GPU time (with the TP collectives) and issue
    time (``total_s`` = :meth:`step_s`, computed by the plan builder for all GPUs at once).
    """

    rank: int  # index of the GPU within the stage's representative set (see StageOptimizerPlan)
    owned_numel: int
    newton_schulz_flops: float
    newton_schulz_s: float  # GPU seconds of the Newton-Schulz GEMMs
    elementwise_s: float  # GPU seconds of the other kernels: momentum, normalisation, casts, scale, update, Adam, norm
    tp_comm_s: float  # Newton-Schulz TP collectives on the critical path (duplicated / distributed)
    multiplicity: int = 1  # GPUs of the stage doing exactly this work
    dense_rank: int = 0  # index in the dense dp (dp×cp) group
    expert_rank: int = 0  # index in the expert-dp group
    issue_s: float = 0.0  # host seconds to issue the step's kernel launches (launches × kernel_issue_s)
    kernel_parts: tuple[float, ...] = ()  # launches by part, in the order of KERNEL_PARTS
    muon_tensors: int = 0  # Muon tensors (expert copies counted) this GPU steps
    total_s: float = 0.0  # step_s(gpu_s, issue_s): the optimizer step on this GPU (set by the plan builder)

    @property
    def gpu_s(self) -> float:
        """Seconds the GPU is busy (kernels and blocking TP collectives)."""
        return self.newton_schulz_s + self.elementwise_s + self.tp_comm_s

    @property
    def host_idle_s(self) -> float:
        """Seconds the GPU waits for the host to issue kernels (launch-bound step; 0 when GPU-bound)."""
        return self.total_s - self.gpu_s

    @property
    def kernels(self) -> float:
        """Kernel launches of the step on this GPU."""
        return sum(self.kernel_parts)

    @staticmethod
    def step_s(gpu_s: float, issue_s: float) -> float:
        """``total_s`` of a GPU busy ``gpu_s`` whose host issues for ``issue_s``: the larger of the two."""
        return max(gpu_s, issue_s)

    @property
    def kernel_counts(self) -> dict[str, float]:
        """Launches by part (:data:`KERNEL_PARTS`)."""
        return dict(zip(KERNEL_PARTS, self.kernel_parts, strict=True)) if self.kernel_parts else {}

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[Any, ...]]) -> tuple[RankWork, ...]:
        """One RankWork per row of field values (in field order), built without the frozen
        ``__init__``'s per-field ``object.__setattr__`` (the same objects, faster: a dense stage of a
        large model has hundreds of GPU classes)."""
        assert cls is RankWork  # the field names are RankWork's
        names, new, out = _RANK_FIELDS, object.__new__, []
        for row in rows:
            rw = new(cls)
            rw.__dict__.update(zip(names, row, strict=True))
            out.append(rw)
        return tuple(out)


_RANK_FIELDS = tuple(f.name for f in fields(RankWork))  # in order


class RankTable(Sequence[RankWork]):
    """A stage's RankWork classes as columns, each RankWork built when first read (the same values
    as :meth:`RankWork.from_rows` of the rows): a dense stage of a large model has hundreds of GPU
    classes, of which a new scenario's report reads one (the critical one) and a few columns.

    ``ints``: rows rank, multiplicity, dense_rank, expert_rank, owned_numel, muon_tensors (int64);
    ``floats``: rows newton_schulz_flops, newton_schulz_s, elementwise_s, tp_comm_s, issue_s,
    total_s (float64); ``parts``: launches by part (rows in :data:`KERNEL_PARTS` order, float64);
    one column per class. Compares equal to the tuple of its RankWork."""

    __slots__ = ("_ints", "_floats", "_parts", "_built", "_columns")

    _INT_ROWS = ("rank", "multiplicity", "dense_rank", "expert_rank", "owned_numel", "muon_tensors")
    _FLOAT_ROWS = ("newton_schulz_flops", "newton_schulz_s", "elementwise_s", "tp_comm_s", "issue_s", "total_s")

    def __init__(self, ints: np.ndarray, floats: np.ndarray, parts: np.ndarray) -> None:
        assert ints.shape[0] == len(self._INT_ROWS) and floats.shape[0] == len(self._FLOAT_ROWS)
        assert ints.shape[1] == floats.shape[1] == parts.shape[1]
        self._ints, self._floats, self._parts = ints, floats, parts
        self._built: dict[int, RankWork] = {}
        self._columns: dict[str, list[Any]] = {}

    def __len__(self) -> int:
        return int(self._ints.shape[1])

    def column(self, name: str) -> list[Any]:
        """The values of field ``name`` (an int or float field but ``kernel_parts``) of every class,
        in order (Python ints / floats: what the RankWork objects hold)."""
        hit = self._columns.get(name)
        if hit is None:
            if name in self._INT_ROWS:
                hit = self._ints[self._INT_ROWS.index(name)].tolist()
            else:
                hit = self._floats[self._FLOAT_ROWS.index(name)].tolist()
            self._columns[name] = hit
        return hit

    def _row(self, i: int) -> RankWork:
        hit = self._built.get(i)
        if hit is None:
            r, m, d, e, o, mt = self._ints[:, i].tolist()
            fl, ns, ew, tp, iss, tot = self._floats[:, i].tolist()
            hit = RankWork.from_rows([(r, o, fl, ns, ew, tp, m, d, e, iss, tuple(self._parts[:, i].tolist()), mt, tot)])[0]
            self._built[i] = hit
        return hit

    def __getitem__(self, i):  # type: ignore[no-untyped-def,override]  # int -> RankWork, slice -> tuple
        if isinstance(i, slice):
            return tuple(self._row(j) for j in range(*i.indices(len(self))))
        n = len(self)
        j = int(i) + n if int(i) < 0 else int(i)
        if not 0 <= j < n:
            raise IndexError("RankTable index out of range")
        return self._row(j)

    def __iter__(self) -> Iterator[RankWork]:
        return (self._row(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RankTable | tuple):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))

    def __getstate__(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._ints, self._floats, self._parts

    def __setstate__(self, state: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        self.__init__(*state)  # type: ignore[misc]


class LazyTuple(Sequence[Any]):
    """A tuple computed on first use by ``make()`` (then held): the per-GPU collective list of a
    stage and its seconds, which a new scenario reads for its critical stage only. Compares equal
    to (and hashes as) the tuple it stands for; pickles as that tuple."""

    __slots__ = ("_make", "_items")

    def __init__(self, make: Callable[[], Iterable[Any]]) -> None:
        self._make: Callable[[], Iterable[Any]] | None = make
        self._items: tuple[Any, ...] | None = None

    @property
    def items(self) -> tuple[Any, ...]:
        """The tuple (made on first use)."""
        if self._items is None:
            assert self._make is not None
            self._items, self._make = tuple(self._make()), None
        return self._items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):  # type: ignore[no-untyped-def,override]  # int -> item, slice -> tuple
        return self.items[i]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyTuple):
            return self.items == other.items
        if isinstance(other, tuple):
            return self.items == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.items)

    def __repr__(self) -> str:
        return repr(self.items)

    def __reduce__(self) -> tuple[type, tuple[tuple[Any, ...]]]:
        return tuple, (self.items,)


def rank_column(ranks: Sequence[RankWork], name: str) -> list[Any]:
    """Field ``name`` of every RankWork of ``ranks`` (read from the columns of a :class:`RankTable`
    without building its RankWork objects)."""
    if isinstance(ranks, RankTable):
        return ranks.column(name)
    return [getattr(r, name) for r in ranks]
_BUCKET_FIELDS = frozenset(f.name for f in fields(Bucket))


KERNEL_PARTS = ("newton_schulz_gemm", "muon_elementwise", "adam_multi_tensor", "adam_param_copy", "grad_norm",
                "gather_copy")
"""The parts of an optimizer step's kernel launches (:mod:`costmodel.optimizer.kernel_sequence`)."""


@dataclass(frozen=True, eq=False)
class RoleOwnership:
    """Which Muon items one dp role (dense or expert) of a stage owns, and the TP calls each makes.

    ``owner[i]`` is the dp index stepping item ``i`` (-1 = every rank, replicated optimizer);
    ``names[i]`` its parameter name and ``item_calls[i]`` the Newton-Schulz TP collectives of one
    call on it. Both are listed on first use from their parts: ``name_parts`` (a buffer and the
    positions of the items in it; the buffer lists its names) and ``call_parts`` (the calls of each
    distinct tensor of a buffer, and the items' distinct-tensor ids), so that a stage of thousands of
    identical expert matrices is built and queried per distinct tensor (:meth:`counted_calls_of`).
    """

    group: Literal["dp", "expert_dp"]
    size: int
    owner: np.ndarray
    name_parts: tuple[tuple[Any, np.ndarray], ...] = ()
    call_parts: tuple[tuple[list[tuple[CollectiveCall, ...]], np.ndarray], ...] = ()

    @cached_property
    def names(self) -> tuple[str, ...]:
        """Parameter name of every item."""
        out: list[str] = []
        for buf, idx in self.name_parts:
            names = buf.names
            out += [names[i] for i in idx.tolist()]
        return tuple(out)

    @cached_property
    def item_calls(self) -> tuple[tuple[CollectiveCall, ...], ...]:
        """Newton-Schulz TP collectives of one call on every item."""
        return tuple(calls[j] for calls, ids in self.call_parts for j in ids.tolist())

    @cached_property
    def _distinct(self) -> tuple[tuple[tuple[CollectiveCall, ...], ...], np.ndarray]:
        """(calls of every distinct (buffer, tensor) pair, each item's index there)."""
        calls: list[tuple[CollectiveCall, ...]] = []
        ids = []
        for part_calls, tids in self.call_parts:
            ids.append(tids + len(calls))
            calls += part_calls
        return tuple(calls), (np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64))

    def owned_items(self, index: int) -> list[int]:
        """Item positions stepped by dp index ``index``."""
        return [int(i) for i in np.flatnonzero((self.owner == index) | (self.owner < 0))]

    def calls_of(self, index: int) -> list[CollectiveCall]:
        """TP collectives issued by dp index ``index`` (unmerged)."""
        return [c for i in self.owned_items(index) for c in self.item_calls[i]]

    def counted_calls_of(self, index: int) -> list[CollectiveCall]:
        """:meth:`calls_of` with the calls of identical items as one call of summed count (what
        :func:`workloads.comm.merge_calls` makes of either)."""
        calls, ids = self._distinct
        if not any(calls):
            return []
        mine = np.bincount(ids[(self.owner == index) | (self.owner < 0)], minlength=len(calls))
        return [CollectiveCall(c.op, c.group, c.group_size, c.dtype, c.bytes, c.count * k, c.phase)  # replace(c, count=...)
                for k, cs in zip(mine.tolist(), calls, strict=True) if k for c in cs]


@dataclass(frozen=True)
class StageOptimizerPlan:
    stage: int
    buckets: tuple[Bucket, ...]
    ranks: tuple[RankWork, ...] | RankTable  # a RankTable from the plan builder (RankWork built when read)
    collectives: tuple[CollectiveCall, ...] | LazyTuple  # per GPU per step, merged (see workloads.comm.merge_calls)
    padding_overhead: float = 0.0  # padded / unpadded elements - 1
    collective_times_s: tuple[float, ...] | LazyTuple = ()  # seconds of ONE call of each entry of ``collectives``
    critical_rank: int = 0  # position in ``ranks`` of the slowest GPU (whose list ``collectives`` is)
    tp: int = 1
    etp: int = 1
    ep: int = 1
    roles: tuple[RoleOwnership, ...] = field(default=(), repr=False, compare=False)
    bucket_calls: tuple[CollectiveCall, ...] = field(default=(), repr=False, compare=False)

    @property
    def max_rank_s(self) -> float:
        """Seconds of the slowest GPU's optimizer step (``ranks[critical_rank]``, the slowest class)."""
        return self.ranks[self.critical_rank].total_s if self.ranks else 0.0

    @cached_property
    def mean_rank_s(self) -> float:
        """Mean over the GPUs of the stage (each rank class weighted by its multiplicity)."""
        gpus = self.gpus
        products = (t * m for t, m in zip(rank_column(self.ranks, "total_s"), rank_column(self.ranks, "multiplicity"),
                                          strict=True))
        return sum(products) / gpus if gpus else 0.0

    @cached_property
    def gpus(self) -> int:
        return sum(rank_column(self.ranks, "multiplicity"))

    @property
    def gather_buckets_forward(self) -> tuple[Bucket, ...]:
        """Buckets with a parameter gather, in the order the next forward needs them."""
        return tuple(sorted((b for b in self.buckets if b.gather_op), key=lambda b: -b.order))

    def _role(self, group: str) -> RoleOwnership | None:
        return next((r for r in self.roles if r.group == group), None)

    def gpu_collectives(self, gpu: int) -> list[CollectiveCall]:
        """Every collective GPU ``gpu`` (stage-local index, Megatron order) issues per step, merged."""
        calls = list(self.bucket_calls)
        dense, expert = self._role("dp"), self._role("expert_dp")
        if dense is not None:
            calls += dense.counted_calls_of(gpu // self.tp)
        if expert is not None:
            calls += expert.counted_calls_of(gpu // (self.etp * self.ep))
        return merge_calls(calls)

    def collectives_by_rank(self) -> dict[int, list[CollectiveCall]]:
        """Merged collective list of each rank class, keyed by its first GPU (``RankWork.rank``)."""
        return {r.rank: self.gpu_collectives(r.rank) for r in self.ranks}

    def owned_tensors(self, gpu: int) -> list[str]:
        """Names of the Muon items GPU ``gpu`` steps (layer-wise ownership)."""
        out: list[str] = []
        dense, expert = self._role("dp"), self._role("expert_dp")
        if dense is not None:
            out += [dense.names[i] for i in dense.owned_items(gpu // self.tp)]
        if expert is not None:
            out += [expert.names[i] for i in expert.owned_items(gpu // (self.etp * self.ep))]
        return out


@dataclass(frozen=True)
class OptimizerPlan:
    kind: str
    distribution: str
    layout: str | None
    tp_mode: str | None
    load_balance: str | None
    stages: tuple[StageOptimizerPlan, ...]
    notes: tuple[str, ...] = field(default=())
    hide_param_gather: bool = False  # engines overlap each bucket's gather with the next forward
    hypothetical: bool = False  # a (layout, load balance) pair Megatron-Core does not have (a what-if)

    @property
    def critical_stage(self) -> StageOptimizerPlan:
        """The stage whose slowest GPU takes longest in the optimizer step."""
        return max(self.stages, key=lambda s: s.max_rank_s)

    @property
    def max_rank_s(self) -> float:
        return max((s.max_rank_s for s in self.stages), default=0.0)

    def param_gather_buckets_forward(self, stage: int) -> tuple[Bucket, ...]:
        """Per-bucket parameter gathers of ``stage`` in forward order (what forward pre-hooks wait on)."""
        return self.stages[stage].gather_buckets_forward


EMPTY_PLAN = OptimizerPlan(kind="none", distribution="none", layout=None, tp_mode=None, load_balance=None, stages=())
"""A plan with no optimizer work: what the planner's pipeline-only bounds build structures with."""
