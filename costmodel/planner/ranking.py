"""Ranking, the Pareto front of step time vs memory, and rank correlation (numpy)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from costmodel.planner.evaluate import Evaluation


def rank_feasible(evaluations: Sequence[Evaluation]) -> list[Evaluation]:
    """Plans that fit in memory and have a step time, fastest first (ties: less memory, label)."""
    ok = [e for e in evaluations if e.fits and e.timed]
    return sorted(ok, key=lambda e: (e.step_time_s, e.memory_bytes, e.candidate.label()))


def rank_of(step_time_s: float, ranked: Sequence[Evaluation]) -> int:
    """1 + the number of ranked plans strictly faster than ``step_time_s``."""
    times = np.fromiter((e.step_time_s for e in ranked), dtype=np.float64, count=len(ranked))
    return int(np.count_nonzero(times < step_time_s)) + 1


def pareto_front(time_s: np.ndarray, memory_bytes: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats in both step time and memory (by memory, ascending).

    A point is on the front when every point with less or equal memory is slower (strictly).
    """
    time_s = np.asarray(time_s, dtype=np.float64)
    memory_bytes = np.asarray(memory_bytes, dtype=np.float64)
    if time_s.size == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((time_s, memory_bytes))  # by memory, then time
    t = time_s[order]
    best_before = np.minimum.accumulate(np.concatenate(([np.inf], t[:-1])))
    return order[t < best_before]


def kendall_tau(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """Kendall's tau-b between two score vectors over the same items (1 = same order)."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.size < 2:
        return 1.0
    dx = np.sign(x[:, None] - x[None, :])
    dy = np.sign(y[:, None] - y[None, :])
    iu = np.triu_indices(x.size, k=1)
    dx, dy = dx[iu], dy[iu]
    concordant_minus_discordant = float(np.sum(dx * dy))
    nx, ny = float(np.count_nonzero(dx)), float(np.count_nonzero(dy))
    if nx == 0 or ny == 0:
        return 1.0 if nx == ny else 0.0
    return concordant_minus_discordant / np.sqrt(nx * ny)
