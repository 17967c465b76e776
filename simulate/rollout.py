"""``run_rollout``: an RL rollout step, B prompts x G completions on R engine replicas, in seconds.

A rollout step ends when the last completion on the last replica finishes (the makespan). Each
replica is an engine with its own KV pool of ``budget_tokens`` tokens, prompts included: a prompt's
KV is prefilled and held (once, shared by its siblings there) on every replica that runs one of its
completions, so spreading a group over replicas costs prefill and memory. Requests are placed on
replicas by a router, or by the policy itself when it plans the placement:

- ``least_loaded``, verl's rollout server manager: each request (one sample of a group) goes to the
  replica with the fewest requests (verl/experimental/agent_loop/agent_loop.py,
  ``AsyncLLMServerManager._choose_server``, verl 0.5-0.9: a heap of (requests, replica), ties to the
  lower index; at b178a3c it counts the requests sent and never subtracts a finished one). All requests of a
  step are submitted at once, before any finishes, so request k of the step goes to replica k mod R:
  a group's G samples are spread over the replicas.
- ``group_round_robin``, OpenRLHF's: a whole group (its G samples) to one engine, round robin
  (openrlhf/trainer/ppo_utils/samples_generator.py, ``SamplesGenerator._dispatch_prompts_to_vllm``,
  OpenRLHF 0.11.0: each prompt goes with ``num_samples=n_samples_per_prompt`` to the engine at the top
  of a heap of (unfinished requests, engine), its load then raised by the G samples; with every engine
  idle at the start of a step, as in a synchronous step, prompt k goes to engine k mod R).
- ``cache_aware``, SGLang's router (sglang-router 0.3.2, ``src/policies/cache_aware.rs``,
  ``CacheAwarePolicy::select_worker``) as slime launches it in front of its SGLang engines (slime at
  624b824, 2026-08: ``slime/ray/rollout.py``, ``_start_router``; ``--router-balance-abs-threshold 10``,
  ``--router-balance-rel-threshold 1.2``, the router's ``cache_threshold`` 0.3): every sample is its
  own request (``slime/rollout/sglang_rollout.py``), routed in the order the groups are submitted;
  see :func:`cache_aware_placement`.
- ``contiguous_chunks``, the data-parallel server of TRL's own ``trl vllm-serve --data-parallel-size
  R`` (``trl/scripts/vllm_serve.py``, ``chunk_list``, TRL 1.9): the step's prompts, each with ``n = G``,
  cut into R contiguous chunks in prompt order (the first ``B mod R`` chunks one prompt longer), chunk
  r on data-parallel worker r: whole groups, in order, no balancing. (TRL 1.16's ``trl vllm-serve``
  runs vLLM's own server instead, whose data-parallel balancer fans a prompt's ``n`` samples out into
  requests routed one by one to the engine with the lowest ``4 x waiting + running``: in a burst, the
  spread of ``least_loaded``.)
- a policy with ``places_groups`` (``placed_lpt``) balances the groups' predicted work over the
  replicas with the partitioning core (the better of LPT and Karmarkar-Karp, on predicted tokens),
  and ignores ``router``; ``placed_adaptive`` spreads requests as verl does unless holding every
  prompt on every replica would take more than a quarter of a replica's pool, then places whole
  groups as ``placed_lpt`` does (both over vLLM's FCFS engine for ``placed_adaptive``).

- a policy with ``dispatch`` (``seer``, ``dispatch_lpt``: :mod:`lengthsched.runtime.dispatch`)
  places nothing up front: the requests not yet started wait in one global queue and a replica
  pulls the next one whenever its pool has room, so work moves to the replicas that drain first.
  The replicas then run on one clock in modelled seconds (each step priced by the step-cost model
  as it happens), so a replica pulls exactly when it would in time.

Every replica's pool holds prompts as an engine does (``Engine.hold_prompts``): a prompt's KV is
prefilled at the first admission of one of its completions there and held until the last one
placed there finishes; prompts no running request references are evicted before a running request
is preempted (vLLM and SGLang evict unreferenced cached blocks first) and prefilled again if needed.
Routed placements run each replica on its own (nothing couples them); a started request stays on
its replica (Seer's migration of running requests through a global KV pool is not modelled).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lengthsched import InvalidArgument, partition
from lengthsched.errors import as_lengths, check_int, check_nonnegative_float, check_positive_float
from lengthsched.filtering import need_refill
from lengthsched.integrations.rollout import ClientQueues, place_ways, spread_ways
from lengthsched.integrations.stealing import StealCoordinator
from lengthsched.memory import held_token_steps
from lengthsched.placement import (
    fractional_fits,
    length_classes,
    packing_items,
    packing_mix,
)
from lengthsched.predictor import copy_predictor
from lengthsched.runtime import POLICIES, Problem, StepLog, Timeline
from lengthsched.runtime.baselines import ran_dry
from lengthsched.runtime.dispatch import Dispatcher, GroupQueue, WorkStealing
from lengthsched.runtime.replicas import OFFLOAD_MODES, plan_classes, prompt_blocks, resumed_predictions
from lengthsched.runtime.replicas import replica_engine as _engine
from lengthsched.runtime.replicas import run_replica as _run_replica
from lengthsched.runtime.timing import DEFAULT_PREFILL_CHUNK, lower_bound_seconds

from .run import _cost, _predictions, compression_cap
from .workloads import Group

__all__ = ["REFILL_RULES", "ROUTERS", "VERL_POLL_SECONDS", "LiveRouter", "Refill", "RolloutResult",
           "cache_aware_placement", "place_by_length_class", "run_rollout", "run_slime_planned",
           "run_slime_planned_in_order", "route"]

ROUTERS = ("least_loaded", "group_round_robin", "cache_aware", "contiguous_chunks")
# slime's settings of SGLang's router (slime/backends/sglang_utils/arguments.py, add_sglang_arguments: set_defaults
# router_balance_abs_threshold=10, router_balance_rel_threshold=1.2; the router's own defaults: 64 and 1.5)
SLIME_BALANCE_ABS, SLIME_BALANCE_REL = 10, 1.2


#: What :class:`Refill` models: slime's dynamic sampling or verl's v1 trainer's.
REFILL_RULES = ("slime", "verl")
#: verl 0.9.1's replay buffer polls every this many seconds (``ReplayBuffer.poll_interval``): it refills, and sees the
#: step's last group finish, at its polls (:class:`Refill`'s ``poll`` where verl is modelled).
VERL_POLL_SECONDS = 2.0


def next_poll(seconds: float, poll: float) -> float:
    """The first poll at or after ``seconds`` of a framework that polls every ``poll`` seconds from 0 (a time within
    a nanosecond past a poll counts as that poll)."""
    return math.ceil(seconds / poll - 1e-9) * poll


@dataclass(frozen=True)
class Refill:
    """slime's dynamic sampling inside one step (``run_rollout(..., refill=)``; slime at 624b824,
    ``generate_rollout_async``): the step's candidate groups, ``units`` in submission order, are submitted
    ``chunk`` at a time (``--over-sampling-batch-size``, taken from the data source at once); the first
    chunk at the start, and another whenever the units submitted less those the dynamic-sampling filter
    dropped fall below ``batch`` (``--rollout-batch-size``: ``state.remaining_batch_size``), until
    ``batch`` units that pass have finished (the step's end; slime then aborts the rest) or no candidate is
    left. A unit finishes when its last request finishes; ``passes[u]``: whether unit u passes the filter
    (DAPO's, which drops a group whose rewards all agree), decided when it finishes. ``owners``: per group
    given to ``run_rollout``, its unit (several groups may make one unit: the parts of a resumed group);
    None: group i is unit i. A unit with no group finishes when it is submitted. A chunk is units
    ``k x chunk`` to ``(k + 1) x chunk - 1``; its groups are submitted in the order given (a planner may
    order the groups within each chunk). Needs ``in_flight`` (slime's semaphore). ``plan`` (with a given
    placement): a client that plans each chunk when it submits it, called as ``plan(units, loads)`` with the
    chunk's units (a range) and each replica's outstanding predicted tokens in the client's queues and in
    flight (``ClientQueues.outstanding``; None without a client window); it returns the chunk's requests
    (indices into the flattened step) in the order to send them and each one's replica, which replace the
    given placement's (what :mod:`lengthsched.integrations.slime` does with each batch slime takes); a replica
    -1 leaves the request to ``run_rollout``'s ``router`` as it is sent (``"least_loaded"`` or
    ``"cache_aware"``; not with a client window). With ``rule="verl"`` the units released at one moment (the
    step's batch, a poll's refills) are planned in one call, as verl hands them to its manager in one batch.

    ``rule="verl"``: verl 0.9.1's v1 sync trainer instead (``trainer/ppo/v1/replay_buffer.py``,
    ``ReplayBuffer.sample`` with ``algorithm.filter_groups``): ``batch`` units at the start, then two more for every
    unit the filter drops while fewer than ``batch`` have passed, one at a time, at most ``cap`` units submitted and
    not finished (``max_inflight_gen_batches`` x ``train_batch_size``; None: no bound); once ``batch`` have passed
    nothing more is submitted and everything submitted runs to its end (verl drains, then discards the surplus).
    ``chunk`` is not used. ``by_need`` (with ``rule="verl"``): lengthsched's refill inside verl's allowance
    (:mod:`lengthsched.integrations.verl_selective`): a unit is submitted only while the groups in flight are
    expected to pass fewer than the batch still needs, or when none is in flight; the pass share is
    ``(kept + 1) / (finished + 2)`` over the units finished in earlier steps (``by_need``: their kept and finished
    counts) and in this one (:func:`lengthsched.filtering.need_refill`). ``poll`` (with ``rule="verl"``): verl's
    replay buffer sees finished groups and refills only at its polls, every ``poll`` seconds from the step's start
    (``ReplayBuffer.poll_interval``, 2 s); None: at once."""

    batch: int
    chunk: int
    passes: tuple[bool, ...]
    owners: tuple[int, ...] | None = None
    plan: Any = field(default=None, compare=False, repr=False)
    rule: str = "slime"
    cap: int | None = None
    by_need: tuple[int, int] | None = None
    poll: float | None = None

    def __post_init__(self):
        check_int("batch", self.batch, minimum=1)
        check_int("chunk", self.chunk, minimum=1)
        if self.rule not in REFILL_RULES:
            raise InvalidArgument("rule", self.rule, " or ".join(map(repr, REFILL_RULES)))
        if self.cap is not None:
            check_int("cap", self.cap, minimum=self.batch)
        if self.poll is not None:
            if self.rule != "verl":
                raise InvalidArgument("poll", self.poll, "None with rule 'slime' (slime submits as groups finish)")
            check_positive_float("poll", self.poll)
        if self.by_need is not None:
            if self.rule != "verl" or len(self.by_need) != 2:
                raise InvalidArgument("by_need", self.by_need, "None, or with rule 'verl' the (kept, finished) "
                                                               "counts of earlier steps")
            kept, done = (check_int("by_need", x, minimum=0) for x in self.by_need)
            if kept > done:
                raise InvalidArgument("by_need", self.by_need, "kept at most finished")
        object.__setattr__(self, "passes", tuple(bool(x) for x in self.passes))
        if self.owners is not None:
            owners = tuple(int(u) for u in self.owners)
            if any(u < 0 or u >= len(self.passes) for u in owners):
                raise InvalidArgument("owners", list(owners[:5]), f"unit indices from 0 to {len(self.passes) - 1}")
            object.__setattr__(self, "owners", owners)


@dataclass(frozen=True)
class RolloutResult:
    """One rollout step. ``seconds``: the makespan (the last replica's finish, modelled);
    ``replica_seconds``: each replica's; ``steps``: decode steps of the slowest replica;
    ``preemptions``, ``recomputed_tokens``, ``prefill_tokens``: summed over replicas;
    ``lower_bound_seconds``: no placement and schedule can finish sooner; ``collected_lengths``:
    per group, in index order (tokens); ``placement``: the replica of every completion, flattened
    in group order; ``prompt_loads``: prompt prefills (a prompt on each replica that runs one of its
    completions, again after an eviction); ``peak_kv_tokens``: each replica's peak KV, prompts
    included; ``loaded_tokens``: KV tokens loaded from a global KV pool instead of recomputed (requests
    that moved with their KV: ``seer_divided``, ``steal`` with ``MIGRATE_KV``), priced by the cost's
    host link; ``timelines`` (with ``record=True``) and ``clocks`` (each replica's (step, seconds)
    at every event) serve figures. ``released_seconds`` (a run with a :class:`Refill`): per unit, the
    modelled seconds at which it was submitted, ``inf`` for a unit never submitted (its groups never ran:
    their ``collected_lengths`` are still listed, their placement is -1); None otherwise."""

    policy: str
    router: str
    replicas: int
    seconds: float
    replica_seconds: tuple[float, ...]
    steps: int
    preemptions: int
    recomputed_tokens: int
    prefill_tokens: int
    lower_bound_seconds: float
    tokens: int
    budget_tokens: int
    cost_name: str
    collected_lengths: tuple[np.ndarray, ...] = field(repr=False)
    placement: np.ndarray = field(repr=False)
    prompt_loads: int = 0
    peak_kv_tokens: tuple[int, ...] = ()
    loaded_tokens: int = 0
    timelines: tuple[Timeline | None, ...] = field(default=(), repr=False)
    clocks: tuple[tuple[np.ndarray, np.ndarray], ...] = field(default=(), repr=False)
    step_logs: tuple[StepLog, ...] = field(default=(), repr=False)
    released_seconds: np.ndarray | None = field(default=None, repr=False)

    def _step_ends(self, replica: int) -> tuple[np.ndarray, np.ndarray]:
        """``replica``'s clock as (decode step, modelled seconds at its end), one point per step: a replica
        idle after step s logs s again when it wakes, and s ended at the first of those."""
        ends, secs = self.clocks[replica]
        first = np.concatenate(([True], np.diff(ends) > 0))
        return ends[first], secs[first]

    def seconds_at(self, replica: int, steps: Any) -> np.ndarray:
        """Modelled seconds at the end of decode step(s) ``steps`` of ``replica`` (for figures: steps of
        its timeline), interpolated within runs of steps priced together; a step after which the replica
        sat idle ended when it ended, not when the replica woke (:meth:`seconds_started`)."""
        return np.interp(np.asarray(steps, dtype=np.float64), *self._step_ends(replica))

    def seconds_started(self, replica: int, steps: Any) -> np.ndarray:
        """Modelled seconds at which decode step(s) ``steps`` of ``replica`` began: the end of the step
        before, or the moment the replica woke when it sat idle in between."""
        ends, secs = self.clocks[replica]
        last = np.concatenate((np.diff(ends) > 0, [True]))
        return np.interp(np.asarray(steps, dtype=np.float64) - 1, ends[last], secs[last])

    def _recorded(self, reader: str) -> None:
        """Raise unless the run kept every replica's timeline (``record=True``), which ``reader`` reads."""
        if not self.timelines or any(t is None for t in self.timelines):
            raise InvalidArgument("record", False, f"a run with record=True ({reader} reads the timelines)")

    def group_finish_seconds(self) -> np.ndarray:
        """Per group (in ``collected_lengths``' order), the modelled seconds at which its last completion
        finished, wherever it ran (a completion that moved finishes on the replica it moved to). Needs
        the timelines (``run_rollout(..., record=True)``). Its largest value is the makespan; with
        over-sampling (more groups submitted than the step keeps, the rest aborted), the step ends at the
        N-th smallest."""
        self._recorded("group_finish_seconds")
        sizes = [len(c) for c in self.collected_lengths]
        finish = np.zeros(sum(sizes), dtype=np.float64)
        for replica, timeline in enumerate(self.timelines):
            if not timeline.segments:
                continue
            jobs = np.array([seg[0] for seg in timeline.segments], dtype=np.int64)
            ends = self.seconds_at(replica, np.array([seg[3] for seg in timeline.segments], dtype=np.float64))
            np.maximum.at(finish, jobs, ends)
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        out = np.array([finish[a:a + n].max() if n else 0.0 for a, n in zip(starts, sizes)], dtype=np.float64)
        if self.released_seconds is not None:  # a Refill's groups never submitted: never finished
            out[[bool(n) and bool((self.placement[a:a + n] < 0).all()) for a, n in zip(starts, sizes)]] = np.inf
        return out

    def generated_at(self, seconds: float) -> np.ndarray:
        """Per completion (flattened in ``collected_lengths``' order), the tokens it had generated by the
        modelled time ``seconds``: what an abort then leaves a framework (slime's ``--partial-rollout``
        keeps them for the next step). Counts every decode step that ended by then, on whichever replicas
        the completion ran (a preempted or moved one keeps its tokens); a finished completion counts its
        whole length. Needs the timelines (``run_rollout(..., record=True)``)."""
        self._recorded("generated_at")
        seconds = float(seconds)
        if not math.isfinite(seconds) or seconds < 0:
            raise InvalidArgument("seconds", seconds, "a finite number of modelled seconds >= 0")
        out = np.zeros(sum(len(c) for c in self.collected_lengths), dtype=np.int64)
        for replica, timeline in enumerate(self.timelines):
            segments = [s for s in timeline.segments if s[4] in ("run", "preempted")]
            if not segments:
                continue
            steps, secs = self._step_ends(replica)
            done = int(np.floor(np.interp(seconds, secs, steps) + 1e-9))  # steps ended by then: seconds_at inverted
            jobs = np.array([s[0] for s in segments], dtype=np.int64)
            starts = np.array([s[2] for s in segments], dtype=np.int64)
            lasts = np.array([s[3] for s in segments], dtype=np.int64)
            np.add.at(out, jobs, np.clip(np.minimum(lasts, done) - starts + 1, 0, None))
        return np.minimum(out, np.concatenate(self.collected_lengths).astype(np.int64))

    def in_order(self, order: Any) -> RolloutResult:
        """This run with its groups listed in the caller's order: ``order[k]`` is the caller's index of the
        run's k-th group (a run that submitted the groups in another order, :func:`run_slime_planned`'s).
        ``collected_lengths``, ``placement`` and the timelines' completions are renumbered; the seconds,
        counts and clocks are the run's."""
        sizes = [len(c) for c in self.collected_lengths]
        order = np.asarray(order, dtype=np.int64)
        if order.shape != (len(sizes),) or not np.array_equal(np.sort(order), np.arange(len(sizes))):
            raise InvalidArgument("order", f"{order.size} indices",
                                  f"a permutation of the run's {len(sizes)} groups (0 to {len(sizes) - 1})")
        mine = np.empty(len(sizes), dtype=np.int64)
        mine[order] = sizes
        starts = np.concatenate(([0], np.cumsum(mine)[:-1])).astype(np.int64)
        index = np.concatenate([starts[i] + np.arange(n) for i, n in zip(order, sizes)] + [np.zeros(0, np.int64)])
        collected: list[Any] = [None] * len(sizes)
        for k, i in enumerate(order):
            collected[i] = self.collected_lengths[k]
        placement = np.empty_like(self.placement)
        placement[index] = self.placement
        timelines = tuple(None if t is None else dataclasses.replace(
            t, segments=[(int(index[job]), *rest) for job, *rest in t.segments]) for t in self.timelines)
        return dataclasses.replace(self, collected_lengths=tuple(collected), placement=placement, timelines=timelines)

    def kept_finish(self, kept: int) -> tuple[float, float]:
        """An over-sampled step that ends at its ``kept``-th finished group (the rest aborted): (modelled
        seconds to that group, the kept groups' mean completion length over all submitted groups').
        Needs the timelines (``record=True``)."""
        kept = check_int("kept", kept, minimum=1)
        if kept > len(self.collected_lengths):
            raise InvalidArgument("kept", kept, f"at most the {len(self.collected_lengths)} groups submitted")
        finish = self.group_finish_seconds()
        first = np.argsort(finish, kind="stable")[:kept]
        means = np.array([float(np.mean(c)) for c in self.collected_lengths])
        return float(np.sort(finish)[kept - 1]), float(means[first].mean() / means.mean())

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of the step (all replicas together)."""
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def slowest_share(self) -> float:
        """The slowest replica's seconds over the mean replica's (1 = balanced)."""
        return self.seconds / float(np.mean(self.replica_seconds)) if self.seconds else 1.0

    @property
    def seconds_ratio(self) -> float:
        """seconds / lower bound in seconds (>= 1)."""
        return self.seconds / self.lower_bound_seconds if self.lower_bound_seconds else 0.0


def place_by_time(groups: Sequence[Group], replicas: int, predicted: np.ndarray | None, budget_tokens: int,
                  cost, max_new_tokens: int) -> np.ndarray:
    """The replica of every completion (flattened in group order), placed to balance the replicas'
    predicted seconds: the longest predicted first, each to the replica whose estimate grows least.
    A replica's estimate is ``W x max(longest, area / pool) + c x KV read``: ``W`` a decode step that
    reads only the weights, ``c`` the seconds per KV token read (both from ``cost``), ``longest`` its
    longest predicted completion (steps it runs at least), ``area`` the KV token-steps its completions
    hold (a prompt once per group there) and ``KV read`` what its rows read. The longest completions
    land on different replicas and the short ones fill the replicas whose tails are shortest.
    (``WorkStealing.PLACE = "time"``: measured against the default in docs/benchmarks.md.)"""
    sizes = np.array([len(g.lengths) for g in groups], dtype=np.int64)
    owner = np.repeat(np.arange(len(groups)), sizes)
    pred = np.full(len(owner), float(max_new_tokens)) if predicted is None else np.minimum(
        np.asarray(predicted, dtype=np.float64), max_new_tokens)
    prompts = np.array([float(g.prompt_len) for g in groups])
    units = [np.array([j]) for j in range(len(owner))]
    weights = float(cost.seconds(1, 0))
    per_token = (float(cost.seconds(1, 10**7)) - weights) / 10**7
    longest, area, read = np.zeros(replicas), np.zeros(replicas), np.zeros(replicas)
    here: list[set] = [set() for _ in range(replicas)]
    placement = np.zeros(len(owner), dtype=np.int64)
    order = sorted(range(len(units)), key=lambda u: (-float(pred[units[u]].max()), int(units[u][0])))
    for u in order:  # the longest predicted first, siblings together
        jobs = units[u]
        group = int(owner[jobs[0]])
        lengths = pred[jobs]
        own = float(np.sum(lengths * (lengths + 1) / 2))
        p = prompts[group]
        prompt_area = np.array([0.0 if group in h else p * float(lengths.max()) for h in here])
        new_long = np.maximum(longest, float(lengths.max()))
        new_area = area + own + prompt_area
        new_read = read + own + p * float(lengths.sum())
        estimate = weights * np.maximum(new_long, new_area / budget_tokens) + per_token * new_read
        r = int(np.argmin(estimate))
        placement[jobs] = r
        longest[r], area[r], read[r] = new_long[r], new_area[r], new_read[r]
        here[r].add(group)
    return placement


def cache_aware_placement(sizes: Sequence[int], replicas: int, *, balance_abs_threshold: int = SLIME_BALANCE_ABS,
                          balance_rel_threshold: float = SLIME_BALANCE_REL) -> np.ndarray:
    """The replica of every completion (flattened in group order) under SGLang's cache-aware router
    when a step's requests (``sizes[g]`` samples of prompt g, one request each, submitted group by
    group) are all routed before any finishes (slime's client sends the first 512 x engines at once,
    ``--sglang-server-concurrency``, and each later one as a request finishes: :class:`LiveRouter`,
    ``run_rollout(..., in_flight=)``).

    sglang-router 0.3.2 (``CacheAwarePolicy::select_worker``): with ``load`` the requests in flight
    per replica (raised when a request is routed), the loads are imbalanced when ``max - min >
    balance_abs_threshold`` and ``max > min x balance_rel_threshold``; then the request goes to the
    least-loaded replica. Otherwise the request's text (slime sends token ids, matched as their
    decimal string) is matched on the router's radix tree: above a match rate of 0.3 it goes to the
    replica that first inserted the matched leaf, else to the least-loaded replica; the text is
    inserted for the chosen replica either way. A sibling's text is its group's first request's, so it
    matches whole and goes where the group's first request went, while the loads are balanced.
    Different prompts are taken to share less than 30% of their text (a chat template's few tokens);
    ties of the least load go to the lowest index (the router's registry order, fixed but unspecified).
    Defaults: slime's thresholds (10 and 1.2; the router's own are 64 and 1.5)."""
    sizes = as_lengths("sizes", sizes, minimum=0, allow_empty=True)  # samples per group (not tokens here)
    replicas = check_int("replicas", replicas, minimum=1)
    balance_abs_threshold = check_int("balance_abs_threshold", balance_abs_threshold, minimum=0)
    balance_rel_threshold = check_positive_float("balance_rel_threshold", balance_rel_threshold)
    live = LiveRouter("cache_aware", replicas, balance_abs_threshold=balance_abs_threshold,
                      balance_rel_threshold=balance_rel_threshold)
    return np.array([live.select(g) for g, n in enumerate(sizes) for _ in range(int(n))], dtype=np.int64)


class LiveRouter:
    """A router that places one request at a time on the replicas' requests in flight (``load``: routed
    there and not finished), as the frameworks' routers do when requests are routed as others finish
    (``run_rollout(..., in_flight=)``). ``router``: ``"least_loaded"`` (verl's: the fewest in flight,
    ties to the lowest index) or ``"cache_aware"`` (SGLang's router as :func:`cache_aware_placement`
    describes it: a group's requests go where its first one went while the loads are balanced, else to
    the least loaded). Call :meth:`select` for each request and :meth:`finished` for each finish."""

    ROUTERS = ("least_loaded", "cache_aware")

    def __init__(self, router: str, replicas: int, *, balance_abs_threshold: int = SLIME_BALANCE_ABS,
                 balance_rel_threshold: float = SLIME_BALANCE_REL):
        if router not in self.ROUTERS:
            raise InvalidArgument("router", router, "one of " + ", ".join(self.ROUTERS) + " (routed one request "
                                  "at a time; the others place a whole step at once)")
        self.router = router
        self.load = [0] * check_int("replicas", replicas, minimum=1)
        self.abs, self.rel = balance_abs_threshold, balance_rel_threshold
        self.home: dict[int, int] = {}  # group -> the replica its first request went to (the radix tree's)

    def select(self, group: int) -> int:
        """The replica of the next request, of ``group``; counted in flight there."""
        r = self._pick(self.home.get(group, -1) if self.router == "cache_aware" else -1)
        self.home.setdefault(group, r)
        return r

    def select_prefix(self, home: int, rate: float, threshold: float) -> int:
        """The replica of a request whose longest prefix the router has seen went to ``home`` and is ``rate`` of
        its text (SGLang's router: there when the rate exceeds ``threshold``, its ``cache_threshold``, and the loads
        are balanced; else the least loaded); counted in flight there."""
        return self._pick(home if rate > threshold else -1)

    def _pick(self, home: int) -> int:
        """``home`` (-1: none) unless the loads are imbalanced, else the least loaded; counted in flight there."""
        load = self.load
        low = min(load)
        r = home
        if r < 0 or (max(load) - low > self.abs and max(load) > low * self.rel):
            r = load.index(low)
        load[r] += 1
        return r

    def finished(self, replica: int, count: int = 1) -> None:
        """``count`` requests of ``replica`` finished (at most as many as are in flight there)."""
        replica = check_int("replica", replica, minimum=0)
        if replica >= len(self.load):
            raise InvalidArgument("replica", replica, f"a replica index in [0, {len(self.load) - 1}]")
        count = check_int("count", count, minimum=0)
        if count > self.load[replica]:
            raise InvalidArgument("count", count, f"at most the {self.load[replica]} requests in flight on replica "
                                                  f"{replica}")
        self.load[replica] -= count

    def count(self, replica: int) -> None:
        """A request placed on ``replica`` by someone else (a plan): counted in flight there."""
        self.load[replica] += 1


def route(groups: Sequence[Group], router: str, replicas: int, predicted: np.ndarray | None = None,
          places_groups: bool = False, prompt_share: float | None = None, budget_tokens: int | None = None
          ) -> np.ndarray:
    """The replica of every completion (flattened in group order) for ``router``, or the policy's own
    placement by predicted group work when ``places_groups``. With ``prompt_share`` (the adaptive
    placement) groups are spread as verl spreads them unless every prompt held on every replica would
    take more than that share of ``budget_tokens``."""
    sizes = [len(g.lengths) for g in groups]
    total = sum(sizes)
    if places_groups and prompt_share is not None:
        held = sum(int(g.prompt_len) for g, n in zip(groups, sizes) if n > 0)
        places_groups = budget_tokens is not None and held > prompt_share * budget_tokens
        router = "least_loaded"
    if places_groups:
        work = np.array([int(predicted[s:s + n].sum()) if predicted is not None else n
                         for s, n in zip(np.cumsum([0] + sizes[:-1]), sizes)], dtype=np.int64)
        parts = partition.best_heuristic(np.maximum(work, 1), replicas).parts if replicas > 1 else [range(len(groups))]
        of_group = np.zeros(len(groups), dtype=np.int64)
        for r, part in enumerate(parts):
            of_group[list(part)] = r
        return np.repeat(of_group, sizes)
    if router == "least_loaded":
        return np.arange(total, dtype=np.int64) % replicas
    if router == "group_round_robin":
        return np.repeat(np.arange(len(groups), dtype=np.int64) % replicas, sizes)
    if router == "cache_aware":
        return cache_aware_placement(sizes, replicas)
    if router == "contiguous_chunks":
        per, extra = divmod(len(groups), replicas)
        chunk = [r for r in range(replicas) for _ in range(per + (r < extra))]
        return np.repeat(np.asarray(chunk, dtype=np.int64), sizes)
    raise InvalidArgument("router", router, "one of " + ", ".join(ROUTERS))



def run_rollout(groups: Sequence[Any], policy: str, *, replicas: int = 1, router: str | None = None,
                budget_tokens: int, max_new_tokens: int, predicted: Any = None, cost: Any = None, seed: int = 0,
                prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK, record: bool = False,
                placement: Any = None, max_num_seqs: int | None = None,
                resubmit_seconds: float | None = None, kv_offload: bool | str = False,
                snapshot_seconds: float | None = None, in_flight: int | None = None,
                client_window: float | None = None, client_steals: bool = True,
                refill: Refill | None = None, compression: Any = None, resumed: Any = None) -> RolloutResult:
    """Simulate one rollout step: ``groups`` (objects with ``lengths``, ``prompt_len`` and
    ``prompt_id``, e.g. :class:`simulate.Group`) on ``replicas`` engines under ``policy`` (a name of
    ``lengthsched.runtime.POLICIES`` with ``rollout`` support), placed by ``router`` (:data:`ROUTERS`,
    default ``least_loaded``) unless the policy places or dispatches requests itself.
    ``budget_tokens``: each replica's KV pool in tokens, prompts included (see the module
    docstring). ``predicted``: predicted lengths per completion, flattened in group order (a
    prompt-level predictor gives siblings the same number), or None, or a predictor that learns
    online (``lengthsched.OnlineLengthPredictor``, asked about each group's ``prompt_id``): routed
    replicas each run a copy of it that learns from the siblings finishing there, dispatching
    policies share one. ``cost``: the step-cost model (default Qwen3-1.7B on the H100 preset);
    ``seed`` is accepted for symmetry with ``run_batch`` (these engines draw nothing at random);
    ``record`` keeps each replica's :class:`~lengthsched.runtime.Timeline` for figures.
    ``placement``: the replica (0 to ``replicas - 1``) of every completion, flattened in group
    order, instead of the router's: your own router's placement, evaluated (not with a policy that
    places or dispatches requests itself, except the stealing ones, ``steal`` and its variants, which then
    steal over it instead of their own placement: what lengthsched's integrations do over a plan's
    ``spread``). ``max_num_seqs``: requests each replica runs at once at
    most (vLLM's ``max_num_seqs``, SGLang's ``max_running_requests``; verl sets 1024 by default);
    None: only the pool limits them (Seer's dispatcher then keeps vLLM's default of 256 requests per
    replica). ``resubmit_seconds``: for the policies that move requests between replicas by abort and
    resubmission (``steal`` and its variants), the seconds a moved request travels before its target can
    run it (``WorkStealing.RESUBMIT_SECONDS``; verl 0.9.1's client waits 1 s); None: the policy's own
    (0: at once). ``kv_offload``: every replica keeps a preempted request's KV in host memory and loads it
    back when it runs there again, instead of recomputing it (vLLM's ``--kv-offloading-backend native``;
    a request moved to another replica still recomputes). True or ``"async"``: as vLLM's
    ``OffloadingConnector`` loads, asynchronously: the request holds its KV blocks and waits for its load
    (priced over the cost model's host link, the loads of a replica one after another) while the others
    decode, and runs from the step after the load finished; ``"stall"``: each load charged to the whole
    step that admits it (a pessimistic bound); False: recomputed (vLLM's default). ``snapshot_seconds``: for
    ``steal_observed``, the modelled seconds between a replica's snapshots at least (a framework's poll interval, e.g.
    ``verl_stealing``'s ``poll_interval``; ``StealObserved.SNAPSHOT_SECONDS``); None: the policy's own
    (a snapshot at each decision). ``in_flight``: the most requests the framework keeps in flight over all
    replicas (slime: ``--sglang-server-concurrency`` x engines, 512 x R by default); the others wait in the
    framework's queue in submission order (group by group) and each is routed when a slot frees, by the
    router (``least_loaded`` or ``cache_aware``, :class:`LiveRouter`) on the replicas' requests in flight
    then, or to its replica in ``placement`` when one is given (a client that sends each request where a
    plan put it, as :mod:`lengthsched.integrations.slime` does), and joins its replica's queue at that
    replica's next step (a prompt stays cached on a replica
    after its requests there finish, evicted only under pressure, as a prefix cache keeps it for the
    siblings sent later); for the engine policies whose queue is first come, first served (``vllm``,
    ``sglang``). None: every request is routed at once (verl, OpenRLHF, TRL). ``client_window`` (with a
    ``placement``): the client keeps each replica's planned requests in its own queue and sends a replica
    the next one only while the predicted tokens (prompt plus predicted completion) of the requests it
    sent there and that have not finished stay within ``client_window`` x ``budget_tokens`` (one request
    at least); with ``client_steals`` a replica whose queue is empty takes the last queued request of
    the replica with the most predicted work queued (a steal without an abort: the request was never
    sent). ``in_flight`` then caps the requests in the client's queues and sent (slime's semaphore is
    held by a sample from the moment it enters the client). ``refill`` (with ``in_flight``): slime's dynamic
    sampling inside the step, a :class:`Refill`: the groups are submitted a chunk of units at a time, the
    next chunk when the filter has dropped so many that those submitted and not dropped fall below its
    ``batch``, and the run ends when every request submitted has finished (the result's
    ``released_seconds`` says when each unit was submitted; the step's end is its ``batch``-th finished
    unit that passes). ``compression``: a ``lengthsched.KVCompression`` (Sparse-RL's compressed cache):
    every request holds and reads at most ``compression.max_retained`` generated tokens, and the engines
    admit by that (``run_group``'s ``compression``); for the policies that run one
    (``POLICIES[name].compressed``: vLLM's and SGLang's models, ``steal``, ``steal_longest``,
    ``steal_observed``, Seer's (``seer``, ``seer_divided``: a request's KV through the global pool is its
    compressed KV) and the ``placed_*`` policies and ``steal_classes`` (length classes planned on the capped
    KV) and ``steal_sglang`` (its room to steal counted uncompressed, as SGLang reserves whole lengths)),
    behind any router, with or without a
    framework's in-flight cap; with ``kv_offload`` a preempted request loads back the compressed KV it held; a
    client window counts each request's prompt plus at most ``compression.max_retained`` of its predicted
    completion (what :mod:`lengthsched.integrations.slime` does with ``lengthsched_kv_compression``).
    ``resumed``: per completion, flattened in group order, the tokens it generated in an earlier step (slime's
    partial rollout: an aborted sample resumes with its partial response), or None (none did). Its group's
    ``lengths`` and ``predicted`` are then what it has left; it is admitted as a preempted request is, its
    partial response prefilled again (counted in ``recomputed_tokens``) and held from then on with what it
    generates (with ``compression``, at most ``compression.max_retained`` of them together); the policies see its
    whole predicted length and what it had, the routers and planners what it has left. The result counts only
    what it generates in this step (``tokens``, ``collected_lengths``, :meth:`RolloutResult.generated_at`), and
    ``lower_bound_seconds`` that alone (still a bound). Not with an online predictor. Returns a
    :class:`RolloutResult`."""
    if kv_offload is not False and kv_offload is not True and kv_offload not in OFFLOAD_MODES:
        raise InvalidArgument("kv_offload", kv_offload, "True, False or one of " + ", ".join(map(repr, OFFLOAD_MODES)))
    kv_cap = compression_cap(compression, policy, rollout=True)
    spec, groups, lengths, flat, owner, keys, common = _prepare(
        groups, policy, replicas, budget_tokens, max_new_tokens, predicted, cost, seed, prefill_chunk, record,
        max_num_seqs, kv_cap=kv_cap, resumed=resumed)
    common["kv_cap"] = kv_cap
    common["offload"] = None if kv_offload is False else "async" if kv_offload is True else kv_offload
    router = "least_loaded" if router is None else router
    if router not in ROUTERS:
        raise InvalidArgument("router", router, "one of " + ", ".join(ROUTERS))
    online = predicted if hasattr(predicted, "observe") else None
    cost = common["cost"]
    if placement is not None:
        if (spec.dispatch or spec.places_groups) and not getattr(spec.cls, "STEALS", False):
            raise InvalidArgument("placement", "an array", f"no placement with policy {policy!r}, which places "
                                                           "or dispatches requests itself")
        placement = _check_placement(placement, len(flat), replicas)
    if resubmit_seconds is not None:
        resubmit_seconds = check_nonnegative_float("resubmit_seconds", resubmit_seconds)
        if not spec.resubmits:
            raise InvalidArgument("resubmit_seconds", resubmit_seconds,
                                  f"None with policy {policy!r}, which moves no request between replicas by "
                                  f"resubmitting it ({', '.join(n for n, s in POLICIES.items() if s.resubmits)} do)")
    if snapshot_seconds is not None:
        snapshot_seconds = check_positive_float("snapshot_seconds", snapshot_seconds)
        if not spec.polls:
            raise InvalidArgument("snapshot_seconds", snapshot_seconds,
                                  f"None with policy {policy!r}, which decides from the engines' state, not from "
                                  "snapshots (steal_observed does)")
    if client_window is not None:
        client_window = check_positive_float("client_window", client_window)
        if placement is None:
            raise InvalidArgument("client_window", client_window, "None without a placement (the client queues "
                                  "each request for the replica a plan named)")
        if policy not in THROTTLED_POLICIES:
            raise InvalidArgument("client_window", client_window, f"None with policy {policy!r} (modelled for "
                                  f"{', '.join(THROTTLED_POLICIES)})")
        if in_flight is None:
            in_flight = len(flat)
    if refill is not None:
        if not isinstance(refill, Refill):
            raise InvalidArgument("refill", type(refill).__name__, "a simulate.rollout.Refill")
        # a stealing policy places each batch the refill releases by the refill's plan (verl's v1 stealing manager)
        steals = spec.dispatch and getattr(spec.cls, "STEALS", False)
        if steals and (refill.plan is None or in_flight is not None or placement is not None):
            raise InvalidArgument("refill", f"with policy {policy!r}", "a plan that places each batch, and no "
                                  "in_flight or placement (a stealing policy runs what the plan places)")
        if in_flight is None and not steals:
            raise InvalidArgument("refill", "without in_flight", "in_flight (slime's semaphore: dynamic sampling "
                                                                 "submits through it), or a stealing policy")
        if len(refill.owners if refill.owners is not None else refill.passes) != len(groups):
            raise InvalidArgument("refill", f"owners for {len(refill.owners or refill.passes)} groups",
                                  f"one unit per group given ({len(groups)})")
        if refill.plan is not None and placement is None and not steals:
            raise InvalidArgument("refill", "a plan without a placement", "a placement for the plan to replace "
                                                                          "(a client that sends where it planned)")
    if in_flight is not None:
        in_flight = check_int("in_flight", in_flight, minimum=1)
        if policy not in THROTTLED_POLICIES:
            raise InvalidArgument("in_flight", in_flight, f"None with policy {policy!r} (a framework's in-flight "
                                  f"cap is modelled for {', '.join(THROTTLED_POLICIES)})")
        if placement is None and router not in LiveRouter.ROUTERS:
            raise InvalidArgument("in_flight", in_flight, f"None with router {router!r} (routed one request at "
                                  f"a time: {', '.join(LiveRouter.ROUTERS)})")
        used_router = router if placement is None else "given"
        window = None if client_window is None else (client_window, bool(client_steals))
        engines, clocks, placement, released = _run_throttled(policy, router, replicas, in_flight, online,
                                                              fixed=placement, window=window, refill=refill,
                                                              **common)
    elif spec.dispatch:
        used_router = "dispatch" if placement is None else "given"
        engines, clocks, placement, released = _run_dispatch(policy, replicas, online, keys, groups,
                                                             resubmit=resubmit_seconds, snapshot=snapshot_seconds,
                                                             given=placement, refill=refill, **common)
    else:
        if placement is None and getattr(spec.cls, "PLACE", None) == "classes":
            placement = _plan_classes(policy, replicas, owner, common)
            used_router = "placed"
        elif placement is None:
            placement = route(groups, router, replicas, common["pred"], spec.places_groups,
                              getattr(spec.cls, "PROMPT_SHARE", None), common["budget"])
            used_router = "placed" if spec.places_groups else router
        else:
            used_router = "given"
        engines, clocks = _run_routed(policy, placement, online, replicas, **common)
    collected = np.zeros(len(flat), dtype=bool)
    for eng in engines:
        collected[np.asarray(eng.collected, dtype=np.int64)] = True
    ran = np.ones(len(flat), dtype=bool) if refill is None else placement >= 0  # a Refill submits some
    if not collected[ran].all():
        raise InvalidArgument("policy", policy, "a policy that collects every completion it launches")
    replica_seconds = tuple(float(secs[-1]) for _, secs in clocks)
    prompt_lens = common["prompt_lens"]
    logs = tuple(eng.step_log() for eng in engines)
    return RolloutResult(
        policy=policy, router=used_router, replicas=replicas,
        seconds=max(replica_seconds), replica_seconds=replica_seconds,
        steps=max(eng.t for eng in engines), preemptions=sum(eng.preemptions for eng in engines),
        recomputed_tokens=sum(eng.recomputed_tokens for eng in engines),
        prefill_tokens=sum(int(log.prefill_tokens.sum()) for log in logs),
        lower_bound_seconds=_lower_bound(cost, flat[ran], owner[ran], prompt_lens, common["budget"], replicas,
                                         kv_cap=kv_cap) if ran.any() else 0.0,
        tokens=int(flat[ran].sum()), budget_tokens=common["budget"], cost_name=f"{cost.model} on {cost.gpu}"
        + (f" x{cost.tp}" if cost.tp > 1 else ""),
        collected_lengths=tuple(lengths), placement=placement,
        prompt_loads=sum(eng.prompt_loads for eng in engines),
        peak_kv_tokens=tuple(eng.peak_kv for eng in engines),
        loaded_tokens=sum(eng.loaded_tokens for eng in engines),
        timelines=tuple(eng.timeline for eng in engines), clocks=tuple(clocks), step_logs=logs,
        released_seconds=None if refill is None else released)


class _OneClock:
    """Replicas on one clock in modelled seconds: the heap of (seconds, replica) to decide next, the
    replicas asleep (``idle``), and each replica's (step, seconds) marks, from which its clock is made
    (an idle wait repeats a step with a later time)."""

    def __init__(self, engines: Sequence[Any]):
        self.engines = engines
        self.heap = [(0.0, r) for r in range(len(engines))]
        self.idle: set[int] = set()
        self.ends: list[list] = [[0] for _ in engines]
        self.secs: list[list] = [[0.0] for _ in engines]

    def at(self, r: int, when: float) -> None:
        """Replica ``r`` decides next at ``when`` (seconds): marked on its clock and queued."""
        heapq.heappush(self.heap, (when, r))
        self.ends[r].append(self.engines[r].t)
        self.secs[r].append(when)

    def wake(self, others, now: float) -> None:
        """The replicas of ``others`` that sleep run again from ``now`` (idle until then)."""
        for other in others:
            if other in self.idle:
                self.idle.discard(other)
                self.at(other, now)

    def run(self, r: int, t_next: int, pads: bool, cost: Any, now: float) -> None:
        """Replica ``r`` advances to step ``t_next`` from ``now``; it decides again when those steps end."""
        eng = self.engines[r]
        first = eng.log_size
        eng.advance(t_next, pads)  # one run of steps, or several where a compressed cache's rows reach its cap
        self.at(r, now + sum(cost.segment_seconds_float(*eng.log_entry(i)) for i in range(first, eng.log_size)))

    def clocks(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(np.asarray(e, dtype=np.float64), np.asarray(s)) for e, s in zip(self.ends, self.secs)]


#: The engine policies ``run_rollout(..., in_flight=)`` runs: their waiting queues are first come, first
#: served, so a request routed later joins the back.
THROTTLED_POLICIES = ("vllm", "sglang")


def _run_throttled(policy, router, replicas, cap, online, *, flat, owner, tails, prompt_kv, prompt_lens, pred,
                   job_keys, max_new, budget, prefill_chunk, record, cost, max_seqs=None, offload=None, fixed=None,
                   window=None, refill=None, kv_cap=None, resumed=None):
    """The replicas on one clock (modelled seconds) while a framework keeps at most ``cap`` requests in
    flight: the first ``cap`` are routed at once, each later one when a request finishes (on any
    replica), in submission order, by a :class:`LiveRouter`, or to its replica in ``fixed`` (a given
    placement: a client that sends each request to the replica a plan named). While requests wait to be
    sent, every replica decides at every step, so a request routed to a busy replica joins its queue at
    the replica's next step (as a serving engine takes new requests between steps). ``window``: (share,
    steals) of ``run_rollout``'s ``client_window`` and ``client_steals``: the requests admitted by the cap
    wait in per-replica client queues and are sent as :class:`_ClientWindow` allows. ``refill``: a
    :class:`Refill` (:class:`_Releases`) that submits the requests a chunk of units at a time; returns, besides
    the engines, clocks and placement, when each unit was submitted (None without it)."""
    live = LiveRouter(router, replicas) if fixed is None else None
    if refill is not None and refill.plan is not None:
        fixed = np.array(fixed, dtype=np.int64)  # the plan places each chunk when it is submitted
        if window is None and router in LiveRouter.ROUTERS:  # a request the plan leaves to the router (-1)
            live = LiveRouter(router, replicas)
    client = None if window is None else _ClientWindow(fixed, replicas, owner, prompt_lens, pred, max_new, budget,
                                                       *window, kv_cap=kv_cap, resumed=resumed)
    engines, pols = [], []
    for _ in range(replicas):
        problem = Problem(lengths=flat, max_new_tokens=max_new, budget_tokens=budget, slots=max_seqs,
                          predicted=resumed_predictions(pred, resumed),
                          predictor=None if online is None else copy_predictor(online),
                          prompt_ids=job_keys, kv_cap=kv_cap)
        pol = POLICIES[policy].cls(problem)
        pol.waiting = []  # a stack (the front is the end): filled as requests are routed here
        eng = _engine(flat, owner, tails, prompt_kv, prompt_lens, budget, prefill_chunk, record, pol.block_size,
                      offload, cost, kv_cap=kv_cap, resumed=resumed)
        eng.cache_prompts = True  # its prefix cache keeps a prompt for the siblings sent later
        eng.start(pol)
        engines.append(eng)
        pols.append(pol)
    n, sent = len(flat), 0

    def planned(units: range, now: float) -> np.ndarray:  # a Refill's plan: the chunk's requests placed when submitted
        jobs, where = refill.plan(units, None if client is None else client.queues.outstanding())
        jobs = np.asarray(jobs, dtype=np.int64)
        fixed[jobs] = np.asarray(where, dtype=np.int64)
        if client is not None:
            client.fixed[jobs] = fixed[jobs]
        return jobs

    releases = None if refill is None else _Releases(refill, owner, None if refill.plan is None else planned)
    queue = np.arange(n) if releases is None else releases.queue  # the requests submitted, in submission order
    placement = np.full(n, -1, dtype=np.int64)
    seen = [0] * replicas  # finishes already counted, per replica
    clock = _OneClock(engines)

    def send(now: float) -> None:  # route what the free slots allow; wake the idle replicas that got some
        nonlocal sent
        if client is not None:
            while sent < len(queue) and sent - sum(seen) < cap:  # through the cap into the client's queues
                client.enter(int(queue[sent]))
                sent += 1
            for job, r in client.send():
                placement[job] = r
                pols[r].waiting.insert(0, job)
                engines[r].claim(job)
                clock.wake((r,), now)
            return
        while sent < len(queue) and sent - sum(seen) < cap:
            job = int(queue[sent])
            r = -1 if fixed is None else int(fixed[job])
            if r < 0:  # routed as it is sent
                if live is None:
                    raise InvalidArgument("refill", "a plan that leaves a request to the router", "a router that "
                                          f"routes one at a time ({', '.join(LiveRouter.ROUTERS)}), no client window")
                r = live.select(int(owner[job]))
            elif live is not None:
                live.count(r)
            placement[job] = r
            pols[r].waiting.insert(0, job)
            engines[r].claim(job)
            sent += 1
            clock.wake((r,), now)

    if releases is not None:
        releases.release(0.0)
    send(0.0)
    while clock.heap:
        now, r = heapq.heappop(clock.heap)
        if r < 0:  # a poll of the framework (a Refill with poll): its rule submits what it asks for now
            releases.poll(now)
            send(now)
            continue
        eng, pol = engines[r], pols[r]
        done = len(eng.collected)
        if done > seen[r]:
            if live is not None:
                live.finished(r, done - seen[r])
            if client is not None:
                client.finished(r, eng.collected[seen[r]:done])
            if releases is not None:
                releases.finished(eng.collected[seen[r]:done], now, clock.heap)
            seen[r] = done
            send(now)
        if not eng.decide(pol):
            ran_dry(pol, eng)
            clock.idle.add(r)
            continue
        t_next = eng.next_event()
        if sent < len(queue):  # requests still wait to be sent: take them between steps
            t_next = min(t_next, eng.t + 1)
        clock.run(r, t_next, pol.pads, cost, now)
    if sent < len(queue) or (placement[queue] < 0).any():
        raise InvalidArgument("policy", policy, "an engine policy that finishes every request it is sent")
    return engines, clock.clocks(), placement, None if releases is None else releases.seconds


class _Releases:
    """A :class:`Refill` in :func:`_run_throttled`: ``queue`` (a growing list of request indices) holds the
    requests submitted so far, in submission order; :meth:`release` submits chunks of units while slime's rule
    asks for more, :meth:`finished` counts the requests that finished and the units they complete. ``plan``
    (optional): ``plan(units, now)`` submits the requests of ``units`` at ``now`` (seconds) and returns them in
    submission order."""

    def __init__(self, refill: Refill, owner: np.ndarray, plan: Any = None):
        self.refill, self.plan = refill, plan
        units = len(refill.passes)
        unit_of_group = np.arange(units) if refill.owners is None else np.asarray(refill.owners, dtype=np.int64)
        self.unit = unit_of_group[owner] if len(owner) else np.zeros(0, dtype=np.int64)  # per request
        self.left = np.bincount(self.unit, minlength=units)  # per unit, its requests not finished
        order = np.argsort(self.unit, kind="stable")
        self.bounds = np.searchsorted(self.unit[order], np.arange(units + 1))
        self.order = order  # unit u's requests: order[bounds[u]:bounds[u + 1]]
        self.seconds = np.full(units, np.inf)
        self.queue: list[int] = []
        self.submitted = self.dropped = self.kept = 0
        self.credit = refill.batch  # verl: units it may still submit (the first batch, then two per drop)
        self.ticks: set[float] = set()  # the polls scheduled (a Refill with poll)

    def _more(self) -> bool:
        """Whether the rule submits another unit now (one more chunk: slime; one more unit: verl)."""
        refill = self.refill
        if self.kept >= refill.batch or self.submitted >= len(refill.passes):
            return False
        if refill.rule == "verl":
            inflight = self.submitted - self.kept - self.dropped
            if self.credit <= 0 or (refill.cap is not None and inflight >= refill.cap):
                return False
            if refill.by_need is None:
                return True
            kept, done = refill.by_need
            finished = self.kept + self.dropped
            return need_refill(refill.batch - self.kept, inflight, kept + self.kept, done + finished) > 0
        return self.submitted - self.dropped < refill.batch  # slime's remaining_batch_size < target_data_size

    def release(self, now: float) -> None:
        """Submit what the rule asks for now: slime's next chunks, or verl's next units."""
        refill, units = self.refill, len(self.refill.passes)
        batch = None  # verl with a plan: the units released now, planned together
        while self._more():
            chunk = range(self.submitted, min(units, self.submitted + (1 if refill.rule == "verl" else refill.chunk)))
            self.credit -= len(chunk)
            self.submitted = chunk.stop
            self.seconds[chunk.start:chunk.stop] = now
            if self.plan is not None and refill.rule == "verl":  # verl hands its manager every unit it asks
                batch = range(chunk.start if batch is None else batch.start, chunk.stop)  # for now in one batch
            elif self.plan is not None:  # placed and ordered now, from what the replicas have
                self.queue.extend(self.plan(chunk, now).tolist())
            else:  # the chunk's requests in the order given (a planner may have ordered its groups)
                self.queue.extend(np.sort(self.order[self.bounds[chunk.start]:self.bounds[chunk.stop]]).tolist())
            for u in chunk:
                if self.left[u] == 0:  # nothing to run: done when submitted
                    self._unit_done(u)
        if batch is not None:
            self.queue.extend(self.plan(batch, now).tolist())

    def finished(self, jobs, now: float, heap: list) -> None:
        """Count the requests ``jobs`` that finished at ``now`` and submit what the rule asks for; with a poll, the
        rule decides at the next poll instead, which is pushed on ``heap`` (a clock's: ``(seconds, -1)``) unless it
        is there already."""
        for job in jobs:
            u = int(self.unit[job])
            self.left[u] -= 1
            if self.left[u] == 0:
                self._unit_done(u)
        poll = self.refill.poll
        if poll is None:
            self.release(now)
            return
        tick = next_poll(now, poll)
        if tick not in self.ticks:
            self.ticks.add(tick)
            heapq.heappush(heap, (tick, -1))

    def poll(self, now: float) -> None:
        """A poll at ``now``: the rule submits what it asks for."""
        self.ticks.discard(now)
        self.release(now)

    def _unit_done(self, u: int) -> None:
        if self.refill.passes[u]:
            self.kept += 1
        else:
            self.dropped += 1
            self.credit += 2  # verl refills two for every group its filter drops (slime: unused)


class _ClientWindow:
    """:class:`lengthsched.integrations.rollout.ClientQueues` over a step's requests (``run_rollout(...,
    client_window=)``): request j waits for its planned replica ``fixed[j]``, needs its prompt plus its
    predicted completion (at most ``max_new``; ``max_new`` without predictions) and the tokens it resumes with
    (``resumed``), those at most ``kv_cap`` (a compressed cache's most generated tokens held), within ``share`` x
    ``budget`` of its replica's window."""

    def __init__(self, fixed, replicas, owner, prompt_lens, pred, max_new, budget, share, steals, kv_cap=None,
                 resumed=None):
        self.fixed = np.asarray(fixed, dtype=np.int64)
        self.work = np.full(len(owner), float(max_new)) if pred is None else np.minimum(pred, max_new)
        held = self.work if resumed is None else self.work + resumed  # a resumed request holds what it had too
        held = held if kv_cap is None else np.minimum(held, kv_cap)
        self.need = np.asarray(prompt_lens, dtype=np.float64)[owner] + held
        self.queues = ClientQueues(replicas, share * budget, steals=steals)

    def enter(self, job: int) -> None:
        self.queues.enter(job, int(self.fixed[job]), self.need[job], self.work[job])

    def finished(self, replica: int, jobs) -> None:
        for job in jobs:
            self.queues.finished(replica, self.need[job])

    def send(self) -> list[tuple[int, int]]:
        return self.queues.send()


def run_slime_planned(groups: Sequence[Any], predicted: Any, *, replicas: int, budget_tokens: int,
                      max_new_tokens: int, in_flight: int | None, placement: str = "ways", submit: str = "auto",
                      window: float | None = None, steals: bool = True, refill: Refill | None = None,
                      filter_history: Any = None, **kwargs: Any) -> tuple[RolloutResult, np.ndarray]:
    """slime with :mod:`lengthsched.integrations.slime` (its rollout and generate hooks), in the model:
    the integration's own planner (:class:`~lengthsched.integrations.slime.SlimePlanner`, ``placement``
    and ``submit`` as there, each replica's pool ``budget_tokens``) plans the step from ``predicted``
    (per completion, flattened in group order; a prompt-level predictor's, the same for siblings: each
    group's first is used; or the planner's predictor itself, e.g. a :class:`lengthsched.OnlineLengthPredictor`,
    asked about each group's ``prompt_id``: one that has seen no length leaves the step unplanned, as the
    integration does by default, and the step is then slime as it ships, SGLang's engines behind its
    ``cache_aware`` router), slime submits the groups in the order it returns them, its semaphore keeps
    ``in_flight`` requests in flight (slime: 512 x ``replicas``; None: all sent at once), and each is sent
    to its planned replica's SGLang engine (``sglang``), through the integration's client window:
    ``window`` KV pools per engine (default the integration's
    :data:`~lengthsched.integrations.slime.WINDOW`; 0: every sample sent at once; none on one replica,
    as the integration) with ``steals``
    (``run_rollout``'s ``client_window`` and ``client_steals``). Returns the run (its groups in
    submission order, so its ``collected_lengths`` are too) and that order (indices into ``groups``).
    ``refill`` (a :class:`Refill`, slime's dynamic sampling): each chunk of units is planned as its own batch
    when it is submitted, as the integration plans every batch slime takes: its groups handed over in the
    planner's order, placed from what each engine still has in the client's queues and in flight (with the
    client window; without it, as a fresh batch, as the integration has no queues to read then). The groups
    then stay in the order given (the returned order is the identity).
    ``filter_history``: a :class:`lengthsched.filtering.FilterHistory` (keyed by ``prompt_id``): the planner orders
    every batch likely-kept first by it, its ``submit`` order breaking ties (the integration's
    ``lengthsched_filter_order``; :func:`simulate.run_oversampled_steps` feeds it). Unplanned steps keep the order
    given (``run_oversampled_steps`` orders the batches with the same history).
    ``kwargs`` go to :func:`run_rollout` (``cost``, ``max_num_seqs``, ``resumed``, ...; the planner places a
    resumed completion by what it has left, ``predicted``, as the integration plans a sample that resumes)."""
    client_window = _slime_window(window, replicas)
    groups, sizes, starts, pred, samples, planner = _slime_planner(groups, predicted, budget_tokens, max_new_tokens,
                                                                   placement, submit, filter_history)
    if not planner.planning:  # slime's router sends the step, as slime ships
        result = run_rollout(groups, "sglang", router="cache_aware", replicas=replicas, budget_tokens=budget_tokens,
                             max_new_tokens=max_new_tokens, in_flight=in_flight, refill=refill, **kwargs)
        return result, np.arange(len(groups), dtype=np.int64)
    if refill is not None:  # each chunk planned when slime takes it, from what the engines still have
        return _slime_refill(groups, samples, sizes, pred, planner, refill, replicas=replicas,
                             budget_tokens=budget_tokens, max_new_tokens=max_new_tokens, in_flight=in_flight,
                             client_window=client_window, client_steals=steals, **kwargs)
    order, placed, pred_reordered = _slime_order(planner, samples, groups, sizes, starts, pred, replicas)
    if kwargs.get("resumed") is not None:  # what each completion resumes with, in the plan's order
        resumed = as_lengths("resumed", kwargs["resumed"], minimum=0)
        kwargs["resumed"] = np.concatenate([resumed[starts[i]:starts[i] + sizes[i]] for i in order]) if len(order) \
            else resumed
    result = run_rollout([groups[i] for i in order], "sglang", replicas=replicas, budget_tokens=budget_tokens,
                         max_new_tokens=max_new_tokens, predicted=pred_reordered, placement=placed,
                         in_flight=in_flight, client_window=client_window, client_steals=steals, **kwargs)
    return result, order


def _slime_window(window: float | None, replicas: int) -> float | None:
    """The client window (KV pools per engine) lengthsched's slime integration sends with: ``window`` (None: its
    :data:`~lengthsched.integrations.slime.WINDOW`; 0: every sample sent at once, no window), none on one replica
    (as the integration)."""
    from lengthsched.integrations.slime import WINDOW

    window = WINDOW if window is None else check_nonnegative_float("window", window)
    return (window or None) if replicas > 1 else None


def _slime_planner(groups, predicted, budget_tokens, max_new_tokens, placement, submit, filter_history):
    """The integration's planner for a step of ``groups`` (``run_slime_planned``'s arguments): returns the groups
    (a list), their sizes and first completions' indices, the predictions per completion (None: the planner's
    own predictor), the samples the planner is handed (one namespace per completion) and the planner."""
    from types import SimpleNamespace

    from lengthsched.integrations.slime import SlimePlanner
    from lengthsched.predictor import OracleLengthPredictor

    groups = list(groups)
    sizes = [len(g.lengths) for g in groups]
    starts = np.cumsum([0] + sizes[:-1])
    if hasattr(predicted, "predict"):  # the planner's own predictor, keyed by prompt
        keys, predictor, pred = [g.prompt_id for g in groups], predicted, None
    else:
        pred = np.asarray(predicted, dtype=np.float64)
        if pred.shape != (sum(sizes),):
            raise InvalidArgument("predicted", f"{pred.size} values", f"{sum(sizes)} values, one per completion")
        keys = [f"{i}:{g.prompt_id}" for i, g in enumerate(groups)]
        predictor = OracleLengthPredictor({k: max(1, int(round(pred[s]))) for k, s, n in zip(keys, starts, sizes)
                                           if n > 0})
    samples = [[SimpleNamespace(prompt=k, tokens=[], metadata={}, index=i)
                for _ in range(n)] for i, (k, g, n) in enumerate(zip(keys, groups, sizes))]
    if filter_history is not None and pred is not None:  # the planner's keys are "index:prompt_id"
        filter_history = _PromptHistory(filter_history, {k: g.prompt_id for k, g in zip(keys, groups)})
    planner = SlimePlanner(placement=placement, pool_tokens=budget_tokens if placement == "ways" else None,
                           submit=submit, max_new_tokens=max_new_tokens, predictor=predictor,
                           filter_order=filter_history is not None, history=filter_history)
    return groups, sizes, starts, pred, samples, planner


def _slime_order(planner, samples, groups, sizes, starts, pred, replicas) -> tuple[np.ndarray, np.ndarray, Any]:
    """The planner's plan of a step (:func:`_slime_planner`'s): the order it hands the groups to slime (indices
    into ``groups``), each completion's replica in that order, and each completion's prediction in that order."""
    from lengthsched.integrations.slime import REPLICA_KEY, WORK_KEY

    prompt_lens = [int(g.prompt_len) for g in groups]
    planned = [g for g in planner.plan(samples, replicas, prompt_lens=prompt_lens) if g]
    order = np.array([g[0].index for g in planned] + [i for i, n in enumerate(sizes) if n == 0], dtype=np.int64)
    placed = np.array([s.metadata[REPLICA_KEY] for g in planned for s in g], dtype=np.int64)
    if pred is None:  # what the plan predicted, per completion
        pred_reordered = np.array([max(1, s.metadata[WORK_KEY]) for g in planned for s in g], dtype=np.int64)
    else:
        pred_reordered = np.concatenate([pred[starts[i]:starts[i] + sizes[i]] for i in order]) if len(order) \
            else pred
    return order, placed, pred_reordered


class _PromptHistory:
    """A :class:`lengthsched.filtering.FilterHistory` asked by the planner's own keys (``names``: key ->
    prompt id)."""

    def __init__(self, history: Any, names: dict):
        self.history, self.names = history, names

    @property
    def informed(self) -> bool:
        return self.history.informed

    def pass_probability(self, keys):
        return self.history.pass_probability([self.names.get(k, k) for k in keys])

    def observe(self, key, kept: bool, side: str | None = None) -> None:
        self.history.observe(self.names.get(key, key), kept, side)


def _slime_refill(groups, samples, sizes, pred, planner, refill, **kwargs) -> tuple[RolloutResult, np.ndarray]:
    """:func:`run_slime_planned` with slime's dynamic sampling: every chunk of units planned by ``planner`` when
    it is submitted (:class:`Refill`'s ``plan``), from the client's outstanding predicted tokens per engine (the
    integration's ``PlannedDataSource``), its groups handed over in the planner's order. The groups stay in the
    order given (the returned order is the identity)."""
    from lengthsched.integrations.rollout import predict_lengths
    from lengthsched.integrations.slime import REPLICA_KEY

    chunks = _UnitRows(groups, refill)
    if pred is None:  # the planner's predictions, per completion (the same for siblings)
        said = predict_lengths(planner.planner.predictor, [s[0].prompt for s in samples if s] or [],
                               max_new_tokens=kwargs["max_new_tokens"])
        per_group, it = [], iter(said)
        for n in sizes:
            per_group.append(np.full(n, max(1, int(next(it))) if n else 1, dtype=np.int64))
        pred = np.concatenate(per_group) if per_group else np.zeros(0, dtype=np.int64)
    prompt_lens = [int(g.prompt_len) for g in groups]

    def plan(units: range, loads) -> tuple[np.ndarray, np.ndarray]:
        idx = chunks.groups(units)
        planned = [g for g in planner.plan([samples[i] for i in idx], kwargs["replicas"],
                                           prompt_lens=[prompt_lens[i] for i in idx], loads=loads) if g]
        jobs = [np.arange(chunks.starts[g[0].index], chunks.starts[g[0].index] + len(g)) for g in planned]
        where = [s.metadata[REPLICA_KEY] for g in planned for s in g]
        return (np.concatenate(jobs) if jobs else np.zeros(0, dtype=np.int64)), np.asarray(where, dtype=np.int64)

    result = run_rollout(groups, "sglang", predicted=np.asarray(pred), placement=np.zeros(sum(sizes), dtype=np.int64),
                         refill=dataclasses.replace(refill, plan=plan), **kwargs)
    return result, np.arange(len(groups), dtype=np.int64)


def run_verl_planned(groups: Sequence[Any], policy: str = "vllm", *, predicted: Any, refill: Refill,
                     order: str = "longest", **kwargs: Any) -> RolloutResult:
    """verl 0.9.1's v1 sync trainer with :mod:`lengthsched.integrations.verl_v1`'s manager, under verl's dynamic
    sampling (``refill``: a :class:`Refill` with ``rule="verl"``): every batch of prompts verl hands the manager at
    once (the step's batch, then the refill of each poll) is planned when it is submitted, as the manager plans
    it: :func:`lengthsched.integrations.plan_rollout` over ``predicted`` (per completion, flattened in group
    order), its default spread and ``order`` (``"longest"`` predicted first, or ``"batch"``: verl's order), each
    request sent in the plan's order and routed as it is sent by ``router`` (``"least_loaded"``: the fewest in
    flight, where the manager leaves a spread plan's requests, as verl's router routes them). vLLM with
    ``scheduling_policy=priority`` serves each replica's queue by (priority, arrival), and preempts the largest;
    each later batch's priorities are above every earlier one's, so the engines' FCFS policy ``"vllm"`` over
    requests submitted in the plan's order does the same (the only ``policy``); in ``"batch"`` order the run is
    verl's own. ``kwargs`` go to :func:`run_rollout` (``replicas``, ``budget_tokens``, ``max_new_tokens``,
    ``in_flight``, ``router``, ...). A ``run`` for :func:`simulate.run_oversampled_steps` with
    ``refill_rule="verl"``; the groups stay in the order given."""
    if policy != "vllm":
        raise InvalidArgument("policy", policy, "'vllm' (verl's engines; FCFS over the plan's order is its priority "
                                                "scheduling here)")
    if not isinstance(refill, Refill) or refill.rule != "verl":
        raise InvalidArgument("refill", refill, "a simulate.rollout.Refill with rule='verl' (verl's dynamic sampling)")
    if kwargs.get("router") not in LiveRouter.ROUTERS or kwargs.get("client_window") is not None:
        raise InvalidArgument("router", kwargs.get("router"), "'least_loaded' (verl's router, which routes the "
                                                              "manager's spread requests) and no client_window")
    groups = list(groups)
    chunks = _UnitRows(groups, refill, predicted)
    replicas = kwargs.get("replicas", 1)

    def plan(units: range, loads) -> tuple[np.ndarray, np.ndarray]:
        sent, _ = chunks.plan(units, replicas=replicas, placement="spread", order=order)
        return sent, np.full(len(sent), -1, dtype=np.int64)  # routed as verl's router routes them

    return run_rollout(groups, "vllm", predicted=chunks.pred, placement=np.zeros(len(chunks.pred), dtype=np.int64),
                       refill=dataclasses.replace(refill, plan=plan), **kwargs)


def run_verl_stealing(groups: Sequence[Any], policy: str = "steal_observed", *, predicted: Any, refill: Refill,
                      placement: str = "ways", **kwargs: Any) -> RolloutResult:
    """verl 0.9.1's v1 sync trainer with :mod:`lengthsched.integrations.verl_v1`'s stealing manager
    (``LengthschedStealingAgentLoopManagerTQ``) under verl's dynamic sampling (``refill``: a :class:`Refill` with
    ``rule="verl"``): every batch verl hands the manager at once (the step's batch, then each poll's refill) is
    planned when it is submitted, as the manager plans it: :func:`lengthsched.integrations.plan_rollout` with
    ``steal``'s placement (``"ways"``: each group over as many replicas as the pools hold its prompts, placed from
    the predicted tokens of the batches still running where they were planned) in batch order, each request queued
    at the back of its planned replica's queue; the replicas steal waiting requests from each other and move running
    ones as ``policy`` does: ``"steal_observed"`` (the default: decisions from snapshots, as the manager's
    ``StealDriver`` makes them; ``snapshot_seconds`` and ``resubmit_seconds`` as its poll interval and the stealing
    client's round trip) or ``"steal"``. ``placement``: the plan's, the manager's ``lengthsched.placement``
    (``"ways"``, its default; ``"spread"``: row i of a batch to replica i mod R; ``"groups"``: whole groups by
    predicted work). ``predicted``: per completion, flattened in group order. ``kwargs`` go to
    :func:`run_rollout` (``replicas``, ``budget_tokens``, ``max_new_tokens``, ``cost``, ...), except ``router``
    (None or verl's ``"least_loaded"``) and ``in_flight`` (None or unbounded), which :func:`run_verl_planned` needs
    and this takes for the same calls. A ``run`` for :func:`simulate.run_oversampled_steps` with
    ``refill_rule="verl"``; the groups stay in the order given."""
    if policy not in ("steal", "steal_observed"):
        raise InvalidArgument("policy", policy, "'steal_observed' (the stealing manager's driver) or 'steal'")
    if not isinstance(refill, Refill) or refill.rule != "verl":
        raise InvalidArgument("refill", refill, "a simulate.rollout.Refill with rule='verl' (verl's dynamic sampling)")
    if placement not in ("ways", "spread", "groups"):
        raise InvalidArgument("placement", placement, "'ways' (the stealing manager's default), 'spread' or 'groups'")
    groups = list(groups)
    chunks = _UnitRows(groups, refill, predicted)
    in_flight, router = kwargs.pop("in_flight", None), kwargs.pop("router", None)  # as run_verl_planned's callers
    if router not in (None, "least_loaded"):
        raise InvalidArgument("router", router, "None or 'least_loaded' (verl's; the stealing manager places each "
                                                "batch itself)")
    if in_flight is not None and check_int("in_flight", in_flight, minimum=1) < len(chunks.pred):
        raise InvalidArgument("in_flight", in_flight, f"None or at least {len(chunks.pred)} (verl sends every "
                                                      "request of a batch at once)")
    replicas, budget = kwargs.get("replicas", 1), kwargs.get("budget_tokens")
    prompt_lens = np.array([int(g.prompt_len) for g in groups], dtype=np.int64)

    def plan(units: range, loads) -> tuple[np.ndarray, np.ndarray]:
        return chunks.plan(units, replicas=replicas, placement=placement, order="batch", prompt_lens=prompt_lens,
                           budget_tokens=budget, loads=None if placement == "spread" else loads)

    return run_rollout(groups, policy, predicted=chunks.pred, refill=dataclasses.replace(refill, plan=plan), **kwargs)


class _UnitRows:
    """A step's requests by the units of a :class:`Refill` (for the plans of :func:`run_verl_planned`,
    :func:`run_verl_stealing` and :func:`run_slime_planned`'s refill): ``sizes`` and ``starts`` (per group),
    ``pred`` (per completion; None where not given), :meth:`groups`, :meth:`rows` and :meth:`plan`."""

    def __init__(self, groups: Sequence[Any], refill: Refill, predicted: Any = None):
        self.sizes = np.array([len(g.lengths) for g in groups], dtype=np.int64)
        self.starts = np.concatenate(([0], np.cumsum(self.sizes)[:-1])).astype(np.int64)
        self.pred = None if predicted is None else as_lengths("predicted", predicted, minimum=0)
        if self.pred is not None and self.pred.shape != (int(self.sizes.sum()),):
            raise InvalidArgument("predicted", f"{self.pred.size} values",
                                  f"{int(self.sizes.sum())} values, one per completion")
        self.unit = np.arange(len(groups)) if refill.owners is None else np.asarray(refill.owners, dtype=np.int64)

    def groups(self, units: range) -> np.ndarray:
        """The groups of ``units`` that have requests, in group order."""
        return np.array([i for i in np.flatnonzero((self.unit >= units.start) & (self.unit < units.stop))
                         if self.sizes[i]], dtype=np.int64)

    def rows(self, units: range) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`groups` of ``units``, and their requests (indices into the flattened step)."""
        idx = self.groups(units)
        if not len(idx):
            return idx, np.zeros(0, dtype=np.int64)
        return idx, np.concatenate([np.arange(self.starts[i], self.starts[i] + self.sizes[i]) for i in idx])

    def plan(self, units: range, **options: Any) -> tuple[np.ndarray, np.ndarray]:
        """The requests of ``units`` planned by :func:`lengthsched.integrations.plan_rollout` over ``pred``
        (``options``: its keywords; ``prompt_lens`` given per group, taken per request here), in the plan's
        submission order, and each one's replica in the plan."""
        from lengthsched.integrations.rollout import plan_rollout

        idx, rows = self.rows(units)
        if not len(rows):
            return rows, rows
        owners = np.repeat(idx, self.sizes[idx])
        if options.get("prompt_lens") is not None:
            options["prompt_lens"] = np.asarray(options["prompt_lens"])[owners]
        made = plan_rollout(owners.tolist(), self.pred[rows], **options)
        sent = np.asarray(made.submission_order(), dtype=np.int64)
        return rows[sent], np.asarray(made.replica, dtype=np.int64)[sent]


def run_slime_planned_in_order(groups: Sequence[Any], policy: str = "sglang", *, predicted: Any,
                               in_flight: int | None = None, **kwargs: Any) -> RolloutResult:
    """:func:`run_slime_planned`, its run's groups listed as given (:meth:`RolloutResult.in_order`): a
    ``run`` for :func:`simulate.run_oversampled_steps` (slime with the integration, step after step).
    ``policy``: ``"sglang"`` (the engines the integration plans for); ``kwargs`` as there."""
    if policy != "sglang":
        raise InvalidArgument("policy", policy, "'sglang' (slime's engines, which the integration plans for)")
    result, order = run_slime_planned(groups, predicted, in_flight=in_flight, **kwargs)
    return result.in_order(order)


def _plan_classes(policy: str, replicas: int, owner: np.ndarray, common: dict) -> np.ndarray:
    """The placement of ``placed_classes`` and ``steal_classes``: :func:`lengthsched.runtime.replicas.plan_classes`
    on the predictions (none: every completion ``max_new_tokens`` long), every replica the policy's
    ``ENGINE``."""
    pred = common["pred"] if common["pred"] is not None else np.full(len(owner), common["max_new"])
    return plan_classes(pred, owner, common["prompt_lens"], replicas=replicas, budget_tokens=common["budget"],
                        max_new_tokens=common["max_new"], cost=common["cost"], policy=POLICIES[policy].cls.ENGINE,
                        prefill_chunk=common["prefill_chunk"], max_num_seqs=common["max_seqs"],
                        kv_cap=common.get("kv_cap"))


def _check_placement(placement: Any, n: int, replicas: int) -> np.ndarray:
    arr = np.asarray(placement)
    ok = arr.shape == (n,) and np.issubdtype(arr.dtype, np.integer)
    if not ok or (n and (arr.min() < 0 or arr.max() >= replicas)):
        raise InvalidArgument("placement", placement if arr.size <= 8 else f"an array of shape {arr.shape}",
                              f"{n} integers in [0, {replicas - 1}] (a replica per completion, in group order)")
    return arr.astype(np.int64)


def _prepare(groups, policy, replicas, budget_tokens, max_new_tokens, predicted, cost, seed, prefill_chunk, record,
             max_num_seqs=None, kv_cap=None, resumed=None):
    """Check a rollout's arguments; (spec, groups, lengths per group, flat lengths, owner group per
    completion, prompt keys, the keyword arguments the replica runners share). ``resumed`` (``run_rollout``'s):
    the runners' ``flat`` is then each completion's whole length (what it had plus what it has left, the
    engines' lengths), their ``pred`` still what is left (what the planners place) and ``resumed`` what it had;
    the flat lengths returned are what is left."""
    if not groups:
        raise InvalidArgument("groups", groups, "at least one group")
    if policy not in POLICIES:
        raise InvalidArgument("policy", policy, "one of " + ", ".join(POLICIES))
    spec = POLICIES[policy]
    if not spec.rollout:
        raise InvalidArgument("policy", policy, "a policy that runs rollouts (prompts in the pool): "
                                                + ", ".join(n for n, s in POLICIES.items() if s.rollout))
    check_int("replicas", replicas, minimum=1)
    budget = check_int("budget_tokens", budget_tokens, minimum=1)
    max_new = check_int("max_new_tokens", max_new_tokens, minimum=1)
    check_int("seed", seed, minimum=0)
    prefill_chunk = None if prefill_chunk is None else check_int("prefill_chunk", prefill_chunk, minimum=1)
    max_seqs = None if max_num_seqs is None else check_int("max_num_seqs", max_num_seqs, minimum=1)
    lengths = [as_lengths("lengths", g.lengths, minimum=1) for g in groups]
    flat = np.concatenate(lengths)
    if resumed is not None:
        resumed = as_lengths("resumed", resumed, minimum=0)
        if resumed.shape != flat.shape:
            raise InvalidArgument("resumed", f"{resumed.size} values", f"{flat.size} values, one per completion")
        if hasattr(predicted, "predict"):
            raise InvalidArgument("predicted", type(predicted).__name__, "predicted lengths (what each completion has "
                                                                        "left) or None with resumed")
    whole = flat if resumed is None else flat + resumed  # what the engines run: a resumed completion's whole length
    if whole.max() > max_new:
        raise InvalidArgument("lengths", int(whole.max()), f"lengths <= max_new_tokens={max_new}"
                              + ("" if resumed is None else " (with the tokens resumed)"))
    sizes = [len(x) for x in lengths]
    owner = np.repeat(np.arange(len(groups)), sizes)
    prompt_lens = np.array([check_int("prompt_len", g.prompt_len, minimum=0) for g in groups], dtype=np.int64)
    keys = [getattr(g, "prompt_id", i) for i, g in enumerate(groups)]
    job_keys = tuple(keys[g] for g in owner.tolist())
    cost = _cost(cost)
    pred, _, _ = _predictions(predicted, flat, max_new, 0.9, None, job_keys)
    block = spec.cls.block_size
    tails, prompt_kv = prompt_blocks(prompt_lens, block)
    # Every request must fit an empty pool: its prompt's blocks, its tail and its whole length (or what a
    # compressed cache keeps of it).
    held = whole if kv_cap is None else np.minimum(whole, kv_cap)
    need = prompt_kv[owner] + -(-(tails[owner] + held) // block) * block
    if need.max() > budget:
        bad = int(np.argmax(need))
        prompt = int(prompt_lens[owner[bad]])
        raise InvalidArgument("budget_tokens", budget, f"at least {int(need[bad])} tokens: completion {bad} "
                                                       f"({int(whole[bad])} tokens) with its prompt ({prompt} tokens) "
                                                       f"in blocks of {block}")
    common = dict(flat=whole, owner=owner, tails=tails, prompt_kv=prompt_kv, prompt_lens=prompt_lens, pred=pred,
                  job_keys=job_keys, max_new=max_new, budget=budget, prefill_chunk=prefill_chunk, record=record,
                  cost=cost, max_seqs=max_seqs, resumed=resumed)
    return spec, groups, lengths, flat, owner, keys, common


def _lower_bound(cost, flat: np.ndarray, owner: np.ndarray, prompt_lens: np.ndarray, budget: int,
                 replicas: int, *, conv: np.ndarray | None = None, answers: tuple[np.ndarray, np.ndarray] | None = None,
                 chain: int = 0, kv_cap: int | None = None) -> float:
    """A lower bound on the makespan (seconds) of any schedule of the step, the largest of:

    - the mean replica's share of all the work (each prompt prefilled once), over at least
      ``max(longest, KV area / pool)`` steps in all; the KV area (token-steps) counts each completion's
      own tokens (``l (l + 1) / 2``) and each prompt held while its longest completion runs;
    - the longest completion alone;
    - for the m longest completions (the shortest of them ``l_m`` tokens), held by some k <= min(R, m)
      replicas each of which runs at least ``l_m`` steps: the larger of the k replicas' mean share of
      those m completions over ``k * l_m`` steps, and every replica's mean share of all the work over
      at least ``k * l_m`` steps in all; the smaller over k (any k may be the one), the largest over m;
    - :func:`_packing_bound`: the work split between the replicas as well as it can be, each
      replica paying the fixed cost of as many steps as its longest completion (or its KV area
      over the pool) needs.

    It counts the steps' fixed costs (overhead, weight reads) once per replica that runs them.

    A multi-turn step (:func:`simulate.run_multiturn`) gives each turn as a completion of ``flat``, with
    ``conv``: per turn the conversation before it beyond the prompt (its session's earlier turns and tool
    answers), which its every decode row reads and holds; ``answers``: (tokens, attention pairs) of each tool
    answer, prefilled before the turn after it (at least: a conversation evicted meanwhile is prefilled again);
    ``chain``: the most tokens one session decodes (its turns one after another, a token a step).
    ``kv_cap``: a compressed cache (``run_rollout(compression=)``): each completion holds and reads at most
    that many of its own tokens (:func:`lengthsched.memory.held_token_steps`).
    """
    context = prompt_lens[owner] if conv is None else prompt_lens[owner] + conv
    held = 0 if conv is None else conv
    pf = (0, 0) if answers is None else (int(np.sum(answers[0])), int(np.sum(answers[1])))
    group_longest = np.zeros(len(prompt_lens), dtype=np.int64)
    np.maximum.at(group_longest, owner, flat)
    prompt_held = prompt_lens * group_longest  # token-steps: each prompt held while its longest completion runs
    area = int(held_token_steps(flat, kv_cap).sum()) + int(prompt_held.sum()) + int(np.sum(flat * held))  # token-steps
    steps_bound = max(int(flat.max()), int(chain), math.ceil(area / budget))
    prompts = [int(x) for x in prompt_lens]
    share = lower_bound_seconds(cost, flat, context=context, steps=steps_bound, prompt_lens=prompts,
                                prefill=pf, kv_cap=kv_cap) / replicas
    longest = int(np.argmax(flat))
    alone = lower_bound_seconds(cost, flat[longest:longest + 1], context=int(context[longest]),
                                steps=int(flat[longest]), prompt_lens=[int(prompt_lens[owner[longest]])], kv_cap=kv_cap)
    order = np.argsort(-flat, kind="stable")
    lengths, ctx = flat[order].astype(np.int64), np.asarray(context, dtype=np.int64)[order]
    tokens = np.cumsum(lengths)
    kv = np.cumsum(lengths * ctx + held_token_steps(lengths - 1, kv_cap))
    m = np.arange(1, len(lengths) + 1)
    pl = np.asarray(prompts, dtype=np.int64)
    n = len(lengths)
    everything = dict(decode_tokens=np.full(n, tokens[-1]), kv_tokens_read=np.full(n, kv[-1]),
                      prefill_tokens=np.full(n, pl.sum() + pf[0]),
                      prefill_context=np.full(n, (pl * (pl + 1) // 2).sum() + pf[1]))
    threshold = np.full(n, np.inf)
    for k in range(1, replicas + 1):
        steps = k * lengths
        held_k = cost.lower_bound_seconds(steps=steps, decode_tokens=tokens, kv_tokens_read=kv) / k
        total = cost.lower_bound_seconds(steps=np.maximum(steps, steps_bound), **everything) / replicas
        threshold = np.minimum(threshold, np.where(m >= k, np.maximum(held_k, total), np.inf))
    packed = _packing_bound(cost, flat, context, prompt_lens, prompt_held, budget, replicas, held=held,
                            answers=answers, kv_cap=kv_cap)
    return max(share, alone, float(threshold.max()), packed)


def _packing_bound(cost, flat: np.ndarray, context: np.ndarray, prompt_lens: np.ndarray, prompt_area: np.ndarray,
                   budget: int, replicas: int, mixes: int = 5, held: Any = 0,
                   answers: tuple[np.ndarray, np.ndarray] | None = None, kv_cap: int | None = None) -> float:
    """A lower bound (seconds) on the makespan: the best split of the work between ``replicas``
    replicas, where a replica's seconds are at least those of its steps' fixed costs plus its
    tokens' work, and its steps at least its longest completion and its KV area over ``budget``.

    Relaxed so that it can be solved exactly: (1) ``max(a, b) >= lam a + (1 - lam) b``, both for
    the steps (longest completion vs KV area / pool, ``lam``) and for a step's roofline (the
    memory side with the weight reads vs the compute side, ``mu``), which makes every replica's
    seconds ``C * (its longest completion) + (the sum of its items' work)``; (2) a completion's work
    may be split between replicas (each part pays for a replica that runs as many steps as the
    whole completion). Prompts (prefilled once, held while their longest completion runs) are
    items of length 0. For a makespan ``T`` the fewest replicas are then found greedily: fill a
    replica, whose room is ``T - C * (length of its first item)``, with the longest items first
    (moving a longer item's work into a replica in exchange for a shorter one's never raises
    another replica's longest item). The bound is the largest over the ``mixes x mixes`` grid of
    (lam, mu) of the smallest ``T`` the greedy fits in ``replicas`` replicas (bisection; the value
    returned is one the greedy refuses)."""
    pairs = None
    if answers is not None:  # the tool answers: prefilled, holding nothing of their own (length 0, as prompts)
        pairs = np.concatenate([prompt_lens * (prompt_lens + 1) / 2, np.asarray(answers[1], dtype=np.float64)])
        prompt_lens = np.concatenate([prompt_lens, np.asarray(answers[0], dtype=prompt_lens.dtype)])
        prompt_area = np.concatenate([prompt_area, np.zeros(len(answers[0]), dtype=prompt_area.dtype)])
    _, lengths, parts, terms, area = packing_items(cost, flat, context, budget, prompt_lens, prompt_area, held=held,
                                                   prompt_pairs=pairs, kv_cap=kv_cap)
    best = 0.0
    grid = np.linspace(0.0, 1.0, mixes)
    for mu in grid:
        for lam in grid:
            work, c = packing_mix(parts, terms, area, lam, mu)
            cum = np.concatenate([[0.0], np.cumsum(work)])
            lo, hi = best, c * lengths[0] + cum[-1]  # one replica holding everything fits
            if fractional_fits(cum, lengths, c, lo, replicas):
                continue
            while hi - lo > 1e-9 * hi:
                mid = (lo + hi) / 2
                lo, hi = (lo, mid) if fractional_fits(cum, lengths, c, mid, replicas) else (mid, hi)
            best = lo
    return best


def place_by_length_class(groups: Sequence[Group], replicas: int, lengths: Any, budget_tokens: int, cost,
                          lam: float = 1.0) -> np.ndarray:
    """The replica of every completion (flattened in group order) by
    :func:`lengthsched.placement.length_classes` on ``lengths`` (the true lengths for an oracle, or
    predictions): the completions sorted longest first and cut into one contiguous class per replica,
    so that the longest share few replicas (their steps are cheap: few rows) and the replicas of
    short completions run few steps (a replica pays a step's fixed cost for as many steps as its
    longest completion). ``lam`` (0 to 1) weighs a replica's longest completion (1) against its KV
    area over the pool (0)."""
    sizes = np.array([len(g.lengths) for g in groups], dtype=np.int64)
    lengths = np.asarray(lengths)
    if lengths.shape != (int(sizes.sum()),):
        raise InvalidArgument("lengths", f"shape {lengths.shape}", f"({int(sizes.sum())},): one per completion")
    context = np.repeat(np.array([g.prompt_len for g in groups], dtype=np.int64), sizes)
    return length_classes(lengths, context, replicas=replicas, budget_tokens=budget_tokens, cost=cost, lam=lam)


def _run_routed(policy, placement, online, replicas, **common):
    """Each replica on its own, with the requests ``placement`` gives it (``common``: as for
    :func:`_run_replica`)."""
    runs = [_run_replica(policy, np.flatnonzero(placement == r), online, **common) for r in range(replicas)]
    return [eng for eng, _ in runs], [clock for _, clock in runs]


def steal_ways(groups: Sequence[Any], pred: Any, budget_tokens: int, replicas: int, max_new_tokens: int,
               cls: Any = WorkStealing, prefill_share: float | None = None,
               kv_cap: int | None = None) -> tuple[np.ndarray, int]:
    """What a stealing policy with ``PLACE = "ways"`` (``cls``, default ``steal``'s ``WorkStealing``) places
    by: each completion's predicted work in tokens (flattened in group order; without predictions, as
    the replicas assume, ``max_new_tokens`` each) and over how many replicas each group is spread
    (:func:`lengthsched.integrations.rollout.spread_ways` with the class's ``PROMPT_SHARE`` and
    ``CROWDED_POOLS``, and ``prefill_share``; 1: whole groups). ``kv_cap`` (a compressed cache's most
    generated tokens held) with the class's ``CROWD_HELD``: the crowding rule weighs each completion's
    predicted tokens at most ``kv_cap``, what it holds; without ``CROWD_HELD`` (the default) the cache
    changes nothing here."""
    sizes = [len(g.lengths) for g in groups]
    work = np.full(sum(sizes), float(max_new_tokens)) if pred is None else np.asarray(pred, dtype=np.float64)
    crowd = work if kv_cap is None or not getattr(cls, "CROWD_HELD", False) else np.minimum(work, kv_cap)
    ways = spread_ways([int(g.prompt_len) for g, n in zip(groups, sizes) if n > 0], budget_tokens, replicas,
                       cls.PROMPT_SHARE, work_tokens=float(crowd.sum()), crowded=cls.CROWDED_POOLS,
                       prefill_share=prefill_share)
    return work, ways


#: The orders a stealing policy's queues can start in (``WorkStealing.ORDER``).
STEAL_ORDERS = ("placement", "longest", "longest_spread", "longest_crowded")


def share_board(pols: list, engines: list, board: list, delay: float) -> None:
    """Stealing replicas ``pols`` (one per engine of ``engines``) see every replica's queue (``board``, their
    waiting stacks), engine and policy, and share one array of predicted work (``pols[0]``'s: what a replica
    learns of a prompt, every replica uses); a stolen or moved request travels ``delay`` seconds (0: at once)."""
    work = pols[0].work
    inbox = [[] for _ in pols] if delay > 0 else []
    for pol in pols:
        pol.board, pol.engines, pol.pols, pol.work, pol.inbox = board, engines, pols, work, inbox
        pol.RESUBMIT_SECONDS = delay


def observe_board(pols: list, budget: int, snapshot: float | None = None) -> StealCoordinator:
    """``steal_observed`` replicas ``pols`` decide through one :class:`~lengthsched.integrations.StealCoordinator`
    (their class's chunk, steal share and room, their problem's compressed cache; each replica's pool ``budget``
    tokens), each looking at most every
    ``snapshot`` modelled seconds (None: the class's ``SNAPSHOT_SECONDS``). The caller tells it what it submits
    where; returns it."""
    cls = type(pols[0])
    coord = StealCoordinator(len(pols), budget, chunk=cls.MIGRATE_CHUNK, share=cls.STEAL_SHARE, room=cls.ROOM,
                             kv_cap=pols[0].problem.kv_cap)
    for pol in pols:
        pol.coord = coord
        if snapshot is not None:
            pol.SNAPSHOT_SECONDS = snapshot
    return coord


def _run_dispatch(policy, replicas, online, keys, groups, *, resubmit=None, snapshot=None, given=None, refill=None,
                  flat, owner, tails, prompt_kv, prompt_lens, pred, job_keys, max_new, budget, prefill_chunk, record,
                  cost, max_seqs=None, offload=None, kv_cap=None, resumed=None):
    """The replicas on one clock (modelled seconds): they pull from one global queue (Seer), or steal
    from each other's queues (``steal``; ``given``: the placement to steal over instead of the policy's).
    ``refill`` (a stealing policy): a :class:`Refill` whose ``plan`` places each batch of units it releases (verl's
    v1 stealing manager, :func:`run_verl_stealing`): ``plan(units, loads)`` with the predicted tokens of the units
    released and not finished on each replica where they were planned, returning the batch's requests in the order
    to queue them and each one's replica; they join the back of their replicas' queues. Returns the engines, the
    clocks, where each request finished (-1: never submitted) and, with ``refill``, when each unit was released."""
    cls = POLICIES[policy].cls
    ways = None  # with PLACE "ways": over how many replicas each group is spread
    if refill is not None and not cls.STEALS:
        raise InvalidArgument("refill", type(refill).__name__, f"None with policy {policy!r} (only the stealing "
                                                               "policies place a refill's batches as planned)")
    if cls.STEALS:  # placed before the step (cls.PLACE); replicas steal later
        if refill is not None:  # nothing before the refill's plan places its first batch
            placed = np.full(len(flat), -1, dtype=np.int64)
        elif given is not None:
            placed = given
        elif cls.PLACE == "time":
            placed = place_by_time(groups, replicas, pred, budget, cost, max_new)
        elif cls.PLACE == "classes":  # steal_classes: placed_classes's placement
            placed = _plan_classes(policy, replicas, owner, dict(pred=pred, max_new=max_new, prompt_lens=prompt_lens,
                                                                 budget=budget, cost=cost, prefill_chunk=prefill_chunk,
                                                                 max_seqs=max_seqs, kv_cap=kv_cap))
        elif cls.PLACE == "ways":  # each group over as many replicas as the pools hold its prompts
            work, ways = steal_ways(groups, pred, budget, replicas, max_new, cls, kv_cap=kv_cap)
            placed = place_ways(work, [len(g.lengths) for g in groups], replicas, ways)
        else:
            placed = route(groups, "least_loaded", replicas, pred, True, cls.PROMPT_SHARE, budget)
        queue = GroupQueue(np.zeros(0, dtype=np.int64), [])
    else:  # Seer: nothing is known of a group before its probe finishes
        queue = GroupQueue(owner, np.full(len(keys), float(max_new)), probes=cls.PROBES)
    problem = Problem(lengths=flat, max_new_tokens=max_new, budget_tokens=budget,
                      predicted=resumed_predictions(pred, resumed), slots=max_seqs,
                      predictor=None if online is None else copy_predictor(online), prompt_ids=job_keys, kv_cap=kv_cap)
    engines, pols = [], []
    for r in range(replicas):
        pol = cls(problem, queue, r, keys)
        eng = _engine(flat, owner, tails, prompt_kv, prompt_lens, budget, prefill_chunk, record, pol.block_size,
                      offload, cost, transfers=POLICIES[policy].loads, kv_cap=kv_cap, resumed=resumed)
        eng.start(pol)
        engines.append(eng)
        pols.append(pol)
    if cls.STEALS:
        board = []
        order = cls.ORDER if replicas > 1 else cls.ORDER_ONE_REPLICA
        if order not in STEAL_ORDERS:
            raise InvalidArgument("ORDER" if replicas > 1 else "ORDER_ONE_REPLICA", order,
                                  f"one of {', '.join(map(repr, STEAL_ORDERS))} ({cls.__name__}'s queue order)")
        if order == "longest_spread":  # longest first where groups are spread, else the placement's order
            order = "longest" if ways is not None and ways > 1 else "placement"
        elif order == "longest_crowded":  # longest first where whole groups are placed, else the placement's
            order = "longest" if ways == 1 else "placement"
        for r, (pol, eng) in enumerate(zip(pols, engines)):
            mine = np.flatnonzero(placed == r)
            if order == "longest":  # longest predicted first (ties: placement order)
                mine = mine[np.argsort(-pols[0].work[mine], kind="stable")]
            mine = mine.tolist()
            pol.waiting = mine[::-1]  # a stack: the front is the end
            board.append(pol.waiting)
            for job in mine:
                eng.claim(job)
        share_board(pols, engines, board, cls.RESUBMIT_SECONDS if resubmit is None else resubmit)
        coord = None
        if hasattr(pols[0], "coord"):  # steal_observed: one coordinator, told what was submitted where
            coord = observe_board(pols, budget, snapshot)
            for r, stack in enumerate(board):
                for job in stack[::-1]:  # queue order
                    coord.submit(job, r, float(pols[0].work[job]), prompt_tokens=int(prompt_lens[owner[job]]),
                                 group=int(owner[job]))
    dispatcher = Dispatcher(queue, [] if cls.STEALS else pols)
    for pol in pols:
        if hasattr(pol, "dispatcher"):  # Seer's divided rollout gives requests back while it decides
            pol.dispatcher = dispatcher
    clock = _OneClock(engines)
    idle, wake, wake_later = clock.idle, clock.wake, clock.at  # wake_later: asleep until a given second
    releases, seen = None, [0] * replicas
    if refill is not None:
        def planned(units: range, now: float) -> np.ndarray:  # the plan's batch, queued on its replicas at ``now``
            work = pols[0].work
            live = (placed >= 0) & (releases.left[releases.unit] > 0)  # released, its unit not finished
            loads = np.bincount(placed[live], weights=work[live], minlength=replicas)
            jobs, where = refill.plan(units, loads)
            jobs, where = np.asarray(jobs, dtype=np.int64), np.asarray(where, dtype=np.int64)
            if len(jobs) != len(where) or ((where < 0) | (where >= replicas)).any():
                raise InvalidArgument("refill", "a plan that leaves a request unplaced", f"a replica below "
                                      f"{replicas} for every request (a stealing policy runs what the plan places)")
            for job, r in zip(jobs.tolist(), where.tolist()):
                placed[job] = r
                pols[r].waiting.insert(0, job)  # the back of its queue (a stack: the front is the end)
                engines[r].claim(job)
                if coord is not None:
                    coord.submit(job, r, float(work[job]), prompt_tokens=int(prompt_lens[owner[job]]),
                                 group=int(owner[job]))
            wake(set(where.tolist()), now)
            return jobs

        releases = _Releases(refill, owner, planned)
        releases.release(0.0)

    while clock.heap:
        now, r = heapq.heappop(clock.heap)
        if r < 0:  # a poll of the framework (a Refill with poll): its rule releases what it asks for now
            releases.poll(now)
            continue
        wake(dispatcher.assign(), now)
        eng, pol = engines[r], pols[r]
        if releases is not None and len(eng.collected) > seen[r]:  # finished since its last decision
            releases.finished(eng.collected[seen[r]:], now, clock.heap)
            seen[r] = len(eng.collected)
        pol.idle_now = idle  # the replicas asleep now (steal's moves of running requests go there)
        pol.now = now
        alive = eng.decide(pol)
        if getattr(pol, "woke", None):  # the requests it gave back went to these replicas
            wake(pol.woke, now)
            pol.woke = []
        if getattr(pol, "wake_at", None):  # requests in transit (RESUBMIT_SECONDS): wake their targets then
            for other, at in pol.wake_at:
                if other in idle:
                    idle.discard(other)
                    wake_later(other, at)
            pol.wake_at = []
        if not alive:
            ran_dry(pol, eng)
            if getattr(pol, "in_transit", None) and pol.in_transit():  # asleep until the first one lands
                wake_later(r, pol.inbox[r][0][0])
            else:
                idle.add(r)
            continue
        if cls.STEALS and pol.blocked and idle:  # work waits here for memory: the idle may steal it
            wake(list(idle), now)
        clock.run(r, eng.next_event(), pol.pads, cost, now)
    if len(queue):
        raise InvalidArgument("policy", policy, "a dispatching policy that starts every request")
    placement = np.zeros(len(flat), dtype=np.int64) if refill is None else np.full(len(flat), -1, dtype=np.int64)
    for r, eng in enumerate(engines):
        placement[np.asarray(eng.collected, dtype=np.int64)] = r  # where each finished
    if refill is not None and (placement[placed >= 0] < 0).any():
        raise InvalidArgument("policy", policy, "a stealing policy that finishes every request it is sent")
    return engines, clock.clocks(), placement, None if releases is None else releases.seconds
