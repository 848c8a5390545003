"""The best-first search's rounds on a pool, with the likely next round computed ahead.

A round of :meth:`costmodel.planner.screen.Screen._best_first` pops a batch of groups, waits for
their tasks (bounds, members) and only then knows the next batch (the threshold and the bounds
move). Run one round at a time, the two workers sat idle between rounds and at the end of each
round's few uneven tasks (Kimi K2 on 256 GPUs: 108 rounds of 3 tasks, the workers 55-70 % busy).

:class:`RoundRunner` lets the search hand the pool, right behind a round's tasks, the tasks of the
groups the next rounds will most likely pop (the next entries of the heap). A task's result depends
only on its item (a layout's pipeline bound, every member of a group, or a group's representative
members for the preference order and target its id holds: pure functions of the item and the
installed evaluator, whose caches only memoise), so a round that does pop a group
computed ahead takes that result instead of submitting it again; one it does not pop leaves an
unused result. The search's decisions, and so every plan, count and statistic it reports, are
those of the one-round-at-a-time search; only when the work runs changes (and a little work,
at most one round's worth at the end of a pass, is done for nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

Key = tuple[str, Hashable]  # (task kind, item id): the item id is its first field
Task = tuple[str, list[Any]]  # (kind, items)


class RoundRunner:
    """Submit rounds' tasks (and tasks ahead of need) to ``pool`` and hand back results by key.

    ``func`` maps a task ``(kind, items)`` to ``(kind, results)``, one result per item whose first
    field is the item's first field (its id).
    """

    def __init__(self, pool: Any, func: Callable[[Task], Task]) -> None:
        self.pool = pool
        self.func = func
        self._streams: list[tuple[set[Key], Iterator[Task]]] = []  # oldest first (the pool runs them in order)
        self._results: dict[Key, Any] = {}

    def known(self, key: Key) -> bool:
        """Whether ``key``'s result is in hand or on its way."""
        return key in self._results or any(key in keys for keys, _ in self._streams)

    def submit(self, tasks: list[Task]) -> None:
        """Hand ``tasks`` to the pool now (behind those already submitted)."""
        if tasks:
            keys = {(kind, item[0]) for kind, items in tasks for item in items}
            self._streams.append((keys, self.pool.start_map(self.func, tasks)))

    def take(self, keys: Sequence[Key]) -> dict[Key, Any]:
        """The results of ``keys`` (each submitted before), waiting for them; they are forgotten."""
        while any(k not in self._results for k in keys):
            if not self._streams:
                missing = [k for k in keys if k not in self._results]
                raise KeyError(f"results never submitted: {missing[:3]}")
            self._drain(self._streams.pop(0)[1])
        return {k: self._results.pop(k) for k in dict.fromkeys(keys)}

    def finish(self) -> None:
        """Wait for every task still running (their results are dropped): the pool is free after."""
        while self._streams:
            self._drain(self._streams.pop(0)[1])
        self._results.clear()

    def _drain(self, stream: Iterator[Task]) -> None:
        for kind, results in stream:
            for r in results:
                self._results[(kind, r[0])] = r
