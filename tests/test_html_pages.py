"""The HTML pages: predict shows the DES timeline (one row per stage × stream) beside the breakdown
and names the scenario; compare plots each variant's breakdown; every page embeds plotly.

(Rendering in a real browser is ``benchmarks/html_pages.py``: headless Chromium screenshots.)
"""

from __future__ import annotations

import re
from pathlib import Path

from costmodel.engine import predict
from costmodel.report_figures import STREAM_ORDER, breakdowns_figure, predict_html, timeline_rows

REMOTE = re.compile(r"""<script[^>]+src=["']https?://""", re.IGNORECASE)


def test_predict_page_has_a_stage_by_stream_timeline_and_names_the_scenario(default_scenario) -> None:
    analytic = predict(default_scenario, "analytic")
    des = predict(default_scenario, "des")
    rows = timeline_rows(des)
    stages = [f"pp{s}" for s in range(default_scenario.par.pp)]
    assert [r.split()[0] for r in rows] == sorted((r.split()[0] for r in rows), key=stages.index)
    for stage in stages:
        streams = [r.split()[1] for r in rows if r.split()[0] == stage]
        assert {"compute", "ep", "pp", "dp", "optimizer"} <= set(streams), (stage, streams)
        assert streams == sorted(streams, key=STREAM_ORDER.index)
    html = predict_html(analytic, des)
    for row in rows:
        assert f'"{row}"' in html
    sc = default_scenario.config
    for word in (sc.model, sc.system, sc.precision.value, "calibration", "bytes per GPU", "step-time breakdown"):
        assert word in html, word
    assert REMOTE.search(html) is None and "plotly" in html


def test_predict_html_cli_always_has_the_timeline(run_cli, tmp_path: Path) -> None:
    page = tmp_path / "p.html"
    res = run_cli("predict", "--html", str(page))  # analytic engine: the page simulates the timeline
    assert res.exit_code == 0, res.output
    text = page.read_text(encoding="utf-8")
    assert "pp0 compute" in text and "discrete-event engine" in text


def test_compare_page_plots_each_variants_breakdown(default_scenario) -> None:
    off, on = (predict(default_scenario.with_updates(ep_comm_overlap=v), "analytic") for v in (False, True))
    fig = breakdowns_figure(["off", "on"], [off, on], "t")
    ep = next(t for t in fig.data if t.name == "exposed comm: ep")
    assert list(ep.y) == ["off", "on"] and ep.x[1] < ep.x[0]


def test_topology_page_embeds_plotly(run_cli, tmp_path: Path) -> None:
    page = tmp_path / "t.html"
    res = run_cli("topology", "--system", "gb200-nvl72", "--gpus", "144", "--html", str(page))
    assert res.exit_code == 0, res.output
    text = page.read_text(encoding="utf-8")
    assert REMOTE.search(text) is None and len(text) > 1_000_000  # plotly.js inside the page
