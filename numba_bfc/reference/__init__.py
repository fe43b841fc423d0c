"""Plain-Python reference allocators used as test oracles."""

from .bfc import ReferenceBFCAllocator

__all__ = ["ReferenceBFCAllocator"]
