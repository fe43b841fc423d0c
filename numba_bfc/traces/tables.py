"""Plain-text tables of replay results (``numba-bfc replay`` prints them)."""

from __future__ import annotations

from ..stats import format_bytes
from .replay import MinLimit, ReplayResult

__all__ = ["format_min_limits", "format_table"]


def format_table(results: list[ReplayResult]) -> str:
    """A plain-text table, one row per trace x policy (x limit, with a limit column
    when the results have different limits)."""
    head = ("trace", "policy", "events", "peak requested", "peak in use", "peak reserved",
            "reserved/req", "backend a/f", "OOMs", "Mevents/s")
    rows = [head]
    for r in results:
        ratio = "-" if r.peak_requested_bytes == 0 else f"{r.reserved_ratio:.3f}"
        rows.append((r.trace, r.policy, str(r.events), format_bytes(r.peak_requested_bytes),
                     format_bytes(r.peak_in_use_bytes), format_bytes(r.peak_reserved_bytes),
                     ratio, f"{r.backend_allocs}/{r.backend_frees}", str(r.ooms),
                     f"{r.events_per_second / 1e6:.2f}"))
    if any(r.offline_bytes for r in results):
        rows[0] = rows[0] + ("offline plan", "online/offline")
        for k, r in enumerate(results, start=1):
            rows[k] = rows[k] + (format_bytes(r.offline_bytes or 0),
                                 f"{r.online_overhead:.3f}" if r.online_overhead else "-")
    limits = {r.limit for r in results}
    if len(limits) > 1:  # a sweep over limits: say which row is which
        rows[0] = rows[0][:2] + ("limit",) + rows[0][2:]
        for k, r in enumerate(results, start=1):
            rows[k] = rows[k][:2] + (_limit(r.limit),) + rows[k][2:]
    lines = _layout(rows)
    for r in results:
        if r.first_oom is not None:
            o = r.first_oom
            at = f" at {_limit(r.limit)}" if len(limits) > 1 else ""
            lines.append(f"{r.trace}/{r.policy}{at}: first OOM at event {o.event} "
                         f"({format_bytes(o.size)}, {o.reason}): {o.message}")
    return "\n".join(lines)


def _limit(limit: int | None) -> str:
    return "none" if limit is None else format_bytes(limit)


def _layout(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows as aligned lines (the first two columns left, the rest right), a rule under the head."""
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if c < 2 else cell.rjust(w)
                       for c, (cell, w) in enumerate(zip(row, widths))) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def format_min_limits(results: list[MinLimit]) -> str:
    """A plain-text table of ``min_limit`` results, one row per trace x policy."""
    rows = [("trace", "policy", "peak live", "min limit", "x peak", "unlimited reserved",
             "x peak", "replays", "seconds")]
    for m in results:
        peak = m.peak_requested_bytes or 1
        rows.append((m.trace, m.policy, format_bytes(m.peak_requested_bytes),
                     format_bytes(m.limit), f"{m.limit / peak:.3f}",
                     format_bytes(m.unlimited_reserved_bytes),
                     f"{m.unlimited_reserved_bytes / peak:.3f}", str(m.replays),
                     f"{m.seconds:.2f}"))
    return "\n".join(_layout(rows))
