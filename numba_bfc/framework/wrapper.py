"""``AllocatorWrapper`` (TF's ``AllocatorWrapper``) and the bookkeeping base of the adaptors.

Locking rule shared by every wrapper here: an allocation calls the inner
allocator *without* holding the wrapper's lock (an inner ``RetryingAllocator``
may block for seconds waiting for a free, and that free must be able to pass
through this wrapper), while a free holds the wrapper's lock *across* the inner
free. The second half makes a free and the bookkeeping of that free one step:
no other thread can be handed the same address, and record it, in between.
Locks are only ever taken outer wrapper first, inner allocator second, so
stacks of wrappers cannot deadlock.
"""

from __future__ import annotations

import threading
from typing import Any

from ..stats import AllocatorStats
from .allocator import AllocationAttributes, Allocator
from .validate import check_alignment, check_free_pointer, check_size

__all__ = ["AllocatorWrapper"]


class AllocatorWrapper(Allocator):
    """An allocator that forwards every call to ``inner`` (TF's ``AllocatorWrapper``).

    Subclass it and override what you want to change. It keeps no state of
    its own, so it is exactly as thread-safe as ``inner``.

    Parameters
    ----------
    inner : Allocator
    name : str, optional
        Defaults to ``"<kind>(<inner name>)"``, e.g. ``"logging(bfc)"``.
    """

    #: Prefix of the derived name.
    kind = "wrapper"

    def __init__(self, inner: Allocator, name: str | None = None) -> None:
        if not isinstance(inner, Allocator):
            raise TypeError(f"inner must be an Allocator, not {type(inner).__name__}")
        self._inner = inner
        self._name = name if name is not None else f"{self.kind}({inner.name})"

    @property
    def inner(self) -> Allocator:
        """The wrapped allocator."""
        return self._inner

    @property
    def name(self) -> str:
        return self._name

    @property
    def host_accessible(self) -> bool:  # type: ignore[override]
        """As the inner allocator's: wrappers never change where memory lives."""
        return self._inner.host_accessible

    def allocate_raw(self, num_bytes: int, alignment: int = 256,
                     attributes: AllocationAttributes | None = None) -> int:
        return self._inner.allocate_raw(num_bytes, alignment, attributes)

    def deallocate_raw(self, ptr: int | None) -> None:
        self._inner.deallocate_raw(ptr)

    def tracks_allocation_sizes(self) -> bool:
        return self._inner.tracks_allocation_sizes()

    def requested_size(self, ptr: int) -> int:
        return self._inner.requested_size(ptr)

    def allocated_size(self, ptr: int) -> int:
        return self._inner.allocated_size(ptr)

    def allocation_id(self, ptr: int) -> int:
        return self._inner.allocation_id(ptr)

    def get_stats(self) -> AllocatorStats | None:
        return self._inner.get_stats()

    def clear_stats(self) -> bool:
        return self._inner.clear_stats()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._inner!r})"


class BookkeepingWrapper(AllocatorWrapper):
    """A wrapper that accounts for the allocations passing through it.

    Keeps one record per live allocation made through this wrapper, under
    ``self._lock`` (reentrant, because ``empty()`` arrays free from garbage
    collection, which may run inside a locked section). Subclasses override the
    four hooks below; each runs with the lock held. Frees of addresses not
    allocated through this wrapper go to the inner allocator unrecorded, and
    0-byte requests are forwarded without bookkeeping.
    """

    def __init__(self, inner: Allocator, name: str | None = None) -> None:
        super().__init__(inner, name)
        self._lock = threading.RLock()
        self._live: dict[int, Any] = {}

    # Hooks ----------------------------------------------------------------
    def _before_allocate(self, num_bytes: int) -> None:
        """Before the inner call; may raise to refuse the request."""

    def _allocation_failed(self, num_bytes: int, error: BaseException) -> None:
        """The inner allocator raised ``error``; undo ``_before_allocate``."""

    def _allocated(self, ptr: int, num_bytes: int) -> Any:
        """The inner allocator returned ``ptr``; return the record to keep for it."""
        return num_bytes

    def _freed(self, ptr: int, record: Any) -> None:
        """``ptr`` (allocated through this wrapper, with ``record``) was freed."""

    # Allocator ------------------------------------------------------------
    def allocate_raw(self, num_bytes: int, alignment: int = 256,
                     attributes: AllocationAttributes | None = None) -> int:
        n = check_size(num_bytes)
        alignment = check_alignment(alignment)
        if n == 0:
            return self._inner.allocate_raw(0, alignment, attributes)
        with self._lock:
            self._before_allocate(n)
        try:
            p = self._inner.allocate_raw(n, alignment, attributes)
        except BaseException as e:
            with self._lock:
                self._allocation_failed(n, e)
            raise
        with self._lock:
            self._live[p] = self._allocated(p, n)
        return p

    def deallocate_raw(self, ptr: int | None) -> None:
        p = check_free_pointer(ptr)
        if not p:
            return
        with self._lock:
            self._inner.deallocate_raw(p)  # raises for a bad pointer: nothing recorded
            record = self._live.pop(p, _MISSING)
            if record is not _MISSING:
                self._freed(p, record)

    def num_live(self) -> int:
        """Allocations made through this wrapper and not yet freed."""
        with self._lock:
            return len(self._live)


_MISSING = object()
