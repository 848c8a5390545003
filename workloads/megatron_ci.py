"""The Megatron-LM CI timings as measured runs (``muonsim validate --dataset megatron-ci``).

Source: ``../shared/data/measured/megatron_ci/`` (read its PROVENANCE.md): one row per golden
``iteration-time`` file of Megatron-LM's functional tests (small models on 8 × H100, 8 × GB200
(2 trays of 4), 8 × A100), ``step_time_s`` = median after 5 warm-up iterations. The project ships
a copy of the columns it reads (:func:`write_copy`; ``workloads/data/measured/megatron_ci_runs.csv``).

**Rows to runs.** CI models are not catalogue models: each row carries its architecture, turned
into an inline :class:`ModelSpec` (``MeasuredRun.model_spec``; its name encodes the shape plus a
hash, so rows of one architecture share it). Megatron defaults the CSV filled in are kept: GELU,
LayerNorm, learned absolute positions, tied embeddings, linear biases unless disabled. The
GPT-2 BPE vocabulary (``gpt2-vocab.json``, the scripts' default) has 50,257 entries. Scenario
settings beyond the MeasuredRun columns go to ``MeasuredRun.scenario_settings``: gradient
overlap, sequence parallelism, recompute modules, gradient dtype (bf16 runs accumulate gradients
in fp32 as Megatron forces; fp16 runs keep fp16 main grads unless
``--accumulate-allreduce-grads-in-fp32``: a 2-byte gradient, ``grad_reduce_dtype: bf16``), the
MoE dispatcher, the EP all-to-all overlap (``--overlap-moe-expert-parallel-comm``), CUDA graphs,
the weight-hash check when it runs every iteration (``--check-weight-hash-across-dp-replicas-interval
1``, the replicated-Muon cases). **Muon rows** (``--optimizer muon`` / ``dist_muon``) carry their Muon
flags (:func:`muon_settings`): layer-wise (with ``--use-distributed-optimizer``) or replicated.

**Rows the model cannot express** become :class:`SkippedRun` s with a one-line reason (T5, BERT,
Mamba hybrids, multimodal, RL steps, unknown system / GPU count / vocabulary, fp32 training,
explicit pipeline layouts). **Rows not used** by the ``megatron-ci`` selection are skipped too,
with the reason (see :func:`selection_reason`); ``megatron-ci-all`` keeps every expressible row.

**Release** = the recording environment (:func:`recording_release`): values were recorded by
different commits, containers and machine pools over 2024-11 .. 2026-08 (PROVENANCE caveat 2).

**Per-row flags** stay available as ``extra`` columns: ``case``, ``family``, ``phase``,
``deterministic_mode``, ``timing_log_level``, ``ckpt_saves_in_window`` (count),
``eval_in_window``, ``noise_iqr_rel`` (IQR / median), ``attention_backend``,
``transformer_impl``, ``moe_grouped_gemm``, ``no_gradient_accumulation_fusion``,
``log_params_norm``, ``log_num_zeros_in_grad``, ``check_weight_hash_interval``, ``manual_gc``,
``cuda_device_max_connections``, ``nccl_algo``, ``environment``, ``values_recorded_date``.
"""

from __future__ import annotations

import csv
import hashlib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, get_args

from pydantic import ValidationError

from topologies.inputs import UserInputError
from workloads.measured import MeasuredRun, SkippedRun
from workloads.models import GqaAttention, MlaAttention, ModelSpec, MoeSpec
from workloads.optimizer_spec import EO_MIN_SYRK_CUBIC5, CoefficientSet

TOKENIZER_VOCAB = {"GPT2BPETokenizer": 50257}  # entries of gpt2-vocab.json (the scripts' default)
PRECISIONS = {"bf16": "bf16", "fp16": "fp16", "fp8-cs": "fp8-cs", "fp8-delayed": "fp8-delayed",
              "fp8-blockwise": "fp8-blockwise", "mxfp8": "mxfp8", "fp4-nvfp4": "nvfp4"}
SYSTEMS = ("dgx-h100", "gb200-nvl72", "dgx-a100")
UNSUPPORTED_FAMILIES = {
    "t5": "encoder-decoder T5 (cross-attention, two stacks) is not expressible",
    "bert": "encoder-only BERT (bidirectional attention, pooler and heads) is not expressible",
    "hybrid": "Mamba hybrid layers are not expressible",
    "nemotron": "Mamba hybrid layers are not expressible",
    "multimodal-llava": "multimodal (vision encoder) models are not expressible",
    "mimo": "multimodal (vision encoder) models are not expressible",
}
NOISE_LIMIT = 0.25  # IQR / median above which a single run is too noisy to fit or validate on
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe_act", "moe", "shared_experts")
FLAG_COLUMNS = {  # extra column -> CSV column
    "case": "case", "family": "family", "phase": "phase", "environment": "environment",
    "deterministic_mode": "deterministic_mode", "timing_log_level": "timing_log_level",
    "attention_backend": "attention_backend", "transformer_impl": "transformer_impl",
    "moe_grouped_gemm": "moe_grouped_gemm", "no_gradient_accumulation_fusion": "no_gradient_accumulation_fusion",
    "log_params_norm": "log_params_norm", "log_num_zeros_in_grad": "log_num_zeros_in_grad",
    "check_weight_hash_interval": "check_weight_hash_across_dp_replicas_interval", "manual_gc": "manual_gc",
    "cuda_device_max_connections": "env_CUDA_DEVICE_MAX_CONNECTIONS", "nccl_algo": "env_NCCL_ALGO",
    "values_recorded_date": "values_recorded_date", "step_time_excl_post_event_s": "step_time_excl_post_event_s",
    "precision_flags": "precision_flags", "moe_router_load_balancing_type": "moe_router_load_balancing_type",
    "identical_iteration_time_series_as": "identical_iteration_time_series_as",
    "golden_platform_suffix": "golden_platform_suffix", "test_type": "test_type",
}
MUON_COLUMNS = (  # Megatron's Muon flags (as recorded; 'n/a' on AdamW rows)
    "use_layer_wise_param_layout", "muon_tp_mode", "muon_num_ns_steps", "muon_coefficient_type",
    "muon_fp32_matmul_prec", "muon_use_syrk", "muon_no_split_qkv", "muon_nesterov", "muon_scale_mode",
    "muon_momentum", "muon_extra_scale_factor", "muon_scalar_optimizer",
)
# Emerging-Optimizers' fp32_matmul_prec (torch's float32 matmul precision) -> the Newton-Schulz matmuls
MATMUL_PRECISIONS = {"medium": "bf16", "high": "tf32", "highest": "fp32"}
MUON_DISTRIBUTIONS = ("layer_wise", "replicated")
COLUMNS = (  # what the shipped copy keeps, in this order
    "run_id", "source", "release", "system", "num_gpus", "precision", "global_batch_size", "micro_batch_size",
    "seq_length", "tp", "pp", "vpp", "vpp_source", "cp", "ep", "etp", "fsdp", "fsdp_impl", "mtp", "optimizer",
    "optimizer_distribution", "step_time_s", "step_time_iqr_s", "n_steps", "num_layers", "hidden_size",
    "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "vocab_size", "tokenizer",
    "make_vocab_size_divisible_by", "max_position_embeddings", "moe_num_experts", "moe_router_topk",
    "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_layer_freq", "multi_latent_attention",
    "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "activation",
    "normalization", "position_embedding_type", "untie_embeddings_and_output_weights", "disable_bias_linear",
    "qk_layernorm", "spec", "overlap_grad_reduce", "overlap_param_gather", "sequence_parallel", "tp_comm_overlap",
    "recompute_granularity", "recompute_modules", "recompute_method", "recompute_num_layers", "cuda_graph_impl",
    "cuda_graph_flags", "moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "moe_permute_fusion",
    "overlap_moe_expert_parallel_comm", "ckpt_save_iters_in_window", *MUON_COLUMNS,
    "eval_iters_in_window", *sorted(set(FLAG_COLUMNS.values()) - {"phase"}), "phase",
)


def _int(value: str) -> int | None:
    return int(value) if value.strip().lstrip("-").isdigit() else None


def _bool(value: str) -> bool:
    return value.strip().lower() == "true"


def _cell(value: str) -> str | None:
    """A recorded flag value without its annotation ('false(feature absent ...)' -> 'false'); None
    when the source does not give one ('', 'n/a', 'unknown', 'none')."""
    text = value.split("(")[0].strip().lower()
    return None if text in ("", "n/a", "unknown", "none") else text


def muon_settings(row: dict[str, str]) -> dict[str, Any] | str:
    """The Muon flags of a Muon row as scenario settings (CLI-style keys), or a one-line reason the
    model cannot express them. Megatron's defaults (``OptimizerConfig``, Megatron-Core 0.16.1
    ``optimizer_config.py:260-281``) stand for cells the row does not give.

    ``use_layer_wise_param_layout`` true: the current layer-wise layout, otherwise the legacy one
    (values recorded before the flag existed say ``false(feature absent ...)``); the Newton-Schulz
    steps, coefficient set, TP mode, matmul precision (Emerging-Optimizers' ``fp32_matmul_prec``:
    medium = BF16, high = TF32, highest = FP32), SYRK, the QKV split and Nesterov change the cost;
    SYRK or the cubic5 set mean the run's Emerging-Optimizers had them (>= 0.4). The scale mode,
    momentum, extra scale factor change numbers, not time; the scalar optimizer is Megatron's Adam
    (another one is refused)."""
    out: dict[str, Any] = {}
    distribution = _cell(row["optimizer_distribution"])
    if distribution not in MUON_DISTRIBUTIONS:
        return f"Muon with optimizer distribution '{row['optimizer_distribution']}'"
    out["distribution"] = distribution
    if distribution == "layer_wise":
        out["layer_wise_layout"] = "current" if _cell(row["use_layer_wise_param_layout"]) == "true" else "legacy"
    scalar = _cell(row["muon_scalar_optimizer"])
    if scalar not in (None, "adam", "adamw"):
        return f"Muon scalar optimizer '{row['muon_scalar_optimizer']}' (only Adam is modelled)"
    mode = _cell(row["muon_tp_mode"])
    if mode is not None:
        if mode not in ("duplicated", "distributed", "blockwise"):
            return f"Muon TP mode '{row['muon_tp_mode']}'"
        out["tp_mode"] = mode
    steps = _int(_cell(row["muon_num_ns_steps"]) or "")
    if steps is not None:
        out["ns_steps"] = steps
    coefficients = _cell(row["muon_coefficient_type"])
    if coefficients is not None:
        if coefficients not in get_args(CoefficientSet):
            return f"Muon coefficient type '{row['muon_coefficient_type']}'"
        out["ns_coefficients"] = coefficients
    precision = _cell(row["muon_fp32_matmul_prec"])
    if precision is not None:
        if precision not in MATMUL_PRECISIONS:
            return f"Muon fp32 matmul precision '{row['muon_fp32_matmul_prec']}'"
        out["matmul_precision"] = MATMUL_PRECISIONS[precision]
    out["use_syrk"] = _cell(row["muon_use_syrk"]) == "true"
    out["split_qkv"] = _cell(row["muon_no_split_qkv"]) != "true"
    out["use_nesterov"] = _cell(row["muon_nesterov"]) == "true"
    if out["use_syrk"] or coefficients == "cubic5":
        out["eo_version"] = ".".join(map(str, EO_MIN_SYRK_CUBIC5))
    return out


def _count(value: str) -> int:
    """Number of ';'-separated iterations in a '*_in_window' column ('none' = 0)."""
    return 0 if value in ("none", "", "unknown", "n/a") else len(value.split(";"))


def first_dense_layers(freq: str, num_layers: int) -> int | None:
    """Leading dense layers of Megatron's ``--moe-layer-freq`` ('1' or '([0]*k+[1]*m)'); None when
    the pattern is not 'k dense layers, then MoE' (not expressible)."""
    if freq in ("1", "n/a"):
        return 0
    m = re.fullmatch(r"\(\[0\]\*(\d+)\+\[1\]\*(\d+)\)", freq.replace(" ", ""))
    if m and int(m.group(1)) + int(m.group(2)) == num_layers:
        return int(m.group(1))
    return None


def model_spec(row: dict[str, str]) -> ModelSpec | str:
    """The row's architecture, or a one-line reason why it cannot be expressed."""
    layers, h = _int(row["num_layers"]), _int(row["hidden_size"])
    heads = _int(row["num_attention_heads"])
    if layers is None or h is None or heads is None:
        return f"architecture not given (num_layers {row['num_layers']}, hidden_size {row['hidden_size']})"
    vocab = _int(row["vocab_size"]) or TOKENIZER_VOCAB.get(row["tokenizer"].split("(")[0])
    if vocab is None:
        return f"vocabulary size unknown (tokenizer {row['tokenizer']} without --vocab-size)"
    qk_norm = _bool(row["qk_layernorm"])
    if _bool(row["multi_latent_attention"]):
        attention: GqaAttention | MlaAttention = MlaAttention(
            num_heads=heads, q_lora_rank=_int(row["q_lora_rank"]), kv_lora_rank=int(row["kv_lora_rank"]),
            qk_head_dim=int(row["qk_head_dim"]), qk_pos_emb_head_dim=int(row["qk_pos_emb_head_dim"]),
            v_head_dim=int(row["v_head_dim"]), latent_norm=qk_norm)
    else:
        attention = GqaAttention(num_heads=heads, num_kv_heads=_int(row["num_query_groups"]) or heads,
                                 head_dim=_int(row["kv_channels"]) or h // heads, qk_norm=qk_norm)
    moe = None
    if (_int(row["moe_num_experts"]) or 0) > 0:
        dense = first_dense_layers(row["moe_layer_freq"], layers)
        if dense is None:
            return f"moe_layer_freq {row['moe_layer_freq']} is not 'dense layers first, then MoE'"
        moe = MoeSpec(num_experts=int(row["moe_num_experts"]), topk=int(row["moe_router_topk"]),
                      expert_ffn_hidden_size=_int(row["moe_ffn_hidden_size"]) or int(row["ffn_hidden_size"]),
                      shared_expert_ffn_hidden_size=_int(row["moe_shared_expert_intermediate_size"]) or 0,
                      first_dense_layers=dense)
    position = row["position_embedding_type"]
    spec: dict[str, Any] = dict(
        num_layers=layers, hidden_size=h, ffn_hidden_size=int(row["ffn_hidden_size"]), vocab_size=vocab,
        make_vocab_size_divisible_by=_int(row["make_vocab_size_divisible_by"]) or 128, attention=attention,
        moe=moe, mtp_layers=_int(row["mtp"]) or 0, activation=row["activation"],
        normalization={"LayerNorm": "layernorm", "RMSNorm": "rmsnorm"}.get(row["normalization"], row["normalization"]),
        position_embedding=position, tie_embeddings=not _bool(row["untie_embeddings_and_output_weights"]),
        add_bias_linear=not _bool(row["disable_bias_linear"]),
        max_position_embeddings=_int(row["max_position_embeddings"]) if position == "learned_absolute" else None)
    digest = hashlib.sha1(repr(sorted((k, repr(v)) for k, v in spec.items())).encode()).hexdigest()[:6]
    kind = "moe" if moe else "gpt"
    try:
        return ModelSpec(name=f"ci-{kind}-l{layers}-h{h}-{digest}", display_name=f"CI {row['case']}", **spec)
    except ValidationError as err:
        return f"architecture not expressible: {err.errors()[0]['msg']}"


def unsupported_reason(row: dict[str, str]) -> str | None:
    """Why the row's scenario cannot be expressed (one line), or None."""
    if row["system"] not in SYSTEMS:
        return f"system '{row['system']}' (the golden file names no platform)"
    if _int(row["num_gpus"]) is None:
        return "GPU count unknown (release test launched outside the public recipes)"
    if row["family"] in UNSUPPORTED_FAMILIES:
        return UNSUPPORTED_FAMILIES[row["family"]]
    if "mamba" in row["spec"] or "hybrid" in row["spec"]:
        return "Mamba hybrid layers are not expressible"
    if row["case"].startswith("gpt_grpo") or row["test_type"] == "unknown":
        return "RL (GRPO) step: rollout generation inside the step is not a pretraining step"
    if row["precision"] not in PRECISIONS:
        return f"precision '{row['precision']}' not modelled (bf16/fp16/fp8/fp4 GEMMs only)"
    if "pipeline-model-parallel-layout" in row["vpp_source"]:
        return "explicit --pipeline-model-parallel-layout is not expressible (even or balanced splits only)"
    if row["fsdp_impl"] not in ("none", "megatron_fsdp"):
        return f"FSDP implementation '{row['fsdp_impl']}' not modelled (Megatron-FSDP only)"
    if _int(row["seq_length"]) is None or _int(row["global_batch_size"]) is None:
        return f"sequence length / batch not given ({row['seq_length']}, {row['global_batch_size']})"
    try:
        float(row["step_time_s"])
    except ValueError:
        return "no step time after warm-up"
    return None


def selection_reason(row: dict[str, str]) -> str | None:
    """Why an expressible row is left out of the fitting/validation selection, or None (used).

    * copies: a byte-identical iteration-time series of another row (PROVENANCE caveat 8); the
      row whose run_id sorts first is kept;
    * 1-node GB200 (4 GPUs): another environment, 3-32x slower than the 2-node twins (caveat 1);
    * DGX Cloud H100 (``dgxh100_dgxc``): another environment, 7-10x slower (caveat 11);
    * single runs whose IQR exceeds 25 % of the median (too noisy to fit on).
    Deterministic mode, timing-log-level 2, checkpoint saves inside the window and per-iteration
    logging are kept: they are mechanisms of the run, recorded per row as flags.
    """
    twin = row["identical_iteration_time_series_as"]
    if twin not in ("none", "") and min(twin.split(";") + [row["run_id"]]) != row["run_id"]:
        return f"copy of another row (byte-identical iteration times as {min(twin.split(';'))})"
    if row["system"] == "gb200-nvl72" and _int(row["num_gpus"]) == 4:
        return "1-node GB200 (4 GPUs): another environment, several times slower than 2-node twins"
    if row["golden_platform_suffix"] == "dgxh100_dgxc":
        return "DGX Cloud H100 golden: another environment, several times slower than dgx_h100"
    iqr, med = float(row["step_time_iqr_s"] or 0.0), float(row["step_time_s"])
    if iqr / med > NOISE_LIMIT:
        return f"noisy single run (IQR {100 * iqr / med:.0f} % of the median, limit {100 * NOISE_LIMIT:.0f} %)"
    return None


def _settings(row: dict[str, str], model: ModelSpec) -> dict[str, Any]:
    """Scenario settings of the row beyond the MeasuredRun columns (CLI-style keys)."""
    out: dict[str, Any] = {"overlap_grad_reduce": _bool(row["overlap_grad_reduce"]),
                           "sequence_parallel": _bool(row["sequence_parallel"])}
    flags = row["precision_flags"]
    half_grads = row["precision"] == "fp16" and "accumulate-allreduce-grads-in-fp32=true" not in flags
    out["grad_reduce_dtype"] = "bf16" if half_grads or "grad-reduce-in-bf16=true" in flags else "fp32"
    if row["recompute_granularity"] == "selective" and row["recompute_modules"] not in ("n/a", "none"):
        out["recompute_modules"] = [m for m in row["recompute_modules"].strip("[]").split() if m in RECOMPUTE_MODULES]
    if model.moe is not None and row["moe_token_dispatcher_type"] in ("allgather", "alltoall", "flex"):
        out["moe_token_dispatcher_type"] = row["moe_token_dispatcher_type"]
        if row["moe_flex_dispatcher_backend"] in ("deepep", "hybridep"):
            out["moe_flex_dispatcher_backend"] = row["moe_flex_dispatcher_backend"]
        # --overlap-moe-expert-parallel-comm: the merged forward-backward steps (combined 1F1B)
        out["ep_comm_overlap"] = _bool(row["overlap_moe_expert_parallel_comm"])
    out["gradient_accumulation_fusion"] = not _bool(row["no_gradient_accumulation_fusion"])
    if row["attention_backend"] in ("auto", "flash", "fused", "unfused", "local"):
        out["attention_backend"] = row["attention_backend"]
    if row["transformer_impl"] in ("transformer_engine", "local"):
        out["transformer_impl"] = row["transformer_impl"]
    out["log_params_norm"] = _bool(row["log_params_norm"])
    out["log_num_zeros_in_grad"] = _bool(row["log_num_zeros_in_grad"])
    if _int(row["check_weight_hash_across_dp_replicas_interval"]) == 1:
        # step_time_s is a median of per-iteration times: it carries a check made every iteration;
        # one made every N >= 2 iterations touches at most half of them and leaves the median alone
        out["check_weight_hash_interval"] = 1
    # Megatron-LM's defaults for the fusions the CSV does not list (the Bridge recipes turn them on);
    # the cases named for it add --cross-entropy-loss-fusion
    out["cross_entropy_loss_fusion"] = "cross_entropy_loss_fusion" in row["case"]
    if model.moe is not None:
        out["moe_grouped_gemm"] = _bool(row["moe_grouped_gemm"])
        out["moe_permute_fusion"] = _bool(row["moe_permute_fusion"])
        out["moe_router_fusion"] = False
    graphs = row["cuda_graph_impl"].split("(")[0]
    if graphs in ("local", "transformer_engine"):
        out["cuda_graph_impl"] = graphs
        scope = re.search(r"cuda-graph-(?:scope|modules)=\[?([a-z_ ]+)\]?", row["cuda_graph_flags"])
        if scope:
            out["cuda_graph_scope"] = scope.group(1).split()
    return out


def _flags(row: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {k: row[c] for k, c in FLAG_COLUMNS.items()}
    out["ckpt_saves_in_window"] = _count(row["ckpt_save_iters_in_window"])
    out["eval_in_window"] = _count(row["eval_iters_in_window"])
    out["noise_iqr_rel"] = round(float(row["step_time_iqr_s"] or 0.0) / float(row["step_time_s"]), 4)
    return out


def recording_release(row: dict[str, str]) -> str:
    """The run's software environment: ``mcore-ci.<recording date>.<commit>``. Each golden file is
    one CI job of the commit that recorded it (its container, Transformer Engine and machine pool);
    the release family (``mcore-ci.<date>``) groups the files recorded that day, newest last."""
    commit = row["release"].removeprefix("mcore-ci-")
    return f"mcore-ci.{row['values_recorded_date'].replace('-', '')}.{commit}"


def row_to_run(row: dict[str, str]) -> MeasuredRun | SkippedRun:
    """The MeasuredRun of one CI row, or a SkippedRun with the one-line reason it is not expressible."""
    model_name = f"ci:{row['case']}"
    reason = unsupported_reason(row)
    spec = model_spec(row) if reason is None else reason
    if isinstance(spec, str):
        return SkippedRun(row["run_id"], model_name, row["system"], f"unsupported: {spec}")
    tp, cp = int(row["tp"]), int(row["cp"])
    fsdp = int(row["num_gpus"]) // (tp * int(row["pp"])) if row["fsdp_impl"] == "megatron_fsdp" else 0
    distribution = row["optimizer_distribution"]
    settings = _settings(row, spec)
    if row["optimizer"] == "muon":
        muon = muon_settings(row)
        if isinstance(muon, str):
            return SkippedRun(row["run_id"], model_name, row["system"], f"unsupported: {muon}")
        settings.update(muon)
    elif row["optimizer"] != "adamw":
        return SkippedRun(row["run_id"], model_name, row["system"], f"unsupported: optimizer '{row['optimizer']}'")
    data: dict[str, Any] = dict(
        run_id=row["run_id"], source=row["source"], release=recording_release(row), model=spec.name, system=row["system"],
        num_gpus=int(row["num_gpus"]), precision=PRECISIONS[row["precision"]],
        global_batch_size=int(row["global_batch_size"]), micro_batch_size=int(row["micro_batch_size"]),
        seq_length=int(row["seq_length"]), tp=tp, pp=int(row["pp"]), vpp=int(row["vpp"]), cp=cp,
        ep=int(row["ep"]) if spec.moe else 1, etp=int(row["etp"]) if spec.moe else 1, fsdp=fsdp,
        mtp=spec.mtp_layers, optimizer=row["optimizer"], step_time_s=float(row["step_time_s"]),
        optimizer_distribution=distribution if distribution in ("replicated", "element_wise", "layer_wise") else None,
        overlap_param_gather=_bool(row["overlap_param_gather"]), tp_comm_overlap=_bool(row["tp_comm_overlap"]),
        recompute=row["recompute_granularity"] if row["recompute_granularity"] in ("full", "selective") else "none",
        model_spec=spec, scenario_settings=settings, extra=_flags(row))
    try:
        return MeasuredRun.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        return SkippedRun(row["run_id"], model_name, row["system"],
                          f"unsupported: {'.'.join(map(str, first['loc']))}: {first['msg']}")


def read_rows(path: str | Path) -> list[dict[str, str]]:
    """The rows of a Megatron CI CSV (the shared file or the shipped copy)."""
    p = Path(path)
    if not p.is_file():
        raise UserInputError(f"Megatron CI runs file '{p}' does not exist")
    with p.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    missing = [c for c in COLUMNS if rows and c not in rows[0]]
    if missing:
        raise UserInputError(f"file '{p}', column '{missing[0]}': missing (not a Megatron CI runs file)")
    return rows


def is_megatron_ci_csv(path: str | Path) -> bool:
    """Whether ``path`` is a Megatron CI runs CSV (the shared harvest or the shipped copy) rather than
    a CSV of the measured-run schema: its header names the CI columns ``case``, ``family`` and
    ``values_recorded_date``."""
    p = Path(path)
    if p.suffix.lower() != ".csv" or not p.is_file():
        return False
    with p.open(newline="", encoding="utf-8") as fh:
        header = next(csv.reader(fh), [])
    return {"case", "family", "values_recorded_date"} <= {h.strip() for h in header}


def load_megatron_ci(path: str | Path, select: bool = True) -> tuple[list[MeasuredRun], list[SkippedRun]]:
    """Runs and skipped rows (with reasons) of a Megatron CI CSV; ``select`` applies
    :func:`selection_reason` (the rows used for fitting and validation)."""
    runs: list[MeasuredRun] = []
    skipped: list[SkippedRun] = []
    for row in read_rows(path):
        item = row_to_run(row)
        if isinstance(item, MeasuredRun) and select and (why := selection_reason(row)) is not None:
            item = SkippedRun(item.run_id, item.model, item.system, f"not used: {why}")
        (runs if isinstance(item, MeasuredRun) else skipped).append(item)  # type: ignore[arg-type]
    return runs, skipped


def write_copy(rows: Iterable[dict[str, str]], path: str | Path) -> None:
    """Write the columns this loader reads (:data:`COLUMNS`) of ``rows`` to ``path`` (the shipped copy)."""
    with Path(path).open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        for row in rows:
            writer.writerow([row[c] for c in COLUMNS])
