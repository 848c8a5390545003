"""A stage's DP gradient buckets as the engines see them: each bucket's reduction, gather and 1/dp
pre-scaling seconds and where it sits in its chunk's pass (:class:`BucketCost`), their orders
(:func:`bucket_views`), and what a stage takes from the optimizer plan (:func:`plan_stage_parts`:
buckets, optimizer-step seconds, the shared embedding's gradient all-reduce). Times in seconds,
sizes in bytes. See :mod:`costmodel.step_structure` for how the engines schedule them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property
from operator import attrgetter
from typing import NamedTuple

from costmodel.compute import kernel_gpu_s
from costmodel.layer_costs import NO_COMM, collective_s
from costmodel.optimizer.kernel_sequence import grad_prescale_kernels
from costmodel.optimizer.plan_types import Bucket, OptimizerPlan, StageOptimizerPlan
from topologies.groups import GroupShape
from topologies.hardware import SystemSpec
from topologies.identity_memo import IdentityMemo


class BucketCost(NamedTuple):
    """One DP bucket: its collectives' times and where it sits in its chunk's pass (a named tuple:
    a stage of a layer-wise plan has hundreds, and a frozen dataclass took ~4 us each to build)."""

    chunk: int
    group: str
    reduce_s: float
    gather_s: float
    link: str
    bwd_ready_fraction: float  # fraction of the chunk's backward after which the grads are complete
    reduce_latency_s: float = 0.0
    gather_latency_s: float = 0.0
    reduce_bytes: float = 0.0  # the gradient reduction's message size (bytes, nccl-tests convention)
    gather_bytes: float = 0.0  # the parameter gather's message size (bytes)
    prescale_s: float = 0.0  # compute-stream seconds scaling this bucket by 1/dp before its reduction

    @property
    def fwd_need_fraction(self) -> float:
        """Fraction of the chunk's forward at which these parameters are first needed."""
        return 1.0 - self.bwd_ready_fraction

@dataclass(frozen=True)
class BucketViews:
    """What the engines read of a stage's buckets besides the list itself: both orders, the
    pre-scaling seconds per chunk and the reduction and gather seconds summed (backprop order).
    The forward order is sorted on first use (only hidden parameter gathers read it)."""

    buckets: tuple[BucketCost, ...]  # backprop order
    backward: tuple[BucketCost, ...]
    prescale_by_chunk_s: dict[int, float]  # shared: callers must not change it
    reduce_s: float
    gather_s: float

    @cached_property
    def forward(self) -> tuple[BucketCost, ...]:
        """The buckets by chunk, then by the fraction of its forward at which they are needed."""
        return tuple(sorted(self.buckets, key=lambda b: (b.chunk, b.fwd_need_fraction)))


# keyed by the bucket tuple's identity: the stages of a layout with the same buckets share one tuple
# (plan_stage_parts), so their orders and sums are computed once
_BUCKET_VIEWS: IdentityMemo[BucketViews] = IdentityMemo(4096)
_READY = attrgetter("bwd_ready_fraction")
_CHUNK = attrgetter("chunk")


def backward_order(buckets: tuple[BucketCost, ...]) -> tuple[BucketCost, ...]:
    """``buckets`` in the order their gradients complete: chunks last to first, then by the fraction
    of the chunk's backward after which they are ready, ties in list order. The same order as
    sorting on ``(-chunk, bwd_ready_fraction)``, in two stable sorts on C-level keys (a reversed
    sort keeps equal keys in their order)."""
    return tuple(sorted(sorted(buckets, key=_READY), key=_CHUNK, reverse=True))


def bucket_views(buckets: tuple[BucketCost, ...]) -> BucketViews:
    """The :class:`BucketViews` of a stage's ``buckets`` (memoised per tuple object)."""
    hit = _BUCKET_VIEWS.get((), buckets)
    if hit is None:
        prescale: dict[int, float] = {}
        for b in buckets:
            prescale[b.chunk] = prescale.get(b.chunk, 0.0) + b.prescale_s
        hit = _BUCKET_VIEWS.put(BucketViews(
            buckets=buckets, backward=backward_order(buckets), prescale_by_chunk_s=prescale,
            reduce_s=sum(b.reduce_s for b in buckets), gather_s=sum(b.gather_s for b in buckets)), (), buckets)
    return hit


def _stage_buckets(sp: StageOptimizerPlan, system: SystemSpec, placement, overlap: bool) -> tuple[BucketCost, ...]:  # noqa: ANN001
    """The :class:`BucketCost` of each of stage ``sp``'s buckets (backprop order). A layer-wise stage has
    hundreds of buckets but a handful of distinct ones (a buffer of identical matrices): each distinct
    content (:data:`_bucket_cost_fields`) is priced once, the rest is bulk list work."""
    ordered = sorted(sp.buckets, key=_ORDER)
    keys = list(map(_bucket_cost_fields, ordered))
    where = list(map(_CHUNK_GROUP, ordered))
    numel = list(map(_NUMEL, ordered))
    groups: dict[tuple[int, str], int] = {}
    for key, n in zip(where, numel, strict=True):
        groups[key] = groups.get(key, 0) + n
    group_shapes = {}
    for rep in {(b.dp_group, b.instances): b for b in ordered}.values():  # one bucket per group pair
        group_shapes[rep.reduce_group] = placement.shape(rep.reduce_group)
        if rep.instances > 1:
            group_shapes[rep.across_group] = placement.shape(rep.across_group)
    # a run of alike buckets (one content at one chunk: a buffer of identical matrices) shares every
    # field but its ready fraction; each content is priced once (its times read only the key fields)
    times: dict[tuple, tuple[tuple[float, float, str], tuple[float, float, float, float, float]]] = {}
    seen: dict[tuple[int, str], int] = {}
    out = []
    run_key: tuple | None = None
    run_where: tuple[int, str] | None = None
    head: tuple = ()
    tail: tuple = ()
    for b, key, at, n in zip(ordered, keys, where, numel, strict=True):
        if at != run_where or key != run_key:  # a new run
            h = times.get(key)
            if h is None:
                red, gat, prescale_s = _bucket_times(b, group_shapes, system)
                h = times[key] = ((red[0], gat[0], red[2]), (red[1], gat[1], float(b.grad_bytes), float(
                    b.param_bytes * b.param_gathers) if b.gather_op else 0.0, prescale_s))
            head, tail, run_key, run_where = at + h[0], h[1], key, at
        if overlap:  # the share of its chunk's (dp group's) gradients complete once the bucket's are
            done = seen[at] = seen.get(at, 0) + n
            total = groups[at]
            fraction = done / total if total else 1.0
        else:
            fraction = 1.0
        out.append(_NEW(BucketCost, head + (fraction,) + tail))  # BucketCost(chunk, group, ..., fraction, ...)
    return tuple(out)


_NEW = tuple.__new__  # what a named tuple's __new__ calls, without its Python-level frame


# Bucket fields no bucket time reads (:func:`_bucket_times`; tests/test_speed_memo_keys.py checks it):
# every other field, one added later included, keys the memo of bucket times
BUCKET_FIELDS_NOT_READ = ("stage", "used_numel", "kind", "param_dtype")
_COST_FIELDS = tuple(f.name for f in fields(Bucket) if f.name not in (*BUCKET_FIELDS_NOT_READ, "chunk", "order"))
_bucket_cost_fields = attrgetter(*_COST_FIELDS)  # what a bucket's collective and pre-scaling times depend on
_bucket_content = attrgetter("chunk", "order", *_COST_FIELDS)  # ... and where it sits in its stage
_ORDER = attrgetter("order")
_CHUNK_GROUP = attrgetter("chunk", "dp_group")
_NUMEL = attrgetter("numel")


def _bucket_times(b: Bucket, group_shapes: dict[str, GroupShape],
                  system: SystemSpec) -> tuple[tuple[float, float, str], tuple[float, float, str], float]:
    """((reduce s, latency s, link), (gather s, latency s, link), pre-scaling s) of bucket ``b``."""
    shape = group_shapes[b.reduce_group]
    if shape.size != b.group_size:
        shape = GroupShape.single_domain(b.group_size) if b.group_size <= shape.ranks_per_domain else shape
    red = collective_s(b.reduce_op, b.grad_bytes, shape, system) if b.reduce_op else NO_COMM
    if b.instances > 1:  # then the instances all-reduce each rank's reduced shard
        across = collective_s("all_reduce", b.across_bytes, group_shapes[b.across_group], system)
        red = (red[0] + across[0], red[1] + across[1], red[2] if red[0] >= across[0] else across[2])
    gat = collective_s(b.gather_op, b.param_bytes, shape, system) if b.gather_op else NO_COMM
    if b.param_gathers > 1:  # MXFP8 on Megatron-FSDP: the rowwise and the columnwise buffer, one after the other
        gat = (gat[0] * b.param_gathers, gat[1] * b.param_gathers, gat[2])
    return red, gat, _prescale_s(b, system)


def _prescale_s(b: Bucket, system: SystemSpec) -> float:
    """GPU seconds of ``grad_data *= 1/dp`` on the compute stream before bucket ``b``'s reduction
    (MCore's ``start_grad_sync``; 0 when its scaling factor is 1: see :attr:`Bucket.prescaled` and
    :func:`grad_prescale_s`); the reduction starts after it. The whole padded bucket is scaled:
    ``bucket.grad_data`` is the buffer view ``[start_index, end_index)`` that the reduce-scatter
    also takes (``_ParamAndGradBuffer._new_bucket``, MCore 0.16.1), padding included, so a heavily
    padded layer-wise bucket costs its ``numel``, not its ``used_numel``."""
    if not b.prescaled:
        return 0.0
    return sum(k.count * kernel_gpu_s(k, system) for k in grad_prescale_kernels(1, b.numel, b.grad_bytes // b.numel))


_BUCKET_COSTS: IdentityMemo[tuple[BucketCost, ...]] = IdentityMemo(4096)  # bucket contents; the system by identity
# every stage's parts of one plan; plan and system keyed by identity (entries keep their plans alive:
# bounded like the planner's plan cache)
_PLAN_STAGES: IdentityMemo[tuple[StageParts, ...]] = IdentityMemo(2048)
DP_SHAPE_GROUPS = ("dp", "expert_dp", "dp_instance", "dp_across", "expert_dp_instance", "expert_dp_across")


class StageParts(NamedTuple):
    """What a stage's :class:`StageCost` takes from the optimizer plan (seconds)."""

    buckets: tuple[BucketCost, ...]
    optimizer_compute_s: float
    optimizer_tp_s: float
    embedding_grad: tuple[float, float, str]  # (s, latency s, link), :func:`_embedding_grad`
    grad_prescale_s: float


_NO_STAGE = StageParts((), 0.0, 0.0, (0.0, 0.0, "nvlink"), 0.0)


def plan_stage_parts(plan: OptimizerPlan, pp: int, system: SystemSpec, placement, overlap: bool  # noqa: ANN001
                     ) -> tuple[StageParts, ...]:
    """The :class:`StageParts` of stages ``0 .. pp-1`` (a stage the plan lacks has none), memoised
    per plan and system (by identity), ``pp``, the placement shapes read (the dp groups' and
    ``embd``) and ``overlap``: candidates sharing a plan share them.

    Per plan, not per stage: one memo key for all stages. A stage's buckets are priced per content
    (their sizes and groups, not the stage: :data:`_bucket_content`), shared by the stages of the
    plan (a pipeline's middle stages) and across plans with the same buckets."""
    shapes = tuple(placement.shapes[g] for g in DP_SHAPE_GROUPS)
    embd = placement.shape("embd")
    key = (pp, shapes, embd, overlap)
    hit = _PLAN_STAGES.get(key, plan, system)
    if hit is not None:
        return hit
    by_stage: dict[int, StageOptimizerPlan] = {}
    for x in plan.stages:
        by_stage.setdefault(x.stage, x)  # the first of a stage, as a search in order finds
    seen: dict[tuple, tuple[tuple[BucketCost, ...], float]] = {}  # this plan's bucket contents
    out = []
    for stage in range(pp):
        sp = by_stage.get(stage)
        if sp is None:
            out.append(_NO_STAGE)
            continue
        content = tuple(map(_bucket_content, sp.buckets))
        priced = seen.get(content)
        if priced is None:
            buckets = _BUCKET_COSTS.get((content, shapes, overlap), system)
            if buckets is None:
                buckets = _BUCKET_COSTS.put(_stage_buckets(sp, system, placement, overlap), (content, shapes, overlap),
                                            system)
            priced = seen[content] = (buckets, grad_prescale_s(buckets))
        crit = sp.ranks[sp.critical_rank] if sp.ranks else None  # the slowest GPU class (first of equals)
        out.append(StageParts(priced[0], (crit.total_s - crit.tp_comm_s) if crit else 0.0,
                              crit.tp_comm_s if crit else 0.0, _embedding_grad(sp, embd, system), priced[1]))
    return _PLAN_STAGES.put(tuple(out), key, plan, system)


def _embedding_grad(sp: StageOptimizerPlan, shape: GroupShape, system: SystemSpec) -> tuple[float, float, str]:
    """(seconds, latency s, link) of stage ``sp``'s shared-embedding gradient all-reduce over ``embd``
    (of ``shape``; first and last stage, after their DP reduction: ``finalize_model_grads``); zeros without one."""
    calls = [c for c in sp.bucket_calls if c.phase == "embedding_grad"]
    if not calls:
        return 0.0, 0.0, "nvlink"
    times = [collective_s(c.op, c.bytes, shape, system) for c in calls for _ in range(c.count)]
    return sum(t[0] for t in times), sum(t[1] for t in times), times[0][2]


def grad_prescale_s(buckets: tuple[BucketCost, ...]) -> float:
    """Seconds the compute stream spends scaling a stage's gradient buckets before their reduction.

    Megatron-Core's ``start_grad_sync`` multiplies each bucket by its ``gradient_scaling_factor``
    (one read-write kernel per bucket, :func:`kernel_sequence.grad_prescale_kernels`) unless the
    factor is 1: with ``average_in_collective`` the reduction averages (NCCL avg) and dense buckets
    need no scaling; expert buckets still do when the expert-data-parallel group differs from the
    dense one. Buckets reduced elsewhere (Megatron-FSDP per layer) or over one rank are not scaled.
    """
    return sum(b.prescale_s for b in buckets)
