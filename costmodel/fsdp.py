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
The parameter all-gathers move each parameter group's buffer: BF16 parameters 2 B per element, FP8
parameters (``fp8_param_gather``) 1 B, their rowwise data (or, in the backward, MXFP8's columnwise
data; scales and Hopper's transposes are made on every rank, not gathered: :mod:`workloads.fp8_params`).
``fsdp_double_buffer``
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
  per parameter group (BF16, FP8). Backward: the all-gathers again (the unsharded copy is freed after
  forward) and a reduce-scatter of its gradients in ``optimizer.grad_reduce_dtype`` (4 B fp32 or 2 B
  bf16, as the distributed optimizer's buckets). Gradients are reduce-scattered every micro-batch
  (ZeRO-2/3 keep no unsharded gradient buffer to accumulate into) and accumulated into the local
  shard. **Gradient hand-over** (compute, :meth:`workloads.operations._Builder.grad_accumulate_bytes`):
  a gradient that arrives in ``param.grad`` (every weight without gradient-accumulation fusion,
  biases and norms always) is not added into a persistent fp32 ``main_grad``: Megatron-FSDP's
  post-backward ``_grad_acc`` *overwrites* the unit's freshly allocated bucket
  (``param.main_grad.copy_(param.grad)``; ``overwrite_main_grad`` for ``optim_grads`` and
  ``optim_grads_params``, ``add_`` only for ``no_shard`` / ``optim``), and after the reduce-scatter
  the reduced shard is added into the rank's local gradient shard (``local_buffer += grad_shard``).
  Per element and micro-batch: read 2 B + write the bucket's dtype (``grad_reduce_dtype``), plus
  3 × that dtype over the FSDP group size, instead of DDP's 10 B ``main_grad.add_``. (Our reading
  of Megatron-Core 0.14-0.16 ``megatron_fsdp.py`` / ``param_and_grad_buffer.py``; not profiled.)
  With full recompute the backward's gather serves the recomputed forward too (no third
  gather), except for MXFP8 parameters, whose backward gathers the columnwise data: the recomputed
  forward gathers their rowwise data once more. (Selective recompute of modules holding GEMM
  weights would do the same; not modelled.)
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

from costmodel.layer_costs import BF16_SUFFIX, CommAcc, CommBlock, collective_s
from topologies.groups import GroupShape
from topologies.hardware import SystemSpec
from workloads.comm import CollectiveCall
from workloads.fp8_params import FP8_BYTES, fsdp_backward_regathers_rowwise, is_fp8_param
from workloads.weight_memory import fp8_primary_weights

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
    """Parameter elements of one FSDP unit on one rank, by sharding group (before sharding), and how
    many of them are FP8 parameters (``fp8_param_gather``: parameter groups of their own, gathered
    at 1 B per element, :mod:`workloads.fp8_params`)."""

    dense_numel: int  # sharded over the dp (dp·cp) group
    expert_numel: int  # sharded over the expert-dp group
    dense_fp8_numel: int = 0  # of dense_numel: FP8 parameters
    expert_fp8_numel: int = 0
    fp8_regather: bool = False  # MXFP8: a forward recomputed in the backward re-gathers the rowwise data

    def calls(self, dense_size: int, expert_size: int, grad_bytes: int, gather: bool = True,
              reduce: bool = True, recomputed: bool = False,
              fp8: bool = True) -> tuple[tuple[CollectiveCall, ...], tuple[CollectiveCall, ...]]:
        """(forward, backward) collectives of one micro-batch (nccl-tests sizes, bytes).

        ``gather`` (parameters sharded): a forward and a backward all-gather per parameter group:
        the BF16 parameters (2 B per element) and the FP8 parameters (1 B: the rowwise data, in the
        backward the rowwise again for fp8-cs or the columnwise for MXFP8); with ``recomputed``
        (the backward recomputes the forward) MXFP8's rowwise data once more. ``fp8`` False: the
        layer is kept in BF16 (``first_last_layers_bf16``), all its parameters are BF16.
        ``reduce`` (gradients sharded): a backward reduce-scatter of ``grad_bytes·numel`` bytes.
        Groups of size 1 issue nothing.
        """
        grad_dtype = "fp32" if grad_bytes == 4 else "bf16"
        fwd: list[CollectiveCall] = []
        bwd: list[CollectiveCall] = []
        for group, size, numel, fp8_numel in (("dp", dense_size, self.dense_numel, self.dense_fp8_numel),
                                              ("expert_dp", expert_size, self.expert_numel, self.expert_fp8_numel)):
            if size <= 1 or numel <= 0:
                continue
            if gather:
                low = fp8_numel if fp8 else 0
                for dtype, nbytes in (("bf16", PARAM_BYTES * (numel - low)), ("fp8", FP8_BYTES * low)):
                    if nbytes > 0:
                        call = CollectiveCall("all_gather", group, size, dtype, nbytes, 1, "fsdp_param_gather")  # type: ignore[arg-type]
                        fwd.append(call)
                        bwd.append(call)
                if low and recomputed and self.fp8_regather:
                    bwd.append(CollectiveCall("all_gather", group, size, "fp8", FP8_BYTES * low, 1,  # type: ignore[arg-type]
                                              "fsdp_param_gather"))
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
    one rank (every unit of a kind has the same tensors) and, with ``scenario`` and FP8 parameters
    (:func:`workloads.weight_memory.fp8_primary_weights`), how many of them are FP8 parameters in a
    layer not kept in BF16 (:func:`workloads.fp8_params.is_fp8_param`; the caller knows which layers
    are, from the kind's ``:bf16`` marker); without ``scenario`` all BF16."""
    model = inventory.model
    first_moe = model.moe.first_dense_layers if model.moe is not None else model.num_layers
    fp8 = scenario is not None and fp8_primary_weights(scenario)
    numel: dict[tuple[str, str], int] = {}
    low: dict[tuple[str, str], int] = {}
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
                if fp8 and is_fp8_param(t):
                    low[key] = low.get(key, 0) + t.rank_numel
    regather = fp8 and scenario is not None and fsdp_backward_regathers_rowwise(scenario.precision.value, True)
    return {k: FsdpUnit(numel.get((k, "dp"), 0), numel.get((k, "expert_dp"), 0), low.get((k, "dp"), 0),
                        low.get((k, "expert_dp"), 0), regather)
            for k in {k for k, _ in numel}}


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
    recomputed = scenario.par.recompute == "full" and kind.partition(":")[0] in LAYER_KINDS and ":norc" not in kind
    fwd, bwd = unit.calls(shapes["dp"].size, shapes["expert_dp"].size, scenario.optimizer.grad_bytes,
                          gather=strategy == "optim_grads_params", reduce=strategy in ("optim_grads", "optim_grads_params"),
                          recomputed=recomputed, fp8=BF16_SUFFIX not in kind)
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
        ff, fb = fsdp_layer_blocks(scenario, units, kind, shapes, (f, b), overlap)
        per_kind[kind] = (f, b, cf + ff, cb + fb)
