"""Does Megatron's combined 1F1B schedule (EP all-to-all overlap) serialize host and GPU? A replay.

With ``overlap_moe_expert_parallel_comm`` Megatron-Core runs the forward of one micro-batch and the
backward of another layer by layer, from one host thread, on a compute and a communication stream.
Megatron-Core 0.15.0 and 0.16.0 (the pins of releases 25.11 and 26.02),
``TransformerLayerSchedulePlan.run`` in ``models/common/model_chunk_schedule_plan.py``, issue per
layer pair, in this order::

    combine_bwd (comm) | attn_fwd (comp) | mlp_bwd (comp) | dispatch_fwd (comm) | mlp_bwd_dw (comp)
    | dispatch_bwd (comm) | mlp_fwd (comp) | combine_fwd (comm) | attn_bwd (comp) | attn_bwd_dw (comp)

Each micro-batch's nodes are chained by one CUDA event (``stream_acquire_context``). The one host
synchronisation per layer pair sits in ``dispatch_fwd``: the alltoall dispatcher's
``d2h_event.synchronize()`` at ``cuda_sync_point == "before_ep_alltoall"`` (token counts copied after
the router, in ``attn_fwd``), DeepEP's CPU wait for the received-token count in ``buffer.dispatch``
(which also waits for the communication stream, where ``combine_bwd`` runs), HybridEP's blocking
copy when ``num_permuted_tokens`` is unknown (dropless). This script replays that order with each
node's host seconds (its share of the framework time ``framework_host_s`` by operations, ``python_calls``, plus
``kernel_issue_s`` per uncaptured launch) and GPU seconds (``op_times_s``; the all-to-alls from the
layer's EP collectives), each kernel starting when issued and when its stream and event allow, and
prints the steady time per layer pair beside the model's plain per-pass sum and ``Σ host``,
``Σ host + Σ GPU``. It also reports the worst replay over 2,000 random splits of the same host time
over the ten nodes: the bound on what the ordering alone can cost a layer.

    python benchmarks/combined_1f1b_sync.py [RUN_ID ...]   (default: the megatron-bridge runs with EP overlap)
"""

from __future__ import annotations

import random
import sys

from costmodel.calibrate.profile import default_profile
from costmodel.calibrate.validation import scenario_for_run
from costmodel.cuda_graphs import GraphCapture
from costmodel.layer_comm import layer_compute, layer_kind_costs
from costmodel.layer_costs import (
    LAYER_GROUP_KINDS,
    framework_host_s,
    kernel_options,
    layer_ops,
    op_times_s,
    python_calls,
    rank_shape,
)
from topologies.placement import placement_for
from workloads.datasets import load_dataset
from workloads.scenario import Scenario

ORDER = ("combine_bwd", "attn_fwd", "mlp_bwd", "dispatch_fwd", "mlp_bwd_dw", "dispatch_bwd", "mlp_fwd",
         "combine_fwd", "attn_bwd", "attn_bwd_dw")
COMM = frozenset({"combine_bwd", "dispatch_fwd", "dispatch_bwd", "combine_fwd"})
CHAIN = {"dispatch_fwd": "attn_fwd", "mlp_fwd": "dispatch_fwd", "combine_fwd": "mlp_fwd",  # one event per micro-batch
         "mlp_bwd": "combine_bwd", "dispatch_bwd": "mlp_bwd", "attn_bwd": "dispatch_bwd"}
MLP_MODULES = frozenset({"moe", "moe_act", "mlp", "shared_experts"})


def replay_s(host_s: dict[str, float], gpu_s: dict[str, float], sync_waits: tuple[str, ...], layers: int = 60) -> float:
    """Steady seconds per layer pair of the combined schedule (module docstring): the host issues the
    nodes in ``ORDER`` and, at ``dispatch_fwd``, waits until the nodes ``sync_waits`` have finished on
    the GPU; a node's kernels start once issued, once its stream is free and once its micro-batch's
    previous node has finished, and cannot finish before the host has issued them."""
    t = 0.0
    free = {"comp": 0.0, "comm": 0.0}
    prev: dict[str, float] = {}
    ends = []
    for _ in range(layers):
        done: dict[str, float] = {}
        for n in ORDER:
            if n == "dispatch_fwd":
                t = max([t] + [done[w] for w in sync_waits])
            issued, t = t, t + host_s[n]
            stream = "comm" if n in COMM else "comp"
            ready = [free[stream], issued]
            if n in CHAIN:
                ready.append(done[CHAIN[n]])
            if n == "attn_fwd" and prev:
                ready.append(prev["combine_fwd"])
            if n == "combine_bwd" and prev:
                ready.append(prev["attn_bwd"])
            done[n] = free[stream] = max(max(ready) + gpu_s[n], t)
        prev = done
        ends.append(max(t, *done.values()))
    half = layers // 2
    return (ends[-1] - ends[half]) / (layers - 1 - half)


def nodes(scenario: Scenario) -> tuple[dict[str, float], dict[str, float], float]:
    """(host s, GPU s) per node of one MoE layer pair, and the model's plain forward + backward seconds."""
    p, system = scenario.par, scenario.system
    shape = rank_shape(scenario)
    capture = GraphCapture.of(scenario.runtime)
    ops = layer_ops(scenario.model, shape, "moe", p.recompute, tuple(p.recompute_modules))
    times = op_times_s(ops, system)
    framework = framework_host_s(ops, system, capture, "moe")
    delayed = scenario.runtime.delay_wgrad_compute
    host = dict.fromkeys(ORDER, system.efficiency.kernel_issue_s)  # a collective node: one launch
    gpu = dict.fromkeys(ORDER, 0.0)
    for pass_index, (seq, ts) in enumerate(zip((ops.forward, ops.backward), times, strict=True)):
        calls = sum(python_calls(o) for o in seq if not capture.captures(o, "moe")) or 1.0
        for o, t in zip(seq, ts, strict=True):
            side = "mlp" if o.module in MLP_MODULES else "attn"
            name = f"{side}_{'fwd' if pass_index == 0 else 'bwd'}"
            if pass_index == 1 and delayed and o.name.endswith(".wgrad") and o.kind in ("gemm", "grouped_gemm"):
                name += "_dw"
            if not capture.captures(o, "moe"):  # the uncaptured framework time, shared per operation
                host[name] += framework[pass_index] * python_calls(o) / calls + o.kernels * system.efficiency.kernel_issue_s
            gpu[name] += t
    placement = placement_for(scenario)
    shapes = {k: placement.shape(k) for k in LAYER_GROUP_KINDS}
    _, _, cf, cb = layer_kind_costs(scenario, shape, "moe", shapes, False)
    for blocks, a, b in ((cf, "dispatch_fwd", "combine_fwd"), (cb, "dispatch_bwd", "combine_bwd")):
        ep = sum(c.time_s for c in blocks if c.kind == "ep")
        gpu[a] += ep / 2
        gpu[b] += ep / 2
    c = layer_compute(scenario, shape, "moe")
    return host, gpu, c.forward_s + c.backward_s


def main() -> None:
    """Print the replay for the runs named on the command line (default: every EP-overlap run)."""
    profile = default_profile()
    runs = {r.run_id: r for r in load_dataset("megatron-bridge")}
    wanted = sys.argv[1:]
    rng = random.Random(1)
    print(f"{'run':58s} {'plain':>6s} {'Σhost':>6s} {'Σh+Σg':>6s} {'replay':>6s} {'worst':>6s} {'meas':>6s}  ms/layer pair")
    for run_id, run in runs.items():
        scenario = profile.apply(scenario_for_run(run))
        if wanted and run_id not in wanted or not wanted and not scenario.par.ep_comm_overlap:
            continue
        host, gpu, plain = nodes(scenario)
        rt = scenario.runtime
        waits = ("attn_fwd", "combine_bwd") if (rt.moe_token_dispatcher_type, rt.moe_flex_dispatcher_backend) == (
            "flex", "deepep") else ("attn_fwd",)
        if not kernel_options(scenario).dispatcher_host_sync:
            waits = ()
        total_h = sum(host.values())
        worst = 0.0
        for _ in range(2000):
            w = [rng.random() ** 2 for _ in ORDER]
            worst = max(worst, replay_s({n: total_h * x / sum(w) for n, x in zip(ORDER, w, strict=True)}, gpu, waits, 30))
        layer_pairs = scenario.num_microbatches * scenario.model.num_layers / scenario.par.pp
        print(f"{run_id.removeprefix('mb-')[:58]:58s} {plain * 1e3:6.2f} {total_h * 1e3:6.2f} "
              f"{(total_h + sum(gpu.values())) * 1e3:6.2f} {replay_s(host, gpu, waits) * 1e3:6.2f} {worst * 1e3:6.2f} "
              f"{run.step_time_s / layer_pairs * 1e3:6.2f}")


if __name__ == "__main__":
    main()
