"""lengthsched.runtime: one registry, the public stepping API, one budget rule, the token path of plans."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthsched import InvalidArgument, ModelMemory, plan_group
from lengthsched.peaks import Policy
from lengthsched.runtime import (
    POLICIES,
    Engine,
    PolicySpec,
    Problem,
    decode_batch,
    kv_budget_tokens,
    make_policy,
    policy_names,
)


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


def test_the_registry_says_which_policies_resubmit_moves_and_which_poll():
    """run_rollout's resubmit_seconds and snapshot_seconds, and the CLI's --resubmit-seconds and --poll-seconds,
    apply to the policies whose spec says so (one rule, read from the registry)."""
    resubmit = ["steal", "steal_longest", "steal_classes", "steal_sglang", "steal_observed"]
    assert [n for n, s in POLICIES.items() if s.resubmits] == resubmit
    assert [n for n, s in POLICIES.items() if s.polls] == ["steal_observed"]
    assert all(POLICIES[n].dispatch and POLICIES[n].rollout for n, s in POLICIES.items() if s.resubmits)
    # how a rollout times the KV a policy loads from a global pool: Seer's divided rollout overlaps its loads
    assert {n: s.loads for n, s in POLICIES.items() if s.loads != "stall"} == {"seer_divided": "async"}


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


def _online(**options):
    from lengthsched import OnlineLengthPredictor

    return OnlineLengthPredictor(prior=400, within_sigma=0.15, prior_sigma=0.6, **options)


@pytest.mark.parametrize("policy", ["length_aware", "growth_aware", "growth_aware_lpt"])
def test_an_online_predictor_learns_from_finished_siblings_during_the_run(policy):
    """The runtime tells the predictor every finish, and the running siblings' progress, and asks it
    again about the pending (and, growth-aware, running) siblings after each finish."""
    from lengthsched import OnlineLengthPredictor
    from simulate import run_group

    class Spy(OnlineLengthPredictor):
        def __init__(self, **options):
            super().__init__(**options)
            self.calls, self.finished, self.censored = [], 0, 0

        def observe(self, prompt, length, *, finished=True, completion=None, step=None):
            self.finished += finished
            self.censored += not finished
            super().observe(prompt, length, finished=finished, completion=completion, step=step)

        def predict(self, prompts, prefixes=None, *, quantiles=()):
            self.calls.append((self.finished, len(prompts)))
            return super().predict(prompts, prefixes, quantiles=quantiles)

    lengths = [900, 950, 880, 920, 60, 910, 930, 890]
    spy = Spy(prior=400, within_sigma=0.15, prior_sigma=0.6)
    r = run_group(lengths, policy, budget_tokens=3000, max_new_tokens=1024, predicted=spy, prompt_id="p")
    assert sorted(r.collected_lengths) == sorted(lengths)
    assert spy.finished == len(lengths) and spy.censored > 0  # every finish once; running ones censored
    assert spy.calls[0] == (0, len(lengths))  # the plan, before anything is known
    assert any(done > 0 and asked > 0 for done, asked in spy.calls)  # asked again once siblings finished
    mean, _ = spy.belief("p")
    assert abs(np.exp(mean) - np.exp(np.mean(np.log(lengths)))) < 0.2 * np.mean(lengths)


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(5, 200), min_size=3, max_size=10), bump=st.integers(1, 100),
       policy=st.sampled_from(["length_aware", "growth_aware"]))
def test_decisions_never_depend_on_a_length_not_yet_revealed(lengths, bump, policy):
    """Lengthen the last completion to finish: every decision before it finishes is the same."""
    from simulate import run_group

    last = int(np.argmax(lengths))
    longer = list(lengths)
    longer[last] += bump
    runs = [run_group(ls, policy, budget_tokens=max(longer) + 150, max_new_tokens=512, predicted=_online(),
                      prompt_id="p", record=True) for ls in (lengths, longer)]
    reveal = min(min(s[3] for s in r.timeline.segments if s[0] == last and s[4] == "run") for r in runs)
    before = [sorted(s[:3] for s in r.timeline.segments if s[2] < reveal) for r in runs]
    assert before[0] == before[1]
