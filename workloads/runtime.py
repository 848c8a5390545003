"""Runtime settings of a scenario: how the software stack runs the step (recipe settings).

Megatron-Core / Megatron-Bridge settings that change step time or memory without changing the
parallel layout: CUDA graphs, the MoE token dispatcher, communication overlaps, offloading,
environment variables that change an algorithm, ... Each field names the Megatron setting it
stands for; the cost model turns each into a mechanism (see the field descriptions for where).
The shipped ``megatron-bridge`` dataset fills them from the recipe-settings file, joined on
``run_id``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

CudaGraphImpl = Literal["none", "local", "transformer_engine", "full_iteration"]
CudaGraphScope = Literal["full", "attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba", "full_iteration"]
MoeDispatcher = Literal["allgather", "alltoall", "flex"]
FlexBackend = Literal["deepep", "hybridep"]


class RuntimeSettings(BaseModel):
    """Settings of the software stack that change step time or memory (defaults: Megatron-Core's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cuda_graph_impl: CudaGraphImpl = Field(
        "none", description="Megatron --cuda-graph-impl: none, local (per-layer MCore graphs), transformer_engine "
                            "(TE graphs of the cuda_graph_scope modules) or full_iteration (the whole forward-backward "
                            "step captured); captured kernels cost no host issue time")
    cuda_graph_scope: tuple[CudaGraphScope, ...] = Field(
        (), description="Megatron --cuda-graph-scope: modules captured by transformer_engine/local graphs "
                        "(empty = Megatron's default 'full': every layer)")
    moe_token_dispatcher_type: MoeDispatcher = Field(
        "flex", description="Megatron --moe-token-dispatcher-type: allgather (Megatron-Core's own default), alltoall, "
                            "or flex (DeepEP / HybridEP kernels, what the Megatron-Bridge MoE recipes use; muonsim's "
                            "default); see costmodel/moe_dispatch.py")
    moe_flex_dispatcher_backend: FlexBackend = Field(
        "hybridep", description="Megatron --moe-flex-dispatcher-backend for the flex dispatcher: deepep or hybridep")
