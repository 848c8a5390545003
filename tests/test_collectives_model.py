"""Collective cost model: tuner, forced algorithms, byte accounting, flows, contention, fairness."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topologies import algorithms as alg
from topologies.collectives import (
    OPS,
    bus_factor,
    collective_cost,
    collective_time_s,
    eligible_algorithms,
    forceable_algorithms,
)
from topologies.contention import contention, group_flowsets, max_min_fair_rates
from topologies.flows import Flow, collective_flows
from topologies.groups import GroupShape
from topologies.hardware import load_system
from topologies.inputs import UserInputError
from topologies.placement import place_job

GB300 = load_system("gb300-nvl72")
H100 = load_system("dgx-h100")
SHAPES = [GroupShape.single_domain(8), GroupShape.single_domain(72), GroupShape.spread(144, 2, tiers=1),
          GroupShape.spread(1440, 20, tiers=2), GroupShape.spread(64, 64, tiers=2), GroupShape.spread(256, 4, tiers=1)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_tuner_takes_the_fastest_eligible_algorithm(op, shape):
    cost = collective_cost(op, 256e6, shape, GB300)
    times = dict(cost.candidates)
    assert set(times) == set(eligible_algorithms(op, shape, GB300))
    assert cost.time_s == pytest.approx(min(times.values()))
    for name in times:  # forcing each candidate returns exactly its time
        assert collective_cost(op, 256e6, shape, GB300, name).time_s == pytest.approx(times[name])


@pytest.mark.parametrize(("op", "shape", "algorithm"), [
    ("all_reduce", GroupShape.single_domain(72), "hierarchical"),
    ("all_reduce", GroupShape.spread(144, 2, tiers=1), "nvls"),
    ("all_gather", GroupShape.single_domain(8), "tree"),
    ("all_to_all", GroupShape.single_domain(8), "ring"),
])
def test_a_forced_ineligible_algorithm_is_one_line(op, shape, algorithm):
    with pytest.raises(UserInputError) as err:
        collective_cost(op, 1e6, shape, GB300, algorithm)
    assert "eligible:" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_the_tuner_follows_nccls_algorithm_set(op, shape):
    """NVLS only inside one domain, NVLSTree only across domains, hierarchical never by default."""
    tuner = eligible_algorithms(op, shape, GB300)
    assert "hierarchical" not in tuner
    assert ("nvls" in tuner) == (shape.domains == 1 and op in ("all_reduce", "reduce_scatter", "all_gather", "broadcast"))
    assert ("nvls_tree" in tuner) == (shape.domains > 1 and shape.ranks_per_domain > 1 and op == "all_reduce")
    hier_ok = shape.domains > 1 and shape.ranks_per_domain > 1 and op in ("all_reduce", "reduce_scatter", "all_gather")
    assert forceable_algorithms(op, shape, GB300) == tuner + (["hierarchical"] if hier_ok else [])
    if hier_ok:
        forced = collective_cost(op, 1e9, shape, GB300, "hierarchical")
        assert forced.algorithm == "hierarchical" and "hierarchical" in dict(forced.candidates)
        assert collective_cost(op, 1e9, shape, GB300).algorithm != "hierarchical"


def test_no_nvls_tree_without_nvlink_sharp():
    no_nvls = GB300.model_copy(update={"nvlink": GB300.nvlink.model_copy(update={"nvls": False}), "name": "no-nvls"})
    shape = GroupShape.spread(144, 2, tiers=1)
    assert eligible_algorithms("all_reduce", shape, no_nvls) == ["ring", "tree"]
    with pytest.raises(UserInputError):
        collective_cost("all_reduce", 1e9, shape, no_nvls, "nvls_tree")


def test_nvls_all_reduce_busbw_does_not_depend_on_the_group_size():
    """NCCL's NVLS model rates busbw: at the same per-rank chunk it is the same at 4, 8, 16 and 72
    ranks (measured: H100-8 479, B200-8 830+, GB200-72 839 [S10] [S32] [S29]); the wire S(1+1/n) at
    the effective NVLink rate bounds it for 2 ranks."""
    chunk = 1e9
    costs = [collective_cost("all_reduce", chunk * n, GroupShape.single_domain(n), GB300, "nvls") for n in (4, 8, 16, 72)]
    busbw = [c.size_bytes * bus_factor("all_reduce", c.group_size) / c.transfer_s for c in costs]  # latency aside
    assert max(busbw) == pytest.approx(min(busbw), rel=1e-12)
    lk = alg.links_for(GB300)
    assert busbw[0] == pytest.approx(lk.nvls_all_reduce_busbw_Bps * chunk / (chunk + GB300.efficiency.nvls_half_saturation_bytes))
    two = collective_cost("all_reduce", 2e9, GroupShape.single_domain(2), GB300, "nvls")
    assert two.algbw_Bps <= lk.nvlink_Bps / 1.5 * (1 + 1e-12)


def test_nvls_tree_stages_and_nccl_caps():
    """NVLSTree is bound by the slowest of: NVLS inside the domain, the heads' NICs across (tree
    degree x S/2 per head), NCCL's per-channel busbw cap (96 GB/s for 2 domains, 80 for more)."""
    S, e = 16e9, GB300.efficiency
    h = alg.nvls_tree_heads(72, e)
    assert h == e.nvls_tree_channels == 32 and alg.nvls_tree_heads(8, e) == 8
    two, twenty = GroupShape.spread(144, 2, tiers=1), GroupShape.spread(1440, 20, tiers=2)
    inside = collective_cost("all_reduce", S, GroupShape.single_domain(72), GB300, "nvls")
    est2 = alg.nvls_tree_all_reduce(S, two, alg.links_for(GB300))
    assert est2.transfer_s == pytest.approx(inside.transfer_s)  # 32 x 97 GB/s NICs keep up at 2 racks
    assert est2.network_bytes == pytest.approx(S / h) and est2.nvlink_bytes == pytest.approx(S * 73 / 72)
    assert collective_cost("all_reduce", S, twenty, GB300, "nvls_tree").network_bytes_per_gpu == pytest.approx(2 * S / h)
    fast_nic = GB300.model_copy(update={"name": "fast-nic", "scale_out": GB300.scale_out.model_copy(
        update={"nic_bandwidth_Bps": 1e13}), "nvlink": GB300.nvlink.model_copy(update={"link_bandwidth_Bps": 1e12})})
    for shape, cap in ((two, e.nvls_tree_channel_cap_2_domains_Bps), (twenty, e.nvls_tree_channel_cap_Bps)):
        c = collective_cost("all_reduce", S, shape, fast_nic, "nvls_tree")
        assert c.size_bytes * bus_factor("all_reduce", shape.size) / c.transfer_s == pytest.approx(h * cap)


def test_nvls_tree_head_slots_spread_over_the_domain():
    for g, h in ((72, 16), (8, 8), (9, 4), (3, 3)):
        slots = alg.nvls_tree_head_slots(g, h)
        assert len(slots) == h and slots[0] == 0 and slots[-1] < g


def test_nvls_tree_flows_use_one_nic_per_head():
    p = place_job(GB300, 288)
    fs = collective_flows("all_reduce", 4e9, p.group_gpus("world"), p.layout, GB300, algorithm="nvls_tree")
    nic_out = [b for (u, v), b in fs.phases[0].edge_bytes().items() if u[0] == "gpu" and v[0] == "nic"]
    assert len(fs.phases) == 1 and len(nic_out) == 4 * alg.nvls_tree_heads(72, GB300.efficiency)
    assert max(nic_out) == pytest.approx(fs.cost.network_bytes_per_gpu)


def test_bad_op_size_and_algorithm_names():
    shape = GroupShape.single_domain(8)
    for args in (("allreduce", 1e6, None), ("all_reduce", -1.0, None), ("all_reduce", 1e6, "butterfly")):
        with pytest.raises(UserInputError):
            collective_cost(args[0], args[1], shape, GB300, args[2])


def test_nothing_to_do_costs_nothing():
    assert collective_time_s("all_reduce", 1e9, GroupShape.single_domain(1), GB300) == 0.0
    assert collective_time_s("all_reduce", 0, GroupShape.single_domain(72), GB300) == 0.0


def test_bus_factors_follow_nccl_tests():
    """nccl-tests PERFORMANCE.md [S48]."""
    assert bus_factor("all_reduce", 8) == pytest.approx(14 / 8)
    assert bus_factor("all_gather", 8) == bus_factor("reduce_scatter", 8) == bus_factor("all_to_all", 8) == pytest.approx(7 / 8)
    assert bus_factor("broadcast", 8) == bus_factor("send_recv", 2) == 1.0


def test_collective_time_s_is_the_cached_cost_time():
    shape = GroupShape.spread(144, 2, tiers=1)
    a = collective_cost("reduce_scatter", 3e8, shape, GB300)
    assert collective_cost("reduce_scatter", 3e8, shape, GB300) is a
    assert collective_time_s("reduce_scatter", 3e8, shape, GB300) == a.time_s


@settings(max_examples=60, deadline=None)
@given(op=st.sampled_from(OPS), shape=st.sampled_from(SHAPES), size=st.floats(1e3, 2e10), factor=st.floats(1.01, 8.0))
def test_bigger_messages_never_finish_sooner(op, shape, size, factor):
    assert collective_time_s(op, size * factor, shape, GB300) >= collective_time_s(op, size, shape, GB300) * (1 - 1e-12)


@settings(max_examples=40, deadline=None)
@given(op=st.sampled_from(OPS), shape=st.sampled_from(SHAPES), size=st.floats(1e3, 2e10))
def test_more_bandwidth_never_makes_a_collective_slower(op, shape, size):
    faster = GB300.model_copy(update={
        "nvlink": GB300.nvlink.model_copy(update={"link_bandwidth_Bps": 2 * GB300.nvlink.link_bandwidth_Bps}),
        "scale_out": GB300.scale_out.model_copy(update={"nic_bandwidth_Bps": 2 * GB300.scale_out.nic_bandwidth_Bps}),
    })
    assert collective_time_s(op, size, shape, faster) <= collective_time_s(op, size, shape, GB300) * (1 + 1e-12)


def test_bandwidth_never_exceeds_the_wire():
    """busbw of ring-family algorithms ≤ the nominal link; NVLS algbw ≤ B/(1+1/n) (§3.1)."""
    for shape in SHAPES:
        for size in (1e6, 1e8, 1e10):
            ring = collective_cost("all_reduce", size, shape, GB300, "ring")
            assert ring.busbw_Bps <= GB300.nvlink.gpu_bandwidth_Bps
        nvls = collective_cost("all_reduce", 1e10, GroupShape.single_domain(72), GB300, "nvls")
        assert nvls.algbw_Bps <= 900e9 / (1 + 1 / 72)


def test_bytes_per_link_class():
    S = 1e9
    ring = collective_cost("all_reduce", S, GroupShape.single_domain(72), GB300, "ring")
    assert ring.nvlink_bytes_per_gpu == pytest.approx(2 * 71 / 72 * S) and ring.network_bytes_per_gpu == 0
    nvls = collective_cost("all_reduce", S, GroupShape.single_domain(72), GB300, "nvls")
    assert nvls.nvlink_bytes_per_gpu == pytest.approx(S * (1 + 1 / 72))
    hier = collective_cost("all_reduce", S, GroupShape.spread(1440, 20, tiers=2), GB300, "hierarchical")
    assert hier.network_bytes_per_gpu == pytest.approx(2 * 19 / 20 * S / 72) or "tree" in hier.detail
    a2a = collective_cost("all_to_all", S, GroupShape.spread(256, 4, tiers=1), GB300)
    assert a2a.nvlink_bytes_per_gpu == pytest.approx(S * 63 / 256)
    assert a2a.network_bytes_per_gpu == pytest.approx(S * 192 / 256)


def test_oversubscription_slows_traffic_above_the_leaf():
    shape = GroupShape.spread(64, 64, tiers=2)
    os2 = GB300.model_copy(update={"scale_out": GB300.scale_out.model_copy(update={"oversubscription": 2.0})})
    assert collective_time_s("all_gather", 1e9, shape, os2) > 1.8 * collective_time_s("all_gather", 1e9, shape, GB300) - 1e-3
    one_leaf = GroupShape.spread(64, 64, tiers=1)
    assert collective_time_s("all_gather", 1e9, one_leaf, os2) == collective_time_s("all_gather", 1e9, one_leaf, GB300)


def test_variable_all_gather_pays_more_latency_than_the_equal_one():
    shape = GroupShape.spread(64, 8, tiers=1)
    assert collective_time_s("all_gather_v", 1e5, shape, GB300) > collective_time_s("all_gather", 1e5, shape, GB300)


def test_tree_network_factor():
    """Busiest node of a double binary tree: S for 2 domains, 1.5 S for 3, 2 S for large ones."""
    assert [alg.tree_network_factor(d) for d in (2, 3, 7, 64)] == [1.0, 1.5, 2.0, 2.0]


FLOW_CASES = [
    ("gb300-nvl72", 72, "all_reduce", None), ("gb300-nvl72", 72, "all_reduce", "ring"),
    ("gb300-nvl72", 144, "all_reduce", None), ("gb300-nvl72", 144, "all_reduce", "tree"),
    ("gb300-nvl72", 360, "all_reduce", "tree"), ("gb300-nvl72", 288, "reduce_scatter", None),
    ("gb300-nvl72", 288, "all_gather", None), ("gb300-nvl72", 144, "all_to_all", None),
    ("dgx-h100", 64, "all_gather_v", None), ("dgx-h100", 64, "broadcast", None),
    ("dgx-h100", 64, "all_reduce", "ring"), ("gb200-nvl72", 1440, "all_reduce", None),
    ("gb300-nvl72", 144, "all_reduce", "hierarchical"), ("gb300-nvl72", 288, "reduce_scatter", "hierarchical"),
    ("dgx-h100", 32, "all_reduce", "nvls_tree"),
]


@pytest.mark.parametrize(("system", "gpus", "op", "algorithm"), FLOW_CASES)
def test_flows_replay_the_analytic_time(system, gpus, op, algorithm):
    sys_spec = load_system(system)
    p = place_job(sys_spec, gpus)
    fs = collective_flows(op, 2e9, p.group_gpus("world"), p.layout, sys_spec, algorithm=algorithm)
    assert fs.time_s() == pytest.approx(fs.cost.time_s, rel=1e-9)
    assert fs.capacities_Bps and all(e in fs.capacities_Bps for f in fs.flows for e in f.path)
    for f in fs.flows:  # paths are connected from src to dst
        assert f.path[0][0] == f.src and f.path[-1][1] == f.dst
        assert all(a[1] == b[0] for a, b in zip(f.path, f.path[1:], strict=False))


def test_ring_flows_carry_the_modelled_bytes_per_link_class():
    p = place_job(GB300, 144)
    fs = collective_flows("all_reduce", 1e9, p.group_gpus("world"), p.layout, GB300, algorithm="ring")
    load = fs.phases[0].edge_bytes()
    nic_out = [b for (u, v), b in load.items() if u[0] == "gpu" and v[0] == "nic"]
    assert len(nic_out) == 144 and all(b == pytest.approx(fs.cost.network_bytes_per_gpu) for b in nic_out)
    nvl_out = [b for (u, v), b in load.items() if u[0] == "gpu" and v[0] == "nvsw"]
    assert all(b == pytest.approx(2 * 143 / 144 * 1e9) for b in nvl_out)  # ring hop + PXN hop


def test_send_recv_across_racks_follows_the_rail():
    p = place_job(GB300, 288, pp=4)
    fs = collective_flows("send_recv", 1e8, p.group_gpus("pp", 5)[:2], p.layout, GB300)
    path = fs.flows[0].path
    assert [e[1][0] for e in path] == ["nic", "leaf", "nic", "gpu"]  # same slot: no PXN hop, one leaf


def _radix16(oversubscription: float):
    so = H100.scale_out.model_copy(update={"switch_radix": 16, "oversubscription": oversubscription,
                                           "domains_per_scalable_unit": 8})
    return H100.model_copy(update={"scale_out": so, "name": f"h100-radix16-{oversubscription}"})


def test_concurrent_groups_share_oversubscribed_uplinks():
    """All pp=2 pairs send at once: node n pairs with node n+12 across two leaves, so the 12 pairs of
    each rail share that leaf's up-links; 3:1 leaves (4 up ports for 12 NICs) slow them ~3x, 1:1 not.
    Rail-optimised dp groups, by contrast, never share a link (each owns its rail)."""
    reports = {}
    for os_ in (1.0, 3.0):
        system = _radix16(os_)
        p = place_job(system, 192, pp=2)
        assert p.shape("pp").domains == 2 and p.shape("pp").fabric_tiers >= 2
        reports[os_] = contention(group_flowsets(p, "pp", "send_recv", 1e9, system))
        dp = place_job(system, 192, tp=8)
        assert contention(group_flowsets(dp, "dp", "all_to_all", 1e8, system)).slowdown == pytest.approx(1.0)
    assert reports[1.0].slowdown == pytest.approx(1.0)
    worst = reports[3.0]
    assert worst.groups == 96 and worst.slowdown == pytest.approx(12 * 50 / (4 * 50), rel=0.05)
    assert worst.bottleneck[0][0] == "leaf" and worst.bottleneck[1][0] == "spines"


def test_max_min_fair_rates():
    e1, e2, e3 = ("a", "b"), ("b", "c"), ("x", "y")
    flows = [Flow("a", "c", 1, (e1, e2)), Flow("b", "c", 1, (e2,)), Flow("x", "y", 1, (e3,)), Flow("a", "b", 1, (e1,))]
    rates = max_min_fair_rates(flows, {e1: 10.0, e2: 4.0, e3: 7.0})
    assert rates == pytest.approx([2.0, 2.0, 7.0, 8.0])
