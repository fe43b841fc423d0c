"""Inspection output shared by the allocators: chunk records, memory map, occupancy."""

from __future__ import annotations

import numpy as np

from ..errors import FailureRecord, InvalidPointerError, OutOfMemoryError
from ..stats import format_bytes

# One row per chunk, in address order: what ``memory_map`` and the renderers read.
RECORD_DTYPE = np.dtype(
    [
        ("address", np.int64),
        ("size", np.int64),
        ("requested_size", np.int64),
        ("bin", np.int64),
        ("in_use", np.bool_),
        ("allocation_id", np.int64),
        ("freed_at_count", np.int64),
    ]
)


def bin_of(size: int, min_allocation: int, num_bins: int) -> int:
    """TF's ``BinNumForSize`` in plain Python."""
    v = max(size, min_allocation) // min_allocation
    return min(num_bins - 1, v.bit_length() - 1)


def bin_summary(records: np.ndarray, min_allocation: int, num_bins: int) -> list[dict]:
    """TF's ``get_bin_debug_info``: every chunk counted in the bin for its size."""
    out = []
    sizes = records["size"]
    bins = np.array([bin_of(int(s), min_allocation, num_bins) for s in sizes], dtype=np.int64)
    used = records["in_use"]
    for b in range(num_bins):
        sel = bins == b
        u = sel & used
        out.append(
            {
                "bin": b,
                "bin_size": min_allocation << b,
                "total_bytes_in_use": int(sizes[u].sum()),
                "total_bytes_in_bin": int(sizes[sel].sum()),
                "total_chunks_in_use": int(u.sum()),
                "total_chunks_in_bin": int(sel.sum()),
                "total_requested_bytes_in_use": int(records["requested_size"][u].sum()),
            }
        )
    return out


def render_occupancy(records: np.ndarray, regions: list[tuple[int, int]], width: int = 100) -> str:
    """TF's ``RenderOccupancy``: ``width`` characters over all regions laid end to end.

    ``*`` marks requested bytes of in-use chunks, ``x`` their rounding/padding
    waste, ``_`` free memory.
    """
    if type(width) is not int:
        raise TypeError(f"width must be an int, got {type(width).__name__}")
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    total = sum(size for _, size in regions)
    if total == 0:
        return "<allocator contains no memory>"
    out = ["_"] * width

    def paint(pos: int, size: int, ch: str) -> None:
        start = pos * width // total
        end = (pos + size - 1) * width // total
        for i in range(start, end + 1):
            out[i] = ch

    offset = 0
    addresses = records["address"]
    for base, size in regions:
        lo = np.searchsorted(addresses, base)
        hi = np.searchsorted(addresses, base + size)
        for rec in records[lo:hi]:
            if not rec["in_use"]:
                continue
            pos = int(rec["address"]) - base + offset
            req = int(rec["requested_size"])
            wasted = int(rec["size"]) - req
            if wasted > 0:
                paint(pos + req, wasted, "x")
            if req > 0:
                paint(pos, req, "*")
        offset += size
    return "".join(out)


def chunk_list(records: np.ndarray) -> list[dict]:
    """Records as JSON-serialisable dicts."""
    return [
        {
            "address": int(r["address"]),
            "size": int(r["size"]),
            "requested_size": int(r["requested_size"]),
            "bin": int(r["bin"]),
            "in_use": bool(r["in_use"]),
            "allocation_id": int(r["allocation_id"]),
            "freed_at_count": int(r["freed_at_count"]),
        }
        for r in records
    ]


def oom_message(name: str, num_bytes: int, rounded: int, alignment: int, stats,
                limit: int, reason: str) -> str:
    """The OutOfMemoryError text: what was asked, and why it could not be served
    (``stats``: an ``AllocatorStats`` or a callable that builds it)."""
    if callable(stats):
        stats = stats()
    # Only the reason given is formatted: a message read on every failure
    # (a retry loop that logs it) pays for one.
    if reason == "limit":
        why = f"the request is larger than the memory limit ({format_bytes(limit)})"
    elif reason == "fragmentation":
        why = (f"fragmentation: {format_bytes(stats.bytes_reserved - stats.bytes_in_use)} "
               f"free in the pool and {format_bytes(limit - stats.bytes_reserved)} not yet "
               f"reserved, but the largest free chunk is "
               f"{format_bytes(stats.largest_free_block_bytes)}")
    elif reason == "exhausted":
        why = (f"memory exhausted: {format_bytes(stats.bytes_in_use)} in use of a "
               f"{format_bytes(limit)} limit")
    elif reason == "backend":
        why = "the backend refused to provide more memory"
    else:
        raise ValueError(f"unknown out-of-memory reason {reason!r}")
    return (
        f"Allocator ({name}) ran out of memory trying to allocate {format_bytes(num_bytes)} "
        f"(rounded to {rounded}, alignment {alignment}): {why}. "
        f"In use {stats.bytes_in_use}, reserved {stats.bytes_reserved}, limit {limit}, "
        f"largest free block {stats.largest_free_block_bytes}, "
        f"fragmentation {stats.fragmentation:.3f}."
    )


def invalid_pointer_error(name: str, records: np.ndarray, p: int) -> InvalidPointerError:
    """Say why ``p`` is not a live allocation: a double free, an interior pointer,
    or an address this allocator never handed out."""
    i = int(np.searchsorted(records["address"], p, side="right")) - 1
    if i >= 0:
        rec = records[i]
        start, size = int(rec["address"]), int(rec["size"])
        if start == p and not rec["in_use"]:
            return InvalidPointerError(
                f"{name}: {p:#x} is not allocated (double free?)", ptr=p, kind="double_free")
        if start < p < start + size:
            return InvalidPointerError(
                f"{name}: {p:#x} is an interior pointer into the block at {start:#x} "
                f"(size {size}); pass the address allocate_raw returned",
                ptr=p, kind="interior")
    return InvalidPointerError(
        f"{name}: {p:#x} was not allocated by this allocator", ptr=p, kind="unknown")


def brief_oom(name: str, num_bytes: int, rounded: int, alignment: int,
              reason: str) -> OutOfMemoryError:
    """An out-of-memory error with the request and the reason only (no stats,
    no report): what a batch hands its ``on_oom`` after the first failure,
    when the caller asked for the first one in full only."""
    return OutOfMemoryError(
        f"Allocator ({name}) ran out of memory trying to allocate {num_bytes} bytes ({reason}); "
        "a batch reports its first failure in full only", allocator_name=name,
        num_bytes=num_bytes, rounded_bytes=rounded, alignment=alignment, reason=reason)


class Failure(FailureRecord):
    """A failed allocation as taken at the failure: the allocator's counters
    and largest free chunk, from which its ``OutOfMemoryError`` builds the
    stats, the message and the report on first read.

    The allocator's class (static methods, so that nothing holds the
    allocator) builds the stats (``_failure_stats(counters, largest,
    limit)``) and the message (``_failure_message(error, stats, counters,
    limit)``), and summarises its bins (``_bin_summary(records)``);
    ``fingerprint`` (what its ``_fingerprint_from`` makes its
    ``_report_fingerprint`` from, at the failure; None if it has none: then
    the report is built now) tells whether the allocator changed before the
    report was read.
    """

    __slots__ = ("_allocator", "_kind", "_counters", "_fingerprint", "_largest", "_limit",
                 "_built", "_stats")

    def __init__(self, allocator, counters, fingerprint, largest: int, limit) -> None:
        # Weak (the allocator's own, made once): a kept exception must not keep
        # an allocator (and its memory) alive.
        self._allocator = allocator._weak_self
        self._kind = allocator.__class__
        self._counters = counters
        self._fingerprint = fingerprint
        self._largest = largest
        self._limit = limit
        self._built = None if fingerprint is not None else self._build_report(allocator)

    def stats(self):
        try:
            return self._stats
        except AttributeError:
            self._stats = self._kind._failure_stats(self._counters, self._largest, self._limit)
            return self._stats

    def message(self, error: OutOfMemoryError) -> str:
        return self._kind._failure_message(error, self.stats(), self._counters, self._limit)

    def report(self) -> tuple[list[dict], str, bool]:
        if self._built is not None:
            return self._built
        allocator = self._allocator()
        if allocator is None:
            return [], "", True
        with allocator._lock:
            return self._build_report(allocator)

    def _build_report(self, allocator) -> tuple[list[dict], str, bool]:
        records = allocator._records()
        return (self._kind._bin_summary(records),
                render_occupancy(records, allocator._region_list()),
                self._fingerprint is not None
                and allocator._report_fingerprint() != self._kind._fingerprint_from(
                    self._fingerprint))
