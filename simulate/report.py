"""The comparison behind ``lengthsched simulate``: every policy on the same groups, one table."""

from __future__ import annotations

import dataclasses
import os
from functools import lru_cache
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from lengthsched import (
    ConstantLengthPredictor,
    InvalidArgument,
    ModelMemory,
    NoisyOracleLengthPredictor,
    parse_bytes,
)
from lengthsched.errors import check_int
from lengthsched.runtime import POLICIES, kv_budget_tokens
from lengthsched.runtime.timing import lower_bound_seconds

from .options import SimulateOptions
from .fast import FAST_POLICIES, seconds_many, slot_count, steps_and_peaks
from .run import SimResult, lower_bound, run_group
from .workloads import Group, make_workload

__all__ = ["PolicySummary", "Comparison", "compare", "format_table", "load_memory", "parse_policies",
           "predictions_for", "simulate_group"]


def load_memory(opts: SimulateOptions) -> ModelMemory:
    return ModelMemory.from_name(opts.model, opts.dtype, kv_dtype=opts.kv_dtype)


def parse_policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if not names or unknown:
        raise InvalidArgument("policies", text, "comma-separated names among " + ", ".join(POLICIES))
    return names


def predictions_for(spec: str, group: Group, index: int, seed: int) -> Any:
    """The ``predicted`` argument of run_group for a predictor spec and one group."""
    kind, _, arg = spec.partition(":")
    try:
        if kind == "oracle" and not arg:
            return group.lengths
        if kind == "noisy":
            return NoisyOracleLengthPredictor(group.lengths, sigma=float(arg), seed=seed + index)
        if kind == "constant":
            return ConstantLengthPredictor(int(arg))
        if kind == "trace" and not arg:
            if group.predicted is None:
                raise InvalidArgument("predictor", spec, f"a 'predicted' field in group {group.prompt_id}")
            return group.predicted
        if kind == "online":
            return _online_predictor(int(arg) if arg else None)
    except ValueError:
        pass
    raise InvalidArgument("predictor", spec, "oracle, noisy:SIGMA, constant:TOKENS, trace, online or online:TOKENS")


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

    def to_dict(self) -> dict:
        return {"options": self.options, "memory": self.memory, "budget_bytes": self.budget_bytes,
                "note": self.note, "policies": [dataclasses.asdict(r) for r in self.rows]}


def _group_budget(memory: ModelMemory, budget_bytes: int, group: Group, slots: int | None = None) -> int:
    """KV tokens (beyond the prompt) a group may hold: what is left next to the weights, the
    prompt and the activations of the decode batch (``lengthsched.runtime.kv_budget_tokens``)."""
    return kv_budget_tokens(memory, budget_bytes, prompt_tokens=group.prompt_len, group_size=len(group.lengths),
                            slots=slots)


def load_cost(opts: SimulateOptions, memory: ModelMemory):
    """The step-cost model that prices the comparison: ``--cost FILE`` or ``--model`` on the ``--gpu`` preset."""
    from lengthsched.cost import StepCost

    if opts.cost is None:
        return StepCost.from_gpu(memory, opts.gpu, config=opts.model)
    try:
        with open(opts.cost, encoding="utf-8") as handle:
            return StepCost.from_json(handle.read())
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument("cost", opts.cost, f"a readable step-cost JSON file ({exc.__class__.__name__})") from None


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
                     cost=load_cost(opts, memory) if cost is None else cost, prefill_chunk=opts.prefill_chunk)


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


def run_units(units: Sequence[tuple], workers: int, progress: bool, label: str) -> list:
    """Map :func:`_one_group` over work units, on ``workers`` processes, with a progress bar."""
    from tqdm import tqdm

    workers = check_int("workers", workers, minimum=0) or os.cpu_count() or 1
    bar = dict(total=len(units), desc=label, disable=not progress, leave=False, unit="group")
    if workers == 1 or len(units) < 4:
        return [_one_group(u) for u in tqdm(units, **bar)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(tqdm(pool.map(_one_group, units, chunksize=max(1, len(units) // (8 * workers))), **bar))


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


def compare(opts: SimulateOptions, *, progress: bool = False) -> Comparison:
    """Run every policy of ``opts.policies`` on the same groups and summarise each."""
    policies = parse_policies(opts.policies)
    memory = load_memory(opts)
    budget_bytes = parse_bytes(opts.budget)
    groups = make_workload(opts.workload, opts.group_size, max_new_tokens=opts.max_new_tokens, limit=opts.groups,
                           seed=opts.seed, spread=opts.spread)
    # Fail early, here rather than in a worker: a budget too small, a predictor spec that is wrong.
    _group_budget(memory, budget_bytes, max(groups, key=lambda g: (g.prompt_len, len(g.lengths))), opts.slots)
    predictions_for(opts.predictor, groups[0], 0, opts.seed)
    uniform = len({len(g.lengths) for g in groups}) == 1
    fast = [p for p in policies if p in FAST_POLICIES and uniform]
    slow = [p for p in policies if p not in fast]
    cost = load_cost(opts, memory)
    results = run_units([(opts, memory, budget_bytes, g, i, slow, cost) for i, g in enumerate(groups)], opts.workers,
                        progress, "simulate") if slow else [[] for _ in groups]
    for policy in fast:
        for res, item in zip(results, _fast(opts, memory, budget_bytes, groups, policy, cost)):
            res.append(item)
    rows = summarize(results, policies, budget_bytes)
    # Fastest first among the policies that keep every group within the budget, then the others.
    rows = tuple(sorted(rows, key=lambda r: (r.within_budget < 1.0, r.seconds)))
    note = (f"{len(groups)} groups of G={opts.group_size} from {opts.workload}, L_max={opts.max_new_tokens}, "
            f"{memory.name} ({opts.dtype}), budget {budget_bytes / 2**30:.2f} GiB, predictor {opts.predictor}; "
            f"seconds modelled for {cost.model} on {cost.gpu}" + (" (fitted)" if opts.cost else " (unfitted preset)")
            + f", prefill chunk {opts.prefill_chunk} tokens")
    return Comparison(dataclasses.asdict(opts), memory.describe(), budget_bytes, rows, note)


def headline(comparison: Comparison) -> str:
    """One line: the fastest policy within budget, its gain over vllm, and how far predictions were oracle."""
    ok = [r for r in comparison.rows if r.within_budget >= 1.0]
    if not ok:
        return "no policy kept every group within the budget"
    best = min(ok, key=lambda r: r.seconds)
    line = (f"fastest within budget: {best.policy}, {best.seconds:.2f} s per group "
            f"({best.seconds_over_lower_bound:.2f}x the lower bound)")
    vllm = next((r for r in comparison.rows if r.policy == "vllm"), None)
    if vllm is not None and best.policy != "vllm":
        gain = vllm.seconds / best.seconds - 1
        line += (f"; {abs(gain):.1%} {'faster' if gain >= 0 else 'slower'} than vllm ({vllm.seconds:.2f} s, "
                 f"recomputing {vllm.recomputed_tokens:.0f} tokens per group)")
    predictor = comparison.options.get("predictor", "")
    if str(predictor).startswith("oracle") and best.policy not in _BLIND:
        line += "; predictions are the true lengths (oracle): a best case, not what a trained predictor gets"
    return line


# Policies that use no predicted lengths (the oracle note does not apply to them).
_BLIND = {"full", "full_freed", "micro", "fixed_slot", "dynamic_slot", "vllm", "sglang", "reserve_max"}

LEGEND = ("seconds: modelled wall time per group (every step priced by its rows, the KV they read and the tokens it "
          "prefills, prompts and recomputation included); x vllm: seconds / vllm's; s/LB: seconds over the lower "
          "bound in seconds; tok/s: collected tokens per modelled second; steps: decode steps per group; steps/LB: "
          "steps over the step lower bound; peak columns: the maximum over groups; in budget: share of groups whose "
          "peak fits (rows marked * break the budget and are listed last); preempt, recomputed: per group; KS: "
          "collected lengths against the unbiased ones (0 = no bias); plan ms / decide ms: the policy's CPU time "
          "per group before and during the run. Rows are ordered by seconds.")


def format_table(comparison: Comparison) -> str:
    """The comparison as an aligned text table, fastest first, with a legend and a headline."""
    gib = 2**30
    head = ["policy", "seconds", "x vllm", "s/LB", "tok/s", "steps", "steps/LB", "peak KV GiB", "peak GiB",
            "in budget", "preempt", "recomputed", "KS", "plan ms", "decide ms"]
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
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        lines.append("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
    lines += ["", headline(comparison), "", LEGEND]
    return "\n".join(lines)
