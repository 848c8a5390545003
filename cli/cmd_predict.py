"""``muonsim predict``: the step time of a scenario and where it goes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.common import (
    CalibrationOpt,
    CliError,
    EngineOpt,
    JsonOpt,
    ReleaseOpt,
    ScenarioFileArg,
    check_engine,
    check_output_paths,
    check_release,
    ignored_setting_notes,
    print_json,
    release_settings_lines,
    resolve_release_scenario,
    user_errors,
    with_release_note,
    with_scenario_flags,
    write_text_atomically,
)
from cli.memory_advice import with_memory_advice


def register(app: typer.Typer) -> None:
    """Add ``predict`` to the app."""
    app.command("predict")(predict)


@user_errors
@with_scenario_flags
def predict(
    scenario_file: ScenarioFileArg = None,
    engine: EngineOpt = "analytic",
    json_out: JsonOpt = False,
    trace: Annotated[Path | None, typer.Option("--trace", metavar="FILE", help="write a Perfetto/Chrome trace (des engine)")] = None,
    html: Annotated[Path | None, typer.Option("--html", metavar="FILE", help="write a plotly page: the DES timeline beside the breakdown")] = None,
    calibration: CalibrationOpt = None,
    release: ReleaseOpt = None,
    *, scenario_flags: dict[str, str],
) -> None:
    """Predict one training step: step time, throughput, MFU and the breakdown of where time goes."""
    from cli.common import load_calibration
    from costmodel.engine import predict as run_predict

    check_engine(engine)
    if trace is not None and engine != "des":
        raise CliError("--trace needs the simulated timeline: add --engine des")
    check_output_paths(trace, html, flags=("--trace", "--html"))
    check_release(None, release, "")
    sc, layered, chosen = resolve_release_scenario(scenario_file, scenario_flags, release)
    profile = load_calibration(calibration)
    report = run_predict(sc, engine, profile, release)  # type: ignore[arg-type]
    report = with_memory_advice(with_release_note(report, release, chosen, sc))
    from costmodel import exporters

    texts: list[tuple[Path, str]] = []
    if trace is not None:
        texts.append((trace, exporters.trace_json(report)))
    if html is not None:  # the page shows the simulated timeline whatever the engine
        timeline = report if report.events else run_predict(sc, "des", profile, release)  # type: ignore[arg-type]
        texts.append((html, exporters.to_html(report, timeline)))
    for path, text in texts:  # only after the prediction (and every export) succeeded
        write_text_atomically(path, text)
    if json_out:
        data = report.to_json_dict() | {"layout": layered.to_json_dict()}
        data["recipe_settings"] = chosen.to_json_dict() if chosen is not None else None
        print_json(data)
        return
    from cli.terminal import console as make_console

    console = make_console()
    console.print(exporters.render_table(report, layout=layered.summary()))
    for note in ignored_setting_notes(report, layered, sc.optimizer):
        console.print(f"note: {note}", markup=False, highlight=False)
    for line in release_settings_lines(chosen, sc):
        console.print(line, markup=False, highlight=False)
    for path, _ in texts:
        console.print(f"wrote {path}")
