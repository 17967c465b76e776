"""Adaptive group sizes from a difficulty profile (sGPO-style budgeting).

A profiling pass samples k completions of every prompt and records whether each solved it (and,
optionally, its length in tokens). From the estimated success rate p of each prompt:

- **keep**: prompts with p above ``drop_above`` are trivial (every completion of a group would
  score alike, so GRPO's advantages vanish) and are dropped; prompts never solved (p = 0) are kept
  only for a seeded ``unsolved_fraction`` of them (a hash of (seed, prompt id), so the choice is
  stable); the rest are kept;
- **group size** near 1/p (a group of ~1/p completions expects about one success, enough for a
  non-zero advantage), clamped to [g_min, g_max]: rule ``pow2`` takes the power of two at or below
  1/p (the inverse-power-of-two floor), rule ``ceil`` takes ceil(1/p); rule ``informative`` takes the
  smallest group whose rewards differ with probability at least ``target`` (1 - p^g - (1 - p)^g >=
  target; a group of about 1/p is informative only about 0.6 of the time); a kept unsolved prompt gets
  g_max;
- **curriculum**: kept prompts from easy to hard (p descending, ties by id) in ``phases`` phases of
  near-equal size;
- **compute** in tokens: profiling (k samples per prompt) plus training (each kept prompt's group
  size times its expected completion length, plus its prompt per completion) against a baseline that
  trains every prompt with a fixed group size and profiles nothing. Expected lengths come from the
  profile (mean of the sampled lengths), else ``default_length``.

:class:`OnlineBudget` makes the same decisions without a profiling pass: from each prompt's own latest
groups in training (its rewards, as the trainer computes them), so a prompt's group size follows the
policy as it learns (a prompt it learnt to solve shrinks to ``g_min``, one it started to solve grows
by the rule). A prompt not seen yet gets the trainer's own group size; one :func:`plan_budget` would
drop (trivial, or unsolved and not sampled) gets ``g_min`` instead, since a trainer cannot drop a
prompt it has already drawn, and a small group keeps watching it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .errors import InvalidArgument, check_int
from .filtering import SOLVED_REWARD, check_solved_reward
from .io import atomic_write_text
from .online import state_key

__all__ = ["ProfileRecord", "BudgetConfig", "PromptBudget", "BudgetPlan", "OnlineBudget", "plan_budget",
           "group_size_for", "prompt_decision", "read_online_budget", "read_profile", "write_online_budget", "RULES",
           "ONLINE_REASONS", "ONLINE_RULE_OPTIONS", "online_budget_from_options", "reach_steps"]

RULES = ("pow2", "ceil", "informative")


@dataclass(frozen=True)
class ProfileRecord:
    """One prompt's profiling outcome: ``outcomes`` (1 solved, 0 not) of k samples, optional sample
    ``lengths`` (tokens) and ``prompt_tokens``."""

    id: str
    outcomes: tuple[int, ...]
    lengths: tuple[int, ...] = ()
    prompt_tokens: int = 0

    def __post_init__(self) -> None:
        if not self.outcomes or any(o not in (0, 1) for o in self.outcomes):
            raise InvalidArgument("outcomes", list(self.outcomes), f"a non-empty list of 0/1 for prompt {self.id!r}")
        if self.lengths and (len(self.lengths) != len(self.outcomes) or min(self.lengths) < 1):
            raise InvalidArgument("lengths", list(self.lengths),
                                  f"{len(self.outcomes)} lengths >= 1, one per outcome, for prompt {self.id!r}")
        check_int("prompt_tokens", self.prompt_tokens, minimum=0)

    @property
    def success_rate(self) -> float:
        return sum(self.outcomes) / len(self.outcomes)


@dataclass(frozen=True)
class BudgetConfig:
    """Rules of :func:`plan_budget` (see the module docstring). Lengths in tokens."""

    g_min: int = 2
    g_max: int = 32
    rule: str = "pow2"
    drop_above: float = 0.9
    unsolved_fraction: float = 0.1
    phases: int = 3
    baseline_group_size: int = 16
    default_length: int = 512
    seed: int = 0
    target: float = 0.9

    def __post_init__(self) -> None:
        check_int("g_min", self.g_min, minimum=1)
        check_int("g_max", self.g_max, minimum=self.g_min)
        if self.rule not in RULES:
            raise InvalidArgument("rule", self.rule, "one of " + ", ".join(RULES))
        if isinstance(self.target, bool) or not isinstance(self.target, (int, float)) or not 0.0 < self.target < 1.0:
            raise InvalidArgument("target", self.target, "a probability in (0, 1) that a group's rewards differ "
                                                         "(rule 'informative')")
        if not 0.0 <= self.drop_above <= 1.0:
            raise InvalidArgument("drop_above", self.drop_above, "a success rate in [0, 1]")
        if not 0.0 <= self.unsolved_fraction <= 1.0:
            raise InvalidArgument("unsolved_fraction", self.unsolved_fraction, "a fraction in [0, 1]")
        check_int("phases", self.phases, minimum=1)
        check_int("baseline_group_size", self.baseline_group_size, minimum=1)
        check_int("default_length", self.default_length, minimum=1)
        check_int("seed", self.seed, minimum=0)


@dataclass(frozen=True)
class PromptBudget:
    """The decision for one prompt: ``kept``, why (``reason``), ``group_size`` (0 if dropped),
    ``phase`` (-1 if dropped), ``success_rate`` and ``expected_length`` (tokens)."""

    id: str
    success_rate: float
    kept: bool
    reason: str
    group_size: int
    phase: int
    expected_length: float
    prompt_tokens: int


@dataclass(frozen=True)
class BudgetPlan:
    """Per-prompt decisions and the compute accounting (tokens)."""

    prompts: list[PromptBudget]
    profiling_tokens: float
    training_tokens: float
    baseline_tokens: float
    config: BudgetConfig = field(repr=False)

    @property
    def total_tokens(self) -> float:
        return self.profiling_tokens + self.training_tokens

    @property
    def savings(self) -> float:
        """Baseline tokens / (profiling + training tokens): how many times less compute."""
        return self.baseline_tokens / self.total_tokens if self.total_tokens else float("inf")

    @property
    def kept(self) -> list[PromptBudget]:
        return [p for p in self.prompts if p.kept]

    def phase(self, index: int) -> list[PromptBudget]:
        """The kept prompts of curriculum phase ``index`` (0 = easiest), in order."""
        return sorted((p for p in self.prompts if p.phase == index), key=lambda p: (-p.success_rate, p.id))

    def to_dict(self) -> dict[str, Any]:
        return {"format": "lengthsched.budget/1", "config": asdict(self.config),
                "profiling_tokens": self.profiling_tokens, "training_tokens": self.training_tokens,
                "baseline_tokens": self.baseline_tokens, "savings": self.savings,
                "prompts": [asdict(p) for p in self.prompts]}


def group_size_for(p: float, cfg: BudgetConfig) -> int:
    """Group size by ``cfg.rule`` (near 1/p, or the smallest informative with probability ``cfg.target``),
    clamped to [g_min, g_max]; g_max for p = 0, g_min for p = 1."""
    if not 0.0 <= p <= 1.0:
        raise InvalidArgument("p", p, "a success rate in [0, 1]")
    if p == 0.0:
        return cfg.g_max
    if cfg.rule == "informative":
        if p == 1.0:  # no group is informative: the smallest (kept only with drop_above 1)
            return cfg.g_min
        for g in range(cfg.g_min, cfg.g_max + 1):  # P(rewards differ) grows with g (for 0 < p < 1)
            if 1.0 - p ** g - (1.0 - p) ** g >= cfg.target - 1e-12:
                return g
        return cfg.g_max
    inv = 1.0 / p
    if inv > 2.0 ** 62:  # a tiny p (1/p may be inf): every rule's group is past any g_max
        return cfg.g_max
    g = 2 ** math.floor(math.log2(inv) + 1e-12) if cfg.rule == "pow2" else math.ceil(inv - 1e-12)
    return int(min(cfg.g_max, max(cfg.g_min, g)))


def _hash_unit(seed: int, key: str) -> float:
    digest = hashlib.blake2b(f"sgpo:{seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


def prompt_decision(p: float, key: str, cfg: BudgetConfig) -> tuple[bool, str, int]:
    """sGPO's decision on one prompt with success rate ``p``: (kept, reason, group size). Dropped above
    ``drop_above`` ("trivial"); at p = 0 kept at ``g_max`` for a seeded ``unsolved_fraction`` (``key`` hashed with
    the seed: "unsolved, sampled"), else dropped ("unsolved"); otherwise kept at :func:`group_size_for` (p)
    ("informative"). A dropped prompt's size is 0."""
    if p > cfg.drop_above:
        return False, "trivial", 0
    if p == 0.0:
        kept = _hash_unit(cfg.seed, key) < cfg.unsolved_fraction
        return kept, ("unsolved, sampled" if kept else "unsolved"), (cfg.g_max if kept else 0)
    return True, "informative", group_size_for(p, cfg)


def plan_budget(profile: Sequence[ProfileRecord], config: BudgetConfig | None = None) -> BudgetPlan:
    """Keep, size, order and account the prompts of ``profile`` (see the module docstring)."""
    cfg = config or BudgetConfig()
    if not profile:
        raise InvalidArgument("profile", [], "at least one profiled prompt")
    ids = [r.id for r in profile]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise InvalidArgument("profile", dup, "each prompt id once")
    decisions: list[dict[str, Any]] = []
    profiling = training = baseline = 0.0
    for r in profile:
        p = r.success_rate
        length = float(np.mean(r.lengths)) if r.lengths else float(cfg.default_length)
        profiling += len(r.outcomes) * (length + r.prompt_tokens)
        baseline += cfg.baseline_group_size * (length + r.prompt_tokens)
        kept, reason, g = prompt_decision(p, r.id, cfg)
        training += g * (length + r.prompt_tokens)
        decisions.append(dict(id=r.id, success_rate=p, kept=kept, reason=reason, group_size=g, phase=-1,
                              expected_length=length, prompt_tokens=r.prompt_tokens))
    order = sorted((d for d in decisions if d["kept"]), key=lambda d: (-d["success_rate"], d["id"]))
    for i, d in enumerate(order):
        d["phase"] = min(cfg.phases - 1, i * cfg.phases // max(1, len(order)))
    return BudgetPlan([PromptBudget(**d) for d in decisions], profiling, training, baseline, cfg)


#: Why :class:`OnlineBudget` gave a prompt its group size: :func:`plan_budget`'s reasons, and ``"unseen"`` (no
#: group of it observed yet: the trainer's own size).
ONLINE_REASONS = ("unseen", "informative", "trivial", "unsolved", "unsolved, sampled")


class OnlineBudget:
    """sGPO's group sizes from the trainer's own rewards instead of a profiling pass (the module docstring).

    Per prompt key (matched as text, like a profile's ids), the outcomes (1 solved, 0 not) of its latest
    ``memory`` groups (None: every group), and how many groups of it were observed in all. :meth:`group_sizes`
    decides each prompt's next group as :func:`plan_budget` decides on a profile, on the success rate of the
    outcomes remembered: by ``config.rule`` in [``g_min``, ``g_max``]; a prompt it would drop gets ``g_min``; of
    the never solved, a seeded ``unsolved_fraction`` gets ``g_max``, drawn again at every visit (the key and the
    number of groups seen hashed with the seed), so each epoch looks hard at a different tenth; a prompt never
    observed gets the default its caller passes (the trainer's own group size). ``config.baseline_group_size``,
    ``default_length`` and ``phases`` are not used here.

    :attr:`reasons` counts the last :meth:`group_sizes` call's decisions by reason (:data:`ONLINE_REASONS`).

    ``keep_steps``: a resume's reach, in training steps. Beside each prompt's latest ``memory`` groups, the groups
    recorded for the latest ``keep_steps`` steps (counted back from the newest step observed, :attr:`newest_step`)
    are kept too, so :meth:`forget_after` a step that far back restores exactly the memory the budget had then (a
    group of a forgotten step no longer pushes an older one out). 0 (the default) keeps none beyond the memory.
    :attr:`pruned_through` is how far back that holds (:meth:`reaches`), whatever happened before (an earlier
    forget, a file written with a shorter reach).
    """

    def __init__(self, config: BudgetConfig | None = None, *, memory: int | None = 2, keep_steps: int = 0):
        if config is not None and not isinstance(config, BudgetConfig):
            raise InvalidArgument("config", type(config).__name__, "a lengthsched.sgpo.BudgetConfig or None")
        self.config = config or BudgetConfig()
        self.memory = None if memory is None else check_int("memory", memory, minimum=1)
        self.keep_steps = check_int("keep_steps", keep_steps, minimum=0)
        self.newest_step: int | None = None  # the latest training step a group was recorded for (forget_after
        # sets it back)
        self.pruned_through: int | None = None  # the latest step up to which groups beyond the memory were let go
        self._tags: dict[str, tuple[Any, int, int, int]] = {}  # tag -> (key, solved, samples, step) of its group
        self._tags_cap = 1024
        self._groups: dict[Any, list[tuple[int, int, int | None]]] = {}  # key -> kept (solved, samples, the
        # training step it was observed in, or None), oldest first; the latest ``memory`` of them decide
        self._visits: dict[Any, int] = {}  # key -> groups observed in all
        self.groups = 0  # groups observed, every prompt
        self.samples = 0  # completions observed
        self.solved = 0  # of them, solved
        self.reasons: dict[str, int] = {}

    def __len__(self) -> int:
        """Prompts observed."""
        return len(self._groups)

    @staticmethod
    def _key(key: Any) -> Any:
        return state_key(str(key))

    def observe(self, key: Any, outcomes: Sequence[Any], step: int | None = None, tag: str | None = None) -> None:
        """Record one group of prompt ``key``: ``outcomes``, 1 (or True) for each completion that solved it, 0 for
        each that did not; ``step``: the training step it was generated for, if known (:meth:`forget_after`);
        ``tag``: a name for this group (a trainer's id of the dispatch, e.g. verl's uid), kept while the group is
        within :attr:`keep_steps` of the newest step, by which :meth:`forget_tags` forgets it. An empty group records
        nothing."""
        step = None if step is None else check_int("step", step, minimum=0)
        if tag is not None and not isinstance(tag, str):
            raise InvalidArgument("tag", tag, "a string naming the group, or None")
        if isinstance(outcomes, (str, bytes)) or not isinstance(outcomes, Sequence | np.ndarray):
            raise InvalidArgument("outcomes", repr(outcomes), "a sequence of 0/1, one per completion")
        values = list(outcomes)
        if any(not (isinstance(o, (bool, int, float, np.integer, np.floating, np.bool_)) and o in (0, 1))
               for o in values):
            raise InvalidArgument("outcomes", values, "0 (not solved) or 1 (solved) for every completion")
        if not values:
            return
        k, solved = self._key(key), int(sum(values))
        remembered = self._groups.setdefault(k, [])
        remembered.append((solved, len(values), step))
        if step is not None and (self.newest_step is None or step > self.newest_step):
            self.newest_step = step
        if tag is not None and step is not None:
            self._tags[tag] = (k, solved, len(values), step)
            if len(self._tags) > self._tags_cap:  # now and then, let go of the tags out of reach
                self._tags = self._tags_in_reach()
                self._tags_cap = max(1024, 2 * len(self._tags))
        self._prune(remembered)
        self._visits[k] = self._visits.get(k, 0) + 1
        self.groups += 1
        self.samples += len(values)
        self.solved += solved

    def _prune(self, kept: list[tuple[int, int, int | None]]) -> None:
        """Let go, in place, of what neither the memory nor :attr:`keep_steps` needs: of the groups recorded for a
        step at least ``keep_steps`` before :attr:`newest_step` (or for none), all but the latest ``memory``; later
        groups all stay (what the memory was at each of those steps)."""
        if self.memory is None or len(kept) <= self.memory:
            return
        horizon = self._horizon()
        older = [i for i, g in enumerate(kept) if horizon is None or g[2] is None or g[2] <= horizon]
        if len(older) > self.memory:
            gone = set(older[: len(older) - self.memory])
            kept[:] = [g for i, g in enumerate(kept) if i not in gone]
            if horizon is not None:  # forgetting back before it may miss what was let go
                self.pruned_through = horizon if self.pruned_through is None else max(self.pruned_through, horizon)

    def _horizon(self) -> int | None:
        """The latest step whose groups beyond the memory may be let go (None: no step recorded yet)."""
        return None if self.newest_step is None else self.newest_step - self.keep_steps

    def reaches(self, step: int) -> bool:
        """Whether :meth:`forget_after` ``step`` is exact: it forgets nothing (no group recorded for a later step),
        or every prompt's latest ``memory`` groups up to ``step`` are still kept (``step`` at or after
        :attr:`pruned_through`, or nothing with a step was let go)."""
        step = check_int("step", step, minimum=0)
        return self.pruned_through is None or step >= self.pruned_through or \
            self.newest_step is None or step >= self.newest_step

    def _remembered(self, key: Any) -> list[tuple[int, int, int | None]]:
        """The groups that decide: the latest ``memory`` kept."""
        kept = self._groups.get(key, [])
        return kept if self.memory is None else kept[-self.memory:]

    def observe_rewards(self, key: Any, rewards: Sequence[Any], solved_reward: float = SOLVED_REWARD,
                        step: int | None = None, tag: str | None = None) -> None:
        """:meth:`observe` a group by its rewards: a completion solved the prompt when its reward is at least
        ``solved_reward`` (math rewards are 1 and 0, or 1 and -1)."""
        solved_reward = check_solved_reward("solved_reward", solved_reward)
        if isinstance(rewards, (str, bytes)) or not isinstance(rewards, Sequence | np.ndarray):
            raise InvalidArgument("rewards", repr(rewards), "a sequence of numbers, one per completion")
        values = []
        for r in rewards:
            if isinstance(r, (bool, np.bool_)) or not isinstance(r, (int, float, np.integer, np.floating)) \
                    or not math.isfinite(r):
                raise InvalidArgument("rewards", r, "a finite number for every completion")
            values.append(int(r >= solved_reward))
        self.observe(key, values, step, tag)

    def success_rate(self, key: Any) -> float | None:
        """The share of the remembered completions of ``key`` that solved it; None for a prompt never observed."""
        remembered = self._remembered(self._key(key))
        if not remembered:
            return None
        return sum(g[0] for g in remembered) / sum(g[1] for g in remembered)

    def _tags_in_reach(self) -> dict[str, tuple[Any, int, int, int]]:
        """The tags of groups within :attr:`keep_steps` of the newest step (those a resume may forget)."""
        horizon = self._horizon()
        return {t: v for t, v in self._tags.items() if horizon is None or v[3] >= horizon}

    def _remove(self, key: Any, gone: list[tuple[int, int, int | None]]) -> None:
        """Forget the groups ``gone`` of prompt ``key`` (their counts too)."""
        if not gone:
            return
        self._visits[key] -= len(gone)
        self.groups -= len(gone)
        self.samples -= sum(g[1] for g in gone)
        self.solved -= sum(g[0] for g in gone)
        if not self._groups[key]:
            del self._groups[key], self._visits[key]
        if not self._groups:  # nothing left: the totals start again (they count groups the memory let go too)
            self.groups = self.samples = self.solved = 0

    def forget_tags(self, tags: Iterable[Any]) -> int:
        """Forget the groups recorded with these tags (:meth:`observe`): a trainer that dispatches again, after a
        resume, prompts whose groups finished after its checkpoint (verl re-issues its in-flight prompts with their
        uids). A tag the budget does not hold (never given, or out of reach) is passed over. Returns how many groups
        were forgotten."""
        gone = 0
        for tag in tags:
            entry = self._tags.pop(str(tag), None)
            if entry is None:
                continue
            k, solved, samples, step = entry
            kept = self._groups.get(k, [])
            for i in range(len(kept) - 1, -1, -1):
                if kept[i] == (solved, samples, step):
                    del kept[i]
                    self._remove(k, [(solved, samples, step)])
                    gone += 1
                    break
        return gone

    def forget_after(self, step: int) -> int:
        """Forget the remembered groups observed for a training step after ``step`` (a run resumed from its
        checkpoint at ``step`` generates them again; a fresh run, from step 0, forgets every group another run
        recorded with its steps). Groups recorded without a step stay. Where :meth:`reaches` ``step`` (within
        :attr:`keep_steps` of :attr:`newest_step`, unless an earlier forget or a file with a shorter reach cut
        deeper) this is exact: each prompt's latest ``memory`` groups up to ``step`` decide again; further back, an
        older group a forgotten one pushed out of the memory does not come back. The totals
        (:attr:`groups`, ...) keep the groups the memory let go. Returns how many groups were forgotten."""
        step = check_int("step", step, minimum=0)
        gone = 0
        for k in list(self._groups):
            remembered = self._groups[k]
            late = [g for g in remembered if g[2] is not None and g[2] > step]
            if not late:
                continue
            self._groups[k] = [g for g in remembered if g[2] is None or g[2] <= step]
            self._remove(k, late)
            gone += len(late)
        if not self._groups:
            self.groups = self.samples = self.solved = 0
        self._tags = {t: v for t, v in self._tags.items() if v[3] <= step}
        if self.newest_step is not None:
            self.newest_step = min(self.newest_step, step)
        return gone

    def decide(self, key: Any, default_n: int) -> tuple[int, str]:
        """(group size, reason) of prompt ``key``'s next group (the class docstring)."""
        default_n = check_int("default_n", default_n, minimum=1)
        p = self.success_rate(key)
        if p is None:
            return default_n, "unseen"
        k = self._key(key)
        kept, reason, g = prompt_decision(p, f"{k}:{self._visits[k]}", self.config)
        return (g if kept else self.config.g_min), reason

    def group_sizes(self, keys: Sequence[Any], default_n: int | Sequence[int]) -> list[int]:
        """:meth:`decide` for every key: the size of each prompt's next group. ``default_n``: the size of a prompt
        never observed, one for all or one per key."""
        defaults = [default_n] * len(keys) if isinstance(default_n, (int, np.integer)) else list(default_n)
        if len(defaults) != len(keys):
            raise InvalidArgument("default_n", f"{len(defaults)} values", f"{len(keys)}, one per key, or one int")
        self.reasons = {}
        sizes = []
        for key, n in zip(keys, defaults):
            g, reason = self.decide(key, n)
            self.reasons[reason] = self.reasons.get(reason, 0) + 1
            sizes.append(g)
        return sizes

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able copy (keys as text; a long one under its digest, :func:`~lengthsched.online.state_key`)."""
        return {"format": "lengthsched.online_budget/1", "config": asdict(self.config), "memory": self.memory,
                "keep_steps": self.keep_steps, "newest_step": self.newest_step, "pruned_through": self.pruned_through,
                "groups": self.groups, "samples": self.samples, "solved": self.solved,
                "prompts": {str(k): {"visits": self._visits[k], "groups": [list(g) for g in v]}
                            for k, v in self._groups.items()},
                "tags": {t: [str(v[0]), *v[1:]] for t, v in self._tags_in_reach().items()}}

    @classmethod
    def from_dict(cls, data: Any) -> OnlineBudget:
        """The budget :meth:`to_dict` wrote."""
        if not isinstance(data, dict) or data.get("format") != "lengthsched.online_budget/1" \
                or not isinstance(data.get("prompts"), dict):
            raise InvalidArgument("data", type(data).__name__, "a dict written by OnlineBudget.to_dict")
        try:
            budget = cls(BudgetConfig(**data.get("config", {})), memory=data.get("memory", 2),
                         keep_steps=data.get("keep_steps", 0))
        except TypeError as exc:
            raise InvalidArgument("data", "config", f"BudgetConfig's fields ({exc})") from None
        for key, saved in data["prompts"].items():
            groups = saved.get("groups") if isinstance(saved, dict) else None
            if not isinstance(groups, list) or not groups or any(
                    not isinstance(g, list) or len(g) not in (2, 3) or not all(type(x) is int for x in g[:2])
                    or not 0 <= g[0] <= g[1] or g[1] < 1
                    or len(g) == 3 and g[2] is not None and (type(g[2]) is not int or g[2] < 0) for g in groups):
                raise InvalidArgument("data", f"prompt {key!r}", "groups as [solved, samples, step] (step: null or "
                                                                 "an integer >= 0), 0 <= solved <= samples >= 1")
            budget._groups[key] = [(int(g[0]), int(g[1]), g[2] if len(g) == 3 else None) for g in groups]
            budget._visits[key] = check_int("visits", saved.get("visits", len(groups)), minimum=len(groups))
        for name in ("groups", "samples", "solved"):
            setattr(budget, name, check_int(name, data.get(name, 0), minimum=0))
        newest = data.get("newest_step", max((g[2] for kept in budget._groups.values() for g in kept
                                              if g[2] is not None), default=None))
        budget.newest_step = None if newest is None else check_int("newest_step", newest, minimum=0)
        # a file written before the reach was saved: pruned to its newest step (keep_steps 0)
        cut = data["pruned_through"] if "pruned_through" in data else budget.newest_step
        budget.pruned_through = None if cut is None else check_int("pruned_through", cut, minimum=0)
        tags = data.get("tags", {})
        if not isinstance(tags, dict) or any(
                not isinstance(v, list) or len(v) != 4 or not isinstance(v[0], str)
                or not all(type(x) is int and x >= 0 for x in v[1:]) for v in tags.values()):
            raise InvalidArgument("data", "tags", "tag -> [prompt key, solved, samples, step]")
        budget._tags = {str(t): (v[0], v[1], v[2], v[3]) for t, v in tags.items()}
        return budget


def read_online_budget(path: str | os.PathLike | None, argument: str, config: BudgetConfig | None = None, *,
                       memory: int | None = 2, keep_steps: int = 0) -> OnlineBudget:
    """The :class:`OnlineBudget` saved at ``path`` (a run resumed from a checkpoint keeps each prompt's history),
    its rules replaced by ``config``, ``memory`` and ``keep_steps`` (those of the run resuming); a fresh one where
    ``path`` is None or not there yet. A file that is not such JSON is an error naming ``argument`` (the setting that
    gave it)."""
    fresh = OnlineBudget(config, memory=memory, keep_steps=keep_steps)
    if path is None or not os.path.exists(path):
        return fresh
    try:
        with open(path, encoding="utf-8") as handle:
            saved = OnlineBudget.from_dict(json.load(handle))
    except (OSError, ValueError) as exc:
        raise InvalidArgument(argument, str(path), f"a JSON file of lengthsched's online sGPO budget ({exc})") from None
    saved.config, saved.memory, saved.keep_steps = fresh.config, fresh.memory, fresh.keep_steps
    for kept in saved._groups.values():
        saved._prune(kept)
    return saved


#: The rules an online budget's options may set (:func:`online_budget_from_options`).
ONLINE_RULE_OPTIONS = ("g_min", "g_max", "rule", "target", "drop_above", "unsolved_fraction", "seed")


def reach_steps(keep_steps: Any, save_every: Any, name: str) -> int:
    """An online budget's ``keep_steps``: as set (``name``: the option that set it, for errors), else ``save_every``
    + 1 where the trainer saves a checkpoint every ``save_every`` steps (it resumes from the latest; the budget file
    lags its steps by one collection), else 0 (no checkpoints: no reach)."""
    if keep_steps is not None:
        return check_int(name, keep_steps, minimum=0)
    if isinstance(save_every, bool) or not isinstance(save_every, (int, np.integer)) or save_every <= 0:
        return 0
    return int(save_every) + 1


def online_budget_from_options(options: Mapping[str, Any], name: Callable[[str], str], *, rule: str, why_two: str,
                               save_every: Any = None) -> tuple[OnlineBudget, str | None]:
    """A trainer's online budget from its options (``options``: those set): the rules (:data:`ONLINE_RULE_OPTIONS`;
    ``rule``: the default rule; ``g_min`` at least 2, ``why_two`` saying why the trainer needs it), ``memory``
    (default 2; None: every group), ``keep_steps`` (:func:`reach_steps` with the trainer's ``save_every``) and
    ``state_path`` (a JSON file in a directory that exists, or None), read from there as
    :func:`read_online_budget` reads it. Returns the budget and the path. Errors name each option as
    ``name(option)`` (e.g. ``lengthsched.sgpo.g_min``)."""
    rules = {"rule": rule, **{key: options[key] for key in ONLINE_RULE_OPTIONS if key in options}}
    try:
        config = BudgetConfig(**rules)
        memory = options.get("memory", 2)
        memory = None if memory is None else check_int("memory", memory, minimum=1)
    except InvalidArgument as exc:
        raise InvalidArgument(name(exc.name), exc.value, exc.expected) from None
    if config.g_min < 2:
        raise InvalidArgument(name("g_min"), config.g_min, f">= 2: {why_two}")
    keep = reach_steps(options.get("keep_steps"), save_every, name("keep_steps"))
    path = options.get("state_path")
    if path is not None and (not isinstance(path, (str, os.PathLike)) or not str(path)):
        raise InvalidArgument(name("state_path"), path, "a file path (JSON) or null")
    if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise InvalidArgument(name("state_path"), str(path), "a file in a directory that exists (the budget is "
                                                             "written there as the run learns)")
    budget = read_online_budget(path, name("state_path"), config, memory=memory, keep_steps=keep)
    return budget, None if path is None else str(path)


def write_online_budget(path: str | os.PathLike, budget: OnlineBudget) -> None:
    """``budget`` written to ``path`` as JSON, atomically."""
    atomic_write_text(path, json.dumps(budget.to_dict()) + "\n")


def _field_int(name: str, value: Any, minimum: int, where: str) -> int:
    """``value`` as an int >= ``minimum``; the error names the field and the line."""
    try:
        return check_int(name, value, minimum=minimum)
    except InvalidArgument:
        raise InvalidArgument(name, value, f"an integer >= {minimum} at {where}") from None


def read_profile(lines: Iterable[str], source: str = "<profile>") -> list[ProfileRecord]:
    """Profile records from JSON lines: ``{"id", "outcomes": [0/1...] | "solved": n, "samples": k,
    "lengths": [...], "prompt_tokens": n}`` (``outcomes`` or ``solved`` + ``samples``)."""
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source}:{n}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidArgument("profile", where, f"a JSON object per line ({exc.msg})") from None
        if not isinstance(rec, dict) or "id" not in rec:
            raise InvalidArgument("profile", where, "a JSON object with an 'id'")
        if "outcomes" in rec:
            raw = rec["outcomes"]
            if not isinstance(raw, list) or not raw:
                raise InvalidArgument("outcomes", raw, f"a non-empty list of 0/1 at {where}")
            for o in raw:  # true / false are accepted as 1 / 0; anything else (2, "yes", 0.5) is an error
                if not (isinstance(o, (bool, int, float)) and o in (0, 1)):
                    raise InvalidArgument("outcomes", o, f"0 (not solved) or 1 (solved) for every sample at {where}")
            outcomes = tuple(int(o) for o in raw)
        elif "solved" in rec and "samples" in rec:
            k = _field_int("samples", rec["samples"], 1, where)
            s = _field_int("solved", rec["solved"], 0, where)
            if s > k:
                raise InvalidArgument("solved", s, f"at most samples={k} at {where}")
            outcomes = (1,) * s + (0,) * (k - s)
        else:
            raise InvalidArgument("profile", where, "'outcomes' (a list of 0/1) or 'solved' and 'samples'")
        lengths = rec.get("lengths", [])
        if not isinstance(lengths, list):
            raise InvalidArgument("lengths", lengths, f"a list of token counts at {where}")
        out.append(ProfileRecord(str(rec["id"]), outcomes, tuple(_field_int("lengths", x, 1, where) for x in lengths),
                                 _field_int("prompt_tokens", rec.get("prompt_tokens", 0), 0, where)))
    if not out:
        raise InvalidArgument("profile", source, "at least one JSON line")
    return out
