"""Model building blocks of the Megatron CI models, against hand calculations.

The model is Megatron-LM's functional-test GPT (``gpt3_mcore_te_*``): 12 layers, h = 512, 8 heads
(MHA), ffn 2048, GELU, LayerNorm, learned absolute positions (1024), tied embeddings, linear
biases, GPT-2 BPE vocabulary 50,257 padded to 50,304 (a multiple of 128).
"""

from __future__ import annotations

import pytest

from costmodel.analytic import analytic_timing
from costmodel.layer_costs import collective_s
from costmodel.optimizer.plan import build_optimizer_plan
from costmodel.step_structure import build_step_structure
from topologies.groups import GroupShape
from topologies.inputs import UserInputError
from topologies.placement import placement_for
from workloads.flops import model_flop_terms
from workloads.inventory import build_inventory
from workloads.layer_assembly import layer_operations
from workloads.memory import stage_memory
from workloads.models import GqaAttention, ModelSpec
from workloads.operations import RankShape
from workloads.scenario import build_config

H, L, F, V_PAD, POS = 512, 12, 2048, 50304, 1024
V_PAD_TP2 = 50432  # Megatron pads to a multiple of 128 x tp

CI_GPT = ModelSpec(
    name="ci-gpt", num_layers=L, hidden_size=H, ffn_hidden_size=F, vocab_size=50257,
    attention=GqaAttention(num_heads=8, num_kv_heads=8, head_dim=64),
    activation="gelu", normalization="layernorm", position_embedding="learned_absolute",
    max_position_embeddings=POS, tie_embeddings=True, add_bias_linear=True,
)

# one layer: LN1 (w, b) + QKV (3h·h + 3h) + proj (h·h + h) + LN2 (w, b) + fc1 (F·h + F) + fc2 (h·F + h)
LAYER = 2 * H + (3 * H * H + 3 * H) + (H * H + H) + 2 * H + (F * H + F) + (H * F + H)


def _scenario(model: ModelSpec, gpus: int = 8, placement: dict | None = None, **par):
    base = dict(tp=1, pp=1, vpp=1, micro_batch_size=4, global_batch_size=32, seq_length=1024)
    base.update(par)
    cfg = build_config({"model": model.model_dump(), "system": "dgx-h100", "gpus": gpus, "precision": "bf16",
                        "parallelism": base, "optimizer": {"kind": "adamw", "distribution": "replicated"},
                        "placement": placement or {}}, {})
    return cfg.resolve()


def test_parameters_of_the_ci_gpt_by_hand():
    assert LAYER == 3_152_384  # 12 h² + 13 h with F = 4h
    inv = build_inventory(CI_GPT)
    expected = V_PAD * H + POS * H + L * LAYER + 2 * H  # + final LayerNorm (w, b); no output layer: tied
    assert expected == 64_109_568
    assert inv.params_total == expected
    assert not any(t.name == "output_layer.weight" for t in inv.tensors)


def test_tied_replica_on_the_last_stage_is_held_but_counted_once():
    inv = build_inventory(CI_GPT, tp=2, pp=2)
    assert inv.params_total == build_inventory(CI_GPT, tp=2).params_total
    replica = [t for t in inv.tensors if t.duplicate_of is not None]
    assert [(t.name, t.stage, t.rank_numel) for t in replica] == [("output_layer.weight", 1, V_PAD_TP2 // 2 * H)]
    # both ends are Megatron shared embeddings: own DDP bucket, gradients all-reduced over embd
    assert [t.name for t in inv.tensors if t.shared_embedding] == ["embedding.word_embeddings.weight", "output_layer.weight"]
    # stage 1 holds 6 layers (tp-sharded: QKV, fc1 and their biases, proj, fc2), the final norm and the replica
    sharded = (3 * H * H + 3 * H) + H * H + (F * H + F) + H * F
    per_layer = sharded // 2 + (LAYER - sharded)
    assert inv.rank_numel(1) == 6 * per_layer + 2 * H + V_PAD_TP2 // 2 * H


def test_the_replica_has_weights_gradients_and_optimizer_state_on_its_stage():
    tied = _scenario(CI_GPT, pp=2)
    untied = _scenario(CI_GPT.model_copy(update={"tie_embeddings": False}), pp=2)
    a, b = stage_memory(tied, 1), stage_memory(untied, 1)
    assert a.weights_bytes == b.weights_bytes and a.optimizer_state_bytes == b.optimizer_state_bytes
    one_stage = stage_memory(_scenario(CI_GPT), 0)
    one_stage_untied = stage_memory(_scenario(CI_GPT.model_copy(update={"tie_embeddings": False})), 0)
    # replicated AdamW, bf16 params, fp32 grads: 2 B weight, 4 B grad, 12 B state (m, v, fp32 master)
    assert one_stage_untied.weights_bytes - one_stage.weights_bytes == 2 * V_PAD * H
    assert one_stage_untied.gradients_bytes - one_stage.gradients_bytes == 4 * V_PAD * H
    assert one_stage_untied.optimizer_state_bytes - one_stage.optimizer_state_bytes == 12 * V_PAD * H


def test_gelu_flops_and_fc1_have_f_columns_not_2f():
    terms = model_flop_terms(CI_GPT, 1024)
    assert terms.dense_mlp == 12.0 * H * F * L  # the convention's gamma = 1 for a non-gated MLP
    swiglu = CI_GPT.model_copy(update={"activation": "swiglu"})
    assert model_flop_terms(swiglu, 1024).dense_mlp == 1.5 * terms.dense_mlp
    ops = {o.name: o for o in layer_operations(CI_GPT, RankShape(4, 1024, tp=2), moe=False).forward}
    assert ops["mlp.linear_fc1"].n == F // 2
    t = 4 * 1024
    assert ops["mlp.gelu"].bytes == 2 * t * (F // 2) * 2  # read and write F/tp bf16 values per token
    assert "rope" not in ops  # learned absolute positions: no rotary kernel


def test_layernorm_writes_its_mean_and_rmsnorm_does_not():
    t = 4 * 1024
    ln = {o.name: o for o in layer_operations(CI_GPT, RankShape(4, 1024), moe=False).forward}
    rms = {o.name: o for o in layer_operations(CI_GPT.model_copy(update={"normalization": "rmsnorm"}),
                                               RankShape(4, 1024), moe=False).forward}
    assert rms["input_layernorm"].bytes == 2 * t * H * 2
    assert ln["input_layernorm"].bytes == 2 * t * H * 2 + 4 * t


def _embd_calls(scenario):
    plan = build_optimizer_plan(scenario)
    return [(s.stage, c) for s in plan.stages for c in s.bucket_calls if c.phase == "embedding_grad"]


def test_embedding_gradient_all_reduce_bytes_and_its_time_in_the_step():
    tied = _scenario(CI_GPT, tp=2, pp=2)
    calls = _embd_calls(tied)
    # one all-reduce on each end of the embd group: the whole local shard of fp32 main grads
    assert [(s, c.op, c.group, c.group_size, c.dtype, c.bytes) for s, c in calls] == [
        (0, "all_reduce", "embd", 2, "fp32", V_PAD_TP2 // 2 * H * 4), (1, "all_reduce", "embd", 2, "fp32", V_PAD_TP2 // 2 * H * 4)]
    assert _embd_calls(_scenario(CI_GPT, tp=2)) == []  # one stage: no replica
    assert _embd_calls(_scenario(CI_GPT.model_copy(update={"tie_embeddings": False}), tp=2, pp=2)) == []
    ar_s = collective_s("all_reduce", V_PAD_TP2 // 2 * H * 4, placement_for(tied).shape("embd"), tied.system)[0]
    st = build_step_structure(tied, overlap=False)
    assert [s.embedding_grad_s for s in st.stages] == pytest.approx([ar_s, ar_s])
    assert analytic_timing(st).step_time_s > 0


def test_embedding_gradient_all_reduce_stays_in_the_node_under_tp_pp_dp():
    """16 GPUs = two 8-GPU DGX H100 nodes, tp 2, pp 2, dp 4. Default order (pp outermost): the
    embedding pair of rank b < 8 is {b, b + 8}, one rank in each node. tp-pp-dp order: rank =
    t + 2·stage + 4·replica, the pair is {t + 4d, t + 4d + 2}, both in one node (NVLink)."""
    nbytes = V_PAD_TP2 // 2 * H * 4
    times = {}
    for mapped in (False, True):
        sc = _scenario(CI_GPT, gpus=16, placement={"use_tp_pp_dp_mapping": mapped}, tp=2, pp=2)
        times[mapped] = build_step_structure(sc, overlap=False).stages[0].embedding_grad_s
        inter = GroupShape(size=2, ranks_per_domain=1, domains=2, tiers=placement_for(sc).layout.tier_for_span(2))
        shape = GroupShape.single_domain(2) if mapped else inter
        assert times[mapped] == pytest.approx(collective_s("all_reduce", nbytes, shape, sc.system)[0])
    assert times[True] < times[False]


def test_a_precision_the_gpu_lacks_is_refused_with_one_line():
    with pytest.raises(UserInputError) as err:
        build_config({"model": "llama3-8b", "system": "dgx-a100", "gpus": 8, "precision": "fp8-cs",
                      "parallelism": {"global_batch_size": 8, "seq_length": 4096}}, {}).resolve()
    assert "not supported by the A100" in str(err.value) and "valid: bf16, fp16" in str(err.value) and "dgx-a100" in str(err.value) and "\n" not in str(err.value)
    ok = build_config({"model": "llama3-8b", "system": "dgx-a100", "gpus": 8, "precision": "fp16",
                       "parallelism": {"global_batch_size": 8, "seq_length": 4096}}, {}).resolve()
    assert ok.system.peak_flops_per_s(ok.precision) == 312e12
