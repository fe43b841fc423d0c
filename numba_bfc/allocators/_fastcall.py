"""Call a compiled kernel without the dispatcher's per-call type resolution.

A Numba dispatcher resolves argument types on every call (several hundred ns).
Once a kernel has exactly one compiled signature, its overload's
``entry_point`` can be called directly. That skips the dispatch *and every
type check*: the compiled wrapper unboxes what it is given as the signature's
types, so a float64 array where int64 is expected is reinterpreted and an
array of the wrong dimension can crash the process. Every caller in the
package converts its arguments first (``run_batch`` and ``replay`` validate
user input before converting it), so this is never reached from outside.

``NUMBA_BFC_CHECK_KERNEL_ARGS=1`` (read when a kernel is first called)
checks every call's arguments against the compiled signature instead (dtype,
dimensions, contiguity, writability, scalar kinds) and raises ``TypeError``
naming the kernel and the argument: for debugging, and for the tests.
``NUMBA_BFC_FASTCALL=0`` keeps the dispatcher. This is a Numba implementation
detail, so it is kept here and falls back to the dispatcher when unavailable.

The allocators' common calls go further where the compiled bridge
(``_fastpath``, a C extension built at install) is there: ``allocate_raw``
and ``deallocate_raw`` are ``fast_method`` objects, which call the kernel's C
entry (the C wrapper Numba compiles beside a ``jit.fast_operation``) from C,
with no Python frame and no unboxing, and come back to Python only for what
is not the common answer. An allocate+free pair costs about a third of what
the Python methods cost (``docs/performance.md``). The bridge is not used
under ``NUMBA_BFC_CHECK_KERNEL_ARGS`` or ``NUMBA_BOUNDSCHECK`` (a C entry
cannot raise the error a check finds; read at a kernel's first call), nor
with ``NUMBA_BFC_NATIVE_CALLS=0`` (read when an allocator arms its fast
paths) or ``NUMBA_BFC_FASTCALL=0``. A kernel it calls never raises (its
answers are codes); were one to raise, Numba's C wrapper would print the
error and answer 0, which the bridge hands to the Python continuation: it
retries under the lock through the CPython wrapper, which raises.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import numpy as np

try:
    from ._fastpath import FastMethod, KernelEntry
except ImportError:  # installed without a C compiler: the Python methods serve every call
    FastMethod = KernelEntry = None


def _enabled() -> bool:
    return os.environ.get("NUMBA_BFC_FASTCALL", "1") != "0"


def _checking() -> bool:
    return os.environ.get("NUMBA_BFC_CHECK_KERNEL_ARGS", "0") not in ("", "0")


def native_enabled() -> bool:
    """True where the allocators' common calls may go through the compiled
    bridge: it was built, and ``NUMBA_BFC_NATIVE_CALLS`` is not ``0``."""
    return KernelEntry is not None and os.environ.get("NUMBA_BFC_NATIVE_CALLS", "1") != "0"


def fast_method(general: Callable, after: Callable, entry_name: str,
                releases: bool = False) -> Callable:
    """``general`` (a method taking one int), whose common call goes from C
    straight to the instance's kernel entry.

    Called with one ``int`` in ``(0, entry.largest]`` on an instance whose
    attribute ``entry_name`` is a ``KernelEntry``, the method calls the entry
    lock-free (``locked`` false). An answer > 0 is returned (``releases``
    false: the address) or gives None (``releases`` true: the freed size);
    any other answer is handed to ``after(self, value, answer)``. Every other
    call is ``general``'s. Without the bridge this returns ``general`` itself.
    """
    if FastMethod is None:
        return general
    method = FastMethod(general, after, entry_name, releases)
    functools.update_wrapper(method, general)
    return method


class Kernel:
    """A kernel handle whose ``call`` becomes the compiled entry point after first use."""

    __slots__ = ("dispatcher", "call", "fast", "address")

    def __init__(self, dispatcher) -> None:
        self.dispatcher = dispatcher
        self.call = self._first_call
        self.fast = False  # True once calls bypass the dispatcher
        self.address = 0  # the C entry (jit.fast_operation) once known; 0: none

    @property
    def resolved(self) -> bool:
        """True once ``call`` is what every later call goes through (after the first)."""
        return self.call != self._first_call

    def _first_call(self, *args):
        result = self.dispatcher(*args)
        if not _enabled():
            self.call = self.dispatcher
            return result
        overloads = getattr(self.dispatcher, "overloads", {})
        if len(overloads) == 1:
            overload = next(iter(overloads.values()))
            entry = getattr(overload, "entry_point", None)
            if callable(entry):
                self.fast = True
                checking = _checking()
                self.call = (_checked(entry, overload.signature.args, self.dispatcher)
                             if checking else entry)
                if not checking and not _bounds_checked():
                    self.address = _c_entry(overload)
        return result


def _bounds_checked() -> bool:
    from numba.core import config

    return bool(config.BOUNDSCHECK)


def _c_entry(overload) -> int:
    """The address of the C wrapper Numba compiled beside ``overload``
    (``jit.fast_operation``), or 0 where it has none or its signature is not
    the one the bridge calls, ``int64(int64, int64, boolean)``."""
    from numba import types

    signature = getattr(overload, "signature", None)
    if (signature is None or signature.return_type != types.int64
            or tuple(signature.args) != (types.int64, types.int64, types.boolean)):
        return 0
    library, fndesc = getattr(overload, "library", None), getattr(overload, "fndesc", None)
    name = getattr(fndesc, "llvm_cfunc_wrapper_name", None)
    if library is None or name is None or not hasattr(library, "get_pointer_to_function"):
        return 0
    return library.get_pointer_to_function(name)  # 0 if not compiled


def _checked(entry, argtypes, dispatcher):
    """``entry``, after checking every argument against ``argtypes``."""
    checks = [_check_for(t) for t in argtypes]
    name = getattr(dispatcher, "__name__", "kernel")

    def call(*args):
        if len(args) != len(checks):
            raise TypeError(f"{name}: {len(args)} arguments, the kernel takes {len(checks)}")
        for k, (check, value) in enumerate(zip(checks, args)):
            problem = check(value)
            if problem:
                raise TypeError(f"{name}: argument {k}: {problem}")
        return entry(*args)

    return call


def _check_for(numba_type):
    """A function of a value: what is wrong with it for ``numba_type`` ('' if nothing)."""
    from numba import types
    from numba.np.numpy_support import as_dtype

    if isinstance(numba_type, types.Array):
        dtype = as_dtype(numba_type.dtype)
        ndim, layout, mutable = numba_type.ndim, numba_type.layout, numba_type.mutable

        def array(value) -> str:
            if not isinstance(value, np.ndarray):
                return f"expected a NumPy array, got {type(value).__name__}"
            if value.dtype != dtype:
                return f"expected dtype {dtype}, got {value.dtype}"
            if value.ndim != ndim:
                return f"expected {ndim} dimension(s), got {value.ndim}"
            if layout == "C" and not value.flags.c_contiguous:
                return "expected a C-contiguous array"
            if mutable and not value.flags.writeable:
                return "expected a writable array"
            return ""

        return array
    if isinstance(numba_type, types.Boolean):
        return lambda v: "" if isinstance(v, (bool, np.bool_)) else (
            f"expected a bool, got {type(v).__name__}")
    if isinstance(numba_type, types.Integer):
        return lambda v: "" if isinstance(v, (int, np.integer)) and not isinstance(
            v, (bool, np.bool_)) else f"expected an integer, got {type(v).__name__}"
    if isinstance(numba_type, types.Float):
        return lambda v: "" if isinstance(v, (int, float, np.integer, np.floating)) and not \
            isinstance(v, (bool, np.bool_)) else f"expected a number, got {type(v).__name__}"
    return lambda v: ""  # other types: the wrapper's own unboxing checks them
