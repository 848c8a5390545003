"""Rules checked line by line against the Megatron-Core 0.16.1 source (identical in 0.16.0 for the
files cited; 0.14 and 0.15 have no Muon nor layer-wise optimizer), each against a value derived by
hand from that code. Megatron-Core is not imported: it is not a dependency.

Shapes: tests/test_optimizer_plan.py's ``tiny`` dense model (2 layers, hidden 64, ffn 128, vocab
256, GQA 8 heads / 4 groups of head_dim 8, untied output layer), whose backprop-order parameters are
16384 (output), 64 (final norm), then per layer 8192 (fc2), 16384 (fc1), 64 (norm), 4096 (proj),
8192 (qkv: (8 + 2·4)·8 × 64), 64 (norm), and 16384 (embedding): Σ = 106816 elements.
"""

from __future__ import annotations

import numpy as np

from costmodel.optimizer import layouts as lay
from costmodel.optimizer.newton_schulz import NsSettings
from costmodel.optimizer.plan import plan_from_inventory
from costmodel.optimizer.stage_builder import Grid, StageBuilder
from costmodel.optimizer.timer import Timer
from workloads.comm import CollectiveCall
from workloads.inventory import build_inventory
from workloads.models import ModelSpec
from workloads.scenario import OptimizerSpec

DENSE = dict(
    name="tiny", num_layers=2, hidden_size=64, ffn_hidden_size=128, vocab_size=256,
    attention=dict(kind="gqa", num_heads=8, num_kv_heads=4, head_dim=8),
)


def test_legacy_gathers_once_per_group_after_the_step() -> None:
    """Megatron-Core 0.16.1 megatron/core/optimizer/layer_wise_optimizer.py:151-182
    (``allgather_params``): each rank flattens every parameter it owns in the dp_cp group and calls
    ``torch.distributed.all_gather`` **once** with the uneven per-rank sizes (then once for expt_dp);
    the DDP buckets only all-reduce the gradients (muon.py:192-193 refuses the distributed optimizer,
    so DDP pads nothing, param_and_grad_buffer.py:638-665).

    By hand, dp = 4, bucket size 20000 elements, backprop order, a bucket closing once it reaches the
    size (param_and_grad_buffer.py:729-733): 16384+64+8192 = 24640 | 16384+64+4096 = 20544 |
    8192+64+8192+16384 = 32832 | 64+4096+8192+64+16384 = 28800. Gradients fp32: four all-reduces of
    4·24640, 4·20544, 4·32832, 4·28800 B; parameters bf16: one all_gather_v of 2·106816 = 213632 B
    (it was four, one per bucket, before)."""
    inv = build_inventory(ModelSpec.model_validate(DENSE))
    spec = OptimizerSpec(kind="muon", layer_wise_layout="legacy", bucket_size_elements=20_000)
    calls = plan_from_inventory(inv, spec, Grid(dp=4, expert_dp=4)).stages[0].gpu_collectives(0)
    assert sorted(calls) == sorted(
        [CollectiveCall("all_gather_v", "dp", 4, "bf16", 213632, 1, "param_gather")]
        + [CollectiveCall("all_reduce", "dp", 4, "fp32", 4 * n, 1, "grad_reduce") for n in (24640, 20544, 32832, 28800)])


def test_legacy_moe_gathers_once_per_dp_group() -> None:
    """The same rule with experts (layer_wise_optimizer.py:179-182): one all_gather_v over dp_cp of
    every dense parameter and one over expt_dp of every expert parameter. tiny MoE model (layer 1 MoE,
    4 experts of ffn 32, one dense layer), ep = 2, dp = expert_dp = 2 (4 GPUs, tp 1): the dense
    group holds 82496 elements (the dense model's 106816 less layer 1's fc1 + fc2, 24576, plus its
    router 4 × 64 = 256); each rank holds 2 experts of 2·32·64 + 64·32 = 6144: 12288 expert
    elements. Gathers: 2·82496 = 164992 B over dp, 2·12288 = 24576 B over expert_dp."""
    moe = dict(DENSE, moe=dict(num_experts=4, topk=2, expert_ffn_hidden_size=32, first_dense_layers=1))
    inv = build_inventory(ModelSpec.model_validate(moe), ep=2)
    spec = OptimizerSpec(kind="muon", layer_wise_layout="legacy")
    calls = plan_from_inventory(inv, spec, Grid(dp=4, expert_dp=2, ep=2)).stages[0].gpu_collectives(0)
    gathers = sorted((c.group, c.group_size, c.bytes, c.count) for c in calls if c.op == "all_gather_v")
    assert gathers == [("dp", 4, 164992, 1), ("expert_dp", 2, 24576, 1)]


def test_hidden_legacy_gather_is_per_bucket_with_the_same_bytes() -> None:
    """``hide_param_gather`` with the legacy layout: Megatron-Core 0.16.x cannot overlap it (DDP's
    overlap_param_gather needs the distributed optimizer, distributed_data_parallel.py:239 and 348,
    which Muon refuses); muonsim keeps the per-bucket variable-size gather of the later legacy
    fallback (spec §4.3), moving the same 213632 B as the single gather in four calls."""
    inv = build_inventory(ModelSpec.model_validate(DENSE))
    spec = OptimizerSpec(kind="muon", layer_wise_layout="legacy", bucket_size_elements=20_000, hide_param_gather=True)
    calls = plan_from_inventory(inv, spec, Grid(dp=4, expert_dp=4)).stages[0].gpu_collectives(0)
    gathers = [c for c in calls if c.op == "all_gather_v"]
    assert sorted(c.bytes for c in gathers) == [2 * n for n in sorted((24640, 20544, 32832, 28800))]


def test_ping_pong_reproduces_the_example_in_shard_params() -> None:
    """layer_wise_optimizer.py:94-96 (0.16.1): 4 ranks, 10 parameters p0..p9 already sorted by numel
    give [[p0, p7, p8], [p1, p6, p9], [p2, p5], [p3, p4]]: the loop 0,1,2,3,3,2,1,0 (lines 108-136)."""
    owner = lay.whole_param_owner(np.arange(1, 11), np.zeros(10), 4, "ping_pong")
    assert [np.flatnonzero(owner == r).tolist() for r in range(4)] == [[0, 7, 8], [1, 6, 9], [2, 5], [3, 4]]


def test_ping_pong_sort_is_stable_on_equal_numel() -> None:
    """``param_list.sort(key=numel)`` (line 122) is Python's stable sort: equal-numel parameters keep
    the order in which the optimizers' groups list them. Five parameters of equal numel over 2 ranks:
    positions 0..4 get 0, 1, 1, 0, 0."""
    owner = lay.whole_param_owner(np.full(5, 7), np.zeros(5), 2, "ping_pong")
    assert owner.tolist() == [0, 1, 1, 0, 0]


def test_default_bucket_size_ignores_context_parallelism() -> None:
    """Megatron-Core 0.16.1 distributed_data_parallel.py:63-65: ``bucket_size = max(40e6, 1e6 ·
    dp_group.size())`` where ``dp_group`` is built ``with_context_parallel=False``
    (process_groups_config.py:470-472). dp 32, cp 2 (the dense group dp·cp = 64 ranks):
    max(40e6, 32e6) = 40,000,000 elements, not max(40e6, 64e6) = 64,000,000."""
    spec = OptimizerSpec(kind="adamw")
    st = NsSettings.from_spec(spec)
    builder = StageBuilder(0, Grid(dp=64, expert_dp=64, cp=2), spec, Timer(None, "bf16", None), st)
    assert builder.bucket_size(0) == 40_000_000
    no_cp = StageBuilder(0, Grid(dp=64, expert_dp=64), spec, Timer(None, "bf16", None), st)
    assert no_cp.bucket_size(0) == 64_000_000


def test_legacy_gather_buffers_are_a_step_transient() -> None:
    """Megatron-Core 0.16.1 layer_wise_optimizer.py:157-165: per group, ``src`` flattens the owned
    parameters and ``output_list`` allocates every rank's flat parameters (Σ numel of the group, bf16)
    before the ``all_gather``. Qwen3-30B-A3B on 16 GPUs, tp 1, pp 1, ep 8 (dp·cp 16, expert_dp 2),
    fp32 gradients (no fp32 gradient copy). Expert elements per GPU, by hand: 48 layers × 16 local
    experts × (fc1 2·768·2048 + fc2 2048·768 = 4,718,592) = 3,623,878,656; the expert group's
    buffers: 2 B × (3,623,878,656 + 3,623,878,656 / 2) = 10,871,635,968 B, larger than the dense
    group's (its ~1.5e9 elements × (1 + 1/16) × 2 B) and than the Newton–Schulz workspace, so it is
    the step workspace. Hidden gathers (per bucket, received into the gradient buffer) and the
    current layout have none: their workspace is the Newton–Schulz one alone."""
    from workloads.memory import memory_breakdown
    from workloads.scenario import ScenarioConfig

    def workspace(layout: str, hide: bool) -> float:
        sc = ScenarioConfig(model="qwen3-30b-a3b", gpus=16, parallelism=dict(
            tp=1, pp=1, vpp=1, ep=8, global_batch_size=32, seq_length=4096, micro_batch_size=1),
            optimizer=dict(layer_wise_layout=layout, hide_param_gather=hide)).resolve()
        assert (sc.dp * sc.par.cp, sc.expert_dp, sc.optimizer.grad_bytes) == (16, 2, 4)
        return memory_breakdown(sc).optimizer_workspace_bytes

    assert workspace("legacy", False) == 10_871_635_968
    ns_only = workspace("current", False)
    assert ns_only < 1e9 and workspace("legacy", True) == ns_only
