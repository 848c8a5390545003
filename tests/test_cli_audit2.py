"""Defects a second new-user audit of the CLI found: each test runs the command as a user would and asserts
the exact behaviour (one-line errors with exit code 2 that say what would be valid, warnings that say what
to change)."""

from __future__ import annotations

import pytest


def one_line_error(result) -> str:  # noqa: ANN001
    """The single stderr line of a refused command (exit code 2, nothing on stdout)."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert result.stdout == ""
    return err


# (scenario file text, the unknown key's path, the suggestion)
MISSPELT_KEYS = [
    ("model: llama3-8b\ngpus: 8\nparalelism: {tp: 2}\n", "paralelism", "parallelism"),
    ("model: llama3-8b\ngpus: 8\nparallelism: {tp: 2, mbs: 2}\n", "parallelism.mbs", "micro_batch_size"),
    ("model: llama3-8b\ngpus: 8\noptimizer: {kind: muon, tpmode: distributed}\n", "optimizer.tpmode", "tp_mode"),
    ("model: llama3-8b\ngpu: 8\n", "gpu", "gpus"),
]


@pytest.mark.parametrize(("text", "path", "suggestion"), MISSPELT_KEYS, ids=[k[1] for k in MISSPELT_KEYS])
def test_misspelt_scenario_key_names_the_key_it_resembles(run_cli, tmp_path, text: str, path: str,
                                                          suggestion: str) -> None:
    """'paralelism: Extra inputs are not permitted' named neither the key meant nor the valid ones (a flag name
    such as mbs in a scenario file got the same words). The error now says which key it resembles."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(text, encoding="utf-8")
    err = one_line_error(run_cli("predict", str(scenario)))
    assert f"{path}: unknown key; did you mean '{suggestion}'?" in err, err
    assert "Extra inputs" not in err, err


def test_unknown_scenario_key_with_no_close_match_lists_the_valid_keys(run_cli, tmp_path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text("model: llama3-8b\nplacement: {zzz: 1}\n", encoding="utf-8")
    err = one_line_error(run_cli("predict", str(scenario)))
    assert "placement.zzz: unknown key (valid: gpus_per_domain, " in err, err


def test_misspelt_grid_setting_names_the_setting_it_resembles(run_cli, tmp_path) -> None:
    """'grid.gpu: unknown setting' listed only the families of valid names."""
    grid = tmp_path / "grid.yaml"
    grid.write_text("grid:\n  model: [llama3-8b]\n  gpu: [8, 16]\n", encoding="utf-8")
    err = one_line_error(run_cli("sweep", str(grid), "--out", str(tmp_path / "out")))
    assert "grid.gpu: unknown setting; did you mean 'gpus'?" in err, err
    assert not (tmp_path / "out").exists()
