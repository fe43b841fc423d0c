"""Exactness against TFLite's own memory_management tests.

Records and expected values are TFLite's test cases (memory_management_test.cc,
internal_test.cc), restated here; none is computed by this package.
"""

import numpy as np
import pytest

from numba_bfc.planning import (
    ObjectsAssignment,
    assign_objects,
    assign_offsets,
    calculate_positional_maximums,
    calculate_task_profiles,
    lower_bound,
    objects_to_offsets,
    validate,
)

CHAIN = [(16, 0, 1), (8, 1, 2), (64, 2, 3), (32, 3, 4), (8, 4, 5)]
COMPLEX = [
    (32, 0, 1),
    (32, 1, 4),
    (8, 2, 5),
    (16, 3, 5),
    (8, 4, 5),
    (64, 5, 7),
    (8, 6, 8),
    (8, 7, 8),
    (16, 8, 9),
]

# strategy -> (object_ids, object_sizes)
CHAIN_OBJECTS = {
    "naive": ([0, 1, 2, 3, 4], [16, 8, 64, 32, 8]),
    "equality": ([0, 1, 2, 3, 1], [16, 8, 64, 32]),
    "mincostflow": ([0, 1, 0, 1, 0], [64, 32]),
    "greedy_in_order": ([0, 1, 0, 1, 0], [64, 32]),
    "greedy_by_breadth": ([0, 1, 0, 1, 0], [64, 32]),
    "greedy_by_size": ([0, 1, 0, 1, 0], [64, 32]),
}
COMPLEX_OBJECTS = {
    "naive": ([0, 1, 2, 3, 4, 5, 6, 7, 8], [32, 32, 8, 16, 8, 64, 8, 8, 16]),
    "equality": ([0, 1, 2, 3, 4, 5, 4, 2, 3], [32, 32, 8, 16, 8, 64]),
    "mincostflow": ([0, 1, 2, 0, 3, 1, 3, 2, 0], [32, 64, 8, 8]),
    "greedy_in_order": ([0, 1, 0, 2, 3, 1, 3, 2, 0], [32, 64, 16, 8]),
    "greedy_by_breadth": ([0, 4, 2, 1, 3, 0, 2, 3, 1], [64, 16, 8, 8, 32]),
    "greedy_by_size": ([1, 0, 2, 1, 3, 0, 1, 2, 0], [64, 32, 8, 8]),
}


@pytest.mark.parametrize("strategy", sorted(CHAIN_OBJECTS))
def test_chain_records_objects(strategy):
    ids, sizes = CHAIN_OBJECTS[strategy]
    a = assign_objects(CHAIN, strategy)
    assert a.object_ids.tolist() == ids
    assert a.object_sizes.tolist() == sizes


@pytest.mark.parametrize("strategy", sorted(COMPLEX_OBJECTS))
def test_complex_records_objects(strategy):
    ids, sizes = COMPLEX_OBJECTS[strategy]
    a = assign_objects(COMPLEX, strategy)
    assert a.object_ids.tolist() == ids
    assert a.object_sizes.tolist() == sizes
    validate(COMPLEX, a)


def test_greedy_best_picks_by_size_when_not_strictly_worse():
    # by_breadth totals 128, by_size 112: GREEDY_BEST returns the by-size plan.
    a = assign_objects(COMPLEX, "greedy_best")
    assert a.object_ids.tolist() == COMPLEX_OBJECTS["greedy_by_size"][0]
    assert a.total_size == 112


def test_one_record_every_strategy():
    for strategy in CHAIN_OBJECTS:
        a = assign_objects([(16, 0, 1)], strategy)
        assert a.object_ids.tolist() == [0]
        assert a.object_sizes.tolist() == [16]
    off = assign_offsets([(16, 0, 1)], "greedy_by_size")
    assert off.offsets.tolist() == [0] and off.total_size == 16


def test_empty_records():
    for strategy in list(CHAIN_OBJECTS) + ["greedy_best"]:
        a = assign_objects([], strategy)
        assert a.object_ids.size == 0 and a.object_sizes.size == 0
    off = assign_offsets([], "greedy_by_size")
    assert off.offsets.size == 0 and off.total_size == 0
    assert lower_bound([]) == 0 and lower_bound([], "objects") == 0


def test_offsets_chain_and_complex():
    a = assign_offsets(CHAIN, "greedy_by_size")
    assert a.offsets.tolist() == [0, 64, 0, 64, 0] and a.total_size == 96
    b = assign_offsets(COMPLEX, "greedy_by_size")
    assert b.offsets.tolist() == [0, 32, 80, 64, 88, 0, 64, 72, 0]
    assert b.total_size == 96
    validate(COMPLEX, b)


def test_offsets_with_alignment():
    a = assign_offsets(CHAIN, "greedy_by_size", alignment=128)
    assert a.offsets.tolist() == [0, 128, 0, 128, 0]
    assert a.total_size == 160


def test_objects_to_offsets_cases():
    empty = objects_to_offsets(ObjectsAssignment(np.zeros(0, np.int64), np.zeros(0, np.int64)))
    assert empty.offsets.size == 0 and empty.total_size == 0
    one = objects_to_offsets(ObjectsAssignment(np.array([0, 0, 0]), np.array([16])))
    assert one.offsets.tolist() == [0, 0, 0] and one.total_size == 16
    many = objects_to_offsets(
        ObjectsAssignment(np.array([2, 0, 2, 1, 3, 3, 1, 5]), np.array([16, 8, 32, 32, 4, 16]))
    )
    assert many.offsets.tolist() == [24, 0, 24, 16, 56, 56, 16, 92]


def test_task_profiles_and_positional_maximums():
    assert [p.tolist() for p in calculate_task_profiles([(16, 0, 1)])] == [[0], [0]]
    assert calculate_positional_maximums([(16, 0, 1)]).tolist() == [16]
    chain = [p.tolist() for p in calculate_task_profiles(CHAIN)]
    assert chain == [[0], [0, 1], [2, 1], [2, 3], [3, 4], [4]]
    assert calculate_positional_maximums(CHAIN).tolist() == [64, 32]
    complex_ = [p.tolist() for p in calculate_task_profiles(COMPLEX)]
    assert complex_ == [
        [0],
        [0, 1],
        [1, 2],
        [1, 3, 2],
        [1, 3, 2, 4],
        [5, 3, 2, 4],
        [5, 6],
        [5, 6, 7],
        [8, 6, 7],
        [8],
    ]
    assert calculate_positional_maximums(COMPLEX).tolist() == [64, 32, 8, 8]
    assert calculate_task_profiles([]) == []
    assert calculate_positional_maximums([]).tolist() == []


def test_lower_bounds_on_complex():
    # task 5 holds 64 + 16 + 8 + 8 bytes; PM sums to 112
    assert lower_bound(COMPLEX, "offsets") == 96
    assert lower_bound(COMPLEX, "objects") == 112


UINT2 = [
    ((2, 8), 0, 1),
    ((2, 8), 1, 2),
    ((1, 12), 2, 4),
    ((2, 8), 3, 5),
    ((8, 2), 4, 5),
    ((2, 8), 5, 7),
    ((1, 8), 6, 8),
    ((2, 8), 7, 8),
    ((4, 1), 8, 9),
]
UINT3 = [
    ((1, 2, 8), 0, 1),
    ((4, 3, 2), 1, 2),
    ((1, 1, 1), 2, 4),
    ((2, 4, 1), 3, 5),
    ((2, 2, 2), 4, 5),
    ((8, 1, 2), 5, 7),
    ((1, 2, 1), 6, 8),
    ((1, 1, 1), 7, 8),
    ((2, 2, 2), 8, 9),
]
BHWC = [
    ((1, 1, 2, 8), 0, 1),
    ((1, 1, 2, 8), 1, 2),
    ((1, 1, 1, 16), 2, 4),
    ((1, 1, 2, 8), 3, 5),
    ((1, 1, 8, 2), 4, 5),
    ((1, 1, 2, 8), 5, 7),
    ((1, 16, 1, 1), 6, 8),
    ((16, 1, 1, 1), 7, 8),
    ((1, 1, 1, 16), 8, 9),
]


def test_uint2_records():
    naive = assign_objects(UINT2, "naive")
    assert naive.object_ids.tolist() == list(range(9))
    assert naive.object_sizes.tolist() == [list(r[0]) for r in UINT2]
    eq = assign_objects(UINT2, "equality")
    assert eq.object_ids.tolist() == [0, 1, 2, 0, 3, 1, 4, 0, 5]
    assert eq.object_sizes.tolist() == [[2, 8], [2, 8], [1, 12], [8, 2], [1, 8], [4, 1]]
    gio = assign_objects(UINT2, "greedy_in_order")
    assert gio.object_ids.tolist() == [0, 1, 2, 0, 3, 1, 2, 0, 3]
    assert gio.object_sizes.tolist() == [[2, 8], [2, 8], [1, 12], [8, 2]]
    validate(UINT2, gio)


def test_uint3_records():
    eq = assign_objects(UINT3, "equality")
    assert eq.object_ids.tolist() == [0, 1, 2, 3, 4, 5, 6, 2, 4]
    assert eq.object_sizes.tolist() == [
        [1, 2, 8],
        [4, 3, 2],
        [1, 1, 1],
        [2, 4, 1],
        [2, 2, 2],
        [8, 1, 2],
        [1, 2, 1],
    ]
    gio = assign_objects(UINT3, "greedy_in_order")
    assert gio.object_ids.tolist() == [0, 1, 0, 2, 1, 3, 2, 0, 1]
    assert gio.object_sizes.tolist() == [[1, 2, 8], [4, 3, 2], [2, 4, 1], [8, 1, 2]]
    validate(UINT3, gio)


def test_bhwc_records_equality_is_lifo():
    eq = assign_objects(BHWC, "equality")
    assert eq.object_ids.tolist() == [0, 1, 2, 1, 3, 0, 4, 5, 2]
    assert eq.object_sizes.tolist() == [
        [1, 1, 2, 8],
        [1, 1, 2, 8],
        [1, 1, 1, 16],
        [1, 1, 8, 2],
        [1, 16, 1, 1],
        [16, 1, 1, 1],
    ]


def test_multidim_rejects_1d_only_strategies():
    with pytest.raises(ValueError, match="does not support 2-D"):
        assign_objects(UINT2, "greedy_by_size")
    with pytest.raises(ValueError, match="does not support 4-D"):
        assign_objects(BHWC, "greedy_in_order")
    with pytest.raises(ValueError, match="1-D"):
        assign_offsets(UINT2, "naive")


def test_mincostflow_costs_above_2gib():
    # With 32-bit costs these sizes overflow; the reuse chain must still win.
    g = 1 << 31
    recs = [(3 * g, 0, 1), (3 * g, 2, 3), (5 * g, 4, 5)]
    a = assign_objects(recs, "mincostflow")
    assert a.object_ids.tolist() == [0, 0, 0]
    assert a.object_sizes.tolist() == [5 * g]


def test_reallocation_graph_restricts_reuse():
    # Tensor 2 may reuse tensor 0's object only; tensor 1's is not allowed.
    recs = [(16, 0, 1), (8, 0, 1), (8, 2, 3)]
    free = assign_objects(recs, "greedy_in_order")
    assert free.object_ids.tolist() == [0, 1, 1]
    graph = [[2], [], []]
    a = assign_objects(recs, "greedy_in_order", reallocation_graph=graph)
    assert a.object_ids.tolist() == [0, 1, 0]
    assert a.object_sizes.tolist() == [16, 8]
    none = assign_objects(recs, "greedy_in_order", reallocation_graph=[[], [], []])
    assert none.object_ids.tolist() == [0, 1, 2]
