"""Measure numba_bfc's speed figures and write them into the README's speed section.

Run from the project root::

    python benchmarks/speed_report.py --peers ../shared/peers --write README.md

Everything runs in this one process or its children, one after the other, on
this machine: the real C++ peers (TF's BFC, TinyTorch's caching allocator)
through the peers' own ``compare.py`` (``--peers``, built with its
``setup.sh``; without it the peer columns are left out), the ``compact``
policy on the same traces and limits, a failed allocation, ``min_limit``,
allocate+free pairs through the API, and cold and warm starts in fresh
processes. ``--write`` replaces the text between the README's
``<!-- speed-report:begin -->`` and ``<!-- speed-report:end -->`` markers;
without it the section is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from numba_bfc import BFCAllocator, CachingAllocator, CompactAllocator, OutOfMemoryError
from numba_bfc.backends import VirtualSubAllocator
from numba_bfc.traces import make_allocator, min_limit, replay
from numba_bfc.traces.data import bundled_names, load_bundled

BEGIN, END = "<!-- speed-report:begin -->", "<!-- speed-report:end -->"
MiB = 1 << 20
LIMITS = (("80 GiB", None), ("1.25x peak live", 1.25))


def peer_rows(peers: str, factor: float | None, repeat: int) -> list[dict]:
    """``compare.py``'s JSON rows for every bundled trace at one limit."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        cmd = [sys.executable, os.path.join(peers, "compare.py"), "--repeat", str(repeat),
               "--json", out]
        if factor:
            cmd += ["--limit-factor", str(factor)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode not in (0, 1):  # 1: a mismatch, which the table shows
            raise SystemExit(f"error: {' '.join(cmd)} failed:\n{done.stderr.strip()}")
        with open(out) as f:
            return json.load(f)


def compact_ns(name: str, limit: int | None, repeat: int) -> tuple[float, int]:
    """Best-of-``repeat`` batch replay ns/event of ``compact`` (as ``compare.py``
    times the others: ``ReplayResult.seconds``, after one untimed replay)."""
    trace = load_bundled(name)
    replay(trace, "compact", limit=limit)
    best = min(replay(trace, "compact", limit=limit).seconds for _ in range(repeat))
    return best / len(trace) * 1e9, replay(trace, "compact", limit=limit).ooms


def replay_section(peers: str | None, repeat: int) -> list[str]:
    lines = []
    for label, factor in LIMITS:
        rows = peer_rows(peers, factor, repeat) if peers else []
        by = {(r["trace"], r["policy"]): r for r in rows}
        head = "| trace | events | OOMs bfc / caching / compact |"
        rule = "|---|---:|---:|"
        if peers:
            head += " TF BFC | bfc | bfc / TF | TinyTorch | caching | caching / TT |"
            rule += "---:|---:|---:|---:|---:|---:|"
        head += " compact | compact / bfc |"
        rule += "---:|---:|"
        lines += [f"Batch replay, ns per event, limit {label}:", "", head, rule]
        ratios = {"bfc": [], "caching": [], "compact": []}
        for name in bundled_names():
            trace = load_bundled(name)
            peak = int(trace.live_bytes().max())
            limit = int(factor * peak) if factor else None
            cns, cooms = compact_ns(name, limit, repeat)
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
                bns = replay(trace, "bfc", limit=limit).seconds / len(trace) * 1e9
                row = f"| {name} | {len(trace)} | - / - / {cooms} |"
            ratios["compact"].append(cns / bns)
            lines.append(row + f" {cns:.0f} | {cns / bns:.2f} |")
        if peers:
            same = sum(r["identical"] for r in rows)
            lines += ["", f"Identical decisions to the peers: {same} of {len(rows)} "
                      f"(peak in use, peak reserved, backend calls, OOMs, every placement). "
                      f"Worst ratio: bfc / TF BFC {max(ratios['bfc']):.2f}, caching / "
                      f"TinyTorch {max(ratios['caching']):.2f}, compact / bfc "
                      f"{max(ratios['compact']):.2f}."]
        lines.append("")
    return lines


def _peer_warm(peers: str, binary: str, path: str, repeat: int) -> float:
    """A peer binary's ``warm_ns_per_event``: a second pass over the same allocator."""
    out = subprocess.run([os.path.join(peers, "bin", binary), "--repeat", str(repeat),
                          "--limit", str(80 << 30), path], capture_output=True, text=True,
                         check=True).stdout
    return float(json.loads(out.splitlines()[-1])["warm_ns_per_event"])


def _own_warm(name: str, policy: str, repeat: int) -> float:
    """ns/event of a replay on an allocator that already served the trace once
    (every region it needs is there): the kernels alone, no backend calls."""
    trace = load_bundled(name)
    allocator = make_allocator(policy)
    replay(trace, allocator)
    return min(replay(trace, allocator).seconds for _ in range(repeat)) / len(trace) * 1e9


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


def _fragmented(cls, **kw):
    a = cls(VirtualSubAllocator(contiguous=cls is CompactAllocator), memory_limit=64 * MiB, **kw)
    live = [a.allocate_raw(MiB) for _ in range(40)]
    for p in live[::2]:
        a.deallocate_raw(p)
    return a


def _per_failure(a, read: bool, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        try:
            a.allocate_raw(48 * MiB)
        except OutOfMemoryError as e:
            str(e)
            if read:
                len(e.occupancy)  # builds the report
    return (time.perf_counter() - t0) / n


def oom_section() -> list[str]:
    lines = ["Failed allocation (48 MiB into a 64 MiB limit with 20 MiB free in 1 MiB holes, "
             "after the whole slow path), us per failure, median of 5 rounds:", "",
             "| policy | report deferred | report read (`e.occupancy`) |", "|---|---:|---:|"]
    for policy, cls, kw in (("bfc", BFCAllocator, {}), ("caching", CachingAllocator, {}),
                            ("compact", CompactAllocator, {"page_size": 64 << 10})):
        a = _fragmented(cls, **kw)
        _per_failure(a, True, 5)
        lazy = statistics.median(_per_failure(a, False, 200) for _ in range(5))
        eager = statistics.median(_per_failure(a, True, 20) for _ in range(5))
        lines.append(f"| {policy} | {lazy * 1e6:.1f} | "
                     f"{eager * 1e6:.1f} |")
    lines.append("")
    for policy in ("bfc", "caching"):
        trace = load_bundled("cnn_train")
        min_limit(trace, policy)
        t0 = time.perf_counter()
        r = min_limit(trace, policy)
        lines.append(f"`min_limit(cnn_train, {policy!r})`: {time.perf_counter() - t0:.2f} s, "
                     f"{r.replays} replays.")
    lines.append("")
    return lines


def _pairs(cls, live_count: int, max_size: int, rounds: int = 7, pairs: int = 2000) -> float:
    a = cls(VirtualSubAllocator(), memory_limit=1 << 44)
    rng = random.Random(0)
    sizes = np.array([rng.randint(256, max_size) for _ in range(live_count)])
    live = a.run_batch(np.zeros(live_count, np.int8), np.arange(live_count), sizes).tolist()
    churn = [(rng.randrange(live_count), rng.randint(256, max_size)) for _ in range(pairs)]
    free, alloc = a.deallocate_raw, a.allocate_raw

    def run():
        t0 = time.perf_counter()
        for slot, size in churn:
            free(live[slot])
            live[slot] = alloc(size)
        return (time.perf_counter() - t0) / pairs

    run()
    return statistics.median(run() for _ in range(rounds))


def pair_section() -> list[str]:
    lines = ["Allocate+free pair through the API (`deallocate_raw` then `allocate_raw`, "
             "256 B - 4 KiB), us per pair, median of 7 rounds of 2000:", "",
             "| policy | 1,000 live | 1,000,000 live | ratio |", "|---|---:|---:|---:|"]
    for cls in (BFCAllocator, CachingAllocator, CompactAllocator):
        small, big = _pairs(cls, 1000, 4096), _pairs(cls, 1_000_000, 4096)
        lines.append(f"| {cls.__name__} | {small * 1e6:.2f} | {big * 1e6:.2f} | "
                     f"{big / small:.2f} |")
    lines.append("")
    return lines


_FIRST = {
    "first allocation (bfc)": "from numba_bfc import BFCAllocator\n"
    "from numba_bfc.backends import VirtualSubAllocator\n"
    "a = BFCAllocator(VirtualSubAllocator(), memory_limit=1 << 30)\n"
    "a.deallocate_raw(a.allocate_raw(1000))",
    "first replay (bfc)": "from numba_bfc.traces import replay\n"
    "from numba_bfc.traces.data import load_bundled\n"
    "replay(load_bundled('generate_kv'), 'bfc')",
    "first plan": "from numba_bfc.planning import assign_offsets\n"
    "from numba_bfc.traces.data import load_bundled\n"
    "assign_offsets(load_bundled('generate_kv').lifetimes(), 'greedy_by_size')",
}


def _timed(code: str, cache: str) -> float:
    prog = ("import time\nt0 = time.perf_counter()\nimport numba_bfc\n" + code +
            "\nprint(time.perf_counter() - t0)")
    env = {**os.environ, "NUMBA_CACHE_DIR": cache}
    env.pop("NUMBA_BFC_CONF", None)
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True,
                         env=env, check=True)
    return float(out.stdout.split()[-1])


def start_section() -> list[str]:
    lines = ["Start-up, seconds from `import numba_bfc` to done, in a fresh process:", "",
             "| operation | empty Numba cache | warm cache |", "|---|---:|---:|"]
    for label, code in _FIRST.items():
        with tempfile.TemporaryDirectory() as cache:
            cold = _timed(code, cache)
            warm = min(_timed(code, cache) for _ in range(3))
        lines.append(f"| {label} | {cold:.2f} | {warm:.2f} |")
    lines.append("")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--peers", help="the peers' folder (with compare.py and built bin/)")
    ap.add_argument("--repeat", type=int, default=5, help="best of N replays (default 5)")
    ap.add_argument("--write", metavar="README", help="replace the marked section of this file")
    args = ap.parse_args(argv)
    cpu = platform.processor() or platform.machine()
    lines = [BEGIN, "",
             f"Generated by `python benchmarks/speed_report.py"
             f"{' --peers PEERS' if args.peers else ''} --write README.md` on "
             f"{time.strftime('%Y-%m-%d')}: {os.cpu_count()} cores ({cpu}), Python "
             f"{platform.python_version()}, one run, nothing else running. Every figure of a "
             "table comes from the same run.", ""]
    lines += replay_section(args.peers, args.repeat)
    if args.peers:
        lines += warm_section(args.peers, args.repeat)
    lines += oom_section()
    lines += pair_section()
    lines += start_section()
    lines.append(END)
    text = "\n".join(lines)
    if not args.write:
        print(text)
        return 0
    with open(args.write) as f:
        readme = f.read()
    if BEGIN not in readme or END not in readme:
        print(f"error: {args.write} has no {BEGIN} ... {END} section", file=sys.stderr)
        return 2
    head, rest = readme.split(BEGIN, 1)
    with open(args.write, "w") as f:
        f.write(head + text + rest.split(END, 1)[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
