"""Random operation sequences on BFCAllocator and the reference oracle: same
addresses, same errors, same stats, same chunk layout, invariants after every step."""

import numpy as np
from _support import batch_program, single_calls
from hypothesis import given
from hypothesis import strategies as st

from numba_bfc import BFCAllocator, InvalidPointerError, OutOfMemoryError, SharedCounter
from numba_bfc.backends import VirtualSubAllocator
from numba_bfc.testing import ReferenceBFCAllocator
from numba_bfc.testing.invariants import check_invariants

KiB, MiB = 1 << 10, 1 << 20

sizes = st.one_of(
    st.integers(1, 4 * KiB),
    st.integers(1, 512 * KiB),
    st.integers(1, 6 * MiB),
    st.sampled_from([256, 512, 1024, 1 << 20, 2 << 20]),
)
ops = st.one_of(
    st.tuples(st.just("alloc"), sizes, st.sampled_from([256, 256, 256, 1, 1024, 8192])),
    st.tuples(st.just("alloc_fb"), sizes, st.integers(1, 40)),
    st.tuples(st.just("free"), st.integers(0, 1000), st.just(0)),
    st.tuples(st.just("free"), st.integers(0, 1000), st.just(0)),
    st.tuples(st.just("bad_free"), st.integers(0, 1000), st.sampled_from([0, 256, 8, 1])),
    st.tuples(st.just("gc"), st.integers(0, 8 * MiB), st.just(0)),
    st.tuples(st.just("clear"), st.just(0), st.just(0)),
    st.tuples(st.just("stamp"), st.integers(0, 1), st.integers(0, 40)),
)
configs = st.fixed_dictionaries(
    {
        "memory_limit": st.sampled_from([4 * MiB, 16 * MiB, 64 * MiB, 1 << 30]),
        "allow_growth": st.booleans(),
        "garbage_collection": st.booleans(),
        "fragmentation_fraction": st.sampled_from([0.0, 0.0, 0.01, 0.2]),
        "contiguous": st.booleans(),
        "capacity": st.sampled_from([None, None, 8 * MiB, 24 * MiB]),
    }
)


def _step(a, live, freed, op):
    """Apply one operation; return an observable outcome."""
    kind, x, y = op
    try:
        if kind == "alloc":
            p = a.allocate_raw(x, alignment=y)
            live.append(p)
            return ("ptr", p, a.allocated_size(p), a.allocation_id(p))
        if kind == "alloc_fb":
            p = a.allocate_raw(x, freed_before=y)
            live.append(p)
            return ("ptr", p, a.allocated_size(p), a.allocation_id(p))
        if kind == "free":
            if not live:
                return None
            p = live.pop(x % len(live))
            a.deallocate_raw(p)
            freed.append(p)
            return "ok"
        if kind == "bad_free":
            # y == 0: an unknown pointer; y == 1: a pointer freed earlier (a double
            # free unless that address was handed out again); else an interior one.
            if y == 0 or (y == 1 and not freed) or (y > 1 and not live):
                target = (1 << 39) + x * 256
            elif y == 1:
                target = freed[x % len(freed)]
            else:
                target = live[x % len(live)] + y
            if target not in live:
                a.deallocate_raw(target)
            return "ok"
        if kind == "gc":
            return ("gc", a.deallocate_free_regions(x))
        if kind == "clear":
            return ("clear", a.clear_stats())
        if kind == "stamp":
            if x:
                a.set_timing_counter(a._test_counter)
            else:
                a.set_timing_counter(None)
            a.set_safe_frontier(y)
            return "ok"
    except OutOfMemoryError as e:
        # The kernel fails some of these itself (FAILED_HERE), the oracle
        # always through the slow path: the errors must say the same.
        return ("oom", e.reason, e.rounded_bytes, e.stats, str(e))
    except InvalidPointerError as e:
        return ("invalid", e.kind)
    raise AssertionError(kind)


def _observe(a):
    m = a.memory_map()
    return m["stats"], m["regions"], m["chunks"]


@given(config=configs, program=st.lists(ops, max_size=60))
def test_numba_matches_reference(config, program):
    cfg = dict(config)
    contiguous, capacity = cfg.pop("contiguous"), cfg.pop("capacity")
    fast = BFCAllocator(VirtualSubAllocator(capacity, contiguous), **cfg)
    ref = ReferenceBFCAllocator(VirtualSubAllocator(capacity, contiguous), **cfg)
    fast._test_counter, ref._test_counter = SharedCounter(), SharedCounter()
    live_f, live_r, freed_f, freed_r = [], [], [], []
    for op in program:
        out_f = _step(fast, live_f, freed_f, op)
        out_r = _step(ref, live_r, freed_r, op)
        assert out_f == out_r, op
        assert _observe(fast) == _observe(ref), op
        check_invariants(fast)
        check_invariants(ref)
    assert fast.render_occupancy() == ref.render_occupancy()


@given(program=st.lists(st.tuples(st.booleans(), st.integers(1, 300 * KiB), st.integers(0, 99)),
                        max_size=300))
def test_batch_matches_single_calls(program):
    """The batch entry point does exactly what one call per operation does."""
    ops, ids, szs = batch_program(program)
    a = BFCAllocator(VirtualSubAllocator(), memory_limit=1 << 30)
    out = a.run_batch(np.array(ops), np.array(ids), np.array(szs))
    b = ReferenceBFCAllocator(VirtualSubAllocator(), memory_limit=1 << 30)
    assert out.tolist() == single_calls(b, ops, ids, szs)
    assert _observe(a) == _observe(b)
    check_invariants(a)
