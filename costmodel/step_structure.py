"""The parallel structure of one training step: per-chunk pass costs, layer communication, PP, DP.

For every pipeline stage and virtual chunk, :class:`ChunkCost` holds the forward and backward time
of one micro-batch: compute (sum of :mod:`workloads.operations` times) and the layer collectives.
Which collectives are on the critical path (explicit, per Megatron-Core's defaults):

- **TP** (sequence parallel: all-gather / reduce-scatter of ``tokens·h`` BF16 per column/row pair;
  forward 2 per pair, backward 3 per pair because the input is re-gathered for the weight
  gradient; without SP an all-reduce per pair each way).
- **CP** (ring exchange of K and V, forward; K/V again plus their gradients, backward).
- **EP** (dispatch and combine per MoE layer, forward and backward: the flex/HybridEP dispatcher of
  the published recipes, de-duplicated per NVLink domain, :mod:`costmodel.moe_dispatch`; with
  etp > 1 an all-gather / reduce-scatter of the dispatched tokens over etp).
- **PP** point-to-point: sends of ``sp_tokens·h`` BF16 per micro-batch. With Megatron's
  ``overlap_p2p_comm`` (or without interleaving) they are asynchronous and cost time
  through the schedule's dependencies (see :mod:`costmodel.pipeline`); the interleaved schedule
  without it blocks every pass on its batched send/receive (a ``pp`` block of one transfer per pass).
- **DP**: gradient reduce-scatter per bucket (from the optimizer plan) overlapped with backward
  when ``overlap_grad_reduce``, each after its pre-scaling kernel on the compute stream
  (``grad_data *= 1/dp``, none with ``average_in_collective``); with distributed-optimizer
  instances, reduce-scatter within an instance then all-reduce of the shard across them; parameter
  all-gather synchronous after the optimizer step or, with ``hide_param_gather``, per bucket in
  forward order ahead of the next step's first forward (``align_param_gather``: every stage from
  the step start; otherwise each chunk's when its first forward starts).
- **Per-iteration logging** (``log_num_zeros_in_grad``, ``log_params_norm``): kernels and a one-float
  all-reduce each, after the gradient-norm synchronisation, counted with the optimizer step
  (:mod:`costmodel.iteration_work`).
- **Embedding group**: with a word embedding on both the first and the last stage (tied embeddings,
  or MTP, with pp > 1), its gradient is all-reduced over ``embd`` once both stages have reduced
  their DP gradients, before the optimizer step (``finalize_model_grads``); exposed, counted in ``dp_grad``.
- **Activation offloading** (``cpu_offloading``, fine-grained ``offload_modules``): the copies to
  and from host memory per layer, kind ``offload``, exposed beyond the layer's compute
  (:mod:`costmodel.offload`).
- **Megatron-FSDP** (``fsdp = dp·cp``): per layer and micro-batch, parameter all-gathers (forward
  and backward) and gradient reduce-scatters (backward) over the dp groups, kind ``dp_fsdp``,
  exposed beyond the layer's compute; no DP buckets (:mod:`costmodel.fsdp`).

How much of the TP, CP and EP collectives is exposed (TP and EP overlap flags, CP under the
attention core) is decided by :mod:`costmodel.comm_exposure`.

``overlap=False`` turns every overlap off (all comm exposed, grad reduce after backward,
synchronous parameter gather): the mode in which the two engines must agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property, lru_cache
from operator import attrgetter
from typing import TYPE_CHECKING, NamedTuple

from costmodel.compute import kernel_gpu_s
from costmodel.layer_comm import base_kind, layer_kind_costs
from costmodel.layer_costs import (
    BF16_SUFFIX,
    CACHE_LIMIT,
    LAYER_GROUP_KINDS,
    NO_COMM,
    CommBlock,
    collective_s,
    domain_link,
    layer_cache_key,
    rank_shape,
)
from costmodel.optimizer.kernel_sequence import grad_prescale_kernels
from costmodel.optimizer.plan_types import Bucket, OptimizerPlan
from topologies.groups import GroupShape
from topologies.hardware import SystemSpec
from topologies.identity_memo import IdentityMemo
from workloads.fp8_params import layer_kept_bf16
from workloads.operations import ACT_BYTES

if TYPE_CHECKING:
    from workloads.scenario import Scenario

_KIND_CACHE: IdentityMemo[tuple] = IdentityMemo(CACHE_LIMIT)  # layer_cache_key + overlap -> costs (model, system by identity)


@dataclass(frozen=True)
class PassCost:
    """One forward or backward pass of one chunk for one micro-batch."""

    compute_s: float
    comm: tuple[CommBlock, ...] = ()

    @cached_property
    def exposed_comm_s(self) -> float:
        """Seconds of exposed layer communication."""
        return sum(c.exposed_s for c in self.comm)

    @cached_property
    def time_s(self) -> float:
        """Seconds on the compute stream: compute + exposed layer communication."""
        return self.compute_s + self.exposed_comm_s

    def exposed_by_kind(self) -> dict[str, float]:
        """Exposed seconds by collective kind (tp, cp, ep)."""
        out: dict[str, float] = {}
        for c in self.comm:
            out[c.kind] = out.get(c.kind, 0.0) + c.exposed_s
        return out


@dataclass(frozen=True)
class ChunkCost:
    """One virtual chunk of one stage: its layers' forward and backward pass per micro-batch."""

    stage: int
    chunk: int
    layers: int
    fwd: PassCost
    bwd: PassCost

    @cached_property
    def time_s(self) -> float:
        """Compute-stream seconds of forward + backward."""
        return self.fwd.time_s + self.bwd.time_s


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
class StageCost:
    """One pipeline stage's representative GPU: chunks, DP buckets, optimizer-step seconds."""

    stage: int
    chunks: tuple[ChunkCost, ...]
    buckets: tuple[BucketCost, ...]  # backprop order
    optimizer_compute_s: float
    optimizer_tp_s: float
    embedding_grad_s: float = 0.0  # all-reduce of a shared embedding's gradient with the other end of ``embd``
    embedding_grad_latency_s: float = 0.0
    embedding_grad_link: str = "nvlink"
    grad_prescale_s: float = 0.0  # compute-stream seconds scaling the gradient buckets by 1/dp (booked as dp_grad)

    @cached_property
    def work_s(self) -> float:
        """Compute-stream seconds per micro-batch (all chunks, forward + backward)."""
        return sum(c.time_s for c in self.chunks)

    @property
    def forward_buckets(self) -> tuple[BucketCost, ...]:
        """Buckets in the order the next forward needs their parameters (chunk, then position)."""
        return bucket_views(self.buckets).forward

    @property
    def backward_buckets(self) -> tuple[BucketCost, ...]:
        """Buckets in the order their gradients complete (chunks last to first, then position)."""
        return bucket_views(self.buckets).backward


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
# (_stage_optimizer's memo), so their orders and sums are computed once
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


@dataclass(frozen=True)
class StepStructure:
    """Everything the engines schedule for one step (per representative rank of each stage)."""

    pp: int
    vpp: int
    microbatches: int
    stages: tuple[StageCost, ...]
    p2p_s: float
    p2p_latency_s: float
    p2p_bytes: float
    p2p_link: str
    overlap: bool
    overlap_grad_reduce: bool
    hide_param_gather: bool
    compute_slowdown: float
    plan: OptimizerPlan
    warnings: tuple[str, ...] = field(default=())
    align_param_gather: bool = True  # every stage starts its hidden parameter gathers with the step (not at its first forward)


# ----------------------------------------------------------------------------------------------
def _merge(blocks: list[CommBlock]) -> tuple[CommBlock, ...]:
    by: dict[str, list[CommBlock]] = {}
    for b in blocks:
        by.setdefault(b.kind, []).append(b)
    out = []
    for k, bs in by.items():
        t = sum(b.time_s for b in bs)
        exposed = sum(b.exposed_s for b in bs)
        out.append(CommBlock(k, t, sum(b.latency_s for b in bs), bs[0].link, exposed / t if t > 0 else 1.0,
                             sum(b.bytes for b in bs)))
    return tuple(out)


def _chunk_items(scenario: Scenario) -> list[list[str]]:
    """Layer kinds of every virtual stage (index chunk * pp + stage); layers kept in BF16 by
    ``first_last_layers_bf16`` in a low-precision run are marked ``:bf16`` (``dense:bf16``, see
    :func:`costmodel.layer_comm.layer_kind_costs`), layers full recompute leaves out ``:norc``."""
    model, p = scenario.model, scenario.par
    first_moe = model.moe.first_dense_layers if model.moe is not None else model.num_layers
    block = p.recompute_num_layers if p.recompute == "full" and p.recompute_method == "block" else None
    bf16_layers = scenario.runtime.bf16_layers if scenario.precision.tensor_core_class != "bf16" else None
    items = _layer_kinds(tuple(scenario.virtual_stage_layers), model.num_layers, model.mtp_layers, first_moe,
                         block, bf16_layers)
    assert len(items) == p.pp * p.vpp
    return [list(kinds) for kinds in items]


@lru_cache(maxsize=4096)
def _layer_kinds(counts: tuple[int, ...], num_layers: int, mtp_layers: int, first_moe: int, block: int | None,
                 bf16_layers: tuple[int, int] | None) -> tuple[tuple[str, ...], ...]:
    """:func:`_chunk_items` from what it reads (memoised): layers per virtual stage, the model's layer,
    MTP and first MoE layer counts, full recompute's block size (None: not block) and the layers kept
    in BF16 (None: a BF16 run)."""
    def bf16(layer: int) -> str:
        return BF16_SUFFIX if bf16_layers is not None and layer_kept_bf16(layer, num_layers, bf16_layers) else ""

    items: list[list[str]] = []
    layer = 0
    for n in counts:  # full recompute, method block: only the first recompute_num_layers of each chunk
        items.append([("moe" if i >= first_moe else "dense") + bf16(i)
                      + (":norc" if block is not None and i - layer >= block else "")
                      for i in range(layer, layer + n)])
        layer += n
    items[0].insert(0, "embedding")
    items[-1].extend(["mtp" + bf16(num_layers)] * mtp_layers)
    items[-1].append("output")
    return tuple(tuple(kinds) for kinds in items)


def _stage_buckets(plan: OptimizerPlan, stage: int, scenario: Scenario, placement, overlap: bool) -> tuple[BucketCost, ...]:  # noqa: ANN001
    """The :class:`BucketCost` of each of ``stage``'s buckets (backprop order). A layer-wise stage has
    hundreds of buckets but a handful of distinct ones (a buffer of identical matrices): each distinct
    content (:data:`_bucket_cost_fields`) is priced once, the rest is bulk list work."""
    sp = next((s for s in plan.stages if s.stage == stage), None)
    if sp is None:
        return ()
    system = scenario.system
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
    times: dict[tuple, tuple[float, float, str, float, float, float, float, float]] = {}
    for same, b in dict(zip(keys, ordered, strict=True)).items():  # one bucket per content: the times read only it
        red, gat, prescale_s = _bucket_times(b, group_shapes, system)
        times[same] = (red[0], gat[0], red[2], red[1], gat[1], float(b.grad_bytes),
                       float(b.param_bytes * b.param_gathers) if b.gather_op else 0.0, prescale_s)
    if overlap:  # the share of its chunk's (dp group's) gradients complete once the bucket's are
        seen: dict[tuple[int, str], int] = {}
        fractions = []
        for key, n in zip(where, numel, strict=True):
            done = seen[key] = seen.get(key, 0) + n
            fractions.append(done / groups[key] if groups[key] else 1.0)
    else:
        fractions = [1.0] * len(ordered)
    return tuple(BucketCost(c, g, h[0], h[1], h[2], f, h[3], h[4], h[5], h[6], h[7])
                 for (c, g), h, f in zip(where, map(times.__getitem__, keys), fractions, strict=True))


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


# plan and system keyed by identity; entries keep their plans alive: bounded like the planner's plan cache
_STAGE_CACHE: IdentityMemo[tuple[tuple[BucketCost, ...], float, float]] = IdentityMemo(2048)
_BUCKET_COSTS: IdentityMemo[tuple[BucketCost, ...]] = IdentityMemo(4096)  # bucket contents; the system by identity


def _stage_optimizer(plan: OptimizerPlan, stage: int, scenario: Scenario, placement,  # noqa: ANN001
                     overlap: bool) -> tuple[tuple[BucketCost, ...], float, float]:
    """(DP buckets, optimizer compute s, optimizer TP comm s) of one stage, memoised per plan,
    stage, placement shapes of the plan's dp groups, system and overlap (candidates sharing a plan
    share them)."""
    system = scenario.system
    shapes = tuple(placement.shapes[g] for g in ("dp", "expert_dp", "dp_instance", "dp_across", "expert_dp_instance",
                                                 "expert_dp_across"))
    key = (stage, shapes, overlap)
    hit = _STAGE_CACHE.get(key, plan, system)
    if hit is not None:
        return hit
    sp = next((x for x in plan.stages if x.stage == stage), None)
    crit = sp.ranks[sp.critical_rank] if sp and sp.ranks else None  # the slowest GPU class (first of equals)
    # the buckets' costs depend on their sizes and groups, not on the stage: stages of a plan (and
    # plans) with the same buckets share them
    content = tuple(map(_bucket_content, sp.buckets)) if sp else ()
    buckets = _BUCKET_COSTS.get((content, shapes, overlap), system)
    if buckets is None:
        buckets = _BUCKET_COSTS.put(_stage_buckets(plan, stage, scenario, placement, overlap),
                                    (content, shapes, overlap), system)
    out = (buckets, (crit.total_s - crit.tp_comm_s) if crit else 0.0, crit.tp_comm_s if crit else 0.0)
    return _STAGE_CACHE.put(out, key, plan, system)


def _embedding_grad(plan: OptimizerPlan, stage: int, scenario: Scenario, placement) -> tuple[float, float, str]:  # noqa: ANN001
    """(seconds, latency s, link) of ``stage``'s shared-embedding gradient all-reduce over ``embd``
    (first and last stage, after their DP reduction: ``finalize_model_grads``); zeros without one."""
    sp = next((x for x in plan.stages if x.stage == stage), None)
    calls = [c for c in (sp.bucket_calls if sp else ()) if c.phase == "embedding_grad"]
    if not calls:
        return 0.0, 0.0, "nvlink"
    shape = placement.shape("embd")
    times = [collective_s(c.op, c.bytes, shape, scenario.system) for c in calls for _ in range(c.count)]
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


def build_step_structure(scenario: Scenario, overlap: bool = True, plan: OptimizerPlan | None = None) -> StepStructure:
    """The step's structure for ``scenario`` (raises UnsupportedScenario for hybrid FSDP sharding).

    ``plan``: the scenario's optimizer plan when the caller already has it (the planner shares
    plans between candidates that differ only in settings the plan does not depend on).
    """
    from costmodel.errors import UnsupportedScenario
    from costmodel.fsdp import add_fsdp_blocks, fsdp_unsupported_reason
    from costmodel.offload import add_offload_blocks
    from costmodel.optimizer.plan import build_optimizer_plan
    from topologies.placement import placement_for

    p = scenario.par
    reason = fsdp_unsupported_reason(scenario)
    if reason is not None:
        raise UnsupportedScenario(reason)
    system, model = scenario.system, scenario.model
    shape = rank_shape(scenario)
    placement = placement_for(scenario)
    shapes = {k: placement.shape(k) for k in LAYER_GROUP_KINDS}
    items = _chunk_items(scenario)
    per_kind: dict[str, tuple[float, float, tuple[CommBlock, ...], tuple[CommBlock, ...]]] = {}
    for kind in sorted({k for kinds in items for k in kinds}):
        key = (*layer_cache_key(scenario, shape, kind, shapes), overlap)
        hit = _KIND_CACHE.get(key, model, system)
        per_kind[kind] = hit if hit is not None else _KIND_CACHE.put(
            layer_kind_costs(scenario, shape, kind, shapes, overlap), key, model, system)
    if p.fsdp > 0:
        add_fsdp_blocks(scenario, placement, per_kind, overlap)
    add_offload_blocks(scenario, per_kind, overlap)
    plan = build_optimizer_plan(scenario) if plan is None else plan
    logging = scenario.runtime.log_num_zeros_in_grad or scenario.runtime.log_params_norm
    if logging:  # per-iteration logging work in the optimizer tail (costmodel.iteration_work)
        from costmodel.iteration_work import logging_s
        from workloads.inventory import inventory_for

        inventory = inventory_for(scenario)
    pps = shapes["pp"]
    p2p_bytes = float(shape.sp_tokens * model.hidden_size * ACT_BYTES)
    pair = GroupShape(2, 2, 1) if pps.intra_domain else GroupShape(2, 1, 2)
    p2p, p2p_lat, _ = collective_s("send_recv", p2p_bytes, pair, system) if p.pp > 1 else NO_COMM
    # interleaved schedule without overlap_p2p_comm: every pass waits for its batched send/receive
    blocking = (CommBlock("pp", p2p, p2p_lat, domain_link(pair)),) if p.pp > 1 and p.vpp > 1 \
        and not scenario.runtime.overlap_p2p_comm else ()
    stages = []
    passes: dict[tuple[str, ...], tuple[int, PassCost, PassCost]] = {}  # chunks with the same layers share them
    for s in range(p.pp):
        chunks = []
        for c in range(p.vpp):
            kinds = tuple(items[c * p.pp + s])
            shared = passes.get(kinds)
            if shared is None:
                f = sum(per_kind[k][0] for k in kinds)
                b = sum(per_kind[k][1] for k in kinds)
                cf = _merge([blk for k in kinds for blk in per_kind[k][2]] + list(blocking))
                cb = _merge([blk for k in kinds for blk in per_kind[k][3]] + list(blocking))
                layers = sum(1 for k in kinds if base_kind(k) in ("dense", "moe", "mtp"))
                shared = passes[kinds] = (layers, PassCost(f, cf), PassCost(b, cb))
            chunks.append(ChunkCost(s, c, *shared))
        buckets, opt_compute_s, opt_tp_s = _stage_optimizer(plan, s, scenario, placement, overlap)
        if logging:
            opt_compute_s += logging_s(scenario, inventory.stage_tensors(s), placement.shape("world"))
        embd = _embedding_grad(plan, s, scenario, placement)
        stages.append(StageCost(stage=s, chunks=tuple(chunks), buckets=buckets,
                                optimizer_compute_s=opt_compute_s, optimizer_tp_s=opt_tp_s,
                                embedding_grad_s=embd[0], embedding_grad_latency_s=embd[1],
                                embedding_grad_link=embd[2], grad_prescale_s=grad_prescale_s(buckets)))
    if blocking:  # the transfers sit in the passes: nothing left for the schedule to wait on
        p2p, p2p_lat = 0.0, 0.0
    opt = scenario.optimizer
    return StepStructure(
        pp=p.pp, vpp=p.vpp, microbatches=scenario.num_microbatches, stages=tuple(stages),
        p2p_s=p2p, p2p_latency_s=p2p_lat, p2p_bytes=p2p_bytes, p2p_link=domain_link(pair), overlap=overlap,
        overlap_grad_reduce=overlap and opt.overlap_grad_reduce,
        hide_param_gather=overlap and opt.hide_param_gather,
        align_param_gather=opt.align_param_gather or opt.overlap_param_gather_with_optimizer_step,
        compute_slowdown=system.efficiency.overlap_compute_slowdown if overlap else 0.0,
        plan=plan,
    )
