"""Test scaffolding shared by several test modules (imported as ``_support``)."""

from __future__ import annotations

import types


def batch_program(program):
    """``(is_alloc, size, pick)`` triples -> ``(ops, ids, sizes)`` lists of a valid batch:
    an allocation gets the next id, a free picks a live id (an allocation when none is)."""
    ops, ids, sizes, live, next_id = [], [], [], [], 0
    for is_alloc, size, pick in program:
        if is_alloc or not live:
            ops.append(0)
            ids.append(next_id)
            sizes.append(size)
            live.append(next_id)
            next_id += 1
        else:
            ops.append(1)
            ids.append(live.pop(pick % len(live)))
            sizes.append(0)
    return ops, ids, sizes


def single_calls(allocator, ops, ids, sizes):
    """Run a batch one ``allocate_raw``/``deallocate_raw`` call per operation; the
    addresses ``run_batch`` should return (0 for frees)."""
    addr, out = {}, []
    for op, i, s in zip(ops, ids, sizes):
        if op == 0:
            addr[i] = allocator.allocate_raw(s)
            out.append(addr[i])
        else:
            allocator.deallocate_raw(addr.pop(i))
            out.append(0)
    return out


class FakeDevice:
    """What the Numba plugin needs of a device."""

    id = 0

    def get_device_identity(self):
        return {"pci_domain_id": 0, "pci_bus_id": 7, "pci_device_id": 0}


class FakeContext:
    """What the Numba plugin needs of a Numba ``Context``: a device (and weak-referenceability)."""

    def __init__(self, memory_manager=None):
        self.device = FakeDevice()
        self.handle = None
        self.memory_manager = memory_manager


def pointer_step(a, live, freed, op, stray_step=256):
    """Apply ``("alloc", size, alignment)``, ``("free", pick, _)`` or ``("bad_free", pick,
    kind)`` to allocator ``a``; return ``(True, outcome)``, or ``(False, None)`` for
    another kind. ``bad_free`` frees an unknown (kind 0), freed (1) or interior
    (> 1: that offset) pointer; errors propagate to the caller."""
    kind, x, y = op
    if kind == "alloc":
        p = a.allocate_raw(x, alignment=y)
        live.append(p)
        return True, ("ptr", p, a.allocated_size(p), a.requested_size(p), a.allocation_id(p))
    if kind == "free":
        if not live:
            return True, None
        p = live.pop(x % len(live))
        a.deallocate_raw(p)
        freed.append(p)
        return True, "ok"
    if kind == "bad_free":
        if y == 0 or not (freed if y == 1 else live):
            target = (1 << 39) + x * stray_step
        else:
            target = freed[x % len(freed)] if y == 1 else live[x % len(live)] + y
        if target not in live:
            a.deallocate_raw(target)
        return True, "ok"
    return False, None


def fake_cupy(stream_ptr: int = 0) -> types.ModuleType:
    """Just the CuPy API ``cupy_allocator`` uses, with a stream of handle
    ``stream_ptr`` current (CuPy itself needs a GPU's runtime library)."""

    class UnownedMemory:
        def __init__(self, ptr, size, owner, device_id=None):
            self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id

    class MemoryPointer:
        def __init__(self, mem, offset):
            self.mem, self.ptr = mem, mem.ptr + offset

    module = types.ModuleType("cupy")
    module.cuda = types.SimpleNamespace(
        UnownedMemory=UnownedMemory, MemoryPointer=MemoryPointer,
        runtime=types.SimpleNamespace(getDevice=lambda: 0),
        get_current_stream=lambda: types.SimpleNamespace(ptr=stream_ptr))
    return module


MiB = 1 << 20


def make_manager(capacity: int = 64 * MiB, contiguous: bool = False, granularity: int = 1,
                 **options):
    """A ``NumbaBFCMemoryManager`` over a simulated backend of ``capacity`` bytes
    (also its memory limit unless given), with a fake context, initialized."""
    from numba_bfc.backends import VirtualSubAllocator
    from numba_bfc.integrations.numba_emm import NumbaBFCMemoryManager

    backend = VirtualSubAllocator(capacity=capacity, contiguous=contiguous,
                                  granularity=granularity)
    options.setdefault("memory_limit", capacity)
    mgr = NumbaBFCMemoryManager(context=FakeContext(), backend=backend, **options)
    mgr.initialize()
    return mgr


def addr(mp) -> int:
    """The device address of a Numba ``MemoryPointer`` (0 for an empty one)."""
    return int(mp.device_pointer_value or 0)


def churn_with_patterns(allocator, backend, steps, pick_size, rng, every=None, each=None):
    """Random allocations and frees on real host memory, each block filled with a
    byte of its own and checked when freed and at the end; ``each()`` runs every
    ``every`` steps. Returns ``{ptr: (nbytes, value)}`` of the blocks left live."""
    import numpy as np

    from numba_bfc import OutOfMemoryError

    live = {}
    for step in range(steps):
        if live and rng.random() < 0.45:
            p = list(live)[rng.integers(len(live))]
            n, value = live.pop(p)
            assert np.all(backend.view(p, n) == value), f"block {p:#x} was overwritten"
            allocator.deallocate_raw(p)
        else:
            n = pick_size()
            try:
                p = allocator.allocate_raw(n)
            except OutOfMemoryError:
                continue
            value = step % 251 + 1
            backend.view(p, n)[:] = value
            live[p] = (n, value)
        if every and step % every == 0:
            each()
    spans = sorted((p, p + n) for p, (n, _) in live.items())
    assert all(a_end <= b for (_, a_end), (b, _) in zip(spans, spans[1:]))
    for p, (n, value) in live.items():
        assert np.all(backend.view(p, n) == value)
    return live


def leave_garbage(action):
    """Leave garbage whose finalizer runs ``action()`` (in a cycle: only a
    collection finalizes it), and allocate enough containers for a collection
    to be due under the usual thresholds."""
    class Garbage:
        def __init__(self):
            self.cycle = self

        def __del__(self):
            action()

    Garbage()
    churn = [[] for _ in range(1000)]
    del churn


def finalizer_inside(monkeypatch, owner, name, action):
    """Make ``owner.name``'s first call leave garbage whose finalizer runs
    ``action()`` and allocate enough containers for a collection to be due,
    then go on. Returns the list the finalizer appends its result to."""
    results = []
    original = getattr(owner, name)

    def record():
        try:
            results.append(action())
        except Exception as e:  # what a finalizer would print and drop
            results.append(e)

    def first_call_leaves_garbage(*args, **kwargs):
        if not hasattr(first_call_leaves_garbage, "fired"):
            first_call_leaves_garbage.fired = True
            leave_garbage(record)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, first_call_leaves_garbage)
    return results
