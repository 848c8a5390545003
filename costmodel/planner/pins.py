"""User pins and bounds on the planner's search space (``--tp 1``, ``--pp 4,8``, ``--max-tp 8``).

A *pin* restricts a searched setting to the listed values (comma-separated on the command line);
a *bound* (``--min-X`` / ``--max-X``) restricts a numeric setting to a range. Settings that are not
searched (model, system, gpus, batch, sequence, precision, Newton-Schulz details ...) are not
pins: they define the base scenario. Every bad value raises a one-line :class:`UserInputError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from topologies.inputs import UserInputError
from workloads.scenario import (
    LayerWiseLayout,
    LoadBalance,
    OptimizerKind,
    Recompute,
    TpMode,
    hypothetical_reason,
)

# searched numeric settings (scenario keys) and the CLI flag that names them
NUMERIC_KEYS: dict[str, str] = {
    "tp": "tp", "pp": "pp", "vpp": "vpp", "cp": "cp", "ep": "ep", "etp": "etp", "micro_batch_size": "mbs",
}
# searched categorical settings and their valid values
CATEGORICAL_KEYS: dict[str, tuple[Any, ...]] = {
    "recompute": get_args(Recompute),
    "optimizer": get_args(OptimizerKind),
    "distribution": ("replicated", "element_wise", "layer_wise"),
    "layer_wise_layout": get_args(LayerWiseLayout),
    "tp_mode": get_args(TpMode),
    "load_balance": get_args(LoadBalance),
    "hide_param_gather": (False, True),
}
CATEGORICAL_FLAGS = {"recompute": "recompute", "optimizer": "optimizer", "distribution": "distribution",
                     "layer_wise_layout": "layout", "tp_mode": "tp-mode", "load_balance": "load-balance",
                     "hide_param_gather": "hide-param-gather"}
SEARCH_KEYS = tuple(NUMERIC_KEYS) + tuple(CATEGORICAL_KEYS)
BOUND_FLAGS = tuple(NUMERIC_KEYS.values())  # --min-tp/--max-tp ... --min-mbs/--max-mbs
_TRUE = {"on", "true", "yes", "1"}
_FALSE = {"off", "false", "no", "0"}


@dataclass(frozen=True)
class Pins:
    """Allowed values per searched key (absent = the planner's default range) and numeric bounds."""

    values: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    min: Mapping[str, int] = field(default_factory=dict)
    max: Mapping[str, int] = field(default_factory=dict)
    allow_hypothetical: bool = False  # also search layout / load-balance pairs Megatron-Core does not have

    def allows(self, key: str, value: Any) -> bool:
        """Whether ``value`` of searched key ``key`` is inside the pins and bounds."""
        if key in self.values and value not in self.values[key]:
            return False
        if key in self.min and value < self.min[key]:
            return False
        return not (key in self.max and value > self.max[key])

    def describe(self) -> str:
        """Short human summary, e.g. ``tp=1 pp=4,8 max-tp=8``."""
        parts = [f"{_flag(k)}={','.join(_show(v) for v in vals)}" for k, vals in self.values.items()]
        parts += [f"min-{_flag(k)}={v}" for k, v in self.min.items()]
        parts += [f"max-{_flag(k)}={v}" for k, v in self.max.items()]
        if self.allow_hypothetical:
            parts.append("allow-hypothetical")
        return " ".join(parts) or "none"


def _flag(key: str) -> str:
    return NUMERIC_KEYS.get(key) or CATEGORICAL_FLAGS.get(key, key)


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def parse_bool(text: str, flag: str) -> bool:
    """``on/off/true/false/yes/no/1/0`` -> bool (UserInputError otherwise)."""
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise UserInputError(f"--{flag}: '{text}' is not on/off (valid: on, off, true, false)")


def parse_value(key: str, text: str) -> Any:
    """One pin value of searched key ``key`` from its text (UserInputError names the flag)."""
    text = text.strip()
    if key in NUMERIC_KEYS:
        flag = NUMERIC_KEYS[key]
        try:
            value = int(text)
        except ValueError:
            raise UserInputError(f"--{flag}: '{text}' is not an integer") from None
        if value <= 0:
            raise UserInputError(f"--{flag}: must be greater than 0 (got {value})")
        return value
    flag = CATEGORICAL_FLAGS[key]
    if key == "hide_param_gather":
        return parse_bool(text, flag)
    valid = CATEGORICAL_KEYS[key]
    if text not in valid:
        raise UserInputError(f"--{flag}: '{text}' is not one of {', '.join(map(str, valid))}")
    return text


def parse_pins(raw: Mapping[str, Any], bounds: Mapping[str, int | None] | None = None,
               allow_hypothetical: bool = False) -> Pins:
    """Pins from raw flag values (scenario keys -> ``"4,8"`` strings or values) and bounds.

    ``bounds`` maps ``min_<flag>`` / ``max_<flag>`` (flag = tp, pp, vpp, cp, ep, etp, mbs) to ints.
    ``allow_hypothetical``: also search the layer-wise (layout, load balance) pairs Megatron-Core does
    not have; without it, pins that leave only such pairs are refused with one line.
    """
    values: dict[str, tuple[Any, ...]] = {}
    for key, text in raw.items():
        if key not in SEARCH_KEYS or text is None:
            continue
        items = [t for t in str(text).split(",")] if isinstance(text, str) else [str(text)]
        if any(not t.strip() for t in items):
            raise UserInputError(f"--{_flag(key)}: empty value in '{text}'")
        parsed = tuple(dict.fromkeys(parse_value(key, t) for t in items))
        values[key] = parsed
    lo: dict[str, int] = {}
    hi: dict[str, int] = {}
    flag_to_key = {f: k for k, f in NUMERIC_KEYS.items()}
    for name, value in (bounds or {}).items():
        if value is None:
            continue
        side, _, flag = name.partition("_")
        if side not in ("min", "max") or flag not in flag_to_key:
            raise UserInputError(f"unknown bound '{name}'; valid: min-/max- with {', '.join(BOUND_FLAGS)}")
        if int(value) <= 0:
            raise UserInputError(f"--{side}-{flag}: must be greater than 0 (got {value})")
        (lo if side == "min" else hi)[flag_to_key[flag]] = int(value)
    for key in set(lo) & set(hi):
        if lo[key] > hi[key]:
            flag = NUMERIC_KEYS[key]
            raise UserInputError(f"--min-{flag} {lo[key]} exceeds --max-{flag} {hi[key]}")
    pins = Pins(values=values, min=lo, max=hi, allow_hypothetical=allow_hypothetical)
    for key, vals in values.items():
        if not any(pins.allows(key, v) for v in vals):
            flag = _flag(key)
            raise UserInputError(f"--{flag} {','.join(map(_show, vals))} lies outside --min-{flag}/--max-{flag}")
    if not allow_hypothetical and ("layer_wise_layout" in values or "load_balance" in values):
        pairs = [(lay, lb) for lay in values.get("layer_wise_layout", CATEGORICAL_KEYS["layer_wise_layout"])
                 for lb in values.get("load_balance", CATEGORICAL_KEYS["load_balance"])]
        if all(hypothetical_reason("layer_wise", lay, lb) for lay, lb in pairs):
            shown = ", ".join(f"{lay}/{lb}" for lay, lb in pairs)
            raise UserInputError(f"--layout/--load-balance leave only pairs Megatron-Core does not have ({shown}; "
                                 "it has legacy/ping_pong and current/lpt): add --allow-hypothetical to search them")
    return pins
