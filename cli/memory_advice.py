"""What ``predict`` and ``compare`` say when a layout does not fit in GPU memory: by how much, which parts
are the largest, and which flags shrink those parts (a warning; the prediction itself is unchanged)."""

from __future__ import annotations

from typing import Any

# memory component -> (group of components one remedy serves, what shrinks that group)
_REMEDIES: dict[str, tuple[str, str]] = {
    "activations": ("activations", "--recompute selective or full, a smaller --mbs, or more --tp or --cp"),
    "weights": ("weights, their buffers and gradients", "more --pp, --tp or --ep"),
    "weight_buffers": ("weights, their buffers and gradients", "more --pp, --tp or --ep"),
    "gradients": ("weights, their buffers and gradients", "more --pp, --tp or --ep"),
    "optimizer_state": ("optimizer state", "more --pp, --tp or --ep, or more data-parallel ranks"),
    "optimizer_workspace": ("the optimizer workspace", "more --pp, --tp or --ep"),
}


def memory_advice(components_bytes: dict[str, float], total_bytes: float, capacity_bytes: float) -> str | None:
    """One line for a layout whose peak memory per GPU (``total_bytes``) exceeds ``capacity_bytes``: the
    excess in GB (1e9 bytes) and as a ratio, the three largest ``components_bytes`` and the flags that shrink
    the two largest; None when it fits."""
    if total_bytes <= capacity_bytes:
        return None
    over_gb = (total_bytes - capacity_bytes) / 1e9
    ratio = total_bytes / capacity_bytes if capacity_bytes > 0 else float("inf")
    largest = sorted(((v, k) for k, v in components_bytes.items() if v > 0), reverse=True)
    parts = ", ".join(f"{k.replace('_', ' ')} {v / 1e9:,.1f} GB" for v, k in largest[:3])
    remedies: list[str] = []
    for _, key in largest[:2]:
        subject, means = _REMEDIES.get(key, (key.replace("_", " "), "more --pp, --tp or --ep"))
        verb = " shrink" if not remedies else ""
        clause = f"{subject}{verb} with {means}"
        if not any(r.startswith(subject) for r in remedies):
            remedies.append(clause)
    return (f"does not fit in memory: {total_bytes / 1e9:,.1f} GB per GPU of {capacity_bytes / 1e9:,.1f} GB "
            f"({over_gb:,.1f} GB over, {ratio:.1f}x); largest parts: {parts}; {'; '.join(remedies)}; "
            "'muonsim plan' searches the layouts that fit")


def with_memory_advice(report: Any) -> Any:
    """``report`` with the :func:`memory_advice` warning added when its layout does not fit in memory."""
    mem = report.memory
    if mem is None:
        return report
    advice = memory_advice(dict(mem.components_bytes), mem.total_bytes, mem.capacity_bytes)
    if advice is None or advice in report.warnings:
        return report
    return report.model_copy(update={"warnings": [*report.warnings, advice]})
