"""Activation memory: bytes stored for the backward pass, per layer and per pipeline stage.

The method is Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
(MLSys 2023, arXiv:2205.05198), §4: list every tensor a layer saves for its backward pass, in
bytes per token, and divide by the parallelism that shards it. Their GPT layer stores
``s·b·h·(34 + 5·a·s/h)`` bytes (§4.1); with tensor + sequence parallelism everything is divided by
``t`` (§4.2.2, eq. 2); selective recompute drops the core-attention terms ``5·a·s²·b`` (§5,
eq. 5: ``34·s·b·h/t``); full recompute keeps only the layer input ``2·s·b·h/t`` (§5).

muonsim adapts the same bookkeeping to the models it ships (all SwiGLU + RMSNorm, no dropout):

- **no dropout** (the catalogue models train with dropout 0), so the mask terms vanish;
- **flash attention** (Transformer Engine fused attention, always used by Megatron-Core on
  Hopper/Blackwell): the ``a·s²`` softmax terms are replaced by the saved Q, K, V, the output O
  and the fp32 log-sum-exp (``4·a`` bytes per token);
- **GQA**: K and V have ``n_kv·d`` rows instead of ``h``; **MLA**: the latent projections and their
  norms (replicated over tp, so not divided by ``t``), then the up-projected Q, K, V per head;
- **SwiGLU**: fc1 output ``2F`` (gate and up) saved by the activation, its output ``F`` saved by fc2;
  a non-gated activation (GELU, squared ReLU) saves fc1's ``F`` outputs and its own ``F`` outputs;
  LayerNorm's per-token statistics (fp32 mean and reciprocal deviation, RMSNorm's one) are
  negligible beside the ``h``-wide tensors and not counted;
- **MoE**: router scores (fp32, ``E`` per token), then every token is processed by top-k experts, so
  the expert terms scale with ``k`` (dropless routing, average load: imbalance is not modelled);
  ``etp`` duplicates expert inputs over the expert-tensor group and shards the ffn dim; the routing
  probabilities are applied inside the expert activation (Megatron-Core passes ``permuted_probs``
  to the grouped MLP's weighted SwiGLU), so their gradient needs no extra saved tensor;
- **precision**: GEMM inputs are saved by Transformer Engine in the GEMM's input format (bf16: 2 B,
  FP8 with per-tensor scale: 1 B, MXFP8: 1 B + an E8M0 scale per 32, NVFP4: ½ B + an E4M3 scale per
  16); other saved tensors stay bf16 (RMSNorm inputs, SwiGLU inputs, flash-attention tensors).

Megatron's recompute options are honoured: ``none``, ``full`` (uniform, one layer per checkpoint:
only the layer input is kept, plus one layer's activations while it is being recomputed) and
``selective`` with ``recompute_modules`` (Megatron-Core names: core_attn, layernorm, mla_up_proj,
mlp, moe_act, moe, shared_experts). Each saved tensor carries the modules whose recompute frees it.

Micro-batches in flight (the peak is on the first pipeline stage, Korthikanti §4.2.3): 1F1B keeps
``pp - stage`` micro-batches; Megatron's interleaved schedule runs ``(pp - stage - 1)·2 +
(vpp - 1)·pp`` warm-up forwards plus one, each holding one virtual chunk, which gives the paper's
``L·(1 + (pp-1)/(pp·vpp))`` layer-activations on stage 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from topologies.hardware import Precision
from workloads.models import GqaAttention, MlaAttention, ModelSpec

ACT_BYTES = 2  # bf16 activations
FP32_BYTES = 4
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe_act", "moe", "shared_experts")

_GEMM_INPUT_BYTES = {
    Precision.BF16: 2.0,
    Precision.FP16: 2.0,
    Precision.FP8_CS: 1.0,
    Precision.FP8_DELAYED: 1.0,
    Precision.FP8_BLOCKWISE: 1.0 + 4.0 / 128,
    Precision.MXFP8: 1.0 + 1.0 / 32,
    Precision.NVFP4: 0.5 + 1.0 / 16,
}


def gemm_input_bytes_per_element(precision: Precision | str) -> float:
    """Bytes per element of a GEMM input saved for the weight-gradient GEMM, in bytes."""
    return _GEMM_INPUT_BYTES[Precision(precision)]


@dataclass(frozen=True)
class LayerShape:
    """The parallel context of one layer's activations on one rank."""

    tokens: int  # tokens per micro-batch on one context-parallel rank: s·b/cp
    tp: int
    sequence_parallel: bool
    etp: int
    precision: Precision


@dataclass(frozen=True)
class ActivationTerm:
    """One saved tensor of one layer for one micro-batch on one rank, in bytes."""

    name: str
    size_bytes: float
    freed_by: frozenset[str]  # selective-recompute modules that free it
    offload_module: str = ""  # Megatron --offload-modules entry that offloads it ('' = none)

    def kept(self, modules: frozenset[str]) -> bool:
        """Whether the tensor stays resident under selective recompute of ``modules``."""
        return not (self.freed_by & modules)


def layer_activation_terms(model: ModelSpec, moe_layer: bool, shape: LayerShape) -> list[ActivationTerm]:
    """Every tensor one transformer layer saves for backward, per micro-batch on one rank (bytes).

    Tensors in the tensor-parallel region (per-head, per-ffn-column) are divided by tp; tensors of
    hidden width are divided by tp only with sequence parallelism; MLA latents are replicated.
    """
    h, t = model.hidden_size, shape.tp
    n = float(shape.tokens)
    sp = t if shape.sequence_parallel else 1  # divisor of hidden-width tensors
    g = gemm_input_bytes_per_element(shape.precision)
    lowp = Precision(shape.precision).tensor_core_class != "bf16"
    terms: list[ActivationTerm] = []
    act = model.activation

    def add(name: str, size_bytes: float, *freed_by: str, offload: str = "") -> None:
        terms.append(ActivationTerm(name, size_bytes, frozenset(freed_by), offload))

    # --- attention block ---
    att = model.attention
    add("attn_norm_input", n * h * ACT_BYTES / sp, offload="attn_norm")
    add("attn_norm_output", n * h * g / sp, "layernorm", offload="qkv_linear")
    if isinstance(att, GqaAttention):
        heads, kv, d = att.num_heads, att.num_kv_heads, att.head_dim
        add("qkv", n * (heads + 2 * kv) * d * ACT_BYTES / t, offload="core_attn")
        if att.qk_norm:
            add("qk_norm_input", n * (heads + kv) * d * ACT_BYTES / t)
        o_width = heads * d
    else:
        assert isinstance(att, MlaAttention)
        heads, dq = att.num_heads, att.qk_head_dim + att.qk_pos_emb_head_dim
        if att.q_lora_rank:
            add("q_latent", n * att.q_lora_rank * ACT_BYTES)
            if att.latent_norm:
                add("q_latent_norm_output", n * att.q_lora_rank * g, "mla_up_proj")
        add("kv_latent", n * (att.kv_lora_rank + att.qk_pos_emb_head_dim) * ACT_BYTES)
        if att.latent_norm:
            add("kv_latent_norm_output", n * att.kv_lora_rank * g, "mla_up_proj")
        add("qkv", n * heads * (2 * dq + att.v_head_dim) * ACT_BYTES / t, "mla_up_proj", offload="core_attn")
        o_width = heads * att.v_head_dim
    # flash attention keeps O (a bf16 output projection shares it as its input)
    add("attn_output", n * o_width * ACT_BYTES / t, offload="core_attn")
    add("attn_softmax_lse", n * heads * FP32_BYTES / t, "core_attn", offload="core_attn")
    if lowp:
        add("proj_input_quantized", n * o_width * g / t, offload="attn_proj")
    # --- MLP block ---
    add("mlp_norm_input", n * h * ACT_BYTES / sp, offload="mlp_norm")
    if not moe_layer:  # fc1 fused with the norm saves the norm output as its (quantized) input
        add("mlp_norm_output", n * h * g / sp, "layernorm", "mlp")
        f = model.ffn_hidden_size
        add("fc1_output", n * model.fc1_factor * f * ACT_BYTES / t, "mlp")
        add(f"{act}_output", n * f * g / t, "mlp")
        return terms
    spec = model.moe
    assert spec is not None
    # a separate norm feeds the router and the dispatcher in bf16 (the experts quantize after dispatch);
    # MoE recompute keeps it as its checkpoint input
    add("mlp_norm_output", n * h * ACT_BYTES / sp, "layernorm")
    # MoE with tp > 1 requires sequence parallelism in Megatron, so routed tokens are always /t
    routed = n * spec.topk / t
    fe = spec.expert_ffn_hidden_size
    add("router_scores", n * spec.num_experts * FP32_BYTES / t, "moe")
    add("expert_fc1_input", routed * shape.etp * h * g, "moe", offload="expert_fc1")
    add("expert_fc1_output", routed * model.fc1_factor * fe * ACT_BYTES, "moe", offload="moe_act")
    add(f"expert_{act}_output", routed * fe * g, "moe", "moe_act")
    if spec.shared_expert_ffn_hidden_size:
        fs = spec.shared_expert_ffn_hidden_size
        add("shared_fc1_output", n * model.fc1_factor * fs * ACT_BYTES / t, "moe", "shared_experts")
        add(f"shared_{act}_output", n * fs * g / t, "moe", "shared_experts")
    return terms


def layer_activation_bytes(
    model: ModelSpec, moe_layer: bool, shape: LayerShape, recompute: str = "none",
    recompute_modules: tuple[str, ...] = ("core_attn",),
) -> float:
    """Bytes one layer keeps resident for one micro-batch on one rank under ``recompute``.

    ``full``: only the layer input (``2·s·b·h/t`` with sequence parallelism, Korthikanti §5).
    """
    terms = layer_activation_terms(model, moe_layer, shape)
    if recompute == "full":
        return terms[0].size_bytes  # the layer input (attention norm input)
    modules = frozenset(recompute_modules) if recompute == "selective" else frozenset()
    return sum(x.size_bytes for x in terms if x.kept(modules))


def output_activation_bytes(model: ModelSpec, shape: LayerShape, logits_bytes: int = FP32_BYTES) -> float:
    """Last-stage extras per micro-batch, in bytes: final norm input, output-layer input (bf16: Megatron's
    output layer is not a Transformer Engine FP8 GEMM), and what the
    vocabulary-parallel cross entropy keeps (``logits_bytes·V_pad/t`` per token: 4 for the fp32
    softmax, 2 for Transformer Engine's fused loss, which keeps the bf16 logits holding the gradient),
    once per prediction head (main output plus one per MTP layer)."""
    h, t = model.hidden_size, shape.tp
    n = float(shape.tokens)
    sp = t if shape.sequence_parallel else 1
    g = gemm_input_bytes_per_element(shape.precision)
    heads = 1 + model.mtp_layers
    vocab = model.padded_vocab_size(t)
    per_head = n * h * 2 * ACT_BYTES / sp + n * vocab * logits_bytes / t  # the output layer runs in bf16
    mtp_inputs = model.mtp_layers * n * 2 * h * (ACT_BYTES + g) / sp  # enorm/hnorm inputs, eh_proj input
    return heads * per_head + mtp_inputs


def inflight_chunk_microbatches(pp: int, vpp: int, stage: int, num_microbatches: int) -> list[int]:
    """Micro-batches whose activations stage ``stage`` holds at its peak, per virtual chunk.

    1F1B: ``min(pp - stage, m)`` of chunk 0. Interleaved (Megatron ``forward_backward_pipelining_
    with_interleaving``): the warm-up forwards ``(pp - stage - 1)·2 + (vpp - 1)·pp`` plus the first
    steady-state forward, capped at ``m·vpp`` (all warm-up when ``m == pp``); forward ``k`` runs
    chunk ``(k mod pp·vpp) // pp``. Counting the warm-up forwards is exact for equal chunks and a
    close estimate when chunks hold different layer counts.
    """
    if vpp == 1:
        return [min(pp - stage, num_microbatches)]
    total = num_microbatches * vpp
    if num_microbatches == pp:
        inflight = total
    else:
        inflight = min((pp - stage - 1) * 2 + (vpp - 1) * pp + 1, total)
    counts = [0] * vpp
    for k in range(inflight):
        counts[(k % (pp * vpp)) // pp] += 1
    return counts
