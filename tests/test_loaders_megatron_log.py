"""Megatron-LM / Megatron-Bridge training-log parsing on realistic excerpts written for the tests."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from topologies.inputs import UserInputError
from workloads.loaders import load_megatron_log, load_runs, parse_megatron_log

ARGS_BLOCK = """\
using world size: 64, data-parallel size: 8, context-parallel size: 1, tensor-model-parallel size: 4, pipeline-model-parallel size: 2
------------------------ arguments ------------------------
  accumulate_allreduce_grads_in_fp32 .............. True
  context_parallel_size ........................... 1
  expert_model_parallel_size ...................... 1
  fp8 ............................................. hybrid
  global_batch_size ............................... 128
  micro_batch_size ................................ 1
  pipeline_model_parallel_size .................... 2
  seq_length ...................................... 8192
  tensor_model_parallel_size ...................... 4
  virtual_pipeline_model_parallel_size ............ None
  world_size ...................................... 64
-------------------- end of arguments ---------------------
"""


def it_line(i: int, total: int, ms: float, tflops: float, loss: str = "8.234512E+00", skipped: int = 0,
            nans: int = 0, gbs: int = 128) -> str:
    return (f" [2026-03-04 10:{i:02d}:00] iteration {i:>8d}/{total:>8d} | consumed samples: {i * gbs:>12d} | "
            f"elapsed time per iteration (ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): {tflops:.1f} | "
            f"learning rate: 1.500000E-05 | global batch size: {gbs:>5d} | lm loss: {loss} | loss scale: 1.0 | "
            f"grad norm: 1.234 | number of skipped iterations: {skipped:>3d} | number of nan iterations: {nans:>3d} |")


def megatron_log(lines: list[str], with_args: bool = True) -> str:
    noise = [
        "[after model, optimizer, and learning rate scheduler are built] datetime: 2026-03-04 10:00:00",
        "> building train, validation, and test datasets ...",
        "[Rank 0] (after 1 iterations) memory (MB) | allocated: 61234.5 | max allocated: 70123.1 | reserved: 73000.0",
    ]
    return (ARGS_BLOCK if with_args else "") + "\n".join(noise[:2] + lines[:1] + noise[2:] + lines[1:]) + "\n"


def excerpt() -> list[str]:
    lines = [it_line(1, 30, 9100.0, 150.0), it_line(2, 30, 2400.0, 570.0)]  # compile / warm-up
    lines += [it_line(i, 30, 2050.0 + (i % 3) * 10, 665.0) for i in range(3, 13)]
    lines += [it_line(13, 30, 1500.0, 900.0, skipped=1)]  # loss-scale overflow: skipped step
    lines += [it_line(14, 30, 2060.0, 663.0, loss="nan", nans=1)]
    lines += [it_line(i, 30, 2040.0 + (i % 3) * 10, 668.0) for i in range(15, 20)]
    lines += [it_line(20, 30, 6000.0, 230.0)]  # a checkpoint stall: the median ignores it
    return lines


def test_parse_skips_warmup_skipped_and_nan_lines():
    parsed = parse_megatron_log(megatron_log(excerpt()), warmup_iterations=10)
    kept = [2050.0 + (i % 3) * 10 for i in (11, 12)] + [2040.0 + (i % 3) * 10 for i in range(15, 20)] + [6000.0]
    assert parsed["extra"]["log_lines_used"] == len(kept) == 8
    assert parsed["extra"]["log_lines_dropped"] == {"warmup": 10, "skipped": 1, "nan": 1}
    assert parsed["step_time_s"] == pytest.approx(statistics.median(kept) / 1e3)
    assert parsed["model_tflops_per_gpu"] == pytest.approx(668.0)
    assert parsed["global_batch_size"] == 128


def test_log_interval_windows_overlapping_warmup_are_dropped():
    lines = [it_line(i, 100, 3000.0 if i <= 10 else 2000.0, 600.0) for i in (5, 10, 15, 20, 25)]
    lines[2] = it_line(15, 100, 2500.0, 600.0)  # window 11-15, fully after warm-up
    parsed = parse_megatron_log("\n".join(lines), warmup_iterations=12)
    # windows: 1-5, 6-10, 11-15 overlap the 12 warm-up iterations; 16-20 and 21-25 are kept
    assert parsed["extra"]["log_lines_dropped"]["warmup"] == 3
    assert parsed["step_time_s"] == pytest.approx(2.0)


def test_log_with_sidecar_yaml_and_argument_block(tmp_path):
    log = tmp_path / "llama70b_h100.log"
    log.write_text(megatron_log(excerpt()), encoding="utf-8")
    (tmp_path / "llama70b_h100.yaml").write_text(
        "model: llama3-70b\nsystem: dgx-h100\nprecision: fp8-cs\nrelease: '26.02'\n", encoding="utf-8")
    (run,) = load_runs(log)
    assert (run.model, run.system, run.precision.value, run.release) == ("llama3-70b", "dgx-h100", "fp8-cs", "26.02")
    assert (run.tp, run.pp, run.vpp, run.num_gpus, run.seq_length, run.global_batch_size) == (4, 2, 1, 64, 8192, 128)
    assert run.run_id == "llama70b_h100" and run.step_time_s == pytest.approx(2.05)


def test_flags_override_the_log_and_sidecar(tmp_path):
    log = tmp_path / "run.txt"
    log.write_text(megatron_log(excerpt(), with_args=False), encoding="utf-8")
    flags = {"model": "llama3-8b", "system": "gb300-nvl72", "gpus": "8", "precision": "mxfp8",
             "micro_batch_size": "1", "seq_length": "8192", "tp": "2"}
    run = load_megatron_log(log, flags)
    assert (run.model, run.num_gpus, run.tp, run.global_batch_size) == ("llama3-8b", 8, 2, 128)


def test_log_errors_are_one_line(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(megatron_log(excerpt(), with_args=False), encoding="utf-8")
    with pytest.raises(UserInputError, match=r"file '.*run.log', column 'model': the log does not say model"):
        load_megatron_log(log, {"system": "dgx-h100"})
    with pytest.raises(UserInputError, match=r"the log says 128, the scenario says 256"):
        load_megatron_log(log, {"model": "llama3-8b", "system": "dgx-h100", "gpus": "8", "precision": "bf16",
                                "micro_batch_size": "1", "seq_length": "8192", "global_batch_size": "256"})
    with pytest.raises(UserInputError, match="cannot describe a measured run"):
        load_megatron_log(log, {"load_balance": "lpt"})
    short = tmp_path / "short.log"
    short.write_text(megatron_log(excerpt()[:5]), encoding="utf-8")
    with pytest.raises(UserInputError, match=r"no usable iteration lines .*\(5 found: 5 warm-up"):
        load_megatron_log(short, {"model": "llama3-8b"})
    (tmp_path / "side.log").write_text(megatron_log(excerpt()), encoding="utf-8")
    (tmp_path / "side.yaml").write_text("model: llama3-70b\nbogus: 1\n", encoding="utf-8")
    with pytest.raises(UserInputError, match=r"side.yaml', column 'bogus': not a run field"):
        load_megatron_log(tmp_path / "side.log")


def test_batch_ramp_up_is_rejected(tmp_path: Path):
    lines = [it_line(i, 40, 2000.0, 600.0, gbs=64 if i < 25 else 128) for i in range(11, 35)]
    with pytest.raises(UserInputError, match="global batch size changes"):
        parse_megatron_log("\n".join(lines), warmup_iterations=10)
