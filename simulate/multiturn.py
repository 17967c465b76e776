"""Multi-turn rollouts: agent loops whose completions are several turns with tool calls between them.

An agentic RL step (verl's ``ToolAgentLoop``, slime's and AReaL's multi-turn rollouts) runs each
completion as a *session*: the model generates a turn, stops at a tool call, the tool runs for some
seconds while the engine serves others, its answer is appended to the conversation, and the next turn
is a new request whose prompt is the whole conversation so far. Three things a single-turn step does
not have decide where its time goes:

- **Gaps.** A session leaves its engine for the tool's seconds; the step ends when the last session's
  last turn ends, so a session with long tools and many turns is a critical path no placement shortens.
- **Growing prompts, and the prefix cache.** Turn k's prompt is the prompt, the earlier turns and the
  tools' answers. An engine that ran turn k - 1 still holds that conversation in its prefix cache
  (vLLM's unreferenced cached blocks), unless it evicted it under pressure; there turn k prefills only
  the tool's answer. Anywhere else it prefills the whole conversation.
- **Routing.** verl's ``AsyncLLMServerManager`` (0.9.1, ``experimental/agent_loop/agent_loop.py``)
  sends a session's first request to the server that has received the fewest sessions and every later
  turn to the same server (sticky by request id), for the cache. A later turn joins the back of that
  engine's queue.

:func:`run_multiturn` models this on the replicas' one clock in modelled seconds. Each turn is a request
of its own (the engine's job); a turn's prompt tail and context include the conversation before it;
when a turn finishes at ``t`` its session's next turn arrives at ``t`` + its tool's seconds on the same
replica, and that replica's prefix cache keeps the conversation meanwhile
(``Engine.cache_conversation``: held in the pool as vLLM holds cached blocks, evicted oldest first when
the pool needs room, a hit skips the prefill of its whole blocks). A replica that has a turn arriving
decides at its first step boundary after the arrival (its steps are cut short to see it).

Policies (``MULTITURN_POLICIES``):

- ``vllm``: vLLM FCFS on every replica, verl's sticky session routing (the baseline).
- ``vllm_priority``: vLLM's priority scheduling, priorities from the predictions (minus the session's
  predicted length, longest first), the sessions routed as verl routes them. With ``follow_turns``
  every turn carries its session's priority (``lengthsched.integrations.verl.SessionPriorityClient``);
  without, only the first turn does and later turns take vLLM's default priority 0, which ranks with the
  plan's first (a plan's priorities are ranks from 0, lower first), so later turns go ahead of every
  planned request still waiting, by arrival: what verl 0.9.1's ``ToolAgentLoop`` makes of lengthsched's
  plan (it passes no priority to ``generate``).
- ``steal``: the project's policy (``lengthsched.runtime.dispatch.WorkStealing``) over the sessions' first
  turns, placed as it places requests; a later turn joins its session's replica's queue. With
  ``follow_turns`` it may be stolen or moved like any request, its predicted work what the session's
  prediction leaves after the earlier turns; without, the stealing never sees it.
- ``steal_observed``: the same, every steal and move decided by a
  :class:`~lengthsched.integrations.StealCoordinator` from the replicas' snapshots, as lengthsched's verl
  drivers decide (``StealDriver(turns=True)`` with ``follow_turns``: the coordinator learns of a later turn
  from the first snapshot of its replica that shows it, as the driver does, its prompt the conversation;
  without, it is told of first turns only, as ``StealDriver(turns=False)``).
- ``sglang``: SGLang's FCFS scheduler on every replica (``lengthsched.runtime.baselines.SGLangLike``: a request
  admitted only with room for its whole remaining ``max_new_tokens`` beyond the running requests'
  reservations). Its radix cache keeps a conversation token by token; the cached tokens of conversations count
  as free when it admits (SGLang's ``PrefillAdder`` counts the tree's evictable tokens as available) and are
  evicted, oldest first, only when a request's tokens need their room. Routed as ``router`` says: verl's sticky
  sessions, or ``cache_aware``, SGLang's router on every turn as slime runs it (a request goes where the longest
  prefix of its text the router has seen went, when that is more than 30% of its text and the loads are
  balanced; the router never sees answers, so after a long turn the next one often goes to the least loaded
  replica and prefills its whole conversation there), or a ``placement`` with a client window
  (:func:`run_slime_multiturn`: lengthsched's slime integration).
- ``steal_sglang``: ``steal`` over SGLang's engines (every turn may be stolen or moved, with ``follow_turns``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lengthsched import InvalidArgument
from lengthsched.errors import check_int, check_nonnegative_float, check_positive_float
from lengthsched.integrations.rollout import place_ways
from lengthsched.memory import held_token_steps
from lengthsched.runtime import Engine, Problem
from lengthsched.runtime.baselines import VLLMPriority, ran_dry
from lengthsched.runtime.dispatch import GroupQueue
from lengthsched.runtime.replicas import async_load_steps, prompt_blocks
from lengthsched.runtime.timing import DEFAULT_PREFILL_CHUNK

from .rollout import (
    LiveRouter,
    _check_placement,
    _ClientWindow,
    _lower_bound,
    _OneClock,
    _prepare,
    observe_board,
    route,
    share_board,
    steal_ways,
)
from .run import compression_cap

__all__ = ["CACHE_THRESHOLD", "MULTITURN_POLICIES", "MULTITURN_ROUTERS", "MULTITURN_RUNS", "MULTITURN_SLIME_RUNS",
           "MultiTurnResult", "Turns", "run_multiturn", "run_multiturn_row", "run_slime_multiturn", "split_turns"]

#: The policies :func:`run_multiturn` models.
MULTITURN_POLICIES = ("vllm", "vllm_priority", "steal", "steal_observed", "sglang", "steal_sglang")
#: How :func:`run_multiturn` routes the sessions of an engine policy: ``sticky`` (verl's) or ``cache_aware``
#: (SGLang's router, as slime runs it).
MULTITURN_ROUTERS = ("sticky", "cache_aware")
#: sglang-router's ``cache_threshold`` (0.3, its default; slime keeps it): a request goes where its text's longest
#: cached prefix is only when that prefix is more than this share of its text.
CACHE_THRESHOLD = 0.3

#: The runs a multi-turn comparison makes (``lengthsched simulate --turns``, ``bench_simulate.py --sections
#: rollout_multiturn``): (label, policy, options for :func:`run_multiturn`, predictions: None, "given" or "oracle");
#: the first is the reference.
MULTITURN_RUNS = (
    ("vllm + verl's sticky routing (the baseline)", "vllm", {}, None),
    ("vllm + verl's sticky routing, no prefix cache", "vllm", {"prefix_cache": False}, None),
    ("vllm_priority, plan priorities on first turns only (verl 0.9.1's ToolAgentLoop: later turns at 0, first)",
     "vllm_priority", {"follow_turns": False}, "given"),
    ("vllm_priority, the session's priority on every turn (SessionPriorityClient)", "vllm_priority", {}, "given"),
    ("steal, first turns only (a driver that does not follow turns)", "steal", {"follow_turns": False}, "given"),
    ("steal, every turn", "steal", {}, "given"),
    ("steal_observed, first turns only (StealDriver(turns=False): decided from snapshots)", "steal_observed",
     {"follow_turns": False}, "given"),
    ("steal_observed, every turn (StealDriver(turns=True): decided from snapshots)", "steal_observed", {}, "given"),
    ("steal, every turn, oracle predictions", "steal", {}, "oracle"),
    ("vllm + a cache-aware router on every turn (SGLang's router's rule: later turns rebalanced by load)", "vllm",
     {"router": "cache_aware"}, None),
)


#: The runs of a multi-turn comparison on SGLang's engines, as slime runs them (``bench_simulate.py --sections
#: rollout_multiturn_slime``): (label, policy, options, predictions: None or "given"); the first is the reference,
#: slime as it ships. Policy ``"slime"``: :func:`run_slime_multiturn` (options: its ``window``); the others
#: :func:`run_multiturn` (options: its ``router``). Every turn of a stealing run may be stolen or moved.
MULTITURN_SLIME_RUNS = (
    ("sglang + SGLang's router on every turn (slime as it ships)", "sglang", {"router": "cache_aware"}, None),
    ("sglang, sticky sessions (verl's routing)", "sglang", {}, None),
    ("sglang + lengthsched.integrations.slime (plan, client window of 2 pools)", "slime", {}, "given"),
    ("sglang + lengthsched.integrations.slime, no window (lengthsched_window: 0)", "slime", {"window": 0.0}, "given"),
    ("steal_sglang, every turn (aborts by request id: not in the slime integration)", "steal_sglang", {}, "given"),
    ("vllm + verl's sticky routing (vLLM's engines)", "vllm", {}, None),
    ("steal, every turn (vLLM's engines)", "steal", {}, "given"),
)


def run_multiturn_row(policy: str, options: dict, groups: Sequence[Any], turns: Turns, predicted: Any,
                      **kwargs: Any) -> MultiTurnResult:
    """One run of :data:`MULTITURN_SLIME_RUNS`: ``policy`` ``"slime"`` is :func:`run_slime_multiturn`, any other
    :func:`run_multiturn`; ``options`` and ``kwargs`` (``replicas``, ``budget_tokens``, ...) go to it."""
    if policy == "slime":
        return run_slime_multiturn(groups, turns, predicted, **options, **kwargs)
    return run_multiturn(groups, turns, policy, predicted=predicted, **options, **kwargs)


@dataclass(frozen=True)
class Turns:
    """The turns of a step's completions, flattened in group order: completion i generates
    ``lengths[i]`` (tokens per turn, summing to its length), and between turn k and k + 1 a tool runs
    for ``tool_seconds[i][k]`` seconds and adds ``tool_tokens[i][k]`` tokens to the conversation."""

    lengths: tuple[np.ndarray, ...]
    tool_tokens: tuple[np.ndarray, ...]
    tool_seconds: tuple[np.ndarray, ...]

    def __post_init__(self) -> None:
        n = len(self.lengths)
        if len(self.tool_tokens) != n or len(self.tool_seconds) != n:
            raise InvalidArgument("turns", f"{n} sessions, {len(self.tool_tokens)} tool tokens, "
                                  f"{len(self.tool_seconds)} tool seconds", "one entry per completion in each")
        for i, (ls, tt, ts) in enumerate(zip(self.lengths, self.tool_tokens, self.tool_seconds)):
            if len(ls) < 1 or np.min(ls) < 1:
                raise InvalidArgument("turns", f"completion {i}'s turns {list(ls)}", "one turn at least, each of "
                                                                                    "at least one token")
            if len(tt) != len(ls) - 1 or len(ts) != len(ls) - 1:
                raise InvalidArgument("turns", f"completion {i}: {len(ls)} turns, {len(tt)} tool answers, "
                                               f"{len(ts)} tool seconds", "one tool call between two turns")
            if len(tt) and (np.min(tt) < 0 or not np.all(np.isfinite(ts)) or np.min(ts) < 0):
                raise InvalidArgument("turns", f"completion {i}'s tools {list(tt)}, {list(ts)}",
                                      "non-negative tokens and finite non-negative seconds")

    @property
    def count(self) -> int:
        """Turns in all."""
        return sum(len(x) for x in self.lengths)

    def take(self, sessions: Any) -> Turns:
        """The turns of ``sessions`` (indices), in that order: what a step whose completions were reordered runs."""
        index = np.asarray(sessions, dtype=np.int64).ravel().tolist()
        return Turns(tuple(self.lengths[i] for i in index), tuple(self.tool_tokens[i] for i in index),
                     tuple(self.tool_seconds[i] for i in index))


def split_turns(groups: Sequence[Any], *, turns: tuple[int, int] = (2, 5),
                tool_tokens: tuple[int, int] = (30, 600), tool_seconds: float = 0.5, tool_sigma: float = 1.0,
                seed: int = 0) -> Turns:
    """Turn every completion of ``groups`` (objects with ``lengths``) into a session: its length cut
    at random points into a number of turns drawn uniformly from ``turns`` (at most its length), a
    tool call between two turns whose answer adds a number of tokens drawn log-uniformly from
    ``tool_tokens`` (a fewest of 0 reads as 1: a log-uniform draw never gives 0; ``(0, 0)``: no answers) and which
    lasts a log-normal number of seconds (median ``tool_seconds``, log-sd ``tool_sigma``; a search or a code run:
    a fraction of a second to many seconds)."""
    lo, hi = (check_int("turns", t, minimum=1) for t in turns)
    if hi < lo:
        raise InvalidArgument("turns", turns, "(fewest, most) with fewest <= most")
    t_lo, t_hi = (check_int("tool_tokens", t, minimum=0) for t in tool_tokens)
    if t_hi < t_lo:
        raise InvalidArgument("tool_tokens", tool_tokens, "(fewest, most) with fewest <= most")
    median = check_positive_float("tool_seconds", tool_seconds)
    sigma = check_nonnegative_float("tool_sigma", tool_sigma)
    rng = np.random.default_rng(check_int("seed", seed, minimum=0))
    lengths, answers, seconds = [], [], []
    for g in groups:
        for total in np.asarray(g.lengths, dtype=np.int64).tolist():
            k = min(int(rng.integers(lo, hi + 1)), total)
            cuts = np.sort(rng.choice(np.arange(1, total), size=k - 1, replace=False)) if k > 1 else []
            lengths.append(np.diff(np.concatenate([[0], cuts, [total]])).astype(np.int64))
            answers.append(np.round(np.exp(rng.uniform(math.log(max(t_lo, 1)), math.log(max(t_hi, 1)), k - 1)))
                           .astype(np.int64) if t_hi > 0 else np.zeros(k - 1, dtype=np.int64))
            seconds.append(median * np.exp(sigma * rng.standard_normal(k - 1)))
    return Turns(tuple(lengths), tuple(answers), tuple(seconds))


@dataclass(frozen=True)
class MultiTurnResult:
    """One multi-turn rollout step. ``seconds``: the makespan (modelled; the last turn's finish);
    ``replica_seconds``: when each replica ran its last step; ``preemptions``, ``recomputed_tokens``,
    ``prefill_tokens`` (prompts, conversations, recomputation): summed over replicas; ``cache_hits``:
    later turns that found their conversation in their replica's prefix cache, ``cache_hit_tokens``:
    the tokens they did not prefill; ``later_turns``: turns after the first; ``moved_turns``: later turns
    that ran elsewhere than their previous turn (stolen or moved); ``lower_bound_seconds``: no placement
    and schedule finishes sooner (the larger of the single-turn bound over every turn as a request of its
    own, each turn's decode rows reading and holding its conversation and every tool answer prefilled, and the
    slowest session's path: its tokens decoded one a step reading its conversation, its answers prefilled, plus
    its tools' seconds);
    ``tokens``: tokens generated; ``step_logs``: each replica's :class:`~lengthsched.runtime.StepLog` (what
    ``benchmarks/gpu_replay.py`` replays); ``router``: how the sessions were routed (``"placed"``: a
    placement); ``host_hits``: later turns that loaded their conversation from host memory (``kv_offload``)."""

    policy: str
    follow_turns: bool
    prefix_cache: bool
    replicas: int
    seconds: float
    replica_seconds: tuple[float, ...]
    preemptions: int
    recomputed_tokens: int
    prefill_tokens: int
    cache_hits: int
    cache_hit_tokens: int
    later_turns: int
    moved_turns: int
    lower_bound_seconds: float
    tokens: int
    budget_tokens: int
    step_logs: tuple = ()
    router: str = "sticky"
    host_hits: int = 0


def _enqueue(pol: Any, job: int, arrival: int) -> None:
    """``job``, the ``arrival``-th request to reach an engine, joins the back of ``pol``'s waiting queue
    (vLLM's priority queue: by its priority, then arrival)."""
    if isinstance(pol, VLLMPriority):
        pol.set_arrival(job, arrival)
        heapq.heappush(pol.waiting, (pol.priority[job], arrival, job))
    else:
        pol.waiting.insert(0, job)  # a stack: the front is the end


def run_multiturn(groups: Sequence[Any], turns: Turns, policy: str = "vllm", *, replicas: int = 1,
                  budget_tokens: int, max_new_tokens: int, predicted: Any = None, cost: Any = None,
                  prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK, follow_turns: bool = True,
                  prefix_cache: bool = True, snapshot_seconds: float | None = None,
                  max_num_seqs: int | None = None, router: str = "sticky", placement: Any = None,
                  client_window: float | None = None, client_steals: bool = True,
                  kv_offload: bool = False, compression: Any = None) -> MultiTurnResult:
    """Simulate one multi-turn rollout step (see the module docstring): ``groups`` (objects with
    ``lengths``, each completion's total generated tokens, ``prompt_len`` and ``prompt_id``, e.g.
    :class:`simulate.Group`) as sessions cut into ``turns`` (:func:`split_turns`) on ``replicas``
    engines under ``policy`` (:data:`MULTITURN_POLICIES`). ``budget_tokens``: each replica's KV pool in
    tokens, prompts and cached conversations included; ``max_new_tokens``: the most a session generates;
    ``predicted``: each session's predicted total length, flattened in group order (a prompt-level
    predictor gives siblings the same number), or None; ``cost``: the step-cost model (default Qwen3-1.7B
    on the H100 preset); ``follow_turns``: whether the policy steers later turns (``vllm_priority``:
    their session's priority; ``steal``: they may be stolen and moved); ``prefix_cache``: whether a
    replica keeps a conversation (and a prompt with nothing running) cached for the next turn;
    ``snapshot_seconds``: for ``steal_observed``, the modelled seconds between a replica's snapshots at least
    (``run_rollout``'s; None: the policy's own); ``max_num_seqs``: requests each replica runs at once at most
    (vLLM's ``max_num_seqs``; None: only the pool limits them).

    ``router`` (the engine policies; the stealing ones place sessions themselves): ``"sticky"`` (verl 0.9.1's
    ``AsyncLLMServerManager``: a session's first request to the server that has had the fewest sessions, every
    later turn to the same one) or ``"cache_aware"`` (sglang-router's ``CacheAwarePolicy``, as slime runs it:
    every request, each turn, routed when it is sent on the requests in flight per replica; where the loads are
    balanced (see :class:`~simulate.rollout.LiveRouter`) it goes where the longest prefix of its text the router
    has seen went, if that prefix is more than :data:`CACHE_THRESHOLD` of its text, else to the least loaded
    replica. The router sees requests, not answers: a first turn matches its group's prompt, sent first where the
    group's first request went; turn 2 matches only the prompt, so it returns to the group's replica if the
    prompt is more than 0.3 of its conversation; turn k > 2 matches turn k - 1's request, so it returns to that
    turn's replica if that request is more than 0.3 of its own. A turn sent elsewhere than its conversation
    prefills it whole there.) ``placement``: the replica of every session (flattened in group order), all its
    turns there (sticky), instead of the router's: a client that sends each session where a plan put it, as
    :mod:`lengthsched.integrations.slime`'s ``generate`` does for a multi-turn generate function. ``client_window``
    (with ``placement``): that client's window (``run_rollout``'s): the sessions wait in its queue per replica,
    in session order, and a replica is sent the next while the predicted tokens (prompt plus predicted session
    length) of the sessions it was sent and that have not ended stay within ``client_window`` x
    ``budget_tokens``; with ``client_steals`` a replica whose queue ran empty takes the last queued session of
    the replica with the most predicted work queued. :func:`run_slime_multiturn` runs the integration's plan
    this way. ``kv_offload``: every replica keeps in host memory what it evicts (vLLM's ``--kv-offloading-backend
    native`` with prefix caching): a preempted request's KV, loaded back asynchronously when it runs there again
    (``run_rollout``'s), and a cached conversation evicted under pressure, which a later turn admitted there loads
    back instead of prefilling (its load charged to the step that admits it, a pessimistic bound; without
    ``prefix_cache`` only the preempted requests); host memory is taken to hold everything.
    ``compression``: a ``lengthsched.KVCompression`` (Sparse-RL's compressed cache): each turn holds and reads at
    most ``compression.max_retained`` of the tokens it generates, its conversation (the prompt, the earlier turns
    and the tools' answers, what the request is given) whole; a compressed turn's KV is no prefix of the next
    turn's conversation, so no replica keeps a conversation cached for the next turn (``prefix_cache`` keeps
    prompts only) and every later turn prefills its whole conversation again."""
    if policy not in MULTITURN_POLICIES:
        raise InvalidArgument("policy", policy, "one of " + ", ".join(MULTITURN_POLICIES))
    if router not in MULTITURN_ROUTERS:
        raise InvalidArgument("router", router, "one of " + ", ".join(MULTITURN_ROUTERS))
    if snapshot_seconds is not None:
        snapshot_seconds = check_positive_float("snapshot_seconds", snapshot_seconds)
        if policy != "steal_observed":
            raise InvalidArgument("snapshot_seconds", snapshot_seconds, "None with policy " + repr(policy)
                                  + " (steal_observed decides from snapshots)")
    if not isinstance(kv_offload, bool):
        raise InvalidArgument("kv_offload", kv_offload, "True (evicted KV kept in host memory) or False")
    if not isinstance(turns, Turns):
        raise InvalidArgument("turns", type(turns).__name__, "a simulate.multiturn.Turns (split_turns)")
    if hasattr(predicted, "observe") or hasattr(predicted, "predict"):
        raise InvalidArgument("predicted", type(predicted).__name__, "predicted lengths per session (a predictor "
                                                                     "object is not modelled in multi-turn steps)")
    kv_cap = compression_cap(compression, policy, rollout=True)
    spec, groups, _, flat, owner, _, common = _prepare(groups, policy, replicas, budget_tokens, max_new_tokens,
                                                        predicted, cost, 0, prefill_chunk, False, max_num_seqs)
    if len(turns.lengths) != len(flat):
        raise InvalidArgument("turns", f"{len(turns.lengths)} sessions", f"{len(flat)}, one per completion")
    totals = np.array([int(x.sum()) for x in turns.lengths], dtype=np.int64)
    if (totals != flat).any():
        bad = int(np.flatnonzero(totals != flat)[0])
        raise InvalidArgument("turns", f"completion {bad}'s turns sum to {int(totals[bad])}",
                              f"its length, {int(flat[bad])} tokens")
    cost, pred, budget, prompt_lens = common["cost"], common["pred"], common["budget"], common["prompt_lens"]
    cls = spec.cls
    block = cls.block_size
    steals = bool(getattr(cls, "STEALS", False))
    if steals:  # it places the sessions itself
        for name, given, value, default in (("router", router != "sticky", router, "sticky"),
                                            ("placement", placement is not None, "a placement", None),
                                            ("client_window", client_window is not None, client_window, None)):
            if given:
                raise InvalidArgument(name, value, f"{default!r} with policy {policy!r} (it places the sessions "
                                                   "itself)")
    if placement is not None:
        if router != "sticky":
            raise InvalidArgument("router", router, "'sticky' with a placement (every turn to its session's replica)")
        placement = _check_placement(placement, len(flat), replicas)
    if client_window is not None:
        client_window = check_positive_float("client_window", client_window)
        if placement is None:
            raise InvalidArgument("client_window", client_window, "None without a placement (the client queues each "
                                                                  "session for its planned replica)")

    # The turns as requests, numbered turn by turn (every first turn, then every second one, ...).
    counts = np.array([len(x) for x in turns.lengths], dtype=np.int64)
    level_of, session_of = [], []
    for k in range(int(counts.max())):
        ids = np.flatnonzero(counts > k)
        session_of.append(ids)
        level_of.append(np.full(len(ids), k, dtype=np.int64))
    session = np.concatenate(session_of)
    level = np.concatenate(level_of)
    n = len(session)
    job_of = {(int(s), int(k)): j for j, (s, k) in enumerate(zip(session.tolist(), level.tolist()))}
    length = np.array([int(turns.lengths[s][k]) for s, k in zip(session.tolist(), level.tolist())], dtype=np.int64)
    before = np.zeros(n, dtype=np.int64)  # tokens the session generated in its earlier turns
    conv = np.zeros(n, dtype=np.int64)  # conversation before the turn beyond the prompt (turns and tool answers)
    nxt = np.full(n, -1, dtype=np.int64)  # its session's next turn (-1: the last)
    prev = np.arange(n)  # its session's previous turn (itself for a first turn)
    gap = np.zeros(n)
    for j in range(n):
        s, k = int(session[j]), int(level[j])
        if k:
            before[j] = int(turns.lengths[s][:k].sum())
            conv[j] = before[j] + int(turns.tool_tokens[s][:k].sum())
        if k + 1 < counts[s]:
            nxt[j] = job_of[(s, k + 1)]
            prev[nxt[j]] = j
            gap[j] = float(turns.tool_seconds[s][k])
    job_owner = owner[session]
    tails_p, prompt_kv = prompt_blocks(prompt_lens, block)
    tails = tails_p[job_owner] + conv
    context = prompt_lens[job_owner] + conv
    need = prompt_kv[job_owner] + -(-(tails + (length if kv_cap is None else np.minimum(length, kv_cap))) // block) \
        * block
    if need.max() > budget:
        bad = int(np.argmax(need))
        raise InvalidArgument("budget_tokens", budget, f"at least {int(need[bad])} tokens: turn {int(level[bad]) + 1} "
                                                       f"of session {int(session[bad])} with its conversation "
                                                       f"({int(context[bad])} tokens) in blocks of {block}")
    # What each turn's request tells the engine: the session's prediction (priority) or what it leaves (work).
    if pred is None:
        job_pred = None
    elif policy == "vllm_priority":
        job_pred = pred[session].astype(np.int64)
        if not follow_turns:
            # vLLM's default priority 0, ahead of every planned request (a plan's priorities are ranks, >= 0)
            job_pred[level > 0] = common["max_new"]
    else:
        job_pred = np.maximum(pred[session] - before, 1).astype(np.int64)

    problem = Problem(lengths=length, max_new_tokens=common["max_new"], budget_tokens=budget, predicted=job_pred,
                      slots=common["max_seqs"], kv_cap=kv_cap)
    engines, pols = [], []
    for r in range(replicas):
        pol = cls(problem, GroupQueue(np.zeros(0, dtype=np.int64), []), r, []) if steals else cls(problem)
        pol.waiting.clear()
        eng = Engine(length, tails=tails if block > 1 or conv.any() else None, block_size=block,
                     budget_tokens=budget, enforce_budget=True, context=context, prefill_chunk=common["prefill_chunk"],
                     kv_cap=kv_cap)
        eng.hold_prompts(job_owner, prompt_kv)
        eng.cache_prompts = prefix_cache
        if kv_offload:
            eng.offload, eng.offload_conversations = True, prefix_cache and kv_cap is None
            eng.load_steps = async_load_steps(cost)
        engines.append(eng)
        pols.append(pol)
    first = np.flatnonzero(level == 0)  # = session ids, in order
    coord = live = None  # live: the router that picks each turn's replica when it is sent (cache_aware)
    if steals:
        work, ways = steal_ways(groups, pred, budget, replicas, common["max_new"], cls, kv_cap=kv_cap)
        placed = place_ways(work, [len(g.lengths) for g in groups], replicas, ways)
        share_board(pols, engines, [pol.waiting for pol in pols], cls.RESUBMIT_SECONDS)
        pinned = set() if follow_turns else set(np.flatnonzero(level > 0).tolist())
        for pol in pols:
            pol.pinned = pinned
        if hasattr(pols[0], "coord"):  # steal_observed: a coordinator told what is submitted where
            coord = observe_board(pols, budget, snapshot_seconds)
            for pol in pols[1:]:
                pol.unannounced = pols[0].unannounced
    elif placement is not None:
        placed = placement
    elif router == "cache_aware":  # every first turn sent at once: a group's go where its first went while balanced
        live = LiveRouter("cache_aware", replicas)
        placed = np.array([live.select(int(g)) for g in job_owner[first].tolist()], dtype=np.int64)
    else:
        placed = route(groups, "least_loaded", replicas)  # verl: each session to the server with fewest sessions
    where = np.full(n, -1, dtype=np.int64)  # the replica each turn is sent to
    arrived = 0  # requests that reached an engine so far

    def send(job: int, r: int) -> None:  # ``job`` joins the back of replica r's queue
        nonlocal arrived
        _enqueue(pols[r], job, arrived)
        arrived += 1
        engines[r].claim(job)
        if coord is not None and (follow_turns or not level[job]):  # a driver that sees it
            told = dict(predicted=float(pols[0].work[job]), prompt_tokens=int(context[job]), group=int(job_owner[job]))
            if level[job]:  # a later turn: the driver learns of it from the first snapshot that shows it
                pols[0].unannounced[job] = told
            else:  # a first turn: submitted by the manager
                coord.submit(job, r, **told)

    window = None
    if client_window is not None:  # a client's queues: each session waits for its planned replica's window
        window = _ClientWindow(placed, replicas, owner, prompt_lens, pred, common["max_new"], budget, client_window,
                               client_steals, kv_cap=kv_cap)
        for j in first.tolist():
            window.enter(j)
        initial = window.send()
    else:
        initial = [(j, int(placed[j])) for j in first.tolist()]
    for j, r in initial:
        where[j] = r
        send(j, r)

    clock = _OneClock(engines)
    idle, wake = clock.idle, clock.wake
    arrivals: list[tuple[float, int]] = []  # (seconds, turn) of later turns whose tools run
    due: list[list[float]] = [[] for _ in range(replicas)]  # per replica, a heap of its arrivals' seconds
    due_all: list[float] = []  # arrivals whose replica the router picks when they come (every replica sees them)
    seen = [0] * replicas
    ran = np.full(n, -1, dtype=np.int64)  # the replica each turn finished on
    while clock.heap:
        now, r = heapq.heappop(clock.heap)
        if r < 0:  # tools that finished by now: their next turns join their replicas' queues
            while arrivals and arrivals[0][0] <= now:
                _, job = heapq.heappop(arrivals)
                if live is None:
                    target = int(where[job])
                    heapq.heappop(due[target])
                else:  # SGLang's router: by the longest prefix it has seen of the turn's text, unless imbalanced
                    heapq.heappop(due_all)
                    before_turn = int(prev[job])
                    home, matched = ((live.home[int(job_owner[job])], int(prompt_lens[job_owner[job]]))
                                     if level[job] == 1 else (int(where[before_turn]), int(context[before_turn])))
                    target = live.select_prefix(home, matched / max(1, int(context[job])), CACHE_THRESHOLD)
                    where[job] = target
                    if target != ran[before_turn]:  # its conversation, cached where its turn ran, is not used
                        engines[int(ran[before_turn])].drop_cached(job)
                send(job, target)
                wake((target,), now)
                if steals and idle:  # the idle may steal it
                    wake(list(idle), now)
            continue
        eng, pol = engines[r], pols[r]
        if len(eng.collected) > seen[r]:
            ended = []
            for job in eng.collected[seen[r]:]:
                ran[job] = r
                if live is not None:
                    live.finished(r)
                later = int(nxt[job])
                if later < 0:
                    ended.append(int(session[job]))
                    continue
                at = now + float(gap[job])
                if prefix_cache and kv_cap is None:  # (a compressed turn's KV is no prefix of the next's)
                    eng.cache_conversation(later, int(tails[job] + length[job]))
                heapq.heappush(arrivals, (at, later))
                if live is None:
                    where[later] = r  # sticky: where its session's turn ran
                    heapq.heappush(due[r], at)
                else:
                    heapq.heappush(due_all, at)
                heapq.heappush(clock.heap, (at, -1))
            seen[r] = len(eng.collected)
            if window is not None and ended:  # sessions that ended leave their replica's window
                window.finished(r, ended)
                for j, target in window.send():
                    where[j] = target
                    send(j, target)
                    wake((target,), now)
        if steals:
            pol.idle_now, pol.now = idle, now
        alive = eng.decide(pol)
        if getattr(pol, "woke", None):
            wake(pol.woke, now)
            pol.woke = []
        if not alive:
            ran_dry(pol, eng)
            idle.add(r)
            continue
        if steals and pol.blocked and idle:
            wake(list(idle), now)
        t_next = eng.next_event()
        if due[r] or due_all:  # a turn arrives here (or anywhere): decide at the first step boundary after it
            soon = min(due[r][0] if due[r] else math.inf, due_all[0] if due_all else math.inf)
            step = cost.segment_seconds_float(1, max(eng.live, 1), eng.read_tokens())
            ahead = max(1, int((soon - now) / step)) if step > 0 else 1
            t_next = min(t_next, eng.t + ahead)
        clock.run(r, t_next, pol.pads, cost, now)
    if (ran < 0).any():
        raise InvalidArgument("policy", policy, "a policy that finishes every turn it is sent")
    later = level > 0
    moved = int(np.sum(later & (ran != ran[prev])))
    answers = _answers(turns, session, level, context)
    logs = [eng.step_log() for eng in engines]
    replica_seconds = tuple(float(secs[-1]) for _, secs in clock.clocks())
    return MultiTurnResult(
        policy=policy, follow_turns=bool(follow_turns), prefix_cache=bool(prefix_cache), replicas=replicas,
        seconds=max(replica_seconds), replica_seconds=replica_seconds,
        preemptions=sum(eng.preemptions for eng in engines),
        recomputed_tokens=sum(eng.recomputed_tokens for eng in engines),
        prefill_tokens=sum(int(log.prefill_tokens.sum()) for log in logs),
        cache_hits=sum(eng.cache_hits for eng in engines),
        cache_hit_tokens=sum(eng.cache_hit_tokens for eng in engines),
        host_hits=sum(eng.host_hits for eng in engines),
        later_turns=int(later.sum()), moved_turns=moved,
        lower_bound_seconds=max(_lower_bound(cost, length, job_owner, prompt_lens, budget, replicas, conv=conv,
                                             answers=answers, chain=int(flat.max()), kv_cap=kv_cap),
                                _session_bound(cost, turns, flat, prompt_lens[owner], session, level, length,
                                               conv - before, answers, kv_cap=kv_cap, before=before)),
        tokens=int(flat.sum()), budget_tokens=budget, step_logs=tuple(logs),
        router="placed" if placement is not None else router)


def _answers(turns: Turns, session: np.ndarray, level: np.ndarray, context: np.ndarray) -> tuple[np.ndarray,
                                                                                                  np.ndarray]:
    """(tokens, attention pairs) of each tool answer, prefilled before the turn after it (``session``, ``level``,
    ``context``: per turn its session, its place there and the conversation before it, the prompt and the answer
    included)."""
    counts = np.array([len(x) for x in turns.tool_tokens], dtype=np.int64)
    flat = np.concatenate([np.asarray(x, dtype=np.int64) for x in turns.tool_tokens]) if counts.sum() else \
        np.zeros(0, dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)  # where each session's answers start
    later = np.flatnonzero(level > 0)
    tokens = flat[start[session[later]] + level[later] - 1]
    before = context[later] - tokens  # what the answer attends beside itself
    return tokens, tokens * before + tokens * (tokens + 1) // 2


def _session_bound(cost: Any, turns: Turns, flat: np.ndarray, context: np.ndarray, session: np.ndarray,
                   level: np.ndarray, length: np.ndarray, answered: np.ndarray,
                   answers: tuple[np.ndarray, np.ndarray], kv_cap: int | None = None,
                   before: np.ndarray | None = None) -> float:
    """The slowest session's path (seconds): its tokens decoded one a step (reading its prompt, its own tokens
    and the tool answers before them), its tool answers prefilled, and its tools' seconds. Per turn (``session``,
    ``level``, ``length``): ``answered``, the tool answers before it; ``answers``: :func:`_answers`' (tokens, pairs),
    one per later turn. ``kv_cap`` (a compressed cache): a turn's rows read its earlier turns whole (``before``,
    per turn the tokens its session generated before it) and at most ``kv_cap`` of its own."""
    steps = flat.astype(np.int64)
    n = len(steps)
    reads = np.bincount(session, weights=length * answered, minlength=n)  # later turns' rows reading the answers
    later = session[level > 0]
    if kv_cap is None:
        own = steps * (steps - 1) // 2  # each token reads the session's earlier ones
    else:
        own = np.bincount(session, weights=length * before + held_token_steps(length - 1, kv_cap),
                          minlength=n).astype(np.int64)
    kv = steps * context + own + reads.astype(np.int64)
    decode = np.asarray(cost.lower_bound_seconds(steps=steps, decode_tokens=steps, kv_tokens_read=kv,
                                                 prefill_tokens=np.bincount(later, weights=answers[0], minlength=n),
                                                 prefill_context=np.bincount(later, weights=answers[1], minlength=n)),
                        dtype=float)
    tools = np.array([float(np.sum(x)) for x in turns.tool_seconds])
    return float(np.max(decode + tools))


def run_slime_multiturn(groups: Sequence[Any], turns: Turns, predicted: Any, *, replicas: int, budget_tokens: int,
                        max_new_tokens: int, window: float | None = None, steals: bool = True,
                        **kwargs: Any) -> MultiTurnResult:
    """slime running a multi-turn generate function on SGLang's engines, with :mod:`lengthsched.integrations.slime`
    (``lengthsched_generate_function_path``: every request the function posts, each turn, goes to the engine its
    sample was planned on), in the model: the integration's own planner (``placement="ways"``, ``submit="auto"``,
    each replica's pool ``budget_tokens``) plans the step from ``predicted`` (each session's predicted length,
    flattened in group order: a prompt-level predictor's, or the planner's predictor itself, asked about each
    group's ``prompt_id``; one that has seen no length leaves the step unplanned, and it is then slime as it ships:
    ``run_multiturn(..., "sglang", router="cache_aware")``), the sessions are handed over in the planner's order and
    wait in the client's window (``window`` KV pools per engine, default the integration's
    :data:`~lengthsched.integrations.slime.WINDOW`; 0: every session sent at once; none on one replica) with
    ``steals``, each one's turns all on its engine. ``kwargs`` go to :func:`run_multiturn` (``cost``,
    ``prefix_cache``, ``max_num_seqs``, ``prefill_chunk``). The result's sessions are in the planner's order."""
    from .rollout import _slime_order, _slime_planner, _slime_window

    client_window = _slime_window(window, replicas)
    for name in ("router", "placement", "client_window", "client_steals", "predicted"):
        if name in kwargs:
            raise InvalidArgument(name, kwargs[name], "not given (run_slime_multiturn routes through the plan)")
    groups, sizes, starts, pred, samples, planner = _slime_planner(groups, predicted, budget_tokens, max_new_tokens,
                                                                   "ways", "auto", None)
    common = dict(replicas=replicas, budget_tokens=budget_tokens, max_new_tokens=max_new_tokens, **kwargs)
    if not planner.planning:  # slime's router sends every turn, as slime ships
        return run_multiturn(groups, turns, "sglang", router="cache_aware", **common)
    order, placed, pred_reordered = _slime_order(planner, samples, groups, sizes, starts, pred, replicas)
    sessions = np.concatenate([np.arange(starts[i], starts[i] + sizes[i]) for i in order]) if len(order) else []
    return run_multiturn([groups[i] for i in order], turns.take(sessions), "sglang", predicted=pred_reordered,
                         placement=placed, client_window=client_window, client_steals=steals, **common)
