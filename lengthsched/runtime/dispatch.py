"""Rollout policies that dispatch requests to engine replicas as they free up, from one global queue.

A router (verl's, OpenRLHF's) fixes every request's replica when the step starts; a replica that
drains early then idles while another works through its tail. The policies here move work between
replicas while the step runs, so they run on one clock (``simulate.run_rollout`` prices every step
in modelled seconds as it happens). Each replica is vLLM's engine (blocks of 16, a request admitted
while its next block is free, preempted requests back to the front of its own queue).

- :class:`SeerLike` (``seer``): the context-aware scheduling of Seer (arXiv 2511.14617, section 4.3:
  "speculative" requests first, then approximate longest-first over groups). One probe completion
  per group is dispatched first (group order); a group's length estimate is the longest of its
  finished completions (``max_new_tokens`` until one finished, so groups not yet probed go
  early); the other requests go longest-estimated group first. Seer's divided rollout also
  migrates running requests in chunks through a global KV pool (Mooncake); that migration is not
  modelled: a started request stays on its replica (preempted ones resume there).
- :class:`WorkStealing` (``steal``): the project's policy. Each group's requests start spread over
  as many replicas as keep the prompts a replica receives within its pool
  (:func:`lengthsched.integrations.rollout.spread_ways`): all replicas, exactly as verl routes them
  (each request to the next replica), where the pools hold every prompt; otherwise each group is cut
  into that many runs, placed by predicted work (groups of most work first, each run to the least
  loaded replica; :func:`~lengthsched.integrations.rollout.place_ways`), so each prompt is held
  on fewer replicas while every replica still gets a share of many groups (whole groups, balanced
  only by the predictions, unbalance the replicas whenever those are wrong and the pools then admit
  everything at once, leaving nothing to steal). Whole groups all the same when the step's predicted
  tokens per replica reach ``CROWDED_POOLS`` (6) KV pools: the pools stay full, requests wait, and
  stealing rebalances. Each replica is vLLM's engine over its own
  queue (FCFS, eager admission, the newest preempted). A replica whose queue is empty while its live
  requests, grown to their predicted lengths, leave room in its pool steals from the back of the
  queue of the replica with the most predicted work waiting
  (:func:`lengthsched.integrations.rollout.steal_requests`, the decision a framework can import):
  work moves to the replicas that drain first. A stolen request that was preempted carries its
  generated tokens (text) and is recomputed where it lands, as it would have been where it was; no KV
  moves (most of the gain comes from these: docs/benchmarks.md, "What stealing gains, and from what").
  And once a replica has nothing left to run or steal, running requests of the others move to it at
  the end of every ``MIGRATE_CHUNK`` (128) tokens, the most predicted tokens to go first, one per idle
  replica, their generated tokens recomputed where they land.

Policies see predictions and what happened (admissions, progress, finishes), never a length that
has not been revealed (``tests/test_rollout.py`` changes unrevealed lengths and checks the decisions
up to the change are the same).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..integrations.rollout import CROWDED_POOLS, MOVE_CHUNK, STEAL_SHARE, move_requests, steal_requests
from ..integrations.stealing import StealCoordinator
from .baselines import SGLangLike, VLLMLike, ran_dry
from .engine import Engine
from .policies import Problem

__all__ = ["GroupQueue", "Dispatcher", "PullReplica", "SeerLike", "SeerDivided", "WorkStealing", "StealLongest",
           "StealObserved"]


def hand_over(job: int, src: Engine, dst: Engine, *, kv: bool = False) -> None:
    """``job`` (waiting, not running) moves from engine ``src`` to ``dst`` with the tokens it generated;
    ``kv``: its KV comes along (a global KV pool: loaded at ``dst``, not recomputed). KV that ``src``
    offloaded to its host memory (``Engine.offload``) stays there: without ``kv`` the job recomputes."""
    dst.claim(job)
    if src is not dst:
        dst.done[job], src.done[job] = src.done[job], 0
        src.transferred.discard(job)
        src.drop_cached(job)  # a later turn's conversation cached at src: recomputed at dst
    src.unclaim(job)
    if kv:
        dst.transferred.add(job)


def lift(eng: Engine, job: int) -> None:
    """Take running ``job`` off ``eng`` to run elsewhere (its KV freed here, its tokens kept): a move,
    not counted as a preemption (nor offloaded: its KV is recomputed where it lands unless it travels,
    :func:`hand_over` ``kv``)."""
    eng.preempt(job)
    eng.preemptions -= 1
    eng.transferred.discard(job)


def chunk_ended(eng: Engine, chunk: int) -> list[int]:
    """The running requests of ``eng`` that have just generated a whole number of ``chunk`` tokens (in a
    run of at least one step here: a request resumed with a whole number of chunks has not ended one)."""
    return [j for j in eng.running if eng.age(j) and eng.age(j) % chunk == 0 and eng.run_steps(j)]


def next_chunk_end(eng: Engine, chunk: int, wake: int | None) -> int | None:
    """The earlier of ``wake`` (a step, or None) and the next step at which a running request of
    ``eng`` ends a chunk of ``chunk`` tokens (``wake`` when nothing runs)."""
    if not eng.running:
        return wake
    ends = min(eng.t + chunk - eng.age(j) % chunk for j in eng.running)
    return ends if wake is None else min(wake, ends)


class GroupQueue:
    """The requests of a rollout step not yet started, by group, shared by the replicas.

    ``groups``: the group of every completion (global index); ``estimates``: each group's estimated
    length in tokens (the order: longest first, ties by group index). A group may have a ``probe``
    (its first request) that goes before every other request. Updating an estimate is O(log B)
    (a heap with lazy invalidation); pulling the head is amortised O(log B)."""

    def __init__(self, groups: Sequence[int], estimates: Sequence[float], probes: bool = False):
        self.group = np.asarray(groups, dtype=np.int64)
        count = int(self.group.max()) + 1 if len(self.group) else 0
        self.unstarted: list[list[int]] = [[] for _ in range(count)]
        for job in range(len(self.group) - 1, -1, -1):  # a stack per group: its lowest index on top
            self.unstarted[int(self.group[job])].append(job)
        self.estimate = [float(x) for x in estimates]
        self._version = [0] * count
        self._heap = [(-self.estimate[g], g, 0) for g in range(count) if self.unstarted[g]]
        heapq.heapify(self._heap)
        self.probes: list[int] = [g for g in range(count) if self.unstarted[g]][::-1] if probes else []
        self.origin: dict[int, Any] = {}  # started jobs given back (give_back): the engine each left
        self.left = len(self.group)
        self.longest_finished = [0] * count  # per group: its longest finished request so far (tokens)

    def __len__(self) -> int:
        return self.left

    def update(self, group: int, estimate: float) -> None:
        """Set ``group``'s estimated length (tokens)."""
        if estimate == self.estimate[group]:
            return
        self.estimate[group] = float(estimate)
        self._version[group] += 1
        if self.unstarted[group]:
            heapq.heappush(self._heap, (-float(estimate), group, self._version[group]))

    def head_group(self) -> int | None:
        """The group whose request goes next (a pending probe first), or None when all started."""
        while self.probes and not self.unstarted[self.probes[-1]]:
            self.probes.pop()
        if self.probes:
            return self.probes[-1]
        heap = self._heap
        while heap and (heap[0][2] != self._version[heap[0][1]] or not self.unstarted[heap[0][1]]):
            heapq.heappop(heap)
        return heap[0][1] if heap else None

    def peek(self, group: int) -> int:
        """The next request of ``group`` (it must have one)."""
        return self.unstarted[group][-1]

    def take(self, group: int) -> int:
        """Remove and return the next request of ``group``."""
        job = self.unstarted[group].pop()
        self.left -= 1
        if self.probes and self.probes[-1] == group:
            self.probes.pop()
        return job

    def give_back(self, job: int) -> None:
        """``job`` (started, not finished) goes back to the queue as its group's next request."""
        group = int(self.group[job])
        self.unstarted[group].append(job)
        self.left += 1
        self._version[group] += 1
        heapq.heappush(self._heap, (-self.estimate[group], group, self._version[group]))


class PullReplica(VLLMLike):
    """One replica of a dispatching rollout: vLLM's engine (blocks of 16, FCFS over its own waiting
    queue, preempted requests back to its front) whose waiting queue the :class:`Dispatcher` feeds.

    Subclasses say how loaded the replica is (:meth:`load`), whether one more request fits
    (:meth:`fits`), how they learn from finishes (:meth:`learn`) and may pick another victim
    (``_victim``)."""

    PROBES = False  # the queue sends one probe request per group first
    STEALS = False

    def __init__(self, problem: Problem, queue: GroupQueue | None = None, replica: int = 0,
                 keys: Sequence[Any] = ()):
        super().__init__(problem)
        self.keys = list(keys)  # the prompt key of every group
        alone = queue is None  # one engine on its own (run_group / run_batch): its own queue
        if alone:  # the groups are the problem's prompts (completion indices without prompt ids)
            ids = problem.query(range(problem.n))
            index: dict = {}
            groups = [index.setdefault(k, len(index)) for k in ids]
            queue = GroupQueue(groups, [float(problem.max_new_tokens)] * len(index), probes=self.PROBES)
        self.queue = queue
        self.replica = replica
        self.waiting = []  # this replica's queue (a stack: the front is the end)
        self._seen = 0  # finished requests already reported to learn()
        self.eng: Engine | None = None
        self.unfinished = 0  # requests dispatched here and not finished
        self._own = Dispatcher(queue, [self]) if alone else None  # what feeds it on its own

    def start(self, eng: Engine) -> None:
        """On its own, vLLM's check that every request fits; in a rollout the caller checked it."""
        self.eng = eng
        if self._own is not None:
            super().start(eng)

    def pending(self, eng: Engine) -> int:
        return len(self.waiting)

    def load(self) -> float:
        """How loaded the replica is (lower gets the next request)."""
        raise NotImplementedError

    def fits(self, job: int) -> bool:
        """Whether the replica takes ``job`` now."""
        raise NotImplementedError

    def take(self, job: int) -> None:
        """``job`` is dispatched here: to the back of this replica's queue."""
        self.waiting.insert(0, job)
        self.unfinished += 1
        self.eng.claim(job)

    def learn(self, eng: Engine, finished: list[int]) -> None:
        """``finished``: requests of this replica that finished since the last decision."""

    def _report_finishes(self, eng: Engine) -> None:
        """Count the requests that finished here since the last decision and :meth:`learn` from them."""
        new = eng.collected[self._seen:]
        self._seen = len(eng.collected)
        self.unfinished -= len(new)
        if new:
            self.learn(eng, new)

    def decide(self, eng: Engine) -> None:
        self._report_finishes(eng)
        if self._own is not None:
            self._own.assign()
        super().decide(eng)


class Dispatcher:
    """Feeds the replicas' queues from the shared :class:`GroupQueue`: the head request goes to the
    least loaded replica that takes it (:meth:`PullReplica.load`, :meth:`PullReplica.fits`), until
    none does. Called before every decision of any replica (``simulate.run_rollout`` runs the
    replicas on one clock in modelled seconds)."""

    def __init__(self, queue: GroupQueue, replicas: Sequence[PullReplica]):
        self.queue, self.replicas = queue, list(replicas)

    def assign(self) -> list[int]:
        """Dispatch what fits now; returns the replicas that got requests."""
        queue, got = self.queue, []
        while True:
            head = queue.head_group()
            if head is None:
                return got
            job = queue.peek(head)
            best, best_load = None, 0.0
            for pol in self.replicas:
                if pol.fits(job) and (best is None or pol.load() < best_load):
                    best, best_load = pol, pol.load()
            if best is None:
                return got
            best.take(queue.take(head))
            got.append(best.replica)


class SeerLike(PullReplica):
    """Seer's context-aware scheduling over a global queue (see the module docstring): probes first,
    then the group with the longest finished completion first; each request to the replica with
    the fewest requests, up to the rollout's ``max_num_seqs`` each (vLLM's default, 256, when the
    rollout sets none); vLLM's victim (the newest)."""

    name = "seer"
    PROBES = True
    MAX_SEQS = 256  # vLLM's max_num_seqs: requests an engine takes at once

    def load(self) -> float:
        return float(self.unfinished)

    def fits(self, job: int) -> bool:
        return self.unfinished < (self.problem.slots or self.MAX_SEQS)

    def learn(self, eng: Engine, finished: list[int]) -> None:
        queue = self.queue
        for job in finished:
            group = int(queue.group[job])
            queue.longest_finished[group] = max(queue.longest_finished[group], eng.length[job])
            queue.update(group, queue.longest_finished[group])


class SeerDivided(SeerLike):
    """Seer with its divided rollout (``seer_divided``; arXiv 2511.14617, "divided rollout"): every request
    generates in chunks of ``CHUNK`` tokens; at the end of a chunk it leaves its replica and goes back
    to the global queue as its group's next request (the group's estimate orders it, as Seer's
    context-aware scheduling does), to run its next chunk wherever the dispatcher sends it. Its KV
    travels through a global KV pool (Seer's Mooncake): the replica that takes it loads it
    (``Engine.transferred``) instead of recomputing it, at the price of the cost model's host link
    (:meth:`lengthsched.cost.StepCost.load_seconds`: latency + bytes over PCIe as measured on an H100,
    the request waiting for its load while the others decode, ``Engine.load_steps``; with ``LOADS =
    "stall"`` charged to the whole step that admits it, a pessimistic price; the offload at the origin is
    taken to overlap its decoding). A cost with a free host link bounds what the migration could buy.
    Otherwise :class:`SeerLike`."""

    name = "seer_divided"
    # How a load from the global pool is timed: "async" (the request waits for it while the others decode,
    # as Seer's Mooncake transfers and vLLM's offloaded loads overlap the decoding) or "stall" (charged to
    # the whole step that admits the request, a pessimistic price; the default until 2026-11-27;
    # docs/benchmarks.md, "Seer's divided rollout").
    LOADS = "async"
    # Tokens a request generates before it goes back to the global queue: the best of 128, 512 and 2048
    # on the rollout grid with asynchronous loads, as with stalls (docs/benchmarks.md, "Seer's divided
    # rollout"); 128 is the best with free loads, and smaller chunks move more often.
    CHUNK = 512

    def __init__(self, problem: Problem, queue: GroupQueue | None = None, replica: int = 0,
                 keys: Sequence[Any] = ()):
        super().__init__(problem, queue, replica, keys)
        self.dispatcher: Dispatcher | None = None  # set by the caller: the rollout's dispatcher
        self.woke: list[int] = []  # replicas that got requests during this decision (the caller wakes them)

    def decide(self, eng: Engine) -> None:
        if self.dispatcher is None:  # on its own (run_group / run_batch): Seer's queue, nothing moves
            super().decide(eng)
            return
        self._report_finishes(eng)  # learn from finishes before anything is given back
        ended = chunk_ended(eng, self.CHUNK)
        for job in ended:  # its chunk is done: back to the global queue, its KV to the pool
            lift(eng, job)
            self.unfinished -= 1
            self.queue.origin[job] = eng
            self.queue.give_back(job)
        if ended:
            self.woke = self.dispatcher.assign()
        VLLMLike.decide(self, eng)

    def take(self, job: int) -> None:
        """``job`` is dispatched here; a request that ran elsewhere brings its tokens and its KV."""
        super().take(job)
        origin = self.queue.origin.pop(job, None)
        if origin is not None:
            self.eng.unclaim(job)  # take() claimed it; hand_over claims it again
            hand_over(job, origin, self.eng, kv=True)

    def wakeup(self, eng: Engine) -> int | None:
        """vLLM's wake-up, or the next step at which a running request ends a chunk."""
        wake = super().wakeup(eng)
        return wake if self.dispatcher is None else next_chunk_end(eng, self.CHUNK, wake)


class WorkStealing(VLLMLike):
    """The project's rollout policy (see the module docstring): each group spread over as many replicas
    as the pools hold its prompts (verl's spread where they hold every prompt; whole groups in steps
    that keep every pool full); vLLM's engine per replica; a replica with an empty queue and predicted
    room steals from the back of the fullest queue. ``board`` (every replica's queue, stacks whose
    front is the end) and ``engines`` are shared and set by the caller, which places the requests
    (``simulate.rollout``, by ``PLACE``)."""

    name = "steal"
    PROBES = False
    STEALS = True
    # Placement: each group spread over as many replicas as keep the prompts a replica receives within
    # PROMPT_SHARE of its pool (lengthsched.integrations.rollout.spread_ways / place_ways; all of them,
    # as verl spreads, where the pools hold every prompt). "route": the older either-or rule (verl's
    # spread, or whole groups when every prompt on every replica would take more than PROMPT_SHARE of a
    # pool; it was 0.25); "time": simulate.rollout.place_by_time.
    PROMPT_SHARE = 1.0
    PLACE = "ways"
    # Whole groups once the predicted tokens per replica reach CROWDED_POOLS pools (spread_ways): the
    # pools stay full, requests wait, and stealing balances what the predictions got wrong.
    CROWDED_POOLS = CROWDED_POOLS
    # With a compressed cache (run_rollout(compression=)): whether the crowding rule weighs each completion's
    # predicted tokens at most the cache's budget + interval, what it holds (True), or whole (False: the step's
    # decode work; in the simulator the capped rule spread groups that whole groups ran faster,
    # docs/benchmarks.md, "Placement and a client window with a compressed cache").
    CROWD_HELD = False
    ROOM = 1.0  # steal while the live requests' predicted peak KV is below ROOM x the pool
    # With a compressed cache, whether that peak counts each request at most the cache's budget + interval
    # (what it holds) or whole (an engine whose admission reserves whole lengths: steal_sglang).
    ROOM_CAPPED = True
    STEAL_SHARE = STEAL_SHARE  # take this share of the victim's waiting predicted work, from the back of its queue
    # Admission watermark (off: vLLM's eager admission): admit only while the running requests, grown to
    # their predicted lengths, and the new one stay under WATERMARK x the pool. Fewer preemptions and
    # recomputed tokens for a longer makespan (docs/benchmarks.md, "Recomputation against time").
    WATERMARK: float | None = None
    # Each replica's queue at the start: "placement" (group order, as verl submits a batch), "longest"
    # (longest predicted first), "longest_spread" (longest first where PLACE "ways" spreads groups over
    # several replicas, placement order where it places whole groups) or "longest_crowded" (the other way
    # round: longest first where it places whole groups, in crowded steps whose queues are long, placement
    # order where it spreads them); measured in docs/benchmarks.md, "What stealing gains, and from what"
    # and "steal's order on each replica".
    ORDER = "placement"
    ORDER_ONE_REPLICA = "placement"  # ORDER where the step has one replica (nothing to steal from)
    # Whether a replica may take requests that already generated tokens (preempted ones, which move with
    # their text and are recomputed where they land). False: only requests that never started, all a
    # framework can move by aborting and resubmitting requests without carrying partial generations
    # (running requests do not move either).
    STEAL_STARTED = True
    # Moves of running requests (None: off): at the end of every MIGRATE_CHUNK tokens a running request
    # may move to a replica that sits idle (nothing running, nothing waiting, nothing to steal), with the
    # tokens it generated; its KV is recomputed where it lands (what a framework does by aborting the
    # request and resubmitting its prompt and partial generation), or with MIGRATE_KV loaded there
    # through a global KV pool, as Seer's divided rollout does (Engine.transferred, priced by the cost's
    # host link: StepCost.load_seconds; docs/benchmarks.md, "Seer's divided rollout").
    MIGRATE_CHUNK: int | None = MOVE_CHUNK
    MIGRATE_KV = False
    LOADS = "stall"  # how a MIGRATE_KV load is timed, as SeerDivided.LOADS
    # Seconds from a steal or a move until its target can run the request: the framework's abort and
    # resubmission (verl 0.9.1's fully-async client waits 1 s before it resubmits an aborted request;
    # docs/benchmarks.md, "Resubmission delay"). 0: at once. Meanwhile the request is in transit: on no
    # replica's queue (nobody takes it again), and its target steals nothing more.
    RESUBMIT_SECONDS = 0.0

    def __init__(self, problem: Problem, queue: GroupQueue | None = None, replica: int = 0,
                 keys: Sequence[Any] = ()):
        super().__init__(problem)  # on its own (run_group / run_batch): vLLM FCFS over every request
        self.queue, self.replica, self.keys = queue, replica, list(keys)
        self.board: list[list[int]] = []  # set by the caller in a rollout: every replica's waiting stack
        self.engines: list[Engine] = []  # set by the caller
        self.pols: list[WorkStealing] = []  # set by the caller
        self.blocked = False  # its queue waits for memory (not for the prefill budget): others may steal
        self.work = np.asarray(problem.point(), dtype=np.float64)  # predicted tokens per request
        self.idle_now: set[int] = set()  # set by the caller before each decision: the replicas asleep
        self.woke: list[int] = []  # replicas this decision moved running requests to (the caller wakes them)
        # Every request a decision sent elsewhere, as (request, target replica), where the caller keeps a
        # router's count of requests in flight per replica (the asynchronous loops); None: not recorded.
        self.sent: list[tuple[int, int]] | None = None
        self.now = 0.0  # set by the caller before each decision: the step's clock (modelled seconds)
        # With RESUBMIT_SECONDS: per replica, the requests in transit to it as (seconds ready, job) (shared,
        # set by the caller), and the (replica, seconds) at which this decision's targets can run them
        # (the caller wakes each then).
        self.inbox: list[list[tuple[float, int]]] = []
        self.wake_at: list[tuple[int, float]] = []
        # Requests the stealing does not see (shared, set by the caller): never stolen nor moved (a multi-turn
        # rollout's later turns under a driver that follows first turns only, simulate.run_multiturn).
        self.pinned: set[int] = set()

    # The engine each replica runs (its admissions, preemptions and wake-ups): vLLM's; StealSGLang: SGLang's.
    _engine_start = VLLMLike.start
    _engine_decide = VLLMLike.decide
    _engine_wakeup = VLLMLike.wakeup

    def start(self, eng: Engine) -> None:
        """On its own, the engine's check that every request fits; in a rollout the caller checked it."""
        if not self.board:
            self._engine_start(eng)

    def decide(self, eng: Engine) -> None:
        if self.inbox:
            self._receive()
        if self.board and self.problem.online:
            self._learn(eng)
        self._engine_decide(eng)
        while self.board and not self.waiting and not self.in_transit() and self._room(eng):
            if not eng.running:  # dry until what it steals arrives
                ran_dry(self, eng)
            if not self._steal(eng):
                break
            self._engine_decide(eng)
        self.blocked = bool(self.waiting) and not eng.prefill_limited
        if self.MIGRATE_CHUNK and self.STEAL_STARTED and self.board and self.idle_now:
            self._migrate(eng)

    def _migrate(self, eng: Engine) -> None:
        """Running requests at the end of a chunk move to the idle replicas, one each, the most predicted
        tokens to go first, while at least one stays here (the decision of
        :func:`lengthsched.integrations.rollout.move_requests`); their KV is recomputed where they land
        or (MIGRATE_KV) loaded there through a global pool."""
        ended = chunk_ended(eng, self.MIGRATE_CHUNK)
        if self.pinned:
            ended = [j for j in ended if j not in self.pinned]
        for job, r in move_requests(ended, self.idle_now, self.work, {j: eng.age(j) for j in ended},
                                    len(eng.running)):
            lift(eng, job)
            self._send(job, eng, r, kv=self.MIGRATE_KV)

    def _send(self, job: int, src: Engine, target: int, *, kv: bool = False) -> None:
        """``job``, off engine ``src`` and its queue, joins the back of replica ``target``'s queue with the
        tokens it generated (``kv``: and its KV); another replica is woken to run it. With
        ``RESUBMIT_SECONDS`` it travels that long first (``inbox``) and ``target`` is woken then."""
        hand_over(job, src, self.engines[target], kv=kv)
        if self.sent is not None:
            self.sent.append((job, target))
        if self.RESUBMIT_SECONDS > 0 and self.inbox:
            ready = self.now + self.RESUBMIT_SECONDS
            self.inbox[target].append((ready, job))
            self.wake_at.append((target, ready))
            return
        self.board[target].insert(0, job)  # a stack: the back of the queue is its start
        if target != self.replica:
            self.woke.append(target)

    def in_transit(self) -> bool:
        """Whether requests sent to this replica have not arrived yet (``RESUBMIT_SECONDS``)."""
        return bool(self.inbox and self.inbox[self.replica])

    def _receive(self) -> None:
        """The requests in transit to this replica whose resubmission landed join the back of its queue,
        in the order they were sent (the order they land: every one travels RESUBMIT_SECONDS)."""
        box = self.inbox[self.replica]
        while box and box[0][0] <= self.now:
            self.waiting.insert(0, box.pop(0)[1])

    def wakeup(self, eng: Engine) -> int | None:
        """The engine's wake-up, or (MIGRATE_CHUNK) the next step at which a running request ends a chunk."""
        wake = self._engine_wakeup(eng)
        moves = self.MIGRATE_CHUNK and self.STEAL_STARTED and self.board
        return next_chunk_end(eng, self.MIGRATE_CHUNK, wake) if moves else wake

    def _learn(self, eng: Engine) -> None:
        """Tell the shared online predictor what finished here; predict again the waiting requests (on
        every replica) of the prompts that changed. ``work`` is shared by the replicas."""
        changed = self.observe_events(eng)
        if not changed:
            return
        jobs, progress = [], []
        for r, stack in enumerate(self.board):
            done = self.engines[r].done
            for job in self.of_prompts(stack, changed):
                jobs.append(job)
                progress.append(done[job])
        if jobs:
            point, _ = self.predict_again(eng, jobs, progress)
            self.work[jobs] = point

    def _predicted_peak(self, eng: Engine) -> float:
        """KV tokens the running requests hold once grown to their predicted lengths (at least their
        age; at most a compressed cache's ``Problem.kv_cap``), prompts included."""
        work, held = self.work, self._held
        return sum(held(max(work[j], eng.age(j) + 1)) + eng.tail[j] for j in eng.running) + eng.prompt_kv_held

    def _held(self, tokens: float) -> float:
        """What a request of ``tokens`` holds in the room's count: at most a compressed cache's
        ``Problem.kv_cap`` (``ROOM_CAPPED``), or all of them."""
        return self.problem.held(tokens) if self.ROOM_CAPPED else tokens

    def _room(self, eng: Engine) -> bool:
        """Whether the live requests, grown to their predicted lengths, leave room in the pool."""
        if eng.live >= self.cap:
            return False
        return self._predicted_peak(eng) < self.ROOM * self.blocks * self.block_size

    def _admission_room(self, eng: Engine) -> float | None:
        if self.WATERMARK is None:
            return None
        return self.WATERMARK * self.blocks * self.block_size - self._predicted_peak(eng)

    def _admission_need(self, eng: Engine, job: int) -> float:
        """What admitting ``job`` adds to the watermark's count, as :meth:`_predicted_peak` counts it."""
        return float(self._held(max(float(self.work[job]), eng.done[job] + 1))) + eng.tail[job]

    def _steal(self, eng: Engine) -> bool:
        """Move requests from the back of the fullest blocked queue to this one (the decision of
        :func:`lengthsched.integrations.rollout.steal_requests`); False if none."""
        board, blocked = self.board, [pol.blocked for pol in self.pols]
        generated = {job: self.engines[r].done[job] for r, stack in enumerate(board) if blocked[r] for job in stack}
        pinned = self.pinned
        queues = [[j for j in stack[::-1] if j not in pinned] if pinned else stack[::-1] for stack in board]
        victim, taken = steal_requests(queues, self.replica, blocked, self.work, generated,
                                       share=self.STEAL_SHARE, started=self.STEAL_STARTED)
        if victim is None:
            return False
        stack = board[victim]
        gone = set(taken)
        stack[:] = [job for job in stack if job not in gone]
        for job in taken:  # the stolen requests keep their order (its queue is empty: a stack, front last)
            self._send(job, self.engines[victim], self.replica)
        return True


class StealSGLang(WorkStealing):
    """``steal`` over SGLang engines (``steal_sglang``): the same placement, steals and moves of running
    requests, with SGLang's scheduler on every replica (:class:`~lengthsched.runtime.baselines.SGLangLike`:
    a new request admitted only with room for its prompt and its whole remaining ``max_new_tokens``
    beyond the running requests' ``new_token_ratio`` reservations; the least advanced retracted first).
    What the project's placement and stealing give a framework that keeps SGLang's engines (slime), to
    compare with SGLang behind its own router; on one replica it is SGLang's FCFS. With a compressed cache
    its engines hold and read the capped KV, but SGLang's admission reserves whole remaining lengths, so its
    room to steal counts the predicted peak uncompressed (``ROOM_CAPPED``; 0.912 of SGLang + verl with a
    256 + 32 cache against 0.913 capped over 16 settings, worst 1.018 against 1.032: docs/benchmarks.md,
    "steal_sglang's room to steal with a compressed cache")."""

    name = "steal_sglang"
    ROOM_CAPPED = False
    block_size = SGLangLike.block_size
    init_ratio, min_ratio, decay_steps = SGLangLike.init_ratio, SGLangLike.min_ratio, SGLangLike.decay_steps
    retract_steps, clip_tokens = SGLangLike.retract_steps, SGLangLike.clip_tokens

    def __init__(self, problem: Problem, queue: GroupQueue | None = None, replica: int = 0,
                 keys: Sequence[Any] = ()):
        super().__init__(problem, queue, replica, keys)
        self._init_ratio()

    _engine_start = SGLangLike.start
    _engine_decide = SGLangLike.decide
    _engine_wakeup = SGLangLike.wakeup
    # SGLang's own parts of its decisions
    _init_ratio, ratio, admission_delay = SGLangLike._init_ratio, SGLangLike.ratio, SGLangLike.admission_delay
    _max_new, _left, _linear = SGLangLike._max_new, SGLangLike._left, SGLangLike._linear
    _remaining = SGLangLike._remaining
    _tokens_needed, _cached_free = staticmethod(SGLangLike._tokens_needed), staticmethod(SGLangLike._cached_free)
    _retraction_key, _requeue = SGLangLike._retraction_key, SGLangLike._requeue
    idle_reset = SGLangLike.idle_reset  # a replica that ran dry starts its ratio again, before it steals


class StealClasses(WorkStealing):
    """``steal`` over the placement of ``placed_classes`` (``steal_classes``): the completions placed in
    length classes by predicted length (:func:`lengthsched.runtime.replicas.plan_classes`, judged by
    simulating vLLM's priority scheduling on each replica, against verl's spread), each replica's queue
    in placement order (the batch's; longest predicted first on one replica), then ``steal``'s engine:
    vLLM FCFS, drained replicas stealing waiting requests and taking running ones. The classes gather
    the longest predicted completions on few replicas; stealing repairs what the predictions got
    wrong. For predictions that know each completion's length to ~10% (one earlier epoch of the same
    prompts where siblings agree: :func:`lengthsched.placement.recommend_rollout_policy`);
    docs/benchmarks.md, "Rollout steps"."""

    name = "steal_classes"
    PLACE = "classes"
    ENGINE = "vllm_priority"  # what the placement's planner simulates on each replica, as placed_classes
    # On one replica nothing is placed and nothing stolen: its queue longest predicted first, as
    # placed_classes runs it (vLLM priority scheduling: 1.6-3.5% faster than FCFS on the one-replica
    # CASTILLO settings of seeds 11 and 12 with one epoch of history, worst 1.003: the rows vllm_priority
    # (previous epoch) of docs/benchmarks.md's rollout tables). On several replicas placement order, as
    # steal: longest first there was faster on average but far less safe (a trial outside the suite).
    ORDER_ONE_REPLICA = "longest"


class StealLongest(WorkStealing):
    """``steal`` with each replica's queue longest predicted first (``steal_longest``): the same
    placement, engine, steals and moves; only the order in which each replica starts its requests
    differs (on one replica, as ``steal``: vLLM FCFS). The trade, measured over four draws of the
    benchmark grid and of the steps at scale, the long tail with prompts and held-out chat prompts
    (docs/benchmarks.md, "steal's order on each replica"): faster on average everywhere (0.967 of vLLM +
    verl over the grid against ``steal``'s 0.973; 0.903 against 0.917 at scale), but with worse worst
    cases (slower than vLLM + verl by more than 1% in 8 of the grid's 360 settings against none; worst
    1.060 against 1.009, and up to 1.229 on the held-out prompts): a longest-first queue starts last the
    groups a prompt-level predictor underrated, and where nothing is left to steal by then they set the
    tail. ``steal`` (the default) keeps the placement order for the "never slower" target; take this one
    where the mean matters more (verl: ``+lengthsched.order=longest``), after
    ``lengthsched simulate --draws N`` on your own steps shows both."""

    name = "steal_longest"
    ORDER = "longest"


class StealObserved(WorkStealing):
    """``steal`` as a framework can run it (``steal_observed``): the same placement, but every steal and
    every move of a running request is decided by a :class:`~lengthsched.integrations.StealCoordinator`
    that sees only what a framework sees, each replica's snapshot (the tokens each request in flight
    has generated) taken at that replica's decisions: a request that did not grow between two
    snapshots waits. A replica decides for itself and for the replicas that sit idle (the others may be
    ahead of it in time); a steal of a request that started meanwhile is cancelled, as an abort that
    found it running would leave it there. ``coord`` is shared and set by the caller."""

    name = "steal_observed"
    # Steps between a replica's snapshots (None: one at each of its decisions). A framework polls its
    # servers every so often: at a few to 20 ms a step, 32 steps are about 0.2-0.6 s.
    SNAPSHOT_STEPS: int | None = None
    # Or modelled seconds between them (a framework's poll interval, e.g. verl_stealing's poll_interval);
    # None: as SNAPSHOT_STEPS says. A replica looks at its decisions once the interval has passed.
    SNAPSHOT_SECONDS: float | None = None

    def __init__(self, problem: Problem, queue: GroupQueue | None = None, replica: int = 0,
                 keys: Sequence[Any] = ()):
        super().__init__(problem, queue, replica, keys)
        self.coord: StealCoordinator | None = None  # set by the caller in a rollout
        # Requests the coordinator learns of from the first snapshot that shows them (shared, set by the caller):
        # request -> keyword arguments of its StealCoordinator.submit (a multi-turn session's later turns, which
        # a framework's driver sees only once they are on an engine; simulate.run_multiturn).
        self.unannounced: dict[int, dict] = {}
        self._collected = 0  # finishes already reported
        self._snapshot_at: int | None = None  # the step of this replica's last snapshot
        self._snapshot_seconds = 0.0  # and its modelled seconds

    def decide(self, eng: Engine) -> None:
        if self.inbox:
            self._receive()
        VLLMLike.decide(self, eng)
        if self.coord is None:  # on its own (run_group / run_batch): vLLM FCFS
            return
        every, seconds = self.SNAPSHOT_STEPS, self.SNAPSHOT_SECONDS
        recent = self._snapshot_at is not None and eng.running and (
            (every and eng.t - self._snapshot_at < every) or (seconds and self.now - self._snapshot_seconds < seconds))
        if not recent:
            self._look(eng)
        self.blocked = bool(self.waiting) and not eng.prefill_limited

    def _look(self, eng: Engine) -> None:
        """A snapshot of this replica for the coordinator, then its moves for this replica and the idle."""
        self._snapshot_at, self._snapshot_seconds = eng.t, self.now
        for job in eng.collected[self._collected:]:
            self.coord.finish(job)
            self.unannounced.pop(job, None)  # finished between two snapshots: never shown to the coordinator
        self._collected = len(eng.collected)
        snapshot = {job: eng.age(job) for job in eng.running}
        done = eng.done.__getitem__
        snapshot.update(zip(self.waiting, map(done, self.waiting)))
        snapshot.update(zip(eng.loading, map(done, eng.loading)))  # in flight, waiting for their KV
        if self.unannounced:
            for job in [j for j in snapshot if j in self.unannounced]:
                self.coord.submit(job, self.replica, generated=snapshot[job], **self.unannounced.pop(job))
        self.coord.observe(self.replica, snapshot)
        changed = False
        for move in self.coord.decide(thieves={self.replica, *self.idle_now}, sources={self.replica}):
            changed |= self._apply(eng, move)
        if changed:  # admit what it stole, or what waits here for the memory a moved request freed
            VLLMLike.decide(self, eng)

    def _apply(self, eng: Engine, move) -> bool:
        """Carry out one of the coordinator's moves; True when this replica received a request or a
        request running here left (the coordinator takes a request that grew since the previous snapshot
        for a running one, so it may move every running request off a replica whose preempted ones
        wait: they start at once, as the engine's next step would start them)."""
        job, source, target = move.request, move.source, move.target
        stack = self.board[source]
        lifted = False
        if job in stack:  # waiting there: it moves with the tokens it generated
            stack.remove(job)
        elif source == self.replica and job in eng.running and move.kind == "move":
            lift(eng, job)
            lifted = True
        else:  # it started (or finished) on a replica ahead in time: the abort would find it running
            self.coord.cancel(move)
            return False
        self._send(job, self.engines[source], target)
        return lifted or target == self.replica
