"""Hard planning instances with a known optimum, for testing and benchmarking search.

A full ``capacity x horizon`` rectangle (bytes x tasks) is cut into buffers;
they tile it, so the most bytes live at any task is ``capacity`` at every task
and the cut itself is a plan of exactly that size: the optimum is known by
construction, and greedy placements are typically far from it (the
benchmark family of MiniMalloc and TelaMalloc).
"""

from __future__ import annotations

import numpy as np

from .records import make_records

__all__ = ["GADGET", "cut_instance", "gadget_instance"]


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
