"""HTML for Jupyter's rich display (``_repr_html_``): tables and inline SVG strips.

Plain strings, no dependencies, so the core classes can show themselves in a
notebook without matplotlib.
"""

from __future__ import annotations

from html import escape

import numpy as np

REQUESTED = "#1f77b4"
PADDING = "#ff7f0e"
FREE = "#d9d9d9"


def table(rows: list[tuple[str, str]], title: str = "") -> str:
    """A two-column ``<table>`` of ``(name, value)`` rows, with an optional caption."""
    cap = f"<caption style='text-align:left'><b>{escape(title)}</b></caption>" if title else ""
    body = "".join(f"<tr><td style='text-align:left'>{escape(k)}</td>"
                   f"<td style='text-align:right'>{escape(v)}</td></tr>" for k, v in rows)
    return f"<table>{cap}{body}</table>"


def grid(header: list[str], rows: list[list[str]], title: str = "") -> str:
    """A ``<table>`` with a header row, text cells, and an optional caption."""
    cap = f"<caption style='text-align:left'><b>{escape(title)}</b></caption>" if title else ""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table>{cap}<tr>{head}</tr>{body}</table>"


def occupancy_svg(records: np.ndarray, regions: list[tuple[int, int]], width: int = 600,
                  height: int = 14) -> str:
    """Every region laid end to end as one strip: requested bytes blue, the
    rest of in-use chunks orange, free chunks grey (TF's ``RenderOccupancy``)."""
    total = sum(size for _, size in regions)
    rects = [f"<rect x='0' y='0' width='{width}' height='{height}' fill='{FREE}'/>"]
    if total:
        offset = 0
        for base, size in regions:
            lo, hi = np.searchsorted(records["address"], [base, base + size])
            part = records[lo:hi]
            used = part[part["in_use"]]
            for addr, nbytes, asked in zip(used["address"].tolist(), used["size"].tolist(),
                                           used["requested_size"].tolist()):
                x = (offset + addr - base) * width / total
                rects.append(_rect(x, nbytes * width / total, height, PADDING))
                rects.append(_rect(x, asked * width / total, height, REQUESTED))
            offset += size
        x = 0.0
        for _, size in regions[:-1]:  # region seams
            x += size * width / total
            rects.append(f"<line x1='{x:.2f}' y1='0' x2='{x:.2f}' y2='{height}' "
                         "stroke='black' stroke-width='1'/>")
    return (f"<svg width='{width}' height='{height}' xmlns='http://www.w3.org/2000/svg'>"
            + "".join(rects) + "</svg>")


def series_svg(series: np.ndarray, width: int = 600, height: int = 80) -> str:
    """Requested (black), in-use (dotted) and reserved (blue) bytes of a replay's series."""
    if series.size == 0:
        return ""
    top = max(int(series["reserved"].max()), int(series["requested"].max()), 1)
    last = max(int(series["event"][-1]), 1)
    lines = []
    for field, color, dash in (("reserved", REQUESTED, ""), ("in_use", REQUESTED, "2,2"),
                               ("requested", "black", "")):
        pts = " ".join(f"{e * width / last:.1f},{height - v * (height - 2) / top:.1f}"
                       for e, v in zip(series["event"].tolist(), series[field].tolist()))
        lines.append(f"<polyline points='{pts}' fill='none' stroke='{color}' "
                     f"stroke-width='1.2' stroke-dasharray='{dash}'/>")
    return (f"<svg width='{width}' height='{height}' xmlns='http://www.w3.org/2000/svg'>"
            + "".join(lines) + "</svg>")


def _rect(x: float, w: float, h: int, color: str) -> str:
    return f"<rect x='{x:.2f}' y='0' width='{max(w, 0.3):.2f}' height='{h}' fill='{color}'/>"
