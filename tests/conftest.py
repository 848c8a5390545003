"""Shared fixtures: the default scenario and a helper to run the CLI in-process."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def default_scenario():
    from workloads.scenario import DEFAULT_SCENARIO

    return DEFAULT_SCENARIO.resolve()


@pytest.fixture()
def run_cli():
    """Run ``muonsim ARGS`` in-process; returns the click Result (exit_code, stdout, stderr)."""
    from cli.app import app

    runner = CliRunner()

    def _run(*args: str):
        return runner.invoke(app, [str(a) for a in args])

    return _run


@pytest.fixture()
def one_line_error():
    """Check that a CLI Result (``run_cli``'s) is a refused command: exit code 2, nothing on stdout, one
    stderr line starting ``error: ``; the check returns that line."""

    def check(result) -> str:  # noqa: ANN001 - click Result
        assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
        err = result.stderr.strip()
        assert err.startswith("error: ") and "\n" not in err, err
        assert result.stdout == ""
        return err

    return check
