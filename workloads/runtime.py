"""Runtime settings of a scenario: how the software stack runs the step (recipe settings).

Megatron-Core / Megatron-Bridge settings that change step time or memory without changing the
parallel layout: CUDA graphs, the MoE token dispatcher and its fusions, the TP-communication
overlap configuration, P2P and wgrad settings, offloading, kernel fusions, the attention backend,
first/last layers in BF16, and environment variables that change an algorithm. Each field is named
after the Megatron setting (or the environment variable, lower-cased) it stands for. Settings that
describe the parallel layout live in :class:`workloads.scenario.Parallelism` (recompute, sequence
parallel, TP/EP overlap flags, pipeline layout), the data-parallel / optimizer ones in
:class:`workloads.scenario.OptimizerSpec`. The shipped ``megatron-bridge`` dataset fills all of them
from the recipe-settings file (:mod:`workloads.recipe_settings`), joined on ``run_id``.

Defaults: Megatron-Core's, except where muonsim's default is what the Megatron-Bridge performance
recipes run (noted per field); ``docs`` of each field say which mechanism reads it.
"""

from __future__ import annotations

import ast
import re
from typing import Any, Literal, get_args

from pydantic import ConfigDict, Field, field_validator

from topologies.inputs import NoBoolNumbers

CudaGraphImpl = Literal["none", "local", "transformer_engine", "full_iteration"]
CudaGraphScope = Literal["full", "attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba", "full_iteration"]
MoeDispatcher = Literal["allgather", "alltoall", "flex"]
FlexBackend = Literal["deepep", "hybridep"]
RouterDtype = Literal["fp32", "fp64"]
AttentionBackend = Literal["auto", "flash", "fused", "unfused", "local"]
CrossEntropyImpl = Literal["native", "te"]
TransformerImpl = Literal["transformer_engine", "local"]
OffloadModule = Literal["attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act"]
TpOverlapGemm = Literal["qkv_fprop", "qkv_dgrad", "qkv_wgrad", "proj_fprop", "proj_dgrad",
                        "fc1_fprop", "fc1_dgrad", "fc1_wgrad", "fc2_fprop", "fc2_dgrad"]
TpOverlapMethod = Literal["bulk", "ring_exchange", "pipeline"]
TP_OVERLAP_GEMMS: tuple[str, ...] = get_args(TpOverlapGemm)
LIST_SEPARATORS = re.compile(r"[|+,\s]+")


class _Strict(NoBoolNumbers):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TpOverlapGemmConfig(_Strict):
    """How Transformer Engine's userbuffers overlap one GEMM with its TP communication.

    Megatron-Bridge ``BulkOverlapCfg`` / ``RingExchangeOverlapCfg`` / ``PipelineOverlapCfg``
    (``training/comm_overlap.py``), passed to TE ``initialize_ub``: ``bulk`` runs the whole
    all-gather or reduce-scatter beside an independent GEMM on ``num_sm`` SMs; ``ring_exchange``
    splits the GEMM into tp chunks and passes chunks peer-to-peer around the ring (copy engines,
    ``num_sm`` SMs); ``pipeline`` splits the GEMM into ``num_splits`` chunks and reduce-scatters each
    chunk while the next one computes.
    """

    gemm: TpOverlapGemm
    method: TpOverlapMethod
    num_sm: int = Field(1, ge=1, le=256, description="SMs the communication kernels take")
    cga_size: int = Field(1, ge=1, le=16)
    num_splits: int | None = Field(None, ge=1, le=64, description="pipeline: GEMM chunks (TE default 4)")
    set_sm_margin: bool = False
    aggregate: bool = False
    atomic_gemm: bool = False
    fp8_buf: bool = False


def te_default_tp_overlap(gemm: str) -> TpOverlapGemmConfig:
    """Transformer Engine's default userbuffers configuration of ``gemm`` (no cfg given).

    TE ``initialize_ub`` (``transformer_engine/pytorch/module/base.py``): ring exchange for the
    all-gather GEMMs' forward (qkv_fprop, fc1_fprop) and the row-parallel dgrads (proj_dgrad,
    fc2_dgrad) with 1 SM; pipelined reduce-scatter (4 splits, 16 SMs, SM margin) for proj_fprop and
    fc2_fprop; bulk overlap (16 SMs) for the column-parallel dgrad/wgrad. Source: our reading of
    the TE code (not in ../shared/reference): an assumption until a TE version is pinned.
    """
    if gemm in ("qkv_fprop", "fc1_fprop", "proj_dgrad", "fc2_dgrad"):
        return TpOverlapGemmConfig(gemm=gemm, method="ring_exchange", num_sm=1, cga_size=1)  # type: ignore[arg-type]
    if gemm in ("proj_fprop", "fc2_fprop"):
        return TpOverlapGemmConfig(gemm=gemm, method="pipeline", num_sm=16, cga_size=2, num_splits=4,  # type: ignore[arg-type]
                                   set_sm_margin=True)
    return TpOverlapGemmConfig(gemm=gemm, method="bulk", num_sm=16, cga_size=2)  # type: ignore[arg-type]


_CFG_CLASS = re.compile(r"^\s*(\w+)OverlapCfg\((.*)\)\s*$", re.DOTALL)
_COMPACT = re.compile(r"^(\w+)[:=](bulk|ring_exchange|pipeline)(?::(\d+))?$")


def _parse_overlap_entry(gemm: str, value: Any) -> dict[str, Any]:
    """One GEMM's entry: a mapping, or Megatron-Bridge's repr ``BulkOverlapCfg(num_sm=8, ...)``."""
    if isinstance(value, dict):
        return {"gemm": gemm, **value}
    m = _CFG_CLASS.match(str(value))
    if not m:
        raise ValueError(f"tp_comm_overlap_cfg {gemm}: expected BulkOverlapCfg(...), RingExchangeOverlapCfg(...), "
                         f"PipelineOverlapCfg(...) or a mapping, got {str(value)[:60]!r}")
    out: dict[str, Any] = {"gemm": gemm}
    for part in filter(None, (p.strip() for p in m.group(2).split(","))):
        key, _, text = part.partition("=")
        try:
            out[key.strip()] = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            raise ValueError(f"tp_comm_overlap_cfg {gemm}: cannot read {part!r}") from None
    out.setdefault("method", {"Bulk": "bulk", "RingExchange": "ring_exchange", "Pipeline": "pipeline"}.get(m.group(1)))
    return out


def parse_tp_overlap_cfg(value: Any) -> tuple[Any, ...] | None:
    """``tp_comm_overlap_cfg`` from a tuple/list of entries, a mapping GEMM -> entry, the Megatron-Bridge
    ``TransformerLayerTPOverlapCfg`` repr (the settings file's text), or the compact CLI form
    ``qkv_dgrad:bulk:8+qkv_fprop:ring_exchange+...`` (GEMM:METHOD[:NUM_SM]); None/''/'None' = TE defaults."""
    if value is None or (isinstance(value, str) and value.strip() in ("", "None", "none", "default")):
        return None
    if isinstance(value, tuple | list):
        return tuple(value)
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{"):
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                raise ValueError("tp_comm_overlap_cfg: not a readable mapping") from None
        else:
            entries = []
            for part in filter(None, LIST_SEPARATORS.split(text)):
                m = _COMPACT.match(part)
                if not m:
                    raise ValueError(f"tp_comm_overlap_cfg: '{part}' is not GEMM:METHOD[:NUM_SM] "
                                     f"(GEMM one of {', '.join(TP_OVERLAP_GEMMS)}; METHOD bulk, ring_exchange, pipeline)")
                entry: dict[str, Any] = {"gemm": m.group(1), "method": m.group(2)}
                if m.group(3):
                    entry["num_sm"] = int(m.group(3))
                entries.append(entry)
            return tuple(entries)
    if not isinstance(value, dict):
        raise ValueError("tp_comm_overlap_cfg: expected a mapping of GEMM name to its overlap configuration")
    return tuple(_parse_overlap_entry(str(g), v) for g, v in value.items() if g != "__type__")


def tp_overlap_text(entries: Any) -> str:
    """``tp_comm_overlap_cfg`` entries (mappings or :class:`TpOverlapGemmConfig`) as ``--tp-comm-overlap-cfg``
    takes them: ``GEMM:METHOD[:NUM_SM]`` joined by '+', NUM_SM only when not the default 1; the fields that
    syntax cannot hold and that differ from their defaults follow in brackets, e.g.
    ``qkv_dgrad:bulk:4[cga_size=2]``. ``[]`` for no entries."""
    out = []
    for entry in entries or ():
        cfg = entry if isinstance(entry, TpOverlapGemmConfig) else TpOverlapGemmConfig.model_validate(entry)
        text = f"{cfg.gemm}:{cfg.method}" + (f":{cfg.num_sm}" if cfg.num_sm != 1 else "")
        extra = [f"{name}={getattr(cfg, name)}" for name, field in TpOverlapGemmConfig.model_fields.items()
                 if name not in ("gemm", "method", "num_sm") and getattr(cfg, name) != field.default]
        out.append(text + (f"[{','.join(extra)}]" if extra else ""))
    return "+".join(out) or "[]"


def split_list(value: Any) -> Any:
    """A list setting from text: ``a|b``, ``a+b``, ``a,b``; ``[]``, ``''``, ``none`` = empty."""
    if isinstance(value, str):
        text = value.strip()
        if text in ("", "[]", "none", "None"):
            return ()
        if text.startswith("["):
            try:
                return tuple(ast.literal_eval(text))
            except (ValueError, SyntaxError):
                pass
        return tuple(filter(None, LIST_SEPARATORS.split(text.strip("[]").replace("'", "").replace('"', ""))))
    return value


class RuntimeSettings(_Strict):
    """Settings of the software stack that change step time or memory (see the module docstring)."""

    # --- CUDA graphs (costmodel: host launch cost of captured kernels) ---
    cuda_graph_impl: CudaGraphImpl = Field(
        "none", description="Megatron --cuda-graph-impl: none, local (per-layer MCore graphs), transformer_engine "
                            "(TE graphs of the cuda_graph_scope modules) or full_iteration (the whole forward-backward "
                            "step captured); captured kernels cost no host issue time")
    cuda_graph_scope: tuple[CudaGraphScope, ...] = Field(
        (), description="Megatron --cuda-graph-scope: modules captured by transformer_engine/local graphs "
                        "(empty = Megatron's default 'full': every layer); ignored with cuda_graph_impl none, as "
                        "in Megatron (26.02 Llama 3 70B NVFP4 sets scope full_iteration with impl none)")
    # --- MoE token dispatch and its kernels ---
    moe_token_dispatcher_type: MoeDispatcher = Field(
        "flex", description="Megatron --moe-token-dispatcher-type: allgather (Megatron-Core's own default), alltoall, "
                            "or flex (DeepEP / HybridEP kernels, what the Megatron-Bridge MoE recipes use; muonsim's "
                            "default); see costmodel/moe_dispatch.py")
    moe_flex_dispatcher_backend: FlexBackend = Field(
        "hybridep", description="Megatron --moe-flex-dispatcher-backend for the flex dispatcher: deepep or hybridep")
    moe_hybridep_num_sms: int = Field(16, ge=1, le=256, description="Megatron --moe-hybridep-num-sms: SMs the HybridEP "
                                      "dispatch/combine kernels occupy (Megatron-Core default 16)")
    moe_deepep_num_sms: int = Field(20, ge=1, le=256, description="Megatron --moe-deepep-num-sms: SMs the DeepEP "
                                    "kernels occupy (Megatron-Core default 20)")
    delay_wgrad_compute: bool = Field(False, description="Megatron --delay-wgrad-compute: expert weight-gradient GEMMs "
                                      "run after the combine all-to-all is issued, so the all-to-all hides under them "
                                      "(used with overlap_moe_expert_parallel_comm)")
    moe_shared_expert_overlap: bool = Field(False, description="Megatron --moe-shared-expert-overlap: the shared "
                                            "expert computes on a side stream under the dispatch/combine")
    moe_permute_fusion: bool = Field(True, description="Megatron --moe-permute-fusion: fused (TE) token permute/"
                                     "unpermute kernels (muonsim default: on, as every Megatron-Bridge MoE recipe)")
    moe_router_fusion: bool = Field(True, description="Megatron --moe-router-fusion: fused top-k/softmax/aux-loss "
                                    "router kernel (muonsim default: on, as the Megatron-Bridge MoE recipes)")
    moe_grouped_gemm: bool = Field(True, description="Megatron --moe-grouped-gemm: the local experts' GEMMs as one "
                                   "grouped GEMM; off = one GEMM per expert (muonsim default: on, as the MoE recipes)")
    moe_router_dtype: RouterDtype | None = Field(None, description="Megatron --moe-router-dtype: router logits "
                                                 "GEMM and softmax in fp32/fp64 (None = the activation dtype)")
    # --- TP communication overlap (TE userbuffers; on/off is Parallelism.tp_comm_overlap) ---
    tp_comm_overlap_cfg: tuple[TpOverlapGemmConfig, ...] | None = Field(
        None, description="Megatron-Bridge CommOverlapConfig.tp_comm_overlap_cfg: per GEMM, bulk / ring_exchange / "
                          "pipeline overlap and its SMs (None = Transformer Engine's defaults, te_default_tp_overlap)")
    # --- pipeline point-to-point and wgrad deferral ---
    overlap_p2p_comm: bool = Field(True, description="Megatron --overlap-p2p-communication: pipeline sends/receives "
                                   "run asynchronously under the next pass (interleaved schedule); off, every "
                                   "interleaved pass waits for its send/receive. muonsim default on, as every "
                                   "Megatron-Bridge recipe with vpp > 1 (Megatron-Core's default is off)")
    batch_p2p_comm: bool = Field(True, description="Megatron batch_p2p_comm: sends and receives batched into one "
                                 "NCCL group call (Megatron-Core default on; the recipes turn it off with overlap); "
                                 "no effect modelled: a pass's send and receive run concurrently either way")
    defer_embedding_wgrad_compute: bool = Field(False, description="Megatron --defer-embedding-wgrad-compute: the "
                                                "output layer's weight-gradient GEMMs run in the pipeline drain")
    wgrad_deferral_limit: int = Field(0, ge=-1, description="Megatron --wgrad-deferral-limit: micro-batches whose "
                                      "output-layer wgrad is deferred (0 = all; Megatron-Bridge writes -1 when unset)")
    # --- offloading (memory) ---
    cpu_offloading: bool = Field(False, description="Megatron --cpu-offloading: offload activations (and weights) of "
                                 "cpu_offloading_num_layers layers to host memory")
    cpu_offloading_num_layers: int = Field(0, ge=0, description="Megatron --cpu-offloading-num-layers")
    fine_grained_activation_offloading: bool = Field(False, description="Megatron --fine-grained-activation-"
                                                     "offloading: offload the activations of offload_modules")
    offload_modules: tuple[OffloadModule, ...] = Field((), description="Megatron --offload-modules")
    # --- fusions, kernels, backends ---
    cross_entropy_loss_fusion: bool = Field(True, description="Megatron --cross-entropy-loss-fusion (Megatron-Bridge "
                                            "default on)")
    cross_entropy_fusion_impl: CrossEntropyImpl = Field("te", description="Megatron --cross-entropy-fusion-impl: "
                                                        "native or te (Megatron-Bridge recipes: te)")
    attention_backend: AttentionBackend = Field("auto", description="Megatron --attention-backend: auto, flash, "
                                                "fused (cuDNN), unfused, local")
    apply_rope_fusion: bool = Field(True, description="Megatron --apply-rope-fusion (recipes: on)")
    bias_activation_fusion: bool = Field(True, description="Megatron --bias-activation-fusion: fused SwiGLU (recipes: on)")
    gradient_accumulation_fusion: bool = Field(True, description="Megatron --gradient-accumulation-fusion: weight "
                                               "gradients accumulate into the fp32 main_grad inside the wgrad GEMM")
    use_transformer_engine_op_fuser: bool = Field(False, description="Megatron-Bridge use_transformer_engine_op_fuser "
                                                  "(TE operation-based fused MLP)")
    transformer_impl: TransformerImpl = Field("transformer_engine", description="Megatron --transformer-impl: "
                                              "transformer_engine, or local (Megatron's own layers: unfused attention)")
    # --- per-iteration work outside the layers (costmodel.iteration_work) ---
    log_params_norm: bool = Field(False, description="Megatron --log-params-norm: an l2 norm over every parameter, "
                                  "its all-reduce and a host synchronisation each iteration")
    log_num_zeros_in_grad: bool = Field(False, description="Megatron --log-num-zeros-in-grad: count_nonzero over "
                                        "every main gradient (per parameter), an all-reduce and a host synchronisation")
    check_weight_hash_interval: int | None = Field(
        None, ge=1, description="Megatron --check-weight-hash-across-dp-replicas-interval N: every N iterations each "
        "rank copies every parameter to the host, converts it to FP32 and SHA-1 hashes it on the CPU, then the DP "
        "replicas compare hashes; priced per step as 1/N of one check (None: off)")
    timing_log_level: int = Field(0, ge=0, le=2, description="Megatron --timing-log-level: timers at levels 1 and 2 "
                                  "synchronise the device (and barrier) at every start and stop")
    # --- precision of the first and last layers (memory, compute) ---
    first_last_layers_bf16: bool = Field(False, description="Megatron --first-last-layers-bf16: keep the first "
                                         "num_layers_at_start_in_bf16 and last num_layers_at_end_in_bf16 layers in BF16 "
                                         "(the two counts take effect only when this is on)")
    num_layers_at_start_in_bf16: int = Field(0, ge=0, description="Megatron --num-layers-at-start-in-bf16")
    num_layers_at_end_in_bf16: int = Field(0, ge=0, description="Megatron --num-layers-at-end-in-bf16")
    # --- environment variables that change an algorithm ---
    cuda_device_max_connections: int = Field(8, ge=1, le=32, description="CUDA_DEVICE_MAX_CONNECTIONS: hardware work "
                                             "queues (CUDA default 8); 1 serialises streams in issue order")
    nccl_nvls_enable: bool = Field(True, description="NCCL_NVLS_ENABLE: NVLink SHARP collectives allowed (NCCL "
                                   "default where the fabric has it); the recipes set 0")
    nvte_fwd_layernorm_sm_margin: int = Field(0, ge=0, le=256, description="NVTE_FWD_LAYERNORM_SM_MARGIN: SMs the "
                                              "forward norm kernels leave free for concurrent communication")
    nvte_bwd_layernorm_sm_margin: int = Field(0, ge=0, le=256, description="NVTE_BWD_LAYERNORM_SM_MARGIN")
    num_of_hybrid_ep_ranks_per_nvlink_domain: int | None = Field(
        None, ge=1, le=1024, description="NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN: ranks HybridEP treats as one "
                                         "NVLink domain (None = the system's NVLink domain)")
    use_mnnvl: bool | None = Field(None, description="USE_MNNVL: multi-node NVLink (NVL72) for HybridEP (None = the "
                                   "system's NVLink domain decides)")
    nccl_p2p_net_chunksize: int | None = Field(None, ge=1, description="NCCL_P2P_NET_CHUNKSIZE bytes (None = NCCL "
                                               "default 128 KiB)")

    @field_validator("cuda_graph_scope", "offload_modules", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return split_list(value)

    @field_validator("tp_comm_overlap_cfg", mode="before")
    @classmethod
    def _overlap_cfg(cls, value: Any) -> Any:
        return parse_tp_overlap_cfg(value)

    @field_validator("tp_comm_overlap_cfg")
    @classmethod
    def _unique_gemms(cls, value: tuple[TpOverlapGemmConfig, ...] | None) -> tuple[TpOverlapGemmConfig, ...] | None:
        if value is not None:
            names = [c.gemm for c in value]
            dup = {n for n in names if names.count(n) > 1}
            if dup:
                raise ValueError(f"tp_comm_overlap_cfg names {', '.join(sorted(dup))} more than once")
        return value

    def tp_overlap_for(self, gemm: str) -> TpOverlapGemmConfig:
        """The userbuffers configuration of ``gemm``: the cfg's entry, else TE's default."""
        for cfg in self.tp_comm_overlap_cfg or ():
            if cfg.gemm == gemm:
                return cfg
        return te_default_tp_overlap(gemm)

    @property
    def unfused_attention(self) -> bool:
        """Whether the attention core runs unfused (attention_backend unfused or local, or local layers)."""
        return self.attention_backend in ("unfused", "local") or self.transformer_impl == "local"

    @property
    def bf16_layers(self) -> tuple[int, int]:
        """(first, last) transformer layers kept in BF16: the counts when first_last_layers_bf16, else (0, 0)."""
        if not self.first_last_layers_bf16:
            return 0, 0
        return self.num_layers_at_start_in_bf16, self.num_layers_at_end_in_bf16
