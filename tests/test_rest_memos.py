"""Memos of the per-scenario work outside the optimizer plan: their keys are what the answers read.

- The step structure's layer-kind costs (:data:`costmodel.step_structure._KIND_CACHE`) are held per
  layout key (:func:`costmodel.layer_costs.layer_cache_key` without the kind) and overlap, then per
  kind: every kind's costs equal :func:`costmodel.layer_comm.layer_kind_costs` computed afresh, the
  overlap and every layout setting of the key give entries of their own.
- The Newton-Schulz workspace of a stage (:func:`workloads.optimizer_memory.optimizer_workspace_bytes`)
  is memoised per tuple of tensors: it is the largest workspace of a Muon tensor among them (by
  hand: :func:`newton_schulz_workspace_bytes` of each), whatever the memo holds, and the TP mode
  and matmul precision are in the key.
- A rank shape's derived shapes (:attr:`RankShape.without_experts`, :attr:`RankShape.one_microbatch`)
  equal :func:`dataclasses.replace` of the shape, are made once per shape object and leave its
  equality and hash alone.
- A chunk's collective blocks merged per kind (:func:`costmodel.step_structure._merge`, one pass)
  are the per-kind sums by hand, in order of first appearance, with the first block's link.
"""

from __future__ import annotations

import dataclasses

from costmodel import layer_comm, step_structure
from costmodel.layer_costs import LAYER_GROUP_KINDS, CommBlock, rank_shape
from costmodel.step_structure import build_step_structure
from topologies.placement import placement_for
from workloads import optimizer_memory as om
from workloads.inventory import inventory_for
from workloads.operations import RankShape
from workloads.scenario import DEFAULT_SCENARIO, Scenario


def _kimi(**updates: object) -> Scenario:
    return DEFAULT_SCENARIO.resolve().with_updates(tp=2, pp=4, vpp=2, ep=32, **updates)


def _fresh_kind_costs(scenario: Scenario, overlap: bool) -> dict[str, tuple]:
    """Every layer kind's costs of ``scenario`` computed with every layer memo emptied."""
    layer_comm._COMPUTE.clear()
    layer_comm._COLLECTIVES.clear()
    shape = rank_shape(scenario)
    placement = placement_for(scenario)
    shapes = {k: placement.shape(k) for k in LAYER_GROUP_KINDS}
    kinds = {k for chunk in step_structure._chunk_items(scenario) for k in chunk}
    return {k: layer_comm.layer_kind_costs(scenario, shape, k, shapes, overlap) for k in kinds}


def _entries() -> dict[tuple, dict[str, tuple]]:
    return {key: value for key, (_, value) in step_structure._KIND_CACHE._entries.items()}


def test_kind_costs_are_held_per_layout_key_and_overlap() -> None:
    step_structure._KIND_CACHE.clear()
    base = _kimi(ep_comm_overlap=True)  # the EP all-to-alls hide under the paired micro-batch with overlap
    for overlap in (True, False):
        build_step_structure(base, overlap=overlap)
    entries = _entries()
    assert len(entries) == 2  # one per overlap, each holding every kind of the layout
    fresh = {overlap: _fresh_kind_costs(base, overlap) for overlap in (True, False)}
    assert fresh[True] != fresh[False]
    by_overlap = {key[0][1]: value for key, value in entries.items()}
    assert by_overlap == fresh
    # a setting of the layout key (the recompute mode, the TP overlap) gets an entry of its own
    for other in (_kimi(ep_comm_overlap=True, recompute="full"), _kimi(ep_comm_overlap=True, tp_comm_overlap=True)):
        build_step_structure(other)
        assert len(_entries()) == len(entries) + 1
        entries = _entries()
        new = [value for key, value in entries.items() if key[0][1] and value is not by_overlap[True]]
        assert _fresh_kind_costs(other, True) in new


def test_workspace_is_the_largest_muon_tensor_of_the_groups() -> None:
    scenario = _kimi()
    inv = inventory_for(scenario)
    groups = [r.templates for s in range(scenario.par.pp) for r in inv.stage_runs(s)]
    opt = scenario.optimizer
    matmul_bytes = 2 if opt.matmul_precision == "bf16" else om.FP32_BYTES
    by_hand = max(om.newton_schulz_workspace_bytes(t, opt.tp_mode, matmul_bytes)
                  for g in groups for t in g if t.optimizer == "muon")
    om._WORKSPACE.clear()
    assert om.optimizer_workspace_bytes(scenario, groups) == by_hand
    assert om.optimizer_workspace_bytes(scenario, groups) == by_hand  # from the memo
    assert om.optimizer_workspace_bytes(scenario, reversed(groups)) == by_hand
    assert om.optimizer_workspace_bytes(scenario, [()]) == 0.0
    # the TP mode is in the key: a sharded Muon tensor's workspace depends on it
    other = _kimi(tp_mode="duplicated")  # the default is blockwise
    by_hand_dup = max(om.newton_schulz_workspace_bytes(t, "duplicated", matmul_bytes)
                      for g in groups for t in g if t.optimizer == "muon")
    assert by_hand_dup != by_hand
    assert om.optimizer_workspace_bytes(other, groups) == by_hand_dup
    # AdamW: no Newton-Schulz workspace
    assert om.optimizer_workspace_bytes(_kimi(optimizer="adamw"), groups) == 0.0


def test_rank_shape_derived_shapes() -> None:
    shape = RankShape(micro_batch_size=2, seq_length=4096, tp=2, cp=1, ep=8, etp=2, sequence_parallel=True,
                      precision="mxfp8", microbatches=16, moe_dispatcher="alltoall")
    twin = dataclasses.replace(shape)
    assert shape.without_experts == dataclasses.replace(shape, ep=1, etp=1, moe_dispatcher="flex")
    assert shape.one_microbatch == dataclasses.replace(shape, microbatches=1)
    assert shape.without_experts is shape.without_experts  # made once per shape object
    assert shape.one_microbatch is shape.one_microbatch
    assert shape == twin and hash(shape) == hash(twin)  # the cached shapes are not fields
    assert shape.without_experts.one_microbatch == dataclasses.replace(shape, ep=1, etp=1, moe_dispatcher="flex",
                                                                       microbatches=1)


def test_merge_sums_each_kind_in_order() -> None:
    blocks = [CommBlock("tp", 3.0, 0.5, "nvlink", 0.5, 100.0), CommBlock("ep", 2.0, 0.25, "network", 1.0, 40.0),
              CommBlock("tp", 1.0, 0.125, "network", 0.25, 60.0), CommBlock("cp", 0.0, 0.0, "nvlink", 1.0, 0.0)]
    tp, ep, cp = step_structure._merge(blocks)
    assert tp == CommBlock("tp", 4.0, 0.625, "nvlink", (1.5 + 0.25) / 4.0, 160.0)
    assert ep == blocks[1]
    assert cp == CommBlock("cp", 0.0, 0.0, "nvlink", 1.0, 0.0)  # no time: exposed fraction 1
    assert step_structure._merge([]) == ()
