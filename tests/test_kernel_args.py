"""Kernel calls skip Numba's type checks (``allocators/_fastcall.py``): what
reaches them must already have the compiled signature's types.

With ``NUMBA_BFC_CHECK_KERNEL_ARGS=1`` every kernel call is checked against its
signature; a workload through every policy and entry point runs clean under
it (so every internal call converts first). Wrong dtypes and shapes given to
the public batch entry points are refused before any kernel sees them.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from numba_bfc.allocators._fastcall import Kernel
from numba_bfc.traces import make_allocator

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ["bfc", "caching", "compact"]

_WORKLOAD = r"""
import numpy as np
from numba_bfc import OutOfMemoryError
from numba_bfc.traces import make_allocator, min_limit, replay
from numba_bfc.traces.synthetic import GENERATORS
from numba_bfc.testing.invariants import check_invariants

rng = np.random.default_rng(0)
for policy in ("bfc", "caching", "compact"):
    a = make_allocator(policy, 64 << 20)
    live = []
    for _ in range(3000):
        if live and rng.random() < 0.45:
            a.deallocate_raw(live.pop(int(rng.integers(len(live)))))
        else:
            try:
                live.append(a.allocate_raw(int(rng.integers(1, 4 << 20)),
                                           int(2 ** rng.integers(8, 10))))
            except OutOfMemoryError as e:
                str(e), e.stats, e.occupancy
    a.run_batch([0, 0, 1], [1, 2, 1], [1000, 4096, 0])
    try:
        a.run_batch([0, 0], [7, 8], [1000, 70 << 20])  # above the limit: refused
    except OutOfMemoryError:
        pass
    a.empty_cache() if hasattr(a, "empty_cache") else a.deallocate_free_regions()
    check_invariants(a)
    for name in ("bursty", "fragmenting"):
        trace = GENERATORS[name]()
        replay(trace, policy)
        replay(trace, policy, limit=int(trace.peak_requested_bytes * 1.1))
    min_limit(GENERATORS["bursty"](), policy)
print("clean")
"""


def test_every_kernel_call_matches_its_signature():
    env = dict(os.environ, NUMBA_BFC_CHECK_KERNEL_ARGS="1")
    done = subprocess.run([sys.executable, "-c", _WORKLOAD], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "clean"


def test_the_checked_mode_refuses_wrong_types(monkeypatch):
    monkeypatch.setenv("NUMBA_BFC_CHECK_KERNEL_ARGS", "1")
    a = make_allocator("bfc", 1 << 30)
    kernel = Kernel(type(a)._ALLOCATE_ALIGNED.dispatcher)  # the most argument kinds
    kernel.call(a._state, 1000, 256, 0, True)  # compiles or loads; now checked
    assert kernel.fast
    for args, message in [
        ((a._state.astype(np.float64), 100, 256, 0, True), "expected dtype int64"),
        ((a._state.reshape(1, -1), 100, 256, 0, True), "expected 1 dimension"),
        ((a._state[::2], 100, 256, 0, True), "C-contiguous"),
        ((a._state, 1.5, 256, 0, True), "expected an integer"),
        ((a._state, 100, 256, 0), "4 arguments"),
    ]:
        with pytest.raises(TypeError, match=message):
            kernel.call(*args)
    frozen = a._state.copy()
    frozen.flags.writeable = False
    with pytest.raises(TypeError, match="writable"):
        kernel.call(frozen, 100, 256, 0, True)


@pytest.mark.parametrize("policy", POLICIES)
def test_the_single_call_kernels_take_the_state_address_and_refuse_the_array(policy):
    """The single-call allocate and free and the lookup take the state's data
    address (``kernels.guard.state_at``): the address serves, and the array itself
    fails typing through the dispatcher (Numba's ``TypingError``, not invalid
    code) and unboxing through the compiled entry point (``TypeError``)."""
    from numba.core.errors import TypingError

    from numba_bfc.allocators._tables import _LIVE_CHUNK

    a = make_allocator(policy, 1 << 30)
    a.deallocate_raw(a.allocate_raw(1000))  # a region to allocate from
    allocate, deallocate = type(a)._ALLOCATE.dispatcher, type(a)._DEALLOCATE.dispatcher
    lookup = _LIVE_CHUNK.dispatcher
    p = allocate(a._state_address, 1000, True)
    assert p > 0 and a.allocated_size(p) >= 1000  # (the lookup's entry point compiled)
    assert a.get_stats().num_allocs == 2
    assert lookup(a._state_address, p, True) == (0, 1000, a.allocated_size(p),
                                                 a.allocation_id(p))
    for kernel, value in ((allocate, 1000), (deallocate, p), (lookup, p)):
        with pytest.raises(TypingError):
            kernel(a._state, value, True)
    # The façade's path: the compiled entry point, once a first call compiled it.
    for handle, value in ((type(a)._ALLOCATE, 1000), (type(a)._DEALLOCATE, p), (_LIVE_CHUNK, p)):
        assert handle.fast
        with pytest.raises(TypeError):
            handle.call(a._state, value, True)
    assert deallocate(a._state_address, p, True) >= 1000
    assert a.get_stats().bytes_in_use == 0


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("ops,ids,sizes", [
    (np.zeros((2, 2), dtype=np.int64), [1, 2], [10, 10]),
    ([0, 0], np.ones((2, 1), dtype=np.int64), [10, 10]),
    ([0, 0], [1, 2], np.array([[10], [10]])),
    ([0.0, 0.0], [1, 2], [10, 10]),
    ([0, 0], [1, 2], np.array([10.0, 10.0])),
    ([0, 0], ["a", "b"], [10, 10]),
    ([0, 0], [1, 2], np.array([10, None], dtype=object)),
    ([0, 0], [1, 2, 3], [10, 10]),
])
def test_the_batch_entry_refuses_wrong_dtypes_and_shapes(policy, ops, ids, sizes):
    a = make_allocator(policy, 1 << 30)
    before = a.get_stats()
    with pytest.raises((TypeError, ValueError)):
        a.run_batch(ops, ids, sizes)
    assert a.get_stats() == before


@pytest.mark.parametrize("policy", POLICIES)
def test_the_fast_paths_call_the_entry_point_once_a_first_call_compiled_it(policy,
                                                                            monkeypatch):
    """``allocate_raw`` and ``deallocate_raw`` read their kernel's call from a
    tuple armed at construction. Armed before the kernel's first call, it holds
    a call that compiles and re-arms; after it, the compiled entry point itself,
    whichever call came first (here a batch grows the pool, so the first
    ``allocate_raw`` succeeds lock-free). Neither keeps a reference cycle."""
    import gc
    import weakref

    cls = type(make_allocator(policy))
    for name in ("_ALLOCATE", "_DEALLOCATE"):  # handles no call has gone through yet
        monkeypatch.setattr(cls, name, Kernel(getattr(cls, name).dispatcher))
    a = make_allocator(policy)
    assert not cls._ALLOCATE.resolved and a._fast_allocate[1] is not cls._ALLOCATE.call
    gc.disable()
    try:  # the call that re-arms holds its allocator weakly: no cycle to collect
        ref = weakref.ref(make_allocator(policy))
        assert ref() is None
    finally:
        gc.enable()
    kept = a.run_batch(np.array([0]), np.array([0]), np.array([1 << 20]))
    p = a.allocate_raw(1000)
    a.deallocate_raw(p)
    assert cls._ALLOCATE.resolved and cls._DEALLOCATE.resolved
    assert a._fast_allocate[1] is cls._ALLOCATE.call
    assert a._fast_deallocate[1] is cls._DEALLOCATE.call
    assert a.allocate_raw(1000) == p and kept[0] > 0
