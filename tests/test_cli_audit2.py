"""Defects a second new-user audit of the CLI found: each test runs the command as a user would and asserts
the exact behaviour (one-line errors with exit code 2 that say what would be valid, warnings that say what
to change)."""

from __future__ import annotations

import re

import pytest

# (scenario file text, the unknown key's path, the suggestion)
MISSPELT_KEYS = [
    ("model: llama3-8b\ngpus: 8\nparalelism: {tp: 2}\n", "paralelism", "parallelism"),
    ("model: llama3-8b\ngpus: 8\nparallelism: {tp: 2, mbs: 2}\n", "parallelism.mbs", "micro_batch_size"),
    ("model: llama3-8b\ngpus: 8\noptimizer: {kind: muon, tpmode: distributed}\n", "optimizer.tpmode", "tp_mode"),
    ("model: llama3-8b\ngpu: 8\n", "gpu", "gpus"),
]


@pytest.mark.parametrize(("text", "path", "suggestion"), MISSPELT_KEYS, ids=[k[1] for k in MISSPELT_KEYS])
def test_misspelt_scenario_key_names_the_key_it_resembles(one_line_error, run_cli, tmp_path, text: str, path: str,
                                                          suggestion: str) -> None:
    """'paralelism: Extra inputs are not permitted' named neither the key meant nor the valid ones (a flag name
    such as mbs in a scenario file got the same words). The error now says which key it resembles."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(text, encoding="utf-8")
    err = one_line_error(run_cli("predict", str(scenario)))
    assert f"{path}: unknown key; did you mean '{suggestion}'?" in err, err
    assert "Extra inputs" not in err, err


def test_unknown_scenario_key_with_no_close_match_lists_the_valid_keys(one_line_error, run_cli, tmp_path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text("model: llama3-8b\nplacement: {zzz: 1}\n", encoding="utf-8")
    err = one_line_error(run_cli("predict", str(scenario)))
    assert "placement.zzz: unknown key (valid: gpus_per_domain, " in err, err


def test_misspelt_grid_setting_names_the_setting_it_resembles(one_line_error, run_cli, tmp_path) -> None:
    """'grid.gpu: unknown setting' listed only the families of valid names."""
    grid = tmp_path / "grid.yaml"
    grid.write_text("grid:\n  model: [llama3-8b]\n  gpu: [8, 16]\n", encoding="utf-8")
    err = one_line_error(run_cli("sweep", str(grid), "--out", str(tmp_path / "out")))
    assert "grid.gpu: unknown setting; did you mean 'gpus'?" in err, err
    assert not (tmp_path / "out").exists()


# (argv, what the user typed, the catalogue name it resembles)
MISSPELT_NAMES = [
    (["predict", "--model", "llama3_70b"], "model 'llama3_70b'", "llama3-70b"),
    (["describe", "kimi"], "model 'kimi'", "kimi-k2"),
    (["predict", "--system", "gb300"], "system 'gb300'", "gb300-nvl72"),
    (["topology", "--system", "dgx-h10"], "system 'dgx-h10'", "dgx-h100"),
    (["collective", "allreduce", "--gpus", "8"], "collective 'allreduce'", "all_reduce"),
    (["validate", "--dataset", "megatron-bridg"], "dataset 'megatron-bridg'", "megatron-bridge"),
]


@pytest.mark.parametrize(("argv", "typed", "suggestion"), MISSPELT_NAMES, ids=[" ".join(c[0][:3]) for c in MISSPELT_NAMES])
def test_misspelt_catalogue_name_names_the_one_it_resembles(one_line_error, run_cli, argv: list[str], typed: str,
                                                            suggestion: str) -> None:
    """'unknown model 'kimi'; known: ...' left the user to find 'kimi-k2' in a list of nine; the snake_case
    spelling of a dashed name (llama3_70b) and an abbreviated system (gb300) the same."""
    err = one_line_error(run_cli(*argv))
    assert f"unknown {typed} (did you mean '{suggestion}'?); " in err, err


def test_unrelated_catalogue_name_still_lists_the_known_ones(one_line_error, run_cli) -> None:
    err = one_line_error(run_cli("predict", "--model", "gpt-zzz"))
    assert err.startswith("error: unknown model 'gpt-zzz'; known: deepseek-v3, ") and "did you mean" not in err, err


@pytest.mark.parametrize(("name", "valid", "expected"), [
    ("mbs", ["micro_batch_size", "global_batch_size"], "micro_batch_size"),
    ("gbs", ["micro_batch_size", "global_batch_size"], "global_batch_size"),
    ("tp-mode", ["tp_mode", "tp"], "tp_mode"),
    ("kimi", ["kimi-k2", "llama3-8b"], "kimi-k2"),
    ("llama3", ["llama3-8b", "llama3-70b"], None),  # two names start with it: no guess
    ("paralelism", ["parallelism", "placement"], "parallelism"),
    ("xyz", ["parallelism", "placement"], None),
])
def test_did_you_mean_by_hand(name: str, valid: list[str], expected: str | None) -> None:
    from topologies.inputs import did_you_mean

    assert did_you_mean(name, valid) == expected


@pytest.mark.parametrize(("name", "expected"), [
    ("ppp", "pp"), ("seq_lenght", "seq_length"), ("mbs", "micro_batch_size"), ("step-time-s", "step_time_s"),
    ("tokens", None), ("source_url", None), ("seq", None),
])
def test_likely_misspelling_by_hand(name: str, expected: str | None) -> None:
    """Refusing a column needs near certainty: 'ppp' vs 'pp' is 2*2/5 = 0.8 alike (difflib ratio), 'seq_lenght' vs
    'seq_length' 0.9; 'source_url' vs 'source' is 2*6/16 = 0.75 and 'tokens' only begins tokens_per_s_per_gpu."""
    from topologies.inputs import likely_misspelling

    valid = ["pp", "seq_length", "micro_batch_size", "step_time_s", "tokens_per_s_per_gpu", "source"]
    assert likely_misspelling(name, valid) == expected


TOO_BIG = ["--pp", "1", "--vpp", "1", "--ep", "8", "--mbs", "8"]  # Kimi K2 on 256 GB300: 1,754.7 GB per GPU of 279


def test_layout_that_does_not_fit_says_by_how_much_and_what_to_change(run_cli) -> None:
    """'memory/GPU 1,754.7 GB of 279 GB (does NOT fit)' and nothing else: not by how much, not which part,
    not what to change. A warning now says all three (the figures: 1,754.7 - 279 = 1,475.7 GB over, 6.3x;
    the largest parts activations 610.7 GB and gradients 554.2 GB)."""
    import json

    data = json.loads(run_cli("predict", *TOO_BIG, "--json").stdout)
    mem = data["memory"]
    assert not mem["fits"] and round(mem["total_bytes"] / 1e9, 1) == 1754.7 and mem["capacity_bytes"] == 279e9
    advice = [w for w in data["warnings"] if w.startswith("does not fit in memory")]
    assert advice == [
        "does not fit in memory: 1,754.7 GB per GPU of 279.0 GB (1,475.7 GB over, 6.3x); largest parts: "
        "activations 610.7 GB, gradients 554.2 GB, weight buffers 280.6 GB; activations shrink with --recompute "
        "selective or full, a smaller --mbs, or more --tp or --cp; weights, their buffers and gradients with "
        "more --pp, --tp or --ep; 'muonsim plan' searches the layouts that fit"], advice
    text = " ".join(run_cli("predict", *TOO_BIG).stdout.split())
    assert "warning: does not fit in memory: 1,754.7 GB per GPU of 279.0 GB (1,475.7 GB over, 6.3x)" in text, text
    compare = " ".join(run_cli("compare", *TOO_BIG, "--optimizer", "adamw,muon").stdout.split())
    assert "warning: (optimizer=muon) does not fit in memory: 1,754.7 GB per GPU" in compare, compare
    assert "warning: (optimizer=adamw) does not fit in memory: " in compare, compare


def test_layout_that_fits_gets_no_memory_warning(run_cli) -> None:
    import json

    data = json.loads(run_cli("predict", "--json").stdout)
    assert data["memory"]["fits"] and not [w for w in data["warnings"] if "does not fit" in w]


RUNS_HEADER = "run_id,model,system,num_gpus,precision,global_batch_size,micro_batch_size,seq_length,tp,pp,ep,step_time_s"
RUNS_ROW = "r2,llama3-70b,gb300-nvl72,64,bf16,256,1,8192,2,4,1,5.0"


@pytest.mark.parametrize(("old", "new", "suggestion"), [
    (",pp,", ",ppp,", "pp"),  # optional: was silently kept as extra data, and the run predicted with pp 1
    ("seq_length", "seq_lenght", "seq_length"),  # required: was 'missing column' with no word on the typo
    ("micro_batch_size", "mbs", "micro_batch_size"),  # the flag's name
])
def test_misspelt_runs_csv_column_is_refused_naming_the_column_meant(one_line_error, run_cli, tmp_path, old: str, new: str,
                                                                     suggestion: str) -> None:
    """A runs CSV whose 'pp' column was typed 'ppp' was read without a word: the column went to the run's
    extra data and the run was predicted with pp 1 (9.455 s instead of 10.559 s, against a measured 5.0 s).
    A column the schema does not know but that resembles one of its absent columns is now an error."""
    path = tmp_path / "runs.csv"
    path.write_text(f"{RUNS_HEADER.replace(old, new)}\n{RUNS_ROW}\n", encoding="utf-8")
    err = one_line_error(run_cli("validate", str(path)))
    assert f"column '{new.strip(',')}': not a column of the measured-run schema; did you mean '{suggestion}'?" in err, err


@pytest.mark.parametrize("extra", ["cluster", "tokens", "source_url", "precision_mode", "step_s"])
def test_runs_csv_with_extra_columns_unlike_the_schema_still_loads(run_cli, tmp_path, extra: str) -> None:
    """Extra data columns load (as the run's extra data) unless almost surely a misspelt schema column: a
    column that begins a schema column's name ('tokens': tokens_per_s_per_gpu) or shares most of its letters
    ('source_url': source, 'precision_mode': precision) is a column of its own."""
    path = tmp_path / "runs.csv"
    path.write_text(f"{RUNS_HEADER},{extra}\n{RUNS_ROW},x\n", encoding="utf-8")
    result = run_cli("validate", str(path), "--json")
    assert result.exit_code == 0, result.stderr


def test_misspelt_runs_json_key_is_refused(one_line_error, run_cli, tmp_path) -> None:
    import json

    run = dict(zip(RUNS_HEADER.split(","), RUNS_ROW.split(","), strict=True)) | {"tp": 2}
    run["ppp"] = run.pop("pp")
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([run]), encoding="utf-8")
    err = one_line_error(run_cli("validate", str(path)))
    assert "entry 1, column 'ppp': not a column of the measured-run schema; did you mean 'pp'?" in err, err


@pytest.mark.parametrize(("text", "expected"), [
    ("model: llama3-8b\noptimizer: muon\n", "optimizer: expected a mapping of its settings, e.g. optimizer: {kind: muon} "
                                            "(got 'muon')"),
    ("model: llama3-8b\nparallelism: [1, 2]\n", "parallelism: expected a mapping of its settings (keys: tp, pp, vpp, "),
    ("model: llama3-8b\nplacement: 8\n", "placement: expected a mapping of its settings (keys: gpus_per_domain, "),
])
def test_scenario_section_that_is_not_a_mapping_says_how_to_write_it(one_line_error, run_cli, tmp_path, text: str,
                                                                     expected: str) -> None:
    """'optimizer: muon' (as --optimizer muon and a grid's optimizer axis take it) got pydantic's 'Input should
    be a valid dictionary or instance of OptimizerSpec': a class name the user never sees. The error now shows
    the mapping to write."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(text, encoding="utf-8")
    err = one_line_error(run_cli("predict", str(scenario)))
    assert expected in err and "instance of" not in err, err


def test_plan_with_no_fitting_layout_says_how_close_the_smallest_came(run_cli) -> None:
    """'plan --model llama3.1-405b --gpus 8' printed 'no plan fits in memory and passes the validator' and the
    search statistics: not how far the best candidate was from fitting, nor what to change. A note now names
    the layout that needs the least memory, by how much it misses the budget, and the remedies."""
    import json
    import re

    result = run_cli("plan", "--model", "llama3.1-405b", "--gpus", "8", "--optimizer", "muon", "--json",
                     "--samples", "0", "--top-k", "0")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ranking"] == [] and data["memory_budget_bytes"] == pytest.approx(0.9 * 279e9)
    notes = [n for n in data["notes"] if n.startswith("no screened layout fits in memory")]
    assert len(notes) == 1, data["notes"]
    # recompute none, selective and full are all searched, and the smallest needs more than the whole 279 GB:
    # only more GPUs can help
    m = re.fullmatch(r"no screened layout fits in memory: the one needing the least, (.+), needs ([\d,.]+) GB per "
                     r"GPU, ([\d,.]+) GB over the 251\.1 GB budget; more GPUs \(--gpus\) may fit", notes[0])
    assert m is not None, notes[0]
    need, over = float(m.group(2).replace(",", "")), float(m.group(3).replace(",", ""))
    assert need > 279 and over == pytest.approx(need - 251.1, abs=0.11)
    assert m.group(1).startswith("tp") and " pp" in m.group(1)
    text = " ".join(run_cli("plan", "--model", "llama3.1-405b", "--gpus", "8", "--optimizer", "muon",
                            "--samples", "0", "--top-k", "0").stdout.split())
    assert "note: no screened layout fits in memory: the one needing the least, " in text, text
    pinned = json.loads(run_cli("plan", "--model", "llama3.1-405b", "--gpus", "8", "--optimizer", "muon", "--json",
                                "--samples", "0", "--top-k", "0", "--recompute", "none,selective").stdout)
    assert [n for n in pinned["notes"] if n.startswith("no screened")][0].endswith(
        "more GPUs (--gpus) or --recompute full may fit")


def test_trace_and_html_to_the_same_file_is_refused(one_line_error, run_cli, tmp_path) -> None:
    """'predict --engine des --trace out.html --html out.html' said 'wrote out.html' twice: the page replaced
    the trace without a word. Two outputs to one file are now refused before any work, and nothing is written."""
    out = tmp_path / "out.html"
    err = one_line_error(run_cli("predict", "--engine", "des", "--trace", str(out), "--html", str(tmp_path / "." / "out.html")))
    assert f"--trace and --html would both write '{out}'" in err, err
    assert not out.exists()


def test_collective_size_range_error_names_its_unit(one_line_error, run_cli) -> None:
    """'need 0 < --min-size <= --max-size, got 8e+09 and 1e+06': two bare numbers in exponent notation, after
    the user typed 8GB and 1MB. The sizes are now bytes, written out and named."""
    err = one_line_error(run_cli("collective", "all_reduce", "--gpus", "8", "--min-size", "8GB", "--max-size", "1MB"))
    assert err.startswith("error: need 0 < --min-size <= --max-size, got 8,000,000,000 B and 1,000,000 B"), err


# ------------------------------------------------------------------ round 2 of the audit
@pytest.mark.parametrize(("argv", "expected"), [
    (["--tp", "0"], "error: --tp: must be greater than 0 (got 0)"),
    (["--mbs", "two"], "error: --mbs: must be a valid integer, unable to parse string as an integer (got two)"),
    (["--optimizer", "sgd"], "error: --optimizer: must be 'adamw' or 'muon' (got sgd)"),
])
def test_bad_flag_value_names_the_flag_not_the_yaml_path(one_line_error, run_cli, argv: list[str], expected: str) -> None:
    """'predict --tp 0' said 'scenario: parallelism.tp: Input should be greater than 0 (got '0')': a YAML path the
    user never typed and the number shown as a string. The error now names the flag and the value as typed."""
    assert one_line_error(run_cli("predict", *argv)) == expected


def test_bad_file_value_keeps_its_yaml_path(one_line_error, run_cli, tmp_path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text("model: llama3-8b\nparallelism: {tp: 0}\n", encoding="utf-8")
    err = one_line_error(run_cli("predict", str(scenario)))
    assert err == f"error: scenario file '{scenario}': parallelism.tp: Input should be greater than 0 (got 0)", err


def test_plan_whose_weights_alone_exceed_memory_is_an_empty_answer_like_any_no_fit(run_cli) -> None:
    """'plan' with no layout that fits exited 0 when every screened layout was out of memory but 2 (a usage error)
    when the weights and gradients alone exceeded memory: the same answer, 'nothing fits', with two exit codes. A
    search that ran and found nothing is a result (sweep records it as one): exit 0, an empty ranking and a note.
    Llama 3.1 405B on one GB300: 405.9e9 parameters need at least 405.9 GB at one byte each, over the 251.1 GB
    budget (0.9 x 279 GB)."""
    import json

    result = run_cli("plan", "--model", "llama3.1-405b", "--gpus", "1", "--json", "--samples", "0", "--top-k", "0")
    assert result.exit_code == 0, (result.exit_code, result.stderr)
    data = json.loads(result.stdout)
    assert data["ranking"] == [] and data["best"] is None
    assert data["stats"]["layouts_over_memory_by_weights"] == data["stats"]["valid_layouts"] >= 1
    notes = [n for n in data["notes"] if n.startswith("no layout fits in memory")]
    assert len(notes) == 1, data["notes"]
    m = __import__("re").fullmatch(r"no layout fits in memory: the weights and gradients alone need at least "
                                   r"([\d,.]+) GB per GPU, over the 251\.1 GB budget; more GPUs \(--gpus\) may fit",
                                   notes[0])
    assert m is not None and float(m.group(1).replace(",", "")) > 405.9, notes[0]
    text = run_cli("plan", "--model", "llama3.1-405b", "--gpus", "1", "--samples", "0", "--top-k", "0")
    assert text.exit_code == 0 and "note: no layout fits in memory" in " ".join(text.stdout.split()), text.stdout


def test_sweep_plan_point_whose_weights_alone_exceed_memory_says_why(run_cli, tmp_path) -> None:
    """sweep recorded both no-fit cases as status 'no_plan' (so plan's exit code 2 for one was the odd one out);
    its message now carries plan's note instead of a generic sentence."""
    import csv

    grid = tmp_path / "g.yaml"
    grid.write_text("grid:\n  mode: [plan]\n  model: [llama3.1-405b]\n  gpus: [1]\n", encoding="utf-8")
    assert run_cli("sweep", str(grid), "--out", str(tmp_path / "out"), "--jobs", "1").exit_code == 0
    with open(tmp_path / "out" / "results.csv", encoding="utf-8") as f:
        (row,) = list(csv.DictReader(f))
    assert row["status"] == "no_plan"
    assert row["message"].startswith("no layout fits in memory: the weights and gradients alone need at least "), row


def test_compare_prints_no_negative_zero(run_cli) -> None:
    """'compare --optimizer adamw,muon' printed 'imbalance lost ms -0.0' for AdamW (a float difference of about
    -1e-18 s rounded to one decimal): a loss of minus nothing. Zero is printed 0.0."""
    text = run_cli("compare", "--optimizer", "adamw,muon").stdout
    (line,) = [ln for ln in text.splitlines() if ln.strip().startswith("imbalance lost ms")]
    assert line.split()[3] == "0.0", line
    assert re.search(r"(?<![\w.])-0(\.0+)?(?![\w.])", text) is None, text


@pytest.mark.parametrize(("cell", "shown"), [
    ("-0.0", "0.0"), ("-0", "0"), ("-0.000 ms", "0.000 ms"), ("(-0.0 ms)", "(0.0 ms)"), ("1.5 / -0.0", "1.5 / 0.0"),
    ("-0.05", "-0.05"), ("-10.0", "-10.0"), ("+0.0", "+0.0"), ("x-0.0", "x-0.0"), ("-0.0.1", "-0.0.1"),
])
def test_no_negative_zero_by_hand(cell: str, shown: str) -> None:
    from cli.terminal import no_negative_zero

    assert no_negative_zero(cell) == shown


def test_validate_prints_no_negative_zero(run_cli) -> None:
    """'validate --dataset megatron-bridge' printed an error of '-0.0' % for the runs predicted within 0.05 %."""
    text = run_cli("validate", "--dataset", "megatron-bridge", "--wide").stdout
    assert re.search(r"(?<![\w.])-0(\.0+)?(?![\w.])", text) is None, text


@pytest.mark.parametrize(("count", "noun", "text"), [
    (1, "run", "1 run"), (0, "run", "0 runs"), (2, "fitted factor", "2 fitted factors"), (1, "NVLink domain", "1 NVLink domain"),
    (1_536, "point", "1536 points"), (2, "leaf", "2 leaves"),
])
def test_plural_by_hand(count: int, noun: str, text: str) -> None:
    from topologies.inputs import plural

    assert plural(count, noun, "leaves" if noun == "leaf" else None) == text


def test_counts_of_one_are_singular(run_cli, tmp_path) -> None:
    """'1 on 1 workers', '1 points', '1 fitted factors', 'over 1 NVLink domain(s)': a count of one now takes the
    singular everywhere the CLI prints a count with its noun."""
    text = " ".join(run_cli("collective", "all_reduce", "--gpus", "8", "--tp", "2", "--group", "tp", "--size", "1MB").stdout.split())
    assert "group 'tp' of 2 ranks over 1 NVLink domain, 2 per domain" in text, text
    text = " ".join(run_cli("topology", "--gpus", "8").stdout.split())
    assert "8 GPUs on 1 NVLink domain of 72" in text and "the occupied domain holds 72 (18 per rail per domain), 1 plane" in text, text
    grid = tmp_path / "g.yaml"
    grid.write_text("grid:\n  model: [llama3-8b]\n  gpus: [8]\n", encoding="utf-8")
    text = " ".join(run_cli("sweep", str(grid), "--out", str(tmp_path / "out"), "--jobs", "1").stdout.split())
    assert f"sweep {grid}: 1 point (1 ok)" in text and "computed now: 1 on 1 worker in " in text, text
    runs = tmp_path / "runs.csv"
    runs.write_text(f"{RUNS_HEADER}\n{RUNS_ROW}\n", encoding="utf-8")
    assert run_cli("validate", str(runs), "--html", str(tmp_path / "v.html")).exit_code == 0
    assert "1 run from " in (tmp_path / "v.html").read_text(encoding="utf-8")


def test_calibration_label_of_one_factor_is_singular() -> None:
    from costmodel.calibrate.profile import default_profile

    profile = default_profile()
    system = next(iter(profile.systems))
    one = profile.model_copy(update={"systems": {system: profile.systems[system].model_copy(
        update={"factors": dict(list(profile.systems[system].factors.items())[:1])})}})
    assert one.label(system).endswith(": 1 fitted factor)"), one.label(system)


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_inventory_stage_without_tensors_is_refused(one_line_error, run_cli, extra: list[str]) -> None:
    """'inventory --stage 3' printed the per-stage tables of every stage, the --stage silently ignored (it picks
    the stage whose tensors --tensors lists). It now says so, before any work."""
    err = one_line_error(run_cli("inventory", "--stage", "3", *extra))
    assert err == "error: --stage needs --tensors (it picks the pipeline stage whose tensors are listed)", err


def test_inventory_stage_with_tensors_lists_that_stage(run_cli) -> None:
    import json

    data = json.loads(run_cli("inventory", "--tensors", "--stage", "3", "--json").stdout)
    assert data["tensors"] and {t["stage"] for t in data["tensors"]} == {3}


MY_8B = ("{name: my-8b, num_layers: 32, hidden_size: 4096, ffn_hidden_size: 14336, vocab_size: 128256, "
         "attention: {kind: gqa, num_heads: 32, num_kv_heads: 8, head_dim: 128}}")


def test_inline_model_mapping_is_accepted_as_a_model_spec(run_cli, tmp_path) -> None:
    """'model: {name: ..., num_layers: ...}' in a scenario file (as the schema's 'inline architecture' allows) was
    reported as \"unknown model '{'name': ...}'\": the mapping looked up as a catalogue name. It is now validated
    as a model spec, and predicts exactly what the same fields in a model YAML file predict."""
    import json

    import yaml

    (tmp_path / "my-8b.yaml").write_text(yaml.safe_dump(yaml.safe_load(MY_8B)), encoding="utf-8")
    inline, by_file = tmp_path / "inline.yaml", tmp_path / "by_file.yaml"
    inline.write_text(f"model: {MY_8B}\ngpus: 8\n", encoding="utf-8")
    by_file.write_text("model: my-8b.yaml\ngpus: 8\n", encoding="utf-8")
    a, b = run_cli("predict", str(inline), "--json"), run_cli("predict", str(by_file), "--json")
    assert a.exit_code == 0 and b.exit_code == 0, (a.stderr, b.stderr)
    a_json, b_json = json.loads(a.stdout), json.loads(b.stdout)
    assert a_json["step_time_s"] == b_json["step_time_s"] and a_json["scenario"]["model"]["name"] == "my-8b"
    text = " ".join(run_cli("predict", str(inline)).stdout.split())
    assert "my-8b (inline) on 8 x gb300-nvl72" in text and "'hidden_size'" not in text, text


def test_inline_model_mapping_with_a_missing_field_names_it(one_line_error, run_cli, tmp_path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text("model: {name: tiny, num_layers: 2}\ngpus: 8\n", encoding="utf-8")
    err = one_line_error(run_cli("predict", str(scenario)))
    assert err.startswith(f"error: scenario file '{scenario}': model.hidden_size: Field required"), err


def test_release_prints_tp_comm_overlap_cfg_in_the_flags_syntax(run_cli, monkeypatch) -> None:
    """'predict --model llama3-70b --release 26.06' printed tp_comm_overlap_cfg as raw Python dicts
    ({'gemm': 'qkv_dgrad', 'num_sm': 4, 'cga_size': 2, 'set_sm_margin': False, 'method': 'bulk'}+...). It is now
    written as --tp-comm-overlap-cfg takes it, GEMM:METHOD[:NUM_SM], with the fields that syntax cannot hold and
    that differ from their defaults in brackets (Megatron-Bridge 26.06's llama3-70b GB300 recipe: qkv_dgrad is
    BulkOverlapCfg(num_sm=4, cga_size=2, set_sm_margin=False))."""
    monkeypatch.setenv("COLUMNS", "2000")
    text = " ".join(run_cli("predict", "--model", "llama3-70b", "--release", "26.06").stdout.split())
    (cfg,) = re.findall(r"tp_comm_overlap_cfg=(\S+)", text)
    assert "{" not in cfg and "'" not in cfg, cfg
    entries = cfg.rstrip(",").split("+")
    assert entries[0] == "qkv_dgrad:bulk:4[cga_size=2]", entries
    assert all(re.fullmatch(r"\w+:(bulk|ring_exchange|pipeline)(:\d+)?(\[[\w=,.]+\])?", e) for e in entries), entries


@pytest.mark.parametrize(("entries", "text"), [
    (({"gemm": "qkv_dgrad", "method": "bulk", "num_sm": 4, "cga_size": 2, "set_sm_margin": False},),
     "qkv_dgrad:bulk:4[cga_size=2]"),
    (({"gemm": "proj_fprop", "method": "ring_exchange"}, {"gemm": "fc2_fprop", "method": "pipeline", "num_sm": 8,
                                                         "num_splits": 4, "atomic_gemm": True}),
     "proj_fprop:ring_exchange+fc2_fprop:pipeline:8[num_splits=4,atomic_gemm=True]"),
    ((), "[]"),
])
def test_tp_overlap_text_by_hand(entries: tuple, text: str) -> None:
    from workloads.runtime import parse_tp_overlap_cfg, tp_overlap_text

    assert tp_overlap_text(entries) == text
    if "[" not in text:  # the flag's syntax reads it back
        assert tp_overlap_text(parse_tp_overlap_cfg(text)) == text


def _all_commands() -> list[list[str]]:
    from typer.main import get_command

    from cli.app import app

    root = get_command(app)
    out = []
    for name, cmd in root.commands.items():  # type: ignore[attr-defined]
        out.append([name])
        out += [[name, sub] for sub in getattr(cmd, "commands", {})]
    return out


TYPER_METAVAR = re.compile(r"<(path|str|int|float|text|integer|list\[\w+\]|int range|float range)>")


@pytest.mark.parametrize("argv", _all_commands(), ids=lambda a: " ".join(a))
def test_help_shows_named_metavars_not_typers_types(run_cli, monkeypatch, argv: list[str]) -> None:
    """'validate --help' and 'calibrate --help' showed typer's default metavars (<path>, <str>, <int range> [x>=0],
    <list[Path]>) where the other options read FILE, NAME, INT: every value now has a named metavar."""
    monkeypatch.setenv("COLUMNS", "200")
    text = run_cli(*argv, "--help").stdout
    assert TYPER_METAVAR.search(text) is None, TYPER_METAVAR.findall(text)
