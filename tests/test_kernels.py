"""The shared kernels against plain-Python models: ordered sets, pointer map, bins."""

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit
from sortedcontainers import SortedList

from numba_bfc.kernels import layout as L
from numba_bfc.kernels.chunks import bin_for_size, insert_free, new_row, remove_free
from numba_bfc.kernels.ptrmap import map_insert, map_lookup, map_rehash, map_remove
from numba_bfc.kernels.tree import (
    ordered_set,
    tree_insert,
    tree_key_before,
    tree_key_lower_bound,
    tree_lower_bound,
    tree_max,
    tree_min,
    tree_remove,
    tree_successor,
)


# The helpers have no Python entry point (kernels.jit.inner): the tests below
# call them through a kernel each, which compiles them as the operations do.
def _from_python(helper):
    return njit(lambda *args: helper(*args))


_tree_lower_bound = _from_python(tree_lower_bound)
_tree_successor = _from_python(tree_successor)
_remove_free = _from_python(remove_free)
_new_row = _from_python(new_row)
_insert_free = _from_python(insert_free)
_map_remove = _from_python(map_remove)
_map_insert = _from_python(map_insert)
_map_lookup = _from_python(map_lookup)
_map_rehash = _from_python(map_rehash)
_bin_for_size = _from_python(bin_for_size)


def _in_order(chunks, bins, b):
    h = _tree_lower_bound(chunks, bins[b]["root"], 0)
    out = []
    while h != -1:
        out.append((int(chunks[h]["size"]), int(chunks[h]["ptr"])))
        h = _tree_successor(chunks, h)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_treap_matches_sorted_list(seed):
    rng = random.Random(seed)
    chunks, bins, regions, pmap, state, tsq = L.new_tables(1, 256, chunk_rows=4096)
    model = SortedList()
    handles = {}
    for _ in range(3000):
        if handles and rng.random() < 0.45:
            key = rng.choice(list(handles))
            _remove_free(chunks, bins, handles.pop(key))
            model.remove(key)
        else:
            size = 256 * rng.randint(1, 8)  # many equal sizes: ties broken by address
            ptr = 256 * rng.randint(1, 1 << 20)
            if (size, ptr) in handles:
                continue
            h = _new_row(chunks, state)
            chunks[h]["size"], chunks[h]["ptr"], chunks[h]["region"] = size, ptr, 0
            _insert_free(chunks, bins, regions, state, h)
            handles[(size, ptr)] = h
            model.add((size, ptr))
        assert bins[0]["num_chunks"] == len(model)
    assert _in_order(chunks, bins, 0) == list(model)
    for want in range(0, 256 * 10, 256):
        h = _tree_lower_bound(chunks, bins[0]["root"], want)
        i = model.bisect_left((want, -1))
        expect = model[i] if i < len(model) else None
        got = None if h == -1 else (int(chunks[h]["size"]), int(chunks[h]["ptr"]))
        assert got == expect
    top = tree_max(chunks, bins[0]["root"])
    assert (int(chunks[top]["size"]), int(chunks[top]["ptr"])) == model[-1]


@njit(cache=True)
def _exercise_ordered_set(capacity, handles, k1, k2, insert, q1, q2):
    # Everything inside one kernel: tree_insert/tree_remove have no Python wrapper,
    # and the tables (record arrays) never cross into Python.
    nodes, pool = ordered_set(capacity)
    for i in range(handles.shape[0]):
        h = handles[i]
        if insert[i]:
            nodes[h]["size"] = k1[i]
            nodes[h]["ptr"] = k2[i]
            tree_insert(nodes, pool, 0, h)
        else:
            tree_remove(nodes, pool, 0, h)
    root = pool[0]["root"]
    walk = np.empty((pool[0]["num_chunks"], 2), dtype=np.int64)
    h = tree_min(nodes, root)
    k = 0
    while h != -1 and k < walk.shape[0]:
        walk[k, 0] = nodes[h]["size"]
        walk[k, 1] = nodes[h]["ptr"]
        k += 1
        h = tree_successor(nodes, h)
    ends_at = h  # -1 once the walk has seen every node
    found = np.full((q1.shape[0], 2), -1, dtype=np.int64)  # rank in walk order, or -1
    for q in range(q1.shape[0]):
        at = tree_key_lower_bound(nodes, root, q1[q], q2[q])
        before = tree_key_before(nodes, root, q1[q], q2[q])
        for j, x in enumerate((at, before)):
            if x != -1:
                for r in range(walk.shape[0]):
                    if walk[r, 0] == nodes[x]["size"] and walk[r, 1] == nodes[x]["ptr"]:
                        found[q, j] = r
    return walk, ends_at, found


_KEYS = st.tuples(st.integers(-3, 3), st.integers(-(2**62), 2**62))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), _KEYS), max_size=120), st.lists(_KEYS, max_size=20))
def test_ordered_set_with_two_part_keys_matches_sorted_list(ops, queries):
    # The planner's use of the allocators' treap: any int64 pairs as keys.
    model = SortedList()
    where = {}
    handles, k1, k2, insert = [], [], [], []
    for row, (add, key) in enumerate(ops):
        if add and key not in where:
            where[key] = row
            model.add(key)
            handles.append(row)
        elif not add and model:
            key = model[len(model) // 2]
            model.remove(key)
            handles.append(where.pop(key))
        else:
            continue
        k1.append(key[0])
        k2.append(key[1])
        insert.append(add and key in where)
    q = np.array(queries, dtype=np.int64).reshape(-1, 2)
    walk, ends_at, found = _exercise_ordered_set(
        len(ops), np.array(handles, dtype=np.int64), np.array(k1, dtype=np.int64),
        np.array(k2, dtype=np.int64), np.array(insert, dtype=np.bool_),
        q[:, 0].copy(), q[:, 1].copy())
    assert [tuple(map(int, r)) for r in walk] == list(model) and ends_at == -1
    for (at, before), key in zip(found.tolist(), queries):
        i = model.bisect_left(key)
        assert at == (i if i < len(model) else -1)
        assert before == i - 1


def test_pointer_map_matches_dict():
    rng = random.Random(5)
    pmap = np.zeros((1 << 14, 2), dtype=np.int64)
    state = np.zeros(L.STATE_SIZE, dtype=np.int64)
    model = {}
    for i in range(20000):
        if model and rng.random() < 0.5:
            key = rng.choice(list(model))
            assert _map_remove(pmap, state, key) == model.pop(key)
        elif len(model) < (1 << 13) - 1:
            key = 256 * rng.randint(1, 1 << 30)
            if key not in model:
                _map_insert(pmap, state, key, i)
                model[key] = i
        assert state[L.S_MAP_COUNT] == len(model)
    for key, h in model.items():
        assert _map_lookup(pmap, key) == h
    assert _map_lookup(pmap, 256 * 3 + 7) == -1
    assert _map_remove(pmap, state, 12345 * 256 + 1) == -1
    bigger = np.zeros((1 << 15, 2), dtype=np.int64)
    _map_rehash(pmap, bigger, state)
    assert all(_map_lookup(bigger, k) == h for k, h in model.items())
    assert state[L.S_MAP_COUNT] == len(model)


@pytest.mark.parametrize(
    "n", [0, 1, 255, 256, 511, 512, 1023, 1024, 3 << 20, 256 << 19, (256 << 20) - 1,
          256 << 20, 1 << 40],
)
def test_bin_for_size_is_tf_formula(n):
    import math

    expect = min(20, int(math.floor(math.log2(max(n, 256) >> 8))))
    assert _bin_for_size(n, 256, 21) == expect
