"""Buffer by buffer in offset order: does a plan fit in ``capacity``?

The second decision procedure of the ``search`` strategy, the method of
Moffitt's MiniMalloc (ASPLOS'23), written here over arrays. It complements
``_search`` (which walks the lowest section's floor): it is stronger where
many buffers of different lifetimes interlock, ``_search`` where its memo and
gap rule apply (cut and gadget instances).

Every plan can be compacted until each buffer rests at its *minimum offset*:
the highest top of the buffers placed before it that it overlaps in time (or
0). The search places one buffer per step at its minimum offset, in
non-decreasing ``(offset, rank)`` order (each plan has one such order, so no
plan is searched twice), and backtracks. Cuts, all sound:

* section inference: in every time section, the bytes still to be placed
  must fit between the section's floor and the capacity. The floor is the
  top of the last buffer placed there, at least the current offset (later
  buffers go no lower) and at least the lowest minimum offset of the
  section's unplaced buffers;
* dominance: no buffer is placed at or above the lowest top an unplaced
  buffer could have (it would leave that buffer a hole it should drop into);
* a buffer that overlaps no unplaced buffer, once its subtree failed, ends
  its siblings too (any of them could have moved it down here);
* decomposition: when no unplaced buffer crosses a section boundary, the two
  sides are independent. Each side is searched on its own, to its first
  plan, with a fresh order; if one side has none, the search goes straight
  back to the placement that split them (the other sides' plans are not
  revisited).

Ranks come from a static key per part, recomputed at each split: lifetime
width, area and the largest unplaced total of the buffer's sections, in one
of three orders (``ORDERS``). The state changes are logged on a trail and
undone to a mark; frames, parts and candidate lists are arrays that grow.
"""

from __future__ import annotations

import numpy as np

from ..kernels.jit import inner, njit
from ._search import BUDGET, FOUND, INFEASIBLE, _cover_lists, _overlaps

#: Rank keys, most significant first: W lifetime width, A area, T the largest
#: unplaced total over the buffer's sections (MiniMalloc's default three).
ORDERS = ("WAT", "TAW", "TWA")

DECOMPOSE = 1  # ``rules`` bits
HATLESS = 2
UNPLACED_FLOOR = 4
ALL_RULES = 7

_WORK_PER_NODE = 32  # buffer, section and overlap visits that count as one node
_NONE = np.int64(1) << 62

# Trail entries (kind, index, old value), undone in reverse order.
_PLACE = 0
_MIN_OFFSET = 1
_RANK = 2
_WATCH = 3

# Part rows: a section range, its buffers (``pool[start:start + count]``), the
# frame whose placement split it off (-1: a part of the whole) and the next
# part of that split (-1: the last).
P_LO, P_HI, P_START, P_COUNT, P_PARENT, P_NEXT = range(6)
# Frame rows: its part, whether it is the part's first frame, its candidates
# (``cand[first:first + count]``) and the next to try, the trail, part and pool
# marks to undo to before each try, the canonical key a candidate must reach,
# whether the last one tried was hatless, and whether it was opened yet.
(F_PART, F_ROOT, F_CAND, F_COUNT, F_NEXT, F_TRAIL, F_PARTS, F_POOL, F_KEY_OFF, F_KEY_RANK,
 F_HATLESS, F_OPEN) = range(12)


@njit(cache=True)
def _grown(arr, need):
    """``arr``, or a copy with room for ``need`` rows (twice as many at least)."""
    if need <= arr.shape[0]:
        return arr
    out = np.empty((max(need, 2 * arr.shape[0]),) + arr.shape[1:], dtype=arr.dtype)
    out[:arr.shape[0]] = arr
    return out


@njit(cache=True)
def _log(trail, top, kind, index, old):
    """Append a trail entry: ``(trail, top + 1)``."""
    trail = _grown(trail, top + 1)
    trail[top, 0] = kind
    trail[top, 1] = index
    trail[top, 2] = old
    return trail, top + 1


@njit(cache=True)
def _push_frame(frames, top, part, root, key_off, key_rank):
    """Put an unopened frame above ``top``: ``(frames, top + 1)``."""
    frames = _grown(frames, top + 2)
    top += 1
    frames[top, F_PART] = part
    frames[top, F_ROOT] = root
    frames[top, F_OPEN] = 0
    frames[top, F_KEY_OFF] = key_off
    frames[top, F_KEY_RANK] = key_rank
    return frames, top


@inner
def _can_fill(t, capacity, total, off, min_off, watch, cov_ptr, cov_idx):
    """Whether some unplaced buffer over section ``t`` can start low enough for
    the section's bytes left (``total[t]`` on top of its minimum offset). The
    answer found is kept in ``watch[t]`` and checked first next time."""
    if total[t] == 0:
        return True
    high = capacity - total[t]
    k = watch[t]
    if off[k] < 0 and min_off[k] <= high:
        return True
    for x in range(cov_ptr[t], cov_ptr[t + 1]):
        k = cov_idx[x]
        if off[k] < 0 and min_off[k] <= high:
            watch[t] = k
            return True
    return False


@njit(cache=True)
def _rank_part(members, sizes, width, a, b, total, order_code, rank):
    """Rank ``members`` (0 = first) by the keys of ``ORDERS[order_code]``,
    largest first, ties by index."""
    m = members.shape[0]
    area = np.empty(m, dtype=np.float64)  # as floats: a product of two int64 can wrap
    wide = np.empty(m, dtype=np.float64)
    busiest = np.empty(m, dtype=np.float64)
    for x in range(m):
        i = members[x]
        wide[x] = width[i]
        area[x] = float(sizes[i]) * float(width[i])
        top = 0
        for t in range(a[i], b[i]):
            top = max(top, total[t])
        busiest[x] = top
    if order_code == 0:
        keys = (busiest, area, wide)  # least significant first
    elif order_code == 1:
        keys = (wide, area, busiest)
    else:
        keys = (area, wide, busiest)
    perm = np.argsort(members, kind="mergesort")
    for key in keys:
        perm = perm[np.argsort(-key[perm], kind="mergesort")]
    for r in range(m):
        rank[members[perm[r]]] = r


@njit(cache=True)
def _split(parent, lo, hi, first, count, parts, p_top, pool, pool_top, trail, tr_top, cuts,
           off, sizes, width, a, b, total, order_code, rank):
    """New parts for the unplaced buffers of ``pool[first:first + count]``, one
    per run of sections in ``[lo, hi)`` between boundaries no unplaced buffer
    crosses, each ranked afresh (old ranks on the trail), linked in time order.
    Returns ``(parts, p_top, pool, pool_top, trail, tr_top)``."""
    first_new = p_top
    start = lo
    for t in range(lo, hi):
        if t < hi - 1 and cuts[t] > 0:
            continue
        pool = _grown(pool, pool_top + count)
        found = 0
        for x in range(first, first + count):
            k = pool[x]
            if off[k] < 0 and a[k] <= t and b[k] > start:
                pool[pool_top + found] = k
                found += 1
        if found > 0:
            parts = _grown(parts, p_top + 1)
            parts[p_top, P_LO] = start
            parts[p_top, P_HI] = t + 1
            parts[p_top, P_START] = pool_top
            parts[p_top, P_COUNT] = found
            parts[p_top, P_PARENT] = parent
            parts[p_top, P_NEXT] = -1
            if p_top > first_new:
                parts[p_top - 1, P_NEXT] = p_top
            members = pool[pool_top:pool_top + found]
            for x in range(found):
                trail, tr_top = _log(trail, tr_top, _RANK, members[x], rank[members[x]])
            _rank_part(members, sizes, width, a, b, total, order_code, rank)
            pool_top += found
            p_top += 1
        start = t + 1
    return parts, p_top, pool, pool_top, trail, tr_top


@njit(cache=True)
def fits_in_offset_order(sizes, width, a, b, num_sections, order_code, capacity, max_nodes,
                         offsets, rules=ALL_RULES):
    """Whether the buffers fit in ``capacity`` bytes: ``(status, nodes)``.

    ``sizes``, ``width`` (lifetime length) and the section spans ``[a, b)``
    describe the buffers; ``order_code`` picks the rank keys in ``ORDERS``.
    ``FOUND`` writes a plan into ``offsets``; ``INFEASIBLE`` proves none
    exists (every rule in ``rules`` is sound); ``BUDGET`` means
    ``max_nodes`` nodes ran out first. Nodes count the work: one per step
    down the search and per buffer tried, plus one per 32 buffers and
    sections a step looks at and per 32 sections and overlaps of a buffer
    tried, so that a budget bounds the time on dense instances too.
    """
    n = sizes.shape[0]
    S = num_sections
    if n == 0:
        return FOUND, 0
    ov_ptr, ov_idx = _overlaps(a, b)
    cov_ptr, cov_idx = _cover_lists(np.arange(n), a, b, S)
    off = np.full(n, -1, dtype=np.int64)
    min_off = np.zeros(n, dtype=np.int64)
    rank = np.zeros(n, dtype=np.int64)
    total = np.zeros(S, dtype=np.int64)
    cuts = np.zeros(S, dtype=np.int64)  # cuts[t]: unplaced buffers over sections t and t + 1
    for i in range(n):
        for t in range(a[i], b[i]):
            total[t] += sizes[i]
        for t in range(a[i], b[i] - 1):
            cuts[t] += 1
    for t in range(S):
        if total[t] > capacity:
            return INFEASIBLE, 0
    floors = rules & UNPLACED_FLOOR != 0
    watch = np.zeros(S, dtype=np.int64)  # a buffer over each section: see _can_fill
    watching = np.zeros(n, dtype=np.int64)  # how many sections each buffer watches
    for t in range(S):
        if cov_ptr[t + 1] > cov_ptr[t]:
            watch[t] = cov_idx[cov_ptr[t]]
            watching[watch[t]] += 1
    trail = np.empty((4 * n + 16, 3), dtype=np.int64)
    parts = np.empty((n + 1, 6), dtype=np.int64)
    frames = np.empty((2 * n + 4, 12), dtype=np.int64)
    pool = np.arange(n)
    cand = np.empty(2 * n + 16, dtype=np.int64)
    cand_top = 0
    # The parts of the whole instance: split at boundaries no buffer crosses.
    parts, p_top, pool, pool_top, trail, tr_top = _split(
        -1, 0, S, 0, n, parts, 0, pool, n, trail, 0, cuts, off, sizes, width, a, b, total,
        order_code, rank)
    frames, top = _push_frame(frames, -1, 0, 1, 0, -1)
    nodes = 0
    while True:
        if frames[top, F_OPEN] == 0:
            # A new frame: its candidates, or its part is solved.
            frames[top, F_OPEN] = 1
            frames[top, F_TRAIL] = tr_top
            frames[top, F_PARTS] = p_top
            frames[top, F_POOL] = pool_top
            frames[top, F_NEXT] = 0
            frames[top, F_HATLESS] = 0
            frames[top, F_CAND] = cand_top
            frames[top, F_COUNT] = 0
            part = frames[top, F_PART]
            first = parts[part, P_START]
            last = first + parts[part, P_COUNT]
            lowest_top = _NONE
            left = 0
            for x in range(first, last):
                i = pool[x]
                if off[i] < 0:
                    left += 1
                    lowest_top = min(lowest_top, min_off[i] + sizes[i])
            if left == 0:
                # Solved: on to the next part of its split; after the last, the
                # part that split is solved too.
                while parts[part, P_NEXT] < 0:
                    parent = parts[part, P_PARENT]
                    if parent < 0:
                        offsets[:] = off
                        return FOUND, nodes
                    part = frames[parent, F_PART]
                frames, top = _push_frame(frames, top, parts[part, P_NEXT], 1, 0, -1)
                continue
            nodes += 1 + (last - first + parts[part, P_HI] - parts[part, P_LO]) // _WORK_PER_NODE
            if nodes > max_nodes:
                return BUDGET, max_nodes
            # Every section's unplaced bytes go above the offset of whatever is
            # placed next (placements rise), so no candidate above this fits.
            busiest = 0
            for t in range(parts[part, P_LO], parts[part, P_HI]):
                busiest = max(busiest, total[t])
            key_off = frames[top, F_KEY_OFF]
            key_rank = frames[top, F_KEY_RANK]
            cand = _grown(cand, cand_top + left)
            count = 0
            for x in range(first, last):
                i = pool[x]
                if off[i] >= 0:
                    continue
                o = min_off[i]
                if o < key_off or (o == key_off and rank[i] < key_rank):
                    continue  # not canonical: a plan with it placed here comes in another order
                if o >= lowest_top or o + busiest > capacity:
                    continue  # dominated, or too high
                cand[cand_top + count] = i
                count += 1
            # Sort the candidates by (offset, rank): insertion sort, lists are short.
            for x in range(cand_top + 1, cand_top + count):
                i = cand[x]
                y = x - 1
                while y >= cand_top and (min_off[cand[y]] > min_off[i] or (
                        min_off[cand[y]] == min_off[i] and rank[cand[y]] > rank[i])):
                    cand[y + 1] = cand[y]
                    y -= 1
                cand[y + 1] = i
            frames[top, F_COUNT] = count
            cand_top += count
        # Try the frame's next candidate, after undoing the last one (in reverse,
        # so each step sees the state it left).
        mark = frames[top, F_TRAIL]
        while tr_top > mark:
            tr_top -= 1
            kind, j, old = trail[tr_top, 0], trail[tr_top, 1], trail[tr_top, 2]
            if kind == _PLACE:
                for t in range(a[j], b[j]):
                    total[t] += sizes[j]
                for t in range(a[j], b[j] - 1):
                    cuts[t] += 1
                off[j] = -1
            elif kind == _MIN_OFFSET:
                min_off[j] = old
            elif kind == _WATCH:
                watching[watch[j]] -= 1
                watch[j] = old
                watching[old] += 1
            else:
                rank[j] = old
        p_top = frames[top, F_PARTS]
        pool_top = frames[top, F_POOL]
        cand_top = frames[top, F_CAND] + frames[top, F_COUNT]
        if frames[top, F_NEXT] >= frames[top, F_COUNT] or (
                frames[top, F_HATLESS] and rules & HATLESS):
            # Exhausted: back to the frame below, or, from the first frame of a
            # part, straight to the placement that split the part off.
            cand_top = frames[top, F_CAND]
            if frames[top, F_ROOT]:
                parent = parts[frames[top, F_PART], P_PARENT]
                if parent < 0:
                    return INFEASIBLE, nodes
                top = parent
            else:
                top -= 1
            continue
        i = cand[frames[top, F_CAND] + frames[top, F_NEXT]]
        frames[top, F_NEXT] += 1
        nodes += 1 + (b[i] - a[i] + ov_ptr[i + 1] - ov_ptr[i]) // _WORK_PER_NODE
        if nodes > max_nodes:
            return BUDGET, max_nodes
        o = min_off[i]
        part = frames[top, F_PART]
        trail, tr_top = _log(trail, tr_top, _PLACE, i, 0)
        # Placed at ``o``: under it every section's floor plus the bytes left is
        # ``o`` plus what was left before, at most the capacity (the candidate
        # filter); no other section's floor or bytes rose.
        off[i] = o
        height = o + sizes[i]
        for t in range(a[i], b[i]):
            total[t] -= sizes[i]
        for t in range(a[i], b[i] - 1):
            cuts[t] -= 1
        hatless = True
        raised = tr_top
        for x in range(ov_ptr[i], ov_ptr[i + 1]):
            k = ov_idx[x]
            if off[k] >= 0:
                continue
            hatless = False
            if min_off[k] < height:
                trail, tr_top = _log(trail, tr_top, _MIN_OFFSET, k, min_off[k])
                min_off[k] = height
        frames[top, F_HATLESS] = 1 if hatless else 0
        # The lowest unplaced buffer of a section starts no lower than its minimum
        # offset: a section none of whose unplaced buffers can start low enough for
        # its bytes left cannot be filled. Each section keeps a watch, a buffer that
        # can (restored on backtracking, so valid in the current state): only
        # sections under this buffer, or whose watch was raised, need a look.
        fits = True
        if floors:
            raised_end = tr_top
            y = raised - 1  # the placed buffer's sections first, then the raised ones'
            while fits and y < raised_end:
                k = i if y < raised else trail[y, 1]
                y += 1
                if k != i and watching[k] == 0:
                    continue
                for t in range(a[k], b[k]):
                    w = watch[t]
                    if k != i and w != k:
                        continue  # its watch stays valid: nothing it reads changed
                    if not _can_fill(t, capacity, total, off, min_off, watch, cov_ptr,
                                     cov_idx):
                        fits = False
                        break
                    if watch[t] != w:
                        watching[w] -= 1
                        watching[watch[t]] += 1
                        trail, tr_top = _log(trail, tr_top, _WATCH, t, w)
        if not fits:
            continue
        # Boundaries this placement left uncrossed split the part.
        lo, hi = parts[part, P_LO], parts[part, P_HI]
        split = False
        if rules & DECOMPOSE:
            for t in range(max(a[i], lo), min(b[i], hi) - 1):
                if cuts[t] == 0:
                    split = True
                    break
        if not split:
            frames, top = _push_frame(frames, top, part, 0, o, rank[i])
            continue
        first_new = p_top
        parts, p_top, pool, pool_top, trail, tr_top = _split(
            top, lo, hi, parts[part, P_START], parts[part, P_COUNT], parts, p_top, pool,
            pool_top, trail, tr_top, cuts, off, sizes, width, a, b, total, order_code, rank)
        if p_top == first_new:  # nothing left in the part: a frame that finds it solved
            frames, top = _push_frame(frames, top, part, 0, o, rank[i])
        else:
            frames, top = _push_frame(frames, top, first_new, 1, 0, -1)
