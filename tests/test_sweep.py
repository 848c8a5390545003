"""``muonsim sweep``: the same rows on local processes and on a Dask LocalCluster, resuming after an
interrupt without recomputing finished points, one-line errors for bad grids; ``plan --scheduler``
ranks as the local pool does. Results are compared with each other, never with constants."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from costmodel.calibrate.profile import default_profile
from costmodel.sweep.journal import Journal
from costmodel.sweep.points import expand_grid
from costmodel.sweep.run import run_sweep
from costmodel.sweep.tables import read_parquet

BASE = """base:
  model: llama3-8b
  system: gb300-nvl72
  gpus: 16
  precision: bf16
  parallelism: {tp: 1, pp: 1, vpp: 1, ep: 1, micro_batch_size: 1, global_batch_size: 128, seq_length: 2048}
"""
# 24 points: 16 predict (2 models x 2 GPU counts x 2 optimizers x 2 tp), 4 that break a rule
# (dp 12 does not divide the batch; tp 3 the heads), 4 plans (a small pinned search)
GRID_24 = BASE + """grid:
  - {model: [llama3-8b, qwen3-30b-a3b], gpus: [8, 32], optimizer: [adamw, muon], tp: [1, 2]}
  - {gpus: 12, tp: [1, 3], optimizer: [adamw, muon]}
  - {mode: plan, gpus: [16, 32], optimizer: [adamw, muon]}
plan: {top_k: 1, search: {tp: [1, 2], pp: 1, vpp: 1, cp: 1, ep: 1, etp: 1, mbs: [1, 2], recompute: none}}
"""
ALIASES = {"mbs": "micro_batch_size"}


@pytest.fixture(scope="module")
def grid_24(tmp_path_factory):
    path = tmp_path_factory.mktemp("grid") / "grid24.yaml"
    path.write_text(GRID_24)
    return expand_grid(path, ALIASES, default_profile())


@pytest.fixture(scope="module")
def local_run(grid_24, tmp_path_factory):
    journal = tmp_path_factory.mktemp("local") / "journal.jsonl"
    return run_sweep(grid_24, journal, jobs=2), journal


@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=logging.CRITICAL) as c:
        yield c


def test_grid_expands_to_24_points_with_invalid_ones_recorded(grid_24, local_run) -> None:
    outcome, _ = local_run
    assert len(grid_24.points) == 24 and outcome.total == 24 and not outcome.interrupted
    assert [r["point"] for r in outcome.rows] == list(range(24))
    invalid = [r for r in outcome.rows if r["status"] == "invalid"]
    assert len(invalid) == 4 and all(r["message"] and r["step_time_s"] is None for r in invalid)
    assert all(r["status"] == "ok" for r in outcome.rows if r not in invalid)
    plans = [r for r in outcome.rows if r["mode"] == "plan"]
    assert len(plans) == 4 and all(r["best_label"] and r["best_pp"] == 1 and r["best_optimizer"] == r["optimizer"]
                                   for r in plans)
    ok = [r for r in outcome.rows if r["status"] == "ok"]
    for r in ok:  # the breakdown columns add up to the step time
        parts = sum(v for k, v in r.items() if v is not None and (
            k in ("compute_s", "pipeline_bubble_s", "optimizer_s", "other_s") or k.startswith("comm_")))
        assert parts == pytest.approx(r["step_time_s"], rel=1e-9)


def test_sweep_rows_equal_locally_and_on_a_dask_local_cluster(grid_24, local_run, cluster, tmp_path) -> None:
    from costmodel.sweep.outputs import write_outputs

    local, _ = local_run
    remote = run_sweep(grid_24, tmp_path / "journal.jsonl", scheduler=cluster.scheduler_address)
    assert remote.jobs == 2 and remote.computed == local.computed
    assert remote.rows == local.rows  # every value equal
    write_outputs(local, grid_24, tmp_path / "a")
    write_outputs(remote, grid_24, tmp_path / "b")
    assert read_parquet(tmp_path / "a" / "results.parquet") == read_parquet(tmp_path / "b" / "results.parquet")
    assert (tmp_path / "a" / "results.csv").read_text() == (tmp_path / "b" / "results.csv").read_text()
    assert "plotly" in (tmp_path / "b" / "summary.html").read_text()


def test_interrupted_sweep_resumes_without_recomputing(grid_24, local_run, tmp_path) -> None:
    journal = tmp_path / "journal.jsonl"
    first: list[str] = []

    def stop_after_five(key: str, done: int) -> None:  # Ctrl-C arriving after the fifth point
        first.append(key)
        if done == 5:
            raise KeyboardInterrupt

    cut = run_sweep(grid_24, journal, jobs=2, on_point=stop_after_five)
    assert cut.interrupted and cut.computed == 5 and cut.pending > 0
    assert [e["key"] for e in Journal(journal).entries()] == first
    second: list[str] = []
    resumed = run_sweep(grid_24, journal, jobs=2, on_point=lambda key, done: second.append(key))
    assert not resumed.interrupted and resumed.reused == 5
    assert not set(first) & set(second) and resumed.computed == len(second) == local_run[0].computed - 5
    keys = [e["key"] for e in Journal(journal).entries()]
    assert len(keys) == len(set(keys)) == local_run[0].computed  # nothing computed twice
    assert resumed.rows == local_run[0].rows


def test_journal_repairs_a_torn_last_line(tmp_path) -> None:
    path = tmp_path / "journal.jsonl"
    good = json.dumps({"key": "a", "result": {"status": "ok"}, "run": "r"})
    path.write_text(good + "\n" + '{"key": "b", "res')
    journal = Journal(path)
    assert journal.open() == {"a": {"status": "ok"}}
    journal.append("c", {"status": "ok"}, "r2")
    journal.close()
    assert [e["key"] for e in Journal(path).entries()] == ["a", "c"]


BIG_GRID = BASE + ("grid: {gpus: [8, 16, 32, 64], gbs: [256, 1024], seq: [2048, 4096], "
                   "optimizer: [adamw, muon], tp: [1, 2]}\n")  # 64 points


def _interrupt(cmd: list[str], journal: Path, after_points: int = 3) -> tuple[int, dict, str]:
    """Run ``cmd``, send SIGINT once ``journal`` holds ``after_points`` points: (exit code, --json summary, stderr)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if journal.is_file() and journal.read_text().count("\n") >= after_points:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, json.loads(out) if out.strip() else {}, err


def test_ctrl_c_keeps_finished_points_and_a_rerun_does_the_rest(tmp_path) -> None:
    """A real SIGINT to ``muonsim sweep``: exit 130, no traceback, the rows so far written; the same
    command again computes only the rest."""
    grid = tmp_path / "big.yaml"
    grid.write_text(BIG_GRID)
    journal = tmp_path / "big-sweep" / "journal.jsonl"
    cmd = [sys.executable, "-m", "cli.app", "sweep", str(grid), "--jobs", "1", "--calibration", "none", "--json"]
    code, summary, err = _interrupt(cmd, journal)
    assert code == 130, err[-800:]
    assert "Traceback" not in err
    done = summary["computed"]
    assert summary["interrupted"] and 3 <= done < 64 and summary["pending"] == 64 - done
    assert len(Journal(journal).entries()) == done
    assert (tmp_path / "big-sweep" / "results.csv").read_text().count("\n") == done + 1
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stderr[-800:]
    summary = json.loads(again.stdout)
    assert summary["reused"] == done and summary["computed"] == 64 - done and summary["pending"] == 0
    keys = [e["key"] for e in Journal(journal).entries()]
    assert len(keys) == len(set(keys)) == 64


def test_ctrl_c_on_a_dask_cluster_exits_cleanly(tmp_path, cluster) -> None:
    grid = tmp_path / "big.yaml"
    grid.write_text(BIG_GRID)
    journal = tmp_path / "big-sweep" / "journal.jsonl"
    cmd = [sys.executable, "-m", "cli.app", "sweep", str(grid), "--scheduler", cluster.scheduler_address,
           "--calibration", "none", "--json"]
    code, summary, err = _interrupt(cmd, journal, after_points=1)
    assert code == 130 and "Traceback" not in err, err[-800:]
    assert summary["interrupted"] and summary["computed"] == len(Journal(journal).entries()) < 64


@pytest.mark.parametrize(("grid", "fragment"), [
    ("grid: {tpp: [1, 2]}", "grid.tpp: unknown setting"),
    ("grid: {tp: [-1]}", "grid.tp = -1: parallelism.tp"),
    ("grid: {model: [llama9]}", "grid.model = 'llama9': unknown model"),
    ("grid: {tp: []}", "grid: tp: an empty list"),
    ("grid: {mode: [fit]}", "grid.mode: 'fit' is not one of predict, plan"),
    ("grids: {tp: 1}", "grids: unknown key; did you mean 'grid'?"),
    ("grid: {mbs: 1, micro_batch_size: 2}", "given twice"),
    ("grid: {tp: 1}\nplan: {top_k: -1}", "plan.top_k"),
    ("grid: {tp: 1}\nplan: {search: {tp: x}}", "plan: --tp: 'x' is not an integer"),
    # a setting plan does not search (a typo, or a scenario setting): was ignored, the search ran unpinned
    ("grid: {tp: 1}\nplan: {search: {ppp: [1]}}", "plan.search.ppp: not a searched setting; valid: tp, pp"),
    ("grid: {tp: 1}\nplan: {search: {seq_length: [4096]}}", "plan.search.seq_length: not a searched setting"),
])
def test_bad_grid_files_are_one_line_errors(run_cli, tmp_path, grid, fragment) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(BASE + grid + "\n")
    result = run_cli("sweep", path)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: grid file") and fragment in lines[0], result.stderr
    assert not (tmp_path / "bad-sweep").exists()


def test_scheduler_without_the_cluster_extra_is_a_one_line_error(tmp_path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(BASE + "grid: {tp: [1, 2]}\n")
    code = ("import sys; sys.modules['distributed'] = None; from cli.app import main; "
            f"sys.argv = ['muonsim', 'sweep', {str(path)!r}, '--scheduler', 'tcp://127.0.0.1:8786']; main()")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: --scheduler needs Dask distributed, which is not installed: "
                                     "pip install 'muonsim[cluster]'")
    assert not (tmp_path / "g-sweep").exists()


def test_unreachable_scheduler_is_a_one_line_error(run_cli, tmp_path, monkeypatch) -> None:
    pytest.importorskip("distributed")
    monkeypatch.setattr("costmodel.planner.cluster.CONNECT_TIMEOUT_S", 1.0)
    path = tmp_path / "g.yaml"
    path.write_text(BASE + "grid: {tp: [1, 2]}\n")
    result = run_cli("sweep", path, "--scheduler", "tcp://127.0.0.1:9", "--calibration", "none")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach a Dask scheduler at 'tcp://127.0.0.1:9'" in lines[0]
    assert not (tmp_path / "g-sweep").exists()


def test_plan_on_a_dask_cluster_ranks_as_locally(run_cli, cluster) -> None:
    args = ["plan", "--model", "llama3-8b", "--gpus", "16", "--gbs", "128", "--seq", "2048", "--precision", "bf16",
            "--ep", "1", "--pp", "1,2", "--cp", "1", "--top-k", "1", "--samples", "0", "--json"]
    local = run_cli(*args, "--jobs", "2")
    remote = run_cli(*args, "--scheduler", cluster.scheduler_address)
    assert local.exit_code == 0 and remote.exit_code == 0, remote.output
    a, b = json.loads(local.stdout), json.loads(remote.stdout)
    assert a["ranking"] and b["stats"]["jobs"] == 2
    for key in ("ranking", "reference", "pareto_front", "best", "best_report"):
        assert a[key] == b[key], key


def test_each_point_inherits_its_own_model_and_system_defaults(tmp_path) -> None:
    """Without a base, a point naming a dense model on DGX H100 inherits that pair's default layout
    (no EP 64 or MXFP8 from the built-in Kimi K2 scenario), as ``muonsim predict --model`` does."""
    from workloads.scenario_defaults import layered_config

    path = tmp_path / "g.yaml"
    path.write_text("grid: {model: [llama3-70b, kimi-k2], system: [dgx-h100, gb300-nvl72]}\n")
    grid = expand_grid(path, ALIASES, default_profile())
    assert len(grid.points) == 4
    for point in grid.points:
        assert point.error is None, point.error
        expected = layered_config({}, {"model": point.config.model, "system": point.config.system}).config
        assert point.config == expected
    llama_h100 = next(p for p in grid.points if p.config.model == "llama3-70b" and p.config.system == "dgx-h100")
    assert llama_h100.config.parallelism.ep == 1 and llama_h100.config.precision.value != "mxfp8"
