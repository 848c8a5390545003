"""Orthogonaliser calls in the reference's step against the microbenchmark's NS call, interleaved (thread CPU).

    python benchmarks/bench_ns_in_step.py [--shapes many-small] [--rank 0] [--steps 7]
                                          [--orthogonaliser reference,replica] [--calls 30]

Builds one rank's optimizer in this process (tp 1, :func:`reference.op_count.optimizer_for_rank`,
the allocator keeping freed memory) and runs its steps. Every orthogonaliser call of the steady steps
(from step 3) is timed as the step makes it, with the preemptions (involuntary context switches) it
suffered; after every step, the microbenchmark's NS call
(:func:`costmodel.calibrate.microbench_ns.ns_calls`, pool inputs) is timed ``--calls`` times per
shape, call by call, in the same process: the step and the block alternate, so the VM's drift (tens
of percent within minutes) hits both alike. ``--orthogonaliser replica`` swaps the reference's
orthogonaliser (``TensorParallelNS``: Newton-Schulz, FLOP counter, ``orth * scale * extra``) for the
microbenchmark's NS function followed by the two scale products: the same step, the same tensors,
the microbenchmark's code. So the ratio in-step / blocked splits the gap between the step's context
(replica in the step vs in a block) and the reference's orthogonaliser code (reference vs replica
in the step). Medians over calls that were not preempted; a preempted call's excess is printed per
preemption (a preemption hands the core to another process, whose data evicts this one's caches).
The load average is printed: compare the columns of one run, not runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from costmodel.calibrate.microbench_ns import NS_POOL_BYTES, newton_schulz_replica, ns_calls
from reference.allocator import keep_freed_memory
from reference.config import make_config
from reference.instrument import thread_counters
from reference.newton_schulz import scale_factor
from reference.op_count import optimizer_for_rank

Sample = tuple[float, int]  # (thread CPU seconds, preemptions)


def timed(fn: Callable[[], Any]) -> tuple[Any, Sample]:
    """``fn()`` and its (thread CPU seconds, preemptions)."""
    _, pre = thread_counters()
    t = time.thread_time()
    out = fn()
    cpu = time.thread_time() - t
    return out, (cpu, thread_counters()[1] - pre)


def summary(samples: list[Sample]) -> tuple[float, float, float]:
    """(median seconds of the calls not preempted, preemptions per call, excess seconds per preemption)."""
    quiet = [t for t, p in samples if p == 0]
    base = statistics.median(quiet) if quiet else float("nan")
    hit = [(t, p) for t, p in samples if p > 0]
    per = sum(t - base for t, _ in hit) / sum(p for _, p in hit) if hit else 0.0
    return base, sum(p for _, p in samples) / len(samples), per


def measure(shapes: str, rank: int, steps: int, which: str, calls: int
            ) -> tuple[dict[tuple[int, int], list[Sample]], dict[tuple[int, int], list[Sample]]]:
    """(in-step orthogonaliser samples, blocked microbenchmark samples) per matrix shape."""
    opt = optimizer_for_rank(make_config(world_size=2, shapes=shapes, check=False), rank)
    reference = opt.ortho
    replica = newton_schulz_replica(opt.muon.precision)
    in_step: dict[tuple[int, int], list[Sample]] = defaultdict(list)
    recording = [False]

    def orthogonalise(u: torch.Tensor, global_shape: tuple[int, int], info: Any) -> torch.Tensor:
        if which == "replica":  # the microbenchmark's NS, then EO's two scale products
            scale = scale_factor(*global_shape, opt.muon.scale_mode)

            def call() -> Any:
                return replica(u) * scale * opt.muon.extra_scale
        else:
            def call() -> Any:
                return reference(u, global_shape, info)
        out, sample = timed(call)
        if recording[0]:
            in_step[(int(u.shape[0]), int(u.shape[1]))].append(sample)
        return out  # type: ignore[no-any-return]

    opt.ortho = orthogonalise
    for step in range(1, 3):  # warm-up: states, buckets, primitives of every shape
        opt.clock.new_step()
        opt.step(step)
    recording[0] = True
    opt.clock.new_step()
    opt.step(3)
    common = sorted(in_step, key=lambda s: -len(in_step[s]))[:3]
    blocks = {s: ns_calls(opt.muon.precision, [s], NS_POOL_BYTES)[0] for s in common}
    blocked: dict[tuple[int, int], list[Sample]] = defaultdict(list)
    for block in blocks.values():
        for _ in range(5):
            block()
    for step in range(4, steps + 1):
        opt.clock.new_step()
        opt.step(step)
        for s, block in blocks.items():
            blocked[s] += [timed(block)[1] for _ in range(calls)]
    opt.ortho = reference
    return {s: in_step[s] for s in common}, blocked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="many-small")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--orthogonaliser", default="reference,replica")
    parser.add_argument("--calls", type=int, default=30, help="microbenchmark calls per shape after each step")
    args = parser.parse_args()
    torch.set_num_threads(1)
    keep_freed_memory()
    for which in args.orthogonaliser.split(","):
        print(f"{args.shapes} rank {args.rank}, orthogonaliser in the step: {which}; load {os.getloadavg()[0]:.2f}")
        in_step, blocked = measure(args.shapes, args.rank, args.steps, which, args.calls)
        for s in in_step:
            (a, pa, ea), (b, pb, eb) = summary(in_step[s]), summary(blocked[s])
            print(f"  {str(s):12s} in the step {a * 1e6:7.1f} us ({len(in_step[s])} calls, {pa:.2f} preemptions/call, "
                  f"+{ea * 1e6:.0f} us each)  blocked microbenchmark {b * 1e6:7.1f} us ({pb:.2f}/call, "
                  f"+{eb * 1e6:.0f} us each)  ratio {a / b:.3f}")
        print(f"  load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
