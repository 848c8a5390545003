"""Sweeps (``muonsim sweep GRID.yaml``): many predict and plan points, resumable, local or on Dask.

Public API:

- :func:`costmodel.sweep.points.expand_grid` (grid file -> :class:`~costmodel.sweep.points.Grid`
  of :class:`~costmodel.sweep.points.SweepPoint`; the file's schema is :mod:`costmodel.sweep.grid`);
- :func:`costmodel.sweep.run.run_sweep` (grid, journal path, ``jobs`` or ``scheduler``) ->
  :class:`~costmodel.sweep.run.SweepOutcome` (rows in grid order);
- :func:`costmodel.sweep.outputs.write_outputs` (Parquet, CSV, HTML summary).

Modules: grid (file schema, axes), points (expansion, content keys), task (one point on a
worker: predict or plan, result columns), journal (append-only record of finished points), run,
tables (CSV, Parquet), figures (plotly summary), outputs (file names).
"""
