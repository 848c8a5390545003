"""Memory per GPU: weights, gradients, optimizer state, activations, and the peak they reach together.

Per pipeline stage (every tensor- and expert-parallel rank of a stage holds the same amount), and
for the most loaded stage (:func:`memory_breakdown`). All figures are bytes per GPU. Each component
is one module's mechanism:

- **weights** and **weight buffers** (:mod:`workloads.weight_memory`): parameters as stored (bf16, or
  FP8 primary weights with ``fp8_param_gather``), Transformer Engine's quantized weight caches, the
  bf16 parameter-gather buffer of MXFP8 primary weights, unsharded Megatron-FSDP units;
- **gradients** (:mod:`workloads.weight_memory`): the DDP gradient buffer in ``grad_reduce_dtype``
  (sharded by Megatron-FSDP's ``optim_grads`` / ``optim_grads_params``);
- **optimizer state** and the optimizer step's **workspace** (:mod:`workloads.optimizer_memory`):
  AdamW / Muon state (precision-aware dtypes, distributed-optimizer instances, FSDP, CPU offload),
  and the step's transient buffers (fp32 gradient copies, the larger of the Newton–Schulz workspace
  and the legacy layer-wise gather's flat buffers);
- **activations** (:mod:`workloads.activation_memory`): the stage's peak over the schedule
  (recompute, offloading, BF16 layers, the loss).

**Peak.** The caching allocator reuses freed memory, so buffers that never coexist do not add up:
the activations are all freed when the last backward of the step ends, and the optimizer step's
transient buffers exist only during the step. The peak per GPU is therefore

    weights + weight buffers + gradients + optimizer state + max(activations, optimizer workspace)

(:attr:`MemoryBreakdown.total_bytes`); the components are reported separately.

Not modelled: CUDA context and library workspaces, NCCL buffers, allocator fragmentation (pass a
headroom to :meth:`MemoryBreakdown.fits`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from workloads.activation_memory import activation_bytes_by_stage, stage_activation_bytes
from workloads.inventory import Inventory, TensorRun, inventory_for
from workloads.optimizer_memory import (
    StateBytes,
    adam_state_bytes_per_param,
    counted_optimizer_bytes,
    distributed_optimizer_bytes_per_param,
    legacy_gather_bytes,
    muon_state_bytes_per_param,
    newton_schulz_workspace_bytes,
    optimizer_workspace_bytes,
)
from workloads.weight_memory import StageWeights, layer_in_bf16, stage_weights

if TYPE_CHECKING:
    from workloads.scenario import Scenario

__all__ = ["MemoryBreakdown", "adam_state_bytes_per_param", "distributed_optimizer_bytes_per_param",
           "memory_breakdown", "memory_by_stage", "muon_state_bytes_per_param", "newton_schulz_workspace_bytes",
           "stage_activation_bytes", "stage_memory"]


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU on one pipeline stage, by component; ``total_bytes`` is the peak."""

    stage: int
    params_per_gpu: int
    weights_bytes: float
    gradients_bytes: float
    optimizer_state_bytes: float
    optimizer_workspace_bytes: float  # transient: only during the optimizer step
    activations_bytes: float  # transient: only during forward/backward
    capacity_bytes: float
    weight_buffers_bytes: float = 0.0

    @property
    def persistent_bytes(self) -> float:
        """What stays allocated through the whole step: weights, their buffers, gradients, optimizer state."""
        return self.weights_bytes + self.weight_buffers_bytes + self.gradients_bytes + self.optimizer_state_bytes

    @property
    def total_bytes(self) -> float:
        """Peak bytes per GPU: persistent + max(activations, optimizer workspace) (they never coexist)."""
        return self.persistent_bytes + max(self.activations_bytes, self.optimizer_workspace_bytes)

    @property
    def components_bytes(self) -> dict[str, float]:
        """Component name -> bytes (the keys the StepReport's memory section shows)."""
        return {
            "weights": self.weights_bytes,
            "weight_buffers": self.weight_buffers_bytes,
            "gradients": self.gradients_bytes,
            "optimizer_state": self.optimizer_state_bytes,
            "optimizer_workspace": self.optimizer_workspace_bytes,
            "activations": self.activations_bytes,
        }

    def fits(self, headroom_fraction: float = 0.0) -> bool:
        """Whether the peak fits in ``capacity·(1 - headroom_fraction)`` (fraction in [0, 1))."""
        if not 0.0 <= headroom_fraction < 1.0:
            raise ValueError(f"headroom_fraction must be in [0, 1), got {headroom_fraction}")
        return self.total_bytes <= self.capacity_bytes * (1.0 - headroom_fraction)


StageStateBytes = tuple[StageWeights, StateBytes, float]  # weights, optimizer state, optimizer workspace


def stage_memory(scenario: Scenario, stage: int, inventory: Inventory | None = None,
                 memo: dict[tuple, StageStateBytes] | None = None,
                 activations_bytes: tuple[float, ...] | None = None) -> MemoryBreakdown:
    """Memory per GPU on pipeline stage ``stage``, by component, in bytes (``memo``: the weight and
    optimizer bytes of the scenario's stages so far, see :func:`_stage_state_key`;
    ``activations_bytes``: every stage's :func:`activation_bytes_by_stage` when the caller has them)."""
    inv = inventory if inventory is not None else inventory_for(scenario)
    runs = inv.stage_runs(stage)
    key = _stage_state_key(scenario, runs) if memo is not None else None
    hit = memo.get(key) if memo is not None and key is not None else None
    if hit is None:
        weights = stage_weights(scenario, inv, stage)
        counted = [(t, r.count) for r in runs for t in r.templates]
        opt = counted_optimizer_bytes(scenario, counted)
        workspace = max(optimizer_workspace_bytes(scenario, {id(r.templates): r.templates for r in runs}.values()),
                        legacy_gather_bytes(scenario, counted))
        hit = (weights, opt, workspace)
        if memo is not None and key is not None:
            memo[key] = hit
    weights, opt, workspace = hit
    return MemoryBreakdown(
        stage=stage,
        params_per_gpu=inv.rank_numel(stage),
        weights_bytes=weights.params_bytes,
        weight_buffers_bytes=weights.buffers_bytes,
        gradients_bytes=weights.gradients_bytes,
        optimizer_state_bytes=opt.persistent,
        optimizer_workspace_bytes=opt.transient + workspace,
        activations_bytes=stage_activation_bytes(scenario, stage) if activations_bytes is None
        else activations_bytes[stage],
        capacity_bytes=scenario.system.gpu.hbm_bytes,
    )


def _stage_state_key(scenario: Scenario, runs: tuple[TensorRun, ...]) -> tuple | None:
    """What a stage's weight and optimizer bytes depend on within one scenario: per run (in order)
    its kind, layer count, tensors and which of its layers are kept in BF16 (stages of the same
    layers hold the same bytes). None with Megatron-FSDP, whose per-layer units are keyed by layer
    number (such stages are computed afresh)."""
    if scenario.par.fsdp > 0:
        return None
    if scenario.runtime.bf16_layers == (0, 0):  # no layer is kept in BF16: the same answer for every layer
        return tuple((r.kind, r.count, tuple(map(id, r.templates))) for r in runs)
    return tuple((r.kind, r.count, tuple(map(id, r.templates)), tuple(layer_in_bf16(scenario, x) for x in r.layers))
                 for r in runs)


def memory_by_stage(scenario: Scenario) -> list[MemoryBreakdown]:
    """Memory per GPU for every pipeline stage, in bytes."""
    inv = inventory_for(scenario)
    memo: dict[tuple, StageStateBytes] = {}
    activations = activation_bytes_by_stage(scenario)
    return [stage_memory(scenario, s, inv, memo, activations) for s in range(scenario.par.pp)]


def memory_breakdown(scenario: Scenario) -> MemoryBreakdown:
    """Memory per GPU of the most loaded pipeline stage (largest peak), in bytes."""
    return max(memory_by_stage(scenario), key=lambda m: m.total_bytes)
