"""Shipped datasets of measured runs, available by name (``muonsim validate --dataset NAME``).

The project ships its own copies (it must work without ``../shared``). ``megatron-bridge`` is the
published Megatron-Bridge performance summary (releases 25.09-26.08; GB300/GB200 NVL72, DGX
B300/B200/H100; AdamW on the element-wise distributed optimizer; forced-balanced MoE routing).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from topologies.inputs import UserInputError
from workloads.loaders import load_runs
from workloads.measured import MeasuredRun

MEASURED_DIR = Path(__file__).parent / "data" / "measured"


@dataclass(frozen=True)
class Dataset:
    """A named file of measured runs shipped with muonsim."""

    name: str
    path: Path
    description: str


DATASETS: dict[str, Dataset] = {
    "megatron-bridge": Dataset(
        "megatron-bridge", MEASURED_DIR / "megatron_bridge_perf_summary.csv",
        "Megatron-Bridge published pre-training throughput, releases 25.09-26.08, five systems"),
}


def dataset_names() -> list[str]:
    """Names of the shipped datasets."""
    return sorted(DATASETS)


def get_dataset(name: str) -> Dataset:
    """The shipped dataset called ``name`` (one-line UserInputError listing the known names)."""
    if name not in DATASETS:
        raise UserInputError(f"unknown dataset '{name}'; known: {', '.join(dataset_names())}")
    return DATASETS[name]


def load_dataset(name: str) -> list[MeasuredRun]:
    """All runs of the shipped dataset ``name``."""
    return load_runs(get_dataset(name).path)
