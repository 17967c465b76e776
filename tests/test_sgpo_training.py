"""simulate.sgpo_training: sGPO's ways of sizing groups over a simulated training run (fixed G, a profiling pass,
the trainer's own rewards, the true success rates), every step through run_rollout."""

from __future__ import annotations

import numpy as np
import pytest

from lengthsched.errors import InvalidArgument
from lengthsched.sgpo import BudgetConfig, OnlineBudget
from simulate.sgpo_training import SGPO_SIZINGS, _draw, drifting_prompts, run_sgpo_training

L = 1024
RUN = dict(epochs=3, replicas=2, budget_tokens=8 * L, max_new_tokens=L, batch_prompts=8)


@pytest.fixture(scope="module")
def prompts():
    return drifting_prompts(24, max_new_tokens=L, learn=1.0, seed=3)


@pytest.fixture(scope="module")
def runs(prompts):
    return {s: run_sgpo_training(prompts, s, **RUN) for s in SGPO_SIZINGS}


def test_prompts_draw_castillo_lengths_and_drifting_success(prompts):
    assert len(prompts) == 24 and len({p.id for p in prompts}) == 24
    assert all(1 <= p.lengths.min() and p.lengths.max() <= L and 0 < p.success(0) < 1 for p in prompts)
    assert all(p.success(2) >= p.success(0) for p in prompts)  # the policy only gains here
    assert all(p.success(5) == p.success(0) for p in drifting_prompts(8, max_new_tokens=L, learn=0.0))


def test_a_prompts_kth_completion_is_the_same_draw_under_every_sizing(prompts):
    small, big, huge = _draw(prompts[0], 0, 4, 1, 0, 0), _draw(prompts[0], 0, 32, 1, 0, 0), _draw(prompts[0], 0, 130,
                                                                                                  1, 0, 0)
    assert np.array_equal(small[0], big[0][:4]) and np.array_equal(small[1], big[1][:4])
    assert np.array_equal(big[0], huge[0][:32]) and np.array_equal(big[1], huge[1][:32]) and len(huge[0]) == 130
    assert not np.array_equal(_draw(prompts[0], 0, 32, 2, 0, 0)[0], big[0])  # another epoch: other draws


def test_each_sizing_runs_the_groups_it_says(prompts, runs):
    fixed, offline, online, oracle = (runs[s] for s in SGPO_SIZINGS)
    assert fixed.sizes == [[16] * 24] * 3 and fixed.profiling is None
    assert all(e.completions == 16 * 24 and e.steps == 3 for e in fixed.epochs)
    # online: the first epoch is the fixed one, draw for draw; later sizes are OnlineBudget's on what it saw
    assert online.epochs[0] == fixed.epochs[0] and online.sizes[0] == [16] * 24
    budget = OnlineBudget(BudgetConfig(baseline_group_size=16), memory=2)
    for i, p in enumerate(prompts):
        budget.observe(p.id, _draw(p, i, 16, 0, 0, 0)[1])
    assert online.sizes[1] == budget.group_sizes([p.id for p in prompts], 16)
    assert all(2 <= g <= 32 for g in online.sizes[2]) and sum(online.sizes[1]) < 16 * 24
    # offline: a profiling pass of 8 per prompt, then the same sizes every epoch, dropped prompts left out
    assert offline.profiling.completions == 8 * 24 and offline.profiling.seconds > 0
    assert offline.profiling.informative == 0 and offline.sizes[0] == offline.sizes[1] == offline.sizes[2]
    assert offline.epochs[0].completions == sum(offline.sizes[0]) and offline.epochs[0].groups == sum(
        g > 0 for g in offline.sizes[0])
    assert offline.seconds == pytest.approx(offline.profiling.seconds + sum(e.seconds for e in offline.epochs))
    # oracle: plan_budget's rule on the true success rate of each epoch
    for epoch, sizes in enumerate(oracle.sizes):
        for p, g in zip(prompts, sizes):
            s = p.success(epoch)
            assert (g == 0) if s > 0.9 else (g >= 2)
    for r in runs.values():
        assert all(e.informative <= e.groups and e.informative_completions <= e.completions for e in r.epochs)
        # a group with k of g solved adds 2 sqrt(k (g - k)) <= g: at most its completions, at least 2 if informative
        assert all(2 * e.informative <= e.advantage_mass <= e.informative_completions + 1e-9 for e in r.epochs)
        assert r.informative_per_hour == pytest.approx(3600 * r.informative / r.seconds)


def test_steps_by_completions_fill_each_step_instead_of_counting_prompts(prompts):
    by_prompts = run_sgpo_training(prompts, "online", **RUN)
    by_completions = run_sgpo_training(prompts, "online", **{**RUN, "batch_prompts": None,
                                                             "batch_completions": 128})
    assert by_completions.sizes == by_prompts.sizes  # the same decisions, other steps
    later = by_completions.epochs[1]
    assert later.steps < by_prompts.epochs[1].steps and later.steps >= -(-later.completions // (128 + 32))


def test_slimes_masked_samples_cost_seconds_and_change_no_decision(prompts):
    """masked_to: every group also runs one-token completions up to that many (slime's lengthsched_sgpo): the same
    sizes, completions and informative groups as without them, the same or more seconds; a size above it is
    refused."""
    cfg = BudgetConfig(g_max=16, baseline_group_size=16)
    plain = run_sgpo_training(prompts, "online", config=cfg, **RUN)
    masked = run_sgpo_training(prompts, "online", config=cfg, masked_to=16, **RUN)
    assert masked.sizes == plain.sizes and masked.completions == plain.completions
    assert masked.informative == plain.informative and masked.seconds >= plain.seconds * 0.99
    assert sum(e.tokens for e in masked.epochs) == sum(e.tokens for e in plain.epochs) + sum(
        16 - g for sizes in masked.sizes for g in sizes)  # one token each
    with pytest.raises(InvalidArgument, match="'masked_to'"):
        run_sgpo_training(prompts, "online", masked_to=8, **RUN)  # g_max 32 by default


@pytest.mark.parametrize("kwargs, name", [
    (dict(sizing="adaptive"), "sizing"), (dict(batch_prompts=None), "batch_completions"),
    (dict(batch_completions=64), "batch_completions"), (dict(epochs=0), "epochs"), (dict(batch_prompts=0),
                                                                                      "batch_prompts")])
def test_bad_arguments_are_named(prompts, kwargs, name):
    args = {**RUN, "sizing": "fixed", **kwargs}
    with pytest.raises(InvalidArgument, match=f"'{name}'"):
        run_sgpo_training(prompts, **args)
    with pytest.raises(InvalidArgument, match="'learn'"):
        drifting_prompts(4, learn=-1.0)
    with pytest.raises(InvalidArgument, match="'prompts'"):
        run_sgpo_training([], "fixed", **RUN)


def test_prompts_from_a_profile_keep_its_rates_and_lengths():
    from lengthsched.sgpo import ProfileRecord
    from simulate.sgpo_training import prompts_from_profile

    profile = [ProfileRecord("a", (1, 0, 0, 0), (100, 5000, 300, 200), 40), ProfileRecord("b", (0,) * 8)]
    a, b = prompts_from_profile(profile, max_new_tokens=1000, learn=0.0, default_length=300)
    assert a.success(0) == pytest.approx(1.5 / 5) and b.success(0) == pytest.approx(0.5 / 9)  # shrunk to one half
    assert a.lengths.tolist() == [100, 1000, 300, 200] and a.prompt_len == 40  # clipped to max_new_tokens
    assert len(b.lengths) == 32 and 100 < np.median(b.lengths) < 900 and b.success(3) == b.success(0)
    with pytest.raises(InvalidArgument, match="'profile'"):
        prompts_from_profile([], max_new_tokens=10)
    with pytest.raises(InvalidArgument, match="'profile_samples'"):
        run_sgpo_training([a, b], "offline", **{**RUN, "profile_samples": [8]})
