"""Writing sweep rows as CSV (always) and Parquet (with pyarrow, the ``cluster`` extra).

Every row gets every column (``None`` where a point has no value); columns keep the order in which
they first appear in grid order. Files are written whole or not at all (temporary file + rename).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PARQUET_HINT = "pip install 'muonsim[cluster]'"


def columns(rows: list[dict[str, Any]]) -> list[str]:
    """The union of the rows' columns, in order of first appearance."""
    return list(dict.fromkeys(k for row in rows for k in row))


def full_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every row with every column (missing cells are None)."""
    names = columns(rows)
    return [{k: row.get(k) for k in names} for row in rows]


@contextmanager
def _atomic(path: Path) -> Iterator[Path]:
    tmp = path.with_name(path.name + ".tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """Rows as CSV (floats in their shortest exact form; None as an empty cell)."""
    names = columns(rows)
    with _atomic(Path(path)) as tmp, tmp.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=names, restval="")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})


def parquet_available() -> bool:
    """Whether pyarrow (the Parquet engine) is installed."""
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return False
    return True


def write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    """Rows as a Parquet table (pyarrow infers each column's type)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(full_rows(rows))
    with _atomic(Path(path)) as tmp:
        pq.write_table(table, tmp)


def read_parquet(path: Path) -> list[dict[str, Any]]:
    """A Parquet table written by :func:`write_parquet` back as rows."""
    import pyarrow.parquet as pq

    return list(pq.read_table(path).to_pylist())
