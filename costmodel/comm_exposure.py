"""Which share of a layer's collectives sits on the compute stream's critical path.

Rules per collective kind (``overlap=False`` exposes everything, the mode in which the engines must
agree):

- **tp**: exposed unless the scenario turns on ``tp_comm_overlap`` (Megatron ``--tp-comm-overlap``,
  TE userbuffers); then the fraction ``EfficiencyFactors.tp_comm_overlap`` is hidden by the GEMMs.
- **cp**: the ring exchange of K/V overlaps the attention core; only the excess over the
  attention compute of the same pass is exposed.
- **ep**: exposed unless the scenario turns on ``ep_comm_overlap`` (Megatron
  ``--overlap-moe-expert-parallel-comm``): the merged forward-backward steps of 1F1B run one
  micro-batch's dispatch/combine under the other micro-batch's compute of the same layer, so only
  the excess over ``EfficiencyFactors.ep_comm_overlap`` × that compute is exposed, in the paired
  share of the passes (warm-up forwards and cool-down backwards run alone:
  :func:`ep_paired_share`); the step engines pass that share in.
- **dp_fsdp** (Megatron-FSDP's per-layer gathers and reduce-scatters) is built and overlapped in
  :mod:`costmodel.fsdp` (the excess over the layer's own compute is exposed);
- anything else: exposed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from costmodel.pipeline import paired_pass_share
from topologies.hardware import EfficiencyFactors

if TYPE_CHECKING:
    from workloads.scenario import Parallelism, Scenario


def ep_paired_share(scenario: Scenario) -> float:
    """Share of passes that overlap their EP all-to-all with a paired micro-batch (1 without EP overlap)."""
    p = scenario.par
    return paired_pass_share(p.pp, p.vpp, scenario.num_microbatches) if p.ep_comm_overlap else 1.0


def exposed_fraction(kind: str, comm_s: float, par: Parallelism, eff: EfficiencyFactors, overlap: bool,
                     attention_s: float, other_pass_s: float, paired_share: float = 1.0) -> float:
    """Exposed share (0-1) of ``comm_s`` seconds of ``kind`` collectives of one layer pass.

    ``attention_s``: the attention-core compute of this pass (s); ``other_pass_s``: the layer's
    compute in the opposite direction (backward for a forward pass and vice versa, s), which the
    paired micro-batch runs while this one communicates under EP overlap; ``paired_share``: the
    share of passes that have such a partner (0-1).
    """
    if not overlap or comm_s <= 0:
        return 1.0
    if kind == "tp":
        return 1.0 - eff.tp_comm_overlap if par.tp_comm_overlap else 1.0
    if kind == "cp":
        return max(0.0, comm_s - attention_s) / comm_s
    if kind == "ep" and par.ep_comm_overlap:
        alone = max(0.0, comm_s - eff.ep_comm_overlap * other_pass_s) / comm_s
        return paired_share * alone + (1.0 - paired_share)
    return 1.0
