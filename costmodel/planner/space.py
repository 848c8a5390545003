"""The planner's search space: parallel layouts x micro-batch x recompute x optimizer choices.

Candidates are generated arithmetically: the cartesian product of the allowed values of tp, pp,
vpp, cp, ep, etp and micro-batch size is filtered with a vectorised (numpy) copy of Megatron's
divisibility rules as :meth:`workloads.scenario.Scenario.validate` states them; the planner then
runs the real validator on every candidate it evaluates, so nothing the validator rejects is ever
listed. A test holds the vectorised filter equal to the validator on the full product.

Default bounds (overridden by ``--max-X``; explicit pins bypass them): tp and etp <= min(8, NVLink
domain), cp <= 8, vpp <= 8, micro-batch sizes 1, 2, 4, 8; pp divides the GPUs, pp <= layers and
pp*vpp <= layers (+2 unless the split is 'even'); ep divides the experts.

Optimizer choices: AdamW on the element-wise distributed optimizer (hiding on/off) and Muon on the
layer-wise one (legacy/current layout x load balance x hiding on/off x the TP Newton-Schulz mode,
which only varies when tp or etp > 1). Only the (layout, load balance) pairs Megatron-Core has are
searched (legacy/ping_pong, current/lpt) unless the pins allow hypothetical ones (``--allow-hypothetical``:
also none, and the other balance of each layout; their labels say "hypothetical").
Settings that cannot matter for a candidate are normalised to ``None`` so that no two candidates
describe the same run.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, fields
from typing import Any, get_args

import numpy as np

from costmodel.planner.pins import CATEGORICAL_KEYS, Pins
from topologies.identity_memo import IdentityMemo
from topologies.inputs import UserInputError
from workloads.recipe_settings import LAYOUT_KEYS, layout_bound_skip
from workloads.runtime import RuntimeSettings
from workloads.scenario import (
    LayerWiseLayout,
    LoadBalance,
    OptimizerSpec,
    Parallelism,
    Recompute,
    Scenario,
    ScenarioConfig,
    TpMode,
    hypothetical_reason,
)

DEFAULT_MAX = {"tp": 8, "etp": 8, "cp": 8, "vpp": 8, "micro_batch_size": 8}
STRUCT_KEYS = ("tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch_size")


@dataclass(frozen=True, order=True)
class Candidate:
    """One point of the search space (``None`` = the setting does not apply to this candidate)."""

    tp: int
    pp: int
    vpp: int
    cp: int
    ep: int
    etp: int
    mbs: int
    recompute: str
    optimizer: str
    distribution: str
    layout: str | None = None
    tp_mode: str | None = None
    load_balance: str | None = None
    hide: bool | None = None

    @property
    def hypothetical(self) -> bool:
        """A layer-wise (layout, load balance) pair Megatron-Core does not have (a what-if)."""
        return hypothetical_reason(self.distribution, self.layout, self.load_balance) is not None

    @property
    def structure(self) -> tuple[Any, ...]:
        """The parallel layout and activation settings (what the per-layer costs depend on)."""
        return (self.tp, self.pp, self.vpp, self.cp, self.ep, self.etp, self.mbs, self.recompute)

    @property
    def memory_key(self) -> tuple[Any, ...]:
        """Everything memory per GPU can depend on (load balance and hiding cannot)."""
        return self.structure + (self.optimizer, self.distribution, self.layout, self.tp_mode)

    def settings(self) -> dict[str, Any]:
        """Searched settings by scenario key (the keys of :mod:`costmodel.planner.pins`)."""
        return {"tp": self.tp, "pp": self.pp, "vpp": self.vpp, "cp": self.cp, "ep": self.ep, "etp": self.etp,
                "micro_batch_size": self.mbs, "recompute": self.recompute, "optimizer": self.optimizer,
                "distribution": self.distribution, "layer_wise_layout": self.layout, "tp_mode": self.tp_mode,
                "load_balance": self.load_balance, "hide_param_gather": self.hide}

    def label(self) -> str:
        """Compact one-line description, e.g. ``tp1 pp4 vpp4 cp1 ep64 etp1 mbs2 rc-none muon current/lpt hide``."""
        par = f"tp{self.tp} pp{self.pp} vpp{self.vpp} cp{self.cp} ep{self.ep} etp{self.etp} mbs{self.mbs} rc-{self.recompute}"
        opt = self.optimizer
        if self.distribution == "replicated":
            opt += " replicated"
        details = [d for d in (self.layout, self.load_balance, self.tp_mode) if d]
        if details:
            opt += " " + "/".join(details)
        if self.hide is not None:
            opt += " hide" if self.hide else " no-hide"
        if self.hypothetical:
            opt += " (hypothetical)"
        return f"{par} | {opt}"

    def matches(self, wanted: dict[str, Any]) -> bool:
        """Whether every given searched setting equals this candidate's."""
        mine = self.settings()
        return all(mine.get(k) == v for k, v in wanted.items())

    @classmethod
    def from_scenario(cls, scenario: Scenario) -> Candidate:
        """The (normalised) candidate that describes a resolved scenario."""
        p, o = scenario.par, scenario.optimizer
        return normalised(p.tp, p.pp, p.vpp, p.cp, p.ep, p.expert_tp, p.micro_batch_size, p.recompute, o.kind,
                          o.resolved_distribution, o.layer_wise_layout, o.tp_mode, o.resolved_load_balance,
                          o.hide_param_gather)


def normalised(tp: int, pp: int, vpp: int, cp: int, ep: int, etp: int, mbs: int, recompute: str, kind: str,
               distribution: str, layout: str | None, tp_mode: str | None, load_balance: str | None,
               hide: bool | None) -> Candidate:
    """A candidate with the settings that cannot matter set to ``None``.

    Layout and load balance apply to the layer-wise optimizer only; the TP Newton-Schulz mode to
    Muon with tp or etp > 1; hiding the parameter all-gather to distributed optimizers only.
    """
    layer_wise = distribution == "layer_wise"
    return Candidate(
        tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, mbs=mbs, recompute=recompute, optimizer=kind,
        distribution=distribution, layout=layout if layer_wise else None,
        load_balance=load_balance if layer_wise else None,
        tp_mode=tp_mode if kind == "muon" and (tp > 1 or etp > 1) else None,
        hide=hide if distribution != "replicated" else None,
    )


_CONFIG_PARTS: IdentityMemo[Any] = IdentityMemo(4096)  # the base config by identity


def _layout_parts(base: ScenarioConfig, pp: int, vpp: int, ep: int, tp: int) -> tuple[dict[str, Any], RuntimeSettings]:
    """(the base's parallelism settings that belong to its own layout, reset to Megatron's defaults,
    and the base's runtime likewise) for a candidate of sizes pp, vpp, ep and tp: a recipe's pipeline
    layout for its pp and vpp, EP overlap without ep or interleaving, sequence parallelism off from a
    tp-1 base for a tp > 1 candidate — the rule ``--release`` and the model × system defaults follow
    (:func:`workloads.recipe_settings.layout_bound_skip`). They depend on nothing else, so they are
    memoised on the base's identity."""
    key = ("layout", pp, vpp, ep, tp)
    hit = _CONFIG_PARTS.get(key, base)
    if hit is None:
        base_par = base.parallelism
        sizes = {"pp": pp, "vpp": vpp, "ep": ep, "tp": tp}
        recipe_pp_vpp = (base_par.pp, base_par.vpp)
        reset = {k: Parallelism.model_fields[k].default for k in (*LAYOUT_KEYS, "ep_comm_overlap", "sequence_parallel")
                 if layout_bound_skip(k, getattr(base_par, k), recipe_pp_vpp, sizes, recipe_tp=base_par.tp) is not None}
        runtime = base.runtime
        if layout_bound_skip("delay_wgrad_compute", runtime.delay_wgrad_compute, recipe_pp_vpp, sizes) is not None:
            runtime = runtime.model_copy(update={"delay_wgrad_compute": False})
        hit = _CONFIG_PARTS.put((reset, runtime), key, base)
    return hit


def _optimizer_spec(base: ScenarioConfig, cand: Candidate) -> OptimizerSpec:
    """The base's optimizer section with the candidate's optimizer choices (memoised on the base's
    identity: a search has a few dozen distinct ones)."""
    key = ("optimizer", cand.optimizer, cand.distribution, cand.layout, cand.tp_mode, cand.load_balance, cand.hide)
    hit = _CONFIG_PARTS.get(key, base)
    if hit is None:
        opt: dict[str, Any] = {"kind": cand.optimizer, "distribution": cand.distribution}
        for name, value in (("layer_wise_layout", cand.layout), ("tp_mode", cand.tp_mode),
                            ("load_balance", cand.load_balance), ("hide_param_gather", cand.hide)):
            if value is not None:
                opt[name] = value
        hit = _CONFIG_PARTS.put(base.optimizer.model_copy(update=opt), key, base)
    return hit


def candidate_config(base: ScenarioConfig, cand: Candidate) -> ScenarioConfig:
    """The base scenario's config with a candidate's settings (unvalidated; see build_scenario).

    The candidate's sizes replace the base's, the base's settings bound to its own layout are reset
    (:func:`_layout_parts`); the reset, the runtime and the optimizer section are memoised (planner
    searches build tens of thousands of configs)."""
    reset, runtime = _layout_parts(base, cand.pp, cand.vpp, cand.ep, cand.tp)
    par = base.parallelism.model_copy(update={
        "tp": cand.tp, "pp": cand.pp, "vpp": cand.vpp, "cp": cand.cp, "ep": cand.ep, "etp": cand.etp,
        "micro_batch_size": cand.mbs, "recompute": cand.recompute, **reset,
    })
    return base.model_copy(update={"parallelism": par, "runtime": runtime, "optimizer": _optimizer_spec(base, cand)})


_RULES: IdentityMemo[tuple[str | None, str | None]] = IdentityMemo(50_000)
# (the error message of Scenario.validate_sizes, of validate_settings) by the candidate without its micro-batch
# size and the base's config, system and model by identity
_RULE_KEY = operator.attrgetter(*(f.name for f in fields(Candidate) if f.name != "mbs"))  # every field but
# the micro-batch size, a field added later too (a tuple of them costs a tenth of replace(cand, mbs=0))


def _rule_errors(scenario: Scenario, cand: Candidate, base: Scenario) -> tuple[str | None, str | None]:
    """(the error message of ``scenario.validate_sizes()``, of ``scenario.validate_settings()``), or None for
    a rule set that passes. Neither reads the micro-batch size and the candidate's config is a
    function of the base's config and the candidate (:func:`candidate_config`), so they are memoised
    on the candidate's other settings: a search's layouts differing only in micro-batch size (a
    quarter of them for Kimi K2 on 256 GPUs) are checked once."""
    key = _RULE_KEY(cand)
    hit = _RULES.get(key, base.config, base.system, base.model)
    if hit is not None:
        return hit
    errors: list[str | None] = []  # messages, not the errors: their tracebacks would hold the scenario
    for check in (scenario.validate_sizes, scenario.validate_settings):
        try:
            check()
            errors.append(None)
        except UserInputError as err:
            errors.append(str(err))
    return _RULES.put((errors[0], errors[1]), key, base.config, base.system, base.model)


def build_scenario(base: Scenario, cand: Candidate) -> Scenario:
    """The validated scenario of a candidate, sharing the base's (possibly calibrated) system.

    Raises UserInputError with the validator's message when the candidate is invalid: the first
    rule of ``Scenario.validate`` it breaks (sizes, then the batch rule, then the settings; the first
    and last memoised by :func:`_rule_errors`).
    """
    scenario = Scenario(config=candidate_config(base.config, cand), system=base.system, model=base.model)
    try:
        sizes_error, settings_error = _rule_errors(scenario, cand, base)
    except Exception:  # a rule failing otherwise than with a message: the validator's own order decides
        scenario.validate()
        raise
    if sizes_error is not None:
        raise UserInputError(sizes_error)
    scenario.validate_batch()
    if settings_error is not None:
        raise UserInputError(settings_error)
    return scenario


# ----------------------------------------------------------------------------- enumeration
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def default_values(base: Scenario, pins: Pins) -> dict[str, list[Any]]:
    """Allowed values of every searched setting before the divisibility rules are applied."""
    m, gpus, domain = base.model, base.gpus, base.system.nvlink.domain_size
    gbs = base.par.global_batch_size

    def cap(key: str) -> int:
        return pins.max.get(key, DEFAULT_MAX.get(key, 1 << 30))

    tp_cap = min(cap("tp"), domain) if "tp" not in pins.max else pins.max["tp"]
    etp_cap = min(cap("etp"), domain) if "etp" not in pins.max else pins.max["etp"]
    moe = m.moe
    values: dict[str, list[Any]] = {
        "tp": [d for d in _divisors(gpus) if d <= tp_cap],
        "pp": [d for d in _divisors(gpus) if d <= m.num_layers],
        "vpp": list(range(1, min(cap("vpp"), m.num_layers) + 1)),
        "cp": [d for d in _divisors(gpus) if d <= cap("cp")],
        "ep": [d for d in _divisors(moe.num_experts) if gpus % d == 0] if moe else [1],
        "etp": [d for d in _divisors(gpus) if d <= etp_cap and moe.expert_ffn_hidden_size % d == 0] if moe else [1],
        "micro_batch_size": [1 << i for i in range(0, 31) if (1 << i) <= min(cap("micro_batch_size"), gbs)],
        "recompute": list(get_args(Recompute)),
    }
    for key in values:
        if key in pins.values:
            values[key] = list(pins.values[key])
        values[key] = [v for v in values[key] if pins.allows(key, v)]
    return values


def structure_grid(base: Scenario, pins: Pins) -> tuple[np.ndarray, int]:
    """Valid (tp, pp, vpp, cp, ep, etp, mbs) rows (int64 array, one row each) and the raw product size.

    The rules mirror :meth:`Scenario.validate` (vectorised); recompute and the optimizer choices do
    not change validity and are crossed in later.
    """
    vals = default_values(base, pins)
    axes = [np.asarray(vals[k], dtype=np.int64) for k in STRUCT_KEYS]
    raw = int(np.prod([len(a) for a in axes]))
    if raw == 0:
        return np.zeros((0, len(STRUCT_KEYS)), dtype=np.int64), 0
    grid = np.stack([g.ravel() for g in np.meshgrid(*axes, indexing="ij")], axis=1)
    ok = structure_mask(base, grid)
    return grid[ok], raw


def structure_mask(base: Scenario, grid: np.ndarray) -> np.ndarray:
    """Boolean mask: which rows of ``grid`` (columns STRUCT_KEYS) pass Megatron's divisibility rules."""
    tp, pp, vpp, cp, ep, etp, mbs = (grid[:, i] for i in range(len(STRUCT_KEYS)))
    m, p, gpus = base.model, base.par, base.gpus
    layers = m.num_layers
    mp = tp * pp * cp
    ok = gpus % mp == 0
    ok &= (m.attention.num_heads % tp == 0) & (m.attention.num_kv_heads % tp == 0)
    if m.num_dense_layers:
        ok &= m.ffn_hidden_size % tp == 0
    ok &= ~((vpp > 1) & (pp == 1))
    stages = pp * vpp
    # the embedding and the loss may take a virtual stage each (workloads.pipeline_layout)
    ok &= stages <= (layers if p.pipeline_split == "even" else layers + 2)
    even = layers % stages == 0
    if p.pipeline_split == "even":
        ok &= even
    elif p.pipeline_split == "auto":
        ok &= even | (layers % pp != 0)
    ok &= (cp == 1) | (p.seq_length % (2 * cp) == 0)
    # default: on when tp > 1; off from a tp-1 base does not carry to tp > 1 (_layout_parts)
    sequence_parallel = (tp > 1) & ((p.sequence_parallel is not False) | (p.tp == 1))
    ok &= ~sequence_parallel | ((p.seq_length // cp) % tp == 0)
    dp = np.where(ok, gpus // mp, 1)
    if m.moe is None:
        ok &= (ep == 1) & (etp == 1)
    else:
        ok &= (m.moe.num_experts % ep == 0) & (m.moe.expert_ffn_hidden_size % etp == 0)
        ok &= (tp * cp * dp) % (ep * etp) == 0
    ok &= p.global_batch_size % (mbs * dp) == 0
    gpd = base.config.placement.gpus_per_domain
    if gpus > base.system.max_gpus or (gpd is not None and gpd > base.system.nvlink.domain_size):
        ok &= False
    return ok


def _reversed(literal: Any) -> tuple[Any, ...]:
    return tuple(reversed(get_args(literal)))


def optimizer_variants(pins: Pins, tp: int, etp: int) -> dict[tuple[str, str], tuple[tuple[Any, ...], ...]]:
    """Per (kind, distribution): the (layout, tp_mode, load_balance, hide) choices for tp and etp.

    Normalised (no duplicates), in preference order (Megatron's current defaults first: hiding on,
    current layout, LPT, duplicated): the first choice that fits is a group's representative.
    """
    def allowed(key: str, default: tuple[Any, ...]) -> tuple[Any, ...]:
        vals = pins.values.get(key, default)
        return tuple(v for v in vals if pins.allows(key, v))

    out: dict[tuple[str, str], dict[tuple[Any, ...], None]] = {}
    for kind in allowed("optimizer", CATEGORICAL_KEYS["optimizer"]):
        default_dist = ("element_wise",) if kind == "adamw" else ("layer_wise",)
        valid_dists = ("replicated", "element_wise") if kind == "adamw" else ("replicated", "layer_wise")
        for dist in (d for d in allowed("distribution", default_dist) if d in valid_dists):
            choices = itertools.product(
                allowed("hide_param_gather", (True, False)), allowed("layer_wise_layout", _reversed(LayerWiseLayout)),
                allowed("load_balance", _reversed(LoadBalance)), allowed("tp_mode", get_args(TpMode)))
            for hide, layout, lb, mode in choices:
                if not pins.allow_hypothetical and hypothetical_reason(dist, layout, lb):
                    continue
                c = normalised(tp, 1, 1, 1, 1, etp, 1, "none", kind, dist, layout, mode, lb, hide)
                out.setdefault((kind, dist), {})[(c.layout, c.tp_mode, c.load_balance, c.hide)] = None
    return {k: tuple(v) for k, v in out.items() if v}


@dataclass(frozen=True)
class Group:
    """The candidates sharing a parallel layout, recompute mode and optimizer kind/distribution."""

    structure: tuple[int, int, int, int, int, int, int]  # tp, pp, vpp, cp, ep, etp, mbs
    recompute: str
    kind: str
    distribution: str
    choices: tuple[tuple[Any, ...], ...]  # (layout, tp_mode, load_balance, hide), preferred first

    @property
    def layout_key(self) -> tuple[Any, ...]:
        """Parallel layout and recompute: what the pipeline bound depends on."""
        return (self.structure, self.recompute)

    def candidates(self) -> list[Candidate]:
        return [Candidate(*self.structure, self.recompute, self.kind, self.distribution, *ch) for ch in self.choices]

    def may_match(self, wanted: dict[str, Any]) -> bool:
        """Whether the group's layout, recompute and optimizer kind agree with ``wanted`` (the
        optimizer choices are checked per candidate: :meth:`Candidate.matches`)."""
        mine = dict(zip(STRUCT_KEYS, self.structure, strict=True)) | {
            "recompute": self.recompute, "optimizer": self.kind, "distribution": self.distribution}
        return all(mine[k] == v for k, v in wanted.items() if k in mine)


def enumerate_groups(base: Scenario, pins: Pins, grid: np.ndarray) -> list[Group]:
    """Groups for every structure row of ``grid``, recompute mode and optimizer kind/distribution."""
    recomputes = default_values(base, pins)["recompute"]
    table: dict[tuple[bool, bool], dict[tuple[str, str], tuple[tuple[Any, ...], ...]]] = {}
    out: list[Group] = []
    for row in grid.tolist():
        tp, etp = row[0], row[5]
        key = (tp > 1, etp > 1)
        if key not in table:
            table[key] = optimizer_variants(pins, tp, etp)
        structure = tuple(row)
        for rc in recomputes:
            for (kind, dist), choices in table[key].items():
                out.append(Group(structure, rc, kind, dist, choices))  # type: ignore[arg-type]
    return out


def first_candidates(pins: Pins, grid: np.ndarray, recompute: str) -> list[Candidate]:
    """Per structure row of ``grid``: the first candidate of its first group with ``recompute``, as
    :func:`enumerate_groups` orders them (the candidate the screen prices the layout's bound with);
    rows without any optimizer variant have none. Known before the groups are built."""
    table: dict[tuple[bool, bool], tuple[str, str, tuple[Any, ...]] | None] = {}
    out: list[Candidate] = []
    for row in grid.tolist():
        key = (row[0] > 1, row[5] > 1)
        if key not in table:
            variants = optimizer_variants(pins, row[0], row[5])
            table[key] = next(((kind, dist, choices[0]) for (kind, dist), choices in variants.items()), None)
        first = table[key]
        if first is not None:
            tp, pp, vpp, cp, ep, etp, mbs = row
            layout, tp_mode, load_balance, hide = first[2]
            out.append(Candidate(tp, pp, vpp, cp, ep, etp, mbs, recompute, first[0], first[1], layout, tp_mode,
                                 load_balance, hide))
    return out


def enumerate_candidates(base: Scenario, pins: Pins) -> tuple[list[Candidate], int]:
    """Every candidate of the space and the raw (unfiltered) product size (for small spaces/tests)."""
    grid, raw = structure_grid(base, pins)
    recomputes = default_values(base, pins)["recompute"]
    out = [c for g in enumerate_groups(base, pins, grid) for c in g.candidates()]
    return out, raw * max(len(recomputes), 1)
