"""Weight casts re-priced per micro-batch count (costmodel.layer_template) equal a fresh layer build."""

from __future__ import annotations

import pytest

from costmodel.cuda_graphs import NO_GRAPHS, GraphCapture
from costmodel.layer_costs import host_slack_s, layer_ops, layer_parts, ops_time, python_calls
from costmodel.layer_template import layer_compute_s
from topologies.hardware import load_system
from workloads.models import load_model
from workloads.operations import KernelOptions, RankShape, recast_operation, weight_cast_operation


def test_weight_cast_spreads_the_weights_over_the_micro_batches() -> None:
    # 100 input elements, 1,000 weight elements, 2 launches, 6 bytes per element, 4 micro-batches:
    # (100 + 1000 / 4) x 6 = 2,100 bytes in 2 x (1 + 1/4) = 2.5 launches per micro-batch
    op = weight_cast_operation("fc1.cast", "mlp", (100, 1000, 2, 6.0), 4)
    assert op.bytes == 2100.0
    assert op.kernels == 2.5
    again = recast_operation(op, 1)  # one micro-batch: every weight cast in it
    assert (again.bytes, again.kernels, again.name, again.phase) == (6600.0, 4.0, "fc1.cast", "fwd")


def test_only_the_weight_casts_depend_on_the_micro_batches() -> None:
    model = load_model("deepseek-v3")
    ops = [layer_ops(model, RankShape(1, 4096, ep=8, precision="mxfp8", microbatches=mb), "moe", "full", ())
           for mb in (1, 8)]
    for a, b in zip(ops[0].forward + ops[0].backward, ops[1].forward + ops[1].backward, strict=True):
        assert (a == b) == (a.weight_cast is None), a.name
        assert recast_operation(a, 8) == b
        # the template keeps the framework calls (hence the host time and its windows' shares) of one micro-batch
        assert python_calls(a) == python_calls(b), a.name


@pytest.mark.parametrize("precision", ["mxfp8", "fp8-cs", "bf16"])
@pytest.mark.parametrize("kind,recompute,modules", [("moe", "none", ()), ("moe", "full", ()), ("mtp", "none", ()),
                                                    ("moe", "selective", ("moe", "core_attn")), ("embedding", "none", ()),
                                                    ("dense", "selective", ("mlp", "core_attn")),
                                                    ("output", "none", ())])
@pytest.mark.parametrize("capture", [NO_GRAPHS, GraphCapture("local", frozenset({"attn"}))])
@pytest.mark.parametrize("host_sync", [False, True])
@pytest.mark.parametrize("framework_host", [False, True])
def test_template_equals_a_fresh_build(precision: str, kind: str, recompute: str, modules: tuple[str, ...],
                                       capture: GraphCapture, host_sync: bool, framework_host: bool) -> None:
    # host_sync: the dispatcher copies token counts to the host (alltoall): the passes cut into windows;
    # framework_host: the framework's Python per pass (a calibrated profile's layer_host_s / moe_host_s,
    # 0 at datasheet values) shared by operations, so the template's replica of that sharing is checked
    model, system = load_model("deepseek-v3"), load_system("gb300-nvl72")
    if framework_host:
        host = {"layer_host_s": 4.2e-3, "moe_host_s": 2.9e-3}
        system = system.model_copy(update={"efficiency": system.efficiency.model_copy(update=host)})
    options = KernelOptions(dispatcher_host_sync=host_sync)
    for mb in (1, 3, 8, 64):
        shape = RankShape(2, 4096, tp=2, ep=8, sequence_parallel=True, precision=precision, microbatches=mb,
                          options=options)
        ops = layer_ops(model, shape, kind, recompute, modules)
        f, b, fa, ba = ops_time(ops, system, capture, kind)
        slack_f, slack_b = host_slack_s(ops, system, capture, kind)
        fresh = (f, b, fa, ba, layer_parts(ops, system), slack_f, slack_b)
        assert layer_compute_s(model, system, shape, kind, recompute, modules, capture) == fresh  # bit-identical
