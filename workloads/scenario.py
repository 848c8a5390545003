"""The Scenario: System + Model + Parallelism + OptimizerSpec + Precision (+ placement policy).

The optimizer section lives in :mod:`workloads.optimizer_spec` (re-exported here).

Two layers: :class:`ScenarioConfig` is what a user writes (YAML file or CLI flags; names of catalogue
entries or paths), :class:`Scenario` is the resolved, validated object every engine consumes.
Every invalid combination a user can type raises :class:`UserInputError` with one line naming the
field and what would be valid. ``dp`` is derived, never given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from topologies.hardware import Precision, SystemSpec, load_system
from topologies.inputs import (
    NoBoolNumbers,
    UserInputError,
    describe_validation_error,
    flag_words,
    load_yaml_file,
)
from workloads.models import ModelSpec, resolve_model
from workloads.optimizer_spec import (
    EO_MIN_SYRK_CUBIC5,
    MEGATRON_LOAD_BALANCE,
    Distribution,
    LayerWiseLayout,
    LoadBalance,
    OptimizerKind,
    OptimizerSpec,
    TpMode,
    hypothetical_reason,
)
from workloads.pipeline_layout import PipelineSplit, StageSplit, virtual_stage_layer_counts
from workloads.runtime import RuntimeSettings, split_list

Recompute = Literal["none", "selective", "full"]
RecomputeMethod = Literal["uniform", "block"]
RecomputeModule = Literal["core_attn", "layernorm", "mla_up_proj", "mlp", "moe_act", "moe", "shared_experts"]


__all__ = ["DEFAULT_SCENARIO", "MEGATRON_LOAD_BALANCE", "Distribution", "LayerWiseLayout", "LoadBalance",
           "OptimizerKind", "OptimizerSpec", "Parallelism", "Placement", "Recompute", "RecomputeModule", "Scenario",
           "ScenarioConfig", "TpMode", "apply_overrides", "build_config", "hypothetical_reason", "load_scenario_config",
           "read_scenario_file", "scenario_keys", "section_of", "setting_default"]


class _Strict(NoBoolNumbers):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Parallelism(_Strict):
    """Megatron parallel sizes and batch shape (sizes are counts; 1 means off)."""

    tp: int = Field(1, gt=0, description="tensor parallel size")
    pp: int = Field(1, gt=0, description="pipeline parallel size")
    vpp: int = Field(1, gt=0, description="virtual pipeline chunks per stage (interleaved 1F1B)")
    cp: int = Field(1, gt=0, description="context parallel size")
    ep: int = Field(1, gt=0, description="expert parallel size")
    etp: int | None = Field(None, gt=0, description="expert tensor parallel size (default: 1)")
    fsdp: int = Field(0, ge=0, description="Megatron-FSDP sharding group size, 0 = off")
    micro_batch_size: int = Field(1, gt=0, description="sequences per micro-batch")
    global_batch_size: int = Field(gt=0, description="sequences per optimizer step")
    seq_length: int = Field(gt=0, description="tokens per sequence")
    sequence_parallel: bool | None = Field(None, description="default: on when tp > 1")
    tp_comm_overlap: bool = Field(False, description="overlap the TP all-gather/reduce-scatter with the GEMMs "
                                  "(Megatron --tp-comm-overlap, TE userbuffers); off by default as in Megatron-Core")
    ep_comm_overlap: bool = Field(False, description="run each micro-batch's EP dispatch/combine under the other micro-batch's "
                                  "compute in 1F1B's merged forward-backward steps (Megatron --overlap-moe-expert-parallel-comm); "
                                  "off by default")
    recompute: Recompute = Field("none", description="Megatron --recompute-granularity: none, selective (the "
                                 "recompute_modules) or full (whole layers)")
    recompute_modules: tuple[RecomputeModule, ...] = Field(default=("core_attn",), description="modules for selective recompute (Megatron-Core names)")
    recompute_method: RecomputeMethod | None = Field(None, description="Megatron --recompute-method for full recompute: "
                                                     "uniform (every recompute_num_layers-layer block is a checkpoint) or "
                                                     "block (the first recompute_num_layers layers of each virtual stage "
                                                     "are recomputed, the rest are not); None = every layer")
    recompute_num_layers: int | None = Field(None, gt=0, description="Megatron --recompute-num-layers (with recompute_method)")
    pipeline_split: PipelineSplit = "auto"
    pipeline_model_parallel_layout: str | None = Field(
        None, description="Megatron --pipeline-model-parallel-layout, e.g. 'Et*4|(t*4|)*14tmL': per virtual stage "
                          "(chunk-major) E embedding, t transformer layer, m MTP layer, L loss; overrides pipeline_split")
    account_for_embedding_in_pipeline_split: bool = Field(False, description="Megatron --account-for-embedding-in-"
                                                          "pipeline-split: the embedding counts as one layer")
    account_for_loss_in_pipeline_split: bool = Field(False, description="Megatron --account-for-loss-in-pipeline-"
                                                     "split: the output layer and loss count as one layer")

    @field_validator("recompute_modules", mode="before")
    @classmethod
    def _split_modules(cls, value: Any) -> Any:
        return split_list(value)

    @property
    def expert_tp(self) -> int:
        """Expert tensor-parallel size: ``etp`` when set, else 1."""
        return self.etp if self.etp is not None else 1

    @property
    def stage_split(self) -> StageSplit:
        """How layers are split over virtual stages: layout, account-for flags, then pipeline_split."""
        return StageSplit(self.pipeline_split, self.pipeline_model_parallel_layout,
                          self.account_for_embedding_in_pipeline_split, self.account_for_loss_in_pipeline_split)

    @property
    def uses_sequence_parallel(self) -> bool:
        """Whether sequence parallelism is on (default: when tp > 1)."""
        return self.tp > 1 if self.sequence_parallel is None else self.sequence_parallel


class Placement(_Strict):
    """How a job is laid onto NVLink domains (overridable placement policy)."""

    gpus_per_domain: int | None = Field(
        None, gt=0, description="GPUs used per NVLink domain; default: the policy in topologies.placement"
    )
    use_tp_pp_dp_mapping: bool = Field(False, description="Megatron --use-tp-pp-dp-mapping: rank order tp-cp-ep-pp-dp "
                                       "(pipeline stages adjacent, data-parallel replicas outermost) instead of "
                                       "tp-cp-ep-dp-pp")


class ScenarioConfig(_Strict):
    """What a user writes: names or paths for system and model, plus the settings."""

    system: str = "gb300-nvl72"
    model: str | ModelSpec = Field("kimi-k2", description="catalogue name, YAML path, or an inline architecture")
    gpus: int = Field(256, gt=0)
    precision: Precision = Precision.MXFP8
    parallelism: Parallelism = Parallelism(
        tp=1, pp=4, vpp=4, ep=64, micro_batch_size=2, global_batch_size=4096, seq_length=4096
    )
    optimizer: OptimizerSpec = OptimizerSpec()
    placement: Placement = Placement()
    runtime: RuntimeSettings = RuntimeSettings()
    mtp_layers: int | None = Field(None, ge=0, description="override the model's MTP layers")

    def resolve(self) -> Scenario:
        """Load catalogue entries and validate every cross-field rule."""
        model = resolve_model(self.model)
        if self.mtp_layers is not None and self.mtp_layers != model.mtp_layers:
            model = model.model_copy(update={"mtp_layers": self.mtp_layers})
        system = load_system(self.system)
        if not self.runtime.nccl_nvls_enable:  # NCCL_NVLS_ENABLE=0: NCCL uses no NVLink SHARP algorithm
            system = system.without_nvls()
        scenario = Scenario(config=self, system=system, model=model)
        scenario.validate()
        return scenario


DEFAULT_SCENARIO = ScenarioConfig()


def read_scenario_file(path: str | Path) -> dict[str, Any]:
    """The nested mapping of a scenario YAML file (model/system paths made relative to the file)."""
    data = load_yaml_file(path, "scenario file")
    for key in ("system", "model"):  # a relative path that is not found here is looked up next to the file
        value = data.get(key)
        if isinstance(value, str) and value.endswith((".yaml", ".yml")) and not Path(value).is_absolute():
            beside = Path(path).parent / value
            if not Path(value).is_file() and beside.is_file():
                data[key] = str(beside)
    return data


def load_scenario_config(path: str | Path, overrides: dict[str, Any] | None = None) -> ScenarioConfig:
    """Read a scenario YAML file and apply flat CLI-style overrides (see :func:`apply_overrides`)."""
    return build_config(read_scenario_file(path), overrides or {}, source=f"scenario file '{path}'")


def build_config(data: dict[str, Any], overrides: dict[str, Any], source: str = "scenario",
                 flag_names: dict[str, str] | None = None) -> ScenarioConfig:
    """Validate ``data`` (nested scenario mapping) with ``overrides`` applied on top.

    ``flag_names`` maps the override keys the user typed as flags to their flag (``tp`` -> ``--tp``): a bad
    value of one is reported as ``--tp: must be ... (got 0)``, the value as typed, instead of by its path in
    the scenario mapping (which a file's value keeps)."""
    merged = apply_overrides(data, overrides)
    try:
        return ScenarioConfig.model_validate(merged)
    except ValidationError as err:
        flag_error = _flag_value_error(err, overrides, flag_names or {})
        raise UserInputError(flag_error or describe_validation_error(err, source, ScenarioConfig)) from None


def _override_path(key: str) -> tuple[str, ...]:
    """Where :func:`apply_overrides` puts the flat key ``key`` in the nested mapping."""
    if key == "optimizer":
        return ("optimizer", "kind")
    return (_SECTION_OF[key], key) if key in _SECTION_OF else (key,)


def _flag_value_error(err: ValidationError, overrides: dict[str, Any], flag_names: dict[str, str]) -> str | None:
    """``--flag: must be ... (got VALUE)`` when pydantic's first error is about a value given as a flag, else None."""
    first = err.errors()[0]
    loc = tuple(str(part) for part in first.get("loc", ()))
    for key, flag in flag_names.items():
        path = _override_path(key)
        if key in overrides and loc[:len(path)] == path:
            return f"{flag}: {flag_words(str(first.get('msg', 'invalid value')))} (got {overrides[key]})"
    return None


_SECTION_OF = {name: "parallelism" for name in Parallelism.model_fields} | {
    name: "optimizer" for name in OptimizerSpec.model_fields if name != "kind"
} | {name: "placement" for name in Placement.model_fields} | {name: "runtime" for name in RuntimeSettings.model_fields}
_TOP_LEVEL = set(ScenarioConfig.model_fields)
_SECTION_MODELS: dict[str, type[BaseModel]] = {"parallelism": Parallelism, "optimizer": OptimizerSpec,
                                               "placement": Placement, "runtime": RuntimeSettings}


def scenario_keys() -> list[str]:
    """Every flat scenario key (the top-level keys and those of the sections), as overrides take them."""
    return sorted(_TOP_LEVEL | set(_SECTION_OF))


def section_of(key: str) -> str | None:
    """The scenario section ('parallelism', 'optimizer', 'placement', 'runtime') of a flat key, or None."""
    return _SECTION_OF.get(key)


def setting_default(key: str) -> Any:
    """muonsim's default of a flat scenario key (None when the key has no plain default)."""
    section = _SECTION_OF.get(key)
    model = _SECTION_MODELS.get(section or "", ScenarioConfig)
    field = model.model_fields.get(key)
    return None if field is None else field.default


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Apply flat overrides such as ``{"tp": 2, "optimizer": "adamw"}`` onto a nested mapping.

    ``optimizer`` as a string sets ``optimizer.kind``; fields of Parallelism, OptimizerSpec and
    Placement are routed to their section; ``None`` values are ignored.
    """
    out: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    for key, value in overrides.items():
        if value is None:
            continue
        if key == "optimizer" and isinstance(value, str):
            out.setdefault("optimizer", {})["kind"] = value
        elif key in _SECTION_OF:
            section = _SECTION_OF[key]
            if section not in out:
                default = getattr(DEFAULT_SCENARIO, section).model_dump(exclude_unset=True)
                out[section] = default if section == "parallelism" and "parallelism" not in data else {}
            out[section][key] = value
        elif key in _TOP_LEVEL:
            out[key] = value
        else:
            raise UserInputError(f"unknown scenario setting '{key}'")
    return out


@dataclass(frozen=True)
class Scenario:
    """A resolved scenario. Construct through :meth:`ScenarioConfig.resolve`."""

    config: ScenarioConfig
    system: SystemSpec
    model: ModelSpec

    # ----- convenient views -----
    @property
    def par(self) -> Parallelism:
        """The parallelism section of the configuration."""
        return self.config.parallelism

    @property
    def optimizer(self) -> OptimizerSpec:
        """The optimizer section of the configuration."""
        return self.config.optimizer

    @property
    def runtime(self) -> RuntimeSettings:
        """The runtime (recipe) settings of the configuration."""
        return self.config.runtime

    @property
    def precision(self) -> Precision:
        """Training precision of the transformer GEMMs (bf16, fp8-cs, mxfp8, nvfp4)."""
        return self.config.precision

    @property
    def gpus(self) -> int:
        """GPUs in the job."""
        return self.config.gpus

    @property
    def dp(self) -> int:
        """Data-parallel size: gpus / (tp * pp * cp)."""
        p = self.par
        return self.gpus // (p.tp * p.pp * p.cp)

    @property
    def expert_dp(self) -> int:
        """Expert data-parallel size: gpus / (pp * ep * etp)."""
        p = self.par
        return self.gpus // (p.pp * p.ep * p.expert_tp)

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step per data-parallel rank."""
        return self.par.global_batch_size // (self.par.micro_batch_size * self.dp)

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step: global batch size (sequences) x sequence length (tokens)."""
        return self.par.global_batch_size * self.par.seq_length

    @cached_property
    def virtual_stage_layers(self) -> list[int]:
        """Layers per virtual stage (index chunk * pp + stage)."""
        return virtual_stage_layer_counts(self.model.num_layers, self.par.pp, self.par.vpp, self.par.stage_split,
                                          self.model.mtp_layers)

    def with_updates(self, **overrides: Any) -> Scenario:
        """A new validated scenario with flat overrides (same keys as the CLI flags)."""
        data = self.config.model_dump(exclude_unset=False)
        return build_config(data, overrides).resolve()

    # ----- validation -----
    def check_precision(self) -> None:
        """Raise UserInputError unless the GPU's tensor cores support the training precision."""
        supported = self.system.gpu.supported_precisions
        if self.precision not in supported:
            raise UserInputError(
                f"precision {self.precision.value} is not supported by the {self.system.gpu.name} tensor cores of "
                f"{self.system.name}; valid: {', '.join(x.value for x in supported)}")

    def validate(self) -> None:
        """Raise UserInputError (one line) on the first rule this scenario breaks."""
        self.validate_sizes()
        self.validate_batch()
        self.validate_settings()

    def validate_sizes(self) -> None:
        """The rules :meth:`validate` checks before the batch rule (sizes, divisibility, pipeline split).

        Reads nothing of ``micro_batch_size`` (the planner memoises it across micro-batch sizes).
        """
        p, m = self.par, self.model
        mp = p.tp * p.pp * p.cp
        self.check_precision()
        if self.gpus > self.system.max_gpus:
            raise UserInputError(f"gpus {self.gpus} exceeds the {self.system.name} limit of {self.system.max_gpus}")
        if self.gpus % mp:
            raise UserInputError(
                f"gpus {self.gpus} is not divisible by tp·pp·cp = {mp} (tp {p.tp} × pp {p.pp} × cp {p.cp})"
            )
        heads, kv = m.attention.num_heads, m.attention.num_kv_heads
        if heads % p.tp:
            raise UserInputError(f"tp {p.tp} does not divide the {heads} attention heads of {m.name}")
        if kv % p.tp:
            raise UserInputError(f"tp {p.tp} does not divide the {kv} KV heads (query groups) of {m.name}")
        if m.ffn_hidden_size % p.tp and m.num_dense_layers:
            raise UserInputError(f"tp {p.tp} does not divide ffn_hidden_size {m.ffn_hidden_size} of {m.name}")
        if p.tp_comm_overlap and p.tp > 1 and not p.uses_sequence_parallel:
            raise UserInputError("tp_comm_overlap needs sequence parallelism (Megatron asserts it); drop sequence_parallel off")
        if p.ep_comm_overlap and p.ep == 1:
            raise UserInputError("ep_comm_overlap needs ep > 1 (there is no expert all-to-all to hide)")
        if p.ep_comm_overlap and p.pp > 1 and p.vpp == 1:
            raise UserInputError("ep_comm_overlap with pp > 1 needs vpp > 1 (Megatron pairs micro-batches in the interleaved schedule)")
        if p.vpp > 1 and p.pp == 1:
            raise UserInputError("vpp > 1 needs pp > 1 (interleaving splits each pipeline stage)")
        _ = self.virtual_stage_layers  # raises on a bad pipeline split
        if p.seq_length % (2 * p.cp) and p.cp > 1:
            raise UserInputError(f"cp {p.cp} needs seq_length divisible by 2·cp = {2 * p.cp} (load-balanced causal split)")
        if p.uses_sequence_parallel and p.tp > 1 and (p.seq_length // p.cp) % p.tp:
            multiple = math.lcm(2 * p.cp, p.cp * p.tp) if p.cp > 1 else p.tp
            tokens = f"seq_length / cp = {p.seq_length // p.cp}" if p.cp > 1 else f"seq_length = {p.seq_length}"
            raise UserInputError(
                f"sequence parallelism with tp {p.tp} splits each micro-batch's {tokens} tokens over the tp ranks, "
                f"which needs them divisible by {p.tp} (Megatron asserts it); use a seq_length that is a multiple "
                f"of {multiple} tokens, or sequence_parallel off")
        if m.position_embedding == "learned_absolute" and p.seq_length > (m.max_position_embeddings or 0):
            raise UserInputError(
                f"seq_length {p.seq_length} tokens exceeds max_position_embeddings {m.max_position_embeddings} of "
                f"{m.name}: its learned position table has no row past that (Megatron asserts it)")
        if m.moe is None:
            if p.ep > 1 or p.expert_tp > 1:
                raise UserInputError(f"ep and etp must be 1 for {m.name}, which has no experts")
        else:
            if m.moe.num_experts % p.ep:
                raise UserInputError(f"ep {p.ep} does not divide the {m.moe.num_experts} experts of {m.name}")
            if m.moe.expert_ffn_hidden_size % p.expert_tp:
                raise UserInputError(f"etp {p.expert_tp} does not divide expert_ffn_hidden_size {m.moe.expert_ffn_hidden_size}")
            domain = p.tp * p.cp * self.dp
            if domain % (p.ep * p.expert_tp):
                raise UserInputError(
                    f"ep·etp = {p.ep * p.expert_tp} does not divide the data-parallel×tp×cp domain of "
                    f"{domain} GPUs per pipeline stage (Megatron requires it)"
                )

    def validate_batch(self) -> None:
        """The global batch rule of :meth:`validate`: micro_batch_size · dp divides global_batch_size."""
        p = self.par
        per_step = p.micro_batch_size * self.dp
        if p.global_batch_size % per_step:
            raise UserInputError(
                f"global_batch_size {p.global_batch_size} is not divisible by micro_batch_size·dp = "
                f"{per_step} (micro_batch_size {p.micro_batch_size} × dp {self.dp})"
            )

    def validate_settings(self) -> None:
        """The rules :meth:`validate` checks after the batch rule (optimizer, recipe settings, placement).

        Reads nothing of ``micro_batch_size`` (the planner memoises it across micro-batch sizes).
        """
        p, o = self.par, self.optimizer
        dist = o.resolved_distribution
        if o.kind == "muon" and dist == "element_wise":
            raise UserInputError("optimizer muon cannot use the element_wise distributed optimizer; use layer_wise or replicated")
        if o.kind == "adamw" and dist == "layer_wise":
            raise UserInputError("the layer_wise distributed optimizer is for muon; adamw uses element_wise or replicated")
        if p.fsdp and o.kind == "muon":
            raise UserInputError("Megatron rejects Megatron-FSDP with the layer-wise (Muon) optimizer; set fsdp 0")
        if o.reuse_grad_buf_for_mxfp8_param_ag and not o.fp8_param_gather:
            raise UserInputError("reuse_grad_buf_for_mxfp8_param_ag needs fp8_param_gather (Megatron asserts it); "
                                 "set fp8_param_gather true or drop it")
        if o.ns_coefficients == "cubic5" and o.ns_steps != 5:
            raise UserInputError("ns_coefficients 'cubic5' requires ns_steps 5")
        self._validate_recipe_settings()
        if o.kind == "muon" and o.eo_version_tuple < EO_MIN_SYRK_CUBIC5:
            lacking = [what for what, on in (("use_syrk", o.use_syrk), ("ns_coefficients 'cubic5'", o.ns_coefficients == "cubic5")) if on]
            if lacking:
                verb = "need" if len(lacking) > 1 else "needs"
                raise UserInputError(f"{' and '.join(lacking)} {verb} Emerging-Optimizers >= 0.4 but eo_version is {o.eo_version} "
                                     "(Megatron-Core pins 0.3.0); set eo_version 0.4.0 or drop them")
        gpd = self.config.placement.gpus_per_domain
        if gpd is not None and gpd > self.system.nvlink.domain_size:
            raise UserInputError(
                f"placement.gpus_per_domain {gpd} exceeds the NVLink domain size {self.system.nvlink.domain_size} of {self.system.name}"
            )

    def _validate_recipe_settings(self) -> None:
        """The rules Megatron-Core asserts between recipe settings (one-line UserInputError)."""
        p, rt, o = self.par, self.runtime, self.optimizer
        if (p.recompute_method is None) != (p.recompute_num_layers is None):
            raise UserInputError("recompute_method and recompute_num_layers go together (Megatron needs both for "
                                 "full recompute, or neither)")
        if p.recompute_method is not None and p.recompute != "full":
            raise UserInputError(f"recompute_method {p.recompute_method} needs recompute full (Megatron supports "
                                 f"no method for recompute {p.recompute})")
        if rt.delay_wgrad_compute and not p.ep_comm_overlap:
            raise UserInputError("delay_wgrad_compute needs ep_comm_overlap (Megatron asserts "
                                 "overlap_moe_expert_parallel_comm with it)")
        if p.ep_comm_overlap and rt.moe_token_dispatcher_type == "allgather":
            raise UserInputError("ep_comm_overlap needs the alltoall or flex token dispatcher, not allgather")
        layers = self.model.num_layers
        first, last = rt.bf16_layers
        if first + last > layers:
            raise UserInputError(f"num_layers_at_start_in_bf16 + num_layers_at_end_in_bf16 = {first + last} exceed "
                                 f"the {layers} layers of {self.model.name}")
        if rt.cpu_offloading_num_layers > layers:
            raise UserInputError(f"cpu_offloading_num_layers {rt.cpu_offloading_num_layers} exceeds the {layers} "
                                 f"layers of {self.model.name}")
        if rt.cpu_offloading:
            self._validate_cpu_offloading()
        if self.config.placement.use_tp_pp_dp_mapping:
            from topologies.placement import check_tp_pp_dp_mapping

            check_tp_pp_dp_mapping(p.tp, p.cp, p.ep, p.expert_tp)
        instances = o.num_distributed_optimizer_instances
        if (self.dp * p.cp) % instances:
            raise UserInputError(f"num_distributed_optimizer_instances {instances} does not divide the data-parallel "
                                 f"group of {self.dp * p.cp} (dp·cp)")
        if instances > 1:
            if self.model.moe is not None and self.expert_dp % instances:
                raise UserInputError(f"num_distributed_optimizer_instances {instances} does not divide the expert "
                                     f"data-parallel group of {self.expert_dp}")
            if p.fsdp or o.resolved_distribution != "element_wise":
                raise UserInputError(f"num_distributed_optimizer_instances {instances} needs Megatron's element-wise "
                                     "distributed optimizer (AdamW, not replicated, not Megatron-FSDP); set it to 1")
        if o.optimizer_cpu_offload and o.kind != "adamw":
            raise UserInputError("optimizer_cpu_offload runs AdamW on the host (Megatron's hybrid device optimizer); "
                                 "it needs optimizer adamw")

    def _validate_cpu_offloading(self) -> None:
        """Megatron-Core's rules for activation CPU offloading (TransformerConfig.__post_init__)."""
        p, rt, layers = self.par, self.runtime, self.model.num_layers
        if rt.cpu_offloading_num_layers >= layers:
            raise UserInputError(f"cpu_offloading_num_layers {rt.cpu_offloading_num_layers} must be below the {layers} "
                                 f"layers of {self.model.name} (the last layer is never offloaded)")
        if p.pp > 1:
            raise UserInputError("cpu_offloading needs pp 1 (Megatron has no activation CPU offloading with "
                                 "pipeline parallelism)")
        if p.recompute != "none":
            raise UserInputError("cpu_offloading does not work with recompute (Megatron asserts it); set recompute none")
