"""What a dynamic-sampling filter did with each prompt, and the order that puts likely-kept groups first.

DAPO's dynamic sampling drops a group whose rewards all agree (every completion right or every one wrong),
and an over-sampled rollout step ends at its B-th group that passes. Whether a prompt's group passes is
persistent across epochs: a prompt the policy always solves (or never solves) keeps failing the filter
(GRESO, arXiv 2506.02177, skips such prompts by their history). :class:`FilterHistory` keeps that history
per prompt and estimates the probability that a prompt's next group passes; :func:`order_by_pass` orders a
batch likely-kept first, so the engines run the groups that can count for the step before those that
probably cannot (which, under slime's partial rollout, are carried to the next step with their tokens rather
than lost). Nothing is skipped: every group is still generated, only later.

:class:`SelectiveRollout` does skip: GRESO's pre-rollout filter (arXiv 2506.02177; its code,
``verl/trainer/ttis/presampling_selector.py`` and ``ray_trainer.py`` at Infini-AI-Lab/GRESO b277843): a prompt
whose last ``n`` groups were all right (or all wrong) is skipped with probability ``1 - max(p ** n, 0.01)``,
``p`` the exploration probability of its side, which moves by 0.01 after every step towards a target share of
such groups among those generated. A skipped prompt is not generated this epoch: it saves the rollout's time
on groups the filter would most likely drop, and loses the few it would have kept.

Numpy only, like the rest of the core.
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import numpy as np

from .errors import InvalidArgument, check_int
from .io import atomic_write_text
from .online import state_key

__all__ = ["SIDES", "SKIP_DRAWS", "SOLVED_REWARD", "FilterHistory", "SelectiveRollout", "check_solved_reward",
           "dropped_side",
           "need_refill", "order_by_pass", "read_filter_state",
           "write_filter_state"]

SIDES = ("easy", "hard")  # a dropped group: every completion rewarded, or none

#: A reward at or above this counts as a solved completion unless the integration is told otherwise: it tells an
#: all-right dropped group from an all-wrong one (math rewards are 1 and 0, or 1 and -1).
SOLVED_REWARD = 0.5

#: The most prompts an integration draws from the data, per prompt asked, while :class:`SelectiveRollout` skips
#: (past it the integration hands over what it has).
SKIP_DRAWS = 8


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
        self.easy = 0  # of them, dropped with every completion rewarded
        self.hard = 0  # of them, dropped with none rewarded

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

    def observe(self, key: Hashable, kept: bool, side: str | None = None) -> None:
        """Record that the filter kept (``kept`` True) or dropped one group of prompt ``key``; ``side``, for a
        dropped group, whether every completion was rewarded (``"easy"``) or none (``"hard"``), or None when
        not known."""
        if not isinstance(kept, (bool, np.bool_)):
            raise InvalidArgument("kept", kept, "a bool (whether the filter kept the group)")
        if side is not None and (kept or side not in SIDES):
            raise InvalidArgument("side", side, "None, or for a dropped group 'easy' (every completion rewarded) "
                                                "or 'hard' (none)")
        try:
            outcomes = self._outcomes.setdefault(state_key(key), deque(maxlen=self.memory))
        except TypeError as exc:
            raise InvalidArgument("key", repr(key), "a hashable prompt key") from exc
        outcomes.append(True if kept else (side or False))
        self.groups += 1
        self.kept += bool(kept)
        self.easy += side == "easy"
        self.hard += side == "hard"

    def observe_many(self, keys: Sequence[Hashable], kept: Iterable[bool],
                     sides: Iterable[str | None] | None = None) -> int:
        """:meth:`observe` for every (key, kept[, side]) triple; returns how many were recorded."""
        kept = list(kept)
        sides = [None] * len(kept) if sides is None else list(sides)
        if len(kept) != len(keys):
            raise InvalidArgument("kept", f"{len(kept)} values", f"{len(keys)}, one per key")
        if len(sides) != len(keys):
            raise InvalidArgument("sides", f"{len(sides)} values", f"{len(keys)}, one per key")
        for key, k, side in zip(keys, kept, sides):
            self.observe(key, k, side)
        return len(kept)

    def streaks(self, keys: Sequence[Hashable]) -> tuple[np.ndarray, np.ndarray]:
        """Per key, how many of its latest remembered groups in a row were dropped all right (first array) and
        all wrong (second); at most one of the two is nonzero, both are zero for a prompt whose latest group
        was kept or dropped with no side recorded, and neither exceeds ``memory``."""
        easy, hard = np.zeros(len(keys), dtype=np.int64), np.zeros(len(keys), dtype=np.int64)
        for i, key in enumerate(keys):
            seen = self._seen(key)
            if not seen or seen[-1] not in SIDES:
                continue
            last, n = seen[-1], 0
            for outcome in reversed(seen):
                if outcome != last:
                    break
                n += 1
            (easy if last == "easy" else hard)[i] = n
        return easy, hard

    def pass_probability(self, keys: Sequence[Hashable]) -> np.ndarray:
        """Per key, the probability that its next group passes the filter (see the class docstring)."""
        share, s = self.share, self.prior_strength
        out = np.empty(len(keys), dtype=np.float64)
        for i, key in enumerate(keys):
            seen = self._seen(key)
            n, k = (len(seen), sum(o is True for o in seen)) if seen else (0, 0)
            out[i] = (k + s * share) / (n + s)
        return out

    def _seen(self, key: Hashable) -> deque | None:
        """The outcomes remembered for ``key`` (None: never observed); an unhashable one is an error naming
        ``keys``."""
        try:
            return self._outcomes.get(state_key(key))
        except TypeError as exc:
            raise InvalidArgument("keys", repr(key), "hashable prompt keys") from exc

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able copy (string keys: a key is written as ``str(key)``; a prompt of more than
        :data:`~lengthsched.online.KEY_CHARS` characters is kept, and written, under its digest,
        :func:`~lengthsched.online.state_key`)."""
        return {"prior_strength": self.prior_strength, "memory": self.memory, "groups": self.groups,
                "kept": self.kept, "easy": self.easy, "hard": self.hard,
                "outcomes": {str(k): list(v) for k, v in self._outcomes.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FilterHistory:
        """The history :meth:`to_dict` wrote."""
        if not isinstance(data, dict) or not isinstance(data.get("outcomes"), dict):
            raise InvalidArgument("data", type(data).__name__, "a dict written by FilterHistory.to_dict")
        history = cls(data.get("prior_strength", 1.0), data.get("memory", 4))
        for key, outcomes in data["outcomes"].items():
            for outcome in outcomes:  # True (kept), False (dropped), or the side of a dropped group
                if outcome in SIDES:
                    history.observe(key, False, outcome)
                elif isinstance(outcome, bool):
                    history.observe(key, outcome)
                else:
                    raise InvalidArgument("data", f"outcome {outcome!r} of prompt {key!r}",
                                          "true, false, 'easy' or 'hard'")
        # the share counts every group observed, also those the memory forgot
        history.groups = check_int("groups", data.get("groups", history.groups), minimum=history.groups)
        for name in ("kept", "easy", "hard"):
            setattr(history, name, check_int(name, data.get(name, getattr(history, name)), minimum=0))
        if history.kept + history.easy + history.hard > history.groups:
            raise InvalidArgument("kept", history.kept, f"kept + easy + hard at most groups = {history.groups}")
        return history


class SelectiveRollout:
    """GRESO's pre-rollout filter (arXiv 2506.02177, "all_probabilistic"): skip a prompt whose latest groups were
    all dropped on one side, with a probability that grows with the streak, and adapt how much to explore.

    A prompt whose last ``n`` remembered groups were all right (:meth:`FilterHistory.streaks`) is skipped with
    probability ``1 - max(p_easy ** n, 0.01)``; all wrong, the same with ``p_hard``; any other prompt runs.
    ``p_easy`` and ``p_hard`` are exploration probabilities in [``min_p``, ``max_p``]: after each step
    (:meth:`adapt`), where the groups generated since the last call held at least ``target / 3`` all-right ones
    (``2 x target / 3`` all-wrong), GRESO explores less (``p`` falls by ``step``), else more (it rises by
    ``step``); all-wrong prompts get the larger share because a learning policy solves them later. Defaults
    as GRESO's code (target 0.25, step 0.01, bounds 0.05 and 0.95) except the starting ``p``, 0.5 here (GRESO
    reads it from its configuration). Decisions are drawn from ``seed``'s stream."""

    FLOOR = 0.01  # the least probability of running a prompt, however long its streak

    def __init__(self, p_easy: float = 0.5, p_hard: float = 0.5, *, target: float = 0.25, step: float = 0.01,
                 min_p: float = 0.05, max_p: float = 0.95, seed: int = 0):
        self.min_p = _probability("min_p", min_p)
        self.max_p = _probability("max_p", max_p)
        if self.min_p > self.max_p:
            raise InvalidArgument("max_p", max_p, f"at least min_p = {min_p}")
        for name, value in (("p_easy", p_easy), ("p_hard", p_hard)):
            if not self.min_p <= _probability(name, value) <= self.max_p:
                raise InvalidArgument(name, value, f"a probability in [min_p, max_p] = [{min_p}, {max_p}]")
        self.p_easy, self.p_hard = float(p_easy), float(p_hard)
        self.target = _probability("target", target)
        self.step = _probability("step", step)
        self.seed = check_int("seed", seed, minimum=0)
        self._rng = np.random.default_rng(self.seed)
        self._seen = (0, 0, 0)  # the history's groups, easy and hard at the last adapt()

    def skip_probability(self, history: FilterHistory, keys: Sequence[Hashable]) -> np.ndarray:
        """Per key, the probability that its prompt is skipped (see the class docstring)."""
        easy, hard = history.streaks(keys)
        out = np.zeros(len(keys), dtype=np.float64)
        for streak, p in ((easy, self.p_easy), (hard, self.p_hard)):
            on = streak > 0
            out[on] = 1.0 - np.maximum(p ** streak[on].astype(np.float64), self.FLOOR)
        return out

    def select(self, history: FilterHistory, keys: Sequence[Hashable]) -> np.ndarray:
        """Per key, whether its prompt runs (True) or is skipped, drawn with :meth:`skip_probability`."""
        skip = self.skip_probability(history, keys)
        return self._rng.random(len(keys)) >= skip

    def adapt(self, history: FilterHistory) -> tuple[float, float] | None:
        """Move ``p_easy`` and ``p_hard`` by what ``history`` observed since the last call (GRESO calls it after
        every step); returns the shares of all-right and all-wrong groups among those, or None when it observed
        nothing new."""
        groups, easy, hard = history.groups - self._seen[0], history.easy - self._seen[1], history.hard - self._seen[2]
        if groups <= 0:
            return None
        self._seen = (history.groups, history.easy, history.hard)
        shares = easy / groups, hard / groups
        for name, share, target in (("p_easy", shares[0], self.target / 3), ("p_hard", shares[1], self.target * 2 / 3)):
            p = getattr(self, name)
            setattr(self, name, max(p - self.step, self.min_p) if share >= target else min(p + self.step, self.max_p))
        return shares

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able copy of the rule's state (its random stream restarts from ``seed``)."""
        return {"p_easy": self.p_easy, "p_hard": self.p_hard, "target": self.target, "step": self.step,
                "min_p": self.min_p, "max_p": self.max_p, "seed": self.seed, "seen": list(self._seen)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SelectiveRollout:
        """The rule :meth:`to_dict` wrote."""
        if not isinstance(data, dict):
            raise InvalidArgument("data", type(data).__name__, "a dict written by SelectiveRollout.to_dict")
        rule = cls(**{k: data[k] for k in ("p_easy", "p_hard", "target", "step", "min_p", "max_p", "seed")
                      if k in data})
        seen = data.get("seen", [0, 0, 0])
        if not isinstance(seen, (list, tuple)) or len(seen) != 3:
            raise InvalidArgument("seen", seen, "three counts: groups, easy, hard")
        rule._seen = tuple(check_int("seen", v, minimum=0) for v in seen)
        return rule


def check_solved_reward(name: str, value: Any) -> float:
    """``value`` as the reward at or above which a completion counts as solved (:func:`dropped_side`'s ``solved``),
    checked: a finite number; ``name`` is the setting that gave it."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not np.isfinite(value):
        raise InvalidArgument(name, value, "a finite number (a reward at or above it is solved)")
    return float(value)


def dropped_side(rewards: Iterable[Any], solved: float = SOLVED_REWARD) -> str | None:
    """Why the filter dropped a group with these rewards: ``"easy"`` when every one is at least ``solved``,
    ``"hard"`` when none is, None when they straddle it, a reward is not a number, or there is none (then the
    group counts as dropped, side unknown, and :class:`SelectiveRollout` does not skip by it)."""
    right = total = 0
    for value in rewards:
        if not isinstance(value, (int, float, np.number)) or isinstance(value, (bool, np.bool_)):
            return None
        right += float(value) >= solved
        total += 1
    if not total:
        return None
    return "easy" if right == total else "hard" if right == 0 else None


def read_filter_state(path: str | None, argument: str, selective: bool) -> tuple[FilterHistory | None,
                                                                                SelectiveRollout | None]:
    """What :func:`write_filter_state` saved at ``path`` (a run resumed from a checkpoint keeps what the filter did
    with each prompt): the history, or None where ``path`` is None or not there yet; and, where ``selective``,
    the :class:`SelectiveRollout` saved with it (None if none was). A file that is not such JSON is an error
    naming ``argument`` (the setting that gave ``path``)."""
    if path is None or not os.path.exists(path):
        return None, None
    try:
        with open(path, encoding="utf-8") as handle:
            saved = json.load(handle)
        history = FilterHistory.from_dict(saved)
    except (OSError, ValueError) as exc:
        raise InvalidArgument(argument, path, f"a JSON file of lengthsched's filter history ({exc})") from exc
    if not selective or saved.get("selective") is None:
        return history, None
    try:
        return history, SelectiveRollout.from_dict(saved["selective"])
    except ValueError as exc:
        raise InvalidArgument(argument, path, f"a JSON file of lengthsched's filter history ({exc})") from exc


def write_filter_state(path: str, history: FilterHistory, selective: SelectiveRollout | None = None) -> None:
    """``history`` (and ``selective``'s state, where given) written to ``path`` as JSON, atomically."""
    data = history.to_dict()
    if selective is not None:
        data["selective"] = selective.to_dict()
    atomic_write_text(path, json.dumps(data) + "\n")


def need_refill(missing: int, inflight: int, kept: int, finished: int) -> int:
    """How many more groups to submit when ``missing`` more must pass the filter and ``inflight`` are running: enough
    that those running and those submitted are expected to pass ``missing`` at the pass share
    ``(kept + 1) / (finished + 2)`` (the groups finished so far, ``kept`` of them passed); 1 when nothing runs and
    some are missing, so the step goes on; 0 when nothing is missing."""
    if missing <= 0:
        return 0
    share = (kept + 1) / (finished + 2)
    return max(int(inflight == 0), math.ceil(missing / share - inflight - 1e-9))


def _probability(name: str, value: Any) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
        raise InvalidArgument(name, value, "a probability in [0, 1]")
    return float(value)


def order_by_pass(probabilities: Any) -> np.ndarray:
    """The order (indices) that puts the most likely to pass first, ties in the order given (a stable sort):
    how a batch of groups is handed to the engines likely-kept first."""
    p = np.asarray(probabilities, dtype=np.float64)
    if p.ndim != 1 or not np.all((p >= 0) & (p <= 1)):
        raise InvalidArgument("probabilities", f"{p.size} values", "one probability in [0, 1] per group")
    return np.argsort(-p, kind="stable")
