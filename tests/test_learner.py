"""The learner's cost model (naive vs shared-prefix scoring) and micro-batches sized by it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lengthsched import LearnerShapes, learner_cost, learner_micro_batches, learner_tokens
from lengthsched.errors import BudgetTooSmall, InvalidArgument

SHAPES = LearnerShapes(num_parameters=1_000_000, num_layers=4, width=256)


def brute_pairs(p, lengths, grouped):
    """(query, key) pairs by enumerating the masks of the two layouts."""
    if not grouped:
        return sum((p + n) * (p + n + 1) // 2 for n in lengths)
    total = p * (p + 1) // 2
    for n in lengths:
        total += sum(p + j + 1 for j in range(n))
    return total


@given(p=st.integers(0, 60), lengths=st.lists(st.integers(1, 40), min_size=1, max_size=8))
def test_cost_counts_tokens_and_attention_pairs(p, lengths):
    for grouped in (False, True):
        cost = learner_cost(SHAPES, p, lengths, grouped=grouped)
        assert cost.tokens == learner_tokens(p, lengths, grouped=grouped)
        assert cost.tokens == (p if grouped else p * len(lengths)) + sum(lengths)
        assert cost.linear_flops == 2 * SHAPES.num_parameters * cost.tokens
        assert cost.attention_flops == pytest.approx(4 * 4 * 256 * brute_pairs(p, lengths, grouped))
    assert learner_cost(SHAPES, p, lengths, grouped=True).flops <= learner_cost(SHAPES, p, lengths, grouped=False).flops


def test_ratio_tends_to_one_over_g_as_the_prompt_dominates():
    g = 16
    ratios = [learner_cost(SHAPES, p, [8] * g, grouped=True).flops
              / learner_cost(SHAPES, p, [8] * g, grouped=False).flops
              for p in (10, 100, 1000, 10000, 100000)]
    assert all(a > b for a, b in zip(ratios, ratios[1:]))
    assert ratios[-1] == pytest.approx(1 / g, rel=0.01)


def test_shapes_from_a_preset():
    shapes = LearnerShapes.from_hf_config("qwen3-1.7b")
    assert shapes.num_layers == 28 and shapes.width == 16 * 128 and shapes.num_parameters == 1_720_574_976


def test_micro_batches_hold_whole_groups_within_the_budget():
    rng = np.random.default_rng(0)
    groups = [(int(rng.integers(100, 600)), rng.integers(20, 200, size=8).tolist()) for _ in range(30)]
    budget = 6000
    for grouped in (False, True):
        batches = learner_micro_batches(groups, budget, grouped=grouped)
        assert sorted(j for b in batches for j in b) == list(range(30))
        for b in batches:
            assert sum(learner_tokens(*groups[j], grouped=grouped) for j in b) <= budget
    assert len(learner_micro_batches(groups, budget, grouped=True)) < len(learner_micro_batches(groups, budget,
                                                                                                 grouped=False))
    with pytest.raises(BudgetTooSmall):
        learner_micro_batches(groups, 100, grouped=True)
    with pytest.raises(InvalidArgument, match="groups"):
        learner_micro_batches([], 100, grouped=True)
