"""Collective costs (minimal α-β version; issue 3 replaces the internals, keeping the signatures).

``size_bytes`` follows nccl-tests: the buffer for all-reduce/broadcast, the full gathered array for
all-gather/reduce-scatter, the per-rank send buffer for all-to-all.
"""

from __future__ import annotations

from topologies.groups import GroupShape
from topologies.hardware import SystemSpec


def _bus_factor(op: str, n: int) -> float:
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("broadcast", "send_recv"):
        return 1.0
    return (n - 1) / n


def collective_time_s(op: str, size_bytes: float, shape: GroupShape, system: SystemSpec,
                      algorithm: str | None = None) -> float:
    """Seconds for one collective ``op`` of ``size_bytes`` over a group of ``shape``."""
    n = shape.size
    if n <= 1 or size_bytes <= 0:
        return 0.0
    eff = system.efficiency
    nvl_Bps = system.nvlink.gpu_bandwidth_Bps * eff.nvlink_bandwidth
    net_Bps = system.scale_out.nic_bandwidth_Bps * system.scale_out.nics_per_gpu * eff.network_bandwidth
    if op == "send_recv":
        bw = nvl_Bps if shape.intra_domain else net_Bps
        lat = eff.nvlink_step_latency_s if shape.intra_domain else eff.network_step_latency_s
        return eff.collective_base_latency_s + lat + size_bytes / bw
    if op == "all_to_all":
        f_remote = (shape.domains - 1) / shape.domains
        t_bw = max(size_bytes * (1 - f_remote) / (nvl_Bps * eff.alltoall_bandwidth / eff.nvlink_bandwidth),
                   size_bytes * f_remote / net_Bps if f_remote else 0.0)
        return eff.collective_base_latency_s + t_bw
    if shape.intra_domain:
        bw = nvl_Bps
        steps = n - 1
        lat = eff.nvlink_step_latency_s
    else:
        bw = min(nvl_Bps, shape.ranks_per_domain * net_Bps)
        steps = n - 1
        lat = eff.network_step_latency_s
    factor = _bus_factor(op, n)
    if op == "all_reduce":
        steps *= 2
    return eff.collective_base_latency_s + steps * lat + factor * size_bytes / bw
