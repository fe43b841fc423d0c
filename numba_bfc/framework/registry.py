"""``AllocatorRegistry``: named allocators with priorities (TF's ``AllocatorRegistry``).

Resolution order, used by ``get_allocator()`` and ``names()``: highest
priority first; at equal priority, allocators registered explicitly
(``register``, ``register_allocator``, the built-in ``"cpu"``) come before
those discovered through entry points, and within each group the one
registered first wins (entry points are registered in name order). The rule
does not depend on when discovery happens.

Third-party allocators: a distribution declares, in its ``pyproject.toml``::

    [project.entry-points."numba_bfc.allocators"]
    my_pool = "my_package.alloc:MyPoolAllocator"

The entry point's name is the registry name. The object it loads is an
``Allocator`` instance or a zero-argument factory (typically an ``Allocator``
subclass); its priority is its ``priority`` attribute (an int, 0 if absent).
Discovery runs once, lazily, at the first lookup of a registry created with
``entry_point_group`` (the global registry is). An entry point that fails to
load, or has a bad priority, or reuses a registered name, is skipped with an
``AllocatorRegistryWarning`` naming it.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from .allocator import Allocator
from .host import HostAllocator

__all__ = [
    "ENTRY_POINT_GROUP",
    "AllocatorRegistry",
    "AllocatorRegistryWarning",
    "RegistryEntry",
    "global_registry",
    "register_allocator",
]

ENTRY_POINT_GROUP = "numba_bfc.allocators"

FactoryOrInstance = Allocator | Callable[[], Allocator]
F = TypeVar("F", bound=Callable[[], Allocator])


class AllocatorRegistryWarning(UserWarning):
    """A third-party allocator entry point was skipped."""


def _entry_points(group: str):
    """The installed entry points of ``group`` (a seam for tests)."""
    return importlib.metadata.entry_points(group=group)


@dataclass(frozen=True)
class RegistryEntry:
    """What ``entries()`` reports about one registered allocator.

    ``source`` is ``"register"`` or ``"entry point <module:attr>"``;
    ``instantiated`` tells whether a factory has run yet.
    """

    name: str
    priority: int
    source: str
    instantiated: bool


class _Slot:
    """One registration: its factory, and the instance once made."""

    def __init__(self, name: str, priority: int, value: FactoryOrInstance, source: str,
                 explicit: bool, order: int) -> None:
        self.name, self.priority, self.source = name, priority, source
        self.rank = (-priority, 0 if explicit else 1, order)
        self.lock = threading.RLock()  # serialises the one-time instantiation
        self.building = False
        if isinstance(value, Allocator):
            self.instance: Allocator | None = value
            self.factory = None
        else:
            self.instance = None
            self.factory = value

    def get(self) -> Allocator:
        with self.lock:
            if self.instance is not None:
                return self.instance
            if self.building:  # the factory asked for its own allocator
                raise RuntimeError(f"allocator factory for {self.name!r} requires itself")
            self.building = True
            try:
                made = self.factory()
            except Exception as e:
                raise RuntimeError(
                    f"allocator factory for {self.name!r} ({self.source}) failed: {e}") from e
            finally:
                self.building = False
            if not isinstance(made, Allocator):
                raise TypeError(f"allocator factory for {self.name!r} ({self.source}) returned "
                                f"{type(made).__name__}, not an Allocator")
            self.instance = made
            return made


def _check_priority(priority) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"priority must be an int, not {type(priority).__name__}")
    return priority


class AllocatorRegistry:
    """Allocators by name, each with a priority.

    Parameters
    ----------
    entry_point_group : str, optional
        Discover third-party allocators from this entry-point group on first
        lookup (see the module docstring). None (default): no discovery.

    Notes
    -----
    Thread-safe: a lock guards the table; each factory runs at most once,
    under a lock of its own, so a factory may look up other allocators of the
    same registry (a factory needing itself raises ``RuntimeError``).
    """

    def __init__(self, entry_point_group: str | None = None) -> None:
        self._lock = threading.RLock()
        self._slots: dict[str, _Slot] = {}
        self._order = itertools.count()
        self._group = entry_point_group
        self._discovered = entry_point_group is None

    def register(self, name: str, priority: int, factory_or_instance: FactoryOrInstance) -> None:
        """Add an allocator under ``name``.

        ``factory_or_instance`` is an ``Allocator``, or a zero-argument callable
        (e.g. an ``Allocator`` subclass) called once, at the first ``get``.

        Raises
        ------
        ValueError
            ``name`` is empty or already registered.
        TypeError
            Bad ``priority`` or ``factory_or_instance``.
        """
        self._add(name, priority, factory_or_instance, "register", explicit=True)

    def _add(self, name, priority, value, source: str, explicit: bool) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"allocator name must be a non-empty string, got {name!r}")
        priority = _check_priority(priority)
        if not (isinstance(value, Allocator) or callable(value)):
            raise TypeError(f"{name!r}: expected an Allocator or a zero-argument factory, "
                            f"not {type(value).__name__}")
        with self._lock:
            if name in self._slots:
                raise ValueError(f"an allocator named {name!r} is already registered "
                                 f"({self._slots[name].source})")
            self._slots[name] = _Slot(name, priority, value, source, explicit, next(self._order))

    def unregister(self, name: str) -> None:
        """Remove ``name`` (``KeyError`` if unknown)."""
        with self._lock:
            self._slot(name)
            del self._slots[name]

    def get(self, name: str) -> Allocator:
        """The allocator registered as ``name``, instantiating it on first use.

        Raises ``KeyError`` naming the known allocators if there is none.
        """
        self._discover()
        with self._lock:
            slot = self._slot(name)
        return slot.get()

    def get_allocator(self) -> Allocator:
        """The allocator of highest priority (see the module docstring for ties)."""
        self._discover()
        with self._lock:
            if not self._slots:
                raise KeyError("no allocators are registered")
            slot = min(self._slots.values(), key=lambda s: s.rank)
        return slot.get()

    def names(self) -> list[str]:
        """Registered names in resolution order (the first is ``get_allocator()``'s)."""
        return [e.name for e in self.entries()]

    def entries(self) -> list[RegistryEntry]:
        """One ``RegistryEntry`` per allocator, in resolution order."""
        self._discover()
        with self._lock:
            slots = sorted(self._slots.values(), key=lambda s: s.rank)
            return [RegistryEntry(s.name, s.priority, s.source, s.instance is not None)
                    for s in slots]

    def __contains__(self, name: object) -> bool:
        self._discover()
        with self._lock:
            return name in self._slots

    def __len__(self) -> int:
        self._discover()
        with self._lock:
            return len(self._slots)

    def _slot(self, name: str) -> _Slot:
        try:
            return self._slots[name]
        except KeyError:
            known = ", ".join(repr(n) for n in sorted(self._slots)) or "none"
            raise KeyError(f"no allocator named {name!r} (registered: {known})") from None

    def _discover(self) -> None:
        with self._lock:
            if self._discovered:
                return
            self._discovered = True  # once, even if an entry point below misbehaves
            try:
                found = sorted(_entry_points(self._group), key=lambda ep: ep.name)
            except Exception as e:  # a broken distribution must not break every lookup
                warnings.warn(f"numba_bfc: cannot list entry points of {self._group!r}: {e}",
                              AllocatorRegistryWarning, stacklevel=3)
                return
            for ep in found:
                self._add_entry_point(ep)

    def _add_entry_point(self, ep) -> None:
        where = f"entry point {ep.value}"
        try:
            value = ep.load()
            priority = _check_priority(getattr(value, "priority", 0))
            self._add(ep.name, priority, value, where, explicit=False)
        except Exception as e:
            warnings.warn(f"numba_bfc: skipping allocator entry point {ep.name!r} = {ep.value!r} "
                          f"(group {self._group!r}): {type(e).__name__}: {e}",
                          AllocatorRegistryWarning, stacklevel=4)


_GLOBAL: AllocatorRegistry | None = None
_GLOBAL_LOCK = threading.Lock()


def _cpu_allocator() -> Allocator:
    return HostAllocator(name="cpu")


def global_registry() -> AllocatorRegistry:
    """The process-wide registry (TF's ``AllocatorRegistry::Global()``).

    Created on first use with ``"cpu"`` (a ``HostAllocator``, priority 0,
    made at its first ``get``) and discovery of the ``numba_bfc.allocators``
    entry-point group.
    """
    global _GLOBAL
    with _GLOBAL_LOCK:
        if _GLOBAL is None:
            registry = AllocatorRegistry(entry_point_group=ENTRY_POINT_GROUP)
            registry.register("cpu", 0, _cpu_allocator)
            _GLOBAL = registry
        return _GLOBAL


def register_allocator(name: str, priority: int = 0, *,
                       registry: AllocatorRegistry | None = None) -> Callable[[F], F]:
    """Decorator: register a factory or ``Allocator`` subclass, returned unchanged.

    Examples
    --------
    >>> from numba_bfc.framework import AllocatorRegistry, register_allocator
    >>> from numba_bfc.framework.host import HostAllocator
    >>> reg = AllocatorRegistry()
    >>> @register_allocator("small_host", priority=5, registry=reg)
    ... def small_host():
    ...     return HostAllocator(memory_limit=1 << 20, name="small_host")
    >>> reg.get_allocator().name
    'small_host'
    """

    def decorate(factory: F) -> F:
        (registry if registry is not None else global_registry()).register(
            name, priority, factory)
        return factory

    return decorate
