"""A transformer layer's operations for one micro-batch, assembled from its parts.

A layer is the attention block with the pre-MLP norm (:func:`workloads.operations._attention_block`),
then a dense MLP, or the MoE block: the router, the routed experts (token permutation, grouped
expert GEMMs, unpermutation) and the shared experts. The builders and the shapes they follow are
those of :mod:`workloads.operations` (its docstring states them).

Only the routed experts read the rank shape's expert layout (ep, etp, dispatcher). The other parts
are built once per rank shape with those fields reset and shared, as the same objects, by the
layers of every expert layout: a layout search meets ~20 expert layouts per attention shape, and
building those parts afresh each time was half of a new MoE layer's cost (their prices are looked
up by the same objects too, :func:`costmodel.layer_costs.priced_ops_s`).
"""

from __future__ import annotations

from dataclasses import replace

from topologies.identity_memo import IdentityMemo
from workloads.models import ModelSpec
from workloads.operations import (
    ACT_BYTES,
    LayerOps,
    Operation,
    RankShape,
    _activation,
    _attention_block,
    _Builder,
    _builder,
    _dense_mlp,
)


def _router(b: _Builder, model: ModelSpec) -> None:
    """The MoE router up to the dispatch preprocessing (reads no expert layout field: ep, etp, dispatcher)."""
    s, moe, h = b.shape, model.moe, model.hidden_size
    assert moe is not None
    tsp = s.sp_tokens
    opt = s.options
    if opt.router_dtype == "bf16":
        b.gemm("router", "moe_router", tsp, moe.num_experts, h, low_precision=False, bias=False)
    else:  # fp32 / fp64 router: cast the input, then an fp32 torch.mm (no TF32 by default)
        b.elementwise("router.cast", "moe_router", tsp * h * (ACT_BYTES + 4), bwd_factor=1.0)
        b.gemm("router", "moe_router", tsp, moe.num_experts, h, low_precision=False, tensor_class="fp32", bias=False)
    b.elementwise("router_topk", "moe_router", 3.0 * tsp * moe.num_experts * 4,
                  kernels=(3, 3) if opt.router_fusion else (8, 4))
    b.elementwise("dispatch_preprocess", "moe_preprocess", 2.0 * tsp * moe.num_experts, 0.0, kernels=(4, 0))


def _routed_experts(b: _Builder, model: ModelSpec) -> None:
    """The token permutation, the routed experts and the unpermutation: the only operations of a
    layer that read the rank shape's expert layout (ep, etp, dispatcher)."""
    s, moe, h = b.shape, model.moe, model.hidden_size
    assert moe is not None
    tsp = s.sp_tokens
    opt = s.options
    pairs = tsp * moe.topk * s.etp
    permute_kernels = (2.0, 1.0) if opt.permute_fusion else (5.0, 2.0)
    if s.moe_dispatcher == "allgather":  # select the local pairs among the tokens gathered over etp·ep
        b.elementwise("permute", "moe", 2.0 * pairs * h * ACT_BYTES, kernels=permute_kernels)
    else:
        b.elementwise("permute", "moe", 2.0 * tsp * moe.topk * h * ACT_BYTES, kernels=permute_kernels)
    if opt.dispatcher_host_sync:  # the host waits for the token counts before the permutation / all-to-all
        b.fwd[-1] = replace(b.fwd[-1], host_sync=True)
    local_experts = max(moe.num_experts // s.ep, 1)
    fe = moe.expert_ffn_hidden_size // s.etp
    b.gemm("experts.linear_fc1", "moe", pairs, model.fc1_factor * fe, h, groups=local_experts)
    _activation(b, model, "experts", "moe_act", pairs, fe, 1 if opt.grouped_gemm else local_experts)
    b.gemm("experts.linear_fc2", "moe", pairs, h, fe, groups=local_experts)
    if not opt.grouped_gemm:  # SequentialMLP: split the permuted tokens per expert, concatenate the outputs
        b.elementwise("experts.cat", "moe", 2.0 * pairs * h * ACT_BYTES, bwd_factor=1.0)
    unpermute_kernels = (1.0, 1.0) if opt.permute_fusion else (3.0, 3.0)
    if s.moe_dispatcher == "allgather":  # zero the gathered output buffer, scatter-add the pairs into it
        b.elementwise("unpermute", "moe", (tsp * s.ep * s.etp + 2.0 * pairs) * h * ACT_BYTES, kernels=unpermute_kernels)
    else:
        b.elementwise("unpermute", "moe", 2.0 * tsp * moe.topk * h * ACT_BYTES, kernels=unpermute_kernels)


def _moe_tail(b: _Builder, model: ModelSpec) -> None:
    """The shared experts (if any) and the layer's closing residual add (no expert layout field read)."""
    moe = model.moe
    assert moe is not None
    if moe.shared_expert_ffn_hidden_size:
        _dense_mlp(b, model, moe.shared_expert_ffn_hidden_size, "shared_experts", "shared_experts")
    b.elementwise("residual_add2", "mlp", 3.0 * b.shape.sp_tokens * model.hidden_size * ACT_BYTES)


def _attention(b: _Builder, model: ModelSpec) -> None:
    _attention_block(b, model)
    b.norm("pre_mlp_layernorm", b.shape.sp_tokens, model.hidden_size)


# (forward, backward) operations of the layer parts that read no expert layout field (ep, etp, dispatcher),
# per part and rank shape with those fields reset (model keyed by identity), shared by every expert
# layout's layers (and so are their prices): half of a new MoE layer's cost was building them afresh
_PARTS = {"attention": _attention, "router": _router, "moe_tail": _moe_tail}
_PART_OPS: IdentityMemo[tuple[tuple[Operation, ...], tuple[Operation, ...]]] = IdentityMemo(8192)


def _part_ops(model: ModelSpec, key: RankShape, part: str) -> tuple[tuple[Operation, ...], tuple[Operation, ...]]:
    """(forward, backward) operations of ``_PARTS[part]`` at ``key`` (expert fields reset; memoised)."""
    hit = _PART_OPS.get((key, part), model)
    if hit is None:
        b = _builder(model, key)
        _PARTS[part](b, model)
        hit = _PART_OPS.put((tuple(b.fwd), tuple(b.bwd)), (key, part), model)
    return hit


def layer_operations(model: ModelSpec, shape: RankShape, moe: bool, recompute: str = "none",
                     recompute_modules: tuple[str, ...] = ("core_attn",)) -> LayerOps:
    """Operations of one transformer layer (attention + dense or MoE MLP) for one micro-batch."""
    b = _builder(model, shape)
    key = shape.without_experts
    b.extend(_part_ops(model, key, "attention"))
    if moe:
        b.extend(_part_ops(model, key, "router"))
        _routed_experts(b, model)
        b.extend(_part_ops(model, key, "moe_tail"))
    else:
        _dense_mlp(b, model, model.ffn_hidden_size, "mlp", "mlp")
        b.elementwise("residual_add2", "mlp", 3.0 * shape.sp_tokens * model.hidden_size * ACT_BYTES)
    return b.build(recompute, recompute_modules)
