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


MEGATRON_ITERATION = (" [2026-03-04 10:{i:02d}:00] iteration {i:>8d}/      30 | consumed samples: {s:>12d} | elapsed time "
                      "per iteration (ms): 2050.0 | learning rate: 1.5E-05 | global batch size:   128 | lm loss: 8.2E+00 | "
                      "number of skipped iterations:   0 | number of nan iterations:   0 |")


def megatron_log_text(arguments: str, iterations: int = 20) -> str:
    """A Megatron-LM training log: its printed ``arguments`` block, then ``iterations`` iteration lines of
    2,050 ms each at a global batch of 128 (the median step the loaders read: 2.05 s)."""
    return arguments + "\n".join(MEGATRON_ITERATION.format(i=i, s=128 * i) for i in range(1, iterations + 1)) + "\n"
