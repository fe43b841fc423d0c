"""Adaptors: allocators that wrap another allocator and compose in any order.

``RetryingAllocator`` (TF's AllocatorRetry), ``LimitingAllocator``,
``LoggingAllocator`` (RMM's CSV log) and ``StatisticsAllocator`` (RMM's
statistics adaptor), all built on ``AllocatorWrapper``. Locking is described
in ``numba_bfc.framework.wrapper``.
"""

from ..framework.wrapper import AllocatorWrapper, BookkeepingWrapper
from .counters import Counter, StatisticsAllocator
from .event_log import LoggingAllocator
from .limiting import LimitingAllocator
from .retrying import RetryingAllocator

__all__ = [
    "AllocatorWrapper",
    "BookkeepingWrapper",
    "Counter",
    "LimitingAllocator",
    "LoggingAllocator",
    "RetryingAllocator",
    "StatisticsAllocator",
]
