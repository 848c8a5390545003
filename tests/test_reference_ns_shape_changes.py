"""NS calls after a call of another shape: counted in the reference's update order, priced by the local fit.

The reference updates its Muon items in definition order (``DistOptimizer.for_each_owned``), one NS
call per item, per Q/K/V component of a split QKV (``orthogonalize_param``). The hand sequence below
follows the ``tiny`` preset (``reference.workload.SHAPE_PRESETS``): hidden 64, 8 heads of 8 in 4 query
groups (Q 4·2·8 = 64 rows, K and V 4·8 = 32 rows), SwiGLU ffn 128 (fc1 2·128 = 256 rows), layer 1 MoE
with a 4-row router and 4 experts of ffn 32 (fc1 64 rows, fc2 32 columns).
"""

from __future__ import annotations

import pytest

from costmodel.calibrate.profile import LocalMeasurements, NewtonSchulzFit
from costmodel.calibrate.reference_check import (
    check_reference_run,
    ns_shape_changes,
    reference_rank_kernels,
)
from costmodel.kernels import KernelSpec

TINY_NS_CALLS = (
    # layer 0 (dense): Q, K, V, proj, fc1, fc2
    [(64, 64), (32, 64), (32, 64), (64, 64), (256, 64), (64, 128)]
    # layer 1 (MoE): Q, K, V, proj, router, 4 expert fc1, 4 expert fc2
    + [(64, 64), (32, 64), (32, 64), (64, 64), (4, 64)] + [(64, 64)] * 4 + [(64, 32)] * 4
)
# changes: Q0 (first call), K0, proj0, fc1, fc2, Q1, K1, proj1, router, expert fc1 (first), expert fc2 (first)
TINY_CHANGES = 11


def test_shape_changes_count_the_first_call_and_every_new_shape():
    assert ns_shape_changes([]) == 0
    assert ns_shape_changes([(4, 8)]) == 1
    assert ns_shape_changes([(4, 8), (4, 8), (8, 4), (4, 8), (4, 8)]) == 3
    assert ns_shape_changes(TINY_NS_CALLS) == TINY_CHANGES


def test_tiny_rank_changes_shape_eleven_times_per_step():
    """One rank owns every Muon item (world 1): the hand sequence above, 11 changes."""
    from reference.config import make_config
    from reference.workload import load_shapes

    config = make_config(world_size=1, shapes="tiny", check=False).model_dump(mode="json")
    rk = reference_rank_kernels(load_shapes("tiny"), config, 0)
    assert len(rk.names) == 15  # 13 matrices above, 2 of them split QKV
    assert rk.ns_shape_changes == TINY_CHANGES


def test_local_pricing_charges_each_shape_change():
    """kernels_time_s: 2 copies of 1 MB at 2 us + 1 MB / 10 GB/s, 3 NS calls at 20 us, 2 changes at 30 us."""
    local = LocalMeasurements(gemm_flops_per_s={"bf16": 5e11}, dispatch_s=2e-6, memory_Bps=1e10,
                              newton_schulz={"bf16": NewtonSchulzFit(efficiency=0.8, call_overhead_s=2e-5,
                                                                     shape_change_s=3e-5)})
    copy = KernelSpec("copy", "memory", 2, bytes=1e6)
    assert local.kernels_time_s([copy], ns_calls=3, ns_shape_changes=2) == pytest.approx(
        2 * (2e-6 + 1e-4) + 3 * 2e-5 + 2 * 3e-5)
    assert local.kernels_time_s([copy], ns_calls=3) == pytest.approx(2 * (2e-6 + 1e-4) + 3 * 2e-5)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):  # noqa: ANN201
    """A real 1-rank ``tiny`` run (one step), loaded as a MeasuredRun."""
    pytest.importorskip("torch")
    from reference.api import run_reference
    from workloads.loaders import load_runs

    path = tmp_path_factory.mktemp("tiny") / "run.json"
    run_reference({"world_size": 1, "shapes": "tiny", "steps": 1, "check": False}).write_json(path)
    (run,) = load_runs(path)
    return run


BASE = LocalMeasurements(gemm_flops_per_s={"bf16": 4e11, "fp32": 1e11}, dispatch_s=2e-6, memory_Bps=2e10,
                         newton_schulz={"bf16": NewtonSchulzFit(efficiency=0.8, call_overhead_s=0.0)})


def _predicted(run, local: LocalMeasurements) -> dict[str, float]:  # noqa: ANN001
    from reference.workload import load_shapes

    return {p.phase: p.predicted_s for p in check_reference_run(run, local, load_shapes("tiny")).phases if p.rank == 0}


def test_reference_check_adds_the_shape_changes_to_both_phases(tiny_run):
    """Raising shape_change_s by 1 ms raises the predicted NS and optimizer phases by exactly 11 ms
    (the hand count)."""
    more = BASE.model_copy(update={"newton_schulz": {"bf16": NewtonSchulzFit(efficiency=0.8, call_overhead_s=0.0,
                                                                             shape_change_s=1e-3)}})
    before, after = _predicted(tiny_run, BASE), _predicted(tiny_run, more)
    for phase in ("newton_schulz", "optimizer"):
        assert after[phase] - before[phase] == pytest.approx(TINY_CHANGES * 1e-3)


def test_reference_check_adds_the_host_layers_per_call_and_per_tensor(tiny_run):
    """2 ms per orthogonaliser call and 1 ms per Muon tensor update: the 19 NS calls of the hand
    sequence add 38 ms to the NS phase; the optimizer phase adds those and 15 tensors x 1 ms."""
    assert len(TINY_NS_CALLS) == 19
    more = BASE.model_copy(update={"muon_orthogonalize_host_s": 2e-3, "muon_update_host_s": 1e-3})
    before, after = _predicted(tiny_run, BASE), _predicted(tiny_run, more)
    assert after["newton_schulz"] - before["newton_schulz"] == pytest.approx(19 * 2e-3)
    assert after["optimizer"] - before["optimizer"] == pytest.approx(19 * 2e-3 + 15 * 1e-3)


def test_host_probe_times_the_reference_update_of_the_tiny_router():
    """The probe is the smallest plain Muon matrix of ``tiny``: the 4-expert router, 4 x 64; measuring
    it gives the two host quantities (>= 0; the machine decides their values)."""
    pytest.importorskip("torch")
    from cli.reference_host import measure_reference_host
    from reference.host_probe import muon_probe

    probe = muon_probe()
    assert probe.shape == (4, 64) and probe.name.endswith("router.weight")
    local = measure_reference_host(BASE)
    assert local.muon_update_host_s is not None and local.muon_update_host_s >= 0
    assert local.muon_orthogonalize_host_s is not None and local.muon_orthogonalize_host_s >= 0


def test_host_probe_times_only_the_call_not_the_context_before_it():
    """``cpu_s_after`` times each call of ``fn`` after ``before`` has run, and counts none of
    ``before``: a ``before`` burning >= 2 ms of CPU per call ahead of an empty ``fn`` gives well under
    1 ms per call (the clock itself costs ~1 us)."""
    import time

    from cli.reference_host import cpu_s_after

    def burn() -> None:
        t0 = time.thread_time()
        while time.thread_time() - t0 < 2e-3:
            pass

    assert cpu_s_after(lambda: None, burn, calls=5) < 1e-4


def test_host_probe_context_call_is_on_the_main_gemm_path():
    """The context call before each probe call must evict (an NS call on oneDNN's main path, see
    ``cli.reference_host``): every GEMM of a 128 x 128 NS call is 2·128³ FLOPs ≈ 4.2 MFLOP, above the
    small path's 2·16³ ≈ 8.2 kFLOP bound (torch's plain loop for m·n·k ≤ 16³)."""
    from cli.reference_host import CONTEXT_NS_SHAPE

    m = min(CONTEXT_NS_SHAPE)
    assert 2.0 * m * m * max(CONTEXT_NS_SHAPE) > 2.0 * 16 ** 3
