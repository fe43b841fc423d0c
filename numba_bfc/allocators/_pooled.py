"""What every pooling allocator's façade shares, whatever its policy.

A backend, a name, one reentrant lock, and size queries answered from the
policy's ``_lookup``; bad pointers are explained from its ``_records``.
"""

from __future__ import annotations

from ..errors import InvalidPointerError
from ..framework.allocator import Allocator
from ..framework.validate import check_pointer
from . import report as _report


class PooledAllocator(Allocator):
    """Base of ``BFCBase`` and ``CachingBase``; subclasses set ``_name``,
    ``_backend`` and ``_lock`` and implement ``_lookup`` and ``_records``."""

    #: True while a batch wants its later failures brief (``_report.brief_oom``).
    _brief_oom = False

    @property
    def name(self) -> str:
        """The allocator's name."""
        return self._name

    @property
    def backend(self):
        """The sub-allocator the pool's memory comes from."""
        return self._backend

    @property
    def host_accessible(self) -> bool:
        """True when the backend hands out real host memory (``empty()`` works)."""
        return bool(self._backend.host_accessible)

    def tracks_allocation_sizes(self) -> bool:
        """Always True: requested and allocated sizes are known for every pointer."""
        return True

    def chunks(self):
        """Every chunk (block) of the pool, in address order: a structured array
        with ``address``, ``size``, ``requested_size`` (0 when free), ``bin``
        (-1 when in use, except caching pools, which name the pool),
        ``in_use``, ``allocation_id`` and ``freed_at_count``."""
        with self._lock:
            return self._records()

    def requested_size(self, ptr: int) -> int:
        """Bytes the client asked for at ``ptr``."""
        return self._live(ptr)[0]

    def allocated_size(self, ptr: int) -> int:
        """Bytes of the chunk serving ``ptr`` (after rounding and any unsplit remainder)."""
        return self._live(ptr)[1]

    def allocation_id(self, ptr: int) -> int:
        """The unique id (> 0) of the live allocation at ``ptr``."""
        return self._live(ptr)[2]

    def _repr_html_(self) -> str:
        """Jupyter's display: the main counters and the occupancy strip."""
        from .._html import occupancy_svg, table
        from ..stats import format_bytes

        with self._lock:
            s = self.get_stats()
            records, regions = self._records(), self._region_list()
        limit = "none" if not s.bytes_limit else format_bytes(s.bytes_limit)
        rows = [("in use (peak)", f"{format_bytes(s.bytes_in_use)} "
                                  f"({format_bytes(s.peak_bytes_in_use)})"),
                ("reserved (peak)", f"{format_bytes(s.bytes_reserved)} "
                                    f"({format_bytes(s.peak_bytes_reserved)})"),
                ("limit", limit),
                ("regions / chunks", f"{len(regions)} / {len(records)}"),
                ("largest free block", format_bytes(s.largest_free_block_bytes)),
                ("fragmentation", f"{s.fragmentation:.3f}")]
        return (table(rows, f"{type(self).__name__} {self._name!r}")
                + occupancy_svg(records, regions))

    def _invalid_pointer(self, p: int) -> InvalidPointerError:
        return _report.invalid_pointer_error(self._name, self._records(), p)

    def _live(self, ptr) -> tuple[int, int, int]:
        p = check_pointer(ptr)
        with self._lock:
            info = self._lookup(p) if p else None
            if info is None:
                raise self._invalid_pointer(p)
            return info
