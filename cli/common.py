"""Shared CLI plumbing: one-line errors with exit code 2, scenario flags, output helpers.

Heavy modules (numpy, networkx, simpy, plotly, torch) are imported inside command functions, never
at import time, so that ``muonsim --help`` starts fast.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

F = TypeVar("F", bound=Callable[..., Any])

# flag name -> (scenario key, metavar, help)
SCENARIO_FLAGS: dict[str, tuple[str, str, str]] = {
    "model": ("model", "NAME|FILE", "model: catalogue name or YAML file"),
    "system": ("system", "NAME|FILE", "system: catalogue name or YAML file"),
    "gpus": ("gpus", "INT", "GPUs in the job (default, like every layout value: the model's defaults on the system)"),
    "precision": ("precision", "PREC", "bf16, fp16, fp8-cs, fp8-delayed, fp8-blockwise, mxfp8 or nvfp4 (those the GPU supports)"),
    "tp": ("tp", "INT", "tensor parallel size"),
    "pp": ("pp", "INT", "pipeline parallel size"),
    "vpp": ("vpp", "INT", "virtual pipeline chunks per stage"),
    "cp": ("cp", "INT", "context parallel size"),
    "ep": ("ep", "INT", "expert parallel size"),
    "etp": ("etp", "INT", "expert tensor parallel size"),
    "fsdp": ("fsdp", "INT", "Megatron-FSDP group size (0 = off)"),
    "mbs": ("micro_batch_size", "INT", "micro-batch size (sequences)"),
    "gbs": ("global_batch_size", "INT", "global batch size (sequences)"),
    "seq": ("seq_length", "INT", "sequence length (tokens)"),
    "sequence_parallel": ("sequence_parallel", "BOOL", "sequence parallelism (default: on when tp > 1)"),
    "tp_comm_overlap": ("tp_comm_overlap", "BOOL", "overlap TP communication with GEMMs (Megatron --tp-comm-overlap)"),
    "ep_comm_overlap": ("ep_comm_overlap", "BOOL", "hide EP all-to-all under the paired micro-batch (--overlap-moe-expert-parallel-comm)"),
    "recompute": ("recompute", "MODE", "activation recompute: none, selective or full"),
    "pipeline_split": ("pipeline_split", "MODE", "auto, even or balanced"),
    "mtp": ("mtp_layers", "INT", "multi-token-prediction layers (overrides the model)"),
    "optimizer": ("optimizer", "KIND", "adamw or muon"),
    "distribution": ("distribution", "MODE", "replicated, element_wise or layer_wise"),
    "layout": ("layer_wise_layout", "MODE", "layer-wise layout: legacy or current"),
    "tp_mode": ("tp_mode", "MODE", "Muon TP Newton-Schulz mode: duplicated, distributed or blockwise (default, as Megatron)"),
    "load_balance": ("load_balance", "MODE", "none, ping_pong or lpt"),
    "hide_param_gather": ("hide_param_gather", "BOOL", "overlap the parameter all-gather with the next forward (on/off)"),
    "ns_steps": ("ns_steps", "INT", "Newton-Schulz iterations"),
    "ns_coefficients": ("ns_coefficients", "NAME", "quintic, simple, polar_express, cans, aol, deepseekv4, cubic5"),
    "matmul_precision": ("matmul_precision", "PREC", "Newton-Schulz matmul precision: bf16, tf32, fp32"),
    "syrk": ("use_syrk", "BOOL", "use SYRK for the symmetric Newton-Schulz products (needs --eo-version >= 0.4)"),
    "eo_version": ("eo_version", "VER", "Emerging-Optimizers release: 0.3.0 (default, Megatron-Core's pin), 0.3.1 or 0.4.0"),
    "split_qkv": ("split_qkv", "BOOL", "orthogonalise Q, K, V separately"),
    "nesterov": ("use_nesterov", "BOOL", "Muon Nesterov momentum (Megatron --muon-use-nesterov; default off)"),
    "grad_dtype": ("grad_reduce_dtype", "DTYPE", "gradient reduce dtype: fp32 or bf16"),
    "fp8_param_gather": ("fp8_param_gather", "BOOL", "keep TE weights in FP8 and gather them so (AdamW, fp8-cs/mxfp8)"),
    "reuse_grad_buf_for_mxfp8_param_ag": ("reuse_grad_buf_for_mxfp8_param_ag", "BOOL",
                                          "mxfp8: gather BF16 parameters into the gradient buffer"),
    "gpus_per_domain": ("gpus_per_domain", "INT", "GPUs used per NVLink domain (placement policy override)"),
}

# Recipe settings (Megatron names; lists joined with '+'; booleans on/off): workloads/runtime.py and the
# recipe fields of Parallelism / OptimizerSpec / Placement. Shown in their own help panel.
RECIPE_FLAGS: dict[str, tuple[str, str, str]] = {
    "recompute_modules": ("recompute_modules", "LIST", "selective recompute modules, e.g. core_attn+mla_up_proj"),
    "recompute_method": ("recompute_method", "MODE", "full recompute: uniform or block"),
    "recompute_num_layers": ("recompute_num_layers", "INT", "full recompute: layers per block"),
    "pipeline_model_parallel_layout": ("pipeline_model_parallel_layout", "LAYOUT", "e.g. 'Et*4|(t*4|)*14tmL'"),
    "account_for_embedding_in_pipeline_split": ("account_for_embedding_in_pipeline_split", "BOOL",
                                                "the embedding counts as a layer in the pipeline split"),
    "account_for_loss_in_pipeline_split": ("account_for_loss_in_pipeline_split", "BOOL",
                                           "the loss counts as a layer in the pipeline split"),
    "cuda_graph_impl": ("cuda_graph_impl", "MODE", "none, local, transformer_engine or full_iteration"),
    "cuda_graph_scope": ("cuda_graph_scope", "LIST", "attn, mlp, moe, moe_router, moe_preprocess ... (+-joined)"),
    "moe_token_dispatcher_type": ("moe_token_dispatcher_type", "MODE", "allgather, alltoall or flex"),
    "moe_flex_dispatcher_backend": ("moe_flex_dispatcher_backend", "MODE", "deepep or hybridep"),
    "moe_hybridep_num_sms": ("moe_hybridep_num_sms", "INT", "SMs of the HybridEP kernels"),
    "moe_deepep_num_sms": ("moe_deepep_num_sms", "INT", "SMs of the DeepEP kernels"),
    "delay_wgrad_compute": ("delay_wgrad_compute", "BOOL", "delay expert wgrad under the combine (with EP overlap)"),
    "moe_shared_expert_overlap": ("moe_shared_expert_overlap", "BOOL", "shared expert on a side stream"),
    "moe_permute_fusion": ("moe_permute_fusion", "BOOL", "fused token permute/unpermute"),
    "moe_router_fusion": ("moe_router_fusion", "BOOL", "fused router top-k/softmax"),
    "moe_grouped_gemm": ("moe_grouped_gemm", "BOOL", "grouped expert GEMM (off: one GEMM per expert)"),
    "moe_router_dtype": ("moe_router_dtype", "DTYPE", "router logits dtype: fp32 or fp64"),
    "tp_comm_overlap_cfg": ("tp_comm_overlap_cfg", "CFG", "per GEMM GEMM:METHOD[:NUM_SM], +-joined, e.g. "
                                                          "qkv_dgrad:bulk:8+proj_fprop:ring_exchange"),
    "overlap_p2p_comm": ("overlap_p2p_comm", "BOOL", "asynchronous pipeline sends/receives"),
    "batch_p2p_comm": ("batch_p2p_comm", "BOOL", "batched pipeline sends/receives"),
    "defer_embedding_wgrad_compute": ("defer_embedding_wgrad_compute", "BOOL", "output-layer wgrad in the drain"),
    "wgrad_deferral_limit": ("wgrad_deferral_limit", "INT", "micro-batches with deferred output-layer wgrad"),
    "cpu_offloading": ("cpu_offloading", "BOOL", "offload activations to the host"),
    "cpu_offloading_num_layers": ("cpu_offloading_num_layers", "INT", "layers offloaded"),
    "fine_grained_activation_offloading": ("fine_grained_activation_offloading", "BOOL", "offload offload_modules"),
    "offload_modules": ("offload_modules", "LIST", "modules whose activations are offloaded (+-joined)"),
    "cross_entropy_loss_fusion": ("cross_entropy_loss_fusion", "BOOL", "fused cross-entropy"),
    "cross_entropy_fusion_impl": ("cross_entropy_fusion_impl", "MODE", "native or te"),
    "attention_backend": ("attention_backend", "MODE", "auto, flash, fused, unfused or local"),
    "apply_rope_fusion": ("apply_rope_fusion", "BOOL", "fused RoPE"),
    "bias_activation_fusion": ("bias_activation_fusion", "BOOL", "fused SwiGLU"),
    "gradient_accumulation_fusion": ("gradient_accumulation_fusion", "BOOL", "wgrad accumulates into main_grad in the GEMM"),
    "use_transformer_engine_op_fuser": ("use_transformer_engine_op_fuser", "BOOL", "TE op fuser"),
    "first_last_layers_bf16": ("first_last_layers_bf16", "BOOL", "keep first/last layers in BF16"),
    "num_layers_at_start_in_bf16": ("num_layers_at_start_in_bf16", "INT", "BF16 layers at the start"),
    "num_layers_at_end_in_bf16": ("num_layers_at_end_in_bf16", "INT", "BF16 layers at the end"),
    "cuda_device_max_connections": ("cuda_device_max_connections", "INT", "CUDA_DEVICE_MAX_CONNECTIONS (1-32)"),
    "check_weight_hash_interval": ("check_weight_hash_interval", "INT", "iterations between Megatron's weight-hash "
                                   "checks across DP replicas (host SHA-1 of every parameter; default off)"),
    "nccl_nvls_enable": ("nccl_nvls_enable", "BOOL", "NCCL_NVLS_ENABLE: NVLink SHARP collectives"),
    "nvte_fwd_layernorm_sm_margin": ("nvte_fwd_layernorm_sm_margin", "INT", "NVTE_FWD_LAYERNORM_SM_MARGIN"),
    "nvte_bwd_layernorm_sm_margin": ("nvte_bwd_layernorm_sm_margin", "INT", "NVTE_BWD_LAYERNORM_SM_MARGIN"),
    "num_of_hybrid_ep_ranks_per_nvlink_domain": ("num_of_hybrid_ep_ranks_per_nvlink_domain", "INT",
                                                 "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"),
    "use_mnnvl": ("use_mnnvl", "BOOL", "USE_MNNVL"),
    "nccl_p2p_net_chunksize": ("nccl_p2p_net_chunksize", "BYTES", "NCCL_P2P_NET_CHUNKSIZE"),
    "overlap_grad_reduce": ("overlap_grad_reduce", "BOOL", "overlap the gradient reduce-scatter with backward"),
    "bucket_size": ("bucket_size_elements", "INT", "DDP bucket size (elements)"),
    "fp8_param_gather": ("fp8_param_gather", "BOOL", "FP8 parameter all-gather"),
    "reuse_grad_buf_for_mxfp8_param_ag": ("reuse_grad_buf_for_mxfp8_param_ag", "BOOL",
                                          "MXFP8 parameter all-gather into the gradient buffer"),
    "overlap_param_gather_with_optimizer_step": ("overlap_param_gather_with_optimizer_step", "BOOL",
                                                 "first chunk's gather overlaps the optimizer step"),
    "align_param_gather": ("align_param_gather", "BOOL", "issue all chunks' parameter gathers together"),
    "num_distributed_optimizer_instances": ("num_distributed_optimizer_instances", "INT",
                                            "distributed-optimizer instances (partial sharding)"),
    "average_in_collective": ("average_in_collective", "BOOL", "average in the reduction (no 1/dp pre-scaling pass)"),
    "data_parallel_sharding_strategy": ("data_parallel_sharding_strategy", "MODE",
                                        "Megatron-FSDP: no_shard, optim, optim_grads, optim_grads_params"),
    "fsdp_double_buffer": ("fsdp_double_buffer", "BOOL", "Megatron-FSDP double buffer"),
    "nccl_ub": ("nccl_ub", "BOOL", "Megatron-FSDP NCCL user buffers"),
    "suggested_communication_unit_size": ("suggested_communication_unit_size", "INT",
                                          "Megatron-FSDP communication unit (elements)"),
    "keep_fp8_transpose_cache": ("keep_fp8_transpose_cache", "BOOL", "Megatron-FSDP FP8 transpose cache"),
    "use_precision_aware_optimizer": ("use_precision_aware_optimizer", "BOOL", "precision-aware optimizer"),
    "main_grads_dtype": ("main_grads_dtype", "DTYPE", "fp32, bf16, fp16 or fp8"),
    "main_params_dtype": ("main_params_dtype", "DTYPE", "fp32, bf16, fp16 or fp8"),
    "exp_avg_dtype": ("exp_avg_dtype", "DTYPE", "fp32, bf16, fp16 or fp8"),
    "exp_avg_sq_dtype": ("exp_avg_sq_dtype", "DTYPE", "fp32, bf16, fp16 or fp8"),
    "optimizer_cpu_offload": ("optimizer_cpu_offload", "BOOL", "optimizer state and step on the host"),
    "use_tp_pp_dp_mapping": ("use_tp_pp_dp_mapping", "BOOL", "rank order tp-cp-ep-pp-dp instead of tp-cp-ep-dp-pp"),
}
SCENARIO_FLAGS.update(RECIPE_FLAGS)


# Options shared by several verbs (one definition each).
ScenarioFileArg = Annotated[Path | None, typer.Argument(metavar="FILE", help="scenario YAML (default: built-in scenario)")]
EngineOpt = Annotated[str, typer.Option("--engine", metavar="analytic|des", help="step engine")]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]
WideOpt = Annotated[bool, typer.Option("--wide", help="wide tables (160 columns) instead of fitting the terminal")]
CalibrationOpt = Annotated[Path | None, typer.Option(
    "--calibration", metavar="FILE",
    help="calibration profile YAML; default: the built-in profile; 'none': datasheet defaults")]
ReleaseOpt = Annotated[str | None, typer.Option(
    "--release", metavar="TAG",
    help="take the Megatron-Bridge recipe settings of release TAG for this model and system (e.g. 26.06; the "
         "newest release's when TAG has none) under the settings you give; also the profile's factors for TAG "
         "if it has any")]


class CliError(Exception):
    """Raised inside commands for a one-line user error."""


def fail(message: str, code: int = 2) -> None:
    """Print ``error: message`` (one line) to stderr and exit."""
    typer.echo(f"error: {' '.join(str(message).split())}", err=True)
    raise typer.Exit(code)


def user_errors(func: F) -> F:
    """Decorator: turn UserInputError / UnsupportedScenario / CliError into one line and exit 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from topologies.inputs import UserInputError

        try:
            return func(*args, **kwargs)
        except (UserInputError, CliError) as err:
            fail(str(err))
        except Exception as err:  # unsupported scenarios come from costmodel; keep the import lazy
            if type(err).__name__ == "UnsupportedScenario":
                fail(f"unsupported scenario: {err}")
            raise

    return wrapper  # type: ignore[return-value]


def with_scenario_flags(func: F) -> F:
    """Add every scenario flag (``--tp``, ``--model`` ...) as a string option.

    The wrapped function receives ``scenario_flags: dict[str, str]`` holding the flags the user
    gave (scenario keys, raw strings); pydantic converts and validates them. ``compare`` splits
    comma-separated values itself.
    """
    # eval_str: the commands use postponed annotations; typer must see the real Annotated[...] objects
    sig = inspect.signature(func, eval_str=True)
    params = [p for p in sig.parameters.values() if p.name != "scenario_flags"]
    for flag, (_, metavar, help_text) in SCENARIO_FLAGS.items():
        option = typer.Option(None, f"--{flag.replace('_', '-')}", metavar=metavar, help=help_text,
                              rich_help_panel="Recipe settings" if flag in RECIPE_FLAGS else "Scenario")
        params.append(inspect.Parameter(flag, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=str | None))

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        flags = {}
        for flag, (key, _, _) in SCENARIO_FLAGS.items():
            value = kwargs.pop(flag, None)
            if value is not None:
                flags[key] = value
        return func(*args, scenario_flags=flags, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


FLAG_OF_KEY = {key: f"--{flag.replace('_', '-')}" for flag, (key, _, _) in SCENARIO_FLAGS.items()}


def layered_scenario(scenario_file: Path | None, flags: dict[str, Any],  # noqa: ANN201
                     typed: set[str] | None = None):
    """The layered configuration (model × system defaults < file < flags), not yet validated.

    ``typed``: the keys of ``flags`` the user typed (default: all); a bad value of one is reported by its flag."""
    from workloads.scenario import read_scenario_file
    from workloads.scenario_defaults import layered_config

    data = read_scenario_file(scenario_file) if scenario_file is not None else None
    names = {k: FLAG_OF_KEY[k] for k in flags if k in FLAG_OF_KEY and (typed is None or k in typed)}
    return layered_config(data, flags, file=str(scenario_file) if scenario_file is not None else None,
                          flag_names=names)


def resolve_with_layout(scenario_file: Path | None, flags: dict[str, Any],  # noqa: ANN201
                        typed: set[str] | None = None):
    """(validated Scenario, its Layered configuration) from an optional YAML file plus flags.

    The scenario inherits the defaults of its model on its system for what neither the file nor a
    flag sets; an error caused by an inherited value names it and where it came from. ``typed``: as
    :func:`layered_scenario`.
    """
    from workloads.scenario_defaults import resolve_layered

    layered = layered_scenario(scenario_file, flags, typed)
    return resolve_layered(layered, FLAG_OF_KEY), layered


def resolve_scenario(scenario_file: Path | None, flags: dict[str, Any]):  # noqa: ANN201
    """Build and validate a Scenario from an optional YAML file plus flags (raises UserInputError)."""
    return resolve_with_layout(scenario_file, flags)[0]


def resolve_release_scenario(scenario_file: Path | None, flags: dict[str, Any], release: str | None):  # noqa: ANN201
    """(Scenario, its Layered configuration, ReleaseSettings or None).

    With ``release``, the published recipe settings of that release for the scenario's model and
    system fill every setting the user did not give (flags or scenario file), on top of the model ×
    system defaults; without, or when the model never ran on the system, muonsim's defaults."""
    from topologies.inputs import UserInputError, load_yaml_file
    from workloads.recipe_settings import recipe_for, release_settings

    scenario, layered = resolve_with_layout(scenario_file, flags)
    if release is None:
        return scenario, layered, None
    choice = recipe_for(scenario.model.name, scenario.system.name, release, scenario.gpus, scenario.precision.value)
    if choice is None:
        return scenario, layered, None
    user = set(flags)
    if scenario_file is not None:
        data = load_yaml_file(scenario_file, "scenario file")
        user |= {k for section in data.values() if isinstance(section, dict) for k in section} | set(data)
    p = scenario.par
    sizes = {"pp": p.pp, "vpp": p.vpp, "ep": p.ep, "fsdp": p.fsdp, "tp": p.tp, "num_layers": scenario.model.num_layers,
             "mtp_layers": scenario.model.mtp_layers}
    chosen = release_settings(choice, user, sizes)
    try:
        scenario, layered = resolve_with_layout(scenario_file, {**chosen.applied, **flags}, typed=set(flags))
    except UserInputError as err:
        raise UserInputError(f"with the recipe settings of release {choice.release} ({choice.run_id}): {err}") from None
    for key in chosen.applied:  # passed as flags, but not set by the user
        if key not in flags:
            layered.origin[key] = "release"
    return scenario, layered, chosen


def with_release_note(report: Any, release: str | None, chosen: Any, scenario: Any) -> Any:
    """``report`` with a warning when ``--release`` applied no recipe settings because the settings file
    has no run of the scenario's model on its system (muonsim's defaults stay); otherwise ``report``."""
    if release is None or chosen is not None:
        return report
    note = (f"--release {release} applies no recipe settings: no Megatron-Bridge recipe run of "
            f"{scenario.model.name} on {scenario.system.name} in the recipe settings file; the settings stay "
            "the scenario's (its defaults and yours)")
    return report.model_copy(update={"warnings": [*report.warnings, note]})


def ignored_setting_notes(report: Any, layered: Any, spec: Any = None) -> list[str]:
    """The 'X has no effect' notes for the settings X the user gave (flag or file): the optimizer plan's,
    and with ``spec`` (the scenario's OptimizerSpec) the settings its optimizer never reads."""
    from workloads.optimizer_spec import unused_setting_notes

    mine = set(layered.to_json_dict()["set_by_user"])
    notes = report.optimizer.notes if report.optimizer is not None else ()
    notes = (*notes, *(unused_setting_notes(spec) if spec is not None else ()))
    return [n for n in notes if any(f"{key} has no effect" in n for key in mine)]


def release_settings_lines(chosen: Any, scenario: Any = None) -> list[str]:
    """What ``predict``/``compare`` print about the recipe settings they used (one item per line); with
    ``scenario``, also the flags that would give it the recipe run's own layout when it differs (the
    settings come from the run; the layout does not)."""
    from topologies.inputs import plural
    from workloads.recipe_settings import layout_mismatch_flags
    from workloads.runtime import tp_overlap_text
    from workloads.scenario import setting_default

    if chosen is None:
        return []

    def show(key: str, v: Any) -> str:
        if key == "tp_comm_overlap_cfg" and isinstance(v, tuple | list):
            return tp_overlap_text(v)  # as --tp-comm-overlap-cfg takes it
        if isinstance(v, tuple | list):
            return "+".join(str(getattr(x, "gemm", x)) for x in v) or "[]"
        return str(v)

    differ = {k: v for k, v in chosen.applied.items() if v != setting_default(k)}
    lines = [f"recipe settings: {chosen.choice.source}",
             "  applied, differing from muonsim's defaults: "
             + (", ".join(f"{k}={show(k, v)}" for k, v in sorted(differ.items())) or "none"),
             f"  applied, equal to muonsim's defaults: {plural(len(chosen.applied) - len(differ), 'setting')} (--json lists all)"]
    if chosen.kept:
        lines.append("  yours kept: " + ", ".join(chosen.kept))
    lines += [f"  not applied: {k} ({why})" for k, why in chosen.skipped.items()]
    flags = layout_mismatch_flags(chosen.choice.run_id, scenario) if scenario is not None else ""
    if flags:
        lines.append(f"  layout: not the recipe run's (--release sets recipe settings, not the layout); "
                     f"that run's layout: {flags}")
    return lines


def load_calibration(path: Path | None, use_default: bool = True):  # noqa: ANN201
    """The calibration profile from ``--calibration`` or the built-in default (None if neither).

    ``--calibration none`` means no profile at all: the systems' datasheet defaults.
    """
    from costmodel.calibrate.profile import default_profile, load_profile

    if path is not None and str(path).lower() == "none":
        return None
    if path is not None:
        return load_profile(path)
    return default_profile() if use_default else None


def check_release(profile: Any, release: str | None, system_name: str) -> None:
    """Raise CliError for a malformed ``release`` tag (digits and dots, e.g. 26.04 or 26.04.01).

    A release selects recipe settings (:func:`resolve_release_scenario`); the profile's factors for it
    apply only when the profile has release entries (the built-in profile has none: it fits hardware)."""
    import re

    if release is not None and not re.fullmatch(r"\d+(\.\d+){1,2}", release):
        raise CliError(f"--release '{release}' is not a release tag like 26.04 or 26.04.01")


def finite_json(data: Any) -> Any:
    """``data`` with every NaN or infinite float replaced by None (strict JSON has no NaN/Infinity)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: finite_json(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [finite_json(v) for v in data]
    return data


def print_json(data: Any) -> None:
    """Write strict JSON to stdout (``--json``): non-finite numbers become null, never NaN/Infinity."""
    sys.stdout.write(json.dumps(finite_json(data), indent=2, default=str, allow_nan=False) + "\n")


ENGINES = ("analytic", "des")


def check_engine(engine: str) -> None:
    """Raise CliError unless ``engine`` is a step engine name."""
    if engine not in ENGINES:
        raise CliError(f"--engine: must be one of {', '.join(ENGINES)} (got '{engine}')")


def check_output_paths(*paths: Path | None, flags: tuple[str, ...] = ()) -> None:
    """Raise CliError for an output path that cannot be written, or for two outputs (named by ``flags``, one
    per path) to the same file (checked before any work is done)."""
    given = [(Path(p).resolve(), flag) for p, flag in zip(paths, flags, strict=False) if p is not None]
    for i, (target, flag) in enumerate(given):
        other = next((f for p, f in given[:i] if p == target), None)
        if other is not None:
            raise CliError(f"{other} and {flag} would both write '{target}'; give each its own file")
    for path in paths:
        if path is None:
            continue
        path = Path(path)
        if not path.resolve().parent.is_dir():
            raise CliError(f"directory '{path.parent}' does not exist")
        if path.is_dir():
            raise CliError(f"'{path}' is a directory; give a file name")


def write_text_atomically(path: Path, text: str) -> None:
    """Write a whole file or nothing (temp file + rename)."""
    path = Path(path)
    check_output_paths(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise CliError(f"cannot write '{path}': {err.strerror or err}") from None


def hide_flag_types(command: Any) -> None:
    """No value shown beside on/off flags (--json, --version, ...) in the help of ``command`` and its
    subcommands: typer prints '<bool>' there, which reads as a value to type ('--json true'). An argument
    with a metavar (FILE, NAME|FILE) is shown by it alone, without typer's type ('<path>') beside it."""
    if getattr(command, "flag_types_hidden", False):
        return
    command.flag_types_hidden = True
    for param in command.params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
        if getattr(param, "param_type_name", "") == "argument" and param.metavar is not None:
            param.display_type_rich = lambda ctx: None
    help_option = command.get_help_option

    def get_help_option(ctx: Any) -> Any:
        option = help_option(ctx)
        if option is not None and option.metavar is None:
            option.metavar = ""
        return option

    command.get_help_option = get_help_option
    for sub in getattr(command, "commands", {}).values():
        hide_flag_types(sub)
