"""One engine replica of a rollout step, simulated on its own, and the length-class planner that
judges candidate placements with it (numpy only).

``simulate.run_rollout`` runs every routed replica through :func:`run_replica`; the integrations plan
``placement="classes"`` with :func:`plan_classes`, the same code as the simulator's ``placed_classes``.
A replica's KV pool holds its prompts (``Engine.hold_prompts``): with blocks of ``block`` tokens a
prompt's whole blocks are shared by its siblings and its last partial block (its ``tail``) is
copied into each sequence, as vLLM's prefix cache shares full blocks only.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import InvalidArgument, check_int
from ..placement import check_group, estimate_seconds, plan_length_classes
from ..predictor import copy_predictor
from .engine import Engine
from .policies import Problem
from .registry import POLICIES, make_policy
from .timing import DEFAULT_PREFILL_CHUNK

__all__ = ["plan_classes", "prompt_blocks", "run_replica"]


def prompt_blocks(prompt_lens: Any, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(per prompt, its tail: tokens past its last whole block, copied into each sequence; the KV
    tokens of its whole blocks, held once per replica). ``block`` 1: no tails."""
    pl = np.asarray(prompt_lens, dtype=np.int64)
    tails = pl % block if block > 1 else np.zeros(len(pl), dtype=np.int64)
    return tails, pl - tails


def engine_clock(eng: Engine, cost: Any) -> tuple[np.ndarray, np.ndarray]:
    """(step at the end of each run of steps, modelled seconds then), starting at (0, 0)."""
    log = eng.step_log()
    ends = np.concatenate([[0], np.cumsum(log.steps)])
    secs = np.concatenate([[0.0], np.cumsum(cost.segment_seconds(*(getattr(log, f) for f in log.FIELDS)))])
    return ends, secs


OFFLOAD_MODES = ("async", "stall")  # how a KV load from host memory is timed (run_rollout's kv_offload)


def async_load_steps(cost: Any):
    """``Engine.load_steps`` for ``cost`` (a :class:`lengthsched.cost.StepCost`): a load of ``tokens`` KV
    tokens takes its seconds over the host link (:meth:`~lengthsched.cost.StepCost.load_seconds`) over
    the seconds of the engine's next decode step as it stands (its live rows and the KV they read)."""
    def steps(eng: Engine, tokens: int) -> float:
        step = cost.segment_seconds_float(1, max(eng.live, 1), eng.read_tokens())
        return float(cost.load_seconds(tokens)) / step if step > 0 else 1.0
    return steps


def replica_engine(flat, owner, tails, prompt_kv, prompt_lens, budget, prefill_chunk, record, block,
                   offload: str | None = None, cost: Any = None, transfers: str = "stall",
                   kv_cap: int | None = None, resumed: Any = None) -> Engine:
    """An engine for the completions ``flat`` (tokens) of the prompts ``owner`` indexes, with their
    prompts held in its pool; ``offload``: preempted requests' KV kept in host memory and loaded back
    (``Engine.offload``), each load asynchronous (``"async"``, vLLM's: timed by ``cost``,
    :func:`async_load_steps`) or charged to the step that admits it (``"stall"``); None: recomputed.
    ``transfers``: how KV loaded from a global pool (``Engine.transferred``: a policy's moves with their
    KV) is timed, one of the same two. An engine times all its loads one way: asynchronously if either
    asks for it. ``kv_cap``: a compressed cache (``Engine.kv_cap``). ``resumed``: per completion, the tokens it
    generated before this run (``flat`` counts them): it starts as a preempted sequence does (``Engine.done``),
    its KV recomputed when first admitted (None: none)."""
    eng = Engine(flat, tails=tails[owner] if block > 1 else None, block_size=block, budget_tokens=budget,
                 enforce_budget=True, record=record, context=prompt_lens[owner], prefill_chunk=prefill_chunk,
                 kv_cap=kv_cap)
    if resumed is not None:
        eng.done = [int(x) for x in resumed]
    eng.hold_prompts(owner, prompt_kv)
    if offload is not None and offload not in OFFLOAD_MODES:
        raise InvalidArgument("offload", offload, "None or one of " + ", ".join(OFFLOAD_MODES))
    if transfers not in OFFLOAD_MODES:
        raise InvalidArgument("transfers", transfers, "one of " + ", ".join(OFFLOAD_MODES))
    eng.offload = offload is not None
    if "async" in (offload, transfers):
        if cost is None:
            raise InvalidArgument("cost", cost, "a StepCost with asynchronous loads (it times them)")
        eng.load_steps = async_load_steps(cost)
    return eng


def resumed_predictions(pred: Any, resumed: Any) -> Any:
    """What a policy is told of completions that resume (:func:`replica_engine`'s ``resumed``): ``pred`` (tokens
    each has left, predicted) plus what each had, as it is told a preempted sequence's whole predicted length."""
    return pred if resumed is None or pred is None else np.asarray(pred) + resumed


def run_replica(policy, mine, online, *, flat, owner, tails, prompt_kv, prompt_lens, pred, job_keys, max_new, budget,
                prefill_chunk, record, cost, max_seqs=None, offload=None, kv_cap=None, resumed=None):
    """One replica running the requests ``mine`` (indices into ``flat``) under ``policy``: (engine,
    clock). ``online``: a predictor that learns from the finishes (a copy is used), or None;
    ``max_seqs``: requests it runs at once at most (None: the pool alone limits them); ``offload``,
    ``kv_cap``, ``resumed``: as :func:`replica_engine`'s (``flat`` counts ``resumed``, ``pred`` does not:
    the policy is told :func:`resumed_predictions`)."""
    if not len(mine):  # a replica that got nothing
        return Engine([], budget_tokens=budget, record=record), (np.zeros(1), np.zeros(1))
    hosted, local = np.unique(owner[mine], return_inverse=True)
    problem = Problem(lengths=flat[mine], max_new_tokens=max_new, budget_tokens=budget, slots=max_seqs,
                      predicted=None if pred is None else resumed_predictions(pred, resumed)[mine],
                      predictor=None if online is None else copy_predictor(online),
                      prompt_ids=tuple(job_keys[j] for j in mine.tolist()), kv_cap=kv_cap)
    sim = make_policy(policy, problem)
    eng = replica_engine(flat[mine], local, tails[hosted], prompt_kv[hosted], prompt_lens[hosted], budget,
                         prefill_chunk, record, sim.block_size, offload, cost, kv_cap=kv_cap,
                         resumed=None if resumed is None else resumed[mine])
    for job in range(len(mine)):
        eng.claim(job)
    eng.run(sim)
    eng.collected = [int(mine[j]) for j in eng.collected]  # global indices
    if eng.timeline is not None:
        eng.timeline.segments = [(int(mine[j]), *rest) for j, *rest in eng.timeline.segments]
    return eng, engine_clock(eng, cost)


def plan_classes(predicted: Any, group: Any, prompt_lens: Any, *, replicas: int, budget_tokens: int,
                 max_new_tokens: int, cost: Any, policy: str = "vllm_priority",
                 prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK, max_num_seqs: int | None = None,
                 kv_cap: int | None = None) -> np.ndarray:
    """The replica of every completion for a step planned in length classes: the candidates of
    :func:`lengthsched.placement.plan_length_classes` and verl's spread (completion i to replica
    i mod ``replicas``), each judged by simulating the step with ``policy`` on every replica on the
    predicted lengths (all the planner knows); the fastest there (ties: the classes). A candidate
    stops being simulated once one of its replicas (the most loaded first, by
    :func:`lengthsched.placement.estimate_seconds`) ends after the best so far.

    Args:
        predicted: per completion, its predicted length in tokens (clipped to 1..max_new_tokens).
        group: per completion, the index of its prompt in ``prompt_lens``.
        prompt_lens: per prompt, its length in tokens.
        replicas: engine replicas; budget_tokens: each one's KV pool in tokens, prompts included.
        max_new_tokens: the longest a completion may be (tokens).
        cost: a :class:`lengthsched.cost.StepCost`.
        policy: the engine policy of every replica (a name of ``POLICIES`` that runs rollouts).
        prefill_chunk: tokens prefilled per step at most (None: no limit).
        max_num_seqs: requests a replica runs at once at most (None: the pool alone limits them).
        kv_cap: a compressed cache's most generated tokens a completion holds and reads (Sparse-RL's
            ``KVCompression.max_retained``): the classes, their estimates and the simulated engines count
            that (None: all of them).
    """
    if policy not in POLICIES or not POLICIES[policy].rollout or POLICIES[policy].places_groups:
        raise InvalidArgument("policy", policy, "an engine policy that runs rollouts on a replica: " + ", ".join(
            n for n, s in POLICIES.items() if s.rollout and not s.places_groups))
    replicas = check_int("replicas", replicas, minimum=1)
    budget = check_int("budget_tokens", budget_tokens, minimum=1)
    max_new = check_int("max_new_tokens", max_new_tokens, minimum=1)
    pred = np.asarray(predicted, dtype=np.float64)
    if pred.ndim != 1 or not len(pred) or not np.all(np.isfinite(pred)):
        raise InvalidArgument("predicted", f"an array of shape {pred.shape}", "one finite length per completion")
    believed = np.clip(np.round(pred), 1, max_new).astype(np.int64)
    pl = np.asarray(prompt_lens, dtype=np.int64)
    group = check_group(group, believed.shape, len(pl))
    tails, prompt_kv = prompt_blocks(pl, POLICIES[policy].cls.block_size)
    model = dict(flat=believed, owner=group, tails=tails, prompt_kv=prompt_kv, prompt_lens=pl,
                 pred=believed, job_keys=tuple(group.tolist()), max_new=max_new, budget=budget,
                 prefill_chunk=prefill_chunk, record=False, cost=cost,
                 max_seqs=None if max_num_seqs is None else check_int("max_num_seqs", max_num_seqs, minimum=1),
                 kv_cap=None if kv_cap is None else check_int("kv_cap", kv_cap, minimum=1))
    seen: dict[bytes, float] = {}
    best = [math.inf]

    def evaluate(placed: np.ndarray) -> float:
        key = placed.tobytes()
        if key not in seen:
            est = estimate_seconds(placed, believed, group, pl, replicas=replicas, budget_tokens=budget, cost=cost,
                                   kv_cap=model["kv_cap"])
            worst = 0.0
            for r in np.argsort(-est, kind="stable"):
                _, (_, secs) = run_replica(policy, np.flatnonzero(placed == r), None, **model)
                worst = max(worst, float(secs[-1]))
                if worst >= best[0]:
                    break  # it loses anyway
            seen[key] = worst
            best[0] = min(best[0], worst)
        return seen[key]

    classes = plan_length_classes(believed, group, pl, replicas=replicas, budget_tokens=budget, cost=cost,
                                  evaluate=evaluate, kv_cap=model["kv_cap"])
    spread = np.arange(len(believed), dtype=np.int64) % replicas
    return spread if evaluate(spread) < evaluate(classes) * (1 - 1e-12) else classes
