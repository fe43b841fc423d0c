"""``TrackingAllocator``: TensorFlow's allocation tracker, reconstructed."""

from __future__ import annotations

import itertools
import time
from typing import NamedTuple

from ..errors import InvalidPointerError
from .allocator import Allocator
from .wrapper import BookkeepingWrapper

__all__ = ["AllocRecord", "TrackingAllocator"]


class AllocRecord(NamedTuple):
    """One tracked event (TF's ``AllocRecord``): +bytes on allocate, -bytes on free."""

    alloc_bytes: int
    alloc_micros: int


class _Chunk(NamedTuple):
    requested_size: int
    allocated_size: int
    allocation_id: int


class TrackingAllocator(BookkeepingWrapper):
    """Record every allocation made through it (TF's ``TrackingAllocator``).

    Keeps the total bytes allocated, the bytes still live, their high
    watermark, and a signed ``AllocRecord`` per event. What it can count
    depends, as in TF, on who knows allocation sizes:

    * the inner allocator tracks sizes: its ``allocated_size`` is counted on
      allocate and on free;
    * else, with ``track_sizes_locally=True``: the tracker keeps the requested
      size (TF would ask ``AllocatedSizeSlow``; Python has no such call, so the
      allocated size is taken to be the requested one) and its own allocation
      ids 1, 2, ..., and answers ``requested_size``/``allocated_size``/
      ``allocation_id`` itself;
    * else the allocated size is unknown: only ``total_bytes`` grows (by the
      requested size) and only allocations are recorded; live bytes and the
      high watermark stay 0.

    An allocation that fails (``OutOfMemoryError``) is not recorded; freeing 0
    or None does nothing. TF's reference counting (``GetSizesAndUnRef``,
    ``GetRecordsAndUnRef``) exists to delete the C++ object once every
    allocation is freed; here the garbage collector owns the object's life,
    so ``get_sizes`` and ``get_records`` may be called any number of times.

    Thread safety: one reentrant lock guards the counters and the records;
    see ``numba_bfc.framework.wrapper`` for how it orders with the inner
    allocator.

    Parameters
    ----------
    inner : Allocator
    track_sizes_locally : bool
        Keep sizes here when ``inner`` does not track them (ignored if it does).
    """

    kind = "tracking"

    def __init__(self, inner: Allocator, track_sizes_locally: bool = False,
                 name: str | None = None) -> None:
        super().__init__(inner, name)
        self._inner_tracks = bool(inner.tracks_allocation_sizes())
        self.track_sizes_locally = bool(track_sizes_locally) and not self._inner_tracks
        self._allocated_bytes = 0
        self._high_watermark = 0
        self._total_bytes = 0
        self._records: list[AllocRecord] = []
        self._next_id = itertools.count(1)

    def _record(self, nbytes: int) -> None:
        self._records.append(AllocRecord(nbytes, time.time_ns() // 1000))

    def _allocated(self, ptr: int, num_bytes: int) -> _Chunk:
        if self._inner_tracks:
            chunk = _Chunk(num_bytes, self._inner.allocated_size(ptr), 0)
        elif self.track_sizes_locally:
            chunk = _Chunk(num_bytes, num_bytes, next(self._next_id))
        else:
            self._total_bytes += num_bytes
            self._record(num_bytes)
            return _Chunk(num_bytes, 0, 0)
        self._allocated_bytes += chunk.allocated_size
        self._high_watermark = max(self._high_watermark, self._allocated_bytes)
        self._total_bytes += chunk.allocated_size
        self._record(chunk.allocated_size)
        return chunk

    def _freed(self, ptr: int, record: _Chunk) -> None:
        if self._inner_tracks or self.track_sizes_locally:
            self._allocated_bytes -= record.allocated_size
            self._record(-record.allocated_size)

    def get_sizes(self) -> tuple[int, int, int]:
        """``(total_bytes, high_watermark, still_live_bytes)`` (TF's ``GetSizes``)."""
        with self._lock:
            return self._total_bytes, self._high_watermark, self._allocated_bytes

    def get_records(self) -> list[AllocRecord]:
        """Every event so far, in order (TF's ``GetCurrentRecords``)."""
        with self._lock:
            return list(self._records)

    def tracks_allocation_sizes(self) -> bool:
        return self.track_sizes_locally or self._inner_tracks

    def _local(self, ptr: int) -> _Chunk:
        with self._lock:
            chunk = self._live.get(ptr)
        if chunk is None:
            raise InvalidPointerError(
                f"{self.name}: {ptr:#x} is not a live allocation of this tracker",
                ptr=ptr, kind="unknown")
        return chunk

    def requested_size(self, ptr: int) -> int:
        if self.track_sizes_locally:
            return self._local(ptr).requested_size
        return self._inner.requested_size(ptr)

    def allocated_size(self, ptr: int) -> int:
        if self.track_sizes_locally:
            return self._local(ptr).allocated_size
        return self._inner.allocated_size(ptr)

    def allocation_id(self, ptr: int) -> int:
        if self.track_sizes_locally:
            return self._local(ptr).allocation_id
        return self._inner.allocation_id(ptr)
