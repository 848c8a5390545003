""""Why not this configuration?" for a user-named partial configuration (``--explain "tp=2,pp=8"``).

The answer is one of:

- **invalid**: no configuration with these settings passes the scenario validator (its message);
- **out of memory**: every valid one needs more memory than the budget (the smallest, by how much);
- **ranked**: the best matching plan, its rank and how its breakdown differs from the best plan's
  (largest term differences first); a plan the screen pruned is evaluated now, and when it is
  slower than the screen's threshold its rank is a lower bound (plans that slow were not all
  evaluated);
- **outside the search space**: the settings lie outside the pins/bounds; the configuration built
  from the best plan with these settings is validated and evaluated as above.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from costmodel.planner.evaluate import Evaluation, Evaluator
from costmodel.planner.pins import CATEGORICAL_FLAGS, NUMERIC_KEYS, parse_value
from costmodel.planner.ranking import rank_of
from costmodel.planner.space import normalised
from topologies.inputs import UserInputError

if TYPE_CHECKING:
    from costmodel.planner.screen import Screen

MAX_GROUPS_EVALUATED = 40  # matching groups the screen pruned, evaluated on demand (best bound first)

_ALIASES = {flag.replace("-", "_"): key for key, flag in (NUMERIC_KEYS | CATEGORICAL_FLAGS).items()}
_ALIASES |= {key: key for key in NUMERIC_KEYS | CATEGORICAL_FLAGS} | {"hide": "hide_param_gather"}


@dataclass(frozen=True)
class Explanation:
    query: str
    verdict: str  # invalid | out_of_memory | ranked | unsupported
    message: str
    plan: str | None = None
    rank: int | None = None
    rank_is_lower_bound: bool = False
    in_space: bool = True
    step_time_s: float = math.nan
    memory_bytes: float = math.nan
    deltas_s: list[tuple[str, float]] = field(default_factory=list)  # term -> (this - best), seconds


def parse_query(query: str) -> dict[str, Any]:
    """``"tp=2,pp=8,optimizer=adamw"`` -> scenario-key settings (UserInputError on bad input)."""
    wanted: dict[str, Any] = {}
    given: dict[str, str] = {}  # key -> the part that set it
    for raw in query.split(","):
        part = raw.strip()
        if not part:
            continue
        name, sep, value = part.partition("=")
        key = _ALIASES.get(name.strip().replace("-", "_"))
        if not sep or key is None:
            valid = ", ".join(sorted(set(NUMERIC_KEYS.values()) | set(CATEGORICAL_FLAGS.values())))
            raise UserInputError(f"--explain: '{part}' is not SETTING=VALUE with SETTING one of {valid}")
        if key in given:
            raise UserInputError(f"--explain: {name.strip()} is given twice ({given[key]}, {part})")
        given[key] = part
        try:
            wanted[key] = parse_value(key, value)
        except UserInputError as err:  # parse_value names the flag (--tp); the user typed it in --explain
            why = str(err).partition(": ")[2] or str(err)
            hint = "; separate settings with commas, e.g. \"tp=2,pp=8\"" if "=" in value else ""
            raise UserInputError(f"--explain: {part}: {why}{hint}") from None
    if not wanted:
        raise UserInputError("--explain: give settings such as \"tp=2,pp=8\"")
    return wanted


def explanation_json(ex: Explanation) -> dict[str, Any]:
    """The ``--json`` form of an explanation: its breakdown deltas (this plan - the best, seconds) nested
    as a StepReport's ``breakdown_s`` and compare's ``delta_breakdown_s`` are, memory per GPU in bytes."""
    from costmodel.planner.result import terms_breakdown

    data = dataclasses.asdict(ex)
    deltas = data.pop("deltas_s")
    data["memory_per_gpu_bytes"] = data.pop("memory_bytes")
    data["delta_breakdown_s"] = terms_breakdown(dict(deltas)).model_dump() if deltas else None
    return data


def _describe(wanted: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in wanted.items())


def breakdown_deltas(plan: Evaluation, best: Evaluation) -> list[tuple[str, float]]:
    """Per-term (plan - best) seconds, largest absolute difference first (zero terms dropped)."""
    a, b = plan.terms, best.terms
    deltas = [(k, a.get(k, 0.0) - b.get(k, 0.0)) for k in dict.fromkeys([*a, *b])]
    return sorted((d for d in deltas if abs(d[1]) > 1e-12), key=lambda kv: -abs(kv[1]))


def _ranked(query: str, e: Evaluation, ranked: list[Evaluation], threshold_s: float, in_space: bool) -> Explanation:
    best = ranked[0] if ranked else e
    rank = rank_of(e.step_time_s, ranked)
    lower = e.step_time_s > threshold_s  # plans slower than the threshold were not all evaluated
    deltas = breakdown_deltas(e, best)
    losing = [f"{k} {d:+.3f} s" for k, d in deltas if d > 0][:4]
    gap = e.step_time_s - best.step_time_s
    where = f"ranks {'≥ ' if lower else ''}#{rank}" + ("" if in_space else " (outside the search space)")
    why = (f"; it loses {gap:.3f} s ({gap / best.step_time_s:+.1%}) to the best: " + ", ".join(losing)
           if gap > 0 and losing else "")
    msg = f"{query}: best such plan {e.candidate.label()} {where} at {e.step_time_s:.3f} s/step{why}"
    return Explanation(query, "ranked", msg, plan=e.candidate.label(), rank=rank, rank_is_lower_bound=lower,
                       in_space=in_space, step_time_s=e.step_time_s, memory_bytes=e.memory_bytes, deltas_s=deltas)


def _failure(query: str, failures: list[Evaluation], in_space: bool) -> Explanation:
    # outside the search space only one configuration was tried (the best plan with these settings):
    # say so instead of calling it "the smallest" of configurations that were never evaluated
    ooms = [f for f in failures if f.status == "oom"]
    if ooms:
        f = min(ooms, key=lambda x: x.memory_bytes)
        over = f.memory_bytes - f.budget_bytes
        which = (f"the smallest ({f.candidate.label()})" if in_space else
                 f"{f.candidate.label()} (outside the search space: only the best plan with these settings substituted "
                 "was tried)")
        msg = (f"{query}: does not fit in memory; {which} needs "
               f"{f.memory_bytes / 1e9:.1f} GB per GPU, {over / 1e9:.1f} GB over the {f.budget_bytes / 1e9:.1f} GB budget")
        return Explanation(query, "out_of_memory", msg, plan=f.candidate.label(), in_space=in_space,
                           memory_bytes=f.memory_bytes)
    f = failures[0]
    verdict = "invalid" if f.status == "invalid" else "unsupported"
    tried = "" if in_space else (f" (outside the search space: only {f.candidate.label()}, the best plan with these "
                                 "settings substituted, was tried)")
    return Explanation(query, verdict, f"{query}: {verdict}: {f.message}{tried}", plan=f.candidate.label(),
                       in_space=in_space)


def _start_settings(evaluator: Evaluator, ranked: list[Evaluation]) -> dict[str, Any]:
    if ranked:
        return ranked[0].candidate.settings()
    p, o = evaluator.base.par, evaluator.base.optimizer
    return {"tp": p.tp, "pp": p.pp, "vpp": p.vpp, "cp": p.cp, "ep": p.ep, "etp": p.expert_tp,
            "micro_batch_size": p.micro_batch_size, "recompute": p.recompute, "optimizer": o.kind,
            "distribution": o.resolved_distribution, "layer_wise_layout": o.layer_wise_layout,
            "tp_mode": o.tp_mode, "load_balance": o.resolved_load_balance, "hide_param_gather": o.hide_param_gather}


def _search_matching(wanted: dict[str, Any], screen: Screen, evaluator: Evaluator,
                     known: list[Evaluation]) -> tuple[Evaluation | None, list[Evaluation], bool]:
    """Best-first over the matching groups the screen did not expand: (best fitting plan, failures
    seen, whether the search stopped at MAX_GROUPS_EVALUATED)."""
    best = min(known, key=lambda e: e.step_time_s) if known else None
    states = [s for s in screen.states if s.group.may_match(wanted)]
    failures = [s.failure for s in states if s.infeasible and s.failure is not None]
    todo = sorted((s for s in states if not s.expanded and not s.infeasible), key=lambda s: s.bound_s)
    evaluated = 0
    for s in todo:
        if best is not None and s.bound_s >= best.step_time_s:
            return best, failures, False
        members = [c for c in s.group.candidates() if c.matches(wanted)]
        if not members:
            continue
        if evaluated >= MAX_GROUPS_EVALUATED:
            return best, failures, True
        evaluated += 1
        first = evaluator.evaluate(members[0], memory_only=True)
        if first.status != "ok" and (first.status != "oom" or evaluator.floor_exceeds_budget(members[0])):
            failures.append(first)
            continue
        for e in (evaluator.evaluate(c) for c in members):
            if e.fits and e.timed:
                if best is None or e.step_time_s < best.step_time_s:
                    best = e
            else:
                failures.append(e)
    return best, failures, False


def explain(query: str, screen: Screen, evaluator: Evaluator, ranked: list[Evaluation]) -> Explanation:
    """Answer "why not ``query``?" using what the screen found (evaluating more only if needed).

    ``ranked``: the plans in rank order (each group's fastest member that fits).
    """
    wanted = parse_query(query)
    text = _describe(wanted)
    threshold = screen.result.threshold_s
    known = [e for e in [*ranked, *screen.result.evaluations] if e.fits and e.timed and e.candidate.matches(wanted)]
    if known or any(s.group.may_match(wanted) for s in screen.states):
        best, failures, capped = _search_matching(wanted, screen, evaluator, known)
        if best is not None:
            out = _ranked(text, best, ranked, threshold, in_space=True)
            if capped:
                out = dataclasses.replace(out, message=out.message + f" (best of the {MAX_GROUPS_EVALUATED} most "
                                          "promising matching layouts evaluated)")
            return out
        if failures:
            out = _failure(text, failures, in_space=True)
            if capped:
                out = dataclasses.replace(out, message=out.message + f" (among the {MAX_GROUPS_EVALUATED} most "
                                          "promising matching layouts; others were not evaluated)")
            return out
    s = _start_settings(evaluator, ranked) | wanted
    if "optimizer" in wanted and "distribution" not in wanted:
        s["distribution"] = "element_wise" if s["optimizer"] == "adamw" else "layer_wise"
    o = evaluator.base.optimizer
    cand = normalised(s["tp"], s["pp"], s["vpp"], s["cp"], s["ep"], s["etp"], s["micro_batch_size"], s["recompute"],
                      s["optimizer"], s["distribution"], s["layer_wise_layout"] or o.layer_wise_layout,
                      s["tp_mode"] or o.tp_mode, s["load_balance"] or o.resolved_load_balance,
                      o.hide_param_gather if s["hide_param_gather"] is None else s["hide_param_gather"])
    e = evaluator.evaluate(cand)
    if e.fits and e.timed:
        return _ranked(text, e, ranked, threshold, in_space=False)
    return _failure(text, [e], in_space=False)
