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

How much of each is exposed (TP and EP overlap flags, CP under the attention core) is decided by
:mod:`costmodel.comm_exposure`.
- **PP** point-to-point: asynchronous sends of ``sp_tokens·h`` BF16 per micro-batch; they cost time
  through the schedule's dependencies (see :mod:`costmodel.pipeline`).
- **DP**: gradient reduce-scatter per bucket (from the optimizer plan) overlapped with backward
  when ``overlap_grad_reduce``; parameter all-gather synchronous after the optimizer step or, with
  ``hide_param_gather``, per bucket in forward order ahead of the next step's first forward.
- **Megatron-FSDP** (``fsdp = dp·cp``): per layer and micro-batch, parameter all-gathers (forward
  and backward) and gradient reduce-scatters (backward) over the dp groups, kind ``dp_fsdp``,
  exposed beyond the layer's compute; no DP buckets (:mod:`costmodel.fsdp`).

``overlap=False`` turns every overlap off (all comm exposed, grad reduce after backward,
synchronous parameter gather): the mode in which the two engines must agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING

from costmodel.comm_exposure import exposed_fraction
from costmodel.compute import operation_time_s
from costmodel.moe_dispatch import dispatch_cost
from costmodel.optimizer.plan_types import OptimizerPlan
from costmodel.pipeline import paired_pass_share
from topologies.collectives import collective_cost
from topologies.groups import GroupShape
from topologies.hardware import SystemSpec
from workloads.operations import (
    ACT_BYTES,
    LayerOps,
    RankShape,
    embedding_operations,
    layer_operations,
    mtp_operations,
    output_operations,
)

if TYPE_CHECKING:
    from workloads.models import ModelSpec
    from workloads.scenario import Scenario

COMM_KINDS = ("tp", "cp", "ep")


@dataclass(frozen=True)
class CommBlock:
    """Aggregated layer collectives of one kind in one pass of one chunk (one micro-batch).

    ``time_s`` is the uncontended time (sum over the collectives), ``latency_s`` its latency part
    (the rest is link occupancy), ``link`` the bottleneck resource, ``exposed_fraction`` the share
    on the compute stream's critical path (the rest overlaps compute).
    """

    kind: str
    time_s: float
    latency_s: float
    link: str  # "nvlink" or "network"
    exposed_fraction: float = 1.0

    @property
    def exposed_s(self) -> float:
        """Seconds on the critical path."""
        return self.time_s * self.exposed_fraction


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
class BucketCost:
    """One DP bucket: its collectives' times and where it sits in its chunk's pass."""

    chunk: int
    group: str
    reduce_s: float
    gather_s: float
    link: str
    bwd_ready_fraction: float  # fraction of the chunk's backward after which the grads are complete
    reduce_latency_s: float = 0.0
    gather_latency_s: float = 0.0

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

    @cached_property
    def work_s(self) -> float:
        """Compute-stream seconds per micro-batch (all chunks, forward + backward)."""
        return sum(c.time_s for c in self.chunks)

    @cached_property
    def forward_buckets(self) -> tuple[BucketCost, ...]:
        """Buckets in the order the next forward needs their parameters (chunk, then position)."""
        return tuple(sorted(self.buckets, key=lambda b: (b.chunk, b.fwd_need_fraction)))

    @cached_property
    def backward_buckets(self) -> tuple[BucketCost, ...]:
        """Buckets in the order their gradients complete (chunks last to first, then position)."""
        return tuple(sorted(self.buckets, key=lambda b: (-b.chunk, b.bwd_ready_fraction)))


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


# ----------------------------------------------------------------------------------------------
def _rank_shape(scenario: Scenario) -> RankShape:
    p = scenario.par
    return RankShape(micro_batch_size=p.micro_batch_size, seq_length=p.seq_length, tp=p.tp, cp=p.cp, ep=p.ep,
                     etp=p.expert_tp, sequence_parallel=p.uses_sequence_parallel and p.tp > 1,
                     precision=scenario.precision.value, microbatches=scenario.num_microbatches)


@lru_cache(maxsize=4096)
def _ops_time(ops: LayerOps, system: SystemSpec) -> tuple[float, float, float, float]:
    """(forward s, backward s, forward attention-core s, backward attention-core s)."""
    f = sum(operation_time_s(o, system) for o in ops.forward)
    b = sum(operation_time_s(o, system) for o in ops.backward)
    fa = sum(operation_time_s(o, system) for o in ops.forward if o.kind == "attention")
    ba = sum(operation_time_s(o, system) for o in ops.backward if o.kind == "attention")
    return f, b, fa, ba


@lru_cache(maxsize=1024)
def _layer_ops(model: ModelSpec, shape: RankShape, kind: str, recompute: str, modules: tuple[str, ...]) -> LayerOps:
    if kind == "embedding":
        return embedding_operations(model, shape)
    if kind == "output":
        return output_operations(model, shape)
    if kind == "mtp":
        return mtp_operations(model, shape, recompute, modules)
    return layer_operations(model, shape, kind == "moe", recompute, modules)


_COLL_CACHE: dict[tuple, tuple[SystemSpec, tuple[float, float, str]]] = {}
_KIND_CACHE: dict[tuple, tuple[ModelSpec, SystemSpec, tuple]] = {}
_CACHE_LIMIT = 20000
_NO_COMM = (0.0, 0.0, "nvlink")


def _coll(op: str, size: float, shape: GroupShape, system: SystemSpec) -> tuple[float, float, str]:
    """(time s, latency s, bottleneck link) of one collective (memoised).

    The link is the one whose per-GPU bytes take longer at its rate: NVLink or the NIC.
    """
    if shape.size <= 1 or size <= 0:
        return _NO_COMM
    key = (op, size, shape, id(system))
    hit = _COLL_CACHE.get(key)
    if hit is not None and hit[0] is system:
        return hit[1]
    cost = collective_cost(op, size, shape, system)
    nvl_Bps = system.nvlink.gpu_bandwidth_Bps
    net_Bps = system.scale_out.nic_bandwidth_Bps * system.scale_out.nics_per_gpu
    link = "network" if cost.network_bytes_per_gpu / net_Bps > cost.nvlink_bytes_per_gpu / nvl_Bps else "nvlink"
    out = (cost.time_s, min(cost.latency_s, cost.time_s), link)
    if len(_COLL_CACHE) > _CACHE_LIMIT:
        _COLL_CACHE.clear()
    _COLL_CACHE[key] = (system, out)  # the entry keeps ``system`` alive, so its id stays unique
    return out


def _link(shape: GroupShape) -> str:
    return "nvlink" if shape.intra_domain else "network"


@dataclass
class _CommAcc:
    time_s: float = 0.0
    latency_s: float = 0.0
    by_link: dict[str, float] = field(default_factory=dict)

    def add(self, t: tuple[float, float, str], count: float = 1.0) -> None:
        self.time_s += t[0] * count
        self.latency_s += t[1] * count
        self.by_link[t[2]] = self.by_link.get(t[2], 0.0) + t[0] * count

    @property
    def link(self) -> str:
        return max(self.by_link, key=lambda k: self.by_link[k]) if self.by_link else "nvlink"


def _layer_comm(scenario: Scenario, shape: RankShape, kind: str, shapes: dict[str, GroupShape],
                attn_s: tuple[float, float], overlap: bool, compute_s: tuple[float, float] = (0.0, 0.0)
                ) -> tuple[tuple[CommBlock, ...], tuple[CommBlock, ...]]:
    """Forward and backward collective blocks of one layer (kind: dense, moe, embedding, output, mtp).

    ``attn_s`` and ``compute_s``: (forward, backward) attention-core and whole-layer compute seconds
    of one micro-batch, which decide what overlaps (:mod:`costmodel.comm_exposure`).
    """
    system, model, p = scenario.system, scenario.model, scenario.par
    h = model.hidden_size
    fwd = {k: _CommAcc() for k in COMM_KINDS}
    bwd = {k: _CommAcc() for k in COMM_KINDS}
    full_recompute = p.recompute == "full"
    moe_recompute = p.recompute == "selective" and "moe" in p.recompute_modules
    attn_recompute = p.recompute == "selective" and "core_attn" in p.recompute_modules
    act = shape.tokens * h * ACT_BYTES
    tps = shapes["tp"]
    if tps.size > 1:
        sp = shape.sequence_parallel
        ag, rs = _coll("all_gather", act, tps, system), _coll("reduce_scatter", act, tps, system)
        ar = _coll("all_reduce", act, tps, system)
        if kind == "embedding":  # vocab-parallel lookup: RS (SP) or AR forward; AG of dy backward (SP)
            fwd["tp"].add(rs if sp else ar)
            if sp:
                bwd["tp"].add(ag)
        elif kind == "output":  # column-parallel logits: AG of x forward (SP); RS dx + AG x (SP) or AR dx
            if sp:
                fwd["tp"].add(ag)
                bwd["tp"].add(rs)
                bwd["tp"].add(ag)
            else:
                bwd["tp"].add(ar)
        else:  # column/row pairs: attention, dense MLP or shared experts (routed experts need none)
            shared = bool(model.moe and model.moe.shared_expert_ffn_hidden_size)
            pairs = 1 + (1 if kind in ("dense", "mtp") or shared else 0)
            if sp:  # fwd AG x + RS y; bwd AG dy + AG x (wgrad) + RS dx
                fwd["tp"].add(ag, pairs)
                fwd["tp"].add(rs, pairs)
                bwd["tp"].add(ag, 2 * pairs)
                bwd["tp"].add(rs, pairs)
            else:  # fwd AR after the row-parallel GEMM; bwd AR after the column-parallel dgrad
                fwd["tp"].add(ar, pairs)
                bwd["tp"].add(ar, pairs)
    cps = shapes["cp"]
    if cps.size > 1 and kind in ("dense", "moe", "mtp"):
        att = model.attention
        if att.kind == "gqa":
            width = 2 * att.num_kv_heads // shape.tp * att.head_dim
        else:
            width = att.num_heads // shape.tp * (att.qk_head_dim + att.qk_pos_emb_head_dim + att.v_head_dim)
        kv = _coll("all_gather", cps.size * shape.tokens * width * ACT_BYTES, cps, system)
        fwd["cp"].add(kv)
        bwd["cp"].add(kv, 2.0)
    eps = shapes["ep"]
    is_moe = kind == "moe" or (kind == "mtp" and model.is_moe_layer(model.num_layers - 1))
    if is_moe and model.moe is not None:
        send = shape.sp_tokens * model.moe.topk * h * ACT_BYTES
        if eps.size > 1:
            a2a = dispatch_cost(shape.sp_tokens, h, model.moe.num_experts, model.moe.topk, eps, system)
            fwd["ep"].add(a2a, 2)
            bwd["ep"].add(a2a, 2)
        etps = shapes["etp"]
        if etps.size > 1:
            gathered = send * etps.size
            for acc in (fwd["ep"], bwd["ep"]):
                acc.add(_coll("all_gather", gathered, etps, system))
                acc.add(_coll("reduce_scatter", gathered, etps, system))
    # recomputed modules repeat their forward collectives in backward (CP's ring runs inside core_attn)
    redo = COMM_KINDS if full_recompute else (("ep",) if moe_recompute else ()) + (("cp",) if attn_recompute else ())
    for k in redo:
        bwd[k].add((fwd[k].time_s, fwd[k].latency_s, fwd[k].link))
    paired = ep_paired_share(scenario)

    def blocks(acc: dict[str, _CommAcc], attn: float, other: float) -> tuple[CommBlock, ...]:
        return tuple(CommBlock(k, a.time_s, a.latency_s, a.link,
                               exposed_fraction(k, a.time_s, p, system.efficiency, overlap, attn, other, paired))
                     for k, a in ((k, acc[k]) for k in COMM_KINDS) if a.time_s > 0)

    return blocks(fwd, attn_s[0], compute_s[1]), blocks(bwd, attn_s[1], compute_s[0])


def ep_paired_share(scenario: Scenario) -> float:
    """Share of passes that overlap their EP all-to-all with a paired micro-batch (1 without EP overlap)."""
    p = scenario.par
    return paired_pass_share(p.pp, p.vpp, scenario.num_microbatches) if p.ep_comm_overlap else 1.0


def _merge(blocks: list[CommBlock]) -> tuple[CommBlock, ...]:
    by: dict[str, list[CommBlock]] = {}
    for b in blocks:
        by.setdefault(b.kind, []).append(b)
    out = []
    for k, bs in by.items():
        t = sum(b.time_s for b in bs)
        exposed = sum(b.exposed_s for b in bs)
        out.append(CommBlock(k, t, sum(b.latency_s for b in bs), bs[0].link, exposed / t if t > 0 else 1.0))
    return tuple(out)


def _chunk_items(scenario: Scenario) -> list[list[str]]:
    """Layer kinds of every virtual stage (index chunk * pp + stage)."""
    model, p = scenario.model, scenario.par
    counts = scenario.virtual_stage_layers
    first_moe = model.moe.first_dense_layers if model.moe is not None else model.num_layers
    items: list[list[str]] = []
    layer = 0
    for n in counts:
        items.append(["moe" if i >= first_moe else "dense" for i in range(layer, layer + n)])
        layer += n
    items[0].insert(0, "embedding")
    items[-1].extend(["mtp"] * model.mtp_layers)
    items[-1].append("output")
    assert len(items) == p.pp * p.vpp
    return items


def _stage_buckets(plan: OptimizerPlan, stage: int, scenario: Scenario, placement, overlap: bool) -> tuple[BucketCost, ...]:  # noqa: ANN001
    sp = next((s for s in plan.stages if s.stage == stage), None)
    if sp is None:
        return ()
    system = scenario.system
    groups: dict[tuple[int, str], int] = {}
    for b in sp.buckets:
        groups[(b.chunk, b.dp_group)] = groups.get((b.chunk, b.dp_group), 0) + b.numel
    seen: dict[tuple[int, str], int] = {}
    out = []
    group_shapes = {g: placement.shape(g) for g in {b.dp_group for b in sp.buckets}}
    for b in sorted(sp.buckets, key=lambda x: x.order):
        shape = group_shapes[b.dp_group]
        if shape.size != b.group_size:
            shape = GroupShape.single_domain(b.group_size) if b.group_size <= shape.ranks_per_domain else shape
        red = _coll(b.reduce_op, b.grad_bytes, shape, system)
        gat = _coll(b.gather_op, b.param_bytes, shape, system) if b.gather_op else _NO_COMM
        key = (b.chunk, b.dp_group)
        seen[key] = seen.get(key, 0) + b.numel
        frac = seen[key] / groups[key] if groups[key] else 1.0
        out.append(BucketCost(b.chunk, b.dp_group, red[0], gat[0], red[2], frac if overlap else 1.0,
                              red[1], gat[1]))
    return tuple(out)


_STAGE_CACHE_LIMIT = 2048  # entries keep their plans alive: bounded like the planner's plan cache
_STAGE_CACHE: dict[tuple, tuple[OptimizerPlan, SystemSpec, tuple[tuple[BucketCost, ...], float, float]]] = {}


def _stage_optimizer(plan: OptimizerPlan, stage: int, scenario: Scenario, placement,  # noqa: ANN001
                     overlap: bool) -> tuple[tuple[BucketCost, ...], float, float]:
    """(DP buckets, optimizer compute s, optimizer TP comm s) of one stage, memoised per plan,
    stage, placement shapes of the plan's dp groups, system and overlap (candidates sharing a plan
    share them)."""
    system = scenario.system
    shapes = tuple(placement.shape(g) for g in ("dp", "expert_dp"))
    key = (id(plan), stage, shapes, id(system), overlap)
    hit = _STAGE_CACHE.get(key)
    if hit is not None and hit[0] is plan and hit[1] is system:
        return hit[2]
    sp = next((x for x in plan.stages if x.stage == stage), None)
    crit = max(sp.ranks, key=lambda r: r.total_s) if sp and sp.ranks else None
    out = (_stage_buckets(plan, stage, scenario, placement, overlap),
           (crit.newton_schulz_s + crit.elementwise_s) if crit else 0.0, crit.tp_comm_s if crit else 0.0)
    if len(_STAGE_CACHE) > _STAGE_CACHE_LIMIT:
        _STAGE_CACHE.clear()
    _STAGE_CACHE[key] = (plan, system, out)  # identity-checked: the entry keeps plan and system alive
    return out


def build_step_structure(scenario: Scenario, overlap: bool = True, plan: OptimizerPlan | None = None) -> StepStructure:
    """The step's structure for ``scenario`` (raises UnsupportedScenario for hybrid FSDP sharding).

    ``plan``: the scenario's optimizer plan when the caller already has it (the planner shares
    plans between candidates that differ only in settings the plan does not depend on).
    """
    from costmodel.engine import UnsupportedScenario
    from costmodel.fsdp import add_fsdp_blocks, fsdp_unsupported_reason
    from costmodel.optimizer.plan import build_optimizer_plan
    from topologies.placement import placement_for

    p = scenario.par
    reason = fsdp_unsupported_reason(scenario)
    if reason is not None:
        raise UnsupportedScenario(reason)
    system, model = scenario.system, scenario.model
    shape = _rank_shape(scenario)
    placement = placement_for(scenario)
    shapes = {k: placement.shape(k) for k in ("tp", "cp", "ep", "etp", "pp")}
    recompute, modules = p.recompute, tuple(p.recompute_modules)
    items = _chunk_items(scenario)
    per_kind: dict[str, tuple[float, float, tuple[CommBlock, ...], tuple[CommBlock, ...]]] = {}
    for kind in sorted({k for kinds in items for k in kinds}):
        key = (id(model), id(system), shape, kind, recompute, modules, tuple(shapes.values()), overlap,
               p.uses_sequence_parallel, p.recompute_modules, p.tp_comm_overlap, p.ep_comm_overlap,
               ep_paired_share(scenario))
        hit = _KIND_CACHE.get(key)
        if hit is not None and hit[0] is model and hit[1] is system:
            per_kind[kind] = hit[2]
            continue
        ops = _layer_ops(model, shape, kind, recompute, modules)
        f, b, fa, ba = _ops_time(ops, system)
        cf, cb = _layer_comm(scenario, shape, kind, shapes, (fa, ba), overlap, (f, b))
        per_kind[kind] = (f, b, cf, cb)
        if len(_KIND_CACHE) > _CACHE_LIMIT:
            _KIND_CACHE.clear()
        _KIND_CACHE[key] = (model, system, per_kind[kind])  # identity-checked: ids cannot be reused
    if p.fsdp > 0:
        add_fsdp_blocks(scenario, placement, per_kind, overlap)
    plan = build_optimizer_plan(scenario) if plan is None else plan
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
                cf = _merge([blk for k in kinds for blk in per_kind[k][2]])
                cb = _merge([blk for k in kinds for blk in per_kind[k][3]])
                layers = sum(1 for k in kinds if k in ("dense", "moe", "mtp"))
                shared = passes[kinds] = (layers, PassCost(f, cf), PassCost(b, cb))
            chunks.append(ChunkCost(s, c, *shared))
        buckets, opt_compute_s, opt_tp_s = _stage_optimizer(plan, s, scenario, placement, overlap)
        stages.append(StageCost(stage=s, chunks=tuple(chunks), buckets=buckets,
                                optimizer_compute_s=opt_compute_s, optimizer_tp_s=opt_tp_s))
    pps = shapes["pp"]
    p2p_bytes = float(shape.sp_tokens * model.hidden_size * ACT_BYTES)
    pair = GroupShape(2, 2, 1) if pps.intra_domain else GroupShape(2, 1, 2)
    p2p, p2p_lat, _ = _coll("send_recv", p2p_bytes, pair, system) if p.pp > 1 else _NO_COMM
    opt = scenario.optimizer
    return StepStructure(
        pp=p.pp, vpp=p.vpp, microbatches=scenario.num_microbatches, stages=tuple(stages),
        p2p_s=p2p, p2p_latency_s=p2p_lat, p2p_bytes=p2p_bytes, p2p_link=_link(pair), overlap=overlap,
        overlap_grad_reduce=overlap and opt.overlap_grad_reduce,
        hide_param_gather=overlap and opt.hide_param_gather,
        compute_slowdown=system.efficiency.overlap_compute_slowdown if overlap else 0.0,
        plan=plan,
    )
