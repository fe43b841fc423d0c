"""The ``search`` offsets strategy: valid plans, never worse than greedy, the known
optimum of cut instances, proofs checked by brute force, budgets and the CLI."""

import itertools
import json
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numba_bfc.cli.plan import main as plan_main
from numba_bfc.planning import assign_offsets, lower_bound, validate
from numba_bfc.planning.instances import GADGET, cut_instance, gadget_instance, sliced_instance


@pytest.fixture(autouse=True, scope="module")
def _compiled():
    """Compile (or load) the search kernels first: a cold Numba cache's compile time
    counts against a call's time limit."""
    from numba_bfc.planning import _search as S

    one = np.ones(1, dtype=np.int64)
    S.fits(one, 0 * one, one, 1, 0 * one, -one, 1, 10, 0 * one, -1)
    recs, _ = cut_instance(40, capacity=1 << 10, horizon=50, seed=9)
    assign_offsets(recs, "search", time_limit=120.0)


records = st.lists(st.tuples(st.integers(1, 64), st.integers(0, 12), st.integers(0, 6)),
                   min_size=0, max_size=40).map(
    lambda rs: [(s, f, f + d) for s, f, d in rs])


@settings(max_examples=60, deadline=None)
@given(recs=records)
def test_valid_and_never_worse_than_greedy(recs):
    plan = assign_offsets(recs, "search", time_limit=2.0)
    validate(recs, plan)
    assert plan.total_size <= assign_offsets(recs, "greedy_by_size").total_size
    st_ = plan.search
    assert st_.lower_bound <= plan.total_size and st_.lower_bound >= lower_bound(recs)
    # A proof above max-live needs an exhausted search.
    if st_.optimal and plan.total_size > lower_bound(recs):
        assert st_.calls >= 1 and st_.nodes > 0


def _fits_brute(recs, capacity):
    """Whether some integer placement fits in ``capacity`` (tiny instances only)."""
    sizes = [size for size, _, _ in recs]
    if max(sizes) > capacity:
        return False
    for offs in itertools.product(*(range(capacity - size + 1) for size in sizes)):
        if all(not (recs[i][1] <= recs[j][2] and recs[j][1] <= recs[i][2])
               or offs[i] + sizes[i] <= offs[j] or offs[j] + sizes[j] <= offs[i]
               for i in range(len(recs)) for j in range(i)):
            return True
    return False


def _brute_force_optimum(recs):
    capacity = lower_bound(recs)
    while not _fits_brute(recs, capacity):
        capacity += 1
    return capacity


@settings(max_examples=40, deadline=None)
@given(recs=st.lists(st.tuples(st.integers(1, 3), st.integers(0, 3), st.integers(0, 2)),
                     min_size=1, max_size=4).map(lambda rs: [(s, f, f + d) for s, f, d in rs]))
def test_proven_optimum_matches_brute_force(recs):
    plan = assign_offsets(recs, "search", time_limit=5.0)
    assert plan.search.optimal  # tiny: the search is always exhausted in time
    assert plan.total_size == _brute_force_optimum(recs)


def test_search_proves_an_optimum_above_max_live():
    # Max-live is 5, but no placement fits in 5 bytes (checked by brute force): only an
    # exhausted search can prove the plan of 6 optimal.
    recs = [(3, 5, 7), (2, 6, 8), (1, 2, 4), (1, 4, 5), (2, 1, 1), (3, 0, 3), (1, 2, 5)]
    assert lower_bound(recs) == 5 and not _fits_brute(recs, 5) and _fits_brute(recs, 6)
    plan = assign_offsets(recs, "search", time_limit=5.0)
    validate(recs, plan)
    assert plan.total_size == 6 and plan.search.optimal and plan.search.lower_bound == 6
    assert plan.search.calls >= 1 and plan.search.nodes > 0


@pytest.mark.parametrize("n,time_cuts,seed", [(60, 0.5, 0), (120, 0.25, 1), (150, 0.75, 2),
                                              (200, 0.5, 1)])
def test_cut_instances_reach_their_known_optimum(n, time_cuts, seed):
    recs, offsets = cut_instance(n, capacity=1 << 16, horizon=400, time_cuts=time_cuts,
                                 seed=seed)
    assert lower_bound(recs) == 1 << 16  # the cut tiles the rectangle
    greedy = assign_offsets(recs, "greedy_by_size").total_size
    plan = assign_offsets(recs, "search", time_limit=20.0)
    validate(recs, plan)
    assert plan.total_size == 1 << 16 and plan.search.optimal
    assert plan.search.greedy_size <= greedy
    assert plan.search.improvements[-1][1] == 1 << 16


def test_capacity_stops_at_the_first_plan_within_it():
    recs, _ = cut_instance(120, capacity=1 << 16, horizon=300, seed=3)
    greedy = assign_offsets(recs, "search", time_limit=0.01).search.greedy_size
    target = (greedy + (1 << 16)) // 2
    plan = assign_offsets(recs, "search", time_limit=10.0, capacity=target)
    assert plan.total_size <= target
    validate(recs, plan)
    # Below the lower bound nothing can be found: the greedy start comes back at once.
    low = assign_offsets(recs, "search", time_limit=10.0, capacity=1000)
    assert low.total_size == low.search.greedy_size and low.search.calls == 0


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="time_limit"):
        assign_offsets([(1, 0, 0)], "search", time_limit=0)
    with pytest.raises(ValueError, match="capacity"):
        assign_offsets([(1, 0, 0)], "search", capacity=-1)
    empty = assign_offsets([], "search")
    assert empty.total_size == 0 and empty.search.optimal


def test_cut_instance_is_a_valid_optimal_tiling():
    recs, offsets = cut_instance(80, capacity=1000, horizon=50, time_cuts=0.3, seed=5)
    from numba_bfc.planning import OffsetsAssignment

    validate(recs, OffsetsAssignment(offsets, 1000))
    assert int((recs["size"] * (recs["last"] - recs["first"] + 1)).sum()) == 1000 * 50
    with pytest.raises(ValueError, match="time_cuts"):
        cut_instance(10, time_cuts=2.0)


def test_cli_plan_search(tmp_path, capsys):
    recs, _ = cut_instance(60, capacity=4096, horizon=100, seed=4)
    path = tmp_path / "r.csv"
    path.write_text("size,first,last\n" + "".join(f"{s},{f},{la}\n" for s, f, la in recs))
    assert plan_main([str(path), "--strategy", "search", "--time-limit", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["total_size"] == 4096 and out["search"]["optimal"] is True
    assert out["ratio"] == 1.0
    assert plan_main([str(path), "-s", "search", "-k", "objects"]) == 2
    assert "offsets" in capsys.readouterr().err


@settings(max_examples=40, deadline=None)
@given(recs=records.filter(lambda r: len(r) > 0), d=st.integers(0, 3))
def test_limited_discrepancy_finds_only_valid_plans(recs, d):
    from numba_bfc.planning import OffsetsAssignment, as_records
    from numba_bfc.planning import _search as S
    from numba_bfc.planning.search import _twins

    r = as_records(recs)
    sizes, firsts, lasts = (np.ascontiguousarray(r[k]) for k in ("size", "first", "last"))
    _, a, b = S.sections(firsts, lasts)
    order = np.lexsort((np.arange(len(r)), -(b - a), -sizes)).astype(np.int64)
    cap = lower_bound(recs)
    results = {}
    for limit in (d, 1 << 40, -1):
        off = np.zeros(len(r), dtype=np.int64)
        status, _ = S.fits(sizes, a, b, int(b.max()), order, _twins(sizes, a, b), cap,
                           10**7, off, limit)
        results[limit] = status
        if status == S.FOUND:
            validate(recs, OffsetsAssignment(off, cap))
    # Enough discrepancies walk the whole tree: the same answer as the complete search.
    assert results[1 << 40] == results[-1]
    # Fewer may miss a plan, never invent one.
    assert results[d] != S.FOUND or results[-1] == S.FOUND


# ---------------------------------------------------------------------- review regressions
ABOVE_MAX_LIVE = [(3, 5, 7), (2, 6, 8), (1, 2, 4), (1, 4, 5), (2, 1, 1), (3, 0, 3), (1, 2, 5)]


@pytest.mark.parametrize("extra", [[(0, 3, 4)], [(0, 0, 8)], [(0, 3, 4), (0, 0, 0)]])
def test_zero_size_records_take_no_part(extra):
    recs = ABOVE_MAX_LIVE + extra
    plan = assign_offsets(recs, "search", time_limit=5.0)
    validate(recs, plan)
    assert plan.total_size == 6 and plan.search.optimal
    assert plan.offsets[len(ABOVE_MAX_LIVE):].tolist() == [0] * len(extra)
    capped = assign_offsets(recs, "search", time_limit=5.0, capacity=5)
    assert capped.total_size == 6  # proven impossible within 5: the best plan comes back


def test_sizes_that_could_overflow_are_refused():
    with pytest.raises(ValueError, match="2\\*\\*62"):
        assign_offsets([(1 << 61, 0, 1), (1 << 61, 1, 2)], "search")


def test_cli_rejects_search_flags_for_other_strategies(tmp_path, capsys):
    path = tmp_path / "r.csv"
    path.write_text("size,first,last\n8,0,1\n8,1,2\n")
    assert plan_main([str(path), "--time-limit", "2"]) == 2
    assert "search only" in capsys.readouterr().err


# ---------------------------------------------------------------- tight bound, dominance
def _columns(recs):
    from numba_bfc.planning import as_records

    r = as_records(recs)
    return tuple(np.ascontiguousarray(r[k]) for k in ("size", "first", "last"))


def _fits_exact(recs, capacity, rules, order_key=0, memo=None, limit=-1):
    """``_search.fits`` (or ``fits_memo`` with ``memo``) on ``recs``: (status, nodes, offsets)."""
    from numba_bfc.planning import _search as S
    from numba_bfc.planning.search import _twins

    sizes, firsts, lasts = _columns(recs)
    _, a, b = S.sections(firsts, lasts)
    keys = [(np.arange(len(sizes)), -(b - a), -sizes), (np.arange(len(sizes)), -sizes, a)]
    order = np.lexsort(keys[order_key]).astype(np.int64)
    off = np.zeros(len(sizes), dtype=np.int64)
    args = (sizes, a, b, int(b.max()), order, _twins(sizes, a, b), capacity, 10**7, off, limit,
            rules)
    status, nodes = S.fits(*args) if memo is None else S.fits_memo(*args, *memo)
    return int(status), int(nodes), off


def _exact_optimum(recs):
    """The optimum by the complete search with neither new rule (the search the brute-force
    tests check), one capacity at a time."""
    from numba_bfc.planning import _search as S

    capacity = lower_bound(recs)
    while True:
        status, _, _ = _fits_exact(recs, capacity, 0)
        assert status != S.BUDGET
        if status == S.FOUND:
            return capacity
        capacity += 1


# Random buffers, some with a scaled, shifted copy of GADGET (optimum above max-live) among them.
_gadgety = st.tuples(
    st.lists(st.tuples(st.integers(1, 12), st.integers(0, 14), st.integers(0, 5)), max_size=9),
    st.booleans(), st.integers(1, 3), st.integers(0, 6)).map(
    lambda t: [(s, f, f + d) for s, f, d in t[0]]
    + ([(s * t[2], f + t[3], la + t[3]) for s, f, la in GADGET] if t[1] else []))


@settings(max_examples=60, deadline=None)
@given(recs=st.lists(st.tuples(st.integers(1, 3), st.integers(0, 3), st.integers(0, 2)),
                     min_size=1, max_size=4).map(lambda rs: [(s, f, f + d) for s, f, d in rs]))
def test_tight_bound_never_exceeds_brute_force(recs):
    tight = lower_bound(recs, tight=True, time_limit=5.0)
    assert lower_bound(recs) <= tight <= _brute_force_optimum(recs)


@settings(max_examples=60, deadline=None)
@given(recs=_gadgety.filter(lambda r: len(r) > 1))
def test_tight_bound_never_exceeds_the_optimum(recs):
    tight = lower_bound(recs, tight=True, time_limit=5.0)
    assert lower_bound(recs) <= tight <= _exact_optimum(recs)


def test_tight_bound_above_max_live():
    assert _fits_brute(list(GADGET), 6) and not _fits_brute(list(GADGET), 5)
    assert lower_bound(list(GADGET)) == 5 and lower_bound(list(GADGET), tight=True) == 6
    # Inside a cut instance: only a window around each gadget shows it (the whole is
    # far too big to search through).
    capacity, scale = 1 << 16, 1 << 10
    recs, offsets = gadget_instance(300, capacity, horizon=400, gadgets=3, scale=scale, seed=2)
    from numba_bfc.planning import OffsetsAssignment

    validate(recs, OffsetsAssignment(offsets, capacity + 6 * scale))  # the plan built with it
    assert lower_bound(recs) == capacity + 5 * scale
    assert lower_bound(recs, tight=True, time_limit=60.0) == capacity + 6 * scale
    with pytest.raises(ValueError, match="tight"):
        lower_bound(recs, "objects", tight=True)
    with pytest.raises(ValueError, match="time_limit"):
        lower_bound(recs, tight=True, time_limit=0)


def test_search_proves_a_gadget_instance_optimal_by_the_tight_bound():
    capacity, scale = 1 << 16, 1 << 10
    recs, _ = gadget_instance(60, capacity, horizon=100, gadgets=2, scale=scale, seed=1)
    plan = assign_offsets(recs, "search", time_limit=20.0)
    validate(recs, plan)
    assert plan.total_size == capacity + 6 * scale and plan.search.optimal
    assert plan.search.lower_bound == capacity + 6 * scale > lower_bound(recs)


@settings(max_examples=60, deadline=None)
@given(recs=_gadgety.filter(lambda r: len(r) > 0), extra=st.integers(0, 2))
def test_dominance_rules_keep_the_search_complete(recs, extra):
    from numba_bfc.planning import OffsetsAssignment
    from numba_bfc.planning import _search as S

    capacity = lower_bound(recs) + extra
    plain, _, _ = _fits_exact(recs, capacity, 0)
    memo = S.memo_table(1 << 10)
    for rules in (S.GAP_DOMINANCE, S.MEMO, S.TIGHT_NEIGHBOURS, S.ALL_RULES):
        for order_key in (0, 1):  # one memo serves every order and limit at one capacity
            for limit in (-1, 1):
                status, _, off = _fits_exact(recs, capacity, rules, order_key,
                                             memo if rules == S.ALL_RULES else None, limit)
                if limit < 0:
                    assert status == plain
                else:
                    assert status != S.FOUND or plain == S.FOUND
                if status == S.FOUND:
                    validate(recs, OffsetsAssignment(off, capacity))


def test_dominance_rules_cut_nodes():
    from numba_bfc.planning import _search as S

    # Deterministic node counts (no timing): proofs that no plan fits, then the plan.
    rng = np.random.default_rng(8)
    total = {rules: 0 for rules in (0, S.GAP_DOMINANCE, S.MEMO, S.TIGHT_NEIGHBOURS,
                                    S.ALL_RULES)}
    for _ in range(40):
        recs = [(int(s), int(f), int(f + d)) for s, f, d in
                zip(rng.integers(1, 50, 30), rng.integers(0, 20, 30), rng.integers(0, 8, 30))]
        capacity = lower_bound(recs)
        while True:
            statuses = set()
            for rules in total:
                status, nodes, _ = _fits_exact(recs, capacity, rules)
                statuses.add(status)
                total[rules] += nodes
            assert len(statuses) == 1 and S.BUDGET not in statuses
            if S.FOUND in statuses:
                break
            capacity += 1
    assert total[S.GAP_DOMINANCE] < total[0] / 4 and total[S.MEMO] < total[0]
    assert total[S.TIGHT_NEIGHBOURS] < total[0]
    assert total[S.ALL_RULES] < total[0] / 4


def test_search_budgets_are_nodes_so_runs_agree_cold_and_warm(monkeypatch):
    """Issue 21: the answer depends on the node limit only, not on the machine's
    speed or a cold JIT cache (compilation is done before the clock starts)."""
    from numba_bfc.planning import search as planning_search

    recs = cut_instance(450, 1 << 20, time_cuts=0.75, seed=0)[0]  # not solved in the limit
    warm = assign_offsets(recs, "search", node_limit=200_000)
    monkeypatch.setattr(planning_search, "_compiled", threading.Event())  # as a new process
    cold = assign_offsets(recs, "search", node_limit=200_000)
    assert cold.search.compile_seconds > 0 and warm.search.stopped == "nodes"
    for plan in (warm, cold):
        validate(recs, plan)
    assert cold.offsets.tolist() == warm.offsets.tolist()
    assert (cold.search.nodes, cold.search.calls, cold.search.lower_bound) == (
        warm.search.nodes, warm.search.calls, warm.search.lower_bound)
    assert [s for _, s in cold.search.improvements] == [s for _, s in warm.search.improvements]
    more = assign_offsets(recs, "search", node_limit=400_000)
    assert more.search.nodes > warm.search.nodes and more.total_size <= warm.total_size


def test_the_time_cap_is_reported_when_it_ends_a_search():
    recs = cut_instance(450, 1 << 20, time_cuts=0.75, seed=0)[0]
    plan = assign_offsets(recs, "search", time_limit=1e-6)
    assert plan.search.stopped == "time" and plan.search.nodes == 0
    with pytest.raises(ValueError, match="node_limit must be a positive int"):
        assign_offsets(recs, "search", node_limit=0)


def test_sliced_instances_are_deterministic_slices_of_long_ranges():
    recs = sliced_instance(6, 7, horizon=300, unit=512, max_units=10, seed=3)
    again = sliced_instance(6, 7, horizon=300, unit=512, max_units=10, seed=3)
    assert recs.tolist() == again.tolist() and len(recs) == 42
    assert (recs["size"] % 512 == 0).all() and recs["size"].min() >= 512
    assert recs["size"].max() <= 10 * 512
    assert recs["first"].min() >= 0 and recs["last"].max() < 300
    assert (recs["first"] <= recs["last"]).all()
    # Each range is a chain of slices: a slice that ends right before another starts.
    ends = set((recs["last"] + 1).tolist())
    starts = recs["first"].tolist()
    assert sum(s in ends for s in starts) >= 42 - 6  # all but the first slice of each range
    assert sliced_instance(6, 7, seed=4).tolist() != sliced_instance(6, 7, seed=3).tolist()
    plan = assign_offsets(recs, "search", node_limit=20_000)
    validate(recs, plan)
    assert lower_bound(recs) <= plan.total_size <= assign_offsets(recs).total_size
    with pytest.raises(ValueError, match="must be >= 1"):
        sliced_instance(0, 5)


def test_packed_instances_are_random_buffers_packed_in_a_box():
    from numba_bfc.planning import OffsetsAssignment
    from numba_bfc.planning.instances import packed_instance

    recs, offsets = packed_instance(60, capacity=32, horizon=80, max_units=8, max_span=20,
                                    unit=256, seed=5)
    again, _ = packed_instance(60, capacity=32, horizon=80, max_units=8, max_span=20,
                               unit=256, seed=5)
    assert recs.tolist() == again.tolist() and len(recs) == 60
    validate(recs, OffsetsAssignment(offsets, 32 * 256))  # the packing is a plan in the box
    assert (recs["size"] % 256 == 0).all() and recs["size"].max() <= 8 * 256
    assert recs["first"].min() >= 0 and recs["last"].max() < 80
    assert (recs["last"] - recs["first"] < 20).all()
    assert lower_bound(recs) == 32 * 256  # max-live reaches the box: it is the optimum
    assert assign_offsets(recs).total_size > 32 * 256  # greedy does not find it
    plan = assign_offsets(recs, "search", node_limit=50_000)
    validate(recs, plan)
    assert plan.total_size == 32 * 256 and plan.search.optimal
    # A full box: fewer buffers than asked, never past it.
    full, full_offsets = packed_instance(500, capacity=4, horizon=10, max_units=4, max_span=10)
    assert len(full) < 500
    validate(full, OffsetsAssignment(full_offsets, 4 * 1024))
    with pytest.raises(ValueError, match="must be >= 1"):
        packed_instance(0)
