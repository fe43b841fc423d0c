"""``numba-bfc replay``: replay traces through policies and compare them."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from ..traces import POLICIES, Trace, run_sweep_task, sweep_tasks
from ..traces.tables import format_min_limits, format_table
from .common import (
    USER_ERRORS,
    byte_size,
    check_plot_target,
    dask_client,
    load_trace,
    names_from,
    parse_args,
    parse_scheduler,
    progress_bar,
    report_dropped,
    report_error,
)

_PROGRESS_MIN_EVENTS = 1 << 21  # below this a replay takes well under a second


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="numba-bfc replay",
        description="Replay allocation traces through allocator policies: peak requested, "
                    "in-use and reserved bytes, backend calls, OOMs, speed.")
    p.add_argument("traces", nargs="*", metavar="FILE",
                   help="trace files (csv[.gz], RMM log, PyTorch snapshot .pickle, profiler "
                        ".json[.gz]), bundled:NAME or synthetic:NAME; default: the bundled traces")
    p.add_argument("--policy", "-p", default="bfc,caching",
                   help=f"comma-separated policies (default bfc,caching; known: "
                        f"{', '.join(POLICIES)})")
    p.add_argument("--limit", "-l", type=_limits,
                   help="memory limit, e.g. 16GiB or 512MiB, or several, comma-separated, "
                        "to replay at each (default: none)")
    p.add_argument("--min-limit", action="store_true",
                   help="bisect the smallest memory limit each policy runs each trace at with "
                        "no OOM; report it in bytes and as a multiple of peak live bytes")
    p.add_argument("--offline", action="store_true",
                   help="also plan the trace offline (greedy_by_size) and report the overhead")
    p.add_argument("--strict", action="store_true",
                   help="fail on bad events instead of dropping and counting them")
    p.add_argument("--json", action="store_true", help="print JSON (one object per replay)")
    p.add_argument("--plot", metavar="PNG", help="save a time-series plot (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="run every replay as a task on a Dask cluster: a scheduler address "
                        "(tcp://host:8786), or local[:N] for a LocalCluster of N worker "
                        "processes (default N: the CPU count); needs numba_bfc[dask]")
    return p


_at_least_a_byte = byte_size(
    below_minimum="--limit must be at least 1 byte (leave it out for no limit)")


def _limits(text: str) -> list[int]:
    """``--limit``: one byte count or several, comma-separated."""
    return [_at_least_a_byte(part.strip()) for part in text.split(",")]


def main(argv: list[str] | None = None, out: TextIO | None = None,
         err: TextIO | None = None) -> int:
    """Run the replay CLI; return the exit status (0 ok, 2 bad input)."""
    out = out or sys.stdout
    err = err or sys.stderr
    args = parse_args(_parser(), argv, out, err)
    if isinstance(args, int):
        return args
    try:
        policies = names_from(args.policy, POLICIES, "policy")
        if args.min_limit and args.limit is not None:
            raise ValueError("--min-limit finds the limit: give it or --limit, not both")
        check_plot_target(args.plot)
        scheduler = parse_scheduler(args.scheduler) if args.scheduler is not None else None
        specs = args.traces
        if not specs:
            from ..traces.data import bundled_names

            specs = [f"bundled:{n}" for n in bundled_names()]
        traces = [load_trace(s, args.strict) for s in specs]
        for trace in traces:
            if not args.min_limit:
                report_dropped(trace, err)
        tasks = sweep_tasks(traces, policies, args.limit or [None], min_limit=args.min_limit)
        options = {} if args.min_limit else {"offline": args.offline}
        if scheduler is not None:
            results = _run_on_dask(scheduler, traces, policies, args, options, err)
        else:
            results = []
            for task in tasks:
                trace = traces[task.trace]
                show = (not args.no_progress and not task.min_limit
                        and len(trace) >= _PROGRESS_MIN_EVENTS)
                progress = ({"progress": progress_bar(f"{trace.name}/{task.policy}", err)}
                            if show else {})
                results.append(run_sweep_task(trace, task, {**options, **progress}))
        if args.json:
            json.dump([r.to_dict() for r in results], out, indent=2)
            out.write("\n")
        elif args.min_limit:
            out.write(format_min_limits(results) + "\n")
        else:
            out.write(format_table(results) + "\n")
            compiling = sum(r.compile_seconds for r in results)
            if compiling >= 0.05:
                out.write(f"(before timing, {compiling:.2f} s went to compiling or loading "
                          "the kernels: not in Mevents/s)\n")
        if args.plot and not args.min_limit:
            from ..viz import plot_timeline

            fig = plot_timeline(results)
            fig.savefig(args.plot, dpi=120, bbox_inches="tight")
            err.write(f"wrote {args.plot}\n")
    except USER_ERRORS as e:
        return report_error("replay", e, err)
    return 0


def _run_on_dask(scheduler: tuple[str, int | None], traces: list[Trace], policies: list[str],
                 args: argparse.Namespace, options: dict, err: TextIO) -> list:
    """The sweep's tasks on the Dask cluster ``--scheduler`` names."""
    from ..dask import sweep as dask_sweep

    with dask_client(scheduler, args.scheduler) as client:
        return dask_sweep(client, traces, policies, args.limit or [None],
                          min_limit=args.min_limit,
                          progress=False if args.no_progress else err, **options)
