"""No number may move: step times (both engines), breakdowns, optimizer plans (every bucket, rank
load, kernel count and collective), memory by stage and small plan searches, pinned to 1e-9
relative, on a representative subset of ``tests/pinned_numbers.py``'s set (every mechanism at
least once).

The pins are ``tests/data/pinned_numbers.json.gz``, written from main's code by
``tests/pinned_numbers.py --subset --write`` (see its docstring; the whole set is checked against
another checkout with ``--against REF``).
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
SET = {label: (source, des) for label, source, des in pinned.scenario_set()}


def test_pins_cover_the_subset() -> None:
    assert set(PINS) == set(pinned.SUBSET)
    assert set(pinned.SUBSET) <= set(SET)


@pytest.mark.parametrize("label", pinned.SUBSET)
def test_pinned_scenario(label: str) -> None:
    source, des = SET[label]
    expected = PINS[label]
    assert expected["source"] == source
    actual = {"source": source, **pinned.scenario_record(source, des)}
    diffs = pinned.compare(expected, actual, label)
    assert not diffs, "\n".join(diffs[:20])
