"""Trace replay: the batch kernel vs one Python API call per event, side by side;
and ``run_batch`` on a whole trace, its ids small or numbered first.

Run: ``PYTHONPATH=. python -m pytest benchmarks/test_bench_traces.py -q
--benchmark-columns=min,median,rounds``. Each group is one bundled trace x
policy; ``extra_info['mevents_per_s']`` is events / median seconds. The kernel
rows time the whole ``replay()`` call, a fresh allocator included.
"""

import pytest

from numba_bfc.traces import make_allocator, replay
from numba_bfc.traces.data import bundled_names, load_bundled

TRACES = {name: load_bundled(name) for name in bundled_names()}
CASES = [(t, p) for t in TRACES for p in ("bfc", "caching", "compact")]


def python_loop(trace, allocator):
    """What a user would write without replay(): one call per event."""
    ptr = {}
    allocate, deallocate = allocator.allocate_raw, allocator.deallocate_raw
    for op, slot, size in zip(trace.ops.tolist(), trace.slots().tolist(), trace.sizes.tolist()):
        if op == 0:
            ptr[slot] = allocate(size, 256)
        else:
            deallocate(ptr.pop(slot))


def _rate(benchmark, trace):
    benchmark.extra_info["events"] = len(trace)
    if benchmark.disabled:  # --benchmark-disable: one run, no timings to rate
        return
    benchmark.extra_info["mevents_per_s"] = round(len(trace) / benchmark.stats["median"] / 1e6, 2)


@pytest.mark.parametrize("name,policy", CASES)
def test_replay_kernel(benchmark, name, policy):
    trace = TRACES[name]
    benchmark.group = f"{name}/{policy}"
    replay(trace, policy)  # compile or load the kernels outside the timing
    result = benchmark(replay, trace, policy)
    assert result.events == len(trace) and result.ooms == 0
    _rate(benchmark, trace)


@pytest.mark.parametrize("name,policy", CASES)
def test_replay_python_loop(benchmark, name, policy):
    trace = TRACES[name]
    benchmark.group = f"{name}/{policy}"
    python_loop(trace, make_allocator(policy))
    benchmark.pedantic(lambda a: python_loop(trace, a),
                       setup=lambda: ((make_allocator(policy),), {}), rounds=20)
    _rate(benchmark, trace)


@pytest.mark.parametrize("ids", ["slots", "slots + 2**40"])
@pytest.mark.parametrize("policy", ["bfc", "caching", "compact"])
def test_run_batch(benchmark, policy, ids):
    """The public batch call on ``generate_kv_large`` (a fresh allocator per
    round), beside ``test_replay_kernel`` of the same group: ids that index its
    pairing table as they are, and ids it must number first (a sort)."""
    name = "generate_kv_large"
    trace = TRACES[name]
    labels = trace.slots() + (1 << 40 if ids != "slots" else 0)
    benchmark.group = f"{name}/{policy}"
    make_allocator(policy).run_batch(trace.ops, labels, trace.sizes)
    out = benchmark.pedantic(lambda a: a.run_batch(trace.ops, labels, trace.sizes),
                             setup=lambda: ((make_allocator(policy),), {}), rounds=20)
    assert (out[trace.ops == 0] > 0).all()
    _rate(benchmark, trace)
