"""The weight-hash check across DP replicas (a per-iteration host cost) and Muon rows of the
Megatron CI dataset (their flags as scenario settings)."""

from __future__ import annotations

import json

import pytest

from costmodel.analytic import run_analytic
from costmodel.iteration_work import HASH_HOST_OPS_PER_PARAM, weight_hash_check_s
from workloads.datasets import get_dataset, load_dataset_rows
from workloads.inventory import inventory_for
from workloads.measured import MeasuredRun, SkippedRun
from workloads.megatron_ci import is_megatron_ci_csv, muon_settings, read_rows, row_to_run
from workloads.scenario import DEFAULT_SCENARIO

LLAMA3_8B_PARAMS = 8_030_261_248  # Meta's published parameter count of Llama 3 8B (untied output layer)
LLAMA3_8B_TENSORS = 32 * 6 + 3  # per layer QKV, out proj, fc1, fc2 and two norm weights; embedding, final norm, output


def _llama8b(**settings):
    return DEFAULT_SCENARIO.resolve().with_updates(
        model="llama3-8b", system="dgx-h100", gpus=8, tp=1, pp=1, vpp=1, cp=1, ep=1, etp=1, precision="bf16",
        global_batch_size=64, micro_batch_size=1, seq_length=4096, **settings)


def test_weight_hash_check_copies_casts_and_hashes_every_parameter():
    """One check on a rank holding all of Llama 3 8B (tp = pp = 1): per parameter a synchronous
    copy and the Python of the loop; per element 2 bytes over the host link, 4 bytes cast and 4
    bytes hashed on one core (Megatron-Core 0.16.1 core/utils.py:873-878)."""
    sc = _llama8b(check_weight_hash_interval=1)
    eff, gpu = sc.system.efficiency, sc.system.gpu
    expected_s = (LLAMA3_8B_TENSORS * (eff.host_sync_s + HASH_HOST_OPS_PER_PARAM * eff.kernel_issue_s)
                  + LLAMA3_8B_PARAMS * (2 / gpu.host_link_Bps + 4 / eff.host_cast_Bps + 4 / eff.host_hash_Bps))
    tensors = inventory_for(sc).stage_tensors(0)
    assert weight_hash_check_s(sc, tensors) == pytest.approx(expected_s, rel=1e-12)
    # ~8 GB read through one core at ~1 GB/s: tens of seconds, far above the step's own time
    assert expected_s > 40
    every_10 = _llama8b(check_weight_hash_interval=10)
    assert weight_hash_check_s(every_10, tensors) == pytest.approx(expected_s / 10, rel=1e-12)
    assert weight_hash_check_s(_llama8b(), tensors) == 0.0


def test_weight_hash_check_adds_to_the_step_tail():
    off, on = run_analytic(_llama8b()), run_analytic(_llama8b(check_weight_hash_interval=1))
    hashed = weight_hash_check_s(_llama8b(check_weight_hash_interval=1),
                                 inventory_for(_llama8b()).stage_tensors(0))
    assert on.step_time_s - off.step_time_s == pytest.approx(hashed, rel=1e-9)
    assert on.breakdown_s.optimizer - off.breakdown_s.optimizer == pytest.approx(hashed, rel=1e-9)


def _shipped_row(case: str, system: str = "dgx-h100") -> dict[str, str]:
    rows = read_rows(get_dataset("megatron-ci").path)
    return dict(next(r for r in rows if r["case"] == case and r["system"] == system))


def _muon_row(**cells: str) -> dict[str, str]:
    row = _shipped_row("gpt3_mcore_te_tp2_pp1_te_8experts_etp1_ep4")  # replicated AdamW, tp 2, ep 4
    row.update({"optimizer": "muon", "muon_scalar_optimizer": "adam", **cells})
    return row


def test_muon_rows_carry_their_flags_as_settings():
    row = _muon_row(optimizer_distribution="layer_wise", use_layer_wise_param_layout="true",
                    muon_tp_mode="distributed", muon_num_ns_steps="6", muon_coefficient_type="polar_express",
                    muon_fp32_matmul_prec="high", muon_no_split_qkv="true", muon_nesterov="true")
    assert muon_settings(row) == {
        "distribution": "layer_wise", "layer_wise_layout": "current", "tp_mode": "distributed", "ns_steps": 6,
        "ns_coefficients": "polar_express", "matmul_precision": "tf32", "use_syrk": False, "split_qkv": False,
        "use_nesterov": True}
    # recorded before --use-layer-wise-param-layout existed: the legacy layout
    legacy = muon_settings(_muon_row(optimizer_distribution="layer_wise",
                                     use_layer_wise_param_layout="false(feature absent before #4771)"))
    assert isinstance(legacy, dict) and legacy["layer_wise_layout"] == "legacy"
    # SYRK means the run's Emerging-Optimizers had it (>= 0.4)
    syrk = muon_settings(_muon_row(muon_use_syrk="true"))
    assert isinstance(syrk, dict) and syrk["eo_version"] == "0.4"
    assert muon_settings(_muon_row(muon_scalar_optimizer="lion")) == \
        "Muon scalar optimizer 'lion' (only Adam is modelled)"
    assert "distribution" in str(muon_settings(_muon_row(optimizer_distribution="megatron_fsdp:optim_grads_params")))


def test_a_replicated_muon_row_with_the_hash_check_every_iteration():
    """The replicated-Muon CI cases check weight hashes every iteration: the median step carries it.
    Every 10 iterations it does not (at most a tenth of the timed iterations)."""
    every = row_to_run(_muon_row(check_weight_hash_across_dp_replicas_interval="1"))
    tenth = row_to_run(_muon_row(check_weight_hash_across_dp_replicas_interval="10"))
    assert isinstance(every, MeasuredRun) and isinstance(tenth, MeasuredRun)
    assert every.optimizer == "muon" and every.scenario_settings["distribution"] == "replicated"
    assert every.scenario_settings["check_weight_hash_interval"] == 1
    assert "check_weight_hash_interval" not in (tenth.scenario_settings or {})
    from costmodel.calibrate.validation import prepare_runs

    (hashed, plain), unsupported = prepare_runs([every, tenth], check=False)
    assert not unsupported
    tensors = inventory_for(hashed.scenario).stage_tensors(0)
    gap_s = run_analytic(hashed.scenario).step_time_s - run_analytic(plain.scenario).step_time_s
    assert gap_s == pytest.approx(weight_hash_check_s(hashed.scenario, tensors), rel=1e-9)
    assert gap_s > 0.1  # ~10^8 parameters per rank through one core: a large share of a CI step


def test_other_optimizers_stay_unsupported():
    item = row_to_run(_muon_row(optimizer="sgd"))
    assert isinstance(item, SkippedRun) and item.reason == "unsupported: optimizer 'sgd'"


def test_validate_reads_a_megatron_ci_csv_given_as_a_file(run_cli):
    path = get_dataset("megatron-ci").path
    assert is_megatron_ci_csv(path)
    runs, skipped = load_dataset_rows("megatron-ci")
    result = run_cli("validate", str(path), "--datasheet", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["n"] == len(runs) and len(data["unsupported"]) == len(skipped)


def test_the_cli_flags_set_the_hash_interval_and_nesterov(run_cli):
    base = json.loads(run_cli("predict", "--model", "llama3-8b", "--gpus", "8", "--json").stdout)
    hashed = json.loads(run_cli("predict", "--model", "llama3-8b", "--gpus", "8", "--check-weight-hash-interval", "10",
                                "--nesterov", "on", "--json").stdout)
    assert hashed["scenario"]["runtime"]["check_weight_hash_interval"] == 10
    assert hashed["scenario"]["optimizer"]["use_nesterov"] is True
    assert hashed["step_time_s"] > base["step_time_s"]
    bad = run_cli("predict", "--check-weight-hash-interval", "0")
    assert bad.exit_code == 2 and "--check-weight-hash-interval: must be greater than or equal to 1 (got 0)" in bad.output
