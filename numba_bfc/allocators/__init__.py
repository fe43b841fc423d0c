"""The Python façade: allocator classes holding the tables, a lock and the backend."""

from ._bfc_base import SharedCounter
from .bfc import BFCAllocator
from .caching import CachingAllocator
from .compact import CompactAllocator

__all__ = ["BFCAllocator", "CachingAllocator", "CompactAllocator", "SharedCounter"]
