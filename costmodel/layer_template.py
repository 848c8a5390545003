"""One layer's compute for any number of micro-batches, re-pricing only the weight casts.

A low-precision layer's operations depend on the step's micro-batch count only through its weight
casts (:func:`workloads.operations.weight_cast_operation`: TE casts the weights once per step, so
each micro-batch carries ``1 / micro-batches`` of them). A pipeline layout search meets the same
layer at many micro-batch counts (every pipeline depth changes the data-parallel size, hence the
count), and building and pricing its ~100 operations each time was most of the planner's bound.

A :class:`LayerTemplate` holds the layer's operations and their GPU seconds at one micro-batch;
:func:`layer_compute_s` swaps in the re-cast operations and their prices and then runs the very
same pass, host and part sums as :mod:`costmodel.layer_costs` over the whole operation list, in
the same order, so the result is the same float as building the layer afresh. Times in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from costmodel.compute import operation_time_s
from costmodel.layer_costs import (
    LayerParts,
    captured_flags,
    framework_host_s,
    layer_ops,
    op_times_s,
    parts_of,
    pass_windows,
)
from topologies.identity_memo import IdentityMemo
from workloads.operations import LayerOps, RankShape, recast_operation

if TYPE_CHECKING:
    from costmodel.cuda_graphs import GraphCapture
    from topologies.hardware import SystemSpec
    from workloads.models import ModelSpec

# (forward s, backward s, forward attention-core s, backward attention-core s, parts, forward host
# slack s, backward host slack s) of one layer for one micro-batch
LayerComputeS = tuple[float, float, float, float, LayerParts, float, float]


@dataclass(frozen=True)
class LayerTemplate:
    """A layer's operations, their GPU seconds and whether each is replayed from a CUDA graph, at
    one micro-batch per step, with the positions of its weight casts (forward, and their recomputed
    copies in backward)."""

    ops: LayerOps
    times_s: tuple[tuple[float, ...], tuple[float, ...]]
    captured: tuple[tuple[bool, ...], tuple[bool, ...]]
    casts_f: tuple[int, ...]
    casts_b: tuple[int, ...]
    attention_s: tuple[float, float]  # attention-core GPU seconds (casts are never attention)


_TEMPLATES: IdentityMemo[LayerTemplate] = IdentityMemo(20_000)  # model and system keyed by identity


def _template(model: ModelSpec, system: SystemSpec, shape: RankShape, kind: str, recompute: str,
              modules: tuple[str, ...], capture: GraphCapture) -> LayerTemplate:
    """The :class:`LayerTemplate` of a layer of ``kind`` at ``shape`` with one micro-batch per step
    (memoised; model and system keyed by identity)."""
    one = replace(shape, microbatches=1)
    key = (one, kind, recompute, modules, capture)
    hit = _TEMPLATES.get(key, model, system)
    if hit is not None:
        return hit
    ops = layer_ops(model, one, kind, recompute, modules)
    times = op_times_s(ops, system)
    casts_f = tuple(i for i, o in enumerate(ops.forward) if o.weight_cast is not None)
    casts_b = tuple(i for i, o in enumerate(ops.backward) if o.weight_cast is not None)
    fa = sum(t for o, t in zip(ops.forward, times[0], strict=True) if o.kind == "attention")
    ba = sum(t for o, t in zip(ops.backward, times[1], strict=True) if o.kind == "attention")
    captured = (captured_flags(ops.forward, capture, kind), captured_flags(ops.backward, capture, kind))
    return _TEMPLATES.put(LayerTemplate(ops, times, captured, casts_f, casts_b, (fa, ba)), key, model, system)


def _recast(ops: tuple[Any, ...], times: tuple[float, ...], at: tuple[int, ...], microbatches: int,
            system: SystemSpec) -> tuple[tuple[Any, ...], tuple[float, ...]]:
    """``ops`` and their seconds with the weight casts at positions ``at`` re-cast for ``microbatches``."""
    if not at:
        return ops, times
    new_ops, new_times = list(ops), list(times)
    for i in at:
        o = recast_operation(ops[i], microbatches)
        new_ops[i] = o
        new_times[i] = operation_time_s(o, system)
    return tuple(new_ops), tuple(new_times)


def layer_compute_s(model: ModelSpec, system: SystemSpec, shape: RankShape, kind: str, recompute: str,
                    modules: tuple[str, ...], capture: GraphCapture) -> LayerComputeS:
    """The compute side of one layer of ``kind`` (base kind: dense, moe, mtp, embedding, output) at
    rank shape ``shape`` for one micro-batch, equal to :func:`costmodel.layer_costs.ops_time`,
    :func:`~costmodel.layer_costs.host_slack_s` and :func:`~costmodel.layer_costs.layer_parts` of
    the layer's operations built at ``shape``."""
    t = _template(model, system, shape, kind, recompute, modules, capture)
    fwd, times_f = _recast(t.ops.forward, t.times_s[0], t.casts_f, shape.microbatches, system)
    bwd, times_b = _recast(t.ops.backward, t.times_s[1], t.casts_b, shape.microbatches, system)
    ops = t.ops if fwd is t.ops.forward and bwd is t.ops.backward else LayerOps(fwd, bwd)
    host_f, host_b = framework_host_s(ops, system, capture, kind, t.captured)
    f, slack_f = pass_windows(ops.forward, system, capture, kind, host_f, times_f, t.captured[0])
    b, slack_b = pass_windows(ops.backward, system, capture, kind, host_b, times_b, t.captured[1])
    parts = parts_of(ops, (times_f, times_b))
    return f, b, t.attention_s[0], t.attention_s[1], parts, slack_f, slack_b
