"""GroupShape: how a process group sits on the fabric, the minimal input of collective costs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GroupShape:
    """A process group of ``size`` ranks spread over ``domains`` NVLink domains,
    ``ranks_per_domain`` in each (size = ranks_per_domain × domains)."""

    size: int
    ranks_per_domain: int
    domains: int

    def __post_init__(self) -> None:
        if self.size != self.ranks_per_domain * self.domains:
            raise ValueError(f"inconsistent GroupShape {self}")

    @property
    def intra_domain(self) -> bool:
        return self.domains == 1

    @staticmethod
    def single_domain(size: int) -> GroupShape:
        return GroupShape(size=size, ranks_per_domain=size, domains=1)
