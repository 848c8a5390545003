"""What-if planning (``muonsim plan``): the fastest parallel layouts and optimizer choices that fit.

Public API:

- :func:`costmodel.planner.plan.run_plan` (base scenario, :class:`~costmodel.planner.plan.PlanOptions`)
  -> :class:`~costmodel.planner.plan.PlanOutcome` (``.result``: :class:`~costmodel.planner.result.PlanResult`,
  the ``--json`` form; ``.evaluations``; ``.best_report``: the best plan's StepReport);
- :func:`costmodel.planner.pins.parse_pins` (pins and ``--min-/--max-`` bounds);
- :mod:`costmodel.planner.space` (candidates, groups, the vectorised validity filter);
- :class:`costmodel.planner.fast_analytic.FastAnalytic` (the analytic engine with shared optimizer plans
  and the pipeline bound used for pruning);
- :mod:`costmodel.planner.render` (rich) and :mod:`costmodel.planner.figures` (plotly HTML).

Modules: pins, space, memory_bound (weights-only memory floor, vectorised), bound (pipeline bound),
fast_analytic, evaluate (one candidate: validate, memory, step time), pool (fork workers), screen
(best-first search), ranking (order, Pareto, Kendall tau), sensitivity, explain, result, plan.
"""
