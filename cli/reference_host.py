"""The reference's per-tensor host layers measured on this machine (``calibrate --microbench``).

Glue between :mod:`reference.host_probe` (the reference's own update of a tiny Muon matrix) and the
local profile: the probe's thread CPU time minus its kernels at this machine's measured prices is the
Python the kernel model does not price. Two quantities (``LocalMeasurements``):

* ``muon_orthogonalize_host_s``: one orthogonaliser call (``orthogonalize_param``) minus the
  microbenchmark's own NS function on the same input (whose host work the NS fit already holds)
  minus the two scale kernels;
* ``muon_update_host_s``: one ``update_param`` minus its orthogonaliser call minus its kernels
  outside the orthogonalisation (weight decay, momentum, the reference's clone, update, bf16 copy).

**The step's context.** In a step every tensor's update runs after the previous tensor's
Newton–Schulz call, and a call on oneDNN's main GEMM path (any NS shape above the small-matrix
path) evicts the caches that hold the interpreter's and the dispatcher's code and data (the update's
Python, the views, each operator's dispatch path): the update then runs them cold. Timed back to
back, as the probe first was, they stay warm. On this VM (``many-small`` rank 0, in one process, per
tensor, thread CPU time) the first ``bucket.param(name)`` view after the update's ``add_`` takes
24 µs, the same view repeated at once 5 µs; ``update_param`` beyond its orthogonaliser call takes
42–47 µs back to back and 79–92 µs after an NS call of 64×128 or 128×128 or after a 4 MiB write,
and 45–50 µs after a 16×16 call (small-matrix path: no eviction). So each probe call here is timed
alone, right after the microbenchmark's NS call on :data:`CONTEXT_NS_SHAPE` (outside the timed
span), as the step runs it; the context NS call's own cost is not counted, and the three calls
(update, orthogonalise, NS) are all timed after it, so the differences above hold the host layers
run cold and nothing of the context call.

The three calls are timed in alternating rounds (thread CPU time, the mean of each round, the median
of the rounds), one torch thread as the ranks run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from costmodel.calibrate.profile import LocalMeasurements

ROUNDS = 7
CALLS_PER_ROUND = 30
CONTEXT_NS_SHAPE = (128, 128)  # the NS call before each timed call: on the main GEMM path (evicts)


def cpu_s_after(fn: Callable[[], object], before: Callable[[], object], calls: int = CALLS_PER_ROUND) -> float:
    """Mean thread CPU seconds of ``fn`` when each call follows ``before`` (which is not timed)."""
    total = 0.0
    for _ in range(calls):
        before()
        t0 = time.thread_time()
        fn()
        total += time.thread_time() - t0
    return total / calls


def measure_reference_host(local: LocalMeasurements, dtype: str = "bf16") -> LocalMeasurements:
    """``local`` with the reference's per-tensor host layers measured (see the module docstring)."""
    import torch

    from costmodel.calibrate.microbench_ns import NS_POOL_BYTES, newton_schulz_replica, ns_calls
    from costmodel.calibrate.reference_check import reference_rank_kernels
    from costmodel.optimizer.kernel_sequence import OUTSIDE_ORTHOGONALIZE
    from reference.host_probe import muon_probe
    from reference.workload import load_shapes

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        probe = muon_probe()
        ns = newton_schulz_replica(dtype)
        context = ns_calls(dtype, [CONTEXT_NS_SHAPE], NS_POOL_BYTES)[0]
        calls = {"update": probe.update, "orthogonalize": probe.orthogonalize, "ns": lambda: ns(probe.momentum)}
        for fn in (*calls.values(), context):  # warm-up (first calls build oneDNN primitives)
            fn()
        times: dict[str, list[float]] = {k: [] for k in calls}
        for _ in range(ROUNDS):
            for key, fn in calls.items():
                times[key].append(cpu_s_after(fn, context))
    finally:
        torch.set_num_threads(previous)
    t = {k: statistics.median(v) for k, v in times.items()}
    rk = reference_rank_kernels(load_shapes(probe.config["shapes"]), probe.config, 0)
    i = rk.names.index(probe.name)
    outside = [k for k in rk.muon[i] if k.name in OUTSIDE_ORTHOGONALIZE] + [rk.clones[i]]
    scale = [k for k in rk.muon[i] if k.name == "scale"]
    return local.model_copy(update={
        "muon_orthogonalize_host_s": max(0.0, t["orthogonalize"] - t["ns"] - local.kernels_time_s(scale)),
        "muon_update_host_s": max(0.0, t["update"] - t["orthogonalize"] - local.kernels_time_s(outside)),
    })
