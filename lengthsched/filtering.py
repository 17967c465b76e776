"""What a dynamic-sampling filter did with each prompt, and the order that puts likely-kept groups first.

DAPO's dynamic sampling drops a group whose rewards all agree (every completion right or every one wrong),
and an over-sampled rollout step ends at its B-th group that passes. Whether a prompt's group passes is
persistent across epochs: a prompt the policy always solves (or never solves) keeps failing the filter
(GRESO, arXiv 2506.02177, skips such prompts by their history). :class:`FilterHistory` keeps that history
per prompt and estimates the probability that a prompt's next group passes; :func:`order_by_pass` orders a
batch likely-kept first, so the engines run the groups that can count for the step before those that
probably cannot (which, under slime's partial rollout, are carried to the next step with their tokens rather
than lost). Nothing is skipped: every group is still generated, only later.

Numpy only, like the rest of the core.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import numpy as np

from .errors import InvalidArgument, check_int

__all__ = ["FilterHistory", "order_by_pass"]


class FilterHistory:
    """Per prompt key, whether the dynamic-sampling filter kept each of its groups (the last ``memory``
    outcomes; None: all), and the probability that its next group is kept.

    The estimate is a Beta posterior mean: ``(kept + prior_strength x share) / (groups + prior_strength)``,
    ``share`` the share of all groups observed so far that were kept (one half before any), ``kept`` and
    ``groups`` the prompt's own remembered outcomes. A prompt never seen gets ``share``. ``prior_strength``
    (groups' worth, > 0) says how much one prompt's own outcomes count against the average; ``memory``
    forgets old outcomes as the policy changes (a prompt the policy learnt to solve starts to fail the
    filter)."""

    def __init__(self, prior_strength: float = 1.0, memory: int | None = 4):
        if (not isinstance(prior_strength, (int, float)) or isinstance(prior_strength, bool)
                or not np.isfinite(prior_strength) or prior_strength <= 0):
            raise InvalidArgument("prior_strength", prior_strength, "a finite number of groups > 0")
        self.prior_strength = float(prior_strength)
        self.memory = None if memory is None else check_int("memory", memory, minimum=1)
        self._outcomes: dict[Hashable, deque] = {}
        self.groups = 0  # groups observed, every prompt
        self.kept = 0  # of them, kept by the filter

    def __len__(self) -> int:
        """Prompts observed."""
        return len(self._outcomes)

    @property
    def informed(self) -> bool:
        """Whether any group was observed (before that every prompt gets one half)."""
        return self.groups > 0

    @property
    def share(self) -> float:
        """The share of the groups observed that the filter kept (one half before any)."""
        return self.kept / self.groups if self.groups else 0.5

    def observe(self, key: Hashable, kept: bool) -> None:
        """Record that the filter kept (``kept`` True) or dropped one group of prompt ``key``."""
        if not isinstance(kept, (bool, np.bool_)):
            raise InvalidArgument("kept", kept, "a bool (whether the filter kept the group)")
        try:
            outcomes = self._outcomes.setdefault(key, deque(maxlen=self.memory))
        except TypeError as exc:
            raise InvalidArgument("key", repr(key), "a hashable prompt key") from exc
        outcomes.append(bool(kept))
        self.groups += 1
        self.kept += bool(kept)

    def observe_many(self, keys: Sequence[Hashable], kept: Iterable[bool]) -> int:
        """:meth:`observe` for every (key, kept) pair; returns how many were recorded."""
        kept = list(kept)
        if len(kept) != len(keys):
            raise InvalidArgument("kept", f"{len(kept)} values", f"{len(keys)}, one per key")
        for key, k in zip(keys, kept):
            self.observe(key, k)
        return len(kept)

    def pass_probability(self, keys: Sequence[Hashable]) -> np.ndarray:
        """Per key, the probability that its next group passes the filter (see the class docstring)."""
        share, s = self.share, self.prior_strength
        out = np.empty(len(keys), dtype=np.float64)
        for i, key in enumerate(keys):
            try:
                seen = self._outcomes.get(key)
            except TypeError as exc:
                raise InvalidArgument("keys", repr(key), "hashable prompt keys") from exc
            n, k = (len(seen), sum(seen)) if seen else (0, 0)
            out[i] = (k + s * share) / (n + s)
        return out

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able copy (string keys: a key is written as ``str(key)``)."""
        return {"prior_strength": self.prior_strength, "memory": self.memory, "groups": self.groups,
                "kept": self.kept, "outcomes": {str(k): list(v) for k, v in self._outcomes.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FilterHistory:
        """The history :meth:`to_dict` wrote."""
        if not isinstance(data, dict) or not isinstance(data.get("outcomes"), dict):
            raise InvalidArgument("data", type(data).__name__, "a dict written by FilterHistory.to_dict")
        history = cls(data.get("prior_strength", 1.0), data.get("memory", 4))
        for key, outcomes in data["outcomes"].items():
            for kept in outcomes:
                history.observe(key, bool(kept))
        # the share counts every group observed, also those the memory forgot
        history.groups = check_int("groups", data.get("groups", history.groups), minimum=history.groups)
        history.kept = check_int("kept", data.get("kept", history.kept), minimum=0)
        if history.kept > history.groups:
            raise InvalidArgument("kept", history.kept, f"at most groups = {history.groups}")
        return history


def order_by_pass(probabilities: Any) -> np.ndarray:
    """The order (indices) that puts the most likely to pass first, ties in the order given (a stable sort):
    how a batch of groups is handed to the engines likely-kept first."""
    p = np.asarray(probabilities, dtype=np.float64)
    if p.ndim != 1 or not np.all((p >= 0) & (p <= 1)):
        raise InvalidArgument("probabilities", f"{p.size} values", "one probability in [0, 1] per group")
    return np.argsort(-p, kind="stable")
