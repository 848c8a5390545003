"""The reference's orthogonaliser call against the microbenchmark's NS call on the same input (thread CPU).

    python benchmarks/bench_ns_orthogonalizer.py [--shapes small] [--rounds 5]

For every distinct Muon matrix shape of one rank (tp 1; fused QKV skipped), times in alternating
rounds on one input (one torch thread, the ranks' allocator): the reference's orthogonaliser call
as a step makes it (``opt.ortho``: Newton-Schulz, then ``orth * scale * extra``, and its FLOP
counter), the reference's ``newton_schulz`` alone, the microbenchmark's NS function
(:func:`costmodel.calibrate.microbench_ns.newton_schulz_replica`) and that function followed by the
two scale products. The ratios to the microbenchmark's call say how much of an orthogonaliser call
is the scale (which the kernel model prices as two element-wise kernels of the NS phase) and how
much is the reference's own NS code. One process: compare columns, not runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

from costmodel.calibrate.microbench_ns import newton_schulz_replica
from costmodel.calibrate.timing import time_call
from reference.allocator import keep_freed_memory
from reference.config import make_config
from reference.newton_schulz import newton_schulz
from reference.op_count import optimizer_for_rank
from reference.optimizers import matrix_info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="small")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    keep_freed_memory()
    opt = optimizer_for_rank(make_config(world_size=2, shapes=args.shapes, check=False), 0)
    h = opt.muon
    replica = newton_schulz_replica(h.precision)

    def scaled(u: torch.Tensor) -> torch.Tensor:
        return replica(u) * 1.5 * h.extra_scale  # type: ignore[no-any-return]

    print(f"{args.shapes} rank 0: load {os.getloadavg()[0]:.2f}")
    seen: set[tuple[int, int]] = set()
    for spec in opt.specs.values():
        if spec.optimizer != "muon":
            continue
        info = matrix_info(spec)
        shape = (int(info.global_shape[0]), int(info.global_shape[1]))
        if info.qkv_groups or shape in seen:
            continue
        seen.add(shape)
        u = torch.randn(*shape)
        calls: dict[str, Callable[[], object]] = {
            "orthogonaliser": partial(opt.ortho, u, info.global_shape, info),
            "reference NS": partial(newton_schulz, u, h.schedule, h.ns_steps, h.precision, h.eps, None, h.normalize_in),
            "microbench NS": partial(replica, u),
            "microbench NS + scale": partial(scaled, u),
        }
        times: dict[str, list[float]] = {k: [] for k in calls}
        for _ in range(args.rounds):
            for key, fn in calls.items():
                times[key].append(time_call(fn, 0.04, clock=time.thread_time))
        base = statistics.median(times["microbench NS"])
        print(f"  {shape[0]:5d}x{shape[1]:<5d} " + "  ".join(
            f"{k} {statistics.median(v) * 1e6:6.0f} us ({statistics.median(v) / base:.2f})" for k, v in times.items()))
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
