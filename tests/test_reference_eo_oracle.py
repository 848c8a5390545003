"""The reference backend against NVIDIA Emerging-Optimizers 0.3.0 itself: bitwise equal, fp32 and bf16.

``../shared/tools/eo_oracle`` runs the library (the version Megatron-Core pins) on this CPU in its own
Python 3.11 venv; nothing in it re-implements the math. This test builds that venv with the oracle's
``setup.sh`` (idempotent: ~40 s the first time, ~3 s after; ``EO_ORACLE_HOME`` moves it, default
``~/.cache/eo-oracle``), runs every oracle case in **one** oracle process (``oracle.main(argv)`` per
case, so the library is imported once), and compares with the reference backend:

* Newton–Schulz, single process (``newton_schulz``), every coefficient set both libraries have, the
  cycle / repeat-last rules past the end of the list, the three scale modes and the extra scale;
* tensor-parallel Newton–Schulz on 2 gloo ranks (``newton_schulz_tp`` duplicated / distributed, and
  Megatron's blockwise = per-shard ``newton_schulz`` with the local-shape scale), both partition dims;
* Muon, several steps (``Muon.step``), on the reference's own run: ``run_reference`` on 2 ranks
  (layer-wise, current layout) against EO given the same initial parameters and the same per-step
  data-parallel mean gradients; Nesterov on/off, the four weight-decay methods, the three scale modes.

Each in fp32 (EO ``highest``, reference ``fp32``) and bf16 (EO ``medium``, reference ``bf16``), with
one intra-op thread on both sides. Every comparison must be bitwise (max |diff| = 0).
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from reference.muon_math import MatrixInfo, MuonHyper
from reference.newton_schulz import COEFFICIENT_SETS
from reference.tp_ns import FullMatrixNS

REPO = Path(__file__).resolve().parents[1]
# ../shared beside the clone (CI); a git worktree nested deeper finds it further up
ORACLE_DIR = next((d / "shared" / "tools" / "eo_oracle" for d in REPO.parents
                   if (d / "shared" / "tools" / "eo_oracle" / "oracle.py").is_file()),
                  REPO.parent / "shared" / "tools" / "eo_oracle")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (ORACLE_DIR / "oracle.py").is_file(),
                       reason=f"the Emerging-Optimizers oracle is not beside the repository ({ORACLE_DIR})"),
]

PRECISION = {"highest": "fp32", "high": "tf32", "medium": "bf16"}  # EO fp32_matmul_prec -> reference
SEED = 11


def _matrices() -> dict[str, np.ndarray]:
    """Wide, tall and square fp32 matrices, both dims even (so tp 2 can split either one)."""
    gen = np.random.default_rng(SEED)
    return {name: gen.standard_normal(shape).astype(np.float32)
            for name, shape in {"wide": (24, 40), "tall": (40, 24), "square": (32, 32)}.items()}


# (coefficients, steps, EO precision, scale mode, extra scale): every set the two share, past the list's end
FULL_CASES = [
    ("quintic", 5, "highest", "spectral", 0.2),
    ("quintic", 5, "medium", "spectral", 0.2),
    ("quintic", 7, "high", "shape_scaling", 1.0),  # cycles back to tuple 1
    ("simple", 5, "medium", "unit_rms_norm", 1.0),
    ("polar_express", 10, "highest", "spectral", 0.5),  # repeats the last tuple
    ("cans", 7, "medium", "shape_scaling", 0.2),
    ("aol", 5, "highest", "unit_rms_norm", 0.2),
    ("deepseekv4", 12, "medium", "spectral", 1.0),
]
TP_CASES = [(mode, pdim, prec) for mode in ("duplicated", "distributed", "blockwise")
            for pdim in (0, 1) for prec in ("highest", "medium")]
# (EO precision, nesterov, weight-decay method, scale mode, extra scale, model parameter dtype)
MUON_CASES = [
    ("highest", True, "decoupled", "spectral", 0.2, "fp32"),
    ("medium", True, "decoupled", "spectral", 1.0, "bf16"),  # Megatron's defaults, bf16 model params
    ("medium", False, "l2", "shape_scaling", 1.0, "fp32"),
    ("highest", False, "independent", "unit_rms_norm", 0.5, "fp32"),
    ("medium", True, "palm", "spectral", 0.2, "fp32"),
]
MUON = dict(lr=0.02, momentum=0.9, weight_decay=0.1, steps=3)


# ----- the oracle -----------------------------------------------------------------------------------

def _oracle_home() -> Path:
    return Path(os.environ.get("EO_ORACLE_HOME") or Path.home() / ".cache" / "eo-oracle")


@pytest.fixture(scope="module")
def oracle_python() -> Path:
    """The oracle venv's python, built by setup.sh (under a lock: concurrent runs share the cache)."""
    home = _oracle_home()
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "EO_ORACLE_HOME": str(home)}
    if sys.version_info[:2] == (3, 11):
        env["PYTHON"] = sys.executable  # the interpreter running the tests; setup.sh needs a 3.11
    with open(home / ".muonsim-setup.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run(["bash", str(ORACLE_DIR / "setup.sh")], env=env, capture_output=True, text=True,
                              timeout=900)
    if done.returncode != 0:
        pytest.fail(f"eo_oracle setup.sh failed ({done.returncode}): {(done.stdout + done.stderr)[-2000:]}")
    return home / "venv" / "bin" / "python"


_BATCH = """
import json, sys
sys.path.insert(0, sys.argv[1])
import oracle  # imports emerging_optimizers once
for argv in json.load(open(sys.argv[2])):
    code = oracle.main(argv)
    if code:
        sys.exit(f"oracle exit {code} on {argv}")
"""


def _run_oracle(python: Path, cases: list[list[str]], workdir: Path) -> None:
    listing = workdir / "cases.json"
    listing.write_text(json.dumps(cases))
    env = {**os.environ, "EO_ORACLE_HOME": str(_oracle_home())}
    env.pop("PYTHONPATH", None)  # the oracle venv must not see this project's venv
    done = subprocess.run([str(python), "-c", _BATCH, str(ORACLE_DIR), str(listing)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]


def _load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _max_abs_diff(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> float:
    assert ours.keys() == theirs.keys()
    return max(float(np.abs(ours[k].astype(np.float64) - theirs[k]).max()) for k in theirs)


# ----- the reference side ----------------------------------------------------------------------------

def _hyper(coeff: str, steps: int, precision: str, scale_mode: str, extra: float) -> MuonHyper:
    return MuonHyper(lr=0.0, momentum=0.0, nesterov=False, weight_decay=0.0, schedule=COEFFICIENT_SETS[coeff],
                     ns_steps=steps, precision=PRECISION[precision], eps=1e-7,
                     scale_mode=scale_mode, extra_scale=extra)


def _reference_full(mats: dict[str, np.ndarray], case: tuple) -> dict[str, np.ndarray]:
    ortho = FullMatrixNS(_hyper(*case))
    out = {}
    for k, x in mats.items():
        info = MatrixInfo(k, x.shape, None, 1, "tp")
        out[k] = ortho(torch.from_numpy(x.copy()), x.shape, info).numpy()
    return out


def _tp_rank(rank: int, init_file: str, outdir: str, mats: dict[str, np.ndarray]) -> None:
    """One of two TP ranks: the reference's TensorParallelNS on this rank's shard of every case."""
    code = 1
    try:
        import torch.distributed as dist

        from reference.instrument import Comm, Group
        from reference.tp_ns import TensorParallelNS

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
        comm = Comm({"tp": Group("tp", 2, rank, dist.group.WORLD)})
        shards = {}
        for i, (mode, pdim, prec) in enumerate(TP_CASES):
            ortho = TensorParallelNS(_hyper("quintic", 5, prec, "spectral", 0.2), mode, comm)
            for k, x in mats.items():
                info = MatrixInfo(k, x.shape, pdim, 2, "tp")
                local = torch.from_numpy(x).chunk(2, dim=pdim)[rank].contiguous()
                shards[f"{i}/{k}"] = ortho(local, x.shape, info).numpy()
        np.savez(Path(outdir, f"rank{rank}.npz"), **shards)
        dist.barrier()
        dist.destroy_process_group()
        code = 0
    finally:
        os._exit(code)


def _reference_tp(mats: dict[str, np.ndarray], workdir: Path) -> list[dict[str, np.ndarray]]:
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_tp_rank, args=(r, str(workdir / "pg_init"), str(workdir), mats)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    ranks = [_load(workdir / f"rank{r}.npz") for r in range(2)]
    return [{k: np.concatenate([ranks[r][f"{i}/{k}"] for r in range(2)], axis=pdim) for k in mats}
            for i, (_, pdim, _) in enumerate(TP_CASES)]


def _muon_config(case: tuple) -> dict:
    precision, nesterov, wd_method, scale_mode, extra, param_dtype = case
    return dict(world_size=2, split_qkv=False, check=False, seed=SEED, param_dtype=param_dtype,
                matmul_precision=PRECISION[precision], nesterov=nesterov, weight_decay_method=wd_method,
                scale_mode=scale_mode, extra_scale_factor=extra, **MUON)


def _muon_inputs(cfg) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:  # noqa: ANN001 - RunConfig
    """EO's inputs for a reference run: initial Muon parameters (as the run's masters start) and the
    data-parallel mean gradient of every step, stacked (steps, m, n)."""
    from reference.runner import run_specs
    from reference.serial import initial_params
    from reference.workload import mean_grad

    init = initial_params(cfg)
    specs = [s for s in run_specs(cfg) if s.optimizer == "muon"]
    params = {s.name: init[s.name].numpy() for s in specs}
    grads = {s.name: torch.stack([mean_grad(s, cfg.seed, step, cfg.expert_dp if s.is_expert else cfg.dp)
                                  for step in range(cfg.steps)]).numpy() for s in specs}
    return params, grads


# ----- the comparison -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def compared(oracle_python, tmp_path_factory) -> dict[str, float]:
    """Max |reference − EO| per case (0.0 = bitwise equal), every case computed once."""
    from reference.api import run_reference
    from reference.config import make_config

    work = tmp_path_factory.mktemp("eo_oracle")
    mats = _matrices()
    np.savez(work / "mats.npz", **mats)
    cases: list[list[str]] = []
    for i, (coeff, steps, prec, scale, extra) in enumerate(FULL_CASES):
        cases.append([str(work / "mats.npz"), "-o", str(work / f"full{i}.npz"), "--coeff", coeff,
                      "--ns-steps", str(steps), "--precision", prec, "--scale-mode", scale, "--extra-scale", str(extra)])
    for i, (mode, pdim, prec) in enumerate(TP_CASES):
        cases.append([str(work / "mats.npz"), "-o", str(work / f"tp{i}.npz"), "--mode", mode, "--tp", "2",
                      "--partition-dim", str(pdim), "--precision", prec, "--scale-mode", "spectral",
                      "--extra-scale", "0.2", "--start-method", "fork"])
    muon_cfgs = [make_config(**_muon_config(case)) for case in MUON_CASES]
    for i, (case, cfg) in enumerate(zip(MUON_CASES, muon_cfgs, strict=True)):
        params, grads = _muon_inputs(cfg)
        np.savez(work / f"p{i}.npz", **params)
        np.savez(work / f"g{i}.npz", **grads)
        prec, nesterov, wd_method, scale, extra, _ = case
        cases.append([str(work / f"p{i}.npz"), "--grads", str(work / f"g{i}.npz"), "--muon-step", str(cfg.steps),
                      "-o", str(work / f"muon{i}.npz"), "--lr", str(cfg.lr), "--momentum", str(cfg.momentum),
                      "--weight-decay", str(cfg.weight_decay), "--weight-decay-method", wd_method,
                      "--precision", prec, "--scale-mode", scale, "--extra-scale", str(extra),
                      *(["--nesterov"] if nesterov else [])])
    _run_oracle(oracle_python, cases, work)

    diffs: dict[str, float] = {}
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for i, case in enumerate(FULL_CASES):
            diffs["ns full " + " ".join(map(str, case))] = _max_abs_diff(_reference_full(mats, case),
                                                                        _load(work / f"full{i}.npz"))
        for i, ours in enumerate(_reference_tp(mats, work)):
            mode, pdim, prec = TP_CASES[i]
            diffs[f"ns {mode} partition_dim {pdim} {prec}"] = _max_abs_diff(ours, _load(work / f"tp{i}.npz"))
    finally:
        torch.set_num_threads(previous)
    for i, (case, cfg) in enumerate(zip(MUON_CASES, muon_cfgs, strict=True)):
        result = run_reference(cfg)
        theirs = _load(work / f"muon{i}.npz")
        if cfg.param_dtype == "bf16":  # the run reports its bf16 model copy of the fp32 master
            theirs = {k: torch.from_numpy(v).to(torch.bfloat16).float().numpy() for k, v in theirs.items()}
        ours = {k: result.params[k].numpy() for k in theirs}
        diffs["muon " + " ".join(map(str, case))] = _max_abs_diff(ours, theirs)
    print("\nreference vs Emerging-Optimizers 0.3.0, max |diff| per case:")
    for name, diff in diffs.items():
        print(f"  {diff:.3g}  {name}")
    return diffs


@pytest.mark.parametrize("kind", ["ns full", "ns duplicated", "ns distributed", "ns blockwise", "muon"])
def test_reference_is_bitwise_equal_to_emerging_optimizers(compared, kind):
    mine = {name: diff for name, diff in compared.items() if name.startswith(kind)}
    assert mine and all(diff == 0.0 for diff in mine.values()), mine
