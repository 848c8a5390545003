"""Issue 15's speed figures, each next to the previous version's (another git ref, default main).

Figures (``--only``, repeatable; default all):

* ``scenario``: ms per brand-new scenario, analytic engine, in process, after imports: Kimi K2 on
  256 GB300 GPUs and Llama 3.1 405B on 1,024, each evaluated (``run_analytic``: optimizer plan,
  memory, step structure, StepReport) on layouts never seen before in the process (the first
  layout of each list warms imports and is not counted; scenarios are resolved before timing).
  Median of the per-layout CPU seconds of the process (``time.process_time``: on a shared machine
  wall time counts the other processes too), wall seconds beside. Goal: <= 2 ms.
* ``plan``: ``muonsim plan --model kimi-k2 --system gb300-nvl72 --gpus G --gbs 4096 --seq 4096
  --optimizer muon --json`` as a subprocess (CLI start-up included) for G = 256 (goal <= 5 s) and
  2,048 (goal <= 30 s); whether the ranking (labels and step times) equals the previous version's.
* ``sweep``: ``muonsim sweep`` throughput (points/s, run as a user runs it) of a 48-point grid of
  new analytic predict points: in process (``--jobs 1``), local processes (``--jobs 2``) and a
  2-worker Dask LocalCluster (``--scheduler``: new workers, then the same workers again), the
  cluster's start-up time apart; every run's Parquet rows are checked equal.

The previous version (``--ref``, default ``main``; ``--ref none`` skips it) runs the same figures
from a temporary git worktree of that ref (under /tmp, removed afterwards) in a subprocess. The
machine is shared: the load average (``/proc/loadavg``) is printed before and after each version.

    python benchmarks/bench_speed.py [--ref main] [--only scenario --only plan] [--repeat 1] [--ref-figures FILE]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOALS_S = {"scenario kimi-k2 256 cpu": 2.0e-3, "scenario llama3.1-405b 1024 cpu": 2.0e-3,
           "plan 256 wall": 5.0, "plan 2048 wall": 30.0}

# ----------------------------------------------------------------------------- new scenarios
KIMI_LAYOUTS = [  # tp, pp, vpp, cp, ep, etp, micro-batch; the first warms up
    (1, 4, 4, 1, 64, 1, 2), (1, 8, 2, 1, 32, 1, 1), (2, 4, 2, 1, 32, 1, 1), (1, 2, 7, 1, 32, 1, 1),
    (1, 4, 2, 1, 16, 1, 2), (2, 8, 1, 1, 16, 1, 1), (1, 16, 1, 1, 8, 1, 1), (4, 4, 2, 1, 8, 2, 1),
    (1, 8, 4, 1, 16, 1, 2), (2, 2, 1, 1, 64, 1, 1), (1, 4, 1, 1, 32, 1, 4), (1, 2, 1, 1, 64, 1, 2),
    (2, 4, 4, 2, 16, 1, 1), (1, 8, 1, 2, 32, 1, 1), (4, 8, 1, 1, 4, 4, 1), (2, 16, 1, 1, 8, 2, 1),
]
LLAMA_BASE = {"model": "llama3.1-405b", "gpus": 1024, "global_batch_size": 1024, "seq_length": 8192}
LLAMA_LAYOUTS = [
    (8, 8, 2, 1, 1, 1, 1), (8, 16, 1, 1, 1, 1, 1), (4, 16, 2, 1, 1, 1, 1), (8, 4, 2, 1, 1, 1, 1),
    (4, 8, 2, 1, 1, 1, 1), (8, 8, 4, 1, 1, 1, 1), (8, 16, 2, 1, 1, 1, 1), (4, 16, 1, 1, 1, 1, 1),
    (8, 4, 4, 1, 1, 1, 1), (2, 16, 2, 1, 1, 1, 1), (8, 8, 1, 1, 1, 1, 2), (4, 8, 4, 1, 1, 1, 1),
    (8, 8, 2, 2, 1, 1, 1), (4, 16, 2, 2, 1, 1, 1), (8, 2, 3, 2, 1, 1, 1), (2, 8, 4, 1, 1, 1, 1),
]
CASES = (("kimi-k2 256", {}, KIMI_LAYOUTS), ("llama3.1-405b 1024", LLAMA_BASE, LLAMA_LAYOUTS))


def _scenarios(base: dict[str, Any], layouts: list[tuple[int, ...]]) -> list[Any]:
    from topologies.inputs import UserInputError
    from workloads.scenario import DEFAULT_SCENARIO

    root = DEFAULT_SCENARIO.resolve()
    out = []
    for tp, pp, vpp, cp, ep, etp, mbs in layouts:
        try:
            out.append(root.with_updates(**base, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, micro_batch_size=mbs))
        except UserInputError:  # a layout a version rejects is skipped (the same in both versions)
            continue
    return out


def new_scenario_s() -> dict[str, Any]:
    """Median CPU and wall seconds of ``run_analytic`` on never-seen layouts, per case."""
    from costmodel.analytic import run_analytic

    out: dict[str, Any] = {}
    for name, base, layouts in CASES:
        scenarios = _scenarios(base, layouts)  # resolved first: scenario validation is not timed
        run_analytic(scenarios[0])
        cpu, wall = [], []
        for sc in scenarios[1:]:
            c, w = time.process_time(), time.perf_counter()
            run_analytic(sc)
            cpu.append(time.process_time() - c)
            wall.append(time.perf_counter() - w)
        out[f"scenario {name} cpu"] = statistics.median(cpu)
        out[f"scenario {name} wall"] = statistics.median(wall)
        out[f"scenario {name} layouts"] = len(cpu)
    return out


# ----------------------------------------------------------------------------- plan
PLAN_ARGS = ["plan", "--model", "kimi-k2", "--system", "gb300-nvl72", "--gbs", "4096", "--seq", "4096",
             "--optimizer", "muon", "--json"]


def _children_cpu_s() -> float:
    """User + system CPU seconds of every waited-for child process so far (workers included)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def plan_wall_s(repeat: int = 1) -> dict[str, Any]:
    """Wall seconds of the plan command at 256 and 2,048 GPUs (best of ``repeat``), the CPU seconds
    (user + system, its pool workers included: what a shared machine's load does not inflate as
    much) of that run, and its ranking."""
    with tempfile.TemporaryDirectory(prefix="muonsim-plan-") as cwd:  # empty: nothing there shadows the package
        return _plan_wall_s(repeat, cwd)


def _plan_wall_s(repeat: int, cwd: str) -> dict[str, Any]:
    """:func:`plan_wall_s` run from directory ``cwd``."""
    out: dict[str, Any] = {}
    for gpus in (256, 2048):
        best, best_cpu = float("inf"), float("inf")
        for _ in range(repeat):
            start, cpu = time.perf_counter(), _children_cpu_s()
            proc = subprocess.run([sys.executable, "-m", "cli.app", *PLAN_ARGS, "--gpus", str(gpus)],
                                  capture_output=True, text=True, check=False, cwd=cwd)
            if time.perf_counter() - start < best:
                best, best_cpu = time.perf_counter() - start, _children_cpu_s() - cpu
        if proc.returncode == 0:
            data = json.loads(proc.stdout)
            out[f"plan {gpus} wall"] = best
            out[f"plan {gpus} cpu (user+sys)"] = best_cpu
            out[f"plan {gpus} screening"] = data["stats"]["screening_wall_s"]
            out[f"plan {gpus} ranking"] = json.dumps([(r["label"], r["step_time_s"], r["des_step_time_s"])
                                                      for r in data["ranking"]])
        else:
            out[f"plan {gpus} wall"] = proc.stderr.strip()[-200:]
    return out


# ----------------------------------------------------------------------------- sweep throughput
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


def _cli_sweep(grid_path: Path, out: Path, *args: str) -> tuple[float, dict[str, Any]]:
    """``muonsim sweep`` as a user runs it (a subprocess): its summary's wall time and summary."""
    cmd = [sys.executable, "-m", "cli.app", "sweep", str(grid_path), "--out", str(out), "--json", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    summary = json.loads(proc.stdout)
    return summary["wall_s"], summary


def sweep_points_per_s() -> dict[str, Any]:
    """Points per second of ``muonsim sweep``: in process, local processes, a 2-worker LocalCluster."""
    from distributed import LocalCluster

    from costmodel.sweep.tables import read_parquet

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        grid_path = Path(tmp) / "grid.yaml"
        grid_path.write_text(SWEEP_GRID)
        runs = {"--jobs 1": ["--jobs", "1"], f"--jobs {SWEEP_JOBS}": ["--jobs", str(SWEEP_JOBS)]}
        results = {label: _cli_sweep(grid_path, Path(tmp) / f"run{k}", *a) for k, (label, a) in enumerate(runs.items())}
        start = time.perf_counter()
        with LocalCluster(n_workers=SWEEP_JOBS, threads_per_worker=1, processes=True, dashboard_address=None,
                          silence_logs=logging.CRITICAL) as cluster:
            out["sweep LocalCluster start-up s"] = time.perf_counter() - start
            address = cluster.scheduler_address
            results[f"--scheduler ({SWEEP_JOBS} new workers)"] = _cli_sweep(grid_path, Path(tmp) / "run8",
                                                                            "--scheduler", address)
            results[f"--scheduler ({SWEEP_JOBS} workers again)"] = _cli_sweep(grid_path, Path(tmp) / "run9",
                                                                             "--scheduler", address)
        tables = [read_parquet(Path(tmp) / d / "results.parquet") for d in ("run0", "run1", "run8", "run9")]
        out["sweep rows equal"] = str(all(t == tables[0] for t in tables))
    for label, (wall_s, summary) in results.items():
        out[f"sweep {label} points/s"] = summary["computed"] / wall_s
    return out


# ----------------------------------------------------------------------------- driver
def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:  # pragma: no cover - not Linux
        return "n/a"


def measure(only: list[str], repeat: int) -> dict[str, Any]:
    """Every figure asked for, for the code on ``sys.path`` (load averages included)."""
    out: dict[str, Any] = {"load before": _loadavg()}
    if "scenario" in only:
        out |= new_scenario_s()
    if "plan" in only:
        out |= plan_wall_s(repeat)
    if "sweep" in only:
        out |= sweep_points_per_s()
    out["load after"] = _loadavg()
    return out


def _previous(ref: str, only: list[str], repeat: int) -> dict[str, Any]:
    """The same figures for git ref ``ref`` (a temporary worktree; this script runs there)."""
    tmp = Path(tempfile.mkdtemp(prefix="muonsim-bench-"))
    tree = tmp / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref], check=True,
                   capture_output=True)
    try:
        args = [a for name in only for a in ("--only", name)]
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--measure-only", *args,
                               "--repeat", str(repeat)], capture_output=True, text=True, check=True,
                              env=os.environ | {"PYTHONPATH": str(tree)}, cwd=str(tree))
        return json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False,
                       capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def _fmt(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if key.startswith("scenario") and key.endswith(("cpu", "wall")):
        return f"{value * 1e3:.2f} ms"
    if key.endswith("points/s"):
        return f"{value:.1f}"
    if isinstance(value, int):
        return str(value)
    return f"{value:.1f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default="main", help="git ref of the previous version ('none': skip)")
    ap.add_argument("--only", choices=("scenario", "plan", "sweep"), action="append", help="measure only these")
    ap.add_argument("--repeat", type=int, default=1, help="plan runs per figure (the best is kept)")
    ap.add_argument("--ref-figures", metavar="FILE", help="JSON of the ref's figures: read if it exists, else "
                    "measured and written there (measure the ref once on a shared machine, compare many times)")
    ap.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    only = args.only or ["scenario", "plan", "sweep"]
    if args.measure_only:
        print(json.dumps(measure(only, args.repeat)))
        return
    saved = Path(args.ref_figures) if args.ref_figures else None
    if saved is not None and saved.exists():
        before = json.loads(saved.read_text())
    else:
        before = _previous(args.ref, only, args.repeat) if args.ref != "none" else {}
        if saved is not None:
            saved.write_text(json.dumps(before))
    now = measure(only, args.repeat)
    print(f"cores: {len(os.sched_getaffinity(0))}")
    ref = args.ref if args.ref != "none" else ""
    print(f"{'figure':<44} {'this tree':>14} {ref:>14}  goal")
    for key, value in now.items():
        if key.endswith("ranking"):
            continue
        goal = GOALS_S.get(key)
        verdict = "" if goal is None or isinstance(value, str) else (
            f"{_fmt(key, goal)} {'ok' if value <= goal else 'OVER'}")
        print(f"{key:<44} {_fmt(key, value):>14} {_fmt(key, before.get(key)):>14}  {verdict}")
    for key in now:
        if key.endswith("ranking") and key in before:
            same = _same_ranking(json.loads(now[key]), json.loads(before[key]))
            print(f"{key}: {'same as ' + args.ref if same else 'DIFFERS from ' + args.ref} (labels, step times to 1e-9)")


def _same_ranking(a: list[list[Any]], b: list[list[Any]]) -> bool:
    """Same labels in the same order and the same times to 1e-9 relative."""
    def close(x: float | None, y: float | None) -> bool:
        return x == y or (x is not None and y is not None and abs(x - y) <= 1e-9 * max(abs(x), abs(y)))

    return len(a) == len(b) and all(ra[0] == rb[0] and all(close(x, y) for x, y in zip(ra[1:], rb[1:], strict=True))
                                    for ra, rb in zip(a, b, strict=True))


if __name__ == "__main__":
    main()
