"""The ``search`` offsets strategy: greedy starts, then branch and bound.

``search_offsets`` keeps the best of several greedy best-fit orders, then asks
whether a plan fits in a smaller arena: first at the lower bound (on many
instances the optimum), then by bisection between the best proven-infeasible
size and the best plan found. Two decision kernels answer, one after the other
with budgets that grow: the section search (``_search.fits_memo``: memo, gap
rule; strong on cut and gadget instances) and, where it neither found a plan
nor proved there is none, the offset-order search
(``_offset_order.fits_in_offset_order``, MiniMalloc's method; strong where many
lifetimes interlock). The work is bounded in search nodes (``node_limit``), so
the answer does not depend on the machine, its load or the JIT cache;
``time_limit`` is an outer cap only, and compilation happens before the clock
starts. A plan is proven optimal when it meets the lower bound or when a
complete search exhausted the size just below it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from . import _kernels as K
from . import _offset_order as O
from . import _search as S

__all__ = ["DEFAULT_NODE_LIMIT", "DEFAULT_TIME_LIMIT", "SearchStats", "search_offsets",
           "window_lower_bound"]

_FIRST_BUDGET = 20_000  # nodes of the first call; budgets double while rounds make no progress
_FIRST_WORK = 20_000_000  # ... fewer on large instances: a node scans every section
_OFFSET_ORDER_FIRST = 20  # nodes per buffer of the first offset-order call (MiniMalloc: 2 steps)
_MAX_BUDGET = 1 << 40
_MAX_TOTAL = 1 << 62  # byte sums stay below this, so no int64 arithmetic can wrap
_WINDOW_NODES = 2_000  # nodes per exact search of one window (tight lower bound)
_BOUND_SHARE = 0.1  # of the node limit, for the tight lower bound
#: Search nodes ``search_offsets`` spends at most by default (4-15 s on the 2-core
#: development machine when all are spent; most instances end far sooner).
DEFAULT_NODE_LIMIT = 10_000_000
#: Seconds, an outer cap only: the node limit ends a search first on most machines.
DEFAULT_TIME_LIMIT = 60.0
#: Search nodes of the tight lower bound alone (``lower_bound(tight=True)``).
BOUND_NODE_LIMIT = 200_000
_MEMO_ENTRIES = 1 << 20  # per memo table (two uint64 arrays, zeroed pages only once used)


@dataclass(frozen=True)
class SearchStats:
    """How a ``search`` plan was found.

    Attributes
    ----------
    optimal : bool
        Proven optimal: it meets ``lower_bound``, or no plan one byte smaller exists.
    lower_bound : int
        The best proven lower bound: max-live bytes, raised by exact searches on
        windows of the instance (``window_lower_bound``, when the first round
        does not solve it) and by exhausted searches.
    greedy_size : int
        The best greedy start's arena size, and ``greedy_order`` its order.
    nodes : int
        Search nodes spent in all calls, of both kernels (the offset-order
        kernel counts work: a step, plus one per 32 buffers, sections and
        overlaps it looks at).
    calls : int
        Decision searches run (each: "does a plan fit in C bytes?").
    seconds : float
        Time spent searching; ``improvements`` lists ``(seconds, arena size)``
        at each better plan, the greedy start first.
    stopped : str
        Why the search ended: ``"optimal"``, ``"capacity"`` (the capacity
        question answered: a plan within it, or none),
        ``"nodes"`` (the node limit: the same answer on any machine) or
        ``"time"`` (the outer time cap: then the answer may depend on the
        machine).
    compile_seconds : float
        Time spent compiling (or loading) the kernels before the search
        started: 0.0 but on the first search of a process.
    """

    optimal: bool
    lower_bound: int
    greedy_size: int
    greedy_order: str
    nodes: int
    calls: int
    seconds: float
    improvements: list = field(default_factory=list)
    stopped: str = "optimal"
    compile_seconds: float = 0.0


class _Pace:
    """Node budgets cut to the time left, at each kernel's measured rate: the time
    cap then ends a search near it, not one long call later. Only when the cap
    binds does this make a result depend on the machine (``stopped == "time"``)."""

    def __init__(self, t0: float, time_limit: float):
        self.deadline = t0 + time_limit
        self.done: dict[str, list] = {}

    def budget(self, kernel: str, nodes: int) -> int:
        done, seconds = self.done.get(kernel, (0, 0.0))
        if seconds < 0.05:  # no rate measured yet
            return nodes
        left = self.deadline - time.perf_counter()
        return max(1, min(nodes, int(done / seconds * left)))

    def spent(self, kernel: str, nodes: int, started: float) -> None:
        entry = self.done.setdefault(kernel, [0, 0.0])
        entry[0] += nodes
        entry[1] += time.perf_counter() - started


def _greedy_starts(sizes, firsts, lasts, deadline):
    """Best-fit gap placements in several orders, TFLite's first, until ``deadline``:
    ``{name: (offsets, total)}``."""
    span = lasts - firsts + 1
    index = np.arange(sizes.shape[0])
    orders = {
        "size": np.lexsort((index, -span, -sizes)),  # TFLite's greedy_by_size, ties by lifetime
        "lifetime": np.lexsort((index, -sizes, -span)),
        "area": np.lexsort((index, -sizes, -(sizes * span))),
        "first": np.lexsort((index, -sizes, firsts)),
    }
    out = {"tflite": K.greedy_by_size_offsets(sizes, firsts, lasts, 1)}
    for name, order in orders.items():
        if time.perf_counter() >= deadline:
            break
        out[name] = K.best_fit_offsets(sizes, firsts, lasts, 1, order.astype(np.int64),
                                       np.argsort(firsts, kind="stable"))
    return out


def _twins(sizes, a, b):
    """``twin[i]``: the previous buffer with the same size and span, or -1."""
    n = sizes.shape[0]
    twin = np.full(n, -1, dtype=np.int64)
    order = np.lexsort((np.arange(n), b, a, sizes))
    for k in range(1, n):
        i, j = order[k], order[k - 1]
        if sizes[i] == sizes[j] and a[i] == a[j] and b[i] == b[j]:
            twin[i] = j
    return twin


def _check_total(sizes) -> None:
    if sizes.shape[0] and int(sizes.sum()) >= _MAX_TOTAL:
        raise ValueError(f"record sizes add up to {int(sizes.sum())} bytes; the planner needs "
                         f"less than 2**62")


def resolve_budget(time_limit: float | None, node_limit: int | None,
                   default_nodes: int = DEFAULT_NODE_LIMIT) -> tuple[float, int]:
    """``(time_limit, node_limit)`` with the defaults filled in, or a
    ``ValueError`` naming the one that is not a positive number."""
    time_limit = DEFAULT_TIME_LIMIT if time_limit is None else time_limit
    node_limit = default_nodes if node_limit is None else node_limit
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) \
            or not time_limit > 0:
        raise ValueError(f"time_limit must be a positive number of seconds, got {time_limit!r}")
    if isinstance(node_limit, bool) or not isinstance(node_limit, (int, np.integer)) \
            or node_limit < 1:
        raise ValueError(f"node_limit must be a positive int, got {node_limit!r}")
    return float(time_limit), int(node_limit)


_compiled = threading.Event()


def compile_kernels() -> float:
    """Compile (or load from Numba's cache) every kernel the search runs, on
    a small instance, once per process: so that a time limit counts search
    time only. Returns the seconds it took (0.0 once done)."""
    if _compiled.is_set():
        return 0.0
    from .instances import GADGET

    t0 = time.perf_counter()
    sizes, firsts, lasts = np.array(GADGET, dtype=np.int64).T.copy()
    _search_offsets(sizes, firsts, lasts, 60.0, None, None, 10_000)  # max-live 5 fails, 6 fits
    _, a, b = S.sections(firsts, lasts)
    O.fits_in_offset_order(sizes, lasts - firsts + 1, a, b, int(b.max()), 0, 6, 100,
                           np.zeros(sizes.shape[0], dtype=np.int64), O.ALL_RULES)
    _window_lower_bound(sizes, firsts, lasts, 60.0, _WINDOW_NODES, None, 10_000)
    _compiled.set()
    return time.perf_counter() - t0


def window_lower_bound(sizes, firsts, lasts, time_limit: float = DEFAULT_TIME_LIMIT,
                       per_window: int = _WINDOW_NODES, lower: int | None = None,
                       node_limit: int = BOUND_NODE_LIMIT) -> int:
    """A lower bound on the arena size of every plan, at least max-live.

    Exact searches (``_search.window_bound``) on the buffers of windows of
    consecutive time sections, 2, 3, 4, 6, 9, ... sections wide and at last
    all of them, each search at most ``per_window`` nodes, until
    ``node_limit`` nodes are spent (or, an outer cap, ``time_limit`` seconds,
    compilation first and not counted): a window in which no plan fits in C
    bytes proves that no plan of the whole does. Zero-size records are left out.
    """
    compile_kernels()
    return _window_lower_bound(sizes, firsts, lasts, time_limit, per_window, lower, node_limit)


def _window_lower_bound(sizes, firsts, lasts, time_limit, per_window, lower,
                        node_limit) -> int:
    keep = sizes > 0
    sizes, firsts, lasts = sizes[keep], firsts[keep], lasts[keep]
    _check_total(sizes)
    live = int(K.max_live_bytes(sizes, firsts, lasts))
    lower = live if lower is None else max(live, int(lower))
    if sizes.shape[0] < 2:
        return lower
    t0 = time.perf_counter()
    _, a, b = S.sections(firsts, lasts)
    num_sections = int(b.max())
    widths, w = [], 2
    while w < num_sections:
        widths.append(w)
        w += max(1, w // 2)
    widths.append(num_sections)
    spent = 0
    for width in widths:
        start = 0
        while start < num_sections:
            if spent >= node_limit or time.perf_counter() - t0 >= time_limit:
                return lower
            call_budget = min(20 * per_window, node_limit - spent)
            lower, used, start = S.window_bound(sizes, a, b, lower, width, per_window,
                                                call_budget, start)
            spent += int(used)
            lower = int(lower)
    return lower


def search_offsets(sizes, firsts, lasts, time_limit: float = DEFAULT_TIME_LIMIT,
                   capacity: int | None = None, lower: int | None = None,
                   node_limit: int = DEFAULT_NODE_LIMIT):
    """Offsets for 1-D records by greedy starts and branch and bound.

    Returns ``(offsets, total_size, SearchStats)``. With ``capacity``, stops
    at the first plan within it (and searches only at that size); a capacity
    below the lower bound returns the best greedy start at once. Zero-size
    records get offset 0 and take no part in the search.

    The search expands at most ``node_limit`` nodes (a tenth of them on the
    tight lower bound), so the result is the same on every machine and run;
    ``time_limit`` seconds is an outer cap (``SearchStats.stopped`` says which
    ended it). The kernels are compiled before the clock starts
    (``SearchStats.compile_seconds``).
    """
    _check_total(sizes)
    compiling = compile_kernels()
    offsets, total, stats = _search_offsets(sizes, firsts, lasts, time_limit, capacity, lower,
                                            node_limit)
    return offsets, total, dataclasses.replace(stats, compile_seconds=compiling)


def _search_offsets(sizes, firsts, lasts, time_limit, capacity, lower, node_limit):
    keep = np.flatnonzero(sizes > 0)
    if keep.shape[0] < sizes.shape[0]:
        offsets = np.zeros(sizes.shape[0], dtype=np.int64)
        sub, total, stats = _search_offsets(sizes[keep], firsts[keep], lasts[keep], time_limit,
                                            capacity, lower, node_limit)
        offsets[keep] = sub
        return offsets, total, stats
    t0 = time.perf_counter()
    n = sizes.shape[0]
    lb = int(K.max_live_bytes(sizes, firsts, lasts)) if lower is None else int(lower)
    if n == 0:
        return np.zeros(0, np.int64), 0, SearchStats(True, 0, 0, "none", 0, 0, 0.0, [(0.0, 0)])
    starts = _greedy_starts(sizes, firsts, lasts, t0 + time_limit)
    greedy_order = min(starts, key=lambda k: (int(starts[k][1]), k != "tflite"))
    best_off, best = starts[greedy_order][0], int(starts[greedy_order][1])
    greedy = best
    improvements = [(time.perf_counter() - t0, best)]
    proven = lb  # no plan is smaller than this
    nodes = calls = 0
    _, a, b = S.sections(firsts, lasts)
    num_sections = int(b.max()) if n else 0
    span = b - a
    index = np.arange(n)
    # Branching orders, one per round in turn: a dive that goes wrong early in one
    # order is often straight in another (restarts with growing budgets).
    branch_orders = [np.lexsort(keys).astype(np.int64) for keys in (
        (index, -span, -sizes), (index, -sizes, -span), (index, -sizes, -(sizes * span)),
        (index, -sizes, a))]
    twin = _twins(sizes, a, b)
    width = lasts - firsts + 1
    offsets = np.zeros(n, dtype=np.int64)
    budget = max(1000, min(_FIRST_BUDGET, _FIRST_WORK // max(num_sections, 1)))
    pace = _Pace(t0, time_limit)
    # The offset-order search (MiniMalloc's method) runs wherever the section search
    # neither found a plan nor proved there is none, each size trying the rank
    # orders in turn (all three in the first round), its own budget doubled after
    # each round that used it up (restarts, as MiniMalloc's).
    offset_budget = min(budget, _OFFSET_ORDER_FIRST * n)
    offset_turns = {}
    bound_nodes = min(int(_BOUND_SHARE * node_limit), BOUND_NODE_LIMIT)
    stopped = "optimal" if capacity is None else "capacity"  # unless a limit ends it first
    exhausted_budget = False
    rounds = 0
    memos = {}
    while best > proven and (capacity is None or best > capacity >= proven):
        # Each round: the smallest unproven size (often the optimum, and where pruning
        # is strongest), then the middle of the gap. Rounds alternate a limited
        # discrepancy search (0, 1, 2, ... departures from the first choice: finds plans
        # whose first steps the heuristic got wrong) with a complete one (proofs),
        # branching in a different order each round, with growing budgets.
        limit = rounds // 2 if rounds % 2 == 0 else -1
        branch_order = branch_orders[rounds % len(branch_orders)]
        sizes_to_try = [proven] if capacity is None else [min(int(capacity), best - 1)]
        if capacity is None and best - 1 > proven:
            sizes_to_try.append((proven + best) // 2)
        progress = offset_exhausted = False
        for size in sizes_to_try:
            if size >= best or size < proven or nodes >= node_limit \
                    or time.perf_counter() - t0 >= time_limit:
                continue
            call_budget = pace.budget("section", min(budget, node_limit - nodes))
            if size not in memos:  # one memo per size, shared by its calls; two kept
                if len(memos) >= 2:
                    del memos[next(k for k in memos if k != proven)]
                memos[size] = S.memo_table(_MEMO_ENTRIES)
            started = time.perf_counter()
            status, used = S.fits_memo(sizes, a, b, num_sections, branch_order, twin, size,
                                       call_budget, offsets, limit, S.ALL_RULES, *memos[size])
            pace.spent("section", int(used), started)
            exhausted_budget = status == S.BUDGET and used >= call_budget
            nodes += int(used)
            calls += 1
            complete = limit < 0
            # The first round tries every rank order (MiniMalloc's first cycle), later
            # rounds one each.
            for _ in range(len(O.ORDERS) if rounds == 0 else 1):
                if status == S.FOUND or (status == S.INFEASIBLE and complete) \
                        or nodes >= node_limit:
                    break
                started = time.perf_counter()
                turn = offset_turns.get(size, 0)  # each size tries the rank orders in turn
                offset_turns[size] = turn + 1
                status, used = O.fits_in_offset_order(
                    sizes, width, a, b, num_sections, turn % len(O.ORDERS), size,
                    pace.budget("offset", min(offset_budget, node_limit - nodes)), offsets,
                    O.ALL_RULES)
                offset_exhausted = offset_exhausted or status == S.BUDGET
                pace.spent("offset", int(used), started)
                nodes += int(used)
                calls += 1
                complete = True
            if status == S.FOUND:
                best_off, best = offsets.copy(), int((offsets + sizes).max())
                improvements.append((time.perf_counter() - t0, best))
                progress = True
            elif status == S.INFEASIBLE and complete:
                proven = max(proven, size + 1)
                progress = True
        if capacity is not None and (best <= capacity or (progress and best > capacity)):
            break
        if nodes >= node_limit:
            stopped = "nodes"
            break
        if time.perf_counter() - t0 >= time_limit:
            stopped = "time"
            break
        if rounds == 0 and best > proven and capacity is None:
            # Not solved at once: is the optimum above max-live? Exact searches on
            # windows of the instance may prove so (a share of the nodes).
            left = time_limit - (time.perf_counter() - t0)
            tight = _window_lower_bound(sizes, firsts, lasts, left, _WINDOW_NODES, proven,
                                        bound_nodes)
            proven = max(proven, min(tight, best))
        rounds += 1
        if not progress and limit < 0 and exhausted_budget:
            budget = min(2 * budget, _MAX_BUDGET)
        if offset_exhausted:
            offset_budget = min(2 * offset_budget, _MAX_BUDGET)
    seconds = time.perf_counter() - t0
    stats = SearchStats(optimal=best <= proven, lower_bound=min(proven, best),
                        greedy_size=greedy, greedy_order=greedy_order, nodes=nodes,
                        calls=calls, seconds=seconds, improvements=improvements,
                        stopped="optimal" if best <= proven else stopped)
    return best_off, best, stats
