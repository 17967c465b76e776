"""The comparison behind ``lengthsched simulate``: every policy on the same groups, one table."""

from __future__ import annotations

import dataclasses
import os
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

from .options import SimulateOptions
from .policies import POLICIES
from .fast import FAST_POLICIES, slot_count, steps_and_peaks
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
    except ValueError:
        pass
    raise InvalidArgument("predictor", spec, "oracle, noisy:SIGMA, constant:TOKENS or trace")


@dataclass(frozen=True)
class PolicySummary:
    """One row of the table: means are per group."""

    policy: str
    groups: int
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


def _group_budget(memory: ModelMemory, budget_bytes: int, group: Group) -> int:
    """KV tokens (beyond the prompt) a group may hold: what is left next to the weights, the
    prompt and the activations of all G sequences."""
    return memory.kv_token_budget(budget_bytes, prompt_tokens=group.prompt_len, batch=len(group.lengths))


def _measures(memory: ModelMemory, group: Group, *, steps, lower, peak_kv_tokens, max_live, collected,
              preemptions=0, recomputed=0, discarded=0, planning=0.0, decide=0.0) -> dict:
    c = memory.kv_bytes_per_token
    total = memory.weights_bytes + memory.activation_bytes(max_live) + c * (group.prompt_len + peak_kv_tokens)
    return dict(steps=int(steps), lower=int(lower), tokens=int(collected.sum()), peak_kv=c * int(peak_kv_tokens),
                total=int(total), preemptions=preemptions, recomputed=recomputed, discarded=discarded,
                planning=planning, decide=decide, collected=collected, true=group.lengths)


def simulate_group(opts: SimulateOptions, memory: ModelMemory, budget_bytes: int, group: Group, index: int,
                   policy: str, *, record: bool = False) -> SimResult:
    """``policy`` on one group as the comparison runs it (budget, predictor, seeds from ``opts``)."""
    return run_group(group.lengths, policy, slots=opts.slots, budget_tokens=_group_budget(memory, budget_bytes, group),
                     predicted=predictions_for(opts.predictor, group, index, opts.seed),
                     max_new_tokens=opts.max_new_tokens, prompt_len=group.prompt_len, seed=opts.seed + index,
                     quantile=opts.quantile, refill=opts.refill, record=record)


def _one_group(args: tuple) -> list[tuple[str, dict]]:
    """Simulate every policy on one group (a picklable unit of work for the process pool)."""
    opts, memory, budget_bytes, group, index, policies = args
    out = []
    for policy in policies:
        r = simulate_group(opts, memory, budget_bytes, group, index, policy)
        out.append((policy, _measures(memory, group, steps=r.steps, lower=r.lower_bound,
                                      peak_kv_tokens=r.peak_kv_tokens, max_live=r.max_live,
                                      collected=r.collected_lengths, preemptions=r.preemptions,
                                      recomputed=r.recomputed_tokens, discarded=r.discarded_tokens,
                                      planning=r.planning_seconds, decide=r.decide_seconds)))
    return out


def _fast(opts: SimulateOptions, memory: ModelMemory, budget_bytes: int, groups: Sequence[Group],
          policy: str) -> list[tuple[str, dict]]:
    """A slot policy on all groups at once (simulate.fast), bucketed by slot count."""
    budgets = [_group_budget(memory, budget_bytes, g) for g in groups]
    slots = [slot_count(policy, slots=opts.slots, budget_tokens=b, max_new_tokens=opts.max_new_tokens,
                        group_size=len(g.lengths)) for g, b in zip(groups, budgets)]
    out: list = [None] * len(groups)
    for g in sorted(set(slots)):
        idx = [i for i, k in enumerate(slots) if k == g]
        res = steps_and_peaks(np.stack([groups[i].lengths for i in idx]), policy, g)
        for j, i in enumerate(idx):
            lower = lower_bound(groups[i].lengths, slots=opts.slots, budget_tokens=budgets[i])
            out[i] = (policy, _measures(memory, groups[i], steps=res["steps"][j], lower=lower,
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
    rows = []
    for p in policies:
        ms = per[p]
        steps = np.array([m["steps"] for m in ms], dtype=float)
        collected = np.concatenate([m["collected"] for m in ms])
        true = np.concatenate([m["true"] for m in ms])
        rows.append(PolicySummary(
            policy=p,
            groups=len(ms),
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
    _group_budget(memory, budget_bytes, max(groups, key=lambda g: (g.prompt_len, len(g.lengths))))
    predictions_for(opts.predictor, groups[0], 0, opts.seed)
    uniform = len({len(g.lengths) for g in groups}) == 1
    fast = [p for p in policies if p in FAST_POLICIES and uniform]
    slow = [p for p in policies if p not in fast]
    results = run_units([(opts, memory, budget_bytes, g, i, slow) for i, g in enumerate(groups)], opts.workers,
                        progress, "simulate") if slow else [[] for _ in groups]
    for policy in fast:
        for res, item in zip(results, _fast(opts, memory, budget_bytes, groups, policy)):
            res.append(item)
    rows = summarize(results, policies, budget_bytes)
    note = (f"{len(groups)} groups of G={opts.group_size} from {opts.workload}, L_max={opts.max_new_tokens}, "
            f"{memory.name} ({opts.dtype}), budget {budget_bytes / 2**30:.2f} GiB, predictor {opts.predictor}")
    return Comparison(dataclasses.asdict(opts), memory.describe(), budget_bytes, rows, note)


def format_table(comparison: Comparison) -> str:
    """The comparison as an aligned text table."""
    gib = 2**30
    head = ["policy", "steps", "x micro", "steps/LB", "tok/step", "peak KV GiB", "peak GiB", "in budget",
            "preempt", "recomputed", "KS", "plan ms", "decide ms"]
    lines = [comparison.note, ""]
    table = [head]
    for r in comparison.rows:
        table.append([r.policy, f"{r.steps:.0f}", "-" if r.steps_vs_micro is None else f"{r.steps_vs_micro:.3f}",
                      f"{r.steps_over_lower_bound:.2f}", f"{r.throughput:.1f}", f"{r.peak_kv_bytes / gib:.2f}",
                      f"{r.peak_total_bytes / gib:.2f}", f"{100 * r.within_budget:.0f}%", f"{r.preemptions:.1f}",
                      f"{r.recomputed_tokens:.0f}", f"{r.ks_statistic:.3f}", f"{r.planning_ms:.2f}",
                      f"{r.decide_ms:.2f}"])
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        lines.append("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
    lines += ["", "steps and preemptions are means per group; peak columns are the maximum over groups; "
                  "'in budget' is the share of groups whose peak fits; KS compares the collected lengths with the "
                  "unbiased ones (0 = no bias); plan ms is the policy's planning before the first step, decide ms "
                  "all its decisions during the run (CPU per group)."]
    return "\n".join(lines)
