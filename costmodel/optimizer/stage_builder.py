"""Per-stage plan construction: buffers in backprop order, buckets, ownership and per-GPU work.

Internal to :mod:`costmodel.optimizer.plan`. For one pipeline stage, each model chunk's
parameters are walked in backprop order and split into Megatron's buffers (dense over ``dp`` =
dp×cp, experts over ``expert_dp``); the distribution then decides buckets and who steps what:

* ``element_wise`` (AdamW): padded DDP buckets, reduce-scatter, Adam on each rank's equal shard,
  all-gather of bf16 parameters;
* ``layer_wise`` ``current``: Muon parameters in shard-aligned layer-wise buckets (whole
  parameters per rank, balanced by ``load_balance``), reduce-scatter, NS on owned matrices, equal
  all-gather; non-Muon parameters in separate element-wise buckets;
* ``layer_wise`` ``legacy``: unpadded DDP buckets all-reduced; every parameter (Muon and AdamW)
  owned whole by one rank (ping-pong by numel over the stage by default); one ``all_gather_v`` per
  dp group of the updated parameters (Megatron-Core 0.16.1 ``allgather_params``; per bucket when
  the gather is hidden, as the later legacy fallback does). With dp·cp = 1 ``shard_params`` returns early:
  every rank steps all its parameters (experts too, whatever expert_dp is), nothing is gathered;
* ``replicated``: unpadded DDP buckets all-reduced; every rank steps everything.

Per-rank values are numpy arrays over a role's dp indices; a GPU's load is its dense-role work plus
its expert-role work (see :mod:`costmodel.optimizer.plan_types`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from costmodel.optimizer import kernel_sequence as ks
from costmodel.optimizer import layouts as lay
from costmodel.optimizer.buffers import GROUPS, _Buffer
from costmodel.optimizer.elementwise import PARAM_BYTES
from costmodel.optimizer.ew_batch import adam_rows, element_wise_key, memoise_element_wise
from costmodel.optimizer.newton_schulz import (
    NsSettings,
    tensor_ns_work,
    tp_comm_time_s,
)
from costmodel.optimizer.plan_types import (
    COLUMNS,
    Bucket,
    LazyTuple,
    RankTable,
    RoleOwnership,
    StageOptimizerPlan,
)
from costmodel.optimizer.spans_batch import memoise_spans_effects, spans_key
from costmodel.optimizer.timer import Timer
from topologies.identity_memo import IdentityMemo
from workloads.comm import CollectiveCall, merge_calls
from workloads.inventory import TensorSpec


@dataclass(frozen=True)
class Grid:
    """Group sizes of one pipeline stage: ``dp`` is the dense data-parallel group (dp×cp)."""

    dp: int
    expert_dp: int
    tp: int = 1
    etp: int = 1
    ep: int = 1
    instances: int = 1  # distributed-optimizer instances: the optimizer shards over dp / instances ranks
    cp: int = 1  # context-parallel size (a factor of ``dp``): only the default bucket size reads it

    @property
    def gpus_per_stage(self) -> int:
        return self.tp * self.dp

    def size(self, group: str) -> int:
        """Ranks the optimizer of ``group`` ('dp' or 'expert_dp') shards over (one instance's share)."""
        return (self.dp if group == "dp" else self.expert_dp) // self.instances


_MUON_ROWS: IdentityMemo[np.ndarray] = IdentityMemo(4096)  # StageBuilder.muon_item's rows, the system by identity


ADAM_SHARD_COLUMNS = [COLUMNS.index(c) for c in ("owned", "adam_numel", "adam_pieces", "adam_chunks", "norm_pieces",
                                                  "norm_chunks", "kernels", "ew_s")]


@dataclass
class _Role:
    """Accumulated per-rank work of one dp role of one stage (columns :data:`COLUMNS`)."""

    group: str
    size: int
    acc: np.ndarray = field(init=False)
    name_parts: list[tuple[_Buffer, np.ndarray]] = field(default_factory=list)  # (buffer, its Muon items stepped)
    call_parts: list[tuple[list[tuple[CollectiveCall, ...]], np.ndarray]] = field(default_factory=list)
    owners: list[np.ndarray] = field(default_factory=list)
    gather_items: int = 0  # legacy layout: whole items gathered into the model by copies
    gather_numel: int = 0

    def __post_init__(self) -> None:
        self.acc = np.zeros((len(COLUMNS), self.size))

    def col(self, name: str) -> np.ndarray:
        """Per-rank values of one column (a view: adding to it accumulates)."""
        return self.acc[COLUMNS.index(name)]

    def add_owned(self, owner: np.ndarray, values: np.ndarray) -> None:
        """Add per-item rows ``values`` (items × columns) to their owners (owner -1 = every rank)."""
        everyone = owner < 0
        some = ~everyone
        if some.any():
            ncol = len(COLUMNS)
            index = (owner[some][:, None] * ncol + np.arange(ncol)).ravel()
            sums = np.bincount(index, weights=values[some].ravel(), minlength=self.size * ncol)
            self.acc += sums.reshape(self.size, ncol).T
        if everyone.any():
            self.acc += values[everyone].sum(axis=0)[:, None]

    def add_span_sums(self, sums: np.ndarray) -> None:
        """Add per-span sums (columns × ranks for one span, spans × columns × ranks otherwise:
        :class:`spans_batch._SpansEffect`) to the accumulators span after span (what one
        :meth:`add_owned` per span would add, in the same order)."""
        if sums.ndim == 2:
            self.acc += sums
            return
        # acc + span 0 + span 1 + ...: add.accumulate adds in that order, one span after the other
        steps = np.concatenate([self.acc[None], sums])
        self.acc[...] = np.add.accumulate(steps, axis=0)[-1]


class StageBuilder:
    """Accumulates buckets and per-rank work of one stage."""

    def __init__(self, stage: int, grid: Grid, spec, timer: Timer, st: NsSettings,  # noqa: ANN001
                 fp8_gather_bytes: int = PARAM_BYTES, fp8_gathers: int = 1, critical_only: bool = False) -> None:
        self.stage, self.grid, self.spec, self.timer, self.st = stage, grid, spec, timer, st
        self.critical_only = critical_only  # the plan keeps the slowest GPU class's RankWork only
        self.fp8_gather_bytes = fp8_gather_bytes  # bytes per element gathered for FP8-parameter buffers
        self.fp8_gathers = fp8_gathers  # all-gathers per FP8-parameter bucket (workloads.fp8_params)
        self.roles = {g: _Role(g, grid.size(g)) for g in GROUPS}
        # (sort key, (buffer key of _bucket_common, numel, used, reduce op, gather op, kind)) per bucket
        self.buckets: list[tuple[tuple[int, int], tuple]] = []
        self.gb = spec.grad_bytes
        self.adam = ks.AdamBytes.of(spec)
        self.grad_dtype = "fp32" if self.gb == 4 else "bf16"
        self._buffer_memo: dict[int, tuple[_Buffer, np.ndarray, list[tuple[CollectiveCall, ...]]]] = {}
        self.extra_calls: list[CollectiveCall] = []  # per-step collectives outside the DP buckets
        self._common: dict[tuple[int, str, bool], tuple[int, dict]] = {}  # see _bucket_common

    def bucket_size(self, chunk: int, stage: int | None = None) -> int | None:
        """Elements per bucket of ``chunk`` of this stage (or of ``stage``); None (one bucket) for pp
        ranks > 0, chunks > 0, or no overlap. The default is sized on the data-parallel group
        **without** context parallelism (Megatron-Core 0.16.1 distributed_data_parallel.py:63-65 reads
        ``dp_group``, built with ``with_context_parallel=False``, process_groups_config.py:470-472)."""
        if not self.spec.overlap_grad_reduce or (self.stage if stage is None else stage) > 0 or chunk > 0:
            return None
        return self.spec.bucket_size_elements or lay.default_bucket_size(self.grid.dp // self.grid.cp)

    def add_bucket(self, buf: _Buffer, idx: np.ndarray | None, numel: int, used: int, reduce_op: str | None,
                   gather_op: str | None, kind: str, ready: int | None = None) -> None:
        """Bucket of parameters ``buf[idx]`` (``ready``: their last backprop position, when known:
        ``idx`` is then not read)."""
        if ready is None:
            assert idx is not None
            ready = int(buf.position[idx].max())
        self.buckets.append(((-buf.chunk, ready), (self._bucket_common(buf), numel, used, reduce_op, gather_op, kind)))

    def _bucket_fields(self, what: tuple) -> dict:
        """The Bucket field values (but ``order``) of a bucket recorded by :meth:`add_bucket` as ``what``."""
        common_key, numel, used, reduce_op, gather_op, kind, *gather_used = what
        per, common = self._common[common_key]
        # all_gather_v moves the parameters themselves: the bucket's, or (legacy_gather) a whole group's
        gather_bytes = ((gather_used[0] if gather_used else used) if gather_op == "all_gather_v" else numel) * per
        kw = dict(common)
        kw.update(numel=numel, grad_bytes=numel * self.gb, param_bytes=gather_bytes if gather_op else numel * per,
                  reduce_op=reduce_op, gather_op=gather_op, used_numel=used, kind=kind)
        return kw

    def _bucket_common(self, buf: _Buffer) -> tuple[int, str, bool]:
        """The key in ``self._common`` of (parameter bytes per element, the Bucket fields every bucket
        of ``buf`` shares but its order), made on first use."""
        key = (buf.chunk, buf.group, buf.fp8)
        hit = self._common.get(key)
        if hit is None:
            gs = self.grid.size(buf.group)
            per = self.fp8_gather_bytes if buf.fp8 else PARAM_BYTES
            hit = self._common[key] = (per, dict(
                stage=self.stage, chunk=buf.chunk, dp_group=buf.group, group_size=gs,
                param_dtype="fp8" if per == 1 else "bf16", param_gathers=self.fp8_gathers if buf.fp8 else 1,
                instances=self.grid.instances,
                averaged=self.spec.average_in_collective and (buf.group == "dp" or gs * self.grid.instances == self.grid.dp)))
        return key

    def muon_item(self, t: TensorSpec) -> tuple[np.ndarray, tuple[CollectiveCall, ...]]:
        """(row of :data:`COLUMNS`, TP calls) of stepping one copy of Muon tensor ``t``: its kernel
        sequence (:func:`kernel_sequence.muon_tensor_kernels`, MCore defaults: no Nesterov, weight
        decay on) timed on the GPU, its NS FLOPs and TP collectives (memoised per plan on what they
        depend on: tensors of the same shapes and sharding share them)."""
        key = (t.muon_components, t.shard_dim, t.shards, t.shard_group, t.global_shape)
        hit = self.timer.muon_rows.get(key)
        if hit is None:
            w = tensor_ns_work(t, self.st)
            # across plans on the system (identity) and the placement shapes of the TP calls' groups
            shared = (key, self.st, self.gb, tuple(self.timer.group_shape(c) for c in w.calls))
            row = _MUON_ROWS.get(shared, self.timer.system)
            if row is None:
                tp_s = tp_comm_time_s(w, self.timer.call_s)
                ns_s, ew_s, launches, ns_launches = self.timer.muon_kernels(t, w, self.st, self.gb, key)
                n = t.local_numel
                row = np.array([n, w.flops, ns_s, tp_s, ew_s, launches, ns_launches, 1, 0, 0, 0, 1,
                                float(ks.chunks_of(n)), 1], dtype=np.float64)
                row.setflags(write=False)
                _MUON_ROWS.put(row, shared, self.timer.system)
            hit = self.timer.muon_rows[key] = (row, w.calls)
        return hit

    def adam_item(self, t: TensorSpec) -> np.ndarray:
        """Row of :data:`COLUMNS` of a whole non-Muon parameter stepped by one rank's fused Adam:
        one shard piece of the multi-tensor launches, its main -> model copy (and gradient cast)."""
        n = t.local_numel
        key = (n, self.adam.piece_kernels)
        row = self.timer.adam_rows.get(key)
        if row is None:
            per_kernel = len(self.adam.piece_kernels)
            ew_s = sum(float(self.timer.floored_s(1, b * n)) for b in self.adam.piece_kernels)
            chunks = float(ks.chunks_of(n))
            row = self.timer.adam_rows[key] = np.array([n, 0, 0, 0, ew_s, per_kernel, 0, 0, 1, chunks, n, 1, chunks, 1],
                                                       dtype=np.float64)
        return row

    def per_tensor(self, buf: _Buffer) -> tuple[np.ndarray, list[tuple[CollectiveCall, ...]]]:
        """Rows of :data:`COLUMNS` per distinct tensor of ``buf`` (items × columns), and each one's
        TP calls (empty for non-Muon tensors)."""
        hit = self._buffer_memo.get(id(buf))
        if hit is not None and hit[0] is buf:
            return hit[1], hit[2]
        muon = np.zeros(len(buf.unique), dtype=bool)
        muon[buf.tid] = buf.muon
        rows, calls = [], []
        for t, m in zip(buf.unique, muon.tolist(), strict=True):
            if m:
                row, c = self.muon_item(t)
                rows.append(row)
                calls.append(c)
            else:
                rows.append(self.adam_item(t))
                calls.append(())
        per = np.array(rows, dtype=np.float64).reshape(len(rows), len(COLUMNS))
        self._buffer_memo[id(buf)] = (buf, per, calls)
        return per, calls

    def step_whole(self, buf: _Buffer, sel: np.ndarray, owner: np.ndarray, gathered_by_copies: bool = False) -> None:
        """Owners step whole parameters ``buf[sel]``: Muon (NS + update) or AdamW on the full tensor.

        ``gathered_by_copies`` (legacy layout): every rank copies the parameters it does not own
        back into the model after the gather (:func:`kernel_sequence.gather_copy_kernels`).
        """
        if len(sel) == 0:
            return
        role = self.roles[buf.group]
        per, calls = self.per_tensor(buf)
        role.add_owned(owner, per[buf.tid[sel]])
        if gathered_by_copies:
            role.gather_items += len(sel)
            role.gather_numel += int(buf.numel[sel].sum())
        self._record_muon(buf, sel, owner, calls)

    def _record_muon(self, buf: _Buffer, sel: np.ndarray, owner: np.ndarray,
                     calls: list[tuple[CollectiveCall, ...]]) -> None:
        """Record the Muon tensors of ``buf[sel]``: their names, their TP calls and their owners."""
        role = self.roles[buf.group]
        is_muon = buf.muon[sel]
        if is_muon.any():
            picked = sel[is_muon]
            role.name_parts.append((buf, picked))
            role.call_parts.append((calls, buf.tid[picked]))
        role.owners.append(owner[is_muon])

    def adam_shards(self, shards: list[tuple[str, lay.BucketSpan, np.ndarray]]) -> None:
        """Fused Adam on each rank's equal shard of padded buckets (dp group, bucket ``span``, its
        buffer's parameter sizes), added in order (their values made together: :func:`ew_batch.adam_rows`)."""
        if not shards:
            return
        sizes = [self.grid.size(group) for group, _, _ in shards]
        rows = adam_rows(self, [(span, numel, gs) for (_, span, numel), gs in zip(shards, sizes, strict=True)])
        at = 0
        for (group, _, _), gs in zip(shards, sizes, strict=True):
            self.roles[group].acc[ADAM_SHARD_COLUMNS] += rows[:, at:at + gs]
            at += gs

    def element_wise(self, buf: _Buffer, sel: np.ndarray, reduce: bool = True) -> None:
        """AdamW on equal shards of padded DDP buckets (reduce-scatter + all-gather; ``reduce`` False:
        the gradients arrive reduce-scattered already, Megatron-FSDP optim_grads, so only the gather).

        The buckets and their per-rank Adam values depend on the parameters' sizes, which are
        shared-embedding, the group size and the bucket size only: memoised per plan on those (the
        equal chunks of a plan's stages share them; the values are added in the same order)."""
        if len(sel) == 0:
            return
        gs, bucket_size = self.grid.size(buf.group), self.bucket_size(buf.chunk)
        numel, isolate = buf.numel[sel], buf.shared[sel]
        key = element_wise_key(numel, isolate, gs, bucket_size, self.adam.piece_kernels)
        spans = self.timer.element_wise_spans.get(key)
        if spans is None:
            memoise_element_wise(self, [(key, numel, isolate, gs, bucket_size)])
            spans = self.timer.element_wise_spans[key]
        role = self.roles[buf.group]
        for span, rows in spans:
            role.acc[ADAM_SHARD_COLUMNS] += rows
            self.add_bucket(buf, sel[span.first:span.stop], span.numel, span.used,
                            "reduce_scatter" if reduce else None, "all_gather", "element_wise")

    def layer_wise_current(self, buf: _Buffer, sel: np.ndarray, strategy: str) -> None:
        """Muon parameters in shard-aligned layer-wise buckets (reduce-scatter + equal all-gather).

        What a buffer adds (its spans' per-rank sums, owners and buckets) is memoised per plan on its
        per-item arrays (shared by equal chunks, :func:`buffers._buffer`), group size, bucket size and
        strategy, and replayed in the same order (:class:`spans_batch._SpansEffect`)."""
        if len(sel) == 0:
            return
        gs, bucket_size = self.grid.size(buf.group), self.bucket_size(buf.chunk)
        key = spans_key(buf, sel, gs, bucket_size, strategy)
        hit = self.timer.spans_effects.get(key)
        if hit is None or hit[0] is not buf.numel:
            memoise_spans_effects(self, [(key, buf, sel, gs, bucket_size)], strategy)
            hit = self.timer.spans_effects.get(key)
        if hit is None or hit[0] is not buf.numel:  # not a partition of sel: stepped span by span, not memoised
            for span in lay.layer_wise_layout(buf.numel[sel], buf.cost[sel], gs, bucket_size, strategy,
                                              isolate=buf.shared[sel]):
                self.step_whole(buf, sel[span.first:span.stop], span.owner)  # type: ignore[arg-type]
                self.add_bucket(buf, sel[span.first:span.stop], span.numel, span.used, "reduce_scatter",
                                "all_gather", "layer_wise")
            return
        effect = hit[1]
        role = self.roles[buf.group]
        role.add_span_sums(effect.sums)
        if len(effect.picked):
            role.name_parts.append((buf, effect.picked))
            role.call_parts.append((effect.calls, buf.tid[effect.picked]))
        role.owners.append(effect.owners)
        common, chunk = self._bucket_common(buf), -buf.chunk  # add_bucket of every span
        self.buckets.extend(((chunk, ready), (common, numel, used, "reduce_scatter", "all_gather", "layer_wise"))
                            for numel, used, ready in effect.buckets)

    def ddp(self, buf: _Buffer, gather_op: str | None) -> None:
        """Unpadded DDP buckets of the whole buffer, all-reduced (legacy layer-wise / replicated)."""
        gs = self.grid.size(buf.group)
        for span in lay.ddp_buckets(buf.numel, gs, self.bucket_size(buf.chunk), distributed_optimizer=False):
            self.add_bucket(buf, np.arange(span.first, span.stop), span.numel, span.used, "all_reduce",
                            gather_op, "ddp")

    def legacy_gather(self, bufs: list[_Buffer]) -> None:
        """The legacy layer-wise parameter gather of one dp group (``bufs``: its buffers, whose DDP
        buckets :meth:`ddp` added without a gather): Megatron-Core 0.16.1
        ``LayerWiseDistributedOptimizer.allgather_params`` (layer_wise_optimizer.py:151-182) flattens
        every parameter a rank owns in the group and issues **one** ``all_gather`` of uneven sizes per
        group (dp·cp, then expt_dp), synchronously in ``step``: Σ numel elements of the model dtype.
        It rides on the group's first bucket in forward order (the last DDP bucket of the first buffer)."""
        total = int(sum(int(buf.numel.sum()) for buf in bufs))
        first = min(bufs, key=lambda buf: buf.chunk)
        common = self._bucket_common(first)  # its buckets were added in backprop order: take the last
        at = max(i for i, (k, what) in enumerate(self.buckets) if what[0] == common and what[5] == "ddp")
        order, what = self.buckets[at]
        self.buckets[at] = (order, (*what[:4], "all_gather_v", what[5], total))

    def embedding_grad(self, t: TensorSpec, fsdp: int = 0) -> None:
        """The all-reduce of a shared embedding's gradient between the first and the last stage
        (``finalize_model_grads._allreduce_word_embedding_grads``, group ``embd``): the whole local
        main_grad in the gradient dtype; with Megatron-FSDP its local shard (approximated as
        ⌈numel / fsdp⌉: the FSDP shard boundaries are not modelled)."""
        numel = -(-t.rank_numel // fsdp) if fsdp else t.rank_numel
        self.extra_calls.append(CollectiveCall("all_reduce", "embd", 2, self.grad_dtype, numel * self.gb, 1,
                                               "embedding_grad"))

    def finish(self, ranks: RankTable) -> StageOptimizerPlan:
        """The stage's plan, ``ranks`` being its GPU classes' work (:func:`rank_work.rank_works` of this builder)."""
        self.buckets.sort(key=lambda kb: kb[0])
        # the field values of each distinct bucket, made once (a layer-wise expert buffer's buckets are alike)
        distinct: dict[tuple, Bucket] = {}
        buckets_l = []
        for i, (_, what) in enumerate(self.buckets):
            hit = distinct.get(what)
            if hit is None:
                b = Bucket.from_fields(self._bucket_fields(what), order=i)
                distinct[what] = b
            else:
                b = hit.at_order(i)
            buckets_l.append(b)
        buckets = tuple(buckets_l)
        multiplicity = Counter(what for _, what in self.buckets)
        # the buckets' collectives, identical ones counted together (what merge_calls makes of them); per
        # distinct bucket in the order of first occurrence (the keys enter ``counted`` in the same order)
        counted: dict[tuple, int] = {}
        key: tuple
        for what, b in distinct.items():
            times = multiplicity[what]
            if b.reduce_op is not None:
                key = (b.reduce_op, b.reduce_group, b.group_size, self.grad_dtype, b.grad_bytes, "grad_reduce")
                counted[key] = counted.get(key, 0) + times
            if b.instances > 1:  # the instances all-reduce each rank's reduced shard
                key = ("all_reduce", b.across_group, b.instances, self.grad_dtype, b.across_bytes, "grad_reduce_across")
                counted[key] = counted.get(key, 0) + times
            if b.gather_op:
                key = (b.gather_op, b.reduce_group, b.group_size, b.param_dtype, b.param_bytes, "param_gather")
                counted[key] = counted.get(key, 0) + b.param_gathers * times
        bucket_calls = [CollectiveCall(op, group, size, dtype, nbytes, count, phase)  # type: ignore[arg-type]
                        for (op, group, size, dtype, nbytes, phase), count in counted.items()]
        bucket_calls += self.extra_calls
        used = sum(b.used_numel for b in buckets)
        padding = sum(b.numel for b in buckets) / used - 1 if used else 0.0
        roles = tuple(
            RoleOwnership(group=r.group, size=r.size,  # type: ignore[arg-type]
                          owner=np.concatenate(r.owners) if r.owners else np.zeros(0, dtype=np.int64),
                          name_parts=tuple(r.name_parts), call_parts=tuple(r.call_parts))
            for r in self.roles.values())
        g = self.grid
        proto = StageOptimizerPlan(stage=self.stage, buckets=buckets, ranks=ranks, collectives=(),
                                   padding_overhead=padding, tp=g.tp, etp=g.etp, ep=g.ep, roles=roles,
                                   bucket_calls=tuple(merge_calls(bucket_calls)))
        crit = max(range(len(ranks)), key=ranks.column("total_s").__getitem__) if len(ranks) else 0
        # the critical GPU's collectives and their seconds, listed when first read (a new scenario's
        # report reads the critical stage's only)
        first = ranks[crit].rank if len(ranks) else None
        calls = LazyTuple(lambda: tuple(proto.gpu_collectives(first)) if first is not None else ())
        call_s = self.timer.call_s
        return StageOptimizerPlan(
            stage=self.stage, buckets=buckets, ranks=ranks, collectives=calls, padding_overhead=padding,
            collective_times_s=LazyTuple(lambda: tuple(call_s(c) for c in calls)), critical_rank=crit,
            tp=g.tp, etp=g.etp, ep=g.ep, roles=roles, bucket_calls=proto.bucket_calls)
