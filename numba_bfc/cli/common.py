"""What the ``numba-bfc`` commands share: argument types and the one-line error.

Every command reports bad input the same way: one line,
``numba-bfc <command>: error: <what>``, on stderr, and exit status 2 (as
argparse does for a bad flag).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from typing import TextIO

from .._config import parse_size

#: Errors that mean "bad input" (``InputError`` and ``TraceError`` are
#: ``ValueError`` subclasses; ``OSError``: a file that cannot be opened).
USER_ERRORS = (OSError, ValueError, TypeError)
#: The largest byte count a limit, capacity or alignment may be: sizes past
#: it would overflow the int64 arithmetic of the kernels.
MAX_BYTES = (1 << 62) - 1


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None, out: TextIO,
               err: TextIO) -> argparse.Namespace | int:
    """``parser``'s arguments, or the exit status when argparse ended (``--help``
    printed on ``out``, a usage error on ``err``)."""
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def report_error(command: str, error: BaseException | str, stream: TextIO) -> int:
    """Write ``numba-bfc <command>: error: <error>`` and return exit status 2."""
    stream.write(f"numba-bfc {command}: error: {error}\n")
    return 2


def byte_size(*, minimum: int = 1, power_of_two: bool = False,
              below_minimum: str = "") -> Callable[[str], int]:
    """An argparse type: a byte count with an optional binary unit (``512MiB``),
    from ``minimum`` to ``MAX_BYTES``; ``below_minimum`` is said when smaller."""

    def parse(text: str) -> int:
        try:
            value = parse_size(text, name="size")
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a byte count (bytes, or KiB/MiB/GiB/TiB)") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(
                below_minimum or f"{text} is below the smallest allowed, {minimum}")
        if value > MAX_BYTES:
            raise argparse.ArgumentTypeError(f"{text} is above the largest allowed, 2**62 - 1 "
                                             "bytes")
        if power_of_two and value & (value - 1):
            raise argparse.ArgumentTypeError(f"{text} is not a power of two")
        return value

    return parse


def positive(kind: type) -> Callable[[str], int | float]:
    """An argparse type: a finite ``kind`` (``int`` or ``float``) above 0."""
    what = "an integer" if kind is int else "a number"

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"{text} is not {what} above 0")
        return value

    return parse
