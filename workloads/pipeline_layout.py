"""Assignment of transformer layers to pipeline stages and virtual (interleaved) chunks.

Megatron numbers virtual stages chunk-major: virtual stage ``v = chunk * pp + stage`` holds a
contiguous block of layers, and virtual stages run in order 0, 1, ..., pp*vpp-1. When the layer
count divides evenly the split is even. When it does not (Kimi K2 and DeepSeek-V3 have 61 layers),
Megatron-Bridge recipes give an explicit ``pipeline_model_parallel_layout``; muonsim's stated
policy for that case is the balanced layout below: layers spread as evenly as possible, with the
lighter virtual stages placed first and last because they also hold the embedding and the output
layer with the loss. MTP layers always sit after the last main layer on the last virtual stage.
"""

from __future__ import annotations

from typing import Literal

from topologies.inputs import UserInputError

PipelineSplit = Literal["auto", "even", "balanced"]


def virtual_stage_layer_counts(num_layers: int, pp: int, vpp: int, split: PipelineSplit = "auto") -> list[int]:
    """Layers per virtual stage, indexed ``chunk * pp + stage`` (length pp*vpp).

    ``even`` requires pp*vpp to divide the layers; ``auto`` uses even when possible, errors when the
    layers divide over pp but not over vpp, and otherwise falls back to ``balanced``, which may leave
    the first and last virtual stages without transformer layers when pp*vpp exceeds the layers.
    """
    stages = pp * vpp
    # like Megatron's account_for_embedding/loss_in_pipeline_split, the embedding and the loss may
    # each fill a virtual stage of their own (Llama 3.1 405B: 126 layers on pp 16 x vpp 8)
    limit = num_layers if split == "even" else num_layers + 2
    if stages > limit:
        plus = "" if split == "even" else " + 2 (embedding and loss)"
        raise UserInputError(
            f"pp·vpp = {stages} virtual pipeline stages exceed the model's {num_layers} layers{plus}; use a smaller pp or vpp"
        )
    if num_layers % stages == 0 and split in ("auto", "even"):
        return [num_layers // stages] * stages
    if split == "even" or (split == "auto" and num_layers % pp == 0):
        if num_layers % pp:
            raise UserInputError(f"pp {pp} does not divide the model's {num_layers} layers (pipeline_split 'even')")
        raise UserInputError(
            f"vpp {vpp} does not divide the {num_layers // pp} layers per pipeline stage "
            f"({num_layers} layers / pp {pp}); valid vpp: {', '.join(map(str, _divisors(num_layers // pp)))}"
        )
    base, extra = divmod(num_layers, stages)
    counts = [base] * stages
    # the heavier stages are the middle ones: first and last hold embedding / output layer + loss
    order = sorted(range(stages), key=lambda v: (v in (0, stages - 1), abs(v - (stages - 1) / 2)))
    for v in order[:extra]:
        counts[v] += 1
    return counts


def layer_placement(num_layers: int, pp: int, vpp: int, split: PipelineSplit = "auto") -> list[tuple[int, int]]:
    """For each main layer, its (pipeline stage, virtual chunk)."""
    counts = virtual_stage_layer_counts(num_layers, pp, vpp, split)
    placement: list[tuple[int, int]] = []
    for v, n in enumerate(counts):
        chunk, stage = divmod(v, pp)
        placement.extend([(stage, chunk)] * n)
    return placement


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
