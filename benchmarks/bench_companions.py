"""Companion-method benchmarks: sGPO compute ratios, sparse (compressed-KV) rollouts against dense
(measured on a model, and simulated: the policies admitting by the compressed KV), and the Prefix
Grouper learner forward against the naive one.

    python benchmarks/bench_companions.py --data-dir ../shared/data    # full run (minutes on 2 cores)
    python benchmarks/bench_companions.py --quick                      # smoke run, what the tests execute
    python benchmarks/bench_companions.py --device cuda --dtype bfloat16   # the same on a GPU machine
    python benchmarks/bench_companions.py --model random-qwen3-1.7b --device cuda --dtype bfloat16 \
        --sections sparse,learner      # a real-size model without weights (see benchmarks/gpu_sampler.sh)

Markdown tables go to stdout, raw numbers to ``--out`` (default benchmarks/results/companions.json),
rewritten after every section (``"complete": false`` until the last one is done). ``--model`` is a
model of ``lengthsched sample``: by default its tiny Qwen3-shaped model; ``random-qwen3-0.6b`` /
``random-qwen3-1.7b`` have the real shapes of Qwen3-0.6B / 1.7B (random weights: gibberish text,
real compute and memory), or a Hugging Face name or directory. Peak memory of a learner forward +
backward is the child process's peak resident set on the CPU (``ru_maxrss``; the weights included)
and ``torch.cuda.max_memory_allocated`` on a GPU (weights and gradients included). Both learner
forwards apply the LM head only at the positions that predict completion tokens (G x l x V logits
for the naive rows, sum(l) x V grouped).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
from common import ROOT, device_name, machine, patched, report, run_sections, table, write_json

from lengthsched import KVCompression
from lengthsched.sgpo import BudgetConfig, ProfileRecord, plan_budget
from sampler.options import TINY_MODEL
from simulate.epoch import compare_epochs


# ----------------------------------------------------------------------------------------- sGPO
def synthetic_profile(n: int, k: int, seed: int) -> list[ProfileRecord]:
    """Success rates from Beta(0.4, 0.6) (many hard and many easy prompts, as RL datasets have),
    k samples each, lengths log-normal around 400 tokens."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = rng.beta(0.4, 0.6)
        out.append(ProfileRecord(f"s{i}", tuple(int(x) for x in rng.random(k) < p),
                                 tuple(int(x) for x in np.maximum(1, rng.lognormal(np.log(400), 0.3, size=k))),
                                 int(rng.integers(50, 300))))
    return out


def gsm8k_profile(data_dir: Path) -> list[ProfileRecord]:
    """GSM8K test questions with the 4 GPT-3 solutions of the grade-school-math release: outcome =
    is_correct, length = words of the solution x 1.3 (a token estimate). Four different generators,
    not one policy sampled four times: a GSM8K-SHAPED profile."""
    out = []
    path = data_dir / "gsm8k_test_gpt3_example_model_solutions.jsonl"
    for i, line in enumerate(path.read_text().splitlines()):
        rec = json.loads(line)
        sols = [rec[k] for k in ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification")]
        out.append(ProfileRecord(f"gsm8k-{i}", tuple(int(s["is_correct"]) for s in sols),
                                 tuple(max(1, round(1.3 * len(s["solution"].split()))) for s in sols),
                                 round(1.3 * len(rec["question"].split()))))
    return out


def sgpo(args: argparse.Namespace) -> tuple[str, list]:
    profiles = [("synthetic (Beta(0.4, 0.6), k = 8)", synthetic_profile(60 if args.quick else 2000, 8, 0))]
    if not args.quick:
        profiles.append(("GSM8K-shaped (4 GPT-3 solutions per test question)", gsm8k_profile(Path(args.data_dir))))
    rows, raw = [], []
    for name, prof in profiles:
        for rule in ("pow2", "ceil"):
            cfg = BudgetConfig(g_min=2, g_max=32, rule=rule, baseline_group_size=16)
            plan = plan_budget(prof, cfg)
            epoch = compare_epochs(prof, plan, ["fixed_slot", "length_aware"], max_new_tokens=4096, slots=8)
            rows.append([name, rule, len(prof), len(plan.kept), round(plan.profiling_tokens / 1e6, 3),
                         round(plan.training_tokens / 1e6, 3), round(plan.baseline_tokens / 1e6, 3),
                         round(plan.savings, 2), round(epoch[0]["steps_ratio"], 3), round(epoch[1]["steps_ratio"], 3)])
            raw.append({"profile": name, "rule": rule, **{k: v for k, v in plan.to_dict().items() if k != "prompts"}})
    return table("sGPO: tokens of profiling + training with adaptive group sizes against a fixed G = 16 "
                 "(g in [2, 32]); simulated epoch decode steps adaptive / fixed with 8 slots",
                 ["profile", "rule", "prompts", "kept", "profiling Mtok", "training Mtok", "baseline Mtok",
                  "less compute", "steps fixed_slot", "steps length_aware"], rows), raw


def _sgpo_steps(args: argparse.Namespace) -> tuple[tuple[str, dict], ...]:
    """The two step shapes of the sGPO training sections: ``--sgpo-batch`` prompts (verl's train_batch_size), or
    prompts until as many completions as that many groups of 16 (a batch raised as the groups shrink)."""
    return ((f"{args.sgpo_batch} prompts", dict(batch_prompts=args.sgpo_batch)),
            (f"{args.sgpo_batch * 16} completions", dict(batch_prompts=None, batch_completions=args.sgpo_batch * 16)))


def sgpo_online(args: argparse.Namespace) -> tuple[str, list]:
    """Simulated training runs: groups of a fixed G, sGPO from a profiling pass, sGPO from the trainer's own rewards
    (online) and from the true success rates (oracle), over epochs in which the policy's success on each prompt
    drifts (``simulate.sgpo_training``); every step through ``run_rollout`` (steal, prompt-level predictions), for
    each draw of ``--rollout-seeds``."""
    from simulate.sgpo_training import SGPO_SIZINGS, drifting_prompts, run_sgpo_training

    L, R, pool = args.admission_max_new, args.async_replicas, args.sgpo_pool
    steps = _sgpo_steps(args)
    rows, raw = [], []
    for learn in args.sgpo_learn:
        for seed in args.rollout_seeds:
            prompts = drifting_prompts(args.sgpo_prompts, max_new_tokens=L, learn=learn, seed=seed)
            for label, batch in steps:
                kw = dict(epochs=args.sgpo_epochs, group_size=16, replicas=R, budget_tokens=pool * L,
                          max_new_tokens=L, seed=seed, **batch)
                runs = {s: run_sgpo_training(prompts, s, **kw) for s in SGPO_SIZINGS}
                # lengthsched.sgpo's default in verl: groups informative with probability 0.9
                runs["online_informative"] = run_sgpo_training(
                    prompts, "online", config=BudgetConfig(rule="informative", target=0.9, baseline_group_size=16),
                    **kw)
                fixed = runs["fixed"]
                for sizing, r in runs.items():
                    x = r.against(fixed)
                    groups, samples, mass = x["groups"], x["completions"], x["advantage_mass"]
                    name = {"oracle": "true p (oracle)", "online_informative": "online, informative 0.9"}.get(
                        sizing, sizing)
                    rows.append([f"{learn:g}", seed, label, name,
                                 round(r.seconds, 1), r.completions, r.informative, round(r.informative_per_hour),
                                 f"**{groups:.2f}**" if groups == max(
                                     x.informative_per_hour for x in runs.values()) / fixed.informative_per_hour
                                 else f"{groups:.2f}", round(r.informative_completions_per_hour), f"{samples:.2f}",
                                 f"{mass:.2f}"])
                    raw.append({"learn": learn, "seed": seed, "step": label, "sizing": sizing, "seconds": r.seconds,
                                "completions": r.completions, "tokens": r.tokens, "informative": r.informative,
                                "informative_completions": r.informative_completions,
                                "informative_per_hour": r.informative_per_hour,
                                "informative_completions_per_hour": r.informative_completions_per_hour,
                                "x_fixed_groups": groups, "x_fixed_completions": samples,
                                "advantage_mass": r.advantage_mass, "x_fixed_advantage_mass": mass,
                                "profiling_seconds": r.profiling.seconds if r.profiling else 0.0,
                                "epoch_seconds": [e.seconds for e in r.epochs],
                                "epoch_completions": [e.completions for e in r.epochs],
                                "epoch_informative": [e.informative for e in r.epochs]})
    return table(f"sGPO over {args.sgpo_epochs} epochs of {args.sgpo_prompts} prompts (simulated; CASTILLO lengths, "
                 f"success rates Beta(0.4, 0.6) at epoch 0, log-odds + learn x U(0, 1) per epoch; G = 16, sGPO "
                 f"g in [2, 32] by pow2 (about 1/p) unless named, profiling 8 per prompt; steal on {R} replicas "
                 f"of {pool} x L_max KV, L_max {L}; "
                 "rollout seconds with profiling; informative: a group whose rewards differ; the most informative "
                 "groups per hour in bold per setting; oracle: sGPO's rule on the true success rates; advantage mass: "
                 "the sum of GRPO's std-normalised absolute advantages per hour)",
                 ["learn", "seed", "step", "sizing", "rollout s", "completions", "informative groups", "per hour",
                  "x fixed", "their completions per hour", "x fixed", "advantage mass / h x fixed"], rows), raw


def sgpo_targets(args: argparse.Namespace) -> tuple[str, list]:
    """Simulated: the informative rule's target against sGPO's pow2 and a fixed G, online, over the sgpo_online
    runs with learn 1 (each draw of ``--rollout-seeds``, both step shapes): the frontier between informative groups
    and their completions per rollout hour."""
    from simulate.sgpo_training import drifting_prompts, run_sgpo_training

    L, R, pool = args.admission_max_new, args.async_replicas, args.sgpo_pool
    rules = [("pow2 (about 1/p)", BudgetConfig(baseline_group_size=16))] + [
        (f"informative {t:g}", BudgetConfig(rule="informative", target=t, baseline_group_size=16))
        for t in args.sgpo_targets]
    steps = _sgpo_steps(args)
    rows, raw = [], []
    for seed in args.rollout_seeds:
        prompts = drifting_prompts(args.sgpo_prompts, max_new_tokens=L, learn=1.0, seed=seed)
        for label, batch in steps:
            kw = dict(epochs=args.sgpo_epochs, group_size=16, replicas=R, budget_tokens=pool * L, max_new_tokens=L,
                      seed=seed, **batch)
            fixed = run_sgpo_training(prompts, "fixed", **kw)
            for name, cfg in rules:
                r = run_sgpo_training(prompts, "online", config=cfg, **kw)
                x = r.against(fixed)
                groups, samples, mass = x["groups"], x["completions"], x["advantage_mass"]
                rows.append([seed, label, name, round(r.seconds, 1), r.completions, r.informative, f"{groups:.2f}",
                             f"{samples:.2f}", f"{mass:.2f}", "both" if groups >= 1 and samples >= 1 else ""])
                raw.append({"seed": seed, "step": label, "rule": name, "seconds": r.seconds,
                            "completions": r.completions, "informative": r.informative,
                            "informative_completions": r.informative_completions, "x_fixed_groups": groups,
                            "x_fixed_completions": samples, "x_fixed_advantage_mass": mass,
                            "fixed_seconds": fixed.seconds})
    return table(f"Online sGPO's rule against a fixed G = 16 (simulated; the sgpo_online runs with learn 1: "
                 f"{args.sgpo_epochs} epochs of {args.sgpo_prompts} prompts, steal on {R} replicas of {pool} x L_max "
                 f"KV, L_max {L}; per rollout hour x fixed G; advantage mass: the sum of GRPO's std-normalised "
                 "absolute advantages; 'both': at least the fixed G's on groups and their completions)",
                 ["seed", "step", "rule", "rollout s", "completions", "informative groups", "groups / h x fixed",
                  "their completions / h x fixed", "advantage mass / h x fixed", "ahead"], rows), raw


def sgpo_masked(args: argparse.Namespace) -> tuple[str, list]:
    """Simulated: online sGPO the slime way (``lengthsched_sgpo``): every prompt drawn ``--n-samples-per-prompt``
    times, the samples beyond its group's size run for one token and masked (``run_sgpo_training(masked_to=)``),
    against slime's fixed groups of 16, over the sgpo_online runs with learn 1 and slime's prompt-count steps; beside
    it the same rule without the masked samples (verl's ``__rollout_n__``) at the same g_max."""
    from simulate.sgpo_training import drifting_prompts, run_sgpo_training

    L, R, pool = args.admission_max_new, args.async_replicas, args.sgpo_pool
    rule = dict(rule="informative", target=0.9)
    sizings = (("masked, n = 16 (g_max 16)", 16, 16), ("not masked, g_max 16 (verl's way)", 16, None),
               ("masked, n = 32 (g_max 32; unseen prompts 32)", 32, 32),
               ("not masked, g_max 32, unseen prompts 16 (verl's default)", None, None))
    rows, raw = [], []
    for seed in args.rollout_seeds:
        prompts = drifting_prompts(args.sgpo_prompts, max_new_tokens=L, learn=1.0, seed=seed)
        kw = dict(epochs=args.sgpo_epochs, replicas=R, budget_tokens=pool * L, max_new_tokens=L, seed=seed,
                  batch_prompts=args.sgpo_batch)
        fixed = run_sgpo_training(prompts, "fixed", group_size=16, **kw)
        for name, n, masked in sizings:
            g_max, unseen = (n, n) if n is not None else (32, 16)
            r = run_sgpo_training(prompts, "online", group_size=unseen, masked_to=masked,
                                  config=BudgetConfig(g_max=g_max, baseline_group_size=unseen, **rule), **kw)
            x = r.against(fixed)
            rows.append([seed, name, round(r.seconds, 1), f"{r.seconds / fixed.seconds:.3f}", r.completions,
                         r.informative, f"{x['groups']:.2f}", f"{x['completions']:.2f}"])
            raw.append({"seed": seed, "sizing": name, "n_samples_per_prompt": n, "masked_to": masked,
                        "seconds": r.seconds, "fixed_seconds": fixed.seconds, "completions": r.completions,
                        "informative": r.informative, "x_fixed_groups": x["groups"],
                        "x_fixed_completions": x["completions"]})
    return table(f"Online sGPO the slime way, masked samples, against slime's fixed 16 (simulated; the sgpo_online "
                 f"runs with learn 1: {args.sgpo_epochs} epochs of {args.sgpo_prompts} prompts, steps of "
                 f"{args.sgpo_batch} prompts, steal on {R} replicas of {pool} x L_max KV, L_max {L}; rule "
                 "informative 0.9; per rollout hour x the fixed 16)",
                 ["seed", "sizing", "rollout s", "x fixed s", "completions", "informative groups",
                  "groups / h x fixed", "their completions / h x fixed"], rows), raw


#: The policies of the sgpo_policies section: (label, policy); run_rollout routes vLLM by verl's least-loaded router.
SGPO_POLICIES = (("vLLM + verl", "vllm"), ("steal", "steal"), ("Seer-like", "seer"))


def sgpo_policies(args: argparse.Namespace) -> tuple[str, list]:
    """Simulated: whether the scheduler's gain survives sGPO's mixed group sizes: the training runs of
    ``sgpo_online`` (learn 1, every draw of ``--rollout-seeds``) under vLLM + verl's router, ``steal`` and the
    Seer-like policy, in tight and roomy pools; each sizing's rollout seconds against vLLM + verl with that sizing."""
    from simulate.sgpo_training import drifting_prompts, run_sgpo_training

    L, R = args.admission_max_new, args.async_replicas
    sizings = (("fixed G = 16", "fixed", None), ("online, pow2", "online", None),
               ("online, informative 0.9", "online", BudgetConfig(rule="informative", target=0.9,
                                                                  baseline_group_size=16)))
    steps = _sgpo_steps(args)
    rows, raw = [], []
    for seed in args.rollout_seeds:
        prompts = drifting_prompts(args.sgpo_prompts, max_new_tokens=L, learn=1.0, seed=seed)
        for label, batch in steps:
            for pool in args.sgpo_policy_pools:
                for name, sizing, cfg in sizings:
                    seconds = {policy: run_sgpo_training(prompts, sizing, config=cfg, epochs=args.sgpo_epochs,
                                                         group_size=16, replicas=R, budget_tokens=pool * L,
                                                         max_new_tokens=L, seed=seed, policy=policy, **batch).seconds
                               for _, policy in SGPO_POLICIES}
                    base = seconds["vllm"]
                    best = min(seconds, key=seconds.get)
                    rows.append([seed, label, f"{pool} x", name, round(base, 1)]
                                + [f"**{seconds[p] / base:.3f}**" if p == best else f"{seconds[p] / base:.3f}"
                                   for _, p in SGPO_POLICIES[1:]])
                    raw.append({"seed": seed, "step": label, "pool_x_lmax": pool, "sizing": name,
                                "seconds": seconds})
    return table(f"The scheduler under sGPO's group sizes (simulated; the sgpo_online runs with learn 1: "
                 f"{args.sgpo_epochs} epochs of {args.sgpo_prompts} prompts on {R} replicas, L_max {L}; rollout "
                 "seconds x vLLM + verl's router with the same sizing, the fastest in bold)",
                 ["seed", "step", "pool", "sizing", "vLLM + verl s"] + [f"{n} x" for n, _ in SGPO_POLICIES[1:]],
                 rows), raw


# ------------------------------------------------------------------------------------ Sparse-RL
def sparse(args: argparse.Namespace) -> tuple[str, list]:
    from sampler import InfiniteSampler
    from sampler.cli import load_model

    model, tok = load_model(args.model, args.dtype, args.device)
    n, g = args.sparse_new, args.sparse_group
    prompt = list(np.random.default_rng(0).integers(0, 200, size=64))
    InfiniteSampler(model, policy="fixed_slot", slots=2).sample_group(prompt, 2, max_new_tokens=4, seed=0)  # warm up
    rows, raw = [], []
    for budget in [None, *args.sparse_budgets]:
        comp = None if budget is None else KVCompression(budget, args.sparse_interval)
        res = InfiniteSampler(model, policy="fixed_slot", slots=g, kv_compression=comp).sample_group(
            prompt, g, max_new_tokens=n, seed=0, force_lengths=[n] * g, stop_token_ids=[tok.eos_token_id],
            record_steps=True)
        rows.append(["dense" if budget is None else f"{budget} + {args.sparse_interval}", g, n,
                     round(res.peak_kv_bytes / 2**20, 3), round(res.tokens_per_second, 1)])
        raw.append({"budget": budget, "peak_kv_bytes": res.peak_kv_bytes, "tokens_per_second": res.tokens_per_second,
                    "wall_seconds": res.wall_seconds})
    dense = rows[0]
    for r in rows:
        r.append(round(r[3] / dense[3], 3))
        r.append(round(r[4] / dense[4], 3))
    return table(f"Sparse rollouts (compressed KV) against dense on the same model ({device_name(model)}; G = {g} "
                 f"sequences of {n} tokens, a 64-token prompt)",
                 ["KV budget + interval", "sequences", "tokens each", "peak KV MiB", "tokens / s", "KV / dense",
                  "speed / dense"], rows), raw


def sparse_budget(args: argparse.Namespace) -> tuple[str, list]:
    """Measured on a model: the reference sampler under a memory budget (``budget_bytes``: the weights,
    the prompt, the activations and ``--budget-pool`` x L_max KV tokens), dense and with the compressed
    caches, the policies admitting by the compressed KV; the same group's forced lengths (log-normal,
    median L_max / 3) in every run, its schedule checked against the simulator's."""
    from lengthsched.runtime import kv_budget_tokens
    from sampler import InfiniteSampler, model_memory
    from sampler.cli import load_model
    from simulate import run_group

    model, tok = load_model(args.model, args.dtype, args.device)
    n, g = args.sparse_new, args.budget_group
    rng = np.random.default_rng(0)
    prompt = [int(x) for x in rng.integers(0, 200, size=64)]
    lengths = [int(x) for x in np.clip(rng.lognormal(np.log(n / 3), 0.6, size=g), 1, n)]
    mem = model_memory(model)
    budget_bytes = (mem.weights_bytes + mem.prompt_kv_bytes(len(prompt)) + mem.activation_bytes(g)
                    + args.budget_pool * n * mem.kv_bytes_per_token)
    tokens = kv_budget_tokens(mem, budget_bytes, prompt_tokens=len(prompt), group_size=g)
    InfiniteSampler(model, policy="fixed_slot", slots=2).sample_group(prompt, 2, max_new_tokens=4, seed=0)  # warm up
    rows, raw = [], []
    for policy in args.budget_policies:
        dense = None
        for budget in [None, *args.sparse_budgets]:
            comp = None if budget is None else KVCompression(budget, args.sparse_interval)
            res = InfiniteSampler(model, policy=policy, slots=None, budget_bytes=budget_bytes,
                                  kv_compression=comp).sample_group(
                prompt, g, max_new_tokens=n, seed=0, force_lengths=lengths, predicted_lengths=lengths,
                stop_token_ids=[tok.eos_token_id])
            sim = run_group(lengths, policy, max_new_tokens=n, prompt_len=len(prompt), budget_tokens=tokens,
                            predicted=lengths, compression=comp)
            dense = dense or res
            most = max((r.decode_rows for r in res.records), default=0)
            rows.append([policy, "dense" if comp is None else f"{budget} + {args.sparse_interval}", most, res.steps,
                         "yes" if res.steps == sim.steps else f"no ({sim.steps})",
                         round(res.peak_kv_bytes / 2**20, 3), round(res.tokens_per_second, 1),
                         round(res.tokens_per_second / dense.tokens_per_second, 3)])
            raw.append({"policy": policy, "budget": budget, "interval": args.sparse_interval, "most_at_once": most,
                        "steps": res.steps, "sim_steps": sim.steps, "peak_kv_bytes": res.peak_kv_bytes,
                        "budget_bytes": budget_bytes, "kv_budget_tokens": tokens,
                        "tokens_per_second": res.tokens_per_second, "wall_seconds": res.wall_seconds})
    return table(f"A memory budget with a compressed cache, measured ({device_name(model)}; G = {g} completions of "
                 f"up to {n} tokens, median {int(np.median(lengths))}, a 64-token prompt; the budget holds "
                 f"{tokens} KV tokens beyond the prompt: {args.budget_pool} x L_max)",
                 ["policy", "KV budget + interval", "most at once", "steps", "= simulator", "peak KV MiB",
                  "tokens / s", "speed / dense"], rows), raw


# ------------------------------------------------------------- Sparse-RL: admission by the compressed KV
def _admission_groups(workload: str, n: int, max_new: int, group_size: int = 32, seed: int = 0):
    """``n`` groups of ``workload``: CASTILLO's, or the long-tail one (LMSYS lengths, within-group log-sd 1.0,
    CASTILLO's prompt lengths)."""
    from simulate.workloads import make_workload

    extra = {} if workload == "castillo" else {"spread": 1.0, "prompt_tokens": "castillo"}
    return make_workload(workload, group_size, max_new_tokens=max_new, limit=n, seed=seed, **extra)


def _predicted_groups(workload: str, n: int, max_new: int, seed: int) -> tuple[list, np.ndarray]:
    """``n`` groups of 16 of ``workload`` (:func:`_admission_groups`) and their prompt-level predictions (log-normal
    error 0.5, the same for siblings), flattened: what every rollout-step section runs on."""
    from simulate.report import predictions_for

    groups = _admission_groups(workload, n, max_new, group_size=16, seed=seed)
    return groups, np.concatenate([predictions_for("prompt:0.5", g, i, seed) for i, g in enumerate(groups)])


def sparse_admission(args: argparse.Namespace) -> tuple[str, list]:
    """Simulated: every policy on groups of 32 whose KV pool (per group, beyond the prompt) is a few x
    L_max, dense and with compressed caches of BUDGET + INTERVAL generated tokens, the policies admitting
    by the compressed KV (``run_group(compression=)``). Prompt-level predictions with log-normal error
    0.5; seconds from the default step-cost model, the rows reading the compressed KV (the compression's
    own work not priced)."""
    from simulate import run_group
    from simulate.report import predictions_for

    L = args.admission_max_new
    caches = [None, *args.admission_caches]
    rows, raw = [], []
    for workload in args.admission_workloads:
        groups = _admission_groups(workload, args.admission_groups, L)
        for pool in args.admission_pools:
            budget = pool * L + 64  # room for a prompt's partial block in vLLM's blocks of 16
            for policy in args.admission_policies:
                cells = []
                for comp in caches:
                    runs = [run_group(g.lengths, policy, budget_tokens=budget, max_new_tokens=L,
                                      predicted=predictions_for("prompt:0.5", g, i, 0), prompt_len=g.prompt_len,
                                      compression=comp) for i, g in enumerate(groups)]
                    cell = {"workload": workload, "pool_x_lmax": pool, "policy": policy,
                            "cache": None if comp is None else [comp.budget, comp.interval],
                            "seconds": float(np.mean([r.seconds for r in runs])),
                            "steps": float(np.mean([r.steps for r in runs])),
                            "preemptions": float(np.mean([r.preemptions for r in runs])),
                            "max_live": float(np.mean([r.max_live for r in runs])),
                            "seconds_over_lb": float(np.mean([r.seconds_ratio for r in runs])),
                            "retained_peak_over_pool": float(max((r.peak_retained_kv_tokens or r.peak_kv_tokens)
                                                                 / budget for r in runs))}
                    cells.append(cell)
                    raw.append(cell)
                dense = cells[0]["seconds"]
                rows.append([workload, f"{pool} x", policy, f"{dense:.3f}"]
                            + [f"{c['seconds']:.3f} ({c['seconds'] / dense:.2f})" for c in cells[1:]]
                            + [f"{cells[0]['preemptions']:.1f} / {cells[-1]['preemptions']:.1f}",
                               f"{cells[0]['max_live']:.1f} / {cells[-1]['max_live']:.1f}"])
    heads = [f"{c.budget} + {c.interval}: s (x dense)" for c in caches[1:]]
    last = f"{caches[-1].budget} + {caches[-1].interval}"
    return table(f"Admission by the compressed KV (simulated; {args.admission_groups} groups of G = 32 per workload, "
                 f"L_max {L}, prompt-level predictions with error 0.5, seconds per group from the default step cost, "
                 "the rows reading the compressed KV; the compression's own work not priced)",
                 ["workload", "pool (KV tokens per group)", "policy", "dense s", *heads,
                  f"preemptions dense / {last}", f"most at once dense / {last}"], rows), raw


def sparse_rollout(args: argparse.Namespace) -> tuple[str, list]:
    """Simulated: one RL rollout step (B prompts x 16 on R replicas, each replica's pool a few x L_max
    tokens, prompts inside) under vLLM and SGLang engines behind verl's least-loaded router, under the Seer-like
    anchor (``seer``) and under ``steal`` (the project's default policy), dense and with compressed caches
    (``run_rollout(compression=)``). Prompt-level predictions with log-normal error 0.5."""
    from simulate import run_rollout

    L, R = args.admission_max_new, args.rollout_replicas
    caches = [None, *args.admission_caches]
    rows, raw = [], []
    for workload in args.admission_workloads:
        for seed in args.rollout_seeds:
            groups, pred = _predicted_groups(workload, args.rollout_prompts, L, seed)
            for pool in args.rollout_pools:
                common = dict(replicas=R, budget_tokens=pool * L, max_new_tokens=L, predicted=pred)
                base = run_rollout(groups, "vllm", **common).seconds
                for policy in ("vllm", "sglang", "seer", "steal"):
                    cells = []
                    for comp in caches:
                        res = run_rollout(groups, policy, router="least_loaded", compression=comp, **common)
                        cell = {"workload": workload, "seed": seed, "pool_x_lmax": pool, "policy": policy,
                                "cache": None if comp is None else [comp.budget, comp.interval],
                                "seconds": res.seconds, "lower_bound_seconds": res.lower_bound_seconds,
                                "preemptions": res.preemptions, "recomputed_tokens": res.recomputed_tokens,
                                "x_vllm_dense": res.seconds / base,
                                "seconds_over_lb": res.seconds / res.lower_bound_seconds}
                        cells.append(cell)
                        raw.append(cell)
                    name = policy if policy in ("seer", "steal") else f"{policy} + least_loaded"
                    rows.append([workload, seed, f"{pool} x", name, f"{cells[0]['seconds']:.2f}"]
                                + [f"{c['x_vllm_dense']:.3f}" for c in cells]
                                + [f"{cells[-1]['seconds_over_lb']:.2f}",
                                   f"{cells[0]['preemptions']} / {cells[-1]['preemptions']}"])
    last = f"{caches[-1].budget} + {caches[-1].interval}"
    heads = ["dense"] + [f"{c.budget} + {c.interval}" for c in caches[1:]]
    return table(f"A rollout step with a compressed cache (simulated; {args.rollout_prompts} prompts x 16 on {R} "
                 f"replicas, L_max {L}, each replica's pool a few x L_max tokens with the prompts inside, "
                 "prompt-level predictions with error 0.5; seconds x vLLM FCFS dense with verl's routing)",
                 ["workload", "draw", "pool", "policy (+ router)", "dense s", *[f"{h} x vllm dense" for h in heads],
                  f"{last}: s / LB", f"preemptions dense / {last}"], rows), raw


#: The runs of the client-window section: (label, how it runs). Every one with the section's cache but the
#: first, the baseline (vLLM + verl dense).
WINDOW_RUNS = ("vllm + least_loaded (verl)", "slime as it ships (sglang + cache_aware, 512 x R in flight)",
               "slime + lengthsched's plan (client window 2 pools)",
               "vllm engines behind the client window (steal's placement; no framework ships it)")


def _window_run(label: str, groups, pred, common: dict, comp) -> float:
    """One run of :func:`sparse_window`: its modelled seconds."""
    from simulate import run_rollout, run_slime_planned
    from simulate.rollout import place_ways, steal_ways

    R, budget, L = common["replicas"], common["budget_tokens"], common["max_new_tokens"]
    if label == WINDOW_RUNS[0]:
        return run_rollout(groups, "vllm", predicted=pred, compression=comp, **common).seconds
    if label == WINDOW_RUNS[1]:
        return run_rollout(groups, "sglang", router="cache_aware", in_flight=512 * R, compression=comp,
                           **common).seconds
    if label == WINDOW_RUNS[2]:
        return run_slime_planned(groups, pred, in_flight=512 * R, compression=comp, **common)[0].seconds
    work, ways = steal_ways(groups, pred, budget, R, L)
    placed = place_ways(work, [len(g.lengths) for g in groups], R, ways)
    return run_rollout(groups, "vllm", predicted=pred, placement=placed, client_window=2.0, compression=comp,
                       **common).seconds


def sparse_window(args: argparse.Namespace) -> tuple[str, list]:
    """Simulated: a compressed cache behind a client window (``run_rollout(client_window=, compression=)``):
    slime with lengthsched's plan (SGLang engines), vLLM engines behind the same window, slime as it ships and
    vLLM + verl, each with the cache, against vLLM + verl dense. Prompt-level predictions with error 0.5."""

    L, comp = args.admission_max_new, args.window_cache
    rows, raw = [], []
    for workload in args.admission_workloads:
        for prompts in args.window_prompts:
            groups, pred = _predicted_groups(workload, prompts, L, args.rollout_seeds[0])
            for R in args.window_replicas:
                for pool in args.window_pools:
                    common = dict(replicas=R, budget_tokens=pool * L, max_new_tokens=L)
                    base = _window_run(WINDOW_RUNS[0], groups, pred, common, None)
                    cell = {"workload": workload, "prompts": prompts, "replicas": R, "pool_x_lmax": pool,
                            "cache": [comp.budget, comp.interval], "dense_seconds": base,
                            "x_vllm_dense": {label: _window_run(label, groups, pred, common, comp) / base
                                             for label in WINDOW_RUNS}}
                    raw.append(cell)
                    rows.append([workload, prompts, R, f"{pool} x", f"{base:.2f}",
                                 *[f"{cell['x_vllm_dense'][label]:.3f}" for label in WINDOW_RUNS]])
    means = [float(np.mean([c["x_vllm_dense"][label] for c in raw])) for label in WINDOW_RUNS]
    rows.append(["mean", "", "", "", "", *[f"**{m:.3f}**" if m == min(means) else f"{m:.3f}" for m in means]])
    return table(f"A compressed cache ({comp.budget} + {comp.interval}) behind a client window (simulated; "
                 f"prompts x 16, L_max {L}, each replica's pool a few x L_max with the prompts inside, prompt-level "
                 "predictions with error 0.5; seconds x vLLM FCFS dense with verl's routing)",
                 ["workload", "prompts", "replicas", "pool", "vllm dense s", *WINDOW_RUNS], rows), raw


def _toggled(groups, base: str, policy: str, cls, attr: str, kw: dict) -> dict[bool, float]:
    """``policy``'s seconds over ``base``'s (``run_rollout`` with ``kw``) with ``cls.attr`` off and on."""
    from simulate import run_rollout

    seconds = run_rollout(groups, base, **kw).seconds
    out = {}
    for value in (False, True):
        with patched(cls, **{attr: value}):
            out[value] = run_rollout(groups, policy, **kw).seconds / seconds
    return out


def sparse_crowding(args: argparse.Namespace) -> tuple[str, list]:
    """Simulated: ``steal``'s placement with a compressed cache, its crowding rule (whole groups once the
    step's predicted tokens fill ``CROWDED_POOLS`` pools a replica) weighing each completion's predicted tokens
    whole (the default) or at most the cache's budget + interval (``WorkStealing.CROWD_HELD``), on the
    settings of a grid where the two rules choose different spreads; seconds x vLLM + verl with the same
    cache. Prompt-level predictions with error 0.5."""
    from lengthsched.runtime.dispatch import WorkStealing
    from simulate.rollout import steal_ways

    L, seed = args.admission_max_new, args.rollout_seeds[0]
    rows, raw, scanned = [], [], 0
    for workload in args.admission_workloads:
        for prompts in args.window_prompts:
            groups, pred = _predicted_groups(workload, prompts, L, seed)
            for R in args.window_replicas:
                for pool in args.crowding_pools:
                    for comp in args.admission_caches:
                        scanned += 1
                        ways = {}
                        for held in (False, True):
                            with patched(WorkStealing, CROWD_HELD=held):
                                ways[held] = steal_ways(groups, pred, pool * L, R, L, kv_cap=comp.max_retained)[1]
                        if ways[False] == ways[True]:
                            continue
                        common = dict(replicas=R, budget_tokens=pool * L, max_new_tokens=L, predicted=pred,
                                      compression=comp)
                        x = _toggled(groups, "vllm", "steal", WorkStealing, "CROWD_HELD", common)
                        raw.append({"workload": workload, "prompts": prompts, "replicas": R, "pool_x_lmax": pool,
                                    "cache": [comp.budget, comp.interval], "ways_whole": ways[False],
                                    "ways_held": ways[True], "whole_x_vllm": x[False], "held_x_vllm": x[True]})
                        rows.append([workload, prompts, R, f"{pool} x", f"{comp.budget} + {comp.interval}",
                                     f"{ways[False]} / {ways[True]}", f"{x[False]:.3f}", f"{x[True]:.3f}"])
    if raw:
        means = [float(np.mean([c[key] for c in raw])) for key in ("whole_x_vllm", "held_x_vllm")]
        rows.append(["mean", "", "", "", "", "", *[f"**{m:.3f}**" if m == min(means) else f"{m:.3f}" for m in means]])
    return table(f"steal's crowding rule with a compressed cache (simulated; the {len(raw)} of {scanned} settings "
                 f"where weighing the capped tokens changes the spread; prompts x 16, L_max {L}, prompt-level "
                 "predictions with error 0.5; seconds x vLLM + verl with the same cache)",
                 ["workload", "prompts", "replicas", "pool", "cache", "spread: whole / capped",
                  "steal, whole tokens (default)", "steal, capped tokens"], rows), raw


def sparse_sglang_room(args: argparse.Namespace) -> tuple[str, list]:
    """Simulated: ``steal_sglang`` with a compressed cache, its room to steal counting the predicted peak
    uncompressed (the default: SGLang's admission reserves whole lengths) or capped at budget + interval as
    ``steal``'s does (``WorkStealing.ROOM_CAPPED``); seconds x SGLang + verl with the same cache."""
    from lengthsched.runtime.dispatch import StealSGLang

    L, comp, seed = args.admission_max_new, args.window_cache, args.rollout_seeds[0]
    rows, raw = [], []
    for workload in args.admission_workloads:
        for prompts in args.window_prompts:
            groups, pred = _predicted_groups(workload, prompts, L, seed)
            for R in args.window_replicas:
                for pool in args.async_pools:
                    kw = dict(replicas=R, budget_tokens=pool * L, max_new_tokens=L, predicted=pred, compression=comp)
                    x = _toggled(groups, "sglang", "steal_sglang", StealSGLang, "ROOM_CAPPED", kw)
                    raw.append({"workload": workload, "prompts": prompts, "replicas": R, "pool_x_lmax": pool,
                                "cache": [comp.budget, comp.interval], "whole_x_sglang": x[False],
                                "capped_x_sglang": x[True]})
                    rows.append([workload, prompts, R, f"{pool} x", *[f"**{v:.3f}**" if v == min(x.values())
                                                                      else f"{v:.3f}" for v in (x[False], x[True])]])
    means = [float(np.mean([c[k] for c in raw])) for k in ("whole_x_sglang", "capped_x_sglang")]
    rows.append(["mean", "", "", "", *[f"**{m:.3f}**" if m == min(means) else f"{m:.3f}" for m in means]])
    return table(f"steal_sglang's room to steal with a compressed cache ({comp.budget} + {comp.interval}; simulated; "
                 f"prompts x 16, L_max {L}, prompt-level predictions with error 0.5; seconds x SGLang + verl with the "
                 "same cache)", ["workload", "prompts", "replicas", "pool", "room uncompressed (default)",
                                 "room capped"], rows), raw


#: The runs of the asynchronous section: (label, run function name, its arguments).
ASYNC_RUNS = (("AReaL, K=1, sglang, round robin", "areal", {"policy": "sglang", "max_staleness": 1}),
              ("AReaL, K=1, vllm, round robin", "areal", {"policy": "vllm", "max_staleness": 1}),
              ("AReaL, K=1, steal (groups placed, stolen)", "areal",
               {"policy": "vllm", "max_staleness": 1, "router": "placed", "steal": True, "predicted": True}),
              ("verl 0.9.1 fully async, S=0.1, vllm", "verl", {"policy": "vllm", "staleness_threshold": 0.1}),
              ("verl 0.9.1 + lengthsched.integrations.verl_async, S=0.1", "verl",
               {"policy": "vllm", "staleness_threshold": 0.1, "predicted": True, "integration": True}),
              ("sync: steal, then the learner", "sync", {}))


def _cache_rows(cells: list[dict], rate: str, steps: int) -> list[list[str]]:
    """One setting's table rows, each run dense and with the cache: seconds per step, ``rate`` (tokens per second;
    the most with the cache in bold) and the cache's over the dense one."""
    best = max(c[f"cache_{rate}"] for c in cells)
    rows = []
    for c in cells:
        tps = c[f"cache_{rate}"]
        rows.append([c["workload"], f"{c['pool_x_lmax']} x", c["run"], f"{c['dense_seconds'] / steps:.2f}",
                     f"{c['cache_seconds'] / steps:.2f}", f"{c[f'dense_{rate}']:,.0f}",
                     f"**{tps:,.0f}**" if tps == best else f"{tps:,.0f}", f"{tps / c[f'dense_{rate}']:.2f}"])
    return rows


def sparse_async(args: argparse.Namespace) -> tuple[str, list]:
    """Simulated: asynchronous RL with a compressed cache (``run_async_rollout`` / ``run_verl_async`` /
    ``run_sync_steps(compression=)``): AReaL's loop, verl's fully asynchronous recipe and lengthsched's
    synchronous steps, each dense and with the section's cache, in tight pools. The learner takes half the
    dense synchronous step's seconds; prompt-level predictions with error 0.5."""
    from simulate.async_report import INTEGRATION
    from simulate.asynchronous import run_async_rollout, run_sync_steps, run_verl_async

    L, comp, steps, batch, R = args.admission_max_new, args.window_cache, args.async_steps, args.async_prompts, \
        args.async_replicas
    seed = args.rollout_seeds[0]
    rows, raw = [], []
    for workload in args.admission_workloads:
        groups, pred = _predicted_groups(workload, (steps + 1) * batch, L, seed)
        for pool in args.async_pools:
            common = dict(replicas=R, budget_tokens=pool * L, max_new_tokens=L)
            ref = run_sync_steps(groups, "sglang", router="least_loaded", batch=batch, steps=steps, train_seconds=0.0,
                                 **common)
            train = 0.5 * ref.seconds / steps  # the learner: half the dense synchronous rollout's mean step
            for label, kind, extra in ASYNC_RUNS:
                cell = {"workload": workload, "pool_x_lmax": pool, "run": label, "train_seconds": train,
                        "cache": [comp.budget, comp.interval]}
                for name, c in (("dense", None), ("cache", comp)):
                    kw = {k: v for k, v in extra.items() if k not in ("predicted", "integration")}
                    if extra.get("predicted"):
                        kw["predicted"] = pred
                    if extra.get("integration"):
                        kw.update(INTEGRATION)
                    if kind == "areal":
                        r = run_async_rollout(groups, batch=batch, steps=steps, train_seconds=train, compression=c,
                                              **common, **kw)
                    elif kind == "verl":
                        r = run_verl_async(groups, batch=batch, steps=steps, train_seconds=train, compression=c,
                                           **common, **kw)
                    else:
                        r = run_sync_steps(groups, "steal", batch=batch, steps=steps, train_seconds=train,
                                           predicted=pred, compression=c, **common)
                    cell[f"{name}_seconds"] = r.seconds
                    cell[f"{name}_tokens_per_second"] = (r.consumed_tokens if kind != "sync" else r.tokens) / r.seconds
                raw.append(cell)
        for pool in args.async_pools:
            cells = [c for c in raw if c["workload"] == workload and c["pool_x_lmax"] == pool]
            rows += _cache_rows(cells, "tokens_per_second", steps)
    return table(f"Asynchronous RL with a compressed cache ({comp.budget} + {comp.interval}; simulated; {steps} "
                 f"learner steps of {batch} prompts x 16 on {R} replicas, L_max {L}, the learner half the dense "
                 "synchronous step; trained tokens per modelled second, the most with the cache in bold per setting)",
                 ["workload", "pool", "run", "dense s/step", "cache s/step", "dense tok/s", "cache tok/s",
                  "cache x dense tok/s"], rows), raw


# Over-sampled steps' runs: (label, policy, router or "slime_plan", over-sampling factor)
OVERSAMPLE_RUNS = (("vLLM + verl's router, no over-sampling", "vllm", "least_loaded", 1.0),
                   ("vLLM + verl's router, over-sampled", "vllm", "least_loaded", None),
                   ("steal, over-sampled", "steal", None, None),
                   ("slime + lengthsched plan (SGLang), over-sampled", "sglang", "slime_plan", None))


def sparse_oversample(args: argparse.Namespace) -> tuple[str, list]:
    """Simulated: slime's over-sampled steps with partial rollout (``run_oversampled_steps(partial=True,
    compression=)``), dense and with the section's cache: a sample an aborted step carries resumes with its
    partial response, prefilled again and, with the cache, held capped with what it generates. Prompt-level
    predictions with error 0.5; slime's in-flight cap (512 per replica) for the planned rows."""
    from simulate import run_oversampled_steps
    from simulate.oversampling import submitted_per_step
    from simulate.rollout import run_slime_planned_in_order

    L, comp, steps, batch, R = args.admission_max_new, args.window_cache, args.async_steps, args.async_prompts, \
        args.async_replicas
    seed = args.rollout_seeds[0]
    rows, raw = [], []
    for workload in args.admission_workloads:
        groups, pred = _predicted_groups(workload, steps * submitted_per_step(batch, args.oversample), L, seed)
        for pool in args.async_pools:
            cells = []
            for label, policy, router, factor in OVERSAMPLE_RUNS:
                cell = {"workload": workload, "pool_x_lmax": pool, "run": label,
                        "oversample": factor or args.oversample, "cache": [comp.budget, comp.interval]}
                for name, c in (("dense", None), ("cache", comp)):
                    kw = dict(replicas=R, budget_tokens=pool * L, max_new_tokens=L, compression=c)
                    if router == "slime_plan":
                        kw.update(run=run_slime_planned_in_order, in_flight=512 * R)
                    elif router is not None:
                        kw["router"] = router
                    r = run_oversampled_steps(groups, policy, batch=batch, oversample=cell["oversample"],
                                              steps=steps, partial=True, predicted=pred, **kw)
                    cell[f"{name}_seconds"] = r.seconds
                    cell[f"{name}_kept_tokens_per_second"] = r.kept_tokens_per_second
                    cell[f"{name}_stale_share"] = r.stale_share
                    cell[f"{name}_recomputed_tokens"] = int(sum(x.recomputed_tokens for x in r.steps))
                cells.append(cell)
            raw += cells
            rows += [row + [f"{c['cache_stale_share']:.2f}"]
                     for row, c in zip(_cache_rows(cells, "kept_tokens_per_second", steps), cells)]
    return table(f"slime's over-sampled steps with a compressed cache ({comp.budget} + {comp.interval}; simulated; "
                 f"{steps} steps keeping {batch} prompts x 16 of {submitted_per_step(batch, args.oversample)} "
                 f"submitted, partial rollout, on {R} replicas, L_max {L}; kept tokens per modelled second, the most "
                 "with the cache in bold per setting)",
                 ["workload", "pool", "run", "dense s/step", "cache s/step", "dense kept tok/s", "cache kept tok/s",
                  "cache x dense", "stale (cache)"], rows), raw


# Multi-turn runs: (label, policy, run_multiturn's options)
MULTITURN_CACHE_RUNS = (("vLLM + verl's sticky sessions", "vllm", {}),
                        ("steal, every turn", "steal", {}),
                        ("SGLang + its router on every turn (slime)", "sglang", {"router": "cache_aware"}))


def sparse_multiturn(args: argparse.Namespace) -> tuple[str, list]:
    """Simulated: multi-turn steps (``run_multiturn(compression=)``), dense with the engines' prefix cache (a
    conversation kept for its next turn), dense without it, and with the section's cache (each turn's own tokens
    capped, its conversation whole and prefilled again: a compressed turn is no prefix of the next). Sessions of
    2-5 turns, tools of median 0.5 s; prompt-level predictions with error 0.5."""
    from simulate.multiturn import run_multiturn, split_turns

    L, comp, batch, R = args.admission_max_new, args.window_cache, args.multiturn_prompts, args.async_replicas
    seed = args.rollout_seeds[0]
    rows, raw = [], []
    for workload in args.admission_workloads:
        groups, pred = _predicted_groups(workload, batch, L, seed)
        turns = split_turns(groups, seed=seed)
        for pool in args.async_pools:
            for label, policy, options in MULTITURN_CACHE_RUNS:
                kw = dict(replicas=R, budget_tokens=pool * L, max_new_tokens=L, predicted=pred, **options)
                dense = run_multiturn(groups, turns, policy, **kw)
                bare = run_multiturn(groups, turns, policy, prefix_cache=False, **kw)
                cache = run_multiturn(groups, turns, policy, compression=comp, **kw)
                raw.append({"workload": workload, "pool_x_lmax": pool, "run": label, "cache": [comp.budget,
                                                                                              comp.interval],
                            "dense_seconds": dense.seconds, "no_prefix_cache_seconds": bare.seconds,
                            "cache_seconds": cache.seconds, "dense_cache_hits": dense.cache_hits,
                            "later_turns": dense.later_turns, "dense_prefill_tokens": dense.prefill_tokens,
                            "cache_prefill_tokens": cache.prefill_tokens,
                            "cache_lower_bound_seconds": cache.lower_bound_seconds})
                rows.append([workload, f"{pool} x", label, f"{dense.seconds:.2f}",
                             f"{dense.cache_hits / max(1, dense.later_turns):.2f}", f"{bare.seconds:.2f}",
                             f"{cache.seconds:.2f}", f"{cache.seconds / dense.seconds:.3f}",
                             f"{cache.prefill_tokens / max(1, dense.prefill_tokens):.2f}",
                             f"{cache.seconds / cache.lower_bound_seconds:.3f}"])
    return table(f"Multi-turn steps with a compressed cache ({comp.budget} + {comp.interval}; simulated; {batch} "
                 f"prompts x 16 as sessions of 2-5 turns, tools of median 0.5 s, on {R} replicas, L_max {L}; "
                 "modelled seconds)",
                 ["workload", "pool", "run", "dense s", "dense turns hitting the cache", "dense, no prefix cache s",
                  "cache s", "cache x dense", "cache x dense prefilled", "cache s / LB"], rows), raw


# ------------------------------------------------------------------------------- Prefix Grouper
def _learner_child(spec: str) -> None:
    """Run one learner forward + backward in this process and print its measurements (JSON)."""
    import time

    import torch

    from sampler.cli import load_model
    from sampler.prefix_grouper import grouped_logprobs, naive_logprobs

    s = json.loads(spec)
    model, _ = load_model(s["model"], s["dtype"], s["device"])
    rng = np.random.default_rng(0)
    prompt = list(rng.integers(0, 200, s["P"]))
    comps = [list(rng.integers(0, 200, s["l"])) for _ in range(s["G"])]
    fn = grouped_logprobs if s["grouped"] else naive_logprobs
    fn(model, prompt[:8], [c[:2] for c in comps[:2]])  # warm up (attention registration, first calls)
    times = []
    for _ in range(s["reps"]):
        model.zero_grad()
        if model.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        lp = fn(model, prompt, comps)
        torch.stack([x.sum() for x in lp]).sum().backward()
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() if model.device.type == "cuda" else \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": statistics.median(times), "peak_bytes": peak}))


def learner(args: argparse.Namespace) -> tuple[str, list]:
    from lengthsched import learner_tokens

    rows, raw = [], []
    for g in args.learner_groups:
        for p in args.learner_prompts:
            res = {}
            for grouped in (False, True):
                spec = json.dumps({"G": g, "P": p, "l": args.learner_new, "grouped": grouped, "reps": args.reps,
                                   "model": args.model, "dtype": args.dtype, "device": args.device})
                out = subprocess.run([sys.executable, __file__, "--child", spec], capture_output=True, text=True,
                                     check=True)
                res[grouped] = json.loads(out.stdout.strip().splitlines()[-1])
            lengths = [args.learner_new] * g
            rows.append([g, p, args.learner_new, learner_tokens(p, lengths, grouped=False),
                         learner_tokens(p, lengths, grouped=True), round(res[False]["seconds"], 3),
                         round(res[True]["seconds"], 3), round(res[False]["seconds"] / res[True]["seconds"], 2),
                         round(res[False]["peak_bytes"] / 2**20), round(res[True]["peak_bytes"] / 2**20)])
            raw.append({"G": g, "P": p, "naive": res[False], "grouped": res[True]})
    peak = "CUDA max allocated" if str(args.device or "").startswith("cuda") else \
        "process peak resident memory on the CPU"
    return table(f"Prefix Grouper: learner forward + backward of one group against G naive rows ({args.model}, "
                 f"{args.dtype}, {args.device or 'default device'}; median of {args.reps}; peak = {peak}, "
                 f"each run in its own process)",
                 ["G", "prompt tokens", "tokens per completion", "naive tokens", "grouped tokens", "naive s",
                  "grouped s", "speed-up", "naive peak MiB", "grouped peak MiB"], rows), raw


def int_list(text: str) -> list[int]:
    """A flag's comma-separated integers (argparse ``type``: applied to the string defaults too)."""
    return [int(x) for x in text.split(",")]


def float_list(text: str) -> list[float]:
    """A flag's comma-separated numbers."""
    return [float(x) for x in text.split(",")]


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _learner_child(sys.argv[2])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--model", default=TINY_MODEL, help="a model of `lengthsched sample`: tiny-qwen3, "
                    "random-qwen3-0.6b, random-qwen3-1.7b (random weights, real shapes) or a HF name / directory")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--device", default=None)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--sections",
                    default="sgpo,sgpo_online,sgpo_targets,sgpo_masked,sgpo_policies,sparse,sparse_budget,sparse_admission,sparse_rollout,sparse_window,"
                            "sparse_crowding,sparse_sglang_room,sparse_async,sparse_oversample,sparse_multiturn,"
                            "learner")
    ap.add_argument("--sparse-new", type=int, default=2048, help="tokens per sparse-rollout sequence")
    ap.add_argument("--sparse-group", type=int, default=8, help="sequences of the sparse rollouts")
    ap.add_argument("--sparse-budgets", type=int_list, default="256,512,1024",
                    help="KV budgets (generated tokens) of the sparse rollouts")
    ap.add_argument("--sparse-interval", type=int, default=32, help="compression interval (tokens)")
    ap.add_argument("--budget-group", type=int, default=16, help="completions of the measured budget section")
    ap.add_argument("--budget-pool", type=int, default=2, help="KV tokens of its budget, x L_max (--sparse-new)")
    ap.add_argument("--budget-policies", default="fixed_slot,length_aware",
                    help="policies of the measured budget section")
    ap.add_argument("--admission-workloads", default="castillo,lmsys",
                    help="workloads of the admission grid (lmsys: the long-tail one, log-sd 1.0 within a group)")
    ap.add_argument("--admission-groups", type=int, default=200, help="groups per workload of the admission grid")
    ap.add_argument("--admission-pools", type=int_list, default="1,2,4",
                    help="KV pools of the admission grid, x L_max per group")
    ap.add_argument("--admission-caches", default="1024:64,512:32,256:32",
                    help="compressed caches of the admission grid, BUDGET:INTERVAL (tokens)")
    ap.add_argument("--admission-policies", default="vllm,length_aware,growth_aware,micro,fixed_slot,sglang",
                    help="policies of the admission grid")
    ap.add_argument("--admission-max-new", type=int, default=4096, help="L_max of the admission and rollout grids")
    ap.add_argument("--rollout-prompts", type=int, default=256, help="prompts of the compressed rollout step")
    ap.add_argument("--rollout-replicas", type=int, default=8, help="replicas of the compressed rollout step")
    ap.add_argument("--rollout-pools", type=int_list, default="2,4,8",
                    help="each replica's pool, x L_max, of the rollout step")
    ap.add_argument("--rollout-seeds", type=int_list, default="11,12",
                    help="draws (workload seeds) of the rollout step")
    ap.add_argument("--window-prompts", type=int_list, default="64,256",
                    help="prompts of the client-window section's steps")
    ap.add_argument("--window-replicas", type=int_list, default="4,8", help="replicas of the client-window section")
    ap.add_argument("--window-pools", type=int_list, default="2,8,16",
                    help="each replica's pool, x L_max, of the client-window section")
    ap.add_argument("--crowding-pools", type=int_list, default="2,4,8,16,64",
                    help="each replica's pool, x L_max, of the crowding section")
    ap.add_argument("--async-prompts", type=int, default=64, help="prompts per learner step, asynchronous section")
    ap.add_argument("--async-steps", type=int, default=4, help="learner steps of the asynchronous section")
    ap.add_argument("--async-replicas", type=int, default=4, help="replicas of the asynchronous section")
    ap.add_argument("--async-pools", type=int_list, default="2,8",
                    help="each replica's pool, x L_max, of the asynchronous section")
    ap.add_argument("--multiturn-prompts", type=int, default=128, help="prompts of the multi-turn section's step")
    ap.add_argument("--oversample", type=float, default=1.5,
                    help="groups submitted per group kept, over-sampled section (slime's over-sampling batch)")
    ap.add_argument("--window-cache", default="256:32", help="the client-window section's cache, BUDGET:INTERVAL")
    ap.add_argument("--learner-groups", type=int_list, default="8,16,32", help="G values of the learner grid")
    ap.add_argument("--learner-prompts", type=int_list, default="512,1024,2048,4096",
                    help="prompt lengths of the learner grid")
    ap.add_argument("--learner-new", type=int, default=64, help="tokens per completion of the learner grid")
    ap.add_argument("--sgpo-prompts", type=int, default=512, help="prompts of the online sGPO section's data set")
    ap.add_argument("--sgpo-epochs", type=int, default=4, help="epochs of the online sGPO section")
    ap.add_argument("--sgpo-batch", type=int, default=64, help="prompts per step (x 16 completions) of that section")
    ap.add_argument("--sgpo-pool", type=int, default=16, help="each replica's pool, x L_max, of that section")
    ap.add_argument("--sgpo-learn", type=float_list, default="0,1",
                    help="log-odds gained per epoch (x U(0, 1) per prompt) of that section")
    ap.add_argument("--sgpo-targets", type=float_list, default="0.5,0.7,0.8,0.9,0.95",
                    help="the informative rule's targets of the sgpo_targets section")
    ap.add_argument("--sgpo-policy-pools", type=int_list, default="4,16",
                    help="each replica's pool, x L_max, of the sgpo_policies section")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "companions.json"))
    args = ap.parse_args()
    args.budget_policies = args.budget_policies.split(",")
    args.admission_workloads = args.admission_workloads.split(",")
    args.admission_caches = [KVCompression.parse(c, "admission_caches") for c in args.admission_caches.split(",")]
    args.admission_policies = args.admission_policies.split(",")
    args.window_cache = KVCompression.parse(args.window_cache, "window_cache")
    if args.quick:
        args.sparse_budgets, args.sparse_interval, args.sparse_new, args.sparse_group = [8, 16], 4, 40, 2
        args.learner_groups, args.learner_prompts, args.learner_new, args.reps = [2], [16], 4, 1
        args.admission_groups, args.admission_pools, args.admission_caches = 3, [1], [KVCompression(256, 32)]
        args.admission_policies = ["vllm", "fixed_slot"]
        args.rollout_prompts, args.rollout_replicas, args.rollout_pools, args.rollout_seeds = 8, 2, [2], [11]
        args.window_prompts, args.window_replicas, args.window_pools, args.crowding_pools = [8], [2], [2], [1, 2]
        args.async_prompts, args.async_steps, args.async_replicas, args.async_pools = 4, 2, 2, [2]
        args.multiturn_prompts = 4
        args.sgpo_prompts, args.sgpo_epochs, args.sgpo_batch, args.sgpo_learn = 24, 2, 8, [1.0]
        args.sgpo_policy_pools, args.sgpo_targets = [4], [0.9]
        args.budget_group, args.budget_policies = 4, ["fixed_slot"]
    results = {"machine": machine(), "command": " ".join(["python", *sys.argv]), "model": args.model,
               "dtype": args.dtype, "device": device_name(args.device), "complete": False}
    texts, raw = run_sections(ap, args, {"sgpo": sgpo, "sgpo_online": sgpo_online, "sgpo_targets": sgpo_targets,
                                         "sgpo_masked": sgpo_masked, "sgpo_policies": sgpo_policies, "sparse": sparse,
                                         "sparse_budget": sparse_budget,
                                         "sparse_admission": sparse_admission, "sparse_rollout": sparse_rollout,
                                         "sparse_window": sparse_window, "sparse_crowding": sparse_crowding,
                                         "sparse_sglang_room": sparse_sglang_room, "sparse_async": sparse_async,
                                         "sparse_oversample": sparse_oversample, "sparse_multiturn": sparse_multiturn,
                                         "learner": learner},
                              checkpoint=lambda partial: write_json(args.out, {**results, **partial}))
    results.update(raw, complete=True)
    import torch

    report(results, texts, args.out, f"torch {torch.__version__}, model {args.model} {args.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
