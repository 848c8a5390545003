"""The reference's per-tensor Python layers, on a matrix whose kernels cost only their dispatch.

Each Muon tensor the reference updates runs, around its kernels, Python the kernel model does not
price: ``DistOptimizer.update_param`` (state lookup, bucket views, the phase clock),
``orthogonalize_param`` and the orthogonaliser (``TensorParallelNS``: group lookup; ``FullMatrixNS``:
FLOP counter, clock; ``newton_schulz``: checks, transposes, the matmul-precision contexts,
``F.normalize``'s Python; ``scale_update``). Megatron and Emerging-Optimizers have such layers of
their own. :func:`muon_probe` builds the update of the smallest plain Muon matrix of the ``tiny``
preset (the 4×64 router: every GEMM on ATen's small-matrix path, every element-wise kernel 256
elements) so that timing it measures those layers plus kernels at their dispatch floor; the caller
subtracts the kernels at this machine's measured prices (``cli.reference_host``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PROBE_SHAPES = "tiny"


@dataclass(frozen=True)
class MuonProbe:
    """One rank's Muon update of one tiny matrix, and its orthogonaliser call, ready to time."""

    config: dict[str, Any]  # the run configuration (``RunConfig.model_dump``)
    name: str  # the Muon parameter
    shape: tuple[int, int]
    update: Callable[[], None]  # ``opt.update_param`` of the parameter (a steady step)
    orthogonalize: Callable[[], object]  # ``orthogonalize_param`` of its momentum, as update_param calls it
    momentum: Any  # the fp32 tensor the orthogonaliser takes


def muon_probe() -> MuonProbe:
    """The ``tiny`` preset's smallest plain Muon matrix on a 1-rank run, after one warm-up step."""
    from reference.config import make_config
    from reference.muon_math import orthogonalize_param
    from reference.op_count import optimizer_for_rank
    from reference.optimizers import matrix_info

    cfg = make_config(world_size=1, shapes=PROBE_SHAPES, check=False)
    opt = optimizer_for_rank(cfg, 0)
    opt.step(1)
    names = [n for n, s in opt.specs.items() if s.optimizer == "muon" and not s.qkv_groups and n in opt.state]
    name = min(names, key=lambda n: opt.specs[n].local_numel)
    bucket = next(b for b in opt.buckets if name in b.names())
    spec = opt.specs[name]
    momentum = opt.state[name].buf.clone()
    info = matrix_info(spec)

    def update() -> None:
        opt.update_param(bucket, name, 5)

    def orthogonalize() -> object:
        return orthogonalize_param(momentum, info, opt.ortho)

    return MuonProbe(cfg.model_dump(mode="json"), name, tuple(spec.local_shape), update, orthogonalize, momentum)
