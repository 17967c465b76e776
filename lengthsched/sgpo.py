"""Adaptive group sizes from a difficulty profile (sGPO-style budgeting).

A profiling pass samples k completions of every prompt and records whether each solved it (and,
optionally, its length in tokens). From the estimated success rate p of each prompt:

- **keep**: prompts with p above ``drop_above`` are trivial (every completion of a group would
  score alike, so GRPO's advantages vanish) and are dropped; prompts never solved (p = 0) are kept
  only for a seeded ``unsolved_fraction`` of them (a hash of (seed, prompt id), so the choice is
  stable); the rest are kept;
- **group size** near 1/p (a group of ~1/p completions expects about one success, enough for a
  non-zero advantage), clamped to [g_min, g_max]: rule ``pow2`` takes the power of two at or below
  1/p (the inverse-power-of-two floor), rule ``ceil`` takes ceil(1/p); a kept unsolved prompt gets g_max;
- **curriculum**: kept prompts from easy to hard (p descending, ties by id) in ``phases`` phases of
  near-equal size;
- **compute** in tokens: profiling (k samples per prompt) plus training (each kept prompt's group
  size times its expected completion length, plus its prompt per completion) against a baseline that
  trains every prompt with a fixed group size and profiles nothing. Expected lengths come from the
  profile (mean of the sampled lengths), else ``default_length``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .errors import InvalidArgument, check_int

__all__ = ["ProfileRecord", "BudgetConfig", "PromptBudget", "BudgetPlan", "plan_budget", "group_size_for",
           "read_profile", "RULES"]

RULES = ("pow2", "ceil")


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

    def __post_init__(self) -> None:
        check_int("g_min", self.g_min, minimum=1)
        check_int("g_max", self.g_max, minimum=self.g_min)
        if self.rule not in RULES:
            raise InvalidArgument("rule", self.rule, "one of " + ", ".join(RULES))
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
    """Group size near 1/p, clamped to [g_min, g_max]; g_max for p = 0."""
    if not 0.0 <= p <= 1.0:
        raise InvalidArgument("p", p, "a success rate in [0, 1]")
    if p == 0.0:
        return cfg.g_max
    inv = 1.0 / p
    g = 2 ** math.floor(math.log2(inv) + 1e-12) if cfg.rule == "pow2" else math.ceil(inv - 1e-12)
    return int(min(cfg.g_max, max(cfg.g_min, g)))


def _hash_unit(seed: int, key: str) -> float:
    digest = hashlib.blake2b(f"sgpo:{seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


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
        if p > cfg.drop_above:
            kept, reason = False, "trivial"
        elif p == 0.0:
            kept = _hash_unit(cfg.seed, r.id) < cfg.unsolved_fraction
            reason = "unsolved, sampled" if kept else "unsolved"
        else:
            kept, reason = True, "informative"
        g = group_size_for(p, cfg) if kept else 0
        training += g * (length + r.prompt_tokens)
        decisions.append(dict(id=r.id, success_rate=p, kept=kept, reason=reason, group_size=g, phase=-1,
                              expected_length=length, prompt_tokens=r.prompt_tokens))
    order = sorted((d for d in decisions if d["kept"]), key=lambda d: (-d["success_rate"], d["id"]))
    for i, d in enumerate(order):
        d["phase"] = min(cfg.phases - 1, i * cfg.phases // max(1, len(order)))
    return BudgetPlan([PromptBudget(**d) for d in decisions], profiling, training, baseline, cfg)


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
