"""Command-line usage errors (a mistyped flag or command, a missing argument, a flag value of the wrong
type) follow the house rule of every other input error: one line on stderr naming the flag and what
would be valid, exit code 2, nothing on stdout. Before, typer printed a usage line, a hint and a
boxed panel (5-6 lines, box-drawing characters) for these alone."""

from __future__ import annotations

import pytest

# (id, argv after "muonsim", words the one line must contain)
USAGE_CASES: list[tuple[str, list[str], list[str]]] = [
    ("typo_in_a_flag", ["predict", "--tpp", "2"], ["--tpp", "--tp", "muonsim predict --help"]),
    ("flag_without_value", ["predict", "--tp"], ["--tp", "requires an argument"]),
    ("unknown_command", ["predicts"], ["predicts", "predict", "muonsim --help"]),
    ("missing_argument", ["collective"], ["Missing argument 'OP'", "muonsim collective --help"]),
    ("missing_model", ["describe"], ["Missing argument 'MODEL'", "muonsim describe --help"]),
    ("typed_flag_not_a_number", ["plan", "--top-k", "abc"], ["--top-k", "'abc'", "integer"]),
    ("choice_flag_out_of_range", ["calibrate", "--dataset", "megatron-bridge", "--out", "x.yaml", "--folds", "-1"],
     ["--folds", "-1"]),
    ("reference_typo", ["reference", "runn"], ["runn", "muonsim reference --help"]),
]


@pytest.mark.parametrize(("argv", "words"), [c[1:] for c in USAGE_CASES], ids=[c[0] for c in USAGE_CASES])
def test_usage_errors_are_one_line(run_cli, tmp_path, monkeypatch, argv: list[str], words: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    result = run_cli(*argv)
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert "╭" not in err and "Traceback" not in err
    assert result.stdout == ""
    for word in words:
        assert word in err, (word, err)
    assert list(tmp_path.iterdir()) == []


def test_no_arguments_still_print_the_help(run_cli) -> None:
    result = run_cli()
    assert "Usage: muonsim" in result.stdout and "predict" in result.stdout
    assert result.stderr.strip() == ""


def test_help_and_version_still_exit_0(run_cli) -> None:
    assert run_cli("--help").exit_code == 0
    assert run_cli("predict", "--help").exit_code == 0
    version = run_cli("--version")
    assert version.exit_code == 0 and version.stdout.startswith("muonsim")


@pytest.mark.parametrize("argv", [["--help"], ["predict", "--help"], ["sweep", "--help"], ["calibrate", "--help"],
                                  ["reference", "run", "--help"]])
def test_help_shows_no_value_for_on_off_flags(run_cli, argv: list[str]) -> None:
    """typer 0.29 prints '<bool>' beside flags such as --json and --version, which take no value: a user
    following the help types '--json true' and gets "scenario file 'true' does not exist"."""
    result = run_cli(*argv)
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.stdout, result.stdout
    assert "--json" in result.stdout or "--version" in result.stdout
