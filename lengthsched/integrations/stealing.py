"""Work stealing driven from the framework's side: what to abort on one engine and resubmit on another.

The simulator's recommended rollout policy, ``steal`` (``simulate.DEFAULT_POLICY``), moves work
between engine replicas while a rollout step runs: a replica with nothing left waiting takes waiting
requests from the replica with the most predicted work waiting (:func:`~.rollout.steal_requests`),
and a replica that sits idle takes running requests from the others at the end of every
:data:`~.rollout.MOVE_CHUNK` tokens (:func:`~.rollout.move_requests`). Most of its gain comes from
requests that already generated tokens (preempted or running), so a framework must abort a request
on its engine and resubmit its prompt plus the tokens it generated on another (docs/benchmarks.md,
"What stealing gains, and from what"). verl 0.9.1's ``FullyAsyncLLMServerClient``
(``workers/rollout/llm_server.py``) already resubmits an aborted request that way (prompt plus the
tokens so far, the remaining ``max_tokens``), through the router, which picks the server again.

:class:`StealCoordinator` holds the framework's view of the replicas and makes those decisions from
what a framework can observe:

- :meth:`~StealCoordinator.submit` when a request is sent to a replica (its predicted length,
  its prompt tokens and its group: a group's prompt is held once per replica);
- :meth:`~StealCoordinator.observe` with a snapshot of one replica: every request in flight there
  and the tokens it has generated so far (vLLM: the output processor's request states; verl's
  vLLM server sees them). A request whose count grew since the previous snapshot runs; one whose
  count did not grow waits (for memory or a seat: never started, or preempted). Requests missing
  from the snapshot finished;
- :meth:`~StealCoordinator.decide`: the :class:`Move` list. For each move the framework aborts the
  request on ``source`` and resubmits it (prompt plus ``generated`` tokens) to ``target``: with
  verl, ``PlannedLoadBalancer.reroute`` makes the router send the resubmission there.

Decisions, as the simulator's ``steal`` makes them (``lengthsched.runtime.dispatch.WorkStealing``):
a replica steals while nothing waits on it and its running requests, grown to their predicted
lengths (at least their generated tokens plus one), and their prompts stay below ``room`` x its
KV pool; the victims are replicas with requests waiting. A replica with nothing in flight and
nothing to steal is idle: each idle replica takes one running request from a replica whose running
requests crossed a chunk boundary since the last decision, the most predicted tokens to go first,
while at least one stays there. Units: tokens.

Differences from the simulator, which sees the engines' state exactly: waiting is inferred from
snapshots (a request that waits between two snapshots; the simulator knows at every step); a moved
request cannot move again before its target's snapshot shows it running (it is in transit; call
:meth:`StealCoordinator.finish` for requests that finish, a request in transit may finish unseen); a
replica's queue order is the order requests were submitted to it (preempted requests go back to the
front of vLLM's queue; here they keep their place), and a moved request's KV is recomputed where it
lands (it carries tokens, not KV).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

from ..errors import InvalidArgument, check_int, check_positive_float
from .rollout import MOVE_CHUNK, STEAL_SHARE, move_requests, steal_requests

__all__ = ["Move", "StealCoordinator"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Move:
    """Abort ``request`` on replica ``source`` and resubmit it to ``target`` with the ``generated``
    tokens it has so far (its prompt plus those tokens; the rest of its budget); ``kind`` is
    ``"steal"`` (it was waiting) or ``"move"`` (it was running and ``target`` sat idle)."""

    request: Hashable
    source: int
    target: int
    generated: int
    kind: str


@dataclass
class _Request:
    replica: int
    predicted: float
    prompt: int
    group: Hashable
    order: int  # submission order on its replica (its queue position)
    generated: int = 0  # at the last snapshot (or carried at submission)
    running: bool = False
    transit: bool = False  # moved here and not yet seen running here: it cannot move again


class _View:
    """``view[request]``: one field of the coordinator's requests (what steal_requests / move_requests index)."""

    def __init__(self, requests: dict, field: str):
        self._requests, self._field = requests, field

    def __getitem__(self, request: Hashable) -> float:
        return getattr(self._requests[request], self._field)


class StealCoordinator:
    """The simulator's ``steal`` decisions for a framework that can abort a request on one engine
    and resubmit it, with its generated tokens, on another: ``submit`` each request, then every poll ``observe``
    each replica's snapshot and carry out ``decide``'s moves (abort, resubmit, or ``cancel``), ``finish`` what
    comes back (the module docstring; a runnable loop in docs/planning.md, "A rollout step inside your own
    engine").

    Each call costs time in the requests of the replicas it touches (a snapshot: that replica's; a
    decision: the waiting requests and the thieves' and sources' requests), not in all requests.

    Args:
        replicas: engine replicas.
        pool_tokens: KV tokens of one replica's pool (prompts included).
        chunk: tokens between the points where a running request may move to an idle replica
            (None: running requests never move). The moves pay only where a resubmission lands at
            once (``verl_stealing``'s client resubmits them so): with verl 0.9.1's own client, which
            sleeps 1 s before it resubmits an aborted request, they cost more than they gain
            (docs/benchmarks.md, "Resubmission delay"): pass None there.
        share: share of a victim's waiting predicted work a steal takes, in (0, 1].
        room: steal while the predicted peak KV of the running requests is below ``room`` x the pool.
        kv_cap: where the engines run a compressed KV cache (Sparse-RL's, ``KVCompression.max_retained``:
            budget + interval), the most generated tokens a request holds: the peak counts each request at
            most that. None: a full cache.
    """

    def __init__(self, replicas: int, pool_tokens: int, *, chunk: int | None = MOVE_CHUNK,
                 share: float = STEAL_SHARE, room: float = 1.0, kv_cap: int | None = None):
        self.replicas = check_int("replicas", replicas, minimum=1)
        self.pool_tokens = check_int("pool_tokens", pool_tokens, minimum=1)
        self.chunk = None if chunk is None else check_int("chunk", chunk, minimum=1)
        self.share = check_positive_float("share", share, maximum=1.0)
        self.room = check_positive_float("room", room)
        self.kv_cap = None if kv_cap is None else check_int("kv_cap", kv_cap, minimum=1)
        self._requests: dict[Hashable, _Request] = {}
        self._on: list[dict[Hashable, None]] = [{} for _ in range(self.replicas)]  # in flight, queue order
        self._waiting: list[dict[Hashable, None]] = [{} for _ in range(self.replicas)]  # waiting, not in transit
        self._transit = [0] * self.replicas  # requests moved there and not yet seen running
        self._ended: list[dict[Hashable, None]] = [{} for _ in range(self.replicas)]  # crossed a chunk boundary
        self._order = 0
        self._warned_ids = False  # said once that a snapshot's ids were none of those submitted
        self.steals = 0  # requests moved by steals so far
        self.moves = 0  # running requests moved to idle replicas so far

    # ------------------------------------------------------------------ what the framework reports
    def submit(self, request: Hashable, replica: int, predicted: float, *, prompt_tokens: int = 0,
               group: Hashable = None, generated: int = 0) -> None:
        """``request`` was sent to ``replica`` (not after a :class:`Move`: the coordinator applied that
        itself); ``generated``: tokens it carries; ``predicted``: its predicted length (tokens, the whole
        completion); ``prompt_tokens``: its prompt, held once per ``group`` on a replica (None: the
        request is its own group)."""
        replica = self._replica("replica", replica)
        if not isinstance(predicted, (int, float)) or isinstance(predicted, bool) or not predicted >= 0:
            raise InvalidArgument("predicted", predicted, "a predicted length in tokens >= 0")
        prompt_tokens = check_int("prompt_tokens", prompt_tokens, minimum=0)
        generated = check_int("generated", generated, minimum=0)
        self._drop(request)
        self._order += 1
        self._requests[request] = _Request(replica, float(predicted), prompt_tokens,
                                           request if group is None else group, self._order, generated)
        self._on[replica][request] = None
        self._waiting[replica][request] = None

    def observe(self, replica: int, generated: Mapping[Hashable, int]) -> None:
        """A snapshot of ``replica``: every request in flight there and the tokens it has generated
        so far (those carried from an earlier replica included). A request submitted there and
        missing from the snapshot finished. Requests it does not know, or that it moved away (a
        snapshot taken before the abort landed), are ignored."""
        replica = self._replica("replica", replica)
        if not isinstance(generated, Mapping):
            raise InvalidArgument("generated", type(generated).__name__, "a mapping request -> tokens generated")
        waiting, ended, requests, chunk = self._waiting[replica], self._ended[replica], self._requests, self.chunk
        matched = 0
        for request, tokens in generated.items():
            if type(tokens) is not int or tokens < 0:
                tokens = check_int("generated", tokens, minimum=0)
            req = requests.get(request)
            if req is None or req.replica != replica:
                continue
            matched += 1
            seen = req.generated
            if tokens > seen:  # it ran since the last snapshot
                if req.transit:
                    req.transit = False
                    self._transit[replica] -= 1
                if not req.running:
                    req.running = True
                    waiting.pop(request, None)
                if chunk is not None and tokens // chunk > seen // chunk:
                    ended[request] = None
                req.generated = tokens
            elif not req.transit and req.running:  # it stopped: preempted
                req.running = False
                waiting[request] = None
        if generated and not matched and self._on[replica] and not self._warned_ids:
            self._warned_ids = True  # a snapshot of requests it never heard of, while it counts others there
            log.warning("StealCoordinator.observe(replica %d): none of the %d requests in the snapshot was submitted "
                        "there (the ids differ from those given to submit? e.g. %r); its %d requests are taken as "
                        "finished, and nothing can be stolen from them", replica, len(generated),
                        next(iter(generated)), len(self._on[replica]))
        if matched < len(self._on[replica]):
            for request in [j for j in self._on[replica] if j not in generated and not requests[j].transit]:
                self._drop(request)  # finished

    def finish(self, request: Hashable) -> None:
        """``request`` finished (the framework got its output)."""
        self._drop(request)

    # ------------------------------------------------------------------ views
    def in_flight(self, replica: int) -> list[Hashable]:
        """The requests on ``replica``, in queue order (submission, or arrival after a move)."""
        return list(self._on[self._replica("replica", replica)])

    def waiting(self, replica: int) -> list[Hashable]:
        """The requests waiting on ``replica`` (not running at the last snapshot; in transit ones
        included), in queue order."""
        replica = self._replica("replica", replica)
        return [j for j in self._on[replica] if not self._requests[j].running]

    def loads(self) -> list[float]:
        """Per replica, the predicted tokens of the requests on it (running, waiting or in transit there,
        each counted at its whole predicted length until it finishes): what a router that places new
        work by the replicas' loads reads (the simulator's ``placed`` router counts the same)."""
        return [float(sum(self._requests[j].predicted for j in on)) for on in self._on]

    def replica_of(self, request: Hashable) -> int | None:
        """Where ``request`` runs (or, after a move, goes); None when unknown or finished."""
        req = self._requests.get(request)
        return None if req is None else req.replica

    def generated_of(self, request: Hashable) -> int | None:
        """The tokens ``request`` had generated at the last snapshot that showed it (those carried from an
        earlier replica included); None when unknown or finished."""
        req = self._requests.get(request)
        return None if req is None else int(req.generated)

    # ------------------------------------------------------------------ decisions
    def decide(self, thieves: Iterable[int] | None = None, sources: Iterable[int] | None = None) -> list[Move]:
        """Steals for every replica with nothing waiting and room in its pool, then moves of running
        requests to the replicas that sit idle. Each move is applied here (the request now belongs to
        its target and waits there: do not :meth:`submit` it again); the framework aborts it on its
        source and resubmits it to its target with its generated tokens (or, if that cannot be done,
        :meth:`cancel` s it). ``thieves``: the replicas that may take requests (None: all);
        ``sources``: the replicas whose running requests may move (None: all)."""
        thieves = range(self.replicas) if thieves is None else sorted({self._replica("thieves", r) for r in thieves})
        sources = range(self.replicas) if sources is None else sorted({self._replica("sources", r) for r in sources})
        out: list[Move] = []
        predicted, generated = _View(self._requests, "predicted"), _View(self._requests, "generated")
        for thief in thieves:
            while not self._waiting[thief] and not self._transit[thief] and self._has_room(thief):
                queues = [sorted(w, key=lambda j: self._requests[j].order) for w in self._waiting]
                victim, taken = steal_requests(queues, thief, [bool(q) for q in queues], predicted, generated,
                                               share=self.share)
                if victim is None:
                    break
                out.extend(self._move(j, thief, "steal") for j in taken)
        if self.chunk is not None:
            idle = [r for r in thieves if not self._on[r]]
            for source in sources:
                if not idle:
                    break
                running = [j for j in self._on[source] if self._requests[j].running]
                ended = [j for j in running if j in self._ended[source]]
                if not ended:
                    continue
                # by position (ties in queue order, whatever the ids are)
                picks = move_requests(list(range(len(ended))), idle, [predicted[j] for j in ended],
                                      [generated[j] for j in ended], len(running))
                for i, target in picks:
                    out.append(self._move(ended[i], target, "move"))
                    idle.remove(target)
        for ended in self._ended:
            ended.clear()
        return out

    def cancel(self, move: Move) -> None:
        """``move`` could not be made (the request finished or started where it was): it stays on its
        source (at the back of its queue), running if it was running."""
        req = self._requests.get(move.request)
        if req is None or req.replica != move.target or not req.transit:
            raise InvalidArgument("move", move, "a move of the last decide() still pending")
        self._leave(move.request)
        req.replica, req.transit, req.running = move.source, False, move.kind == "move"
        self._on[move.source][move.request] = None
        if not req.running:
            self._waiting[move.source][move.request] = None
        if move.kind == "steal":
            self.steals -= 1
        else:
            self.moves -= 1

    # ------------------------------------------------------------------ internals
    def _move(self, request: Hashable, target: int, kind: str) -> Move:
        req = self._requests[request]
        move = Move(request, req.replica, target, req.generated, kind)
        self._leave(request)
        self._order += 1
        req.replica, req.order, req.running, req.transit = target, self._order, False, True
        self._on[target][request] = None
        self._transit[target] += 1
        if kind == "steal":
            self.steals += 1
        else:
            self.moves += 1
        return move

    def _leave(self, request: Hashable) -> None:
        """Take ``request`` off its replica's structures (it stays known)."""
        req = self._requests[request]
        r = req.replica
        self._on[r].pop(request, None)
        self._waiting[r].pop(request, None)
        self._ended[r].pop(request, None)
        if req.transit:
            self._transit[r] -= 1
            req.transit = False

    def _drop(self, request: Hashable) -> None:
        if request in self._requests:
            self._leave(request)
            del self._requests[request]

    def _has_room(self, replica: int) -> bool:
        """Whether the requests on ``replica``, grown to their predicted lengths (each at most ``kv_cap``
        with a compressed cache), and their prompts (once per group) stay below ``room`` x the pool."""
        peak, groups, cap = 0.0, {}, self.kv_cap
        for j in self._on[replica]:
            req = self._requests[j]
            grown = max(req.predicted, req.generated + 1)
            peak += grown if cap is None else min(grown, cap)
            groups[req.group] = max(groups.get(req.group, 0), req.prompt)
        return peak + sum(groups.values()) < self.room * self.pool_tokens

    def _replica(self, name: str, replica: int) -> int:
        replica = check_int(name, replica, minimum=0)
        if replica >= self.replicas:
            raise InvalidArgument(name, replica, f"a replica index below {self.replicas}")
        return replica
