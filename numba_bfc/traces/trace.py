"""``Trace``: a stream of allocation events, validated and paired.

A trace is a structured array of ``EVENT_DTYPE``: ``op`` (0 allocate, 1
free), ``id`` (names the allocation; an id may be reused once freed),
``size`` (bytes; a free's size is its allocation's, 0 in the input means
"unknown"), ``stream`` (0 when unknown) and ``time`` (seconds, NaN when
unknown). Validation pairs every free with its allocation in one kernel pass
and names the first bad event: a free of an unknown or already freed id, an
allocation reusing a live id, a non-positive size.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import InputError
from ..planning.records import RECORD_DTYPE
from . import _kernels as K
from .formats import read_columns, write_events

__all__ = ["EVENT_DTYPE", "PROBLEMS", "Trace", "TraceError", "read_trace", "write_trace"]

EVENT_DTYPE = np.dtype([
    ("op", np.int8), ("id", np.int64), ("size", np.int64), ("stream", np.int64),
    ("time", np.float64),
])

#: Problem names, by the status codes of the pairing kernel.
PROBLEMS = {
    K.UNKNOWN_FREE: "unknown_free",
    K.DOUBLE_FREE: "double_free",
    K.LIVE_ID_REUSED: "live_id_reused",
    K.BAD_SIZE: "bad_size",
    K.BAD_OP: "bad_op",
    K.SIZE_MISMATCH: "size_mismatch",
}
_EXPLAIN = {
    K.UNKNOWN_FREE: "frees id {id}, which was never allocated",
    K.DOUBLE_FREE: "frees id {id}, which is already freed",
    K.LIVE_ID_REUSED: "allocates id {id}, which is still live",
    K.BAD_SIZE: "allocates {size} bytes (sizes must be > 0)",
    K.BAD_OP: "has op {op} (expected 0 = alloc or 1 = free)",
    K.SIZE_MISMATCH: "frees id {id} with size {size}, but it was allocated with {alloc_size}",
}


_MAX_INT64 = (1 << 63) - 1


_CLEAN_HINT = "Trace.clean() drops and counts them"
#: The field each problem is about.
_PROBLEM_FIELDS = {"unknown_free": "id", "double_free": "id", "live_id_reused": "id",
                   "bad_size": "size", "bad_op": "op", "size_mismatch": "size",
                   "live_bytes_overflow": "size"}


class TraceError(InputError):
    """A trace event that cannot be replayed (an ``InputError``, so a ``ValueError``).

    Attributes
    ----------
    index : int
        The event's position in the trace.
    problem : str
        One of ``PROBLEMS``' values, or ``"live_bytes_overflow"`` (the bytes
        live at once pass int64).
    path, line, field : str, int, str or None
        As for ``InputError``: the file (or the trace's name when it was not
        read from one), the event's line in a text file, the field at fault.
    hint : str
        What fixes it, appended to the message (empty when nothing does).
    """

    def __init__(self, reason: str, *, index: int, problem: str, path: str | None = None,
                 line: int | None = None, hint: str = "") -> None:
        self.index = index
        self.problem = problem
        self.hint = hint
        super().__init__(reason, path=path, line=line, field=_PROBLEM_FIELDS.get(problem))

    def _compose(self) -> str:
        message = super()._compose()
        return f"{message}; {self.hint}" if self.hint else message


def _column(values, n: int, dtype, name: str, default) -> np.ndarray:
    if values is None:
        return np.full(n, default, dtype=dtype)
    arr = np.asarray(values)
    if arr.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},), got {arr.shape}")
    if dtype != np.float64:
        if arr.size and arr.dtype.kind not in "iub":
            if arr.dtype.kind != "f" or not np.all(arr == np.floor(arr)):
                raise TypeError(f"{name} must be integers, got dtype {arr.dtype}")
        if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
            raise ValueError(f"{name} does not fit in int64")
    return arr.astype(dtype)


class Trace:
    """A validated stream of allocation events.

    Parameters
    ----------
    events : numpy.ndarray
        Structured array of ``EVENT_DTYPE`` (other dtypes with those field
        names are converted; missing ``stream``/``time`` fields default to 0/NaN).
    name : str
    validate : bool
        Check the events now and raise ``TraceError`` naming the first bad one
        (default). With False, call ``validate()`` or ``clean()`` later.

    Examples
    --------
    >>> from numba_bfc.traces import Trace
    >>> t = Trace.from_arrays(op=[0, 0, 1, 1], id=[1, 2, 1, 2], size=[100, 300, 0, 0])
    >>> len(t), t.num_allocations, t.peak_requested_bytes
    (4, 2, 400)
    >>> t.sizes.tolist()  # a free's size is its allocation's
    [100, 300, 100, 300]
    """

    def __init__(self, events: np.ndarray, name: str = "trace", validate: bool = True) -> None:
        events = np.asarray(events)
        if events.dtype != EVENT_DTYPE:
            if events.dtype.names is None or not {"op", "id", "size"} <= set(events.dtype.names):
                raise TypeError("events must be a structured array with op, id and size fields")
            names = events.dtype.names
            events = self._build(events["op"], events["id"], events["size"],
                                 events["stream"] if "stream" in names else None,
                                 events["time"] if "time" in names else None)
        elif events.ndim != 1:
            raise ValueError("events must be one-dimensional")
        else:
            events = events.copy()
        self._events = events
        self._events.flags.writeable = False
        self.name = str(name)
        #: Events dropped by ``clean()``, by problem name (empty otherwise).
        self.dropped: dict[str, int] = {}
        self._pairing: tuple[np.ndarray, np.ndarray, int] | None = None
        self._derived: dict[str, Any] = {}  # slots, live bytes, counts: computed once
        self._valid = False
        if validate:
            self.validate()

    @staticmethod
    def _build(op, id, size, stream=None, time=None) -> np.ndarray:
        op = np.asarray(op)
        n = op.shape[0] if op.ndim == 1 else -1
        if n < 0:
            raise ValueError(f"op must be one-dimensional, got shape {op.shape}")
        events = np.empty(n, dtype=EVENT_DTYPE)
        events["op"] = _column(op, n, np.int8, "op", 0)
        events["id"] = _column(id, n, np.int64, "id", 0)
        events["size"] = _column(size, n, np.int64, "size", 0)
        events["stream"] = _column(stream, n, np.int64, "stream", 0)
        events["time"] = _column(time, n, np.float64, "time", np.nan)
        return events

    @classmethod
    def from_arrays(cls, op, id, size, stream=None, time=None, *, name: str = "trace",
                    validate: bool = True) -> Trace:
        """A trace from columns (``op``: 0/1, ``id``, ``size``, optional ``stream``, ``time``)."""
        return cls(cls._build(op, id, size, stream, time), name=name, validate=validate)

    # ------------------------------------------------------------------ columns
    @property
    def events(self) -> np.ndarray:
        """The events (read-only structured array of ``EVENT_DTYPE``)."""
        return self._events

    @property
    def ops(self) -> np.ndarray:
        return self._events["op"]

    @property
    def ids(self) -> np.ndarray:
        return self._events["id"]

    @property
    def sizes(self) -> np.ndarray:
        return self._events["size"]

    @property
    def streams(self) -> np.ndarray:
        return self._events["stream"]

    @property
    def times(self) -> np.ndarray:
        return self._events["time"]

    def __len__(self) -> int:
        return self._events.shape[0]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        a, b = self._events, other._events
        return (a.shape == b.shape and all(np.array_equal(a[f], b[f]) for f in
                                           ("op", "id", "size", "stream"))
                and np.array_equal(a["time"], b["time"], equal_nan=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        state = "" if self._valid else ", not validated"
        return (f"Trace({self.name!r}, {len(self)} events, {self.num_allocations} allocations, "
                f"peak {self.peak_requested_bytes if self._valid else '?'} bytes{state})")

    # ------------------------------------------------------------------ validation
    def _pair(self) -> tuple[np.ndarray, np.ndarray, int]:
        if self._pairing is None:
            ops, ids, sizes = self.ops, self.ids, self.sizes
            uniq, dense = np.unique(ids, return_inverse=True)
            status = np.zeros(len(ops), dtype=np.int8)
            partner = np.full(len(ops), -1, dtype=np.int64)
            first_bad = K.pair_events(ops, dense.astype(np.int64).ravel(), sizes,
                                      np.full(uniq.shape[0], -1, dtype=np.int64),
                                      np.zeros(uniq.shape[0], dtype=np.uint8), status, partner,
                                      False)
            self._pairing = (status, partner, int(first_bad))
        return self._pairing

    def problems(self) -> dict[str, int]:
        """How many events have each problem (an empty dict for a valid trace)."""
        status = self._pair()[0]
        codes, counts = np.unique(status[status != K.OK], return_counts=True)
        return {PROBLEMS[int(c)]: int(k) for c, k in zip(codes, counts)}

    def validate(self) -> Trace:
        """Raise ``TraceError`` naming the first bad event; fill in free sizes. Returns self."""
        if self._valid:
            return self
        status, partner, first_bad = self._pair()
        if first_bad >= 0:
            code = int(status[first_bad])
            e = self._events[first_bad]
            alloc_size = 0
            if code == K.SIZE_MISMATCH:
                # The live allocation of this id: the last good allocation before it.
                before = slice(0, first_bad)
                same = np.flatnonzero((self.ids[before] == e["id"]) & (self.ops[before] == 0)
                                      & (status[before] == K.OK))
                alloc_size = int(self.sizes[same[-1]]) if same.size else 0
            what = _EXPLAIN[code].format(id=int(e["id"]), size=int(e["size"]), op=int(e["op"]),
                                         alloc_size=alloc_size)
            more = int(np.count_nonzero(status)) - 1
            raise TraceError(
                f"event {first_bad} {what}" + (f" ({more} more bad events)" if more else ""),
                index=first_bad, problem=PROBLEMS[code], path=self.name, hint=_CLEAN_HINT)
        frees = np.flatnonzero(self.ops == K.FREE)
        if frees.size:
            sizes = self._events["size"].copy()
            sizes[frees] = sizes[partner[frees]]
            events = self._events.copy()
            events["size"] = sizes
            events.flags.writeable = False
            self._events = events
        self._check_live_bytes_fit()
        self._valid = True
        return self

    def _check_live_bytes_fit(self) -> None:
        """Refuse a trace whose requested bytes live at once pass int64: every
        peak, series and replay counts them in int64."""
        allocs = self.ops == K.ALLOC
        sizes = self._events["size"]
        count = int(np.count_nonzero(allocs))
        if not count or int(sizes[allocs].max()) <= _MAX_INT64 // count:
            return  # even all of them live at once fit
        live = np.cumsum(np.where(allocs, sizes, -sizes).astype(object))  # Python ints: exact
        over = np.flatnonzero(live > _MAX_INT64)
        if over.size:
            i = int(over[0])
            raise TraceError(f"event {i} makes the requested bytes live at once {live[i]}, "
                             "more than int64 holds (2**63 - 1)",
                             index=i, problem="live_bytes_overflow", path=self.name)

    def clean(self) -> Trace:
        """A valid trace without the bad events; ``.dropped`` counts them by problem."""
        status = self._pair()[0]
        bad = status != K.OK
        if not bad.any():
            out = Trace(self._events, self.name)
        else:
            out = Trace(self._events[~bad], self.name)
        out.dropped = dict(self.dropped)
        for problem, count in self.problems().items():
            out.dropped[problem] = out.dropped.get(problem, 0) + count
        return out

    @property
    def is_valid(self) -> bool:
        """True once ``validate()`` has passed."""
        return self._valid

    def _require_valid(self) -> None:
        if not self._valid:
            self.validate()

    # ------------------------------------------------------------------ derived
    @property
    def num_allocations(self) -> int:
        """How many allocation events the trace holds (counted once, when first
        asked: every ``replay()`` asks)."""
        if "allocations" not in self._derived:  # a pass over the events: once
            self._derived["allocations"] = int(np.count_nonzero(self.ops == K.ALLOC))
        return self._derived["allocations"]

    def partners(self) -> np.ndarray:
        """For an allocation, the index of its free (-1: never freed); for a
        free, the index of its allocation."""
        self._require_valid()
        return self._pair()[1]

    def slots(self) -> np.ndarray:
        """Every event's allocation number: ``0..num_allocations-1`` in order of
        allocation; a free carries its allocation's number."""
        self._require_valid()
        if "slots" not in self._derived:
            alloc = self.ops == K.ALLOC
            slot = np.cumsum(alloc, dtype=np.int64) - 1
            frees = np.flatnonzero(~alloc)
            slot[frees] = slot[self.partners()[frees]]
            slot.flags.writeable = False
            self._derived["slots"] = slot
        return self._derived["slots"]

    def live_bytes(self) -> np.ndarray:
        """Requested bytes live after each event."""
        self._require_valid()
        if "live" not in self._derived:
            live = np.cumsum(np.where(self.ops == K.ALLOC, self.sizes, -self.sizes))
            live.flags.writeable = False
            self._derived["live"] = live
        return self._derived["live"]

    @property
    def peak_requested_bytes(self) -> int:
        """Most requested bytes live at once: no allocator can need less."""
        live = self.live_bytes()
        return int(live.max()) if live.size else 0

    def lifetimes(self) -> np.ndarray:
        """One usage record per allocation (``numba_bfc.planning.RECORD_DTYPE``).

        Time is counted in allocations: allocation ``k`` is live from task
        ``k`` through the task of the last allocation made before its free
        (through the end if never freed), so two records conflict exactly when
        the allocations were live at the same time.
        """
        self._require_valid()
        alloc = self.ops == K.ALLOC
        count = np.cumsum(alloc, dtype=np.int64)  # allocations made up to each event
        idx = np.flatnonzero(alloc)
        partner = self.partners()[idx]
        rec = np.empty(idx.size, dtype=RECORD_DTYPE)
        rec["size"] = self.sizes[idx]
        rec["first"] = np.arange(idx.size)
        freed = partner >= 0
        last = np.full(idx.size, max(idx.size - 1, 0), dtype=np.int64)
        last[freed] = count[partner[freed]] - 1
        rec["last"] = last
        return rec

    def summary(self) -> dict[str, Any]:
        """Counts and sizes: events, allocations, frees, never freed, peak bytes."""
        self._require_valid()
        allocs = self.ops == K.ALLOC
        sizes = self.sizes[allocs]
        return {
            "name": self.name, "events": len(self), "allocations": int(allocs.sum()),
            "frees": int((~allocs).sum()),
            "never_freed": int(np.count_nonzero(self.partners()[allocs] < 0)),
            "peak_requested_bytes": self.peak_requested_bytes,
            "total_requested_bytes": sum(sizes.tolist()),  # Python ints: never wraps
            "largest_allocation": int(sizes.max()) if sizes.size else 0,
            "dropped": dict(self.dropped),
        }

    # ------------------------------------------------------------------ files
    @classmethod
    def read(cls, path: str | os.PathLike, format: str | None = None, *, clean: bool = False,
             name: str | None = None, **options) -> Trace:
        """Read a trace file: ``read_trace``."""
        return read_trace(path, format, clean=clean, name=name, **options)

    def write(self, path: str | os.PathLike, format: str | None = None) -> None:
        """Write the trace as ``"csv"`` (``.gz`` compresses), ``"rmm"`` or
        ``"torch_snapshot"``; None picks from the file name (csv by default)."""
        write_trace(self, path, format)

    # ------------------------------------------------------------------ recording
    @classmethod
    @contextlib.contextmanager
    def record(cls, allocator, name: str | None = None) -> Iterator[TraceRecorder]:
        """Record what ``allocator`` is asked to do, inside a ``with`` block.

        The allocator's ``allocate_raw`` and ``deallocate_raw`` are wrapped for
        the block's duration (every caller, the Numba plugin included, goes
        through them); failed requests are not recorded. The recorder's
        ``trace`` is ready after the block.

        >>> from numba_bfc import BFCAllocator
        >>> from numba_bfc.backends import VirtualSubAllocator
        >>> from numba_bfc.traces import Trace
        >>> a = BFCAllocator(VirtualSubAllocator(), memory_limit=1 << 20)
        >>> with Trace.record(a) as rec:
        ...     p = a.allocate_raw(1000)
        ...     a.deallocate_raw(p)
        >>> rec.trace.sizes.tolist()
        [1000, 1000]
        """
        recorder = TraceRecorder(allocator, name or f"{getattr(allocator, 'name', 'allocator')}")
        recorder._start()
        try:
            yield recorder
        finally:
            recorder._stop()


class TraceRecorder:
    """Collects an allocator's events for ``Trace.record``."""

    def __init__(self, allocator, name: str) -> None:
        self._allocator = allocator
        self._name = name
        self._lock = threading.RLock()
        self._rows: list[tuple[int, int, int, float]] = []
        self._live: dict[int, tuple[int, int]] = {}  # pointer -> (id, size)
        self._next_id = 0
        self._trace: Trace | None = None

    def _start(self) -> None:
        import time

        alloc = self._allocator
        if "allocate_raw" in vars(alloc) or "deallocate_raw" in vars(alloc):
            raise RuntimeError(f"{self._name} is already being recorded")
        allocate, deallocate = alloc.allocate_raw, alloc.deallocate_raw
        clock, t0 = time.perf_counter, time.perf_counter()

        # The lock is reentrant: a garbage collection under it can run a finalizer
        # that frees (or allocates) through the recorded allocator on this thread
        # (a plain lock deadlocked). Each event takes its id before anything is
        # allocated, so such an event comes out whole, recorded before the one
        # it interrupted.
        lock = self._lock

        def allocate_raw(num_bytes, *args, **kwargs):
            ptr = allocate(num_bytes, *args, **kwargs)
            if ptr:
                with lock:
                    event = self._next_id
                    self._next_id = event + 1
                    n = int(num_bytes)
                    self._live[ptr] = (event, n)
                    self._rows.append((K.ALLOC, event, n, clock() - t0))
            return ptr

        def deallocate_raw(ptr, *args, **kwargs):
            # The pointer's entry is taken before the free: once freed, another
            # thread may be handed the same address and record it as its own
            # (which may then come before this free's row: both ids stay right).
            with lock:
                entry = self._live.pop(ptr, None)
            try:
                deallocate(ptr, *args, **kwargs)
            except BaseException:
                if entry is not None:
                    with lock:
                        self._live[ptr] = entry
                raise
            if entry is not None:
                with lock:
                    self._rows.append((K.FREE, entry[0], entry[1], clock() - t0))

        alloc.allocate_raw = allocate_raw
        alloc.deallocate_raw = deallocate_raw

    def _stop(self) -> None:
        vars(self._allocator).pop("allocate_raw", None)
        vars(self._allocator).pop("deallocate_raw", None)
        with self._lock:
            rows = list(self._rows)
        op, ids, sizes, times = (list(c) for c in zip(*rows)) if rows else ([], [], [], [])
        self._trace = Trace.from_arrays(np.array(op, np.int8), np.array(ids, np.int64),
                                        np.array(sizes, np.int64), time=np.array(times),
                                        name=self._name)

    @property
    def trace(self) -> Trace:
        """The recorded trace (after the ``with`` block)."""
        if self._trace is None:
            raise RuntimeError("the trace is ready when the with block ends")
        return self._trace


def read_trace(path: str | os.PathLike, format: str | None = None, *, clean: bool = False,
               name: str | None = None, **options) -> Trace:
    """Read a trace file; ``numba_bfc.traces.formats`` describes the formats.

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
    where = os.fspath(path)
    base = os.path.basename(where)
    cols, lines, dropped = read_columns(where, format, **options)
    trace = Trace.from_arrays(cols["op"], cols["id"], cols["size"], cols.get("stream"),
                              cols.get("time"), name=name or base.split(".")[0] or base,
                              validate=False)
    trace.dropped = dict(dropped)
    if clean:
        return trace.clean()
    try:
        trace.validate()
    except TraceError as e:
        raise e.located(where, None if lines is None else int(lines[e.index])) from None
    return trace


def write_trace(trace: Trace, path: str | os.PathLike, format: str | None = None) -> None:
    """Write ``trace`` as ``csv`` (default; gzip for ``.gz``), ``rmm`` or ``torch_snapshot``."""
    trace.validate()
    write_events(trace.events, trace.slots(), path, format)
