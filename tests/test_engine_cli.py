"""``muonsim predict``: JSON fields, one-line errors, files written only on success."""

from __future__ import annotations

import json

import pytest

REQUIRED = ("step_time_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "breakdown_s", "memory_per_gpu_bytes", "engine")


def test_predict_json_has_the_acceptance_fields(run_cli) -> None:
    res = run_cli("predict", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    for key in REQUIRED:
        assert key in data
    assert data["engine"] == "analytic"
    b = data["breakdown_s"]
    for key in ("compute", "pipeline_bubble", "exposed_comm", "optimizer"):
        assert key in b
    assert {"ep", "pp", "dp_grad", "dp_param"} <= set(b["exposed_comm"])
    total = b["compute"] + b["pipeline_bubble"] + sum(b["exposed_comm"].values()) + b["optimizer"] + b["other"]
    assert total == pytest.approx(data["step_time_s"], rel=1e-6)
    # Megatron-Bridge convention: TFLOP/s = model FLOPs/token x tokens/s
    assert data["model_tflops_per_gpu"] * 1e12 / data["tokens_per_s_per_gpu"] == pytest.approx(204.477e9, rel=1e-3)
    assert data["scenario"]["model"] == "kimi-k2" and data["scenario"]["gpus"] == 256


def test_predict_table_output(run_cli) -> None:
    res = run_cli("predict", "--model", "llama3-8b", "--gpus", "8", "--pp", "1", "--vpp", "1", "--ep", "1",
                  "--gbs", "128", "--seq", "8192", "--optimizer", "adamw")
    assert res.exit_code == 0, res.output
    assert "step time" in res.stdout and "compute" in res.stdout


@pytest.mark.parametrize(("args", "needle"), [
    (("--tp", "3"), "tp·pp·cp"),
    (("--fsdp", "2", "--optimizer", "adamw"), "not supported yet"),
    (("--engine", "fast"), "--engine"),
    (("--trace", "t.json"), "--engine des"),
])
def test_predict_user_errors_are_one_line(run_cli, args, needle) -> None:
    res = run_cli("predict", *args)
    assert res.exit_code == 2
    assert needle in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.output


def test_predict_writes_nothing_on_error(run_cli, tmp_path) -> None:
    out = tmp_path / "r.html"
    res = run_cli("predict", "--tp", "3", "--html", str(out))
    assert res.exit_code == 2 and not out.exists()
    res = run_cli("predict", "--html", str(tmp_path / "missing" / "r.html"))
    assert res.exit_code == 2 and "does not exist" in res.stderr
    (tmp_path / "adir").mkdir()
    res = run_cli("predict", "--engine", "des", "--trace", str(tmp_path / "adir"))
    assert res.exit_code == 2 and "is a directory" in res.stderr and "Traceback" not in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"]  # no half-written temp file
    res = run_cli("predict", "--engine", "des", "--trace", str(tmp_path / "t.json"), "--html", str(tmp_path / "adir"))
    assert res.exit_code == 2 and sorted(p.name for p in tmp_path.iterdir()) == ["adir"]  # not even the trace


def test_predict_applies_a_calibration_profile(run_cli, tmp_path) -> None:
    prof = tmp_path / "cal.yaml"
    prof.write_text("name: test\nsystems:\n  gb300-nvl72:\n    factors: {gemm_fp8: 0.9, grouped_gemm: 1.0}\n")
    base = json.loads(run_cli("predict", "--json", "--calibration", "none").stdout)  # datasheet gemm_fp8 0.6
    assert base["calibration"] == "datasheet defaults"
    res = run_cli("predict", "--json", "--calibration", str(prof))
    assert res.exit_code == 0, res.output
    cal = json.loads(res.stdout)
    assert cal["step_time_s"] < base["step_time_s"]
    assert "test" in cal["calibration"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("systems:\n  gb300-nvl72:\n    factors: {gemm_fp9: 0.9}\n")
    res = run_cli("predict", "--calibration", str(bad))
    assert res.exit_code == 2 and "gemm_fp9" in res.stderr


def test_predict_reads_a_scenario_file(run_cli, tmp_path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text("model: llama3-8b\ngpus: 8\nprecision: fp8-cs\nparallelism: {tp: 1, pp: 1, global_batch_size: 128,"
                 " micro_batch_size: 2, seq_length: 8192}\noptimizer: {kind: adamw}\n")
    res = run_cli("predict", str(f), "--json", "--engine", "des")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["scenario"]["model"] == "llama3-8b" and data["engine"] == "des"
    assert data["breakdown_s"]["pipeline_bubble"] == 0.0


def test_nvfp4_on_a_gpu_without_fp4_is_an_error(run_cli) -> None:
    """H100 has no FP4 (and no block-scaled) tensor cores: NVFP4 is a one-line error, not a warning
    beside a prediction faster than FP8 (issue 14)."""
    args = ("predict", "--system", "dgx-h100", "--model", "llama3-8b", "--gpus", "8", "--pp", "1", "--vpp", "1",
            "--ep", "1", "--gbs", "128", "--precision", "nvfp4", "--json")
    result = run_cli(*args)
    assert result.exit_code == 2 and "precision nvfp4 is not supported" in result.stderr
    on_b200 = run_cli(*args[:2], "dgx-b200", *args[3:])
    assert on_b200.exit_code == 0, on_b200.output
    assert not any("FP4" in w for w in json.loads(on_b200.stdout)["warnings"])


def test_predict_release_takes_that_releases_recipe_settings(run_cli, tmp_path) -> None:
    flags = ("--model", "deepseek-v3", "--gpus", "256", "--pp", "2", "--vpp", "8", "--ep", "32", "--mbs", "1",
             "--gbs", "4096", "--optimizer", "adamw")
    # muonsim's settings: a file whose sections replace the defaults' (which carry a recipe's settings)
    bare = tmp_path / "bare.yaml"
    bare.write_text("parallelism: {global_batch_size: 4096, seq_length: 4096}\noptimizer: {}\nruntime: {}\n",
                    encoding="utf-8")
    plain = json.loads(run_cli("predict", "--json", str(bare), *flags).stdout)
    res = run_cli("predict", "--json", *flags, "--release", "26.06")
    assert res.exit_code == 0, res.output
    rel = json.loads(res.stdout)
    settings = rel["recipe_settings"]
    assert plain["recipe_settings"] is None and "release 26.06" in settings["source"]
    assert settings["applied"]["cuda_graph_impl"] == "full_iteration" and settings["applied"]["ep_comm_overlap"] is True
    assert "micro_batch_size" not in settings["applied"]  # a flag the user gave is kept
    assert "micro_batch_size" in rel["layout"]["set_by_user"] and "cuda_graph_impl" not in rel["layout"]["set_by_user"]
    assert rel["step_time_s"] < plain["step_time_s"]  # graphs and EP overlap
    text = run_cli("predict", *flags, "--release", "26.06").stdout
    assert "recipe settings: megatron_bridge_recipe_settings.csv: run mb-26.06-deepseek-v3" in " ".join(text.split())
    bad = run_cli("predict", "--release", "latest")
    assert bad.exit_code == 2 and "not a release tag" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    # a model the file never ran keeps muonsim's defaults
    assert json.loads(run_cli("predict", "--json", "--release", "26.06").stdout)["recipe_settings"] is None


def test_predict_release_names_the_recipe_runs_layout_when_it_is_not_the_predictions(run_cli) -> None:
    """--release takes the recipe settings, not the layout: the 25.11 H100 Qwen3-30B run (summary table:
    16 GPUs, pp 2, vpp 24, ep 8, etp 1, mbs 2, gbs 512, seq 4096) differs from the model x system default
    layout (the 26.06 run: pp 1, vpp 1, ep 16, mbs 1, gbs 1024) in pp, vpp, ep, mbs and gbs, and the output
    names exactly those flags; with them given there is no such line."""
    model = ("--model", "qwen3-30b-a3b", "--system", "dgx-h100", "--release", "25.11")
    text = " ".join(run_cli("predict", *model).stdout.split())
    assert "that run's layout: --pp 2 --vpp 24 --ep 8 --mbs 2 --gbs 512" in text
    same = run_cli("predict", "--json", *model, "--pp", "2", "--vpp", "24", "--ep", "8", "--mbs", "2", "--gbs", "512")
    assert json.loads(same.stdout)["recipe_settings"]["run_layout"] == {
        "gpus": 16, "precision": "fp8-cs", "tp": 1, "pp": 2, "vpp": 24, "cp": 1, "ep": 8, "etp": 1,
        "fsdp": 0, "micro_batch_size": 2, "global_batch_size": 512, "seq_length": 4096}
    assert "layout: not the recipe run's" not in run_cli("predict", *model, "--pp", "2", "--vpp", "24", "--ep", "8",
                                                       "--mbs", "2", "--gbs", "512").stdout


def test_predict_release_says_when_the_model_never_ran_on_the_system(run_cli) -> None:
    """Kimi K2 has no Megatron-Bridge recipe run on any system: --release applies no recipe settings, and
    predict says so (text and --json warnings) instead of ignoring the flag without a word; the numbers are
    those without --release."""
    plain = json.loads(run_cli("predict", "--json").stdout)
    res = run_cli("predict", "--json", "--release", "26.02")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["recipe_settings"] is None and data["step_time_s"] == plain["step_time_s"]
    notes = [w for w in data["warnings"] if "--release 26.02" in w]
    assert len(notes) == 1 and "no Megatron-Bridge recipe run of kimi-k2 on gb300-nvl72" in notes[0], data["warnings"]
    assert not any("--release" in w for w in plain["warnings"])
    text = " ".join(run_cli("predict", "--release", "26.02").stdout.split())
    assert "--release 26.02 applies no recipe settings: no Megatron-Bridge recipe run of kimi-k2 on gb300-nvl72" in text
    compared = " ".join(run_cli("compare", "--optimizer", "adamw,muon", "--release", "26.02").stdout.split())
    assert "--release 26.02 applies no recipe settings" in compared


def test_compare_release_names_the_recipe_run_its_settings_come_from(run_cli) -> None:
    """compare --release applied a run's recipe settings without naming the run (predict does): the text
    and each --json variant now say which run (here DeepSeek-V3's 26.06 run on 256 GB300)."""
    flags = ("compare", "--model", "deepseek-v3", "--optimizer", "adamw,muon", "--release", "26.06")
    text = " ".join(run_cli(*flags).stdout.split())
    assert "recipe settings: megatron_bridge_recipe_settings.csv: run mb-26.06-deepseek-v3-gb300-nvl72" in text
    data = json.loads(run_cli(*flags, "--json").stdout)
    runs = {v["recipe_settings"]["run_id"] for v in data["variants"]}
    assert len(runs) == 1 and runs.pop().startswith("mb-26.06-deepseek-v3-gb300-nvl72"), runs
    plain = json.loads(run_cli("compare", "--model", "deepseek-v3", "--optimizer", "adamw,muon", "--json").stdout)
    assert all(v["recipe_settings"] is None for v in plain["variants"])


def test_predict_says_when_a_setting_you_gave_has_no_effect(run_cli) -> None:
    """--fp8-param-gather on with Muon (the AdamW path only) and --tp-mode with tp = etp = 1 change nothing;
    the optimizer plan knew it (--json optimizer.notes) but the table did not say so. A note line now names
    the setting you gave; settings you did not give stay quiet."""
    fp8 = " ".join(run_cli("predict", "--fp8-param-gather", "on").stdout.split())
    assert "note: fp8_param_gather has no effect: it is the element-wise distributed optimizer's (AdamW) path" in fp8
    mode = " ".join(run_cli("predict", "--tp-mode", "distributed").stdout.split())
    assert "note: tp = etp = 1: every Newton-Schulz call is local, tp_mode has no effect" in mode
    plain = run_cli("predict").stdout
    assert "has no effect" not in plain
