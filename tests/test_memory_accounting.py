"""Memory per GPU: Megatron's distributed-optimizer table, Muon layer-wise state, activations."""

from __future__ import annotations

import typing

import pytest

from workloads.activations import (
    RECOMPUTE_MODULES,
    LayerShape,
    inflight_chunk_microbatches,
    layer_activation_bytes,
    layer_activation_terms,
)
from workloads.inventory import inventory_for
from workloads.memory import (
    distributed_optimizer_bytes_per_param,
    memory_breakdown,
    memory_by_stage,
)
from workloads.models import GqaAttention, ModelSpec
from workloads.scenario import DEFAULT_SCENARIO, Parallelism, RecomputeModule, build_config


def _scenario(**flags: object):
    return build_config(DEFAULT_SCENARIO.model_dump(), flags).resolve()


def _dense(gpus: int, **flags: object):
    """llama3-8b, TP1 PP1: every GPU holds all 8.03 B parameters; dp = gpus."""
    base = dict(model="llama3-8b", gpus=gpus, tp=1, pp=1, vpp=1, ep=1, micro_batch_size=1,
                global_batch_size=8 * gpus, seq_length=1024)
    return _scenario(**(base | flags))


@pytest.mark.parametrize("dp", [1, 2, 8, 64])
def test_adamw_element_wise_reproduces_6_plus_12_over_dp_per_component(dp: int) -> None:
    sc = _dense(dp, optimizer="adamw")
    m = memory_breakdown(sc)
    n = inventory_for(sc).params_total
    assert m.params_per_gpu == n
    assert m.weights_bytes / n == 2  # bf16 parameters
    assert m.gradients_bytes / n == 4  # fp32 gradient buffer (grad_reduce_dtype fp32)
    assert m.optimizer_state_bytes / n == pytest.approx(12 / dp, rel=1e-12)  # fp32 master + m + v
    assert m.optimizer_workspace_bytes == 0
    per_param = (m.weights_bytes + m.gradients_bytes + m.optimizer_state_bytes) / n
    assert per_param == pytest.approx(6 + 12 / dp, rel=1e-12)
    assert per_param == pytest.approx(distributed_optimizer_bytes_per_param(2, 4, dp), rel=1e-12)


@pytest.mark.parametrize("dp", [1, 4, 16])
def test_megatron_table_rows(dp: int) -> None:
    # dist_optimizer.md table: fp16 params+grads 4 + 16/d, bf16 + fp32 grads 6 + 12/d, fp32 8 + 8/d
    assert distributed_optimizer_bytes_per_param(2, 2, dp) == pytest.approx(4 + 16 / dp)
    assert distributed_optimizer_bytes_per_param(2, 4, dp) == pytest.approx(6 + 12 / dp)
    assert distributed_optimizer_bytes_per_param(4, 4, dp) == pytest.approx(8 + 8 / dp)


def test_bf16_gradients_follow_the_half_precision_row() -> None:
    dp = 8
    m = memory_breakdown(_dense(dp, optimizer="adamw", grad_reduce_dtype="bf16"))
    n = m.params_per_gpu
    assert (m.weights_bytes + m.gradients_bytes) / n == 4
    # Megatron's 16/d: fp32 master, m, v persistent (12/d); the fp32 gradient copy only during the step (4/d)
    assert m.optimizer_state_bytes / n == pytest.approx(12 / dp)
    assert m.optimizer_workspace_bytes / n == pytest.approx(4 / dp)
    assert (m.optimizer_state_bytes + m.optimizer_workspace_bytes) / n == pytest.approx(16 / dp)


def test_replicated_adamw_keeps_full_state() -> None:
    m = memory_breakdown(_dense(8, optimizer="adamw", distribution="replicated"))
    assert m.optimizer_state_bytes / m.params_per_gpu == 12


def test_muon_layer_wise_state_is_8_bytes_per_owned_param_plus_adam_for_the_rest() -> None:
    dp = 8
    sc = _dense(dp, optimizer="muon")
    inv = inventory_for(sc)
    n_muon = sum(t.rank_numel for t in inv.tensors if t.optimizer == "muon")
    n_adam = sum(t.rank_numel for t in inv.tensors if t.optimizer == "adamw")
    m = memory_breakdown(sc)
    assert m.optimizer_state_bytes == pytest.approx((8 * n_muon + 12 * n_adam) / dp, rel=1e-12)
    assert m.weights_bytes + m.gradients_bytes == 6 * (n_muon + n_adam)
    # Newton-Schulz workspace of the largest matrix, fc1 [2F, H] = [28672, 4096] (bf16 matmuls):
    # fp32 U, bf16 X, bf16 A and B (H x H), fp32 output and scaled copy
    f, h = 14336, 4096
    assert m.optimizer_workspace_bytes == 4 * 2 * f * h + 2 * 2 * f * h + 2 * 2 * h * h + 2 * 4 * 2 * f * h


def test_muon_tp_modes_change_the_workspace() -> None:
    flags = dict(tp=2, optimizer="muon")
    dup, dist, block = (memory_breakdown(_dense(16, tp_mode=mode, **flags)).optimizer_workspace_bytes
                        for mode in ("duplicated", "distributed", "blockwise"))
    # duplicated gathers the full fp32 matrix; distributed keeps the shard but its Gram is over the
    # non-sharded dim (H x H for fc1 [2F/t, H], the same as blockwise's min-dim Gram here)
    assert dup > dist >= block > 0


def test_expert_state_is_sharded_over_expert_dp() -> None:
    sc = _scenario(optimizer="adamw")  # Kimi K2, 256 GPUs, PP4 EP64: expert_dp 1, dp 64
    assert (sc.dp, sc.expert_dp) == (64, 1)
    inv = inventory_for(sc)
    for stage, m in enumerate(memory_by_stage(sc)):
        ts = inv.stage_tensors(stage)
        expert = sum(t.rank_numel for t in ts if t.dp_group == "expert_dp" and t.optimizer != "none")
        dense = sum(t.rank_numel for t in ts if t.dp_group == "dp" and t.optimizer != "none")
        assert m.optimizer_state_bytes == pytest.approx(12 * expert / 1 + 12 * dense / 64, rel=1e-12)
        bias = sum(t.rank_numel for t in ts if t.optimizer == "none")
        assert bias > 0 and m.gradients_bytes == 4 * (m.params_per_gpu - bias)


def test_breakdown_is_the_most_loaded_stage_and_fits_uses_capacity() -> None:
    sc = _scenario()
    stages = memory_by_stage(sc)
    worst = memory_breakdown(sc)
    assert worst.total_bytes == max(m.total_bytes for m in stages)
    assert worst.capacity_bytes == sc.system.gpu.hbm_bytes
    parts = worst.components_bytes
    # the peak: the activations (forward/backward) and the optimizer step's buffers never coexist
    persistent = parts["weights"] + parts["weight_buffers"] + parts["gradients"] + parts["optimizer_state"]
    assert worst.total_bytes == pytest.approx(persistent + max(parts["activations"], parts["optimizer_workspace"]))
    assert worst.fits(0.0) == (worst.total_bytes <= worst.capacity_bytes)
    assert not worst.fits(0.999) or worst.total_bytes < 0.001 * worst.capacity_bytes
    with pytest.raises(ValueError):
        worst.fits(1.0)


def _korthikanti_model(h: int = 3072, heads: int = 24) -> ModelSpec:
    """MHA with SwiGLU F = 8h/3, so the MLP saves 18h bytes per token like the paper's GeLU MLP."""
    return ModelSpec(name="k", num_layers=8, hidden_size=h, ffn_hidden_size=8 * h // 3, vocab_size=32000,
                     attention=GqaAttention(num_heads=heads, num_kv_heads=heads, head_dim=h // heads))


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_layer_activations_match_korthikanti_without_dropout(tp: int) -> None:
    # Korthikanti et al. 2022 eq. 2 with SP: s*b*h*(34 + 5as/h)/t; without the two dropout masks (2sbh)
    # and with flash attention (no a*s^2 terms, fp32 LSE instead) it is (32*h + 4*a)/t per token;
    # selective recompute of core attention (eq. 5) leaves 32*h/t (34 - 2 masks).
    h, heads, s, b = 3072, 24, 2048, 2
    model = _korthikanti_model(h, heads)
    shape = LayerShape(tokens=s * b, tp=tp, sequence_parallel=True, etp=1, precision="bf16")
    assert layer_activation_bytes(model, False, shape) == s * b * (32 * h + 4 * heads) / tp
    assert layer_activation_bytes(model, False, shape, "selective", ("core_attn",)) == s * b * 32 * h / tp
    assert layer_activation_bytes(model, False, shape, "full") == s * b * 2 * h / tp
    no_sp = LayerShape(tokens=s * b, tp=tp, sequence_parallel=False, etp=1, precision="bf16")
    # without SP the 4 norm tensors (2 inputs, 2 outputs: 8h bytes/token) are replicated over tp
    assert layer_activation_bytes(model, False, no_sp) == s * b * (8 * h + (24 * h + 4 * heads) / tp)


def test_fp8_saves_quantized_gemm_inputs() -> None:
    model = _korthikanti_model()
    bf16 = LayerShape(tokens=4096, tp=1, sequence_parallel=False, etp=1, precision="bf16")
    fp8 = LayerShape(tokens=4096, tp=1, sequence_parallel=False, etp=1, precision="fp8-cs")
    assert layer_activation_bytes(model, False, fp8) < layer_activation_bytes(model, False, bf16)


def test_moe_activations_scale_with_topk_and_recompute_modules_free_memory() -> None:
    sc = _scenario()
    model = sc.model
    shape = LayerShape(tokens=4096, tp=1, sequence_parallel=False, etp=1, precision="mxfp8")
    terms = {t.name: t.size_bytes for t in layer_activation_terms(model, True, shape)}
    assert terms["expert_fc1_output"] == 4096 * 8 * 2 * 2048 * 2  # tokens * topk * 2F * bf16
    moe = layer_activation_bytes(model, True, shape)
    dense = layer_activation_bytes(model, False, shape)
    assert moe != dense
    for module in RECOMPUTE_MODULES:
        assert layer_activation_bytes(model, True, shape, "selective", (module,)) <= moe
    assert layer_activation_bytes(model, True, shape, "selective", ("moe",)) < moe / 2
    assert set(RECOMPUTE_MODULES) == set(typing.get_args(RecomputeModule))


def test_recompute_orders_stage_activations() -> None:
    none, sel, full = (memory_breakdown(_scenario(recompute=r)).activations_bytes
                       for r in ("none", "selective", "full"))
    assert none > sel > full > 0


@pytest.mark.parametrize(("pp", "vpp"), [(4, 2), (8, 4), (2, 8), (4, 16)])
def test_interleaved_inflight_matches_megatron_formula(pp: int, vpp: int) -> None:
    # first stage holds L*(1 + (pp-1)/(pp*vpp)) layer-activations (Korthikanti §4.2.3) with many micro-batches
    layers = 64
    counts = inflight_chunk_microbatches(pp, vpp, stage=0, num_microbatches=64)
    assert sum(counts) * layers / (pp * vpp) == pytest.approx(layers * (1 + (pp - 1) / (pp * vpp)))


def test_one_f_one_b_inflight() -> None:
    # 1F1B: stage p holds pp - p micro-batches (so the first stage holds all L layers' worth), capped by m
    assert [inflight_chunk_microbatches(4, 1, p, 64) for p in range(4)] == [[4], [3], [2], [1]]
    assert inflight_chunk_microbatches(4, 1, 0, num_microbatches=2) == [2]


def test_default_parallelism_field_still_accepts_module_tuple() -> None:
    p = Parallelism(global_batch_size=8, seq_length=8, recompute="selective", recompute_modules=("moe_act", "layernorm"))
    assert p.recompute_modules == ("moe_act", "layernorm")
