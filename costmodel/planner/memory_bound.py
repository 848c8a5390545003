"""A vectorised lower bound on memory per GPU: weights plus gradients of the heaviest stage.

Screening a trillion-parameter MoE model over tens of thousands of parallel layouts cannot call the
full memory model for each: most layouts are impossible because the weights alone do not fit. Every
GPU holds its weights (at least 2 bytes/param in bf16, 1 byte for FP8 primary weights) and a gradient
buffer in ``grad_reduce_dtype`` for all the parameters of its pipeline stage (Megatron's distributed
optimizers shard only the optimizer state), so ``(weight bytes + grad_bytes) x params on the heaviest
stage`` never exceeds the full memory model's total. The parameter count per GPU comes from the project's tensor inventory (built once at
tp = 1): per layer, the replicated weights, the tp-sharded weights (/tp) and the routed experts
(/(ep x etp)); the embedding and the output layer (tp-padded vocabulary, /tp) sit on the first and
last stage. Layouts whose bound exceeds the usable HBM are dropped before the full memory model.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from workloads.inventory import build_inventory
from workloads.models import ModelSpec
from workloads.pipeline_layout import layer_placement

BF16_BYTES = 2


@lru_cache(maxsize=16)
def _layer_classes(model: ModelSpec) -> tuple[np.ndarray, float, float, float]:
    """Per main+MTP layer: [replicated, tp-sharded, expert (all experts)] parameters; final-norm
    and the other non-layer replicated parameters of the last stage; those of the first stage (a
    learned position table); the hidden size (for the vocabulary matrices)."""
    inv = build_inventory(model)
    n = model.num_layers + model.mtp_layers
    classes = np.zeros((n, 3), dtype=np.float64)
    outside, first = 0.0, 0.0
    for t in inv.tensors:
        if t.role in ("embedding", "output"):
            continue
        if t.role == "position_embedding":
            first += t.total_numel
            continue
        if t.layer is None:
            outside += t.total_numel
            continue
        col = 0 if t.shard_group is None else (1 if t.shard_group == "tp" else 2)
        classes[t.layer, col] += t.total_numel
    return classes, outside, first, float(model.hidden_size)


@lru_cache(maxsize=512)
def _stage_classes(model: ModelSpec, pp: int, vpp: int, split: str) -> np.ndarray:
    """Per pipeline stage: [replicated, tp-sharded, expert, holds embedding, holds output] totals."""
    classes, outside, first, _ = _layer_classes(model)
    out = np.zeros((pp, 5), dtype=np.float64)
    for layer, (stage, _chunk) in enumerate(layer_placement(model.num_layers, pp, vpp, split)):  # type: ignore[arg-type]
        out[stage, :3] += classes[layer]
    last = pp - 1
    for j in range(model.mtp_layers):
        out[last, :3] += classes[model.num_layers + j]
    out[last, 0] += outside
    out[0, 0] += first
    out[0, 3] = 1.0
    # tied: one tensor with one stage; with MTP the last stage's copy (column 3) is the output weight
    out[last, 4] = 0.0 if model.tie_embeddings and (pp == 1 or model.mtp_layers) else 1.0
    if model.mtp_layers and pp > 1:
        out[last, 3] = 1.0  # the MTP layers' own copy of the word embedding
    return out


def stage_params_max(model: ModelSpec, grid: np.ndarray, split: str = "auto") -> np.ndarray:
    """Parameters held by one GPU of the heaviest pipeline stage, per row of ``grid``.

    ``grid`` columns: tp, pp, vpp, cp, ep, etp, mbs (as :data:`costmodel.planner.space.STRUCT_KEYS`).
    Rows must pass the divisibility rules (see ``structure_mask``).
    """
    out = np.zeros(len(grid), dtype=np.float64)
    if len(grid) == 0:
        return out
    tp, pp, vpp, ep, etp = grid[:, 0], grid[:, 1], grid[:, 2], grid[:, 4], grid[:, 5]
    h = _layer_classes(model)[3]
    vocab = np.array([model.padded_vocab_size(int(t)) for t in tp], dtype=np.float64)
    vocab_per_rank = vocab * h / tp
    keys = np.stack([pp, vpp], axis=1)
    for p, v in np.unique(keys, axis=0).tolist():
        rows = np.nonzero((pp == p) & (vpp == v))[0]
        stages = _stage_classes(model, p, v, split)  # (pp, 5)
        per_rank = (stages[None, :, 0] + stages[None, :, 1] / tp[rows, None]
                    + stages[None, :, 2] / (ep[rows, None] * etp[rows, None])
                    + (stages[None, :, 3] + stages[None, :, 4]) * vocab_per_rank[rows, None])
        out[rows] = per_rank.max(axis=1)
    return out


def weights_and_grads_bytes(model: ModelSpec, grid: np.ndarray, grad_bytes: int, split: str = "auto",
                            weight_bytes: float = BF16_BYTES) -> np.ndarray:
    """Lower bound on memory per GPU in bytes (weights + gradients of the heaviest stage); ``weight_bytes``:
    the fewest bytes any parameter takes (bf16 2, FP8 primary weights 1: see
    :func:`workloads.weight_memory.min_weight_bytes_per_element`)."""
    return stage_params_max(model, grid, split) * (weight_bytes + grad_bytes)
