"""Every ATen operator a block of the reference dispatches, by label (deterministic, no timing).

:class:`OperatorRecorder` is a ``TorchDispatchMode``: it sees each operator as it reaches the
dispatcher's kernels (composite operators such as ``matmul``, ``F.normalize`` or ``reshape`` arrive
decomposed) and records its name under the current label, split into operators that compute (a
kernel on a GPU) and views (metadata only: ``view``, ``slice``, ``transpose``, ``expand``, ...).
Kernels an operator runs inside itself reach no dispatch mode; the one that matters here, the copy
an out-of-place ``addmm`` makes of ``self`` (:data:`NESTED_COPY_OPS`), is counted as ``addmm.copy_``.
:func:`record_optimizer_step` labels the ops of one optimizer step by the parameter (Muon, whole
AdamW parameters) or element-wise shard (``shard<uid>``) being updated, which is what
``benchmarks/count_optimizer_ops.py`` and the tests compare with the cost model's kernel lists.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

STEP_LABEL = "(step)"  # operators outside any per-parameter or per-shard update
# operators whose out-of-place kernel copies ``self`` into the new output before its GEMM when
# beta != 0: an ``aten::copy_`` nested inside the operator (torch.profiler shows it under
# ``aten::addmm``), which reaches no dispatch mode; counted as ``addmm.copy_``
NESTED_COPY_OPS = frozenset({"addmm", "baddbmm"})


class OperatorRecorder(TorchDispatchMode):
    """Counts dispatched operators per label: ``compute[label]`` and ``views[label]`` Counters."""

    def __init__(self) -> None:
        super().__init__()
        self.label = STEP_LABEL
        self.compute: dict[str, Counter[str]] = {}
        self.views: dict[str, Counter[str]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        table = self.views if func.is_view else self.compute
        counts = table.setdefault(self.label, Counter())
        name = str(func.overloadpacket.__name__)
        counts[name] += 1
        if name in NESTED_COPY_OPS and func._overloadname == "default" and (kwargs or {}).get("beta", 1) != 0:
            counts[f"{name}.copy_"] += 1  # the copy of self into the output, inside the kernel
        return func(*args, **(kwargs or {}))

    @contextmanager
    def labelled(self, label: str) -> Iterator[None]:
        """Record the block's operators under ``label``."""
        previous, self.label = self.label, label
        try:
            yield
        finally:
            self.label = previous

    def labels(self) -> list[str]:
        """Every label that dispatched an operator, in first-seen order."""
        return list(dict.fromkeys([*self.compute, *self.views]))


def record_optimizer_step(opt: Any, step: int) -> OperatorRecorder:
    """Run ``opt.step(step)`` (a :class:`reference.optimizers.DistOptimizer`) under a recorder,
    labelling operators by parameter name or ``shard<bucket uid>``."""
    rec = OperatorRecorder()
    update_param, update_shard = opt.update_param, opt.update_shard

    def param(bucket: Any, name: str, s: int) -> None:
        with rec.labelled(name):
            update_param(bucket, name, s)

    def shard(bucket: Any, s: int) -> None:
        with rec.labelled(f"shard{bucket.uid}"):
            update_shard(bucket, s)

    opt.update_param, opt.update_shard = param, shard
    try:
        with rec:
            opt.step(step)
    finally:
        del opt.update_param, opt.update_shard  # back to the class's methods
    return rec


def optimizer_for_rank(cfg: Any, rank: int) -> Any:
    """Rank ``rank``'s optimizer of ``cfg`` (tp 1) built in this process, gradients filled: what that
    rank updates, without process groups (a tp-1 step issues no collective; the reductions around it
    are not run).
    """
    import torch

    from reference.grid import GridCoords, group_members
    from reference.instrument import Comm, Group, NsCounter, PhaseClock
    from reference.optimizers import optimizer_class
    from reference.runner import fill_grads, hypers, run_specs, shard_rank
    from reference.tp_ns import TensorParallelNS
    from reference.workload import initial_param, local_shard

    if cfg.tp != 1 or cfg.etp != 1:
        raise ValueError("optimizer_for_rank builds tp 1 runs only (tensor-parallel NS needs process groups)")
    coords = GridCoords(rank, cfg.world_size, 1, 1)
    groups = {kind: Group(kind, len(m), m.index(rank), None)
              for kind, members in group_members(cfg.world_size, 1, 1).items() for m in members if rank in m}
    comm, clock, counter = Comm(groups), PhaseClock(), NsCounter()
    dtype = torch.float32 if cfg.param_dtype == "fp32" else torch.bfloat16
    specs = run_specs(cfg)
    init = {s.name: local_shard(initial_param(s, cfg.seed), s, shard_rank(s, coords)).to(dtype) for s in specs}
    muon, adam = hypers(cfg)
    ortho = TensorParallelNS(muon, cfg.tp_mode, comm, counter)
    opt = optimizer_class(cfg)(cfg, specs, init, coords, comm, clock, ortho, muon, adam, torch.device("cpu"))
    fill_grads(opt, cfg, coords, 0)
    clock.new_step()
    counter.new_step()
    return opt
