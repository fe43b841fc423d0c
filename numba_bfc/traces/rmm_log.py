"""RMM's allocation log: the CSV that ``rmm::mr::logging_resource_adaptor`` writes.

Format (one header line, then one line per event)::

    Thread,Time,Action,Pointer,Size,Stream
    140213,14:03:22.123456,allocate,0x7f3a40000000,1024,0
    140213,14:03:22.123502,free,0x7f3a40000000,1024,0
    140213,14:03:22.123610,allocate failure,(nil),4294967296,0

* Thread: the OS thread id (spdlog's ``%t``).
* Time: local wall-clock ``%H:%M:%S.%f``, microseconds (spdlog's pattern).
* Action: ``allocate``, ``free`` or ``allocate failure``.
* Pointer: hexadecimal with ``0x`` (``printf("%p")``); a null pointer is
  ``(nil)`` in RMM 25+ (glibc ``%p``) and ``0x0`` in older, fmt-based RMM.
* Size: decimal bytes (the requested size, also for frees).
* Stream: the CUDA stream handle in hexadecimal (``0`` for the default one).

``read_rmm_log`` accepts both RMM generations and what ``RmmLogWriter``
writes; columns are found by header name, as RMM's replay benchmark does.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from collections.abc import Iterable, Iterator
from typing import IO, NamedTuple

import numpy as np

from ..errors import InputError, reading_file

__all__ = [
    "ACTIONS",
    "EVENT_DTYPE",
    "HEADER",
    "RmmLogEvent",
    "RmmLogWriter",
    "events_to_array",
    "format_rmm_event",
    "read_rmm_log",
    "write_rmm_log",
]

HEADER = "Thread,Time,Action,Pointer,Size,Stream"
_COLUMNS = HEADER.split(",")
#: Action names, indexed by the ``action`` code of ``EVENT_DTYPE``.
ACTIONS = ("allocate", "free", "allocate failure")
_ACTION_CODE = {a: i for i, a in enumerate(ACTIONS)}

#: One event per row; ``time_us`` is microseconds since midnight.
EVENT_DTYPE = np.dtype([
    ("thread", np.uint64), ("time_us", np.int64), ("action", np.int8),
    ("pointer", np.uint64), ("size", np.uint64), ("stream", np.uint64),
])

_HEX_RE = re.compile(r"^(?:0[xX])?[0-9a-fA-F]+$")
_TIME_RE = re.compile(r"^(\d{1,2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?$")
_NULL_POINTER = "(nil)"  # glibc's printf("%p") of a null pointer


class RmmLogEvent(NamedTuple):
    """One row of an RMM log."""

    thread: int
    time: _dt.time
    action: str
    pointer: int
    size: int
    stream: int = 0


def format_rmm_event(event: RmmLogEvent) -> str:
    """The CSV line for ``event``, without the newline, formatted as RMM does."""
    if event.action not in _ACTION_CODE:
        raise ValueError(f"action must be one of {ACTIONS}, got {event.action!r}")
    # As RMM: printf("%p") for the pointer, a C++ stream of the handle for the stream.
    pointer = f"{event.pointer:#x}" if event.pointer else _NULL_POINTER
    stream = f"{event.stream:#x}" if event.stream else "0"
    return (f"{event.thread},{event.time.strftime('%H:%M:%S.%f')},{event.action},"
            f"{pointer},{event.size},{stream}")


class RmmLogWriter:
    """Writes an RMM log: the header at once, then ``write(event)`` per row.

    ``target`` is a path (opened for writing, truncating as RMM does, and
    closed by ``close()``) or an open text file (left open). Not thread-safe:
    callers serialise (``LoggingAllocator`` does, under its lock).
    """

    def __init__(self, target: str | os.PathLike | IO[str], auto_flush: bool = False) -> None:
        if isinstance(target, (str, os.PathLike)):
            self._file: IO[str] = open(target, "w", encoding="ascii", newline="\n")
            self._owns_file = True
        elif hasattr(target, "write"):
            self._file = target
            self._owns_file = False
        else:
            raise TypeError(f"expected a path or a text file, not {type(target).__name__}")
        self.auto_flush = bool(auto_flush)
        self.closed = False
        self._file.write(HEADER + "\n")
        self._maybe_flush()

    def write(self, event: RmmLogEvent) -> None:
        if self.closed:
            raise ValueError("write to a closed RmmLogWriter")
        self._file.write(format_rmm_event(event) + "\n")
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        if self.auto_flush:
            self._file.flush()

    def flush(self) -> None:
        if not self.closed:
            self._file.flush()

    def close(self) -> None:
        """Flush; close the file if this writer opened it. Idempotent."""
        if self.closed:
            return
        self._file.flush()
        self.closed = True
        if self._owns_file:
            self._file.close()


def write_rmm_log(target: str | os.PathLike | IO[str], events: Iterable[RmmLogEvent]) -> None:
    """Write ``events`` as a complete RMM log."""
    writer = RmmLogWriter(target)
    try:
        for event in events:
            writer.write(event)
    finally:
        writer.close()


_MAX_UINT64 = (1 << 64) - 1
_MAX_INT64 = (1 << 63) - 1


def _parse_hex(text: str, field: str, line: int) -> int:
    if text == _NULL_POINTER:
        return 0
    if not _HEX_RE.match(text):
        raise InputError(f"bad {field.lower()} {text!r} (expected hexadecimal)", line=line,
                         field=field)
    value = int(text, 16)
    if value > _MAX_UINT64:
        raise InputError(f"{field.lower()} {text} does not fit in 64 bits", line=line,
                         field=field)
    return value


def _parse_decimal(text: str, field: str, line: int, largest: int) -> int:
    if not text.isdecimal():
        raise InputError(f"{field} must be a non-negative decimal integer, got {text!r}",
                         line=line, field=field)
    value = int(text)
    if value > largest:
        raise InputError(f"{field} {text} is above {largest}", line=line, field=field)
    return value


def _parse_time(text: str, line: int) -> _dt.time:
    m = _TIME_RE.match(text)
    if not m:
        raise InputError(f"bad time {text!r} (expected HH:MM:SS.ffffff)", line=line,
                         field="Time")
    hours, minutes, seconds, fraction = m.groups()
    micros = int((fraction or "0").ljust(6, "0")[:6])
    try:
        return _dt.time(int(hours), int(minutes), int(seconds), micros)
    except ValueError as e:
        raise InputError(f"bad time {text!r}: {e}", line=line, field="Time") from None


def _parse_rows(lines: Iterator[str]) -> tuple[list[RmmLogEvent], list[int]]:
    """The events and the line number of each."""
    header = None
    events = []
    numbers = []
    for number, raw in enumerate(lines, start=1):
        text = raw.strip().lstrip("\ufeff")
        if not text:
            continue
        cells = [c.strip() for c in text.split(",")]
        if header is None:
            missing = [c for c in _COLUMNS if c not in cells]
            if missing:
                raise InputError(f"not an RMM log header (missing {', '.join(missing)}): "
                                 f"{text[:200]!r}", line=number)
            header = {c: cells.index(c) for c in _COLUMNS}
            width = len(cells)
            continue
        if len(cells) != width:
            raise InputError(f"{len(cells)} fields, the header has {width}", line=number)
        action = cells[header["Action"]]
        if action not in _ACTION_CODE:
            raise InputError(f"unknown action {action[:100]!r} (expected one of "
                             f"{', '.join(ACTIONS)})", line=number, field="Action")
        events.append(RmmLogEvent(
            thread=_parse_decimal(cells[header["Thread"]], "Thread", number, _MAX_UINT64),
            time=_parse_time(cells[header["Time"]], number),
            action=action,
            pointer=_parse_hex(cells[header["Pointer"]], "Pointer", number),
            size=_parse_decimal(cells[header["Size"]], "Size", number, _MAX_INT64),
            stream=_parse_hex(cells[header["Stream"]], "Stream", number),
        ))
        numbers.append(number)
    if header is None:
        raise InputError("empty RMM log: no header line")
    return events, numbers


def read_rmm_log(source: str | os.PathLike | IO[str]) -> list[RmmLogEvent]:
    """Parse an RMM log (a path or an open text file) into its events, in file order.

    Raises
    ------
    InputError
        Naming the line and field of the first malformed row (a ``ValueError``).
    """
    return read_rows(source)[0]


def read_rows(source: str | os.PathLike | IO[str]) -> tuple[list[RmmLogEvent], list[int]]:
    """``read_rmm_log``'s events, and the line number of each."""
    if isinstance(source, (str, os.PathLike)):
        with reading_file(source), open(source, encoding="utf-8", newline="") as f:
            return _parse_rows(iter(f.read().splitlines()))
    if hasattr(source, "read"):
        return _parse_rows(iter(source.read().splitlines()))
    raise TypeError(f"expected a path or a text file, not {type(source).__name__}")


def events_to_array(events: Iterable[RmmLogEvent]) -> np.ndarray:
    """The events as a structured array of ``EVENT_DTYPE`` (action as its index in ``ACTIONS``)."""
    rows = [(e.thread,
             ((e.time.hour * 60 + e.time.minute) * 60 + e.time.second) * 1_000_000
             + e.time.microsecond,
             _ACTION_CODE[e.action], e.pointer, e.size, e.stream) for e in events]
    return np.array(rows, dtype=EVENT_DTYPE)
