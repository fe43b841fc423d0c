"""The sub-allocator interface: where allocators get their regions from."""

from __future__ import annotations

import abc

__all__ = ["SubAllocator"]


class SubAllocator(abc.ABC):
    """Source of large memory regions for a pooling allocator (TF's ``SubAllocator``).

    Subclasses implement ``_alloc`` / ``_free``; the public methods validate
    arguments and keep counters so every backend reports the same statistics.

    Attributes
    ----------
    supports_coalescing : bool
        True when consecutive regions may be adjacent in the address space and
        the allocator may treat them as one (contiguous virtual memory).
    host_accessible : bool
        True when addresses are real host memory this process may read and write.
    capacity : int or None
        Bytes this backend can hold at once, if bounded.
    """

    supports_coalescing: bool = False
    host_accessible: bool = False
    capacity: int | None = None

    def __init__(self) -> None:
        self.num_allocs = 0
        self.num_frees = 0
        self.num_failed_allocs = 0
        self.bytes_held = 0
        self.peak_bytes_held = 0

    def alloc(self, nbytes: int, alignment: int = 256) -> tuple[int, int] | None:
        """Allocate a region of at least ``nbytes`` aligned to ``alignment``.

        Returns
        -------
        (ptr, received) or None
            The base address and the size actually granted (>= ``nbytes``), or
            None when the backend cannot provide the memory.
        """
        if nbytes <= 0:
            raise ValueError(f"backend alloc size must be > 0, got {nbytes}")
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"backend alignment must be a power of two, got {alignment}")
        result = self._alloc(int(nbytes), int(alignment))
        if result is None:
            self.num_failed_allocs += 1
            return None
        ptr, received = result
        self.num_allocs += 1
        self.bytes_held += received
        self.peak_bytes_held = max(self.peak_bytes_held, self.bytes_held)
        return ptr, received

    def free(self, ptr: int, nbytes: int) -> None:
        """Give back ``nbytes`` starting at ``ptr`` (one or more whole earlier allocations)."""
        self._free(int(ptr), int(nbytes))
        self.num_frees += 1
        self.bytes_held -= nbytes

    def total_memory(self) -> int | None:
        """Total bytes this backend could ever provide (``capacity``), None if unbounded."""
        return self.capacity

    @abc.abstractmethod
    def _alloc(self, nbytes: int, alignment: int) -> tuple[int, int] | None: ...

    @abc.abstractmethod
    def _free(self, ptr: int, nbytes: int) -> None: ...
