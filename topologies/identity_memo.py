"""A bounded memo keyed partly by object identity.

The cost model's caches key on objects that are costly or impossible to hash (a model, a system, an
optimizer plan, an inventory) beside a plain hashable key. :class:`IdentityMemo` keys those
objects by ``id`` and keeps them in the entry, so an id cannot be reused by another object while
the entry lives: a hit is an identity match. The memo is emptied once it holds ``limit``
entries (the planner's searches would otherwise keep every plan alive).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class IdentityMemo(Generic[V]):
    """``key`` + the identities of ``owners`` -> value, at most ``limit`` entries."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._entries: dict[tuple[Hashable, ...], tuple[tuple[object, ...], V]] = {}

    def get(self, key: Hashable, *owners: object) -> V | None:
        """The value stored for ``key`` and these very ``owners``, or None. An id match is an
        identity match: the entry holds its owners, so no other live object can have their ids."""
        hit = self._entries.get((key, *map(id, owners)))
        return None if hit is None else hit[1]

    def put(self, value: V, key: Hashable, *owners: object) -> V:
        """Store ``value`` for ``key`` and ``owners`` (the entry holds them); returns ``value``."""
        if len(self._entries) >= self.limit:
            self._entries.clear()
        self._entries[(key, *map(id, owners))] = (owners, value)
        return value

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
