"""Published pairs of runs that differ mainly in recipe settings: measured vs predicted change.

Each pair is the same model, system, GPU count and precision in two releases; the settings that
differ come from the recipe-settings file (printed). The predicted change uses the given
calibration profile (default: the built-in one, which has no per-release factors), so any change
it predicts comes from the settings alone.

    python benchmarks/recipe_pairs.py [--calibration FILE|none]
"""

from __future__ import annotations

import argparse

from costmodel.calibrate.validation import scenario_for_run, step_time_function
from workloads.datasets import load_dataset

PAIRS = [  # (before, after, what mainly changes)
    ("mb-26.04-deepseek-v3-gb300-nvl72-mxfp8-256g-gbs4096", "mb-26.06-deepseek-v3-gb300-nvl72-mxfp8-256g-gbs4096",
     "MBS 2->1, no recompute, full-iteration CUDA graphs, EP overlap + delayed wgrad"),
    ("mb-26.02-deepseek-v3-gb300-nvl72-mxfp8-256g-gbs4096", "mb-26.04-deepseek-v3-gb300-nvl72-mxfp8-256g-gbs4096",
     "no setting change (MTP in both, by the published TFLOP/s)"),
    ("mb-26.04-qwen3-30b-a3b-gb200-nvl72-mxfp8-8g-gbs512", "mb-26.06-qwen3-30b-a3b-gb200-nvl72-mxfp8-8g-gbs512",
     "TE router graphs -> full-iteration graphs, EP overlap + delayed wgrad"),
    ("mb-26.04-qwen3-235b-a22b-gb300-nvl72-mxfp8-256g-gbs8192", "mb-26.06-qwen3-235b-a22b-gb300-nvl72-mxfp8-256g-gbs8192",
     "TE attn/router graphs -> full-iteration graphs, EP overlap + delayed wgrad"),
    ("mb-26.04-qwen3-235b-a22b-gb200-nvl72-mxfp8-256g-gbs8192", "mb-26.06-qwen3-235b-a22b-gb200-nvl72-mxfp8-256g-gbs8192",
     "TE attn/router graphs -> full-iteration graphs, EP overlap + delayed wgrad"),
    ("mb-26.02-qwen3-30b-a3b-dgx-b200-mxfp8-8g-gbs512", "mb-26.02.01-qwen3-30b-a3b-dgx-b200-mxfp8-8g-gbs512",
     "alltoall dispatcher MBS 1 -> flex HybridEP MBS 4"),
    ("mb-26.04-deepseek-v3-dgx-b200-mxfp8-256g-gbs4096", "mb-26.04.01-deepseek-v3-dgx-b200-mxfp8-256g-gbs4096",
     "PP16 EP8 HybridEP -> PP8 VPP2 EP32 DeepEP, EP overlap, TE graphs, recompute +mlp"),
    ("mb-25.09-llama3-8b-dgx-h100-fp8-cs-8g-gbs128", "mb-25.11-llama3-8b-dgx-h100-fp8-cs-8g-gbs128",
     "no recompute -> full recompute, block method, 5 layers"),
    ("mb-26.04-llama3.1-405b-gb200-nvl72-nvfp4-256g-gbs1536", "mb-26.06-llama3.1-405b-gb200-nvl72-nvfp4-256g-gbs1536",
     "parameter all-gather overlap on -> off"),
]


def main() -> None:
    """Print the table of pairs (measured and predicted change, percent)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibration", default=None, help="profile YAML, or 'none' for datasheet factors")
    args = parser.parse_args()
    from costmodel.calibrate.profile import default_profile, load_profile

    profile = None if args.calibration == "none" else (load_profile(args.calibration) if args.calibration
                                                       else default_profile())
    runs = {r.run_id: r for r in load_dataset("megatron-bridge")}
    step = step_time_function("analytic")

    def predicted(run_id: str) -> float:
        sc = scenario_for_run(runs[run_id])
        return step(profile.apply(sc) if profile is not None else sc)

    print(f"{'pair':78s} {'measured':>18s} {'predicted':>18s}  what changes")
    for before, after, what in PAIRS:
        m0, m1 = runs[before].step_time_s, runs[after].step_time_s
        p0, p1 = predicted(before), predicted(after)
        name = f"{before.removeprefix('mb-')} -> {runs[after].release}"
        print(f"{name:78s} {m0:6.2f}->{m1:6.2f} {100 * (m1 / m0 - 1):+5.1f}% "
              f"{p0:6.2f}->{p1:6.2f} {100 * (p1 / p0 - 1):+5.1f}%  {what}")


if __name__ == "__main__":
    main()
