"""Every column of the Megatron-Bridge recipe-settings file: the scenario setting it sets, or why none.

One :class:`Column` per column of ``megatron_bridge_recipe_settings.csv`` (the names a user's CSV,
JSON, log sidecar or Megatron argument dump may carry as well). ``key`` is the flat scenario key
(:func:`workloads.scenario.apply_overrides`; ``None``: the column changes nothing muonsim models,
and ``note`` says why); ``parse`` turns the cell's value (after the value conventions of
:mod:`workloads.recipe_settings`: ``default(v; class)`` gives ``v``, ``None`` gives ``None``)
into the scenario value, or :data:`SKIP` to leave muonsim's default. Parsers raise ``ValueError``
with what would be valid.

The parallel sizes and batch shape (``tp`` ... ``seq_length``) and ``mtp_num_layers`` repeat the
run's own columns; the run's columns win (the published table is what was measured), see
:data:`RUN_COLUMNS`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from workloads.runtime import parse_tp_overlap_cfg, split_list


class _Skip:
    def __repr__(self) -> str:
        return "SKIP"


SKIP: Any = _Skip()  # the column leaves muonsim's default in place


class Unreadable(ValueError):
    """A cell that holds no usable value (e.g. truncated): resolved like ``unknown``."""
TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


@dataclass(frozen=True)
class Column:
    """One settings column: the scenario key it sets (or None), how its value is read, a note."""

    key: str | None
    parse: Callable[[str | None], Any]
    note: str = ""
    unset: str | None = None  # environment columns: the value that 'unset' (not set by the scripts) means


def _bool(value: str | None) -> Any:
    if value is None:
        return SKIP
    low = value.strip().lower()
    if low in TRUE:
        return True
    if low in FALSE:
        return False
    raise ValueError(f"expected true or false, got {value!r}")


def _int(value: str | None) -> Any:
    if value is None:
        return SKIP
    try:
        return int(float(value)) if float(value).is_integer() else int(value)
    except ValueError:
        raise ValueError(f"expected an integer, got {value!r}") from None


def _choice(*allowed: str, aliases: dict[str, str] | None = None, none: Any = SKIP) -> Callable[[str | None], Any]:
    def parse(value: str | None) -> Any:
        if value is None:
            return none
        text = value.strip().split(".")[-1] if value.strip().startswith(("AttnBackend.", "torch.")) else value.strip()
        text = (aliases or {}).get(text, text)
        if text not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}, got {value!r}")
        return text
    return parse


def _list(allowed: Iterable[str], drop: Iterable[str] = ()) -> Callable[[str | None], Any]:
    valid, dropped = tuple(allowed), set(drop)

    def parse(value: str | None) -> Any:
        items = tuple(x for x in split_list(value or "") if x not in dropped)
        bad = [x for x in items if x not in valid]
        if bad:
            raise ValueError(f"'{bad[0]}' is not one of {', '.join(valid)}")
        return items
    return parse


def _info(value: str | None) -> Any:
    return SKIP


def _recompute(value: str | None) -> Any:
    return "none" if value is None else _choice("selective", "full")(value)


def _grad_dtype(value: str | None) -> Any:
    flag = _bool(value)
    return SKIP if flag is SKIP else ("fp32" if flag else "bf16")


def _distributed(value: str | None) -> Any:
    flag = _bool(value)
    return "replicated" if flag is False else SKIP


def _layer_wise(value: str | None) -> Any:
    flag = _bool(value)
    return "layer_wise" if flag is True else SKIP


def _param_layout(value: str | None) -> Any:
    flag = _bool(value)
    return "legacy" if flag is False else SKIP


def _tp_cfg(value: str | None) -> Any:
    return None if value is None else parse_tp_overlap_cfg(value)


@dataclass(frozen=True)
class PartialLayout:
    """A list-form pipeline layout cut short in the settings file: its complete leading stages.

    :meth:`complete` reconstructs the rest (a documented reconstruction, not a source): the stages
    after the visible ones repeat the last visible stage's width, and the last virtual stage holds
    the remaining transformer layers, the MTP layers and the loss. For DeepSeek-V3 on 16 virtual
    stages this gives ``Et*4|(t*4|)*14tmL``, the layout the GB300 recipe of the same model writes.
    """

    stages: tuple[str, ...]

    def complete(self, num_layers: int, virtual_stages: int, mtp_layers: int) -> str | None:
        """The whole layout as a string, or None when the visible part cannot be continued."""
        if len(self.stages) < 2 or len(self.stages) >= virtual_stages:
            return None
        out = list(self.stages)
        width = out[-1].count("t")
        while len(out) < virtual_stages - 1:
            out.append("t" * width)
        rest = num_layers - sum(st.count("t") for st in out)
        if rest < 0:
            return None
        return "|".join([*out, "t" * rest + "m" * mtp_layers + "L"])


_NAMES = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}


def _layout(value: str | None) -> Any:
    if value is None:
        return None
    text = value.strip()
    if text.count("[") != text.count("]") or text.count("(") != text.count(")"):
        if text.startswith("[["):
            stages = tuple("".join(_NAMES.get(x.strip().strip("'\""), "?") for x in inner.split(","))
                           for inner in re.findall(r"\[([^\[\]]*)\]", text))
            if stages and all("?" not in st for st in stages):
                return PartialLayout(stages)
        raise Unreadable("truncated cell (unbalanced brackets)")
    return text


def _bytes_int(value: str | None) -> Any:
    return SKIP if value is None else _int(value)


_DTYPE = _choice("fp32", "bf16", "fp16", "fp8", aliases={"float32": "fp32", "bfloat16": "bf16", "float16": "fp16",
                                                         "uint8": "fp8", "float8_e4m3fn": "fp8"})
_MATMUL = _choice("bf16", "tf32", "fp32", aliases={"medium": "bf16", "high": "tf32", "highest": "fp32"})
_RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe_act", "moe", "shared_experts")
_SCOPES = ("full", "attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba", "full_iteration")

INFO = "provenance of the settings row (shown with the run, not a setting)"
RUN_DUPLICATE = "repeats the run's own column; the run's column wins (the table is what was measured)"
NO_TIME = "changes the numerics, not the step time or memory"

COLUMNS: dict[str, Column] = {
    # --- provenance ---
    **{name: Column(None, _info, INFO) for name in (
        "run_id", "release", "source_ref", "megatron_core_pin", "te_version_assumed", "config_name", "perf_cli_args",
        "match_status", "source_paths", "env_all", "env_source", "plugin_cli_overrides", "runtime_resolution",
        "mcore_has_layer_wise_distributed_optimizer")},
    "mcore_has_layer_wise_param_layout": Column("layer_wise_layout", _param_layout,
                                                "false: Megatron-Core at this pin has only the legacy layer-wise "
                                                "layout (Muon runs use layout legacy)"),
    # --- parallel sizes and batch: the run's own columns ---
    **{name: Column(None, _info, RUN_DUPLICATE) for name in ("tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "gbs",
                                                               "seq_length")},
    "mtp_num_layers": Column("mtp_layers", _int, "multi-token-prediction layers; the run's 'mtp' column wins"),
    # --- recompute ---
    "recompute_granularity": Column("recompute", _recompute, "None = no recompute"),
    "recompute_modules": Column("recompute_modules", _list(_RECOMPUTE_MODULES), "modules of selective recompute"),
    "recompute_method": Column("recompute_method", _choice("uniform", "block"), "full recompute: uniform or block"),
    "recompute_num_layers": Column("recompute_num_layers", _int, "full recompute: layers per block"),
    # --- CUDA graphs ---
    "cuda_graph_impl": Column("cuda_graph_impl", _choice("none", "local", "transformer_engine", "full_iteration")),
    "cuda_graph_scope": Column("cuda_graph_scope", _list(_SCOPES, drop=("full",)),
                               "modules captured; Megatron's default 'full' (every layer) is the empty list"),
    "enable_cuda_graph": Column(None, _bool, "legacy switch for per-layer (local) graphs: true with cuda_graph_impl "
                                             "none or absent means cuda_graph_impl local (resolved in code)"),
    "use_te_rng_tracker": Column(None, _bool, "the RNG tracker CUDA graphs need; no cost of its own"),
    "rng_te_rng_tracker": Column(None, _bool, "the RNG tracker CUDA graphs need; no cost of its own"),
    # --- MoE ---
    "moe_token_dispatcher_type": Column("moe_token_dispatcher_type", _choice("allgather", "alltoall", "flex")),
    "moe_flex_dispatcher_backend": Column("moe_flex_dispatcher_backend", _choice("deepep", "hybridep")),
    "moe_enable_deepep": Column(None, _bool, "legacy switch: true means dispatcher flex with backend deepep "
                                             "(resolved in code)"),
    "moe_hybridep_num_sms": Column("moe_hybridep_num_sms", _int, "None = Megatron-Core's default 16"),
    "moe_deepep_num_sms": Column("moe_deepep_num_sms", _int, "None = Megatron-Core's default 20"),
    "overlap_moe_expert_parallel_comm": Column("ep_comm_overlap", _bool, "EP all-to-all overlap (model config)"),
    "comm_overlap_overlap_moe_expert_parallel_comm": Column(None, _info, "CommOverlapConfig's request; the model "
                                                            "config's resolved value (previous column) is used"),
    "delay_wgrad_compute": Column("delay_wgrad_compute", _bool),
    "comm_overlap_delay_wgrad_compute": Column(None, _info, "CommOverlapConfig's request; the model config's "
                                               "resolved value is used"),
    "moe_shared_expert_overlap": Column("moe_shared_expert_overlap", _bool),
    "moe_permute_fusion": Column("moe_permute_fusion", _bool),
    "moe_router_fusion": Column("moe_router_fusion", _bool),
    "moe_grouped_gemm": Column("moe_grouped_gemm", _bool),
    "moe_router_force_load_balancing": Column(None, _bool, "muonsim always models balanced (forced) routing, which "
                                                           "is what every published MoE run uses"),
    "moe_expert_capacity_factor": Column(None, _info, "token dropping is not modelled (None in every published run)"),
    "moe_router_dtype": Column("moe_router_dtype", _choice("fp32", "fp64", none=None)),
    "moe_router_padding_for_quantization": Column(None, _bool, "pads each expert's tokens to the FP8 block (at most "
                                                               "15 rows of a GEMM); not modelled"),
    # --- TP ---
    "sequence_parallel": Column("sequence_parallel", _bool),
    "tp_comm_overlap": Column("tp_comm_overlap", _bool, "TP-communication overlap (model config, resolved)"),
    "comm_overlap_tp_comm_overlap": Column(None, _info, "CommOverlapConfig's request; the model config's resolved "
                                                        "value (tp_comm_overlap) is used"),
    "tp_comm_overlap_cfg": Column("tp_comm_overlap_cfg", _tp_cfg, "None = Transformer Engine's defaults"),
    "tp_comm_bootstrap_backend": Column(None, _info, "how userbuffers are set up at start; no per-step cost"),
    # --- data parallel, distributed optimizer ---
    "use_distributed_optimizer": Column("distribution", _distributed, "false: optimizer replicated over dp"),
    "optimizer_use_distributed_optimizer": Column(None, _info, "the optimizer config's copy of the previous column"),
    "overlap_grad_reduce": Column("overlap_grad_reduce", _bool),
    "overlap_param_gather": Column("hide_param_gather", _bool),
    "optimizer_overlap_param_gather": Column(None, _info, "the optimizer config's copy of overlap_param_gather"),
    "overlap_param_gather_with_optimizer_step": Column("overlap_param_gather_with_optimizer_step", _bool),
    "align_param_gather": Column("align_param_gather", _bool),
    "grad_reduce_in_fp32": Column("grad_reduce_dtype", _grad_dtype, "false: gradients reduced in BF16"),
    "mixed_precision_grad_reduce_in_fp32": Column(None, _info, "the mixed-precision config's request; the DDP "
                                                              "config's resolved grad_reduce_in_fp32 is used"),
    "fp8_param_gather": Column("fp8_param_gather", _bool),
    "reuse_grad_buf_for_mxfp8_param_ag": Column("reuse_grad_buf_for_mxfp8_param_ag", _bool),
    "bucket_size": Column("bucket_size_elements", _int, "DDP bucket size in elements"),
    "average_in_collective": Column("average_in_collective", _bool),
    "num_distributed_optimizer_instances": Column("num_distributed_optimizer_instances", _int),
    "use_megatron_fsdp": Column("use_megatron_fsdp", _bool, "true: Megatron-FSDP over dp·cp (fsdp = dp·cp) unless "
                                                            "the run's own 'fsdp' column says otherwise"),
    "data_parallel_sharding_strategy": Column("data_parallel_sharding_strategy",
                                              _choice("no_shard", "optim", "optim_grads", "optim_grads_params")),
    "fsdp_double_buffer": Column("fsdp_double_buffer", _bool),
    "nccl_ub": Column("nccl_ub", _bool),
    "fsdp_manual_registration": Column(None, _bool, "NCCL buffer registration at start; no per-step cost modelled"),
    "suggested_communication_unit_size": Column("suggested_communication_unit_size", _int),
    "keep_fp8_transpose_cache": Column("keep_fp8_transpose_cache", _bool),
    "init_model_with_meta_device": Column(None, _bool, "initialisation only"),
    "use_precision_aware_optimizer": Column("use_precision_aware_optimizer", _bool),
    "main_grads_dtype": Column("main_grads_dtype", _DTYPE),
    "main_params_dtype": Column("main_params_dtype", _DTYPE),
    "exp_avg_dtype": Column("exp_avg_dtype", _DTYPE),
    "exp_avg_sq_dtype": Column("exp_avg_sq_dtype", _DTYPE),
    # --- pipeline ---
    "pipeline_model_parallel_layout": Column("pipeline_model_parallel_layout", _layout),
    "account_for_embedding_in_pipeline_split": Column("account_for_embedding_in_pipeline_split", _bool),
    "account_for_loss_in_pipeline_split": Column("account_for_loss_in_pipeline_split", _bool),
    "defer_embedding_wgrad_compute": Column("defer_embedding_wgrad_compute", _bool),
    "comm_overlap_defer_embedding_wgrad_compute": Column(None, _info, "CommOverlapConfig's request; the resolved "
                                                         "model config value is used"),
    "wgrad_deferral_limit": Column("wgrad_deferral_limit", _int),
    "overlap_p2p_comm": Column("overlap_p2p_comm", _bool),
    "batch_p2p_comm": Column("batch_p2p_comm", _bool),
    # --- offloading, GC ---
    "cpu_offloading": Column("cpu_offloading", _bool),
    "cpu_offloading_num_layers": Column("cpu_offloading_num_layers", _int),
    "fine_grained_activation_offloading": Column("fine_grained_activation_offloading", _bool),
    "offload_modules": Column("offload_modules", _list(("attn_norm", "qkv_linear", "core_attn", "attn_proj",
                                                        "mlp_norm", "expert_fc1", "moe_act"))),
    "optimizer_cpu_offload": Column("optimizer_cpu_offload", _bool),
    "manual_gc": Column(None, _bool, "Python GC every manual_gc_interval steps instead of at random; muonsim models "
                                     "no GC pause (a step between collections)"),
    "manual_gc_interval": Column(None, _int, "see manual_gc"),
    # --- fusions, kernels, backends ---
    "cross_entropy_loss_fusion": Column("cross_entropy_loss_fusion", _bool),
    "cross_entropy_fusion_impl": Column("cross_entropy_fusion_impl", _choice("native", "te")),
    "attention_backend": Column("attention_backend", _choice("auto", "flash", "fused", "unfused", "local"),
                                "None = auto"),
    "apply_rope_fusion": Column("apply_rope_fusion", _bool),
    "bias_activation_fusion": Column("bias_activation_fusion", _bool),
    "gradient_accumulation_fusion": Column("gradient_accumulation_fusion", _bool),
    "use_transformer_engine_op_fuser": Column("use_transformer_engine_op_fuser", _bool),
    # --- precision: the run's 'precision' column says it; the first/last BF16 layers are settings ---
    **{name: Column(None, _info, "covered by the run's precision column (bf16, fp8-cs, mxfp8, nvfp4)")
       for name in ("fp8", "fp8_recipe", "fp8_param", "fp4", "fp4_recipe")},
    "first_last_layers_bf16": Column("first_last_layers_bf16", _bool),
    "num_layers_at_start_in_bf16": Column("num_layers_at_start_in_bf16", _int, "takes effect only with "
                                                                              "first_last_layers_bf16"),
    "num_layers_at_end_in_bf16": Column("num_layers_at_end_in_bf16", _int, "takes effect only with "
                                                                          "first_last_layers_bf16"),
    # --- optimizer: kind from the run's 'optimizer' column; hyper-parameters change numerics only ---
    "optimizer": Column(None, _info, "the run's 'optimizer' column (adamw, muon) says it"),
    **{name: Column(None, _info, NO_TIME) for name in ("lr", "adam_beta1", "adam_beta2", "adam_eps", "weight_decay",
                                                         "muon_scale_mode", "muon_momentum", "muon_use_nesterov",
                                                         "muon_extra_scale_factor")},
    "clip_grad": Column(None, _info, "the gradient-norm all-reduce (a few bytes) is not modelled"),
    "muon_tp_mode": Column("tp_mode", _choice("duplicated", "distributed", "blockwise"), "Muon runs only"),
    "muon_num_ns_steps": Column("ns_steps", _int, "Muon runs only"),
    "muon_fp32_matmul_prec": Column("matmul_precision", _MATMUL, "medium bf16, high tf32, highest fp32"),
    "muon_split_qkv": Column("split_qkv", _bool),
    "use_layer_wise_distributed_optimizer": Column("distribution", _layer_wise, "true: Muon's layer-wise optimizer"),
    # --- environment (env_<NAME>; 'unset' = not set by the scripts) ---
    "env_CUDA_DEVICE_MAX_CONNECTIONS": Column("cuda_device_max_connections", _int, unset="8"),
    "env_NCCL_NVLS_ENABLE": Column("nccl_nvls_enable", _bool, "0: NCCL uses ring/tree instead of NVLink SHARP",
                                   unset="1"),
    "env_NVTE_FWD_LAYERNORM_SM_MARGIN": Column("nvte_fwd_layernorm_sm_margin", _int, unset="0"),
    "env_NVTE_BWD_LAYERNORM_SM_MARGIN": Column("nvte_bwd_layernorm_sm_margin", _int, unset="0"),
    "env_NVTE_NORM_FWD_USE_CUDNN": Column(None, _bool, "cuDNN vs TE norm kernels: both memory-bound, same bytes",
                                          unset="0"),
    "env_NVTE_NORM_BWD_USE_CUDNN": Column(None, _bool, "cuDNN vs TE norm kernels: both memory-bound, same bytes",
                                          unset="0"),
    "env_NVLINK_DOMAIN_SIZE": Column(None, _int, "the system file's NVLink domain says it (72 NVL72, 8 DGX)"),
    "env_USE_MNNVL": Column("use_mnnvl", _bool),
    "env_NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": Column("num_of_hybrid_ep_ranks_per_nvlink_domain", _int),
    "env_PYTORCH_CUDA_ALLOC_CONF": Column(None, _info, "allocator fragmentation (expandable segments); memory "
                                                       "headroom, not modelled as bytes"),
    "env_NCCL_P2P_NET_CHUNKSIZE": Column("nccl_p2p_net_chunksize", _bytes_int),
    "env_NVTE_USE_FAST_MATH": Column(None, _bool, NO_TIME, unset="0"),
    "env_TORCH_NCCL_AVOID_RECORD_STREAMS": Column(None, _bool, "allocator bookkeeping of NCCL tensors; memory "
                                                               "release timing only", unset="0"),
    "env_NCCL_CTA_POLICY": Column(None, _info, "NCCL CTA scheduling policy; not modelled"),
    "env_NCCL_GRAPH_REGISTER": Column(None, _bool, "buffer registration under CUDA graphs; no per-step cost modelled",
                                      unset="1"),
}

# columns whose value the run's own columns give (the join does not copy them)
RUN_COLUMNS = frozenset(name for name, c in COLUMNS.items() if c.note == RUN_DUPLICATE) | {"run_id", "release"}
SETTING_KEYS = frozenset(c.key for c in COLUMNS.values() if c.key is not None)
