"""Placement of Megatron's process groups onto NVLink domains (minimal version; see issue 3).

Megatron orders ranks tp fastest, then cp, ep, dp, pp (expert groups: etp, ep, expert-dp, pp).
A group of ``size`` ranks whose members are ``stride`` ranks apart spans NVLink domains according to
how many consecutive ranks one domain holds (``gpus_per_domain``).

Policy for jobs that do not fill domains: use the largest divisor of the job's GPU count that is at
most the domain size (256 GPUs on NVL72: 64 per rack, four racks). Override with
``Placement.gpus_per_domain``.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from topologies.groups import GroupShape
from topologies.hardware import SystemSpec
from topologies.inputs import UserInputError


def default_gpus_per_domain(system: SystemSpec, gpus: int) -> int:
    """Largest divisor of ``gpus`` not exceeding the NVLink domain size."""
    size = system.nvlink.domain_size
    if gpus <= size:
        return gpus
    return max(d for d in range(1, size + 1) if gpus % d == 0)


@dataclass(frozen=True)
class JobPlacement:
    """Strides and sizes of every process group of a job, on domains of ``gpus_per_domain``."""

    gpus: int
    gpus_per_domain: int
    tp: int
    cp: int
    ep: int
    etp: int
    pp: int

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.cp * self.pp)

    @property
    def expert_dp(self) -> int:
        return self.gpus // (self.etp * self.ep * self.pp)

    def size_and_stride(self, kind: str) -> tuple[int, int]:
        """(size, stride in rank order) of a group kind."""
        table = {
            "tp": (self.tp, 1),
            "cp": (self.cp, self.tp),
            "dp": (self.dp * self.cp, self.tp),  # gradients reduce over the combined dp×cp group
            "etp": (self.etp, 1),
            "ep": (self.ep, self.etp),
            "expert_dp": (self.expert_dp, self.etp * self.ep),
            "pp": (self.pp, self.gpus // self.pp),
            "world": (self.gpus, 1),
        }
        if kind not in table:
            raise UserInputError(f"unknown group '{kind}'; valid: {', '.join(table)}")
        return table[kind]

    def shape(self, kind: str) -> GroupShape:
        """How group ``kind`` spans NVLink domains."""
        size, stride = self.size_and_stride(kind)
        g = self.gpus_per_domain
        per_domain = gcd(size, g // stride) if stride < g and g % stride == 0 else 1
        per_domain = max(per_domain, 1)
        return GroupShape(size=size, ranks_per_domain=per_domain, domains=size // per_domain)


def place_job(system: SystemSpec, gpus: int, tp: int = 1, cp: int = 1, ep: int = 1, etp: int = 1, pp: int = 1,
              gpus_per_domain: int | None = None) -> JobPlacement:
    """Place a job; raise UserInputError when the placement is impossible."""
    g = gpus_per_domain or default_gpus_per_domain(system, gpus)
    if g > system.nvlink.domain_size:
        raise UserInputError(f"gpus_per_domain {g} exceeds the NVLink domain size {system.nvlink.domain_size}")
    if gpus % g:
        raise UserInputError(f"gpus {gpus} is not a multiple of gpus_per_domain {g}")
    return JobPlacement(gpus=gpus, gpus_per_domain=g, tp=tp, cp=cp, ep=ep, etp=etp, pp=pp)


def placement_for(scenario) -> JobPlacement:  # noqa: ANN001 - avoids importing workloads here
    """Placement of a resolved scenario (workloads.scenario.Scenario)."""
    p = scenario.par
    return place_job(scenario.system, scenario.gpus, tp=p.tp, cp=p.cp, ep=p.ep, etp=p.expert_tp, pp=p.pp,
                     gpus_per_domain=scenario.config.placement.gpus_per_domain)
