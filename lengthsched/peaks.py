"""Peak memory and step count of each sampling policy of docs/model.md section 4, for given lengths.

Every policy is turned into a :class:`~lengthsched.schedule.Schedule` (when each completion runs
and when its KV is released) and measured with the exact bytes-held curve of the memory model, so
the numbers include block rounding, windows, compression and the prompt-sharing mode.

- ``full``: all G decode together from step 1. With ``free_kv="batch_end"`` (padded ``generate``)
  a finished row keeps decoding pad tokens, so every row holds max(l) tokens at the end.
- ``micro``: rounds of ``slots`` consecutive completions; a round ends with its longest member
  (padded the same way with ``free_kv="batch_end"``).
- ``continuous``: ``slots`` fixed slots refilled in completion-index order (FCFS), each finished
  completion freed at once; it must reserve ``max_new_tokens`` per slot.
- ``length_aware``: :func:`~lengthsched.plan_group` on the ``predicted`` lengths (default: the true
  ones, an oracle), run on the true lengths; it reserves what the plan reserves.

The dynamic-slot policy (biased, stop at G) and the engine baselines (vLLM-like, SGLang-like,
reserve-max) depend on budget dynamics and preemption; the simulator (``simulate``) models them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from .errors import InvalidArgument, as_lengths, check_int
from .memory import FreeKV, ModelMemory
from .plan import plan_group
from .runtime.registry import POLICIES
from .schedule import Schedule, execute, held_bytes

__all__ = ["Policy", "PolicyPeak", "policy_peak"]


# The policies with an analytic schedule, as lengthsched.runtime.POLICIES names them here
# (``continuous`` is the registry's ``fixed_slot``).
Policy = Enum("Policy", [(spec.peaks.upper(), spec.peaks) for spec in POLICIES.values() if spec.peaks], type=str)


@dataclass(frozen=True)
class PolicyPeak:
    """``steps`` decode steps; ``peak_bytes`` the most held in one step (W + A + KV) and
    ``peak_kv_bytes`` its KV part (prompt included); ``reserved_bytes`` what the policy must set
    aside up front to be safe for any completion it may produce."""

    policy: str
    steps: int
    peak_bytes: int
    peak_kv_bytes: int
    reserved_bytes: int
    schedule: Schedule


def _rounds(lengths: np.ndarray, g: int) -> tuple[np.ndarray, np.ndarray]:
    starts = np.zeros(len(lengths), dtype=np.int64)
    release = np.zeros(len(lengths), dtype=np.int64)
    t = 0
    for first in range(0, len(lengths), g):
        members = slice(first, first + g)
        starts[members] = t + 1
        t += int(lengths[members].max())
        release[members] = t
    return starts, release


def policy_peak(
    memory: ModelMemory,
    policy: str,
    lengths: Any,
    *,
    prompt_tokens: int = 0,
    slots: int | None = None,
    max_new_tokens: int | None = None,
    predicted: Any = None,
    reserve_lengths: Any = None,
    budget_bytes: int | None = None,
    refill: str = "sjf",
    eps: float = 0.05,
) -> PolicyPeak:
    """Steps and peak memory of ``policy`` generating completions of true ``lengths`` (tokens).

    ``slots`` is g (required except for ``full``, and for ``length_aware`` when ``budget_bytes``
    is given). ``max_new_tokens`` defaults to the longest length.
    """
    try:
        kind = Policy(policy)
    except ValueError:
        raise InvalidArgument("policy", policy, "one of " + ", ".join(p.value for p in Policy)) from None
    true = as_lengths("lengths", lengths, minimum=1)
    max_new = int(true.max()) if max_new_tokens is None else check_int("max_new_tokens", max_new_tokens, minimum=1)
    if true.max() > max_new:
        raise InvalidArgument("lengths", lengths, f"lengths <= max_new_tokens={max_new}")
    n = len(true)
    needs_slots = kind in (Policy.MICRO, Policy.CONTINUOUS) or (kind is Policy.LENGTH_AWARE and budget_bytes is None)
    if needs_slots and slots is None:
        raise InvalidArgument("slots", None, f"the number of slots g for policy '{kind.value}'")
    g = n if slots is None else min(check_int("slots", slots, minimum=1), n)
    padded = memory.free_kv is FreeKV.BATCH_END
    idx = np.arange(n)
    if kind is Policy.FULL:
        starts, release = np.ones(n, dtype=np.int64), np.full(n, int(true.max()), dtype=np.int64)
    elif kind is Policy.MICRO:
        starts, release = _rounds(true, g)
    if kind in (Policy.FULL, Policy.MICRO):
        schedule = Schedule(true, starts, idx % g, idx)
        # A padded row keeps decoding (pad tokens, growing KV) until its batch ends.
        account = Schedule(release - starts + 1, starts, schedule.lanes, idx) if padded else schedule
        reserved = None
    else:
        plan = plan_group(
            true if predicted is None else predicted, max_new_tokens=max_new, slots=slots,
            budget_bytes=budget_bytes, memory=memory, prompt_tokens=prompt_tokens, eps=eps,
            reserve_lengths=reserve_lengths,
            **({"refill": "fcfs", "grouping": "none"} if kind is Policy.CONTINUOUS else {"refill": refill}),
        )
        schedule = account = execute(plan, true, memory=memory)
        reserved = plan.peak_reserved_bytes
    curve = held_bytes(account, memory, prompt_tokens)
    kv_only = held_bytes(account, memory, prompt_tokens, with_activations=False)
    peak = int(curve.max())
    return PolicyPeak(
        policy=kind.value,
        steps=account.steps,
        peak_bytes=peak,
        peak_kv_bytes=int(kv_only.max()) - memory.weights_bytes,
        reserved_bytes=peak if reserved is None else int(reserved),
        schedule=schedule,
    )
