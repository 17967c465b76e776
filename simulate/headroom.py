"""How much faster a rollout step could be with perfect knowledge: a search over placements.

:func:`search_placement` looks for the placement of a rollout's requests on its replicas that
minimises the modelled makespan when every replica runs a routed engine policy (vLLM FCFS, or
vLLM's priority policy with the true lengths as priorities: longest first), knowing every
completion's TRUE length. It starts from the best of six placements (verl's spread, whole groups
balanced by true tokens, :func:`simulate.place_by_time` with true lengths, and
:func:`simulate.place_by_length_class` with true lengths for ``lam`` 0, 0.5 and 1: the longest
completions gathered on few replicas) and then moves or swaps
single requests between the slowest replica and another one, keeping a change when the slower of
the two replicas finishes earlier than the slowest did. Routed replicas do not interact, so each
try simulates only the two replicas it changes.

It is an oracle and a local search: its makespan is achievable (it is a simulated schedule, not a
bound) by a router that knew every length in advance, and a better placement may exist. Set beside
a policy's makespan and the lower bound (``RolloutResult.lower_bound_seconds``), it splits the gap
between the baseline and the bound into what placement could have bought and what no placement
over these engines buys (``benchmarks/bench_simulate.py --sections rollout_headroom``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lengthsched import InvalidArgument
from lengthsched.errors import check_int
from lengthsched.runtime.timing import DEFAULT_PREFILL_CHUNK

from .rollout import _prepare, _run_replica, place_by_length_class, place_by_time, route
from .run import compression_cap

__all__ = ["PlacementSearch", "search_placement"]

SEARCH_POLICIES = ("vllm", "vllm_priority")


@dataclass(frozen=True)
class PlacementSearch:
    """The best placement found. ``placement``: the replica of every completion (flattened in
    group order); ``seconds``: its modelled makespan; ``replica_seconds``: each replica's;
    ``start``: the starting placement it came from (``spread``, ``groups``, ``time`` or ``classes``
    followed by the ``lam`` of :func:`simulate.place_by_length_class`) and
    ``start_seconds`` its makespan; ``evaluations``: replica simulations run; ``accepted``: changes
    kept."""

    placement: np.ndarray
    seconds: float
    replica_seconds: tuple[float, ...]
    start: str
    start_seconds: float
    evaluations: int
    accepted: int


def search_placement(groups: Sequence[Any], *, replicas: int, budget_tokens: int, max_new_tokens: int,
                     policy: str = "vllm", cost: Any = None, evaluations: int = 200, seed: int = 0,
                     prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
                     max_num_seqs: int | None = None, compression: Any = None) -> PlacementSearch:
    """Search placements of ``groups`` (as for :func:`simulate.run_rollout`) on ``replicas`` engines
    running ``policy`` (``vllm`` or ``vllm_priority``; the latter is given the true lengths as
    predictions) for the smallest modelled makespan, with the true lengths known (an oracle).
    ``evaluations``: the most replica simulations after the starting placements (each try costs
    two); ``seed``: the search's random choices; ``max_num_seqs``, ``compression`` (a compressed cache: every
    replica simulated with it; the starting placements still weigh whole lengths): as for ``run_rollout``. Returns a
    :class:`PlacementSearch`; its ``placement`` passed to ``run_rollout(..., placement=)`` (with the
    same ``max_num_seqs`` and ``compression``) reproduces ``seconds``."""
    if policy not in SEARCH_POLICIES:
        raise InvalidArgument("policy", policy, "one of " + ", ".join(SEARCH_POLICIES))
    evaluations = check_int("evaluations", evaluations, minimum=0)
    check_int("seed", seed, minimum=0)
    oracle = None if not groups else np.concatenate([np.asarray(g.lengths) for g in groups])
    kv_cap = compression_cap(compression, policy, rollout=True)
    spec, groups, _, flat, owner, _, common = _prepare(
        groups, policy, replicas, budget_tokens, max_new_tokens, oracle, cost, seed, prefill_chunk, False, max_num_seqs,
        kv_cap=kv_cap)
    common["kv_cap"] = kv_cap
    rng = np.random.default_rng(seed)

    def run(mine: np.ndarray) -> float:
        _, (_, secs) = _run_replica(policy, np.sort(mine), None, **common)
        return float(secs[-1])

    starts = {
        "spread": route(groups, "least_loaded", replicas),
        "groups": route(groups, "least_loaded", replicas, flat, True),
        "time": place_by_time(groups, replicas, flat, common["budget"], common["cost"], common["max_new"]),
    } | {f"classes {lam:g}": place_by_length_class(groups, replicas, flat, common["budget"], common["cost"], lam)
         for lam in (0.0, 0.5, 1.0)}
    best_name, best, best_secs = None, None, None
    for name, placement in starts.items():
        secs = [run(np.flatnonzero(placement == r)) for r in range(replicas)]
        if best_secs is None or max(secs) < max(best_secs):
            best_name, best, best_secs = name, placement.copy(), secs
    start_seconds = max(best_secs)
    members = [list(np.flatnonzero(best == r)) for r in range(replicas)]
    used = accepted = 0
    while replicas > 1 and used + 2 <= evaluations:
        slow = int(np.argmax(best_secs))
        if len(members[slow]) <= 1:
            break  # the slowest runs one request alone: wherever it goes, its replica takes as long
        other = int(np.argmin(best_secs)) if rng.random() < 0.5 else int(rng.choice(
            [r for r in range(replicas) if r != slow]))
        mine, theirs = members[slow], members[other]
        if rng.random() < 0.5 or not mine:  # pick among the longest on the slow replica, or any
            j = mine[int(rng.integers(len(mine)))] if mine else None
        else:
            top = sorted(mine, key=lambda x: -int(flat[x]))[: max(1, len(mine) // 8)]
            j = top[int(rng.integers(len(top)))]
        if j is None:
            break
        new_mine = [x for x in mine if x != j]
        if theirs and rng.random() < 0.5:  # swap j for a shorter request of the other replica
            shorter = [x for x in theirs if flat[x] < flat[j]]
            if not shorter:
                continue
            k = shorter[int(rng.integers(len(shorter)))]
            new_mine = new_mine + [k]
            new_theirs = [x for x in theirs if x != k] + [j]
        else:
            new_theirs = theirs + [j]
        a = run(np.asarray(new_mine, dtype=np.int64)) if new_mine else 0.0
        b = run(np.asarray(new_theirs, dtype=np.int64))
        used += 2
        if max(a, b) < best_secs[slow] * (1 - 1e-9):
            members[slow], members[other] = new_mine, new_theirs
            best_secs[slow], best_secs[other] = a, b
            accepted += 1
    placement = np.zeros(len(flat), dtype=np.int64)
    for r, mine in enumerate(members):
        placement[np.asarray(mine, dtype=np.int64)] = r
    return PlacementSearch(placement=placement, seconds=float(max(best_secs)),
                           replica_seconds=tuple(float(x) for x in best_secs), start=best_name,
                           start_seconds=float(start_seconds), evaluations=used, accepted=accepted)
