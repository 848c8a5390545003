"""Fabric graphs and the arithmetic layout: NVLink domains, rails, fat-tree tiers, bisection.

Facts from ../shared/reference/hardware-and-collectives.md §3-§4: NVL72 = 72 GPUs, 18 switch chips,
one 50 GB/s/dir NVLink 5 link from every GPU to every chip (900 GB/s/dir per GPU, one switch hop
between any two GPUs) [S16] [S18]; rail-optimised non-blocking fat trees [S42] [S43] [S44].
"""

from __future__ import annotations

import networkx as nx
import pytest

from topologies.fabric import build_fabric, fabric_summary
from topologies.hardware import load_system
from topologies.inputs import UserInputError
from topologies.layout import fabric_layout
from topologies.placement import place_job


def _graph(system_name: str, gpus: int, **kw):
    system = load_system(system_name)
    placement = place_job(system, gpus, **kw)
    return system, placement.layout, build_fabric(placement.layout, system)


@pytest.mark.parametrize("name", ["gb300-nvl72", "gb200-nvl72"])
def test_nvl72_gpu_has_one_50GBps_link_to_each_of_18_chips(name):
    """[S18]: 'one dedicated NVL5 link to each one of the 18 switch chips' → 900 GB/s/dir per GPU."""
    _, layout, g = _graph(name, 72)
    chips = [n for n, d in g.nodes(data=True) if d["kind"] == "nvlink_switch"]
    assert len(chips) == 18
    for gpu in range(72):
        out = [(v, d) for _, v, d in g.out_edges(("gpu", gpu), data=True) if d["link"] == "nvlink"]
        assert sorted(v for v, _ in out) == sorted(chips)
        assert all(d["bandwidth_Bps"] == pytest.approx(50e9) for _, d in out)
        assert sum(d["bandwidth_Bps"] for _, d in out) == pytest.approx(900e9)
        inbound = sum(g.edges[u, ("gpu", gpu)]["bandwidth_Bps"] for u in chips)
        assert inbound == pytest.approx(900e9)
    # 18 chips x 72 ports = 1,296 = 72 GPUs x 18 links [S23]
    assert all(g.in_degree(c) == 72 and g.out_degree(c) == 72 for c in chips)
    assert layout.nvlink_bisection_Bps == pytest.approx(32.4e12)  # §3: 36 x 900 GB/s


def test_every_gpu_pair_in_a_rack_is_one_switch_hop_apart():
    _, _, g = _graph("gb300-nvl72", 72)
    succ = {i: set(g.successors(("gpu", i))) for i in range(72)}
    pred = {i: set(g.predecessors(("gpu", i))) for i in range(72)}
    for a in range(72):
        for b in range(72):
            if a != b:
                assert not g.has_edge(("gpu", a), ("gpu", b))
                common = {n for n in succ[a] & pred[b] if n[0] == "nvsw"}
                assert len(common) == 18  # GPU -> any of 18 chips -> GPU
    nvl = g.edge_subgraph([(u, v) for u, v, d in g.edges(data=True) if d["link"] == "nvlink"])
    assert nx.shortest_path_length(nvl, ("gpu", 0), ("gpu", 71)) == 2


def test_dgx_node_is_an_nvswitch_domain_with_one_nic_per_gpu_on_its_rail():
    system, layout, g = _graph("dgx-h100", 16)
    assert layout.domain_size == 8 and layout.rails == 8
    for gpu in range(16):
        nvl = sum(d["bandwidth_Bps"] for _, _, d in g.out_edges(("gpu", gpu), data=True) if d["link"] == "nvlink")
        assert nvl == pytest.approx(450e9)  # NVLink 4: 18 x 25 GB/s [S6]
        leaf = next(v for v in g.successors(("nic", gpu, 0)) if v[0] == "leaf")
        assert g.nodes[leaf]["rail"] == gpu % 8
        assert g.edges[("nic", gpu, 0), leaf]["bandwidth_Bps"] == pytest.approx(50e9)


def test_nvl72_rails_are_nic_positions_of_a_compute_tray():
    """4 ConnectX per compute tray [S17] → 4 rails, 18 NICs per rail per rack; a Q3400 leaf (72 down
    ports) serves one rail of 4 racks ([S44]: 'two Q3400 leaves per rail per SU')."""
    _, layout, g = _graph("gb300-nvl72", 576)
    assert (layout.rails, layout.nics_per_rail_per_domain, layout.domains_per_leaf) == (4, 18, 4)
    assert layout.leaves_per_plane == 8  # 2 per rail per SU of 8 racks
    for gpu in (0, 1, 2, 3, 4, 75, 500):
        leaf = next(v for v in g.successors(("nic", gpu, 0)) if v[0] == "leaf")
        slot, rack = gpu % 72, gpu // 72
        assert leaf[2] == slot % 4 and leaf[3] == rack // 4
    leaves = [n for n, d in g.nodes(data=True) if d["kind"] == "leaf"]
    assert all(sum(1 for u in g.predecessors(leaf) if u[0] == "nic") == 72 for leaf in leaves)


@pytest.mark.parametrize(("gpus", "counts"), [(512, (16, 8, 0)), (2048, (64, 32, 0)), (4096, (128, 128, 64))])
def test_switch_counts_match_the_b200_superpod_design(gpus, counts):
    """DGX B200 RA [S43]: 2 SU 16 leaf / 8 spine; 8 SU 64 / 32; 16 SU 128 / 128 / 64 core (3 tiers)."""
    layout = place_job(load_system("dgx-b200"), gpus).layout
    assert (layout.leaves_per_plane, layout.spines_per_plane, layout.cores_per_plane) == counts
    assert layout.tiers == (3 if gpus > 2048 else 2)


def test_dgx_b300_xdr_one_su_is_8_leaves_4_spines():
    """DGX B300-XDR RA [S21]: one SU of 72 nodes = 8 leaf / 4 spine (radix 144 two-tier)."""
    layout = place_job(load_system("dgx-b300"), 576).layout
    assert (layout.leaves_per_plane, layout.spines_per_plane, layout.tiers) == (8, 4, 2)


def _bisection_maxflow(g: nx.DiGraph, layout) -> float:
    """Max flow from the first half of the domains' GPUs to the second half, NVLink excluded."""
    h = nx.DiGraph()
    for u, v, d in g.edges(data=True):
        if d["link"] != "nvlink":
            h.add_edge(u, v, capacity=d["bandwidth_Bps"])
    half = layout.domains // 2
    for n, d in g.nodes(data=True):
        if d["kind"] == "gpu":
            if d["domain"] < half:
                h.add_edge("src", n, capacity=float("inf"))
            else:
                h.add_edge(n, "dst", capacity=float("inf"))
    return nx.maximum_flow_value(h, "src", "dst")


@pytest.mark.parametrize(("name", "gpus"), [("gb300-nvl72", 576), ("gb200-nvl72", 144), ("dgx-b200", 512)])
def test_non_blocking_fat_tree_bisection_is_half_the_nic_bandwidth(name, gpus):
    system, layout, g = _graph(name, gpus)
    expected = gpus * system.scale_out.nic_bandwidth_Bps / 2
    assert layout.network_bisection_Bps == pytest.approx(expected)
    assert _bisection_maxflow(g, layout) == pytest.approx(expected, rel=1e-9)


def _custom_dgx(radix: int, oversubscription: float, planes: int = 1):
    base = load_system("dgx-h100")
    so = base.scale_out.model_copy(update={"switch_radix": radix, "oversubscription": oversubscription, "planes": planes})
    return base.model_copy(update={"scale_out": so, "name": f"dgx-h100-r{radix}-o{oversubscription}-p{planes}"})


def test_oversubscribed_leaves_divide_the_bisection():
    """Radix 16 at 3:1 → 12 down / 4 up ports: the cut between two leaves' nodes carries a third."""
    system = _custom_dgx(16, 3.0)
    layout = fabric_layout(system, 192, 8)  # 24 nodes: 12 per leaf per rail
    assert (layout.leaf_down_ports, layout.leaf_up_ports, layout.domains_per_leaf) == (12, 4, 12)
    g = build_fabric(layout, system)
    expected = 192 * 50e9 / 2 / 3
    assert layout.network_bisection_Bps == pytest.approx(expected)
    assert _bisection_maxflow(g, layout) == pytest.approx(expected, rel=1e-9)


def test_planes_split_each_nic_over_parallel_fabrics():
    system = _custom_dgx(16, 1.0, planes=2)
    layout = fabric_layout(system, 128, 8)
    g = build_fabric(layout, system)
    ports = [d["bandwidth_Bps"] for u, v, d in g.edges(data=True) if u[0] == "nic" and v[0] == "leaf"]
    assert len(ports) == 128 * 2 and all(p == pytest.approx(25e9) for p in ports)
    assert _bisection_maxflow(g, layout) == pytest.approx(128 * 50e9 / 2, rel=1e-9)


def test_graph_node_counts_match_the_arithmetic_summary():
    system, layout, g = _graph("dgx-b200", 4096)
    kinds: dict[str, int] = {}
    for _, d in g.nodes(data=True):
        kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
    s = fabric_summary(layout, system)
    assert kinds == {"gpu": 4096, "nvlink_switch": s["nvlink_switch_chips"], "nic": s["nics"],
                     "leaf": s["leaves"], "spine": s["spines"], "core": s["cores"]}
    assert all("bandwidth_Bps" in d and "latency_s" in d for _, _, d in g.edges(data=True))


def test_huge_graphs_are_refused_but_layouts_are_cheap():
    system = load_system("gb300-nvl72")
    layout = place_job(system, 100_008, tp=8).layout  # 1,389 racks of 72
    assert layout.domains == 1389 and layout.tiers == 3  # > 10,368 NICs: beyond a two-tier radix-144 fabric
    with pytest.raises(UserInputError, match="too large"):
        build_fabric(layout, system)
    g = build_fabric(layout, system, domains=[0, 700])  # a representative part is fine
    assert sum(1 for _, d in g.nodes(data=True) if d["kind"] == "gpu") == 144
