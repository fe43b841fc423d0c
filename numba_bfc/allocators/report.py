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
    """TF's ``get_bin_debug_info``: every chunk counted in the bin for its size.

    Parameters
    ----------
    records : numpy.ndarray
        Chunk records (``RECORD_DTYPE``), e.g. an allocator's ``chunks()``.
    min_allocation, num_bins : int
        Bin ``b`` holds sizes from ``min_allocation << b`` up to the next bin's;
        the last bin everything above.

    Returns
    -------
    list of dict
        One per bin: ``bin``, ``bin_size``, ``total_bytes_in_use``,
        ``total_bytes_in_bin``, ``total_chunks_in_use``, ``total_chunks_in_bin``,
        ``total_requested_bytes_in_use``.

    Raises
    ------
    ValueError
        ``min_allocation`` or ``num_bins`` below 1.

    Examples
    --------
    >>> records = np.zeros(3, dtype=RECORD_DTYPE)
    >>> records["size"] = [256, 768, 4096]
    >>> records["in_use"] = [True, False, True]
    >>> [(b["bin_size"], b["total_chunks_in_bin"], b["total_bytes_in_use"])
    ...  for b in bin_summary(records, 256, 3)]
    [(256, 1, 256), (512, 1, 0), (1024, 1, 4096)]
    """
    min_allocation, num_bins = int(min_allocation), int(num_bins)  # shifts that do not wrap
    if min_allocation < 1 or num_bins < 1:
        raise ValueError(f"min_allocation and num_bins must be >= 1, got {min_allocation} "
                         f"and {num_bins}")
    sizes = records["size"]
    # Bin b holds sizes from min_allocation << b up (the last bin, everything above):
    # bin_of for every chunk at once, in integers (no int64 size reaches a bin from 2**63).
    bin_sizes = np.array([min_allocation << b for b in range(num_bins)
                          if min_allocation << b < 1 << 63], dtype=np.int64)
    bins = np.searchsorted(bin_sizes, np.maximum(sizes, min_allocation), side="right") - 1
    used = records["in_use"]

    def per_bin(values, among) -> np.ndarray:
        """Sum of ``values`` (a scalar: counts) over the chunks ``among`` picks, per bin."""
        total = np.zeros(num_bins, dtype=np.int64)  # int64, exact: bincount's weights are floats
        np.add.at(total, bins[among], values if np.isscalar(values) else values[among])
        return total

    every = slice(None)
    columns = {"total_bytes_in_use": per_bin(sizes, used),
               "total_bytes_in_bin": per_bin(sizes, every),
               "total_chunks_in_use": per_bin(1, used),
               "total_chunks_in_bin": per_bin(1, every),
               "total_requested_bytes_in_use": per_bin(records["requested_size"], used)}
    return [{"bin": b, "bin_size": min_allocation << b,
             **{name: int(column[b]) for name, column in columns.items()}}
            for b in range(num_bins)]


def render_occupancy(records: np.ndarray, regions: list[tuple[int, int]], width: int = 100) -> str:
    """TF's ``RenderOccupancy``: ``width`` characters over all regions laid end to end.

    ``*`` marks requested bytes of in-use chunks, ``x`` their rounding/padding
    waste, ``_`` free memory. Each chunk paints its waste, then its requested
    bytes, region by region in the order given and chunk by chunk in address
    order; a cell shows the last paint over it. ``regions`` are ``(base,
    size)``, disjoint within ``[0, 2**63)`` (an allocator's ``regions()``);
    ``records`` in address order (its ``chunks()``); a chunk outside every
    region is not shown.

    Examples
    --------
    >>> records = np.zeros(2, dtype=RECORD_DTYPE)
    >>> records["address"], records["size"] = [0, 512], [512, 512]
    >>> records["requested_size"], records["in_use"] = [256, 0], [True, False]
    >>> render_occupancy(records, [(0, 1024)], width=8)
    '**xx____'
    """
    if type(width) is not int:
        raise TypeError(f"width must be an int, got {type(width).__name__}")
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    total = sum(int(size) for _, size in regions)
    if total == 0:
        return "<allocator contains no memory>"
    # The in-use chunks inside a region, at their positions with the regions laid end to
    # end in the order given. Empty regions hold no chunk but would hide the chunks of a
    # region around them from the search by base, so they are left out of it.
    offset, held = 0, []
    for base, size in regions:
        if size > 0:
            held.append((int(base), int(size), offset))
        offset += int(size)
    bases, extents, offsets = (np.array(column, dtype=np.int64) for column in zip(*held))
    by_base = np.argsort(bases, kind="stable")
    chunks = records[records["in_use"]]
    address = chunks["address"]
    below = np.searchsorted(bases[by_base], address, side="right") - 1
    region = by_base[np.maximum(below, 0)]
    # address - base, not address < base + size: a region may end at 2**63, past int64.
    inside = (below >= 0) & (address - bases[region] < extents[region])
    chunks, region = chunks[inside], region[inside]
    laid_out = chunks["address"] - bases[region] + offsets[region]
    in_order = np.argsort(laid_out, kind="stable")
    position = laid_out[in_order]
    requested = chunks["requested_size"][in_order]
    chunk_size = chunks["size"][in_order]
    # Paints in order, each chunk's waste ('x') then its requested bytes ('*'); a cell
    # shows the last paint that covers it.
    starts = np.stack([position + requested, position], axis=1).ravel()
    lengths = np.stack([chunk_size - requested, requested], axis=1).ravel()
    marks = np.tile(np.frombuffer(b"x*", dtype=np.uint8), len(position))
    painted = lengths > 0
    starts, lengths, marks = starts[painted], lengths[painted], marks[painted]
    if total * width >= 1 << 63:  # the cells in Python integers, as int64 would wrap
        starts, lengths = starts.astype(object), lengths.astype(object)
    first = (starts * width // total).astype(np.int64)
    last = ((starts + lengths - 1) * width // total).astype(np.int64)
    # Disjoint byte ranges share at most their edge cells: len(marks) + width cells in all.
    counts = last - first + 1
    paint = np.repeat(np.arange(len(marks)), counts)
    cells = np.arange(len(paint)) - np.repeat(np.cumsum(counts) - counts, counts) + first[paint]
    shown = np.full(width, -1, dtype=np.int64)  # -1: no paint, the table's last mark
    np.maximum.at(shown, cells, paint)
    return np.append(marks, np.uint8(ord("_")))[shown].tobytes().decode("ascii")


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
