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
"""

from __future__ import annotations

import os

import numpy as np


def _enabled() -> bool:
    return os.environ.get("NUMBA_BFC_FASTCALL", "1") != "0"


def _checking() -> bool:
    return os.environ.get("NUMBA_BFC_CHECK_KERNEL_ARGS", "0") not in ("", "0")


class Kernel:
    """A kernel handle whose ``call`` becomes the compiled entry point after first use."""

    __slots__ = ("dispatcher", "call", "fast")

    def __init__(self, dispatcher) -> None:
        self.dispatcher = dispatcher
        self.call = self._first_call
        self.fast = False  # True once calls bypass the dispatcher

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
                self.call = (_checked(entry, overload.signature.args, self.dispatcher)
                             if _checking() else entry)
        return result


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
