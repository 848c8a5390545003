"""Defects a new-user audit of the CLI found: each test runs the command as a user would and asserts the
exact behaviour (one-line errors with exit code 2, notes, readable tables, the job's own NICs)."""

from __future__ import annotations

import pytest


def one_line_error(result) -> str:  # noqa: ANN001
    """The single stderr line of a refused command (exit code 2, nothing on stdout)."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert result.stdout == ""
    return err


@pytest.mark.parametrize("version", ["9.9.9", "0.2.0", "0.5.0"])
def test_unknown_eo_version_is_refused_naming_the_known_releases(run_cli, version: str) -> None:
    """The model has rules for Emerging-Optimizers 0.3.0 (Megatron-Core's pin), 0.3.1 and 0.4.0 (SYRK on the
    TP path, cubic5); any other version was accepted silently and modelled as one of them."""
    err = one_line_error(run_cli("predict", "--eo-version", version))
    assert f"'{version}'" in err and "0.3.0, 0.3.1, 0.4.0" in err, err


@pytest.mark.parametrize("version", ["0.3.0", "0.3.1", "0.4.0"])
def test_known_eo_versions_are_accepted(run_cli, version: str) -> None:
    result = run_cli("predict", "--eo-version", version, "--json")
    assert result.exit_code == 0, result.output
