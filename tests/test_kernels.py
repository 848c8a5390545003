"""Kernel-level cost (costmodel.kernels, costmodel.compute), kernel counts per operation, CUDA graphs.

Hand calculations, not the model's own output: a launch-bound pass costs its launches times the
host issue cost; a GPU-bound one its GPU time; captured kernels cost no issue time.
"""

from __future__ import annotations

import pytest

from costmodel.compute import kernel_gpu_s, operation_time_s, stream_cost
from costmodel.cuda_graphs import NO_GRAPHS, GraphCapture
from costmodel.kernels import KernelSpec, StreamCost
from costmodel.layer_costs import ops_time, pass_stream
from topologies.hardware import load_system
from workloads.layer_assembly import layer_operations
from workloads.models import ModelSpec, load_model
from workloads.operations import Operation, RankShape
from workloads.runtime import RuntimeSettings

SYSTEM = load_system("gb300-nvl72")
EFF = SYSTEM.efficiency


def test_every_kernel_costs_at_least_the_minimum_kernel_time() -> None:
    tiny = Operation("x", "elementwise", "fwd", "mlp", 0.0, 64.0, kernels=3)
    assert operation_time_s(tiny, SYSTEM) == pytest.approx(3 * EFF.kernel_min_s)
    big = Operation("y", "elementwise", "fwd", "mlp", 0.0, 8e9)
    assert operation_time_s(big, SYSTEM) == pytest.approx(8e9 / (SYSTEM.gpu.hbm_bandwidth_Bps * EFF.memory_bandwidth))
    assert kernel_gpu_s(KernelSpec("k", "memory", 5, bytes=8.0), SYSTEM) == pytest.approx(EFF.kernel_min_s)


def test_stream_is_the_larger_of_gpu_time_and_host_issue_time() -> None:
    small = [KernelSpec("copy", "memory", 100, bytes=1024.0)]
    cost = stream_cost(small, SYSTEM)
    assert cost.gpu_s == pytest.approx(100 * EFF.kernel_min_s)
    assert cost.time_s == pytest.approx(100 * EFF.kernel_issue_s)  # launch-bound: issue 5 us > 1.78 us
    assert cost.host_idle_s == pytest.approx(100 * (EFF.kernel_issue_s - EFF.kernel_min_s))
    big = [KernelSpec("copy", "memory", 2, bytes=4e9)]
    gpu = 2 * 4e9 / (SYSTEM.gpu.hbm_bandwidth_Bps * EFF.memory_bandwidth)
    assert stream_cost(big, SYSTEM).time_s == pytest.approx(gpu)
    assert stream_cost(small, SYSTEM, captured=True).time_s == pytest.approx(100 * EFF.kernel_min_s)
    both = StreamCost(1.0, 2.0, 3, 0) + StreamCost(2.0, 0.5, 1, 1)
    assert (both.gpu_s, both.issue_s, both.kernels, both.captured_kernels, both.time_s) == (3.0, 2.5, 4, 1, 3.0)


def _dense_layer(precision: str = "bf16"):
    return layer_operations(load_model("llama3-8b"), RankShape(1, 4096, precision=precision, microbatches=4),
                            moe=False)


def test_kernel_counts_of_a_dense_gqa_layer() -> None:
    """Forward: input norm 1, QKV GEMM 1, RoPE on Q and K 2, flash attention 1, output projection 1,
    bias-dropout-add 1, pre-MLP norm 1, fc1 1, bias-SwiGLU 1, fc2 1, bias-dropout-add 1 = 12.
    Backward: norms 2 each (dgrad + weight-gradient finalize), dgrad + wgrad per GEMM (4 GEMMs: 8),
    RoPE 2, flash-attention backward 3 (dO·O preprocessing, dQ/dK/dV, dQ conversion), SwiGLU 1,
    residual adds 1 each = 20. MXFP8 adds one quantize per GEMM input and per weight once per step
    (4 GEMMs x (1 + 1/4 micro-batches) forward) and one per output gradient (4 backward)."""
    bf16 = _dense_layer()
    assert sum(o.kernels for o in bf16.forward) == 12
    assert sum(o.kernels for o in bf16.backward) == 20
    mx = _dense_layer("mxfp8")
    assert sum(o.kernels for o in mx.forward) == pytest.approx(12 + 4 * 1.25)
    assert sum(o.kernels for o in mx.backward) == 20 + 4


def test_grouped_gemm_launches_one_gemm_per_local_expert() -> None:
    model = load_model("qwen3-30b-a3b")  # 128 experts
    ops = layer_operations(model, RankShape(1, 4096, ep=8), moe=True)
    fc1 = next(o for o in ops.forward if o.name == "experts.linear_fc1")
    assert fc1.kernels == 16 and fc1.groups == 16
    assert operation_time_s(fc1, SYSTEM) >= 16 * EFF.kernel_min_s


TINY = ModelSpec.model_validate(dict(  # hidden 256: every kernel of a 16-token micro-batch is tiny
    name="tiny-dense", num_layers=2, hidden_size=256, ffn_hidden_size=1024, vocab_size=2048,
    attention=dict(kind="gqa", num_heads=8, num_kv_heads=4, head_dim=32)))


def test_a_launch_bound_pass_costs_its_launches_times_the_issue_cost() -> None:
    ops = layer_operations(TINY, RankShape(1, 16), moe=False)
    f, b, _, _ = ops_time(ops, SYSTEM)
    # launches x issue cost + the framework's host time per layer pass (costmodel.layer_costs.framework_host_s)
    assert f == pytest.approx(12 * EFF.kernel_issue_s + EFF.layer_host_s)
    assert b == pytest.approx(20 * EFF.kernel_issue_s + EFF.layer_host_s)
    big = layer_operations(load_model("llama3-8b"), RankShape(4, 8192), moe=False)
    fb, _, _, _ = ops_time(big, SYSTEM)
    assert fb == pytest.approx(sum(operation_time_s(o, SYSTEM) for o in big.forward))


def test_cuda_graphs_remove_the_issue_cost_of_captured_scopes() -> None:
    ops = layer_operations(TINY, RankShape(1, 16), moe=False)
    full = GraphCapture.of(RuntimeSettings(cuda_graph_impl="full_iteration"))
    assert pass_stream(ops.forward, SYSTEM, full).issue_s == 0.0
    whole_layer = GraphCapture.of(RuntimeSettings(cuda_graph_impl="transformer_engine"))
    assert pass_stream(ops.forward, SYSTEM, whole_layer).issue_s == pytest.approx(EFF.kernel_issue_s)  # one replay
    attn = GraphCapture.of(RuntimeSettings(cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn",)))
    fwd = pass_stream(ops.forward, SYSTEM, attn)
    # attention block: input norm, QKV, RoPE x2, core, projection, residual add = 7 kernels in one graph
    assert fwd.captured_kernels == 7
    assert fwd.issue_s == pytest.approx((12 - 7 + 1) * EFF.kernel_issue_s)
    assert pass_stream(ops.forward, SYSTEM, NO_GRAPHS).issue_s == pytest.approx(12 * EFF.kernel_issue_s)
    assert pass_stream(ops.forward, SYSTEM, attn, kind="output").issue_s == pytest.approx(12 * EFF.kernel_issue_s)


def test_moe_scopes_follow_megatron() -> None:
    model = load_model("qwen3-30b-a3b")
    ops = layer_operations(model, RankShape(1, 4096, ep=8), moe=True)
    names = {o.name for o in ops.forward}

    def captured(runtime: RuntimeSettings, kind: str = "moe") -> set[str]:
        cap = GraphCapture.of(runtime)
        return {o.name for o in ops.forward if cap.captures(o, kind)}

    te = "transformer_engine"
    router = captured(RuntimeSettings(cuda_graph_impl=te, cuda_graph_scope=("moe_router",)))
    assert router == {"pre_mlp_layernorm", "router", "router_topk"}
    pre = captured(RuntimeSettings(cuda_graph_impl=te, cuda_graph_scope=("moe_router", "moe_preprocess")))
    assert pre == router | {"dispatch_preprocess"}
    assert captured(RuntimeSettings(cuda_graph_impl="local", cuda_graph_scope=("moe_router",))) == pre
    moe = captured(RuntimeSettings(cuda_graph_impl=te, cuda_graph_scope=("moe",)))
    assert "experts.linear_fc1" in moe and "input_layernorm" not in moe and "residual_add2" in moe
    assert captured(RuntimeSettings(cuda_graph_impl=te, cuda_graph_scope=("mlp",))) == set()  # dense layers only
    assert captured(RuntimeSettings(cuda_graph_impl=te)) == names
    assert GraphCapture.of(RuntimeSettings(cuda_graph_impl=te, cuda_graph_scope=("attn", "moe"))).graphs_per_pass("moe") == 2


def test_newton_schulz_gemm_efficiency_defaults_follow_their_source() -> None:
    """[S59] torch BF16 matmul on B200: 2048³ at 50 % of dense peak, 8192³ at 63 %; the defaults
    (newton_schulz_gemm 0.65, half efficiency at 5 GFLOP) give 50 % and 65 %, and a small NS GEMM
    (a Qwen3-30B-A3B expert, 768 x 2048: 2.4 GFLOP) only 21 %."""
    from costmodel.compute import newton_schulz_gemm_time_s

    b200 = load_system("dgx-b200")
    peak = b200.gpu.peak_flops_per_s.bf16

    def eff(flops: float) -> float:
        return flops / newton_schulz_gemm_time_s(flops, b200) / peak

    assert eff(2 * 2048 ** 3) == pytest.approx(0.50, abs=0.01)
    assert eff(2 * 8192 ** 3) == pytest.approx(0.63, abs=0.02)
    assert eff(2 * 768 ** 2 * 2048) == pytest.approx(0.21, abs=0.01)
