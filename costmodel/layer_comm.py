"""One layer's collectives for one micro-batch on one rank, and what of them is exposed.

:func:`layer_comm` builds the TP / CP / EP collectives of the forward and backward pass as
:class:`~costmodel.layer_costs.CommBlock` s; how much of each kind is exposed is decided by
:mod:`costmodel.comm_exposure` (EP, CP) and :mod:`costmodel.tp_overlap` (TP with
``tp_comm_overlap``) from the layer's parts (:func:`costmodel.layer_costs.layer_parts`).
:func:`layer_kind_costs` is the one entry point for a layer kind's compute and collectives (the step
structure and the planner's bound both use it). Times in seconds, sizes in bytes.

The EP dispatch follows the recipe's dispatcher (:mod:`costmodel.moe_dispatch`): ``flex``
(DeepEP / HybridEP, de-duplicated per NVLink domain), ``alltoall`` (NCCL all-to-all) or
``allgather``. HybridEP treats ``NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN`` ranks as one NVLink
domain when the variable is set: the group's domains are then those of at most that many ranks.

Layer kinds may carry ``:norc`` (``dense:norc``, ``moe:norc``): a layer that full recompute with
``recompute_method block`` leaves out, and ``:bf16`` (``dense:bf16``, ``dense:bf16:norc``): a layer
``first_last_layers_bf16`` keeps in BF16, whose GEMMs run in BF16 without quantization casts
(:func:`costmodel.step_structure._chunk_items`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from costmodel.comm_exposure import (
    EpOverlap,
    cp_exposed_fraction,
    dispatch_sm_share,
    ep_exposed_fraction,
    ep_paired_share,
)
from costmodel.cuda_graphs import GraphCapture
from costmodel.layer_costs import (
    COMM_KINDS,
    CommAcc,
    CommBlock,
    LayerParts,
    bf16_shape,
    collective_s,
    hide_under_host,
)
from costmodel.layer_template import layer_compute_s
from costmodel.moe_dispatch import allgather_dispatch_calls, dispatch_cost
from costmodel.tp_overlap import tp_pass_exposed_s
from topologies.groups import GroupShape
from topologies.identity_memo import IdentityMemo
from workloads.operations import ACT_BYTES, RankShape

if TYPE_CHECKING:
    from workloads.scenario import Scenario

LayerCost = tuple[float, float, tuple[CommBlock, ...], tuple[CommBlock, ...]]


def base_kind(kind: str) -> str:
    """The layer kind without its recompute marker ('moe:norc' -> 'moe')."""
    return kind.partition(":")[0]


def hybrid_ep_shape(shape: GroupShape, ranks_per_domain: int | None) -> GroupShape:
    """The EP group as HybridEP sees it: domains of at most ``ranks_per_domain`` ranks when the
    environment sets ``NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN`` (else the fabric's domains)."""
    if ranks_per_domain is None or ranks_per_domain >= shape.ranks_per_domain:
        return shape
    g = max(1, ranks_per_domain)
    return GroupShape(shape.size, g, math.ceil(shape.size / g), shape.tiers, shape.uniform)


def layer_kind_costs(scenario: Scenario, shape: RankShape, kind: str, shapes: dict[str, GroupShape],
                     overlap: bool) -> LayerCost:
    """(forward s, backward s, forward blocks, backward blocks) of one layer of ``kind``, one micro-batch."""
    p = scenario.par
    recompute = "none" if kind.endswith(":norc") else p.recompute
    c = layer_compute(scenario, shape, kind)
    coll = _collectives(scenario, shape, kind, shapes, overlap, c.parts.gemm_s, recompute)
    cf, cb = comm_blocks(scenario, coll, (c.attn_f_s, c.attn_b_s), overlap, c.parts)
    if overlap:  # a launch-bound pass's collectives run while the GPU waits for the host
        cf, cb = hide_under_host(cf, c.slack_f_s), hide_under_host(cb, c.slack_b_s)
    return c.forward_s, c.backward_s, cf, cb


_COLLECTIVES: IdentityMemo[LayerCollectives] = IdentityMemo(50_000)
COLLECTIVE_GROUPS = ("tp", "cp", "ep", "etp", "etp_ep")  # the group shapes layer_collectives reads


def _collectives(scenario: Scenario, shape: RankShape, kind: str, shapes: dict[str, GroupShape], overlap: bool,
                 gemm_s: dict[str, float], recompute: str) -> LayerCollectives:
    """:func:`layer_collectives` of one layer of ``kind`` (``gemm_s`` of its operations at ``shape``),
    memoised on what it reads: the rank shape but its micro-batch count, the kind, recompute, the
    group shapes, overlap and the recipe settings it reads; model and system by identity. The
    layouts of a search that differ only in their micro-batch count share it."""
    p, rt = scenario.par, scenario.runtime
    key = (shape.micro_batch_size, shape.seq_length, shape.tp, shape.cp, shape.ep, shape.etp,
           shape.sequence_parallel, shape.precision, shape.moe_dispatcher, shape.options, kind, recompute,
           tuple(p.recompute_modules), *(shapes.get(g) for g in COLLECTIVE_GROUPS), overlap, p.tp_comm_overlap, rt.tp_comm_overlap_cfg,
           rt.moe_flex_dispatcher_backend, rt.num_of_hybrid_ep_ranks_per_nvlink_domain)
    model, system = scenario.model, scenario.system
    hit = _COLLECTIVES.get(key, model, system)
    if hit is not None:
        return hit
    out = layer_collectives(scenario, bf16_shape(kind, shape), base_kind(kind), shapes, overlap, gemm_s, recompute)
    return _COLLECTIVES.put(out, key, model, system)


@dataclass(frozen=True)
class LayerCompute:
    """The compute side of one layer of one kind for one micro-batch (seconds): pass times, attention
    core times, the overlap parts and the host slack (:func:`layer_compute`)."""

    forward_s: float
    backward_s: float
    attn_f_s: float
    attn_b_s: float
    parts: LayerParts
    slack_f_s: float
    slack_b_s: float


MOE_OPS_KINDS = ("moe", "mtp")  # kinds whose operations may read ep, etp and the dispatcher (the MoE block)
_COMPUTE: IdentityMemo[LayerCompute] = IdentityMemo(50_000)


def layer_compute(scenario: Scenario, shape: RankShape, kind: str) -> LayerCompute:
    """The :class:`LayerCompute` of one layer of ``kind`` at rank shape ``shape``.

    Memoised on what the operations and their prices depend on (model, system, rank shape, kind,
    recompute, capture), not on the communication group shapes; only the MoE block
    (:func:`workloads.layer_assembly._routed_experts`) reads the rank shape's ep, etp and dispatcher, so layers
    without one share their compute across expert layouts. Model and system are keyed by identity
    (:class:`~topologies.identity_memo.IdentityMemo`).
    """
    p, model, system = scenario.par, scenario.model, scenario.system
    capture = GraphCapture.of(scenario.runtime)
    modules = tuple(p.recompute_modules)
    base = base_kind(kind)
    key_shape = shape if base in MOE_OPS_KINDS else shape.without_experts
    key = (key_shape, kind, p.recompute, modules, capture)
    hit = _COMPUTE.get(key, model, system)
    if hit is not None:
        return hit
    recompute = "none" if kind.endswith(":norc") else p.recompute
    out = LayerCompute(*layer_compute_s(model, system, bf16_shape(kind, key_shape), base, recompute, modules, capture))
    return _COMPUTE.put(out, key, model, system)


def _tp_pairs(scenario: Scenario, kind: str) -> tuple[str, ...]:
    model = scenario.model
    shared = bool(model.moe and model.moe.shared_expert_ffn_hidden_size)
    out = ["attention"]
    if kind in ("dense", "mtp"):
        out.append("mlp")
    elif shared:
        out.append("shared_experts")
    return tuple(out)


def layer_comm(scenario: Scenario, shape: RankShape, kind: str, shapes: dict[str, GroupShape],
               attn_s: tuple[float, float], overlap: bool, compute_s: tuple[float, float] = (0.0, 0.0),
               parts: LayerParts | None = None, recompute: str | None = None
               ) -> tuple[tuple[CommBlock, ...], tuple[CommBlock, ...]]:
    """Forward and backward collective blocks of one layer (kind: dense, moe, embedding, output, mtp).

    ``attn_s``: (forward, backward) attention-core seconds of one micro-batch (CP overlap);
    ``compute_s``: the whole layer's (kept for callers; the overlaps use ``parts``); ``parts``: the
    layer's GEMM, expert and MoE-side seconds (TP and EP overlap);
    ``recompute``: the layer's recompute (default: the scenario's).
    """
    parts = parts or LayerParts({})
    coll = layer_collectives(scenario, shape, kind, shapes, overlap, parts.gemm_s, recompute)
    return comm_blocks(scenario, coll, attn_s, overlap, parts)


@dataclass(frozen=True)
class LayerCollectives:
    """One layer's collectives for one micro-batch, summed per kind (``COMM_KINDS``) and pass, and the
    exposed seconds of its TP ones under ``tp_comm_overlap`` (None: not overlapped): what
    :func:`layer_comm` computes before the exposure, none of which depends on the micro-batch count
    (the caller must not change the accumulators)."""

    fwd: dict[str, CommAcc]
    bwd: dict[str, CommAcc]
    tp_exposed: tuple[float, float] | None
    # per pass (forward, backward): (kind, accumulator, its bottleneck link) of the kinds with
    # collectives (time > 0) in COMM_KINDS order, read once here rather than per use (comm_blocks)
    present: tuple[tuple[tuple[str, CommAcc, str], ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        present = tuple(tuple((k, a, a.link) for k, a in ((k, acc[k]) for k in COMM_KINDS) if a.time_s > 0)
                        for acc in (self.fwd, self.bwd))
        object.__setattr__(self, "present", present)


def layer_collectives(scenario: Scenario, shape: RankShape, kind: str, shapes: dict[str, GroupShape],
                      overlap: bool, gemm_s: dict[str, float], recompute: str | None = None) -> LayerCollectives:
    """The :class:`LayerCollectives` of one layer (arguments as :func:`layer_comm`; ``gemm_s``: the
    layer's GEMM seconds by operation name, :attr:`LayerParts.gemm_s`)."""
    system, model, p, rt = scenario.system, scenario.model, scenario.par, scenario.runtime
    recompute = p.recompute if recompute is None else recompute
    h = model.hidden_size
    fwd = {k: CommAcc() for k in COMM_KINDS}
    bwd = {k: CommAcc() for k in COMM_KINDS}
    full_recompute = recompute == "full"
    moe_recompute = recompute == "selective" and "moe" in p.recompute_modules
    attn_recompute = recompute == "selective" and "core_attn" in p.recompute_modules
    act = shape.tokens * h * ACT_BYTES
    tps = shapes["tp"]
    tp_exposed: tuple[float, float] | None = None
    if tps.size > 1:
        sp = shape.sequence_parallel
        ag, rs = collective_s("all_gather", act, tps, system), collective_s("reduce_scatter", act, tps, system)
        ar = collective_s("all_reduce", act, tps, system)
        if kind == "embedding":  # vocab-parallel lookup: RS (SP) or AR forward; AG of dy backward (SP)
            fwd["tp"].add(rs if sp else ar, 1, act)
            if sp:
                bwd["tp"].add(ag, 1, act)
        elif kind == "output":  # column-parallel logits: AG of x forward (SP); RS dx + AG x (SP) or AR dx
            if sp:
                fwd["tp"].add(ag, 1, act)
                bwd["tp"].add(rs, 1, act)
                bwd["tp"].add(ag, 1, act)
            else:
                bwd["tp"].add(ar, 1, act)
        else:  # column/row pairs: attention, dense MLP or shared experts (routed experts need none)
            pairs = _tp_pairs(scenario, kind)
            if sp:  # fwd AG x + RS y; bwd AG dy + AG x (wgrad) + RS dx
                fwd["tp"].add(ag, len(pairs), act)
                fwd["tp"].add(rs, len(pairs), act)
                bwd["tp"].add(ag, 2 * len(pairs), act)
                bwd["tp"].add(rs, len(pairs), act)
                if p.tp_comm_overlap and overlap:
                    tp_exposed = tp_pass_exposed_s(rt, pairs, gemm_s, ag[0], rs[0], tps.size, system.gpu.sm_count)
            else:  # fwd AR after the row-parallel GEMM; bwd AR after the column-parallel dgrad
                fwd["tp"].add(ar, len(pairs), act)
                bwd["tp"].add(ar, len(pairs), act)
    cps = shapes["cp"]
    if cps.size > 1 and kind in ("dense", "moe", "mtp"):
        att = model.attention
        if att.kind == "gqa":
            width = 2 * att.num_kv_heads // shape.tp * att.head_dim
        else:
            width = att.num_heads // shape.tp * (att.qk_head_dim + att.qk_pos_emb_head_dim + att.v_head_dim)
        kv_bytes = cps.size * shape.tokens * width * ACT_BYTES
        kv = collective_s("all_gather", kv_bytes, cps, system)
        fwd["cp"].add(kv, 1, kv_bytes)
        bwd["cp"].add(kv, 2.0, kv_bytes)
    eps = shapes["ep"]
    is_moe = kind == "moe" or (kind == "mtp" and model.is_moe_layer(model.num_layers - 1))
    if is_moe and model.moe is not None and shape.moe_dispatcher == "allgather":
        group = shapes["etp_ep"]
        calls = allgather_dispatch_calls(shape.sp_tokens, h, model.moe.num_experts, group.size)
        for acc, pass_calls in zip((fwd["ep"], bwd["ep"]), calls, strict=True):
            for c in pass_calls:
                acc.add(collective_s(c.op, c.bytes, group, system), 1, c.bytes)
    elif is_moe and model.moe is not None:
        send = shape.sp_tokens * model.moe.topk * h * ACT_BYTES
        if eps.size > 1:
            dispatcher = "alltoall" if shape.moe_dispatcher == "alltoall" else "flex"
            ep_shape = eps
            if dispatcher == "flex" and rt.moe_flex_dispatcher_backend == "hybridep":
                ep_shape = hybrid_ep_shape(eps, rt.num_of_hybrid_ep_ranks_per_nvlink_domain)
            a2a = dispatch_cost(shape.sp_tokens, h, model.moe.num_experts, model.moe.topk, ep_shape, system, dispatcher)
            fwd["ep"].add(a2a, 2, send)
            bwd["ep"].add(a2a, 2, send)
        etps = shapes["etp"]
        if etps.size > 1:
            gathered = send * etps.size
            for acc in (fwd["ep"], bwd["ep"]):
                acc.add(collective_s("all_gather", gathered, etps, system), 1, gathered)
                acc.add(collective_s("reduce_scatter", gathered, etps, system), 1, gathered)
    # recomputed modules repeat their forward collectives in backward (CP's ring runs inside core_attn)
    redo = COMM_KINDS if full_recompute else (("ep",) if moe_recompute else ()) + (("cp",) if attn_recompute else ())
    for k in redo:
        bwd[k].add((fwd[k].time_s, fwd[k].latency_s, fwd[k].link), 1, fwd[k].bytes)
    if tp_exposed is not None and full_recompute:
        tp_exposed = (tp_exposed[0], tp_exposed[1] + tp_exposed[0])
    return LayerCollectives(fwd, bwd, tp_exposed)


def comm_blocks(scenario: Scenario, coll: LayerCollectives, attn_s: tuple[float, float], overlap: bool,
                parts: LayerParts) -> tuple[tuple[CommBlock, ...], tuple[CommBlock, ...]]:
    """The forward and backward :class:`CommBlock` s of one layer's collectives ``coll`` with their
    exposed fractions: TP from ``coll``, CP under the attention core (``attn_s``, seconds), EP under
    the paired micro-batch and the layer's own work (``parts``; the micro-batch count enters here)."""
    fwd, bwd = coll.present
    if not overlap:  # every collective exposed
        return (tuple(CommBlock(k, a.time_s, a.latency_s, link, 1.0, a.bytes) for k, a, link in fwd),
                tuple(CommBlock(k, a.time_s, a.latency_s, link, 1.0, a.bytes) for k, a, link in bwd))
    tp_exposed = coll.tp_exposed
    out = []
    for pass_index, present in enumerate((fwd, bwd)):
        blocks = []
        for k, a, link in present:  # time_s > 0
            if k == "tp" and tp_exposed is not None:
                fraction = min(1.0, tp_exposed[pass_index] / a.time_s)
            elif k == "cp":
                fraction = cp_exposed_fraction(a.time_s, attn_s[pass_index])
            elif k == "ep":
                fraction = ep_exposed_fraction(a.time_s, _ep_overlap(scenario, parts, pass_index))
            else:
                fraction = 1.0
            blocks.append(CommBlock(k, a.time_s, a.latency_s, link, fraction, a.bytes))
        out.append(tuple(blocks))
    return out[0], out[1]


def _ep_overlap(scenario: Scenario, parts: LayerParts, pass_index: int) -> EpOverlap:
    """What one pass's EP all-to-alls hide under (:class:`EpOverlap`) in a layer of ``parts``:
    forward: dispatch beside the other micro-batch's backward MLP, combine beside its attention;
    backward: combine beside the other's forward attention, dispatch beside its forward MLP."""
    p, rt = scenario.par, scenario.runtime
    delayed = parts.expert_wgrad_s if rt.delay_wgrad_compute else 0.0
    shared = parts.shared_expert_s if rt.moe_shared_expert_overlap else (0.0, 0.0)
    attn_f, attn_b = parts.attn_side_s
    mlp_f, mlp_b = parts.mlp_side_s[0], parts.mlp_side_s[1] - delayed
    if pass_index == 0:
        paired, own = (mlp_b, attn_b), (shared[0], 0.0)
    else:
        paired, own = (attn_f, mlp_f), (shared[1], delayed)
    return EpOverlap(paired_s=paired, own_s=own, paired_share=ep_paired_share(scenario),
                     sm_share=dispatch_sm_share(rt, scenario.system.gpu.sm_count), ep_overlap=p.ep_comm_overlap)
