"""Trace files: our CSV, RMM's log, PyTorch snapshots and profiler traces.

* ``csv``: a header naming at least ``op,id,size`` (``stream`` and ``time``
  are read when present, other columns ignored), then one event per line;
  ``op`` is ``a`` (allocate) or ``f`` (free); a free's size may be empty or 0.
  ``.gz`` files are decompressed.
* ``rmm``: the CSV of RMM's ``logging_resource_adaptor`` (``numba_bfc.traces.rmm_log``);
  pointers become ids (an address reused after its free is a new allocation),
  ``allocate failure`` rows are dropped and counted.
* ``torch_snapshot``: ``torch.cuda.memory._dump_snapshot`` pickles, read
  without torch (``numba_bfc.traces.torch_io``).
* ``torch_profiler``: the Chrome trace of ``torch.profiler`` with
  ``profile_memory=True`` (its ``[memory]`` events).

This module reads and writes the event columns (``op``, ``id``, ``size``,
``stream``, ``time``); ``Trace.read`` / ``read_trace`` and ``Trace.write`` /
``write_trace`` (``numba_bfc.traces.trace``) make them a validated ``Trace``.
"""

from __future__ import annotations

import gzip
import math
import os

import numpy as np

from ..errors import InputError, reading_file
from . import _kernels as K
from .rmm_log import ACTIONS, RmmLogEvent, RmmLogWriter, events_to_array
from .rmm_log import read_rows as read_rmm_rows
from .torch_io import assign_ids

__all__ = ["FORMATS", "guess_format", "read_columns", "write_events"]

FORMATS = ("csv", "rmm", "torch_snapshot", "torch_profiler")
_OP_LETTER = {"a": K.ALLOC, "f": K.FREE}


def _open_text(path: str | os.PathLike, mode: str = "rt"):
    if str(path).endswith(".gz"):
        return gzip.open(path, mode, encoding="utf-8", newline="")
    return open(path, mode, encoding="utf-8", newline="")


def _read_head(path: str | os.PathLike, nbytes: int = 4096) -> bytes:
    with open(path, "rb") as f:
        head = f.read(nbytes)
    if head[:2] == b"\x1f\x8b":
        with gzip.open(path, "rb") as f:
            head = f.read(nbytes)
    return head


def guess_format(path: str | os.PathLike) -> str:
    """The format of a trace file, from its name and first bytes."""
    name = str(path).lower().removesuffix(".gz")
    if name.endswith((".pickle", ".pkl")):
        return "torch_snapshot"
    head = _read_head(path)
    if head[:1] == b"\x80":  # pickle protocol 2+
        return "torch_snapshot"
    if name.endswith(".json") or head.lstrip()[:1] in (b"{", b"["):
        return "torch_profiler"
    first = head.split(b"\n", 1)[0].decode("utf-8", "replace")
    cells = {c.strip().lstrip("\ufeff") for c in first.split(",")}
    if {"Action", "Pointer"} <= cells:
        return "rmm"
    return "csv"


# ---------------------------------------------------------------------- csv
_INT64 = np.iinfo(np.int64)


def _parse_csv(text: str) -> tuple[dict, np.ndarray]:
    """The event columns, and the line number of each event (errors name lines)."""
    lines = text.splitlines()
    start = 0
    while start < len(lines) and not lines[start].strip():
        start += 1
    if start == len(lines):
        raise InputError("empty file (expected a header naming op,id,size)")
    header = [c.strip().lstrip("\ufeff").lower() for c in lines[start].split(",")]
    missing = [c for c in ("op", "id", "size") if c not in header]
    if missing:
        raise InputError(f"the header must name op, id and size (missing {', '.join(missing)})"
                         f": {lines[start][:200]!r}", line=start + 1)
    width = len(header)
    rows = [(number, line.split(",")) for number, line in enumerate(lines[start + 1:],
                                                                    start=start + 2)
            if line.strip()]
    for number, cells in rows:
        if len(cells) != width:
            raise InputError(f"{len(cells)} fields, the header has {width}", line=number)
    numbers = np.array([r[0] for r in rows], dtype=np.int64)
    if not rows:
        empty = np.zeros(0, dtype=np.int64)
        return {"op": empty.astype(np.int8), "id": empty, "size": empty}, numbers
    table = np.array([r[1] for r in rows], dtype=str)
    table = np.char.strip(table)

    def col(field: str, kind: str, empty: str) -> np.ndarray:
        cells = table[:, header.index(field)]
        cells = np.where(cells == "", empty, cells)
        try:
            return cells.astype(kind)
        except (ValueError, OverflowError):
            pass  # find the bad cell, or parse what NumPy does not (e.g. "1_000")
        values = []
        for number, cell in zip(numbers.tolist(), cells.tolist()):
            try:
                value = float(cell) if kind == "f8" else int(cell)
            except ValueError:
                raise InputError(f"bad {field} {cell[:100]!r}", line=number,
                                 field=field) from None
            if kind == "i8" and not _INT64.min <= value <= _INT64.max:
                raise InputError(f"{field} {cell} does not fit in int64", line=number,
                                 field=field)
            values.append(value)
        return np.array(values, dtype=kind)

    letters = table[:, header.index("op")]
    op = np.full(len(rows), -1, dtype=np.int8)
    for letter, code in _OP_LETTER.items():
        op[letters == letter] = code
    bad = np.flatnonzero(op < 0)
    if bad.size:
        raise InputError(f"op must be 'a' or 'f', got {str(letters[bad[0]])[:100]!r}",
                         line=int(numbers[bad[0]]), field="op")
    cols = {"op": op, "id": col("id", "i8", "x"), "size": col("size", "i8", "0")}
    if "stream" in header:
        cols["stream"] = col("stream", "i8", "0")
    if "time" in header:
        cols["time"] = col("time", "f8", "nan")
    return cols, numbers


def _format_csv(ev: np.ndarray) -> str:
    letters = np.where(ev["op"] == K.ALLOC, "a", "f")
    cols = [letters, ev["id"].astype(str), ev["size"].astype(str)]
    header = ["op", "id", "size"]
    if ev["stream"].any():
        header.append("stream")
        cols.append(ev["stream"].astype(str))
    if not np.isnan(ev["time"]).all():
        header.append("time")
        cols.append(np.array(["" if math.isnan(t) else repr(t) for t in ev["time"].tolist()]))
    lines = [",".join(header)]
    if len(ev):
        joined = cols[0]
        for c in cols[1:]:
            joined = np.char.add(np.char.add(joined, ","), c)
        lines.extend(joined.tolist())
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- rmm
def _from_rmm(source) -> tuple[dict, np.ndarray, int]:
    """The event columns without failed allocations, the line number of each
    event, and how many failed allocations were dropped."""
    rows, numbers = read_rmm_rows(source)
    events = events_to_array(rows)
    failed = events["action"] == ACTIONS.index("allocate failure")
    kept = events[~failed]
    ops = np.where(kept["action"] == ACTIONS.index("allocate"), K.ALLOC, K.FREE).astype(np.int8)
    cols = {"op": ops, "id": assign_ids(ops, kept["pointer"]), "size": kept["size"],
            "stream": kept["stream"], "time": kept["time_us"] * 1e-6}
    return cols, np.asarray(numbers, dtype=np.int64)[~failed], int(np.count_nonzero(failed))


def _write_rmm(ev: np.ndarray, slots: np.ndarray, path) -> None:
    import datetime as dt

    # Synthetic addresses: unique per allocation, 256-byte aligned, never null.
    writer = RmmLogWriter(path)
    try:
        for op, slot, size, stream, t in zip(ev["op"].tolist(), slots.tolist(),
                                             ev["size"].tolist(), ev["stream"].tolist(),
                                             ev["time"].tolist()):
            micros = 0 if math.isnan(t) else int(round(t * 1e6)) % 86_400_000_000
            clock = (dt.datetime.min + dt.timedelta(microseconds=micros)).time()
            writer.write(RmmLogEvent(0, clock, "allocate" if op == K.ALLOC else "free",
                                     (slot + 1) << 8, size, stream))
    finally:
        writer.close()


# ---------------------------------------------------------------------- dispatch
def read_columns(path: str | os.PathLike, format: str | None = None,
                 **options) -> tuple[dict, np.ndarray | None, dict[str, int]]:
    """The event columns of a trace file (``op``, ``id``, ``size``, and
    ``stream`` and ``time`` when the format has them), each event's line in a
    text file (None for the others), and the events dropped while reading, by
    reason. Most callers want ``Trace.read``.

    Raises ``InputError`` naming the file, line and field of what cannot be
    read, ``OSError`` for a file that cannot be opened, ``ValueError`` for an
    unknown ``format``.
    """
    if format is not None and format not in FORMATS:
        raise ValueError(f"unknown trace format {format!r} "
                         f"(expected one of {', '.join(FORMATS)})")
    lines, dropped = None, {}
    with reading_file(path):
        fmt = format or guess_format(path)
        if fmt == "csv":
            with _open_text(path) as f:
                cols, lines = _parse_csv(f.read())
        elif fmt == "rmm":
            with _open_text(path) as f:
                cols, lines, failures = _from_rmm(f)
            if failures:
                dropped["allocate_failure"] = failures
        else:
            from . import torch_io

            reader = (torch_io.read_torch_snapshot if fmt == "torch_snapshot"
                      else torch_io.read_profiler_trace)
            cols = reader(path, **options)
    return cols, lines, dropped


def write_events(events: np.ndarray, slots: np.ndarray, path: str | os.PathLike,
                 format: str | None = None) -> None:
    """Write validated events (``Trace.events``, and ``Trace.slots()`` for the
    RMM log's synthetic addresses) as ``csv`` (default; gzip for ``.gz``),
    ``rmm`` or ``torch_snapshot``. Most callers want ``Trace.write``."""
    name = str(path).lower()
    fmt = format or ("torch_snapshot" if name.endswith((".pickle", ".pkl")) else "csv")
    if fmt == "csv":
        with _open_text(path, "wt") as f:
            f.write(_format_csv(events))
    elif fmt == "rmm":
        if name.endswith(".gz"):
            with gzip.open(path, "wt", encoding="ascii", newline="\n") as f:
                _write_rmm(events, slots, f)
        else:
            _write_rmm(events, slots, path)
    elif fmt == "torch_snapshot":
        from . import torch_io

        torch_io.write_torch_snapshot(path, {f: events[f] for f in ("op", "id", "size",
                                                                    "stream", "time")})
    else:
        raise ValueError(f"cannot write format {fmt!r} (expected csv, rmm or torch_snapshot)")
