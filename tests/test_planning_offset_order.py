"""The offset-order decision procedure (``planning._offset_order``, MiniMalloc's
method): its answers equal the complete section search's (itself checked by brute
force) under every combination of its rules and rank orders, its plans are valid,
and its budget is counted in nodes."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numba_bfc.planning import OffsetsAssignment, as_records, assign_offsets, lower_bound, validate
from numba_bfc.planning import _offset_order as O
from numba_bfc.planning import _search as S
from numba_bfc.planning.instances import GADGET, cut_instance, sliced_instance
from numba_bfc.planning.search import _twins


def _arrays(recs):
    r = as_records(recs)
    sizes, firsts, lasts = (np.ascontiguousarray(r[k]) for k in ("size", "first", "last"))
    _, a, b = S.sections(firsts, lasts)
    return sizes, lasts - firsts + 1, a, b, int(b.max()) if len(sizes) else 0


def _offset_order(recs, capacity, order_code=0, rules=O.ALL_RULES, max_nodes=10**7):
    sizes, width, a, b, num_sections = _arrays(recs)
    off = np.zeros(len(sizes), dtype=np.int64)
    status, nodes = O.fits_in_offset_order(sizes, width, a, b, num_sections, order_code,
                                           capacity, max_nodes, off, rules)
    return int(status), int(nodes), off


def _section_search(recs, capacity):
    """The complete section search with no extra rule (checked by brute force in
    ``test_planning_search``)."""
    sizes, _, a, b, num_sections = _arrays(recs)
    order = np.lexsort((np.arange(len(sizes)), -(b - a), -sizes)).astype(np.int64)
    off = np.zeros(len(sizes), dtype=np.int64)
    status, _ = S.fits(sizes, a, b, num_sections, order, _twins(sizes, a, b), capacity, 10**7,
                       off, -1, 0)
    assert status != S.BUDGET
    return int(status)


# Random buffers, some with a scaled, shifted copy of GADGET (optimum above max-live),
# and long ones sliced along time (where parts split off).
_instances = st.tuples(
    st.lists(st.tuples(st.integers(1, 12), st.integers(0, 14), st.integers(0, 5)), min_size=1,
             max_size=10),
    st.booleans(), st.integers(1, 3), st.integers(0, 6)).map(
    lambda t: [(s, f, f + d) for s, f, d in t[0]]
    + ([(s * t[2], f + t[3], la + t[3]) for s, f, la in GADGET] if t[1] else []))


@settings(max_examples=150, deadline=None)
@given(recs=_instances, extra=st.integers(-1, 2))
def test_answers_equal_the_complete_section_search(recs, extra):
    capacity = lower_bound(recs) + extra
    expected = _section_search(recs, capacity)
    for rules in (0, O.DECOMPOSE, O.HATLESS, O.UNPLACED_FLOOR, O.ALL_RULES):
        for order_code in range(len(O.ORDERS)):
            status, nodes, off = _offset_order(recs, capacity, order_code, rules)
            assert status == expected, (rules, order_code)
            if status == S.FOUND:
                validate(recs, OffsetsAssignment(off, capacity))


@pytest.mark.parametrize("seed", range(3))
def test_sliced_and_cut_instances(seed):
    recs = sliced_instance(6, 4, seed=seed)
    bound = lower_bound(recs)
    for order_code in range(len(O.ORDERS)):
        status, _, off = _offset_order(recs, bound + bound // 4, order_code)
        assert status == S.FOUND
        validate(recs, OffsetsAssignment(off, bound + bound // 4))
    recs, _ = cut_instance(60, capacity=256, horizon=80, seed=seed)
    status, _, off = _offset_order(recs, 256, 0)
    assert status in (S.FOUND, S.BUDGET)
    if status == S.FOUND:
        validate(recs, OffsetsAssignment(off, 256))
    assert _offset_order(recs, 255, 0)[0] == S.INFEASIBLE  # below max-live: no node needed


def test_budget_is_counted_in_nodes():
    recs = sliced_instance(10, 20, seed=0)
    bound = lower_bound(recs)
    status, nodes, _ = _offset_order(recs, bound, 0, max_nodes=50)
    assert status == S.BUDGET and nodes == 50
    again = _offset_order(recs, bound, 0, max_nodes=50)
    assert again[:2] == (status, nodes)  # deterministic


def test_rules_cut_nodes():
    # Deterministic node counts: every rule on needs fewer nodes in all than none.
    rng = np.random.default_rng(3)
    spent = {0: 0, O.ALL_RULES: 0}
    for _ in range(30):
        recs = [(int(s), int(f), int(f + d)) for s, f, d in
                zip(rng.integers(1, 50, 24), rng.integers(0, 20, 24), rng.integers(0, 8, 24))]
        capacity = lower_bound(recs)
        answers = set()
        for rules in spent:
            status, nodes, _ = _offset_order(recs, capacity, 0, rules)
            answers.add(status)
            spent[rules] += nodes
        assert len(answers) == 1
    assert spent[O.ALL_RULES] < spent[0]


def test_search_proves_with_it_what_the_section_search_alone_does_not():
    # A sliced instance: the section search alone exhausts 20,000 nodes at the bound,
    # the offset order (run beside it) finds a plan there: proven optimal.
    recs = sliced_instance(10, 20, seed=0)
    bound = lower_bound(recs)
    sizes, _, a, b, num_sections = _arrays(recs)
    order = np.lexsort((np.arange(len(sizes)), -(b - a), -sizes)).astype(np.int64)
    off = np.zeros(len(sizes), dtype=np.int64)
    status, _ = S.fits_memo(sizes, a, b, num_sections, order, _twins(sizes, a, b), bound,
                            20_000, off, -1, S.ALL_RULES, *S.memo_table(1 << 12))
    assert status == S.BUDGET
    plan = assign_offsets(recs, "search", node_limit=20_000)
    validate(recs, plan)
    assert plan.total_size == bound and plan.search.optimal
    assert plan.search.nodes <= 20_000
