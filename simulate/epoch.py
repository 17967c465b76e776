"""A whole training epoch in the simulator: many prompts, each with its own group size, one memory
budget, under a sampling policy; adaptive group sizes (``lengthsched.sgpo``) against a fixed G.

Each prompt's group is generated on its own (one after another, the budget for one group at a
time), so an epoch's decode steps are the sum over its groups. The lengths of a prompt's
completions are drawn with replacement from its profiled sample lengths (seeded by (seed, prompt
id)); a prompt profiled without lengths draws from a log-normal around ``default_length`` with the
within-prompt spread fitted to CASTILLO (``simulate.workloads``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lengthsched.errors import InvalidArgument
from lengthsched.sgpo import BudgetPlan, ProfileRecord

from .run import run_group
from .workloads import castillo_spread

__all__ = ["EpochResult", "epoch_groups", "run_epoch", "compare_epochs"]


@dataclass(frozen=True)
class EpochResult:
    """Totals of one epoch under one policy: decode ``steps``, completion ``tokens``, the largest
    ``peak_kv_tokens`` of any group, ``preemptions``, and how many ``groups`` / ``completions``."""

    policy: str
    groups: int
    completions: int
    steps: int
    tokens: int
    peak_kv_tokens: int
    preemptions: int


def _rng(seed: int, key: str) -> np.random.Generator:
    return np.random.default_rng([seed, int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(),
                                                        "little") >> 1])


def epoch_groups(profile: Sequence[ProfileRecord], sizes: dict[str, int], *, max_new_tokens: int,
                 default_length: int = 512, seed: int = 0) -> list[tuple[str, int, np.ndarray]]:
    """(prompt id, prompt tokens, completion lengths) for every prompt with a size in ``sizes``."""
    out = []
    spread = castillo_spread()
    for r in profile:
        g = sizes.get(r.id, 0)
        if g < 1:
            continue
        rng = _rng(seed, r.id)
        if r.lengths:
            lengths = rng.choice(np.asarray(r.lengths, dtype=np.int64), size=g, replace=True)
        else:
            lengths = np.rint(default_length * np.exp(spread * rng.standard_normal(g))).astype(np.int64)
        out.append((r.id, r.prompt_tokens, np.clip(lengths, 1, max_new_tokens)))
    return out


def run_epoch(groups: Sequence[tuple[str, int, np.ndarray]], policy: str, *, max_new_tokens: int,
              slots: int | None = None, budget_tokens: int | None = None, oracle: bool = True) -> EpochResult:
    """Simulate every group of an epoch under ``policy``; ``oracle`` gives length-aware policies
    the true lengths as predictions."""
    if not groups:
        raise InvalidArgument("groups", [], "at least one group")
    steps = tokens = peak = pre = completions = 0
    for _, prompt_tokens, lengths in groups:
        res = run_group(lengths, policy, max_new_tokens=max_new_tokens, prompt_len=prompt_tokens, slots=slots,
                        budget_tokens=budget_tokens, predicted=lengths if oracle else None)
        steps += res.steps
        tokens += res.tokens
        peak = max(peak, res.peak_kv_tokens)
        pre += res.preemptions
        completions += len(lengths)
    return EpochResult(policy, len(groups), completions, steps, tokens, peak, pre)


def compare_epochs(profile: Sequence[ProfileRecord], plan: BudgetPlan, policies: Sequence[str], *,
                   max_new_tokens: int, slots: int | None = None, budget_tokens: int | None = None,
                   seed: int = 0) -> list[dict[str, Any]]:
    """For each policy: the adaptive epoch (kept prompts, their group sizes) against the fixed-G
    epoch (every prompt, ``plan.config.baseline_group_size``): steps and tokens of both."""
    cfg = plan.config
    adaptive = epoch_groups(profile, {p.id: p.group_size for p in plan.kept}, max_new_tokens=max_new_tokens,
                            default_length=cfg.default_length, seed=seed)
    fixed = epoch_groups(profile, {r.id: cfg.baseline_group_size for r in profile}, max_new_tokens=max_new_tokens,
                         default_length=cfg.default_length, seed=seed)
    rows = []
    for policy in policies:
        a = run_epoch(adaptive, policy, max_new_tokens=max_new_tokens, slots=slots, budget_tokens=budget_tokens) \
            if adaptive else None
        f = run_epoch(fixed, policy, max_new_tokens=max_new_tokens, slots=slots, budget_tokens=budget_tokens)
        rows.append({"policy": policy, "adaptive": a, "fixed": f,
                     "steps_ratio": (a.steps / f.steps) if a else 0.0})
    return rows
