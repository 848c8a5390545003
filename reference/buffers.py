"""Flat parameter and gradient buffers per bucket, with per-parameter views (as Megatron's DDP).

A :class:`FlatBucket` owns one contiguous parameter buffer (model dtype) and one gradient buffer
(grad dtype) laid out by a :class:`reference.layout.BucketLayout`; model parameters and their
gradients are views into them, so a collective on the bucket updates the parameters in place.
Padding elements stay zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from reference.instrument import Comm, Pending
from reference.layout import BucketLayout, Slot
from reference.workload import ParamSpec


@dataclass
class FlatBucket:
    """One bucket's buffers on one rank; ``group`` is the data-parallel group kind it reduces over."""

    uid: int
    layout: BucketLayout
    group: str
    pbuf: torch.Tensor
    gbuf: torch.Tensor
    specs: dict[str, ParamSpec]
    slots: dict[str, Slot] = field(default_factory=dict)

    @classmethod
    def create(cls, uid: int, layout: BucketLayout, group: str, specs: dict[str, ParamSpec],
               init: dict[str, torch.Tensor], param_dtype: torch.dtype, grad_dtype: torch.dtype,
               device: torch.device) -> FlatBucket:
        """Allocate the buffers and copy the initial local parameters into them."""
        pbuf = torch.zeros(layout.numel, dtype=param_dtype, device=device)
        gbuf = torch.zeros(layout.numel, dtype=grad_dtype, device=device)
        bucket = cls(uid, layout, group, pbuf, gbuf, {s.name: specs[s.name] for s in layout.slots})
        for s in layout.slots:
            bucket.slots[s.name] = s
            bucket.param(s.name).copy_(init[s.name])
        return bucket

    def param(self, name: str) -> torch.Tensor:
        """The model parameter (a view of the parameter buffer, local shape)."""
        s = self.slots[name]
        return self.pbuf[s.start: s.end].view(self.specs[name].local_shape)

    def grad(self, name: str) -> torch.Tensor:
        """The gradient (a view of the gradient buffer, local shape)."""
        s = self.slots[name]
        return self.gbuf[s.start: s.end].view(self.specs[name].local_shape)

    def names(self) -> list[str]:
        """Parameter names in bucket (backprop) order."""
        return [s.name for s in self.layout.slots]

    # ----- collectives -----
    def all_reduce_grads(self, comm: Comm, group_size: int) -> None:
        """SUM all-reduce of the whole gradient buffer, then × 1/group_size (the mean)."""
        comm.all_reduce(self.gbuf, self.group, "grad_reduce")
        if group_size > 1:
            self.gbuf.mul_(1.0 / group_size)

    def reduce_scatter_grads(self, comm: Comm, rank: int, group_size: int) -> torch.Tensor:
        """SUM reduce-scatter into this rank's shard of the gradient buffer (× 1/group_size); returns it."""
        lo, hi = self.layout.shard_range(rank)
        shard = self.gbuf[lo:hi]
        out = torch.empty_like(shard)
        comm.reduce_scatter(out, self.gbuf, self.group, "grad_reduce")
        shard.copy_(out)
        if group_size > 1:
            shard.mul_(1.0 / group_size)
        return shard

    def all_gather_params(self, comm: Comm, rank: int, async_op: bool) -> Pending:
        """Equal all-gather of every rank's parameter shard into the parameter buffer."""
        lo, hi = self.layout.shard_range(rank)
        return comm.all_gather(self.pbuf, self.pbuf[lo:hi].clone(), self.group, "param_gather", async_op)

    def all_gather_v_params(self, comm: Comm, rank: int, async_op: bool) -> Pending:
        """Variable-size all-gather of the whole parameters each rank owns in this bucket."""
        owners = range(self.layout.dp)
        owned = {r: self.layout.owned_slots(r) for r in owners}
        sizes = [sum(s.numel for s in owned[r]) for r in owners]
        mine = [self.pbuf[s.start: s.end] for s in owned[rank]]
        send = torch.cat(mine) if mine else self.pbuf[:0].clone()

        def unflatten(parts: list[torch.Tensor]) -> None:
            for r, part in enumerate(parts):
                if r == rank or len(parts) == 1:
                    continue
                pos = 0
                for s in owned[r]:
                    self.pbuf[s.start: s.end].copy_(part[pos: pos + s.numel])
                    pos += s.numel

        return comm.all_gather_v(send, sizes, self.group, "param_gather", unflatten, async_op)


def bucket_index(buckets: Sequence[FlatBucket]) -> dict[str, FlatBucket]:
    """Parameter name → the bucket that holds it."""
    return {name: b for b in buckets for name in b.names()}
