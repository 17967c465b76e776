"""Length classes: placing a rollout step's completions on engine replicas by their lengths.

An engine replica pays a decode step's fixed cost (the launch overhead and reading the weights) for
as many steps as its longest completion runs, whatever else it runs. Spreading every group over
every replica (verl) makes every replica run about as many steps as the longest completion of the
step, each under a share of the whole load. Gathering the longest completions on few replicas (their
steps are cheap: few rows) and giving the short ones to replicas that then run few steps can finish
the step sooner: :func:`length_classes` sorts the completions longest first and cuts that order into
one contiguous class per replica, the classes sized so that every replica's estimate

    ``C x (its longest completion) + (the work of its tokens)``   (seconds)

stays under the smallest makespan ``T`` that ``replicas`` replicas can hold (a bisection on ``T``).
``C`` and the work come from the step-cost model (:meth:`lengthsched.cost.StepCost.lower_bound_parts`);
``lam`` weighs a replica's longest completion (1) against its KV area over its pool (0: a replica
whose pool is full runs as many steps as its completions' token-steps over the pool).

The same items and greedy, relaxed so that a completion's work may be split, give a lower bound on
any schedule's makespan (``simulate.rollout``). The placement is only as good as the lengths it is
given, completion by completion: with the true lengths it is the strongest placement measured here;
with one length per group (a prompt-level predictor, even one that knew each group's true median,
or the online predictor after an earlier epoch of the same prompts) it is no faster than verl's
spread on average, because which sibling is the long one decides where the long tail lands
(docs/benchmarks.md, "Length classes"). Use it where each completion's length is known, or to
measure what that knowledge would buy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import InvalidArgument, check_int
from .memory import held_token_steps

__all__ = ["CLASSES_MAX_SPREAD", "CLASS_LAMS", "check_group", "estimate_seconds", "length_classes",
           "plan_length_classes", "recommend_rollout_policy", "sibling_spread"]

#: The weights ``lam`` :func:`plan_length_classes` tries.
CLASS_LAMS = (0.0, 0.5, 1.0)

#: The largest siblings' spread (median over prompts of the standard deviation of log length) for
#: which :func:`recommend_rollout_policy` recommends length classes. Measured on the rollout grid
#: (docs/benchmarks.md, "Length classes"): on CASTILLO (spread 0.09) the classes win with each
#: group's length known to sigma 0.1 and lose at 0.2; with 16 siblings of history the error of a
#: group's estimate is about a third of the spread, so a completion's length is then known to about
#: the spread itself.
CLASSES_MAX_SPREAD = 0.15


def packing_items(cost: Any, lengths: Any, context: Any, budget_tokens: int, prompt_lens: Any = (),
                  prompt_area: Any = (), held: Any = 0, prompt_pairs: Any = None,
                  kv_cap: int | None = None) -> tuple[np.ndarray, np.ndarray, dict, list, np.ndarray]:
    """The items of the length-class greedy, longest first: (``order``: indices, completions first,
    then the prompts; their lengths in tokens; ``cost``'s per-step terms; per item its memory, compute
    and all-reduce seconds; its KV area over the pool, in steps). A completion of ``l`` tokens after a
    prompt of ``context`` tokens decodes ``l`` tokens reading ``l * context + l (l - 1) / 2`` KV tokens
    and holds ``l (l + 1) / 2`` token-steps, and ``l * held`` more where it holds ``held`` tokens of its
    own beyond them (scalar or per completion: a multi-turn turn's conversation); a prompt (length 0) is
    prefilled once (attention pairs ``prompt_pairs``, default ``p (p + 1) / 2``) and holds ``prompt_area``
    token-steps. ``kv_cap``: a compressed cache's most generated tokens a row holds and reads
    (:func:`lengthsched.memory.held_token_steps`)."""
    fl = np.asarray(lengths, dtype=np.float64)
    ctx = np.asarray(context, dtype=np.float64)
    pl = np.asarray(prompt_lens, dtype=np.float64)
    pairs = pl * (pl + 1) / 2 if prompt_pairs is None else np.asarray(prompt_pairs, dtype=np.float64)
    none, zero = np.zeros(len(pl)), np.zeros(len(fl))
    reads = fl * ctx + held_token_steps(fl - 1, kv_cap)
    parts = cost.lower_bound_parts(np.concatenate([fl, none]), np.concatenate([reads, none]),
                                   np.concatenate([zero, pl]), np.concatenate([zero, pairs]))
    every = np.concatenate([fl, none])
    own = held_token_steps(fl, kv_cap) + fl * np.asarray(held, dtype=np.float64)
    area = np.concatenate([own, np.asarray(prompt_area, dtype=np.float64)]) / budget_tokens
    order = np.argsort(-every, kind="stable")
    terms = [np.broadcast_to(parts[k], every.shape)[order] for k in ("memory_seconds", "compute_seconds",
                                                                      "comm_seconds")]
    return order, every[order], parts, terms, area[order]


def packing_mix(parts: dict, terms: list, area: np.ndarray, lam: float, mu: float) -> tuple[np.ndarray, float]:
    """(each item's work in seconds, ``C``: seconds per step of a replica's longest completion) when a
    replica's steps are weighed as ``lam x longest + (1 - lam) x area / pool`` and a step's roofline
    as ``mu x memory side (with the weight reads) + (1 - mu) x compute side``."""
    memory, compute, comm = terms
    per_step = parts["step_seconds"] + mu * parts["step_memory_seconds"]
    return mu * memory + (1 - mu) * compute + comm + (1 - lam) * per_step * area, lam * per_step


def fractional_fits(cum: np.ndarray, lengths: np.ndarray, c: float, t: float, replicas: int) -> bool:
    """Whether items (cumulative work ``cum``, starting at 0; ``lengths`` longest first), their work
    split where needed, fit ``replicas`` replicas of makespan ``t`` when each replica holds the next
    items and has room ``t - c x (length of its first item)``."""
    pos = 0.0
    for _ in range(replicas):
        item = min(int(np.searchsorted(cum, pos, side="right")) - 1, len(lengths) - 1)
        room = t - c * lengths[item]
        if room <= 0:
            return False
        pos += room
        if pos >= cum[-1]:
            return True
    return False


def length_classes(lengths: Any, context: Any, *, replicas: int, budget_tokens: int, cost: Any,
                   lam: float = 1.0, kv_cap: int | None = None) -> np.ndarray:
    """The replica (0 to ``replicas - 1``) of every completion: contiguous classes of the completions
    sorted longest first (replica 0 the longest), sized by the greedy of the module docstring.

    Args:
        lengths: per completion, its (predicted) length in tokens.
        context: per completion, its prompt's length in tokens.
        replicas: engine replicas (>= 1).
        budget_tokens: each replica's KV pool in tokens.
        cost: a :class:`lengthsched.cost.StepCost` (seconds of a step).
        lam: 0 to 1, how a replica's steps are weighed: its longest completion (1) against its KV
            area over the pool (0).
        kv_cap: a compressed cache's most generated tokens a completion holds and reads (Sparse-RL's
            ``KVCompression.max_retained``; None: all of them).
    """
    lengths = np.asarray(lengths, dtype=np.float64)
    if lengths.ndim != 1 or not len(lengths) or not np.all(np.isfinite(lengths)) or lengths.min() < 0:
        raise InvalidArgument("lengths", f"an array of shape {lengths.shape}", "one length >= 0 per completion")
    context = np.broadcast_to(np.asarray(context, dtype=np.float64), lengths.shape)
    replicas = check_int("replicas", replicas, minimum=1)
    budget = check_int("budget_tokens", budget_tokens, minimum=1)
    lam = float(lam)
    if not 0.0 <= lam <= 1.0:
        raise InvalidArgument("lam", lam, "a weight from 0 to 1")
    order, ls, parts, terms, area = packing_items(cost, lengths, context, budget, kv_cap=kv_cap)
    work, c = packing_mix(parts, terms, area, lam, 1.0)

    def classes(t: float) -> np.ndarray:
        out = np.empty(len(work), dtype=np.int64)
        k, load, room = 0, 0.0, t - c * ls[0]
        for i in range(len(work)):
            if load > 0 and load + work[i] / 2 > room:  # the next replica, unless the item's midpoint fits
                k, load, room = k + 1, 0.0, t - c * ls[i]
            out[i] = k
            load += work[i]
        return out

    lo, hi = 0.0, c * ls[0] + float(work.sum())  # one replica holding everything
    while hi - lo > 1e-9 * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if classes(mid)[-1] < replicas else (mid, hi)
    placement = np.empty(len(lengths), dtype=np.int64)
    placement[order] = classes(hi)
    return placement


def estimate_seconds(placement: Any, lengths: Any, group: Any, prompt_lens: Any, *, replicas: int, budget_tokens: int,
                     cost: Any, kv_cap: int | None = None) -> np.ndarray:
    """Per replica, seconds no schedule of the completions ``placement`` gives it can beat: its steps
    are at least its longest completion and its KV area over ``budget_tokens`` (each completion's own
    token-steps, each prompt held while its longest completion there runs), each step pays the fixed
    cost, and its tokens (each prompt there prefilled once) their work
    (:meth:`lengthsched.cost.StepCost.lower_bound_seconds`). ``group``: per completion, the index of
    its prompt in ``prompt_lens`` (tokens). ``kv_cap``: a compressed cache's most generated tokens a
    completion holds and reads (:func:`lengthsched.memory.held_token_steps`; None: all of them)."""
    placement = np.asarray(placement, dtype=np.int64)
    fl = np.asarray(lengths, dtype=np.float64)
    group = np.asarray(group, dtype=np.int64)
    pl = np.asarray(prompt_lens, dtype=np.float64)
    out = np.zeros(replicas)
    for r in range(replicas):
        mine = placement == r
        if not mine.any():
            continue
        here, local = np.unique(group[mine], return_inverse=True)
        longest = np.zeros(len(here))
        np.maximum.at(longest, local, fl[mine])
        area = float(held_token_steps(fl[mine], kv_cap).sum() + (pl[here] * longest).sum())
        ctx = pl[group[mine]]
        out[r] = cost.lower_bound_seconds(steps=max(float(fl[mine].max()), area / budget_tokens),
                                          decode_tokens=float(fl[mine].sum()),
                                          kv_tokens_read=float((fl[mine] * ctx + held_token_steps(fl[mine] - 1,
                                                                                                   kv_cap)).sum()),
                                          prefill_tokens=float(pl[here].sum()),
                                          prefill_context=float((pl[here] * (pl[here] + 1) / 2).sum()))
    return out


def check_group(group: Any, shape: tuple, prompts: int) -> np.ndarray:
    """``group`` (per completion, the index of its prompt) as int64 if it has ``shape`` and every
    index is below ``prompts``, else :class:`InvalidArgument` naming it."""
    arr = np.asarray(group)
    if arr.shape != tuple(shape) or not np.issubdtype(arr.dtype, np.integer) or (
            len(arr) and (arr.min() < 0 or arr.max() >= prompts)):
        raise InvalidArgument("group", f"an array of shape {arr.shape}",
                              f"one index into prompt_lens ({prompts} prompts) per completion")
    return arr.astype(np.int64)


def plan_length_classes(lengths: Any, group: Any, prompt_lens: Any, *, replicas: int, budget_tokens: int,
                        cost: Any, evaluate: Callable[[np.ndarray], float] | None = None,
                        kv_cap: int | None = None) -> np.ndarray:
    """:func:`length_classes` for each ``lam`` of :data:`CLASS_LAMS`, keeping the placement that
    ``evaluate`` (placement -> seconds of the step, on the predicted lengths) finds fastest (ties: the
    smaller ``lam``). By default ``evaluate`` is the slowest replica's :func:`estimate_seconds`, a
    lower bound that misses what an engine's eager admission costs in preemptions; a simulator of
    the engines (``simulate.run_rollout`` does so for ``placed_classes`` and ``steal_classes``) judges better.

    Args:
        lengths: per completion, its predicted length in tokens.
        group: per completion, the index of its prompt in ``prompt_lens``.
        prompt_lens: per prompt, its length in tokens.
        replicas, budget_tokens, cost: as for :func:`length_classes`.
        evaluate: seconds of a candidate placement (the replica of every completion).
        kv_cap: a compressed cache's most generated tokens a completion holds and reads (None: all).
    """
    pl = np.asarray(prompt_lens)
    group = check_group(group, np.shape(lengths), len(pl))
    if evaluate is None:
        def evaluate(placed: np.ndarray) -> float:
            return float(estimate_seconds(placed, lengths, group, pl, replicas=replicas, budget_tokens=budget_tokens,
                                          cost=cost, kv_cap=kv_cap).max())
    best, best_secs = None, None
    for lam in CLASS_LAMS:
        placed = length_classes(lengths, pl[group], replicas=replicas, budget_tokens=budget_tokens, cost=cost, lam=lam,
                                kv_cap=kv_cap)
        secs = evaluate(placed)
        if best_secs is None or secs < best_secs * (1 - 1e-12):
            best, best_secs = placed, secs
    return best


def sibling_spread(groups: Any) -> float:
    """The siblings' spread: the median, over the prompts with at least two completions, of the
    standard deviation of their completions' log lengths (``groups``: per prompt, its completions'
    lengths in tokens, >= 1). NaN when no prompt has two completions."""
    spreads = []
    for k, lengths in enumerate(groups):
        arr = np.asarray(lengths, dtype=np.float64)
        if arr.ndim != 1 or (len(arr) and (not np.all(np.isfinite(arr)) or arr.min() < 1)):
            raise InvalidArgument("groups", f"prompt {k}: {arr.tolist()!r:.60}", "lengths >= 1 token per prompt")
        if len(arr) >= 2:
            spreads.append(float(np.std(np.log(arr))))
    return float(np.median(spreads)) if spreads else float("nan")


def recommend_rollout_policy(previous: Any) -> str:
    """The rollout policy to run a step with, given the completions of the same prompts one epoch
    earlier (``previous``: per prompt, its completions' lengths in tokens) and predictions learnt from
    them (:class:`lengthsched.OnlineLengthPredictor`): ``"steal_classes"`` when the siblings agree
    (:func:`sibling_spread` <= :data:`CLASSES_MAX_SPREAD`: the predictions then know each completion's
    length; ``steal`` over length classes, which stealing keeps from losing much where a prediction
    is off), else ``"steal"`` (the default policy, which hardly depends on the predictions). Names of
    ``lengthsched.runtime.POLICIES``; without history, use ``"steal"``. (``"placed_classes"``, the
    classes without stealing, was recommended until 2026-11-27: faster on some draws, far slower on
    others, docs/benchmarks.md, "Other draws of the grid".)"""
    spread = sibling_spread(previous)
    return "steal_classes" if spread <= CLASSES_MAX_SPREAD else "steal"
