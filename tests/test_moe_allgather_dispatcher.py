"""The allgather MoE token dispatcher (Megatron-Core's default) against a hand calculation.

Case: 8 experts, top-2, h = 512, micro-batch 4 x 1024 tokens, tp 2 with sequence parallelism,
ep 2, etp 2 on 8 H100s. One rank holds T = 4·1024/2 = 2048 tokens; the tp_ep group has n = 4
consecutive ranks. MoEAllGatherTokenDispatcher gathers the routing map [T, 8] (bool), the
probabilities [T, 8] (bf16) and the hidden states [T, 512] (bf16) over the group, and
reduce-scatters the expert outputs [n·T, 512] back; backward mirrors it (no routing-map gradient).
"""

from __future__ import annotations

import pytest

from costmodel.layer_comm import layer_comm
from costmodel.layer_costs import LAYER_GROUP_KINDS, collective_s, layer_ops, rank_shape
from costmodel.moe_dispatch import allgather_dispatch_calls
from topologies.placement import placement_for
from workloads.models import GqaAttention, ModelSpec, MoeSpec
from workloads.scenario import build_config

MOE = ModelSpec(name="ci-moe", num_layers=4, hidden_size=512, ffn_hidden_size=2048, vocab_size=50257,
                attention=GqaAttention(num_heads=8, num_kv_heads=8, head_dim=64),
                moe=MoeSpec(num_experts=8, topk=2, expert_ffn_hidden_size=2048), activation="gelu")
T, N = 2048, 4


def _scenario(dispatcher: str):
    return build_config({
        "model": MOE.model_dump(), "system": "dgx-h100", "gpus": 8, "precision": "bf16",
        "parallelism": {"tp": 2, "pp": 1, "vpp": 1, "ep": 2, "etp": 2, "micro_batch_size": 4,
                        "global_batch_size": 32, "seq_length": 1024},
        "optimizer": {"kind": "adamw"}, "runtime": {"moe_token_dispatcher_type": dispatcher}}, {}).resolve()


def test_collectives_and_bytes_by_hand():
    fwd, bwd = allgather_dispatch_calls(T, 512, 8, N)
    assert [(c.op, c.group, c.group_size, c.bytes) for c in fwd] == [
        ("all_gather", "etp_ep", 4, 4 * 2048 * 8 * 1),      # routing map, 65,536 B
        ("all_gather", "etp_ep", 4, 4 * 2048 * 8 * 2),      # probabilities, 131,072 B
        ("all_gather", "etp_ep", 4, 4 * 2048 * 512 * 2),    # tokens, 8,388,608 B
        ("reduce_scatter", "etp_ep", 4, 4 * 2048 * 512 * 2),  # combine
    ]
    assert [(c.op, c.bytes) for c in bwd] == [
        ("all_gather", 8_388_608), ("reduce_scatter", 8_388_608), ("reduce_scatter", 131_072)]
    assert allgather_dispatch_calls(T, 512, 8, 1) == ((), ())


def test_layer_ep_time_is_the_sum_of_those_collectives_on_the_tp_ep_group():
    sc = _scenario("allgather")
    placement = placement_for(sc)
    shapes = {k: placement.shape(k) for k in LAYER_GROUP_KINDS}
    assert (shapes["etp_ep"].size, shapes["etp_ep"].domains) == (4, 1)
    shape = rank_shape(sc)
    assert shape.sp_tokens == T
    fwd, bwd = layer_comm(sc, shape, "moe", shapes, (0.0, 0.0), overlap=False)
    sizes_fwd = (65_536, 131_072, 8_388_608)
    expect_fwd = sum(collective_s("all_gather", b, shapes["etp_ep"], sc.system)[0] for b in sizes_fwd)
    expect_fwd += collective_s("reduce_scatter", 8_388_608, shapes["etp_ep"], sc.system)[0]
    expect_bwd = (collective_s("all_gather", 8_388_608, shapes["etp_ep"], sc.system)[0]
                  + collective_s("reduce_scatter", 8_388_608, shapes["etp_ep"], sc.system)[0]
                  + collective_s("reduce_scatter", 131_072, shapes["etp_ep"], sc.system)[0])
    ep = {b.kind: b for b in fwd}["ep"]
    assert ep.time_s == pytest.approx(expect_fwd, rel=1e-12)
    assert {b.kind: b for b in bwd}["ep"].time_s == pytest.approx(expect_bwd, rel=1e-12)


def test_permutation_works_on_the_gathered_tokens():
    ag, a2a = _scenario("allgather"), _scenario("alltoall")
    ops_ag = {o.name: o for o in layer_ops(MOE, rank_shape(ag), "moe", "none", ()).forward}
    ops_a2a = {o.name: o for o in layer_ops(MOE, rank_shape(a2a), "moe", "none", ()).forward}
    pairs = T * 2 * 2  # T tokens x top-2 x etp 2 token-expert pairs land on this rank either way
    assert ops_ag["experts.linear_fc1"].m == ops_a2a["experts.linear_fc1"].m == pairs
    assert ops_ag["permute"].bytes == 2 * pairs * 512 * 2  # read and write the selected pairs
    assert ops_ag["unpermute"].bytes == (N * T + 2 * pairs) * 512 * 2  # zero n·T rows, scatter-add pairs
    assert ops_a2a["permute"].bytes == 2 * T * 2 * 512 * 2  # the rank's own T x top-2 copies
