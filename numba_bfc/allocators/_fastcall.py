"""Call a compiled kernel without the dispatcher's per-call type resolution.

A Numba dispatcher resolves argument types on every call (several hundred ns).
Once a kernel has exactly one compiled signature, its overload's
``entry_point`` can be called directly: arguments are still unboxed and
type-checked by the compiled wrapper, only the dispatch is skipped. This is a
Numba implementation detail, so it is kept here, falls back to the dispatcher
when unavailable, and can be switched off with ``NUMBA_BFC_FASTCALL=0``.
"""

from __future__ import annotations

import os


def _enabled() -> bool:
    return os.environ.get("NUMBA_BFC_FASTCALL", "1") != "0"


class Kernel:
    """A kernel handle whose ``call`` becomes the compiled entry point after first use."""

    __slots__ = ("dispatcher", "call", "fast")

    def __init__(self, dispatcher) -> None:
        self.dispatcher = dispatcher
        self.call = self._first_call
        self.fast = False  # True once calls bypass the dispatcher

    def _first_call(self, *args):
        result = self.dispatcher(*args)
        if not _enabled():
            self.call = self.dispatcher
        else:
            overloads = getattr(self.dispatcher, "overloads", {})
            if len(overloads) == 1:
                entry = getattr(next(iter(overloads.values())), "entry_point", None)
                if callable(entry):
                    self.call = entry
                    self.fast = True
        return result
