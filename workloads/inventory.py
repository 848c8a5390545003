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

Building blocks follow the model: LayerNorm adds a bias to every norm; ``add_bias_linear`` adds a
bias to every linear layer of attention and MLP (column-parallel biases shard with their rows,
row-parallel ones are replicated); a learned absolute position table sits on the first stage
(replicated over tp, AdamW); a non-gated activation halves fc1.

With MTP and pp > 1 the last stage holds its own copy of the word embedding for the MTP layers
(``EMBEDDING_COPY``, ``duplicate_of`` the stage-0 embedding); both copies are Megatron
``shared_embedding`` parameters: each gets its own DDP bucket (distributed optimizer) and their
gradients are all-reduced over the ``embd`` group (first and last stage) after the DP reduction
(``finalize_model_grads``). Megatron-Core 0.16.1 does not flag the copy
``is_embedding_or_output_parameter``, so with Muon it is orthogonalised like any 2-D weight.

**Tied embeddings** (``tie_embeddings``, Megatron's ``share_embeddings_and_output_weights``): one
tensor is the input embedding and the output layer. With one pipeline stage there is no
output-layer tensor; with more, the last stage allocates ``output_layer.weight`` as its replica of
the word embedding (``duplicate_of``; with MTP the MTP copy serves as the output weight and there is
no separate output layer): the same ``shared_embedding`` machinery keeps the two equal.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from typing import Literal

from workloads.models import GqaAttention, MlaAttention, ModelSpec
from workloads.pipeline_layout import StageSplit, virtual_stage_layer_counts

EMBEDDING_COPY = "last_stage.embedding.word_embeddings.weight"  # the MTP stage's copy (pp > 1)
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
    shared_embedding: bool = False  # Megatron's ``shared_embedding``: gradient all-reduced over the embd group
    duplicate_of: str | None = None  # a stage's own copy of another tensor (not a distinct model parameter)

    @property
    def is_expert(self) -> bool:
        """True for expert tensors: several copies per layer (routed experts) or an ``expert_*`` role."""
        return self.num_experts > 1 or self.role.startswith("expert_")

    @cached_property
    def local_shape(self) -> tuple[int, ...]:
        """Shape of one copy on one rank (the tp/etp shard)."""
        if self.shard_dim is None:
            return self.global_shape
        shape = list(self.global_shape)
        shape[self.shard_dim] //= self.shards
        return tuple(shape)

    @cached_property
    def global_numel(self) -> int:
        """Elements of one copy, unsharded."""
        n = 1
        for d in self.global_shape:
            n *= d
        return n

    @cached_property
    def local_numel(self) -> int:
        """Elements of one copy on one rank."""
        return self.global_numel // self.shards

    @cached_property
    def rank_numel(self) -> int:
        """Elements this tensor entry places on one rank of its stage (all local expert copies)."""
        return self.local_numel * self.experts_per_rank

    @cached_property
    def total_numel(self) -> int:
        """Elements of all copies in the whole model."""
        return self.global_numel * self.num_experts

    @cached_property
    def local_muon_components(self) -> tuple[tuple[int, int], ...]:
        """The Newton-Schulz matrices of one local shard (QKV split applied to the local shard)."""
        if self.shard_dim is None:
            return self.muon_components
        out = []
        for rows, cols in self.muon_components:
            out.append((rows // self.shards, cols) if self.shard_dim == 0 else (rows, cols // self.shards))
        return tuple(out)


@dataclass(frozen=True, eq=False)
class TensorRun:
    """Consecutive tensors of one model chunk: the tensors of ``len(layers)`` consecutive layers of
    one kind (every layer of a kind holds the same tensors up to name and layer index), or one
    tensor outside the layers (``layers`` = its ``layer``, ``prefixes`` = ``("",)``).

    ``templates`` are the tensors of the kind's first layer in the model (their ``name``, ``layer``,
    ``stage`` and ``chunk`` are that layer's); layer ``k`` of the run holds, for each template, a
    tensor named ``prefixes[k] + suffixes[j]`` with ``layer = layers[k]`` on this run's stage and
    chunk (:meth:`tensors`). Cost models work per template with the run's counts: per distinct
    tensor, not per tensor.
    """

    stage: int
    chunk: int
    kind: str  # "dense", "moe", "mtp" (a layer kind) or the role of a single tensor
    layers: tuple[int | None, ...]
    prefixes: tuple[str, ...]
    templates: tuple[TensorSpec, ...]
    suffixes: tuple[str, ...]

    @property
    def count(self) -> int:
        """Layers in the run (1 for a single tensor)."""
        return len(self.layers)

    def tensors(self) -> tuple[TensorSpec, ...]:
        """Every tensor of the run, in definition order."""
        out = []
        for layer, prefix in zip(self.layers, self.prefixes, strict=True):
            for t, suffix in zip(self.templates, self.suffixes, strict=True):
                name = prefix + suffix
                if (t.name, t.layer, t.stage, t.chunk) == (name, layer, self.stage, self.chunk):
                    out.append(t)
                else:
                    out.append(replace(t, name=name, layer=layer, stage=self.stage, chunk=self.chunk))
        return tuple(out)


@dataclass(frozen=True, eq=False)
class Inventory:
    """All tensors of a model under one parallel layout, held as :class:`TensorRun` s in
    definition order (virtual stages in order: chunk-major); :attr:`tensors` lists them one by one."""

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
        """Every tensor in definition order (built on first use)."""
        return tuple(t for r in self.runs for t in r.tensors())

    @cached_property
    def _stage_runs(self) -> dict[int, tuple[TensorRun, ...]]:
        out: dict[int, list[TensorRun]] = {s: [] for s in range(self.pp)}
        for r in self.runs:
            out[r.stage].append(r)
        return {s: tuple(rs) for s, rs in out.items()}

    def stage_runs(self, stage: int) -> tuple[TensorRun, ...]:
        """The runs of pipeline stage ``stage`` (all chunks, definition order)."""
        return self._stage_runs.get(stage, ())

    def chunk_runs(self, stage: int, chunk: int) -> tuple[TensorRun, ...]:
        """The runs of model chunk ``chunk`` of pipeline stage ``stage`` (definition order)."""
        return tuple(r for r in self.stage_runs(stage) if r.chunk == chunk)

    @cached_property
    def distinct_tensors(self) -> tuple[TensorSpec, ...]:
        """One tensor per template (every distinct tensor up to name and place)."""
        seen: dict[int, TensorSpec] = {}
        for r in self.runs:
            for t in r.templates:
                seen.setdefault(id(t), t)
        return tuple(seen.values())

    @cached_property
    def params_total(self) -> int:
        """Parameters of the model as laid out (embedding/output use the tp-padded vocabulary); a
        stage's copy of another tensor (the MTP stage's word embedding, a tied output layer's replica)
        is not a distinct parameter."""
        return sum(t.total_numel * r.count for r in self.runs for t in r.templates if t.duplicate_of is None)

    @property
    def embedding_copy(self) -> TensorSpec | None:
        """The last stage's own copy of the word embedding (MTP with pp > 1), or None."""
        return next((t for r in self.runs for t in r.templates
                     if t.duplicate_of is not None and t.role == "embedding_copy"), None)

    def stage_tensors(self, stage: int) -> list[TensorSpec]:
        """Tensors held by pipeline stage ``stage`` (all chunks)."""
        return [t for r in self.stage_runs(stage) for t in r.tensors()]

    def rank_numel(self, stage: int) -> int:
        """Parameters held by one rank of ``stage`` (equal for every tp and ep rank)."""
        return self._stage_rank_numel.get(stage, 0)

    @cached_property
    def _stage_rank_numel(self) -> dict[int, int]:
        return {s: sum(t.rank_numel * r.count for r in runs for t in r.templates)
                for s, runs in self._stage_runs.items()}

    def unique_shard_numel_sum(self) -> int:
        """Sum over every model-parallel rank of the parameters it holds, counting each replicated
        tensor once (on tp rank 0). Equals :attr:`params_total` exactly; used by the property test."""
        total = 0
        for t in self.tensors:
            if t.duplicate_of is not None:
                continue
            ranks_holding_distinct = t.shards  # tp/etp ranks with distinct shards
            ep_ranks = self.ep if t.num_experts > 1 else 1
            total += t.local_numel * t.experts_per_rank * ranks_holding_distinct * ep_ranks
        return total


def build_inventory(
    model: ModelSpec, tp: int = 1, pp: int = 1, vpp: int = 1, ep: int = 1, etp: int = 1,
    split_qkv: bool = True, pipeline_split: str | StageSplit = "auto",
) -> Inventory:
    """Every tensor of ``model`` under the given sizes (assumed valid; see Scenario.validate).

    The tensors of a layer kind (dense, MoE, MTP) are built once, for its first layer; the other
    layers of the kind are runs of copies (:class:`TensorRun`).
    """
    counts = virtual_stage_layer_counts(model.num_layers, pp, vpp, pipeline_split, model.mtp_layers)  # type: ignore[arg-type]
    where: list[tuple[int, int]] = []
    for v, n in enumerate(counts):
        chunk, stage = divmod(v, pp)
        where.extend([(stage, chunk)] * n)
    last = (pp - 1, vpp - 1)
    h = model.hidden_size
    vpad = model.padded_vocab_size(tp)
    out: list[TensorSpec] = []  # single tensors not yet in ``runs``
    runs: list[list] = []  # [stage, chunk, kind, layers, prefixes, templates, suffixes]
    kinds: dict[str, tuple[tuple[TensorSpec, ...], tuple[str, ...]]] = {}  # layer kind -> templates, suffixes

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

    def add_norm(prefix: str, layer: int | None, loc: tuple[int, int], width: int) -> None:
        add(f"{prefix}.weight", "norm", layer, loc, (width,), None, None)
        if model.norm_has_bias:
            add(f"{prefix}.bias", "norm_bias", layer, loc, (width,), None, None)

    def add_bias(weight: str, role: str, layer: int, loc: tuple[int, int], rows: int, sharded: bool,
                 group: ShardGroup = "tp", experts: int = 1) -> None:
        """The bias of linear layer ``weight`` (``rows`` outputs): sharded with column-parallel rows."""
        if model.add_bias_linear:
            add(weight.removesuffix(".weight") + ".bias", role, layer, loc, (rows,), 0 if sharded else None,
                group if sharded else None, experts=experts)

    word = "embedding.word_embeddings.weight"
    add(word, "embedding", None, (0, 0), (vpad, h), 0, "tp", "adamw")
    copy_embedding = model.mtp_layers > 0 and pp > 1
    tied_replica = model.tie_embeddings and pp > 1 and not copy_embedding  # the last stage's output_layer.weight
    if copy_embedding or tied_replica:  # a shared embedding: own DDP bucket, gradient all-reduced with the last stage's
        out[-1] = replace(out[-1], shared_embedding=True)
    if model.position_embedding == "learned_absolute":
        assert model.max_position_embeddings is not None
        add("embedding.position_embeddings.weight", "position_embedding", None, (0, 0),
            (model.max_position_embeddings, h), None, None, "adamw")

    def add_layer(i: int, loc: tuple[int, int], prefix: str, moe: bool) -> None:
        att = model.attention
        sa = f"{prefix}.self_attention"
        add_norm(f"{prefix}.input_layernorm", i, loc, h)
        if isinstance(att, GqaAttention):
            d, nh, nkv = att.head_dim, att.num_heads, att.num_kv_heads
            qkv = ((nh + 2 * nkv) * d, h)
            comps = ((nh * d, h), (nkv * d, h), (nkv * d, h)) if split_qkv else (qkv,)
            add(f"{sa}.linear_qkv.weight", "qkv", i, loc, qkv, 0, "tp", components=comps)
            add_bias(f"{sa}.linear_qkv.weight", "qkv_bias", i, loc, qkv[0], True)
            if att.qk_norm:
                add_norm(f"{sa}.q_layernorm", i, loc, d)
                add_norm(f"{sa}.k_layernorm", i, loc, d)
            add(f"{sa}.linear_proj.weight", "attn_out", i, loc, (h, nh * d), 1, "tp")
            add_bias(f"{sa}.linear_proj.weight", "attn_out_bias", i, loc, h, False)
        else:
            assert isinstance(att, MlaAttention)
            nh, dq = att.num_heads, att.qk_head_dim + att.qk_pos_emb_head_dim
            if att.q_lora_rank:
                add(f"{sa}.linear_q_down_proj.weight", "q_down", i, loc, (att.q_lora_rank, h), None, None)
                add_bias(f"{sa}.linear_q_down_proj.weight", "q_down_bias", i, loc, att.q_lora_rank, False)
                if att.latent_norm:
                    add_norm(f"{sa}.q_layernorm", i, loc, att.q_lora_rank)
                add(f"{sa}.linear_q_up_proj.weight", "q_up", i, loc, (nh * dq, att.q_lora_rank), 0, "tp")
                add_bias(f"{sa}.linear_q_up_proj.weight", "q_up_bias", i, loc, nh * dq, True)
            else:
                add(f"{sa}.linear_q_proj.weight", "q_proj", i, loc, (nh * dq, h), 0, "tp")
                add_bias(f"{sa}.linear_q_proj.weight", "q_proj_bias", i, loc, nh * dq, True)
            kv_down = att.kv_lora_rank + att.qk_pos_emb_head_dim
            add(f"{sa}.linear_kv_down_proj.weight", "kv_down", i, loc, (kv_down, h), None, None)
            add_bias(f"{sa}.linear_kv_down_proj.weight", "kv_down_bias", i, loc, kv_down, False)
            if att.latent_norm:
                add_norm(f"{sa}.kv_layernorm", i, loc, att.kv_lora_rank)
            kv_up = nh * (att.qk_head_dim + att.v_head_dim)
            add(f"{sa}.linear_kv_up_proj.weight", "kv_up", i, loc, (kv_up, att.kv_lora_rank), 0, "tp")
            add_bias(f"{sa}.linear_kv_up_proj.weight", "kv_up_bias", i, loc, kv_up, True)
            add(f"{sa}.linear_proj.weight", "attn_out", i, loc, (h, nh * att.v_head_dim), 1, "tp")
            add_bias(f"{sa}.linear_proj.weight", "attn_out_bias", i, loc, h, False)
        add_norm(f"{prefix}.pre_mlp_layernorm", i, loc, h)
        g = model.fc1_factor
        if not moe:
            f = model.ffn_hidden_size
            add(f"{prefix}.mlp.linear_fc1.weight", "fc1", i, loc, (g * f, h), 0, "tp")
            add_bias(f"{prefix}.mlp.linear_fc1.weight", "fc1_bias", i, loc, g * f, True)
            add(f"{prefix}.mlp.linear_fc2.weight", "fc2", i, loc, (h, f), 1, "tp")
            add_bias(f"{prefix}.mlp.linear_fc2.weight", "fc2_bias", i, loc, h, False)
            return
        spec = model.moe
        assert spec is not None
        e, fe = spec.num_experts, spec.expert_ffn_hidden_size
        add(f"{prefix}.mlp.router.weight", "router", i, loc, (e, h), None, None)
        if spec.router_bias:
            add(f"{prefix}.mlp.router.expert_bias", "expert_bias", i, loc, (e,), None, None, "none")
        ex = f"{prefix}.mlp.experts"
        add(f"{ex}.linear_fc1.weight", "expert_fc1", i, loc, (g * fe, h), 0, "etp", experts=e)
        add_bias(f"{ex}.linear_fc1.weight", "expert_fc1_bias", i, loc, g * fe, True, "etp", experts=e)
        add(f"{ex}.linear_fc2.weight", "expert_fc2", i, loc, (h, fe), 1, "etp", experts=e)
        add_bias(f"{ex}.linear_fc2.weight", "expert_fc2_bias", i, loc, h, False, "etp", experts=e)
        if spec.shared_expert_ffn_hidden_size:
            fs = spec.shared_expert_ffn_hidden_size
            sh = f"{prefix}.mlp.shared_experts"
            add(f"{sh}.linear_fc1.weight", "shared_fc1", i, loc, (g * fs, h), 0, "tp")
            add_bias(f"{sh}.linear_fc1.weight", "shared_fc1_bias", i, loc, g * fs, True)
            add(f"{sh}.linear_fc2.weight", "shared_fc2", i, loc, (h, fs), 1, "tp")
            add_bias(f"{sh}.linear_fc2.weight", "shared_fc2_bias", i, loc, h, False)

    def flush() -> None:
        """Move the single tensors added so far into runs of their own."""
        runs.extend([t.stage, t.chunk, t.role, [t.layer], [""], (t,), (t.name,)] for t in out)
        out.clear()

    def add_layer_of(kind: str, i: int, loc: tuple[int, int], prefix: str, build: Callable[[], None]) -> None:
        """Layer ``i`` of ``kind`` (tensors from ``build``, called for the kind's first layer only)."""
        flush()
        hit = kinds.get(kind)
        if hit is None:
            build()
            assert all(t.name.startswith(prefix) for t in out)
            hit = kinds[kind] = (tuple(out), tuple(t.name[len(prefix):] for t in out))
            out.clear()
        prev = runs[-1] if runs else None
        if prev is not None and prev[2] == kind and (prev[0], prev[1]) == loc:
            prev[3].append(i)
            prev[4].append(prefix)
        else:
            runs.append([loc[0], loc[1], kind, [i], [prefix], *hit])

    i, n = 0, model.num_layers
    while i < n:  # consecutive layers of one kind on one model chunk: one run, built from the first
        moe, loc = model.is_moe_layer(i), where[i]
        j = i + 1
        while j < n and where[j] == loc and model.is_moe_layer(j) == moe:
            j += 1
        prefix = f"decoder.layers.{i}"
        add_layer_of("moe" if moe else "dense", i, loc, prefix, partial(add_layer, i, loc, prefix, moe))
        if j > i + 1:  # the run add_layer_of extended or opened holds layer i: append the others
            runs[-1][3].extend(range(i + 1, j))
            runs[-1][4].extend(f"decoder.layers.{k}" for k in range(i + 1, j))
        i = j
    mtp_moe = model.is_moe_layer(model.num_layers - 1)

    def add_mtp(j: int) -> None:
        prefix = f"mtp.layers.{j}"
        layer = model.num_layers + j
        add_norm(f"{prefix}.enorm", layer, last, h)
        add_norm(f"{prefix}.hnorm", layer, last, h)
        add(f"{prefix}.eh_proj.weight", "mtp_proj", layer, last, (h, 2 * h), 0, "tp")
        add_layer(layer, last, f"{prefix}.transformer_layer", mtp_moe)
        add_norm(f"{prefix}.final_layernorm", layer, last, h)

    for j in range(model.mtp_layers):
        add_layer_of("mtp", model.num_layers + j, last, f"mtp.layers.{j}", partial(add_mtp, j))
    add_norm("decoder.final_layernorm", None, last, h)
    if not model.tie_embeddings:
        add("output_layer.weight", "output", None, last, (vpad, h), 0, "tp", "adamw")
    elif tied_replica:  # the last stage's replica of the tied word embedding
        add("output_layer.weight", "output", None, last, (vpad, h), 0, "tp", "adamw")
        out[-1] = replace(out[-1], shared_embedding=True, duplicate_of=word)
    flush()
    if copy_embedding:
        # The MTP layers' own word embedding on the last stage (GPTModel builds ``embedding`` where
        # mtp_process), defined first in its model chunk (so reduced last in backprop). Megatron-Core
        # 0.16.1 sets ``is_embedding_or_output_parameter`` only where pre_process (language_module.py
        # setup_embeddings_and_output_layer), so this 2-D copy is NOT excluded from Muon
        # (muon.py get_megatron_muon_optimizer): it is routed like any other matrix. With tied
        # embeddings it also serves as the output layer's weight.
        add(EMBEDDING_COPY, "embedding_copy", None, last, (vpad, h), 0, "tp")
        copy = replace(out.pop(), shared_embedding=True, duplicate_of=word)
        at = next(k for k, r in enumerate(runs) if (r[0], r[1]) == last)
        runs.insert(at, [copy.stage, copy.chunk, copy.role, [None], [""], (copy,), (copy.name,)])
    return Inventory(model=model, tp=tp, pp=pp, vpp=vpp, ep=ep, etp=etp, split_qkv=split_qkv,
                     runs=tuple(TensorRun(st, ch, kind, tuple(layers), tuple(prefixes), templates, suffixes)
                                for st, ch, kind, layers, prefixes, templates, suffixes in runs))


_INVENTORIES: OrderedDict[tuple, Inventory] = OrderedDict()
_INVENTORY_CACHE_SIZE = 64


def inventory_for(scenario) -> Inventory:  # noqa: ANN001 - Scenario import would be circular
    """The inventory of a resolved :class:`workloads.scenario.Scenario`, memoised on what it depends
    on (model, tp, pp, vpp, ep, etp, QKV split, pipeline split): shared by every optimizer plan and
    memory estimate of the same sizes (inventories are immutable)."""
    p = scenario.par
    key = (scenario.model, p.tp, p.pp, p.vpp, p.ep, p.expert_tp, scenario.optimizer.split_qkv, p.stage_split)
    inv = _INVENTORIES.get(key)
    if inv is None:
        inv = _INVENTORIES[key] = build_inventory(
            scenario.model, tp=p.tp, pp=p.pp, vpp=p.vpp, ep=p.ep, etp=p.expert_tp,
            split_qkv=scenario.optimizer.split_qkv, pipeline_split=p.stage_split,
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
