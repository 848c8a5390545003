"""Calibration profiles: YAML round trip, release entries, default release, apply, one-line errors."""

from __future__ import annotations

import pytest

from costmodel.calibrate.profile import (
    CalibrationProfile,
    ReleaseCalibration,
    SystemCalibration,
    load_profile,
)
from topologies.inputs import UserInputError


def profile(**kw) -> CalibrationProfile:  # noqa: ANN003
    return CalibrationProfile(
        name="t", fitted_on="test",
        systems={"gb300-nvl72": SystemCalibration(
            factors={"gemm_fp8": 0.6, "attention": 0.5}, uncertainty={"gemm_fp8": 0.02}, n_runs=3,
            releases={"26.04": ReleaseCalibration(factors={"gemm_fp8": 0.55}), "26.06": ReleaseCalibration(
                factors={"gemm_fp8": 0.7})})},
        **kw)


def test_release_lookup_by_release_and_family():
    p = profile()
    assert p.factors_for("gb300-nvl72") == {"gemm_fp8": 0.6, "attention": 0.5}
    assert p.factors_for("gb300-nvl72", "26.04")["gemm_fp8"] == 0.55
    assert p.factors_for("gb300-nvl72", "26.04.01")["gemm_fp8"] == 0.55  # patch release -> family
    assert p.factors_for("gb300-nvl72", "25.09")["gemm_fp8"] == 0.6  # no entry: base factors
    assert p.factors_for("dgx-h100") == {}


def test_default_release_applies_when_no_release_is_given(default_scenario):
    p = profile(default_release="26.06")
    assert p.factors_for("gb300-nvl72")["gemm_fp8"] == 0.7
    assert p.factors_for("gb300-nvl72", "26.04")["gemm_fp8"] == 0.55
    applied = p.apply(default_scenario)
    assert applied.system.efficiency.gemm_fp8 == 0.7
    assert applied.system.efficiency.attention == 0.5
    assert applied.system.efficiency.grouped_gemm == default_scenario.system.efficiency.grouped_gemm
    assert "release 26.06" in p.label("gb300-nvl72")
    assert "datasheet defaults" in p.label("dgx-h100")


def test_yaml_round_trip_is_readable(tmp_path):
    p = profile(default_release="26.06", cross_validation={"mape_pct": 9.5}, training_run_ids=["a", "b"])
    text = p.to_yaml()
    assert "factors: {attention: 0.5, gemm_fp8: 0.6}" in text or "factors: {gemm_fp8: 0.6, attention: 0.5}" in text
    path = tmp_path / "p.yaml"
    path.write_text(text, encoding="utf-8")
    assert load_profile(path) == p


@pytest.mark.parametrize(("text", "fragment"), [
    ("systems: {gb300-nvl72: {factors: {gemm_fp9: 0.5}}}", "unknown factor 'gemm_fp9'"),
    ("systems: {gb300-nvl72: {factors: {gemm_fp8: 'fast'}}}", "gemm_fp8"),
    ("nme: x", "nme"),
    ("[1, 2]", "mapping"),
])
def test_bad_profiles_fail_with_one_line(tmp_path, text, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserInputError) as info:
        load_profile(path)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_out_of_range_factor_is_caught_when_applied(tmp_path, default_scenario):
    path = tmp_path / "p.yaml"
    path.write_text("name: big\nsystems: {gb300-nvl72: {factors: {gemm_fp8: 1.7}}}\n", encoding="utf-8")
    with pytest.raises(UserInputError, match="calibration 'big'.*gemm_fp8"):
        load_profile(path).apply(default_scenario)


def test_builtin_default_profile_records_its_training_set_and_heldout_error():
    from costmodel.calibrate.profile import default_profile
    from workloads.datasets import load_dataset

    p = default_profile()
    assert p is not None, "costmodel/data/default_calibration.yaml is missing"
    assert "megatron-bridge" in p.fitted_on
    assert set(p.systems) == {"gb300-nvl72", "gb200-nvl72", "dgx-b300", "dgx-b200", "dgx-h100"}
    for cal in p.systems.values():
        assert cal.factors and set(cal.uncertainty) == set(cal.factors)
        assert cal.cross_validation is not None and cal.cross_validation["n"] == cal.n_runs
    assert p.cross_validation is not None and p.cross_validation["n"] == len(p.training_run_ids)
    assert set(p.training_run_ids) <= {r.run_id for r in load_dataset("megatron-bridge")}
    # the built-in profile fits hardware, not releases: no release multipliers, no release entries
    assert p.default_release is None and not p.release_multipliers
    assert all(not cal.releases for cal in p.systems.values())
