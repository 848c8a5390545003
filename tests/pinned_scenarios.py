"""The scenario set of ``pinned_numbers.py`` (what is pinned; that script records and compares it).

Each entry is (label, source, run the DES too). A source is {"overrides": {...}} (flat keys on the
default scenario), {"dataset": name, "run_id": id} (a shipped measured run's scenario) or
{"plan": {...}} (a small planner search, see ``pinned_numbers.plan_record``) or {"calibrated": dataset}
(every run of a shipped dataset predicted with the built-in calibration profile). :data:`SUBSET` is
the representative subset the test suite checks.
"""

from __future__ import annotations

from typing import Any

# ------------------------------------------------------------------------------------------------
# The scenario set: (label, source, run the DES too). A source is {"overrides": {...}} (flat keys on
# the default scenario), {"dataset": name, "run_id": id} (a shipped measured run's scenario) or
# {"plan": {...}} (a small planner search, see ``plan_record``).

KIMI_LAYOUTS = [  # 256 GPUs
    {},
    {"tp": 1, "pp": 8, "vpp": 2, "ep": 32, "micro_batch_size": 1},
    {"tp": 2, "pp": 4, "vpp": 2, "ep": 32, "micro_batch_size": 1},
    {"tp": 1, "pp": 2, "vpp": 7, "ep": 32, "micro_batch_size": 1},
    {"tp": 1, "pp": 16, "vpp": 1, "ep": 8, "micro_batch_size": 1},
    {"tp": 4, "pp": 4, "vpp": 2, "ep": 8, "etp": 2, "micro_batch_size": 1},
    {"tp": 2, "pp": 4, "vpp": 2, "cp": 2, "ep": 16, "micro_batch_size": 1},
    {"tp": 8, "pp": 8, "vpp": 4, "ep": 4, "etp": 2, "micro_batch_size": 2, "recompute": "full"},
    {"tp": 1, "pp": 4, "vpp": 1, "ep": 64, "micro_batch_size": 4, "recompute": "selective"},
]
KIMI_OPTIMIZERS = [
    {},
    {"load_balance": "ping_pong"},
    {"load_balance": "none"},
    {"layer_wise_layout": "legacy"},
    {"layer_wise_layout": "legacy", "load_balance": "lpt"},
    {"optimizer": "adamw"},
    {"tp_mode": "distributed"},
    {"tp_mode": "blockwise", "hide_param_gather": True},
    {"hide_param_gather": True, "grad_reduce_dtype": "bf16"},
]
BASE_KIMI = {"tp": 1, "pp": 8, "vpp": 2, "ep": 32, "micro_batch_size": 1}
LLAMA405 = {"model": "llama3.1-405b", "gpus": 1024, "global_batch_size": 1024, "seq_length": 8192,
            "micro_batch_size": 1, "ep": 1, "tp": 8, "pp": 8, "vpp": 2}
LLAMA70 = {"model": "llama3-70b", "gpus": 64, "tp": 4, "pp": 2, "vpp": 5, "ep": 1, "global_batch_size": 256,
           "seq_length": 4096, "micro_batch_size": 1}
LLAMA70_FSDP = {"model": "llama3-70b", "gpus": 64, "tp": 2, "pp": 1, "vpp": 1, "ep": 1, "fsdp": 32,
                "optimizer": "adamw", "global_batch_size": 256, "seq_length": 4096, "micro_batch_size": 1}
LLAMA8 = {"model": "llama3-8b", "system": "dgx-h100", "gpus": 8, "tp": 1, "pp": 1, "vpp": 1, "ep": 1,
          "global_batch_size": 64, "seq_length": 8192, "micro_batch_size": 1, "precision": "bf16"}
QWEN235 = {"model": "qwen3-235b-a22b", "gpus": 128, "tp": 2, "pp": 4, "vpp": 1, "ep": 16, "micro_batch_size": 1,
           "global_batch_size": 1024}
DSV3 = {"model": "deepseek-v3", "gpus": 256, "tp": 1, "pp": 8, "vpp": 1, "ep": 32, "micro_batch_size": 1}


def _kimi() -> list[tuple[str, dict[str, Any], bool]]:
    out: list[tuple[str, dict[str, Any], bool]] = []
    for i, lay in enumerate(KIMI_LAYOUTS):
        for j, opt in enumerate(KIMI_OPTIMIZERS):
            if (i + j) % 3 and not (i == 0 or j == 0):
                continue  # a Latin-square subset of layouts x optimizers
            out.append((f"kimi L{i} O{j}", {**lay, **opt}, (i + j) % 4 == 0))
    b = BASE_KIMI
    out += [
        ("kimi 2048 gpus", {"gpus": 2048, "global_batch_size": 8192, **b}, True),
        ("kimi 2048 adamw tp2", {"gpus": 2048, "global_batch_size": 8192, "tp": 2, "pp": 8, "vpp": 2, "ep": 64,
                                 "optimizer": "adamw"}, False),
        ("kimi 8192 distributed", {"gpus": 8192, "global_batch_size": 8192, "tp": 2, "pp": 16, "vpp": 1, "ep": 32,
                                   "tp_mode": "distributed"}, False),
        ("kimi replicated muon", {**b, "distribution": "replicated"}, False),
        ("kimi no grad overlap", {**b, "overlap_grad_reduce": False}, True),
        ("kimi small buckets", {**b, "bucket_size_elements": 5_000_000}, False),
        ("kimi small buckets legacy", {**b, "bucket_size_elements": 5_000_000, "layer_wise_layout": "legacy"}, False),
        ("kimi small buckets ping pong", {**b, "bucket_size_elements": 3_000_000, "load_balance": "ping_pong"}, False),
        ("kimi tf32 ns no split", {**b, "matmul_precision": "tf32", "split_qkv": False, "ns_steps": 6}, False),
        ("kimi fp32 ns syrk eo04", {**b, "matmul_precision": "fp32", "use_syrk": True, "eo_version": "0.4.0",
                                    "ns_coefficients": "cubic5"}, False),
        ("kimi bf16 syrk eo04", {**b, "use_syrk": True, "eo_version": "0.4.0", "tp": 2, "pp": 4}, False),
        ("kimi polar express", {**b, "ns_coefficients": "polar_express", "ns_steps": 8}, False),
        ("kimi gb200", {**b, "system": "gb200-nvl72"}, True),
        ("kimi ep comm overlap", {"ep_comm_overlap": True}, False),
        ("kimi ep overlap delay wgrad", {"ep_comm_overlap": True, "delay_wgrad_compute": True,
                                         "moe_shared_expert_overlap": True}, True),
        ("kimi tp comm overlap", {"tp": 2, "pp": 4, "vpp": 2, "ep": 32, "micro_batch_size": 1,
                                  "tp_comm_overlap": True}, False),
        ("kimi gpus per domain 64", {"gpus_per_domain": 64}, False),
        ("kimi tp pp dp mapping", {**b, "tp": 2, "ep": 2, "use_tp_pp_dp_mapping": True}, False),
        ("kimi pipeline split", {"pp": 4, "vpp": 1, "pipeline_split": "balanced"}, False),
        ("kimi pipeline layout", {"tp": 1, "pp": 4, "vpp": 2, "ep": 32, "micro_batch_size": 1,
                                  "pipeline_model_parallel_layout": "Et*7|t*8|t*8|t*8|t*8|t*8|t*8|t*6L"}, False),
        ("kimi cuda graphs local", {**b, "cuda_graph_impl": "local"}, True),
        ("kimi cuda graphs te attn", {**b, "cuda_graph_impl": "transformer_engine",
                                      "cuda_graph_scope": "attn,moe_router,moe_preprocess"}, False),
        ("kimi cuda graphs full iteration", {**b, "cuda_graph_impl": "full_iteration"}, False),
        ("kimi alltoall dispatcher", {**b, "moe_token_dispatcher_type": "alltoall"}, True),
        ("kimi allgather dispatcher", {**b, "moe_token_dispatcher_type": "allgather"}, False),
        ("kimi deepep", {**b, "moe_flex_dispatcher_backend": "deepep", "moe_deepep_num_sms": 24}, False),
        ("kimi hybridep ranks per domain", {**b, "num_of_hybrid_ep_ranks_per_nvlink_domain": 16}, False),
        ("kimi unfused kernels", {**b, "moe_router_fusion": False, "moe_permute_fusion": False,
                                  "moe_grouped_gemm": False, "moe_router_dtype": "fp32",
                                  "cross_entropy_loss_fusion": False, "gradient_accumulation_fusion": False}, False),
        ("kimi no p2p overlap", {**b, "overlap_p2p_comm": False, "batch_p2p_comm": False}, True),
        ("kimi bf16 layers", {**b, "first_last_layers_bf16": True, "num_layers_at_start_in_bf16": 2,
                              "num_layers_at_end_in_bf16": 1}, False),
        ("kimi logging", {**b, "log_params_norm": True, "log_num_zeros_in_grad": True, "timing_log_level": 2}, False),
        ("kimi no nvls", {**b, "nccl_nvls_enable": False}, False),
        ("kimi recompute block", {**b, "recompute": "full", "recompute_method": "block", "recompute_num_layers": 2},
         False),
        ("kimi recompute uniform", {**b, "recompute": "full", "recompute_method": "uniform",
                                    "recompute_num_layers": 1}, False),
        ("kimi selective modules", {**b, "recompute": "selective",
                                    "recompute_modules": "core_attn,mla_up_proj,moe_act,layernorm"}, False),
        ("kimi bf16 precision", {**b, "precision": "bf16"}, False),
        ("kimi fp8-cs", {**b, "precision": "fp8-cs"}, False),
        ("kimi nvfp4", {**b, "precision": "nvfp4"}, False),
        ("kimi average in collective", {**b, "average_in_collective": True, "align_param_gather": True,
                                        "hide_param_gather": True}, False),
        ("kimi adamw fp8 gather", {**b, "optimizer": "adamw", "fp8_param_gather": True,
                                   "reuse_grad_buf_for_mxfp8_param_ag": True}, False),
        ("kimi adamw fp8-cs gather", {**b, "optimizer": "adamw", "precision": "fp8-cs", "fp8_param_gather": True},
         False),
        ("kimi adamw instances", {**b, "pp": 4, "ep": 8, "optimizer": "adamw", "num_distributed_optimizer_instances": 2},
         True),
        ("kimi adamw precision aware", {**b, "optimizer": "adamw", "use_precision_aware_optimizer": True,
                                        "main_grads_dtype": "bf16", "exp_avg_dtype": "bf16",
                                        "exp_avg_sq_dtype": "bf16"}, False),
        ("kimi adamw overlap gather with step", {**b, "optimizer": "adamw", "hide_param_gather": True,
                                                 "overlap_param_gather_with_optimizer_step": True}, False),
    ]
    return out


def _llama_and_others() -> list[tuple[str, dict[str, Any], bool]]:
    out: list[tuple[str, dict[str, Any], bool]] = []
    for name, extra, des in [
        ("llama405", {}, True),
        ("llama405 tp4 pp16", {"tp": 4, "pp": 16, "vpp": 2}, False),
        ("llama405 lpt legacy", {"layer_wise_layout": "legacy", "load_balance": "lpt"}, False),
        ("llama405 distributed", {"tp_mode": "distributed", "pp": 16, "vpp": 1}, False),
        ("llama405 blockwise", {"tp_mode": "blockwise", "cp": 2, "pp": 4}, False),
        ("llama405 adamw", {"optimizer": "adamw", "recompute": "full"}, True),
        ("llama405 adamw replicated", {"optimizer": "adamw", "distribution": "replicated"}, False),
        ("llama405 adamw instances 4", {"optimizer": "adamw", "num_distributed_optimizer_instances": 4}, False),
        ("llama405 adamw cpu offload", {"optimizer": "adamw", "optimizer_cpu_offload": True}, False),
        ("llama405 ping pong", {"load_balance": "ping_pong", "hide_param_gather": True}, False),
        ("llama405 dgx-b300", {"system": "dgx-b300", "pp": 16}, True),
        ("llama405 tp overlap cfg", {"tp_comm_overlap": True,
                                     "tp_comm_overlap_cfg": "qkv_fprop:ring_exchange,fc1_fprop:pipeline"}, False),
        ("llama405 tp overlap", {"tp_comm_overlap": True, "cuda_graph_impl": "transformer_engine"}, True),
        ("llama405 account embedding loss", {"account_for_embedding_in_pipeline_split": True,
                                             "account_for_loss_in_pipeline_split": True}, False),
        ("llama405 cp4", {"cp": 4, "tp": 4, "pp": 8, "vpp": 4}, False),
    ]:
        out.append((name, {**LLAMA405, **extra}, des))
    for name, extra, des in [
        ("llama70b 64", LLAMA70, True),
        ("llama70b no sp", {**LLAMA70, "sequence_parallel": False, "tp": 2}, False),
        ("llama70b adamw fsdp", LLAMA70_FSDP, True),
        ("llama70b fsdp optim_grads", {**LLAMA70_FSDP, "data_parallel_sharding_strategy": "optim_grads"}, False),
        ("llama70b fsdp optim", {**LLAMA70_FSDP, "data_parallel_sharding_strategy": "optim"}, True),
        ("llama70b fsdp no_shard", {**LLAMA70_FSDP, "data_parallel_sharding_strategy": "no_shard"}, False),
        ("llama70b fsdp fp8 gather", {**LLAMA70_FSDP, "fp8_param_gather": True, "fsdp_double_buffer": True,
                                      "suggested_communication_unit_size": 2_000_000_000}, False),
        ("llama70b fsdp h100 transpose", {**LLAMA70_FSDP, "system": "dgx-h100", "precision": "fp8-cs",
                                          "fp8_param_gather": True, "keep_fp8_transpose_cache": True}, False),
        ("llama8b h100", LLAMA8, True),
        ("llama8b h100 fp8-delayed", {**LLAMA8, "precision": "fp8-delayed"}, False),
        ("llama8b h100 fp8-blockwise adamw", {**LLAMA8, "precision": "fp8-blockwise", "optimizer": "adamw"}, False),
        ("llama8b cpu offloading", {**LLAMA8, "cpu_offloading": True, "cpu_offloading_num_layers": 4}, True),
        ("llama8b fine grained offload", {**LLAMA8, "fine_grained_activation_offloading": True,
                                          "offload_modules": "attn_norm,core_attn,mlp_norm"}, False),
        ("llama8b unfused attention", {**LLAMA8, "attention_backend": "unfused", "apply_rope_fusion": False,
                                       "bias_activation_fusion": False}, False),
        ("llama8b local impl", {**LLAMA8, "transformer_impl": "local"}, False),
        ("llama8b b200 lpt", {**LLAMA8, "system": "dgx-b200", "gpus": 16, "tp": 2, "pp": 2,
                              "load_balance": "lpt", "layer_wise_layout": "legacy"}, False),
        ("llama8b b200 dp1 legacy", {**LLAMA8, "system": "dgx-b200", "gpus": 8, "tp": 2, "pp": 4,
                                     "layer_wise_layout": "legacy"}, False),
        ("deepseek-v3", DSV3, True),
        ("deepseek-v3 legacy none", {**DSV3, "layer_wise_layout": "legacy", "load_balance": "none"}, False),
        ("deepseek-v3-mtp", {"model": "deepseek-v3-mtp", "gpus": 512, "tp": 2, "pp": 8, "vpp": 2, "ep": 16,
                             "global_batch_size": 4096, "micro_batch_size": 1, "tp_mode": "distributed"}, False),
        ("deepseek-v3-mtp pp1", {"model": "deepseek-v3-mtp", "gpus": 256, "tp": 1, "pp": 1, "vpp": 1, "ep": 64,
                                 "micro_batch_size": 1, "recompute": "full"}, False),
        ("deepseek-v3-mtp adamw", {"model": "deepseek-v3-mtp", "gpus": 512, "tp": 1, "pp": 16, "vpp": 1, "ep": 32,
                                   "global_batch_size": 4096, "micro_batch_size": 1, "optimizer": "adamw"}, True),
        ("deepseek-v3 mtp layers 2", {**DSV3, "mtp_layers": 2, "layer_wise_layout": "legacy"}, False),
        ("qwen3-235b", QWEN235, True),
        ("qwen3-235b adamw", {**QWEN235, "vpp": 2, "ep": 8, "etp": 2, "optimizer": "adamw"}, False),
        ("qwen3-235b etp2 muon", {**QWEN235, "vpp": 2, "ep": 8, "etp": 2, "tp_mode": "distributed"}, False),
        ("qwen3-30b", {"model": "qwen3-30b-a3b", "gpus": 32, "tp": 1, "pp": 2, "vpp": 1, "ep": 8,
                       "micro_batch_size": 2, "global_batch_size": 512, "layer_wise_layout": "legacy"}, False),
        ("qwen3-30b dp1", {"model": "qwen3-30b-a3b", "gpus": 8, "tp": 2, "pp": 4, "vpp": 1, "ep": 2,
                           "micro_batch_size": 1, "global_batch_size": 64, "layer_wise_layout": "legacy"}, False),
        ("qwen3-30b h100 adamw", {"model": "qwen3-30b-a3b", "system": "dgx-h100", "gpus": 64, "tp": 1, "pp": 1,
                                  "vpp": 1, "ep": 8, "micro_batch_size": 1, "global_batch_size": 512,
                                  "optimizer": "adamw", "precision": "fp8-cs"}, True),
    ]:
        out.append((name, extra, des))
    return out


PLANS: list[tuple[str, dict[str, Any]]] = [
    ("plan kimi small", {"base": {}, "pins": {"tp": "1,2", "pp": "4", "vpp": "2,4", "cp": "1,2", "ep": "32,64",
                                              "etp": "1", "micro_batch_size": "1,2", "optimizer": "muon"},
                         "headroom": 0.05, "top_k": 2, "limit": 6, "samples": 4}),
    ("plan kimi small exhaustive", {"base": {}, "pins": {"tp": "1", "pp": "4,8", "vpp": "2", "cp": "1",
                                                         "ep": "32,64", "etp": "1", "micro_batch_size": "1"},
                                    "headroom": 0.05, "top_k": 1, "limit": 8, "samples": 0, "exhaustive": True,
                                    "allow_hypothetical": True}),
    ("plan llama70b", {"base": {"model": "llama3-70b", "gpus": 64, "tp": 4, "pp": 2, "vpp": 5, "ep": 1,
                                "global_batch_size": 256, "seq_length": 4096, "micro_batch_size": 1},
                       "pins": {"optimizer": "adamw,muon", "cp": "1", "micro_batch_size": "1,2"},
                       "headroom": 0.1, "top_k": 2, "limit": 8, "samples": 3}),
]

DATASET_DES = 12  # every DATASET_DES-th run of a dataset also runs the DES


def _dataset_entries() -> list[tuple[str, dict[str, Any], bool]]:
    from workloads.datasets import load_dataset_rows

    out: list[tuple[str, dict[str, Any], bool]] = []
    for name in ("megatron-bridge", "megatron-ci-all"):
        runs, _ = load_dataset_rows(name)
        for k, run in enumerate(runs):
            out.append((f"{name}:{run.run_id}", {"dataset": name, "run_id": run.run_id}, k % DATASET_DES == 0))
    return out


def scenario_set() -> list[tuple[str, dict[str, Any], bool]]:
    """(label, source, with DES) of every pinned entry (see the module docstring)."""
    out = [(label, {"overrides": o}, des) for label, o, des in _kimi() + _llama_and_others()]
    out += _dataset_entries()
    out += [(label, {"plan": spec}, False) for label, spec in PLANS]
    out += [(f"calibrated {name}", {"calibrated": name}, False) for name in ("megatron-bridge", "megatron-ci-all")]
    return out


# The representative subset the test suite checks (every mechanism at least once; the whole set is
# ``--check``'s, about a minute and a half on one core).
SUBSET = (
    "kimi L0 O0", "kimi L1 O2", "kimi L5 O4", "kimi L4 O5", "kimi L2 O7", "kimi L3 O6", "kimi L6 O3",
    "kimi 2048 gpus", "kimi small buckets", "kimi no grad overlap", "kimi ep overlap delay wgrad",
    "kimi cuda graphs local", "kimi adamw instances", "kimi bf16 layers", "kimi allgather dispatcher",
    "kimi adamw fp8 gather", "kimi logging", "kimi recompute block",
    "llama405", "llama405 lpt legacy", "llama405 adamw cpu offload", "llama405 tp overlap",
    "llama70b adamw fsdp", "llama70b fsdp optim", "llama8b cpu offloading", "llama8b b200 dp1 legacy",
    "deepseek-v3-mtp", "qwen3-30b", "qwen3-235b etp2 muon",
    "megatron-bridge:mb-26.08-deepseek-v3-gb300-nvl72-mxfp8-256g-gbs4096",
    "megatron-bridge:mb-26.04.01-llama3-70b-gb300-nvl72-fp8-cs-64g-gbs256",
    "megatron-bridge:mb-26.06-deepseek-v3-dgx-b300-mxfp8-256g-gbs4096",
    "megatron-bridge:mb-26.04.01-qwen3-235b-a22b-dgx-h100-fp8-cs-256g-gbs8192",
    "megatron-bridge:mb-25.11-llama3-8b-gb300-nvl72-fp8-cs-8g-gbs128",
    "megatron-ci-all:gpt3_mcore_cp2_pp2_ep2_te_4experts2parallel_nondeterministic__gb200-nvl72__dev",
    "megatron-ci-all:gpt3_7b_tp1_pp4_memory_speed__gb200-nvl72__dev",
    "plan kimi small exhaustive", "calibrated megatron-bridge",
)
