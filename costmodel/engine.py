"""One entry point for both engines: ``predict(scenario, engine) -> StepReport``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from costmodel.errors import UnsupportedScenario
from costmodel.report import EngineName, StepReport

if TYPE_CHECKING:
    from costmodel.calibrate.profile import CalibrationProfile
    from workloads.scenario import Scenario


__all__ = ["UnsupportedScenario", "predict"]


def predict(scenario: Scenario, engine: EngineName = "analytic",
            calibration: CalibrationProfile | None = None, release: str | None = None) -> StepReport:
    """Predict one training step of ``scenario`` with the analytic or the discrete-event engine.

    ``release`` picks the calibration's factors for that software release (default: the profile's
    ``default_release``).
    """
    if calibration is not None:
        scenario = calibration.apply(scenario, release)
    if engine == "analytic":
        from costmodel.analytic import run_analytic

        report = run_analytic(scenario)
    elif engine == "des":
        from costmodel.des import run_des

        report = run_des(scenario)
    else:
        raise ValueError(f"unknown engine {engine!r}")
    if calibration is not None:
        report.calibration = calibration.label(scenario.system.name, release)
    return report
