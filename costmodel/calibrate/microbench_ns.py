"""Newton–Schulz microbenchmarks of this machine (see :mod:`costmodel.calibrate.microbench`).

Timed in each rank process of ``calibrate --microbench``: the NS calls of a few shapes in blocks
(:func:`measure_newton_schulz` on :data:`NS_SHAPES` and :data:`NS_SMALL_PATH_SHAPES`, fitted by
:func:`fit_newton_schulz`) and after a call of another
shape (:func:`measure_ns_shape_change`, :func:`fit_shape_change_s`), each call on the next input of
a pool of distinct matrices (:func:`ns_pool_size`), in thread CPU time.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
from scipy.optimize import nnls

from costmodel.calibrate.profile import LocalMeasurements, NewtonSchulzFit
from costmodel.calibrate.timing import time_call
from costmodel.optimizer.kernel_sequence import newton_schulz_call_kernels
from costmodel.optimizer.newton_schulz import NsSettings

NS_SHAPES = ((32, 64), (64, 128), (128, 128), (64, 192), (128, 512), (256, 1024))
# timed in blocks besides NS_SHAPES for the fit: every GEMM of their NS calls takes torch's small-matrix
# path (m·n·k ≤ 16³ in bf16), so they measure the per-call cost without the main path's setup
NS_SMALL_PATH_SHAPES = ((4, 64), (8, 64))
NS_POOL_BYTES = 8 * 2 ** 20  # fp32 inputs per NS shape: twice the L2 (an optimizer never repeats a tensor)
NS_POOL_MAX = 1024  # at most this many distinct inputs per shape (the small ones)
NS_COEFFICIENTS = ((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
                   (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012))  # quintic, as the project's default


def ns_pool_size(rows: int, cols: int, pool_bytes: int = NS_POOL_BYTES) -> int:
    """Distinct fp32 inputs of one NS shape in the microbenchmark's pool: ``pool_bytes`` of them
    (at least 2, at most :data:`NS_POOL_MAX`)."""
    return max(2, min(NS_POOL_MAX, pool_bytes // (4 * rows * cols)))


def newton_schulz_replica(dtype: str = "bf16") -> Callable[[Any], Any]:
    """The NS function the microbenchmark times: Emerging-Optimizers 0.3.0 ``muon_utils.newton_schulz``
    (5 quintic steps) in ``dtype`` matmuls, fp32 in and out."""
    import torch

    torch_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]

    def ns(g: torch.Tensor) -> torch.Tensor:
        x = g.mT if g.shape[0] > g.shape[1] else g
        x = torch.nn.functional.normalize(x, p=2, dim=(-2, -1), eps=1e-7).to(torch_dtype)  # type: ignore[arg-type]
        for a, b, c in NS_COEFFICIENTS:
            gram = x @ x.mT
            x = torch.addmm(x, torch.addmm(gram, gram, gram, alpha=c, beta=b), x, alpha=1.0, beta=a)
        x = x.to(torch.float32)
        return x.mT if g.shape[0] > g.shape[1] else x

    return ns


def ns_calls(dtype: str, shapes: Sequence[tuple[int, int]], pool_bytes: int) -> list[Callable[[], object]]:
    """One NS call per shape, each on the next input of its shape's pool (:func:`ns_pool_size`)."""
    import torch

    gen = torch.Generator().manual_seed(1)
    ns = newton_schulz_replica(dtype)
    pools = [itertools.cycle([torch.randn(rows, cols, generator=gen) for _ in range(ns_pool_size(rows, cols, pool_bytes))])
             for rows, cols in shapes]
    return [partial(lambda pool: ns(next(pool)), pool) for pool in pools]


def measure_newton_schulz(dtype: str = "bf16", shapes: Sequence[tuple[int, int]] = NS_SHAPES,
                          min_time_s: float = 0.05, pool_bytes: int = NS_POOL_BYTES,
                          ) -> list[tuple[tuple[int, int], float]]:
    """Seconds of one 5-step quintic Newton-Schulz call per shape (fp32 in and out, ``dtype`` matmuls).

    The same operations as Muon's orthogonalisation: transpose to wide, Frobenius normalisation,
    cast, per step ``A = X·Xᵀ``, ``B = bA + cA·A``, ``X = aX + B·X`` (addmm), cast back. Each shape
    is timed in a block of calls (their mean, see below), each call on the next input of its shape's pool
    (:func:`ns_pool_size`). Times are the thread's CPU time, as the reference's phases are compared
    (a call of milliseconds is often preempted on a shared machine, and its wall time then counts
    the other process's slice; the 0.4 us the clock costs is nothing beside a call of 60 us or more).
    The mean, not the median: a phase of the step is the sum of its calls, so its expected time is
    the calls' mean; CPU time holds no other process's slice, so the mean's tail is the calls' own
    (cache refills, allocator, the odd slow path: 6-9 % above the median on small shapes).
    """
    calls = ns_calls(dtype, shapes, pool_bytes)
    return [(shape, time_call(call, min_time_s, clock=time.thread_time, statistic=statistics.fmean))
            for shape, call in zip(shapes, calls, strict=True)]


def measure_ns_shape_change(dtype: str = "bf16", shapes: Sequence[tuple[int, int]] = NS_SHAPES,
                            min_time_s: float = 0.05, min_rounds: int = 20, pool_bytes: int = NS_POOL_BYTES,
                            ) -> list[tuple[tuple[int, int], float, float]]:
    """(shape, seconds after a call of another shape, seconds after a call of the same shape) of one
    NS call per shape (thread CPU time, means: see :func:`measure_newton_schulz`).

    Rounds alternate, so that both are timed under the same load: each round calls every shape
    once in turn (each call follows one of another shape), then every shape twice in a row (the
    second call follows one of its own); at least ``min_rounds`` rounds and ``min_time_s`` per shape.
    """
    calls = ns_calls(dtype, shapes, pool_bytes)
    for call in calls:  # warm-up
        call()
    other: list[list[float]] = [[] for _ in shapes]
    same: list[list[float]] = [[] for _ in shapes]

    def timed(call: Callable[[], object]) -> float:
        t0 = time.thread_time()
        call()
        return time.thread_time() - t0

    start = time.perf_counter()
    while len(other[0]) < min_rounds or time.perf_counter() - start < min_time_s * len(shapes):
        for k, call in enumerate(calls):
            other[k].append(timed(call))
        for k, call in enumerate(calls):
            call()
            same[k].append(timed(call))
        if len(other[0]) >= 400:
            break
    return [(shape, statistics.fmean(o), statistics.fmean(m)) for shape, o, m in zip(shapes, other, same, strict=True)]


def fit_shape_change_s(points: Sequence[tuple[Any, float, float]]) -> float:
    """Seconds an NS call costs more after a call of another shape than after one of its own: the
    median over the shapes of (after another − after the same), at least 0."""
    return max(0.0, statistics.median(o - m for _, o, m in points))


def measure_cpu_s(fn: Callable[[], object], min_time_s: float = 0.2, min_reps: int = 50) -> float:
    """Mean thread CPU seconds of one call of ``fn`` (after a warm-up; at least ``min_reps`` calls
    and ``min_time_s`` of wall time; the mean for the reason :func:`measure_newton_schulz` gives)."""
    return time_call(fn, min_time_s, min_reps, clock=time.thread_time, statistic=statistics.fmean)


def ns_gemm_flops(rows: int, cols: int, steps: int = 5) -> list[tuple[float, int]]:
    """(FLOPs, count) of the GEMMs of one NS call (m = min, n = max): X·Xᵀ 2m²n, A·A 2m³, B·X 2m²n."""
    m, n = min(rows, cols), max(rows, cols)
    return [(2.0 * m * m * n, steps), (2.0 * m ** 3, steps), (2.0 * m * m * n, steps)]


def fit_newton_schulz(points: Sequence[tuple[tuple[int, int], float]], local: LocalMeasurements,
                      dtype: str = "bf16") -> NewtonSchulzFit:
    """NS GEMM efficiency, per-call host cost and extra setup per main-path GEMM from NS timings
    (seconds per call of each shape), the machine's GEMM and element-wise fits in ``local`` pricing
    the call's kernels.

    Each call's time less its non-GEMM kernels and its GEMMs' setups as plain matmuls (each GEMM on
    its code path) is fitted as ``call_overhead_s + main-path GEMMs · gemm_setup_s + FLOP time /
    efficiency`` (the FLOP time at the matmul rate), non-negative least squares on relative errors.
    The three columns are separable when the shapes include some whose GEMMs all take the small
    path (:data:`NS_SMALL_PATH_SHAPES`: per-call cost alone), small main-path ones (plus the setups)
    and large ones (the FLOPs). A setup divided by the efficiency, as before, made a per-call constant
    of the efficiency, and efficiency and per-call cost traded places from one measurement to the next.
    """
    st = NsSettings(steps=5, cubic=False, precision=dtype, syrk=False, tp_mode="duplicated")
    rows, rest_s = [], []
    for shape, t in points:
        kernels = newton_schulz_call_kernels(*shape, st)
        gemms = [(k.count, k.flops, *local.gemm_path(k.flops, dtype)) for k in kernels if k.kind == "ns_gemm"]
        main = sum(count for count, flops, _, _ in gemms if local.gemm_main_path(flops, dtype))
        rows.append((1.0, float(main), sum(count * flops / rate for count, flops, _, rate in gemms)))
        setup_s = sum(count * call_s for count, _, call_s, _ in gemms)
        rest_s.append(t - setup_s - local.kernels_time_s([k for k in kernels if k.kind != "ns_gemm"]))
    weights = 1.0 / np.asarray([t for _, t in points])  # relative residuals
    scale = np.asarray(rows).max(axis=0)  # columns of order 1 for nnls
    coef, _ = nnls(np.asarray(rows) / scale * weights[:, None], np.asarray(rest_s) * weights)
    call_s, setup_s, slope = coef / scale
    return NewtonSchulzFit(efficiency=min(1.5, 1.0 / max(slope, 1.0 / 1.5)), call_overhead_s=float(call_s),
                           gemm_setup_s=float(setup_s))
