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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from costmodel.compute import operation_time_s
from costmodel.layer_costs import (
    MLP_SIDE_MODULES,
    LayerParts,
    captured_flags,
    framework_share_s,
    layer_ops,
    priced_ops_s,
    python_calls_of,
)
from topologies.identity_memo import IdentityMemo
from workloads.operations import LayerOps, Operation, RankShape, recast_operation

if TYPE_CHECKING:
    from costmodel.cuda_graphs import GraphCapture
    from topologies.hardware import SystemSpec
    from workloads.models import ModelSpec

# (forward s, backward s, forward attention-core s, backward attention-core s, parts, forward host
# slack s, backward host slack s) of one layer for one micro-batch
LayerComputeS = tuple[float, float, float, float, LayerParts, float, float]


@dataclass(frozen=True)
class PassIndex:
    """Positions in one pass's operation list that its sums read, none of which depends on the
    micro-batch count: the windows between host synchronisations (with the positions of their
    captured operations), the framework host time's operation subsets, the layer parts' ones, and
    those of the weight casts, the attention core and the GEMMs. Each sum is then taken over the same
    operations in the same order as :mod:`costmodel.layer_costs` does, so it is the same float."""

    windows: tuple[tuple[int, int, tuple[int, ...]], ...]  # (start, end, captured positions in it)
    cuts: int  # host synchronisations (windows - 1)
    eager: tuple[int, ...]  # operations not replayed from a CUDA graph
    own: tuple[int, ...]  # operations that are not a recomputed copy ("recompute." names)
    own_eager: tuple[int, ...]
    recomputed_eager: tuple[int, ...]
    mlp_side: tuple[int, ...]  # the MoE block's side (MLP_SIDE_MODULES); the rest is the attention side
    attn_side: tuple[int, ...]
    shared_expert: tuple[int, ...]  # own operations of the shared experts
    casts: tuple[int, ...] = ()  # weight casts (re-priced per micro-batch count)
    attention: tuple[int, ...] = ()  # attention-core operations (kind "attention")
    gemm: tuple[int, ...] = ()  # own GEMM and grouped-GEMM operations (LayerParts.gemm_s)
    expert_wgrad: tuple[int, ...] = ()  # own routed-expert weight-gradient GEMMs (LayerParts.expert_wgrad_s)


_GEMM_KINDS = frozenset({"gemm", "grouped_gemm"})


def _pass_index(ops: tuple[Operation, ...], captured: tuple[bool, ...]) -> PassIndex:
    """The :class:`PassIndex` of one pass, in one walk over its operations (the cuts as
    :func:`~costmodel.layer_costs.pass_windows`, the subsets as :func:`~costmodel.layer_costs.framework_host_s`
    and :func:`~costmodel.layer_costs.parts_of`, the attention core as :func:`~costmodel.layer_costs.ops_time`)."""
    cuts: list[int] = []
    eager: list[int] = []
    own: list[int] = []
    own_eager: list[int] = []
    recomputed_eager: list[int] = []
    mlp: list[int] = []
    attn: list[int] = []
    shared: list[int] = []
    casts: list[int] = []
    attention: list[int] = []
    gemm: list[int] = []
    wgrad: list[int] = []
    for i, (o, c) in enumerate(zip(ops, captured, strict=True)):
        if o.host_sync and i > 0 and not c:
            cuts.append(i)
        module = o.module
        (mlp if module in MLP_SIDE_MODULES else attn).append(i)
        if o.weight_cast is not None:
            casts.append(i)
        kind = o.kind
        if kind == "attention":
            attention.append(i)
        if o.name.startswith("recompute."):
            if not c:
                eager.append(i)
                recomputed_eager.append(i)
            continue
        own.append(i)
        if not c:
            eager.append(i)
            own_eager.append(i)
        if kind in _GEMM_KINDS:
            gemm.append(i)
            if module == "moe" and o.name.endswith(".wgrad"):
                wgrad.append(i)
        if module == "shared_experts":
            shared.append(i)
    bounds = zip([0, *cuts], [*cuts, len(ops)], strict=True)
    windows = tuple((a, b, tuple(i for i in range(a, b) if captured[i])) for a, b in bounds)
    return PassIndex(windows=windows, cuts=len(cuts), eager=tuple(eager), own=tuple(own), own_eager=tuple(own_eager),
                     recomputed_eager=tuple(recomputed_eager), mlp_side=tuple(mlp), attn_side=tuple(attn),
                     shared_expert=tuple(shared), casts=tuple(casts), attention=tuple(attention), gemm=tuple(gemm),
                     expert_wgrad=tuple(wgrad))


def _gemm_parts_s(ops: LayerOps, times_s: tuple[tuple[float, ...], tuple[float, ...]],
                  index: tuple[PassIndex, PassIndex]) -> tuple[dict[str, float], float]:
    """(:attr:`LayerParts.gemm_s`, :attr:`LayerParts.expert_wgrad_s`) in seconds, summed over the same
    operations in the same order (forward, then backward) as :func:`~costmodel.layer_costs.parts_of`."""
    gemm: dict[str, float] = {}
    wgrad = 0.0
    for seq, times, ix in zip((ops.forward, ops.backward), times_s, index, strict=True):
        for i in ix.gemm:
            name = seq[i].name
            gemm[name] = gemm.get(name, 0.0) + times[i]
        for i in ix.expert_wgrad:
            wgrad += times[i]
    return gemm, wgrad


@dataclass(frozen=True)
class LayerTemplate:
    """A layer's operations, their GPU seconds and whether each is replayed from a CUDA graph, at
    one micro-batch per step, with the positions of its weight casts (forward, and their recomputed
    copies in backward), and what of the layer's sums no micro-batch count changes: each pass's
    :class:`PassIndex`, the operations' launches, the GEMM seconds and the routed experts'
    weight-gradient seconds (weight casts are never GEMMs), and the framework host seconds of each
    window (an operation's framework calls are the same at every micro-batch count)."""

    ops: LayerOps
    times_s: tuple[tuple[float, ...], tuple[float, ...]]
    captured: tuple[tuple[bool, ...], tuple[bool, ...]]
    casts_f: tuple[int, ...]
    casts_b: tuple[int, ...]
    attention_s: tuple[float, float]  # attention-core GPU seconds (casts are never attention)
    index: tuple[PassIndex, PassIndex]
    kernels: tuple[tuple[float, ...], tuple[float, ...]]  # launches of each operation
    gemm_s: dict[str, float]  # LayerParts.gemm_s (the caller must not change it)
    expert_wgrad_s: float
    # per pass: each window's share of the framework host seconds (_host_s, _window_shares_s)
    shares_s: tuple[tuple[float, ...], tuple[float, ...]]


_TEMPLATES: IdentityMemo[LayerTemplate] = IdentityMemo(20_000)  # model and system keyed by identity


def _template(model: ModelSpec, system: SystemSpec, shape: RankShape, kind: str, recompute: str,
              modules: tuple[str, ...], capture: GraphCapture) -> LayerTemplate:
    """The :class:`LayerTemplate` of a layer of ``kind`` at ``shape`` with one micro-batch per step
    (memoised; model and system keyed by identity)."""
    one = shape.one_microbatch
    key = (one, kind, recompute, modules, capture)
    hit = _TEMPLATES.get(key, model, system)
    if hit is not None:
        return hit
    ops = layer_ops(model, one, kind, recompute, modules)
    times = priced_ops_s(ops, system)  # built once per key: no use caching the layer
    captured = (captured_flags(ops.forward, capture, kind), captured_flags(ops.backward, capture, kind))
    index = (_pass_index(ops.forward, captured[0]), _pass_index(ops.backward, captured[1]))
    fa = sum(_pick(times[0], index[0].attention))  # as ops_time: from 0, in operation order
    ba = sum(_pick(times[1], index[1].attention))
    gemm_s, expert_wgrad_s = _gemm_parts_s(ops, times, index)  # no weight cast is a GEMM
    kernels = (tuple(o.kernels for o in ops.forward), tuple(o.kernels for o in ops.backward))
    # an operation's framework calls do not change with the micro-batch count: a weight cast's
    # launches (casts x (1 + 1 / micro-batches), casts >= 0) are positive at every count or at none
    # (python_calls_of), so the host time and its share per window are the template's
    calls = (_calls(kernels[0]), _calls(kernels[1]))
    host = _host_s(index, kind, system, calls[0], calls[1], ops.local_spec)
    shares = (_window_shares_s(index[0], calls[0], host[0]), _window_shares_s(index[1], calls[1], host[1]))
    template = LayerTemplate(ops, times, captured, index[0].casts, index[1].casts, (fa, ba), index, kernels, gemm_s,
                             expert_wgrad_s, shares)
    return _TEMPLATES.put(template, key, model, system)


_CAST_PRICES: IdentityMemo[tuple[float, float]] = IdentityMemo(50_000)  # the system keyed by identity


def _cast_price(op: Operation, microbatches: int, system: SystemSpec) -> tuple[float, float]:
    """(GPU seconds, launches) of the weight cast ``op`` re-cast for ``microbatches``
    (:func:`workloads.operations.recast_operation`), memoised on the cast's sizes: the layers of one
    search share their attention casts across layer kinds and recompute modes, and a recomputed
    forward repeats its casts in backward."""
    key = (op.weight_cast, microbatches)
    hit = _CAST_PRICES.get(key, system)
    if hit is not None:
        return hit
    o = recast_operation(op, microbatches)
    return _CAST_PRICES.put((operation_time_s(o, system), o.kernels), key, system)


def _recast(ops: tuple[Any, ...], times: tuple[float, ...], kernels: tuple[float, ...], at: tuple[int, ...],
            microbatches: int, system: SystemSpec) -> tuple[list[float], list[float]]:
    """Seconds and launches of ``ops`` with the weight casts at positions ``at`` re-cast for
    ``microbatches`` (:func:`_cast_price`)."""
    new_times, new_kernels = list(times), list(kernels)
    for i in at:
        new_times[i], new_kernels[i] = _cast_price(ops[i], microbatches, system)
    return new_times, new_kernels


def _pick(values: Sequence[float], at: tuple[int, ...]) -> list[float]:
    return [values[i] for i in at]


def _calls(kernels: Sequence[float]) -> list[float]:
    """Each operation's framework calls from its launches (:func:`costmodel.layer_costs.python_calls`)."""
    return [python_calls_of(k) for k in kernels]


def _host_s(index: tuple[PassIndex, PassIndex], kind: str, system: SystemSpec, calls_f: list[float],
            calls_b: list[float], local_spec: bool = False) -> tuple[float, float]:
    """:func:`costmodel.layer_costs.framework_host_s` from the operations' framework calls (the same sums)."""
    ix_f, ix_b = index
    return framework_share_s(kind, system, sum(calls_f), sum(_pick(calls_f, ix_f.eager)), sum(_pick(calls_b, ix_b.own)),
                             sum(_pick(calls_b, ix_b.own_eager)), sum(_pick(calls_b, ix_b.recomputed_eager)), local_spec)


def _window_shares_s(ix: PassIndex, calls: list[float], framework_s: float) -> tuple[float, ...]:
    """Each window's share of one pass's framework host seconds ``framework_s``, in proportion to
    its operations' framework ``calls`` (:func:`costmodel.layer_costs.pass_windows`, the same sums)."""
    all_calls = sum(calls) or 1.0
    return tuple(framework_s * sum(calls[a:b]) / all_calls for a, b, _ in ix.windows)


def _pass_s(ix: PassIndex, times: list[float], kernels: list[float], shares_s: tuple[float, ...],
            system: SystemSpec, graphs: int) -> tuple[float, float]:
    """:func:`costmodel.layer_costs.pass_windows` from the operations' seconds and launches and each
    window's framework host seconds (:func:`_window_shares_s`; the same sums, window by window as
    :func:`~costmodel.layer_costs.pass_stream`)."""
    eff = system.efficiency
    total = slack = 0.0
    for (a, b, captured), share in zip(ix.windows, shares_s, strict=True):
        window_launches = sum(kernels[a:b], 0.0)
        gpu = sum(times[a:b], 0.0)
        issued = window_launches - sum(_pick(kernels, captured), 0.0) + graphs
        issue = issued * eff.kernel_issue_s + share
        total += max(gpu, issue)
        slack += max(0.0, issue - gpu)
    return total + eff.host_sync_s * ix.cuts, slack


def layer_compute_s(model: ModelSpec, system: SystemSpec, shape: RankShape, kind: str, recompute: str,
                    modules: tuple[str, ...], capture: GraphCapture) -> LayerComputeS:
    """The compute side of one layer of ``kind`` (base kind: dense, moe, mtp, embedding, output) at
    rank shape ``shape`` for one micro-batch, equal to :func:`costmodel.layer_costs.ops_time`,
    :func:`~costmodel.layer_costs.host_slack_s` and :func:`~costmodel.layer_costs.layer_parts` of
    the layer's operations built at ``shape``.

    Only the weight casts are priced again for ``shape``'s micro-batch count; the pass, host and
    part sums then run over the template's precomputed positions (:class:`PassIndex`)."""
    t = _template(model, system, shape, kind, recompute, modules, capture)
    times_f, kernels_f = _recast(t.ops.forward, t.times_s[0], t.kernels[0], t.casts_f, shape.microbatches, system)
    times_b, kernels_b = _recast(t.ops.backward, t.times_s[1], t.kernels[1], t.casts_b, shape.microbatches, system)
    graphs = capture.graphs_per_pass(kind)
    ix_f, ix_b = t.index
    f, slack_f = _pass_s(ix_f, times_f, kernels_f, t.shares_s[0], system, graphs)
    b, slack_b = _pass_s(ix_b, times_b, kernels_b, t.shares_s[1], system, graphs)
    parts = LayerParts(dict(t.gemm_s),
                       (sum(_pick(times_f, ix_f.shared_expert), 0.0), sum(_pick(times_b, ix_b.shared_expert), 0.0)),
                       t.expert_wgrad_s,
                       (sum(_pick(times_f, ix_f.mlp_side), 0.0), sum(_pick(times_b, ix_b.mlp_side), 0.0)),
                       (sum(_pick(times_f, ix_f.attn_side), 0.0), sum(_pick(times_b, ix_b.attn_side), 0.0)))
    return f, b, t.attention_s[0], t.attention_s[1], parts, slack_f, slack_b
