"""Calibrating on measured runs: runs + engine -> fitted factors, held-out error, a profile.

Glue between :mod:`workloads.loaders` (measured runs), the analytic engine (predictions with the
factors applied through ``SystemSpec.with_efficiency``), :mod:`costmodel.calibrate.fit` (the fitting and the
held-out evaluation) and :mod:`costmodel.calibrate.profile` (the profile YAML). The headline numbers of a
calibration are the **held-out** metrics; datasheet (uncalibrated) and training metrics are kept
beside them for comparison.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from costmodel.calibrate.fit import (
    CalibrationResult,
    FitRun,
    FitSettings,
    calibrate_runs,
    default_factor_values,
)
from costmodel.calibrate.profile import CalibrationProfile, ReleaseCalibration, SystemCalibration
from costmodel.calibrate.validation import (
    Metrics,
    PreparedRun,
    RunResult,
    UnsupportedRun,
    error_metrics,
    metrics_by,
    prepare_runs,
    result_row,
    skipped_as_unsupported,
    step_time_function,
    with_factors,
)
from workloads.measured import MeasuredRun, SkippedRun
from workloads.recipe_settings import settings_reconstructed

CONFIG_FIELDS = ("model", "system", "num_gpus", "precision", "global_batch_size", "micro_batch_size", "seq_length",
                 "tp", "pp", "vpp", "cp", "ep", "etp", "fsdp", "mtp", "optimizer", "optimizer_distribution",
                 "muon_tp_mode", "muon_ns_steps", "recompute")


def configuration_key(run: MeasuredRun) -> str:
    """Everything that defines a configuration except the software release (and the measurement)."""
    data = run.model_dump(mode="json")
    key = "|".join(str(data[f]) for f in CONFIG_FIELDS)
    if run.scenario_settings:  # further settings (a dataset's runtime settings) tell configurations apart
        key += "|" + repr(sorted(run.scenario_settings.items()))
    return key


def fit_run(prepared: PreparedRun, step_time_s: Callable[[Any], float], fit_reconstructed: bool = True) -> FitRun:
    """The fitter's view of a prepared run: its step time as a function of factor overrides.

    With ``fit_reconstructed`` False, runs whose recipe settings are a reconstruction
    (:func:`workloads.recipe_settings.settings_reconstructed`) are predicted and scored but not fitted
    on. The default fits them: on the shipped runs leaving them out made held-out error worse (they
    are 18 of 131 runs, most of the 25.11 release; the H100 fit then rests on too few MoE runs)."""
    scenario = prepared.scenario

    def predict_s(factors: Mapping[str, float]) -> float:
        return step_time_s(with_factors(scenario, factors))

    run = prepared.run
    trainable = fit_reconstructed or not settings_reconstructed(run.recipe_settings)
    return FitRun(run.run_id, run.system, run.release, configuration_key(run), run.step_time_s, predict_s, run.model,
                  trainable)


@dataclass(frozen=True)
class CalibrationReport:
    """What ``muonsim calibrate`` prints and writes."""

    profile: CalibrationProfile
    result: CalibrationResult
    unsupported: list[UnsupportedRun]
    datasheet_rows: list[RunResult]
    train_rows: list[RunResult]
    heldout_rows: list[RunResult]

    @property
    def heldout(self) -> Metrics:
        """Error metrics of the held-out predictions over all systems."""
        return error_metrics(self.heldout_rows)

    def metrics_table(self) -> dict[str, dict[str, Metrics]]:
        """{scope ('overall' or a system): {'datasheet'|'train'|'heldout': Metrics}}."""
        out: dict[str, dict[str, Metrics]] = {"overall": {}}
        for kind, rows in (("datasheet", self.datasheet_rows), ("train", self.train_rows), ("heldout", self.heldout_rows)):
            if not rows:
                continue
            out["overall"][kind] = error_metrics(rows)
            for system, m in metrics_by(rows, lambda r: r.system).items():
                out.setdefault(system, {})[kind] = m
        return out

    def release_residuals(self) -> dict[str, Metrics]:
        """Held-out error metrics per release family (a diagnostic: what each release leaves unexplained)."""
        from costmodel.calibrate.fit import release_family

        rows = self.heldout_rows or self.train_rows
        return metrics_by(rows, lambda r: release_family(r.release))

    def to_json_dict(self) -> dict[str, Any]:
        """The ``--json`` form: profile, metrics table (NaN as null), held-out rows, unsupported runs."""
        table = {scope: {kind: _clean(m.to_json_dict()) for kind, m in kinds.items()}
                 for scope, kinds in self.metrics_table().items()}
        return {
            "profile": self.profile.model_dump(mode="json", exclude={"training_run_ids"}),
            "metrics": table,
            "heldout_rows": [r.to_json_dict() for r in self.heldout_rows],
            "release_residuals": {fam: _clean(m.to_json_dict()) for fam, m in self.release_residuals().items()},
            "unsupported": [u.to_json_dict() for u in self.unsupported],
        }


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and v != v else v) for k, v in d.items()}


def _summary(m: Metrics) -> dict[str, float]:
    out = {"n": float(m.n), "mape_pct": round(m.mape_pct, 3), "median_ape_pct": round(m.median_ape_pct, 3),
           "bias_pct": round(m.bias_pct, 3), "max_ape_pct": round(m.max_ape_pct, 3)}
    if m.kendall_tau is not None:
        out["kendall_tau"] = round(m.kendall_tau, 4)
    return out


def _rounded(values: Mapping[str, float], digits: int = 4) -> dict[str, float]:
    return {k: float(f"{v:.{digits}g}") for k, v in sorted(values.items())}


DEFAULT_RELEASE_MIN_RUNS = 10  # the default release must be well determined (its multipliers are applied by predict)


def _newest(families: Iterable[str]) -> str | None:
    """The newest release family ('26.06' > '26.04' > '25.11'), or None."""
    def key(family: str) -> tuple[int, ...]:
        return tuple(int(p) if p.isdigit() else -1 for p in family.split("."))

    return max(families, key=key, default=None)


def calibrate(runs: Iterable[MeasuredRun], settings: FitSettings | None = None, name: str = "custom",
              fitted_on: str = "", cross_validate: bool = True, engine: str = "analytic",
              progress: Callable[[str], None] | None = None, skipped: Iterable[SkippedRun] = ()) -> CalibrationReport:
    """Fit the factors on ``runs`` and build the profile (with held-out error when ``cross_validate``;
    ``skipped``: dataset rows that are not runs, listed as unsupported with their reason)."""
    settings = settings or FitSettings()
    step_time_s = step_time_function(engine)
    prepared, unsupported = prepare_runs(runs, engine)
    unsupported = skipped_as_unsupported(skipped) + unsupported
    fit_runs = [fit_run(p, step_time_s, settings.fit_reconstructed) for p in prepared]
    defaults = {p.scenario.system.name: default_factor_values(
        sorted(set(settings.factors) | set(settings.release_factors)), p.scenario.system.efficiency)
        for p in prepared}
    result = calibrate_runs(fit_runs, defaults, settings, cross_validate, progress)
    rows = {kind: [result_row(p, pred[p.run.run_id], kind == "train") for p in prepared if p.run.run_id in pred]
            for kind, pred in (("datasheet", result.default_predictions_s), ("train", result.train_predictions_s),
                               ("heldout", result.heldout_predictions_s))}
    profile = build_profile(result, prepared, rows["heldout"], name, fitted_on)
    return CalibrationReport(profile, result, unsupported, rows["datasheet"], rows["train"], rows["heldout"])


def build_profile(result: CalibrationResult, prepared: Sequence[PreparedRun], heldout_rows: Sequence[RunResult],
                  name: str, fitted_on: str) -> CalibrationProfile:
    """A CalibrationProfile from the fits, with each system's held-out metrics recorded."""
    heldout_by_system = metrics_by(heldout_rows, lambda r: r.system) if heldout_rows else {}
    fits = result.fits
    releases_of: dict[str, set[str]] = {}
    for p in prepared:
        releases_of.setdefault(p.run.system, set()).add(p.run.release)
    systems: dict[str, SystemCalibration] = {}
    for system, fit in fits.systems.items():
        releases = {fam: ReleaseCalibration(factors=_rounded(f.values), uncertainty=_rounded(f.sigma, 2),
                                            n_runs=f.n_runs)
                    for fam, f in fits.release_entries(system, sorted(releases_of.get(system, ()))).items()}
        cv = heldout_by_system.get(system)
        systems[system] = SystemCalibration(
            factors=_rounded(fit.values), uncertainty=_rounded(fit.sigma, 2), n_runs=fit.n_runs,
            cross_validation=_summary(cv) if cv else None, releases=releases)
    s = result.settings
    settings = {
        "factors": list(s.factors), "release_factors": list(s.release_factors), "loss": s.loss,
        "f_scale": s.f_scale, "prior_sigma_log": s.prior_sigma_log,
        "release_prior_sigma_log": s.release_prior_sigma_log, "min_release_runs": s.min_release_runs,
        "folds": s.folds, "seed": s.seed, "heldout": s.heldout_scheme,
        "fit_reconstructed": s.fit_reconstructed,
        "predicted_not_fitted": sorted(p.run.run_id for p in prepared if not s.fit_reconstructed
                                       and settings_reconstructed(p.run.recipe_settings)),
        "default_release": f"newest release family with at least {DEFAULT_RELEASE_MIN_RUNS} runs",
        "not_identifiable": {sys: list(f.not_identifiable) for sys, f in fits.systems.items()
                             if f.not_identifiable},
    }
    overall = error_metrics(heldout_rows) if heldout_rows else None
    return CalibrationProfile(
        name=name, fitted_on=fitted_on or f"{len(prepared)} runs", systems=systems,
        cross_validation=_summary(overall) if overall else None, fit_settings=settings,
        training_run_ids=sorted(p.run.run_id for p in prepared),
        release_multipliers={fam: _rounded(f.values) for fam, f in fits.release_multipliers.items()},
        default_release=_newest(f for f, m in fits.release_multipliers.items() if m.n_runs >= DEFAULT_RELEASE_MIN_RUNS),
    )
