"""Per-iteration work at the end of the step: ``--log-num-zeros-in-grad``, ``--log-params-norm`` and the weight-hash check.

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

``--check-weight-hash-across-dp-replicas-interval N`` (training.py, after the step and its logging;
the interval timer keeps running, so it lands in the next iteration's time): Megatron-Core's
``check_param_hashes_across_dp_replicas`` (0.16.1 ``core/utils.py:846-905``) walks every parameter
of every model chunk and computes ``hashlib.sha1(param.data.to("cpu").float().numpy())``: per
parameter a synchronous device-to-host copy of the BF16 tensor (``host_sync_s`` plus the bytes over
``host_link_Bps``), a single-threaded FP32 conversion on the host (``host_cast_Bps`` of output) and
SHA-1 of the FP32 bytes on one core (``host_hash_Bps``), plus the Python of the loop
(:data:`HASH_HOST_OPS_PER_PARAM` dispatcher calls at ``kernel_issue_s``). The hashes are then
all-gathered over gloo (20 bytes per parameter) and the world barriers: milliseconds against the
seconds of hashing, not priced. Each routed expert is its own parameter (Transformer Engine's
grouped linear keeps one weight per expert). Priced as 1/N of a check per step.
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
HASH_COPY_BYTES_PER_ELEMENT = 2  # param.data is the BF16 (or FP16) model parameter (Float16Module)
HASH_FP32_BYTES_PER_ELEMENT = 4  # .float(): what the conversion writes and SHA-1 reads
HASH_HOST_OPS_PER_PARAM = 6  # named_parameters step, .to("cpu"), .float(), .numpy(), array.array, torch.frombuffer


def _parameters(tensors: list[TensorSpec]) -> tuple[list[TensorSpec], float, float]:
    """(the parameters among ``tensors`` (not buffers such as the router's expert bias), how many
    parameter tensors they are on the rank (every local expert its own), their elements on the rank)."""
    params = [t for t in tensors if t.optimizer != "none"]
    return params, float(sum(t.experts_per_rank for t in params)), float(sum(t.rank_numel for t in params))


def logging_kernels(scenario: Scenario, tensors: list[TensorSpec]) -> tuple[KernelSpec, ...]:
    """The logging kernels of one rank of a stage holding ``tensors`` (empty when logging is off)."""
    rt = scenario.runtime
    params, pieces, numel = _parameters(tensors)
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


def weight_hash_check_s(scenario: Scenario, tensors: list[TensorSpec]) -> float:
    """Seconds per step of the weight-hash check of one rank holding ``tensors`` (0 when off):
    one check (see the module docstring) divided by its interval in iterations."""
    interval = scenario.runtime.check_weight_hash_interval
    if interval is None:
        return 0.0
    eff, gpu = scenario.system.efficiency, scenario.system.gpu
    _, pieces, numel = _parameters(tensors)
    per_param_s = eff.host_sync_s + HASH_HOST_OPS_PER_PARAM * eff.kernel_issue_s
    bytes_s = (HASH_COPY_BYTES_PER_ELEMENT * numel / gpu.host_link_Bps
               + HASH_FP32_BYTES_PER_ELEMENT * numel / eff.host_cast_Bps
               + HASH_FP32_BYTES_PER_ELEMENT * numel / eff.host_hash_Bps)
    return (pieces * per_param_s + bytes_s) / interval
