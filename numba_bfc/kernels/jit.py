"""How kernels are compiled: four decorators, one per role.

Compiling is what a cold start costs (a first allocation compiles about 20
functions in 2-2.5 s here), and Numba spends part of it on code a function
may never need: the CPython wrapper (for calls from Python) and the
C wrapper (for callers in C; only the allocators' call bridge calls kernels
that way, so ``njit`` here leaves it out unless asked). So:

- ``operation``: what the façade calls (``*_op``, the batch kernel): a
  CPython wrapper, no C wrapper.
- ``fast_operation``: an ``operation`` the façade's common calls also make
  from C (``allocators._fastpath``): with the C wrapper as well, whose
  address they call.
- ``helper``: inlined into the operations by LLVM (``forceinline``: the calls
  between helpers pass several machine words per array, and cost more than
  the work they do), and also called from Python by the façade.
- ``inner``: a ``helper`` that only kernels call: no wrapper at all (tests
  call one through a kernel of their own; a wrapper is compiled with its
  function whether or not anything calls it from Python), and compiled only
  into its callers (``kernels._inline_only``): no machine code or cache entry
  of its own, which nothing would use.

All are cached (``cache=True``), an ``inner`` helper inside the kernels that
inline it, and none releases the GIL (``kernels.guard``).

None of the four counts references (Numba's NRT, ``_nrt=False``): a kernel
owns no memory. Its tables are views of memory the façade holds
(``kernels.guard``), and its other arrays are the caller's for the length of
the call. Numba would still count every one each time a function takes,
names or passes it on: about 3,000 increments and decrements in a first
allocation, lowered, then proved useless by LLVM, about 5% of a cold first
allocation (``docs/performance.md``); and each call from Python would adapt
every array argument into a counted one and release it after. Without NRT a
kernel cannot make an array (Numba says so when compiling it: a caller passes
scratch space instead) and must not return one, nor anything else holding a
counted reference: a caller that counts would release a reference it never
took, so a compiler pass refuses that when typing the kernel
(``kernels._inline_only.owning_nothing``). ``njit`` here counts unless given
those options, whoever compiles the function first (Numba would take the flag
from the caller): the planners' kernels, which make arrays, count. A kernel
may call one of them, but not one that returns an array it made (it would
never be released); none does.

Every cached kernel of the package is compiled through ``njit`` here, which keys
Numba's cache on all the package's kernel sources, not only the function's
own file. Numba checks only that file, yet a kernel inlines helpers from
other files and builds its table views from ``layout``'s dtypes: after an
edit there, or an upgrade that changed them, the cache would serve machine
code built for the old layout. It keys the cache on ``NUMBA_BOUNDSCHECK``
too, which Numba's key leaves out: the kernels' table rows are checked only
under it (``kernels.fields``), and a cache filled without it would serve
unchecked code.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from numba import njit as _numba_njit
from numba.core import config

from numba_bfc.kernels._inline_only import inline_only, owning_nothing

# The packages whose modules define kernels; any of them may be inlined into another.
_KERNEL_PACKAGES = ("kernels", "policies", "planning", "traces")


@functools.cache
def kernel_sources_digest() -> str:
    """A digest of every kernel source file of the package (computed once)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for package in _KERNEL_PACKAGES:
        for path in sorted((root / package).glob("*.py")):
            digest.update(f"{package}/{path.name}".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def njit(**options: Any) -> Callable[[Callable], Any]:
    """``numba.njit(**options)``, whose cache (with ``cache=True``) is valid only
    for the current kernel sources of the whole package, and without the C
    wrapper unless ``no_cfunc_wrapper=False`` asks for it."""
    options.setdefault("no_cfunc_wrapper", True)
    # Counted unless asked otherwise: Numba would otherwise take the flag from
    # whichever caller compiled the function first (a kernel that counts nothing).
    options.setdefault("_nrt", True)

    def decorate(fn: Callable) -> Any:
        dispatcher = _numba_njit(**options)(fn)
        # Numba stores the stamp of the function's file in the cache index and
        # drops entries whose stamp differs; adding the digest drops them when
        # any kernel source changed, and NUMBA_BOUNDSCHECK (which Numba's key
        # leaves out) when it changed: a cache filled without it would serve
        # unchecked code under it. Without these (private) attributes the
        # cache is Numba's own.
        cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
        if cache_file is not None and hasattr(cache_file, "_source_stamp"):
            cache_file._source_stamp = (cache_file._source_stamp, kernel_sources_digest(),
                                        config.BOUNDSCHECK)
        return dispatcher

    return decorate


operation = njit(cache=True, **owning_nothing)
fast_operation = njit(cache=True, no_cfunc_wrapper=False, **owning_nothing)
helper = njit(cache=True, forceinline=True, **owning_nothing)
inner = inline_only or njit(cache=True, forceinline=True, no_cpython_wrapper=True,
                            **owning_nothing)
