"""Branch and bound over canonical placements: does a plan fit in ``capacity``?

The time axis is cut into sections at every lifetime boundary; a buffer
covers the sections ``[a, b)``. Any plan can be compacted by letting every
buffer drop until it rests on the floor or on a buffer it overlaps in time.
A partial plan keeps a floor per section (the top of what is placed there,
or a level raised over space left empty) and each unplaced buffer's resting
offset (the highest floor under its lifetime; floors only rise). Every step
takes the lowest floor ``m`` (leftmost on ties) and either

* places an unplaced buffer covering that section whose resting offset is
  ``m`` (tried in rank order), or
* decides that nothing rests at ``m`` there, and raises the section's floor
  to the lowest level any buffer covering it could still rest at: its
  resting offset if above ``m``, else ``m`` plus the smallest buffer it
  overlaps in time (something must be placed under it first).

That walk reaches every compacted plan, so an exhausted search proves that no
plan fits. Branches are cut when a section's floor plus the unplaced bytes
that must still go above it exceed the capacity; buffers with equal size and
lifetime are placed in index order. The search is an explicit stack of arrays
(no Python objects per node) with a node budget, so a caller can bound its
time.
"""

from __future__ import annotations

import numpy as np
from numba import njit

FOUND = 1
INFEASIBLE = 0
BUDGET = -1  # the node budget (or the stack) ran out first


@njit(cache=True)
def sections(firsts, lasts):
    """Section boundaries and each buffer's ``[a, b)`` section span."""
    n = firsts.shape[0]
    edges = np.empty(2 * n, dtype=np.int64)
    edges[:n] = firsts
    edges[n:] = lasts + 1
    bounds = np.unique(edges)
    a = np.searchsorted(bounds, firsts)
    b = np.searchsorted(bounds, lasts + 1)
    return bounds, a, b


@njit(cache=True)
def _overlap_pass(a, b, order, fill, idx, record):
    """Visit every pair of buffers that overlap in time: count them into
    ``fill[i + 1]``, or (``record``) write them at ``fill[i]`` into ``idx``."""
    n = a.shape[0]
    for x in range(n):
        i = order[x]
        for y in range(x + 1, n):
            j = order[y]
            if a[j] >= b[i]:
                break
            if record:
                idx[fill[i]] = j
                fill[i] += 1
                idx[fill[j]] = i
                fill[j] += 1
            else:
                fill[i + 1] += 1
                fill[j + 1] += 1


@njit(cache=True)
def _overlaps(a, b):
    """CSR lists of the buffers each buffer overlaps in time (itself excluded)."""
    n = a.shape[0]
    order = np.argsort(a, kind="mergesort")
    count = np.zeros(n + 1, dtype=np.int64)
    _overlap_pass(a, b, order, count, count, False)
    ptr = np.cumsum(count)
    fill = ptr[:-1].copy()
    idx = np.empty(ptr[-1], dtype=np.int64)
    _overlap_pass(a, b, order, fill, idx, True)
    return ptr, idx


@njit(cache=True)
def _cover_lists(order, a, b, num_sections):
    """For every section, the buffers covering it, in ``order``."""
    count = np.zeros(num_sections + 1, dtype=np.int64)
    for i in range(a.shape[0]):
        for s in range(a[i], b[i]):
            count[s + 1] += 1
    ptr = np.cumsum(count)
    fill = ptr[:-1].copy()
    idx = np.empty(ptr[-1], dtype=np.int64)
    for i in order:
        for s in range(a[i], b[i]):
            idx[fill[s]] = i
            fill[s] += 1
    return ptr, idx


@njit(cache=True)
def _lowest_section(floor, remaining):
    """The leftmost section with the lowest floor among those still to fill; -1 if none."""
    best = -1
    for s in range(floor.shape[0]):
        if remaining[s] > 0 and (best < 0 or floor[s] < floor[best]):
            best = s
    return best


@njit(cache=True)
def _max_floor(floor, lo, hi):
    top = floor[lo]
    for t in range(lo + 1, hi):
        top = max(top, floor[t])
    return top


@njit(cache=True)
def fits(sizes, a, b, num_sections, order, twin, capacity, max_nodes, offsets,
         max_discrepancies=-1):
    """Search for a plan of arena size at most ``capacity``.

    ``order`` ranks buffers for branching (tried first when earlier);
    ``twin[i]`` is the previous buffer with the same size and span (-1 if
    none), which must be placed before ``i``. With ``max_discrepancies >= 0``
    only paths that leave the first choice at most that many times are walked
    (limited discrepancy search: no proof, but early mistakes get undone
    first); -1 walks everything. Sizes must be positive (leave zero-size
    buffers out: they need no place). On ``FOUND`` the plan is in ``offsets``.
    Returns ``(status, nodes)``; ``INFEASIBLE`` is a proof only with -1.
    """
    n = sizes.shape[0]
    inf = np.int64(1) << 62
    floor = np.zeros(num_sections, dtype=np.int64)
    remaining = np.zeros(num_sections, dtype=np.int64)
    for i in range(n):
        if sizes[i] > capacity:
            return INFEASIBLE, 0
        for s in range(a[i], b[i]):
            remaining[s] += sizes[i]
    for s in range(num_sections):
        if remaining[s] > capacity:
            return INFEASIBLE, 0
    # The smallest buffer each one overlaps in time: what could first go under it.
    optr, oidx = _overlaps(a, b)
    under = np.full(n, inf, dtype=np.int64)
    for i in range(n):
        for x in range(optr[i], optr[i + 1]):
            under[i] = min(under[i], sizes[oidx[x]])
    placed = np.zeros(n, dtype=np.bool_)
    ptr, cover = _cover_lists(order, a, b, num_sections)
    # A path places n buffers and raises each section at most once per level.
    depth_cap = min(n + num_sections * (n + 1), n + (1 << 20)) + 64
    f_sec = np.empty(depth_cap, dtype=np.int64)  # frame: its section
    f_level = np.empty(depth_cap, dtype=np.int64)  # its floor level
    f_cursor = np.empty(depth_cap, dtype=np.int64)  # next cover entry to try
    f_choice = np.empty(depth_cap, dtype=np.int64)  # applied: buffer, -2 raise, -1 none
    f_undo = np.empty(depth_cap, dtype=np.int64)  # start of its saved floors
    f_disc = np.empty(depth_cap, dtype=np.int64)  # discrepancies on the path to it
    f_tried = np.empty(depth_cap, dtype=np.int64)  # branches it has applied so far
    limited = max_discrepancies >= 0
    undo = np.empty(depth_cap + int((b - a).sum()) + 64, dtype=np.int64)
    undo_top = 0
    nodes = 0
    s0 = _lowest_section(floor, remaining)
    if s0 < 0:
        return FOUND, 0
    top = 0
    f_sec[0] = s0
    f_level[0] = floor[s0]
    f_cursor[0] = ptr[s0]
    f_choice[0] = -1
    f_undo[0] = 0
    f_disc[0] = 0
    f_tried[0] = 0
    while top >= 0:
        s = f_sec[top]
        m = f_level[top]
        # Take back the branch this frame applied last.
        c = f_choice[top]
        if c >= 0:
            placed[c] = False
            k = f_undo[top]
            for t in range(a[c], b[c]):
                floor[t] = undo[k]
                remaining[t] += sizes[c]
                k += 1
            undo_top = f_undo[top]
        elif c == -2:
            floor[s] = undo[f_undo[top]]
            undo_top = f_undo[top]
        f_choice[top] = -1
        if nodes >= max_nodes:
            return BUDGET, nodes
        if limited and f_tried[top] > 0 and f_disc[top] >= max_discrepancies:
            top -= 1  # another branch here would be one discrepancy too many
            continue
        # Next branch: a buffer resting on this floor ...
        applied = False
        pruned = False
        end = ptr[s + 1]
        while f_cursor[top] < end:
            i = cover[f_cursor[top]]
            f_cursor[top] += 1
            if placed[i] or (twin[i] >= 0 and not placed[twin[i]]):
                continue
            if sizes[i] > capacity - m or _max_floor(floor, a[i], b[i]) != m:
                continue
            f_undo[top] = undo_top
            top_i = m + sizes[i]
            for t in range(a[i], b[i]):
                undo[undo_top] = floor[t]
                undo_top += 1
                floor[t] = top_i
                remaining[t] -= sizes[i]
                if top_i + remaining[t] > capacity:
                    pruned = True
            placed[i] = True
            offsets[i] = m
            f_choice[top] = i
            applied = True
            nodes += 1
            break
        if pruned:
            continue  # undone at the top of the next iteration
        # ... or nothing rests at m here: raise the floor to where something could.
        if not applied and f_cursor[top] == end:
            f_cursor[top] = end + 1  # once per frame
            level = inf
            for x in range(ptr[s], end):
                k = cover[x]
                if placed[k]:
                    continue
                r = _max_floor(floor, a[k], b[k])
                level = min(level, r if r > m else m + under[k])
            if level < inf and level + remaining[s] <= capacity:
                f_undo[top] = undo_top
                undo[undo_top] = floor[s]
                undo_top += 1
                floor[s] = level
                f_choice[top] = -2
                applied = True
                nodes += 1
        if not applied:
            top -= 1  # every branch tried
            continue
        f_tried[top] += 1
        nxt = _lowest_section(floor, remaining)
        if nxt < 0:
            return FOUND, nodes
        if top + 1 >= depth_cap:
            return BUDGET, nodes
        top += 1
        f_sec[top] = nxt
        f_level[top] = floor[nxt]
        f_cursor[top] = ptr[nxt]
        f_choice[top] = -1
        f_disc[top] = f_disc[top - 1] + (1 if f_tried[top - 1] > 1 else 0)
        f_tried[top] = 0
    return INFEASIBLE, nodes
