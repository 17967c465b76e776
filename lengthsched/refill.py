"""Runtime refill rules: which pending completion takes a freed slot.

The shape follows vLLM v1's request queue: a small abstract queue, one heap-based implementation
per rule, an enum of rules and a factory. Every operation is O(log n) (removal and re-prediction
use lazy deletion). Ties are broken by completion index, so every order is deterministic.
A queue only orders completions; it never shortens one (a misprediction changes order, not output).
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections.abc import Iterator
from enum import Enum
from typing import Any

from .errors import InvalidArgument, LengthschedError, as_lengths, check_int

__all__ = [
    "RefillRule",
    "RefillQueue",
    "SJFQueue",
    "LPTQueue",
    "FCFSQueue",
    "PlanOrderQueue",
    "make_refill_queue",
    "parse_rule",
]


class RefillRule(str, Enum):
    """The rules of docs/model.md section 6."""

    SJF = "sjf"  # smallest predicted remaining length first (minimises mean completion time)
    LPT = "lpt"  # largest predicted remaining length first (list-scheduling makespan rule)
    FCFS = "fcfs"  # in arrival order (completion index for a group)
    PLAN = "plan"  # in the order of the plan (rank given when added)


def parse_rule(rule: Any) -> RefillRule:
    """``RefillRule`` from a rule or its name; a clear error otherwise."""
    try:
        return RefillRule(rule)
    except ValueError:
        raise InvalidArgument("refill", rule, "one of " + ", ".join(r.value for r in RefillRule)) from None


class RefillQueue(ABC):
    """Pending completions, popped in the order of one refill rule."""

    rule: RefillRule

    def __init__(self) -> None:
        self._heap: list[list[Any]] = []
        self._entries: dict[int, list[Any]] = {}
        self._remaining: dict[int, int] = {}
        self._ranks: dict[int, int] = {}
        self._arrival = itertools.count()

    @abstractmethod
    def _key(self, job: int, remaining: int, rank: int) -> tuple:
        """The sort key of a job; smaller pops first."""

    def add(self, job: int, remaining: int, rank: int | None = None) -> None:
        """Add ``job`` with its predicted remaining length (tokens) and plan rank (default: arrival)."""
        job = check_int("job", job, minimum=0)
        if job in self._entries:
            raise InvalidArgument("job", job, "a completion not already pending")
        remaining = check_int("remaining", remaining, minimum=0)
        rank = next(self._arrival) if rank is None else check_int("rank", rank, minimum=0)
        self._ranks[job] = rank
        self._push(job, remaining)

    def add_many(self, jobs: Any, remaining: Any, ranks: Any = None) -> None:
        """Add many jobs at once in O(n) (one heapify); arguments as in :meth:`add`, as sequences."""
        jobs = [int(j) for j in as_lengths("jobs", list(jobs), allow_empty=True)]
        remaining = [int(r) for r in as_lengths("remaining", list(remaining), allow_empty=True)]
        if len(remaining) != len(jobs):
            raise InvalidArgument("remaining", remaining, f"{len(jobs)} values, one per job")
        if ranks is None:
            ranks = [next(self._arrival) for _ in jobs]
        else:
            ranks = [int(r) for r in as_lengths("ranks", list(ranks), allow_empty=True)]
            if len(ranks) != len(jobs):
                raise InvalidArgument("ranks", ranks, f"{len(jobs)} values, one per job")
        if len(set(jobs)) != len(jobs) or any(j in self._entries for j in jobs):
            raise InvalidArgument("jobs", jobs, "completions not already pending, each once")
        key = self._key
        for job, left, rank in zip(jobs, remaining, ranks):
            self._ranks[job] = rank
            entry = [key(job, left, rank), job, True]
            self._entries[job] = entry
            self._remaining[job] = left
            self._heap.append(entry)
        heapq.heapify(self._heap)

    def _push(self, job: int, remaining: int) -> None:
        entry = [self._key(job, remaining, self._ranks[job]), job, True]
        self._entries[job] = entry
        self._remaining[job] = remaining
        heapq.heappush(self._heap, entry)

    def _drop_stale(self) -> None:
        while self._heap and not self._heap[0][2]:
            heapq.heappop(self._heap)

    def peek(self) -> int:
        """The job :meth:`pop` would return, without removing it."""
        self._drop_stale()
        if not self._heap:
            raise IndexError("peek from an empty refill queue")
        return self._heap[0][1]

    def pop(self) -> int:
        """Remove and return the next job by the rule."""
        job = self.peek()
        self.remove(job)
        return job

    def remove(self, job: int) -> None:
        """Remove a pending job (started elsewhere, or cancelled)."""
        entry = self._entries.pop(job, None)
        if entry is None:
            raise InvalidArgument("job", job, "a pending completion of this queue")
        entry[2] = False
        del self._remaining[job], self._ranks[job]
        self._drop_stale()

    def update(self, job: int, remaining: int) -> None:
        """Replace the predicted remaining length of a pending job (a re-prediction)."""
        if job not in self._entries:
            raise InvalidArgument("job", job, "a pending completion of this queue")
        remaining = check_int("remaining", remaining, minimum=0)  # before touching the heap
        self._entries[job][2] = False
        self._push(job, remaining)

    def remaining(self, job: int) -> int:
        """The predicted remaining length of a pending job (tokens)."""
        return self._remaining[job]

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, job: object) -> bool:
        return job in self._entries

    def __iter__(self) -> Iterator[int]:
        """Pending jobs in pop order (O(n log n); for inspection, not the hot path)."""
        return iter(job for _, job, _ in sorted(self._entries.values()))

    def check_integrity(self) -> None:
        """Raise if the heap and the index disagree (tests call it after every operation)."""
        live = [e for e in self._heap if e[2]]
        if len(live) != len(self._entries) or any(self._entries.get(e[1]) is not e for e in live):
            raise LengthschedError(f"{type(self).__name__}: heap and index disagree")
        for job, entry in self._entries.items():
            if entry[0] != self._key(job, self._remaining[job], self._ranks[job]):
                raise LengthschedError(f"{type(self).__name__}: stale key for job {job}")


class SJFQueue(RefillQueue):
    """Shortest predicted remaining length first."""

    rule = RefillRule.SJF

    def _key(self, job: int, remaining: int, rank: int) -> tuple:
        return (remaining, job)


class LPTQueue(RefillQueue):
    """Longest predicted remaining length first."""

    rule = RefillRule.LPT

    def _key(self, job: int, remaining: int, rank: int) -> tuple:
        return (-remaining, job)


class FCFSQueue(RefillQueue):
    """First come, first served: by arrival rank (the order added unless a rank is given, so a
    re-queued completion keeps its place); a re-prediction does not move a job."""

    rule = RefillRule.FCFS

    def _key(self, job: int, remaining: int, rank: int) -> tuple:
        return (rank, job)


class PlanOrderQueue(RefillQueue):
    """In the rank the plan gave each job (rank defaults to arrival order)."""

    rule = RefillRule.PLAN

    def _key(self, job: int, remaining: int, rank: int) -> tuple:
        return (rank, job)


_QUEUES: dict[RefillRule, type[RefillQueue]] = {
    RefillRule.SJF: SJFQueue,
    RefillRule.LPT: LPTQueue,
    RefillRule.FCFS: FCFSQueue,
    RefillRule.PLAN: PlanOrderQueue,
}


def make_refill_queue(rule: RefillRule | str) -> RefillQueue:
    """An empty queue for ``rule`` (a :class:`RefillRule` or its name)."""
    return _QUEUES[parse_rule(rule)]()
