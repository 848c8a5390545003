"""Host work per Muon tensor in the reference beyond its kernels (process CPU time, one process).

    python benchmarks/bench_optimizer_host.py [--shapes small,many-small] [--rank 0] [--repeats 21]

For each distinct plain Muon matrix of a rank (tp 1, built in this process with
:func:`reference.op_count.optimizer_for_rank`, the allocator keeping freed memory), times the
reference's ``update_param`` against the same computing operators issued as bare torch calls on
the same tensors in the same order (the two operator lists are recorded and must be equal), in
alternation, and prints the difference: the reference's Python layers and views (bucket views,
phase clock, state lookup, ``muon_prepare``/``muon_apply``, ``orthogonalize_param``, the
Newton-Schulz wrappers and counters, ``F.normalize``) as they run between the kernels. CPU time of
one process: other processes on the cores matter less than for wall time, but the VM's speed still
drifts; the load average is printed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from collections.abc import Callable

import torch

from reference.allocator import keep_freed_memory
from reference.config import make_config
from reference.op_count import OperatorRecorder, optimizer_for_rank


def _cpu_s(fn: Callable[[], object], reps: int) -> float:
    t = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - t) / reps


def _reference_update(opt, name: str) -> Callable[[], None]:  # noqa: ANN001 - DistOptimizer
    """``opt.update_param`` of ``name`` (a steady step)."""
    bucket = next(b for b in opt.buckets if name in b.names())
    return lambda: opt.update_param(bucket, name, 5)


def _bare_update(opt, name: str) -> Callable[[], None]:  # noqa: ANN001 - DistOptimizer
    """The computing operators of ``opt.update_param(bucket, name, step)`` as bare torch calls."""
    bucket = next(b for b in opt.buckets if name in b.names())
    st, h = opt.state[name], opt.muon
    grad, param, master, buf = bucket.grad(name), bucket.param(name), st.master, st.buf
    tall = grad.shape[0] > grad.shape[1]
    coefficients = h.schedule.for_steps(h.ns_steps)

    def update() -> None:
        master.add_(master, alpha=-h.weight_decay * h.lr)
        buf.lerp_(grad, 1 - h.momentum)
        u = buf.clone()
        x = u.mT if tall else u
        x = torch.div(x, torch.linalg.vector_norm(x, 2, (-2, -1), True).clamp_min(h.eps)).to(torch.bfloat16)
        for a, b, c in coefficients:
            gram = torch.mm(x, x.mT)
            x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
        x = x.to(torch.float32)
        out = (x.mT if tall else x) * 1.0 * 1.0
        master.add_(out, alpha=-h.lr)
        param.copy_(master)

    return update


def _ops(fn: Callable[[], object]) -> Counter[str]:
    rec = OperatorRecorder()
    with rec:
        fn()
    return sum(rec.compute.values(), Counter())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="small,many-small")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    torch.set_num_threads(1)
    keep_freed_memory()
    with open("/proc/loadavg", encoding="utf-8") as fh:
        print(f"load {' '.join(fh.read().split()[:3])}")
    for shapes in args.shapes.split(","):
        opt = optimizer_for_rank(make_config(world_size=2, shapes=shapes, check=False), args.rank)
        opt.step(1)
        groups: dict[tuple[int, ...], list[str]] = {}
        for name in sorted(opt.state, key=lambda n: opt.specs[n].order):
            if not opt.specs[name].qkv_groups and opt.specs[name].optimizer == "muon":
                groups.setdefault(tuple(opt.specs[name].local_shape), []).append(name)
        total_ref = total_bare = 0.0
        for shape, names in groups.items():
            ref = _reference_update(opt, names[0])
            bare = _bare_update(opt, names[0])
            if _ops(ref) != _ops(bare):
                raise SystemExit(f"{shape}: operator lists differ: {_ops(ref)} vs {_ops(bare)}")
            reps = max(2, int(3000 / (shape[0] * shape[1]) ** 0.5))
            a, b = [], []
            for i in range(args.repeats):
                first, second = (ref, bare) if i % 2 else (bare, ref)
                t1, t2 = _cpu_s(first, reps), _cpu_s(second, reps)
                a.append(t1 if i % 2 else t2)
                b.append(t2 if i % 2 else t1)
            diff = sorted(x - y for x, y in zip(a, b, strict=True))
            q = len(diff) // 4
            print(f"{shapes:10s} {str(shape):12s} x{len(names):3d}: reference {statistics.median(a) * 1e6:8.1f} us, "
                  f"same operators bare {statistics.median(b) * 1e6:8.1f} us, host work "
                  f"{statistics.median(diff) * 1e6:+7.1f} us (quartiles {diff[q] * 1e6:+.1f} .. {diff[-q - 1] * 1e6:+.1f})")
            total_ref += len(names) * statistics.median(a)
            total_bare += len(names) * statistics.median(b)
        print(f"{shapes:10s} plain Muon matrices of rank {args.rank}: reference {total_ref * 1e3:.2f} ms, bare "
              f"{total_bare * 1e3:.2f} ms, host work {(total_ref - total_bare) * 1e3:.2f} ms "
              f"({100 * (total_ref - total_bare) / total_ref:.1f} % of the reference)")


if __name__ == "__main__":
    main()
