"""Placement of Megatron's process groups: rank order, shapes against brute force, policy, errors."""

from __future__ import annotations

from collections import Counter

import pytest

from topologies.hardware import load_system
from topologies.inputs import UserInputError
from topologies.placement import GROUP_KINDS, default_gpus_per_domain, place_job, placement_for

NVL72 = load_system("gb300-nvl72")


@pytest.mark.parametrize(("gpus", "per_domain"), [(256, 64), (144, 72), (1440, 72), (64, 64), (100, 50), (4096, 64)])
def test_default_policy_uses_the_largest_divisor_up_to_the_rack(gpus, per_domain):
    """Stated policy: 256 GPUs on NVL72 → 64 per rack on 4 racks (NVIDIA's Kimi K2 layout [S47])."""
    assert default_gpus_per_domain(NVL72, gpus) == per_domain
    assert place_job(NVL72, gpus).domains == gpus // per_domain


def test_override_of_gpus_per_domain():
    p = place_job(NVL72, 256, tp=8, gpus_per_domain=32)
    assert p.domains == 8 and p.group_gpus("world")[32] == 72  # rank 32 is slot 0 of rack 1


def test_megatron_rank_order():
    p = place_job(NVL72, 256, tp=2, cp=2, pp=4, ep=8, etp=1)
    assert p.group_ranks("tp", 0) == [0, 1]
    assert p.group_ranks("cp", 0) == [0, 2]
    assert p.group_ranks("dp", 0) == list(range(0, 64, 2))  # dp x cp gradient group, stride tp
    assert p.group_ranks("pp", 3) == [3, 67, 131, 195]
    assert p.group_ranks("ep", 0) == list(range(8))
    assert p.group_ranks("expert_dp", 1) == list(range(1, 64, 8))
    for kind in GROUP_KINDS:  # every kind partitions the ranks (embd: the first and last stage only)
        seen = Counter(r for i in range(p.group_count(kind)) for r in p.group_ranks(kind, i))
        ranks = [*range(64), *range(192, 256)] if kind == "embd" else list(range(256))
        assert sorted(seen) == ranks and set(seen.values()) == {1}
    assert p.group_ranks("embd", 3) == [3, 195]  # Megatron's default_embedding_ranks: first and last stage


def _brute_shape(p, kind):
    """Worst group: most domains spanned, then the fewest ranks in its least-populated domain."""
    worst = None
    for members in p.all_groups(kind):
        counts = Counter(g // p.layout.domain_size for g in members)
        cand = (len(counts), -min(counts.values()))
        worst = cand if worst is None or cand > worst else worst
    return worst[0], -worst[1]


CONFIGS = [
    dict(gpus=256, tp=8, pp=4, ep=64),
    dict(gpus=256, tp=4, cp=2, pp=2, ep=16, etp=2),
    dict(gpus=288, tp=16, gpus_per_domain=72),  # tp groups straddle racks of 72 unevenly
    dict(gpus=288, tp=16),  # the policy avoids that: 48 per rack
    dict(gpus=576, tp=8, pp=8, ep=8),
    dict(gpus=1440, tp=16, pp=2, gpus_per_domain=72),
    dict(gpus=100, tp=4, ep=2),
    dict(gpus=512, tp=8, pp=2, gpus_per_domain=32),
    dict(gpus=144, tp=4, pp=4, gpus_per_domain=72, tp_pp_dp=True),  # a replica's block straddles racks
    dict(gpus=192, tp=2, pp=3, ep=2, gpus_per_domain=64, tp_pp_dp=True),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=[str(c) for c in CONFIGS])
def test_shapes_agree_with_the_member_lists(cfg):
    p = place_job(NVL72, **cfg)
    for kind in GROUP_KINDS:
        shape = p.shape(kind)
        assert shape.size == p.size_and_stride(kind)[0]
        assert (shape.domains, shape.ranks_per_domain) == _brute_shape(p, kind), kind
        if shape.domains > 1:  # tiers reported are never below what any group actually crosses
            for members in p.all_groups(kind)[:50]:
                doms = sorted({g // 72 for g in members})
                assert shape.fabric_tiers >= p.layout.tier_between_domains(doms[0], doms[-1] - doms[0] + 1)


def test_tp16_on_72_gpu_racks_is_reported_uneven_and_spanning():
    shape = place_job(NVL72, 288, tp=16, gpus_per_domain=72).shape("tp")
    assert (shape.domains, shape.ranks_per_domain) == (2, 8)


@pytest.mark.parametrize(("gpus", "kw", "per_domain"), [
    (288, dict(tp=16), 48), (100_000, dict(tp=8), 40), (256, dict(ep=64), 64), (1440, dict(tp=8, ep=8), 72),
    (288, dict(tp=96), 72),  # a tp block larger than a rack cannot stay inside one: largest divisor
])
def test_policy_keeps_model_parallel_blocks_inside_racks(gpus, kw, per_domain):
    p = place_job(NVL72, gpus, **kw)
    assert p.gpus_per_domain == per_domain
    if per_domain % (kw.get("tp", 1)) == 0:
        assert p.shape("tp").domains == 1


def test_pipeline_over_four_racks_crosses_one_leaf_on_gb300():
    """[inferred §4.3]: PP4 x 64-GPU racks inside one SU; a Q3400 leaf serves a rail of 4 racks."""
    shape = place_job(NVL72, 256, tp=1, pp=4, ep=64).shape("pp")
    assert (shape.domains, shape.ranks_per_domain, shape.fabric_tiers) == (4, 1, 1)
    eight = place_job(NVL72, 512, pp=8).shape("pp")
    assert eight.fabric_tiers == 2  # 8 racks need the spine


def test_placement_for_the_default_scenario(default_scenario):
    p = placement_for(default_scenario)
    par = default_scenario.par
    assert p.gpus == default_scenario.gpus
    assert p.shape("ep").size == par.ep and p.shape("pp").size == par.pp
    assert p.shape("dp").size == default_scenario.dp * par.cp


@pytest.mark.parametrize(("kwargs", "needle"), [
    (dict(gpus=100, tp=8), "not divisible by tp*cp*pp"),
    (dict(gpus=256, ep=3), "not divisible by etp*ep*pp"),
    (dict(gpus=256, gpus_per_domain=96), "exceeds the NVLink domain size"),
    (dict(gpus=256, gpus_per_domain=0), "gpus_per_domain 0 must be between 1 and the NVLink domain size 72"),
    (dict(gpus=256, gpus_per_domain=48), "not a multiple of gpus_per_domain"),
    (dict(gpus=2_000_000), "exceeds the gb300-nvl72 limit"),
    (dict(gpus=0), "gpus must be >= 1"),
])
def test_impossible_placements_fail_with_one_line(kwargs, needle):
    with pytest.raises(UserInputError) as err:
        place_job(NVL72, **kwargs)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_unknown_group_kind_is_one_line():
    with pytest.raises(UserInputError, match="unknown group 'dpp'"):
        place_job(NVL72, 72).shape("dpp")


def test_huge_job_shapes_without_listing_gpus():
    p = place_job(NVL72, 100_008, tp=8, pp=3, ep=8)
    shapes = p.shapes
    assert shapes["world"].domains == 1389
    assert shapes["dp"].size == 100_008 // 24 and shapes["dp"].ranks_per_domain == 9
    members = p.group_gpus("dp", 5)  # one group on request
    assert len(members) == shapes["dp"].size and len({g // 72 for g in members}) == shapes["dp"].domains


def test_embedding_group_follows_the_tp_pp_dp_rank_order():
    """Megatron builds one embedding group per pipeline group, ``[pp_ranks[0], pp_ranks[-1]]``
    (``parallel_state.default_embedding_ranks``). 64 ranks, tp 2, pp 4, dp 8:

    - default order tp-cp-ep-dp-pp: pp group of rank b < 16 is {b, b+16, b+32, b+48} → embd {b, b+48};
    - tp-pp-dp order: rank = t + 2·s + 8·d (t < 2, stage s < 4, replica d < 8), pp group
      {t+8d, t+8d+2, t+8d+4, t+8d+6} → embd {t+8d, t+8d+6}; group 3 (the 4th first-stage rank,
      t=1, d=1) is {9, 15}."""
    default = place_job(NVL72, 64, tp=2, pp=4, gpus_per_domain=32)
    mapped = place_job(NVL72, 64, tp=2, pp=4, gpus_per_domain=32, tp_pp_dp=True)
    assert default.group_ranks("embd", 3) == [3, 51]
    assert mapped.group_ranks("embd", 3) == [9, 15]
    assert [mapped.group_ranks("embd", i) for i in range(mapped.group_count("embd"))] == [
        [t + 8 * d, t + 8 * d + 6] for d in range(8) for t in range(2)]
    for p in (default, mapped):  # each is [first, last] of a pipeline group
        pp_groups = [p.group_ranks("pp", i) for i in range(p.group_count("pp"))]
        assert sorted(p.group_ranks("embd", i) for i in range(16)) == sorted([g[0], g[-1]] for g in pp_groups)
    # 32 ranks per rack: the default pairs {b, b+48} (b < 16) always cross racks, tp-pp-dp pairs never do
    assert default.shape("embd").domains == 2
    assert mapped.shape("embd").intra_domain and mapped.shape("embd").size == 2


def test_embedding_group_of_a_replica_that_straddles_a_rack_under_tp_pp_dp():
    """144 ranks on 72-GPU racks, tp 4, pp 4 (tp-pp-dp): replica blocks of 16 ranks; the replica
    d = 4 holds ranks 64..79 across the rack boundary at 72, so its pair {64, 64 + 3·4 = 76} spans
    racks 0 and 1 (the worst group decides the shape); with pp 2 (stride 4, blocks of 8 aligned
    to 72) no pair crosses."""
    p = place_job(NVL72, 144, tp=4, pp=4, gpus_per_domain=72, tp_pp_dp=True)
    assert p.group_ranks("embd", 16) == [64, 76]
    assert p.shape("embd").domains == 2
    assert place_job(NVL72, 144, tp=4, pp=2, gpus_per_domain=72, tp_pp_dp=True).shape("embd").intra_domain
