"""Per-stage plan construction: buffers in backprop order, buckets, ownership and per-GPU work.

Internal to :mod:`costmodel.optimizer.plan`. For one pipeline stage, each model chunk's
parameters are walked in backprop order and split into Megatron's buffers (dense over ``dp`` =
dp×cp, experts over ``expert_dp``); the distribution then decides buckets and who steps what:

* ``element_wise`` (AdamW): padded DDP buckets, reduce-scatter, Adam on each rank's equal shard,
  all-gather of bf16 parameters;
* ``layer_wise`` ``current``: Muon parameters in shard-aligned layer-wise buckets (whole
  parameters per rank, balanced by ``load_balance``), reduce-scatter, NS on owned matrices, equal
  all-gather; non-Muon parameters in separate element-wise buckets;
* ``layer_wise`` ``legacy``: unpadded DDP buckets all-reduced; every parameter (Muon and AdamW)
  owned whole by one rank (ping-pong by numel over the stage by default); ``all_gather_v`` per
  bucket of the updated parameters;
* ``replicated``: unpadded DDP buckets all-reduced; every rank steps everything.

Per-rank values are numpy arrays over a role's dp indices; a GPU's load is its dense-role work plus
its expert-role work (see :mod:`costmodel.optimizer.plan_types`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property, partial

import numpy as np

from costmodel.optimizer import layouts as lay
from costmodel.optimizer.elementwise import (
    NS_CAST_BYTES_PER_ELEMENT,
    PARAM_BYTES,
    adam_bytes_per_element,
    muon_bytes_per_element,
)
from costmodel.optimizer.newton_schulz import (
    NsSettings,
    NsWork,
    ns_time_s,
    tensor_ns_work,
    tp_comm_time_s,
)
from costmodel.optimizer.plan_types import (
    Bucket,
    RankWork,
    RoleOwnership,
    StageOptimizerPlan,
)
from topologies.groups import GroupShape
from topologies.hardware import SystemSpec
from workloads.comm import CollectiveCall, merge_calls
from workloads.flops import newton_schulz_cost_proxy
from workloads.inventory import Inventory, TensorSpec

GROUPS = ("dp", "expert_dp")


@dataclass(frozen=True)
class Grid:
    """Group sizes of one pipeline stage: ``dp`` is the dense data-parallel group (dp×cp)."""

    dp: int
    expert_dp: int
    tp: int = 1
    etp: int = 1
    ep: int = 1

    @property
    def gpus_per_stage(self) -> int:
        return self.tp * self.dp

    def size(self, group: str) -> int:
        return self.dp if group == "dp" else self.expert_dp


class Timer:
    """Seconds of NS work and collectives on a system (zero without one); memoised per plan."""

    def __init__(self, system: SystemSpec | None, precision: str,
                 shape_of: Callable[[str], GroupShape] | None) -> None:
        self.system, self.precision, self.shape_of = system, precision, shape_of
        self._ns: dict[NsWork, tuple[float, float]] = {}
        self._calls: dict[CollectiveCall, float] = {}
        self.memo: dict[str, dict] = {}  # per-plan memos of the stage builders (see StageBuilder)
        self.s_per_byte = 0.0
        if system is not None:
            from costmodel.compute import memory_time_s

            self.s_per_byte = memory_time_s(1e9, system) / 1e9

    def call_s(self, call: CollectiveCall) -> float:
        """Seconds of one ``call`` (nccl-tests size) over its group's placement shape."""
        if self.system is None or call.group_size <= 1:
            return 0.0
        key = CollectiveCall(call.op, call.group, call.group_size, call.dtype, call.bytes)
        if key not in self._calls:
            from topologies.collectives import collective_time_s

            shape = self.shape_of(call.group) if self.shape_of else GroupShape.single_domain(call.group_size)
            self._calls[key] = collective_time_s(call.op, call.bytes, shape, self.system)
        return self._calls[key]

    def ns(self, work: NsWork) -> tuple[float, float]:
        """(NS GEMM seconds, TP collective seconds) of ``work``."""
        if work not in self._ns:
            if self.system is None:
                self._ns[work] = (0.0, 0.0)
            else:
                self._ns[work] = (ns_time_s(work, self.system, self.precision), tp_comm_time_s(work, self.call_s))
        return self._ns[work]


@dataclass
class _Role:
    """Accumulated per-rank work of one dp role of one stage."""

    group: str
    size: int
    owned: np.ndarray = field(init=False)
    flops: np.ndarray = field(init=False)
    ns_s: np.ndarray = field(init=False)
    tp_s: np.ndarray = field(init=False)
    mem_bytes: np.ndarray = field(init=False)
    names: list[tuple[_Buffer, np.ndarray]] = field(default_factory=list)  # (buffer, item positions) per step
    owners: list[np.ndarray] = field(default_factory=list)
    calls: list[tuple[list[tuple[CollectiveCall, ...]], np.ndarray]] = field(default_factory=list)  # (per distinct, ids)

    def absorb(self, other: _Role, target: dict[int, _Buffer]) -> None:
        """Add ``other``'s work as if done on buffers ``target[id(recorded buffer)]`` (same contents)."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, np.ndarray):
                mine += theirs
            elif f.name == "names":
                mine.extend((target.get(id(b), b), idx) for b, idx in theirs)
            elif isinstance(mine, list):
                mine.extend(theirs)
            elif isinstance(mine, (int, float)) and not isinstance(mine, bool) and f.name != "size":
                setattr(self, f.name, mine + theirs)

    def __post_init__(self) -> None:
        z = np.zeros(self.size)
        self.owned, self.flops, self.ns_s, self.tp_s, self.mem_bytes = z.copy(), z.copy(), z.copy(), z.copy(), z.copy()

    def add_owned(self, owner: np.ndarray, numel, flops, ns_s, tp_s, mem_bytes) -> None:  # noqa: ANN001
        """Add per-item values to their owners (owner -1 = every rank)."""
        everyone = owner < 0
        for arr, vals in ((self.owned, numel), (self.flops, flops), (self.ns_s, ns_s), (self.tp_s, tp_s),
                          (self.mem_bytes, mem_bytes)):
            vals = np.asarray(vals, dtype=np.float64)
            if (~everyone).any():
                arr += np.bincount(owner[~everyone], weights=vals[~everyone], minlength=self.size)
            if everyone.any():
                arr += vals[everyone].sum()


@dataclass(frozen=True, eq=False)
class _Buffer:
    """Parameters of one buffer (stage, chunk, dp group) in backprop order.

    Expert copies of one tensor share its :class:`TensorSpec`: ``unique`` lists the distinct
    tensors (one of each content: :func:`workloads.inventory.content_id`) and ``tid`` maps every
    item to its entry there. ``key`` names the content (buffers with equal keys hold equal items);
    ``names`` (built on first use) are the items' parameter names.
    """

    chunk: int
    group: str
    numel: np.ndarray
    cost: np.ndarray
    muon: np.ndarray
    position: np.ndarray  # index in the chunk's backprop order (bucket readiness)
    unique: tuple[TensorSpec, ...] = ()
    tid: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    key: tuple = ()
    name_source: Callable[[], list[str]] | None = field(default=None, repr=False)

    @cached_property
    def names(self) -> list[str]:
        """Parameter name of every item (expert copies numbered as Megatron's local experts)."""
        return self.name_source() if self.name_source is not None else []


def _names_of(buf: _Buffer) -> list[str]:
    return buf.names


def _cost(t: TensorSpec) -> int:
    shape = t.local_shape
    return newton_schulz_cost_proxy(*shape) if len(shape) == 2 else t.local_numel


def _item_names(tensors: list[TensorSpec]) -> list[str]:
    """Names of the items of distinct tensors ``tensors`` (expert copies numbered, highest first)."""
    return [n for t in tensors
            for n in ([f"{t.name}{k}" for k in reversed(range(t.experts_per_rank))] if t.num_experts > 1
                      else [t.name] * t.experts_per_rank)]


def _skeletons(tensors: Sequence[TensorSpec], kind: str) -> list[tuple[str, tuple[int, ...], dict[str, np.ndarray]]]:
    """(group, positions in ``tensors`` of the distinct entries, read-only arrays) of each buffer of
    a chunk whose tensors (definition order) are ``tensors``."""
    runs: dict[str, list[tuple[int, int, int]]] = {g: [] for g in GROUPS}  # (index in tensors, copies, first position)
    pos = 0
    for k in range(len(tensors) - 1, -1, -1):
        t = tensors[k]
        if t.optimizer == "none":
            continue
        copies = t.experts_per_rank
        runs[t.dp_group].append((k, copies, pos))
        pos += copies
    out = []
    for g in GROUPS:
        items = runs[g]
        if not items:
            continue
        uniq = [tensors[k] for k, _, _ in items]
        counts = np.array([c for _, c, _ in items], dtype=np.int64)
        firsts = np.array([p for _, _, p in items], dtype=np.int64)
        tid = np.repeat(np.arange(len(items), dtype=np.int64), counts)
        offset = np.arange(len(tid), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        arrays = {"numel": np.array([t.local_numel for t in uniq], dtype=np.int64)[tid],
                  "cost": np.array([_cost(t) for t in uniq], dtype=np.float64)[tid],
                  "muon": np.array([kind == "muon" and t.optimizer == "muon" for t in uniq], dtype=bool)[tid],
                  "position": firsts[tid] + offset, "tid": tid}
        for a in arrays.values():
            a.setflags(write=False)
        out.append((g, tuple(k for k, _, _ in items), arrays))
    return out


def chunk_buffers(tensors: Sequence[TensorSpec], chunk: int, kind: str) -> list[_Buffer]:
    """Split one chunk's tensors (definition order) into dense and expert buffers, backprop order."""
    return [_Buffer(chunk=chunk, group=g, unique=tuple(tensors[k] for k in picks), key=(object(), g),
                    name_source=lambda picks=picks: _item_names([tensors[k] for k in picks]),  # type: ignore[misc]
                    **arrays)
            for g, picks, arrays in _skeletons(tensors, kind)]


_SKELETONS: OrderedDict[tuple, list[tuple[str, tuple[int, ...], dict[str, np.ndarray]]]] = OrderedDict()
_SKELETON_CACHE_SIZE = 4096


def inventory_chunk_buffers(inv: Inventory, stage: int, chunk: int, kind: str) -> list[_Buffer]:
    """:func:`chunk_buffers` of chunk ``chunk`` of ``stage``, memoised on the chunk's content
    (:meth:`Inventory.chunk_key`): equal chunks of any inventory share their arrays; names are
    listed from the chunk's own tensors when asked for."""
    key = inv.chunk_key(stage, chunk)
    skel = _SKELETONS.get((key, kind))
    rep = inv.by_content
    if skel is None:
        skel = _SKELETONS[(key, kind)] = _skeletons([rep[i] for i in key], kind)
        if len(_SKELETONS) > _SKELETON_CACHE_SIZE:
            _SKELETONS.popitem(last=False)

    def names(picks: tuple[int, ...]) -> list[str]:
        tensors = inv.chunk_tensors(stage, chunk)
        return _item_names([tensors[k] for k in picks])

    return [_Buffer(chunk=chunk, group=g, unique=tuple(rep[key[k]] for k in picks), key=(key, kind, g),
                    name_source=lambda picks=picks: names(picks), **arrays)  # type: ignore[misc]
            for g, picks, arrays in skel]


class StageBuilder:
    """Accumulates buckets and per-rank work of one stage."""

    def __init__(self, stage: int, grid: Grid, spec, timer: Timer, st: NsSettings) -> None:  # noqa: ANN001
        self.stage, self.grid, self.spec, self.timer, self.st = stage, grid, spec, timer, st
        self.roles = {g: _Role(g, grid.size(g)) for g in GROUPS}
        self.buckets: list[tuple[tuple[int, int], dict]] = []  # (sort key, Bucket kwargs)
        self.gb = spec.grad_bytes
        self.grad_dtype = "fp32" if self.gb == 4 else "bf16"
        self._muon_memo = timer.memo.setdefault("muon_item", {})  # shared by the plan's stages
        self._buffer_memo = timer.memo.setdefault("buffer_rows", {})
        self._effects = timer.memo.setdefault("buffer_effects", {})

    def replay(self, bufs: Sequence[_Buffer], op: str, run: Callable[[StageBuilder], None], *args: object) -> None:
        """Run ``run(builder)`` (which works on buffers ``bufs`` only), or replay what it did on
        earlier buffers of the same contents and bucket sizes in this plan: their buckets, owners
        and per-rank work are the same (only stage, chunk and names differ)."""
        key = (op, *((b.key, self.bucket_size(b.chunk)) for b in bufs), *args)
        hit = self._effects.get(key)
        if hit is None:
            sub = StageBuilder(self.stage, self.grid, self.spec, self.timer, self.st)
            run(sub)
            hit = self._effects[key] = (tuple(bufs), sub.roles, sub.buckets)
        sources, roles, buckets = hit
        target = {id(src): buf for src, buf in zip(sources, bufs, strict=True)}
        for g, role in roles.items():
            self.roles[g].absorb(role, target)
        for (chunk, ready), kw in buckets:
            buf = next(b for src, b in zip(sources, bufs, strict=True) if src.chunk == -chunk)
            self.buckets.append(((-buf.chunk, ready), {**kw, "stage": self.stage, "chunk": buf.chunk}))

    def bucket_size(self, chunk: int) -> int | None:
        """Elements per bucket; None (one bucket) for pp ranks > 0, chunks > 0, or no overlap."""
        if not self.spec.overlap_grad_reduce or self.stage > 0 or chunk > 0:
            return None
        return self.spec.bucket_size_elements or lay.default_bucket_size(self.grid.dp)

    def add_bucket(self, buf: _Buffer, idx: np.ndarray, numel: int, used: int, reduce_op: str,
                   gather_op: str | None, kind: str) -> None:
        ready = int(buf.position[idx].max())
        gs = self.grid.size(buf.group)
        gather_bytes = (used if gather_op == "all_gather_v" else numel) * PARAM_BYTES
        self.buckets.append(((-buf.chunk, ready), dict(
            stage=self.stage, chunk=buf.chunk, dp_group=buf.group, group_size=gs, numel=numel,
            grad_bytes=numel * self.gb, param_bytes=gather_bytes if gather_op else numel * PARAM_BYTES,
            reduce_op=reduce_op, gather_op=gather_op, used_numel=used, kind=kind)))

    def muon_item(self, t: TensorSpec) -> tuple[float, float, float, float, tuple[CollectiveCall, ...]]:
        """(NS FLOPs, NS s, TP comm s, HBM bytes, TP calls) of stepping one copy of ``t`` (memoised per
        plan on the tensor object: buffers hold one representative per content)."""
        key = id(t)
        if key not in self._muon_memo:
            w = tensor_ns_work(t, self.st)
            ns_s, tp_s = self.timer.ns(w)
            mem = t.local_numel * muon_bytes_per_element(self.gb) + w.matrix_numel * NS_CAST_BYTES_PER_ELEMENT
            self._muon_memo[key] = (w.flops, ns_s, tp_s, float(mem), w.calls)
        return self._muon_memo[key]

    def _per_tensor(self, buf: _Buffer) -> tuple[np.ndarray, list[tuple[CollectiveCall, ...]]]:
        """(numel, NS FLOPs, NS s, TP comm s, HBM bytes) per distinct tensor of ``buf`` as an
        (items, 4) array without numel, and each one's TP calls (empty for non-Muon tensors)."""
        hit = self._buffer_memo.get(buf.key)
        if hit is not None:
            return hit[1], hit[2]
        muon = np.zeros(len(buf.unique), dtype=bool)
        muon[buf.tid] = buf.muon
        rows, calls = [], []
        for t, m in zip(buf.unique, muon.tolist(), strict=True):
            if m:
                flops, ns_s, tp_s, mem, c = self.muon_item(t)
                rows.append((flops, ns_s, tp_s, mem))
                calls.append(c)
            else:
                rows.append((0.0, 0.0, 0.0, float(t.local_numel * adam_bytes_per_element(self.gb))))
                calls.append(())
        per = np.array(rows, dtype=np.float64).reshape(len(rows), 4)
        self._buffer_memo[buf.key] = (buf, per, calls)
        return per, calls

    def step_whole(self, buf: _Buffer, sel: np.ndarray, owner: np.ndarray) -> None:
        """Owners step whole parameters ``buf[sel]``: Muon (NS + update) or AdamW on the full tensor."""
        if len(sel) == 0:
            return
        role = self.roles[buf.group]
        per, calls = self._per_tensor(buf)
        vals = per[buf.tid[sel]]
        role.add_owned(owner, buf.numel[sel].astype(np.float64), vals[:, 0], vals[:, 1], vals[:, 2], vals[:, 3])
        is_muon = buf.muon[sel]
        if is_muon.any():
            picked = sel[is_muon]
            role.names.append((buf, picked))
            role.calls.append((calls, buf.tid[picked]))
        role.owners.append(owner[is_muon])

    def element_wise(self, buf: _Buffer, sel: np.ndarray) -> None:
        """AdamW on equal shards of padded DDP buckets (reduce-scatter + all-gather)."""
        if len(sel) == 0:
            return
        gs, role = self.grid.size(buf.group), self.roles[buf.group]
        numel = buf.numel[sel]
        for span in lay.ddp_buckets(numel, gs, self.bucket_size(buf.chunk), distributed_optimizer=True):
            per_rank = lay.shard_param_numel(span, numel, gs).astype(np.float64)
            role.owned += per_rank
            role.mem_bytes += per_rank * adam_bytes_per_element(self.gb)
            self.add_bucket(buf, sel[span.first:span.stop], span.numel, span.used, "reduce_scatter", "all_gather",
                            "element_wise")

    def layer_wise_current(self, buf: _Buffer, sel: np.ndarray, strategy: str) -> None:
        """Muon parameters in shard-aligned layer-wise buckets (reduce-scatter + equal all-gather)."""
        if len(sel) == 0:
            return
        gs = self.grid.size(buf.group)
        spans = lay.layer_wise_buckets(buf.numel[sel], buf.cost[sel], gs, self.bucket_size(buf.chunk), strategy)
        for span in spans:
            idx = sel[span.first:span.stop]
            assert span.owner is not None  # layer-wise spans always carry their owners
            self.step_whole(buf, idx, span.owner)
            self.add_bucket(buf, idx, span.numel, span.used, "reduce_scatter", "all_gather", "layer_wise")

    def ddp(self, buf: _Buffer, gather_op: str | None) -> None:
        """Unpadded DDP buckets of the whole buffer, all-reduced (legacy layer-wise / replicated)."""
        gs = self.grid.size(buf.group)
        for span in lay.ddp_buckets(buf.numel, gs, self.bucket_size(buf.chunk), distributed_optimizer=False):
            self.add_bucket(buf, np.arange(span.first, span.stop), span.numel, span.used, "all_reduce",
                            gather_op, "ddp")

    def finish(self, rank_work: Callable[[StageBuilder], tuple[RankWork, ...]]) -> StageOptimizerPlan:
        self.buckets.sort(key=lambda kb: kb[0])
        buckets = tuple(Bucket(order=i, **kw) for i, (_, kw) in enumerate(self.buckets))
        bucket_calls = []
        for b in buckets:
            phase_r = "grad_reduce"
            bucket_calls.append(CollectiveCall(b.reduce_op, b.dp_group, b.group_size, self.grad_dtype,  # type: ignore[arg-type]
                                               b.grad_bytes, 1, phase_r))
            if b.gather_op:
                bucket_calls.append(CollectiveCall(b.gather_op, b.dp_group, b.group_size, "bf16",  # type: ignore[arg-type]
                                                   b.param_bytes, 1, "param_gather"))
        used = sum(b.used_numel for b in buckets)
        padding = sum(b.numel for b in buckets) / used - 1 if used else 0.0
        roles = tuple(
            RoleOwnership(group=r.group, size=r.size,  # type: ignore[arg-type]
                          owner=np.concatenate(r.owners) if r.owners else np.zeros(0, dtype=np.int64),
                          name_parts=tuple((partial(_names_of, b), idx) for b, idx in r.names),
                          call_parts=tuple(r.calls))
            for r in self.roles.values())
        ranks = rank_work(self)
        g = self.grid
        proto = StageOptimizerPlan(stage=self.stage, buckets=buckets, ranks=ranks, collectives=(),
                                   padding_overhead=padding, tp=g.tp, etp=g.etp, ep=g.ep, roles=roles,
                                   bucket_calls=tuple(merge_calls(bucket_calls)))
        crit = max(range(len(ranks)), key=lambda i: ranks[i].total_s) if ranks else 0
        calls = tuple(proto.gpu_collectives(ranks[crit].rank)) if ranks else ()
        return StageOptimizerPlan(
            stage=self.stage, buckets=buckets, ranks=ranks, collectives=calls, padding_overhead=padding,
            collective_times_s=tuple(self.timer.call_s(c) for c in calls), critical_rank=crit,
            tp=g.tp, etp=g.etp, ep=g.ep, roles=roles, bucket_calls=proto.bucket_calls)


def rank_work(b: StageBuilder) -> tuple[RankWork, ...]:
    """One RankWork per distinct (dense index, expert index) pair of the stage's GPUs."""
    g = b.grid
    gpu = np.arange(g.gpus_per_stage)
    d, e = gpu // g.tp, gpu // (g.etp * g.ep)
    keys, first, counts = np.unique(d * g.expert_dp + e, return_index=True, return_counts=True)
    dd, ee = d[first], e[first]
    D, E = b.roles["dp"], b.roles["expert_dp"]  # noqa: N806
    owned = D.owned[dd] + E.owned[ee]
    flops = D.flops[dd] + E.flops[ee]
    ns_s = D.ns_s[dd] + E.ns_s[ee]
    tp_s = D.tp_s[dd] + E.tp_s[ee]
    mem_s = (D.mem_bytes[dd] + E.mem_bytes[ee]) * b.timer.s_per_byte
    values = np.stack([owned, flops, ns_s, mem_s, tp_s], axis=1)
    return classes_of(values, first, counts, dd, ee, lambda v: RankWork(
        rank=0, owned_numel=int(v[0]), newton_schulz_flops=float(v[1]), newton_schulz_s=float(v[2]),
        elementwise_s=float(v[3]), tp_comm_s=float(v[4])))


def classes_of(values: np.ndarray, first: np.ndarray, counts: np.ndarray, dense: np.ndarray, expert: np.ndarray,
               build: Callable[[list[float]], RankWork]) -> tuple[RankWork, ...]:
    """RankWork of every rank class (``values`` one row per class): built once per distinct row
    (``build``), then copied with each class's first GPU, multiplicity and dp indices. Thousands of
    classes doing the same work (a dense model's expert-dp classes) cost one construction each."""
    rows, inverse = np.unique(values, axis=0, return_inverse=True)
    protos = [build(r) for r in rows.tolist()]
    out = []
    new = object.__new__
    for p, r, m, dr, er in zip(inverse.ravel().tolist(), first.tolist(), counts.tolist(), dense.tolist(),
                               expert.tolist(), strict=True):
        w = new(RankWork)
        d = w.__dict__
        d.update(protos[p].__dict__)  # the frozen dataclass's fields (set without running __init__)
        d["rank"], d["multiplicity"], d["dense_rank"], d["expert_rank"] = r, m, dr, er
        out.append(w)
    return tuple(out)
