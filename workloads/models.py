"""Model architectures: the catalogue (``workloads/data/models/*.yaml``) and user model files.

A :class:`ModelSpec` holds exactly the hyper-parameters that parameter, FLOP and memory counting
need: dense and MoE layers, GQA (or multi-head) or MLA attention, shared experts, vocabulary,
multi-token-prediction layers, and the block's building blocks as Megatron-Core names them:

- ``activation``: ``swiglu`` (gated: fc1 has ``2F`` rows, gate and up), ``gelu`` or
  ``squared_relu`` (not gated: fc1 has ``F`` rows); Megatron ``--swiglu`` / default GELU /
  ``--squared-relu``;
- ``normalization``: ``rmsnorm`` (weight) or ``layernorm`` (weight and bias; one more fp32 statistic
  per token, the mean); Megatron ``--normalization``;
- ``position_embedding``: ``rope`` (no parameters), ``learned_absolute`` (a
  ``max_position_embeddings × h`` table on the first stage, Megatron's default) or ``none``;
- ``tie_embeddings``: one tensor serves as input embedding and output layer (Megatron's default
  unless ``--untie-embeddings-and-output-weights``); with pipeline stages the last stage keeps its
  own copy and the two gradients are all-reduced every step;
- ``add_bias_linear``: biases on every linear layer of the block (Megatron's default unless
  ``--disable-bias-linear``).

Every catalogue model is SwiGLU + RMSNorm + RoPE with untied embeddings and no linear biases: those
are the defaults. Sources are in ``../shared/data/models.md``.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationError, model_validator

from topologies.inputs import (
    NoBoolNumbers,
    UserInputError,
    describe_validation_error,
    resolve_catalog_entry,
)

MODELS_DIR = Path(__file__).parent / "data" / "models"

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]


class _Strict(NoBoolNumbers):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GqaAttention(_Strict):
    """Grouped-query (or multi-head) attention: fused QKV [(n_h + 2 n_kv) d, h] and output [h, n_h d]."""

    kind: Literal["gqa"] = "gqa"
    num_heads: PositiveInt
    num_kv_heads: PositiveInt
    head_dim: PositiveInt
    qk_norm: bool = False

    @model_validator(mode="after")
    def _check(self) -> GqaAttention:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} must be a multiple of num_kv_heads {self.num_kv_heads}")
        return self


class MlaAttention(_Strict):
    """Multi-head latent attention (DeepSeek-V3, Kimi K2)."""

    kind: Literal["mla"] = "mla"
    num_heads: PositiveInt
    q_lora_rank: PositiveInt | None = None
    kv_lora_rank: PositiveInt
    qk_head_dim: PositiveInt = Field(description="non-rotary query/key dim per head (d_nope)")
    qk_pos_emb_head_dim: NonNegativeInt = Field(description="rotary query/key dim per head (d_rope)")
    v_head_dim: PositiveInt
    latent_norm: bool = Field(True, description="norms of the q and kv latents (Megatron builds them only with "
                                                "--qk-layernorm, fused into the up-projections)")

    @property
    def num_kv_heads(self) -> int:
        """MLA has no KV-head grouping constraint; every head is its own group."""
        return self.num_heads


Activation = Literal["swiglu", "gelu", "squared_relu"]
Normalization = Literal["rmsnorm", "layernorm"]
PositionEmbedding = Literal["rope", "learned_absolute", "none"]
GATED_ACTIVATIONS = frozenset({"swiglu"})


class MoeSpec(_Strict):
    """Mixture-of-experts MLP: routed experts (count, top-k, FFN size), shared experts, dense prefix."""

    num_experts: PositiveInt
    topk: PositiveInt
    expert_ffn_hidden_size: PositiveInt
    shared_expert_ffn_hidden_size: NonNegativeInt = Field(0, description="all shared experts summed")
    first_dense_layers: NonNegativeInt = Field(0, description="leading layers with a dense MLP")
    router_bias: bool = Field(False, description="per-expert score bias (aux-loss-free balancing)")

    @model_validator(mode="after")
    def _check(self) -> MoeSpec:
        if self.topk > self.num_experts:
            raise ValueError(f"topk {self.topk} exceeds num_experts {self.num_experts}")
        return self


class ModelSpec(_Strict):
    """A decoder-only transformer (defaults: SwiGLU MLPs, RMSNorm, RoPE, untied embeddings, no biases)."""

    name: str
    display_name: str = ""
    num_layers: PositiveInt
    hidden_size: PositiveInt
    ffn_hidden_size: PositiveInt
    vocab_size: PositiveInt
    make_vocab_size_divisible_by: PositiveInt = 128
    attention: Annotated[GqaAttention | MlaAttention, Field(discriminator="kind")]
    moe: MoeSpec | None = None
    mtp_layers: NonNegativeInt = 0
    activation: Activation = Field("swiglu", description="MLP activation: swiglu (gated, fc1 = 2F), gelu or squared_relu (fc1 = F)")
    normalization: Normalization = Field("rmsnorm", description="rmsnorm (weight) or layernorm (weight and bias)")
    position_embedding: PositionEmbedding = Field("rope", description="rope, learned_absolute (a table parameter) or none")
    max_position_embeddings: PositiveInt | None = Field(None, description="rows of the learned_absolute table (required "
                                                        "for it; seq_length may not exceed it); with rope: the context "
                                                        "the model was trained at (a warning beyond it)")
    tie_embeddings: bool = Field(False, description="one tensor for the input embedding and the output layer")
    add_bias_linear: bool = Field(False, description="biases on the linear layers of attention and MLP (experts included)")

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.moe and self.moe.first_dense_layers > self.num_layers:
            raise ValueError("moe.first_dense_layers exceeds num_layers")
        if self.position_embedding == "learned_absolute" and self.max_position_embeddings is None:
            raise ValueError("position_embedding learned_absolute needs max_position_embeddings (the table's rows)")
        return self

    def context_warning(self, seq_length: int) -> str | None:
        """A warning when a RoPE model runs ``seq_length`` tokens past the ``max_position_embeddings`` it declares
        (the context it was trained at; a learned table refuses such a length instead), else None."""
        rows = self.max_position_embeddings
        if self.position_embedding != "rope" or rows is None or seq_length <= rows:
            return None
        return (f"seq_length {seq_length} tokens exceeds max_position_embeddings {rows} of {self.name} (the context "
                "it declares; RoPE runs longer sequences, but beyond what the model was trained at)")

    # ----- building blocks -----
    @property
    def gated_mlp(self) -> bool:
        """Whether the MLP activation is gated (fc1 computes gate and up: ``2F`` output rows)."""
        return self.activation in GATED_ACTIVATIONS

    @property
    def fc1_factor(self) -> int:
        """Rows of fc1 per ffn column: 2 for a gated activation (gate and up), else 1."""
        return 2 if self.gated_mlp else 1

    @property
    def norm_has_bias(self) -> bool:
        """Whether every norm has a bias (LayerNorm) besides its weight."""
        return self.normalization == "layernorm"

    # ----- layer pattern -----
    def is_moe_layer(self, layer: int) -> bool:
        """Whether main layer ``layer`` (0-based) has an MoE MLP; MTP layers follow the last layer."""
        if self.moe is None:
            return False
        return min(layer, self.num_layers - 1) >= self.moe.first_dense_layers

    @property
    def num_moe_layers(self) -> int:
        """MoE layers among the main layers (MTP excluded)."""
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    @property
    def num_dense_layers(self) -> int:
        """Transformer layers with a dense MLP (main layers minus MoE layers)."""
        return self.num_layers - self.num_moe_layers

    def padded_vocab_size(self, tp: int = 1) -> int:
        """Megatron's padded vocabulary: a multiple of make_vocab_size_divisible_by x tp."""
        m = self.make_vocab_size_divisible_by * tp
        return -(-self.vocab_size // m) * m


def model_names() -> list[str]:
    """Names of the models shipped in the catalogue."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.yaml"))


@cache
def _load_model_cached(name_or_path: str) -> ModelSpec:
    data = resolve_catalog_entry(name_or_path, MODELS_DIR, "model")
    try:
        return ModelSpec.model_validate(data)
    except ValidationError as err:
        raise UserInputError(describe_validation_error(err, f"model '{name_or_path}'", ModelSpec)) from None


def load_model(name_or_path: str) -> ModelSpec:
    """Load a model by catalogue name or from a YAML file path (one-line UserInputError on failure)."""
    return _load_model_cached(str(name_or_path))


def model_label(ref: Any) -> str:
    """How output names a scenario's model (its ``model`` value as the JSON dump holds it): the catalogue name or
    path as given, or an inline spec's name followed by ``(inline)``."""
    if isinstance(ref, ModelSpec):
        ref = {"name": ref.name}
    return f"{ref.get('name', '?')} (inline)" if isinstance(ref, dict) else str(ref)


def resolve_model(ref: str | ModelSpec) -> ModelSpec:
    """The model a scenario names: a catalogue name, a YAML path, or an inline :class:`ModelSpec`
    (e.g. the generated architecture of a measured run that is not a catalogue model)."""
    return ref if isinstance(ref, ModelSpec) else load_model(ref)
