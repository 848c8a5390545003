"""Timing of short calls for the microbenchmarks (samples after a warm-up, by a chosen clock) and the
relative-error line fit of their times."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np


def timing_samples(fn: Callable[[], object], min_time_s: float, min_reps: int, max_reps: int,
                    clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Seconds per call of ``fn`` by ``clock`` after one warm-up: at least ``min_reps`` calls and
    ``min_time_s`` seconds of wall time, at most ``max_reps`` calls."""
    fn()  # warm-up
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < min_reps or time.perf_counter() - start < min_time_s:
        t0 = clock()
        fn()
        samples.append(clock() - t0)
        if len(samples) >= max_reps:
            break
    return samples


def time_call(fn: Callable[[], object], min_time_s: float, min_reps: int = 3,
              clock: Callable[[], float] = time.perf_counter,
              statistic: Callable[[Sequence[float]], float] = statistics.median) -> float:
    """Seconds per call (``statistic`` of the samples, default the median) over at least ``min_reps``
    calls and ``min_time_s`` seconds."""
    return statistic(timing_samples(fn, min_time_s, min_reps, max_reps=200, clock=clock))


def fit_linear_time(sizes: Sequence[float], times_s: Sequence[float]) -> tuple[float, float]:
    """Fit ``time = intercept + slope · size`` minimising relative error; returns (intercept, slope) ≥ 0."""
    x = np.asarray(sizes, dtype=float)
    t = np.asarray(times_s, dtype=float)
    a = np.stack([np.ones_like(x), x], axis=1) / t[:, None]  # rows scaled by 1/t: relative residuals
    coef, *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    intercept, slope = float(coef[0]), float(coef[1])
    if intercept < 0:  # refit through the origin
        intercept, slope = 0.0, float(np.sum(x / t) / np.sum((x / t) ** 2))
    return intercept, max(slope, 1e-30)
