"""Memory per GPU: weights, gradients, optimizer state, optimizer workspace and activations.

Per pipeline stage (every tensor- and expert-parallel rank of a stage holds the same amount), and
for the most loaded stage (:func:`memory_breakdown`). All figures are bytes per GPU.

**Weights and gradients.** Megatron-Core DDP keeps the bf16 parameters (2 B) and a full gradient
buffer in ``optimizer.grad_reduce_dtype`` (4 B for fp32, 2 B for bf16) on every rank, for both the
element-wise and the layer-wise distributed optimizer (``muon-and-distributed-optimizers.md`` §3
"Buffers", §4.4). The expert score bias is a buffer without gradient.

**Optimizer state** (§3 "Memory", §4.4), with ``d`` the group the state is sharded over: the
dense dp×cp group, or the expert-data-parallel group for expert weights; ``d = 1`` when the
distribution is ``replicated``:

- AdamW, element-wise: fp32 ``m`` and ``v`` (8 B) plus an fp32 master copy when the parameters are
  not fp32 (4 B) plus an fp32 copy of the gradient shard when gradients are not fp32 (4 B), divided
  by ``d``. This is Megatron's table: bf16 params + fp32 grads ``6 + 12/d`` B/param, fp16 params +
  grads ``4 + 16/d``, fp32 ``8 + 8/d`` (:func:`distributed_optimizer_bytes_per_param`).
- Muon, layer-wise: fp32 momentum + fp32 master (+ the fp32 gradient copy for bf16 gradients) for
  owned matrices only: ``8·N_own`` with ``N_own ≈ N_muon/d``. The exact ownership (which rank owns
  which matrix after load balancing) is the optimizer model's job; here every rank gets the average
  share, so the most loaded rank can hold somewhat more. Non-Muon parameters (embedding, output
  layer, norms) use AdamW element-wise: ``12·N_adam/d``.

**Optimizer workspace** (Muon only, §4.4): the transient Newton–Schulz buffers of the largest
matrix on the stage: the fp32 Nesterov copy ``U``, ``X`` in the matmul precision, ``A`` and ``B``
(``m×m``) in the matmul precision, the fp32 output and its scaled copy; in ``duplicated`` TP mode
the fp32 all-gather of the full matrix and NS on the full matrix; in ``distributed`` mode the Gram
matrices over the non-sharded dimension; in ``blockwise`` mode the local shard only.

**Activations**: :mod:`workloads.activations` (Korthikanti et al. 2022 adapted to GQA/MLA/MoE).

**Megatron-FSDP** (``fsdp > 0``, AdamW only): parameters, gradients and optimizer state are
sharded over the FSDP group, plus the unsharded bf16 parameters and gradients of the largest layer
for the unit being computed and the one being prefetched.

Not modelled: CUDA context and library workspaces, NCCL buffers, allocator fragmentation, bucket
padding (pass a headroom to :meth:`MemoryBreakdown.fits`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from workloads.activations import (
    LayerShape,
    inflight_chunk_microbatches,
    layer_activation_bytes,
    output_activation_bytes,
)
from workloads.inventory import Inventory, TensorSpec, inventory_for
from workloads.pipeline_layout import layer_placement

if TYPE_CHECKING:
    from workloads.scenario import Scenario

PARAM_BYTES = 2  # bf16 model parameters
FP32_BYTES = 4


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU on one pipeline stage, by component."""

    stage: int
    params_per_gpu: int
    weights_bytes: float
    gradients_bytes: float
    optimizer_state_bytes: float
    optimizer_workspace_bytes: float
    activations_bytes: float
    capacity_bytes: float

    @property
    def total_bytes(self) -> float:
        """Sum of every component, in bytes."""
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_state_bytes
                + self.optimizer_workspace_bytes + self.activations_bytes)

    @property
    def components_bytes(self) -> dict[str, float]:
        """Component name -> bytes (the keys the StepReport's memory section shows)."""
        return {
            "weights": self.weights_bytes,
            "gradients": self.gradients_bytes,
            "optimizer_state": self.optimizer_state_bytes,
            "optimizer_workspace": self.optimizer_workspace_bytes,
            "activations": self.activations_bytes,
        }

    def fits(self, headroom_fraction: float = 0.0) -> bool:
        """Whether the total fits in ``capacity·(1 - headroom_fraction)`` (fraction in [0, 1))."""
        if not 0.0 <= headroom_fraction < 1.0:
            raise ValueError(f"headroom_fraction must be in [0, 1), got {headroom_fraction}")
        return self.total_bytes <= self.capacity_bytes * (1.0 - headroom_fraction)


def distributed_optimizer_bytes_per_param(param_bytes: int, grad_bytes: int, dp: int) -> float:
    """Megatron's element-wise distributed-optimizer (Adam) bytes per parameter, in bytes.

    ``param_bytes + grad_bytes + (8 + master + grad_copy)/dp`` with an fp32 master when params are
    not fp32 and an fp32 gradient copy when gradients are not fp32: (2, 4) -> 6 + 12/dp,
    (2, 2) -> 4 + 16/dp, (4, 4) -> 8 + 8/dp.
    """
    return param_bytes + grad_bytes + adam_state_bytes_per_param(param_bytes, grad_bytes) / dp


def adam_state_bytes_per_param(param_bytes: int = PARAM_BYTES, grad_bytes: int = FP32_BYTES) -> int:
    """Unsharded Adam state per parameter in bytes: fp32 m, v, master (if needed), grad copy (if needed)."""
    return 8 + _fp32_copies(param_bytes, grad_bytes)


def muon_state_bytes_per_param(param_bytes: int = PARAM_BYTES, grad_bytes: int = FP32_BYTES) -> int:
    """Unsharded Muon state per parameter in bytes: fp32 momentum, master (if needed), grad copy (if needed)."""
    return 4 + _fp32_copies(param_bytes, grad_bytes)


def _fp32_copies(param_bytes: int, grad_bytes: int) -> int:
    return (FP32_BYTES if param_bytes < FP32_BYTES else 0) + (FP32_BYTES if grad_bytes < FP32_BYTES else 0)


def optimizer_state_bytes(scenario: Scenario, tensors: list[TensorSpec]) -> float:
    """Persistent optimizer state per GPU for ``tensors`` (one stage), in bytes (average share)."""
    return _optimizer_state_bytes(scenario, [(t, 1) for t in tensors])


def _optimizer_state_bytes(scenario: Scenario, counted: Sequence[tuple[TensorSpec, int]]) -> float:
    """:func:`optimizer_state_bytes` of distinct tensors with their multiplicities."""
    opt = scenario.optimizer
    g = opt.grad_bytes
    dist = opt.resolved_distribution
    dense_d = 1 if dist == "replicated" else scenario.dp * scenario.par.cp
    expert_d = 1 if dist == "replicated" else scenario.expert_dp
    fsdp = scenario.par.fsdp
    total = 0.0
    for t, n in counted:
        if t.optimizer == "none":
            continue
        muon = opt.kind == "muon" and t.optimizer == "muon"
        per_param = muon_state_bytes_per_param(PARAM_BYTES, g) if muon else adam_state_bytes_per_param(PARAM_BYTES, g)
        d = expert_d if t.dp_group == "expert_dp" else dense_d
        if fsdp:
            d = fsdp
        total += per_param * t.rank_numel * n / d
    return total


def newton_schulz_workspace_bytes(tensor: TensorSpec, tp_mode: str, matmul_bytes: int) -> float:
    """Peak transient bytes of orthogonalising one copy of ``tensor`` (largest component), in bytes.

    Buffers: fp32 ``U`` (local shard), ``X`` and ``A``, ``B`` (``m×m``) in ``matmul_bytes``, fp32
    output and scaled copy; ``duplicated`` adds the fp32 gathered full matrix and runs on it.
    """
    best = 0.0
    sharded = tensor.shards > 1 and tp_mode != "blockwise"
    for (rows, cols), (lr, lc) in zip(tensor.muon_components, tensor.local_muon_components, strict=True):
        local = lr * lc
        if sharded and tp_mode == "duplicated":
            full = rows * cols
            m = min(rows, cols)
            ws = FP32_BYTES * local + FP32_BYTES * full + matmul_bytes * full + 2 * matmul_bytes * m * m + 2 * FP32_BYTES * full
        elif sharded:  # distributed: Gram over the non-sharded dimension
            r = cols if tensor.shard_dim == 0 else rows
            ws = FP32_BYTES * local + matmul_bytes * local + 2 * matmul_bytes * r * r + 2 * FP32_BYTES * local
        else:
            m = min(lr, lc)
            ws = FP32_BYTES * local + matmul_bytes * local + 2 * matmul_bytes * m * m + 2 * FP32_BYTES * local
        best = max(best, float(ws))
    return best


def optimizer_workspace_bytes(scenario: Scenario, tensors: list[TensorSpec]) -> float:
    """Newton–Schulz workspace of the largest Muon matrix among ``tensors``, in bytes (0 for AdamW)."""
    opt = scenario.optimizer
    if opt.kind != "muon":
        return 0.0
    matmul_bytes = 2 if opt.matmul_precision == "bf16" else FP32_BYTES
    return max((newton_schulz_workspace_bytes(t, opt.tp_mode, matmul_bytes)
                for t in tensors if t.optimizer == "muon"), default=0.0)


def _layer_shape(scenario: Scenario) -> LayerShape:
    p = scenario.par
    return LayerShape(tokens=p.micro_batch_size * p.seq_length // p.cp, tp=p.tp,
                      sequence_parallel=p.uses_sequence_parallel, etp=p.expert_tp,
                      precision=scenario.precision)


def stage_activation_bytes(scenario: Scenario, stage: int) -> float:
    """Peak activation bytes per GPU on pipeline stage ``stage`` (micro-batches in flight included)."""
    p, model = scenario.par, scenario.model
    shape = _layer_shape(scenario)

    memo: dict[tuple[bool, str], float] = {}

    def per_layer(moe: bool, recompute: str) -> float:
        key = (moe, recompute)
        if key not in memo:
            memo[key] = layer_activation_bytes(model, moe, shape, recompute, p.recompute_modules)
        return memo[key]

    per_chunk = [0.0] * p.vpp
    largest = 0.0
    placement = layer_placement(model.num_layers, p.pp, p.vpp, p.pipeline_split)
    layers = [(i, chunk) for i, (s, chunk) in enumerate(placement) if s == stage]
    layers += [(model.num_layers - 1, p.vpp - 1)] * (model.mtp_layers if stage == p.pp - 1 else 0)
    for i, chunk in layers:
        moe = model.is_moe_layer(i)
        per_chunk[chunk] += per_layer(moe, p.recompute)
        largest = max(largest, per_layer(moe, "none"))
    if stage == p.pp - 1:
        per_chunk[p.vpp - 1] += output_activation_bytes(model, shape)
    counts = inflight_chunk_microbatches(p.pp, p.vpp, stage, scenario.num_microbatches)
    total = sum(c * b for c, b in zip(counts, per_chunk, strict=True))
    if p.recompute == "full":
        total += largest  # one layer's activations while it is recomputed in the backward pass
    return total


def _largest_layer_params(inv: Inventory, stage: int) -> int:
    """Parameters per GPU of the largest layer (FSDP unit) on ``stage``."""
    per_layer: dict[int | None, int] = {}
    for t in inv.stage_tensors(stage):  # per layer: needs every tensor's place
        per_layer[t.layer] = per_layer.get(t.layer, 0) + t.rank_numel
    return max(per_layer.values(), default=0)


def stage_memory(scenario: Scenario, stage: int, inventory: Inventory | None = None) -> MemoryBreakdown:
    """Memory per GPU on pipeline stage ``stage``, by component, in bytes."""
    inv = inventory if inventory is not None else inventory_for(scenario)
    counted = inv.stage_tensor_counts(stage)
    g = scenario.optimizer.grad_bytes
    params = sum(t.rank_numel * n for t, n in counted)
    trained = sum(t.rank_numel * n for t, n in counted if t.optimizer != "none")
    weights, grads = float(PARAM_BYTES * params), float(g * trained)
    fsdp = scenario.par.fsdp
    if fsdp:
        unit = _largest_layer_params(inv, stage)  # unsharded: the unit computed + the one prefetched
        weights, grads = weights / fsdp + 2 * PARAM_BYTES * unit, grads / fsdp + g * unit
    return MemoryBreakdown(
        stage=stage,
        params_per_gpu=params,
        weights_bytes=weights,
        gradients_bytes=grads,
        optimizer_state_bytes=_optimizer_state_bytes(scenario, counted),
        optimizer_workspace_bytes=optimizer_workspace_bytes(scenario, [t for t, _ in counted]),
        activations_bytes=stage_activation_bytes(scenario, stage),
        capacity_bytes=scenario.system.gpu.hbm_bytes,
    )


def memory_by_stage(scenario: Scenario) -> list[MemoryBreakdown]:
    """Memory per GPU for every pipeline stage, in bytes."""
    inv = inventory_for(scenario)
    return [stage_memory(scenario, s, inv) for s in range(scenario.par.pp)]


def memory_breakdown(scenario: Scenario) -> MemoryBreakdown:
    """Memory per GPU of the most loaded pipeline stage (largest total), in bytes."""
    return max(memory_by_stage(scenario), key=lambda m: m.total_bytes)
