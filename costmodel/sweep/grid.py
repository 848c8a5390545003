"""The sweep's grid file (pydantic) and its expansion into points.

A grid file lists, per scenario setting, one value or a list of values; every combination is a
point (a list of such mappings sweeps the union of their products). Keys are scenario keys as in
``workloads.scenario.apply_overrides`` (``model``, ``gpus``, ``tp``, ``micro_batch_size``,
``optimizer``, ``tp_mode``, ...; the CLI's flag names such as ``mbs`` or ``tp-mode`` are accepted
through ``aliases``) plus ``mode`` (``predict`` or ``plan``) and ``engine`` (``analytic`` or
``des``, predict points). Example::

    base: scenario.yaml           # or an inline scenario mapping; default: the built-in scenario
    grid:
      model: [llama3-8b, llama3-70b]
      gpus: [64, 128, 256]
      optimizer: [adamw, muon]
      mode: [predict, plan]
    plan: {top_k: 0, search: {pp: [1, 2, 4]}, bounds: {max_tp: 8}}
    calibration: none             # a profile YAML, 'none', or absent: the built-in profile

The file's structure is checked with pydantic, and every axis value on its own against the
scenario schema (an unknown model, a negative size): both are one-line :class:`UserInputError`
naming the key. Rules that involve several settings (sizes that do not divide, ...) make *points*
invalid; they are recorded with their one-line reason, not raised. Plan points treat the searched
settings among their axes (tp, pp, ..., optimizer choices) as pins, as ``muonsim plan`` does with
flags; ``plan.search`` adds pins (value lists) to every plan point, an axis value wins over it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator

from topologies.inputs import (
    NoBoolNumbers,
    UserInputError,
    describe_validation_error,
    did_you_mean,
    first_repeat,
    load_yaml_file,
    unknown_name_hint,
)

Mode = Literal["predict", "plan"]
MODES: tuple[str, ...] = ("predict", "plan")
ENGINES: tuple[str, ...] = ("analytic", "des")
MAX_POINTS = 1_000_000
SHAPE = "a value or a non-empty list of values"


def _check_axes(value: Any, what: str) -> Any:
    """A mapping of setting -> a scalar or a non-empty list of scalars (ValueError naming the key)."""
    if not isinstance(value, dict):
        raise ValueError(f"must be a mapping of {what} to {SHAPE}")
    for key, values in value.items():
        items = values if isinstance(values, list) else [values]
        if not items:
            raise ValueError(f"{key}: an empty list (give {SHAPE})")
        for item in items:
            if item is None or isinstance(item, dict | list):
                raise ValueError(f"{key}: {item!r} is not a value (give {SHAPE})")
    return value


class _Strict(NoBoolNumbers):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlanSettings(_Strict):
    """How plan points search (the options of ``muonsim plan``)."""

    memory_headroom: float = Field(0.1, ge=0, lt=1, description="fraction of HBM kept free")
    top_k: int = Field(5, ge=0, description="best plans re-ranked with the discrete-event engine (0 = none)")
    exhaustive: bool = Field(False, description="evaluate every candidate (no pruning)")
    search: dict[str, Any] = Field(default_factory=dict, description="pins: searched setting -> allowed values")
    bounds: dict[str, int] = Field(default_factory=dict, description="min_tp, max_tp, ... min_mbs, max_mbs")

    @field_validator("search", mode="before")
    @classmethod
    def _search_shape(cls, value: Any) -> Any:
        return _check_axes(value, "searched settings")


class GridFile(_Strict):
    """The grid file (YAML)."""

    base: str | dict[str, Any] | None = Field(None, description="scenario file (relative to the grid file) or mapping")
    grid: dict[str, Any] | list[dict[str, Any]] = Field(description="setting -> values; a list: the union of products")
    calibration: str | None = Field(None, description="calibration profile YAML or 'none'; absent: the built-in profile")
    release: str | None = Field(None, description="software release whose fitted factors to use")
    plan: PlanSettings = PlanSettings()

    @field_validator("grid", mode="before")
    @classmethod
    def _grid_shape(cls, value: Any) -> Any:
        if isinstance(value, list):
            if not value:
                raise ValueError("an empty list (give a mapping of settings to values, or a list of them)")
            for k, item in enumerate(value):
                try:
                    _check_axes(item, "settings")
                except ValueError as err:
                    raise ValueError(f"[{k}]: {err}") from None
            return value
        return _check_axes(value, "settings")


def read_grid_file(path: Path) -> GridFile:
    """Parse and validate a grid file (one-line UserInputError naming the field)."""
    data = load_yaml_file(path, "grid file")
    try:
        return GridFile.model_validate(data)
    except ValidationError as err:
        raise UserInputError(describe_validation_error(err, f"grid file '{path}'", GridFile)) from None


def normalise_axes(axes: Mapping[str, Any], aliases: Mapping[str, str], where: str) -> dict[str, list[Any]]:
    """Axis key (alias or dashed name -> scenario key) -> list of values; repeated keys are an error."""
    out: dict[str, list[Any]] = {}
    for raw, values in axes.items():
        name = raw.replace("-", "_")
        key = aliases.get(name, name)
        if key in out:
            raise UserInputError(f"{where}.{raw}: '{key}' is given twice")
        out[key] = list(values) if isinstance(values, list) else [values]
        repeated = first_repeat(out[key])  # [8, 8]: the same point twice
        if repeated is not None:
            raise UserInputError(f"{where}.{raw}: gives {repeated!r} twice; give each value once")
    return out


def check_axis_values(axes: dict[str, list[Any]], base_data: dict[str, Any], where: str) -> None:
    """Each axis value on its own must make a valid scenario configuration (and a known model/system)."""
    from topologies.hardware import load_system
    from workloads.models import resolve_model
    from workloads.scenario import build_config, scenario_keys

    for key, values in axes.items():
        for value in values:
            if key == "mode":
                if value not in MODES:
                    raise UserInputError(f"{where}.mode: '{value}' is not one of {', '.join(MODES)}"
                                         f"{_guess(value, MODES)}")
                continue
            if key == "engine":
                if value not in ENGINES:
                    raise UserInputError(f"{where}.engine: '{value}' is not one of {', '.join(ENGINES)}"
                                         f"{_guess(value, ENGINES)}")
                continue
            try:
                config = build_config(base_data, {key: value}, source=f"{where}.{key} = {value!r}")
            except UserInputError as err:
                message = str(err)
                if message.startswith("unknown scenario setting"):
                    hint = unknown_name_hint(key, ["mode", "engine", *scenario_keys()], max_listed=0)
                    message = f"{where}.{key}: unknown setting" + (hint or (
                        " (valid: mode, engine and the scenario keys of a scenario file's sections or the flags of "
                        "muonsim predict)"))
                raise UserInputError(message) from None
            try:
                if key == "model":
                    resolve_model(config.model)
                elif key == "system":
                    load_system(config.system)
            except UserInputError as err:
                raise UserInputError(f"{where}.{key} = {value!r}: {err}") from None


def _guess(value: Any, valid: tuple[str, ...]) -> str:
    """``; did you mean 'plan'?`` when ``value`` is a misspelling of one of ``valid``, else nothing."""
    guess = did_you_mean(str(value), valid)
    return f"; did you mean '{guess}'?" if guess else ""


def grid_combinations(axes_list: list[dict[str, list[Any]]]) -> list[dict[str, Any]]:
    """Every combination of every axes mapping, in file order (the last key varies fastest)."""
    total = 0
    for axes in axes_list:
        count = 1
        for values in axes.values():
            count *= len(values)
        total += count
    if total > MAX_POINTS:
        raise UserInputError(f"grid: {total:,} points exceed the limit of {MAX_POINTS:,}; split the sweep")
    out: list[dict[str, Any]] = []
    for axes in axes_list:
        keys = list(axes)
        for combo in itertools.product(*(axes[k] for k in keys)):
            out.append(dict(zip(keys, combo, strict=True)))
    return out


def base_config_data(grid: GridFile, grid_path: Path) -> dict[str, Any]:
    """The base scenario mapping as the user wrote it: the grid's ``base`` (file or inline), else empty.

    Only what the base sets is kept: every point inherits the defaults of its own model on its own
    system (:func:`workloads.scenario_defaults.layered_config`) for the rest, as ``predict`` does.
    """
    from workloads.scenario import build_config, read_scenario_file

    if grid.base is None:
        return {}
    if isinstance(grid.base, str):
        path = Path(grid.base)
        if not path.is_absolute() and not path.is_file() and (grid_path.parent / path).is_file():
            path = grid_path.parent / path
        data = read_scenario_file(path)
        build_config(data, {}, source=f"scenario file '{path}'")  # one-line error for a bad base file
        return data
    build_config(grid.base, {}, source=f"grid file '{grid_path}': base")
    return dict(grid.base)
