"""Exceptions raised by numba_bfc allocators."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["OutOfMemoryError", "InvalidPointerError"]


class OutOfMemoryError(MemoryError):
    """An allocation could not be served.

    Carries what a user needs to tell fragmentation from real exhaustion: the
    request, its rounded size, the allocator's stats at the time, the per-bin
    summary and the occupancy map.

    The message, ``stats`` and ``reason`` are fixed when the error is raised
    (the message is formatted when first shown).
    The bin summary and the occupancy map cost far more than the failed
    allocation itself (a pass over every chunk), so allocators build them on
    first read of either attribute, from the allocator as it is then. That is
    the allocator at the failure unless it changed in between, which
    ``report_stale`` says (read the report right away, in the ``except``
    block, to get it exact).

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
    report_stale : bool
        True if the allocator had changed (or was gone) when ``bin_summary``
        or ``occupancy`` was first read: both then describe it at that read,
        not at the failure.
    reason : str
        Short reason: ``"limit"`` (larger than the memory limit),
        ``"fragmentation"`` (enough free bytes in the pool, none contiguous),
        ``"exhausted"`` (not enough free bytes at all) or ``"backend"``.
    """

    def __init__(
        self,
        message: str | Callable[[], str],
        *,
        allocator_name: str = "",
        num_bytes: int = 0,
        rounded_bytes: int = 0,
        alignment: int = 0,
        stats: Any = None,
        bin_summary: list[dict] | None = None,
        occupancy: str = "",
        reason: str = "exhausted",
        report: Callable[[], tuple[list[dict], str, bool]] | None = None,
    ) -> None:
        # A callable message is formatted on first use (str, repr, args,
        # pickling): a retry loop that only catches the error never pays for it.
        if callable(message):
            super().__init__()
            self._message = message
        else:
            super().__init__(message)
            self._message = None
        self.allocator_name = allocator_name
        self.num_bytes = num_bytes
        self.rounded_bytes = rounded_bytes
        self.alignment = alignment
        self.stats = stats
        self.reason = reason
        self._bin_summary = bin_summary or []
        self._occupancy = occupancy
        self._report_stale = False
        self._report = report  # () -> (bin_summary, occupancy, stale), called once

    def _formatted(self) -> None:
        if self._message is not None:
            message, self._message = self._message, None
            self.args = (message(),)

    def __str__(self) -> str:
        self._formatted()
        return super().__str__()

    def __repr__(self) -> str:
        self._formatted()
        return super().__repr__()

    def _built(self) -> None:
        if self._report is not None:
            report, self._report = self._report, None
            self._bin_summary, self._occupancy, self._report_stale = report()

    @property
    def bin_summary(self) -> list[dict]:
        self._built()
        return self._bin_summary

    @property
    def occupancy(self) -> str:
        self._built()
        return self._occupancy

    @property
    def report_stale(self) -> bool:
        self._built()
        return self._report_stale

    def __reduce__(self):
        # The deferred report refers to the allocator, which does not travel.
        self._formatted()
        self._built()
        return type(self), self.args, self.__dict__

    def report_keywords(self) -> dict:
        """Keywords for ``OutOfMemoryError(...)`` that hand this error's report,
        built or not, to an error that wraps it."""
        if self._report is not None:
            return {"report": self._report}
        return {"bin_summary": self._bin_summary, "occupancy": self._occupancy}


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
