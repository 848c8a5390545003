"""The reference run configuration (validated at the boundary; one-line errors).

:class:`RunConfig` is what the CLI, ``python -m reference.launch`` and the tests build. Every
invalid value or combination raises :class:`topologies.inputs.UserInputError` with one line
through :func:`make_config`.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from topologies.inputs import UserInputError, describe_validation_error, flag_words
from workloads.optimizer_spec import default_distribution, default_load_balance

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

    world_size: int = Field(2, gt=0, le=64, description="processes (dp × tp)")
    tp: int = Field(1, gt=0, description="tensor-parallel size")
    etp: int = Field(1, gt=0, description="expert tensor-parallel size (1 or a divisor of tp)")
    optimizer: Optimizer = Field("muon", description="optimizer of the 2-D matrices (AdamW for the rest)")
    distribution: Distribution | None = Field(
        None, description="optimizer distribution (default: element_wise for adamw, layer_wise for muon)")
    layout: Layout = Field("current", description="layer-wise layout")
    tp_mode: TpMode = Field("blockwise", description="Muon tensor-parallel Newton-Schulz mode (default: 'blockwise', 'muon_tp_mode' in Megatron-Core 0.16.1, as in predict)")
    load_balance: LoadBalance | None = Field(
        None, description="layer-wise load balance (default: lpt for current, ping_pong for legacy)")
    hide_param_gather: bool = Field(
        False, description="overlap the parameter all-gather with the next forward (Megatron's "
        "overlap_param_gather; off by default there)")
    steps: int = Field(3, gt=0, le=1000, description="optimizer steps (the first is warm-up for timings)")
    shapes: str = Field("tiny", description="shape preset (tiny, tiny-dense, small, many-small) or model YAML file")
    split_qkv: bool = Field(True, description="orthogonalise Q, K, V separately")
    # Muon
    lr: float = Field(0.02, gt=0, description="learning rate")
    momentum: float = Field(0.95, ge=0, lt=1, description="Muon momentum (EMA)")
    nesterov: bool = Field(False, description="Nesterov momentum")
    weight_decay: float = Field(0.01, ge=0, description="weight decay (Muon and AdamW)")
    weight_decay_method: WeightDecayMethod = Field(
        "decoupled", description="Muon weight decay as Emerging-Optimizers: decoupled p-=lr·wd·p, independent "
        "p-=wd·p, l2 g+=wd·p, palm p-=lr²·wd·p (AdamW: decoupled)")
    ns_steps: int = Field(5, gt=0, lt=100, description="Newton-Schulz iterations")
    ns_coefficients: CoefficientName = Field("quintic", description="Newton-Schulz coefficient schedule")
    custom_coefficients: list[tuple[float, float, float]] | None = Field(
        None, description="for custom: 'a,b,c;a,b,c;...' (cycled)")
    matmul_precision: Precision = Field("bf16", description="Newton-Schulz matmul precision")
    ns_eps: float = Field(1e-7, gt=0, description="Newton-Schulz normalisation epsilon")
    scale_mode: ScaleMode = Field("spectral", description="Muon update scale")
    extra_scale_factor: float = Field(1.0, gt=0, description="extra factor on the Muon update scale")
    # AdamW (also Muon's scalar optimizer)
    adam_lr: float | None = Field(None, gt=0, description="AdamW learning rate (default: lr)")
    adam_beta1: float = Field(0.9, ge=0, lt=1, description="AdamW beta1")
    adam_beta2: float = Field(0.95, ge=0, lt=1, description="AdamW beta2")
    adam_eps: float = Field(1e-8, gt=0, description="AdamW epsilon")
    # buffers and the stand-in model
    param_dtype: DType = Field("bf16", description="model parameter dtype (fp32 masters always)")
    grad_dtype: DType = Field("fp32", description="gradient buffer and reduction dtype")
    bucket_size: int | None = Field(None, gt=0, description="bucket size in elements (default: max(40e6, 1e6·dp))")
    forward_tokens: int = Field(64, gt=0, description="activation rows of the stand-in forward/backward matmuls")
    seed: int = Field(1234, description="seed of parameters and synthetic gradients")
    keep_freed_memory: bool = Field(
        True, description="CPU ranks keep freed memory as the CUDA caching allocator does (glibc otherwise gives "
        "it back to the OS and temporaries fault in fresh pages; reference/allocator.py)")
    # process control
    backend: Literal["gloo", "nccl"] = Field("gloo", description="torch.distributed backend (nccl: torchrun only)")
    timeout_s: float = Field(120.0, gt=0, description="wall-clock limit of the whole run in seconds")
    check: bool = Field(True, description="compare with the single-process reference")
    inject_failure: FailureInjection | None = Field(
        None, description="test hook: RANK[:STEP[:exit|hang|raise]]")

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
        if self.custom_coefficients and self.ns_coefficients != "custom":  # else silently unused
            raise ValueError(f"custom_coefficients needs ns_coefficients custom (the {self.ns_coefficients} schedule "
                             "would ignore them)")
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
        return self.distribution if self.distribution is not None else default_distribution(self.optimizer)

    @property
    def resolved_load_balance(self) -> LoadBalance:
        """The load balance, defaulted from the layout."""
        return self.load_balance if self.load_balance is not None else default_load_balance(self.layout)

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


@dataclass(frozen=True)
class RunFlag:
    """A RunConfig field as a command-line option (the CLI and ``python -m reference.launch``).

    ``kind`` is int, float, bool (on/off), choice (``choices``) or str; ``default`` is RunConfig's
    (None: derived from other fields, as ``help`` says).
    """

    name: str
    flag: str
    kind: Literal["int", "float", "bool", "choice", "str"]
    choices: tuple[str, ...]
    default: Any
    help: str


FLAG_NAMES = {"timeout_s": "--timeout"}  # shorter flags than the field name
_ON_OFF = {"on": True, "true": True, "yes": True, "1": True, "off": False, "false": False, "no": False, "0": False}


def on_off(value: object) -> bool:
    """A bool option's value: on/off (also true/false, yes/no, 1/0); ValueError otherwise."""
    if isinstance(value, bool):
        return value
    key = str(value).strip().lower()
    if key not in _ON_OFF:
        raise ValueError(f"must be on or off (got '{value}')")
    return _ON_OFF[key]


def run_flags() -> list[RunFlag]:
    """Every RunConfig field as an option, in declaration order (lists and nested models as str)."""
    out = []
    for name, field in RunConfig.model_fields.items():
        annotation = field.annotation
        args = [a for a in get_args(annotation) if a is not type(None)]
        if get_origin(annotation) in (UnionType, Union) and len(args) == 1:
            annotation = args[0]  # X | None
        choices: tuple[str, ...] = ()
        kind: Literal["int", "float", "bool", "choice", "str"] = "str"
        if get_origin(annotation) is Literal:
            kind, choices = "choice", tuple(str(c) for c in get_args(annotation))
        elif annotation in (int, float, bool):
            kind = annotation.__name__  # type: ignore[union-attr,assignment]
        flag = FLAG_NAMES.get(name, "--" + name.replace("_", "-"))
        out.append(RunFlag(name, flag, kind, choices, field.default, field.description or ""))
    return out


def make_config(**values: Any) -> RunConfig:
    """Validate ``values`` into a RunConfig and check it against its shapes (UserInputError)."""
    try:
        cfg = RunConfig.model_validate(values)
    except ValidationError as err:
        raise UserInputError(_flag_error(err) or describe_validation_error(err, "reference run")) from None
    check_shapes(cfg)
    return cfg


def _flag_error(err: ValidationError) -> str | None:
    """``--flag: must be ... (got VALUE)`` when pydantic's first error is about one field's value (the
    words of the other verbs' flag errors), else None."""
    first = err.errors()[0]
    loc = first.get("loc", ())
    if len(loc) != 1 or loc[0] not in RunConfig.model_fields or first.get("type") == "missing":
        return None
    name = str(loc[0])
    flag = FLAG_NAMES.get(name, "--" + name.replace("_", "-"))
    value = first.get("input")
    return f"{flag}: {flag_words(str(first.get('msg', 'invalid value')))}" + \
        ("" if isinstance(value, dict | list) else f" (got {value})")


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
