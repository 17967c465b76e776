"""``lengthsched simulate``: the comparison table, sweeps and figures."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from lengthsched import InvalidArgument, parse_bytes
from lengthsched.io import atomic_write_text

from .options import SimulateOptions, resolve, rollout_mode
from .report import (
    aligned,
    check_options,
    clipped_notice,
    compare,
    format_table,
    load_memory,
    parse_policies,
    render_setting,
    simulate_group,
    unbiased,
    workload_groups,
)
from .workloads import WORKLOADS, TraceError

__all__ = ["run_simulate", "parse_sweep", "run_sweep", "format_sweep"]

SWEEPS = {"group_size": int, "budget": str, "spread": float, "sigma": float, "max_new_tokens": int}


def parse_sweep(text: str) -> tuple[str, list]:
    """``"group_size=8,16,32"`` -> ("group_size", [8, 16, 32])."""
    key, _, values = text.partition("=")
    key = key.strip()
    if key not in SWEEPS or not values.strip():
        raise InvalidArgument("sweep", text, "KEY=V1,V2,... with KEY one of " + ", ".join(SWEEPS))
    try:
        parsed = [SWEEPS[key](v.strip()) for v in values.split(",") if v.strip()]
    except ValueError:
        raise InvalidArgument("sweep", text, f"values of type {SWEEPS[key].__name__} for {key}") from None
    if key == "budget":
        [parse_bytes(v, "sweep") for v in parsed]
    return key, parsed


def _with(opts: SimulateOptions, key: str, value) -> SimulateOptions:
    if key == "sigma":
        return dataclasses.replace(opts, predictor="oracle" if value == 0 else f"noisy:{value}")
    return dataclasses.replace(opts, **{key: value})


def run_sweep(opts: SimulateOptions, key: str, values: list, *, progress: bool) -> dict:
    """One comparison per value of ``key``; returns {"sweep", "values", "comparisons"}."""
    if key == "group_size" and opts.workload not in WORKLOADS:
        raise InvalidArgument("sweep", f"group_size={','.join(map(str, values))}",
                              f"another setting: a trace file ({opts.workload}) keeps its groups' logged sizes")
    if key == "sigma" and not str(opts.predictor).startswith(("oracle", "noisy")):
        raise InvalidArgument("sweep", f"sigma={','.join(map(str, values))}",
                              f"no --predictor (it is {opts.predictor}): the sigma sweep sets the noisy predictor")
    comparisons = []
    for value in values:
        try:
            comparisons.append(compare(_with(opts, key, value), progress=progress).to_dict())
        except InvalidArgument as exc:
            if exc.name != key:
                raise
            raise InvalidArgument("sweep", f"{key}={value}", exc.expected) from None  # the value came from --sweep
    return {"sweep": key, "values": values, "comparisons": comparisons}


def _merged_setting(comparisons: list[dict]) -> str:
    """The comparisons' common header; a part that differs shows every value ("G=4, 8, 16")."""
    first = comparisons[0]["setting"]
    parts = []
    for i, (key, template, value) in enumerate(first):
        values = list(dict.fromkeys(c["setting"][i][2] for c in comparisons))
        parts.append((key, template, value if len(values) == 1 else ", ".join(values) + " (swept)"))
    return render_setting(parts)


def format_sweep(sweep: dict) -> str:
    """A sweep as a table: one row per policy, one column per swept value, a verdict per value."""
    values = sweep["values"]
    policies = [row["policy"] for row in sweep["comparisons"][0]["policies"]]
    by_policy = [{row["policy"]: row for row in comp["policies"]} for comp in sweep["comparisons"]]
    head = ["policy"] + [f"{sweep['sweep']}={v}" for v in values]
    table = [head]
    for policy in policies:
        cells = []
        for rows in by_policy:
            row = rows[policy]
            ratio = row["seconds_vs_vllm"]
            over = "" if row["within_budget"] >= 1.0 else " *"
            cells.append(f"{row['seconds']:.2f}" + ("" if ratio is None else f" ({ratio:.2f})") + over)
        table.append([policy + (" *" if any(r[policy]["within_budget"] < 1.0 for r in by_policy) else "")]
                     + cells)
    lines = [_merged_setting(sweep["comparisons"]), ""] + aligned(table)
    verdicts = []
    for value, rows in zip(values, by_policy):
        ok = [r for r in rows.values() if r["within_budget"] >= 1.0 and unbiased(r["policy"])]
        over = [r["policy"] for r in rows.values() if r["within_budget"] < 1.0]
        controls = [r for r in rows.values() if r["within_budget"] >= 1.0 and not unbiased(r["policy"])]
        best = f"{min(ok, key=lambda r: r['seconds'])['policy']} fastest within budget" if ok else \
            "no unbiased policy within budget" if controls else "no policy within budget"
        verdicts.append(f"{sweep['sweep']}={value}: {best}" + (f", {len(over)} over budget" if over else ""))
    lines += ["", "verdict: " + "; ".join(verdicts), "",
              "cells: mean modelled seconds per group (in brackets: / vllm's seconds); * = over budget: some group's "
              "peak memory is above the budget (a policy marked * is over budget at some value)"]
    return "\n".join(lines)


def _figures(opts: SimulateOptions, directory: Path, progress: bool) -> list[Path]:
    from .plots import gantt, memory_over_time, sweep_lines

    directory.mkdir(parents=True, exist_ok=True)
    check_options(opts)
    policies = parse_policies(opts.policies)
    memory = load_memory(opts)
    budget_bytes = parse_bytes(opts.budget, "budget")
    group = workload_groups(opts, 1)[0]
    results = [simulate_group(opts, memory, budget_bytes, group, 0, p, record=True) for p in policies]
    budget_tokens = results[0].budget_tokens
    budget = f"budget {_gib(budget_bytes)} = {budget_tokens} KV tokens"
    written = []
    title = f"group {group.prompt_id} (G={len(group.lengths)}, {budget})"
    for r in results:
        path = directory / f"gantt_{r.policy}.png"
        gantt(r, path, title)
        written.append(path)
    path = directory / "memory.png"
    held = "KV held over time" + ("" if opts.kv_compression is None else f" (cache {opts.kv_compression})")
    memory_over_time(results, budget_tokens, path, f"{held}, {title}", budget_label=budget)
    written.append(path)
    small = dataclasses.replace(opts, groups=min(opts.groups, 40))
    spare = budget_bytes - memory.weights_bytes
    sweeps = {"budget": [_gib(memory.weights_bytes + f * spare) for f in (0.5, 1, 2, 4)]}
    if opts.workload in WORKLOADS:  # a trace file keeps its own group sizes
        sweeps = {"group_size": [8, 16, 32, 64, 128], **sweeps}
    groups = workload_groups(small, small.groups)
    for key, values in sweeps.items():
        if key == "budget":  # only the budgets that hold every group (the smallest may not)
            values = [v for v in values if _holds(small, memory, v, groups, policies)]
        sweep = run_sweep(small, key, values, progress=progress)
        seconds = {row["policy"]: [next(r["seconds"] for r in c["policies"] if r["policy"] == row["policy"])
                                   for c in sweep["comparisons"]]
                   for row in sweep["comparisons"][0]["policies"]}
        path = directory / f"seconds_vs_{key}.png"
        label = "budget (GiB, as --budget takes it)" if key == "budget" else key.replace("_", " ")
        sweep_lines(values, seconds, label, path, f"modelled seconds per group vs {key.replace('_', ' ')}")
        written.append(path)
    return written


def _gib(value: float) -> str:
    """Bytes as ``--budget`` takes them: ``"5.00GiB"``."""
    return f"{value / 2**30:.2f}GiB"


def _holds(opts: SimulateOptions, memory, budget: str, groups, policies) -> bool:
    from lengthsched import BudgetTooSmall

    from .report import check_budget

    try:
        check_budget(opts, memory, parse_bytes(budget, "budget"), groups, policies)
    except BudgetTooSmall:
        return False
    return True


def _notices(result: dict, quantile: float) -> list[str]:
    """The clipped-predictions notice: one line, for a comparison or a whole sweep."""
    if "comparisons" not in result:
        line = clipped_notice(result.get("clipped_predictions", {}), quantile)
        return [line] if line else []
    parts = []
    for value, comp in zip(result["values"], result["comparisons"]):
        c = comp.get("clipped_predictions", {})
        if c.get("point") or c.get("reserve"):
            parts.append(f"{result['sweep']}={value}: {c['point']} of {c['of']} predicted, {c['reserve']} reserved")
    if not parts:
        return []
    return [f"notice: predictions above --max-new-tokens were clipped to it ({quantile:g}-quantiles reserved): "
            + "; ".join(parts)]


def run_simulate(opts: SimulateOptions) -> int:
    """The ``lengthsched simulate`` command."""
    try:
        return _simulate(opts)
    except TraceError as exc:  # the trace file's line and field, named as the flag that gave it
        raise TraceError(f"--workload: {exc}") from None


def _simulate(opts: SimulateOptions) -> int:
    for module in ("scipy", "tqdm", "matplotlib"):
        try:
            __import__(module)
        except ImportError:
            raise ImportError(f"lengthsched simulate needs {module}: pip install 'lengthsched[simulate]'") from None
    if rollout_mode(opts):
        return _run_rollout_step(opts)
    check_options(opts)
    opts = resolve(opts)
    progress = sys.stderr.isatty()
    if opts.sweep:
        key, values = parse_sweep(opts.sweep)
        result = run_sweep(opts, key, values, progress=progress)
        text = format_sweep(result)
    else:
        comparison = compare(opts, progress=progress)
        result, text = comparison.to_dict(), format_table(comparison)
    for line in _notices(result, opts.quantile):
        print(f"lengthsched simulate: {line}", file=sys.stderr)
    payload = json.dumps(result, indent=1, default=_jsonable)
    if opts.output:
        atomic_write_text(opts.output, payload + "\n")
    if opts.plot:
        for path in _figures(opts, Path(opts.plot), progress):
            print(f"wrote {path}", file=sys.stderr)
    print(payload if opts.json else text)
    return 0


def _run_rollout_step(opts: SimulateOptions) -> int:
    """``--prompts`` / ``--replicas``: one rollout step, every policy and router, one table."""
    from .rollout_report import compare_rollout, format_rollout, rollout_figures

    if opts.turns is not None:
        return _run_multiturn(opts)
    if opts.max_staleness is not None:
        return _run_async(opts)
    comparison = compare_rollout(opts, record=bool(opts.plot))
    if opts.workload == "lmsys" and opts.prompt_tokens is None:
        print("lengthsched simulate: notice: the lmsys trace has no prompt lengths, so its prompts take 0 tokens "
              "(no prefill, no KV), which flatters the policies that spread a group over many replicas; "
              "--prompt-tokens castillo or --prompt-tokens N gives them some", file=sys.stderr)
    payload = json.dumps(comparison.to_dict(), indent=1, default=_jsonable)
    if opts.output:
        atomic_write_text(opts.output, payload + "\n")
    if opts.plot:
        for path in rollout_figures(comparison, Path(opts.plot)):
            print(f"wrote {path}", file=sys.stderr)
    print(payload if opts.json else format_rollout(comparison))
    return 0


def _run_async(opts: SimulateOptions) -> int:
    """``--max-staleness``: AReaL's asynchronous loop against synchronous steps, one table."""
    from .async_report import compare_async, format_async

    return _report(opts, compare_async(opts), format_async)


def _run_multiturn(opts: SimulateOptions) -> int:
    """``--turns``: one multi-turn step, every run of simulate.multiturn.MULTITURN_RUNS, one table."""
    from .multiturn_report import compare_multiturn, format_multiturn

    return _report(opts, compare_multiturn(opts), format_multiturn)


def _report(opts: SimulateOptions, comparison, formatted) -> int:
    """Print ``comparison`` (``formatted``'s table, or its JSON with --json) and write its JSON to --output."""
    payload = json.dumps(comparison.to_dict(), indent=1, default=_jsonable)
    if opts.output:
        atomic_write_text(opts.output, payload + "\n")
    print(payload if opts.json else formatted(comparison))
    return 0


def _jsonable(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
