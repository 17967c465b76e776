"""``lengthsched simulate --prompts B --replicas R --turns LO-HI``: one multi-turn (agentic) rollout step.

Every completion of the step is a session cut at random into turns (:func:`simulate.split_turns`), a tool call
between two turns; every row of :data:`simulate.multiturn.MULTITURN_RUNS` runs the same sessions
(:func:`simulate.run_multiturn`) on the same replicas: vLLM FCFS with verl's sticky session routing (the reference),
the same without a prefix cache, vLLM's priority scheduling with the plan's priorities on first turns only (verl
0.9.1's ``ToolAgentLoop``) and on every turn (lengthsched's workers), and ``steal`` blind to later turns and
following them, with ``--predictor``'s predictions, once with the true lengths (an oracle row), and vLLM behind a
cache-aware router that rebalances later turns by load (SGLang's router's rule). With
``--framework slime`` the rows are :data:`simulate.multiturn.MULTITURN_SLIME_RUNS` instead: SGLang's engines behind
SGLang's router on every turn (slime as it ships, the reference), sticky sessions, lengthsched's slime integration
with and without its client window, ``steal_sglang``, and vLLM's engines beside.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from lengthsched import InvalidArgument, LengthschedError
from lengthsched.errors import check_nonnegative_float, check_positive_float

from .multiturn import MULTITURN_RUNS, MULTITURN_SLIME_RUNS, MultiTurnResult, run_multiturn_row, split_turns
from .options import OPTION_DEFAULTS, SimulateOptions, resolve
from .report import aligned, legend, parse_compression

__all__ = ["MULTITURN_LEGEND", "MultiTurnComparison", "check_multiturn_options", "compare_multiturn",
           "format_multiturn", "parse_range"]

#: The columns of the table, and what each means.
MULTITURN_LEGEND = {
    "run": "the engines' policy, how later turns are steered, and the predictions ((oracle): every session's true "
           "length, not available to a real run)",
    "seconds": "the step's makespan: the last turn's finish (modelled)",
    "x ref": "seconds / those of the first run (below 1: faster): vLLM FCFS with verl's sticky routing, or with "
             "--framework slime SGLang behind its router (slime as it ships)",
    "x LB": "seconds / the lower bound (the larger of the single-turn bound over every turn, each reading and "
            "holding its conversation, every tool answer prefilled, and the slowest session's path: its tokens "
            "decoded one a step, its answers prefilled, plus its tools' seconds)",
    "preempted": "preemptions (each recomputes what the request had generated)",
    "prefilled": "tokens prefilled: prompts, conversations of later turns, recomputation",
    "cached": "share of the later turns that found their conversation in their replica's prefix cache (with "
              "--kv-offload, or loaded it from the replica's host memory)",
    "moved": "share of the later turns that ran on another replica than their previous turn (stolen, moved, or "
             "routed elsewhere by SGLang's router)",
}


def parse_range(name: str, text: Any, minimum: int) -> tuple[int, int]:
    """``N`` or ``LO-HI`` (whole numbers, ``minimum`` <= LO <= HI) as (LO, HI)."""
    lo, sep, hi = str(text).strip().partition("-")
    try:
        low = int(lo)
        high = int(hi) if sep else low
    except ValueError:
        low, high = minimum - 1, minimum - 1
    if low < minimum or high < low:
        raise InvalidArgument(name, text, f"N or LO-HI, whole numbers with {minimum} <= LO <= HI (e.g. 2-5)")
    return low, high


def check_multiturn_options(opts: SimulateOptions) -> tuple[tuple[int, int], tuple[int, int]]:
    """The turns and tool tokens of ``opts`` (checked); a flag that has no effect on a multi-turn step is an error,
    and so are the tool flags without ``--turns``."""
    if opts.turns is None:
        for name in ("tool_seconds", "tool_sigma", "tool_tokens", "framework"):
            if getattr(opts, name) != OPTION_DEFAULTS[name]:
                what = "whose runs a multi-turn step compares" if name == "framework" else "a multi-turn step's tools"
                raise InvalidArgument(name, getattr(opts, name), f"--turns too (it sets {what})")
        return (1, 1), (0, 0)
    turns = parse_range("turns", opts.turns, 1)
    tokens = parse_range("tool_tokens", opts.tool_tokens, 0)
    check_positive_float("tool_seconds", opts.tool_seconds)
    check_nonnegative_float("tool_sigma", opts.tool_sigma)
    for name in ("oversample", "steps", "max_staleness", "in_flight", "headroom", "draws", "plot",
                 "resubmit_seconds", "poll_seconds", "policies", "routers"):
        value = getattr(opts, name)
        if value != OPTION_DEFAULTS[name]:
            raise InvalidArgument(name, value, f"no --{name.replace('_', '-')} with --turns (its rows are fixed: vLLM "
                                               "FCFS, vllm_priority and steal, each with and without steering later "
                                               "turns)")
    if str(opts.predictor).startswith("history"):
        raise InvalidArgument("predictor", opts.predictor, "oracle, prompt:SIGMA or constant:TOKENS with --turns "
                                                           "(each session's total length, predicted once)")
    return turns, tokens


@dataclass(frozen=True)
class MultiTurnComparison:
    options: dict
    setting: str
    labels: tuple[str, ...]
    results: tuple[MultiTurnResult | None, ...]  # None: the run failed (errors says why)
    errors: tuple[str, ...]
    oracle: tuple[bool, ...]

    def to_dict(self) -> dict[str, Any]:
        ref = self.results[0]
        rows = []
        for label, result, error, oracle in zip(self.labels, self.results, self.errors, self.oracle):
            if result is None:
                rows.append({"run": label, "error": error})
                continue
            fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result) if f.name != "step_logs"}
            versus = {"x_reference": result.seconds / ref.seconds}
            if self.options.get("framework", "verl") == "verl":  # (the reference is vLLM FCFS + verl)
                versus["x_vllm"] = versus["x_reference"]
            rows.append({"run": label, "oracle": oracle, **fields, **versus,
                         "x_lower_bound": result.seconds / result.lower_bound_seconds})
        return {"setting": self.setting, "options": self.options, "reference": self.labels[0], "rows": rows,
                "verdict": multiturn_headline(self)}


def compare_multiturn(opts: SimulateOptions) -> MultiTurnComparison:
    """Every run of :data:`MULTITURN_RUNS` (``--framework slime``: :data:`MULTITURN_SLIME_RUNS`) on the multi-turn
    step ``opts`` describe."""
    from .rollout_report import rollout_step

    turns_range, tokens = check_multiturn_options(opts)
    step = rollout_step(dataclasses.replace(opts, turns=None, tool_seconds=OPTION_DEFAULTS["tool_seconds"],
                                            tool_sigma=OPTION_DEFAULTS["tool_sigma"],
                                            tool_tokens=OPTION_DEFAULTS["tool_tokens"],
                                            framework=OPTION_DEFAULTS["framework"]))
    o = resolve(opts)
    groups = step.groups
    turns = split_turns(groups, turns=turns_range, tool_tokens=tokens, tool_seconds=float(opts.tool_seconds),
                        tool_sigma=float(opts.tool_sigma), seed=o.seed)
    oracle = np.concatenate([np.asarray(g.lengths, dtype=np.int64) for g in groups])
    known = {None: None, "given": step.predicted, "oracle": oracle}
    labels, results, errors, oracles = [], [], [], []
    common = dict(replicas=o.replicas, budget_tokens=step.pool, max_new_tokens=o.max_new_tokens, cost=step.cost,
                  prefill_chunk=o.prefill_chunk, max_num_seqs=o.slots, kv_offload=bool(opts.kv_offload),
                  compression=parse_compression(opts.kv_compression))
    for label, policy, options, pred in MULTITURN_SLIME_RUNS if opts.framework == "slime" else MULTITURN_RUNS:
        labels.append(label)
        oracles.append(pred == "oracle")
        try:
            results.append(run_multiturn_row(policy, options, groups, turns, known[pred], **common))
            errors.append("")
        except InvalidArgument as exc:
            if exc.name == "budget_tokens":
                raise InvalidArgument("budget", o.budget, f"a replica memory whose KV pool ({step.pool:,} tokens) "
                                                          f"holds the longest conversation: {exc}") from None
            raise
        except LengthschedError as exc:
            results.append(None)
            errors.append(str(exc))
    if results[0] is None:
        raise InvalidArgument("budget", o.budget, f"a setting the reference run can simulate: {errors[0]}")
    count = turns.count
    span = str(turns_range[0]) if turns_range[0] == turns_range[1] else f"{turns_range[0]}-{turns_range[1]}"
    setting = (f"one multi-turn rollout step: {o.prompts} prompts x G={len(groups[0].lengths)} from {o.workload} "
               f"(L_max={o.max_new_tokens} generated per session) as sessions of {span} turns "
               f"({count:,} turns in all), tool calls of median {opts.tool_seconds:g} s (log-sd "
               f"{opts.tool_sigma:g}) answering {tokens[0]}-{tokens[1]} tokens, on {o.replicas} replicas of "
               f"{step.memory.name} ({o.dtype}) with {step.budget_bytes / 2**30:.2f} GiB each = a pool of "
               f"{step.pool:,} KV tokens; "
               + ("verl's sticky session routing" if opts.framework == "verl" else "slime's rollout on SGLang")
               + ("; evicted KV kept in host memory (--kv-offload)" if opts.kv_offload else "")
               + ("" if opts.kv_compression is None else
                  f"; KV compressed ({opts.kv_compression}): each turn holds and reads at most "
                  f"{parse_compression(opts.kv_compression).max_retained} of the tokens it generates, its conversation "
                  "whole, and prefills its whole conversation again (a compressed turn is no prefix of the next: no "
                  "conversation stays cached)")
               + f"; predictor {o.predictor}; seconds modelled "
               f"for {step.cost.model} on {step.cost.gpu}")
    return MultiTurnComparison(dataclasses.asdict(opts), setting, tuple(labels), tuple(results), tuple(errors),
                               tuple(oracles))


def multiturn_headline(comparison: MultiTurnComparison) -> str:
    """One line: the fastest run that needs no oracle, against the reference (the first run); with ``--framework
    slime`` the fastest on SGLang's engines (what slime can run), and the fastest on vLLM's beside it."""
    ref = comparison.results[0]
    ran = [(label, r) for label, r, oracle in zip(comparison.labels, comparison.results, comparison.oracle)
           if r is not None and not oracle]
    if comparison.options.get("framework", "verl") != "slime":
        return _fastest(ran, comparison.labels[0], ref)
    sglang = [(label, r) for label, r in ran if "sglang" in r.policy]
    vllm = [(label, r) for label, r in ran if "sglang" not in r.policy]
    line = "on SGLang's engines, " + _fastest(sglang, comparison.labels[0], ref)
    if vllm:
        label, best = min(vllm, key=lambda x: x[1].seconds)
        line += f"; on vLLM's: {label}, {best.seconds:.2f} s ({best.seconds / ref.seconds:.3f} x the reference)"
    return line


def _fastest(ran: list, ref_label: str, ref: MultiTurnResult) -> str:
    label, best = min(ran, key=lambda x: x[1].seconds)
    if best.seconds >= ref.seconds * (1 - 1e-9):
        return f"fastest: {ref_label} ({ref.seconds:.2f} s); no run is faster"
    gain = ref.seconds / best.seconds - 1
    return f"fastest: {label}, {best.seconds:.2f} s, {gain:.1%} faster than {ref_label} ({ref.seconds:.2f} s)"


def format_multiturn(comparison: MultiTurnComparison) -> str:
    """The comparison as an aligned table (the reference first, then the runs in :data:`MULTITURN_RUNS` order)."""
    ref = comparison.results[0]
    head = list(MULTITURN_LEGEND)
    table = [head]
    for label, r, oracle in zip(comparison.labels, comparison.results, comparison.oracle):
        name = label + (" (oracle)" if oracle and "oracle" not in label else "")
        if r is None:
            table.append([name, "fails"] + ["-"] * (len(head) - 2))
            continue
        later = max(r.later_turns, 1)
        table.append([name, f"{r.seconds:.2f}", f"{r.seconds / ref.seconds:.3f}",
                      f"{r.seconds / r.lower_bound_seconds:.3f}", f"{r.preemptions:,}", f"{r.prefill_tokens:,}",
                      f"{(r.cache_hits + r.host_hits) / later:.1%}", f"{r.moved_turns / later:.1%}"])
    lines = [comparison.setting, ""] + aligned(table)
    errors = [f"  {label}: {error}" for label, error in zip(comparison.labels, comparison.errors) if error]
    if errors:
        lines += ["", "could not run:"] + errors
    lines += ["", "verdict: " + multiturn_headline(comparison), "", "columns:", legend(MULTITURN_LEGEND, head)]
    return "\n".join(lines)
