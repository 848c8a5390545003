"""The optimizer plan of a scenario (cached) or of an inventory and grid, and its report section.

* :func:`build_optimizer_plan` (scenario) -> :class:`OptimizerPlan`, cached under :func:`plan_key`;
* :func:`plan_from_inventory` (inventory, spec, group sizes[, system, shapes]) -> the same plan,
  for the reference backend's tiny models (times are zero without a system);
* :func:`expected_rank_collectives` -> every GPU's merged collective list for one stage, in
  Megatron's rank order: what the reference backend must record, byte for byte;
* :func:`optimizer_report` (plan, exposed, hidden) -> :class:`costmodel.report.OptimizerReport`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from functools import partial

import numpy as np

from costmodel.optimizer import layouts as lay
from costmodel.optimizer.elementwise import adam_bytes_per_element
from costmodel.optimizer.newton_schulz import NsSettings
from costmodel.optimizer.plan_types import OptimizerPlan, StageOptimizerPlan
from costmodel.optimizer.stage_builder import (
    Grid,
    StageBuilder,
    Timer,
    inventory_chunk_buffers,
    rank_work,
)
from costmodel.optimizer.summary import optimizer_report
from topologies.groups import GroupShape
from topologies.hardware import SystemSpec
from workloads.comm import CollectiveCall
from workloads.inventory import Inventory

__all__ = ["Grid", "build_optimizer_plan", "cached_inventory", "clear_caches", "expected_rank_collectives",
           "optimizer_report", "plan_from_inventory", "plan_key"]

_CACHE: OrderedDict[tuple, OptimizerPlan] = OrderedDict()
_CACHE_SIZE = 256


def cached_inventory(scenario) -> Inventory:  # noqa: ANN001 - workloads.scenario.Scenario
    """``workloads.inventory.inventory_for(scenario)`` (memoised there on what the inventory depends
    on: shared by every plan and memory estimate of the same sizes)."""
    from workloads.inventory import inventory_for

    return inventory_for(scenario)


def clear_caches() -> None:
    """Forget every memoised plan, inventory, layer-wise layout and Newton–Schulz work (cold timings)."""
    from costmodel.optimizer import newton_schulz
    from workloads.inventory import clear_inventory_cache

    _CACHE.clear()
    clear_inventory_cache()
    lay.clear_memo()
    newton_schulz._tensor_work.cache_clear()


def plan_key(scenario) -> tuple:  # noqa: ANN001 - workloads.scenario.Scenario
    """Hashable key of everything the optimizer plan depends on (model, system, sizes, optimizer)."""
    c = scenario.config
    return (scenario.model.model_dump_json(), scenario.system.model_dump_json(), c.gpus,
            c.parallelism.model_dump_json(), c.optimizer.model_dump_json(), c.placement.model_dump_json())


def build_optimizer_plan(scenario) -> OptimizerPlan:  # noqa: ANN001 - workloads.scenario.Scenario
    """The optimizer plan of a resolved scenario (memoised: the planner calls this many times)."""
    key = plan_key(scenario)
    plan = _CACHE.get(key)
    if plan is not None:
        _CACHE.move_to_end(key)
        return plan
    from topologies.placement import placement_for

    p = scenario.par
    placement = placement_for(scenario)
    grid = Grid(dp=scenario.dp * p.cp, expert_dp=scenario.expert_dp, tp=p.tp, etp=p.expert_tp, ep=p.ep)
    plan = plan_from_inventory(cached_inventory(scenario), scenario.optimizer, grid, scenario.system, placement.shape,
                               fsdp=p.fsdp > 0)
    _CACHE[key] = plan
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return plan


def plan_from_inventory(inventory: Inventory, spec, grid: Grid, system: SystemSpec | None = None,  # noqa: ANN001
                        shape_of: Callable[[str], GroupShape] | None = None, fsdp: bool = False) -> OptimizerPlan:
    """The optimizer plan of ``inventory`` under ``spec`` (an OptimizerSpec) and group sizes ``grid``.

    ``shape_of(group)`` gives the placement shape of a group kind for collective times (default:
    one NVLink domain); without ``system`` every time is zero but bytes, FLOPs and ownership are exact.
    ``fsdp``: Megatron-FSDP over the whole dp groups: AdamW on each rank's shard, no DP buckets
    (the per-layer gathers and reduce-scatters are :mod:`costmodel.fsdp`'s).
    """
    if grid.etp * grid.ep * grid.expert_dp != grid.gpus_per_stage:
        raise ValueError(f"inconsistent grid {grid}: tp·dp must equal etp·ep·expert_dp")
    if (grid.tp, grid.etp, grid.ep) != (inventory.tp, inventory.etp, inventory.ep):
        raise ValueError("grid tp/etp/ep differ from the inventory's")
    kind, dist = spec.kind, spec.resolved_distribution
    if kind == "muon" and dist == "element_wise":
        raise ValueError("muon cannot use the element_wise distributed optimizer")
    if kind == "adamw" and dist == "layer_wise":
        raise ValueError("the layer_wise distributed optimizer is for muon")
    st = NsSettings.from_spec(spec)
    timer = Timer(system, spec.matmul_precision, shape_of)
    stages = tuple(_stage(inventory, s, spec, grid, timer, st, fsdp) for s in range(inventory.pp))
    layer_wise = dist == "layer_wise"
    gathers = any(b.gather_op for s in stages for b in s.buckets)
    return OptimizerPlan(
        kind=kind, distribution=dist,
        layout=spec.layer_wise_layout if layer_wise else None,
        tp_mode=spec.tp_mode if kind == "muon" else None,
        load_balance=spec.resolved_load_balance if layer_wise else None,
        stages=stages, notes=_notes(inventory, spec, grid, dist, st) + ((FSDP_NOTE,) if fsdp else ()),
        hide_param_gather=bool(spec.hide_param_gather and spec.overlap_grad_reduce and gathers),
    )


FSDP_NOTE = ("Megatron-FSDP: parameters gathered and gradients reduce-scattered per layer and micro-batch "
             "during forward/backward (exposed comm 'dp_fsdp'); the optimizer step is AdamW on the local shard")


def _fsdp_shards(b: StageBuilder, buf) -> None:  # noqa: ANN001 - stage_builder._Buffer
    """Megatron-FSDP: each rank steps its equal shard of the (padded) buffer; no buckets."""
    gs, role = b.grid.size(buf.group), b.roles[buf.group]
    for span in lay.ddp_buckets(buf.numel, gs, None, distributed_optimizer=True):
        per_rank = lay.shard_param_numel(span, buf.numel, gs).astype(np.float64)
        role.owned += per_rank
        role.mem_bytes += per_rank * adam_bytes_per_element(b.gb)


def _stage(inv: Inventory, s: int, spec, grid: Grid, timer: Timer, st: NsSettings,  # noqa: ANN001
           fsdp: bool = False) -> StageOptimizerPlan:
    """One stage's plan. Buffers of equal content (other chunks and stages of the same layers) share
    their work through :meth:`StageBuilder.replay`: the cost is per distinct chunk, not per tensor."""
    b = StageBuilder(s, grid, spec, timer, st)
    buffers = [buf for c in range(inv.vpp) for buf in inventory_chunk_buffers(inv, s, c, spec.kind)]
    dist = spec.resolved_distribution
    if fsdp:
        for buf in buffers:
            b.replay([buf], "fsdp", partial(_fsdp_shards, buf=buf))
    elif dist == "element_wise":
        for buf in buffers:
            b.replay([buf], "element_wise", partial(_element_wise, buf=buf))
    elif dist == "replicated":
        for buf in buffers:
            b.replay([buf], "replicated", partial(_replicated, buf=buf))
    elif spec.layer_wise_layout == "current":
        strategy = spec.resolved_load_balance
        for buf in buffers:
            b.replay([buf], "current", partial(_current, buf=buf, strategy=strategy), strategy)
    else:  # legacy: whole parameters of the whole stage assigned per dp group
        strategy = spec.resolved_load_balance
        for group in ("dp", "expert_dp"):
            bufs = [buf for buf in buffers if buf.group == group]
            if bufs:
                b.replay(bufs, "legacy", partial(_legacy, bufs=bufs, group=group, strategy=strategy), strategy)
    return b.finish(rank_work)


def _element_wise(b: StageBuilder, buf) -> None:  # noqa: ANN001 - stage_builder._Buffer
    """Element-wise distributed optimizer (AdamW) over the whole buffer."""
    b.element_wise(buf, np.arange(len(buf.numel)))


def _replicated(b: StageBuilder, buf) -> None:  # noqa: ANN001 - stage_builder._Buffer
    """Replicated optimizer: the buffer all-reduced, every rank steps every parameter."""
    b.ddp(buf, gather_op=None)
    b.step_whole(buf, np.arange(len(buf.numel)), np.full(len(buf.numel), -1, dtype=np.int64))


def _current(b: StageBuilder, buf, strategy: str) -> None:  # noqa: ANN001 - stage_builder._Buffer
    """Current layer-wise layout: Muon parameters in layer-wise buckets, the others element-wise."""
    b.layer_wise_current(buf, np.flatnonzero(buf.muon), strategy)
    b.element_wise(buf, np.flatnonzero(~buf.muon))


def _legacy(b: StageBuilder, bufs: list, group: str, strategy: str) -> None:
    """Legacy layer-wise layout: whole parameters of the stage's ``group`` buffers owned by one rank."""
    numel = np.concatenate([buf.numel for buf in bufs])
    cost = np.concatenate([buf.cost for buf in bufs])
    owner = np.empty(len(numel), dtype=np.int64)
    order = _sub_optimizer_order(bufs)
    owner[order] = lay.whole_param_owner(numel[order], cost[order], b.grid.size(group), strategy)
    at = 0
    for buf in bufs:
        n = len(buf.numel)
        b.ddp(buf, gather_op="all_gather_v")
        b.step_whole(buf, np.arange(n), owner[at:at + n])
        at += n


def _sub_optimizer_order(bufs: list) -> np.ndarray:
    """Positions (in the concatenated backprop-order buffers) in the order the legacy assignment sees
    them: the Muon group, then the AdamW group, each in definition order (chunk 0 first)."""
    at, definition = 0, []
    for buf in bufs:
        n = len(buf.numel)
        definition.append(np.arange(at + n - 1, at - 1, -1))
        at += n
    order = np.concatenate(definition)
    muon = np.concatenate([buf.muon for buf in bufs])[order]
    return np.concatenate([order[muon], order[~muon]])


def _notes(inv: Inventory, spec, grid: Grid, dist: str, st: NsSettings) -> tuple[str, ...]:  # noqa: ANN001
    notes: list[str] = []
    sharded_tp = grid.tp > 1 or grid.etp > 1
    if spec.kind == "muon":
        if spec.tp_mode == "blockwise" and sharded_tp:
            notes.append("tp_mode blockwise orthogonalises each TP shard separately: the update is mathematically "
                         "different from full-matrix Muon and depends on the TP size (its scale uses the local shape)")
        if spec.use_syrk and not st.syrk:
            notes.append("SYRK disabled: EO/MCore use it only with bf16 ('medium') Newton-Schulz matmuls")
        if not sharded_tp:
            notes.append("tp = etp = 1: every Newton-Schulz call is local, tp_mode has no effect")
        if dist == "layer_wise" and spec.layer_wise_layout == "legacy":
            notes.append("legacy layer-wise layout: gradients all-reduced, whole parameters (Muon and AdamW) owned "
                         f"by one rank ({spec.resolved_load_balance}), updated parameters gathered with a "
                         "variable-size all_gather_v per bucket")
        if dist == "layer_wise" and spec.layer_wise_layout == "current" and any(
                t.dp_group == "expert_dp" and t.optimizer == "adamw" for t in inv.by_content.values()):
            notes.append("expert-parallel non-Muon parameters modelled on element-wise buckets over expert_dp "
                         "(Megatron asserts on them in the current layout; use the legacy layout)")
    if dist == "replicated":
        notes.append("replicated optimizer: gradients all-reduced, every rank steps every parameter")
    if not spec.overlap_grad_reduce:
        notes.append("overlap_grad_reduce off: one bucket per buffer and no parameter-gather overlap")
    return tuple(notes)


def expected_rank_collectives(inventory: Inventory, spec, grid: Grid, stage: int = 0) -> list[list[CollectiveCall]]:  # noqa: ANN001
    """Merged collective list of every GPU of ``stage`` (stage-local Megatron rank order)."""
    plan = plan_from_inventory(inventory, spec, grid)
    sp = plan.stages[stage]
    return [sp.gpu_collectives(g) for g in range(grid.gpus_per_stage)]
