"""Muon/AdamW routing of the tensor inventory (Megatron's ``_is_muon_excluded`` rules)."""

from __future__ import annotations

import pytest

from workloads.inventory import build_inventory
from workloads.models import load_model


@pytest.fixture(scope="module")
def kimi():
    return build_inventory(load_model("kimi-k2"), tp=2, pp=4, vpp=1, ep=8, etp=1)


def test_embedding_output_and_vectors_go_to_adamw(kimi) -> None:
    by_role = {}
    for t in kimi.tensors:
        by_role.setdefault(t.role, set()).add(t.optimizer)
    assert by_role["embedding"] == {"adamw"} and by_role["output"] == {"adamw"}
    assert by_role["norm"] == {"adamw"}
    for t in kimi.tensors:
        if len(t.global_shape) == 1 and t.role != "expert_bias":
            assert t.optimizer == "adamw", t.name


def test_router_shared_experts_and_all_other_matrices_go_to_muon(kimi) -> None:
    for t in kimi.tensors:
        if len(t.global_shape) == 2 and t.role not in ("embedding", "output"):
            assert t.optimizer == "muon", t.name
    roles = {t.role for t in kimi.tensors if t.optimizer == "muon"}
    assert {"router", "shared_fc1", "shared_fc2", "expert_fc1", "expert_fc2", "q_down", "kv_down",
            "q_up", "kv_up", "attn_out", "fc1", "fc2"} <= roles


def test_expert_bias_is_not_optimised(kimi) -> None:
    bias = [t for t in kimi.tensors if t.role == "expert_bias"]
    assert len(bias) == load_model("kimi-k2").num_moe_layers
    assert {t.optimizer for t in bias} == {"none"}
    assert all(t.global_shape == (384,) and t.muon_components == () for t in bias)


def test_experts_are_separate_matrices_reduced_over_expert_dp(kimi) -> None:
    experts = [t for t in kimi.tensors if t.role in ("expert_fc1", "expert_fc2")]
    assert experts and all(t.num_experts == 384 and t.experts_per_rank == 384 // 8 for t in experts)
    assert {t.dp_group for t in experts} == {"expert_dp"}
    assert all(len(t.muon_components) == 1 and t.muon_components[0] == t.global_shape for t in experts)
    shared = [t for t in kimi.tensors if t.role.startswith("shared_")]
    assert {t.dp_group for t in shared} == {"dp"} and all(t.shard_group == "tp" for t in shared)
    assert {t.dp_group for t in kimi.tensors if t.role == "router"} == {"dp"}


def test_mla_projections_are_not_split(kimi) -> None:
    for t in kimi.tensors:
        if t.optimizer == "muon" and t.role != "qkv":
            assert t.muon_components == (t.global_shape,), t.name


@pytest.mark.parametrize("name", ["llama3-8b", "llama3-70b", "qwen3-30b-a3b"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_qkv_split_components_sum_to_the_fused_rows(name: str, tp: int) -> None:
    model = load_model(name)
    att = model.attention
    split = build_inventory(model, tp=tp, split_qkv=True)
    fused = build_inventory(model, tp=tp, split_qkv=False)
    for a, b in zip(split.tensors, fused.tensors, strict=True):
        if a.role != "qkv":
            assert a.muon_components == b.muon_components
            continue
        h, d = model.hidden_size, att.head_dim
        assert a.muon_components == ((att.num_heads * d, h), (att.num_kv_heads * d, h), (att.num_kv_heads * d, h))
        assert sum(r for r, _ in a.muon_components) == a.global_shape[0]
        assert all(c == h for _, c in a.muon_components)
        assert sum(r for r, _ in a.local_muon_components) == a.local_shape[0]
        assert b.muon_components == (b.global_shape,)
    assert split.params_total == fused.params_total
