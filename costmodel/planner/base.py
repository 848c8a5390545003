"""The base and reference scenario of a plan, from a scenario configuration and the user's pins.

``muonsim plan`` and the plan points of ``muonsim sweep`` both start here: the settings the planner
searches (tp, pp, ..., optimizer choices; :data:`~costmodel.planner.pins.SEARCH_KEYS`) given by the
user are *pins*; every other setting defines the base scenario. The base with the single-valued
pins applied is the *reference* scenario, ranked among the plans when it is valid.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from costmodel.planner.pins import SEARCH_KEYS
from topologies.inputs import UserInputError

if TYPE_CHECKING:
    from workloads.scenario import Scenario, ScenarioConfig


def split_pins(settings: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pins: the searched settings, the rest: base-scenario settings) of flat scenario settings."""
    pins = {k: v for k, v in settings.items() if k in SEARCH_KEYS}
    rest = {k: v for k, v in settings.items() if k not in SEARCH_KEYS}
    return pins, rest


def plan_base(config: ScenarioConfig, pins: Mapping[str, Any]) -> tuple[Scenario, str | None]:
    """(base scenario, why the reference scenario is invalid or None).

    The base takes the single-valued pins (values without a comma) when they make a valid
    scenario; it is not validated itself (every candidate is, on its own).
    """
    from costmodel.planner.plan import scenario_from_config
    from workloads.scenario import build_config

    singles = {k: str(v).strip() if isinstance(v, str) else v for k, v in pins.items() if "," not in str(v)}
    if singles:
        try:
            pinned = build_config(config.model_dump(), singles)
            scenario_from_config(pinned).validate()
            config = pinned
        except UserInputError:
            pass
    base = scenario_from_config(config)
    try:
        base.validate()
        error = None
    except UserInputError as err:
        error = str(err)
    return base, error
