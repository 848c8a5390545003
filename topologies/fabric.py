"""Fabric graphs (networkx ``DiGraph``), built on request from a :class:`FabricLayout`.

Nodes carry ``kind``: ``gpu``, ``nvlink_switch`` (one node per switch chip: 18 per NVL72 rack, the
NVSwitch chips of a DGX node), ``nic``, ``leaf``, ``spine``, ``core``. Directed edges carry
``bandwidth_Bps`` (nominal, per direction) and ``latency_s``; every physical link appears as two
directed edges. Parallel cables between the same two switches are one edge with the summed rate.

Node ids are tuples: ``("gpu", g)``, ``("nvsw", domain, chip)``, ``("nic", g, j)``,
``("leaf", plane, rail, index)``, ``("spine", plane, index)``, ``("core", plane, index)``.

- **NVLink domain**: every GPU has ``links_per_gpu / switch_chips`` links to every switch chip of
  its domain (NVL72: one 50 GB/s/dir NVLink 5 link to each of the 18 chips → 900 GB/s/dir [S18]),
  so every GPU pair of a domain is one switch hop apart.
- **Scale-out**: each NIC has one port per plane (``nic_bandwidth / planes``) into the leaf of its
  rail; leaves of a pod (or of the whole two-tier fabric) spread their up-links evenly over its
  spines, spines of a three-tier fabric spread half their ports over the cores.

Graphs are for ``muonsim topology``, tests, and the representative groups of the DES: building
100,000 GPUs is refused (placement and collective costs never need a graph).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from topologies.hardware import SystemSpec
from topologies.inputs import UserInputError
from topologies.layout import FabricLayout

if TYPE_CHECKING:
    import networkx as nx

NVLINK_HOP_LATENCY_S = 936.25e-9  # ASTRA-sim validated HGX-H100 link latency per GPU↔switch hop [S36]
MAX_GRAPH_GPUS = 20_000


def _link(g: nx.DiGraph, u: tuple, v: tuple, bandwidth_Bps: float, latency_s: float, kind: str) -> None:
    """Add a full-duplex link as two directed edges."""
    g.add_edge(u, v, bandwidth_Bps=bandwidth_Bps, latency_s=latency_s, link=kind)
    g.add_edge(v, u, bandwidth_Bps=bandwidth_Bps, latency_s=latency_s, link=kind)


def add_nvlink_domain(g: nx.DiGraph, layout: FabricLayout, system: SystemSpec, domain: int) -> None:
    """One NVLink domain: its GPUs (all physical slots) wired to every switch chip."""
    nv = system.nvlink
    per_chip_Bps = nv.gpu_bandwidth_Bps / nv.switch_chips
    for chip in range(nv.switch_chips):
        g.add_node(("nvsw", domain, chip), kind="nvlink_switch", domain=domain, nvls=nv.nvls)
    for slot in range(layout.domain_size):
        gpu = layout.gpu_id(domain, slot)
        g.add_node(("gpu", gpu), kind="gpu", domain=domain, slot=slot, used=slot < layout.gpus_per_domain)
        for chip in range(nv.switch_chips):
            _link(g, ("gpu", gpu), ("nvsw", domain, chip), per_chip_Bps, NVLINK_HOP_LATENCY_S, "nvlink")


def add_scale_out(g: nx.DiGraph, layout: FabricLayout, system: SystemSpec, domains: Iterable[int]) -> None:
    """NICs of ``domains`` plus the leaves, spines and cores that connect them (every plane)."""
    so = system.scale_out
    domains = sorted(set(domains))
    hop = so.switch_hop_latency_s
    k, up, port = layout.radix, layout.leaf_up_ports, layout.port_Bps
    pods = sorted({layout.pod_of(d) for d in domains})
    leaves: dict[tuple, int] = {}
    for plane in range(layout.planes):
        for d in domains:
            for slot in range(layout.domain_size):
                gpu = layout.gpu_id(d, slot)
                for j in range(layout.nics_per_gpu):
                    rail, index = layout.leaf_of(d, slot, j)
                    nic = ("nic", gpu, j)
                    leaf = ("leaf", plane, rail, index)
                    if nic not in g:
                        g.add_node(nic, kind="nic", rail=rail, gpu=gpu)
                        _link(g, ("gpu", gpu), nic, so.nic_bandwidth_Bps, so.nic_latency_s, "pcie")
                    if leaf not in g:
                        g.add_node(leaf, kind="leaf", plane=plane, rail=rail, pod=layout.pod_of(d))
                    leaves[leaf] = layout.pod_of(d)
                    _link(g, nic, leaf, port, hop, "network")
        if layout.tiers < 2:
            continue
        if layout.tiers == 2:
            spine_groups = {0: [("spine", plane, s) for s in range(max(layout.spines_per_plane, 1))]}
        else:
            per_pod = layout.spines_per_plane // max(1, -(-layout.domains // layout.domains_per_pod))
            spine_groups = {p: [("spine", plane, p * per_pod + s) for s in range(per_pod)] for p in pods}
        for leaf, pod in leaves.items():
            if leaf[1] != plane:
                continue
            group = spine_groups[0 if layout.tiers == 2 else pod]
            for spine in group:
                g.add_node(spine, kind="spine", plane=plane, pod=0 if layout.tiers == 2 else pod)
                _link(g, leaf, spine, up * port / len(group), hop, "network")
        if layout.tiers == 3:
            cores = [("core", plane, c) for c in range(layout.cores_per_plane)]
            for group in spine_groups.values():
                for spine in group:
                    for core in cores:
                        g.add_node(core, kind="core", plane=plane)
                        _link(g, spine, core, (k // 2) * port / len(cores), hop, "network")


def build_fabric(layout: FabricLayout, system: SystemSpec, domains: Iterable[int] | None = None,
                 scale_out: bool = True) -> nx.DiGraph:
    """The fabric graph of a job (or of the listed ``domains`` only, for representative groups)."""
    import networkx as nx

    chosen = sorted(set(domains)) if domains is not None else list(range(layout.domains))
    if any(not 0 <= d < layout.domains for d in chosen):
        raise UserInputError(f"domain ids must be in 0..{layout.domains - 1}")
    if len(chosen) * layout.domain_size > MAX_GRAPH_GPUS:
        raise UserInputError(
            f"a fabric graph of {len(chosen) * layout.domain_size} GPUs is too large to build "
            f"(limit {MAX_GRAPH_GPUS}); use the arithmetic summary, or fewer domains")
    g = nx.DiGraph(system=system.name, tiers=layout.tiers, planes=layout.planes, rails=layout.rails)
    for d in chosen:
        add_nvlink_domain(g, layout, system, d)
    if scale_out and (layout.domains > 1 or domains is None):
        add_scale_out(g, layout, system, chosen)
    return g


def fabric_summary(layout: FabricLayout, system: SystemSpec) -> dict[str, object]:
    """Arithmetic summary of the fabric under a job (no graph): counts, rates (B/s), bisection (B/s per
    direction). ``job_*``: the job's own GPUs' NICs; ``nics``, ``nics_per_rail_per_domain``: every NIC of the
    occupied domains (a job smaller than a domain leaves the others idle)."""
    nv, so = system.nvlink, system.scale_out
    return {
        "system": system.name,
        "gpus": layout.gpus,
        "gpus_per_domain": layout.gpus_per_domain,
        "domains": layout.domains,
        "domain_size": layout.domain_size,
        "nvlink_switch_chips": layout.domains * nv.switch_chips,
        "nvlink_gpu_Bps": nv.gpu_bandwidth_Bps,
        "nvlink_domain_bisection_Bps": layout.nvlink_bisection_Bps,
        "nvls": nv.nvls,
        "job_nics": layout.job_nics,
        "job_rails": layout.job_rails,
        "job_nics_per_rail_per_domain": layout.job_nics_per_rail_per_domain,
        "nics": layout.nics,
        "nic_Bps": so.nic_bandwidth_Bps,
        "rails": layout.rails,
        "nics_per_rail_per_domain": layout.nics_per_rail_per_domain,
        "planes": layout.planes,
        "tiers": layout.tiers,
        "switch_radix": layout.radix,
        "oversubscription": layout.oversubscription,
        "domains_per_leaf": layout.domains_per_leaf,
        "domains_per_pod": layout.domains_per_pod,
        "leaves": layout.leaves_per_plane * layout.planes,
        "spines": layout.spines_per_plane * layout.planes,
        "cores": layout.cores_per_plane * layout.planes,
        "network_bisection_Bps": layout.network_bisection_Bps,
    }
