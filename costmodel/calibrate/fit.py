"""Fitting the named efficiency factors to measured step times, with held-out error (leave one configuration out, or grouped k-fold).

The fit is a robust, bounded, regularised least-squares problem on **log step time**:

* parameters are ``log f`` for each fitted factor ``f`` (a field of ``EfficiencyFactors``), bounded
  by :data:`FACTOR_BOUNDS`;
* data residuals ``log t_pred(f) − log t_measured``, one per run, under a soft-L1 (or Huber) loss
  whose scale ``f_scale`` (default 0.03 ≈ 3 %) separates noise from outliers;
* a weak Gaussian prior pulls each factor towards its datasheet value (``prior_sigma_log`` = 0.5,
  i.e. a factor 1.65× off is 1 σ): it keeps factors the data barely constrain near their defaults
  instead of letting them wander along flat directions;
* factors whose step-time sensitivity ``max |∂ log t / ∂ log f|`` over the runs is below
  ``min_sensitivity`` are not fitted at all (they are not identifiable from these runs).

Factors are fitted per system: physical quantities of the hardware (and its host), shared by every
software release; a release's differences are the recipe settings its runs carry. Optionally
(``release_factors``, empty by default and in the built-in profile) releases can also be modelled as
**multipliers** of a few factors, one per release family (``26.04`` and its patch ``26.04.01`` are
one family), pooled over all systems and fitted where a family has at least ``min_release_runs``
runs, with a tight prior at 1 (``release_prior_sigma_log``); all are then fitted jointly.

The engine is expensive (milliseconds per run) and the fit needs many evaluations, so the
optimiser works on a surrogate (:mod:`costmodel.calibrate.fit_surrogate`): each run's step time linearised
at the current factors as an additive roofline (k + 1 engine calls per run). The surrogate is
fitted, the engine is evaluated at the solution (backtracking while the engine's robust cost does
not improve), re-linearised there and refitted, until engine and surrogate agree to
``outer_tolerance`` on every run: the result is a solution of the engine's problem, found with a
few dozen engine calls per run (about 36 on the shipped dataset) instead of thousands.

1-σ uncertainties come from the surrogate's Jacobian at the solution (``σ² (JᵀWJ)⁻¹`` with W the
robust loss's weights, the prior rows included, and σ the robust residual scale; taken one-sided
away from a bound, so a factor that ends on its bound still gets an uncertainty).

Held-out error: runs are grouped by **configuration** (everything but the release). By default
each configuration is left out in turn (``folds = 0``); with ``folds = k`` the configurations of
each system are dealt into k groups instead. Each held-out group is predicted, with the real
engine, from factors and multipliers fitted without any of its runs. The fold fits reuse the
final linearisation of the full fit (a property of the engine at those factors, not of any
measurement, so no held-out measurement enters a fold's objective). This is the error reported as
the headline; training error is reported beside it only for comparison.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from costmodel.calibrate.fit_surrogate import (
    HOST_FACTORS,
    Linearization,
    Param,
    SurrogateProblem,
    linearize,
)
from costmodel.calibrate.priors import (  # noqa: F401 - re-exported: the fit's public constants
    DEFAULT_FACTORS,
    DEFAULT_RELEASE_FACTORS,
    FACTOR_BOUNDS,
    HOST_PRIOR_CENTERS,
    MULTIPLIER_BOUNDS,
    PRIOR_CENTERS,
    PRIOR_SIGMA_LOG,
    default_factor_values,
)
from topologies.inputs import plural


@dataclass(frozen=True)
class FitRun:
    """One measured run as the fitter sees it: a step-time function of the factor overrides."""

    run_id: str
    system: str
    release: str
    config: str  # configuration key: runs sharing it are held out together
    measured_step_time_s: float
    predict_s: Callable[[Mapping[str, float]], float]
    model: str = ""  # model name: runs sharing it are held out together with holdout="model"
    trainable: bool = True  # False: predicted and scored, never fitted on (settings not trusted)
    host: str = ""  # host CPU (SystemSpec.host_cpu): its HOST_FACTORS are shared with the systems that have it

    def param_key(self, factor: str) -> str:
        """Who owns ``factor`` for this run: its host CPU for a host factor, else its system."""
        return (self.host or self.system) if factor in HOST_FACTORS else self.system


@dataclass(frozen=True)
class FitSettings:
    factors: tuple[str, ...] = DEFAULT_FACTORS
    release_factors: tuple[str, ...] = DEFAULT_RELEASE_FACTORS
    loss: str = "soft_l1"  # soft_l1, huber, linear
    f_scale: float = 0.03  # log-residual scale where the robust loss turns linear (≈ 3 %)
    prior_sigma_log: float = 0.5
    # prior width (1 sigma of log f) of a host factor centred on its host CPU's measured value
    # (HOST_PRIOR_CENTERS); None: PRIOR_SIGMA_LOG's (1.0). The built-in profile uses 0.35 = ln 1.42, the
    # spread of one Megatron CI case's host-bound time between recording environments (README)
    host_prior_sigma_log: float | None = None
    release_prior_sigma_log: float = 0.10
    min_release_runs: int = 3
    min_sensitivity: float = 0.02
    folds: int = 0  # 0 = leave one configuration out; k >= 2 = grouped k-fold by configuration
    holdout: str = "configuration"  # or "model": leave one model out (all its systems and releases)
    fit_reconstructed: bool = True  # False: runs whose recipe settings are a reconstruction are predicted only
    fit_excluded: bool = False  # True: fit on the runs a dataset declares excluded too (run.fit_exclusion)
    seed: int = 0
    outer_iterations: int = 4  # re-linearisations of the engine at the current solution
    outer_tolerance: float = 0.002  # stop when surrogate and engine agree to 0.2 % on every run
    # identifiability: a system factor is fitted only where the runs carry at least as much information
    # about it as its prior (posterior σ ≤ prior σ / √2, SurrogateProblem.shrinkage); the others are
    # fixed at their prior centre (the system's datasheet value) and listed as not identifiable
    max_shrinkage: float = 2 ** -0.5

    def __post_init__(self) -> None:
        for name in (*self.factors, *self.release_factors):
            if name not in FACTOR_BOUNDS:
                raise ValueError(f"factor '{name}' cannot be fitted; fittable: {', '.join(FACTOR_BOUNDS)}")
        if self.loss not in ("soft_l1", "huber", "linear"):
            raise ValueError(f"loss '{self.loss}' unknown; valid: soft_l1, huber, linear")
        if self.folds == 1 or self.folds < 0:
            raise ValueError("folds must be 0 (leave one configuration out) or at least 2")
        if self.holdout not in ("configuration", "model"):
            raise ValueError(f"holdout '{self.holdout}' unknown; valid: configuration, model")

    @property
    def heldout_scheme(self) -> str:
        """How runs are held out, in words."""
        if self.holdout == "model":
            return "leave one model out (all its systems and releases)"
        if self.folds == 0:
            return "leave one configuration out, per system"
        return f"grouped {self.folds}-fold by configuration, per system"


@dataclass(frozen=True)
class FactorFit:
    """Fitted values (natural units), their 1-σ, and what could not be fitted."""

    values: dict[str, float]
    sigma: dict[str, float]
    n_runs: int
    not_identifiable: tuple[str, ...] = ()
    residual_scale_log: float = 0.0


def prior_sigma_log(factor: str, host_cpu: str, settings: FitSettings) -> float:
    """Prior width (1 sigma of log f) of ``factor`` on a system whose host CPU is ``host_cpu``."""
    if settings.host_prior_sigma_log and factor in HOST_PRIOR_CENTERS.get(host_cpu, {}):
        return settings.host_prior_sigma_log
    return PRIOR_SIGMA_LOG.get(factor, settings.prior_sigma_log)


def release_family(release: str) -> str:
    """The release a patch release belongs to: '26.04.01' -> '26.04' (first two components)."""
    return ".".join(release.split(".")[:2]) if release else ""


def _clip_factor(name: str, value: float) -> float:
    lo, hi = FACTOR_BOUNDS[name]
    return min(max(value, lo), hi)


@dataclass(frozen=True)
class CalibrationFits:
    """Fitted factors per system and multipliers per release family."""

    systems: dict[str, FactorFit]
    release_multipliers: dict[str, FactorFit]
    defaults: dict[str, dict[str, float]] = field(default_factory=dict)

    def factors_for(self, system: str, release: str | None = None) -> dict[str, float]:
        """Fitted factors of ``system``, its fitted ones scaled by the release family's multipliers."""
        fit = self.systems.get(system)
        if fit is None:
            return {}
        out = dict(fit.values)
        mult = self.release_multipliers.get(release_family(release or ""))
        if mult is not None:
            for name, m in mult.values.items():
                if name in fit.values:  # multipliers act on the factors this system fits
                    out[name] = _clip_factor(name, fit.values[name] * m)
        return out

    def release_entries(self, system: str, releases: Sequence[str]) -> dict[str, FactorFit]:
        """Per-family factor values (absolute) for the families of ``releases`` that have multipliers."""
        out: dict[str, FactorFit] = {}
        for family in sorted({release_family(r) for r in releases}):
            mult = self.release_multipliers.get(family)
            if mult is None or system not in self.systems:
                continue
            values = self.factors_for(system, family)
            changed = {n: values[n] for n in mult.values if n in values}
            sigma = {n: values[n] * mult.sigma[n] / mult.values[n] for n in changed if n in mult.sigma}
            out[family] = FactorFit(changed, sigma, mult.n_runs)
        return out


def configuration_folds(runs: Sequence[FitRun], folds: int, seed: int = 0) -> list[int]:
    """Fold of each run: whole configurations go to one fold, spread evenly within each system."""
    by_system: dict[str, list[str]] = defaultdict(list)
    for r in runs:
        if r.config not in by_system[r.system]:
            by_system[r.system].append(r.config)
    rng = np.random.default_rng(seed)
    fold_of: dict[tuple[str, str], int] = {}
    offset = 0
    for system in sorted(by_system):
        configs = sorted(by_system[system])
        for k, i in enumerate(rng.permutation(len(configs))):
            fold_of[(system, configs[i])] = (k + offset) % folds
        offset += len(configs)  # keeps the folds balanced across systems
    return [fold_of[(r.system, r.config)] for r in runs]


@dataclass(frozen=True)
class CalibrationResult:
    """The fits and the step-time predictions: datasheet, training and held-out."""

    settings: FitSettings
    fits: CalibrationFits
    default_predictions_s: dict[str, float]
    train_predictions_s: dict[str, float]
    heldout_predictions_s: dict[str, float]
    engine_calls: int = 0


class _Counted:
    """Wraps the runs' predict functions to count engine calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, run: FitRun, factors: Mapping[str, float]) -> float:
        self.calls += 1
        return run.predict_s(factors)


def _candidate_params(runs: Sequence[FitRun], lins: Sequence[Linearization],
                      defaults_by_system: Mapping[str, Mapping[str, float]], settings: FitSettings,
                      unidentified: Mapping[str, frozenset[str]] | None = None
                      ) -> tuple[list[Param], dict[str, tuple[str, ...]]]:
    """Identifiable parameters: system factors and release multipliers with enough sensitivity (and,
    for system factors, not in ``unidentified``: the data did not shrink their prior enough)."""
    unidentified = unidentified or {}
    sens: dict[tuple[str, str], float] = defaultdict(float)  # (param key, factor)
    fam_sens: dict[tuple[str, str], float] = defaultdict(float)
    family_runs: dict[str, int] = defaultdict(int)
    for r, lin in zip(runs, lins, strict=True):
        family_runs[release_family(r.release)] += 1
        for name, c in zip(lin.names, lin.c_s, strict=True):
            share = abs(c) / lin.t0_s
            sens[(r.param_key(name), name)] = max(sens[(r.param_key(name), name)], share)
            fam_sens[(release_family(r.release), name)] = max(fam_sens[(release_family(r.release), name)], share)
    params: list[Param] = []
    dropped: dict[str, tuple[str, ...]] = {}
    owner = {r.system: r for r in runs}  # a run of each system: its param keys
    made: set[tuple[str, str]] = set()
    for system in sorted(owner):
        defaults = defaults_by_system[system]
        keys = {n: owner[system].param_key(n) for n in settings.factors}
        keep = [n for n in settings.factors if sens[(keys[n], n)] >= settings.min_sensitivity
                and n not in unidentified.get(keys[n], frozenset())]
        dropped[system] = tuple(n for n in settings.factors if n not in keep)
        for n in keep:
            if (keys[n], n) in made:  # a host factor another system with this CPU already owns
                continue
            made.add((keys[n], n))
            lo, hi = FACTOR_BOUNDS[n]
            center = min(max(defaults[n], lo * 1.0001), hi / 1.0001)
            params.append(Param("system", keys[n], n, math.log(center), prior_sigma_log(n, owner[system].host, settings),
                                math.log(lo), math.log(hi)))
    fitted = {(p.key, p.factor) for p in params}
    for family in sorted(family_runs):
        if not family or family_runs[family] < settings.min_release_runs:
            continue
        for n in settings.release_factors:
            in_family = any(release_family(r.release) == family and (r.param_key(n), n) in fitted for r in runs)
            if in_family and fam_sens[(family, n)] >= settings.min_sensitivity:
                params.append(Param("release", family, n, 0.0, settings.release_prior_sigma_log,
                                    math.log(MULTIPLIER_BOUNDS[0]), math.log(MULTIPLIER_BOUNDS[1])))
    return params, dropped


def _effective(run: FitRun, params: Sequence[Param], x: np.ndarray, names: Sequence[str],
               defaults: Mapping[str, float]) -> dict[str, float]:
    """The factor values run ``run`` sees at parameters ``x`` (system value × release multiplier);
    those of ``names`` it does not fit stay at ``defaults`` (datasheet or prior centre)."""
    family = release_family(run.release)
    logs = {n: math.log(defaults[n]) for n in names}
    fitted = set()
    for p, v in zip(params, x, strict=True):
        if p.kind == "system" and p.key == run.param_key(p.factor) and p.factor in logs:
            logs[p.factor] = float(v)
            fitted.add(p.factor)
    for p, v in zip(params, x, strict=True):
        if p.kind == "release" and p.key == family and p.factor in fitted:
            logs[p.factor] += float(v)
    return {n: _clip_factor(n, math.exp(v)) for n, v in logs.items()}


def _problem(runs: Sequence[FitRun], lins: Sequence[Linearization], params: Sequence[Param]) -> SurrogateProblem:
    return SurrogateProblem(lins, [r.system for r in runs], [release_family(r.release) for r in runs],
                            [r.measured_step_time_s for r in runs], params, FACTOR_BOUNDS,
                            [r.host or r.system for r in runs])


def _fits_from(runs: Sequence[FitRun], params: Sequence[Param], x: np.ndarray, problem: SurrogateProblem,
               settings: FitSettings, dropped: Mapping[str, tuple[str, ...]],
               defaults_by_system: Mapping[str, Mapping[str, float]]) -> CalibrationFits:
    sigma_x, scale = problem.sigma(x, settings.loss, settings.f_scale)
    n_sys: dict[str, int] = defaultdict(int)
    n_fam: dict[str, int] = defaultdict(int)
    owner = {r.system: r for r in runs}
    for r in runs:
        n_sys[r.system] += 1
        n_fam[release_family(r.release)] += 1
    systems: dict[str, FactorFit] = {}
    for system in sorted(n_sys):
        values, sig = {}, {}
        for p, v, sx in zip(params, x, sigma_x, strict=True):
            if p.kind == "system" and p.key == owner[system].param_key(p.factor):
                values[p.factor], sig[p.factor] = math.exp(v), math.exp(v) * sx
        for n in settings.factors:  # a factor off by default, not identified: at its prior centre (as fitted)
            if n in PRIOR_CENTERS and n not in values:
                values[n] = defaults_by_system[system][n]
                sig[n] = values[n] * prior_sigma_log(n, owner[system].host, settings)
        systems[system] = FactorFit(values, sig, n_sys[system], dropped.get(system, ()), scale)
    mult: dict[str, FactorFit] = {}
    for p, v, sx in zip(params, x, sigma_x, strict=True):
        if p.kind == "release":
            fit = mult.setdefault(p.key, FactorFit({}, {}, n_fam[p.key]))
            fit.values[p.factor], fit.sigma[p.factor] = math.exp(v), math.exp(v) * sx
    return CalibrationFits(systems, mult, {k: dict(v) for k, v in defaults_by_system.items()})


def fit_factors(runs: Sequence[FitRun], defaults_by_system: Mapping[str, Mapping[str, float]],
                settings: FitSettings, progress: Callable[[str], None] | None = None
                ) -> tuple[CalibrationFits, list[Linearization], list[Param], np.ndarray, int]:
    """Fit all systems and release multipliers jointly on ``runs``.

    Linearises the engine at the datasheet values, fits the surrogate, re-linearises at the
    solution and refits until the engine and the surrogate agree (``outer_tolerance``). Returns
    the fits, the final linearisations (reused by the held-out folds), the parameters, their
    values and the number of engine calls.
    """
    count = _Counted()
    unidentified: dict[str, frozenset[str]] = {}
    for _ in range(3):  # refit without the factors the runs do not identify, until none is left
        fits, lins, params, x, problem = _fit_once(runs, defaults_by_system, settings, progress, count, unidentified)
        weak = _unidentified(runs, lins, params, x, settings)
        if not weak:
            break
        for key, factor in weak:
            unidentified[key] = unidentified.get(key, frozenset()) | {factor}
        if progress:
            progress("  not identified (fixed at the prior): " + ", ".join(f"{k} {f}" for k, f in weak))
    return fits, lins, params, x, count.calls


def _unidentified(runs: Sequence[FitRun], lins: Sequence[Linearization], params: Sequence[Param], x: np.ndarray,
                  settings: FitSettings) -> list[tuple[str, str]]:
    """(key, factor) of the system parameters the runs do not identify (``FitSettings.max_shrinkage``):
    the least informed one of each key is set aside, one at a time, until every remaining parameter
    passes (on the surrogate at ``x``: no engine calls), so of two factors the runs see only together
    the better informed one is still fitted."""
    active = list(range(len(params)))
    out: list[tuple[str, str]] = []
    while True:
        problem = _problem(runs, lins, [params[j] for j in active])
        ratio = problem.shrinkage(x[active], settings.loss, settings.f_scale)
        worst: dict[str, tuple[float, int]] = {}
        for j, s in zip(active, ratio, strict=True):
            p = params[j]
            if p.kind == "system" and s > settings.max_shrinkage and s > worst.get(p.key, (0.0, -1))[0]:
                worst[p.key] = (float(s), j)
        if not worst:
            return out
        for _, j in worst.values():
            active.remove(j)
            out.append((params[j].key, params[j].factor))


def _fit_once(runs: Sequence[FitRun], defaults_by_system: Mapping[str, Mapping[str, float]], settings: FitSettings,
              progress: Callable[[str], None] | None, count: _Counted, unidentified: Mapping[str, frozenset[str]]
              ) -> tuple[CalibrationFits, list[Linearization], list[Param], np.ndarray, SurrogateProblem]:
    """One fit of :func:`fit_factors` with the ``unidentified`` system factors held at their prior."""
    names = {r.system: settings.factors for r in runs}
    lins = [linearize(partial(count, r), default_factor_values(names[r.system], defaults_by_system[r.system]),
                      names[r.system], FACTOR_BOUNDS) for r in runs]
    params, dropped = _candidate_params(runs, lins, defaults_by_system, settings, unidentified)
    fitted = {r.system: tuple(p.factor for p in params if p.kind == "system" and p.key == r.param_key(p.factor))
              for r in runs}
    x = np.array([p.center_log for p in params])
    problem = _problem(runs, lins, params)
    current = problem.objective(np.log([lin.t0_s for lin in lins]), x, settings.loss, settings.f_scale)
    for it in range(settings.outer_iterations):
        proposal = problem.solve(x, settings.loss, settings.f_scale)
        for _ in range(3):  # backtrack while the engine's objective does not improve
            surrogate = problem.log_times(proposal)
            points = [_effective(r, params, proposal, settings.factors, defaults_by_system[r.system]) for r in runs]
            t_true = [count(r, pt) for r, pt in zip(runs, points, strict=True)]
            value = problem.objective(np.log(t_true), proposal, settings.loss, settings.f_scale)
            if value <= current:
                break
            proposal = 0.5 * (x + proposal)
        gap = float(np.max(np.abs(np.log(t_true) - surrogate))) if runs else 0.0
        improved = value < current
        if progress:
            progress(f"  linearisation {it + 1}: engine vs surrogate within {100 * gap:.2f} %, "
                     f"robust cost {value:.4g}")
        if not improved:
            break  # the last accepted point (x, lins) stands
        x, current = proposal, value
        lins = [linearize(partial(count, r), pt, fitted[r.system], FACTOR_BOUNDS, t0_s=t)
                for r, pt, t in zip(runs, points, t_true, strict=True)]
        problem = _problem(runs, lins, params)
        if gap <= settings.outer_tolerance:
            break
    return _fits_from(runs, params, x, problem, settings, dropped, defaults_by_system), lins, params, x, problem


def calibrate_runs(runs: Sequence[FitRun], defaults_by_system: Mapping[str, Mapping[str, float]],
                   settings: FitSettings | None = None, cross_validate: bool = True,
                   progress: Callable[[str], None] | None = None) -> CalibrationResult:
    """Fit all runs, and (optionally) predict each run from factors fitted without its configuration.

    Held-out folds refit the surrogate built at the full fit's solution on the training runs
    only (a linearisation is a property of the engine, not of the measurements, so no measured
    value of a held-out run enters its fold's fit) and predict the held-out runs with the real
    engine at the fold's factors.
    """
    settings = settings or FitSettings()
    default_pred = {r.run_id: r.predict_s({}) for r in runs}
    fitted_runs = [r for r in runs if r.trainable]
    if progress:
        progress(f"fitting {plural(len(fitted_runs), 'run')} on {plural(len({r.system for r in runs}), 'system')} "
                 f"({len(runs) - len(fitted_runs)} more predicted only)")
    fits, lins_fit, params, x, calls = fit_factors(fitted_runs, defaults_by_system, settings, progress)
    lin_of = {r.run_id: lin for r, lin in zip(fitted_runs, lins_fit, strict=True)}
    train_pred = {r.run_id: r.predict_s(fits.factors_for(r.system, r.release)) for r in runs}
    heldout: dict[str, float] = {}
    if settings.holdout == "model":
        models = sorted({r.model for r in runs})
        folds, fold_of = len(models), [models.index(r.model) for r in runs]
    else:
        n_configs = len({(r.system, r.config) for r in runs})
        folds = n_configs if settings.folds == 0 else min(settings.folds, n_configs)
        fold_of = configuration_folds(runs, folds, settings.seed) if folds >= 2 else []
    if cross_validate and folds >= 2:
        for k in range(folds):
            train = [i for i, f in enumerate(fold_of) if f != k and runs[i].trainable]
            systems = {runs[i].param_key(n) for i in train for n in (*settings.factors, "")}
            families = {release_family(runs[i].release) for i in train}
            # parameters the training runs inform; the others stay at their prior centre
            keep = [j for j, p in enumerate(params) if p.key in (systems if p.kind == "system" else families)]
            problem = _problem([runs[i] for i in train], [lin_of[runs[i].run_id] for i in train],
                               [params[j] for j in keep])
            x_fold = np.array([p.center_log for p in params])
            x_fold[keep] = problem.solve(x[keep], settings.loss, settings.f_scale)
            for i, f in enumerate(fold_of):
                if f == k:
                    r = runs[i]
                    point = _effective(r, params, x_fold, settings.factors, defaults_by_system[r.system])
                    heldout[r.run_id] = r.predict_s(point)
            if progress and (folds <= 10 or k + 1 == folds):
                progress(f"held-out fold {k + 1}/{folds}: {plural(sum(1 for f in fold_of if f == k), 'run')}")
    return CalibrationResult(settings, fits, default_pred, train_pred, heldout, calls)
