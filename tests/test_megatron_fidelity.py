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
    from workloads.memory import optimizer_state_bytes
    from workloads.scenario import ScenarioConfig

    def state(layout: str) -> float:
        sc = ScenarioConfig(model="qwen3-30b-a3b", gpus=4, parallelism=dict(
            tp=4, ep=2, global_batch_size=8, seq_length=4096), optimizer=dict(layer_wise_layout=layout)).resolve()
        assert (sc.dp * sc.par.cp, sc.expert_dp) == (1, 2)
        return optimizer_state_bytes(sc, [t for t in build_inventory(sc.model, tp=4, ep=2).tensors])

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
