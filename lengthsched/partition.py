"""Balanced k-way partition (P_k || C_max) of predicted lengths: the fixed-slot plan.

With k slots that run their completions back to back, the number of decode steps of a slot is the
sum of its lengths, so the group's step count is the largest part sum (the makespan). Every
function returns a :class:`Partition` that carries its makespan, a lower bound on the optimum and
their ratio, so a caller always knows how good the plan is.

- :func:`fptas`: (1 + eps)-approximation, time polynomial in n and 1/eps for fixed k.
- :func:`lpt`: longest processing time first, a 4/3 - 1/(3k) approximation, O(n log n).
- :func:`karmarkar_karp`: k-way largest differencing, a strong heuristic, O(n log n + n k log k).
- :func:`exact`: OR-Tools CP-SAT (extra ``lengthsched[exact]``); the oracle of the tests.
- :func:`lower_bound`: max(p_max, ceil(sum / k), and the pigeonhole bounds on the largest jobs).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import LengthschedError, as_lengths, check_int, check_positive_float

__all__ = [
    "Partition",
    "StateLimitExceeded",
    "fptas",
    "lpt",
    "karmarkar_karp",
    "exact",
    "lower_bound",
    "best_heuristic",
]


class StateLimitExceeded(LengthschedError):
    """The FPTAS dynamic programme would hold more states than ``max_states``."""


@dataclass(frozen=True)
class Partition:
    """An assignment of n jobs (completion indices) to k parts (slots).

    ``parts[j]`` lists the job indices of part j in the order the algorithm placed them;
    ``loads[j]`` is their size sum (tokens = decode steps). ``lower_bound`` is a proven lower
    bound on the optimal makespan; ``proven_optimal`` is set when makespan == lower bound or CP-SAT
    proved it.
    """

    parts: tuple[tuple[int, ...], ...]
    loads: tuple[int, ...]
    makespan: int
    lower_bound: int
    algorithm: str
    proven_optimal: bool = False

    @property
    def ratio(self) -> float:
        """makespan / lower_bound (>= 1; 1.0 for an empty or all-zero instance)."""
        return self.makespan / self.lower_bound if self.lower_bound else 1.0

    @property
    def k(self) -> int:
        return len(self.parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "parts": [list(p) for p in self.parts],
            "loads": list(self.loads),
            "makespan": self.makespan,
            "lower_bound": self.lower_bound,
            "ratio": self.ratio,
            "algorithm": self.algorithm,
            "proven_optimal": self.proven_optimal,
        }


def _check(sizes: Any, k: Any) -> tuple[np.ndarray, int]:
    return as_lengths("sizes", sizes), check_int("k", k, minimum=1)


def _lower_bound(p: np.ndarray, k: int) -> int:
    desc = np.sort(p)[::-1]
    n = len(desc)
    bound = max(int(desc[0]), -(-int(desc.sum()) // k))
    # Among the k*m + 1 largest jobs some part holds m + 1 of them: at least the m + 1 smallest.
    csum = np.concatenate(([0], np.cumsum(desc)))
    m = np.arange(1, (n - 1) // k + 1)
    if m.size:
        bound = max(bound, int((csum[k * m + 1] - csum[k * m - m]).max()))
    return bound


def lower_bound(sizes: Sequence[int], k: int) -> int:
    """A lower bound on the optimal makespan of k parts (tokens = decode steps)."""
    p, k = _check(sizes, k)
    return _lower_bound(p, k)


def _result(p: np.ndarray, parts: list[list[int]], algorithm: str, lb: int, proven: bool = False) -> Partition:
    loads = tuple(int(p[part].sum()) if part else 0 for part in parts)
    makespan = max(loads)
    return Partition(
        parts=tuple(tuple(int(i) for i in part) for part in parts),
        loads=loads,
        makespan=makespan,
        lower_bound=lb,
        algorithm=algorithm,
        proven_optimal=proven or makespan == lb,
    )


def _lpt_parts(p: np.ndarray, k: int, jobs: Sequence[int], loads: list[int] | None = None) -> list[list[int]]:
    """List-schedule ``jobs`` (already in the order to place them) onto the least-loaded part."""
    parts: list[list[int]] = [[] for _ in range(k)]
    heap = [(0 if loads is None else loads[j], j) for j in range(k)]
    heapq.heapify(heap)
    for i in jobs:
        load, j = heapq.heappop(heap)
        parts[j].append(int(i))
        heapq.heappush(heap, (load + int(p[i]), j))
    return parts


def _descending(p: np.ndarray) -> np.ndarray:
    """Job indices by decreasing size, ties by index (stable, deterministic)."""
    return np.argsort(-p, kind="stable")


def lpt(sizes: Sequence[int], k: int) -> Partition:
    """Longest processing time first: each job, largest first, to the least-loaded part."""
    p, k = _check(sizes, k)
    return _result(p, _lpt_parts(p, k, _descending(p)), "lpt", _lower_bound(p, k))


def karmarkar_karp(sizes: Sequence[int], k: int) -> Partition:
    """k-way Karmarkar-Karp largest differencing.

    Each job starts as a k-tuple of parts (itself and k - 1 empty parts). The two tuples with the
    largest spread (max - min load) are merged, pairing the heaviest part of one with the lightest
    of the other, until one tuple is left. Tuples store only their non-empty parts (the others
    are implicit zeros), so early merges cost O(1) rather than O(k).
    """
    p, k = _check(sizes, k)
    # A tuple: its non-empty parts as (load, members), heaviest first.
    heap: list[tuple[int, int, list[tuple[int, list[int]]]]] = [
        (-int(p[i]), i, [(int(p[i]), [i])]) for i in range(len(p))
    ]
    heapq.heapify(heap)
    tiebreak = len(p)
    while len(heap) > 1:
        a = heapq.heappop(heap)[2]
        b = heapq.heappop(heap)[2]
        # Part j of a pairs with part k - 1 - j of b (heaviest with lightest, counting empty parts).
        merged = [
            (load + b[k - 1 - j][0], members + b[k - 1 - j][1]) if k - 1 - j < len(b) else (load, members)
            for j, (load, members) in enumerate(a)
        ]
        merged += [b[i] for i in range(len(b)) if k - 1 - i >= len(a)]
        merged.sort(key=lambda part: -part[0])
        low = merged[-1][0] if len(merged) == k else 0
        heapq.heappush(heap, (low - merged[0][0], tiebreak, merged))
        tiebreak += 1
    parts = [members for _, members in heap[0][2]]
    parts += [[] for _ in range(k - len(parts))]
    return _result(p, parts, "karmarkar_karp", _lower_bound(p, k))


def best_heuristic(sizes: Sequence[int], k: int) -> Partition:
    """The better of :func:`lpt` and :func:`karmarkar_karp` (LPT on ties)."""
    a, b = lpt(sizes, k), karmarkar_karp(sizes, k)
    return b if b.makespan < a.makespan else a


def fptas(
    sizes: Sequence[int],
    k: int,
    eps: float = 0.05,
    *,
    certify: bool = True,
    prune: bool = True,
    max_states: int = 1_000_000,
) -> Partition:
    """A partition with makespan <= (1 + eps) * optimum, in time polynomial in n and 1/eps (fixed k).

    Method (Sahni-style dynamic programme with additive trimming):

    1. Incumbent: LPT, then the better of LPT and Karmarkar-Karp. With ``certify`` an incumbent
       is returned at once when makespan <= (1 + eps) * lower bound, which proves the guarantee.
    2. Jobs of size <= eps * LB ("small") are set aside; the others are processed largest first.
       A state is the sorted vector of part loads. States falling in the same cell of width
       delta = eps * LB / (2 n_large) in every coordinate are merged (error <= eps * LB / 2 in
       total), and a state whose completion bound max(max load, sum / k, min load + next job)
       is >= incumbent - eps * LB / 2 is dropped (if that drops the optimum's shadow, the
       incumbent is already within eps * LB of the optimum).
    3. The best final state gets the small jobs greedily (least-loaded part), which adds at most
       eps * LB beyond max(its makespan, the average load).

    So the result is within OPT + eps * LB <= (1 + eps) * OPT. The number of states is at most
    (2 n / eps + 1)^k, polynomial for fixed k; :class:`StateLimitExceeded` is raised when one step
    would generate, or all steps together would keep, more than ``max_states`` states (memory
    stays around ``max_states * k * 40`` bytes), so a caller can fall back to a heuristic.
    ``certify=False`` skips the shortcut of step 1 and ``prune=False`` the incumbent pruning of
    step 2 (slower, same guarantee; for tests and for measuring the programme itself).
    """
    p, k = _check(sizes, k)
    eps = check_positive_float("eps", eps, maximum=1.0)
    lb = _lower_bound(p, k)
    n = len(p)
    incumbent = lpt(p, k)
    if n <= k or k == 1 or incumbent.makespan == lb:
        return _relabel(incumbent, "fptas", proven=True)
    if certify and incumbent.makespan <= (1 + eps) * lb:
        return _relabel(incumbent, "fptas")  # LPT alone is certified: skip the costlier steps
    kk = karmarkar_karp(p, k)
    incumbent = kk if kk.makespan < incumbent.makespan else incumbent
    if incumbent.makespan == lb:
        return _relabel(incumbent, "fptas", proven=True)
    if certify and incumbent.makespan <= (1 + eps) * lb:
        return _relabel(incumbent, "fptas")
    err = eps * lb
    order = _descending(p)
    large = [int(i) for i in order if p[i] > err]
    small = [int(i) for i in order if p[i] <= err]
    parts = _trimmed_dp(p, k, large, small, err, incumbent.makespan if prune else math.inf, max_states)
    if parts is None:
        return _relabel(incumbent, "fptas")
    candidate = _result(p, parts, "fptas", lb)
    return candidate if candidate.makespan < incumbent.makespan else _relabel(incumbent, "fptas")


def _relabel(part: Partition, algorithm: str, proven: bool = False) -> Partition:
    return Partition(part.parts, part.loads, part.makespan, part.lower_bound, algorithm,
                     part.proven_optimal or proven)


def _state_limit(max_states: int, n: int, k: int) -> StateLimitExceeded:
    return StateLimitExceeded(f"fptas: more than max_states={max_states} DP states (n={n}, k={k}); "
                              "raise eps or use karmarkar_karp")


def _trimmed_dp(
    p: np.ndarray, k: int, large: list[int], small: list[int], err: float, incumbent: float, max_states: int
) -> list[list[int]] | None:
    """The trimmed DP over ``large`` jobs; returns parts, or None when every state was pruned."""
    if not large:
        return _lpt_parts(p, k, small)
    delta = err / (2 * len(large))
    total = int(p.sum())
    average = -(-total // k)
    sizes = p[large].astype(np.int64)
    states = np.zeros((1, k), dtype=np.int64)
    history: list[tuple[np.ndarray, np.ndarray]] = []
    cols_all = np.arange(k)
    kept = 0
    for j, size in enumerate(sizes):
        m = len(states)
        if m * k > max_states:
            raise _state_limit(max_states, len(p), k)
        # Adding to a part whose load equals its left neighbour's gives the same sorted state.
        distinct = np.ones((m, k), dtype=bool)
        distinct[:, 1:] = states[:, 1:] != states[:, :-1]
        parent, col = np.nonzero(distinct)
        child = states[parent].copy()
        child[np.arange(len(parent)), col] += size
        child = -np.sort(-child, axis=1)
        nxt = int(sizes[j + 1]) if j + 1 < len(sizes) else 0
        bound = np.maximum(np.maximum(child[:, 0], average), child[:, -1] + nxt)
        keep = bound < incumbent - err / 2
        if not keep.any():
            return None
        parent, col, child = parent[keep], col[keep], child[keep]
        # Merge states in the same cell, keeping the one with the smallest largest load.
        by_max = np.argsort(child[:, 0], kind="stable")
        parent, col, child = parent[by_max], col[by_max], child[by_max]
        cells = np.ascontiguousarray(np.floor(child / delta).astype(np.int64))
        _, first = np.unique(cells.view(np.dtype((np.void, 8 * k))).ravel(), return_index=True)
        first.sort()
        kept += len(first)
        if kept > max_states:
            raise _state_limit(max_states, len(p), k)
        history.append((parent[first], col[first]))
        states = child[first]
    best = int(np.argmin(states[:, 0]))
    cols = []
    for parents, picked in reversed(history):
        cols.append(int(picked[best]))
        best = int(parents[best])
    cols.reverse()
    loads = [0] * k
    parts: list[list[int]] = [[] for _ in range(k)]
    for job, c in zip(large, cols):
        # Replay on labelled parts: position c of the sorted state is the c-th heaviest part.
        target = sorted(cols_all.tolist(), key=lambda q: (-loads[q], q))[c]
        parts[target].append(job)
        loads[target] += int(p[job])
    extra = _lpt_parts(p, k, small, loads)
    return [parts[q] + extra[q] for q in range(k)]


def exact(
    sizes: Sequence[int],
    k: int,
    *,
    time_limit_s: float = 10.0,
    workers: int = 1,
    seed: int = 0,
) -> Partition:
    """Optimal partition by OR-Tools CP-SAT (needs ``pip install 'lengthsched[exact]'``).

    ``proven_optimal`` is False when the time limit stopped the search; ``lower_bound`` is then
    the solver's proven bound. Deterministic for a fixed ``workers`` and ``seed``.
    """
    p, k = _check(sizes, k)
    time_limit_s = check_positive_float("time_limit_s", time_limit_s)
    workers = check_int("workers", workers, minimum=1)
    try:
        from ortools.sat.python import cp_model
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError("partition.exact needs OR-Tools: pip install 'lengthsched[exact]'") from exc
    lb = _lower_bound(p, k)
    hint = best_heuristic(p, k)
    if hint.makespan == lb:
        return _relabel(hint, "exact", proven=True)
    n = len(p)
    model = cp_model.CpModel()
    order = _descending(p)
    x = {}
    for rank, i in enumerate(order):
        # Symmetry breaking: the r-th largest job goes to one of the first r + 1 parts.
        x.update({(int(i), j): model.new_bool_var(f"x{i}_{j}") for j in range(min(k, rank + 1))})
        model.add_exactly_one(x[int(i), j] for j in range(min(k, rank + 1)))
    makespan = model.new_int_var(lb, hint.makespan, "makespan")
    for j in range(k):
        model.add(sum(int(p[i]) * x[i, j] for i in range(n) if (i, j) in x) <= makespan)
    model.minimize(makespan)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return _relabel(hint, "exact")  # the hint is always feasible; nothing better was proven
    parts = [[i for i in map(int, order) if (i, j) in x and solver.boolean_value(x[i, j])] for j in range(k)]
    bound = max(lb, math.ceil(solver.best_objective_bound - 1e-9))
    result = _result(p, parts, "exact", bound, proven=status == cp_model.OPTIMAL)
    return result if result.makespan <= hint.makespan else _relabel(hint, "exact")
