"""Sweep points: the grid expanded into resolved scenarios, each with a content key.

A point's *key* is a digest of everything its result depends on: the mode and engine, the whole
scenario configuration, the model and system specifications it resolved to (so an edited model
file is a new point), the calibration profile and release, and for plan points the plan settings
and pins. The journal records results by key, so a rerun skips exactly the points whose inputs
are unchanged, whatever their position in an edited grid. ``RESULT_VERSION`` is part of the key:
bump it when the result columns change.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from costmodel.sweep.grid import (
    GridFile,
    PlanSettings,
    base_config_data,
    check_axis_values,
    grid_combinations,
    normalise_axes,
    read_grid_file,
)
from topologies.inputs import UserInputError

if TYPE_CHECKING:
    from costmodel.calibrate.profile import CalibrationProfile
    from costmodel.planner.pins import Pins
    from workloads.scenario import Scenario, ScenarioConfig

RESULT_VERSION = 2  # 2: mfu_fraction, optimizer_imbalance_ratio, one model column for an inline model


@dataclass(frozen=True)
class SweepContext:
    """What every point's task needs besides the point (installed once per worker)."""

    profile: CalibrationProfile | None
    release: str | None
    plan: PlanSettings


@dataclass(frozen=True)
class SweepPoint:
    """One point of the grid. ``error`` set: the point is invalid and is not run.

    ``scenario`` is the validated scenario of a predict point, or the (unvalidated) base of a plan
    point, whose ``reference_error`` says why its reference scenario is not valid. ``config`` is
    what the row shows: a plan point's base with its own pinned axis values.
    """

    index: int
    mode: str
    engine: str | None  # predict points; None for plan points
    config: ScenarioConfig | None
    key: str
    scenario: Scenario | None = None
    error: str | None = None
    pins: Pins | None = None
    reference_error: str | None = None

    @property
    def runnable(self) -> bool:
        return self.error is None


@dataclass
class Grid:
    """An expanded grid: its points (file order), the context of their tasks and the swept keys."""

    path: Path
    points: list[SweepPoint]
    context: SweepContext
    axes: list[str] = field(default_factory=list)  # swept keys in file order (mode, engine, scenario keys)


def _digest(payload: Any) -> str:
    text = json.dumps(payload, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


class _SpecDigests:
    """Digests of model / system specifications (memoised per object)."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[Any, str]] = {}

    def __call__(self, spec: Any) -> str:
        hit = self._seen.get(id(spec))
        if hit is None or hit[0] is not spec:
            hit = (spec, _digest(spec.model_dump(mode="json")))
            self._seen[id(spec)] = hit
        return hit[1]


def profile_digest(profile: CalibrationProfile | None, release: str | None) -> str:
    """Digest of the calibration a sweep applies (part of every point's key)."""
    return _digest({"profile": None if profile is None else profile.model_dump(mode="json"), "release": release})


def _search_pins(settings: PlanSettings, aliases: dict[str, str], where: str) -> dict[str, Any]:
    """``plan.search`` as raw pins (value lists as comma strings), checked once."""
    from costmodel.planner.pins import parse_pins

    raw = {k: ",".join(map(str, v)) for k, v in normalise_axes(settings.search, aliases, f"{where}.search").items()}
    try:
        parse_pins(raw, settings.bounds)
    except UserInputError as err:
        raise UserInputError(f"{where}: {err}") from None
    return raw


def expand_grid(path: Path, aliases: dict[str, str] | None = None, profile: CalibrationProfile | None = None,
                release: str | None = None, grid_file: GridFile | None = None) -> Grid:
    """Read, validate and expand a grid file into points (UserInputError on a bad file)."""
    aliases = dict(aliases or {})
    grid_file = grid_file or read_grid_file(path)
    where = f"grid file '{path}'"
    base_data = base_config_data(grid_file, path)
    mappings = grid_file.grid if isinstance(grid_file.grid, list) else [grid_file.grid]
    axes_list = []
    for i, mapping in enumerate(mappings):
        label = f"{where}: grid" + (f"[{i}]" if isinstance(grid_file.grid, list) else "")
        axes = normalise_axes(mapping, aliases, label)
        check_axis_values(axes, base_data, label)
        axes_list.append(axes)
    search = _search_pins(grid_file.plan, aliases, f"{where}: plan")
    context = SweepContext(profile=profile, release=release, plan=grid_file.plan)
    expander = _Expander(base_data, context, search, profile_digest(profile, release))
    points = [expander.point(i, settings) for i, settings in enumerate(grid_combinations(axes_list))]
    # a union of products: a point two mappings share (the same key: the same inputs) is one point, one row
    unique: dict[str, SweepPoint] = {}
    for point in points:
        unique.setdefault(point.key, point)
    if len(unique) < len(points):
        points = [replace(point, index=i) for i, point in enumerate(unique.values())]
    swept = list(dict.fromkeys(k for mapping in axes_list for k in mapping))
    return Grid(path=path, points=points, context=context, axes=swept)


class _Expander:
    def __init__(self, base_data: dict[str, Any], context: SweepContext, search: dict[str, Any],
                 calibration_digest: str) -> None:
        self.base_data = base_data
        self.context = context
        self.search = search
        self.calibration_digest = calibration_digest
        self.spec_digest = _SpecDigests()
        self.plan_payload = context.plan.model_dump(mode="json", exclude={"search"})

    def point(self, index: int, settings: dict[str, Any]) -> SweepPoint:
        settings = dict(settings)
        mode = settings.pop("mode", "predict")
        engine = settings.pop("engine", "analytic")
        if mode == "plan":
            return self._plan_point(index, settings)
        return self._predict_point(index, engine, settings)

    def _key(self, mode: str, engine: str | None, config: ScenarioConfig | None, scenario: Scenario | None,
             extra: Any = None, settings: dict[str, Any] | None = None) -> str:
        payload: dict[str, Any] = {"version": RESULT_VERSION, "mode": mode, "engine": engine,
                                   "calibration": self.calibration_digest, "extra": extra}
        payload["config"] = config.model_dump(mode="json") if config is not None else settings
        if scenario is not None:
            payload["model"] = self.spec_digest(scenario.model)
            payload["system"] = self.spec_digest(scenario.system)
        return _digest(payload)

    def _predict_point(self, index: int, engine: str, settings: dict[str, Any]) -> SweepPoint:
        from workloads.scenario_defaults import layered_config, resolve_layered

        config = None
        try:
            layered = layered_config(self.base_data, settings)
            config = layered.config
            scenario = resolve_layered(layered)
        except UserInputError as err:
            key = self._key("predict", engine, config, None, settings=settings)
            return SweepPoint(index, "predict", engine, config, key, error=str(err))
        return SweepPoint(index, "predict", engine, config, self._key("predict", engine, config, scenario), scenario)

    def _plan_point(self, index: int, settings: dict[str, Any]) -> SweepPoint:
        from costmodel.planner.base import plan_base, split_pins
        from costmodel.planner.pins import parse_pins
        from workloads.scenario import build_config
        from workloads.scenario_defaults import layered_config

        axis_pins, rest = split_pins(settings)
        raw = dict(self.search) | {k: str(v) for k, v in axis_pins.items()}
        config = None
        try:
            config = layered_config(self.base_data, rest).config
            pins = parse_pins(raw, self.context.plan.bounds)
            base, reference_error = plan_base(config, raw)
        except UserInputError as err:
            key = self._key("plan", None, config, None, extra=raw, settings=settings)
            return SweepPoint(index, "plan", None, config, key, error=str(err))
        extra = {"plan": self.plan_payload, "pins": pins.describe()}
        key = self._key("plan", None, base.config, base, extra=extra)
        try:  # the row shows the point's own settings, even when they do not make a valid reference
            shown = build_config(base.config.model_dump(), axis_pins)
        except UserInputError:
            shown = base.config
        return SweepPoint(index, "plan", None, shown, key, base, pins=pins, reference_error=reference_error)
