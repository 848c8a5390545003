"""The speed memos' keys leave out only what the memoised answer does not read.

- Bucket times (:func:`costmodel.step_structure._bucket_times`) are memoised on every
  :class:`~costmodel.optimizer.plan_types.Bucket` field but ``BUCKET_FIELDS_NOT_READ``: changing one
  of those must not change the times, and every other field is in the key.
- A layer's attention block (:func:`workloads.operations._attention_ops`) is shared across expert
  layouts: the attention and pre-MLP operations of a layer built at any ep / etp / dispatcher are
  those of the layer built at ep = etp = 1, and the MoE block after them does change.
"""

from __future__ import annotations

import dataclasses

import pytest

from costmodel.optimizer.plan_types import Bucket
from costmodel.step_structure import BUCKET_FIELDS_NOT_READ, _bucket_cost_fields, _bucket_times
from topologies.groups import GroupShape
from topologies.hardware import load_system
from workloads.models import load_model
from workloads.operations import RankShape, _attention_block, _builder, layer_operations

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
