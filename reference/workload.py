"""The reference workload: a small transformer-shaped parameter set from the project's inventory.

Shapes come from :func:`workloads.inventory.build_inventory` on a tiny :class:`ModelSpec`, so the
reference and the cost model talk about the same tensors (fused QKV, SwiGLU fc1, row- and
column-parallel matrices, router, MoE experts, vocabulary-parallel embedding and output layer).
Experts of one layer become separate 2-D parameters (TE ``GroupedLinear``: ``weight0..E-1``).

Parameters and gradients are deterministic functions of (seed, name[, step, dp index]); every
rank creates the *global* tensor and keeps its tensor-parallel shard. Gradients are dyadic
rationals with at most 11 significant bits, so summing a handful of them in fp32 is exact in any
order: data-parallel reductions are then bitwise reproducible, which is what lets the tests
compare distributed and single-process results bitwise.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

from topologies.inputs import UserInputError, guess_hint
from workloads.flops import newton_schulz_cost_proxy
from workloads.inventory import TensorSpec, build_inventory
from workloads.models import GqaAttention, ModelSpec, load_model

MAX_PARAMS = 50_000_000  # the reference runs on CPUs: refuse anything bigger

SHAPE_PRESETS: dict[str, dict] = {
    # 2 layers (1 dense, 1 MoE with 4 experts), GQA 8 heads / 4 groups, hidden 64, vocab 256
    "tiny": dict(
        name="reference-tiny", num_layers=2, hidden_size=64, ffn_hidden_size=128, vocab_size=256,
        attention=dict(kind="gqa", num_heads=8, num_kv_heads=4, head_dim=8),
        moe=dict(num_experts=4, topk=2, expert_ffn_hidden_size=32, first_dense_layers=1),
    ),
    # dense only, no experts
    "tiny-dense": dict(
        name="reference-tiny-dense", num_layers=2, hidden_size=64, ffn_hidden_size=128, vocab_size=256,
        attention=dict(kind="gqa", num_heads=8, num_kv_heads=4, head_dim=8),
    ),
    # larger matrices for timing (benchmarks): ~6 M parameters
    "small": dict(
        name="reference-small", num_layers=4, hidden_size=256, ffn_hidden_size=1024, vocab_size=2048,
        attention=dict(kind="gqa", num_heads=8, num_kv_heads=4, head_dim=32),
        moe=dict(num_experts=4, topk=2, expert_ffn_hidden_size=256, first_dense_layers=2),
    ),
    # hundreds of small matrices (7 MoE layers x 32 experts x 2, plus attention): launch-bound
    # optimizer steps, where per-tensor kernel costs dominate the FLOPs (473 matrices, ~6 M parameters)
    "many-small": dict(
        name="reference-many-small", num_layers=8, hidden_size=128, ffn_hidden_size=256, vocab_size=1024,
        attention=dict(kind="gqa", num_heads=8, num_kv_heads=4, head_dim=16),
        moe=dict(num_experts=32, topk=2, expert_ffn_hidden_size=64, first_dense_layers=1),
    ),
}


def load_shapes(name_or_path: str) -> ModelSpec:
    """A shape preset (``tiny``, ``tiny-dense``, ``small``, ``many-small``) or a model YAML file / catalogue name."""
    if name_or_path in SHAPE_PRESETS:
        return ModelSpec.model_validate(SHAPE_PRESETS[name_or_path])
    try:
        model = load_model(name_or_path)
    except UserInputError:
        if name_or_path.endswith((".yaml", ".yml")) or "/" in name_or_path:
            raise  # a file: its own error (missing, malformed, a bad key) is the one to fix
        known = ", ".join(SHAPE_PRESETS)
        raise UserInputError(f"unknown shapes '{name_or_path}'{guess_hint(name_or_path, SHAPE_PRESETS)}; known presets: {known} "
                             "(or a model YAML file / catalogue model small enough to run)") from None
    total = build_inventory(model).params_total
    if total > MAX_PARAMS:
        raise UserInputError(
            f"shapes '{name_or_path}' has {total:,} parameters; the reference backend runs at most "
            f"{MAX_PARAMS:,} (use a smaller model file)")
    return model


def shape_names(text: str) -> list[str]:
    """Comma-separated shape presets / model files (``small,many-small``), each checked with
    :func:`load_shapes` (one-line UserInputError)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UserInputError(f"shapes '{text}': give at least one of {', '.join(SHAPE_PRESETS)} or a model file")
    for name in names:
        load_shapes(name)
    return names


@dataclass(frozen=True)
class ParamSpec:
    """One parameter of the reference model (one expert copy for experts): a named view of the
    inventory's :class:`TensorSpec`, so the reference and the cost model share shapes and sharding.

    ``shard_dim``/``shards`` split the global shape over the ``shard_group`` ('tp' or 'etp');
    ``dp_group`` is where its gradient is reduced ('dp' or 'expert_dp'); ``order`` is the
    definition (forward) order.
    """

    name: str
    order: int
    tensor: TensorSpec
    qkv_groups: int = 0
    qkv_split: tuple[int, ...] = ()

    role = property(lambda self: self.tensor.role)
    global_shape = property(lambda self: self.tensor.global_shape)
    shard_dim = property(lambda self: self.tensor.shard_dim)
    shards = property(lambda self: self.tensor.shards)
    shard_group = property(lambda self: self.tensor.shard_group)
    dp_group = property(lambda self: self.tensor.dp_group)
    optimizer = property(lambda self: self.tensor.optimizer)  # 'muon' or 'adamw'
    local_shape = property(lambda self: self.tensor.local_shape)  # this rank's tensor-parallel shard
    local_numel = property(lambda self: self.tensor.local_numel)

    @property
    def weight_decay(self) -> bool:
        """Whether weight decay applies: Megatron-Core's default parameter groups exempt biases and
        1-D parameters (norms) — ``no_wd = name.endswith(".bias") or len(param.shape) == 1``."""
        return not (self.name.endswith(".bias") or len(self.global_shape) == 1)

    @property
    def is_expert(self) -> bool:
        """Reduced over the expert data-parallel group."""
        return self.dp_group == "expert_dp"

    @property
    def ns_cost(self) -> int:
        """Megatron's load-balancing cost of the local tensor: max·min² (numel if not 2-D)."""
        if len(self.local_shape) != 2:
            return self.local_numel
        return newton_schulz_cost_proxy(*self.local_shape)


def param_specs(model: ModelSpec, tp: int, etp: int, split_qkv: bool) -> list[ParamSpec]:
    """Every trainable parameter of ``model`` under tp/etp (pp = ep = 1), in definition order."""
    inv = build_inventory(model, tp=tp, pp=1, vpp=1, ep=1, etp=etp, split_qkv=split_qkv)
    att = model.attention
    out: list[ParamSpec] = []
    for t in inv.tensors:
        if t.optimizer == "none":
            continue
        qkv_groups = 0
        qkv_split: tuple[int, ...] = ()
        if t.role == "qkv" and split_qkv and isinstance(att, GqaAttention):
            d = att.head_dim
            qkv_groups = att.num_kv_heads
            qkv_split = (att.num_heads // att.num_kv_heads * d, d, d)
        copies = [f"{t.name}{e}" for e in range(t.num_experts)] if t.num_experts > 1 else [t.name]
        for name in copies:
            out.append(ParamSpec(name=name, order=len(out), tensor=t, qkv_groups=qkv_groups, qkv_split=qkv_split))
    return out


def _generator(*key: object) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(zlib.crc32(repr(key).encode()) & 0x7FFF_FFFF)
    return gen


def initial_param(spec: ParamSpec, seed: int) -> torch.Tensor:
    """The global fp32 initial value: N(0, 0.02²), norms start at 1 (deterministic)."""
    if spec.role == "norm":
        return torch.ones(spec.global_shape)
    return torch.randn(spec.global_shape, generator=_generator(seed, "param", spec.name)) * 0.02


def synthetic_grad(spec: ParamSpec, seed: int, step: int, dp_index: int) -> torch.Tensor:
    """The global fp32 gradient of data-parallel replica ``dp_index`` at ``step``.

    Values are k·2⁻¹⁴ with |k| < 2¹¹ (dyadic): sums of up to 2¹² replicas are exact in fp32.
    """
    z = torch.randn(spec.global_shape, generator=_generator(seed, "grad", spec.name, step, dp_index))
    k = torch.round(z * 256).clamp_(-2047, 2047)
    return k * 2.0 ** -14


def local_shard(tensor: torch.Tensor, spec: ParamSpec, shard_rank: int) -> torch.Tensor:
    """The ``shard_rank``-th tensor-parallel shard of a global tensor (a contiguous copy)."""
    if spec.shard_dim is None:
        return tensor.clone()
    return tensor.chunk(spec.shards, dim=spec.shard_dim)[shard_rank].contiguous()


def mean_grad(spec: ParamSpec, seed: int, step: int, replicas: int) -> torch.Tensor:
    """The data-parallel mean gradient: exact sum over replicas in index order, times 1/replicas."""
    total = synthetic_grad(spec, seed, step, 0)
    for i in range(1, replicas):
        total = total + synthetic_grad(spec, seed, step, i)
    return total.mul_(1.0 / replicas) if replicas > 1 else total
