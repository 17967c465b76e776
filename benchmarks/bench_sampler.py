"""Reference-sampler benchmarks: policies on a real model (steps, peak KV, tokens/s), shared vs
copied prompt KV, and the sampler against ``model.generate`` on the same batch.

    python benchmarks/bench_sampler.py                 # CPU: the tiny Qwen3-shaped model (minutes)
    python benchmarks/bench_sampler.py --quick         # smoke run, what the test suite executes
    python benchmarks/bench_sampler.py --model Qwen/Qwen3-1.7B --dtype bfloat16 --device cuda \
        --max-new-tokens 4096 --scale 1 --groups 4     # a GPU machine with the model
    python benchmarks/bench_sampler.py --model random-qwen3-1.7b --dtype bfloat16 --device cuda \
        --groups 1 --scale 16                          # a GPU machine without weights (benchmarks/gpu_sampler.sh)

``--model``: a model of ``lengthsched sample``: tiny-qwen3 (the default), random-qwen3-0.6b or
random-qwen3-1.7b (the real shapes of Qwen3-0.6B / 1.7B with random weights, built from a config:
gibberish text, real compute and memory), or a Hugging Face name or directory.

Workload: real CASTILLO groups (Qwen2.5-7B-Instruct completion lengths, bundled), G = 32, replayed
with forced lengths (each completion ends exactly at its recorded length, divided by ``--scale`` so
a CPU run stays short), so that every policy decodes the same completions and the steps match the
simulator. Length-aware policies plan with the true lengths (an oracle predictor). Markdown tables
go to stdout, raw numbers to ``--out`` (default benchmarks/results/sampler.json; rewritten after every
section, ``"complete": false`` until the last one is done); the device (CPU model or GPU card) is
recorded beside every number.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from common import ROOT, device_name, machine, report, run_sections, table, write_json

from sampler.options import TINY_MODEL
from simulate import run_group
from simulate.workloads import castillo_groups


def workload(args: argparse.Namespace) -> list:
    groups = castillo_groups(args.group_size, limit=args.groups, seed=11,
                             max_new_tokens=args.scale * args.max_new_tokens)
    for g in groups:
        g.lengths[:] = np.maximum(1, -(-g.lengths // args.scale))
    return groups


def policies(args: argparse.Namespace, model) -> tuple[str, list]:
    from sampler import InfiniteSampler

    rows, raw = [], []
    groups = workload(args)
    plans = [("full", {}), ("micro", {"slots": args.slots}), ("fixed_slot", {"slots": args.slots}),
             ("length_aware", {"slots": args.slots})]
    base_peak, per = None, {}
    for name, kw in plans:
        steps, peaks, model_peaks, walls, tokens, cuda = [], [], [], [], [], []
        sim_steps = []
        for gi, g in enumerate(groups):
            prompt = list(np.random.default_rng(gi).integers(0, 200, size=int(min(g.prompt_len, args.max_prompt))))
            lengths = [int(x) for x in g.lengths]
            res = InfiniteSampler(model, policy=name, **kw).sample_group(
                prompt, len(lengths), max_new_tokens=args.max_new_tokens, seed=gi, force_lengths=lengths,
                predicted_lengths=lengths, stop_token_ids=[args.stop], record_steps=False)
            sim = run_group(lengths, name, max_new_tokens=args.max_new_tokens, prompt_len=len(prompt),
                            predicted=lengths, **kw)
            steps.append(res.steps)
            sim_steps.append(sim.steps)
            peaks.append(res.peak_kv_bytes)
            model_peaks.append(res.peak_model_kv_bytes)
            walls.append(res.wall_seconds)
            tokens.append(res.tokens)
            cuda.append(res.cuda_peak_bytes or 0)
        per[name] = dict(steps=float(np.mean(steps)), peak=float(np.mean(peaks)), tps=sum(tokens) / sum(walls))
        if base_peak is None:
            base_peak = per[name]["peak"]
        rows.append([name, kw.get("slots", args.group_size), round(float(np.mean(steps)), 1),
                     "yes" if steps == sim_steps else "NO", round(float(np.mean(peaks)) / 2**20, 3),
                     round(per[name]["peak"] / base_peak, 3), "yes" if peaks == model_peaks else "NO",
                     round(per[name]["tps"], 1), round(float(np.mean(cuda)) / 2**20, 1) if any(cuda) else "-"])
        raw.append({"policy": name, "steps": steps, "sim_steps": sim_steps, "peak_kv_bytes": peaks,
                    "model_peak_kv_bytes": model_peaks, "wall_seconds": walls, "tokens": tokens, "cuda_peak": cuda})
    ratios = {
        "micro_peak_over_full": per["micro"]["peak"] / per["full"]["peak"],
        "length_aware_steps_over_micro": per["length_aware"]["steps"] / per["micro"]["steps"],
        "length_aware_tps_over_micro": per["length_aware"]["tps"] / per["micro"]["tps"],
    }
    text = table(f"Policies on {device_name(model)}: {len(groups)} CASTILLO groups, G = {args.group_size}, "
                 f"lengths / {args.scale}, L_max {args.max_new_tokens}, shared prompt KV; mean per group",
                 ["policy", "slots", "steps", "= simulator", "peak KV MiB", "peak / full", "= memory model",
                  "tokens / s", "CUDA peak MiB"], rows)
    text += (f"\nmicro peak KV / full: {ratios['micro_peak_over_full']:.3f}; length-aware / micro: steps "
             f"{ratios['length_aware_steps_over_micro']:.3f}, tokens/s {ratios['length_aware_tps_over_micro']:.3f}\n")
    return text, {"rows": raw, "ratios": ratios}


def shared_vs_copied(args: argparse.Namespace, model) -> tuple[str, list]:
    from sampler import InfiniteSampler

    rows = []
    prompt = list(np.random.default_rng(0).integers(0, 200, size=args.long_prompt))
    n = args.group_size
    for share in (True, False):
        walls = []
        for rep in range(args.reps):
            res = InfiniteSampler(model, policy="full_freed", share_prompt_kv=share).sample_group(
                prompt, n, max_new_tokens=args.short_new, seed=rep, force_lengths=[args.short_new] * n,
                stop_token_ids=[args.stop], record_steps=False)
            walls.append(res.wall_seconds)
        rows.append(["shared" if share else "copied", n, args.long_prompt, round(res.peak_kv_bytes / 2**20, 2),
                     round(statistics.median(walls) * 1000 / res.steps, 2), res.completions[0][:4]])
    same = rows[0][-1] == rows[1][-1]
    rows = [r[:-1] for r in rows]
    return table(f"Prompt KV held once vs copied per sequence ({device_name(model)}; {n} sequences, a "
                 f"{args.long_prompt}-token prompt, {args.short_new} new tokens each; median of {args.reps})",
                 ["prompt KV", "sequences", "prompt tokens", "peak KV MiB", "ms / step"], rows) + \
        f"\nsame first tokens in both modes: {same}\n", rows


def against_generate(args: argparse.Namespace, model) -> tuple[str, list]:
    import torch

    from sampler import InfiniteSampler

    prompt = list(np.random.default_rng(1).integers(0, 200, size=64))
    n, new = args.group_size, args.short_new
    dev = next(model.parameters()).device
    ids = torch.tensor([prompt] * n, device=dev)
    with torch.inference_mode():  # warm up (first-call costs of generate)
        model.generate(ids[:1, :8], attention_mask=torch.ones_like(ids[:1, :8]), do_sample=True, max_new_tokens=2,
                       min_new_tokens=2, pad_token_id=args.stop)
    gen_times, ours = [], []
    for rep in range(args.reps):
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=new,
                           min_new_tokens=new, pad_token_id=args.stop)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        gen_times.append(time.perf_counter() - start)
        res = InfiniteSampler(model, policy="full_freed").sample_group(
            prompt, n, max_new_tokens=new, seed=rep, force_lengths=[new] * n, stop_token_ids=[args.stop],
            record_steps=False)
        ours.append(res.wall_seconds)
    g, o = statistics.median(gen_times), statistics.median(ours)
    rows = [["model.generate (dynamic cache, sampling)", n, new, round(n * new / g, 1), 1.0],
            ["InfiniteSampler full_freed (shared prompt)", n, new, round(n * new / o, 1), round(g / o, 3)]]
    return table(f"Tokens per second on the same batch ({device_name(model)}; {n} sequences x {new} tokens, a "
                 f"64-token prompt; median of {args.reps})",
                 ["decoder", "sequences", "new tokens", "tokens / s", "speed vs generate"], rows), rows


def learner(args: argparse.Namespace, model) -> tuple[str, list]:
    """Prefix Grouper: one packed forward + backward of a group against G rows."""
    import torch

    from lengthsched import learner_tokens
    from sampler.prefix_grouper import grouped_logprobs, naive_logprobs

    rng = np.random.default_rng(3)
    prompt = list(rng.integers(0, 200, size=args.learner_prompt))
    comps = [list(rng.integers(0, 200, size=args.learner_new)) for _ in range(args.learner_group)]
    rows, outs = [], {}
    cuda = next(model.parameters()).device.type == "cuda"
    for name, fn in (("naive (G rows)", naive_logprobs), ("grouped (one packed sequence)", grouped_logprobs)):
        times = []
        model.zero_grad()  # warm up (first forward and backward of each kind)
        torch.stack([x.sum() for x in fn(model, prompt[:8], [c[:2] for c in comps[:2]])]).sum().backward()
        for _ in range(args.reps):
            model.zero_grad()
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            lp = fn(model, prompt, comps)
            torch.stack([x.sum() for x in lp]).sum().backward()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        outs[name] = torch.cat([x.detach() for x in lp])
        tokens = learner_tokens(len(prompt), [len(c) for c in comps], grouped=name.startswith("grouped"))
        rows.append([name, args.learner_group, len(prompt), args.learner_new, tokens,
                     round(statistics.median(times) * 1000, 1)])
    diff = float((outs["naive (G rows)"] - outs["grouped (one packed sequence)"]).abs().max())
    rows[1].append(round(rows[0][-1] / rows[1][-1], 3))
    rows[0].append(1.0)
    model.zero_grad()
    return table(f"Learner forward + backward of one group ({device_name(model)}; median of {args.reps}; "
                 f"max |log-prob difference| {diff:.1e})",
                 ["forward", "G", "prompt tokens", "tokens per completion", "tokens processed", "ms",
                  "speed vs naive"], rows), rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--model", default=TINY_MODEL, help="a model of `lengthsched sample`: tiny-qwen3, "
                    "random-qwen3-0.6b, random-qwen3-1.7b (random weights, real shapes) or a HF name / directory")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--device", default=None)
    ap.add_argument("--group-size", type=int, default=32)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--groups", type=int, default=3)
    ap.add_argument("--scale", type=int, default=4, help="divide CASTILLO lengths by this")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--max-prompt", type=int, default=256, help="prompt tokens at most")
    ap.add_argument("--long-prompt", type=int, default=2048)
    ap.add_argument("--short-new", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--learner-group", type=int, default=16)
    ap.add_argument("--learner-prompt", type=int, default=512)
    ap.add_argument("--learner-new", type=int, default=32)
    ap.add_argument("--sections", default="policies,prompt_kv,generate,learner")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sampler.json"))
    args = ap.parse_args()
    if args.quick:
        args.group_size, args.slots, args.groups, args.scale, args.max_new_tokens = 8, 2, 1, 16, 64
        args.long_prompt, args.short_new, args.reps, args.max_prompt = 128, 4, 1, 64
        args.learner_group, args.learner_prompt, args.learner_new = 4, 32, 8
    from sampler.cli import load_model

    model, tokenizer = load_model(args.model, args.dtype, args.device)
    args.stop = getattr(tokenizer, "eos_token_id", None) or 0
    results = {"machine": machine(), "command": " ".join(["python", *sys.argv]), "device": device_name(model),
               "model": args.model, "dtype": args.dtype, "complete": False}
    sections = {"policies": policies, "prompt_kv": shared_vs_copied, "generate": against_generate, "learner": learner}
    texts, raw = run_sections(ap, args, sections, model,
                              checkpoint=lambda partial: write_json(args.out, {**results, **partial}))
    results.update(raw, complete=True)
    import torch

    report(results, texts, args.out, f"torch {torch.__version__}, model {args.model} {args.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
