"""Fitting the named efficiency factors to measured step times, with held-out (grouped k-fold) error.

The fit is a robust, bounded, regularised least-squares problem on **log step time**:

* parameters are ``log f`` for each fitted factor ``f`` (a field of ``EfficiencyFactors``), bounded
  by :data:`FACTOR_BOUNDS`;
* data residuals ``log t_pred(f) − log t_measured``, one per run, under a soft-L1 (or Huber) loss
  whose scale ``f_scale`` (default 0.05 ≈ 5 %) separates noise from outliers;
* a weak Gaussian prior pulls each factor towards its datasheet value (``prior_sigma_log`` = 0.5,
  i.e. a factor 1.65× off is 1 σ): it keeps factors the data barely constrain near their defaults
  instead of letting them wander along flat directions;
* factors whose step-time sensitivity ``max |∂ log t / ∂ log f|`` over the runs is below
  ``min_sensitivity`` are not fitted at all (they are not identifiable from these runs).

Factors are fitted per system; where a software release has at least ``min_release_runs`` runs,
a small subset (``release_factors``) is refined per release with a tighter prior centred on the
system's values (partial pooling). 1-σ uncertainties come from the Jacobian at the solution
(``σ² (JᵀWJ)⁻¹`` with W the robust loss's weights, the prior rows included, and σ the robust
residual scale; the Jacobian is taken one-sided away from a bound, so a factor that ends on its
bound still gets an uncertainty).

Held-out error: runs are grouped by **configuration** (everything but the release), and the
configurations of each system are split into ``folds`` groups; each group is predicted by factors
fitted without any of its runs (the fold fit starts from the full fit's values, which only speeds
up convergence: the held-out runs are not in its objective). This is the error reported as the headline; training error is
reported beside it only for comparison.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from topologies.hardware import EfficiencyFactors

DEFAULT_FACTORS = ("gemm_bf16", "gemm_fp8", "gemm_fp4", "grouped_gemm", "attention",
                   "nvlink_bandwidth", "network_bandwidth", "alltoall_bandwidth")
DEFAULT_RELEASE_FACTORS = ("gemm_bf16", "gemm_fp8", "gemm_fp4", "grouped_gemm")

# (lower, upper) for each fittable factor: physically meaningful ranges, tighter than the schema's
FACTOR_BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_bf16": (0.2, 1.0), "gemm_fp8": (0.2, 1.0), "gemm_fp4": (0.1, 1.0),
    "gemm_half_efficiency_flops": (1e7, 1e12),
    "grouped_gemm": (0.2, 1.5), "attention": (0.1, 1.0), "memory_bandwidth": (0.3, 1.0),
    "newton_schulz": (0.2, 1.5), "nvlink_bandwidth": (0.2, 1.0), "nvls_bandwidth": (0.2, 1.0),
    "network_bandwidth": (0.2, 1.0), "alltoall_bandwidth": (0.05, 1.0),
    "nvlink_step_latency_s": (1e-7, 1e-4), "network_step_latency_s": (1e-7, 1e-3),
    "collective_base_latency_s": (1e-7, 1e-3), "nvls_latency_s": (1e-7, 1e-3),
    "overlap_compute_slowdown": (1e-3, 1.0),
}


@dataclass(frozen=True)
class FitRun:
    """One measured run as the fitter sees it: a step-time function of the factor overrides."""

    run_id: str
    system: str
    release: str
    config: str  # configuration key: runs sharing it are held out together
    measured_step_time_s: float
    predict_s: Callable[[Mapping[str, float]], float]


@dataclass(frozen=True)
class FitSettings:
    factors: tuple[str, ...] = DEFAULT_FACTORS
    release_factors: tuple[str, ...] = DEFAULT_RELEASE_FACTORS
    loss: str = "soft_l1"  # soft_l1, huber, linear
    f_scale: float = 0.05
    prior_sigma_log: float = 0.5
    release_prior_sigma_log: float = 0.10
    min_release_runs: int = 6
    min_sensitivity: float = 0.02
    folds: int = 5
    seed: int = 0
    max_nfev: int = 60

    def __post_init__(self) -> None:
        for name in (*self.factors, *self.release_factors):
            if name not in FACTOR_BOUNDS:
                raise ValueError(f"factor '{name}' cannot be fitted; fittable: {', '.join(FACTOR_BOUNDS)}")
        if self.loss not in ("soft_l1", "huber", "linear"):
            raise ValueError(f"loss '{self.loss}' unknown; valid: soft_l1, huber, linear")
        if self.folds < 2:
            raise ValueError("folds must be at least 2")


@dataclass(frozen=True)
class FactorFit:
    """Fitted values (natural units), their 1-σ, and what could not be fitted."""

    values: dict[str, float]
    sigma: dict[str, float]
    n_runs: int
    not_identifiable: tuple[str, ...] = ()
    residual_scale_log: float = 0.0


@dataclass(frozen=True)
class SystemFit:
    system: str
    fit: FactorFit
    releases: dict[str, FactorFit] = field(default_factory=dict)

    def factors_for(self, release: str | None) -> dict[str, float]:
        """System factors, with the release refinement on top when there is one."""
        out = dict(self.fit.values)
        if release is not None and release in self.releases:
            out.update(self.releases[release].values)
        return out


def default_factor_values(names: Sequence[str], defaults: EfficiencyFactors | Mapping[str, float] | None = None) -> dict[str, float]:
    """Datasheet values of ``names`` (from a system's EfficiencyFactors, or the schema defaults)."""
    if defaults is None:
        defaults = EfficiencyFactors()
    get = (lambda n: getattr(defaults, n)) if isinstance(defaults, EfficiencyFactors) else defaults.__getitem__
    return {n: float(get(n)) for n in names}


class _Evaluator:
    """log step times of a fixed list of runs at given factor values (with a small memo)."""

    def __init__(self, runs: Sequence[FitRun], base: Mapping[str, float]) -> None:
        self.runs = list(runs)
        self.base = dict(base)
        self._memo: dict[tuple[str | float, ...], np.ndarray] = {}
        self.evaluations = 0

    def log_times(self, names: Sequence[str], values: np.ndarray) -> np.ndarray:
        key = (*names, *np.round(values, 12).tolist())
        if key in self._memo:
            return self._memo[key]
        factors = {**self.base, **dict(zip(names, (float(v) for v in values), strict=True))}
        out = np.array([math.log(r.predict_s(factors)) for r in self.runs])
        self.evaluations += len(self.runs)
        if len(self._memo) < 4096:
            self._memo[key] = out
        return out


def sensitivities(runs: Sequence[FitRun], names: Sequence[str], values: Mapping[str, float],
                  rel_step: float = 0.02) -> np.ndarray:
    """Matrix ``∂ log t_i / ∂ log f_j`` (runs × factors) by central differences in log f."""
    ev = _Evaluator(runs, values)
    x0 = np.log([values[n] for n in names])
    out = np.zeros((len(runs), len(names)))
    for j in range(len(names)):
        hi, lo = x0.copy(), x0.copy()
        hi[j] += rel_step
        lo[j] -= rel_step
        bounds = [FACTOR_BOUNDS[n] for n in names]
        hi, lo = (np.clip(np.exp(v), [b[0] for b in bounds], [b[1] for b in bounds]) for v in (hi, lo))
        span = math.log(hi[j]) - math.log(lo[j])
        if span <= 0:
            continue
        out[:, j] = (ev.log_times(names, hi) - ev.log_times(names, lo)) / span
    return out


def fit_factor_set(runs: Sequence[FitRun], names: Sequence[str], center: Mapping[str, float],
                   settings: FitSettings, prior_sigma_log: float, base: Mapping[str, float] | None = None,
                   start: Mapping[str, float] | None = None) -> FactorFit:
    """Fit ``names`` on ``runs``: robust bounded least squares on log step time with a prior at ``center``.

    ``base`` holds factor values applied but not fitted (e.g. the system fit under a release
    refinement); ``start`` is the initial point (default: ``center``).
    """
    from scipy.optimize import least_squares

    base = dict(base or {})
    point = {**base, **{n: center[n] for n in names}}
    if not runs:
        return FactorFit({}, {}, 0, tuple(names))
    sens = sensitivities(runs, names, point)
    keep = [n for j, n in enumerate(names) if np.max(np.abs(sens[:, j])) >= settings.min_sensitivity]
    dropped = tuple(n for n in names if n not in keep)
    if not keep:
        return FactorFit({}, {}, len(runs), dropped)
    ev = _Evaluator(runs, {**base, **{n: center[n] for n in dropped}})
    measured = np.log([r.measured_step_time_s for r in runs])
    x_center = np.log([center[n] for n in keep])
    lower = np.log([FACTOR_BOUNDS[n][0] for n in keep])
    upper = np.log([FACTOR_BOUNDS[n][1] for n in keep])
    x_center = np.clip(x_center, lower + 1e-9, upper - 1e-9)
    x_start = np.log([(start or center).get(n, center[n]) for n in keep])
    x_start = np.clip(x_start, lower + 1e-9, upper - 1e-9)
    prior_weight = settings.f_scale / prior_sigma_log

    def residuals(x: np.ndarray) -> np.ndarray:
        data = ev.log_times(keep, np.exp(x)) - measured
        return np.concatenate([data, prior_weight * (x - x_center)])

    res = least_squares(residuals, x_start, bounds=(lower, upper), loss=settings.loss,
                        f_scale=settings.f_scale, diff_step=1e-3, max_nfev=settings.max_nfev, x_scale=1.0)
    data_res = res.fun[: len(runs)]
    scale = _robust_scale(data_res)
    jac = _data_jacobian(ev, keep, res.x, lower, upper)
    weights = _loss_weights(data_res, settings)
    rows = np.vstack([jac * np.sqrt(weights)[:, None], prior_weight * np.eye(len(keep))])
    sigma_x = _sigma_from_jacobian(rows, scale)
    values = {n: float(math.exp(x)) for n, x in zip(keep, res.x, strict=True)}
    sigma = {n: float(values[n] * s) for n, s in zip(keep, sigma_x, strict=True)}
    return FactorFit(values, sigma, len(runs), dropped, scale)


def _data_jacobian(ev: _Evaluator, names: Sequence[str], x: np.ndarray, lower: np.ndarray,
                   upper: np.ndarray, step: float = 1e-3) -> np.ndarray:
    """∂ log t / ∂ log f at ``x`` by one-sided differences pointing away from the nearer bound."""
    base = ev.log_times(names, np.exp(x))
    jac = np.zeros((base.size, len(names)))
    for j in range(len(names)):
        h = -step if x[j] + step > upper[j] else step
        moved = x.copy()
        moved[j] = max(min(x[j] + h, upper[j]), lower[j])
        if moved[j] != x[j]:
            jac[:, j] = (ev.log_times(names, np.exp(moved)) - base) / (moved[j] - x[j])
    return jac


def _loss_weights(residuals: np.ndarray, settings: FitSettings) -> np.ndarray:
    """IRLS weights ρ'((r/s)²) of the robust loss at the solution (1 for plain least squares)."""
    z = (residuals / settings.f_scale) ** 2
    if settings.loss == "soft_l1":
        return 1.0 / np.sqrt(1.0 + z)
    if settings.loss == "huber":
        return np.where(z <= 1.0, 1.0, 1.0 / np.sqrt(np.maximum(z, 1.0)))
    return np.ones_like(z)


def _robust_scale(residuals: np.ndarray) -> float:
    """1.4826 × median absolute residual (a robust standard deviation), floored at 0.5 %."""
    if residuals.size == 0:
        return 0.0
    return max(1.4826 * float(np.median(np.abs(residuals))), 0.005)


def _sigma_from_jacobian(jac: np.ndarray, noise: float) -> np.ndarray:
    """1-σ of the parameters: sqrt(diag(noise² (JᵀJ)⁻¹)) (pseudo-inverse if singular)."""
    jtj = jac.T @ jac
    cov = np.linalg.pinv(jtj) * noise ** 2
    return np.sqrt(np.clip(np.diag(cov), 0.0, None))


def fit_system(runs: Sequence[FitRun], defaults: Mapping[str, float], settings: FitSettings,
               start: SystemFit | None = None) -> SystemFit:
    """System-level fit of ``settings.factors``, then per-release refinement where there are enough runs."""
    system = runs[0].system if runs else ""
    center = {n: defaults[n] for n in set(settings.factors) | set(settings.release_factors)}
    fit = fit_factor_set(runs, settings.factors, center, settings, settings.prior_sigma_log,
                         start=start.fit.values if start else None)
    releases: dict[str, FactorFit] = {}
    by_release: dict[str, list[FitRun]] = defaultdict(list)
    for r in runs:
        by_release[r.release].append(r)
    release_names = [n for n in settings.release_factors if n in fit.values]
    for release, members in sorted(by_release.items()):
        if len(members) < settings.min_release_runs or not release_names:
            continue
        rel_center = {n: fit.values[n] for n in release_names}
        rel_start = start.releases[release].values if start and release in start.releases else None
        rel = fit_factor_set(members, release_names, rel_center, settings, settings.release_prior_sigma_log,
                             base=fit.values, start=rel_start)
        if rel.values:
            releases[release] = rel
    return SystemFit(system, fit, releases)


def configuration_folds(runs: Sequence[FitRun], folds: int, seed: int = 0) -> list[int]:
    """Fold index of each run: whole configurations go to one fold (deterministic shuffle)."""
    configs = sorted({r.config for r in runs})
    order = np.random.default_rng(seed).permutation(len(configs))
    fold_of = {configs[i]: k % folds for k, i in enumerate(order)}
    return [fold_of[r.config] for r in runs]


@dataclass(frozen=True)
class CalibrationResult:
    """Fits per system and the step-time predictions: datasheet, training and held-out."""

    settings: FitSettings
    systems: dict[str, SystemFit]
    default_predictions_s: dict[str, float]
    train_predictions_s: dict[str, float]
    heldout_predictions_s: dict[str, float]


def calibrate_runs(runs: Sequence[FitRun], defaults_by_system: Mapping[str, Mapping[str, float]],
                   settings: FitSettings | None = None, cross_validate: bool = True,
                   progress: Callable[[str], None] | None = None) -> CalibrationResult:
    """Fit every system, and (optionally) predict each run from factors fitted without its configuration."""
    settings = settings or FitSettings()
    by_system: dict[str, list[FitRun]] = defaultdict(list)
    for r in runs:
        by_system[r.system].append(r)
    fits: dict[str, SystemFit] = {}
    default_pred: dict[str, float] = {}
    train_pred: dict[str, float] = {}
    heldout: dict[str, float] = {}
    for system, members in sorted(by_system.items()):
        defaults = defaults_by_system[system]
        for r in members:
            default_pred[r.run_id] = r.predict_s({})
        if progress:
            progress(f"fitting {system} on {len(members)} runs")
        fit = fit_system(members, defaults, settings)
        fits[system] = fit
        for r in members:
            train_pred[r.run_id] = r.predict_s(fit.factors_for(r.release))
        if not cross_validate:
            continue
        n_configs = len({r.config for r in members})
        folds = min(settings.folds, n_configs)
        if folds < 2:
            continue
        fold_of = configuration_folds(members, folds, settings.seed)
        for k in range(folds):
            if progress:
                progress(f"  {system}: held-out fold {k + 1}/{folds}")
            train = [r for r, f in zip(members, fold_of, strict=True) if f != k]
            test = [r for r, f in zip(members, fold_of, strict=True) if f == k]
            fold_fit = fit_system(train, defaults, settings, start=fit)
            for r in test:
                heldout[r.run_id] = r.predict_s(fold_fit.factors_for(r.release))
    return CalibrationResult(settings, fits, default_pred, train_pred, heldout)
