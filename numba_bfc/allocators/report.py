"""Inspection output shared by the allocators: chunk records, memory map, occupancy."""

from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np

from ..errors import InvalidPointerError, OutOfMemoryError
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
    free_in_pool = stats.bytes_reserved - stats.bytes_in_use
    unallocated = limit - stats.bytes_reserved
    why = {
        "limit": f"the request is larger than the memory limit ({format_bytes(limit)})",
        "fragmentation": (
            f"fragmentation: {format_bytes(free_in_pool)} free in the pool and "
            f"{format_bytes(unallocated)} not yet reserved, but the largest free chunk is "
            f"{format_bytes(stats.largest_free_block_bytes)}"
        ),
        "exhausted": (
            f"memory exhausted: {format_bytes(stats.bytes_in_use)} in use of a "
            f"{format_bytes(limit)} limit"
        ),
        "backend": "the backend refused to provide more memory",
    }[reason]
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


def oom_report(allocator, summary: Callable[[np.ndarray], list[dict]] | None) -> dict:
    """``OutOfMemoryError`` keywords for the bin summary (``summary(records)``,
    or none) and occupancy map of ``allocator``: deferred to the first read
    when the allocator has a ``_report_fingerprint``, else built now."""
    fingerprint = allocator._report_fingerprint()
    if fingerprint is None:
        records = allocator._records()
        return {"bin_summary": summary(records) if summary else [],
                "occupancy": render_occupancy(records, allocator._region_list())}
    return {"report": _DeferredReport(allocator, summary, fingerprint)}


def brief_oom(name: str, num_bytes: int, rounded: int, alignment: int,
              reason: str) -> OutOfMemoryError:
    """An out-of-memory error with the request and the reason only (no stats,
    no report): what a batch hands its ``on_oom`` after the first failure,
    when the caller asked for the first one in full only."""
    return OutOfMemoryError(
        f"Allocator ({name}) ran out of memory trying to allocate {num_bytes} bytes ({reason}); "
        "a batch reports its first failure in full only", allocator_name=name,
        num_bytes=num_bytes, rounded_bytes=rounded, alignment=alignment, reason=reason)


class Deferred:
    """``build(*args)``, made on the first call and kept: what an
    out-of-memory error carries instead of a value nobody may read (cheaper
    to make than ``functools.cache`` of a partial)."""

    __slots__ = ("_build", "_args", "_value")

    def __init__(self, build: Callable, *args) -> None:
        self._build = build
        self._args = args

    def __call__(self):
        try:
            return self._value
        except AttributeError:
            self._value = self._build(*self._args)
            self._build = self._args = None
            return self._value


class _DeferredReport:
    """``()`` -> ``(bin_summary, occupancy, stale)`` of an allocator, built at
    the call; ``stale`` if it changed since ``fingerprint`` was taken."""

    __slots__ = ("_allocator", "_summary", "_fingerprint")

    def __init__(self, allocator, summary, fingerprint) -> None:
        # Weak: a kept exception must not keep an allocator (and its memory) alive.
        self._allocator = weakref.ref(allocator)
        self._summary = summary
        self._fingerprint = fingerprint

    def __call__(self) -> tuple[list[dict], str, bool]:
        allocator = self._allocator()
        if allocator is None:
            return [], "", True
        with allocator._lock:
            records = allocator._records()
            return (self._summary(records) if self._summary else [],
                    render_occupancy(records, allocator._region_list()),
                    allocator._report_fingerprint() != self._fingerprint)
