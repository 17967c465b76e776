"""``lengthsched cost fit`` and ``lengthsched cost show``: calibrate and inspect the step-cost model.

The options are frozen dataclasses in the style of :mod:`lengthsched.options` (help text in each
field's metadata, ``positional=True`` for a positional argument); ``COST_COMMANDS`` maps each
subcommand to its options class and runner, which return the exit code and raise
:class:`~lengthsched.errors.InvalidArgument` on bad input.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .cost import GPU_PRESETS, StepCost, read_samples
from .errors import InvalidArgument
from .io import atomic_write_text
from .memory import DTYPE_BYTES

__all__ = ["CostFitOptions", "CostShowOptions", "run_cost_fit", "run_cost_show", "COST_COMMANDS",
           "SHOW_ROWS", "SHOW_CONTEXTS", "SHOW_PREFILLS"]

DEFAULT_MODEL, DEFAULT_GPU = "qwen3-1.7b", "h100"
SHOW_ROWS = (1, 8, 32, 64, 128, 256, 512)  # decode rows per step
SHOW_CONTEXTS = (256, 1024, 4096, 16384)  # tokens each row attends
SHOW_PREFILLS = (512, 2048, 8192)  # tokens of one prompt prefilled in one step


def _opt(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


@dataclass(frozen=True)
class CostFitOptions:
    """Fit the step-cost model (overhead, bandwidth and compute efficiency) to measured engine steps.

    Prints the fitted parameters and the relative errors on held-out steps, beside the unfitted
    GPU preset's errors on the same steps; writes the fitted model as JSON with --out.
    """

    samples: str | None = _opt(None, "JSON lines of measured steps: {decode_rows, kv_tokens_read, prefill_tokens, "
                                     "seconds[, prefill_context]} per line", positional=True, required=True)
    out: str | None = _opt(None, "write the fitted model JSON here (atomically); read it with cost show --cost",
                           output="file")
    model: str = _opt(DEFAULT_MODEL, "a config.json path, a model directory, or a bundled preset name")
    gpu: str = _opt(DEFAULT_GPU, "GPU preset (datasheet bandwidth and dense bf16 FLOP/s)", choices=list(GPU_PRESETS))
    dtype: str = _opt("bfloat16", "weights and activations dtype", choices=sorted(DTYPE_BYTES))
    kv_dtype: str | None = _opt(None, "KV cache dtype, default --dtype", choices=sorted(DTYPE_BYTES))
    tp: int = _opt(1, "tensor-parallel degree the steps were measured at")
    train_fraction: float = _opt(0.5, "share of the steps fitted on (seeded random split); the rest are held out")
    seed: int = _opt(0, "seed of the train / held-out split")
    separate_attention: bool = _opt(False, "fit the form that prices attention as its own kernels beside the "
                                           "linear layers (better for mixed prefill + decode steps)")
    json: bool = _opt(False, "print the report as JSON instead of a table")


@dataclass(frozen=True)
class CostShowOptions:
    """Show modelled step times (ms) over decode rows x context, prefill steps, and where decode turns compute bound."""

    model: str | None = _opt(None, f"a config.json path, a model directory, or a bundled preset name "
                                   f"(default {DEFAULT_MODEL}; not with --cost)")
    gpu: str | None = _opt(None, f"GPU preset (default {DEFAULT_GPU}); with --cost, the card to move the fitted "
                                 f"model to (its datasheet numbers, the fitted efficiencies kept)",
                           choices=list(GPU_PRESETS))
    dtype: str = _opt("bfloat16", "weights and activations dtype", choices=sorted(DTYPE_BYTES))
    kv_dtype: str | None = _opt(None, "KV cache dtype, default --dtype", choices=sorted(DTYPE_BYTES))
    tp: int | None = _opt(None, "tensor-parallel degree (default 1; not with --cost)")
    cost: str | None = _opt(None, "a fitted model JSON (from cost fit --out) instead of --model/--tp")
    json: bool = _opt(False, "print machine-readable JSON instead of tables")


def _fmt(value: float | None, scale: float = 100.0, unit: str = "%") -> str:
    return "-" if value is None else f"{value * scale:.1f}{unit}"


def run_cost_fit(opts: CostFitOptions) -> int:
    """``lengthsched cost fit``: fit, print a report, write the fitted model (exit code 0)."""
    if opts.samples is None:
        raise InvalidArgument("samples", None, "a JSON lines file of measured steps")
    samples = read_samples(opts.samples)
    prior = StepCost.from_model(opts.model, opts.gpu, dtype=opts.dtype, kv_dtype=opts.kv_dtype, tp=opts.tp,
                                separate_attention=opts.separate_attention)
    fitted, report = prior.fit_and_validate(samples, train_fraction=opts.train_fraction, seed=opts.seed)
    report = {"model": prior.model, "gpu": prior.gpu, "tp": prior.tp, "separate_attention": prior.separate_attention,
              "samples": str(opts.samples), **report}
    if opts.out is not None:
        report["out"] = str(opts.out)
    if opts.json:
        print(json.dumps(report, indent=1))
        if opts.out is not None:  # after printing: a failed write does not lose the report
            atomic_write_text(opts.out, fitted.to_json())
        return 0
    n = report["n_samples"]
    form = "separate attention" if prior.separate_attention else "overlapped attention"
    print(f"{prior.model} on {prior.gpu} (tp {prior.tp}, {form}): {n} measured steps, "
          f"{report['train']['n']} fitted (seed {opts.seed}), {report['held_out']['n']} held out")
    print(f"{'parameter':<22}{'preset prior':>14}{'fitted':>14}")
    for name, value in report["parameters"].items():
        scale, unit = (1e3, " ms") if name == "overhead_seconds" else (1.0, "")
        label = "overhead" if name == "overhead_seconds" else name
        print(f"{label:<22}{report['prior_parameters'][name] * scale:>11.3f}{unit:<3}{value * scale:>11.3f}{unit:<3}")
    print(f"{'|relative error|':<22}{'median':>9}{'p90':>9}{'max':>9}")
    for label, key in (("fitted, held out", "held_out"), ("preset, held out", "prior_held_out"),
                       ("fitted, train", "train"), ("preset, train", "prior_train")):
        s = report[key]
        print(f"{label:<22}{_fmt(s['median']):>9}{_fmt(s['p90']):>9}{_fmt(s['max']):>9}")
    if opts.out is not None:
        atomic_write_text(opts.out, fitted.to_json())
        print(f"wrote {opts.out}")
    return 0


def _load_show_model(opts: CostShowOptions) -> StepCost:
    if opts.cost is not None:
        given = [f"--{name}" for name in ("model", "tp") if getattr(opts, name) is not None]
        if given:
            raise InvalidArgument("cost", opts.cost, f"a fitted model JSON without {', '.join(given)} "
                                                     "(it names its model and tensor-parallel degree)")
        cost = StepCost.from_file(opts.cost)
        return cost if opts.gpu is None else cost.on_gpu(opts.gpu)
    return StepCost.from_model(opts.model or DEFAULT_MODEL, opts.gpu or DEFAULT_GPU, dtype=opts.dtype,
                               kv_dtype=opts.kv_dtype, tp=1 if opts.tp is None else opts.tp)


def show_table(cost: StepCost) -> dict[str, Any]:
    """What ``cost show`` prints, as a JSON-ready dict (milliseconds per step)."""
    decode = []
    for rows in SHOW_ROWS:
        for ctx in SHOW_CONTEXTS:
            b = cost.breakdown(rows, rows * ctx)
            decode.append({"rows": rows, "context": ctx, "ms": b["seconds"] * 1e3,
                           "bound": "compute" if b["compute_bound"] else "memory"})
    prefill = []
    for tokens in SHOW_PREFILLS:
        b = cost.breakdown(0, 0, tokens, tokens * (tokens + 1) // 2)
        prefill.append({"tokens": tokens, "ms": b["seconds"] * 1e3,
                        "bound": "compute" if b["compute_bound"] else "memory"})
    bound_rows = {}
    for ctx in SHOW_CONTEXTS:
        r = cost.decode_compute_bound_rows(ctx)
        bound_rows[str(ctx)] = None if r == float("inf") else int(r)
    return {"model": cost.model, "gpu": cost.gpu, "tp": cost.tp, "parameters": cost.parameters(),
            "decode": decode, "prefill": prefill, "compute_bound_from_rows": bound_rows}


def run_cost_show(opts: CostShowOptions) -> int:
    """``lengthsched cost show``: modelled step times of one model on one GPU (exit code 0)."""
    cost = _load_show_model(opts)
    data = show_table(cost)
    if opts.json:
        print(json.dumps(data, indent=1))
        return 0
    p = cost.parameters()
    print(f"{cost.model} on {cost.gpu} (tp {cost.tp}): overhead {p['overhead_seconds'] * 1e3:.3f} ms, "
          f"bandwidth efficiency {p['bandwidth_efficiency']:.3f}, compute efficiency {p['compute_efficiency']:.3f}")
    print("decode step, ms (rows x context per row; * = compute bound)")
    print(f"{'rows':>6}" + "".join(f"{c:>12}" for c in SHOW_CONTEXTS))
    cells = {(d["rows"], d["context"]): d for d in data["decode"]}
    for rows in SHOW_ROWS:
        line = "".join(f"{cells[rows, c]['ms']:>11.3f}{'*' if cells[rows, c]['bound'] == 'compute' else ' '}"
                       for c in SHOW_CONTEXTS)
        print(f"{rows:>6}{line}")
    print("prefill step of one prompt, ms: " + ", ".join(
        f"{d['tokens']} tokens {d['ms']:.3f}{'*' if d['bound'] == 'compute' else ''}" for d in data["prefill"]))
    parts = [f"context {c}: {'never' if r is None else f'from {r} rows'}"
             for c, r in data["compute_bound_from_rows"].items()]
    print("decode turns compute bound: " + "; ".join(parts))
    return 0


COST_COMMANDS: dict[str, tuple[type, Callable[[Any], int]]] = {
    "fit": (CostFitOptions, run_cost_fit),
    "show": (CostShowOptions, run_cost_show),
}
