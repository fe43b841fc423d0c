"""``LimitingAllocator``: refuse allocations beyond a byte limit (RMM's limiting adaptor)."""

from __future__ import annotations

from .._config import parse_size
from ..errors import OutOfMemoryError
from ..framework.allocator import Allocator
from ..framework.wrapper import BookkeepingWrapper
from ..stats import format_bytes

__all__ = ["LimitingAllocator"]


class LimitingAllocator(BookkeepingWrapper):
    """Raise ``OutOfMemoryError`` (``reason="limit"``) rather than exceed ``limit`` bytes.

    What counts: the inner allocator's ``allocated_size`` when it tracks sizes
    (the memory really taken, after rounding), else the requested size. The
    requested size is reserved before the inner call, so concurrent requests
    cannot overshoot together; when the allocated size turns out larger and
    crosses the limit, the allocation is given back and refused.

    Thread safety: the bookkeeping lock (see ``numba_bfc.framework.wrapper``)
    guards the byte count.

    Parameters
    ----------
    inner : Allocator
    limit : int or str
        Bytes, or a size string such as ``"512MiB"``.
    """

    kind = "limiting"

    def __init__(self, inner: Allocator, limit: int | str, name: str | None = None) -> None:
        super().__init__(inner, name)
        self.limit = parse_size(limit, name="limit")
        self._counted = 0

    @property
    def allocated_bytes(self) -> int:
        """Bytes counted against the limit now (RMM's ``get_allocated_bytes``)."""
        with self._lock:
            return self._counted

    def _refuse(self, n: int, counted: int) -> OutOfMemoryError:
        return OutOfMemoryError(
            f"{self.name}: allocating {format_bytes(n)} (counted as {format_bytes(counted)}) "
            f"would exceed the limit of {format_bytes(self.limit)} "
            f"({format_bytes(self._counted)} in use)",
            allocator_name=self.name, num_bytes=n, rounded_bytes=counted, reason="limit")

    def _before_allocate(self, num_bytes: int) -> None:
        if self._counted + num_bytes > self.limit:
            raise self._refuse(num_bytes, num_bytes)
        self._counted += num_bytes

    def _allocation_failed(self, num_bytes: int, error: BaseException) -> None:
        self._counted -= num_bytes

    def _allocated(self, ptr: int, num_bytes: int) -> int:
        if not self._inner.tracks_allocation_sizes():
            return num_bytes
        actual = self._inner.allocated_size(ptr)
        self._counted += actual - num_bytes
        if self._counted > self.limit:
            self._counted -= actual
            self._inner.deallocate_raw(ptr)
            raise self._refuse(num_bytes, actual)
        return actual

    def _freed(self, ptr: int, record: int) -> None:
        self._counted -= record
