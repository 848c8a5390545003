"""Per-rank operations (FLOPs under tp/cp/ep, recompute, casts) and the compute model."""

from __future__ import annotations

import dataclasses

import pytest

from costmodel.compute import gemm_efficiency, gemm_time_s, operation_time_s
from topologies.hardware import load_system
from workloads.flops import model_flop_terms
from workloads.layer_assembly import layer_operations
from workloads.models import load_model
from workloads.operations import RankShape
from workloads.stage_end_operations import output_operations


def _gemm_flops(ops, kinds=("gemm", "grouped_gemm")) -> float:
    return sum(o.flops for o in ops.forward + ops.backward if o.kind in kinds and not o.name.startswith("recompute."))


def test_gemm_flops_reproduce_the_model_flop_convention() -> None:
    model = load_model("llama3-8b")
    shape = RankShape(micro_batch_size=1, seq_length=8192)
    per_layer = _gemm_flops(layer_operations(model, shape, moe=False))
    total = model.num_layers * per_layer + _gemm_flops(output_operations(model, shape))
    terms = model_flop_terms(model, 8192)
    expected = terms.dense_mlp + terms.attention_projections + terms.logits
    assert total / shape.tokens == pytest.approx(expected, rel=1e-12)
    # attention core forward = the convention's causal forward share (1/3 of fwd+bwd)
    core = sum(o.flops for o in layer_operations(model, shape, moe=False).forward if o.kind == "attention")
    assert core * model.num_layers / shape.tokens == pytest.approx(terms.attention_core / 3, rel=1e-12)


def test_tensor_and_context_parallel_split_the_work() -> None:
    model = load_model("llama3-70b")
    base = _gemm_flops(layer_operations(model, RankShape(1, 8192), moe=False))
    tp2 = _gemm_flops(layer_operations(model, RankShape(1, 8192, tp=2, sequence_parallel=True), moe=False))
    assert tp2 == pytest.approx(base / 2, rel=1e-12)
    cp2 = layer_operations(model, RankShape(1, 8192, cp=2), moe=False)
    full = layer_operations(model, RankShape(1, 8192), moe=False)
    att = [sum(o.flops for o in x.forward if o.kind == "attention") for x in (full, cp2)]
    assert att[1] == pytest.approx(att[0] / 2, rel=1e-12)


def test_expert_work_per_rank_is_balanced_over_expert_parallel_ranks() -> None:
    model = load_model("qwen3-30b-a3b")
    ops = {ep: layer_operations(model, RankShape(1, 4096, ep=ep), moe=True) for ep in (1, 8)}
    experts = {ep: [o for o in x.forward if o.name == "experts.linear_fc1"][0] for ep, x in ops.items()}
    assert experts[1].flops == experts[8].flops  # each rank processes its own tokens' worth of top-k pairs
    assert (experts[1].groups, experts[8].groups) == (128, 16)
    assert experts[8].m == 4096 * 8


def test_recompute_adds_forward_work_to_backward() -> None:
    model = load_model("llama3-8b")
    shape = RankShape(1, 4096)
    none = layer_operations(model, shape, moe=False)
    full = layer_operations(model, shape, moe=False, recompute="full")
    sel = layer_operations(model, shape, moe=False, recompute="selective", recompute_modules=("core_attn",))
    assert full.backward_flops - none.backward_flops == pytest.approx(none.forward_flops)
    core = sum(o.flops for o in none.forward if o.module == "core_attn")
    assert sel.backward_flops - none.backward_flops == pytest.approx(core)


def test_low_precision_pays_casts_and_keeps_logits_in_bf16() -> None:
    model = load_model("llama3-8b")
    bf16 = layer_operations(model, RankShape(1, 4096), moe=False)
    mx = layer_operations(model, RankShape(1, 4096, precision="mxfp8"), moe=False)
    assert not [o for o in bf16.forward if o.kind == "quantize"]
    assert [o for o in mx.forward if o.kind == "quantize"]
    assert {o.tensor_class for o in mx.forward if o.kind == "gemm"} == {"fp8"}
    out = output_operations(model, RankShape(1, 4096, precision="mxfp8"))
    assert {o.tensor_class for o in out.forward if o.kind == "gemm"} == {"bf16"}


def test_gemm_efficiency_grows_with_size_and_scales_with_peak() -> None:
    sysm = load_system("gb300-nvl72")
    small, large = gemm_efficiency(1e9, sysm, "bf16"), gemm_efficiency(1e13, sysm, "bf16")
    assert small < large < sysm.efficiency.gemm_bf16
    # the small-GEMM overhead is a fixed time: at twice the peak, half efficiency needs twice the FLOPs
    f_half = sysm.efficiency.gemm_half_efficiency_flops
    assert gemm_efficiency(f_half, sysm, "bf16") == pytest.approx(sysm.efficiency.gemm_bf16 / 2)
    assert gemm_efficiency(2 * f_half, sysm, "fp8") == pytest.approx(sysm.efficiency.gemm_fp8 / 2)
    assert gemm_time_s(1e12, sysm, "fp8") < gemm_time_s(1e12, sysm, "bf16")


def test_operation_times_fall_with_more_flops_or_bandwidth() -> None:
    sysm = load_system("gb300-nvl72")
    faster = sysm.model_copy(update={"gpu": sysm.gpu.model_copy(update={
        "peak_flops_per_s": sysm.gpu.peak_flops_per_s.model_copy(update={"bf16": 5e15, "fp8": 1e16}),
        "hbm_bandwidth_Bps": 16e12})})
    ops = layer_operations(load_model("qwen3-30b-a3b"), RankShape(1, 4096, precision="mxfp8", ep=8), moe=True)
    for op in ops.forward + ops.backward:
        assert operation_time_s(op, faster) <= operation_time_s(op, sysm)
        assert operation_time_s(op, sysm) >= 0
    assert dataclasses.is_dataclass(ops.forward[0])
