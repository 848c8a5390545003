"""The per-call statistics of the in-step / in-rank Newton-Schulz benchmarks (hand-computed samples)."""

from __future__ import annotations

import pytest

from benchmarks.bench_ns_in_rank import migrations
from benchmarks.bench_ns_in_rank import summary as rank_summary
from benchmarks.bench_ns_in_step import summary


def test_summary_median_of_quiet_calls_and_excess_per_preemption() -> None:
    """Quiet calls 1.0, 1.2, 1.1 s: median 1.1. Preempted: 1.5 s (once) and 2.0 s (twice), so
    3 preemptions over 5 calls (0.6 per call) and an excess of (0.4 + 0.9) / 3 s per preemption."""
    base, per_call, excess = summary([(1.0, 0), (1.2, 0), (1.1, 0), (1.5, 1), (2.0, 2)])
    assert base == pytest.approx(1.1)
    assert per_call == pytest.approx(0.6)
    assert excess == pytest.approx(1.3 / 3)


def test_summary_without_preemptions_has_no_excess() -> None:
    assert summary([(2.0, 0), (4.0, 0)]) == (3.0, 0.0, 0.0)


def test_rank_summary_reports_the_same_figures() -> None:
    """The 2-rank tool's line: the same median and excess (in us), plus migrations per call (1 of 4)."""
    line = rank_summary([(100e-6, 0, 0), (120e-6, 0, 1), (110e-6, 0, 0), (170e-6, 2, 0)])
    assert "110.0 us not preempted (3/4)" in line
    assert "0.50 preemptions/call at +30 us" in line  # (170 - 110) / 2
    assert "0.25 migrations/call" in line


def test_migrations_is_a_count() -> None:
    assert migrations() >= 0
