"""Hard planning instances, for testing and benchmarking search.

``cut_instance`` and ``gadget_instance`` have a known optimum: a full
``capacity x horizon`` rectangle (bytes x tasks) is cut into buffers; they
tile it, so the most bytes live at any task is ``capacity`` at every task and
the cut itself is a plan of exactly that size, while greedy placements are
typically far from it (the benchmark family of MiniMalloc and TelaMalloc).
``sliced_instance`` (a few long live ranges cut into slices, as compilers
split large tensors) has none: its plans are compared with the max-live bound.
``packed_instance`` (random buffers packed tight into a box) has a known plan
within the box, but not a known optimum.
"""

from __future__ import annotations

import numpy as np

from .records import make_records

__all__ = ["GADGET", "cut_instance", "gadget_instance", "packed_instance", "sliced_instance"]


def cut_instance(num_buffers: int, capacity: int = 1 << 20, horizon: int = 1000,
                 time_cuts: float = 0.5, seed: int = 0):
    """Cut a ``capacity x horizon`` rectangle into ``num_buffers`` buffers.

    Repeatedly a random piece (chosen by area) is cut in two, across time with
    probability ``time_cuts``, else across bytes, at a random point (a
    guillotine cut).

    Parameters
    ----------
    num_buffers : int
    capacity : int
        The arena size of the known optimal plan (bytes).
    horizon : int
        Tasks (time steps) the rectangle spans.
    time_cuts : float
        Probability of cutting across time: higher gives short-lived buffers,
        lower long-lived thin ones.
    seed : int

    Returns
    -------
    (records, offsets)
        Usage records in shuffled order and the offsets of the cut, a plan of
        arena size ``capacity`` (optimal: every task has ``capacity`` bytes live).
    """
    if num_buffers < 1 or num_buffers > capacity * horizon:
        raise ValueError(f"num_buffers must be in [1, capacity * horizon], got {num_buffers}")
    if not 0.0 <= time_cuts <= 1.0:
        raise ValueError(f"time_cuts must be in [0, 1], got {time_cuts}")
    rng = np.random.default_rng(seed)
    pieces = [(0, horizon, 0, capacity)]  # [t0, t1) x [y0, y1)
    while len(pieces) < num_buffers:
        area = np.array([(t1 - t0) * (y1 - y0) for t0, t1, y0, y1 in pieces], float)
        k = int(rng.choice(len(pieces), p=area / area.sum()))
        t0, t1, y0, y1 = pieces[k]
        across_time = rng.random() < time_cuts
        if (across_time and t1 - t0 < 2) or (not across_time and y1 - y0 < 2):
            across_time = not across_time
        if across_time and t1 - t0 >= 2:
            cut = int(rng.integers(t0 + 1, t1))
            pieces[k:k + 1] = [(t0, cut, y0, y1), (cut, t1, y0, y1)]
        elif y1 - y0 >= 2:
            cut = int(rng.integers(y0 + 1, y1))
            pieces[k:k + 1] = [(t0, t1, y0, cut), (t0, t1, cut, y1)]
    pieces = [pieces[i] for i in rng.permutation(len(pieces))]
    sizes = [y1 - y0 for _, _, y0, y1 in pieces]
    records = make_records(sizes, [t0 for t0, _, _, _ in pieces],
                           [t1 - 1 for _, t1, _, _ in pieces])
    return records, np.array([y0 for _, _, y0, _ in pieces], dtype=np.int64)


# Seven buffers (size, first, last) whose most bytes live at one task is 5 but that
# need 6 (no placement fits in 5: checked by brute force in the tests).
GADGET = ((3, 5, 7), (2, 6, 8), (1, 2, 4), (1, 4, 5), (2, 1, 1), (3, 0, 3), (1, 2, 5))
_GADGET_SPAN = 9  # tasks 0..8
_GADGET_PLAN = (0, 3, 3, 4, 3, 0, 5)  # its offsets in a plan of 6


def gadget_instance(num_buffers: int, capacity: int = 1 << 20, horizon: int = 1000,
                    gadgets: int = 4, scale: int = 1 << 14, time_cuts: float = 0.5,
                    seed: int = 0):
    """A cut instance with ``gadgets`` copies of ``GADGET`` on top: the optimum
    (``capacity + 6 * scale``) is above max-live (``capacity + 5 * scale``).

    A ``capacity x horizon`` rectangle is cut into ``num_buffers`` buffers
    (``cut_instance``); at ``gadgets`` distinct tasks, time is stretched to 9
    tasks, over which every buffer live there stays live, and a copy of
    ``GADGET`` scaled by ``scale`` is added. A plan of ``capacity + 6 * scale``
    bytes: the cut, each gadget on top of it. No plan is smaller: the buffers
    live in a gadget's 9 tasks are the gadget plus buffers live in all 9, which
    overlap everything there and so take ``capacity`` bytes on their own; the
    scaled gadget needs ``6 * scale`` (its compacted plans top out at sums of
    its sizes, multiples of ``scale``, and ``5 * scale`` is too little).

    Returns
    -------
    (records, offsets)
        Shuffled usage records and the plan described above.
    """
    if not 0 <= gadgets <= horizon:
        raise ValueError(f"gadgets must be in [0, horizon], got {gadgets}")
    if scale < 1:
        raise ValueError(f"scale must be >= 1, got {scale}")
    recs, offsets = cut_instance(num_buffers, capacity, horizon, time_cuts, seed)
    rng = np.random.default_rng([seed, 1])
    at = np.sort(rng.choice(horizon, size=gadgets, replace=False))
    # Task t becomes tasks [start[t], start[t + 1]): 9 of them at a gadget, else 1.
    length = np.ones(horizon, dtype=np.int64)
    length[at] = _GADGET_SPAN
    start = np.concatenate(([0], np.cumsum(length)))
    sizes = [int(x) for x in recs["size"]]
    firsts = [int(start[f]) for f in recs["first"]]
    lasts = [int(start[la + 1] - 1) for la in recs["last"]]
    offs = [int(o) for o in offsets]
    for t in at:
        for size, first, last in GADGET:
            sizes.append(size * scale)
            firsts.append(int(start[t]) + first)
            lasts.append(int(start[t]) + last)
        offs.extend(capacity + o * scale for o in _GADGET_PLAN)
    perm = rng.permutation(len(sizes))
    records = make_records([sizes[i] for i in perm], [firsts[i] for i in perm],
                           [lasts[i] for i in perm])
    return records, np.array([offs[i] for i in perm], dtype=np.int64)


def sliced_instance(ranges: int, slices: int, horizon: int = 1000, unit: int = 1024,
                    max_units: int = 64, seed: int = 0):
    """``ranges`` long live ranges, each cut into ``slices`` buffers along time.

    Each range spans a random part (a quarter to all) of ``horizon`` tasks and
    is cut at random tasks into ``slices`` consecutive buffers, one after the
    other, each of a random size of 1 to ``max_units`` units of ``unit``
    bytes: the buffers of a tensor that a compiler splits into slices, which
    stack on each other in ways greedy placement gets wrong.

    Returns
    -------
    numpy.ndarray
        Shuffled usage records (``ranges * slices`` of them, fewer where a range
        is shorter than ``slices`` tasks).

    Examples
    --------
    >>> recs = sliced_instance(4, 5, seed=1)
    >>> len(recs), bool((recs["size"] % 1024 == 0).all())
    (20, True)
    """
    if ranges < 1 or slices < 1 or horizon < 1 or unit < 1 or max_units < 1:
        raise ValueError("ranges, slices, horizon, unit and max_units must be >= 1")
    rng = np.random.default_rng(seed)
    sizes, firsts, lasts = [], [], []
    for _ in range(ranges):
        length = int(rng.integers(max(1, horizon // 4), horizon + 1))
        start = int(rng.integers(0, horizon - length + 1))
        k = min(slices, length)
        cuts = np.sort(rng.choice(np.arange(start + 1, start + length), size=k - 1,
                                  replace=False)) if k > 1 else np.zeros(0, np.int64)
        bounds = [start, *cuts.tolist(), start + length]
        for t0, t1 in zip(bounds, bounds[1:]):
            sizes.append(int(rng.integers(1, max_units + 1)) * unit)
            firsts.append(t0)
            lasts.append(t1 - 1)
    perm = rng.permutation(len(sizes))
    return make_records([sizes[i] for i in perm], [firsts[i] for i in perm],
                        [lasts[i] for i in perm])


def packed_instance(num_buffers: int, capacity: int = 64, horizon: int = 200,
                    max_units: int = 16, max_span: int = 50, unit: int = 1024,
                    seed: int = 0):
    """Random buffers packed into a ``capacity x horizon`` box (in units of
    ``unit`` bytes x tasks): a random instance at high occupancy.

    Each buffer gets a random lifetime (1 to ``max_span`` tasks) and size (1 to
    ``max_units`` units) and goes at the lowest offset where it fits in the box
    (first fit); one that fits nowhere is drawn again, at most
    ``20 * num_buffers`` draws in all. The packing is a plan within
    ``capacity * unit`` bytes; the max-live bound is at most that, often a
    little below, and greedy plans of the shuffled buffers are well above.

    Returns
    -------
    tuple
        ``(records, offsets)``: shuffled usage records (``num_buffers`` of
        them, fewer when the box filled up first) and the packing's offsets.

    Examples
    --------
    >>> recs, offsets = packed_instance(40, seed=3)
    >>> len(recs), int((offsets + recs["size"]).max()) <= 64 * 1024
    (40, True)
    """
    if min(num_buffers, capacity, horizon, max_units, max_span, unit) < 1:
        raise ValueError("num_buffers, capacity, horizon, max_units, max_span and unit "
                         "must be >= 1")
    rng = np.random.default_rng(seed)
    sizes, firsts, lasts, offsets = [], [], [], []
    for _ in range(20 * num_buffers):
        if len(sizes) == num_buffers:
            break
        span = int(rng.integers(1, min(max_span, horizon) + 1))
        first = int(rng.integers(0, horizon - span + 1))
        last = first + span - 1
        size = int(rng.integers(1, min(max_units, capacity) + 1))
        beside = [(offsets[j], sizes[j]) for j in range(len(sizes))
                  if firsts[j] <= last and first <= lasts[j]]
        for offset in sorted({0, *(o + s for o, s in beside)}):
            if offset + size <= capacity and all(
                    offset + size <= o or o + s <= offset for o, s in beside):
                sizes.append(size)
                firsts.append(first)
                lasts.append(last)
                offsets.append(offset)
                break
    perm = rng.permutation(len(sizes))
    recs = make_records([sizes[i] * unit for i in perm], [firsts[i] for i in perm],
                        [lasts[i] for i in perm])
    return recs, np.array([offsets[i] * unit for i in perm], dtype=np.int64)
