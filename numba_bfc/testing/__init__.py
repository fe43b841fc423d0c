"""What the tests check numba_bfc against: a plain-Python reference allocator
per policy (the oracles, ``ORACLES`` by policy name) and the table invariant
checker (``numba_bfc.testing.invariants.check_invariants``)."""

from .bfc import ReferenceBFCAllocator
from .caching import ReferenceCachingAllocator
from .compact import ReferenceCompactAllocator

__all__ = ["ORACLES", "ReferenceBFCAllocator", "ReferenceCachingAllocator",
           "ReferenceCompactAllocator"]

#: Each policy's oracle, by the policy's name (``numba_bfc.allocators.POLICIES``).
ORACLES: dict[str, type] = {
    "bfc": ReferenceBFCAllocator,
    "caching": ReferenceCachingAllocator,
    "compact": ReferenceCompactAllocator,
}
