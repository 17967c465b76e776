"""Decide, execute, account: running a plan at decode-step granularity.

- decide: :class:`GroupScheduler` answers "which pending completion starts now" from a plan's
  units (slot queues or micro groups) and its refill rule. Engines, the simulator and the
  reference sampler call it.
- execute: :func:`execute` is an event-driven list scheduler (it jumps from one finish to the
  next) that runs every completion for exactly its length; with the predicted lengths it gives a
  plan's expected steps, with true lengths what a misprediction costs.
- account: :func:`held_bytes` is the exact bytes-held curve of a schedule under a memory model.

Time follows docs/model.md section 2: a completion of length l started at step s is active on steps
s .. s + l - 1, and a slot freed at the end of step t is refilled at step t + 1.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import InvalidArgument, LengthschedError, as_lengths
from .refill import RefillQueue, make_refill_queue

if TYPE_CHECKING:
    from .memory import ModelMemory
    from .plan import Plan

__all__ = ["GroupScheduler", "Schedule", "execute", "held_bytes"]


class GroupScheduler:
    """Which pending completion of a group starts next, by the plan's units and refill rule.

    Slots mode: a freed slot ``s`` takes the next completion of its own queue ``units[s]`` by the
    rule; when that queue is empty it takes one from the queue with the most predicted work left
    (so a misprediction never leaves a slot idle while work is pending). Budget mode: the next
    completion comes from the earliest micro group that still has pending ones.
    """

    def __init__(self, units: Any, lengths: Any, rule: str):
        self._queues: list[RefillQueue] = []
        self._unit_of: dict[int, int] = {}  # pending completions -> their unit
        self._work: list[int] = []
        predicted = [int(x) for x in lengths]
        for u, unit in enumerate(units):
            queue = make_refill_queue(rule)
            for job in unit:
                if job in self._unit_of or not 0 <= job < len(predicted):
                    raise InvalidArgument("units", units, f"each completion 0..{len(predicted) - 1} at most once")
                self._unit_of[job] = u
            queue.add_many(unit, [predicted[j] for j in unit], range(len(unit)))
            self._queues.append(queue)
            self._work.append(sum(predicted[j] for j in unit))
        # Where each completion belongs (unit, rank in it), for requeue after a preemption.
        self._home = {j: (u, r) for u, unit in enumerate(units) for r, j in enumerate(unit)}
        self._first = 0  # earliest unit that may still hold pending completions

    @classmethod
    def from_plan(cls, plan: Plan) -> GroupScheduler:
        return cls(plan.units, plan.lengths, plan.refill)

    @property
    def pending(self) -> int:
        """Completions not started yet."""
        return len(self._unit_of)

    def pending_jobs(self) -> list[int]:
        """The completions not started yet (in no particular order)."""
        return list(self._unit_of)

    def next_for_slot(self, slot: int) -> int | None:
        """The completion a freed ``slot`` should start (not yet taken), or None if none is pending."""
        if slot < len(self._queues) and len(self._queues[slot]):
            return self._queues[slot].peek()
        if not self._unit_of:
            return None
        busiest = max(range(len(self._queues)), key=lambda u: (self._work[u] if len(self._queues[u]) else -1, -u))
        return self._queues[busiest].peek()

    def next_in_order(self) -> int | None:
        """The next completion of the earliest micro group with pending ones, or None."""
        while self._first < len(self._queues) and not len(self._queues[self._first]):
            self._first += 1
        return self._queues[self._first].peek() if self._first < len(self._queues) else None

    def take(self, job: int) -> None:
        """Mark ``job`` as started."""
        unit = self._unit_of.pop(job, None)
        if unit is None:
            raise InvalidArgument("job", job, "a pending completion")
        self._work[unit] -= self._queues[unit].remaining(job)
        self._queues[unit].remove(job)

    def requeue(self, job: int, remaining: int) -> None:
        """Put a started completion back as pending (it was preempted), with its predicted
        remaining length (tokens), into the unit it came from."""
        if job not in self._home or job in self._unit_of:
            raise InvalidArgument("job", job, "a started completion of this group")
        unit, rank = self._home[job]
        self._queues[unit].add(job, remaining, rank=rank)
        self._unit_of[job] = unit
        self._work[unit] += int(remaining)
        self._first = min(self._first, unit)

    def update_prediction(self, job: int, remaining: int) -> None:
        """A new predicted remaining length (tokens) for a pending completion."""
        unit = self._unit_of.get(job)
        if unit is None:
            raise InvalidArgument("job", job, "a pending completion")
        queue = self._queues[unit]
        self._work[unit] += int(remaining) - queue.remaining(job)
        queue.update(job, remaining)

    def check_integrity(self) -> None:
        """Raise if queues, unit index and work totals disagree."""
        for u, queue in enumerate(self._queues):
            queue.check_integrity()
            jobs = [j for j, v in self._unit_of.items() if v == u]
            if sorted(jobs) != sorted(queue) or self._work[u] != sum(queue.remaining(j) for j in jobs):
                raise LengthschedError(f"GroupScheduler: unit {u} bookkeeping is inconsistent")


@dataclass(frozen=True)
class Schedule:
    """When each completion ran: ``starts[i]`` is its first step and ``lanes[i]`` the slot it ran
    in. Arrays are indexed by completion; ``admission_order`` lists completions by start."""

    lengths: np.ndarray
    starts: np.ndarray
    lanes: np.ndarray
    admission_order: np.ndarray

    @property
    def ends(self) -> np.ndarray:
        """Last step of each completion."""
        return self.starts + self.lengths - 1

    @property
    def steps(self) -> int:
        """Makespan in decode steps."""
        return int(self.ends.max())

    @property
    def max_live(self) -> int:
        """Most completions decoding in one step."""
        events = np.concatenate((np.stack([self.starts, np.ones_like(self.starts)], 1),
                                 np.stack([self.ends + 1, -np.ones_like(self.ends)], 1)))
        events = events[np.lexsort((events[:, 1], events[:, 0]))]
        return int(np.cumsum(events[:, 1]).max())


def execute(plan: Plan, lengths: Any = None, *, memory: ModelMemory | None = None) -> Schedule:
    """Run ``plan`` with true ``lengths`` (default: its predicted lengths) to a :class:`Schedule`.

    Every completion runs for exactly its length. Budget mode admits the next completion only
    while the reservations of the live ones (a completion that outgrows its reservation holds
    what it has actually grown to) plus its own fit ``plan.capacity`` (bytes, or KV tokens for a
    plan made with ``budget_tokens``); otherwise admissions
    wait for the next finish ("extend and defer"). Live completions are never preempted, so the
    held bytes can exceed the budget after mispredictions: :func:`held_bytes` measures that.
    ``memory`` is needed for budget-mode growth in bytes when a true length exceeds its reservation.
    """
    n = len(plan.lengths)
    true = np.asarray(plan.lengths, dtype=np.int64) if lengths is None else as_lengths("lengths", lengths, minimum=1)
    if len(true) != n:
        raise InvalidArgument("lengths", lengths, f"{n} lengths, one per completion of the plan")
    sched = GroupScheduler.from_plan(plan)
    starts = np.zeros(n, dtype=np.int64)
    lanes = np.zeros(n, dtype=np.int64)
    order: list[int] = []
    finishing: list[tuple[int, int, int]] = []  # (last step, lane, job)
    capacity = plan.capacity
    budget = capacity is not None
    reserve = np.asarray(plan.reservations if budget else (), dtype=np.int64)
    in_tokens = plan.capacity_tokens is not None
    grows = budget and bool(np.any(true > np.asarray(plan.reserve_lengths)))
    if grows and memory is None and not in_tokens:
        raise InvalidArgument("memory", None, "a ModelMemory: a true length exceeds its reservation")
    live: dict[int, int] = {}  # job -> start step
    free_slots = list(range(plan.slots))
    used = 0
    t = 0
    while True:
        if grows:  # a completion that outgrew its reservation holds what it has grown to next step
            jobs = np.fromiter(live, dtype=np.int64, count=len(live))
            ages = np.minimum(t + 2 - np.fromiter(live.values(), dtype=np.int64, count=len(live)), true[jobs])
            held = ages if in_tokens else np.asarray(memory.reservation_bytes(ages, plan.prompt_tokens), dtype=np.int64)
            used = int(np.maximum(reserve[jobs], held).sum())
        while free_slots:
            job = sched.next_in_order() if budget else sched.next_for_slot(free_slots[0])
            if job is None or (budget and used + reserve[job] > capacity):
                break
            slot = heapq.heappop(free_slots)
            sched.take(job)
            starts[job], lanes[job] = t + 1, slot
            order.append(job)
            live[job] = t + 1
            if budget:
                used += int(reserve[job])
            heapq.heappush(finishing, (t + int(true[job]), slot, job))
        if not finishing:
            break
        t = finishing[0][0]
        while finishing and finishing[0][0] == t:
            _, slot, job = heapq.heappop(finishing)
            heapq.heappush(free_slots, slot)
            del live[job]
            if budget and not grows:
                used -= int(reserve[job])
    if sched.pending:
        raise LengthschedError("execute: completions left pending; the plan's units do not cover the group")
    return Schedule(true, starts, lanes, np.asarray(order, dtype=np.int64))


def held_bytes(
    schedule: Schedule,
    memory: ModelMemory,
    prompt_tokens: int,
    *,
    with_activations: bool = True,
) -> np.ndarray:
    """Bytes held after each decode step, ``out[t - 1]`` for step t (weights included).

    Exact under the memory model: block rounding, windows, compression and the shared or copied
    prompt. A completion's KV is freed after its last step; activations count the completions
    decoding in each step.
    """
    lengths, starts, ends = schedule.lengths, schedule.starts, schedule.ends
    steps = schedule.steps
    per_age = np.asarray(memory.sequence_kv_bytes(np.arange(int(lengths.max()) + 1), prompt_tokens))
    curve = np.zeros(steps + 2, dtype=np.int64)
    for s, n in zip(starts.tolist(), lengths.tolist()):
        curve[s: s + n] += per_age[1: n + 1]
    if with_activations:
        live = np.zeros(steps + 2, dtype=np.int64)
        np.add.at(live, starts, 1)
        np.add.at(live, ends + 1, -1)
        curve += np.cumsum(live) * memory.activation_bytes_per_sequence
    curve += memory.weights_bytes + memory.prompt_kv_bytes(prompt_tokens)
    return curve[1: steps + 1]
