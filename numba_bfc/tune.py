"""Tune PyTorch's caching allocator for a recorded run by exact replay.

``tune(trace)`` replays the trace through the caching policy (PyTorch's
allocator, decision for decision) under settings of PyTorch's knobs, and
recommends the settings that run it in the least memory, as a
``PYTORCH_CUDA_ALLOC_CONF`` line. Each candidate is measured, not modelled:

- ``min_limit``: the smallest memory limit it runs the trace at with no OOM
  (``numba_bfc.traces.min_limit``, to 0.1%);
- ``peak_reserved_bytes``: what it reserves with no limit;
- ``fragmentation_at_peak``: reserved but unallocated bytes over reserved
  bytes, at the event where reserved bytes peak;
- ``ooms_at_limit``: failed allocations at ``limit``, when one is given.

The search is coordinate descent from PyTorch's defaults: each round tries
every value of one knob with the others fixed and keeps the best, knob after
knob, until a round changes nothing. A candidate is better with fewer OOMs
at ``limit``; else with a ``min_limit`` lower by more than the bisection's
precision (0.1% of the peak live bytes); else with a ``min_limit`` no higher
and a lower ``peak_reserved_bytes``. A knob moves only to a better candidate,
so the recommendation is never worse than the defaults. Beside it: TF's BFC (with and without its
garbage collection) and numba_bfc's ``compact`` policy, the offline plan
(``greedy_by_size``) and the trace's peak live bytes, which no allocator beats.

>>> from numba_bfc.traces.data import load_bundled
>>> result = tune(load_bundled("lstm_train"), knobs=("max_split_size_mb",))
>>> result.best.min_limit <= result.defaults.min_limit
True
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .stats import format_bytes
from .traces import MAX_LIMIT, Trace, min_limit, replay, traces_on_cluster

__all__ = ["DEFAULTS", "KNOBS", "Baseline", "Candidate", "TuneResult", "caching_options",
           "evaluate", "knob_values", "pytorch_conf", "tune"]

_MIB = 1 << 20
#: PyTorch's knobs the search moves, in the order it tries them.
KNOBS = ("expandable_segments", "max_split_size_mb", "max_non_split_rounding_mb",
         "roundup_power2_divisions", "garbage_collection_threshold")
#: PyTorch's defaults (None: off or unlimited).
DEFAULTS: dict[str, Any] = {"expandable_segments": False, "max_split_size_mb": None,
                            "max_non_split_rounding_mb": 20, "roundup_power2_divisions": 0,
                            "garbage_collection_threshold": None}
_DIVISIONS = (0, 2, 4, 8, 16)
_GC_THRESHOLDS = (None, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


def caching_options(settings: dict[str, Any]) -> dict[str, Any]:
    """``CachingAllocator`` options for PyTorch-named ``settings`` (missing keys: defaults)."""
    s = {**DEFAULTS, **settings}
    unknown = set(s) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown setting {', '.join(sorted(unknown))} "
                         f"(known: {', '.join(DEFAULTS)})")
    options: dict[str, Any] = {
        "max_non_split_rounding": s["max_non_split_rounding_mb"] * _MIB,
        "roundup_power2_divisions": s["roundup_power2_divisions"],
    }
    if s["expandable_segments"]:
        options["expandable_segments"] = True
    if s["max_split_size_mb"] is not None:
        options["max_split_size"] = s["max_split_size_mb"] * _MIB
    if s["garbage_collection_threshold"] is not None:
        options["garbage_collection_threshold"] = s["garbage_collection_threshold"]
    return options


def pytorch_conf(settings: dict[str, Any]) -> str:
    """``settings`` as ``PYTORCH_CUDA_ALLOC_CONF`` text, defaults left out ("" if none differ)."""
    # PyTorch spells booleans True/False, and only those.
    return ",".join(f"{key}:{settings[key]}" for key in DEFAULTS
                    if key in settings and settings[key] != DEFAULTS[key])


@dataclass(frozen=True)
class Candidate:
    """One setting of the knobs and what the caching policy did with the trace under it."""

    settings: dict[str, Any]
    min_limit: int
    peak_reserved_bytes: int
    fragmentation_at_peak: float
    ooms_at_limit: int | None
    seconds: float = field(compare=False)

    @property
    def conf(self) -> str:
        """The settings as a ``PYTORCH_CUDA_ALLOC_CONF`` value ("" for the defaults)."""
        return pytorch_conf(self.settings)

    @property
    def changed(self) -> int:
        """How many knobs differ from PyTorch's defaults."""
        return sum(self.settings.get(k, v) != v for k, v in DEFAULTS.items())

    def to_dict(self) -> dict[str, Any]:
        return {"settings": dict(self.settings), "conf": self.conf, "min_limit": self.min_limit,
                "peak_reserved_bytes": self.peak_reserved_bytes,
                "fragmentation_at_peak": self.fragmentation_at_peak,
                "ooms_at_limit": self.ooms_at_limit, "seconds": self.seconds}


def evaluate(trace: Trace, settings: dict[str, Any], limit: int | None = None) -> Candidate:
    """Replay ``trace`` through the caching policy under ``settings`` (PyTorch names)."""
    t0 = time.perf_counter()
    options = caching_options(settings)
    unlimited_options = {k: v for k, v in options.items() if k != "garbage_collection_threshold"}
    # One bucket per event: the in-use bytes at the very event reserved bytes peak.
    full = replay(trace, "caching", series_points=max(len(trace), 1), **unlimited_options)
    fragmentation = 0.0
    if full.series.size and full.peak_reserved_bytes:
        at_peak = full.series[int(full.series["reserved"].argmax())]
        fragmentation = float((at_peak["reserved"] - at_peak["in_use"]) / at_peak["reserved"])
    found = min_limit(trace, "caching", **options)
    ooms = None
    if limit is not None:
        ooms = replay(trace, "caching", limit=limit, series_points=1, **options).ooms
    return Candidate(dict(settings), found.limit, full.peak_reserved_bytes, fragmentation, ooms,
                     time.perf_counter() - t0)


def knob_values(trace: Trace, knob: str, settings: dict[str, Any]) -> list[Any]:
    """The values the search tries for ``knob``, given the other ``settings``.

    ``expandable_segments``: False, True; ``max_split_size_mb``: off, and powers
    of two from 32 MiB up to twice the
    largest request (PyTorch needs more than 20); ``max_non_split_rounding_mb``
    (only with a ``max_split_size_mb``): 20 MiB doubling up to the largest
    request; ``roundup_power2_divisions``: 0, 2, 4, 8, 16;
    ``garbage_collection_threshold``: off and 0.5 to 0.95.
    """
    largest_mb = int(trace.sizes.max()) // _MIB if len(trace) else 0
    if knob == "expandable_segments":
        return [False, True]
    if knob == "max_split_size_mb":
        values: list[Any] = [None]
        v = 32
        while v <= 2 * largest_mb:
            values.append(v)
            v *= 2
        return values
    if knob == "max_non_split_rounding_mb":
        if settings.get("max_split_size_mb") is None:
            return [settings.get(knob, DEFAULTS[knob])]  # no oversize blocks: no effect
        values, v = [20], 40
        while v <= largest_mb:
            values.append(v)
            v *= 2
        return values
    if knob == "roundup_power2_divisions":
        return list(_DIVISIONS)
    if knob == "garbage_collection_threshold":
        return list(_GC_THRESHOLDS)
    raise ValueError(f"unknown knob {knob!r} (known: {', '.join(KNOBS)})")


@dataclass(frozen=True)
class Baseline:
    """Another allocator on the same trace: its smallest no-OOM limit and unlimited peak."""

    name: str
    min_limit: int
    peak_reserved_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "min_limit": self.min_limit,
                "peak_reserved_bytes": self.peak_reserved_bytes}


@dataclass(frozen=True)
class TuneResult:
    """What ``tune`` found: the best settings, the defaults, every candidate tried,
    the other allocators and the offline figures."""

    trace: str
    events: int
    peak_requested_bytes: int
    limit: int | None
    defaults: Candidate
    best: Candidate
    candidates: list[Candidate]
    baselines: list[Baseline]
    offline_plan_bytes: int
    rounds: int
    seconds: float

    @property
    def conf(self) -> str:
        """The recommendation: ``PYTORCH_CUDA_ALLOC_CONF=...`` ("" values: keep the defaults)."""
        return f"PYTORCH_CUDA_ALLOC_CONF={self.best.conf}"

    @property
    def saving_bytes(self) -> int:
        """How much less memory the best settings need than the defaults (smallest no-OOM
        limit); negative only when they were chosen for fewer OOMs at ``limit``."""
        return self.defaults.min_limit - self.best.min_limit

    def to_dict(self) -> dict[str, Any]:
        return {"trace": self.trace, "events": self.events,
                "peak_requested_bytes": self.peak_requested_bytes, "limit": self.limit,
                "recommended": self.conf, "saving_bytes": self.saving_bytes,
                "best": self.best.to_dict(), "defaults": self.defaults.to_dict(),
                "baselines": [b.to_dict() for b in self.baselines],
                "offline_plan_bytes": self.offline_plan_bytes, "rounds": self.rounds,
                "seconds": self.seconds, "candidates": [c.to_dict() for c in self.candidates]}

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        """``(what, min limit, x peak live, peak reserved, OOMs at limit)`` for the table."""
        peak = self.peak_requested_bytes or 1

        def row(name, lim, reserved, ooms):
            return (name, format_bytes(lim), f"{lim / peak:.3f}",
                    "-" if reserved is None else format_bytes(reserved),
                    "-" if ooms is None else str(ooms))

        out = [row(f"caching, best ({self.best.conf or 'the defaults'})", self.best.min_limit,
                   self.best.peak_reserved_bytes, self.best.ooms_at_limit),
               row("caching, PyTorch's defaults", self.defaults.min_limit,
                   self.defaults.peak_reserved_bytes, self.defaults.ooms_at_limit)]
        out += [row(b.name, b.min_limit, b.peak_reserved_bytes, None) for b in self.baselines]
        out.append(row("offline plan (greedy_by_size)", self.offline_plan_bytes, None, None))
        out.append(row("peak live bytes (no allocator does better)", self.peak_requested_bytes,
                       None, None))
        return out

    def format(self) -> str:
        """The report ``numba-bfc tune`` prints."""
        head = ("", "min limit", "x peak live", "peak reserved", "OOMs at limit")
        rows = [head, *self.rows()]
        widths = [max(len(r[c]) for r in rows) for c in range(len(head))]
        lines = [f"{self.trace}: {self.events} events, {len(self.candidates)} settings replayed "
                 f"in {self.rounds} round(s), {self.seconds:.1f} s"]
        if self.limit is not None:
            lines[0] += f"; limit {format_bytes(self.limit)}"
        lines += ["  ".join(c.ljust(w) if k == 0 else c.rjust(w)
                            for k, (c, w) in enumerate(zip(r, widths))) for r in rows]
        lines.insert(2, "  ".join("-" * w for w in widths))
        lines.append("")
        if self.best.conf:
            pct = 100.0 * abs(self.saving_bytes) / self.defaults.min_limit
            lines.append(f"recommended: {self.conf}")
            if self.saving_bytes >= 0:
                lines.append(f"  needs {format_bytes(self.saving_bytes)} ({pct:.1f}%) less "
                             "than PyTorch's defaults to run with no OOM")
            else:  # chosen for fewer OOMs at --limit, where neither runs clean
                lines.append(f"  {self.best.ooms_at_limit} OOMs at the limit against "
                             f"{self.defaults.ooms_at_limit} with PyTorch's defaults, though "
                             f"it needs {format_bytes(-self.saving_bytes)} ({pct:.1f}%) more "
                             "to run with none")
        else:
            lines.append("recommended: PyTorch's defaults (no setting tried does better)")
        if self.best.settings.get("garbage_collection_threshold") is not None:
            lines.append("  garbage_collection_threshold only acts under a memory fraction: "
                         "torch.cuda.set_per_process_memory_fraction(limit / device memory)")
        if self.limit is not None and self.best.ooms_at_limit:
            lines.append(f"  no setting tried runs it within {format_bytes(self.limit)}: "
                         f"{self.best.ooms_at_limit} OOMs at best")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        from ._html import grid

        return grid(["", "min limit", "x peak live", "peak reserved", "OOMs at limit"],
                    [list(r) for r in self.rows()],
                    f"tune {self.trace}: {self.conf}")


def tune(trace: Trace | str | os.PathLike, *, limit: int | None = None,
         knobs: Iterable[str] = KNOBS, max_rounds: int = 3, client: Any = None,
         progress: Callable[[int, int], None] | None = None) -> TuneResult:
    """Search PyTorch's allocator knobs for the settings that run ``trace`` in least memory.

    Parameters
    ----------
    trace : Trace or path
        A path is read with ``Trace.read``.
    limit : int, optional
        A memory limit (the GPU's memory, say) to count OOMs at; candidates
        with fewer OOMs there rank first.
    knobs : iterable of str
        Which of ``KNOBS`` the search moves (the others stay at the defaults).
    max_rounds : int
        Rounds of coordinate descent at most (each tries every knob).
    client : distributed.Client, optional
        Replay each round's candidates as Dask tasks (``numba_bfc.dask``).
    progress : callable, optional
        ``progress(done, total)`` after each candidate; ``total`` grows with rounds.

    Returns
    -------
    TuneResult

    Raises
    ------
    ValueError
        An unknown knob, an empty trace, ``limit`` out of 1 to ``MAX_LIMIT``, or
        ``max_rounds`` below 1.
    """
    t0 = time.perf_counter()
    if not isinstance(trace, Trace):
        trace = Trace.read(trace)
    knobs = list(knobs)
    unknown = [k for k in knobs if k not in KNOBS]
    if unknown:
        raise ValueError(f"unknown knob {', '.join(unknown)} (known: {', '.join(KNOBS)})")
    if not len(trace) or not trace.peak_requested_bytes:
        raise ValueError(f"{trace.name}: nothing to tune: the trace allocates nothing")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or not 1 <= limit <= MAX_LIMIT):
        raise ValueError(f"limit must be an int from 1 to 2**62 - 1 bytes, got {limit!r}")
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
        raise ValueError(f"max_rounds must be an int >= 1, got {max_rounds!r}")

    # min_limit's own precision: differences below it are the bisection's, not the settings'.
    tolerance = max(256, trace.peak_requested_bytes // 1000)
    run = _Runner(trace, limit, client, progress)
    run.expect(1 + len(_BASELINES) + sum(len(knob_values(trace, k, DEFAULTS)) for k in knobs))
    defaults = run.evaluate([dict(DEFAULTS)])[0]
    baselines = run.baselines()
    best, rounds = defaults, 0
    for rounds in range(1, max_rounds + 1):
        moved = False
        for knob in knobs:
            values = [v for v in knob_values(trace, knob, best.settings)
                      if v != best.settings[knob]]
            if not values:
                continue
            for candidate in run.evaluate([{**best.settings, knob: v} for v in values]):
                if _better(candidate, best, tolerance):
                    best, moved = candidate, True
        if not moved:
            break
        if rounds < max_rounds:
            run.expect(sum(len(knob_values(trace, k, best.settings)) - 1 for k in knobs))
    run.finish()
    from .planning import assign_offsets

    plan = assign_offsets(trace.lifetimes(), "greedy_by_size").total_size
    return TuneResult(trace.name, len(trace), trace.peak_requested_bytes, limit, defaults, best,
                      run.candidates, baselines, plan, rounds, time.perf_counter() - t0)


def _effective(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` without a knob that has no effect: with no ``max_split_size_mb``
    no block is oversize, so ``max_non_split_rounding_mb`` goes back to its default
    (and is not recommended)."""
    if settings.get("max_split_size_mb") is None:
        return {**settings, "max_non_split_rounding_mb": DEFAULTS["max_non_split_rounding_mb"]}
    return settings


def _better(a: Candidate, b: Candidate, tolerance: int) -> bool:
    """Whether ``a`` beats ``b``: fewer OOMs at the limit; else a smallest no-OOM limit lower
    by more than ``tolerance``; else one no higher and less reserved with no limit; else as
    good with fewer knobs changed."""
    if (a.ooms_at_limit or 0) != (b.ooms_at_limit or 0):
        return (a.ooms_at_limit or 0) < (b.ooms_at_limit or 0)
    if a.min_limit < b.min_limit - tolerance:
        return True
    if a.min_limit > b.min_limit:
        return False
    if a.peak_reserved_bytes != b.peak_reserved_bytes:
        return a.peak_reserved_bytes < b.peak_reserved_bytes
    return a.min_limit == b.min_limit and a.changed < b.changed


def _baseline(trace: Trace, name: str, policy: str, options: dict[str, Any]) -> Baseline:
    found = min_limit(trace, policy, **options)
    return Baseline(name, found.limit, found.unlimited_reserved_bytes)


_BASELINES = (("bfc (TF, garbage collection off)", "bfc", {"garbage_collection": False}),
              ("bfc (TF, garbage collection on)", "bfc", {"garbage_collection": True}),
              ("compact (numba_bfc)", "compact", {}))


class _Runner:
    """Evaluates candidates here or on Dask, once per setting, counting progress."""

    def __init__(self, trace: Trace, limit: int | None, client: Any,
                 progress: Callable[[int, int], None] | None) -> None:
        self.trace, self.limit, self.client, self.progress = trace, limit, client, progress
        self.candidates: list[Candidate] = []
        self._seen: dict[tuple, Candidate] = {}
        self._done = self._total = 0
        self._remote = traces_on_cluster(client, [trace])[0] if client else None

    def expect(self, more: int) -> None:
        self._total += more

    def finish(self) -> None:
        """The search is over: the total is what was done."""
        self._total = self._done
        if self.progress is not None:
            self.progress(self._done, self._total)

    def _tick(self, n: int) -> None:
        self._done += n
        self._total = max(self._total, self._done)
        if self.progress is not None:
            self.progress(self._done, self._total)

    def _map(self, fn: Callable, argsets: Sequence[tuple]) -> list:
        if self.client is None:
            out = []
            for args in argsets:
                out.append(fn(self.trace, *args))
                self._tick(1)
            return out
        futures = [self.client.submit(fn, self._remote, *args, pure=False) for args in argsets]
        results = self.client.gather(futures)
        self._tick(len(results))
        return results

    def evaluate(self, settings_list: list[dict[str, Any]]) -> list[Candidate]:
        settings_list = [_effective(s) for s in settings_list]
        keys = [tuple(sorted(s.items())) for s in settings_list]
        todo = {k: s for s, k in zip(settings_list, keys) if k not in self._seen}
        found = self._map(evaluate, [(s, self.limit) for s in todo.values()])
        for k, c in zip(todo, found):
            self._seen[k] = c
            self.candidates.append(c)
        return [self._seen[k] for k in keys]

    def baselines(self) -> list[Baseline]:
        return self._map(_baseline, [(name, policy, options)
                                     for name, policy, options in _BASELINES])


