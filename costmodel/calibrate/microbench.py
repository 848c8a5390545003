"""Microbenchmarks of this machine: torch GEMM rate and gloo collective α-β (for reference runs).

With :mod:`costmodel.calibrate.microbench_ns` (its NS part), the only module of ``costmodel`` that
touches torch, and only inside its functions: it
measures the real machine that the reference backend runs on, it is never on the cost path.

* **GEMM**: square ``torch.matmul`` in bf16 and fp32 at several sizes from 4 to 768, timed in every
  one of ``world_size`` forked processes at once with one thread each, as the reference ranks run
  (two busy ranks share caches and memory bandwidth; the slowest rank's time counts). Each dtype is
  fitted as ``time = flops / gemm_flops_per_s + gemm_overhead_s`` (peak rate plus a fixed cost
  per call, which dominates the small matrices of the reference shapes) — on two paths when the
  times show two (:func:`fit_gemm_paths`): torch sends a bf16 GEMM of ``m·n·k ≤ 16³`` to ATen's
  plain loop (≈1 us per call) instead of oneDNN (≈15 us setup per call), so 16³ takes ≈3 us and
  20³ ≈15 us here. The small path and its threshold go to ``LocalMeasurements.gemm_small``.
* **Element-wise operators** (eager dispatch): ``add_``, ``lerp_``, ``mul``, ``to(bf16)``,
  ``copy_``, ``norm``, ``div`` on fp32 tensors from 16 to 2 Mi elements, each call on the next
  tensors of a pool larger than the last-level cache (an optimizer streams its states from memory),
  on every rank at once, by the mean thread CPU time of blocks of calls (a phase of a step is the sum
  of its calls, and the reference check compares CPU time), and fitted as
  ``time = dispatch_s + bytes / memory_Bps``: ``dispatch_s`` is the
  eager-PyTorch cost of one operator call (Python and the ATen dispatcher: the path that also issues
  GPU kernels), ``memory_Bps`` the element-wise memory bandwidth with every rank busy.
* **Newton–Schulz**: a 5-step quintic NS (Emerging-Optimizers' ``newton_schulz`` expressions) on a
  few shapes, each call on the next of a pool of distinct input matrices of :data:`NS_POOL_BYTES`
  (twice the 4 MiB L2: every call reads an input no recent call touched, as every tensor of an
  optimizer step is a different one), timed the same way, plus two shapes whose GEMMs all take
  the small-matrix path (:data:`NS_SMALL_PATH_SHAPES`), fitted as ``time = GEMM setups + GEMM FLOP
  time / efficiency + other kernels + call_overhead_s`` (:func:`fit_newton_schulz`): each GEMM's setup
  from the matmul fit on its path, plus ``gemm_setup_s`` on the main path (oneDNN's ``addmm`` with
  ``alpha``/``beta`` sets up 4–8 us longer than a bare matmul of the same shape here), its FLOPs at
  the matmul rate, the normalisation, cast and ``addmm`` copy kernels from the element-wise fit
  (:func:`costmodel.optimizer.kernel_sequence.newton_schulz_call_kernels`); the machine's NS GEMM
  efficiency (as ``EfficiencyFactors.newton_schulz_gemm`` is for GPUs) and the host cost of one
  call that launches no kernel (≈5–25 us here). NS times are the mean thread CPU time (what the
  reference check compares; a phase is the sum of its calls). A step visits its tensors in model
  order, and an NS call after one of another shape costs more than in a block of equal calls (the
  new shape's GEMM primitives and temporaries are cold): :func:`measure_ns_shape_change` times each
  shape after one of another shape and after one of its own, alternating; the median difference is
  ``NewtonSchulzFit.shape_change_s``, charged once per change of shape in a rank's NS calls. The
  measurements behind these choices are in ``docs/reference-check.md``.
* **Collectives**: 2 gloo processes (forked, one thread each) time all_reduce, all_gather,
  reduce_scatter and broadcast at several sizes (nccl-tests size convention, fp32) and fit
  ``time = alpha_s + size_bytes / beta_Bps`` per op. Loopback times are bimodal on a shared
  2-core machine (≈0.1 ms, or ≈4 ms when a rank waits for a scheduler tick; see also
  ``../shared/reference/cpu-torch-distributed-notes.md`` §2), so each point is the 20th percentile
  of its samples (the undisturbed time), the slowest rank's. They describe this machine only.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import socket
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from costmodel.calibrate.microbench_ns import (
    NS_SHAPES,
    NS_SMALL_PATH_SHAPES,
    fit_newton_schulz,
    fit_shape_change_s,
    measure_newton_schulz,
    measure_ns_shape_change,
)
from costmodel.calibrate.profile import (
    CollectiveFit,
    LocalMeasurements,
    SmallGemmPath,
)
from costmodel.calibrate.timing import fit_linear_time
from costmodel.calibrate.timing import time_call as _time_call

GEMM_SIZES = (4, 8, 12, 16, 20, 24, 32, 64, 128, 256, 512, 768)  # both sides of bf16's 16³ small-GEMM threshold
# A single affine path (time = a + b·FLOPs, a, b ≥ 0) grows at most in proportion to the FLOPs between two
# sizes; a time step of more than this many times the FLOP ratio is a change of code path, not noise (a
# busy shared core inflates one point by tens of percent, not 2x).
SMALL_PATH_MIN_STEP = 2.0
ELEMENTWISE_SIZES = (16, 4096, 65536, 524288, 2097152)
ELEMENTWISE_POOL_BYTES = 128 * 2 ** 20  # per operand pool: larger than the last-level cache
ELEMENTWISE_BLOCK = 8  # element-wise calls per timing sample
ELEMENTWISE_BYTES_PER_ELEMENT = {"add_": 12, "lerp_": 12, "mul": 8, "to_bf16": 6, "copy_": 8, "norm": 4, "div": 8}
COLLECTIVE_SIZES_BYTES = (4096, 65536, 262144, 1048576, 4194304)
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def fit_gemm_paths(points: Sequence[tuple[float, float]], min_step: float = SMALL_PATH_MIN_STEP,
                   ) -> tuple[tuple[float, float], SmallGemmPath | None]:
    """Fit (FLOPs, seconds) matmul timings as one or two code paths.

    Returns ``((overhead_s, seconds_per_flop), small)`` of the main path and the small-matrix path
    (``None`` when the times show one path). Between consecutive sizes a time ratio above
    ``min_step`` times the FLOP ratio is a change of path (see :data:`SMALL_PATH_MIN_STEP`). At the
    largest such step with at least two sizes below and three above, the sizes below take the small
    path (its ``max_flops`` is the largest of them) if the main path's fitted per-call cost exceeds
    the small path's time there (the step is a per-call setup the small path skips, not one slow
    point); each side is fitted by :func:`fit_linear_time`.
    """
    pts = sorted(points)
    flops, times = [f for f, _ in pts], [t for _, t in pts]
    steps = [((times[k] / times[k - 1]) / (flops[k] / flops[k - 1]), k) for k in range(2, len(pts) - 2)]
    for step, k in sorted(steps, reverse=True):
        if step <= min_step:
            break
        small_overhead_s, small_slope = fit_linear_time(flops[:k], times[:k])
        main = fit_linear_time(flops[k:], times[k:])
        if main[0] > small_overhead_s + small_slope * flops[k - 1]:
            return main, SmallGemmPath(max_flops=flops[k - 1], flops_per_s=1.0 / small_slope,
                                       overhead_s=small_overhead_s)
    return fit_linear_time(flops, times), None


def measure_gemm(dtype: str = "bf16", sizes: Sequence[int] = GEMM_SIZES, threads: int = 1,
                 min_time_s: float = 0.05) -> list[tuple[float, float]]:
    """(FLOPs, seconds) of one square matmul per size, with ``threads`` torch threads."""
    import torch

    torch_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = []
        gen = torch.Generator().manual_seed(0)
        for n in sizes:
            a = torch.randn(n, n, generator=gen).to(torch_dtype)
            b = torch.randn(n, n, generator=gen).to(torch_dtype)
            out.append((2.0 * n ** 3, _time_call(partial(torch.matmul, a, b), min_time_s)))
        return out
    finally:
        torch.set_num_threads(previous)


def measure_elementwise(sizes: Sequence[int] = ELEMENTWISE_SIZES, min_time_s: float = 0.02,
                        pool_bytes: int = ELEMENTWISE_POOL_BYTES) -> list[tuple[float, float]]:
    """(bytes moved, seconds) of one call of each element-wise operator of
    :data:`ELEMENTWISE_BYTES_PER_ELEMENT` on fp32 tensors of each size: the mean thread CPU time of
    the calls, timed in blocks of :data:`ELEMENTWISE_BLOCK` (the clock costs ~0.4 us, a tenth of a
    small call). The mean for the reason :func:`measure_newton_schulz` gives (a phase is the sum of
    its calls); CPU time, which holds no other process's slice, as the reference check compares.

    Each call works on the next pair of a pool of tensors of ``pool_bytes`` in all (up to 512
    pairs), larger than the last-level cache: an optimizer streams its states from memory, it
    does not find them in the cache.
    """
    import torch

    out = []
    for n in sizes:
        count = max(1, min(512, pool_bytes // (8 * n)))
        xs, ys = [torch.randn(n) for _ in range(count)], [torch.randn(n) for _ in range(count)]
        for name in ELEMENTWISE_BYTES_PER_ELEMENT:
            calls = itertools.cycle([_elementwise_call(name, x, y) for x, y in zip(xs, ys, strict=True)])

            def next_call(c: Iterator[Callable[[], object]] = calls) -> object:
                return next(c)()

            def block(call: Callable[[], object] = next_call) -> None:
                for _ in range(ELEMENTWISE_BLOCK):
                    call()

            per_block_s = _time_call(block, min_time_s, min_reps=20, clock=time.thread_time, statistic=statistics.fmean)
            out.append((float(ELEMENTWISE_BYTES_PER_ELEMENT[name] * n), per_block_s / ELEMENTWISE_BLOCK))
    return out


def _elementwise_call(name: str, x: Any, y: Any) -> Callable[[], object]:
    """One element-wise operator on tensors ``x``, ``y`` (see :data:`ELEMENTWISE_BYTES_PER_ELEMENT`)."""
    import torch

    calls: dict[str, Callable[[], object]] = {
        "add_": partial(x.add_, y, alpha=1e-3), "lerp_": partial(x.lerp_, y, 0.05), "mul": partial(x.mul, 0.5),
        "to_bf16": partial(x.to, torch.bfloat16), "copy_": partial(x.copy_, y), "norm": x.norm,
        "div": partial(x.div, 3.0)}
    return calls[name]


def _low_quantile(samples: Sequence[float], q: float = 0.2) -> float:
    """The ``q`` quantile of timing samples: the undisturbed time on a shared, time-sliced machine."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int, out_path: str, sizes: Sequence[int], gemm_sizes: Sequence[int],
            min_time_s: float, rank_setup: Callable[[], object] | None = None) -> None:
    import torch

    torch.set_num_threads(1)  # first: forked children hang on OpenMP otherwise
    if rank_setup is not None:
        rank_setup()
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        results: dict[str, list[tuple[Any, ...]]] = {}
        for dtype in ("bf16", "fp32"):
            points = []
            for n in gemm_sizes:
                dist.barrier()
                (flops, t), = measure_gemm(dtype, (n,), threads=1, min_time_s=min_time_s)
                worst = torch.tensor([t])
                dist.all_reduce(worst, op=dist.ReduceOp.MAX)
                points.append((flops, float(worst[0])))
            results[f"gemm_{dtype}"] = points
            ns_points = []
            for shape in NS_SHAPES + NS_SMALL_PATH_SHAPES:
                dist.barrier()
                (_, t), = measure_newton_schulz(dtype, (shape,), min_time_s)
                worst = torch.tensor([t])
                dist.all_reduce(worst, op=dist.ReduceOp.MAX)
                ns_points.append((shape, float(worst[0])))
            results[f"ns_{dtype}"] = ns_points
            dist.barrier()
            change = measure_ns_shape_change(dtype, NS_SHAPES, min_time_s)
            worst = torch.tensor([[o, m] for _, o, m in change])
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            results[f"ns_change_{dtype}"] = [(shape, float(o), float(m))
                                             for shape, (o, m) in zip(NS_SHAPES, worst.tolist(), strict=True)]
        dist.barrier()
        worst_points = []
        for size, t in measure_elementwise(min_time_s=min_time_s / 2):
            worst = torch.tensor([t])
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            worst_points.append((size, float(worst[0])))
        results["elementwise"] = worst_points
        for op in COLLECTIVE_OPS:
            results[op] = []
            for size in sizes:
                numel = size // 4
                big = torch.ones(numel)
                part = torch.ones(numel // world)

                def call(op: str = op, big: torch.Tensor = big, part: torch.Tensor = part) -> None:
                    if op == "all_reduce":
                        dist.all_reduce(big)
                    elif op == "all_gather":
                        dist.all_gather_single(big, part)
                    elif op == "reduce_scatter":
                        dist.reduce_scatter_single(part, big)
                    else:
                        dist.broadcast(big, src=0)

                dist.barrier()
                # every rank must run the same number of calls: fix the count from a probe on rank 0
                probe = torch.tensor([0.0])
                if rank == 0:
                    t0 = time.perf_counter()
                    call()
                    probe[0] = time.perf_counter() - t0
                else:
                    call()
                dist.broadcast(probe, src=0)
                reps = int(min(60, max(10, min_time_s / max(float(probe[0]), 1e-6))))
                samples = []
                for _ in range(reps):
                    dist.barrier()
                    t0 = time.perf_counter()
                    call()
                    samples.append(time.perf_counter() - t0)
                worst = torch.tensor([_low_quantile(samples)])
                dist.all_reduce(worst, op=dist.ReduceOp.MAX)
                results[op].append((float(size), float(worst[0])))
        if rank == 0:
            Path(out_path).write_text(json.dumps(results), encoding="utf-8")
    finally:
        dist.destroy_process_group()


def measure_ranks(world_size: int = 2, sizes: Sequence[int] = COLLECTIVE_SIZES_BYTES,
                  gemm_sizes: Sequence[int] = GEMM_SIZES, min_time_s: float = 0.03,
                  timeout_s: float = 120.0, rank_setup: Callable[[], object] | None = None,
                  ) -> dict[str, list[tuple[Any, ...]]]:
    """Timings on ``world_size`` forked gloo processes, slowest rank's (each runs ``rank_setup`` first:
    the reference ranks' process settings, e.g. their allocator's).

    Keys ``gemm_bf16`` / ``gemm_fp32``: (FLOPs, seconds) of one matmul, all ranks busy at once;
    keys ``ns_bf16`` / ``ns_fp32``: ([rows, cols], seconds) of one Newton-Schulz call, each shape in a
    block; ``ns_change_bf16`` / ``ns_change_fp32``: ([rows, cols], seconds after a call of another
    shape, seconds after one of the same shape) (:func:`measure_ns_shape_change`);
    key ``elementwise``: (bytes, seconds) of one element-wise operator call;
    one key per collective op: (size_bytes, seconds), each the 20th percentile of its samples.
    """
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "ranks.json")
        args = (world_size, _free_port(), out_path, tuple(sizes), tuple(gemm_sizes), min_time_s, rank_setup)
        ctx = mp.start_processes(_worker, args=args, nprocs=world_size, join=False, start_method="fork")
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"gloo microbenchmark did not finish within {timeout_s:.0f} s")
        finally:
            for proc in ctx.processes:
                if proc.is_alive():
                    proc.kill()
        return {op: [tuple(p) for p in points] for op, points in json.loads(Path(out_path).read_text()).items()}


def measure_local(world_size: int = 2, gemm_sizes: Sequence[int] = GEMM_SIZES,
                  collective_sizes: Sequence[int] = COLLECTIVE_SIZES_BYTES,
                  progress: Callable[[str], None] | None = None,
                  rank_setup: Callable[[], object] | None = None) -> LocalMeasurements:
    """Measure this machine: GEMM peak and per-call overhead per dtype, gloo α-β per collective.

    ``rank_setup`` runs first in every measuring process: pass the reference ranks' settings
    (``reference.allocator.keep_freed_memory``, their default) so the timings include the same
    allocator behaviour — with glibc's default, NS temporaries above 128 KiB fault in fresh pages
    (208 faults per (256, 1024) NS call, ≈15 % of its time here) that the ranks do not.
    """
    import torch

    if progress:
        progress(f"timing bf16/fp32 matmuls (sizes {', '.join(map(str, gemm_sizes))}) and gloo collectives "
                 f"on {world_size} processes, one thread each")
    timings = measure_ranks(world_size, collective_sizes, gemm_sizes, rank_setup=rank_setup)
    return local_from_timings(timings, world_size, str(torch.__version__))


def local_from_timings(timings: dict[str, list[tuple[Any, ...]]], world_size: int = 2,
                       torch_version: str = "") -> LocalMeasurements:
    """The local profile fitted from the timings of :func:`measure_ranks` (seconds per call; see there)."""
    gemm_rate: dict[str, float] = {}
    gemm_overhead: dict[str, float] = {}
    gemm_small: dict[str, SmallGemmPath] = {}
    collectives = {}
    dispatch_s, memory_Bps = 0.0, 1.0
    for key, points in timings.items():
        if key.startswith("ns_"):
            continue
        if key.startswith("gemm_"):
            dtype = key.removeprefix("gemm_")
            (gemm_overhead[dtype], slope), small = fit_gemm_paths(points)
            gemm_rate[dtype] = 1.0 / slope
            if small is not None:
                gemm_small[dtype] = small
            continue
        intercept, slope = fit_linear_time([x for x, _ in points], [t for _, t in points])
        if key == "elementwise":
            dispatch_s, memory_Bps = intercept, 1.0 / slope
        else:
            collectives[key] = CollectiveFit(alpha_s=intercept, beta_Bps=1.0 / slope)
    machine = f"{platform.machine()} {platform.processor() or platform.system()}, {os.cpu_count()} cpus"
    local = LocalMeasurements(machine=machine, torch_version=torch_version, threads=1,
                              gemm_flops_per_s=gemm_rate, gemm_overhead_s=gemm_overhead, gemm_small=gemm_small,
                              dispatch_s=dispatch_s,
                              memory_Bps=memory_Bps, world_size=world_size, collectives=collectives)
    ns = {}
    for dtype in gemm_rate:
        blocked = [(tuple(shape), t) for shape, t in timings[f"ns_{dtype}"]]
        fit = fit_newton_schulz(blocked, local, dtype)
        change_s = fit_shape_change_s(timings[f"ns_change_{dtype}"])
        ns[dtype] = fit.model_copy(update={"shape_change_s": change_s})
    return local.model_copy(update={"newton_schulz": ns})
