"""AllocatorRegistry: priorities, ties, lazy factories, the global registry, entry points."""

import sys
import textwrap
import threading
import time

import pytest

from numba_bfc.framework import (
    ENTRY_POINT_GROUP,
    AllocatorRegistry,
    AllocatorRegistryWarning,
    global_registry,
    register_allocator,
)
from numba_bfc.framework import registry as registry_module
from numba_bfc.framework.host import HostAllocator


def test_highest_priority_wins_and_names_are_in_resolution_order():
    reg = AllocatorRegistry()
    low, high, mid = HostAllocator(name="low"), HostAllocator(name="high"), HostAllocator()
    reg.register("low", -5, low)
    reg.register("high", 10, high)
    reg.register("mid", 0, mid)
    assert reg.get_allocator() is high
    assert reg.names() == ["high", "mid", "low"]
    assert reg.get("low") is low and "mid" in reg and len(reg) == 3


def test_equal_priorities_first_registered_wins():
    reg = AllocatorRegistry()
    first, second = HostAllocator(name="a"), HostAllocator(name="b")
    reg.register("zzz", 3, first)
    reg.register("aaa", 3, second)
    assert reg.get_allocator() is first
    assert reg.names() == ["zzz", "aaa"]
    reg.unregister("zzz")
    assert reg.get_allocator() is second


def test_duplicates_unknown_names_and_bad_arguments():
    reg = AllocatorRegistry()
    reg.register("cpu", 0, HostAllocator)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("cpu", 5, HostAllocator())
    with pytest.raises(KeyError, match="'cpu'"):
        reg.get("gpu")
    with pytest.raises(KeyError):
        reg.unregister("gpu")
    with pytest.raises(ValueError):
        reg.register("", 0, HostAllocator)
    with pytest.raises(TypeError):
        reg.register("x", 1.5, HostAllocator)
    with pytest.raises(TypeError):
        reg.register("x", True, HostAllocator)
    with pytest.raises(TypeError):
        reg.register("x", 0, 42)
    assert reg.names() == ["cpu"], "failed registrations must leave the registry unchanged"
    with pytest.raises(KeyError, match="no allocators"):
        AllocatorRegistry().get_allocator()


def test_factories_run_once_lazily_even_under_contention():
    reg = AllocatorRegistry()
    calls = []

    def factory():
        calls.append(threading.get_ident())
        time.sleep(0.05)  # widen the window in which other threads ask for it
        return HostAllocator(name="lazy")

    reg.register("lazy", 1, factory)
    assert calls == [] and not reg.entries()[0].instantiated
    got = []
    threads = [threading.Thread(target=lambda: got.append(reg.get("lazy"))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len({id(a) for a in got}) == 1
    assert reg.entries()[0].instantiated


def test_factory_errors_name_the_allocator_and_can_be_retried():
    reg = AllocatorRegistry()
    attempts = []

    def flaky():
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("device busy")
        return HostAllocator()

    reg.register("flaky", 0, flaky)
    reg.register("not_an_allocator", -1, lambda: "nope")
    with pytest.raises(RuntimeError, match="'flaky'.*device busy") as err:
        reg.get("flaky")
    assert isinstance(err.value.__cause__, OSError)
    assert isinstance(reg.get("flaky"), HostAllocator)
    with pytest.raises(TypeError, match="not_an_allocator.*str"):
        reg.get("not_an_allocator")


def test_a_factory_may_use_the_registry_but_not_itself():
    from numba_bfc.framework import TrackingAllocator

    reg = AllocatorRegistry()
    reg.register("cpu", 0, HostAllocator)
    reg.register("tracked", 1, lambda: TrackingAllocator(reg.get("cpu")))
    reg.register("loop", -1, lambda: reg.get("loop"))
    assert reg.get_allocator().inner is reg.get("cpu")
    with pytest.raises(RuntimeError, match="requires itself"):
        reg.get("loop")


def test_decorator_registers_and_returns_the_factory():
    reg = AllocatorRegistry()

    @register_allocator("decorated", priority=2, registry=reg)
    class Decorated(HostAllocator):
        pass

    assert isinstance(Decorated(), HostAllocator)
    assert type(reg.get("decorated")) is Decorated


def test_global_registry_serves_a_lazy_cpu_allocator():
    reg = global_registry()
    assert reg is global_registry()
    assert "cpu" in reg
    cpu = reg.get("cpu")
    assert isinstance(cpu, HostAllocator) and cpu.name == "cpu" and cpu is reg.get("cpu")
    entry = [e for e in reg.entries() if e.name == "cpu"][0]
    assert entry.priority == 0 and entry.instantiated


def test_decorator_defaults_to_the_global_registry():
    name = "test_framework_registry_global_decorator"

    @register_allocator(name, priority=-100)
    def make():
        return HostAllocator(name=name)

    try:
        assert global_registry().get(name).name == name
        assert global_registry().get_allocator().name != name  # "cpu" outranks it
    finally:
        global_registry().unregister(name)


# ---------------------------------------------------------------- entry points
@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """A fake installed distribution declaring allocators in our entry-point group."""
    (tmp_path / "fake_bfc_plugin.py").write_text(textwrap.dedent("""
        from numba_bfc.framework.host import HostAllocator

        class FastAllocator(HostAllocator):
            priority = 50

        def make_tagged():
            return HostAllocator(name="tagged")

        make_tagged.priority = 50

        shared = HostAllocator(name="shared")

        class BadPriority(HostAllocator):
            priority = "high"
    """))
    dist = tmp_path / "fake_bfc_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-bfc-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(textwrap.dedent(f"""
        [{ENTRY_POINT_GROUP}]
        fast = fake_bfc_plugin:FastAllocator
        tagged = fake_bfc_plugin:make_tagged
        shared = fake_bfc_plugin:shared
        missing = fake_bfc_plugin_does_not_exist:Thing
        bad_priority = fake_bfc_plugin:BadPriority
        cpu = fake_bfc_plugin:FastAllocator
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("fake_bfc_plugin", None)


def test_entry_points_are_discovered_once_with_clear_warnings(plugin_dir):
    reg = AllocatorRegistry(entry_point_group=ENTRY_POINT_GROUP)
    reg.register("cpu", 0, HostAllocator)
    with pytest.warns(AllocatorRegistryWarning) as caught:
        names = reg.names()
    messages = "\n".join(str(w.message) for w in caught)
    assert "'missing'" in messages and "fake_bfc_plugin_does_not_exist" in messages
    assert "'bad_priority'" in messages and "priority must be an int" in messages
    assert "'cpu'" in messages and "already registered" in messages
    assert len(caught) == 3
    # 50 beats 0; the two at 50 are entry points, taken in name order.
    assert names == ["fast", "tagged", "cpu", "shared"]
    assert type(reg.get_allocator()).__name__ == "FastAllocator"
    assert reg.get("tagged").name == "tagged"
    fast_entry = reg.entries()[0]
    assert fast_entry.source == "entry point fake_bfc_plugin:FastAllocator"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reg.names() == names  # no second discovery, no second warnings


def test_explicit_registration_wins_a_tie_with_an_entry_point(plugin_dir):
    reg = AllocatorRegistry(entry_point_group=ENTRY_POINT_GROUP)
    with pytest.warns(AllocatorRegistryWarning):
        reg.names()  # discovery first ...
    mine = HostAllocator(name="mine")
    reg.register("mine", 50, mine)  # ... explicit registration later, same priority
    assert reg.get_allocator() is mine


def test_entry_point_listing_failure_is_reported_not_raised(monkeypatch):
    def broken(group):
        raise RuntimeError("corrupt metadata")

    monkeypatch.setattr(registry_module, "_entry_points", broken)
    reg = AllocatorRegistry(entry_point_group="anything")
    reg.register("cpu", 0, HostAllocator)
    with pytest.warns(AllocatorRegistryWarning, match="corrupt metadata"):
        assert reg.names() == ["cpu"]


def test_registries_without_a_group_never_look_for_entry_points(monkeypatch):
    monkeypatch.setattr(registry_module, "_entry_points",
                        lambda group: pytest.fail("entry points listed"))
    reg = AllocatorRegistry()
    reg.register("cpu", 0, HostAllocator)
    assert reg.names() == ["cpu"]
