"""The single-process reference: the same parameters and mean gradients, no distribution at all.

Every parameter is held whole (global shape); the data-parallel mean gradient is formed exactly
(:func:`reference.workload.mean_grad`); Muon parameters are orthogonalised as full matrices
(QKV split per component, global-shape scale) — or, with ``ns="blockwise"``, shard by shard as
the blockwise TP mode does, to check that mode's own math. AdamW is the same formula as the
distributed runs. This is what every distributed mode is compared against.
"""

from __future__ import annotations

from typing import Literal

import torch

from reference.config import RunConfig
from reference.muon_math import (
    MatrixInfo,
    adamw_step,
    muon_apply,
    muon_prepare,
    orthogonalize_param,
    without_weight_decay,
)
from reference.runner import hypers, run_specs
from reference.tp_ns import BlockwiseNS, FullMatrixNS
from reference.workload import ParamSpec, initial_param, mean_grad

SerialNS = Literal["full", "blockwise"]


def _orthogonalize(u: torch.Tensor, spec: ParamSpec, ns: SerialNS, full: FullMatrixNS,
                   blockwise: BlockwiseNS) -> torch.Tensor:
    shape = spec.global_shape
    if ns == "blockwise" and spec.shard_dim is not None and spec.shards > 1:
        info = MatrixInfo(spec.name, shape, spec.shard_dim, spec.shards, spec.shard_group or "tp",
                          spec.qkv_groups, spec.qkv_split)
        parts = [orthogonalize_param(p.contiguous(), info, blockwise) for p in u.chunk(spec.shards, spec.shard_dim)]
        return torch.cat(parts, dim=spec.shard_dim)
    info = MatrixInfo(spec.name, shape, None, 1, "tp", spec.qkv_groups, spec.qkv_split)
    return orthogonalize_param(u, info, full)


def serial_reference(cfg: RunConfig, ns: SerialNS = "full") -> dict[str, torch.Tensor]:
    """Final model parameters (global, fp32 view of the model dtype) after ``cfg.steps`` steps."""
    muon, adam = hypers(cfg)
    full, blockwise = FullMatrixNS(muon), BlockwiseNS(muon)
    dtype = torch.float32 if cfg.param_dtype == "fp32" else torch.bfloat16
    specs = run_specs(cfg)
    model = {s.name: initial_param(s, cfg.seed).to(dtype) for s in specs}
    master = {n: p.to(torch.float32) for n, p in model.items()}
    state: dict[str, list[torch.Tensor]] = {}
    for step in range(cfg.steps):
        for s in specs:
            replicas = cfg.expert_dp if s.is_expert else cfg.dp
            g = mean_grad(s, cfg.seed, step, replicas)
            if cfg.grad_dtype == "bf16":
                g = g.to(torch.bfloat16).to(torch.float32)  # approximate: bf16 reductions are not exact
            p = master[s.name]
            if s.optimizer == "muon":
                buf = state.setdefault(s.name, [torch.zeros_like(p)])[0]
                u = muon_prepare(p, g, buf, muon)
                muon_apply(p, _orthogonalize(u, s, ns, full, blockwise), muon)
            else:
                m, v = state.setdefault(s.name, [torch.zeros_like(p), torch.zeros_like(p)])
                adamw_step(p, g, m, v, step + 1, adam if s.weight_decay else without_weight_decay(adam))
            model[s.name] = p.to(dtype)
    return {n: t.to(torch.float32) for n, t in model.items()}


def initial_params(cfg: RunConfig) -> dict[str, torch.Tensor]:
    """The global initial model parameters (fp32 view of the model dtype)."""
    dtype = torch.float32 if cfg.param_dtype == "fp32" else torch.bfloat16
    return {s.name: initial_param(s, cfg.seed).to(dtype).to(torch.float32) for s in run_specs(cfg)}
