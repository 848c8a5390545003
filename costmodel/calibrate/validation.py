"""Validation of the cost model against measured runs: predictions, error metrics, ranking.

For every measured run the scenario is rebuilt from its columns; runs the model cannot express
(scenario validation errors, :class:`costmodel.errors.UnsupportedScenario`) are listed as
unsupported with their reason, never dropped silently. Errors are signed relative errors of the
step time, ``error_pct = 100 · (predicted − measured) / measured``:

* MAPE (mean |error|), median APE, signed bias (mean error), worst case (max |error|);
* Kendall τ-b of the ranking within each (model, system) group, on GPU-seconds per token
  (``step_time_s · num_gpus / tokens_per_step``: the order in which a planner would rank the
  configurations), combined over groups weighted by their number of pairs.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from topologies.inputs import UserInputError
from workloads.measured import MeasuredRun, SkippedRun
from workloads.scenario import Scenario, build_config

if TYPE_CHECKING:
    from costmodel.calibrate.profile import CalibrationProfile

# ------------------------------------------------------------------------------- scenarios
def scenario_for_run(run: MeasuredRun) -> Scenario:
    """The validated scenario a measured run describes (raises UserInputError if it is invalid)."""
    try:
        overrides = run.scenario_overrides()
    except ValueError as err:
        raise UserInputError(f"run '{run.run_id}': recipe settings: {err}") from None
    return build_config({}, overrides, source=f"run '{run.run_id}'").resolve()


@dataclass(frozen=True)
class PreparedRun:
    """A measured run with its resolved scenario (datasheet efficiency factors)."""

    run: MeasuredRun
    scenario: Scenario

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step of the measured run: global batch size x sequence length."""
        return self.run.global_batch_size * self.run.seq_length


@dataclass(frozen=True)
class UnsupportedRun:
    """A measured run the cost model cannot express, and why (skipped, not scored)."""

    run_id: str
    model: str
    system: str
    reason: str

    def to_json_dict(self) -> dict[str, str]:
        """Plain dict of the fields for JSON."""
        return dataclasses.asdict(self)


def engine_function(engine: str = "analytic") -> Callable[[Scenario], Any]:
    """The engine entry point ``scenario -> StepReport`` (imported lazily)."""
    if engine == "analytic":
        from costmodel.analytic import run_analytic

        return run_analytic
    if engine == "des":
        from costmodel.des import run_des

        return run_des
    raise UserInputError(f"unknown engine '{engine}'; valid: analytic, des")


def step_time_function(engine: str = "analytic") -> Callable[[Scenario], float]:
    """``scenario -> step time (s)``: the engine's timing without the rest of the StepReport.

    For the analytic engine this skips the report assembly (memory model, optimizer section),
    which costs more than the timing itself and does not depend on efficiency factors.
    """
    if engine == "analytic":
        try:
            from costmodel.analytic import analytic_timing
            from costmodel.step_structure import build_step_structure
        except ImportError:  # an engine without the split: use the whole report
            run = engine_function(engine)
            return lambda scenario: float(run(scenario).step_time_s)
        return lambda scenario: float(analytic_timing(build_step_structure(scenario)).step_time_s)
    run = engine_function(engine)
    return lambda scenario: float(run(scenario).step_time_s)


def with_factors(scenario: Scenario, factors: Mapping[str, float]) -> Scenario:
    """The scenario with some efficiency factors of its system replaced."""
    if not factors:
        return scenario
    return dataclasses.replace(scenario, system=scenario.system.with_efficiency(**factors))


def prepare_runs(runs: Iterable[MeasuredRun], engine: str = "analytic",
                 check: bool = True) -> tuple[list[PreparedRun], list[UnsupportedRun]]:
    """Resolve every run's scenario; with ``check`` also run the engine once to catch unsupported ones."""
    from costmodel.errors import UnsupportedScenario

    run_engine = step_time_function(engine) if check else None
    prepared: list[PreparedRun] = []
    unsupported: list[UnsupportedRun] = []
    for run in runs:
        try:
            scenario = scenario_for_run(run)
            if run_engine is not None:
                run_engine(scenario)
        except UserInputError as err:
            unsupported.append(UnsupportedRun(run.run_id, run.model, run.system, f"invalid scenario: {err}"))
            continue
        except UnsupportedScenario as err:
            unsupported.append(UnsupportedRun(run.run_id, run.model, run.system, f"unsupported: {err}"))
            continue
        prepared.append(PreparedRun(run, scenario))
    return prepared, unsupported


# --------------------------------------------------------------------------------- metrics
@dataclass(frozen=True)
class RunResult:
    """Measured vs predicted step time of one run."""

    run_id: str
    model: str
    system: str
    release: str
    num_gpus: int
    tokens_per_step: int
    measured_step_time_s: float
    predicted_step_time_s: float
    in_training_set: bool = False
    settings: dict[str, Any] | None = None  # the recipe settings the prediction used (scenario keys)
    settings_source: dict[str, Any] | None = None  # where they came from (file, ref, unresolved columns)

    @property
    def error_pct(self) -> float:
        """Signed step-time error in percent of the measured time (positive: predicted slower)."""
        return 100.0 * (self.predicted_step_time_s - self.measured_step_time_s) / self.measured_step_time_s

    def to_json_dict(self) -> dict[str, Any]:
        """The ``--json`` row: identity, measured and predicted step time (s), ``error_pct``, training-set flag."""
        return {
            "run_id": self.run_id, "model": self.model, "system": self.system, "release": self.release,
            "gpus": self.num_gpus, "measured_step_time_s": self.measured_step_time_s,
            "predicted_step_time_s": self.predicted_step_time_s, "error_pct": self.error_pct,
            "in_training_set": self.in_training_set, "settings": self.settings,
            "settings_source": self.settings_source,
        }


@dataclass(frozen=True)
class Metrics:
    """Summary of step-time errors (percent) and ranking agreement over a set of runs."""

    n: int
    mape_pct: float
    median_ape_pct: float
    bias_pct: float
    max_ape_pct: float
    worst_run_id: str | None
    kendall_tau: float | None
    kendall_pairs: int

    def to_json_dict(self) -> dict[str, Any]:
        """Plain dict of the fields (percent errors, Kendall's tau) for JSON."""
        return dataclasses.asdict(self)


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall's τ-b of two equally long sequences (None when undefined: < 2 items or all tied)."""
    import numpy as np

    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    upper = np.triu_indices(len(a), k=1)
    dx = np.sign(a[:, None] - a[None, :])[upper]
    dy = np.sign(b[:, None] - b[None, :])[upper]
    s = float(np.sum(dx * dy))  # concordant - discordant
    denom = math.sqrt(float(np.count_nonzero(dx)) * float(np.count_nonzero(dy)))
    return None if denom == 0 else s / denom


def grouped_kendall_tau(rows: Sequence[RunResult]) -> tuple[float | None, int, dict[str, float]]:
    """τ-b within each (model, system) group on GPU-seconds per token; pair-weighted mean.

    Returns (combined τ or None, number of pairs used, τ per group 'model@system').
    """
    groups: dict[str, list[RunResult]] = defaultdict(list)
    for r in rows:
        groups[f"{r.model}@{r.system}"].append(r)
    per_group: dict[str, float] = {}
    weighted = 0.0
    pairs = 0
    for key, members in sorted(groups.items()):
        cost_m = [r.measured_step_time_s * r.num_gpus / r.tokens_per_step for r in members]
        cost_p = [r.predicted_step_time_s * r.num_gpus / r.tokens_per_step for r in members]
        tau = kendall_tau_b(cost_m, cost_p)
        if tau is None:
            continue
        n_pairs = len(members) * (len(members) - 1) // 2
        per_group[key] = tau
        weighted += tau * n_pairs
        pairs += n_pairs
    return (weighted / pairs if pairs else None), pairs, per_group


def error_metrics(rows: Sequence[RunResult]) -> Metrics:
    """MAPE, median APE, bias, worst case and grouped Kendall τ of ``rows``."""
    if not rows:
        return Metrics(0, math.nan, math.nan, math.nan, math.nan, None, None, 0)
    errors = [r.error_pct for r in rows]
    abs_err = sorted(abs(e) for e in errors)
    mid = len(abs_err) // 2
    median = abs_err[mid] if len(abs_err) % 2 else 0.5 * (abs_err[mid - 1] + abs_err[mid])
    worst = max(rows, key=lambda r: abs(r.error_pct))
    tau, pairs, _ = grouped_kendall_tau(rows)
    return Metrics(
        n=len(rows), mape_pct=sum(abs_err) / len(rows), median_ape_pct=median,
        bias_pct=sum(errors) / len(rows), max_ape_pct=abs(worst.error_pct), worst_run_id=worst.run_id,
        kendall_tau=tau, kendall_pairs=pairs,
    )


def metrics_by(rows: Sequence[RunResult], key: Callable[[RunResult], str]) -> dict[str, Metrics]:
    """Metrics per value of ``key`` (e.g. per system)."""
    groups: dict[str, list[RunResult]] = defaultdict(list)
    for r in rows:
        groups[key(r)].append(r)
    return {k: error_metrics(v) for k, v in sorted(groups.items())}


# ------------------------------------------------------------------------------ validation
@dataclass
class ValidationReport:
    """Everything ``muonsim validate`` prints: rows, unsupported runs, metrics overall and per system."""

    rows: list[RunResult]
    unsupported: list[UnsupportedRun]
    calibration: str
    engine: str = "analytic"
    metrics: Metrics = field(init=False)
    by_system: dict[str, Metrics] = field(init=False)
    tau_by_group: dict[str, float] = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = error_metrics(self.rows)
        self.by_system = metrics_by(self.rows, lambda r: r.system)
        self.tau_by_group = grouped_kendall_tau(self.rows)[2]

    @property
    def n_in_training_set(self) -> int:
        """Number of runs that were in the calibration's training set."""
        return sum(r.in_training_set for r in self.rows)

    def to_json_dict(self) -> dict[str, Any]:
        """The ``--json`` form: headline metrics at the top level, then rows and unsupported runs."""
        m = self.metrics
        return {
            "n": m.n, "mape_pct": _num(m.mape_pct), "median_ape_pct": _num(m.median_ape_pct),
            "bias_pct": _num(m.bias_pct), "max_ape_pct": _num(m.max_ape_pct), "worst_run_id": m.worst_run_id,
            "kendall_tau": m.kendall_tau, "kendall_pairs": m.kendall_pairs,
            "engine": self.engine, "calibration": self.calibration,
            "n_in_training_set": self.n_in_training_set,
            "by_system": {k: {kk: _num(vv) for kk, vv in v.to_json_dict().items()} for k, v in self.by_system.items()},
            "kendall_tau_by_group": self.tau_by_group,
            "rows": [r.to_json_dict() for r in self.rows],
            "unsupported": [u.to_json_dict() for u in self.unsupported],
        }


def _num(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


def predict_prepared(prepared: PreparedRun, calibration: CalibrationProfile | None,
                     step_time_s: Callable[[Scenario], float]) -> float:
    """Predicted step time (s) of a prepared run under ``calibration`` (system + release factors)."""
    factors = calibration.factors_for(prepared.scenario.system.name, prepared.run.release) if calibration else {}
    return step_time_s(with_factors(prepared.scenario, factors))


def skipped_as_unsupported(skipped: Iterable[SkippedRun]) -> list[UnsupportedRun]:
    """Rows a dataset skipped (with their reasons) as unsupported runs of a report."""
    return [UnsupportedRun(s.run_id, s.model, s.system, s.reason) for s in skipped]


def validate_runs(runs: Iterable[MeasuredRun], calibration: CalibrationProfile | None = None,
                  engine: str = "analytic", skipped: Iterable[SkippedRun] = ()) -> ValidationReport:
    """Predict every supported run and compare with what was measured (``skipped``: rows a
    dataset did not turn into runs, listed as unsupported with their reason)."""
    from costmodel.errors import UnsupportedScenario

    step_time_s = step_time_function(engine)
    prepared, unsupported = prepare_runs(runs, engine, check=False)
    unsupported = skipped_as_unsupported(skipped) + unsupported
    training = set(calibration.training_run_ids) if calibration else set()
    rows: list[RunResult] = []
    for p in prepared:
        try:
            predicted = predict_prepared(p, calibration, step_time_s)
        except UnsupportedScenario as err:
            unsupported.append(UnsupportedRun(p.run.run_id, p.run.model, p.run.system, f"unsupported: {err}"))
            continue
        except UserInputError as err:
            unsupported.append(UnsupportedRun(p.run.run_id, p.run.model, p.run.system, f"invalid scenario: {err}"))
            continue
        rows.append(result_row(p, predicted, p.run.run_id in training))
    label = "datasheet defaults" if calibration is None else calibration.name
    return ValidationReport(rows, unsupported, label, engine)


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [v.model_dump() if hasattr(v, "model_dump") else v for v in value]
    return value


def scenario_recipe_settings(scenario: Scenario) -> dict[str, Any]:
    """Every recipe setting (:data:`workloads.recipe_columns.SETTING_KEYS`) as the scenario has it."""
    from workloads.recipe_columns import SETTING_KEYS
    from workloads.scenario import section_of

    cfg = scenario.config
    out: dict[str, Any] = {"mtp_layers": scenario.model.mtp_layers, "fsdp": scenario.par.fsdp}
    for key in sorted(SETTING_KEYS):
        section = section_of(key)
        if section is not None:
            out[key] = _plain(getattr(getattr(cfg, section), key))
    return out


def settings_source(run: MeasuredRun) -> dict[str, Any] | None:
    """Where a run's recipe settings came from: the settings row's provenance, what was unresolved."""
    cells = run.recipe_settings
    if not cells:
        return None
    out: dict[str, Any] = {k: cells[k] for k in ("source_ref", "config_name", "match_status") if k in cells}
    out["unresolved_columns"] = list(run.recipe_resolution().unresolved)
    return out


def result_row(prepared: PreparedRun, predicted_step_time_s: float, in_training_set: bool = False) -> RunResult:
    """A RunResult for a prepared run and its prediction (with the settings the prediction used)."""
    run = prepared.run
    return RunResult(run.run_id, run.model, run.system, run.release, run.num_gpus, prepared.tokens_per_step,
                     run.step_time_s, predicted_step_time_s, in_training_set,
                     scenario_recipe_settings(prepared.scenario), settings_source(run))
