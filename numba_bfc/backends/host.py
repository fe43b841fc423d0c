"""Real host memory from NumPy, so data written into allocations can be checked."""

from __future__ import annotations

import functools
import os
import threading

import numpy as np

from .._gc_pause import pause_gc, resume_gc
from .base import SubAllocator, _RangeMap

__all__ = ["HostSubAllocator"]


def _align_up(x: int, a: int) -> int:
    return (x + a - 1) & ~(a - 1)


def _under_map_lock(method):
    """Run ``method`` holding the backend's map lock: ``view`` and
    ``mapped_ranges`` may run in any thread while the allocator that owns the
    backend maps and unmaps (under its own lock, which they do not take).
    Automatic garbage collection waits meanwhile: the lock is not reentrant,
    and a finalizer run there that freed memory of this backend deadlocked."""

    @functools.wraps(method)
    def locked(self, *args):
        pause_gc()  # before the lock and until it is released: a collection due
        try:        # when collection resumes must not run with the lock held
            with self._map_lock:
                return method(self, *args)
        finally:
            resume_gc()

    return locked


class HostSubAllocator(SubAllocator):
    """Regions of real host memory, each backed by a NumPy byte buffer.

    Parameters
    ----------
    capacity : int, optional
        Most bytes held at once (default: unbounded, limited by the machine).
    contiguous : bool
        If True, regions are carved one after another out of one buffer of
        ``capacity`` bytes (required; the buffer spans twice that, as address
        room for remapping), like pages mapped into a reserved CUDA virtual
        range: a region starts where the highest live one ends;
        ``supports_coalescing`` and ``supports_remap`` are True (``alloc_at``
        maps at a chosen free address of the buffer, ``free`` may give back
        part of an allocation). The buffer is allocated, not touched,
        up front, so untouched pages cost the machine nothing.

    Notes
    -----
    ``view(ptr, nbytes)`` returns a writable ``uint8`` array over memory the
    backend handed out, so tests can fill allocations with patterns and verify
    them after churn. Separate regions are never adjacent, so
    ``supports_coalescing`` is False unless ``contiguous``.
    """

    supports_coalescing = False
    host_accessible = True

    def __init__(self, capacity: int | None = None, contiguous: bool = False) -> None:
        super().__init__()
        if capacity is not None and capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._buffers: dict[int, tuple[np.ndarray, int]] = {}
        self._map_lock = threading.Lock()
        self.contiguous = bool(contiguous)
        self.supports_coalescing = self.supports_remap = self.contiguous
        if self.contiguous:
            if not capacity:
                raise ValueError("a contiguous HostSubAllocator needs a capacity > 0")
            # Twice the capacity, as an address range reserved for remapping (pages
            # mapped again past holes), plus 2 MiB so it can start page-aligned.
            self._arena = np.empty(2 * capacity + (2 << 20), dtype=np.uint8)
            self._arena_base = _align_up(self._arena.ctypes.data, 2 << 20)
            self._arena_end = self._arena_base + 2 * capacity
            self._pieces = _RangeMap()

    @_under_map_lock
    def _alloc(self, nbytes: int, alignment: int) -> tuple[int, int] | None:
        if self.capacity is not None and self.bytes_held + nbytes > self.capacity:
            return None
        if self.contiguous:
            ptr = _align_up(self._pieces.top(self._arena_base), alignment)
            if ptr + nbytes > self._arena_end:
                return None
            self._pieces.add(ptr, ptr + nbytes)
            return ptr, nbytes
        try:
            raw = np.empty(nbytes + alignment, dtype=np.uint8)
        except MemoryError:
            return None
        base = raw.ctypes.data
        offset = (-base) % alignment
        ptr = base + offset
        self._buffers[ptr] = (raw, nbytes)
        return ptr, nbytes

    @_under_map_lock
    def _alloc_at(self, ptr: int, nbytes: int) -> bool:
        if ptr < self._arena_base:
            raise ValueError(f"alloc_at({ptr:#x}, {nbytes}): below the buffer")
        if ptr + nbytes > self._arena_end:
            return False  # past the end of the range: nothing more to map there
        if self._pieces.overlaps(ptr, ptr + nbytes):
            raise ValueError(f"alloc_at({ptr:#x}, {nbytes}): overlaps mapped memory")
        self._pieces.add(ptr, ptr + nbytes)
        return True

    @_under_map_lock
    def _free(self, ptr: int, nbytes: int) -> None:
        if self.contiguous:
            self._pieces.remove(ptr, ptr + nbytes, partial=True)
            return
        entry = self._buffers.get(ptr)
        if entry is None or entry[1] != nbytes:
            raise ValueError(f"free({ptr:#x}, {nbytes}): not a region of this backend")
        del self._buffers[ptr]

    def address_space(self) -> tuple[int, int | None]:
        """The contiguous buffer: twice the capacity, from its 2 MiB-aligned start."""
        if not self.contiguous:
            return super().address_space()
        return self._arena_base, self._arena_end - self._arena_base

    @_under_map_lock
    def mapped_ranges(self) -> list[tuple[int, int]]:
        """``[(start, size), ...]`` of every live range, in address order."""
        if self.contiguous:
            return [(s, e - s) for s, e in self._pieces.ranges.items()]
        return sorted((p, n) for p, (_raw, n) in self._buffers.items())

    @_under_map_lock
    def view(self, ptr: int, nbytes: int) -> np.ndarray:
        """A writable ``uint8`` view of ``nbytes`` at ``ptr`` inside live memory
        (one region, or adjacent regions of a contiguous backend). Safe to
        call from any thread while others allocate and free."""
        if self.contiguous:
            if not self._pieces.covers(ptr, ptr + nbytes):
                raise ValueError(f"[{ptr:#x}, +{nbytes}) is not inside live regions")
            start = ptr - self._arena.ctypes.data
            return self._arena[start : start + nbytes]
        for base, (raw, size) in self._buffers.items():
            if base <= ptr and ptr + nbytes <= base + size:
                start = ptr - raw.ctypes.data
                return raw[start : start + nbytes]
        raise ValueError(f"[{ptr:#x}, +{nbytes}) is not inside a live region")

    def total_memory(self) -> int | None:
        """``capacity`` if set, else the machine's physical memory."""
        if self.capacity is not None:
            return self.capacity
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None
