"""Stream-safe reuse: a block freed by Python goes back to the pool only after the
device work queued before its free has finished.

Numba frees a device array when Python collects it, which can happen while
kernels or asynchronous copies that use it are still queued. Numba's own
manager is safe because ``cuMemFree`` waits for the device; a pool that hands
the block out again at once is not: work of the next owner on another stream
can run before the old work and overwrite, or be overwritten by, it.

How it works (``stream_safety="events"``, the default):

- A finalizer only appends ``(address, nbytes)`` to ``entries``, a deque
  (thread-safe, no lock, no driver call). One ``PendingFrees`` lives as long
  as one allocator: finalizers of blocks from before a reset append to the
  old one, which nobody reads.
- A *fence* covers every entry appended since the previous one: one CUDA event
  recorded on the legacy default stream, which completes only after all work
  queued before it on the legacy stream and on every blocking stream (those
  of ``cuda.stream()``, and per-thread default streams: CUDA's "stream
  synchronization behavior"). A block whose array had ``record_stream(array,
  s)`` called for a non-blocking stream ``s`` adds an event on ``s`` to its
  fence.
- A fence's blocks return to the pool once all its events have completed
  (``cuEventQuery``), oldest fence first. ``wait_all`` synchronizes on them
  instead (out of memory, ``release_unused``, reset).

Driver calls cost about as much as a whole pool allocation, so the owner
decides when to ``reclaim``: when a request may not fit in the pool's memory
that is free now (``live_bytes`` says what is handed out), or when
``len(entries)`` passes ``reclaim_at`` (``MAX_UNFENCED`` frees not yet
fenced); in between, frees accumulate at no cost (see
``NumbaBFCMemoryManager``).

``stream_safety="off"`` returns blocks at once (one-stream programs), except
those with recorded streams, which still wait for events on those streams.

The driver is reached through a ``FenceSource``: ``CudaEventFences`` records
CUDA events; tests and simulations pass their own.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import islice
from operator import itemgetter
from typing import Any, Protocol

__all__ = [
    "STREAM_SAFETY_MODES",
    "FenceSource",
    "CudaEventFences",
    "PendingFrees",
    "StreamSafetyStats",
    "parse_stream_safety",
    "stream_handle",
]

STREAM_SAFETY_MODES = ("events", "off")

# Stream handles with a fixed meaning (cuda.h): 0 is the default stream (legacy,
# or the per-thread one in per-thread mode), the other two name one explicitly.
DEFAULT_STREAM = 0
LEGACY_STREAM = 1  # CU_STREAM_LEGACY
PER_THREAD_STREAM = 2  # CU_STREAM_PER_THREAD
_NON_BLOCKING = 1  # CU_STREAM_NON_BLOCKING
_DISABLE_TIMING = 2  # CU_EVENT_DISABLE_TIMING: cheaper to record
_CUDA_SUCCESS = 0
_CUDA_ERROR_NOT_READY = 600

#: Pending frees above which a reclaim runs whatever the pool's free memory.
MAX_UNFENCED = 256


def parse_stream_safety(value: Any, *, name: str = "stream_safety") -> str:
    """``"events"`` or ``"off"`` (case-insensitive); ``ValueError`` otherwise."""
    v = str(value).strip().lower()
    if v not in STREAM_SAFETY_MODES:
        raise ValueError(
            f"{name}: unknown mode {value!r} (choose one of {', '.join(STREAM_SAFETY_MODES)})")
    return v


def stream_handle(stream: Any) -> int:
    """The ``CUstream`` handle of a stream object, as an int.

    Accepts an int, a Numba ``Stream`` (``.handle``), a CuPy stream (``.ptr``)
    or any object with ``__cuda_stream__()`` (the CUDA stream protocol).
    """
    if isinstance(stream, bool):
        raise TypeError("a stream cannot be a bool")
    if isinstance(stream, int):
        handle = stream
    elif hasattr(stream, "__cuda_stream__"):
        handle = stream.__cuda_stream__()[1]
    elif hasattr(stream, "handle"):
        handle = stream.handle
    elif hasattr(stream, "ptr"):
        handle = stream.ptr
    else:
        raise TypeError(
            f"{type(stream).__name__} is not a CUDA stream (pass a Numba or CuPy stream, an "
            "object with __cuda_stream__, or a CUstream handle as an int)")
    handle = int(handle or 0)
    if handle < 0:
        raise ValueError(f"a stream handle cannot be negative: {handle}")
    return handle


class FenceSource(Protocol):
    """Where fences come from: CUDA events, or a stand-in for tests.

    A token marks a point in a stream's queue: it is complete once all work
    queued on that stream (and what that stream waits for) before it has run.
    """

    def record(self, stream: int) -> Any:
        """A token recorded now on ``stream`` (a ``CUstream`` handle)."""

    def query(self, token: Any) -> bool:
        """True if ``token`` has completed; never blocks."""

    def wait(self, token: Any) -> None:
        """Block until ``token`` has completed."""

    def recycle(self, token: Any) -> None:
        """``token`` is no longer needed (its event may be reused)."""

    def is_blocking(self, stream: int) -> bool:
        """True if the legacy default stream orders ``stream``'s work: the default,
        legacy and per-thread streams (handles 0, 1, 2), and streams not created
        with ``CU_STREAM_NON_BLOCKING``."""

    def close(self) -> None:
        """Release what the source holds (events)."""


@dataclass(frozen=True)
class StreamSafetyStats:
    """What ``NumbaBFCMemoryManager.stream_safety_stats()`` reports.

    Attributes
    ----------
    mode : str
        ``"events"``, ``"off"``, or ``"none"`` (the backend is not device
        memory: no device work can use it, blocks return at once).
    pending_blocks, pending_bytes : int
        Blocks freed by Python and not yet back in the pool, and their sizes
        (as asked of ``memalloc``). The allocator still counts them in use.
    peak_pending_blocks : int
        The most blocks one reclaim found pending.
    fences : int
        Fences recorded and not yet complete.
    events_recorded, event_queries, waits : int
        Driver calls: events recorded, completion queries, blocking waits.
    reclaims : int
        Times pending blocks were fenced and completed ones returned.
    recorded_streams : int
        Blocks waiting on a stream from ``record_stream`` (not yet freed).
    """

    mode: str
    pending_blocks: int
    pending_bytes: int
    peak_pending_blocks: int
    fences: int
    events_recorded: int
    event_queries: int
    waits: int
    reclaims: int
    recorded_streams: int


class PendingFrees:
    """Blocks freed by Python, on their way back to one allocator's pool.

    Not thread-safe except ``entries.append`` (finalizers); the owner calls
    everything else under its lock.

    Parameters
    ----------
    fences : FenceSource or None
        None when no device work can use the memory (simulated backends):
        blocks then return at once.
    legacy_fence : bool
        True for ``stream_safety="events"``: every free waits for an event on
        the legacy default stream. False (``"off"``): only blocks with
        recorded streams wait, for events on those streams.
    """

    def __init__(self, fences: FenceSource | None = None, legacy_fence: bool = True) -> None:
        #: ``(address, nbytes)`` appended by finalizers.
        self.entries: deque = deque()
        #: Bytes (rounded to 512) allocated and not yet returned: pending ones included.
        self.live_bytes = 0
        self._fences = fences
        #: True when frees wait for events on the legacy stream ("events" mode).
        self.gated = legacy_fence and fences is not None
        self._deallocate: Callable[[int], None] | None = None
        # Events mode: (tokens, count) per fence, covering the first entries of
        # ``entries`` in order (no per-free work when fencing).
        self._batches: deque = deque()
        self._fenced = 0
        #: A queue longer than this has more than ``MAX_UNFENCED`` frees unfenced.
        self.reclaim_at = MAX_UNFENCED
        # Off mode: (tokens, [entries]) of blocks with recorded streams.
        self._parked: deque = deque()
        #: address -> {handle: stream object}: streams whose work a free waits for.
        self.stream_uses: dict[int, dict[int, Any]] = {}
        self._peak_pending = 0
        self._records = self._queries = self._waits = self._reclaims = 0

    # ------------------------------------------------------------------ state
    @property
    def pending_fences(self) -> int:
        """Fences recorded and not yet complete."""
        return len(self._batches) + len(self._parked)

    @property
    def mode(self) -> str:
        if self._fences is None:
            return "none"
        return "events" if self.gated else "off"

    @property
    def fences(self) -> FenceSource | None:
        return self._fences

    def bind(self, deallocate: Callable[[int], None] | None) -> None:
        """Blocks go back through ``deallocate`` (the allocator's ``deallocate_raw``)."""
        self._deallocate = deallocate

    def stats(self) -> StreamSafetyStats:
        entries = self._entries_from(0, len(self.entries))
        parked = [e for _, batch in self._parked for e in batch]
        live = entries + parked
        return StreamSafetyStats(
            mode=self.mode,
            pending_blocks=len(live),
            pending_bytes=sum(e[1] for e in live),
            peak_pending_blocks=max(self._peak_pending, len(live)),
            fences=self.pending_fences,
            events_recorded=self._records,
            event_queries=self._queries,
            waits=self._waits,
            reclaims=self._reclaims,
            recorded_streams=len(self.stream_uses),
        )

    def __len__(self) -> int:
        return len(self.entries) + sum(len(batch) for _, batch in self._parked)

    # ------------------------------------------------------------------ record_stream
    def record_stream(self, address: int, stream: Any) -> bool:
        """Make the free of the block at ``address`` wait for ``stream``'s work.

        Returns False when nothing needs recording: without device work, or a
        blocking stream in events mode (the legacy-stream event covers it).
        """
        if self._fences is None:
            return False
        handle = stream_handle(stream)
        if self.gated and self._fences.is_blocking(handle):
            return False
        # The stream object stays referenced until the event is recorded, so a
        # Numba stream is not destroyed before the free is fenced.
        self.stream_uses.setdefault(address, {})[handle] = stream
        return True

    # ------------------------------------------------------------------ returning blocks
    def drain(self) -> int:
        """Off mode: return every queued block now, except those with recorded
        streams, which get a fence on those streams; then return completed ones."""
        entries, uses, deallocate = self.entries, self.stream_uses, self._deallocate
        done, freed = 0, 0
        parked: list = []
        while entries:  # only this thread pops: a non-empty deque stays so
            entry = entries.popleft()
            if uses and entry[0] in uses:
                parked.append(entry)
                continue
            deallocate(entry[0])  # inline, not _return: once per allocation
            done += 1
            freed += entry[1] + 511 & ~511
        self.live_bytes -= freed
        if parked:
            self._parked.append((self._stream_tokens(parked), parked))
        if self._parked:
            done += self._release_parked(block=False)
        return done

    def reclaim(self) -> int:
        """Fence the unfenced blocks, then return those whose fences completed
        (never blocks). Returns the blocks returned to the pool."""
        if not self.gated:
            return self.drain()
        self._reclaims += 1
        self._fence()
        return self._release_completed()

    def wait_all(self) -> int:
        """Fence everything pending, wait for it and return it all to the pool."""
        if not self.gated:
            self.drain()
            return self._release_parked(block=True)
        self._fence()
        done = 0
        while self._batches:
            done += self.wait_oldest()
        return done

    def fenced_bytes(self) -> int:
        """Bytes (as asked) of the fenced blocks not yet returned (walks them)."""
        return sum(map(itemgetter(1), self._entries_from(0, self._fenced)))

    def wait_oldest(self) -> int:
        """Wait for the oldest fence and return its blocks (0 if none is pending)."""
        if not self._batches:
            return 0
        self._completed(self._batches[0][0], block=True)
        return self._release_batch()

    def clear(self, wait: bool) -> None:
        """Forget every pending block (the allocator is going away); with
        ``wait``, first wait for their fences so no device work still uses them."""
        for tokens, _blocks in (*self._batches, *self._parked):
            if wait:
                self._completed(tokens, block=True)
            for token in tokens:
                if token is not None:
                    self._fences.recycle(token)
        self._batches.clear()
        self._parked.clear()
        self.entries.clear()
        self.stream_uses.clear()
        self._fenced = 0
        self.reclaim_at = MAX_UNFENCED
        self.live_bytes = 0

    # ------------------------------------------------------------------ internals
    def _fence(self) -> None:
        new = len(self.entries) - self._fenced
        if new <= 0:
            return
        tokens = [self._record(LEGACY_STREAM)]
        if self.stream_uses:
            tokens += self._stream_tokens(self._entries_from(self._fenced, new))
        self._fenced += new
        self.reclaim_at = self._fenced + MAX_UNFENCED
        self._batches.append((tokens, new))
        if self._fenced > self._peak_pending:
            self._peak_pending = self._fenced

    def _entries_from(self, start: int, count: int) -> list:
        """``entries[start:start + count]``. Copying in C runs no Python code, so no
        finalizer can append meanwhile; should one (another interpreter thread
        switch) mutate the deque, the copy is simply made again."""
        while True:
            try:
                return list(islice(self.entries, start, start + count))
            except RuntimeError:
                continue

    def _stream_tokens(self, batch: list) -> list:
        """Events on the recorded streams of ``batch``'s blocks (one per stream)."""
        streams: dict[int, Any] = {}
        for address, _nbytes in batch:
            streams.update(self.stream_uses.pop(address, ()))
        return [self._record(handle) for handle in streams]

    def _completed(self, tokens: list, block: bool) -> bool:
        """Whether every token of a fence has completed, waiting for each with
        ``block``; completed ones are recycled and set to None (not asked again)."""
        for i, token in enumerate(tokens):
            if token is None:
                continue
            if block:
                self._waits += 1
                self._fences.wait(token)
            else:
                self._queries += 1
                if not self._fences.query(token):
                    return False
            self._fences.recycle(token)
            tokens[i] = None
        return True

    def _return(self, blocks: Iterable[tuple[int, int]]) -> None:
        """Give ``(address, nbytes)`` blocks back to the allocator (blocks that
        waited for recorded streams in off mode)."""
        deallocate, freed = self._deallocate, 0
        for address, nbytes in blocks:
            deallocate(address)
            freed += nbytes + 511 & ~511
        self.live_bytes -= freed

    def _release_completed(self) -> int:
        done = 0
        while self._batches and self._completed(self._batches[0][0], block=False):
            done += self._release_batch()
        return done

    def _release_batch(self) -> int:
        """Return the oldest fence's blocks (its tokens completed)."""
        _tokens, count = self._batches.popleft()
        # _return's loop, inline: this one runs for every block in events mode,
        # and a generator feeding _return costs a tenth of an allocation per block.
        entries, deallocate, freed = self.entries, self._deallocate, 0
        for _ in range(count):
            address, nbytes = entries.popleft()
            deallocate(address)
            freed += nbytes + 511 & ~511
        self.live_bytes -= freed
        self._fenced -= count
        self.reclaim_at = self._fenced + MAX_UNFENCED
        return count

    def _release_parked(self, block: bool) -> int:
        done = 0
        while self._parked and self._completed(self._parked[0][0], block):
            _tokens, blocks = self._parked.popleft()
            self._return(blocks)
            done += len(blocks)
        return done

    def _record(self, stream: int) -> Any:
        self._records += 1
        return self._fences.record(stream)


# ---------------------------------------------------------------------------- CUDA events
def _entry_points(drvmod: Any) -> tuple[Callable[[int, int], int], Callable[[int], int]]:
    """``cuEventRecord`` and ``cuEventQuery`` as functions of ints returning the
    ``CUresult`` as an int.

    Through ctypes on the loaded driver when it can be found by its soname (a
    call costs about two thirds of one through cuda-bindings, a quarter of
    one through Numba's ``driver`` object), else through Numba's ``driver``.
    """
    try:
        lib = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        record, query = lib.cuEventRecord, lib.cuEventQuery
    except (OSError, AttributeError):
        record = query = None
    if record is not None:
        record.argtypes, record.restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
        query.argtypes, query.restype = [ctypes.c_void_p], ctypes.c_int
        return record, query

    def code_of(call: Callable[[], Any]) -> int:
        try:
            call()
        except drvmod.CudaAPIError as e:
            return int(e.code)
        return _CUDA_SUCCESS

    def record_via_numba(event: int, stream: int) -> int:
        return code_of(lambda: drvmod.driver.cuEventRecord(event, stream))

    def query_via_numba(event: int) -> int:
        return code_of(lambda: drvmod.driver.cuEventQuery(event))

    return record_via_numba, query_via_numba


class CudaEventFences:
    """Fences from CUDA events of one context (``FenceSource``).

    Events are created without timing (cheaper to record) and reused; a
    token is an event handle (an int).

    Parameters
    ----------
    context : numba.cuda.cudadrv.driver.Context
        The context whose streams the events are recorded on.
    """

    def __init__(self, context: Any) -> None:
        from ..backends import cuda as cuda_backends

        drvmod, _binding = cuda_backends.cuda_driver()
        self._drvmod = drvmod
        self._ctx_handle = context.handle
        self._context_pushed = cuda_backends.context_pushed
        self._free: list[int] = []
        self._created = 0
        self._record_fn, self._query_fn = _entry_points(drvmod)

    def _current(self) -> contextlib.AbstractContextManager:
        # Numba's device reset pops every context before the manager's reset().
        return self._context_pushed(self._drvmod.driver, self._ctx_handle)

    def _fail(self, what: str, code: int) -> Exception:
        return self._drvmod.CudaAPIError(code, f"{what} failed with CUresult {code}")

    def record(self, stream: int) -> int:
        if self._free:
            event = self._free.pop()
        else:
            with self._current():
                event = int(self._drvmod.driver.cuEventCreate(_DISABLE_TIMING))
            self._created += 1
        code = self._record_fn(event, stream)
        if code != _CUDA_SUCCESS:
            # No current context, or another one (the legacy stream is the
            # current context's): record with this context pushed.
            with self._current():
                code = self._record_fn(event, stream)
        if code != _CUDA_SUCCESS:
            self._free.append(event)
            raise self._fail(f"cuEventRecord on stream {stream:#x}", code)
        return event

    def query(self, token: int) -> bool:
        code = self._query_fn(token)
        if code == _CUDA_SUCCESS:
            return True
        if code == _CUDA_ERROR_NOT_READY:
            return False
        raise self._fail("cuEventQuery", code)

    def wait(self, token: int) -> None:
        with self._current():
            self._drvmod.driver.cuEventSynchronize(token)

    def recycle(self, token: int) -> None:
        self._free.append(token)

    def is_blocking(self, stream: int) -> bool:
        if stream in (DEFAULT_STREAM, LEGACY_STREAM, PER_THREAD_STREAM):
            return True
        with self._current():
            flags = int(self._drvmod.driver.cuStreamGetFlags(stream))
        return not flags & _NON_BLOCKING

    @property
    def events_created(self) -> int:
        """Events created so far (each one is reused)."""
        return self._created

    def close(self) -> None:
        """Destroy the idle events."""
        events, self._free = self._free, []
        if not events:
            return
        with self._current():
            for event in events:
                self._drvmod.driver.cuEventDestroy(event)
