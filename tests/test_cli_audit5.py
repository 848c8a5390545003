"""CLI audit of catalog, describe, inventory, topology, collective, validate, calibrate, reference and sweep:
each test runs the command as a user would and asserts the exact behaviour (found wrong before the fix)."""

from __future__ import annotations

import csv
import json

import pytest

from tests.conftest import megatron_log_text

LOG_ARGS = """------------------------ arguments ------------------------
  bf16 ............................................ True
  global_batch_size ............................... 128
  micro_batch_size ................................ 1
  pipeline_model_parallel_size .................... 2
  seq_length ...................................... 8192
  tensor_model_parallel_size ...................... 4
  world_size ...................................... 64
-------------------- end of arguments ---------------------
"""
RUNS_HEADER = "run_id,model,system,num_gpus,precision,global_batch_size,micro_batch_size,seq_length,tp,pp,step_time_s\n"


def _log(tmp_path, sidecar: str | None = None):  # noqa: ANN202 - a Path
    log = tmp_path / "run.log"
    log.write_text(megatron_log_text(LOG_ARGS), encoding="utf-8")
    if sidecar is not None:
        (tmp_path / "run.yaml").write_text(sidecar, encoding="utf-8")
    return log


@pytest.fixture()
def runs_csv(tmp_path):  # noqa: ANN201 - a Path
    path = tmp_path / "runs.csv"
    path.write_text(RUNS_HEADER + "a,llama3-8b,gb300-nvl72,8,bf16,128,1,8192,1,1,4.0\n"
                    "b,llama3-8b,gb300-nvl72,8,bf16,128,2,8192,1,1,3.8\n", encoding="utf-8")
    return path


# ------------------------------------------------------------------ validate: a log's own arguments
NAMED = ("--model", "llama3-70b", "--system", "dgx-h100")


def test_validate_refuses_a_flag_contradicting_the_logs_arguments(one_line_error, run_cli, tmp_path) -> None:
    """The log's argument block says tp 4 on 64 GPUs; '--tp 8' predicted a tp-8 run and scored it against the
    tp-4 measurement (+640 % instead of +486 %), with nothing said."""
    log = _log(tmp_path)
    err = one_line_error(run_cli("validate", log, *NAMED, "--tp", "8"))
    assert err == (f"error: file '{log}', column 'tp': the log says 4, the scenario says 8 (drop --tp or fix the "
                   "sidecar YAML: the measured time is of the logged run)"), err
    err = one_line_error(run_cli("validate", log, *NAMED, "--gpus", "128"))
    assert "column 'num_gpus': the log says 64, the scenario says 128 (drop --gpus" in err, err
    same = [run_cli("validate", log, *NAMED, *extra, "--json") for extra in ((), ("--tp", "4", "--gpus", "64"))]
    assert all(r.exit_code == 0 for r in same), [r.output for r in same]
    rows = [json.loads(r.stdout)["rows"][0] for r in same]
    assert rows[0]["predicted_step_time_s"] == rows[1]["predicted_step_time_s"] and rows[0]["gpus"] == 64


def test_validate_refuses_a_sidecar_contradicting_the_logs_arguments(one_line_error, run_cli, tmp_path) -> None:
    log = _log(tmp_path, "model: llama3-70b\nsystem: dgx-h100\npp: 4\n")
    err = one_line_error(run_cli("validate", log))
    assert "column 'pp': the log says 2, the scenario says 4" in err, err


def test_validate_engine_is_worded_like_predicts(one_line_error, run_cli, runs_csv) -> None:
    err = one_line_error(run_cli("validate", runs_csv, "--engine", "foo"))
    assert err == "error: --engine: must be one of analytic, des (got 'foo')", err


# ------------------------------------------------------------------ collective and topology
def test_collective_size_must_be_whole_bytes(one_line_error, run_cli) -> None:
    """'--size 1.5' was costed as 1.5 B and printed as '2' in the size column."""
    err = one_line_error(run_cli("collective", "all_reduce", "--size", "1.5"))
    assert err == "error: --size: must be a whole number of bytes (got '1.5' = 1.5 B)", err
    err = one_line_error(run_cli("collective", "all_reduce", "--size", "-5"))
    assert err == "error: --size: must be bytes or a size with a unit, e.g. 4096, 512M, 4GB, 1GiB (got '-5')", err


def test_collective_sweep_sizes_are_whole_bytes_as_nccl_tests_steps_them(run_cli) -> None:
    """-f 1.5 from 1000 B gave 5062.5 B and 7593.75 B (nccl-tests' size_t arithmetic truncates each step);
    JSON sizes were floats (1000.0)."""
    res = run_cli("collective", "all_gather", "--gpus", "8", "--min-size", "1000", "--max-size", "10000",
                  "--step-factor", "1.5", "--json")
    assert res.exit_code == 0, res.output
    sizes = [r["size_bytes"] for r in json.loads(res.stdout)["results"]]
    assert sizes == [1000, 1500, 2250, 3375, 5062, 7593, 10000] and all(isinstance(s, int) for s in sizes)


def test_collective_json_says_fabric_tiers_crossed_not_topologys_tiers(run_cli) -> None:
    """collective --json 'tiers' (fabric tiers the group crosses: 0 in one rack) and topology --json 'tiers'
    (switch tiers of the network: 2) were one name for two quantities."""
    coll = json.loads(run_cli("collective", "all_reduce", "--size", "1MB", "--json").stdout)
    topo = json.loads(run_cli("topology", "--json").stdout)
    assert "tiers" not in coll and coll["fabric_tiers_crossed"] == 0 and topo["tiers"] == 2


def test_collective_step_factor_with_size_is_a_conflict(one_line_error, run_cli) -> None:
    """'--size 1MB --step-factor 3' ignored the factor without a word."""
    err = one_line_error(run_cli("collective", "all_reduce", "--size", "1MB", "--step-factor", "3"))
    assert err == "error: give either --size or --min-size/--max-size/--step-factor, not both", err


@pytest.mark.parametrize(("args", "expect"), [
    (["collective", "all_reduce", "--size", "1MB", "--tp", "0"], "error: --tp: must be greater than 0 (got 0)"),
    (["collective", "all_reduce", "--size", "1MB", "--gpus", "-8"], "error: --gpus: must be greater than 0 (got -8)"),
    (["topology", "--gpus", "0"], "error: --gpus: must be greater than 0 (got 0)"),
    (["describe", "llama3-8b", "--seq", "0"], "error: --seq: must be a positive integer (got 0)"),
    (["inventory", "--model", "llama3-8b", "--gpus", "8", "--tensors", "--stage", "3"],
     "error: --stage: must be a pipeline stage, 0..0 (got 3)"),
])
def test_count_flags_are_worded_like_the_other_verbs(one_line_error, run_cli, args, expect) -> None:
    """'tp must be >= 1, got 0' and '--seq must be ...' against '--flag: must be ... (got X)' everywhere else."""
    assert one_line_error(run_cli(*args)) == expect


@pytest.mark.parametrize(("option", "value", "guess"), [("--algorithm", "rings", "ring"), ("--group", "wrld", "world")])
def test_collective_names_get_a_did_you_mean(one_line_error, run_cli, option, value, guess) -> None:
    err = one_line_error(run_cli("collective", "all_reduce", "--size", "1MB", option, value))
    assert f"'{value}' (did you mean '{guess}'?)" in err, err


# ------------------------------------------------------------------ catalog
def test_catalog_json_holds_what_the_table_shows_under_topologys_names(run_cli) -> None:
    """catalog --json said 'nvlink_domain' where topology says 'domain_size', HBM as a float (2.79e11),
    and lacked the NVLink/NIC bandwidths, FP8/FP4 peaks, hidden size, vocabulary, experts and MTP of the table."""
    cat = json.loads(run_cli("catalog", "--json").stdout)
    systems = {s["name"]: s for s in cat["systems"]}
    gb300 = systems["gb300-nvl72"]
    topo = json.loads(run_cli("topology", "--system", "gb300-nvl72", "--json").stdout)
    for key in ("domain_size", "nvlink_gpu_Bps", "nic_Bps"):
        assert gb300[key] == topo[key], key
    assert gb300["hbm_bytes"] == 279_000_000_000 and isinstance(gb300["hbm_bytes"], int)
    assert gb300["nvlink_gpu_Bps"] == 900e9 and gb300["nic_Bps"] == 100e9  # the table: 900 and 100 GB/s
    assert systems["dgx-a100"]["fp8_peak_flops_per_s"] is None and systems["dgx-a100"]["fp4_peak_flops_per_s"] is None
    assert systems["dgx-h100"]["fp8_peak_flops_per_s"] == 1979e12  # H100 SXM datasheet: 1,979 TFLOP/s dense FP8
    models = {m["name"]: m for m in cat["models"]}
    assert {k: models["llama3-8b"][k] for k in ("layers", "hidden_size", "vocab_size", "num_experts", "topk",
                                                "mtp_layers")} == {"layers": 32, "hidden_size": 4096, "vocab_size": 128256,
                                                                   "num_experts": None, "topk": None, "mtp_layers": 0}
    assert (models["qwen3-30b-a3b"]["num_experts"], models["qwen3-30b-a3b"]["topk"]) == (128, 8)
    assert models["deepseek-v3-mtp"]["mtp_layers"] == 1


# ------------------------------------------------------------------ sweep
def _grid(tmp_path, body: str):  # noqa: ANN202 - a Path
    path = tmp_path / "grid.yaml"
    path.write_text("base:\n  precision: bf16\n  parallelism: {micro_batch_size: 1, global_batch_size: 128, "
                    "seq_length: 4096}\ncalibration: none\n" + body, encoding="utf-8")
    return path


def test_sweep_refuses_a_repeated_grid_value(one_line_error, run_cli, tmp_path) -> None:
    """'gpus: [8, 8]' was two points and two identical rows (compare refuses '--tp 2,2')."""
    grid = _grid(tmp_path, "grid:\n  model: llama3-8b\n  gpus: [8, 8]\n")
    err = one_line_error(run_cli("sweep", grid, "--out", tmp_path / "out", "--jobs", "1"))
    assert err == f"error: grid file '{grid}': grid.gpus: gives 8 twice; give each value once", err
    assert not (tmp_path / "out").exists()


def test_sweep_union_of_products_has_each_point_once(run_cli, tmp_path) -> None:
    """A list of mappings 'sweeps the union of their products' (README); a point in two of them was two rows."""
    grid = _grid(tmp_path, "grid:\n  - {model: llama3-8b, gpus: [8]}\n  - {model: llama3-8b, gpus: [8, 16]}\n")
    res = run_cli("sweep", grid, "--out", tmp_path / "out", "--jobs", "1", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["points"] == 2
    with open(tmp_path / "out" / "results.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [(r["point"], r["gpus"]) for r in rows] == [("0", "8"), ("1", "16")]


def test_sweep_json_names_workers_and_has_no_rate_when_nothing_ran(run_cli, tmp_path) -> None:
    """A resumed sweep printed '"jobs": 0' (what --jobs 0, every core, means) and '"points_per_s": 0.0'."""
    grid = _grid(tmp_path, "grid:\n  model: llama3-8b\n  gpus: [8]\n")
    args = ("sweep", grid, "--out", tmp_path / "out", "--jobs", "1", "--json")
    first, again = (json.loads(run_cli(*args).stdout) for _ in range(2))
    assert "jobs" not in first and first["workers"] == 1 and first["points_per_s"] > 0
    assert again["computed"] == 0 and again["workers"] == 0 and again["points_per_s"] is None
    text = " ".join(run_cli(*args[:-1]).stdout.split())  # the table said 'computed now: 0 on - workers in 0.0 s'
    assert "computed now: 0; finished by earlier runs: 1" in text, text


def test_collective_help_has_no_rst_markup(run_cli) -> None:
    assert "``" not in run_cli("collective", "--help").stdout


def test_sweep_mode_gets_a_did_you_mean(one_line_error, run_cli, tmp_path) -> None:
    grid = _grid(tmp_path, "grid:\n  model: llama3-8b\n  gpus: [8]\n  mode: [predict, plann]\n")
    err = one_line_error(run_cli("sweep", grid, "--out", tmp_path / "out"))
    assert err.endswith("grid.mode: 'plann' is not one of predict, plan; did you mean 'plan'?"), err


# ------------------------------------------------------------------ calibrate
@pytest.mark.parametrize(("args", "expect"), [
    (["--factors", ""], "error: --factors: must name at least one factor (got '')"),
    (["--factors", "gemm_bf16x"], "error: --factors: 'gemm_bf16x' is not a fittable factor; did you mean 'gemm_bf16'?"),
    (["--factors", "gemm_bf16,gemm_bf16"], "error: --factors gives 'gemm_bf16' twice in 'gemm_bf16,gemm_bf16'; "
                                           "give each value once"),
    (["--factors", "gemm_bf16", "--loss", "l2"], "error: --loss: must be one of soft_l1, huber, linear (got 'l2')"),
    (["--factors", "gemm_bf16", "--holdout", "run"], "error: --holdout: must be one of configuration, model (got 'run')"),
    (["--factors", "gemm_bf16", "--folds", "1"],
     "error: --folds: must be 0 (leave one configuration out) or at least 2 (got 1)"),
])
def test_calibrate_factor_flags(one_line_error, run_cli, runs_csv, tmp_path, args, expect) -> None:
    """--factors '' fitted nothing and wrote the datasheet as a profile; a repeated factor was fitted twice; a
    typo listed 25 names without a guess; --loss/--holdout/--folds errors did not name their flag."""
    out = tmp_path / "p.yaml"
    assert one_line_error(run_cli("calibrate", runs_csv, "--out", out, "--release-factors", "", *args)) == expect
    assert not out.exists()


# ------------------------------------------------------------------ reference
@pytest.mark.parametrize(("args", "expect"), [
    (["--optimizer", "sgd"], "error: --optimizer: must be one of adamw, muon (got 'sgd')"),
    (["--check", "maybe"], "error: --check: must be on or off (got 'maybe')"),
    (["--custom-coefficients", "1,2"],
     "error: --custom-coefficients: must look like 'a,b,c;a,b,c', three numbers per tuple (got '1,2')"),
    (["--custom-coefficients", "1,2,3"], "error: reference run: custom_coefficients needs ns_coefficients custom "
                                         "(the quintic schedule would ignore them)"),
])
def test_reference_run_flag_errors(one_line_error, run_cli, tmp_path, args, expect) -> None:
    """click's "'sgd' is not one of 'adamw', 'muon'." and "'maybe' is not on or off" against the other verbs'
    '--flag: must be ... (got X)'; custom coefficients without '--ns-coefficients custom' were ignored."""
    out = tmp_path / "r.json"
    assert one_line_error(run_cli("reference", "run", *args, "--out", out)) == expect
    assert not out.exists()


NCCL_TESTS = """\
#  Rank  0 Group  0 Pid  41021 on  dgx-h100-01 device  0 [0x18] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  41022 on  dgx-h100-01 device  1 [0x2a] NVIDIA H100 80GB HBM3
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
     1048576        262144     float     sum      -1    41.99   24.97   24.97      0    41.80   25.09   25.09      0
"""


def test_collective_measured_error_is_named_for_busbw(run_cli, tmp_path) -> None:
    """collective --measured wrote 'error_pct' for (predicted - measured) busbw / measured busbw, positive when
    the model is faster; validate's 'error_pct' is of step time, positive when the model is slower."""
    path = tmp_path / "all_reduce.txt"
    path.write_text(NCCL_TESTS, encoding="utf-8")
    res = run_cli("collective", "all_reduce", "--system", "dgx-h100", "--measured", path, "--json")
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)["results"]
    assert "error_pct" not in row and row["size_bytes"] == 1048576
    assert row["measured_busbw_Bps"] == 24.97e9 and row["measured_time_s"] == pytest.approx(41.99e-6)
    # one size: busbw ratio = inverse time ratio (the file's busbw column has two decimals only)
    assert row["busbw_error_pct"] == pytest.approx(100 * (41.99e-6 / row["time_s"] - 1)) and row["busbw_error_pct"] > 0


def test_topology_says_why_a_one_domain_job_has_no_scale_out_bisection(run_cli) -> None:
    """'scale-out bisection: 0.00 TB/s/dir' for 72 GPUs in one rack read as a network without bandwidth."""
    text = " ".join(run_cli("topology", "--gpus", "72").stdout.split())
    assert "scale-out bisection: 0.00 TB/s/dir (none crossed: the job is in one NVLink domain)" in text
    text = " ".join(run_cli("topology", "--gpus", "144").stdout.split())
    assert "scale-out bisection: 7.20 TB/s/dir" in text and "none crossed" not in text  # 144 x 100 GB/s / 2


def test_reference_run_of_one_step_warns_that_it_times_the_warm_up(run_cli, tmp_path) -> None:
    """'the first is warm-up for timings', but with --steps 1 the warm-up step was the timing, without a word."""
    res = run_cli("reference", "run", "--steps", "1", "--check", "off", "--out", tmp_path / "r.json")
    assert res.exit_code == 0, res.output
    assert "warning: --steps 1 times the warm-up step" in res.stderr
    res = run_cli("reference", "run", "--steps", "2", "--check", "off", "--out", tmp_path / "r2.json")
    assert res.exit_code == 0 and "warning" not in res.stderr, res.output


@pytest.mark.parametrize(("args", "expect"), [
    (["--factors", "gemm_bf16"], "error: --microbench measures this machine and fits no runs; drop --factors"),
    (["--no-cv", "--model", "llama3-8b"],
     "error: --microbench measures this machine and fits no runs; drop --no-cv, scenario flags (model)"),
])
def test_calibrate_microbench_refuses_fit_flags(one_line_error, run_cli, tmp_path, args, expect) -> None:
    """'calibrate --microbench --factors gemm_bf16' measured the machine and ignored the factors without a word."""
    out = tmp_path / "local.yaml"
    assert one_line_error(run_cli("calibrate", "--microbench", "--out", out, *args)) == expect
    assert not out.exists()


def test_calibrate_without_cv_does_not_title_a_held_out_scheme(run_cli, runs_csv, tmp_path) -> None:
    """--no-cv printed 'held-out (leave one configuration out, per system) MAPE' over columns of '-'."""
    res = run_cli("calibrate", runs_csv, "--out", tmp_path / "p.yaml", "--factors", "gemm_bf16", "--release-factors",
                  "", "--no-cv")
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "held-out (not evaluated: --no-cv)" in text and "leave one configuration out" not in text


def test_validate_with_no_predictable_run_says_so(run_cli, tmp_path) -> None:
    """Every run unsupported: an empty 'run / measured / predicted' table was printed above the reasons."""
    path = tmp_path / "h100.csv"
    path.write_text(RUNS_HEADER + "c,llama3-8b,dgx-h100,8,mxfp8,128,1,8192,1,1,4.0\n", encoding="utf-8")
    res = run_cli("validate", path)
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "no run could be predicted (1 unsupported run, below)" in text and "run (by system)" not in text
    assert "c: invalid scenario: precision mxfp8 is not supported" in text


def test_reference_tables_name_the_group_size_ranks(run_cli, tmp_path) -> None:
    """The collectives table's 'size' column (the group's ranks) sat beside 'bytes'."""
    res = run_cli("reference", "run", "--steps", "2", "--check", "off", "--out", tmp_path / "r.json")
    assert res.exit_code == 0, res.output
    header = next(line for line in res.stdout.splitlines() if "dtype" in line)
    assert "ranks" in header and "size" not in header, header


@pytest.mark.parametrize("command", [["describe"], ["inventory", "--gpus", "8", "--model"]])
def test_a_model_files_misspelt_key_gets_a_did_you_mean(one_line_error, run_cli, tmp_path, command) -> None:
    """A model YAML's 'hidden_sise' read 'Extra inputs are not permitted (got 64)' (pydantic's words, no guess)."""
    path = tmp_path / "my.yaml"
    path.write_text("name: my\nnum_layers: 2\nhidden_sise: 64\n", encoding="utf-8")
    err = one_line_error(run_cli(*command, path))
    assert err == f"error: model '{path}': hidden_sise: unknown key; did you mean 'hidden_size'?", err


def test_a_system_files_misspelt_key_gets_a_did_you_mean(one_line_error, run_cli, tmp_path) -> None:
    from topologies.hardware import SYSTEMS_DIR

    text = (SYSTEMS_DIR / "gb300-nvl72.yaml").read_text(encoding="utf-8")
    path = tmp_path / "sys.yaml"
    path.write_text(text.replace("  domain_size:", "  domain_sise:", 1), encoding="utf-8")
    err = one_line_error(run_cli("topology", "--system", path))
    assert err == f"error: system '{path}': nvlink.domain_sise: unknown key; did you mean 'domain_size'?", err


@pytest.mark.parametrize(("shapes", "expect"), [
    ("tinyy", "unknown shapes 'tinyy' (did you mean 'tiny'?); known presets"),
    ("{path}", "model '{path}': hidden_sise: unknown key; did you mean 'hidden_size'?"),
    ("{missing}", "model '{missing}' does not exist"),
])
def test_reference_shapes_file_errors_are_the_files_own(one_line_error, run_cli, tmp_path, shapes, expect) -> None:
    """'--shapes my.yaml' with a bad key (or a missing file) said only "unknown shapes 'my.yaml'; known presets: ..."."""
    path, missing = tmp_path / "my.yaml", tmp_path / "none.yaml"
    path.write_text("name: my\nnum_layers: 2\nhidden_sise: 64\n", encoding="utf-8")
    names = {"path": path, "missing": missing}
    err = one_line_error(run_cli("reference", "run", "--shapes", shapes.format(**names), "--out", tmp_path / "r.json"))
    assert expect.format(**names) in err, err


def test_describe_takes_the_model_flag_every_other_command_takes(run_cli, one_line_error) -> None:
    """``describe --model X`` failed with click's 'No such option: --model (Possible options: --help)'."""
    by_flag = run_cli("describe", "--model", "llama3-8b", "--json")
    assert by_flag.exit_code == 0, by_flag.output
    assert by_flag.stdout == run_cli("describe", "llama3-8b", "--json").stdout
    assert one_line_error(run_cli("describe", "llama3-8b", "--model", "kimi-k2")) == (
        "error: two models given: MODEL 'llama3-8b' and --model 'kimi-k2'; give one")
    assert "Missing argument 'MODEL' (or --model NAME|FILE)" in one_line_error(run_cli("describe"))


def test_des_refuses_a_partial_group_of_interleaved_micro_batches(run_cli, one_line_error) -> None:
    """5 micro-batches on pp 4 with interleaving: the DES order deadlocked and predict died in a
    ZeroDivisionError traceback (a 0 s step)."""
    res = run_cli("predict", "--model", "llama3-70b", "--system", "gb300-nvl72", "--gbs", "80", "--engine", "des")
    assert res.exit_code == 2
    assert "cannot run Megatron's interleaved order with 5 micro-batches on pp 4" in one_line_error(res)


def test_inventory_json_names_a_stage_count_apart_from_the_tensor_list(run_cli) -> None:
    """A stage's 'tensors' was a count while the top-level 'tensors' is the list; a stage's
    'memory_per_gpu_bytes' was a mapping where every other output has a number under that name."""
    data = json.loads(run_cli("inventory", "--json").stdout)
    stage = data["stages"][0]
    assert isinstance(stage["tensor_count"], int) and "tensors" not in stage and isinstance(data["tensors"], list)
    memory = stage["memory"]
    assert memory["total_bytes"] >= max(memory["components_bytes"].values()) > 0
    assert "memory_per_gpu_bytes" not in stage
