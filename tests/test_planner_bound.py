"""The planner's fast pipeline bound (:mod:`costmodel.planner.bound`): its memos against fresh
computations and the engine, with every input they depend on perturbed."""

from __future__ import annotations

import dataclasses

import pytest

from costmodel.planner import bound
from costmodel.planner.bound import ChunkLayout, fast_pipeline_bound_s
from costmodel.planner.fast_analytic import FastAnalytic
from costmodel.planner.space import Candidate, build_scenario
from topologies.placement import placement_for
from workloads.scenario import Scenario


def test_chunk_layout_by_hand() -> None:
    """Four virtual stages on two pipeline stages (v on v mod 2), chunks A B A B: two distinct chunks,
    stage 0 holds (A, A), stage 1 (B, B); with pp = 1 the one stage holds A B A B; with pp = 4 the
    stages hold A, B, A, B (two distinct sequences)."""
    a, b = (("dense", 1), ("moe", 2)), (("moe", 3),)
    items = (a, b, a, b)
    assert bound._chunk_layout(items, 2) == ChunkLayout(frozenset({"dense", "moe"}), (a, b), ((0, 0), (1, 1)), (0, 1))
    assert bound._chunk_layout(items, 1) == ChunkLayout(frozenset({"dense", "moe"}), (a, b), ((0, 1, 0, 1),), (0,))
    assert bound._chunk_layout(items, 4) == ChunkLayout(frozenset({"dense", "moe"}), (a, b), ((0,), (1,)), (0, 1, 0, 1))
    assert bound._chunk_layout((b, b), 2) == ChunkLayout(frozenset({"moe"}), (b,), ((0,),), (0, 0))


def test_chunk_layout_memo_follows_its_inputs() -> None:
    """The memo is keyed by pp and the identity of the items: a changed pp or other items (equal or
    not) give what a fresh computation gives, never another entry's value."""
    a, b, c = (("dense", 1),), (("moe", 2),), (("moe", 1), ("output", 1))
    bound._LAYOUTS.clear()
    first = (a, b, c, a, b, c)
    cases = [(first, 3), (first, 2), (first, 6), (first, 1), ((a, b, c, a, b, a), 3), (tuple(first), 3),
             ((a, b, c, a, b, c)[:], 3), ((c, b, a, c, b, a), 3)]
    fresh = []
    for items, pp in cases:
        bound._LAYOUTS.clear()
        fresh.append(bound._chunk_layout(items, pp))
    bound._LAYOUTS.clear()
    for (items, pp), expected in zip(cases, fresh, strict=True):  # one memo across all of them
        assert bound._chunk_layout(items, pp) == expected
        assert bound._chunk_layout(items, pp) is bound._chunk_layout(items, pp)


def _variants(base: Scenario) -> list[tuple[str, Scenario]]:
    """The default scenario's layout with each input of the send/receive time changed: the rank
    shape's tokens (micro-batch size, sequence length), the model's hidden size, the pp group's
    placement (across domains or within one) and the system's link rates."""
    cand = Candidate(1, 4, 2, 1, 64, 1, 1, "none", "muon", "layer_wise", "current", None, "lpt", True)
    sc = build_scenario(base, cand)
    out = [("base", sc), ("mbs", build_scenario(base, dataclasses.replace(cand, mbs=2)))]
    out.append(("seq", build_scenario(base.with_updates(seq_length=base.par.seq_length // 2), cand)))
    model = base.model.model_copy(update={"hidden_size": base.model.hidden_size + 1024})
    out.append(("hidden", build_scenario(Scenario(config=base.config, system=base.system, model=model), cand)))
    within = base.with_updates(gpus=64, ep=16)  # one NVLink domain holds the job: pp groups inside it
    out.append(("within", build_scenario(within, dataclasses.replace(cand, ep=16))))
    assert not placement_for(sc).shape("pp").intra_domain and placement_for(out[-1][1]).shape("pp").intra_domain
    nvl = within.system.nvlink.model_copy(update={"link_bandwidth_Bps": within.system.nvlink.link_bandwidth_Bps / 3})
    slower = within.system.model_copy(update={"nvlink": nvl})
    out.append(("nvlink", build_scenario(Scenario(config=within.config, system=slower, model=within.model),
                                         dataclasses.replace(cand, ep=16))))
    return out


def test_send_receive_memo_follows_every_input(default_scenario) -> None:
    """The send/receive seconds memoised with the layer kinds' times equal a fresh computation for
    every input changed, and each layout's bound is the engine's, in one process (shared memos)."""
    engine = FastAnalytic()
    variants = _variants(default_scenario)
    seen = set()
    for name, sc in variants:
        shape, shapes = bound._rank_shape(sc), bound._layer_shapes(placement_for(sc))
        layout = bound._chunk_layout(bound._chunk_kinds(sc), sc.par.pp)
        _, p2p = bound._kind_times(sc, shape, shapes, layout.kinds)
        assert p2p == bound._p2p_s(sc, shape, shapes) > 0, name
        seen.add(p2p)
        assert fast_pipeline_bound_s(sc) == pytest.approx(engine.engine_pipeline_bound_s(sc), rel=1e-12), name
    assert len(seen) == len(variants)  # every input changes it


def test_fast_plans_are_shared_across_cp_only_where_the_buckets_are_equal() -> None:
    """cp enters the optimizer plan only through Megatron's default DDP bucket size, max(40e6, 1e6·dp)
    with dp **without** cp: Kimi K2 on 256 GPUs (pp 4) at cp 1 / dp 64 and cp 2 / dp 32 has equal
    dp·cp = 64 but buckets of 64e6 and 40e6 elements, so the plans differ; at 128 GPUs (ep 32), cp 1 / dp 32
    and cp 2 / dp 16 both have 40e6-element buckets, so the planner builds one plan for both, and it equals
    the plan built for each on its own."""
    from costmodel.optimizer.plan import build_optimizer_plan
    from costmodel.planner.fast_analytic import FastAnalytic
    from workloads.scenario import DEFAULT_SCENARIO

    base = DEFAULT_SCENARIO.resolve()
    fast = FastAnalytic()
    big1, big2 = base.with_updates(cp=1), base.with_updates(cp=2)
    assert (big1.dp, big2.dp) == (64, 32)
    assert fast.plan_key(big1) != fast.plan_key(big2)
    small1, small2 = base.with_updates(gpus=128, ep=32, cp=1), base.with_updates(gpus=128, ep=32, cp=2)
    assert (small1.dp, small2.dp) == (32, 16)
    assert fast.plan_key(small1) == fast.plan_key(small2)
    shared = fast.plan(small1)
    assert fast.plan(small2) is shared
    own = build_optimizer_plan(small2, critical_only=True)
    assert [(b.numel, b.used_numel, b.reduce_op, b.gather_op) for s in own.stages for b in s.buckets] == \
        [(b.numel, b.used_numel, b.reduce_op, b.gather_op) for s in shared.stages for b in s.buckets]
    assert [max(r.total_s for r in s.ranks) for s in own.stages] == [max(r.total_s for r in s.ranks) for s in shared.stages]
