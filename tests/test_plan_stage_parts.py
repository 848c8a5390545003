"""A plan's stage parts (costmodel.stage_buckets.plan_stage_parts) memoised per plan: every input of
the memo key changes the answer when it matters, and a memoised answer is the one computed afresh.

The key: the plan and the system (by identity), pp, the dp groups' placement shapes, the ``embd``
shape and overlap. Each is perturbed on its own; the memoised answer must equal a fresh computation
(every memo emptied) at the perturbed inputs. A stage's bucket costs, priced per run of alike
buckets, equal the bucket-by-bucket definition.
"""

from __future__ import annotations

import copy
from itertools import pairwise
from typing import Any

import pytest

from costmodel import stage_buckets as sb
from costmodel.optimizer import plan as plan_module
from costmodel.optimizer.plan import build_optimizer_plan
from costmodel.step_structure import build_step_structure
from topologies.groups import GroupShape
from topologies.placement import JobPlacement, placement_for
from workloads.scenario import DEFAULT_SCENARIO, Scenario


def _scenario() -> Scenario:  # Kimi K2 with one MTP layer: the first and last stage all-reduce the embedding grads
    return DEFAULT_SCENARIO.resolve().with_updates(mtp_layers=1)


def _fresh(plan: Any, pp: int, system: Any, placement: JobPlacement, overlap: bool) -> tuple[sb.StageParts, ...]:
    sb._PLAN_STAGES.clear()
    sb._BUCKET_COSTS.clear()
    return sb.plan_stage_parts(plan, pp, system, placement, overlap)


def _with_shape(placement: JobPlacement, group: str, shape: GroupShape) -> JobPlacement:
    """The real placement with one group's shape replaced (what plan_stage_parts reads of it)."""
    out = copy.copy(placement)
    out.__dict__["shapes"] = {**placement.shapes, group: shape}
    return out


LLAMA_PP16 = {"model": "llama3.1-405b", "gpus": 1024, "global_batch_size": 1024, "seq_length": 8192, "tp": 8,
              "pp": 16, "vpp": 1, "ep": 1, "etp": 1}


@pytest.mark.parametrize("llama", [False, True])
def test_stage_parts_are_the_step_structure_stages(llama: bool) -> None:
    sc = DEFAULT_SCENARIO.resolve().with_updates(**LLAMA_PP16) if llama else _scenario()
    st = build_step_structure(sc)
    parts = sb.plan_stage_parts(st.plan, sc.par.pp, sc.system, placement_for(sc), True)
    assert len(parts) == sc.par.pp
    for stage, p in zip(st.stages, parts, strict=True):
        assert stage.buckets is p.buckets
        assert (stage.optimizer_compute_s, stage.optimizer_tp_s, stage.grad_prescale_s) == (
            p.optimizer_compute_s, p.optimizer_tp_s, p.grad_prescale_s)
        assert (stage.embedding_grad_s, stage.embedding_grad_latency_s, stage.embedding_grad_link) == p.embedding_grad
    if not llama:
        assert parts[0].embedding_grad[0] > 0 and parts[-1].embedding_grad[0] > 0 and parts[1].embedding_grad[0] == 0
    # stages with equal buckets (their content, not their stage): priced once, one tuple
    content = [tuple(map(sb._bucket_content, sp.buckets)) for sp in st.plan.stages]
    pairs = [(a, b) for a in range(len(parts)) for b in range(a) if content[a] == content[b]]
    assert all(parts[a].buckets is parts[b].buckets for a, b in pairs)
    assert len(pairs) >= (91 if llama else 0)  # Llama pp16: the 14 middle stages alike


def test_every_key_input_is_read_and_a_memoised_answer_is_a_fresh_one() -> None:
    sc = _scenario()
    plan, pp, system, placement = build_optimizer_plan(sc), sc.par.pp, sc.system, placement_for(sc)
    base = _fresh(plan, pp, system, placement, True)
    dp, embd = placement.shapes["dp"], placement.shape("embd")
    assert dp.size > 1 and embd.size == 2
    perturbed = {
        "overlap": (plan, pp, system, placement, False),
        "pp": (plan, pp - 1, system, placement, True),
        "dp shape": (plan, pp, system, _with_shape(placement, "dp", GroupShape(dp.size, 1, dp.size)), True),
        "embd shape": (plan, pp, system, _with_shape(placement, "embd", GroupShape(2, 2, 1) if embd.domains > 1
                                                     else GroupShape(2, 1, 2)), True),
    }
    for name, args in perturbed.items():
        sb.plan_stage_parts(plan, pp, system, placement, True)  # the base answer memoised
        memoised = sb.plan_stage_parts(*args)
        assert memoised != base, name  # the input matters here
        assert memoised == _fresh(*args), name
    # the same content under another identity: a miss, computed again, equal
    sb.plan_stage_parts(plan, pp, system, placement, True)
    plan_module._CACHE.clear()
    other_plan = build_optimizer_plan(sc)
    assert other_plan is not plan
    assert sb.plan_stage_parts(other_plan, pp, system, placement, True) == base
    other_system = system.model_copy()
    assert other_system is not system
    again = sb.plan_stage_parts(plan, pp, other_system, placement, True)
    assert again == base and again is not sb.plan_stage_parts(plan, pp, system, placement, True)


@pytest.mark.parametrize("overlap", [True, False])
def test_a_plan_without_a_stage_gives_it_no_parts(overlap: bool) -> None:
    sc = _scenario()
    plan = build_optimizer_plan(sc)
    parts = _fresh(plan, sc.par.pp + 1, sc.system, placement_for(sc), overlap)
    assert parts[-1] == sb.StageParts((), 0.0, 0.0, (0.0, 0.0, "nvlink"), 0.0)


def _plain_stage_buckets(sp: Any, system: Any, placement: JobPlacement, overlap: bool) -> tuple[sb.BucketCost, ...]:
    """The definition, bucket by bucket: in order, each bucket's own times and the share of its
    chunk's (dp group's) elements complete once it is (1 without overlap)."""
    ordered = sorted(sp.buckets, key=lambda b: b.order)
    total: dict[tuple[int, str], int] = {}
    for b in ordered:
        total[(b.chunk, b.dp_group)] = total.get((b.chunk, b.dp_group), 0) + b.numel
    shapes = {g: placement.shape(g) for g in {b.reduce_group for b in ordered} | {b.across_group for b in ordered}}
    done: dict[tuple[int, str], int] = {}
    out = []
    for b in ordered:
        red, gat, prescale_s = sb._bucket_times(b, shapes, system)
        at = (b.chunk, b.dp_group)
        done[at] = done.get(at, 0) + b.numel
        fraction = (done[at] / total[at] if total[at] else 1.0) if overlap else 1.0
        out.append(sb.BucketCost(b.chunk, b.dp_group, red[0], gat[0], red[2], fraction, red[1], gat[1],
                                 float(b.grad_bytes), float(b.param_bytes * b.param_gathers) if b.gather_op else 0.0,
                                 prescale_s))
    return tuple(out)


@pytest.mark.parametrize("updates", [{"tp": 2, "pp": 8, "vpp": 1, "ep": 16}, {"pp": 4, "vpp": 2, "ep": 32, "etp": 1},
                                     {"pp": 4, "optimizer": {"kind": "adamw"}}])
def test_stage_buckets_are_the_bucket_by_bucket_definition(updates: dict) -> None:
    sc = DEFAULT_SCENARIO.resolve().with_updates(**updates)
    plan, placement = build_optimizer_plan(sc), placement_for(sc)
    runs = 0
    for sp in plan.stages:
        for overlap in (True, False):
            got = sb._stage_buckets(sp, sc.system, placement, overlap)
            assert got == _plain_stage_buckets(sp, sc.system, placement, overlap)
            assert all(type(b) is sb.BucketCost for b in got)
        runs += sum(1 for a, b in pairwise(sp.buckets) if sb._bucket_cost_fields(a) == sb._bucket_cost_fields(b))
    assert runs > 0  # alike buckets in a row (a layer-wise buffer of identical matrices)
