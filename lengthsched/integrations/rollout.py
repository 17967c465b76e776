"""A rollout step on engine replicas: which replica runs each completion, and each request's priority.

:func:`plan_rollout` computes, for a batch as a framework hands it over (one row per completion, a
group key per row), the replica of every row and an engine priority that runs each replica's rows
longest predicted first (vLLM's ``scheduling_policy="priority"``); the verl and TRL integrations
send it to the engines. Four placements, all static (decided once per batch):

- ``"spread"`` (the default): row i to replica ``i mod R``, as verl's router spreads a batch
  submitted at once (a group's samples over the replicas). With the priorities this is the
  simulator's ``vllm_priority`` with verl's routing (``least_loaded``): 1.2% faster than vLLM FCFS +
  verl on average over the 90 rollout settings of docs/benchmarks.md (modelled seconds, realistic
  prompt-level predictions), slower in 23, worst 1.092x.
- ``"groups"``: whole groups placed by predicted work (the partitioning core), the simulator's
  ``placed_lpt``: each prompt held on one replica only, but 1.2% SLOWER on average on the same
  settings (slower in 38, worst 1.236x): with imperfect predictions, whole groups unbalance the
  replicas. Use it only when prompts held on every replica would crowd the KV pools.
- ``"classes"``: length classes (:func:`lengthsched.runtime.replicas.plan_classes`, the simulator's
  ``placed_classes``): the longest predicted completions gathered on few replicas and the short
  ones on replicas that finish early, or verl's spread where a simulation of the step on the
  predicted lengths finds that faster. It needs the rows' prompt lengths, each replica's KV pool and
  a step-cost model, and it pays only when each completion's length is predicted well: with
  predictions learnt from one earlier epoch of the same prompts on groups whose siblings agree
  (:func:`lengthsched.placement.recommend_rollout_policy` says when), 8.5% faster than vLLM + verl
  over the multi-replica CASTILLO settings (preset); with prompt-only predictions 1.18x SLOWER on
  average. See docs/benchmarks.md, "Length classes".
- ``"ways"``: the placement of the simulator's ``steal`` (:func:`spread_ways`, :func:`place_ways`):
  each group spread over as many replicas as the pools hold its prompts, whole groups when the
  step's predicted tokens fill every pool :data:`CROWDED_POOLS` times over. It needs the rows' prompt
  lengths and each replica's KV pool. On its own (no stealing) it is no faster than verl's spread
  (1.003 of vLLM + verl over four draws of the grid, up to 1.251x slower): it is the placement to run
  with a framework that steals as the replicas drain (:mod:`lengthsched.integrations.verl_stealing`).

The simulator's recommended rollout policy is ``steal`` (``simulate.DEFAULT_POLICY``, 2.7% faster
than vLLM + verl on the same settings, never slower there by more than 0.1%; 2.7% over four draws of
them, slower in 4 of 360 by more than 0.1%, by at most 0.9%): each group spread over as many replicas
as the pools hold its prompts (whole groups in steps that keep every pool full; :func:`spread_ways`,
:func:`place_ways`), replicas that steal waiting requests from each other as they drain
(:func:`steal_requests`), and running requests moved to replicas that fell idle every
:data:`MOVE_CHUNK` tokens (:func:`move_requests`). Most of what it gains comes from moving partial
generations, requests the engine preempted or that run (moving only requests that never started: 0.4%
faster than vLLM + verl instead of 2.7% over four draws; docs/benchmarks.md, "What stealing gains, and
from what"), so a framework must abort a request on one engine and resubmit its prompt plus its partial
generation on another. :class:`~lengthsched.integrations.StealCoordinator` makes those decisions from
snapshots a framework can take; :mod:`lengthsched.integrations.verl_stealing` runs it inside verl's
agent-loop rollout (not yet on a cluster); the TRL integration sends a static plan.

Units: lengths and work in tokens; priorities are engine priorities (vLLM: lower runs first).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import zip_longest
from typing import Any

import numpy as np

from .. import partition
from ..errors import InvalidArgument, as_lengths, check_int, check_positive_float
from ..predictor import copy_predictor

__all__ = ["CROWDED_POOLS", "MOVE_CHUNK", "ORDERS", "PLACEMENTS", "PREFILL_SHARE", "PROMPT_SHARE", "STEAL_SHARE",
           "ClientQueues",
           "RolloutPlan", "decode_replica", "move_requests", "observe_lengths", "place_groups", "place_ways",
           "plan_rollout", "predict_lengths", "spread_ways", "steal_requests"]

#: The share of a replica's KV pool that :func:`spread_ways` lets the prompts a replica receives take
#: (the simulator's ``steal`` uses it; chosen over four draws of the rollout grid, docs/benchmarks.md,
#: "How widely to spread a group").
PROMPT_SHARE = 1.0

#: Whole groups (one replica each) once the step's predicted tokens per replica reach this many KV
#: pools (:func:`spread_ways` with ``work_tokens``): the pools then stay full and requests wait the
#: whole step, so replicas that steal rebalance what the predictions got wrong, and each prompt is
#: prefilled and held once. Set on the four tuning draws of the rollout grid with the moves of running
#: requests on (of 6, 8 and 10, 6 gains most there, with the best worst case, and loses nothing on the
#: held-out prompts or under the fitted 8B cost), docs/benchmarks.md, "How widely to spread a group".
CROWDED_POOLS = 6.0

#: For a stream of groups kept in flight (verl's fully asynchronous recipe: :mod:`~.verl_async`), at most
#: this share of a group's predicted completion tokens re-prefilled as its prompt on the replicas beyond the
#: first (:func:`spread_ways` ``prefill_share``): each replica a group spreads over prefills its prompt once
#: more. Chosen on one draw of the asynchronous settings (0.05, 0.1 and whole groups tried) and checked on
#: three others (docs/benchmarks.md, "lengthsched.integrations.verl_async inside the recipe").
PREFILL_SHARE = 0.1

#: The share of the victim's waiting predicted work a drained replica takes (:func:`steal_requests`).
STEAL_SHARE = 0.5

#: The placements :func:`plan_rollout` knows (see the module docstring): ``spread`` (verl's, the
#: default), ``groups`` (whole groups by predicted work), ``classes`` (length classes) and ``ways``
#: (``steal``'s: each group over as many replicas as the pools hold its prompts).
PLACEMENTS = ("spread", "groups", "classes", "ways")

#: The orders :func:`plan_rollout` ranks each replica's rows in: ``longest`` (longest predicted first,
#: what an engine's priority scheduling makes of vLLM's ``vllm_priority``; the default, except for
#: ``ways``), ``batch`` (the order of the rows in the batch: an engine with priority scheduling then
#: starts them as FCFS would, as the simulator's ``steal`` does; the default for ``ways``) and
#: ``longest_crowded`` (``longest`` where the plan places every group whole on one of several replicas,
#: as ``ways`` does in crowded steps, else ``batch``: the simulator's ``WorkStealing.ORDER =
#: "longest_crowded"``).
ORDERS = ("longest", "batch", "longest_crowded")

# Engines take 64-bit signed priorities (vLLM's OpenAI protocol and SGLang's tokenizer manager
# both reject values outside [-2**63, 2**63)).
_INT64_MAX = 2**63 - 1


def _check_loads(loads: Any, replicas: int) -> np.ndarray | None:
    """``loads`` (predicted tokens already on each replica) as a new array of floats (the placements add to
    it), None when absent or all zero."""
    if loads is None:
        return None
    arr = np.array(loads, dtype=np.float64).reshape(-1)  # a copy: the caller's loads stay as they were
    if arr.shape != (replicas,) or not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise InvalidArgument("loads", loads if arr.size <= 8 else f"{arr.size} values",
                              f"{replicas} finite token counts >= 0, one per replica")
    return arr if np.any(arr > 0) else None


def place_groups(work: Any, replicas: int, loads: Any = None) -> tuple[int, ...]:
    """The replica of each group: the better of LPT and Karmarkar-Karp on the groups' predicted
    work (tokens; a group's work is the sum of its completions' predicted lengths, at least 1),
    the rule of ``simulate.run_rollout`` for a policy that places groups itself (``placed_lpt``).
    One replica: every group on replica 0. ``loads``: predicted tokens each replica already has
    (an earlier batch still running or queued); then LPT from those loads (the largest group to the
    least loaded replica)."""
    sizes = as_lengths("work", work, minimum=0)
    replicas = check_int("replicas", replicas, minimum=1)
    start = _check_loads(loads, replicas)
    if replicas == 1:
        return (0,) * len(sizes)
    if start is not None:  # place_ways' greedy with each group one run of its work (whole groups)
        whole = place_ways(np.maximum(sizes, 1), np.ones(len(sizes), dtype=np.int64), replicas, 1, start)
        return tuple(int(r) for r in whole)
    of_group = [0] * len(sizes)
    for r, part in enumerate(partition.best_heuristic(np.maximum(sizes, 1), replicas).parts):
        for g in part:
            of_group[g] = r
    return tuple(of_group)


def spread_ways(prompt_tokens: Any, budget_tokens: int, replicas: int, share: float = PROMPT_SHARE, *,
                work_tokens: float | None = None, crowded: float = CROWDED_POOLS,
                prefill_share: float | None = None) -> int:
    """Over how many replicas to spread each group: the most (up to ``replicas``) for which the prompts
    a replica receives, ``ways / replicas`` of all the step's prompts (``prompt_tokens``: each group's
    prompt length in tokens), take at most ``share`` of its KV pool (``budget_tokens``, tokens), and
    at least 1; ``replicas`` when there are no prompt tokens. With ``work_tokens`` (the step's
    predicted completion tokens in all): 1 (whole groups) once they reach ``crowded`` pools per
    replica and there are prompt tokens; with ``prefill_share`` too (:data:`PREFILL_SHARE` for a stream
    of groups), at most ``1 + floor(prefill_share x work_tokens / prompt tokens)``: the prompts prefilled
    again on the replicas beyond each group's first stay within that share of its predicted work.
    Spreading wider balances the replicas whatever the length predictions got wrong (each replica gets a
    share of every group); it costs each prompt's prefill and KV on every replica that runs one of its
    completions. In a step that keeps every pool full the requests wait anyway and stealing balances
    the replicas, so whole groups cost little."""
    held = int(np.sum(as_lengths("prompt_tokens", prompt_tokens, minimum=0, allow_empty=True)))
    budget_tokens = check_int("budget_tokens", budget_tokens, minimum=1)
    replicas = check_int("replicas", replicas, minimum=1)
    share = check_positive_float("share", share)
    crowded = check_positive_float("crowded", crowded)
    work = None if work_tokens is None else check_positive_float("work_tokens", work_tokens)
    if prefill_share is not None:
        prefill_share = check_positive_float("prefill_share", prefill_share)
        if work is None:
            raise InvalidArgument("work_tokens", None, "the predicted completion tokens in all: prefill_share "
                                                       "weighs the prompts' prefill against them")
    if held == 0:
        return replicas
    if work is not None and work / replicas >= crowded * budget_tokens:
        return 1
    ways = int(max(1, min(replicas, np.floor(replicas * share * budget_tokens / held))))
    if prefill_share is not None:
        ways = min(ways, 1 + int(np.floor(prefill_share * work / held)))
    return ways


def place_ways(predicted: Any, group_sizes: Any, replicas: int, ways: int, loads: Any = None) -> np.ndarray:
    """The replica of every completion (flattened in group order) when each group is spread over
    ``ways`` replicas: ``ways >= replicas`` is verl's spread (completion i on replica ``i mod
    replicas``, exactly); otherwise each group's completions are cut into ``ways`` runs of nearly
    equal count, the groups taken in decreasing predicted work (``predicted``: tokens per completion),
    and a group's runs go to the ``ways`` replicas with the least predicted work so far, the run of
    most work to the least loaded (greedy longest-processing-time on runs). ``ways == 1`` places
    whole groups. ``loads``: predicted tokens each replica already has (the greedy starts from them;
    verl's spread ignores them)."""
    sizes = as_lengths("group_sizes", group_sizes, minimum=0, allow_empty=True)
    total = int(sizes.sum())
    pred = np.asarray(predicted, dtype=np.float64).reshape(-1)
    if pred.shape != (total,) or not np.all(np.isfinite(pred)) or np.any(pred < 0):
        raise InvalidArgument("predicted", f"{pred.size} values", f"{total} finite lengths >= 0, one per completion")
    replicas = check_int("replicas", replicas, minimum=1)
    ways = check_int("ways", ways, minimum=1)
    start = _check_loads(loads, replicas)
    if ways >= replicas:
        return np.arange(total, dtype=np.int64) % replicas
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    work = np.array([pred[s:s + n].sum() for s, n in zip(starts, sizes)], dtype=np.float64)
    out = np.zeros(total, dtype=np.int64)
    loads = np.zeros(replicas, dtype=np.float64) if start is None else start
    for g in np.argsort(-work, kind="stable"):
        start, n = int(starts[g]), int(sizes[g])
        k = min(ways, n)
        if k == 0:
            continue
        cuts = np.linspace(0, n, k + 1).round().astype(np.int64)
        runs = sorted(((pred[start + a:start + b].sum(), a, b) for a, b in zip(cuts[:-1], cuts[1:])),
                      key=lambda run: -run[0])
        for (run_work, a, b), r in zip(runs, np.argsort(loads, kind="stable")[:k]):
            out[start + a:start + b] = r
            loads[r] += run_work
    return out


_NONE = object()  # no request (ClientQueues.send's rounds)


class ClientQueues:
    """A client's queue per replica in front of the engines: each request waits in the queue of the
    replica a plan named, and a replica is sent its queue's front while the predicted tokens of what it
    was sent and has not finished stay within ``limit_tokens`` (one request at least); with ``steals``
    a replica whose queue is empty takes the back of the queue with the most predicted work, of what
    that queue's replica has no room for (a steal that needs no abort: the request was never sent).
    The simulator runs it as ``run_rollout(..., client_window=)``; :mod:`lengthsched.integrations.slime`
    in front of SGLang's engines. Pure Python; ``item`` is anything hashable (a request id, a sample).

    ``enter(item, replica, need, work)``: queue ``item`` for ``replica``; ``need`` its predicted tokens
    in flight (prompt plus predicted completion), ``work`` its predicted completion (what the steals
    compare). ``send()`` the (item, replica) pairs to send now. ``finished(replica, need)`` a request sent
    there finished. ``drop(item)`` takes a queued item out (an aborted rollout)."""

    def __init__(self, replicas: int, limit_tokens: float, *, steals: bool = True):
        self.replicas = check_int("replicas", replicas, minimum=1)
        self.limit = check_positive_float("limit_tokens", limit_tokens)
        self.steals = bool(steals)
        self.queues: list[deque[Hashable]] = [deque() for _ in range(self.replicas)]  # front first
        self.queued_work = [0.0] * self.replicas
        self.load = [0.0] * self.replicas  # predicted tokens sent and not finished, per replica
        self._need: dict[Hashable, tuple[float, float]] = {}

    def enter(self, item: Hashable, replica: int, need: float, work: float) -> None:
        replica = check_int("replica", replica, minimum=0)
        if replica >= self.replicas:
            raise InvalidArgument("replica", replica, f"a replica index in [0, {self.replicas - 1}]")
        self.queues[replica].append(item)
        self.queued_work[replica] += float(work)
        self._need[item] = (float(need), float(work))

    def finished(self, replica: int, need: float) -> None:
        self.load[replica] -= float(need)

    def outstanding(self) -> list[float]:
        """Per replica, the predicted tokens it still has: its queue's predicted completions plus what it
        was sent and has not finished (prompts and completions): the ``loads`` to plan a further batch
        from (:func:`plan_rollout`)."""
        return [max(0.0, w + x) for w, x in zip(self.queued_work, self.load)]

    def drop(self, item: Hashable) -> bool:
        """Take ``item`` out of its queue; False if it is not queued."""
        if item not in self._need:
            return False
        for r, queue in enumerate(self.queues):
            if item in queue:
                queue.remove(item)
                self.queued_work[r] -= self._need.pop(item)[1]
                return True
        return False

    def _fits(self, r: int, item: Hashable) -> bool:
        """Whether replica ``r``'s window has room for ``item`` (an empty window takes anything)."""
        return self.load[r] <= 0 or self.load[r] + self._need[item][0] <= self.limit

    def _sent(self, r: int, item: Hashable, source: int) -> None:
        need, work = self._need.pop(item)
        self.queued_work[source] -= work
        self.load[r] += need

    def _fullest(self) -> int | None:
        """The replica whose queue holds the most predicted work (ties: the lowest), None if all are empty."""
        best = None
        for q in range(self.replicas):
            if self.queues[q] and (best is None or self.queued_work[q] > self.queued_work[best]):
                best = q
        return best

    def send(self) -> list[tuple[Hashable, int]]:
        """(item, replica) pairs to send now: first every replica takes from its own queue while its
        window allows (in rounds: one request per replica and round); then (with steals) the replicas
        whose queues are empty take, in turn, from the back of the queue with the most predicted work
        what its own replica has no room for. O(R + sent x R) for R replicas."""
        own: list[list[Hashable]] = []
        for r, queue in enumerate(self.queues):
            taken = []
            while queue and self._fits(r, queue[0]):
                item = queue.popleft()
                self._sent(r, item, r)
                taken.append(item)
            own.append(taken)
        out = [(item, r) for turn in zip_longest(*own, fillvalue=_NONE) for r, item in enumerate(turn)
               if item is not _NONE]
        if not self.steals:
            return out
        source, moved = self._fullest(), True
        while moved and source is not None:
            moved = False
            for r in range(self.replicas):
                if self.queues[r] or source is None or not self._fits(r, self.queues[source][-1]):
                    continue
                item = self.queues[source].pop()
                self._sent(r, item, source)
                out.append((item, r))
                moved, source = True, self._fullest()
        return out


def steal_requests(queues: Sequence[Sequence[int]], thief: int, blocked: Sequence[bool], predicted: Any,
                   generated: Any = None, *, share: float = STEAL_SHARE,
                   started: bool = True) -> tuple[int | None, list[int]]:
    """What a drained replica takes from the others' waiting requests: the decision of the simulator's
    ``steal`` policy, for a framework that keeps its own view of the engines.

    Call it for replica ``thief`` when its waiting queue is empty and its running requests, grown to
    their predicted lengths, leave room in its KV pool. The victim is the replica, among the
    ``blocked`` ones (requests wait there for KV or for a running seat), with the most predicted work
    waiting (each request ``max(1, predicted - generated)`` tokens); the thief takes requests from the
    back of the victim's queue (the ones it would run last) until it has ``share`` of that work (at
    least one request). A request that generated tokens (preempted) moves with them: the framework
    aborts it where it waits and submits its prompt plus those tokens to the thief (most of
    ``steal``'s gain comes from these; ``started=False`` takes only requests that never ran).

    Args:
        queues: per replica, its waiting requests (ids indexing ``predicted``), front first.
        thief: the replica that takes.
        blocked: per replica, whether its queue waits for memory or a seat (not just for the next
            step's prefill budget).
        predicted: per request id, its predicted length (tokens).
        generated: per request id, the tokens it generated before it was preempted (None: none).
        share: share of the victim's waiting predicted work to take, in (0, 1].
        started: whether requests that generated tokens may move.

    Returns:
        (victim, requests to move in the victim's queue order, front first); (None, []) when no
        blocked replica has a request that may move.
    """
    n = len(queues)
    thief = check_int("thief", thief, minimum=0)
    if thief >= n:
        raise InvalidArgument("thief", thief, f"a replica index below {n} (one queue per replica)")
    if len(blocked) != n:
        raise InvalidArgument("blocked", f"{len(blocked)} values", f"{n}, one per queue")
    share = check_positive_float("share", share, maximum=1.0)
    best, best_work = None, 0.0
    for r, queue in enumerate(queues):
        if r == thief or not blocked[r]:
            continue
        work = sum(max(1.0, predicted[j] - (generated[j] if generated is not None else 0)) for j in queue
                   if started or generated is None or not generated[j])
        if work > best_work:
            best, best_work = r, work
    if best is None:
        return None, []
    want, got, taken = share * best_work, 0.0, []
    for j in reversed(queues[best]):  # from the back
        done = generated[j] if generated is not None else 0
        if not started and done:
            continue
        if taken and got >= want:
            break
        taken.append(j)
        got += max(1.0, predicted[j] - done)
    return best, taken[::-1]


#: Tokens a running request generates between the points where it may move to an idle replica (the
#: simulator's ``WorkStealing.MIGRATE_CHUNK``; docs/benchmarks.md, "What stealing gains, and from what").
MOVE_CHUNK = 128


def move_requests(ended: Sequence[int], idle: Sequence[int], predicted: Any, generated: Any,
                  running: int) -> list[tuple[int, int]]:
    """Which running requests of one replica move to replicas that sit idle: the decision of the
    simulator's ``steal`` (its moves of running requests), for a framework that keeps its own view
    of the engines.

    Call it for a replica whose running requests ``ended`` have just generated a whole number of
    :data:`MOVE_CHUNK` tokens, while replicas ``idle`` run nothing, have nothing waiting and nothing
    to steal. The requests with the most predicted tokens to go (``predicted - generated``; ties by
    id) move first, one to each idle replica (lowest index first), while at least one of the
    replica's ``running`` requests stays. The framework aborts each moved request and submits its
    prompt plus its ``generated`` tokens to the idle replica, which recomputes their KV (or loads it
    from a global KV pool where it has one).

    Args:
        ended: requests (ids indexing ``predicted``) running on the replica that just ended a chunk.
        idle: replicas that sit idle.
        predicted: per request id, its predicted length (tokens).
        generated: per request id (a sequence or a mapping), the tokens it generated so far.
        running: how many requests run on the replica (``ended`` among them).

    Returns:
        ``(request, replica)`` pairs, the request to move and the idle replica it goes to.
    """
    running = check_int("running", running, minimum=0)
    if len(ended) > running:
        raise InvalidArgument("running", running, f"at least len(ended) = {len(ended)} (ended requests are running)")
    order = sorted(ended, key=lambda j: (generated[j] - predicted[j], j))
    return list(zip(order, sorted(idle)))[:max(running - 1, 0)]


def decode_replica(priority: Any, replicas: int) -> int | None:
    """The replica a priority made by :func:`plan_rollout` names (``priority mod replicas``), or
    None when ``priority`` is not a non-negative integer (a request that was not planned)."""
    if isinstance(priority, bool) or not isinstance(priority, (int, np.integer)) or priority < 0:
        return None
    return int(priority) % check_int("replicas", replicas, minimum=1)


@dataclass(frozen=True)
class RolloutPlan:
    """The plan of one rollout step: per row (completion, in the batch's order) its ``group``
    (index into the plan's ``group_keys``: the distinct keys, by first appearance), ``replica`` and engine
    ``priority``; per group its key and
    replica (-1 when its rows are spread over several); per replica its predicted work (tokens,
    the sum of its rows' predictions); the ``placement`` and ``order`` it was made with.

    ``priority = rank x replicas + replica``: ``rank`` orders the rows of one replica (0 first:
    the longest predicted, ties by row, or the first in the batch with ``order="batch"``), so on
    every replica a lower value runs first (vLLM's convention) and :func:`decode_replica` recovers
    the replica from the priority alone (how the verl router learns where a request goes).
    """

    replicas: int
    group: tuple[int, ...]
    replica: tuple[int, ...]
    priority: tuple[int, ...]
    rank: tuple[int, ...]
    predicted: tuple[int, ...]
    group_keys: tuple[Hashable, ...]
    group_replica: tuple[int, ...]
    replica_work: tuple[int, ...]
    placement: str = "spread"
    order: str = "longest"

    def __len__(self) -> int:
        return len(self.group)

    def rows_on(self, replica: int) -> tuple[int, ...]:
        """Rows placed on ``replica``, in the order it should start them (ascending priority)."""
        replica = check_int("replica", replica, minimum=0)
        if replica >= self.replicas:
            raise InvalidArgument("replica", replica, f"an index below replicas={self.replicas}")
        rows = [i for i, r in enumerate(self.replica) if r == replica]
        return tuple(sorted(rows, key=lambda i: self.priority[i]))

    def group_spread(self) -> tuple[int, ...]:
        """Per group (as ``group_keys``), over how many replicas its rows are placed (1: whole; ``ways``
        spreads a group as far as the pools hold its prompt, or keeps it whole in crowded steps)."""
        seen: list[set[int]] = [set() for _ in self.group_keys]
        for g, r in zip(self.group, self.replica):
            seen[g].add(r)
        return tuple(len(s) for s in seen)

    def submission_order(self) -> tuple[int, ...]:
        """Every row, ascending priority (rank-major, then replica): the order to submit requests
        in, so that an engine that admits by arrival (FCFS) also starts them in the plan's order."""
        return tuple(sorted(range(len(self.priority)), key=lambda i: self.priority[i]))


def check_placement(placement: Any, allowed: Sequence[str] = PLACEMENTS) -> str:
    """``placement`` if it is one of ``allowed`` (default :data:`PLACEMENTS`), else
    :class:`InvalidArgument` naming it."""
    meaning = {"spread": "'spread' (verl's: row i to replica i mod replicas)",
               "groups": "'groups' (whole groups by predicted work)",
               "classes": "'classes' (length classes; needs prompt_lens, budget_tokens, max_new_tokens)",
               "ways": "'ways' (steal's: groups over as many replicas as the pools hold their prompts; needs "
                       "prompt_lens, budget_tokens)"}
    if placement not in allowed:
        raise InvalidArgument("placement", placement, " or ".join(meaning[a] for a in allowed))
    return placement


def check_order(order: Any, name: str = "order") -> str | None:
    """``order`` if it is one of :data:`ORDERS` or None, else :class:`InvalidArgument` naming it
    (as ``name``)."""
    if order is not None and order not in ORDERS:
        raise InvalidArgument(name, order, "'longest' (longest predicted first), 'batch' (batch order), "
                                              "'longest_crowded' (longest first where every group is placed "
                                              "whole) or None (the placement's default)")
    return order


def plan_rollout(group_keys: Sequence[Hashable], predicted: Any, *, replicas: int = 1, base: int = 0,
                 placement: str = "spread", prompt_lens: Any = None, budget_tokens: int | None = None,
                 max_new_tokens: int | None = None, cost: Any = None, order: str | None = None,
                 loads: Any = None) -> RolloutPlan:
    """Plan a rollout step: place the rows on ``replicas`` and rank each replica's rows (longest
    predicted first, or in batch order for ``ways``: ``order``). A row is one completion: a group of G
    completions is G rows with the same key (``group_keys``, ``predicted`` and ``prompt_lens`` are per row);
    ``budget_tokens`` is each replica's KV pool. The command ``lengthsched plan-rollout`` is this with
    ``placement="ways"`` (its default; the pool from ``--pool-tokens`` or ``--budget``).

    Args:
        group_keys: per row (one completion), the key of its group (verl's ``uid``, a prompt);
            rows of one group need not be adjacent. Groups are numbered by first appearance.
        predicted: per row, its predicted length (tokens, >= 0).
        replicas: engine replicas (>= 1).
        base: added to every priority (>= 0, a multiple of ``replicas`` so that
            :func:`decode_replica` still reads the replica), e.g. to keep calls' priorities apart.
        placement: ``"spread"`` (row i to replica i mod ``replicas``, as verl routes a batch; the
            default), ``"groups"`` (whole groups by predicted work, :func:`place_groups`),
            ``"classes"`` (length classes) or ``"ways"`` (``steal``'s: :func:`spread_ways` and
            :func:`place_ways` over the groups in order of first appearance); see the module
            docstring for what each measured.
        prompt_lens: per row, its prompt's length in tokens (``"classes"`` and ``"ways"``).
        budget_tokens: each replica's KV pool in tokens, prompts included (``"classes"`` and ``"ways"``).
        max_new_tokens: the longest a completion may be, in tokens (``"classes"`` only).
        cost: the step-cost model (:class:`lengthsched.cost.StepCost`; ``"classes"`` only; default
            Qwen3-1.7B on the H100 preset).
        order: how each replica's rows are ranked (one of :data:`ORDERS`): ``"longest"`` (longest
            predicted first, ties by batch order), ``"batch"`` (batch order) or ``"longest_crowded"``
            (``"longest"`` where every group is placed whole on one of several replicas, as ``"ways"``
            places them in crowded steps, else ``"batch"``; the plan records which); None: ``"batch"``
            for ``"ways"`` (``steal`` starts each replica's requests in placement order; longest first
            measured 0.6 points faster on average over four draws of the benchmark grid but slower than
            vLLM + verl by more than 1% in 8 of 360 settings against none, longest first in crowded steps
            only 0.3 points faster and slower by more than 1% in 1: docs/benchmarks.md, "steal's order on
            each replica"), ``"longest"`` for the others.
        loads: predicted tokens each replica already has (one value per replica: an earlier batch still
            running or queued there, e.g. the batches slime's dynamic sampling adds); ``"groups"`` and
            ``"ways"`` place from them (and ``"ways"`` counts them in the step's crowding); None: idle
            replicas. The plan's ``replica_work`` counts this batch only.
    """
    keys = list(group_keys) if not isinstance(group_keys, (str, bytes)) else None
    if not keys:
        raise InvalidArgument("group_keys", group_keys, "a non-empty sequence of group keys, one per row")
    pred = as_lengths("predicted", predicted, minimum=0)
    if len(pred) != len(keys):
        raise InvalidArgument("predicted", f"{len(pred)} values", f"{len(keys)} values, one per row of group_keys")
    replicas = check_int("replicas", replicas, minimum=1)
    base = check_int("base", base, minimum=0)
    if base % replicas:
        raise InvalidArgument("base", base, f"a multiple of replicas={replicas} (the replica is priority mod replicas)")
    check_placement(placement)
    order = check_order(order)
    start = _check_loads(loads, replicas)
    if start is not None and placement not in ("groups", "ways"):
        raise InvalidArgument("loads", loads, f"None with placement {placement!r} (only 'groups' and 'ways' place "
                                              "from the replicas' loads)")
    if order is None:
        order = "batch" if placement == "ways" else "longest"
    index: dict[Hashable, int] = {}
    try:
        group = [index.setdefault(k, len(index)) for k in keys]
    except TypeError as exc:  # an unhashable key
        raise InvalidArgument("group_keys", type(exc).__name__, "hashable keys (strings, ints)") from None
    work = np.zeros(len(index), dtype=np.int64)
    np.add.at(work, group, pred)
    ways = None  # "ways": over how many replicas each group is spread
    if placement == "groups":
        group_replica = place_groups(work, replicas, start)
        replica = [group_replica[g] for g in group]
    else:
        if placement == "classes":
            replica = _classes(pred, group, len(index), replicas, prompt_lens, budget_tokens, max_new_tokens, cost)
        elif placement == "ways":
            replica, ways = _ways(pred, group, len(index), replicas, prompt_lens, budget_tokens, start)
        else:
            replica = [i % replicas for i in range(len(keys))]
        seen: dict[int, set[int]] = {}
        for g, r in zip(group, replica):
            seen.setdefault(g, set()).add(r)
        group_replica = tuple(next(iter(seen[g])) if len(seen[g]) == 1 else -1 for g in range(len(index)))
    if order == "longest_crowded":  # longest first where every group is whole on one of several replicas
        whole = ways == 1 if placement == "ways" else min(group_replica) >= 0
        order = "longest" if whole and replicas > 1 else "batch"
    rank = [0] * len(keys)
    on: list[list[int]] = [[] for _ in range(replicas)]  # each replica's rows, in batch order
    for i, r in enumerate(replica):
        on[r].append(i)
    for rows in on:
        if order == "longest":
            rows.sort(key=lambda i: (-int(pred[i]), i))
        for k, i in enumerate(rows):
            rank[i] = k
    priority = [base + rank[i] * replicas + replica[i] for i in range(len(keys))]
    if priority and max(priority) > _INT64_MAX:
        raise InvalidArgument("base", base, "small enough that every priority fits a signed 64-bit integer")
    replica_work = [0] * replicas
    for i, r in enumerate(replica):
        replica_work[r] += int(pred[i])
    return RolloutPlan(replicas=replicas, group=tuple(group), replica=tuple(replica), priority=tuple(priority),
                       rank=tuple(rank), predicted=tuple(int(x) for x in pred), group_keys=tuple(index),
                       group_replica=tuple(group_replica), replica_work=tuple(replica_work), placement=placement,
                       order=order)


def _group_prompts(group: list[int], groups: int, prompt_lens: Any, values: dict[str, Any],
                   placement: str) -> np.ndarray:
    """Each group's prompt length (tokens; rows of one group share it), checking that ``values`` (the
    arguments ``placement`` needs besides ``prompt_lens``) are given."""
    for name, value in (("prompt_lens", prompt_lens), *values.items()):
        if value is None:
            raise InvalidArgument(name, None, f"a value: placement={placement!r} needs prompt_lens, "
                                              + ", ".join(values))
    rows = as_lengths("prompt_lens", prompt_lens, minimum=0)
    if len(rows) != len(group):
        raise InvalidArgument("prompt_lens", f"{len(rows)} values", f"{len(group)} values, one per row")
    per_group = np.zeros(groups, dtype=np.int64)
    np.maximum.at(per_group, np.asarray(group), rows)
    return per_group


def _ways(pred: np.ndarray, group: list[int], groups: int, replicas: int, prompt_lens: Any,
          budget_tokens: Any, loads: np.ndarray | None = None) -> tuple[list[int], int]:
    """The replica of every row for ``placement="ways"`` (see :func:`plan_rollout`): the simulator's
    ``steal`` placement of the groups in order of first appearance (rows of a group in batch order);
    and over how many replicas each group is spread."""
    per_group = _group_prompts(group, groups, prompt_lens, {"budget_tokens": budget_tokens}, "ways")
    budget = check_int("budget_tokens", budget_tokens, minimum=1)
    if len(per_group) and budget <= int(np.max(per_group)):  # not even one prompt and a token fit a replica
        raise InvalidArgument("budget_tokens", budget, f"each replica's KV pool in tokens, more than the largest "
                                                       f"prompt ({int(np.max(per_group)):,} tokens)")
    order = np.argsort(np.asarray(group, dtype=np.int64), kind="stable")  # rows grouped, batch order within
    sizes = np.bincount(np.asarray(group, dtype=np.int64), minlength=groups)
    queued = 0.0 if loads is None else float(loads.sum())  # what the replicas already have counts as crowding
    ways = spread_ways(per_group, budget, replicas, work_tokens=float(pred.sum()) + queued or None)
    placed = place_ways(pred[order].astype(np.float64), sizes, replicas, ways, loads)
    replica = np.empty(len(group), dtype=np.int64)
    replica[order] = placed
    return [int(r) for r in replica], ways


def _classes(pred: np.ndarray, group: list[int], groups: int, replicas: int, prompt_lens: Any, budget_tokens: Any,
             max_new_tokens: Any, cost: Any) -> list[int]:
    """The replica of every row for ``placement="classes"`` (see :func:`plan_rollout`)."""
    from ..runtime.replicas import plan_classes
    from ..runtime.timing import default_cost

    per_group = _group_prompts(group, groups, prompt_lens,
                               {"budget_tokens": budget_tokens, "max_new_tokens": max_new_tokens}, "classes")
    placed = plan_classes(pred, np.asarray(group, dtype=np.int64), per_group, replicas=replicas,
                          budget_tokens=budget_tokens, max_new_tokens=max_new_tokens,
                          cost=default_cost() if cost is None else cost)
    return [int(r) for r in placed]


def predict_lengths(predictor: Any, queries: Sequence[Any], *, max_new_tokens: int | None = None,
                    prefixes: Sequence[Any] | None = None) -> np.ndarray:
    """``predictor.predict(queries).lengths`` as int64 tokens (rounded, at least 0, at most
    ``max_new_tokens`` when given); with ``prefixes`` (each query's progress: tokens generated, or
    their ids), ``predict(queries, prefixes)``: what each has left, by the predictor's own model.
    :class:`InvalidArgument` names ``predictor`` when it returns the wrong count or a non-finite value."""
    if not hasattr(predictor, "predict"):
        raise InvalidArgument("predictor", type(predictor).__name__,
                              "an object with predict() (lengthsched.LengthPredictor)")
    answer = predictor.predict(list(queries)) if prefixes is None else predictor.predict(list(queries), list(prefixes))
    lengths = np.asarray(getattr(answer, "lengths", None), dtype=np.float64)
    if lengths.shape != (len(queries),) or not np.all(np.isfinite(lengths)):
        raise InvalidArgument("predictor", type(predictor).__name__,
                              f"a predict() that returns {len(queries)} finite lengths (tokens), one per query")
    lengths = np.maximum(np.rint(lengths), 0)
    if max_new_tokens is not None:
        lengths = np.minimum(lengths, check_int("max_new_tokens", max_new_tokens, minimum=1))
    return lengths.astype(np.int64)


def remaining_after(predictor: Any, keys: Sequence[Any], finished: Sequence[Sequence[int]],
                    progress: Sequence[Sequence[int]], *, max_new_tokens: int | None = None) -> list[np.ndarray]:
    """What the unfinished samples of groups a partial rollout resumes still have to generate: per group i
    (prompt ``keys[i]``), ``predictor`` asked with each sample's progress ``progress[i][j]`` (tokens
    generated: ``predict(prompts, prefixes)``, the predictor's own model of what is left, so a sample that
    ran past its prediction is not taken for nearly done), after a copy of a predictor that learns online
    (:func:`~lengthsched.predictor.copy_predictor`) saw the lengths of the group's finished samples
    ``finished[i]`` (tokens). One array per group, each value at least 1 token."""
    if not len(keys) == len(finished) == len(progress):
        raise InvalidArgument("progress", f"{len(progress)} groups", f"{len(keys)}, one per key and per finished")
    seen = [(k, int(n)) for k, done in zip(keys, finished) for n in done]
    if seen and callable(getattr(predictor, "observe", None)):
        predictor = copy_predictor(predictor)  # the siblings of this step, not a step the caller observed
        observe_lengths(predictor, [k for k, _ in seen], [n for _, n in seen])
    queries = [k for k, going in zip(keys, progress) for _ in going]
    prefixes = [check_int("progress", g, minimum=0) for going in progress for g in going]
    got = (predict_lengths(predictor, queries, max_new_tokens=max_new_tokens, prefixes=prefixes) if queries
           else np.zeros(0, dtype=np.int64))
    out, start = [], 0
    for going in progress:
        out.append(np.maximum(1, got[start:start + len(going)]))
        start += len(going)
    return out


def observe_lengths(predictor: Any, queries: Sequence[Any], lengths: Sequence[int], *, step: int | None = None) -> int:
    """Feed finished lengths (tokens) to a predictor that learns online (one with ``observe``, such
    as :class:`~lengthsched.OnlineLengthPredictor`): ``observe(queries[i], lengths[i], step=step)``.
    Lengths below 1 count as 1. Returns how many were fed (0 for a predictor without ``observe``)."""
    observe = getattr(predictor, "observe", None)
    if not callable(observe):
        return 0
    if len(queries) != len(lengths):
        raise InvalidArgument("lengths", f"{len(lengths)} values", f"{len(queries)} values, one per query")
    for query, length in zip(queries, lengths):
        observe(query, max(1, int(length)), step=step)
    return len(queries)
