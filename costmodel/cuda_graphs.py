"""Which operations CUDA graphs capture (``RuntimeSettings.cuda_graph_impl`` / ``cuda_graph_scope``).

Captured kernels are replayed from a graph: they cost their GPU time but no host issue time
(:mod:`costmodel.kernels`); each replayed graph costs one issue. What each setting captures follows
Megatron-Core 0.16.1 (``transformer_config.py`` checks, ``TransformerLayer._get_submodules_under_cudagraphs``
and ``_te_cuda_graph_capture``), mapped onto the operations of :mod:`workloads.operations` by
their ``module`` (and, for norms, their name):

========================  =====================================================================
setting                   captured operations (forward and backward, recompute included)
========================  =====================================================================
impl ``none``             nothing
impl ``full_iteration``   every forward/backward operation of every layer, embedding, output and
(or scope                 MTP block: the whole forward-backward of the step is one graph
``full_iteration``)       (Megatron's ``FullCudaGraphWrapper``; the optimizer step is not in it)
scope empty / ``full``    every operation of each transformer layer (dense and MoE), one graph
                          per layer and pass; not the embedding, output layer, loss or MTP block
``attn``                  the attention block: ``input_layernorm``, the q/kv norms, modules
                          ``attn_proj``, ``core_attn``, ``mla_up_proj`` (QKV, RoPE, core, output
                          projection, residual add)
``mlp``                   dense layers only: ``pre_mlp_layernorm`` and module ``mlp``
``moe``                   MoE layers only (Megatron requires drop-and-pad): ``pre_mlp_layernorm``
                          and the whole MoE block (router, preprocessing, permute, experts,
                          shared experts, unpermute, residual add)
``moe_router``            MoE layers only: ``pre_mlp_layernorm``, the router (``moe_router``) and
                          the shared experts (Megatron graphs them with the router unless
                          ``moe_shared_expert_overlap``)
``moe_preprocess``        with ``moe_router``: also the dispatch preprocessing (``moe_preprocess``)
``mamba``                 nothing here (no Mamba layers are modelled)
========================  =====================================================================

Each captured scope of a layer is one graph replay per pass (``attn`` and ``mlp`` are two).
"""

from __future__ import annotations

from dataclasses import dataclass

from workloads.operations import Operation
from workloads.runtime import RuntimeSettings

LAYER_KINDS = ("dense", "moe")
ATTENTION_MODULES = frozenset({"attn_proj", "core_attn", "mla_up_proj"})
ATTENTION_NORMS = frozenset({"input_layernorm", "q_layernorm", "kv_layernorm"})
MLP_MODULES = frozenset({"mlp"})
MOE_MODULES = frozenset({"mlp", "moe", "moe_act", "moe_router", "moe_preprocess", "shared_experts"})
ROUTER_MODULES = frozenset({"moe_router", "shared_experts"})


def _base_name(op: Operation) -> str:
    """The forward name of an operation (``recompute.`` prefix and ``.grad``-like suffixes removed)."""
    return op.name.removeprefix("recompute.").split(".")[0]


@dataclass(frozen=True)
class GraphCapture:
    """The CUDA-graph capture of a scenario (hashable; see the module docstring for what it covers)."""

    impl: str = "none"
    scopes: frozenset[str] = frozenset()

    @staticmethod
    def of(runtime: RuntimeSettings) -> GraphCapture:
        """The capture described by a scenario's runtime settings."""
        scopes = frozenset(s for s in runtime.cuda_graph_scope if s != "full")
        if runtime.cuda_graph_impl == "local" and scopes & {"moe_router", "moe_preprocess"}:
            scopes |= {"moe_router", "moe_preprocess"}  # MCore's local impl graphs both together
        return GraphCapture(runtime.cuda_graph_impl, scopes)

    @property
    def whole_iteration(self) -> bool:
        """True when the whole forward-backward of the step is one graph."""
        return self.impl == "full_iteration" or (self.impl != "none" and "full_iteration" in self.scopes)

    def _layer_scopes(self, kind: str) -> list[str]:
        """Scopes that apply to a layer of ``kind``, each one graph per pass."""
        if self.impl == "none" or kind not in LAYER_KINDS:
            return []
        if not self.scopes:
            return ["layer"]
        out = ["attn"] if "attn" in self.scopes else []
        if kind == "dense" and "mlp" in self.scopes:
            out.append("mlp")
        if kind == "moe" and "moe" in self.scopes:
            out.append("moe")
        elif kind == "moe" and "moe_router" in self.scopes:
            out.append("moe_router")
        return out

    def captures(self, op: Operation, kind: str) -> bool:
        """Whether ``op`` of a layer of ``kind`` (dense, moe, embedding, output, mtp) is replayed from a graph."""
        if self.whole_iteration:
            return True
        scopes = self._layer_scopes(kind)
        if not scopes:
            return False
        if "layer" in scopes:
            return True
        name, module = _base_name(op), op.module
        if "attn" in scopes and (module in ATTENTION_MODULES or name in ATTENTION_NORMS):
            return True
        if name == "pre_mlp_layernorm":
            return any(s in scopes for s in ("mlp", "moe", "moe_router"))
        if "mlp" in scopes:
            return module in MLP_MODULES
        if "moe" in scopes:
            return module in MOE_MODULES
        if "moe_router" in scopes:
            return module in ROUTER_MODULES or (module == "moe_preprocess" and "moe_preprocess" in self.scopes)
        return False

    def graphs_per_pass(self, kind: str) -> int:
        """Graph replays one forward (or backward) pass of a layer of ``kind`` issues."""
        return 0 if self.whole_iteration else len(self._layer_scopes(kind))


NO_GRAPHS = GraphCapture()
