"""How wrong is the model before calibration? Predict every supported measured run with datasheet defaults.

Reads ``workloads/data/measured/megatron_bridge_perf_summary.csv`` (published Megatron-Bridge
step times), predicts each row the model supports with the system's datasheet efficiency factors
(no calibration profile), and prints per system: rows, mean absolute percentage error (MAPE) and
signed bias (mean of (predicted - measured) / measured; positive = the model is too slow), plus the
rows it cannot express and why.

    python benchmarks/datasheet_error.py [--engine analytic|des] [--rows]
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

CSV = Path(__file__).resolve().parents[1] / "workloads" / "data" / "measured" / "megatron_bridge_perf_summary.csv"


def main() -> None:
    from costmodel.engine import UnsupportedScenario
    from topologies.inputs import UserInputError
    from workloads.loaders import load_csv
    from workloads.scenario import build_config

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=("analytic", "des"), default="analytic")
    ap.add_argument("--rows", action="store_true", help="print every row's prediction")
    args = ap.parse_args()
    if args.engine == "des":
        from costmodel.des import run_des

        def run(sc):  # noqa: ANN001, ANN202 - no timeline: the DES extrapolates the 1F1B steady state
            return run_des(sc, record=False)
    else:
        from costmodel.analytic import run_analytic as run

    errors: dict[str, list[float]] = defaultdict(list)
    skipped: dict[str, int] = defaultdict(int)
    runs = load_csv(CSV)
    for r in runs:
        try:
            sc = build_config({}, r.scenario_overrides(), source=r.run_id).resolve()
            pred = run(sc).step_time_s
        except (UnsupportedScenario, UserInputError) as err:
            skipped[str(err).split(":")[0] if "fsdp" not in str(err) else "Megatron-FSDP (fsdp > 0)"] += 1
            continue
        rel = (pred - r.step_time_s) / r.step_time_s
        errors[r.system].append(rel)
        errors["all"].append(rel)
        if args.rows:
            print(f"{r.run_id:<70} measured {r.step_time_s:8.3f} s  predicted {pred:8.3f} s  {rel:+7.1%}")
    print(f"{len(runs)} measured rows, engine {args.engine}, datasheet defaults (no calibration)")
    print(f"{'system':<14}{'rows':>6}{'MAPE':>9}{'bias':>9}{'median APE':>12}{'worst':>9}")
    for system in sorted(k for k in errors if k != "all") + ["all"]:
        e = errors[system]
        ape = [abs(x) for x in e]
        print(f"{system:<14}{len(e):>6}{statistics.mean(ape):>9.1%}{statistics.mean(e):>+9.1%}"
              f"{statistics.median(ape):>12.1%}{max(ape):>9.1%}")
    for reason, n in sorted(skipped.items()):
        print(f"not supported ({n} rows): {reason}")


if __name__ == "__main__":
    main()
