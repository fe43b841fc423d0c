"""Real host memory from NumPy, so data written into allocations can be checked."""

from __future__ import annotations

import os

import numpy as np

from .base import SubAllocator

__all__ = ["HostSubAllocator"]


class HostSubAllocator(SubAllocator):
    """Regions of real host memory, each backed by a NumPy byte buffer.

    Parameters
    ----------
    capacity : int, optional
        Most bytes held at once (default: unbounded, limited by the machine).

    Notes
    -----
    ``view(ptr, nbytes)`` returns a writable ``uint8`` array over memory the
    backend handed out, so tests can fill allocations with patterns and verify
    them after churn. Regions are never adjacent, so ``supports_coalescing`` is
    False.
    """

    supports_coalescing = False
    host_accessible = True

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__()
        if capacity is not None and capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._buffers: dict[int, tuple[np.ndarray, int]] = {}

    def _alloc(self, nbytes: int, alignment: int) -> tuple[int, int] | None:
        if self.capacity is not None and self.bytes_held + nbytes > self.capacity:
            return None
        try:
            raw = np.empty(nbytes + alignment, dtype=np.uint8)
        except MemoryError:
            return None
        base = raw.ctypes.data
        offset = (-base) % alignment
        ptr = base + offset
        self._buffers[ptr] = (raw, nbytes)
        return ptr, nbytes

    def _free(self, ptr: int, nbytes: int) -> None:
        entry = self._buffers.get(ptr)
        if entry is None or entry[1] != nbytes:
            raise ValueError(f"free({ptr:#x}, {nbytes}): not a region of this backend")
        del self._buffers[ptr]

    def view(self, ptr: int, nbytes: int) -> np.ndarray:
        """A writable ``uint8`` view of ``nbytes`` at ``ptr`` inside one live region."""
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
