"""FLOP counting: Megatron-Bridge's model-FLOPs convention and Newton-Schulz FLOPs.

:func:`model_flops_per_token` reproduces ``num_floating_point_operations`` of Megatron-Bridge
r0.3.0 term by term (``../shared/data/flops-convention.md``): 6 FLOPs per weight per token for
forward + both backward GEMMs, causal attention counted over s/2, SwiGLU as three matrices (a
non-gated GELU or squared-ReLU MLP as two: the convention's ``γ = 1``), routed
top-k plus shared experts, MLA projections, MTP layers and the logits on the tp-padded vocabulary.
It is the numerator of "model TFLOP/s/GPU"; it excludes recompute, the router and the optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass

from workloads.models import GqaAttention, MlaAttention, ModelSpec

GATED_FACTOR = 1.5  # SwiGLU: gate, up and down matrices = 3 instead of 2


@dataclass(frozen=True)
class FlopTerms:
    """Per-token model FLOPs by term (forward + backward), in FLOPs."""

    dense_mlp: float
    routed_experts: float
    shared_experts: float
    attention_projections: float
    attention_core: float
    mtp_extra: float
    logits: float

    @property
    def total(self) -> float:
        """Model FLOPs per token, all terms summed (forward + backward), in FLOPs."""
        return (self.dense_mlp + self.routed_experts + self.shared_experts + self.attention_projections
                + self.attention_core + self.mtp_extra + self.logits)


def attention_projection_params(model: ModelSpec) -> int:
    """Projection weights of one attention layer as the FLOP convention counts them (incl. MLA latent norms)."""
    att = model.attention
    h = model.hidden_size
    if isinstance(att, GqaAttention):
        return 2 * h * att.head_dim * (att.num_heads + att.num_kv_heads)
    assert isinstance(att, MlaAttention)
    dq = att.qk_head_dim + att.qk_pos_emb_head_dim
    if att.q_lora_rank:
        p_q = att.q_lora_rank * (h + att.num_heads * dq + 1)
    else:
        p_q = h * att.num_heads * dq
    p_kv = att.kv_lora_rank * (h + att.num_heads * (att.qk_head_dim + att.v_head_dim) + 1) + h * att.qk_pos_emb_head_dim
    p_o = att.num_heads * att.v_head_dim * h
    return p_q + p_kv + p_o


def attention_core_flops_per_token(model: ModelSpec, seq_length: int) -> float:
    """Causal attention core (QK^T and PV), forward + backward, per token per layer (convention)."""
    att = model.attention
    if isinstance(att, GqaAttention):
        return 6.0 * seq_length * att.num_heads * att.head_dim
    assert isinstance(att, MlaAttention)
    return 3.0 * seq_length * att.num_heads * (att.qk_head_dim + att.qk_pos_emb_head_dim + att.v_head_dim)


def model_flop_terms(model: ModelSpec, seq_length: int, tp: int = 1) -> FlopTerms:
    """Per-token model FLOPs by term, Megatron-Bridge convention (tp only changes the padded vocab)."""
    h = model.hidden_size
    l_mtp = model.mtp_layers
    l_moe = model.num_moe_layers
    l_dense = model.num_dense_layers
    if l_mtp:
        if model.is_moe_layer(model.num_layers - 1):
            l_moe += l_mtp
        else:
            l_dense += l_mtp
    l_att = model.num_layers + l_mtp
    moe = model.moe
    topk = moe.topk if moe else 0
    f_e = moe.expert_ffn_hidden_size if moe else 0
    f_sh = moe.shared_expert_ffn_hidden_size if moe else 0
    gamma = GATED_FACTOR if model.gated_mlp else 1.0
    return FlopTerms(
        dense_mlp=12.0 * gamma * h * model.ffn_hidden_size * l_dense,
        routed_experts=12.0 * gamma * h * f_e * topk * l_moe,
        shared_experts=12.0 * gamma * h * f_sh * l_moe,
        attention_projections=6.0 * l_att * attention_projection_params(model),
        attention_core=l_att * attention_core_flops_per_token(model, seq_length),
        mtp_extra=6.0 * l_mtp * (2 * h * h + 3 * h),
        logits=6.0 * h * model.padded_vocab_size(tp) * (1 + l_mtp),
    )


def model_flops_per_token(model: ModelSpec, seq_length: int, tp: int = 1) -> float:
    """Model FLOPs per token (forward + backward), Megatron-Bridge convention."""
    return model_flop_terms(model, seq_length, tp).total


def newton_schulz_flops(rows: int, cols: int, steps: int, use_syrk: bool = False, cubic: bool = False) -> float:
    """FLOPs of one Newton-Schulz call on a rows x cols matrix.

    With m = min(rows, cols), n = max: per step 4m²n + 2m³ as GEMMs (X·Xᵀ, A·A, B·X); with SYRK
    (symmetric products computed as one triangle) 3m²n + m³; a cubic schedule (c = 0) drops the
    A·A product: 4m²n, or 3m²n with SYRK. Normalisation and element-wise work are not counted.
    """
    m, n = min(rows, cols), max(rows, cols)
    if cubic:
        per_step = (3 if use_syrk else 4) * m * m * n
    elif use_syrk:
        per_step = 3 * m * m * n + m ** 3
    else:
        per_step = 4 * m * m * n + 2 * m ** 3
    return float(steps * per_step)


def newton_schulz_cost_proxy(rows: int, cols: int) -> int:
    """Megatron's load-balancing cost for a matrix: max(M, N) · min(M, N)²."""
    m, n = min(rows, cols), max(rows, cols)
    return n * m * m
