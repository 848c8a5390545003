"""Does a Newton-Schulz call cost more while the other core runs GEMMs too (as the other rank does)?

    python benchmarks/bench_ns_concurrency.py [--rounds 6] [--calls 15]

This process is pinned to core 0 and times the microbenchmark's NS calls (thread CPU time, median
of ``--calls`` per shape and round, one torch thread, the ranks' allocator) in alternating rounds:
alone, with a second process on core 1 running NS calls of 256×1024 without pause (what the other
rank does during a step's NS phase), and with a second process spinning in Python on core 1 (uses
the core, touches no memory: the baseline for "another process is running"). If the GEMM neighbour
costs more than the spinning one, the ranks slow each other through the shared last-level cache or
memory. Needs 2 cores; the load average is printed (compare the columns of one run, not runs).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from multiprocessing.synchronize import Event

import torch

from costmodel.calibrate.microbench_ns import NS_POOL_BYTES, ns_calls
from reference.allocator import keep_freed_memory

SHAPES = ((2048, 256), (256, 1024), (128, 512), (64, 192), (32, 64))
NEIGHBOURS = ("alone", "ns", "spin")


def _neighbour(kind: str, stop: Event) -> None:
    """Core 1: NS calls of 256×1024 (``ns``) or a Python spin (``spin``) until ``stop``."""
    os.sched_setaffinity(0, {1})
    torch.set_num_threads(1)
    if kind == "ns":
        call = ns_calls("bf16", [(256, 1024)], NS_POOL_BYTES)[0]
        while not stop.is_set():
            call()
    else:
        while not stop.is_set():
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=15)
    args = parser.parse_args()
    os.sched_setaffinity(0, {0})
    torch.set_num_threads(1)
    keep_freed_memory()
    calls = ns_calls("bf16", SHAPES, NS_POOL_BYTES)
    times: dict[str, dict[tuple[int, int], list[float]]] = {k: {s: [] for s in SHAPES} for k in NEIGHBOURS}
    ctx = mp.get_context("fork")
    print(f"load before: {os.getloadavg()[0]:.2f}")
    for _ in range(args.rounds):
        for kind in NEIGHBOURS:
            stop = ctx.Event()
            proc = None
            if kind != "alone":
                proc = ctx.Process(target=_neighbour, args=(kind, stop))
                proc.start()
                time.sleep(0.3)  # the neighbour's warm-up
            for shape, call in zip(SHAPES, calls, strict=True):
                call()
                samples = []
                for _ in range(args.calls):
                    t0 = time.thread_time()
                    call()
                    samples.append(time.thread_time() - t0)
                times[kind][shape].append(statistics.median(samples))
            if proc is not None:
                stop.set()
                proc.join()
    print(f"load after:  {os.getloadavg()[0]:.2f}")
    for shape in SHAPES:
        alone = statistics.median(times["alone"][shape])
        ratios = {k: statistics.median(times[k][shape]) / alone for k in NEIGHBOURS[1:]}
        print(f"{shape[0]:5d}x{shape[1]:<5d} alone {alone * 1e6:7.0f} us   NS on core 1 {ratios['ns']:.2f}x   "
              f"spin on core 1 {ratios['spin']:.2f}x")


if __name__ == "__main__":
    main()
