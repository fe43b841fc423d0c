"""The compiled bridge (``numba_bfc.allocators._fastpath``): ``allocate_raw`` and
``deallocate_raw`` called with one int go from C straight into the kernel's C
entry, and back to Python only for what is not the common answer.

Every decision must be the Python methods' (``NUMBA_BFC_NATIVE_CALLS=0``):
addresses, errors, statistics and tables, for every policy, at memory limits
where requests fail in the kernel and where the slow path grows the pool; and
every other call (keywords, other types, values out of range) must behave as
the Python method does.
"""

from __future__ import annotations

import ctypes
import gc
import inspect
import threading
import weakref

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numba_bfc import (
    BFCAllocator,
    CachingAllocator,
    CompactAllocator,
    InvalidPointerError,
    OutOfMemoryError,
)
from numba_bfc.allocators import _fastcall
from numba_bfc.allocators.bfc_base import BFCBase, SharedCounter
from numba_bfc.backends import VirtualSubAllocator
from numba_bfc.kernels import layout as L
from numba_bfc.testing.invariants import check_invariants

pytestmark = pytest.mark.skipif(
    _fastcall.KernelEntry is None,
    reason="the compiled bridge was not built (no C compiler at install): the Python "
           "methods serve every call")

MiB = 1 << 20


def _make(policy: str, limit: int | None, **options):
    if policy == "bfc":
        return BFCAllocator(VirtualSubAllocator(), memory_limit=limit or 1 << 40, **options)
    if policy == "caching":
        return CachingAllocator(VirtualSubAllocator(), memory_limit=limit, **options)
    return CompactAllocator(VirtualSubAllocator(contiguous=True), memory_limit=limit or 1 << 40,
                            page_size=64 << 10, **options)


def _armed(policy: str, limit: int | None = None, **options):
    a = _make(policy, limit, **options)
    a.deallocate_raw(a.allocate_raw(1000))  # compiles: the entries are armed
    return a


def _pair(policy: str, limit: int | None, monkeypatch, **options):
    """The same allocator twice: through the bridge, and through the Python methods."""
    native = _armed(policy, limit, **options)
    monkeypatch.setenv("NUMBA_BFC_NATIVE_CALLS", "0")
    python = _make(policy, limit, **options)
    python.deallocate_raw(python.allocate_raw(1000))
    monkeypatch.delenv("NUMBA_BFC_NATIVE_CALLS")
    assert isinstance(native._allocate_entry, _fastcall.KernelEntry)
    assert isinstance(native._deallocate_entry, _fastcall.KernelEntry)
    assert python._allocate_entry is None and python._deallocate_entry is None
    return native, python


def _step(a, live: list, freed: list, op) -> object:
    """Apply one operation; its outcome (an address, None or the error's type and text)."""
    kind, x = op
    try:
        if kind == "alloc":
            p = a.allocate_raw(x)
            live.append(p)
            return p
        if kind == "free" and live:
            p = live.pop(x % len(live))
            freed.append(p)
            return a.deallocate_raw(p)
        if kind == "double_free" and freed:
            return a.deallocate_raw(freed[x % len(freed)])
        if kind == "interior_free" and live:
            return a.deallocate_raw(live[x % len(live)] + 8)
        return None
    except (OutOfMemoryError, InvalidPointerError) as error:
        return type(error).__name__, str(error)


_OPS = st.lists(st.one_of(
    st.tuples(st.just("alloc"), st.integers(1, 3 * MiB)),
    st.tuples(st.just("alloc"), st.integers(1, 4096)),
    st.tuples(st.sampled_from(["free", "free", "double_free", "interior_free"]),
              st.integers(0, 1 << 16)),
), min_size=1, max_size=60)


def _decide_alike(policy, limit, ops, **options):
    mp = pytest.MonkeyPatch()
    try:
        native, python = _pair(policy, limit, mp, **options)
    finally:
        mp.undo()
    state = {id(a): ([], []) for a in (native, python)}
    for op in ops:
        outcomes = [_step(a, *state[id(a)], op) for a in (native, python)]
        assert outcomes[0] == outcomes[1], op
    for table in ("_chunks", "_bins", "_regions", "_pmap"):
        assert np.array_equal(getattr(native, table), getattr(python, table)), table
    own = [L.S_CHUNKS_ADDR, L.S_BINS_ADDR, L.S_REGIONS_ADDR, L.S_PMAP_ADDR, L.S_TSQ_ADDR]
    assert np.array_equal(np.delete(native._state, own), np.delete(python._state, own))
    assert native.get_stats() == python.get_stats()
    check_invariants(native)


@pytest.mark.parametrize("policy", ["bfc", "caching", "compact"])
@pytest.mark.parametrize("limit", [None, 8 * MiB])
@settings(max_examples=25, deadline=None)
@given(ops=_OPS)
def test_the_bridge_decides_as_the_python_methods(policy, limit, ops):
    """Random calls, some failing in the kernel (a limit), some invalid: every
    outcome, error text, statistic and table the Python methods'."""
    _decide_alike(policy, limit, ops)


@settings(max_examples=25, deadline=None)
@given(ops=_OPS)
def test_the_bridge_decides_as_the_python_methods_with_the_gc_clock(ops):
    """The caching policy's garbage collection (its lock-free kernel steps aside
    while the age clock runs: a missed lookup counts on it)."""
    _decide_alike("caching", 16 * MiB, ops, garbage_collection_threshold=0.5)


@pytest.mark.parametrize("policy", ["bfc", "caching", "compact"])
def test_a_plain_call_takes_the_bridge(policy, monkeypatch):
    """With the Python fast path made to fail, plain calls still succeed: they
    never reached it. Without the entries they reach it (the check can fail)."""
    a = _armed(policy)

    def refuse(*args):
        raise AssertionError("the Python method's kernel call ran")

    for name in ("_fast_allocate", "_fast_deallocate"):
        address, _, largest = getattr(a, name)
        monkeypatch.setattr(a, name, (address, refuse, largest))
    for _ in range(3):
        a.deallocate_raw(a.allocate_raw(1000))
    a._allocate_entry = None
    with pytest.raises(AssertionError, match="kernel call ran"):
        a.allocate_raw(1000)


@pytest.mark.parametrize("policy", ["bfc", "caching", "compact"])
def test_a_bridge_call_waits_while_another_thread_holds_the_lock(policy):
    """The bridge calls its kernel lock-free (``locked`` false): while another
    thread holds the allocator's lock the kernel steps aside and the call waits
    for the lock in its continuation; it does not run beside the holder."""
    a = _armed(policy)
    p = a.allocate_raw(1000)
    done = []
    with a._lock:
        workers = [threading.Thread(target=lambda: done.append(a.allocate_raw(2000))),
                   threading.Thread(target=lambda: done.append(a.deallocate_raw(p)))]
        for t in workers:
            t.start()
        for t in workers:
            t.join(0.3)
        assert all(t.is_alive() for t in workers) and not done
    for t in workers:
        t.join(10)
    assert len(done) == 2 and a.get_stats().bytes_in_use == a.allocated_size(
        next(x for x in done if x))
    check_invariants(a)


_KERNEL = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_bool)


def _answering(a, answer: int, seen: list):
    """A KernelEntry on ``a``'s state whose kernel records its arguments and answers ``answer``."""
    kernel = _KERNEL(lambda state, value, locked: seen.append((state, value, locked)) or answer)
    entry = _fastcall.KernelEntry(ctypes.cast(kernel, ctypes.c_void_p).value, a._state,
                                  (1 << 63) - 1)
    return entry, kernel  # the caller keeps the kernel alive


@pytest.mark.parametrize("policy", ["bfc", "caching", "compact"])
@pytest.mark.parametrize("answer", [0, L.NEED_ROWS, L.NOT_FOUND, L.TABLES_BUSY, L.FAILED_HERE])
def test_every_other_allocation_answer_goes_to_the_continuation(policy, answer):
    """A kernel answer not > 0 (0 too: what Numba's C wrapper answers if a kernel
    raised) is handed to the continuation, which finishes under the lock, or
    raises for ``FAILED_HERE``; the kernel was called once, lock-free."""
    a = _armed(policy)
    seen = []
    a._allocate_entry, kernel = _answering(a, answer, seen)
    if answer == L.FAILED_HERE:
        with pytest.raises(OutOfMemoryError):
            a.allocate_raw(1000)
    else:
        p = a.allocate_raw(1000)
        assert a.allocated_size(p) >= 1000
    assert seen == [(a._state_address, 1000, False)]
    check_invariants(a)


@pytest.mark.parametrize("policy", ["bfc", "caching", "compact"])
@pytest.mark.parametrize("answer", [0, L.INVALID_POINTER, L.TABLES_BUSY])
def test_every_other_free_answer_goes_to_the_continuation(policy, answer):
    """A free answered 0 is not taken as done: the continuation frees under the lock."""
    a = _armed(policy)
    p = a.allocate_raw(1000)
    seen = []
    a._deallocate_entry, kernel = _answering(a, answer, seen)
    a.deallocate_raw(p)
    assert a.get_stats().bytes_in_use == 0
    # compact's continuation is the give-back's way, which goes through BFC's method again
    assert seen[0] == (a._state_address, p, False) and all(not s[2] for s in seen)
    check_invariants(a)


@pytest.mark.parametrize("policy", ["bfc", "caching", "compact"])
def test_every_other_call_is_the_python_methods(policy, monkeypatch):
    """Keywords, a second argument, a bool, a NumPy integer, a float, 0, a negative
    or a value past int64: the Python method's answer or error, to the letter."""
    native, python = _pair(policy, None, monkeypatch)

    def outcome(call, a):
        try:
            return "value", call(a)
        except Exception as error:  # compared, not swallowed
            return type(error), str(error)

    calls = [lambda a: a.allocate_raw(np.int64(1000)),
             lambda a: a.allocate_raw(True),
             lambda a: a.allocate_raw(1000.0),
             lambda a: a.allocate_raw(0),
             lambda a: a.allocate_raw(-5),
             lambda a: a.allocate_raw(1 << 64),
             lambda a: a.allocate_raw(1000, 512),
             lambda a: a.allocate_raw(num_bytes=1000),
             lambda a: a.allocate_raw(),
             lambda a: a.allocate_raw(1000, 256, None, None),
             lambda a: a.deallocate_raw(None),
             lambda a: a.deallocate_raw(0),
             lambda a: a.deallocate_raw(-1),
             lambda a: a.deallocate_raw(1 << 64),
             lambda a: a.deallocate_raw(ptr=12345),
             lambda a: a.deallocate_raw(np.int64(12345))]
    for k, call in enumerate(calls):
        assert outcome(call, native) == outcome(call, python), k


def test_unbound_and_bound_calls(monkeypatch):
    """The class attribute called with an instance, a bound method kept after the
    allocator's last other reference (it keeps the allocator alive), and a call
    on something that is not an allocator (the Python method's error)."""
    native, _ = _pair("bfc", None, monkeypatch)
    p = BFCAllocator.allocate_raw(native, 1000)
    assert native.allocated_size(p) == 1024
    BFCAllocator.deallocate_raw(native, p)
    allocate = BFCAllocator(VirtualSubAllocator(), memory_limit=1 << 30).allocate_raw
    gc.collect()
    assert allocate(1000) > 0 and allocate(1000) > 0
    with pytest.raises(AttributeError):
        BFCAllocator.allocate_raw(object(), 1000)


def test_the_methods_pickle_and_copy_by_reference():
    import copy
    import pickle

    for method in (BFCAllocator.allocate_raw, CachingAllocator.deallocate_raw):
        assert pickle.loads(pickle.dumps(method)) is method
        assert copy.deepcopy(method) is method and copy.copy(method) is method


def test_the_methods_read_as_the_python_ones():
    """Name, docstring and signature are the Python method's (``help``, Sphinx,
    ``inspect``); the base class's docstring where the override had none."""
    for cls in (BFCAllocator, CachingAllocator, CompactAllocator):
        for name in ("allocate_raw", "deallocate_raw"):
            method = inspect.getattr_static(cls, name)
            assert type(method) is _fastcall.FastMethod, (cls, name)
            assert method.__name__ == name and method.__doc__
            assert inspect.signature(method) == inspect.signature(method.__wrapped__)
            bound = getattr(cls(VirtualSubAllocator(), 1 << 30), name)
            assert "self" not in inspect.signature(bound).parameters
    assert BFCAllocator.allocate_raw.__doc__ == BFCBase.allocate_raw.__doc__


def test_a_subclass_override_is_called():
    class Counting(BFCAllocator):
        calls = 0

        def allocate_raw(self, num_bytes, *args, **kwargs):
            Counting.calls += 1
            return super().allocate_raw(num_bytes, *args, **kwargs)

    a = Counting(VirtualSubAllocator(), memory_limit=1 << 30)
    p = a.allocate_raw(1000)
    a.deallocate_raw(p)
    assert Counting.calls == 1 and a.allocate_raw(1000) == p


@pytest.mark.parametrize("policy", ["bfc", "caching", "compact"])
def test_no_entry_while_the_fast_path_is_off(policy, monkeypatch):
    """An allocator whose fast paths are off (BFC's timing counter, a memory
    history) or built with ``NUMBA_BFC_NATIVE_CALLS=0`` has no entries, and
    calls still work."""
    native, python = _pair(policy, None, monkeypatch)
    if policy == "caching":
        native.record_memory_history(True)
    elif policy == "bfc":
        native.set_timing_counter(SharedCounter())
    else:
        native = None
    for a in (native, python):
        if a is None:
            continue
        if a is native:
            assert a._allocate_entry is None
        p = a.allocate_raw(1000)
        a.deallocate_raw(p)
        check_invariants(a)


def test_entries_hold_no_cycle_and_the_state_alive():
    """An entry keeps the state array alive (it is a buffer view of it), not its
    allocator: dropping the allocator frees it at once."""
    gc.disable()
    try:
        a = BFCAllocator(VirtualSubAllocator(), memory_limit=1 << 30)
        a.deallocate_raw(a.allocate_raw(1000))
        entry, ref, state = a._allocate_entry, weakref.ref(a), weakref.ref(a._state)
        del a
        assert ref() is None
        assert state() is not None and entry.largest == 1 << 30
        del entry
        assert state() is None
    finally:
        gc.enable()


def test_uninitialised_objects_are_refused_not_called():
    """Made without ``__init__``, an entry takes no value and a method raises
    (CPython refuses its empty call slot) and has no ``general``; nothing calls
    or reads through a null pointer. Neither initialises twice."""
    method = _fastcall.FastMethod.__new__(_fastcall.FastMethod)
    with pytest.raises(TypeError):
        method(object(), 5)
    with pytest.raises(TypeError, match="not initialised"):
        method.general  # noqa: B018
    entry = _fastcall.KernelEntry.__new__(_fastcall.KernelEntry)
    assert entry.largest == 0
    with pytest.raises(TypeError, match="once"):
        BFCAllocator.allocate_raw.__init__(len, len, "x", False)
    a = BFCAllocator(VirtualSubAllocator(), memory_limit=1 << 30)
    a.deallocate_raw(a.allocate_raw(1000))
    with pytest.raises(TypeError, match="once"):
        a._allocate_entry.__init__(1, np.zeros(8, np.int64), 1)


def test_an_entry_refuses_what_is_not_an_int64_state():
    state = np.zeros(8, np.int64)
    with pytest.raises(ValueError, match="address is 0"):
        _fastcall.KernelEntry(0, state, 1)
    with pytest.raises(TypeError, match="int64"):
        _fastcall.KernelEntry(1, np.zeros(8, np.float64), 1)
    frozen = state.copy()
    frozen.flags.writeable = False
    with pytest.raises((BufferError, ValueError)):
        _fastcall.KernelEntry(1, frozen, 1)
    with pytest.raises(TypeError, match="int64"):
        _fastcall.KernelEntry(1, bytearray(8), 1)
    with pytest.raises(TypeError):
        _fastcall.KernelEntry(1, [0] * 8, 1)


@pytest.mark.parametrize("policy", ["bfc", "caching", "compact"])
def test_threads_through_the_bridge(policy):
    """Four threads allocate and free through the bridge (lock-free calls that
    step aside while another thread holds the lock) on real byte patterns: the
    tables hold their invariants and every block its own bytes."""
    from numba_bfc.backends import HostSubAllocator

    if policy == "bfc":
        a = BFCAllocator(HostSubAllocator(), memory_limit=64 * MiB)
    elif policy == "caching":
        a = CachingAllocator(HostSubAllocator(), memory_limit=64 * MiB)
    else:
        a = CompactAllocator(HostSubAllocator(), memory_limit=64 * MiB, page_size=64 << 10)
    a.deallocate_raw(a.allocate_raw(1000))
    assert a._allocate_entry is not None
    errors = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        live = []
        try:
            for _ in range(2000):
                if live and rng.random() < 0.5:
                    p, n, value = live.pop(int(rng.integers(len(live))))
                    view = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * n).from_address(p))
                    assert (view == value).all()
                    a.deallocate_raw(p)
                else:
                    n = int(rng.integers(1, 20_000))
                    p = a.allocate_raw(n)
                    view = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * n).from_address(p))
                    view[:] = seed
                    live.append((p, n, seed))
            for p, _, _ in live:
                a.deallocate_raw(p)
        except Exception as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(k + 1,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    check_invariants(a)
    assert a.get_stats().bytes_in_use == 0
