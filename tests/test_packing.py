"""Memory-feasible micro groups: subset sum within (1 - eps) of CP-SAT, never over budget."""

from __future__ import annotations

import pytest
from conftest import subset_sum_optimum
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from lengthsched import BudgetTooSmall, InvalidArgument, MicroGroupBudget, pack_micro_groups, subset_sum

sizes_st = st.lists(st.integers(0, 300), min_size=1, max_size=12)


@given(sizes=sizes_st, capacity=st.integers(0, 1200), max_items=st.integers(1, 6),
       eps=st.sampled_from([0.01, 0.05, 0.3]), certify=st.booleans())
def test_subset_sum_feasible_and_within_eps_of_cp_sat(sizes, capacity, max_items, eps, certify):
    result = subset_sum(sizes, capacity, max_items=max_items, eps=eps, certify=certify)
    assert len(set(result.items)) == len(result.items) <= max_items
    assert result.fill == sum(sizes[i] for i in result.items) <= capacity
    optimum = subset_sum_optimum(sizes, capacity, max_items)
    assert result.upper_bound >= optimum, "the reported bound is a real upper bound"
    assert result.fill >= (1 - eps) * optimum - 1e-9


def test_dp_beats_greedy_when_greedy_is_poor():
    # Largest-first greedy takes 60 and then nothing fits; {50, 50} fills the capacity exactly.
    result = subset_sum([60, 50, 50], 100, max_items=2, eps=0.01)
    assert result.fill == 100 and result.items == (1, 2)


def test_cardinality_constraint_binds():
    result = subset_sum([10, 10, 10, 10], 100, max_items=2)
    assert result.fill == 20 and len(result.items) == 2 and result.ratio == 1.0


@given(sizes=st.lists(st.integers(1, 500), min_size=1, max_size=25), capacity=st.integers(500, 2000),
       max_items=st.integers(1, 8))
def test_pack_micro_groups_places_every_item_once_within_budget(sizes, capacity, max_items):
    rounds = pack_micro_groups(sizes, capacity, max_items=max_items)
    placed = sorted(i for r in rounds for i in r.items)
    assert placed == list(range(len(sizes)))
    for r in rounds:
        assert r.fill == sum(sizes[i] for i in r.items) <= capacity
        assert len(r.items) <= max_items


def test_pack_rejects_an_item_larger_than_the_budget():
    with pytest.raises(BudgetTooSmall, match="argument 'capacity'.*item 1"):
        pack_micro_groups([5, 50, 5], 10)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(sizes=[1, -2], capacity=5), "sizes"),
        (dict(sizes=[1, 2], capacity=-1), "capacity"),
        (dict(sizes=[1, 2], capacity=5, max_items=0), "max_items"),
        (dict(sizes=[1, 2], capacity=5, eps=0), "eps"),
        (dict(sizes=[1, 2], capacity=5, eps=1.5), "eps"),
    ],
)
def test_bad_input_names_the_argument(kwargs, name):
    with pytest.raises(InvalidArgument, match=f"argument '{name}'"):
        subset_sum(**kwargs)


class BudgetMachine(RuleBasedStateMachine):
    """MicroGroupBudget against a plain model, with check_integrity after every operation."""

    def __init__(self):
        super().__init__()
        self.budget = MicroGroupBudget(capacity=100, max_items=4)
        self.model: dict[int, int] = {}
        self.next_item = 0

    @rule(size=st.integers(0, 60))
    def add(self, size):
        item = self.next_item
        self.next_item += 1
        fits = len(self.model) < 4 and sum(self.model.values()) + size <= 100
        assert self.budget.fits(size) == fits
        got = self.budget.try_add(item, size)
        if fits:
            assert got == item
            self.model[item] = size
        else:
            assert got is None

    @rule(data=st.data())
    def remove(self, data):
        if self.model:
            item = data.draw(st.sampled_from(sorted(self.model)))
            assert self.budget.remove(item) == self.model.pop(item)

    @invariant()
    def consistent(self):
        self.budget.check_integrity()
        assert self.budget.used == sum(self.model.values())
        assert self.budget.remaining == 100 - self.budget.used
        assert self.budget.items == tuple(self.model)


TestMicroGroupBudget = BudgetMachine.TestCase


def test_budget_rejects_duplicates_and_unknown_items():
    budget = MicroGroupBudget(10)
    budget.try_add("a", 3)
    with pytest.raises(InvalidArgument, match="argument 'item'"):
        budget.try_add("a", 1)
    with pytest.raises(InvalidArgument, match="argument 'item'"):
        budget.remove("b")
