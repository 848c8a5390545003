"""Kernel counts of the optimizer step per tensor, pinned to the code sequence that runs.

Megatron-Core 0.16.1 (``megatron/core/optimizer/{muon.py, optimizer.py, distrib_optimizer.py,
clip_grads.py, layer_wise_optimizer.py}``) with Emerging-Optimizers 0.3.0
(``emerging_optimizers/orthogonalized_optimizers/{orthogonalized_optimizer.py, muon_utils.py}``,
``mixin.py``) and TE ``FusedAdam`` / ``multi_tensor_apply`` (apex's chunking: 65536-element
chunks, 320 blocks, 110 tensors at depth 1 and 36 at depth 4 per launch).
"""

from __future__ import annotations

import numpy as np
import pytest

from costmodel.optimizer import Grid, plan_from_inventory
from costmodel.optimizer import kernel_sequence as ks
from costmodel.optimizer.newton_schulz import NsSettings, tensor_ns_work
from workloads.inventory import build_inventory
from workloads.models import ModelSpec
from workloads.scenario import OptimizerSpec

TINY_DENSE = ModelSpec.model_validate(dict(
    name="tiny-dense", num_layers=2, hidden_size=64, ffn_hidden_size=128, vocab_size=256,
    attention=dict(kind="gqa", num_heads=8, num_kv_heads=4, head_dim=8)))


def _tensor(name: str, tp: int = 1):  # noqa: ANN202
    inv = build_inventory(TINY_DENSE, tp=tp)
    return next(t for t in inv.tensors if t.name.endswith(name) and ".layers.0." in t.name)


def _kernels(name: str, tp: int = 1, mode: str = "duplicated", precision: str = "bf16", **kw) -> float:
    st = NsSettings(steps=5, cubic=False, precision=precision, syrk=False, tp_mode=mode)
    t = _tensor(name, tp)
    return ks.kernel_count(ks.muon_tensor_kernels(t, tensor_ns_work(t, st), st, **kw))


def test_muon_kernels_of_one_matrix() -> None:
    """EO ``OrthogonalizedOptimizer.step`` on one fp32 main parameter (MCore defaults: decoupled
    weight decay, no Nesterov, fp32 main grads, ``fp32_matmul_prec`` 'medium', 5 quintic steps):
    ``p.add_(p, alpha=-wd·lr)`` 1 (``mixin._apply_weight_decay_inplace``), ``momentum_buffer.lerp_``
    1, then ``muon_utils.newton_schulz``: ``F.normalize`` = norm, clamp_min, divide 3; ``X.to(bf16)``
    1; per step ``X @ X.mT``, ``addmm(A, A, A)``, ``addmm(X, B, X)`` (``newton_schulz_step``) 15,
    each out-of-place ``addmm`` (β ≠ 0) first copying ``self`` into its output (ATen) 10;
    ``X.to(fp32)`` 1; MCore ``scaled_orthogonalize_fn`` ``orth_grad * scale_factor *
    extra_scale_factor`` 2; ``p.add_(orth_grad, alpha=-lr)`` 1; MCore
    ``Float16OptimizerWithFloat16Params._copy_main_params_to_model_params`` without an overflow
    buffer under bf16: one ``copy_`` per parameter 1. Total 36."""
    assert _kernels("mlp.linear_fc1.weight") == 36
    assert _kernels("mlp.linear_fc1.weight", nesterov=True) == 37  # grad.lerp(momentum, β)
    assert _kernels("mlp.linear_fc1.weight", grad_bytes=2) == 37  # main_grad.float() is a cast for bf16 grads
    assert _kernels("mlp.linear_fc1.weight", precision="fp32") == 34  # no bf16 casts under 'highest'


def test_muon_kernels_of_a_split_qkv() -> None:
    """MCore ``TensorParallelMuon.orthogonalize`` with ``split_qkv``: ``torch.split`` of a view then
    ``reshape`` of each non-contiguous Q/K/V part (3 copies), NS (with its 10 addmm copies) + scale
    per component (3 × 32), ``torch.cat`` back (1); with weight decay, momentum, update and copy (4): 104."""
    assert _kernels("self_attention.linear_qkv.weight") == 104


def test_muon_kernels_under_tensor_parallel_modes() -> None:
    """EO ``newton_schulz_tp``: ``duplicated`` gathers the shards into a list (NCCL's flat buffer
    copied out to each of the 2 tensors: 2), ``torch.cat`` (1), then the full-matrix NS (30, its 10
    addmm copies included) and the scale (2): 35 + 4 = 39; ``distributed``: ``distributed_normalize_p2``
    = x*x, sum, sqrt, clamp_min, divide (5), casts (2), 15 GEMMs and 10 addmm copies (the Gram
    all-reduce is not a kernel of this stream), scale (2): 34 + 4 = 38; ``blockwise`` (MCore passes
    partition_dim None): the local path, 36."""
    assert _kernels("mlp.linear_fc2.weight", tp=2, mode="duplicated") == 39
    assert _kernels("mlp.linear_fc2.weight", tp=2, mode="distributed") == 38
    assert _kernels("mlp.linear_fc2.weight", tp=2, mode="blockwise") == 36


def test_multi_tensor_apply_launches() -> None:
    """apex/TE ``multi_tensor_apply``: a launch when 320 chunks or the depth's tensor limit is full."""
    assert ks.multi_tensor_launches(100, 100, 4) == 3  # 100 small tensors, 36 per Adam launch
    assert ks.multi_tensor_launches(100, 100, 1) == 1  # 110 per l2norm launch
    assert ks.multi_tensor_launches(1, ks.chunks_of(100_000_000), 4) == 5  # 1526 chunks / 320
    assert ks.multi_tensor_launches(0, 0, 4) == 0
    adam = ks.fused_adam_kernels(pieces=100, chunks=100, numel=100 * 1000)
    assert {k.name: k.count for k in adam} == {"fused_adam": 3, "main_to_model_copy": 100}
    assert {k.name: k.count for k in ks.fused_adam_kernels(100, 100, 1e5, grad_bytes=2)}["main_grad_cast"] == 100
    assert ks.kernel_count(ks.grad_norm_kernels(200, 200, 2e5)) == 2 + 3  # 2 l2norm launches, cleanup, ** 2, .item()


def test_shard_chunks() -> None:
    """One chunk per small piece (a shard of 25 holding 1, 2, 2, 1 pieces), 4 chunks for a
    200,000-element piece (65,536 per chunk), none for no piece. (The pieces per shard of a bucket:
    tests/test_optimizer_plan_batch.py.)"""
    assert ks.shard_chunks(np.array([1, 2, 2, 1]), np.array([25, 25, 25, 25])).tolist() == [1, 2, 2, 1]
    assert ks.shard_chunks(np.ones(4), np.full(4, 200_000)).tolist() == [4, 4, 4, 4]
    assert ks.shard_chunks(np.array([0.0]), np.array([0.0])).tolist() == [0]


def test_rank_kernel_counts_of_a_whole_step() -> None:
    """One rank (dp 1) steps all of tiny-dense with Muon: 2 split QKV (104 each) and 6 other matrices
    (36 each) = 424 per-tensor launches, of which 2·45 + 6·15 = 180 NS GEMMs; the 7 non-matrix
    parameters (embedding, 5 norms, output layer) in one element-wise bucket: one FusedAdam launch
    and 7 main → model copies; the gradient norm over 15 main gradients: one l2norm launch + 3."""
    inv = build_inventory(TINY_DENSE)
    plan = plan_from_inventory(inv, OptimizerSpec(kind="muon"), Grid(dp=1, expert_dp=1))
    rank = plan.stages[0].ranks[0]
    assert dict(rank.kernel_counts) == {"newton_schulz_gemm": 180, "muon_elementwise": 244, "adam_multi_tensor": 1,
                                        "adam_param_copy": 7, "grad_norm": 4, "gather_copy": 0}
    assert rank.kernels == 436 and rank.muon_tensors == 8
    assert rank.total_s == rank.step_s(rank.gpu_s, rank.issue_s) == 0.0  # no system: no times
    adamw = plan_from_inventory(inv, OptimizerSpec(kind="adamw"), Grid(dp=1, expert_dp=1)).stages[0].ranks[0]
    assert dict(adamw.kernel_counts)["adam_param_copy"] == 15 and adamw.kernels == 1 + 15 + 4


def test_nesterov_adds_one_lerp_per_muon_parameter() -> None:
    """``muon_use_nesterov`` (Megatron-Core default off): Emerging-Optimizers' orthogonalized step
    takes ``grad.lerp(momentum, beta)`` once per parameter, before the (QKV-split) orthogonalisation:
    the 8 Muon parameters of tiny-dense add 8 element-wise launches."""
    inv = build_inventory(TINY_DENSE)
    plain = plan_from_inventory(inv, OptimizerSpec(kind="muon"), Grid(dp=1, expert_dp=1)).stages[0].ranks[0]
    nesterov = plan_from_inventory(inv, OptimizerSpec(kind="muon", use_nesterov=True),
                                   Grid(dp=1, expert_dp=1)).stages[0].ranks[0]
    assert dict(nesterov.kernel_counts)["muon_elementwise"] == dict(plain.kernel_counts)["muon_elementwise"] + 8
    assert nesterov.kernels == plain.kernels + 8


def test_legacy_layout_copies_back_what_a_rank_does_not_own() -> None:
    """MCore 0.16.1 ``LayerWiseDistributedOptimizer.allgather_params``: ``_flatten_dense_tensors`` of
    the owned parameters (1) and one ``copy_`` per parameter owned by another rank."""
    inv = build_inventory(TINY_DENSE)
    spec = OptimizerSpec(kind="muon", layer_wise_layout="legacy")
    ranks = plan_from_inventory(inv, spec, Grid(dp=2, expert_dp=2)).stages[0].ranks
    owned = [r.muon_tensors + dict(r.kernel_counts)["adam_param_copy"] for r in ranks]
    assert sum(owned) == 15
    for r, mine in zip(ranks, owned, strict=True):
        assert dict(r.kernel_counts)["gather_copy"] == pytest.approx(15 - mine + 1)


def test_gradient_prescaling_runs_once_per_bucket_before_its_reduction() -> None:
    """MCore ``_ParamAndGradBucketGroup.start_grad_sync``: ``bucket.grad_data *= gradient_scaling_factor``
    (1/dp without ``average_in_collective``) reads and writes the whole bucket once, then reduces."""
    from costmodel.optimizer.plan_types import Bucket
    from costmodel.stage_buckets import _prescale_s
    from topologies.hardware import load_system

    system = load_system("gb300-nvl72")
    eff = system.efficiency
    bucket = Bucket(stage=0, chunk=0, dp_group="dp", group_size=8, numel=40_000_000, grad_bytes=160_000_000,
                    param_bytes=80_000_000, reduce_op="reduce_scatter", gather_op="all_gather")
    assert _prescale_s(bucket, system) == pytest.approx(2 * 160e6 / (system.gpu.hbm_bandwidth_Bps * eff.memory_bandwidth))
    # the padding is scaled too: ``bucket.grad_data`` is the buffer view [start_index, end_index) of
    # the padded bucket (``_ParamAndGradBuffer._new_bucket``), not the used range
    padded = Bucket(stage=0, chunk=0, dp_group="dp", group_size=8, numel=40_000_000, grad_bytes=160_000_000,
                    param_bytes=80_000_000, reduce_op="reduce_scatter", gather_op="all_gather", used_numel=5_000_000,
                    kind="layer_wise")
    assert _prescale_s(padded, system) == _prescale_s(bucket, system)
    tiny = Bucket(0, 0, "dp", 8, 64, 256, 128, "reduce_scatter", "all_gather")
    assert _prescale_s(tiny, system) == pytest.approx(eff.kernel_min_s)
    alone = Bucket(0, 0, "dp", 1, 64, 256, 128, "all_reduce", None)
    assert _prescale_s(alone, system) == 0.0  # dp 1: no reduction, scaling factor 1
    averaged = Bucket(0, 0, "dp", 8, 64, 256, 128, "reduce_scatter", "all_gather", averaged=True)
    assert _prescale_s(averaged, system) == 0.0  # average_in_collective: the reduction averages
    assert ks.grad_prescale_kernels(3, 300.0, 4)[0].count == 3


def test_a_gpus_step_is_the_larger_of_its_gpu_and_host_issue_time() -> None:
    """Every GPU class of a real plan: total = max(NS + element-wise + TP seconds, launches × kernel_issue_s)."""
    from workloads.scenario import DEFAULT_SCENARIO

    sc = DEFAULT_SCENARIO.resolve().with_updates(model="qwen3-30b-a3b", gpus=8, tp=1, pp=1, vpp=1, ep=8,
                                                 micro_batch_size=8, global_batch_size=512, seq_length=4096)
    from costmodel.optimizer.plan import build_optimizer_plan

    issue = sc.system.efficiency.kernel_issue_s
    for st in build_optimizer_plan(sc).stages:
        for r in st.ranks:
            assert r.issue_s == pytest.approx(r.kernels * issue)
            assert r.total_s == pytest.approx(max(r.newton_schulz_s + r.elementwise_s + r.tp_comm_s, r.issue_s))
            assert r.host_idle_s >= 0.0
