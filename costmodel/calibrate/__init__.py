"""Calibration and validation: measured runs against the engines.

``profile`` (calibration profiles: fitted factors per system), ``fit`` / ``fit_surrogate`` /
``fit_runs`` (fitting the named efficiency factors with held-out error), ``validation`` (errors of
predictions against measured runs) and ``validation_figures``, ``microbench`` (this machine's GEMM and
gloo rates) and ``reference_check`` (reference-backend runs against the cost model).
"""
