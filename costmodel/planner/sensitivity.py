"""How sure is the ranking? Re-rank the top plans with efficiency factors drawn from their uncertainty.

Each named efficiency factor with a fitted 1-sigma in the calibration profile (``uncertainty`` of
the system's entry) is drawn from a normal distribution around its current value, clipped to the
factor's valid range (the bounds of its field in :class:`topologies.hardware.EfficiencyFactors`);
factors are drawn independently (the profile stores no covariances). For every draw the top plans
are re-predicted with the analytic engine and re-ranked. Reported: how often the nominal best stays
best (top-1 stability), Kendall's tau-b between the nominal and the perturbed order (mean and
worst), and each plan's mean rank. Without fitted uncertainties nothing is sampled unless the user
assumes a relative sigma (``assumed_relative_sigma``), which is then stated in the result.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from costmodel.planner.pool import evaluator
from costmodel.planner.ranking import kendall_tau
from costmodel.planner.space import Candidate
from topologies.hardware import EfficiencyFactors

if TYPE_CHECKING:
    from costmodel.calibrate.profile import CalibrationProfile


@dataclass(frozen=True)
class SensitivityResult:
    samples: int
    plans: list[str]  # labels, nominal order
    sigmas: dict[str, float]  # absolute 1-sigma per factor
    source: str
    top1_stability_fraction: float = math.nan  # fraction of draws where the nominal best stays best
    kendall_tau_mean: float = math.nan
    kendall_tau_min: float = math.nan
    mean_rank: list[float] = field(default_factory=list)  # per plan (1 = best), nominal order
    top1_counts: dict[str, int] = field(default_factory=dict)
    note: str = ""


def factor_bounds(name: str) -> tuple[float, float]:
    """Valid (low, high) of an efficiency factor from its field constraints."""
    low, high = -math.inf, math.inf
    for item in EfficiencyFactors.model_fields[name].metadata:
        for attr in ("gt", "ge"):
            if getattr(item, attr, None) is not None:
                low = float(getattr(item, attr))
        for attr in ("lt", "le"):
            if getattr(item, attr, None) is not None:
                high = float(getattr(item, attr))
    return low, high


def is_continuous(name: str) -> bool:
    """Whether an efficiency factor is a real number (integer settings such as channel counts are not
    sampled)."""
    return EfficiencyFactors.model_fields[name].annotation is float


def factor_sigmas(profile: CalibrationProfile | None, system_name: str, factors: EfficiencyFactors,
                  assumed_relative_sigma: float | None = None) -> tuple[dict[str, float], str]:
    """Absolute 1-sigma per factor and a sentence saying where they come from."""
    sigmas: dict[str, float] = {}
    source = []
    entry = profile.systems.get(system_name) if profile is not None else None
    if profile is not None and entry is not None and entry.uncertainty:
        sigmas.update({k: float(v) for k, v in entry.uncertainty.items() if v > 0})
        source.append(f"fitted 1-sigma of {len(sigmas)} factors from profile '{profile.name}' ({system_name})")
    if assumed_relative_sigma:
        assumed = {k: assumed_relative_sigma * float(v) for k, v in factors.model_dump().items()
                   if k not in sigmas and is_continuous(k) and float(v) > 0}
        sigmas.update(assumed)
        source.append(f"assumed relative 1-sigma {assumed_relative_sigma:g} for {len(assumed)} other factors")
    return sigmas, "; ".join(source) or "no factor uncertainties available"


def draw_factors(nominal: EfficiencyFactors, sigmas: dict[str, float], samples: int,
                 seed: int = 0) -> list[dict[str, float]]:
    """``samples`` independent normal draws of the factors with a sigma, clipped to their ranges."""
    rng = np.random.default_rng(seed)
    values = nominal.model_dump()
    names = sorted(n for n in sigmas if is_continuous(n))
    draws = []
    for _ in range(samples):
        draw = {}
        for name in names:
            low, high = factor_bounds(name)
            x = rng.normal(values[name], sigmas[name])
            eps = 1e-6 * max(abs(values[name]), 1e-12)
            draw[name] = float(min(max(x, low + eps if math.isfinite(low) else x), high))
        draws.append(draw)
    return draws


def task_sample(item: tuple[dict[str, float], list[Candidate]]) -> list[float]:
    """Step times (analytic, seconds) of ``plans`` with the factors of one draw (a pool task)."""
    draw, plans = item
    ev = evaluator("screen")
    base = ev.base
    perturbed = ev.with_base(dataclasses.replace(base, system=base.system.with_efficiency(**draw)))
    return [perturbed.evaluate(c).step_time_s for c in plans]


def skipped_note(plans: int, sigmas: dict[str, float], source: str, samples: int) -> str | None:
    """Why the sensitivity is skipped (None: it runs): fewer than two plans, no sigma, no samples."""
    if not sigmas or samples <= 0 or plans < 2:
        return "skipped: " + ("fewer than two plans" if plans < 2 else source if not sigmas else "no samples")
    return None


def sample_tasks(plans: list[Candidate], sigmas: dict[str, float], samples: int,
                 seed: int = 0) -> list[tuple[dict[str, float], list[Candidate]]]:
    """The :func:`task_sample` tasks of ``samples`` draws (in draw order) for ``plans``."""
    return [(d, plans) for d in draw_factors(plans_base_factors(), sigmas, samples, seed)]


def summarise(plans: list[Candidate], nominal_s: list[float], sigmas: dict[str, float], source: str,
              times_per_draw: list[list[float]]) -> SensitivityResult:
    """The :class:`SensitivityResult` of ``plans`` (nominal order, ``nominal_s`` their analytic
    seconds) from each draw's step times of them (seconds, draw order)."""
    labels = [c.label() for c in plans]
    nominal = np.asarray(nominal_s, dtype=np.float64)
    taus: list[float] = []
    ranks: list[np.ndarray] = []
    best: Counter[str] = Counter()
    for times_list in times_per_draw:
        times = np.asarray(times_list, dtype=np.float64)
        taus.append(kendall_tau(nominal, times))
        ranks.append(np.argsort(np.argsort(times, kind="stable"), kind="stable") + 1)
        best[labels[int(np.argmin(times))]] += 1
    n = len(taus)
    return SensitivityResult(
        samples=n, plans=labels, sigmas=sigmas, source=source,
        top1_stability_fraction=best[labels[int(np.argmin(nominal))]] / n,
        kendall_tau_mean=float(np.mean(taus)), kendall_tau_min=float(np.min(taus)),
        mean_rank=[float(r) for r in np.mean(np.array(ranks), axis=0)], top1_counts=dict(best.most_common()),
    )


def run_sensitivity(plans: list[Candidate], nominal_s: list[float], sigmas: dict[str, float], source: str,
                    mapper: Callable[[Callable[[Any], Any], Iterable[Any]], Iterable[Any]],
                    samples: int = 16, seed: int = 0) -> SensitivityResult:
    """Re-rank ``plans`` (nominal order, best first; ``nominal_s`` their analytic times) under
    ``samples`` draws of the factors; ``mapper(func, tasks)`` runs :func:`task_sample` (a pool).

    The draws are summarised in draw order, whatever order the pool returns them in."""
    labels = [c.label() for c in plans]
    note = skipped_note(len(plans), sigmas, source, samples)
    if note is not None:
        return SensitivityResult(samples=0, plans=labels, sigmas=sigmas, source=source, note=note)
    tasks = sample_tasks(plans, sigmas, samples, seed)
    times = dict(mapper(task_sample_indexed, list(enumerate(tasks))))
    return summarise(plans, nominal_s, sigmas, source, [times[k] for k in range(len(tasks))])


def task_sample_indexed(item: tuple[int, tuple[dict[str, float], list[Candidate]]]) -> tuple[int, list[float]]:
    """(draw index, :func:`task_sample` of the draw): a pool task whose result says which draw it is."""
    k, task = item
    return k, task_sample(task)


def plans_base_factors() -> EfficiencyFactors:
    """The efficiency factors of the screening base scenario (calibration applied)."""
    return evaluator("screen").base.system.efficiency
