"""Reference runs vs the cost model on this machine: collective lists and Newton-Schulz time.

    python benchmarks/bench_reference_check.py [--repeats 2] [--shapes small,many-small]

Measures the machine (`muonsim calibrate --microbench`), runs 2-rank reference configurations on
local gloo processes and prints, per configuration and rank, whether the collective list equals
the cost model's exactly, the NS FLOPs (measured vs modelled) and the NS time error. Timings on a
shared 2-core machine vary with the load: run it when the machine is quiet and repeat.
"""

from __future__ import annotations

import argparse
import statistics

from costmodel.calibrate.microbench import measure_local
from costmodel.calibrate.reference_check import check_reference_run
from reference.allocator import keep_freed_memory
from reference.api import run_reference
from reference.workload import load_shapes, shape_names
from topologies.inputs import UserInputError


def _shape_list(text: str) -> list[str]:
    try:
        return shape_names(text)
    except UserInputError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


CONFIGS = {
    "layer_wise tp1": {},
    "layer_wise legacy": {"layout": "legacy"},
    "tp2 duplicated": {"tp": 2, "tp_mode": "duplicated"},
    "tp2 distributed": {"tp": 2, "tp_mode": "distributed"},
    "tp2 blockwise": {"tp": 2, "tp_mode": "blockwise"},
    "adamw element_wise": {"optimizer": "adamw"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--shapes", type=_shape_list, default="small,many-small",
                        help="comma-separated presets (tiny, tiny-dense, small, many-small) or model files")
    args = parser.parse_args()
    local = measure_local(rank_setup=keep_freed_memory)  # the reference ranks' default allocator
    ns = local.newton_schulz.get("bf16")
    print(f"machine: bf16 GEMM {local.gemm_flops_per_s['bf16'] / 1e9:.0f} GFLOP/s + "
          f"{local.gemm_overhead_s['bf16'] * 1e6:.1f} us/call; NS efficiency {ns.efficiency:.2f}, "
          f"{ns.call_overhead_s * 1e6:.0f} us/call" if ns else "machine: no NS fit")
    for shapes in args.shapes:
        print(f"-- shapes {shapes}")
        _check_shapes(shapes, local, args.repeats)


def _check_shapes(shapes: str, local, repeats: int) -> None:  # noqa: ANN001 - LocalMeasurement
    model = load_shapes(shapes)
    for name, extra in CONFIGS.items():
        errors: list[float] = []
        match = True
        flops_equal = True
        for _ in range(repeats):
            run = run_reference({"world_size": 2, "shapes": shapes, "steps": 5, "check": False, **extra})
            check = check_reference_run(run.to_measured_run(), local, model)
            match &= check.collectives_match
            flops_equal &= all(m == p for m, p in check.ns_flops.values())
            errors += [p.error_pct for p in check.phase("newton_schulz")]
        ns_text = (f"NS time error median {statistics.median(errors):+.1f} % (range {min(errors):+.1f} .. "
                   f"{max(errors):+.1f} %)" if errors else "no Newton-Schulz")
        print(f"{name:20s} collectives {'exact' if match else 'MISMATCH'}, NS FLOPs "
              f"{'equal' if flops_equal else 'DIFFER'}, {ns_text}")


if __name__ == "__main__":
    main()
