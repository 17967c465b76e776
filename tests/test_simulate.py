"""The simulator: closed forms, conservation, budgets, lower bounds, bias, determinism."""

from __future__ import annotations

import heapq

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lengthsched import InvalidArgument, NoisyOracleLengthPredictor
from simulate import POLICIES, SimulationError, run_batch, run_group
from simulate.workloads import Group

EXAMPLE = [5, 3, 8, 2]
lengths_st = st.lists(st.integers(1, 80), min_size=1, max_size=16)
BUDGET_POLICIES = ["micro", "fixed_slot", "dynamic_slot", "length_aware", "length_aware_lpt", "length_aware_fcfs",
                   "growth_aware", "growth_aware_lpt", "growth_aware_fcfs", "vllm", "sglang", "reserve_max"]
UNBIASED_LIMITED = [p for p in BUDGET_POLICIES if p != "dynamic_slot"]


def list_schedule(lengths, g):
    """Reference: FCFS list scheduling on g slots, a slot freed after step t refilled at t + 1."""
    free = [0] * g
    end = 0
    for length in lengths:
        start = heapq.heappop(free)
        heapq.heappush(free, start + length)
        end = max(end, start + length)
    return end


def test_every_model_md_policy_is_named():
    for name in ("full", "micro", "fixed_slot", "dynamic_slot", "length_aware", "vllm", "sglang", "reserve_max"):
        assert name in POLICIES


def test_worked_example():
    assert run_group(EXAMPLE, "full", max_new_tokens=8).steps == 8
    assert run_group(EXAMPLE, "micro", slots=2, max_new_tokens=8).steps == 13
    assert run_group(EXAMPLE, "fixed_slot", slots=2, max_new_tokens=8).steps == 11
    assert run_group(EXAMPLE, "length_aware", slots=2, max_new_tokens=8, predicted=EXAMPLE).steps == 10
    assert run_group(EXAMPLE, "length_aware", slots=2, max_new_tokens=8).steps == 11  # no predictions: index order


@given(lengths=lengths_st, g=st.integers(1, 6))
def test_closed_forms(lengths, g):
    assert run_group(lengths, "full", max_new_tokens=80).steps == max(lengths)
    rounds = sum(max(lengths[i: i + g]) for i in range(0, len(lengths), g))
    assert run_group(lengths, "micro", slots=g, max_new_tokens=80).steps == rounds
    assert run_group(lengths, "fixed_slot", slots=g, max_new_tokens=80).steps == list_schedule(lengths, g)
    # reserve-max keeps budget // L_max slots and never preempts: fixed slots by another name.
    assert run_group(lengths, "reserve_max", budget_tokens=g * 80, max_new_tokens=80).steps == list_schedule(lengths, g)


def test_padded_full_group_holds_g_times_max():
    padded = run_group(EXAMPLE, "full", max_new_tokens=8)
    freed = run_group(EXAMPLE, "full_freed", max_new_tokens=8)
    assert padded.peak_kv_tokens == 4 * 8
    assert freed.peak_kv_tokens == 10  # 5 steps x 2 live sequences


@given(lengths=lengths_st, policy=st.sampled_from(UNBIASED_LIMITED), budget=st.integers(80, 400),
       slots=st.one_of(st.none(), st.integers(1, 6)), sigma=st.sampled_from([0.0, 0.3, 1.0]),
       seed=st.integers(0, 3))
def test_conservation_budget_and_lower_bound(lengths, policy, budget, slots, sigma, seed):
    predicted = lengths if sigma == 0 else NoisyOracleLengthPredictor(lengths, sigma=sigma, seed=seed)
    r = run_group(lengths, policy, slots=slots, budget_tokens=budget, predicted=predicted, max_new_tokens=80,
                  seed=seed, record=True)
    # every completion finishes exactly once, with its full length, each token decoded once
    assert sorted(r.collected_lengths.tolist()) == sorted(lengths)
    assert r.tokens == sum(lengths) and r.decoded_tokens == sum(lengths)
    assert r.discarded_tokens == 0
    assert (r.recomputed_tokens > 0) <= (r.preemptions > 0)
    runs = {}
    for job, _lane, first, last, kind in r.timeline.segments:
        if kind in ("run", "preempted"):
            runs[job] = runs.get(job, 0) + last - first + 1
    assert sorted(runs) == list(range(len(lengths)))
    assert all(runs[j] == lengths[j] for j in runs)
    # the budget and the slots hold, so the lower bound does too
    assert r.peak_kv_tokens <= budget
    assert slots is None or r.max_live <= slots
    assert r.steps >= r.lower_bound


def test_preemption_recomputes_and_never_truncates():
    lengths = [60] * 6
    r = run_group(lengths, "vllm", budget_tokens=160, max_new_tokens=64)
    assert r.preemptions > 0 and r.recomputed_tokens > 0
    assert r.decoded_tokens == sum(lengths) and r.peak_kv_tokens <= 160
    s = run_group(lengths, "sglang", budget_tokens=160, max_new_tokens=64)
    assert s.decoded_tokens == sum(lengths) and s.peak_kv_tokens <= 160


def test_vllm_holds_whole_blocks_and_copies_the_prompt_tail():
    r = run_group([20, 20], "vllm", budget_tokens=4096, max_new_tokens=64, prompt_len=37)
    # each sequence: 5-token prompt tail + 20 generated = 25 tokens -> 2 blocks of 16
    assert r.peak_kv_tokens == 2 * 32


def test_growth_aware_with_oracle_never_preempts_and_fills_memory_better_than_reservations():
    rng = np.random.default_rng(0)
    lengths = rng.integers(100, 400, size=32)
    growth = run_group(lengths, "growth_aware", budget_tokens=2000, max_new_tokens=512, predicted=lengths)
    reserve = run_group(lengths, "length_aware", budget_tokens=2000, max_new_tokens=512, predicted=lengths)
    micro = run_group(lengths, "micro", budget_tokens=2000, max_new_tokens=512)
    assert growth.preemptions == 0
    assert growth.steps <= reserve.steps < micro.steps


def test_noisy_predictions_overflow_is_preempted_not_exceeded():
    rng = np.random.default_rng(1)
    lengths = rng.integers(50, 300, size=24)
    predictor = NoisyOracleLengthPredictor(lengths, sigma=1.0, seed=0)
    for policy in ("length_aware", "growth_aware"):
        r = run_group(lengths, policy, budget_tokens=900, max_new_tokens=512, predicted=predictor, quantile=0.5)
        assert r.peak_kv_tokens <= 900 and r.decoded_tokens == lengths.sum()


def test_dynamic_slot_is_biased_and_fixed_slot_is_not():
    from scipy.stats import ks_2samp

    rng = np.random.default_rng(0)
    true, dynamic, fixed = [], [], []
    for seed in range(40):
        lengths = np.clip(np.rint(300 * np.exp(0.8 * rng.standard_normal(16))), 1, 4096).astype(int)
        true.append(lengths)
        dynamic.append(run_group(lengths, "dynamic_slot", slots=4, max_new_tokens=4096, seed=seed).collected_lengths)
        fixed.append(run_group(lengths, "fixed_slot", slots=4, max_new_tokens=4096, seed=seed).collected_lengths)
    true, dynamic, fixed = map(np.concatenate, (true, dynamic, fixed))
    assert ks_2samp(fixed, true).statistic == 0
    assert ks_2samp(dynamic, true).statistic > 0.05
    assert dynamic.mean() < 0.9 * true.mean()


def test_dynamic_slot_collects_g_and_discards_the_rest():
    r = run_group([50, 1, 1, 1], "dynamic_slot", slots=2, max_new_tokens=64, seed=0)
    assert len(r.collected_lengths) == 4 and r.discarded_tokens > 0
    assert r.decoded_tokens == r.tokens + r.discarded_tokens
    # four finish on the step that reaches G = 2: only two are collected, the others discarded
    tie = run_group([5, 5], "dynamic_slot", slots=4, max_new_tokens=10, seed=0)
    assert tie.collected_lengths.tolist() == [5, 5] and tie.tokens == 10
    assert tie.decoded_tokens == tie.tokens + tie.discarded_tokens == 20


def test_predictions_beyond_the_budget_run_alone_instead_of_deadlocking():
    lengths = [30, 40, 50]
    for policy in ("growth_aware", "length_aware"):
        r = run_group(lengths, policy, budget_tokens=60, max_new_tokens=4096, predicted=[4096] * 3)
        assert sorted(r.collected_lengths.tolist()) == lengths and r.peak_kv_tokens <= 60


def test_batches_check_every_prompt_whatever_the_order():
    a, b = Group("a", 0, np.array([10, 10])), Group("b", 15, np.array([10, 10]))
    for order in ([a, b], [b, a]):
        with pytest.raises(InvalidArgument, match="argument 'budget_tokens'.*vllm"):
            run_batch(order, "vllm", budget_tokens=16, max_new_tokens=16)


@given(lengths=lengths_st, policy=st.sampled_from(sorted(POLICIES)), seed=st.integers(0, 5))
def test_deterministic_under_a_seed(lengths, policy, seed):
    kwargs = dict(slots=3, budget_tokens=200, max_new_tokens=80, seed=seed,
                  predicted=NoisyOracleLengthPredictor(lengths, sigma=0.5, seed=seed))
    a, b = run_group(lengths, policy, **kwargs), run_group(lengths, policy, **kwargs)
    assert (a.steps, a.peak_kv_tokens, a.preemptions, a.collected_lengths.tolist()) == \
           (b.steps, b.peak_kv_tokens, b.preemptions, b.collected_lengths.tolist())


def test_groups_sharing_a_budget():
    groups = [Group("a", 100, np.array([30, 40, 50])), Group("b", 20, np.array([10, 60]))]
    r = run_batch(groups, "growth_aware", budget_tokens=120, max_new_tokens=64,
                  predicted=np.array([30, 40, 50, 10, 60]))
    assert r.prompt_tokens == 120 and sorted(r.collected_lengths.tolist()) == [10, 30, 40, 50, 60]
    assert r.peak_kv_tokens <= 120
    with pytest.raises(InvalidArgument, match="argument 'groups'"):
        run_batch([], "micro", slots=2, max_new_tokens=64)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(lengths=[5, 3], policy="magic", slots=2), "policy"),
        (dict(lengths=[5, 3], policy="micro"), "slots"),
        (dict(lengths=[5, 3], policy="growth_aware", slots=2), "budget_tokens"),
        (dict(lengths=[5, 3], policy="micro", budget_tokens=4), "budget_tokens"),
        (dict(lengths=[5, 30], policy="micro", slots=2), "lengths"),
        (dict(lengths=[5, -3], policy="micro", slots=2), "lengths"),
        (dict(lengths=[5, 3], policy="micro", slots=0), "slots"),
        (dict(lengths=[5, 3], policy="length_aware", slots=2, predicted=[5]), "predicted"),
        (dict(lengths=[5, 3], policy="vllm", budget_tokens=10), "budget_tokens"),
        (dict(lengths=[5, 3], policy="vllm", slots=2), "budget_tokens"),
        (dict(lengths=[5, 3], policy="sglang", slots=2), "budget_tokens"),
        (dict(lengths=[5, 30], policy="growth_aware", budget_tokens=20, max_new_tokens=40), "budget_tokens"),
    ],
)
def test_bad_input_names_the_argument(kwargs, name):
    kwargs.setdefault("max_new_tokens", 10)
    with pytest.raises(InvalidArgument, match=f"argument '{name}'"):
        run_group(**kwargs)


def test_engine_refuses_a_policy_that_breaks_its_promise():
    from lengthsched.runtime import Engine

    class Greedy:
        name, pads, block_size, promises_budget, respects_slots = "greedy", False, 1, True, True

        def start(self, eng):
            pass

        def decide(self, eng):
            for job in range(eng.n):
                if job not in eng.origin and not eng.finished_at[job]:
                    eng.admit(job)

        def wakeup(self, eng):
            return None

        def pending(self, eng):
            return 0

    with pytest.raises(SimulationError, match="budget"):
        Engine([10, 10], budget_tokens=5, enforce_budget=True).run(Greedy())


@given(data=st.data(), size=st.integers(1, 12), g=st.integers(1, 6),
       policy=st.sampled_from(["full", "full_freed", "micro", "fixed_slot", "reserve_max"]))
def test_vectorised_fast_path_equals_the_engine(data, size, g, policy):
    from simulate.fast import steps_and_peaks

    batch = np.array(data.draw(st.lists(st.lists(st.integers(1, 60), min_size=size, max_size=size),
                                        min_size=1, max_size=5)))
    fast = steps_and_peaks(batch, policy, g)
    for row, lengths in enumerate(batch):
        limits = {"budget_tokens": g * 60} if policy == "reserve_max" else {"slots": g}
        r = run_group(lengths, policy, max_new_tokens=60, **({} if policy.startswith("full") else limits))
        assert (r.steps, r.peak_kv_tokens) == (fast["steps"][row], fast["peak_kv"][row])
