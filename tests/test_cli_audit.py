"""Defects a new-user audit of the CLI found: each test runs the command as a user would and asserts the
exact behaviour (one-line errors with exit code 2, notes, readable tables, the job's own NICs)."""

from __future__ import annotations

import json

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


@pytest.mark.parametrize("argv", [["--gpus", "1"], ["--gpus", "8", "--group", "tp"]])
def test_collective_over_one_rank_says_it_costs_nothing(run_cli, argv: list[str]) -> None:
    """A collective over a group of one rank moves no data: the zeros were printed without a word. It is
    not an error (--group tp with tp 1 is a real group of a real job), so the zeros stay and one note says why."""
    result = run_cli("collective", "all_reduce", "--size", "1GB", *argv)
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stdout.splitlines() if line.startswith("# note:")]
    assert notes == ["# note: the group has 1 rank: a collective over one rank moves no data and takes 0 s"], result.stdout
    row = result.stdout.splitlines()[-1].split()
    assert row[:4] == ["1000000000", "0.00", "0.00", "0.00"], row
    data = json.loads(run_cli("collective", "all_reduce", "--size", "1GB", *argv, "--json").stdout)
    assert data["group_size"] == 1 and data["note"].startswith("the group has 1 rank")
    assert "note" not in json.loads(run_cli("collective", "all_reduce", "--size", "1GB", "--gpus", "2", "--json").stdout)


MUON_ONLY_FLAGS = [("--tp-mode", "distributed", "tp_mode"), ("--ns-steps", "3", "ns_steps"),
                   ("--ns-coefficients", "polar_express", "ns_coefficients"), ("--syrk", "on", "use_syrk"),
                   ("--split-qkv", "off", "split_qkv"), ("--load-balance", "ping_pong", "load_balance"),
                   ("--layout", "legacy", "layer_wise_layout"), ("--matmul-precision", "fp32", "matmul_precision"),
                   ("--eo-version", "0.4.0", "eo_version")]


@pytest.mark.parametrize(("flag", "value", "key"), MUON_ONLY_FLAGS, ids=[f[0] for f in MUON_ONLY_FLAGS])
def test_muon_only_setting_with_adamw_gets_a_no_effect_note(run_cli, flag: str, value: str, key: str) -> None:
    """AdamW runs no Newton-Schulz and no layer-wise optimizer: a Muon-only setting given with --optimizer
    adamw changed nothing and said nothing. The CLI's 'X has no effect' note now names it."""
    out = " ".join(run_cli("predict", "--optimizer", "adamw", flag, value).stdout.split())
    assert f"note: {key} has no effect with optimizer adamw" in out, out
    assert out.count("has no effect") == 1, out


def test_muon_only_settings_with_muon_stay_quiet(run_cli) -> None:
    out = run_cli("predict", "--optimizer", "muon", "--tp", "2", "--ns-steps", "3", "--layout", "legacy").stdout
    assert "has no effect" not in out
    plain = run_cli("predict", "--optimizer", "adamw").stdout
    assert "has no effect" not in plain


def test_layer_wise_setting_with_replicated_muon_gets_a_no_effect_note(run_cli) -> None:
    """Muon replicated steps every parameter on every rank: the layer-wise layout and balance are unread."""
    out = " ".join(run_cli("predict", "--distribution", "replicated", "--layout", "legacy").stdout.split())
    assert "note: layer_wise_layout has no effect with the replicated distribution" in out, out


@pytest.mark.parametrize("width", [80, 120])
def test_catalog_tables_are_readable_at_80_and_120_columns(run_cli, monkeypatch, width: int) -> None:
    """At 80 columns the Systems table cut the GPU names to 'B300 / (GB3… / supe…'. Now no cell is cut (no
    ellipsis), no line is wider than the terminal, every GPU name reads whole (words may wrap) and each
    system's numbers sit on its name's line."""
    from topologies.hardware import load_system, system_names

    monkeypatch.setenv("COLUMNS", str(width))
    result = run_cli("catalog")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "…" not in result.stdout, result.stdout
    assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
    cells = " ".join(result.stdout.replace("│", " ").split())
    for name in system_names():
        s = load_system(name)
        row = next(line for line in lines if f"│ {name} " in line)
        assert f" {s.nvlink.domain_size} " in row and f" {s.gpu.hbm_bytes / 1e9:.0f} " in row, row
        assert all(word in cells for word in s.gpu.name.split()), s.gpu.name
    if width >= 120:
        assert all(any(f"│ {s.gpu.name} " in line for line in lines) for s in map(load_system, system_names()))
