"""Optimizer-plan construction time for Kimi K2 at 256 and 8,192 GPUs (goal: under 0.2 s).

``cold`` builds the plan from scratch (``plan.clear_caches()``: plan, tensor inventory, layer-wise
layout and Newton–Schulz work caches cleared); ``warm`` is a repeated call that hits the plan cache (key = model,
system, sizes and optimizer settings). Scenario resolution is not timed. Prints the first run,
the median and the minimum of ``--repeat`` cold runs.

    python benchmarks/bench_optimizer_plan.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

GOAL_S = 0.2

CASES: tuple[tuple[str, dict], ...] = (
    ("kimi-k2 256 GPUs tp1 pp4 vpp4 ep64 (default)", {}),
    ("kimi-k2 256 GPUs, adamw element-wise", {"optimizer": "adamw"}),
    ("kimi-k2 256 GPUs, legacy layout", {"layer_wise_layout": "legacy"}),
    ("kimi-k2 8192 GPUs tp1 pp4 vpp4 ep64", {"gpus": 8192, "global_batch_size": 8192}),
    ("kimi-k2 8192 GPUs, adamw element-wise", {"gpus": 8192, "global_batch_size": 8192, "optimizer": "adamw"}),
    ("kimi-k2 8192 GPUs tp2 pp16 ep32 distributed", {"gpus": 8192, "global_batch_size": 8192, "tp": 2, "pp": 16,
                                                     "vpp": 1, "ep": 32, "tp_mode": "distributed"}),
)


def cold_build_s(scenario) -> float:  # noqa: ANN001
    """Seconds to build the plan of ``scenario`` with every cache cleared."""
    from costmodel.optimizer import plan

    plan.clear_caches()
    start = time.perf_counter()
    plan.build_optimizer_plan(scenario)
    return time.perf_counter() - start


def warm_build_s(scenario, repeat: int = 20) -> float:  # noqa: ANN001
    """Median seconds of a cached lookup (plan key + dictionary hit)."""
    from costmodel.optimizer.plan import build_optimizer_plan

    build_optimizer_plan(scenario)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        build_optimizer_plan(scenario)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    """Measure and print the plan-construction figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="cold builds per case")
    opts = parser.parse_args()
    from workloads.scenario import DEFAULT_SCENARIO

    base = DEFAULT_SCENARIO.resolve()
    print(f"{'case':<46} {'GPUs/stage':>10} {'ranks':>6} {'first s':>8} {'median s':>9} {'min s':>7} {'warm ms':>8}  goal {GOAL_S} s")
    for label, overrides in CASES:
        sc = base.with_updates(**overrides)
        times = [cold_build_s(sc) for _ in range(opts.repeat)]
        from costmodel.optimizer.plan import build_optimizer_plan

        p = build_optimizer_plan(sc)
        ranks = sum(len(s.ranks) for s in p.stages)
        median = statistics.median(times)
        verdict = "ok" if median < GOAL_S else "OVER"
        print(f"{label:<46} {p.stages[0].gpus:>10} {ranks:>6} {times[0]:8.3f} {median:9.3f} {min(times):7.3f} "
              f"{warm_build_s(sc) * 1e3:8.3f}  {verdict}")


if __name__ == "__main__":
    main()
