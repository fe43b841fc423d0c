"""``HostAllocator``: plain host memory with stats (TensorFlow's CPU allocator)."""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from .._config import parse_size
from ..errors import InvalidPointerError, OutOfMemoryError
from ..stats import AllocatorStats, format_bytes
from .allocator import AllocationAttributes, Allocator
from .validate import check_alignment, check_free_pointer, check_pointer, check_size

__all__ = ["HostAllocator"]

# Recently freed addresses remembered to tell a double free from a stray
# pointer; bounded, because NumPy may hand the same address out again later.
_FREED_MEMORY = 4096


class _Block(NamedTuple):
    buffer: np.ndarray  # keeps the memory alive
    size: int
    allocation_id: int


class HostAllocator(Allocator):
    """Host memory from NumPy, one buffer per allocation (TF's ``CPUAllocator``).

    Addresses are real: ``empty()`` arrays and ``ctypes`` may use them. Sizes
    are tracked (``allocated_size`` equals the requested size) and stats kept
    as TF's CPU allocator does.

    Parameters
    ----------
    memory_limit : int or str, optional
        Most bytes in use at once (e.g. ``"256MiB"``); beyond it allocations
        raise ``OutOfMemoryError``. Default: no limit but the machine's.
    name : str

    Notes
    -----
    Thread-safe: one reentrant lock guards the buffers and the counters (the
    lock is reentrant because ``empty()`` arrays free from garbage collection,
    which may run while this thread holds it).
    """

    host_accessible = True

    def __init__(self, memory_limit: int | str | None = None, name: str = "cpu") -> None:
        self.memory_limit = (None if memory_limit is None
                             else parse_size(memory_limit, name="memory_limit"))
        self._name = str(name)
        self._lock = threading.RLock()
        self._blocks: dict[int, _Block] = {}
        self._recently_freed: OrderedDict[int, None] = OrderedDict()
        self._ids = itertools.count(1)
        self._num_allocs = 0
        self._bytes_in_use = 0
        self._peak_bytes_in_use = 0
        self._largest_alloc_size = 0

    @property
    def name(self) -> str:
        return self._name

    def allocate_raw(self, num_bytes: int, alignment: int = 256,
                     attributes: AllocationAttributes | None = None) -> int:
        n = check_size(num_bytes)
        alignment = check_alignment(alignment)
        if n == 0:
            return 0
        with self._lock:
            if self.memory_limit is not None and self._bytes_in_use + n > self.memory_limit:
                raise self._out_of_memory(n, alignment,
                                          "limit" if n > self.memory_limit else "exhausted")
            try:
                buffer = np.empty(n + alignment - 1, dtype=np.uint8)
            except (MemoryError, ValueError):  # ValueError: larger than NumPy can address
                raise self._out_of_memory(n, alignment, "backend") from None
            ptr = buffer.ctypes.data + (-buffer.ctypes.data) % alignment
            self._blocks[ptr] = _Block(buffer, n, next(self._ids))
            self._recently_freed.pop(ptr, None)
            self._num_allocs += 1
            self._bytes_in_use += n
            self._peak_bytes_in_use = max(self._peak_bytes_in_use, self._bytes_in_use)
            self._largest_alloc_size = max(self._largest_alloc_size, n)
            return ptr

    def deallocate_raw(self, ptr: int | None) -> None:
        p = check_free_pointer(ptr)
        if not p:
            return
        with self._lock:
            block = self._blocks.pop(p, None)
            if block is None:
                raise self._invalid_pointer(p)
            self._bytes_in_use -= block.size
            self._recently_freed[p] = None
            if len(self._recently_freed) > _FREED_MEMORY:
                self._recently_freed.popitem(last=False)

    def tracks_allocation_sizes(self) -> bool:
        return True

    def _block(self, ptr: int) -> _Block:
        p = check_pointer(ptr)
        with self._lock:
            block = self._blocks.get(p)
            if block is None:
                raise self._invalid_pointer(p)
            return block

    def requested_size(self, ptr: int) -> int:
        return self._block(ptr).size

    def allocation_id(self, ptr: int) -> int:
        return self._block(ptr).allocation_id

    def get_stats(self) -> AllocatorStats:
        with self._lock:
            return AllocatorStats(
                num_allocs=self._num_allocs,
                bytes_in_use=self._bytes_in_use,
                peak_bytes_in_use=self._peak_bytes_in_use,
                largest_alloc_size=self._largest_alloc_size,
                bytes_limit=self.memory_limit or 0,
            )

    def clear_stats(self) -> bool:
        """TF's ``ClearStats``: zero the counts, peak back to the current use."""
        with self._lock:
            self._num_allocs = 0
            self._peak_bytes_in_use = self._bytes_in_use
            self._largest_alloc_size = 0
        return True

    def __repr__(self) -> str:
        return (f"HostAllocator(name={self._name!r}, in_use={self.get_stats().bytes_in_use}, "
                f"limit={self.memory_limit})")

    def _out_of_memory(self, n: int, alignment: int, reason: str) -> OutOfMemoryError:
        limit = "none" if self.memory_limit is None else format_bytes(self.memory_limit)
        return OutOfMemoryError(
            f"{self._name}: cannot allocate {format_bytes(n)} ({reason}; in use "
            f"{format_bytes(self._bytes_in_use)}, limit {limit})",
            allocator_name=self._name, num_bytes=n, rounded_bytes=n, alignment=alignment,
            stats=self.get_stats(), reason=reason)

    def _invalid_pointer(self, p: int) -> InvalidPointerError:
        if p in self._recently_freed:
            return InvalidPointerError(f"{self._name}: {p:#x} is not allocated (double free?)",
                                       ptr=p, kind="double_free")
        # Only on this error path: a linear scan for an enclosing block.
        for start, block in self._blocks.items():
            if start < p < start + block.size:
                return InvalidPointerError(
                    f"{self._name}: {p:#x} is an interior pointer into the allocation at "
                    f"{start:#x} (size {block.size}); pass the address allocate_raw returned",
                    ptr=p, kind="interior")
        return InvalidPointerError(f"{self._name}: {p:#x} was not allocated by this allocator",
                                   ptr=p, kind="unknown")
