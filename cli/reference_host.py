"""The reference's per-tensor host layers measured on this machine (``calibrate --microbench``).

Glue between :mod:`reference.host_probe` (the reference's own update of a tiny Muon matrix) and the
local profile: the probe's thread CPU time minus its kernels at this machine's measured prices is the
Python the kernel model does not price. Two quantities (``LocalMeasurements``):

* ``muon_orthogonalize_host_s``: one orthogonaliser call (``orthogonalize_param``) minus the
  microbenchmark's own NS function on the same input (whose host work the NS fit already holds)
  minus the two scale kernels;
* ``muon_update_host_s``: one ``update_param`` minus its orthogonaliser call minus its kernels
  outside the orthogonalisation (weight decay, momentum, the reference's clone, update, bf16 copy).

The three calls are timed in alternating rounds (thread CPU time, the mean of each round, the median of the rounds), one torch thread as
the ranks run.
"""

from __future__ import annotations

import statistics

from costmodel.calibrate.profile import LocalMeasurements

ROUNDS = 7


def measure_reference_host(local: LocalMeasurements, dtype: str = "bf16") -> LocalMeasurements:
    """``local`` with the reference's per-tensor host layers measured (see the module docstring)."""
    import torch

    from costmodel.calibrate.microbench_ns import measure_cpu_s, newton_schulz_replica
    from costmodel.calibrate.reference_check import reference_rank_kernels
    from costmodel.optimizer.kernel_sequence import OUTSIDE_ORTHOGONALIZE
    from reference.host_probe import muon_probe
    from reference.workload import load_shapes

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        probe = muon_probe()
        ns = newton_schulz_replica(dtype)
        calls = {"update": probe.update, "orthogonalize": probe.orthogonalize, "ns": lambda: ns(probe.momentum)}
        times: dict[str, list[float]] = {k: [] for k in calls}
        for _ in range(ROUNDS):
            for key, fn in calls.items():
                times[key].append(measure_cpu_s(fn, min_time_s=0.02, min_reps=20))
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
