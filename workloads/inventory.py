"""The tensor inventory: every weight of the model with its sharding, group, stage and optimizer.

One :class:`TensorSpec` per distinct tensor of the model, except that the identical expert matrices
of one layer are one entry with a multiplicity (``num_experts``), so that a 1T-parameter MoE stays a
few thousand entries. :meth:`Inventory.rank_tensors` gives what one model-parallel rank holds.

Sharding follows Megatron-Core: fused QKV, MLA up-projections, fc1 and shared-expert fc1 are
column-parallel (dim 0 over tp); attention output, fc2 are row-parallel (dim 1); embedding and
output layer are vocabulary-parallel (dim 0, padded vocabulary); MLA down-projections, norms and the
router are replicated over tp. Expert fc1/fc2 shard over the expert-tensor-parallel group (etp) and
experts are split over ep. Optimizer routing follows ``_is_muon_excluded``: Muon owns every 2-D
weight that is not the embedding or the output layer; AdamW owns the rest; the expert score bias is
a buffer updated outside the optimizer.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any, Literal

from workloads.models import GqaAttention, MlaAttention, ModelSpec
from workloads.pipeline_layout import virtual_stage_layer_counts

ShardGroup = Literal["tp", "etp"]
DpGroup = Literal["dp", "expert_dp"]
OptimizerOwner = Literal["muon", "adamw", "none"]


@dataclass(frozen=True)
class TensorSpec:
    """One weight (or, for experts, ``num_experts`` identical weights) of the model.

    ``dp`` below means the data-parallel group over which gradients are reduced; for dense weights
    Megatron uses the combined dp×cp group, for expert weights the expert-data-parallel group.
    """

    name: str
    role: str
    layer: int | None  # main layer index, num_layers + i for MTP layer i, None outside layers
    stage: int
    chunk: int
    global_shape: tuple[int, ...]
    shard_dim: int | None  # tensor-parallel shard dimension, None = replicated over tp/etp
    shard_group: ShardGroup | None
    shards: int  # tp or etp size when sharded, else 1
    dp_group: DpGroup
    optimizer: OptimizerOwner
    num_experts: int = 1  # identical copies (routed experts of one layer); 1 otherwise
    experts_per_rank: int = 1  # copies held by one expert-parallel rank
    muon_components: tuple[tuple[int, int], ...] = ()  # global shapes Newton-Schulz sees (QKV split)

    @property
    def is_expert(self) -> bool:
        """True for expert tensors: several copies per layer (routed experts) or an ``expert_*`` role."""
        return self.num_experts > 1 or self.role.startswith("expert_")

    @property
    def local_shape(self) -> tuple[int, ...]:
        """Shape of one copy on one rank (the tp/etp shard)."""
        if self.shard_dim is None:
            return self.global_shape
        shape = list(self.global_shape)
        shape[self.shard_dim] //= self.shards
        return tuple(shape)

    @property
    def global_numel(self) -> int:
        """Elements of one copy, unsharded."""
        n = 1
        for d in self.global_shape:
            n *= d
        return n

    @property
    def local_numel(self) -> int:
        """Elements of one copy on one rank."""
        return self.global_numel // self.shards

    @property
    def rank_numel(self) -> int:
        """Elements this tensor entry places on one rank of its stage (all local expert copies)."""
        return self.local_numel * self.experts_per_rank

    @property
    def total_numel(self) -> int:
        """Elements of all copies in the whole model."""
        return self.global_numel * self.num_experts

    @property
    def local_muon_components(self) -> tuple[tuple[int, int], ...]:
        """The Newton-Schulz matrices of one local shard (QKV split applied to the local shard)."""
        if self.shard_dim is None:
            return self.muon_components
        out = []
        for rows, cols in self.muon_components:
            out.append((rows // self.shards, cols) if self.shard_dim == 0 else (rows, cols // self.shards))
        return tuple(out)


_PLACE_FIELDS = ("name", "layer", "stage", "chunk")  # what differs between copies of one layer's tensors
_CONTENT_IDS: dict[tuple[Any, ...], int] = {}  # process-wide: equal ids <=> equal tensors up to place


def content_id(tensor: TensorSpec) -> int:
    """Small integer naming everything about ``tensor`` but its place (name, layer, stage, chunk):
    tensors with the same id have the same shapes, sharding, groups and optimizer (process-wide)."""
    key = tuple(getattr(tensor, f.name) for f in fields(TensorSpec) if f.name not in _PLACE_FIELDS)
    return _CONTENT_IDS.setdefault(key, len(_CONTENT_IDS))


@dataclass(frozen=True, eq=False)
class TensorRun:
    """Consecutive tensors of one place (stage, chunk): either given (``prefix`` None) or the tensors
    of one layer copied from another layer of the same kind (``templates``) under ``prefix`` names."""

    stage: int
    chunk: int
    templates: tuple[TensorSpec, ...]
    ids: tuple[int, ...]  # content_id of each tensor
    prefix: str | None = None
    suffixes: tuple[str, ...] = ()
    layer: int | None = None

    def tensors(self) -> tuple[TensorSpec, ...]:
        """The run's tensors (built on demand for copied layers)."""
        if self.prefix is None:
            return self.templates
        place = {"layer": self.layer, "stage": self.stage, "chunk": self.chunk}
        return tuple(_placed(t, self.prefix + x, place) for t, x in zip(self.templates, self.suffixes, strict=True))


@dataclass(frozen=True, eq=False)
class Inventory:
    """All tensors of a model under one parallel layout.

    Held as :class:`TensorRun` s (the layers of a kind share their tensors up to name and place) so
    that the optimizer plan and the memory model work per distinct content (:func:`content_id`):
    :meth:`chunk_key`, :meth:`stage_tensor_counts`, :attr:`by_content`; :attr:`tensors` lists every
    tensor (built on first use).
    """

    model: ModelSpec
    tp: int
    pp: int
    vpp: int
    ep: int
    etp: int
    split_qkv: bool
    runs: tuple[TensorRun, ...] = field(repr=False)

    @cached_property
    def tensors(self) -> tuple[TensorSpec, ...]:
        """Every tensor in definition order."""
        return tuple(t for r in self.runs for t in r.tensors())

    @cached_property
    def params_total(self) -> int:
        """Parameters of the model as laid out (embedding/output use the tp-padded vocabulary)."""
        return sum(t.total_numel for t in self.tensors)

    @cached_property
    def by_content(self) -> dict[int, TensorSpec]:
        """content id -> one tensor with that content (its first)."""
        out: dict[int, TensorSpec] = {}
        for r in self.runs:
            for t, i in zip(r.templates, r.ids, strict=True):
                out.setdefault(i, t)
        return out

    @cached_property
    def _chunks(self) -> dict[tuple[int, int], tuple[list[TensorRun], tuple[int, ...]]]:
        """(stage, chunk) -> (runs in definition order, content ids of their tensors)."""
        runs: dict[tuple[int, int], list[TensorRun]] = {}
        for r in self.runs:
            runs.setdefault((r.stage, r.chunk), []).append(r)
        return {k: (rs, tuple(i for r in rs for i in r.ids)) for k, rs in runs.items()}

    def chunk_tensors(self, stage: int, chunk: int) -> tuple[TensorSpec, ...]:
        """Tensors of model chunk ``chunk`` of pipeline stage ``stage`` (definition order)."""
        return tuple(t for r in self._chunks.get((stage, chunk), ([], ()))[0] for t in r.tensors())

    def chunk_key(self, stage: int, chunk: int) -> tuple[int, ...]:
        """Content ids of :meth:`chunk_tensors` (equal keys: equal tensors up to names and place)."""
        return self._chunks.get((stage, chunk), ([], ()))[1]

    def stage_tensors(self, stage: int) -> list[TensorSpec]:
        """Tensors held by pipeline stage ``stage`` (all chunks)."""
        return [t for c in range(self.vpp) for t in self.chunk_tensors(stage, c)]

    @cached_property
    def _stage_counts(self) -> dict[int, tuple[tuple[TensorSpec, int], ...]]:
        count: dict[int, dict[int, int]] = {s: {} for s in range(self.pp)}
        for r in self.runs:
            c = count[r.stage]
            for i in r.ids:
                c[i] = c.get(i, 0) + 1
        rep = self.by_content
        return {s: tuple((rep[i], n) for i, n in c.items()) for s, c in count.items()}

    def stage_tensor_counts(self, stage: int) -> tuple[tuple[TensorSpec, int], ...]:
        """The distinct tensors of ``stage`` (up to name and place) with how many there are: per-stage
        sums and maxima in O(distinct tensors)."""
        return self._stage_counts.get(stage, ())

    def rank_numel(self, stage: int) -> int:
        """Parameters held by one rank of ``stage`` (equal for every tp and ep rank)."""
        return sum(t.rank_numel * n for t, n in self.stage_tensor_counts(stage))

    def unique_shard_numel_sum(self) -> int:
        """Sum over every model-parallel rank of the parameters it holds, counting each replicated
        tensor once (on tp rank 0). Equals :attr:`params_total` exactly; used by the property test."""
        total = 0
        for t in self.tensors:
            ranks_holding_distinct = t.shards  # tp/etp ranks with distinct shards
            ep_ranks = self.ep if t.num_experts > 1 else 1
            total += t.local_numel * t.experts_per_rank * ranks_holding_distinct * ep_ranks
        return total


def build_inventory(
    model: ModelSpec, tp: int = 1, pp: int = 1, vpp: int = 1, ep: int = 1, etp: int = 1,
    split_qkv: bool = True, pipeline_split: str = "auto",
) -> Inventory:
    """Every tensor of ``model`` under the given sizes (assumed valid; see Scenario.validate)."""
    counts = virtual_stage_layer_counts(model.num_layers, pp, vpp, pipeline_split)  # type: ignore[arg-type]
    where: list[tuple[int, int]] = []
    for v, n in enumerate(counts):
        chunk, stage = divmod(v, pp)
        where.extend([(stage, chunk)] * n)
    last = (pp - 1, vpp - 1)
    h = model.hidden_size
    vpad = model.padded_vocab_size(tp)
    out: list[TensorSpec] = []  # tensors not yet in ``runs``
    runs: list[TensorRun] = []

    def flush() -> None:
        """Move the tensors added so far into runs (one per place)."""
        for t in out:
            if runs and runs[-1].prefix is None and (runs[-1].stage, runs[-1].chunk) == (t.stage, t.chunk):
                last = runs[-1]
                runs[-1] = TensorRun(t.stage, t.chunk, (*last.templates, t), (*last.ids, content_id(t)))
            else:
                runs.append(TensorRun(t.stage, t.chunk, (t,), (content_id(t),)))
        out.clear()

    def add(name: str, role: str, layer: int | None, loc: tuple[int, int], shape: tuple[int, ...],
            shard_dim: int | None, group: ShardGroup | None, optimizer: OptimizerOwner | None = None,
            experts: int = 1, components: tuple[tuple[int, int], ...] | None = None) -> None:
        shards = (tp if group == "tp" else etp) if shard_dim is not None else 1
        if optimizer is None:
            optimizer = "muon" if len(shape) == 2 else "adamw"
        if optimizer == "muon" and components is None:
            components = (shape,)  # type: ignore[assignment]
        out.append(TensorSpec(
            name=name, role=role, layer=layer, stage=loc[0], chunk=loc[1], global_shape=shape,
            shard_dim=shard_dim, shard_group=group if shard_dim is not None else None, shards=shards,
            dp_group="expert_dp" if experts > 1 or role.startswith("expert_") else "dp",
            optimizer=optimizer, num_experts=experts, experts_per_rank=experts // ep if experts > 1 else 1,
            muon_components=components or (),
        ))

    add("embedding.word_embeddings.weight", "embedding", None, (0, 0), (vpad, h), 0, "tp", "adamw")

    def add_layer(i: int, loc: tuple[int, int], prefix: str, moe: bool) -> None:
        att = model.attention
        add(f"{prefix}.input_layernorm.weight", "norm", i, loc, (h,), None, None)
        if isinstance(att, GqaAttention):
            d, nh, nkv = att.head_dim, att.num_heads, att.num_kv_heads
            qkv = ((nh + 2 * nkv) * d, h)
            comps = ((nh * d, h), (nkv * d, h), (nkv * d, h)) if split_qkv else (qkv,)
            add(f"{prefix}.self_attention.linear_qkv.weight", "qkv", i, loc, qkv, 0, "tp", components=comps)
            if att.qk_norm:
                add(f"{prefix}.self_attention.q_layernorm.weight", "norm", i, loc, (d,), None, None)
                add(f"{prefix}.self_attention.k_layernorm.weight", "norm", i, loc, (d,), None, None)
            add(f"{prefix}.self_attention.linear_proj.weight", "attn_out", i, loc, (h, nh * d), 1, "tp")
        else:
            assert isinstance(att, MlaAttention)
            nh, dq = att.num_heads, att.qk_head_dim + att.qk_pos_emb_head_dim
            if att.q_lora_rank:
                add(f"{prefix}.self_attention.linear_q_down_proj.weight", "q_down", i, loc, (att.q_lora_rank, h), None, None)
                add(f"{prefix}.self_attention.q_layernorm.weight", "norm", i, loc, (att.q_lora_rank,), None, None)
                add(f"{prefix}.self_attention.linear_q_up_proj.weight", "q_up", i, loc, (nh * dq, att.q_lora_rank), 0, "tp")
            else:
                add(f"{prefix}.self_attention.linear_q_proj.weight", "q_proj", i, loc, (nh * dq, h), 0, "tp")
            add(f"{prefix}.self_attention.linear_kv_down_proj.weight", "kv_down", i, loc,
                (att.kv_lora_rank + att.qk_pos_emb_head_dim, h), None, None)
            add(f"{prefix}.self_attention.kv_layernorm.weight", "norm", i, loc, (att.kv_lora_rank,), None, None)
            add(f"{prefix}.self_attention.linear_kv_up_proj.weight", "kv_up", i, loc,
                (nh * (att.qk_head_dim + att.v_head_dim), att.kv_lora_rank), 0, "tp")
            add(f"{prefix}.self_attention.linear_proj.weight", "attn_out", i, loc, (h, nh * att.v_head_dim), 1, "tp")
        add(f"{prefix}.pre_mlp_layernorm.weight", "norm", i, loc, (h,), None, None)
        if not moe:
            f = model.ffn_hidden_size
            add(f"{prefix}.mlp.linear_fc1.weight", "fc1", i, loc, (2 * f, h), 0, "tp")
            add(f"{prefix}.mlp.linear_fc2.weight", "fc2", i, loc, (h, f), 1, "tp")
            return
        spec = model.moe
        assert spec is not None
        e, fe = spec.num_experts, spec.expert_ffn_hidden_size
        add(f"{prefix}.mlp.router.weight", "router", i, loc, (e, h), None, None)
        if spec.router_bias:
            add(f"{prefix}.mlp.router.expert_bias", "expert_bias", i, loc, (e,), None, None, "none")
        add(f"{prefix}.mlp.experts.linear_fc1.weight", "expert_fc1", i, loc, (2 * fe, h), 0, "etp", experts=e)
        add(f"{prefix}.mlp.experts.linear_fc2.weight", "expert_fc2", i, loc, (h, fe), 1, "etp", experts=e)
        if spec.shared_expert_ffn_hidden_size:
            fs = spec.shared_expert_ffn_hidden_size
            add(f"{prefix}.mlp.shared_experts.linear_fc1.weight", "shared_fc1", i, loc, (2 * fs, h), 0, "tp")
            add(f"{prefix}.mlp.shared_experts.linear_fc2.weight", "shared_fc2", i, loc, (h, fs), 1, "tp")

    templates: dict[bool, TensorRun] = {}  # layer kind -> its first layer

    def stamp_layer(i: int, loc: tuple[int, int], prefix: str, moe: bool) -> None:
        """``add_layer``, with every layer of a kind after the first a copy of the first (the same
        tensors up to name, layer, stage and chunk, built only when listed)."""
        first = templates.get(moe)
        if first is None:
            flush()
            add_layer(i, loc, prefix, moe)
            first = templates[moe] = TensorRun(loc[0], loc[1], tuple(out), tuple(content_id(t) for t in out),
                                               prefix, tuple(t.name[len(prefix):] for t in out), i)
            out.clear()
            runs.append(TensorRun(loc[0], loc[1], first.templates, first.ids))
            return
        flush()
        runs.append(TensorRun(loc[0], loc[1], first.templates, first.ids, prefix, first.suffixes, i))

    for i in range(model.num_layers):
        stamp_layer(i, where[i], f"decoder.layers.{i}", model.is_moe_layer(i))
    for j in range(model.mtp_layers):
        prefix = f"mtp.layers.{j}"
        layer = model.num_layers + j
        add(f"{prefix}.enorm.weight", "norm", layer, last, (h,), None, None)
        add(f"{prefix}.hnorm.weight", "norm", layer, last, (h,), None, None)
        add(f"{prefix}.eh_proj.weight", "mtp_proj", layer, last, (h, 2 * h), 0, "tp")
        stamp_layer(layer, last, f"{prefix}.transformer_layer", model.is_moe_layer(model.num_layers - 1))
        add(f"{prefix}.final_layernorm.weight", "norm", layer, last, (h,), None, None)
    add("decoder.final_layernorm.weight", "norm", None, last, (h,), None, None)
    add("output_layer.weight", "output", None, last, (vpad, h), 0, "tp", "adamw")
    flush()
    return Inventory(model=model, tp=tp, pp=pp, vpp=vpp, ep=ep, etp=etp, split_qkv=split_qkv, runs=tuple(runs))


def _placed(template: TensorSpec, name: str, place: dict[str, Any]) -> TensorSpec:
    """A copy of ``template`` under another name and place (the dataclass's own fields, set without
    running ``__init__``: the copy equals ``TensorSpec(**fields)``)."""
    t = object.__new__(TensorSpec)
    d = t.__dict__
    d.update(template.__dict__)  # only the fields live there (TensorSpec caches nothing on instances)
    d["name"] = name
    d.update(place)
    return t


_INVENTORIES: OrderedDict[tuple[Any, ...], Inventory] = OrderedDict()
_INVENTORY_CACHE_SIZE = 64


def inventory_for(scenario) -> Inventory:  # noqa: ANN001 - Scenario import would be circular
    """The inventory of a resolved :class:`workloads.scenario.Scenario`, memoised on what it depends
    on (model, tp, pp, vpp, ep, etp, QKV split, pipeline split): shared by every optimizer plan and
    memory estimate of the same sizes (inventories are immutable)."""
    p = scenario.par
    key = (scenario.model, p.tp, p.pp, p.vpp, p.ep, p.expert_tp, scenario.optimizer.split_qkv, p.pipeline_split)
    inv = _INVENTORIES.get(key)
    if inv is None:
        inv = _INVENTORIES[key] = build_inventory(
            scenario.model, tp=p.tp, pp=p.pp, vpp=p.vpp, ep=p.ep, etp=p.expert_tp,
            split_qkv=scenario.optimizer.split_qkv, pipeline_split=p.pipeline_split,
        )
        if len(_INVENTORIES) > _INVENTORY_CACHE_SIZE:
            _INVENTORIES.popitem(last=False)
    else:
        _INVENTORIES.move_to_end(key)
    return inv


def clear_inventory_cache() -> None:
    """Forget the memoised inventories (cold timings)."""
    _INVENTORIES.clear()


def active_params(model: ModelSpec, include_embeddings: bool = True) -> int:
    """Parameters a token touches: everything but the unselected routed experts (tp = 1)."""
    inv = build_inventory(model)
    total = 0
    for t in inv.tensors:
        if t.role in ("embedding", "output") and not include_embeddings:
            continue
        if t.num_experts > 1:
            assert model.moe is not None
            total += t.global_numel * model.moe.topk
        else:
            total += t.global_numel
    return total
