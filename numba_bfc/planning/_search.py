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

from ..kernels.jit import inner, njit

FOUND = 1
INFEASIBLE = 0
BUDGET = -1  # the node budget (or the stack) ran out first

GAP_DOMINANCE = 1  # ``rules`` bits of ``fits``
MEMO = 2
TIGHT_NEIGHBOURS = 4
ALL_RULES = 7
_MEMO_MAX_BITS = 21  # memo table entries: at most 2**21 (32 MiB)


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
def _rests_at(floor, lo, hi, m):
    """Whether a buffer over sections ``[lo, hi)`` would rest at ``m`` (the lowest
    floor: none of its floors is below it)."""
    for t in range(lo, hi):
        if floor[t] != m:
            return False
    return True


@njit(cache=True)
def _can_rest(floor, placed, a, b, ptr, cover, t):
    """Whether some unplaced buffer covering section ``t`` could still rest at its
    floor (no floor under its lifetime is above it; floors only rise)."""
    level = floor[t]
    for x in range(ptr[t], ptr[t + 1]):
        k = cover[x]
        if placed[k]:
            continue
        ok = True
        for u in range(a[k], b[k]):
            if floor[u] > level:
                ok = False
                break
        if ok:
            return True
    return False


@njit(cache=True)
def _refresh(tree, key, lo, hi):
    """Recompute the argmin tree over ``key`` above leaves ``[lo, hi)`` (leaf ``t`` at
    ``P + t`` names section ``t``; ties go to the lower section). O(hi - lo + log P)."""
    half = key.shape[0]
    left = (lo + half) >> 1
    right = (hi - 1 + half) >> 1
    while right >= 1:
        for x in range(left, right + 1):
            u = tree[2 * x]
            v = tree[2 * x + 1]
            tree[x] = u if key[u] <= key[v] else v
        left >>= 1
        right >>= 1


@njit(cache=True)
def _max_floor(floor, lo, hi):
    top = floor[lo]
    for t in range(lo + 1, hi):
        top = max(top, floor[t])
    return top


@njit(cache=True)
def _mix(x):
    """splitmix64's finaliser: a 64-bit hash of ``x`` (uint64)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True)
def _section_key(t, level, gap, salt):
    """Hash of section ``t`` having floor ``level`` over an empty run from ``gap``."""
    x = _mix(np.uint64(level) + salt)
    return _mix(x ^ (np.uint64(gap) + np.uint64(t) * np.uint64(0x9E3779B97F4A7C15)))


@njit(cache=True)
def _memo_slot(t1, t2, h1, h2):
    """Index of ``(h1, h2)`` in the table (4-way buckets), or -1."""
    base = np.int64(h2 & np.uint64(t1.shape[0] - 1)) & ~np.int64(3)
    for k in range(base, base + 4):
        if t1[k] == h1 and t2[k] == h2:
            return k
    return -1


@njit(cache=True)
def _memo_store(t1, t2, h1, h2):
    base = np.int64(h2 & np.uint64(t1.shape[0] - 1)) & ~np.int64(3)
    for k in range(base, base + 4):
        if t1[k] == 0:
            t1[k] = h1
            t2[k] = h2
            return
    k = base + np.int64((h1 >> np.uint64(7)) & np.uint64(3))  # full: replace one
    t1[k] = h1
    t2[k] = h2


def memo_table(entries):
    """An empty memo for ``fits_memo``: two uint64 arrays of ``entries`` (a power of
    two, >= 4) slots. Made by numpy, so the pages are zeroed only once touched."""
    return np.zeros(entries, dtype=np.uint64), np.zeros(entries, dtype=np.uint64)


@njit(cache=True)
def fits(sizes, a, b, num_sections, order, twin, capacity, max_nodes, offsets,
         max_discrepancies=-1, rules=ALL_RULES):
    """Search for a plan of arena size at most ``capacity``.

    ``order`` ranks buffers for branching (tried first when earlier);
    ``twin[i]`` is the previous buffer with the same size and span (-1 if
    none), which must be placed before ``i``. With ``max_discrepancies >= 0``
    only paths that leave the first choice at most that many times are walked
    (limited discrepancy search: no proof, but early mistakes get undone
    first); -1 walks everything. ``rules`` switches the pruning rules on (bits
    ``GAP_DOMINANCE``, ``MEMO`` and ``TIGHT_NEIGHBOURS``, all by default). Sizes must be
    positive (leave zero-size buffers out: they need no place). On ``FOUND``
    the plan is in ``offsets``. Returns ``(status, nodes)``; ``INFEASIBLE`` is
    a proof only with -1. ``fits_memo`` is the same search with a memo kept
    by the caller.
    """
    entries = 0  # no memo: nothing would be stored
    if (rules & MEMO) != 0 and max_discrepancies < 0:
        entries = 4
        while entries < (1 << _MEMO_MAX_BITS) and entries < 2 * max_nodes:
            entries *= 2
    t1 = np.zeros(entries, dtype=np.uint64)
    t2 = np.zeros(entries, dtype=np.uint64)
    return fits_memo(sizes, a, b, num_sections, order, twin, capacity, max_nodes, offsets,
                     max_discrepancies, rules, t1, t2)


# Salts of the two independent state hashes of the memo.
_SALT1 = np.uint64(0x243F6A8885A308D3)
_SALT2 = np.uint64(0x13198A2E03707344)
_INF = np.int64(1) << 62

# A frame's choice when it applied no branch, or raised its section's floor.
_NONE = -1
_RAISED = -2


@njit(cache=True)
def _section_loads(sizes, a, b, num_sections, capacity):
    """``(fits, remaining)``: the bytes every section must hold, and whether each
    buffer and each section's load fit in ``capacity`` at all."""
    remaining = np.zeros(num_sections, dtype=np.int64)
    for i in range(sizes.shape[0]):
        if sizes[i] > capacity:
            return False, remaining
        for s in range(a[i], b[i]):
            remaining[s] += sizes[i]
    for s in range(num_sections):
        if remaining[s] > capacity:
            return False, remaining
    return True, remaining


@njit(cache=True)
def _smallest_overlapping(sizes, a, b):
    """The smallest buffer each one overlaps in time: what could first go under it."""
    n = sizes.shape[0]
    optr, oidx = _overlaps(a, b)
    under = np.full(n, _INF, dtype=np.int64)
    for i in range(n):
        for x in range(optr[i], optr[i + 1]):
            under[i] = min(under[i], sizes[oidx[x]])
    return under


@njit(cache=True)
def _state_hashes(n, num_sections, use_memo):
    """``(z1, z2, h1, h2)``: each buffer's hash contribution once placed, and the
    hashes of the empty state (every floor and gap 0)."""
    z1 = np.zeros(n if use_memo else 0, dtype=np.uint64)
    z2 = np.zeros(n if use_memo else 0, dtype=np.uint64)
    h1 = np.uint64(0)
    h2 = np.uint64(0)
    if use_memo:
        for i in range(n):
            z1[i] = _mix(np.uint64(i) + _SALT1 + np.uint64(0xA4093822299F31D0))
            z2[i] = _mix(np.uint64(i) + _SALT2 + np.uint64(0x082EFA98EC4E6C89))
        for t in range(num_sections):
            h1 ^= _section_key(t, 0, 0, _SALT1)
            h2 ^= _section_key(t, 0, 0, _SALT2)
    return z1, z2, h1, h2


@inner
def _rehash_section(h1, h2, t, level, gap, new_level, new_gap):
    """The state hashes once section ``t`` goes from ``(level, gap)`` to the new pair."""
    h1 ^= _section_key(t, level, gap, _SALT1) ^ _section_key(t, new_level, new_gap, _SALT1)
    h2 ^= _section_key(t, level, gap, _SALT2) ^ _section_key(t, new_level, new_gap, _SALT2)
    return h1, h2


@inner
def _open_frame(stack, top, section, level, cursor, discrepancies, h1, h2):
    f_section, f_level, f_cursor, f_choice, f_discrepancies, f_tried, f_h1, f_h2 = stack
    f_section[top] = section
    f_level[top] = level
    f_cursor[top] = cursor
    f_choice[top] = _NONE
    f_discrepancies[top] = discrepancies
    f_tried[top] = 0
    f_h1[top] = h1 | np.uint64(1)  # never 0: 0 marks an empty memo slot
    f_h2[top] = h2


@inner
def _take_back(choice, s, mark, undo, placed, floor, gap, remaining, key, tree, sizes, a, b):
    """Undo a frame's branch: buffer ``choice`` placed, or section ``s`` raised."""
    if choice >= 0:
        placed[choice] = False
        k = mark
        for t in range(a[choice], b[choice]):
            floor[t] = undo[k]
            gap[t] = undo[k + 1]
            remaining[t] += sizes[choice]
            key[t] = floor[t]
            k += 2
        _refresh(tree, key, a[choice], b[choice])
    else:
        floor[s] = undo[mark]
        key[s] = floor[s]
        _refresh(tree, key, s, s + 1)


@inner
def _place(i, m, capacity, undo, undo_top, floor, gap, remaining, key, tree, sizes, a, b,
           use_memo, h1, h2):
    """Put buffer ``i`` at offset ``m``, saving the floors it covers.

    Returns ``(undo_top, h1, h2, pruned)``; ``pruned``: a section under it now
    has a floor plus bytes still to go above it past ``capacity``.
    """
    top_i = m + sizes[i]
    pruned = False
    for t in range(a[i], b[i]):
        undo[undo_top] = floor[t]
        undo[undo_top + 1] = gap[t]
        undo_top += 2
        if use_memo:
            h1, h2 = _rehash_section(h1, h2, t, floor[t], gap[t], top_i, top_i)
        floor[t] = top_i
        gap[t] = top_i
        remaining[t] -= sizes[i]
        key[t] = top_i if remaining[t] > 0 else _INF
        if top_i + remaining[t] > capacity:
            pruned = True
    _refresh(tree, key, a[i], b[i])
    return undo_top, h1, h2, pruned


@inner
def _raise_level(s, m, ptr, cover, placed, floor, a, b, under):
    """The lowest level any unplaced buffer covering section ``s`` could still rest
    at: its resting offset if above ``m``, else ``m`` plus the smallest buffer it
    overlaps (``_INF`` if none is left)."""
    level = _INF
    for x in range(ptr[s], ptr[s + 1]):
        k = cover[x]
        if placed[k]:
            continue
        r = _max_floor(floor, a[k], b[k])
        level = min(level, r if r > m else m + under[k])
    return level


@inner
def _drops_into_gap(s, ptr, cover, placed, floor, gap, sizes, a, b):
    """Gap dominance: whether an unplaced buffer covering section ``s`` fits in the
    empty space under every floor of its lifetime. It would be placed above that
    space and could drop into it; plans where no buffer can move down suffice."""
    for x in range(ptr[s], ptr[s + 1]):
        k = cover[x]
        if placed[k]:
            continue
        g = gap[a[k]]
        f = floor[a[k]]
        for t in range(a[k] + 1, b[k]):
            g = max(g, gap[t])
            f = min(f, floor[t])
        if g + sizes[k] <= f:
            return True
    return False


@inner
def _starved_neighbour(left, right, height, capacity, floor, remaining, placed, a, b, ptr,
                       cover):
    """Tight neighbours: a section with no slack left must get a buffer resting right
    on its floor. Beside a change that rose to ``height``, is section ``left`` or
    ``right`` one whose every candidate now reaches over it?"""
    for t in (left, right):
        if 0 <= t < floor.shape[0] and remaining[t] > 0 \
                and floor[t] + remaining[t] == capacity and floor[t] < height \
                and not _can_rest(floor, placed, a, b, ptr, cover, t):
            return True
    return False


@njit(cache=True)
def fits_memo(sizes, a, b, num_sections, order, twin, capacity, max_nodes, offsets,
              max_discrepancies, rules, t1, t2):
    """``fits`` with the memo ``(t1, t2)`` (from ``memo_table``) given by the caller.

    The memo holds hashes of search states (placed set, floors, empty runs) whose
    subtree holds no plan within ``capacity``: which states those are depends on
    neither the branching order nor the discrepancy limit, so one memo may serve
    every call on the same buffers, ``capacity`` and ``rules`` (and no other).
    Only the complete search (``max_discrepancies < 0``) adds states; every
    search skips the states in it.
    """
    n = sizes.shape[0]
    fits_at_all, remaining = _section_loads(sizes, a, b, num_sections, capacity)
    if not fits_at_all:
        return INFEASIBLE, 0
    floor = np.zeros(num_sections, dtype=np.int64)
    gap = np.zeros(num_sections, dtype=np.int64)  # [gap[t], floor[t]) stays empty for good
    under = _smallest_overlapping(sizes, a, b)
    placed = np.zeros(n, dtype=np.bool_)
    ptr, cover = _cover_lists(order, a, b, num_sections)
    limited = max_discrepancies >= 0
    use_gap = (rules & GAP_DOMINANCE) != 0
    use_tight = (rules & TIGHT_NEIGHBOURS) != 0
    use_memo = (rules & MEMO) != 0 and t1.shape[0] >= 4
    store = use_memo and not limited
    # Memo: two 64-bit hashes of the search state (placed set, floors, empty runs),
    # which alone decides a subtree; states whose subtree was exhausted are stored.
    z1, z2, h1, h2 = _state_hashes(n, num_sections, use_memo)
    # A path places n buffers and raises each section at most once per level.
    depth_cap = min(n + num_sections * (n + 1), n + (1 << 20)) + 64
    # The search stack, one entry per frame:
    f_section = np.empty(depth_cap, dtype=np.int64)  # the section it branches on
    f_level = np.empty(depth_cap, dtype=np.int64)  # that section's floor when opened
    f_cursor = np.empty(depth_cap, dtype=np.int64)  # next cover entry to try
    f_choice = np.empty(depth_cap, dtype=np.int64)  # applied: a buffer, _RAISED or _NONE
    f_undo = np.empty(depth_cap, dtype=np.int64)  # start of its saved floors
    f_discrepancies = np.empty(depth_cap, dtype=np.int64)  # on the path to it
    f_tried = np.empty(depth_cap, dtype=np.int64)  # branches it has applied so far
    f_h1 = np.empty(depth_cap, dtype=np.uint64)  # its state's hashes
    f_h2 = np.empty(depth_cap, dtype=np.uint64)
    stack = (f_section, f_level, f_cursor, f_choice, f_discrepancies, f_tried, f_h1, f_h2)
    undo = np.empty(depth_cap + 2 * int((b - a).sum()) + 64, dtype=np.int64)
    undo_top = 0
    nodes = 0
    # The lowest floor among sections still to fill (leftmost on ties): an argmin
    # tree over ``key`` (the floor, or _INF once a section is full), updated per change.
    half = 1
    while half < num_sections:
        half *= 2
    key = np.full(half, _INF, dtype=np.int64)
    tree = np.zeros(2 * half, dtype=np.int64)
    for t in range(half):
        tree[half + t] = t
        if t < num_sections and remaining[t] > 0:
            key[t] = floor[t]
    _refresh(tree, key, 0, half)
    s0 = tree[1] if key[tree[1]] < _INF else -1
    if s0 < 0:
        return FOUND, 0
    top = 0
    _open_frame(stack, 0, s0, floor[s0], ptr[s0], 0, h1, h2)
    f_undo[0] = 0
    while top >= 0:
        s = f_section[top]
        m = f_level[top]
        choice = f_choice[top]
        if choice != _NONE:
            _take_back(choice, s, f_undo[top], undo, placed, floor, gap, remaining,
                       key, tree, sizes, a, b)
            undo_top = f_undo[top]
        f_choice[top] = _NONE
        h1 = f_h1[top]
        h2 = f_h2[top]
        if nodes >= max_nodes:
            return BUDGET, nodes
        if limited and f_tried[top] > 0 \
                and f_discrepancies[top] >= max_discrepancies:
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
            if sizes[i] > capacity - m or not _rests_at(floor, a[i], b[i], m):
                continue
            f_undo[top] = undo_top
            undo_top, h1, h2, pruned = _place(i, m, capacity, undo, undo_top, floor, gap,
                                              remaining, key, tree, sizes, a, b, use_memo,
                                              h1, h2)
            if use_memo:
                h1 ^= z1[i]
                h2 ^= z2[i]
            placed[i] = True
            offsets[i] = m
            f_choice[top] = i
            applied = True
            nodes += 1
            if use_tight and not pruned:
                pruned = _starved_neighbour(a[i] - 1, b[i], m + sizes[i], capacity, floor,
                                            remaining, placed, a, b, ptr, cover)
            break
        if pruned:
            continue  # undone at the top of the next iteration
        # ... or nothing rests at m here: raise the floor to where something could.
        if not applied and f_cursor[top] == end:
            f_cursor[top] = end + 1  # once per frame
            level = _raise_level(s, m, ptr, cover, placed, floor, a, b, under)
            if level < _INF and level + remaining[s] <= capacity:
                f_undo[top] = undo_top
                undo[undo_top] = floor[s]
                undo_top += 1
                if use_memo:
                    h1, h2 = _rehash_section(h1, h2, s, m, gap[s], level, gap[s])
                floor[s] = level
                key[s] = level
                _refresh(tree, key, s, s + 1)
                f_choice[top] = _RAISED
                applied = True
                nodes += 1
                if use_gap:
                    pruned = _drops_into_gap(s, ptr, cover, placed, floor, gap, sizes, a, b)
                if use_tight and not pruned:
                    pruned = _starved_neighbour(s - 1, s + 1, level, capacity, floor,
                                                remaining, placed, a, b, ptr, cover)
                if pruned:
                    continue  # undone at the top of the next iteration
        if not applied:
            if store:  # its whole subtree failed
                _memo_store(t1, t2, f_h1[top], f_h2[top])
            top -= 1  # every branch tried
            continue
        f_tried[top] += 1
        nxt = tree[1] if key[tree[1]] < _INF else -1
        if nxt < 0:
            return FOUND, nodes
        if use_memo and _memo_slot(t1, t2, h1 | np.uint64(1), h2) >= 0:
            continue  # a state whose subtree already failed: undone next iteration
        if top + 1 >= depth_cap:
            return BUDGET, nodes
        top += 1
        discrepancies = f_discrepancies[top - 1] + (
            1 if f_tried[top - 1] > 1 else 0)
        _open_frame(stack, top, nxt, floor[nxt], ptr[nxt], discrepancies, h1, h2)
    return INFEASIBLE, nodes


@njit(cache=True)
def _window_instance(sizes, a, b, lo, hi):
    """The buffers live in sections ``[lo, hi)``, lifetimes clipped to them (sections
    renumbered from 0); those live in all of them are left out, their bytes summed.
    Returns ``(sizes, a, b, bytes left out)``."""
    n = sizes.shape[0]
    keep = 0
    base = 0
    for i in range(n):
        if a[i] < hi and b[i] > lo:
            if a[i] <= lo and b[i] >= hi:
                base += sizes[i]
            else:
                keep += 1
    ws = np.empty(keep, dtype=np.int64)
    wa = np.empty(keep, dtype=np.int64)
    wb = np.empty(keep, dtype=np.int64)
    k = 0
    for i in range(n):
        if a[i] < hi and b[i] > lo and not (a[i] <= lo and b[i] >= hi):
            ws[k] = sizes[i]
            wa[k] = max(a[i], lo) - lo
            wb[k] = min(b[i], hi) - lo
            k += 1
    return ws, wa, wb, base


@njit(cache=True)
def _order_and_twins(sizes, a, b):
    """Branching order (longest, then largest first) and ``twin`` links, as the driver's."""
    n = sizes.shape[0]
    order = np.argsort(-sizes, kind="mergesort")
    order = order[np.argsort(-(b - a)[order], kind="mergesort")]
    twin = np.full(n, -1, dtype=np.int64)
    by = np.argsort(b, kind="mergesort")
    by = by[np.argsort(a[by], kind="mergesort")]
    by = by[np.argsort(sizes[by], kind="mergesort")]
    for k in range(1, n):
        i, j = by[k], by[k - 1]
        if sizes[i] == sizes[j] and a[i] == a[j] and b[i] == b[j]:
            twin[i] = j
    return order, twin


@njit(cache=True)
def window_bound(sizes, a, b, lower, width, per_window, max_nodes, start=0):
    """Raise ``lower`` by exact searches on windows of ``width`` consecutive sections.

    The buffers live in a window, their lifetimes clipped to it, form a smaller
    instance, and any plan of the whole restricts to a plan of it: its optimum
    is a lower bound. Buffers live in the whole window overlap every other one
    there, so they stack at the top of any plan of it and leave the search with
    their bytes taken off. A window whose complete search runs out of plans
    (``INFEASIBLE``, at most ``per_window`` nodes) proves the bound one byte
    higher, and bisection raises it further. Windows slide by half a width,
    from section ``start``. Returns ``(bound, nodes used, next start)``: it
    stops once ``max_nodes`` are used; the next start is past the last section
    when every window was searched.
    """
    num_sections = 0
    for i in range(sizes.shape[0]):
        num_sections = max(num_sections, b[i])
    width = min(width, num_sections)
    if width < 1:
        return lower, 0, num_sections
    stride = max(1, width // 2)
    used = 0
    while start + width <= num_sections and used < max_nodes:
        ws, wa, wb, base = _window_instance(sizes, a, b, start, start + width)
        start = min(start + stride, num_sections - width) if start + width < num_sections \
            else num_sections
        if ws.shape[0] < 2:
            continue
        order, twin = _order_and_twins(ws, wa, wb)
        offsets = np.zeros(ws.shape[0], dtype=np.int64)
        # Does the window fit in ``lower`` bytes? If not, bisect: no plan of it fits
        # in ``lo`` bytes (proven), one fits in ``hi`` (found, or stacking it all).
        lo = lower - 1
        hi = base + ws.sum()
        probe = lower
        while hi - lo > 1 and used < max_nodes:
            status, nodes = fits(ws, wa, wb, width, order, twin, probe - base, per_window,
                                 offsets)
            used += nodes
            if status == INFEASIBLE:
                lo = probe
            elif lo < lower:
                break  # it fits in the current bound (or may): nothing to gain here
            elif status == FOUND:
                hi = base + (offsets + ws).max()
            else:
                hi = probe
            probe = lo + (hi - lo) // 2
        lower = max(lower, lo + 1)
    if start + width > num_sections:
        start = num_sections
    return lower, used, start
