"""Seeded synthetic workloads: steady training, a growing KV cache, bursts,
a fragmentation-adversarial pattern and random churn at a steady live count.

Every generator returns a valid ``Trace`` whose ``time`` is the event index
(seconds are meaningless for a synthetic stream) and is deterministic for a
given seed.
"""

from __future__ import annotations

import numpy as np

from .trace import Trace

__all__ = ["GENERATORS", "bursty", "fragmenting", "growing_kv_cache", "random_churn",
           "steady_state"]

KIB = 1 << 10
MIB = 1 << 20


class _Builder:
    def __init__(self) -> None:
        self.ops: list[int] = []
        self.ids: list[int] = []
        self.sizes: list[int] = []
        self._next = 0

    def alloc(self, size: int) -> int:
        i = self._next
        self._next += 1
        self.ops.append(0)
        self.ids.append(i)
        self.sizes.append(int(size))
        return i

    def free(self, i: int) -> None:
        self.ops.append(1)
        self.ids.append(i)
        self.sizes.append(0)

    def trace(self, name: str) -> Trace:
        n = len(self.ops)
        return Trace.from_arrays(np.array(self.ops, np.int8), np.array(self.ids, np.int64),
                                 np.array(self.sizes, np.int64), time=np.arange(n, dtype=float),
                                 name=name)


def _sizes(rng: np.random.Generator, n: int, median: int, sigma: float, lo: int = 1,
           hi: int = 1 << 34) -> np.ndarray:
    """Log-normal sizes around ``median`` bytes, as tensor sizes tend to be."""
    return np.clip(rng.lognormal(np.log(median), sigma, n), lo, hi).astype(np.int64)


def steady_state(iterations: int = 50, layers: int = 24, seed: int = 0) -> Trace:
    """Training steps: weights once, then per step activations allocated in the
    forward pass and freed in reverse in the backward pass, with gradient and
    temporary buffers in between. Every step asks for the same sizes."""
    rng = np.random.default_rng(seed)
    b = _Builder()
    weights = _sizes(rng, layers, 2 * MIB, 1.0)
    acts = _sizes(rng, layers, 4 * MIB, 0.8)
    temps = _sizes(rng, layers, 64 * KIB, 1.5)
    for w in weights:
        b.alloc(w)
    for _ in range(iterations):
        live = []
        for k in range(layers):
            t = b.alloc(temps[k])
            live.append(b.alloc(acts[k]))
            b.free(t)
        grads = []
        for k in reversed(range(layers)):
            g = b.alloc(weights[k])
            t = b.alloc(acts[k])
            b.free(live.pop())
            b.free(t)
            grads.append(g)
        for g in grads:
            b.free(g)
    return b.trace(f"steady_state(seed={seed})")


def growing_kv_cache(tokens: int = 256, layers: int = 8, bytes_per_token: int = 16 * KIB,
                     seed: int = 0) -> Trace:
    """Autoregressive generation with a KV cache that grows by concatenation:
    every token, each layer allocates a cache one token longer, copies, and
    frees the old one; small temporaries come and go around it."""
    rng = np.random.default_rng(seed)
    b = _Builder()
    caches = [b.alloc(bytes_per_token) for _ in range(layers)]
    for t in range(2, tokens + 1):
        for k in range(layers):
            tmp = b.alloc(int(rng.integers(1, 64)) * KIB)
            new = b.alloc(bytes_per_token * t)
            b.free(caches[k])
            caches[k] = new
            b.free(tmp)
    return b.trace(f"growing_kv_cache(seed={seed})")


def bursty(bursts: int = 40, burst_size: int = 200, seed: int = 0) -> Trace:
    """Bursts of allocations of widely varying sizes, freed in random order,
    with a few long-lived survivors from each burst."""
    rng = np.random.default_rng(seed)
    b = _Builder()
    survivors: list[int] = []
    for _ in range(bursts):
        ids = [b.alloc(s) for s in _sizes(rng, burst_size, 256 * KIB, 2.0, hi=256 * MIB)]
        keep = rng.random(burst_size) < 0.05
        for j in rng.permutation(burst_size):
            if keep[j]:
                survivors.append(ids[j])
            else:
                b.free(ids[j])
        if len(survivors) > 4 * burst_size // 10:
            for j in rng.permutation(len(survivors))[: len(survivors) // 2]:
                b.free(survivors[j])
                survivors[j] = -1
            survivors = [s for s in survivors if s >= 0]
    return b.trace(f"bursty(seed={seed})")


def fragmenting(rounds: int = 30, pairs: int = 64, seed: int = 0) -> Trace:
    """Adversarial for fragmentation: interleave small long-lived blocks with
    large short-lived ones, free the large ones, then ask for larger blocks
    than any hole between the pinned small ones."""
    rng = np.random.default_rng(seed)
    b = _Builder()
    pinned: list[int] = []
    large = 1 * MIB
    for _ in range(rounds):
        bigs = []
        for _ in range(pairs):
            bigs.append(b.alloc(large + int(rng.integers(0, 64)) * KIB))
            pinned.append(b.alloc(int(rng.integers(1, 16)) * KIB))
        for g in bigs:
            b.free(g)
        large = int(large * 1.1)
        if len(pinned) > 4 * pairs:
            for j in sorted(rng.choice(len(pinned), len(pinned) // 3, replace=False),
                            reverse=True):
                b.free(pinned.pop(j))
    return b.trace(f"fragmenting(seed={seed})")


def random_churn(live: int = 10_000, pairs: int = 100_000, min_size: int = 256,
                 max_size: int = 4 * KIB, seed: int = 0) -> Trace:
    """``live`` allocations, then ``pairs`` times: free one of the live
    allocations, picked at random, and allocate a new one in its place, so
    that ``live`` stay live. Sizes are uniform in ``[min_size, max_size]``.

    The allocate+free pair of a program that holds many allocations: the
    speed report times it with 1,000 and 1,000,000 live, here and in the
    C++ peers (``benchmarks/speed_report.py``). Built with NumPy, a million
    events in well under a second.

    Examples
    --------
    >>> t = random_churn(live=3, pairs=2, seed=1)
    >>> t.ops.tolist(), t.ids.tolist()
    ([0, 0, 0, 1, 0, 1, 0], [0, 1, 2, 2, 3, 0, 4])
    >>> int(t.live_bytes()[-1]) == int(t.sizes[[1, 4, 6]].sum())  # ids 1, 3 and 4
    True
    """
    if live < 1 or pairs < 0:
        raise ValueError(f"random_churn needs live >= 1 and pairs >= 0, got {live} and {pairs}")
    if not 1 <= min_size <= max_size:
        raise ValueError(f"random_churn needs 1 <= min_size <= max_size, got {min_size} "
                         f"and {max_size}")
    rng = np.random.default_rng(seed)
    first = rng.integers(min_size, max_size + 1, live)
    slot = rng.integers(0, live, pairs)  # whose allocation pair k frees
    later = rng.integers(min_size, max_size + 1, pairs)
    # Pair k allocates id live + k in slot[k]; it frees what that slot holds:
    # the allocation of the last earlier pair on the slot, else the first.
    order = np.argsort(slot, kind="stable")
    previous = np.full(pairs, -1, np.int64)
    same = slot[order[1:]] == slot[order[:-1]]
    previous[order[1:][same]] = order[:-1][same]
    freed = np.where(previous >= 0, live + previous, slot)
    n = live + 2 * pairs
    ops = np.zeros(n, np.int8)
    ids = np.empty(n, np.int64)
    sizes = np.zeros(n, np.int64)
    ids[:live] = np.arange(live)
    sizes[:live] = first
    ops[live::2] = 1
    ids[live::2] = freed
    ids[live + 1::2] = live + np.arange(pairs)
    sizes[live + 1::2] = later
    return Trace.from_arrays(ops, ids, sizes, time=np.arange(n, dtype=float),
                             name=f"random_churn(live={live}, pairs={pairs}, seed={seed})")


#: Generator name -> function, for the CLI (``synthetic:NAME`` as a trace).
GENERATORS = {"steady_state": steady_state, "growing_kv_cache": growing_kv_cache,
              "bursty": bursty, "fragmenting": fragmenting, "random_churn": random_churn}
