"""``RetryingAllocator``: wait for frees instead of failing (TF's ``AllocatorRetry``)."""

from __future__ import annotations

import threading
import time

from ..errors import OutOfMemoryError
from ..framework.allocator import AllocationAttributes, Allocator
from ..framework.wrapper import AllocatorWrapper

__all__ = ["RetryingAllocator"]


class RetryingAllocator(AllocatorWrapper):
    """On ``OutOfMemoryError``, wait for a free and try again, up to ``max_wait`` seconds.

    Every ``deallocate_raw`` through this adaptor notifies a condition that
    waiting allocations sleep on, so they wake as soon as memory comes back
    and never poll. The deadline starts at the first failure, as in TF; once
    it has passed, one last attempt is made and its error raised. A request
    with ``AllocationAttributes(retry_on_failure=False)`` fails at once.

    Only frees that go through this adaptor wake waiters: wrap an allocator
    once and free through the wrapper.

    Thread safety: the condition's lock guards a free counter and the retry
    counts, and is never held while calling the inner allocator. A waiter
    compares the free counter with the value it read before its attempt, so a
    free that lands between the failure and the wait is not missed.

    Parameters
    ----------
    inner : Allocator
    max_wait : float
        Seconds to keep retrying after the first failure (TF: 10 s).
    """

    kind = "retrying"

    def __init__(self, inner: Allocator, max_wait: float = 10.0, name: str | None = None) -> None:
        super().__init__(inner, name)
        if isinstance(max_wait, bool) or not isinstance(max_wait, (int, float)) or not (
                max_wait >= 0):
            raise ValueError(f"max_wait must be a number of seconds >= 0, got {max_wait!r}")
        self.max_wait = float(max_wait)
        # Reentrant: a garbage collection under it can run a finalizer that frees
        # through this adaptor on the same thread (a plain lock deadlocked).
        self._freed = threading.Condition(threading.RLock())
        self._num_frees = 0
        self._num_retries = 0
        self._num_failures = 0

    @property
    def num_retries(self) -> int:
        """Attempts made after a first failure, over this adaptor's life."""
        with self._freed:
            return self._num_retries

    @property
    def num_failures(self) -> int:
        """Out-of-memory errors raised after waiting (or at once, without retry)."""
        with self._freed:
            return self._num_failures

    def allocate_raw(self, num_bytes: int, alignment: int = 256,
                     attributes: AllocationAttributes | None = None) -> int:
        deadline = None
        while True:
            with self._freed:
                frees_seen = self._num_frees
            try:
                return self._inner.allocate_raw(num_bytes, alignment, attributes)
            except OutOfMemoryError:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.max_wait
                give_up = (attributes is not None and not attributes.retry_on_failure
                           or now >= deadline)
                with self._freed:
                    if give_up:
                        self._num_failures += 1
                        raise
                    # Wakes on the next free, or at the deadline for a last try.
                    self._freed.wait_for(lambda seen=frees_seen: self._num_frees != seen,
                                         timeout=deadline - now)
                    self._num_retries += 1

    def deallocate_raw(self, ptr: int | None) -> None:
        self._inner.deallocate_raw(ptr)
        if ptr:
            with self._freed:
                self._num_frees += 1
                self._freed.notify_all()
