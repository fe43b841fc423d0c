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
from .trace import Trace, TraceError

__all__ = ["FORMATS", "guess_format", "read_trace", "write_trace"]

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


def _parse_csv(text: str, name: str) -> tuple[Trace, np.ndarray]:
    """The trace, and the line number of each event (errors name lines)."""
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
        return Trace(np.empty(0, dtype=[("op", "i1"), ("id", "i8"), ("size", "i8")]),
                     name), numbers
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
    stream = col("stream", "i8", "0") if "stream" in header else None
    time = col("time", "f8", "nan") if "time" in header else None
    trace = Trace.from_arrays(op, col("id", "i8", "x"), col("size", "i8", "0"), stream, time,
                              name=name, validate=False)
    return trace, numbers


def _format_csv(trace: Trace) -> str:
    ev = trace.events
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
    if len(trace):
        joined = cols[0]
        for c in cols[1:]:
            joined = np.char.add(np.char.add(joined, ","), c)
        lines.extend(joined.tolist())
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- rmm
def _from_rmm(source, name: str) -> tuple[Trace, np.ndarray]:
    """The trace without failed allocations (counted in ``dropped``), and
    the line number of each event."""
    rows, numbers = read_rmm_rows(source)
    events = events_to_array(rows)
    failed = events["action"] == ACTIONS.index("allocate failure")
    kept = events[~failed]
    ops = np.where(kept["action"] == ACTIONS.index("allocate"), K.ALLOC, K.FREE).astype(np.int8)
    trace = Trace.from_arrays(ops, assign_ids(ops, kept["pointer"]), kept["size"],
                              kept["stream"], kept["time_us"] * 1e-6, name=name, validate=False)
    if failed.any():
        trace.dropped["allocate_failure"] = int(np.count_nonzero(failed))
    return trace, np.asarray(numbers, dtype=np.int64)[~failed]


def _write_rmm(trace: Trace, path) -> None:
    import datetime as dt

    # Synthetic addresses: unique per allocation, 256-byte aligned, never null.
    slots = trace.slots()
    writer = RmmLogWriter(path)
    try:
        for op, slot, size, stream, t in zip(trace.ops.tolist(), slots.tolist(),
                                             trace.sizes.tolist(), trace.streams.tolist(),
                                             trace.times.tolist()):
            micros = 0 if math.isnan(t) else int(round(t * 1e6)) % 86_400_000_000
            clock = (dt.datetime.min + dt.timedelta(microseconds=micros)).time()
            writer.write(RmmLogEvent(0, clock, "allocate" if op == K.ALLOC else "free",
                                     (slot + 1) << 8, size, stream))
    finally:
        writer.close()


# ---------------------------------------------------------------------- dispatch
def read_trace(path: str | os.PathLike, format: str | None = None, *, clean: bool = False,
               name: str | None = None, **options) -> Trace:
    """Read a trace file; see the module docstring for the formats.

    Parameters
    ----------
    path : str or path-like
    format : str, optional
        One of ``FORMATS``; guessed from the name and content when None.
    clean : bool
        Drop events that cannot be replayed (frees of blocks allocated before
        recording started, ...) and count them in ``.dropped``, instead of
        raising ``TraceError``.
    name : str, optional
        The trace's name (default: the file name without extensions).
    **options
        Passed to the format's reader (``device=`` for torch snapshots,
        ``device_type=`` for profiler traces).

    Raises
    ------
    InputError
        The file's content cannot be read: its message names the file, the
        line (text formats) and the field. ``TraceError``, a subclass, when an
        event cannot be replayed (with ``clean=False``).
    OSError
        The file cannot be opened.
    ValueError
        ``format`` is not one of ``FORMATS``.
    """
    if format is not None and format not in FORMATS:
        raise ValueError(f"unknown trace format {format!r} "
                         f"(expected one of {', '.join(FORMATS)})")
    where = os.fspath(path)
    base = os.path.basename(where)
    name = name or base.split(".")[0] or base
    lines = None  # each event's line, for text formats
    with reading_file(where):
        fmt = format or guess_format(path)
        if fmt in ("csv", "rmm"):
            with _open_text(path) as f:
                parse = _parse_csv if fmt == "csv" else _from_rmm
                trace, lines = parse(f.read() if fmt == "csv" else f, name)
        else:
            from . import torch_io

            reader = (torch_io.read_torch_snapshot if fmt == "torch_snapshot"
                      else torch_io.read_profiler_trace)
            cols = reader(path, **options)
            trace = Trace.from_arrays(cols["op"], cols["id"], cols["size"], cols.get("stream"),
                                      cols.get("time"), name=name, validate=False)
    try:
        return _finish(trace, clean)
    except TraceError as e:
        raise e.located(where, None if lines is None else int(lines[e.index])) from None


def _finish(trace: Trace, clean: bool) -> Trace:
    if clean:
        return trace.clean()
    dropped = trace.dropped
    trace.validate()
    trace.dropped = dropped
    return trace


def write_trace(trace: Trace, path: str | os.PathLike, format: str | None = None) -> None:
    """Write ``trace`` as ``csv`` (default; gzip for ``.gz``), ``rmm`` or ``torch_snapshot``."""
    trace.validate()
    name = str(path).lower()
    fmt = format or ("torch_snapshot" if name.endswith((".pickle", ".pkl")) else "csv")
    if fmt == "csv":
        with _open_text(path, "wt") as f:
            f.write(_format_csv(trace))
    elif fmt == "rmm":
        if name.endswith(".gz"):
            with gzip.open(path, "wt", encoding="ascii", newline="\n") as f:
                _write_rmm(trace, f)
        else:
            _write_rmm(trace, path)
    elif fmt == "torch_snapshot":
        from . import torch_io

        ev = trace.events
        torch_io.write_torch_snapshot(path, {f: ev[f] for f in ("op", "id", "size", "stream",
                                                                "time")})
    else:
        raise ValueError(f"cannot write format {fmt!r} (expected csv, rmm or torch_snapshot)")
