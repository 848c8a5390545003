"""Recipe settings of measured runs: value conventions, resolution into scenario settings, lookup by release.

A run's recipe settings are the cells of the columns of :data:`workloads.recipe_columns.COLUMNS`
(the Megatron-Bridge recipe-settings file's names): the shipped ``megatron-bridge`` dataset joins
``workloads/data/measured/megatron_bridge_recipe_settings.csv`` (a byte-identical copy of
``../shared/data/measured``; every value was resolved by executing each release's own recipe code)
on ``run_id``; a user's CSV, JSON, log sidecar YAML or Megatron argument dump may carry the same
columns. Resolution of one cell (:func:`resolve_cell`):

============================== ===============================================================
cell                           meaning
============================== ===============================================================
``v`` (a value)                the recipe set ``v``
``default(v; class)``          the recipe left Megatron's (or Megatron-Bridge's) default, ``v``:
                               read as ``v``
``None``                       the field is None: each column says what that means (e.g. no
                               recompute, TE's TP-overlap defaults, the attention backend auto)
``n/a(field absent ...)``      the field does not exist at that release: muonsim's default
                               (the feature off), except where a legacy column says otherwise
``unknown``                    could not be resolved: muonsim's default, reported as such
``unset`` (env_* columns)      the scripts do not set the variable: its documented default
lists ``a|b``, ``[]``          a list, the empty list
============================== ===============================================================

Then two legacy switches are folded in: ``enable_cuda_graph`` true with ``cuda_graph_impl`` none
or absent means ``local``; ``moe_enable_deepep`` true means dispatcher ``flex`` with backend
``deepep``. ``use_megatron_fsdp`` true means ``fsdp = dp·cp`` unless the run has its own ``fsdp``.
The run's own columns (parallel sizes, batch, ``mtp``, ``fsdp``, ``precision``, ``optimizer``) win
over the settings (:data:`workloads.recipe_columns.RUN_COLUMNS`).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from workloads.recipe_columns import COLUMNS, RUN_COLUMNS, SKIP, Column, PartialLayout, Unreadable

MEASURED_DIR = Path(__file__).parent / "data" / "measured"
SETTINGS_FILE = MEASURED_DIR / "megatron_bridge_recipe_settings.csv"
SUMMARY_FILE = MEASURED_DIR / "megatron_bridge_perf_summary.csv"
_DEFAULT = re.compile(r"^default\((.*);([^;]*)\)$", re.DOTALL)


@dataclass(frozen=True)
class SettingSource:
    """Where one scenario setting came from: the column, its cell text and how it was read."""

    key: str
    value: Any
    column: str
    cell: str
    how: str  # 'recipe' | 'default (class)' | 'None' | 'unset' | 'n/a: muonsim default' | 'unknown: muonsim default' | rule

    def to_json_dict(self) -> dict[str, Any]:
        """Plain dict (value as JSON-friendly text for tuples/models)."""
        value = self.value
        if isinstance(value, tuple):
            value = [v.model_dump() if hasattr(v, "model_dump") else v for v in value]
        return {"key": self.key, "value": value, "column": self.column, "cell": self.cell, "how": self.how}


@dataclass(frozen=True)
class RecipeResolution:
    """Scenario overrides from a run's recipe cells, and the source of each (also of unresolved ones)."""

    overrides: dict[str, Any]
    sources: tuple[SettingSource, ...]
    use_megatron_fsdp: bool | None = None
    unresolved: tuple[str, ...] = field(default=())  # columns that were 'unknown' / 'n/a' (muonsim default used)


def normalise_cell(value: Any) -> str:
    """A cell as text: booleans true/false, Python reprs (True, None, ['a', 'b']) as the file writes them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "|".join(str(v) for v in value) if value else "[]"
    text = str(value).strip()
    if text in ("True", "False"):
        return text.lower()
    if text.startswith("[") and text.endswith("]") and "'" in text and "[[" not in text:
        return "|".join(p.strip().strip("'\"") for p in text[1:-1].split(",") if p.strip()) or "[]"
    return text


def resolve_cell(column: str, cell: str) -> tuple[Any, str]:
    """(scenario value or SKIP, how it was read) of one cell; ValueError names what would be valid."""
    spec: Column | None = COLUMNS.get(column)
    if spec is None:
        raise ValueError(f"unknown recipe-settings column '{column}'")
    text = cell.strip()
    if text == "" or text == "unknown" or text.startswith("unknown:"):
        return SKIP, "unknown: muonsim default"
    if text.startswith("n/a("):
        return SKIP, "n/a at this release: muonsim default"
    how = "recipe"
    m = _DEFAULT.match(text)
    if m:
        text, how = m.group(1).strip(), f"default ({m.group(2).strip()})"
    if text == "unset":
        if spec.unset is None:
            return SKIP, "unset: muonsim default"
        text, how = spec.unset, "unset: the variable's default"
    try:
        value = spec.parse(None if text == "None" else text)
    except Unreadable as err:
        return SKIP, f"unknown ({err}): muonsim default"
    if isinstance(value, PartialLayout):
        return value, "truncated cell: reconstructed (the visible stages' width repeats; the last stage takes the rest)"
    return value, ("None" if text == "None" and how == "recipe" else how)


def resolve_recipe_cells(cells: Mapping[str, str]) -> RecipeResolution:
    """Scenario overrides (flat keys) of a run's recipe cells, with the source of every setting.

    Raises ValueError('column: problem') on the first invalid cell.
    """
    overrides: dict[str, Any] = {}
    sources: list[SettingSource] = []
    unresolved: list[str] = []
    flags: dict[str, Any] = {}
    for column, cell in cells.items():
        spec = COLUMNS.get(column)
        if spec is None:
            raise ValueError(f"{column}: not a recipe-settings column")
        try:
            value, how = resolve_cell(column, cell)
        except ValueError as err:
            raise ValueError(f"{column}: {err}") from None
        if how.startswith(("unknown", "n/a")):
            unresolved.append(column)
        if column in ("enable_cuda_graph", "moe_enable_deepep") and value is not SKIP:
            flags[column] = value
        if spec.key is None or value is SKIP:
            continue
        if spec.key == "use_megatron_fsdp":
            flags["use_megatron_fsdp"] = value
            continue
        overrides[spec.key] = value
        sources.append(SettingSource(spec.key, value, column, cell, how))
    if flags.get("enable_cuda_graph") and overrides.get("cuda_graph_impl", "none") == "none":
        overrides["cuda_graph_impl"] = "local"
        sources.append(SettingSource("cuda_graph_impl", "local", "enable_cuda_graph", cells["enable_cuda_graph"],
                                     "legacy switch: local CUDA graphs"))
    if flags.get("moe_enable_deepep"):
        overrides |= {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "deepep"}
        sources.append(SettingSource("moe_token_dispatcher_type", "flex", "moe_enable_deepep",
                                     cells["moe_enable_deepep"], "legacy switch: flex dispatcher with DeepEP"))
    return RecipeResolution(overrides, tuple(sources), flags.get("use_megatron_fsdp"), tuple(unresolved))


RECONSTRUCTED_MARKS = ("reconstruction", "PARALLELISM_MISMATCH", "unresolved")


def settings_reconstructed(cells: Mapping[str, str] | None) -> bool:
    """Whether a run's recipe settings are a reconstruction, not a stored release configuration:
    the settings file's ``match_status`` says no stored config matched the table (reconstructed with
    CLI overrides), the parallelism still mismatches, or nothing resolved (its caveats section)."""
    status = (cells or {}).get("match_status", "")
    return any(mark in status for mark in RECONSTRUCTED_MARKS)


def recipe_columns_of(data: Mapping[str, Any]) -> dict[str, str]:
    """The recipe-settings cells among ``data``'s keys (as text), leaving out the run's own columns."""
    return {k: normalise_cell(v) for k, v in data.items()
            if k in COLUMNS and k not in RUN_COLUMNS and v is not None and normalise_cell(v) != ""}


# ------------------------------------------------------------------ the shipped settings file
@cache
def shipped_settings() -> dict[str, dict[str, str]]:
    """run_id -> recipe cells of the shipped settings file (the run's own columns left out)."""
    with SETTINGS_FILE.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    return {row["run_id"]: {k: v for k, v in row.items() if k not in RUN_COLUMNS} for row in rows}


@cache
def _summary_rows() -> tuple[dict[str, str], ...]:
    with SUMMARY_FILE.open(newline="", encoding="utf-8") as fh:
        return tuple(csv.DictReader(fh))


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in release.split("."))


@dataclass(frozen=True)
class RecipeChoice:
    """The published run whose recipe settings a prediction uses, and why that one."""

    run_id: str
    release: str
    cells: dict[str, str]
    reason: str

    @property
    def source(self) -> str:
        """One line: which run of which file, at which Megatron-Bridge ref."""
        ref = self.cells.get("source_ref", "")
        return (f"{SETTINGS_FILE.name}: run {self.run_id} (release {self.release}"
                f"{', ' + ref if ref else ''}); {self.reason}")


# the recipe run's layout as (summary column, CLI flag): what --release does not apply (the layout comes
# from the model x system defaults or the user) but a user may want to reproduce the run
RUN_LAYOUT_FLAGS = (("num_gpus", "--gpus"), ("precision", "--precision"), ("tp", "--tp"), ("pp", "--pp"),
                    ("vpp", "--vpp"), ("cp", "--cp"), ("ep", "--ep"), ("etp", "--etp"), ("fsdp", "--fsdp"),
                    ("micro_batch_size", "--mbs"), ("global_batch_size", "--gbs"), ("seq_length", "--seq"))


def run_layout(run_id: str) -> dict[str, str]:
    """The published run's layout (summary columns of :data:`RUN_LAYOUT_FLAGS`, as text); empty for an
    unknown run."""
    run = next((r for r in _summary_rows() if r["run_id"] == run_id), None)
    return {} if run is None else {col: run[col] for col, _ in RUN_LAYOUT_FLAGS}


def run_layout_json(run_id: str) -> dict[str, Any]:
    """The published run's layout under the scenario's keys (``gpus``, ``tp`` ... ``seq_length``), sizes as
    integers: what ``--json`` shows (the summary file's ``num_gpus`` column is the scenario's ``gpus``)."""
    return {("gpus" if col == "num_gpus" else col): (int(v) if v.isdigit() else v)
            for col, v in run_layout(run_id).items()}


def scenario_layout(scenario: Any) -> dict[str, str]:
    """``scenario``'s layout in the summary columns of :data:`RUN_LAYOUT_FLAGS` (as text)."""
    p = scenario.par
    return {"num_gpus": str(scenario.gpus), "precision": scenario.precision.value, "tp": str(p.tp),
            "pp": str(p.pp), "vpp": str(p.vpp), "cp": str(p.cp), "ep": str(p.ep), "etp": str(p.expert_tp),
            "fsdp": str(p.fsdp), "micro_batch_size": str(p.micro_batch_size),
            "global_batch_size": str(p.global_batch_size), "seq_length": str(p.seq_length)}


def layout_mismatch_flags(run_id: str, scenario: Any) -> str:
    """The flags that would give ``scenario`` the layout of published run ``run_id`` (e.g. ``--pp 2
    --vpp 24 --mbs 2``); empty when the layouts are equal or the run is unknown."""
    run, ours = run_layout(run_id), scenario_layout(scenario)
    return " ".join(f"{flag} {run[col]}" for col, flag in RUN_LAYOUT_FLAGS if run and run[col] != ours[col])


@cache
def published_names(model: str) -> frozenset[str]:
    """The published model names whose runs describe catalogue ``model``: its own name, and any model
    of the same architecture up to its MTP layers (``deepseek-v3-mtp`` runs as ``deepseek-v3``, the
    recipe deciding the MTP layers); just ``model`` when it is not in the catalogue."""
    from topologies.inputs import UserInputError
    from workloads.models import load_model

    try:
        target = load_model(model).model_dump(exclude={"name", "display_name", "mtp_layers"})
    except UserInputError:  # an unknown name: only its own runs
        return frozenset({model})
    names = {model}
    for published in {r["model"] for r in _summary_rows()}:
        try:
            arch = load_model(published).model_dump(exclude={"name", "display_name", "mtp_layers"})
        except UserInputError:  # a published model outside the catalogue
            continue
        if arch == target:
            names.add(published)
    return frozenset(names)


def recipe_for(model: str, system: str, release: str | None = None, gpus: int | None = None,
               precision: str | None = None) -> RecipeChoice | None:
    """The published recipe settings for ``model`` on ``system``: release ``release`` (exact, else its
    family ``26.04`` of ``26.04.01``) when the file has a run of it, otherwise the newest release's;
    among a release's runs the one with the same precision, then the same GPU count. Runs of the same
    architecture up to the MTP layers count (:func:`published_names`). None when the file has no run of
    the model on the system."""
    names = published_names(model)
    rows = [r for r in _summary_rows() if r["model"] in names and r["system"] == system]
    if not rows:
        return None
    family = ".".join((release or "").split(".")[:2])
    exact = [r for r in rows if r["release"] == release]
    same_family = [r for r in rows if ".".join(r["release"].split(".")[:2]) == family]
    if release and (exact or same_family):
        pool, reason = exact or same_family, f"release {release} as asked"
    else:
        newest = max((r["release"] for r in rows), key=_release_key)
        pool = [r for r in rows if r["release"] == newest]
        reason = (f"no {model} run on {system} in release {release}; newest release {newest}" if release
                  else f"newest release with a {model} run on {system}")

    def rank(r: dict[str, str]) -> tuple[int, int, tuple[int, ...], int]:
        return (r["precision"] != precision if precision else 0, r["num_gpus"] != str(gpus) if gpus else 0,
                tuple(-k for k in _release_key(r["release"])), -int(r["num_gpus"]))

    best = min(pool, key=rank)
    cells = shipped_settings().get(best["run_id"])
    if cells is None:
        return None
    return RecipeChoice(best["run_id"], best["release"], cells, reason)


# keys whose recipe value only applies to the recipe run's own pipeline sizes
LAYOUT_KEYS = ("pipeline_model_parallel_layout", "account_for_embedding_in_pipeline_split",
               "account_for_loss_in_pipeline_split")


# Megatron-FSDP settings: a recipe without Megatron-FSDP carries Megatron-Bridge's config defaults for them
FSDP_KEYS = ("data_parallel_sharding_strategy", "fsdp_double_buffer", "nccl_ub", "suggested_communication_unit_size",
             "keep_fp8_transpose_cache")


def layout_bound_skip(key: str, value: Any, recipe_pp_vpp: tuple[int, int], sizes: dict[str, int],
                      recipe_fsdp: bool = True, recipe_tp: int | None = None) -> str | None:
    """Why a recipe setting made for a layout of ``recipe_pp_vpp`` (pp, vpp) and ``recipe_tp`` does
    not apply to a scenario of ``sizes`` (pp, vpp, ep, fsdp, tp), or None when it does: the pipeline
    layout keys need the recipe's pp and vpp; EP overlap (and delayed wgrad) need ep > 1 and, with
    pp > 1, interleaving (Megatron asserts it); the Megatron-FSDP settings of a recipe that did not
    use Megatron-FSDP (``recipe_fsdp`` False: Megatron-Bridge's unused config defaults, e.g.
    ``no_shard``) do not configure a scenario that does; sequence parallelism off in a recipe without
    tensor parallelism (tp 1, where it is moot: the Bridge recipes turn it on with tp > 1) says nothing
    about a scenario with tp > 1, which gets the default (on). One rule for ``--release``, the
    model × system defaults and the planner's candidates."""
    pp, vpp = sizes.get("pp", 1), sizes.get("vpp", 1)
    if key == "sequence_parallel" and value is False and recipe_tp == 1 and sizes.get("tp", 1) > 1:
        return "the recipe run has tp 1, where sequence parallelism is moot"
    if key in LAYOUT_KEYS and (pp, vpp) != recipe_pp_vpp:
        return f"the recipe run has pp {recipe_pp_vpp[0]} vpp {recipe_pp_vpp[1]}"
    if key in FSDP_KEYS and not recipe_fsdp and sizes.get("fsdp", 0) > 0:
        return "the recipe run does not use Megatron-FSDP"
    if key in ("ep_comm_overlap", "delay_wgrad_compute") and value and (sizes.get("ep", 1) == 1 or (pp > 1 and vpp == 1)):
        return "needs ep > 1 and, with pp > 1, vpp > 1"
    return None


@dataclass(frozen=True)
class ReleaseSettings:
    """Recipe settings a prediction took from a published run (``--release``), and what it left."""

    choice: RecipeChoice
    applied: dict[str, Any]  # scenario key -> value taken from the recipe
    kept: tuple[str, ...]  # keys the user set (their value wins)
    skipped: dict[str, str]  # key -> why the recipe's value was not applied

    def to_json_dict(self) -> dict[str, Any]:
        """Plain dict for ``--json``: source, applied settings (JSON-friendly), kept and skipped keys, and
        the recipe run's layout (:func:`run_layout`; ``--release`` does not apply it)."""
        def plain(v: Any) -> Any:
            if isinstance(v, tuple):
                return [x.model_dump() if hasattr(x, "model_dump") else x for x in v]
            return v

        return {"source": self.choice.source, "run_id": self.choice.run_id, "release": self.choice.release,
                "applied": {k: plain(v) for k, v in self.applied.items()}, "kept_from_user": list(self.kept),
                "skipped": self.skipped, "run_layout": run_layout_json(self.choice.run_id)}


def _completed(layout: PartialLayout, sizes: dict[str, int]) -> str | None:
    """``layout`` completed for the scenario's model (None without its layer counts, or when it cannot be)."""
    if "num_layers" not in sizes:
        return None
    return layout.complete(sizes["num_layers"], sizes.get("pp", 1) * sizes.get("vpp", 1), sizes.get("mtp_layers", 0))


def release_settings(choice: RecipeChoice, user_keys: set[str], sizes: dict[str, int]) -> ReleaseSettings:
    """The recipe overrides of ``choice`` a scenario takes: not the keys the user set (``user_keys``);
    the pipeline layout keys only when the scenario's pp and vpp are the recipe run's; EP overlap only
    when the scenario has EP and (with pp > 1) interleaving, as Megatron requires. A pipeline layout
    cut short in the settings file (:class:`PartialLayout`) is completed for the scenario's model
    (``sizes['num_layers']`` and ``sizes['mtp_layers']``, as :meth:`MeasuredRun.scenario_overrides`
    does for the run's own model), or skipped when it cannot be. The recipe's MTP layers are applied
    only when they differ from the model's."""
    resolution = resolve_recipe_cells(choice.cells)
    run = next((r for r in _summary_rows() if r["run_id"] == choice.run_id), {})
    applied: dict[str, Any] = {}
    kept: list[str] = []
    skipped: dict[str, str] = {}
    model_mtp_layers = sizes.get("mtp_layers")
    if "mtp_layers" in resolution.overrides and "mtp_layers" not in user_keys:  # the layout places the recipe's MTP
        sizes = {**sizes, "mtp_layers": resolution.overrides["mtp_layers"]}
    recipe_pp_vpp = (int(run.get("pp") or 0), int(run.get("vpp") or 0))
    recipe_tp = int(run.get("tp") or 0) or None
    for key, value in resolution.overrides.items():
        if key in user_keys:
            kept.append(key)
        elif key == "mtp_layers" and value == model_mtp_layers:
            continue  # the model already has the recipe's MTP layers: nothing to apply
        elif (why := layout_bound_skip(key, value, recipe_pp_vpp, sizes, bool(resolution.use_megatron_fsdp),
                                       recipe_tp)) is not None:
            skipped[key] = why
        elif isinstance(value, PartialLayout) and (full := _completed(value, sizes)) is None:
            skipped[key] = "cut short in the settings file and cannot be completed for this model"
        elif isinstance(value, PartialLayout):
            applied[key] = full
        else:
            applied[key] = value
    return ReleaseSettings(choice, applied, tuple(sorted(kept)), skipped)
