"""Memory per GPU of every published Megatron-Bridge layout, with the recipe settings each run used.

Prints, per distinct layout (runs of several releases with the same layout and memory are one row),
the peak per GPU of its most loaded stage against the GPU's HBM, the main components and the
memory-relevant settings, then the runs that do not fit. ``tests/test_memory_settings.py`` holds
the list of runs that do not fit (with the reasons); this script prints the figures behind it.

Usage: ``python benchmarks/memory_published.py [--all]`` (``--all``: one row per run).
"""

from __future__ import annotations

import sys
from collections import OrderedDict


def _settings(sc) -> str:  # noqa: ANN001 - workloads.scenario.Scenario
    p, o, rt = sc.par, sc.optimizer, sc.runtime
    parts = []
    if p.recompute != "none":
        parts.append(f"rc {p.recompute}" + (f":{'+'.join(p.recompute_modules)}" if p.recompute == "selective" else ""))
    if rt.cpu_offloading:
        parts.append(f"offload {rt.cpu_offloading_num_layers}")
    if p.fsdp:
        parts.append(f"fsdp {o.data_parallel_sharding_strategy}")
    if o.fp8_param_gather:
        parts.append("fp8 params" + (" reuse" if o.reuse_grad_buf_for_mxfp8_param_ag else ""))
    if o.use_precision_aware_optimizer:
        parts.append(f"PA {o.exp_avg_dtype}")
    parts.append(f"grads {o.grad_reduce_dtype}")
    return ", ".join(parts)


def main() -> None:
    from costmodel.calibrate.validation import scenario_for_run
    from workloads.datasets import load_dataset
    from workloads.memory import memory_breakdown

    per_run = "--all" in sys.argv
    rows: OrderedDict[tuple, list] = OrderedDict()
    over = []
    for run in sorted(load_dataset("megatron-bridge"), key=lambda r: (r.model, r.system, r.precision.value, r.release)):
        sc = scenario_for_run(run)
        m = memory_breakdown(sc)
        p = sc.par
        layout = f"tp{p.tp} pp{p.pp} vpp{p.vpp} cp{p.cp} ep{p.ep} mbs{p.micro_batch_size}" + (f" fsdp{p.fsdp}" if p.fsdp else "")
        key = (run.run_id,) if per_run else (run.model, run.system, run.precision.value, layout, _settings(sc),
                                            round(m.total_bytes / 1e9, 1))
        rows.setdefault(key, [run, sc, m, layout, []])[4].append(run.release)
        if not m.fits():
            over.append((run.run_id, m.total_bytes / 1e9, m.capacity_bytes / 1e9))
    print(f"{'model':<16} {'system':<12} {'prec':<6} {'layout':<34} {'peak/HBM GB':>12} {'use':>5}  "
          f"{'w+buf':>6} {'grad':>5} {'opt':>5} {'ws':>5} {'act':>6}  settings; releases")
    for run, sc, m, layout, releases in rows.values():
        c = {k: v / 1e9 for k, v in m.components_bytes.items()}
        print(f"{run.model:<16} {run.system:<12} {run.precision.value:<6} {layout:<34} "
              f"{m.total_bytes / 1e9:6.0f}/{m.capacity_bytes / 1e9:<5.0f} {m.total_bytes / m.capacity_bytes:5.0%}  "
              f"{c['weights'] + c['weight_buffers']:6.1f} {c['gradients']:5.1f} {c['optimizer_state']:5.1f} "
              f"{c['optimizer_workspace']:5.1f} {c['activations']:6.1f}  {_settings(sc)}; {' '.join(releases)}")
    print(f"\n{len(rows)} rows; runs that do not fit: {len(over)}")
    for rid, need, cap in over:
        print(f"  {rid}: {need:.0f} GB of {cap:.0f} GB")


if __name__ == "__main__":
    main()
