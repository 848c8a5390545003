"""The pipeline bound of a layout, fast: a lower bound on the analytic engine's forward/backward phase.

The analytic step is ``head + gradient barrier + optimizer tail + slowdown`` where the barrier is
never earlier than the end of the forward/backward phase, ``costmodel.pipeline.pipeline_time_s``
of the stages' per-micro-batch work. That phase does not depend on any optimizer choice, so it
bounds the step time of every optimizer choice of a layout from below, and screening needs it for
tens of thousands of layouts. With interleaving the phase is the longest path through Megatron's
order (milliseconds to simulate), so the bound is its simulation-free floor
(``costmodel.pipeline.pipeline_lower_bound_s``); without, the phase itself.

``build_step_structure`` computes it too, but merges every layer's collective blocks per chunk
(about 1 ms a layout). Here the same per-layer-kind costs (the engine's own helpers and caches:
operations, their times, the layer collectives and what of them is exposed) are summed per stage
directly: a chunk's compute-stream time is the sum over its layers of compute + exposed
communication, exactly as the engine's ``PassCost.time_s``. A test holds the result equal to
:meth:`costmodel.planner.fast_analytic.FastAnalytic.pipeline_bound_s` (the engine with an empty
optimizer plan); if the engine's helpers change shape, :func:`pipeline_bound_s` falls back to that.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, NamedTuple

from costmodel import layer_costs as lc
from costmodel import step_structure as ss
from costmodel.comm_exposure import ep_paired_share
from costmodel.layer_comm import MOE_OPS_KINDS, base_kind
from costmodel.pipeline import pipeline_lower_bound_s
from topologies.groups import GroupShape
from topologies.identity_memo import IdentityMemo
from topologies.placement import placement_for
from workloads.operations import ACT_BYTES

if TYPE_CHECKING:
    from workloads.scenario import Scenario

_CACHE_LIMIT = 50_000
_KIND_COSTS: IdentityMemo[dict[str, tuple[float, float]]] = IdentityMemo(_CACHE_LIMIT)  # model, system by identity
_ITEMS: IdentityMemo[tuple[tuple[tuple[str, int], ...], ...]] = IdentityMemo(_CACHE_LIMIT)  # the model by identity


_KIND_COSTS_BY_ID: IdentityMemo[tuple[dict[str, tuple[float, float]], float]] = IdentityMemo(_CACHE_LIMIT)
# (_KIND_COSTS's entry, the send/receive seconds) by the identity of the rank shape, group shapes,
# runtime, model and system (_kind_times)
_NON_MOE_COSTS: IdentityMemo[tuple[float, float]] = IdentityMemo(_CACHE_LIMIT)  # model, system by identity
NON_MOE_GROUPS = ("tp", "cp")  # the only group shapes a layer without an MoE block communicates in


def _kind_time(scenario: Scenario, shape: Any, kind: str, shapes: dict[str, Any]) -> tuple[float, float]:
    """(forward, backward) compute-stream seconds of one layer of ``kind`` for one micro-batch: its
    compute plus the exposed part of its collectives (:func:`costmodel.layer_comm.layer_kind_costs`)."""
    from costmodel.layer_comm import layer_kind_costs

    f, b, cf, cb = layer_kind_costs(scenario, shape, kind, shapes, True)
    return f + sum(c.exposed_s for c in cf), b + sum(c.exposed_s for c in cb)


def _non_moe_key(scenario: Scenario, shape: Any, shapes: dict[str, Any]) -> tuple[Any, ...]:
    """The layer cache key of a layer without an MoE block (dense, embedding, output): its operations
    do not read the rank shape's ep, etp or dispatcher (:func:`costmodel.layer_comm.layer_compute`
    keys them alike) and its collectives are TP and CP only (:func:`costmodel.layer_comm.layer_comm`
    adds EP ones to MoE layers alone), so the layouts of one search that differ in ep or etp share it."""
    return lc.layer_cache_key(scenario, shape.without_experts, "", {k: shapes[k] for k in NON_MOE_GROUPS})


def _p2p_s(scenario: Scenario, shape: Any, shapes: dict[str, Any]) -> float:
    """Seconds of one pipeline send/receive of a micro-batch's activation (the engine's): the rank
    shape's tokens x hidden size at ``ACT_BYTES``, over the pp group's link (NVLink within a domain)."""
    p2p_bytes = float(shape.sp_tokens * scenario.model.hidden_size * ACT_BYTES)
    pair = GroupShape(2, 2, 1) if shapes["pp"].intra_domain else GroupShape(2, 1, 2)
    return float(lc.collective_s("send_recv", p2p_bytes, pair, scenario.system)[0])


def _kind_times(scenario: Scenario, shape: Any, shapes: dict[str, Any],
                kinds: AbstractSet[str]) -> tuple[dict[str, tuple[float, float]], float]:
    """(per layer kind of ``kinds``: (forward, backward) compute-stream seconds of one layer for one
    micro-batch; the seconds of one pipeline send/receive, :func:`_p2p_s`). Memoised on the engine's
    layer cache key (hashed once for all the kinds); the kinds without an MoE block also on their
    narrower key (:func:`_non_moe_key`). The send/receive reads only the rank shape, the group
    shapes, the model and the system, which key the memo by identity."""
    model, system, p, runtime = scenario.model, scenario.system, scenario.par, scenario.runtime
    # the layer cache key reads the parallelism settings below and, through the rank shape, the
    # group shapes and the runtime settings, objects a search shares (_rank_shape, _layer_shapes,
    # the candidates' runtime): keyed by their identity, most layouts skip building and hashing it
    fast_key = (p.recompute, tuple(p.recompute_modules), p.uses_sequence_parallel, p.tp_comm_overlap,
                p.ep_comm_overlap, ep_paired_share(scenario))
    hit = _KIND_COSTS_BY_ID.get(fast_key, shape, shapes, runtime, model, system)
    if hit is None:
        key = lc.layer_cache_key(scenario, shape, "", shapes)  # every kind's key but the kind
        times = _KIND_COSTS.get(key, model, system)
        if times is None:
            times = _KIND_COSTS.put({}, key, model, system)
        hit = _KIND_COSTS_BY_ID.put((times, _p2p_s(scenario, shape, shapes)), fast_key, shape, shapes, runtime,
                                    model, system)
    times = hit[0]
    missing = kinds - times.keys()
    if not missing:
        return hit
    non_moe_key = None
    for kind in sorted(missing):
        if base_kind(kind) in MOE_OPS_KINDS:
            times[kind] = _kind_time(scenario, shape, kind, shapes)
            continue
        if non_moe_key is None:
            non_moe_key = _non_moe_key(scenario, shape, shapes)
        priced = _NON_MOE_COSTS.get((non_moe_key, kind), model, system)
        if priced is None:
            priced = _NON_MOE_COSTS.put(_kind_time(scenario, shape, kind, shapes), (non_moe_key, kind), model, system)
        times[kind] = priced
    return hit


def _chunk_kinds(scenario: Scenario) -> tuple[tuple[tuple[str, int], ...], ...]:
    """Per virtual stage: (layer kind, count) pairs (the engine's chunk items, counted)."""
    p, model = scenario.par, scenario.model
    key = (p.pp, p.vpp, p.stage_split, scenario.runtime.bf16_layers,
           scenario.precision.tensor_core_class != "bf16", p.recompute, p.recompute_method,
           p.recompute_num_layers)  # BF16 and not-recomputed layers are their own kinds
    hit = _ITEMS.get(key, model)
    if hit is not None:
        return hit
    counted = []
    for kinds in ss._chunk_items(scenario):
        counts: dict[str, int] = {}
        for k in kinds:
            counts[k] = counts.get(k, 0) + 1
        counted.append(tuple(counts.items()))
    return _ITEMS.put(tuple(counted), key, model)


class ChunkLayout(NamedTuple):
    """What the bound needs of a layout's chunk items (:func:`_chunk_kinds`), for ``pp`` stages."""

    kinds: frozenset[str]  # the layer kinds of the items
    distinct: tuple[tuple[tuple[str, int], ...], ...]  # the distinct chunks
    sequences: tuple[tuple[int, ...], ...]  # the distinct sequences of chunk indices the stages hold
    stage_of: tuple[int, ...]  # each pipeline stage's position among ``sequences``


_LAYOUTS: IdentityMemo[ChunkLayout] = IdentityMemo(_CACHE_LIMIT)


def _chunk_layout(items: tuple[tuple[tuple[str, int], ...], ...], pp: int) -> ChunkLayout:
    """The :class:`ChunkLayout` of ``items`` (virtual stage v on stage v mod pp): a function of the
    items and pp alone, memoised on ``pp`` and the identity of ``items`` (held by
    :func:`_chunk_kinds`'s cache; the entry holds it too). Chunks of the same layers have the same
    passes and stages holding the same chunks in the same order the same sums: each is computed once."""
    hit = _LAYOUTS.get(pp, items)
    if hit is not None:
        return hit
    position: dict[tuple[tuple[str, int], ...], int] = {}
    index = tuple(position.setdefault(chunk, len(position)) for chunk in items)
    sequence_at: dict[tuple[int, ...], int] = {}
    stage_of = tuple(sequence_at.setdefault(tuple(index[s::pp]), len(sequence_at)) for s in range(pp))
    kinds = frozenset(k for chunk in items for k, _ in chunk)
    return _LAYOUTS.put(ChunkLayout(kinds, tuple(position), tuple(sequence_at), stage_of), pp, items)


_SHAPES: IdentityMemo[dict[str, Any]] = IdentityMemo(_CACHE_LIMIT)  # the placement by identity


def _layer_shapes(placement: Any) -> dict[str, Any]:
    """The placement shapes of the groups a layer communicates in (``LAYER_GROUP_KINDS``), memoised
    on the placement's identity (placements are shared: :func:`topologies.placement.placement_for`;
    the caller must not change the dict)."""
    hit = _SHAPES.get((), placement)
    if hit is not None:
        return hit
    return _SHAPES.put({k: placement.shape(k) for k in lc.LAYER_GROUP_KINDS}, (), placement)


_RANK_SHAPES: IdentityMemo[Any] = IdentityMemo(_CACHE_LIMIT)  # runtime and model by identity


def _rank_shape(scenario: Scenario) -> Any:
    """:func:`costmodel.layer_costs.rank_shape` of ``scenario``, memoised on what it reads: the
    parallelism sizes, sequence parallelism, precision and micro-batch count, and (by identity) the
    runtime settings and the model (the planner's candidates share their base's runtime objects)."""
    p = scenario.par
    key = (p.micro_batch_size, p.seq_length, p.tp, p.cp, p.ep, p.expert_tp, p.sequence_parallel,
           scenario.config.precision, scenario.num_microbatches)
    runtime, model = scenario.runtime, scenario.model
    hit = _RANK_SHAPES.get(key, runtime, model)
    if hit is not None:
        return hit
    return _RANK_SHAPES.put(lc.rank_shape(scenario), key, runtime, model)


def fast_pipeline_bound_s(scenario: Scenario) -> float:
    """A lower bound (seconds) on the forward/backward phase of ``scenario`` (no optimizer work), per the
    engine: :func:`costmodel.pipeline.pipeline_lower_bound_s` (the phase itself without interleaving)."""
    p, rt = scenario.par, scenario.runtime
    offloading = rt.cpu_offloading or rt.fine_grained_activation_offloading
    if p.fsdp > 0 or offloading:  # per-layer FSDP / offload copies: the engine's own phase (rare in plans)
        from costmodel.analytic import pipeline_lower_bound_of
        from costmodel.optimizer.plan_types import EMPTY_PLAN

        return float(pipeline_lower_bound_of(ss.build_step_structure(scenario, plan=EMPTY_PLAN)))
    shape = _rank_shape(scenario)
    shapes = _layer_shapes(placement_for(scenario))
    pp, vpp = p.pp, p.vpp
    layout = _chunk_layout(_chunk_kinds(scenario), pp)
    times, p2p = _kind_times(scenario, shape, shapes, layout.kinds)
    if pp == 1:
        p2p = 0.0
    blocking = p2p if vpp > 1 and not rt.overlap_p2p_comm else 0.0  # as the engine: per pass
    passes = []  # per distinct chunk (chunks of the same layers have the same passes): forward, backward
    for chunk in layout.distinct:
        f = b = 0.0
        for k, n in chunk:  # summed in item order, as sum() over them would
            t = times[k]
            f += t[0] * n
            b += t[1] * n
        passes.append((f + blocking, b + blocking))
    sums = []  # per distinct sequence: (work, forward, backward) summed in virtual-stage order
    for seq in layout.sequences:
        w = tf = tb = 0.0
        for i in seq:
            f, b = passes[i]
            w += f + b
            tf += f
            tb += b
        sums.append((w, tf / vpp, tb / vpp))
    stage_of = layout.stage_of
    work = [sums[j][0] for j in stage_of]
    cf = [sums[j][1] for j in stage_of]
    cb = [sums[j][2] for j in stage_of]
    chunk_passes = [[passes[i] for i in layout.sequences[j]] for j in stage_of]
    return float(pipeline_lower_bound_s(work, cf, cb, scenario.num_microbatches, vpp, 0.0 if blocking else p2p,
                                        chunk_passes))
