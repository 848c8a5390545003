"""One layer's costs for one micro-batch on one rank: compute time and its collectives.

:func:`layer_ops` lists the operations (:mod:`workloads.operations`), :func:`ops_time` prices them
(:mod:`costmodel.compute` per kernel, :mod:`costmodel.kernels` per pass, with the CUDA-graph capture
of :mod:`costmodel.cuda_graphs`), :func:`layer_comm` builds the TP / CP / EP collectives of the forward
and backward pass as :class:`CommBlock` s, with the exposed share decided by
:mod:`costmodel.comm_exposure`. :func:`layer_cache_key` names everything these depend on (the step
structure and the planner's bound cache them by it). Times in seconds, sizes in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING

from costmodel.comm_exposure import ep_paired_share, exposed_fraction
from costmodel.compute import operation_time_s
from costmodel.cuda_graphs import NO_GRAPHS, GraphCapture
from costmodel.kernels import StreamCost
from costmodel.moe_dispatch import allgather_dispatch_calls, dispatch_cost
from topologies.collectives import collective_cost
from topologies.groups import GroupShape
from topologies.hardware import SystemSpec
from workloads.operations import (
    ACT_BYTES,
    LayerOps,
    Operation,
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
LAYER_GROUP_KINDS = ("tp", "cp", "ep", "etp", "etp_ep", "pp")  # placement shapes layer_comm reads


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


def rank_shape(scenario: Scenario) -> RankShape:
    p = scenario.par
    return RankShape(micro_batch_size=p.micro_batch_size, seq_length=p.seq_length, tp=p.tp, cp=p.cp, ep=p.ep,
                     etp=p.expert_tp, sequence_parallel=p.uses_sequence_parallel and p.tp > 1,
                     precision=scenario.precision.value, microbatches=scenario.num_microbatches,
                     moe_dispatcher=scenario.runtime.moe_token_dispatcher_type if scenario.model.moe else "flex")


def pass_stream(ops: tuple[Operation, ...], system: SystemSpec, capture: GraphCapture = NO_GRAPHS,
                kind: str = "dense") -> StreamCost:
    """GPU and host-issue seconds of one pass (forward or backward) of one layer of ``kind``.

    Uncaptured kernels cost ``kernel_issue_s`` each on the host, captured ones none; each graph
    replay costs one issue. The pass takes ``max(Σ GPU, Σ issue)`` (:mod:`costmodel.kernels`).
    """
    gpu = launches = captured = 0.0
    for o in ops:
        gpu += operation_time_s(o, system)
        launches += o.kernels
        if capture.captures(o, kind):
            captured += o.kernels
    issued = launches - captured + capture.graphs_per_pass(kind)
    return StreamCost(gpu, issued * system.efficiency.kernel_issue_s, launches, captured)


@lru_cache(maxsize=4096)
def ops_time(ops: LayerOps, system: SystemSpec, capture: GraphCapture = NO_GRAPHS,
             kind: str = "dense") -> tuple[float, float, float, float]:
    """(forward s, backward s, forward attention-core s, backward attention-core s) of one layer.

    Pass times are kernel-level (:func:`pass_stream`); attention-core seconds are GPU time.
    """
    f = pass_stream(ops.forward, system, capture, kind).time_s
    b = pass_stream(ops.backward, system, capture, kind).time_s
    fa = sum(operation_time_s(o, system) for o in ops.forward if o.kind == "attention")
    ba = sum(operation_time_s(o, system) for o in ops.backward if o.kind == "attention")
    return f, b, fa, ba


@lru_cache(maxsize=1024)
def layer_ops(model: ModelSpec, shape: RankShape, kind: str, recompute: str, modules: tuple[str, ...]) -> LayerOps:
    if kind == "embedding":
        return embedding_operations(model, shape)
    if kind == "output":
        return output_operations(model, shape)
    if kind == "mtp":
        return mtp_operations(model, shape, recompute, modules)
    return layer_operations(model, shape, kind == "moe", recompute, modules)


BF16_SUFFIX = ":bf16"  # a layer kind kept in BF16 (first_last_layers_bf16): e.g. "dense:bf16"


def split_kind(kind: str, shape: RankShape) -> tuple[str, RankShape]:
    """(the layer kind without a BF16 mark, the rank shape its operations run at): a layer kept in
    BF16 by ``first_last_layers_bf16`` runs its GEMMs in BF16 (no quantization casts) whatever the
    scenario's precision; its activations and collectives are the same bf16 tensors."""
    if kind.endswith(BF16_SUFFIX):
        return kind[:-len(BF16_SUFFIX)], replace(shape, precision="bf16")
    return kind, shape


COLL_CACHE: dict[tuple, tuple[SystemSpec, tuple[float, float, str]]] = {}
CACHE_LIMIT = 20000
NO_COMM = (0.0, 0.0, "nvlink")


def collective_s(op: str, size: float, shape: GroupShape, system: SystemSpec) -> tuple[float, float, str]:
    """(time s, latency s, bottleneck link) of one collective (memoised).

    The link is the one whose per-GPU bytes take longer at its rate: NVLink or the NIC.
    """
    if shape.size <= 1 or size <= 0:
        return NO_COMM
    key = (op, size, shape, id(system))
    hit = COLL_CACHE.get(key)
    if hit is not None and hit[0] is system:
        return hit[1]
    cost = collective_cost(op, size, shape, system)
    nvl_Bps = system.nvlink.gpu_bandwidth_Bps
    net_Bps = system.scale_out.nic_bandwidth_Bps * system.scale_out.nics_per_gpu
    link = "network" if cost.network_bytes_per_gpu / net_Bps > cost.nvlink_bytes_per_gpu / nvl_Bps else "nvlink"
    out = (cost.time_s, min(cost.latency_s, cost.time_s), link)
    if len(COLL_CACHE) > CACHE_LIMIT:
        COLL_CACHE.clear()
    COLL_CACHE[key] = (system, out)  # the entry keeps ``system`` alive, so its id stays unique
    return out


def domain_link(shape: GroupShape) -> str:
    return "nvlink" if shape.intra_domain else "network"


@dataclass
class CommAcc:
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


def layer_comm(scenario: Scenario, shape: RankShape, kind: str, shapes: dict[str, GroupShape],
                attn_s: tuple[float, float], overlap: bool, compute_s: tuple[float, float] = (0.0, 0.0)
                ) -> tuple[tuple[CommBlock, ...], tuple[CommBlock, ...]]:
    """Forward and backward collective blocks of one layer (kind: dense, moe, embedding, output, mtp).

    ``attn_s`` and ``compute_s``: (forward, backward) attention-core and whole-layer compute seconds
    of one micro-batch, which decide what overlaps (:mod:`costmodel.comm_exposure`).
    """
    system, model, p = scenario.system, scenario.model, scenario.par
    h = model.hidden_size
    fwd = {k: CommAcc() for k in COMM_KINDS}
    bwd = {k: CommAcc() for k in COMM_KINDS}
    full_recompute = p.recompute == "full"
    moe_recompute = p.recompute == "selective" and "moe" in p.recompute_modules
    attn_recompute = p.recompute == "selective" and "core_attn" in p.recompute_modules
    act = shape.tokens * h * ACT_BYTES
    tps = shapes["tp"]
    if tps.size > 1:
        sp = shape.sequence_parallel
        ag, rs = collective_s("all_gather", act, tps, system), collective_s("reduce_scatter", act, tps, system)
        ar = collective_s("all_reduce", act, tps, system)
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
        kv = collective_s("all_gather", cps.size * shape.tokens * width * ACT_BYTES, cps, system)
        fwd["cp"].add(kv)
        bwd["cp"].add(kv, 2.0)
    eps = shapes["ep"]
    is_moe = kind == "moe" or (kind == "mtp" and model.is_moe_layer(model.num_layers - 1))
    if is_moe and model.moe is not None and shape.moe_dispatcher == "allgather":
        group = shapes["etp_ep"]
        calls = allgather_dispatch_calls(shape.sp_tokens, h, model.moe.num_experts, group.size)
        for acc, pass_calls in zip((fwd["ep"], bwd["ep"]), calls, strict=True):
            for c in pass_calls:
                acc.add(collective_s(c.op, c.bytes, group, system))
    elif is_moe and model.moe is not None:
        send = shape.sp_tokens * model.moe.topk * h * ACT_BYTES
        if eps.size > 1:
            a2a = dispatch_cost(shape.sp_tokens, h, model.moe.num_experts, model.moe.topk, eps, system)
            fwd["ep"].add(a2a, 2)
            bwd["ep"].add(a2a, 2)
        etps = shapes["etp"]
        if etps.size > 1:
            gathered = send * etps.size
            for acc in (fwd["ep"], bwd["ep"]):
                acc.add(collective_s("all_gather", gathered, etps, system))
                acc.add(collective_s("reduce_scatter", gathered, etps, system))
    # recomputed modules repeat their forward collectives in backward (CP's ring runs inside core_attn)
    redo = COMM_KINDS if full_recompute else (("ep",) if moe_recompute else ()) + (("cp",) if attn_recompute else ())
    for k in redo:
        bwd[k].add((fwd[k].time_s, fwd[k].latency_s, fwd[k].link))
    paired = ep_paired_share(scenario)

    def blocks(acc: dict[str, CommAcc], attn: float, other: float) -> tuple[CommBlock, ...]:
        return tuple(CommBlock(k, a.time_s, a.latency_s, a.link,
                               exposed_fraction(k, a.time_s, p, system.efficiency, overlap, attn, other, paired))
                     for k, a in ((k, acc[k]) for k in COMM_KINDS) if a.time_s > 0)

    return blocks(fwd, attn_s[0], compute_s[1]), blocks(bwd, attn_s[1], compute_s[0])


def layer_cache_key(scenario: Scenario, shape: RankShape, kind: str, shapes: dict[str, GroupShape]) -> tuple:
    """Everything one layer's compute and collective costs depend on besides ``overlap``.

    Shared by this module's cache and the planner's bound (:mod:`costmodel.planner.bound`); model
    and system are keyed by identity, so caches must also hold the objects.
    """
    p = scenario.par
    return (id(scenario.model), id(scenario.system), shape, kind, p.recompute, tuple(p.recompute_modules),
            tuple(shapes.values()), p.uses_sequence_parallel, p.tp_comm_overlap, p.ep_comm_overlap,
            ep_paired_share(scenario), GraphCapture.of(scenario.runtime))
