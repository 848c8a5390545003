"""Calibration on the shipped dataset: wall time, engine calls, held-out error per system.

    python benchmarks/bench_calibrate.py [--folds 5]

Prints figures (no assertions): how long `muonsim calibrate --dataset megatron-bridge` takes and
what it reports, so a change to the engines or the fitter can be judged on both.
"""

from __future__ import annotations

import argparse
import time

from costmodel.calibrate.fit import FitSettings
from costmodel.calibrate.fit_runs import calibrate
from workloads.datasets import load_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folds", type=int, default=5)
    args = parser.parse_args()
    runs = load_dataset("megatron-bridge")
    start = time.perf_counter()
    report = calibrate(runs, FitSettings(folds=args.folds), name="bench")
    wall = time.perf_counter() - start
    print(f"calibrate: {len(runs)} runs ({len(report.unsupported)} unsupported), {wall:.1f} s, "
          f"{report.result.engine_calls} engine calls in the fit")
    for scope, kinds in report.metrics_table().items():
        h, t, d = kinds.get("heldout"), kinds["train"], kinds["datasheet"]
        print(f"  {scope:12s} n={t.n:3d}  held-out MAPE {h.mape_pct:5.1f} % bias {h.bias_pct:+5.1f} % "
              f"worst {h.max_ape_pct:5.1f} %  | train {t.mape_pct:5.1f} %  datasheet {d.mape_pct:5.1f} %")


if __name__ == "__main__":
    main()
