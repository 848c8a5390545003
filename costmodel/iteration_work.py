"""Per-iteration logging work at the end of the step: ``--log-num-zeros-in-grad``, ``--log-params-norm``.

Megatron-LM runs them on every iteration when asked (the CI configurations do); both end in a
host synchronisation, after the gradient-norm synchronisation of the optimizer step, so they add to
the step's tail on every pipeline stage:

- ``--log-num-zeros-in-grad`` (``MegatronOptimizer.count_zeros`` → ``count_zeros_fp32``): a Python
  loop over the local main gradients, per parameter ``grad.numel() - torch.count_nonzero(grad)`` and
  the running sum (``COUNT_ZEROS_KERNELS``: the reduction reads the fp32 gradient), then one
  all-reduce of the total over the model-parallel group and ``.item()``;
- ``--log-params-norm`` (``training.py: calc_params_l2_norm``): ``multi_tensor_l2norm`` over the
  bf16 parameters (chunked launches as for the gradient norm), its cleanup, ``** 2``, the
  all-reduce and ``.item()``.

Each is a stream of kernels issued after a synchronisation (``max(GPU, host issue)``,
:mod:`costmodel.kernels`) followed by a one-float all-reduce (latency only). Sizes are the local
parameters of the stage's rank (its tp/ep shards; with the distributed optimizer the main
gradients are dp-sharded: one piece per parameter and 1/dp of the elements).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from costmodel.compute import stream_cost
from costmodel.kernels import KernelSpec
from costmodel.layer_costs import collective_s
from costmodel.optimizer.kernel_sequence import (
    GRAD_NORM_EXTRA,
    SCALAR_BYTES,
    chunks_of,
    multi_tensor_launches,
)

if TYPE_CHECKING:
    from topologies.groups import GroupShape
    from workloads.inventory import TensorSpec
    from workloads.scenario import Scenario

COUNT_ZEROS_KERNELS = 3  # count_nonzero (a reduction), numel - count, accumulate into the total
PARAM_NORM_BYTES_PER_ELEMENT = 2  # the l2 norm reads the bf16 parameter


def logging_kernels(scenario: Scenario, tensors: list[TensorSpec]) -> tuple[KernelSpec, ...]:
    """The logging kernels of one rank of a stage holding ``tensors`` (empty when logging is off)."""
    rt = scenario.runtime
    params = [t for t in tensors if t.optimizer != "none"]
    pieces = float(sum(t.experts_per_rank for t in params))
    numel = float(sum(t.rank_numel for t in params))
    out: list[KernelSpec] = []
    if rt.log_num_zeros_in_grad and pieces:
        shard = 1 if scenario.optimizer.resolved_distribution == "replicated" else max(scenario.dp * scenario.par.cp, 1)
        out.append(KernelSpec("count_zeros", "memory", COUNT_ZEROS_KERNELS * pieces,
                              bytes=4.0 * numel / shard / (COUNT_ZEROS_KERNELS * pieces)))
    if rt.log_params_norm and pieces:
        chunks = float(sum(float(chunks_of(t.local_numel)) * t.experts_per_rank for t in params))
        launches = float(multi_tensor_launches(pieces, chunks, 1))
        out.append(KernelSpec("params_l2norm", "memory", launches, bytes=PARAM_NORM_BYTES_PER_ELEMENT * numel / launches))
        out.append(KernelSpec("params_l2norm_finish", "memory", GRAD_NORM_EXTRA, bytes=SCALAR_BYTES))
    return tuple(out)


def logging_s(scenario: Scenario, tensors: list[TensorSpec], group: GroupShape) -> float:
    """Seconds of the per-iteration logging work of one rank holding ``tensors``: its kernels
    (``max(GPU, host issue)``) plus one one-float all-reduce over ``group`` per logged quantity."""
    kernels = logging_kernels(scenario, tensors)
    if not kernels:
        return 0.0
    syncs = int(scenario.runtime.log_num_zeros_in_grad) + int(scenario.runtime.log_params_norm)
    reduce = collective_s("all_reduce", 4.0, group, scenario.system)[0]
    return stream_cost(kernels, scenario.system).time_s + syncs * reduce
