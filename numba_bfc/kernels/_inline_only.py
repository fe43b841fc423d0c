"""Helpers compiled only into the kernels that call them (``jit.inner``).

Numba compiles each function a kernel calls as a unit of its own: typed,
lowered to an LLVM module, then optimised and made into machine code with
every function it calls linked in, and cached. A caller links that optimised
module into its own and optimises and compiles the whole again. A helper that
only kernels call runs only inlined into them, so its own optimisation,
machine code and cache entry are never used, yet a cold first allocation
spent 0.63 s of its 4.1 s on them (``docs/performance.md``), a deep helper
paying at every level above it.

An inline-only helper stops after lowering: its LLVM module is what callers
link in and optimise with their own code, as before, but it is not optimised
on its own, no machine code is made from it, and nothing of it is cached: the
kernels that inline it are cached with its code in them, so a warm start
compiles none of it. It has no Python entry point; calling it from Python
raises ``TypeError`` (a plain ``no_cpython_wrapper`` function crashes the
process instead).

This relies on Numba internals (its pass pipeline and the finalisation of a
JIT code library). Where they are missing, or with ``NUMBA_BFC_INLINE_ONLY=0``
(read at import) or ``NUMBA_DISABLE_JIT``, ``inline_only`` is ``None`` and
``jit.inner`` compiles each helper on its own, cached, as Numba does by
default.

``owning_nothing`` is the same for another of Numba's defaults: the options
under which a kernel compiles without Numba's reference counting (NRT), with
a check that makes that safe (``jit`` says why), or ``{}`` (reference
counting as usual) where the internals are missing or with
``NUMBA_DISABLE_JIT``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

ENV_VAR = "NUMBA_BFC_INLINE_ONLY"

_OPTIONS = {"nopython": True, "forceinline": True, "no_cpython_wrapper": True,
            "no_cfunc_wrapper": True, "_nrt": False}


@functools.cache  # Numba registers a pass class once
def _owning_nothing_passes() -> tuple[Any, Any] | None:
    """``(RefuseCountedResults pass, its compiler)``, or None without the internals."""
    try:
        from numba.core.compiler import CompilerBase, DefaultPassBuilder
        from numba.core.compiler_machinery import AnalysisPass, register_pass
        from numba.core.errors import TypingError
        from numba.core.typed_passes import NopythonTypeInference
    except ImportError:
        return None

    @register_pass(mutates_CFG=False, analysis_only=True)
    class RefuseCountedResults(AnalysisPass):
        """A kernel compiled without reference counting must not return an
        array, or anything else that holds a counted reference: a caller that
        counts would release a reference it never took."""

        _name = "numba_bfc_refuse_counted_results"

        def __init__(self) -> None:
            AnalysisPass.__init__(self)

        def run_pass(self, state) -> bool:
            model = state.targetctx.data_model_manager[state.return_type]
            if model.contains_nrt_meminfo():  # arrays, strings, lists, ..., in tuples too
                raise TypingError(
                    f"{state.func_id.func_qualname} returns {state.return_type}: a kernel "
                    "compiles without reference counting (kernels.jit) and cannot return an "
                    "array (or anything else that holds a reference); take it as an argument "
                    "instead")
            return False

    class OwningNothingCompiler(CompilerBase):
        """Numba's nopython pipeline, refusing counted results after typing."""

        def define_pipelines(self):
            pipeline = DefaultPassBuilder.define_nopython_pipeline(self.state)
            pipeline.add_pass_after(RefuseCountedResults, NopythonTypeInference)
            pipeline.finalize()
            return [pipeline]

    return RefuseCountedResults, OwningNothingCompiler


def _define_owning_nothing() -> dict[str, Any]:
    from numba.core import config

    if config.DISABLE_JIT:
        return {}
    passes = _owning_nothing_passes()
    return {} if passes is None else {"_nrt": False, "pipeline_class": passes[1]}


def _define() -> Callable[[Callable], Any] | None:
    from numba.core import config

    if config.DISABLE_JIT:  # as numba.njit: the plain Python function
        return None
    try:
        from numba.core.codegen import JITCodeLibrary
        from numba.core.compiler import CompilerBase, DefaultPassBuilder
        from numba.core.compiler_machinery import LoweringPass, register_pass
        from numba.core.registry import CPUDispatcher
        from numba.core.typed_passes import NativeLowering, NopythonTypeInference
    except ImportError:
        return None
    needed = ("_finalize_dynamic_globals", "_verify_declare_only_symbols",
              "_optimize_final_module", "_finalize_final_module")
    passes = _owning_nothing_passes()
    if passes is None or not all(hasattr(JITCodeLibrary, name) for name in needed):
        return None
    refuse_counted_results = passes[0]

    class LinkOnlyLibrary(JITCodeLibrary):
        """A code library whose module is only ever linked into other libraries."""

        def _optimize_final_module(self) -> None:
            # The callers optimise this code with their own, after inlining it.
            pass

        def _finalize_final_module(self) -> None:
            # Numba's version also adds the module to the JIT engine, which
            # makes its machine code; nothing would ever run that code.
            self._finalize_dynamic_globals()
            self._verify_declare_only_symbols()
            self._finalized = True

    @register_pass(mutates_CFG=False, analysis_only=False)
    class RegisterForLinking(LoweringPass):
        """After lowering without compiling (``no_compile``): let callers link the module."""

        _name = "numba_bfc_register_for_linking"

        def __init__(self) -> None:
            LoweringPass.__init__(self)

        def run_pass(self, state) -> bool:
            lowered = state["cr"]
            # Callers' lowering finds the implementation under the overload's
            # entry point; here that is only a key, which nothing calls.
            key = object()
            state.targetctx.insert_user_function(key, lowered.fndesc, [state.library])
            state.reload_init.extend(getattr(state.library, "_reload_init", ()))
            state["cr"] = lowered._replace(cfunc=key)
            return True

    class InlineOnlyCompiler(CompilerBase):
        """Numba's nopython pipeline, lowering into a ``LinkOnlyLibrary``."""

        def define_pipelines(self):
            self.state.flags.no_compile = True
            self.state.library = LinkOnlyLibrary(self.state.targetctx.codegen(),
                                                 self.state.func_id.func_qualname)
            pipeline = DefaultPassBuilder.define_nopython_pipeline(self.state)
            pipeline.add_pass_after(refuse_counted_results, NopythonTypeInference)
            pipeline.add_pass_after(RegisterForLinking, NativeLowering)
            pipeline.finalize()
            return [pipeline]

    class InlineOnlyDispatcher(CPUDispatcher):
        """A dispatcher whose overloads have no entry point for Python."""

        def add_overload(self, cres) -> None:
            # Numba's version also gives the entry point to the C dispatcher,
            # which would call it as a compiled Python wrapper.
            self.overloads[tuple(cres.signature.args)] = cres

        def _compile_for_args(self, *args, **kws):
            raise TypeError(f"{self.py_func.__qualname__} runs only inlined into the kernels "
                            "that call it (kernels.jit.inner); call it through a kernel")

    def inline_only(fn: Callable) -> Any:
        return InlineOnlyDispatcher(fn, targetoptions=dict(_OPTIONS),
                                    pipeline_class=InlineOnlyCompiler)

    return inline_only


inline_only = _define() if os.environ.get(ENV_VAR, "1") != "0" else None
owning_nothing = _define_owning_nothing()
