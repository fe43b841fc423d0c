"""A failed allocation: the report deferred to its first read, against reading it.

Run: ``python -m pytest benchmarks/test_bench_oom.py --benchmark-columns=min,median,rounds``.
Each group is one policy; ``deferred`` catches the error and reads nothing
more than ``str(error)`` (what a retry loop or ``min_limit`` does), ``read``
also reads ``error.occupancy`` (which builds the bin summary and occupancy
map, what every failure cost before they were deferred).
"""

import pytest

from numba_bfc import BFCAllocator, CachingAllocator, CompactAllocator, OutOfMemoryError
from numba_bfc.backends import VirtualSubAllocator
from numba_bfc.traces import min_limit
from numba_bfc.traces.data import load_bundled

MiB = 1 << 20
FAILURES = 200  # failed allocations per round

POLICIES = {
    "bfc": lambda: BFCAllocator(VirtualSubAllocator(), memory_limit=64 * MiB),
    "caching": lambda: CachingAllocator(VirtualSubAllocator(), memory_limit=64 * MiB),
    "compact": lambda: CompactAllocator(VirtualSubAllocator(contiguous=True),
                                        memory_limit=64 * MiB, page_size=64 << 10),
}


def _fragmented(policy):
    """Half of 40 MiB freed in 1 MiB holes, so a 48 MiB request fails after
    the whole slow path (growth, merging, giving free regions back)."""
    a = POLICIES[policy]()
    live = [a.allocate_raw(MiB) for _ in range(40)]
    for p in live[::2]:
        a.deallocate_raw(p)
    return a


def _fail(a, read_report):
    for _ in range(FAILURES):
        try:
            a.allocate_raw(48 * MiB)
        except OutOfMemoryError as e:
            str(e)
            if read_report:
                len(e.occupancy)  # builds the report


@pytest.mark.parametrize("report", ["deferred", "read"])
@pytest.mark.parametrize("policy", list(POLICIES))
def test_failed_allocation(benchmark, policy, report):
    benchmark.group = f"oom/{policy}"
    a = _fragmented(policy)
    _fail(a, True)  # compile outside the timing
    benchmark.extra_info["failures_per_round"] = FAILURES
    benchmark(_fail, a, report == "read")


@pytest.mark.parametrize("policy", ["bfc", "caching"])
def test_min_limit_bisection(benchmark, policy):
    """``min_limit`` on a bundled trace: every probe below the answer fails."""
    benchmark.group = "min-limit"
    trace = load_bundled("cnn_train")
    min_limit(trace, policy)
    result = benchmark.pedantic(min_limit, (trace, policy), rounds=3)
    benchmark.extra_info["replays"] = result.replays
