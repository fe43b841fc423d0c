"""``numba-bfc plan FILE``: plan a CSV of usage records."""

from __future__ import annotations

import argparse
import json
import sys

from ..planning.bounds import lower_bound
from ..planning.io import read_records
from ..planning.strategies import STRATEGIES, assign_objects, assign_offsets
from .common import USER_ERRORS, byte_size, parse_args, positive, report_error


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="numba-bfc plan",
        description=(
            "Plan tensor memory from a CSV of usage records ('size,first,last', closed "
            "intervals, or MiniMalloc's 'id,lower,upper,size', half-open) and compare "
            "the plan with a lower bound."
        ),
    )
    p.add_argument("file", help="CSV file of usage records")
    p.add_argument("--strategy", "-s", default="greedy_by_size",
                   choices=(*STRATEGIES, "search"),
                   help="a TFLite strategy, or search (offsets: greedy starts + branch and bound)")
    p.add_argument("--nodes", type=positive(int), default=None,
                   help="search nodes for --strategy search (default: 2000000): the same plan "
                        "on every machine")
    p.add_argument("--time-limit", type=positive(float), default=None,
                   help="--strategy search: a cap in seconds (default: 60), not counting "
                        "compilation")
    p.add_argument("--capacity", type=byte_size(), default=None,
                   help="--strategy search: stop at the first plan within this many bytes "
                        "(e.g. 96, 64KiB)")
    p.add_argument(
        "--kind",
        "-k",
        default="offsets",
        choices=("objects", "offsets"),
        help="shared objects or offsets in one arena (default: offsets)",
    )
    p.add_argument(
        "--alignment",
        "-a",
        type=byte_size(power_of_two=True),
        default=1,
        help="gap alignment in bytes for greedy_by_size offsets, a power of two (default: 1)",
    )
    p.add_argument("--json", action="store_true", help="print JSON including the assignment")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the planner CLI; return the exit status (0 ok, 2 bad input)."""
    args = parse_args(_parser(), argv, sys.stdout, sys.stderr)
    if isinstance(args, int):
        return args
    try:
        if args.kind == "objects" and args.alignment != 1:
            raise ValueError("--alignment only applies to --kind offsets")
        if args.strategy == "search" and args.kind != "offsets":
            raise ValueError("--strategy search plans offsets (--kind offsets)")
        if args.strategy != "search" and (args.time_limit is not None or args.nodes is not None
                                          or args.capacity is not None):
            raise ValueError("--nodes, --time-limit and --capacity apply to --strategy search "
                             "only")
        records = read_records(args.file)
        bound = lower_bound(records, args.kind)
        if args.kind == "objects":
            plan = assign_objects(records, args.strategy)
            total = plan.total_size
            payload = {
                "object_ids": plan.object_ids.tolist(),
                "object_sizes": plan.object_sizes.tolist(),
            }
        else:
            plan = assign_offsets(records, args.strategy, args.alignment,
                                  time_limit=args.time_limit, capacity=args.capacity,
                                  node_limit=args.nodes)
            total = plan.total_size
            payload = {"offsets": plan.offsets.tolist()}
            if plan.search is not None:
                st = plan.search
                bound = max(bound, st.lower_bound)
                payload["search"] = {"optimal": st.optimal, "lower_bound": st.lower_bound,
                                     "greedy_size": st.greedy_size,
                                     "greedy_order": st.greedy_order, "nodes": st.nodes,
                                     "calls": st.calls, "seconds": st.seconds,
                                     "stopped": st.stopped,
                                     "compile_seconds": st.compile_seconds}
    except USER_ERRORS as exc:
        return report_error("plan", exc, sys.stderr)
    # An all-empty input has bound 0; report ratio 1.0 rather than dividing by 0.
    ratio = total / bound if bound else 1.0
    if args.json:
        out = {
            "file": args.file,
            "records": int(records.shape[0]),
            "strategy": args.strategy,
            "kind": args.kind,
            "alignment": args.alignment,
            "total_size": int(total),
            "lower_bound": int(bound),
            "ratio": ratio,
            **payload,
        }
        print(json.dumps(out))
    else:
        print(f"records:     {records.shape[0]}")
        print(f"strategy:    {args.strategy} ({args.kind})")
        print(f"total size:  {total}")
        print(f"lower bound: {bound}")
        print(f"ratio:       {ratio:.4f}")
        if "search" in payload:
            st = payload["search"]
            ended = {"nodes": "; stopped at the node limit (--nodes)",
                     "time": "; stopped at the time cap (--time-limit): this plan may differ "
                             "on another machine"}.get(st["stopped"], "")
            print(f"search:      {'proven optimal' if st['optimal'] else 'not proven optimal'};"
                  f" greedy start ({st['greedy_order']}) {st['greedy_size']}, {st['nodes']} nodes"
                  f" in {st['calls']} searches, {st['seconds']:.2f} s"
                  + (f" (and {st['compile_seconds']:.2f} s compiling first)"
                     if st["compile_seconds"] >= 0.01 else "") + ended)
    return 0


if __name__ == "__main__":
    sys.exit(main())
