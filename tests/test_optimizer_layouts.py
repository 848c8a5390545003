"""Bucket layouts and load balancing: Megatron's padding rules, shard invariants, LPT quality."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from costmodel.optimizer import layouts as lay


def _hand_ddp_numel(sizes: list[int], d: int) -> int:
    """One bucket by hand: 64-aligned starts, end padded to lcm(d, 128)."""
    cursor = 0
    for n in sizes:
        cursor = -(-cursor // 64) * 64 + n
    return -(-cursor // math.lcm(d, 128)) * math.lcm(d, 128)


@pytest.mark.parametrize("d", [1, 2, 3, 8, 48, 256])
def test_element_wise_bucket_padding_matches_megatron(d: int) -> None:
    sizes = [4096, 100, 7, 65536, 1000, 3]
    spans = lay.ddp_buckets(np.array(sizes), d, None, distributed_optimizer=True)
    assert len(spans) == 1
    assert spans[0].numel == _hand_ddp_numel(sizes, d)
    assert spans[0].numel % math.lcm(d, 128) == 0
    assert all(s % 64 == 0 for s in spans[0].starts.tolist())
    # every parameter element is in exactly one shard
    per_rank = lay.shard_param_numel(spans[0], np.array(sizes), d)
    assert per_rank.sum() == sum(sizes) and len(per_rank) == d


def test_plain_ddp_buckets_are_unpadded_and_close_at_bucket_size() -> None:
    sizes = np.array([30, 50, 40, 10, 100])
    spans = lay.ddp_buckets(sizes, 4, 80, distributed_optimizer=False)
    assert [(s.first, s.stop, s.numel) for s in spans] == [(0, 2, 80), (2, 5, 150)]


def test_default_bucket_size() -> None:
    assert lay.default_bucket_size(8) == 40_000_000
    assert lay.default_bucket_size(64) == 64_000_000


def test_ping_pong_order() -> None:
    assert lay.ping_pong_owner(10, 3).tolist() == [0, 1, 2, 2, 1, 0, 0, 1, 2, 2]
    owner = lay.whole_param_owner(np.array([5, 1, 3, 2]), np.zeros(4), 2, "ping_pong")
    # ascending numel: 1 (idx1) -> 0, 2 (idx3) -> 1, 3 (idx2) -> 1, 5 (idx0) -> 0
    assert owner.tolist() == [0, 0, 1, 1]


def test_none_deals_layout_order_round_robin() -> None:
    owner = lay.whole_param_owner(np.array([10, 30, 10, 50, 10, 10]), np.zeros(6), 3, "none")
    assert owner.tolist() == [0, 1, 2, 0, 1, 2]


def _brute_force_makespan(costs: list[float], m: int) -> float:
    best = math.inf
    for assign in itertools.product(range(m), repeat=len(costs)):
        loads = [0.0] * m
        for c, r in zip(costs, assign, strict=True):
            loads[r] += c
        best = min(best, max(loads))
    return best


def test_lpt_within_graham_bound_of_brute_force_optimum() -> None:
    rng = random.Random(5)
    for _ in range(60):
        m = rng.choice([2, 3])
        costs = [float(rng.randint(1, 40) ** 3) for _ in range(rng.randint(m + 1, 8))]
        owner = lay.lpt_owner(np.array(costs), m)
        loads = np.bincount(owner, weights=costs, minlength=m)
        opt = _brute_force_makespan(costs, m)
        assert loads.max() <= (4 / 3 - 1 / (3 * m)) * opt + 1e-9


@pytest.mark.parametrize("strategy", ["lpt", "ping_pong", "none"])
@pytest.mark.parametrize("d", [1, 4, 6, 64])
def test_layer_wise_buckets_keep_whole_params_in_aligned_padded_shards(strategy: str, d: int) -> None:
    rng = np.random.default_rng(d)
    shapes = [(int(a) * 64, int(b) * 64) for a, b in rng.integers(1, 40, size=(40, 2))]
    numel = np.array([a * b for a, b in shapes])
    cost = np.array([max(s) * min(s) ** 2 for s in shapes], dtype=float)
    spans = lay.layer_wise_buckets(numel, cost, d, bucket_size=200_000, strategy=strategy)
    assert spans[0].first == 0 and spans[-1].stop == len(numel)
    assert all(a.stop == b.first for a, b in itertools.pairwise(spans))
    for s in spans:
        shard = s.numel // d
        assert s.numel == shard * d and shard % lay.shard_pad_multiple(d) == 0 and s.numel % math.lcm(d, 128) == 0
        assert all(st % 64 == 0 for st in s.starts.tolist())
        sizes = numel[s.first:s.stop]
        # no parameter crosses a shard boundary, and the owner's shard holds it
        assert np.all(s.starts // shard == s.owner)
        assert np.all((s.starts + sizes - 1) // shard == s.owner)
        # parameters of one shard do not overlap
        for r in range(d):
            sel = np.flatnonzero(s.owner == r)
            iv = sorted(zip(s.starts[sel].tolist(), (s.starts[sel] + sizes[sel]).tolist(), strict=True))
            assert all(a[1] <= b[0] for a, b in itertools.pairwise(iv))


def test_layer_wise_chunk_closes_at_threshold() -> None:
    # d = 2, max numel 100 -> threshold max(bucket 150, 0.9·2·100 = 180) = 180 elements
    numel = np.array([100, 100, 100, 100])
    spans = lay.layer_wise_buckets(numel, numel.astype(float), 2, bucket_size=150, strategy="lpt")
    assert [(s.first, s.stop) for s in spans] == [(0, 2), (2, 4)]
    assert all(s.numel == 2 * 128 for s in spans)  # shard 100 -> padded to lcm(64, 128/2) = 64 multiple


def test_lpt_cap_overrides_least_loaded() -> None:
    # d = 2; items by cost: (300, cost 100) -> r0, (400, 90) -> r1; plain LPT would put the last item on r1
    # cap = 1.3·sum/2: a 100-element item fits only on r0 (320 + 100 <= 520), so it goes there
    spans = lay.layer_wise_buckets(np.array([100, 300, 400]), np.array([1.0, 100.0, 90.0]), 2, None, "lpt")
    assert spans[0].owner.tolist() == [0, 0, 1]
    # a 1000-element item fits nowhere (cap 1105): the shard with the smallest cursor (r0, 300) takes it
    spans = lay.layer_wise_buckets(np.array([1000, 300, 400]), np.array([1.0, 100.0, 90.0]), 2, None, "lpt")
    assert spans[0].owner.tolist() == [0, 0, 1]
    assert lay.lpt_owner(np.array([1.0, 100.0, 90.0]), 2).tolist() == [1, 0, 1]


def _scan_assign_lpt(numel, cost, d, loads):  # noqa: ANN001, ANN202 - the reference: scan every rank per item
    sizes, costs, load = numel.tolist(), cost.tolist(), loads.tolist()
    cap = lay.LPT_CAP * float(numel.sum()) / d
    owner, start, cursors, padded = [0] * len(sizes), [0] * len(sizes), [0] * d, [0] * d
    for i in np.argsort(-cost, kind="stable").tolist():
        r, best = -1, float("inf")
        for k in range(d):
            if padded[k] + sizes[i] <= cap and load[k] < best:
                r, best = k, load[k]
        if r < 0:
            r = min(range(d), key=cursors.__getitem__)
        owner[i], start[i] = r, padded[r]
        cursors[r] = padded[r] + sizes[i]
        padded[r] = -(-cursors[r] // 64) * 64
        load[r] += costs[i]
    return owner, start, cursors, load


def test_lpt_heap_assignment_equals_scanning_every_rank() -> None:
    rng = np.random.default_rng(7)
    for trial in range(300):
        d = int(rng.integers(2, 40))
        n = int(rng.integers(1, 80))
        kinds = rng.integers(1, 5)
        numel = rng.choice(rng.integers(1, 5000, size=kinds) * 64 + rng.integers(0, 64, size=kinds), size=n)
        cost = numel.astype(np.float64) ** 1.5 if trial % 2 else rng.integers(1, 4, size=n).astype(np.float64)
        loads = rng.integers(0, 3, size=d).astype(np.float64) * (trial % 3 == 0)
        expected = _scan_assign_lpt(numel, cost, d, loads.copy())
        got_loads = loads.copy()
        owner, start, cursors = lay._assign_chunk(numel, cost, d, got_loads, "lpt")
        assert owner.tolist() == expected[0] and start.tolist() == expected[1]
        assert cursors.tolist() == expected[2] and got_loads.tolist() == expected[3]
