"""Assignment of transformer layers to pipeline stages and virtual (interleaved) chunks.

Megatron numbers virtual stages chunk-major: virtual stage ``v = chunk * pp + stage`` holds a
contiguous block of layers, and virtual stages run in order 0, 1, ..., pp*vpp-1. Three ways to
split, in Megatron's order of precedence (:class:`StageSplit`):

1. an explicit ``pipeline_model_parallel_layout`` (Megatron ``PipelineParallelLayerLayout``): one
   entry per virtual stage, chunk-major, of ``E`` (embedding), ``t`` (transformer layer), ``m``
   (MTP layer), ``L`` (output layer and loss), written as a string with repetitions and ``|``
   between stages (``Et*4|(t*4|)*14tmL``: 16 virtual stages, the first with the embedding and 4
   layers, 14 of 4 layers, the last with 1 layer, the MTP layer and the loss) or as the list of
   lists Megatron-Bridge prints (``[['embedding', 'decoder'], ...]``, names ``embedding``,
   ``decoder``, ``mtp``, ``loss``);
2. ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``: the
   embedding and the loss each count as one layer; the ``layers + 1 + 1`` are split evenly over the
   virtual stages (Megatron asserts divisibility) and the first / last virtual stage builds one
   transformer layer fewer;
3. otherwise an even split when the layer count divides, else muonsim's stated policy for the
   remainder (``balanced``): layers spread as evenly as possible, lighter virtual stages first and
   last because they also hold the embedding and the output layer with the loss.

The embedding is on the first virtual stage, the output layer and the MTP layers on the last
(muonsim requires it of a layout; Megatron-Bridge's layouts all do so).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from topologies.inputs import UserInputError

PipelineSplit = Literal["auto", "even", "balanced"]
_LIST_NAMES = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}
_GROUP = re.compile(r"\(([^()]*)\)\*(\d+)")
_REPEAT = re.compile(r"([EtmL])\*(\d+)")


def parse_pipeline_layout(text: str) -> tuple[str, ...]:
    """The virtual stages of a Megatron pipeline layout, each a string of ``E``/``t``/``m``/``L``.

    Raises UserInputError (one line) on text that is neither the string nor the list form.
    """
    raw = text.strip()
    if raw.startswith("["):
        try:
            stages = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            raise UserInputError(f"pipeline_model_parallel_layout: not a readable list of stages: {raw[:60]!r}") from None
        if not isinstance(stages, list | tuple) or not all(isinstance(st, list | tuple) for st in stages):
            raise UserInputError("pipeline_model_parallel_layout: expected a list of stages, each a list of layer names")
        out = []
        for st in stages:
            bad = [x for x in st if x not in _LIST_NAMES]
            if bad:
                raise UserInputError(f"pipeline_model_parallel_layout: unknown layer name '{bad[0]}'; "
                                     f"valid: {', '.join(_LIST_NAMES)}")
            out.append("".join(_LIST_NAMES[x] for x in st))
        return tuple(out)
    expanded = raw.replace(" ", "")
    while True:
        new = _GROUP.sub(lambda m: m.group(1) * int(m.group(2)), expanded)
        if new == expanded:
            break
        expanded = new
    expanded = _REPEAT.sub(lambda m: m.group(1) * int(m.group(2)), expanded)
    if not re.fullmatch(r"[EtmL|]*", expanded):
        raise UserInputError(f"pipeline_model_parallel_layout '{raw}': use E, t, m, L, '|', 'X*n' and '(...)*n'")
    return tuple(expanded.split("|"))


@dataclass(frozen=True)
class StageSplit:
    """How layers are split over virtual stages (see the module docstring; hashable)."""

    mode: PipelineSplit = "auto"
    layout: str | None = None
    account_for_embedding: bool = False
    account_for_loss: bool = False


def layout_layer_counts(layout: str, num_layers: int, pp: int, vpp: int, mtp_layers: int = 0) -> list[int]:
    """Transformer layers per virtual stage of an explicit layout, checked against the model and sizes."""
    stages = parse_pipeline_layout(layout)
    where = f"pipeline_model_parallel_layout '{layout[:60]}'"
    if len(stages) != pp * vpp:
        raise UserInputError(f"{where} has {len(stages)} virtual stages; pp·vpp = {pp * vpp}")
    counts = [st.count("t") for st in stages]
    if sum(counts) != num_layers:
        raise UserInputError(f"{where} places {sum(counts)} transformer layers; the model has {num_layers}")
    if "".join(stages).count("m") != mtp_layers:
        raise UserInputError(f"{where} places {''.join(stages).count('m')} MTP layers; the model has {mtp_layers}")
    if any("E" in st for st in stages[1:]) or "E" not in stages[0]:
        raise UserInputError(f"{where}: the embedding (E) must be on the first virtual stage only")
    if any("L" in st or "m" in st for st in stages[:-1]) or "L" not in stages[-1]:
        raise UserInputError(f"{where}: the loss (L) and MTP layers (m) must be on the last virtual stage")
    return counts


def virtual_stage_layer_counts(num_layers: int, pp: int, vpp: int, split: PipelineSplit | StageSplit = "auto",
                               mtp_layers: int = 0) -> list[int]:
    """Layers per virtual stage, indexed ``chunk * pp + stage`` (length pp*vpp); see
    :func:`_stage_layer_counts` (memoised here: every scenario's validation asks)."""
    return list(_cached_counts(num_layers, pp, vpp, split, mtp_layers))


@lru_cache(maxsize=4096)
def _cached_counts(num_layers: int, pp: int, vpp: int, split: PipelineSplit | StageSplit,
                   mtp_layers: int) -> tuple[int, ...]:
    return tuple(_stage_layer_counts(num_layers, pp, vpp, split, mtp_layers))


def _stage_layer_counts(num_layers: int, pp: int, vpp: int, split: PipelineSplit | StageSplit = "auto",
                        mtp_layers: int = 0) -> list[int]:
    """Layers per virtual stage, indexed ``chunk * pp + stage`` (length pp*vpp).

    ``split``: a :class:`StageSplit` (layout, account-for flags, then its mode) or a mode: ``even``
    requires pp*vpp to divide the layers; ``auto`` uses even when possible, errors when the
    layers divide over pp but not over vpp, and otherwise falls back to ``balanced``, which may leave
    the first and last virtual stages without transformer layers when pp*vpp exceeds the layers.
    """
    stages = pp * vpp
    if isinstance(split, StageSplit):
        if split.layout is not None:
            return layout_layer_counts(split.layout, num_layers, pp, vpp, mtp_layers)
        extra = int(split.account_for_embedding) + int(split.account_for_loss)
        if extra:
            total = num_layers + extra
            if total % stages:
                raise UserInputError(
                    f"{num_layers} layers + {extra} (embedding/loss accounted for in the pipeline split) are not "
                    f"divisible by pp·vpp = {stages} (Megatron asserts it)")
            counts = [total // stages] * stages
            counts[0] -= int(split.account_for_embedding)
            counts[-1] -= int(split.account_for_loss)
            return counts
        split = split.mode
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


def layer_placement(num_layers: int, pp: int, vpp: int, split: PipelineSplit | StageSplit = "auto",
                    mtp_layers: int = 0) -> list[tuple[int, int]]:
    """For each main layer, its (pipeline stage, virtual chunk)."""
    counts = virtual_stage_layer_counts(num_layers, pp, vpp, split, mtp_layers)
    placement: list[tuple[int, int]] = []
    for v, n in enumerate(counts):
        chunk, stage = divmod(v, pp)
        placement.extend([(stage, chunk)] * n)
    return placement


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
