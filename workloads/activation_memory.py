"""Activation memory of a pipeline stage at its peak: recompute, offloading, BF16 layers, the loss.

Per layer and micro-batch the saved tensors come from :mod:`workloads.activations`; this module
decides which of them stay on the GPU and for how many micro-batches:

- **Micro-batches in flight**: :func:`workloads.activations.inflight_chunk_microbatches` (1F1B and
  Megatron's interleaved schedule).
- **Recompute** (Megatron-Core ``TransformerBlock._checkpointed_forward``): ``selective`` drops the
  tensors of ``recompute_modules`` (per module, see :mod:`workloads.activations`); ``full`` keeps
  only checkpoint inputs (the layer input, ``2·s·b·h/t`` with sequence parallelism):
  ``recompute_method`` ``uniform`` checkpoints groups of ``recompute_num_layers`` consecutive layers
  of each virtual stage (one input per group; recomputing a group in backward materialises all its
  layers' activations at once), ``block`` checkpoints the first ``recompute_num_layers`` layers of
  each virtual stage and stores the rest in full (recomputing one layer at a time); no method is
  read as ``uniform`` with one layer per group.
- **Activation CPU offloading** (``cpu_offloading``, Transformer Engine's
  ``get_cpu_offload_context``): the first ``cpu_offloading_num_layers`` layers of the rank (forward
  order) copy their saved tensors to host memory during the next layer's forward and read them
  back one layer ahead in backward, so at the peak (the end of a micro-batch's forward) only the
  other layers' activations are on the GPU. Megatron allows it only without pipeline parallelism
  and without recompute.
- **Fine-grained activation offloading** (``fine_grained_activation_offloading`` with
  ``offload_modules``): the tensors those modules save (see ``ActivationTerm.offload_module``) leave
  the GPU for every layer; one layer's worth stays as the copy in transit (an assumption: the
  double buffer of the offload stream).
- **BF16 layers** (``first_last_layers_bf16``): those layers save their GEMM inputs in bf16.
- **Loss** (last stage): the final norm and output-layer inputs, and the cross entropy's saved
  logits: Transformer Engine's fused cross entropy (``cross_entropy_loss_fusion`` with
  ``cross_entropy_fusion_impl te``) writes the gradient into the bf16 logits in the forward pass
  and keeps only them (2 B per vocabulary entry and token); Megatron's own (fused or not) keeps the
  fp32 softmax (4 B).
"""

from __future__ import annotations

from functools import lru_cache
from operator import mul
from typing import TYPE_CHECKING, Any

from topologies.hardware import Precision
from workloads.activations import (
    LayerShape,
    inflight_chunk_microbatches,
    layer_activation_terms,
    output_activation_bytes,
)
from workloads.models import ModelSpec
from workloads.pipeline_layout import StageSplit, layer_placement
from workloads.weight_memory import layer_in_bf16

if TYPE_CHECKING:
    from workloads.scenario import Scenario


def activation_layer_shape(scenario: Scenario, bf16: bool = False) -> LayerShape:
    """The per-rank shape of one layer's activations (``bf16``: a layer kept in BF16)."""
    p = scenario.par
    precision = Precision.BF16 if bf16 and scenario.precision.tensor_core_class != "bf16" else scenario.precision
    return LayerShape(tokens=p.micro_batch_size * p.seq_length // p.cp, tp=p.tp,
                      sequence_parallel=p.uses_sequence_parallel, etp=p.expert_tp, precision=precision)


def _offloaded_modules(scenario: Scenario) -> frozenset[str]:
    rt = scenario.runtime
    return frozenset(rt.offload_modules) if rt.fine_grained_activation_offloading else frozenset()


@lru_cache(maxsize=4096)
def _layer_bytes(model: ModelSpec, moe: bool, shape: LayerShape, selective: frozenset[str],
                 offloaded: frozenset[str]) -> tuple[float, float, float, float]:
    """(kept bytes without offloaded ones, layer input bytes, fine-grained offloaded bytes, every
    saved tensor's bytes) of one layer and micro-batch (memoised: the planner asks for many layouts)."""
    terms = layer_activation_terms(model, moe, shape)
    kept = [x for x in terms if x.kept(selective)]
    off = sum(x.size_bytes for x in kept if x.offload_module in offloaded)
    return sum(x.size_bytes for x in kept) - off, terms[0].size_bytes, off, sum(x.size_bytes for x in terms)


def _bytes_of(scenario: Scenario, layer: int, moe: bool) -> tuple[float, float, float, float]:
    p = scenario.par
    selective = frozenset(p.recompute_modules) if p.recompute == "selective" else frozenset()
    shape = activation_layer_shape(scenario, layer_in_bf16(scenario, layer))
    return _layer_bytes(scenario.model, moe, shape, selective, _offloaded_modules(scenario))


def layer_resident_bytes(scenario: Scenario, layer: int, moe: bool) -> tuple[float, float, float]:
    """(resident bytes without full recompute, layer input bytes, fine-grained offloaded bytes) of one
    layer for one micro-batch on one rank (selective recompute applied; offloaded bytes excluded)."""
    return _bytes_of(scenario, layer, moe)[:3]


def full_layer_bytes(scenario: Scenario, layer: int, moe: bool) -> float:
    """Every tensor one layer saves for one micro-batch (no recompute, no offloading), in bytes."""
    return _bytes_of(scenario, layer, moe)[3]


def loss_activation_bytes(scenario: Scenario) -> float:
    """Last-stage extras per micro-batch (final norm, output-layer inputs, cross-entropy logits), bytes."""
    rt = scenario.runtime
    te_fused = rt.cross_entropy_loss_fusion and rt.cross_entropy_fusion_impl == "te"
    return output_activation_bytes(scenario.model, activation_layer_shape(scenario), logits_bytes=2 if te_fused else 4)


def _chunk_layers(scenario: Scenario, stage: int) -> list[list[int]]:
    """Layer indices of each virtual chunk of ``stage``, forward order (MTP layers on the last chunk)."""
    p, model = scenario.par, scenario.model
    return [list(c) for c in _stage_chunk_layers(model.num_layers, p.pp, p.vpp, p.stage_split, model.mtp_layers)[stage]]


@lru_cache(maxsize=1024)
def _stage_chunk_layers(num_layers: int, pp: int, vpp: int, split: StageSplit,
                        mtp_layers: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """:func:`_chunk_layers` of every stage at once (one pass over the layer placement, memoised)."""
    chunks: list[list[list[int]]] = [[[] for _ in range(vpp)] for _ in range(pp)]
    for i, (s, chunk) in enumerate(layer_placement(num_layers, pp, vpp, split, mtp_layers)):
        chunks[s][chunk].append(i)
    chunks[pp - 1][vpp - 1].extend(num_layers + j for j in range(mtp_layers))
    return tuple(tuple(tuple(c) for c in stage) for stage in chunks)


def _is_moe(scenario: Scenario, layer: int) -> bool:
    model = scenario.model
    return model.is_moe_layer(min(layer, model.num_layers - 1))


LayerBytes = tuple[float, float, float, float]  # (kept, layer input, fine-grained offloaded, every saved tensor)
LayerBytesMemo = dict[tuple[bool, bool], LayerBytes]


def _memo_bytes_of(scenario: Scenario, layer: int, memo: LayerBytesMemo) -> LayerBytes:
    """:func:`_bytes_of` of ``layer`` (MoE or not as the model says), memoised in ``memo`` (one
    scenario's) on what it depends on besides the scenario: whether the layer is kept in BF16 and
    whether it is an MoE layer (a stage's layers come in two or three such classes)."""
    moe = _is_moe(scenario, layer)
    key = (layer_in_bf16(scenario, layer), moe)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = _bytes_of(scenario, layer, moe)
    return hit


@lru_cache(maxsize=1024)
def _class_bounds(num_layers: int, mtp_layers: int, bf16_layers: tuple[int, int],
                  first_moe: int | None) -> tuple[int, ...]:
    """The layers (main, then MTP) at which the (kept in BF16, MoE) class can change: every layer
    between two consecutive bounds is of the first one's class (:func:`layer_kept_bf16` and
    :meth:`ModelSpec.is_moe_layer` change only at these; ``first_moe``: the MoE model's first MoE layer)."""
    first, last = bf16_layers
    cuts = {0, first, num_layers - last, num_layers, num_layers + mtp_layers}
    if first_moe is not None:
        cuts.add(first_moe)
    return tuple(sorted(c for c in cuts if 0 <= c <= num_layers + mtp_layers))


def _layer_table(scenario: Scenario, memo: LayerBytesMemo) -> list[LayerBytes]:
    """:func:`_memo_bytes_of` of every layer (index: layer, main then MTP), one call per class run
    of :func:`_class_bounds` (the same values, without a call per layer)."""
    model = scenario.model
    first_moe = model.moe.first_dense_layers if model.moe is not None else None
    bounds = _class_bounds(model.num_layers, model.mtp_layers, scenario.runtime.bf16_layers, first_moe)
    table: list[LayerBytes] = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        table += [_memo_bytes_of(scenario, a, memo)] * (b - a)
    return table


def _chunk_bytes(scenario: Scenario, layers: list[int], offload_first: int,
                 memo: LayerBytesMemo | None = None, table: list[LayerBytes] | None = None) -> tuple[float, float, float]:
    """(resident bytes per micro-batch, extra bytes while recomputing, offloaded bytes per micro-batch)
    of one virtual chunk's layers; the first ``offload_first`` layers are CPU-offloaded (``memo``:
    the scenario's per-layer bytes so far, :func:`_memo_bytes_of`; ``table``: every layer's,
    :func:`_layer_table`)."""
    p = scenario.par
    memo = {} if memo is None else memo
    rows = [table[i] for i in layers] if table is not None else [_memo_bytes_of(scenario, i, memo) for i in layers]
    transit = max((0.0, *(off for _, _, off, _ in rows[offload_first:])))  # fine-grained offloading: one layer's copy in transit
    if p.recompute != "full":  # the first layers' saved tensors are in host memory at the peak
        resident = sum([kept for kept, _, _, _ in rows[offload_first:]])
        return resident + transit, 0.0, sum([kept for kept, _, _, _ in rows[:offload_first]])
    n, group = len(rows), p.recompute_num_layers or 1
    largest = max((full for _, _, _, full in rows), default=0.0)
    if p.recompute_method == "block":
        checkpointed = min(group, n)
        resident = sum(inp for _, inp, _, _ in rows[:checkpointed]) + sum(full for _, _, _, full in rows[checkpointed:])
        return resident, (largest if checkpointed else 0.0), 0.0
    resident = sum(rows[k][1] for k in range(0, n, group))  # uniform: one input per group
    return resident, min(group, n) * largest, 0.0


_STAGE_BYTES: dict[tuple[Any, ...], tuple[Any, Any, tuple[float, ...]]] = {}
_STAGE_BYTES_LIMIT = 50_000


def stage_activation_bytes(scenario: Scenario, stage: int) -> float:
    """Peak activation bytes per GPU on pipeline stage ``stage`` (micro-batches in flight included)."""
    return activation_bytes_by_stage(scenario)[stage]


def activation_bytes_by_stage(scenario: Scenario) -> tuple[float, ...]:
    """Peak activation bytes per GPU of every pipeline stage (index: stage), in bytes.

    Memoised on everything of the scenario but its optimizer section, which activations do not read:
    the planner's candidates of one layout differ only there. Model and system are keyed by identity
    and the entry holds them, so their ids stay unique. The stages share one per-layer table
    (:func:`_layer_table`): a layer's bytes depend on its class, not on its stage.
    """
    c = scenario.config
    key = (id(scenario.model), id(scenario.system), c.gpus, c.precision, c.parallelism, c.placement, c.runtime)
    hit = _STAGE_BYTES.get(key)
    if hit is not None and hit[0] is scenario.model and hit[1] is scenario.system:
        return hit[2]
    out = _all_stages_bytes(scenario)
    if len(_STAGE_BYTES) > _STAGE_BYTES_LIMIT:
        _STAGE_BYTES.clear()
    _STAGE_BYTES[key] = (scenario.model, scenario.system, out)
    return out


def _all_stages_bytes(scenario: Scenario, share_chunks: bool = True) -> tuple[float, ...]:
    """:func:`activation_bytes_by_stage` computed: per stage, its chunks' bytes (:func:`_chunk_bytes`)
    times the micro-batches in flight, plus the recompute peak and, on the last stage, the loss.
    Chunks of the same layer classes in the same order (a pipeline's middle stages) are summed once
    (``share_chunks=False``: every chunk summed on its own, the definition a test holds this to)."""
    p, rt, model = scenario.par, scenario.runtime, scenario.model
    table = _layer_table(scenario, {})
    layout = _stage_chunk_layers(model.num_layers, p.pp, p.vpp, p.stage_split, model.mtp_layers)
    offload = rt.cpu_offloading_num_layers if rt.cpu_offloading else 0
    chunk_memo: dict[tuple, tuple[float, float, float]] = {}
    out = []
    pp, vpp, microbatches = p.pp, p.vpp, scenario.num_microbatches
    for stage in range(pp):
        per_chunk, extra = [], 0.0
        for c, layers in enumerate(layout[stage]):
            first = min(offload, len(layers)) if c == 0 else 0
            key = (first, *[id(table[i]) for i in layers])  # the rows are the table's per-class objects
            hit = chunk_memo.get(key) if share_chunks else None
            if hit is None:
                hit = chunk_memo[key] = _chunk_bytes(scenario, list(layers), first, table=table)
            resident, recompute_peak, _ = hit
            per_chunk.append(resident)
            extra = max(extra, recompute_peak)
        if stage == pp - 1:
            per_chunk[-1] += loss_activation_bytes(scenario)
        counts = _inflight(pp, vpp, stage, microbatches)
        assert len(counts) == len(per_chunk)
        out.append(sum(map(mul, counts, per_chunk)) + extra)  # the products of zip(counts, per_chunk), in order
    return tuple(out)


@lru_cache(maxsize=8192)
def _inflight(pp: int, vpp: int, stage: int, num_microbatches: int) -> tuple[int, ...]:
    """:func:`inflight_chunk_microbatches` (memoised: a search meets the same pipelines again)."""
    return tuple(inflight_chunk_microbatches(pp, vpp, stage, num_microbatches))


def offloaded_layer_fraction(scenario: Scenario) -> float:
    """Share of a stage's transformer layers whose activations CPU offloading moves (0 without it)."""
    rt = scenario.runtime
    if not rt.cpu_offloading or rt.cpu_offloading_num_layers <= 0:
        return 0.0
    layers = sum(len(c) for c in _chunk_layers(scenario, 0))
    return min(rt.cpu_offloading_num_layers, layers) / layers if layers else 0.0


def fine_grained_offload_bytes(scenario: Scenario, layer: int, moe: bool) -> float:
    """Bytes fine-grained offloading moves to the host per layer and micro-batch (0 when off)."""
    return layer_resident_bytes(scenario, layer, moe)[2]


def cpu_offload_bytes(scenario: Scenario, layer: int, moe: bool) -> float:
    """Bytes layer CPU offloading moves to the host per offloaded layer and micro-batch."""
    kept, _, fine = layer_resident_bytes(scenario, layer, moe)
    return kept + fine

