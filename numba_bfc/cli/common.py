"""What the ``numba-bfc`` commands share: argument types and the one-line error.

Every command reports bad input the same way: one line,
``numba-bfc <command>: error: <what>``, on stderr, and exit status 2 (as
argparse does for a bad flag).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from .._config import parse_size

if TYPE_CHECKING:  # the traces (and Numba) load only when a command reads one
    from ..traces import Trace

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


def load_trace_arg(spec: str, clean: bool = True) -> Trace:
    """A trace from a command-line argument: a file, ``bundled:NAME`` or
    ``synthetic:NAME`` (``numba_bfc.traces.synthetic.GENERATORS``)."""
    from ..traces import Trace

    kind, _, name = spec.partition(":")
    if kind == "bundled" and name:
        from ..traces.data import load_bundled

        return load_bundled(name)
    if kind == "synthetic" and name:
        from ..traces.synthetic import GENERATORS

        if name not in GENERATORS:
            raise ValueError(f"unknown synthetic workload {name!r} "
                             f"(expected one of {', '.join(GENERATORS)})")
        return GENERATORS[name]()
    return Trace.read(spec, clean=clean)


def load_trace(spec: str, strict: bool = False) -> Trace:
    """A trace argument for a command; errors name its flags (``--strict``)."""
    from ..errors import InputError
    from ..traces import TraceError

    try:
        trace = load_trace_arg(spec, clean=not strict)
    except TraceError as e:
        if e.hint:  # names a Python method: name the flag instead
            raise e.replace(hint="run without --strict to drop and count such events") from None
        raise
    if not len(trace) and trace.dropped:
        dropped = ", ".join(f"{k}: {v}" for k, v in sorted(trace.dropped.items()))
        raise InputError(f"none of its events can be replayed ({dropped}); --strict stops "
                         "at the first and names it", path=spec)
    return trace


def names_from(text: str, known, what: str) -> list[str]:
    """A comma-separated list of names, each one of ``known`` (``what``: their kind)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ValueError(f"unknown {what} {', '.join(unknown) or '(none)'} "
                         f"(expected some of {', '.join(known)})")
    return names


def check_plot_target(path: str | None) -> None:
    """``--plot PNG``: matplotlib is there and the folder exists, before any work."""
    if path and importlib.util.find_spec("matplotlib") is None:
        raise ValueError("--plot needs matplotlib: pip install 'numba_bfc[viz]'")
    if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise ValueError(f"--plot {path}: no such directory")


def report_dropped(trace: Trace, err: TextIO) -> None:
    """Say which events of ``trace`` were dropped as unreplayable, if any."""
    if trace.dropped:
        dropped = ", ".join(f"{k}: {v}" for k, v in sorted(trace.dropped.items()))
        err.write(f"{trace.name}: dropped events that cannot be replayed ({dropped})\n")


def progress_bar(label: str, stream: TextIO):
    """``progress(done, total)`` drawing a bar of ``label`` on ``stream``."""

    def report(done: int, total: int) -> None:
        width = 30
        filled = width * done // max(total, 1)
        stream.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        if done >= total:
            stream.write("\n")
        stream.flush()

    return report


def parse_scheduler(spec: str) -> tuple[str, int | None]:
    """``--scheduler``: ``("local", workers)`` or ``(address, None)``."""
    if importlib.util.find_spec("distributed") is None:
        raise ValueError("--scheduler needs distributed: pip install 'numba_bfc[dask]'")
    kind, colon, count = spec.partition(":")
    if kind == "local":
        if not colon:
            return "local", os.cpu_count() or 1
        if not count.isdigit() or not 1 <= int(count) <= 1024:
            raise ValueError(f"--scheduler {spec}: expected local or local:N with N "
                             "from 1 to 1024 worker processes")
        return "local", int(count)
    if not spec.strip():
        raise ValueError("--scheduler: give a scheduler address (tcp://host:8786) or local[:N]")
    return spec, None


@contextlib.contextmanager
def dask_client(scheduler: tuple[str, int | None], spec: str):
    """A ``distributed.Client`` on ``parse_scheduler``'s cluster (a ``LocalCluster``
    it starts and stops, or a running scheduler); ``spec`` names it in errors."""
    import distributed

    address, workers = scheduler
    with contextlib.ExitStack() as stack:
        if address == "local":
            cluster = stack.enter_context(distributed.LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True,
                dashboard_address=":0"))
            address = cluster.scheduler_address
        try:
            client = stack.enter_context(distributed.Client(address, timeout="10s"))
        except (OSError, TimeoutError) as e:
            raise ValueError(f"--scheduler {spec}: cannot reach the scheduler ({e})") from None
        yield client
