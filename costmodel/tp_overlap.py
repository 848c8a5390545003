"""TP-communication overlap (``tp_comm_overlap``, Transformer Engine userbuffers), per GEMM.

With sequence parallelism each column/row-parallel GEMM pair (attention QKV + output projection,
MLP fc1 + fc2, shared-expert fc1 + fc2) has five TP collectives of ``tokens·h`` BF16 per
micro-batch, each overlapped with one GEMM by the method its ``tp_comm_overlap_cfg`` entry names
(:class:`workloads.runtime.TpOverlapGemmConfig`; Transformer Engine's defaults when the recipe
gives none). The mapping of collectives to userbuffers names follows TE ``initialize_ub``:

===============  =========================================  ==================================
cfg name         collective                                 overlapped with
===============  =========================================  ==================================
``qkv_fprop``    all-gather of x (forward)                  the QKV / fc1 forward GEMM
``proj_fprop``   reduce-scatter of y (forward)              the proj / fc2 forward GEMM
``proj_dgrad``   all-gather of dy (backward)                the proj / fc2 dgrad GEMM
``qkv_dgrad``    all-gather of x for the wgrad (backward)   the QKV / fc1 dgrad GEMM (bulk)
``qkv_wgrad``    reduce-scatter of dx (backward)            the QKV / fc1 wgrad GEMM (bulk)
===============  =========================================  ==================================

(``fc1_*`` / ``fc2_*`` likewise for the MLPs.) Exposed seconds of a collective of ``c`` seconds
overlapped with a GEMM of ``g`` seconds, ``n`` = tp:

- ``ring_exchange`` all-gather: the GEMM runs in n chunks, the first on local data, each next one
  on the chunk received meanwhile: ``(n-1)·max(0, c/(n-1) - g/n)``;
- ``ring_exchange`` reduce-scatter: the same, plus the last chunk's exchange after the last GEMM
  chunk: ``c/(n-1) + (n-2)·max(0, c/(n-1) - g/n)``;
- ``pipeline`` reduce-scatter in ``s = num_splits`` chunks: ``c/s + (s-1)·max(0, c/s - g/s)``;
- ``bulk``: the collective runs beside the independent GEMM: ``max(0, c - g)``;

plus, for every method, the GEMM's loss of the ``num_sm`` SMs the communication kernels occupy
while they run: ``num_sm / sm_count · min(c, g)``. All of it is capped at ``c`` (never worse than
not overlapping). Sources: the chunking of TE's ``CommOverlap`` / ``CommOverlapP2P`` (our reading;
no profile here), the SM counts from the recipe's configuration.
"""

from __future__ import annotations

from collections.abc import Mapping

from workloads.runtime import RuntimeSettings

# (userbuffers name prefix of the column GEMM, of the row GEMM) per column/row pair of a layer
PAIRS = {"attention": ("qkv", "proj"), "mlp": ("fc1", "fc2"), "shared_experts": ("fc1", "fc2")}
# operation names (workloads.operations) of the column and row GEMM of each pair
PAIR_GEMMS = {"attention": ("linear_qkv", "linear_proj"), "mlp": ("mlp.linear_fc1", "mlp.linear_fc2"),
              "shared_experts": ("shared_experts.linear_fc1", "shared_experts.linear_fc2")}


def overlapped_exposed_s(method: str, comm_s: float, gemm_s: float, tp: int, reduce_scatter: bool,
                         num_sm: int, sm_count: int, num_splits: int | None = None) -> float:
    """Exposed seconds of a ``comm_s`` collective overlapped with a ``gemm_s`` GEMM (module docstring)."""
    if comm_s <= 0:
        return 0.0
    n = max(tp, 2)
    if method == "bulk":
        exposed = max(0.0, comm_s - gemm_s)
    elif method == "pipeline":
        s = num_splits or 4
        exposed = comm_s / s + (s - 1) * max(0.0, comm_s / s - gemm_s / s)
    else:  # ring_exchange
        step = comm_s / (n - 1)
        if reduce_scatter:
            exposed = step + (n - 2) * max(0.0, step - gemm_s / n)
        else:
            exposed = (n - 1) * max(0.0, step - gemm_s / n)
    exposed += num_sm / sm_count * min(comm_s, gemm_s)
    return min(exposed, comm_s)


def tp_pass_exposed_s(runtime: RuntimeSettings, pairs: tuple[str, ...], gemm_s: Mapping[str, float],
                      ag_s: float, rs_s: float, tp: int, sm_count: int) -> tuple[float, float]:
    """(forward, backward) exposed seconds of the TP collectives of one layer's column/row ``pairs``
    (names of :data:`PAIRS`), each all-gather taking ``ag_s`` and each reduce-scatter ``rs_s``;
    ``gemm_s``: seconds of the layer's GEMMs by operation name (``.dgrad`` / ``.wgrad`` suffixes)."""
    fwd = bwd = 0.0
    for pair in pairs:
        col, row = PAIRS[pair]
        col_op, row_op = PAIR_GEMMS[pair]

        def exposed(name: str, comm: float, gemm: str, rs: bool) -> float:
            cfg = runtime.tp_overlap_for(name)
            return overlapped_exposed_s(cfg.method, comm, gemm_s.get(gemm, 0.0), tp, rs, cfg.num_sm, sm_count,
                                        cfg.num_splits)

        fwd += exposed(f"{col}_fprop", ag_s, col_op, False) + exposed(f"{row}_fprop", rs_s, row_op, True)
        bwd += (exposed(f"{row}_dgrad", ag_s, row_op + ".dgrad", False)
                + exposed(f"{col}_dgrad", ag_s, col_op + ".dgrad", False)
                + exposed(f"{col}_wgrad", rs_s, col_op + ".wgrad", True))
    return fwd, bwd
