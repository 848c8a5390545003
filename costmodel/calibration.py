"""Calibration profiles: fitted values of the named efficiency factors, per system.

A profile is a YAML file a user can read and edit::

    name: default
    fitted_on: megatron-bridge (78 runs)
    systems:
      gb300-nvl72:
        factors: {gemm_fp8: 0.58, attention: 0.41}
        uncertainty: {gemm_fp8: 0.03}
        release: "26.06"

Factor names are the fields of :class:`topologies.hardware.EfficiencyFactors`. Applying a profile
replaces those factors of the scenario's system; systems the profile does not mention keep their
datasheet defaults. ``muonsim calibrate`` writes profiles; a default one fitted on the shipped
dataset is built in (``costmodel/data/default_calibration.yaml``) once it exists.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from topologies.hardware import EfficiencyFactors
from topologies.inputs import UserInputError, describe_validation_error, load_yaml_file

if TYPE_CHECKING:
    from workloads.scenario import Scenario

DEFAULT_PROFILE_PATH = Path(__file__).parent / "data" / "default_calibration.yaml"
FACTOR_NAMES = tuple(EfficiencyFactors.model_fields)


class SystemCalibration(BaseModel):
    model_config = ConfigDict(extra="forbid")

    factors: dict[str, float] = Field(default_factory=dict)
    uncertainty: dict[str, float] = Field(default_factory=dict, description="1-sigma of each fitted factor")
    release: str | None = None
    n_runs: int | None = None

    @field_validator("factors", "uncertainty")
    @classmethod
    def _known(cls, value: dict[str, float]) -> dict[str, float]:
        for name in value:
            if name not in FACTOR_NAMES:
                raise ValueError(f"unknown factor '{name}'; valid: {', '.join(FACTOR_NAMES)}")
        return value


class CalibrationProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "custom"
    fitted_on: str = ""
    systems: dict[str, SystemCalibration] = Field(default_factory=dict)
    cross_validation: dict[str, float] | None = None

    def apply(self, scenario: Scenario) -> Scenario:
        """The scenario with this profile's factors for its system (unchanged if none)."""
        cal = self.systems.get(scenario.system.name)
        if cal is None or not cal.factors:
            return scenario
        try:
            system = scenario.system.with_efficiency(**cal.factors)
        except ValidationError as err:
            raise UserInputError(describe_validation_error(err, f"calibration '{self.name}'")) from None
        return dataclasses.replace(scenario, system=system)

    def label(self, system_name: str) -> str:
        """Short description for reports."""
        if system_name in self.systems and self.systems[system_name].factors:
            return f"{self.name} ({system_name}: {len(self.systems[system_name].factors)} fitted factors)"
        return f"{self.name} (no factors for {system_name}: datasheet defaults)"


def load_profile(path: str | Path) -> CalibrationProfile:
    """Read a calibration profile YAML file (one-line UserInputError on failure)."""
    data = load_yaml_file(path, "calibration profile")
    try:
        return CalibrationProfile.model_validate(data)
    except ValidationError as err:
        raise UserInputError(describe_validation_error(err, f"calibration profile '{path}'")) from None


def default_profile() -> CalibrationProfile | None:
    """The built-in profile fitted on the shipped dataset, if present."""
    if DEFAULT_PROFILE_PATH.is_file():
        return load_profile(DEFAULT_PROFILE_PATH)
    return None
