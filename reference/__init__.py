"""The reference backend: the real Muon / AdamW math on torch.distributed, checked and measured.

Only this package imports torch (lazily, per module); it depends on ``workloads`` for shapes, the
collective record and the measured-run schema. Importing the package itself is cheap.

Modules (one idea each):

* :mod:`reference.newton_schulz` — coefficient schedules, Newton–Schulz, scale factors;
* :mod:`reference.muon_math` — Muon step (EO order), fused-QKV split, AdamW;
* :mod:`reference.tp_ns` — full-matrix and tensor-parallel (duplicated / distributed / blockwise) NS;
* :mod:`reference.workload` — shapes from the project inventory, seeded params and dyadic gradients;
* :mod:`reference.layout` — Megatron bucket layouts and layer-wise assignments (pure, no torch);
* :mod:`reference.buffers`, :mod:`reference.optimizers` — flat buffers and the distributed optimizers;
* :mod:`reference.instrument` — recorded collectives, phase clocks, NS FLOP counters;
* :mod:`reference.grid`, :mod:`reference.runner` — the dp × tp grid and one rank's training loop;
* :mod:`reference.serial` — the single-process reference every mode is compared against;
* :mod:`reference.processes` — local fork launcher and its supervision;
* :mod:`reference.launch` — ``python -m reference.launch`` (local) / torchrun entry;
* :mod:`reference.api` — ``run_reference(config) -> RunResult`` (collectives, phases, checks).
"""
