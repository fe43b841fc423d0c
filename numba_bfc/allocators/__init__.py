"""The Python façade: allocator classes holding the tables, a lock and the backend."""

from .bfc import BFCAllocator
from .bfc_base import SharedCounter
from .caching import CachingAllocator
from .compact import CompactAllocator

__all__ = ["BFCAllocator", "CachingAllocator", "CompactAllocator", "SharedCounter"]
