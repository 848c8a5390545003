"""Speed figures of issue 15 next to a previous version's: new scenarios per ms and `plan` wall time.

Sections (``--sections``, comma-separated; default all):

* ``scenario``: a brand-new scenario, analytic engine, in process, after imports: Kimi K2 on 256
  GB300 GPUs and Llama 3.1 405B on 1,024, each evaluated (``run_analytic``: optimizer plan,
  memory, step structure, StepReport) on layouts never seen before in the process (the first
  layout of each list warms imports and is not counted). Median of the per-layout times, CPU
  seconds of the process (``time.process_time``: on a shared machine wall time counts the other
  processes too) and wall seconds. Goal: ≤ 2 ms.
* ``plan``: ``muonsim plan --model kimi-k2 --system gb300-nvl72 --gpus G --gbs 4096 --seq 4096
  --optimizer muon --json`` as a subprocess (CLI start-up included) for G = 256 (goal ≤ 5 s) and
  2,048 (goal ≤ 30 s) on 2 cores; also prints whether the ranking equals the previous version's.

The previous version (``--ref``, default ``main``) runs the same sections from a git worktree of
that ref (created under /tmp, removed afterwards) in a subprocess; ``--ref none`` skips it. The
load average is printed before and after, since the machine may be shared.

    python benchmarks/bench_speed.py [--ref main] [--sections scenario,plan] [--repeat 1]

Engineer ``sweep`` adds the sweep-throughput figures in ``benchmarks/bench_sweep.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOALS = {"scenario": 2.0e-3, "plan 256": 5.0, "plan 2048": 30.0}

KIMI_BASE = {}
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
PLAN_ARGS = ["plan", "--model", "kimi-k2", "--system", "gb300-nvl72", "--gbs", "4096", "--seq", "4096",
             "--optimizer", "muon", "--json"]


def _scenarios(base: dict, layouts: list[tuple[int, ...]]) -> list:
    from topologies.inputs import UserInputError
    from workloads.scenario import DEFAULT_SCENARIO

    root = DEFAULT_SCENARIO.resolve()
    out = []
    for tp, pp, vpp, cp, ep, etp, mbs in layouts:
        try:
            out.append(root.with_updates(**base, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, micro_batch_size=mbs))
        except UserInputError:  # a layout this version rejects is skipped (the same in both versions)
            continue
    return out


def scenario_section() -> dict[str, float]:
    """Median CPU and wall seconds of ``run_analytic`` on never-seen layouts, per case."""
    from costmodel.analytic import run_analytic

    out = {}
    for name, base, layouts in (("kimi-k2 256", KIMI_BASE, KIMI_LAYOUTS), ("llama3.1-405b 1024", LLAMA_BASE, LLAMA_LAYOUTS)):
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
    return out


def plan_section(repeat: int) -> dict[str, float | str]:
    """Wall seconds of the plan command at 256 and 2,048 GPUs (best of ``repeat``) and a digest of its ranking."""
    out: dict[str, float | str] = {}
    for gpus in (256, 2048):
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "cli.app", *PLAN_ARGS, "--gpus", str(gpus)],
                                  capture_output=True, text=True, check=False, cwd=tempfile.gettempdir(),
                                  env=os.environ | {"PYTHONHASHSEED": "0"})
            best = min(best, time.perf_counter() - start)
        out[f"plan {gpus}"] = best if proc.returncode == 0 else float("nan")
        if proc.returncode == 0:
            data = json.loads(proc.stdout)
            out[f"plan {gpus} ranking"] = json.dumps([(r["label"], r["step_time_s"]) for r in data["ranking"]])
        else:
            out[f"plan {gpus} ranking"] = proc.stderr.strip()[-200:]
    return out


def measure(sections: list[str], repeat: int) -> dict[str, float | str]:
    """Every figure of the requested sections for the code on ``sys.path``."""
    out: dict[str, float | str] = {}
    if "scenario" in sections:
        out |= scenario_section()
    if "plan" in sections:
        out |= plan_section(repeat)
    return out


def _previous(ref: str, sections: list[str], repeat: int) -> dict[str, float | str]:
    """The same figures for git ref ``ref`` (a temporary worktree; this script runs there)."""
    tmp = Path(tempfile.mkdtemp(prefix="muonsim-bench-"))
    tree = tmp / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref], check=True,
                   capture_output=True)
    try:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--measure-only",
                               "--sections", ",".join(sections), "--repeat", str(repeat)],
                              capture_output=True, text=True, check=True,
                              env=os.environ | {"PYTHONPATH": str(tree)}, cwd=str(tree))
        return json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False,
                       capture_output=True)


def _fmt(key: str, value: float | str | None) -> str:
    if value is None or isinstance(value, str):
        return "—" if value is None else value
    return f"{value * 1e3:8.2f} ms" if key.startswith("scenario") else f"{value:8.1f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default="main", help="git ref of the previous version ('none': skip)")
    ap.add_argument("--sections", default="scenario,plan")
    ap.add_argument("--repeat", type=int, default=1, help="plan runs per figure (best is kept)")
    ap.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    if args.measure_only:
        print(json.dumps(measure(sections, args.repeat)))
        return
    load_before = os.getloadavg()
    now = measure(sections, args.repeat)
    before = _previous(args.ref, sections, args.repeat) if args.ref != "none" else {}
    load_after = os.getloadavg()
    print(f"load average {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f} before, "
          f"{load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f} after ({os.cpu_count()} cores)")
    print(f"{'figure':<34} {'this tree':>12} {args.ref if args.ref != 'none' else '':>12}  goal")
    for key, value in now.items():
        if key.endswith("ranking"):
            continue
        goal = next((g for k, g in GOALS.items() if key.startswith(k) and not key.endswith("wall")), None)
        verdict = "" if goal is None or isinstance(value, str) else (
            f"{_fmt(key, goal).strip()} {'ok' if value <= goal else 'OVER'}")
        print(f"{key:<34} {_fmt(key, value):>12} {_fmt(key, before.get(key)):>12}  {verdict}")
    for key in now:
        if key.endswith("ranking") and key in before:
            print(f"{key}: {'same as ' + args.ref if now[key] == before[key] else 'DIFFERS from ' + args.ref}")


if __name__ == "__main__":
    main()
