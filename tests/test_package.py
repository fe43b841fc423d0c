"""Package-level promises: import compiles nothing, fast calls match the dispatcher, CLI."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_NO_COMPILE = r"""
import sys
import numba_bfc, numba_bfc.backends, numba_bfc.testing, numba_bfc.testing.invariants
import numba_bfc.planning, numba_bfc.demo
from numba.core.registry import CPUDispatcher
mods = [m for n, m in list(sys.modules.items()) if n.startswith("numba_bfc")]
kernels = [obj for m in mods for obj in vars(m).values() if isinstance(obj, CPUDispatcher)]
print(len(kernels), sum(bool(k.signatures) for k in kernels))
"""

# Random allocations and frees through the API: ``out`` holds every address.
_RANDOM_CALLS = r"""
import json, random
from numba_bfc import BFCAllocator
from numba_bfc.backends import VirtualSubAllocator
a = BFCAllocator(VirtualSubAllocator(), memory_limit=1 << 28)
rng, live, out = random.Random(3), [], []
for _ in range(3000):
    if live and rng.random() < 0.5:
        a.deallocate_raw(live.pop(rng.randrange(len(live))))
    else:
        live.append(a.allocate_raw(rng.randint(1, 1 << 18)))
        out.append(live[-1])
"""

_SCENARIO = _RANDOM_CALLS + r"""
from numba_bfc.allocators import bfc as F
print(json.dumps([F.BFCAllocator._ALLOCATE.fast, out, a.get_stats().to_dict()]))
"""


def _run(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=ROOT, env={**os.environ, **env}).stdout


def test_import_compiles_nothing():
    found, compiled = map(int, _run(_NO_COMPILE).split())
    assert found > 30 and compiled == 0


_ONE_COMPILE_EACH = r"""
import json, sys
from numba_bfc import BFCAllocator, CachingAllocator, CompactAllocator, SharedCounter
from numba_bfc.backends import VirtualSubAllocator
from numba_bfc.traces import replay
from numba_bfc.traces.data import load_bundled
from numba.core.registry import CPUDispatcher
for cls in (BFCAllocator, CachingAllocator, CompactAllocator):
    a = cls(VirtualSubAllocator(contiguous=True), memory_limit=1 << 30)
    a.deallocate_raw(a.allocate_raw(1000))
    replay(load_bundled("cnn_train"), a.name)
# compact's out-of-memory release, in the batch kernel and through the façade
trace = load_bundled("cnn_train")
replay(trace, "compact", limit=int(1.25 * int(trace.live_bytes().max())))
a = CompactAllocator(VirtualSubAllocator(contiguous=True), memory_limit=1 << 30)
p = [a.allocate_raw(3 << 20) for _ in range(3)]
a.deallocate_raw(p[1])
a.empty_cache()
a = BFCAllocator(VirtualSubAllocator(), memory_limit=1 << 30)
a.set_timing_counter(SharedCounter())
a.deallocate_raw(a.allocate_raw(1000))
a.allocate_raw(1000)
mods = [m for n, m in list(sys.modules.items())
        if n.startswith(("numba_bfc.kernels", "numba_bfc.policies"))]
kernels = {obj for m in mods for obj in vars(m).values() if isinstance(obj, CPUDispatcher)}
print(json.dumps({k.py_func.__qualname__: [str(s) for s in k.signatures] for k in kernels}))
"""


def test_every_kernel_compiles_once(tmp_path):
    """Each compile is a third of a second of cold start: with an empty
    Numba cache, allocating, freeing, timed frees and replays under every
    policy compile every kernel for one signature only (see kernels/jit.py),
    but the batch body: once per policy, with that policy's kernels."""
    compiled = json.loads(_run(_ONE_COMPILE_EACH, NUMBA_CACHE_DIR=str(tmp_path)))
    assert sum(map(len, compiled.values())) > 40
    several = {name: len(sigs) for name, sigs in compiled.items() if len(sigs) > 1}
    assert several == {"run_batch": 3}


def test_fast_entry_points_match_dispatcher():
    fast, out_f, stats_f = json.loads(_run(_SCENARIO))
    slow, out_s, stats_s = json.loads(_run(_SCENARIO, NUMBA_BFC_FASTCALL="0"))
    assert fast is True and slow is False
    assert out_f == out_s and stats_f == stats_s


def test_demo_cli_runs():
    r = subprocess.run([sys.executable, "-m", "numba_bfc", "demo", "--ops", "2000"],
                       capture_output=True, text=True, check=True, cwd=ROOT)
    assert "random allocate/free calls" in r.stdout and "Fragmentation:" in r.stdout
    occupancy = r.stdout.splitlines()[-2]
    assert len(occupancy) == 100 and set(occupancy) <= set("*x_")


def test_cli_version_and_a_bad_demo_size():
    """Issue 21: no ``--version``; ``demo --ops -5`` ran."""
    from numba_bfc import __version__

    run = [sys.executable, "-m", "numba_bfc"]
    r = subprocess.run(run + ["--version"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == f"numba-bfc {__version__}"
    for bad in ("-5", "0", "many"):
        r = subprocess.run(run + ["demo", "--ops", bad], capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert r.stderr.strip().splitlines()[-1].startswith("numba-bfc demo: error:")


_CACHE_PROBE = """
from numba_bfc.kernels.chunks import round_up
round_up(5, 4)
print(sum(round_up.stats.cache_hits.values()))
"""


def test_the_kernel_cache_is_dropped_when_any_kernel_source_changes(tmp_path):
    """Numba's cache checks only a function's own file; ours also the package's
    other kernel sources, whose helpers and table layout a kernel compiles in,
    and NUMBA_BOUNDSCHECK, which Numba's own key leaves out."""
    import shutil

    pkg = tmp_path / "pkg"
    shutil.copytree(ROOT / "numba_bfc", pkg / "numba_bfc",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_BOUNDSCHECK"}
    env.update(PYTHONPATH=str(pkg), NUMBA_CACHE_DIR=str(tmp_path / "cache"))

    def cache_hits(**more):
        done = subprocess.run([sys.executable, "-c", _CACHE_PROBE], capture_output=True,
                              text=True, env={**env, **more}, cwd=tmp_path, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return int(done.stdout.split()[-1])

    assert cache_hits() == 0  # compiled and cached
    assert cache_hits() == 1  # loaded from the cache
    layout = pkg / "numba_bfc" / "kernels" / "layout.py"
    layout.write_text(layout.read_text() + "\n# another file changed\n")
    assert cache_hits() == 0  # chunks.py is unchanged, but its cache is stale
    assert cache_hits() == 1
    assert cache_hits(NUMBA_BOUNDSCHECK="1") == 0  # not the unchecked code
    assert cache_hits(NUMBA_BOUNDSCHECK="1") == 1
    assert cache_hits() == 0


_INLINE_ONLY_SCENARIO = _RANDOM_CALLS + r"""
from numba_bfc.kernels import chunks, jit
from numba_bfc.traces import replay
from numba_bfc.traces.data import load_bundled
trace = load_bundled("cnn_train")
limit = int(1.25 * int(trace.live_bytes().max()))
replays = [replay(trace, policy, limit=limit) for policy in ("bfc", "caching", "compact")]
played = [[r.peak_in_use_bytes, r.peak_reserved_bytes, r.backend_allocs, r.ooms,
           r.addresses.tolist()] for r in replays]
print(json.dumps([jit.inline_only is not None, type(chunks.split_chunk).__name__, out,
                  a.get_stats().to_dict(), played]))
"""


def test_inline_only_helpers_decide_as_numbas_default_compile(tmp_path):
    """``kernels._inline_only`` changes how helpers are compiled, not what the
    kernels do: with it off (Numba's default, every helper compiled and cached
    on its own), the same calls and replays give the same addresses and figures.
    Each run has an empty cache of its own, as both share the kernels' cache keys."""
    on = json.loads(_run(_INLINE_ONLY_SCENARIO, NUMBA_CACHE_DIR=str(tmp_path / "on")))
    off = json.loads(_run(_INLINE_ONLY_SCENARIO, NUMBA_CACHE_DIR=str(tmp_path / "off"),
                          NUMBA_BFC_INLINE_ONLY="0"))
    assert on[:2] == [True, "InlineOnlyDispatcher"]
    assert off[:2] == [False, "CPUDispatcher"]
    assert on[2:] == off[2:]
    assert any(r[3] for r in on[4])  # the replays reached their slow paths


_WARM_START = r"""
import json, sys
from numba_bfc import BFCAllocator
from numba_bfc.backends import VirtualSubAllocator
from numba_bfc.kernels import _inline_only
from numba.core.registry import CPUDispatcher
a = BFCAllocator(VirtualSubAllocator(), memory_limit=1 << 30)
a.deallocate_raw(a.allocate_raw(1000))
mods = [m for n, m in list(sys.modules.items()) if n.startswith("numba_bfc")]
kernels = {obj for m in mods for obj in vars(m).values() if isinstance(obj, CPUDispatcher)}
inner = [k for k in kernels if type(k).__name__ == "InlineOnlyDispatcher"]
compiled = sorted(k.py_func.__qualname__ for k in kernels
                  if sum(k.stats.cache_misses.values()) > sum(k.stats.cache_hits.values()))
print(json.dumps([len(inner), sum(bool(k.signatures) for k in inner), compiled]))
"""


def test_a_warm_start_compiles_no_helper(tmp_path):
    """Inline-only helpers have no cache entry of their own: the kernels that
    inline them are cached with their code, so a warm start compiles nothing."""
    cold = json.loads(_run(_WARM_START, NUMBA_CACHE_DIR=str(tmp_path)))
    warm = json.loads(_run(_WARM_START, NUMBA_CACHE_DIR=str(tmp_path)))
    assert cold[0] > 20 and cold[1] > 10 and cold[2]  # compiled, inner helpers too
    assert warm[0] == cold[0] and warm[1:] == [0, []]


_FIRST_ALLOCATION = r"""
import json, sys
from numba_bfc import BFCAllocator
from numba_bfc.backends import VirtualSubAllocator
from numba.core.registry import CPUDispatcher

def compiled():
    mods = [m for n, m in list(sys.modules.items()) if n.startswith("numba_bfc")]
    kernels = {obj for m in mods for obj in vars(m).values() if isinstance(obj, CPUDispatcher)}
    return sorted(k.py_func.__qualname__ for k in kernels
                  if type(k).__name__ != "InlineOnlyDispatcher" and k.signatures)

# A backend whose regions can join: the second region extends the first.
a = BFCAllocator(VirtualSubAllocator(contiguous=True), memory_limit=1 << 30)
a.allocate_raw(1000)
first = compiled()
a.allocate_raw(3 << 20)
print(json.dumps([first, compiled()]))
"""


def test_a_first_allocation_compiles_no_region_joining(tmp_path):
    """The first region has nothing to join: a first allocation compiles the
    allocation kernel and the one that adds a region of its own, not the
    joining (and coalescing) code, which the second region compiles."""
    first, then = json.loads(_run(_FIRST_ALLOCATION, NUMBA_CACHE_DIR=str(tmp_path),
                                  NUMBA_BFC_INLINE_ONLY="1"))
    assert first == ["add_separate_region_op", "bfc_allocate_op"]
    assert set(then) - set(first) == {"add_region_op"}


_ALL_POLICIES = r"""
import json, random
from numba_bfc import (BFCAllocator, CachingAllocator, CompactAllocator, OutOfMemoryError,
                       SharedCounter)
from numba_bfc.backends import VirtualSubAllocator
from numba_bfc.traces import replay
from numba_bfc.traces.data import load_bundled

def churn(a, seed, counter=None, empty_cache=False):
    # Random calls near a tight limit: out-of-memory paths, and what each policy adds.
    rng, live, got, ooms = random.Random(seed), [], [], 0
    for step in range(1500):
        if counter is not None and step % 7 == 0:
            a.set_safe_frontier(max(counter.get() - 3, 0))
        if empty_cache and step % 97 == 0:
            a.empty_cache()
        if live and rng.random() < 0.5:
            a.deallocate_raw(live.pop(rng.randrange(len(live))))
            continue
        try:
            live.append(a.allocate_raw(rng.choice([rng.randint(1, 4096),
                                                   rng.randint(1, 3 << 20)])))
            got.append(live[-1])
        except OutOfMemoryError:
            ooms += 1
    return [got, ooms]

out = {}
backend = lambda: VirtualSubAllocator(contiguous=True)
bfc = BFCAllocator(backend(), memory_limit=24 << 20)
bfc.set_timing_counter(counter := SharedCounter())  # timestamped frees and their merging
out["bfc"] = churn(bfc, 1, counter=counter)
caching = CachingAllocator(backend(), memory_limit=24 << 20, expandable_segments=True)
out["caching"] = churn(caching, 2, empty_cache=True)  # expandable map and unmap
for threshold in (0, 8 << 10):  # pages given back from the middle, and free tails
    compact = CompactAllocator(backend(), memory_limit=24 << 20, page_size=4 << 10,
                               release_threshold=threshold)
    out[f"compact {threshold}"] = churn(compact, 3, empty_cache=True)
trace = load_bundled("cnn_train")
for factor in (1.05, 1.25):
    limit = int(factor * int(trace.live_bytes().max()))
    for name in ("bfc", "caching", "compact"):
        r = replay(trace, name, limit=limit)
        out[f"{name} {factor}"] = [r.ooms, r.peak_reserved_bytes, r.addresses.tolist()]
print(json.dumps(out))
"""


def test_no_kernel_indexes_a_table_out_of_range(tmp_path):
    """``kernels.fields`` trusts its rows (no negative-row adjustment, no bounds
    check): with ``NUMBA_BOUNDSCHECK=1`` every row is checked, and random calls
    near a tight limit (timestamped frees, expandable segments, pages given back)
    and replays at 1.05x and 1.25x the peak, under every policy, run as without."""
    checked = json.loads(_run(_ALL_POLICIES, NUMBA_BOUNDSCHECK="1",
                              NUMBA_CACHE_DIR=str(tmp_path)))
    assert checked == json.loads(_run(_ALL_POLICIES, NUMBA_BOUNDSCHECK="0"))
    assert all(checked[name][1] for name in ("bfc", "caching", "compact 0", "compact 8192"))
    assert all(checked[f"{name} 1.05"][0] for name in ("bfc", "caching", "compact"))


def test_an_inline_only_helper_called_from_python_raises():
    """Without a Python entry point, Numba's dispatcher would call a null wrapper
    and crash the process; an inline-only helper raises instead."""
    from numba_bfc.kernels import chunks, jit

    if jit.inline_only is None:
        pytest.skip("Numba's internals for inline-only helpers are missing")
    with pytest.raises(TypeError, match="bin_for_size runs only inlined"):
        chunks.bin_for_size(100, 256, 21)
