"""The discrete-event engine: it advances time and memory; a policy decides; the result accounts.

Time follows design/MODEL.md section 2. The engine jumps from event to event: a completion
finishes, or the policy asked to be woken (a reservation is about to overflow, a block runs out,
a predicted finish). Between events every live sequence grows by one token per step, so the KV
held is non-decreasing and its peak is reached at the next event: checking memory at events is
exact.

A policy talks to the engine through ``admit``, ``preempt`` (the sequence keeps the tokens it
generated and recomputes their KV when it is admitted again, as vLLM and SGLang do), ``release``
(a finished row of a padded batch), ``spawn`` (a new completion drawn from the stream) and
``stop`` (collection is over; live sequences are discarded).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from lengthsched import LengthschedError

if TYPE_CHECKING:
    from .policies import SimPolicy

__all__ = ["Engine", "SimulationError", "Timeline"]


class SimulationError(LengthschedError):
    """A policy broke a rule it promised (budget, slots) or left work it can never start."""


@dataclass
class Timeline:
    """What happened, for figures: run segments and the KV held at every event."""

    segments: list[tuple[int, int, int, int, str]] = field(default_factory=list)  # (job, lane, first, last, kind)
    # (step, KV tokens): at each event the value held after the step, then after frees if lower.
    kv: list[tuple[int, int]] = field(default_factory=lambda: [(0, 0)])


class Engine:
    """State of one simulation. Units: tokens and decode steps.

    ``lengths``: true length of each completion; ``tails``: tokens of the prompt's partial block
    each sequence holds on its own (0 for block size 1); ``block_size``: KV rounding of the policy;
    ``budget_tokens`` / ``slots``: limits the engine enforces for policies that promise them.
    """

    def __init__(self, lengths, *, tails=None, block_size: int = 1, slots: int | None = None,
                 budget_tokens: int | None = None, enforce_budget: bool = False, record: bool = False):
        self.length: list[int] = [int(x) for x in lengths]
        self.n = len(self.length)
        self.tail: list[int] = [0] * self.n if tails is None else [int(x) for x in tails]
        self.block = block_size
        self._exact = block_size == 1 and not any(self.tail)
        self.slots = slots
        self.budget = budget_tokens
        self.enforce_budget = enforce_budget and budget_tokens is not None
        self.t = 0
        self.done: list[int] = [0] * self.n  # tokens generated before the current run (preempted)
        self.origin: dict[int, int] = {}  # live job -> t - age (age at step t = t - origin)
        self.running: dict[int, None] = {}  # live jobs still decoding, in admission order
        self.lane: dict[int, int] = {}
        self._free_lanes: list[int] = []
        self._next_lane = 0
        self._heap: list[tuple[int, int, int]] = []  # (finish step, job, epoch)
        self._epoch: list[int] = [0] * self.n
        self._sum_origin = 0
        self._sum_q = 0  # block accounting, see blocks()
        self._residues = [0] * block_size
        self.finished_at: list[int] = [0] * self.n
        self.collected: list[int] = []  # jobs in finish order
        self.preemptions = 0
        self.recomputed_tokens = 0
        self.discarded_tokens = 0
        self.decoded_tokens = 0
        self.peak_kv = 0
        self.peak_live = 0
        self.stopped = False
        self.plan_seconds = 0.0  # in the policy's start (planning)
        self.decide_seconds = 0.0  # in its decisions and wake-ups, over the whole run
        self.timeline = Timeline() if record else None
        self._run_start: dict[int, int] = {}

    # ------------------------------------------------------------------ views
    def age(self, job: int) -> int:
        """Tokens ``job`` holds generated at the end of the current step."""
        return self.t - self.origin[job]

    def kv_tokens(self, at: int | None = None) -> int:
        """KV tokens held by live sequences at the end of step ``at`` (default now)."""
        at = self.t if at is None else at
        return self.sum_ages(at) if self._exact else self.block * self.blocks(at)

    def blocks(self, at: int | None = None) -> int:
        """KV blocks held by live sequences at the end of step ``at``, in O(block size).

        A sequence holds ceil((y + at) / b) blocks with y = tail - origin = b q + r; summed over
        live sequences that is sum(q) + n k + #{r + m >= 1} + #{r + m > b} for at = b k + m.
        """
        at = self.t if at is None else at
        b, res, n = self.block, self._residues, len(self.origin)
        k, m = divmod(at, b)
        return self._sum_q + n * k + (n if m else n - res[0]) + (sum(res[b - m + 1:]) if m else 0)

    def first_block_needs(self) -> list[tuple[int, int]]:
        """(steps from now until a sequence next needs a new block, how many sequences), by step."""
        b, res, t = self.block, self._residues, self.t
        out = []
        for s in range(1, b + 1):
            count = res[(-(t + s - 1)) % b]
            if count:
                out.append((s, count))
        return out

    def sum_ages(self, at: int | None = None) -> int:
        """Sum over live sequences of the tokens generated by the end of step ``at``, in O(1)."""
        return len(self.origin) * (self.t if at is None else at) - self._sum_origin

    @property
    def live(self) -> int:
        """Live rows (decoding, or finished rows of a padded batch)."""
        return len(self.origin)

    def next_finish(self) -> int | None:
        heap = self._heap
        while heap and heap[0][2] != self._epoch[heap[0][1]]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    # ------------------------------------------------------------------ actions
    def admit(self, job: int, lane: int | None = None) -> None:
        """Start (or resume) ``job`` at the next step."""
        if job in self.origin or self.finished_at[job]:
            raise SimulationError(f"job {job} admitted while live or after it finished")
        if self.slots is not None and len(self.origin) >= self.slots:
            raise SimulationError(f"admitting job {job} exceeds slots={self.slots} at step {self.t}")
        origin = self.t - self.done[job]
        self.recomputed_tokens += self.done[job]
        self.origin[job] = origin
        self.running[job] = None
        self._sum_origin += origin
        if not self._exact:
            q, r = divmod(self.tail[job] - origin, self.block)
            self._sum_q += q
            self._residues[r] += 1
        heapq.heappush(self._heap, (origin + self.length[job], job, self._epoch[job]))
        if lane is None:
            lane = heapq.heappop(self._free_lanes) if self._free_lanes else self._new_lane()
        elif lane in self._free_lanes:
            self._free_lanes.remove(lane)
            heapq.heapify(self._free_lanes)
        elif lane >= self._next_lane:  # a policy that names lanes skipped some: they are free
            for unused in range(self._next_lane, lane):
                heapq.heappush(self._free_lanes, unused)
            self._next_lane = lane + 1
        else:
            raise SimulationError(f"lane {lane} is busy at step {self.t}")
        self.lane[job] = lane
        self._run_start[job] = self.t + 1
        if len(self.origin) > self.peak_live:
            self.peak_live = len(self.origin)

    def _new_lane(self) -> int:
        self._next_lane += 1
        return self._next_lane - 1

    def _remove(self, job: int, kind: str) -> None:
        origin = self.origin.pop(job)
        self.running.pop(job, None)
        self._sum_origin -= origin
        if not self._exact:
            q, r = divmod(self.tail[job] - origin, self.block)
            self._sum_q -= q
            self._residues[r] -= 1
        lane = self.lane.pop(job)
        heapq.heappush(self._free_lanes, lane)
        if self.timeline is not None:
            self.timeline.segments.append((job, lane, self._run_start.pop(job), self.t, kind))

    def preempt(self, job: int) -> None:
        """Drop ``job``'s KV; it keeps its generated tokens and must be admitted again."""
        if job not in self.running:
            raise SimulationError(f"preempting job {job}, which is not decoding")
        self.done[job] = self.age(job)
        self.decoded_tokens += self.t - self._run_start[job] + 1
        self._epoch[job] += 1
        self.preemptions += 1
        self._remove(job, "preempted")
        if self.timeline is not None:
            self._mark()

    def release(self, job: int) -> None:
        """Free a finished row of a padded batch."""
        if job not in self.origin or job in self.running:
            raise SimulationError(f"releasing job {job}, which is not a finished padded row")
        self._remove(job, "pad")

    def spawn(self, length: int) -> int:
        """A new completion (from the stream) of the given true length; returns its index."""
        for seq in (self.length, self.tail, self.done, self._epoch, self.finished_at):
            seq.append(0)
        self.length[-1] = int(length)
        self.tail[-1] = self.tail[0] if self.n else 0
        self.n += 1
        return self.n - 1

    def stop(self) -> None:
        """End collection now; live sequences are discarded (their tokens wasted)."""
        for job in list(self.origin):
            if job in self.running:
                self.discarded_tokens += self.age(job)
                self.decoded_tokens += self.t - self._run_start[job] + 1
            self._remove(job, "discarded" if job in self.running else "pad")
        self.stopped = True

    # ------------------------------------------------------------------ time
    def _advance(self, t_next: int, pads: bool) -> None:
        self.t = t_next
        kv = self.kv_tokens()
        if kv > self.peak_kv:
            self.peak_kv = kv
        if self.timeline is not None:
            self.timeline.kv.append((t_next, kv))
        if self.enforce_budget and kv > self.budget:
            raise SimulationError(f"KV {kv} tokens > budget {self.budget} at step {t_next}")
        heap, epochs, starts = self._heap, self._epoch, self._run_start
        while heap and heap[0][0] == t_next:
            _, job, epoch = heapq.heappop(heap)
            if epoch != epochs[job]:
                continue
            self.finished_at[job] = t_next
            self.collected.append(job)
            self.decoded_tokens += t_next - starts[job] + 1
            if pads:
                self.running.pop(job)  # the row stays, decoding padding, until released
                if self.timeline is not None:
                    self.timeline.segments.append((job, self.lane[job], self._run_start[job], t_next, "run"))
                    self._run_start[job] = t_next + 1
            else:
                self._remove(job, "run")
        if self.timeline is not None:
            self._mark()

    def _mark(self) -> None:
        """Record the KV held now (after frees and preemptions) for the memory figure."""
        now = (self.t, self.kv_tokens())
        if self.timeline.kv[-1] != now:
            self.timeline.kv.append(now)

    def run(self, policy: "SimPolicy") -> "Engine":
        """Run ``policy`` until every completion it launched has finished (or it stopped)."""
        clock = time.perf_counter
        decide, wakeup, pads = policy.decide, policy.wakeup, policy.pads
        start = clock()
        policy.start(self)
        self.plan_seconds = clock() - start
        while True:
            start = clock()
            decide(self)
            wake = None if self.stopped else wakeup(self)
            self.decide_seconds += clock() - start
            if self.stopped:
                return self
            if not self.origin:
                if policy.pending(self):
                    raise SimulationError(
                        f"{policy.name}: nothing live and nothing admitted at step {self.t} "
                        f"with {policy.pending(self)} completions pending"
                    )
                return self
            t_next = self.next_finish()
            if wake is not None:
                if wake <= self.t:
                    raise SimulationError(f"{policy.name}: wake-up at step {wake} is not after step {self.t}")
                t_next = wake if t_next is None else min(t_next, wake)
            if t_next is None:
                raise SimulationError(f"{policy.name}: only padded rows are live and none was released")
            self._advance(t_next, pads)

    def lengths_array(self) -> np.ndarray:
        return np.asarray(self.length, dtype=np.int64)
