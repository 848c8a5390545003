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
