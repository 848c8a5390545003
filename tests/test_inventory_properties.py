"""Property test: for any valid parallel layout, the local shards give back the model exactly."""

from __future__ import annotations

import math
from functools import cache

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workloads.inventory import build_inventory
from workloads.models import GqaAttention, ModelSpec, load_model, model_names


def _divisors(n: int, limit: int = 64) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def _tp_choices(m: ModelSpec) -> list[int]:
    """tp values Megatron accepts: dividing heads, KV heads, every tp-sharded dim (incl. MTP eh_proj)."""
    att = m.attention
    dims = [att.num_heads, att.num_kv_heads, m.hidden_size]
    if m.num_dense_layers:
        dims.append(m.ffn_hidden_size)
    if m.moe and m.moe.shared_expert_ffn_hidden_size:
        dims.append(m.moe.shared_expert_ffn_hidden_size)
    return _divisors(math.gcd(*dims))


def _vpp_choices(layers: int, pp: int) -> list[int]:
    """vpp values the pipeline layout accepts for ``pp`` (divisors of layers/pp when pp divides)."""
    if layers % pp == 0:
        return [v for v in _divisors(layers // pp) if pp * v <= layers and (v == 1 or pp > 1)]
    return [v for v in range(1, 9) if pp * v <= layers and (v == 1 or pp > 1)]


@cache
def _base_params(name: str) -> int:
    return build_inventory(load_model(name)).params_total


@st.composite
def layouts(draw: st.DrawFn) -> tuple[str, dict[str, int]]:
    name = draw(st.sampled_from(model_names()))
    m = load_model(name)
    tp = draw(st.sampled_from(_tp_choices(m)))
    pp = draw(st.sampled_from([p for p in (1, 2, 3, 4, 5, 8, 16) if p <= m.num_layers]))
    vpp = draw(st.sampled_from(_vpp_choices(m.num_layers, pp)))
    ep = etp = 1
    if m.moe:
        ep = draw(st.sampled_from(_divisors(m.moe.num_experts)))
        etp = draw(st.sampled_from(_divisors(m.moe.expert_ffn_hidden_size, limit=8)))
    split = draw(st.booleans())
    return name, dict(tp=tp, pp=pp, vpp=vpp, ep=ep, etp=etp, split_qkv=split)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_shards_sum_back_to_the_model_exactly(layout: tuple[str, dict[str, int]]) -> None:
    name, kw = layout
    model = load_model(name)
    inv = build_inventory(model, **kw)
    tp, ep, etp, pp, vpp = kw["tp"], kw["ep"], kw["etp"], kw["pp"], kw["vpp"]
    # the model count with the tp-padded vocabulary (untied embedding and output layer)
    expected = _base_params(name) + 2 * model.hidden_size * (model.padded_vocab_size(tp) - model.padded_vocab_size(1))
    assert inv.params_total == expected
    total = 0
    stages_seen = set()
    for t in inv.tensors:
        assert 0 <= t.stage < pp and 0 <= t.chunk < vpp
        stages_seen.add(t.stage)
        if t.shard_dim is None:
            assert t.shards == 1 and t.local_shape == t.global_shape
        else:
            assert t.shards == (etp if t.shard_group == "etp" else tp)
            assert t.global_shape[t.shard_dim] % t.shards == 0, f"{t.name} {t.global_shape} / {t.shards}"
        local = math.prod(t.local_shape)
        assert local * t.shards == t.global_numel  # integral shapes on every rank
        if t.num_experts > 1:
            assert t.experts_per_rank * ep == t.num_experts
        for (rows, cols), (lr, lc) in zip(t.muon_components, t.local_muon_components, strict=True):
            assert lr * lc * t.shards == rows * cols
        if t.duplicate_of is not None:  # the MTP stage's copy of the word embedding: not a model parameter
            continue
        # distinct shards: tp/etp ranks hold different slices, ep ranks different experts
        total += local * t.experts_per_rank * t.shards * (ep if t.num_experts > 1 else 1)
    assert stages_seen == set(range(pp))
    assert total == inv.params_total == inv.unique_shard_numel_sum()


def test_qkv_rows_are_integral_for_gqa_under_every_valid_tp() -> None:
    for name in model_names():
        m = load_model(name)
        if not isinstance(m.attention, GqaAttention):
            continue
        for tp in _tp_choices(m):
            inv = build_inventory(m, tp=tp)
            qkv = next(t for t in inv.tensors if t.role == "qkv")
            assert sum(r for r, _ in qkv.local_muon_components) == qkv.local_shape[0]
