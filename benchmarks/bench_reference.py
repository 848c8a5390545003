"""Reference backend figures on this machine: Newton–Schulz GFLOP/s and phase times of 2-rank runs.

Usage: ``python benchmarks/bench_reference.py [--shapes small,many-small] [--steps 4] [--world-size 2]``.
Prints one block per shape preset (or model file) and configuration: step time, per-phase times
(mean per step over the timed steps, max over ranks) and Newton–Schulz FLOPs / GFLOP/s per rank. Gloo on loopback measures
semantics and byte counts; its times say nothing about NVLink or InfiniBand.
"""

from __future__ import annotations

import argparse
import time


def shape_list(text: str) -> list[str]:
    """argparse type: comma-separated shape presets or model files (reference.workload.shape_names)."""
    from reference.workload import shape_names
    from topologies.inputs import UserInputError

    try:
        return shape_names(text)
    except UserInputError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


CONFIGS = {
    "muon layer-wise current, bf16 NS": dict(optimizer="muon", layout="current", matmul_precision="bf16"),
    "muon layer-wise current, fp32 NS": dict(optimizer="muon", layout="current", matmul_precision="fp32"),
    "muon layer-wise legacy, bf16 NS": dict(optimizer="muon", layout="legacy", matmul_precision="bf16"),
    "adamw element-wise": dict(optimizer="adamw"),
    # the parameter all-gather overlapped with the next forward: compare exposed_wait with the line above
    "adamw element-wise, param gather hidden": dict(optimizer="adamw", hide_param_gather=True),
    "muon layer-wise current, bf16 NS, param gather hidden": dict(optimizer="muon", layout="current",
                                                                  hide_param_gather=True),
}


def main() -> None:
    """Run each configuration once and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=shape_list, default="small",
                        help="comma-separated presets (tiny, tiny-dense, small, many-small) or model files")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--forward-tokens", type=int, default=256)
    args = parser.parse_args()

    from reference.api import run_reference

    for shapes, (title, extra) in ((s, c) for s in args.shapes for c in CONFIGS.items()):
        t = time.perf_counter()
        r = run_reference(dict(world_size=args.world_size, shapes=shapes, steps=args.steps,
                               forward_tokens=args.forward_tokens, check=False, **extra))
        wall = time.perf_counter() - t
        print(f"== {title}: world {args.world_size}, shapes {shapes}, {args.steps} steps "
              f"(first is warm-up), wall {wall:.1f} s")
        print(f"   step time            {r.step_time_s * 1e3:9.2f} ms")
        for phase, secs in r.phase_times_s.items():
            print(f"   {phase:<20} {secs * 1e3:9.2f} ms")
        for rank in sorted(r.ns_flops_by_rank):
            flops, rate = r.ns_flops_by_rank[rank], r.ns_gflops_per_s_by_rank[rank]
            if flops:
                print(f"   rank {rank}: Newton-Schulz {flops / 1e9:.3f} GFLOP/step at {rate:.1f} GFLOP/s")
        moved = sum(c.bytes * c.count for c in r.collectives)
        print(f"   collectives on rank 0: {sum(c.count for c in r.collectives)} calls, {moved / 1e6:.2f} MB (nccl-tests size)")


if __name__ == "__main__":
    main()
