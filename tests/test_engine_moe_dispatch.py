"""MoE dispatch model: per-domain de-duplication of the flex (HybridEP) dispatcher."""

from math import comb

import pytest

from costmodel.moe_dispatch import dispatch_bytes_per_gpu, dispatch_cost, domain_hit_probability
from topologies.collectives import collective_cost
from topologies.groups import GroupShape
from topologies.hardware import load_system


def test_hit_probability_matches_counting() -> None:
    # 256 experts on 4 domains, top-8: P(no expert in a given domain) = C(192, 8) / C(256, 8)
    p = domain_hit_probability(256, 8, 4)
    assert p == pytest.approx(1 - comb(192, 8) / comb(256, 8))
    assert domain_hit_probability(256, 8, 1) == 1.0
    assert domain_hit_probability(8, 8, 2) == 1.0  # every token touches every domain


def test_flex_sends_each_token_once_per_remote_domain() -> None:
    shape = GroupShape(32, 8, 4)
    tokens, h = 4096, 7168
    nvl_a2a, net_a2a = dispatch_bytes_per_gpu(tokens, h, 256, 8, shape, "alltoall")
    nvl, net = dispatch_bytes_per_gpu(tokens, h, 256, 8, shape, "flex")
    assert net_a2a == pytest.approx(tokens * 8 * h * 2 * 24 / 32)
    assert net == pytest.approx(tokens * h * 2 * 3 * domain_hit_probability(256, 8, 4))
    assert net < 0.5 * net_a2a  # at most one copy per remote domain instead of ~6 copies
    assert nvl > nvl_a2a  # the remote copies fan out over NVLink in the destination domain


def test_inside_one_domain_is_the_plain_all_to_all() -> None:
    system = load_system("gb300-nvl72")
    shape = GroupShape(32, 32, 1)
    t, lat, link = dispatch_cost(8192, 4096, 128, 8, shape, system)
    ref = collective_cost("all_to_all", 8192 * 8 * 4096 * 2, shape, system)
    assert t == pytest.approx(ref.time_s) and link == "nvlink" and 0 < lat < t


def test_flex_across_nodes_is_faster_and_network_bound() -> None:
    system = load_system("dgx-b200")
    shape = GroupShape(32, 8, 4)
    t_flex, _, link = dispatch_cost(4096, 7168, 256, 8, shape, system, "flex")
    t_a2a, _, _ = dispatch_cost(4096, 7168, 256, 8, shape, system, "alltoall")
    assert link == "network"
    assert t_flex < t_a2a
