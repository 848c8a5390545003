"""Terminal rendering of a plan (rich): ranking, reference, Pareto front, best plan, sensitivity."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from costmodel.planner.result import PlanResult, PlanRow

if TYPE_CHECKING:
    from costmodel.report import StepReport


def _gb(x: float) -> str:
    return f"{x / 1e9:,.1f}"


def _split(label: str) -> tuple[str, str]:
    par, _, opt = label.partition(" | ")
    return par, opt


def _rank(row: PlanRow) -> str:
    if row.rank is not None:
        return str(row.rank)
    if row.rank_range is not None:
        return f"{row.rank_range[0]}–{row.rank_range[1]}"
    return "-"


def ranking_table(result: PlanResult) -> Any:
    """The ranked plans (plus the reference scenario's row when it is not among them)."""
    from rich import box
    from rich.table import Table

    t = Table(title="ranked plans: the fastest fitting optimizer choice per layout (head re-ranked by the DES)",
              title_justify="left", box=box.SIMPLE_HEAD, show_lines=False, pad_edge=False)
    t.add_column("#", justify="right")
    t.add_column("plan: layout / optimizer", max_width=28)
    t.add_column("step s", justify="right")
    t.add_column("tok/s/GPU", justify="right")
    t.add_column("mem GB", justify="right")
    t.add_column("limited by")

    def add(row: PlanRow, style: str | None = None) -> None:
        par, opt = _split(row.label)
        step = f"{row.step_time_s:.3f}" + (f"\nDES {row.des_step_time_s:.3f}" if row.des_step_time_s is not None else "")
        mem = f"{_gb(row.memory_per_gpu_bytes)}\n{row.memory_fraction_of_budget:.0%}"
        tag = "  ← reference" if row.reference else ""
        t.add_row(_rank(row), f"{par}\n{opt}{tag}", step, f"{row.tokens_per_s_per_gpu:,.0f}", mem,
                  row.limiter.replace(" · ", "\n").replace("comm:", ""), style=style)

    for row in result.ranking:
        add(row, "bold" if row.reference else None)
    ref = result.reference
    if ref.row is not None and not any(r.reference for r in result.ranking):
        t.add_section()
        add(ref.row, "bold")
    return t


def pareto_table(result: PlanResult, limit: int = 8) -> Any:
    """The Pareto front of step time vs memory per GPU (least memory first)."""
    from rich.table import Table

    t = Table(title="Pareto front: step time vs memory per GPU (evaluated plans)", title_justify="left")
    for name in ("memory GB", "analytic s", "plan"):
        t.add_column(name, justify="left" if name == "plan" else "right")
    front = result.pareto_front
    shown = front if len(front) <= limit else [front[round(k * (len(front) - 1) / (limit - 1))] for k in range(limit)]
    for row in shown:
        t.add_row(_gb(row.memory_per_gpu_bytes), f"{row.step_time_s:.3f}", row.label + ("  ← reference" if row.reference else ""))
    if len(front) > len(shown):
        t.caption = f"{len(shown)} of {len(front)} points shown (all in --json / --html)"
    return t


def reference_line(result: PlanResult) -> str:
    ref = result.reference
    if ref.status == "invalid" and ref.label is None:
        return f"reference scenario: {ref.message}"
    if ref.row is None:
        return f"reference scenario ({ref.label}): {ref.status}: {ref.message}"
    row = ref.row
    if row.rank is not None:
        rank = f"#{row.rank}"
    else:
        about = f"about #{ref.rank_estimate:,} (sampled), " if ref.rank_estimate is not None else ""
        rank = f"{about}between #{row.rank_range[0]:,} and #{row.rank_range[1]:,}" if row.rank_range else "-"
    best = result.best
    gap = ""
    if best is not None and best.label != row.label:
        both_des = row.des_step_time_s is not None and best.des_step_time_s is not None
        r_t = row.des_step_time_s if both_des and row.des_step_time_s is not None else row.step_time_s
        b_t = best.des_step_time_s if both_des and best.des_step_time_s is not None else best.step_time_s
        delta = r_t - b_t
        gap = f"; the best plan is {delta:.3f} s/step faster ({delta / r_t:.1%}, {'DES' if both_des else 'analytic'})"
    elif best is not None:
        gap = "; it is the best plan"
    return f"reference scenario ranks {rank}: {row.label}, {row.step_time_s:.3f} s/step analytic{gap}"


def sensitivity_text(result: PlanResult) -> str:
    s = result.sensitivity
    if not s:
        return "sensitivity: not run"
    if not s.get("samples"):
        return f"sensitivity: {s.get('note') or 'skipped'}"
    return (f"sensitivity ({s['samples']} draws; {s['source']}): the best plan stays best in "
            f"{s['top1_stability_fraction']:.0%} of draws; Kendall τ of the top {len(s['plans'])} vs nominal: mean "
            f"{s['kendall_tau_mean']:.2f}, worst {s['kendall_tau_min']:.2f}")


def stats_text(result: PlanResult) -> str:
    st = result.stats
    rate = f"{st.candidates_per_s:,.0f} candidates/s, " if st.candidates_per_s else ""
    verb = "searched" if not st.candidates_unexamined else "interrupted while searching"
    unexamined = f"{st.candidates_unexamined:,} never examined, " if st.candidates_unexamined else ""
    return (f"{verb} {st.candidates:,} candidates ({st.groups:,} groups over {st.layouts_screened:,} layouts × recompute; "
            f"{st.valid_layouts:,} valid layouts of {st.raw_combinations:,} combinations, "
            f"{st.layouts_over_memory_by_weights:,} dropped: weights alone exceed memory): "
            f"{st.bounds_computed:,} pipeline bounds, {st.candidates_evaluated:,} full analytic evaluations, "
            f"{st.candidates_pruned:,} pruned as provably slower, {unexamined}"
            f"{st.groups_infeasible:,} groups out of memory or invalid, "
            f"{st.bound_violations} bound violations. Screening {st.screening_wall_s:.1f} s on {st.jobs} processes "
            f"({rate}{st.engine_calls_per_s:,.0f} engine calls/s), DES {st.des_wall_s:.1f} s, "
            f"sensitivity {st.sensitivity_wall_s:.1f} s, total {st.total_wall_s:.1f} s.")


def render(result: PlanResult, best_report: StepReport | None = None) -> Any:
    """Everything ``muonsim plan`` prints, as one rich renderable."""
    from rich.console import Group
    from rich.text import Text

    from workloads.models import model_label

    sc = result.scenario
    par = sc.get("parallelism", {})
    head = Text(f"muonsim plan: {model_label(sc.get('model'))} on {sc.get('gpus')} × {sc.get('system')}, "
                f"gbs {par.get('global_batch_size')} × seq {par.get('seq_length')}, {sc.get('precision')}; "
                f"pins: {result.pins}; memory budget {_gb(result.memory_budget_bytes)} GB per GPU "
                f"({result.memory_headroom_fraction:.0%} headroom); calibration: {result.calibration}", style="bold")
    parts: list[Any] = [head]
    if result.scenario_source:
        parts.append(Text(f"base scenario {result.scenario_source}", style="dim"))
    if result.interrupted:
        parts.append(Text("interrupted (Ctrl-C or SIGTERM): partial results below", style="bold yellow"))
    if result.ranking:
        parts.append(ranking_table(result))
    else:
        parts.append(Text("no plan fits in memory and passes the validator" if not result.interrupted
                          else "no plan found before the interruption", style="bold red"))
    parts.append(Text(reference_line(result)))
    if result.pareto_front:
        parts.append(pareto_table(result))
    if best_report is not None:
        from costmodel.exporters import render_table

        parts.append(Text(f"best plan: {result.best.label if result.best else ''}", style="bold"))
        parts.append(render_table(best_report))
    parts.append(Text(sensitivity_text(result)))
    for e in result.explain:
        parts.append(Text(f"why not {e['message']}"))
    parts.append(Text(stats_text(result), style="dim"))
    for note in result.notes:
        parts.append(Text(f"note: {note}", style="yellow"))
    return Group(*parts)

