"""Seconds as the unit: every path prices the same steps the same way, and nothing beats the bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthsched.cost import StepCost
from lengthsched.runtime import POLICIES, policy_names
from lengthsched.runtime.timing import default_cost, prompt_prefill_log, prompt_prefill_seconds
from simulate import SimulationError, run_group
from simulate.compiled import COMPILED_POLICIES, engine_many
from simulate.fast import FAST_POLICIES, seconds_many, slot_count

COST = default_cost()  # Qwen3-1.7B on the H100 preset
# A model where compute binds early, so runs cross between the memory- and compute-bound regimes.
TIGHT = COST.replace(peak_flops=2e12, overhead_seconds=1e-4)


def test_one_completion_alone_is_its_prefill_and_its_decode_steps():
    prompt, length = 300, 40
    r = run_group([length], "full_freed", max_new_tokens=64, prompt_len=prompt)
    decode = sum(COST.seconds(1, prompt + a - 1) for a in range(1, length + 1))
    prefill = COST.seconds(0, 0, prompt, prompt * (prompt + 1) // 2)
    assert r.seconds == pytest.approx(decode + prefill, rel=1e-12)
    assert r.prefill_tokens == prompt and r.cost_name == "Qwen/Qwen3-1.7B on h100"
    assert r.tokens_per_second == pytest.approx(length / r.seconds)


def test_prompt_prefill_is_chunked():
    log = prompt_prefill_log([5000, 6000], 8192)
    assert log.prefill_tokens.tolist() == [8192, 2808]
    assert log.prefill_context.sum() == 5000 * 5001 // 2 + 6000 * 6001 // 2
    assert prompt_prefill_log([5000, 6000], None).prefill_tokens.tolist() == [11000]
    assert len(prompt_prefill_log([0], 8192).steps) == 0


@settings(max_examples=80, deadline=None)
@given(prompts=st.lists(st.one_of(st.integers(0, 40), st.integers(0, 100_000)), max_size=12),
       chunk=st.one_of(st.none(), st.integers(1, 9000)), cost=st.sampled_from([COST, TIGHT]))
def test_prompt_prefill_seconds_prices_each_prompt_as_its_own_log(prompts, chunk, cost):
    got = prompt_prefill_seconds(cost, prompts, chunk)
    assert got.shape == (len(prompts),) and got.dtype == np.float64
    for p, seconds in zip(prompts, got):
        assert seconds == prompt_prefill_log([p], chunk).seconds(cost)  # the same sums, to the last bit


@settings(max_examples=60, deadline=None)
@given(data=st.data(), policy=st.sampled_from(FAST_POLICIES), size=st.integers(1, 12), lmax=st.integers(2, 120),
       cost=st.sampled_from([COST, TIGHT]))
def test_the_vectorised_path_gives_the_engines_seconds(data, policy, size, lmax, cost):
    batch = np.array(data.draw(st.lists(st.lists(st.integers(1, lmax), min_size=size, max_size=size),
                                        min_size=1, max_size=3)))
    prompts = np.array(data.draw(st.lists(st.integers(0, 9000), min_size=len(batch), max_size=len(batch))))
    budget = int(lmax * data.draw(st.integers(1, 2 * size)))
    g = slot_count(policy, slots=None, budget_tokens=budget, max_new_tokens=lmax, group_size=size)
    fast = seconds_many(batch, policy, g, cost, prompt_lens=prompts)
    for row, (lengths, p) in enumerate(zip(batch, prompts)):
        r = run_group(lengths, policy, budget_tokens=budget, max_new_tokens=lmax, prompt_len=int(p), cost=cost)
        assert fast[row] == pytest.approx(r.seconds, rel=1e-9)


@settings(max_examples=80, deadline=None)
@given(data=st.data(), policy=st.sampled_from(COMPILED_POLICIES), size=st.integers(1, 16), lmax=st.integers(4, 150),
       tight=st.floats(0.0, 1.0), chunk=st.one_of(st.none(), st.integers(1, 300)), cost=st.sampled_from([COST, TIGHT]))
def test_the_compiled_path_gives_the_engines_seconds(data, policy, size, lmax, tight, chunk, cost):
    batch = np.array(data.draw(st.lists(st.lists(st.integers(1, lmax), min_size=size, max_size=size),
                                        min_size=1, max_size=3)))
    prompts = np.array(data.draw(st.lists(st.integers(0, 70), min_size=len(batch), max_size=len(batch))))
    budget = int(batch.max() + 32 + tight * 3 * size * lmax)
    try:
        got = engine_many(batch, policy, budget_tokens=budget, max_new_tokens=lmax, prompt_lens=prompts,
                          prefill_chunk=chunk, cost=cost)
    except SimulationError:  # a group the policy cannot run (sglang's reservation): the engine says so too
        with pytest.raises(SimulationError):
            for lengths, p in zip(batch, prompts):
                run_group(lengths, policy, budget_tokens=budget, max_new_tokens=lmax, prompt_len=int(p), cost=cost,
                          prefill_chunk=chunk)
        return
    for row, (lengths, p) in enumerate(zip(batch, prompts)):
        r = run_group(lengths, policy, budget_tokens=budget, max_new_tokens=lmax, prompt_len=int(p), cost=cost,
                      prefill_chunk=chunk)
        assert (got["steps"][row], got["preemptions"][row], got["recomputed_tokens"][row]) == \
            (r.steps, r.preemptions, r.recomputed_tokens)
        assert got["seconds"][row] == pytest.approx(r.seconds, rel=1e-9)


# Policies that stay within their limits and collect what they launch (the bound is on those lengths).
BOUNDED = [p for p in policy_names(budget=True, unbiased=True)]


@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.integers(1, 200), min_size=1, max_size=16), policy=st.sampled_from(BOUNDED),
       prompt=st.integers(0, 3000), room=st.floats(1.0, 6.0), slots=st.one_of(st.none(), st.integers(1, 8)),
       predicted=st.booleans(), cost=st.sampled_from([COST, TIGHT]), chunk=st.one_of(st.none(), st.integers(1, 500)))
def test_no_policy_beats_the_lower_bound_in_seconds(lengths, policy, prompt, room, slots, predicted, cost, chunk):
    lmax = 256
    budget = int(max(lengths) + 16 + room * lmax)
    r = run_group(lengths, policy, budget_tokens=budget, slots=slots, max_new_tokens=lmax, prompt_len=prompt,
                  predicted=lengths if predicted else None, cost=cost, prefill_chunk=chunk)
    assert r.seconds >= r.lower_bound_seconds * (1 - 1e-12)
    assert r.steps >= r.lower_bound


def test_the_full_group_without_limits_also_respects_the_bound():
    lengths = [30, 200, 7, 90]
    r = run_group(lengths, "full", max_new_tokens=256, prompt_len=500)
    assert r.seconds >= r.lower_bound_seconds


def test_recomputation_costs_prefill_time():
    lengths = [180, 170, 160, 150, 140, 130]
    tight = run_group(lengths, "vllm", budget_tokens=400, max_new_tokens=200, prompt_len=100)
    assert tight.preemptions > 0 and tight.recomputed_tokens > 0
    # Every recomputed token (and each readmitted sequence's prompt tail) is prefilled in some step.
    tails = 100 % 16
    assert tight.prefill_tokens >= 100 + tight.recomputed_tokens + tails * len(lengths)
    assert tight.step_log.prefill_tokens[1:].sum() > 0


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(20, 120), min_size=2, max_size=12), chunk=st.integers(1, 200),
       policy=st.sampled_from(["vllm", "sglang", "length_aware", "growth_aware"]))
def test_a_step_prefills_at_most_a_chunk_unless_one_request_alone_needs_more(lengths, chunk, policy):
    r = run_group(lengths, policy, budget_tokens=max(lengths) + 60, max_new_tokens=128, prompt_len=37,
                  predicted=lengths, prefill_chunk=chunk)
    decode = r.step_log.rows > 0
    prefill = r.step_log.prefill_tokens[decode]
    most = max(lengths) + 37 % 16
    assert prefill.max(initial=0) <= max(chunk, most)
    unlimited = run_group(lengths, policy, budget_tokens=max(lengths) + 60, max_new_tokens=128, prompt_len=37,
                          predicted=lengths, prefill_chunk=None)
    assert r.steps >= unlimited.steps or r.preemptions != unlimited.preemptions
    assert sorted(r.collected_lengths) == sorted(lengths)


def test_a_large_chunk_changes_no_decision():
    from simulate.workloads import castillo_groups

    for g in castillo_groups(16, limit=3, seed=2, max_new_tokens=1024):
        for policy in ("vllm", "sglang", "growth_aware"):
            a = run_group(g.lengths, policy, budget_tokens=3000, max_new_tokens=1024, prompt_len=g.prompt_len,
                          predicted=g.lengths)
            b = run_group(g.lengths, policy, budget_tokens=3000, max_new_tokens=1024, prompt_len=g.prompt_len,
                          predicted=g.lengths, prefill_chunk=None)
            assert (a.steps, a.preemptions, a.recomputed_tokens) == (b.steps, b.preemptions, b.recomputed_tokens)
            assert a.seconds == pytest.approx(b.seconds)


def test_a_bad_cost_is_named():
    from lengthsched import InvalidArgument

    with pytest.raises(InvalidArgument, match="cost"):
        run_group([3], "full", max_new_tokens=4, cost="h100")
    with pytest.raises(InvalidArgument, match="prefill_chunk"):
        run_group([3], "full", max_new_tokens=4, prefill_chunk=0)


def test_seconds_rank_what_steps_hide():
    """More rows in a step are nearly free while it is bound by the weights: a 32-row step costs far
    less than 32 one-row steps; and a step reading a long context costs more than a short one."""
    one = COST.seconds(1, 100)
    assert COST.seconds(32, 32 * 100) < 2 * one
    assert COST.seconds(256, 256 * 4000) > 2 * COST.seconds(256, 256 * 100)
    assert math.isfinite(StepCost.from_model("qwen3-8b", "h100").seconds(64, 64 * 1000))
    assert set(POLICIES) >= set(BOUNDED)
