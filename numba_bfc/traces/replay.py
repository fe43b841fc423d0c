"""Replay a trace through an allocator policy and measure what it would need.

``replay`` runs the whole trace inside the batch kernel of the table-backed
allocators (``BFCAllocator``, ``CachingAllocator``): one kernel call per
chunk of events, Python only for the rare slow paths (a new region, growing
a table, an out-of-memory). Other allocators (the reference oracles, the
host allocator, wrappers) are driven one Python call per event.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..allocators import POLICIES as ALLOCATORS
from ..backends import VirtualSubAllocator
from ..errors import OutOfMemoryError
from ..framework.validate import check_alignment
from ..testing import ORACLES
from .trace import Trace

__all__ = ["MAX_LIMIT", "POLICIES", "SERIES_DTYPE", "MinLimit", "OOMEvent", "ReplayResult",
           "make_allocator", "min_limit", "replay"]

#: One row of a replay's time series: the most bytes of each kind over a
#: bucket of events ending at ``event``.
SERIES_DTYPE = np.dtype([("event", np.int64), ("requested", np.int64),
                         ("in_use", np.int64), ("reserved", np.int64)])

#: The memory limit of "no limit" for policies that need one (1 PiB).
UNLIMITED = 1 << 50
#: Where the simulated small space of the ``compact`` policy starts (far
#: above the large space's 2**40 base, so the two never meet).
SMALL_SPACE_BASE = 1 << 52
_CHUNK_EVENTS = 1 << 20  # kernel call granularity, for progress reports


def _bfc_factory(cls):
    def make(limit: int | None, backend, **options):
        # Replays ask "how much would it need": grow on demand unless told otherwise.
        options.setdefault("allow_growth", True)
        return cls(backend or VirtualSubAllocator(), memory_limit=limit or UNLIMITED, **options)

    return make


def _caching_factory(cls):
    def make(limit: int | None, backend, **options):
        if backend is None:
            # Expandable segments map pages at chosen addresses: a contiguous space.
            backend = VirtualSubAllocator(contiguous=bool(options.get("expandable_segments")))
        return cls(backend, memory_limit=limit, **options)

    return make


def _compact_factory(cls):
    def make(limit: int | None, backend, **options):
        # Contiguous spaces, as CUDA virtual-memory reservations give on a GPU.
        if backend is None:
            backend = VirtualSubAllocator(contiguous=True)
            options.setdefault("small_backend",
                               VirtualSubAllocator(contiguous=True, base=SMALL_SPACE_BASE))
        return cls(backend, memory_limit=limit or UNLIMITED, **options)

    return make


_FACTORIES = {"bfc": _bfc_factory, "caching": _caching_factory, "compact": _compact_factory}
#: Policy name (``numba_bfc.allocators.POLICIES``) -> factory ``(limit, backend or
#: None, **options) -> Allocator``. The ``*-oracle`` entries are the pure-Python
#: reference allocators.
POLICIES: dict[str, Callable[..., Any]] = {
    **{name: _FACTORIES[name](cls) for name, cls in ALLOCATORS.items()},
    **{f"{name}-oracle": _FACTORIES[name](cls) for name, cls in ORACLES.items()},
}


#: The largest memory limit a policy takes (its int64 arithmetic needs the headroom).
MAX_LIMIT = (1 << 62) - 1


def make_allocator(policy: str, limit: int | None = None, backend=None, **options):
    """A fresh allocator of ``policy`` (a ``POLICIES`` key) on ``backend``
    (default: a simulated address space, contiguous for ``compact``), limited
    to ``limit`` bytes (1 to ``MAX_LIMIT``; None for no limit)."""
    factory = POLICIES.get(policy)
    if factory is None:
        raise ValueError(f"unknown policy {policy!r} (expected one of {', '.join(POLICIES)})")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)):
            raise TypeError(f"limit must be an int or None, not {type(limit).__name__}")
        if not 1 <= limit <= MAX_LIMIT:
            raise ValueError(f"limit must be from 1 to 2**62 - 1 bytes (None for no limit), "
                             f"got {limit}")
        limit = int(limit)
    return factory(limit, backend, **options)


@dataclass(frozen=True)
class OOMEvent:
    """The first allocation a replay could not serve."""

    event: int
    size: int
    reason: str
    message: str


@dataclass(frozen=True)
class ReplayResult:
    """What a policy did with a trace.

    Byte peaks are exact (every event is sampled); ``series`` keeps, for each
    of at most ``series_points`` buckets of events, the most bytes requested,
    in use (after the policy's rounding) and reserved from the backend.
    """

    trace: str
    policy: str
    events: int
    peak_requested_bytes: int
    peak_in_use_bytes: int
    peak_reserved_bytes: int
    backend_allocs: int
    backend_frees: int
    ooms: int
    seconds: float
    limit: int | None = None
    first_oom: OOMEvent | None = None
    offline_bytes: int | None = None
    engine: str = "kernel"
    compile_seconds: float = 0.0
    series: np.ndarray = field(default_factory=lambda: np.zeros(0, SERIES_DTYPE), repr=False)
    addresses: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)

    @property
    def reserved_ratio(self) -> float:
        """Peak reserved / peak requested bytes (1.0 is perfect; NaN for an empty trace)."""
        return (self.peak_reserved_bytes / self.peak_requested_bytes
                if self.peak_requested_bytes else math.nan)

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else math.inf

    @property
    def online_overhead(self) -> float | None:
        """Peak reserved / the offline plan's arena (None without ``offline=True``)."""
        if not self.offline_bytes:
            return None
        return self.peak_reserved_bytes / self.offline_bytes

    def _repr_html_(self) -> str:
        """Jupyter's display: the metrics and the time series as a small chart."""
        from .._html import series_svg, table
        from ..stats import format_bytes

        rows = [("events", f"{self.events:,}"),
                ("peak requested", format_bytes(self.peak_requested_bytes)),
                ("peak in use", format_bytes(self.peak_in_use_bytes)),
                ("peak reserved", format_bytes(self.peak_reserved_bytes)),
                ("reserved / requested", f"{self.reserved_ratio:.3f}"),
                ("backend allocs / frees", f"{self.backend_allocs} / {self.backend_frees}"),
                ("OOMs", str(self.ooms)),
                ("M events/s", f"{self.events_per_second / 1e6:.2f}")]
        if self.offline_bytes:
            rows.append(("online / offline plan", f"{self.online_overhead:.3f}"))
        return (table(rows, f"replay of {self.trace} through {self.policy}")
                + series_svg(self.series))

    def to_dict(self) -> dict[str, Any]:
        """The metrics as plain JSON-ready values (no series, no addresses)."""
        out = {
            "trace": self.trace, "policy": self.policy, "engine": self.engine,
            "events": self.events, "limit": self.limit,
            "peak_requested_bytes": self.peak_requested_bytes,
            "peak_in_use_bytes": self.peak_in_use_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "reserved_ratio": None if math.isnan(self.reserved_ratio) else self.reserved_ratio,
            "backend_allocs": self.backend_allocs, "backend_frees": self.backend_frees,
            "ooms": self.ooms, "seconds": self.seconds,
            "compile_seconds": self.compile_seconds,
            "events_per_second": self.events_per_second if self.seconds > 0 else None,
            "offline_bytes": self.offline_bytes, "online_overhead": self.online_overhead,
            "first_oom": None,
        }
        if self.first_oom is not None:
            out["first_oom"] = {"event": self.first_oom.event, "size": self.first_oom.size,
                                "reason": self.first_oom.reason,
                                "message": self.first_oom.message}
        return out


class _StopReplay(Exception):
    pass


_warmed: set[type] = set()  # allocator classes whose batch kernels this process has run


def _warm_up(allocator, policy: str | None, limit: int | None, alignment: int,
             options: dict) -> float:
    """Compile (or load from Numba's cache) what a replay through ``allocator``
    runs, before the clock starts: an allocation and its free through the
    batch kernel of a throwaway allocator of the same policy (growth and all),
    or, for an instance, an empty batch. Once per class and process; returns
    the seconds it took."""
    cls = type(allocator)
    if cls in _warmed:
        return 0.0
    t0 = time.perf_counter()
    if policy is not None and "backend" not in options and "small_backend" not in options:
        throwaway = make_allocator(policy, limit, **options)
        ops, events = np.array([0, 1], dtype=np.int8), 2
    else:  # the user's backend: reserve nothing from it
        throwaway, ops, events = allocator, np.zeros(0, dtype=np.int8), 0
    ids, sizes = np.zeros(2, dtype=np.int64), np.ones(2, dtype=np.int64)
    with throwaway._lock:
        throwaway._drive_batch(ops, ids, sizes, alignment, np.full(1, -1, dtype=np.int64),
                               np.zeros(2, dtype=np.int64), 0, events,
                               np.zeros((2, 2), dtype=np.int64), 1, lambda i, e: None)
    _warmed.add(cls)
    return time.perf_counter() - t0


def _usage(allocator) -> tuple[int, int]:
    usage = getattr(allocator, "_usage", None)
    if usage is not None:
        return usage()
    stats = allocator.get_stats()
    return stats.bytes_in_use, stats.bytes_reserved


def _backend_counts(allocator) -> tuple[int, int]:
    backends = [getattr(allocator, "backend", None), getattr(allocator, "small_backend", None)]
    return (sum(getattr(b, "num_allocs", 0) for b in backends),
            sum(getattr(b, "num_frees", 0) for b in backends))


def replay(
    trace: Trace | str | os.PathLike,
    allocator: Any = "bfc",
    *,
    limit: int | None = None,
    alignment: int = 256,
    series_points: int = 1024,
    offline: bool = False,
    stop_on_oom: bool = False,
    engine: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    **options,
) -> ReplayResult:
    """Replay ``trace`` through an allocator.

    Parameters
    ----------
    trace : Trace or path
        A path is read with ``Trace.read`` (which raises on bad events).
    allocator : str or Allocator
        A policy name (``POLICIES``: a fresh allocator on a simulated address
        space) or an allocator instance (replayed from its current state).
    limit : int, optional
        Memory limit in bytes for a policy name, 1 to ``MAX_LIMIT`` (None: unlimited).
    alignment : int
        Alignment of every allocation.
    series_points : int
        Buckets of the time series (0: none).
    offline : bool
        Also plan the trace's lifetimes offline (``greedy_by_size`` offsets)
        and report the arena size, to compare with the online peak.
    stop_on_oom : bool
        End at the first allocation that fails instead of skipping it.
    engine : {"auto", "kernel", "python"}
        ``kernel`` needs a table-backed allocator; ``python`` calls
        ``allocate_raw``/``deallocate_raw`` once per event; ``auto`` picks
        ``kernel`` when it can.
    progress : callable, optional
        ``progress(done, total)`` after every chunk of events.
    **options
        Passed to the policy's allocator (e.g. ``max_split_size``).

    Returns
    -------
    ReplayResult
        ``seconds`` times the replay alone: the first replay of a policy in a
        process first compiles or loads its kernels on a throwaway allocator,
        timed apart in ``compile_seconds``.
    """
    if not isinstance(trace, Trace):
        trace = Trace.read(trace)
    trace.validate()
    allocator, policy, made = _resolve_allocator(allocator, limit, options)
    use_kernel = _use_kernel(allocator, engine)
    if series_points < 0:
        raise ValueError(f"series_points must be >= 0, got {series_points}")
    alignment = check_alignment(alignment)
    if use_kernel:
        alignment = allocator._batch_alignment(alignment)

    n = len(trace)
    # The batch kernel's argument types, exactly (TableStore.run_batch makes the same).
    ops = np.ascontiguousarray(trace.ops, dtype=np.int8)
    sizes = np.ascontiguousarray(trace.sizes, dtype=np.int64)
    slots = np.array(trace.slots(), dtype=np.int64)  # a writable copy
    # Peaks come from the samples, so there is always at least one bucket.
    stride = max(1, -(-n // max(series_points, 1)))
    usage = np.zeros((-(-n // stride) if stride else 0, 2), dtype=np.int64)
    ptrs = np.full(trace.num_allocations or 1, -1, dtype=np.int64)
    addresses = np.zeros(n, dtype=np.int64)
    failures = _Failures(sizes, stop_on_oom)

    compile_seconds = (_warm_up(allocator, policy if made else None, limit, alignment, options)
                       if use_kernel else 0.0)
    allocs0, frees0 = _backend_counts(allocator)
    t0 = time.perf_counter()
    try:
        drive = _replay_kernel if use_kernel else _replay_python
        done = drive(allocator, ops, slots, sizes, alignment, ptrs, addresses, usage, stride,
                     failures, progress)
    except _StopReplay:
        done = failures.first.event + 1
    seconds = time.perf_counter() - t0
    allocs1, frees1 = _backend_counts(allocator)

    requested = trace.live_bytes()[:done]
    series = _series(requested, usage, done, stride)
    offline_bytes = None
    if offline:
        from ..planning import assign_offsets

        offline_bytes = assign_offsets(trace.lifetimes(), "greedy_by_size").total_size
    return ReplayResult(
        trace=trace.name, policy=policy, events=done,
        peak_requested_bytes=int(requested.max()) if done else 0,
        peak_in_use_bytes=int(series["in_use"].max()) if series.size else 0,
        peak_reserved_bytes=int(series["reserved"].max()) if series.size else 0,
        backend_allocs=allocs1 - allocs0, backend_frees=frees1 - frees0, ooms=failures.count,
        seconds=seconds, limit=limit, first_oom=failures.first,
        offline_bytes=offline_bytes, engine="kernel" if use_kernel else "python",
        compile_seconds=compile_seconds,
        series=series if series_points else np.zeros(0, SERIES_DTYPE),
        addresses=addresses[:done],
    )


def _resolve_allocator(allocator, limit: int | None, options: dict):
    """``(allocator, policy name, made here)`` for a policy name or an instance."""
    if isinstance(allocator, str):
        return make_allocator(allocator, limit, **options), allocator, True
    if limit is not None or options:
        raise ValueError("limit and options apply to a policy name, not an allocator "
                         "instance (configure the instance instead)")
    return allocator, getattr(allocator, "name", type(allocator).__name__), False


def _use_kernel(allocator, engine: str) -> bool:
    if engine not in ("auto", "kernel", "python"):
        raise ValueError(f"engine must be 'auto', 'kernel' or 'python', got {engine!r}")
    has_kernel = hasattr(allocator, "_drive_batch")
    if engine == "kernel" and not has_kernel:
        raise TypeError(f"{type(allocator).__name__} has no batch kernel; use engine='python'")
    return has_kernel and engine != "python"


class _Failures:
    """A replay's ``on_oom``: counts the failed allocations and keeps the first;
    with ``stop``, ends the replay at it."""

    def __init__(self, sizes: np.ndarray, stop: bool) -> None:
        self._sizes = sizes
        self._stop = stop
        self.count = 0
        self.first: OOMEvent | None = None

    def __call__(self, i: int, error: OutOfMemoryError) -> None:
        self.count += 1
        if self.first is None:
            self.first = OOMEvent(i, int(self._sizes[i]), getattr(error, "reason", ""),
                                  str(error).split("\n", 1)[0])
        if self._stop:
            raise _StopReplay

    def add(self, count: int) -> None:
        """Count failures after the first that the batch kernel made itself."""
        self.count += count


def _replay_kernel(allocator, ops, slots, sizes, alignment, ptrs, addresses, usage, stride,
                   on_oom, progress) -> int:
    """The batch kernel, a chunk of events per call (for progress reports)."""
    n = ops.shape[0]
    with allocator._lock:
        for start in range(0, n, _CHUNK_EVENTS):
            stop = min(n, start + _CHUNK_EVENTS)
            # Only the first failure's message is kept: later ones brief.
            allocator._drive_batch(ops, slots, sizes, alignment, ptrs, addresses, start, stop,
                                   usage, stride, on_oom, brief_after_first=True,
                                   count_failures=on_oom.add)
            if progress is not None:
                progress(stop, n)
    return n


def _series(requested: np.ndarray, usage: np.ndarray, done: int, stride: int) -> np.ndarray:
    """The time series of the first ``done`` events, one row per ``stride`` of them."""
    if not done:
        return np.zeros(0, SERIES_DTYPE)
    buckets = -(-done // stride)
    series = np.zeros(buckets, SERIES_DTYPE)
    starts = np.arange(buckets) * stride
    series["event"] = np.minimum(starts + stride, done) - 1
    series["requested"] = np.maximum.reduceat(requested, starts)
    series["in_use"] = usage[:buckets, 0]
    series["reserved"] = usage[:buckets, 1]
    return series


def _replay_python(allocator, ops, slots, sizes, alignment, ptrs, addresses, usage, stride,
                   on_oom, progress) -> int:
    """One ``allocate_raw``/``deallocate_raw`` call per event."""
    n = ops.shape[0]
    allocate, deallocate = allocator.allocate_raw, allocator.deallocate_raw
    for i, (op, slot, size) in enumerate(zip(ops.tolist(), slots.tolist(), sizes.tolist())):
        if op == 0:
            try:
                p = allocate(size, alignment)
            except OutOfMemoryError as e:
                ptrs[slot] = 0
                on_oom(i, e)
            else:
                ptrs[slot] = addresses[i] = p
        else:
            p = int(ptrs[slot])
            if p:
                deallocate(p)
            ptrs[slot] = -1
        b = i // stride
        in_use, reserved = _usage(allocator)
        usage[b, 0] = max(usage[b, 0], in_use)
        usage[b, 1] = max(usage[b, 1], reserved)
        if progress is not None and (i + 1) % _CHUNK_EVENTS == 0:
            progress(i + 1, n)
    if progress is not None:
        progress(n, n)
    return n


@dataclass(frozen=True)
class MinLimit:
    """The smallest memory limit found at which a policy runs a trace with no OOM."""

    trace: str
    policy: str
    limit: int
    peak_requested_bytes: int
    unlimited_reserved_bytes: int
    replays: int
    seconds: float

    @property
    def factor(self) -> float:
        """``limit`` / peak requested (live) bytes; 1.0 is the floor no policy beats."""
        return self.limit / self.peak_requested_bytes if self.peak_requested_bytes else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {"trace": self.trace, "policy": self.policy, "limit": self.limit,
                "factor": None if math.isnan(self.factor) else self.factor,
                "peak_requested_bytes": self.peak_requested_bytes,
                "unlimited_reserved_bytes": self.unlimited_reserved_bytes,
                "replays": self.replays, "seconds": self.seconds}


def min_limit(trace: Trace | str | os.PathLike, policy: str = "bfc", *,
              tolerance: int | None = None, alignment: int = 256, **options) -> MinLimit:
    """Bisect the smallest memory limit at which ``policy`` replays ``trace``
    without an out-of-memory error.

    The search starts between the trace's peak live bytes (below which every
    policy fails) and the peak the policy reserves with no limit (grown until
    a replay at that limit succeeds, since a limit can change a policy's
    choices), and stops when the bracket is at most ``tolerance`` bytes wide
    (default: 0.1% of the peak, at least 256 B). Every replay stops at its
    first OOM.

    A policy need not be monotone in its limit (BFC sizes its regions from
    the limit): the result is the smallest limit the bisection saw succeed,
    with every limit it saw fail below it.

    Raises ``ValueError`` when the policy fails at every limit it takes
    (``MAX_LIMIT``).

    Returns
    -------
    MinLimit
    """
    if not isinstance(trace, Trace):
        trace = Trace.read(trace)
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} (expected one of {', '.join(POLICIES)})")
    peak = trace.peak_requested_bytes
    tol = max(256, peak // 1000) if tolerance is None else int(tolerance)
    if tol <= 0:
        raise ValueError(f"tolerance must be > 0, got {tolerance}")
    t0 = time.perf_counter()
    replays = 0

    def fits(limit: int | None) -> ReplayResult:
        nonlocal replays
        replays += 1
        return replay(trace, policy, limit=limit, alignment=alignment, series_points=1,
                      stop_on_oom=True, **options)

    # PyTorch's collector runs only against a per-process limit: unlimited, it is off.
    unlimited = replay(trace, policy, limit=None, alignment=alignment, series_points=1,
                       stop_on_oom=True,
                       **{k: v for k, v in options.items()
                          if k != "garbage_collection_threshold"}).peak_reserved_bytes
    replays += 1
    if peak == 0:
        return MinLimit(trace.name, policy, 0, 0, unlimited, replays,
                        time.perf_counter() - t0)
    hi = min(max(unlimited, peak), MAX_LIMIT)
    while fits(hi).ooms:
        if hi >= MAX_LIMIT:
            raise ValueError(f"{policy} runs out of memory on {trace.name} at every limit it "
                             f"takes (up to 2**62 - 1 bytes; peak live {peak} bytes)")
        hi = min(2 * hi, MAX_LIMIT)
    lo = peak - 1  # in-use bytes never fall below requested ones: this limit fails
    while hi - lo > tol:
        mid = (lo + hi) // 2
        if fits(mid).ooms:
            lo = mid
        else:
            hi = mid
    return MinLimit(trace.name, policy, hi, peak, unlimited, replays, time.perf_counter() - t0)
