"""Numba kernels of the offline planner.

Every function here is ``@njit(cache=True)`` and works on int64 NumPy arrays
(``sizes``, ``firsts``, ``lasts``; closed intervals ``[first, last]``). The
Python wrappers in :mod:`numba_bfc.planning.strategies` validate the input and
build the result objects; nothing in this module is called at import time.

Three small data structures are shared by the strategies:

* a binary min-heap on ``(key1, key2)`` pairs (TFLite's ``QueueRecord``: the
  objects in use, ordered by ``(last_task, object_id)``);
* a treap over node indices ``0..cap-1`` keyed by ``(hi, lo)`` pairs, giving
  ``O(log n)`` expected insert, erase, lower bound and predecessor: it replaces
  TFLite's ``std::set`` pools and the per-object schedules;
* a max segment tree over records sorted by ``first`` (only in the offsets
  kernel) that enumerates the placed tensors whose lifetime meets a query.
"""

import numpy as np
from numba import njit

# TFLite's ``kNotAssigned`` (max size_t) plays "infinity" for distances and
# gaps; int64 max keeps every comparison the same for real inputs.
INF = np.iinfo(np.int64).max

# Row layout of the treap state array ``tr`` (shape (6, cap)).
_L, _R, _P, _PRIO, _HI, _LO = 0, 1, 2, 3, 4, 5


# --------------------------------------------------------------------------
# Binary min-heap on (k1, k2)
# --------------------------------------------------------------------------


@njit(cache=True)
def _heap_less(h1, h2, a, b):
    return h1[a] < h1[b] or (h1[a] == h1[b] and h2[a] < h2[b])


@njit(cache=True)
def _heap_push(h1, h2, n, k1, k2):
    """Push ``(k1, k2)`` onto a heap of ``n`` entries; return the new count."""
    i = n
    h1[i] = k1
    h2[i] = k2
    while i > 0:
        p = (i - 1) // 2
        if _heap_less(h1, h2, i, p):
            h1[i], h1[p] = h1[p], h1[i]
            h2[i], h2[p] = h2[p], h2[i]
            i = p
        else:
            break
    return n + 1


@njit(cache=True)
def _heap_pop(h1, h2, n):
    """Drop the top of a heap of ``n`` entries; return the new count."""
    n -= 1
    h1[0] = h1[n]
    h2[0] = h2[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _heap_less(h1, h2, c + 1, c):
            c += 1
        if _heap_less(h1, h2, c, i):
            h1[i], h1[c] = h1[c], h1[i]
            h2[i], h2[c] = h2[c], h2[i]
            i = c
        else:
            break
    return n


# --------------------------------------------------------------------------
# Treap keyed by (hi, lo); nodes are caller-chosen indices 0..cap-1
# --------------------------------------------------------------------------


@njit(cache=True)
def _treap_new(cap):
    tr = np.full((6, max(cap, 1)), -1, dtype=np.int64)
    # Priorities are a fixed hash of the node index (splitmix64): the shape of
    # the tree never affects results, and a fixed hash keeps runs reproducible.
    for i in range(cap):
        z = np.uint64(i + 1) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
        tr[_PRIO, i] = np.int64(z >> np.uint64(1))
    return tr


@njit(cache=True)
def _key_lt(tr, a, hi, lo):
    """Is the key of node ``a`` smaller than ``(hi, lo)``?"""
    return tr[_HI, a] < hi or (tr[_HI, a] == hi and tr[_LO, a] < lo)


@njit(cache=True)
def _rotate_up(tr, root, x):
    p = tr[_P, x]
    g = tr[_P, p]
    if tr[_L, p] == x:
        c = tr[_R, x]
        tr[_L, p] = c
        tr[_R, x] = p
    else:
        c = tr[_L, x]
        tr[_R, p] = c
        tr[_L, x] = p
    if c != -1:
        tr[_P, c] = p
    tr[_P, p] = x
    tr[_P, x] = g
    if g == -1:
        root[0] = x
    elif tr[_L, g] == p:
        tr[_L, g] = x
    else:
        tr[_R, g] = x


@njit(cache=True)
def _treap_insert(tr, root, x, hi, lo):
    tr[_HI, x] = hi
    tr[_LO, x] = lo
    tr[_L, x] = -1
    tr[_R, x] = -1
    cur = root[0]
    if cur == -1:
        tr[_P, x] = -1
        root[0] = x
        return
    while True:
        if _key_lt(tr, x, tr[_HI, cur], tr[_LO, cur]):
            if tr[_L, cur] == -1:
                tr[_L, cur] = x
                break
            cur = tr[_L, cur]
        else:
            if tr[_R, cur] == -1:
                tr[_R, cur] = x
                break
            cur = tr[_R, cur]
    tr[_P, x] = cur
    while tr[_P, x] != -1 and tr[_PRIO, x] < tr[_PRIO, tr[_P, x]]:
        _rotate_up(tr, root, x)


@njit(cache=True)
def _treap_erase(tr, root, x):
    # Rotate x down to a leaf, then unlink it.
    while tr[_L, x] != -1 or tr[_R, x] != -1:
        a = tr[_L, x]
        b = tr[_R, x]
        if a == -1 or (b != -1 and tr[_PRIO, b] < tr[_PRIO, a]):
            _rotate_up(tr, root, b)
        else:
            _rotate_up(tr, root, a)
    p = tr[_P, x]
    if p == -1:
        root[0] = -1
    elif tr[_L, p] == x:
        tr[_L, p] = -1
    else:
        tr[_R, p] = -1
    tr[_P, x] = -1


@njit(cache=True)
def _treap_lower_bound(tr, root, hi, lo):
    """Node with the smallest key ``>= (hi, lo)``, or -1."""
    cur = root[0]
    best = -1
    while cur != -1:
        if _key_lt(tr, cur, hi, lo):
            cur = tr[_R, cur]
        else:
            best = cur
            cur = tr[_L, cur]
    return best


@njit(cache=True)
def _treap_before(tr, root, hi, lo):
    """Node with the largest key ``< (hi, lo)``, or -1."""
    cur = root[0]
    best = -1
    while cur != -1:
        if _key_lt(tr, cur, hi, lo):
            best = cur
            cur = tr[_R, cur]
        else:
            cur = tr[_L, cur]
    return best


@njit(cache=True)
def _treap_next(tr, x):
    """In-order successor of node ``x``, or -1."""
    if tr[_R, x] != -1:
        x = tr[_R, x]
        while tr[_L, x] != -1:
            x = tr[_L, x]
        return x
    p = tr[_P, x]
    while p != -1 and tr[_R, p] == x:
        x = p
        p = tr[_P, p]
    return p


@njit(cache=True)
def _treap_first(tr, root):
    x = root[0]
    if x == -1:
        return -1
    while tr[_L, x] != -1:
        x = tr[_L, x]
    return x


# --------------------------------------------------------------------------
# Task profiles, positional maximums, lower bounds
# --------------------------------------------------------------------------


@njit(cache=True)
def _size_rank_order(sizes):
    """Record indices by size descending, ties by lower index (stable)."""
    return np.argsort(-sizes, kind="mergesort")


@njit(cache=True)
def task_profiles(sizes, firsts, lasts):
    """CSR of TFLite's task profiles for tasks ``0..max(last)``.

    Returns ``(indptr, idx)``: profile ``t`` is ``idx[indptr[t]:indptr[t+1]]``,
    sorted by size descending, ties by lower record index.
    O(n log n + T + sum of interval lengths).
    """
    n = sizes.shape[0]
    num_tasks = 0
    for i in range(n):
        num_tasks = max(num_tasks, lasts[i] + 1)
    indptr = np.zeros(num_tasks + 1, dtype=np.int64)
    for i in range(n):
        indptr[firsts[i] + 1] += 1
        if lasts[i] + 2 <= num_tasks:
            indptr[lasts[i] + 2] -= 1
    for t in range(1, num_tasks + 1):
        indptr[t] += indptr[t - 1]
    for t in range(1, num_tasks + 1):
        indptr[t] += indptr[t - 1]
    idx = np.empty(indptr[num_tasks], dtype=np.int64)
    fill = indptr[:num_tasks].copy()
    # Appending records in rank order leaves every profile already sorted.
    for r in _size_rank_order(sizes):
        for t in range(firsts[r], lasts[r] + 1):
            idx[fill[t]] = r
            fill[t] += 1
    return indptr, idx


@njit(cache=True)
def start_profiles(sizes, firsts, lasts):
    """Profiles at the distinct start times only.

    Every task's live set is a subset of the live set at the latest start time
    not after it, so positional maximums and the breadth-first visit only need
    these (at most n) profiles: the cost no longer depends on the task range.

    Returns ``(starts, indptr, idx)``; profile ``s`` lists the records live at
    ``starts[s]`` by size descending, ties by lower index.
    O(n log n + P log P), P = sum of profile lengths (<= sum of lengths).
    """
    n = sizes.shape[0]
    rank = np.empty(n, dtype=np.int64)
    order = _size_rank_order(sizes)
    for k in range(n):
        rank[order[k]] = k
    by_first = np.argsort(firsts, kind="mergesort")
    by_last = np.argsort(lasts, kind="mergesort")
    starts = np.unique(firsts)
    m = starts.shape[0]
    sf = firsts[by_first]
    sl = lasts[by_last]
    indptr = np.zeros(m + 1, dtype=np.int64)
    for s in range(m):
        # live = started by starts[s] minus ended before it (closed intervals)
        live = np.searchsorted(sf, starts[s], side="right") - np.searchsorted(
            sl, starts[s], side="left"
        )
        indptr[s + 1] = indptr[s] + live
    idx = np.empty(indptr[m], dtype=np.int64)
    active = np.empty(n, dtype=np.int64)  # ranks of live records, unordered
    where = np.full(n, -1, dtype=np.int64)
    na = 0
    pf = 0
    pl = 0
    for s in range(m):
        t = starts[s]
        while pl < n and lasts[by_last[pl]] < t:
            r = rank[by_last[pl]]
            if where[r] >= 0:
                k = where[r]
                na -= 1
                active[k] = active[na]
                where[active[k]] = k
                where[r] = -1
            pl += 1
        while pf < n and firsts[by_first[pf]] <= t:
            r = rank[by_first[pf]]
            if lasts[by_first[pf]] >= t:
                active[na] = r
                where[r] = na
                na += 1
            pf += 1
        live = np.sort(active[:na])
        for k in range(na):
            idx[indptr[s] + k] = order[live[k]]
    return starts, indptr, idx


@njit(cache=True)
def positional_maximums(sizes, firsts, lasts):
    """``PM[k]`` = max over tasks of the k-th largest live size."""
    starts, indptr, idx = start_profiles(sizes, firsts, lasts)
    width = 0
    for s in range(starts.shape[0]):
        width = max(width, indptr[s + 1] - indptr[s])
    pm = np.zeros(width, dtype=np.int64)
    for s in range(starts.shape[0]):
        for k in range(indptr[s + 1] - indptr[s]):
            pm[k] = max(pm[k], sizes[idx[indptr[s] + k]])
    return pm


@njit(cache=True)
def max_live_bytes(sizes, firsts, lasts):
    """``max_t`` of the bytes live at task t (closed intervals). O(n log n)."""
    n = sizes.shape[0]
    by_first = np.argsort(firsts, kind="mergesort")
    by_last = np.argsort(lasts, kind="mergesort")
    live = 0
    best = 0
    pl = 0
    for k in range(n):
        i = by_first[k]
        # An interval ending at t-1 frees its bytes before one starting at t.
        while pl < n and lasts[by_last[pl]] < firsts[i]:
            live -= sizes[by_last[pl]]
            pl += 1
        live += sizes[i]
        best = max(best, live)
    return best


# --------------------------------------------------------------------------
# Shared-object strategies (1-D sizes unless stated)
# --------------------------------------------------------------------------


@njit(cache=True)
def equality_lifo(keys, firsts, lasts):
    """EQUALITY with a per-size LIFO pool (TFLite ``EqualityAssignmentWithHash``).

    ``keys`` are dense size classes ``0..m-1`` (equal sizes, equal keys).
    Returns ``(object_ids, object_record)``: ``object_record[o]`` is the record
    that created object ``o``. O(n log n).
    """
    n = keys.shape[0]
    ids = np.empty(n, dtype=np.int64)
    creator = np.empty(n, dtype=np.int64)
    nkeys = 0
    for i in range(n):
        nkeys = max(nkeys, keys[i] + 1)
    top = np.full(nkeys, -1, dtype=np.int64)  # per size class: last released
    below = np.full(n, -1, dtype=np.int64)  # stack link under each object
    h1 = np.empty(n, dtype=np.int64)
    h2 = np.empty(n, dtype=np.int64)
    nh = 0
    nobj = 0
    for i in range(n):
        while nh > 0 and h1[0] < firsts[i]:
            o = h2[0]
            nh = _heap_pop(h1, h2, nh)
            k = keys[creator[o]]
            below[o] = top[k]
            top[k] = o
        k = keys[i]
        if top[k] == -1:
            o = nobj
            creator[o] = i
            nobj += 1
        else:
            o = top[k]
            top[k] = below[o]
        ids[i] = o
        nh = _heap_push(h1, h2, nh, lasts[i], o)
    return ids, creator[:nobj].copy()


@njit(cache=True)
def equality_lowest_id(keys, firsts, lasts):
    """EQUALITY choosing the lowest free id (TFLite ``EqualityAssignment``).

    Requires ``firsts`` non-decreasing (the wrapper sorts): then "free" objects
    never become busy again before being taken, so a heap of busy objects plus
    a treap of free ``(size class, id)`` pairs gives TFLite's
    lowest-id choice in O(n log n) instead of its O(n * objects) rescan.
    Returns ``(object_ids, object_record)``.
    """
    n = keys.shape[0]
    ids = np.empty(n, dtype=np.int64)
    creator = np.empty(n, dtype=np.int64)
    tr = _treap_new(n)
    root = np.full(1, -1, dtype=np.int64)
    h1 = np.empty(n, dtype=np.int64)
    h2 = np.empty(n, dtype=np.int64)
    nh = 0
    nobj = 0
    for i in range(n):
        while nh > 0 and h1[0] < firsts[i]:
            o = h2[0]
            nh = _heap_pop(h1, h2, nh)
            _treap_insert(tr, root, o, keys[creator[o]], o)
        o = _treap_lower_bound(tr, root, keys[i], 0)
        if o == -1 or tr[_HI, o] != keys[i]:
            o = nobj
            creator[o] = i
            nobj += 1
        else:
            _treap_erase(tr, root, o)
        ids[i] = o
        nh = _heap_push(h1, h2, nh, lasts[i], o)
    return ids, creator[:nobj].copy()


@njit(cache=True)
def greedy_in_order(sizes, firsts, lasts, g_indptr, g_idx, use_graph):
    """GREEDY_IN_ORDER (TFLite ``GreedyInOrderAssignment``).

    Pool of free objects = treap on ``(size, id)``; candidates are the smallest
    free object not smaller than the tensor and the largest smaller one.
    O(n log n). With a reallocation graph (CSR ``g_indptr``/``g_idx``, sorted
    rows) the whole pool is scanned in ``(size, id)`` order as TFLite does:
    O(n * k * log n), k = pool size.
    Returns ``(object_ids, object_sizes)``.
    """
    n = sizes.shape[0]
    ids = np.empty(n, dtype=np.int64)
    osize = np.empty(n, dtype=np.int64)
    last_tensor = np.empty(n, dtype=np.int64)
    tr = _treap_new(n)
    root = np.full(1, -1, dtype=np.int64)
    h1 = np.empty(n, dtype=np.int64)
    h2 = np.empty(n, dtype=np.int64)
    nh = 0
    nobj = 0
    for i in range(n):
        s = sizes[i]
        while nh > 0 and h1[0] < firsts[i]:
            o = h2[0]
            nh = _heap_pop(h1, h2, nh)
            _treap_insert(tr, root, o, osize[o], o)
        best = -1
        if root[0] != -1:
            if use_graph:
                best_diff = INF
                o = _treap_first(tr, root)
                while o != -1:
                    t = last_tensor[o]
                    row = g_idx[g_indptr[t] : g_indptr[t + 1]]
                    p = np.searchsorted(row, i)
                    if p < row.shape[0] and row[p] == i:
                        d = abs(osize[o] - s)
                        if d < best_diff:
                            best_diff = d
                            best = o
                    o = _treap_next(tr, o)
            else:
                a = _treap_lower_bound(tr, root, s, 0)
                b = _treap_before(tr, root, s, 0)
                best = a
                if a == -1 or (b != -1 and s - osize[b] < osize[a] - s):
                    best = b
        if best == -1:
            best = nobj
            osize[best] = s
            nobj += 1
        else:
            _treap_erase(tr, root, best)
            osize[best] = max(osize[best], s)
        ids[i] = best
        last_tensor[best] = i
        nh = _heap_push(h1, h2, nh, lasts[i], best)
    return ids, osize[:nobj].copy()


@njit(cache=True)
def greedy_in_order_multidim(sizes, firsts, lasts):
    """GREEDY_IN_ORDER for 2-D/3-D sizes (``sizes`` has shape (n, d)).

    Free pool in release order; an object is usable if it covers the tensor in
    every dimension; the usable one with the strictly smallest
    ``|volume(obj) - volume(tensor)|`` wins, earlier in the pool on ties.
    Objects never grow. O(n * k): covering in several dimensions has no single
    order to search, so the pool is scanned as in TFLite.
    Returns ``(object_ids, object_record)``.
    """
    n = sizes.shape[0]
    d = sizes.shape[1]
    ids = np.empty(n, dtype=np.int64)
    creator = np.empty(n, dtype=np.int64)
    vol = np.ones(n, dtype=np.int64)
    for i in range(n):
        for j in range(d):
            vol[i] *= sizes[i, j]
    pool = np.empty(n, dtype=np.int64)
    npool = 0
    h1 = np.empty(n, dtype=np.int64)
    h2 = np.empty(n, dtype=np.int64)
    nh = 0
    nobj = 0
    for i in range(n):
        while nh > 0 and h1[0] < firsts[i]:
            pool[npool] = h2[0]
            npool += 1
            nh = _heap_pop(h1, h2, nh)
        best = -1
        best_diff = INF
        for p in range(npool):
            c = creator[pool[p]]
            covers = True
            for j in range(d):
                if sizes[c, j] < sizes[i, j]:
                    covers = False
                    break
            if covers:
                diff = abs(vol[c] - vol[i])
                if diff < best_diff:
                    best_diff = diff
                    best = p
        if best == -1:
            o = nobj
            creator[o] = i
            nobj += 1
        else:
            o = pool[best]
            # Erase keeping release order: later ties depend on it.
            for p in range(best, npool - 1):
                pool[p] = pool[p + 1]
            npool -= 1
        ids[i] = o
        nh = _heap_push(h1, h2, nh, lasts[i], o)
    return ids, creator[:nobj].copy()


@njit(cache=True)
def greedy_by_breadth(sizes, firsts, lasts):
    """GREEDY_BY_BREADTH (TFLite ``GreedyByBreadthAssignment``).

    Tasks are visited by breadth descending, ties by lower task id; only start
    times are visited (a later task's profile is a subset of its latest start's
    and comes after it in that order, so it would assign nothing). The
    per-object schedules are one treap on ``(object, first)``.
    O(n log n + P log P + n * k * log n), P = sum of start-profile lengths,
    k = number of objects (TFLite: O(n * T + n * k * log n)).
    Returns ``(object_ids, object_sizes)``.
    """
    n = sizes.shape[0]
    ids = np.full(n, -1, dtype=np.int64)
    osize = np.empty(n, dtype=np.int64)
    starts, indptr, idx = start_profiles(sizes, firsts, lasts)
    m = starts.shape[0]
    breadth = np.zeros(m, dtype=np.int64)
    for s in range(m):
        for k in range(indptr[s], indptr[s + 1]):
            breadth[s] += sizes[idx[k]]
    # starts are ascending, so a stable sort on -breadth keeps lower tasks first
    visit = np.argsort(-breadth, kind="mergesort")
    tr = _treap_new(n)
    root = np.full(1, -1, dtype=np.int64)
    nobj = 0
    for v in range(m):
        s = visit[v]
        for k in range(indptr[s], indptr[s + 1]):
            r = idx[k]
            if ids[r] != -1:
                continue
            size = sizes[r]
            best = nobj
            for o in range(nobj):
                if best != nobj:
                    bs = osize[best]
                    cs = osize[o]
                    if bs < size:
                        if cs <= bs:
                            continue
                    elif cs < size or cs >= bs:
                        continue
                nxt = _treap_lower_bound(tr, root, o, firsts[r])
                if nxt != -1 and tr[_HI, nxt] == o and firsts[nxt] <= lasts[r]:
                    continue
                prv = _treap_before(tr, root, o, firsts[r])
                if prv != -1 and tr[_HI, prv] == o and lasts[prv] >= firsts[r]:
                    continue
                best = o
            if best == nobj:
                osize[best] = size
                nobj += 1
            else:
                osize[best] = max(osize[best], size)
            ids[r] = best
            _treap_insert(tr, root, r, best, firsts[r])
    return ids, osize[:nobj].copy()


@njit(cache=True)
def _interval_dist(firsts, lasts, a, b):
    if lasts[a] < firsts[b]:
        return firsts[b] - lasts[a]
    if lasts[b] < firsts[a]:
        return firsts[a] - lasts[b]
    return INF


@njit(cache=True)
def greedy_by_size_objects(sizes, firsts, lasts):
    """GREEDY_BY_SIZE shared objects (TFLite ``GreedyBySizeDistPriorityAssignment``).

    Priority (position, best distance, -size, index) with TFLite's update rules.
    Each round picks the best unassigned tensor and refreshes the distance of
    every unassigned tensor to the chosen object, so this stays O(n^2 + R * k)
    time (R = recomputations of a best object) and O(n * k) memory for the
    distance table, as in TFLite; positional maximums come from the start
    profiles (no dependence on the task range).
    Returns ``(object_ids, object_sizes)``.
    """
    n = sizes.shape[0]
    ids = np.full(n, -1, dtype=np.int64)
    osize = np.empty(n, dtype=np.int64)
    pm = positional_maximums(sizes, firsts, lasts)
    # rightmost PM index with PM >= size; PM is non-increasing
    neg_pm = -pm
    position = np.empty(n, dtype=np.int64)
    for i in range(n):
        position[i] = np.searchsorted(neg_pm, -sizes[i], side="right") - 1
    best_dist = np.full(n, INF, dtype=np.int64)
    best_obj = np.full(n, -1, dtype=np.int64)
    cap = 4
    dist = np.full((n, cap), INF, dtype=np.int64)
    todo = np.arange(n)
    ntodo = n
    nobj = 0
    for _ in range(n):
        bi = -1
        bk = -1
        for k in range(ntodo):
            u = todo[k]
            if bi == -1:
                bi = u
                bk = k
                continue
            if position[u] != position[bi]:
                better = position[u] < position[bi]
            elif best_dist[u] != best_dist[bi]:
                better = best_dist[u] < best_dist[bi]
            elif sizes[u] != sizes[bi]:
                better = sizes[u] > sizes[bi]
            else:
                better = u < bi
            if better:
                bi = u
                bk = k
        ntodo -= 1
        todo[bk] = todo[ntodo]
        new_object = best_dist[bi] == INF
        if new_object:
            o = nobj
            nobj += 1
            osize[o] = sizes[bi]
            if nobj > cap:
                grown = np.full((n, 2 * cap), INF, dtype=np.int64)
                grown[:, :cap] = dist
                dist = grown
                cap *= 2
        else:
            o = best_obj[bi]
            osize[o] = max(osize[o], sizes[bi])
        ids[bi] = o
        for k in range(ntodo):
            u = todo[k]
            if not new_object and dist[u, o] == INF:
                continue
            d = _interval_dist(firsts, lasts, u, bi)
            if new_object:
                dist[u, o] = d
            elif d == INF:
                dist[u, o] = INF
                if best_obj[u] == o:
                    best_dist[u] = INF
                    for oo in range(nobj):
                        if dist[u, oo] < best_dist[u]:
                            best_dist[u] = dist[u, oo]
                            best_obj[u] = oo
            else:
                dist[u, o] = min(dist[u, o], d)
            if d < best_dist[u]:
                best_dist[u] = d
                best_obj[u] = o
    return ids, osize[:nobj].copy()


@njit(cache=True)
def _seg_set(tree, size, pos, value):
    i = pos + size
    tree[i] = value
    i //= 2
    while i >= 1:
        tree[i] = max(tree[2 * i], tree[2 * i + 1])
        i //= 2


@njit(cache=True)
def greedy_by_size_offsets(sizes, firsts, lasts, alignment):
    """GREEDY_BY_SIZE offsets (TFLite ``GreedyBySizeAssignment``): tensors by
    size descending (stable) through ``best_fit_offsets``."""
    return best_fit_offsets(sizes, firsts, lasts, alignment, _size_rank_order(sizes))


@njit(cache=True)
def best_fit_offsets(sizes, firsts, lasts, alignment, order):
    """Best-fit gap placement of the tensors in ``order``.

    Each goes into the smallest gap, lowest
    offset first, between the placed tensors whose lifetime meets its own.
    Those tensors are enumerated from a max segment tree on ``last`` over the
    records sorted by ``first`` (placed ones only), then sorted by
    ``(offset, placement order)``: O(n log n + sum_r k_r log n) with k_r the
    placed tensors overlapping r in time, instead of TFLite's O(n^2) rescans.
    The worst case (everything live together) is O(n^2 log n).
    Returns ``(offsets, total_size)``.
    """
    n = sizes.shape[0]
    offsets = np.zeros(n, dtype=np.int64)
    seq = np.zeros(n, dtype=np.int64)
    if n == 0:
        return offsets, 0
    by_first = np.argsort(firsts, kind="mergesort")
    pos = np.empty(n, dtype=np.int64)
    sorted_first = np.empty(n, dtype=np.int64)
    for k in range(n):
        pos[by_first[k]] = k
        sorted_first[k] = firsts[by_first[k]]
    size = 1
    while size < n:
        size *= 2
    tree = np.full(2 * size, -1, dtype=np.int64)
    found = np.empty(n, dtype=np.int64)
    stack = np.empty(64, dtype=np.int64)
    total = 0
    for step in range(n):
        r = order[step]
        # candidates: first <= last_r (a prefix in first order), last >= first_r
        limit = np.searchsorted(sorted_first, lasts[r], side="right")
        nf = 0
        sp = 0
        stack[sp] = 1
        sp += 1
        while sp > 0:
            sp -= 1
            node = stack[sp]
            if tree[node] < firsts[r]:
                continue
            # node covers leaves [lo, hi) at its depth
            lo = node
            hi = node + 1
            while lo < size:
                lo *= 2
                hi *= 2
            if lo - size >= limit:
                continue
            if node >= size:
                found[nf] = by_first[node - size]
                nf += 1
            else:
                stack[sp] = 2 * node + 1
                stack[sp + 1] = 2 * node
                sp += 2
        cand = found[:nf]
        cand = cand[np.argsort(seq[cand], kind="mergesort")]
        cand = cand[np.argsort(offsets[cand], kind="mergesort")]
        s = sizes[r]
        prev = 0
        best_gap = INF
        best_off = -1
        for a in cand:
            cur = offsets[a]
            if cur >= prev:
                gap = cur - prev
                if gap >= s and gap < best_gap:
                    best_gap = gap
                    best_off = prev
            end = cur + sizes[a]
            end = (end + alignment - 1) // alignment * alignment
            prev = max(prev, end)
        if best_off == -1:
            best_off = prev
        offsets[r] = best_off
        seq[r] = step
        total = max(total, best_off + s)
        _seg_set(tree, size, pos[r], lasts[r])
    return offsets, total


@njit(cache=True)
def mincostflow(sizes, firsts, lasts):
    """MINCOSTFLOW (TFLite ``MinCostFlowAssignment``), 64-bit costs.

    Same graph, same edge insertion order and the same level-synchronous SPFA,
    so equal-cost paths are broken the same way. O(n^2) edges; n augmentations
    of an O(V * E) worst-case SPFA: O(n^4) worst, O(n^2) memory.
    Returns ``(object_ids, object_sizes)``.
    """
    n = sizes.shape[0]
    src = 2 * n
    sink = 2 * n + 1
    nv = 2 * n + 2
    # pass 1: how many "reuse" edges (old records) each tensor gets
    h1 = np.empty(n, dtype=np.int64)
    h2 = np.empty(n, dtype=np.int64)
    old = np.empty(n, dtype=np.int64)
    nold_at = np.empty(n, dtype=np.int64)
    nh = 0
    nold = 0
    for i in range(n):
        while nh > 0 and h1[0] < firsts[i]:
            old[nold] = h2[0]
            nold += 1
            nh = _heap_pop(h1, h2, nh)
        nh = _heap_push(h1, h2, nh, lasts[i], i)
        nold_at[i] = nold
    ne = 0
    for i in range(n):
        ne += 3 + nold_at[i]
    ne *= 2
    e_from = np.empty(ne, dtype=np.int64)
    e_to = np.empty(ne, dtype=np.int64)
    e_cap = np.empty(ne, dtype=np.int64)
    e_cost = np.empty(ne, dtype=np.int64)
    k = 0
    for i in range(n):
        for j in range(4 + nold_at[i]):
            if j == 0:
                a, b, c = src, i, 0
            elif j == 1:
                a, b, c = n + i, sink, 0
            elif j == 2:
                a, b, c = src, n + i, sizes[i]
            elif j == 3:
                continue
            else:
                rec = old[j - 4]
                a, b = rec, n + i
                c = max(0, sizes[i] - sizes[rec])
            e_from[k], e_to[k], e_cap[k], e_cost[k] = a, b, 1, c
            e_from[k + 1], e_to[k + 1], e_cap[k + 1], e_cost[k + 1] = b, a, 0, -c
            k += 2
    # adjacency in insertion order (stable counting sort by tail)
    adj_ptr = np.zeros(nv + 1, dtype=np.int64)
    for e in range(ne):
        adj_ptr[e_from[e] + 1] += 1
    for v in range(nv):
        adj_ptr[v + 1] += adj_ptr[v]
    adj = np.empty(ne, dtype=np.int64)
    fill = adj_ptr[:nv].copy()
    for e in range(ne):
        adj[fill[e_from[e]]] = e
        fill[e_from[e]] += 1

    dist = np.empty(nv, dtype=np.int64)
    last_it = np.empty(nv, dtype=np.int64)
    prev_edge = np.zeros(nv, dtype=np.int64)
    cur_q = np.empty(nv, dtype=np.int64)
    next_q = np.empty(nv, dtype=np.int64)
    while True:
        dist[:] = INF
        last_it[:] = 0
        it = 1
        cur_q[0] = src
        ncur = 1
        last_it[src] = it
        dist[src] = 0
        while ncur > 0:
            it += 1
            nnext = 0
            for qi in range(ncur):
                v = cur_q[qi]
                for p in range(adj_ptr[v], adj_ptr[v + 1]):
                    e = adj[p]
                    if e_cap[e] > 0:
                        u = e_to[e]
                        nd = dist[v] + e_cost[e]
                        if nd < dist[u]:
                            dist[u] = nd
                            prev_edge[u] = e
                            if last_it[u] != it:
                                next_q[nnext] = u
                                nnext += 1
                                last_it[u] = it
            cur_q, next_q = next_q, cur_q
            ncur = nnext
        if dist[sink] == INF:
            break
        v = sink
        while v != src:
            e = prev_edge[v]
            e_cap[e] -= 1
            e_cap[e ^ 1] += 1
            v = e_from[e]

    # Each tensor has at most one saturated "reuse" edge out, so an object is a
    # chain: start at every saturated source -> right-twin edge, in order.
    ids = np.full(n, -1, dtype=np.int64)
    osize = np.empty(n, dtype=np.int64)
    nobj = 0
    for p in range(adj_ptr[src], adj_ptr[src + 1]):
        e = adj[p]
        if e_cap[e] == 0 and n <= e_to[e] < 2 * n:
            t = e_to[e] - n
            best = 0
            while t != -1:
                ids[t] = nobj
                best = max(best, sizes[t])
                nxt = -1
                for q in range(adj_ptr[t], adj_ptr[t + 1]):
                    f = adj[q]
                    w = e_to[f]
                    if e_cap[f] == 0 and n <= w < 2 * n and ids[w - n] == -1:
                        nxt = w - n
                        break
                t = nxt
            osize[nobj] = best
            nobj += 1
    return ids, osize[:nobj].copy()


# --------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------


@njit(cache=True)
def offsets_conflict(sizes, firsts, lasts, offsets):
    """First pair of time-overlapping tensors sharing bytes, or (-1, -1).

    Sweep over time keeping the live non-empty tensors in a treap on
    ``(offset, index)``; they are pairwise disjoint, so a newcomer only has to
    be checked against its neighbours. O(n log n).
    """
    n = sizes.shape[0]
    by_first = np.argsort(firsts, kind="mergesort")
    by_last = np.argsort(lasts, kind="mergesort")
    inside = np.zeros(n, dtype=np.bool_)
    tr = _treap_new(n)
    root = np.full(1, -1, dtype=np.int64)
    pl = 0
    for k in range(n):
        i = by_first[k]
        while pl < n and lasts[by_last[pl]] < firsts[i]:
            j = by_last[pl]
            if inside[j]:
                _treap_erase(tr, root, j)
                inside[j] = False
            pl += 1
        if sizes[i] == 0:
            continue
        nxt = _treap_lower_bound(tr, root, offsets[i], i)
        if nxt != -1 and offsets[nxt] < offsets[i] + sizes[i]:
            return i, nxt
        prv = _treap_before(tr, root, offsets[i], i)
        if prv != -1 and offsets[prv] + sizes[prv] > offsets[i]:
            return i, prv
        _treap_insert(tr, root, i, offsets[i], i)
        inside[i] = True
    return -1, -1
