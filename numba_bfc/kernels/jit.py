"""How kernels are compiled: three decorators, one per role.

Compiling is what a cold start costs (about 0.3 s per function here), and
Numba spends much of it on wrappers a function may never need: the CPython
wrapper (for calls from Python) and the C wrapper (for ctypes/cffi callers;
nobody calls a kernel that way). So:

- ``operation``: what the façade calls (``*_op``, the batch kernel): a
  CPython wrapper, no C wrapper.
- ``helper``: inlined into the operations by LLVM (``forceinline``: the calls
  between helpers pass several machine words per array, and cost more than
  the work they do), and also called from Python (by the façade or tests).
- ``inner``: a ``helper`` that only kernels call: no wrapper at all.

All are cached (``cache=True``) and none releases the GIL (``kernels.guard``).
"""

from __future__ import annotations

from numba import njit

operation = njit(cache=True, no_cfunc_wrapper=True)
helper = njit(cache=True, forceinline=True, no_cfunc_wrapper=True)
inner = njit(cache=True, forceinline=True, no_cfunc_wrapper=True, no_cpython_wrapper=True)
