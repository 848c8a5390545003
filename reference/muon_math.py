"""The per-parameter optimizer math: Muon (EO step order) and AdamW (torch's formula).

Muon, per 2-D parameter, in the order of §1.1 of the spec, with Emerging-Optimizers 0.3.0's exact
expressions (``OrthogonalizedOptimizer.step``, ``WeightDecayMixin``, ``Muon``; Megatron-Core's
``TensorParallelMuon`` uses the same), so the result is bitwise equal to EO's
(``tests/test_reference_eo_oracle.py`` runs EO itself):

1. weight decay ``p.add_(p, alpha=-wd·lr)`` (decoupled; also ``independent``, ``l2``, ``palm``);
2. EMA momentum ``M.lerp_(g, 1 − μ)``;
3. Nesterov ``U = g.lerp(M, μ)`` (else ``U = M``);
4. ``O = NS(U) * scale * extra`` — two fp32 products in this order, scale from the global shape
   (``get_muon_scale_factor``), with the fused QKV split per component (§1.5);
5. ``p.add_(O, alpha=-lr)``.

The orthogonalisation of one matrix is delegated to an :class:`Orthogonalizer` so that the same
code runs the single-process full-matrix math and the three tensor-parallel modes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal, Protocol

import torch

from reference.newton_schulz import CoefficientSchedule, MatmulPrecision, ScaleMode, scale_factor

WeightDecayMethod = Literal["decoupled", "independent", "l2", "palm"]


@dataclass(frozen=True)
class MuonHyper:
    """Muon hyper-parameters (lr in parameter units per step; the rest dimensionless)."""

    lr: float
    momentum: float
    nesterov: bool
    weight_decay: float
    schedule: CoefficientSchedule
    ns_steps: int
    precision: MatmulPrecision
    eps: float
    scale_mode: ScaleMode
    extra_scale: float
    normalize_in: Literal["fp32", "work_dtype"] = "fp32"  # fp32: EO/Megatron; work_dtype: torch.optim.Muon
    weight_decay_method: WeightDecayMethod = "decoupled"


@dataclass(frozen=True)
class AdamHyper:
    """AdamW hyper-parameters (decoupled weight decay, torch.optim.AdamW semantics)."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float


@dataclass(frozen=True)
class MatrixInfo:
    """What the Muon step needs to know about one 2-D parameter.

    ``shard_dim`` is the tensor-parallel dim of the local shard (0 column-parallel, 1
    row-parallel, None replicated); ``qkv_groups`` > 0 marks a fused QKV weight to split into
    components of ``qkv_split`` rows per query group.
    """

    name: str
    global_shape: tuple[int, int]
    shard_dim: int | None
    shards: int
    tp_group: str  # 'tp' or 'etp': the group the shard dim is split over
    qkv_groups: int = 0
    qkv_split: tuple[int, ...] = ()

    def local_shape(self) -> tuple[int, int]:
        """Shape of one tensor-parallel shard."""
        rows, cols = self.global_shape
        if self.shard_dim == 0:
            return rows // self.shards, cols
        if self.shard_dim == 1:
            return rows, cols // self.shards
        return rows, cols

    def component_global_shapes(self) -> list[tuple[int, int]]:
        """Global shapes Newton–Schulz sees (Q, K, V when split; else the whole matrix)."""
        if not self.qkv_groups:
            return [self.global_shape]
        cols = self.global_shape[1]
        return [(self.qkv_groups * s, cols) for s in self.qkv_split]


class Orthogonalizer(Protocol):
    """Orthogonalises one component (local fp32 shard) and returns the scaled local result."""

    def __call__(self, u_local: torch.Tensor, global_shape: tuple[int, int], info: MatrixInfo, /) -> torch.Tensor: ...


def split_qkv(u: torch.Tensor, groups_local: int, split: tuple[int, ...]) -> list[torch.Tensor]:
    """Split a local fused-QKV ``[groups·Σsplit, H]`` into Q, K, V (all query groups together)."""
    cols = u.shape[1]
    view = u.reshape(groups_local, sum(split), cols)
    return [part.reshape(-1, cols) for part in torch.split(view, list(split), dim=1)]


def merge_qkv(parts: list[torch.Tensor], groups_local: int, split: tuple[int, ...]) -> torch.Tensor:
    """Inverse of :func:`split_qkv`."""
    cols = parts[0].shape[1]
    views = [p.reshape(groups_local, s, cols) for p, s in zip(parts, split, strict=True)]
    return torch.cat(views, dim=1).reshape(-1, cols)


def orthogonalize_param(u_local: torch.Tensor, info: MatrixInfo, ortho: Orthogonalizer) -> torch.Tensor:
    """``NS(U)·scale`` of one local parameter shard, splitting a fused QKV per component."""
    if not info.qkv_groups:
        return ortho(u_local, info.global_shape, info)
    groups_local = info.qkv_groups // (info.shards if info.shard_dim == 0 else 1)
    parts = split_qkv(u_local, groups_local, info.qkv_split)
    shapes = info.component_global_shapes()
    outs = [ortho(p.contiguous(), s, info) for p, s in zip(parts, shapes, strict=True)]
    return merge_qkv(outs, groups_local, info.qkv_split)


def scale_update(orth: torch.Tensor, rows: int, cols: int, hyper: MuonHyper) -> torch.Tensor:
    """``orth * scale(rows, cols) * extra_scale_factor``: EO's expression and order (two fp32 products;
    folding the two factors into one would round differently)."""
    return orth * scale_factor(rows, cols, hyper.scale_mode) * hyper.extra_scale


def apply_weight_decay(p: torch.Tensor, g: torch.Tensor, hyper: MuonHyper) -> torch.Tensor:
    """EO's ``WeightDecayMixin``: decay ``p`` in place, or (``l2``) return ``g + wd·p``; returns the gradient.

    ``l2`` adds into a new tensor where EO adds into ``p.grad`` in place: the same values, and the
    gradient buffer is left as the collectives wrote it.
    """
    wd, lr, method = hyper.weight_decay, hyper.lr, hyper.weight_decay_method
    if wd == 0.0:
        return g
    if method == "decoupled":
        p.add_(p, alpha=(-wd * lr))
    elif method == "independent":
        p.add_(p, alpha=-wd)
    elif method == "l2":
        return g.add(p, alpha=wd)
    elif method == "palm":
        p.add_(p, alpha=(-(wd * lr * lr)))
    else:
        raise ValueError(f"unknown weight_decay_method '{method}'")
    return g


def muon_prepare(p: torch.Tensor, g: torch.Tensor, buf: torch.Tensor, hyper: MuonHyper) -> torch.Tensor:
    """Steps 1–3: weight decay and momentum ``buf`` in place; returns the NS input U (fp32)."""
    g = apply_weight_decay(p, g, hyper)
    buf.lerp_(g, 1 - hyper.momentum)
    return g.lerp(buf, hyper.momentum) if hyper.nesterov else buf.clone()


def muon_apply(p: torch.Tensor, update: torch.Tensor, hyper: MuonHyper) -> None:
    """Step 5: ``p ← p − lr·O`` in place (``update`` already scaled)."""
    p.add_(update, alpha=-hyper.lr)


def adamw_step(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, step: int,
               hyper: AdamHyper, decay_factor: torch.Tensor | None = None) -> None:
    """One AdamW step in place on fp32 tensors (``step`` counts from 1), torch's formula.

    ``decay_factor`` (same shape as ``p``) replaces the scalar ``1 − lr·wd`` per element: 1 where
    no weight decay applies, for a flat shard that spans several parameters.
    """
    if decay_factor is not None:
        p.mul_(decay_factor)
    elif hyper.weight_decay:
        p.mul_(1 - hyper.lr * hyper.weight_decay)
    m.lerp_(g, 1 - hyper.beta1)
    v.mul_(hyper.beta2).addcmul_(g, g, value=1 - hyper.beta2)
    bias1 = 1 - hyper.beta1 ** step
    bias2_sqrt = math.sqrt(1 - hyper.beta2 ** step)
    denom = (v.sqrt() / bias2_sqrt).add_(hyper.eps)
    p.addcdiv_(m, denom, value=-hyper.lr / bias1)


def without_weight_decay(hyper: AdamHyper) -> AdamHyper:
    """The same AdamW with weight decay 0 (Megatron's group for biases and 1-D parameters)."""
    return replace(hyper, weight_decay=0.0)
