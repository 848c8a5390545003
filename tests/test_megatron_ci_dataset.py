"""The Megatron-LM CI timings as a named dataset: rows to runs, skipped rows with reasons, the copy."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from workloads.datasets import get_dataset, load_dataset_rows
from workloads.measured import MeasuredRun, SkippedRun
from workloads.megatron_ci import first_dense_layers, read_rows, row_to_run, write_copy

SHARED_CSV = "data/measured/megatron_ci/megatron_ci_runs.csv"
MOE_CASE = "gpt3_mcore_te_tp2_pp1_te_8experts2parallel_ddp_average_in_collective__dgx-h100__dev"


def _row(run_id: str) -> dict[str, str]:
    return next(r for r in read_rows(get_dataset("megatron-ci").path) if r["run_id"] == run_id)


def test_every_row_is_a_run_or_a_skipped_row_with_a_one_line_reason():
    runs, skipped = load_dataset_rows("megatron-ci-all")
    assert len(runs) + len(skipped) == 823  # the shipped file: PROVENANCE's 839 minus a withheld family
    assert all(s.reason.startswith("unsupported: ") and "\n" not in s.reason for s in skipped)
    used, not_used = load_dataset_rows("megatron-ci")
    assert {r.run_id for r in used} | {s.run_id for s in not_used} == {r.run_id for r in runs} | {s.run_id for s in skipped}
    reasons = Counter(s.reason.split(":")[0] for s in not_used)
    assert reasons["not used"] == len(runs) - len(used)
    # the acceptance rows: 8-GPU H100 and GB200, every one expressible
    assert {(r.system, r.num_gpus) for r in used} == {("dgx-h100", 8), ("gb200-nvl72", 8), ("dgx-a100", 8)}


def test_a_moe_row_by_hand():
    run = row_to_run(_row(MOE_CASE))
    assert isinstance(run, MeasuredRun)
    m = run.model_spec
    assert m is not None and m.moe is not None
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.vocab_size) == (12, 512, 2048, 50257)
    assert (m.attention.num_heads, m.attention.num_kv_heads, m.attention.head_dim) == (8, 8, 64)
    assert (m.moe.num_experts, m.moe.topk, m.moe.expert_ffn_hidden_size, m.moe.first_dense_layers) == (8, 1, 2048, 0)
    assert (m.activation, m.normalization, m.position_embedding, m.max_position_embeddings) == (
        "gelu", "layernorm", "learned_absolute", 1024)
    assert m.tie_embeddings and not m.add_bias_linear
    assert (run.tp, run.pp, run.ep, run.etp, run.num_gpus, run.precision.value) == (2, 1, 2, 2, 8, "bf16")
    assert run.optimizer_distribution == "element_wise" and run.overlap_param_gather is True
    assert run.scenario_settings == {
        "overlap_grad_reduce": True, "sequence_parallel": True, "grad_reduce_dtype": "fp32",
        "moe_token_dispatcher_type": "allgather", "ep_comm_overlap": False, "gradient_accumulation_fusion": False,
        "attention_backend": "unfused",
        "transformer_impl": "transformer_engine", "log_params_norm": True, "log_num_zeros_in_grad": True,
        "cross_entropy_loss_fusion": False, "moe_grouped_gemm": True, "moe_permute_fusion": False,
        "moe_router_fusion": False}
    assert run.release == "mcore-ci.20260725.cd4afffa64"  # the recording environment
    assert run.extra is not None and run.extra["deterministic_mode"] == "true" and run.extra["ckpt_saves_in_window"] == 0
    scenario = run.scenario_overrides()
    assert scenario["model"] is m and scenario["moe_token_dispatcher_type"] == "allgather"


def test_the_ep_overlap_flag_reaches_the_scenario():
    """``--overlap-moe-expert-parallel-comm: true`` in the a2a_ovlp case's config (the CSV column
    ``overlap_moe_expert_parallel_comm``) turns on muonsim's ``ep_comm_overlap``; its twin without the
    flag keeps it off."""
    from costmodel.calibrate.validation import scenario_for_run

    runs, _ = load_dataset_rows("megatron-ci")
    by_id = {r.run_id: r for r in runs}
    on = by_id["gpt3_mcore_te_tp2_pp1_te_a2a_ovlp_8experts_etp1_ep4__dgx-h100__dev"]
    off = by_id["gpt3_mcore_te_tp2_pp1_te_8experts_etp1_ep4__dgx-h100__dev"]
    assert on.scenario_settings["ep_comm_overlap"] is True and off.scenario_settings["ep_comm_overlap"] is False
    assert scenario_for_run(on).par.ep_comm_overlap


def test_the_run_resolves_to_a_valid_scenario():
    from costmodel.calibrate.validation import scenario_for_run

    run = row_to_run(_row(MOE_CASE))
    assert isinstance(run, MeasuredRun)
    sc = scenario_for_run(run)
    assert sc.runtime.moe_token_dispatcher_type == "allgather" and sc.dp == 4 and sc.num_microbatches == 2
    assert sc.optimizer.hide_param_gather is True  # --overlap-param-gather on this row
    assert sc.optimizer.overlap_grad_reduce and sc.par.uses_sequence_parallel


def test_moe_layer_freq_patterns():
    assert first_dense_layers("1", 12) == 0
    assert first_dense_layers("([0]*3+[1]*12)", 15) == 3
    assert first_dense_layers("([0]*3+[1]*12)", 16) is None  # does not add up to the layers
    assert first_dense_layers("([1]*2+[0]*2)", 4) is None


def test_unsupported_rows_name_their_reason():
    _, skipped = load_dataset_rows("megatron-ci-all")
    reasons = {s.run_id: s.reason for s in skipped}
    assert "encoder-decoder T5" in reasons["t5_mcore_tp1_pp1_vp1__dgx-h100__dev"]
    assert "encoder-only BERT" in reasons["bert_mcore_tp1_pp2__dgx-h100__dev"]
    assert all(isinstance(s, SkippedRun) for s in skipped)


def test_validate_lists_skipped_rows_in_json(run_cli):
    result = run_cli("validate", "--dataset", "megatron-ci", "--datasheet", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    runs, skipped = load_dataset_rows("megatron-ci")
    assert data["n"] == len(runs) and len(data["unsupported"]) == len(skipped)
    assert data["by_system"]["dgx-h100"]["n"] > 100


def test_the_shipped_copy_is_the_shared_file_trimmed(tmp_path):
    from tests.conftest import SHARED

    source = SHARED / SHARED_CSV
    if not source.is_file():
        source = SHARED.parent.parent / "shared" / SHARED_CSV
    if not source.is_file():
        pytest.skip("../shared is not beside the repository")
    out = tmp_path / "copy.csv"
    write_copy(read_rows(source), out)
    assert out.read_bytes() == get_dataset("megatron-ci").path.read_bytes()
