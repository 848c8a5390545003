"""The screen's worker tasks (:mod:`costmodel.planner.screen`): pipeline bounds, every member of a
group, a group's representative members, and one best-first round's stream of the three.

They run in the pool's workers on the installed ``"screen"`` evaluator
(:func:`costmodel.planner.pool.set_evaluators`); a task's result depends only on its items.
"""

from __future__ import annotations

from typing import Any

from costmodel.planner.evaluate import Evaluation
from costmodel.planner.pool import evaluator
from costmodel.planner.space import Candidate, Group


def task_bounds(items: list[tuple[int, Group]]) -> list[tuple[int, float, Evaluation | None]]:
    """Pipeline bounds of layouts (one group stands for its layout and recompute mode)."""
    ev = evaluator("screen")
    return [(i, *ev.bound(g.candidates()[0])) for i, g in items]


def task_first_bounds(cands: list[Candidate]) -> list[tuple[tuple[Any, ...], float, Evaluation | None]]:
    """Pipeline bounds of layouts given by one candidate each: (layout key, bound, failure)."""
    ev = evaluator("screen")
    return [(((c.tp, c.pp, c.vpp, c.cp, c.ep, c.etp, c.mbs), c.recompute), *ev.bound(c)) for c in cands]


def _smallest_failure(failures: list[Evaluation]) -> Evaluation | None:
    ooms = [f for f in failures if f.status == "oom"]
    return min(ooms, key=lambda f: f.memory_bytes) if ooms else (failures[0] if failures else None)


def task_expand(items: list[tuple[int, Group]]) -> list[tuple[int, list[Evaluation], Evaluation | None]]:
    """Every member of each group: (index, timed members, why none fits if none does).

    When the first member shows that the layout's optimizer-independent memory (weights, gradients,
    activations) exceeds the budget, no other member is evaluated.
    """
    ev = evaluator("screen")
    out: list[tuple[int, list[Evaluation], Evaluation | None]] = []
    for i, g in items:
        cands = g.candidates()
        first = ev.evaluate(cands[0], memory_only=True)
        if first.status != "ok" and (first.status != "oom" or ev.floor_exceeds_budget(cands[0])):
            out.append((i, [], first))
            continue
        results = [ev.evaluate(c) for c in cands]
        timed = [r for r in results if r.timed]
        out.append((i, timed, None if timed else _smallest_failure(results)))
    return out


def task_representative(items: list[tuple[Any, Group, float, int]]) -> list[tuple[Any, list[Evaluation], Evaluation | None]]:
    """Members of each group in its preference order: fitting ones are timed until one is faster
    than the target or ``tries`` were timed; returns (the item's id, timed members, why none fits)."""
    ev = evaluator("screen")
    out = []
    for i, g, target, tries in items:
        failures: list[Evaluation] = []
        timed: list[Evaluation] = []
        for c in g.candidates():
            r = ev.evaluate(c, memory_only=True)
            if r.status == "ok":
                timed.append(ev.evaluate(c))
                if timed[-1].step_time_s < target or len(timed) >= tries:
                    break
                continue
            failures.append(r)
            if r.status != "oom" or ev.floor_exceeds_budget(c):
                break
        out.append((i, timed, None if timed else _smallest_failure(failures)))
    return out


def task_round(item: tuple[str, list[Any]]) -> tuple[str, list[Any]]:
    """A task of one best-first round: ``("bounds", layouts)``: :func:`task_bounds`; ``("expand",
    groups)``: :func:`task_expand`; ``("reps", groups)``: :func:`task_representative` (the kind
    comes back with the results)."""
    kind, items = item
    if kind == "bounds":
        return kind, task_bounds(items)
    return kind, (task_expand(items) if kind == "expand" else task_representative(items))
