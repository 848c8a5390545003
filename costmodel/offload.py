"""Activation offloading in the step: device-to-host copies in forward, host-to-device in backward.

What moves and how much memory it frees is :mod:`workloads.activation_memory`'s; this module prices
the copies over the GPU's host link (``GpuSpec.host_link_Bps``: NVLink-C2C on Grace superchips,
PCIe on DGX) and decides how much of them the compute hides, as a :class:`CommBlock` of kind
``offload`` (link ``host``) per layer kind and pass, like the other layer collectives:

- **Activation CPU offloading** (``cpu_offloading``, Transformer Engine's offload context): an
  offloaded layer's saved tensors are copied to the host on a side stream while the next layer
  computes its forward, and read back one layer ahead in backward, under the next (in backward
  order) layer's backward. With layers of similar size the copy of one layer is hidden behind one
  layer's compute: exposed ``max(0, t_copy − t_layer) / t_copy`` per pass (the FSDP rule). A share
  ``cpu_offloading_num_layers / layers`` of the stage's layers offloads (pp = 1, so one stage holds
  every layer; Megatron allows nothing else).
- **Fine-grained offloading** (``fine_grained_activation_offloading``, ``offload_modules``): every
  layer copies the named modules' saved tensors out and back the same way.

Not modelled: the host memory bandwidth (the Grace LPDDR or the CPU sockets take the copies at
the link's rate), the copy engines' contention with other host traffic, and the pinned host memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from costmodel.layer_costs import CommBlock
from workloads.activation_memory import (
    cpu_offload_bytes,
    fine_grained_offload_bytes,
    offloaded_layer_fraction,
)

if TYPE_CHECKING:
    from workloads.scenario import Scenario

OFFLOAD_KIND = "offload"
HOST_LINK = "host"


def offload_copy_s(num_bytes: float, host_link_Bps: float) -> float:
    """Seconds to copy ``num_bytes`` bytes over the host link (one direction)."""
    return num_bytes / host_link_Bps


def _representative_layer(scenario: Scenario, base: str) -> tuple[int, bool] | None:
    """(a layer index, is MoE) standing for layer kind ``base`` (None for non-layer kinds)."""
    model = scenario.model
    first_moe = model.moe.first_dense_layers if model.moe is not None else model.num_layers
    if base == "dense":
        return 0, False
    if base == "moe":
        return first_moe, True
    if base == "mtp":
        return model.num_layers, model.is_moe_layer(model.num_layers - 1)
    return None


def offload_copies(scenario: Scenario, base: str) -> tuple[tuple[float, float], ...]:
    """(share of the stage's layers, bytes each moves per micro-batch) of layer kind ``base``: the
    CPU-offloaded layers (their share, every saved tensor), and the other layers' fine-grained
    offloaded modules (when on); empty for non-layer kinds or without offloading."""
    rep = _representative_layer(scenario, base)
    if rep is None:
        return ()
    layer, moe = rep
    share = offloaded_layer_fraction(scenario)
    out = []
    if share > 0:
        out.append((share, cpu_offload_bytes(scenario, layer, moe)))
    fine = fine_grained_offload_bytes(scenario, layer, moe)
    if fine > 0 and share < 1:
        out.append((1.0 - share, fine))
    return tuple(out)


def offload_blocks(scenario: Scenario, kind: str, compute_s: tuple[float, float],
                   overlap: bool) -> tuple[tuple[CommBlock, ...], tuple[CommBlock, ...]]:
    """(forward, backward) offload blocks of one layer of ``kind`` (``compute_s``: its forward and
    backward compute in seconds): the copy out in forward, the copy back in backward. A share of
    the layers copies: the block's time is that share of one copy, its exposed fraction the one
    copy's (``max(0, t_copy − t_compute) / t_copy``), so the stage's exposed total is the offloaded
    layers' count times one copy's exposed time."""
    fwd: list[CommBlock] = []
    bwd: list[CommBlock] = []
    for share, num_bytes in offload_copies(scenario, kind.partition(":")[0]):
        t = offload_copy_s(num_bytes, scenario.system.gpu.host_link_Bps)
        for out, compute in ((fwd, compute_s[0]), (bwd, compute_s[1])):
            out.append(CommBlock(OFFLOAD_KIND, share * t, 0.0, HOST_LINK, max(0.0, t - compute) / t if overlap else 1.0))
    return tuple(fwd), tuple(bwd)


def add_offload_blocks(scenario: Scenario, per_kind: dict, overlap: bool) -> None:
    """Append each layer kind's offload blocks to ``per_kind`` (kind -> (forward compute s, backward
    compute s, forward blocks, backward blocks)), in place; nothing without offloading."""
    rt = scenario.runtime
    if not (rt.cpu_offloading and rt.cpu_offloading_num_layers) and not (
            rt.fine_grained_activation_offloading and rt.offload_modules):
        return
    for kind, (f, b, cf, cb) in per_kind.items():
        ff, fb = offload_blocks(scenario, kind, (f, b), overlap)
        per_kind[kind] = (f, b, cf + ff, cb + fb)
