"""The DES timeline: valid Chrome Trace Event JSON that shows the pipeline schedule; HTML report."""

from __future__ import annotations

import json

import pytest

from costmodel.des import run_des
from costmodel.exporters import to_chrome_trace
from workloads.scenario import DEFAULT_SCENARIO, build_config

# seq 8192: long enough that the MoE passes are GPU-bound, so the EP collectives show on their own
# track (at 2048 tokens the host's launch time hides them, costmodel.layer_costs.hide_under_host)
SMALL = {"model": "qwen3-30b-a3b", "gpus": 16, "tp": 1, "pp": 4, "vpp": 2, "ep": 4, "micro_batch_size": 1,
         "global_batch_size": 32, "seq_length": 8192, "optimizer": "adamw"}


@pytest.fixture(scope="module")
def report():
    sc = build_config(DEFAULT_SCENARIO.model_dump(), SMALL).resolve()
    return run_des(sc)


def test_trace_is_valid_trace_event_json(report) -> None:
    trace = json.loads(json.dumps(to_chrome_trace(report)))
    events = trace["traceEvents"]
    assert isinstance(events, list) and events
    complete = [e for e in events if e["ph"] == "X"]
    meta = [e for e in events if e["ph"] == "M"]
    assert len(complete) + len(meta) == len(events)
    for e in complete:
        assert isinstance(e["name"], str) and isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert isinstance(e["ts"], float) and e["ts"] >= 0 and e["dur"] >= 0
    names = {(e["pid"], e["args"]["name"]) for e in meta if e["name"] == "process_name"}
    assert {n for _, n in names} == {f"pp{s}" for s in range(4)}
    threads = {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in complete} <= threads  # every event sits on a named track


def test_trace_shows_the_pipeline_schedule(report) -> None:
    m, vpp, pp = 32 // (1 * 4), 2, 4  # micro-batches per step (dp = 4)
    by_rank: dict[str, list] = {}
    for ev in report.events:
        if ev.stream == "compute" and ev.step == 2:
            by_rank.setdefault(ev.rank, []).append(ev)
    for s in range(pp):
        evs = by_rank[f"pp{s}"]
        names = {e.name for e in evs}
        assert len([n for n in names if n.startswith("F ")]) == m * vpp
        assert len([n for n in names if n.startswith("B ")]) == m * vpp
    # fill: stage s starts its first forward after stage s-1 finished one
    first = [min(e.start_s for e in by_rank[f"pp{s}"] if e.name == "F mb0 c0") for s in range(pp)]
    assert first == sorted(first) and len(set(first)) == pp
    streams = {ev.stream for ev in report.events}
    assert {"compute", "ep", "pp", "dp", "optimizer"} <= streams


def test_cli_writes_trace_and_html_for_the_des(run_cli, tmp_path) -> None:
    trace, html = tmp_path / "t.json", tmp_path / "r.html"
    res = run_cli("predict", "--model", "qwen3-30b-a3b", "--gpus", "16", "--pp", "4", "--vpp", "2", "--ep", "4",
                  "--mbs", "1", "--gbs", "32", "--seq", "2048", "--optimizer", "adamw", "--engine", "des",
                  "--json", "--trace", str(trace), "--html", str(html))
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["engine"] == "des" and "events" not in data
    assert json.loads(trace.read_text())["traceEvents"]
    text = html.read_text()
    assert "<html>" in text[:200] and "Plotly.newPlot" in text and "step-time breakdown" in text


def test_the_planner_gets_the_same_report_with_its_timeline_sent_as_tuples(report) -> None:
    """The planner's workers send a DES report without its TimelineEvent models and the raw timeline
    as tuples (pickling ~12,000 models cost ~60 ms per plan); the report rebuilt from them is
    ``run_des``'s, event for event, and the tuples pickle to a fraction of the models' bytes."""
    import pickle

    from costmodel.planner.plan import _default_des, _full_report

    sc = build_config(DEFAULT_SCENARIO.model_dump(), SMALL).resolve()
    untimed = _default_des(sc)
    assert untimed.report.events == [] and len(untimed.raw) == len(report.events) > 0
    assert untimed.step_time_s == report.step_time_s
    full = _full_report(untimed)
    assert full == report and full.model_fields_set == report.model_fields_set
    assert all(a.__dict__ == b.__dict__ and a.model_fields_set == b.model_fields_set
               for a, b in zip(full.events, report.events, strict=True))
    assert len(pickle.dumps(untimed)) < len(pickle.dumps(report)) / 2
