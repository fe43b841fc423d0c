"""BFC and caching-policy speed, always side by side with baselines in the same run.

Run: ``python -m pytest benchmarks/test_bench_bfc.py --benchmark-columns=min,median,mean,rounds``
"""

import random
import subprocess
import sys
import time

import numpy as np
import pytest

from numba_bfc import BFCAllocator, CachingAllocator, CompactAllocator
from numba_bfc.backends import VirtualSubAllocator
from numba_bfc.demo import training_workload
from numba_bfc.testing import ReferenceBFCAllocator, ReferenceCachingAllocator

MiB = 1 << 20
PAIRS = 2000  # alloc+free pairs per benchmark round


def _churn_setup(cls, live_count, seed=0, max_size=4 * MiB):
    """An allocator holding ``live_count`` random allocations, warmed to steady state."""
    a = cls(VirtualSubAllocator(), memory_limit=1 << 44)
    rng = random.Random(seed)
    sizes = [rng.randint(256, max_size) for _ in range(live_count)]
    if hasattr(a, "run_batch") and live_count > 10_000:
        ops = np.zeros(live_count, dtype=np.int8)
        live = a.run_batch(ops, np.arange(live_count), np.array(sizes)).tolist()
    else:
        live = [a.allocate_raw(s) for s in sizes]
    churn = [(rng.randrange(live_count), rng.randint(256, max_size)) for _ in range(PAIRS)]
    # One warm-up pass so the pool has grown to its steady state.
    for slot, size in churn:
        a.deallocate_raw(live[slot])
        live[slot] = a.allocate_raw(size)
    return a, live, churn


def _run_churn(a, live, churn):
    free, alloc = a.deallocate_raw, a.allocate_raw
    for slot, size in churn:
        free(live[slot])
        live[slot] = alloc(size)


ALLOCATORS = [BFCAllocator, ReferenceBFCAllocator, CachingAllocator, ReferenceCachingAllocator]
ALLOCATOR_IDS = ["bfc-numba", "bfc-reference", "caching-numba", "caching-reference"]


@pytest.mark.benchmark(group="pair-1000-live")
@pytest.mark.parametrize("cls", ALLOCATORS, ids=ALLOCATOR_IDS)
def test_alloc_free_pair_1000_live(benchmark, cls):
    """Free one of ~1000 live allocations and allocate 256 B - 4 MiB in its place."""
    a, live, churn = _churn_setup(cls, 1000)
    benchmark.extra_info["pairs_per_round"] = PAIRS
    benchmark(_run_churn, a, live, churn)


@pytest.mark.benchmark(group="pair-scaling")
@pytest.mark.parametrize("live_count", [1000, 1_000_000], ids=["1k-live", "1M-live"])
@pytest.mark.parametrize("cls", [BFCAllocator, CachingAllocator], ids=["bfc", "caching"])
def test_pair_scaling(benchmark, cls, live_count):
    """Per-pair time with 1,000,000 live chunks against 1,000, same sizes (256 B - 4 KiB)."""
    a, live, churn = _churn_setup(cls, live_count, max_size=4096)
    benchmark.extra_info["pairs_per_round"] = PAIRS
    benchmark(_run_churn, a, live, churn)


def _run_churn_on_kernels(a, live, churn):
    """``_run_churn`` calling the compiled kernels the API's fast path calls
    (``TableStore._arm_fast_paths``), with the arguments it passes, and no
    Python method around them."""
    address, allocate, _ = a._fast_allocate
    _, deallocate, _ = a._fast_deallocate
    for slot, size in churn:
        deallocate(address, live[slot], False)
        live[slot] = allocate(address, size, False)


@pytest.mark.benchmark(group="pair-parts")
@pytest.mark.parametrize("calls", ["api", "api-python-methods", "kernels"])
@pytest.mark.parametrize("cls", [BFCAllocator, CachingAllocator, CompactAllocator],
                         ids=["bfc", "caching", "compact"])
def test_pair_parts(benchmark, cls, calls, monkeypatch):
    """The allocate+free pair of ``pair-scaling`` (1,000 live, 256 B - 4 KiB)
    through the API (with the compiled bridge, ``allocators._fastcall``), through
    the API's Python methods (``NUMBA_BFC_NATIVE_CALLS=0``), and through the
    compiled kernels the Python methods call, called directly: the differences
    are the Python methods' share and what the bridge saves of it."""
    if calls == "api-python-methods":
        monkeypatch.setenv("NUMBA_BFC_NATIVE_CALLS", "0")
    a, live, churn = _churn_setup(cls, 1000, max_size=4096)
    benchmark.extra_info["pairs_per_round"] = PAIRS
    benchmark(_run_churn_on_kernels if calls == "kernels" else _run_churn, a, live, churn)


@pytest.mark.benchmark(group="lookup")
@pytest.mark.parametrize("path", ["lock-free", "under-the-lock"])
@pytest.mark.parametrize("cls", [BFCAllocator, CachingAllocator, CompactAllocator],
                         ids=["bfc", "caching", "compact"])
def test_allocated_size(benchmark, cls, path):
    """``allocated_size`` of 1,000 live allocations: as called, lock-free,
    and with the caller holding the allocator's lock, so that the kernel steps
    aside and the façade answers under the lock (re-entered: no pause of the
    garbage collector, which taking the lock from rest adds)."""
    a, live, _ = _churn_setup(cls, 1000, max_size=4096)
    size = a.allocated_size
    benchmark.extra_info["lookups_per_round"] = len(live)

    def run():
        for p in live:
            size(p)

    if path == "lock-free":
        benchmark(run)
    else:
        with a._lock:
            benchmark(run)


@pytest.mark.benchmark(group="batch")
@pytest.mark.parametrize("mode", ["batch", "per-call"])
@pytest.mark.parametrize("cls", [BFCAllocator, CachingAllocator], ids=["bfc", "caching"])
def test_batch_throughput(benchmark, cls, mode):
    """1,000,000 operations (random churn, ~1000 live) in one kernel call vs one call each."""
    rng = np.random.default_rng(0)
    n = 1_000_000 if mode == "batch" else 100_000
    ops = np.zeros(n, dtype=np.int8)
    ids = np.zeros(n, dtype=np.int64)
    live, next_id = [], 0
    for i in range(n):
        if len(live) > 1000 or (live and rng.random() < 0.5):
            ops[i] = 1
            ids[i] = live.pop(int(rng.integers(len(live))))
        else:
            ids[i] = next_id
            live.append(next_id)
            next_id += 1
    sizes = np.where(ops == 0, rng.integers(256, 4 * MiB, n), 0)
    benchmark.extra_info["operations"] = n

    def run():
        a = cls(VirtualSubAllocator(), memory_limit=1 << 44)
        if mode == "batch":
            a.run_batch(ops, ids, sizes)
        else:
            addr = {}
            for op, i, s in zip(ops.tolist(), ids.tolist(), sizes.tolist()):
                if op == 0:
                    addr[i] = a.allocate_raw(s)
                else:
                    a.deallocate_raw(addr.pop(i))

    benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=1)


@pytest.mark.benchmark(group="small batch")
@pytest.mark.parametrize("mode", ["batch", "per-call"])
@pytest.mark.parametrize("n", [4, 64])
@pytest.mark.parametrize("cls", [BFCAllocator, CompactAllocator], ids=["bfc", "compact"])
def test_small_batch(benchmark, cls, n, mode):
    """A warm allocator given ``n`` operations (``n / 2`` allocations, then their
    frees) in one ``run_batch`` call, against the same calls one by one: what
    a batch's checks and set-up cost where it has little to amortise them
    over."""
    half = n // 2
    ops = np.repeat(np.array([0, 1], dtype=np.int8), half)
    ids = np.concatenate([np.arange(half), np.arange(half)])
    sizes = np.where(ops == 0, 1000, 0)
    a = cls(VirtualSubAllocator(contiguous=True), memory_limit=1 << 40)
    sizes_list = sizes[:half].tolist()

    def per_call():
        allocate, free = a.allocate_raw, a.deallocate_raw
        for p in [allocate(s) for s in sizes_list]:
            free(p)

    run = (lambda: a.run_batch(ops, ids, sizes)) if mode == "batch" else per_call
    run()
    benchmark(run)


@pytest.mark.benchmark(group="training")
@pytest.mark.parametrize("cls", [BFCAllocator, CachingAllocator], ids=["bfc", "caching"])
def test_training_workload(benchmark, cls):
    """An MNIST-sized training loop (``numba_bfc.demo.training_workload``), 20 steps:
    time, and backend allocations against one per request without a pool."""
    backends = []

    def run():
        backend = VirtualSubAllocator()
        backends.append(backend)
        return training_workload(cls(backend, memory_limit=1 << 34), steps=20)

    requests = benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    benchmark.extra_info["requests"] = requests
    benchmark.extra_info["backend_allocations"] = backends[-1].num_allocs
    print(f"\n{cls.__name__}: {requests} requests, {backends[-1].num_allocs} backend allocations")


_FIRST = r"""
import time
t0 = time.perf_counter()
import numba_bfc
from numba_bfc.backends import VirtualSubAllocator
t1 = time.perf_counter()
a = numba_bfc.BFCAllocator(VirtualSubAllocator(), memory_limit=1 << 30)
a.deallocate_raw(a.allocate_raw(1000))
c = numba_bfc.CachingAllocator(VirtualSubAllocator())
c.deallocate_raw(c.allocate_raw(1000))
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""


def test_first_call_cold_and_warm(tmp_path):
    """Import time and first allocation+free (BFC and caching), with an empty and a
    warm Numba cache."""
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PATH": ""}
    out = {}
    for label in ("cold", "warm"):
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-c", _FIRST], capture_output=True, text=True,
                           check=True, env=env)
        imp, first = map(float, r.stdout.split())
        out[label] = (imp, first, time.perf_counter() - t)
    for label, (imp, first, total) in out.items():
        print(f"\n{label}: import {imp:.3f} s, first allocate+free {first:.3f} s, "
              f"process {total:.3f} s")
    assert out["warm"][1] < out["cold"][1]
