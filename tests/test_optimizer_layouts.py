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
    # every parameter element in exactly one shard: tests/test_optimizer_plan_batch.py (adam_rows)


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


def test_closure_threshold_uses_largest_param_in_the_chunk() -> None:
    """Unequal sizes, d = 2, bucket_size 1000, cost = numel (shard_pad_multiple(2) = lcm(64, 128/2) = 64).

    Backprop order [600, 500, 100, 3000, 50]. By hand:
    - chunk [600, 500]: C = 1100, M = 600, threshold max(1000, ⌊0.9·2·600⌋ = 1080) = 1080 <= C.
      Next 100: S = round_up(max(⌈1100/2⌉, 600), 64) = 640, padding 2·640 − 1100 = 180 >= 100 and
      100 <= 640: absorbed.
    - chunk [600, 500, 100]: C = 1200 >= 1080. Next 3000: S = 640, padding 80 < 3000: close.
    - chunk [3000]: threshold max(1000, ⌊0.9·2·3000⌋ = 5400) > 3000: 50 joins; end.
    (With the largest parameter of the whole buffer, 3000, the threshold would be 5400 everywhere and
    the buffer one chunk.)
    Assignment, chunk 1 (LPT, cap 1.3·1200/2 = 780): 600 -> r0 (cursor 600, aligned 640); 500 -> r1
    (least load; cursor 500, aligned 512); 100 -> r1 (loads 600 / 500; 512 + 100 <= 780) at 512. Shard =
    round_up(max(600, 612), 64) = 640, bucket 1280, starts 0, 640, 640 + 512 = 1152.
    Chunk 2 (loads 600 / 600, cap 1.3·3050/2 = 1982.5): 3000 fits nowhere -> smallest cursor, r0; 50 ->
    r1 (load 600 < 3600). Shard round_up(3000, 64) = 3008, bucket 6016, starts 0 and 3008.
    """
    numel = np.array([600, 500, 100, 3000, 50])
    spans = lay.layer_wise_buckets(numel, numel.astype(float), 2, bucket_size=1000, strategy="lpt")
    assert [(s.first, s.stop, s.numel) for s in spans] == [(0, 3, 1280), (3, 5, 6016)]
    assert spans[0].owner.tolist() == [0, 1, 1] and spans[0].starts.tolist() == [0, 640, 1152]
    assert spans[1].owner.tolist() == [0, 1] and spans[1].starts.tolist() == [0, 3008]


def test_closure_absorbs_by_element_count_estimate_not_replay() -> None:
    """d = 2, bucket_size 1000, cost = numel; backprop order [600, 500, 150, 400].

    Chunk [600, 500]: C = 1100 >= max(1000, 1080). Estimate S = round_up(max(550, 600), 64) = 640,
    padding 1280 − 1100 = 180 >= 150: absorbed. (Replaying the assignment would put 600 on r0 and 500
    on r1 at aligned cursor 512, leaving only 640 − 512 = 128 < 150 elements: it would close here.)
    Chunk [600, 500, 150]: C = 1250, S = round_up(625, 64) = 640, padding 30 < 400: close.
    Chunk 1 (cap 812.5): 600 -> r0, 500 -> r1, 150 -> r1 at 512 (cursor 662); shard round_up(662, 64)
    = 704, bucket 1408, starts 0, 704, 704 + 512 = 1216. Chunk 2: 400 > cap 260 everywhere ->
    smallest cursor r0; shard round_up(400, 64) = 448, bucket 896.
    """
    numel = np.array([600, 500, 150, 400])
    spans = lay.layer_wise_buckets(numel, numel.astype(float), 2, bucket_size=1000, strategy="lpt")
    assert [(s.first, s.stop, s.numel) for s in spans] == [(0, 3, 1408), (3, 4, 896)]
    assert spans[0].owner.tolist() == [0, 1, 1] and spans[0].starts.tolist() == [0, 704, 1216]
    assert spans[1].owner.tolist() == [0]
    assert lay.chunk_bounds(numel.tolist(), 2, 1000) == [0, 3, 4]


def _scan_assign(numel, cost, d, loads, strategy):  # noqa: ANN001, ANN202 - reference: one item at a time
    sizes, costs, load = numel.tolist(), cost.tolist(), loads.tolist()
    cap = lay.LPT_CAP * float(numel.sum()) / d
    owner, start, cursors, padded = [0] * len(sizes), [0] * len(sizes), [0] * d, [0] * d
    if strategy == "lpt":
        order = np.argsort(-cost, kind="stable").tolist()
    elif strategy == "ping_pong":
        order = np.argsort(numel, kind="stable").tolist()
        dealt = lay.ping_pong_owner(len(sizes), d).tolist()
    else:
        order = list(range(len(sizes)))
    for k, i in enumerate(order):
        if strategy == "lpt":
            r, best = -1, float("inf")
            for q in range(d):
                if padded[q] + sizes[i] <= cap and load[q] < best:
                    r, best = q, load[q]
            if r < 0:
                r = min(range(d), key=cursors.__getitem__)
        else:
            r = dealt[k] if strategy == "ping_pong" else i % d
        owner[i], start[i] = r, padded[r]
        cursors[r] = padded[r] + sizes[i]
        padded[r] = -(-cursors[r] // 64) * 64
        load[r] += costs[i]
    return owner, start, cursors, load


@pytest.mark.parametrize("strategy", lay.STRATEGIES)
def test_chunk_assignment_equals_placing_one_item_at_a_time(strategy: str) -> None:
    """The vectorised assignment (LPT on a heap with runs of identical items placed in one step,
    dealt strategies by array) equals the item-by-item walk, loads included, bit for bit."""
    rng = np.random.default_rng(11)
    for trial in range(120):
        d = int(rng.choice([2, 3, 8, 32, 64]))
        kinds = int(rng.integers(1, 5))
        shapes = rng.integers(1, 3000, size=kinds) * 64 + rng.integers(0, 64, size=kinds) * (trial % 2)
        numel = np.concatenate([np.full(int(rng.choice([1, 3, 40, 200])), s) for s in shapes])
        cost = numel.astype(np.float64) ** (1.5 if trial % 3 else 1.0)
        if trial % 3 == 0:
            cost = np.floor(cost)
        loads = rng.integers(0, 3, size=d).astype(np.float64) * float(cost.max()) * (trial % 4 == 0)
        expected = _scan_assign(numel, cost, d, loads.copy(), strategy)
        got_loads = loads.copy()
        owner, start, cursors = lay._assign_chunk(numel, cost, d, got_loads, strategy)
        assert owner.tolist() == expected[0] and start.tolist() == expected[1]
        assert cursors.tolist() == expected[2] and got_loads.tolist() == expected[3]


def _closure_rule(numel: list[int], d: int, bucket_size: int) -> list[int]:
    """chunk_bounds' docstring as written: before adding an item of n elements to a non-empty chunk
    of C elements whose largest item has M, close when C >= max(bucket_size, floor(0.9·d·M)) and n
    is not absorbable (n <= d·S − C and n <= S, S = round_up(max(ceil(C/d), M), shard_pad_multiple(d)))."""
    bounds, chunk = [0], []
    for i, n in enumerate(numel):
        c, m = sum(chunk), max(chunk, default=0)
        if chunk and c >= max(bucket_size, math.floor(0.9 * d * m)):
            s = lay.round_up(max(-(-c // d), m), lay.shard_pad_multiple(d))
            if not (n <= d * s - c and n <= s):
                bounds.append(i)
                chunk = []
        chunk.append(n)
    return [*bounds, len(numel)]


def test_chunk_bounds_equal_the_closure_rule() -> None:
    """chunk_bounds (the threshold kept while the largest item is unchanged) = the rule recomputed
    from the chunk at every item, on 2,000 random buffers (zero-size items, repeated layers, d 1-128)."""
    rng = random.Random(7)
    for _ in range(2000):
        d = rng.choice([1, 2, 3, 4, 8, 64, 128])
        kinds = [rng.choice([0, 64, 100, 4096, 5000, 1_000_000, 29_360_128, 132_120_576]) for _ in range(4)]
        layer = [rng.choice(kinds) for _ in range(rng.randint(1, 6))]
        numel = layer * rng.randint(1, 12) + [rng.choice(kinds) for _ in range(rng.randint(0, 3))]
        bucket_size = rng.choice([0, 1, 100, 5000, 40_000_000, 64_000_000])
        assert lay.chunk_bounds(numel, d, bucket_size) == _closure_rule(numel, d, bucket_size)
