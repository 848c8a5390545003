"""FP8 parameters and the FP8 parameter all-gather (Megatron DDP ``fp8_param_gather``): the one rule.

Megatron-Core 0.16.1 (``distributed/distributed_data_parallel.py``, ``param_and_grad_buffer.py``,
``optimizer/distrib_optimizer.py``) with ``fp8_param_gather`` keeps the compute weights of the
Transformer Engine linear layers as quantized tensors instead of BF16:

- **Which parameters** (:func:`is_fp8_param`): the weights of TE linear modules built under
  ``fp8_model_init`` (QKV and attention projections, MLA up/down projections, MLP and expert
  fc1/fc2, the MTP ``eh_proj``: :data:`TE_GEMM_ROLES`). Not the word embedding (and its MTP copy),
  a learned position embedding, the output layer (``tensor_parallel.ColumnParallelLinear``), the
  MoE router (a plain parameter) or any 1-D norm weight, nor the GEMM weights of layers
  ``first_last_layers_bf16`` keeps in BF16 (built outside ``fp8_model_init``): they stay BF16.
- **Buffers**: a quantized parameter's DDP buffer has ``param_dtype = uint8``, so FP8 parameters sit
  in their own buffers (buffers are keyed by (param dtype, grad dtype)) and their own buckets.
- **fp8-cs** (tensorwise / current scaling): the buffer holds the FP8 bytes: the distributed
  optimizer quantizes its shard (``quantize_param_shard``) and the all-gather moves **1 byte** per
  element.
- **mxfp8**: with the distributed optimizer and MXFP8 parameters the parameter buffer is a BF16 view
  of the gradient buffer (``shared_buffer``); the optimizer copies its fp32 shard there
  (``_copy_main_params_to_param_buffer``) and the all-gather moves **2 bytes** (BF16) per element;
  each weight is then quantized into MXFP8 row-wise and column-wise data.
- **Megatron-FSDP** (``distributed/fsdp/src/megatron_fsdp``): FP8 parameters form parameter groups
  of their own (``dtype="float8"``) whose model-weight buffer is ``uint8`` and holds the FP8 **rowwise
  data only** (``fp8_get_raw_data``: ``_rowwise_data`` / ``_data``); MXFP8 groups get a second ``uint8``
  buffer for the **columnwise data** (``transpose_weight_buffer``, ``fp8_need_transpose_data``). Every
  all-gather moves **1 byte** per element, for both recipes: the forward gathers the rowwise buffer;
  the backward gathers the columnwise buffer (MXFP8) or the rowwise buffer again (fp8-cs; Hopper then
  makes the transpose locally, ``fp8_create_transpose_cache`` after the gather); a forward recomputed
  in the backward needs the rowwise data again, which for MXFP8 is a gather of its own (the rowwise
  and columnwise copies have different bucket keys, ``get_bucket_key``). After the optimizer step the
  parameter sync gathers both buffers (:func:`param_gathers_per_sync`).
- **Scales are never gathered**: TE's ``cast_master_weights_to_fp8`` all-reduces the amaxes of every
  rank's shard (MAX) and every rank computes the scales itself (fp8-cs one per tensor, MXFP8 one E8M0
  per 32 elements and direction); nor are Hopper's transposes (made locally after the gather). (The
  amax all-reduce itself is not modelled.)
- **Where it applies** (:func:`fp8_gather_active`): AdamW on the element-wise distributed optimizer
  or on Megatron-FSDP, with an FP8 recipe (fp8-cs, mxfp8). Muon's layer-wise optimizer gathers BF16
  parameters; BF16 and NVFP4 recipes have no FP8 parameters (Megatron has no FP4 primary weights); a
  replicated optimizer gathers nothing. In those cases the setting has no effect (a plan note).

What a GPU holds for these weights (the FP8 copy, TE's quantized weight cache when they stay BF16,
the Hopper transpose, MXFP8's BF16 gather buffer) is :mod:`workloads.weight_memory`'s; Megatron-FSDP's
per-layer gathers of them are :mod:`costmodel.fsdp`'s.
"""

from __future__ import annotations

from workloads.inventory import TensorSpec

BF16_BYTES = 2
FP8_RECIPES = ("fp8-cs", "mxfp8")
# Transformer Engine GEMM weights of a transformer (or MTP) layer (inventory roles)
TE_GEMM_ROLES = frozenset({"qkv", "attn_out", "q_down", "q_up", "q_proj", "kv_down", "kv_up", "fc1", "fc2",
                           "expert_fc1", "expert_fc2", "shared_fc1", "shared_fc2", "mtp_proj"})


def is_te_gemm_weight(t: TensorSpec) -> bool:
    """Whether ``t`` is a Transformer Engine GEMM weight (quantized in FP8/FP4 runs)."""
    return t.role in TE_GEMM_ROLES and len(t.global_shape) == 2


def layer_kept_bf16(layer: int | None, num_layers: int, bf16_layers: tuple[int, int]) -> bool:
    """Whether transformer layer ``layer`` of ``num_layers`` runs its GEMMs in BF16 when the first and
    last ``bf16_layers`` layers are kept in BF16 (``first_last_layers_bf16``); MTP layers
    (``layer >= num_layers``) follow the last layer; ``None`` (outside the layers) is never a
    low-precision GEMM."""
    if layer is None:
        return True
    first, last = bf16_layers
    if layer >= num_layers:
        return last > 0
    return layer < first or layer >= num_layers - last


def is_fp8_param(t: TensorSpec, num_layers: int = 0, bf16_layers: tuple[int, int] = (0, 0),
                 layer: int | None = -1) -> bool:
    """Whether ``t`` is an FP8 parameter under ``fp8_param_gather``: a trained TE linear weight of a
    layer not kept in BF16 (``bf16_layers`` of ``num_layers``, see :func:`layer_kept_bf16`);
    ``layer``: the layer the tensor sits in when ``t`` stands for it (default ``t.layer``)."""
    return (is_te_gemm_weight(t) and t.optimizer != "none"
            and (bf16_layers == (0, 0) or not layer_kept_bf16(t.layer if layer == -1 else layer, num_layers,
                                                             bf16_layers)))


def fp8_gather_note(kind: str, distribution: str, precision: str, fp8_param_gather: bool,
                    fsdp: bool = False) -> str | None:
    """Why ``fp8_param_gather`` has no effect here (one line), or None when it applies or is off."""
    if not fp8_param_gather:
        return None
    if kind != "adamw" or (distribution != "element_wise" and not fsdp):
        return ("fp8_param_gather has no effect: it is the element-wise distributed optimizer's (AdamW) path; "
                "Muon's layer-wise and the replicated optimizer gather BF16 parameters or none")
    if precision not in FP8_RECIPES:
        return f"fp8_param_gather has no effect with precision {precision}: only fp8-cs and mxfp8 keep FP8 parameters"
    return None


def fp8_gather_active(kind: str, distribution: str, precision: str, fp8_param_gather: bool,
                      fsdp: bool = False) -> bool:
    """Whether FP8 parameters (and their gather) apply: AdamW on the element-wise distributed
    optimizer or on Megatron-FSDP (``fsdp``), with an FP8 recipe (fp8-cs, mxfp8)."""
    return fp8_param_gather and fp8_gather_note(kind, distribution, precision, fp8_param_gather, fsdp) is None


FP8_BYTES = 1


def param_gather_bytes_per_element(precision: str, fp8: bool, fsdp: bool = False) -> int:
    """Bytes per element one parameter all-gather moves for a buffer (see the module docstring).

    BF16 parameters: 2. FP8 parameters on the distributed optimizer: 1 for fp8-cs (the ``uint8``
    buffer), 2 for MXFP8 (the BF16 view of the gradient buffer). FP8 parameters on Megatron-FSDP: 1
    (a ``uint8`` rowwise or columnwise buffer) for both recipes."""
    if not fp8:
        return BF16_BYTES
    return FP8_BYTES if fsdp or precision == "fp8-cs" else BF16_BYTES


def param_gathers_per_sync(precision: str, fp8: bool, fsdp: bool = False) -> int:
    """All-gathers that bring one buffer's parameters up to date after the optimizer step: 2 for MXFP8
    FP8 parameters on Megatron-FSDP (the rowwise and the columnwise buffer), else 1."""
    return 2 if fp8 and fsdp and precision == "mxfp8" else 1


def fsdp_backward_regathers_rowwise(precision: str, fp8: bool) -> bool:
    """Whether a forward recomputed in the backward re-gathers a Megatron-FSDP unit's FP8 parameters
    (their rowwise buffer): MXFP8 only, whose backward otherwise gathers the columnwise buffer; an
    fp8-cs or BF16 unit's recompute gather serves its backward too."""
    return fp8 and precision == "mxfp8"
