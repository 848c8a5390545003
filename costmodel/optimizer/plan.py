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
from dataclasses import dataclass, replace

import numpy as np

from costmodel.optimizer import layouts as lay
from costmodel.optimizer.buffers import _Buffer, chunk_parts, make_buffers
from costmodel.optimizer.ew_batch import prepare_element_wise
from costmodel.optimizer.newton_schulz import NsSettings
from costmodel.optimizer.plan_types import Bucket, OptimizerPlan, StageOptimizerPlan
from costmodel.optimizer.rank_work import rank_works
from costmodel.optimizer.spans_batch import prepare_spans_effects
from costmodel.optimizer.stage_builder import Grid, StageBuilder, Timer
from costmodel.optimizer.summary import optimizer_report
from topologies.groups import GroupShape
from topologies.hardware import SystemSpec
from topologies.identity_memo import IdentityMemo
from workloads.comm import CollectiveCall
from workloads.fp8_params import (
    fp8_gather_active,
    fp8_gather_note,
    is_fp8_param,
    param_gather_bytes_per_element,
    param_gathers_per_sync,
)
from workloads.inventory import Inventory, TensorSpec

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
    from costmodel.optimizer import buffers, newton_schulz, stage_builder, timer
    from workloads.inventory import clear_inventory_cache

    _CACHE.clear()
    _SPEC_JSON.clear()
    _BUFFERS.clear()
    timer._MUON_KERNELS.clear()
    stage_builder._MUON_ROWS.clear()
    timer._CALL_S.clear()
    clear_inventory_cache()
    lay.clear_memo()
    buffers.clear_memo()
    newton_schulz._tensor_work.cache_clear()


# the JSON of a model or a system (frozen pydantic models), keyed by identity: the scenarios of a
# search share them, and dumping them was most of a new scenario's plan key
_SPEC_JSON: IdentityMemo[str] = IdentityMemo(256)


def plan_key(scenario) -> tuple:  # noqa: ANN001 - workloads.scenario.Scenario
    """Hashable key of everything the optimizer plan depends on (model, system, sizes, optimizer)."""
    c = scenario.config
    return (_spec_json(scenario.model), _spec_json(scenario.system), c.gpus, c.precision,
            c.parallelism.model_dump_json(), c.optimizer.model_dump_json(), c.placement.model_dump_json(),
            scenario.runtime.bf16_layers)


def _spec_json(spec) -> str:  # noqa: ANN001 - a frozen pydantic model (ModelSpec, SystemSpec)
    """``spec.model_dump_json()``, memoised per object (identity)."""
    hit = _SPEC_JSON.get((), spec)
    return hit if hit is not None else _SPEC_JSON.put(spec.model_dump_json(), (), spec)


def build_optimizer_plan(scenario, critical_only: bool = False) -> OptimizerPlan:  # noqa: ANN001 - workloads.scenario.Scenario
    """The optimizer plan of a resolved scenario (memoised: the planner calls this many times).

    ``critical_only``: every stage keeps only its slowest GPU class's RankWork (what the step time
    reads; the planner's screening builds thousands of plans with hundreds of GPU classes each)."""
    key = (*plan_key(scenario), critical_only)
    plan = _CACHE.get(key)
    if plan is not None:
        _CACHE.move_to_end(key)
        return plan
    from topologies.placement import placement_for

    p = scenario.par
    placement = placement_for(scenario)
    grid = Grid(dp=scenario.dp * p.cp, expert_dp=scenario.expert_dp, tp=p.tp, etp=p.expert_tp, ep=p.ep,
                instances=scenario.optimizer.num_distributed_optimizer_instances, cp=p.cp)
    plan = plan_from_inventory(cached_inventory(scenario), scenario.optimizer, grid, scenario.system, placement.shape,
                               fsdp=p.fsdp > 0, precision=scenario.precision.value,
                               bf16_layers=scenario.runtime.bf16_layers, critical_only=critical_only)
    _CACHE[key] = plan
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return plan


def plan_from_inventory(inventory: Inventory, spec, grid: Grid, system: SystemSpec | None = None,  # noqa: ANN001
                        shape_of: Callable[[str], GroupShape] | None = None, fsdp: bool = False,
                        precision: str = "bf16", bf16_layers: tuple[int, int] = (0, 0),
                        critical_only: bool = False) -> OptimizerPlan:
    """The optimizer plan of ``inventory`` under ``spec`` (an OptimizerSpec) and group sizes ``grid``.

    ``shape_of(group)`` gives the placement shape of a group kind for collective times (default:
    one NVLink domain); without ``system`` every time is zero but bytes, FLOPs and ownership are exact.
    ``fsdp``: Megatron-FSDP over the whole dp groups: AdamW on each rank's shard, no DP buckets
    (the per-layer gathers and reduce-scatters are :mod:`costmodel.fsdp`'s).
    ``precision`` (training recipe: bf16, fp8-cs, mxfp8, nvfp4) decides what ``fp8_param_gather``
    does (:mod:`workloads.fp8_params`); the GEMM weights of the ``bf16_layers`` (first, last) layers
    kept in BF16 (``first_last_layers_bf16``) are never FP8 parameters. ``critical_only``: each
    stage's ``ranks`` hold its slowest GPU class alone (the same RankWork as in the full plan).
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
    fp8 = fp8_gather_active(kind, dist, precision, spec.fp8_param_gather, fsdp)
    stages = _stages(inventory, spec, grid, timer, st, fsdp, fp8, precision, bf16_layers, critical_only)
    timer.release()
    layer_wise = dist == "layer_wise"
    gathers = any(b.gather_op for s in stages for b in s.buckets)
    return OptimizerPlan(
        kind=kind, distribution=dist,
        layout=spec.layer_wise_layout if layer_wise else None,
        tp_mode=spec.tp_mode if kind == "muon" else None,
        load_balance=spec.resolved_load_balance if layer_wise else None,
        stages=stages, notes=_notes(inventory, spec, grid, dist, st, precision, fsdp) + ((fsdp_note(spec),) if fsdp else ()),
        hide_param_gather=bool(spec.hide_param_gather and spec.overlap_grad_reduce and gathers),
        hypothetical=spec.hypothetical_reason is not None,
    )


FSDP_NOTES = {
    "optim_grads_params": "Megatron-FSDP (optim_grads_params): parameters gathered and gradients reduce-scattered per "
                          "layer and micro-batch during forward/backward (exposed comm 'dp_fsdp'); the optimizer step "
                          "is AdamW on the local shard",
    "optim_grads": "Megatron-FSDP (optim_grads): gradients reduce-scattered per layer and micro-batch in backward "
                   "(exposed comm 'dp_fsdp'); AdamW on the local shard; parameters all-gathered per bucket after the step",
    "optim": "Megatron-FSDP (optim): gradients accumulate unsharded and are reduce-scattered per bucket after the "
             "last micro-batch; AdamW on the local shard; parameters all-gathered per bucket after the step",
    "no_shard": "Megatron-FSDP (no_shard): gradients all-reduced per bucket after the last micro-batch; every rank "
                "steps every parameter",
}


def fsdp_note(spec) -> str:  # noqa: ANN001 - workloads.scenario.OptimizerSpec
    """The plan note of Megatron-FSDP under ``spec``'s sharding strategy."""
    return FSDP_NOTES[spec.data_parallel_sharding_strategy]


def _fsdp_shards(b: StageBuilder, buffers: list[_Buffer]) -> None:
    """Megatron-FSDP with sharded gradients: each rank steps its equal shard of each (padded)
    buffer; no gradient buckets (the reduce-scatters are per layer, :mod:`costmodel.fsdp`)."""
    b.adam_shards([(buf.group, span, buf.numel) for buf in buffers
                   for span in lay.ddp_buckets(buf.numel, b.grid.size(buf.group), None, distributed_optimizer=True)])


def _fsdp_stage(b: StageBuilder, buffers: list, strategy: str) -> None:
    """The step's bucket work of Megatron-FSDP under ``strategy`` (see :mod:`costmodel.fsdp`)."""
    if strategy == "optim_grads_params":
        _fsdp_shards(b, buffers)
        return
    for buf in buffers:
        everything = buf.all_items
        if strategy == "optim_grads":  # sharded gradients: only the parameter gather is per bucket
            b.element_wise(buf, everything, reduce=False)
        elif strategy == "optim":
            b.element_wise(buf, everything)
        else:  # no_shard: DDP all-reduce, every rank steps everything
            b.ddp(buf, gather_op=None)
            b.step_whole(buf, everything, np.full(len(buf.numel), -1, dtype=np.int64))


_BUFFERS_SIZE = 4096
_BUFFERS: IdentityMemo[list[_Buffer]] = IdentityMemo(_BUFFERS_SIZE)  # the inventory by identity


def _stage_buffers(inv: Inventory, s: int, kind: str, fp8_of: Callable[[TensorSpec, int | None], bool] | None,
                   fp8_key: tuple[int, int] | None) -> list[_Buffer]:
    """The buffers of stage ``s`` (:func:`_stages_buffers`)."""
    return _stages_buffers(inv, [s], kind, fp8_of, fp8_key)[s]


def _stages_buffers(inv: Inventory, stages: list[int], kind: str, fp8_of: Callable[[TensorSpec, int | None], bool] | None,
                    fp8_key: tuple[int, int] | None) -> dict[int, list[_Buffer]]:
    """The buffers of each of ``stages``, every chunk's (:func:`chunk_buffers`; the arrays of all of
    them made at once, :func:`buffers.make_buffers`), memoised across plans on the inventory
    (identity, held), the stage, the optimizer kind and the FP8 parameters (``fp8_key``: the BF16
    layers ``fp8_of`` keeps, None without FP8 parameters): the plans of one layout's optimizer
    choices (layout, load balance, TP mode) share them. Their arrays are made read-only."""
    out: dict[int, list[_Buffer]] = {}
    todo = []
    for s in stages:
        hit = _BUFFERS.get((s, kind, fp8_key), inv)
        if hit is not None:
            out[s] = hit
        else:
            todo.append(s)
    chunks = [(c, kind, chunk_parts(inv.chunk_runs(s, c), fp8_of)) for s in todo for c in range(inv.vpp)]
    made = make_buffers(chunks)
    for i, s in enumerate(todo):
        buffers = [buf for bufs in made[i * inv.vpp:(i + 1) * inv.vpp] for buf in bufs]
        for buf in buffers:
            for a in (buf.numel, buf.cost, buf.muon, buf.position, buf.tid, buf.shared):
                a.setflags(write=False)
        out[s] = _BUFFERS.put(buffers, (s, kind, fp8_key), inv)
    return out


def _stages(inv: Inventory, spec, grid: Grid, timer: Timer, st: NsSettings, fsdp: bool, fp8: bool,  # noqa: ANN001
            precision: str, bf16_layers: tuple[int, int], critical_only: bool) -> tuple[StageOptimizerPlan, ...]:
    """The optimizer plan of every stage: a stage holding the same tensors as an earlier one
    (:func:`_stage_signature`) reuses its plan; the others are built (:func:`_stage`) and their
    GPU classes' work computed for all of them at once (:func:`rank_works`)."""
    fp8_of = (lambda t, layer: is_fp8_param(t, inv.model.num_layers, bf16_layers, layer)) if fp8 else None
    first_of: dict[tuple, int] = {}  # signature -> the stage built for it
    keys, loads = [], []
    for s in range(inv.pp):
        def load(s: int = s) -> list[_Buffer]:
            return _stage_buffers(inv, s, spec.kind, fp8_of, bf16_layers if fp8 else None)

        key = _stage_signature(inv, s, fp8_of)
        keys.append(key)
        loads.append(load)
        if key not in first_of:  # this stage's own buffers only name its parameters: built if asked
            first_of[key] = s
    buffers = _stages_buffers(inv, list(first_of.values()), spec.kind, fp8_of, bf16_layers if fp8 else None)
    _prepare(spec, grid, timer, st, fsdp, list(buffers.items()))
    builders = [_stage(inv, s, bufs, spec, grid, timer, st, fsdp, precision, critical_only) for s, bufs in buffers.items()]
    built = {b.stage: b.finish(ranks) for b, ranks in zip(builders, rank_works(builders), strict=True)}
    return tuple(built[s] if first_of[key] == s else _restaged(built[first_of[key]], buffers[first_of[key]], s, loads[s])
                 for s, key in enumerate(keys))


def _prepare(spec, grid: Grid, timer: Timer, st: NsSettings, fsdp: bool,  # noqa: ANN001
             stages: list[tuple[int, list[_Buffer]]]) -> None:
    """The per-buffer work of the distinct ``stages`` ((stage, buffers)) that :func:`_stage` finds
    memoised on the plan's timer, made for all of them in one pass: the layer-wise spans effects
    (:func:`spans_batch.prepare_spans_effects`) and the element-wise buckets
    (:func:`ew_batch.prepare_element_wise`) of the current layer-wise layout and of the
    element-wise distribution (not Megatron-FSDP's, nor the legacy or replicated ones)."""
    dist = spec.resolved_distribution
    current = dist == "layer_wise" and spec.layer_wise_layout == "current"
    if fsdp or not (current or dist == "element_wise"):
        return
    builder = StageBuilder(0, grid, spec, timer, st)
    if current:
        prepare_spans_effects(builder, stages, spec.resolved_load_balance)
    prepare_element_wise(builder, stages, muon_apart=current)


def _stage(inv: Inventory, s: int, buffers: list[_Buffer], spec, grid: Grid, timer: Timer,  # noqa: ANN001
           st: NsSettings, fsdp: bool = False, precision: str = "bf16", critical_only: bool = False) -> StageBuilder:
    """The buckets and per-rank work of stage ``s`` (its ``buffers``), ready to :meth:`StageBuilder.finish`."""
    b = StageBuilder(s, grid, spec, timer, st, param_gather_bytes_per_element(precision, True, fsdp),
                     param_gathers_per_sync(precision, True, fsdp), critical_only)
    dist = spec.resolved_distribution
    if fsdp:
        _fsdp_stage(b, buffers, spec.data_parallel_sharding_strategy)
    elif dist == "element_wise":
        for buf in buffers:
            b.element_wise(buf, buf.all_items)
    elif dist == "replicated":
        for buf in buffers:
            b.ddp(buf, gather_op=None)
            b.step_whole(buf, buf.all_items, np.full(len(buf.numel), -1, dtype=np.int64))
    elif spec.layer_wise_layout == "current":
        strategy = spec.resolved_load_balance
        for buf in buffers:
            b.layer_wise_current(buf, buf.muon_items, strategy)
            b.element_wise(buf, buf.adam_items)
    elif grid.dp == 1:  # legacy with dp·cp = 1: Megatron's shard_params returns early (nothing sharded)
        for buf in buffers:
            b.ddp(buf, gather_op=None)
            b.step_whole(buf, buf.all_items, np.full(len(buf.numel), -1, dtype=np.int64))
    else:  # legacy: whole parameters of the whole stage assigned per dp group
        strategy = spec.resolved_load_balance
        per_bucket_gather = spec.hide_param_gather and spec.overlap_grad_reduce
        for group in ("dp", "expert_dp"):
            bufs = [buf for buf in buffers if buf.group == group]
            if not bufs:
                continue
            numel = np.concatenate([buf.numel for buf in bufs])
            cost = np.concatenate([buf.cost for buf in bufs])
            owner = np.empty(len(numel), dtype=np.int64)
            order = _sub_optimizer_order(bufs)
            owner[order] = lay.whole_param_owner(numel[order], cost[order], grid.size(group), strategy)
            at = 0
            for buf in bufs:
                n = len(buf.numel)
                # hidden: per bucket in the next forward (the legacy fallback of later Megatron-Core,
                # PR #3524); Megatron-Core 0.16.x has no such overlap: one gather per group after the step
                b.ddp(buf, gather_op="all_gather_v" if per_bucket_gather else None)
                b.step_whole(buf, np.arange(n), owner[at:at + n], gathered_by_copies=True)
                at += n
            if not per_bucket_gather:
                b.legacy_gather(bufs)
    if inv.pp > 1:
        for run in inv.stage_runs(s):
            for t in run.templates:
                if t.shared_embedding:
                    for _ in range(run.count):
                        b.embedding_grad(t, grid.dp if fsdp else 0)
    return b


def _stage_signature(inv: Inventory, s: int, fp8_of: Callable[[TensorSpec, int | None], bool] | None) -> tuple:
    """What a stage's optimizer plan depends on: per run of the stage (chunk, kind, layers, the
    distinct tensors, with FP8 parameters which of them are per layer). Layer numbers only name the
    parameters; runs of a kind share their template tensors, so equal signatures mean equal work."""
    return tuple((r.chunk, r.kind, r.count, tuple(id(t) for t in r.templates),
                  None if fp8_of is None else tuple(fp8_of(t, layer) for layer in r.layers for t in r.templates))
                 for r in inv.stage_runs(s))


@dataclass(frozen=True, eq=False)
class _BufferRef:
    """Buffer ``index`` of a stage's buffers (``load()``), built when its parameter names are first
    asked for: a restaged stage needs its own buffers for nothing else."""

    load: Callable[[], list[_Buffer]]
    index: int

    @property
    def names(self) -> list[str]:
        """The buffer's parameter names (:attr:`_Buffer.names`)."""
        return self.load()[self.index].names


def _restaged(plan: StageOptimizerPlan, twin: list[_Buffer], s: int,
              load: Callable[[], list[_Buffer]]) -> StageOptimizerPlan:
    """``plan`` (built for a stage with the same signature, whose buffers were ``twin``) for stage
    ``s`` whose buffers ``load()`` gives: the same buckets, ranks and collectives, this stage's names."""
    index = {id(buf): i for i, buf in enumerate(twin)}
    roles = tuple(replace(r, name_parts=tuple((_BufferRef(load, index[id(buf)]), idx) for buf, idx in r.name_parts))
                  for r in plan.roles)
    buckets = tuple(Bucket.from_fields({**_fields_of(bk), "stage": s}, bk.order) for bk in plan.buckets)  # replace(bk, stage=s)
    return replace(plan, stage=s, buckets=buckets, roles=roles)


def _fields_of(bk: Bucket) -> dict:
    """The field values of ``bk`` but its ``order`` (what :meth:`Bucket.from_fields` takes)."""
    values = dict(bk.__dict__)
    del values["order"]
    return values


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


def _notes(inv: Inventory, spec, grid: Grid, dist: str, st: NsSettings, precision: str = "bf16",  # noqa: ANN001
           fsdp: bool = False) -> tuple[str, ...]:
    notes: list[str] = [spec.hypothetical_reason] if spec.hypothetical_reason else []
    fp8_note = fp8_gather_note(spec.kind, dist, precision, spec.fp8_param_gather, fsdp)
    if fp8_note:
        notes.append(fp8_note)
    elif spec.fp8_param_gather:
        notes.append(f"fp8_param_gather ({precision}): the TE linear weights sit in their own buffers and are gathered "
                     + ("in FP8 (1 B per element)" if precision == "fp8-cs" else
                        "in BF16 and quantized to MXFP8 after the gather (2 B per element)")
                     + ("; Megatron-FSDP's per-layer gathers move them as stored" if fsdp else ""))
    sharded_tp = grid.tp > 1 or grid.etp > 1
    if spec.kind == "muon":
        if spec.tp_mode == "blockwise" and sharded_tp:
            notes.append("tp_mode blockwise orthogonalises each TP shard separately: the update is mathematically "
                         "different from full-matrix Muon and depends on the TP size (its scale uses the local shape)")
        if spec.use_syrk and not st.syrk:
            notes.append("SYRK disabled: EO/MCore use it only with bf16 ('medium') Newton-Schulz matmuls")
        if not sharded_tp:
            notes.append("tp = etp = 1: every Newton-Schulz call is local, tp_mode has no effect")
        if inv.embedding_copy is not None and inv.embedding_copy.optimizer == "muon":
            notes.append("MTP with pp > 1: the last stage's own copy of the word embedding is orthogonalised by Muon "
                         "(Megatron-Core 0.16.1 flags is_embedding_or_output_parameter only where pre_process), while "
                         "stage 0's copy is on AdamW; their gradients are all-reduced over the embedding group")
        if dist == "layer_wise" and spec.layer_wise_layout == "legacy" and grid.dp == 1:
            notes.append("legacy layer-wise with dp·cp = 1: Megatron-Core's shard_params returns early, so nothing "
                         "is sharded (experts included, even with expert_dp > 1): every rank steps all its "
                         "parameters, gradients are all-reduced and no parameter is gathered")
        elif dist == "layer_wise" and spec.layer_wise_layout == "legacy":
            notes.append("legacy layer-wise layout: gradients all-reduced, whole parameters (Muon and AdamW) owned "
                         f"by one rank ({spec.resolved_load_balance}), updated parameters gathered with one "
                         "variable-size all_gather_v per dp group after the step (Megatron-Core 0.16.1 "
                         "allgather_params)" + ("; hidden: per bucket in the next forward, which 0.16.x cannot "
                                               "do (the later legacy fallback's overlap)"
                                               if spec.hide_param_gather and spec.overlap_grad_reduce else ""))
        if dist == "layer_wise" and spec.layer_wise_layout == "current" and any(
                t.dp_group == "expert_dp" and t.optimizer == "adamw" for t in inv.distinct_tensors):
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
