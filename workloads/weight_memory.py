"""Weights and gradient buffers per GPU: what Megatron-Core and Transformer Engine keep resident.

All figures are bytes per element (or bytes per GPU) of one rank's tensors (:mod:`workloads.inventory`).
Sources: Megatron-Core's DDP buffers (``muon-and-distributed-optimizers.md`` §3 "Buffers") and our
reading of Megatron-Core / Transformer Engine code (not in ``../shared/reference``; stated as
assumptions where we could not check them on this machine).

**Parameters.** Every parameter is bf16 (2 B; fp16 runs: 2 B), except the GEMM weights of the
transformer layers (Transformer Engine ``Linear`` / ``GroupedLinear``: QKV, output projection, MLP,
experts, MLA projections, MTP's ``eh_proj``) in an FP8/FP4 run:

- **bf16 primary weights** (``fp8_param_gather`` off): the bf16 parameter plus TE's **quantized weight
  cache**. Megatron-Core passes ``is_first_microbatch`` to TE's modules, so TE quantizes each weight on
  the first micro-batch of the step and keeps the quantized copy (``_fp8_workspaces``) for the other
  micro-batches: :func:`quantized_weight_bytes_per_element` per element.
- **FP8 primary weights** (``fp8_param_gather`` on: Megatron ``--fp8-param-gather``, TE
  ``fp8_model_init``; fp8-cs or mxfp8 with AdamW on the element-wise distributed optimizer or on
  Megatron-FSDP, :func:`fp8_primary_weights`): the weight is stored quantized, without a bf16 copy;
  the distributed optimizer's parameter buffer holds the FP8 data (fp8-cs: 1 B, plus the transposed
  copy on GPUs whose FP8 GEMMs are TN only). MXFP8 weights keep their rowwise and
  columnwise data, and the optimizer all-gathers the updated parameters in bf16 into a **bf16
  parameter-gather buffer** (2 B per element) before re-quantizing them, unless
  ``reuse_grad_buf_for_mxfp8_param_ag`` lets that gather land in the gradient buffer (free after the
  optimizer step); Megatron-FSDP has no such buffer (it gathers the uint8 rowwise and columnwise
  data, :mod:`workloads.fp8_params`). Megatron has no FP4 primary weights: NVFP4 runs keep bf16 weights and the cache.
- Layers kept in BF16 (``first_last_layers_bf16``) have bf16 GEMM weights and no cache.

**Gradients.** Megatron-Core DDP keeps one gradient buffer over every trained parameter in
``grad_reduce_dtype`` (fp32 with ``--grad-reduce-in-fp32``, else the parameter dtype, bf16).

**Megatron-FSDP** (``fsdp > 0``, :func:`fsdp_shards`): ``data_parallel_sharding_strategy`` says what is
sharded over the FSDP group (dense parameters over dp·cp, expert parameters over the expert-data-
parallel group): ``no_shard`` nothing, ``optim`` the optimizer state, ``optim_grads`` also the
gradients, ``optim_grads_params`` (full sharding) also the parameters. Sharded parameters are
all-gathered one FSDP unit at a time: the unit being computed and the one being prefetched are
unsharded (2 units, in the gathered dtype); sharded gradients are reduce-scattered one unit at a
time from an unsharded unit buffer (1 unit). With ``keep_fp8_transpose_cache`` on a GPU whose FP8
GEMMs are TN only (Hopper), the transposed FP8 copy of every gathered weight is kept, unsharded
(1 B per GEMM weight element). A unit is one transformer layer, or as many whole
layers as reach ``suggested_communication_unit_size`` elements (our reading of Megatron-FSDP's
bucketing hint; an assumption). ``fsdp_double_buffer`` makes the two gather buffers persistent
(same peak, no allocator churn): no change here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from topologies.hardware import Precision
from workloads.fp8_params import (
    TE_GEMM_ROLES,
    fp8_gather_active,
    is_te_gemm_weight,
    layer_kept_bf16,
)

if TYPE_CHECKING:
    from workloads.inventory import Inventory, TensorRun, TensorSpec
    from workloads.scenario import Scenario

__all__ = ["TE_GEMM_ROLES", "StageWeights", "WeightStorage", "fp8_primary_weights", "fsdp_shards", "is_te_gemm_weight",
           "layer_in_bf16", "low_precision_storage", "min_weight_bytes_per_element", "quantized_weight_bytes_per_element",
           "stage_weights", "weight_storage"]

BF16_BYTES = 2
FP32_BYTES = 4
_FP8_SCALING = ("fp8-cs", "fp8-delayed", "fp8-blockwise")


def quantized_weight_bytes_per_element(precision: Precision | str, fp8_any_layout: bool) -> float:
    """Bytes per weight element of TE's quantized weight (the cache, or an FP8 primary weight), in bytes.

    FP8 with per-tensor or block scaling: 1 B (the scales are negligible), twice where FP8 GEMMs are
    TN only (``fp8_any_layout`` False: Hopper keeps the transposed copy for the dgrad/wgrad GEMMs);
    MXFP8: rowwise and columnwise data, each 1 B + an E8M0 scale per 32 elements (the blocks run
    along different dimensions, so both are kept on every GPU); NVFP4: the same with ½ B + an E4M3
    scale per 16; bf16 / fp16: 0 (no quantized copy).
    """
    p = Precision(precision).value
    if p in _FP8_SCALING:
        return 1.0 if fp8_any_layout else 2.0
    if p == "mxfp8":
        return 2 * (1.0 + 1.0 / 32)
    if p == "nvfp4":
        return 2 * (0.5 + 1.0 / 16)
    return 0.0


def layer_in_bf16(scenario: Scenario, layer: int | None) -> bool:
    """Whether transformer layer ``layer`` runs its GEMMs in BF16 under ``first_last_layers_bf16``
    (:func:`workloads.fp8_params.layer_kept_bf16`)."""
    return layer_kept_bf16(layer, scenario.model.num_layers, scenario.runtime.bf16_layers)


def low_precision_gemm(scenario: Scenario, t: TensorSpec, layer: int | None = -1) -> bool:
    """Whether ``t`` is a GEMM weight that runs in the scenario's FP8/FP4 precision (``layer``: the
    layer the tensor sits in when ``t`` is a template standing for it, default ``t.layer``)."""
    return (scenario.precision.tensor_core_class != "bf16" and is_te_gemm_weight(t)
            and not layer_in_bf16(scenario, t.layer if layer == -1 else layer))


@dataclass(frozen=True)
class WeightStorage:
    """Resident bytes per element of one weight: parameter, TE quantized cache, bf16 gather buffer."""

    param_bytes: float
    cache_bytes: float = 0.0
    gather_buffer_bytes: float = 0.0

    @property
    def gathered_bytes(self) -> float:
        """Bytes per element an unsharded (all-gathered) FSDP copy takes (the stored format)."""
        return self.param_bytes


def fp8_primary_weights(scenario: Scenario) -> bool:
    """Whether ``fp8_param_gather`` makes the TE GEMM weights FP8 primary weights: an fp8-cs or mxfp8
    run with AdamW on Megatron's element-wise distributed optimizer or on Megatron-FSDP (the
    layer-wise Muon optimizer and the replicated one keep bf16 parameters; Megatron has no FP4
    primary weights): the rule of the optimizer plan's FP8 parameter gather
    (:func:`workloads.fp8_params.fp8_gather_active`)."""
    opt = scenario.optimizer
    return fp8_gather_active(opt.kind, opt.resolved_distribution, scenario.precision.value, opt.fp8_param_gather,
                             fsdp=scenario.par.fsdp > 0)


BF16_STORAGE = WeightStorage(float(BF16_BYTES))


def weight_storage(scenario: Scenario, t: TensorSpec, layer: int | None = -1) -> WeightStorage:
    """How one element of ``t`` is stored on a GPU (see the module docstring; ``layer`` as for
    :func:`low_precision_gemm`)."""
    return low_precision_storage(scenario) if low_precision_gemm(scenario, t, layer) else BF16_STORAGE


def low_precision_storage(scenario: Scenario) -> WeightStorage:
    """How one element of a GEMM weight that runs in the scenario's FP8/FP4 precision is stored."""
    opt = scenario.optimizer
    q = quantized_weight_bytes_per_element(scenario.precision, scenario.system.gpu.fp8_gemm_any_layout)
    if fp8_primary_weights(scenario):
        mxfp8 = scenario.precision.value == "mxfp8"
        # the distributed optimizer's BF16 gather buffer; Megatron-FSDP gathers uint8 data (workloads.fp8_params)
        gather = float(BF16_BYTES) if mxfp8 and not opt.reuse_grad_buf_for_mxfp8_param_ag and scenario.par.fsdp <= 0 else 0.0
        return WeightStorage(q, 0.0, gather)
    return WeightStorage(float(BF16_BYTES), q)


def min_weight_bytes_per_element(scenario: Scenario) -> float:
    """The fewest bytes any parameter of ``scenario`` can take on a GPU (bf16 2, or an FP8 primary
    weight's quantized bytes): a per-parameter floor for the planner's memory screen, whatever the
    layout and whatever optimizer the planner tries (FP8 primary weights need AdamW on the
    element-wise distributed optimizer, which a search may pick for a Muon base)."""
    opt = scenario.optimizer
    if fp8_gather_active("adamw", "element_wise", scenario.precision.value, opt.fp8_param_gather):
        q = quantized_weight_bytes_per_element(scenario.precision, scenario.system.gpu.fp8_gemm_any_layout)
        return min(float(BF16_BYTES), q)
    return float(BF16_BYTES)


@dataclass(frozen=True)
class ShardSizes:
    """Ranks sharing each persistent buffer of one data-parallel group (1 = every rank holds all)."""

    params: int
    grads: int


def fsdp_group_size(scenario: Scenario, dp_group: str) -> int:
    """Ranks of the Megatron-FSDP sharding group of ``dp_group`` (dp·cp dense, expert_dp experts)."""
    return scenario.dp * scenario.par.cp if dp_group == "dp" else scenario.expert_dp


def fsdp_shards(scenario: Scenario, dp_group: str) -> ShardSizes:
    """Sharding of parameters and gradients of ``dp_group``'s tensors (Megatron-FSDP strategy; 1, 1
    without FSDP: Megatron-Core DDP keeps every parameter and the full gradient buffer on every rank)."""
    if scenario.par.fsdp <= 0:
        return ShardSizes(1, 1)
    g = fsdp_group_size(scenario, dp_group)
    strategy = scenario.optimizer.data_parallel_sharding_strategy
    return ShardSizes(g if strategy == "optim_grads_params" else 1,
                      g if strategy in ("optim_grads", "optim_grads_params") else 1)


@dataclass(frozen=True)
class StageWeights:
    """Weight and gradient bytes per GPU of one stage, by kind (bytes)."""

    params_bytes: float  # parameters as stored (bf16 or quantized primary weights), sharded by FSDP
    buffers_bytes: float  # TE quantized caches, bf16 parameter-gather buffers, unsharded FSDP units
    gradients_bytes: float  # gradient buffer (sharded by FSDP) and unsharded FSDP gradient units


def _unit_layers(scenario: Scenario, layer_numel: int) -> int:
    """Transformer layers per FSDP unit (``suggested_communication_unit_size`` elements at least)."""
    size = scenario.optimizer.suggested_communication_unit_size
    if not size or layer_numel <= 0:
        return 1
    return max(1, math.ceil(size / layer_numel))


def _layer_classes(scenario: Scenario, run: TensorRun) -> list[tuple[int | None, int]]:
    """The run's layers split by whether they are kept in BF16: (a representative layer, how many)."""
    if run.count == 1 or scenario.runtime.bf16_layers == (0, 0) or scenario.precision.tensor_core_class == "bf16":
        return [(run.layers[0], run.count)]
    classes: dict[bool, list[int | None]] = {}
    for layer in run.layers:
        classes.setdefault(layer_in_bf16(scenario, layer), []).append(layer)
    return [(layers[0], len(layers)) for layers in classes.values()]


def stage_weights(scenario: Scenario, inventory: Inventory, stage: int) -> StageWeights:
    """Weights, weight buffers and gradients per GPU on ``stage`` (bytes; see the module docstring).

    Works per distinct tensor: the layers of a run (:class:`workloads.inventory.TensorRun`) hold the
    same tensors, split only by whether a layer is kept in BF16.
    """
    g = scenario.optimizer.grad_bytes
    keep_transposes = scenario.optimizer.keep_fp8_transpose_cache and not scenario.system.gpu.fp8_gemm_any_layout
    params = buffers = grads = 0.0
    # per FSDP unit (a layer, or the embedding / output layer by role): unsharded bytes of its sharded
    # parameters and gradients, and its parameter elements; every layer of a run class is alike
    unit_gather: dict[int | str, float] = {}
    unit_grads: dict[int | str, float] = {}
    unit_numel: dict[int | str, int] = {}
    lowp = low_precision_storage(scenario) if scenario.precision.tensor_core_class != "bf16" else BF16_STORAGE
    shards = {g: fsdp_shards(scenario, g) for g in ("dp", "expert_dp")}
    fsdp = any(sh.params > 1 or sh.grads > 1 for sh in shards.values())
    split = {group: (sh.params, sh.grads) for group, sh in shards.items()}  # read once, not per tensor
    for run in inventory.stage_runs(stage):
        for layer, count in _layer_classes(scenario, run):
            gather = grad_units = 0.0
            numel_units = 0
            # low_precision_gemm per template: the precision and the layer's BF16 status, decided once per class
            low_layer = lowp is not BF16_STORAGE and not layer_in_bf16(scenario, layer)
            for t in run.templates:
                n = float(t.rank_numel)
                w = lowp if low_layer and is_te_gemm_weight(t) else BF16_STORAGE
                param_shards, grad_shards = split[t.dp_group]
                params += w.param_bytes * n / param_shards * count
                buffers += ((w.cache_bytes if param_shards == 1 else 0.0) * n + w.gather_buffer_bytes * n / param_shards) * count
                if param_shards > 1:
                    if keep_transposes and w is not BF16_STORAGE:
                        buffers += n * count  # Megatron-FSDP keep_fp8_transpose_cache: every gathered FP8 weight's transpose stays
                    gather += w.gathered_bytes * n
                    numel_units += t.rank_numel
                if t.optimizer == "none":
                    continue
                grads += g * n / grad_shards * count
                if grad_shards > 1:
                    grad_units += g * n
                    if param_shards == 1:
                        numel_units += t.rank_numel
            if not fsdp:
                continue
            unit: int | str = layer if layer is not None else run.templates[0].role
            if any(shards[t.dp_group].params > 1 for t in run.templates):
                unit_gather[unit] = unit_gather.get(unit, 0.0) + gather
            if any(shards[t.dp_group].params > 1 or (t.optimizer != "none" and shards[t.dp_group].grads > 1)
                   for t in run.templates):
                unit_numel[unit] = unit_numel.get(unit, 0) + numel_units
            if any(t.optimizer != "none" and shards[t.dp_group].grads > 1 for t in run.templates):
                unit_grads[unit] = unit_grads.get(unit, 0.0) + grad_units
    if unit_gather or unit_grads:
        layer_numel = max((v for k, v in unit_numel.items() if isinstance(k, int)), default=0)
        layers = _unit_layers(scenario, layer_numel)

        def unit_bytes(per_unit: dict[int | str, float]) -> float:
            """The largest FSDP unit: ``layers`` transformer layers, or the embedding / output layer."""
            return max((v * (layers if isinstance(k, int) else 1) for k, v in per_unit.items()), default=0.0)

        buffers += 2 * unit_bytes(unit_gather)  # the unit computed + the one prefetched
        grads += unit_bytes(unit_grads)  # the unit being reduce-scattered
    return StageWeights(params, buffers, grads)
