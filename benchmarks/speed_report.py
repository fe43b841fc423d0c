"""Measure numba_bfc's speed figures and write them into the docs' performance page.

Run from the project root::

    python benchmarks/speed_report.py --peers ../shared/peers --before OLD \
        --write docs/performance.md --summary README.md

(``OLD``: a checkout of earlier code, e.g. ``git worktree add OLD <commit>``.)

Everything runs in this one process or its children, one after the other, on
this machine: the real C++ peers (TF's BFC, TinyTorch's caching allocator)
through the peers' own ``compare.py`` (``--peers``, built with its
``setup.sh``; without it the peer columns are left out), the ``compact``
policy on the same traces and limits, a failed allocation, ``min_limit``,
allocate+free pairs through the API, and cold and warm starts in fresh
processes (with ``--before``, every policy's replays and those last four on
the earlier code too, side by side, in turns, the least of ``--rounds``
processes each). ``--passes N`` measures all of it N times, one pass after
another, and keeps each figure's least: a busy spell of the machine lasts
minutes, and spoils one pass's figures instead of the report's. ``--write``
replaces the text between the page's
``<!-- speed-report:begin -->`` and ``<!-- speed-report:end -->`` markers;
without it the section is printed. ``--summary README.md`` (with ``--peers``)
also replaces two passages of the README: between ``<!-- speed-summary:begin -->``
and ``<!-- speed-summary:end -->``, the ratios to the peers of this run and the
failure, ``--min-limit`` and pair figures; between ``<!-- speed-start:begin -->``
and ``<!-- speed-start:end -->``, the start-up figures. With ``--before``, both
give the earlier code's figures of the same run beside them.
``--sections start,pair`` (names from ``SECTIONS``) measures only those and
prints them: a part of the report, say on a machine lent for minutes.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any

import numba_bfc
from numba_bfc.traces import make_allocator, replay
from numba_bfc.traces.data import bundled_names, load_bundled
from numba_bfc.traces.synthetic import random_churn

BEGIN, END = "<!-- speed-report:begin -->", "<!-- speed-report:end -->"
SUMMARY_BEGIN, SUMMARY_END = "<!-- speed-summary:begin -->", "<!-- speed-summary:end -->"
START_BEGIN, START_END = "<!-- speed-start:begin -->", "<!-- speed-start:end -->"
# The report's sections, in its order, and the option (argparse's name) some need: the
# whole report leaves those out without it.
SECTIONS = ("replay", "turns", "before", "warm", "oom", "pair", "scaling", "start")
NEEDS = {"before": "before", "warm": "peers", "scaling": "peers"}
MiB = 1 << 20
LIMITS = (("80 GiB", None), ("1.25x peak live", 1.25))
BISECTIONS = (("gpt_train", "bfc"), ("gpt_train", "caching"), ("generate_kv", "caching"))
PAIR_LIVE = (1000, 1_000_000)  # live allocations while the pairs are timed

# Every measurement's least figures over the passes so far (``--passes``).
_least_so_far: dict[tuple, list[float]] = {}


def _least(key: tuple, figures: list[float]) -> list[float]:
    """``figures``, each the least of it and what the same measurement (``key``)
    gave in the earlier passes."""
    old = _least_so_far.get(key)
    if old is not None:
        figures = [min(a, b) for a, b in zip(old, figures)]
    _least_so_far[key] = figures
    return figures


_peer_rows_so_far: dict[tuple, dict] = {}  # peer_rows' merged rows, over the passes
# replay_section's ratios to the peers, per limit label: its last pass's (each figure's least).
_peer_ratios: dict[str, dict[str, list[float]]] = {}
# The README's other figures, per kind, per code label ("now", "before"): the last pass's.
# "failure": us per caught failure, one per policy; "min_limit": seconds per bisection
# (BISECTIONS); "pair": us per pair with PAIR_LIVE[0] live, one per allocator; "start":
# {"allocation", "replay", "plan": seconds to the first one with an empty Numba cache,
# "warm": to the first allocation with the cache}.
_headlines: dict[str, dict[str, Any]] = {}


def peer_rows(peers: str, factor: float | None, repeat: int, rounds: int = 1,
              traces: tuple[str, ...] = ()) -> list[dict]:
    """``compare.py``'s JSON rows for every bundled trace (or the trace files
    ``traces``) at one limit; with ``rounds`` runs (and those of earlier
    passes), each side's least time of them (and identical only if identical
    in every run)."""
    merged: dict[tuple[str, str], dict] = _peer_rows_so_far.setdefault(
        (factor, repeat, tuple(map(os.path.basename, traces))), {})
    for _ in range(rounds):
        for row in _compare_once(peers, factor, repeat, traces):
            key = (row["trace"], row["policy"])
            if key not in merged:
                merged[key] = row
                continue
            kept = merged[key]
            for side in ("project_seconds", "peer_seconds"):
                kept[side] = min(kept[side], row[side])
            kept["identical"] = kept["identical"] and row["identical"]
    return list(merged.values())


def _compare_once(peers: str, factor: float | None, repeat: int,
                  traces: tuple[str, ...] = ()) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        cmd = [sys.executable, os.path.join(peers, "compare.py"), *traces, "--repeat",
               str(repeat), "--json", out]
        if factor:
            cmd += ["--limit-factor", str(factor)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode not in (0, 1):  # 1: a mismatch, which the table shows
            raise SystemExit(f"error: {' '.join(cmd)} failed:\n{done.stderr.strip()}")
        with open(out) as f:
            return json.load(f)


def replay_section(peers: str | None, repeat: int, rounds: int) -> list[str]:
    lines = []
    for label, factor in LIMITS:
        rows = peer_rows(peers, factor, repeat, rounds) if peers else []
        by = {(r["trace"], r["policy"]): r for r in rows}
        compact = _interleaved(_REPLAY_NS, ["compact", str(factor or 0), str(repeat)],
                               _trees(None), rounds)["now"]
        head = "| trace | events | OOMs bfc / caching / compact |"
        rule = "|---|---:|---:|"
        if peers:
            head += " TF BFC | bfc | bfc / TF | TinyTorch | caching | caching / TT |"
            rule += "---:|---:|---:|---:|---:|---:|"
        head += " compact | compact / bfc |"
        rule += "---:|---:|"
        lines += [f"Batch replay, ns per event, limit {label} (best of {repeat} replays, the "
                  f"least of {rounds} processes each):", "", head, rule]
        ratios = {"bfc": [], "caching": [], "compact": []}
        names = bundled_names()
        for k, name in enumerate(names):
            trace = load_bundled(name)
            peak = int(trace.live_bytes().max())
            limit = int(factor * peak) if factor else None
            cns, cooms = compact[k], int(compact[len(names) + k])
            if peers:
                b, c = by[(name, "bfc")], by[(name, "caching")]
                bns = b["project_seconds"] / b["events"] * 1e9
                cans = c["project_seconds"] / c["events"] * 1e9
                tf = b["peer_seconds"] / b["events"] * 1e9
                tt = c["peer_seconds"] / c["events"] * 1e9
                ooms = f"{b['project_figures']['ooms']} / {c['project_figures']['ooms']} / {cooms}"
                same = "" if b["identical"] and c["identical"] else " (decisions differ)"
                row = (f"| {name}{same} | {len(trace)} | {ooms} | {tf:.0f} | {bns:.0f} | "
                       f"{bns / tf:.2f} | {tt:.0f} | {cans:.0f} | {cans / tt:.2f} |")
                ratios["bfc"].append(bns / tf)
                ratios["caching"].append(cans / tt)
            else:
                bns = _least(("bfc replay", name, factor),
                             [replay(trace, "bfc", limit=limit).seconds / len(trace) * 1e9])[0]
                row = f"| {name} | {len(trace)} | - / - / {cooms} |"
            ratios["compact"].append(cns / bns)
            lines.append(row + f" {cns:.0f} | {cns / bns:.2f} |")
        if peers:
            _peer_ratios[label] = ratios
            same = sum(r["identical"] for r in rows)
            lines += ["", f"Identical decisions to the peers: {same} of {len(rows)} "
                      f"(peak in use, peak reserved, backend calls, OOMs, every placement). "
                      f"Worst ratio: bfc / TF BFC {max(ratios['bfc']):.2f}, caching / "
                      f"TinyTorch {max(ratios['caching']):.2f}, compact / bfc "
                      f"{max(ratios['compact']):.2f}."]
        lines.append("")
    return lines


def _today() -> str:
    return time.strftime("%Y-%m-%d")


def _span(values: list[float], digits: int) -> str:
    """``values``' range as the README prints it: one figure if both ends read
    the same, no decimals from 100 up (292-401, not 292.1-401.2)."""
    digits = 0 if max(values) >= 100 else digits
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low}-{high}"


def summary_sentence(ratios: dict[str, dict[str, list[float]]], date: str | None = None) -> str:
    """The README's sentence on the peers.

    Parameters
    ----------
    ratios
        Per ``LIMITS`` label, ``{"bfc": [...], "caching": [...]}``: bfc / TF BFC
        and caching / TinyTorch per event, one per bundled trace.
    date
        When the run measured them (default: today).

    Returns
    -------
    str
        Each ratio's range at each limit, and whether any is above 1.
    """
    def span(values: list[float]) -> str:
        return _span(values, 2) + "x"

    (free, _), (tight, factor) = LIMITS
    worst = round(max(max(ratios[label][p]) for label in (free, tight)
                      for p in ("bfc", "caching")), 2)
    how_long = "at most as long" if worst <= 1 else f"up to {worst:.2f}x as long"
    return (f"Against those peers, their kernels take {how_long} per event: replaying the "
            f"bundled traces without a limit takes {span(ratios[free]['bfc'])} the time of "
            f"TF's BFC and {span(ratios[free]['caching'])} that of TinyTorch's cache, and at "
            f"{factor:g}x their peak {span(ratios[tight]['bfc'])} and "
            f"{span(ratios[tight]['caching'])} (measured {date or _today()}, "
            f"[Speed](docs/performance.md)).")


def headline_sentence(headlines: dict[str, dict[str, Any]], before: str) -> str:
    """The README's sentence on failures, ``--min-limit`` and the pair.

    Parameters
    ----------
    headlines
        ``_headlines``: what ``oom_section`` and ``pair_section`` measured.
    before
        The earlier code's commit, named when its figures are there too.

    Returns
    -------
    str
        The sentence, or '' if those sections were not measured.
    """
    kinds = ("failure", "min_limit", "pair")
    if not all(kind in headlines for kind in kinds):
        return ""
    digits = {"failure": 1, "min_limit": 3, "pair": 2}

    def figures(label: str) -> list[str]:
        return [_span(headlines[kind][label], digits[kind]) for kind in kinds]

    traces = " or ".join(f"`{name}`" for name in dict.fromkeys(n for n, _ in BISECTIONS))
    failure, bisection, pair = figures("now")
    sentence = (f"A failed allocation, caught, takes {failure} us, a `--min-limit` bisection "
                f"of {traces} {bisection} s and an allocate+free pair through the API {pair} "
                f"us with {PAIR_LIVE[0]:,} live")
    if all("before" in headlines[kind] for kind in kinds):
        failure, bisection, pair = figures("before")
        sentence += (f"; in the same run the code at {before} took {failure} us, "
                     f"{bisection} s and {pair} us")
    return sentence + "."


def start_sentence(headlines: dict[str, dict[str, Any]], before: str,
                   date: str | None = None) -> str:
    """The README's sentence on start-up.

    Parameters
    ----------
    headlines
        ``_headlines``: what ``start_section`` measured.
    before
        The earlier code's commit, named when its figures are there too.
    date
        When the run measured them (default: today).

    Returns
    -------
    str
        Seconds to the first allocation, replay and plan with an empty Numba
        cache, the earlier code's beside them, and to the first allocation
        with the cache; '' if start-up was not measured.
    """
    if "start" not in headlines:
        return ""
    now = headlines["start"]["now"]
    sentence = (f"With an empty Numba cache the first run compiles the kernels: on this "
                f"{os.cpu_count()}-core machine {now['allocation']:.2f} s to an allocator's "
                f"first allocation, {now['replay']:.2f} s to a first replay and "
                f"{now['plan']:.2f} s to a first plan")
    old = headlines["start"].get("before")
    if old:
        sentence += (f" (the code at {before}, in the same run: {old['allocation']:.2f}, "
                     f"{old['replay']:.2f} and {old['plan']:.2f} s)")
    return (sentence + f"; with the cache, {now['warm']:.2f} s to the first allocation "
            f"(measured {date or _today()}, [Speed](docs/performance.md)).")


def replace_marked(page: str, begin: str, end: str, text: str) -> str | None:
    """Replace the marked part of a page.

    Parameters
    ----------
    page
        The page's text.
    begin, end
        The markers, kept; the first ``end`` after the first ``begin`` closes.
    text
        What goes between them.

    Returns
    -------
    str or None
        The new page, or None if it lacks either marker (in that order).
    """
    if begin not in page or end not in page.split(begin, 1)[1]:
        return None
    head, rest = page.split(begin, 1)
    return head + begin + text + end + rest.split(end, 1)[1]


def _rewrite(targets: list[tuple[str, str, str]],
             texts: dict[str, str]) -> tuple[dict[str, str], tuple[str, str, str] | None]:
    """Every page of ``targets`` (``(page, begin, end)``, several to a page)
    with its marked passages replaced by ``texts[begin]``, one after another
    ('' keeps the passage as it is); and the first target whose page cannot be
    read or has lost its markers by then (None if there is none)."""
    pages: dict[str, str] = {}
    for target in targets:
        page, begin, end = target
        text = pages[page] if page in pages else _read(page)
        new_page = None if text is None else replace_marked(text, begin, end, texts[begin])
        if new_page is None:
            return pages, target
        pages[page] = new_page if texts[begin] else text
    return pages, None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _peer_warm(peers: str, binary: str, path: str, repeat: int) -> float:
    """A peer binary's ``warm_ns_per_event``: a second pass over the same allocator."""
    out = subprocess.run([os.path.join(peers, "bin", binary), "--repeat", str(repeat),
                          "--limit", str(80 << 30), path], capture_output=True, text=True,
                         check=True).stdout
    ns = float(json.loads(out.splitlines()[-1])["warm_ns_per_event"])
    return _least(("peer warm", binary, path, repeat), [ns])[0]


def _own_warm(name: str, policy: str, repeat: int) -> float:
    """ns/event of a replay on an allocator that already served the trace once
    (every region it needs is there): the kernels alone, no backend calls."""
    trace = load_bundled(name)
    allocator = make_allocator(policy)
    replay(trace, allocator)
    ns = min(replay(trace, allocator).seconds for _ in range(repeat)) / len(trace) * 1e9
    return _least(("own warm", name, policy, repeat), [ns])[0]


def warm_section(peers: str, repeat: int) -> list[str]:
    from importlib import resources

    lines = ["Warm replay, ns per event: the same allocator replays the trace again, so no "
             "new regions or segments (the peers' `warm_ns_per_event`, limit 80 GiB):", "",
             "| trace | TF BFC | bfc | TinyTorch | caching | compact |",
             "|---|---:|---:|---:|---:|---:|"]
    for name in bundled_names():
        path = str(resources.files("numba_bfc.traces.data") / f"{name}.csv.gz")
        tf = _peer_warm(peers, "tfbfc_replay", path, repeat)
        tt = _peer_warm(peers, "tinytorch_replay", path, repeat)
        own = [_own_warm(name, p, repeat) for p in ("bfc", "caching", "compact")]
        lines.append(f"| {name} | {tf:.0f} | {own[0]:.0f} | {tt:.0f} | {own[1]:.0f} | "
                     f"{own[2]:.0f} |")
    lines.append("")
    return lines


_FAILURES = r"""
import statistics, sys, time
from numba_bfc import BFCAllocator, CachingAllocator, CompactAllocator, OutOfMemoryError
from numba_bfc.backends import VirtualSubAllocator
MiB = 1 << 20
cls, kw = {"bfc": (BFCAllocator, {}), "caching": (CachingAllocator, {}),
           "compact": (CompactAllocator, {"page_size": 64 << 10})}[sys.argv[1]]
a = cls(VirtualSubAllocator(contiguous=cls is CompactAllocator), memory_limit=64 * MiB, **kw)
live = [a.allocate_raw(MiB) for _ in range(40)]
for p in live[::2]:
    a.deallocate_raw(p)
def fail(n, read):
    t0 = time.perf_counter()
    for _ in range(n):
        try:
            a.allocate_raw(48 * MiB)
        except OutOfMemoryError as e:
            if read > 0:
                str(e)
            if read > 1:
                len(e.occupancy)
    return (time.perf_counter() - t0) / n * 1e6
fail(5, 2)
rounds = ((0, 200), (1, 200), (2, 20))
print(*(statistics.median(fail(n, read) for _ in range(5)) for read, n in rounds))
"""

_MIN_LIMIT = r"""
import sys, time
from numba_bfc.traces import min_limit
from numba_bfc.traces.data import load_bundled
trace = load_bundled(sys.argv[1])
min_limit(trace, sys.argv[2])
t0 = time.perf_counter()
r = min_limit(trace, sys.argv[2])
print(time.perf_counter() - t0, r.replays)
"""


def _python(code: str, args=(), tree: str | None = None, cache: str | None = None) -> list[str]:
    """Run ``code`` in a fresh interpreter, on ``tree``'s numba_bfc if given;
    returns its last output line, split."""
    # Bytecode is written and read, as for an installed package: an environment
    # that turns it off (this machine's does) has every process compile the
    # package's sources, about 0.13 s of an import here.
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_BFC_CONF", "PYTHONDONTWRITEBYTECODE")}
    if tree:
        env["PYTHONPATH"] = tree
    if cache:
        env["NUMBA_CACHE_DIR"] = cache
    # ``-c`` puts the working folder first on the path: run in the tree measured.
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         env=env, check=True, cwd=tree).stdout
    return out.splitlines()[-1].split()


def _interleaved(code: str, args, trees, rounds: int) -> dict[str, list[float]]:
    """Each tree's figures from ``code`` (its last output line): the least of
    ``rounds`` fresh processes each, the trees taking turns (and turns at
    going first), so that a slow spell of the machine (it moves figures by up
    to 2x from process to process here) is not read as a difference between
    them; and the least of the earlier passes' too."""
    best: dict[str, list[float]] = {}
    for r in range(rounds):
        for label, tree in trees if r % 2 == 0 else trees[::-1]:  # neither always first
            figures = [float(x) for x in _python(code, args, tree)]
            old = best.get(label, figures)
            best[label] = [min(a, b) for a, b in zip(old, figures)]
    return {label: _least((code, tuple(args), label), figures)
            for label, figures in best.items()}


def _trees(before: str | None) -> list[tuple[str, str | None]]:
    return [("now", None)] + ([("before", before)] if before else [])


_REPLAY_NS = r"""
import sys
from numba_bfc.traces import replay
from numba_bfc.traces.data import bundled_names, load_bundled
policy, factor, repeat = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
out, ooms = [], []
for name in bundled_names():
    trace = load_bundled(name)
    limit = int(factor * int(trace.live_bytes().max())) if factor else None
    ooms.append(replay(trace, policy, limit=limit).ooms)
    best = min(replay(trace, policy, limit=limit).seconds for _ in range(repeat))
    out.append(best / len(trace) * 1e9)
print(*out, *ooms)  # ns per event, then failures, trace by trace
"""


_TURNS = r"""
import sys
from numba_bfc.traces import replay
from numba_bfc.traces.data import bundled_names, load_bundled
factor, repeat = float(sys.argv[1]), int(sys.argv[2])
out = {"bfc": [], "compact": []}
for name in bundled_names():
    trace = load_bundled(name)
    limit = int(factor * int(trace.live_bytes().max())) if factor else None
    best = {}
    for r in range(repeat):
        for policy in out if r % 2 == 0 else reversed(out):  # neither always first
            seconds = replay(trace, policy, limit=limit).seconds
            best[policy] = min(best.get(policy, seconds), seconds)
    for policy in out:
        out[policy].append(best[policy] / len(trace) * 1e9)
print(*out["bfc"], *out["compact"])  # ns per event, trace by trace
"""


def turns_section(repeat: int, rounds: int) -> list[str]:
    """Compact against bfc with the two policies taking turns on each trace in
    one process, so that both meet the same spells of the machine (the tables
    above measure each policy in processes of its own)."""
    names = bundled_names()
    lines = [f"Compact against bfc, the two taking turns on each trace in one process, ns per "
             f"event (best of {repeat} replays each, the least of {rounds} processes):", "",
             "| trace | bfc unlimited | compact | compact / bfc | bfc 1.25x | compact | "
             "compact / bfc |", "|---|---:|---:|---:|---:|---:|---:|"]
    columns = []
    for _label, factor in LIMITS:
        best: list[float] | None = None
        for _ in range(rounds):
            figures = [float(x) for x in _python(_TURNS, [str(factor or 0), str(repeat)])]
            best = figures if best is None else [min(a, b) for a, b in zip(best, figures)]
        best = _least(("turns", factor, repeat), best)
        columns.append((best[:len(names)], best[len(names):]))
    for k, name in enumerate(names):
        cells = []
        for bfc, compact in columns:
            cells += [f"{bfc[k]:.0f}", f"{compact[k]:.0f}", f"{compact[k] / bfc[k]:.2f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def before_section(before: str | None, repeat: int, rounds: int) -> list[str]:
    """Batch replay of every policy on this code and the earlier code, side by
    side (the peers' table above has only this code)."""
    if not before:
        return []
    policies = ("bfc", "caching", "compact")
    names = bundled_names()
    lines = []
    for label, factor in LIMITS:
        lines += [f"Batch replay on this code and the earlier code, ns per event, limit "
                  f"{label} (best of {repeat} replays, the least of {rounds} processes each, "
                  f"the two codes taking turns):", "",
                  "| trace | " + " | ".join(f"{p} now | {p} before" for p in policies) + " |",
                  "|---|" + "---:|" * (2 * len(policies))]
        columns = []
        for policy in policies:
            got = _interleaved(_REPLAY_NS, [policy, str(factor or 0), str(repeat)],
                               _trees(before), rounds)
            columns += [got["now"], got["before"]]
        for k, name in enumerate(names):
            lines.append(f"| {name} | " + " | ".join(f"{c[k]:.0f}" for c in columns) + " |")
        lines.append("")
    return lines


def oom_section(before: str | None, rounds: int) -> list[str]:
    trees = _trees(before)
    lines = ["A failed allocation (48 MiB into a 64 MiB limit with 20 MiB free in 1 MiB holes, "
             "after the whole slow path), us per failure, median of 5 rounds, the least of "
             f"{rounds} processes; the error "
             "caught and nothing read, its message read (`str(e)`), and its report read "
             "too (`e.occupancy`):", "",
             "| policy | code | caught | `str(e)` | `str(e)`, `e.occupancy` |",
             "|---|---|---:|---:|---:|"]
    failures = _headlines["failure"] = {label: [] for label, _ in trees}
    for policy in ("bfc", "caching", "compact"):
        got = _interleaved(_FAILURES, [policy], trees, rounds)
        for label, _ in trees:
            caught, message, report = got[label]
            failures[label].append(caught)
            lines.append(f"| {policy} | {label} | {caught:.1f} | {message:.1f} | {report:.1f} |")
    lines += ["", "`min_limit` (bisection of the smallest limit; every probe below it fails), "
              f"seconds, after one untimed call, the least of {rounds} processes:", "",
              "| trace, policy | replays | code | seconds |", "|---|---:|---|---:|"]
    bisections = _headlines["min_limit"] = {label: [] for label, _ in trees}
    for name, policy in BISECTIONS:
        got = _interleaved(_MIN_LIMIT, [name, policy], trees, rounds)
        for label, _ in trees:
            seconds, replays = got[label]
            bisections[label].append(seconds)
            lines.append(f"| {name}, {policy} | {replays:.0f} | {label} | {seconds:.3f} |")
    lines.append("")
    return lines


_PAIRS = r"""
import random, statistics, sys, time
import numpy as np
import numba_bfc
from numba_bfc.backends import VirtualSubAllocator
cls = getattr(numba_bfc, sys.argv[1])
def per_pair(live_count, rounds=7, pairs=2000):
    a = cls(VirtualSubAllocator(), memory_limit=1 << 44)
    rng = random.Random(0)
    sizes = np.array([rng.randint(256, 4096) for _ in range(live_count)])
    live = a.run_batch(np.zeros(live_count, np.int8), np.arange(live_count), sizes).tolist()
    churn = [(rng.randrange(live_count), rng.randint(256, 4096)) for _ in range(pairs)]
    free, alloc = a.deallocate_raw, a.allocate_raw
    def run():
        t0 = time.perf_counter()
        for slot, size in churn:
            free(live[slot])
            live[slot] = alloc(size)
        return (time.perf_counter() - t0) / pairs * 1e6
    run()
    return statistics.median(run() for _ in range(rounds))
print(*(per_pair(int(live)) for live in sys.argv[2:]))
"""


#: Pairs (``random_churn``) replayed after the live allocations, in the kernels and the peers.
SCALING_PAIRS = 1_000_000
#: Replays per side and trace there (``compare.py --repeat``): one run takes 3-4 minutes here.
SCALING_REPEAT = 3


def scaling_section(peers: str) -> list[str]:
    """The allocate+free pair at scale, without Python: ``random_churn`` with
    ``PAIR_LIVE`` live allocations replayed by the batch kernels and by the
    C++ peers (``compare.py``), once with ``SCALING_PAIRS`` pairs after them
    and once without; a pair's time is the difference over ``SCALING_PAIRS``.
    How much a million live allocations cost each side's tables and trees,
    where the pair through the API adds the calls' fixed cost. Measured once
    per report (the last pass), best of ``SCALING_REPEAT`` replays."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for live in PAIR_LIVE:
            for pairs in (0, SCALING_PAIRS):
                paths[live, pairs] = os.path.join(tmp, f"churn_{live}_{pairs}.csv.gz")
                random_churn(live, pairs).write(paths[live, pairs])
        rows = peer_rows(peers, None, SCALING_REPEAT, 1, tuple(paths.values()))
    by = {(r["trace"], r["policy"]): r for r in rows}
    lines = [f"The allocate+free pair at scale, in the batch kernels and the C++ peers: "
             f"`random_churn` (`numba_bfc.traces.synthetic`: the live allocations, then "
             f"{SCALING_PAIRS:,} pairs freeing one at random and allocating another, 256 B - "
             f"4 KiB), ns per pair: a replay with the pairs less one without, over the pairs "
             f"(unlimited, best of {SCALING_REPEAT} replays each, one run of `compare.py`, in "
             "the report's last pass):", "",
             f"| policy / peer | peer, {PAIR_LIVE[0]:,} live | {PAIR_LIVE[1]:,} live | ratio | "
             f"numba_bfc, {PAIR_LIVE[0]:,} live | {PAIR_LIVE[1]:,} live | ratio |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for policy, peer in (("bfc", "TF BFC"), ("caching", "TinyTorch")):
        figures = {}
        for side in ("peer_seconds", "project_seconds"):
            for live in PAIR_LIVE:
                full, setup = (by[(_stem(paths[live, pairs]), policy)][side]
                               for pairs in (SCALING_PAIRS, 0))
                figures[side, live] = (full - setup) / SCALING_PAIRS * 1e9
        cells = []
        for side in ("peer_seconds", "project_seconds"):
            small, big = figures[side, PAIR_LIVE[0]], figures[side, PAIR_LIVE[1]]
            cells += [f"{small:.0f}", f"{big:.0f}", f"{big / small:.2f}"]
        lines.append(f"| {policy} / {peer} | " + " | ".join(cells) + " |")
    same = sum(r["identical"] for r in rows)
    lines += ["", f"Identical decisions to the peers on these traces: {same} of {len(rows)}.", ""]
    return lines


def _stem(path: str) -> str:
    """A trace file's name as ``compare.py`` names its rows (``Trace.read``'s
    default name: the file name up to its first dot)."""
    return os.path.basename(path).split(".")[0]


def pair_section(before: str | None, rounds: int) -> list[str]:
    trees = _trees(before)
    lines = ["Allocate+free pair through the API (`deallocate_raw` then `allocate_raw`, "
             "256 B - 4 KiB), us per pair, median of 7 rounds of 2000, the least of "
             f"{rounds} processes:", "",
             f"| allocator | code | {PAIR_LIVE[0]:,} live | {PAIR_LIVE[1]:,} live | ratio |",
             "|---|---|---:|---:|---:|"]
    pairs = _headlines["pair"] = {label: [] for label, _ in trees}
    for cls in ("BFCAllocator", "CachingAllocator", "CompactAllocator"):
        got = _interleaved(_PAIRS, [cls, *map(str, PAIR_LIVE)], trees, rounds)
        for label, _ in trees:
            small, big = got[label]
            pairs[label].append(small)
            lines.append(f"| {cls} | {label} | {small:.2f} | {big:.2f} | {big / small:.2f} |")
    lines.append("")
    return lines


_START = r"""
import sys, time
t0 = time.perf_counter()
import numba_bfc
t1 = time.perf_counter()
if sys.argv[1] == "allocation":
    from numba_bfc.backends import VirtualSubAllocator
    a = numba_bfc.BFCAllocator(VirtualSubAllocator(), memory_limit=1 << 30)
    a.allocate_raw(1000)
elif sys.argv[1] == "replay":
    from numba_bfc.traces import replay
    from numba_bfc.traces.data import load_bundled
    replay(load_bundled("generate_kv"), "bfc")
else:
    from numba_bfc.planning import assign_offsets
    from numba_bfc.traces.data import load_bundled
    assign_offsets(load_bundled("generate_kv").lifetimes(), "greedy_by_size")
print(t1 - t0, time.perf_counter() - t1)
"""


def _write_bytecode(tree: str | None) -> None:
    """Compile ``tree``'s package (else this one) to bytecode, as installing it
    does, so that an import reads it (``_python`` lets processes read it)."""
    package = (os.path.join(tree, "numba_bfc") if tree
               else os.path.dirname(os.path.abspath(numba_bfc.__file__)))
    compileall.compile_dir(package, quiet=1)


def start_section(before: str | None, rounds: int) -> list[str]:
    trees = _trees(before)
    for _label, tree in trees:
        _write_bytecode(tree)
    lines = ["Start-up in a fresh process, seconds: `import numba_bfc`, then the first "
             "allocation (BFC, 1000 B), replay (BFC, `generate_kv`) or plan (`generate_kv`), "
             "with an empty Numba cache and with the cache that run left (best of 3), the "
             "package's Python bytecode written beforehand, as installing it leaves it; the "
             f"least of {rounds} such runs{', the two codes taking turns' if before else ''}:",
             "",
             "| first | code | import | empty cache | warm cache |", "|---|---|---:|---:|---:|"]
    start = _headlines["start"] = {label: {} for label, _ in trees}
    for what in ("allocation", "replay", "plan"):
        best: dict[str, tuple[float, float, float]] = {}
        for r in range(rounds):
            for label, tree in trees if r % 2 == 0 else trees[::-1]:
                with tempfile.TemporaryDirectory() as cache:
                    imported, cold = map(float, _python(_START, [what], tree, cache))
                    warm = min(float(_python(_START, [what], tree, cache)[1])
                               for _ in range(3))
                old = best.get(label, (imported, cold, warm))
                best[label] = (min(old[0], imported), min(old[1], cold), min(old[2], warm))
        for label, _ in trees:
            imported, cold, warm = _least(("start", what, label), list(best[label]))
            start[label][what] = cold
            if what == "allocation":
                start[label]["warm"] = warm
            lines.append(f"| {what} | {label} | {imported:.2f} | {cold:.2f} | {warm:.2f} |")
    lines.append("")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--peers", help="the peers' folder (with compare.py and built bin/)")
    ap.add_argument("--repeat", type=int, default=5, help="best of N replays (default 5)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="fresh processes per figure measured in one (default 3): the least "
                         "is kept")
    ap.add_argument("--passes", type=int, default=1,
                    help="measure the whole report N times, one pass after another, and keep "
                         "each figure's least (default 1): a busy spell of the machine, "
                         "which lasts minutes, then spoils one pass's figures, not the report")
    ap.add_argument("--write", metavar="PAGE",
                    help="replace the marked section of this file (docs/performance.md)")
    ap.add_argument("--summary", metavar="README",
                    help="with --peers: also replace the marked passages of this file "
                         "(README.md) with the ratios to the peers, the failure, min-limit, "
                         "pair and start-up figures")
    ap.add_argument("--before", metavar="TREE",
                    help="a checkout of earlier code: replays, failures, min_limit, pairs and "
                         "start-up are also measured on it, side by side")
    ap.add_argument("--sections", metavar="NAMES",
                    help="comma-separated, of " + ", ".join(SECTIONS) + ": measure only "
                         "these and print them (not with --write or --summary; warm and "
                         "scaling need --peers, before --before)")
    args = ap.parse_args(argv)
    if args.passes < 1 or args.rounds < 1 or args.repeat < 1:
        ap.error("--passes, --rounds and --repeat must be at least 1")
    chosen = set(SECTIONS)
    if args.sections is not None:
        chosen = set(args.sections.split(","))
        unknown = sorted(chosen - set(SECTIONS))
        if unknown:
            ap.error(f"--sections: no section {', '.join(map(repr, unknown))} (there are "
                     + ", ".join(SECTIONS) + ")")
        if args.write or args.summary:
            ap.error("--sections prints a part of the report; --write and --summary take "
                     "all of it")
        for name in sorted(chosen & NEEDS.keys()):  # asked for, it would print nothing
            if not getattr(args, NEEDS[name]):
                ap.error(f"--sections {name} needs --{NEEDS[name]}")
    if args.summary and not args.peers:
        ap.error("--summary needs --peers (its figures are the ratios to the peers)")
    targets = [(page, begin, end) for page, begin, end in
               ((args.write, BEGIN, END), (args.summary, SUMMARY_BEGIN, SUMMARY_END),
                (args.summary, START_BEGIN, START_END)) if page]
    # Checked as they will be written, one after another: a section inside another is lost
    # when the outer one is written.
    _, missing = _rewrite(targets, {begin: "-" for _, begin, _ in targets})
    if missing:
        page, begin, end = missing
        ap.error(f"cannot read {page}" if _read(page) is None else
                 f"{page} has no {begin} ... {end} section (or it lies inside another)")
    today = _today()
    cpu = platform.processor() or platform.machine()
    before, commit = "", ""
    if args.before:
        commit = subprocess.run(["git", "-C", args.before, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip() or args.before
        before = f" \"before\" is the code at {commit}."
    lines = ["", "",
             f"Generated by `python benchmarks/speed_report.py"
             f"{' --peers PEERS' if args.peers else ''}"
             f"{' --before TREE' if args.before else ''} --repeat {args.repeat} --rounds "
             f"{args.rounds}{f' --passes {args.passes}' if args.passes > 1 else ''}"
             + (f" --sections {args.sections}" if args.sections
                else f" --write {args.write or 'PAGE'}")
             + f"{f' --summary {args.summary}' if args.summary else ''}` on "
             f"{today}: {os.cpu_count()} cores ({cpu}), Python "
             f"{platform.python_version()}, one run, nothing else running. Every figure of a "
             f"table comes from the same run.{before}"
             + (f" The run measured {'its sections' if args.sections else 'everything'} "
                f"{args.passes} times, one pass after another, "
                "and each figure is the least of its passes (the processes a table names, in "
                "each pass)." if args.passes > 1 else ""), ""]
    measure = {
        "replay": lambda: replay_section(args.peers, args.repeat, args.rounds),
        "turns": lambda: turns_section(args.repeat, args.rounds),
        "before": lambda: before_section(args.before, args.repeat, args.rounds),
        "warm": lambda: warm_section(args.peers, args.repeat),
        "oom": lambda: oom_section(args.before, args.rounds),
        "pair": lambda: pair_section(args.before, args.rounds),
        "scaling": lambda: scaling_section(args.peers),
        "start": lambda: start_section(args.before, args.rounds),
    }
    for done in range(1, args.passes + 1):  # the last pass's text has every figure's least
        body = []
        for name in SECTIONS:
            if (name in chosen and (name not in NEEDS or getattr(args, NEEDS[name]))
                    and (name != "scaling" or done == args.passes)):  # the slowest: once
                body += measure[name]()
    section = "\n".join(lines + body) + "\n"
    if not args.write:
        print(BEGIN + section + END)
    # Every page's new text first, so that a page changed during the run
    # fails the write without emptying any.
    new_texts = {BEGIN: section}
    if args.summary:
        new_texts[SUMMARY_BEGIN] = " ".join(filter(None, (
            summary_sentence(_peer_ratios, today), headline_sentence(_headlines, commit))))
        new_texts[START_BEGIN] = start_sentence(_headlines, commit, today)
    pages, missing = _rewrite(targets, new_texts)
    if missing:
        print(f"error: {missing[0]} lost its markers (or cannot be read) during the run; "
              "nothing written", file=sys.stderr)
        return 2
    for page, new_page in pages.items():
        with open(page, "w") as f:
            f.write(new_page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
