"""Automatic garbage collection held back while a multi-step change is half made.

A collection can run at any Python allocation of a container, and the
finalizers it runs can call back into the code that was interrupted: an
allocator's lock lets its holder's thread in again, and a non-reentrant lock
(``HostSubAllocator``'s map lock) deadlocks. ``pause_gc`` keeps a
count over every caller and thread, so automatic collection waits until the
last pause ends and then runs such a finalizer after the change, as if called
after it. Explicit ``gc.collect()`` calls still collect.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_pause_lock = threading.Lock()
_lock, _unlock = _pause_lock.acquire, _pause_lock.release  # cheaper than ``with``
_pauses = 0
_was_enabled = False


def pause_gc() -> None:
    """Stop automatic garbage collection until the matching ``resume_gc``."""
    global _pauses, _was_enabled
    _lock()
    try:
        if _pauses == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _pauses += 1
    finally:
        _unlock()


def resume_gc() -> None:
    """End one ``pause_gc``: the last one restores collection if it was on."""
    global _pauses
    _lock()
    try:
        _pauses -= 1
        if _pauses == 0 and _was_enabled:
            gc.enable()
    finally:
        _unlock()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """``pause_gc`` for the block."""
    pause_gc()
    try:
        yield
    finally:
        resume_gc()
