"""Issue 15's speed figures, each next to the previous version's.

Figures (one function each in ``FIGURES``; a function returns its rows or ``None`` when it is not
measured yet):

1. ms per brand-new scenario, analytic, in process (Kimi K2 / 256 GPUs, Llama 3.1 405B / 1,024 GPUs)
   -- placeholder: issue 15 item 1;
2. ``plan`` wall time, Kimi K2 / Muon on 256 and 2,048 GB300 GPUs -- placeholder: issue 15 item 2;
3. ``muonsim sweep`` throughput (points/s, run as a user runs it) of a 48-point grid of new
   analytic predict points: in process (``--jobs 1``), local processes (``--jobs 2``) and a 2-worker
   Dask LocalCluster (``--scheduler``: new workers, then the same workers again), the cluster's
   start-up time apart; every run's Parquet rows are checked equal. Most of a point's time is the
   model's own cost for a new scenario (item 1: Qwen3-30B-A3B with Muon at 64-128 GPUs takes ~2 s),
   so this figure grows with item 1's work.

Usage: ``python benchmarks/bench_speed.py [--only sweep]``. The machine is shared: every figure is
printed with the load average (``/proc/loadavg``) before and after it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Row:
    figure: str
    value: str
    previous: str  # the previous version's figure and where it comes from
    note: str = ""


# ----------------------------------------------------------------------------- 1, 2: placeholders
def new_scenario_ms() -> list[Row] | None:
    """ms per brand-new scenario (issue 15 item 1): not measured yet."""
    return None


def plan_wall_s() -> list[Row] | None:
    """``plan`` wall time at 256 and 2,048 GPUs (issue 15 item 2): not measured yet."""
    return None


# ----------------------------------------------------------------------------- 3: sweep throughput
SWEEP_GRID = """base:
  system: gb300-nvl72
  precision: bf16
  parallelism: {tp: 1, pp: 1, vpp: 1, ep: 1, micro_batch_size: 1, global_batch_size: 512, seq_length: 4096}
grid:
  model: [llama3-8b, llama3-70b, qwen3-30b-a3b]
  gpus: [16, 32, 64, 128]
  optimizer: [adamw, muon]
  tp: [1, 2]
"""
SWEEP_JOBS = 2


def _cli_sweep(grid_path: Path, out: Path, *args: str) -> tuple[float, dict]:
    """``muonsim sweep`` as a user runs it (a subprocess): its summary's points/s and wall time."""
    cmd = [sys.executable, "-m", "cli.app", "sweep", str(grid_path), "--out", str(out), "--json", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    summary = json.loads(proc.stdout)
    return summary["wall_s"], summary


def sweep_throughput() -> list[Row] | None:
    """Points per second of ``muonsim sweep``: in process, local processes, a 2-worker LocalCluster."""
    from distributed import LocalCluster

    from costmodel.sweep.tables import read_parquet

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        grid_path = Path(tmp) / "grid.yaml"
        grid_path.write_text(SWEEP_GRID)
        runs = {"--jobs 1 (in process)": ["--jobs", "1"], f"--jobs {SWEEP_JOBS} (local processes)": ["--jobs", str(SWEEP_JOBS)]}
        results = {label: _cli_sweep(grid_path, Path(tmp) / f"run{k}", *a) for k, (label, a) in enumerate(runs.items())}
        start = time.perf_counter()
        with LocalCluster(n_workers=SWEEP_JOBS, threads_per_worker=1, processes=True, dashboard_address=None,
                          silence_logs=logging.CRITICAL) as cluster:
            startup_s = time.perf_counter() - start
            address = cluster.scheduler_address
            results[f"--scheduler, {SWEEP_JOBS}-worker LocalCluster, new workers"] = _cli_sweep(
                grid_path, Path(tmp) / "run8", "--scheduler", address)
            again = f"--scheduler, {SWEEP_JOBS}-worker LocalCluster, same workers again (their caches hold these scenarios)"
            results[again] = _cli_sweep(grid_path, Path(tmp) / "run9", "--scheduler", address)
        tables = [read_parquet(Path(tmp) / d / "results.parquet") for d in ("run0", "run1", "run8", "run9")]
        same = all(t == tables[0] for t in tables)
    for label, (wall_s, summary) in results.items():
        n = summary["computed"]
        rows.append(Row(f"sweep of {n} new predict points, {label}", f"{n / wall_s:.1f} points/s ({wall_s:.2f} s)",
                        "none (new in issue 15)"))
    rows.append(Row("every run's Parquet rows equal", str(same), "-", f"LocalCluster start-up {startup_s:.1f} s, not counted"))
    return rows


FIGURES: dict[str, Callable[[], list[Row] | None]] = {
    "scenario": new_scenario_ms,
    "plan": plan_wall_s,
    "sweep": sweep_throughput,
}
PREVIOUS = {  # the figures issue 15 reports for the version before it (this machine, load not stated)
    "scenario": "21-24 ms per new scenario (issue 15)",
    "plan": "Kimi K2 / 256 GPUs: 15-48 s; 2,048 GPUs: ~3 min (issue 15)",
}


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:  # pragma: no cover - not Linux
        return "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(FIGURES), action="append", help="measure only these figures")
    args = parser.parse_args()
    print(f"cores: {len(os.sched_getaffinity(0))}")
    for name, measure in FIGURES.items():
        if args.only and name not in args.only:
            continue
        before = _loadavg()
        rows = measure()
        after = _loadavg()
        if rows is None:
            print(f"{name:9s} not measured yet (issue 15 items 1-2) | previous: {PREVIOUS.get(name, 'n/a')}")
            continue
        for row in rows:
            note = f" | {row.note}" if row.note else ""
            print(f"{row.figure}: {row.value} | previous: {row.previous}{note}")
        print(f"  load average before {before}, after {after}")


if __name__ == "__main__":
    main()
