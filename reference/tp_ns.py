"""Tensor-parallel Newton–Schulz: the duplicated, distributed and blockwise modes (§5 of the spec).

Each orthogonaliser takes one local fp32 component of a parameter (its tensor-parallel shard) and
returns ``NS(U)·scale·extra`` for that shard:

* full (no TP, or a replicated matrix): plain Newton–Schulz, global-shape scale;
* ``duplicated``: all-gather the fp32 shards over the TP group (one all-gather of the full global
  matrix, 4 bytes per element), full Newton–Schulz on every rank, keep this rank's chunk;
* ``distributed``: orient so that the sharded dim is the column dim (transpose column-parallel
  shards), one fp32 scalar all-reduce of Σx² for the global Frobenius norm, then per iteration a
  local partial Gram and an all-reduce (SUM) of the R×R Gram in the work dtype (bf16 under bf16
  precision, fp32 otherwise); the A·A and B·X products run redundantly on every rank;
* ``blockwise``: Newton–Schulz of the local shard only, scale from the local shape (different math).

Newton–Schulz FLOPs and wall time are added to an :class:`NsCounter` when one is given.
"""

from __future__ import annotations

import time
from typing import Literal

import torch

from reference.instrument import Comm, NsCounter
from reference.muon_math import MatrixInfo, MuonHyper, scale_update
from reference.newton_schulz import (
    distributed_flops,
    newton_schulz,
    newton_schulz_iterations,
)
from workloads.flops import newton_schulz_flops

TpMode = Literal["duplicated", "distributed", "blockwise"]


class FullMatrixNS:
    """Single-process orthogonaliser on whole (global) matrices; also TP-replicated matrices."""

    def __init__(self, hyper: MuonHyper, counter: NsCounter | None = None) -> None:
        self.hyper = hyper
        self.counter = counter

    def _ns(self, x: torch.Tensor, transpose: bool | None = None) -> torch.Tensor:
        h = self.hyper
        t = time.perf_counter()
        out = newton_schulz(x, h.schedule, h.ns_steps, h.precision, h.eps, transpose, h.normalize_in)
        if self.counter is not None:
            flops = newton_schulz_flops(x.shape[0], x.shape[1], h.ns_steps, cubic=h.schedule.is_cubic)
            self.counter.add(flops, time.perf_counter() - t)
        return out

    def __call__(self, u: torch.Tensor, global_shape: tuple[int, int], info: MatrixInfo) -> torch.Tensor:
        return scale_update(self._ns(u), *global_shape, self.hyper)


class BlockwiseNS(FullMatrixNS):
    """Newton–Schulz of the local shard only; the scale uses the local shape (no communication)."""

    def __call__(self, u: torch.Tensor, global_shape: tuple[int, int], info: MatrixInfo) -> torch.Tensor:
        return scale_update(self._ns(u), u.shape[0], u.shape[1], self.hyper)


class TensorParallelNS(FullMatrixNS):
    """The duplicated / distributed / blockwise modes over this rank's TP (or expert-TP) group."""

    def __init__(self, hyper: MuonHyper, mode: TpMode, comm: Comm, counter: NsCounter | None = None) -> None:
        super().__init__(hyper, counter)
        self.mode = mode
        self.comm = comm
        self._blockwise = BlockwiseNS(hyper, counter)

    def __call__(self, u: torch.Tensor, global_shape: tuple[int, int], info: MatrixInfo) -> torch.Tensor:
        group = self.comm.groups[info.tp_group]
        if info.shard_dim is None or info.shards == 1 or group.size == 1:
            return super().__call__(u, global_shape, info)
        if self.mode == "blockwise":
            return self._blockwise(u, global_shape, info)
        if self.mode == "duplicated":
            return self._duplicated(u, global_shape, info)
        return scale_update(self._distributed(u, global_shape, info), *global_shape, self.hyper)

    def _duplicated(self, u: torch.Tensor, global_shape: tuple[int, int], info: MatrixInfo) -> torch.Tensor:
        group = self.comm.groups[info.tp_group]
        shard_dim = info.shard_dim
        assert shard_dim is not None  # __call__ sends only sharded matrices here
        t = group.size
        flat = torch.empty(u.numel() * t, dtype=torch.float32, device=u.device)
        self.comm.all_gather(flat, u.contiguous().view(-1), info.tp_group, "ns_gather")
        parts = flat.view(t, *u.shape).unbind(0)
        full = torch.cat(parts, dim=shard_dim)
        local = self._ns(full).chunk(t, dim=shard_dim)[group.rank]  # EO newton_schulz_tp, then Megatron scales
        return scale_update(local, *global_shape, self.hyper).contiguous()

    def _distributed(self, u: torch.Tensor, global_shape: tuple[int, int], info: MatrixInfo) -> torch.Tensor:
        h = self.hyper
        kind = info.tp_group
        tick = time.perf_counter()
        transpose = info.shard_dim == 0  # orient so that the sharded dim is the column dim
        x = (u.mT if transpose else u).to(torch.float32)
        sumsq = (x * x).sum().reshape(1)
        comm_s = self.comm.all_reduce(sumsq, kind, "ns_norm").blocked_s
        x = x / sumsq.sqrt().clamp(min=h.eps)[0]

        def gram_reduce(a: torch.Tensor) -> torch.Tensor:
            nonlocal comm_s
            a = a.contiguous()
            comm_s += self.comm.all_reduce(a, kind, "ns_gram").blocked_s
            return a

        out = newton_schulz_iterations(x, h.schedule.for_steps(h.ns_steps), h.precision, gram_reduce)
        if self.counter is not None:  # compute only: the Gram all-reduce waits are not NS FLOP time
            flops = distributed_flops(x.shape[0], x.shape[1], h.ns_steps, h.schedule.is_cubic)
            self.counter.add(flops, time.perf_counter() - tick - comm_s)
        return (out.mT if transpose else out).contiguous()
