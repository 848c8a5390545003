"""The distributed optimizers on one rank: element-wise AdamW, layer-wise Muon, replicated.

* :class:`ElementWise` — Megatron's ``DistributedOptimizer`` (§3): padded buckets, reduce-scatter
  of gradients, AdamW on this rank's equal shard (parameter boundaries ignored), all-gather.
* :class:`LayerWiseLegacy` — gradients all-reduced (plain DDP buckets), whole parameters (Muon
  *and* AdamW ones) owned by one dp rank each, variable-size all-gather of the owned parameters.
* :class:`LayerWiseCurrent` — Muon parameters in shard-aligned layer-wise buckets (reduce-scatter,
  equal all-gather), the other parameters on an element-wise AdamW.
* :class:`Replicated` — DDP all-reduce and the full optimizer on every rank (no gather).

AdamW skips weight decay on biases and 1-D parameters (Megatron-Core's default parameter groups);
in an element-wise shard spanning several parameters that is a per-element decay factor.
Master weights and optimizer state are fp32 and exist only for what a rank updates; model
parameters live in the bucket buffers in the model dtype. Dense parameters reduce over ``dp``,
expert parameters over ``expert_dp``; Muon's tensor-parallel Newton–Schulz runs through the
orthogonaliser (:mod:`reference.tp_ns`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from reference.buffers import FlatBucket
from reference.config import RunConfig
from reference.grid import GridCoords
from reference.instrument import Comm, Pending, PhaseClock
from reference.layout import (
    BucketLayout,
    LayoutItem,
    assign_whole_params,
    ddp_buckets,
    layer_wise_buckets,
    padding_overhead,
    with_owners,
)
from reference.muon_math import (
    AdamHyper,
    MatrixInfo,
    MuonHyper,
    Orthogonalizer,
    adamw_step,
    muon_apply,
    muon_prepare,
    orthogonalize_param,
    without_weight_decay,
)
from reference.workload import ParamSpec

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
GROUP_KINDS = ("dp", "expert_dp")


def matrix_info(spec: ParamSpec) -> MatrixInfo:
    """What the Muon step needs to know about a 2-D parameter."""
    return MatrixInfo(
        name=spec.name, global_shape=spec.global_shape, shard_dim=spec.shard_dim,
        shards=spec.shards, tp_group=spec.shard_group or "tp", qkv_groups=spec.qkv_groups, qkv_split=spec.qkv_split,
    )


def layout_item(spec: ParamSpec) -> LayoutItem:
    """A parameter as the layouts see it: local elements and cost (max·min² for Muon, else numel)."""
    return LayoutItem(spec.name, spec.local_numel, spec.ns_cost if spec.optimizer == "muon" else spec.local_numel)


def layout_items(specs: Sequence[ParamSpec]) -> list[LayoutItem]:
    """Layout items in backprop order (reverse definition order)."""
    return [layout_item(s) for s in sorted(specs, key=lambda s: -s.order)]


@dataclass
class _State:
    master: torch.Tensor
    buf: torch.Tensor | None = None  # Muon momentum
    m: torch.Tensor | None = None  # Adam first moment
    v: torch.Tensor | None = None  # Adam second moment
    decay: torch.Tensor | None = None  # flat shards: per-element 1 − lr·wd (1 where no weight decay applies)


class DistOptimizer:
    """Common machinery: buckets, group sizes and ranks, per-parameter Muon / AdamW updates."""

    reduce_op = "all_reduce"
    gather_op: str | None = None

    def __init__(self, cfg: RunConfig, specs: Sequence[ParamSpec], init: dict[str, torch.Tensor],
                 coords: GridCoords, comm: Comm, clock: PhaseClock, ortho: Orthogonalizer,
                 muon: MuonHyper, adam: AdamHyper, device: torch.device) -> None:
        self.cfg, self.coords, self.comm, self.clock, self.ortho = cfg, coords, comm, clock, ortho
        self.muon, self.adam, self.device = muon, adam, device
        self.specs = {s.name: s for s in specs}
        self.init = init
        self.state: dict[str, _State] = {}
        self.flat_state: dict[int, _State] = {}
        self.buckets: list[FlatBucket] = []
        self.layouts: dict[str, list[BucketLayout]] = {}
        self.build()

    # ----- groups -----
    def group_size(self, kind: str) -> int:
        """Ranks in this rank's ``dp`` or ``expert_dp`` group."""
        return self.coords.dp if kind == "dp" else self.coords.expert_dp

    def group_rank(self, kind: str) -> int:
        """This rank's index in its ``dp`` or ``expert_dp`` group."""
        return self.coords.dp_rank if kind == "dp" else self.coords.expert_dp_rank

    def specs_of(self, kind: str, optimizer: str | None = None) -> list[ParamSpec]:
        """Parameters reduced over ``kind`` (optionally only those on ``optimizer``)."""
        return [s for s in self.specs.values() if s.dp_group == kind and optimizer in (None, s.optimizer)]

    def add_buckets(self, tag: str, kind: str, layouts: list[BucketLayout]) -> None:
        """Allocate buffers for ``layouts`` (recorded under ``tag:kind``)."""
        self.layouts[f"{tag}:{kind}"] = layouts
        for layout in layouts:
            self.buckets.append(FlatBucket.create(
                len(self.buckets), layout, kind, self.specs, self.init, DTYPES[self.cfg.param_dtype],
                DTYPES[self.cfg.grad_dtype], self.device))

    def build(self) -> None:
        """Lay out the buffers (per distribution)."""
        raise NotImplementedError

    # ----- per step -----
    def forward_order(self) -> list[FlatBucket]:
        """Buckets in the order the forward pass first needs them."""
        return sorted(self.buckets, key=lambda b: min(self.specs[n].order for n in b.names()))

    def backprop_order(self) -> list[FlatBucket]:
        """Buckets in the order backprop completes them."""
        return sorted(self.buckets, key=lambda b: -max(self.specs[n].order for n in b.names()))

    def zero_grads(self) -> None:
        """Zero every gradient buffer (padding included)."""
        for b in self.buckets:
            b.gbuf.zero_()

    def reduce_grads(self) -> None:
        """Reduce every bucket's gradients (mean over its dp group), backprop order."""
        for b in self.backprop_order():
            kind = b.group
            if self.reduce_op == "all_reduce":
                b.all_reduce_grads(self.comm, self.group_size(kind))
            else:
                b.reduce_scatter_grads(self.comm, self.group_rank(kind), self.group_size(kind))

    def step(self, step: int) -> None:
        """Update what this rank owns (``step`` counts from 1)."""
        raise NotImplementedError

    def start_param_gather(self, async_op: bool) -> list[tuple[FlatBucket, Pending]]:
        """Launch the parameter gather per bucket in forward order (waited now unless async)."""
        if self.gather_op is None:
            return []
        out = []
        for b in self.forward_order():
            rank = self.group_rank(b.group)
            if self.gather_op == "all_gather":
                out.append((b, b.all_gather_params(self.comm, rank, async_op)))
            else:
                out.append((b, b.all_gather_v_params(self.comm, rank, async_op)))
        return out

    # ----- updates -----
    def _param_state(self, bucket: FlatBucket, name: str) -> _State:
        if name not in self.state:
            master = bucket.param(name).to(torch.float32).clone()
            st = _State(master)
            if self.specs[name].optimizer == "muon":
                st.buf = torch.zeros_like(master)
            else:
                st.m, st.v = torch.zeros_like(master), torch.zeros_like(master)
            self.state[name] = st
        return self.state[name]

    def update_param(self, bucket: FlatBucket, name: str, step: int) -> None:
        """Muon or AdamW on one whole (local-shard) parameter; writes the model copy."""
        st = self._param_state(bucket, name)
        g = bucket.grad(name).to(torch.float32)
        if self.specs[name].optimizer == "muon":
            assert st.buf is not None
            u = muon_prepare(st.master, g, st.buf, self.muon)
            with self.clock.phase("newton_schulz"):
                o = orthogonalize_param(u, matrix_info(self.specs[name]), self.ortho)
            muon_apply(st.master, o, self.muon)
        else:
            assert st.m is not None and st.v is not None
            adam = self.adam if self.specs[name].weight_decay else without_weight_decay(self.adam)
            adamw_step(st.master, g, st.m, st.v, step, adam)
        bucket.param(name).copy_(st.master)

    def update_shard(self, bucket: FlatBucket, step: int) -> None:
        """AdamW on this rank's equal shard of an element-wise bucket; writes the model copy."""
        lo, hi = bucket.layout.shard_range(self.group_rank(bucket.group))
        if bucket.uid not in self.flat_state:
            master = bucket.pbuf[lo:hi].to(torch.float32).clone()
            self.flat_state[bucket.uid] = _State(master, m=torch.zeros_like(master), v=torch.zeros_like(master),
                                                 decay=self._decay_factor(bucket, lo, hi))
        st = self.flat_state[bucket.uid]
        assert st.m is not None and st.v is not None
        adamw_step(st.master, bucket.gbuf[lo:hi].to(torch.float32), st.m, st.v, step, self.adam, st.decay)
        bucket.pbuf[lo:hi].copy_(st.master)

    def _decay_factor(self, bucket: FlatBucket, lo: int, hi: int) -> torch.Tensor | None:
        """``1 − lr·wd`` per element of the shard [lo, hi), 1 on parameters without weight decay; None
        when the scalar does (every parameter decays, or none has weight decay)."""
        exempt = [s for s in bucket.layout.slots if not self.specs[s.name].weight_decay and s.start < hi and s.end > lo]
        if not self.adam.weight_decay or not exempt:
            return None
        factor = torch.full((hi - lo,), 1 - self.adam.lr * self.adam.weight_decay, dtype=torch.float32,
                            device=self.device)
        for s in exempt:
            factor[max(s.start, lo) - lo: min(s.end, hi) - lo] = 1.0
        return factor

    def for_each_owned(self, fn: Callable[[FlatBucket, str], None], owned: Callable[[FlatBucket, str], bool]) -> None:
        """Apply ``fn`` to owned parameters in definition order (identical on all TP peers)."""
        where = {n: b for b in self.buckets for n in b.names()}
        for name in sorted(where, key=lambda n: self.specs[n].order):
            if owned(where[name], name):
                fn(where[name], name)

    def padding_overhead(self) -> float:
        """Padded over parameter elements, minus one, over all buckets."""
        return padding_overhead([b.layout for b in self.buckets])

    def owned_names(self) -> list[str]:
        """Parameters whose whole update this rank computes (empty for element-wise shards)."""
        return sorted(self.state)


class ElementWise(DistOptimizer):
    """AdamW on Megatron's element-wise distributed optimizer."""

    reduce_op = "reduce_scatter"
    gather_op = "all_gather"

    def build(self) -> None:
        """Distributed-optimizer DDP buckets (padded for element-wise shards) per dp group kind."""
        for kind in GROUP_KINDS:
            items = layout_items(self.specs_of(kind))
            size = self.group_size(kind)
            self.add_buckets("element_wise", kind, ddp_buckets(items, size, self.cfg.bucket_elements, True))

    def step(self, step: int) -> None:
        """AdamW update of this rank's shard of every bucket (``step`` counts from 1)."""
        for b in self.buckets:
            self.update_shard(b, step)


class Replicated(DistOptimizer):
    """Plain DDP: all-reduce, then every rank updates every parameter."""

    def build(self) -> None:
        """Plain DDP buckets (no shard padding) per dp group kind."""
        for kind in GROUP_KINDS:
            size = self.group_size(kind)
            items = layout_items(self.specs_of(kind))
            self.add_buckets("ddp", kind, ddp_buckets(items, size, self.cfg.bucket_elements, False))

    def step(self, step: int) -> None:
        """Every rank updates every parameter (``step`` counts from 1)."""
        self.for_each_owned(lambda b, n: self.update_param(b, n, step), lambda b, n: True)


class LayerWiseLegacy(DistOptimizer):
    """Legacy layer-wise Muon: all-reduce, whole-parameter owners, variable-size all-gather."""

    gather_op: str | None = "all_gather_v"

    def build(self) -> None:
        """DDP buckets with whole-parameter owners (Muon parameters first, then AdamW).

        Megatron-Core 0.16.1 ``shard_params`` returns early when the dp·cp group has one rank: nothing
        is sharded, not even the experts over expert_dp; every rank owns (steps) all its parameters
        and no parameter is gathered.
        """
        strategy = self.cfg.resolved_load_balance
        sharded = self.group_size("dp") > 1
        if not sharded:
            self.gather_op = None
        for kind in GROUP_KINDS:
            size = self.group_size(kind)
            specs = self.specs_of(kind)
            if not specs:
                continue
            # all sub-optimizers' params: the Muon group, then the AdamW group, each in definition order
            ordered = sorted(specs, key=lambda s: (s.optimizer != "muon", s.order))
            if sharded:
                owners = assign_whole_params([layout_item(s) for s in ordered], size, strategy)
            else:
                owners = {s.name: self.group_rank(kind) for s in ordered}
            layouts = ddp_buckets(layout_items(specs), size, self.cfg.bucket_elements, False)
            self.add_buckets("legacy", kind, [with_owners(bl, owners) for bl in layouts])

    def step(self, step: int) -> None:
        """Update the parameters this rank owns (``step`` counts from 1)."""
        self.for_each_owned(lambda b, n: self.update_param(b, n, step),
                            lambda b, n: b.slots[n].owner == self.group_rank(b.group))

    def start_param_gather(self, async_op: bool) -> list[tuple[FlatBucket, Pending]]:
        """Synchronous: one variable-size all-gather per dp group kind of every parameter each rank
        owns in it, as Megatron-Core 0.16.1 ``LayerWiseDistributedOptimizer.allgather_params``
        (layer_wise_optimizer.py:151-182: flatten the owned parameters, one ``all_gather`` of uneven
        sizes per group). Asynchronous (``hide_param_gather``): per bucket in forward order, the
        legacy fallback's overlap of later Megatron-Core (PR #3524; 0.16.x has none)."""
        if self.gather_op is None:
            return []
        if async_op:
            return super().start_param_gather(async_op)
        for kind in GROUP_KINDS:
            buckets = [b for b in self.forward_order() if b.group == kind]
            if buckets:
                self._all_gather_v_group(kind, buckets)
        return []

    def _all_gather_v_group(self, kind: str, buckets: list[FlatBucket]) -> None:
        """One all_gather_v over ``kind`` of the owned parameters of all ``buckets`` (each rank's
        parameters flattened in bucket order, then slot order)."""
        rank = self.group_rank(kind)
        owned = {r: [(b, s) for b in buckets for s in b.layout.owned_slots(r)] for r in range(self.group_size(kind))}
        sizes = [sum(s.numel for _, s in owned[r]) for r in owned]
        mine = [b.pbuf[s.start: s.end] for b, s in owned[rank]]
        send = torch.cat(mine) if mine else buckets[0].pbuf[:0].clone()

        def unflatten(parts: list[torch.Tensor]) -> None:
            for r, part in enumerate(parts):
                if r == rank or len(parts) == 1:
                    continue
                pos = 0
                for b, s in owned[r]:
                    b.pbuf[s.start: s.end].copy_(part[pos: pos + s.numel])
                    pos += s.numel

        self.comm.all_gather_v(send, sizes, kind, "param_gather", unflatten, False)


class LayerWiseCurrent(DistOptimizer):
    """Current layer-wise Muon: shard-aligned buckets per buffer, reduce-scatter, equal all-gather."""

    reduce_op = "reduce_scatter"
    gather_op = "all_gather"

    def build(self) -> None:
        """Shard-aligned layer-wise buckets for Muon, element-wise buckets for AdamW, per dp group kind."""
        strategy = self.cfg.resolved_load_balance
        self.lw_uids: set[int] = set()
        for kind in GROUP_KINDS:
            size = self.group_size(kind)
            bucket_size = self.cfg.bucket_elements
            first = len(self.buckets)
            muon_items = layout_items(self.specs_of(kind, "muon"))
            self.add_buckets("layer_wise", kind, layer_wise_buckets(muon_items, size, bucket_size, strategy))
            self.lw_uids.update(range(first, len(self.buckets)))
            adam_items = layout_items(self.specs_of(kind, "adamw"))
            self.add_buckets("element_wise", kind, ddp_buckets(adam_items, size, bucket_size, True))

    def step(self, step: int) -> None:
        """Muon update of the owned layer-wise parameters, AdamW update of this rank's element-wise shards."""
        self.for_each_owned(
            lambda b, n: self.update_param(b, n, step),
            lambda b, n: b.uid in self.lw_uids and b.slots[n].owner == self.group_rank(b.group))
        for b in self.buckets:
            if b.uid not in self.lw_uids:
                self.update_shard(b, step)


def optimizer_class(cfg: RunConfig) -> type[DistOptimizer]:
    """The optimizer runtime for ``cfg``'s distribution (and layer-wise layout)."""
    dist = cfg.resolved_distribution
    if dist == "element_wise":
        return ElementWise
    if dist == "replicated":
        return Replicated
    return LayerWiseLegacy if cfg.layout == "legacy" else LayerWiseCurrent
