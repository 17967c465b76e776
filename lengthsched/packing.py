"""Memory-feasible micro groups: cardinality-constrained subset sum and a packing budget.

A micro group is a set of at most ``max_items`` completions whose reserved sizes (bytes, or KV
tokens) fit a capacity. :func:`subset_sum` picks one as full as possible (an FPTAS: fill >=
(1 - eps) * optimum); :func:`pack_micro_groups` repeats it to split a whole group into rounds;
:class:`MicroGroupBudget` is the short-lived object an engine uses while it admits completions one
at a time (``try_add(item, size) -> item | None``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import BudgetTooSmall, InvalidArgument, LengthschedError, as_lengths, check_int, check_positive_float
from .partition import StateLimitExceeded

__all__ = ["SubsetFill", "subset_sum", "pack_micro_groups", "MicroGroupBudget"]


@dataclass(frozen=True)
class SubsetFill:
    """A chosen subset: ``items`` (indices, ascending), their size sum ``fill`` and an upper bound
    on the best achievable fill, min(capacity, sum of the ``max_items`` largest items that fit)."""

    items: tuple[int, ...]
    fill: int
    capacity: int
    max_items: int
    upper_bound: int
    algorithm: str

    @property
    def ratio(self) -> float:
        """fill / upper_bound, in [0, 1] (1.0 when nothing could be chosen)."""
        return self.fill / self.upper_bound if self.upper_bound else 1.0


def subset_sum(
    sizes: Sequence[int],
    capacity: int,
    *,
    max_items: int | None = None,
    eps: float = 0.05,
    certify: bool = True,
    max_states: int = 1_000_000,
) -> SubsetFill:
    """At most ``max_items`` items with size sum <= ``capacity``, fill >= (1 - eps) * optimum.

    Greedy incumbents (largest first; best single item) are returned at once when they reach
    (1 - eps) * upper bound. Otherwise a dynamic programme over (count, sum) states, items largest
    first: within each count, sums in the same cell of width eps * incumbent / n are merged
    keeping the smallest (so a merged state is never heavier than the one it stands for), and a
    state whose best completion cannot beat the incumbent is dropped. The incumbent is at least
    half the optimum, so the total loss is <= eps * optimum; states per count <= 2 n / eps + 1.
    Beyond ``max_states`` states (all steps together) the greedy incumbent is returned
    (``algorithm="greedy"``).
    ``certify=False`` always runs the programme and raises :class:`StateLimitExceeded` instead.
    """
    p = as_lengths("sizes", sizes)
    capacity = check_int("capacity", capacity, minimum=0)
    m_cap = len(p) if max_items is None else check_int("max_items", max_items, minimum=1)
    eps = check_positive_float("eps", eps, maximum=1.0)
    fit = np.array([i for i in np.argsort(-p, kind="stable") if p[i] <= capacity], dtype=np.int64)
    m = min(m_cap, len(fit))
    top = int(p[fit[:m]].sum()) if m else 0
    upper = min(capacity, top)

    def done(chosen: Sequence[int], algorithm: str) -> SubsetFill:
        items = tuple(sorted(int(i) for i in chosen))
        return SubsetFill(items, int(p[list(items)].sum()) if items else 0, capacity, m_cap, upper, algorithm)

    if top <= capacity:
        return done(fit[:m], "fptas")
    incumbent = _greedy(p, fit, capacity, m)
    if certify and int(p[incumbent].sum()) >= (1 - eps) * upper:
        return done(incumbent, "fptas")
    try:
        return done(_trimmed_dp(p, fit, capacity, m, eps, incumbent, max_states), "fptas")
    except StateLimitExceeded:
        if certify:  # an honest fallback: the caller still sees fill against upper_bound
            return done(incumbent, "greedy")
        raise


def _greedy(p: np.ndarray, fit: np.ndarray, capacity: int, m: int) -> list[int]:
    chosen, total = [], 0
    for i in fit:
        if len(chosen) < m and total + p[i] <= capacity:
            chosen.append(int(i))
            total += int(p[i])
    # The largest single fitting item alone can beat a greedy run that stopped early.
    return chosen if total >= p[fit[0]] else [int(fit[0])]


def _trimmed_dp(
    p: np.ndarray, fit: np.ndarray, capacity: int, m: int, eps: float, incumbent: list[int], max_states: int
) -> list[int]:
    sizes = p[fit]
    n = len(sizes)
    best_fill = int(p[incumbent].sum())
    delta = eps * best_fill / n
    csum = np.concatenate(([0], np.cumsum(sizes)))
    count = np.zeros(1, dtype=np.int64)
    total = np.zeros(1, dtype=np.int64)
    history: list[tuple[np.ndarray, np.ndarray]] = []
    kept = 0
    for j, size in enumerate(sizes):
        take = (count < m) & (total + size <= capacity)
        parent = np.concatenate((np.arange(len(count)), np.nonzero(take)[0]))
        took = np.concatenate((np.zeros(len(count), bool), np.ones(int(take.sum()), bool)))
        c = count[parent] + took
        s = total[parent] + size * took
        # Best completion: the next (m - c) items, which are the largest left.
        reach = np.minimum(capacity, s + csum[np.minimum(j + 1 + (m - c), n)] - csum[j + 1])
        keep = reach > best_fill
        keep[0] = True  # the empty-prefix chain keeps the history non-empty
        parent, took, c, s = parent[keep], took[keep], c[keep], s[keep]
        order = np.lexsort((s, c))
        parent, took, c, s = parent[order], took[order], c[order], s[order]
        cell = np.floor(s / delta).astype(np.int64)
        first = np.ones(len(c), dtype=bool)
        first[1:] = (c[1:] != c[:-1]) | (cell[1:] != cell[:-1])
        kept += int(first.sum())
        if kept > max_states:  # all steps together: the history is what holds memory
            raise StateLimitExceeded(f"subset_sum: more than max_states={max_states} DP states (n={n}); raise eps")
        history.append((parent[first], took[first]))
        count, total = c[first], s[first]
    best = int(np.argmax(total))
    if int(total[best]) <= best_fill:
        return incumbent
    chosen = []
    for j in range(n - 1, -1, -1):
        parents, took = history[j]
        if took[best]:
            chosen.append(int(fit[j]))
        best = int(parents[best])
    return chosen


def pack_micro_groups(
    sizes: Sequence[int], capacity: int, *, max_items: int | None = None, eps: float = 0.05
) -> list[SubsetFill]:
    """Split all items into rounds, each a :func:`subset_sum` over the items not yet placed.

    Raises :class:`BudgetTooSmall` when an item alone exceeds ``capacity``.
    """
    p = as_lengths("sizes", sizes)
    capacity = check_int("capacity", capacity, minimum=0)
    too_big = np.nonzero(p > capacity)[0]
    if too_big.size:
        i = int(too_big[0])
        raise BudgetTooSmall("capacity", capacity, f"at least {int(p[i])}, the size of item {i}")
    left = np.arange(len(p))
    rounds = []
    while left.size:
        chosen = subset_sum(p[left], capacity, max_items=max_items, eps=eps)
        picked = left[list(chosen.items)]
        rounds.append(SubsetFill(tuple(int(i) for i in picked), chosen.fill, capacity,
                                 chosen.max_items, chosen.upper_bound, chosen.algorithm))
        left = np.setdiff1d(left, picked)
    return rounds


class MicroGroupBudget:
    """Admits items into one micro group while they fit ``capacity`` and ``max_items``.

    ``try_add(item, size)`` returns the item when admitted and None when it does not fit; ``remove``
    releases an item (a completion finished). Sizes are whatever unit the capacity is in.
    """

    def __init__(self, capacity: int, max_items: int | None = None):
        self.capacity = check_int("capacity", capacity, minimum=0)
        self.max_items = None if max_items is None else check_int("max_items", max_items, minimum=1)
        self._sizes: dict[Any, int] = {}
        self.used = 0

    @property
    def remaining(self) -> int:
        """Capacity not yet taken."""
        return self.capacity - self.used

    @property
    def items(self) -> tuple:
        """Admitted items, in admission order."""
        return tuple(self._sizes)

    def __len__(self) -> int:
        return len(self._sizes)

    def fits(self, size: int) -> bool:
        """Whether an item of ``size`` would be admitted now."""
        full = self.max_items is not None and len(self._sizes) >= self.max_items
        return not full and size <= self.remaining

    def try_add(self, item: Any, size: int) -> Any:
        """Admit ``item`` of ``size`` if it fits; return it, or None."""
        size = check_int("size", size, minimum=0)
        if item in self._sizes:
            raise InvalidArgument("item", item, "an item not already in the micro group")
        if not self.fits(size):
            return None
        self._sizes[item] = size
        self.used += size
        return item

    def remove(self, item: Any) -> int:
        """Release ``item``; returns its size."""
        if item not in self._sizes:
            raise InvalidArgument("item", item, "an item of the micro group")
        size = self._sizes.pop(item)
        self.used -= size
        return size

    def check_integrity(self) -> None:
        """Raise if the bookkeeping is inconsistent (tests call it after every operation)."""
        if self.used != sum(self._sizes.values()) or not 0 <= self.used <= self.capacity:
            raise LengthschedError(f"MicroGroupBudget: used={self.used} does not match its items")
        if self.max_items is not None and len(self._sizes) > self.max_items:
            raise LengthschedError(f"MicroGroupBudget: {len(self._sizes)} items > max_items={self.max_items}")
