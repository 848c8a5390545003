"""The reference run configuration (validated at the boundary; one-line errors).

:class:`RunConfig` is what the CLI, ``python -m reference.launch`` and the tests build. Every
invalid value or combination raises :class:`topologies.inputs.UserInputError` with one line
through :func:`make_config`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from topologies.inputs import UserInputError, describe_validation_error

Optimizer = Literal["adamw", "muon"]
Distribution = Literal["replicated", "element_wise", "layer_wise"]
Layout = Literal["legacy", "current"]
TpMode = Literal["duplicated", "distributed", "blockwise"]
WeightDecayMethod = Literal["decoupled", "independent", "l2", "palm"]
LoadBalance = Literal["none", "ping_pong", "lpt"]
Precision = Literal["bf16", "tf32", "fp32"]
CoefficientName = Literal["simple", "quintic", "polar_express", "cans", "aol", "deepseekv4", "cubic5", "custom"]
ScaleMode = Literal["shape_scaling", "spectral", "unit_rms_norm"]
DType = Literal["fp32", "bf16"]
FailureMode = Literal["exit", "hang", "raise"]


class FailureInjection(BaseModel):
    """Test hook: rank ``rank`` exits, hangs or raises at the start of step ``step``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int = Field(ge=0)
    step: int = Field(0, ge=0)
    mode: FailureMode = "exit"


class RunConfig(BaseModel):
    """One reference run on a dp × tp process grid (world_size = dp · tp ranks)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    world_size: int = Field(2, gt=0, le=64, description="processes (dp · tp)")
    tp: int = Field(1, gt=0, description="tensor-parallel size")
    etp: int = Field(1, gt=0, description="expert tensor-parallel size (1 or a divisor of tp)")
    optimizer: Optimizer = "muon"
    distribution: Distribution | None = Field(None, description="default: element_wise (adamw), layer_wise (muon)")
    layout: Layout = Field("current", description="layer-wise layout: legacy or current")
    tp_mode: TpMode = "duplicated"
    load_balance: LoadBalance | None = Field(None, description="default: lpt (current), ping_pong (legacy)")
    hide_param_gather: bool = True
    steps: int = Field(3, gt=0, le=1000)
    shapes: str = Field("tiny", description="shape preset (tiny, tiny-dense, small, many-small) or model YAML file")
    split_qkv: bool = True
    # Muon
    lr: float = Field(0.02, gt=0)
    momentum: float = Field(0.95, ge=0, lt=1)
    nesterov: bool = False
    weight_decay: float = Field(0.01, ge=0)
    weight_decay_method: WeightDecayMethod = Field(
        "decoupled", description="Muon weight decay (EO): decoupled p-=lr*wd*p, independent p-=wd*p, l2 g+=wd*p, "
        "palm p-=lr^2*wd*p (AdamW: always decoupled)")
    ns_steps: int = Field(5, gt=0, lt=100)
    ns_coefficients: CoefficientName = "quintic"
    custom_coefficients: list[tuple[float, float, float]] | None = None
    matmul_precision: Precision = "bf16"
    ns_eps: float = Field(1e-7, gt=0)
    scale_mode: ScaleMode = "spectral"
    extra_scale_factor: float = Field(1.0, gt=0)
    # AdamW (also Muon's scalar optimizer)
    adam_lr: float | None = Field(None, gt=0, description="default: lr")
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    adam_beta2: float = Field(0.95, ge=0, lt=1)
    adam_eps: float = Field(1e-8, gt=0)
    # buffers and the stand-in model
    param_dtype: DType = "bf16"
    grad_dtype: DType = "fp32"
    bucket_size: int | None = Field(None, gt=0, description="elements; default max(40e6, 1e6·dp)")
    forward_tokens: int = Field(64, gt=0, description="rows of the stand-in activations per matmul")
    seed: int = 1234
    # process control
    backend: Literal["gloo", "nccl"] = "gloo"
    timeout_s: float = Field(120.0, gt=0)
    check: bool = Field(True, description="compare against the single-process reference")
    inject_failure: FailureInjection | None = None

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        if self.world_size % self.tp:
            raise ValueError(f"world_size {self.world_size} is not divisible by tp {self.tp}")
        if self.tp % self.etp:
            raise ValueError(f"etp {self.etp} must divide tp {self.tp}")
        dist = self.resolved_distribution
        if self.optimizer == "adamw" and dist == "layer_wise":
            raise ValueError("distribution layer_wise needs optimizer muon (AdamW uses element_wise or replicated)")
        if self.optimizer == "muon" and dist == "element_wise":
            raise ValueError("distribution element_wise needs optimizer adamw (Muon uses layer_wise or replicated)")
        if self.ns_coefficients == "custom" and not self.custom_coefficients:
            raise ValueError("ns_coefficients custom needs custom_coefficients")
        if self.ns_coefficients == "cubic5" and self.ns_steps != 5:
            raise ValueError("ns_coefficients cubic5 requires exactly 5 ns_steps")
        if self.inject_failure is not None and self.inject_failure.rank >= self.world_size:
            raise ValueError(f"inject_failure.rank {self.inject_failure.rank} is not a rank of world_size {self.world_size}")
        return self

    # ----- derived -----
    @property
    def dp(self) -> int:
        """Data-parallel size: world_size / tp."""
        return self.world_size // self.tp

    @property
    def expert_dp(self) -> int:
        """Expert data-parallel size (ep = 1): world_size / etp."""
        return self.world_size // self.etp

    @property
    def resolved_distribution(self) -> Distribution:
        """The distribution, defaulted from the optimizer."""
        if self.distribution is not None:
            return self.distribution
        return "element_wise" if self.optimizer == "adamw" else "layer_wise"

    @property
    def resolved_load_balance(self) -> LoadBalance:
        """The load balance, defaulted from the layout."""
        if self.load_balance is not None:
            return self.load_balance
        return "lpt" if self.layout == "current" else "ping_pong"

    @property
    def resolved_adam_lr(self) -> float:
        """AdamW learning rate (defaults to the Muon lr)."""
        return self.adam_lr if self.adam_lr is not None else self.lr

    @property
    def bucket_elements(self) -> int:
        """Bucket size in elements: given, or Megatron's max(40e6, 1e6·dp) with the dense dp for
        every buffer (expert buffers included, as DDP computes it once)."""
        if self.bucket_size is not None:
            return self.bucket_size
        return max(40_000_000, 1_000_000 * self.dp)


def make_config(**values: Any) -> RunConfig:
    """Validate ``values`` into a RunConfig and check it against its shapes (UserInputError)."""
    try:
        cfg = RunConfig.model_validate(values)
    except ValidationError as err:
        raise UserInputError(describe_validation_error(err, "reference run")) from None
    check_shapes(cfg)
    return cfg


def check_shapes(cfg: RunConfig) -> None:
    """tp must divide heads, query groups and FFN sizes; etp the expert FFN size."""
    from reference.workload import load_shapes
    from workloads.models import GqaAttention

    model = load_shapes(cfg.shapes)
    att = model.attention
    if not isinstance(att, GqaAttention):
        raise UserInputError(f"shapes '{cfg.shapes}': the reference backend supports GQA attention only")
    for what, value, size in (("attention heads", att.num_heads, cfg.tp), ("query groups", att.num_kv_heads, cfg.tp),
                              ("ffn_hidden_size", model.ffn_hidden_size, cfg.tp)):
        if value % size:
            raise UserInputError(f"tp {size} does not divide the {value} {what} of shapes '{cfg.shapes}'")
    if model.moe and model.moe.expert_ffn_hidden_size % cfg.etp:
        raise UserInputError(f"etp {cfg.etp} does not divide expert_ffn_hidden_size {model.moe.expert_ffn_hidden_size}")
