"""The discrete-event step engine (SimPy): ``run_des(scenario) -> StepReport``."""

from costmodel.des.engine import run_des

__all__ = ["run_des"]
