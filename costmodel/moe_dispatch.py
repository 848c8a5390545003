"""MoE token dispatch / combine across NVLink domains: hierarchical, de-duplicated per domain.

What the published runs use (Megatron-Bridge perf recipes, ``megatron.bridge.perf_recipes`` 0.6.2):
every DeepSeek-V3 recipe and every Qwen3 recipe on Blackwell (GB300/GB200 NVL72, DGX B300/B200)
and Qwen3-30B-A3B on H100 run ``moe_token_dispatcher_type="flex"`` with the HybridEP backend
(``deepseek/common.py``, ``qwen/*/qwen3_moe.py``; the H100 DeepSeek-V3 base recipe sets
``moe_flex_dispatcher_backend="hybridep"``). Only Qwen3-235B-A22B on H100 keeps the plain
``alltoall`` dispatcher (with ``overlap_moe_expert_parallel_comm``). The payload is BF16: Megatron-
Core's HybridEP path asserts ``not fp8_dispatch`` (``transformer/moe/fused_a2a.py``, "HybridEP
dispatcher does not support fp8 dispatch now"), also under FP8/MXFP8 training.

HybridEP / DeepEP internode dispatch is hierarchical (DeepSeek-V3 report §3.2.2; HybridEP reads
``NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN``): a token crosses the network **once per destination
NVLink domain** holding at least one of its ``topk`` experts (to the GPU of the same local rank),
then fans out over NVLink to the GPUs of its experts there. With balanced routing (the published
runs force it) of ``topk`` distinct experts out of ``E``, ``E/d`` per domain, a token reaches a
given other domain with probability ``p = 1 - C(E - E/d, topk) / C(E, topk)``. Per GPU and per
direction, for ``T`` routed tokens of ``h`` BF16 values:

- network: ``T·h·2 · (d-1)·p`` (the plain all-to-all sends ``T·topk·h·2 · (n-g)/n``);
- NVLink: local copies ``S·(g-1)/n`` plus the forwarded remote copies ``S·(n-g)/n·(g-1)/g``,
  with ``S = T·topk·h·2``.

The two phases are pipelined in chunks, so the time is the slower of the two (at the all-to-all
rates and size efficiency of :mod:`topologies.algorithms`) plus one collective latency. The combine
moves the same bytes in reverse. Inside one NVLink domain there is nothing to de-duplicate and the
plain all-to-all of :mod:`topologies.collectives` is used.

**The allgather dispatcher** (``moe_token_dispatcher_type="allgather"``, Megatron-Core's own default,
``MoEAllGatherTokenDispatcher`` in ``transformer/moe/token_dispatcher.py``): every rank gathers
*all* tokens of its expert-tensor-and-model-parallel group (``tp_ep``: etp × ep ranks, consecutive
in rank order) and picks those routed to its local experts. Per MoE layer and micro-batch, with
``T`` the tokens of one rank (sequence-parallel shard), ``n = etp·ep``, ``E`` experts, ``h``:

- forward dispatch: all-gathers of the routing map (``[T, E]`` bool, 1 B), the routing
  probabilities (``[T, E]`` in the router's dtype, BF16 by default) and the hidden states
  (``[T, h]`` BF16), each ``n·T·width`` bytes gathered; forward combine: a reduce-scatter of the
  experts' outputs ``[n·T, h]`` back to ``[T, h]``;
- backward: the combine's all-gather of the output gradient, the dispatch's reduce-scatters of the
  hidden-state and probability gradients (the routing map has none).

Nothing crosses an etp group separately (etp is inside the group). Its compute (the permutation of
the gathered tokens and the scatter-add of the outputs into the gathered buffer) is in
:mod:`workloads.operations`.
"""

from __future__ import annotations

from functools import lru_cache
from math import comb
from typing import Literal

from topologies.algorithms import links_for, saturation
from topologies.collectives import collective_cost
from topologies.groups import GroupShape
from topologies.hardware import SystemSpec
from workloads.comm import CollectiveCall

Dispatcher = Literal["flex", "alltoall", "allgather"]
DEFAULT_DISPATCHER: Dispatcher = "flex"  # what the Megatron-Bridge perf recipes run (module docstring)


def domain_hit_probability(num_experts: int, topk: int, domains: int) -> float:
    """Probability (0..1) that a token's ``topk`` distinct experts include one of a given domain's."""
    if domains <= 1:
        return 1.0
    per_domain = num_experts // domains
    k = min(topk, num_experts)
    return 1.0 - comb(num_experts - per_domain, k) / comb(num_experts, k)


def dispatch_bytes_per_gpu(tokens: int, hidden: int, num_experts: int, topk: int, shape: GroupShape,
                           dispatcher: Dispatcher = DEFAULT_DISPATCHER,
                           act_bytes: int = 2) -> tuple[float, float]:
    """(NVLink bytes, network bytes) one GPU sends per direction for one dispatch (or combine).

    ``tokens`` are the tokens this rank routes, ``shape`` the expert-parallel group.
    """
    n, g, d = shape.size, shape.ranks_per_domain, shape.domains
    send = float(tokens) * topk * hidden * act_bytes
    if d <= 1:
        return send * (n - 1) / n, 0.0
    if dispatcher == "alltoall":
        return send * (g - 1) / n, send * (n - g) / n
    p = domain_hit_probability(num_experts, topk, d)
    net = float(tokens) * hidden * act_bytes * (d - 1) * p
    nvl = send * (g - 1) / n + send * (n - g) / n * (g - 1) / g
    return nvl, net


@lru_cache(maxsize=4096)
def dispatch_cost(tokens: int, hidden: int, num_experts: int, topk: int, shape: GroupShape,
                  system: SystemSpec, dispatcher: Dispatcher = DEFAULT_DISPATCHER) -> tuple[float, float, str]:
    """(seconds, latency seconds, bottleneck link "nvlink" | "network") of one dispatch (or combine).

    Memoised (the analytic engine asks once per layer kind and scenario)."""
    send = float(tokens) * topk * hidden * 2
    if shape.size <= 1 or send <= 0:
        return 0.0, 0.0, "nvlink"
    if shape.domains <= 1 or dispatcher == "alltoall":
        cost = collective_cost("all_to_all", send, shape, system)
        nvl_b, net_b = cost.nvlink_bytes_per_gpu, cost.network_bytes_per_gpu
        lk = links_for(system)
        link = "network" if net_b and net_b / lk.network_Bps(shape) > nvl_b / lk.alltoall_nvlink_Bps else "nvlink"
        return cost.time_s, min(cost.latency_s, cost.time_s), link
    lk, e = links_for(system), system.efficiency
    nvl_b, net_b = dispatch_bytes_per_gpu(tokens, hidden, num_experts, topk, shape, dispatcher)
    sat = saturation(send / shape.size, e.alltoall_half_saturation_bytes, e.min_size_efficiency)
    t_nvl = nvl_b / lk.alltoall_nvlink_Bps
    t_net = net_b / lk.network_Bps(shape)
    latency = e.collective_base_latency_s + e.network_step_latency_s
    return latency + max(t_nvl, t_net) / sat, latency, "network" if t_net > t_nvl else "nvlink"


ROUTING_MAP_BYTES = 1  # torch.bool
PROB_BYTES = 2  # router probabilities in the activation dtype (Megatron moe_router_dtype unset)


def allgather_dispatch_calls(tokens: int, hidden: int, num_experts: int, group_size: int,
                             act_bytes: int = 2, prob_bytes: int = PROB_BYTES
                             ) -> tuple[tuple[CollectiveCall, ...], tuple[CollectiveCall, ...]]:
    """(forward, backward) collectives of the allgather dispatcher for one MoE layer and micro-batch.

    ``tokens``: the rank's tokens (sequence-parallel shard); ``group_size``: etp·ep. Sizes follow the
    nccl-tests convention (the whole gathered array, bytes). Empty for a group of one rank.
    """
    if group_size <= 1:
        return (), ()
    n, t = group_size, tokens

    def call(op: str, width: int, dtype: str, nbytes: int, phase: str) -> CollectiveCall:
        return CollectiveCall(op, "etp_ep", n, dtype, n * t * width * nbytes, 1, phase)  # type: ignore[arg-type]

    fwd = (call("all_gather", num_experts, "bool", ROUTING_MAP_BYTES, "moe_dispatch_routing_map"),
           call("all_gather", num_experts, "bf16", prob_bytes, "moe_dispatch_probs"),
           call("all_gather", hidden, "bf16", act_bytes, "moe_dispatch_tokens"),
           call("reduce_scatter", hidden, "bf16", act_bytes, "moe_combine"))
    bwd = (call("all_gather", hidden, "bf16", act_bytes, "moe_combine_grad"),
           call("reduce_scatter", hidden, "bf16", act_bytes, "moe_dispatch_tokens_grad"),
           call("reduce_scatter", num_experts, "bf16", prob_bytes, "moe_dispatch_probs_grad"))
    return fwd, bwd
