"""Sorted, disjoint address ranges kept as two lists: cutting a span out.

What a backend has mapped and the pieces an allocator holds from it are both
maps ``start -> range`` (``SortedDict``), and both lose spans from the middle
when memory goes back page by page. ``cut_span`` does that on plain lists
(``bisect`` and slices, a fraction of a microsecond each); ``span_keys`` gives
the keys of a map that a span may meet, to take them out as lists and put the
result back.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence
from typing import Any

from sortedcontainers import SortedDict

__all__ = ["cut_span", "play_log", "play_log_on_ends", "play_log_on_map", "span_keys"]


def span_keys(ranges: SortedDict, lo: int, hi: int) -> list[int]:
    """The keys of ``ranges`` (range starts, in order) whose ranges may meet
    ``[lo, hi)``: the last one starting at or below ``lo``, if any, and every
    one starting below ``hi``."""
    first = max(ranges.bisect_right(lo) - 1, 0)
    return list(itertools.takewhile(lambda start: start < hi, ranges.islice(first)))


def cut_span(starts: list[int], ends: list[int], lo: int, hi: int) -> bool:
    """Remove ``[lo, hi)`` from the sorted, disjoint ranges
    ``[starts[k], ends[k])``, in place: the ranges it meets go, but for their
    parts outside it.

    Returns False, changing nothing, if ``[lo, hi)`` is not covered without a
    gap.

    Examples
    --------
    >>> starts, ends = [0, 10, 30], [10, 20, 40]
    >>> cut_span(starts, ends, 5, 15), starts, ends
    (True, [0, 15, 30], [5, 20, 40])
    >>> cut_span(starts, ends, 18, 32), starts, ends
    (False, [0, 15, 30], [5, 20, 40])
    """
    first = bisect.bisect_right(starts, lo) - 1
    if first < 0:
        return False
    stop, pos = first, lo
    while stop < len(starts) and starts[stop] <= pos < hi:
        pos = max(pos, ends[stop])
        stop += 1
    if pos < hi:
        return False
    kept_starts, kept_ends = [], []
    if starts[first] < lo:
        kept_starts.append(starts[first])
        kept_ends.append(lo)
    if ends[stop - 1] > hi:
        kept_starts.append(hi)
        kept_ends.append(ends[stop - 1])
    starts[first:stop] = kept_starts
    ends[first:stop] = kept_ends
    return True


def play_log(starts: list[int], ends: list[int], bases, sizes) -> int:
    """Play a log of ranges placed (``size > 0``: ``[base, base + size)``,
    where nothing is) and spans given back (``size < 0``: ``cut_span`` of
    ``[base, base - size)``) on the lists, in order.

    Returns the index of the first entry that cannot be played (a range
    placed over another, a span given back that is not covered; the entries
    before it are played), or -1 when all are.

    Examples
    --------
    >>> starts, ends = [0], [10]
    >>> play_log(starts, ends, [10, 4], [6, -8]), starts, ends
    (-1, [0, 12], [4, 16])
    """
    for k, (base, size) in enumerate(zip(bases, sizes)):
        if size > 0:
            at = bisect.bisect_left(starts, base)
            if (at > 0 and ends[at - 1] > base) or (at < len(starts)
                                                    and starts[at] < base + size):
                return k
            starts.insert(at, base)
            ends.insert(at, base + size)
        elif not cut_span(starts, ends, base, base - size):
            return k
    return -1


def play_log_on_map(ranges: SortedDict, bases: Sequence[int], sizes: Sequence[int],
                    end_of: Callable[[int, Any], int],
                    value_of: Callable[[int, int, Any], Any]) -> int:
    """``play_log`` on a map ``start -> value`` of sorted, disjoint ranges:
    the ranges the log may meet are taken out as lists and put back played.
    ``end_of(start, value)`` gives a range's end, ``value_of(start, end,
    old)`` the value of a range after (``old``: the map's value at that start
    before, None for a new start).

    Returns -1, or the index of the first entry that cannot be played,
    leaving the map unchanged.

    Examples
    --------
    >>> m = SortedDict({0: 10, 20: 30})
    >>> play_log_on_map(m, [2, 10], [-4, 5], lambda s, e: e, lambda s, e, old: e), dict(m)
    (-1, {0: 2, 6: 10, 10: 15, 20: 30})
    """
    met = span_keys(ranges, min(bases), max(b + abs(n) for b, n in zip(bases, sizes)))
    old = {start: ranges[start] for start in met}
    starts, ends = list(met), [end_of(start, old[start]) for start in met]
    bad = play_log(starts, ends, bases, sizes)
    if bad >= 0:
        return bad
    for start in met:
        del ranges[start]
    for start, end in zip(starts, ends):
        ranges[start] = value_of(start, end, old.get(start))
    return -1


def play_log_on_ends(ranges: SortedDict, bases: Sequence[int], sizes: Sequence[int]) -> int:
    """``play_log_on_map`` on a map ``start -> end``."""
    return play_log_on_map(ranges, bases, sizes, _value_is_end, _end_is_value)


def _value_is_end(start: int, end: int) -> int:
    return end


def _end_is_value(start: int, end: int, old: int | None) -> int:
    return end
