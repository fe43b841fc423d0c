"""The Python façade: allocator classes holding the tables, a lock and the backend."""

from ._bfc_base import SharedCounter
from .bfc import BFCAllocator

__all__ = ["BFCAllocator", "SharedCounter"]
