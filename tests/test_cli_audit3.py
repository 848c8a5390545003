"""Defects a third new-user audit of the CLI found (reference run, validate on a training log, plan --explain,
compare, --json keys): each test runs the command as a user would and asserts the exact behaviour."""

from __future__ import annotations

import pytest

# (argv after 'reference run', the line the error must hold)
REFERENCE_FIELD_ERRORS = [
    (["--steps", "0"], "--steps: must be greater than 0 (got 0)"),
    (["--timeout", "0"], "--timeout: must be greater than 0 (got 0.0)"),
    (["--ns-steps", "0"], "--ns-steps: must be greater than 0 (got 0)"),
    (["--world-size", "0"], "--world-size: must be greater than 0 (got 0)"),
    (["--world-size", "two"], "--world-size: must be a valid integer, unable to parse string as an integer"),
    (["--tp-mode", "x"], "--tp-mode: 'x' is not one of 'duplicated', 'distributed', 'blockwise'."),
]


@pytest.mark.parametrize(("argv", "expect"), REFERENCE_FIELD_ERRORS, ids=[a[0] for a, _ in REFERENCE_FIELD_ERRORS])
def test_reference_run_value_error_names_the_flag(one_line_error, run_cli, tmp_path, argv: list[str],
                                                  expect: str) -> None:
    """'reference run: timeout_s: Input should be greater than 0' named a field no flag is called (the flag is
    --timeout) in pydantic's words, and "Invalid value for '--world-size': Input should be ..." was click's; the
    other verbs say '--tp: must be ...'."""
    out = tmp_path / "run.json"
    err = one_line_error(run_cli("reference", "run", *argv, "--out", out))
    assert err == f"error: {expect}", err
    assert not out.exists()


# (--explain text, the line the error must hold)
EXPLAIN_ERRORS = [
    ("tp=2;pp=8", "error: --explain: tp=2;pp=8: '2;pp=8' is not an integer; separate settings with commas, "
                  "e.g. \"tp=2,pp=8\""),
    ("tp=2 pp=8", "error: --explain: tp=2 pp=8: '2 pp=8' is not an integer; separate settings with commas, "
                  "e.g. \"tp=2,pp=8\""),
    ("tp=two", "error: --explain: tp=two: 'two' is not an integer"),
    ("tp=2,pp=", "error: --explain: pp=: '' is not an integer"),
    ("optimizer=sgd", "error: --explain: optimizer=sgd: 'sgd' is not one of adamw, muon"),
    ("tp=2,pp=8,tp=4", "error: --explain: tp is given twice (tp=2, tp=4)"),
]


@pytest.mark.parametrize(("query", "expect"), EXPLAIN_ERRORS, ids=[q for q, _ in EXPLAIN_ERRORS])
def test_plan_explain_bad_setting_is_blamed_on_explain(one_line_error, run_cli, query: str, expect: str) -> None:
    """'--explain "tp=2;pp=8"' said '--tp: '2;pp=8' is not an integer', blaming a flag the user did not type;
    'tp=2,pp=8,tp=4' silently explained tp=4."""
    err = one_line_error(run_cli("plan", "--model", "llama3-8b", "--gpus", "8", "--explain", query))
    assert err == expect, err
