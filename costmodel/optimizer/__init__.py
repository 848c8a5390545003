"""Optimizer models: element-wise (AdamW) and layer-wise (Muon) distributed optimizers.

Public API: :func:`build_optimizer_plan` (scenario -> OptimizerPlan, cached),
:func:`plan_from_inventory` (inventory + :class:`Grid` -> the same plan; reference backend),
:func:`expected_rank_collectives` (byte-exact per-GPU collective lists) and
:func:`optimizer_report` (plan -> costmodel.report.OptimizerReport). The step's work per GPU is the
kernel sequence of :mod:`costmodel.optimizer.kernel_sequence` (what MCore and Emerging-Optimizers
launch per tensor), timed by :mod:`costmodel.kernels`.
"""

from costmodel.optimizer.plan import (
    build_optimizer_plan,
    expected_rank_collectives,
    optimizer_report,
    plan_from_inventory,
    plan_key,
)
from costmodel.optimizer.stage_builder import Grid

__all__ = ["Grid", "build_optimizer_plan", "expected_rank_collectives", "optimizer_report", "plan_from_inventory", "plan_key"]
