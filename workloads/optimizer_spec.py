"""The optimizer section of a scenario: which optimizer, and how Megatron-Core distributes it.

:class:`OptimizerSpec` holds the optimizer (AdamW or Muon), its Newton-Schulz settings, the
data-parallel distribution (element-wise distributed optimizer, layer-wise, replicated), and the
Megatron DDP / distributed-optimizer / Megatron-FSDP settings that change its memory or
communication. :func:`hypothetical_reason` says which layer-wise (layout, load balance) pairs
Megatron-Core does not have. Re-exported by :mod:`workloads.scenario`.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from topologies.inputs import NoBoolNumbers

OptimizerKind = Literal["adamw", "muon"]
Distribution = Literal["replicated", "element_wise", "layer_wise"]
LayerWiseLayout = Literal["legacy", "current"]
TpMode = Literal["duplicated", "distributed", "blockwise"]
LoadBalance = Literal["none", "ping_pong", "lpt"]
MatmulPrecision = Literal["bf16", "tf32", "fp32"]
ShardingStrategy = Literal["no_shard", "optim", "optim_grads", "optim_grads_params"]
StateDtype = Literal["fp32", "bf16", "fp16", "fp8"]
EO_MIN_SYRK_CUBIC5 = (0, 4)  # Emerging-Optimizers release that added SYRK on the TP path and the cubic5 schedule
EO_KNOWN_RELEASES = ("0.3.0", "0.3.1", "0.4.0")
"""The Emerging-Optimizers releases the model has rules for (tags read; Megatron-Core pins 0.3.0, SYRK and cubic5
need 0.4): any other version would be modelled as one of these without saying so, so it is refused."""
CoefficientSet = Literal["simple", "quintic", "polar_express", "cans", "aol", "deepseekv4", "cubic5", "custom"]

__all__ = ["EO_KNOWN_RELEASES", "EO_MIN_SYRK_CUBIC5", "MEGATRON_LOAD_BALANCE", "CoefficientSet", "Distribution", "LayerWiseLayout",
           "LoadBalance", "MatmulPrecision", "OptimizerKind", "OptimizerSpec", "ShardingStrategy", "StateDtype", "TpMode",
           "hypothetical_reason", "unused_setting_notes"]


def default_distribution(optimizer: str) -> Distribution:
    """Megatron's distributed optimizer for ``optimizer``: element-wise for AdamW, layer-wise for Muon."""
    return "element_wise" if optimizer == "adamw" else "layer_wise"


def default_load_balance(layout: str) -> LoadBalance:
    """The load balance Megatron runs with a layer-wise ``layout``: lpt (current), ping_pong (legacy)."""
    return "lpt" if layout == "current" else "ping_pong"


@lru_cache(maxsize=64)
def version_tuple(version: str) -> tuple[int, ...]:
    """A dotted version string as integers, e.g. '0.3.0' -> (0, 3, 0) (memoised: every scenario
    validation reads it)."""
    return tuple(int(x) for x in version.split("."))


class OptimizerSpec(NoBoolNumbers):
    """The optimizer and how Megatron distributes it over data-parallel ranks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: OptimizerKind = "muon"
    distribution: Distribution | None = Field(None, description="default: element_wise for adamw, layer_wise for muon")
    layer_wise_layout: LayerWiseLayout = Field("current", description="legacy: all-reduce + variable all-gather; current: padded reduce-scatter + equal all-gather")
    ns_steps: int = Field(5, gt=0, lt=100)
    ns_coefficients: CoefficientSet = "quintic"
    tp_mode: TpMode = Field("blockwise", description="Muon's tensor-parallel Newton-Schulz mode; default Megatron's "
                            "(muon_tp_mode, Megatron-Core 0.16.1 optimizer_config.py:278, and every release of "
                            "the recipe settings file)")
    matmul_precision: MatmulPrecision = Field("bf16", description="Newton-Schulz matmuls: bf16 ('medium'), tf32 ('high'), fp32 ('highest')")
    use_syrk: bool = False
    split_qkv: bool = True
    use_nesterov: bool = Field(False, description="Megatron --muon-use-nesterov (Megatron-Core default off, "
                               "optimizer_config.py:266): one more lerp kernel per Muon tensor")
    load_balance: LoadBalance | None = Field(None, description="default: lpt (current layout), ping_pong (legacy)")
    hide_param_gather: bool = Field(False, description="overlap the parameter all-gather with the next forward "
                                    "(Megatron overlap_param_gather; off by default as in Megatron-Core)")
    overlap_grad_reduce: bool = True
    grad_reduce_dtype: Literal["fp32", "bf16"] = Field("fp32", description="Megatron --grad-reduce-in-fp32 (fp32) "
                                                       "or not (bf16: the gradient buffer's dtype)")
    bucket_size_elements: int | None = Field(None, gt=0, description="Megatron --ddp-bucket-size (elements); "
                                             "default: max(40e6, 1e6 * dp)")
    fp8_param_gather: bool = Field(False, description="Megatron --fp8-param-gather: FP8 primary weights, the "
                                   "parameter all-gather moves FP8 (1 B per element)")
    reuse_grad_buf_for_mxfp8_param_ag: bool = Field(False, description="Megatron --reuse-grad-buf-for-mxfp8-param-ag: "
                                                    "the MXFP8 parameter all-gather reuses the gradient buffer")
    overlap_param_gather_with_optimizer_step: bool = Field(False, description="Megatron --overlap-param-gather-with-"
                                                           "optimizer-step: the first chunk's gather overlaps the step")
    align_param_gather: bool = Field(False, description="Megatron --align-param-gather: the virtual chunks' parameter "
                                     "all-gathers are issued together after the optimizer step")
    average_in_collective: bool = Field(False, description="Megatron DDP average_in_collective: the reduction "
                                        "averages (NCCL avg) instead of every rank first scaling its gradient buckets "
                                        "by 1/dp (a read-write pass over the buckets in the backward pass)")
    num_distributed_optimizer_instances: int = Field(1, ge=1, description="Megatron --num-distributed-optimizer-"
                                                     "instances: the data-parallel group is split into this many "
                                                     "optimizer-sharding groups (partial sharding)")
    data_parallel_sharding_strategy: ShardingStrategy = Field(
        "optim_grads_params", description="Megatron-FSDP --data-parallel-sharding-strategy (with fsdp > 0): what is "
                                          "sharded; muonsim's default is what the recipes use (full sharding)")
    fsdp_double_buffer: bool = Field(False, description="Megatron-FSDP --fsdp-double-buffer: two persistent "
                                     "all-gather buffers instead of per-unit allocations")
    nccl_ub: bool = Field(False, description="Megatron-FSDP --use-nccl-ub: NCCL user-buffer registration")
    suggested_communication_unit_size: int | None = Field(None, gt=0, description="Megatron-FSDP "
                                                          "--suggested-communication-unit-size (elements)")
    keep_fp8_transpose_cache: bool = Field(False, description="Megatron-FSDP --keep-fp8-transpose-cache")
    use_precision_aware_optimizer: bool = Field(False, description="Megatron --use-precision-aware-optimizer: the "
                                                "state dtypes below take effect (TE FusedAdam)")
    main_grads_dtype: StateDtype = Field("fp32", description="Megatron --main-grads-dtype (precision-aware optimizer)")
    main_params_dtype: StateDtype = Field("fp32", description="Megatron --main-params-dtype (precision-aware optimizer)")
    exp_avg_dtype: StateDtype = Field("fp32", description="Megatron --exp-avg-dtype (precision-aware optimizer)")
    exp_avg_sq_dtype: StateDtype = Field("fp32", description="Megatron --exp-avg-sq-dtype (precision-aware optimizer)")
    optimizer_cpu_offload: bool = Field(False, description="Megatron --optimizer-cpu-offload: optimizer state and "
                                        "step on the host")
    eo_version: str = Field("0.3.0", pattern=r"^\d+\.\d+(\.\d+)?$",
                            description="Emerging-Optimizers version (Megatron-Core pins 0.3.0; SYRK and cubic5 need >= 0.4)")

    @field_validator("eo_version")
    @classmethod
    def _known_eo_release(cls, version: str) -> str:
        """Only the releases in :data:`EO_KNOWN_RELEASES` ('0.4' reads as 0.4.0)."""
        padded = version_tuple(version) + (0,) * (3 - len(version.split(".")))
        if padded not in {version_tuple(v) for v in EO_KNOWN_RELEASES}:
            raise ValueError("not an Emerging-Optimizers release muonsim models; valid: "
                             f"{', '.join(EO_KNOWN_RELEASES)}")
        return version

    @property
    def eo_version_tuple(self) -> tuple[int, ...]:
        """``eo_version`` as integers, e.g. (0, 3, 0)."""
        return version_tuple(self.eo_version)

    @property
    def resolved_distribution(self) -> Distribution:
        """The distribution with its default: element-wise for AdamW, layer-wise for Muon."""
        return self.distribution if self.distribution is not None else default_distribution(self.kind)

    @property
    def resolved_load_balance(self) -> LoadBalance:
        """The layer-wise load balance with its default: lpt (current layout), ping_pong (legacy)."""
        return self.load_balance if self.load_balance is not None else default_load_balance(self.layer_wise_layout)

    @property
    def hypothetical_reason(self) -> str | None:
        """Why Megatron-Core has no such optimizer (None when it has): see :func:`hypothetical_reason`."""
        return hypothetical_reason(self.resolved_distribution, self.layer_wise_layout, self.resolved_load_balance)

    @property
    def grad_bytes(self) -> int:
        """Bytes per gradient element in the data-parallel reduction (4 fp32, 2 bf16)."""
        return 4 if self.grad_reduce_dtype == "fp32" else 2


MEGATRON_LOAD_BALANCE: dict[str, str] = {"legacy": "ping_pong", "current": "lpt"}
"""The one load balance each Megatron-Core layer-wise layout has: the legacy ``shard_params`` deals
parameters ping-pong by numel; the current per-buffer layout assigns them by LPT on Newton-Schulz cost."""


def hypothetical_reason(distribution: str, layout: str | None, load_balance: str | None) -> str | None:
    """Why a layer-wise (layout, load balance) pair is not in Megatron-Core, or None when it is (or
    when the distribution is not layer-wise). The other pairs are what-ifs the model can evaluate."""
    if distribution != "layer_wise" or layout is None or load_balance is None:
        return None
    real = MEGATRON_LOAD_BALANCE[layout]
    if load_balance == real:
        return None
    return (f"hypothetical: Megatron-Core's {layout} layer-wise layout balances by {real} only; "
            f"{layout} with load_balance {load_balance} is a what-if, not something Megatron runs")


MUON_ONLY_SETTINGS: dict[str, str] = {
    "tp_mode": "tensor-parallel Newton-Schulz mode", "ns_steps": "Newton-Schulz iterations",
    "ns_coefficients": "Newton-Schulz coefficients", "matmul_precision": "Newton-Schulz matmul precision",
    "use_syrk": "SYRK Newton-Schulz products", "split_qkv": "per-head Q/K/V orthogonalisation",
    "eo_version": "Emerging-Optimizers release", "use_nesterov": "Nesterov momentum"}
"""The settings only Muon's orthogonalisation reads (key -> what they set)."""
LAYER_WISE_SETTINGS: dict[str, str] = {"layer_wise_layout": "buffer layout", "load_balance": "parameter-to-rank balance"}
"""The settings only the layer-wise distributed optimizer reads (key -> what they set)."""


def unused_setting_notes(spec: OptimizerSpec) -> tuple[str, ...]:
    """One 'KEY has no effect ...' line per setting ``spec`` holds that its optimizer never reads: Muon's
    settings under AdamW, the layer-wise optimizer's under another distribution (the CLI shows those the
    user gave)."""
    if spec.kind == "adamw":
        return (*(f"{key} has no effect with optimizer adamw: it sets Muon's {what}"
                  for key, what in MUON_ONLY_SETTINGS.items()),
                *(f"{key} has no effect with optimizer adamw: it sets the {what} of Muon's layer-wise optimizer"
                  for key, what in LAYER_WISE_SETTINGS.items()))
    dist = spec.resolved_distribution
    if dist == "layer_wise":
        return ()
    return tuple(f"{key} has no effect with the {dist} distribution: it sets the layer-wise optimizer's {what}"
                 for key, what in LAYER_WISE_SETTINGS.items())
