"""Asynchronous RL (AReaL's design): generation never waits for the learner, within a staleness bound.

A synchronous RL step generates a batch, waits for its last completion, trains, updates the weights,
and only then generates the next batch: the engines idle through the long tail and through training.
AReaL (``inclusionAI/AReaL`` at 4aef98d) decouples them. Its rollout keeps submitting groups while the
learner trains, within two limits (``areal/infra/staleness_manager.py``, ``StalenessManager.get_capacity``):

- at most ``max_concurrent`` groups in flight (``max_concurrent_rollouts``, by default the learner's batch,
  ``consumer_batch_size``);
- at most ``(max_staleness + version + 1) x batch`` groups submitted in all (finished ones included), so
  that no group is consumed more than ``max_staleness`` weight versions after it was submitted
  (``max_head_offpolicyness``; 0 is synchronous RL: one batch per version, nothing generated while the
  learner trains).

The learner takes the first ``batch`` groups that finished (``prepare_batch``), trains, and updates the
weights: it pauses generation on every server (``pause_generation``: the requests in flight are aborted
and the cache cleared, ``areal/engine/fsdp_engine.py``, ``_update_weights_from_distributed``), sends the
weights, continues generation and counts one version more. An aborted request is sent again to the same
server with the tokens it generated (``RemoteInfEngine.agenerate``: the ``rid`` keeps its server), so its
prompt and partial generation are prefilled again under the new weights; each request goes to the next
server in turn (``choose_server``: round robin). A completion's tokens may thus come from several
versions; a token's lag is the version the learner trains at minus the version that generated it.

:func:`run_async_rollout` simulates that loop on one clock in modelled seconds: the replicas are the
rollout engines (``"sglang"``, AReaL's default backend, or ``"vllm"``; one request at a time routed by
:class:`simulate.rollout.LiveRouter`), the learner a separate machine whose step takes ``train_seconds``
(plus ``train_seconds_per_token`` per prompt and completion token of its batch), and each update pauses
every engine for ``update_seconds`` (a replica stops at the end of the step it is running). With
``max_staleness=0`` it is the synchronous loop on the same machines, the reference.

verl's fully asynchronous recipe (``verl/experimental/fully_async_policy``) runs the same loop with other
rules, which :func:`run_verl_async` simulates, by default as verl 0.9.1 (the released wheel) runs it:

- the trainer takes ``batch / local_steps`` groups at a time from the rollouter's queue, in the order they
  finished, and trains on them at once (a local update); after ``local_steps`` of them
  (``trigger_parameter_sync_step``; ``fully_async_trainer.py``) it sends the weights: a weight version is
  ``batch`` groups, trained in ``local_steps`` slices as they arrive, so training overlaps generation even
  without staleness;
- the rollouter (``fully_async_rollouter.py``) counts the groups it starts (``staleness_samples``) and stops
  starting any once the count reaches ``(1 + staleness_threshold) x batch`` (``max_required_samples``,
  ``_should_pause_generation``); each weight update resets the count to the groups in flight or finished
  and not yet trained on (``reset_staleness``): with a threshold of 0 every version's groups are generated
  by its own weights;
- at most ``16 x replicas`` groups are in flight (``concurrent_samples_per_replica``, and no more than the
  bound above);
- verl 0.9.1: each request goes to the server with the fewest requests in flight
  (``workers/rollout/router.py``, ``GlobalRequestLoadBalancer``: ties at random, here to the lowest index);
  a weight update (``checkpoint_engine/base.py``, ``update_weights``) aborts every request in flight, and
  verl's client (``workers/rollout/llm_server.py``, ``FullyAsyncLLMServerClient``) sends each again with its
  tokens after the update to the same server (its request id is sticky; the servers' KV was released, so
  prompt and tokens are prefilled again); the rollouter may start groups during the update (they wait at
  the servers). Without ``partial_rollout`` 0.9.1 ends the aborted requests with the tokens they have: not
  modelled (an error);
- verl at b178a3c (``version="b178a3c"``, January 2026): each request goes to the server sent the fewest
  requests so far (``AsyncLLMServerManager._choose_server``: its counts only grow: round robin); the
  rollouter pauses for the update (``rollouter.pause()``) and starts nothing until it ends; an aborted
  request is sent again under a new request id, so routed afresh, ahead of new groups; without
  ``partial_rollout`` the update waits until every request in flight has finished.

The trainer waits for the update either way.

Not modelled: the learner's own scaling (its time per step is given), the dynamic filtering AReaL's
``should_accept_fn`` may do, and lengths that change as the policy learns (the stream's lengths are fixed).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lengthsched import InvalidArgument
from lengthsched.errors import check_int, check_nonnegative_float, check_positive_float
from lengthsched.integrations.rollout import observe_lengths, place_ways, predict_lengths
from lengthsched.integrations.verl_async import CONCURRENT_PER_REPLICA, StreamPlacer
from lengthsched.runtime import POLICIES, Problem
from lengthsched.runtime.baselines import ran_dry
from lengthsched.runtime.dispatch import GroupQueue, hand_over, lift

from .rollout import (
    DEFAULT_PREFILL_CHUNK,
    THROTTLED_POLICIES,
    LiveRouter,
    RolloutResult,
    _engine,
    _OneClock,
    _prepare,
    observe_board,
    run_rollout,
    share_board,
    steal_ways,
)
from .run import compression_cap

__all__ = ["ASYNC_ROUTERS", "AsyncStep", "AsyncRollout", "run_async_rollout", "run_verl_async", "SyncSteps",
           "run_sync_steps", "STEAL_POLICIES", "VERL_GROUPS_PER_SERVER", "VERL_VERSIONS"]

#: The routers :func:`run_async_rollout` accepts: AReaL's (each request to the next server), the others
#: :class:`simulate.rollout.LiveRouter` routes one request at a time, and ``least_work``: each request to the
#: server with the fewest predicted tokens still to generate among the requests sent there, ``placed``: each
#: group as ``steal`` places a step's groups, its spread decided once from the groups first in flight
#: (:class:`_Placed`), and ``stream``: each group placed by lengthsched.integrations.verl_async's own
#: :class:`~lengthsched.integrations.verl_async.StreamPlacer`, as that integration places it (its spread
#: re-estimated at every group, the loads read from the driver's coordinator where snapshots drive stealing).
ASYNC_ROUTERS = ("round_robin",) + LiveRouter.ROUTERS + ("least_work", "placed", "stream")
#: The routers of :data:`ASYNC_ROUTERS` that need ``predicted``.
PREDICTED_ROUTERS = ("least_work", "placed", "stream")
#: The routers each trainer rank can run by itself (``run_async_rollout``'s ``ranks``): AReaL's, and lengthsched's
#: that need only the rank's own requests.
RANKED_ROUTERS = ("round_robin", "least_work", "stream")

#: verl's fully asynchronous rollouter keeps at most this many groups in flight per server
#: (``concurrent_samples_per_replica``, 16 by default in 0.9.1; fixed at 16 at b178a3c): the default
#: lengthsched.integrations.verl_async reads too.
VERL_GROUPS_PER_SERVER = CONCURRENT_PER_REPLICA
#: The versions of verl's recipe :func:`run_verl_async` models (module docstring), the default first.
VERL_VERSIONS = ("0.9.1", "b178a3c")
#: With ``steal=True`` each engine's policy is lengthsched's stealing policy over the same engine.
STEAL_POLICIES = {"vllm": "steal", "sglang": "steal_sglang"}


@dataclass(frozen=True)
class AsyncStep:
    """One learner step of :func:`run_async_rollout` (seconds are modelled, from the start of the run)."""

    index: int
    ready_seconds: float  # when the batch's last group finished (the learner could have started)
    train_start: float  # when the learner started on it (after the previous update and the batch was ready)
    train_end: float
    update_end: float  # the weights of version index + 1 are on every engine
    groups: tuple[int, ...]  # the groups it trained on, in the order they finished
    tokens: int  # completion tokens of those groups
    lag_tokens: tuple[int, ...]  # of those tokens, how many lag 0, 1, 2, ... versions behind this step's
    trained_seconds: float  # seconds the learner trained (below train_end - train_start where it waited
    # between local updates, verl's)


@dataclass(frozen=True)
class AsyncRollout:
    """What :func:`run_async_rollout` returns."""

    policy: str
    router: str
    replicas: int
    batch: int  # groups per weight version
    max_staleness: float  # AReaL: versions (max_head_offpolicyness); verl: staleness_threshold (share of a batch)
    max_concurrent: int
    steps: tuple[AsyncStep, ...]
    seconds: float  # the last step's update end: the time the run took
    generated_tokens: int  # every token the engines generated (those in flight at the end included)
    interrupted: int  # requests aborted by weight updates (each resumed: its tokens prefilled again)
    recomputed_tokens: int  # generated tokens prefilled again (after interruptions and preemptions)
    preemptions: int
    idle_seconds: float  # replica-seconds with nothing to run or paused, before the end
    drawn_tokens: int = 0  # completion tokens of the stream's first steps x batch groups (a synchronous loop's)
    uneven_seconds: float = 0.0  # of idle_seconds, those a replica sat idle while another ran (not all idle)
    cost_name: str = ""
    group_submitted: tuple[float, ...] = field(default=(), repr=False)  # per group: when it was submitted (or nan)
    group_finished: tuple[float, ...] = field(default=(), repr=False)  # per group: its last completion (or nan)
    design: str = "areal"  # whose loop: "areal" (run_async_rollout), "verl" or "verl b178a3c" (run_verl_async)
    local_steps: int = 1  # learner updates per weight version (verl's trigger_parameter_sync_step)
    partial_rollout: bool = True  # an update aborts the requests in flight (False: it waits for them, verl's)

    @property
    def consumed_tokens(self) -> int:
        """Completion tokens the learner trained on."""
        return sum(s.tokens for s in self.steps)

    @property
    def tokens_per_second(self) -> float:
        """Trained completion tokens per modelled second."""
        return self.consumed_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def seconds_per_step(self) -> float:
        return self.seconds / len(self.steps) if self.steps else 0.0

    @property
    def mean_lag(self) -> float:
        """The trained tokens' mean lag in versions (0: every token from the weights it is trained on)."""
        lags = np.zeros(max((len(s.lag_tokens) for s in self.steps), default=0))
        for s in self.steps:
            lags[:len(s.lag_tokens)] += s.lag_tokens
        total = lags.sum()
        return float((lags * np.arange(len(lags))).sum() / total) if total else 0.0

    @property
    def stale_share(self) -> float:
        """Share of the trained tokens generated by older weights than the step trains."""
        total = self.consumed_tokens
        fresh = sum(s.lag_tokens[0] if s.lag_tokens else 0 for s in self.steps)
        return 1.0 - fresh / total if total else 0.0

    @property
    def on_policy_tokens_per_second(self) -> float:
        """Trained tokens of lag 0 per modelled second."""
        return (1.0 - self.stale_share) * self.tokens_per_second

    @property
    def trained_length_ratio(self) -> float:
        """The trained groups' tokens over those of the stream's first ``steps x batch`` groups (the same
        number of groups, what a synchronous loop trains): below 1, the learner trained shorter groups than
        were drawn (it takes the first to finish; the longer ones are still in flight when the run ends)."""
        return self.consumed_tokens / self.drawn_tokens if self.drawn_tokens else 0.0

    @property
    def learner_idle_share(self) -> float:
        """Share of the run the learner waited (for a batch or for an update), not training."""
        busy = sum(s.trained_seconds for s in self.steps)
        return 1.0 - busy / self.seconds if self.seconds > 0 else 0.0

    @property
    def uneven_share(self) -> float:
        """Share of the replicas' seconds (replicas x the run) one sat idle while another ran: the tail's
        imbalance (the rest of ``idle_seconds`` is every replica idle at once: the updates, and waits for the
        learner at the staleness bound). What a placement or stealing wins by balancing the replicas' idle
        time; it may also win by making each replica's work cheaper (fewer preemptions and recomputed
        tokens), which this does not count."""
        return self.uneven_seconds / (self.replicas * self.seconds) if self.seconds > 0 else 0.0


class _RoundRobin:
    """AReaL's ``choose_server``: each request to the next server in turn (from server ``start``)."""

    def __init__(self, replicas: int, start: int = 0):
        self.replicas, self.next = replicas, start

    def select(self, job: int, group: int) -> int:
        r, self.next = self.next, (self.next + 1) % self.replicas
        return r

    def finished(self, replica: int, jobs: Sequence[int]) -> None:
        pass

    def moved(self, job: int, src: int, dst: int) -> None:
        pass


class _Live:
    """:class:`simulate.rollout.LiveRouter` (by requests in flight) with the async loop's calls."""

    def __init__(self, router: str, replicas: int):
        self.router = LiveRouter(router, replicas)

    def select(self, job: int, group: int) -> int:
        return self.router.select(group)

    def finished(self, replica: int, jobs: Sequence[int]) -> None:
        self.router.finished(replica, len(jobs))

    def moved(self, job: int, src: int, dst: int) -> None:
        """Request ``job`` in flight on ``src`` was sent to ``dst`` (stolen or moved): counted there now."""
        self.router.load[src] -= 1
        self.router.load[dst] += 1


class _Ranks:
    """The routers of the trainer's ranks (``routers[k]``: rank k's), each routing the groups its rank submits
    (group g: rank g mod their number) from its own state; one router is the loop's."""

    def __init__(self, routers: Sequence[Any], owner: np.ndarray):
        self.routers, self.owner = list(routers), owner

    @classmethod
    def of(cls, routers: Sequence[Any], owner: np.ndarray) -> Any:
        """The ranks' routers as one; a single rank's router itself."""
        return routers[0] if len(routers) == 1 else cls(routers, owner)

    def _of(self, job: int) -> Any:
        return self.routers[int(self.owner[job]) % len(self.routers)]

    def select(self, job: int, group: int) -> int:
        return self.routers[group % len(self.routers)].select(job, group)

    def finished(self, replica: int, jobs: Sequence[int]) -> None:
        for job in jobs:
            self._of(job).finished(replica, [job])

    def moved(self, job: int, src: int, dst: int) -> None:
        self._of(job).moved(job, src, dst)


class _RankLearning:
    """One learning predictor per trainer rank (rank g mod their number asks for and learns group g), each counting
    its own rollout steps (its groups back // its share of the batch); with ``share``, what
    lengthsched.integrations.areal's ``share_dir`` does: as a rank's step starts its state becomes its file's, and
    it merges the other ranks' files written since it last read them."""

    def __init__(self, predictors: list, batch: int, share: bool):
        if share and not all(callable(getattr(q, name, None)) for q in predictors
                             for name in ("state_dict", "merge_state_dict")):
            raise InvalidArgument("share_learning", share, "False unless every rank's predictor has state_dict and "
                                                           "merge_state_dict (lengthsched.OnlineLengthPredictor)")
        self.predictors, self.share = predictors, bool(share)
        self.batch = max(1, batch // len(predictors))  # AReaL's consumer_batch_size over the ranks
        self.back_of = [0] * len(predictors)
        self.files: list[Any] = [None] * len(predictors)  # per rank: its file's state (None: not written)
        self.written = [0] * len(predictors)  # per rank: how often its file was written
        self.read = [[0] * len(predictors) for _ in predictors]  # per rank, per file: the writing it last read

    def of(self, group: int) -> Any:
        return self.predictors[group % len(self.predictors)]

    def back(self, group: int, key: str, lengths: Sequence[int]) -> None:
        k = group % len(self.predictors)
        self.back_of[k] += 1
        step = self.back_of[k] // self.batch
        mine = self.predictors[k]
        starts = step > getattr(mine, "step", step)
        observe_lengths(mine, [key] * len(lengths), lengths, step=step)
        if not (self.share and starts):
            return
        self.files[k] = mine.state_dict()
        self.written[k] += 1
        for j, saved in enumerate(self.files):
            if j != k and saved is not None and self.read[k][j] != self.written[j]:
                self.read[k][j] = self.written[j]
                mine.merge_state_dict(saved)


class _LeastWork:
    """Each request to the replica with the fewest predicted tokens to go among those sent there and not
    finished (a request's prediction counts until it finishes; ties to the lowest index)."""

    def __init__(self, replicas: int, predicted: np.ndarray):
        self.work = [0.0] * replicas
        self.predicted = predicted

    def select(self, job: int, group: int) -> int:
        r = self.work.index(min(self.work))
        self.work[r] += float(self.predicted[job])
        return r

    def finished(self, replica: int, jobs: Sequence[int]) -> None:
        self.work[replica] -= float(sum(self.predicted[j] for j in jobs))

    def moved(self, job: int, src: int, dst: int) -> None:
        self.work[src] -= float(self.predicted[job])
        self.work[dst] += float(self.predicted[job])


class _Placed(_LeastWork):
    """Each group placed as ``steal`` places a step's groups (:func:`lengthsched.integrations.rollout.place_ways`):
    spread over ``ways`` replicas, whole groups where ``ways`` is 1, its runs of completions onto the replicas
    with the least predicted tokens in flight (sent there and not finished). With ``placer`` (router
    ``stream``) the group is placed by that :class:`lengthsched.integrations.verl_async.StreamPlacer` instead,
    the code lengthsched.integrations.verl_async runs: its spread re-estimated at every group from the groups
    placed so far, the loads read from ``loads`` (the driver's coordinator where one is given, as the
    integration reads them; else the router's own count)."""

    def __init__(self, replicas: int, predicted: np.ndarray, first: np.ndarray, sizes: Sequence[int], *,
                 ways: int | None = None, placer: StreamPlacer | None = None, prompt_lens: np.ndarray | None = None,
                 loads: Any = None):
        if (ways is None) == (placer is None):
            raise ValueError("_Placed takes ways (router 'placed') or a placer (router 'stream'), one of them")
        super().__init__(replicas, predicted)
        self.ways, self.first, self.sizes = ways, first, sizes
        self.placer, self.prompt_lens, self.loads = placer, prompt_lens, loads
        self.plan: dict[int, int] = {}  # per request of a group placed and not yet routed: its replica

    def select(self, job: int, group: int) -> int:
        if job not in self.plan:
            start, n = int(self.first[group]), int(self.sizes[group])
            pred = self.predicted[start:start + n]
            if self.placer is None:
                placed = place_ways(pred, [n], len(self.work), self.ways, loads=self.work)
            else:
                loads = self.work if self.loads is None else self.loads()
                placed, _ = self.placer.place(pred, int(self.prompt_lens[group]), len(self.work), loads=loads)
            self.plan.update(zip(range(start, start + n), placed.tolist()))
        r = self.plan.pop(job)
        self.work[r] += float(self.predicted[job])
        return r


def run_async_rollout(groups: Sequence[Any], *, batch: int, steps: int, max_staleness: int,
                      train_seconds: float, update_seconds: float = 0.0, train_seconds_per_token: float = 0.0,
                      max_concurrent: int | None = None, policy: str = "sglang", router: str = "round_robin",
                      predicted: Any = None, replicas: int = 1, budget_tokens: int, max_new_tokens: int,
                      cost: Any = None,
                      prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK, max_num_seqs: int | None = None,
                      steal: bool = False, resubmit_seconds: float = 0.0,
                      snapshot_seconds: float | None = None, prefill_share: float | None = None,
                      ranks: int = 1, share_learning: bool = False, ways: int | None = None,
                      compression: Any = None) -> AsyncRollout:
    """Simulate ``steps`` learner steps of AReaL's asynchronous RL loop (see the module docstring).

    Args:
        groups: the stream of groups in the order the dataset gives them (objects with ``lengths``,
            ``prompt_len`` and ``prompt_id``); at least ``(steps + max_staleness) x batch`` of them.
        batch: groups per learner step (AReaL's ``consumer_batch_size``).
        steps: learner steps to simulate (each ends with a weight update).
        max_staleness: versions a group may lag (``max_head_offpolicyness``); 0: synchronous RL.
        train_seconds: the learner's seconds per step, plus ``train_seconds_per_token`` per prompt and
            completion token of its batch.
        update_seconds: seconds every engine is paused while the weights are sent.
        max_concurrent: groups in flight at most (``max_concurrent_rollouts``); None: ``batch``, AReaL's
            default.
        policy: each engine's scheduler, one of :data:`simulate.rollout.THROTTLED_POLICIES`.
        router: one of :data:`ASYNC_ROUTERS` (AReaL's is ``round_robin``).
        predicted: predicted lengths per completion of the stream, flattened in group order (for
            ``least_work`` and ``steal``; the engines here use none); or a predictor (the
            :class:`lengthsched.LengthPredictor` protocol, e.g. :class:`lengthsched.OnlineLengthPredictor`)
            asked once per group, by its ``prompt_id``, when the group is submitted (the groups first in flight
            when the run starts, before any is back) and, where it has
            ``observe``, told the group's lengths when the whole group is back (rollout step = groups back //
            ``batch``): what lengthsched.integrations.verl_async's planner does.
        replicas, budget_tokens, max_new_tokens, cost, prefill_chunk, max_num_seqs: as for
            :func:`simulate.run_rollout` (``budget_tokens`` is each engine's KV pool, prompts included).
        steal: lengthsched's stealing on top of the router: each engine runs ``steal`` (``steal_sglang`` on
            SGLang engines) over the requests routed to it, a replica with an empty queue and predicted room
            taking waiting requests from the back of the fullest queue that waits for memory, and running
            requests moving (with their tokens, recomputed where they land) to replicas that sit idle, as
            in :func:`simulate.run_rollout` (:class:`lengthsched.runtime.dispatch.WorkStealing`); needs
            ``predicted``. The router counts a stolen or moved request on its new replica.
        resubmit_seconds: with ``steal``, seconds a stolen or moved request travels before its new replica
            can run it (``WorkStealing.RESUBMIT_SECONDS``: the framework's abort and resubmission; 0: at once).
        snapshot_seconds: with ``steal`` on vLLM's engines, decide from snapshots as a framework's driver
            does (``steal_observed``: a :class:`lengthsched.integrations.StealCoordinator` told where each
            request was routed, seeing each replica's requests and their tokens at most every
            ``snapshot_seconds`` of modelled time, a poll interval) instead of from the engines' exact state;
            None: exact (``steal``).
        prefill_share: with ``router="placed"``, cap the spread chosen from the groups first in flight at
            ``1 + floor(prefill_share x`` their predicted completion tokens / their prompt tokens``)``
            (:func:`lengthsched.integrations.rollout.spread_ways`' cap, ``PREFILL_SHARE`` in
            ``lengthsched.integrations.verl_async``); with ``router="stream"``, the ``prefill_share`` of its
            ``StreamPlacer``; None: ``steal``'s spread alone.
        ways: with ``router="stream"``, a fixed spread for its ``StreamPlacer`` (its ``ways``; 1: whole groups,
            ``install(..., ways=1)`` of lengthsched.integrations.areal; at least enough for the groups first in
            flight to reach every replica, as the placer widens it); None: the placer's estimate.
        ranks: the trainer's data-parallel ranks, each of which routes its own share of the groups (group g
            submitted by rank g mod ``ranks``) from its own state, as each rank of AReaL's SPMD mode holds its own
            engine: a round robin of its own (rank k's starting at server k x replicas // ranks; AReaL starts
            each at random), its own count of predicted work (``least_work``) or its own ``StreamPlacer`` over the
            work it sent (``stream``: lengthsched.integrations.areal on every rank, each placer's spread estimated
            from all the groups first in flight, whose prompts share the servers' pools whichever rank sent
            them). Not with ``steal`` or the routers that see every request (``placed``, verl's). 1: one router
            for the whole loop. ``predicted`` may then be one learning predictor per rank (a sequence of
            ``ranks``), each asked for and told of its own rank's groups only, its rollout step its own groups
            back // (``batch`` // ``ranks``), as lengthsched.integrations.areal runs on every rank; one predictor
            is one learning from every rank's groups.
        share_learning: with a learning predictor per rank, the ranks pool what they learn as the integration's
            ``share_dir`` does: as each rank's rollout step starts, its predictor's ``state_dict()`` is what its
            file holds from then on, and it takes in (``merge_state_dict``) the other ranks' files written since it
            last read them.
        compression: a ``lengthsched.KVCompression`` (Sparse-RL's compressed cache), as for
            :func:`simulate.run_rollout`: every request holds and reads at most ``compression.max_retained``
            generated tokens and the engines admit by that; a request an update aborts, or a preemption, is
            recomputed from all its tokens and holds the capped KV again. For the engine policies that run one
            (``POLICIES[name].compressed``: ``vllm`` and ``sglang``, and with ``steal`` ``steal`` /
            ``steal_observed`` on vLLM's engines, ``steal_sglang`` on SGLang's).
    """
    batch = check_int("batch", batch, minimum=1)
    steps = check_int("steps", steps, minimum=1)
    eta = check_int("max_staleness", max_staleness, minimum=0)
    cap = batch if max_concurrent is None else check_int("max_concurrent", max_concurrent, minimum=1)
    rules = _Rules("areal", batch=batch, units=1, cap=cap, bound=eta, drain=False)
    return _simulate(groups, rules, steps=steps, need=(steps + eta) * batch,
                     need_text="(steps + max_staleness) x batch", train_seconds=train_seconds,
                     update_seconds=update_seconds, train_seconds_per_token=train_seconds_per_token, policy=policy,
                     router=router, predicted=predicted, replicas=replicas, budget_tokens=budget_tokens,
                     max_new_tokens=max_new_tokens, cost=cost, prefill_chunk=prefill_chunk,
                     max_num_seqs=max_num_seqs, steal=steal, resubmit_seconds=resubmit_seconds,
                     snapshot_seconds=snapshot_seconds, prefill_share=prefill_share, ranks=ranks,
                     share_learning=share_learning, ways=ways, compression=compression)


def run_verl_async(groups: Sequence[Any], *, batch: int, steps: int, staleness_threshold: float,
                   local_steps: int = 4, partial_rollout: bool = True, train_seconds: float,
                   update_seconds: float = 0.0, train_seconds_per_token: float = 0.0,
                   max_concurrent: int | None = None, policy: str = "vllm", router: str | None = None,
                   predicted: Any = None, replicas: int = 1, budget_tokens: int, max_new_tokens: int,
                   cost: Any = None, prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
                   max_num_seqs: int | None = None, version: str = "0.9.1", steal: bool = False,
                   resubmit_seconds: float = 0.0, snapshot_seconds: float | None = None,
                   prefill_share: float | None = None, ways: int | None = None,
                   compression: Any = None) -> AsyncRollout:
    """Simulate ``steps`` weight versions of verl's fully asynchronous recipe (see the module docstring).

    Args:
        groups: the stream of groups, as for :func:`run_async_rollout`; at least
            ``(steps - 1) x batch + floor((1 + staleness_threshold) x batch)`` of them (what the last version
            may have started).
        batch: groups per weight version (``trigger_parameter_sync_step x require_batches x
            ppo_mini_batch_size``, prompts).
        steps: weight versions to simulate (each ends with a weight update).
        staleness_threshold: verl's ``staleness_threshold`` (a share of ``batch``, 0 or more; 0: every
            version's groups come from its own weights; verl's default 0.1).
        local_steps: learner updates per version (``trigger_parameter_sync_step``, verl's default 4); each
            trains ``batch / local_steps`` groups, which must be whole.
        partial_rollout: an update aborts the requests in flight and resumes them after (verl's default);
            False (``version="b178a3c"`` only): the update waits for every request in flight to finish.
        train_seconds: the learner's seconds per version (each local update ``train_seconds / local_steps``),
            plus ``train_seconds_per_token`` per prompt and completion token it trains on.
        update_seconds: seconds the engines are paused while the weights are sent.
        max_concurrent: groups in flight at most; None: verl's ``16 x replicas``, at most
            ``(1 + staleness_threshold) x batch``.
        policy: each engine's scheduler, one of :data:`simulate.rollout.THROTTLED_POLICIES` (verl runs vLLM
            or SGLang).
        router: one of :data:`ASYNC_ROUTERS`; None: the version's (0.9.1: ``least_loaded``, the fewest in
            flight; b178a3c: ``round_robin``, the fewest sent so far, and the requests an update aborted are
            routed again when they resume).
        predicted, replicas, budget_tokens, max_new_tokens, cost, prefill_chunk, max_num_seqs, steal,
            resubmit_seconds, snapshot_seconds, prefill_share, compression: as for :func:`run_async_rollout` (``steal``:
            what a lengthsched stealing driver inside the recipe would do; verl's own client waits 1 s before
            it resubmits an aborted request, ``lengthsched.integrations.verl_stealing``'s client about 0.05 s;
            ``snapshot_seconds``: the driver's poll interval, 0.25 s by default in
            ``lengthsched.integrations.verl_async``, whose placement caps the spread by ``prefill_share``).
        ways: with ``router="stream"``, a fixed spread for its ``StreamPlacer`` (the integration's
            ``+lengthsched.ways``; 1: whole groups); None: the placer's estimate (the integration's default).
        version: whose code: ``"0.9.1"`` (the released wheel) or ``"b178a3c"`` (January 2026), one of
            :data:`VERL_VERSIONS` (module docstring).
    """
    if version not in VERL_VERSIONS:
        raise InvalidArgument("version", version, "one of " + ", ".join(VERL_VERSIONS))
    old = version == "b178a3c"
    batch = check_int("batch", batch, minimum=1)
    steps = check_int("steps", steps, minimum=1)
    threshold = check_nonnegative_float("staleness_threshold", staleness_threshold)
    local_steps = _check_local_steps(local_steps, batch)
    if not isinstance(partial_rollout, (bool, np.bool_)):
        raise InvalidArgument("partial_rollout", partial_rollout, "True or False")
    if not partial_rollout and not old:
        raise InvalidArgument("partial_rollout", partial_rollout, "True with verl 0.9.1 (without it 0.9.1 ends the "
                                                                  "aborted requests with the tokens they have: not "
                                                                  "modelled; version='b178a3c' waits for them)")
    router = ("round_robin" if old else "least_loaded") if router is None else router
    bound = int(batch * (1.0 + threshold))  # verl's max_required_samples
    cap = (min(VERL_GROUPS_PER_SERVER * check_int("replicas", replicas, minimum=1), bound) if max_concurrent is None
           else check_int("max_concurrent", max_concurrent, minimum=1))
    rules = _Rules("verl b178a3c" if old else "verl", batch=batch, units=local_steps, cap=cap, bound=bound,
                   drain=not partial_rollout, threshold=threshold)
    return _simulate(groups, rules, steps=steps, need=(steps - 1) * batch + bound,
                     need_text="(steps - 1) x batch + floor((1 + staleness_threshold) x batch)",
                     train_seconds=train_seconds,
                     update_seconds=update_seconds, train_seconds_per_token=train_seconds_per_token, policy=policy,
                     router=router, predicted=predicted, replicas=replicas, budget_tokens=budget_tokens,
                     max_new_tokens=max_new_tokens, cost=cost, prefill_chunk=prefill_chunk,
                     max_num_seqs=max_num_seqs, steal=steal, resubmit_seconds=resubmit_seconds,
                     snapshot_seconds=snapshot_seconds, prefill_share=prefill_share, ways=ways,
                     compression=compression)


def _uneven(naps: Sequence[tuple[float, float]], replicas: int) -> float:
    """Replica-seconds of the idle intervals ``naps`` (from, to) during which not every replica was idle."""
    events = sorted([(a, 1) for a, b in naps if b > a] + [(b, -1) for a, b in naps if b > a])
    asleep, last, idle, together = 0, 0.0, 0.0, 0.0
    for t, step in events:
        idle += asleep * (t - last)
        if asleep == replicas:
            together += replicas * (t - last)
        asleep, last = asleep + step, t
    return idle - together


def _check_local_steps(local_steps: Any, batch: int) -> int:
    """``local_steps`` checked: a whole divisor of ``batch`` (each local update trains batch / local_steps
    groups)."""
    local_steps = check_int("local_steps", local_steps, minimum=1)
    if batch % local_steps:
        raise InvalidArgument("local_steps", local_steps, f"a divisor of batch = {batch} (each local update trains "
                                                          "batch / local_steps groups)")
    return local_steps


@dataclass(frozen=True)
class _Rules:
    """What differs between AReaL's loop and verl's (module docstring)."""

    design: str  # "areal", "verl" (0.9.1) or "verl b178a3c"
    batch: int  # groups per weight version
    units: int  # learner updates per version, each on batch // units groups
    cap: int  # groups in flight at most
    bound: int  # AReaL: the staleness bound (versions); verl: groups started per count (max_required_samples)
    drain: bool  # an update waits for the requests in flight instead of aborting them
    threshold: float = 0.0  # verl's staleness_threshold (reported)

    @property
    def unit(self) -> int:
        return self.batch // self.units

    @property
    def verl(self) -> bool:
        return self.design != "areal"

    @property
    def january(self) -> bool:
        """verl at b178a3c: nothing starts while an update is under way (its rollouter.pause()), and the
        requests an update aborted are routed again when they resume (a new request id)."""
        return self.design == "verl b178a3c"


def _simulate(groups: Sequence[Any], rules: _Rules, *, steps: int, need: int, need_text: str, train_seconds: float,
              update_seconds: float, train_seconds_per_token: float, policy: str, router: str, predicted: Any,
              replicas: int, budget_tokens: int, max_new_tokens: int, cost: Any, prefill_chunk: int | None,
              max_num_seqs: int | None, steal: bool = False, resubmit_seconds: float = 0.0,
              snapshot_seconds: float | None = None, prefill_share: float | None = None,
              ranks: int = 1, share_learning: bool = False, ways: int | None = None,
              compression: Any = None) -> AsyncRollout:
    """The loop of :func:`run_async_rollout` and :func:`run_verl_async` under ``rules``; with ``steal``, each
    engine runs lengthsched's ``steal`` (``steal_sglang`` on SGLang) over the requests the router sent it;
    ``ranks``, ``share_learning``, ``ways``, ``compression``: :func:`run_async_rollout`'s."""
    train_seconds = check_nonnegative_float("train_seconds", train_seconds)
    per_token = check_nonnegative_float("train_seconds_per_token", train_seconds_per_token)
    update_seconds = check_nonnegative_float("update_seconds", update_seconds)
    if policy not in THROTTLED_POLICIES:
        raise InvalidArgument("policy", policy, "one of " + ", ".join(THROTTLED_POLICIES) + " (engines whose queue "
                                                "takes requests as they are sent)")
    if router not in ASYNC_ROUTERS:
        raise InvalidArgument("router", router, "one of " + ", ".join(ASYNC_ROUTERS))
    groups = list(groups)
    if len(groups) < need:
        raise InvalidArgument("groups", f"{len(groups)} groups", f"at least {need_text} = {need} "
                                                                 "(what the staleness bound may submit)")
    if not isinstance(steal, (bool, np.bool_)):
        raise InvalidArgument("steal", steal, "True or False")
    resubmit_seconds = check_nonnegative_float("resubmit_seconds", resubmit_seconds)
    if resubmit_seconds > 0 and not steal:
        raise InvalidArgument("resubmit_seconds", resubmit_seconds, "0 without steal (only stolen and moved "
                                                                    "requests are resubmitted)")
    if snapshot_seconds is not None:
        snapshot_seconds = check_positive_float("snapshot_seconds", snapshot_seconds)
        if not steal or policy != "vllm":
            raise InvalidArgument("snapshot_seconds", snapshot_seconds,
                                  f"None with steal={steal} and policy={policy!r} (snapshots drive stealing on "
                                  "vLLM's engines: steal_observed)")
    if prefill_share is not None:
        prefill_share = check_positive_float("prefill_share", prefill_share)
        if router not in ("placed", "stream"):
            raise InvalidArgument("prefill_share", prefill_share, f"None with router={router!r} (it caps how "
                                                                  "widely routers 'placed' and 'stream' spread a "
                                                                  "group)")
    if ways is not None:
        ways = check_int("ways", ways, minimum=1)
        if router != "stream":
            raise InvalidArgument("ways", ways, f"None with router={router!r} (it fixes the spread of router "
                                                "'stream')")
    ranks = check_int("ranks", ranks, minimum=1)
    if ranks > 1 and (steal or router not in RANKED_ROUTERS):
        raise InvalidArgument("ranks", ranks, "1 with " + ("steal" if steal else f"router={router!r}")
                              + " (each rank routes by itself with routers " + ", ".join(map(repr, RANKED_ROUTERS))
                              + ", without stealing)")
    if (router in PREDICTED_ROUTERS or steal) != (predicted is not None):
        raise InvalidArgument("predicted", "None" if predicted is None else "predictions",
                              "predictions with routers " + ", ".join(map(repr, PREDICTED_ROUTERS))
                              + " or with steal, and only with them")
    total = sum(len(g.lengths) for g in groups[:need])
    learning = None  # a predictor asked as each group is submitted and told its lengths when it is back
    per_rank = None  # or one per rank (each its own rank's groups), with the files they pool (share_learning)
    if isinstance(predicted, (list, tuple)) and predicted and all(hasattr(q, "predict") for q in predicted):
        if len(predicted) != ranks or router not in RANKED_ROUTERS:
            raise InvalidArgument("predicted", f"{len(predicted)} predictors", f"one per rank ({ranks}), each "
                                  "routing by itself (routers " + ", ".join(map(repr, RANKED_ROUTERS)) + ")")
        per_rank, predicted = _RankLearning(list(predicted), rules.batch, share_learning), None
    elif share_learning:
        raise InvalidArgument("share_learning", share_learning, "False without a learning predictor per rank")
    if predicted is not None and hasattr(predicted, "predict"):
        learning, predicted = predicted, None
    elif predicted is not None:
        predicted = np.asarray(predicted, dtype=np.float64).ravel()
        if len(predicted) < total:
            raise InvalidArgument("predicted", f"{len(predicted)} predictions", f"one per completion of the "
                                                                                 f"first {need} groups ({total})")
        predicted = predicted[:total]
    groups = groups[:need]
    kind = (STEAL_POLICIES[policy] if snapshot_seconds is None else "steal_observed") if steal else policy
    kv_cap = compression_cap(compression, kind, rollout=True)
    spec, groups, lengths, flat, owner, keys, common = _prepare(
        groups, policy, replicas, budget_tokens, max_new_tokens, predicted, cost, 0, prefill_chunk, False,
        max_num_seqs, kv_cap=kv_cap)
    learns = learning is not None or per_rank is not None  # predictions asked as each group is submitted
    if learns:  # filled as the groups are submitted (submit)
        common["pred"] = np.zeros(len(flat), dtype=np.float64)
    cost = common["cost"]
    plens = common["prompt_lens"]
    batch, cap, unit = rules.batch, rules.cap, rules.unit
    unit_seconds = train_seconds / rules.units

    sizes = [len(x) for x in lengths]
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    opening = groups[:min(rules.cap, rules.bound if rules.verl else batch)]  # the groups first in flight

    def ask(g: int) -> None:
        """Group g's predicted length from the learning predictor, asked once: the groups first in flight at the
        start (submitted before any group is back, so it is what their submission would get), the others as
        they are submitted."""
        asked, key = (learning, keys[g]) if per_rank is None else (per_rank.of(g), str(keys[g]))
        common["pred"][first[g]:first[g] + sizes[g]] = predict_lengths(asked, [key],
                                                                      max_new_tokens=common["max_new"])[0]

    if learns:
        for g in range(len(opening)):
            ask(g)
    if router == "placed":  # the spread steal would choose for the groups first in flight
        n_open = int(sum(sizes[:len(opening)]))
        _, placed_ways = steal_ways(opening, common["pred"][:n_open], common["budget"], replicas, common["max_new"],
                                    prefill_share=prefill_share, kv_cap=kv_cap)
        live = _Placed(replicas, common["pred"], first, sizes, ways=placed_ways)
    elif router == "stream":  # the integration's own placer per rank; its concurrency: all the groups in flight
        live = _Ranks.of([_Placed(replicas, common["pred"], first, sizes, prompt_lens=plens,
                                  placer=StreamPlacer(common["budget"], concurrency=len(opening), ways=ways,
                                                      prefill_share=prefill_share),
                                  loads=None if snapshot_seconds is None else lambda: coord.loads())
                          for _ in range(ranks)], owner)
    elif router in RANKED_ROUTERS:
        live = _Ranks.of([_RoundRobin(replicas, k * replicas // ranks) if router == "round_robin" else
                          _LeastWork(replicas, common["pred"]) for k in range(ranks)], owner)
    else:
        live = _Live(router, replicas)
    engines, pols = [], []
    problem = Problem(lengths=flat, max_new_tokens=common["max_new"], budget_tokens=common["budget"],
                      slots=common["max_seqs"], prompt_ids=common["job_keys"],
                      predicted=common["pred"] if steal else None, kv_cap=kv_cap)
    for r in range(replicas):
        pol = POLICIES[kind].cls(problem, GroupQueue(np.zeros(0, dtype=np.int64), []), r) if steal else \
            POLICIES[kind].cls(problem)
        pol.waiting = []  # a stack (the front is the end): filled as requests are routed here
        eng = _engine(flat, owner, common["tails"], common["prompt_kv"], plens, common["budget"],
                      common["prefill_chunk"], False, pol.block_size, None, cost, kv_cap=kv_cap)
        eng.cache_prompts = True  # a prompt stays cached for siblings sent later (flushed at each update)
        eng.start(pol)
        engines.append(eng)
        pols.append(pol)
    home = np.full(len(flat), -1, dtype=np.int64)  # per request: the replica the router counts it on
    if steal:  # every replica sees the others' queues and engines; what it sends elsewhere is recorded
        share_board(pols, engines, [pol.waiting for pol in pols], resubmit_seconds)
        for pol in pols:
            pol.sent = []
    # steal_observed: the driver's view, told where each request was routed (tell)
    coord = None if snapshot_seconds is None else observe_board(pols, common["budget"], snapshot_seconds)

    def tell(job: int, r: int) -> None:
        if coord is not None:
            g = int(owner[job])
            coord.submit(job, r, float(common["pred"][job]), prompt_tokens=int(plens[g]), group=g,
                         generated=int(engines[r].done[job]))
    clock = _OneClock(engines)
    idle = clock.idle

    n_groups = len(groups)
    left = np.asarray(sizes, dtype=np.int64).copy()  # per group: completions not finished
    submitted = np.full(n_groups, np.nan)
    marks: list[list[tuple[int, int]]] = [[] for _ in range(len(flat))]  # per job: (version, tokens by then)
    seen = [0] * replicas
    ready: list[int] = []  # finished groups not yet trained on, in finish order
    finished_at: dict[int, float] = {}
    records: list[AsyncStep] = []
    TRAINER = -1  # the learner's events in the clock's heap (before the replicas' at the same second)
    # counted: verl's staleness_samples (groups started since the count was last reset)
    state = dict(version=0, next_group=0, running=0, accepted=0, interrupted=0, counted=0, back=0)
    # The learner: training (groups, start, end) or None; trained: the version's local updates so far;
    # pausing: the replicas still to stop before an update (None: not stopping); update_end: when the update
    # under way ends (None: none).
    learner: dict[str, Any] = dict(training=None, trained=[], pausing=None, update_end=None)
    paused: set[int] = set()
    asleep_since: dict[int, float] = {}
    naps: list[tuple[float, float]] = []  # every replica's idle or paused time (seconds from, to)

    def rise(r: int, now: float) -> None:
        """Replica r, asleep (idle or paused), runs again from ``now``."""
        naps.append((asleep_since.pop(r, now), now))

    def updating() -> bool:
        return learner["pausing"] is not None or learner["update_end"] is not None

    def capacity() -> int:
        s_ = state
        if rules.verl:  # b178a3c: nothing starts while the rollouter is paused for an update
            return 0 if rules.january and updating() else min(cap - s_["running"], rules.bound - s_["counted"])
        return min(cap - s_["running"], (rules.bound + s_["version"] + 1) * batch - (s_["accepted"] + s_["running"]))

    def wake(r: int, now: float) -> None:
        if r not in idle:
            return
        idle.discard(r)
        if updating():  # it starts once the weights are there (asleep until then)
            paused.add(r)
        else:
            rise(r, now)
            resume(r, now)

    def resume(r: int, now: float) -> None:
        """Replica r runs again after it had nothing to run (an SGLang server resets its reservation ratio)."""
        ran_dry(pols[r], engines[r])
        clock.at(r, now)

    def submit(now: float) -> None:
        while state["next_group"] < n_groups and capacity() > 0:
            g = state["next_group"]
            state["next_group"] += 1
            state["running"] += 1
            state["counted"] += 1
            submitted[g] = now
            if learns:
                if g >= len(opening):
                    ask(g)
                if steal:  # the replicas' shared predicted work
                    pols[0].work[first[g]:first[g] + sizes[g]] = common["pred"][first[g]:first[g] + sizes[g]]
            for job in range(int(first[g]), int(first[g]) + sizes[g]):
                r = live.select(job, g)
                home[job] = r
                pols[r].waiting.insert(0, job)
                engines[r].claim(job)
                tell(job, r)
                wake(r, now)

    def start_training(now: float) -> None:
        nonlocal ready
        if learner["training"] is not None or updating() or len(records) >= steps or len(ready) < unit:
            return
        taken, ready = ready[:unit], ready[unit:]
        tokens = int(sum(int(flat[first[g]:first[g] + sizes[g]].sum()) + sizes[g] * int(plens[g]) for g in taken))
        end = now + unit_seconds + per_token * tokens
        learner["training"] = (tuple(taken), now, end)
        heapq.heappush(clock.heap, (end, TRAINER))

    def stopping(r: int) -> bool:
        """Whether replica r stops now for the update under way (with ``drain``, once it has nothing left)."""
        if learner["pausing"] is None or r not in learner["pausing"]:
            return False
        return not rules.drain or not (engines[r].running or pols[r].waiting)

    def pause(r: int, now: float) -> None:
        """Replica r stops at the end of the step it ran: its running requests are aborted (kept at the front
        of its queue with their tokens, which came from the current version), its prompt cache cleared."""
        eng, pol = engines[r], pols[r]
        for job in reversed(list(eng.running)):  # the first admitted ends at the front
            lift(eng, job)
            pol._requeue(job)
            state["interrupted"] += 1
        for job in pol.waiting + [job for _, job in (pol.inbox[r] if steal and pol.inbox else ())]:
            if eng.done[job]:
                marks[job].append((state["version"], eng.done[job]))
        eng.evict_idle()
        paused.add(r)
        asleep_since[r] = now
        learner["pausing"].discard(r)
        if not learner["pausing"]:  # every engine stopped: the weights go out
            begin_update(now)

    def reroute() -> None:
        """Every request queued on a paused engine (aborted by the update, or sent and not started) is sent
        again, in submission order, to the engine the router picks, ahead of anything new (verl)."""
        moving = sorted((job, r) for r in paused for job in pols[r].waiting)
        for r in paused:
            pols[r].waiting.clear()
        for job, src in moving:
            live.finished(int(home[job]), [job])
            dst = live.select(job, int(owner[job]))
            home[job] = dst
            hand_over(job, engines[src], engines[dst])
            pols[dst].waiting.insert(0, job)
            tell(job, dst)
            if dst in idle:  # asleep through the update: it wakes with the others
                idle.discard(dst)
                paused.add(dst)

    def begin_update(now: float) -> None:
        learner["pausing"] = None
        learner["update_end"] = now + update_seconds
        heapq.heappush(clock.heap, (learner["update_end"], TRAINER))

    def trainer_event(now: float) -> None:
        training = learner["training"]
        if training is not None and now >= training[2]:  # a local update done
            learner["trained"].append(training)
            learner["training"] = None
            if len(learner["trained"]) < rules.units:
                start_training(now)
                return
            # the version is trained: every engine stops (or finishes what it runs), then the update
            learner["pausing"] = {r for r in range(replicas) if r not in idle and r not in paused}
            if not learner["pausing"]:
                begin_update(now)
        elif learner["update_end"] is not None and now >= learner["update_end"]:  # the new weights are there
            records.append(_record(len(records), learner["trained"], now, first, sizes, marks, finished_at))
            learner["trained"] = []
            learner["update_end"] = None
            state["version"] += 1
            state["counted"] = state["running"] + len(ready)  # verl's update_param_version
            if rules.january:
                reroute()
            for r in sorted(paused):
                rise(r, now)
                if pols[r].waiting or engines[r].running or (steal and pols[r].in_transit()):
                    resume(r, now)
                else:
                    idle.add(r)
                    asleep_since[r] = now
            paused.clear()
            submit(now)
            start_training(now)

    def stolen(pol: Any, now: float) -> None:
        """After a decision of a stealing replica: the router counts each request it sent elsewhere there, and
        the replicas it sent requests to wake (at once, or when a resubmitted request lands)."""
        for job, dst in pol.sent:
            live.moved(job, int(home[job]), dst)
            home[job] = dst
        pol.sent.clear()
        for other in pol.woke:
            wake(other, now)
        pol.woke = []
        for other, at in pol.wake_at:
            wake(other, at)
        pol.wake_at = []

    submit(0.0)
    start_training(0.0)
    while clock.heap and len(records) < steps:
        now, r = heapq.heappop(clock.heap)
        if r == TRAINER:
            trainer_event(now)
            continue
        eng, pol = engines[r], pols[r]
        done = len(eng.collected)
        if done > seen[r]:
            for job in eng.collected[seen[r]:done]:
                live.finished(int(home[job]), [job])
                marks[job].append((state["version"], int(flat[job])))
                g = int(owner[job])
                left[g] -= 1
                if not left[g]:
                    state["running"] -= 1
                    state["accepted"] += 1
                    finished_at[g] = now
                    ready.append(g)
                    if per_rank is not None:  # back: its rank's predictor learns it
                        per_rank.back(g, str(keys[g]), flat[first[g]:first[g] + sizes[g]].tolist())
                    elif learning is not None:  # back: its lengths teach the predictor (a rollout step per version)
                        state["back"] += 1
                        observe_lengths(learning, [keys[g]] * sizes[g], flat[first[g]:first[g] + sizes[g]].tolist(),
                                        step=state["back"] // batch)
            seen[r] = done
            submit(now)
            start_training(now)
        if stopping(r):
            pause(r, now)
            continue
        if steal:
            pol.idle_now, pol.now = idle, now
        alive = eng.decide(pol)
        if steal:
            stolen(pol, now)
        if not alive:
            if steal and pol.in_transit():  # asleep until the first request sent here lands
                land = pol.inbox[r][0][0]
                naps.append((now, land))
                clock.at(r, land)
                continue
            idle.add(r)
            asleep_since[r] = now
            continue
        if steal and pol.blocked and idle:  # work waits here for memory: the idle replicas may steal it
            for other in sorted(idle):
                wake(other, now)
        clock.run(r, eng.t + 1, pol.pads, cost, now)  # a pause or new requests may come at any step
    if len(records) < steps:
        raise InvalidArgument("groups", f"{n_groups} groups", f"a stream long enough for {steps} steps")
    end = records[-1].update_end
    for r in list(asleep_since):
        rise(r, max(end, asleep_since[r]))
    return AsyncRollout(
        policy=kind, router=router, replicas=replicas, batch=batch,
        max_staleness=rules.threshold if rules.verl else rules.bound, max_concurrent=cap,
        steps=tuple(records), seconds=end, generated_tokens=sum(e.decoded_tokens for e in engines),
        interrupted=state["interrupted"], recomputed_tokens=sum(e.recomputed_tokens for e in engines),
        preemptions=sum(e.preemptions for e in engines), idle_seconds=sum(b - a for a, b in naps),
        uneven_seconds=_uneven(naps, replicas),
        drawn_tokens=int(flat[:int(first[steps * batch]) if steps * batch < n_groups else len(flat)].sum()),
        cost_name=f"{cost.model} on {cost.gpu}", group_submitted=tuple(float(x) for x in submitted),
        group_finished=tuple(float(finished_at.get(g, np.nan)) for g in range(n_groups)), design=rules.design,
        local_steps=rules.units, partial_rollout=not rules.drain)


@dataclass(frozen=True)
class SyncSteps:
    """What :func:`run_sync_steps` returns: each batch's rollout, then the learner and the update."""

    rollouts: tuple[RolloutResult, ...]  # one per step, on the stream's batches in order
    train_seconds: float
    update_seconds: float
    local_steps: int = 1  # learner updates per step, each on a slice of the batch as it finishes
    # per step with local_steps > 1: seconds from the rollout's start to the learner's last update's end
    trained_at: tuple[float, ...] = ()

    @property
    def seconds(self) -> float:
        """The run's modelled seconds: every rollout, and the learner and an update after each (with local
        updates, the learner's last one ends ``trained_at`` after its rollout began)."""
        if self.local_steps > 1:
            return sum(self.trained_at) + len(self.rollouts) * self.update_seconds
        return sum(r.seconds for r in self.rollouts) + len(self.rollouts) * (self.train_seconds + self.update_seconds)

    @property
    def tokens(self) -> int:
        """Completion tokens trained (every group of every batch, all from the weights being trained)."""
        return int(sum(r.tokens for r in self.rollouts))

    @property
    def recomputed_tokens(self) -> int:
        return int(sum(r.recomputed_tokens for r in self.rollouts))

    @property
    def learner_idle_share(self) -> float:
        """Share of the run the learner waited for a rollout or an update."""
        seconds = self.seconds
        return 1.0 - len(self.rollouts) * self.train_seconds / seconds if seconds else 0.0

    @property
    def uneven_share(self) -> float:
        """Share of the replicas' seconds one sat idle while another ran (:attr:`AsyncRollout.uneven_share`):
        each rollout's replicas from their last finish to the slowest one's (a replica that sat idle and then
        ran again within a rollout is counted from its last finish only)."""
        seconds, replicas = self.seconds, len(self.rollouts[0].replica_seconds) if self.rollouts else 1
        waits = sum(r.seconds - s for r in self.rollouts for s in r.replica_seconds)
        return waits / (replicas * seconds) if seconds else 0.0


def run_sync_steps(groups: Sequence[Any], policy: str, *, batch: int, steps: int, train_seconds: float,
                   update_seconds: float = 0.0, local_steps: int = 1, predicted: Any = None,
                   **rollout: Any) -> SyncSteps:
    """Synchronous RL on the machines of :func:`run_async_rollout`: step k rolls out the stream's groups
    ``k x batch`` to ``(k + 1) x batch`` with :func:`simulate.run_rollout` (``policy``, ``predicted`` sliced
    to them, ``rollout``: its other arguments), then the learner trains ``train_seconds`` and the update
    pauses every engine ``update_seconds``. With ``policy="sglang", router="least_loaded"`` it is AReaL's loop
    at ``max_staleness=0``, to the same seconds.

    ``local_steps`` > 1 streams the learner as verl's fully asynchronous recipe does at a staleness threshold
    of 0: it trains ``local_steps`` updates of ``batch / local_steps`` groups each (``train_seconds /
    local_steps`` apiece), each as soon as its groups finished (in the order they finish) and the update
    before it ended; the weights go out after the last. Every token still comes from the weights of its step."""
    batch = check_int("batch", batch, minimum=1)
    steps = check_int("steps", steps, minimum=1)
    train_seconds = check_nonnegative_float("train_seconds", train_seconds)
    update_seconds = check_nonnegative_float("update_seconds", update_seconds)
    local_steps = _check_local_steps(local_steps, batch)
    groups = list(groups)
    if len(groups) < steps * batch:
        raise InvalidArgument("groups", f"{len(groups)} groups", f"at least steps x batch = {steps * batch}")
    starts = np.concatenate([[0], np.cumsum([len(g.lengths) for g in groups])])
    rollouts, trained_at = [], []
    unit = batch // local_steps
    for k in range(steps):
        a, b = k * batch, (k + 1) * batch
        mine = None if predicted is None else predicted[starts[a]:starts[b]]
        if local_steps == 1:
            rollouts.append(run_rollout(groups[a:b], policy, predicted=mine, **rollout))
            continue
        r = run_rollout(groups[a:b], policy, predicted=mine, **{**rollout, "record": True})
        finish = np.sort(r.group_finish_seconds())
        end = 0.0
        for j in range(local_steps):  # each update once its slice finished and the one before it ended
            end = max(end, float(finish[(j + 1) * unit - 1])) + train_seconds / local_steps
        rollouts.append(r)
        trained_at.append(end)
    return SyncSteps(tuple(rollouts), train_seconds, update_seconds, local_steps, tuple(trained_at))


def _record(index, trained, update_end, first, sizes, marks, finished_at) -> AsyncStep:
    """The learner's step ``index`` from its local updates ``trained`` ((groups, start, end) each): its tokens
    by lag (the step trains version ``index``)."""
    taken = [g for groups, _, _ in trained for g in groups]
    lags: dict[int, int] = {}
    tokens = 0
    for g in taken:
        for job in range(int(first[g]), int(first[g]) + sizes[g]):
            before = 0
            for v, upto in marks[job]:
                if upto > before:
                    lags[index - v] = lags.get(index - v, 0) + upto - before
                    before = upto
            tokens += before
    width = max(lags, default=-1) + 1
    start, end = trained[0][1], trained[-1][2]
    busy = sum(e - s for _, s, e in trained)
    return AsyncStep(index=index, ready_seconds=float(max(finished_at[g] for g in taken)), train_start=float(start),
                     train_end=float(end), update_end=float(update_end), groups=tuple(int(g) for g in taken),
                     tokens=int(tokens), lag_tokens=tuple(lags.get(k, 0) for k in range(width)),
                     trained_seconds=float(busy))
