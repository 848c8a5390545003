"""The optimizer plan's key memo and the report's Newton-Schulz figures per distinct stage.

- :func:`costmodel.optimizer.plan.plan_key`, the model's and system's JSON memoised per object,
  equals the key built afresh from the scenario's JSON parts: a scenario built again with the same
  settings gets an equal key, one differing in a setting the plan reads another.
- :func:`costmodel.optimizer.summary.newton_schulz_figures` made once per distinct rank table equals
  the walk over every stage by hand (GPUs, FLOPs total from 0 in stage and class order, largest
  FLOPs), for stages that share tables and stages that do not.
"""

from __future__ import annotations

from costmodel.optimizer import plan as plan_mod
from costmodel.optimizer.plan import build_optimizer_plan, plan_key
from costmodel.optimizer.plan_types import RankWork, StageOptimizerPlan
from costmodel.optimizer.summary import newton_schulz_figures
from workloads.scenario import DEFAULT_SCENARIO, Scenario


def _kimi(**updates: object) -> Scenario:
    return DEFAULT_SCENARIO.resolve().with_updates(**{"tp": 2, "pp": 4, "vpp": 2, "ep": 32, **updates})


def _fresh_key(sc: Scenario) -> tuple:
    c = sc.config
    return (sc.model.model_dump_json(), sc.system.model_dump_json(), c.gpus, c.precision,
            c.parallelism.model_dump_json(), c.optimizer.model_dump_json(), c.placement.model_dump_json(),
            sc.runtime.bf16_layers)


def test_plan_key_equals_the_fresh_key() -> None:
    sc = _kimi()
    first = plan_key(sc)
    assert first == _fresh_key(sc)
    again = _kimi()  # another object with the same settings: an equal key (the plan cache hits)
    assert again is not sc and plan_key(again) == first
    for other in (_kimi(ep=16), _kimi(pp=8), _kimi(optimizer="adamw"), _kimi(gpus=512)):
        assert plan_key(other) == _fresh_key(other) != first


def test_spec_json_memo_is_the_dump() -> None:
    sc = _kimi()
    plan_mod._SPEC_JSON.clear()
    assert plan_mod._spec_json(sc.model) == sc.model.model_dump_json()
    assert plan_mod._spec_json(sc.system) == sc.system.model_dump_json()
    assert plan_mod._spec_json(sc.model) is plan_mod._spec_json(sc.model)


def _stage(stage: int, ranks: tuple[RankWork, ...]) -> StageOptimizerPlan:
    return StageOptimizerPlan(stage=stage, buckets=(), ranks=ranks, collectives=())


def _rank(flops: float, multiplicity: int) -> RankWork:
    return RankWork(rank=0, owned_numel=0, newton_schulz_flops=flops, newton_schulz_s=0.0, elementwise_s=0.0,
                    tp_comm_s=0.0, multiplicity=multiplicity)


def test_newton_schulz_figures_by_hand() -> None:
    a = (_rank(0.1, 3), _rank(1e16 + 2.0, 1))  # a sum order that rounds differently if regrouped
    b = (_rank(0.7, 2),)
    stages = [_stage(0, a), _stage(1, b), _stage(2, a), _stage(3, ())]
    gpus, total, largest = newton_schulz_figures(stages)
    assert gpus == 4 + 2 + 4
    expected = 0
    for f, m in ((0.1, 3), (1e16 + 2.0, 1), (0.7, 2), (0.1, 3), (1e16 + 2.0, 1)):
        expected += f * m  # from 0, stage by stage, class by class
    assert total == expected
    assert largest == 1e16 + 2.0
    assert newton_schulz_figures([_stage(0, ())]) == (0, 0, 0.0)
    assert newton_schulz_figures([]) == (0, 0, 0.0)


def test_newton_schulz_figures_of_a_plan_with_repeated_stages() -> None:
    plan = build_optimizer_plan(_kimi(pp=8, vpp=1))
    stages = plan.stages
    assert len({id(s.ranks) for s in stages}) < len(stages)  # restaged stages share their twin's table
    walk_total = 0
    for s in stages:
        for r in s.ranks:
            walk_total += r.newton_schulz_flops * r.multiplicity
    walk_max = max((r.newton_schulz_flops for s in stages for r in s.ranks), default=0.0)
    assert newton_schulz_figures(stages) == (sum(r.multiplicity for s in stages for r in s.ranks), walk_total, walk_max)
