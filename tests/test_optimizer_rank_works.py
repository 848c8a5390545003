"""rank_works: the GPU classes' work of several stages at once equals each stage's alone, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel.optimizer import Grid
from costmodel.optimizer.newton_schulz import NsSettings
from costmodel.optimizer.plan import _stage, _stage_buffers
from costmodel.optimizer.plan_types import KERNEL_PARTS
from costmodel.optimizer.rank_work import rank_work, rank_works
from costmodel.optimizer.timer import Timer
from topologies.hardware import load_system
from workloads.inventory import build_inventory
from workloads.models import ModelSpec
from workloads.scenario import OptimizerSpec

TINY = dict(
    name="tiny", num_layers=4, hidden_size=64, ffn_hidden_size=128, vocab_size=256,
    attention=dict(kind="gqa", num_heads=8, num_kv_heads=4, head_dim=8),
    moe=dict(num_experts=4, topk=2, expert_ffn_hidden_size=32, first_dense_layers=1),
)


def _builders(spec: OptimizerSpec, grid: Grid, critical_only: bool = False) -> list:
    """A StageBuilder per stage of the tiny MoE model on two stages (stage 0: the embedding and
    the dense layer; stage 1: MoE layers and the output layer: different work)."""
    inv = build_inventory(ModelSpec.model_validate(TINY), pp=2, ep=grid.ep)
    timer = Timer(load_system("gb300-nvl72"), spec.matmul_precision, None)
    st = NsSettings.from_spec(spec)
    return [_stage(inv, s, _stage_buffers(inv, s, spec.kind, None, None), spec, grid, timer, st,
                   critical_only=critical_only) for s in range(inv.pp)]


def _arrays(table) -> tuple:  # noqa: ANN001 - a RankTable
    return table._ints, table._floats, table._parts


CASES = [
    (OptimizerSpec(kind="muon"), Grid(dp=4, expert_dp=2, ep=2)),
    (OptimizerSpec(kind="muon", layer_wise_layout="legacy"), Grid(dp=4, expert_dp=2, ep=2)),  # gather copies
    (OptimizerSpec(kind="adamw"), Grid(dp=4, expert_dp=4)),
    (OptimizerSpec(kind="adamw", optimizer_cpu_offload=True), Grid(dp=4, expert_dp=4)),
]


@pytest.mark.parametrize("critical_only", [False, True])
@pytest.mark.parametrize(("spec", "grid"), CASES)
def test_stages_at_once_equal_each_stage_alone(spec: OptimizerSpec, grid: Grid, critical_only: bool) -> None:
    builders = _builders(spec, grid, critical_only)
    together = rank_works(builders)
    assert len(together) == 2
    for b, table in zip(builders, together, strict=True):
        alone = rank_work(b)
        assert table == alone and len(table) == (1 if critical_only else grid.dp)
        for x, y in zip(_arrays(table), _arrays(alone), strict=True):
            assert x.dtype == y.dtype and np.array_equal(x, y)  # bit for bit (no NaN here)
    a, b = together
    assert a.column("owned_numel") != b.column("owned_numel")  # two different stages, not one repeated
    if critical_only:  # the slowest class of each stage (the first of equals), as in the full tables
        for table, full in zip(together, rank_works(_builders(spec, grid)), strict=True):
            slowest = full.column("total_s")
            assert table[0] == full[slowest.index(max(slowest))]


def test_legacy_gather_copies_per_stage() -> None:
    """Legacy layout: every rank copies back the parameters it does not own, per stage: a stage's
    gather-copy launches are its own (whole items gathered, minus those owned, plus one flatten)."""
    spec, grid = CASES[1]
    builders = _builders(spec, grid)
    for b, table in zip(builders, rank_works(builders), strict=True):
        dense, expert = b.roles["dp"], b.roles["expert_dp"]
        items = dense.acc[-1], expert.acc[-1]  # COLUMNS ends with "items": whole items owned per rank
        for r in table:
            want = 0
            for role, idx, held in ((dense, r.dense_rank, items[0]), (expert, r.expert_rank, items[1])):
                if role.gather_items:
                    want += role.gather_items - held[idx] + 1
            assert r.kernel_parts[KERNEL_PARTS.index("gather_copy")] == want
    assert builders[0].roles["dp"].gather_numel != builders[1].roles["dp"].gather_numel  # stages differ
