"""Shipped datasets of measured runs, available by name (``muonsim validate --dataset NAME``).

The project ships its own copies (it must work without ``../shared``). ``megatron-bridge`` is the
published Megatron-Bridge performance summary (releases 25.09-26.08; GB300/GB200 NVL72, DGX
B300/B200/H100; AdamW on the element-wise distributed optimizer; forced-balanced MoE routing).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topologies.inputs import UserInputError, load_yaml_file
from workloads.loaders import load_runs
from workloads.measured import MeasuredRun

MEASURED_DIR = Path(__file__).parent / "data" / "measured"


@dataclass(frozen=True)
class Dataset:
    """A named file of measured runs shipped with muonsim."""

    name: str
    path: Path
    description: str
    recipe_settings: Path | None = None  # YAML rules: recipe settings the table does not list


DATASETS: dict[str, Dataset] = {
    "megatron-bridge": Dataset(
        "megatron-bridge", MEASURED_DIR / "megatron_bridge_perf_summary.csv",
        "Megatron-Bridge published pre-training throughput, releases 25.09-26.08, five systems",
        MEASURED_DIR / "megatron_bridge_recipe_settings.yaml"),
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


def load_dataset(name: str) -> list[MeasuredRun]:
    """All runs of the shipped dataset ``name``, with its documented recipe settings applied."""
    dataset = get_dataset(name)
    rules = recipe_rules(dataset)
    return [apply_recipe_rules(r, rules) for r in load_runs(dataset.path)]
