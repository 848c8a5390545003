"""Calibration profiles: fitted values of the named efficiency factors, per system (and release).

A profile is a YAML file a user can read and edit::

    name: default
    fitted_on: megatron-bridge (122 supported runs)
    systems:
      gb300-nvl72:
        factors: {gemm_fp8: 0.58, attention: 0.41}
        uncertainty: {gemm_fp8: 0.03}        # 1-sigma, from the fit's Jacobian
        n_runs: 40
        cross_validation: {mape_pct: 6.1, bias_pct: -0.4}
        releases:                            # optional refinements for one software release
          "26.06": {factors: {gemm_fp8: 0.61}, n_runs: 5}

Factor names are the fields of :class:`topologies.hardware.EfficiencyFactors`. Applying a profile
replaces those factors of the scenario's system (the release entry, when a release is given and
the profile has an entry for it or for its family ``26.04`` of ``26.04.01``, on top of the system
entry; with no release given, ``default_release`` if the profile sets one); systems the profile does not mention keep their datasheet
defaults. ``muonsim calibrate`` writes profiles; the default one fitted on the shipped dataset is
``costmodel/data/default_calibration.yaml``. A profile written by ``muonsim calibrate
--microbench`` also carries ``local``: this machine's measured GEMM rates and gloo collective α-β,
which ``muonsim validate run.json`` uses to predict reference-backend phase times.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from costmodel.kernels import KernelSpec
from topologies.hardware import EfficiencyFactors
from topologies.inputs import UserInputError, describe_validation_error, load_yaml_file, plural

if TYPE_CHECKING:
    from workloads.scenario import Scenario

DEFAULT_PROFILE_PATH = Path(__file__).parent.parent / "data" / "default_calibration.yaml"
FACTOR_NAMES = tuple(EfficiencyFactors.model_fields)


class _FactorSet(BaseModel):
    model_config = ConfigDict(extra="forbid")

    factors: dict[str, float] = Field(default_factory=dict)
    uncertainty: dict[str, float] = Field(default_factory=dict, description="1-sigma of each fitted factor")
    n_runs: int | None = None

    @field_validator("factors", "uncertainty")
    @classmethod
    def _known(cls, value: dict[str, float]) -> dict[str, float]:
        for name in value:
            if name not in FACTOR_NAMES:
                raise ValueError(f"unknown factor '{name}'; valid: {', '.join(FACTOR_NAMES)}")
        return value


class ReleaseCalibration(_FactorSet):
    """Factors refined for one software release (applied on top of the system's factors).

    Written by ``muonsim calibrate`` as the system's values times the release family's fitted
    multipliers; ``n_runs`` counts the family's runs over all systems (the multipliers are shared).
    """


class SystemCalibration(_FactorSet):
    """Fitted factor values (and their 1-sigma) for one system."""

    release: str | None = None
    cross_validation: dict[str, float] | None = Field(None, description="held-out error metrics of this system's fit")
    releases: dict[str, ReleaseCalibration] = Field(default_factory=dict)


class CollectiveFit(BaseModel):
    """α-β fit of one collective on this machine: time = alpha_s + size_bytes / beta_Bps."""

    model_config = ConfigDict(extra="forbid")

    alpha_s: float = Field(ge=0)
    beta_Bps: float = Field(gt=0)


class SmallGemmPath(BaseModel):
    """The separate code path of tiny matmuls on this machine: ``time = overhead_s + flops / flops_per_s``
    for a GEMM of at most ``max_flops`` FLOPs (2·m·n·k).

    torch's CPU bf16 matmul sends a GEMM to oneDNN (AMX/AVX-512 kernels, a ~15 us primitive setup per
    call) only when ``m·n·k > 16³``; smaller ones run ATen's plain loop (~1 us per call, a few GFLOP/s).
    ``calibrate --microbench`` finds the threshold as the step up in time between two square sizes,
    so it is the largest measured size on the small path (a lower bound of the true threshold, exact
    at 2·16³ FLOPs with the default sizes).
    """

    model_config = ConfigDict(extra="forbid")

    max_flops: float = Field(ge=0, description="FLOPs (2·m·n·k) of the largest GEMM taking the small path")
    flops_per_s: float = Field(gt=0, description="FLOP rate of the small path")
    overhead_s: float = Field(ge=0, description="seconds per call of the small path")


class NewtonSchulzFit(BaseModel):
    """Newton-Schulz on this machine: its GEMMs at the measured matmul setup per call (plus
    ``gemm_setup_s`` for those on the main path: oneDNN's ``addmm`` with ``alpha``/``beta`` sets up
    longer than a plain matmul, +4 to +8 us here) plus their FLOPs at the measured matmul rate times
    ``efficiency``,
    its other kernels at the measured dispatch and bandwidth, plus ``call_overhead_s`` per call (the
    host work of one ``newton_schulz`` call that launches no kernel), plus ``shape_change_s`` for a
    call whose previous NS call had another shape (its GEMM code paths and primitives and the
    temporaries of the new size are not in the caches; ``calibrate --microbench`` times its shapes in
    blocks and in rotation)."""

    model_config = ConfigDict(extra="forbid")

    efficiency: float = Field(gt=0, le=1.5, description="NS GEMM FLOP rate relative to plain matmuls' "
                                                         "(cf. EfficiencyFactors.newton_schulz_gemm)")
    call_overhead_s: float = Field(ge=0, description="host seconds per NS call beyond its kernels")
    gemm_setup_s: float = Field(0.0, ge=0, description="seconds more per NS GEMM on the main matmul path than a "
                                                      "plain matmul's setup (addmm with alpha and beta)")
    shape_change_s: float = Field(0.0, ge=0, description="seconds more of an NS call after a call of another shape "
                                                         "than after one of its own")


class LocalMeasurements(BaseModel):
    """This machine measured by ``muonsim calibrate --microbench`` (for reference-backend runs).

    The reference backend runs eager PyTorch on CPU tensors: the host executes every operator
    itself, so a kernel costs its dispatch plus its execution and a sequence costs the sum
    (:meth:`kernels_time_s`; on a GPU the host only issues them, :mod:`costmodel.kernels`).
    """

    model_config = ConfigDict(extra="forbid")

    machine: str = ""
    torch_version: str = ""
    threads: int = Field(1, gt=0)
    gemm_flops_per_s: dict[str, float] = Field(description="torch matmul peak rate per dtype (bf16, fp32)")
    gemm_overhead_s: dict[str, float] = Field(default_factory=dict, description="fixed cost per matmul call per dtype")
    gemm_small: dict[str, SmallGemmPath] = Field(default_factory=dict, description="per dtype: the path of tiny "
                                                 "matmuls, when the measured times show one (none: one path)")
    dispatch_s: float | None = Field(None, ge=0, description="eager PyTorch cost per operator call on tiny tensors "
                                     "(Python + ATen dispatcher; the same path issues GPU kernels)")
    memory_Bps: float | None = Field(None, gt=0, description="bytes per second of element-wise operators on large "
                                     "tensors (all ranks busy)")
    newton_schulz: dict[str, NewtonSchulzFit] = Field(default_factory=dict, description="5-step quintic NS per dtype")
    muon_update_host_s: float | None = Field(None, ge=0, description="host seconds of the reference's update of one "
                                             "Muon tensor beyond its kernels and its orthogonaliser call (cli.reference_host)")
    muon_orthogonalize_host_s: float | None = Field(None, ge=0, description="host seconds of one reference "
                                                    "orthogonaliser call beyond the microbenchmark's NS and the scale kernels")
    world_size: int = Field(2, gt=1)
    collectives: dict[str, CollectiveFit] = Field(default_factory=dict, description="gloo α-β per op")

    def gemm_path(self, flops: float, dtype: str = "bf16") -> tuple[float, float]:
        """(seconds per call, FLOP/s) of the code path a matmul of ``flops`` FLOPs takes here: the
        small-matrix path up to ``gemm_small[dtype].max_flops``, else the main one."""
        if dtype not in self.gemm_flops_per_s:
            raise UserInputError(f"local profile has no {dtype} GEMM rate; measured: {', '.join(self.gemm_flops_per_s)}")
        small = self.gemm_small.get(dtype)
        if small is not None and flops <= small.max_flops:
            return small.overhead_s, small.flops_per_s
        return self.gemm_overhead_s.get(dtype, 0.0), self.gemm_flops_per_s[dtype]

    def gemm_main_path(self, flops: float, dtype: str = "bf16") -> bool:
        """Whether a matmul of ``flops`` FLOPs takes the main code path here (not the small-matrix one)."""
        small = self.gemm_small.get(dtype)
        return small is None or flops > small.max_flops

    def gemm_time_s(self, flops: float, dtype: str = "bf16") -> float:
        """Seconds for one matmul of ``flops`` FLOPs on this machine: the per-call cost plus the FLOPs at
        the rate of the code path it takes (:meth:`gemm_path`)."""
        call_s, rate = self.gemm_path(flops, dtype)
        return call_s + flops / rate

    def kernel_time_s(self, kernel: KernelSpec) -> float:
        """Seconds of ONE launch of ``kernel`` here: a GEMM at the measured matmul cost (a Newton-Schulz
        GEMM's FLOPs at the matmul rate times the NS efficiency, its setup a matmul's plus
        ``NewtonSchulzFit.gemm_setup_s`` on the main path), anything else dispatch + bytes / bandwidth."""
        if kernel.kind in ("gemm", "ns_gemm"):
            dtype = "bf16" if kernel.tensor_class == "bf16" else "fp32"
            fit = self.newton_schulz.get(dtype) if kernel.kind == "ns_gemm" else None
            call_s, rate = self.gemm_path(kernel.flops, dtype)
            if fit is None:
                return call_s + kernel.flops / rate
            setup_s = fit.gemm_setup_s if self.gemm_main_path(kernel.flops, dtype) else 0.0
            return call_s + setup_s + kernel.flops / (rate * fit.efficiency)
        if self.dispatch_s is None or self.memory_Bps is None:
            raise UserInputError("local profile has no element-wise measurements (dispatch_s, memory_Bps); "
                                 "re-run 'muonsim calibrate --microbench'")
        return self.dispatch_s + kernel.bytes / self.memory_Bps

    def kernels_time_s(self, kernels: Iterable[KernelSpec], ns_calls: int = 0, dtype: str = "bf16",
                       ns_shape_changes: int = 0) -> float:
        """Seconds of a kernel sequence run eagerly here (host-synchronous: the sum of its kernels),
        plus the per-call host cost of ``ns_calls`` Newton-Schulz calls and the cost of
        ``ns_shape_changes`` of them following a call of another shape."""
        fit = self.newton_schulz.get(dtype)
        calls_s = ns_calls * fit.call_overhead_s + ns_shape_changes * fit.shape_change_s if fit is not None else 0.0
        return sum(k.count * self.kernel_time_s(k) for k in kernels) + calls_s

    def collective_time_s(self, op: str, size_bytes: float) -> float | None:
        """α + size/β for a measured op (all_gather_v uses all_gather); None if not measured."""
        fit = self.collectives.get("all_gather" if op == "all_gather_v" else op)
        return None if fit is None else fit.alpha_s + size_bytes / fit.beta_Bps


class CalibrationProfile(BaseModel):
    """A calibration profile: fitted efficiency factors per system (YAML, user-editable)."""

    model_config = ConfigDict(extra="forbid")

    name: str = "custom"
    fitted_on: str = ""
    systems: dict[str, SystemCalibration] = Field(default_factory=dict)
    cross_validation: dict[str, float] | None = None
    fit_settings: dict[str, Any] | None = None
    default_release: str | None = Field(
        None, description="release whose entries apply when none is given (predict, compare, plan); null = the "
                          "systems' base factors")
    release_multipliers: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="per release family: fitted multiplier of each release factor (informative; "
                                          "the systems' release entries hold the resulting values)")
    local: LocalMeasurements | None = None
    training_run_ids: list[str] = Field(default_factory=list, description="runs the factors were fitted on")

    def factors_for(self, system_name: str, release: str | None = None) -> dict[str, float]:
        """The fitted factors for a system (and release, when the profile has an entry for it).

        ``release`` None means the profile's ``default_release`` (None again: the base factors).
        """
        if release is None:
            release = self.default_release
        cal = self.systems.get(system_name)
        if cal is None:
            return {}
        factors = dict(cal.factors)
        entry = self._release_entry(system_name, release)
        if entry is not None:
            factors.update(entry.factors)
        return factors

    def _release_entry(self, system_name: str, release: str | None) -> ReleaseCalibration | None:
        """The entry for ``release`` itself, else for its family ('26.04.01' -> '26.04')."""
        cal = self.systems.get(system_name)
        if cal is None or not release:
            return None
        family = ".".join(release.split(".")[:2])
        return cal.releases.get(release) or cal.releases.get(family)

    def apply(self, scenario: Scenario, release: str | None = None) -> Scenario:
        """The scenario with this profile's factors for its system (unchanged if none)."""
        factors = self.factors_for(scenario.system.name, release)
        if not factors:
            return scenario
        try:
            system = scenario.system.with_efficiency(**factors)
        except ValidationError as err:
            raise UserInputError(describe_validation_error(err, f"calibration '{self.name}'")) from None
        return dataclasses.replace(scenario, system=system)

    def label(self, system_name: str, release: str | None = None) -> str:
        """Short description for reports."""
        factors = self.factors_for(system_name, release)
        release = release if release is not None else self.default_release
        if factors:
            rel = f" release {release}" if self._release_entry(system_name, release) is not None else ""
            return f"{self.name} ({system_name}{rel}: {plural(len(factors), 'fitted factor')})"
        return f"{self.name} (no factors for {system_name}: datasheet defaults)"

    def to_yaml(self) -> str:
        """The profile as readable YAML (flow style for the small factor maps)."""
        data = self.model_dump(mode="json", exclude_none=True)
        for key in ("fit_settings", "local", "cross_validation", "default_release"):
            data.setdefault(key, None)
            if data[key] is None:
                data.pop(key)
        for key in ("training_run_ids", "release_multipliers"):
            if not data.get(key):
                data.pop(key, None)
        return yaml.dump(data, Dumper=_ProfileDumper, sort_keys=False, width=110, allow_unicode=True)


class _ProfileDumper(yaml.SafeDumper):
    """Maps of numbers and lists of scalars in flow style (``{gemm_fp8: 0.58}``), the rest block."""


def _represent_dict(dumper: yaml.SafeDumper, data: dict[str, Any]) -> yaml.Node:
    flow = bool(data) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in data.values())
    return dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=flow)


def _represent_float(dumper: yaml.SafeDumper, value: float) -> yaml.Node:
    if value != value or value in (float("inf"), float("-inf")):
        return dumper.represent_float(value)
    mantissa, _, exponent = f"{value:.6g}".partition("e")
    if "." not in mantissa:
        mantissa += ".0"  # YAML 1.1 (PyYAML) reads '1e-05' as a string, '1.0e-05' as a float
    text = f"{mantissa}e{exponent}" if exponent else mantissa
    return dumper.represent_scalar("tag:yaml.org,2002:float", text)


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flow = all(isinstance(v, str | int | float) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_ProfileDumper.add_representer(dict, _represent_dict)
_ProfileDumper.add_representer(list, _represent_list)
_ProfileDumper.add_representer(float, _represent_float)


def load_profile(path: str | Path) -> CalibrationProfile:
    """Read a calibration profile YAML file (one-line UserInputError on failure)."""
    data = load_yaml_file(path, "calibration profile")
    try:
        return CalibrationProfile.model_validate(data)
    except ValidationError as err:
        raise UserInputError(describe_validation_error(err, f"calibration profile '{path}'")) from None


def default_profile() -> CalibrationProfile | None:
    """The built-in profile fitted on the shipped dataset, if present."""
    if DEFAULT_PROFILE_PATH.is_file():
        return load_profile(DEFAULT_PROFILE_PATH)
    return None
