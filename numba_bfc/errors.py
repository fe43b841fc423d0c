"""Exceptions raised by numba_bfc: allocators, and readers of input files."""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["FailureRecord", "InputError", "InvalidPointerError", "OutOfMemoryError"]


class FailureRecord:
    """What an allocator keeps of a failed allocation for its
    ``OutOfMemoryError`` (``OutOfMemoryError.deferred``), which calls each
    method at most once, when first asked: the counters are taken at the
    failure, the rest is built from them later.
    """

    __slots__ = ()

    def message(self, error: OutOfMemoryError) -> str:
        """The error's message (``error`` holds the request and the reason)."""
        raise NotImplementedError

    def stats(self) -> Any:
        """The allocator's stats at the failure (an ``AllocatorStats``), or None."""
        return None

    def report(self) -> tuple[list[dict], str, bool]:
        """``(bin_summary, occupancy, stale)``: see the error's attributes."""
        return [], "", False


class OutOfMemoryError(MemoryError):
    """An allocation could not be served.

    Carries what a user needs to tell fragmentation from real exhaustion: the
    request, its rounded size, the allocator's stats at the time, the per-bin
    summary and the occupancy map.

    The message, ``stats`` and ``reason`` are fixed when the error is raised
    (the message is formatted when first shown, ``stats`` built on first read
    from counters taken at the failure).
    The bin summary and the occupancy map cost far more than the failed
    allocation itself (a pass over every chunk), so allocators build them on
    first read of either attribute, from the allocator as it is then. That is
    the allocator at the failure unless it changed in between, which
    ``report_stale`` says (read the report right away, in the ``except``
    block, to get it exact).

    Attributes
    ----------
    allocator_name : str
    num_bytes : int
        The size asked for.
    rounded_bytes : int
        The size after the policy's rounding (0 if the request was rejected
        before rounding, e.g. above the memory limit).
    alignment : int
    stats : AllocatorStats or None
    bin_summary : list of dict
        One entry per bin (see ``BFCAllocator.memory_map``).
    occupancy : str
        ``render_occupancy()`` at the time of the failure.
    report_stale : bool
        True if the allocator had changed (or was gone) when ``bin_summary``
        or ``occupancy`` was first read: both then describe it at that read,
        not at the failure.
    reason : str
        Short reason: ``"limit"`` (larger than the memory limit),
        ``"fragmentation"`` (enough free bytes in the pool, none contiguous),
        ``"exhausted"`` (not enough free bytes at all) or ``"backend"``.
    """

    # Slots, not the instance dict: a failed allocation that is caught and
    # retried pays for its error, and slot stores cost a third of dict ones.
    __slots__ = ("_message", "allocator_name", "num_bytes", "rounded_bytes", "alignment",
                 "_stats", "reason", "_bin_summary", "_occupancy", "_report_stale", "_report")

    def __init__(
        self,
        message: str | Callable[[], str],
        *,
        allocator_name: str = "",
        num_bytes: int = 0,
        rounded_bytes: int = 0,
        alignment: int = 0,
        stats: Any = None,  # AllocatorStats, or a callable building it (once)
        bin_summary: list[dict] | None = None,
        occupancy: str = "",
        reason: str = "exhausted",
        report: Callable[[], tuple[list[dict], str, bool]] | None = None,
    ) -> None:
        # A callable message is formatted on first use (str, repr, args,
        # pickling): a retry loop that only catches the error never pays for it.
        if callable(message):
            super().__init__()
            self._message = message
        else:
            super().__init__(message)
            self._message = None
        self.allocator_name = allocator_name
        self.num_bytes = num_bytes
        self.rounded_bytes = rounded_bytes
        self.alignment = alignment
        self._stats = stats
        self.reason = reason
        self._bin_summary = bin_summary
        self._occupancy = occupancy
        self._report_stale = False
        self._report = report  # () -> (bin_summary, occupancy, stale), called once

    @classmethod
    def deferred(cls, failure: FailureRecord, allocator_name: str, num_bytes: int,
                 rounded_bytes: int, alignment: int, reason: str) -> OutOfMemoryError:
        """The error as an allocator's failure path makes it: ``failure`` builds
        the message, the stats and the report on first read, and nothing is
        checked; a third of what the keywords cost, which a program that
        catches the error pays on every failure.

        Examples
        --------
        >>> class NoRoom(FailureRecord):
        ...     def message(self, error):
        ...         return f"no room for {error.num_bytes} bytes"
        >>> e = OutOfMemoryError.deferred(NoRoom(), "a", 1000, 1024, 256, "exhausted")
        >>> str(e), e.rounded_bytes, e.stats, e.occupancy
        ('no room for 1000 bytes', 1024, None, '')
        """
        error = cls.__new__(cls)
        error._message = error._stats = error._report = failure
        error.allocator_name = allocator_name
        error.num_bytes = num_bytes
        error.rounded_bytes = rounded_bytes
        error.alignment = alignment
        error.reason = reason
        return error  # _bin_summary, _occupancy and _report_stale: set by _built

    def _formatted(self) -> None:
        if self._message is not None:
            message, self._message = self._message, None
            self.args = (message.message(self) if isinstance(message, FailureRecord)
                         else message(),)

    def __str__(self) -> str:
        self._formatted()
        return super().__str__()

    def __repr__(self) -> str:
        self._formatted()
        return super().__repr__()

    def _built(self) -> None:
        if self._report is not None:
            report, self._report = self._report, None
            self._bin_summary, self._occupancy, self._report_stale = (
                report.report() if isinstance(report, FailureRecord) else report())

    @property
    def stats(self) -> Any:
        if isinstance(self._stats, FailureRecord):
            self._stats = self._stats.stats()
        elif callable(self._stats):
            self._stats = self._stats()
        return self._stats

    @stats.setter
    def stats(self, value: Any) -> None:
        self._stats = value

    @property
    def bin_summary(self) -> list[dict]:
        self._built()
        if self._bin_summary is None:
            self._bin_summary = []
        return self._bin_summary

    @property
    def occupancy(self) -> str:
        self._built()
        return self._occupancy

    @property
    def report_stale(self) -> bool:
        self._built()
        return self._report_stale

    def __reduce__(self):
        # The deferred report refers to the allocator, which does not travel.
        self._formatted()
        self._built()
        state = {name: getattr(self, name) for name in OutOfMemoryError.__slots__
                 if name not in ("_message", "_report")}
        state.update(_stats=self.stats, _message=None, _report=None)  # built: no allocator
        state.update(self.__dict__)
        return _rebuild_error, (type(self), self.args, state)

    def report_keywords(self) -> dict:
        """Keywords for ``OutOfMemoryError(...)`` that hand this error's report,
        built or not, to an error that wraps it."""
        if self._report is not None:
            return {"report": self._report}
        return {"bin_summary": self._bin_summary, "occupancy": self._occupancy}


class InvalidPointerError(ValueError):
    """A pointer given to an allocator is not one of its live allocations.

    Attributes
    ----------
    ptr : int
    kind : str
        ``"double_free"`` (the address starts a chunk that is already free),
        ``"interior"`` (inside a chunk but not at its start) or ``"unknown"``
        (not in any region of this allocator).
    """

    def __init__(self, message: str, *, ptr: int, kind: str) -> None:
        super().__init__(message)
        self.ptr = ptr
        self.kind = kind


class InputError(ValueError):
    """Input that cannot be read or used: a malformed file, row or field.

    Every reader raises it for what it reads (``Trace.read`` and
    ``read_trace``, ``read_rmm_log``, the PyTorch readers, ``read_records``
    and ``parse_records``), and the command line prints it as one ``error:``
    line. Files that cannot be opened raise ``OSError`` as usual.

    The message starts with where the problem is, ``path: line N:`` as far
    as known, then names the field.

    Attributes
    ----------
    path : str or None
        The file, as given.
    line : int or None
        1-based line of a text file.
    field : str or None
        The column or key at fault.
    reason : str
        The message without the location.

    Examples
    --------
    >>> from numba_bfc.planning import parse_records
    >>> try:
    ...     parse_records("size,first,last\\n16,0,x\\n", "plan.csv")
    ... except InputError as e:
    ...     print(e); print(e.path, e.line, e.field)
    plan.csv: line 2: last 'x' is not an integer
    plan.csv 2 last
    """

    def __init__(self, reason: str, *, path: str | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        self.path = path
        self.line = line
        self.field = field
        self.reason = reason
        super().__init__(self._compose())

    def _compose(self) -> str:
        where = [str(self.path)] if self.path is not None else []
        if self.line is not None:
            where.append(f"line {self.line}")
        return ": ".join([*where, self.reason])

    def replace(self, **attributes: Any) -> InputError:
        """A copy of this error with ``attributes`` changed and the message
        rebuilt (e.g. ``path=``, when a reader knows the file and the parser
        that raised did not)."""
        error = copy.copy(self)
        unknown = set(attributes) - set(vars(error))
        if unknown:
            raise TypeError(f"{type(self).__name__} has no attribute {', '.join(sorted(unknown))}")
        vars(error).update(attributes)
        error.args = (error._compose(),)
        return error

    def located(self, path: str, line: int | None = None) -> InputError:
        """This error at ``path`` (and ``line``, if given)."""
        return self.replace(path=path) if line is None else self.replace(path=path, line=line)

    def __reduce__(self):
        # Subclasses take other keywords: rebuild from the message and attributes.
        return _rebuild_error, (type(self), self.args, self.__dict__)


@contextlib.contextmanager
def reading_file(path: str | os.PathLike) -> Iterator[None]:
    """Inside the block, errors of reading ``path`` become ``InputError`` at
    ``path``: a parser's own ``InputError`` gets the file, and so do the
    decoding errors the standard library raises for a file that is not UTF-8
    or for corrupt or truncated gzip data. ``OSError``
    (no such file, ...) passes as it is."""
    import gzip  # here: only readers need them, not every import of numba_bfc
    import zlib

    where = os.fspath(path)
    try:
        yield
    except InputError as e:
        if e.path is not None:
            raise
        raise e.located(where) from None
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r})",
                         path=where) from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise InputError(f"corrupt or truncated gzip data ({e})", path=where) from None


def _rebuild_error(cls: type, args: tuple, state: dict) -> BaseException:
    error = cls.__new__(cls)
    error.args = args
    for name, value in state.items():
        setattr(error, name, value)
    return error
