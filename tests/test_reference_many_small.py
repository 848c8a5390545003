"""The ``many-small`` shape preset (hundreds of small matrices) runs in every reference mode.

One step per mode (cheap): tp 1 layer-wise current and legacy, AdamW element-wise, and tp 2 with the
three Newton–Schulz modes. Each run updates every parameter, issues exactly the collectives the cost
model's optimizer plan lists for it (byte for byte), and the current layout's run is bitwise equal to
the single-process reference.
"""

from __future__ import annotations

import pytest

from costmodel.optimizer import Grid, expected_rank_collectives
from reference.api import run_reference
from reference.config import make_config
from reference.runner import run_specs
from reference.serial import initial_params
from reference.workload import load_shapes
from workloads.inventory import build_inventory
from workloads.scenario import OptimizerSpec

MODES = {
    "layer_wise-current": dict(world_size=2, optimizer="muon", layout="current", check=True),
    "layer_wise-legacy": dict(world_size=2, optimizer="muon", layout="legacy"),
    "element_wise-adamw": dict(world_size=2, optimizer="adamw"),
    "tp2-duplicated": dict(world_size=2, tp=2, tp_mode="duplicated"),
    "tp2-distributed": dict(world_size=2, tp=2, tp_mode="distributed"),
    "tp2-blockwise": dict(world_size=2, tp=2, tp_mode="blockwise"),
}


def test_many_small_is_hundreds_of_small_matrices():
    specs = run_specs(make_config(shapes="many-small"))
    matrices = [s for s in specs if s.optimizer == "muon"]
    assert len(matrices) >= 400
    assert sum(s.local_numel <= 128 * 128 for s in matrices) >= 400  # small: launch-bound, not FLOP-bound


@pytest.mark.parametrize("mode", list(MODES))
def test_many_small_runs_in_every_mode(mode):
    case = {"check": False, **MODES[mode]}
    r = run_reference(dict(shapes="many-small", steps=1, **case))
    cfg = r.config
    initial = initial_params(cfg)
    assert all(not r.params[n].equal(p) for n, p in initial.items())  # every parameter was updated
    assert r.checks["replicas_max_abs_diff"] == 0.0
    if cfg.check:
        assert r.checks["bitwise_equal_serial"], r.checks
    if cfg.optimizer == "muon" and cfg.tp == 1:  # whole matrices, each on exactly one rank
        owned = [set(v) for v in r.extra["owned_by_rank"].values()]
        assert not set.intersection(*owned)
        assert set.union(*owned) >= {s.name for s in run_specs(cfg) if s.optimizer == "muon"}
    inv = build_inventory(load_shapes("many-small"), tp=cfg.tp, etp=cfg.etp, split_qkv=cfg.split_qkv)
    spec = OptimizerSpec(kind=cfg.optimizer, distribution=cfg.distribution, layer_wise_layout=cfg.layout,
                         tp_mode=cfg.tp_mode, load_balance=cfg.load_balance)
    expected = expected_rank_collectives(inv, spec, Grid(dp=cfg.dp, expert_dp=cfg.expert_dp, tp=cfg.tp, etp=cfg.etp))
    for rank in range(cfg.world_size):
        assert sorted(r.collectives_by_rank[rank]) == sorted(expected[rank]), f"rank {rank}"
