"""Recipe settings: the settings file's columns, value conventions, the dataset join, user files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from costmodel.calibrate.validation import scenario_for_run
from topologies.inputs import UserInputError
from workloads.datasets import get_dataset, load_dataset
from workloads.loaders import load_csv, load_json, load_megatron_log, load_runs, write_csv
from workloads.recipe_columns import COLUMNS, SKIP
from workloads.recipe_settings import SETTINGS_FILE, recipe_for, resolve_cell, resolve_recipe_cells
from workloads.runtime import RuntimeSettings, te_default_tp_overlap

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "measured"
HEADER = ("run_id,release,model,system,num_gpus,precision,global_batch_size,micro_batch_size,seq_length,"
          "tp,pp,vpp,ep,step_time_s")
ROW = "u1,26.06,qwen3-30b-a3b,gb200-nvl72,8,mxfp8,512,4,4096,1,1,1,8,6.5"


def by_id() -> dict:
    return {r.run_id: r for r in load_dataset("megatron-bridge")}


def test_shipped_settings_are_the_shared_file_and_every_column_is_listed() -> None:
    with SETTINGS_FILE.open(newline="", encoding="utf-8") as fh:
        header = next(csv.reader(fh))
    assert set(header) == set(COLUMNS)  # every column has a setting or a documented reason for none
    assert all(c.key is not None or c.note for c in COLUMNS.values())
    shared = SHARED / "megatron_bridge_recipe_settings.csv"
    if not shared.is_file():
        pytest.skip("../shared is not present")
    assert SETTINGS_FILE.read_bytes() == shared.read_bytes()


def test_every_column_is_documented() -> None:
    doc = (SETTINGS_FILE.parent / "RECIPE_SETTINGS.md").read_text(encoding="utf-8")
    missing = [name for name in COLUMNS if f"`{name}`" not in doc]
    assert not missing, f"columns missing from RECIPE_SETTINGS.md: {missing}"


def test_value_conventions() -> None:
    assert resolve_cell("overlap_grad_reduce", "true") == (True, "recipe")
    value, how = resolve_cell("moe_hybridep_num_sms", "default(16; mcore:transformer.transformer_config.TransformerConfig)")
    assert value == 16 and how.startswith("default (mcore:")
    assert resolve_cell("recompute_granularity", "default(None; mcore:TransformerConfig)")[0] == "none"
    assert resolve_cell("cuda_graph_impl", "n/a(field absent at this ref)")[0] is SKIP
    assert resolve_cell("cuda_graph_impl", "unknown")[1].startswith("unknown")
    assert resolve_cell("env_NCCL_NVLS_ENABLE", "unset") == (True, "unset: the variable's default")
    assert resolve_cell("env_CUDA_DEVICE_MAX_CONNECTIONS", "unset")[0] == 8
    assert resolve_cell("grad_reduce_in_fp32", "default(false; mcore:DDPConfig)")[0] == "bf16"
    assert resolve_cell("main_grads_dtype", "torch.bfloat16")[0] == "bf16"
    assert resolve_cell("recompute_modules", "mla_up_proj|mlp")[0] == ("mla_up_proj", "mlp")
    assert resolve_cell("recompute_modules", "[]")[0] == ()
    assert resolve_cell("cuda_graph_scope", "default(full; mcore:TransformerConfig)")[0] == ()  # Megatron's 'full'
    assert resolve_cell("attention_backend", "None")[0] is SKIP  # auto
    assert resolve_cell("pipeline_model_parallel_layout", "[['embedding', 'dec")[1].startswith("unknown (truncated")
    partial, how = resolve_cell("pipeline_model_parallel_layout",
                                "[['embedding', 'decoder', 'decoder'], ['decoder', 'decoder'], ['decoder', 'dec")
    assert how.startswith("truncated cell: reconstructed") and partial.stages == ("Ett", "tt")
    assert partial.complete(7, 4, 1) == "Ett|tt|tt|tmL"  # 2 + 2 + 2 + 1 = 7 layers
    with pytest.raises(ValueError, match="expected one of none, local"):
        resolve_cell("cuda_graph_impl", "sometimes")


def test_mtp_disagreement_is_settled_by_the_published_flops() -> None:
    runs = by_id()
    run = runs["mb-26.02-deepseek-v3-gb300-nvl72-mxfp8-256g-gbs4096"]
    assert run.mtp == 0 and run.recipe_settings["mtp_num_layers"] == "1"
    # 1199 TFLOP/s / 4612 tokens/s = 260 GFLOP/token: DeepSeek-V3 with one MTP layer (249.8 without)
    assert run.scenario_overrides()["mtp_layers"] == 1
    assert runs["mb-25.11-deepseek-v3-gb300-nvl72-mxfp8-256g-gbs4096"].scenario_overrides()["mtp_layers"] == 0


def test_legacy_switches_fold_into_the_current_settings() -> None:
    res = resolve_recipe_cells({"cuda_graph_impl": "n/a(field absent at this ref)", "enable_cuda_graph": "true"})
    assert res.overrides["cuda_graph_impl"] == "local"
    res = resolve_recipe_cells({"moe_enable_deepep": "true", "moe_flex_dispatcher_backend": "hybridep"})
    assert (res.overrides["moe_token_dispatcher_type"], res.overrides["moe_flex_dispatcher_backend"]) == ("flex", "deepep")


def test_tp_overlap_cfg_reads_the_bridge_repr_and_the_compact_form() -> None:
    cell = by_id()["mb-26.04-llama3.1-405b-gb300-nvl72-fp8-cs-256g-gbs1536"].recipe_settings["tp_comm_overlap_cfg"]
    runtime = RuntimeSettings(tp_comm_overlap_cfg=cell)
    qkv = runtime.tp_overlap_for("qkv_dgrad")
    assert qkv.method == "bulk" and qkv.num_sm in (2, 4, 8) and runtime.tp_overlap_for("fc2_fprop").method == "ring_exchange"
    compact = RuntimeSettings(tp_comm_overlap_cfg=f"qkv_dgrad:bulk:{qkv.num_sm}+fc2_fprop:ring_exchange")
    assert compact.tp_overlap_for("qkv_dgrad").num_sm == qkv.num_sm
    assert compact.tp_overlap_for("proj_fprop") == te_default_tp_overlap("proj_fprop")  # not given: TE's default
    assert te_default_tp_overlap("proj_fprop").method == "pipeline"


def test_dataset_joins_the_settings_each_run_used() -> None:
    runs = by_id()
    assert all(r.recipe_settings for r in runs.values())
    old = runs["mb-26.02-deepseek-v3-gb300-nvl72-mxfp8-256g-gbs4096"].scenario_overrides()
    new = runs["mb-26.06-deepseek-v3-gb300-nvl72-mxfp8-256g-gbs4096"].scenario_overrides()
    # the example: 26.02 selective mla_up_proj recompute, no graphs, no EP overlap; 26.06 the opposite
    assert (old["recompute"], old["recompute_modules"], old.get("cuda_graph_impl", "none")) == \
        ("selective", ("mla_up_proj",), "none")
    assert not old["ep_comm_overlap"] and not old["delay_wgrad_compute"] and old["moe_hybridep_num_sms"] == 32
    assert (new["recompute_modules"], new["cuda_graph_impl"], new["ep_comm_overlap"], new["delay_wgrad_compute"]) == \
        ((), "full_iteration", True, True)
    assert (old["micro_batch_size"], new["micro_batch_size"]) == (2, 1)  # from the table
    assert new["nccl_nvls_enable"] is False and new["grad_reduce_dtype"] == "bf16"
    # TP overlap where the recipes resolved it (replaces the recalled 'all Llama runs with tp > 1' rule)
    marked = {r.run_id for r in runs.values() if r.tp_comm_overlap}
    assert marked and all(runs[i].model.startswith("llama") and runs[i].tp > 1 for i in marked)
    assert "mb-26.04.01-llama3-70b-gb200-nvl72-nvfp4-64g-gbs256" not in marked  # tp 2, overlap off in its recipe


def test_the_table_wins_over_the_settings_and_every_run_resolves() -> None:
    runs = by_id()
    raw = {r.run_id: r for r in load_runs(get_dataset("megatron-bridge").path)}
    for run_id, run in runs.items():
        overrides = run.scenario_overrides()
        table = raw[run_id]
        assert (overrides["tp"], overrides["pp"], overrides["fsdp"]) == (table.tp, table.pp, table.fsdp)
        if overrides["mtp_layers"] != table.mtp:  # only where the published TFLOP/s say the recipe's MTP ran
            assert run.model == "deepseek-v3" and run.release.startswith("26.02") and overrides["mtp_layers"] == 1
        scenario_for_run(run)  # every published run is a valid scenario with its settings
    # 25.11 Llama 3.1 405B: the recipe says Megatron-FSDP, the table fsdp 0 (reconstruction): the table wins
    assert runs["mb-25.11-llama3.1-405b-gb300-nvl72-fp8-cs-256g-gbs1536"].scenario_overrides()["fsdp"] == 0
    unresolved = runs["mb-25.11-deepseek-v3-gb300-nvl72-mxfp8-256g-gbs4096"].recipe_resolution().unresolved
    assert "recompute_granularity" in unresolved  # 'unknown': muonsim's default, reported


def test_fsdp_only_switches_do_not_follow_a_configuration_the_run_did_not_use() -> None:
    # Megatron-Bridge's Megatron-FSDP override turns gradient-accumulation fusion and
    # average_in_collective off: in the settings file exactly the FSDP rows have them off
    with SETTINGS_FILE.open(newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if r["use_megatron_fsdp"] != "unknown"]
    fsdp = {r["run_id"] for r in rows if r["use_megatron_fsdp"] == "true"}
    assert len(fsdp) == 14 and len(rows) - len(fsdp) == 114
    assert {r["run_id"] for r in rows if r["gradient_accumulation_fusion"] == "false"} == fsdp
    assert {r["run_id"] for r in rows if r["average_in_collective"] != "true"} == fsdp
    # the two 25.11 Llama 3.1 405B rows come from an FSDP configuration the table (fsdp 0) did not run:
    # the run gets the non-FSDP switches; a run that did use Megatron-FSDP keeps its own
    runs = by_id()
    for system in ("gb300", "gb200"):
        o = runs[f"mb-25.11-llama3.1-405b-{system}-nvl72-fp8-cs-256g-gbs1536"].scenario_overrides()
        assert (o["fsdp"], o["gradient_accumulation_fusion"], o["average_in_collective"]) == (0, True, True)
    o = runs["mb-25.11-llama3-70b-gb300-nvl72-fp8-cs-64g-gbs256"].scenario_overrides()
    assert (o["fsdp"], o["gradient_accumulation_fusion"], o["average_in_collective"]) == (64, False, False)


def test_user_csv_carries_recipe_columns(tmp_path: Path) -> None:
    path = tmp_path / "runs.csv"
    path.write_text(HEADER + ",cuda_graph_impl,overlap_moe_expert_parallel_comm,env_NCCL_NVLS_ENABLE,use_megatron_fsdp\n"
                    + ROW + ",full_iteration,default(false; mcore:X),0,true\n", encoding="utf-8")
    (run,) = load_csv(path)
    overrides = run.scenario_overrides()
    assert overrides["cuda_graph_impl"] == "full_iteration" and overrides["ep_comm_overlap"] is False
    assert overrides["nccl_nvls_enable"] is False and overrides["fsdp"] == 8  # no fsdp column: dp·cp
    out = tmp_path / "out.csv"
    write_csv([run], out)
    assert load_csv(out) == [run]


def test_bad_recipe_cell_is_one_line_naming_the_column(tmp_path: Path) -> None:
    path = tmp_path / "runs.csv"
    path.write_text(HEADER + ",cuda_graph_impl\n" + ROW + ",sometimes\n", encoding="utf-8")
    with pytest.raises(UserInputError) as info:
        load_csv(path)
    msg = str(info.value)
    assert "\n" not in msg and "row 2" in msg and "column 'cuda_graph_impl'" in msg and "'sometimes'" in msg
    js = tmp_path / "runs.json"
    js.write_text(json.dumps({"runs": [{**dict(zip(HEADER.split(","), ROW.split(","), strict=True)),
                                        "recompute_granularity": "partial"}]}), encoding="utf-8")
    with pytest.raises(UserInputError, match="column 'recompute_granularity'"):
        load_json(js)


def test_megatron_log_arguments_and_sidecar_carry_recipe_settings(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    lines = ["  recompute_granularity ........................... selective",
             "  recompute_modules ............................... ['core_attn', 'mlp']",
             "  cuda_graph_impl ................................. transformer_engine",
             "  moe_token_dispatcher_type ....................... alltoall"]
    lines += [f" [2026-01-01] iteration {i}/ 40 | elapsed time per iteration (ms): 6500.0 | lm loss: 2.0" for i in
              range(1, 31)]
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "run.yaml").write_text(
        "\n".join(f"{k}: '{v}'" for k, v in zip(HEADER.split(",")[1:-1], ROW.split(",")[1:-1], strict=True))
        + "\nenv_NCCL_NVLS_ENABLE: 0\n", encoding="utf-8")
    run = load_megatron_log(log)
    overrides = run.scenario_overrides()
    assert overrides["recompute"] == "selective" and overrides["recompute_modules"] == ("core_attn", "mlp")
    assert overrides["cuda_graph_impl"] == "transformer_engine" and overrides["nccl_nvls_enable"] is False
    assert overrides["moe_token_dispatcher_type"] == "alltoall"


def test_recipe_for_picks_the_release_then_the_newest() -> None:
    choice = recipe_for("deepseek-v3", "gb300-nvl72", "26.04", gpus=256, precision="mxfp8")
    assert choice is not None and choice.release == "26.04" and "26.04" in choice.source
    family = recipe_for("deepseek-v3", "gb300-nvl72", "26.06")
    assert family is not None and family.release.startswith("26.06")
    newest = recipe_for("deepseek-v3", "gb300-nvl72", "24.01")
    assert newest is not None and newest.release == "26.08" and "newest" in newest.reason
    assert recipe_for("kimi-k2", "gb300-nvl72", "26.06") is None  # never published: muonsim defaults


def test_release_selects_the_runs_of_a_model_published_under_another_mtp_variant(run_cli) -> None:
    """``deepseek-v3-mtp`` is DeepSeek-V3 with its MTP layer; the published table names every
    DeepSeek-V3 run ``deepseek-v3`` (the recipe decides the MTP layers), so ``--release`` must find
    them instead of silently falling back to muonsim's defaults."""
    from workloads.recipe_settings import published_names

    assert published_names("deepseek-v3-mtp") == {"deepseek-v3-mtp", "deepseek-v3"}
    assert published_names("llama3-70b") == {"llama3-70b"}
    choice = recipe_for("deepseek-v3-mtp", "gb300-nvl72", "26.04", gpus=256, precision="mxfp8")
    assert choice is not None and choice.run_id == "mb-26.04-deepseek-v3-gb300-nvl72-mxfp8-256g-gbs4096"
    res = run_cli("predict", "--model", "deepseek-v3-mtp", "--release", "26.04", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["recipe_settings"]["release"] == "26.04"


def test_release_settings_complete_a_truncated_pipeline_layout_for_the_model() -> None:
    """The DeepSeek-V3 DGX B300 26.06 cell shows 3 of 8 stages: ``--release`` completes it for the
    scenario's model (the recipe's MTP layer, unless the user set the MTP layers) instead of passing a
    PartialLayout to the scenario (which pydantic rejected)."""
    from workloads.recipe_settings import release_settings

    choice = recipe_for("deepseek-v3", "dgx-b300", "26.06", gpus=256, precision="mxfp8")
    assert choice is not None and choice.run_id == "mb-26.06-deepseek-v3-dgx-b300-mxfp8-256g-gbs4096"
    sizes = {"pp": 8, "vpp": 1, "ep": 8, "num_layers": 61, "mtp_layers": 0}
    stages = "|".join(["Et" + "t" * 7] + ["t" * 8] * 6)
    assert release_settings(choice, set(), sizes).applied["pipeline_model_parallel_layout"] == stages + "|tttttmL"
    own_mtp = release_settings(choice, {"mtp_layers"}, sizes)
    assert own_mtp.applied["pipeline_model_parallel_layout"] == stages + "|tttttL"  # 8 + 6·8 + 5 = 61 layers
    assert "pipeline_model_parallel_layout" in release_settings(choice, set(), {"pp": 8, "vpp": 1}).skipped


def test_predict_release_with_a_truncated_layout_runs(run_cli) -> None:
    res = run_cli("predict", "--model", "deepseek-v3", "--system", "dgx-b300", "--release", "26.06", "--json")
    assert res.exit_code == 0, res.output
    layout = json.loads(res.stdout)["recipe_settings"]["applied"]["pipeline_model_parallel_layout"]
    assert layout.endswith("mL") and layout.count("|") == 7


def test_declared_fit_exclusions_are_scored_not_fitted_unless_asked() -> None:
    """The dataset's declared list (megatron_bridge_fit_exclusions.csv) marks its runs with the reason;
    the fit skips them unless --fit-excluded (FitSettings.fit_excluded); other runs are fitted."""
    from costmodel.calibrate.fit_runs import fit_runnable

    runs = by_id()
    marked = {i: r.fit_exclusion for i, r in runs.items() if r.fit_exclusion}
    assert set(marked) == {"mb-26.02-qwen3-30b-a3b-dgx-h100-fp8-cs-16g-gbs1024",
                           "mb-25.11-qwen3-30b-a3b-dgx-h100-fp8-cs-16g-gbs512"}
    assert all("EP all-to-all overlap" in why for why in marked.values())
    excluded = runs["mb-26.02-qwen3-30b-a3b-dgx-h100-fp8-cs-16g-gbs1024"]
    assert not fit_runnable(excluded) and fit_runnable(excluded, fit_excluded=True)
    assert fit_runnable(runs["mb-26.02.01-qwen3-30b-a3b-dgx-h100-fp8-cs-16g-gbs1024"])
