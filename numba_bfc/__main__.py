"""Command line: ``numba-bfc demo``, ``numba-bfc replay FILE...``, ``numba-bfc plan FILE``,
``numba-bfc tune FILE``."""

from __future__ import annotations

import argparse
import sys

from .cli.common import positive

_SUBCOMMANDS = {
    "plan": ("numba_bfc.cli.plan", "plan tensor offsets offline (see 'plan --help')"),
    "replay": ("numba_bfc.cli.replay", "replay traces through policies (see 'replay --help')"),
    "tune": ("numba_bfc.cli.tune", "recommend PyTorch allocator settings for a recorded run "
                                   "(see 'tune --help')"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _SUBCOMMANDS:
        import importlib

        return importlib.import_module(_SUBCOMMANDS[argv[0]][0]).main(argv[1:])
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="numba-bfc",
        description="GPU memory allocators on Numba: a demo, trace replay through the "
                    "allocator policies, and offline tensor planning.")
    parser.add_argument("--version", action="version", version=f"numba-bfc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="the main demo: GPU kernels on the pool when there is a "
                                       "GPU, bundled traces through both policies, a BFC workload")
    demo.add_argument("--ops", type=positive(int), default=20000,
                      help="operations of the random workload (>= 1)")
    demo.add_argument("--seed", type=int, default=0)
    for name, (_, help_text) in _SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run

        return run(num_ops=args.ops, seed=args.seed)
    return 2


if __name__ == "__main__":
    sys.exit(main())
