"""Arithmetic layout of a job's fabric: NVLink domains, rails, leaf/spine/core tiers, bisection.

Everything here is closed-form (no graph), so that placing 100,000 GPUs costs microseconds; the
networkx graphs of :mod:`topologies.fabric` are built from the same layout on request.

Scale-out model (per plane), after the DGX SuperPOD reference architectures [S42] [S43] [S21] [S44]:

- **Rails.** A node (compute tray on NVL72, 8-GPU server on DGX) has ``rails`` NIC positions; NIC
  position r of every node plugs into the leaves of rail r (rail-optimised). NVL72: 4 NICs per
  compute tray → 4 rails, 18 NICs per rail per rack. DGX: 8 rails, 1 NIC per rail per node.
- **Leaf.** Radix k, ``down = k·o/(o+1)`` ports to NICs and ``k − down`` up (oversubscription o:1).
  A leaf serves ``domains_per_leaf = down // nics_per_rail_per_domain`` domains of its rail
  (GB300/Q3400: 72 // 18 = 4 racks; GB200/QM9700: 32 // 18 = 1 rack; DGX: 32 or 72 nodes).
- **Tiers.** Two tiers (leaf-spine, every leaf wired to every spine) while the plane's endpoints fit
  ``k × down`` (a non-blocking two-tier fat tree: k²/2 endpoints; 2,048 at radix 64, 10,368 at
  radix 144); beyond that, three tiers with one two-tier pod per scalable unit and a core tier.
  Spine switches of a three-tier pod use half their ports down; spines = leaf uplinks / (k/2).
  These rules reproduce the B200 RA switch counts (2 SU: 16 leaf / 8 spine; 8 SU: 64 / 32;
  16 SU: 128 / 128 / 64 core) [S43] and the GB300 "two Q3400 leaves per rail per SU" [S44].

GPU numbering: GPU ``d * domain_size + s`` is slot ``s`` of domain ``d``; a job using
``gpus_per_domain`` GPUs per domain occupies slots ``0 .. gpus_per_domain - 1`` of each domain.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import ceil

from topologies.hardware import SystemSpec
from topologies.inputs import UserInputError


@dataclass(frozen=True)
class FabricLayout:
    """Closed-form description of the fabric under a job (one plane unless a name says otherwise)."""

    system_name: str
    domain_size: int
    gpus_per_domain: int
    domains: int
    nics_per_gpu: int
    rails: int
    gpus_per_node: int
    nics_per_rail_per_domain: int
    planes: int
    radix: int
    leaf_down_ports: int
    leaf_up_ports: int
    tiers: int
    domains_per_leaf: int
    domains_per_pod: int
    leaves_per_plane: int
    spines_per_plane: int
    cores_per_plane: int
    nic_Bps: float
    port_Bps: float
    nvlink_gpu_Bps: float
    oversubscription: float

    @property
    def gpus(self) -> int:
        """GPUs used by the job."""
        return self.domains * self.gpus_per_domain

    @property
    def physical_gpus(self) -> int:
        """GPUs in the occupied domains (including slots the job leaves idle)."""
        return self.domains * self.domain_size

    @property
    def nics(self) -> int:
        """NICs in the occupied domains."""
        return self.physical_gpus * self.nics_per_gpu

    @property
    def job_nics(self) -> int:
        """NICs of the job's own GPUs (ranks fill slots 0..gpus_per_domain-1 of each domain)."""
        return self.gpus * self.nics_per_gpu

    @property
    def job_rails(self) -> int:
        """Rails the job's NICs sit on: the NIC positions of slots 0..gpus_per_domain-1 (:meth:`rail_of`)."""
        return min(self.rails, min(self.gpus_per_domain, self.gpus_per_node) * self.nics_per_gpu)

    @property
    def job_nics_per_rail_per_domain(self) -> int:
        """The most NICs of the job on one rail in one domain."""
        return ceil(self.gpus_per_domain * self.nics_per_gpu / self.job_rails)

    @property
    def network_bisection_Bps(self) -> float:
        """Scale-out bisection bandwidth of the job's GPUs, per direction (all planes).

        Half the job's NIC bandwidth crosses the cut; an oversubscribed leaf tier divides it.
        Zero for a single-domain job (nothing leaves the NVLink domain).
        """
        if self.domains == 1:
            return 0.0
        half = self.gpus * self.nics_per_gpu * self.nic_Bps / 2
        return half / self.oversubscription if self.tiers >= 2 else half

    @property
    def nvlink_bisection_Bps(self) -> float:
        """NVLink bisection of one domain per direction (single-stage, non-blocking switch)."""
        return (self.domain_size // 2) * self.nvlink_gpu_Bps

    def gpu_id(self, domain: int, slot: int) -> int:
        """Physical GPU id of ``slot`` in ``domain``."""
        return domain * self.domain_size + slot

    def rank_to_gpu(self, rank: int) -> int:
        """Physical GPU id of job rank ``rank`` (ranks fill gpus_per_domain slots per domain)."""
        return self.gpu_id(rank // self.gpus_per_domain, rank % self.gpus_per_domain)

    def rail_of(self, slot: int, nic: int = 0) -> int:
        """Rail of NIC ``nic`` of the GPU in ``slot`` (NIC position within its node)."""
        return ((slot % self.gpus_per_node) * self.nics_per_gpu + nic) % self.rails

    def leaf_of(self, domain: int, slot: int, nic: int = 0) -> tuple[int, int]:
        """(rail, leaf index within the rail) of a NIC."""
        rail = self.rail_of(slot, nic)
        if self.domains_per_leaf >= 1:
            return rail, domain // self.domains_per_leaf
        per_domain = ceil(self.nics_per_rail_per_domain / self.leaf_down_ports)
        node = slot // self.gpus_per_node
        return rail, domain * per_domain + node // self.leaf_down_ports

    def pod_of(self, domain: int) -> int:
        """Two-tier pod (scalable unit in a three-tier fabric) of a domain."""
        return domain // self.domains_per_pod

    def tier_between_domains(self, first_domain: int, span: int) -> int:
        """Highest tier crossed by rail-aligned traffic among ``span`` consecutive domains.

        0 for one domain; 1 when they share one leaf per rail; 2 when they share a pod; else 3.
        """
        if span <= 1:
            return 0
        last = first_domain + span - 1
        if self.tiers == 1:
            return 1
        if self.domains_per_leaf >= 1 and first_domain // self.domains_per_leaf == last // self.domains_per_leaf:
            return 1
        if self.tiers == 2 or first_domain // self.domains_per_pod == last // self.domains_per_pod:
            return 2
        return 3

    def tier_for_span(self, span: int) -> int:
        """Tier crossed by a group spanning ``span`` domains, aligned like Megatron groups are.

        Groups of one kind tile the domains in blocks of ``span``; a block stays under one leaf only
        if it does not straddle a leaf boundary for any group (``span`` divides the leaf reach).
        """
        if span <= 1:
            return 0
        if self.tiers == 1:
            return 1
        leaf = self.domains_per_leaf
        if leaf >= 1 and span <= leaf and leaf % span == 0:
            return 1
        pod = self.domains_per_pod
        if self.tiers == 2 or (span <= pod and pod % span == 0):
            return 2
        return 3


def _leaf_ports(radix: int, oversubscription: float) -> tuple[int, int]:
    down = int(radix * oversubscription / (oversubscription + 1))
    down = min(max(down, 1), radix - 1)
    return down, radix - down


@lru_cache(maxsize=4096)
def fabric_layout(system: SystemSpec, gpus: int, gpus_per_domain: int) -> FabricLayout:
    """The fabric under a job of ``gpus`` GPUs using ``gpus_per_domain`` per NVLink domain.

    Raises UserInputError (one line) when the system's fabric cannot hold the job.
    """
    nv, so = system.nvlink, system.scale_out
    if gpus_per_domain < 1 or gpus_per_domain > nv.domain_size:
        raise UserInputError(f"gpus_per_domain {gpus_per_domain} must be between 1 and the NVLink domain size {nv.domain_size}")
    if gpus % gpus_per_domain:
        raise UserInputError(f"gpus {gpus} is not a multiple of gpus_per_domain {gpus_per_domain}")
    domains = gpus // gpus_per_domain
    rails = so.rails or min(nv.domain_size, 8) * so.nics_per_gpu
    nics_per_domain = nv.domain_size * so.nics_per_gpu
    if nics_per_domain % rails:
        raise UserInputError(f"system '{system.name}': scale_out.rails {rails} must divide the {nics_per_domain} NICs of an NVLink domain")
    gpus_per_node = max(rails // so.nics_per_gpu, 1)
    nprd = nics_per_domain // rails
    k = so.switch_radix
    down, up = _leaf_ports(k, so.oversubscription)
    domains_per_leaf = down // nprd
    endpoints = domains * nics_per_domain
    cap2 = k * down
    cap3 = k * (k // 2) * down
    tiers = so.tiers or (2 if endpoints <= cap2 else 3)
    if tiers == 1 and (rails > 1 or endpoints > down) and domains > 1:
        raise UserInputError(f"system '{system.name}': a one-tier fabric holds one leaf of {down} NICs and one rail; this job needs {endpoints} NICs on {rails} rails (set scale_out.tiers to 2 or 3)")
    if tiers == 2 and endpoints > cap2:
        raise UserInputError(f"system '{system.name}': a two-tier fabric of radix {k} holds {cap2} NICs per plane; this job needs {endpoints} (set scale_out.tiers: 3 or a larger switch_radix)")
    if tiers == 3 and endpoints > cap3:
        raise UserInputError(f"system '{system.name}': a three-tier fabric of radix {k} holds {cap3} NICs per plane; this job needs {endpoints}")
    if domains > 1 and so.domains_per_scalable_unit * nics_per_domain > cap2 and tiers == 3:
        raise UserInputError(f"system '{system.name}': a scalable unit of {so.domains_per_scalable_unit} domains ({so.domains_per_scalable_unit * nics_per_domain} NICs) does not fit a two-tier pod of radix {k} ({cap2} NICs)")
    pod = domains if tiers <= 2 else so.domains_per_scalable_unit
    pod = max(min(pod, domains), 1)
    if domains_per_leaf >= 1:
        leaves_per_rail = ceil(domains / domains_per_leaf)
    else:
        leaves_per_rail = domains * ceil(nprd / down)
    leaves = rails * leaves_per_rail
    if tiers == 1 or (domains == 1 and leaves <= 1):
        spines = cores = 0
    elif tiers == 2:
        spines, cores = ceil(leaves * up / k), 0
    else:
        pods = ceil(domains / pod)
        leaves_pod = rails * (ceil(pod / domains_per_leaf) if domains_per_leaf >= 1 else pod * ceil(nprd / down))
        spines_pod = ceil(leaves_pod * up / (k // 2))
        spines = pods * spines_pod
        cores = ceil(spines * (k // 2) / k)
    nic_Bps = so.nic_bandwidth_Bps
    return FabricLayout(
        system_name=system.name, domain_size=nv.domain_size, gpus_per_domain=gpus_per_domain,
        domains=domains, nics_per_gpu=so.nics_per_gpu, rails=rails, gpus_per_node=gpus_per_node,
        nics_per_rail_per_domain=nprd, planes=so.planes, radix=k, leaf_down_ports=down,
        leaf_up_ports=up, tiers=tiers, domains_per_leaf=domains_per_leaf, domains_per_pod=pod,
        leaves_per_plane=leaves, spines_per_plane=spines, cores_per_plane=cores,
        nic_Bps=nic_Bps, port_Bps=nic_Bps / so.planes, nvlink_gpu_Bps=nv.gpu_bandwidth_Bps,
        oversubscription=so.oversubscription,
    )
