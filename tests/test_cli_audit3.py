"""Defects a third new-user audit of the CLI found (reference run, validate on a training log, plan --explain,
compare, --json keys): each test runs the command as a user would and asserts the exact behaviour."""

from __future__ import annotations

import json

import pytest

# (argv after 'reference run', the line the error must hold)
REFERENCE_FIELD_ERRORS = [
    (["--steps", "0"], "--steps: must be greater than 0 (got 0)"),
    (["--timeout", "0"], "--timeout: must be greater than 0 (got 0.0)"),
    (["--ns-steps", "0"], "--ns-steps: must be greater than 0 (got 0)"),
    (["--world-size", "0"], "--world-size: must be greater than 0 (got 0)"),
    (["--world-size", "two"], "--world-size: must be a valid integer, unable to parse string as an integer"),
    (["--tp-mode", "x"], "--tp-mode: must be one of duplicated, distributed, blockwise (got 'x')"),
]


@pytest.mark.parametrize(("argv", "expect"), REFERENCE_FIELD_ERRORS, ids=[a[0] for a, _ in REFERENCE_FIELD_ERRORS])
def test_reference_run_value_error_names_the_flag(one_line_error, run_cli, tmp_path, argv: list[str],
                                                  expect: str) -> None:
    """'reference run: timeout_s: Input should be greater than 0' named a field no flag is called (the flag is
    --timeout) in pydantic's words, and "Invalid value for '--world-size': Input should be ..." was click's; the
    other verbs say '--tp: must be ...'."""
    out = tmp_path / "run.json"
    err = one_line_error(run_cli("reference", "run", *argv, "--out", out))
    assert err == f"error: {expect}", err
    assert not out.exists()


# (--explain text, the line the error must hold)
EXPLAIN_ERRORS = [
    ("tp=2;pp=8", "error: --explain: tp=2;pp=8: '2;pp=8' is not an integer; separate settings with commas, "
                  "e.g. \"tp=2,pp=8\""),
    ("tp=2 pp=8", "error: --explain: tp=2 pp=8: '2 pp=8' is not an integer; separate settings with commas, "
                  "e.g. \"tp=2,pp=8\""),
    ("tp=two", "error: --explain: tp=two: 'two' is not an integer"),
    ("tp=2,pp=", "error: --explain: pp=: '' is not an integer"),
    ("optimizer=sgd", "error: --explain: optimizer=sgd: 'sgd' is not one of adamw, muon"),
    ("tp=2,pp=8,tp=4", "error: --explain: tp is given twice (tp=2, tp=4)"),
]


@pytest.mark.parametrize(("query", "expect"), EXPLAIN_ERRORS, ids=[q for q, _ in EXPLAIN_ERRORS])
def test_plan_explain_bad_setting_is_blamed_on_explain(one_line_error, run_cli, query: str, expect: str) -> None:
    """'--explain "tp=2;pp=8"' said '--tp: '2;pp=8' is not an integer', blaming a flag the user did not type;
    'tp=2,pp=8,tp=4' silently explained tp=4."""
    err = one_line_error(run_cli("plan", "--model", "llama3-8b", "--gpus", "8", "--explain", query))
    assert err == expect, err


def test_compare_json_breakdown_deltas_have_the_reports_keys(run_cli) -> None:
    """compare --json keyed its breakdown deltas by table labels ('exposed comm: dp_grad', 'optimizer step',
    'pipeline bubble') beside reports whose breakdown_s says exposed_comm.dp_grad, optimizer, pipeline_bubble:
    the same quantity under two names in one document. Each delta is now keyed as in breakdown_s and equals
    the variant's term minus the baseline's."""
    res = run_cli("compare", "--model", "llama3-8b", "--gpus", "8", "--tp", "1,2", "--json")
    assert res.exit_code == 0, res.output
    base, other = json.loads(res.stdout)["variants"]
    b, o, d = base["report"]["breakdown_s"], other["report"]["breakdown_s"], other["delta_breakdown_s"]
    assert set(d) == set(b) | set(o) == {"compute", "pipeline_bubble", "exposed_comm", "optimizer", "other"}
    assert set(d["exposed_comm"]) == set(b["exposed_comm"]) | set(o["exposed_comm"])
    for key in ("compute", "pipeline_bubble", "optimizer", "other"):
        assert d[key] == pytest.approx(o[key] - b[key], abs=1e-12)
    for kind, value in d["exposed_comm"].items():
        assert value == pytest.approx(o["exposed_comm"].get(kind, 0.0) - b["exposed_comm"].get(kind, 0.0), abs=1e-12)
    assert o["exposed_comm"]["tp"] > 0 and d["exposed_comm"]["tp"] == pytest.approx(o["exposed_comm"]["tp"])


ITERATION = (" [2026-03-04 10:{i:02d}:00] iteration {i:>8d}/      30 | consumed samples: {s:>12d} | elapsed time per "
             "iteration (ms): 2050.0 | learning rate: 1.5E-05 | global batch size:   128 | lm loss: 8.2E+00 | "
             "number of skipped iterations:   0 | number of nan iterations:   0 |")


NAMED = ["--model", "llama3-8b", "--system", "dgx-h100"]


@pytest.mark.parametrize(("given", "missing", "flag"), [
    ([], "model", "--model"),
    (NAMED, "num_gpus", "--gpus"),
    ([*NAMED, "--gpus", "8", "--precision", "bf16"], "micro_batch_size", "--mbs"),
    ([*NAMED, "--gpus", "8", "--precision", "bf16", "--mbs", "1"], "seq_length", "--seq"),
])
def test_log_without_a_required_field_names_the_flag_to_pass(one_line_error, run_cli, tmp_path, given: list[str],
                                                             missing: str, flag: str) -> None:
    """A log without Megatron's argument dump said 'the log does not say num_gpus; ... pass it as a flag', and
    no flag is called --num-gpus (it is --gpus; micro_batch_size is --mbs, seq_length --seq)."""
    log = tmp_path / "run.log"
    log.write_text("\n".join(ITERATION.format(i=i, s=128 * i) for i in range(1, 21)) + "\n", encoding="utf-8")
    err = one_line_error(run_cli("validate", log, *given))
    assert err.endswith(f"the log does not say {missing}; add '{missing}: ...' to run.yaml next to the log "
                        f"or pass {flag}"), err
    from cli.common import SCENARIO_FLAGS  # the named flag is a scenario flag of validate
    assert flag.removeprefix("--") in SCENARIO_FLAGS


def test_compare_too_many_variants_says_which_flags_multiply_and_what_to_use(one_line_error, run_cli) -> None:
    """'32 variants requested; compare runs at most 24' said neither where 32 came from nor what to do."""
    err = one_line_error(run_cli("compare", "--model", "llama3-8b", "--gpus", "64", "--tp", "1,2,4,8",
                                 "--pp", "1,2,4,8", "--mbs", "1,2"))
    assert err == ("error: 32 variants requested (--tp 4 × --pp 4 × --mbs 2 values); compare runs at most 24: "
                   "give fewer values, or write the grid for muonsim sweep"), err


def _log(tmp_path, lines: list[str]):  # noqa: ANN202 - a Path
    log = tmp_path / "run.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return log


def test_log_with_misspelt_iteration_lines_says_which_line_it_could_not_read(one_line_error, run_cli,
                                                                          tmp_path) -> None:
    """Every line said 'iteraton 11/ 30 | ... elapsed time per iteration (ms): 2050.0' and the error was
    "no usable iteration lines ('elapsed time per iteration (ms)') ... (0 found ...)": the lines do hold
    that phrase, so the user looked in the wrong place."""
    lines = [ITERATION.format(i=i, s=128 * i).replace("iteration ", "iteraton ", 1) for i in range(1, 21)]
    err = one_line_error(run_cli("validate", _log(tmp_path, lines), *NAMED, "--gpus", "8"))
    assert "0 found" in err and ("20 lines look like iteration lines but lack 'iteration N/M' or "
                                 "'elapsed time per iteration (ms): X' (the first is line 1)") in err, err


def test_log_shorter_than_the_warmup_says_to_lower_warmup(one_line_error, run_cli, tmp_path) -> None:
    """A 6-iteration log said '(6 found: 6 warm-up, 0 skipped, 0 nan)' without naming --warmup."""
    lines = [ITERATION.format(i=i, s=128 * i) for i in range(1, 7)]
    err = one_line_error(run_cli("validate", _log(tmp_path, lines), *NAMED, "--gpus", "8"))
    assert err.endswith("(6 found: 6 warm-up, 0 skipped, 0 nan); the log ends at iteration 6: "
                        "give --warmup below 6"), err


def test_warmup_hint_counts_the_iterations_a_line_averages(one_line_error, run_cli, tmp_path) -> None:
    """Logged every 5 iterations up to 20: the last line averages iterations 16-20, so it is used only with a
    warm-up below 16 (a warm-up of 19 would still drop it)."""
    lines = [ITERATION.format(i=i, s=128 * i) for i in (5, 10, 15, 20)]
    err = one_line_error(run_cli("validate", _log(tmp_path, lines), *NAMED, "--gpus", "8", "--warmup", "16"))
    assert err.endswith("the log ends at iteration 20: give --warmup below 16"), err
    ok = run_cli("validate", _log(tmp_path, lines), *NAMED, "--gpus", "8", "--precision", "bf16", "--mbs", "1",
                 "--seq", "4096", "--warmup", "15", "--json")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["rows"][0]["measured_step_time_s"] == pytest.approx(2.05)
