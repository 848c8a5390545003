"""Optimizer memory per GPU: persistent state, and the transient buffers of the optimizer step.

Bytes per parameter (``muon-and-distributed-optimizers.md`` §3 "Memory", §4.4), divided by ``d``,
the ranks the state is sharded over (:func:`state_shards`):

- **AdamW** (Megatron's distributed optimizer): fp32 ``m`` and ``v`` (8 B) and an fp32 master copy
  when the parameters are not fp32 (4 B) are persistent. With gradients not in fp32, the step copies
  each rank's gradient shard into fp32 (``DistributedOptimizer._copy_model_grads_to_main_grads``,
  4 B) and frees it after the step: a **transient** of the step, not coexisting with activations.
  Together: Megatron's table ``6 + 12/d`` (bf16 params, fp32 grads), ``4 + 16/d`` (bf16 grads),
  ``8 + 8/d`` (fp32) (:func:`distributed_optimizer_bytes_per_param`).
- **Precision-aware optimizer** (``use_precision_aware_optimizer``, TE ``FusedAdam`` with master
  weights): the master copy in ``main_params_dtype``, ``m`` in ``exp_avg_dtype``, ``v`` in
  ``exp_avg_sq_dtype`` (fp32 4 B, bf16/fp16 2 B, fp8 1 B); the step reads the gradient buffer
  directly when ``main_grads_dtype`` is its dtype, else it copies the shard into ``main_grads_dtype``
  (transient). Our reading of Megatron-Core's ``use_precision_aware_optimizer`` path (an assumption:
  the code is not on this machine).
- **Muon** (layer-wise): fp32 momentum + fp32 master for owned matrices, the fp32 gradient copy
  (transient) when gradients are not fp32; every rank gets the average share (the optimizer plan
  has the exact ownership). Non-Muon parameters use AdamW as above.
- **Optimizer CPU offload** (``optimizer_cpu_offload``): the state and the step live in host memory
  (Megatron's hybrid device optimizer with the whole state offloaded): no optimizer memory on the GPU.

Sharding ``d``: the dense dp·cp group or the expert-data-parallel group; with
``num_distributed_optimizer_instances`` ``k`` the group is split into ``k`` instances and each shards
the state over ``d/k`` ranks (the instances all-reduce the reduced shards); ``replicated``: 1; the
legacy layer-wise layout at dp·cp = 1: 1 for experts too (Megatron's ``shard_params`` returns
early); Megatron-FSDP: the FSDP group unless ``data_parallel_sharding_strategy`` is ``no_shard``.

**Legacy gather buffers** (transient, legacy layer-wise layout, :func:`legacy_gather_bytes`): the
flat send and receive buffers of Megatron-Core 0.16.1's ``allgather_params``, after the step (they
do not coexist with the Newton–Schulz workspace; the larger of the two counts).

**Step workspace** (transient, Muon only): the Newton–Schulz buffers of the largest matrix on the
stage: fp32 Nesterov copy ``U``, ``X`` in the matmul precision, ``A`` and ``B`` (``m×m``) in the
matmul precision, the fp32 output and its scaled copy; in ``duplicated`` TP mode the fp32 gathered
full matrix and NS on it; in ``distributed`` mode the Gram over the non-sharded dimension; in
``blockwise`` mode the local shard only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from topologies.identity_memo import IdentityMemo
from workloads.comm import DTYPE_BYTES
from workloads.weight_memory import fsdp_group_size

if TYPE_CHECKING:
    from collections.abc import Iterable

    from workloads.inventory import TensorSpec
    from workloads.scenario import OptimizerSpec, Scenario

PARAM_BYTES = 2  # bf16 model parameters
FP32_BYTES = 4


def distributed_optimizer_bytes_per_param(param_bytes: int, grad_bytes: int, dp: int) -> float:
    """Megatron's element-wise distributed-optimizer (Adam) bytes per parameter, in bytes.

    ``param_bytes + grad_bytes + (8 + master + grad_copy)/dp`` with an fp32 master when params are
    not fp32 and an fp32 gradient copy when gradients are not fp32: (2, 4) -> 6 + 12/dp,
    (2, 2) -> 4 + 16/dp, (4, 4) -> 8 + 8/dp.
    """
    return param_bytes + grad_bytes + adam_state_bytes_per_param(param_bytes, grad_bytes) / dp


def adam_state_bytes_per_param(param_bytes: int = PARAM_BYTES, grad_bytes: int = FP32_BYTES) -> int:
    """Unsharded Adam state per parameter in bytes: fp32 m, v, master (if needed), grad copy (if needed)."""
    return 8 + _fp32_copies(param_bytes, grad_bytes)


def muon_state_bytes_per_param(param_bytes: int = PARAM_BYTES, grad_bytes: int = FP32_BYTES) -> int:
    """Unsharded Muon state per parameter in bytes: fp32 momentum, master (if needed), grad copy (if needed)."""
    return 4 + _fp32_copies(param_bytes, grad_bytes)


def _fp32_copies(param_bytes: int, grad_bytes: int) -> int:
    return (FP32_BYTES if param_bytes < FP32_BYTES else 0) + (FP32_BYTES if grad_bytes < FP32_BYTES else 0)


@dataclass(frozen=True)
class StateBytes:
    """Optimizer bytes per (unsharded) parameter: persistent state and the step's transient copy."""

    persistent: float
    transient: float


def adam_bytes(opt: OptimizerSpec) -> StateBytes:
    """AdamW bytes per parameter under ``opt`` (precision-aware dtypes or Megatron's fp32 state)."""
    g = opt.grad_bytes
    if opt.use_precision_aware_optimizer:
        state = DTYPE_BYTES[opt.main_params_dtype] + DTYPE_BYTES[opt.exp_avg_dtype] + DTYPE_BYTES[opt.exp_avg_sq_dtype]
        main_grad = DTYPE_BYTES[opt.main_grads_dtype]
        return StateBytes(float(state), 0.0 if main_grad == g else float(main_grad))
    return StateBytes(float(8 + FP32_BYTES), float(FP32_BYTES if g < FP32_BYTES else 0))


def muon_bytes(opt: OptimizerSpec) -> StateBytes:
    """Muon bytes per owned parameter: fp32 momentum + master; the fp32 gradient copy (transient)."""
    return StateBytes(float(4 + FP32_BYTES), float(FP32_BYTES if opt.grad_bytes < FP32_BYTES else 0))


def state_shards(scenario: Scenario, dp_group: str) -> int:
    """Ranks the optimizer state of ``dp_group``'s parameters is sharded over (see the module docstring)."""
    opt, p = scenario.optimizer, scenario.par
    if p.fsdp > 0:
        return 1 if opt.data_parallel_sharding_strategy == "no_shard" else fsdp_group_size(scenario, dp_group)
    dist = opt.resolved_distribution
    if dist == "replicated":
        return 1
    dense = scenario.dp * p.cp
    if dp_group == "dp":
        d = dense
    elif dist == "layer_wise" and opt.layer_wise_layout == "legacy" and dense == 1:
        return 1  # Megatron's legacy shard_params returns early at dp·cp = 1: experts are not sharded either
    else:
        d = scenario.expert_dp
    return max(1, d // opt.num_distributed_optimizer_instances)


def optimizer_bytes(scenario: Scenario, tensors: Iterable[TensorSpec]) -> StateBytes:
    """Persistent optimizer state and the step's transient copies per GPU for ``tensors`` (one stage),
    in bytes (average share)."""
    return counted_optimizer_bytes(scenario, ((t, 1) for t in tensors))


def counted_optimizer_bytes(scenario: Scenario, counted: Iterable[tuple[TensorSpec, int]]) -> StateBytes:
    """:func:`optimizer_bytes` of distinct tensors, each standing for ``count`` tensors."""
    opt = scenario.optimizer
    if opt.optimizer_cpu_offload:
        return StateBytes(0.0, 0.0)
    adam, muon = adam_bytes(opt), muon_bytes(opt)
    shards = {g: state_shards(scenario, g) for g in ("dp", "expert_dp")}
    # bytes per parameter, read once: AdamW's, and Muon's for its own tensors when the optimizer is Muon
    adam_b = (adam.persistent, adam.transient)
    muon_b = (muon.persistent, muon.transient) if opt.kind == "muon" else adam_b
    persistent = transient = 0.0
    for t, count in counted:
        owner = t.optimizer
        if owner == "none":
            continue
        state_b, copy_b = muon_b if owner == "muon" else adam_b
        share = t.rank_numel / shards[t.dp_group] * count
        persistent += state_b * share
        transient += copy_b * share
    return StateBytes(persistent, transient)


def newton_schulz_workspace_bytes(tensor: TensorSpec, tp_mode: str, matmul_bytes: int) -> float:
    """Peak transient bytes of orthogonalising one copy of ``tensor`` (largest component), in bytes.

    Buffers: fp32 ``U`` (local shard), ``X`` and ``A``, ``B`` (``m×m``) in ``matmul_bytes``, fp32
    output and scaled copy; ``duplicated`` adds the fp32 gathered full matrix and runs on it.
    """
    best = 0.0
    sharded = tensor.shards > 1 and tp_mode != "blockwise"
    for (rows, cols), (lr, lc) in zip(tensor.muon_components, tensor.local_muon_components, strict=True):
        local = lr * lc
        if sharded and tp_mode == "duplicated":
            full = rows * cols
            m = min(rows, cols)
            ws = FP32_BYTES * local + FP32_BYTES * full + matmul_bytes * full + 2 * matmul_bytes * m * m + 2 * FP32_BYTES * full
        elif sharded:  # distributed: Gram over the non-sharded dimension
            r = cols if tensor.shard_dim == 0 else rows
            ws = FP32_BYTES * local + matmul_bytes * local + 2 * matmul_bytes * r * r + 2 * FP32_BYTES * local
        else:
            m = min(lr, lc)
            ws = FP32_BYTES * local + matmul_bytes * local + 2 * matmul_bytes * m * m + 2 * FP32_BYTES * local
        best = max(best, float(ws))
    return best


def optimizer_workspace_bytes(scenario: Scenario, groups: Iterable[tuple[TensorSpec, ...]]) -> float:
    """Newton–Schulz workspace of the largest Muon matrix among the tensors of ``groups`` (tuples of
    tensors, e.g. the templates of a stage's runs), in bytes (0 for AdamW). Memoised per group
    tuple: the stages of a layout share their layers' template tuples."""
    opt = scenario.optimizer
    if opt.kind != "muon":
        return 0.0
    matmul_bytes = 2 if opt.matmul_precision == "bf16" else FP32_BYTES
    key = (opt.tp_mode, matmul_bytes)
    out = 0.0
    for group in groups:
        ws = _WORKSPACE.get(key, group)
        if ws is None:
            ws = _WORKSPACE.put(max((newton_schulz_workspace_bytes(t, *key) for t in group if t.optimizer == "muon"),
                                    default=0.0), key, group)
        out = max(out, ws)
    return out


def legacy_gather_bytes(scenario: Scenario, counted: Iterable[tuple[TensorSpec, int]]) -> float:
    """Transient buffers of the legacy layer-wise parameter gather on one stage, in bytes.

    Megatron-Core 0.16.1 ``LayerWiseDistributedOptimizer.allgather_params``
    (layer_wise_optimizer.py:151-182), once per group (dp·cp, then expt_dp): ``src`` flattens the
    rank's owned parameters and ``output_list`` allocates every rank's flat parameters
    (``torch.empty`` of Σ numel of the group, model dtype) before the ``all_gather``; both are freed
    before the next group's. Peak = max over groups of 2 B × (group numel + owned share). 0 when
    the gather is hidden (the later per-bucket fallback receives into the gradient buffer), when
    nothing is sharded (dp·cp = 1: ``shard_params`` returns early) or for a group of one rank."""
    opt, p = scenario.optimizer, scenario.par
    if not (opt.kind == "muon" and opt.resolved_distribution == "layer_wise" and opt.layer_wise_layout == "legacy") \
            or (opt.hide_param_gather and opt.overlap_grad_reduce) or p.fsdp > 0 or scenario.dp * p.cp == 1:
        return 0.0
    numel = {"dp": 0, "expert_dp": 0}
    for t, count in counted:
        if t.optimizer != "none":
            numel[t.dp_group] += t.rank_numel * count
    best = 0.0
    for group, n in numel.items():
        d = state_shards(scenario, group)
        if d > 1 and n > 0:
            best = max(best, PARAM_BYTES * (n + n / d))
    return best


_WORKSPACE: IdentityMemo[float] = IdentityMemo(50_000)  # (tp mode, matmul bytes) + the group tuple by identity
