"""Every operator the reference's optimizer step dispatches, per rank, against the cost model's kernels.

    python benchmarks/count_optimizer_ops.py [--shapes small,many-small] [--optimizers muon,adamw]

For each preset and optimizer, builds each rank of a 2-rank tp-1 run in this process
(:func:`reference.op_count.optimizer_for_rank`), records one steady optimizer step with a
``TorchDispatchMode`` (:func:`reference.op_count.record_optimizer_step`: operators by parameter or
element-wise shard, computing operators apart from views) and compares the computing operators with
the kernels the reference check prices for that rank
(:func:`costmodel.calibrate.reference_check.reference_rank_kernels`: Muon per owned tensor, eager
AdamW per shard, the reference's momentum clone). Deterministic: no timing, any load.
"""

from __future__ import annotations

import argparse
from collections import Counter

from costmodel.calibrate.reference_check import reference_rank_kernels
from costmodel.optimizer.kernel_sequence import kernel_count
from reference.config import make_config
from reference.op_count import optimizer_for_rank, record_optimizer_step
from reference.workload import load_shapes

METADATA = {"_unsafe_view"}  # the metadata half of reshape-of-a-copy (not tagged a view, moves no data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="small,many-small")
    parser.add_argument("--optimizers", default="muon,adamw")
    args = parser.parse_args()
    for shapes in args.shapes.split(","):
        for optimizer in args.optimizers.split(","):
            cfg = make_config(world_size=2, shapes=shapes, optimizer=optimizer, check=False)
            for rank in range(cfg.world_size):
                opt = optimizer_for_rank(cfg, rank)
                opt.step(1)
                rec = record_optimizer_step(opt, 2)
                compute = sum((rec.compute.get(label, Counter()) for label in rec.labels()), Counter())
                views = sum((rec.views.get(label, Counter()) for label in rec.labels()), Counter())
                metadata = sum(n for op, n in compute.items() if op in METADATA)
                kernels = sum(compute.values()) - metadata
                model = kernel_count(tuple(reference_rank_kernels(load_shapes(shapes), cfg.model_dump(mode="json"),
                                                                  rank).optimizer_kernels))
                verdict = "equal" if kernels == model else f"DIFFER by {kernels - model:+.0f}"
                print(f"{shapes:10s} {optimizer:5s} rank {rank}: {len(rec.labels())} tensors/shards; kernels "
                      f"{kernels} vs model {model:.0f} ({verdict}); also {metadata} _unsafe_view and "
                      f"{sum(views.values())} views ({', '.join(f'{k} {v}' for k, v in views.most_common())})")


if __name__ == "__main__":
    main()
