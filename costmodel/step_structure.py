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
  (:mod:`costmodel.iteration_work`); so is the weight-hash check across DP replicas
  (``check_weight_hash_interval``: host copies, FP32 casts and SHA-1 of every parameter).
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

from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING

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
from costmodel.optimizer.plan_types import OptimizerPlan
from costmodel.stage_buckets import BucketCost, bucket_views, plan_stage_parts
from topologies.groups import GroupShape
from topologies.identity_memo import IdentityMemo
from workloads.fp8_params import layer_kept_bf16
from workloads.operations import ACT_BYTES

if TYPE_CHECKING:
    from workloads.scenario import Scenario

# (layer_cache_key without the kind, overlap) -> {kind: costs}; model, system by identity. An entry
# holds a layout's kinds (3 to ~8): a quarter of CACHE_LIMIT layouts keeps about as many kind costs
# alive as CACHE_LIMIT entries of one kind each did
_KIND_CACHE: IdentityMemo[dict[str, tuple]] = IdentityMemo(CACHE_LIMIT // 4)


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
    """One block per kind (in order of first appearance) summing the kind's blocks in list order (the
    sums of ``sum()`` over them, taken in one pass): time, exposed time, latency, bytes; the first
    block's link."""
    by: dict[str, list] = {}  # kind -> [time, exposed, latency, bytes, link]; sums from 0 as sum() does
    for b in blocks:
        acc = by.get(b.kind)
        if acc is None:
            acc = by[b.kind] = [0, 0, 0, 0, b.link]
        acc[0] += b.time_s
        acc[1] += b.exposed_s
        acc[2] += b.latency_s
        acc[3] += b.bytes
    return tuple(CommBlock(k, t, latency, link, exposed / t if t > 0 else 1.0, nbytes)
                 for k, (t, exposed, latency, nbytes, link) in by.items())


def _chunk_items(scenario: Scenario) -> tuple[tuple[str, ...], ...]:
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
    return items


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
    # one key for every kind of the layout (the kind is all that differs): built and hashed once
    key = (layer_cache_key(scenario, shape, "", shapes), overlap)
    costs = _KIND_CACHE.get(key, model, system)
    if costs is None:
        costs = _KIND_CACHE.put({}, key, model, system)
    per_kind: dict[str, tuple[float, float, tuple[CommBlock, ...], tuple[CommBlock, ...]]] = {}
    for kind in sorted({k for kinds in items for k in kinds}):
        hit = costs.get(kind)
        per_kind[kind] = hit if hit is not None else costs.setdefault(
            kind, layer_kind_costs(scenario, shape, kind, shapes, overlap))
    if p.fsdp > 0:
        add_fsdp_blocks(scenario, placement, per_kind, overlap)
    add_offload_blocks(scenario, per_kind, overlap)
    plan = build_optimizer_plan(scenario) if plan is None else plan
    rt = scenario.runtime
    tail_work = rt.log_num_zeros_in_grad or rt.log_params_norm or rt.check_weight_hash_interval is not None
    if tail_work:  # per-iteration logging and weight-hash work in the optimizer tail (costmodel.iteration_work)
        from costmodel.iteration_work import logging_s, weight_hash_check_s
        from workloads.inventory import inventory_for

        inventory = inventory_for(scenario)
    pps = shapes["pp"]
    p2p_bytes = float(shape.sp_tokens * model.hidden_size * ACT_BYTES)
    pair = GroupShape(2, 2, 1) if pps.intra_domain else GroupShape(2, 1, 2)
    p2p, p2p_lat, _ = collective_s("send_recv", p2p_bytes, pair, system) if p.pp > 1 else NO_COMM
    # interleaved schedule without overlap_p2p_comm: every pass waits for its batched send/receive
    blocking = (CommBlock("pp", p2p, p2p_lat, domain_link(pair)),) if p.pp > 1 and p.vpp > 1 \
        and not scenario.runtime.overlap_p2p_comm else ()
    parts = plan_stage_parts(plan, p.pp, system, placement, overlap)
    stages = []
    passes: dict[tuple[str, ...], tuple[int, PassCost, PassCost]] = {}  # chunks with the same layers share them
    for s in range(p.pp):
        chunks = []
        for c in range(p.vpp):
            kinds = items[c * p.pp + s]
            shared = passes.get(kinds)
            if shared is None:
                f = sum(per_kind[k][0] for k in kinds)
                b = sum(per_kind[k][1] for k in kinds)
                cf = _merge([blk for k in kinds for blk in per_kind[k][2]] + list(blocking))
                cb = _merge([blk for k in kinds for blk in per_kind[k][3]] + list(blocking))
                layers = sum(1 for k in kinds if base_kind(k) in ("dense", "moe", "mtp"))
                shared = passes[kinds] = (layers, PassCost(f, cf), PassCost(b, cb))
            chunks.append(ChunkCost(s, c, *shared))
        buckets, opt_compute_s, opt_tp_s, embd, prescale_s = parts[s]
        if tail_work:
            tensors = inventory.stage_tensors(s)
            opt_compute_s += logging_s(scenario, tensors, placement.shape("world")) + weight_hash_check_s(scenario, tensors)
        stages.append(StageCost(stage=s, chunks=tuple(chunks), buckets=buckets,
                                optimizer_compute_s=opt_compute_s, optimizer_tp_s=opt_tp_s,
                                embedding_grad_s=embd[0], embedding_grad_latency_s=embd[1],
                                embedding_grad_link=embd[2], grad_prescale_s=prescale_s))
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
