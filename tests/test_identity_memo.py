"""The identity-keyed memo behind the cost model's caches."""

from __future__ import annotations

from topologies.identity_memo import IdentityMemo


class Owner:  # unhashable-by-value stand-in for a model or system
    __hash__ = None  # type: ignore[assignment]


def test_a_hit_needs_the_same_key_and_the_very_same_owners() -> None:
    memo: IdentityMemo[str] = IdentityMemo(limit=10)
    a, b = Owner(), Owner()
    assert memo.put("v", ("k", 1), a) == "v"
    assert memo.get(("k", 1), a) == "v"
    assert memo.get(("k", 1), b) is None  # another object, even of equal value
    assert memo.get(("k", 2), a) is None


def test_an_entry_keeps_its_owners_alive_so_their_ids_are_not_reused() -> None:
    memo: IdentityMemo[int] = IdentityMemo(limit=10)
    memo.put(1, "k", Owner())  # the only reference to the owner is the entry's
    owner_id = next(iter(memo._entries))[1]
    assert any(id(o) == owner_id for entry in memo._entries.values() for o in entry[0])


def test_the_memo_empties_when_full() -> None:
    memo: IdentityMemo[int] = IdentityMemo(limit=3)
    a = Owner()
    for i in range(3):
        memo.put(i, i, a)
    assert len(memo) == 3
    memo.put(3, 3, a)
    assert len(memo) == 1 and memo.get(3, a) == 3 and memo.get(0, a) is None
