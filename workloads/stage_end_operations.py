"""The operations of the layers at the ends of the pipeline: the input embedding, the output layer
with its loss, and a multi-token-prediction layer (built like a transformer layer's,
:mod:`workloads.operations`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workloads.layer_assembly import layer_operations
from workloads.operations import ACT_BYTES, LayerOps, RankShape, _builder

if TYPE_CHECKING:
    from workloads.models import ModelSpec


def embedding_operations(model: ModelSpec, shape: RankShape) -> LayerOps:
    """The vocabulary-parallel input embedding (first virtual stage): lookup and its scatter-add
    (a learned absolute position table is read and added too)."""
    b = _builder(model, shape)
    h = model.hidden_size
    if model.position_embedding == "learned_absolute":  # two lookups and their sum; two dense backwards
        b.elementwise("embedding", "embedding", 3.0 * shape.tokens * h * ACT_BYTES, kernels=(3, 6))
    else:
        b.elementwise("embedding", "embedding", 2.0 * shape.tokens * h * ACT_BYTES, kernels=(1, 3))
    return b.build("none", ())


def output_operations(model: ModelSpec, shape: RankShape) -> LayerOps:
    """Final norm, output layer (BF16 logits on the tp-padded vocabulary) and cross-entropy."""
    b = _builder(model, shape)
    h, v = model.hidden_size, model.padded_vocab_size(shape.tp) // shape.tp
    b.norm("final_layernorm", shape.sp_tokens, h)
    b.gemm("output_layer", "output", shape.tokens, v, h, low_precision=False, bias=False)
    b.elementwise("cross_entropy", "output", 4.0 * shape.tokens * v * ACT_BYTES, bwd_factor=0.5,
                  kernels=(2, 1) if shape.options.cross_entropy_fusion else (6, 3))
    return b.build("none", ())


def mtp_operations(model: ModelSpec, shape: RankShape, recompute: str = "none",
                   recompute_modules: tuple[str, ...] = ("core_attn",)) -> LayerOps:
    """One multi-token-prediction layer: norms, eh projection, a transformer layer, its own logits."""
    b = _builder(model, shape)
    h = model.hidden_size
    b.norm("mtp.enorm", shape.sp_tokens, h)
    b.norm("mtp.hnorm", shape.sp_tokens, h)
    b.gemm("mtp.eh_proj", "mtp", shape.tokens, h // shape.tp, 2 * h)
    layer = layer_operations(model, shape, model.is_moe_layer(model.num_layers - 1), recompute, recompute_modules)
    out = output_operations(model, shape)
    own = b.build(recompute, recompute_modules)
    return LayerOps(forward=own.forward + layer.forward + out.forward,
                    backward=own.backward + layer.backward + out.backward, local_spec=layer.local_spec)
