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

__all__ = ["cut_instance"]


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
