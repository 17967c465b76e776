"""plan_group: the worked examples, schedule invariants, JSON round trip, mispredictions."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conftest import unit_memory
from hypothesis import given
from hypothesis import strategies as st

from lengthsched import (
    BudgetTooSmall,
    GroupScheduler,
    InvalidArgument,
    ModelMemory,
    Plan,
    execute,
    held_bytes,
    plan_group,
)
from lengthsched.plan import GROUPINGS

EXAMPLE = [5, 3, 8, 2]
lengths_st = st.lists(st.integers(1, 60), min_size=1, max_size=14)
rules_st = st.sampled_from(["sjf", "lpt", "fcfs", "plan"])
slot_groupings_st = st.sampled_from(["fptas", "lpt", "karmarkar_karp", "none"])


def test_model_md_worked_examples():
    fcfs = plan_group(EXAMPLE, slots=2, max_new_tokens=8, refill="fcfs", grouping="none")
    assert fcfs.expected_steps == 11
    assert fcfs.expected_starts == (1, 1, 4, 6)
    oracle = plan_group(EXAMPLE, slots=2, max_new_tokens=8)
    assert oracle.expected_steps == 10
    assert oracle.lower_bound == 9
    assert sorted(map(sorted, oracle.slot_queues)) == [[0, 1], [2, 3]]  # {8, 2} and {5, 3}


def test_kv_held_after_each_step_matches_model_md():
    plan = plan_group(EXAMPLE, slots=2, max_new_tokens=8, refill="fcfs", grouping="none")
    curve = held_bytes(execute(plan), unit_memory(), prompt_tokens=0)
    assert curve[3 - 1] == 6 and curve[5 - 1] == 7  # after steps 3 and 5


def schedule_invariants(plan, schedule, slots):
    n = len(plan.lengths)
    assert sorted(schedule.admission_order.tolist()) == list(range(n))
    assert np.all(schedule.starts >= 1)
    assert schedule.max_live <= slots
    for lane in np.unique(schedule.lanes):  # completions of one slot never overlap
        mine = np.nonzero(schedule.lanes == lane)[0]
        spans = sorted(zip(schedule.starts[mine], schedule.ends[mine]))
        assert all(a_end < b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


@given(lengths=lengths_st, slots=st.integers(1, 6), rule=rules_st, grouping=slot_groupings_st)
def test_slots_mode_invariants(lengths, slots, rule, grouping):
    plan = plan_group(lengths, slots=slots, max_new_tokens=60, refill=rule, grouping=grouping)
    plan.check()
    schedule = execute(plan)
    schedule_invariants(plan, schedule, slots)
    assert plan.expected_steps == schedule.steps >= plan.lower_bound
    assert plan.expected_starts == tuple(schedule.starts.tolist())
    if grouping != "none":  # each slot runs its own queue back to back: steps = partition makespan
        assert plan.expected_steps == max(sum(lengths[j] for j in unit) for unit in plan.units)


@given(lengths=lengths_st, slots=st.integers(1, 6), rule=rules_st,
       noise=st.lists(st.integers(-30, 30), min_size=14, max_size=14))
def test_misprediction_never_truncates(lengths, slots, rule, noise):
    plan = plan_group(lengths, slots=slots, max_new_tokens=60, refill=rule)
    true = np.clip(np.asarray(lengths) + np.asarray(noise[: len(lengths)]), 1, 90)
    schedule = execute(plan, true)
    assert np.array_equal(schedule.ends - schedule.starts + 1, true)
    schedule_invariants(plan, schedule, slots)


@given(lengths=lengths_st, rule=rules_st, budget_tokens=st.integers(60, 400),
       cap=st.one_of(st.none(), st.integers(1, 6)), quantile_pad=st.integers(0, 10))
def test_budget_mode_stays_within_budget(lengths, rule, budget_tokens, cap, quantile_pad):
    memory = unit_memory()
    reserve = [min(60, x + quantile_pad) for x in lengths]
    plan = plan_group(lengths, budget_bytes=budget_tokens, memory=memory, max_new_tokens=60, refill=rule,
                      slots=cap, reserve_lengths=reserve)
    plan.check()
    schedule = execute(plan)
    schedule_invariants(plan, schedule, cap or len(lengths))
    assert plan.peak_reserved_bytes <= budget_tokens
    assert held_bytes(schedule, memory, 0).max() <= budget_tokens
    assert schedule.steps >= plan.lower_bound
    for unit in plan.micro_groups:
        assert sum(plan.reservation_bytes[j] for j in unit) <= plan.capacity_bytes


def test_budget_lower_bound_is_model_md_token_bound():
    # T = 8 tokens: steps >= max(8, (15 + 6 + 36 + 3) / 8) = 8.
    plan = plan_group(EXAMPLE, budget_bytes=8, memory=unit_memory(), max_new_tokens=8,
                      reserve_lengths=EXAMPLE)
    assert plan.lower_bound == 8
    plan = plan_group([8, 8, 8], budget_bytes=8, memory=unit_memory(), max_new_tokens=8)
    assert plan.lower_bound == 3 * 36 // 8 + 1  # ceil(108 / 8) = 14


def test_plan_with_reservations_below_the_predictions():
    plan = plan_group([10, 10, 10], budget_bytes=12, memory=unit_memory(), max_new_tokens=20, reserve_lengths=[4, 4, 4])
    assert plan.expected_steps >= 10 and sorted(plan.admission_order) == [0, 1, 2]


def test_outgrowing_a_reservation_runs_on_and_defers_admissions():
    memory = unit_memory()
    plan = plan_group([4, 4, 4], budget_bytes=8, memory=memory, max_new_tokens=20, reserve_lengths=[4, 4, 4],
                      grouping="none", refill="fcfs")
    assert plan.expected_starts == (1, 1, 5)
    with pytest.raises(InvalidArgument, match="argument 'memory'"):
        execute(plan, [10, 4, 4])
    schedule = execute(plan, [10, 4, 4], memory=memory)
    # #0 outgrows its 4 tokens; at step 4's end it will hold 5 > 4, so #2 waits until #0 ends.
    assert schedule.starts.tolist() == [1, 1, 11]
    assert np.array_equal(schedule.ends - schedule.starts + 1, [10, 4, 4])


@given(lengths=lengths_st, slots=st.integers(1, 6), rule=rules_st, budget=st.booleans())
def test_json_round_trip_is_exact(lengths, slots, rule, budget):
    kwargs = dict(budget_bytes=200, memory=unit_memory()) if budget else dict(slots=slots)
    plan = plan_group(lengths, max_new_tokens=60, refill=rule, **kwargs)
    text = plan.to_json()
    again = Plan.from_json(text)
    assert again == plan
    assert again.to_json() == text
    assert plan_group(lengths, max_new_tokens=60, refill=rule, **kwargs) == plan  # deterministic


def test_plan_json_is_self_describing():
    data = json.loads(plan_group(EXAMPLE, slots=2, max_new_tokens=8).to_json())
    assert data["format"] == "lengthsched.plan/1"
    assert data["units"] and data["admission_order"] and data["expected_steps"] == 10


@pytest.mark.parametrize(
    "mutate,name",
    [
        (lambda d: d.update(format="other/9"), "format"),
        (lambda d: d.pop("lengths"), "lengths"),
        (lambda d: d.update(units=[[0, 1], [1, 2, 3]]), "units"),
        (lambda d: d.update(eps=0), "eps"),
        (lambda d: d.update(slots=-1), "slots"),
        (lambda d: d.update(refill="random"), "refill"),
        (lambda d: d.update(expected_starts=[1]), "expected_starts"),
        (lambda d: d.update(lengths=[0, 3, 8, 2]), "lengths"),
        (lambda d: d.update(grouping="magic"), "grouping"),
    ],
)
def test_from_json_rejects_bad_plans(mutate, name):
    data = json.loads(plan_group(EXAMPLE, slots=2, max_new_tokens=8).to_json())
    mutate(data)
    with pytest.raises(InvalidArgument, match=f"argument '{name}'"):
        Plan.from_json(json.dumps(data))


def test_from_json_rejects_non_json():
    with pytest.raises(InvalidArgument, match="argument 'text'"):
        Plan.from_json("{oops")


def test_lengths_above_max_new_tokens_are_clipped():
    plan = plan_group([5, 300], slots=1, max_new_tokens=100)
    assert plan.lengths == (5, 100) and plan.expected_steps == 105


def test_priorities_follow_admission_order():
    plan = plan_group(EXAMPLE, slots=2, max_new_tokens=8, refill="fcfs", grouping="none")
    assert plan.priorities() == (0, 1, 2, 3)
    ranks = plan.priorities()
    assert [plan.admission_order[r] for r in ranks] == [0, 1, 2, 3]


def test_slot_mode_with_memory_reports_fixed_slot_reservation():
    memory = ModelMemory.from_preset("qwen3-1.7b")
    plan = plan_group([100] * 8, slots=4, memory=memory, prompt_tokens=50, max_new_tokens=1000)
    c = memory.kv_bytes_per_token
    expected = memory.weights_bytes + 50 * c + 4 * (1000 * c + memory.activation_bytes_per_sequence)
    assert plan.peak_reserved_bytes == expected


def test_large_group_plans():
    rng = np.random.default_rng(0)
    lengths = rng.integers(50, 2000, size=1024)
    plan = plan_group(lengths, slots=64, max_new_tokens=2048)
    assert plan.ratio <= 1.05
    assert len(plan.admission_order) == 1024


def test_group_scheduler_integrity_through_a_run():
    plan = plan_group([9, 4, 7, 1, 3, 8, 2], slots=3, max_new_tokens=10)
    sched = GroupScheduler.from_plan(plan)
    sched.check_integrity()
    sched.update_prediction(plan.units[0][-1], 1)  # a re-prediction moves it to the front under SJF
    sched.check_integrity()
    assert sched.next_for_slot(0) == plan.units[0][-1]
    started = []
    while sched.pending:
        for slot in range(3):
            job = sched.next_for_slot(slot)
            if job is not None:
                sched.take(job)
                started.append(job)
                sched.check_integrity()
    assert sorted(started) == list(range(7))
    with pytest.raises(InvalidArgument, match="argument 'job'"):
        sched.take(started[0])
    # A preempted completion goes back to its own queue and is the next one its slot takes.
    unit = next(u for u, members in enumerate(plan.units) if started[0] in members)
    sched.requeue(started[0], 2)
    sched.check_integrity()
    assert sched.pending == 1 and sched.next_for_slot(unit) == started[0]
    with pytest.raises(InvalidArgument, match="argument 'job'"):
        sched.requeue(started[0], 2)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(lengths=[3, -1], slots=2), "lengths"),
        (dict(lengths=[3, 0], slots=2), "lengths"),
        (dict(lengths=[3, 2.5], slots=2), "lengths"),
        (dict(lengths=[3, 4]), "slots"),
        (dict(lengths=[3, 4], slots=0), "slots"),
        (dict(lengths=[3, 4], budget_bytes=100), "memory"),
        (dict(lengths=[3, 4], slots=2, eps=0), "eps"),
        (dict(lengths=[3, 4], slots=2, refill="random"), "refill"),
        (dict(lengths=[3, 4], slots=2, grouping="magic"), "grouping"),
        (dict(lengths=[3, 4], slots=2, reserve_lengths=[3]), "reserve_lengths"),
        (dict(lengths=[3, 4], slots=2, max_new_tokens=0), "max_new_tokens"),
        (dict(lengths=[3, 4], slots=2, memory="qwen3"), "memory"),
    ],
)
def test_bad_input_names_the_argument(kwargs, name):
    kwargs.setdefault("max_new_tokens", 10)
    with pytest.raises(InvalidArgument, match=f"argument '{name}'"):
        plan_group(**kwargs)


def test_budget_too_small_for_one_sequence():
    memory = ModelMemory.from_preset("qwen3-1.7b")
    with pytest.raises(BudgetTooSmall, match="argument 'budget_bytes'.*completion 0"):
        plan_group([100], budget_bytes=memory.weights_bytes + 10, memory=memory, max_new_tokens=1000)
    with pytest.raises(InvalidArgument, match="argument 'grouping'"):
        plan_group([100], budget_bytes=10**12, memory=memory, max_new_tokens=1000, grouping="lpt")


def test_every_grouping_is_accepted_in_slots_mode():
    for grouping in GROUPINGS:
        plan = plan_group(EXAMPLE, slots=2, max_new_tokens=8, grouping=grouping)
        assert plan.expected_steps in (10, 11)
        assert dataclasses.replace(plan) == plan


def test_fcfs_requeue_keeps_the_completions_place():
    sched = GroupScheduler([tuple(range(5))], [9, 9, 9, 9, 9], "fcfs")
    for job in (0, 1, 2):
        sched.take(job)
    sched.requeue(2, 9)
    sched.check_integrity()
    assert sched.next_in_order() == 2
