"""The LPT placement's three paths (plain lists for small chunks, the heap walk, batched runs) place
every item on the same shard at the same start, with the same loads, to the bit."""

from __future__ import annotations

import random

import numpy as np
import pytest

from costmodel.optimizer import layouts as lay
from costmodel.optimizer import lpt


def _heap_walk(sizes: list[int], costs: list[float], loads: list[float], cap: float | None):
    """Item by item through :meth:`lpt._Shards.place_one` (descending cost, stable)."""
    state = lpt._Shards(np.array(loads, dtype=np.float64), cap)
    owner, start = [0] * len(sizes), [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -costs[i]):
        owner[i], start[i] = state.place_one(sizes[i], costs[i])
    return owner, start, state.cursor, state.load


@pytest.mark.parametrize("seed", range(4))
def test_list_walk_equals_heap_walk(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        n, d = rng.randint(0, 40), rng.choice([1, 2, 3, 8, 32, 256])
        kinds = [(rng.choice([64, 100, 4096, 5000, 14_680_064]), rng.choice([1.0, 2.5, 7.0, 64.0, 3e9]))
                 for _ in range(4)]
        items = [rng.choice(kinds) for _ in range(n)]
        sizes, costs = [s for s, _ in items], [c for _, c in items]
        loads = [rng.choice([0.0, 1.5, 7.0, 3e9]) for _ in range(d)]
        cap = rng.choice([None, 1.3 * sum(sizes) / d, 100.0, 5e6])  # 100: items fit nowhere (the shortcut)
        mine = list(loads)
        assert lpt.lpt_place_small(sizes, costs, mine, cap) + (mine,) == _heap_walk(sizes, costs, loads, cap)


def test_fits_nowhere_goes_to_the_shortest_shard() -> None:
    """Hand case: cap 100, items of 200 fit on no shard: each goes to the lowest cursor (ties: the
    lowest shard): shard 0, shard 1, then shard 0 again at its 64-aligned fill 256 (cursor 456)."""
    owner, start, cursor, load = _heap_walk([200, 200, 200], [3.0, 2.0, 1.0], [0.0, 0.0], 100.0)
    assert owner == [0, 1, 0] and start == [0, 0, 256] and cursor == [456, 200] and load == [4.0, 2.0]


def test_lpt_place_small_path_equals_batched_runs() -> None:
    """A chunk small enough for the list walk gives what the batched path gives (integer costs)."""
    rng = np.random.default_rng(0)
    sizes = rng.choice([4096, 14_680_064], size=60)
    costs = np.where(sizes > 5000, 9.0, 2.0)
    loads_a, loads_b = np.zeros(16), np.zeros(16)
    small = lpt.lpt_place(sizes, costs, loads_a, 1.3 * sizes.sum() / 16)
    saved = lpt.BATCH_WORK, lpt.BATCH_RUN, lpt.BATCH_SHARDS
    try:
        lpt.BATCH_WORK, lpt.BATCH_RUN, lpt.BATCH_SHARDS = 1, 1, 10**9  # every run batched, no list walk
        batched = lpt.lpt_place(sizes, costs, loads_b, 1.3 * sizes.sum() / 16)
    finally:
        lpt.BATCH_WORK, lpt.BATCH_RUN, lpt.BATCH_SHARDS = saved
    assert all(np.array_equal(a, b) for a, b in zip(small, batched, strict=True))
    assert np.array_equal(loads_a, loads_b)


@pytest.mark.parametrize("seed", range(3))
def test_one_item_per_shard_shortcut_equals_heap_walk(seed: int) -> None:
    """At most d items on equally loaded shards (the dense buffer of a stage on a large dp group):
    the shortcut that puts item k of the cost order on shard k (lpt._one_per_shard) places, stacks
    and loads exactly as the heap walk, with or without a cap they exceed."""
    rng = random.Random(100 + seed)
    for _ in range(300):
        d = rng.choice([1, 2, 5, 32, 64, 128])
        n = rng.randint(1, d)
        sizes = [rng.choice([64, 100, 4096, 14_680_064]) for _ in range(n)]
        costs = [rng.choice([1.0, 2.5, 7.0, 3e9, 3e9]) for _ in range(n)]
        level = rng.choice([0.0, 7.0, 3e9])
        cap = rng.choice([None, 1.3 * sum(sizes) / d, 100.0])
        assert lpt._one_per_shard(sizes, costs, [level] * d) is not None
        expected = _heap_walk(sizes, costs, [level] * d, cap)
        mine = [level] * d
        assert lpt.lpt_place_small(sizes, costs, mine, cap) + (mine,) == expected
        loads = np.full(d, level)
        owner, start, cursor = lpt.lpt_place(np.array(sizes), np.array(costs), loads, cap)
        assert (owner.tolist(), start.tolist(), cursor.tolist(), loads.tolist()) == expected
    # hand case: three items on four shards, costs 1, 3, 2: shards 2, 0, 1 by descending cost
    assert lpt._one_per_shard([10, 20, 30], [1.0, 3.0, 2.0], [0.0] * 4) == [2, 0, 1]
    assert lpt._one_per_shard([10, 20], [1.0, 3.0], [0.0, 1.0]) is None  # unequal loads: the walk


@pytest.mark.parametrize("seed", range(4))
def test_batched_runs_equal_heap_walk(seed: int) -> None:
    """Every run of identical items placed in one step (:meth:`lpt._Shards.place_run`, forced with
    BATCH_RUN = 1, no shard limit, no list walk) gives the heap walk's shards, starts, cursors and
    loads (integer costs and loads, with and without a cap, including caps some or every item exceeds)."""
    rng = random.Random(200 + seed)
    saved = lpt.BATCH_RUN, lpt.BATCH_SHARDS, lpt.BATCH_WORK
    try:
        lpt.BATCH_RUN, lpt.BATCH_SHARDS, lpt.BATCH_WORK = 1, 10**9, 0
        for _ in range(200):
            d = rng.choice([1, 2, 3, 4, 8, 16, 64])
            kinds = [(rng.choice([0, 64, 100, 4096, 5000, 14_680_064]), float(rng.choice([1, 2, 7, 64, 3_000_000_000])))
                     for _ in range(3)]
            items = [rng.choice(kinds) for _ in range(rng.randint(1, 120))]
            sizes, costs = [s for s, _ in items], [c for _, c in items]
            loads = [float(rng.choice([0, 1, 7, 64, 3_000_000_000])) for _ in range(d)]
            cap = rng.choice([None, 1.3 * sum(sizes) / d, 100.0, 5e6, 3e7])
            expected = _heap_walk(sizes, costs, loads, cap)
            mine = np.array(loads)
            owner, start, cursor = lpt.lpt_place(np.array(sizes, dtype=np.int64), np.array(costs), mine, cap)
            assert (owner.tolist(), start.tolist(), cursor.tolist(), mine.tolist()) == expected
    finally:
        lpt.BATCH_RUN, lpt.BATCH_SHARDS, lpt.BATCH_WORK = saved


@pytest.mark.parametrize("seed", range(3))
def test_one_per_shard_head_then_walk_equals_heap_walk(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """More items than shards on equally loaded shards: the first d items of the cost order go one
    per shard (_Shards.seed_one_per_shard) and the rest are walked from there (the heap path, the
    list walk off); the result is the heap walk's, item by item from the start (shards, starts,
    cursors, loads)."""
    monkeypatch.setattr(lpt, "BATCH_WORK", 0)
    rng = random.Random(300 + seed)
    for _ in range(200):
        d = rng.choice([2, 3, 8, 16, 64])
        kinds = [(rng.choice([64, 100, 4096, 14_680_064]), float(rng.choice([1, 2.5, 7, 64, 3_000_000_000])))
                 for _ in range(rng.randint(1, 8))]
        items = [rng.choice(kinds) for _ in range(rng.randint(d + 1, 4 * d + 20))]
        sizes, costs = [s for s, _ in items], [c for _, c in items]
        level = float(rng.choice([0, 7, 3_000_000_000]))
        cap = rng.choice([None, 1.3 * sum(sizes) / d, 5e6])
        expected = _heap_walk(sizes, costs, [level] * d, cap)
        mine = np.full(d, level)
        owner, start, cursor = lpt.lpt_place(np.array(sizes, dtype=np.int64), np.array(costs), mine, cap)
        assert (owner.tolist(), start.tolist(), cursor.tolist(), mine.tolist()) == expected


def test_relative_loads_hand_case() -> None:
    """Loads 10, 13, 30, 13 for a chunk whose costs sum to 3: from the least loaded, gaps 3 (kept),
    0 (the tie kept) and 17 (beyond 3: made 4)."""
    assert lay.relative_loads([10.0, 13.0, 30.0, 13.0], 3.0) == (0.0, 3.0, 7.0, 3.0)
    assert lay.relative_loads([5.0, 5.0], 0.0) == (0.0, 0.0)
    assert lay.relative_loads([9.0, 5.0], 0.0) == (1.0, 0.0)


@pytest.mark.parametrize("seed", range(3))
def test_small_chunk_memo_on_relative_loads_equals_the_walk(seed: int) -> None:
    """A chunk placed on loads B whose relative loads equal those of loads A placed before (the
    memo hits: the gaps beyond the chunk's cost sum differ, and the least load) gets what the list
    walk gives on B: the same shards and starts, and B's own loads plus the chunk's costs."""
    rng = random.Random(400 + seed)
    hits = 0
    for _ in range(400):
        d, n = rng.choice([2, 3, 4, 8]), rng.randint(1, 8)
        kinds = [(rng.choice([64, 100, 4096, 14_680_064]), float(rng.choice([0, 1, 2, 7, 64, 3_000_000])))
                 for _ in range(3)]
        items = [rng.choice(kinds) for _ in range(n)]
        sizes, costs = [s for s, _ in items], [c for _, c in items]
        spread = int(sum(costs))
        gaps = [rng.choice([0, 1, max(spread - 1, 0), spread, spread + 1, 3 * spread + 5]) for _ in range(d - 1)]
        wider = [g if g <= spread else rng.choice([spread + 1, 2 * spread + 3, 10**9 + spread]) for g in gaps]
        order = rng.sample(range(d), d)
        loads_a, loads_b = [0.0] * d, [0.0] * d
        at_a, at_b = float(rng.choice([0, 7, 10**12])), float(rng.choice([0, 5, 10**11]))
        for k, r in enumerate(order):
            at_a += gaps[k - 1] if k else 0
            at_b += wider[k - 1] if k else 0
            loads_a[r], loads_b[r] = at_a, at_b
        lay._SMALL_CHUNK_MEMO.clear()
        lay._small_lpt_span(0, n, sizes, costs, d, list(loads_a))
        mine = list(loads_b)
        span = lay._small_lpt_span(0, n, sizes, costs, d, mine)
        hits += len(lay._SMALL_CHUNK_MEMO) == 1
        walked = list(loads_b)
        owner, start, cursor = lpt.lpt_place_small(sizes, costs, walked, 1.3 * sum(sizes) / d)
        shard = lay.round_up(max(max(cursor), 1), lay.shard_pad_multiple(d))
        assert span.owner is not None and span.owner.tolist() == owner
        assert span.starts.tolist() == [o * shard + a for o, a in zip(owner, start, strict=True)]
        assert (span.numel, span.used) == (shard * d, sum(sizes))
        assert mine == walked
    lay._SMALL_CHUNK_MEMO.clear()
    assert hits == 400  # every second chunk was a memo hit


def _definition(sizes: list[int], costs: list[float], loads: list[float], cap: float | None):
    """The LPT rule written plainly: descending cost (stable), each item onto the least-loaded shard
    (ties: the lowest) among those whose 64-aligned fill plus its size is at most ``cap``; when none
    is, onto the lowest cursor (ties: the lowest shard)."""
    d = len(loads)
    load, fill, cursor = list(loads), [0] * d, [0] * d
    owner, start = [0] * len(sizes), [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -costs[i]):
        fits = [r for r in range(d) if cap is None or fill[r] + sizes[i] <= cap]
        r = min(fits, key=lambda r: (load[r], r)) if fits else min(range(d), key=lambda r: (cursor[r], r))
        owner[i], start[i] = r, fill[r]
        cursor[r] = fill[r] + sizes[i]
        fill[r] = -(-cursor[r] // 64) * 64
        load[r] += costs[i]
    return owner, start, cursor, load


@pytest.mark.parametrize("seed", range(4))
def test_walks_equal_the_rule(seed: int) -> None:
    """The list walk and the heap walk (whose first test is whether the least-loaded shard fits)
    place as the rule says, on caps that bind the least-loaded shard only, every shard, or none:
    a large item first makes its shard the most filled while another shard is the least loaded."""
    rng = random.Random(500 + seed)
    for _ in range(300):
        d = rng.choice([2, 3, 4, 8, 32])
        kinds = [(rng.choice([64, 100, 4096, 5000, 29_360_128]), rng.choice([1.0, 2.0, 7.0, 64.0, 3e9]))
                 for _ in range(4)]
        items = [rng.choice(kinds) for _ in range(rng.randint(1, 60))]
        sizes, costs = [s for s, _ in items], [c for _, c in items]
        loads = [rng.choice([0.0, 1.0, 7.0, 3e9]) for _ in range(d)]
        cap = rng.choice([None, 1.3 * sum(sizes) / d, 0.5 * max(sizes), 5000.0, 1e7])
        expected = _definition(sizes, costs, loads, cap)
        mine = list(loads)
        assert lpt.lpt_place_small(sizes, costs, mine, cap) + (mine,) == expected
        assert _heap_walk(sizes, costs, loads, cap) == expected
    # hand case, cap 100 on 2 shards: the 90-element item (cost 5) goes on shard 0 (fill 128); the
    # next (20, cost 4) on shard 1, the least loaded; the third (20, cost 3) again on shard 1 (load 4
    # < 5, and its fill 64 + 20 fits) at 64
    assert _definition([90, 20, 20], [5.0, 4.0, 3.0], [0.0, 0.0], 100.0)[:2] == ([0, 1, 1], [0, 0, 64])
    assert lpt.lpt_place_small([90, 20, 20], [5.0, 4.0, 3.0], [0.0, 0.0], 100.0)[:2] == ([0, 1, 1], [0, 0, 64])
    # loads 0 and 1: the first item (90, cost 0.5) fills shard 0 to 128; the next (20) finds shard 0
    # least loaded (0.5 < 1) but not fitting under 100: shard 1
    assert _definition([90, 20], [0.5, 0.25], [0.0, 1.0], 100.0)[:2] == ([0, 1], [0, 0])
    assert lpt.lpt_place_small([90, 20], [0.5, 0.25], [0.0, 1.0], 100.0)[:2] == ([0, 1], [0, 0])


@pytest.mark.parametrize("seed", range(3))
def test_runs_dealt_round_robin_equal_the_rule(seed: int) -> None:
    """Long runs of identical items on equally loaded shards (a buffer of expert copies), which the
    list walk deals round robin in one step (lpt._deal_run) when every round raises the load and no
    item passes the cap: the same shards, starts, cursors and loads as the rule, also when a round
    does not raise the load (a level of 2^54 and costs of 1: absorbed), when the cap binds inside
    the run, and when the run is not a multiple of d."""
    rng = random.Random(600 + seed)
    dealt = 0
    for _ in range(300):
        d = rng.choice([1, 2, 3, 4, 8])
        runs = [(rng.choice([64, 100, 4096, 29_360_128]), rng.choice([1.0, 3.0, 7.0, 2.5, 3e9]), rng.randint(1, 40))
                for _ in range(rng.randint(1, 3))]
        sizes = [s for s, _, k in runs for _ in range(k)]
        costs = [c for _, c, k in runs for _ in range(k)]
        level = rng.choice([0.0, 5.0, 2.0 ** 54])
        cap = rng.choice([None, 1.3 * sum(sizes) / d, 3.0 * max(sizes), 5000.0])
        expected = _definition(sizes, costs, [level] * d, cap)
        mine = [level] * d
        assert lpt.lpt_place_small(sizes, costs, mine, cap) + (mine,) == expected
        # the one-step deal, where it applies, is what the rule does (the walk above may have used it)
        owner, start, load, padded, cursor = [0] * len(sizes), [0] * len(sizes), [level] * d, [0] * d, [0] * d
        k = runs[0][2]
        if lpt._deal_run(list(range(k)), sizes[0], costs[0], load, padded, cursor, cap, owner, start):
            dealt += 1
            first = _definition(sizes[:k], costs[:k], [level] * d, cap)
            assert (owner[:k], start[:k], cursor, load) == first
    assert dealt > 100
    # hand case: 5 items of 100 elements (cost 2) on 2 shards at level 0: shards 0 1 0 1 0 at fills
    # 0 0 128 128 256; shard 0 ends at 256 + 100 with load 6, shard 1 at 228 with load 4
    owner, start, load, padded, cursor = [0] * 5, [0] * 5, [0.0, 0.0], [0, 0], [0, 0]
    assert lpt._deal_run(list(range(5)), 100, 2.0, load, padded, cursor, None, owner, start)
    assert (owner, start, cursor, load, padded) == ([0, 1, 0, 1, 0], [0, 0, 128, 128, 256], [356, 228], [6.0, 4.0], [384, 256])
    # absorbed: 2^54 + 1 == 2^54, the walk keeps picking shard 0; unequal loads: not dealt
    assert not lpt._deal_run([0, 1], 100, 1.0, [2.0 ** 54] * 2, [0, 0], [0, 0], None, [0, 0], [0, 0])
    assert not lpt._deal_run([0, 1], 100, 1.0, [0.0, 1.0], [0, 0], [0, 0], None, [0, 0], [0, 0])
