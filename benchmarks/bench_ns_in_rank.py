"""Newton-Schulz calls of the real 2-rank reference run, call by call, against the microbenchmark's NS
call timed inside the same rank processes (thread CPU time, preemptions, CPU migrations).

    python benchmarks/bench_ns_in_rank.py [--shapes many-small] [--steps 6] [--calls 90]

Runs the reference as ``bench_optimizer_kernels.py`` does (2 gloo ranks, tp 1, the allocator keeping
freed memory). Before the ranks are forked, ``DistOptimizer.update_param`` is wrapped so that every
rank records, for each Muon tensor of the steady steps (from step 2), the CPU time and the
preemptions of its ``newton_schulz`` phase (the phase clock's own figures) and the CPU migrations
(``se.nr_migrations`` of ``/proc/thread-self/sched``) during its update. At the first Muon tensor of
steps 3 and 5 each rank also times the microbenchmark's NS call
(:func:`costmodel.calibrate.microbench_ns.ns_calls`) ``--calls`` times per shape, call by call, with
the same counters, in the middle of the run (outside the NS phase, inside those steps' optimizer
phase, whose times this run therefore does not measure). Both ranks do this at about the same moment, as the
microbenchmark's ranks do. The output gives per shape the median of the calls that were not
preempted, the preemptions per call and the excess per preemption: the step's calls against the
microbenchmark's, in the same processes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import reference.optimizers as ropt
from costmodel.calibrate.microbench_ns import NS_POOL_BYTES, ns_calls
from reference.api import run_reference
from reference.instrument import thread_counters

BLOCK_SHAPES = ((64, 128), (128, 128), (256, 1024))
Sample = tuple[float, int, int]  # (thread CPU seconds, preemptions, migrations)


def migrations() -> int:
    """CPU migrations of this thread so far (0 where the kernel does not report them)."""
    try:
        with open("/proc/thread-self/sched", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("se.nr_migrations"):
                    return int(line.split()[-1])
    except OSError:
        pass
    return 0


def instrument(out_dir: str, calls: int) -> None:
    """Wrap ``DistOptimizer.update_param`` (inherited by the forked ranks) to record the samples."""
    original = ropt.DistOptimizer.update_param
    done: set[int] = set()
    rows: list[Any] = []

    def block_samples() -> dict[str, list[Sample]]:
        out: dict[str, list[Sample]] = {}
        for shape in BLOCK_SHAPES:
            call = ns_calls("bf16", [shape], NS_POOL_BYTES)[0]
            for _ in range(10):
                call()
            samples = []
            for _ in range(calls if shape[0] < 256 else max(10, calls // 3)):
                m, (_, p), t = migrations(), thread_counters(), time.thread_time()
                call()
                cpu = time.thread_time() - t
                samples.append((cpu, thread_counters()[1] - p, migrations() - m))
            out[str(shape)] = samples
        return out

    def update_param(self: Any, bucket: Any, name: str, step: int) -> None:
        muon = self.specs[name].optimizer == "muon"
        if muon and step in (3, 5) and step not in done:
            done.add(step)
            rows.append(["block", step, block_samples()])
        cpu, pre = self.clock.cpu_steps[-1], self.clock.preempt_steps[-1]
        ns_before, pre_before, m = cpu.get("newton_schulz", 0.0), pre.get("newton_schulz", 0.0), migrations()
        original(self, bucket, name, step)
        if muon and step >= 2:  # the phase clock's own CPU time and preemptions of the NS phase
            rows.append(["step", step, list(self.specs[name].local_shape), cpu.get("newton_schulz", 0.0) - ns_before,
                         int(pre.get("newton_schulz", 0.0) - pre_before), migrations() - m])
        if len(rows) >= 32 or (rows and rows[-1][0] == "block"):
            with open(Path(out_dir) / f"rank.{os.getpid()}.jsonl", "a", encoding="utf-8") as fh:
                fh.write("".join(json.dumps(r) + "\n" for r in rows))
            rows.clear()

    ropt.DistOptimizer.update_param = update_param  # type: ignore[method-assign]


def summary(samples: list[Sample]) -> str:
    """Median of the calls not preempted, preemptions and migrations per call, excess per preemption."""
    quiet = [t for t, p, _ in samples if p == 0]
    base = statistics.median(quiet) if quiet else float("nan")
    hit = [(t, p) for t, p, _ in samples if p > 0]
    per = sum(t - base for t, _ in hit) / sum(p for _, p in hit) if hit else 0.0
    n = len(samples)
    return (f"{base * 1e6:7.1f} us not preempted ({len(quiet)}/{n}), {sum(p for _, p, _ in samples) / n:.2f} "
            f"preemptions/call at +{per * 1e6:.0f} us, {sum(m for *_, m in samples) / n:.2f} migrations/call")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="many-small")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--calls", type=int, default=90, help="microbenchmark calls per shape and block")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        instrument(tmp, args.calls)
        print(f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        run_reference({"world_size": 2, "shapes": args.shapes, "steps": args.steps, "check": False,
                       "keep_freed_memory": True})
        print(f"load after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for path in sorted(Path(tmp).glob("rank.*.jsonl")):
            in_step: dict[str, list[Sample]] = defaultdict(list)
            blocked: dict[str, list[Sample]] = defaultdict(list)
            for line in path.read_text(encoding="utf-8").splitlines():
                row = json.loads(line)
                if row[0] == "block":
                    for shape, samples in row[2].items():
                        blocked[shape] += [tuple(s) for s in samples]
                else:
                    in_step[str(tuple(row[2]))].append((row[3], row[4], row[5]))
            print(f"process {path.name.split('.')[1]}:")
            for shape, samples in sorted(in_step.items(), key=lambda kv: -len(kv[1])):
                if len(samples) >= 20:
                    print(f"  {shape:12s} NS phase in the step      {summary(samples)}")
            for shape, samples in blocked.items():
                print(f"  {shape:12s} microbenchmark, blocked   {summary(samples)}")


if __name__ == "__main__":
    main()
