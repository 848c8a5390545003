"""A stage's bucket orders (costmodel.stage_buckets.bucket_views) against the plain definitions."""

from __future__ import annotations

import random

from costmodel.stage_buckets import BucketCost, backward_order, bucket_views


def _buckets(seed: int) -> tuple[BucketCost, ...]:
    # few distinct chunks and fractions: many ties, which must keep the list order
    rng = random.Random(seed)
    return tuple(BucketCost(rng.choice((0, 1, 2)), "dp", float(i), 2.0 * i, "nvlink", rng.choice((0.25, 0.5, 1.0)),
                            prescale_s=0.5 * i) for i in range(40))


def test_backward_order_is_chunks_last_to_first_then_readiness_ties_in_list_order() -> None:
    for seed in range(20):
        buckets = _buckets(seed)
        expected = tuple(sorted(buckets, key=lambda b: (-b.chunk, b.bwd_ready_fraction)))
        assert backward_order(buckets) == expected
        # by hand: chunk 2's buckets come first, each chunk's in rising readiness
        chunks = [b.chunk for b in expected]
        assert chunks == sorted(chunks, reverse=True)


def test_bucket_views_orders_and_sums() -> None:
    buckets = (BucketCost(0, "dp", 1.0, 4.0, "nvlink", 0.5, prescale_s=0.25),
               BucketCost(1, "dp", 2.0, 5.0, "nvlink", 1.0, prescale_s=0.5),
               BucketCost(0, "dp", 3.0, 6.0, "nvlink", 1.0, prescale_s=1.0))
    views = bucket_views(buckets)
    assert [b.reduce_s for b in views.backward] == [2.0, 1.0, 3.0]  # chunk 1, then chunk 0 by readiness
    assert [b.reduce_s for b in views.forward] == [3.0, 1.0, 2.0]  # chunk 0 (needed at 0.0, then 0.5), chunk 1
    assert views.prescale_by_chunk_s == {0: 1.25, 1: 0.5}
    assert (views.reduce_s, views.gather_s) == (6.0, 15.0)
    assert bucket_views(buckets) is views  # memoised per tuple
