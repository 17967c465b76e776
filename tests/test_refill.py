"""Refill queues pop in exactly the order of a sorted reference, through adds, removals and
re-predictions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lengthsched import InvalidArgument, RefillRule, make_refill_queue
from lengthsched.refill import FCFSQueue, LPTQueue, PlanOrderQueue, SJFQueue, parse_rule


def reference_key(rule, job, remaining, rank, arrival):
    """Sort key of the reference model; ranks are always given in these tests."""
    return {
        RefillRule.SJF: (remaining, job),
        RefillRule.LPT: (-remaining, job),
        RefillRule.FCFS: (rank, job),  # the arrival rank given when added
        RefillRule.PLAN: (rank, job),
    }[rule]


ops_st = st.lists(
    st.tuples(st.sampled_from(["add", "add_many", "pop", "remove", "update"]), st.integers(0, 15),
              st.integers(0, 50), st.integers(0, 20)),
    max_size=60,
)


@pytest.mark.parametrize("rule", list(RefillRule))
@given(ops=ops_st)
def test_pop_order_matches_sorted_reference(rule, ops):
    queue = make_refill_queue(rule)
    model: dict[int, tuple[int, int, int]] = {}  # job -> (remaining, rank, arrival)
    arrivals = 0
    for op, job, remaining, rank in ops:
        if op == "add" and job not in model:
            queue.add(job, remaining, rank)
            model[job] = (remaining, rank, arrivals)
            arrivals += 1
        elif op == "add_many":
            jobs = [j for j in range(job, job + 3) if j not in model]
            queue.add_many(jobs, [remaining + j for j in jobs], [rank + j for j in jobs])
            for j in jobs:
                model[j] = (remaining + j, rank + j, arrivals)
                arrivals += 1
        elif op == "pop" and model:
            expected = min(model, key=lambda j: reference_key(rule, j, *model[j]))
            assert queue.peek() == expected
            assert queue.pop() == expected
            del model[expected]
        elif op == "remove" and job in model:
            queue.remove(job)
            del model[job]
        elif op == "update" and job in model:
            queue.update(job, remaining)
            model[job] = (remaining, *model[job][1:])
        queue.check_integrity()
        assert len(queue) == len(model)
        assert list(queue) == sorted(model, key=lambda j: reference_key(rule, j, *model[j]))
    drained = [queue.pop() for _ in range(len(queue))]
    assert drained == sorted(model, key=lambda j: reference_key(rule, j, *model[j]))


def test_factory_and_enum():
    assert isinstance(make_refill_queue("sjf"), SJFQueue)
    assert isinstance(make_refill_queue(RefillRule.LPT), LPTQueue)
    assert isinstance(make_refill_queue("fcfs"), FCFSQueue)
    assert isinstance(make_refill_queue("plan"), PlanOrderQueue)
    assert parse_rule("sjf") is RefillRule.SJF
    with pytest.raises(InvalidArgument, match="argument 'refill': got 'shortest'"):
        make_refill_queue("shortest")


def test_queue_errors_name_the_job():
    queue = make_refill_queue("sjf")
    queue.add(3, 10)
    with pytest.raises(InvalidArgument, match="argument 'job'"):
        queue.add(3, 5)
    with pytest.raises(InvalidArgument, match="argument 'job'"):
        queue.remove(4)
    with pytest.raises(InvalidArgument, match="argument 'remaining'"):
        queue.update(3, -1)
    queue.check_integrity()  # a rejected update leaves the queue as it was
    assert queue.remaining(3) == 10
    with pytest.raises(InvalidArgument, match="argument 'job'"):
        queue.add(-1, 5)
    with pytest.raises(InvalidArgument, match="argument 'jobs'"):
        queue.add_many([7, 7], [1, 2])
    with pytest.raises(InvalidArgument, match="argument 'remaining'"):
        queue.add_many([7, 8], [1])
    assert list(queue) == [3]  # rejected batches add nothing
    queue.pop()
    with pytest.raises(IndexError):
        queue.pop()
