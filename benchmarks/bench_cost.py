"""Step-cost model (lengthsched.cost) against measured step times (results go to docs/cost.md).

Run from the repository root:

    python benchmarks/bench_cost.py                 # section vidur: every profile and degree (data, seconds)
    python benchmarks/bench_cost.py --quick         # one profile, degrees 1 and 2 (what the test suite runs)
    python benchmarks/bench_cost.py --sections cpu  # section cpu: the reference sampler on CPU (about 2 minutes)
    python benchmarks/bench_cost.py --sections cpu --quick   # a smoke run of it (seconds; the test suite runs it)
    python benchmarks/bench_cost.py --sections cards  # section cards: H100 fits on H200 steps and back (seconds)

``--out`` defaults to benchmarks/results/cost_<sections>.json (cost_vidur.json, cost_cpu.json,
cost_cards.json).

Section ``vidur``: Vidur's profiles (microsoft/vidur, MIT; shipped in benchmarks/data/vidur, see
its README) give the measured GPU time of each non-attention operator of ONE decoder layer on one
tensor-parallel worker, at num_tokens = 1 .. 4096 (32768 for Llama-3-8B) tokens in the batch, on
H100 and A100. For each profile and degree the script builds the matching roofline with
:class:`lengthsched.cost.StepCost` (one layer's weights per worker read once, plus activations;
2 x parameters FLOPs per token; the GPU preset's datasheet numbers) and compares it with the
measured per-layer time (sum of the operators' medians) at every num_tokens:

- ``linear``: the four GEMMs (attn_pre_proj = QKV, attn_post_proj = O, mlp_up_proj, mlp_down_proj)
  against the model with the GEMMs' input and output activations;
- ``layer``: also the elementwise operators (input_layernorm, attn_rope, post_attention_layernorm,
  mlp_act, add; phi-2 has no post_attention_layernorm) against the model with their activation
  traffic added to the bytes. ``emb`` is
  left out (once per model, not per layer); attention is not in these profiles.

Errors are |modelled / measured - 1|. "unfitted" = the GPU preset's priors (bandwidth efficiency
0.75, compute efficiency 0.65) with zero overhead (these are GPU kernel times, not engine steps);
"fitted" = :meth:`StepCost.fit` on every other num_tokens point (even positions in increasing
order), errors on the other half.

Section ``cpu``: the reference sampler (sampler.core.InfiniteSampler) generates groups on CPU with
Qwen3-shaped models built from a config (random weights, byte vocabulary, float32, one PyTorch
thread) and records every step's decode rows, KV tokens read, prefilled tokens and measured wall
seconds (SampleResult.step_samples). The runs (CPU_RUNS) spread group size, slots, prompt length,
shared / copied prompt KV and policy (fixed_slot, the padded full group, vllm under a tight KV budget
so that preemptions produce recomputation steps), all with forced lengths (trace replay: the steps
are deterministic), and each run is repeated (``--repeats``) with the same steps, keeping the
fastest time of each step. Steps that ran no forward (decode_rows = prefill_tokens = 0: every live
row was newly admitted and drew its first token from the prompt's logits) are left out of the fits
and errors: the model prices them at 0 by definition and their time is the sampler's Python
bookkeeping; their count and time are reported. The prior is StepCost.from_gpu(model_memory(model),
"h100", config=..., bandwidth=CPU_BANDWIDTH, peak_flops=CPU_PEAK_FLOPS,
overhead_seconds=CPU_OVERHEAD_PER_LAYER x layers).replace(gpu="cpu") (``gpu`` is from_gpu's
positional preset argument, so it cannot be an override), rough CPU upper bounds (the fit caps the
efficiencies at 1). Three held-out checks, per model and pooled: ``random`` (fit_and_validate: a
seeded random half of the steps), ``by_run`` (fit on the even-numbered runs of the model, errors on
the steps of the odd-numbered ones) and ``transfer`` (the parameters fitted on another model's
even runs, errors on this model's odd runs); and the error of each run's total
(SampleResult.model_seconds against the measured forward steps' sum).

Section ``cards``: does a calibration carry from one GPU to another? The engine steps measured on
one H100 and on one H200 by ``benchmarks/gpu_cost.sh`` (shipped in benchmarks/results as
cost_gpu_<card>[_<model>][_compiled].jsonl: Qwen3-1.7B- and Qwen3-8B-shaped models, random weights,
bfloat16, CUDA graphs, eager or with each decoder layer compiled) are priced, for every pair of
cards (A fitted, B priced), by: the unfitted preset of B; A's fit (``StepCost.fit`` on every step of
A, attention priced apart) left on A's datasheet numbers; A's fit moved to B's
(:meth:`StepCost.on_gpu`); and B's own fit on a seeded half of B's steps, scored on the other half
(the best a calibration on B gives). Errors are modelled / measured - 1 over every step of B
(the last row: B's held-out half). A second table divides the seconds of each step shape measured
on both cards. Data, not timing.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import sys
from pathlib import Path

import numpy as np
from common import ROOT, machine, report, run_sections, table

from lengthsched.cost import GPU_PRESETS, StepCost, error_stats, read_samples

DATA = ROOT / "benchmarks" / "data" / "vidur"
LINEAR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
PROFILES = (  # (file, GPU preset, model)
    ("h100_meta-llama_Llama-2-7b-hf_mlp.csv.gz", "h100", "Llama-2-7b"),
    ("h100_microsoft_phi-2_mlp.csv.gz", "h100", "phi-2"),
    ("a100_meta-llama_Llama-2-7b-hf_mlp.csv.gz", "a100", "Llama-2-7b"),
    ("a100_meta-llama_Meta-Llama-3-8B_mlp.csv.gz", "a100", "Llama-3-8B"),
)
BF16 = 2  # bytes per element: the profiles are bf16/fp16 runs


def read_profile(path: Path) -> tuple[dict, dict[int, list[tuple[int, float, float]]]]:
    """(shapes, {tp: [(num_tokens, linear seconds, layer seconds), ...] sorted by num_tokens}).

    Per-layer seconds are sums of the operators' median times; a (num_tokens, tp) pair measured
    twice gets the median of its sums."""
    with gzip.open(path, "rt", newline="") as handle:
        rows = list(csv.DictReader(handle))
    first = rows[0]
    shapes = {k: int(first[k]) for k in ("n_head", "n_kv_head", "n_embd", "n_expanded_embd")}
    shapes["gated"] = first["use_gated_mlp"].strip().lower() == "true"
    shapes["elementwise"] = [op for op in ELEMENTWISE_OPS if f"time_stats.{op}.median" in first]  # phi-2: one norm
    sums: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for r in rows:
        linear = sum(float(r[f"time_stats.{op}.median"]) for op in LINEAR_OPS) * 1e-3
        other = sum(float(r[f"time_stats.{op}.median"]) for op in shapes["elementwise"]) * 1e-3
        key = (int(r["num_tensor_parallel_workers"]), int(r["num_tokens"]))
        sums.setdefault(key, []).append((linear, linear + other))
    by_tp: dict[int, list[tuple[int, float, float]]] = {}
    for (tp, tokens), values in sorted(sums.items()):
        v = np.asarray(values)
        by_tp.setdefault(tp, []).append((tokens, float(np.median(v[:, 0])), float(np.median(v[:, 1]))))
    return shapes, by_tp


def layer_cost(shapes: dict, tp: int, gpu: str, name: str, *, elementwise: bool) -> StepCost:
    """The roofline of one decoder layer's non-attention operators on one of ``tp`` workers.

    Column-parallel QKV and up projections, row-parallel O and down projections (Megatron style,
    as Vidur shards them): each worker holds 1 / tp of every GEMM's weights. Activations per token:
    each GEMM reads its input and writes its output (hidden-size ones are full, the others
    sharded); with ``elementwise``, the two RMSNorms (read + write hidden), rotary embedding (read +
    write the q and k shards), the MLP activation (read the up output, write the intermediate) and
    the residual add (read two, write one hidden vector) are added, for the operators the profile
    has (phi-2 has no post-attention norm). No KV, no attention, no LM head.
    """
    h, heads, kv_heads, inter = (shapes[k] for k in ("n_embd", "n_head", "n_kv_head", "n_expanded_embd"))
    head_dim = h // heads
    qkv, q = (heads + 2 * kv_heads) * head_dim, heads * head_dim
    up = 2 * inter if shapes["gated"] else inter
    params = (h * qkv + q * h + h * up + inter * h) / tp
    act = (h + qkv / tp) + (q / tp + h) + (h + up / tp) + (inter / tp + h)
    if elementwise:  # elements read + written per token by each elementwise operator the profile has
        moved = {"input_layernorm": 2 * h, "attn_rope": 2 * (heads + kv_heads) * head_dim / tp,
                 "post_attention_layernorm": 2 * h, "mlp_act": (up + inter) / tp, "add": 3 * h}
        act += sum(moved[op] for op in shapes["elementwise"])
    spec = GPU_PRESETS[gpu]
    return StepCost(model=f"{name} layer, 1/{tp} shard", gpu=gpu, bandwidth=spec.bandwidth, peak_flops=spec.peak_flops,
                    link_bandwidth=spec.link_bandwidth, weights_bytes=round(BF16 * params),
                    active_parameters=round(params), lm_head_parameters=0, kv_bytes_per_token=0,
                    attention_flops_per_kv_token=0, activation_bytes_per_token=round(BF16 * act), num_layers=1,
                    hidden_size=h, dtype_bytes=BF16, tp=1, overhead_seconds=0.0)


def compare(prior: StepCost, tokens: np.ndarray, seconds: np.ndarray) -> tuple[dict, np.ndarray, np.ndarray]:
    """Unfitted errors on every point; fitted on even positions, errors on odd positions.
    Returns the summary and the two arrays of signed errors."""
    samples = {"decode_rows": tokens, "kv_tokens_read": np.zeros_like(tokens), "prefill_tokens": np.zeros_like(tokens),
               "seconds": seconds}
    unfitted = prior.errors(samples)
    train = {k: v[0::2] for k, v in samples.items()}
    held = {k: v[1::2] for k, v in samples.items()}
    fitted = prior.fit(train)
    held_err = fitted.errors(held)
    worst = int(np.argmax(np.abs(unfitted)))
    bound = prior.decode_compute_bound_rows(0)
    return {"points": int(tokens.size), "unfitted": error_stats(unfitted),
            "unfitted_worst_at_tokens": int(tokens[worst]),
            "unfitted_signed_at_worst": float(unfitted[worst]),
            "fitted_held_out": error_stats(held_err), "fitted_train": error_stats(fitted.errors(train)),
            "fitted_parameters": fitted.parameters(), "prior_compute_bound_from_tokens": float(bound),
            "fitted_compute_bound_from_tokens": float(fitted.decode_compute_bound_rows(0)),
            "tokens": [int(t) for t in tokens], "unfitted_errors": [round(float(e), 4) for e in unfitted],
            "fitted_held_out_errors": [round(float(e), 4) for e in held_err]}, unfitted, held_err


def section_vidur(args) -> tuple[str, dict]:
    profiles = PROFILES[:1] if args.quick else PROFILES
    rows, raw, pooled = [], [], {"linear": ([], []), "layer": ([], [])}
    for file, gpu, name in profiles:
        shapes, by_tp = read_profile(Path(args.data) / file)
        for tp, points in sorted(by_tp.items()):
            if args.quick and tp > 2:
                continue
            tokens = np.array([p[0] for p in points], dtype=np.float64)
            for variant, column in (("linear", 1), ("layer", 2)):
                seconds = np.array([p[column] for p in points])
                prior = layer_cost(shapes, tp, gpu, name, elementwise=variant == "layer")
                summary, unfitted, held = compare(prior, tokens, seconds)
                result = {"file": file, "gpu": gpu, "model": name, "tp": tp, "variant": variant, **summary}
                raw.append(result)
                pooled[variant][0].extend(unfitted.tolist())
                pooled[variant][1].extend(held.tolist())
                u, f, p = result["unfitted"], result["fitted_held_out"], result["fitted_parameters"]
                rows.append([gpu, name, tp, variant, result["points"], 100 * u["median"], 100 * u["max"],
                             result["unfitted_worst_at_tokens"], 100 * f["median"], 100 * f["max"],
                             p["overhead_seconds"] * 1e6, p["bandwidth_efficiency"], p["compute_efficiency"]])
    summary = {v: {"unfitted": error_stats(pooled[v][0]), "fitted_held_out": error_stats(pooled[v][1])} for v in pooled}
    text = table("Vidur operator profiles: modelled vs measured per-layer time; |relative error| in % "
                 "(unfitted = preset priors, zero overhead; fitted on alternate num_tokens, errors on the others)",
                 ["GPU", "model", "tp", "ops", "points", "unfitted median %", "unfitted max %", "worst at tokens",
                  "fitted median %", "fitted max %", "fitted overhead us", "fitted bw eff", "fitted compute eff"], rows)
    text += "\n" + table("All profiles and degrees pooled: |relative error| in %",
                         ["ops", "points", "unfitted median %", "unfitted p90 %", "unfitted max %",
                          "fitted held-out median %", "fitted held-out p90 %", "fitted held-out max %"],
                         [[v, s["unfitted"]["n"], 100 * s["unfitted"]["median"], 100 * s["unfitted"]["p90"],
                           100 * s["unfitted"]["max"], 100 * s["fitted_held_out"]["median"],
                           100 * s["fitted_held_out"]["p90"], 100 * s["fitted_held_out"]["max"]]
                          for v, s in summary.items()])
    return text, {"rows": raw, "summary": summary}


# --------------------------------------------------------------------------- section cpu
#: Models of section cpu: (name, overrides of qwen3_config("tiny-qwen3") (byte vocabulary of 257, tied
#: embeddings, random weights), factor on the runs' generation lengths so that the larger models run fewer steps).
CPU_MODELS = (
    ("tiny-qwen3", {}, 1.0),  # 4 layers, hidden 256, MLP 768, 8 query / 4 KV heads of 32: 12.9 MB in float32
    ("qwen3-h512-l8", dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                           num_key_value_heads=4, head_dim=64), 0.5),  # 101 MB
    ("qwen3-h1024-l8", dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=8, num_attention_heads=16,
                            num_key_value_heads=8, head_dim=64), 0.25),  # 404 MB
)
#: Runs of section cpu, numbered from 0; the even ones train the by-run fit, the odd ones test it.
#: G: completions, P: prompt tokens, L: max_new_tokens (times the model's factor), forced lengths spread
#: over [0.15 L, L] (one completion at L); copied: prompt KV copied into every sequence (share_prompt_kv=False:
#: each row reads its own prompt copy, so KV reads grow with rows); budget: KV tokens beyond the shared
#: prompt, as a multiple of L (vllm: a tight budget, so that completions are preempted and recompute their KV).
CPU_RUNS = (
    dict(policy="fixed_slot", G=8, slots=1, P=16, L=64),      # one-row steps
    dict(policy="fixed_slot", G=8, slots=2, P=32, L=64),
    dict(policy="fixed_slot", G=16, slots=8, P=64, L=64),
    dict(policy="fixed_slot", G=16, slots=4, P=128, L=64),
    dict(policy="full", G=16, P=32, L=64),                    # the padded group: all G rows every step
    dict(policy="full", G=32, P=64, L=48),
    dict(policy="fixed_slot", G=16, slots=16, P=512, L=48, copied=True),
    dict(policy="fixed_slot", G=24, slots=8, P=256, L=48, copied=True),
    dict(policy="vllm", G=16, P=40, L=64, budget=2.5),        # preemptions: recomputation steps (a prompt
    dict(policy="vllm", G=24, P=24, L=64, budget=3.0),        # tail of 8 tokens: sequences cross a block early)
    dict(policy="fixed_slot", G=32, slots=32, P=16, L=32),    # the largest batch
    dict(policy="fixed_slot", G=48, slots=24, P=64, L=32),
)
#: --quick: the first two models, these runs (shorter), one repeat.
CPU_QUICK_RUNS = (
    dict(policy="fixed_slot", G=4, slots=1, P=16, L=16),
    dict(policy="fixed_slot", G=8, slots=4, P=64, L=16),
    dict(policy="vllm", G=8, P=24, L=24, budget=2.0),
    dict(policy="full", G=8, P=32, L=16, copied=True),
)
#: Rough CPU priors: generous upper bounds for one core of an x86 server CPU (the fit caps the efficiencies
#: at 1, so a prior below what a step reaches would pin them). Bandwidth: one core streams 10-30 GB/s from
#: DRAM and more from L2/L3, 100 GB/s bounds both; FLOP/s: AVX-512, 2 FMA ports x 16 fp32 lanes x 2 FLOPs x
#: 3.5 GHz = 224 GFLOP/s; overhead: eager PyTorch dispatches some 25 operators per decoder layer at tens of
#: microseconds each, plus the sampler's Python: about 0.5 ms per layer. The default efficiencies (0.75, 0.65)
#: of from_gpu are kept as the priors' efficiencies.
CPU_BANDWIDTH = 100e9
CPU_PEAK_FLOPS = 224e9
CPU_OVERHEAD_PER_LAYER = 0.5e-3
STEP_KINDS = ("with recomputation", "decode, shared prompt", "decode, copied prompt")
STOP = 256  # the byte tokenizer's EOS (sampler.cli.ByteTokenizer), the configs' eos_token_id


def _cpu_lengths(run: dict, index: int, L: int) -> list[int]:
    rng = np.random.default_rng(index)
    lengths = np.maximum(1, np.round(L * rng.uniform(0.15, 1.0, run["G"]))).astype(int)
    lengths[rng.integers(run["G"])] = L
    return [int(x) for x in lengths]


def _cpu_run(model, memory_of, run: dict, index: int, scale: float, repeats: int) -> tuple[dict, list, object]:
    """One run, ``repeats`` times with the same forced lengths and seed (the same steps); returns its
    description, its steps as [decode_rows, kv_tokens_read, prefill_tokens, fastest seconds] and the
    last SampleResult."""
    from lengthsched.runtime import decode_batch, kv_budget_tokens
    from sampler import InfiniteSampler

    G, P, slots = run["G"], run["P"], run.get("slots")
    L = max(8, int(round(run["L"] * scale)))
    lengths = _cpu_lengths(run, index, L)
    prompt = [int(t) for t in np.random.default_rng(1000 + index).integers(0, 256, size=P)]
    budget_bytes = budget_tokens = None
    if run.get("budget"):
        mem = memory_of(16 if run["policy"] == "vllm" else 1)
        budget_tokens = max(int(round(run["budget"] * L)), L + P % 16 + 16)
        budget_bytes = (mem.weights_bytes + mem.prompt_kv_bytes(P) + mem.activation_bytes(decode_batch(G, slots))
                        + budget_tokens * mem.kv_bytes_per_token)
        budget_tokens = kv_budget_tokens(mem, budget_bytes, prompt_tokens=P, group_size=G, slots=slots)
    sampler = InfiniteSampler(model, policy=run["policy"], slots=slots, budget_bytes=budget_bytes,
                              share_prompt_kv=not run.get("copied", False))
    steps, res = None, None
    for _ in range(repeats):
        res = sampler.sample_group(prompt, G, max_new_tokens=L, seed=index, force_lengths=lengths,
                                   stop_token_ids=[STOP])
        now = [[r.decode_rows, r.kv_tokens_read, r.prefill_tokens, r.seconds] for r in res.records]
        if steps is None:
            steps = now
        else:
            if [s[:3] for s in steps] != [s[:3] for s in now]:
                raise RuntimeError(f"run {index}: a repeat took other steps (forced lengths should fix them)")
            steps = [s[:3] + [min(s[3], n[3])] for s, n in zip(steps, now)]
    info = {"policy": run["policy"], "group_size": G, "slots": slots, "prompt_tokens": P, "max_new_tokens": L,
            "prompt_kv": "copied" if run.get("copied") else "shared", "budget_tokens": budget_tokens,
            "lengths": lengths, "steps": res.steps, "preemptions": res.preemptions,
            "recomputed_tokens": res.recomputed_tokens,
            "recorded_prefill_tokens": int(sum(s[2] for s in steps)),
            "decode_rows": int(sum(s[0] for s in steps))}
    return info, steps, res


def _cols(steps: list) -> dict:
    a = np.asarray(steps, dtype=np.float64).reshape(-1, 4)
    return {"decode_rows": a[:, 0], "kv_tokens_read": a[:, 1], "prefill_tokens": a[:, 2], "seconds": a[:, 3]}


def _pct(stats: dict) -> list:
    return [stats["n"]] + [100 * stats[k] if stats[k] is not None else "-" for k in ("median", "p90", "max")]


def section_cpu(args) -> tuple[str, dict]:
    import torch

    from sampler import model_memory
    from sampler.cli import qwen3_config, qwen3_from_config

    torch.set_num_threads(args.threads)
    models = CPU_MODELS[:2] if args.quick else CPU_MODELS
    plan = CPU_QUICK_RUNS if args.quick else CPU_RUNS
    repeats = 1 if args.quick else args.repeats
    per_model, all_runs = {}, []
    for name, overrides, scale in models:
        config = qwen3_config("tiny-qwen3", **overrides)
        model = qwen3_from_config(config, torch.float32, seed=0)
        layers = config.num_hidden_layers

        def memory_of(block, model=model):
            return model_memory(model, block)

        memory = memory_of(1)
        # CPU priors; from_gpu takes the GPU preset positionally, so the device name is set afterwards
        prior = StepCost.from_gpu(memory, "h100", config=config.to_dict(), bandwidth=CPU_BANDWIDTH,
                                  peak_flops=CPU_PEAK_FLOPS, overhead_seconds=CPU_OVERHEAD_PER_LAYER * layers,
                                  ).replace(gpu="cpu", model=name)
        _cpu_run(model, memory_of, dict(policy="fixed_slot", G=4, slots=4, P=16, L=8), 99, 1.0, 1)  # warm-up
        runs = []
        for index, run in enumerate(plan):
            info, steps, res = _cpu_run(model, memory_of, run, index, scale, repeats)
            forward = [s for s in steps if s[0] + s[2] > 0]
            idle = [s[3] for s in steps if s[0] + s[2] == 0]
            info.update(model=name, run=index, split="train" if index % 2 == 0 else "test",
                        forward_steps=len(forward), idle_steps=len(idle), idle_seconds=float(sum(idle)),
                        all_step_seconds=float(sum(s[3] for s in steps)),
                        forward_step_seconds=float(sum(s[3] for s in forward)),
                        prior_model_seconds=res.model_seconds(prior), step_samples=steps)
            runs.append((info, forward, res))
            print(f"[cpu] {name} run {index}: {info['steps']} steps, {info['forward_step_seconds']:.2f} s",
                  file=sys.stderr, flush=True)
        samples = _cols([s for _, f, _ in runs for s in f])
        train = _cols([s for info, f, _ in runs if info["split"] == "train" for s in f])
        test = _cols([s for info, f, _ in runs if info["split"] == "test" for s in f])
        test_kind = np.array([STEP_KINDS[0] if s[2] > 0 else STEP_KINDS[1 + (info["prompt_kv"] == "copied")]
                              for info, f, _ in runs if info["split"] == "test" for s in f])
        fitted_random, random_report = prior.fit_and_validate(samples, train_fraction=0.5, seed=0)
        n = samples["seconds"].size  # the same seeded split as fit_and_validate, for the signed errors
        held = np.random.default_rng(0).permutation(n)[int(round(0.5 * n)):]
        held_cols = {k: v[held] for k, v in samples.items()}
        random_errors = {"prior": prior.errors(held_cols), "fitted": fitted_random.errors(held_cols)}
        assert error_stats(random_errors["fitted"]) == random_report["held_out"]
        fitted_run = prior.fit(train)
        run_errors = {"prior": prior.errors(test), "fitted": fitted_run.errors(test)}
        kind_errors = {k: {w: e[test_kind == k] for w, e in run_errors.items()} for k in STEP_KINDS}
        for info, _, res in runs:
            measured = info["forward_step_seconds"]
            info["fitted_by_run_model_seconds"] = res.model_seconds(fitted_run)
            info["fitted_random_model_seconds"] = res.model_seconds(fitted_random)
            for key in ("prior", "fitted_by_run", "fitted_random"):
                info[f"{key}_total_error"] = info[f"{key}_model_seconds"] / measured - 1
        idle = [s for info, _, _ in runs for s in info["step_samples"] if s[0] + s[2] == 0]
        per_model[name] = {
            "config": {k: getattr(config, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                       "num_attention_heads", "num_key_value_heads", "head_dim",
                                                       "vocab_size")},
            "weights_bytes": memory.weights_bytes, "kv_bytes_per_token": memory.kv_bytes_per_token,
            "length_factor": scale, "prior": json.loads(prior.to_json()),
            "forward_steps": int(n), "idle_steps": len(idle),
            "idle_step_seconds_median": float(np.median([s[3] for s in idle])) if idle else None,
            "idle_share_of_step_seconds": float(sum(s[3] for s in idle)
                                                / sum(i["all_step_seconds"] for i, _, _ in runs)),
            "random": {**random_report, "prior_held_out": error_stats(random_errors["prior"])},
            "by_run": {"train_runs": [i["run"] for i, _, _ in runs if i["split"] == "train"],
                       "test_runs": [i["run"] for i, _, _ in runs if i["split"] == "test"],
                       "n_train": int(train["seconds"].size), "parameters": fitted_run.parameters(),
                       "train": error_stats(fitted_run.errors(train)), "held_out": error_stats(run_errors["fitted"]),
                       "prior_held_out": error_stats(run_errors["prior"]),
                       "total_held_out": error_stats([i["fitted_by_run_total_error"] for i, _, _ in runs
                                                      if i["split"] == "test"]),
                       "prior_total": error_stats([i["prior_total_error"] for i, _, _ in runs]),
                       "held_out_by_step_kind": {k: {w: error_stats(e) for w, e in v.items()}
                                                 for k, v in kind_errors.items()}},
            "_errors": {"random": random_errors, "by_run": run_errors, "kinds": kind_errors},
            "_prior": prior, "_fitted_run": fitted_run, "_fitted_random": fitted_random, "_test": test,
        }
        all_runs += [info for info, _, _ in runs]
        del model
    # transfer: the parameters fitted on another model's training runs, errors on this model's test runs
    for name, m in per_model.items():
        m["_errors"]["transfer"] = {"prior": [], "fitted": []}
        m["transfer"] = {}
        for other, o in per_model.items():
            if other == name:
                continue
            moved = m["_prior"].replace(**o["_fitted_run"].parameters())
            err = moved.errors(m["_test"])
            m["transfer"][other] = {"parameters": o["_fitted_run"].parameters(), "held_out": error_stats(err)}
            m["_errors"]["transfer"]["prior"].extend(m["_errors"]["by_run"]["prior"].tolist())
            m["_errors"]["transfer"]["fitted"].extend(err.tolist())
    kinds = ("random", "by_run", "transfer")
    pooled = {k: {w: error_stats(np.concatenate([np.asarray(m["_errors"][k][w], dtype=np.float64)
                                                  for m in per_model.values()])) for w in ("prior", "fitted")}
              for k in kinds}
    pooled["by_run_step_kind"] = {k: {w: error_stats(np.concatenate([m["_errors"]["kinds"][k][w]
                                                                       for m in per_model.values()]))
                                      for w in ("prior", "fitted")} for k in STEP_KINDS}
    for k, v in pooled["by_run_step_kind"].items():
        signed = np.concatenate([m["_errors"]["kinds"][k]["fitted"] for m in per_model.values()])
        v["fitted_signed_median"] = float(np.median(signed)) if signed.size else None
    test_totals = [i["fitted_by_run_total_error"] for i in all_runs if i["split"] == "test"]
    pooled["run_totals"] = {"prior": error_stats([i["prior_total_error"] for i in all_runs]),
                            "fitted_by_run_held_out": error_stats(test_totals)}
    # ------------------------------------------------------------------ tables
    device = f"{machine()['cpu']}, float32, torch {torch.__version__}, {torch.get_num_threads()} thread(s)"
    model_rows = []
    for name, m in per_model.items():
        c = m["config"]
        model_rows.append([name, c["num_hidden_layers"], c["hidden_size"], c["intermediate_size"],
                           f"{c['num_attention_heads']}/{c['num_key_value_heads']}x{c['head_dim']}",
                           round(m["weights_bytes"] / 1e6, 1), m["kv_bytes_per_token"], m["forward_steps"],
                           m["idle_steps"], 1e3 * (m["idle_step_seconds_median"] or 0.0),
                           100 * m["idle_share_of_step_seconds"]])
    text = table(f"CPU step costs of the reference sampler ({device}; steps are the fastest of "
                 f"{repeats} repeat(s)): models",
                 ["model", "layers", "hidden", "MLP", "heads (q/kv x dim)", "weights MB", "KV B/token",
                  "forward steps", "idle steps", "idle step median ms", "idle share of step time %"], model_rows)
    rows = []
    for i in all_runs:
        rows.append([i["model"], i["run"], i["split"], i["policy"], i["group_size"], i["slots"] or "-",
                     i["prompt_tokens"], i["prompt_kv"], i["max_new_tokens"], i["steps"], i["forward_steps"],
                     i["preemptions"], i["recomputed_tokens"], i["forward_step_seconds"],
                     100 * i["prior_total_error"], 100 * i["fitted_by_run_total_error"]])
    text += "\n" + table("Runs (forced lengths; train / test of the by-run split): measured seconds of the forward "
                         "steps and the error of the modelled total (SampleResult.model_seconds), signed %",
                         ["model", "run", "split", "policy", "G", "slots", "prompt", "prompt KV", "L", "steps",
                          "forward steps", "preemptions", "recomputed", "measured s", "prior total err %",
                          "by-run fitted total err %"], rows)
    err_rows = []
    for name, m in list(per_model.items()) + [("pooled", None)]:
        for kind in kinds:
            if m is None:
                st = pooled[kind]
            else:
                e = m["_errors"][kind]
                st = {w: error_stats(e[w]) for w in ("prior", "fitted")}
            err_rows.append([name, kind] + _pct(st["prior"]) + _pct(st["fitted"])[1:])
    text += "\n" + table("Held-out steps: |relative error| in % (random = a seeded half of the steps; by_run = fit "
                         "on the even runs, errors on the odd runs; transfer = parameters fitted on the other "
                         "model(s)' even runs, errors on this model's odd runs, once per other model)",
                         ["model", "split", "held-out steps", "prior median %", "prior p90 %", "prior max %",
                          "fitted median %", "fitted p90 %", "fitted max %"], err_rows)
    text += "\n" + table("By-run held-out steps of all models by kind: |relative error| in % (signed: median of "
                         "modelled / measured - 1)",
                         ["steps", "held-out steps", "prior median %", "prior p90 %", "prior max %",
                          "fitted median %", "fitted p90 %", "fitted max %", "fitted signed median %"],
                         [[k] + _pct(v["prior"]) + _pct(v["fitted"])[1:]
                          + [100 * v["fitted_signed_median"] if v["fitted_signed_median"] is not None else "-"]
                          for k, v in pooled["by_run_step_kind"].items()])
    par_rows = []
    for name, m in per_model.items():
        for kind, fitted in (("prior", m["_prior"]), ("random", m["_fitted_random"]), ("by_run", m["_fitted_run"])):
            p = fitted.parameters()
            par_rows.append([name, kind, 1e3 * p["overhead_seconds"], p["bandwidth_efficiency"],
                             fitted.bandwidth * p["bandwidth_efficiency"] / 1e9, p["compute_efficiency"],
                             fitted.peak_flops * p["compute_efficiency"] / 1e9,
                             1e3 * fitted.seconds(1, 64), 1e3 * fitted.seconds(32, 32 * 64)])
    text += "\n" + table("Fitted parameters (prior: bandwidth 100 GB/s, 224 GFLOP/s, 0.5 ms per layer)",
                         ["model", "fit", "overhead ms", "bandwidth eff", "effective GB/s", "compute eff",
                          "effective GFLOP/s", "ms: 1 row, context 64", "ms: 32 rows, context 64 each"], par_rows)
    tot = pooled["run_totals"]
    text += (f"\nRun totals: prior |error| median {100 * tot['prior']['median']:.1f}% over {tot['prior']['n']} runs; "
             f"by-run fitted on held-out runs median {100 * tot['fitted_by_run_held_out']['median']:.1f}%, "
             f"max {100 * tot['fitted_by_run_held_out']['max']:.1f}% over {tot['fitted_by_run_held_out']['n']} runs\n")
    for m in per_model.values():
        for key in [k for k in m if k.startswith("_")]:
            del m[key]
    raw = {"device": device, "torch": torch.__version__, "threads": torch.get_num_threads(), "dtype": "float32",
           "repeats": repeats,
           "priors": {"bandwidth": CPU_BANDWIDTH, "peak_flops": CPU_PEAK_FLOPS,
                      "overhead_seconds_per_layer": CPU_OVERHEAD_PER_LAYER},
           "models": per_model, "pooled": pooled, "runs": all_runs}
    return text, raw


CARD_STEPS = ("h100", "h200")  # cards with measured steps in benchmarks/results
CARD_MODELS = (("qwen3-1.7b", ""), ("qwen3-8b", "_qwen3-8b"))  # (preset, file suffix)


def _card_steps(model_suffix: str, compiled: bool) -> dict[str, Path]:
    """The measured-step files of one model (and compile mode) on each card that has them."""
    tail = model_suffix + ("_compiled" if compiled else "")
    found = {card: ROOT / "benchmarks" / "results" / f"cost_gpu_{card}{tail}.jsonl" for card in CARD_STEPS}
    return {card: path for card, path in found.items() if path.is_file()}


def section_cards(args) -> tuple[str, dict]:
    rows, raw, speed = [], [], []
    for model, suffix in CARD_MODELS:
        for compiled in (False, True):
            files = _card_steps(suffix, compiled)
            if len(files) < 2:
                raw.append({"model": model, "compiled": compiled, "skipped": "measured steps on fewer than two cards: "
                            + (", ".join(sorted(files)) or "none")})
                continue
            steps = {card: read_samples(path) for card, path in files.items()}
            fits = {card: StepCost.from_model(model, card, separate_attention=True).fit(steps[card]) for card in files}
            for source in files:
                for target in files:
                    if source == target:
                        continue
                    own, report_own = StepCost.from_model(model, target, separate_attention=True).fit_and_validate(
                        steps[target], train_fraction=0.5, seed=0)
                    priced = {
                        "unfitted preset": StepCost.from_model(model, target, separate_attention=True),
                        f"{source} fit on {source} numbers": fits[source],
                        f"{source} fit moved to {target} (on_gpu)": fits[source].on_gpu(target),
                    }
                    entry = {"model": model, "compiled": compiled, "fitted_on": source, "priced_on": target,
                             "steps": int(steps[target]["seconds"].size), "files": {c: str(p.relative_to(ROOT))
                                                                                   for c, p in files.items()},
                             "rows": {}}
                    for label, cost in priced.items():
                        err = cost.errors(steps[target])
                        entry["rows"][label] = {**error_stats(err), "signed_median": float(np.median(err))}
                        rows.append([model, "compiled" if compiled else "eager", f"{source} -> {target}", label,
                                     entry["steps"], float(np.median(np.abs(err))), float(np.median(err)),
                                     float(np.max(np.abs(err)))])
                    held = report_own["held_out"]
                    entry["rows"][f"{target} fit, held out"] = {**held, "parameters": own.parameters()}
                    rows.append([model, "compiled" if compiled else "eager", f"{source} -> {target}",
                                 f"{target} fit, held-out half", held["n"], float(held["median"]), "-",
                                 float(held["max"])])
                    entry["parameters"] = {"fitted_on_source": fits[source].parameters()}
                    raw.append(entry)
            speed.append(_card_speedup(model, compiled, steps))
    text = table("A calibration moved between cards: |modelled / measured - 1| on the steps of the second card",
                 ["model", "layers", "fitted -> priced", "model priced", "steps", "median |err|", "median signed",
                  "max |err|"], rows)
    text += "\n" + table("The same step measured on both cards: seconds on the first / seconds on the second",
                         ["model", "layers", "cards", "steps", "median", "min", "max", "decode steps, median",
                          "prefill steps, median", "datasheet bandwidth ratio"],
                         [[s["model"], "compiled" if s["compiled"] else "eager", " / ".join(s["cards"]), s["steps"],
                           s["median"], s["min"], s["max"], s["decode_median"], s["prefill_median"],
                           s["bandwidth_ratio"]] for s in speed])
    return text, {"pairs": raw, "speedup": speed}


def _card_speedup(model: str, compiled: bool, steps: dict) -> dict:
    """Per step shape measured on both cards (decode rows, KV tokens read, prefill tokens): the ratio of
    the first card's seconds to the second's (above 1: the second is faster)."""
    first, second = sorted(steps)
    keys = ("decode_rows", "kv_tokens_read", "prefill_tokens")

    def by_shape(cols):
        return {tuple(int(cols[k][i]) for k in keys): float(cols["seconds"][i]) for i in range(cols["seconds"].size)}

    a, b = by_shape(steps[first]), by_shape(steps[second])
    shared = sorted(set(a) & set(b))
    ratio = np.array([a[k] / b[k] for k in shared])
    prefill = np.array([k[2] > 0 for k in shared])
    return {"model": model, "compiled": compiled, "cards": [first, second], "steps": len(shared),
            "median": float(np.median(ratio)), "min": float(ratio.min()), "max": float(ratio.max()),
            "decode_median": float(np.median(ratio[~prefill])), "prefill_median": float(np.median(ratio[prefill])),
            "bandwidth_ratio": GPU_PRESETS[second].bandwidth / GPU_PRESETS[first].bandwidth}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="one profile, tensor-parallel degrees 1 and 2 (smoke test)")
    parser.add_argument("--sections", default="vidur", help="comma-separated sections: vidur, cpu, cards")
    parser.add_argument("--data", default=str(DATA), help="folder of the Vidur profiles")
    parser.add_argument("--threads", type=int, default=1, help="section cpu: PyTorch CPU threads")
    parser.add_argument("--repeats", type=int, default=2,
                        help="section cpu: runs of each group (the same steps); each step keeps its fastest time")
    parser.add_argument("--out", default=None,
                        help="results JSON (default benchmarks/results/cost_<sections joined by _>.json)")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = str(ROOT / "benchmarks" / "results" / f"cost_{args.sections.replace(',', '_')}.json")
    texts, results = run_sections(parser, args, {"vidur": section_vidur, "cpu": section_cpu,
                                                             "cards": section_cards})
    results = {"machine": machine(), "command": " ".join([Path(sys.argv[0]).name] + (argv or sys.argv[1:])),
               **results}
    note = ("data, not timing: the numbers do not depend on this machine" if "cpu" not in results
            else "section cpu times steps on this machine")
    report(results, texts, args.out, note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
