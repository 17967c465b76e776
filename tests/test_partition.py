"""Partitioning: every result is a partition, bounds hold, FPTAS within (1 + eps) of CP-SAT."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lengthsched import InvalidArgument, partition
from lengthsched.partition import StateLimitExceeded

sizes_st = st.lists(st.integers(min_value=0, max_value=200), min_size=1, max_size=11)
k_st = st.integers(min_value=1, max_value=5)
eps_st = st.sampled_from([0.01, 0.05, 0.2, 0.5, 1.0])
ALGORITHMS = [
    ("lpt", lambda s, k: partition.lpt(s, k)),
    ("karmarkar_karp", lambda s, k: partition.karmarkar_karp(s, k)),
    ("fptas", lambda s, k: partition.fptas(s, k, 0.05)),
    ("fptas_dp", lambda s, k: partition.fptas(s, k, 0.05, certify=False)),
    ("exact", lambda s, k: partition.exact(s, k)),
]


def assert_is_partition(result, sizes, k):
    assert len(result.parts) == k
    flat = sorted(i for part in result.parts for i in part)
    assert flat == list(range(len(sizes))), "every job exactly once"
    loads = tuple(sum(sizes[i] for i in part) for part in result.parts)
    assert result.loads == loads
    assert result.makespan == max(loads)
    assert result.lower_bound <= result.makespan
    assert result.ratio >= 1.0


def brute_force_optimum(sizes, k):
    best = None
    for assignment in itertools.product(range(k), repeat=len(sizes)):
        loads = [0] * k
        for size, part in zip(sizes, assignment):
            loads[part] += size
        best = max(loads) if best is None else min(best, max(loads))
    return best


@pytest.mark.parametrize("name,algorithm", ALGORITHMS, ids=[a[0] for a in ALGORITHMS])
@given(sizes=sizes_st, k=k_st)
def test_every_result_is_a_partition(name, algorithm, sizes, k):
    assert_is_partition(algorithm(sizes, k), sizes, k)


@given(sizes=st.lists(st.integers(0, 30), min_size=1, max_size=7), k=st.integers(1, 3))
def test_exact_oracle_matches_brute_force(sizes, k):
    result = partition.exact(sizes, k)
    assert result.proven_optimal
    assert result.makespan == brute_force_optimum(sizes, k)


@given(sizes=sizes_st, k=k_st, eps=eps_st, certify=st.booleans(), prune=st.booleans())
def test_fptas_within_one_plus_eps_of_cp_sat(sizes, k, eps, certify, prune):
    optimum = partition.exact(sizes, k).makespan
    result = partition.fptas(sizes, k, eps, certify=certify, prune=prune)
    assert result.makespan <= (1 + eps) * optimum + 1e-9


@given(sizes=st.lists(st.integers(1, 1000), min_size=2, max_size=40), k=st.integers(2, 4))
def test_fptas_dp_on_larger_instances_beats_lower_bound_guarantee(sizes, k):
    # Without CP-SAT: (1 + eps) * optimum <= (1 + eps) * makespan(exact) is checked above; here the
    # programme must at least never be worse than the incumbent heuristics it starts from.
    result = partition.fptas(sizes, k, 0.05, certify=False)
    assert result.makespan <= partition.best_heuristic(sizes, k).makespan


@given(sizes=sizes_st, k=k_st)
def test_lpt_within_graham_bound(sizes, k):
    optimum = partition.exact(sizes, k).makespan
    assert partition.lpt(sizes, k).makespan <= (4 / 3 - 1 / (3 * k)) * optimum + 1e-9


@given(sizes=sizes_st, k=k_st)
def test_lower_bound_never_above_optimum(sizes, k):
    assert partition.lower_bound(sizes, k) <= partition.exact(sizes, k).makespan


@given(sizes=sizes_st, k=k_st, eps=eps_st)
def test_deterministic(sizes, k, eps):
    for algorithm in (partition.lpt, partition.karmarkar_karp):
        assert algorithm(sizes, k) == algorithm(list(sizes), k)
    assert partition.fptas(sizes, k, eps, certify=False) == partition.fptas(sizes, k, eps, certify=False)


def test_fptas_dp_finds_what_the_heuristics_miss():
    # LPT and Karmarkar-Karp both give 57 here; the optimum (and lower bound) is 51.
    sizes = [18, 28, 14, 25, 23, 19, 26]
    assert partition.best_heuristic(sizes, 3).makespan == 57
    result = partition.fptas(sizes, 3, 0.05)
    assert result.makespan <= 1.05 * 51 and result.makespan < 57


def test_worked_example_of_model_md():
    sizes = [5, 3, 8, 2]
    assert partition.lower_bound(sizes, 2) == 9
    assert partition.exact(sizes, 2).makespan == 10
    assert partition.fptas(sizes, 2, 0.05).makespan == 10


def test_lower_bound_pigeonhole_terms():
    # Three equal jobs on two parts: two share a part, so 2 * 10 beats ceil(30 / 2) = 15.
    assert partition.lower_bound([10, 10, 10], 2) == 20
    # Five jobs of 10 on two parts: some part holds three of them.
    assert partition.lower_bound([10] * 5, 2) == 30


def test_more_parts_than_jobs_gives_empty_parts():
    result = partition.fptas([4, 9], 5, 0.1)
    assert result.makespan == 9 and sum(1 for p in result.parts if not p) == 3


def test_state_limit_is_reported():
    with pytest.raises(StateLimitExceeded, match="max_states"):
        partition.fptas([18, 28, 14, 25, 23, 19, 26], 3, 0.01, max_states=2)


@pytest.mark.parametrize(
    "sizes,k,eps,name",
    [
        ([3, -1], 2, 0.1, "sizes"),
        ([3, 1.5], 2, 0.1, "sizes"),
        ([], 2, 0.1, "sizes"),
        ("123", 2, 0.1, "sizes"),
        ([[1, 2], [3]], 2, 0.1, "sizes"),
        ([True, 2], 2, 0.1, "sizes"),
        ([3, 4], 0, 0.1, "k"),
        ([3, 4], 2.5, 0.1, "k"),
        ([3, 4], 2, 0.0, "eps"),
        ([3, 4], 2, -1.0, "eps"),
        ([3, 4], 2, float("nan"), "eps"),
    ],
)
def test_bad_input_names_the_argument(sizes, k, eps, name):
    with pytest.raises(InvalidArgument, match=f"argument '{name}'"):
        partition.fptas(sizes, k, eps)


def test_integral_floats_are_accepted():
    assert partition.lpt([3.0, 4.0], 2).makespan == 4


def test_errors_survive_pickling():
    import pickle

    from lengthsched import BudgetTooSmall

    for error in (InvalidArgument("k", 0, "an integer >= 1"), BudgetTooSmall("budget_bytes", 5, "more")):
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error) and str(again) == str(error) and again.name == error.name
