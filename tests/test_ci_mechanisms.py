"""Mechanisms the Megatron CI timings exposed, each against a hand calculation.

The CI GPT (12 x h 512, 8 heads, ffn 2048, GELU, LayerNorm, biases, learned positions, tied)
on 8 H100, micro-batch 4 x 1024 tokens, tp 1 unless stated.
"""

from __future__ import annotations

import pytest

from costmodel.cuda_graphs import NO_GRAPHS, GraphCapture
from costmodel.iteration_work import COUNT_ZEROS_KERNELS, logging_kernels, logging_s
from costmodel.layer_costs import (
    CommBlock,
    collective_s,
    framework_host_s,
    hide_under_host,
    layer_ops,
    pass_stream,
    rank_shape,
)
from costmodel.optimizer.kernel_sequence import GRAD_NORM_EXTRA
from topologies.hardware import load_system
from topologies.placement import placement_for
from workloads.inventory import inventory_for
from workloads.models import GqaAttention, ModelSpec, MoeSpec
from workloads.operations import (
    MAIN_GRAD_ADD_BYTES,
    UNFUSED_ATTENTION_BYTES,
    UNFUSED_ATTENTION_KERNELS,
    KernelOptions,
    LayerOps,
    Operation,
    RankShape,
)
from workloads.scenario import build_config

H, F, S, B = 512, 2048, 1024, 4
GPT = ModelSpec(name="ci-gpt", num_layers=12, hidden_size=H, ffn_hidden_size=F, vocab_size=50257,
                attention=GqaAttention(num_heads=8, num_kv_heads=8, head_dim=64), activation="gelu",
                normalization="layernorm", position_embedding="learned_absolute", max_position_embeddings=S,
                tie_embeddings=True, add_bias_linear=True)
MOE = GPT.model_copy(update={"name": "ci-moe", "moe": MoeSpec(num_experts=8, topk=2, expert_ffn_hidden_size=F)})
H100 = load_system("dgx-h100").with_efficiency(layer_host_s=2e-3, moe_host_s=1.5e-3, kernel_issue_s=1e-5)


def _ops(model: ModelSpec, kind: str = "dense", recompute: str = "none", ep: int = 1, **options):
    return layer_ops(model, RankShape(B, S, ep=ep, options=KernelOptions(**options)), kind, recompute, ("core_attn",))


def test_framework_host_time_per_layer_pass():
    ops = _ops(GPT)
    assert framework_host_s(ops, H100) == (2e-3, 2e-3)
    # a full-recompute backward replays the forward: one more forward pass of host time
    assert framework_host_s(_ops(GPT, recompute="full"), H100) == pytest.approx((2e-3, 4e-3))
    # the MoE block's router, dispatcher and experts add their own host time to each pass
    assert framework_host_s(_ops(MOE, "moe"), H100, kind="moe") == pytest.approx((3.5e-3, 3.5e-3))
    # embedding and output blocks: their kernels' issue only; a layer replayed from a graph: none
    assert framework_host_s(layer_ops(GPT, RankShape(B, S), "embedding", "none", ()), H100, kind="embedding") == (0.0, 0.0)
    whole = GraphCapture("local", frozenset())
    assert framework_host_s(ops, H100, whole, "dense") == (0.0, 0.0)
    # the pass's host time = its launches x kernel_issue_s + the framework time
    fwd = pass_stream(ops.forward, H100, framework_s=2e-3)
    assert fwd.issue_s == pytest.approx(sum(o.kernels for o in ops.forward) * 1e-5 + 2e-3)


def test_local_spec_layers_run_their_share_of_the_framework_host_time():
    """--transformer-impl local: Megatron-Core's own linears, norms and attention (and SequentialMLP
    experts) run local_spec_host_fraction of the TE spec's Python per pass, MoE block included."""
    local = H100.with_efficiency(local_spec_host_fraction=0.7)
    assert framework_host_s(_ops(GPT, local_spec=True), local) == pytest.approx((1.4e-3, 1.4e-3))
    assert framework_host_s(_ops(MOE, "moe", local_spec=True), local, kind="moe") == pytest.approx((2.45e-3, 2.45e-3))
    assert framework_host_s(_ops(GPT), local) == (2e-3, 2e-3)  # the TE spec keeps its own
    assert _ops(GPT, local_spec=True) != _ops(GPT)  # the layer caches tell them apart
    from costmodel.layer_costs import kernel_options

    assert kernel_options(_ci_scenario(transformer_impl="local")).local_spec
    assert not kernel_options(_ci_scenario()).local_spec


def test_graph_capture_removes_framework_time_per_operation_not_per_kernel():
    # an MoE pass of four operations: two attention ones (1 kernel each) replayed from a graph, the
    # grouped expert GEMM (16 GEMMs of 16 local experts launched from one TE call) and the unpermute
    # eager. The framework's Python runs once per operation: 2 of the 4 calls remain, half of
    # layer_host_s + moe_host_s = 3.5 ms; a per-kernel share would have kept 17/19 of it (3.13 ms).
    fwd = (Operation("linear_qkv", "gemm", "fwd", "attn_proj", kernels=1),
           Operation("core_attention", "attention", "fwd", "core_attn", kernels=1),
           Operation("experts.linear_fc1", "grouped_gemm", "fwd", "moe", kernels=16),
           Operation("unpermute", "elementwise", "fwd", "moe", kernels=1))
    ops = LayerOps(fwd, fwd)
    flags = (True, True, False, False)
    assert framework_host_s(ops, H100, GraphCapture("transformer_engine", frozenset({"attn"})), "moe",
                            (flags, flags)) == pytest.approx((1.75e-3, 1.75e-3))
    # an operation without kernels (a no-op backward) carries no Python share
    empty = LayerOps(fwd, (*fwd, Operation("dispatch_preprocess.grad", "elementwise", "bwd", "moe_preprocess",
                                           kernels=0)))
    assert framework_host_s(empty, H100, NO_GRAPHS, "moe") == pytest.approx((3.5e-3, 3.5e-3))


def test_collectives_hide_in_the_gpu_wait_of_a_launch_bound_pass():
    blocks = (CommBlock("tp", 3.0, 0.1, "nvlink"), CommBlock("ep", 2.0, 0.1, "nvlink", 0.5))
    # exposed 3 + 1 = 4 s; 2 s of host slack hide half of it, each block alike
    out = hide_under_host(blocks, 2.0)
    assert [b.exposed_s for b in out] == pytest.approx([1.5, 0.5])
    assert [b.exposed_s for b in hide_under_host(blocks, 10.0)] == [0.0, 0.0]
    assert hide_under_host(blocks, 0.0) == blocks


def test_gradient_accumulation_hooks_per_parameter():
    fused = {o.name: o for o in _ops(GPT).backward}
    unfused = {o.name: o for o in _ops(GPT, gradient_accumulation_fusion=False).backward}
    # weights: accumulated inside the wgrad GEMM with fusion, by a separate add without
    assert "mlp.linear_fc1.grad_accumulate" not in fused
    assert unfused["mlp.linear_fc1.grad_accumulate"].bytes == F * H * MAIN_GRAD_ADD_BYTES
    assert unfused["linear_qkv.grad_accumulate"].bytes == 3 * H * H * 10
    # biases go through the hook either way (one kernel each)
    for table in (fused, unfused):
        assert table["mlp.linear_fc1.bias_grad_add"].bytes == F * 10
        assert table["mlp.linear_fc1.bias_grad_add"].kernels == 1
    adds = [n for n in unfused if n.endswith(("_grad_add", "grad_accumulate"))]
    assert len(adds) - len([n for n in fused if n.endswith(("_grad_add", "grad_accumulate"))]) == 4  # QKV, proj, fc1, fc2


def test_unfused_attention_materialises_the_scores():
    flash = {o.name: o for o in _ops(GPT).forward}["core_attention"]
    unfused_ops = _ops(GPT, unfused_attention=True)
    unf = {o.name: o for o in unfused_ops.forward}["core_attention"]
    scores = B * S * 8 * S  # b x heads x s_q x s_k
    assert (unf.kernels, {o.name: o for o in unfused_ops.backward}["core_attention.grad"].kernels) == UNFUSED_ATTENTION_KERNELS
    assert unf.flops == 2 * flash.flops  # the full square, not the causal half
    assert unf.bytes == flash.bytes + UNFUSED_ATTENTION_BYTES[0] * scores
    assert UNFUSED_ATTENTION_BYTES == (13.0, 17.0)


def test_sequential_mlp_runs_one_activation_per_local_expert():
    grouped = {o.name: o for o in _ops(MOE, "moe", ep=2).forward}
    seq = {o.name: o for o in _ops(MOE, "moe", ep=2, grouped_gemm=False).forward}
    assert grouped["experts.gelu"].kernels == 1 and seq["experts.gelu"].kernels == 4  # 8 experts / ep 2
    assert "experts.cat" in seq and "experts.cat" not in grouped


def _ci_scenario(**runtime):
    return build_config({"model": GPT.model_dump(), "system": "dgx-h100", "gpus": 8, "precision": "bf16",
                         "parallelism": {"tp": 1, "pp": 1, "vpp": 1, "micro_batch_size": B, "global_batch_size": 32,
                                         "seq_length": S},
                         "optimizer": {"kind": "adamw", "distribution": "replicated"}, "runtime": runtime}, {}).resolve()


def test_per_iteration_logging_work():
    off = _ci_scenario()
    assert logging_kernels(off, inventory_for(off).stage_tensors(0)) == ()
    sc = _ci_scenario(log_num_zeros_in_grad=True, log_params_norm=True)
    tensors = inventory_for(sc).stage_tensors(0)
    # 12 layers x (2 LN x 2 + QKV w, b + proj w, b + fc1 w, b + fc2 w, b) + final LN (2) + word and
    # position embeddings = 12 x 12 + 2 + 2 = 148 parameters
    assert len(tensors) == 148
    numel = sum(t.rank_numel for t in tensors)
    kernels = {k.name: k for k in logging_kernels(sc, tensors)}
    assert kernels["count_zeros"].count == COUNT_ZEROS_KERNELS * 148
    assert kernels["count_zeros"].count * kernels["count_zeros"].bytes == pytest.approx(4.0 * numel)
    assert kernels["params_l2norm_finish"].count == GRAD_NORM_EXTRA
    world = placement_for(sc).shape("world")
    reduce = collective_s("all_reduce", 4.0, world, sc.system)[0]
    from costmodel.compute import stream_cost

    assert logging_s(sc, tensors, world) == pytest.approx(stream_cost(tuple(kernels.values()), sc.system).time_s
                                                          + 2 * reduce)


def test_rank_shape_reads_the_runtime_settings():
    sc = _ci_scenario(gradient_accumulation_fusion=False, attention_backend="unfused")
    opt = rank_shape(sc).options
    assert (opt.gradient_accumulation_fusion, opt.unfused_attention, opt.grouped_gemm) == (False, True, True)
    assert rank_shape(_ci_scenario(transformer_impl="local")).options.unfused_attention  # local layers: unfused
