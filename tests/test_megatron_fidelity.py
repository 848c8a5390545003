"""Megatron-Core fidelity rules (issue 13 item 5), each against a value derived by hand.

Shapes: the reference backend's ``tiny`` preset (2 layers, hidden 64, layer 1 is MoE with 4 experts
of expert_ffn_hidden_size 32), so every count can be checked on paper.
"""

from __future__ import annotations

import numpy as np

from costmodel.optimizer.plan import plan_from_inventory
from costmodel.optimizer.stage_builder import Grid
from reference.workload import load_shapes
from workloads.comm import CollectiveCall
from workloads.inventory import build_inventory
from workloads.scenario import OptimizerSpec


def test_legacy_dp_cp_one_steps_every_expert_on_every_rank() -> None:
    """tp = 2, dp·cp = 1, ep = etp = 1, expert_dp = 2 (2 GPUs), legacy layer-wise Muon.

    Megatron-Core 0.16.1 ``LayerWiseDistributedOptimizer.shard_params`` returns early when the dp_cp
    group has one rank (both owner lists None): no expert is sharded over expert_dp and
    ``allgather_params`` gathers nothing. By hand: the 4 experts' fc1 (2·32 × 64 = 4096) and fc2
    (64 × 32 = 2048) are all local (ep 1, etp 1): 4·(4096 + 2048) = 24576 expert elements stepped by
    **each** GPU (a ping-pong over expert_dp 2 would give each 12288). Their fp32 gradients are
    all-reduced over expert_dp in one bucket: 24576 · 4 = 98304 B. The dense dp group has one rank:
    no dense collective (the dense matrices' duplicated-mode TP gathers are not checked here).
    """
    inv = build_inventory(load_shapes("tiny"), tp=2, etp=1, split_qkv=True)
    spec = OptimizerSpec(kind="muon", layer_wise_layout="legacy")
    plan = plan_from_inventory(inv, spec, Grid(dp=1, expert_dp=2, tp=2, etp=1))
    stage = plan.stages[0]
    expert = next(r for r in stage.roles if r.group == "expert_dp")
    expert_numel = {"expert_fc1": 4096, "expert_fc2": 2048}
    for gpu in range(2):
        owned = [n for n in stage.owned_tensors(gpu) if ".experts." in n]
        assert len(owned) == 8 and sum(expert_numel["expert_fc1" if "fc1" in n else "expert_fc2"] for n in owned) == 24576
        dp_calls = [c for c in stage.gpu_collectives(gpu) if c.group != "tp"]  # tp: duplicated NS gathers
        assert dp_calls == [CollectiveCall("all_reduce", "expert_dp", 2, "fp32", 98304, 1, "grad_reduce")]
    assert np.all(expert.owner == -1)
    assert all(b.gather_op is None for b in stage.buckets)
    assert any("shard_params returns early" in n for n in plan.notes)
    # with dp·cp > 1 the same layout shards the experts (ping-pong over expert_dp): half each
    sharded = plan_from_inventory(build_inventory(load_shapes("tiny"), tp=1, etp=1), spec, Grid(dp=2, expert_dp=2))
    owned0 = [n for n in sharded.stages[0].owned_tensors(0) if ".experts." in n]
    assert len(owned0) == 4


def test_legacy_dp_cp_one_keeps_whole_expert_state_in_memory() -> None:
    """Qwen3-30B-A3B on 4 GPUs, tp 4, ep 2 (dp·cp = 1, expert_dp = 4/(ep 2) = 2), Muon, fp32 grads.

    Expert elements per GPU, by hand: 48 layers × 64 local experts × (fc1 2·768·2048 + fc2 2048·768 =
    4,718,592) = 14,495,514,624. Muon state per element: fp32 momentum 4 + fp32 master 4 = 8 B. The
    legacy layout at dp·cp = 1 shards nothing (115,964,116,992 B per GPU); the current layout shards
    experts over expert_dp 2, so the legacy layout holds 57,982,058,496 B more. Dense state is the
    same in both (dp·cp = 1).
    """
    from workloads.optimizer_memory import optimizer_bytes
    from workloads.scenario import ScenarioConfig

    def state(layout: str) -> float:
        sc = ScenarioConfig(model="qwen3-30b-a3b", gpus=4, parallelism=dict(
            tp=4, ep=2, global_batch_size=8, seq_length=4096), optimizer=dict(layer_wise_layout=layout)).resolve()
        assert (sc.dp * sc.par.cp, sc.expert_dp) == (1, 2)
        return optimizer_bytes(sc, [t for t in build_inventory(sc.model, tp=4, ep=2).tensors]).persistent

    assert state("legacy") - state("current") == 57_982_058_496


def test_eo_version_gates_syrk_and_cubic5() -> None:
    """Megatron-Core pins Emerging-Optimizers 0.3.0, whose TP Newton-Schulz has no SYRK and which has no
    cubic5 schedule (both from 0.4): refused with one line naming the setting, accepted with 0.4.0."""
    import pytest

    from topologies.inputs import UserInputError
    from workloads.scenario import DEFAULT_SCENARIO, OptimizerSpec

    assert OptimizerSpec().eo_version == "0.3.0"
    base = DEFAULT_SCENARIO.resolve()
    for flags, named in (({"use_syrk": True}, "use_syrk"), ({"ns_coefficients": "cubic5"}, "cubic5")):
        with pytest.raises(UserInputError, match=rf"{named}.*needs? Emerging-Optimizers >= 0.4.*eo_version is 0.3.0") as err:
            base.with_updates(**flags)
        assert "\n" not in str(err.value)
        assert base.with_updates(eo_version="0.4.0", **flags).optimizer.eo_version_tuple == (0, 4, 0)
    with pytest.raises(UserInputError, match="eo_version"):
        base.with_updates(eo_version="latest")
    assert base.with_updates(optimizer="adamw", use_syrk=True).optimizer.use_syrk  # AdamW runs no Newton-Schulz


def test_hypothetical_pairs_are_labelled_and_defaults_are_megatron() -> None:
    """Megatron's layer-wise layouts: legacy balances by ping-pong only, current by LPT only; other
    pairs are what-ifs and the report says so (JSON flag + note). Megatron's DDP default is
    overlap_param_gather=False, and so is hide_param_gather."""
    from costmodel.analytic import run_analytic
    from workloads.scenario import DEFAULT_SCENARIO

    assert OptimizerSpec().hide_param_gather is False
    base = DEFAULT_SCENARIO.resolve()
    real = run_analytic(base).optimizer
    assert real is not None and not real.hypothetical
    assert not run_analytic(base.with_updates(layer_wise_layout="legacy")).optimizer.hypothetical  # type: ignore[union-attr]
    for layout, lb in (("legacy", "lpt"), ("legacy", "none"), ("current", "ping_pong"), ("current", "none")):
        opt = run_analytic(base.with_updates(layer_wise_layout=layout, load_balance=lb)).optimizer
        assert opt is not None and opt.hypothetical
        assert any(n.startswith("hypothetical:") and f"{layout} with load_balance {lb}" in n for n in opt.notes)
        assert opt.model_dump(mode="json")["hypothetical"] is True
    assert not run_analytic(base.with_updates(optimizer="adamw", load_balance="none")).optimizer.hypothetical  # type: ignore[union-attr]


def _tiny_mtp():
    from workloads.models import ModelSpec

    return ModelSpec.model_validate(load_shapes("tiny").model_dump() | {"mtp_layers": 1})


def test_mtp_with_pipeline_stages_copies_the_word_embedding() -> None:
    """Tiny model (vocab 256, hidden 64, tp 1: the vocabulary is already a multiple of 128) with one MTP
    layer on pp = 2, dp = expert_dp = 2, AdamW element-wise, fp32 gradients.

    By hand: the last stage holds its own 256 × 64 = 16384-element word embedding (GPTModel builds
    ``embedding`` where mtp_process); it is not a new model parameter. Both copies are
    ``shared_embedding``: each sits alone in a DDP bucket (distributed optimizer) of
    round_up(16384, lcm(2, 128)) = 16384 elements, and after the DP reduction their gradients are
    all-reduced over the embedding group {first stage, last stage}: 16384 × 4 B = 65536 B once per step
    on every GPU of stages 0 and 1. Without pp (pp = 1) there is no copy and no all-reduce.
    """
    model = _tiny_mtp()
    flat = build_inventory(model, pp=1)
    inv = build_inventory(model, pp=2)
    copy = inv.embedding_copy
    assert copy is not None and copy.stage == 1 and copy.rank_numel == 16384
    assert inv.params_total == flat.params_total and flat.embedding_copy is None
    assert inv.rank_numel(1) == build_inventory(_tiny_mtp().model_copy(update={"mtp_layers": 0}), pp=2).rank_numel(1) \
        + sum(t.rank_numel for t in inv.stage_tensors(1) if t.layer == model.num_layers) + 16384
    plan = plan_from_inventory(inv, OptimizerSpec(kind="adamw"), Grid(dp=2, expert_dp=2))
    embd = CollectiveCall("all_reduce", "embd", 2, "fp32", 65536, 1, "embedding_grad")
    for stage in plan.stages:
        assert all(embd in stage.gpu_collectives(g) for g in range(2))
        alone = [b for b in stage.buckets if b.used_numel == 16384 and b.numel == 16384 and b.dp_group == "dp"]
        assert len(alone) == 1  # the embedding's own bucket
    flat_plan = plan_from_inventory(flat, OptimizerSpec(kind="adamw"), Grid(dp=2, expert_dp=2))
    assert all(c.group != "embd" for c in flat_plan.stages[0].gpu_collectives(0))
    # Muon, current layout: the copy is a Muon matrix (Megatron-Core 0.16.1) and, as a shared embedding,
    # sits alone in a layer-wise bucket on shard 0 with equal padding on shard 1: 2 × round_up(16384,
    # lcm(64, 128/2)) = 32768 elements, 16384 used; dp rank 0 steps it.
    muon = plan_from_inventory(inv, OptimizerSpec(kind="muon"), Grid(dp=2, expert_dp=2)).stages[1]
    alone = [b for b in muon.buckets if b.kind == "layer_wise" and b.used_numel == 16384 and b.numel == 32768]
    assert len(alone) == 1 and "last_stage.embedding.word_embeddings.weight" in muon.owned_tensors(0)
    assert "last_stage.embedding.word_embeddings.weight" not in muon.owned_tensors(1)


def test_mtp_embedding_copy_memory_and_muon_routing() -> None:
    """DeepSeek-V3 with MTP on 256 GPUs, tp 1, pp 8 (dp 32), fp32 gradients, Muon.

    The last stage's copy holds 129280 × 7168 = 926,679,040 elements per GPU. Megatron-Core 0.16.1
    flags ``is_embedding_or_output_parameter`` only where pre_process, so the copy is a Muon matrix:
    weights 2 B + gradients 4 B + Muon state (fp32 momentum + master) 8 B / dp 32 = 6.25 B per element,
    5,791,744,000 B in all, over the same stage without it.
    """
    from workloads.memory import stage_memory
    from workloads.scenario import ScenarioConfig

    sc = ScenarioConfig(model="deepseek-v3-mtp", gpus=256, parallelism=dict(
        tp=1, pp=8, vpp=1, ep=32, micro_batch_size=1, global_batch_size=4096, seq_length=4096)).resolve()
    inv = build_inventory(sc.model, tp=1, pp=8, ep=32)
    copy = inv.embedding_copy
    assert copy is not None and copy.optimizer == "muon" and copy.rank_numel == 926_679_040
    without = type(inv)(model=inv.model, tp=1, pp=8, vpp=1, ep=32, etp=1, split_qkv=True,
                        runs=tuple(r for r in inv.runs if copy not in r.templates))
    a, b = stage_memory(sc, 7, inv), stage_memory(sc, 7, without)
    assert a.weights_bytes - b.weights_bytes == 1_853_358_080
    assert a.gradients_bytes - b.gradients_bytes == 3_706_716_160
    assert a.optimizer_state_bytes - b.optimizer_state_bytes == 231_669_760
    assert stage_memory(sc, 3, inv).weights_bytes == stage_memory(sc, 3, without).weights_bytes


def test_embedding_all_reduce_in_step_structure_and_engines() -> None:
    """The all-reduce runs on stages 0 and pp−1 only (group embd, 3,706,716,160 B = 926,679,040 × 4),
    after both reduced their DP gradients and before the optimizer step: the analytic barrier is at least
    max(grad done of stages 0 and pp−1) + its time; the two engines agree without overlap (5 %)."""
    from costmodel.analytic import run_analytic
    from costmodel.des.engine import run_des
    from costmodel.layer_costs import collective_s
    from costmodel.step_structure import build_step_structure
    from topologies.placement import placement_for
    from workloads.scenario import ScenarioConfig

    sc = ScenarioConfig(model="deepseek-v3-mtp", gpus=256, parallelism=dict(
        tp=1, pp=8, vpp=1, ep=32, micro_batch_size=1, global_batch_size=4096, seq_length=4096),
        optimizer=dict(kind="adamw")).resolve()
    st = build_step_structure(sc)
    expected = collective_s("all_reduce", 3_706_716_160, placement_for(sc).shape("embd"), sc.system)[0]
    assert [s.embedding_grad_s for s in st.stages] == [expected] + [0.0] * 6 + [expected]
    assert expected > 0
    a, d = run_analytic(sc, overlap=False), run_des(sc, overlap=False, contention=False)
    assert abs(a.step_time_s - d.step_time_s) <= 0.05 * a.step_time_s
    assert a.breakdown_s.exposed_comm["dp_grad"] >= expected


def _tiny_scenario(precision: str, **optimizer):  # noqa: ANN202
    """A Scenario over the tiny shapes on 2 GB300 GPUs (dp = expert_dp = 2), AdamW element-wise."""
    from topologies.hardware import load_system
    from workloads.scenario import Scenario, ScenarioConfig

    cfg = ScenarioConfig(gpus=2, precision=precision, parallelism=dict(global_batch_size=2, seq_length=128),  # type: ignore[arg-type]
                         optimizer=dict(kind="adamw", **optimizer))
    return Scenario(config=cfg, system=load_system(cfg.system), model=load_shapes("tiny"))


def test_fp8_param_gather_bytes_and_memory() -> None:
    """Tiny shapes, tp 1, dp = expert_dp = 2, AdamW element-wise, fp32 gradients, one bucket per buffer.

    TE linear weights (FP8 under fp8_param_gather): QKV 128×64 = 8192 and proj 64×64 = 4096 in both
    layers, fc1 256×64 = 16384 and fc2 64×128 = 8192: 49152 dense elements; the 4 experts' fc1 64×64
    and fc2 64×32: 4·(4096 + 2048) = 24576 expert elements. BF16: embedding and output 256×64 = 16384
    each, router 4×64 = 256, five norms of 64: 33344. Every size is a multiple of 64 (no start
    padding); bucket ends are padded to lcm(2, 128) = 128.
    - Off: one dense buffer of 82496 -> 82560 elements, gathered in BF16: 165120 B; experts 24576 × 2
      = 49152 B.
    - fp8-cs: the FP8 parameters get their own buffers (param dtype uint8): dense FP8 49152 × 1 B =
      49152 B (dtype fp8), dense BF16 33344 -> 33408 × 2 = 66816 B, experts 24576 × 1 = 24576 B (fp8).
      Weights per GPU: 33344·2 + 73728·1 = 140416 B (off: 107072·2 = 214144 B).
    - mxfp8 with reuse_grad_buf_for_mxfp8_param_ag: gathered in BF16 through the gradient buffer:
      98304, 66816 and 49152 B; weights 33344·2 + 73728·2·(1 + 1/32) = 218752 B; without reuse a
      separate BF16 gather buffer on top: + 73728·2 = 147456 B of weight buffers (366208 B in all).
    - Off, the TE linear weights stay BF16 and Transformer Engine caches their FP8 copy (1 B per
      element on GB300, whose FP8 GEMMs take any layout): 73728 B of weight buffers.
    """
    from costmodel.optimizer.plan import plan_from_inventory as plan_of
    from workloads.weight_memory import stage_weights

    inv = build_inventory(load_shapes("tiny"))
    grid = Grid(dp=2, expert_dp=2)

    def gathers(precision: str, **opt) -> list[tuple[str, str, int]]:  # noqa: ANN003
        spec = OptimizerSpec(kind="adamw", **opt)
        calls = plan_of(inv, spec, grid, precision=precision).stages[0].gpu_collectives(0)
        return sorted((c.group, c.dtype, c.bytes) for c in calls if c.phase == "param_gather")

    assert gathers("fp8-cs") == [("dp", "bf16", 165120), ("expert_dp", "bf16", 49152)]
    assert gathers("fp8-cs", fp8_param_gather=True) == [("dp", "bf16", 66816), ("dp", "fp8", 49152),
                                                        ("expert_dp", "fp8", 24576)]
    assert gathers("mxfp8", fp8_param_gather=True, reuse_grad_buf_for_mxfp8_param_ag=True) == [
        ("dp", "bf16", 66816), ("dp", "bf16", 98304), ("expert_dp", "bf16", 49152)]
    assert gathers("bf16", fp8_param_gather=True) == gathers("bf16")  # no FP8 parameters: no effect
    def weights(precision: str, **opt) -> tuple[float, float]:  # noqa: ANN003 - (parameters, weight buffers) B
        w = stage_weights(_tiny_scenario(precision, **opt), inv, 0)
        return w.params_bytes, w.buffers_bytes

    assert weights("fp8-cs") == (214144, 73728)
    assert weights("fp8-cs", fp8_param_gather=True) == (140416, 0)
    assert weights("mxfp8", fp8_param_gather=True, reuse_grad_buf_for_mxfp8_param_ag=True) == (218752, 0)
    assert weights("mxfp8", fp8_param_gather=True) == (218752, 147456)


def test_fp8_param_gather_is_bf16_for_muon_and_needs_it_for_reuse() -> None:
    """Muon's layer-wise optimizer gathers BF16: the setting has no effect (a plan note says so);
    reuse_grad_buf_for_mxfp8_param_ag without fp8_param_gather is refused (Megatron asserts it)."""
    import pytest

    from costmodel.optimizer.plan import plan_from_inventory as plan_of
    from topologies.inputs import UserInputError
    from workloads.scenario import DEFAULT_SCENARIO

    inv = build_inventory(load_shapes("tiny"))
    plan = plan_of(inv, OptimizerSpec(kind="muon", fp8_param_gather=True), Grid(dp=2, expert_dp=2), precision="mxfp8")
    assert all(b.param_dtype == "bf16" for b in plan.stages[0].buckets)
    assert any(n.startswith("fp8_param_gather has no effect") for n in plan.notes)
    with pytest.raises(UserInputError, match="needs fp8_param_gather"):
        DEFAULT_SCENARIO.resolve().with_updates(reuse_grad_buf_for_mxfp8_param_ag=True)


def test_mxfp8_parameter_gathers_on_the_distributed_optimizer_and_on_megatron_fsdp() -> None:
    """Tiny shapes as in the test below, without BF16 layers: FP8 buffers of the dense TE weights
    (layer 0: QKV 8192 + proj 4096 + fc1 16384 + fc2 8192, layer 1: QKV + proj 12288 = 49152 elements)
    and of the experts (24576); the BF16 buffer (33344 -> 33408 elements, 66816 B) is the same in
    every case.

    - distributed optimizer, MXFP8: the FP8 buffers' parameter data is the BF16 view of the gradient
      buffer (``_ParamAndGradBuffer``: ``shared_buffer``): one all-gather of 2 B per element;
    - Megatron-FSDP (``optim``: gathered after the step), MXFP8: the ``uint8`` rowwise and columnwise
      buffers (``model_weight_buffer``, ``transpose_weight_buffer``): two all-gathers of 1 B per element;
    - fp8-cs: the ``uint8`` rowwise buffer, one all-gather of 1 B per element, in both."""
    from costmodel.optimizer.plan import plan_from_inventory as plan_of

    inv = build_inventory(load_shapes("tiny"))
    grid = Grid(dp=2, expert_dp=2)

    def gathers(precision: str, fsdp: bool) -> list[tuple[str, str, int, int]]:
        spec = OptimizerSpec(kind="adamw", fp8_param_gather=True, data_parallel_sharding_strategy="optim")
        calls = plan_of(inv, spec, grid, precision=precision, fsdp=fsdp).stages[0].gpu_collectives(0)
        return sorted((c.group, c.dtype, c.bytes, c.count) for c in calls if c.phase == "param_gather")

    bf16 = ("dp", "bf16", 66816, 1)
    assert gathers("mxfp8", fsdp=False) == [bf16, ("dp", "bf16", 2 * 49152, 1), ("expert_dp", "bf16", 2 * 24576, 1)]
    assert gathers("mxfp8", fsdp=True) == [bf16, ("dp", "fp8", 49152, 2), ("expert_dp", "fp8", 24576, 2)]
    cs = [bf16, ("dp", "fp8", 49152, 1), ("expert_dp", "fp8", 24576, 1)]
    assert gathers("fp8-cs", fsdp=False) == gathers("fp8-cs", fsdp=True) == cs


def test_fp8_parameters_leave_out_bf16_layers_and_follow_megatron_fsdp() -> None:
    """One FP8-parameter rule for the plan and the memory (``workloads.fp8_params``), tiny shapes as in
    :func:`test_fp8_param_gather_bytes_and_memory` (layer 0 dense, layer 1 MoE).

    - ``first_last_layers_bf16`` with 1 layer at the start: layer 0's TE weights (QKV 8192, proj 4096,
      fc1 16384, fc2 8192 = 36864) are built outside ``fp8_model_init`` and join the BF16 buffer:
      33344 + 36864 = 70208 -> 70272 elements × 2 B = 140544 B; FP8: layer 1's QKV and proj 12288 ×
      1 B; experts (layer 1) 24576 × 1 B.
    - Megatron-FSDP with ``optim`` (per-bucket reduce-scatter and gather after the step): the same
      FP8 buffers and gathers as the distributed optimizer (memory counts FP8 primary weights there).
    - The planner's memory floor is 1 B per parameter with fp8-cs FP8 parameters on GB300 even for a
      Muon base, since the search may pick AdamW element-wise; Hopper keeps a transposed FP8 copy (2 B).
    """
    from costmodel.optimizer.plan import plan_from_inventory as plan_of
    from workloads.scenario import DEFAULT_SCENARIO
    from workloads.weight_memory import min_weight_bytes_per_element

    inv = build_inventory(load_shapes("tiny"))
    grid = Grid(dp=2, expert_dp=2)

    def gathers(fsdp: bool = False, bf16_layers: tuple[int, int] = (0, 0), **opt) -> list[tuple[str, str, int]]:  # noqa: ANN003
        spec = OptimizerSpec(kind="adamw", fp8_param_gather=True, **opt)
        calls = plan_of(inv, spec, grid, precision="fp8-cs", fsdp=fsdp, bf16_layers=bf16_layers).stages[0].gpu_collectives(0)
        return sorted((c.group, c.dtype, c.bytes) for c in calls if c.phase == "param_gather")

    assert gathers(bf16_layers=(1, 0)) == [("dp", "bf16", 140544), ("dp", "fp8", 12288), ("expert_dp", "fp8", 24576)]
    assert gathers(fsdp=True, data_parallel_sharding_strategy="optim") == gathers()
    muon = DEFAULT_SCENARIO.resolve().with_updates(precision="fp8-cs", fp8_param_gather=True)
    assert muon.optimizer.kind == "muon" and min_weight_bytes_per_element(muon) == 1.0
    assert min_weight_bytes_per_element(muon.with_updates(system="dgx-h100")) == 2.0
    assert min_weight_bytes_per_element(muon.with_updates(fp8_param_gather=False)) == 2.0
