"""Newton-Schulz calls in the reference's step against the same calls repeated at once (thread CPU time).

    python benchmarks/bench_ns_shape_change.py [--shapes small,many-small] [--rank 0] [--steps 6]

Builds one rank's optimizer in this process (tp 1, :func:`reference.op_count.optimizer_for_rank`,
the allocator keeping freed memory) and runs its steps; every orthogonaliser call is timed as it
comes in the step and then repeated at once on the same input (hot: same code, same primitives, same
temporaries). Calls are grouped by shape and by whether the previous NS call had the same shape.
The excess of the first call over the repeat is what a step costs beyond a block of equal calls:
large after another shape (the GEMM code and primitives of the new shape and the temporaries of the
new size are cold), small after the same shape (the tensor's own input from memory). One process:
the load average is printed, compare the two columns, not runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from typing import Any

import torch

from reference.allocator import keep_freed_memory
from reference.config import make_config
from reference.op_count import optimizer_for_rank


def _load() -> str:
    with open("/proc/loadavg", encoding="utf-8") as fh:
        return " ".join(fh.read().split()[:3])


def measure(shapes: str, rank: int, steps: int) -> list[tuple[tuple[int, int], bool, float, float]]:
    """(shape, previous call had the same shape, seconds as it came, seconds repeated at once) of
    every NS call of the steady steps (all but the first two)."""
    opt = optimizer_for_rank(make_config(world_size=2, shapes=shapes, check=False), rank)
    ortho = opt.ortho
    rec: list[tuple[tuple[int, int], bool, float, float]] = []
    prev: list[Any] = [None]

    def timed(u: torch.Tensor, global_shape: tuple[int, int], info: Any) -> torch.Tensor:
        t = time.thread_time()
        out = ortho(u, global_shape, info)
        first = time.thread_time() - t
        t = time.thread_time()
        ortho(u, global_shape, info)
        again = time.thread_time() - t
        shape = (int(u.shape[0]), int(u.shape[1]))
        rec.append((shape, prev[0] == shape, first, again))
        prev[0] = shape
        return out

    opt.ortho = timed
    for step in range(1, steps + 1):
        if step == 3:
            rec.clear()
        opt.step(step)
    opt.ortho = ortho
    return rec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="small,many-small")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(1)
    keep_freed_memory()
    for shapes in args.shapes.split(","):
        print(f"{shapes} rank {args.rank}: load {_load()}")
        rec = measure(shapes, args.rank, args.steps)
        groups: dict[tuple[tuple[int, int], bool], list[tuple[float, float]]] = defaultdict(list)
        for shape, same, first, again in rec:
            groups[(shape, same)].append((first, again))
        for (shape, same), v in sorted(groups.items()):
            first = statistics.median(f for f, _ in v)
            again = statistics.median(a for _, a in v)
            print(f"  {str(shape):12s} after {'the same' if same else 'another':8s} shape, {len(v):4d} calls: in the step "
                  f"{first * 1e6:8.1f} us, repeated at once {again * 1e6:8.1f} us, {1e6 * (first - again):+7.1f} us")
        total_first, total_again = sum(r[2] for r in rec), sum(r[3] for r in rec)
        print(f"  all NS calls: in the step / repeated at once = {total_first / total_again:.3f}; load {_load()}")


if __name__ == "__main__":
    main()
