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
