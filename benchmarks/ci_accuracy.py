"""Step-time error on the Megatron CI timings (dataset ``megatron-ci``), per system.

Prints, for every system of the dataset, the MAPE and bias of:

- **FLOP-only**: no kernel-level costs (``kernel_issue_s``, ``kernel_min_s`` ~0, no framework host
  time): operations priced by their rooflines alone;
- **datasheet**: the schema defaults (kernel costs at their priors, framework host time off);
- **CI profile, held-out**: what ``costmodel/data/ci_calibration.yaml`` records from
  ``muonsim calibrate --dataset megatron-ci --factors kernel_issue_s,kernel_min_s,layer_host_s,moe_host_s
  --release-factors layer_host_s`` (each configuration predicted from factors fitted without it);
- **CI profile, training**: the same profile applied to every run.

Usage: ``python benchmarks/ci_accuracy.py`` (about a minute; report the load average).
"""

from __future__ import annotations

import os
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
        tables[name] = {**metrics_by(rows, lambda r: r.system), "overall": error_metrics(rows)}
    print(f"megatron-ci: {len(prepared)} runs used, {len(skipped) + len(unsupported)} rows skipped; "
          f"load average {os.getloadavg()[0]:.2f}")
    header = f"{'system':<12} {'n':>4} " + " ".join(f"{name + ' MAPE/bias %':>34}" for name in [*variants, "CI held-out"])
    print(header)
    for system in tables["FLOP-only"]:
        m = tables["FLOP-only"][system]
        cells = [f"{t[system].mape_pct:>24.1f} / {t[system].bias_pct:+6.1f}" for t in tables.values()]
        cv = profile.systems[system].cross_validation if system in profile.systems else profile.cross_validation
        cells.append(f"{cv['mape_pct']:>24.1f} / {cv['bias_pct']:+6.1f}" if cv else f"{'-':>33}")
        print(f"{system:<12} {m.n:>4} " + " ".join(cells))


if __name__ == "__main__":
    main()
