"""Vectorised fast paths: the slot policies on many groups at once (numpy over groups).

``full``, ``full_freed``, ``micro``, ``fixed_slot`` and ``reserve_max`` do not depend on
predictions, so B groups of G completions can be simulated together: list scheduling walks the
G completions once with an (B, g) array of slot free times. Results equal the event engine's
(the tests check it); sweeps and the comparison table use this path for those policies.
"""

from __future__ import annotations

import numpy as np

from lengthsched import InvalidArgument
from lengthsched.runtime import POLICIES, slot_cap
from lengthsched.runtime.timing import DEFAULT_PREFILL_CHUNK, prompt_prefill_seconds

__all__ = ["FAST_POLICIES", "slot_count", "schedule_many", "steps_and_peaks", "seconds_many"]

# full, full_freed, micro, fixed_slot, reserve_max
FAST_POLICIES = tuple(n for n, spec in POLICIES.items() if spec.fast)


def slot_count(policy: str, *, slots: int | None, budget_tokens: int | None, max_new_tokens: int,
               group_size: int) -> int:
    """g of a slot policy, as the engine's policies compute it (``full`` runs all G at once)."""
    if policy in ("full", "full_freed"):
        return group_size
    return slot_cap(policy, slots=slots, budget_tokens=budget_tokens, max_new_tokens=max_new_tokens)


def schedule_many(lengths: np.ndarray, policy: str, g: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, release): first step of each completion and the step after which its KV is freed.

    ``lengths``: (B, G) tokens. Padded batches release every member at the batch's end.
    """
    if policy not in FAST_POLICIES:
        raise InvalidArgument("policy", policy, "one of " + ", ".join(FAST_POLICIES))
    batch, size = lengths.shape
    if policy in ("full", "full_freed"):
        starts = np.ones_like(lengths)
        ends = lengths.copy()
        release = np.repeat(lengths.max(axis=1, keepdims=True), size, axis=1) if policy == "full" else ends
        return starts, release
    if policy == "micro":
        rounds = -(-size // g)
        padded = np.zeros((batch, rounds * g), dtype=lengths.dtype)
        padded[:, :size] = lengths
        ends = np.cumsum(padded.reshape(batch, rounds, g).max(axis=2), axis=1)  # (B, rounds)
        begin = np.concatenate((np.zeros((batch, 1), dtype=ends.dtype), ends[:, :-1]), axis=1) + 1
        starts = np.repeat(begin, g, axis=1)[:, :size]
        release = np.repeat(ends, g, axis=1)[:, :size]
        return starts, release
    free = np.zeros((batch, min(g, size)), dtype=np.int64)  # step after which each slot is free
    starts = np.empty_like(lengths)
    rows = np.arange(batch)
    for i in range(size):
        slot = np.argmin(free, axis=1)  # the lowest-numbered free slot, as the engine picks it
        starts[:, i] = free[rows, slot] + 1
        free[rows, slot] += lengths[:, i]
    return starts, starts + lengths - 1


def steps_and_peaks(lengths: np.ndarray, policy: str, g: int) -> dict[str, np.ndarray]:
    """Decode steps, peak KV tokens and most live rows of each group (arrays of length B).

    A row live from step s to step h (its release; a padded row keeps growing until then) holds
    t - s + 1 tokens after step t, so the KV held after step t is n(t) (t + 1) - sum of s over the
    n(t) live rows. It peaks at the end of some release step; n and the sums come from sorted
    starts and releases, in O(G log G) per group.
    """
    starts, release = schedule_many(lengths, policy, g)
    held_until = release if policy in ("full", "micro") else starts + lengths - 1
    batch, size = lengths.shape
    offset = (np.arange(batch, dtype=np.int64) * (int(held_until.max()) + 2))[:, None]
    s_sorted = np.sort(starts, axis=1)
    by_end = np.argsort(held_until, axis=1, kind="stable")
    h_sorted = np.take_along_axis(held_until, by_end, axis=1)
    s_by_end = np.take_along_axis(starts, by_end, axis=1)
    zeros = np.zeros((batch, 1), dtype=np.int64)
    s_prefix = np.concatenate((zeros, np.cumsum(s_sorted, axis=1)), axis=1).ravel()
    e_prefix = np.concatenate((zeros, np.cumsum(s_by_end, axis=1)), axis=1).ravel()
    at = held_until + offset  # candidate steps, made comparable across rows by the offset
    rows = np.arange(batch)[:, None] * size
    started = np.searchsorted((s_sorted + offset).ravel(), at.ravel(), side="right").reshape(batch, size) - rows
    ended = np.searchsorted((h_sorted + offset).ravel(), at.ravel(), side="left").reshape(batch, size) - rows
    base = np.arange(batch)[:, None] * (size + 1)
    start_sum = s_prefix[base + started] - e_prefix[base + ended]
    kv = (started - ended) * (held_until + 1) - start_sum
    return {"steps": release.max(axis=1), "peak_kv": kv.max(axis=1),
            "max_live": np.full(batch, min(g, size))}


def seconds_many(lengths: np.ndarray, policy: str, g: int, cost, *, prompt_lens=None,
                 prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK) -> np.ndarray:
    """Modelled seconds of each group (array of length B) under ``cost`` (a ``lengthsched.cost.StepCost``),
    as ``run_group`` prices it: every step's decode rows (padded rows included) reading their prompt
    and the tokens they hold, plus the prompt's first prefill. ``prompt_lens``: (B,) tokens.

    Per-step rows and KV read come from difference arrays over the starts and releases; each step
    is priced on its own (the event engine sums runs of steps in closed form: the same seconds).
    """
    starts, release = schedule_many(lengths, policy, g)
    held_until = release if policy in ("full", "micro") else starts + lengths - 1
    batch, _ = lengths.shape
    prompts = np.zeros(batch, dtype=np.int64) if prompt_lens is None else np.asarray(prompt_lens, dtype=np.int64)
    horizon = int(held_until.max()) + 2
    rows = np.zeros((batch, horizon), dtype=np.int64)
    first = np.zeros((batch, horizon), dtype=np.int64)
    index = np.arange(batch)[:, None]
    np.add.at(rows, (index, starts), 1)
    np.add.at(rows, (index, held_until + 1), -1)
    np.add.at(first, (index, starts), starts)
    np.add.at(first, (index, held_until + 1), -starts)
    rows, first = np.cumsum(rows, axis=1), np.cumsum(first, axis=1)
    t = np.arange(horizon)[None, :]
    # A row started at s produces its (t - s + 1)-th token at step t, attending its prompt and t - s earlier ones.
    kv = rows * t - first + rows * prompts[:, None]
    decode = np.asarray(cost.seconds(rows, kv, 0), dtype=np.float64).sum(axis=1)
    return decode + prompt_prefill_seconds(cost, prompts, prefill_chunk)
