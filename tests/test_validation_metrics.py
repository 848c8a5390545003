"""Validation metrics: MAPE, median APE, bias, worst case, Kendall τ within (model, system) groups."""

from __future__ import annotations

import math

import numpy as np
import pytest

from costmodel.calibrate.validation import (
    RunResult,
    error_metrics,
    grouped_kendall_tau,
    kendall_tau_b,
    metrics_by,
)


def row(run_id: str, measured: float, predicted: float, model: str = "m", system: str = "s",
        gpus: int = 8, tokens: int = 1000) -> RunResult:
    return RunResult(run_id, model, system, "r", gpus, tokens, measured, predicted)


def test_error_metrics_by_hand():
    rows = [row("a", 10.0, 11.0), row("b", 10.0, 9.5), row("c", 4.0, 4.0), row("d", 2.0, 1.0)]
    m = error_metrics(rows)
    assert m.n == 4
    assert [r.error_pct for r in rows] == pytest.approx([10.0, -5.0, 0.0, -50.0])
    assert m.mape_pct == pytest.approx(16.25)
    assert m.median_ape_pct == pytest.approx(7.5)
    assert m.bias_pct == pytest.approx(-11.25)
    assert (m.max_ape_pct, m.worst_run_id) == (pytest.approx(50.0), "d")


def test_empty_metrics_are_nan_not_errors():
    m = error_metrics([])
    assert m.n == 0 and math.isnan(m.mape_pct) and m.kendall_tau is None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kendall_tau_b_matches_scipy_with_ties(seed):
    from scipy.stats import kendalltau

    rng = np.random.default_rng(seed)
    x = rng.integers(0, 6, 25).astype(float)
    y = x + rng.integers(-2, 3, 25)
    assert kendall_tau_b(list(x), list(y)) == pytest.approx(kendalltau(x, y).statistic)


def test_kendall_tau_edge_cases():
    assert kendall_tau_b([1.0], [2.0]) is None
    assert kendall_tau_b([1.0, 1.0], [2.0, 3.0]) is None
    assert kendall_tau_b([1.0, 2.0, 3.0], [3.0, 4.0, 5.0]) == 1.0
    assert kendall_tau_b([1.0, 2.0, 3.0], [5.0, 4.0, 3.0]) == -1.0


def test_grouped_tau_ranks_cost_per_token_within_model_and_system():
    # group m@s: predicted ordering of GPU-seconds per token is right; group n@s: fully reversed
    rows = [row("a", 1.0, 1.1, gpus=8), row("b", 1.0, 1.2, gpus=16), row("c", 1.0, 1.3, gpus=32),
            row("d", 1.0, 2.0, model="n"), row("e", 2.0, 1.0, model="n"),
            row("lonely", 5.0, 1.0, model="x")]  # a single-run group contributes no pair
    tau, pairs, per_group = grouped_kendall_tau(rows)
    assert per_group == {"m@s": 1.0, "n@s": -1.0}
    assert pairs == 4
    assert tau == pytest.approx((3 * 1.0 + 1 * -1.0) / 4)
    # step time alone would rank a < b < c the other way round; per token per GPU it is a < b < c
    assert error_metrics(rows).kendall_tau == pytest.approx(0.5)


def test_metrics_by_system():
    rows = [row("a", 1.0, 1.1, system="x"), row("b", 1.0, 0.8, system="y"), row("c", 1.0, 1.0, system="y")]
    by = metrics_by(rows, lambda r: r.system)
    assert by["x"].mape_pct == pytest.approx(10.0)
    assert by["y"].bias_pct == pytest.approx(-10.0)
