"""Benchmark of ``muonsim plan``: screening throughput and the full plan's wall time.

Prints, for Kimi K2 with Muon on 256 GB300 GPUs (gbs 4096, seq 4096):

1. single-process rates of the screening steps: pipeline bounds per second (the pruning bound of
   every layout), full candidate evaluations per second (validation + memory + analytic step time
   with shared optimizer plans; warm = plans cached, cold = a new plan per candidate) and, for
   comparison, ``run_analytic`` (full StepReport) per second;
2. the acceptance command ``muonsim plan --model kimi-k2 --system gb300-nvl72 --gpus 256 --gbs 4096
   --seq 4096 --optimizer muon`` run as a subprocess (CLI start-up included): wall time, candidates
   in the space, candidates covered per second (evaluated or provably pruned), engine calls per
   second, and a check that every listed plan passes the scenario validator and fits in memory.

Usage: ``python benchmarks/bench_plan.py [--skip-cli]``. The machine is shared: figures vary with load.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

ACCEPTANCE = ["plan", "--model", "kimi-k2", "--system", "gb300-nvl72", "--gpus", "256", "--gbs", "4096",
              "--seq", "4096", "--optimizer", "muon", "--json"]


def _rate(func, items) -> float:  # noqa: ANN001
    start = time.perf_counter()
    for item in items:
        func(item)
    return len(items) / (time.perf_counter() - start)


def single_process_rates() -> None:
    from costmodel.analytic import run_analytic
    from costmodel.planner.evaluate import Evaluator, InventoryMemory
    from costmodel.planner.fast_analytic import FastAnalytic
    from costmodel.planner.memory_bound import weights_and_grads_bytes
    from costmodel.planner.pins import parse_pins
    from costmodel.planner.plan import memory_budget_bytes
    from costmodel.planner.space import build_scenario, enumerate_groups, structure_grid
    from workloads.scenario import DEFAULT_SCENARIO

    base = DEFAULT_SCENARIO.resolve()
    pins = parse_pins({"optimizer": "muon"})
    budget = memory_budget_bytes(base, 0.1)
    grid, _ = structure_grid(base, pins)
    grid = grid[weights_and_grads_bytes(base.model, grid, 4) <= budget]
    groups = enumerate_groups(base, pins, grid)
    rng = random.Random(0)
    layouts = [g.candidates()[0] for g in rng.sample([g for g in groups if g.recompute == "none"], 3000)]
    engine = FastAnalytic()
    bounds = _rate(lambda c: engine.pipeline_bound_s(build_scenario(base, c)), layouts)
    print(f"pipeline bounds:                 {bounds:10,.0f} layouts/s (single process, random layouts)")
    # warm: every optimizer choice of a few layouts (plans shared across recompute and hiding)
    warm_groups = [g for g in groups if g.structure[:6] == (1, 4, 4, 1, 64, 1)]
    warm = [c for g in warm_groups for c in g.candidates()]
    ev = Evaluator(base, engine, InventoryMemory(), budget)
    for c in warm:
        ev.evaluate(c)
    rate_warm = _rate(ev.evaluate, warm)
    print(f"full evaluations, plans cached:  {rate_warm:10,.0f} candidates/s ({len(warm)} candidates)")
    cold = [g.candidates()[0] for g in rng.sample(groups, 60)]
    rate_cold = _rate(Evaluator(base, FastAnalytic(), InventoryMemory(), budget).evaluate, cold)
    print(f"full evaluations, new plans:     {rate_cold:10,.0f} candidates/s")
    scenarios = [build_scenario(base, c) for c in cold[:30]]
    print(f"run_analytic (full StepReport):  {_rate(run_analytic, scenarios):10,.0f} scenarios/s")


def acceptance_run() -> None:
    from costmodel.planner.space import Candidate, candidate_config
    from workloads.memory import memory_breakdown
    from workloads.scenario import DEFAULT_SCENARIO, ScenarioConfig

    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "cli.app", *ACCEPTANCE], capture_output=True, text=True,
                          env=os.environ | {"PYTHONHASHSEED": "0"}, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        print(f"acceptance command failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
        return
    data = json.loads(proc.stdout)
    st = data["stats"]
    print(f"acceptance command wall time:    {wall:10.1f} s (CLI start-up included; {st['jobs']} processes)")
    print(f"  candidates in the space:       {st['candidates']:10,} ({st['groups']:,} groups, "
          f"{st['valid_layouts']:,} valid layouts)")
    print(f"  screening:                     {st['screening_wall_s']:10.1f} s: {st['bounds_computed']:,} bounds, "
          f"{st['candidates_evaluated']:,} full evaluations, {st['candidates_pruned']:,} pruned, "
          f"{st['bound_violations']} bound violations")
    print(f"  candidates covered per second: {st['candidates_per_s']:10,.0f} /s (evaluated or provably slower)")
    print(f"  engine calls per second:       {st['engine_calls_per_s']:10,.0f} /s (bounds + full evaluations)")
    print(f"  DES on the head:               {st['des_wall_s']:10.1f} s")
    ref = data["reference"]
    print(f"  default scenario rank:         {ref['rank'] or ref['rank_range']}")
    base = DEFAULT_SCENARIO
    budget = data["memory_budget_bytes"]
    rows = [*data["ranking"], *data["pareto_front"], *([ref["row"]] if ref["row"] else [])]
    bad = 0
    for row in rows:
        s = row["settings"]
        cand = Candidate(s["tp"], s["pp"], s["vpp"], s["cp"], s["ep"], s["etp"], s["micro_batch_size"], s["recompute"],
                         s["optimizer"], s["distribution"], s.get("layer_wise_layout"), s.get("tp_mode"),
                         s.get("load_balance"), s.get("hide_param_gather"))
        sc = ScenarioConfig.model_validate(candidate_config(base, cand).model_dump()).resolve()
        bad += memory_breakdown(sc).total_bytes > budget
    print(f"  listed plans valid and fitting: {len(rows) - bad}/{len(rows)}")
    best = data["ranking"][0]
    print(f"  best plan: {best['label']}: {best['step_time_s']:.3f} s analytic, "
          f"{best['des_step_time_s']:.3f} s DES; reference {ref['row']['step_time_s']:.3f} s analytic, "
          f"{ref['row']['des_step_time_s']:.3f} s DES")


def main() -> None:
    single_process_rates()
    if "--skip-cli" not in sys.argv:
        acceptance_run()


if __name__ == "__main__":
    main()
