"""Integrations with host libraries: Numba's EMM plugin interface and CuPy.

Attributes are imported on first access, so ``import numba_bfc.integrations``
imports neither ``numba.cuda`` nor CuPy:

- ``NumbaBFCMemoryManager``, ``use_numba_bfc``, ``current_manager``,
  ``current_allocator``, ``record_stream``, ``empty_cache``,
  ``CudaOutOfMemoryError`` (``numba_emm``);
- ``StreamSafetyStats``, ``CudaEventFences`` (``stream_safety``: freed blocks
  wait for the device);
- ``cupy_allocator`` (``cupy``).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "NumbaBFCMemoryManager": "numba_emm",
    "CudaOutOfMemoryError": "numba_emm",
    "BFCIpcHandle": "numba_emm",
    "use_numba_bfc": "numba_emm",
    "current_manager": "numba_emm",
    "current_allocator": "numba_emm",
    "record_stream": "numba_emm",
    "empty_cache": "numba_emm",
    "StreamSafetyStats": "stream_safety",
    "CudaEventFences": "stream_safety",
    "_numba_memory_manager": "numba_emm",
    "cupy_allocator": "cupy",
}

__all__ = [name for name in _LAZY if not name.startswith("_")]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
