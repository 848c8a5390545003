"""Hardware description of a system: GPU peaks, memory, NVLink domain, NICs, scale-out fabric.

A system is a YAML file (the catalogue ships gb300-nvl72, gb200-nvl72, dgx-b300, dgx-b200,
dgx-h100 under ``topologies/data/systems``; users pass their own by path). All quantities are SI:
bytes, seconds, FLOP/s, bytes per second **per direction**. Figures and sources are in each YAML
file and in ``../shared/reference/hardware-and-collectives.md``.

The named efficiency factors that calibration fits live here too (:class:`EfficiencyFactors`):
they are properties of how a software stack drives this hardware, start from datasheet and
measured values, and are overridden per system by a calibration profile.
"""

from __future__ import annotations

from enum import StrEnum
from functools import cache, lru_cache
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, ValidationError, model_validator

from topologies.inputs import (
    NoBoolNumbers,
    UserInputError,
    describe_validation_error,
    resolve_catalog_entry,
)

SYSTEMS_DIR = Path(__file__).parent / "data" / "systems"


class Precision(StrEnum):
    """Training precision of the transformer GEMMs (Megatron-Bridge naming)."""

    BF16 = "bf16"
    FP8_CS = "fp8-cs"  # FP8 with current (per-tensor) scaling
    MXFP8 = "mxfp8"  # FP8 with E8M0 scale per 32 elements
    NVFP4 = "nvfp4"  # FP4 with E4M3 scale per 16 elements + fp32 tensor scale
    FP16 = "fp16"  # FP16 GEMMs (Megatron --fp16, dynamic loss scaling): the BF16 tensor-core rate
    FP8_DELAYED = "fp8-delayed"  # FP8 with delayed (amax-history) per-tensor scaling, TE's default recipe
    FP8_BLOCKWISE = "fp8-blockwise"  # FP8 with an fp32 scale per 1x128 (activations) / 128x128 (weights) block

    @property
    def tensor_core_class(self) -> str:
        """The peak-FLOP class this precision runs at: 'bf16', 'fp8' or 'fp4'."""
        return TENSOR_CORE_CLASS[self.value]


# the peak-FLOP class of each precision (FP16 runs at the BF16 rate on every GPU here)
TENSOR_CORE_CLASS = {"bf16": "bf16", "fp16": "bf16", "fp8-cs": "fp8", "fp8-delayed": "fp8", "fp8-blockwise": "fp8",
                     "mxfp8": "fp8", "nvfp4": "fp4"}


class _Strict(NoBoolNumbers):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PeakFlops(_Strict):
    """Dense tensor-core peaks per GPU in FLOP/s (training uses dense, never the sparse figure)."""

    bf16: float = Field(gt=0)
    fp8: float | None = Field(default=None, gt=0, description="None when the GPU has no FP8 tensor cores (A100)")
    fp4: float | None = Field(default=None, gt=0, description="None when the GPU has no FP4")
    tf32: float = Field(gt=0)
    fp32: float = Field(gt=0, description="non-tensor FP32 peak")

    def has_class(self, tensor_class: str) -> bool:
        """Whether a peak exists for ``tensor_class`` (fp4 falls back to fp8)."""
        if tensor_class == "fp4":
            return self.fp4 is not None or self.fp8 is not None
        return getattr(self, tensor_class) is not None

    def of_class(self, tensor_class: str) -> float:
        """Dense peak in FLOP/s of ``tensor_class`` (bf16, fp8, fp4, tf32, fp32; fp4 falls back to
        fp8). Raises ValueError for a class the GPU lacks (scenario validation refuses it first)."""
        value = (self.fp4 if self.fp4 is not None else self.fp8) if tensor_class == "fp4" else getattr(self, tensor_class)
        if value is None:
            raise ValueError(f"no {tensor_class} tensor cores")
        return float(value)


@lru_cache(maxsize=64)
def _supported_by(peaks: PeakFlops) -> tuple[Precision, ...]:
    """The training precisions tensor cores of these peaks support: those whose tensor-core class has
    a peak; the block-scaled ones (MXFP8, NVFP4) only with an FP4 peak (Blackwell)."""
    block_scaled = (Precision.MXFP8, Precision.NVFP4)
    return tuple(x for x in Precision if getattr(peaks, x.tensor_core_class) is not None
                 and (x not in block_scaled or peaks.fp4 is not None))


class GpuSpec(_Strict):
    """One GPU: dense peaks (FLOP/s), usable HBM (bytes), HBM bandwidth (bytes/s), SM count."""

    name: str
    peak_flops_per_s: PeakFlops
    hbm_bytes: float = Field(gt=0, description="usable HBM capacity per GPU")
    hbm_bandwidth_Bps: float = Field(gt=0)
    sm_count: int = Field(gt=0)
    precisions: tuple[Precision, ...] | None = Field(
        default=None, description="training precisions the tensor cores run natively; default: every precision whose "
        "peak class (bf16, fp8) the GPU has, plus the block-scaled mxfp8 and nvfp4 when the GPU has an FP4 peak (Blackwell's tensor cores brought "
        "both MX block scaling and FP4; Hopper runs FP8 with per-tensor scaling only)")
    fp8_gemm_any_layout: bool = Field(True, description="tensor cores take FP8 operands in every layout (Blackwell); "
                                      "False on Hopper, whose FP8 GEMMs are TN only, so Transformer Engine keeps a "
                                      "transposed FP8 copy of every weight for the backward GEMMs")
    host_link_Bps: float = Field(64e9, gt=0, description="GPU <-> host memory bandwidth per GPU per direction "
                                 "(activation and optimizer offloading); default PCIe Gen5 x16 nominal")
    host_memory_Bps: float = Field(100e9, gt=0, description="host (CPU) memory bandwidth available to one GPU's "
                                   "offloaded optimizer step (the CPU's memory bandwidth / GPUs sharing it); the "
                                   "default is an assumption")

    @property
    def supported_precisions(self) -> tuple[Precision, ...]:
        """The training precisions this GPU's tensor cores support (see ``precisions``)."""
        if self.precisions is not None:
            return self.precisions
        return _supported_by(self.peak_flops_per_s)  # every scenario's validation asks (the planner: per layout)


class NvlinkSpec(_Strict):
    """The NVLink (scale-up) domain: a rack of 72 on NVL72, an 8-GPU node on DGX."""

    domain_size: int = Field(gt=0, description="GPUs in one NVLink domain")
    links_per_gpu: int = Field(gt=0)
    link_bandwidth_Bps: float = Field(gt=0, description="per link, per direction")
    switch_chips: int = Field(gt=0, description="NVLink switch chips per domain")
    nvls: bool = Field(description="NVLink SHARP (in-switch reduction/multicast) available")

    @property
    def gpu_bandwidth_Bps(self) -> float:
        """NVLink bandwidth per GPU per direction (links x link rate)."""
        return self.links_per_gpu * self.link_bandwidth_Bps


class ScaleOutSpec(_Strict):
    """Rail-optimised scale-out fabric (InfiniBand or Ethernet) between NVLink domains."""

    kind: Literal["infiniband", "ethernet"] = "infiniband"
    nic_bandwidth_Bps: float = Field(gt=0, description="per NIC per direction")
    nics_per_gpu: int = Field(default=1, gt=0)
    switch_radix: int = Field(gt=1, description="ports per leaf/spine switch")
    domains_per_scalable_unit: int = Field(gt=0, description="racks (or nodes) per scalable unit")
    planes: int = Field(default=1, gt=0)
    oversubscription: float = Field(default=1.0, ge=1.0, description="leaf down:up ratio")
    switch_hop_latency_s: float = Field(default=3e-7, ge=0)
    # --- fabric shape (topologies.layout / topologies.fabric); all optional, derived when absent ---
    rails: int | None = Field(default=None, gt=0, description="rails (NIC positions per node/compute tray); default: min(domain, 8) x nics_per_gpu")
    tiers: int | None = Field(default=None, ge=1, le=3, description="switch tiers; default: 2 if the job fits a two-tier fat tree of this radix, else 3")
    nic_latency_s: float = Field(default=1.0e-6, ge=0, description="NIC + PCIe one-way latency (graph edges only; the NCCL step latencies already include it)")


class EfficiencyFactors(_Strict):
    """Named, calibratable efficiency factors (dimensionless fractions unless a unit is named).

    Defaults come from datasheets and measured figures (hardware-and-collectives.md §5-§6);
    ``muonsim calibrate`` fits a subset of them per system and release. Compute factors are read by
    ``costmodel.compute``; communication factors by ``topologies.collectives``.
    """

    # --- compute (costmodel.compute) ---
    gemm_bf16: float = Field(default=0.70, gt=0, le=1, description="large dense BF16 GEMM fraction of dense peak; §6.1: B200 BF16 63-67 % (torch, 3072^3-8192^3 [S59]), B300 84 % (cuBLAS, random data [S9])")
    gemm_fp8: float = Field(default=0.60, gt=0, le=1, description="large dense FP8/MXFP8 GEMM fraction of dense peak; §6.1: GB200 FP8 58 % (16384^3 [S10]), B200 FP8 ~57 % at large M [S60], H100 65-70 % [S10], B300 89 % [S9]")
    gemm_fp4: float = Field(default=0.60, gt=0, le=1, description="large dense NVFP4 GEMM fraction of dense peak; §6.1: B200 NVFP4 60 % (8192^3 [S59]), GB200 FP4 76 % (16384^3 [S10])")
    gemm_half_efficiency_flops: float = Field(default=2e9, gt=0, description="BF16 GEMM size (FLOPs) reaching half its max efficiency (scaled by peak ratio for FP8/FP4: the overhead is a fixed time); §6.1 vLLM B200 M-sweep N=K=4096 [S60] gives 2-7e9")
    grouped_gemm: float = Field(default=0.85, gt=0, le=1.5, description="grouped expert GEMM efficiency relative to a dense GEMM of the per-expert size (assumption: no grouped-GEMM measurement in the reference; calibrated)")
    attention: float = Field(default=0.45, gt=0, le=1, description="flash attention (fwd + bwd) fraction of BF16 dense peak (assumption: MoE end-to-end MFU is ~40-45 % of BF16 peak, §6.2; calibrated)")
    memory_bandwidth: float = Field(default=0.80, gt=0, le=1, description="achieved fraction of HBM bandwidth for memory-bound element-wise kernels; §6.3: STREAM 87-95 % of nominal, fused framework kernels lower")
    newton_schulz_gemm: float = Field(default=0.65, gt=0, le=1, description="large Newton-Schulz GEMM (torch matmul/addmm, as Emerging-Optimizers runs them) fraction of dense peak of its matmul class; §6.1: torch BF16 matmul on B200 3072^3 67 %, 8192^3 63 % [S59]. Its own factor: NS GEMMs are eager torch calls, not the fitted Megatron GEMM efficiency")
    newton_schulz_half_efficiency_flops: float = Field(default=5e9, gt=0, description="NS GEMM size (FLOPs) reaching half of newton_schulz_gemm (scaled by the class's peak ratio to BF16, as for gemm_half_efficiency_flops); §6.1: torch BF16 2048^3 (17 GFLOP) reaches 50 % where 8192^3 reaches 63 % on B200 [S59] -> 0.65 x F/(F + 5e9)")
    quantize_bandwidth: float = Field(default=0.75, gt=0, le=1, description="achieved fraction of HBM bandwidth for FP8/MXFP8/NVFP4 cast kernels; §6.1: MXFP8 casts run at 5.4-6.5 TB/s of 8 TB/s on B200 [S61]")
    host_sync_s: float = Field(default=1.0e-5, ge=0, description="seconds one host synchronisation costs the compute stream (a D2H copy of a few bytes, cudaStreamSynchronize, the host waking up) before the host can issue again; the MoE dispatchers that need token counts on the host pay it once per MoE layer forward (costmodel.layer_costs.pass_time_s). Assumption: ~10 us, not measured here")
    host_hash_Bps: float = Field(default=1.0e9, gt=0, description="bytes per second one host CPU core hashes with SHA-1 (Python hashlib on OpenSSL), the cost of Megatron's --check-weight-hash-across-dp-replicas-interval (costmodel.iteration_work). Prior: 1.04 GB/s measured on this project's 2-core Xeon VM with SHA-NI, OpenSSL 3.0 (benchmarks/bench_host_hash.py); OpenSSL's published sha1 speeds on SHA-NI cores are 1-2 GB/s. Not fitted: no timed run constrains it")
    host_cast_Bps: float = Field(default=2.5e9, gt=0, description="output bytes per second of one host CPU core converting a BF16 tensor to FP32 in PyTorch (torchrun runs each rank with OMP_NUM_THREADS=1), the other host cost of the weight-hash check. Prior: 2.5 GB/s measured on this project's 2-core VM (benchmarks/bench_host_hash.py). Not fitted")
    # --- kernels (costmodel.kernels) ---
    kernel_issue_s: float = Field(default=5.0e-6, gt=0, description="host seconds to issue one kernel from eager PyTorch (Python + ATen dispatcher + cudaLaunchKernel); a stream of eager kernels takes at least the sum of these (CUDA graphs remove them for captured work). Assumption: the dispatcher part measured on CPU tensors by 'muonsim calibrate --microbench' (1-6 us/op on a 2-core VM) plus the launch call, 1.78 us for an empty kernel on B300 [S9]; fitted by calibrate")
    layer_host_s: float = Field(default=0.0, ge=0, description="host seconds of the framework's Python per transformer-layer pass (forward, backward, recompute) beyond the kernel launches: Megatron-Core's module hierarchy, Transformer Engine's module logic and autograd bookkeeping; a pass takes max(GPU time, host time), so it matters only for launch-bound small layers (costmodel.layer_costs.framework_host_s). Default 0: not modelled unless a calibration profile sets it (costmodel/data/ci_calibration.yaml fits it on the Megatron CI timings: 2.3-3.8 ms). Calibration prior 1 ms (PRIOR_CENTERS): a vanilla PyTorch GPT layer on tiny CPU tensors takes 1.6 ms forward + backward on this project's 2-core VM (benchmarks/bench_layer_host.py), ~0.8 ms per pass, a lower bound for Megatron-Core + TE")
    moe_host_s: float = Field(default=0.0, ge=0, description="host seconds of an MoE block's Python per layer pass on top of layer_host_s: the router (gating, score function, top-k, auxiliary loss), the token dispatcher (routing maps, permutation indices, the tokens-per-expert host copy) and the experts' module logic (costmodel.layer_costs.framework_host_s). Default 0: not modelled unless a calibration profile sets it (the CI profile fits 2.1-2.9 ms). Calibration prior 1 ms: an assumption (the order of the layer's own)")
    local_spec_host_fraction: float = Field(default=1.0, gt=0, le=2, description="framework host time per layer pass (layer_host_s + moe_host_s) of Megatron's local transformer spec (--transformer-impl local: Megatron-Core's own parallel linears, norms and attention, SequentialMLP experts) relative to Transformer Engine's spec, on which layer_host_s and moe_host_s are fitted (costmodel.layer_costs.framework_share_s). Prior 1 (no measurement: Transformer Engine does not run on this CPU-only machine); the CI profile fits it per host CPU on the Megatron CI rows with local layers")
    kernel_min_s: float = Field(default=1.78e-6, gt=0, description="minimum GPU time of one kernel (launch latency, ramp-up and tail of a tiny grid): an empty <<<1,1>>> kernel launch takes 1.78 us on B300 [S9]")
    # --- communication (topologies.collectives) ---
    nvlink_bandwidth: float = Field(default=0.802, gt=0, le=1, description="NCCL effective NVLink fraction of the link rate: SM100_NVLINK_BW 40.1 of 50 GB/s (Blackwell), SM90_NVLINK_BW 20.6 of 25 = 0.824 (Hopper) [S27]")
    nvls_bandwidth: float = Field(default=0.74, gt=0, le=1, description="NCCL nvlsEfficiency (0.74 Blackwell, 0.85 Hopper) [S27]: NCCL's tuner rates NVLS at (effective NVLink per GPU) x this; NVLS all-reduce busbw = 2 x that (n-independent)")
    nvls_all_reduce_efficiency: float = Field(default=0.762, gt=0, le=1, description="achieved NVLS all-reduce busbw over NCCL's own estimate 2 x (effective NVLink per GPU) x nvlsEfficiency (§3.1, §5.3 [S27]). Derived from the H100 8-GPU measurement alone: 479 GB/s at 8 GB [S10] / (2 x 18 x 25 GB/s x 0.824 x 0.85 = 630.4 GB/s x size efficiency 0.997 at 1 GB per rank) = 0.762. It absorbs NCCL's (nCh-1)/nCh channel term and the kernels' protocol overhead; the GB200 72-GPU rack figures [S29] are held out")
    nvls_tree_channels: int = Field(default=32, ge=1, description="NVLSTree heads per NVLink domain (the NVLS search graph's channels; each head drives its own NIC across domains; capped by the ranks in the domain). Not NCCL_NVLS_NCHANNELS: NCCL's NVLS compute channels work orthogonally to these search channels. 32 = what NCCL 2.26.2's own graph search returns on a GB200 NVL72 topology (min(NCCL_MAX_NVLS_ARITY 32, GPUs per clique), at 20 GB/s intra / 40 GB/s inter per head; benchmarks/nccl_probe runs it from the released binary). NCCL_DEBUG=INFO prints one 'NVLS Head' line per head; set a measured count in the system file. calibratable")
    nvls_tree_channel_cap_2_domains_Bps: float = Field(default=96e9, gt=0, description="NCCL per-channel NVLSTree busbw cap for 2 nodes, Blackwell (perChMaxNVLSTreeBw) [S27]; Hopper's is not in the reference, so every system uses this")
    nvls_tree_channel_cap_Bps: float = Field(default=80e9, gt=0, description="NCCL per-channel NVLSTree busbw cap for more than 2 nodes, Blackwell (reference §5.2: 'for >=4 nodes'; NCCL indexes 1 / 2 / more nodes) [S27]")
    nvls_tree_network_step_latency_s: float = Field(default=2.09e-5, ge=0, description="NVLSTree per tree level across the network (NCCL Simple hwLat 20.9 us); NVLSTree latency = nvls_latency_s + 2 log2(domains) x this [S27]")
    network_bandwidth: float = Field(default=0.97, gt=0, le=1, description="achieved fraction of NIC line rate")
    alltoall_bandwidth: float = Field(default=0.75, gt=0, le=1, description="achieved fraction for EP all-to-all dispatch/combine")
    nvlink_step_latency_s: float = Field(default=3.4e-6, ge=0, description="per ring step over NVLink (NCCL Simple)")
    network_step_latency_s: float = Field(default=1.4e-5, ge=0, description="per ring step across the network (NCCL Simple)")
    collective_base_latency_s: float = Field(default=8.4e-6, ge=0, description="per collective launch (NCCL base)")
    nvls_latency_s: float = Field(default=2.5e-5, ge=0, description="flat NVLS latency (NCCL model)")
    tree_bandwidth: float = Field(default=0.92, gt=0, le=1, description="NCCL tree all-reduce de-rate (tuning.cc: busBw*.92) [S27]")
    nvlink_tree_step_latency_s: float = Field(default=4.0e-6, ge=0, description="per tree step over NVLink (NCCL Simple) [S27]")
    network_tree_step_latency_s: float = Field(default=1.4e-5, ge=0, description="per tree step across the network (NCCL Simple) [S27]")
    network_host_overhead_s: float = Field(default=3.0e-6, ge=0, description="NCCL netOverhead for a multi-node ring step, Simple: 1 us (Intel/ARM; 2 us AMD) x 3 = 3 us; the step's NVLink latency is max(its latency, this) [S27]")
    ring_plateau_latency_factor: float = Field(default=1.4, ge=1, description="NCCL multi-node ring Simple latency multiplier ('plateau') [S27]")
    ring_half_saturation_bytes: float = Field(default=2.0e6, ge=0, description="per-rank chunk (S/n) at which ring/tree/p2p bandwidth reaches half its plateau; SimAI measured ratios put it at 1.5-2.5 MB for 16-1,024 GPUs [S51]")
    nvls_half_saturation_bytes: float = Field(default=3.0e6, ge=0, description="per-rank chunk (S/n) at which NVLS bandwidth reaches half its plateau; §5.5: GB200-72 70 % at 512 MB and 90 % at 2 GB, H100-8 50 % at 16-32 MB [S29] [S10]")
    alltoall_half_saturation_bytes: float = Field(default=2.0e6, ge=0, description="per-rank chunk (S/n) at which all-to-all reaches half its plateau; SimAI alltoall ratios (1 node) [S51]")
    min_size_efficiency: float = Field(default=0.5, gt=0, le=1, description="floor of the size-dependent efficiency: NCCL shrinks chunks (and switches to LL, which tuning.cc rates at 0.5 of the link) for small messages, so pipeline fill never costs more than the transfer itself [S27]")
    pat_bandwidth: float = Field(default=0.75, gt=0, le=1, description="NCCL PAT all-gather/reduce-scatter de-rate (tuning.cc: busBw *= .75) [S27]")
    all_gather_v_latency_factor: float = Field(default=2.0, ge=1, description="latency multiplier of a variable-size all-gather (grouped send/recv, one send + one receive per peer, no pipelining) over the ring all-gather; assumption, calibrated")
    # --- overlap ---
    overlap_compute_slowdown: float = Field(default=0.05, ge=0, le=1, description="fractional compute slowdown while a collective overlaps it")


class SystemSpec(_Strict):
    """A whole system: GPU type, NVLink domain, scale-out fabric, efficiency defaults."""

    name: str
    display_name: str = ""
    gpu: GpuSpec
    nvlink: NvlinkSpec
    scale_out: ScaleOutSpec
    efficiency: EfficiencyFactors = Field(default_factory=EfficiencyFactors)
    max_gpus: int = Field(default=1_000_000, gt=0)
    host_cpu: str = Field(default="", description="the host CPU the framework's Python runs on (e.g. 'grace', "
                          "'xeon-8480c'): calibration fits the host factors (layer_host_s, moe_host_s, "
                          "kernel_issue_s) once per host CPU, shared by the systems that have it; '' = the system's own")

    @model_validator(mode="after")
    def _check(self) -> SystemSpec:
        if self.nvlink.nvls and self.nvlink.switch_chips < 1:
            raise ValueError("nvls requires NVLink switch chips")
        nics = self.nvlink.domain_size * self.scale_out.nics_per_gpu  # fabric check (topologies.layout)
        if self.scale_out.rails is not None and nics % self.scale_out.rails:
            raise ValueError(f"scale_out.rails {self.scale_out.rails} must divide the {nics} NICs of an NVLink domain")
        return self

    def peak_flops_per_s(self, precision: Precision | str) -> float:
        """Dense tensor-core peak for ``precision`` in FLOP/s (FP4 falls back to FP8 when absent)."""
        return self.gpu.peak_flops_per_s.of_class(Precision(precision).tensor_core_class)

    def supports(self, precision: Precision | str) -> bool:
        """Whether the GPU's tensor cores run ``precision`` (:attr:`GpuSpec.supported_precisions`)."""
        return Precision(precision) in self.gpu.supported_precisions

    def with_efficiency(self, **overrides: float) -> SystemSpec:
        """A copy with some efficiency factors replaced (how calibration is applied)."""
        eff = self.efficiency.model_copy(update=overrides)
        return self.model_copy(update={"efficiency": EfficiencyFactors.model_validate(eff.model_dump())})

    def without_nvls(self) -> SystemSpec:
        """The system as NCCL sees it with ``NCCL_NVLS_ENABLE=0``: no NVLink SHARP algorithms (the
        tuner picks ring / tree / PAT instead); itself when it has no NVLS."""
        return _without_nvls(self) if self.nvlink.nvls else self


@cache
def _without_nvls(system: SystemSpec) -> SystemSpec:
    return system.model_copy(update={"nvlink": system.nvlink.model_copy(update={"nvls": False})})


def system_names() -> list[str]:
    """Names of the systems shipped in the catalogue."""
    return sorted(p.stem for p in SYSTEMS_DIR.glob("*.yaml"))


@cache
def _load_system_cached(name_or_path: str) -> SystemSpec:
    data = resolve_catalog_entry(name_or_path, SYSTEMS_DIR, "system")
    try:
        return SystemSpec.model_validate(data)
    except ValidationError as err:
        raise UserInputError(describe_validation_error(err, f"system '{name_or_path}'", SystemSpec)) from None


def load_system(name_or_path: str) -> SystemSpec:
    """Load a system by catalogue name or from a YAML file path (one-line UserInputError on failure)."""
    return _load_system_cached(str(name_or_path))
