"""The dp × tp process grid and its groups (Megatron rank order: tp fastest, then dp).

``rank = dp_rank · tp + tp_rank``. Groups: ``tp`` (consecutive ranks), ``dp`` (same tp rank),
``etp`` (consecutive ranks of size etp) and ``expert_dp`` (same etp rank; size world/etp, ep = 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from reference.instrument import Group


@dataclass(frozen=True)
class GridCoords:
    """Where one rank sits in the grid."""

    rank: int
    world_size: int
    tp: int
    etp: int

    @property
    def dp(self) -> int:
        """Data-parallel size."""
        return self.world_size // self.tp

    @property
    def tp_rank(self) -> int:
        """Rank within the tensor-parallel group."""
        return self.rank % self.tp

    @property
    def dp_rank(self) -> int:
        """Rank within the data-parallel group."""
        return self.rank // self.tp

    @property
    def etp_rank(self) -> int:
        """Rank within the expert tensor-parallel group."""
        return self.rank % self.etp

    @property
    def expert_dp_rank(self) -> int:
        """Rank within the expert data-parallel group."""
        return self.rank // self.etp

    @property
    def expert_dp(self) -> int:
        """Expert data-parallel size (ep = 1)."""
        return self.world_size // self.etp


def group_members(world_size: int, tp: int, etp: int) -> dict[str, list[list[int]]]:
    """Every group of every kind, as lists of global ranks (the order all ranks create them in)."""
    dp = world_size // tp
    return {
        "tp": [[d * tp + t for t in range(tp)] for d in range(dp)],
        "dp": [[d * tp + t for d in range(dp)] for t in range(tp)],
        "etp": [[e * etp + t for t in range(etp)] for e in range(world_size // etp)],
        "expert_dp": [[e * etp + t for e in range(world_size // etp)] for t in range(etp)],
    }


def build_groups(coords: GridCoords, timeout_s: float) -> dict[str, Group]:
    """Create the process groups (collective call on every rank) and return this rank's."""
    from datetime import timedelta

    import torch.distributed as dist

    out: dict[str, Group] = {}
    world = list(range(coords.world_size))
    for kind, groups in group_members(coords.world_size, coords.tp, coords.etp).items():
        for members in groups:
            if len(members) == 1:
                pg = None
            elif members == world:
                pg = dist.group.WORLD
            else:
                pg = dist.new_group(members, timeout=timedelta(seconds=timeout_s))
            if coords.rank in members:
                out[kind] = Group(kind, len(members), members.index(coords.rank), pg)
    return out


def local_groups() -> dict[str, Group]:
    """Single-rank groups (no process group needed)."""
    return {k: Group(k, 1, 0, None) for k in ("tp", "dp", "etp", "expert_dp")}
