"""The speed memos' keys leave out only what the memoised answer does not read.

- Bucket times (:func:`costmodel.stage_buckets._bucket_times`) are memoised on every
  :class:`~costmodel.optimizer.plan_types.Bucket` field but ``BUCKET_FIELDS_NOT_READ``: changing one
  of those must not change the times, and every other field is in the key.
- A layer's parts that read no expert layout field (:func:`workloads.layer_assembly._part_ops`: the
  attention block with the pre-MLP norm, the router, the shared experts with the residual add) are
  shared across expert layouts: the layer built at any ep / etp / dispatcher equals, operation by
  operation, the one built afresh at that very shape without the memo, its shared parts are the
  very objects of the layer built at ep = etp = 1, and the routed experts between them do change.
"""

from __future__ import annotations

import dataclasses

import pytest

from costmodel.optimizer.plan_types import Bucket
from costmodel.stage_buckets import BUCKET_FIELDS_NOT_READ, _bucket_cost_fields, _bucket_times
from topologies.groups import GroupShape
from topologies.hardware import load_system
from workloads import layer_assembly as la
from workloads.layer_assembly import layer_operations
from workloads.models import ModelSpec, load_model
from workloads.operations import LayerOps, RankShape, _attention_block, _builder

NOT_READ_VALUES = {"stage": 7, "used_numel": 3, "kind": "layer_wise", "param_dtype": "fp8"}


def _bucket(**fields: object) -> Bucket:
    base = dict(stage=0, chunk=0, dp_group="dp", group_size=64, numel=1 << 24, grad_bytes=4 << 24,
                param_bytes=2 << 24, reduce_op="reduce_scatter", gather_op="all_gather", instances=2)
    return Bucket(**(base | fields))  # type: ignore[arg-type]


def test_bucket_key_covers_every_field_the_times_read() -> None:
    names = {f.name for f in dataclasses.fields(Bucket)}
    assert set(BUCKET_FIELDS_NOT_READ) == set(NOT_READ_VALUES) <= names
    system = load_system("gb300-nvl72")
    shapes = {"dp_instance": GroupShape(64, 8, 8), "dp_across": GroupShape(2, 1, 2)}
    b = _bucket()
    key = _bucket_cost_fields(b)
    for name, value in NOT_READ_VALUES.items():  # a field left out of the key: the times do not move
        other = dataclasses.replace(b, **{name: value})
        assert _bucket_cost_fields(other) == key
        assert _bucket_times(other, shapes, system) == _bucket_times(b, shapes, system)
    for name in names - set(NOT_READ_VALUES) - {"chunk", "order"}:  # any other field changes the key
        value = getattr(b, name)
        changed = not value if isinstance(value, bool) else (value * 2 if isinstance(value, int) else None)
        if changed is None:
            changed = {"dp_group": "expert_dp", "reduce_op": "all_reduce", "gather_op": "all_gather_v"}[name]
        assert _bucket_cost_fields(dataclasses.replace(b, **{name: changed})) != key, name


def _fresh_moe_layer(model: ModelSpec, shape: RankShape, recompute: str) -> tuple[LayerOps, tuple[int, ...]]:
    """The MoE layer built at ``shape`` part by part without the memo, and where each part ends in
    the forward pass (attention, router, routed experts, shared experts)."""
    b = _builder(model, shape)
    ends = []
    for part in (la._attention, la._router, la._routed_experts, la._moe_tail):
        part(b, model)
        ends.append(len(b.fwd))
    return b.build(recompute, ("core_attn", "moe_act")), tuple(ends)


@pytest.mark.parametrize("model_name", ["kimi-k2", "deepseek-v3", "qwen3-30b-a3b"])
def test_expert_free_parts_are_shared_across_expert_layouts(model_name: str) -> None:
    model = load_model(model_name)
    base = RankShape(micro_batch_size=1, seq_length=4096, tp=2, sequence_parallel=True, precision="mxfp8")
    for recompute in ("none", "selective", "full"):
        ref = layer_operations(model, base, moe=True, recompute=recompute, recompute_modules=("core_attn", "moe_act"))
        for ep, etp, dispatcher in ((8, 1, "flex"), (32, 2, "alltoall"), (4, 1, "allgather")):
            shape = dataclasses.replace(base, ep=ep, etp=etp, moe_dispatcher=dispatcher)
            fresh, (attn, router, routed, _) = _fresh_moe_layer(model, shape, recompute)
            ops = layer_operations(model, shape, moe=True, recompute=recompute,
                                   recompute_modules=("core_attn", "moe_act"))
            assert ops == fresh  # every operation equal, in the same order (forward, backward)
            assert [dataclasses.astuple(o) for o in ops.forward] == [dataclasses.astuple(o) for o in fresh.forward]
            shared = [*range(router), *range(routed, len(ops.forward))]  # attention, router, shared experts
            assert all(ops.forward[i] is ref.forward[i] for i in shared)
            assert ops.forward[router:routed] != ref.forward[router:routed]  # experts per rank change


@pytest.mark.parametrize("model_name", ["kimi-k2", "deepseek-v3", "qwen3-30b-a3b"])
def test_attention_block_is_shared_across_expert_layouts(model_name: str) -> None:
    model = load_model(model_name)
    base = RankShape(micro_batch_size=1, seq_length=4096, tp=2, sequence_parallel=True, precision="mxfp8")
    ref = layer_operations(model, base, moe=True)
    for ep, etp, dispatcher in ((8, 1, "flex"), (32, 2, "alltoall"), (4, 1, "allgather")):
        shape = dataclasses.replace(base, ep=ep, etp=etp, moe_dispatcher=dispatcher)
        fresh = _builder(model, shape)  # built at this very shape, without the memo
        _attention_block(fresh, model)
        fresh.norm("pre_mlp_layernorm", shape.sp_tokens, model.hidden_size)
        n_fwd, n_bwd = len(fresh.fwd), len(fresh.bwd)
        ops = layer_operations(model, shape, moe=True)
        assert ops.forward[:n_fwd] == tuple(fresh.fwd) and ops.backward[:n_bwd] == tuple(fresh.bwd)
        assert all(a is b for a, b in zip(ops.forward[:n_fwd], ref.forward[:n_fwd], strict=True))  # shared
        assert ops.forward[n_fwd:] != ref.forward[n_fwd:]  # the MoE block does change (experts per rank)
