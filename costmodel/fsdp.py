"""Megatron-FSDP (``fsdp > 0``): per-layer parameter all-gathers and gradient reduce-scatters.

Megatron-Core's Megatron-FSDP (``megatron/core/distributed/fsdp``, ``--use-megatron-fsdp``) shards
what ``--data-parallel-sharding-strategy`` says over the data-parallel group:

==================== ============================== ==============================================
strategy             sharded                        collectives (this module / the optimizer plan)
==================== ============================== ==============================================
``no_shard``         nothing                        gradients all-reduced per bucket after the last
                                                    micro-batch's backward (DDP); every rank steps
                                                    every parameter
``optim``            optimizer state                gradients reduce-scattered per bucket after the
                                                    last micro-batch (they accumulate unsharded);
                                                    parameters all-gathered after the step
``optim_grads``      + gradients                    per layer and micro-batch a gradient
                                                    reduce-scatter in backward (ZeRO-2: no
                                                    unsharded buffer to accumulate into);
                                                    parameters all-gathered after the step
``optim_grads_params`` + parameters (full, ZeRO-3)  per layer and micro-batch the parameter
                                                    all-gather in forward and again in backward,
                                                    and the gradient reduce-scatter
==================== ============================== ==============================================

The per-step bucket collectives of ``no_shard``, ``optim`` and ``optim_grads`` are the optimizer
plan's (:func:`costmodel.optimizer.plan.plan_from_inventory`) and overlap like the distributed
optimizer's (``overlap_grad_reduce``, ``overlap_param_gather``); the per-layer ones are here.
The parameter all-gathers move the parameters as stored (:func:`workloads.weight_memory.weight_storage`:
bf16, or 1 B per element of an FP8 primary weight with ``fp8_param_gather``). ``fsdp_double_buffer``
(persistent gather buffers), ``nccl_ub`` (NCCL user-buffer registration: zero-copy collectives with
fewer SMs; this model has no SM term for FSDP traffic) and ``suggested_communication_unit_size``
(larger units: the same bytes in fewer collectives, their latency aside) change no time here.
Assumptions of this model (stated, not fitted; from Megatron-Core's behaviour as we read it):

- **Sharding group.** Dense parameters are sharded over the data-parallel group with context
  parallelism (``dp·cp``, the group their gradients reduce over, :mod:`topologies.placement`'s
  ``dp`` shape); expert parameters over the expert-data-parallel group. Only full sharding is
  modelled: ``fsdp`` must equal ``dp·cp`` (what every published Megatron-Bridge FSDP run does);
  hybrid sharding (``fsdp`` a proper divisor) raises :class:`costmodel.errors.UnsupportedScenario`.
- **Units.** One FSDP unit per transformer layer (``fsdp_unit_modules`` = the transformer layer)
  and per MTP layer; the embedding and the output layer (with the final norm) are units too. A
  unit's parameters are its tensors of :mod:`workloads.inventory` on one tp/ep rank (the tp/etp
  shard, all local experts); buffers without gradient (the router's expert bias) are not gathered.
- **Per micro-batch, per unit** (full sharding). Forward: an all-gather of the unit's parameters
  (as stored). Backward: the all-gather again (the unsharded copy is freed after forward) and a
  reduce-scatter of its gradients in ``optimizer.grad_reduce_dtype`` (4 B fp32 or 2 B bf16, as the
  distributed optimizer's buckets). Gradients are reduce-scattered every micro-batch (ZeRO-2/3
  keep no unsharded gradient buffer to accumulate into) and accumulated into the local shard. With
  full recompute the backward's gather serves the recomputed forward too (no third gather).
- **Overlap.** Megatron-FSDP prefetches the next unit's all-gather while the current unit computes
  and overlaps a unit's reduce-scatter with the next unit's backward. With units of similar size
  the collectives of a unit are hidden behind one unit's compute: the exposed fraction of a
  pass's FSDP collectives is ``max(0, t_comm − t_compute) / t_comm`` (as the CP ring exchange).
  The first unit's gather of a pass is not special-cased (it overlaps the previous pass's tail).
  ``overlap=False`` exposes all of it. The SM slowdown of overlapped DP traffic
  (``EfficiencyFactors.overlap_compute_slowdown``) is not applied to FSDP traffic.
- **Optimizer.** No per-step gradient buckets or parameter all-gather remain: the optimizer step
  is AdamW on the local shard (see :func:`costmodel.optimizer.plan.plan_from_inventory`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from costmodel.layer_costs import CommAcc, CommBlock, collective_s
from topologies.groups import GroupShape
from topologies.hardware import SystemSpec
from workloads.comm import CollectiveCall
from workloads.weight_memory import weight_storage

if TYPE_CHECKING:
    from workloads.inventory import Inventory, TensorSpec
    from workloads.scenario import Scenario

FSDP_KIND = "dp_fsdp"
PARAM_BYTES = 2  # BF16 parameters are what the forward/backward all-gathers move
LAYER_KINDS = ("dense", "moe", "mtp")


def fsdp_unsupported_reason(scenario: Scenario) -> str | None:
    """Why ``scenario``'s Megatron-FSDP setting is outside the model, or None (one line)."""
    p = scenario.par
    if p.fsdp <= 0:
        return None
    group = scenario.dp * p.cp
    if p.fsdp != group:
        return (f"Megatron-FSDP with fsdp {p.fsdp} != dp·cp {group} (hybrid sharding) is not supported yet; "
                f"set fsdp {group} to shard over the whole data-parallel group")
    return None


@dataclass(frozen=True)
class FsdpUnit:
    """Parameter elements of one FSDP unit on one rank, by sharding group (before sharding), and
    the bytes its parameters take as stored (bf16: 2 per element)."""

    dense_numel: int  # sharded over the dp (dp·cp) group
    expert_numel: int  # sharded over the expert-dp group
    dense_param_bytes: int = -1  # -1: bf16 (2 B per element)
    expert_param_bytes: int = -1

    def calls(self, dense_size: int, expert_size: int, grad_bytes: int, gather: bool = True,
              reduce: bool = True) -> tuple[tuple[CollectiveCall, ...], tuple[CollectiveCall, ...]]:
        """(forward, backward) collectives of one micro-batch (nccl-tests sizes, bytes).

        ``gather`` (parameters sharded): forward and backward all-gather of the stored parameters
        (fp8 dtype when they are FP8 primary weights); ``reduce`` (gradients sharded): a backward
        reduce-scatter of ``grad_bytes·numel`` bytes. Groups of size 1 issue nothing.
        """
        grad_dtype = "fp32" if grad_bytes == 4 else "bf16"
        fwd: list[CollectiveCall] = []
        bwd: list[CollectiveCall] = []
        for group, size, numel, stored in (("dp", dense_size, self.dense_numel, self.dense_param_bytes),
                                           ("expert_dp", expert_size, self.expert_numel, self.expert_param_bytes)):
            if size <= 1 or numel <= 0:
                continue
            if gather:
                nbytes = PARAM_BYTES * numel if stored < 0 else stored
                dtype = "bf16" if nbytes >= PARAM_BYTES * numel else "fp8"
                call = CollectiveCall("all_gather", group, size, dtype, nbytes, 1, "fsdp_param_gather")  # type: ignore[arg-type]
                fwd.append(call)
                bwd.append(call)
            if reduce:
                bwd.append(CollectiveCall("reduce_scatter", group, size, grad_dtype, grad_bytes * numel, 1,  # type: ignore[arg-type]
                                          "fsdp_grad_reduce"))
        return tuple(fwd), tuple(bwd)


def _unit_of(t: TensorSpec, model_layers: int, first_moe: int, layer: int | None) -> str | None:
    """The unit kind a tensor in ``layer`` belongs to (of the first unit of that kind), None for other units."""
    if layer is None:
        if t.duplicate_of is not None:  # the last stage's embedding copy: not a unit of the first stage's kinds
            return None
        return "embedding" if t.role in ("embedding", "position_embedding") else "output"
    if layer >= model_layers:
        return "mtp" if layer == model_layers else None
    if layer == 0 and first_moe > 0:
        return "dense"
    if layer == first_moe:
        return "moe"
    return None


def fsdp_units(inventory: Inventory, scenario: Scenario | None = None) -> dict[str, FsdpUnit]:
    """Per unit kind (embedding, dense, moe, mtp, output): the parameter elements of one unit on
    one rank (every unit of a kind has the same tensors), and with ``scenario`` their stored bytes
    (:func:`workloads.weight_memory.weight_storage`; without it bf16)."""
    model = inventory.model
    first_moe = model.moe.first_dense_layers if model.moe is not None else model.num_layers
    numel: dict[tuple[str, str], int] = {}
    stored: dict[tuple[str, str], float] = {}
    for run in inventory.runs:  # per layer of each run (its tensors are the run's templates)
        for layer in run.layers:
            for t in run.templates:
                if t.optimizer == "none":
                    continue
                kind = _unit_of(t, model.num_layers, first_moe, layer)
                if kind is None:
                    continue
                key = (kind, t.dp_group)
                numel[key] = numel.get(key, 0) + t.rank_numel
                per = weight_storage(scenario, t, layer).gathered_bytes if scenario is not None else PARAM_BYTES
                stored[key] = stored.get(key, 0.0) + per * t.rank_numel
    kinds = {k for k, _ in numel}

    def of(kind: str, group: str) -> tuple[int, int]:
        n = numel.get((kind, group), 0)
        return n, (round(stored[(kind, group)]) if scenario is not None and n else -1)

    return {k: FsdpUnit(of(k, "dp")[0], of(k, "expert_dp")[0], of(k, "dp")[1], of(k, "expert_dp")[1]) for k in kinds}


def fsdp_block(calls: tuple[CollectiveCall, ...], compute_s: float, shapes: dict[str, GroupShape],
               system: SystemSpec, overlap: bool) -> CommBlock | None:
    """One pass's FSDP collectives of one unit as a :class:`CommBlock` (seconds), or None if empty.

    Exposed fraction ``max(0, t_comm − compute_s) / t_comm`` with overlap, 1 without.
    """
    acc = CommAcc()
    for c in calls:
        acc.add(collective_s(c.op, float(c.bytes), shapes[c.group], system), c.count, float(c.bytes))
    if acc.time_s <= 0:
        return None
    frac = max(0.0, acc.time_s - compute_s) / acc.time_s if overlap else 1.0
    return CommBlock(FSDP_KIND, acc.time_s, acc.latency_s, acc.link, frac, acc.bytes)


def fsdp_layer_blocks(scenario: Scenario, units: dict[str, FsdpUnit], kind: str, shapes: dict[str, GroupShape],
                      compute_s: tuple[float, float], overlap: bool) -> tuple[tuple[CommBlock, ...], tuple[CommBlock, ...]]:
    """(forward, backward) FSDP blocks of one unit of ``kind`` for one micro-batch.

    ``shapes`` must hold the ``dp`` and ``expert_dp`` placement shapes; ``compute_s`` is the unit's
    (forward, backward) compute in seconds.
    """
    unit = units.get(kind.partition(":")[0])  # 'moe:norc' (not recomputed) is a moe unit
    if unit is None:
        return (), ()
    strategy = scenario.optimizer.data_parallel_sharding_strategy
    fwd, bwd = unit.calls(shapes["dp"].size, shapes["expert_dp"].size, scenario.optimizer.grad_bytes,
                          gather=strategy == "optim_grads_params", reduce=strategy in ("optim_grads", "optim_grads_params"))
    f = fsdp_block(fwd, compute_s[0], shapes, scenario.system, overlap)
    b = fsdp_block(bwd, compute_s[1], shapes, scenario.system, overlap)
    return ((f,) if f else ()), ((b,) if b else ())


def add_fsdp_blocks(scenario: Scenario, placement, per_kind: dict, overlap: bool) -> None:  # noqa: ANN001
    """Append each layer kind's FSDP blocks to ``per_kind`` (kind -> (forward compute s, backward
    compute s, forward blocks, backward blocks), :func:`costmodel.step_structure.build_step_structure`'s
    per-layer costs), in place; ``placement`` is the scenario's :class:`topologies.placement.JobPlacement`."""
    from costmodel.optimizer.plan import cached_inventory

    units = fsdp_units(cached_inventory(scenario), scenario)
    shapes = {g: placement.shape(g) for g in ("dp", "expert_dp")}
    for kind, (f, b, cf, cb) in per_kind.items():
        ff, fb = fsdp_layer_blocks(scenario, units, kind.partition(":")[0], shapes, (f, b), overlap)
        per_kind[kind] = (f, b, cf + ff, cb + fb)
