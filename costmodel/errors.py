"""Errors the cost model raises for scenarios it cannot express (kept apart so any module can raise
them without importing the engines)."""


class UnsupportedScenario(Exception):
    """The model cannot express this scenario yet (message says why, in one line)."""
