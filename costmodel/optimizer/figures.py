"""Plotly figure of per-GPU optimizer load (``muonsim compare --html``); plotly imported lazily."""

from __future__ import annotations

from typing import Any

import numpy as np

from costmodel.optimizer.plan_types import OptimizerPlan, StageOptimizerPlan


def per_gpu_loads_s(stage: StageOptimizerPlan) -> dict[str, np.ndarray]:
    """Per-GPU seconds (stage-local Megatron order) of NS GEMMs, element-wise kernels, TP comm and the
    GPU's idle time waiting for the host to issue kernels (launch-bound steps)."""
    gpus = stage.gpus
    index = {(r.dense_rank, r.expert_rank): r for r in stage.ranks}
    g = np.arange(gpus)
    d, e = g // stage.tp, g // (stage.etp * stage.ep)
    rows = [index[(int(a), int(b))] for a, b in zip(d, e, strict=True)]
    return {
        "Newton-Schulz": np.array([r.newton_schulz_s for r in rows]),
        "element-wise": np.array([r.elementwise_s for r in rows]),
        "TP comm": np.array([r.tp_comm_s for r in rows]),
        "host issue wait": np.array([r.host_idle_s for r in rows]),
    }


def optimizer_load_html(plans: list[tuple[str, OptimizerPlan]]) -> str:
    """Self-contained HTML: one panel per variant, stacked per-GPU optimizer time of its critical stage."""
    return optimizer_load_figure(plans).to_html(include_plotlyjs=True, full_html=True)


def optimizer_load_figure(plans: list[tuple[str, OptimizerPlan]]) -> Any:
    """The plotly figure of :func:`optimizer_load_html`."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    titles = []
    for label, plan in plans:
        st = plan.critical_stage
        mean = st.mean_rank_s
        imb = st.max_rank_s / mean if mean > 0 else 1.0
        titles.append(f"{label}: stage {st.stage}, max {st.max_rank_s * 1e3:.2f} ms, imbalance {imb:.3f}")
    fig = make_subplots(rows=len(plans), cols=1, subplot_titles=titles, vertical_spacing=0.35 / max(len(plans), 1))
    colors = {"Newton-Schulz": "#1f77b4", "element-wise": "#ff7f0e", "TP comm": "#d62728", "host issue wait": "#7f7f7f"}
    for i, (_, plan) in enumerate(plans, start=1):
        loads = per_gpu_loads_s(plan.critical_stage)
        x = np.arange(len(next(iter(loads.values()))))
        for name, vals in loads.items():
            fig.add_trace(go.Bar(x=x, y=vals * 1e3, name=name, marker_color=colors[name], legendgroup=name,
                                 showlegend=i == 1), row=i, col=1)
        fig.update_yaxes(title_text="ms", row=i, col=1)
    fig.update_xaxes(title_text="GPU (stage-local rank)", row=len(plans), col=1)
    fig.update_layout(barmode="stack", height=max(360, 300 * len(plans)), bargap=0.05,
                      title="Optimizer step time per GPU (critical pipeline stage)")
    return fig
