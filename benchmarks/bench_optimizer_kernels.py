"""Kernel-level optimizer model vs the reference backend on this machine (issue 13 acceptance).

    python benchmarks/bench_optimizer_kernels.py [--repeats 3] [--presets small,many-small] [--local local.yaml]

Measures the machine (``muonsim calibrate --microbench``: GEMM rate and per-call cost, eager
dispatch cost per operator, element-wise bandwidth, NS efficiency) at the start of every repeat (the
shared VM's speed drifts by tens of percent within minutes; ``--local`` reads one profile instead),
then, per shape preset, runs the reference backend (2 gloo ranks, tp 1, Muon on the current
layer-wise layout, 5 steps) and prints per rank the measured ``newton_schulz`` and ``optimizer``
phases (wall time, and the thread CPU time that other processes on the cores do not inflate),
the kernel-level prediction and its error, and the FLOP-only prediction (NS FLOPs at the peak
matmul rate) and its error. The load average is printed before and after every run: the machine has
2 cores shared by several users, so compare the figures of quiet runs (load < ~2).
"""

from __future__ import annotations

import argparse
import statistics

from cli.reference_host import measure_reference_host
from costmodel.calibrate.microbench import measure_local
from costmodel.calibrate.profile import LocalMeasurements, load_profile
from costmodel.calibrate.reference_check import check_reference_run
from reference.allocator import keep_freed_memory
from reference.api import run_reference
from reference.workload import load_shapes


def load_average() -> str:
    """The 1-, 5- and 15-minute load averages of this machine."""
    with open("/proc/loadavg", encoding="utf-8") as fh:
        return " ".join(fh.read().split()[:3])


def local_measurements(path: str | None) -> LocalMeasurements:
    """The local profile from ``path``, or measured now."""
    if path:
        local = load_profile(path).local
        if local is None:
            raise SystemExit(f"{path} has no local measurements; write one with 'muonsim calibrate --microbench'")
        return local
    print(f"load before microbench: {load_average()}")
    local = measure_reference_host(measure_local(rank_setup=keep_freed_memory))  # the ranks' default allocator
    print(f"load after microbench:  {load_average()}")
    return local


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--presets", default="small,many-small")
    parser.add_argument("--local", default=None, help="local profile YAML (default: measure now)")
    parser.add_argument("--keep-freed-memory", default="on", choices=("on", "off", "both"),
                        help="the ranks' allocator setting (reference/allocator.py); 'both' runs off then on")
    args = parser.parse_args()
    errors: dict[tuple[str, str, str], list[float]] = {}
    for rep in range(args.repeats):
        local = local_measurements(args.local)
        ns = local.newton_schulz.get("bf16")
        print(f"\nrepeat {rep + 1}: bf16 GEMM {local.gemm_flops_per_s['bf16'] / 1e9:.0f} GFLOP/s + "
              f"{local.gemm_overhead_s.get('bf16', 0.0) * 1e6:.1f} us/call, dispatch {(local.dispatch_s or 0) * 1e6:.2f} "
              f"us/op, element-wise {(local.memory_Bps or 0) / 1e9:.0f} GB/s"
              + (f", NS GEMM efficiency {ns.efficiency:.2f}, +{ns.gemm_setup_s * 1e6:.1f} us/GEMM, "
                 f"{ns.call_overhead_s * 1e6:.0f} us/call, "
                 f"{ns.shape_change_s * 1e6:.0f} us/shape change" if ns else "")
              + f"; reference host layers {(local.muon_update_host_s or 0) * 1e6:.0f} us/tensor + "
                f"{(local.muon_orthogonalize_host_s or 0) * 1e6:.0f} us/NS call")
        keeps = {"on": (True,), "off": (False,), "both": (False, True)}[args.keep_freed_memory]
        for preset, keep in ((p, k) for p in args.presets.split(",") for k in keeps):
            before = load_average()
            run = run_reference({"world_size": 2, "shapes": preset, "steps": 5, "check": False, "keep_freed_memory": keep})
            after = load_average()
            check = check_reference_run(run.to_measured_run(), local, load_shapes(preset))
            label = f"{preset}{'' if len(keeps) == 1 else ' keep-freed-memory ' + ('on' if keep else 'off')}"
            print(f"{label}: load {before} -> {after}; collectives {'exact' if check.collectives_match else 'MISMATCH'}")
            for p in check.phases:
                if p.phase not in ("newton_schulz", "optimizer"):
                    continue
                cpu = p.measured_cpu_s or 0.0
                print(f"  rank {p.rank} {p.phase:13s} wall {p.measured_s * 1e3:8.1f} ms  CPU {cpu * 1e3:8.1f} ms  "
                      f"kernel model {p.predicted_s * 1e3:8.1f} ms ({p.error_pct:+6.1f} % wall, {p.cpu_error_pct:+6.1f} % CPU)"
                      f"  FLOP-only {(p.flop_only_s or 0) * 1e3:7.1f} ms ({p.flop_only_error_pct:+6.1f} % wall)"
                      f"  page faults {p.measured_faults or 0:.0f}  preemptions {p.measured_preemptions or 0:.0f}")
                for kind, value in (("wall", p.error_pct), ("cpu", p.cpu_error_pct), ("flop-only", p.flop_only_error_pct)):
                    errors.setdefault((label, p.phase, kind), []).append(value)
    print("\nmedian error over ranks and repeats (kernel model vs wall / CPU time; FLOP-only vs wall):")
    for (preset, phase, kind), values in errors.items():
        print(f"  {preset:30s} {phase:13s} {kind:9s} {statistics.median(values):+6.1f} % "
              f"(range {min(values):+6.1f} .. {max(values):+6.1f} %)")


if __name__ == "__main__":
    main()
