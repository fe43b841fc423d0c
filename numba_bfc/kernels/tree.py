"""Ordered free sets: one treap per bin, kept in the chunk table's link fields.

Each bin orders its free chunks by ``(size, ptr)``, as TF's ``std::set`` with
its ``ChunkComparator`` does, so walking a bin in order visits chunks smallest
first and lowest address first among equals. A treap (a BST that is also a
heap on a pseudo-random priority) keeps that order with O(log n) expected
insert, remove and lower-bound, with no memory beyond three links per chunk.
Priorities are a hash of the chunk's address, so the tree's shape depends only
on which chunks are free, not on the order operations happened in.

The offline planner keeps its ordered sets in the same trees: any table with
the chunk table's ``size``, ``ptr``, ``priority`` and link fields will do
(``ordered_set`` makes one), with ``(size, ptr)`` read as a two-part key.
"""

from __future__ import annotations

import numpy as np

from .fields import field, set_field
from .jit import inner, njit
from .layout import BIN_DTYPE, CHUNK_DTYPE, NO_HANDLE


@njit(cache=True)
def ordered_set(capacity):
    """A node table of ``capacity`` rows and a one-bin table holding its empty set.

    For ordered sets outside an allocator (the planner's pools): insert node
    ``h`` under the key ``(k1, k2)`` by setting its ``size`` to ``k1`` and its
    ``ptr`` to ``k2``, then ``tree_insert(nodes, pool, 0, h)``; the root is
    ``field(pool, 0, "root")``.
    """
    nodes = np.empty(max(capacity, 1), dtype=CHUNK_DTYPE)
    pool = np.zeros(1, dtype=BIN_DTYPE)
    set_field(pool, 0, "root", NO_HANDLE)
    return nodes, pool


@njit(cache=True, inline="always")
def chunk_priority(ptr):
    """SplitMix64 of the address, as a non-negative int64 heap priority."""
    z = np.uint64(ptr) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return np.int64(z >> np.uint64(1))


@njit(cache=True, inline="always")
def _key_less(chunks, a, b):
    sa = field(chunks, a, "size")
    sb = field(chunks, b, "size")
    if sa != sb:
        return sa < sb
    return field(chunks, a, "ptr") < field(chunks, b, "ptr")


@inner
def _rotate_up(chunks, bins, b, h):
    # Lift h above its parent p, keeping in-order sequence intact.
    p = field(chunks, h, "parent")
    g = field(chunks, p, "parent")
    if field(chunks, p, "left") == h:
        child = field(chunks, h, "right")
        set_field(chunks, p, "left", child)
        if child != NO_HANDLE:
            set_field(chunks, child, "parent", p)
        set_field(chunks, h, "right", p)
    else:
        child = field(chunks, h, "left")
        set_field(chunks, p, "right", child)
        if child != NO_HANDLE:
            set_field(chunks, child, "parent", p)
        set_field(chunks, h, "left", p)
    set_field(chunks, p, "parent", h)
    set_field(chunks, h, "parent", g)
    if g == NO_HANDLE:
        set_field(bins, b, "root", h)
    elif field(chunks, g, "left") == p:
        set_field(chunks, g, "left", h)
    else:
        set_field(chunks, g, "right", h)


@inner
def tree_insert(chunks, bins, b, h):
    """Insert free chunk ``h`` into bin ``b``'s ordered set."""
    set_field(chunks, h, "left", NO_HANDLE)
    set_field(chunks, h, "right", NO_HANDLE)
    set_field(chunks, h, "priority", chunk_priority(field(chunks, h, "ptr")))
    root = field(bins, b, "root")
    if root == NO_HANDLE:
        set_field(chunks, h, "parent", NO_HANDLE)
        set_field(bins, b, "root", h)
        return
    x = root
    while True:
        if _key_less(chunks, h, x):
            nxt = field(chunks, x, "left")
            if nxt == NO_HANDLE:
                set_field(chunks, x, "left", h)
                break
        else:
            nxt = field(chunks, x, "right")
            if nxt == NO_HANDLE:
                set_field(chunks, x, "right", h)
                break
        x = nxt
    set_field(chunks, h, "parent", x)
    prio = field(chunks, h, "priority")
    while True:
        p = field(chunks, h, "parent")
        if p == NO_HANDLE or field(chunks, p, "priority") >= prio:
            break
        _rotate_up(chunks, bins, b, h)


@inner
def tree_remove(chunks, bins, b, h):
    """Remove chunk ``h`` from bin ``b``'s ordered set."""
    # Rotate h down until it has at most one child, then splice it out.
    while field(chunks, h, "left") != NO_HANDLE and field(chunks, h, "right") != NO_HANDLE:
        lft = np.int64(field(chunks, h, "left"))
        rgt = np.int64(field(chunks, h, "right"))
        if field(chunks, lft, "priority") > field(chunks, rgt, "priority"):
            _rotate_up(chunks, bins, b, lft)
        else:
            _rotate_up(chunks, bins, b, rgt)
    child = field(chunks, h, "left")
    if child == NO_HANDLE:
        child = field(chunks, h, "right")
    p = field(chunks, h, "parent")
    if child != NO_HANDLE:
        set_field(chunks, child, "parent", p)
    if p == NO_HANDLE:
        set_field(bins, b, "root", child)
    elif field(chunks, p, "left") == h:
        set_field(chunks, p, "left", child)
    else:
        set_field(chunks, p, "right", child)
    set_field(chunks, h, "left", NO_HANDLE)
    set_field(chunks, h, "right", NO_HANDLE)
    set_field(chunks, h, "parent", NO_HANDLE)


@inner
def tree_lower_bound(chunks, root, size):
    """First chunk in order with ``size >= size`` (ties: lowest address), or -1."""
    best = NO_HANDLE
    x = root
    while x != NO_HANDLE:
        if field(chunks, x, "size") >= size:
            best = x
            x = field(chunks, x, "left")
        else:
            x = field(chunks, x, "right")
    return best


@inner
def tree_successor(chunks, h):
    """Next chunk in ``(size, ptr)`` order after ``h`` in the same bin, or -1."""
    x = field(chunks, h, "right")
    if x != NO_HANDLE:
        while field(chunks, x, "left") != NO_HANDLE:
            x = field(chunks, x, "left")
        return x
    x = h
    p = field(chunks, x, "parent")
    while p != NO_HANDLE and field(chunks, p, "right") == x:
        x = p
        p = field(chunks, x, "parent")
    return p


# Inlined by Numba: a function compiled on its own costs more at a cold start
# than its few statements typed in each caller.
@njit(cache=True, inline="always")
def tree_max(chunks, root):
    """Last chunk in order (the largest, highest address among equals), or -1."""
    x = root
    if x == NO_HANDLE:
        return x
    while field(chunks, x, "right") != NO_HANDLE:
        x = field(chunks, x, "right")
    return x


@njit(cache=True, inline="always")
def _key_below(chunks, a, size, ptr):
    sa = field(chunks, a, "size")
    return sa < size or (sa == size and field(chunks, a, "ptr") < ptr)


@njit(cache=True, inline="always")
def _key_bound(chunks, root, size, ptr, below):
    # The last node seen on the side the bound lies: below or at-or-above the key.
    best = NO_HANDLE
    x = root
    while x != NO_HANDLE:
        if _key_below(chunks, x, size, ptr):
            if below:
                best = x
            x = field(chunks, x, "right")
        else:
            if not below:
                best = x
            x = field(chunks, x, "left")
    return best


@inner
def tree_key_lower_bound(chunks, root, size, ptr):
    """First node in order with key ``>= (size, ptr)``, or -1."""
    return _key_bound(chunks, root, size, ptr, False)


@inner
def tree_key_before(chunks, root, size, ptr):
    """Last node in order with key ``< (size, ptr)``, or -1."""
    return _key_bound(chunks, root, size, ptr, True)


@inner
def tree_min(chunks, root):
    """First node in order (the smallest key), or -1."""
    x = root
    if x == NO_HANDLE:
        return x
    while field(chunks, x, "left") != NO_HANDLE:
        x = field(chunks, x, "left")
    return x
