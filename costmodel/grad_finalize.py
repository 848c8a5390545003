"""Gradient finalisation beyond the data-parallel reduction: the tied word-embedding all-reduce.

Megatron-Core's ``finalize_model_grads`` (``core/distributed/finalize_model_grads.py``) runs after
the data-parallel gradient synchronisation and before the optimizer step. With tied input
embedding and output layer (``share_embeddings_and_output_weights``, Megatron's default) and more
than one pipeline stage, the first stage holds the word embedding and the last stage holds its own
replica (``output_layer.weight``, allocated because the last stage does not hold the embedding);
``_allreduce_word_embedding_grads`` all-reduces the two ``main_grad`` tensors over the embedding
group (the first and last pipeline rank of the same tp/cp/dp position, two ranks) so both copies
step identically. The buffer is the whole local shard, ``V_pad/tp · h`` elements in the gradient
dtype (fp32 main grads by default, ``grad_reduce_dtype``).

It is synchronous and exposed: both stages wait for it before the gradient-norm synchronisation
that every rank meets, so in both engines it starts when the later of the two stages has reduced
its gradients and delays the barrier by its time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topologies.groups import GroupShape
from workloads.comm import CollectiveCall
from workloads.inventory import embedding_replica_numel

if TYPE_CHECKING:
    from workloads.scenario import Scenario


def embedding_group_shape(pp_shape: GroupShape) -> GroupShape:
    """The two-rank embedding group (first and last pipeline stage): inside one NVLink domain when
    the pipeline group is, else one rank per domain."""
    return GroupShape(2, 2, 1) if pp_shape.intra_domain else GroupShape(2, 1, 2)


def embedding_grad_call(scenario: Scenario) -> CollectiveCall | None:
    """The tied word-embedding gradient all-reduce of one step (nccl-tests size in bytes), or None
    when there is no replica (untied embeddings, or one pipeline stage)."""
    p, opt = scenario.par, scenario.optimizer
    numel = embedding_replica_numel(scenario.model, p.tp, p.pp)
    if numel == 0:
        return None
    dtype = "fp32" if opt.grad_bytes == 4 else "bf16"
    return CollectiveCall("all_reduce", "pp", 2, dtype, numel * opt.grad_bytes, 1, "embedding_grad")
