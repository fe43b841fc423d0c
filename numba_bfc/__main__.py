"""Command line: ``python -m numba_bfc demo`` and ``python -m numba_bfc plan FILE``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "plan":
        from .planning.cli import main as plan_main

        return plan_main(argv[1:])
    parser = argparse.ArgumentParser(prog="numba-bfc", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the BFC allocator on a random workload")
    demo.add_argument("--ops", type=int, default=20000, help="number of operations")
    demo.add_argument("--seed", type=int, default=0)
    sub.add_parser("plan", help="plan tensor offsets offline (see 'plan --help')")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run

        return run(num_ops=args.ops, seed=args.seed)
    return 2


if __name__ == "__main__":
    sys.exit(main())
