"""Loaders of measured runs: CSV / JSON of the MeasuredRun schema and Megatron training logs.

Every loader returns :class:`workloads.measured.MeasuredRun` objects or raises one
:class:`UserInputError` line naming the file, the row (CSV line or JSON entry) and the column.

* **CSV** (``.csv``): one row per run, columns of ``../shared/data/README.md``. Optional columns may
  be absent or empty; recipe-settings columns (:data:`workloads.recipe_columns.COLUMNS`) go to
  ``MeasuredRun.recipe_settings``; columns the schema does not know are kept in ``MeasuredRun.extra``.
* **JSON** (``.json``): a list of runs, ``{"runs": [...]}``, or one run (what
  ``muonsim reference run --out run.json`` writes, with ``phase_times_s`` and ``collectives``;
  its system is ``local-cpu`` and its model a reference shape preset, checked later against
  ``extra.config``, not against the catalogues).
* **Megatron-LM / Megatron-Bridge logs** (``.log``, ``.txt``, ``.out``): the lines carrying
  ``elapsed time per iteration (ms)`` (and ``throughput per GPU (TFLOP/s/GPU)``). Warm-up
  iterations, iterations reported as skipped or nan, and lines with a nan loss are dropped; the
  step time is the median of the remaining lines (robust to checkpoint or GC stalls). The scenario
  (model, system, GPUs, precision, batch and parallel sizes) comes from, in increasing priority:
  the Megatron-LM argument dump in the log, a YAML file next to the log (``run.yaml`` for
  ``run.log``, or ``run.log.yaml``), and explicit overrides (the CLI's scenario flags); the dump's
  precision is its ``fp4`` / ``fp8`` + ``fp8_recipe`` / ``fp16`` / ``bf16`` arguments
  (:func:`log_precision`: ``fp8 hybrid`` with ``tensorwise`` is ``fp8-cs``). Recipe
  settings come from the argument dump (Megatron prints most under the same names) and the YAML.
  The log's text is read by :mod:`workloads.megatron_log`.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from topologies.hardware import load_system
from topologies.inputs import UserInputError, likely_misspelling, load_yaml_file
from workloads.measured import MeasuredRun
from workloads.megatron_log import (
    DEFAULT_WARMUP_ITERATIONS,
    log_argument_values,
    parse_megatron_log,
)
from workloads.models import load_model
from workloads.recipe_columns import COLUMNS as RECIPE_COLUMNS
from workloads.recipe_columns import RUN_COLUMNS

RUN_FIELDS = tuple(MeasuredRun.model_fields)
REQUIRED_COLUMNS = tuple(name for name, f in MeasuredRun.model_fields.items() if f.is_required())
_STRUCTURED = {"phase_times_s", "collectives", "extra", "recipe_settings", "model_spec", "scenario_settings"}
LOG_SUFFIXES = (".log", ".txt", ".out")
REFERENCE_SYSTEM = "local-cpu"  # system name of reference-backend runs (muonsim reference run)

# CLI scenario keys (cli.common.SCENARIO_FLAGS) -> MeasuredRun fields, for runs read from logs
SCENARIO_KEY_TO_RUN_FIELD = {
    "gpus": "num_gpus", "mtp_layers": "mtp", "distribution": "optimizer_distribution",
    "tp_mode": "muon_tp_mode", "ns_steps": "muon_ns_steps", "hide_param_gather": "overlap_param_gather",
}

# the command-line flag of a run field a log may lack, where its name differs from the field's
_FLAG_OF_FIELD = {"num_gpus": "--gpus", "global_batch_size": "--gbs", "micro_batch_size": "--mbs",
                  "seq_length": "--seq"}


def _flag_of(field: str) -> str:
    """The command-line flag that sets the run field ``field`` (``num_gpus`` -> ``--gpus``, ``tp`` -> ``--tp``)."""
    return _FLAG_OF_FIELD.get(field, "--" + field.replace("_", "-"))


def is_recipe_column(name: str) -> bool:
    """Whether ``name`` is a recipe-settings column (kept in ``MeasuredRun.recipe_settings``)."""
    return name in RECIPE_COLUMNS and name not in RUN_FIELDS and name not in RUN_COLUMNS


# Megatron-LM argument names (as printed in its "arguments" block) -> MeasuredRun fields
MEGATRON_ARGS = {
    "tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp",
    "virtual_pipeline_model_parallel_size": "vpp", "context_parallel_size": "cp",
    "expert_model_parallel_size": "ep", "expert_tensor_parallel_size": "etp",
    "micro_batch_size": "micro_batch_size", "global_batch_size": "global_batch_size",
    "seq_length": "seq_length", "world_size": "num_gpus", "mtp_num_layers": "mtp",
    "tp_comm_overlap": "tp_comm_overlap", "overlap_param_gather": "overlap_param_gather",
}
# scenario keys -> the recipe-settings column that sets them (for scenario flags describing a log)
_COLUMN_OF_KEY = {c.key: name for name, c in reversed(list(RECIPE_COLUMNS.items()))
                  if c.key is not None and is_recipe_column(name)}


def _where(path: Path, row: int | None = None, column: str | None = None, row_word: str = "row") -> str:
    parts = [f"file '{path}'"]
    if row is not None:
        parts.append(f"{row_word} {row}")
    if column is not None:
        parts.append(f"column '{column}'")
    return ", ".join(parts)


def _check_misspelt(names: Iterable[str], where: Any) -> None:
    """Refuse a column the schema does not know that resembles one of its columns the file lacks (``ppp`` for
    ``pp``): kept as extra data, it would leave the run read with that column's default. ``where(name)`` is
    the error's location prefix."""
    given = list(names)
    absent = [f for f in RUN_FIELDS if f not in given and f not in _STRUCTURED]
    for name in given:
        if name in RUN_FIELDS or name in _STRUCTURED or is_recipe_column(name):
            continue
        guess = likely_misspelling(name, absent)
        if guess is not None:
            raise UserInputError(f"{where(name)}: not a column of the measured-run schema; did you mean '{guess}'? "
                                 "(rename it: a column the schema does not know is kept as extra data and not read)")


def _validate_run(data: dict[str, Any], path: Path, row: int | None, row_word: str = "row") -> MeasuredRun:
    """Build a MeasuredRun from raw values; one-line error naming file, row and column."""
    try:
        run = MeasuredRun.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        loc = [str(p) for p in first.get("loc", ())]
        column = loc[0] if loc else None
        msg = first.get("msg", "invalid value").removeprefix("Value error, ")
        if column == "recipe_settings" and ": " in msg:  # 'column: problem' from the recipe resolution
            column, msg = msg.split(": ", 1)
            cell = (data.get("recipe_settings") or {}).get(column)
            raise UserInputError(f"{_where(path, row, column, row_word)}: {msg}"
                                 + (f" (got {cell!r})" if cell is not None else "")) from None
        if first.get("type") == "missing":
            raise UserInputError(f"{_where(path, row, column, row_word)}: value is missing") from None
        value = first.get("input")
        shown = "" if isinstance(value, dict | list) else f" (got {value!r})"
        raise UserInputError(f"{_where(path, row, column, row_word)}: {msg}{shown}") from None
    if run.system == REFERENCE_SYSTEM:
        return run  # a reference-backend run: its shapes are resolved from extra.config by the checker
    checks = (("system", load_system),) if run.model_spec is not None else (("model", load_model), ("system", load_system))
    for column, loader in checks:
        try:
            loader(getattr(run, column))
        except UserInputError as err:
            raise UserInputError(f"{_where(path, row, column, row_word)}: {err}") from None
    return run


def _read_text(path: Path, what: str) -> str:
    if not path.is_file():
        raise UserInputError(f"{what} '{path}' does not exist")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UserInputError(f"{what} '{path}' cannot be read: {err}") from None


# ----------------------------------------------------------------------------------------- CSV
def load_csv(path: str | Path) -> list[MeasuredRun]:
    """Read measured runs from a CSV file of the MeasuredRun schema (extra columns -> ``extra``)."""
    p = Path(path)
    lines = _read_text(p, "runs file").splitlines()
    reader = csv.reader(lines)
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise UserInputError(f"{_where(p)}: empty file (expected a header row)") from None
    except csv.Error as err:
        raise UserInputError(f"{_where(p, 1)}: malformed CSV: {err}") from None
    seen: set[str] = set()
    for name in header:
        if not name:
            raise UserInputError(f"{_where(p, 1)}: empty column name in the header")
        if name in seen:
            raise UserInputError(f"{_where(p, 1, name)}: duplicate column")
        seen.add(name)
    _check_misspelt(header, lambda name: _where(p, column=name))
    for name in REQUIRED_COLUMNS:
        if name not in seen:
            raise UserInputError(f"{_where(p, column=name)}: missing column (required: {', '.join(REQUIRED_COLUMNS)})")
    runs: list[MeasuredRun] = []
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            break
        except csv.Error as err:
            raise UserInputError(f"{_where(p, reader.line_num)}: malformed CSV: {err}") from None
        line = reader.line_num
        if not cells or all(not c.strip() for c in cells):
            continue
        if len(cells) != len(header):
            raise UserInputError(
                f"{_where(p, line)}: malformed row: {len(cells)} fields, the header has {len(header)}")
        data: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        recipe: dict[str, Any] = {}
        for name, raw in zip(header, cells, strict=True):
            value = raw.strip()
            if name in _STRUCTURED:
                raise UserInputError(f"{_where(p, line, name)}: not a CSV column (use JSON for {name})")
            if name in RUN_FIELDS:
                if value == "":
                    if name in REQUIRED_COLUMNS:
                        raise UserInputError(f"{_where(p, line, name)}: value is empty")
                    continue
                data[name] = value
            elif is_recipe_column(name):
                if value != "":
                    recipe[name] = value
            elif value != "":
                extra[name] = _scalar(value)
        if extra:
            data["extra"] = extra
        if recipe:
            data["recipe_settings"] = recipe
        runs.append(_validate_run(data, p, line))
    _check_unique(runs, p)
    return runs


def _scalar(text: str) -> Any:
    """A CSV cell of an unknown column as int, float or string."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _check_unique(runs: Iterable[MeasuredRun], path: Path | str) -> None:
    seen: set[str] = set()
    for i, run in enumerate(runs, start=1):
        if run.run_id in seen:
            raise UserInputError(f"file '{path}', run {i}, column 'run_id': duplicate run_id '{run.run_id}'")
        seen.add(run.run_id)


# ---------------------------------------------------------------------------------------- JSON
def load_json(path: str | Path) -> list[MeasuredRun]:
    """Read runs from JSON: a list of runs, ``{"runs": [...]}``, or a single run object."""
    p = Path(path)
    try:
        doc = json.loads(_read_text(p, "runs file"))
    except json.JSONDecodeError as err:
        raise UserInputError(f"{_where(p)}: malformed JSON at line {err.lineno}, column {err.colno}: {err.msg}") from None
    if isinstance(doc, dict) and isinstance(doc.get("runs"), list):
        entries = doc["runs"]
    elif isinstance(doc, list):
        entries = doc
    elif isinstance(doc, dict):
        entries = [doc]
    else:
        raise UserInputError(f"{_where(p)}: expected a run object, a list of runs or {{\"runs\": [...]}}")
    runs = []
    for i, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict):
            raise UserInputError(f"{_where(p, i, row_word='entry')}: expected an object with the run's fields")
        _check_misspelt(entry, lambda name, i=i: _where(p, i, name, "entry"))
        data = {k: v for k, v in entry.items() if k in RUN_FIELDS}
        recipe = {k: v for k, v in entry.items() if is_recipe_column(k)}
        if recipe:
            data["recipe_settings"] = {**(entry.get("recipe_settings") or {}), **recipe}
        unknown = {k: v for k, v in entry.items() if k not in RUN_FIELDS and k not in recipe}
        if unknown:
            data["extra"] = {**(entry.get("extra") or {}), **unknown}
        for name in REQUIRED_COLUMNS:
            if name not in data:
                raise UserInputError(f"{_where(p, i, name, 'entry')}: missing field")
        runs.append(_validate_run(data, p, i, "entry"))
    _check_unique(runs, p)
    return runs


# ----------------------------------------------------------------------------- Megatron logs
# Megatron-LM's --fp8-recipe -> the scenario precision of an FP8 run (--fp8 e4m3 or hybrid: E4M3
# forward, E5M2 gradients; the recipe says how the tensors are scaled). Megatron-LM's default recipe
# (and its only one before --fp8-recipe existed) is 'delayed'; Megatron-Bridge's is 'tensorwise'
# and it prints the recipe (the settings file's fp8_recipe column: hybrid + tensorwise = fp8-cs).
FP8_RECIPE_PRECISION = {"tensorwise": "fp8-cs", "delayed": "fp8-delayed", "mxfp8": "mxfp8",
                        "blockwise": "fp8-blockwise"}
_NOT_SET = ("None", "none", "False", "false", "")


def log_precision(args: Mapping[str, str]) -> str | None:
    """The scenario precision a Megatron-LM argument dump states (``fp4``, ``fp8`` / ``fp8_recipe``,
    ``fp16``, ``bf16``), or None when it states none. An FP8 run without ``fp8_recipe`` used Megatron-LM's
    default, delayed scaling. Raises UserInputError for an FP8 recipe muonsim has no precision for."""
    if args.get("fp4", "None") not in _NOT_SET:
        return "nvfp4"  # --fp4 e2m1 with the nvfp4 recipe (the only FP4 recipe)
    if args.get("fp8", "None") not in _NOT_SET:
        recipe = args.get("fp8_recipe", "delayed")
        if recipe not in FP8_RECIPE_PRECISION:
            raise UserInputError(f"the log's fp8_recipe '{recipe}' is not one of {', '.join(FP8_RECIPE_PRECISION)}; "
                                 "pass --precision")
        return FP8_RECIPE_PRECISION[recipe]
    for name in ("fp16", "bf16"):
        if args.get(name) == "True":
            return name
    return None


def _log_arguments(lines: list[str]) -> dict[str, Any]:
    """Scenario fields from Megatron-LM's printed argument block (``name ..... value``), the precision
    (:func:`log_precision`), recipe settings (same names as the settings file's columns) in ``recipe_settings``."""
    out: dict[str, Any] = {}
    recipe: dict[str, str] = {}
    values = dict(log_argument_values(lines))
    precision = log_precision(values)
    if precision is not None:
        out["precision"] = precision
    for name, value in values.items():
        if name in MEGATRON_ARGS:
            if value not in ("None", "none"):
                out[MEGATRON_ARGS[name]] = value
        elif is_recipe_column(name):
            recipe[name] = value
    if recipe:
        out["recipe_settings"] = recipe
    return out


# the run's shape as the argument block prints it: the measured time belongs to these values, so a
# sidecar or flag saying otherwise describes another run (precision stays overridable: it is muonsim's
# reading of the fp8 arguments, which a user may correct)
LOGGED_LAYOUT_FIELDS = ("tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch_size", "global_batch_size",
                        "seq_length", "num_gpus", "mtp")


def _check_logged_layout(path: Path, logged: Mapping[str, Any], data: Mapping[str, Any]) -> None:
    """Raise UserInputError when the sidecar YAML or a scenario flag sets a layout field (tp, pp, world
    size, ...) to another value than the log's argument block: the prediction would be of a different
    run than the one measured."""
    for name in LOGGED_LAYOUT_FIELDS:
        if name not in logged or name not in data:
            continue
        try:
            said, given = int(str(logged[name])), int(str(data[name]))
        except ValueError:
            continue  # not integers: the run's validation reports the bad value
        if said != given:
            raise UserInputError(f"{_where(path, column=name)}: the log says {said}, the scenario says {given} "
                                 f"(drop {_flag_of(name)} or fix the sidecar YAML: the measured time is of the logged run)")


def sidecar_yaml(path: Path) -> Path | None:
    """The YAML describing a log's scenario: ``run.yaml``/``run.yml`` or ``run.log.yaml``."""
    for candidate in (path.with_suffix(".yaml"), path.with_suffix(".yml"), path.with_name(path.name + ".yaml")):
        if candidate.is_file():
            return candidate
    return None


def runs_fields_from_scenario_keys(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Map CLI scenario keys (``gpus``, ``mtp_layers`` ...) to MeasuredRun fields and recipe settings
    (``cuda_graph_impl`` ... in ``recipe_settings``); reject the rest."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        if value is None:
            continue
        name = SCENARIO_KEY_TO_RUN_FIELD.get(key, key)
        if name not in RUN_FIELDS and key in _COLUMN_OF_KEY:
            out.setdefault("recipe_settings", {})[_COLUMN_OF_KEY[key]] = value
            continue
        if name not in RUN_FIELDS or name in _STRUCTURED:
            valid = ", ".join(sorted(set(RUN_FIELDS) - _STRUCTURED - {"step_time_s"}))
            raise UserInputError(f"setting '{key}' cannot describe a measured run from a log; valid: {valid}")
        out[name] = value
    return out


def load_megatron_log(path: str | Path, overrides: Mapping[str, Any] | None = None,
                      warmup_iterations: int = DEFAULT_WARMUP_ITERATIONS) -> MeasuredRun:
    """One MeasuredRun from a Megatron training log, its argument dump, sidecar YAML and overrides.

    ``overrides`` are MeasuredRun fields or CLI scenario keys (``gpus`` -> ``num_gpus`` ...).
    """
    p = Path(path)
    text = _read_text(p, "training log")
    measured = parse_megatron_log(text, warmup_iterations, source=_where(p))
    data: dict[str, Any] = {"run_id": p.stem, "source": f"megatron log {p.name}"}
    try:
        logged = _log_arguments(text.splitlines())
    except UserInputError as err:
        raise UserInputError(f"{_where(p, column='fp8_recipe')}: {err}") from None
    data.update(logged)
    side = sidecar_yaml(p)
    if side is not None:
        side_data = load_yaml_file(side, "run description")
        for key in side_data:
            if is_recipe_column(key):
                continue
            if key not in RUN_FIELDS or key in _STRUCTURED or key == "step_time_s":
                raise UserInputError(f"{_where(side, column=key)}: not a run field or recipe setting; "
                                     f"valid: {', '.join(f for f in RUN_FIELDS if f not in _STRUCTURED)} "
                                     "and the recipe-settings columns")
        side_recipe = {k: v for k, v in side_data.items() if is_recipe_column(k)}
        data.update({k: v for k, v in side_data.items() if k not in side_recipe})
        if side_recipe:
            data["recipe_settings"] = {**data.get("recipe_settings", {}), **side_recipe}
    data.update(runs_fields_from_scenario_keys(overrides or {}))
    _check_logged_layout(p, logged, data)
    logged_gbs = measured.pop("global_batch_size", None)
    if logged_gbs is not None and "global_batch_size" in data and int(data["global_batch_size"]) != logged_gbs:
        raise UserInputError(f"{_where(p, column='global_batch_size')}: the log says {logged_gbs}, "
                             f"the scenario says {data['global_batch_size']}")
    if logged_gbs is not None:
        data.setdefault("global_batch_size", logged_gbs)
    data.update(measured)
    for name in REQUIRED_COLUMNS:
        if name not in data:
            hint = (f"add '{name}: ...' to {p.with_suffix('.yaml').name} next to the log "
                    f"or pass {_flag_of(name)}")
            raise UserInputError(f"{_where(p, column=name)}: the log does not say {name}; {hint}")
    return _validate_run(data, p, None)


# ----------------------------------------------------------------------------------- dispatch
def load_runs(path: str | Path, overrides: Mapping[str, Any] | None = None,
              warmup_iterations: int = DEFAULT_WARMUP_ITERATIONS) -> list[MeasuredRun]:
    """Read runs from a CSV, JSON or Megatron log file (chosen by suffix); overrides apply to logs only."""
    p = Path(path)
    if p.is_dir():
        raise UserInputError(f"runs file '{p}' is a directory; give a CSV, JSON or Megatron log file "
                             f"(.csv, .json, {', '.join(LOG_SUFFIXES)})")
    suffix = p.suffix.lower()
    if suffix == ".csv":
        return load_csv(p)
    if suffix == ".json":
        return load_json(p)
    if suffix in LOG_SUFFIXES:
        return [load_megatron_log(p, overrides, warmup_iterations)]
    raise UserInputError(f"file '{p}': unknown kind of runs file; use .csv, .json or a Megatron log "
                         f"({', '.join(LOG_SUFFIXES)})")


def load_many(paths: Iterable[str | Path], overrides: Mapping[str, Any] | None = None,
              warmup_iterations: int = DEFAULT_WARMUP_ITERATIONS,
              preloaded: Mapping[str, Sequence[MeasuredRun]] | None = None) -> list[MeasuredRun]:
    """Read and concatenate runs from several files after ``preloaded`` ones (source name -> runs,
    e.g. shipped datasets); run ids must be unique across all of them."""
    sources = [(name, list(runs)) for name, runs in (preloaded or {}).items()]
    sources += [(f"file '{path}'", load_runs(path, overrides, warmup_iterations)) for path in paths]
    runs: list[MeasuredRun] = []
    where: dict[str, str] = {}
    for name, batch in sources:
        if not batch:
            raise UserInputError(f"{name}: holds no runs (a header without rows?)")
        for run in batch:
            if run.run_id in where:
                raise UserInputError(f"{name}, column 'run_id': run '{run.run_id}' is also in {where[run.run_id]}")
            where[run.run_id] = name
            runs.append(run)
    return runs


def write_csv(runs: Iterable[MeasuredRun], path: str | Path) -> None:
    """Write runs as a CSV of the schema's scalar columns and their recipe-settings columns (inverse of
    :func:`load_csv`)."""
    runs = list(runs)
    recipe_columns = [c for c in RECIPE_COLUMNS if any(c in (r.recipe_settings or {}) for r in runs)]
    columns = [f for f in RUN_FIELDS if f not in _STRUCTURED]
    rows = []
    for run in runs:
        data = run.model_dump(mode="json")
        cells = run.recipe_settings or {}
        rows.append(["" if data[c] is None else (int(data[c]) if isinstance(data[c], bool) else data[c]) for c in columns]
                    + [cells.get(c, "") for c in recipe_columns])
    columns = columns + recipe_columns
    with Path(path).open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        writer.writerows(rows)
