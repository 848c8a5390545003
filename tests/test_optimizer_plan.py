"""The optimizer plan: byte-exact collectives per distribution and TP mode, per-GPU ownership."""

from __future__ import annotations

import math

import pytest

from costmodel.optimizer import Grid, expected_rank_collectives, plan_from_inventory
from workloads.inventory import build_inventory
from workloads.models import ModelSpec
from workloads.scenario import OptimizerSpec

TINY = dict(
    name="tiny", num_layers=2, hidden_size=64, ffn_hidden_size=128, vocab_size=256,
    attention=dict(kind="gqa", num_heads=8, num_kv_heads=4, head_dim=8),
    moe=dict(num_experts=4, topk=2, expert_ffn_hidden_size=32, first_dense_layers=1),
)


def tiny(moe: bool = True, **sizes: int):
    data = dict(TINY) if moe else {k: v for k, v in TINY.items() if k != "moe"}
    return build_inventory(ModelSpec.model_validate(data), **sizes)


def params_backprop(inv, group: str, optimizer: str | None = None) -> list[int]:
    """Local numel of one rank's parameters of ``group`` in backprop order (one entry per copy)."""
    out = []
    for t in reversed(inv.tensors):
        if t.optimizer == "none" or t.dp_group != group or (optimizer and t.optimizer != optimizer):
            continue
        out += [t.local_numel] * t.experts_per_rank
    return out


def padded_bucket(sizes: list[int], d: int) -> int:
    cursor = 0
    for n in sizes:
        cursor = -(-cursor // 64) * 64 + n
    return -(-cursor // math.lcm(d, 128)) * math.lcm(d, 128)


def moved_per_gpu(calls, group: str) -> float:
    """Bytes one GPU sends (ring/bandwidth model): (d-1)/d of the nccl size for RS/AG."""
    return sum((c.group_size - 1) / c.group_size * c.bytes * c.count for c in calls if c.group == group)


@pytest.mark.parametrize("d", [2, 4, 8, 16])
@pytest.mark.parametrize("grad_dtype,bg", [("fp32", 4), ("bf16", 2)])
def test_element_wise_bytes_per_gpu(d: int, grad_dtype: str, bg: int) -> None:
    inv = tiny(moe=True, ep=2)
    plan = plan_from_inventory(inv, OptimizerSpec(kind="adamw", grad_reduce_dtype=grad_dtype),
                               Grid(dp=d, expert_dp=d // 2, ep=2))
    calls = plan.stages[0].gpu_collectives(0)
    n_dense = padded_bucket(params_backprop(inv, "dp"), d)
    assert moved_per_gpu(calls, "dp") == pytest.approx((d - 1) / d * n_dense * (bg + 2))
    assert {(c.op, c.dtype) for c in calls if c.group == "dp"} == {("reduce_scatter", grad_dtype), ("all_gather", "bf16")}
    if d // 2 > 1:
        n_exp = padded_bucket(params_backprop(inv, "expert_dp"), d // 2)
        assert moved_per_gpu(calls, "expert_dp") == pytest.approx((d // 2 - 1) / (d // 2) * n_exp * (bg + 2))
    # Adam on the shard: every parameter element is stepped exactly once per dp group
    dense_total = sum(r.owned_numel * r.multiplicity for r in plan.stages[0].ranks)
    assert dense_total == sum(params_backprop(inv, "dp")) + 2 * sum(params_backprop(inv, "expert_dp"))  # ep = 2 copies


def test_element_wise_buckets_split_at_bucket_size_and_single_bucket_rules() -> None:
    inv = tiny(moe=False, pp=2, vpp=1)
    spec = OptimizerSpec(kind="adamw", bucket_size_elements=20_000)
    plan = plan_from_inventory(inv, spec, Grid(dp=4, expert_dp=4))
    assert len(plan.stages[0].buckets) > 1  # pp rank 0 is bucketed ...
    assert len(plan.stages[1].buckets) == 1  # ... later stages get one bucket
    nolap = plan_from_inventory(inv, spec.model_copy(update={"overlap_grad_reduce": False}), Grid(dp=4, expert_dp=4))
    assert len(nolap.stages[0].buckets) == 1 and not nolap.hide_param_gather
    assert [b.order for b in plan.stages[0].buckets] == list(range(len(plan.stages[0].buckets)))


def test_legacy_all_reduce_and_variable_all_gather_bytes() -> None:
    inv = tiny(moe=False)
    spec = OptimizerSpec(kind="muon", layer_wise_layout="legacy")
    plan = plan_from_inventory(inv, spec, Grid(dp=4, expert_dp=4))
    n = sum(params_backprop(inv, "dp"))
    calls = plan.stages[0].gpu_collectives(0)
    assert [(c.op, c.dtype, c.bytes) for c in calls] == [("all_gather_v", "bf16", 2 * n), ("all_reduce", "fp32", 4 * n)]
    assert plan.load_balance == "ping_pong"
    # whole parameters, each owned by exactly one dp rank (Muon and AdamW alike)
    assert sum(r.owned_numel * r.multiplicity for r in plan.stages[0].ranks) == n


def test_current_layout_shard_aligned_buckets_and_adam_on_element_wise() -> None:
    inv = tiny(moe=False)
    d = 4
    plan = plan_from_inventory(inv, OptimizerSpec(kind="muon"), Grid(dp=d, expert_dp=d))
    st = plan.stages[0]
    lw = [b for b in st.buckets if b.kind == "layer_wise"]
    ew = [b for b in st.buckets if b.kind == "element_wise"]
    assert lw and ew
    assert sum(b.used_numel for b in lw) == sum(params_backprop(inv, "dp", "muon"))
    assert sum(b.used_numel for b in ew) == sum(params_backprop(inv, "dp", "adamw"))
    for b in lw:
        assert b.numel % math.lcm(d, 128) == 0 and b.reduce_op == "reduce_scatter" and b.gather_op == "all_gather"
    assert st.padding_overhead == pytest.approx(sum(b.numel for b in st.buckets) / sum(b.used_numel for b in st.buckets) - 1)
    # the Muon matrices are partitioned over the dp ranks
    owned = [name for g in range(d) for name in st.owned_tensors(g)]
    assert sorted(owned) == sorted(t.name for t in inv.tensors if t.optimizer == "muon")


def muon_components(inv, group: str) -> int:
    return sum(len(t.muon_components) * t.experts_per_rank for t in inv.tensors
               if t.optimizer == "muon" and t.dp_group == group and t.shard_dim is not None)


@pytest.mark.parametrize("layout", ["current", "legacy"])
def test_tp_mode_collectives_follow_ownership(layout: str) -> None:
    inv = tiny(moe=True, tp=2, ep=2, etp=2)
    grid = Grid(dp=4, expert_dp=2, tp=2, etp=2, ep=2)  # 8 GPUs per stage
    for mode in ("duplicated", "distributed", "blockwise"):
        spec = OptimizerSpec(kind="muon", tp_mode=mode, layer_wise_layout=layout)
        per_gpu = expected_rank_collectives(inv, spec, grid)
        assert len(per_gpu) == 8
        tp_calls = [[c for c in calls if c.group in ("tp", "etp")] for calls in per_gpu]
        if mode == "blockwise":
            assert all(not c for c in tp_calls)
            continue
        # GPUs of one tp group (g, g+1) own the same matrices and issue the same calls
        assert all(per_gpu[g] == per_gpu[g + 1] for g in range(0, 8, 2))
        # summed over the 4 dense dp ranks (every second GPU), every sharded dense matrix is handled once
        phase = "ns_gather" if mode == "duplicated" else "ns_norm"
        dense = sum(c.count for g in range(0, 8, 2) for c in tp_calls[g] if c.group == "tp" and c.phase == phase)
        assert dense == muon_components(inv, "dp")
        # expert-dp index of GPU g is g // (etp·ep) = g // 4
        expert = sum(c.count for g in (0, 4) for c in tp_calls[g] if c.group == "etp" and c.phase == phase)
        assert expert == muon_components(inv, "expert_dp")
        if mode == "distributed":
            for calls in tp_calls:
                norms = sum(c.count for c in calls if c.phase == "ns_norm")
                assert sum(c.count for c in calls if c.phase == "ns_gram") == 5 * norms


def test_rank_classes_combine_dense_and_expert_roles() -> None:
    inv = tiny(moe=True, ep=2)
    plan = plan_from_inventory(inv, OptimizerSpec(kind="muon"), Grid(dp=4, expert_dp=2, ep=2))
    ranks = plan.stages[0].ranks
    assert [(r.rank, r.dense_rank, r.expert_rank, r.multiplicity) for r in ranks] == [
        (0, 0, 0, 1), (1, 1, 0, 1), (2, 2, 1, 1), (3, 3, 1, 1)]
    assert plan.stages[0].gpus == 4


def test_replicated_steps_everything_on_every_rank() -> None:
    inv = tiny(moe=False)
    plan = plan_from_inventory(inv, OptimizerSpec(kind="muon", distribution="replicated"), Grid(dp=4, expert_dp=4))
    st = plan.stages[0]
    assert all(r.owned_numel == sum(params_backprop(inv, "dp")) for r in st.ranks)
    assert {c.op for c in st.collectives} == {"all_reduce"}
    lw = plan_from_inventory(inv, OptimizerSpec(kind="muon"), Grid(dp=4, expert_dp=4))
    assert lw.stages[0].max_rank_s == st.max_rank_s == 0.0  # no system: times are zero, bytes exact
    assert sum(r.newton_schulz_flops for r in lw.stages[0].ranks) == pytest.approx(st.ranks[0].newton_schulz_flops)


def test_inconsistent_grid_is_rejected() -> None:
    with pytest.raises(ValueError):
        plan_from_inventory(tiny(moe=False), OptimizerSpec(kind="muon"), Grid(dp=4, expert_dp=3))
    with pytest.raises(ValueError):
        plan_from_inventory(tiny(moe=False), OptimizerSpec(kind="muon", distribution="element_wise"),
                            Grid(dp=4, expert_dp=4))


def test_rank_table_builds_rank_work_on_read():
    """A stage's ranks (a RankTable) hold one RankWork per (dense, expert) class of the 4 GPUs (dense
    index g, expert index g // ep: 4 classes, multiplicity 1), built when read: each equals its
    column values, the table equals the tuple of them and survives pickling."""
    import pickle

    from costmodel.optimizer.plan_types import RankTable, RankWork, rank_column

    inv = tiny(ep=2)
    stage = plan_from_inventory(inv, OptimizerSpec(kind="muon"), Grid(dp=4, expert_dp=2, ep=2)).stages[0]
    ranks = stage.ranks
    assert isinstance(ranks, RankTable) and len(ranks) == 4
    rows = tuple(ranks)
    assert all(isinstance(r, RankWork) for r in rows) and ranks == rows and rows == ranks
    assert [(r.rank, r.dense_rank, r.expert_rank, r.multiplicity) for r in rows] == [(g, g, g // 2, 1) for g in range(4)]
    assert rank_column(ranks, "owned_numel") == [r.owned_numel for r in rows]
    assert all(isinstance(n, int) for n in rank_column(ranks, "owned_numel"))
    assert sum(rank_column(ranks, "owned_numel")) > 0
    assert ranks[-1] is ranks[3] and ranks[1:3] == rows[1:3]
    assert pickle.loads(pickle.dumps(ranks)) == rows
    assert stage.gpus == 4
