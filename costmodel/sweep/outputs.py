"""The files a sweep writes into its output directory, and their names."""

from __future__ import annotations

from pathlib import Path

from costmodel.sweep.figures import sweep_html
from costmodel.sweep.points import Grid
from costmodel.sweep.run import SweepOutcome
from costmodel.sweep.tables import parquet_available, write_csv, write_parquet

JOURNAL = "journal.jsonl"
PARQUET = "results.parquet"
CSV = "results.csv"
HTML = "summary.html"


def default_out_dir(grid_path: Path) -> Path:
    """``<grid stem>-sweep/`` beside the grid file."""
    return grid_path.with_name(f"{grid_path.stem}-sweep")


def write_outputs(outcome: SweepOutcome, grid: Grid, out_dir: Path) -> list[Path]:
    """Write the rows (Parquet when pyarrow is installed, CSV) and the HTML summary; the paths written."""
    written = []
    out_dir.mkdir(parents=True, exist_ok=True)
    if parquet_available():
        write_parquet(outcome.rows, out_dir / PARQUET)
        written.append(out_dir / PARQUET)
    write_csv(outcome.rows, out_dir / CSV)
    written.append(out_dir / CSV)
    html_path = out_dir / HTML
    tmp = html_path.with_name(html_path.name + ".tmp")
    tmp.write_text(sweep_html(outcome.rows, grid.axes, outcome.total, f"muonsim sweep: {grid.path.name}"),
                   encoding="utf-8")
    tmp.replace(html_path)
    written.append(html_path)
    return written
