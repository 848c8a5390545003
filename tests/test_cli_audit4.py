"""Leftovers of the CLI audits (plan/validate/compare/sweep JSON keys, Megatron-log precision, booleans for
numbers, repeated compare values, plan's flag wording): each test runs the command as a user would and
asserts the exact behaviour."""

from __future__ import annotations

import csv
import json

import pytest
import yaml

from tests.conftest import megatron_log_text

BREAKDOWN_KEYS = {"compute", "pipeline_bubble", "exposed_comm", "optimizer", "other"}
SMALL_PLAN = ("plan", "--model", "llama3-8b", "--gpus", "8", "--samples", "0", "--top-k", "0", "--limit", "3",
              "--jobs", "1", "--json")


@pytest.fixture(scope="module")
def plan_json():
    from typer.testing import CliRunner

    from cli.app import app

    res = CliRunner().invoke(app, [*SMALL_PLAN, "--explain", "tp=2"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_plan_json_breakdown_is_nested_like_predicts(plan_json) -> None:
    """plan --json wrote flat 'comm:dp_grad' keys beside predict/compare's breakdown_s whose exposed
    communication is the mapping exposed_comm: {dp_grad: ...}; a script reading both had two shapes."""
    rows = [*plan_json["ranking"], *plan_json["pareto_front"], plan_json["reference"]["row"], plan_json["best"]]
    for row in rows:
        b = row["breakdown_s"]
        assert set(b) == BREAKDOWN_KEYS and isinstance(b["exposed_comm"], dict), b
        assert not any(":" in k for k in b["exposed_comm"])
        total = b["compute"] + b["pipeline_bubble"] + sum(b["exposed_comm"].values()) + b["optimizer"] + b["other"]
        assert total == pytest.approx(row["step_time_s"], rel=1e-9)
    best, report = plan_json["best"]["breakdown_s"], plan_json["best_report"]["breakdown_s"]
    assert set(best["exposed_comm"]) == set(report["exposed_comm"])  # the same plan, the same names
    for key in ("compute", "pipeline_bubble", "optimizer", "other"):
        assert best[key] == pytest.approx(report[key], rel=1e-9)


def test_plan_explain_deltas_are_nested_like_compares(plan_json) -> None:
    """--explain's JSON held 'deltas_s': [['comm:tp', 0.5], ...] where compare says delta_breakdown_s with
    exposed_comm nested; the deltas are this plan minus the best, and the tp=2 plan loses on tp comm."""
    (ex,) = plan_json["explain"]
    assert "deltas_s" not in ex and "memory_bytes" not in ex and ex["memory_per_gpu_bytes"] > 0
    d = ex["delta_breakdown_s"]
    assert set(d) == BREAKDOWN_KEYS and d["exposed_comm"]["tp"] > 0
    best = plan_json["ranking"][0]
    gap = (d["compute"] + d["pipeline_bubble"] + sum(d["exposed_comm"].values()) + d["optimizer"] + d["other"])
    assert gap == pytest.approx(ex["step_time_s"] - best["step_time_s"], rel=1e-6)


ARGS = """------------------------ arguments ------------------------
  bf16 ............................................ {bf16}
{fp8}  global_batch_size ............................... 128
  micro_batch_size ................................ 1
  seq_length ...................................... 4096
  tensor_model_parallel_size ...................... 1
  world_size ...................................... 8
-------------------- end of arguments ---------------------
"""
NAMED = ("--model", "llama3-8b", "--system", "dgx-h100")


def _log(tmp_path, fp8: str = "", bf16: str = "True", name: str = "run.log"):  # noqa: ANN202 - a Path
    log = tmp_path / name
    log.write_text(megatron_log_text(ARGS.format(bf16=bf16, fp8=fp8)), encoding="utf-8")
    return log


def _fp8_lines(fp8: str, recipe: str | None) -> str:
    line = f"  fp8 ............................................. {fp8}\n"
    return line + (f"  fp8_recipe ...................................... {recipe}\n" if recipe else "")


@pytest.mark.parametrize(("fp8", "recipe", "bf16", "precision"), [
    ("hybrid", "tensorwise", "True", "fp8-cs"),  # Megatron-Bridge's FP8-CS runs (the settings file's cells)
    ("hybrid", "delayed", "True", "fp8-delayed"),
    ("hybrid", None, "True", "fp8-delayed"),  # Megatron-LM's default recipe
    ("e4m3", "mxfp8", "True", "mxfp8"),
    ("e4m3", "blockwise", "True", "fp8-blockwise"),
    ("None", None, "True", "bf16"),
])
def test_megatron_log_precision_comes_from_its_fp8_arguments(tmp_path, fp8: str, recipe: str | None, bf16: str,
                                                           precision: str) -> None:
    """A log saying 'fp8 ..... hybrid' (E4M3 forward, E5M2 backward) was not read as FP8: without --precision
    validate said 'the log does not say precision'. hybrid with the tensorwise recipe is FP8 current scaling."""
    from workloads.loaders import load_megatron_log

    run = load_megatron_log(_log(tmp_path, _fp8_lines(fp8, recipe), bf16), {"model": "llama3-8b",
                                                                           "system": "dgx-h100"})
    assert run.precision.value == precision


def test_validate_reads_an_fp8_hybrid_log_as_fp8_cs(run_cli, tmp_path) -> None:
    """The same prediction as with --precision fp8-cs given by hand."""
    log = _log(tmp_path, _fp8_lines("hybrid", "tensorwise"))
    read = run_cli("validate", log, *NAMED, "--json")
    assert read.exit_code == 0, read.output
    given = run_cli("validate", log, *NAMED, "--precision", "fp8-cs", "--json")
    bf16 = run_cli("validate", log, *NAMED, "--precision", "bf16", "--json")
    step = [json.loads(r.stdout)["rows"][0]["predicted_step_time_s"] for r in (read, given, bf16)]
    assert step[0] == step[1] != step[2]


def test_log_with_an_unknown_fp8_recipe_is_one_line(one_line_error, run_cli, tmp_path) -> None:
    err = one_line_error(run_cli("validate", _log(tmp_path, _fp8_lines("hybrid", "rowwise")), *NAMED))
    assert err.endswith("column 'fp8_recipe': the log's fp8_recipe 'rowwise' is not one of tensorwise, delayed, "
                        "mxfp8, blockwise; pass --precision"), err


def test_validate_json_rows_say_gpus_like_every_other_output(run_cli, tmp_path) -> None:
    """validate --json rows said 'num_gpus' where the scenario, predict, plan and sweep say 'gpus'."""
    res = run_cli("validate", _log(tmp_path, _fp8_lines("hybrid", "tensorwise")), *NAMED, "--json")
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)["rows"]
    assert "num_gpus" not in row and row["gpus"] == 8  # world_size 8 in the log


def test_compare_refuses_a_repeated_value(one_line_error, run_cli) -> None:
    """'compare --tp 2,2' compared two identical variants (A tp=2, B tp=2: +0.00 %)."""
    err = one_line_error(run_cli("compare", "--model", "llama3-8b", "--gpus", "8", "--tp", "2,2"))
    assert err == "error: --tp gives '2' twice in '2,2'; give each value once", err
    err = one_line_error(run_cli("compare", "--model", "llama3-8b", "--gpus", "8", "--tp", "2,02"))
    assert err == "error: --tp gives '2' twice in '2,02'; give each value once", err
    err = one_line_error(run_cli("compare", "--model", "llama3-8b", "--gpus", "8", "--optimizer", "adamw, muon,adamw"))
    assert err == "error: --optimizer gives 'adamw' twice in 'adamw, muon,adamw'; give each value once", err


def test_json_ratios_carry_their_unit(run_cli, plan_json) -> None:
    """mfu, optimizer.imbalance and plan's memory_headroom had no unit in their names (house rule: units in
    every name): fractions say _fraction, the max/mean ratio says _ratio, in every command emitting them."""
    pred = json.loads(run_cli("predict", "--model", "llama3-8b", "--gpus", "8", "--optimizer", "muon",
                              "--json").stdout)
    assert "mfu" not in pred and "imbalance" not in pred["optimizer"]
    rates = pred["optimizer"]["per_rank_compute_s"]
    assert pred["optimizer"]["imbalance_ratio"] == pytest.approx(rates["max"] / rates["mean"])
    from topologies.hardware import load_system

    gpu = load_system("gb300-nvl72").gpu
    assert pred["scenario"]["precision"] == "fp8-cs"  # llama3-8b on gb300-nvl72 by default: the FP8 peak
    assert pred["mfu_fraction"] == pytest.approx(pred["model_tflops_per_gpu"] * 1e12 / gpu.peak_flops_per_s.fp8, rel=1e-9)
    assert "memory_headroom" not in plan_json and plan_json["memory_headroom_fraction"] == 0.1
    assert plan_json["memory_budget_bytes"] == pytest.approx(0.9 * gpu.hbm_bytes)
    assert "mfu" not in plan_json["best_report"] and "mfu_fraction" in plan_json["best_report"]
    cmp = json.loads(run_cli("compare", "--model", "llama3-8b", "--gpus", "8", "--tp", "1,2", "--json").stdout)
    assert all("mfu_fraction" in v["report"] and "imbalance_ratio" in v["report"]["optimizer"]
               for v in cmp["variants"])


def test_kernel_counts_are_integers(run_cli) -> None:
    """'launches': 1149.0 and by_part counts as floats: a count of kernel launches is a whole number."""
    pred = json.loads(run_cli("predict", "--model", "llama3-8b", "--gpus", "8", "--optimizer", "muon",
                              "--json").stdout)
    k = pred["optimizer"]["kernels"]
    assert type(k["launches"]) is int and all(type(v) is int for v in k["by_part"].values())
    assert sum(k["by_part"].values()) == k["launches"]


@pytest.mark.parametrize(("text", "expect"), [
    ("model: llama3-8b\ngpus: true\n", "gpus: Input should be an integer, not a boolean (got True)"),
    ("model: llama3-8b\ngpus: 8\nparallelism: {tp: true}\n",
     "parallelism.tp: Input should be an integer, not a boolean (got True)"),
    ("model: llama3-8b\ngpus: 8\noptimizer: {kind: muon, ns_steps: false}\n",
     "optimizer.ns_steps: Input should be an integer, not a boolean (got False)"),
])
def test_scenario_file_refuses_a_boolean_for_a_number(one_line_error, run_cli, tmp_path, text: str,
                                                      expect: str) -> None:
    """'gpus: true' was read as 1 GPU (pydantic's lax mode: a bool is an int), a silent wrong scenario."""
    path = tmp_path / "s.yaml"
    path.write_text(text, encoding="utf-8")
    err = one_line_error(run_cli("predict", path))
    assert err == f"error: scenario file '{path}': {expect}", err


def test_measured_run_file_refuses_a_boolean_for_a_number(one_line_error, run_cli, tmp_path) -> None:
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"run_id": "a", "source": "x", "model": "llama3-8b", "system": "dgx-h100",
                                "num_gpus": True, "precision": "bf16", "global_batch_size": 8, "micro_batch_size": 1,
                                "seq_length": 4096, "step_time_s": 1.0}), encoding="utf-8")
    err = one_line_error(run_cli("validate", path))
    assert err.endswith("num_gpus: Input should be an integer, not a boolean (got True)"), err


def test_flags_refuse_a_boolean_for_a_number(one_line_error, run_cli) -> None:
    for cmd in ("predict", "plan"):
        err = one_line_error(run_cli(cmd, "--model", "llama3-8b", "--gpus", "8", "--tp", "true"))
        assert err.startswith("error: --tp: ") and "true" in err, err


def test_sweep_inline_model_is_one_model_column(run_cli, tmp_path) -> None:
    """A grid whose model is an inline mapping wrote name, hidden_size, attention ... as columns of their own
    (and no 'model' column); a catalogue model gives one 'model' column."""
    from workloads.models import load_model

    model = load_model("llama3-8b").model_dump(mode="json") | {"name": "tiny-llama", "num_layers": 4}
    grid = {"base": {"model": model, "system": "gb300-nvl72", "gpus": 8, "precision": "bf16",
                     "parallelism": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 2048}},
            "grid": [{"tp": [1, 2]}]}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid, sort_keys=False), encoding="utf-8")
    res = run_cli("sweep", path, "--jobs", "1", "--out", tmp_path / "out")
    assert res.exit_code == 0, res.output
    with (tmp_path / "out" / "results.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["model"] for r in rows] == ["tiny-llama (inline)"] * 2
    assert not {"name", "hidden_size", "attention", "num_layers"} & set(rows[0])
    assert {"mfu_fraction", "optimizer_imbalance_ratio"} <= set(rows[0]) and "mfu" not in rows[0]


@pytest.mark.parametrize("argv", [["--tp", "0"], ["--tp", "2,0"], ["--min-tp", "0"]])
def test_plan_zero_size_says_what_predict_says(one_line_error, run_cli, argv: list[str]) -> None:
    """plan said '--tp: 0 must be a positive integer' where predict says '--tp: must be greater than 0 (got 0)'."""
    err = one_line_error(run_cli("plan", "--model", "llama3-8b", "--gpus", "8", *argv))
    assert err == f"error: {argv[0]}: must be greater than 0 (got 0)", err
    if argv[0] == "--tp" and argv[1] == "0":
        assert err == one_line_error(run_cli("predict", "--model", "llama3-8b", "--gpus", "8", *argv))


# A short fresh audit of predict/compare/plan/validate (and the verbs sharing their flag checks)

FLAG_VALUE_ERRORS = [
    (["plan", "--seed", "x"], "--seed: must be a valid integer, unable to parse string as an integer (got 'x'); "
                              "see 'muonsim plan --help'"),
    (["validate", "--dataset", "megatron-ci", "--warmup", "-1"],
     "--warmup: must be greater than or equal to 0 (got '-1'); see 'muonsim validate --help'"),
    (["plan", "--memory-headroom", "1.5"], "--memory-headroom: must be in [0, 1), the fraction of HBM kept free "
                                           "(got 1.5)"),
    (["plan", "--top-k", "-1"], "--top-k: must be at least 0 (got -1)"),
    (["plan", "--sensitivity-sigma", "2"], "--sensitivity-sigma: must be in (0, 1) (got 2.0)"),
    (["predict", "--engine", "foo"], "--engine: must be one of analytic, des (got 'foo')"),
    (["compare", "--engine", "foo", "--tp", "1,2"], "--engine: must be one of analytic, des (got 'foo')"),
    (["collective", "all_reduce", "--step-factor", "1"], "--step-factor: must be a number greater than 1 (got 1.0)"),
]


@pytest.mark.parametrize(("argv", "expect"), FLAG_VALUE_ERRORS, ids=[" ".join(a) for a, _ in FLAG_VALUE_ERRORS])
def test_bad_flag_values_are_worded_like_predicts(one_line_error, run_cli, argv: list[str], expect: str) -> None:
    """Three wordings of one mistake: predict says '--tp: must be greater than 0 (got 0)'; plan said
    '--top-k must be at least 0 (got -1)' and '--memory-headroom 1.5 must be in [0, 1) (...)', and a flag
    of a typed option (--seed x, --warmup -1) got click's "Invalid value for '--seed': Input should be ..."."""
    err = one_line_error(run_cli(*argv))
    assert err == f"error: {expect}", err


def test_plan_help_says_searched_flags_take_comma_lists(run_cli) -> None:
    """plan --help listed '--tp INT  tensor parallel size' and said nowhere that a searched setting given
    as a flag pins the search and takes a comma list (only the module docstring did)."""
    from costmodel.planner.pins import CATEGORICAL_FLAGS, NUMERIC_KEYS

    res = run_cli("plan", "--help")
    assert res.exit_code == 0
    text = " ".join(res.stdout.replace("│", " ").split())
    assert "pins the search: a comma list restricts it (--pp 4,8)" in text, text
    searched = text.split("Searched:", 1)[1].split(".", 1)[0]
    assert {s.strip() for s in searched.split(",")} == {*NUMERIC_KEYS.values(), *CATEGORICAL_FLAGS.values()}


def test_predict_release_run_layout_uses_the_scenarios_keys_and_numbers(run_cli) -> None:
    """predict --json --release gave the recipe run's layout as summary-file columns with text values
    ({"num_gpus": "16", "pp": "2", ...}) beside a scenario saying gpus: 16, pp: 2 in the same document."""
    res = run_cli("predict", "--json", "--model", "qwen3-30b-a3b", "--system", "dgx-h100", "--release", "25.11")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    layout, scenario = data["recipe_settings"]["run_layout"], data["scenario"]
    assert set(layout) <= {"gpus", "precision", *scenario["parallelism"]}
    assert (layout["gpus"], layout["pp"], layout["vpp"], layout["ep"]) == (16, 2, 24, 8)  # the 25.11 H100 run
    assert all(type(v) is int for k, v in layout.items() if k != "precision")
