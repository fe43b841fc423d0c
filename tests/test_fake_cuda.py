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


_DRIVER_PROBE = r"""
import json
import fake_cuda
fake_cuda.preload()
from cuda.bindings import driver as d

R = d.CUresult
out = {}

def ok(res):
    assert res[0] == R.CUDA_SUCCESS, res
    return res[1] if len(res) == 2 else res[1:]

def code(res):
    return (res[0] if isinstance(res, tuple) else res).name

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
    }


def test_gpu_suite_passes_on_the_fake_driver(tmp_path):
    """``NUMBA_BFC_FAKE_CUDA=1 python -m pytest -m cuda tests/gpu``: every test that
    needs no kernel runs, and passes."""
    report = tmp_path / "gpu.xml"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda",
         str(GPU_DIR), f"--junitxml={report}"],
        capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=900)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    cases = list(ET.parse(report).getroot().iter("testcase"))
    skipped = [c.get("name") for c in cases if c.find("skipped") is not None]
    # Only the CuPy test needs a kernel; everything else ran.
    assert skipped == ["test_cupy_arrays_come_from_the_shared_pool"], skipped
    assert len(cases) - len(skipped) >= 40


def test_numba_cuda_own_tests_pass_as_with_numbas_manager(tmp_path):
    """numba-cuda's allocation, context, IPC and array test modules, run by
    ``tests/gpu/run_numba_cuda_suite.sh`` on the fake driver with numba_bfc and
    with Numba's default manager: none fails only with numba_bfc (tests that
    launch kernels fail under both)."""
    pytest.importorskip("filecheck")  # numba.cuda.testing imports it
    done = subprocess.run(["bash", str(GPU_DIR / "run_numba_cuda_suite.sh"), str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT,
                          env=_env(PYTHON=sys.executable), timeout=900)
    summary = tmp_path / "summary.md"
    assert done.returncode == 0, (summary.read_text() if summary.exists() else
                                  done.stdout[-4000:] + done.stderr[-4000:])
    assert (tmp_path / "manager-numba_bfc.txt").read_text().strip() == "NumbaBFCMemoryManager"
    cases = list(ET.parse(tmp_path / "numba_bfc.xml").getroot().iter("testcase"))
    passed = [c for c in cases if not any(ch.tag in ("failure", "error", "skipped") for ch in c)]
    assert len(passed) >= 100, len(passed)
