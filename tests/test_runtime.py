"""lengthsched.runtime: one registry, the public stepping API, one budget rule, the token path of plans."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthsched import InvalidArgument, ModelMemory, plan_group
from lengthsched.peaks import Policy
from lengthsched.runtime import (POLICIES, Engine, PolicySpec, Problem, decode_batch, kv_budget_tokens, make_policy,
                                 policy_names)


def test_every_list_of_policies_derives_from_the_registry():
    from sampler.core import SAMPLER_POLICIES
    from simulate import POLICIES as SIM_POLICIES
    from simulate.compiled import COMPILED_POLICIES
    from simulate.fast import FAST_POLICIES

    assert SIM_POLICIES is POLICIES
    assert all(isinstance(spec, PolicySpec) and spec.name == name for name, spec in POLICIES.items())
    assert FAST_POLICIES == policy_names(fast=True) == ("full", "full_freed", "micro", "fixed_slot", "reserve_max")
    assert COMPILED_POLICIES == policy_names(compiled=True) == ("vllm", "sglang")
    assert SAMPLER_POLICIES == policy_names(sampler=True) == tuple(POLICIES)
    assert [p.value for p in Policy] == ["full", "micro", "continuous", "length_aware"]
    assert policy_names(unbiased=False) == ("dynamic_slot",)
    with pytest.raises(InvalidArgument, match="supports"):
        policy_names(bogus=True)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_spec_builds_its_policy_and_honours_needs_budget(name):
    spec = POLICIES[name]
    problem = Problem(lengths=np.array([3, 5, 2]), max_new_tokens=8, slots=2, budget_tokens=16,
                      stream=lambda i: 4)
    policy = spec(problem)
    assert policy.name == name
    if spec.needs_budget:
        with pytest.raises(InvalidArgument, match="budget_tokens"):
            make_policy(name, Problem(lengths=np.array([3]), max_new_tokens=8, slots=2))


def _run_by_hand(lengths, name, **limits):
    """The engine driven through its public stepping API, one decode step at a time, as the sampler does."""
    problem = Problem(lengths=np.asarray(lengths), max_new_tokens=max(lengths), **limits)
    policy = make_policy(name, problem)
    eng = Engine(lengths, slots=limits.get("slots"), budget_tokens=limits.get("budget_tokens"),
                 enforce_budget=policy.promises_budget)
    eng.start(policy)
    while eng.decide(policy):
        eng.step(policy.pads)
    return eng


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 30), min_size=1, max_size=10),
       name=st.sampled_from(["micro", "fixed_slot", "length_aware", "growth_aware", "vllm", "sglang"]))
def test_stepping_one_step_at_a_time_equals_jumping_event_to_event(lengths, name):
    limits = dict(budget_tokens=max(lengths) + 40, slots=3)
    problem = Problem(lengths=np.asarray(lengths), max_new_tokens=max(lengths), **limits)
    policy = make_policy(name, problem)
    jumped = Engine(lengths, slots=3, budget_tokens=limits["budget_tokens"], enforce_budget=policy.promises_budget,
                    block_size=policy.block_size).run(policy)
    if policy.block_size > 1:
        return  # the by-hand engine above is token-granular; vllm's blocks are covered by the sampler's replay
    stepped = _run_by_hand(lengths, name, **limits)
    assert (stepped.t, stepped.collected, stepped.preemptions) == (jumped.t, jumped.collected, jumped.preemptions)
    assert stepped.step_log().steps.sum() == jumped.step_log().steps.sum() == jumped.t


def test_finish_reveals_an_earlier_end():
    eng = Engine([10, 10])
    policy = make_policy("fixed_slot", Problem(lengths=np.array([10, 10]), max_new_tokens=10, slots=1))
    eng.start(policy)
    assert eng.decide(policy)
    eng.step(policy.pads)
    eng.finish(0, 2)  # completion 0 sampled its stop token at step 2
    eng.step(policy.pads)
    assert eng.collected == [0] and eng.finished_at[0] == 2


def test_advance_refuses_to_go_back():
    from lengthsched.runtime import SimulationError

    eng = Engine([3])
    with pytest.raises(SimulationError, match="not after"):
        eng.advance(0, False)


def test_one_budget_rule_counts_activations_for_the_decode_batch():
    memory = ModelMemory.from_preset("qwen3-1.7b")
    budget = 6 * 2**30
    assert decode_batch(32) == 32 and decode_batch(32, 4) == 4 and decode_batch(3, 8) == 3
    full = kv_budget_tokens(memory, budget, prompt_tokens=300, group_size=32)
    capped = kv_budget_tokens(memory, budget, prompt_tokens=300, group_size=32, slots=4)
    assert full == memory.kv_token_budget(budget, prompt_tokens=300, batch=32)
    assert capped == memory.kv_token_budget(budget, prompt_tokens=300, batch=4) > full
    with pytest.raises(InvalidArgument, match="slots"):
        decode_batch(4, 0)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 60), min_size=1, max_size=12), data=st.data())
def test_a_plan_in_kv_tokens_equals_one_in_bytes_of_one_byte_per_token(lengths, data):
    reserve = data.draw(st.lists(st.integers(1, 60), min_size=len(lengths), max_size=len(lengths)))
    budget = data.draw(st.integers(max(max(reserve), 1), 400))
    slots = data.draw(st.one_of(st.none(), st.integers(1, 6)))
    one_byte = ModelMemory(name="tokens", layer_kv_bytes=(1,), layer_windows=(None,), weights_bytes=0,
                           activation_bytes_per_sequence=0)
    in_bytes = plan_group(lengths, max_new_tokens=60, budget_bytes=budget, memory=one_byte, slots=slots,
                          reserve_lengths=reserve)
    in_tokens = plan_group(lengths, max_new_tokens=60, budget_tokens=budget, slots=slots, reserve_lengths=reserve)
    assert in_tokens.capacity_tokens == in_bytes.capacity_bytes == budget
    assert in_tokens.reservation_tokens == in_bytes.reservation_bytes
    assert in_tokens.capacity_bytes is None and in_tokens.reservations == in_bytes.reservations
    for field in ("units", "admission_order", "expected_starts", "expected_steps", "lower_bound"):
        assert getattr(in_tokens, field) == getattr(in_bytes, field)
    type(in_tokens).from_json(in_tokens.to_json())  # round trip in tokens too


def test_the_token_path_checks_its_budget():
    with pytest.raises(InvalidArgument, match="budget_tokens"):
        plan_group([5, 5], max_new_tokens=10, budget_tokens=4, reserve_lengths=[5, 5])
    with pytest.raises(InvalidArgument, match="budget_tokens"):
        plan_group([5, 5], max_new_tokens=10, budget_tokens=40, budget_bytes=100,
                   memory=ModelMemory.from_preset("qwen3-1.7b"))
