"""FP8 parameters and the FP8 parameter all-gather (Megatron DDP ``fp8_param_gather``).

Megatron-Core 0.16.1 (``distributed/distributed_data_parallel.py``, ``param_and_grad_buffer.py``,
``optimizer/distrib_optimizer.py``) with ``fp8_param_gather`` keeps the compute weights of the
Transformer Engine linear layers as quantized tensors instead of BF16:

- **Which parameters**: the weights of TE linear modules built under ``fp8_model_init`` (QKV and
  attention projections, MLA up/down projections, MLP and expert fc1/fc2, the MTP ``eh_proj``).
  Not the word embedding (and its MTP copy), the output layer (``tensor_parallel.ColumnParallelLinear``),
  the MoE router (a plain parameter) or any 1-D norm weight: they stay BF16 (:func:`is_fp8_param`).
- **Buffers**: a quantized parameter's DDP buffer has ``param_dtype = uint8``, so FP8 parameters sit
  in their own buffers (buffers are keyed by (param dtype, grad dtype)) and their own buckets.
- **fp8-cs** (tensorwise / current scaling): the buffer holds the FP8 bytes: the distributed
  optimizer quantizes its shard (``quantize_param_shard``) and the all-gather moves **1 byte** per
  element; the model keeps 1 byte per element instead of 2.
- **mxfp8**: with the distributed optimizer and MXFP8 parameters the parameter buffer is a BF16 view
  of the gradient buffer (``shared_buffer``); the optimizer copies its fp32 shard there
  (``_copy_main_params_to_param_buffer``) and the all-gather moves **2 bytes** (BF16) per element;
  each weight is then quantized into MXFP8 row-wise and column-wise data with one E8M0 scale per 32
  elements: 2 × (1 + 1/32) bytes per element. ``reuse_grad_buf_for_mxfp8_param_ag`` names that reuse
  of the gradient buffer; without it we count a separate BF16 gather buffer (2 bytes per element) on
  top (our reading of the flag's name and docstring; the code path without it is not exercised by
  any published recipe).
- **Where it applies**: AdamW on the element-wise distributed optimizer with an FP8 recipe. Muon's
  layer-wise optimizer gathers BF16 parameters; BF16 and NVFP4 recipes have no FP8 parameters here;
  a replicated optimizer gathers nothing. In those cases the setting has no effect (a plan note).

Not modelled: Transformer Engine's cached quantized weights when the parameters are BF16 (so the
saving of that cache by ``fp8_param_gather`` is not shown either), the FP8 transpose kept for
Hopper GEMMs, ``first_last_layers_bf16``, and Megatron-FSDP's FP8 gathers (its per-layer
all-gathers stay BF16 in :mod:`costmodel.fsdp`).
"""

from __future__ import annotations

from workloads.inventory import TensorSpec

BF16_BYTES = 2
FP8_CS_PARAM_BYTES = 1.0  # one FP8 byte per element
MXFP8_PARAM_BYTES = 2 * (1 + 1 / 32)  # row-wise and column-wise FP8 data, one E8M0 scale per 32 each
FP8_RECIPES = ("fp8-cs", "mxfp8")
NOT_FP8_ROLES = frozenset({"embedding", "embedding_copy", "output", "router"})


def is_fp8_param(t: TensorSpec) -> bool:
    """Whether ``t`` is a Transformer Engine linear weight (quantized under ``fp8_model_init``)."""
    return len(t.global_shape) == 2 and t.role not in NOT_FP8_ROLES and t.optimizer != "none"


def fp8_gather_note(kind: str, distribution: str, precision: str, fp8_param_gather: bool) -> str | None:
    """Why ``fp8_param_gather`` has no effect here (one line), or None when it applies or is off."""
    if not fp8_param_gather:
        return None
    if kind != "adamw" or distribution != "element_wise":
        return ("fp8_param_gather has no effect: it is the element-wise distributed optimizer's (AdamW) path; "
                "Muon's layer-wise and the replicated optimizer gather BF16 parameters or none")
    if precision not in FP8_RECIPES:
        return f"fp8_param_gather has no effect with precision {precision}: only fp8-cs and mxfp8 keep FP8 parameters"
    return None


def fp8_gather_active(kind: str, distribution: str, precision: str, fp8_param_gather: bool) -> bool:
    """Whether FP8 parameters (and their gather) apply: AdamW element-wise with an FP8 recipe."""
    return fp8_param_gather and fp8_gather_note(kind, distribution, precision, fp8_param_gather) is None


def param_gather_bytes_per_element(precision: str, fp8: bool) -> int:
    """Bytes per element the parameter all-gather moves for a buffer (1 for fp8-cs FP8 parameters)."""
    return 1 if fp8 and precision == "fp8-cs" else BF16_BYTES


def weight_bytes_per_element(precision: str, reuse_grad_buf: bool) -> float:
    """Bytes per element a GPU holds for one FP8 parameter (its quantized copy and, for MXFP8
    without ``reuse_grad_buf_for_mxfp8_param_ag``, the separate BF16 gather buffer)."""
    if precision == "fp8-cs":
        return FP8_CS_PARAM_BYTES
    return MXFP8_PARAM_BYTES + (0.0 if reuse_grad_buf else BF16_BYTES)
