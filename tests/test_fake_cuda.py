"""The GPU tests on CPU, against a fake CUDA driver (``tests/gpu/fake_libcuda.c``).

The fake driver stands in for ``libcuda.so.1`` under the real numba-cuda and
cuda-bindings, over host memory. These tests check first that it refuses what
a real driver refuses (so that code passing on it has been checked), then run
the whole GPU suite (``tests/gpu``) on it in a fresh process: numba_bfc's EMM
plugin and both CUDA backends under every policy, through real numba-cuda
contexts, device arrays, copies, IPC into a child process and CUDA virtual
memory. Only kernel launches are out of reach; the GPU tests write their data
with host-to-device copies instead.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU_DIR = ROOT / "tests" / "gpu"


def _installed(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a missing parent package
        return False


if not (_installed("cuda.bindings") and _installed("numba_cuda")):
    pytest.skip("needs numba-cuda and cuda-bindings (the 'test' extra installs them)",
                allow_module_level=True)
if not sys.platform.startswith("linux") or not (shutil.which("cc") or shutil.which("gcc")):
    pytest.skip("the fake CUDA driver needs Linux and a C compiler", allow_module_level=True)


def _env(**extra):
    env = dict(os.environ, NUMBA_BFC_FAKE_CUDA="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(GPU_DIR), env.get("PYTHONPATH", "")])
    env.pop("NUMBA_CUDA_MEMORY_MANAGER", None)
    env.pop("NUMBA_BFC_CONF", None)
    return env


# Every probe: the fake driver loaded, cuda-bindings, and helpers that unwrap a
# call's result or name its error.
_PROBE_START = r"""
import ctypes
import json
import threading
import fake_cuda
lib = fake_cuda.preload()
from cuda.bindings import driver as d

R = d.CUresult
out = {}

def ok(res):
    assert res[0] == R.CUDA_SUCCESS, res
    return res[1] if len(res) == 2 else res[1:]

def code(res):
    return (res[0] if isinstance(res, tuple) else res).name
"""

_DRIVER_PROBE = _PROBE_START + r"""
MiB = 1 << 20
ok(d.cuInit(0))
out["alloc_without_context"] = code(d.cuMemAlloc(4096))
ctx = ok(d.cuDevicePrimaryCtxRetain(ok(d.cuDeviceGet(0))))
ok(d.cuCtxPushCurrent(ctx))
free0, total = ok(d.cuMemGetInfo())
out["total"] = int(total)

p = ok(d.cuMemAlloc(4096))
out["free_drops_by_alloc"] = int(free0 - ok(d.cuMemGetInfo())[0])
data = bytes(range(256)) * 16
ok(d.cuMemcpyHtoD(p, data, 4096))
back = bytearray(4096)
ok(d.cuMemcpyDtoH(back, p, 4096))
out["round_trip"] = bytes(back) == data
out["copy_past_end"] = code(d.cuMemcpyHtoD(int(p) + 4000, data, 200))
base, size = ok(d.cuMemGetAddressRange(int(p) + 100))
out["address_range"] = [int(base) == int(p), int(size)]
out["ipc_of_interior"] = code(d.cuIpcGetMemHandle(int(p) + 512))
ok(d.cuMemFree(p))
out["double_free"] = code(d.cuMemFree(p))
out["copy_to_freed"] = code(d.cuMemcpyHtoD(p, data, 16))
out["oom"] = code(d.cuMemAlloc(int(total) + MiB))

prop = d.CUmemAllocationProp()
prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
prop.location.id = 0
g = int(ok(d.cuMemGetAllocationGranularity(
    prop, d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)))
out["granularity"] = g
va = int(ok(d.cuMemAddressReserve(4 * g, g, 0, 0)))
h = ok(d.cuMemCreate(g, prop, 0))
ok(d.cuMemMap(va, g, 0, h, 0))
out["copy_before_access"] = code(d.cuMemcpyHtoD(va, data, 16))
acc = d.CUmemAccessDesc()
acc.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
acc.location.id = 0
acc.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
ok(d.cuMemSetAccess(va, g, [acc], 1))
ok(d.cuMemcpyHtoD(va, data, 4096))
out["map_over_mapped"] = code(d.cuMemMap(va, g, 0, h, 0))
out["map_outside_reservation"] = code(d.cuMemMap(va + 4 * g, g, 0, h, 0))
out["copy_across_unmapped"] = code(d.cuMemcpyHtoD(va + g - 8, data, 16))
out["unmap_half"] = code(d.cuMemUnmap(va, g // 2))
out["address_free_while_mapped"] = code(d.cuMemAddressFree(va, 4 * g))
# The same physical memory mapped at a second address shows the same bytes.
ok(d.cuMemMap(va + 2 * g, g, 0, h, 0))
ok(d.cuMemSetAccess(va + 2 * g, g, [acc], 1))
ok(d.cuMemcpyDtoH(back, va + 2 * g, 4096))
out["remapped_bytes_kept"] = bytes(back) == data
ok(d.cuMemRelease(h))  # still mapped twice: freed when the last mapping goes
out["released_still_counted"] = int(free0 - ok(d.cuMemGetInfo())[0]) == g
ok(d.cuMemUnmap(va, g))
ok(d.cuMemUnmap(va + 2 * g, g))
out["all_back"] = int(ok(d.cuMemGetInfo())[0]) == int(free0)
out["unmap_unmapped"] = code(d.cuMemUnmap(va, g))
ok(d.cuMemAddressFree(va, 4 * g))
# The primary context as an H100 showed it under numba-cuda's cuda.close(): still
# current once released to no retains or reset, but destroyed until retained
# again, under the same handle.
dev = ok(d.cuDeviceGet(0))
ok(d.cuDevicePrimaryCtxRelease(dev))
out["use_after_last_release"] = code(d.cuMemGetInfo())
out["release_without_retain"] = code(d.cuDevicePrimaryCtxRelease(dev))
again = ok(d.cuDevicePrimaryCtxRetain(dev))
out["retain_revives_same_handle"] = [int(again) == int(ctx), code(d.cuMemGetInfo())]
ok(d.cuDevicePrimaryCtxReset(dev))
out["use_after_reset"] = code(d.cuMemGetInfo())
out["release_after_reset"] = code(d.cuDevicePrimaryCtxRelease(dev))
print(json.dumps(out))
"""


def test_fake_driver_refuses_what_a_driver_refuses():
    done = subprocess.run([sys.executable, "-c", _DRIVER_PROBE], capture_output=True, text=True,
                          env=_env(NUMBA_BFC_FAKE_CUDA_MEMORY=str(256 << 20)), timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    bad = "CUDA_ERROR_INVALID_VALUE"
    assert out == {
        "alloc_without_context": "CUDA_ERROR_INVALID_CONTEXT",
        "total": 256 << 20,
        "free_drops_by_alloc": 4096,
        "round_trip": True,
        "copy_past_end": bad,
        "address_range": [True, 4096],
        "ipc_of_interior": bad,
        "double_free": bad,
        "copy_to_freed": bad,
        "oom": "CUDA_ERROR_OUT_OF_MEMORY",
        "granularity": 2 << 20,
        "copy_before_access": bad,
        "map_over_mapped": "CUDA_ERROR_ALREADY_MAPPED",
        "map_outside_reservation": bad,
        "copy_across_unmapped": bad,
        "unmap_half": bad,
        "address_free_while_mapped": bad,
        "remapped_bytes_kept": True,
        "released_still_counted": True,
        "all_back": True,
        "unmap_unmapped": "CUDA_ERROR_NOT_MAPPED",
        "use_after_last_release": "CUDA_ERROR_CONTEXT_IS_DESTROYED",
        "release_without_retain": "CUDA_ERROR_INVALID_CONTEXT",
        "retain_revives_same_handle": [True, "CUDA_SUCCESS"],
        "use_after_reset": "CUDA_ERROR_CONTEXT_IS_DESTROYED",
        "release_after_reset": "CUDA_ERROR_INVALID_CONTEXT",
    }


# The probes below watch the device's bytes without forcing any queued work: an
# async copy into pageable host memory returns done, and on a non-blocking
# stream it waits for nothing but that stream.
_PROBE_COMMON = _PROBE_START + r"""
lib.numba_bfc_fake_counters.argtypes = [ctypes.POINTER(ctypes.c_longlong), ctypes.c_int]
lib.numba_bfc_fake_set_event_delay.argtypes = [ctypes.c_int]
NAMES = ["live_events", "live_streams", "pending_ops", "executed_ops", "illegal_accesses",
         "events_recorded", "event_queries", "event_synchronizes"]
LEGACY, PER_THREAD = 1, 2
A, B = 0xAA, 0xBB
N = 256

def counters():
    buf = (ctypes.c_longlong * 8)()
    assert lib.numba_bfc_fake_counters(buf, 8) == 8
    return dict(zip(NAMES, buf))

ok(d.cuInit(0))
ctx = ok(d.cuDevicePrimaryCtxRetain(ok(d.cuDeviceGet(0))))
ok(d.cuCtxPushCurrent(ctx))
p = ok(d.cuMemAlloc(N))
peek_stream = ok(d.cuStreamCreate(1))  # CU_STREAM_NON_BLOCKING

def peek():
    buf = bytearray(N)
    ok(d.cuMemcpyDtoHAsync(buf, p, N, peek_stream))
    assert len(set(buf)) == 1, buf
    return buf[0]

def reset():
    ok(d.cuCtxSynchronize())
    ok(d.cuMemcpyHtoD(p, bytes(N), N))

def in_thread(fn):
    errors = []
    def body():
        try:
            ok(d.cuCtxSetCurrent(ctx))
            fn()
        except BaseException as e:
            errors.append(repr(e))
    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert not errors, errors
"""

_STREAM_PROBE = _PROBE_COMMON + r"""
out["delay_from_env"] = lib.numba_bfc_fake_set_event_delay(0)
start = counters()
s1, s2 = ok(d.cuStreamCreate(0)), ok(d.cuStreamCreate(0))
n1, n2 = ok(d.cuStreamCreate(1)), ok(d.cuStreamCreate(1))
e = ok(d.cuEventCreate(0))

# Two blocking streams are not ordered with each other.
reset()
ok(d.cuMemsetD8Async(p, A, N, s1))
ok(d.cuMemcpyHtoDAsync(p, bytes([B]) * N, N, s2))
r = [peek()]
ok(d.cuStreamSynchronize(s2))
r.append(peek())
ok(d.cuStreamSynchronize(s1))
out["two_blocking_streams"] = r + [peek()]

# A synchronous copy is on the legacy stream, which waits for blocking streams...
reset()
ok(d.cuMemsetD8Async(p, A, N, s1))
ok(d.cuMemcpyHtoD(p, bytes([B]) * N, N))
ok(d.cuStreamSynchronize(s1))
out["sync_copy_after_blocking_memset"] = peek()

# ... and not for non-blocking ones.
reset()
ok(d.cuMemsetD8Async(p, A, N, n1))
ok(d.cuMemcpyHtoD(p, bytes([B]) * N, N))
r = [peek()]
ok(d.cuStreamSynchronize(n1))
out["sync_copy_before_non_blocking_memset"] = r + [peek()]

# A legacy event after a blocking stream's memset, NOT_READY twice first.
reset()
out["delay_was"] = lib.numba_bfc_fake_set_event_delay(2)
ok(d.cuMemsetD8Async(p, A, N, s1))
ok(d.cuEventRecord(e, LEGACY))
r = [code(d.cuEventQuery(e)), code(d.cuEventQuery(e)), peek(), code(d.cuEventQuery(e)), peek()]
back = bytearray(N)
ok(d.cuMemcpyDtoH(back, p, N))
out["legacy_event_with_delay"] = r + [back[0]]
# The delay holds for an event with no work before it, and for stream queries.
idle = ok(d.cuEventCreate(0))
ok(d.cuEventRecord(idle, n2))
out["idle_event_with_delay"] = [code(d.cuEventQuery(idle)) for _ in range(3)]
ok(d.cuMemsetD8Async(p, B, N, s2))
out["stream_query_with_delay"] = [code(d.cuStreamQuery(s2)) for _ in range(3)] + [peek()]
out["delay_back"] = lib.numba_bfc_fake_set_event_delay(0)

# A legacy event does not wait for a non-blocking stream.
reset()
ok(d.cuMemsetD8Async(p, A, N, n1))
ok(d.cuEventRecord(e, 0))
r = [code(d.cuEventQuery(e)), peek()]
ok(d.cuStreamSynchronize(n1))
out["legacy_event_skips_non_blocking"] = r + [peek()]

# cuStreamWaitEvent: without it n2's copy runs alone; with it, after n1's memset.
reset()
ok(d.cuMemsetD8Async(p, A, N, n1))
ok(d.cuMemcpyHtoDAsync(p, bytes([B]) * N, N, n2))
ok(d.cuStreamSynchronize(n2))
ok(d.cuStreamSynchronize(n1))
r = [peek()]
reset()
ok(d.cuMemsetD8Async(p, A, N, n1))
ok(d.cuEventRecord(e, n1))
ok(d.cuStreamWaitEvent(n2, e, 0))
ok(d.cuMemcpyHtoDAsync(p, bytes([B]) * N, N, n2))
ok(d.cuStreamSynchronize(n2))
r.append(peek())
ok(d.cuStreamSynchronize(n1))
out["wait_event"] = r + [peek()]

# The per-thread default stream is blocking: a legacy event waits for it...
reset()
ok(d.cuMemsetD8Async(p, A, N, PER_THREAD))
ok(d.cuEventRecord(e, LEGACY))
ok(d.cuEventSynchronize(e))
r = [peek()]
# ... but another thread's per-thread stream is another stream.
reset()
ok(d.cuMemsetD8Async(p, A, N, PER_THREAD))
def other():
    ok(d.cuMemsetD8Async(p, B, N, PER_THREAD))
    ok(d.cuStreamSynchronize(PER_THREAD))
in_thread(other)
r.append(peek())
ok(d.cuStreamSynchronize(PER_THREAD))
out["per_thread_stream"] = r + [peek()]

# An async copy to pageable host memory returns done; to pinned memory, not.
reset()
ok(d.cuMemsetD8Async(p, A, N, s1))
pageable = bytearray(N)
ok(d.cuMemcpyDtoHAsync(pageable, p, N, s1))
hp = ok(d.cuMemHostAlloc(N, 0))
ctypes.memset(hp, 0x11, N)
ok(d.cuMemsetD8Async(p, B, N, s1))
ok(d.cuMemcpyDtoHAsync(hp, p, N, s1))
r = [pageable[0], ctypes.string_at(hp, N)[0]]
ok(d.cuStreamSynchronize(s1))
out["dtoh_async"] = r + [ctypes.string_at(hp, N)[0]]
ok(d.cuMemFreeHost(hp))

# A memset queued into a mapping that is unmapped before it runs.
prop = d.CUmemAllocationProp()
prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
prop.location.id = 0
g = int(ok(d.cuMemGetAllocationGranularity(
    prop, d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)))
va = int(ok(d.cuMemAddressReserve(g, g, 0, 0)))
h = ok(d.cuMemCreate(g, prop, 0))
ok(d.cuMemMap(va, g, 0, h, 0))
acc = d.CUmemAccessDesc()
acc.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
acc.location.id = 0
acc.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
ok(d.cuMemSetAccess(va, g, [acc], 1))
illegal0 = counters()["illegal_accesses"]
ok(d.cuMemsetD8Async(va, A, g, n1))
ok(d.cuMemUnmap(va, g))
out["unmapped_before_run"] = [code(d.cuStreamSynchronize(n1)),
                              counters()["illegal_accesses"] - illegal0,
                              code(d.cuStreamSynchronize(n1)), code(d.cuCtxSynchronize())]
ok(d.cuMemRelease(h))
ok(d.cuMemAddressFree(va, g))

# The counters.
c0 = counters()
ev, st = ok(d.cuEventCreate(0)), ok(d.cuStreamCreate(0))
ok(d.cuMemsetD8Async(p, A, N, st))
ok(d.cuEventRecord(ev, st))
ok(d.cuEventRecord(ev, st))
code(d.cuEventQuery(ev))
ok(d.cuEventSynchronize(ev))
c1 = counters()
ok(d.cuMemsetD8Async(p, B, N, st))
c2 = counters()
ok(d.cuCtxSynchronize())
c3 = counters()
ok(d.cuEventDestroy(ev))
ok(d.cuStreamDestroy(st))
c4 = counters()
out["counters_delta"] = {k: c1[k] - c0[k] for k in NAMES}
out["pending"] = [c2["pending_ops"], c3["pending_ops"]]
for x in (e, idle):
    ok(d.cuEventDestroy(x))
for x in (s1, s2, n1, n2):
    ok(d.cuStreamDestroy(x))
end = counters()
out["live_back_to_start"] = [[start[k], c4[k] - c0[k], end[k] - start[k]]
                             for k in ("live_events", "live_streams")]
print(json.dumps(out))
"""

# Run twice: as is, stream 0 is the legacy stream, shared by all threads; with
# CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1, each thread's own.
_PTDS_PROBE = _PROBE_COMMON + r"""
lib.numba_bfc_fake_set_event_delay(0)
ok(d.cuMemsetD8Async(p, A, N, 0))
def other():
    ok(d.cuMemsetD8Async(p, B, N, 0))
    ok(d.cuStreamSynchronize(0))
in_thread(other)
r = [peek()]
ok(d.cuStreamSynchronize(0))
out["async_memsets_on_stream_0"] = r + [peek()]

reset()
ok(d.cuMemsetD8Async(p, A, N, 0))
in_thread(lambda: ok(d.cuMemcpyHtoD(p, bytes([B]) * N, N)))
r = [peek()]
ok(d.cuStreamSynchronize(0))
out["sync_copy_in_another_thread"] = r + [peek()]

# Either way stream 0 is a blocking stream: the legacy stream waits for it.
reset()
ok(d.cuMemsetD8Async(p, A, N, 0))
n1 = ok(d.cuStreamCreate(1))
ok(d.cuMemcpyHtoDAsync(p, bytes([B]) * N, N, n1))
ok(d.cuStreamSynchronize(n1))
r = [peek()]
e = ok(d.cuEventCreate(0))
ok(d.cuEventRecord(e, LEGACY))
ok(d.cuEventSynchronize(e))
out["legacy_event_waits_for_stream_0"] = r + [peek()]
print(json.dumps(out))
"""


def _probe(script, **env):
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=_env(**env), timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_fake_driver_orders_work_as_cuda_streams_do():
    """Work runs late, in CUDA's stream order: what a stream, event or
    synchronous call does not wait for has not happened yet."""
    A, B = 0xAA, 0xBB
    ready, not_ready = "CUDA_SUCCESS", "CUDA_ERROR_NOT_READY"
    out = _probe(_STREAM_PROBE, NUMBA_BFC_FAKE_CUDA_EVENT_DELAY="5")
    assert out == {
        "delay_from_env": 5,
        # queued, nothing run; s2's copy; then s1's memset over it
        "two_blocking_streams": [0, B, A],
        "sync_copy_after_blocking_memset": B,
        "sync_copy_before_non_blocking_memset": [B, A],
        "delay_was": 0,
        # two NOT_READY with the memset still queued, then done, and it ran
        "legacy_event_with_delay": [not_ready, not_ready, 0, ready, A, A],
        "idle_event_with_delay": [not_ready, not_ready, ready],
        "stream_query_with_delay": [not_ready, not_ready, ready, B],
        "delay_back": 2,
        "legacy_event_skips_non_blocking": [ready, 0, A],
        "wait_event": [A, B, B],
        "per_thread_stream": [A, B, A],
        "dtoh_async": [A, 0x11, B],
        "unmapped_before_run": ["CUDA_ERROR_ILLEGAL_ADDRESS", 1, ready, ready],
        # two records (the second replaces the first marker): memset + 2 markers ran
        "counters_delta": {"live_events": 1, "live_streams": 1, "pending_ops": 0,
                           "executed_ops": 3, "illegal_accesses": 0, "events_recorded": 2,
                           "event_queries": 1, "event_synchronizes": 1},
        "pending": [1, 0],
        # [at start (the probe's peek stream), after destroying, end minus start]
        "live_back_to_start": [[0, 0, 0], [1, 0, 0]],
    }


def test_per_thread_default_stream_mode_makes_stream_0_per_thread():
    legacy = _probe(_PTDS_PROBE)
    per_thread = _probe(_PTDS_PROBE, CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM="1")
    A, B = 0xAA, 0xBB
    # One legacy stream: the other thread's synchronize ran our memset first.
    assert legacy == {"async_memsets_on_stream_0": [B, B], "sync_copy_in_another_thread": [B, B],
                      "legacy_event_waits_for_stream_0": [B, A]}
    # Per-thread streams: the other thread's work ran alone, ours after.
    assert per_thread == {"async_memsets_on_stream_0": [B, A],
                          "sync_copy_in_another_thread": [B, A],
                          "legacy_event_waits_for_stream_0": [B, A]}


def _run_gpu_tests(tmp_path, target, **env):
    """``pytest -m cuda target`` on the fake driver; its test cases (JUnit XML)."""
    report = tmp_path / "gpu.xml"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda",
         str(target), f"--junitxml={report}"],
        capture_output=True, text=True, cwd=ROOT, env=_env(**env), timeout=900)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    return list(ET.parse(report).getroot().iter("testcase"))


def _skipped(cases):
    return [c.get("name") for c in cases if c.find("skipped") is not None]


def test_gpu_suite_passes_on_the_fake_driver(tmp_path):
    """``NUMBA_BFC_FAKE_CUDA=1 python -m pytest -m cuda tests/gpu``: every test that
    needs no kernel runs, and passes."""
    cases = _run_gpu_tests(tmp_path, GPU_DIR)
    # Only the CuPy test needs a kernel; everything else ran.
    assert _skipped(cases) == ["test_cupy_arrays_come_from_the_shared_pool"], _skipped(cases)
    assert len(cases) >= 70


def test_stream_safety_holds_in_per_thread_default_stream_mode(tmp_path):
    """With ``CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1`` Numba's default stream and
    its synchronous copies are each thread's per-thread stream, not the legacy
    one; the plugin's legacy-stream events still order them (they are blocking
    streams), so the stream-safety tests pass unchanged."""
    cases = _run_gpu_tests(tmp_path, GPU_DIR / "test_gpu_stream_safety.py",
                           CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM="1")
    assert _skipped(cases) == [] and len(cases) >= 30


def test_numba_cuda_own_tests_pass_as_with_numbas_manager(tmp_path):
    """numba-cuda's allocation, context, IPC and array test modules, run by
    ``tests/gpu/run_numba_cuda_suite.sh`` on the fake driver with numba_bfc and
    with Numba's default manager: none fails only with numba_bfc (tests that
    launch kernels fail under both). The interpreter is given by a path
    relative to the project root, which the script must resolve before it
    changes folders."""
    pytest.importorskip("filecheck")  # numba.cuda.testing imports it
    done = subprocess.run(["bash", str(GPU_DIR / "run_numba_cuda_suite.sh"), str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT,
                          env=_env(PYTHON=os.path.relpath(sys.executable, ROOT)), timeout=900)
    summary = tmp_path / "summary.md"
    assert done.returncode == 0, (summary.read_text() if summary.exists() else
                                  done.stdout[-4000:] + done.stderr[-4000:])
    assert (tmp_path / "manager-numba_bfc.txt").read_text().strip() == "NumbaBFCMemoryManager"
    cases = list(ET.parse(tmp_path / "numba_bfc.xml").getroot().iter("testcase"))
    passed = [c for c in cases if not any(ch.tag in ("failure", "error", "skipped") for ch in c)]
    assert len(passed) >= 100, len(passed)
