"""The shared kernels against plain-Python models: ordered sets, pointer map, bins."""

import random

import numpy as np
import pytest
from sortedcontainers import SortedList

from numba_bfc.kernels import layout as L
from numba_bfc.kernels.chunks import bin_for_size, insert_free, new_row, remove_free
from numba_bfc.kernels.ptrmap import map_insert, map_lookup, map_rehash, map_remove
from numba_bfc.kernels.tree import tree_lower_bound, tree_max, tree_successor


def _in_order(chunks, bins, b):
    h = tree_lower_bound(chunks, bins[b]["root"], 0)
    out = []
    while h != -1:
        out.append((int(chunks[h]["size"]), int(chunks[h]["ptr"])))
        h = tree_successor(chunks, h)
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
            remove_free(chunks, bins, handles.pop(key))
            model.remove(key)
        else:
            size = 256 * rng.randint(1, 8)  # many equal sizes: ties broken by address
            ptr = 256 * rng.randint(1, 1 << 20)
            if (size, ptr) in handles:
                continue
            h = new_row(chunks, state)
            chunks[h]["size"], chunks[h]["ptr"], chunks[h]["region"] = size, ptr, 0
            insert_free(chunks, bins, regions, state, h)
            handles[(size, ptr)] = h
            model.add((size, ptr))
        assert bins[0]["num_chunks"] == len(model)
    assert _in_order(chunks, bins, 0) == list(model)
    for want in range(0, 256 * 10, 256):
        h = tree_lower_bound(chunks, bins[0]["root"], want)
        i = model.bisect_left((want, -1))
        expect = model[i] if i < len(model) else None
        got = None if h == -1 else (int(chunks[h]["size"]), int(chunks[h]["ptr"]))
        assert got == expect
    top = tree_max(chunks, bins[0]["root"])
    assert (int(chunks[top]["size"]), int(chunks[top]["ptr"])) == model[-1]


def test_pointer_map_matches_dict():
    rng = random.Random(5)
    pmap = np.zeros((1 << 14, 2), dtype=np.int64)
    state = np.zeros(L.STATE_SIZE, dtype=np.int64)
    model = {}
    for i in range(20000):
        if model and rng.random() < 0.5:
            key = rng.choice(list(model))
            assert map_remove(pmap, state, key) == model.pop(key)
        elif len(model) < (1 << 13) - 1:
            key = 256 * rng.randint(1, 1 << 30)
            if key not in model:
                map_insert(pmap, state, key, i)
                model[key] = i
        assert state[L.S_MAP_COUNT] == len(model)
    for key, h in model.items():
        assert map_lookup(pmap, key) == h
    assert map_lookup(pmap, 256 * 3 + 7) == -1
    assert map_remove(pmap, state, 12345 * 256 + 1) == -1
    bigger = np.zeros((1 << 15, 2), dtype=np.int64)
    map_rehash(pmap, bigger, state)
    assert all(map_lookup(bigger, k) == h for k, h in model.items())
    assert state[L.S_MAP_COUNT] == len(model)


@pytest.mark.parametrize(
    "n", [0, 1, 255, 256, 511, 512, 1023, 1024, 3 << 20, 256 << 19, (256 << 20) - 1,
          256 << 20, 1 << 40],
)
def test_bin_for_size_is_tf_formula(n):
    import math

    expect = min(20, int(math.floor(math.log2(max(n, 256) >> 8))))
    assert bin_for_size(n, 256, 21) == expect
