"""The fitting machinery on synthetic runs whose true factors are known."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest

from costmodel.calibrate.fit import (
    FACTOR_BOUNDS,
    FitRun,
    FitSettings,
    calibrate_runs,
    configuration_folds,
    default_factor_values,
    fit_factors,
    release_family,
)
from costmodel.calibrate.fit_surrogate import linearize

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


def fit_one(runs: list[FitRun], settings: FitSettings = SETTINGS):  # noqa: ANN201
    return fit_factors(runs, {"sys": DEFAULTS}, settings)[0].systems["sys"]


def test_fit_recovers_true_factors_within_their_uncertainty():
    fit = fit_one(make_runs(noise=0.02))
    for name, true in TRUE.items():
        assert abs(fit.values[name] - true) <= 3 * fit.sigma[name] + 0.01 * true, name
        assert 0 < fit.sigma[name] < 0.2 * true
    # gemm_bf16 does not change any synthetic step time: not identifiable, so not fitted
    assert fit.not_identifiable == ("gemm_bf16",)
    assert "gemm_bf16" not in fit.values
    assert fit.residual_scale_log == pytest.approx(0.02, rel=0.5)


def test_soft_l1_resists_outliers_better_than_plain_least_squares():
    runs = make_runs(noise=0.005, outliers=(1, 4, 7))
    robust = fit_one(runs)
    plain = fit_one(runs, FitSettings(factors=SETTINGS.factors, loss="linear", release_factors=()))
    err = {name: [abs(f.values[n] / TRUE[n] - 1) for n in TRUE] for name, f in (("robust", robust), ("plain", plain))}
    assert max(err["robust"]) < 0.05
    assert sum(err["robust"]) < 0.5 * sum(err["plain"])


def test_bounds_hold_and_a_factor_on_its_bound_still_has_an_uncertainty():
    fit = fit_one(make_runs(noise=0.0, true={**TRUE, "attention": 0.05}))  # below the 0.1 lower bound
    assert fit.values["attention"] == pytest.approx(FACTOR_BOUNDS["attention"][0], rel=1e-6)
    assert fit.sigma["attention"] > 0  # one-sided Jacobian at the bound


def test_a_factor_left_on_its_bound_is_reported_as_a_defect():
    """Runs made with attention at 0.05 (below its 0.1 floor): the fit ends on the bound and
    ``calibrate`` says so; values inside the range (the other fitted ones) raise nothing."""
    from cli.cmd_validate import bound_warnings
    from costmodel.calibrate.priors import bound_hit
    from costmodel.calibrate.profile import CalibrationProfile, SystemCalibration

    fit = fit_one(make_runs(noise=0.0, true={**TRUE, "attention": 0.05}))
    assert bound_hit("attention", fit.values["attention"]) == "lower"
    assert bound_hit("gemm_fp8", fit.values["gemm_fp8"]) is None
    assert bound_hit("attention", 1.0) == "upper" and bound_hit("attention", 0.998) is None
    assert bound_hit("alltoall_bandwidth", 0.9999) == "upper"  # as the profile rounds it (4 digits)
    profile = CalibrationProfile(name="p", systems={"sys": SystemCalibration(factors=fit.values, n_runs=30)})
    (warning,) = bound_warnings(profile)
    assert warning.startswith("sys: attention = 0.1 is on its lower bound (0.1)")


def test_surrogate_is_exact_for_a_serial_roofline():
    def step_s(f):  # noqa: ANN001, ANN202
        g = {**DEFAULTS, **f}
        return 3.0 * 0.6 / g["gemm_fp8"] + 0.5 * 0.45 / g["attention"] + 0.25

    lin = linearize(step_s, DEFAULTS, ["gemm_fp8", "attention"], FACTOR_BOUNDS)
    other = {"gemm_fp8": 0.3, "attention": 0.9}
    assert lin.time_s(other) == pytest.approx(step_s(other), rel=1e-9)
    assert lin.time_s({}) == pytest.approx(step_s({}), rel=1e-12)


def test_relinearisation_reaches_the_engine_optimum_with_overlap():
    """Compute and communication overlap (a max): the surrogate alone is wrong far from f0."""
    rng = np.random.default_rng(7)
    truth = {"gemm_fp8": 0.4, "network_bandwidth": 0.6}
    runs = []
    for i in range(16):
        a, b = rng.uniform(1, 3), rng.uniform(0.5, 3)

        def predict_s(f, a=a, b=b):  # noqa: ANN001, ANN202
            g = {**DEFAULTS, **f}
            return max(a * 0.6 / g["gemm_fp8"], b * 0.97 / g["network_bandwidth"]) + 0.1 * a

        runs.append(FitRun(f"r{i}", "sys", "", f"c{i}", predict_s(truth), predict_s))
    settings = FitSettings(factors=("gemm_fp8", "network_bandwidth"), release_factors=(), prior_sigma_log=5.0)
    fits, _, _, _, calls = fit_factors(runs, {"sys": DEFAULTS}, settings)
    for name, true in truth.items():
        assert fits.systems["sys"].values[name] == pytest.approx(true, rel=0.01), name
    assert calls < 16 * 3 * 4  # a few linearisations of 2 factors, not a finite-difference fit


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


def test_release_multipliers_are_pooled_over_systems():
    """Two systems with different GEMM efficiency; release r1 is 1.1/0.9 faster than r0 on both."""
    runs = []
    for system, gemm in (("sysA", 0.45), ("sysB", 0.60)):
        for r in make_runs(n=20, noise=0.01, seed=len(system) + int(gemm * 10),
                           true={**TRUE, "gemm_fp8": gemm}, release_scale={"r0": 0.9, "r1": 1.1}):
            runs.append(FitRun(f"{system}-{r.run_id}", system, r.release, r.config, r.measured_step_time_s,
                               r.predict_s))
    settings = FitSettings(factors=("gemm_fp8", "attention", "network_bandwidth"), release_factors=("gemm_fp8",),
                           min_release_runs=10, release_prior_sigma_log=0.2)
    fits = calibrate_runs(runs, {"sysA": DEFAULTS, "sysB": DEFAULTS}, settings, cross_validate=False).fits
    mult = fits.release_multipliers
    assert mult["r1"].values["gemm_fp8"] / mult["r0"].values["gemm_fp8"] == pytest.approx(1.1 / 0.9, rel=0.03)
    for system, gemm in (("sysA", 0.45), ("sysB", 0.60)):
        assert fits.factors_for(system, "r0")["gemm_fp8"] == pytest.approx(0.9 * gemm, rel=0.04)
        assert fits.factors_for(system, "r1")["gemm_fp8"] == pytest.approx(1.1 * gemm, rel=0.04)
        # an unknown release gets the system's own values
        assert fits.factors_for(system, "r9") == fits.systems[system].values
    entries = fits.release_entries("sysA", ["r0", "r1"])
    assert entries["r1"].values["gemm_fp8"] == fits.factors_for("sysA", "r1")["gemm_fp8"]


def test_release_family_groups_patch_releases():
    assert release_family("26.04.01") == release_family("26.04") == "26.04"
    assert release_family("") == ""


def test_settings_reject_unfittable_factor_names():
    with pytest.raises(ValueError, match="cannot be fitted"):
        FitSettings(factors=("gemm_fp9",))


def test_leave_one_configuration_out_predicts_each_configuration_from_the_others():
    runs = make_runs(n=30, noise=0.03, seed=3)
    settings = FitSettings(factors=SETTINGS.factors, release_factors=(), folds=0)
    result = calibrate_runs(runs, {"sys": DEFAULTS}, settings)
    assert set(result.heldout_predictions_s) == {r.run_id for r in runs}
    # a configuration's own measurement never enters its prediction: corrupting it changes nothing
    bad = [r if r.config != "cfg0" else FitRun(r.run_id, r.system, r.release, r.config, 3 * r.measured_step_time_s,
                                                r.predict_s) for r in runs]
    again = calibrate_runs(bad, {"sys": DEFAULTS}, settings)
    for r in runs:
        if r.config == "cfg0":
            assert again.heldout_predictions_s[r.run_id] == pytest.approx(result.heldout_predictions_s[r.run_id], rel=0.05)


def test_leave_one_model_out_holds_out_every_run_of_a_model_together():
    runs = [FitRun(r.run_id, r.system, r.release, r.config, r.measured_step_time_s, r.predict_s, f"m{i % 3}")
            for i, r in enumerate(make_runs(n=30, noise=0.03, seed=3))]
    settings = FitSettings(factors=SETTINGS.factors, release_factors=(), holdout="model")
    assert "leave one model out" in settings.heldout_scheme
    result = calibrate_runs(runs, {"sys": DEFAULTS}, settings)
    assert set(result.heldout_predictions_s) == {r.run_id for r in runs}
    # corrupting every run of model m0 leaves m0's held-out predictions (nearly) unchanged
    bad = [FitRun(r.run_id, r.system, r.release, r.config, (3 if r.model == "m0" else 1) * r.measured_step_time_s,
                  r.predict_s, r.model) for r in runs]
    again = calibrate_runs(bad, {"sys": DEFAULTS}, settings)
    for r in runs:
        if r.model == "m0":
            assert again.heldout_predictions_s[r.run_id] == pytest.approx(result.heldout_predictions_s[r.run_id], rel=0.05)
    with pytest.raises(ValueError, match="holdout 'system' unknown"):
        FitSettings(holdout="system")


def test_runs_with_untrusted_settings_are_scored_but_not_fitted():
    """A run marked not trainable (reconstructed recipe settings) cannot pull the factors, yet is predicted."""
    import dataclasses

    from costmodel.calibrate.fit import calibrate_runs

    runs = make_runs(n=20, noise=0.0)
    wild = [dataclasses.replace(r, measured_step_time_s=r.measured_step_time_s * 3.0, trainable=False) if i < 4 else r
            for i, r in enumerate(runs)]
    settings = FitSettings(factors=("gemm_fp8", "attention", "network_bandwidth"), release_factors=(), folds=0)
    clean = calibrate_runs(runs[4:], {"sys": DEFAULTS}, settings, cross_validate=False)  # as if the 4 were absent
    marked = calibrate_runs(wild, {"sys": DEFAULTS}, settings)
    for name in TRUE:
        assert marked.fits.systems["sys"].values[name] == pytest.approx(clean.fits.systems["sys"].values[name], rel=1e-6)
    assert set(marked.heldout_predictions_s) == {r.run_id for r in runs}  # still predicted and scored


def test_shrinkage_is_the_hand_computed_posterior_over_prior_sigma():
    """One run, one factor: t(x) = t0 - c + c·f0·e^-x, so d log t / dx = -c/t0 at f0, and with the
    data row over f_scale and the prior row 1/σp, σ_post/σp = 1 / sqrt(1 + (c/t0 · σp / f_scale)²)."""
    from costmodel.calibrate.fit_surrogate import Linearization, Param, SurrogateProblem

    def ratio(c_s: float) -> float:
        lin = Linearization(2.0, ("gemm_fp8",), (0.5,), (c_s,))
        param = Param("system", "sys", "gemm_fp8", np.log(0.5), 0.5, np.log(0.2), np.log(1.0))
        problem = SurrogateProblem([lin], ["sys"], [""], [2.0], [param], FACTOR_BOUNDS)
        return float(problem.shrinkage(np.array([np.log(0.5)]), "linear", 0.03)[0])

    assert ratio(1.0) == pytest.approx(1 / np.sqrt(1 + (0.5 * 0.5 / 0.03) ** 2), rel=1e-3)  # 0.119: identified
    assert ratio(0.1) == pytest.approx(1 / np.sqrt(1 + (0.05 * 0.5 / 0.03) ** 2), rel=1e-3)  # 0.768: not
    assert ratio(0.1) > FitSettings().max_shrinkage > ratio(1.0)


def test_a_factor_the_runs_barely_inform_is_fixed_at_its_prior():
    """The network term is 5 % of one run's time and absent elsewhere: sensitive enough to be a
    candidate (min_sensitivity 2 %), but its posterior σ is 1/sqrt(1 + (0.05·0.5/0.03)²) ≈ 0.77 of
    the prior's (> 1/√2), so it is not fitted and stays at the datasheet value."""
    runs = make_runs(n=20, noise=0.01)
    weak = []
    for i, r in enumerate(runs):
        def predict_s(f: Mapping[str, float], r=r, i=i) -> float:  # noqa: ANN001
            g = {**DEFAULTS, **f}
            base = r.predict_s({**f, "network_bandwidth": DEFAULTS["network_bandwidth"]})
            return base + (0.05 * base * DEFAULTS["network_bandwidth"] / g["network_bandwidth"] if i == 0 else 0.0)
        weak.append(FitRun(r.run_id, r.system, r.release, r.config, predict_s({}), predict_s))
    fit = fit_one(weak, FitSettings(factors=("gemm_fp8", "attention", "network_bandwidth"), release_factors=()))
    assert "network_bandwidth" in fit.not_identifiable
    assert set(fit.values) == {"gemm_fp8", "attention"}


def test_host_factors_are_one_parameter_per_host_cpu():
    """Two systems on the same host CPU share layer_host_s (one parameter, fitted from both systems'
    runs); their GEMM factors stay their own. Step time = GEMM work / gemm_fp8 + host passes × layer_host_s."""
    rng = np.random.default_rng(1)
    true = {"a": 0.4, "b": 0.6}
    host_s = 2.0e-3
    defaults = default_factor_values(["gemm_fp8", "layer_host_s"])
    runs = []
    for i in range(24):
        system = "a" if i % 2 else "b"
        g, n = rng.uniform(1, 5), rng.uniform(200, 2000)

        def predict_s(f: Mapping[str, float], g=g, n=n) -> float:  # noqa: ANN001
            v = {**defaults, **f}
            return g * 0.5 / v["gemm_fp8"] + n * v["layer_host_s"]

        measured = predict_s({"gemm_fp8": true[system], "layer_host_s": host_s})
        runs.append(FitRun(f"r{i}", system, "", f"c{i}", measured, predict_s, host="cpu"))
    settings = FitSettings(factors=("gemm_fp8", "layer_host_s"), release_factors=())
    fits, _, params, _, _ = fit_factors(runs, {"a": defaults, "b": defaults}, settings)
    assert sum(p.factor == "layer_host_s" for p in params) == 1
    assert fits.systems["a"].values["layer_host_s"] == fits.systems["b"].values["layer_host_s"]
    assert fits.systems["a"].values["layer_host_s"] == pytest.approx(host_s, rel=0.02)
    for system, value in true.items():
        assert fits.systems[system].values["gemm_fp8"] == pytest.approx(value, rel=0.02)


def test_host_prior_width_applies_where_the_host_cpu_was_measured():
    from costmodel.calibrate.fit import HOST_PRIOR_CENTERS, PRIOR_SIGMA_LOG, prior_sigma_log

    narrow = FitSettings(factors=("layer_host_s",), release_factors=(), host_prior_sigma_log=0.35)
    assert "grace" in HOST_PRIOR_CENTERS
    assert prior_sigma_log("layer_host_s", "grace", narrow) == 0.35
    assert prior_sigma_log("layer_host_s", "", narrow) == PRIOR_SIGMA_LOG["layer_host_s"]  # no measurement
    assert prior_sigma_log("layer_host_s", "grace", FitSettings()) == PRIOR_SIGMA_LOG["layer_host_s"]
    assert prior_sigma_log("gemm_fp8", "grace", narrow) == narrow.prior_sigma_log
    assert default_factor_values(["layer_host_s"], host_cpu="grace") == {"layer_host_s": HOST_PRIOR_CENTERS["grace"]["layer_host_s"]}
