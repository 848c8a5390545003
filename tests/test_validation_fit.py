"""The fitting machinery on synthetic runs whose true factors are known."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest

from costmodel.fit import (
    FitRun,
    FitSettings,
    calibrate_runs,
    configuration_folds,
    default_factor_values,
    fit_factor_set,
    sensitivities,
)

DEFAULTS = default_factor_values(["gemm_fp8", "attention", "network_bandwidth", "gemm_bf16", "grouped_gemm"])
TRUE = {"gemm_fp8": 0.48, "attention": 0.33, "network_bandwidth": 0.85}


def make_runs(n: int = 30, noise: float = 0.02, seed: int = 0, true: Mapping[str, float] = TRUE,
              release_scale: Mapping[str, float] | None = None, outliers: tuple[int, ...] = ()) -> list[FitRun]:
    """Step time = GEMM + attention + exposed network work, each ∝ 1/factor (a roofline in miniature)."""
    rng = np.random.default_rng(seed)
    runs = []
    for i in range(n):
        a, b, c = rng.uniform(1, 5), rng.uniform(0.2, 1.0), rng.uniform(0.0, 1.0)
        release = f"r{i % 2}"

        def predict_s(f: Mapping[str, float], a=a, b=b, c=c) -> float:  # noqa: ANN001
            g = {**DEFAULTS, **f}
            return a * 0.6 / g["gemm_fp8"] + b * 0.45 / g["attention"] + c * 0.97 / g["network_bandwidth"]

        truth = dict(true)
        if release_scale:
            truth["gemm_fp8"] = true["gemm_fp8"] * release_scale[release]
        measured = predict_s(truth) * float(np.exp(rng.normal(0.0, noise)))
        if i in outliers:
            measured *= 1.6
        runs.append(FitRun(f"run{i}", "sys", release, f"cfg{i // 2}", measured, predict_s))
    return runs


SETTINGS = FitSettings(factors=("gemm_fp8", "attention", "network_bandwidth", "gemm_bf16"),
                       release_factors=(), folds=5)


def test_fit_recovers_true_factors_within_their_uncertainty():
    runs = make_runs(noise=0.02)
    fit = fit_factor_set(runs, SETTINGS.factors, DEFAULTS, SETTINGS, SETTINGS.prior_sigma_log)
    for name, true in TRUE.items():
        assert abs(fit.values[name] - true) <= 3 * fit.sigma[name] + 0.01 * true, name
        assert 0 < fit.sigma[name] < 0.2 * true
    # gemm_bf16 does not change any synthetic step time: not identifiable, so not fitted
    assert fit.not_identifiable == ("gemm_bf16",)
    assert "gemm_bf16" not in fit.values
    assert fit.residual_scale_log == pytest.approx(0.02, rel=0.5)


def test_soft_l1_resists_outliers_better_than_plain_least_squares():
    runs = make_runs(noise=0.005, outliers=(1, 4, 7))
    robust = fit_factor_set(runs, SETTINGS.factors, DEFAULTS, SETTINGS, 0.5)
    plain = fit_factor_set(runs, SETTINGS.factors, DEFAULTS, FitSettings(factors=SETTINGS.factors, loss="linear",
                                                                         release_factors=()), 0.5)
    err = {name: [abs(f.values[n] / TRUE[n] - 1) for n in TRUE] for name, f in (("robust", robust), ("plain", plain))}
    assert max(err["robust"]) < 0.05
    assert sum(err["robust"]) < 0.5 * sum(err["plain"])


def test_bounds_hold_and_prior_keeps_weak_factors_near_datasheet():
    runs = make_runs(noise=0.0, true={**TRUE, "attention": 0.05})  # below the 0.1 lower bound
    fit = fit_factor_set(runs, SETTINGS.factors, DEFAULTS, SETTINGS, 0.5)
    assert fit.values["attention"] == pytest.approx(0.1, rel=1e-6)
    assert fit.sigma["attention"] > 0  # one-sided Jacobian at the bound
    # one run that barely depends on the network: its factor moves only a little from 0.97
    one = [r for r in make_runs(noise=0.0, true={**TRUE, "network_bandwidth": 0.5})][:3]
    sens = sensitivities(one, ["network_bandwidth"], DEFAULTS)
    assert np.all(sens <= 0) and np.all(sens > -1)


def test_configuration_folds_never_split_a_configuration():
    runs = make_runs(n=40)
    folds = configuration_folds(runs, 5, seed=0)
    by_config: dict[str, set[int]] = {}
    for r, k in zip(runs, folds, strict=True):
        by_config.setdefault(r.config, set()).add(k)
    assert all(len(ks) == 1 for ks in by_config.values())
    assert set(folds) == set(range(5))
    assert folds == configuration_folds(runs, 5, seed=0)


def test_calibrate_reports_heldout_predictions_for_every_run():
    runs = make_runs(n=30, noise=0.03, seed=3)
    result = calibrate_runs(runs, {"sys": DEFAULTS}, SETTINGS)
    ids = {r.run_id for r in runs}
    assert set(result.heldout_predictions_s) == set(result.train_predictions_s) == ids

    def mape(pred: Mapping[str, float]) -> float:
        return float(np.mean([abs(pred[r.run_id] / r.measured_step_time_s - 1) for r in runs]))

    assert mape(result.default_predictions_s) > 0.1  # datasheet factors are far from the truth
    assert mape(result.train_predictions_s) < 0.04
    assert mape(result.train_predictions_s) <= mape(result.heldout_predictions_s) < 0.05


def test_release_refinement_follows_a_release_that_really_differs():
    runs = make_runs(n=40, noise=0.01, release_scale={"r0": 0.9, "r1": 1.1})
    settings = FitSettings(factors=("gemm_fp8", "attention", "network_bandwidth"), release_factors=("gemm_fp8",),
                           min_release_runs=10, release_prior_sigma_log=0.2)
    fit = calibrate_runs(runs, {"sys": DEFAULTS}, settings, cross_validate=False).systems["sys"]
    r0, r1 = fit.releases["r0"].values["gemm_fp8"], fit.releases["r1"].values["gemm_fp8"]
    assert r0 == pytest.approx(0.9 * TRUE["gemm_fp8"], rel=0.05)
    assert r1 == pytest.approx(1.1 * TRUE["gemm_fp8"], rel=0.05)
    assert fit.factors_for("r1")["gemm_fp8"] == r1
    assert fit.factors_for("unknown")["gemm_fp8"] == fit.fit.values["gemm_fp8"]


def test_settings_reject_unfittable_factor_names():
    with pytest.raises(ValueError, match="cannot be fitted"):
        FitSettings(factors=("gemm_fp9",))
