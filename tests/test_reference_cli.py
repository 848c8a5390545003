"""`muonsim reference run`: MeasuredRun JSON out, one-line errors, exit codes 2 (bad input) / 1 (failed run)."""

from __future__ import annotations

import json

from workloads.measured import MeasuredRun


def test_run_writes_a_measured_run(run_cli, tmp_path):
    out = tmp_path / "run.json"
    result = run_cli("reference", "run", "--world-size", "2", "--steps", "2", "--layout", "legacy",
                     "--hide-param-gather", "off", "--out", out)
    assert result.exit_code == 0, result.output
    run = MeasuredRun.model_validate(json.loads(out.read_text()))
    assert run.model == "reference-tiny" and run.system == "local-cpu" and run.num_gpus == 2
    assert run.optimizer == "muon" and run.optimizer_distribution == "layer_wise" and run.overlap_param_gather is False
    assert run.step_time_s > 0 and {"forward", "backward", "grad_reduce", "optimizer", "newton_schulz",
                                     "param_gather", "exposed_wait"} <= set(run.phase_times_s)
    assert {c["op"] for c in run.collectives} == {"all_reduce", "all_gather_v"}
    assert run.extra["checks"]["bitwise_equal_serial"] is True
    assert all(v > 0 for v in run.extra["ns_gflops_per_s_by_rank"].values())
    assert "collectives per step" in result.output


def test_bad_arguments_exit_2_with_one_line(run_cli, tmp_path):
    out = tmp_path / "run.json"
    for args, expect in ((("--world-size", "3", "--tp", "2"), "world_size 3 is not divisible by tp 2"),
                         (("--tp-mode", "sideways"), "--tp-mode: must be one of duplicated, distributed, blockwise (got 'sideways')"),
                         (("--world-size", "two"), "--world-size: must be a valid integer"),
                         (("--lr", "fast"), "--lr: must be a valid number"),
                         (("--nesterov", "maybe"), "--nesterov: must be on or off (got 'maybe')"),
                         (("--steps", "0"), "--steps: must be greater than 0 (got 0)"),
                         (("--optimizer", "muon", "--distribution", "element_wise"), "element_wise needs optimizer adamw"),
                         (("--shapes", "nope"), "unknown shapes 'nope'"),
                         (("--world-size", "4", "--tp", "4", "--etp", "3"), "etp 3 must divide tp 4"),
                         (("--custom-coefficients", "1,2", "--ns-coefficients", "custom"), "three numbers")):
        result = run_cli("reference", "run", *args, "--out", out)
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and expect in lines[0], lines
        assert not out.exists()


def test_help_shows_every_runconfig_field_typed_with_its_default():
    """The options are generated from RunConfig: each field's flag, type (or choices) and default."""
    from typer.testing import CliRunner

    from cli.app import app
    from reference.config import run_flags

    text = CliRunner().invoke(app, ["reference", "run", "--help"], env={"COLUMNS": "300"}).output
    rows = {line.split()[1]: line for line in text.splitlines() if line.startswith("│ --")}
    assert "<str>" not in text
    for f in run_flags():
        if f.name in ("backend", "inject_failure"):  # local runs are gloo; the test hook is hidden
            assert f.flag not in rows
            continue
        row = rows[f.flag]
        kind = {"int": "<int>", "float": "<float>", "bool": "<on|off>"}.get(f.kind, "<" + "|".join(f.choices) + ">")
        assert f.kind == "str" or kind in row, (f.flag, row)
        if f.default is not None:
            shown = {True: "on", False: "off"}.get(f.default, f.default) if f.kind == "bool" else f.default
            assert f"[default: {shown}]" in row, (f.flag, row)
        assert f.help.split("(")[0].strip() in row


def test_defaults_are_megatrons():
    """Megatron-Core's defaults where the reference has the setting (issue 13: overlap_param_gather off;
    muon_tp_mode 'blockwise', Megatron-Core 0.16.1 optimizer/optimizer_config.py:278)."""
    from reference.config import make_config

    cfg = make_config()
    assert cfg.hide_param_gather is False
    assert (cfg.tp_mode, cfg.split_qkv, cfg.ns_coefficients, cfg.ns_steps, cfg.scale_mode) == (
        "blockwise", True, "quintic", 5, "spectral")
    assert (cfg.momentum, cfg.nesterov, cfg.weight_decay_method, cfg.matmul_precision, cfg.extra_scale_factor) == (
        0.95, False, "decoupled", "bf16", 1.0)


def test_bool_and_typed_values_reach_the_run_config():
    from reference.launch import config_from_strings

    cfg = config_from_strings({"nesterov": True, "hide_param_gather": "off", "world_size": 4, "lr": 0.5,
                               "tp_mode": "blockwise", "tp": None})
    assert cfg.nesterov and not cfg.hide_param_gather and cfg.world_size == 4 and cfg.lr == 0.5 and cfg.tp == 1


def test_failed_run_exits_1_with_one_line_and_writes_nothing(run_cli, tmp_path):
    out = tmp_path / "run.json"
    result = run_cli("reference", "run", "--world-size", "2", "--steps", "2", "--inject-failure", "0:1:raise",
                     "--out", out)
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "rank 0 failed: RuntimeError: injected failure" in lines[0]
    assert not out.exists()


def _torchrun_rank(rank: int, port: int, out: str) -> None:
    import os

    import torch

    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    from reference.launch import main

    os._exit(main(["--steps", "2", "--tp", "2", "--tp-mode", "distributed", "--out", out]))


def test_launch_module_under_torchrun_environment(tmp_path):
    """The torchrun entry (env:// rendezvous, rank 0 gathers and writes), with ranks forked here."""
    import multiprocessing as mp

    from reference.launch import free_port

    out = tmp_path / "tr.json"
    ctx = mp.get_context("fork")
    port = free_port()
    procs = [ctx.Process(target=_torchrun_rank, args=(r, port, str(out))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    run = MeasuredRun.model_validate(json.loads(out.read_text()))
    assert run.tp == 2 and run.muon_tp_mode == "distributed" and run.num_gpus == 2
    assert {c["phase"] for c in run.collectives} == {"ns_norm", "ns_gram", "grad_reduce", "param_gather"}
    # dp = 1: only the experts (etp = 1, so expert_dp = 2) reduce and gather over data parallel
    assert {c["group"] for c in run.collectives if c["phase"] in ("grad_reduce", "param_gather")} == {"expert_dp"}
