"""One layer's costs for one micro-batch on one rank: the building blocks.

:func:`layer_ops` lists the operations (:mod:`workloads.operations`), :func:`ops_time` prices them
(:mod:`costmodel.compute` per kernel, :mod:`costmodel.kernels` per pass, with the CUDA-graph capture
of :mod:`costmodel.cuda_graphs` and the host synchronisations of :func:`pass_time_s`),
:func:`layer_parts` names the GEMM and expert seconds the overlap mechanisms need, and
:func:`collective_s` prices one collective. :mod:`costmodel.layer_comm` builds the layer's TP / CP /
EP collectives from them. :func:`layer_cache_key` names everything these depend on (the step
structure and the planner's bound cache them by it). Times in seconds, sizes in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING

from costmodel.comm_exposure import ep_paired_share
from costmodel.compute import operation_time_s
from costmodel.cuda_graphs import NO_GRAPHS, GraphCapture
from costmodel.kernels import StreamCost
from topologies.collectives import collective_cost
from topologies.groups import GroupShape
from topologies.hardware import SystemSpec
from topologies.identity_memo import IdentityMemo
from workloads.layer_assembly import layer_operations
from workloads.operations import KernelOptions, LayerOps, Operation, RankShape
from workloads.stage_end_operations import embedding_operations, mtp_operations, output_operations

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
    bytes: float = 0.0  # message bytes of the collectives (nccl-tests sizes, summed); 0: not recorded

    @property
    def exposed_s(self) -> float:
        """Seconds on the critical path."""
        return self.time_s * self.exposed_fraction


# Megatron-FSDP strategies whose gradients are sharded (reduce-scattered every micro-batch, no unsharded
# main_grad kept): a gradient arriving in param.grad is copied into the bucket (workloads.operations)
FSDP_SHARDED_GRADS = ("optim_grads", "optim_grads_params")
HOST_SYNC_DISPATCH = ("alltoall", "allgather")  # dispatchers whose token counts go to the host (cuda_sync_point)


def kernel_options(scenario: Scenario) -> KernelOptions:
    """The recipe settings that change a layer's kernels (:class:`workloads.operations.KernelOptions`)."""
    rt = scenario.runtime
    moe = scenario.model.moe is not None
    sync = moe and (rt.moe_token_dispatcher_type in HOST_SYNC_DISPATCH
                    or (rt.moe_token_dispatcher_type == "flex" and rt.moe_flex_dispatcher_backend == "deepep"))
    opt = scenario.optimizer
    sharded = scenario.par.fsdp > 0 and opt.data_parallel_sharding_strategy in FSDP_SHARDED_GRADS
    return KernelOptions(router_fusion=rt.moe_router_fusion, permute_fusion=rt.moe_permute_fusion,
                         router_dtype=rt.moe_router_dtype or "bf16", grouped_gemm=rt.moe_grouped_gemm,
                         gradient_accumulation_fusion=rt.gradient_accumulation_fusion,
                         cross_entropy_fusion=rt.cross_entropy_loss_fusion, dispatcher_host_sync=sync,
                         unfused_attention=rt.unfused_attention, local_spec=rt.transformer_impl == "local",
                         sharded_grad_copy=sharded,
                         grad_bytes=opt.grad_bytes if sharded else 4,
                         grad_shard=scenario.par.fsdp if sharded else 1,
                         expert_grad_shard=scenario.expert_dp if sharded else 1)


def rank_shape(scenario: Scenario) -> RankShape:
    """What one rank sees of one micro-batch, with the recipe's kernel options."""
    p = scenario.par
    return RankShape(micro_batch_size=p.micro_batch_size, seq_length=p.seq_length, tp=p.tp, cp=p.cp, ep=p.ep,
                     etp=p.expert_tp, sequence_parallel=p.uses_sequence_parallel and p.tp > 1,
                     precision=scenario.precision.value, microbatches=scenario.num_microbatches,
                     moe_dispatcher=scenario.runtime.moe_token_dispatcher_type if scenario.model.moe else "flex",
                     options=kernel_options(scenario))


def pass_stream(ops: tuple[Operation, ...], system: SystemSpec, capture: GraphCapture = NO_GRAPHS,
                kind: str = "dense", framework_s: float = 0.0, times_s: tuple[float, ...] | None = None,
                captured_ops: tuple[bool, ...] | None = None) -> StreamCost:
    """GPU and host-issue seconds of one pass (forward or backward) of one layer of ``kind``.

    Uncaptured kernels cost ``kernel_issue_s`` each on the host, captured ones none; each graph
    replay costs one issue; ``framework_s`` is the pass's framework host time beyond the launches
    (:func:`framework_host_s`). The pass takes ``max(Σ GPU, Σ issue)`` (:mod:`costmodel.kernels`).
    ``times_s``: each operation's :func:`operation_time_s` when the caller has them already;
    ``captured_ops``: each operation's ``capture.captures(o, kind)`` likewise.
    """
    gpu = launches = captured = 0.0
    if times_s is None:
        times_s = tuple(operation_time_s(o, system) for o in ops)
    if captured_ops is None:
        captured_ops = captured_flags(ops, capture, kind)
    for o, t, c in zip(ops, times_s, captured_ops, strict=True):
        gpu += t
        launches += o.kernels
        if c:
            captured += o.kernels
    issued = launches - captured + capture.graphs_per_pass(kind)
    return StreamCost(gpu, issued * system.efficiency.kernel_issue_s + framework_s, launches, captured)


def captured_flags(ops: tuple[Operation, ...], capture: GraphCapture, kind: str) -> tuple[bool, ...]:
    """Whether each of ``ops`` (of a layer of ``kind``) is replayed from a CUDA graph."""
    if not capture.whole_iteration and capture.graphs_per_pass(kind) == 0:  # no graph covers this layer
        return (False,) * len(ops)
    return tuple(capture.captures(o, kind) for o in ops)


TRANSFORMER_KINDS = ("dense", "moe", "mtp")


def framework_host_s(ops: LayerOps, system: SystemSpec, capture: GraphCapture = NO_GRAPHS,
                     kind: str = "dense",
                     captured_ops: tuple[tuple[bool, ...], tuple[bool, ...]] | None = None) -> tuple[float, float]:
    """(forward, backward) host seconds of the framework's Python for one transformer layer of one
    micro-batch, beyond its kernel launches: Megatron-Core's module hierarchy, Transformer Engine's
    module logic and the autograd bookkeeping (``EfficiencyFactors.layer_host_s`` per pass), plus
    the MoE block's router, token dispatcher and expert modules in an MoE layer (``moe_host_s``).

    Forward and backward each cost ``layer_host_s``; a backward that recomputes forward work adds
    that work's share of the forward operations (full recompute: one more forward); operations
    replayed from a CUDA graph skip their Python, so each pass keeps only its uncaptured operations'
    share. The share is counted in operations (:func:`python_calls`), not kernels: the Python runs
    once per operation however many kernels its C++ launches (TE's grouped GEMM issues one GEMM per
    local expert from one ``general_grouped_gemm`` call; those launches cost ``kernel_issue_s`` each).
    Embedding and output blocks count none (their host time is their kernels' issue time).
    ``captured_ops``: (forward, backward) :func:`captured_flags` when the caller has them already.
    """
    if kind not in TRANSFORMER_KINDS:
        return 0.0, 0.0
    if captured_ops is None:
        captured_ops = (captured_flags(ops.forward, capture, kind), captured_flags(ops.backward, capture, kind))

    def eager(part: tuple[tuple[Operation, bool], ...]) -> float:
        return sum(python_calls(o) for o, c in part if not c)

    backward = tuple(zip(ops.backward, captured_ops[1], strict=True))
    recomputed = tuple(oc for oc in backward if oc[0].name.startswith("recompute."))
    own = tuple(oc for oc in backward if not oc[0].name.startswith("recompute."))
    return framework_share_s(kind, system, sum(python_calls(o) for o in ops.forward),
                             eager(tuple(zip(ops.forward, captured_ops[0], strict=True))),
                             sum(python_calls(o) for o, _ in own), eager(own), eager(recomputed), ops.local_spec)


def framework_share_s(kind: str, system: SystemSpec, fwd_calls: float, fwd_eager: float, own_calls: float,
                      own_eager: float, recomputed_eager: float, local_spec: bool = False) -> tuple[float, float]:
    """(forward, backward) framework host seconds of one layer pass pair from its framework calls
    (:func:`python_calls` counts): all forward ones, the forward's eager (uncaptured) ones, the
    backward's own (not recomputed) ones, their eager ones and the recomputed eager ones. The rule
    of :func:`framework_host_s`, shared with the planner's layer template. ``local_spec``: a layer of
    Megatron's local spec, whose per-pass time is ``local_spec_host_fraction`` of the TE spec's."""
    if kind not in TRANSFORMER_KINDS or fwd_calls <= 0:
        return 0.0, 0.0
    eff = system.efficiency
    per_pass = eff.layer_host_s + (eff.moe_host_s if kind == "moe" else 0.0)
    if local_spec:
        per_pass *= eff.local_spec_host_fraction
    fwd = per_pass * fwd_eager / fwd_calls
    bwd = per_pass * (own_eager / own_calls if own_calls else 0.0) + per_pass * recomputed_eager / fwd_calls
    return fwd, bwd


def python_calls(op: Operation) -> float:
    """Framework (Python) calls of one operation: 1 when it launches any kernel, else 0.

    The unit in which :func:`framework_host_s` shares a pass's framework host time between
    operations (and :func:`pass_windows` between host-synchronisation windows): Megatron-Core and
    Transformer Engine run their module Python once per operation whatever the number of kernels
    its C++ then launches (a grouped GEMM's per-expert GEMMs, a fused cast's per-tensor kernels)."""
    return python_calls_of(op.kernels)


def python_calls_of(launches: float) -> float:
    """:func:`python_calls` of an operation that launches ``launches`` kernels (count)."""
    return 1.0 if launches > 0 else 0.0


def pass_windows(ops: tuple[Operation, ...], system: SystemSpec, capture: GraphCapture = NO_GRAPHS,
                 kind: str = "dense", framework_s: float = 0.0,
                 times_s: tuple[float, ...] | None = None,
                 captured_ops: tuple[bool, ...] | None = None) -> tuple[float, float]:
    """(seconds, host slack seconds) of one pass on the compute stream: :func:`pass_stream` per
    window between host synchronisations. An operation marked ``host_sync`` (the dispatcher's token
    counts copied to the host) ends a window: the host waits ``host_sync_s`` for the GPU to drain and
    copy, and cannot issue the next window's kernels ahead, so each window costs
    ``max(Σ GPU, Σ issue)`` on its own. Captured (CUDA-graph) work never syncs: Megatron cannot
    capture a host synchronisation. ``framework_s`` (:func:`framework_host_s`) is shared by the
    windows in proportion to their operations (:func:`python_calls`); the slack is what the GPU waits for the host.
    ``times_s``: each operation's :func:`operation_time_s` when the caller has them already;
    ``captured_ops``: their :func:`captured_flags` likewise."""
    if times_s is None:
        times_s = tuple(operation_time_s(o, system) for o in ops)
    if captured_ops is None:
        captured_ops = captured_flags(ops, capture, kind)
    cuts = [i for i, o in enumerate(ops) if o.host_sync and i > 0 and not captured_ops[i]]
    bounds = list(zip([0, *cuts], [*cuts, len(ops)], strict=True))
    calls = sum(python_calls(o) for o in ops) or 1.0
    total = slack = 0.0
    for a, b in bounds:
        window = ops[a:b]
        share = framework_s * sum(python_calls(o) for o in window) / calls
        st = pass_stream(window, system, capture, kind, share, times_s[a:b], captured_ops[a:b])
        total += st.time_s
        slack += max(0.0, st.issue_s - st.gpu_s)
    return total + system.efficiency.host_sync_s * len(cuts), slack


def pass_time_s(ops: tuple[Operation, ...], system: SystemSpec, capture: GraphCapture = NO_GRAPHS,
                kind: str = "dense", framework_s: float = 0.0) -> float:
    """Seconds of one pass on the compute stream (:func:`pass_windows`)."""
    return pass_windows(ops, system, capture, kind, framework_s)[0]


@lru_cache(maxsize=4096)
def layer_passes(ops: LayerOps, system: SystemSpec, capture: GraphCapture = NO_GRAPHS,
                 kind: str = "dense") -> tuple[tuple[float, float], tuple[float, float]]:
    """((forward s, forward host slack s), (backward s, backward host slack s)) of one layer
    (:func:`pass_windows` with the framework's host time, :func:`framework_host_s`)."""
    host_f, host_b = framework_host_s(ops, system, capture, kind)
    times_f, times_b = op_times_s(ops, system)
    return (pass_windows(ops.forward, system, capture, kind, host_f, times_f),
            pass_windows(ops.backward, system, capture, kind, host_b, times_b))


@lru_cache(maxsize=4096)
def op_times_s(ops: LayerOps, system: SystemSpec) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(forward, backward) GPU seconds of each operation of one layer (:func:`operation_time_s`),
    computed once for the pass times, the attention-core times and the layer parts."""
    return priced_ops_s(ops, system)


def priced_ops_s(ops: LayerOps, system: SystemSpec) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """:func:`op_times_s` without its cache of layers (for a caller that prices a layer once: the
    cache would hash every operation of it and the system once more); operations are priced once
    per system all the same."""
    prices = _OP_PRICES.get((), system)
    if prices is None:
        prices = _OP_PRICES.put({}, (), system)
    if len(prices) > OP_PRICES_LIMIT:
        prices.clear()
    return _priced(ops.forward, system, prices), _priced(ops.backward, system, prices)


# per system (by identity): operation -> operation_time_s. The layers of different layouts share most
# operations (a MoE layer's attention block does not change with the expert layout; its norms and
# element-wise work recur across layer kinds), and hashing one costs a seventh of pricing it.
_OP_PRICES: IdentityMemo[dict[Operation, float]] = IdentityMemo(64)
OP_PRICES_LIMIT = 200_000


def _priced(ops: tuple[Operation, ...], system: SystemSpec, prices: dict[Operation, float]) -> tuple[float, ...]:
    """:func:`operation_time_s` of each of ``ops``, looked up in (or added to) ``prices``."""
    out = []
    for o in ops:
        t = prices.get(o)
        if t is None:
            t = prices[o] = operation_time_s(o, system)
        out.append(t)
    return tuple(out)


@lru_cache(maxsize=4096)
def ops_time(ops: LayerOps, system: SystemSpec, capture: GraphCapture = NO_GRAPHS,
             kind: str = "dense") -> tuple[float, float, float, float]:
    """(forward s, backward s, forward attention-core s, backward attention-core s) of one layer.

    Pass times are kernel-level (:func:`pass_time_s`); attention-core seconds are GPU time.
    """
    (f, _), (b, _) = layer_passes(ops, system, capture, kind)
    times_f, times_b = op_times_s(ops, system)
    fa = sum(t for o, t in zip(ops.forward, times_f, strict=True) if o.kind == "attention")
    ba = sum(t for o, t in zip(ops.backward, times_b, strict=True) if o.kind == "attention")
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


def bf16_shape(kind: str, shape: RankShape) -> RankShape:
    """The rank shape a layer of ``kind`` runs its operations at: a layer kept in BF16 by
    ``first_last_layers_bf16`` (kind marked ``:bf16``) runs its GEMMs in BF16 (no quantization casts)
    whatever the scenario's precision; its activations and collectives are the same bf16 tensors."""
    return replace(shape, precision="bf16") if BF16_SUFFIX in kind else shape


@dataclass(frozen=True)
class LayerParts:
    """GPU seconds of the parts of one layer the overlap mechanisms need (one micro-batch)."""

    gemm_s: dict[str, float]  # GEMM operations by name ('linear_qkv', 'mlp.linear_fc1.dgrad', ...)
    shared_expert_s: tuple[float, float] = (0.0, 0.0)  # (forward, backward) of the shared experts
    expert_wgrad_s: float = 0.0  # the routed experts' weight-gradient GEMMs (backward)
    mlp_side_s: tuple[float, float] = (0.0, 0.0)  # (fwd, bwd) between dispatch and combine: experts, shared experts
    attn_side_s: tuple[float, float] = (0.0, 0.0)  # (fwd, bwd) the rest: norms, attention, router (recompute incl.)


MLP_SIDE_MODULES = frozenset({"moe", "moe_act", "shared_experts"})


@lru_cache(maxsize=4096)
def layer_parts(ops: LayerOps, system: SystemSpec) -> LayerParts:
    """The :class:`LayerParts` of a layer's operations (GEMMs and experts without recomputed work;
    the two sides of the MoE block with it)."""
    return parts_of(ops, op_times_s(ops, system))


def parts_of(ops: LayerOps, times_s: tuple[tuple[float, ...], tuple[float, ...]]) -> LayerParts:
    """:func:`layer_parts` from the (forward, backward) GPU seconds of each operation."""
    gemm: dict[str, float] = {}
    shared = [0.0, 0.0]
    mlp = [0.0, 0.0]
    attn = [0.0, 0.0]
    wgrad = 0.0
    for i, (seq, times) in enumerate(zip((ops.forward, ops.backward), times_s, strict=True)):
        for o, t in zip(seq, times, strict=True):
            if o.module in MLP_SIDE_MODULES:
                mlp[i] += t
            else:
                attn[i] += t
            if o.name.startswith("recompute."):
                continue
            if o.kind in ("gemm", "grouped_gemm"):
                gemm[o.name] = gemm.get(o.name, 0.0) + t
                if o.module == "moe" and o.name.endswith(".wgrad"):
                    wgrad += t
            if o.module == "shared_experts":
                shared[i] += t
    return LayerParts(gemm, (shared[0], shared[1]), wgrad, (mlp[0], mlp[1]), (attn[0], attn[1]))


CACHE_LIMIT = 20000
COLL_CACHE: IdentityMemo[tuple[float, float, str]] = IdentityMemo(CACHE_LIMIT)  # keyed by the system's identity
NO_COMM = (0.0, 0.0, "nvlink")


def collective_s(op: str, size: float, shape: GroupShape, system: SystemSpec) -> tuple[float, float, str]:
    """(time s, latency s, bottleneck link) of one collective (memoised).

    The link is the one whose per-GPU bytes take longer at its rate: NVLink or the NIC.
    """
    if shape.size <= 1 or size <= 0:
        return NO_COMM
    key = (op, size, shape)
    hit = COLL_CACHE.get(key, system)
    if hit is not None:
        return hit
    cost = collective_cost(op, size, shape, system)
    nvl_Bps = system.nvlink.gpu_bandwidth_Bps
    net_Bps = system.scale_out.nic_bandwidth_Bps * system.scale_out.nics_per_gpu
    link = "network" if cost.network_bytes_per_gpu / net_Bps > cost.nvlink_bytes_per_gpu / nvl_Bps else "nvlink"
    out = (cost.time_s, min(cost.latency_s, cost.time_s), link)
    return COLL_CACHE.put(out, key, system)


def domain_link(shape: GroupShape) -> str:
    return "nvlink" if shape.intra_domain else "network"


@dataclass
class CommAcc:
    time_s: float = 0.0
    latency_s: float = 0.0
    by_link: dict[str, float] = field(default_factory=dict)
    bytes: float = 0.0

    def add(self, t: tuple[float, float, str], count: float = 1.0, size_bytes: float = 0.0) -> None:
        self.time_s += t[0] * count
        self.latency_s += t[1] * count
        self.by_link[t[2]] = self.by_link.get(t[2], 0.0) + t[0] * count
        self.bytes += size_bytes * count

    @property
    def link(self) -> str:
        return max(self.by_link, key=lambda k: self.by_link[k]) if self.by_link else "nvlink"


def hide_under_host(blocks: tuple[CommBlock, ...], slack_s: float) -> tuple[CommBlock, ...]:
    """``blocks`` with ``slack_s`` seconds of their exposed time hidden, every block's exposed share
    scaled alike: in a launch-bound pass the GPU waits ``slack_s`` for the host to issue kernels, and
    the collectives (kernels on the GPU too) run in that wait; the pass takes
    ``max(host issue, GPU compute + collectives)`` instead of adding the collectives to the host time."""
    exposed = sum(b.exposed_s for b in blocks)
    if slack_s <= 0 or exposed <= 0:
        return blocks
    keep = max(0.0, exposed - slack_s) / exposed
    return tuple(CommBlock(b.kind, b.time_s, b.latency_s, b.link, b.exposed_fraction * keep, b.bytes) for b in blocks)


def host_slack_s(ops: LayerOps, system: SystemSpec, capture: GraphCapture = NO_GRAPHS,
                 kind: str = "dense") -> tuple[float, float]:
    """(forward, backward) seconds the GPU idles waiting for the host in one layer's passes:
    ``max(0, host issue − GPU)`` summed over the passes' windows (0 when GPU-bound)."""
    (_, slack_f), (_, slack_b) = layer_passes(ops, system, capture, kind)
    return slack_f, slack_b


def layer_cache_key(scenario: Scenario, shape: RankShape, kind: str, shapes: dict[str, GroupShape]) -> tuple:
    """Everything one layer's compute and collective costs depend on besides ``overlap``.

    Shared by this module's cache and the planner's bound (:mod:`costmodel.planner.bound`); model
    and system are keyed by identity, so caches must also hold the objects. A setting of
    ``scenario.par`` added here must also go into the bound's identity key
    (:func:`costmodel.planner.bound._kind_times`), which stands in for this key during a search.
    """
    p, rt = scenario.par, scenario.runtime
    return (id(scenario.model), id(scenario.system), shape, kind, p.recompute, tuple(p.recompute_modules),
            tuple(shapes.values()), p.uses_sequence_parallel, p.tp_comm_overlap, p.ep_comm_overlap,
            ep_paired_share(scenario), GraphCapture.of(rt), rt.tp_comm_overlap_cfg, rt.delay_wgrad_compute,
            rt.moe_shared_expert_overlap, rt.moe_flex_dispatcher_backend, rt.moe_hybridep_num_sms,
            rt.moe_deepep_num_sms, rt.num_of_hybrid_ep_ranks_per_nvlink_domain)

