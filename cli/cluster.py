"""The ``--scheduler`` option shared by ``plan`` and ``sweep``: run the tasks on a Dask cluster."""

from __future__ import annotations

from typing import Annotated

import typer

SchedulerOpt = Annotated[str | None, typer.Option(
    "--scheduler", metavar="ADDRESS",
    help="run on the workers of this Dask scheduler (e.g. tcp://10.0.0.1:8786) instead of local processes; "
         "needs the cluster extra: pip install 'muonsim\\[cluster]'")]
