"""Planner benchmarks: njit kernel vs a plain-Python run of the same algorithm.

Run: ``PYTHONPATH=. python -m pytest benchmarks/test_bench_planning.py -q``
(add ``--benchmark-only``/``--benchmark-json`` as usual). The cold/warm test
starts fresh interpreters to time the first call with an empty and with a
filled Numba cache.
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from numba_bfc.planning import as_records, assign_objects, assign_offsets, lower_bound

N = 10_000
ROOT = Path(__file__).resolve().parents[1]


def make_records(n=N, seed=0):
    """A graph-like workload: short lifetimes, sizes in 256-byte steps up to 1 MiB."""
    rng = np.random.default_rng(seed)
    firsts = np.sort(rng.integers(0, 2 * n, n))
    lasts = firsts + rng.integers(0, 50, n)
    sizes = rng.integers(1, 4097, n) * 256
    return as_records(np.column_stack([sizes, firsts, lasts]))


def py_greedy_by_size_offsets(sizes, firsts, lasts, alignment=1):
    """Plain Python, same algorithm as the kernel (segment tree + sorted gaps)."""
    n = len(sizes)
    order = sorted(range(n), key=lambda i: -sizes[i])
    by_first = sorted(range(n), key=lambda i: firsts[i])
    pos = [0] * n
    for k, i in enumerate(by_first):
        pos[i] = k
    sorted_first = [firsts[i] for i in by_first]
    size = 1
    while size < n:
        size *= 2
    tree = [-1] * (2 * size)
    offsets, seq, total = [0] * n, [0] * n, 0
    import bisect

    for step, r in enumerate(order):
        limit = bisect.bisect_right(sorted_first, lasts[r])
        found, stack = [], [(1, 0, size)]
        while stack:
            node, lo, hi = stack.pop()
            if tree[node] < firsts[r] or lo >= limit:
                continue
            if node >= size:
                found.append(by_first[node - size])
            else:
                mid = (lo + hi) // 2
                stack.append((2 * node + 1, mid, hi))
                stack.append((2 * node, lo, mid))
        found.sort(key=lambda a: (offsets[a], seq[a]))
        prev, best_gap, best_off = 0, None, None
        for a in found:
            cur = offsets[a]
            if cur >= prev:
                gap = cur - prev
                if gap >= sizes[r] and (best_gap is None or gap < best_gap):
                    best_gap, best_off = gap, prev
            prev = max(prev, -(-(cur + sizes[a]) // alignment) * alignment)
        if best_off is None:
            best_off = prev
        offsets[r], seq[r] = best_off, step
        total = max(total, best_off + sizes[r])
        i = pos[r] + size
        tree[i] = lasts[r]
        i //= 2
        while i:
            tree[i] = max(tree[2 * i], tree[2 * i + 1])
            i //= 2
    return offsets, total


@pytest.fixture(scope="module")
def records():
    return make_records()


@pytest.fixture(scope="module")
def expected(records):
    cols = [records[f].tolist() for f in ("size", "first", "last")]
    return py_greedy_by_size_offsets(*cols)


def test_offsets_njit(benchmark, records, expected):
    assign_offsets(records[:10], "greedy_by_size")  # compile / load cache outside timing
    result = benchmark(assign_offsets, records, "greedy_by_size")
    assert result.offsets.tolist() == expected[0]
    assert result.total_size == expected[1]
    benchmark.extra_info["ratio_to_lower_bound"] = result.total_size / lower_bound(records)


def test_offsets_plain_python(benchmark, records, expected):
    cols = [records[f].tolist() for f in ("size", "first", "last")]
    result = benchmark.pedantic(py_greedy_by_size_offsets, args=cols, rounds=3, iterations=1)
    assert result == expected


@pytest.mark.parametrize("strategy", ["greedy_in_order", "greedy_by_breadth", "equality"])
def test_objects_njit(benchmark, records, strategy):
    assign_objects(records[:10], strategy)
    result = benchmark(assign_objects, records, strategy)
    assert result.total_size >= lower_bound(records, "objects")


def test_greedy_by_size_objects_njit(benchmark):
    # O(n^2): 2,000 records keeps a round under a second.
    recs = make_records(2_000, seed=1)
    assign_objects(recs[:10], "greedy_by_size")
    result = benchmark.pedantic(assign_objects, args=(recs, "greedy_by_size"), rounds=3)
    assert result.total_size >= lower_bound(recs, "objects")


_FIRST_CALL = """
import time
t0 = time.perf_counter()
import numba_bfc.planning as p
t1 = time.perf_counter()
p.assign_offsets([(16, 0, 1), (8, 1, 2)], "greedy_by_size")
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""


def _first_call(cache_dir):
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", _FIRST_CALL], env=env, capture_output=True, text=True, check=True
    )
    return [float(x) for x in out.stdout.split()]


def test_cold_and_warm_first_call():
    with tempfile.TemporaryDirectory() as cache:
        import_cold, cold = _first_call(cache)  # empty cache: compiles
        import_warm, warm = _first_call(cache)  # filled cache: loads
    print(f"\nimport {import_warm:.3f}s  first call: cold {cold:.2f}s, warm {warm:.3f}s")
    assert warm < cold
