"""Step-time error on the Megatron CI timings (dataset ``megatron-ci``), per system.

Prints, for every system of the dataset, the MAPE and bias of:

- **FLOP-only**: no kernel-level costs (``kernel_issue_s``, ``kernel_min_s`` ~0, no framework host
  time): operations priced by their rooflines alone;
- **datasheet**: the schema defaults (kernel costs at their priors, framework host time off);
- **CI profile, held-out**: what ``costmodel/data/ci_calibration.yaml`` records from
  ``muonsim calibrate --dataset megatron-ci --factors layer_host_s,moe_host_s --release-factors ''
  --name megatron-ci`` (each configuration predicted from factors fitted without it; no
  per-recording-environment multipliers);
- **CI profile, training**: the same profile applied to every run;
- the row ``h100+gb200`` pools the 8-GPU H100 and GB200 runs (issue 13's acceptance set: one MAPE
  over both systems' runs; the held-out figure is the run-weighted mean of the two systems');
- **repeatability floor**: each run of a case recorded more than once on a system (other releases,
  i.e. other CI environments and commits) predicted by the median of that case's other recordings,
  and the CI profile's training error on the same runs: what a model that knew each configuration
  exactly, but not the recording environment, could reach.

Usage: ``python benchmarks/ci_accuracy.py`` (about a minute; report the load average).
"""

from __future__ import annotations

import os
import statistics
from collections import defaultdict
from pathlib import Path

from costmodel.calibrate.profile import load_profile
from costmodel.calibrate.validation import (
    error_metrics,
    metrics_by,
    prepare_runs,
    result_row,
    step_time_function,
    with_factors,
)
from workloads.datasets import load_dataset_rows

PROFILE = Path(__file__).resolve().parents[1] / "costmodel" / "data" / "ci_calibration.yaml"
# issue 13's acceptance set: the 8-GPU H100 and GB200 rows, one MAPE over all of them
ISSUE_13_SYSTEMS = ("dgx-h100", "gb200-nvl72")
ISSUE_13_SET = "h100+gb200"
FLOP_ONLY = {"kernel_issue_s": 1e-12, "kernel_min_s": 1e-12, "layer_host_s": 0.0, "moe_host_s": 0.0}


def main() -> None:
    """Print the error table."""
    runs, skipped = load_dataset_rows("megatron-ci")
    prepared, unsupported = prepare_runs(runs, check=False)
    step = step_time_function()
    profile = load_profile(PROFILE)
    variants = {
        "FLOP-only": lambda p: FLOP_ONLY,
        "datasheet": lambda p: {},
        "CI profile (training)": lambda p: profile.factors_for(p.scenario.system.name, p.run.release),
    }
    tables = {}
    for name, factors in variants.items():
        rows = [result_row(p, step(with_factors(p.scenario, factors(p)))) for p in prepared]
        tables[name] = {**metrics_by(rows, lambda r: r.system),
                        ISSUE_13_SET: error_metrics([r for r in rows if r.system in ISSUE_13_SYSTEMS]),
                        "overall": error_metrics(rows)}
    print(f"megatron-ci: {len(prepared)} runs used, {len(skipped) + len(unsupported)} rows skipped; "
          f"load average {os.getloadavg()[0]:.2f}")
    header = f"{'system':<12} {'n':>4} " + " ".join(f"{name + ' MAPE/bias %':>34}" for name in [*variants, "CI held-out"])
    print(header)
    for system in tables["FLOP-only"]:
        m = tables["FLOP-only"][system]
        cells = [f"{t[system].mape_pct:>24.1f} / {t[system].bias_pct:+6.1f}" for t in tables.values()]
        cv = heldout_metrics(profile, system)
        cells.append(f"{cv['mape_pct']:>24.1f} / {cv['bias_pct']:+6.1f}" if cv else f"{'-':>33}")
        print(f"{system:<12} {m.n:>4} " + " ".join(cells))
    print_repeatability(prepared, step, profile)


def heldout_metrics(profile, system: str) -> dict[str, float] | None:  # noqa: ANN001 - CalibrationProfile
    """The profile's held-out MAPE and bias (%) for ``system``, for issue 13's set (the runs of its
    systems pooled: a mean over runs, so the per-system means weighted by their run counts) or overall."""
    if system == ISSUE_13_SET:
        parts = [profile.systems[s].cross_validation for s in ISSUE_13_SYSTEMS]
        n = sum(cv["n"] for cv in parts)
        return {k: sum(cv["n"] * cv[k] for cv in parts) / n for k in ("mape_pct", "bias_pct")}
    return profile.systems[system].cross_validation if system in profile.systems else profile.cross_validation


def case_of(run_id: str) -> str:
    """The CI case of a run id ('<case>__<system>__<env>[__2nd]'): its first component."""
    return run_id.split("__")[0]


def print_repeatability(prepared, step, profile) -> None:  # noqa: ANN001 - PreparedRun list, callable, profile
    """Per system: MAPE of predicting each repeated case's run by the median of its other recordings,
    beside the CI profile's training MAPE on the same runs."""
    print("repeatability floor (cases recorded more than once on a system):")
    for system in sorted({p.scenario.system.name for p in prepared}):
        groups = defaultdict(list)
        for p in prepared:
            if p.scenario.system.name == system:
                groups[case_of(p.run.run_id)].append(p)
        repeated = [p for g in groups.values() if len(g) > 1 for p in g]
        if not repeated:
            continue
        floor = [abs(statistics.median(o.run.step_time_s for o in groups[case_of(p.run.run_id)] if o is not p)
                     / p.run.step_time_s - 1) * 100 for p in repeated]
        model = [abs(result_row(p, step(with_factors(p.scenario, profile.factors_for(system, p.run.release))))
                     .error_pct) for p in repeated]
        print(f"  {system:<12} {len(repeated):>4} runs: other recordings' median {statistics.mean(floor):5.1f} %, "
              f"CI profile (training) {statistics.mean(model):5.1f} %")


if __name__ == "__main__":
    main()
