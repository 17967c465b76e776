"""``lengthsched simulate``: the comparison table, sweeps and figures."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from lengthsched import InvalidArgument, parse_bytes
from lengthsched.io import atomic_write_text

from .options import SimulateOptions
from .report import compare, format_table, load_memory, parse_policies, simulate_group
from .workloads import make_workload

__all__ = ["run_simulate", "parse_sweep", "run_sweep"]

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
    comparisons = []
    for value in values:
        comparisons.append(compare(_with(opts, key, value), progress=progress).to_dict())
    return {"sweep": key, "values": values, "comparisons": comparisons}


def format_sweep(sweep: dict) -> str:
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
        table.append([policy] + cells)
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines = [sweep["comparisons"][0]["note"], "mean modelled seconds per group (x vllm); * breaks the budget", ""]
    lines += ["  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))) for r in table]
    return "\n".join(lines)


def _figures(opts: SimulateOptions, directory: Path, progress: bool) -> list[Path]:
    from .plots import gantt, memory_over_time, sweep_lines

    directory.mkdir(parents=True, exist_ok=True)
    policies = parse_policies(opts.policies)
    memory = load_memory(opts)
    budget_bytes = parse_bytes(opts.budget)
    group = make_workload(opts.workload, opts.group_size, max_new_tokens=opts.max_new_tokens, limit=1,
                          seed=opts.seed, spread=opts.spread)[0]
    results = [simulate_group(opts, memory, budget_bytes, group, 0, p, record=True) for p in policies]
    budget_tokens = results[0].budget_tokens
    written = []
    title = f"group {group.prompt_id} (G={len(group.lengths)}, budget {budget_tokens} KV tokens)"
    for r in results:
        path = directory / f"gantt_{r.policy}.png"
        gantt(r, path, title)
        written.append(path)
    path = directory / "memory.png"
    memory_over_time(results, budget_tokens, path, f"KV held over time, {title}")
    written.append(path)
    small = dataclasses.replace(opts, groups=min(opts.groups, 40))
    spare = budget_bytes - memory.weights_bytes
    sweeps = {
        "group_size": [8, 16, 32, 64, 128],
        "budget": [str(int(memory.weights_bytes + f * spare)) for f in (0.5, 1, 2, 4)],
    }
    for key, values in sweeps.items():
        sweep = run_sweep(small, key, values, progress=progress)
        seconds = {row["policy"]: [next(r["seconds"] for r in c["policies"] if r["policy"] == row["policy"])
                                 for c in sweep["comparisons"]]
                 for row in sweep["comparisons"][0]["policies"]}
        labels = values if key != "budget" else [f"{int(v) / 2**30:.1f} GiB" for v in values]
        path = directory / f"seconds_vs_{key}.png"
        label = key.replace("_", " ")
        sweep_lines(labels, seconds, label, path, f"modelled seconds per group vs {label}")
        written.append(path)
    return written


def run_simulate(opts: SimulateOptions) -> int:
    """The ``lengthsched simulate`` command."""
    for module in ("scipy", "tqdm", "matplotlib"):
        try:
            __import__(module)
        except ImportError:
            raise ImportError(f"lengthsched simulate needs {module}: pip install 'lengthsched[simulate]'") from None
    progress = sys.stderr.isatty()
    if opts.sweep:
        key, values = parse_sweep(opts.sweep)
        result = run_sweep(opts, key, values, progress=progress)
        text = format_sweep(result)
    else:
        comparison = compare(opts, progress=progress)
        result, text = comparison.to_dict(), format_table(comparison)
    payload = json.dumps(result, indent=1, default=_jsonable)
    if opts.output:
        atomic_write_text(opts.output, payload + "\n")
    if opts.plot:
        for path in _figures(opts, Path(opts.plot), progress):
            print(f"wrote {path}", file=sys.stderr)
    print(payload if opts.json else text)
    return 0


def _jsonable(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
