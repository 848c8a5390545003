"""A plotly picture of a fabric graph: layers of NVLink switches, GPUs, NICs, leaves, spines, cores.

Large jobs are drawn through a representative part (the first few NVLink domains and the switches
that connect them); the title says how much is shown. plotly and networkx are imported lazily.
"""

from __future__ import annotations

from topologies.hardware import SystemSpec
from topologies.layout import FabricLayout

LAYERS = {"nvlink_switch": 0, "gpu": 1, "nic": 2, "leaf": 3, "spine": 4, "core": 5}
COLORS = {"nvlink_switch": "#76b900", "gpu": "#1f77b4", "nic": "#9467bd", "leaf": "#ff7f0e", "spine": "#d62728", "core": "#8c564b"}
MAX_DRAWN_DOMAINS = 4


def fabric_figure_html(layout: FabricLayout, system: SystemSpec, max_domains: int = MAX_DRAWN_DOMAINS) -> str:
    """Self-contained HTML (plotly from CDN) picturing the fabric of the first ``max_domains`` domains."""
    import plotly.graph_objects as go

    from topologies.fabric import build_fabric

    shown = list(range(min(layout.domains, max_domains)))
    g = build_fabric(layout, system, domains=shown if layout.domains > 1 else None)
    by_layer: dict[str, list] = {k: [] for k in LAYERS}
    for node, data in g.nodes(data=True):
        by_layer[data["kind"]].append(node)
    pos = {}
    for kind, nodes in by_layer.items():
        nodes.sort()
        for i, node in enumerate(nodes):
            pos[node] = ((i + 0.5) / max(len(nodes), 1), LAYERS[kind])
    traces = []
    for link, color in (("nvlink", "rgba(118,185,0,0.15)"), ("pcie", "rgba(148,103,189,0.4)"), ("network", "rgba(255,127,14,0.3)")):
        xs: list[float | None] = []
        ys: list[float | None] = []
        for u, v, data in g.edges(data=True):
            if data["link"] == link and u < v:
                xs += [pos[u][0], pos[v][0], None]
                ys += [pos[u][1], pos[v][1], None]
        traces.append(go.Scatter(x=xs, y=ys, mode="lines", line={"width": 0.5, "color": color}, name=link, hoverinfo="skip"))
    for kind, nodes in by_layer.items():
        if not nodes:
            continue
        traces.append(go.Scatter(
            x=[pos[n][0] for n in nodes], y=[pos[n][1] for n in nodes], mode="markers", name=kind,
            marker={"size": 6 if kind in ("gpu", "nic") else 9, "color": COLORS[kind]},
            text=[str(n) for n in nodes], hoverinfo="text"))
    part = "" if len(shown) == layout.domains else f" (first {len(shown)} of {layout.domains} domains shown)"
    fig = go.Figure(traces)
    fig.update_layout(
        title=f"{system.name}: {layout.gpus} GPUs, {layout.domains} domain(s), {layout.tiers}-tier fabric{part}",
        yaxis={"tickvals": list(LAYERS.values()), "ticktext": list(LAYERS), "showgrid": False},
        xaxis={"visible": False}, plot_bgcolor="white", height=600)
    return fig.to_html(include_plotlyjs=True, full_html=True)
