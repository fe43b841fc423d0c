"""Plain-Python reference allocators used as test oracles."""

from .bfc import ReferenceBFCAllocator
from .caching import ReferenceCachingAllocator

__all__ = ["ReferenceBFCAllocator", "ReferenceCachingAllocator"]
