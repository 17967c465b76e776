"""The comparison behind ``lengthsched simulate``: every policy on the same groups, one table."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from lengthsched import (
    BudgetTooSmall,
    ConstantLengthPredictor,
    InvalidArgument,
    KVCompression,
    ModelMemory,
    NoisyOracleLengthPredictor,
    parse_bytes,
)
from lengthsched.errors import check_int, check_nonnegative_float, check_positive_float
from lengthsched.predictor import MAX_SIGMA
from lengthsched.runtime import POLICIES, kv_budget_tokens, policy_names
from lengthsched.runtime.timing import lower_bound_seconds

from .fast import FAST_POLICIES, seconds_many, slot_count, steps_and_peaks
from .options import OPTION_DEFAULTS, SimulateOptions, resolve, rollout_mode
from .run import SimResult, lower_bound, run_group
from .workloads import WORKLOADS, Group, make_workload

__all__ = ["PolicySummary", "Comparison", "compare", "check_options", "format_table", "load_memory",
           "parse_policies", "predictions_for", "simulate_group", "workload_groups", "LEGEND"]

#: G of the named workloads when ``--group-size`` is not given (a trace file keeps its own sizes).
DEFAULT_GROUP_SIZE = 32


def compression_phrase(text: str | None) -> str:
    """``--kv-compression``'s text in a rollout setting: "KV compressed (B:I): each request holds and reads at most
    B + I generated tokens" ("" without a cache)."""
    comp = parse_compression(text)
    return "" if comp is None else (f"KV compressed ({text}): each request holds and reads at most {comp.max_retained} "
                                    "generated tokens")


def parse_compression(text: str | None) -> KVCompression | None:
    """``"512:32"`` -> ``KVCompression(budget=512, interval=32)`` (``--kv-compression``); None -> None."""
    return KVCompression.of(text)


def load_memory(opts: SimulateOptions) -> ModelMemory:
    return ModelMemory.from_name(opts.model, opts.dtype, kv_dtype=opts.kv_dtype)


def parse_policies(text: str) -> list[str]:
    """``"micro,vllm"`` -> ["micro", "vllm"]: known names, no empty entry, none twice."""
    names = [p.strip() for p in str(text).split(",")]
    unknown = [p for p in names if p and p not in POLICIES]
    expected = "comma-separated names among " + ", ".join(POLICIES)
    if not any(names) or unknown:
        raise InvalidArgument("policies", text, expected)
    if "" in names:
        raise InvalidArgument("policies", text, expected + ", without empty entries")
    twice = sorted({p for p in names if names.count(p) > 1})
    if twice:
        raise InvalidArgument("policies", text, expected + ", each once (" + ", ".join(twice) + " twice)")
    return names


PREDICTOR_SPECS = ("oracle, noisy:SIGMA (0 < SIGMA <= 5), prompt:SIGMA (0 <= SIGMA <= 5), constant:TOKENS, trace, "
                   "online or online:TOKENS")


def prompt_prediction(group: Group, sigma: float, seed: int, index: int) -> int:
    """A prompt-level prediction: the group's median length times a log-normal error of ``sigma``
    (seeded by ``seed`` and the group's ``index``), the same for every sibling (tokens, >= 1)."""
    z = np.random.default_rng([seed, index]).standard_normal()
    return max(1, int(min(2.0**53, float(np.median(group.lengths)) * math.exp(sigma * z))))


def spec_sigma(arg: str) -> float:
    """The SIGMA of a predictor spec ``KIND:SIGMA`` (``arg``: what follows the colon), NaN when it is
    not a number (every range check then fails, so the caller's error names the spec)."""
    try:
        return float(arg)
    except ValueError:
        return math.nan


def predictions_for(spec: str, group: Group, index: int, seed: int) -> Any:
    """The ``predicted`` argument of run_group for a predictor spec and one group: the true or the
    trace's lengths, or a predictor whose every answer is checked (finite, >= 0)."""
    kind, _, arg = str(spec).partition(":")
    if kind == "oracle" and not arg:
        return group.lengths
    if kind == "history":
        raise InvalidArgument("predictor", spec, "a predictor for groups one at a time (" + PREDICTOR_SPECS + "); "
                              "history / history:SIGMA is for a rollout step (--prompts / --replicas)")
    if kind == "trace" and not arg:
        if group.predicted is None:
            where = ("the workload " + repr(group.source)) if group.source else "the workload"
            raise InvalidArgument("predictor", spec,
                                  f"a 'predicted' field on every line of a trace file, but group {group.prompt_id} "
                                  f"of {where} has none (or another predictor: oracle, noisy:SIGMA, "
                                  "constant:TOKENS, online)")
        return group.predicted
    if kind == "prompt":
        sigma = spec_sigma(arg)
        if not (0 <= sigma <= MAX_SIGMA):
            raise InvalidArgument("predictor", spec, f"prompt:SIGMA with 0 <= SIGMA <= {MAX_SIGMA:g} (the standard "
                                                     "deviation of the log-normal error on the prompt's median)")
        return np.full(len(group.lengths), prompt_prediction(group, sigma, seed, index), dtype=np.int64)
    if kind == "noisy":
        sigma = spec_sigma(arg)
        if not (0 < sigma <= MAX_SIGMA):  # NaN fails too
            raise InvalidArgument("predictor", spec, f"noisy:SIGMA with 0 < SIGMA <= {MAX_SIGMA:g} (the "
                                                     "standard deviation of the log-normal error of log length)")
        return CheckedPredictor(NoisyOracleLengthPredictor(group.lengths, sigma=sigma, seed=seed + index), spec)
    try:
        if kind == "constant":
            return CheckedPredictor(ConstantLengthPredictor(int(arg)), spec)
        if kind == "online":
            return CheckedPredictor(_online_predictor(int(arg) if arg else None), spec)
    except (ValueError, InvalidArgument):
        pass
    raise InvalidArgument("predictor", spec, PREDICTOR_SPECS)


def check_predictions(values: Any, spec: str, what: str = "predicted lengths") -> np.ndarray:
    """``values`` as an array, if every one is a finite number >= 0; else one error naming --predictor."""
    array = np.asarray(values)
    if array.dtype.kind not in "iuf":
        raise InvalidArgument("predictor", spec, f"numeric {what}; it gave {array.dtype} values")
    bad = ~np.isfinite(array) | (array < 0) if array.dtype.kind == "f" else array < 0
    if bad.any():
        raise InvalidArgument("predictor", spec, f"finite {what} >= 0; it gave {array[bad][0]!r} "
                                                 f"({int(bad.sum())} of {array.size} bad)")
    return array


class CheckedPredictor:
    """A length predictor whose every answer is checked by :func:`check_predictions` (an overflowed,
    negative or NaN prediction is an error naming ``--predictor``, never silently clipped). Other
    attributes (``observe`` of an online predictor) are the wrapped predictor's."""

    def __init__(self, inner: Any, spec: str):
        self.inner, self.spec = inner, spec

    def predict(self, prompts, prefixes=None, *, quantiles=()):
        out = self.inner.predict(prompts, prefixes, quantiles=quantiles)
        check_predictions(out.lengths, self.spec)
        for q, values in out.quantiles.items():
            check_predictions(values, self.spec, f"predicted {q}-quantiles")
        return out

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("inner")
        if inner is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(inner, name)


def _online_predictor(prior: int | None) -> Any:
    """A fresh ``OnlineLengthPredictor`` for one group: it knows nothing of the prompt but a constant
    prior (TOKENS, or the CASTILLO mean) and learns from the group's siblings as they finish. Its
    spreads are fitted on the bundled CASTILLO validate groups."""
    from lengthsched import OnlineLengthPredictor

    spreads = _castillo_spreads()
    if prior is not None and prior < 1:
        raise ValueError("a prior of at least 1 token")
    return OnlineLengthPredictor(prior=prior if prior is not None else spreads["mean_length"],
                                 within_sigma=spreads["within_sigma"], prior_sigma=spreads["prior_sigma"],
                                 residual_quantiles=spreads["residual_quantiles"])


@lru_cache(maxsize=1)
def _castillo_spreads() -> dict:
    from lengthsched.online import fit_spreads

    from .workloads import castillo_validate_lengths

    groups = castillo_validate_lengths()
    mean = float(np.exp(np.mean([np.log(g).mean() for g in groups])))
    return {**fit_spreads(groups, [mean] * len(groups)), "mean_length": mean}


@dataclass(frozen=True)
class PolicySummary:
    """One row of the table: means are per group."""

    policy: str
    groups: int
    seconds: float
    seconds_vs_vllm: float | None
    seconds_over_lower_bound: float
    tokens_per_second: float
    steps: float
    steps_vs_micro: float | None
    steps_over_lower_bound: float
    throughput: float
    peak_kv_bytes: int
    peak_total_bytes: int
    within_budget: float
    preemptions: float
    recomputed_tokens: float
    discarded_tokens: float
    ks_statistic: float
    planning_ms: float
    decide_ms: float


@dataclass(frozen=True)
class Comparison:
    options: dict
    memory: dict
    budget_bytes: int
    rows: tuple[PolicySummary, ...]
    note: str
    # The note's parts, [key, template, value]: what was actually run (format_sweep merges them).
    setting: tuple = ()
    # Predictions above max_new_tokens, clipped to it: {"point": n, "reserve": n, "of": n}.
    clipped: dict = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"options": self.options, "memory": self.memory, "budget_bytes": self.budget_bytes,
                "note": self.note, "setting": [list(p) for p in self.setting], "clipped_predictions": self.clipped,
                "policies": [dataclasses.asdict(r) for r in self.rows]}


def _group_budget(memory: ModelMemory, budget_bytes: int, group: Group, slots: int | None = None) -> int:
    """KV tokens (beyond the prompt) a group may hold: what is left next to the weights, the
    prompt and the activations of the decode batch (``lengthsched.runtime.kv_budget_tokens``)."""
    return kv_budget_tokens(memory, budget_bytes, prompt_tokens=group.prompt_len, group_size=len(group.lengths),
                            slots=slots)


def load_cost(opts: SimulateOptions, memory: ModelMemory):
    """The step-cost model that prices the comparison: ``--model`` on the ``--gpu`` preset (default h100),
    or ``--cost FILE``, moved to ``--gpu``'s datasheet numbers when both are given (``StepCost.on_gpu``)."""
    from lengthsched.cost import StepCost

    if opts.cost is None:
        return StepCost.from_gpu(memory, opts.gpu or "h100", config=opts.model)
    cost = StepCost.from_file(opts.cost)
    return cost if opts.gpu is None else cost.on_gpu(opts.gpu)


def _measures(memory: ModelMemory, group: Group, *, steps, lower, peak_kv_tokens, max_live, collected,
              seconds, lower_seconds, preemptions=0, recomputed=0, discarded=0, planning=0.0, decide=0.0) -> dict:
    c = memory.kv_bytes_per_token
    total = memory.weights_bytes + memory.activation_bytes(max_live) + c * (group.prompt_len + peak_kv_tokens)
    return dict(seconds=float(seconds), lower_seconds=float(lower_seconds),
                steps=int(steps), lower=int(lower), tokens=int(collected.sum()), peak_kv=c * int(peak_kv_tokens),
                total=int(total), preemptions=preemptions, recomputed=recomputed, discarded=discarded,
                planning=planning, decide=decide, collected=collected, true=group.lengths)


def simulate_group(opts: SimulateOptions, memory: ModelMemory, budget_bytes: int, group: Group, index: int,
                   policy: str, *, record: bool = False, cost=None) -> SimResult:
    """``policy`` on one group as the comparison runs it (budget, predictor, seeds, step cost from ``opts``)."""
    return run_group(group.lengths, policy, slots=opts.slots,
                     budget_tokens=_group_budget(memory, budget_bytes, group, opts.slots),
                     predicted=predictions_for(opts.predictor, group, index, opts.seed),
                     max_new_tokens=opts.max_new_tokens, prompt_len=group.prompt_len, seed=opts.seed + index,
                     quantile=opts.quantile, refill=opts.refill, record=record,
                     cost=load_cost(opts, memory) if cost is None else cost, prefill_chunk=opts.prefill_chunk,
                     compression=parse_compression(opts.kv_compression))


def _one_group(args: tuple) -> list[tuple[str, dict]]:
    """Simulate every policy on one group (a picklable unit of work for the process pool)."""
    opts, memory, budget_bytes, group, index, policies, cost = args
    out = []
    for policy in policies:
        r = simulate_group(opts, memory, budget_bytes, group, index, policy, cost=cost)
        out.append((policy, _measures(memory, group, steps=r.steps, lower=r.lower_bound,
                                      seconds=r.seconds, lower_seconds=r.lower_bound_seconds,
                                      peak_kv_tokens=r.peak_kv_tokens, max_live=r.max_live,
                                      collected=r.collected_lengths, preemptions=r.preemptions,
                                      recomputed=r.recomputed_tokens, discarded=r.discarded_tokens,
                                      planning=r.planning_seconds, decide=r.decide_seconds)))
    return out


def _fast(opts: SimulateOptions, memory: ModelMemory, budget_bytes: int, groups: Sequence[Group],
          policy: str, cost) -> list[tuple[str, dict]]:
    """A slot policy on all groups at once (simulate.fast), bucketed by slot count."""
    budgets = [_group_budget(memory, budget_bytes, g, opts.slots) for g in groups]
    slots = [slot_count(policy, slots=opts.slots, budget_tokens=b, max_new_tokens=opts.max_new_tokens,
                        group_size=len(g.lengths)) for g, b in zip(groups, budgets)]
    out: list = [None] * len(groups)
    for g in sorted(set(slots)):
        idx = [i for i, k in enumerate(slots) if k == g]
        batch = np.stack([groups[i].lengths for i in idx])
        res = steps_and_peaks(batch, policy, g)
        seconds = seconds_many(batch, policy, g, cost, prompt_lens=[groups[i].prompt_len for i in idx],
                               prefill_chunk=opts.prefill_chunk)
        for j, i in enumerate(idx):
            lower = lower_bound(groups[i].lengths, slots=opts.slots, budget_tokens=budgets[i])
            lower_s = lower_bound_seconds(cost, groups[i].lengths, context=groups[i].prompt_len, steps=lower,
                                          prompt_lens=[groups[i].prompt_len])
            out[i] = (policy, _measures(memory, groups[i], steps=res["steps"][j], lower=lower,
                                        seconds=seconds[j], lower_seconds=lower_s,
                                        peak_kv_tokens=res["peak_kv"][j], max_live=res["max_live"][j],
                                        collected=groups[i].lengths))
    return out


def run_units(units: Sequence[tuple], workers: int, progress: bool, label: str, *,
              fn: Callable[[tuple], Any] | None = None, unit: str = "group") -> list:
    """Map ``fn`` (default :func:`_one_group`; a module-level function, for the processes) over work units,
    in order, on ``workers`` processes (0: all cores), with a progress bar counting ``unit`` (one per unit)."""
    from tqdm import tqdm

    fn = _one_group if fn is None else fn
    workers = check_int("workers", workers, minimum=0) or os.cpu_count() or 1
    bar = dict(total=len(units), desc=label, disable=not progress, leave=False, unit=unit)
    if workers == 1 or len(units) < 4:
        return [fn(u) for u in tqdm(units, **bar)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(tqdm(pool.map(fn, units, chunksize=max(1, len(units) // (8 * workers))), **bar))


def summarize(results: list, policies: Sequence[str], budget_bytes: int) -> tuple[PolicySummary, ...]:
    from scipy.stats import ks_2samp

    per = {p: [dict(m) for res in results for name, m in res if name == p] for p in policies}
    micro = np.mean([m["steps"] for m in per["micro"]]) if "micro" in per else None
    vllm = np.mean([m["seconds"] for m in per["vllm"]]) if "vllm" in per else None
    rows = []
    for p in policies:
        ms = per[p]
        steps = np.array([m["steps"] for m in ms], dtype=float)
        seconds = np.array([m["seconds"] for m in ms], dtype=float)
        collected = np.concatenate([m["collected"] for m in ms])
        true = np.concatenate([m["true"] for m in ms])
        rows.append(PolicySummary(
            policy=p,
            groups=len(ms),
            seconds=float(seconds.mean()),
            seconds_vs_vllm=None if vllm is None else float(seconds.mean() / vllm),
            seconds_over_lower_bound=float(np.mean(seconds / np.array([m["lower_seconds"] for m in ms]))),
            tokens_per_second=float(sum(m["tokens"] for m in ms) / seconds.sum()),
            steps=float(steps.mean()),
            steps_vs_micro=None if micro is None else float(steps.mean() / micro),
            steps_over_lower_bound=float(np.mean(steps / np.array([m["lower"] for m in ms]))),
            throughput=float(sum(m["tokens"] for m in ms) / steps.sum()),
            peak_kv_bytes=int(max(m["peak_kv"] for m in ms)),
            peak_total_bytes=int(max(m["total"] for m in ms)),
            within_budget=float(np.mean([m["total"] <= budget_bytes for m in ms])),
            preemptions=float(np.mean([m["preemptions"] for m in ms])),
            recomputed_tokens=float(np.mean([m["recomputed"] for m in ms])),
            discarded_tokens=float(np.mean([m["discarded"] for m in ms])),
            ks_statistic=float(ks_2samp(collected, true, method="asymp").statistic),
            planning_ms=float(1e3 * np.mean([m["planning"] for m in ms])),
            decide_ms=float(1e3 * np.mean([m["decide"] for m in ms])),
        ))
    return tuple(rows)


def check_step_seconds(opts: SimulateOptions) -> None:
    """The rollout step's seconds options: ``resubmit_seconds`` at least 0, ``poll_seconds`` None or
    positive (checked for group runs, where they are errors when set, and for rollout steps alike)."""
    check_nonnegative_float("resubmit_seconds", opts.resubmit_seconds)
    if opts.poll_seconds is not None:
        check_positive_float("poll_seconds", opts.poll_seconds)


# Options that only a rollout step (--prompts or --replicas) uses: set to anything but their default
# without one, each is an error saying why.
ROLLOUT_ONLY = (
    ("routers", "routers place a rollout step's requests on replicas; groups run one at a time"),
    ("headroom", "it searches a rollout step's placement on replicas"),
    ("poll_seconds", "steal_observed polls a rollout step's replicas"),
    ("kv_offload", "the replicas of a rollout step offload preempted requests' KV"),
    ("in_flight", "a framework keeps a rollout step's requests in flight on its replicas"),
    ("resubmit_seconds", "requests move between a rollout step's replicas"),
    ("draws", "it redraws the predictions of a rollout step"),
    ("oversample", "a rollout step keeps the first of its groups to finish"),
    ("steps", "it runs rollout steps one after another"),
    ("partial_rollout", "it carries a rollout step's aborted groups into the next"),
    ("max_carry", "it limits how long a rollout step's groups are carried"),
    ("carry_limit", "it limits how long a rollout step's groups are carried"),
    ("valid_share", "it filters the groups of rollout steps"),
    ("slime_refill", "it adds batches inside slime's over-sampled rollout steps"),
    ("difficulty", "it filters the groups of rollout steps"),
    ("filter_order", "it orders the batches of over-sampled rollout steps"),
    ("selective", "it skips prompts of over-sampled rollout steps"),
    ("verl_dynamic_sampling", "it runs verl's dynamic sampling in rollout steps"),
    ("max_staleness", "it runs asynchronous RL on a rollout's replicas"),
    ("staleness_threshold", "it runs verl's asynchronous RL on a rollout's replicas"),
    ("local_steps", "it times the learner of verl's asynchronous RL"),
    ("train_seconds", "it times the learner of asynchronous RL"),
    ("update_seconds", "it times the weight updates of asynchronous RL"),
    ("max_concurrent", "it caps the groups asynchronous RL keeps in flight"),
    ("turns", "it cuts a rollout step's completions into turns"),
    ("tool_seconds", "it times the tool calls of a multi-turn rollout step"),
    ("tool_sigma", "it times the tool calls of a multi-turn rollout step"),
    ("tool_tokens", "it sizes the tools' answers in a multi-turn rollout step"),
)


def check_options(opts: SimulateOptions) -> None:
    """Reject bad options before any work, each error naming its flag (``--seed``: 'seed')."""
    opts = resolve(opts)
    check_step_seconds(opts)
    if not rollout_mode(opts):
        for name, why in ROLLOUT_ONLY:
            value = getattr(opts, name)
            if value != OPTION_DEFAULTS[name]:
                raise InvalidArgument(name, value, f"--prompts or --replicas with it ({why})")
    check_int("seed", opts.seed, minimum=0)
    check_int("groups", opts.groups, minimum=1)
    check_int("max_new_tokens", opts.max_new_tokens, minimum=1)
    check_int("prefill_chunk", opts.prefill_chunk, minimum=1)
    check_int("workers", opts.workers, minimum=0)
    if opts.group_size is not None:
        check_int("group_size", opts.group_size, minimum=1)
    if opts.slots is not None:
        check_int("slots", opts.slots, minimum=1)
    check_positive_float("quantile", opts.quantile, maximum=0.999999)
    parse_bytes(opts.budget, "budget")
    check_compressed_policies(opts, parse_policies(opts.policies))


def check_compressed_policies(opts: SimulateOptions, policies: Sequence[str], *, rollout: bool = False) -> None:
    """With ``--kv-compression``, every one of ``policies`` runs a compressed cache (``POLICIES[name].compressed``);
    else one error naming --policies and those that do (of the rollout policies, with ``rollout``)."""
    if parse_compression(opts.kv_compression) is None:
        return
    refuse = [p for p in policies if not POLICIES[p].compressed]
    if refuse:
        runs = policy_names(compressed=True, rollout=True) if rollout else policy_names(compressed=True)
        raise InvalidArgument("policies", opts.policies, "policies that run a compressed cache with --kv-compression: "
                              + ", ".join(runs) + f" (not {', '.join(refuse)})")


def workload_groups(opts: SimulateOptions, limit: int | None, epoch: int = 0) -> list[Group]:
    """The groups ``opts`` describes (``--workload``, ``--group-size``, ``--groups`` as ``limit``;
    ``epoch``: the same prompts with fresh completions, :func:`simulate.workloads.make_workload`).
    A trace file keeps its groups' logged sizes: ``--group-size`` with one only checks that every
    group has that many completions (an error otherwise, never silently ignored)."""
    named = opts.workload in WORKLOADS
    if not named and not os.path.exists(opts.workload):
        raise InvalidArgument("workload", opts.workload, ", ".join(WORKLOADS) + " or a trace .jsonl path")
    group_size = DEFAULT_GROUP_SIZE if opts.group_size is None else opts.group_size
    groups = make_workload(opts.workload, group_size, max_new_tokens=opts.max_new_tokens, limit=limit,
                           seed=opts.seed, spread=opts.spread, epoch=epoch, prompt_tokens=opts.prompt_tokens)
    if not named and opts.group_size is not None:
        other = next((g for g in groups if len(g.lengths) != opts.group_size), None)
        if other is not None:
            raise InvalidArgument("group_size", opts.group_size,
                                  f"the trace's own group size: a trace file keeps the sizes its groups were logged "
                                  f"with (group {other.prompt_id} of {opts.workload} has {len(other.lengths)}, "
                                  f"sizes {group_sizes(groups)}); leave --group-size out")
    return groups


def group_sizes(groups: Sequence[Group]) -> str:
    """``"32"``, or ``"4..16"`` for a trace of groups of several sizes."""
    sizes = sorted({len(g.lengths) for g in groups})
    return str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}..{sizes[-1]}"


# Policies that reserve max_new_tokens per sequence (lengthsched.runtime.slot_cap): the budget must
# hold L_max KV tokens for them; every other policy needs the group's longest completion.
_RESERVE_L_MAX = {"micro", "fixed_slot", "dynamic_slot", "reserve_max"}


def _needed_tokens(group: Group, policies: Sequence[str], max_new_tokens: int, compression=None) -> int:
    need = max_new_tokens if _RESERVE_L_MAX.intersection(policies) else int(group.lengths.max())
    return need if compression is None else min(need, compression.max_retained)


def _fits(memory: ModelMemory, budget_bytes: int, groups: Sequence[Group], policies, opts) -> Group | None:
    """The first group whose KV budget is below what it needs, or None."""
    for g in groups:
        try:
            tokens = _group_budget(memory, budget_bytes, g, opts.slots)
        except BudgetTooSmall:
            return g
        if tokens < _needed_tokens(g, policies, opts.max_new_tokens, parse_compression(opts.kv_compression)):
            return g
    return None


def check_budget(opts: SimulateOptions, memory: ModelMemory, budget_bytes: int, groups: Sequence[Group],
                 policies: Sequence[str]) -> None:
    """Every group's KV budget holds what the policies need (its longest completion, or L_max for the
    policies that reserve it); else one error naming --budget and the smallest budget that does."""
    short = _fits(memory, budget_bytes, groups, policies, opts)
    if short is None:
        return
    low, high = budget_bytes, max(2 * budget_bytes, 2**30)
    while _fits(memory, high, groups, policies, opts) is not None:
        low, high = high, 2 * high
        if high > 2**60:
            raise BudgetTooSmall("budget", opts.budget, "a budget that holds a group (none up to 1 EiB does)")
    while high - low > 2**20:  # to a MiB
        mid = (low + high) // 2
        low, high = (low, mid) if _fits(memory, mid, groups, policies, opts) is None else (mid, high)
    reserving = sorted(_RESERVE_L_MAX.intersection(policies))
    need = (f"KV for L_max={opts.max_new_tokens} tokens per sequence (reserved by {', '.join(reserving)})"
            if reserving else "KV for each group's longest completion")
    raise BudgetTooSmall("budget", opts.budget,
                         f"at least {high / 2**30:.2f}GiB for {memory.name} ({opts.dtype}): the weights, the "
                         f"activations of the decode batch, the prompt KV and {need}; group {short.prompt_id} "
                         f"({short.prompt_len} prompt tokens, longest completion {int(short.lengths.max())}) "
                         "does not fit")


def _clipped_predictions(opts: SimulateOptions, groups: Sequence[Group]) -> dict:
    """Ask the predictor about every group as the run does (checking each answer) and count the
    predicted lengths and reserved quantiles above max_new_tokens (the runtime clips them to it)."""
    point = reserve = total = 0
    for i, g in enumerate(groups):
        predicted = predictions_for(opts.predictor, g, i, opts.seed)
        if hasattr(predicted, "predict"):
            out = predicted.predict(list(range(len(g.lengths))), quantiles=[opts.quantile])
            lengths, reserved = out.lengths, out.quantile(opts.quantile)
        else:
            lengths = reserved = check_predictions(predicted, opts.predictor)
        point += int(np.sum(np.asarray(lengths) > opts.max_new_tokens))
        reserve += int(np.sum(np.asarray(reserved) > opts.max_new_tokens))
        total += len(g.lengths)
    return {"point": point, "reserve": reserve, "of": total, "max_new_tokens": opts.max_new_tokens}


def clipped_notice(clipped: dict, quantile: float) -> str | None:
    """One line saying how many predictions were above --max-new-tokens, or None if none were."""
    if not clipped or not (clipped.get("point") or clipped.get("reserve")):
        return None
    return (f"notice: {clipped['point']} of {clipped['of']} predicted lengths and {clipped['reserve']} of "
            f"{clipped['of']} reserved {quantile:g}-quantiles are above --max-new-tokens "
            f"{clipped['max_new_tokens']} and were clipped to it")


def _setting(opts: SimulateOptions, groups: Sequence[Group], memory: ModelMemory, budget_bytes: int, cost) -> tuple:
    parts = [("groups", "{} groups", str(len(groups))), ("group_size", "of G={}", group_sizes(groups)),
             ("workload", "from {}", opts.workload)]
    if opts.spread is not None:
        parts.append(("spread", "spread {}", f"{opts.spread:g}"))
    parts += [("max_new_tokens", "L_max={}", str(opts.max_new_tokens)),
              ("model", "{}", f"{memory.name} ({opts.dtype})"),
              ("budget", "budget {}", f"{budget_bytes / 2**30:.2f} GiB")]
    if opts.slots is not None:
        parts.append(("slots", "at most {} sequences at once", str(opts.slots)))
    parts += [("predictor", "predictor {}", str(opts.predictor)),
              ("cost", "seconds modelled for {}", f"{cost.model} on {cost.gpu}"
               + (" (fitted)" if opts.cost else " (unfitted preset)")),
              ("prefill_chunk", "prefill chunk {} tokens", str(opts.prefill_chunk))]
    if opts.kv_compression is not None:
        comp = parse_compression(opts.kv_compression)
        parts.append(("kv_compression", "KV compressed {}", f"to {comp.budget} generated tokens every {comp.interval} "
                                                            f"(at most {comp.max_retained} a sequence)"))
    return tuple(parts)


def render_setting(parts: Sequence[Sequence[str]]) -> str:
    """The one-line header: "4 groups of G=8 from castillo, L_max=1024, ..."."""
    texts = [template.format(value) for _, template, value in parts]
    return " ".join(texts[:3]) + ", " + ", ".join(texts[3:])


def compare(opts: SimulateOptions, *, progress: bool = False) -> Comparison:
    """Run every policy of ``opts.policies`` on the same groups and summarise each."""
    opts = resolve(opts)
    check_options(opts)
    policies = parse_policies(opts.policies)
    memory = load_memory(opts)
    budget_bytes = parse_bytes(opts.budget, "budget")
    groups = workload_groups(opts, opts.groups)
    # Fail early, here rather than in a worker: a budget too small, a predictor spec that is wrong,
    # a prediction that is negative or not finite.
    check_budget(opts, memory, budget_bytes, groups, policies)
    clipped = _clipped_predictions(opts, groups)
    uniform = len({len(g.lengths) for g in groups}) == 1
    fast = [p for p in policies if p in FAST_POLICIES and uniform and opts.kv_compression is None]
    slow = [p for p in policies if p not in fast]
    cost = load_cost(opts, memory)
    try:
        results = run_units([(opts, memory, budget_bytes, g, i, slow, cost) for i, g in enumerate(groups)],
                            opts.workers, progress, "simulate") if slow else [[] for _ in groups]
        for policy in fast:
            for res, item in zip(results, _fast(opts, memory, budget_bytes, groups, policy, cost)):
                res.append(item)
    except BudgetTooSmall as exc:  # a check of the runtime that check_budget did not foresee
        raise BudgetTooSmall("budget", opts.budget, exc.expected) from None
    except InvalidArgument as exc:
        if exc.name not in ("budget_tokens", "budget_bytes"):
            raise
        raise BudgetTooSmall("budget", opts.budget, f"a larger budget ({exc.name} {exc.value}: "
                                                    f"{exc.expected})") from None
    rows = summarize(results, policies, budget_bytes)
    # Fastest first among the policies that keep every group within the budget, then the others.
    rows = tuple(sorted(rows, key=lambda r: (r.within_budget < 1.0, r.seconds)))
    setting = _setting(opts, groups, memory, budget_bytes, cost)
    return Comparison(dataclasses.asdict(opts), memory.describe(), budget_bytes, rows, render_setting(setting),
                      setting, clipped if any(predicted_by(policies)) else {})


def predicted_by(policies: Sequence[str]) -> list[str]:
    """The policies among ``policies`` that use predicted lengths."""
    return [p for p in policies if p not in _BLIND]


def headline(comparison: Comparison) -> str:
    """The verdict line: the fastest policy within budget that collects an unbiased sample (a biased control
    such as ``dynamic_slot`` is never recommended), its gain over vllm, which policies break the budget, and
    whether predictions were the true lengths."""
    within = [r for r in comparison.rows if r.within_budget >= 1.0]
    ok = [r for r in within if unbiased(r.policy)]
    over = [r.policy for r in comparison.rows if r.within_budget < 1.0]
    breaks = (f"{len(over)} of {len(comparison.rows)} policies break the budget in some group (marked *): "
              + ", ".join(over)) if over else "every policy kept every group within the budget"
    controls = [r.policy for r in within if not unbiased(r.policy)]
    if not ok and controls:
        return (f"verdict: no unbiased policy to recommend: only {', '.join(controls)} kept every group within the "
                f"budget, a biased control (it collects short completions first); run others with --policies"
                + (f" ({breaks})" if over else ""))
    if controls:
        breaks += f"; not recommended: {', '.join(controls)} (a biased control: it collects short completions first)"
    if not ok:
        return f"verdict: no policy kept every group within the budget ({breaks}); raise --budget or lower --group-size"
    best = min(ok, key=lambda r: r.seconds)
    line = (f"verdict: fastest within budget: {best.policy}, {best.seconds:.2f} s per group "
            f"({best.seconds_over_lower_bound:.2f}x the lower bound)")
    vllm = next((r for r in comparison.rows if r.policy == "vllm"), None)
    if vllm is not None and best.policy != "vllm":
        gain = vllm.seconds / best.seconds - 1
        line += (f"; {abs(gain):.1%} {'faster' if gain >= 0 else 'slower'} than vllm ({vllm.seconds:.2f} s, "
                 f"recomputing {vllm.recomputed_tokens:.0f} tokens per group)")
    line += "; " + breaks
    predictor = comparison.options.get("predictor", "")
    if str(predictor).startswith("oracle") and best.policy not in _BLIND:
        line += "; predictions are the true lengths (oracle): a best case, not what a trained predictor gets"
    return line


def unbiased(policy: str) -> bool:
    """Whether ``policy`` collects exactly the completions it launched (not a biased control such as
    ``dynamic_slot``, which stops at the first G of an endless stream); a name outside the registry counts as
    unbiased."""
    spec = POLICIES.get(policy)
    return spec is None or spec.unbiased


# Policies that use no predicted lengths (the oracle note does not apply to them).
_BLIND = {"full", "full_freed", "micro", "fixed_slot", "dynamic_slot", "vllm", "sglang", "reserve_max"}

#: The table's columns and the legend line of each, in order.
COLUMNS: dict[str, str] = {
    "policy": "the sampling policy (lengthsched.runtime.POLICIES); * = breaks the budget in some group "
              "(such rows are listed last)",
    "seconds": "mean modelled wall time per group: every step priced by its rows, the KV they read and the "
               "tokens it prefills (prompts and recomputation included)",
    "x vllm": "seconds / vllm's seconds (below 1: faster than vllm; '-' without a vllm row)",
    "s/LB": "seconds over the lower bound in seconds (1 = nothing left to gain)",
    "tok/s": "collected tokens per modelled second",
    "steps": "mean decode steps per group",
    "steps/LB": "steps over the step lower bound (docs/model.md section 5)",
    "peak KV GiB": "the most KV cache held at once beyond the shared prompt (max over groups)",
    "peak GiB": "the most memory held at once: weights + activations of the live rows + prompt KV + KV "
                "(max over groups), to compare with the budget",
    "in budget": "share of groups whose peak GiB fits the budget",
    "preempt": "mean preemptions per group",
    "recomputed": "mean tokens recomputed per group after preemptions",
    "KS": "Kolmogorov-Smirnov statistic of the collected lengths against the unbiased ones (0 = no bias)",
    "plan ms": "the policy's CPU time per group before the first step",
    "decide ms": "the policy's CPU time per group for its decisions during the run",
}

def legend(meanings: Mapping[str, str], columns: Sequence[str] | None = None) -> str:
    """The legend under a text table: one line per column (``columns``, in that order; default every
    column of ``meanings``), ``  name: what it means``."""
    return "\n".join(f"  {name}: {meanings[name]}" for name in (meanings if columns is None else columns))


def aligned(table: Sequence[Sequence[str]]) -> list[str]:
    """The rows of a text table, one line each: its first column left-aligned, the others right-aligned,
    every column as wide as its widest cell."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return ["  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths)))
            for row in table]


#: The legend under the table: one line per column.
LEGEND = legend(COLUMNS)


def format_table(comparison: Comparison) -> str:
    """The comparison as an aligned text table, fastest first, with a verdict and a legend line per column."""
    gib = 2**30
    head = list(COLUMNS)
    lines = [comparison.note, ""]
    table = [head]
    for r in comparison.rows:
        name = r.policy + ("" if r.within_budget >= 1.0 else " *")
        table.append([name, f"{r.seconds:.2f}", "-" if r.seconds_vs_vllm is None else f"{r.seconds_vs_vllm:.3f}",
                      f"{r.seconds_over_lower_bound:.2f}", f"{r.tokens_per_second:,.0f}", f"{r.steps:.0f}",
                      f"{r.steps_over_lower_bound:.2f}", f"{r.peak_kv_bytes / gib:.2f}",
                      f"{r.peak_total_bytes / gib:.2f}", f"{100 * r.within_budget:.0f}%", f"{r.preemptions:.1f}",
                      f"{r.recomputed_tokens:.0f}", f"{r.ks_statistic:.3f}", f"{r.planning_ms:.2f}",
                      f"{r.decide_ms:.2f}"])
    lines += aligned(table)
    lines += ["", headline(comparison), "", "columns (rows ordered by seconds, those within budget first):", LEGEND]
    return "\n".join(lines)
