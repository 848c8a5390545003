"""Shipped datasets of measured runs, available by name (``muonsim validate --dataset NAME``).

The project ships its own copies (it must work without ``../shared``). ``megatron-bridge`` is the
published Megatron-Bridge performance summary (releases 25.09-26.08; GB300/GB200 NVL72, DGX
B300/B200/H100; AdamW on the element-wise distributed optimizer; forced-balanced MoE routing).
``megatron-ci`` is the Megatron-LM functional-test timings (small models on 8 × H100, 8 × GB200,
8 × A100; :mod:`workloads.megatron_ci`), the rows used for fitting and validation;
``megatron-ci-all`` every row the model can express. Rows a dataset does not predict are listed
as :class:`SkippedRun` s with their reason (:func:`load_dataset_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topologies.inputs import UserInputError, load_yaml_file
from workloads.loaders import load_runs
from workloads.measured import MeasuredRun, SkippedRun

MEASURED_DIR = Path(__file__).parent / "data" / "measured"


@dataclass(frozen=True)
class Dataset:
    """A named file of measured runs shipped with muonsim."""

    name: str
    path: Path
    description: str
    recipe_settings: Path | None = None  # YAML rules: recipe settings the table does not list
    loader: str = "runs"  # "runs": a CSV of the MeasuredRun schema; "megatron-ci": workloads.megatron_ci
    select: bool = True  # megatron-ci: keep only the rows used for fitting and validation


DATASETS: dict[str, Dataset] = {
    "megatron-bridge": Dataset(
        "megatron-bridge", MEASURED_DIR / "megatron_bridge_perf_summary.csv",
        "Megatron-Bridge published pre-training throughput, releases 25.09-26.08, five systems",
        MEASURED_DIR / "megatron_bridge_recipe_settings.yaml"),
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
        raise UserInputError(f"unknown dataset '{name}'; known: {', '.join(dataset_names())}")
    return DATASETS[name]


def recipe_rules(dataset: Dataset) -> list[dict[str, Any]]:
    """The dataset's recipe-setting rules (``match`` → ``set``), empty when it has none."""
    if dataset.recipe_settings is None:
        return []
    return list(load_yaml_file(dataset.recipe_settings, "recipe settings").get("rules", []))


def apply_recipe_rules(run: MeasuredRun, rules: list[dict[str, Any]]) -> MeasuredRun:
    """``run`` with the settings of every matching rule filled in (columns the run sets win)."""
    update: dict[str, Any] = {}
    for rule in rules:
        match = rule["match"]
        if run.model in match.get("models", [run.model]) and run.tp >= match.get("min_tp", 1):
            update |= {k: v for k, v in rule["set"].items() if getattr(run, k) is None}
    return run.model_copy(update=update) if update else run


def load_dataset_rows(name: str) -> tuple[list[MeasuredRun], list[SkippedRun]]:
    """The runs of the shipped dataset ``name`` (recipe settings applied) and the rows it skips, with why."""
    dataset = get_dataset(name)
    if dataset.loader == "megatron-ci":
        from workloads.megatron_ci import load_megatron_ci

        return load_megatron_ci(dataset.path, select=dataset.select)
    rules = recipe_rules(dataset)
    return [apply_recipe_rules(r, rules) for r in load_runs(dataset.path)], []


def load_dataset(name: str) -> list[MeasuredRun]:
    """All runs of the shipped dataset ``name``, with its documented recipe settings applied."""
    return load_dataset_rows(name)[0]
