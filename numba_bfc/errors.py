"""Exceptions raised by numba_bfc allocators."""

from __future__ import annotations

from typing import Any

__all__ = ["OutOfMemoryError", "InvalidPointerError"]


class OutOfMemoryError(MemoryError):
    """An allocation could not be served.

    Carries what a user needs to tell fragmentation from real exhaustion: the
    request, its rounded size, the allocator's stats at the time, the per-bin
    summary and the occupancy map.

    Attributes
    ----------
    allocator_name : str
    num_bytes : int
        The size asked for.
    rounded_bytes : int
        The size after the policy's rounding (0 if the request was rejected
        before rounding, e.g. above the memory limit).
    alignment : int
    stats : AllocatorStats or None
    bin_summary : list of dict
        One entry per bin (see ``BFCAllocator.memory_map``).
    occupancy : str
        ``render_occupancy()`` at the time of the failure.
    reason : str
        Short reason: ``"limit"`` (larger than the memory limit),
        ``"fragmentation"`` (enough free bytes in the pool, none contiguous),
        ``"exhausted"`` (not enough free bytes at all) or ``"backend"``.
    """

    def __init__(
        self,
        message: str,
        *,
        allocator_name: str = "",
        num_bytes: int = 0,
        rounded_bytes: int = 0,
        alignment: int = 0,
        stats: Any = None,
        bin_summary: list[dict] | None = None,
        occupancy: str = "",
        reason: str = "exhausted",
    ) -> None:
        super().__init__(message)
        self.allocator_name = allocator_name
        self.num_bytes = num_bytes
        self.rounded_bytes = rounded_bytes
        self.alignment = alignment
        self.stats = stats
        self.bin_summary = bin_summary or []
        self.occupancy = occupancy
        self.reason = reason


class InvalidPointerError(ValueError):
    """A pointer given to an allocator is not one of its live allocations.

    Attributes
    ----------
    ptr : int
    kind : str
        ``"double_free"`` (the address starts a chunk that is already free),
        ``"interior"`` (inside a chunk but not at its start) or ``"unknown"``
        (not in any region of this allocator).
    """

    def __init__(self, message: str, *, ptr: int, kind: str) -> None:
        super().__init__(message)
        self.ptr = ptr
        self.kind = kind
