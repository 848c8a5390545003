"""Faults a newcomer met (issue 14): each is a one-line error or a clean output, never a crash.

Non-UTF-8 output streams, a header-only runs file, non-finite or non-positive measurements, NaN in
``--json``, calibrating more factors than runs, ``--step-factor nan``, and a precision the GPU's
tensor cores lack.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_CSV = ROOT / "workloads" / "data" / "measured" / "megatron_bridge_perf_summary.csv"


def _rows(n: int) -> str:
    """The shipped table's header and its first ``n`` rows."""
    return "\n".join(SHIPPED_CSV.read_text(encoding="utf-8").splitlines()[: n + 1]) + "\n"


def _muonsim(*argv: str, cwd: Path, encoding: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="80")
    if encoding is not None:
        env["PYTHONIOENCODING"] = encoding
    return subprocess.run([sys.executable, "-m", "cli.app", *argv], cwd=cwd, capture_output=True, env=env,
                          timeout=300, check=False)


def _one_line_error(result, *words: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in result.stderr, err
    for word in words:
        assert word in err, (word, err)
    return err


@pytest.mark.parametrize("encoding", ["cp1252", "ascii"])
def test_non_utf8_streams_do_not_crash(tmp_path: Path, encoding: str) -> None:
    """τ (Kendall), Δ (compare) and σ are spelled in ASCII on a stream that cannot encode them."""
    (tmp_path / "runs.csv").write_text(_rows(3), encoding="utf-8")
    for argv, word in ((["--help"], b"Kendall tau"), (["compare", "--optimizer", "adamw,muon", "--wide"], b"d vs baseline"),
                       (["compare", "--optimizer", "adamw,muon"], b"B vs A"), (["validate", "runs.csv"], b"Kendall tau")):
        proc = _muonsim(*argv, cwd=tmp_path, encoding=encoding)
        assert proc.returncode == 0, (argv, proc.stderr.decode(errors="replace")[-800:])
        assert b"Traceback" not in proc.stderr
        proc.stdout.decode(encoding)  # the bytes are valid in the stream's encoding
        assert word in proc.stdout, (argv, proc.stdout[-400:])


def test_header_only_runs_file_is_an_error(tmp_path: Path, run_cli) -> None:
    path = tmp_path / "empty.csv"
    path.write_text(_rows(0), encoding="utf-8")
    for verb in ("validate", "calibrate"):
        extra = ["--out", str(tmp_path / "p.yaml")] if verb == "calibrate" else []
        _one_line_error(run_cli(verb, str(path), *extra), "empty.csv", "no runs")
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize("bad, words", [("inf", ["finite"]), ("nan", ["finite"]), ("-1", ["greater than 0"]),
                                        ("0", ["greater than 0"])])
def test_non_finite_or_non_positive_step_time_is_rejected(tmp_path: Path, run_cli, bad: str, words: list[str]) -> None:
    header, row = _rows(1).splitlines()
    cols = header.split(",")
    cells = row.split(",")
    cells[cols.index("step_time_s")] = bad
    path = tmp_path / "runs.csv"
    path.write_text(f"{header}\n{','.join(cells)}\n", encoding="utf-8")
    _one_line_error(run_cli("validate", str(path), "--json"), "step_time_s", "row 2", *words)


def test_non_finite_step_time_in_json_runs_is_rejected(tmp_path: Path, run_cli) -> None:
    header, row = _rows(1).splitlines()
    run = dict(zip(header.split(","), row.split(","), strict=True))
    text = json.dumps([run | {"step_time_s": float("inf")}])  # Python writes Infinity
    (tmp_path / "runs.json").write_text(text, encoding="utf-8")
    _one_line_error(run_cli("validate", str(tmp_path / "runs.json")), "step_time_s", "finite")


def _strict(text: str):
    def no_constant(name: str):
        raise AssertionError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=no_constant)


def test_json_output_never_holds_nan(tmp_path: Path, run_cli) -> None:
    """One run: MAPE over folds, Kendall τ and σ are undefined; they are null, not NaN."""
    from cli.common import finite_json

    assert finite_json({"a": [1.0, float("nan"), float("inf")], "b": -float("inf")}) == {"a": [1.0, None, None], "b": None}
    (tmp_path / "runs.csv").write_text(_rows(1), encoding="utf-8")
    result = run_cli("validate", str(tmp_path / "runs.csv"), "--json")
    assert result.exit_code == 0, result.output
    assert _strict(result.stdout)["kendall_tau"] is None


def test_calibrate_fits_no_more_factors_than_one_run_identifies(tmp_path: Path, run_cli) -> None:
    """One run informs the default factors only together: the fit keeps the best-informed one
    (FitSettings.max_shrinkage), lists the rest as not identifiable, and so has no underdetermined fit to
    warn about (only, if it ends there, its factor on a bound); a profile with more factors than runs
    still gets the warning."""
    from cli.cmd_validate import underdetermined_warnings
    from costmodel.calibrate.profile import CalibrationProfile, SystemCalibration

    (tmp_path / "runs.csv").write_text(_rows(1), encoding="utf-8")
    result = run_cli("calibrate", str(tmp_path / "runs.csv"), "--out", str(tmp_path / "p.yaml"), "--no-cv", "--json")
    assert result.exit_code == 0, result.output
    data = _strict(result.stdout)
    fitted = data["profile"]["systems"]["gb300-nvl72"]["factors"]
    assert len(fitted) <= 1 and not any("factors fitted from" in w for w in data["warnings"])
    # the one run asks for more than the GEMM peak: the fit ends on the bound and says so
    assert data["warnings"] == [w for w in data["warnings"] if "upper bound" in w] and len(data["warnings"]) <= 1
    assert len(data["profile"]["fit_settings"]["not_identifiable"]["gb300-nvl72"]) >= 6
    profile = CalibrationProfile(name="p", systems={"gb300-nvl72": SystemCalibration(
        factors={"gemm_fp8": 0.5, "attention": 0.5}, n_runs=1)})
    (warning,) = underdetermined_warnings(profile)
    assert "from 1 run" in warning and "gb300-nvl72" in warning


@pytest.mark.parametrize("factor", ["nan", "inf", "1", "-2"])
def test_collective_step_factor_must_be_a_number_above_one(run_cli, factor: str) -> None:
    _one_line_error(run_cli("collective", "all_reduce", "--step-factor", factor), "--step-factor")


def test_collective_sweep_reaches_max_size_and_states_units(run_cli) -> None:
    """``--max-size 8GB`` ends at 8 GB (it stopped at 4.096 GB); GiB is binary; the convention is printed."""
    data = json.loads(run_cli("collective", "all_reduce", "--max-size", "8GB", "--json").stdout)
    assert data["results"][-1]["size_bytes"] == 8e9 and "GiB = 2^30" in data["size_convention"]
    data = json.loads(run_cli("collective", "all_reduce", "--min-size", "1KiB", "--max-size", "8GiB", "--json").stdout)
    sizes = [r["size_bytes"] for r in data["results"]]
    assert sizes[0] == 1024 and sizes[-1] == 8 * 2**30 and len(sizes) == 24
    assert "GiB = 2^30" in run_cli("collective", "all_reduce", "--size", "1GiB").stdout


@pytest.mark.parametrize("precision", ["mxfp8", "nvfp4"])
def test_precision_without_tensor_core_support_is_an_error(run_cli, precision: str) -> None:
    """MXFP8 and NVFP4 need Blackwell's block-scaled tensor cores: on DGX H100 they are an error,
    never a prediction faster than FP8 with per-tensor scaling."""
    for verb in ("predict", "plan"):
        _one_line_error(run_cli(verb, "--system", "dgx-h100", "--precision", precision),
                        f"precision {precision}", "H100", "valid: bf16", "fp8-cs")


def test_version(run_cli) -> None:
    result = run_cli("--version")
    assert result.exit_code == 0 and result.stdout.startswith("muonsim ")
