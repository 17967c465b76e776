"""Engine baselines: how vLLM and SGLang would run a group's G requests under the same budget.

Both are models of the engines' schedulers (at decode-step granularity, one group, all requests
arriving at once), not the engines themselves:

- vLLM-like: paged KV in blocks of 16 tokens (the shared prompt's whole blocks are shared, its
  partial last block is copied per sequence). Waiting requests are admitted first come, first
  served, while the blocks they need for their next token are free. When a decode step would need
  more blocks than are free, the most recently admitted request is preempted (its KV freed, its
  tokens kept and recomputed on readmission) and goes back to the front of the waiting queue.
- SGLang-like: token-granular KV. A request is admitted if the tokens in use, plus a reservation
  of ``new_token_ratio`` x the remaining ``max_new_tokens`` of every running request, plus the new
  one's prompt and whole remaining ``max_new_tokens`` (and those of the requests admitted before it
  in the same round), fit (``PrefillAdder.add_one_req``: ``total_tokens >= rem_total_tokens`` refuses;
  every remaining ``max_new_tokens`` clipped at ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``, 4096).
  From the next step on an admitted request counts at the ratio like every running one; a request's
  ``max_new_tokens`` is at most the pool less its prompt and 2 tokens, as SGLang caps it on arrival.
  The ratio starts at 0.7 and decays linearly to 0.7 x 0.14 over 600 steps (SGLang's defaults). When
  the next step does not fit, the least advanced request is retracted (tokens kept, KV recomputed
  later) and the ratio is reset to (tokens decoded + 20 x running) / (running x max_new_tokens).
  (Until 2026-11-28 the new request reserved only the ratio of its ``max_new_tokens``, as the running
  ones do: up to 1.7x faster than this in pools of 2 x L_max.)

A resumed request recomputes its KV in the step after its readmission (priced by the step-cost
model as prefill tokens of that step; ``Engine.can_prefill`` keeps a step within the prefill
chunk, as vLLM's token budget does) and is counted in ``recomputed_tokens``.
"""

from __future__ import annotations

import bisect
import heapq
import math
from typing import Any

from ..errors import InvalidArgument
from .engine import Engine
from .policies import Problem, SimPolicy, overflow_wakeup

__all__ = ["VLLMLike", "VLLMPriority", "PlacedLongestFirst", "AdaptivePlacement", "SGLangLike", "SGLangPriority",
           "ran_dry"]


class _Waiting(SimPolicy):
    """Shared parts: a FCFS waiting queue (preempted requests return to its front)."""

    promises_budget = True

    def __init__(self, problem: Problem):
        super().__init__(problem)
        if problem.budget_tokens is None:
            raise InvalidArgument("budget_tokens", None, f"a KV budget for policy '{self.name}'")
        self.budget = problem.budget_tokens
        self.cap = problem.slots or problem.n
        self.waiting: list[int] = list(range(problem.n - 1, -1, -1))  # a stack: the front is the end

    def pending(self, eng: Engine) -> int:
        return len(self.waiting)


class VLLMLike(_Waiting):
    name = "vllm"
    block_size = 16

    def __init__(self, problem: Problem):
        super().__init__(problem)
        self.blocks = self.budget // self.block_size

    def start(self, eng: Engine) -> None:
        # Every sequence must fit alone: its prompt tail plus its whole length, in whole blocks.
        # (with prompts in the pool, Engine.hold_prompts, its prompt's whole blocks too)
        if not eng.n:
            return
        held = self.problem.held  # a compressed cache (Problem.kv_cap) holds at most kv_cap generated tokens
        longest = max(-(-(eng.tail[j] + int(held(eng.length[j]))) // self.block_size)
                      + eng.load_need(j) // self.block_size for j in range(eng.n))
        if longest > self.blocks:
            raise InvalidArgument("budget_tokens", self.budget,
                                  f"at least {longest * self.block_size} for policy 'vllm' (the longest completion "
                                  f"plus its prompt's partial block, in blocks of 16)")

    # The waiting queue and the victim (vLLM V1 FCFS): a stack whose top is the front; a preempted
    # request goes back to the front; the victim is the newest running request.
    def _head(self) -> int:
        return self.waiting[-1]

    def _take(self) -> None:
        self.waiting.pop()

    def _requeue(self, job: int) -> None:
        self.waiting.append(job)

    def _victim(self, eng: Engine) -> int:
        return next(reversed(eng.running))

    def decide(self, eng: Engine) -> None:
        nxt = eng.t + 1
        used = eng.blocks(nxt)
        if used > self.blocks and eng.evict_idle((used - self.blocks) * self.block_size):  # unreferenced cache first
            used = eng.blocks(nxt)
        while used > self.blocks:  # the next step does not fit: preempt a victim
            job = self._victim(eng)
            eng.preempt(job)
            self._requeue(job)
            used = eng.blocks(nxt)
        room = self._admission_room(eng)  # None: vLLM's rule alone (free blocks, the running cap)
        while self.waiting and eng.live < self.cap:
            job = self._head()
            need = self._blocks_needed(eng, job)
            if used + need > self.blocks and eng.evict_idle((used + need - self.blocks) * self.block_size, keep=job):
                used, need = eng.blocks(nxt), self._blocks_needed(eng, job)
            if used + need > self.blocks or not eng.can_prefill(job):
                return
            if room is not None and eng.running:
                room -= self._admission_need(eng, job)
                if room < 0:
                    return
            self._take()
            used += need
            eng.admit(job)

    def _admission_room(self, eng: Engine) -> float | None:
        """Tokens the admissions of this decision may add, by a subclass's own measure
        (:meth:`_admission_need`); None (vLLM): no limit beyond free blocks."""
        return None

    def _admission_need(self, eng: Engine, job: int) -> float:
        """What admitting ``job`` takes of :meth:`_admission_room`."""
        return 0.0

    def _blocks_needed(self, eng: Engine, job: int) -> int:
        """Blocks admitting ``job`` takes at its first step: its tail, recomputed tokens and next token,
        and its prompt's whole blocks when they are not held (prompts in the pool), less the blocks of its
        conversation cached here (a later turn: ``Engine.cache_conversation``), which become its own."""
        generated = int(self.problem.held(eng.done[job] + 1))  # capped with a compressed cache
        return -(-(eng.tail[job] + generated) // self.block_size) + eng.load_need(job) // self.block_size \
            - eng.reused_blocks(job)

    def wakeup(self, eng: Engine) -> int | None:
        """The last step before the blocks run out (each sequence takes a new block every 16 steps)."""
        needs = eng.first_block_needs()
        if not needs:  # nothing live, or every sequence at a compressed cache's cap: no block is ever needed
            return None
        free = self.blocks - eng.blocks()
        # Every sequence that grows takes a block every 16 steps (without a cap: all of them, exactly).
        rounds, extra = divmod(free, sum(count for _, count in needs))
        for step, count in needs:  # the (free + 1)-th new block is needed here
            if extra < count:
                return eng.t + max(1, rounds * self.block_size + step - 1)
            extra -= count
        raise AssertionError("unreachable: every live sequence needs a block within one block of steps")


class VLLMPriority(VLLMLike):
    """vLLM V1 with ``scheduling_policy="priority"`` (vllm/v1/core/sched/scheduler.py and
    request_queue.py, vLLM 0.1x-0.33 V1 scheduler): waiting requests are served in (priority,
    arrival) order, a lower value first; a waiting request never preempts a running one to get in;
    when a running request cannot get its next block, the victim is the running request with the
    largest (priority, arrival), which goes back to the waiting queue (``prepend_request`` of the
    priority queue pushes it onto the heap).

    Priorities come from the predictions: minus the predicted length in tokens (longest first, the
    order that shortens a rollout's tail; equal predictions share a priority and go by arrival);
    without predictions all are equal and the order is arrival (completion index), as with FCFS but
    with the priority victim rule.
    """

    name = "vllm_priority"

    def __init__(self, problem: Problem):
        super().__init__(problem)
        # A request's priority is minus its predicted length (tokens): equal predictions tie.
        self.priority = [-int(x) for x in problem.point()] if problem.predicted is not None else [0] * problem.n
        # Each request's arrival (its index; a caller that submits requests over time renumbers them with
        # set_arrival): ties of priority go by arrival, and a preempted request keeps its own.
        self.arrival = list(range(problem.n))
        self.waiting = [(self.priority[j], j, j) for j in range(problem.n)]
        heapq.heapify(self.waiting)
        # (priority, arrival) as one integer per job, ordered as the pairs are (0 <= arrival < n): the victim
        # is picked with a C-level key (a tuple per running request per preemption was most of the time)
        self._rank = [p * problem.n + j for j, p in enumerate(self.priority)]

    def set_arrival(self, job: int, arrival: int) -> None:
        """``job`` arrived ``arrival``-th (0 <= arrival < n: the order in which requests reached the
        engine), for requests submitted while the engine runs (vLLM's arrival time)."""
        self.arrival[job] = arrival
        self._rank[job] = self.priority[job] * len(self.priority) + arrival

    def _head(self) -> int:
        return self.waiting[0][2]

    def _take(self) -> None:
        heapq.heappop(self.waiting)

    def _requeue(self, job: int) -> None:
        heapq.heappush(self.waiting, (self.priority[job], self.arrival[job], job))

    def _victim(self, eng: Engine) -> int:
        return max(eng.running, key=self._rank.__getitem__)  # the largest (priority, arrival)

    def decide(self, eng: Engine) -> None:
        changed = self.observe_events(eng)
        if changed:  # a sibling finished: an online predictor sharpened, re-prioritise its prompt
            waiting = self.of_prompts([entry[2] for entry in self.waiting], changed)
            running = self.of_prompts(list(eng.running), changed)
            if waiting or running:
                point, _ = self.predict_again(eng, waiting + running,
                                              [eng.done[j] for j in waiting] + [eng.age(j) for j in running])
                n = len(self.priority)
                for j, total in zip(waiting + running, point.tolist()):
                    self.priority[j] = -int(total)
                    self._rank[j] = self.priority[j] * n + self.arrival[j]
                self.waiting = [(self.priority[j], self.arrival[j], j) for _, _, j in self.waiting]
                heapq.heapify(self.waiting)
        super().decide(eng)


class PlacedLongestFirst(VLLMPriority):
    """The project's rollout policy: it places groups on replicas itself, by the partitioning core
    over their predicted work (``simulate.run_rollout``), and runs each replica as vLLM's priority
    scheduler with longest-predicted-first priorities (fill the KV pool, overcommit, preempt the
    lowest priority). On one replica it is :class:`VLLMPriority`."""

    name = "placed_lpt"
    places_groups = True


class LengthClasses(VLLMPriority):
    """Rollout placement by length classes (:func:`lengthsched.placement.plan_length_classes` on the
    predicted lengths): the completions sorted longest predicted first and cut into one contiguous
    class per replica, so that the longest share few replicas and the short ones run on replicas that
    finish early, unless verl's spread is faster on the predicted lengths (``simulate.run_rollout``
    simulates both); each replica is vLLM's priority scheduler, longest predicted first. Only as good as
    the predictions, completion by completion: it pays where every completion's length is known to
    ~10% (CASTILLO-like groups, whose siblings vary little, with one earlier epoch of the same prompts
    through :class:`lengthsched.OnlineLengthPredictor`); with a prompt-only predictor (log-normal error
    0.5) or groups whose siblings vary a lot it is slower than verl's spread (docs/benchmarks.md,
    "Length classes"). On one replica it is :class:`VLLMPriority`."""

    name = "placed_classes"
    places_groups = True
    PLACE = "classes"
    ENGINE = "vllm_priority"  # what runs on each replica (the planner simulates it)


class AdaptivePlacement(VLLMLike):
    """The project's adaptive rollout placement over vLLM's FCFS engine: a group's requests are spread
    over the replicas (as verl routes them) unless holding every prompt on every replica would take
    more than ``PROMPT_SHARE`` of a replica's KV pool; then whole groups are placed by predicted work
    (the partitioning core), so each prompt is held once (``simulate.rollout.route``). On one replica
    it is :class:`VLLMLike`."""

    name = "placed_adaptive"
    places_groups = True
    PROMPT_SHARE = 0.25


def ran_dry(policy: Any, eng: Engine) -> None:
    """Engine ``eng`` has nothing to run: a policy with an ``idle_reset`` (SGLang's) starts its reservation
    ratio again, so a request sent, stolen or resumed later is admitted under ``init_new_token_ratio``."""
    if hasattr(policy, "idle_reset"):
        policy.idle_reset(eng)


class SGLangLike(_Waiting):
    """SGLang's FCFS scheduler (SGLang 0.5.x, python/sglang/srt/managers/schedule_policy.py
    ``PrefillAdder``: ``add_one_req`` and the running batch's ``new_token_ratio`` reservation;
    scheduler.py ``new_token_ratio`` decay and ``retract_decode``): see the module docstring."""

    name = "sglang"
    init_ratio = 0.7
    min_ratio = 0.7 * 0.14
    decay_steps = 600
    retract_steps = 20
    clip_tokens = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION: the most a remaining max_new_tokens counts

    def __init__(self, problem: Problem):
        super().__init__(problem)
        self._init_ratio()

    def _init_ratio(self) -> None:
        """The scheduler's state: ``new_token_ratio`` decaying from ``init_ratio`` at step 0."""
        self.decay = (self.init_ratio - self.min_ratio) / self.decay_steps
        self.ratio0, self.t0 = self.init_ratio, 0
        self._linear_at: tuple[int, bool] = (-1, True)

    def ratio(self, t: int) -> float:
        return max(self.min_ratio, self.ratio0 - self.decay * (t - self.t0))

    def idle_reset(self, eng: Engine) -> None:
        """The server ran out of work: ``new_token_ratio`` starts again from ``init_ratio`` (SGLang 0.5.x
        scheduler.py, ``self_check_during_idle``: ``self.new_token_ratio = self.init_new_token_ratio``)."""
        self.ratio0, self.t0 = self.init_ratio, eng.t

    def decide(self, eng: Engine) -> None:
        lmax, budget, nxt = self.problem.max_new_tokens, self.budget, eng.t + 1
        used = eng.kv_tokens(nxt)
        if used > budget and eng.evict_idle(used - budget):  # cached prompts nothing references go first
            used = eng.kv_tokens(nxt)
        if used > budget:
            order = sorted(eng.running, key=lambda j: self._retraction_key(eng, j))
            while order and used > budget:
                job = order.pop(0)  # the least preferred: the least advanced
                eng.preempt(job)
                self._requeue(job)
                used = eng.kv_tokens(nxt)
            if eng.running:
                live = len(eng.origin)
                self.ratio0 = min(1.0, (eng.sum_ages() + self.retract_steps * live) / (live * lmax))
                self.t0 = eng.t
        ratio = self.ratio(eng.t)
        reserved = ratio * self._remaining(eng)  # ratio x the running requests' remaining max_new_tokens
        waiting, done = self.waiting, eng.done
        while waiting and len(eng.origin) < self.cap:
            job = waiting[-1]
            need = self._tokens_needed(eng, job)
            hold = self._left(eng, job, done[job])  # the new one's, whole (this round)
            if used + need + reserved + hold > budget and eng.evict_idle(used + need + reserved + hold - budget,
                                                                         keep=job, conversations=False):
                used, need = eng.kv_tokens(nxt), self._tokens_needed(eng, job)
            # Cached conversations, other than the one this request takes over, are evicted only when its tokens need
            # their room.
            if used - self._cached_free(eng, job) + need + reserved + hold > budget or not eng.can_prefill(job):
                return
            if used + need > budget:
                eng.evict_idle(used + need - budget, keep=job)
                used = eng.kv_tokens(nxt)
            used += need
            reserved += hold
            eng.admit(waiting.pop())

    @staticmethod
    def _tokens_needed(eng: Engine, job: int) -> int:
        """KV tokens admitting ``job`` adds at its first step: its prompt tail (a later turn's conversation),
        recomputed tokens and next token, and its prompt when not held (prompts in the pool), less its
        conversation cached here (a later turn: ``Engine.cache_conversation``; SGLang's radix cache matches it
        token by token, and its tokens, counted in the pool already, become the request's own). With a
        compressed cache (``Engine.kv_cap``) the recomputed and next tokens count at most the cap, what it holds."""
        own = eng.done[job] + 1 if eng.kv_cap is None else min(eng.done[job] + 1, eng.kv_cap)
        return eng.tail[job] + own + eng.load_need(job) - eng.reused_blocks(job) * eng.block

    @staticmethod
    def _cached_free(eng: Engine, job: int) -> int:
        """KV tokens of the cached conversations that count as free when ``job`` is admitted (the radix cache's
        evictable tokens: ``PrefillAdder``'s ``rem_total_tokens`` is available plus evictable), less the one ``job``
        takes over."""
        return eng.conversation_kv_held - eng.reused_blocks(job) * eng.block

    def _max_new(self, eng: Engine, job: int) -> int:
        """``job``'s max_new_tokens as SGLang takes it: at most the pool less its prompt and 2 tokens
        (``Scheduler.handle_generate_request`` caps it at ``max_req_len - len(input_ids) - 1``, and
        ``max_req_len`` is at most the pool less one)."""
        return min(self.problem.max_new_tokens, self.budget - 2 - eng.context[job])

    def _left(self, eng: Engine, job: int, generated: int) -> int:
        """What ``job`` reserves after its next token: its remaining max_new_tokens, clipped."""
        return max(min(self._max_new(eng, job) - generated, self.clip_tokens) - 1, 0)

    def _linear(self, eng: Engine) -> bool:
        """Whether every request's reservation is ``L_max - 1`` less its age (nothing clipped): the
        aggregate and the analytic wake-up time hold."""
        n = len(eng.context)
        if self._linear_at[0] != n:  # (requests on the engine, the answer): computed again if requests join
            lmax = self.problem.max_new_tokens
            room = self.budget - 2 - max(eng.context, default=0)  # the longest prompt's capped max_new_tokens
            self._linear_at = (n, lmax - 1 <= self.clip_tokens and lmax <= room)
        return self._linear_at[1]

    def _remaining(self, eng: Engine) -> int:
        """The running requests' remaining ``max_new_tokens`` (tokens), each clipped as SGLang clips it."""
        if self._linear(eng):
            return len(eng.origin) * (self.problem.max_new_tokens - 1) - eng.sum_ages()
        return sum(self._left(eng, j, eng.age(j)) for j in eng.running)

    def _retraction_key(self, eng: Engine, job: int) -> tuple:
        """The retraction order (smallest first): the least advanced, ties by arrival."""
        return eng.age(job), job

    def _requeue(self, job: int) -> None:
        """A retracted request goes back to the front of the waiting queue."""
        self.waiting.append(job)

    def admission_delay(self, used: float, left: float, n: int, need: int, horizon: int,
                        start_ratio: float, load: int = 0) -> int | None:
        """Smallest d in [1, horizon] at which the head of the queue fits after d more steps, with
        the live sequences grown by d tokens and the ratio decayed by d steps; None if none.

        ``used``: tokens the live sequences hold next step; ``left``: their remaining
        max_new_tokens; ``need``: the head's tokens at its first step; ``start_ratio``: the ratio now;
        ``load``: its prompt's KV when not held (prompts in the pool). The head reserves its whole
        remaining max_new_tokens, the live ones the ratio of theirs (no clipping: the caller steps
        one at a time where ``clip_tokens`` would bind).
        """
        lmax, rmin, decay, budget = self.problem.max_new_tokens, self.min_ratio, self.decay, self.budget
        fixed, rest = used + need + load + (lmax - need), left

        def total(d: int) -> float:
            return fixed + n * d + max(rmin, start_ratio - decay * d) * (rest - n * d)

        last_decay = int((start_ratio - rmin) / decay) if start_ratio > rmin else 0
        best = None
        if last_decay >= 1:  # while decaying: delta d^2 n + d (n (1 - r) - delta rest) + fixed + r rest - budget <= 0
            a, b = decay * n, n * (1 - start_ratio) - decay * rest
            c = fixed + start_ratio * rest - budget
            disc = b * b - 4 * a * c
            if disc >= 0:
                low, high = (-b - math.sqrt(disc)) / (2 * a), (-b + math.sqrt(disc)) / (2 * a)
                d = max(1, math.ceil(low))
                if d <= min(high, last_decay):
                    best = d
        if best is None and total(last_decay + 1) <= budget:  # then the total only grows
            best = last_decay + 1
        if best is not None:  # guard the float roots with the exact test used by decide
            while best > 1 and total(best - 1) <= budget:
                best -= 1
            while best <= horizon and total(best) > budget:
                best += 1
        return best if best is not None and best <= horizon else None

    def wakeup(self, eng: Engine) -> int | None:
        overflow = overflow_wakeup(eng, self.budget)
        if not self.waiting or not eng.running or eng.live >= self.cap:
            return overflow
        if overflow is None:  # nothing grows (a compressed cache at its cap): nothing overflows before a finish
            overflow = eng.next_finish()
        # As the ratio decays the head of the queue may fit before anything finishes: find when.
        horizon = min(overflow, eng.next_finish() or overflow) - eng.t
        if horizon < 1:
            return overflow
        if not self._linear(eng):  # clipped reservations are not linear in the steps: decide every step
            return min(overflow, eng.t + 1)
        head = self.waiting[-1]
        used = eng.kv_tokens(eng.t + 1) - self._cached_free(eng, head)  # (as decide counts it)
        delay = self.admission_delay(used, self._remaining(eng), eng.live,
                                     self._tokens_needed(eng, head) - eng.load_need(head), horizon, self.ratio(eng.t),
                                     eng.load_need(head))
        return overflow if delay is None else eng.t + delay


class SGLangPriority(SGLangLike):
    """SGLang with ``--enable-priority-scheduling`` and ``--retraction-policy priority``
    (python/sglang/srt/managers/schedule_policy.py and schedule_batch.py ``retract_decode`` /
    ``_get_decode_retraction_order``, SGLang 0.5.x): the waiting queue is served highest priority
    first (ties by arrival), admission keeps SGLang's decaying reservation, and when the next step
    does not fit the request retracted first is the lowest priority, then the least decode progress.
    Priorities are the predicted lengths (longest first); priority preemption of running requests
    by an arriving one is off (``--disable-priority-preemption``: every request arrives at once)."""

    name = "sglang_priority"

    def __init__(self, problem: Problem):
        super().__init__(problem)
        self.priority = [int(x) for x in problem.point()] if problem.predicted is not None else [0] * problem.n
        # A stack whose top is the front: lowest priority at the bottom, ties by arrival.
        self.waiting = sorted(range(problem.n), key=lambda j: (self.priority[j], -j))

    def _retraction_key(self, eng: Engine, job: int) -> tuple:
        """The lowest priority first, then the least decode progress, then the latest arrival."""
        return self.priority[job], eng.age(job), -job

    def _requeue(self, job: int) -> None:
        """Back into the waiting queue at its priority's place (before later arrivals of equal priority)."""
        key = (self.priority[job], -job)
        waiting, keys = self.waiting, [(self.priority[j], -j) for j in self.waiting]
        waiting.insert(bisect.bisect_left(keys, key), job)
