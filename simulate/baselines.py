"""Engine baselines: how vLLM and SGLang would run a group's G requests under the same budget.

Both are models of the engines' schedulers (at decode-step granularity, one group, all requests
arriving at once), not the engines themselves:

- vLLM-like: paged KV in blocks of 16 tokens (the shared prompt's whole blocks are shared, its
  partial last block is copied per sequence). Waiting requests are admitted first come, first
  served, while the blocks they need for their next token are free. When a decode step would need
  more blocks than are free, the most recently admitted request is preempted (its KV freed, its
  tokens kept and recomputed on readmission) and goes back to the front of the waiting queue.
- SGLang-like: token-granular KV. A request is admitted if the tokens in use, plus a reservation
  of ``new_token_ratio`` x the remaining ``max_new_tokens`` of every running request and of the
  new one, fit. The ratio starts at 0.7 and decays linearly to 0.7 x 0.14 over 600 steps (SGLang's
  defaults). When the next step does not fit, the least advanced request is retracted (tokens kept,
  KV recomputed later) and the ratio is reset to (tokens decoded + 20 x running) / (running x
  max_new_tokens).

Prefill and recompute are not decode steps: they are counted as ``recomputed_tokens``, not time.
"""

from __future__ import annotations

import numpy as np

from lengthsched import InvalidArgument

from .engine import Engine
from .policies import Problem, SimPolicy, _slot_cap, overflow_wakeup

__all__ = ["VLLMLike", "SGLangLike"]


class _Waiting(SimPolicy):
    """Shared parts: a FCFS waiting queue (preempted requests return to its front)."""

    promises_budget = True

    def __init__(self, problem: Problem):
        super().__init__(problem)
        self.budget = problem.budget_tokens
        _slot_cap(problem, self.name)  # validates that a budget of at least max_new_tokens is given
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
        tail = problem.prompt_len % self.block_size
        longest = -(-(tail + problem.max_new_tokens) // self.block_size)
        if longest > self.blocks:
            raise InvalidArgument("budget_tokens", self.budget,
                                  f"at least {longest * self.block_size} for policy 'vllm' (one sequence of "
                                  f"max_new_tokens plus the prompt's partial block, in blocks of 16)")

    def _blocks_at(self, eng: Engine, at: int) -> int:
        b = self.block_size
        return sum(-(-(eng.tail[j] + at - eng.origin[j]) // b) for j in eng.origin)

    def decide(self, eng: Engine) -> None:
        nxt = eng.t + 1
        used = self._blocks_at(eng, nxt)
        while used > self.blocks:  # the next step does not fit: preempt the newest
            job = next(reversed(eng.running))
            used -= -(-(eng.tail[job] + nxt - eng.origin[job]) // self.block_size)
            eng.preempt(job)
            self.waiting.append(job)
        while self.waiting and eng.live < self.cap:
            job = self.waiting[-1]
            need = -(-(eng.tail[job] + eng.done[job] + 1) // self.block_size)
            if used + need > self.blocks:
                return
            self.waiting.pop()
            used += need
            eng.admit(job)

    def wakeup(self, eng: Engine) -> int | None:
        """The last step before the blocks run out (each sequence takes a new block every 16 steps)."""
        if not eng.origin:
            return None
        b = self.block_size
        free = self.blocks - self._blocks_at(eng, eng.t)
        # Steps from now until each sequence next needs a block: holding x tokens, at x + s = b * k + 1.
        first = sorted((eng.origin[j] - eng.tail[j] - eng.t) % b + 1 for j in eng.origin)
        rounds, extra = divmod(free, len(first))
        need_step = rounds * b + first[extra]  # the (free + 1)-th block is needed at this step ahead
        return eng.t + max(1, need_step - 1)


class SGLangLike(_Waiting):
    name = "sglang"
    init_ratio = 0.7
    min_ratio = 0.7 * 0.14
    decay_steps = 600
    retract_steps = 20

    def __init__(self, problem: Problem):
        super().__init__(problem)
        self.decay = (self.init_ratio - self.min_ratio) / self.decay_steps
        self.ratio0, self.t0 = self.init_ratio, 0

    def ratio(self, t: int) -> float:
        return max(self.min_ratio, self.ratio0 - self.decay * (t - self.t0))

    def decide(self, eng: Engine) -> None:
        lmax = self.problem.max_new_tokens
        if eng.origin and eng.kv_tokens(eng.t + 1) > self.budget:
            by_progress = sorted(eng.running, key=lambda j: (eng.age(j), j))
            while by_progress and eng.kv_tokens(eng.t + 1) > self.budget:
                job = by_progress.pop(0)  # the least advanced
                eng.preempt(job)
                self.waiting.append(job)
            if eng.running:
                decoded = sum(eng.age(j) for j in eng.running)
                self.ratio0 = min(1.0, (decoded + self.retract_steps * eng.live) / (eng.live * lmax))
                self.t0 = eng.t
        ratio = self.ratio(eng.t)
        used = eng.kv_tokens(eng.t + 1)
        reserved = ratio * sum(lmax - eng.age(j) - 1 for j in eng.running)
        while self.waiting and eng.live < self.cap:
            job = self.waiting[-1]
            need = eng.done[job] + 1
            hold = ratio * (lmax - need)
            if used + need + reserved + hold > self.budget:
                return
            self.waiting.pop()
            used += need
            reserved += hold
            eng.admit(job)

    def wakeup(self, eng: Engine) -> int | None:
        overflow = overflow_wakeup(eng, self.budget)
        if not self.waiting or not eng.running or eng.live >= self.cap:
            return overflow
        # As the ratio decays the head of the queue may fit before anything finishes: find when.
        lmax = self.problem.max_new_tokens
        horizon = min(overflow, eng.next_finish() or overflow) - eng.t
        if horizon < 1:
            return overflow
        job, n = self.waiting[-1], eng.live
        used = eng.kv_tokens(eng.t + 1)
        left = sum(lmax - eng.age(j) - 1 for j in eng.running)
        need = eng.done[job] + 1
        delta = np.arange(1, horizon + 1)
        ratio = np.maximum(self.min_ratio, self.ratio0 - self.decay * (eng.t + delta - self.t0))
        total = used + n * delta + need + ratio * (left - n * delta + lmax - need)
        fits = np.nonzero(total <= self.budget)[0]
        return eng.t + int(delta[fits[0]]) if fits.size else overflow
