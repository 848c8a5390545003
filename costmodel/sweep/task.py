"""One sweep point on a worker: predict or plan it, and flatten the outcome into result columns.

Result columns (``None`` where a point has no value):

- ``status``: ok, invalid (the scenario breaks a rule), unsupported, error (an unexpected failure,
  with its type and message), no_plan (a plan point whose search found no valid plan that fits);
  ``message``: the one-line reason; ``calibration``: the profile label;
- ``step_time_s``, ``tokens_per_s_per_gpu``, ``model_tflops_per_gpu``, ``mfu_fraction`` (predict);
- the breakdown in seconds: ``compute_s``, ``pipeline_bubble_s``, ``comm_<kind>_s``, ``optimizer_s``,
  ``other_s`` (a plan point: its best plan's analytic breakdown);
- memory per GPU in bytes: ``memory_per_gpu_bytes``, ``memory_<component>_bytes``,
  ``memory_capacity_bytes``, ``fits_in_memory`` (predict), ``memory_budget_bytes`` (plan);
- optimizer: ``optimizer_exposed_s``, ``optimizer_hidden_s``, ``optimizer_imbalance_ratio`` (predict);
- plan points: ``best_label``, ``best_<setting>`` (tp ... hide_param_gather), ``des_step_time_s``
  (the best plan's discrete-event time when the head was re-ranked), ``limiter``,
  ``reference_status``, ``reference_rank``, ``plan_candidates``, ``plan_candidates_evaluated``.

No wall-clock time enters a result: the same point gives the same columns on any worker.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from costmodel.planner.pool import evaluator
from costmodel.sweep.points import SweepContext, SweepPoint
from topologies.inputs import UserInputError

if TYPE_CHECKING:
    from costmodel.report import StepReport

CONTEXT = "sweep"  # name of the installed evaluator holding the SweepContext


def cell(value: Any) -> Any:
    """A table cell: finite floats, ints, bools, strings or None (NaN and inf become None)."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    try:
        number = float(value)  # numpy scalars
    except (TypeError, ValueError):
        return str(value)
    return number if math.isfinite(number) else None


def _term_columns(terms: Any) -> dict[str, Any]:
    """Breakdown terms (compute, pipeline_bubble, comm:<kind>, optimizer, other) as ``<term>_s`` columns."""
    return {f"{name.replace(':', '_')}_s": value for name, value in terms}


def predict_columns(report: StepReport) -> dict[str, Any]:
    """Result columns of a predicted step."""
    from costmodel.planner.evaluate import report_terms

    out: dict[str, Any] = {
        "status": "ok", "message": "; ".join(report.warnings), "calibration": report.calibration,
        "step_time_s": report.step_time_s, "tokens_per_s_per_gpu": report.tokens_per_s_per_gpu,
        "model_tflops_per_gpu": report.model_tflops_per_gpu, "mfu_fraction": report.mfu_fraction,
    }
    out |= _term_columns(report_terms(report))
    out["memory_per_gpu_bytes"] = report.memory_per_gpu_bytes
    if report.memory is not None:
        out |= {f"memory_{k}_bytes": v for k, v in report.memory.components_bytes.items()}
        out["memory_capacity_bytes"] = report.memory.capacity_bytes
        out["fits_in_memory"] = report.memory.fits
    if report.optimizer is not None:
        opt = report.optimizer
        out |= {"optimizer_exposed_s": opt.exposed_s, "optimizer_hidden_s": opt.hidden_s,
                "optimizer_imbalance_ratio": opt.imbalance_ratio}
    return out


def plan_columns(result: Any) -> dict[str, Any]:
    """Result columns of a plan (a :class:`~costmodel.planner.result.PlanResult`)."""
    from costmodel.planner.evaluate import breakdown_terms

    best = result.best
    ref = result.reference
    out: dict[str, Any] = {"status": "ok" if best is not None else "no_plan", "message": "",
                           "calibration": result.calibration}
    if best is None:
        why = [n for n in result.notes if n.startswith(("no layout fits in memory", "no screened layout fits"))]
        out["message"] = why[0] if why else "no plan in the search space fits in memory and passes the scenario validator"
    else:
        out |= {"step_time_s": best.step_time_s, "tokens_per_s_per_gpu": best.tokens_per_s_per_gpu}
        out |= _term_columns(breakdown_terms(best.breakdown_s))
        out |= {"memory_per_gpu_bytes": best.memory_per_gpu_bytes, "memory_budget_bytes": result.memory_budget_bytes,
                "best_label": best.label}
        out |= {f"best_{k}": v for k, v in best.settings.items()}
        out |= {"des_step_time_s": best.des_step_time_s, "limiter": best.limiter}
    out |= {"reference_status": ref.status, "reference_rank": ref.rank,
            "plan_candidates": result.stats.candidates, "plan_candidates_evaluated": result.stats.candidates_evaluated}
    return out


def _predict(point: SweepPoint, ctx: SweepContext) -> dict[str, Any]:
    from costmodel.engine import predict

    assert point.scenario is not None and point.engine is not None
    return predict_columns(predict(point.scenario, point.engine, ctx.profile, ctx.release))  # type: ignore[arg-type]


def _plan(point: SweepPoint, ctx: SweepContext) -> dict[str, Any]:
    from costmodel.planner.plan import PlanOptions, run_plan

    assert point.scenario is not None and point.pins is not None
    base, label = point.scenario, "datasheet defaults"
    if ctx.profile is not None:
        base = ctx.profile.apply(base, ctx.release)
        label = ctx.profile.label(base.system.name, ctx.release)
    settings = ctx.plan
    options = PlanOptions(pins=point.pins, headroom=settings.memory_headroom, top_k=settings.top_k, jobs=1,
                          samples=0, exhaustive=settings.exhaustive)
    try:
        outcome = run_plan(base, options, reference_error=point.reference_error, profile=ctx.profile,
                           calibration_label=label)
    except UserInputError as err:
        return {"status": "no_plan", "message": str(err), "calibration": label}
    if outcome.result.interrupted:  # Ctrl-C reached an in-process plan: this point is not done
        raise KeyboardInterrupt
    return plan_columns(outcome.result)


def run_point(point: SweepPoint, ctx: SweepContext) -> dict[str, Any]:
    """The result columns of one runnable point (failures become a status, never an exception)."""
    try:
        columns = _plan(point, ctx) if point.mode == "plan" else _predict(point, ctx)
    except UserInputError as err:
        columns = {"status": "invalid", "message": str(err)}
    except Exception as err:  # noqa: BLE001 - one failing point must not end a long sweep
        status = "unsupported" if type(err).__name__ == "UnsupportedScenario" else "error"
        columns = {"status": status, "message": " ".join(f"{type(err).__name__}: {err}".split())}
    return {k: cell(v) for k, v in columns.items()}


def task_point(point: SweepPoint) -> tuple[str, dict[str, Any]]:
    """(key, result columns) of a point: the pool task (the context is the installed ``sweep`` evaluator)."""
    return point.key, run_point(point, evaluator(CONTEXT))
