"""One rank's training loop: stand-in forward/backward, gradient reduce, optimizer step, gather.

Per step (all phases timed per rank, seconds):

``forward``      stand-in matmuls ``x·Wᵀ`` per 2-D parameter in definition order; before a
                 parameter is used, the pending gather of its bucket is waited (``exposed_wait``);
``backward``     stand-in matmuls (two per parameter, reverse order) and the synthetic gradients;
``grad_reduce``  reduce-scatter or all-reduce per bucket (backprop order);
``optimizer``    the update (``newton_schulz`` is the part spent orthogonalising, TP comm included;
                 ``ns_comm`` is the time blocked in those TP collectives);
``param_gather`` launching the parameter gather (async when hiding) or doing it (then also
                 counted as ``exposed_wait``).

Gradient reduction is not overlapped with the backward stand-in (Megatron's overlap_grad_reduce).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import torch

from reference.allocator import keep_freed_memory
from reference.config import RunConfig
from reference.grid import GridCoords, build_groups
from reference.instrument import Comm, Group, NsCounter, Pending, PhaseClock
from reference.muon_math import AdamHyper, MuonHyper
from reference.newton_schulz import coefficient_schedule
from reference.optimizers import DistOptimizer, optimizer_class
from reference.tp_ns import TensorParallelNS
from reference.workload import (
    ParamSpec,
    initial_param,
    load_shapes,
    local_shard,
    param_specs,
    synthetic_grad,
)


@dataclass
class RankOutput:
    """What one rank reports after a run (tensors on the CPU, fp32)."""

    rank: int
    dp_rank: int
    tp_rank: int
    etp_rank: int
    expert_dp_rank: int
    step_times_s: list[float]
    phases_s: list[dict[str, float]]
    records: list[tuple[int, dict[str, Any], float, float]]  # (step, CollectiveCall dict, wall_s, blocked_s)
    ns_flops: list[float]
    ns_seconds: list[float]
    params: dict[str, torch.Tensor]
    owned: list[str]
    padding_overhead: float
    buckets: list[dict[str, Any]] = field(default_factory=list)
    phases_cpu_s: list[dict[str, float]] = field(default_factory=list)  # thread CPU seconds of the timed phases
    phases_faults: list[dict[str, float]] = field(default_factory=list)  # minor page faults of the timed phases
    phases_preemptions: list[dict[str, float]] = field(default_factory=list)  # involuntary context switches


def hypers(cfg: RunConfig) -> tuple[MuonHyper, AdamHyper]:
    """Muon and AdamW hyper-parameters of a run."""
    schedule = coefficient_schedule(cfg.ns_coefficients, cfg.custom_coefficients)
    muon = MuonHyper(lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov, weight_decay=cfg.weight_decay,
                     weight_decay_method=cfg.weight_decay_method, schedule=schedule, ns_steps=cfg.ns_steps, precision=cfg.matmul_precision, eps=cfg.ns_eps,
                     scale_mode=cfg.scale_mode, extra_scale=cfg.extra_scale_factor)
    adam = AdamHyper(lr=cfg.resolved_adam_lr, beta1=cfg.adam_beta1, beta2=cfg.adam_beta2, eps=cfg.adam_eps,
                     weight_decay=cfg.weight_decay)
    return muon, adam


def run_specs(cfg: RunConfig) -> list[ParamSpec]:
    """The parameters of a run; with AdamW every parameter is on AdamW."""
    specs = param_specs(load_shapes(cfg.shapes), cfg.tp, cfg.etp, cfg.split_qkv)
    if cfg.optimizer == "adamw":
        specs = [replace(s, tensor=replace(s.tensor, optimizer="adamw")) for s in specs]
    return specs


def shard_rank(spec: ParamSpec, coords: GridCoords) -> int:
    """This rank's shard index of ``spec`` (tp rank, etp rank, or 0 if replicated)."""
    if spec.shard_dim is None or spec.shards == 1:
        return 0
    return coords.tp_rank if spec.shard_group == "tp" else coords.etp_rank


def dp_index(spec: ParamSpec, coords: GridCoords) -> int:
    """The data-parallel replica index that seeds this rank's gradient of ``spec``."""
    return coords.expert_dp_rank if spec.is_expert else coords.dp_rank


class StandIn:
    """Forward/backward stand-in compute on the model parameters (``tokens`` activation rows)."""

    def __init__(self, opt: DistOptimizer, tokens: int, dtype: torch.dtype, device: torch.device) -> None:
        self.opt = opt
        gen = torch.Generator().manual_seed(7)
        self.where = {n: b for b in opt.buckets for n in b.names()}
        self.order = sorted(self.where, key=lambda n: opt.specs[n].order)
        self.acts: dict[int, torch.Tensor] = {}
        for name in self.order:
            shape = opt.specs[name].local_shape
            for d in shape if len(shape) == 2 else ():
                if d not in self.acts:
                    self.acts[d] = (torch.randn(tokens, d, generator=gen) * 0.1).to(dtype=dtype, device=device)

    def matrices(self) -> list[str]:
        """2-D parameters in definition order."""
        return [n for n in self.order if len(self.opt.specs[n].local_shape) == 2]

    def forward(self, clock: PhaseClock, pending: dict[int, Pending]) -> None:
        """x·Wᵀ per matrix, waiting each bucket's pending gather first (phases forward, exposed_wait)."""
        compute = 0.0
        for name in self.matrices():
            bucket = self.where[name]
            if bucket.uid in pending:
                clock.add("exposed_wait", pending.pop(bucket.uid).wait())
            t = time.perf_counter()
            w = bucket.param(name)
            _ = self.acts[w.shape[1]] @ w.mT
            compute += time.perf_counter() - t
        for p in pending.values():  # buckets with no matrix (vectors only)
            clock.add("exposed_wait", p.wait())
        pending.clear()
        clock.add("forward", compute)

    def backward(self) -> None:
        """Two matmuls per matrix in reverse order (dgrad and wgrad stand-ins)."""
        for name in reversed(self.matrices()):
            w = self.where[name].param(name)
            gy = self.acts[w.shape[0]]
            _ = gy @ w
            _ = gy.mT @ self.acts[w.shape[1]]


def fill_grads(opt: DistOptimizer, cfg: RunConfig, coords: GridCoords, step: int) -> None:
    """Write this rank's synthetic gradients (its dp replica, its TP shard) into the grad buffers."""
    opt.zero_grads()
    for b in opt.buckets:
        for name in b.names():
            spec = opt.specs[name]
            g = synthetic_grad(spec, cfg.seed, step, dp_index(spec, coords))
            b.grad(name).copy_(local_shard(g, spec, shard_rank(spec, coords)))


def _inject(cfg: RunConfig, rank: int, step: int) -> None:
    f = cfg.inject_failure
    if f is None or f.rank != rank or f.step != step:
        return
    if f.mode == "exit":
        os._exit(3)
    if f.mode == "hang":
        time.sleep(10 ** 6)
    raise RuntimeError(f"injected failure on rank {rank} at step {step}")


def train(cfg: RunConfig, coords: GridCoords, groups: dict[str, Group], device: torch.device) -> RankOutput:
    """Run ``cfg.steps`` steps on this rank and report timings, collectives and final parameters."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if cfg.keep_freed_memory and device.type == "cpu":
        keep_freed_memory()
    comm, clock, counter = Comm(groups, sync), PhaseClock(sync), NsCounter()
    specs = run_specs(cfg)
    init = {}
    dtype = torch.float32 if cfg.param_dtype == "fp32" else torch.bfloat16
    for s in specs:
        init[s.name] = local_shard(initial_param(s, cfg.seed), s, shard_rank(s, coords)).to(dtype=dtype, device=device)
    muon, adam = hypers(cfg)
    ortho = TensorParallelNS(muon, cfg.tp_mode, comm, counter)
    opt = optimizer_class(cfg)(cfg, specs, init, coords, comm, clock, ortho, muon, adam, device)
    stand_in = StandIn(opt, cfg.forward_tokens, dtype, device)
    pending: dict[int, Pending] = {}
    step_times = []
    for step in range(cfg.steps):
        _inject(cfg, coords.rank, step)
        comm.step = step
        clock.new_step()
        counter.new_step()
        sync()
        t0 = time.perf_counter()
        stand_in.forward(clock, pending)
        with clock.phase("backward"):
            stand_in.backward()
            fill_grads(opt, cfg, coords, step)
        with clock.phase("grad_reduce"):
            opt.reduce_grads()
        with clock.phase("optimizer"):
            opt.step(step + 1)
        t = time.perf_counter()
        launched = opt.start_param_gather(async_op=cfg.hide_param_gather)
        sync()
        clock.add("param_gather", time.perf_counter() - t)
        if cfg.hide_param_gather:
            pending = {b.uid: p for b, p in launched}
        else:
            clock.add("exposed_wait", time.perf_counter() - t)
        step_times.append(time.perf_counter() - t0)
        tp_comm = [r.blocked_s for r in comm.records if r.step == step and r.call.phase.startswith("ns_")]
        if tp_comm:
            clock.add("ns_comm", sum(tp_comm))  # TP collectives inside newton_schulz
    for p in pending.values():
        p.wait()
    return RankOutput(
        rank=coords.rank, dp_rank=coords.dp_rank, tp_rank=coords.tp_rank, etp_rank=coords.etp_rank,
        expert_dp_rank=coords.expert_dp_rank, step_times_s=step_times,
        phases_s=[dict(p) for p in clock.steps],
        records=[(r.step, r.call.to_dict(), r.wall_s, r.blocked_s) for r in comm.records],
        ns_flops=counter.flops, ns_seconds=counter.seconds,
        params={n: b.param(n).to(device="cpu", dtype=torch.float32).clone() for b in opt.buckets for n in b.names()},
        owned=opt.owned_names(), padding_overhead=opt.padding_overhead(),
        buckets=[{"buffer": tag, "numel": bl.numel, "dp": bl.dp,
                  "slots": [(s.name, s.start, s.numel, s.owner) for s in bl.slots]}
                 for tag, layouts in opt.layouts.items() for bl in layouts],
        phases_cpu_s=[dict(p) for p in clock.cpu_steps],
        phases_faults=[dict(p) for p in clock.fault_steps],
        phases_preemptions=[dict(p) for p in clock.preempt_steps],
    )


def run_rank(cfg: RunConfig, rank: int, world_size: int, init_method: str, backend: str = "gloo",
             gather: bool = False) -> Any:
    """Join the process group, build the grid's groups and train (the entry of every process).

    Returns this rank's RankOutput, or with ``gather`` (torchrun) the list of all ranks' outputs on
    rank 0 and None elsewhere (gathered after the timed steps, not recorded).
    """
    import torch.distributed as dist

    timeout = timedelta(seconds=cfg.timeout_s)
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", rank % max(torch.cuda.device_count(), 1)))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout)
    try:
        coords = GridCoords(rank, world_size, cfg.tp, cfg.etp)
        groups = build_groups(coords, cfg.timeout_s)
        out = train(cfg, coords, groups, device)
        if not gather:
            dist.barrier()
            return out
        outputs: list[Any] | None = [None] * world_size if rank == 0 else None
        dist.gather_object(out, outputs, dst=0)
        return outputs
    finally:
        dist.destroy_process_group()
