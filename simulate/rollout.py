"""``run_rollout``: an RL rollout step, B prompts x G completions on R engine replicas, in seconds.

A rollout step ends when the last completion on the last replica finishes (the makespan). Each
replica is an engine with its own KV pool of ``budget_tokens`` tokens, prompts included: a prompt's
KV is prefilled and held (once, shared by its siblings there) on every replica that runs one of its
completions, so spreading a group over replicas costs prefill and memory. Requests are placed on
replicas by a router, or by the policy itself when it plans the placement:

- ``least_loaded``, verl's rollout server manager: each request (one sample of a group) goes to the
  replica with the fewest requests in flight (verl/experimental/agent_loop/agent_loop.py,
  ``AsyncLLMServerManager._choose_server``, verl 0.5-0.9: a heap of (load, replica), ties to the
  lower index). All requests of a step are submitted at once, before any finishes, so request k of
  the step goes to replica k mod R: a group's G samples are spread over the replicas.
- ``group_round_robin``, OpenRLHF's: a whole group (its G samples) to one engine, round robin.
- a policy with ``places_groups`` (``placed_lpt``) balances the groups' predicted work over the
  replicas with the partitioning core (the better of LPT and Karmarkar-Karp, on predicted tokens),
  and ignores ``router``; ``placed_adaptive`` spreads requests as verl does unless holding every
  prompt on every replica would take more than a quarter of a replica's pool, then places whole
  groups as ``placed_lpt`` does (both over vLLM's FCFS engine for ``placed_adaptive``).

Simplifications (documented in docs/simulate.md): placement is decided once at the start (no
rebalancing while replicas drain; Seer-like context-aware scheduling is not modelled yet); a
replica holds the prompts of all its groups for the whole step (an upper bound on the memory they
take: an engine may evict a finished group's prompt); each replica is simulated by ``run_batch``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lengthsched import InvalidArgument, partition
from lengthsched.errors import as_lengths, check_int
from lengthsched.runtime import POLICIES
from lengthsched.runtime.timing import DEFAULT_PREFILL_CHUNK, default_cost, lower_bound_seconds

from .run import run_batch
from .workloads import Group

__all__ = ["ROUTERS", "RolloutResult", "run_rollout", "route"]

ROUTERS = ("least_loaded", "group_round_robin")


@dataclass(frozen=True)
class RolloutResult:
    """One rollout step. ``seconds``: the makespan (the last replica's finish, modelled);
    ``replica_seconds``: each replica's; ``steps``: decode steps of the slowest replica;
    ``preemptions``, ``recomputed_tokens``, ``prefill_tokens``: summed over replicas;
    ``lower_bound_seconds``: no placement and schedule can finish sooner; ``collected_lengths``:
    per group, in index order (tokens); ``placement``: the replica of every completion, flattened
    in group order."""

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
    raise InvalidArgument("router", router, "one of " + ", ".join(ROUTERS))


def run_rollout(groups: Sequence[Any], policy: str, *, replicas: int = 1, router: str | None = None,
                budget_tokens: int, max_new_tokens: int, predicted: Any = None, cost: Any = None, seed: int = 0,
                prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK) -> RolloutResult:
    """Simulate one rollout step: ``groups`` (objects with ``lengths``, ``prompt_len`` and
    ``prompt_id``, e.g. :class:`simulate.Group`) on ``replicas`` engines under ``policy`` (a name of
    ``lengthsched.runtime.POLICIES``), placed by ``router`` (:data:`ROUTERS`, default
    ``least_loaded``) unless the policy places groups itself. ``budget_tokens``: each replica's KV
    pool in tokens, prompts included. ``predicted``: predicted lengths per completion, flattened in
    group order (a prompt-level predictor gives siblings the same number), or None, or a predictor
    that learns online (``lengthsched.OnlineLengthPredictor``, asked about each group's
    ``prompt_id``): each replica then runs a copy of it that learns from the siblings finishing there
    (placement uses its predictions before anything finished). ``cost``: the
    step-cost model (default Qwen3-1.7B on the H100 preset). Returns a :class:`RolloutResult`."""
    if not groups:
        raise InvalidArgument("groups", groups, "at least one group")
    if policy not in POLICIES:
        raise InvalidArgument("policy", policy, "one of " + ", ".join(POLICIES))
    spec = POLICIES[policy]
    if not spec.unbiased:
        raise InvalidArgument("policy", policy, "a policy that collects every completion it launches")
    replicas = check_int("replicas", replicas, minimum=1)
    budget = check_int("budget_tokens", budget_tokens, minimum=1)
    max_new = check_int("max_new_tokens", max_new_tokens, minimum=1)
    router = "least_loaded" if router is None else router
    if router not in ROUTERS:
        raise InvalidArgument("router", router, "one of " + ", ".join(ROUTERS))
    lengths = [as_lengths("lengths", g.lengths, minimum=1) for g in groups]
    flat = np.concatenate(lengths)
    pred, online = None, None
    if hasattr(predicted, "observe"):  # a predictor that learns online: a copy per replica learns there
        online = predicted
        keys = [g.prompt_id for g, x in zip(groups, lengths) for _ in range(len(x))]
        pred = np.maximum(1, np.asarray(online.predict(keys).lengths, dtype=np.int64))
    elif predicted is not None:
        pred = as_lengths("predicted", predicted, minimum=1)
        if len(pred) != len(flat):
            raise InvalidArgument("predicted", f"{len(pred)} values", f"{len(flat)}, one per completion in group order")
    cost = default_cost() if cost is None else cost
    placement = route(groups, router, replicas, pred, spec.places_groups,
                      getattr(spec.cls, "PROMPT_SHARE", None), budget)
    owner = np.repeat(np.arange(len(groups)), [len(x) for x in lengths])
    results, replica_seconds = [], []
    for r in range(replicas):
        mine = np.flatnonzero(placement == r)
        if not len(mine):
            replica_seconds.append(0.0)
            continue
        hosted = sorted(set(owner[mine].tolist()))
        prompts = sum(int(groups[g].prompt_len) for g in hosted)
        room = budget - prompts
        if room < int(flat[mine].max()):
            raise InvalidArgument("budget_tokens", budget,
                                  f"room on replica {r} for its {len(hosted)} prompts ({prompts} tokens) and its "
                                  f"longest completion ({int(flat[mine].max())} tokens)")
        sub = [Group(groups[g].prompt_id, groups[g].prompt_len, flat[mine[owner[mine] == g]]) for g in hosted]
        if online is not None:
            given = copy.deepcopy(online)
        else:
            given = None if pred is None else np.concatenate([pred[mine[owner[mine] == g]] for g in hosted])
        res = run_batch(sub, policy, budget_tokens=room, max_new_tokens=max_new, predicted=given, cost=cost,
                        seed=seed + r, prefill_chunk=prefill_chunk)
        if len(res.collected_lengths) != len(mine):
            raise InvalidArgument("policy", policy, "a policy that collects every completion it launches")
        results.append(res)
        replica_seconds.append(res.seconds)
    steps_bound = max(int(flat.max()), math.ceil(int((flat * (flat + 1)).sum()) / (2 * budget)))
    prompts_once = [int(g.prompt_len) for g in groups]
    context = np.concatenate([np.full(len(x), int(g.prompt_len)) for x, g in zip(lengths, groups)])
    # Makespan >= the mean replica's share of all the work, and >= one longest completion alone.
    share = lower_bound_seconds(cost, flat, context=context, steps=steps_bound, prompt_lens=prompts_once) / replicas
    longest = int(np.argmax(flat))
    alone = lower_bound_seconds(cost, flat[longest:longest + 1], context=int(context[longest]), steps=int(flat[longest]),
                                prompt_lens=[int(context[longest])])
    return RolloutResult(
        policy=policy, router="placed" if spec.places_groups else router, replicas=replicas,
        seconds=max(replica_seconds), replica_seconds=tuple(replica_seconds),
        steps=max(r.steps for r in results), preemptions=sum(r.preemptions for r in results),
        recomputed_tokens=sum(r.recomputed_tokens for r in results),
        prefill_tokens=sum(r.prefill_tokens for r in results), lower_bound_seconds=max(share, alone),
        tokens=int(flat.sum()), budget_tokens=budget, cost_name=results[0].cost_name,
        collected_lengths=tuple(lengths), placement=placement)
