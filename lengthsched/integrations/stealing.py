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

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from ..errors import InvalidArgument, check_int, check_positive_float
from .rollout import MOVE_CHUNK, STEAL_SHARE, move_requests, steal_requests

__all__ = ["Move", "StealCoordinator"]


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
    generated: int = 0
    seen: int = 0  # generated at the previous snapshot
    running: bool = False
    chunk_ended: bool = False  # crossed a multiple of the chunk since the last decision
    transit: bool = False  # moved here and not yet seen running here: it cannot move again


class StealCoordinator:
    """The simulator's ``steal`` decisions for a framework that can abort a request on one engine
    and resubmit it, with its generated tokens, on another (see the module docstring).

    Args:
        replicas: engine replicas.
        pool_tokens: KV tokens of one replica's pool (prompts included).
        chunk: tokens between the points where a running request may move to an idle replica
            (None: running requests never move).
        share: share of a victim's waiting predicted work a steal takes, in (0, 1].
        room: steal while the predicted peak KV of the running requests is below ``room`` x the pool.
    """

    def __init__(self, replicas: int, pool_tokens: int, *, chunk: int | None = MOVE_CHUNK,
                 share: float = STEAL_SHARE, room: float = 1.0):
        self.replicas = check_int("replicas", replicas, minimum=1)
        self.pool_tokens = check_int("pool_tokens", pool_tokens, minimum=1)
        self.chunk = None if chunk is None else check_int("chunk", chunk, minimum=1)
        self.share = check_positive_float("share", share, maximum=1.0)
        self.room = check_positive_float("room", room)
        self._requests: dict[Hashable, _Request] = {}
        self._order = 0
        self.steals = 0  # requests moved by steals so far
        self.moves = 0  # running requests moved to idle replicas so far

    # ------------------------------------------------------------------ what the framework reports
    def submit(self, request: Hashable, replica: int, predicted: float, *, prompt_tokens: int = 0,
               group: Hashable = None, generated: int = 0) -> None:
        """``request`` was sent to ``replica`` (again, after a move: ``generated`` tokens carried);
        ``predicted``: its predicted length (tokens, the whole completion); ``prompt_tokens``: its
        prompt, held once per ``group`` on a replica (None: the request is its own group)."""
        replica = self._replica("replica", replica)
        if not isinstance(predicted, (int, float)) or isinstance(predicted, bool) or not predicted >= 0:
            raise InvalidArgument("predicted", predicted, "a predicted length in tokens >= 0")
        prompt_tokens = check_int("prompt_tokens", prompt_tokens, minimum=0)
        generated = check_int("generated", generated, minimum=0)
        self._order += 1
        self._requests[request] = _Request(replica, float(predicted), prompt_tokens,
                                           request if group is None else group, self._order, generated, generated)

    def observe(self, replica: int, generated: Mapping[Hashable, int]) -> None:
        """A snapshot of ``replica``: every request in flight there and the tokens it has generated
        so far (those carried from an earlier replica included). A request submitted there and
        missing from the snapshot finished. Requests it does not know, or that it moved away (a
        snapshot taken before the abort landed), are ignored."""
        replica = self._replica("replica", replica)
        if not isinstance(generated, Mapping):
            raise InvalidArgument("generated", type(generated).__name__, "a mapping request -> tokens generated")
        for request, tokens in generated.items():
            tokens = check_int("generated", tokens, minimum=0)
            req = self._requests.get(request)
            if req is None or req.replica != replica:
                continue
            if tokens > req.seen:
                req.transit = False
            req.running = tokens > req.seen
            if self.chunk is not None and tokens // self.chunk > req.seen // self.chunk:
                req.chunk_ended = True
            req.generated = req.seen = max(tokens, req.generated)
        for request in [j for j, r in self._requests.items()
                        if r.replica == replica and j not in generated and not r.transit]:
            del self._requests[request]  # finished

    def finish(self, request: Hashable) -> None:
        """``request`` finished (the framework got its output)."""
        self._requests.pop(request, None)

    # ------------------------------------------------------------------ decisions
    def in_flight(self, replica: int) -> list[Hashable]:
        """The requests on ``replica``, in submission order."""
        replica = self._replica("replica", replica)
        return [j for j, r in sorted(self._requests.items(), key=lambda jr: jr[1].order) if r.replica == replica]

    def waiting(self, replica: int) -> list[Hashable]:
        """The requests waiting on ``replica`` (not running at the last snapshot), in submission order."""
        return [j for j in self.in_flight(replica) if not self._requests[j].running]

    def replica_of(self, request: Hashable) -> int | None:
        """Where ``request`` runs (or, after a move, goes); None when unknown or finished."""
        req = self._requests.get(request)
        return None if req is None else req.replica

    def decide(self) -> list[Move]:
        """Steals for every replica with nothing waiting and room in its pool, then moves of running
        requests to the replicas that sit idle. Each move is applied here (the request now belongs to
        its target and waits there: do not :meth:`submit` it again); the framework aborts it on its
        source and resubmits it to its target with its generated tokens. O(requests) per steal."""
        out: list[Move] = []
        ids = sorted(self._requests, key=lambda j: self._requests[j].order)
        reqs = [self._requests[j] for j in ids]
        predicted = [r.predicted for r in reqs]
        generated = [r.generated for r in reqs]
        flight: list[list[int]] = [[] for _ in range(self.replicas)]  # per replica, request indices in queue order
        for i, r in enumerate(reqs):
            flight[r.replica].append(i)

        def relocate(i: int, target: int, kind: str) -> None:
            flight[reqs[i].replica].remove(i)
            out.append(self._move(ids[i], target, kind))
            flight[target].append(i)

        for thief in range(self.replicas):
            while not any(not reqs[i].running for i in flight[thief]) and self._has_room(reqs, flight[thief]):
                queues = [[i for i in flight[r] if not reqs[i].running and not reqs[i].transit]
                          for r in range(self.replicas)]
                victim, taken = steal_requests(queues, thief, [bool(q) for q in queues], predicted, generated,
                                               share=self.share)
                if victim is None:
                    break
                for i in taken:
                    relocate(i, thief, "steal")
        if self.chunk is not None:
            idle = [r for r in range(self.replicas) if not flight[r]]
            for source in range(self.replicas):
                if not idle:
                    break
                running = [i for i in flight[source] if reqs[i].running]
                ended = [i for i in running if reqs[i].chunk_ended]
                for i, target in move_requests(ended, idle, predicted, generated, len(running)):
                    relocate(i, target, "move")
                    idle.remove(target)
        for req in reqs:
            req.chunk_ended = False
        return out

    def _move(self, request: Hashable, target: int, kind: str) -> Move:
        req = self._requests[request]
        move = Move(request, req.replica, target, req.generated, kind)
        self._order += 1
        req.replica, req.order, req.running, req.chunk_ended, req.transit = target, self._order, False, False, True
        if kind == "steal":
            self.steals += 1
        else:
            self.moves += 1
        return move

    def _has_room(self, reqs: list[_Request], flight: list[int]) -> bool:
        """Whether the requests ``flight`` (of one replica), grown to their predicted lengths, and their
        prompts (once per group) stay below ``room`` x the pool."""
        peak, groups = 0.0, {}
        for i in flight:
            req = reqs[i]
            peak += max(req.predicted, req.generated + 1)
            groups[req.group] = max(groups.get(req.group, 0), req.prompt)
        return peak + sum(groups.values()) < self.room * self.pool_tokens

    def _replica(self, name: str, replica: int) -> int:
        replica = check_int(name, replica, minimum=0)
        if replica >= self.replicas:
            raise InvalidArgument(name, replica, f"a replica index below {self.replicas}")
        return replica
