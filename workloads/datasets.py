"""Shipped datasets of measured runs, available by name (``muonsim validate --dataset NAME``).

The project ships its own copies (it must work without ``../shared``). ``megatron-bridge`` is the
published Megatron-Bridge performance summary (releases 25.09-26.08; GB300/GB200 NVL72, DGX
B300/B200/H100; AdamW on the element-wise distributed optimizer; forced-balanced MoE routing),
joined on ``run_id`` with the recipe settings each run used
(``megatron_bridge_recipe_settings.csv``, resolved by executing each release's own recipe code;
its ``.md`` beside it gives release → git ref, column meanings and value conventions). Both files
are byte-identical copies of ``../shared/data/measured``; the join happens on load.
``megatron-ci`` is the Megatron-LM functional-test timings (small models on 8 × H100, 8 × GB200,
8 × A100; :mod:`workloads.megatron_ci`), the rows used for fitting and validation;
``megatron-ci-all`` every row the model can express. Rows a dataset does not predict are listed
as :class:`SkippedRun` s with their reason (:func:`load_dataset_rows`).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from topologies.inputs import UserInputError, guess_hint
from workloads.loaders import load_runs
from workloads.measured import MeasuredRun, SkippedRun
from workloads.recipe_settings import MEASURED_DIR, SETTINGS_FILE, shipped_settings


@dataclass(frozen=True)
class Dataset:
    """A named file of measured runs shipped with muonsim."""

    name: str
    path: Path
    description: str
    recipe_settings: Path | None = None  # CSV of the recipe settings of every run, joined on run_id
    loader: str = "runs"  # "runs": a CSV of the MeasuredRun schema; "megatron-ci": workloads.megatron_ci
    select: bool = True  # megatron-ci: keep only the rows used for fitting and validation
    fit_exclusions: Path | None = None  # CSV run_id,reason: runs predicted and scored but not fitted on


DATASETS: dict[str, Dataset] = {
    "megatron-bridge": Dataset(
        "megatron-bridge", MEASURED_DIR / "megatron_bridge_perf_summary.csv",
        "Megatron-Bridge published pre-training throughput, releases 25.09-26.08, five systems, "
        "with the recipe settings of every run", SETTINGS_FILE,
        fit_exclusions=MEASURED_DIR / "megatron_bridge_fit_exclusions.csv"),
    "megatron-ci": Dataset(
        "megatron-ci", MEASURED_DIR / "megatron_ci_runs.csv",
        "Megatron-LM CI timings (8 x H100 / GB200 / A100), the rows used for fitting and validation",
        loader="megatron-ci"),
    "megatron-ci-all": Dataset(
        "megatron-ci-all", MEASURED_DIR / "megatron_ci_runs.csv",
        "Megatron-LM CI timings, every row the model can express (copies, 4-GPU GB200, noisy runs included)",
        loader="megatron-ci", select=False),
}


def dataset_names() -> list[str]:
    """Names of the shipped datasets."""
    return sorted(DATASETS)


def get_dataset(name: str) -> Dataset:
    """The shipped dataset called ``name`` (one-line UserInputError listing the known names)."""
    if name not in DATASETS:
        raise UserInputError(f"unknown dataset '{name}'{guess_hint(name, DATASETS)}; known: {', '.join(dataset_names())}")
    return DATASETS[name]


def with_recipe_settings(run: MeasuredRun, cells: dict[str, str]) -> MeasuredRun:
    """``run`` with the recipe-settings ``cells`` joined in (what the run already carries wins).

    Columns that are typed fields of the run (``tp_comm_overlap``, ``overlap_param_gather``,
    ``muon_tp_mode``) fill those fields; the others go to ``recipe_settings``."""
    data = run.model_dump(exclude_unset=True)
    typed = {k: v for k, v in cells.items() if k in MeasuredRun.model_fields and k not in data}
    recipe = {k: v for k, v in cells.items() if k not in MeasuredRun.model_fields}
    data |= typed | {"recipe_settings": {**recipe, **(run.recipe_settings or {})}}
    return MeasuredRun.model_validate(data)


def load_dataset_rows(name: str) -> tuple[list[MeasuredRun], list[SkippedRun]]:
    """The runs of the shipped dataset ``name`` (joined with its recipe settings on ``run_id``) and
    the rows it skips, with why. Raises UserInputError if a run has no settings row (the shipped
    files cover every run)."""
    dataset = get_dataset(name)
    if dataset.loader == "megatron-ci":
        from workloads.megatron_ci import load_megatron_ci

        return load_megatron_ci(dataset.path, select=dataset.select)
    runs = load_runs(dataset.path)
    if dataset.recipe_settings is None:
        return runs, []
    settings = shipped_settings()
    missing = [r.run_id for r in runs if r.run_id not in settings]
    if missing:
        raise UserInputError(f"dataset '{name}': no recipe settings for run '{missing[0]}' in {dataset.recipe_settings.name}")
    excluded = fit_exclusions(dataset)
    joined = [with_recipe_settings(r, settings[r.run_id]) for r in runs]
    return [r.model_copy(update={"fit_exclusion": excluded[r.run_id]}) if r.run_id in excluded else r
            for r in joined], []


def fit_exclusions(dataset: Dataset) -> dict[str, str]:
    """``run_id`` -> reason of the runs ``dataset`` declares predicted and scored but not fitted on
    (its ``fit_exclusions`` CSV; comment lines start with '#')."""
    if dataset.fit_exclusions is None:
        return {}
    with dataset.fit_exclusions.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(line for line in fh if not line.startswith("#")))
    return {row["run_id"]: row["reason"] for row in rows}


def load_dataset(name: str) -> list[MeasuredRun]:
    """All runs of the shipped dataset ``name``, joined with its recipe settings on ``run_id``."""
    return load_dataset_rows(name)[0]
