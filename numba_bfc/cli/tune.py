"""``numba-bfc tune``: recommend PyTorch allocator settings for a recorded run."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import TextIO

from .common import (
    USER_ERRORS,
    byte_size,
    check_plot_target,
    dask_client,
    load_trace,
    names_from,
    parse_args,
    parse_scheduler,
    positive,
    progress_bar,
    report_dropped,
    report_error,
)


def _parser() -> argparse.ArgumentParser:
    from ..tune import KNOBS

    p = argparse.ArgumentParser(
        prog="numba-bfc tune",
        description="Replay a recorded run through PyTorch's caching allocator under settings "
                    "of its knobs and recommend the PYTORCH_CUDA_ALLOC_CONF that needs the "
                    "least memory, beside TF's BFC, numba_bfc's compact policy and the "
                    "offline bounds.")
    p.add_argument("trace", metavar="FILE",
                   help="a PyTorch snapshot (.pickle), profiler trace (.json[.gz]), RMM log, "
                        "CSV trace, bundled:NAME or synthetic:NAME")
    p.add_argument("--limit", "-l",
                   type=byte_size(below_minimum="--limit must be at least 1 byte"),
                   help="the memory the run must fit in (e.g. 40GiB): settings with fewer "
                        "OOMs there rank first")
    p.add_argument("--knobs", default=",".join(KNOBS),
                   help=f"comma-separated knobs to search (default: all of {', '.join(KNOBS)})")
    p.add_argument("--rounds", type=positive(int), default=3,
                   help="rounds of the search at most (default 3)")
    p.add_argument("--strict", action="store_true",
                   help="fail on bad events instead of dropping and counting them")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--plot", metavar="PNG", help="save a plot (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="replay the candidates as Dask tasks: a scheduler address or local[:N] "
                        "(needs numba_bfc[dask])")
    return p


def main(argv: list[str] | None = None, out: TextIO | None = None,
         err: TextIO | None = None) -> int:
    """Run the tune CLI; return the exit status (0 ok, 2 bad input)."""
    out = out or sys.stdout
    err = err or sys.stderr
    args = parse_args(_parser(), argv, out, err)
    if isinstance(args, int):
        return args
    try:
        from ..tune import KNOBS, tune

        knobs = names_from(args.knobs, KNOBS, "knob")
        check_plot_target(args.plot)
        scheduler = parse_scheduler(args.scheduler) if args.scheduler is not None else None
        trace = load_trace(args.trace, args.strict)
        report_dropped(trace, err)
        progress = None if args.no_progress else progress_bar(f"tune {trace.name}", err)
        with contextlib.ExitStack() as stack:
            client = (stack.enter_context(dask_client(scheduler, args.scheduler))
                      if scheduler is not None else None)
            result = tune(trace, limit=args.limit, knobs=knobs, max_rounds=args.rounds,
                          client=client, progress=progress)
        if args.json:
            json.dump(result.to_dict(), out, indent=2)
            out.write("\n")
        else:
            out.write(result.format() + "\n")
        if args.plot:
            from ..viz import plot_tune

            fig = plot_tune(result, trace)
            fig.savefig(args.plot, dpi=120, bbox_inches="tight")
            err.write(f"wrote {args.plot}\n")
    except USER_ERRORS as e:
        return report_error("tune", e, err)
    return 0
