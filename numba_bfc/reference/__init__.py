"""Plain-Python reference allocators used as test oracles."""

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
