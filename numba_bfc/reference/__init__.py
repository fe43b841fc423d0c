"""Plain-Python reference allocators used as test oracles."""

from .bfc import ReferenceBFCAllocator
from .caching import ReferenceCachingAllocator
from .compact import ReferenceCompactAllocator

__all__ = ["ReferenceBFCAllocator", "ReferenceCachingAllocator", "ReferenceCompactAllocator"]
