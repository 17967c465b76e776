"""The sampling policies (docs/model.md), as deciders for the engine.

Each policy gets a :class:`Problem` (true lengths, limits, predictions) and, at every event,
decides admissions (and preemptions) through the :class:`~lengthsched.runtime.engine.Engine`. The
refill rules and plans are those of ``lengthsched`` (``plan_group``, ``GroupScheduler``); nothing
is re-implemented here. Engine baselines (vLLM-like, SGLang-like) live in
:mod:`lengthsched.runtime.baselines`; every policy is named in :data:`lengthsched.runtime.POLICIES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from ..plan import plan_group
from ..schedule import GroupScheduler
from .engine import Engine

__all__ = ["Problem", "SimPolicy", "overflow_wakeup", "slot_cap", "FullGroup", "MicroGroups", "FixedSlots",
           "DynamicSlots", "LengthAware", "GrowthAware"]


@dataclass(frozen=True)
class Problem:
    """One simulation input. Lengths in tokens.

    ``predicted``: point predictions per completion (None: no information, every completion is
    predicted to reach ``max_new_tokens`` and starts in index order). ``reserve``: tokens to
    reserve per completion (a predicted quantile); ``predictor``: an object of the
    ``lengthsched.LengthPredictor`` protocol asked again, with the tokens generated so far as
    prefix, when a completion outlives its prediction. A predictor that learns online (one with
    ``observe``, e.g. ``lengthsched.OnlineLengthPredictor``) is also told, at every decision, which
    completions finished (exact lengths) and how far the running ones are (censored), and the
    pending completions are predicted again after a sibling finishes. ``prompt_ids``: the prompt
    key of each completion, what the predictor is asked about (None: completion indices).
    ``quantile``: the predicted quantile reserved. ``stream``: draws the length of extra
    completions for the dynamic-slot policy, ``stream(index) -> length``. ``kv_cap``: with a
    compressed KV cache (Sparse-RL, ``lengthsched.KVCompression.max_retained``), the most generated
    tokens a sequence holds (tokens); the policies admit by the capped KV, so a budget holds more
    sequences at once (the SGLang models' reservations stay uncompressed).
    """

    lengths: np.ndarray
    max_new_tokens: int
    prompt_len: int = 0
    slots: int | None = None
    budget_tokens: int | None = None
    predicted: np.ndarray | None = None
    reserve: np.ndarray | None = None
    predictor: Any = None
    refill: str = "sjf"
    eps: float = 0.05
    stream: Callable[[int], int] | None = None
    prompt_ids: tuple | None = None
    quantile: float = 0.9
    kv_cap: int | None = None

    @property
    def n(self) -> int:
        return len(self.lengths)

    def query(self, jobs: Any) -> list:
        """What a predictor is asked about for these completions: their prompt keys, or their indices."""
        return [self.prompt_ids[j] for j in jobs] if self.prompt_ids is not None else [int(j) for j in jobs]

    @property
    def online(self) -> bool:
        """Whether the predictor learns from what happens during the run (it has ``observe``)."""
        return self.predictor is not None and hasattr(self.predictor, "observe")

    def held(self, tokens: Any) -> Any:
        """KV tokens a sequence holds with ``tokens`` generated (scalar or array): capped at ``kv_cap``."""
        return tokens if self.kv_cap is None else np.minimum(tokens, self.kv_cap)

    def point(self) -> np.ndarray:
        """Predicted lengths, or ``max_new_tokens`` for all when nothing is predicted."""
        if self.predicted is None:
            return np.full(self.n, self.max_new_tokens, dtype=np.int64)
        return np.minimum(self.predicted, self.max_new_tokens)


class SimPolicy:
    """Base class: decides admissions at every event (see :meth:`Engine.run`)."""

    name = "policy"
    pads = False  # finished rows stay (decoding padding) until released, as in a padded batch
    block_size = 1
    promises_budget = False  # the engine raises if KV ever exceeds the budget
    respects_slots = True  # the engine raises if more than ``slots`` sequences are live

    def __init__(self, problem: Problem):
        self.problem = problem
        self._fed = 0  # completions already reported to an online predictor

    def observe_events(self, eng: Engine) -> set:
        """Tell an online predictor what happened since the last decision: every completion that
        finished (its exact length) and the progress of the running siblings of those prompts
        (censored: at least that many tokens). Returns the prompts (predictor keys) that changed:
        empty when nothing finished."""
        p = self.problem
        if not p.online:
            return set()
        new = eng.collected[self._fed:]
        self._fed = len(eng.collected)
        changed = set()
        for job in new:
            key = p.query([job])[0]
            changed.add(key)
            p.predictor.observe(key, eng.length[job], completion=job)
        if changed:
            for job in eng.running:
                key = p.query([job])[0]
                if key in changed:
                    p.predictor.observe(key, eng.age(job), finished=False, completion=job)
        return changed

    def of_prompts(self, jobs: list[int], keys: set) -> list[int]:
        """The completions among ``jobs`` whose prompt is one of ``keys``."""
        query = self.problem.query
        return [j for j, k in zip(jobs, query(jobs)) if k in keys]

    def predict_again(self, eng: Engine, jobs: list[int], progress: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(point, quantile) predictions of the TOTAL length of ``jobs`` that have generated ``progress``
        tokens, from the problem's predictor, capped at ``max_new_tokens``."""
        p = self.problem
        out = p.predictor.predict(p.query(jobs), prefixes=progress, quantiles=[p.quantile])
        done = np.asarray(progress, dtype=np.int64)
        point = np.minimum(done + np.maximum(1, np.asarray(out.lengths, dtype=np.int64)), p.max_new_tokens)
        upper = np.minimum(done + np.maximum(1, np.asarray(out.quantile(p.quantile), dtype=np.int64)), p.max_new_tokens)
        return point, upper

    def start(self, eng: Engine) -> None:
        """Called once before the first decision (plans are made here)."""

    def decide(self, eng: Engine) -> None:
        raise NotImplementedError

    def wakeup(self, eng: Engine) -> int | None:
        """A step (after now) at which to decide again even if nothing finishes; None for none."""
        return None

    def pending(self, eng: Engine) -> int:
        """Completions not yet finished and not live."""
        return eng.n - len(eng.collected) - len(eng.running)


def overflow_wakeup(eng: Engine, budget: int) -> int | None:
    """The last step after which every live sequence can still grow by one token within
    ``budget`` (token-granular KV): deciding then lets a policy preempt before it overflows. With a
    capped KV (``Engine.kv_cap``) the sequences growing now are counted, so it is a step or more early."""
    growing = eng.growing()
    if not growing:
        return None
    return eng.t + max(1, (budget - eng.kv_tokens()) // growing)


def slot_cap(name: str, *, slots: int | None, budget_tokens: int | None, max_new_tokens: int,
             kv_cap: int | None = None) -> int:
    """Slots of a policy that reserves ``max_new_tokens`` per sequence: min(slots, budget // L_max);
    with a compressed cache (``kv_cap``: generated tokens a sequence holds at most), budget //
    min(L_max, kv_cap)."""
    caps = []
    if slots is not None:
        caps.append(slots)
    if budget_tokens is not None:
        held = max_new_tokens if kv_cap is None else min(max_new_tokens, kv_cap)
        per_budget = budget_tokens // held
        if per_budget < 1:
            raise InvalidArgument("budget_tokens", budget_tokens,
                                  f"at least {held} tokens (what one sequence holds) for policy '{name}'")
        caps.append(per_budget)
    if not caps:
        raise InvalidArgument("slots", None, f"slots or budget_tokens for policy '{name}'")
    return min(caps)


def _slot_cap(problem: Problem, name: str) -> int:
    return slot_cap(name, slots=problem.slots, budget_tokens=problem.budget_tokens,
                    max_new_tokens=problem.max_new_tokens, kv_cap=problem.kv_cap)


class FullGroup(SimPolicy):
    """All completions decode together from step 1 (ignores slots and budget)."""

    name = "full"
    respects_slots = False

    def __init__(self, problem: Problem, padded: bool = True):
        super().__init__(problem)
        self.pads = padded
        self.name = "full" if padded else "full_freed"

    def decide(self, eng: Engine) -> None:
        if eng.t == 0 and not eng.origin and not eng.collected:
            for job in range(eng.n):
                eng.admit(job)
        elif self.pads and len(eng.collected) == eng.n:
            for job in list(eng.origin):
                eng.release(job)


class MicroGroups(SimPolicy):
    """Rounds of g consecutive completions as padded batches; a round ends with its longest."""

    name = "micro"
    pads = True

    def __init__(self, problem: Problem):
        super().__init__(problem)
        self.g = _slot_cap(problem, self.name)
        self.promises_budget = problem.budget_tokens is not None  # g <= budget // L_max then
        self.next = 0

    def decide(self, eng: Engine) -> None:
        if eng.origin and not eng.running:  # the whole round finished: free it
            for job in list(eng.origin):
                eng.release(job)
        if not eng.origin and self.next < eng.n:
            for job in range(self.next, min(self.next + self.g, eng.n)):
                eng.admit(job)
            self.next += self.g


class FixedSlots(SimPolicy):
    """g slots, each refilled at once with the next completion in index order (FCFS)."""

    name = "fixed_slot"

    def __init__(self, problem: Problem, name: str = "fixed_slot"):
        super().__init__(problem)
        self.name = name
        self.g = _slot_cap(problem, name)
        self.promises_budget = problem.budget_tokens is not None
        self.next = 0  # nothing is ever preempted: index order is a counter

    def decide(self, eng: Engine) -> None:
        while len(eng.origin) < self.g and self.next < eng.n:
            eng.admit(self.next)
            self.next += 1


class DynamicSlots(SimPolicy):
    """g slots refilled from an endless stream; collection stops when G have finished.

    Biased towards short completions: a negative control, never for training data.
    """

    name = "dynamic_slot"

    def __init__(self, problem: Problem):
        super().__init__(problem)
        if problem.stream is None:
            raise InvalidArgument("stream", None, "a length stream for policy 'dynamic_slot'")
        self.g = _slot_cap(problem, self.name)
        self.promises_budget = problem.budget_tokens is not None
        self.target = problem.n
        self.next = 0

    def decide(self, eng: Engine) -> None:
        if len(eng.collected) >= self.target:
            # Completions that finished on the same step as the G-th are beyond G: discarded.
            for job in eng.collected[self.target:]:
                eng.discarded_tokens += eng.length[job]
            del eng.collected[self.target:]
            eng.stop()
            return
        while eng.live < self.g:
            job = self.next if self.next < eng.n else eng.spawn(self.problem.stream(self.next))
            self.next += 1
            eng.admit(job)

    def pending(self, eng: Engine) -> int:
        return 0


class LengthAware(SimPolicy):
    """The Infinite Sampling scheduler: ``plan_group`` on predicted lengths, refill by its rule.

    Slots mode: FPTAS slot queues. Budget mode: each completion reserves its reserved length
    (default: the predicted length); micro groups from the subset-sum FPTAS are admitted in
    order while reservations fit. Overflow rule: a completion that outgrows its reservation keeps
    running and holds what it has grown to; admissions wait; if live sequences alone would exceed
    the budget at the next step, the most recently admitted one is preempted (it recomputes its
    KV when admitted again), so the budget is never exceeded.
    """

    name = "length_aware"

    def __init__(self, problem: Problem, refill: str | None = None):
        super().__init__(problem)
        self.refill = refill or problem.refill
        self.name = "length_aware" if self.refill == "sjf" else f"length_aware_{self.refill}"
        self.budget = problem.budget_tokens
        self.promises_budget = self.budget is not None

    def start(self, eng: Engine) -> None:
        p = self.problem
        predicted = p.point()
        reserve = predicted if p.reserve is None else p.reserve  # run_group clipped it to max_new_tokens
        if self.budget is not None:  # no reservation can exceed the budget: it then runs alone
            reserve = p.held(np.minimum(reserve, self.budget))  # KV held (capped with a compressed cache)
        # Without predictions there is nothing to plan with: one queue in index order.
        order = {} if p.predicted is not None else {"grouping": "none", "refill": "fcfs"}
        options = {"refill": self.refill, "eps": p.eps, "max_new_tokens": p.max_new_tokens, **order}
        if self.budget is None:
            self.plan = plan_group(predicted, slots=p.slots, **options)
        else:
            self.plan = plan_group(predicted, budget_tokens=self.budget, slots=p.slots, reserve_lengths=reserve,
                                   **options)
        self.reserve = list(self.plan.reserve_lengths)
        self.point = list(self.plan.lengths)
        self.sched = GroupScheduler.from_plan(self.plan)
        self.cap = self.plan.slots

    def _need(self, job: int, tokens: int) -> int:
        """KV ``job`` holds at most with ``tokens`` generated by the next step: its reservation or what it has."""
        return max(self.reserve[job], self.problem.held(tokens))

    def _next_step_usage(self, eng: Engine) -> int:
        return sum(self._need(j, eng.age(j) + 1) for j in eng.origin)

    def _refresh(self, eng: Engine, changed: set) -> None:
        """After a sibling finished, predict its prompt's pending completions again (SJF order, reservations)."""
        jobs = self.of_prompts(self.sched.pending_jobs(), changed)
        if not jobs:
            return
        point, upper = self.predict_again(eng, jobs, [eng.done[j] for j in jobs])
        for j, total, high in zip(jobs, point.tolist(), upper.tolist()):
            self.point[j] = total
            self.reserve[j] = high if self.budget is None else self.problem.held(min(high, self.budget))
            self.sched.update_prediction(j, max(1, total - eng.done[j]))

    def decide(self, eng: Engine) -> None:
        changed = self.observe_events(eng)
        if changed:
            self._refresh(eng, changed)
        if self.budget is None:
            self._decide_slots(eng)
            return
        used = self._next_step_usage(eng)
        # Overflow rule: keep the next step within the budget by preempting the newest.
        while eng.running and eng.kv_tokens(eng.t + 1) > self.budget:
            job = next(reversed(eng.running))
            used -= self._need(job, eng.age(job) + 1)
            eng.preempt(job)
            self.sched.requeue(job, max(1, self.point[job] - eng.done[job]))
        while eng.live < self.cap:
            job = self.sched.next_in_order()
            if job is None or used + self._need(job, eng.done[job] + 1) > self.budget \
                    or not eng.can_prefill(job):
                return
            self.sched.take(job)
            used += self._need(job, eng.done[job] + 1)
            eng.admit(job)

    def _decide_slots(self, eng: Engine) -> None:
        busy = set(eng.lane.values())
        for lane in range(self.cap):
            if lane in busy:
                continue
            job = self.sched.next_for_slot(lane)
            if job is None:
                return
            self.sched.take(job)
            eng.admit(job, lane)

    def wakeup(self, eng: Engine) -> int | None:
        return None if self.budget is None else overflow_wakeup(eng, self.budget)


class GrowthAware(SimPolicy):
    """Admit a completion only if the predicted KV curve stays under the budget at every future
    step: each live sequence grows one token per step until its predicted length, then frees.

    Candidates come in refill-rule order (``plan_group`` with ``grouping="none"``). Admission is
    evaluated when a sequence finishes or reaches its predicted length. A sequence that outlives
    its prediction is predicted again (the problem's predictor with its tokens so far as the
    prefix; without a predictor it is assumed to run to ``max_new_tokens``). Overflow rule as in
    :class:`LengthAware`: preempt the newest before the budget would be exceeded.
    """

    name = "growth_aware"
    promises_budget = True

    def __init__(self, problem: Problem, refill: str | None = None):
        super().__init__(problem)
        if problem.budget_tokens is None:
            raise InvalidArgument("budget_tokens", None, "a KV budget for the growth-aware policies")
        self.refill = refill or problem.refill
        self.name = "growth_aware" if self.refill == "sjf" else f"growth_aware_{self.refill}"
        self.budget = problem.budget_tokens
        self.cap = problem.slots or problem.n

    def start(self, eng: Engine) -> None:
        p = self.problem
        # Predicted total length of each completion; one predicted beyond the budget runs alone.
        self.total = [self._clip(int(x)) for x in p.point()]
        plan = plan_group(self.total, slots=p.n, max_new_tokens=p.max_new_tokens, grouping="none",
                          refill=self.refill if p.predicted is not None else "fcfs")
        self.sched = GroupScheduler.from_plan(plan)

    def _clip(self, total: int) -> int:
        """A predicted total length, clipped to the budget when the KV it would hold exceeds it (a
        compressed cache whose cap fits the budget holds any length)."""
        return total if self.problem.held(total) <= self.budget else self.budget

    def _repredict(self, eng: Engine) -> None:
        late = [j for j in eng.running if eng.age(j) >= self.total[j]]
        if not late:
            return
        p = self.problem
        if p.predictor is None:
            for j in late:
                self.total[j] = self._clip(p.max_new_tokens)
            return
        point, _ = self.predict_again(eng, late, [eng.age(j) for j in late])
        for j, total in zip(late, point.tolist()):
            self.total[j] = self._clip(total)

    def _refresh(self, eng: Engine, changed: set) -> None:
        """After a sibling finished, predict its prompt's pending and running completions again."""
        pending = self.of_prompts(self.sched.pending_jobs(), changed)
        running = self.of_prompts(list(eng.running), changed)
        jobs = pending + running
        if not jobs:
            return
        point, _ = self.predict_again(eng, jobs, [eng.done[j] for j in pending] + [eng.age(j) for j in running])
        for j, total in zip(jobs, point.tolist()):
            self.total[j] = self._clip(total)
        for j in pending:
            self.sched.update_prediction(j, max(1, self.total[j] - eng.done[j]))

    def delay(self, eng: Engine, job: int) -> int | None:
        """Fewest steps to wait before ``job`` can start with the predicted curve under the budget
        at every future step (0: admit now); None if it cannot start before something ends. With a
        compressed cache (``Problem.kv_cap``) each curve is capped at the tokens a sequence holds."""
        cap = self.problem.kv_cap
        ages = np.fromiter((eng.age(j) for j in eng.running), dtype=np.int64, count=len(eng.running))
        left_live = np.fromiter((self.total[j] for j in eng.running), dtype=np.int64, count=len(ages)) - ages
        start = eng.done[job]
        left = self.total[job] - start
        if self.problem.held(start + left) > self.budget:
            return None
        if not len(ages):
            return 0
        if cap is not None:
            return self._capped_delay(ages, left_live, start, left, cap)
        # Starting now: the predicted total peaks where a live sequence is about to end, or where
        # the newcomer ends; check those points first (the common case is a yes).
        points = np.append(left_live[left_live <= left], min(left, int(left_live.max())))
        grown = np.where(left_live[None, :] >= points[:, None], ages[None, :] + points[:, None], 0).sum(axis=1)
        if (grown + start + points).max() <= self.budget:
            return 0
        # F(u): predicted KV of the live sequences at the end of step now + u, u = 1..H.
        order = np.argsort(left_live)
        r, a = left_live[order], ages[order]
        horizon = int(r[-1])
        u = np.arange(1, horizon + 1)
        first = np.searchsorted(r, u, side="left")  # live sequences with r >= u are r[first:]
        suffix = np.concatenate((np.cumsum(a[::-1])[::-1], [0]))
        g = suffix[first] + (len(r) - first) * u + u  # F(u) + u
        # Starting after d steps adds start + u - d at u in [d + 1, d + left]: the window's maximum of
        # F + u is at its right end or just before a sequence ends (at u = r_j), since F + u only
        # grows between those points.
        d = np.arange(0, horizon + 1)[:, None]
        right = np.minimum(d[:, 0] + left, horizon)
        ends = np.unique(r)[None, :]
        inside = (ends >= d + 1) & (ends <= right[:, None])
        peak = np.where(inside, g[ends - 1], 0).max(axis=1)
        peak = np.where(d[:, 0] + 1 <= horizon, np.maximum(peak, g[right - 1]), 0)
        ok = np.nonzero(peak <= self.budget - start + d[:, 0])[0]
        return int(ok[0]) if ok.size else None

    def _capped_delay(self, ages: np.ndarray, left_live: np.ndarray, start: int, left: int, cap: int) -> int | None:
        """:meth:`delay` with every sequence holding at most ``cap`` generated tokens: a live one holds
        min(age + u, cap) at u steps from now while u <= its predicted steps left, the newcomer started
        after d steps min(start + u - d, cap). Both only grow between the ends of live sequences, so a
        window's peak is at its right end or at such an end, as without the cap."""
        horizon = int(left_live.max())
        u = np.arange(1, horizon + 1)
        alive = left_live[None, :] >= u[:, None]
        f = np.where(alive, np.minimum(ages[None, :] + u[:, None], cap), 0).sum(axis=1)  # F(u), u = 1..H
        d = np.arange(0, horizon + 1)[:, None]
        right = np.minimum(d[:, 0] + left, horizon)
        ends = np.unique(left_live)[None, :]
        inside = (ends >= d + 1) & (ends <= right[:, None])
        at_ends = f[ends - 1] + np.minimum(start + ends - d, cap)
        peak = np.where(inside, at_ends, 0).max(axis=1)
        at_right = f[right - 1] + np.minimum(start + right - d[:, 0], cap)
        peak = np.where(d[:, 0] + 1 <= horizon, np.maximum(peak, at_right), 0)
        ok = np.nonzero(peak <= self.budget)[0]
        return int(ok[0]) if ok.size else None

    def decide(self, eng: Engine) -> None:
        changed = self.observe_events(eng)
        if changed:
            self._refresh(eng, changed)
        self._repredict(eng)
        while eng.running and eng.kv_tokens(eng.t + 1) > self.budget:
            job = next(reversed(eng.running))
            eng.preempt(job)
            self.sched.requeue(job, self.total[job] - eng.done[job])
        self.wait = None
        while eng.live < self.cap:
            job = self.sched.next_in_order()
            if job is None or not eng.can_prefill(job):
                return
            wait = self.delay(eng, job)
            if wait != 0:
                self.wait = wait
                return
            self.sched.take(job)
            eng.admit(job)

    def wakeup(self, eng: Engine) -> int | None:
        if not eng.running:
            return None
        # When a sequence is predicted to end, when the head of the queue fits, before an overflow.
        wake = [eng.t + self.total[j] - eng.age(j) for j in eng.running]
        if self.wait:
            wake.append(eng.t + self.wait)
        overflow = overflow_wakeup(eng, self.budget)  # None: nothing grows (every sequence at a compressed cap)
        return min(wake) if overflow is None else min(min(wake), overflow)
