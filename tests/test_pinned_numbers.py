"""No number may move: step times (both engines), breakdowns, optimizer plans (every bucket, rank
load and collective), memory by stage of a broad scenario set, pinned to 1e-9 relative.

The pins are ``tests/data/pinned_numbers.json.gz``, written by ``tests/pinned_numbers.py`` (see
its docstring; regenerate from the reference code after a deliberate model change).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("pinned_numbers", _HERE / "pinned_numbers.py")
assert _spec is not None and _spec.loader is not None
pinned = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pinned)

PINS = pinned.load(_HERE / "data" / "pinned_numbers.json.gz")
SET = {label: (overrides, des) for label, overrides, des in pinned.scenario_set()}


def test_pins_cover_the_scenario_set() -> None:
    assert set(PINS) == set(SET)


@pytest.mark.parametrize("label", sorted(SET))
def test_pinned_scenario(label: str) -> None:
    overrides, des = SET[label]
    expected = PINS[label]
    assert expected["overrides"] == overrides
    actual = {"overrides": overrides, **pinned.scenario_record(overrides, des)}
    diffs = pinned.compare(expected, actual, label)
    assert not diffs, "\n".join(diffs[:20])
