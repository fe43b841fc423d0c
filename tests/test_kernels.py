"""The shared kernels against plain-Python models: ordered sets, pointer map, bins."""

import random
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit
from sortedcontainers import SortedList

from numba_bfc.kernels import layout as L
from numba_bfc.kernels.chunks import (
    bin_for_size,
    insert_free,
    new_row,
    next_nonempty_bin,
    remove_free,
)
from numba_bfc.kernels.fields import field, set_field
from numba_bfc.kernels.ptrmap import map_insert, map_lookup, map_rehash, map_remove
from numba_bfc.kernels.tree import (
    chunk_priority,
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
from numba_bfc.testing.invariants import _check_tree


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
_next_nonempty_bin = _from_python(next_nonempty_bin)


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
    for step in range(3000):
        if handles and rng.random() < 0.45:
            key = rng.choice(list(handles))
            _remove_free(chunks, bins, state, handles.pop(key))
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
        assert state[L.S_NONEMPTY_BINS] == (1 if model else 0)
        if step % 100 == 0:  # links, heap order on the address hashes, key order
            assert len(_check_tree(chunks, bins, 0)) == len(model)
            assert all(chunks[h]["priority"] == chunk_priority(ptr)
                       for (_, ptr), h in handles.items())
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
    walk = np.empty((capacity, 2), dtype=np.int64)
    h = tree_min(nodes, root)
    k = 0
    while h != -1 and k < walk.shape[0]:
        walk[k, 0] = nodes[h]["size"]
        walk[k, 1] = nodes[h]["ptr"]
        k += 1
        h = tree_successor(nodes, h)
    walk = walk[:k]
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


def test_the_shared_state_slots_are_distinct_and_below_the_policies_slots():
    """Every ``S_*`` slot of ``layout`` is its own, below ``STATE_SIZE`` (where
    the policies' own slots start), and a fresh state records its length."""
    slots = {name: value for name, value in vars(L).items()
             if name.startswith("S_") and isinstance(value, int)}
    assert len(set(slots.values())) == len(slots), slots
    assert all(0 <= value < L.STATE_SIZE for value in slots.values()), slots
    state = L.new_tables(4, 256, state_size=L.STATE_SIZE + 7)[4]
    assert state[L.S_STATE_SLOTS] == state.shape[0] == L.STATE_SIZE + 7


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


# kernels.fields: one field of one row, as NumPy's table[row][name] for rows in range.
_ROWS = np.dtype([("ptr", np.int64), ("bin", np.int32), ("flag", np.bool_), ("ratio", np.float64)])


@njit
def _copy_fields(src, dst, rows, out):
    # Reads every field of src's rows into out, then writes them back to dst's.
    for i in range(rows.shape[0]):
        r = rows[i]
        out[i, 0] = field(src, r, "ptr")
        out[i, 1] = field(src, r, "bin")
        out[i, 2] = field(src, r, "flag")
        out[i, 3] = field(src, r, "ratio")
        set_field(dst, r, "ptr", field(src, r, "ptr"))
        set_field(dst, r, "bin", field(src, r, "bin"))
        set_field(dst, r, "flag", field(src, r, "flag"))
        set_field(dst, r, "ratio", field(src, r, "ratio"))


@njit
def _store_int64(table, row, value):
    set_field(table, row, "bin", value)  # an int32 field: truncated, as NumPy's assignment
    set_field(table, row, "ptr", value)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.data())
def test_fields_read_and_write_as_numpy_indexing(n, data):
    src = np.zeros(2 * n, dtype=_ROWS)
    for name, strategy in (("ptr", st.integers(-(2**63), 2**63 - 1)),
                           ("bin", st.integers(-(2**31), 2**31 - 1)),
                           ("flag", st.booleans()),
                           ("ratio", st.floats(allow_nan=False))):
        src[name] = data.draw(st.lists(strategy, min_size=2 * n, max_size=2 * n))
    rows = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3 * n)))
    # Every other row: a view with a stride, not C-contiguous.
    for table in (src[:n].copy(), src[::2]):
        dst = np.zeros(2 * n, dtype=_ROWS)[::2]  # written with a stride too
        out = np.zeros((rows.shape[0], 4))
        _copy_fields(table, dst, rows, out)
        expected = np.zeros(n, dtype=_ROWS)
        for i, r in enumerate(rows):
            assert out[i, 0] == np.float64(table[r]["ptr"])
            assert out[i, 1] == table[r]["bin"]
            assert out[i, 2] == table[r]["flag"]
            assert out[i, 3] == table[r]["ratio"]
            expected[r] = table[r]
        assert dst.tobytes() == expected.tobytes()


@pytest.mark.parametrize("value", [0, 7, -1, 2**31, 2**40 + 5, -(2**63)])
def test_set_field_converts_as_numpy_assignment(value):
    table = np.zeros(2, dtype=_ROWS)
    expected = table.copy()
    _store_int64(table, np.int64(1), np.int64(value))
    with np.errstate(over="ignore"):
        expected[1]["bin"] = np.int64(value).astype(np.int32)
    expected[1]["ptr"] = value
    assert table.tobytes() == expected.tobytes()
    # From Python they are the plain expressions (a negative row counts from the end).
    assert field(table, -1, "ptr") == value
    set_field(table, -2, "ptr", 3)
    assert table[0]["ptr"] == 3


def test_a_field_that_is_not_there_is_a_typing_error_naming_it():
    from numba.core.errors import TypingError

    @njit
    def read(table):
        return field(table, 0, "size")

    with pytest.raises(TypingError, match="no field 'size'"):
        read(np.zeros(1, dtype=_ROWS))


def test_fields_check_bounds_under_numba_boundscheck(tmp_path):
    import subprocess
    import sys

    script = (
        "import numpy as np\n"
        "from numba import njit\n"
        "from numba_bfc.kernels.fields import field, set_field\n"
        "read = njit(lambda t, r: field(t, r, 'ptr'))\n"
        "write = njit(lambda t, r: set_field(t, r, 'ptr', 1))\n"
        "t = np.zeros(3, dtype=[('ptr', np.int64)])\n"
        "for f in (read, write):\n"
        "    for r in (3, -1):\n"
        "        try:\n"
        "            f(t, r)\n"
        "        except IndexError:\n"
        "            continue\n"
        "        raise SystemExit(f'row {r} passed')\n"
        "assert read(t, 2) == 0 and t['ptr'].sum() == 0\n"
        "print('ok')\n"
    )
    env = {**__import__("os").environ, "NUMBA_BOUNDSCHECK": "1", "NUMBA_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize("num_bins", [0, -1, L.MAX_BINS + 1])
def test_tables_have_at_most_one_bin_per_bit_of_the_bitmap(num_bins):
    with pytest.raises(ValueError, match="num_bins must be from 1 to 64"):
        L.new_tables(num_bins, 256)


def test_tables_of_spaces_repeat_the_size_bins_in_each_space():
    _, bins, _, _, state, _ = L.new_tables(6, 512, space_bins=3)
    assert bins["bin_size"].tolist() == [512, 1024, 2048] * 2
    assert state[L.S_SPACE_BINS] == 3
    _, bins, _, _, state, _ = L.new_tables(3, 256)
    assert bins["bin_size"].tolist() == [256, 512, 1024] and state[L.S_SPACE_BINS] == 0


def test_fresh_tables_are_copies_that_share_nothing():
    """``new_tables`` copies one set made per set of arguments: each call's
    tables are writable, laid out as the first, and a change to one set
    (a kernel's work) reaches no other, nor the sets after."""
    first = L.new_tables(21, 256, state_size=L.STATE_SIZE + 3)
    chunks, bins, regions, pmap, state, tsq = first
    before = [table.tobytes() for table in first]
    assert state[L.S_FREE_ROWS] == chunks.shape[0] == 1024 and state[L.S_FREE_HEAD] == 0
    assert chunks["next"][:3].tolist() == [1, 2, 3] and chunks["next"][-1] == L.NO_HANDLE
    for table in first:
        assert table.flags.writeable and table.flags.c_contiguous
        table.view(np.uint8)[:] = 0x5A  # everything changed
    second = L.new_tables(21, 256, state_size=L.STATE_SIZE + 3)
    assert [table.tobytes() for table in second] == before
    assert [t.dtype for t in second] == [t.dtype for t in first]
    assert [t.shape for t in second] == [t.shape for t in first]
    assert not any(np.shares_memory(a, b) for a in first for b in second)


def test_grown_tables_keep_every_row_and_chain_the_new_ones():
    """The chunk and region tables double, their rows copied as bytes: every
    old row as it was, the new chunk rows on the free-row list before the old
    head, the new region rows empty."""
    chunks, _, regions, _, state, _ = L.new_tables(21, 256, chunk_rows=8, region_rows=4)
    rng = np.random.default_rng(7)
    for table in (chunks, regions):
        table.view(np.uint8)[:] = rng.integers(0, 256, table.nbytes, dtype=np.uint8)
    state[L.S_FREE_HEAD], state[L.S_FREE_ROWS] = 3, 5
    grown = L.grow_chunks(chunks, state)
    assert grown[:8].tobytes() == chunks.tobytes() and grown.shape == (16,)
    assert state[L.S_FREE_HEAD] == 8 and state[L.S_FREE_ROWS] == 13
    assert grown["next"][8:].tolist() == [*range(9, 16), 3]
    assert (grown["allocation_id"][8:] == -1).all()
    for name in L.CHUNK_DTYPE.names:  # an unused row: no links, nothing else
        unused = {"allocation_id": -1, "next": None}.get(
            name, L.NO_HANDLE if name in ("prev", "left", "right", "parent", "bin", "region")
            else 0)
        assert unused is None or (grown[name][8:] == unused).all(), name
    grown_regions = L.grow_regions(regions)
    assert grown_regions[:4].tobytes() == regions.tobytes()
    assert grown_regions[4:].tobytes() == L.new_tables(21, 256, region_rows=4)[2].tobytes()


@settings(max_examples=300, deadline=None)
@given(bits=st.integers(0, 2**64 - 1), b=st.integers(0, 64), stop=st.integers(0, 64))
def test_next_nonempty_bin_is_the_first_bit_set_from_b_before_stop(bits, b, stop):
    state = np.zeros(L.STATE_SIZE, dtype=np.int64)
    state[L.S_NONEMPTY_BINS] = np.uint64(bits).view(np.int64)
    expect = next((k for k in range(b, stop) if bits >> k & 1), stop)
    assert _next_nonempty_bin(state, b, stop) == expect


@pytest.mark.parametrize("bad", [0, -256, 384, 1000])
def test_tables_round_to_a_power_of_two_only(bad):
    # The kernels round with masks (kernels.chunks.round_up): any other rounding is refused.
    with pytest.raises(ValueError, match="power of two"):
        L.new_tables(21, bad)


@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 4095, 4096, 2**40 + 3])
@pytest.mark.parametrize("quantum", [256, 512, 2 << 20])
def test_round_up_and_bins_match_the_division_forms(n, quantum):
    """The mask and logarithm forms of the kernels give what TF's divisions give."""
    from numba_bfc.kernels.chunks import round_up, round_up_to_multiple

    assert round_up(n, quantum) == round_up_to_multiple(n, quantum) == -(-n // quantum) * quantum
    # Compact's growth quanta (pages that are whole backend granules) need not be powers of two.
    step = 3 * quantum
    assert round_up_to_multiple(n, step) == -(-n // step) * step
    expected = min(20, (max(n, quantum) // quantum).bit_length() - 1)
    assert _bin_for_size(np.int64(n), np.int64(quantum), np.int64(21)) == expected


def test_a_field_name_that_is_not_a_constant_is_a_typing_error():
    from numba.core.errors import TypingError

    @njit
    def read(table, name):
        return field(table, 0, name)

    with pytest.raises(TypingError, match="field name must be a string constant"):
        read(np.zeros(1, dtype=_ROWS), "ptr")


# Kernels compile without reference counting (kernels.jit): what that allows and refuses.
def _owning_nothing_or_skip():
    from numba_bfc.kernels import jit

    if not jit.owning_nothing:
        pytest.skip("Numba's internals for kernels without reference counting are missing")
    return jit


def test_the_allocator_kernels_count_no_references():
    jit = _owning_nothing_or_skip()
    from numba_bfc.kernels.operations import live_chunk_op
    from numba_bfc.policies.batch import run_batch_bfc
    from numba_bfc.policies.bfc import bfc_allocate_op
    from numba_bfc.policies.caching import round_size
    from numba_bfc.policies.compact import compact_allocate

    for kernel in (bfc_allocate_op, run_batch_bfc, live_chunk_op, round_size, compact_allocate):
        assert kernel.targetoptions["_nrt"] is False, kernel
    assert jit.owning_nothing["_nrt"] is False


def test_a_kernel_that_would_return_an_array_is_refused_when_typed():
    jit = _owning_nothing_or_skip()
    from numba.core.errors import TypingError

    @jit.operation
    def hands_back(table):
        return table

    @jit.helper
    def hands_back_in_a_tuple(table, n):
        return n, table[:n]

    @jit.inner
    def passes_on(table):
        return table

    @jit.operation
    def through_an_inner_helper(table):
        return passes_on(table)[0]

    table = np.arange(4, dtype=np.int64)
    for call in (lambda: hands_back(table), lambda: hands_back_in_a_tuple(table, 2),
                 lambda: through_an_inner_helper(table)):
        with pytest.raises(TypingError, match="cannot return an array"):
            call()


def test_a_kernel_reads_and_writes_arrays_it_is_given_and_makes_none(tmp_path, monkeypatch):
    jit = _owning_nothing_or_skip()
    from numba.core import config
    from numba.core.errors import TypingError

    # A cache of this test's own, empty: machine code loaded from a cache cannot be inspected.
    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path))

    @jit.inner
    def total(table, n):
        s = 0
        for i in range(n):
            s += table[i]
        return s

    @jit.operation
    def total_and_mark(table, out):
        out[0] = total(table, table.shape[0])
        return out[0] * 2

    @jit.operation
    def makes_one(n):
        return np.zeros(n).shape[0]

    @njit(cache=True)
    def counting_twin(table, out):
        out[0] = table.shape[0]
        return out[0]

    table, out = np.arange(10, dtype=np.int64), np.zeros(1, dtype=np.int64)
    before = sys.getrefcount(table), sys.getrefcount(out)
    for _ in range(1000):
        assert total_and_mark(table, out) == 90 and out[0] == 45
    assert (sys.getrefcount(table), sys.getrefcount(out)) == before
    # No reference counting in the machine code, kernel and wrapper alike, where
    # Numba's default counts (adapting each array from Python, releasing it after).
    assert counting_twin(table, out) == 10
    assert "NRT_" in "".join(counting_twin.inspect_llvm().values())
    assert "NRT_" not in "".join(total_and_mark.inspect_llvm().values())
    with pytest.raises(TypingError):  # Numba refuses an array made without NRT
        makes_one(3)


def test_a_counting_function_a_kernel_compiles_first_still_counts(tmp_path, monkeypatch):
    # Numba takes the flag from the caller when a function does not set it: a
    # plain kernels.jit.njit function first compiled from a kernel would count
    # nothing, then serve callers that count (and the cache) that way.
    jit = _owning_nothing_or_skip()
    from numba.core import config

    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path))  # inspectable: compiled here

    @jit.njit(cache=True)
    def first_item(table):
        return table[0]

    @jit.operation
    def through_a_counting_function(table):
        return first_item(table)

    table = np.arange(3, dtype=np.int64) + 7
    assert through_a_counting_function(table) == 7
    assert first_item.targetoptions["_nrt"] is True
    assert "NRT_" in "".join(first_item.inspect_llvm().values())
    assert "NRT_" not in "".join(through_a_counting_function.inspect_llvm().values())
