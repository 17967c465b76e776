"""Vectorised fast paths: the slot policies on many groups at once (numpy over groups).

``full``, ``full_freed``, ``micro``, ``fixed_slot`` and ``reserve_max`` do not depend on
predictions, so B groups of G completions can be simulated together: list scheduling walks the
G completions once with an (B, g) array of slot free times. Results equal the event engine's
(the tests check it); sweeps and the comparison table use this path for those policies.
"""

from __future__ import annotations

import numpy as np

from lengthsched import InvalidArgument

__all__ = ["FAST_POLICIES", "slot_count", "schedule_many", "steps_and_peaks"]

FAST_POLICIES = ("full", "full_freed", "micro", "fixed_slot", "reserve_max")


def slot_count(policy: str, *, slots: int | None, budget_tokens: int | None, max_new_tokens: int, group_size: int) -> int:
    """g of a slot policy, as the engine policies compute it (min(slots, budget // L_max))."""
    if policy in ("full", "full_freed"):
        return group_size
    caps = [c for c in (slots, None if budget_tokens is None else budget_tokens // max_new_tokens) if c is not None]
    if not caps or min(caps) < 1:
        raise InvalidArgument("budget_tokens", budget_tokens, f"slots or a budget of at least max_new_tokens={max_new_tokens}")
    return min(caps)


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
    """Decode steps, peak KV tokens and most live rows of each group (arrays of length B)."""
    starts, release = schedule_many(lengths, policy, g)
    padded = policy in ("full", "micro")
    held_until = release if padded else starts + lengths - 1
    grow = held_until - starts + 1 if padded else lengths  # a padded row keeps growing until released
    # KV peaks at the end of some release step: evaluate there, chunked to bound memory.
    peaks = np.zeros(len(lengths), dtype=np.int64)
    chunk = max(1, 2_000_000 // max(1, lengths.shape[1] ** 2))
    for lo in range(0, len(lengths), chunk):
        s, h, gr = starts[lo:lo + chunk, None, :], held_until[lo:lo + chunk, None, :], grow[lo:lo + chunk, None, :]
        at = held_until[lo:lo + chunk, :, None]  # (b, G, 1): candidate steps
        live = (s <= at) & (at <= h)
        peaks[lo:lo + chunk] = np.where(live, np.minimum(at - s + 1, gr), 0).sum(axis=2).max(axis=1)
    return {"steps": release.max(axis=1), "peak_kv": peaks, "max_live": np.full(len(lengths), min(g, lengths.shape[1]))}
