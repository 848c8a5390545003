"""``muonsim validate`` / ``muonsim calibrate`` end to end through the CLI (in-process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from costmodel.calibrate.profile import load_profile
from workloads.datasets import load_dataset
from workloads.loaders import write_csv


@pytest.fixture(scope="module")
def b300_csv(tmp_path_factory) -> Path:
    """The ten DGX B300 runs of the shipped dataset, plus an FSDP run and an invalid one."""
    runs = [r for r in load_dataset("megatron-bridge") if r.system == "dgx-b300"]
    fsdp = runs[0].model_copy(update={"run_id": "with-fsdp", "fsdp": 8})
    bad_tp = runs[0].model_copy(update={"run_id": "tp-too-big", "tp": 256})
    path = tmp_path_factory.mktemp("runs") / "b300.csv"
    write_csv([*runs, fsdp, bad_tp], path)
    return path


def set_column(lines: list[str], row: int, column: str, value: str) -> str:
    cells = lines[row].split(",")
    cells[lines[0].split(",").index(column)] = value
    return ",".join(cells)


def assert_one_line_error(result, *fragments: str) -> None:  # noqa: ANN001
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0]


def test_validate_json_lists_rows_metrics_and_unsupported(run_cli, b300_csv):
    result = run_cli("validate", b300_csv, "--datasheet", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    for key in ("n", "mape_pct", "median_ape_pct", "bias_pct", "max_ape_pct", "kendall_tau", "rows", "unsupported"):
        assert key in data
    assert data["n"] == 10 == len(data["rows"])
    row = data["rows"][0]
    assert set(row) >= {"run_id", "measured_step_time_s", "predicted_step_time_s", "error_pct"}
    assert row["error_pct"] == pytest.approx(
        100 * (row["predicted_step_time_s"] - row["measured_step_time_s"]) / row["measured_step_time_s"])
    reasons = {u["run_id"]: u["reason"] for u in data["unsupported"]}
    assert set(reasons) == {"with-fsdp", "tp-too-big"}
    assert "fsdp" in reasons["with-fsdp"].lower()
    assert reasons["tp-too-big"].startswith("invalid scenario:")
    assert data["mape_pct"] == pytest.approx(sum(abs(r["error_pct"]) for r in data["rows"]) / 10)
    # each row carries the recipe settings its prediction used (the B300 runs' own, joined from the file)
    by_id = {r["run_id"]: r for r in data["rows"]}
    deepseek = next(r for rid, r in by_id.items() if "26.06-deepseek-v3-dgx-b300" in rid)
    assert deepseek["settings"]["moe_flex_dispatcher_backend"] == "hybridep"
    assert deepseek["settings"]["pipeline_model_parallel_layout"].startswith("Et")  # reconstructed, 8 stages
    assert "Megatron-Bridge@" in deepseek["settings_source"]["source_ref"]


def test_validate_calibration_none_means_datasheet_like_predict(run_cli, b300_csv):
    none = run_cli("validate", b300_csv, "--calibration", "none", "--json")
    assert none.exit_code == 0, none.output
    datasheet = run_cli("validate", b300_csv, "--datasheet", "--json")
    assert json.loads(none.stdout)["mape_pct"] == json.loads(datasheet.stdout)["mape_pct"]


def test_validate_table_and_html(run_cli, b300_csv, tmp_path):
    page = tmp_path / "v.html"
    result = run_cli("validate", b300_csv, "--datasheet", "--html", page)
    assert result.exit_code == 0, result.output
    assert "with-fsdp" in result.stdout and "unsupported" in result.stdout
    assert "overall" in result.stdout
    html = page.read_text(encoding="utf-8")
    assert "plotly" in html.lower() and "predicted" in html


@pytest.mark.parametrize(("edit", "fragments"), [
    (lambda lines: lines[:2] + [lines[2] + ",extra"] + lines[3:], ("row 3", "malformed row")),
    (lambda lines: [lines[0], set_column(lines, 1, "model", "no-such-model")], ("row 2", "column 'model'", "unknown model")),
    (lambda lines: [lines[0].replace("step_time_s", "step_time"), *lines[1:]],
     ("column 'step_time'", "did you mean 'step_time_s'?")),
    (lambda lines: [lines[0].replace("step_time_s", "elapsed"), *lines[1:]], ("column 'step_time_s'", "missing column")),
])
def test_validate_bad_file_fails_with_one_line(run_cli, b300_csv, tmp_path, edit, fragments):
    lines = b300_csv.read_text(encoding="utf-8").splitlines()
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(edit(lines)) + "\n", encoding="utf-8")
    assert_one_line_error(run_cli("validate", bad, "--datasheet"), f"file '{bad}'", *fragments)


def test_validate_needs_input_and_rejects_flags_without_logs(run_cli, b300_csv):
    assert_one_line_error(run_cli("validate"), "--dataset")
    assert_one_line_error(run_cli("validate", b300_csv, "--tp", "2"), "training logs")
    assert_one_line_error(run_cli("validate", "--dataset", "nope"), "unknown dataset 'nope'")


def test_calibrate_writes_a_profile_that_validate_uses(run_cli, b300_csv, tmp_path):
    out = tmp_path / "b300.yaml"
    result = run_cli("calibrate", b300_csv, "--out", out, "--factors", "gemm_fp8,grouped_gemm",
                     "--release-factors", "", "--folds", "3")
    assert result.exit_code == 0, result.output
    profile = load_profile(out)
    cal = profile.systems["dgx-b300"]
    assert set(cal.factors) <= {"gemm_fp8", "grouped_gemm"} and cal.factors
    assert set(cal.uncertainty) == set(cal.factors)
    assert cal.n_runs == 10 and cal.cross_validation["n"] == 10
    assert "dgx-b300.csv" in profile.fitted_on or "b300.csv" in profile.fitted_on
    assert len(profile.training_run_ids) == 10
    validated = json.loads(run_cli("validate", b300_csv, "--calibration", out, "--json").stdout)
    assert validated["calibration"] == "b300"
    assert validated["n_in_training_set"] == 10
    datasheet = json.loads(run_cli("validate", b300_csv, "--datasheet", "--json").stdout)
    assert validated["mape_pct"] < datasheet["mape_pct"]  # training error after fitting


def test_calibrate_errors(run_cli, b300_csv, tmp_path):
    assert_one_line_error(run_cli("calibrate", b300_csv), "--out")
    assert_one_line_error(run_cli("calibrate", b300_csv, "--out", tmp_path / "x.yaml", "--factors", "gemm_fp9"),
                          "gemm_fp9")
    assert_one_line_error(run_cli("calibrate", b300_csv, "--out", tmp_path / "nodir" / "x.yaml"), "does not exist")
    assert not (tmp_path / "x.yaml").exists()


def test_validate_a_megatron_log_with_flags(run_cli, tmp_path):
    """A training log plus scenario flags becomes one validated run (the log's own argument dump
    and a sidecar YAML are covered in test_loaders_megatron_log.py)."""
    lines = [(f" [2026-03-04 10:00:{i:02d}] iteration {i:>8d}/      30 | consumed samples: {i * 128:>10d} | "
              f"elapsed time per iteration (ms): {2000.0 + i:.1f} | throughput per GPU (TFLOP/s/GPU): 600.0 | "
              f"learning rate: 1.0E-05 | global batch size:   128 | lm loss: 7.1E+00 | loss scale: 1.0 | "
              f"number of skipped iterations:   0 | number of nan iterations:   0 |") for i in range(1, 31)]
    log = tmp_path / "llama8b.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = run_cli("validate", log, "--datasheet", "--json", "--model", "llama3-8b", "--system", "dgx-h100",
                     "--gpus", "8", "--precision", "fp8-cs", "--mbs", "1", "--seq", "8192", "--warmup", "5")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    (row,) = data["rows"]
    assert row["run_id"] == "llama8b"
    assert row["measured_step_time_s"] == pytest.approx((2000.0 + 18) / 1e3)  # median of iterations 6..30
    missing = run_cli("validate", log, "--datasheet", "--model", "llama3-8b")
    assert_one_line_error(missing, "the log does not say")


@pytest.mark.parametrize("name", ["runs", "runs.csv", "train.log"])
def test_validate_a_directory_says_it_is_a_directory(run_cli, tmp_path, name):
    """A directory given as a runs file: one line saying so (before: 'unknown kind of runs file' for a
    plain directory name, 'does not exist' for one named like a CSV or log)."""
    folder = tmp_path / name
    folder.mkdir()
    for command in (["validate", str(folder)], ["calibrate", str(folder), "--out", str(tmp_path / "p.yaml")]):
        result = run_cli(*command)
        assert result.exit_code == 2, result.output
        err = result.stderr.strip()
        assert err.startswith("error: ") and "\n" not in err, err
        assert f"'{folder}' is a directory" in err and "CSV" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


@pytest.mark.parametrize("release_factors", ["gemm_bf17", "attention", "gemm_bf16,grouped_gem"])
def test_calibrate_release_factors_outside_the_fitted_ones_are_an_error(run_cli, b300_csv, tmp_path, release_factors):
    """--release-factors names factors refined per release; one that is not fitted (a typo, or a factor
    missing from --factors) was dropped without a word and the profile written without it."""
    out = tmp_path / "p.yaml"
    result = run_cli("calibrate", b300_csv, "--out", out, "--factors", "gemm_bf16,gemm_fp8",
                     "--release-factors", release_factors)
    bad = [f for f in release_factors.split(",") if f not in ("gemm_bf16", "gemm_fp8")]
    assert_one_line_error(result, f"--release-factors: '{bad[0]}'")
    assert "gemm_bf16, gemm_fp8" in result.stderr
    assert not out.exists()
