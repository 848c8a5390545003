"""GroupShape: how a process group sits on the fabric, the minimal input of collective costs.

A shape is what the fast (analytic) collective model needs to know about a group, without GPU ids:
how many ranks, how many NVLink domains they span, how many share a domain, and how far up the
scale-out fabric the traffic between domains has to climb (``tiers``: 0 = inside one NVLink domain,
1 = one leaf switch, 2 = leaf-spine, 3 = leaf-spine-core). Shapes are small frozen values so that
``collective_time_s`` can cache on them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GroupShape:
    """A process group of ``size`` ranks spread over ``domains`` NVLink domains.

    ``ranks_per_domain`` is the number of ranks per domain; for an even group
    ``size == ranks_per_domain * domains``. Uneven groups (a stride that does not divide the domain)
    set ``ranks_per_domain`` to the *smallest* per-domain count (the bottleneck of hierarchical
    algorithms) and ``uniform=False``. ``tiers`` is the highest fabric tier the group's
    inter-domain traffic crosses; ``None`` means "not known" (1 if the group spans domains, else 0).
    """

    size: int
    ranks_per_domain: int
    domains: int
    tiers: int | None = None
    uniform: bool = True

    def __post_init__(self) -> None:
        if self.size < 1 or self.ranks_per_domain < 1 or self.domains < 1:
            raise ValueError(f"inconsistent GroupShape {self}")
        if self.uniform and self.size != self.ranks_per_domain * self.domains:
            raise ValueError(f"inconsistent GroupShape {self}")
        if not self.uniform and not (self.ranks_per_domain * self.domains <= self.size):
            raise ValueError(f"inconsistent GroupShape {self}")
        if self.tiers is not None and not 0 <= self.tiers <= 3:
            raise ValueError(f"GroupShape tiers must be 0-3, got {self.tiers}")
        if self.domains == 1 and self.tiers not in (None, 0):
            raise ValueError(f"a single-domain group crosses no fabric tier: {self}")

    @property
    def intra_domain(self) -> bool:
        """True when every rank sits in one NVLink domain."""
        return self.domains == 1

    @property
    def fabric_tiers(self) -> int:
        """Tiers crossed between domains (0 inside one domain; 1 when unknown and spanning domains)."""
        if self.domains == 1:
            return 0
        return self.tiers if self.tiers is not None else 1

    @staticmethod
    def single_domain(size: int) -> GroupShape:
        """A group entirely inside one NVLink domain."""
        return GroupShape(size=size, ranks_per_domain=size, domains=1)

    @staticmethod
    def spread(size: int, domains: int, tiers: int | None = None) -> GroupShape:
        """An even group of ``size`` ranks over ``domains`` domains (size must divide evenly)."""
        if domains < 1 or size % domains:
            raise ValueError(f"{size} ranks do not spread evenly over {domains} domains")
        return GroupShape(size=size, ranks_per_domain=size // domains, domains=domains,
                          tiers=tiers if domains > 1 else None)
