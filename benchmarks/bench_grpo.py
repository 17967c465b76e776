"""End-to-end GRPO with TRL on a CPU: full-group decoding vs the reference sampler under a memory budget.

    python benchmarks/bench_grpo.py                 # the recorded run (about a minute on 2 CPU cores)
    python benchmarks/bench_grpo.py --quick         # smoke run, what the test suite executes
    python benchmarks/bench_grpo.py --steps 30 --group-size 16 --max-new-tokens 48 --dtype float64

The toy task of ``sampler.trl`` (one-digit sums ``a+b=``, reward 1 when the completion contains the
answer digit; a tiny Qwen3 built from a config, a tokenizer trained with ``tokenizers``; offline)
is trained by ``trl.GRPOTrainer`` with its groups sampled by ``sampler.trl.make_rollout_func``:
once with the ``full`` policy (all G completions decoded at once: the reference) and once per
budgeted policy under a budget whose KV part holds ``--kv-fraction`` of the full group's worst case
(G x max_new_tokens tokens), so full-group decoding does not fit it. Completions come from
per-completion random streams, so every run must produce the same completions and train the same
way: the table shows the loss per step of every run, whether completions, losses, gradient norms
and final weights are identical, and what differs: peak KV bytes (measured by the sampler), decode
steps, preemptions, sampling and training wall time, peak process memory. Each run goes in a fresh
process (so peak resident memory is its own; it is mostly torch, transformers and TRL themselves).
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import numpy as np
from common import ROOT, machine, report, table

from lengthsched.errors import InvalidArgument
from lengthsched.memory import parse_bytes
from lengthsched.runtime import kv_budget_tokens


def one_run(options: dict) -> dict:
    """One training run (in a fresh process): its summary and its final weights, flattened."""
    import torch

    from lengthsched import ConstantLengthPredictor
    from sampler.trl import run_toy_grpo

    predicted = options.pop("predicted", 0)
    if predicted:
        options["predictor"] = ConstantLengthPredictor(predicted)
    run = run_toy_grpo(**options)
    out = run.summary()
    out["weights"] = torch.cat([p.detach().reshape(-1).double() for p in run.model.parameters()]).numpy()
    out["completion_lengths"] = [[len(c) for c in step] for step in run.completions]
    return out


def run_isolated(options: dict, isolate: bool) -> dict:
    if not isolate:
        return one_run(dict(options))
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(one_run, dict(options)).result()


def budget_for(args: argparse.Namespace) -> tuple[int, int, object]:
    """(budget bytes, KV tokens beyond the prompt it leaves next to the weights and a batch of G, the
    toy model's memory model)."""
    import torch

    from sampler.core import model_memory
    from sampler.trl import toy_budget_bytes, toy_model, toy_tokenizer

    tokenizer = toy_tokenizer()
    model = toy_model(tokenizer, dtype=getattr(torch, args.dtype), hidden_size=args.hidden_size, layers=args.layers)
    prompt = len(tokenizer("1+2=")["input_ids"])
    memory = model_memory(model)
    if args.budget is not None:
        budget = parse_bytes(args.budget)
    else:
        tokens = int(args.kv_fraction * args.group_size * args.max_new_tokens)
        if tokens < args.max_new_tokens:
            raise InvalidArgument("kv_fraction", args.kv_fraction,
                                  f"at least 1/G = {1 / args.group_size:.3f}: room for one whole sequence")
        budget = toy_budget_bytes(model, kv_tokens=tokens, prompt_tokens=prompt, group_size=args.group_size)
    return budget, kv_budget_tokens(memory, budget, prompt_tokens=prompt, group_size=args.group_size), memory


def label(run: dict) -> str:
    return run["policy"] + (f" (predicted {run['predicted']})" if run.get("predicted") else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, default=12, help="optimizer steps per run")
    ap.add_argument("--group-size", type=int, default=8, help="G, completions per prompt")
    ap.add_argument("--prompts-per-step", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--budget", default=None, help="budget bytes of the budgeted runs (weights + activations + "
                    "KV), e.g. 700KiB; default: from --kv-fraction")
    ap.add_argument("--kv-fraction", type=float, default=0.25,
                    help="KV part of the default budget, as a fraction of G x max-new-tokens tokens")
    ap.add_argument("--policies", default="micro,length_aware,length_aware:8",
                    help="budgeted sampler policies, comma-separated; policy:N plans with a constant predicted "
                    "length of N tokens")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--hidden-size", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run")
    ap.add_argument("--in-process", action="store_true", help="run everything in this process (peak memory "
                    "then mixes the runs)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "grpo.json"))
    args = ap.parse_args()
    if args.quick:
        args.steps, args.group_size, args.max_new_tokens, args.policies = 2, 4, 8, "length_aware"
        args.kv_fraction = 0.5
    import torch
    import trl

    try:
        budget, kv_tokens, memory = budget_for(args)
    except InvalidArgument as exc:
        ap.error(str(exc))
    common = {"steps": args.steps, "group_size": args.group_size, "prompts_per_step": args.prompts_per_step,
              "max_new_tokens": args.max_new_tokens, "dtype": args.dtype, "seed": args.seed,
              "hidden_size": args.hidden_size, "layers": args.layers, "threads": args.threads}
    plans = [{"policy": "full"}]
    for item in args.policies.split(","):
        name, _, predicted = item.partition(":")
        plans.append({"policy": name, "budget_bytes": budget, "predicted": int(predicted or 0)})
    runs = []
    for plan in plans:
        try:
            run = run_isolated({**common, **plan}, not args.in_process)
            runs.append({**run, "predicted": plan.get("predicted", 0)})
        except InvalidArgument as exc:
            ap.error(str(exc))
    full = runs[0]
    for run in runs:
        run["identical_completions"] = run["completions"] == full["completions"]
        run["losses_equal"] = run["losses"] == full["losses"]
        run["grad_norms_equal"] = run["grad_norms"] == full["grad_norms"]
        run["max_weight_difference"] = float(np.max(np.abs(run["weights"] - full["weights"])))
    names = [label(r) for r in runs]
    step_rows = []
    for i in range(args.steps):
        same = all(r["completions"][i] == full["completions"][i] for r in runs)
        step_rows.append([i + 1, *[f"{r['losses'][i]:.6f}" for r in runs], round(full["rewards"][i], 3),
                          f"{full['grad_norms'][i]:.6f}", "yes" if same else "NO"])
    texts = [table(f"Loss per step (GRPO, G = {args.group_size}, {args.prompts_per_step} prompts per step, "
                   f"max {args.max_new_tokens} new tokens, {args.dtype})",
                   ["step", *[f"loss: {n}" for n in names], "reward", "grad norm (full)", "same completions"],
                   step_rows)]
    for run in runs:
        del run["weights"], run["completions"]
    rows = []
    for run, name in zip(runs, names):
        rows.append([name, "-" if run["budget_bytes"] is None else f"{run['budget_bytes']} ({kv_tokens} KV tokens)",
                     run["peak_kv_bytes"], round(run["peak_kv_bytes"] / full["peak_kv_bytes"], 3), run["decode_steps"],
                     run["preemptions"], round(run["sampling_seconds"], 2), round(run["wall_seconds"], 2),
                     "-" if run["peak_rss_bytes"] is None else round(run["peak_rss_bytes"] / 2**20, 1),
                     "yes" if run["identical_completions"] else "NO",
                     "yes" if run["losses_equal"] and run["grad_norms_equal"] else "NO",
                     f"{run['max_weight_difference']:.1e}"])
    texts.append(table("Runs: the same training at a different cost",
                       ["run", "budget bytes", "peak KV bytes", "peak KV / full", "decode steps", "preemptions",
                        "sampling s", "train wall s", "peak RSS MiB", "same completions", "same losses, grads",
                        "max weight diff"], rows))
    full_total = memory.total_bytes(full["peak_kv_bytes"], args.group_size)
    texts.append(f"full group at its peak: weights + activations + KV = {full_total} bytes, over the budget of "
                 f"{budget} bytes: {full_total > budget}\n")
    results = {"machine": machine(), "command": " ".join(["python", *sys.argv]),
               "versions": {"torch": torch.__version__, "trl": trl.__version__},
               "config": {**common, "policies": args.policies, "kv_fraction": args.kv_fraction},
               "budget": {"budget_bytes": budget, "kv_tokens": kv_tokens, "full_group_total_bytes": full_total},
               "steps": [dict(zip(["step", *names, "reward", "grad_norm_full", "same_completions"], r))
                         for r in step_rows],
               "runs": runs}
    report(results, texts, args.out, f"torch {torch.__version__}, trl {trl.__version__}, CPU, "
           f"{args.threads} torch thread(s) per run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
