"""``LoggingAllocator``: every allocation event as a row of RMM's CSV log."""

from __future__ import annotations

import datetime as _dt
import os
import threading
from typing import IO

from ..framework.allocator import AllocationAttributes, Allocator
from ..framework.wrapper import BookkeepingWrapper
from ..traces.rmm_log import RmmLogEvent, RmmLogWriter

__all__ = ["LoggingAllocator"]


class LoggingAllocator(BookkeepingWrapper):
    """Log allocate / free / allocate failure in RMM's ``logging_resource_adaptor`` format.

    The file gets the header ``Thread,Time,Action,Pointer,Size,Stream`` at
    once, then one row per event (see ``numba_bfc.traces.rmm_log``): the OS
    thread id, local time, the requested size (also on frees), stream 0.
    RMM's replay tools read it, and ``numba_bfc.traces.read_rmm_log`` reads
    RMM's logs. Out-of-memory errors are logged as ``allocate failure``; bad
    arguments are not events. Requests with
    ``AllocationAttributes(allocation_will_be_logged=True)`` are logged too
    (TF's flag is for TF's own memory logging, not this file).

    The log is written under the bookkeeping lock, which a free holds across
    the inner free (see ``numba_bfc.framework.wrapper``): when an address is
    freed and handed out again, the ``free`` row always precedes the new
    ``allocate`` row, so the log replays.

    Parameters
    ----------
    inner : Allocator
    target : str, path or text file
        A path is truncated and owned (closed by ``close()``); a file object
        is written to and left open.
    auto_flush : bool
        Flush after every row (RMM's ``auto_flush``; slower).

    After ``close()`` new allocations raise ``RuntimeError``; frees still
    reach the inner allocator (memory is never stranded) but are not logged.
    """

    kind = "logging"

    def __init__(self, inner: Allocator, target: str | os.PathLike | IO[str],
                 auto_flush: bool = False, name: str | None = None) -> None:
        super().__init__(inner, name)
        self._writer = RmmLogWriter(target, auto_flush=auto_flush)

    def _row(self, action: str, ptr: int, size: int) -> None:
        if not self._writer.closed:
            self._writer.write(RmmLogEvent(threading.get_native_id(), _dt.datetime.now().time(),
                                           action, ptr, size, 0))

    def allocate_raw(self, num_bytes: int, alignment: int = 256,
                     attributes: AllocationAttributes | None = None) -> int:
        if self._writer.closed:
            raise RuntimeError(f"{self.name}: the log is closed")
        return super().allocate_raw(num_bytes, alignment, attributes)

    def _allocation_failed(self, num_bytes: int, error: BaseException) -> None:
        if isinstance(error, MemoryError):
            self._row("allocate failure", 0, num_bytes)

    def _allocated(self, ptr: int, num_bytes: int) -> int:
        self._row("allocate", ptr, num_bytes)
        return num_bytes

    def _freed(self, ptr: int, record: int) -> None:
        self._row("free", ptr, record)

    def flush(self) -> None:
        """Push buffered rows to the file."""
        with self._lock:
            self._writer.flush()

    def close(self) -> None:
        """Flush and stop logging (closes the file if this adaptor opened it)."""
        with self._lock:
            self._writer.close()

    def __enter__(self) -> LoggingAllocator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
