"""What every BFC implementation shares: options, growth, the OOM path, reporting.

TF's ``AllocateRawInternal`` order lives here once: best fit, then ``Extend``,
then forced merging of timestamped chunks, then garbage collection of free
regions and ``Extend`` again, then ``OutOfMemoryError``. Subclasses supply the
chunk machinery (``BFCAllocator``: Numba kernels over tables;
``ReferenceBFCAllocator``: plain Python over ``sortedcontainers``).
"""

from __future__ import annotations

import abc
import itertools
import logging
import threading
import weakref

import numpy as np

from ..errors import OutOfMemoryError
from ..framework.allocator import AllocationAttributes
from ..framework.validate import (
    MAX_INT64,
    check_alignment,
    check_count,
    check_free_pointer,
    check_size,
)
from ..stats import AllocatorStats
from . import report as _report
from ._options import resolve_bfc_options
from ._pooled import PooledAllocator

_log = logging.getLogger("numba_bfc")

MIN_ALLOCATION = 256  # TF kMinAllocationSize: every chunk is a multiple, so all addresses align
NUM_BINS = 21  # bins 256 B .. 256 MiB and up (TF kNumBins)
DEFAULT_MAX_INTERNAL_FRAGMENTATION = 128 << 20  # TF: waste at most 128 MiB in an unsplit chunk
INITIAL_GROWTH_REGION = 2 << 20  # TF: first region with allow_growth is 2 MiB (or the limit)
# TF multiplies a size_t by a float 0.9f when a region allocation fails; single
# precision is kept so that region sizes match TF byte for byte.
_BACKPEDAL = np.float32(0.9)


def round_bytes(n: int) -> int:
    """TF's ``RoundedBytes``: up to a multiple of 256."""
    return -(-n // MIN_ALLOCATION) * MIN_ALLOCATION


class SharedCounter:
    """A monotonically increasing counter for timestamped frees (TF's ``SharedCounter``).

    ``next()`` returns 1, 2, 3, ...; ``get()`` the last value handed out.
    """

    def __init__(self) -> None:
        self._it = itertools.count(1)
        self._last = 0
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            self._last = next(self._it)
            return self._last

    def get(self) -> int:
        return self._last


class BFCBase(PooledAllocator):
    """TF BFC semantics over an abstract chunk store (see module docstring).

    The chunk store is the contract: the abstract methods (``_try_allocate``,
    ``_add_region``, ``_deallocate_chunk``, ``_lookup``, the timestamped-free
    and region hooks, ``_counters``, ``_largest_free``, ``_records``,
    ``_region_list``), all called with the lock held. ``BFCAllocator``
    implements them over the kernels' tables (``allocators._tables``),
    ``numba_bfc.testing.ReferenceBFCAllocator`` over Python objects; a
    class that misses one cannot be instantiated.
    """

    def __init__(
        self,
        backend,
        memory_limit: int | str | None = None,
        allow_growth: bool | None = None,
        garbage_collection: bool | None = None,
        fragmentation_fraction: float | None = None,
        name: str | None = None,
    ) -> None:
        opts = resolve_bfc_options(
            backend,
            memory_limit=memory_limit,
            allow_growth=allow_growth,
            garbage_collection=garbage_collection,
            fragmentation_fraction=fragmentation_fraction,
            name=name,
        )
        self._backend = backend
        self._opts = opts
        self._name = opts.name
        self._memory_limit = opts.memory_limit
        self.allow_growth = opts.allow_growth
        self._garbage_collection = opts.garbage_collection
        self.fragmentation_fraction = opts.fragmentation_fraction
        self._coalesce_regions = bool(backend.supports_coalescing)
        if opts.allow_growth:
            self._curr_region_bytes = round_bytes(min(opts.memory_limit, INITIAL_GROWTH_REGION))
        else:
            self._curr_region_bytes = round_bytes(opts.memory_limit)
        if opts.fragmentation_fraction > 0.0:
            self._max_internal_fragmentation = int(
                opts.fragmentation_fraction * opts.memory_limit
            )
        else:
            self._max_internal_fragmentation = DEFAULT_MAX_INTERNAL_FRAGMENTATION
        # Reentrant: arrays from empty() free themselves from finalizers, which may
        # run on this thread while it holds the lock; tables are consistent
        # between kernel calls, so a nested free is safe.
        self._lock = threading.RLock()
        self._weak_self = weakref.ref(self)  # what its out-of-memory errors refer to
        self._timing_counter = None
        self._timestamps_used = False
        self._safe_frontier = 0
        self._backend_refused = False

    @property
    def memory_limit(self) -> int:
        """Most bytes held from the backend (fixed at construction)."""
        return self._memory_limit

    @property
    def garbage_collection(self) -> bool:
        """Whether the out-of-memory path gives free regions back and retries
        (fixed at construction)."""
        return self._garbage_collection

    # ------------------------------------------------------------------ public API
    def allocate_raw(self, num_bytes: int, alignment: int = MIN_ALLOCATION,
                     attributes: AllocationAttributes | None = None, *,
                     freed_before: int = 0) -> int:
        """Allocate ``num_bytes`` and return the address (0 for 0 bytes).

        Parameters
        ----------
        num_bytes : int
        alignment : int
            A power of two; the address is a multiple of ``max(alignment, 256)``.
        attributes : AllocationAttributes, optional
            Its ``freed_before`` is used when the keyword below is 0.
        freed_before : int
            If > 0, do not reuse chunks freed with a timing count later than this.

        Raises
        ------
        OutOfMemoryError
            Nothing fits and the pool cannot grow; the state is unchanged.
        TypeError, ValueError
            Bad arguments; the state is unchanged.
        """
        n = check_size(num_bytes)
        alignment = check_alignment(alignment)
        if attributes is not None and not isinstance(attributes, AllocationAttributes):
            raise TypeError("attributes must be an AllocationAttributes or None, got "
                            f"{type(attributes).__name__}")
        if attributes is not None and not freed_before:
            freed_before = attributes.freed_before_count()
        freed_before = check_count(freed_before, "freed_before")
        if n == 0:
            return 0
        if n > self._memory_limit:
            with self._lock:
                raise self._out_of_memory(n, 0, alignment, "limit")
        with self._lock:
            if self._timestamps_used:
                self._merge_timestamped(0, self._safe_frontier)
            p = self._try_allocate(n, alignment, freed_before)
            if p:
                return p
            return self._allocate_slow(n, alignment, freed_before)

    def deallocate_raw(self, ptr: int | None) -> None:
        """Free an address from ``allocate_raw``; 0 or None is a no-op.

        Raises
        ------
        InvalidPointerError
            Double free, interior pointer or unknown pointer; state unchanged.
        """
        p = check_free_pointer(ptr)
        if not p:
            return
        with self._lock:
            if self._timing_counter is not None:
                if self._lookup(p) is None:
                    raise self._invalid_pointer(p)
                count = check_count(self._timing_counter.next(), "timing count")
                self._deallocate_chunk(p, max(count, 1))
            elif not self._deallocate_chunk(p, 0):
                raise self._invalid_pointer(p)

    def get_stats(self) -> AllocatorStats:
        """Current counters (see ``AllocatorStats``)."""
        with self._lock:
            return self._stats_locked()

    def clear_stats(self) -> bool:
        """TF's ``ClearStats``: zero ``num_allocs`` and ``largest_alloc_size``, and
        reset ``peak_bytes_in_use`` to the current ``bytes_in_use``."""
        with self._lock:
            self._clear_counters()
        return True

    def regions(self) -> list[tuple[int, int]]:
        """``[(base, size), ...]`` of the backend regions held, in address order."""
        with self._lock:
            return self._region_list()

    def deallocate_free_regions(self, rounded_bytes: int = 0) -> bool:
        """Give regions with no chunk in use back to the backend (TF's ``DeallocateFreeRegions``).

        As in TF, nothing is freed when doing so cannot make room for
        ``rounded_bytes``. Unlike TF's private method, an explicit call works
        whether or not ``garbage_collection`` is on; that option only controls
        the automatic call on the out-of-memory path. Returns True if any region
        was freed.
        """
        r = check_size(rounded_bytes)
        with self._lock:
            return self._release_free_regions(r)

    def memory_map(self) -> dict:
        """A JSON-serialisable dump of the allocator (TF's ``RecordMemoryMap``)."""
        with self._lock:
            records = self._records()
            return {
                "allocator_name": self._name,
                "memory_limit": self.memory_limit,
                "stats": self._stats_locked().to_dict(),
                "bin_summary": self._bin_summary(records),
                "regions": [{"base": b, "size": s} for b, s in self._region_list()],
                "chunks": _report.chunk_list(records),
            }

    def render_occupancy(self, width: int = 100) -> str:
        """One line of ``width`` characters over all regions (TF's ``RenderOccupancy``)."""
        with self._lock:
            return _report.render_occupancy(self._records(), self._region_list(), width)

    def set_timing_counter(self, counter: SharedCounter | None) -> None:
        """Tag every later free with ``counter.next()`` (TF's ``SetTimingCounter``).

        Tagged chunks stay uncoalesced, and are not reused by an allocation with
        an earlier ``freed_before``, until ``set_safe_frontier`` passes their tag.
        """
        if counter is not None and not (callable(getattr(counter, "next", None))
                                        and callable(getattr(counter, "get", None))):
            raise TypeError("counter must have next() and get() (a SharedCounter) or be None, "
                            f"got {type(counter).__name__}")
        with self._lock:
            self._timing_counter = counter
            if counter is not None:
                self._timestamps_used = True

    def set_safe_frontier(self, count: int) -> None:
        """Raise the safe frontier: chunks tagged below ``count`` become ordinary."""
        c = check_count(count, "count")
        with self._lock:
            self._safe_frontier = max(self._safe_frontier, c)

    def __repr__(self) -> str:
        s = self.get_stats()
        return (
            f"{type(self).__name__}(name={self._name!r}, in_use={s.bytes_in_use}, "
            f"reserved={s.bytes_reserved}, limit={self.memory_limit})"
        )

    # ------------------------------------------------------------------ orchestration
    def _allocate_slow(self, n: int, alignment: int, freed_before: int,
                       extended: bool = False) -> int:
        """Everything after a miss; ``extended``: the first growth (and the
        retry after it) already happened, as a batch grows before it retries."""
        rounded = round_bytes(n)
        align = max(alignment, MIN_ALLOCATION)
        if not extended:
            self._backend_refused = False
            if self._extend(align, rounded):
                p = self._try_allocate(n, alignment, freed_before)
                if p:
                    return p
        if freed_before == 0 and self._has_timestamped():
            if self._merge_timestamped(rounded, self._safe_frontier):
                p = self._try_allocate(n, alignment, freed_before)
                if p:
                    return p
        if (
            self._garbage_collection
            and self._release_free_regions(rounded)
            and self._extend(align, rounded)
        ):
            p = self._try_allocate(n, alignment, freed_before)
            if p:
                return p
        raise self._out_of_memory(n, rounded, alignment,
                                  "backend" if self._backend_refused else None)

    def _extend(self, alignment: int, rounded: int) -> bool:
        """TF's ``Extend``: get a new region big enough for ``rounded`` bytes."""
        pool = self._usage()[1]
        available = (self._memory_limit - pool) // MIN_ALLOCATION * MIN_ALLOCATION
        if rounded > available:
            return False
        increased = False
        while rounded > self._curr_region_bytes:
            self._curr_region_bytes *= 2
            increased = True
        nbytes = min(self._curr_region_bytes, available)
        got = self._region_from_backend(nbytes, alignment)
        while got is None:
            backpedal = round_bytes(int(np.float32(nbytes) * _BACKPEDAL))
            # Rounding up can give back the same size: force progress so a
            # backend that always fails cannot make this loop spin.
            if backpedal >= nbytes:
                backpedal = nbytes - MIN_ALLOCATION
            nbytes = backpedal
            if nbytes < rounded:
                self._backend_refused = True
                return False
            got = self._region_from_backend(nbytes, alignment)
        if not increased:
            self._curr_region_bytes *= 2
        ptr, received = got
        self._check_region(ptr, received, nbytes)
        self._add_region(ptr, received)
        return True

    def _region_from_backend(self, nbytes: int, alignment: int) -> tuple[int, int] | None:
        """``backend.alloc``, except that a region reaching past the int64
        address space the tables hold is given back and counts as a refusal
        (a huge alignment can push a simulated address space there)."""
        got = self._backend.alloc(nbytes, alignment)
        if got is not None and got[0] + got[1] > MAX_INT64:
            self._backend.free(*got)
            return None
        return got

    def _check_region(self, ptr: int, received: int, nbytes: int) -> None:
        """Give back and refuse a region that breaks the backend contract."""
        if ptr <= 0 or ptr % MIN_ALLOCATION or received % MIN_ALLOCATION or received < nbytes:
            self._backend.free(ptr, received)
            raise RuntimeError(
                f"backend returned region ({ptr:#x}, {received}): must be 256-byte aligned "
                f"and a multiple of 256 of at least {nbytes} bytes"
            )

    def _release_free_regions(self, rounded: int) -> bool:
        candidates = self._free_regions()
        total = sum(size for _, _, size in candidates)
        if total == 0:
            return False
        available = self._memory_limit - self._usage()[1] + total
        if rounded > available:
            return False
        _log.info("%s: giving %d free region(s), %d bytes, back to the backend",
                  self._name, len(candidates), total)
        for key, base, size in candidates:
            self._remove_region(key)
            self._backend.free(base, size)
        return True

    def _stats_locked(self) -> AllocatorStats:
        return self._stats_from(self._snapshot()[0], self._largest_free(), self._memory_limit)

    @staticmethod
    def _stats_from(c: dict, largest: int, limit: int) -> AllocatorStats:
        """Stats from counters: static, so that a deferred build holds no allocator."""
        free = c["pool_bytes"] - c["bytes_in_use"]
        return AllocatorStats(
            num_allocs=c["num_allocs"],
            bytes_in_use=c["bytes_in_use"],
            peak_bytes_in_use=c["peak_bytes_in_use"],
            largest_alloc_size=c["largest_alloc_size"],
            bytes_limit=limit,
            bytes_reserved=c["pool_bytes"],
            peak_bytes_reserved=c["peak_pool_bytes"],
            largest_free_block_bytes=largest,
            fragmentation=(free - largest) / free if free > 0 else 0.0,
        )

    def _out_of_memory(self, n: int, rounded: int, alignment: int,
                       reason: str | None) -> OutOfMemoryError:
        """The error for a failed request, the counters taken now (``reason``
        None: fragmentation or exhaustion, whichever they say)."""
        counters, fingerprint = self._snapshot()
        in_use, reserved = self._usage_from(counters)
        return self._failure(n, rounded, alignment, reason, counters, fingerprint, in_use,
                             reserved, None)

    def _failure(self, n: int, rounded: int, alignment: int, reason: str | None, counters,
                 fingerprint, in_use: int, reserved: int,
                 largest: int | None) -> OutOfMemoryError:
        """``_out_of_memory`` given the counters (``_snapshot``), the usage they
        hold, and the largest free chunk if known."""
        limit = self._memory_limit
        if reason is None:
            reason = ("fragmentation" if (reserved - in_use) + (limit - reserved) >= rounded
                      else "exhausted")
        if self._brief_oom:
            return _report.brief_oom(self._name, n, rounded, alignment, reason)
        # The stats, the message and the report are built when someone reads
        # them: a retry loop that only catches the error never pays for them.
        return OutOfMemoryError.deferred(
            _report.Failure(self, counters, fingerprint,
                            self._largest_free() if largest is None else largest, limit),
            self._name, n, rounded, alignment, reason)

    @staticmethod
    def _bin_summary(records: np.ndarray) -> list[dict]:
        return _report.bin_summary(records, MIN_ALLOCATION, NUM_BINS)

    @classmethod
    def _failure_stats(cls, counters, largest: int, limit: int) -> AllocatorStats:
        return cls._stats_from(counters, largest, limit)

    @staticmethod
    def _failure_message(error: OutOfMemoryError, stats: AllocatorStats, counters,
                         limit: int) -> str:
        return _report.oom_message(error.allocator_name, error.num_bytes, error.rounded_bytes,
                                   error.alignment, stats, limit, error.reason)

    def _snapshot(self) -> tuple:
        """``(counters, report fingerprint)``, taken at once: the counters as
        ``_stats_from`` and ``_usage_from`` read them."""
        return self._counters(), self._report_fingerprint()

    @staticmethod
    def _usage_from(counters) -> tuple[int, int]:
        """(bytes in use, bytes reserved) from ``_snapshot``'s counters."""
        return counters["bytes_in_use"], counters["pool_bytes"]

    # ------------------------------------------------------------------ chunk store
    # Subclasses implement these; all are called with the lock held.
    @abc.abstractmethod
    def _try_allocate(self, n: int, alignment: int, freed_before: int) -> int:
        raise NotImplementedError

    @abc.abstractmethod
    def _add_region(self, ptr: int, size: int) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def _deallocate_chunk(self, ptr: int, count: int) -> bool:
        raise NotImplementedError

    @abc.abstractmethod
    def _lookup(self, ptr: int) -> tuple[int, int, int] | None:
        raise NotImplementedError

    @abc.abstractmethod
    def _has_timestamped(self) -> bool:
        raise NotImplementedError

    @abc.abstractmethod
    def _merge_timestamped(self, required: int, frontier: int) -> bool:
        raise NotImplementedError

    @abc.abstractmethod
    def _free_regions(self) -> list[tuple[object, int, int]]:
        raise NotImplementedError

    @abc.abstractmethod
    def _remove_region(self, key) -> None:
        raise NotImplementedError

    def _report_fingerprint(self):
        """Something that changes whenever the chunks do, cheap to take (None:
        no such thing, so an out-of-memory report is built at once)."""
        return None

    def _usage(self) -> tuple[int, int]:
        """(bytes in use, bytes reserved), cheaply: what a replay samples per event."""
        c = self._counters()
        return c["bytes_in_use"], c["pool_bytes"]

    @abc.abstractmethod
    def _counters(self) -> dict:
        raise NotImplementedError

    @abc.abstractmethod
    def _clear_counters(self) -> None:
        raise NotImplementedError

    @abc.abstractmethod
    def _largest_free(self) -> int:
        raise NotImplementedError

    @abc.abstractmethod
    def _records(self) -> np.ndarray:
        raise NotImplementedError

    @abc.abstractmethod
    def _region_list(self) -> list[tuple[int, int]]:
        raise NotImplementedError
