"""Speed of the step engines: CLI wall time, analytic scenarios per second, DES time and memory.

Prints (no assertions; goals from issue 4: DES default < 1 s, ~100,000 GPUs < 10 s):

1. wall time of ``muonsim predict`` (analytic and ``--engine des``) for the default scenario in a
   fresh process, including CLI start-up (median of ``--repeat`` runs);
2. analytic scenarios per second: the same scenario repeatedly (warm caches), a sweep of distinct
   scenarios evaluated the first time (optimizer plan and memory built) and again (warm);
3. DES wall time (cold: incl. optimizer plan and memory; warm) and peak Python heap (tracemalloc, separate run) for the default scenario at 256 GPUs and scaled
   to 4,096 and 100,352 GPUs (the nearest count to 100,000 that keeps EP64 inside 64-GPU NVLink
   slices; the global batch grows with dp so the step keeps 32 micro-batches per pipeline).

    python benchmarks/bench_predict.py [--repeat 3] [--skip-cli]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
import tracemalloc


def cli_wall_s(args: list[str], repeat: int) -> tuple[float, float]:
    """(first, median) wall seconds of ``muonsim ARGS`` in new processes."""
    exe = shutil.which("muonsim") or sys.executable
    argv = [exe, *args] if exe != sys.executable else [exe, "-m", "cli.app", *args]
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t)
    return times[0], statistics.median(times)


def scaled(gpus: int):  # noqa: ANN201 - workloads.scenario.Scenario
    from workloads.scenario import DEFAULT_SCENARIO

    base = DEFAULT_SCENARIO.resolve()
    if gpus == base.gpus:
        return base
    dp = gpus // (base.par.tp * base.par.pp * base.par.cp)
    return base.with_updates(gpus=gpus, global_batch_size=base.par.micro_batch_size * dp * base.num_microbatches)


def analytic_rates() -> None:
    from costmodel.analytic import run_analytic

    sc = scaled(256)
    run_analytic(sc)
    n = 300
    t = time.perf_counter()
    for _ in range(n):
        run_analytic(sc)
    print(f"analytic, same scenario (warm caches): {n / (time.perf_counter() - t):,.0f} scenarios/s")
    variants = []
    for gbs in (2048, 4096, 8192):
        for mbs in (1, 2, 4):
            for vpp in (1, 2, 4):
                for opt in ("muon", "adamw"):
                    variants.append(sc.with_updates(global_batch_size=gbs, micro_batch_size=mbs, vpp=vpp, optimizer=opt))
    t = time.perf_counter()
    for v in variants:
        run_analytic(v)
    cold = len(variants) / (time.perf_counter() - t)
    t = time.perf_counter()
    for v in variants:
        run_analytic(v)
    warm = len(variants) / (time.perf_counter() - t)
    print(f"analytic, {len(variants)} distinct scenarios: first evaluation {cold:,.0f}/s "
          f"(builds optimizer plans and memory), again {warm:,.0f}/s")


def des_case(gpus: int) -> None:
    from costmodel.des import run_des

    sc = scaled(gpus)
    t = time.perf_counter()
    rep = run_des(sc)
    cold = time.perf_counter() - t
    t = time.perf_counter()
    run_des(sc)
    warm = time.perf_counter() - t
    t = time.perf_counter()
    run_des(sc, record=False)
    bare = time.perf_counter() - t
    tracemalloc.start()  # a separate run: tracing slows Python down several-fold
    run_des(sc)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    b = rep.breakdown_s
    print(f"DES {gpus:>7,} GPUs (gbs {sc.par.global_batch_size:,}, {sc.num_microbatches} micro-batches): "
          f"{cold:.2f} s cold (incl. optimizer plan + memory), {warm:.2f} s warm with timeline "
          f"({len(rep.events):,} events, peak heap {peak / 1e6:.1f} MB), {bare:.2f} s without timeline; "
          f"step {rep.step_time_s:.3f} s (exposed dp_grad {b.exposed_comm.get('dp_grad', 0):.3f} s, "
          f"dp_param {b.exposed_comm.get('dp_param', 0):.3f} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-cli", action="store_true")
    args = ap.parse_args()
    if not args.skip_cli:
        for argv in (["predict"], ["predict", "--engine", "des"]):
            first, med = cli_wall_s(argv, args.repeat)
            print(f"muonsim {' '.join(argv):<24} first {first:.2f} s, median {med:.2f} s (incl. start-up)")
    analytic_rates()
    for gpus in (256, 4096, 100_352):
        des_case(gpus)


if __name__ == "__main__":
    main()
