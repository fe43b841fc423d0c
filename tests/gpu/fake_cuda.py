"""A fake CUDA driver over host memory (``fake_libcuda.c``), for running the GPU tests on CPU.

``preload()`` compiles the driver (once per source version, with the system C
compiler) and loads it as ``libcuda.so.1`` before numba-cuda or cuda-bindings
look for the driver, so that both find it instead of a real one. Then the
real numba-cuda and cuda-bindings code runs against it: contexts, device
memory, copies, IPC and CUDA virtual memory work; kernels cannot be compiled
or launched.

Set ``NUMBA_BFC_FAKE_CUDA=1`` to have ``gpu_support`` preload it.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_libcuda.c")
ENV = "NUMBA_BFC_FAKE_CUDA"
_loaded: ctypes.CDLL | None = None


class FakeCudaUnavailable(RuntimeError):
    """The fake driver cannot be built or loaded here."""


def requested() -> bool:
    """True when ``NUMBA_BFC_FAKE_CUDA`` asks for the fake driver."""
    return os.environ.get(ENV, "") not in ("", "0")


def build() -> Path:
    """Compile ``fake_libcuda.c`` (cached by its hash); the path of ``libcuda.so.1``."""
    src = SOURCE.read_bytes()
    digest = hashlib.sha256(src).hexdigest()[:16]
    out_dir = Path(tempfile.gettempdir()) / "numba_bfc_fake_cuda" / digest
    lib = out_dir / "libcuda.so.1"
    if lib.exists():
        return lib
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None or not sys.platform.startswith("linux"):
        raise FakeCudaUnavailable("the fake CUDA driver needs Linux and a C compiler (cc or gcc)")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f"libcuda.so.1.{os.getpid()}"
    cmd = [cc, "-shared", "-fPIC", "-O1", "-Wall", "-Wl,-soname,libcuda.so.1",
           "-o", str(tmp), str(SOURCE), "-ldl", "-lpthread"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise FakeCudaUnavailable(f"compiling the fake CUDA driver failed:\n{done.stderr}")
    tmp.replace(lib)  # atomic: parallel builders never see half a library
    return lib


def preload() -> ctypes.CDLL:
    """Build and load the fake driver as ``libcuda.so.1``, before numba-cuda is imported
    (idempotent).

    Raises
    ------
    FakeCudaUnavailable
        No compiler, or numba-cuda's driver module was imported already (it
        looks for the driver once, at import).
    """
    global _loaded
    if _loaded is not None:
        return _loaded
    if "numba.cuda.cudadrv.driver" in sys.modules:
        raise FakeCudaUnavailable(
            "numba.cuda was imported before the fake CUDA driver was loaded; run the GPU "
            "tests in their own process (NUMBA_BFC_FAKE_CUDA=1 python -m pytest tests/gpu)")
    _loaded = ctypes.CDLL(str(build()), mode=ctypes.RTLD_GLOBAL)
    return _loaded
