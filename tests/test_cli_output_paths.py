"""Output paths that cannot be written are one-line errors (exit 2) found before any work, and nothing
is left behind: ``sweep --out`` to a directory that cannot be created or written in, and ``calibrate
--out`` naming a directory (before, the first was a traceback with exit 1, the second came only after
the whole fit, ~30 s)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

GRID = """base:
  model: llama3-8b
  system: gb300-nvl72
  parallelism: {tp: 1, pp: 1, vpp: 1, ep: 1, micro_batch_size: 1, global_batch_size: 64, seq_length: 2048}
grid:
  gpus: [8]
"""

PROC = Path("/proc/self")


def _one_line(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.skipif(not PROC.is_dir(), reason="needs Linux procfs: a directory no one can create entries in")
@pytest.mark.parametrize("out", [PROC / "muonsim-sweep-out", PROC])
def test_sweep_out_that_cannot_be_written_is_one_line(run_cli, tmp_path: Path, out: Path) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID, encoding="utf-8")
    err = _one_line(run_cli("sweep", grid, "--out", out, "--jobs", "1", "--calibration", "none"))
    assert "--out" in err and str(out) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.yaml"]


def test_calibrate_out_naming_a_directory_fails_before_fitting(run_cli, tmp_path: Path) -> None:
    start = time.perf_counter()
    err = _one_line(run_cli("calibrate", "--dataset", "megatron-bridge", "--factors", "gemm_bf16", "--out", tmp_path))
    assert "is a directory" in err and str(tmp_path) in err
    assert time.perf_counter() - start < 5.0  # the fit takes ~10-30 s; the check comes first
    assert list(tmp_path.iterdir()) == []
