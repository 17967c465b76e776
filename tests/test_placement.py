"""lengthsched.placement.length_classes: contiguous classes of the completions sorted longest first."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthsched import InvalidArgument
from lengthsched.placement import length_classes
from lengthsched.runtime.timing import default_cost

COST = default_cost()


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 4000), min_size=1, max_size=80), replicas=st.integers(1, 8),
       budget=st.integers(4096, 10**6), lam=st.sampled_from([0.0, 0.5, 1.0]), prompt=st.integers(0, 2000))
def test_classes_are_contiguous_in_length_and_use_at_most_the_replicas(lengths, replicas, budget, lam, prompt):
    flat = np.array(lengths)
    placed = length_classes(flat, prompt, replicas=replicas, budget_tokens=budget, cost=COST, lam=lam)
    assert placed.shape == flat.shape and placed.min() == 0 and placed.max() < replicas
    order = np.argsort(-flat, kind="stable")
    assert np.all(np.diff(placed[order]) >= 0)  # replica 0 the longest, then shorter and shorter classes
    assert placed[int(np.argmax(flat))] == 0


def test_the_longest_share_a_replica_when_the_rest_is_much_work():
    """Two completions of 1,000 tokens and 200 of 300 on 2 replicas with room for everything: the two
    long ones go together (their replica runs 1,000 cheap steps) and the short ones to the other,
    which runs 300 steps; with a replica to spare for each, the long ones are apart."""
    flat = np.array([1000, 1000] + [300] * 200)
    placed = length_classes(flat, 0, replicas=2, budget_tokens=10**6, cost=COST)
    assert placed[0] == placed[1] == 0 and np.all(placed[2:] == 1)
    flat = np.array([3000, 3000] + [100] * 200)
    placed = length_classes(flat, 100, replicas=4, budget_tokens=10**6, cost=COST)
    assert placed[:2].tolist() == [0, 1] and set(placed[2:].tolist()) == {2, 3}


def test_one_replica_takes_everything():
    assert length_classes([5, 50, 500], [10, 10, 10], replicas=1, budget_tokens=4096, cost=COST).tolist() == [0, 0, 0]


@pytest.mark.parametrize("kwargs, name", [(dict(lengths=[]), "lengths"), (dict(lengths=[1, -2]), "lengths"),
                                          (dict(lengths=[[1, 2]]), "lengths"), (dict(replicas=0), "replicas"),
                                          (dict(budget_tokens=0), "budget_tokens"), (dict(lam=1.5), "lam"),
                                          (dict(lengths=[1.0, float("nan")]), "lengths")])
def test_bad_inputs_name_the_argument(kwargs, name):
    args = dict(lengths=[10, 20], context=0, replicas=2, budget_tokens=4096, cost=COST) | kwargs
    lengths = args.pop("lengths")
    context = args.pop("context")
    with pytest.raises(InvalidArgument, match=f"'{name}'"):
        length_classes(lengths, context, **args)


def test_the_estimate_is_below_each_replicas_simulated_seconds():
    """estimate_seconds bounds each replica from below (steps at least its longest completion and its KV
    area over the pool): checked against vLLM FCFS and priority replicas on the length classes."""
    from lengthsched.placement import estimate_seconds
    from simulate import run_rollout
    from simulate.workloads import castillo_groups

    groups = castillo_groups(16, limit=24, seed=2, max_new_tokens=2048)
    flat = np.concatenate([g.lengths for g in groups])
    owner = np.repeat(np.arange(len(groups)), [len(g.lengths) for g in groups])
    prompts = np.array([g.prompt_len for g in groups])
    for budget in (3 * 2048, 16 * 2048):
        for lam in (0.0, 1.0):
            placed = length_classes(flat, prompts[owner], replicas=3, budget_tokens=budget, cost=COST, lam=lam)
            est = estimate_seconds(placed, flat, owner, prompts, replicas=3, budget_tokens=budget, cost=COST)
            for policy in ("vllm", "vllm_priority"):
                r = run_rollout(groups, policy, replicas=3, budget_tokens=budget, max_new_tokens=2048,
                                placement=placed, predicted=flat)
                assert np.all(est <= np.array(r.replica_seconds) * (1 + 1e-9)) and est.max() > 0


def test_the_recommendation_follows_how_much_siblings_agree():
    """Length classes where siblings agree (CASTILLO-like groups: log-sd 0.09), steal where they do not
    (the long-tail model: 1.0); judged from the previous epoch's completions of the same prompts."""
    from lengthsched.placement import CLASSES_MAX_SPREAD, recommend_rollout_policy, sibling_spread
    from simulate.workloads import castillo_groups, trace_groups

    close = [g.lengths for g in castillo_groups(16, limit=64, seed=11, epoch=1)]
    apart = [g.lengths for g in trace_groups("lmsys", 16, spread=1.0, limit=64, seed=11, epoch=1)]
    assert sibling_spread(close) < CLASSES_MAX_SPREAD < sibling_spread(apart)
    assert recommend_rollout_policy(close) == "steal_classes" and recommend_rollout_policy(apart) == "steal"
    assert sibling_spread([[100, 100], [10]]) == 0.0 and np.isnan(sibling_spread([[5]]))
    assert recommend_rollout_policy([[7]]) == "steal"  # no sibling seen: no evidence that they agree
    with pytest.raises(InvalidArgument, match="'groups'"):
        sibling_spread([[10, 0]])


def test_the_class_planner_is_the_simulators_and_checks_its_arguments():
    """lengthsched.runtime.replicas.plan_classes (numpy only) plans what simulate.run_rollout's
    placed_classes runs, and names a bad argument."""
    from lengthsched.runtime.replicas import plan_classes
    from simulate import run_rollout
    from simulate.workloads import castillo_groups

    groups = castillo_groups(16, limit=12, seed=4, max_new_tokens=2048)
    flat = np.concatenate([g.lengths for g in groups])
    owner = np.repeat(np.arange(len(groups)), [len(g.lengths) for g in groups])
    prompts = np.array([g.prompt_len for g in groups])
    predicted = (flat * np.exp(np.random.default_rng(0).normal(0, 0.1, len(flat)))).astype(int) + 1
    common = dict(replicas=3, budget_tokens=8 * 2048, max_new_tokens=2048)
    planned = plan_classes(predicted, owner, prompts, cost=COST, **common)
    assert run_rollout(groups, "placed_classes", predicted=predicted, **common).placement.tolist() == planned.tolist()
    for kwargs, name in ((dict(policy="steal"), "policy"), (dict(policy="nope"), "policy"),
                         (dict(replicas=0), "replicas"), (dict(max_new_tokens=0), "max_new_tokens")):
        with pytest.raises(InvalidArgument, match=f"'{name}'"):
            plan_classes(predicted, owner, prompts, cost=COST, **(common | kwargs))
    with pytest.raises(InvalidArgument, match="'predicted'"):
        plan_classes([], [], prompts, cost=COST, **common)
    with pytest.raises(InvalidArgument, match="'group'"):
        plan_classes(predicted, owner + 100, prompts, cost=COST, **common)
