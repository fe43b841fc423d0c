"""Numba kernels of the offline planner.

Every function here is ``@njit(cache=True)`` and works on int64 NumPy arrays
(``sizes``, ``firsts``, ``lasts``; closed intervals ``[first, last]``). The
Python wrappers in :mod:`numba_bfc.planning.strategies` validate the input and
build the result objects; nothing in this module is called at import time.

Three small data structures are shared by the strategies:

* a binary min-heap on ``(key1, key2)`` pairs (TFLite's ``QueueRecord``: the
  objects in use, ordered by ``(last_task, object_id)``);
* the allocators' treap (:mod:`numba_bfc.kernels.tree`) over node indices
  ``0..n-1`` keyed by ``(size, ptr)`` pairs (here any two int64s), giving
  ``O(log n)`` expected insert, erase, lower bound and predecessor: it replaces
  TFLite's ``std::set`` pools and the per-object schedules;
* a max segment tree over records sorted by ``first`` (only in the offsets
  kernel) that enumerates the placed tensors whose lifetime meets a query.
"""

import numpy as np

from ..kernels.fields import field, set_field
from ..kernels.jit import njit
from ..kernels.tree import (
    ordered_set,
    tree_insert,
    tree_key_before,
    tree_key_lower_bound,
    tree_min,
    tree_remove,
    tree_successor,
)

# TFLite's ``kNotAssigned`` (max size_t) plays "infinity" for distances and
# gaps; int64 max keeps every comparison the same for real inputs.
INF = np.iinfo(np.int64).max


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
    nodes, pool = ordered_set(n)
    h1 = np.empty(n, dtype=np.int64)
    h2 = np.empty(n, dtype=np.int64)
    nh = 0
    nobj = 0
    for i in range(n):
        while nh > 0 and h1[0] < firsts[i]:
            o = h2[0]
            nh = _heap_pop(h1, h2, nh)
            set_field(nodes, o, "size", keys[creator[o]])
            set_field(nodes, o, "ptr", o)
            tree_insert(nodes, pool, 0, o)
        o = tree_key_lower_bound(nodes, field(pool, 0, "root"), keys[i], 0)
        if o == -1 or field(nodes, o, "size") != keys[i]:
            o = nobj
            creator[o] = i
            nobj += 1
        else:
            tree_remove(nodes, pool, 0, o)
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
    nodes, pool = ordered_set(n)
    h1 = np.empty(n, dtype=np.int64)
    h2 = np.empty(n, dtype=np.int64)
    nh = 0
    nobj = 0
    for i in range(n):
        s = sizes[i]
        while nh > 0 and h1[0] < firsts[i]:
            o = h2[0]
            nh = _heap_pop(h1, h2, nh)
            set_field(nodes, o, "size", osize[o])
            set_field(nodes, o, "ptr", o)
            tree_insert(nodes, pool, 0, o)
        best = -1
        if field(pool, 0, "root") != -1:
            if use_graph:
                best_diff = INF
                o = tree_min(nodes, field(pool, 0, "root"))
                while o != -1:
                    t = last_tensor[o]
                    row = g_idx[g_indptr[t] : g_indptr[t + 1]]
                    p = np.searchsorted(row, i)
                    if p < row.shape[0] and row[p] == i:
                        d = abs(osize[o] - s)
                        if d < best_diff:
                            best_diff = d
                            best = o
                    o = tree_successor(nodes, o)
            else:
                a = tree_key_lower_bound(nodes, field(pool, 0, "root"), s, 0)
                b = tree_key_before(nodes, field(pool, 0, "root"), s, 0)
                best = a
                if a == -1 or (b != -1 and s - osize[b] < osize[a] - s):
                    best = b
        if best == -1:
            best = nobj
            osize[best] = s
            nobj += 1
        else:
            tree_remove(nodes, pool, 0, best)
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
    nodes, pool = ordered_set(n)
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
                nxt = tree_key_lower_bound(nodes, field(pool, 0, "root"), o, firsts[r])
                if nxt != -1 and field(nodes, nxt, "size") == o and firsts[nxt] <= lasts[r]:
                    continue
                prv = tree_key_before(nodes, field(pool, 0, "root"), o, firsts[r])
                if prv != -1 and field(nodes, prv, "size") == o and lasts[prv] >= firsts[r]:
                    continue
                best = o
            if best == nobj:
                osize[best] = size
                nobj += 1
            else:
                osize[best] = max(osize[best], size)
            ids[r] = best
            set_field(nodes, r, "size", best)
            set_field(nodes, r, "ptr", firsts[r])
            tree_insert(nodes, pool, 0, r)
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


def greedy_by_size_offsets(sizes, firsts, lasts, alignment):
    """GREEDY_BY_SIZE offsets (TFLite ``GreedyBySizeAssignment``): tensors by
    size descending (stable, as ``_size_rank_order``) through
    ``best_fit_offsets``. Not a kernel: NumPy sorts here, as the kernels' own
    sort costs about 2 s of compiling at a cold start."""
    return best_fit_offsets(sizes, firsts, lasts, alignment, np.argsort(-sizes, kind="stable"),
                            np.argsort(firsts, kind="stable"))


@njit(cache=True)
def _sort_by_offset(cand, offsets, seq, tmp):
    """Sort ``cand`` by ``(offsets, seq)`` (a merge sort, ``tmp`` as long as
    ``cand``): the order two stable sorts, by ``seq`` then by ``offsets``, give.
    Written out because Numba's own ``argsort`` costs over a second to
    compile at a cold start."""
    n = cand.shape[0]
    src, dst = cand, tmp[:n]
    width = 1
    swapped = False
    while width < n:
        for lo in range(0, n, 2 * width):
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i, j = lo, mid
            for k in range(lo, hi):
                if j < hi and (i == mid or offsets[src[j]] < offsets[src[i]]
                               or (offsets[src[j]] == offsets[src[i]]
                                   and seq[src[j]] < seq[src[i]])):
                    dst[k] = src[j]
                    j += 1
                else:
                    dst[k] = src[i]
                    i += 1
        src, dst = dst, src
        swapped = not swapped
        width *= 2
    if swapped:
        for k in range(n):  # a loop: slice assignment compiles its shape checks
            cand[k] = src[k]


@njit(cache=True)
def _count_at_most(sorted_values, value):
    """How many of ``sorted_values`` (ascending) are <= ``value``
    (``searchsorted(..., side="right")``)."""
    lo, hi = 0, sorted_values.shape[0]
    while lo < hi:
        mid = (lo + hi) // 2
        if sorted_values[mid] <= value:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def best_fit_offsets(sizes, firsts, lasts, alignment, order, by_first):
    """Best-fit gap placement of the tensors in ``order``; ``by_first``: the
    tensors by ``first``, stable (NumPy's ``argsort(firsts, kind="stable")``).

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
    scratch = np.empty(n, dtype=np.int64)
    stack = np.empty(64, dtype=np.int64)
    total = 0
    for step in range(n):
        r = order[step]
        # candidates: first <= last_r (a prefix in first order), last >= first_r
        limit = _count_at_most(sorted_first, lasts[r])
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
        _sort_by_offset(cand, offsets, seq, scratch)
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
def _reuse_candidates(firsts, lasts):
    """The records each tensor may take over: ``old[:nold_at[i]]`` for tensor ``i``.

    Tensors in order of ``first``; a record joins ``old`` once its last task is
    before the current tensor's first, in order of ``(last, id)``.
    """
    n = firsts.shape[0]
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
    return old, nold_at


@njit(cache=True)
def _flow_graph(sizes, old, nold_at):
    """TFLite's flow graph, edges in its insertion order, each with its reverse at ``e ^ 1``.

    Vertices: tensor ``i`` as ``i`` (left) and ``n + i`` (right), then the
    source ``2n`` and the sink ``2n + 1``. Returns ``(from, to, capacity, cost)``.
    """
    n = sizes.shape[0]
    src = 2 * n
    sink = 2 * n + 1
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
    return e_from, e_to, e_cap, e_cost


@njit(cache=True)
def _adjacency(e_from, num_vertices):
    """Out-edges of every vertex in insertion order (a stable counting sort by tail)."""
    ne = e_from.shape[0]
    adj_ptr = np.zeros(num_vertices + 1, dtype=np.int64)
    for e in range(ne):
        adj_ptr[e_from[e] + 1] += 1
    for v in range(num_vertices):
        adj_ptr[v + 1] += adj_ptr[v]
    adj = np.empty(ne, dtype=np.int64)
    fill = adj_ptr[:num_vertices].copy()
    for e in range(ne):
        adj[fill[e_from[e]]] = e
        fill[e_from[e]] += 1
    return adj_ptr, adj


@njit(cache=True)
def _cheapest_paths(src, adj_ptr, adj, e_to, e_cap, e_cost, dist, prev_edge):
    """Level-synchronous SPFA from ``src`` over edges with capacity left.

    Fills ``dist`` (``INF`` where unreachable) and ``prev_edge`` (the edge each
    vertex was last improved through), breaking equal costs as TFLite does.
    """
    nv = dist.shape[0]
    last_it = np.zeros(nv, dtype=np.int64)
    cur_q = np.empty(nv, dtype=np.int64)
    next_q = np.empty(nv, dtype=np.int64)
    dist[:] = INF
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


@njit(cache=True)
def _augment(src, sink, prev_edge, e_from, e_cap):
    """Send one unit along the path ``prev_edge`` leads back from ``sink``."""
    v = sink
    while v != src:
        e = prev_edge[v]
        e_cap[e] -= 1
        e_cap[e ^ 1] += 1
        v = e_from[e]


@njit(cache=True)
def _objects_from_flow(sizes, src, adj_ptr, adj, e_to, e_cap):
    """Read the objects off a maximum flow: ``(object_ids, object_sizes)``.

    Each tensor has at most one saturated "reuse" edge out, so an object is a
    chain: start at every saturated source -> right-twin edge, in order.
    """
    n = sizes.shape[0]
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
    old, nold_at = _reuse_candidates(firsts, lasts)
    e_from, e_to, e_cap, e_cost = _flow_graph(sizes, old, nold_at)
    adj_ptr, adj = _adjacency(e_from, 2 * n + 2)
    dist = np.empty(2 * n + 2, dtype=np.int64)
    prev_edge = np.zeros(2 * n + 2, dtype=np.int64)
    while True:
        _cheapest_paths(src, adj_ptr, adj, e_to, e_cap, e_cost, dist, prev_edge)
        if dist[sink] == INF:
            break
        _augment(src, sink, prev_edge, e_from, e_cap)
    return _objects_from_flow(sizes, src, adj_ptr, adj, e_to, e_cap)


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
    nodes, pool = ordered_set(n)
    pl = 0
    for k in range(n):
        i = by_first[k]
        while pl < n and lasts[by_last[pl]] < firsts[i]:
            j = by_last[pl]
            if inside[j]:
                tree_remove(nodes, pool, 0, j)
                inside[j] = False
            pl += 1
        if sizes[i] == 0:
            continue
        nxt = tree_key_lower_bound(nodes, field(pool, 0, "root"), offsets[i], i)
        if nxt != -1 and offsets[nxt] < offsets[i] + sizes[i]:
            return i, nxt
        prv = tree_key_before(nodes, field(pool, 0, "root"), offsets[i], i)
        if prv != -1 and offsets[prv] + sizes[prv] > offsets[i]:
            return i, prv
        set_field(nodes, i, "size", offsets[i])
        set_field(nodes, i, "ptr", i)
        tree_insert(nodes, pool, 0, i)
        inside[i] = True
    return -1, -1
