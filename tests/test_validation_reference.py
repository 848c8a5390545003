"""A 2-rank reference run checked against the cost model: exact collectives, NS FLOPs and time."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from costmodel.calibrate.profile import (
    CalibrationProfile,
    CollectiveFit,
    LocalMeasurements,
    NewtonSchulzFit,
)
from costmodel.calibrate.reference_check import check_reference_run
from workloads.loaders import load_runs

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def local_profile(tmp_path_factory) -> Path:
    """A fixed local profile (the CLI microbenchmark is tested elsewhere; here rates only scale times)."""
    local = LocalMeasurements(
        machine="test", gemm_flops_per_s={"bf16": 4e11, "fp32": 1e11}, gemm_overhead_s={"bf16": 1e-5, "fp32": 1e-6},
        dispatch_s=2e-6, memory_Bps=2e10,
        newton_schulz={"bf16": NewtonSchulzFit(efficiency=0.8, call_overhead_s=0.0)},
        collectives={op: CollectiveFit(alpha_s=1e-4, beta_Bps=5e9)
                     for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast")})
    path = tmp_path_factory.mktemp("local") / "local.yaml"
    path.write_text(CalibrationProfile(name="local", local=local).to_yaml(), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory) -> Path:
    from reference.api import run_reference

    path = tmp_path_factory.mktemp("ref") / "run.json"
    run_reference({"world_size": 2, "shapes": "tiny", "steps": 2, "check": False}).write_json(path)
    return path


def test_reference_run_matches_the_model_collectives_and_flops(run_cli, reference_run, local_profile):
    result = run_cli("validate", reference_run, "--calibration", local_profile, "--json")
    assert result.exit_code == 0, result.output
    (check,) = json.loads(result.stdout)["reference"]
    assert check["collectives_match"] is True
    assert check["collective_diffs"] == []
    assert set(check["calls_per_rank"]) == {"0", "1"} and all(n > 0 for n in check["calls_per_rank"].values())
    for flops in check["ns_flops_per_step"].values():
        assert flops["measured"] == flops["predicted"] > 0
    ns = [p for p in check["phases"] if p["phase"] == "newton_schulz"]
    assert {p["rank"] for p in ns} == {0, 1}
    assert all(p["measured_s"] > 0 and p["predicted_s"] > 0 and math.isfinite(p["error_pct"]) for p in ns)
    opt = {p["rank"]: p for p in check["phases"] if p["phase"] == "optimizer"}
    assert set(opt) == {0, 1}
    for p in ns:  # the optimizer step contains the orthogonalisation, and more kernels than its FLOPs
        assert opt[p["rank"]]["predicted_s"] > p["predicted_s"] > p["flop_only_s"] > 0
    text = run_cli("validate", reference_run, "--calibration", local_profile)
    assert "collectives: exact match on all 2 ranks" in text.stdout
    assert "newton_schulz: measured" in text.stdout


def test_a_changed_collective_is_reported_with_rank_and_call(reference_run, local_profile, tmp_path):
    from costmodel.calibrate.profile import load_profile
    from reference.workload import load_shapes

    data = json.loads(reference_run.read_text(encoding="utf-8"))
    data["extra"]["collectives_by_rank"]["1"][0]["bytes"] += 2
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(data), encoding="utf-8")
    (run,) = load_runs(changed)
    check = check_reference_run(run, load_profile(local_profile).local, load_shapes("tiny"))
    assert not check.collectives_match
    (diff,) = check.diffs
    assert diff.rank == 1 and len(diff.missing) == 1 and len(diff.unexpected) == 1
    assert diff.unexpected[0].bytes == diff.missing[0].bytes + 2
    assert any("issued but not expected" in line for line in check.summary_lines())


def test_reference_runs_need_a_local_profile(run_cli, reference_run):
    result = run_cli("validate", reference_run, "--datasheet")
    assert result.exit_code == 2
    assert "calibrate --microbench" in result.stderr


def test_reference_clone_kernel_is_the_copy_the_reference_makes() -> None:
    """Without Nesterov the reference's ``muon_prepare`` returns a copy of the fp32 momentum (EO reads
    the buffer in place): one memory kernel of 4 B read + 4 B written per element; with Nesterov the
    lerp is EO's own kernel and nothing is added."""
    import torch

    from costmodel.calibrate.reference_check import reference_clone_kernels
    from reference.muon_math import MuonHyper, muon_prepare
    from reference.newton_schulz import COEFFICIENT_SETS

    hyper = MuonHyper(lr=0.02, momentum=0.95, nesterov=False, weight_decay=0.0, schedule=COEFFICIENT_SETS["simple"],
                      ns_steps=5, precision="bf16", eps=1e-7, scale_mode="shape_scaling", extra_scale=1.0)
    p, g, buf = torch.zeros(256, 256), torch.ones(256, 256), torch.zeros(256, 256)
    u = muon_prepare(p, g, buf, hyper)
    assert u.data_ptr() != buf.data_ptr() and torch.equal(u, buf)  # a real copy of the buffer
    (clone,) = reference_clone_kernels([256 * 256], nesterov=False)
    assert clone.kind == "memory" and clone.count == 1 and clone.bytes == 8 * 65536
    assert reference_clone_kernels([256 * 256], nesterov=True) == []
