"""``run_group`` / ``run_batch``: one simulation API for every policy."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lengthsched import InvalidArgument, KVCompression, partition
from lengthsched.errors import as_lengths, check_int, check_positive_float
from lengthsched.memory import held_token_steps
from lengthsched.runtime import POLICIES, Engine, Problem, StepLog, Timeline, make_policy, policy_names
from lengthsched.runtime.timing import DEFAULT_PREFILL_CHUNK, default_cost, lower_bound_seconds, prompt_prefill_log

__all__ = ["SimResult", "run_group", "run_batch", "lower_bound", "retained_kv_curve"]


@dataclass(frozen=True)
class SimResult:
    """What one simulation measured. Seconds (modelled), tokens and decode steps.

    ``seconds``: modelled wall time of the run under ``cost`` (a ``lengthsched.cost.StepCost``, named
    in ``cost_name``): every decode step priced by what it does (its rows, the KV they read, the
    tokens it prefills: prompt tails and recomputation after a preemption), plus the first prefill
    of the prompts; ``lower_bound_seconds``: no schedule of these lengths can be faster (see
    ``lengthsched.runtime.timing``); ``prefill_tokens``: tokens prefilled in all (prompts included).
    ``tokens``: sum of the collected lengths; ``decoded_tokens``: tokens decoded, discarded ones
    included (recomputation is a prefill and is counted in ``recomputed_tokens`` instead);
    ``peak_kv_tokens``: KV held beyond the shared prompt(s), block rounded as the policy's engine
    would; ``collected_lengths``: in finish order (the first G for the dynamic-slot policy).
    """

    policy: str
    steps: int
    lower_bound: int
    tokens: int
    decoded_tokens: int
    peak_kv_tokens: int
    prompt_tokens: int
    preemptions: int
    recomputed_tokens: int
    discarded_tokens: int
    collected_lengths: np.ndarray = field(repr=False)
    max_live: int
    planning_seconds: float
    decide_seconds: float
    budget_tokens: int | None
    slots: int | None
    timeline: Timeline | None = field(default=None, repr=False)
    # With a compressed KV cache (run_group(compression=...)): the peak of the retained KV tokens.
    peak_retained_kv_tokens: int | None = None
    seconds: float = 0.0
    lower_bound_seconds: float = 0.0
    prefill_tokens: int = 0
    cost_name: str = ""
    step_log: StepLog | None = field(default=None, repr=False)

    @property
    def tokens_per_second(self) -> float:
        """Collected tokens per modelled second."""
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def seconds_ratio(self) -> float:
        """seconds / lower bound in seconds (>= 1 for every run that stays within its limits)."""
        return self.seconds / self.lower_bound_seconds if self.lower_bound_seconds else 0.0

    @property
    def throughput(self) -> float:
        """Collected tokens per decode step (:attr:`tokens_per_second` is the rate users pay for)."""
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def ratio(self) -> float:
        """steps / lower bound (a policy that breaks the limits, or collects a biased sample, can be < 1)."""
        return self.steps / self.lower_bound

    @property
    def within_budget(self) -> bool:
        return self.budget_tokens is None or self.peak_kv_tokens <= self.budget_tokens


def lower_bound(lengths: np.ndarray, *, slots: int | None, budget_tokens: int | None,
                kv_cap: int | None = None) -> int:
    """docs/model.md section 5: max(max l, slot bound with k slots, sum l (l + 1) / (2 T)) steps.

    With a compressed cache (``kv_cap``: generated tokens a sequence holds at most) the area term
    counts min(a, kv_cap) for the a-th token: the KV-steps a completion of length l must hold are
    l (l + 1) / 2 up to the cap and kv_cap (kv_cap + 1) / 2 + (l - kv_cap) kv_cap beyond it."""
    bound = int(lengths.max())
    if slots is not None:
        bound = max(bound, partition.lower_bound(lengths, min(slots, len(lengths))))
    if budget_tokens is not None:
        bound = max(bound, math.ceil(int(held_token_steps(lengths, kv_cap).sum()) / budget_tokens))
    return bound


def retained_kv_curve(timeline: Timeline, compression: Any, steps: int) -> np.ndarray:
    """KV tokens held at the end of every step 0..steps when each sequence keeps only
    ``compression.retained(generated)`` of its generated tokens (``lengthsched.KVCompression``):
    sequences grow, are compressed back to the budget every ``interval`` tokens, and are freed as
    the timeline's segments say (a preempted sequence keeps its tokens and resumes its count)."""
    curve = np.zeros(steps + 1, dtype=np.int64)
    by_job: dict[int, list[tuple[int, int]]] = {}
    for job, _, first, last, _ in timeline.segments:
        by_job.setdefault(job, []).append((first, last))
    for segments in by_job.values():
        age = 0
        for first, last in sorted(segments):
            n = last - first + 1
            if n > 0:
                curve[first: last + 1] += np.asarray(compression.retained(age + np.arange(1, n + 1)), dtype=np.int64)
                age += n
    return curve


def compression_cap(compression: Any, policy: str, *, rollout: bool = False) -> int | None:
    """The generated tokens a sequence holds at most with ``compression`` (a ``lengthsched.KVCompression``,
    or None: no cap), checked against ``policy`` (one that runs a compressed cache,
    ``POLICIES[name].compressed``; with ``rollout``, one that runs rollout steps too)."""
    if compression is None:
        return None
    if not isinstance(compression, KVCompression):
        raise InvalidArgument("compression", compression, "a lengthsched.KVCompression(budget, interval) or None")
    spec = POLICIES.get(policy)
    if spec is not None and not (spec.compressed and (spec.rollout or not rollout)):
        runs = policy_names(compressed=True, rollout=True) if rollout else policy_names(compressed=True)
        raise InvalidArgument("compression", compression, f"None with policy {policy!r} (the "
                              f"{'rollout ' if rollout else ''}policies that run a compressed cache: "
                              + ", ".join(runs) + ")")
    return compression.max_retained


def _predictions(predicted: Any, lengths: np.ndarray, max_new: int, quantile: float, reserve: Any,
                 prompt_ids: tuple | None = None):
    """(point predictions, reservations, predictor object) from what the caller passed. A predictor
    is asked about ``prompt_ids`` (one per completion) or, without them, completion indices."""
    n = len(lengths)
    if predicted is None:
        point, predictor = None, None
    elif hasattr(predicted, "predict"):  # a LengthPredictor (a runtime Protocol check costs ~10 us a call)
        predictor = predicted
        out = predictor.predict(list(prompt_ids) if prompt_ids is not None else list(range(n)), quantiles=[quantile])
        point = np.maximum(1, np.asarray(out.lengths, dtype=np.int64))
        if reserve is None:
            reserve = np.maximum(1, np.asarray(out.quantile(quantile), dtype=np.int64))
    else:
        predictor = None
        point = as_lengths("predicted", predicted, minimum=1)
        if len(point) != n:
            raise InvalidArgument("predicted", predicted, f"{n} predicted lengths, one per completion")
    if reserve is not None:
        reserve = as_lengths("reserve", reserve, minimum=1)
        if len(reserve) != n:
            raise InvalidArgument("reserve", reserve, f"{n} reserved lengths, one per completion")
        reserve = np.minimum(reserve, max_new)
    return point, reserve, predictor  # Problem.point() clips predictions to max_new_tokens


def _simulate(lengths, prompt_lens, policy: str, *, slots, budget_tokens, predicted, max_new_tokens, seed,
              reserve, quantile, refill, eps, record, prompts, compression=None, cost=None,
              prefill_chunk=DEFAULT_PREFILL_CHUNK, prompt_ids=None) -> SimResult:
    max_new = check_int("max_new_tokens", max_new_tokens, minimum=1)
    if lengths.max() > max_new:
        bad = int(np.argmax(lengths > max_new))
        raise InvalidArgument("lengths", lengths, f"lengths <= max_new_tokens={max_new} (completion {bad} has "
                                                  f"{int(lengths[bad])})")
    slots = None if slots is None else check_int("slots", slots, minimum=1)
    budget_tokens = None if budget_tokens is None else check_int("budget_tokens", budget_tokens, minimum=1)
    kv_cap = compression_cap(compression, policy)
    longest = int(lengths.max()) if kv_cap is None else min(int(lengths.max()), kv_cap)
    if budget_tokens is not None and longest > budget_tokens:
        raise InvalidArgument("budget_tokens", budget_tokens,
                              f"at least what the longest completion holds ({longest} tokens)")
    seed = check_int("seed", seed, minimum=0)
    quantile = check_positive_float("quantile", quantile, maximum=0.999999)
    prefill_chunk = None if prefill_chunk is None else check_int("prefill_chunk", prefill_chunk, minimum=1)
    cost = _cost(cost)
    keys = None if prompt_ids is None or not hasattr(predicted, "observe") else tuple(prompt_ids)
    point, reserve, predictor = _predictions(predicted, lengths, max_new, quantile, reserve, keys)

    def stream(index: int) -> int:
        # Extra completions resample the group, each from its own stream (seed, index).
        return int(lengths[np.random.default_rng([seed, index]).integers(len(lengths))])

    problem = Problem(lengths=lengths, max_new_tokens=max_new, prompt_len=int(prompt_lens[0]), slots=slots,
                      budget_tokens=budget_tokens, predicted=point, reserve=reserve, predictor=predictor,
                      refill=refill, eps=eps, stream=stream, prompt_ids=keys, quantile=quantile, kv_cap=kv_cap)
    sim = make_policy(policy, problem)
    block = sim.block_size
    record = record or compression is not None
    tails = prompt_lens % block if block > 1 else None
    eng = Engine(lengths, tails=tails, block_size=block, slots=slots if sim.respects_slots else None,
                 budget_tokens=budget_tokens, enforce_budget=sim.promises_budget, record=record, context=prompt_lens,
                 prefill_chunk=prefill_chunk, kv_cap=kv_cap).run(sim)
    collected = eng.lengths_array()[np.asarray(eng.collected, dtype=np.int64)]
    steps_bound = lower_bound(lengths, slots=slots, budget_tokens=budget_tokens, kv_cap=kv_cap)
    log = _concat(prompt_prefill_log(prompts, prefill_chunk), eng.step_log())
    return SimResult(
        policy=sim.name,
        steps=eng.t,
        lower_bound=steps_bound,
        tokens=int(collected.sum()),
        decoded_tokens=eng.decoded_tokens,
        peak_kv_tokens=eng.peak_kv,
        prompt_tokens=int(np.sum(prompts)),
        preemptions=eng.preemptions,
        recomputed_tokens=eng.recomputed_tokens,
        discarded_tokens=eng.discarded_tokens,
        collected_lengths=collected,
        max_live=eng.peak_live,
        planning_seconds=eng.plan_seconds,
        decide_seconds=eng.decide_seconds,
        budget_tokens=budget_tokens,
        slots=slots,
        timeline=eng.timeline,
        peak_retained_kv_tokens=None if compression is None else
        int(retained_kv_curve(eng.timeline, compression, eng.t).max(initial=0)),
        seconds=log.seconds(cost),
        lower_bound_seconds=lower_bound_seconds(cost, lengths, context=prompt_lens, steps=steps_bound,
                                                prompt_lens=prompts, kv_cap=kv_cap),
        prefill_tokens=int(log.prefill_tokens.sum()),
        cost_name=f"{cost.model} on {cost.gpu}" + (f" x{cost.tp}" if cost.tp > 1 else ""),
        step_log=log,
    )


def _cost(cost: Any):
    """The step-cost model of a run: ``cost`` (a ``lengthsched.cost.StepCost``) or the default."""
    if cost is None:
        return default_cost()
    if not hasattr(cost, "segment_seconds") or not hasattr(cost, "lower_bound_seconds"):
        raise InvalidArgument("cost", cost, "a lengthsched.cost.StepCost (or None for the default "
                                            "Qwen3-1.7B on the H100 preset)")
    return cost


def _concat(*logs: StepLog) -> StepLog:
    return StepLog(*(np.concatenate([getattr(log, f) for log in logs]) for f in StepLog.FIELDS))


def run_group(
    lengths: Sequence[int],
    policy: str,
    *,
    slots: int | None = None,
    budget_tokens: int | None = None,
    predicted: Any = None,
    max_new_tokens: int,
    prompt_len: int = 0,
    seed: int = 0,
    reserve: Any = None,
    quantile: float = 0.9,
    refill: str = "sjf",
    eps: float = 0.05,
    record: bool = False,
    compression: Any = None,
    cost: Any = None,
    prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
    prompt_id: Any = 0,
) -> SimResult:
    """Simulate generating one group of completions of true ``lengths`` (tokens) with ``policy``.

    ``slots`` caps how many sequences decode at once; ``budget_tokens`` caps the KV tokens held
    beyond the shared prompt; a policy takes either or both (``full`` ignores them).
    ``predicted``: predicted lengths, or a ``LengthPredictor`` (asked with completion indices as
    prompts; its ``quantile`` is the reservation unless ``reserve`` is given). Without predictions,
    completions start in index order. ``seed`` seeds the dynamic-slot stream. ``record`` keeps a
    :class:`Timeline` for figures. ``compression`` (a ``lengthsched.KVCompression``, Sparse-RL's
    sparse rollouts): every sequence holds at most ``compression.max_retained`` generated tokens, and
    ``budget_tokens`` counts them so: the policies admit by that ceiling, more sequences at once (the
    vLLM models in whole blocks; the SGLang models still reserve uncompressed lengths; the rollout
    policies refuse it: ``POLICIES[name].compressed``). ``peak_kv_tokens`` is then the peak of the
    ceiling, ``peak_retained_kv_tokens`` that of the sparse KV the schedule really holds
    (:func:`retained_kv_curve`, compressed back to the budget every interval), and the lower bound
    counts the capped KV. The rows read the capped KV too, as the step cost prices them (the
    compression's own work, scoring and gathering the kept tokens, is not priced).
    ``cost``: the ``lengthsched.cost.StepCost`` that prices the run in seconds (default: Qwen3-1.7B
    on the H100 preset); ``prefill_chunk``: most tokens prefilled in one step (vLLM's
    ``max_num_batched_tokens``, default 8192; None: no limit). Every decode row reads its prompt's
    KV (as paged-attention kernels do: once per row). ``prompt_id``: the group's prompt key, what a
    predictor that learns online (``lengthsched.OnlineLengthPredictor``) is asked about and told
    of finished siblings; other predictors are asked with completion indices.
    """
    true = as_lengths("lengths", lengths, minimum=1)
    prompt_len = check_int("prompt_len", prompt_len, minimum=0)
    return _simulate(true, np.full(len(true), prompt_len, dtype=np.int64), policy, slots=slots,
                     budget_tokens=budget_tokens, predicted=predicted, max_new_tokens=max_new_tokens, seed=seed,
                     reserve=reserve, quantile=quantile, refill=refill, eps=eps, record=record,
                     prompts=[prompt_len], compression=compression, cost=cost, prefill_chunk=prefill_chunk,
                     prompt_ids=[prompt_id] * len(true))


def run_batch(groups: Sequence[Any], policy: str, **kwargs: Any) -> SimResult:
    """Several groups sharing one budget: their completions are scheduled together.

    ``groups``: objects with ``lengths`` and ``prompt_len`` (e.g. :class:`simulate.Group`); every
    prompt's KV is held for the whole batch, outside ``budget_tokens``. Other arguments as
    :func:`run_group`; ``predicted`` then covers all completions, group by group (a predictor that
    learns online is asked about each group's ``prompt_id``, or its index in ``groups``).
    """
    if not groups:
        raise InvalidArgument("groups", groups, "at least one group")
    lengths = np.concatenate([as_lengths("lengths", g.lengths, minimum=1) for g in groups])
    prompts = np.concatenate([np.full(len(g.lengths), check_int("prompt_len", g.prompt_len, minimum=0))
                              for g in groups])
    options = dict(slots=None, budget_tokens=None, predicted=None, seed=0, reserve=None, quantile=0.9,
                   refill="sjf", eps=0.05, record=False, cost=None, prefill_chunk=DEFAULT_PREFILL_CHUNK,
                   compression=None)
    unknown = set(kwargs) - set(options) - {"max_new_tokens"}
    if unknown:
        raise InvalidArgument("kwargs", sorted(unknown), "arguments of run_group")
    options.update(kwargs)
    keys = [getattr(g, "prompt_id", i) for i, g in enumerate(groups) for _ in range(len(g.lengths))]
    return _simulate(lengths, prompts, policy, prompts=[int(g.prompt_len) for g in groups], prompt_ids=keys, **options)
