"""``StatisticsAllocator``: current/peak/total counters with nested scopes (RMM's
``statistics_resource_adaptor``)."""

from __future__ import annotations

from typing import NamedTuple

from ..framework.allocator import Allocator
from ..framework.wrapper import BookkeepingWrapper

__all__ = ["Counter", "StatisticsAllocator"]


class Counter(NamedTuple):
    """One counter (RMM's ``counter``): ``value`` now, its ``peak``, and the ``total`` added."""

    value: int = 0
    peak: int = 0
    total: int = 0

    def add(self, n: int) -> Counter:
        value = self.value + n
        return Counter(value, max(self.peak, value), self.total + n)

    def remove(self, n: int) -> Counter:
        return self._replace(value=self.value - n)

    def merge_scope(self, inner: Counter) -> Counter:
        """Fold a popped inner scope into this one, as RMM's
        ``add_counters_from_tracked_sub_block``: the inner peak counts on top of
        this scope's value when the inner scope began."""
        return Counter(self.value + inner.value, max(self.peak, self.value + inner.peak),
                       self.total + inner.total)


class StatisticsAllocator(BookkeepingWrapper):
    """Count bytes and allocations passing through (requested sizes, as RMM).

    Two counters, ``bytes`` and ``allocations``, each a ``Counter(value, peak,
    total)``. ``push_counters()`` opens a fresh scope (both counters from zero)
    for measuring one region of code; ``pop_counters()`` closes it, returns its
    counters and merges them into the enclosing scope. Frees are counted in
    the scope current at the time, so a scope that frees memory allocated
    before it began ends with a negative ``value``, as in RMM.

    Thread safety: the bookkeeping lock (see ``numba_bfc.framework.wrapper``)
    guards the scope stack.

    Examples
    --------
    >>> from numba_bfc.framework.host import HostAllocator
    >>> stats = StatisticsAllocator(HostAllocator())
    >>> p = stats.allocate_raw(1000)
    >>> _ = stats.push_counters()
    >>> q = stats.allocate_raw(24)
    >>> stats.deallocate_raw(q)
    >>> stats.pop_counters()[0]
    Counter(value=0, peak=24, total=24)
    >>> stats.bytes_counter
    Counter(value=1000, peak=1024, total=1024)
    """

    kind = "statistics"

    def __init__(self, inner: Allocator, name: str | None = None) -> None:
        super().__init__(inner, name)
        self._scopes: list[tuple[Counter, Counter]] = [(Counter(), Counter())]

    @property
    def bytes_counter(self) -> Counter:
        """Bytes in the current scope (RMM's ``get_bytes_counter``)."""
        with self._lock:
            return self._scopes[-1][0]

    @property
    def allocations_counter(self) -> Counter:
        """Allocations in the current scope (RMM's ``get_allocations_counter``)."""
        with self._lock:
            return self._scopes[-1][1]

    @property
    def depth(self) -> int:
        """Number of scopes pushed and not popped."""
        with self._lock:
            return len(self._scopes) - 1

    def push_counters(self) -> tuple[Counter, Counter]:
        """Open a new scope; returns the ``(bytes, allocations)`` of the one it hides."""
        with self._lock:
            top = self._scopes[-1]
            self._scopes.append((Counter(), Counter()))
            return top

    def pop_counters(self) -> tuple[Counter, Counter]:
        """Close the current scope; returns its ``(bytes, allocations)``.

        Raises ``IndexError`` if no scope was pushed.
        """
        with self._lock:
            if len(self._scopes) < 2:
                raise IndexError("cannot pop the last counter pair: push_counters() first")
            inner_bytes, inner_allocs = self._scopes.pop()
            outer_bytes, outer_allocs = self._scopes[-1]
            self._scopes[-1] = (outer_bytes.merge_scope(inner_bytes),
                                outer_allocs.merge_scope(inner_allocs))
            return inner_bytes, inner_allocs

    def _allocated(self, ptr: int, num_bytes: int) -> int:
        nbytes, nallocs = self._scopes[-1]
        self._scopes[-1] = (nbytes.add(num_bytes), nallocs.add(1))
        return num_bytes

    def _freed(self, ptr: int, record: int) -> None:
        nbytes, nallocs = self._scopes[-1]
        self._scopes[-1] = (nbytes.remove(record), nallocs.remove(1))
