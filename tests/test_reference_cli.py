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
                         (("--tp-mode", "sideways"), "tp_mode"),
                         (("--optimizer", "muon", "--distribution", "element_wise"), "element_wise needs optimizer adamw"),
                         (("--shapes", "nope"), "unknown shapes 'nope'"),
                         (("--world-size", "4", "--tp", "4", "--etp", "3"), "etp 3 must divide tp 4"),
                         (("--custom-coefficients", "1,2", "--ns-coefficients", "custom"), "three numbers")):
        result = run_cli("reference", "run", *args, "--out", out)
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and expect in lines[0], lines
        assert not out.exists()


def test_failed_run_exits_1_with_one_line_and_writes_nothing(run_cli, tmp_path):
    out = tmp_path / "run.json"
    result = run_cli("reference", "run", "--world-size", "2", "--steps", "2", "--inject-failure", "0:1:raise",
                     "--out", out)
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "rank 0 failed: RuntimeError: injected failure" in lines[0]
    assert not out.exists()
