"""Simulator benchmarks: speed, the CASTILLO target, the paper's headline ratios, shared budgets.

    python benchmarks/bench_simulate.py            # full run (a few minutes on 2 cores)
    python benchmarks/bench_simulate.py --quick    # smoke run, what the test suite executes

Markdown tables go to stdout, raw numbers to ``--out`` (default benchmarks/results/simulate.json).
The speed section pins itself to one core; the others use every core.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
from common import ROOT, machine, patched, pin_one_core, report, table, unpin

from lengthsched import InvalidArgument, ModelMemory, NoisyOracleLengthPredictor
from lengthsched.integrations.verl_stealing import RESUBMIT_ESTIMATE_SECONDS, StealOptions
from lengthsched.runtime.timing import lower_bound_seconds
from simulate import POLICIES, run_batch, run_group, run_rollout, run_slime_planned, run_slime_planned_in_order
from simulate.async_report import AREAL_INTEGRATION, INTEGRATION
from simulate.compiled import COMPILED_POLICIES, engine_many
from simulate.fast import steps_and_peaks
from simulate.multiturn import MULTITURN_RUNS
from simulate.rollout import VERL_POLL_SECONDS, route, run_verl_planned, run_verl_stealing, steal_ways
from simulate.workloads import castillo_file_groups, castillo_groups, prompt_lengths, trace_groups


# ---------------------------------------------------------------------------------------- speed
def speed(quick: bool) -> tuple[str, list]:
    pin_one_core()
    rows = []
    lmax = 4096
    for size in (32, 128, 1024):
        count = max(2, (2000 if quick else 20000) // size)
        groups = castillo_groups(size, limit=count, seed=1, max_new_tokens=lmax)
        budget = 8 * lmax
        for policy in POLICIES:
            slots = 8 if policy in ("micro", "fixed_slot", "dynamic_slot") else None
            rates = []
            for _ in range(1 if quick else 3):
                start = time.perf_counter()
                for g in groups:
                    run_group(g.lengths, policy, budget_tokens=budget, max_new_tokens=lmax, prompt_len=g.prompt_len,
                              predicted=g.lengths, slots=slots)
                rates.append(count * size / (time.perf_counter() - start))
            rows.append([size, policy, "engine", round(statistics.median(rates))])
        batch = np.stack([g.lengths for g in castillo_groups(size, limit=max(2, (20000 if quick else 400000) // size),
                                                                 seed=2, max_new_tokens=lmax)])
        for policy in ("full", "micro", "fixed_slot", "reserve_max"):
            rates = []
            for _ in range(1 if quick else 3):
                start = time.perf_counter()
                steps_and_peaks(batch, policy, 8)
                rates.append(batch.size / (time.perf_counter() - start))
            rows.append([size, policy, "fast (vectorised)", round(statistics.median(rates))])
        for policy in COMPILED_POLICIES:
            rows.append([size, policy, "compiled (1 thread)", _compiled_rate(size, policy, 1, quick)])
    return table("Simulated completions per second, one core (CASTILLO lengths, L_max 4096, budget 8 x L_max "
                 "KV tokens, 8 slots for micro / fixed / dynamic; fast = simulate.fast incl. peak KV; compiled = "
                 "simulate.compiled, Numba)", ["G", "policy", "path", "completions / s"], rows), rows


def _compiled_rate(size: int, policy: str, threads: int, quick: bool) -> int:
    """Completions per second of simulate.compiled.engine_many (median of 3, after a compiling call)."""
    import numba

    lmax = 4096
    groups = castillo_groups(size, limit=max(2, (20000 if quick else 400000) // size), seed=2, max_new_tokens=lmax)
    batch = np.stack([g.lengths for g in groups])
    prompts = np.array([g.prompt_len for g in groups])
    numba.set_num_threads(threads)
    args = dict(budget_tokens=8 * lmax, max_new_tokens=lmax)
    engine_many(batch[:2], policy, prompt_lens=prompts[:2], **args)  # compile (or load the cache)
    rates = []
    for _ in range(1 if quick else 3):
        start = time.perf_counter()
        engine_many(batch, policy, prompt_lens=prompts, **args)
        rates.append(batch.size / (time.perf_counter() - start))
    return round(statistics.median(rates))


def scaling(quick: bool) -> tuple[str, list]:
    """The compiled engine baselines on 1..all cores (groups spread over Numba threads)."""
    unpin()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    rows = []
    for size in (32, 1024):
        for policy in COMPILED_POLICIES:
            base = None
            for threads in sorted({1, cores}):
                rate = _compiled_rate(size, policy, threads, quick)
                base = base or rate
                rows.append([size, policy, threads, rate, round(rate / base, 2)])
    return table("Compiled engine baselines (simulate.compiled) across threads: completions per second (CASTILLO "
                 "lengths, L_max 4096, budget 8 x L_max KV tokens)",
                 ["G", "policy", "threads", "completions / s", "x 1 thread"], rows), rows


# ---------------------------------------------------------------------------------------- target
TARGET_POLICIES = ("micro", "fixed_slot", "length_aware", "growth_aware", "growth_aware_lpt", "vllm", "sglang",
                   "reserve_max", "full_freed")


def _target_unit(args):
    lengths, prompt_len, lmax, sigma, seed, policies = args
    if sigma == 0:
        predicted = lengths
    else:
        predicted = NoisyOracleLengthPredictor(lengths, sigma=sigma, seed=seed)
    out = {}
    for p in policies:
        r = run_group(lengths, p, budget_tokens=8 * lmax, max_new_tokens=lmax, prompt_len=prompt_len,
                      predicted=predicted, seed=seed)
        out[p] = (r.steps, r.lower_bound, r.preemptions, r.recomputed_tokens, r.peak_kv_tokens)
    return out


def _pool_map(fn, units):
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1, initializer=_set_max_seqs,
                             initargs=(ROLLOUT_MAX_SEQS,)) as pool:
        return list(pool.map(fn, units, chunksize=max(1, len(units) // 64)))


def _set_max_seqs(value: int | None) -> None:
    """In a worker process: the --max-num-seqs of the run that started it."""
    global ROLLOUT_MAX_SEQS
    ROLLOUT_MAX_SEQS = value


def target(quick: bool) -> tuple[str, list]:
    rows = []
    limit = 40 if quick else None
    for lmax in (1024, 4096):
        groups = castillo_groups(32, max_new_tokens=lmax, limit=limit, seed=0)
        for sigma in ((0.0,) if quick else (0.0, 0.25, 0.5, 1.0)):
            policies = TARGET_POLICIES if sigma == 0 else ("micro", "length_aware", "growth_aware")
            results = _pool_map(_target_unit, [(g.lengths, g.prompt_len, lmax, sigma, i, policies)
                                               for i, g in enumerate(groups)])
            micro = np.mean([r["micro"][0] for r in results])
            for p in policies:
                steps = np.array([r[p][0] for r in results], dtype=float)
                rows.append([lmax, "oracle" if sigma == 0 else f"noisy sigma={sigma}", p, len(groups),
                             float(steps.mean() / micro), float(np.mean(steps / [r[p][1] for r in results])),
                             float(np.mean([r[p][2] for r in results])), float(np.mean([r[p][3] for r in results]))])
    return table("CASTILLO groups, G = 32, budget = 8 x L_max KV tokens: mean steps relative to naive micro groups "
                 "(g = budget // L_max = 8)",
                 ["L_max", "predictor", "policy", "groups", "steps / micro", "steps / LB", "preemptions",
                  "recomputed tokens"], rows), rows


# ---------------------------------------------------------------------------------------- seconds
SECONDS_POLICIES = ("micro", "fixed_slot", "length_aware", "growth_aware", "growth_aware_lpt", "vllm", "sglang",
                    "reserve_max")
SECONDS_MODELS = ("qwen3-1.7b", "qwen3-8b")


def _seconds_unit(args):
    """One group under every policy; its step log priced for every model (the decisions, made in
    KV tokens, do not depend on the model: only the price of each step does)."""
    lengths, prompt_len, lmax, sigma, seed, costs = args
    predicted = lengths if sigma == 0 else NoisyOracleLengthPredictor(lengths, sigma=sigma, seed=seed)
    out = {}
    for p in SECONDS_POLICIES:
        r = run_group(lengths, p, budget_tokens=8 * lmax, max_new_tokens=lmax, prompt_len=prompt_len,
                      predicted=predicted, seed=seed, cost=costs[0])
        priced = [r.seconds] + [r.step_log.seconds(c) for c in costs[1:]]
        bounds = [lower_bound_seconds(c, lengths, context=prompt_len, steps=r.lower_bound, prompt_lens=[prompt_len])
                  for c in costs]
        out[p] = (priced, bounds, r.steps, r.lower_bound, r.preemptions, r.recomputed_tokens)
    return out


def _time_stats(results: list, policies: tuple, m: int) -> dict[str, list]:
    """Per policy, priced for model m: mean seconds, x vllm, mean seconds / LB, rank by seconds, rank
    by steps, mean steps / LB (``results``: per unit, policy -> (seconds per model, bounds per model,
    steps, step bound, ...))."""
    secs = {p: np.array([r[p][0][m] for r in results]) for p in policies}
    steps = {p: np.array([r[p][2] for r in results], dtype=float) for p in policies}
    by_secs = sorted(policies, key=lambda p: secs[p].mean())
    by_steps = sorted(policies, key=lambda p: steps[p].mean())
    return {p: [float(secs[p].mean()), float(secs[p].mean() / secs["vllm"].mean()),
                float(np.mean(secs[p] / [r[p][1][m] for r in results])), by_secs.index(p) + 1,
                by_steps.index(p) + 1, float(np.mean(steps[p] / [r[p][3] for r in results]))]
            for p in policies}


def seconds(quick: bool) -> tuple[str, list]:
    """The CASTILLO table in modelled seconds (H100 preset) for Qwen3-1.7B and Qwen3-8B."""
    from lengthsched.cost import StepCost

    costs = tuple(StepCost.from_model(m, "h100") for m in SECONDS_MODELS)
    rows = []
    limit = 40 if quick else None
    for lmax in (1024, 4096):
        groups = castillo_groups(32, max_new_tokens=lmax, limit=limit, seed=0)
        for sigma in ((0.0,) if quick else (0.0, 0.5)):
            results = _pool_map(_seconds_unit, [(g.lengths, g.prompt_len, lmax, sigma, i, costs)
                                                for i, g in enumerate(groups)])
            for m, model in enumerate(SECONDS_MODELS):
                for p, stats in _time_stats(results, SECONDS_POLICIES, m).items():
                    rows.append([model, lmax, "oracle" if sigma == 0 else f"noisy sigma={sigma}", p, len(groups),
                                 *stats, float(np.mean([r[p][4] for r in results])),
                                 float(np.mean([r[p][5] for r in results]))])
    return table("CASTILLO groups in modelled seconds (H100 preset, unfitted), G = 32, budget = 8 x L_max KV tokens, "
                 "prefill chunk 8192: mean seconds per group, ranks by seconds and by steps",
                 ["model", "L_max", "predictor", "policy", "groups", "seconds", "x vllm", "seconds / LB",
                  "rank (seconds)", "rank (steps)", "steps / LB", "preemptions", "recomputed tokens"], rows), rows


BATCH_POLICIES = ("micro", "fixed_slot", "length_aware", "growth_aware", "growth_aware_lpt", "vllm", "sglang")


def _seconds_batch_unit(args):
    """A batch of prompts sharing one budget under every policy, priced for every model."""
    groups, lmax, factor, costs = args
    lengths = np.concatenate([g.lengths for g in groups])
    prompts = np.concatenate([np.full(len(g.lengths), g.prompt_len) for g in groups])
    out = {}
    for p in BATCH_POLICIES:
        r = run_batch(groups, p, budget_tokens=factor * lmax, max_new_tokens=lmax, predicted=lengths, cost=costs[0])
        priced = [r.seconds] + [r.step_log.seconds(c) for c in costs[1:]]
        bounds = [lower_bound_seconds(c, lengths, context=prompts, steps=r.lower_bound,
                                      prompt_lens=[g.prompt_len for g in groups]) for c in costs]
        out[p] = (priced, bounds, r.steps, r.lower_bound, r.preemptions, r.recomputed_tokens, r.tokens)
    return out


def seconds_batches(quick: bool) -> tuple[str, list]:
    """Batches of 16 prompts x G = 16 under a tight shared budget, where preemption is frequent."""
    from lengthsched.cost import StepCost

    costs = tuple(StepCost.from_model(m, "h100") for m in SECONDS_MODELS)
    lmax, size, per = 4096, 16, 16
    groups = castillo_groups(size, max_new_tokens=lmax, limit=(2 if quick else 30) * per, seed=7)
    batches = [groups[i:i + per] for i in range(0, len(groups) - per + 1, per)]
    rows = []
    for factor in ((2,) if quick else (2, 4)):
        results = _pool_map(_seconds_batch_unit, [(b, lmax, factor, costs) for b in batches])
        for m, model in enumerate(SECONDS_MODELS):
            for p, stats in _time_stats(results, BATCH_POLICIES, m).items():
                rows.append([model, f"{factor} x L_max", p, len(batches), *stats,
                             float(np.mean([r[p][5] for r in results])),
                             float(np.mean([r[p][5] / r[p][6] for r in results]))])
    return table("Batches of 16 CASTILLO prompts x G = 16 under one shared KV budget (L_max 4096, oracle lengths, "
                 "H100 preset): mean modelled seconds per batch, ranks by seconds and by steps",
                 ["model", "budget", "policy", "batches", "seconds", "x vllm", "seconds / LB", "rank (seconds)",
                  "rank (steps)", "steps / LB", "recomputed tokens", "recomputed / generated"], rows), rows


# ---------------------------------------------------------------------------------------- rollout
ROLLOUT_RUNS = (  # (label, policy, router, predictions)
    ("vllm + verl routing", "vllm", "least_loaded", None),
    ("vllm + group round robin", "vllm", "group_round_robin", None),
    ("vllm_priority + verl routing", "vllm_priority", "least_loaded", "realistic"),
    ("vllm_priority + verl routing (oracle)", "vllm_priority", "least_loaded", "oracle"),
    ("sglang + verl routing", "sglang", "least_loaded", None),
    ("sglang_priority + verl routing", "sglang_priority", "least_loaded", "realistic"),
    ("seer", "seer", None, None),
    ("placed_adaptive", "placed_adaptive", None, "realistic"),
    ("steal", "steal", None, "realistic"),
    ("steal (constant)", "steal", None, "constant"),
    ("steal (oracle)", "steal", None, "oracle"),
    ("placed_classes", "placed_classes", None, "realistic"),
    ("vllm_priority + verl routing (previous epoch)", "vllm_priority", "least_loaded", "epoch"),
    ("steal (previous epoch)", "steal", None, "epoch"),
    ("placed_classes (previous epoch)", "placed_classes", None, "epoch"),
    ("steal_classes (previous epoch)", "steal_classes", None, "epoch"),
    ("recommended (previous epoch)", "recommended", None, "epoch"),
)
# Timed by rollout_speed beside ROLLOUT_RUNS, so that every rollout policy of the registry is timed (not in
# the grid's tables: rollout_variants scores steal_observed, rollout_seer seer_divided, rollout_classes the
# classes; placed_lpt, whole groups by the FPTAS, is scored on the group-level tables)
SPEED_EXTRA = (("steal_observed", "steal_observed", None, "realistic"),
               ("steal_classes", "steal_classes", None, "realistic"),
               ("seer_divided", "seer_divided", None, None),
               ("placed_lpt", "placed_lpt", None, "realistic"),
               ("steal_longest", "steal_longest", None, "realistic"),
               ("steal_sglang", "steal_sglang", None, "realistic"))
ROLLOUT_GRID = [(w, b, r, f) for w in ("castillo", "long tail") for b in (16, 64, 256) for r in (1, 4, 8)
                for f in (2, 4, 8, 16, 64)]
CONSTANT_PREDICTION = 300  # tokens, every completion: a predictor that knows nothing of the prompt


def rollout_groups(workload: str, prompts: int, seed: int, size: int = 16, lmax: int = 4096, epoch: int = 0):
    """(groups, realistic, oracle, constant predictions) of one rollout setting: CASTILLO groups (the
    bundled train and validate prompts) or the long-tail workload (LMSYS prompt medians, within-group
    log-sd 1.0, as reasoning RL at temperature 1); realistic = a prompt-level predictor of log-normal
    error sigma 0.5 on the prompt's median, the same for all siblings. ``epoch``: the same prompts
    with fresh completions (the realistic predictions stay those of epoch 0's draw of the error)."""
    if workload == "castillo":
        groups = castillo_groups(size, max_new_tokens=lmax, limit=prompts, seed=seed, epoch=epoch)
    elif workload.startswith("file:"):  # --groups-file: a CASTILLO file of held-out prompts
        groups = castillo_file_groups(workload[5:], size, max_new_tokens=lmax, limit=prompts, seed=seed, epoch=epoch)
    else:  # "long tail" (the lmsys trace: prompts of 0 tokens) or long_tail_workload(...)'s name
        given = workload.partition(" + ")[2]
        value = given.removesuffix(" prompts").removesuffix("-token")
        if workload.partition(" + ")[0] != "long tail" or (given and not given.endswith(" prompts")):
            raise InvalidArgument("workload", workload, "'long tail', 'long tail + castillo prompts' or "
                                                        "'long tail + N-token prompts'")
        tokens = prompt_lengths(value) if given else None
        groups = trace_groups("lmsys", size, max_new_tokens=lmax, limit=prompts, seed=seed, spread=1.0, epoch=epoch,
                              prompt_tokens=tokens)
    rng = np.random.default_rng(seed)
    oracle = np.concatenate([g.lengths for g in groups])
    realistic = np.concatenate([np.full(len(g.lengths), max(1, int(np.median(g.lengths)
                                                                    * np.exp(0.5 * rng.standard_normal()))))
                                for g in groups])
    return groups, realistic, oracle, np.full(len(oracle), CONSTANT_PREDICTION)


def previous_epoch_prediction(workload: str, prompts: int, seed: int, groups, realistic, lmax: int = 4096):
    """(per completion, what :class:`lengthsched.OnlineLengthPredictor` predicts at the start of a
    step after it saw every sibling of the same prompts one epoch earlier; that epoch's groups).
    ``epoch=1``: fresh completions of the same prompts; the predictor's laws fitted on them, the
    realistic prompt-level predictions as its prior. The same number for all siblings (nothing of
    this step is revealed yet)."""
    from simulate.workloads import history_predictions

    before = rollout_groups(workload, prompts, seed, size=len(groups[0].lengths), lmax=lmax, epoch=1)[0]
    prior = {g.prompt_id: float(realistic[i * len(g.lengths)]) for i, g in enumerate(groups)}
    return history_predictions(groups, before, prior, max_new_tokens=lmax), before


ROLLOUT_COST: str | None = None  # --cost: a fitted StepCost JSON (its text) instead of the default model
ROLLOUT_SEED = 11  # --seed: which prompts (and completions, and prediction errors) the rollout sections draw
ROLLOUT_MAX_SEQS: int | None = None  # --max-num-seqs: requests each replica runs at once at most (None: no cap)


def _rollout_cost(text: str | None):
    from lengthsched.cost import StepCost

    return None if text is None else StepCost.from_json(text)


def _cost_label() -> str:
    """What prices the rollout sections: the default, or the --cost file's model and card."""
    cap = "" if ROLLOUT_MAX_SEQS is None else f", max_num_seqs {ROLLOUT_MAX_SEQS}"
    if ROLLOUT_COST is None:
        return "Qwen3-1.7B, H100 preset" + cap
    cost = _rollout_cost(ROLLOUT_COST)
    return f"{cost.model.split('/')[-1]}, step cost fitted on {cost.gpu.upper()} steps (--cost)" + cap


def long_tail_workload(prompts: str) -> str:
    """The name of the long-tail workload with prompts (``--long-tail-prompts``: "castillo" or a number of
    tokens, checked by :func:`simulate.workloads.prompt_lengths`) that :func:`rollout_groups` builds."""
    prompt_lengths(prompts)
    return "long tail + " + ("castillo prompts" if prompts.strip() == "castillo" else f"{int(prompts)}-token prompts")


def _rollout_setting(workload: str, prompts: int, replicas: int, factor: int, seed: int, cost_text: str | None):
    """(groups, realistic, oracle, constant predictions, run_rollout's keyword arguments) of one setting
    of the rollout grid: L_max 4096, a pool of ``factor`` x L_max per replica, the --cost model."""
    lmax = 4096
    groups, realistic, oracle, constant = rollout_groups(workload, prompts, seed, lmax=lmax)
    common = dict(replicas=replicas, budget_tokens=factor * lmax, max_new_tokens=lmax, cost=_rollout_cost(cost_text),
                  max_num_seqs=ROLLOUT_MAX_SEQS)
    return groups, realistic, oracle, constant, common


# slime as it ships, then the runs of slime's SGLang engines compared with it in rollout_routers' second table
SLIME_ROWS = ("slime: sglang + cache-aware router", "slime + lengthsched's plan (lengthsched.integrations.slime)",
              "slime + lengthsched's plan, groups longest first on one replica too",
              "slime + lengthsched's plan, groups in batch order",
              "slime + lengthsched's plan, every sample sent at once (no client window)", "steal over SGLang engines",
              "sglang + verl routing")
# The "routers" of the runs that model slime with lengthsched.integrations.slime (simulate.run_slime_planned):
# the integration's plan ("ways" placement), the groups handed to slime as its default does (longest predicted first
# on several replicas, in batch order on one), longest first everywhere, or in batch order
# and through the integration's client window (its default) or with every sample sent at once (window 0)
SLIME_PLANS = {"plan": ("auto", None), "plan_longest": ("longest", None), "plan_batch": ("batch", None),
               "plan_at_once": ("auto", 0.0)}


def _rollout_unit(args, runs=ROLLOUT_RUNS):
    """Every run of ``runs`` on one setting: label -> (seconds, lower bound, slowest share, recomputed /
    generated, recomputed tokens, wall seconds of the simulation), or None where the policy fails."""
    from lengthsched.placement import recommend_rollout_policy

    groups, realistic, oracle, constant, common = _rollout_setting(*args)
    out = {}
    known = {"oracle": oracle, "realistic": realistic, "constant": constant, None: None}
    for label, policy, router, pred in runs:
        if pred not in known:  # "epoch": what the online predictor knows after one earlier epoch
            known[pred], before = previous_epoch_prediction(args[0], args[1], args[4], groups, realistic)
            recommended = recommend_rollout_policy([g.lengths for g in before])
        if policy == "recommended":  # what that history recommends (lengthsched.placement): a run above
            out[label] = out[f"{recommended} (previous epoch)"]
            continue
        p = known[pred]
        extra = {}
        if router is not None and "@" in router:  # "router@k": a framework keeping k requests per replica in flight
            router, per = router.split("@")
            extra["in_flight"] = int(per) * args[2]
        try:
            start = time.perf_counter()
            if router in SLIME_PLANS:  # slime with lengthsched.integrations.slime's plan (SGLang engines)
                submit, window = SLIME_PLANS[router]
                r, _ = run_slime_planned(groups, p, submit=submit, window=window, **common, **extra)
            else:
                r = run_rollout(groups, policy, router=router, predicted=p, **common, **extra)
            out[label] = (r.seconds, r.lower_bound_seconds, r.slowest_share, r.recomputed_tokens / r.tokens,
                          r.recomputed_tokens, time.perf_counter() - start)
        except Exception:  # a pool too small for the policy (sglang's reservation refuses a tight pool)
            out[label] = None
    return out


def rollout(quick: bool) -> tuple[str, list]:
    """Rollout steps (B prompts x 16 on R replicas) in modelled seconds, per policy and router."""
    grid = [("castillo", 16, 4, 4), ("castillo", 64, 4, 16)] if quick else ROLLOUT_GRID
    rows = _rollout_rows(grid)
    summary = _rollout_summary(rows)
    default_grid = ROLLOUT_GRID[-1][0] == "long tail"  # not given prompts (--long-tail-prompts)
    if not quick and ROLLOUT_COST is None and ROLLOUT_SEED == 11 and ROLLOUT_MAX_SEQS is None and default_grid:
        _rollout_figure(rows, ROOT / "docs" / "figures" / "rollout_lower_bound.png")
    text = table(f"Rollout steps in modelled seconds ({_cost_label()}, L_max 4096, G = 16, budget per replica "
                 "with the prompts inside): makespan per policy and router",
                 ["workload", "prompts", "replicas", "budget", "policy", "seconds", "x vllm + verl",
                  "seconds / LB", "slowest share", "recomputed / generated", "recomputed x vllm"], rows)
    return summary[0] + "\n\n" + text, {"rows": rows, "summary": summary[1]}


# Steps at the scale of RL training runs, beyond the issue's grid: 512 and 1024 prompts x 16 on 16 and 32
# replicas. The grid's baselines and policies, without the rows that only ask what predictions buy
# (constant, oracle priority, placed_classes) or that lose everywhere (SGLang's FCFS), plus Seer's divided
# rollout and steal as a framework runs it (steal_observed).
SCALE_RUNS = tuple(run for run in ROLLOUT_RUNS if run[0] in (
    "vllm + verl routing", "vllm + group round robin", "vllm_priority + verl routing",
    "sglang_priority + verl routing", "seer", "steal", "steal (oracle)",
    "vllm_priority + verl routing (previous epoch)", "steal (previous epoch)", "steal_classes (previous epoch)",
    "recommended (previous epoch)")) + (("seer_divided", "seer_divided", None, None),
                                        ("steal_observed", "steal_observed", None, "realistic"))
SCALE_GRID = [(w, b, r, f) for w in ("castillo", "long tail") for b in (512, 1024) for r in (16, 32)
              for f in (4, 16, 64)]
SCALE_COLUMNS = ["workload", "prompts", "replicas", "budget", "policy", "seconds", "x vllm + verl", "seconds / LB",
                 "slowest share", "recomputed / generated", "recomputed x vllm", "wall seconds"]


def rollout_scale(quick: bool) -> tuple[str, list]:
    """Rollout steps as large RL runs take them (B = 512 and 1024 prompts x 16 on R = 16 and 32
    replicas), per policy, in modelled seconds, with the wall seconds each simulation took."""
    grid = [("castillo", 64, 16, 4)] if quick else SCALE_GRID
    rows = _rollout_rows(grid, SCALE_RUNS, wall=True)
    summary = _rollout_summary(rows, SCALE_RUNS)
    text = table(f"Rollout steps at scale in modelled seconds ({_cost_label()}, L_max 4096, G = 16, budget per "
                 "replica with the prompts inside): makespan per policy and router", SCALE_COLUMNS, rows)
    return summary[0] + "\n\n" + text, {"rows": rows, "summary": summary[1]}


WATERMARKS = (None, 3.0, 2.0, 1.5, 1.2, 1.0)  # steal's admission watermark, x the pool (None: vLLM's eager rule)


def _rollout_watermark_unit(args):
    from lengthsched.runtime.dispatch import WorkStealing

    groups, realistic, oracle, _, common = _rollout_setting(*args)
    base = run_rollout(groups, "vllm", **common)
    out = {"base": (base.seconds, base.recomputed_tokens)}
    for name, pred in (("realistic", realistic), ("oracle", oracle)):
        for w in WATERMARKS:
            with patched(WorkStealing, WATERMARK=w):
                r = run_rollout(groups, "steal", predicted=pred, **common)
            out[(name, w)] = (r.seconds, r.recomputed_tokens)
    return out


def rollout_watermark(quick: bool) -> tuple[str, list]:
    """Recomputation against time: steal with an admission watermark (admit only while the running
    requests' predicted peak KV and the new one's stay under W x the pool), over the rollout grid."""
    grid = [("castillo", 16, 4, 2)] if quick else ROLLOUT_GRID
    results = _pool_map(_rollout_watermark_unit, [(w, b, r, f, ROLLOUT_SEED, ROLLOUT_COST) for w, b, r, f in grid])
    base_recomputed = sum(o["base"][1] for o in results)
    rows = []
    for name in ("realistic", "oracle"):
        for w in WATERMARKS:
            ratios = np.array([o[(name, w)][0] / o["base"][0] for o in results])
            recomputed = sum(o[(name, w)][1] for o in results)
            rows.append([name, "off (vLLM's eager admission)" if w is None else f"{w:g} x pool", len(ratios),
                         float(ratios.mean()), float(ratios.max()), int((ratios > 1 + 1e-9).sum()),
                         float(recomputed / base_recomputed) if base_recomputed else "-"])
    return table(f"Recomputation against time ({_cost_label()}): steal with an admission watermark over the rollout "
                 "grid, relative to vLLM FCFS + verl routing",
                 ["predictions", "watermark", "settings", "mean x vllm + verl", "worst", "settings slower",
                  "recomputed tokens x vllm (all settings)"], rows), rows


# (label, policy, router, predictions, offload) of the rollout_offload section, against vLLM FCFS + verl.
# offload: False (recomputed), "async" (run_rollout's kv_offload=True: loads overlap the decoding, as vLLM's
# OffloadingConnector loads), "stall" (each load charged to the step that admits it: a pessimistic bound) or
# "free" (loads cost nothing: a host link of no latency and unbounded bandwidth, an optimistic bound).
OFFLOAD_RUNS = (
    ("vllm + verl routing, KV offloaded", "vllm", "least_loaded", None, "async"),
    ("vllm + verl routing, KV offloaded, loads as stalls", "vllm", "least_loaded", None, "stall"),
    ("vllm + verl routing, KV offloaded, free loads", "vllm", "least_loaded", None, "free"),
    ("vllm_priority + verl routing, KV offloaded", "vllm_priority", "least_loaded", "realistic", "async"),
    ("seer, KV offloaded", "seer", None, None, "async"),
    ("steal", "steal", None, "realistic", False),
    ("steal, KV offloaded", "steal", None, "realistic", "async"),
    ("steal, KV offloaded, loads as stalls", "steal", None, "realistic", "stall"),
    ("steal, KV offloaded, free loads", "steal", None, "realistic", "free"),
)


def _free_host_link(common: dict) -> dict:
    """``common`` (run_rollout's keyword arguments) with a host link of no latency and unbounded bandwidth:
    KV loads cost no time (the optimistic bound of an engine that loads asynchronously)."""
    from lengthsched.runtime.timing import default_cost

    return dict(common, cost=(common["cost"] or default_cost()).replace(host_bandwidth=1e30, host_latency_seconds=0.0))


def _load_stall_share(r, cost) -> float:
    """The share of the replicas' modelled seconds (summed) that the priced KV loads of rollout ``r`` stall
    their steps: how busy the host link is, and how much a synchronous price can overstate."""
    from lengthsched.runtime.timing import default_cost

    cost = cost or default_cost()
    stalls = sum(float(np.sum(cost.load_seconds(log.loaded_tokens))) for log in r.step_logs)
    total = float(sum(r.replica_seconds))
    return stalls / total if total else 0.0


def _rollout_offload_unit(args):
    """One setting: vLLM FCFS + verl, then every OFFLOAD_RUNS entry: label -> (seconds, recomputed tokens,
    loaded tokens, the share of the replicas' seconds the priced loads stall)."""
    groups, realistic, _, _, common = _rollout_setting(*args)
    base = run_rollout(groups, "vllm", router="least_loaded", **common)
    out = {"base": (base.seconds, base.recomputed_tokens, base.loaded_tokens, 0.0)}
    for label, policy, router, pred, offload in OFFLOAD_RUNS:
        kwargs = _free_host_link(common) if offload == "free" else common
        r = run_rollout(groups, policy, router=router, predicted=realistic if pred else None,
                        kv_offload="stall" if offload == "free" else offload, **kwargs)
        stall = _load_stall_share(r, common["cost"]) if offload == "stall" else None
        out[label] = (r.seconds, r.recomputed_tokens, r.loaded_tokens, stall)
    return out


def rollout_offload(quick: bool) -> tuple[str, list]:
    """KV offloading to host memory (run_rollout(kv_offload=True), vLLM's native CPU offloading): a
    preempted request's KV is loaded back instead of recomputed, over the rollout grid."""
    grid = [("castillo", 16, 4, 2)] if quick else ROLLOUT_GRID
    units = [(w, b, r, f, ROLLOUT_SEED, ROLLOUT_COST) for w, b, r, f in grid]
    results = _pool_map(_rollout_offload_unit, units)
    base_recomputed = sum(o["base"][1] for o in results)
    rows = []
    for label, *_ in OFFLOAD_RUNS:
        summary = _ratio_summary(units, [o[label][0] / o["base"][0] for o in results])
        recomputed, loaded = sum(o[label][1] for o in results), sum(o[label][2] for o in results)
        stalls = [o[label][3] for o in results if o[label][3] is not None]
        rows.append([label] + summary[:5] + [float(recomputed / base_recomputed) if base_recomputed else "-",
                                             float(loaded / base_recomputed) if base_recomputed else "-"]
                    + ([float(np.mean(stalls)), float(np.max(stalls))] if stalls else ["-", "-"]))
    return table(f"KV offloading ({_cost_label()}, seed {ROLLOUT_SEED}): preempted requests' KV loaded back from host "
                 "memory instead of recomputed, over the rollout grid, relative to vLLM FCFS + verl routing (no "
                 "offloading); loads asynchronous (vLLM's), or priced as a stall of the step that admits them, or free",
                 ["run", "settings", "mean x vllm + verl", "mean, several replicas", "worst", "slower by > 0.1%",
                  "recomputed tokens x vllm (all settings)", "loaded tokens x vllm's recomputed",
                  "load stall share, mean", "load stall share, worst"], rows), rows


GROUPS_FILE: str | None = None  # --groups-file: held-out CASTILLO prompts for rollout_heldout


def rollout_heldout(quick: bool) -> tuple[str, list]:
    """The CASTILLO half of the rollout grid on prompts from --groups-file (held out: not the
    bundled train / validate prompts the policies were tuned on)."""
    if GROUPS_FILE is None:
        raise SystemExit("--sections rollout_heldout needs --groups-file (a CASTILLO JSON file)")
    name = "file:" + GROUPS_FILE
    grid = [(name, 16, 4, 4)] if quick else [(name, b, r, f) for _, b, r, f in ROLLOUT_GRID if _ == "castillo"]
    rows = _rollout_rows(grid)
    label = castillo_file_groups(GROUPS_FILE, 1, limit=1)[0].source.split("/")[1] + " (held out)"
    for row in rows:
        row[0] = label
    summary = _rollout_summary(rows)
    text = table(f"Rollout steps on held-out prompts ({Path(GROUPS_FILE).name}; {_cost_label()}, L_max 4096, "
                 "G = 16): makespan per policy and router",
                 ["workload", "prompts", "replicas", "budget", "policy", "seconds", "x vllm + verl",
                  "seconds / LB", "slowest share", "recomputed / generated", "recomputed x vllm"], rows)
    return summary[0] + "\n\n" + text, {"rows": rows, "summary": summary[1], "file": Path(GROUPS_FILE).name}


def _rollout_rows(grid, runs=ROLLOUT_RUNS, *, wall: bool = False) -> list:
    """One row per setting and run: workload, prompts, replicas, budget, label, seconds, x vllm + verl,
    seconds / LB, slowest share, recomputed / generated, recomputed x vllm (and with ``wall`` the wall
    seconds the simulation took)."""
    rows = []
    results = _pool_map(partial(_rollout_unit, runs=runs),
                        [(w, b, r, f, ROLLOUT_SEED, ROLLOUT_COST) for w, b, r, f in grid])
    for (w, b, r, f), out in zip(grid, results):
        base = out["vllm + verl routing"]
        for label, *_ in runs:
            v = out[label]
            rows.append([w, b, r, f"{f} x L_max", label,
                         "fails" if v is None else float(v[0]),
                         "-" if v is None or base is None else float(v[0] / base[0]),
                         "-" if v is None else float(v[0] / v[1]),
                         "-" if v is None else float(v[2]), "-" if v is None else float(v[3]),
                         "-" if v is None or base is None or not base[4] else float(v[4] / base[4])]
                        + ([("-" if v is None else float(v[5]))] if wall else []))
    return rows


def _rollout_figure(rows: list, path) -> None:
    """Makespan / lower bound of every setting, per policy (one dot per setting, one colour per workload)."""
    from simulate.plots import pyplot, save_figure

    plt = pyplot()

    labels = [label for label, *_ in ROLLOUT_RUNS]
    fig, ax = plt.subplots(figsize=(11, 4.8))
    rng = np.random.default_rng(0)
    for workload, color in (("castillo", "#1f77b4"), ("long tail", "#ff7f0e")):
        for i, label in enumerate(labels):
            ys = [r[7] for r in rows if r[4] == label and r[0] == workload and r[7] != "-"]
            ax.scatter(i + rng.uniform(-0.25, 0.25, len(ys)), ys, s=9, color=color, alpha=0.6,
                       label=workload if i == 0 else None)
    for i, label in enumerate(labels):
        ys = [r[7] for r in rows if r[4] == label and r[7] != "-"]
        ax.plot([i - 0.35, i + 0.35], [np.mean(ys)] * 2, color="black", linewidth=1.5,
                label="mean over the settings" if i == 0 else None)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("modelled makespan / lower bound")
    ax.set_title("Rollout steps: makespan over the lower bound, one dot per setting (B x 16 on R replicas, "
                 f"{_cost_label()})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def rollout_speed(quick: bool, compression=None) -> tuple[str, list]:
    """Wall time of one simulated rollout step of 256 prompts x 16 on 8 replicas, per policy, one core
    (``compression``: every run with that compressed cache, a ``lengthsched.KVCompression``)."""
    pin_one_core()
    rows = []
    for workload in ("castillo", "long tail"):
        groups, realistic, _, _ = rollout_groups(workload, 64 if quick else 256, ROLLOUT_SEED)
        for factor in ((4,) if quick else (2, 4, 16, 64)):
            for label, policy, router, pred in ROLLOUT_RUNS + SPEED_EXTRA:
                if pred not in ("realistic", None):  # the same policies with other predictions
                    continue
                p = realistic if pred == "realistic" else None
                times = []
                for _ in range(1 if quick else 3):
                    start = time.perf_counter()
                    run_rollout(groups, policy, replicas=8, router=router, budget_tokens=factor * 4096,
                                max_new_tokens=4096, predicted=p, compression=compression)
                    times.append(time.perf_counter() - start)
                rows.append([workload, f"{factor} x L_max", label, statistics.median(times)])
    unpin()
    worst = max(r[3] for r in rows)
    cache = "" if compression is None else f" with a compressed cache ({compression.budget} + {compression.interval})"
    return table(f"Simulating one rollout step of {64 if quick else 256} prompts x 16 on 8 replicas{cache}: wall "
                 f"seconds per policy on one core (median of 3); the slowest takes {worst:.2f} s",
                 ["workload", "budget", "policy", "wall seconds"], rows), rows


def rollout_speed_compressed(quick: bool) -> tuple[str, list]:
    """:func:`rollout_speed` with Sparse-RL's compressed cache (256 + 32 tokens): every policy runs one."""
    from lengthsched import KVCompression

    return rollout_speed(quick, KVCompression(256, 32))


def _rollout_summary(rows: list, runs=ROLLOUT_RUNS) -> tuple[str, list]:
    """Per policy over the settings: mean and worst ratio to vLLM + verl routing (settings where both
    ran), settings slower, mean seconds / LB, mean recomputed tokens relative to vLLM's."""
    out = []
    for label, *_ in runs:
        mine = [r for r in rows if r[4] == label and r[6] != "-"]
        ratios = [r[6] for r in mine]
        fails = sum(1 for r in rows if r[4] == label and r[5] == "fails")
        recomputed = [r[10] for r in mine if r[10] != "-"]
        out.append([label, len(mine), fails, float(np.mean(ratios)), float(np.max(ratios)),
                    sum(1 for x in ratios if x > 1 + 1e-9), float(np.mean([r[7] for r in mine])),
                    float(np.mean(recomputed)) if recomputed else "-"])
    return table("Rollout grid summary (every setting of the table below): makespan relative to vLLM FCFS with "
                 "verl routing", ["policy", "settings", "fails", "mean x vllm + verl", "worst x vllm + verl",
                                  "settings slower", "mean seconds / LB", "mean recomputed x vllm"], out), out


def _rollout_online_unit(args):
    prompts, replicas, factor, seed, cost_text = args
    from lengthsched import OnlineLengthPredictor
    from lengthsched.online import fit_spreads
    from simulate.workloads import castillo_validate_lengths

    lmax = 4096
    groups, flat, _, _ = rollout_groups("castillo", prompts, seed, lmax=lmax)  # flat: the realistic predictions
    starts = np.cumsum([0] + [len(g.lengths) for g in groups[:-1]])
    prior = {g.prompt_id: int(flat[s]) for g, s in zip(groups, starts)}
    spreads = fit_spreads(castillo_validate_lengths())
    cost = _rollout_cost(cost_text)

    def online():
        return OnlineLengthPredictor(prior=prior, prior_sigma=0.5, **spreads)

    # What the online predictor predicts before it sees anything, frozen: its numerical median under the
    # spread law is a token off the prior for some prompts, enough to move steal's placement of whole
    # groups ("rollout_luck"); against this row, the online row differs by what it learns alone.
    start = np.maximum(1, np.asarray(online().predict([g.prompt_id for g in groups for _ in g.lengths]).lengths,
                                     dtype=np.int64))
    out = {}
    for policy, router in (("vllm", "least_loaded"), ("vllm_priority", "least_loaded"), ("placed_lpt", None),
                           ("steal", None)):
        for name, pred in (("prompt-only", flat), ("online's start, frozen", start), ("online", online())):
            if policy == "vllm" and name != "prompt-only":
                continue
            try:
                out[(policy, name)] = run_rollout(groups, policy, replicas=replicas, router=router,
                                                  budget_tokens=factor * lmax, max_new_tokens=lmax,
                                                  predicted=pred, cost=cost).seconds
            except Exception:
                out[(policy, name)] = None
    return out


def rollout_online(quick: bool) -> tuple[str, list]:
    """Rollout makespan with the online predictor (learns from finished siblings on each replica)
    against the same prompt-level predictions frozen and against its own starting predictions frozen
    (the difference to the latter is what it learns), for the priority-based policies."""
    grid = [(16, 4, 16)] if quick else [(b, r, f) for b in (64, 256) for r in (4, 8) for f in (4, 16)]
    results = _pool_map(_rollout_online_unit, [(b, r, f, ROLLOUT_SEED, ROLLOUT_COST) for b, r, f in grid])
    rows = []
    for (b, r, f), out in zip(grid, results):
        base = out[("vllm", "prompt-only")]
        for (policy, name), sec in out.items():
            rows.append([b, r, f"{f} x L_max", policy, name, "fails" if sec is None else float(sec),
                         "-" if sec is None or base is None else float(sec / base)])
    return table(f"Rollout steps (CASTILLO, G = 16, L_max 4096, {_cost_label()}): prompt-level predictions (log-normal "
                 "sigma 0.5) frozen vs an OnlineLengthPredictor with them as its prior (and its starting predictions "
                 "frozen)",
                 ["prompts", "replicas", "budget", "policy", "predictions", "seconds", "x vllm + verl"], rows), rows


HEADROOM_EVALUATIONS = 200  # replica simulations of the placement search per setting


def _rollout_headroom_unit(args):
    from simulate.headroom import search_placement

    *setting, evaluations = args
    seed = setting[4]  # the search's random choices follow the setting's seed
    groups, realistic, oracle, _, common = _rollout_setting(*setting)
    base = run_rollout(groups, "vllm", **common)
    steal = run_rollout(groups, "steal", predicted=realistic, **common).seconds
    steal_oracle = run_rollout(groups, "steal", predicted=oracle, **common).seconds
    priority_oracle = run_rollout(groups, "vllm_priority", predicted=oracle, **common).seconds
    fcfs = search_placement(groups, policy="vllm", evaluations=evaluations, seed=seed, **common)
    priority = search_placement(groups, policy="vllm_priority", evaluations=evaluations, seed=seed, **common)
    return (base.seconds, base.lower_bound_seconds, steal, steal_oracle, priority_oracle, fcfs.seconds,
            priority.seconds, fcfs.start, fcfs.accepted + priority.accepted)


HEADROOM_COLUMNS = ["lower bound", "steal", "steal (oracle)", "vllm_priority (oracle)",
                    "oracle placement + vLLM FCFS", "oracle placement + vLLM priority (oracle)", "best oracle"]


def rollout_headroom(quick: bool) -> tuple[str, list]:
    """What knowing every true length could buy: placements searched with the true lengths
    (simulate.headroom.search_placement, over vLLM FCFS and over vLLM priority replicas) and the
    oracle-predicted policies, against vLLM + verl, beside steal and the lower bound, on every
    setting of the rollout grid (one replica: nothing to place; the search returns verl's)."""
    grid = [("castillo", 16, 4, 4), ("castillo", 16, 1, 4)] if quick else ROLLOUT_GRID
    evaluations = 20 if quick else HEADROOM_EVALUATIONS
    units = [(w, b, r, f, ROLLOUT_SEED, ROLLOUT_COST, evaluations) for w, b, r, f in grid]
    results = _pool_map(_rollout_headroom_unit, units)
    rows = []
    for (w, b, r, f), out in zip(grid, results):
        base, lb, steal, steal_oracle, priority_oracle, fcfs, priority, start, moves = out
        oracles = [steal_oracle, priority_oracle, fcfs, priority]
        rows.append([w, b, r, f"{f} x L_max", base, lb / base, steal / base,
                     *(x / base for x in oracles), min(oracles) / base, start, moves])
    summary = []
    for label, keep in (("every setting", lambda row: True), ("several replicas", lambda row: row[2] > 1),
                        ("one replica", lambda row: row[2] == 1)):
        mine = [row for row in rows if keep(row)]
        if mine:
            summary.append([label, len(mine)] + [float(np.mean([row[i] for row in mine])) for i in range(5, 12)])
    text = table(f"Rollout headroom ({_cost_label()}): mean makespan relative to vLLM FCFS + verl routing; "
                 "'oracle' rows know every true length", ["settings", "count"] + HEADROOM_COLUMNS, summary)
    text += "\n\n" + table(
        f"Rollout headroom per setting ({_cost_label()}): makespan / vLLM + verl; oracle placements: best of 6 "
        f"starts, then {evaluations} replica simulations of local search",
        ["workload", "prompts", "replicas", "budget", "vllm + verl seconds"] + HEADROOM_COLUMNS
        + ["FCFS search start", "moves kept"], rows)
    return text, {"rows": rows, "summary": summary}


def _prompt_headroom_unit(args):
    """One setting: what a planner that knew every group's true median length (the best any prompt-level
    predictor could know) gets from the placements and policies this project has, run on the true
    lengths: (vLLM + verl seconds, {run: seconds} for PROMPT_HEADROOM_RUNS planned on the medians, steal's
    seconds with the realistic predictions)."""
    from simulate.headroom import search_placement
    from simulate.workloads import Group as _Group

    *setting, evaluations = args
    seed = setting[4]
    groups, realistic, _, _, common = _rollout_setting(*setting)
    med = np.concatenate([np.full(len(g.lengths), max(1, int(round(float(np.median(g.lengths))))))
                          for g in groups]).astype(np.int64)
    believed, at = [], 0
    for g in groups:  # every sibling its group's true median: what the planner believes
        believed.append(_Group(g.prompt_id, g.prompt_len, med[at:at + len(g.lengths)].copy()))
        at += len(g.lengths)
    base = run_rollout(groups, "vllm", **common).seconds
    fcfs = search_placement(believed, policy="vllm", evaluations=evaluations, seed=seed, **common)
    prio = search_placement(believed, policy="vllm_priority", evaluations=evaluations, seed=seed, **common)
    out = {
        "search + vLLM FCFS": run_rollout(groups, "vllm", placement=fcfs.placement, **common).seconds,
        "search + vLLM priority": run_rollout(groups, "vllm_priority", placement=prio.placement, predicted=med,
                                              **common).seconds,
        "steal": run_rollout(groups, "steal", predicted=med, **common).seconds,
        "vllm_priority + verl routing": run_rollout(groups, "vllm_priority", predicted=med, **common).seconds,
        "placed_classes": run_rollout(groups, "placed_classes", predicted=med, **common).seconds,
    }
    return base, out, run_rollout(groups, "steal", predicted=realistic, **common).seconds


PROMPT_HEADROOM_RUNS = ("search + vLLM FCFS", "search + vLLM priority", "steal", "vllm_priority + verl routing",
                        "placed_classes")


def rollout_prompt_headroom(quick: bool) -> tuple[str, list]:
    """What knowing every group's true median could buy (the ceiling of prompt-level prediction): the
    placement search of rollout_headroom and the policies, each planned on the group medians and run on
    the true lengths, against vLLM + verl, on every setting of the rollout grid."""
    grid = [("castillo", 16, 4, 4), ("castillo", 16, 1, 4)] if quick else ROLLOUT_GRID
    evaluations = 20 if quick else HEADROOM_EVALUATIONS
    units = [(w, b, r, f, ROLLOUT_SEED, ROLLOUT_COST, evaluations) for w, b, r, f in grid]
    results = _pool_map(_prompt_headroom_unit, units)
    rows = []
    for (w, b, r, f), (base, out, steal) in zip(grid, results):
        ratios = [out[k] / base for k in PROMPT_HEADROOM_RUNS]
        rows.append([w, b, r, f"{f} x L_max", base, steal / base, *ratios, min(ratios)])
    labels = ["steal (realistic)"] + [f"{k} (group medians)" for k in PROMPT_HEADROOM_RUNS] + ["best of these"]
    summary = []
    for label, keep in (("every setting", lambda row: True), ("several replicas", lambda row: row[2] > 1),
                        ("CASTILLO, several replicas", lambda row: row[2] > 1 and row[0] == "castillo"),
                        ("long tail, several replicas", lambda row: row[2] > 1 and row[0] == "long tail"),
                        ("one replica", lambda row: row[2] == 1)):
        mine = [row for row in rows if keep(row)]
        if mine:
            summary.append([label, len(mine)] + [float(np.mean([row[i] for row in mine])) for i in range(5, 12)])
    text = table(f"What each group's true median could buy ({_cost_label()}): mean makespan relative to vLLM FCFS "
                 "+ verl routing; every run but the first planned on the group medians, run on the true lengths",
                 ["settings", "count"] + labels, summary)
    text += "\n\n" + table(f"The same per setting ({_cost_label()})",
                            ["workload", "prompts", "replicas", "budget", "vllm + verl seconds"] + labels, rows)
    return text, {"rows": rows, "summary": summary}


#: What the length-class placement is given (label, kind): the true lengths; each group's true median
#: for all its siblings (the best a prompt-level predictor could know), and times a log-normal error
#: of that sigma; what OnlineLengthPredictor predicts after one earlier epoch of the same prompts; the
#: grid's realistic prompt-level predictor (sigma 0.5, no history).
CLASS_PREDICTIONS = (("true lengths", "oracle"), ("true group median", 0.0), ("group median, sigma 0.1", 0.1),
                     ("group median, sigma 0.2", 0.2), ("group median, sigma 0.3", 0.3),
                     ("previous epoch (online predictor)", "epoch"),
                     ("prompt-level, sigma 0.5 (realistic)", "realistic"))
def _classes_seconds(groups, predicted, common) -> float:
    """Makespan of the length-class policy (placed_classes) planned on ``predicted``."""
    return run_rollout(groups, "placed_classes", predicted=predicted, **common).seconds


def _class_predictions(kind, args, groups, realistic, oracle, rng, lmax) -> np.ndarray:
    """The predictions of one CLASS_PREDICTIONS kind, per completion in group order (tokens)."""
    if kind == "oracle":
        return oracle
    if kind == "realistic":
        return realistic
    if kind == "epoch":
        return previous_epoch_prediction(args[0], args[1], args[4], groups, realistic, lmax=lmax)[0]
    noise = np.exp(kind * rng.standard_normal(len(groups)))
    pred = np.concatenate([np.full(len(g.lengths), np.median(g.lengths) * e) for g, e in zip(groups, noise)])
    return np.clip(np.round(pred), 1, lmax).astype(np.int64)


def _rollout_classes_unit(args):
    groups, realistic, oracle, _, common = _rollout_setting(*args)
    base = run_rollout(groups, "vllm", **common).seconds
    rng = np.random.default_rng(args[4])
    out = []
    for _, kind in CLASS_PREDICTIONS:
        pred = _class_predictions(kind, args, groups, realistic, oracle, rng, common["max_new_tokens"])
        out.append(_classes_seconds(groups, pred, common) / base)
        out.append(run_rollout(groups, "steal", predicted=pred, **common).seconds / base)
    return out


def rollout_classes(quick: bool) -> tuple[str, list]:
    """How well lengths must be known for the length-class placement (the longest completions
    gathered on few replicas, simulate.place_by_length_class) to pay, beside `steal` given the same
    predictions: planned on the true lengths, on each group's true median (a perfect prompt-level
    predictor) with growing error, on what the online predictor knows after one earlier epoch of the
    same prompts, and on the grid's realistic prompt-level predictions."""
    grid = [("castillo", 64, 4, 16), ("castillo", 16, 1, 4)] if quick else ROLLOUT_GRID
    results = _pool_map(_rollout_classes_unit, [(w, b, r, f, ROLLOUT_SEED, ROLLOUT_COST) for w, b, r, f in grid])
    rows = [[w, b, r, f"{f} x L_max", *out] for (w, b, r, f), out in zip(grid, results)]
    summary = []
    for label, keep in (("every setting", lambda row: True), ("several replicas", lambda row: row[2] > 1)):
        mine = [row for row in rows if keep(row)]
        for i, (pred, _) in enumerate(CLASS_PREDICTIONS):
            line = [label, len(mine), pred]
            for j in (4 + 2 * i, 5 + 2 * i):  # length classes, steal
                ratios = np.array([row[j] for row in mine])
                line += [float(ratios.mean()), float(ratios.max()), int((ratios > 1 + 1e-9).sum())]
            summary.append(line)
    text = table(f"Length-class placement ({_cost_label()}): makespan / vLLM + verl; length classes run vLLM "
                 "priority replicas with the same predictions", ["settings", "count", "predictions", "classes: mean",
                                                                 "classes: worst", "classes: slower", "steal: mean",
                                                                 "steal: worst", "steal: slower"], summary)
    text += "\n\n" + table(f"Length-class placement per setting ({_cost_label()}): makespan / vLLM + verl",
                            ["workload", "prompts", "replicas", "budget"]
                            + [f"{who} ({p})" for p, _ in CLASS_PREDICTIONS for who in ("classes", "steal")], rows)
    return text, {"rows": rows, "summary": summary}


# ---------------------------------------------------------------------------------------- paper
def _paper_unit(args):
    lengths, prompt_len, lmax, g, sigma, seed = args
    predicted = lengths if sigma == 0 else NoisyOracleLengthPredictor(lengths, sigma=sigma, seed=seed)
    out = {}
    for p in ("full", "micro", "fixed_slot", "length_aware"):
        r = run_group(lengths, p, slots=None if p == "full" else g, max_new_tokens=lmax, prompt_len=prompt_len,
                      predicted=predicted)
        out[p] = (r.steps, r.peak_kv_tokens)
    return out


def paper(quick: bool) -> tuple[str, list]:
    memory = ModelMemory.from_preset("qwen3-1.7b")
    c, w = memory.kv_bytes_per_token, memory.weights_bytes
    rows = []
    lmax = 4096
    n = 30 if quick else 500
    for name in ("castillo", "lmsys", "azure"):
        for size, g in ((32, 8), (128, 16)):
            groups = (castillo_groups(size, max_new_tokens=lmax, limit=n, seed=0) if name == "castillo"
                      else trace_groups(name, size, max_new_tokens=lmax, limit=n, seed=0))
            for sigma in (0.0, 0.5):
                res = _pool_map(_paper_unit, [(gr.lengths, gr.prompt_len, lmax, g, sigma, i)
                                              for i, gr in enumerate(groups)])
                mean = {p: np.mean([r[p][0] for r in res]) for p in res[0]}
                prompt = np.mean([gr.prompt_len for gr in groups])
                peak_full = np.mean([r["full"][1] for r in res])
                peak_micro = np.mean([r["micro"][1] for r in res])
                total_full = w + c * (prompt + peak_full)
                total_micro = w + c * (prompt + peak_micro)
                rows.append([name, size, g, "oracle" if sigma == 0 else "noisy 0.5",
                             float(peak_micro / peak_full), float(total_micro / total_full),
                             float(1 - mean["length_aware"] / mean["micro"]),
                             float(1 - mean["fixed_slot"] / mean["micro"])])
    return table("Headline ratios of the Infinite Sampling paper on real-trace workloads (Qwen3-1.7B bf16, "
                 "L_max 4096, shared prompt, padded batches; g slots, no token budget)",
                 ["workload", "G", "g", "predictor", "micro / full peak KV", "micro / full peak memory (with W)",
                  "length-aware: fewer steps than micro", "fixed-slot: fewer steps than micro"], rows), rows


# ---------------------------------------------------------------------------------------- batches
def _batch_unit(args):
    groups, lmax, policy = args
    budget = 8 * lmax
    prompts = sum(g.prompt_len for g in groups)
    # One group after another: each holds only its own prompt, so it may use the others' prompt room.
    sequential = sum(run_group(g.lengths, policy, budget_tokens=budget + prompts - g.prompt_len, max_new_tokens=lmax,
                               prompt_len=g.prompt_len, predicted=g.lengths).steps for g in groups)
    shared = run_batch(groups, policy, budget_tokens=budget, max_new_tokens=lmax,
                       predicted=np.concatenate([g.lengths for g in groups])).steps
    return sequential, shared


def batches(quick: bool) -> tuple[str, list]:
    rows = []
    lmax = 1024
    groups = castillo_groups(32, max_new_tokens=lmax, limit=40 if quick else 800, seed=5)
    for k in (2, 4, 8):
        chunks = [groups[i:i + k] for i in range(0, len(groups) - k + 1, k)]
        for policy in ("growth_aware", "vllm", "micro"):
            res = _pool_map(_batch_unit, [(chunk, lmax, policy) for chunk in chunks])
            seq = np.mean([r[0] for r in res])
            shared = np.mean([r[1] for r in res])
            rows.append([k, policy, len(chunks), float(seq), float(shared), float(shared / seq)])
    return table("Several prompts under one budget (CASTILLO, G = 32 each, L_max 1024, 8 x L_max KV tokens beyond "
                 "all prompts): k groups one after another vs all k groups' completions scheduled together",
                 ["groups k", "policy", "batches", "sequential steps", "shared-budget steps", "shared / sequential"],
                 rows), rows


# ------------------------------------------------------------------------------ rollout: spreading ways
WAYS_SEEDS = (11, 12, 13, 14)  # the draws of the grid the choice of steal's PROMPT_SHARE is judged on
WAYS_SHARES = (0.125, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0)
WAYS_CROWDED = (6.0, 8.0, 10.0)  # pools of predicted tokens per replica from which whole groups are tried


def _rollout_ways_unit(args):
    """One CASTILLO setting with several replicas: steal with each group spread over k = 1 .. R
    replicas (R: verl's spread), the older either-or rule, and vLLM + verl (modelled seconds)."""
    import simulate.rollout as rollout_module
    from lengthsched.runtime.dispatch import WorkStealing

    workload, prompts, replicas, factor, seed, cost_text = args
    groups, realistic, _, _, common = _rollout_setting(workload, prompts, replicas, factor, seed, cost_text)
    out = {"vllm": run_rollout(groups, "vllm", router="least_loaded", **common).seconds}
    for k in range(1, replicas + 1):
        with patched(rollout_module, spread_ways=lambda *a, _k=k, **kw: _k):
            out[str(k)] = run_rollout(groups, "steal", predicted=realistic, **common).seconds
    with patched(WorkStealing, PLACE="route", PROMPT_SHARE=0.25):  # the rule before
        out["either-or 0.25"] = run_rollout(groups, "steal", predicted=realistic, **common).seconds
    out["held share"] = sum(int(g.prompt_len) for g in groups) / common["budget_tokens"]
    out["work share"] = float(np.sum(realistic)) / replicas / common["budget_tokens"]
    return out


def rollout_ways(quick: bool) -> tuple[str, list]:
    """How widely steal spreads a group (``lengthsched.integrations.rollout.spread_ways``): every k,
    and the rules that pick k from the prompts' share of a pool (and from the predicted tokens per
    replica, in pools), over four draws of the grid."""
    from lengthsched.integrations.rollout import CROWDED_POOLS, PROMPT_SHARE

    grid = [(w, b, r, f) for w, b, r, f in ROLLOUT_GRID if w == "castillo" and r > 1]
    seeds = WAYS_SEEDS
    if quick:
        grid, seeds = [("castillo", 16, 4, 4), ("castillo", 64, 4, 2)], (11,)
    units = [(w, b, r, f, s, ROLLOUT_COST) for s in seeds for w, b, r, f in grid]
    results = _pool_map(_rollout_ways_unit, units)
    rows = []
    for (w, b, r, f, s, _), out in zip(units, results):
        base = out["vllm"]
        rows.append([s, w, b, r, f"{f} x L_max", out["held share"], base]
                    + [out[str(k)] / base if k <= r else None for k in range(1, 9)]
                    + [out["either-or 0.25"] / base, out["work share"]])

    def rule_ratio(row, share, crowded=None):
        r, held, work = row[3], row[5], row[-1]
        if held == 0:
            k = r
        elif crowded is not None and work >= crowded:  # whole groups in steps that keep the pools full
            k = 1
        else:
            k = int(max(1, min(r, np.floor(r * share / held))))
        return row[6 + k]

    summary = []
    rules = [(f"share {x}", lambda row, x=x: rule_ratio(row, x)) for x in WAYS_SHARES]
    rules += [(f"share {PROMPT_SHARE}, whole groups from {c:g} pools of predicted tokens per replica"
               + (" (steal's)" if c == CROWDED_POOLS else ""), lambda row, c=c: rule_ratio(row, PROMPT_SHARE, c))
              for c in WAYS_CROWDED]
    rules += [("whole groups (k = 1)", lambda row: row[7]), ("verl's spread (k = R)", lambda row: row[6 + row[3]]),
              ("either-or rule, 0.25 (steal before)", lambda row: row[-2]),
              ("best k per setting (oracle)", lambda row: min(v for v in row[7:15] if v is not None))]
    for label, pick in rules:
        ratios = np.array([pick(row) for row in rows])
        per_seed = [float(np.mean([pick(row) for row in rows if row[0] == s])) for s in seeds]
        summary.append([label, len(ratios), float(ratios.mean()), float(ratios.max()), int(np.sum(ratios > 1.001))]
                       + per_seed)
    head = table(f"Steal, each group over k replicas ({_cost_label()}; the {len(grid)} CASTILLO settings with several "
                 f"replicas, seeds {', '.join(map(str, seeds))}, realistic predictions): makespan x vLLM + verl",
                 ["rule", "settings", "mean", "worst", "slower"] + [f"mean, seed {s}" for s in seeds], summary)
    text = table("Per setting: makespan x vLLM + verl of steal with each k (None: k > R)",
                 ["seed", "workload", "prompts", "replicas", "budget", "prompts / pool", "vllm + verl seconds"]
                 + [f"k = {k}" for k in range(1, 9)] + ["either-or 0.25", "predicted tokens per replica / pool"], rows)
    return head + "\n\n" + text, {"rows": rows, "summary": summary}


# rollout_hedged: scenarios per setting, the within-group log-sd the scenarios assume, the predictor's error
HEDGE_SCENARIOS = 4
HEDGE_SPREADS = (0.1, 0.3)
HEDGE_SIGMA = 0.5


def _scenario_groups(groups, predicted, rng, spread: float, lmax: int = 4096) -> list:
    """One scenario of a step drawn from what a planner knows before it starts: each group's median
    drawn around its prompt-level prediction (log-normal error HEDGE_SIGMA, the predictor's), its
    completions around that median (log-sd ``spread``), clipped to [1, lmax] tokens. No true length is read."""
    out, start = [], 0
    for g in groups:
        n = len(g.lengths)
        median = float(predicted[start]) * np.exp(HEDGE_SIGMA * rng.standard_normal())
        start += n
        lengths = np.clip(np.round(median * np.exp(spread * rng.standard_normal(n))), 1, lmax).astype(np.int64)
        out.append(dataclasses.replace(g, lengths=lengths))
    return out


def _rollout_hedged_unit(args):
    """One CASTILLO setting with several replicas: what steal with each spread k = 1 .. R really takes
    (``_rollout_ways_unit``), and what it takes on HEDGE_SCENARIOS scenarios of the step per assumed
    spread (each row: vLLM + verl's seconds, then steal's with k = 1 .. R)."""
    import simulate.rollout as rollout_module

    workload, prompts, replicas, factor, seed, cost_text, scenarios = args
    groups, realistic, _, _, common = _rollout_setting(workload, prompts, replicas, factor, seed, cost_text)
    out = {"actual": _rollout_ways_unit(args[:6]), "scenarios": {},
           "rule k": steal_ways(groups, realistic, common["budget_tokens"], replicas, common["max_new_tokens"])[1]}
    for spread in HEDGE_SPREADS:
        rng = np.random.default_rng(1000 + seed)
        table = []
        for _ in range(scenarios):
            drawn = _scenario_groups(groups, realistic, rng, spread)
            row = [run_rollout(drawn, "vllm", router="least_loaded", **common).seconds]
            for k in range(1, replicas + 1):
                with patched(rollout_module, spread_ways=lambda *a, _k=k, **kw: _k):
                    row.append(run_rollout(drawn, "steal", predicted=realistic, **common).seconds)
            table.append(row)
        out["scenarios"][str(spread)] = table
    return out


def rollout_hedged(quick: bool) -> tuple[str, list]:
    """A planner that picks steal's spread k per step by simulating the step on scenarios drawn from the
    predictor's error model (never the true lengths), against steal's rule and the best k chosen with the
    true lengths, on the CASTILLO settings with several replicas of the four draws."""
    grid = [(w, b, r, f) for w, b, r, f in ROLLOUT_GRID if w == "castillo" and r > 1]
    seeds, scenarios = WAYS_SEEDS, HEDGE_SCENARIOS
    if quick:
        grid, seeds, scenarios = [("castillo", 16, 4, 4), ("castillo", 16, 2, 2)], (11,), 2
    units = [(w, b, r, f, s, ROLLOUT_COST, scenarios) for s in seeds for w, b, r, f in grid]
    results = _pool_map(_rollout_hedged_unit, units)
    picks: dict[str, list] = {}
    per_setting = []
    for u, out in zip(units, results):
        actual, r = out["actual"], u[2]
        real = {k: actual[str(k)] / actual["vllm"] for k in range(1, r + 1)}
        rk = out["rule k"]  # steal's own spread of this step (simulate.rollout.steal_ways)
        chosen = {"steal's rule (spread_ways)": rk,
                  "best k per setting (oracle: the true lengths)": min(real, key=real.get)}
        for spread, drawn in out["scenarios"].items():
            t = np.asarray(drawn)
            ratio = t[:, 1:] / t[:, :1]
            chosen[f"spread {spread}: least mean seconds over the scenarios"] = int(np.argmin(t[:, 1:].mean(0))) + 1
            chosen[f"spread {spread}: least worst ratio to vLLM + verl over the scenarios"] = \
                int(np.argmin(ratio.max(0))) + 1
            better = [k for k in range(1, r + 1) if np.all(t[:, k] < 0.995 * t[:, rk])]
            chosen[f"spread {spread}: the rule's k unless another wins every scenario by 0.5%"] = \
                min(better, key=lambda k: t[:, k].mean()) if better else rk
        for label, k in chosen.items():
            picks.setdefault(label, []).append((u[4], real[k]))
        per_setting.append([u[4], u[0], u[1], r, f"{u[3]} x L_max", rk, chosen])
    rows = []
    for label, got in picks.items():
        ratios = np.array([x for _, x in got])
        rows.append([label, len(ratios), float(ratios.mean()), float(ratios.max()), int(np.sum(ratios > 1.001))]
                    + [float(np.mean([x for s, x in got if s == seed])) for seed in seeds])
    text = table(f"steal's spread k chosen on {scenarios} scenarios per step drawn from the "
                 f"predictor's error (log-normal {HEDGE_SIGMA} on each prompt's median, siblings around it with the "
                 f"spread named) vs its rule and the true-length best ({_cost_label()}; the {len(grid)} CASTILLO "
                 f"settings with several replicas, seeds {', '.join(map(str, seeds))}): steal's makespan with the "
                 "chosen k x vLLM + verl",
                 ["choice of k", "settings", "mean", "worst", "slower by > 0.1%"] + [f"mean, seed {s}" for s in seeds],
                 rows)
    return text, {"rows": rows, "settings": per_setting}


# rollout_oversampling: groups submitted per group kept (slime's over_sampling_batch_size / rollout_batch_size,
# DAPO's generation batch over its training batch), the settings, and the runs compared
OVERSAMPLE = (1.25, 1.5)
OVERSAMPLE_GRID = [(w, b, r, f) for w in ("castillo", "long tail") for b in (64, 256) for r in (4, 8) for f in (4, 16)]
OVERSAMPLE_RUNS = (("vllm + verl routing", "vllm", "least_loaded", None),
                   ("vllm_priority + verl routing", "vllm_priority", "least_loaded", "realistic"),
                   ("seer", "seer", None, None),
                   ("steal", "steal", None, "realistic"))


def _rollout_oversampling_unit(args):
    """One setting: ``prompts`` x ``factor`` groups submitted, the step kept when ``prompts`` of them have
    finished (the rest aborted). Per run: (seconds to the prompts-th finished group, full makespan, the
    kept groups' mean completion length over all submitted groups')."""
    workload, prompts, replicas, factor, seed, cost_text, over = args
    groups, realistic, oracle, constant, common = _rollout_setting(workload, int(round(prompts * over)), replicas,
                                                                   factor, seed, cost_text)
    known = {"realistic": realistic, None: None}
    out = {}
    for label, policy, router, pred in OVERSAMPLE_RUNS:
        r = run_rollout(groups, policy, router=router, predicted=known[pred], record=True, **common)
        to_kept, bias = r.kept_finish(prompts)
        out[label] = (to_kept, r.seconds, bias)
    return out


def rollout_oversampling(quick: bool) -> tuple[str, list]:
    """Over-sampled steps: more groups submitted than kept, the step ending when enough have finished (slime's
    over-sampling with abort, DAPO's dynamic sampling with every group taken as valid): the time to the
    last kept group per run, and how much shorter the kept groups are than the submitted ones."""
    grid, overs = OVERSAMPLE_GRID, OVERSAMPLE
    if quick:
        grid, overs = [("castillo", 16, 2, 4), ("long tail", 16, 2, 4)], (1.25,)
    units = [(w, b, r, f, ROLLOUT_SEED, ROLLOUT_COST, o) for o in overs for w, b, r, f in grid]
    results = _pool_map(_rollout_oversampling_unit, units)
    base = OVERSAMPLE_RUNS[0][0]
    rows, settings = [], []
    for o in overs:
        mine = [(u, out) for u, out in zip(units, results) if u[6] == o]
        for label, *_ in OVERSAMPLE_RUNS:
            to_kept = np.array([out[label][0] / out[base][0] for _, out in mine])
            share = np.array([out[label][0] / out[label][1] for _, out in mine])
            full = np.array([out[label][1] / out[base][1] for _, out in mine])
            bias = np.array([out[label][2] for _, out in mine])
            rows.append([o, label, len(mine), float(to_kept.mean()), float(to_kept.max()), int(np.sum(to_kept > 1.001)),
                         float(full.mean()), float(share.mean()), float(bias.mean()), float(bias.min())])
        settings += [[o, _workload_label(u[0]), u[1], u[2], f"{u[3]} x L_max",
                      {label: list(v) for label, v in out.items()}] for u, out in mine]
    text = table(f"Over-sampled rollout steps ({_cost_label()}, seed {ROLLOUT_SEED}, L_max 4096, G = 16; B groups "
                 "kept of B x over-sampling submitted, the rest aborted when the B-th finishes; every group counted as "
                 "valid): seconds to the B-th finished group x vLLM + verl's, and the kept groups' mean length over "
                 "all submitted groups'",
                 ["over-sampling", "run", "settings", "to B: mean x vllm + verl", "worst", "slower by > 0.1%",
                  "full makespan x vllm + verl", "to B / own makespan", "kept / submitted mean length",
                  "lowest"], rows)
    return text, {"rows": rows, "settings": settings}


# rollout_partial: over-sampled steps one after another (simulate.run_oversampled_steps): (over-sampling,
# partial rollout) per mode, the steps of each run, and the runs (label, policy, router, predictions, slime's
# in-flight cap per replica or None, how a resumed sample is predicted: run_oversampled_steps' resume)
PARTIAL_MODES = ((1.0, False), (1.25, False), (1.25, True), (1.5, False), (1.5, True))
# --valid-share Q (a dynamic-sampling filter keeping a share Q of the finished groups): more over-sampling, so that
# a step's groups hold enough that pass
PARTIAL_MODES_FILTERED = ((1.0, False), (1.5, False), (1.5, True), (2.0, False), (2.0, True))
PARTIAL_VALID: float | None = None  # --valid-share
PARTIAL_STEPS = 8
PARTIAL_GRID = [(w, b, r, f) for w in ("castillo", "long tail") for b, r in ((64, 4), (256, 8)) for f in (4, 16)]
PARTIAL_RUNS = (("vllm + verl routing", "vllm", "least_loaded", None, None, "left"),
                ("slime: sglang + cache-aware router", "sglang", "cache_aware", None, 512, "left"),
                ("steal", "steal", None, "realistic", None, "left"),
                ("steal_longest", "steal_longest", None, "realistic", None, "left"),
                ("steal, resumed samples predicted from their siblings", "steal", None, "realistic", None, "siblings"),
                ("steal_longest, resumed samples predicted from their siblings", "steal_longest", None, "realistic",
                 None, "siblings"),
                ("slime + lengthsched.integrations.slime (resumed samples predicted from their siblings)", "sglang",
                 "slime_plan", "realistic", 512, "siblings"))


def _rollout_partial_unit(args, steps=PARTIAL_STEPS, runs=PARTIAL_RUNS):
    """One setting and mode: every run of ``runs`` over ``steps`` over-sampled steps of ``prompts``
    groups kept (the stream: as many groups of the workload as the steps can draw, seed ``seed``). Per
    run: (seconds, kept tokens, stale share, dropped share, kept length ratio, recomputed tokens, the most
    steps a kept group waited, filtered share, shortfall, the kept tokens' mean age in steps); ``valid``:
    the filter's share (None: none). A mode is (over-sampling, partial rollout), or with partial rollout
    (over-sampling, "K wait" / "K drop"): a staleness limit of K steps (run_oversampled_steps' max_carry
    and carry_limit)."""
    from simulate.oversampling import run_oversampled_steps, submitted_per_step

    workload, prompts, replicas, factor, seed, cost_text, (over, carry), valid = args
    limit = {}
    if isinstance(carry, str):
        most, rule = carry.split()
        limit, carry = {"max_carry": int(most), "carry_limit": rule}, True
    need = steps * submitted_per_step(prompts, over)
    groups, realistic, oracle, constant, common = _rollout_setting(workload, need, replicas, factor, seed, cost_text)
    known = {"realistic": realistic, None: None}
    out = {}
    for label, policy, router, pred, per, resume in runs:
        if resume != "left" and not carry and any(r[0] != label and r[1:5] == (policy, router, pred, per)
                                                  for r in runs):
            continue  # nothing is resumed without partial rollout: the same run with "left" stands for it
        extra = {} if per is None else {"in_flight": per * replicas}
        if router == "slime_plan":  # slime with the integration planning every step
            extra["run"], router = run_slime_planned_in_order, None
        r = run_oversampled_steps(groups, policy, batch=prompts, oversample=over, steps=steps, partial=carry,
                                  predicted=known[pred], resume=resume, router=router, valid=valid, filter_seed=seed,
                                  **limit, **common, **extra)
        out[label] = (r.seconds, r.kept_tokens, r.stale_share, r.dropped_share, r.kept_length_ratio,
                      int(sum(x.recomputed_tokens for x in r.steps)), r.max_wait, r.filtered_share, r.shortfall,
                      r.mean_token_age)
    return out


def rollout_partial(quick: bool) -> tuple[str, list]:
    """Over-sampled steps one after another, with and without slime's partial rollout: kept tokens per
    modelled second against vLLM + verl without over-sampling, and what the carried tokens cost (the
    share of the kept tokens generated in an earlier step) or what the aborted ones cost (thrown away)."""
    grid, modes, steps = PARTIAL_GRID, PARTIAL_MODES, PARTIAL_STEPS
    if PARTIAL_VALID is not None:  # 7 steps: 7 x 512 groups drawn at 256 x 2 fit CASTILLO's 3,598 prompts
        modes, steps = PARTIAL_MODES_FILTERED, 7
    if quick:
        grid, modes, steps = [("castillo", 16, 2, 4), ("long tail", 16, 2, 4)], ((1.0, False), (1.5, True)), 3
    units = [(w, b, r, f, ROLLOUT_SEED, ROLLOUT_COST, m, PARTIAL_VALID) for m in modes for w, b, r, f in grid]
    results = _pool_map(partial(_rollout_partial_unit, steps=steps), units)
    settings = [[u[6][0], u[6][1], _workload_label(u[0]), u[1], u[2], f"{u[3]} x L_max",
                 {label: list(v) for label, v in out.items()}] for u, out in zip(units, results)]
    rows = partial_rows(settings)
    filtered = "" if PARTIAL_VALID is None else (f"; a dynamic-sampling filter keeps {PARTIAL_VALID:g} of the finished "
                                                 "groups, at random, in every run")
    text = table(f"Over-sampled steps one after another ({_cost_label()}, seed {ROLLOUT_SEED}, L_max 4096, G = 16, "
                 f"{steps} steps of B groups kept, B x over-sampling submitted; with partial rollout the aborted "
                 "groups come back first in the next step with their tokens, without it they are dropped"
                 f"{filtered}): kept tokens per modelled second x vLLM + verl's without over-sampling, and x vLLM + "
                 "verl's with the same over-sampling", PARTIAL_COLUMNS, rows)
    return text, {"rows": rows, "settings": settings, "steps": steps, "valid_share": PARTIAL_VALID}


# slime_dynamic_sampling: over-sampled rollouts as slime runs them (simulate.rollout.Refill: another
# --over-sampling-batch-size groups whenever the filter has dropped so many that those submitted and not dropped fall
# below --rollout-batch-size). Modes: (over-sampling batch / rollout batch, partial rollout, the filter's share of
# groups that pass or None), on rollout_partial's grid; runs: (label, the integration's options or None for slime
# as it ships).
DYNAMIC_MODES = ((1.0, False, 0.7), (1.0, True, 0.7), (1.5, False, 0.7), (1.5, True, 0.7), (1.25, False, None),
                 (1.25, True, None))
DYNAMIC_STEPS = 5
DYNAMIC_RUNS = (
    ("slime: sglang + cache-aware router (also lengthsched.integrations.slime's default for over-sampled rollouts "
     "since 2026-11-29: nothing planned)", None),
    ("slime + the plan, lengthsched_oversampled: plan (whole groups, shortest predicted first, client window)",
     {"placement": "groups", "submit": "shortest"}),
    ("slime + the plan: whole groups, shortest predicted first, no window",
     {"placement": "groups", "submit": "shortest", "window": 0.0}),
    ("slime + the plan: whole groups in batch order, no window", {"placement": "groups", "submit": "batch",
                                                                  "window": 0.0}),
    ("slime + the plan with the makespan defaults: ways, longest first, client window (the integration's for every "
     "rollout until 2026-11-29)", {}),
)


def _dynamic_unit(args) -> dict:
    """One setting and mode of slime_dynamic_sampling: per DYNAMIC_RUNS row (kept tokens per second, kept length
    ratio, groups submitted per step, stale share), and slime's kept tokens per second in the model without
    further batches ("previous model": a step keeps fewer groups when too few pass)."""
    from simulate.oversampling import run_oversampled_steps, submitted_per_step

    workload, prompts, replicas, factor, seed, cost_text, (over, carry, valid) = args
    need = DYNAMIC_STEPS * submitted_per_step(prompts, over) * 2  # CASTILLO gives all its 3,598 prompts at most
    groups, realistic, _, _, common = _rollout_setting(workload, need, replicas, factor, seed, cost_text)
    shared = dict(batch=prompts, oversample=over, steps=DYNAMIC_STEPS, partial=carry, in_flight=SLIME_CONCURRENCY *
                  replicas, valid=valid, filter_seed=seed, **common)
    out = {}
    for label, options in DYNAMIC_RUNS:
        extra = {"router": "cache_aware"} if options is None else {"run": run_slime_planned_in_order,
                                                                   "predicted": realistic, **options}
        r = run_oversampled_steps(groups, "sglang", refill=True, **shared, **extra)
        out[label] = [r.kept_tokens_per_second, r.kept_length_ratio, float(np.mean([x.submitted for x in r.steps])),
                      r.stale_share]
    r = run_oversampled_steps(groups, "sglang", router="cache_aware", **shared)
    out["previous model"] = [r.kept_tokens_per_second, r.kept_length_ratio,
                             float(np.mean([x.submitted for x in r.steps])), r.stale_share, r.shortfall]
    return out


def slime_dynamic_sampling(quick: bool) -> tuple[str, dict]:
    """Over-sampled rollouts as slime runs them (its dynamic sampling submits further batches inside a step):
    slime as it ships against slime with lengthsched's integration, its defaults for over-sampled rollouts and
    the others, on rollout_partial's grid (one draw, --seed)."""
    grid, modes = PARTIAL_GRID, DYNAMIC_MODES
    if quick:
        grid, modes = [("castillo", 16, 2, 4)], ((1.0, False, 0.7), (1.25, True, None))
    units = [(w, b, r, f, ROLLOUT_SEED, ROLLOUT_COST, m) for m in modes for w, b, r, f in grid]
    results = _pool_map(_dynamic_unit, units)
    base = DYNAMIC_RUNS[0][0]
    rows = []
    for mode in modes:
        mine = [out for u, out in zip(units, results) if u[6] == mode]
        for label, _ in DYNAMIC_RUNS:
            ratio = np.array([out[label][0] / out[base][0] for out in mine])
            rows.append([mode[0], "yes" if mode[1] else "no", "-" if mode[2] is None else mode[2], label, len(mine),
                         float(ratio.mean()), float(ratio.min()), int(np.sum(ratio < 0.999)),
                         float(np.mean([out[label][1] for out in mine])),
                         float(np.mean([out[label][2] for out in mine])),
                         float(np.mean([out[label][3] for out in mine]))])
        previous = np.array([out["previous model"][0] / out[base][0] for out in mine])
        rows.append([mode[0], "yes" if mode[1] else "no", "-" if mode[2] is None else mode[2],
                     "slime, previous model (no further batches: a step keeps fewer groups when too few pass)",
                     len(mine), float(previous.mean()), float(previous.min()), int(np.sum(previous < 0.999)),
                     float(np.mean([out["previous model"][1] for out in mine])),
                     float(np.mean([out["previous model"][2] for out in mine])),
                     float(np.mean([out["previous model"][3] for out in mine]))])
    text = table(f"slime's over-sampled rollouts with its dynamic sampling ({_cost_label()}, seed {ROLLOUT_SEED}, "
                 f"{DYNAMIC_STEPS} steps, rollout_partial's grid): kept tokens per modelled second x slime as it "
                 "ships, same mode", ["over-sampling batch / B", "partial rollout", "filter passes", "run",
                                      "settings", "kept tokens/s x slime", "lowest", "slower by > 0.1%",
                                      "kept / drawn mean length", "groups submitted per step", "stale share"], rows)
    settings = [[*u[:4], list(u[6]), out] for u, out in zip(units, results)]
    return text, {"rows": rows, "settings": settings, "steps": DYNAMIC_STEPS}


# slime_difficulty: slime's dynamic sampling with DAPO's filter drawn from a model of prompt difficulty tied to length
# (simulate.difficulty: hard prompts run long and fail together), against the filter drawn at random with the same
# share, and the integration's lengthsched_filter_order (every batch likely-kept first by what the filter did with
# each prompt one epoch earlier). Modes: (over-sampling batch / B, partial rollout); runs: (label, the integration's
# plan options or None for slime's router, the filter's flags: "difficulty" or "random", the history that orders
# the batches: None, "previous epoch", "empty" or "this epoch" (oracle)).
DIFFICULTY_MODES = ((1.0, False), (1.0, True), (1.5, False), (1.5, True))
DIFFICULTY_RUNS = (
    ("slime: sglang + cache-aware router, DAPO's filter of the difficulty model", None, "difficulty", None),
    ("slime, the filter drawn at random with the same share (the model before 2026-11-29)", None, "random", None),
    ("slime + lengthsched_filter_order (history: one earlier epoch)", None, "difficulty", "previous epoch"),
    ("slime + lengthsched_filter_order, first epoch (no history yet)", None, "difficulty", "empty"),
    ("slime + the plan (lengthsched_oversampled: plan)", {"placement": "groups", "submit": "shortest"}, "difficulty",
     None),
    ("slime + the plan + lengthsched_filter_order (one earlier epoch)", {"placement": "groups", "submit": "shortest"},
     "difficulty", "previous epoch"),
    ("slime + filter order by this step's own outcomes (oracle)", None, "difficulty", "this epoch"),
    ("slime + lengthsched_selective_rollout (GRESO's skip; one earlier epoch)", None, "difficulty",
     "previous epoch, skip"),
    ("slime + lengthsched_selective_rollout + lengthsched_filter_order (one earlier epoch)", None, "difficulty",
     "previous epoch, skip, order"),
)


def _difficulty_unit(args) -> dict:
    """One setting and mode of slime_difficulty: per DIFFICULTY_RUNS row (kept tokens per second, kept length
    ratio, the kept groups' mean pass rate, filtered share of the generated tokens, prompts skipped that would have
    passed per kept group)."""
    from lengthsched.filtering import FilterHistory, SelectiveRollout
    from simulate.difficulty import filter_passes, filter_sides, observe_sides, pass_rates, selective_stream
    from simulate.oversampling import run_oversampled_steps, submitted_per_step

    workload, prompts, replicas, factor, seed, cost_text, (over, carry) = args
    need = DYNAMIC_STEPS * submitted_per_step(prompts, over) * 2
    groups, realistic, _, _, common = _rollout_setting(workload, need, replicas, factor, seed, cost_text)
    size = len(groups[0].lengths)
    rates = pass_rates(groups, seed=seed)
    flags = {"difficulty": filter_passes(rates, size, seed=seed, epoch=1)}
    flags["random"] = float(flags["difficulty"].mean())
    sides = filter_sides(rates, size, seed=seed, epoch=0)
    earlier = {"previous epoch": sides, "this epoch": filter_sides(rates, size, seed=seed, epoch=1)}
    shared = dict(batch=prompts, oversample=over, steps=DYNAMIC_STEPS, partial=carry, in_flight=SLIME_CONCURRENCY *
                  replicas, filter_seed=seed, refill=True, **common)
    out = {}
    for label, options, valid, known in DIFFICULTY_RUNS:
        history, runs = None, np.ones(len(groups), dtype=bool)
        if known is not None:
            history = FilterHistory()
            said = earlier.get(known.split(",")[0])
            if said is not None:
                observe_sides(history, groups, said)
        if known is not None and "skip" in known:  # GRESO's skip as the dataloader serves the epoch
            runs = selective_stream(groups, history, SelectiveRollout(seed=seed))
            history = history if "order" in known else None
        extra = {"router": "cache_aware"} if options is None else {
            "run": partial(run_slime_planned_in_order, filter_history=history), "predicted": realistic, **options}
        valid_flags = flags[valid] if isinstance(flags[valid], float) else flags[valid][runs]
        r = run_oversampled_steps([g for g, on in zip(groups, runs) if on], "sglang", valid=valid_flags,
                                  filter_history=history, **shared, **extra)
        kept, _, lost = _kept_after_skip(r, runs, flags["difficulty"])
        out[label] = [r.kept_tokens_per_second, r.kept_length_ratio, float(np.mean(rates[kept])) if kept else 0.0,
                      r.filtered_share, lost]
    return out


def _kept_after_skip(result, runs: np.ndarray, valid: np.ndarray) -> tuple[list[int], int, float]:
    """Of a run of over-sampled steps over the stream's groups that ``runs`` let run (the others skipped): the
    stream indices of the groups it kept, how far into the stream it reached (one past the furthest group it kept),
    and how many skipped groups before that ``valid`` says would have passed, per kept group."""
    index = np.flatnonzero(runs)
    kept = [int(index[g]) for step in result.steps for g in step.kept]
    reached = int(index[max(max(step.kept) for step in result.steps if step.kept)]) + 1 if kept else 0
    return kept, reached, float(np.sum(~runs[:reached] & valid[:reached])) / max(1, len(kept))


def slime_difficulty(quick: bool) -> tuple[str, dict]:
    """slime's dynamic sampling under DAPO's filter drawn from the difficulty model (simulate.difficulty) rather
    than at random, and the integration's filter order, on rollout_partial's grid (one draw, --seed)."""
    return _difficulty_section(_difficulty_unit, DIFFICULTY_MODES, (1.0, False), difficulty_rows, DIFFICULTY_COLUMNS,
                               f"slime's dynamic sampling, DAPO's filter from the difficulty model ({_cost_label()}, "
                               f"seed {ROLLOUT_SEED}, {DYNAMIC_STEPS} steps, rollout_partial's grid): kept tokens per "
                               "modelled second x slime as it ships under the same filter", quick)


def _difficulty_section(unit, modes, quick_mode, rows_of, columns, title: str, quick: bool,
                        grid=PARTIAL_GRID, steps: int = DYNAMIC_STEPS) -> tuple[str, dict]:
    """A section over ``grid`` (rollout_partial's by default) x ``modes`` (quick: one small setting in
    ``quick_mode``): ``unit`` per setting and mode, ``rows_of`` its settings ([workload, prompts, replicas, pool,
    [mode], {run: ...}]); ``steps``: the over-sampled steps each unit runs (recorded with the results)."""
    if quick:
        grid, modes = [("castillo", 16, 2, 4)], (quick_mode,)
    units = [(w, b, r, f, ROLLOUT_SEED, ROLLOUT_COST, m) for m in modes for w, b, r, f in grid]
    results = _pool_map(unit, units)
    settings = [[*u[:4], list(u[6]), out] for u, out in zip(units, results)]
    rows = rows_of(settings)
    return table(title, columns, rows), {"rows": rows, "settings": settings, "steps": steps}


DIFFICULTY_COLUMNS = ["over-sampling batch / B", "partial rollout", "run", "settings", "kept tokens/s x slime",
                      "lowest", "highest", "slower by > 0.1%", "kept / drawn mean length",
                      "kept groups' mean pass rate", "filtered share of generated",
                      "skipped prompts that would have passed, per kept group"]


def difficulty_rows(settings: list) -> list:
    """slime_difficulty's rows from its settings ([workload, prompts, replicas, pool, [over, partial], {run:
    [kept tokens/s, kept length ratio, mean pass rate, filtered share, skipped that would have passed per kept
    group (0 where absent)]}], several draws pooled)."""
    base = DIFFICULTY_RUNS[0][0]
    rows = []
    for mode in dict.fromkeys(tuple(x[4]) for x in settings):
        mine = [x[5] for x in settings if tuple(x[4]) == mode]
        for label, *_ in DIFFICULTY_RUNS:
            ratio = np.array([out[label][0] / out[base][0] for out in mine])
            rows.append([mode[0], "yes" if mode[1] else "no", label, len(mine), float(ratio.mean()),
                         float(ratio.min()), float(ratio.max()), int(np.sum(ratio < 0.999))]
                        + [float(np.mean([out[label][i] for out in mine])) for i in (1, 2, 3)]
                        + [float(np.mean([out[label][4] if len(out[label]) > 4 else 0.0 for out in mine]))])
    return rows


# slime_difficulty_drift: GRESO's skip and the filter order when the policy learns between epochs (simulate.difficulty.
# learnt_rates: each prompt's log-odds of a reward grow by DRIFTS per epoch, a log-normal learning speed per prompt),
# with HISTORY_EPOCHS earlier epochs recorded (the skip applied in them too, so a skipped prompt's streak stands).
# Modes: (over-sampling batch / B, partial rollout): the one where the skip was never slower and the one where it lost.
DRIFT_MODES = ((1.5, True), (1.0, False))
DRIFTS = (0.0, 0.5, 1.0)
HISTORY_EPOCHS = (1, 4)
DRIFT_RUNS = ("slime as it ships", "slime + lengthsched_filter_order", "slime + lengthsched_selective_rollout",
              "slime + lengthsched_selective_rollout + lengthsched_filter_order")


def _drift_unit(args) -> dict:
    """One setting and mode of slime_difficulty_drift: per (drift, epochs recorded) and DRIFT_RUNS row, [kept tokens
    per second, skipped prompts that would have passed per kept group, skipped share of the epoch's prompts, the
    kept groups' mean pass rate at that epoch]."""
    from simulate.difficulty import filter_passes, learnt_rates, pass_rates
    from simulate.oversampling import submitted_per_step

    workload, prompts, replicas, factor, seed, cost_text, (over, carry) = args
    need = DYNAMIC_STEPS * submitted_per_step(prompts, over) * 3  # half as many again: the skip takes up to a third
    groups, _, _, _, common = _rollout_setting(workload, need, replicas, factor, seed, cost_text)
    size = len(groups[0].lengths)
    rates = pass_rates(groups, seed=seed)
    shared = dict(batch=prompts, oversample=over, steps=DYNAMIC_STEPS, partial=carry, in_flight=SLIME_CONCURRENCY *
                  replicas, filter_seed=seed, refill=True, router="cache_aware", **common)
    out = {}
    for drift in DRIFTS:
        for epochs in HISTORY_EPOCHS:
            now = learnt_rates(rates, epochs, drift=drift, seed=seed)
            valid = filter_passes(now, size, seed=seed, epoch=epochs)
            for label in DRIFT_RUNS:
                r, runs = _after_epochs(groups, rates, valid, shared, epochs=epochs, drift=drift, seed=seed,
                                        order="recorded" if "filter_order" in label else None,
                                        skip="selective" in label)
                kept, reached, lost = _kept_after_skip(r, runs, valid)
                out[f"{drift}|{epochs}|{label}"] = [r.kept_tokens_per_second, lost,
                                                     float(np.mean(~runs[:reached])) if reached else 0.0,
                                                     float(np.mean(now[kept])) if kept else 0.0]
    return out


def _after_epochs(groups, rates, valid, shared: dict, *, epochs: int, drift: float, seed: int, order: str | None,
                  skip: bool, policy: str = "sglang"):
    """slime's over-sampled steps over ``groups`` (``valid``: the filter's verdicts this epoch) after ``epochs``
    earlier epochs at ``drift`` (:func:`simulate.difficulty.run_epochs`, recorded where the run orders or skips);
    ``order``: None (slime's own order), "recorded" (the integration's order by the recorded epochs) or "oracle"
    (by this epoch's own verdicts, nothing recorded); ``skip``: GRESO's skip by the recorded epochs; ``policy``: the
    engines' (slime's SGLang by default). Returns the run and which groups ran (the others skipped)."""
    from lengthsched.filtering import FilterHistory, SelectiveRollout
    from simulate.difficulty import run_epochs
    from simulate.oversampling import run_oversampled_steps

    keys = [g.prompt_id for g in groups]
    history, rule = FilterHistory(), SelectiveRollout(seed=seed) if skip else None
    if order == "oracle":
        history.observe_many(keys, list(valid))
    elif order is not None or skip:
        run_epochs(groups, rates, len(groups[0].lengths), epochs, history, rule=rule, drift=drift, seed=seed)
    runs = rule.select(history, keys) if skip else np.ones(len(groups), dtype=bool)
    if skip and shared.get("predicted") is not None:
        raise InvalidArgument("predicted", "given", "None with skip (the predictions of the groups that run)")
    result = run_oversampled_steps([g for g, on in zip(groups, runs) if on], policy, valid=valid[runs],
                                   filter_history=history if order else None, **shared)
    return result, runs


DRIFT_COLUMNS = ["over-sampling batch / B", "partial rollout", "drift (log-odds per epoch)", "epochs recorded", "run",
                 "settings", "kept tokens/s x slime", "lowest", "slower by > 0.1%", "skipped share of prompts reached",
                 "skipped prompts that would have passed, per kept group", "kept groups' mean pass rate"]


def drift_rows(settings: list) -> list:
    """slime_difficulty_drift's rows from its settings ([workload, prompts, replicas, pool, [over, partial], {"drift|
    epochs|run": [...]}], several draws pooled)."""
    rows = []
    for mode in dict.fromkeys(tuple(x[4]) for x in settings):
        mine = [x[5] for x in settings if tuple(x[4]) == mode]
        for drift in DRIFTS:
            for epochs in HISTORY_EPOCHS:
                base = [out[f"{drift}|{epochs}|{DRIFT_RUNS[0]}"][0] for out in mine]
                for label in DRIFT_RUNS:
                    vals = [out[f"{drift}|{epochs}|{label}"] for out in mine]
                    ratio = np.array([v[0] / b for v, b in zip(vals, base)])
                    rows.append([mode[0], "yes" if mode[1] else "no", drift, epochs, label, len(mine),
                                 float(ratio.mean()), float(ratio.min()), int(np.sum(ratio < 0.999))]
                                + [float(np.mean([v[i] for v in vals])) for i in (2, 1, 3)])
    return rows


def slime_difficulty_drift(quick: bool) -> tuple[str, dict]:
    """GRESO's skip and the filter order when prompts get easier between epochs, on rollout_partial's grid (one
    draw, --seed)."""
    return _difficulty_section(_drift_unit, DRIFT_MODES, (1.5, True), drift_rows, DRIFT_COLUMNS,
                               f"GRESO's skip and the filter order when the policy learns ({_cost_label()}, seed "
                               f"{ROLLOUT_SEED}, {DYNAMIC_STEPS} steps of the epoch after those recorded, "
                               "rollout_partial's grid): kept tokens per modelled second x slime as it ships in the "
                               "same epoch", quick)


# slime_order_horizon: the filter order and GRESO's skip over a longer run of slime's dynamic sampling. The sections
# above run 5 steps; with partial rollout a step's aborted groups come back to the next one with their tokens, so an
# order that puts the likely-dropped groups last defers their work into the carried pile rather than saving it, and
# 5 steps end before the deferred work is paid for. One run of HORIZON_STEPS steps per setting, mode and row, its
# kept tokens per second read after each of HORIZON_MARKS steps (a step's outcome does not depend on the steps after
# it, so the first 5 are the 5-step run's). Grid: rollout_partial's settings of 64 prompts (20 steps of 256 would
# need more prompts than CASTILLO's bundled 3,598; 30 of 64 ran out of them without partial rollout). Rows: (label,
# drift in log-odds per epoch, epochs recorded, the order's history: None, "recorded" or "oracle", GRESO's skip);
# each against slime as it ships under the same drift.
HORIZON_STEPS = 20
HORIZON_MARKS = (5, 10, 15, 20)
HORIZON_GRID = [x for x in PARTIAL_GRID if x[1] == 64]
HORIZON_MODES = ((1.0, False), (1.5, False), (1.0, True), (1.5, True))
HORIZON_RUNS = (
    ("slime as it ships", 0.0, 1, None, False),
    ("slime + lengthsched_filter_order (one earlier epoch recorded)", 0.0, 1, "recorded", False),
    ("slime + the order by this epoch's own outcomes (oracle)", 0.0, 1, "oracle", False),
    ("slime + lengthsched_selective_rollout (one earlier epoch; changes the data)", 0.0, 1, None, True),
    ("slime + lengthsched_selective_rollout + lengthsched_filter_order (one earlier epoch; changes the data)", 0.0, 1,
     "recorded", True),
    ("slime as it ships, the policy learning (drift 0.5, four epochs recorded)", 0.5, 4, None, False),
    ("slime + lengthsched_filter_order, the policy learning (drift 0.5, four epochs recorded)", 0.5, 4, "recorded",
     False),
)


def _verdicts(rates, size: int, seed: int, runs: tuple) -> dict:
    """The filter's verdicts this epoch per (drift, epochs recorded) of ``runs`` ((label, drift, epochs, ...)): each
    pair drawn once, the prompts' rates learnt over the recorded epochs."""
    from simulate.difficulty import filter_passes, learnt_rates

    return {(drift, epochs): filter_passes(learnt_rates(rates, epochs, drift=drift, seed=seed), size, seed=seed,
                                           epoch=epochs) for _, drift, epochs, *_ in runs}


def _at_marks(result, *names: str) -> list[np.ndarray]:
    """Per name of a step record's field, its running sum over ``result``'s steps read after each of
    HORIZON_MARKS."""
    at = np.array(HORIZON_MARKS) - 1
    return [np.cumsum([getattr(s, name) for s in result.steps])[at] for name in names]


def _horizon_unit(args) -> dict:
    """One setting and mode of slime_order_horizon: per HORIZON_RUNS row, [[kept tokens per second after each of
    HORIZON_MARKS steps], [filtered share of the generated tokens after each]]."""
    from simulate.difficulty import pass_rates
    from simulate.oversampling import submitted_per_step

    workload, prompts, replicas, factor, seed, cost_text, (over, carry) = args
    need = HORIZON_STEPS * submitted_per_step(prompts, over) * 3  # every CASTILLO prompt at 1x: the skip takes some
    groups, _, _, _, common = _rollout_setting(workload, need, replicas, factor, seed, cost_text)
    rates = pass_rates(groups, seed=seed)
    shared = dict(batch=prompts, oversample=over, steps=HORIZON_STEPS, partial=carry, in_flight=SLIME_CONCURRENCY *
                  replicas, filter_seed=seed, refill=True, router="cache_aware", **common)
    verdicts = _verdicts(rates, len(groups[0].lengths), seed, HORIZON_RUNS)
    out = {}
    for label, drift, epochs, known, skip in HORIZON_RUNS:
        r, _ = _after_epochs(groups, rates, verdicts[drift, epochs], shared, epochs=epochs, drift=drift, seed=seed,
                             order=known, skip=skip)
        seconds, kept, filtered, decoded = _at_marks(r, "seconds", "kept_tokens", "filtered_tokens", "decoded_tokens")
        out[label] = [(kept / seconds).tolist(), (filtered / np.maximum(1, decoded)).tolist()]
    return out


HORIZON_COLUMNS = ["over-sampling batch / B", "partial rollout", "run", "settings"] + [
    f"kept tokens/s x slime after {m} steps" for m in HORIZON_MARKS] + [
    f"lowest after {HORIZON_MARKS[-1]}", f"slower by > 0.1% after {HORIZON_MARKS[-1]}",
    f"filtered share of generated after {HORIZON_MARKS[0]}", f"after {HORIZON_MARKS[-1]}"]


def _against_base(settings: list, runs: tuple):
    """Per mode of ``settings`` ([workload, prompts, replicas, pool, [mode], {run: [[kept tokens/s per mark], ...]}])
    and per run of ``runs`` ((label, drift, ...)): the mode, the run's label, the mode's outcomes and, per setting
    and mark, the run's kept tokens per second over those of the first run of the same drift in ``runs``."""
    base_of = {}
    for label, drift, *_ in runs:
        base_of.setdefault(drift, label)
    for mode in dict.fromkeys(tuple(x[4]) for x in settings):
        mine = [x[5] for x in settings if tuple(x[4]) == mode]
        for label, drift, *_ in runs:
            yield mode, label, mine, np.array([np.array(out[label][0]) / np.array(out[base_of[drift]][0])
                                               for out in mine])


def horizon_rows(settings: list) -> list:
    """slime_order_horizon's rows from its settings ([workload, prompts, replicas, pool, [over, partial], {run:
    [[kept tokens/s per mark], [filtered share per mark]]}], several draws pooled); each run against slime as it
    ships under the same drift (the first row of its drift in HORIZON_RUNS)."""
    rows = []
    for mode, label, mine, ratio in _against_base(settings, HORIZON_RUNS):
        filtered = np.array([out[label][1] for out in mine])
        rows.append([mode[0], "yes" if mode[1] else "no", label, len(mine), *ratio.mean(axis=0).tolist(),
                     float(ratio[:, -1].min()), int(np.sum(ratio[:, -1] < 0.999)), float(filtered[:, 0].mean()),
                     float(filtered[:, -1].mean())])
    return rows


def slime_order_horizon(quick: bool) -> tuple[str, dict]:
    """The filter order and GRESO's skip over HORIZON_STEPS steps of slime's dynamic sampling, read after each of
    HORIZON_MARKS (rollout_partial's settings of 64 prompts, one draw, --seed)."""
    text, out = _difficulty_section(_horizon_unit, HORIZON_MODES, (1.5, True), horizon_rows, HORIZON_COLUMNS,
                                    f"slime's dynamic sampling over {HORIZON_STEPS} steps ({_cost_label()}, seed "
                                    f"{ROLLOUT_SEED}, rollout_partial's settings of 64 prompts): kept tokens per "
                                    "modelled second x slime as it ships after so many steps", quick,
                                    grid=HORIZON_GRID, steps=HORIZON_STEPS)
    return text, out | {"marks": list(HORIZON_MARKS)}


# verl_dapo_skip: lengthsched inside verl 0.9.1's own dynamic sampling, its v1 sync trainer with
# algorithm.filter_groups (simulate.rollout.Refill(rule="verl"): the batch, then two groups for every dropped one, at
# most max_inflight_gen_batches x the batch in flight, every group submitted drained, the batch taken from those that
# passed in an order unrelated to length and the surplus thrown away; every decision at a poll of its replay buffer,
# VERL_POLL_SECONDS apart), on vLLM's engines behind verl's router, no partial rollout.
# lengthsched.integrations.verl_selective adds two things: its refill (submit only while the groups in flight are
# expected to pass fewer than the batch still needs: Refill's by_need; the same data) and GRESO's skip (changes the
# data). The filter's verdicts from the difficulty model; HORIZON_STEPS steps read after HORIZON_MARKS; rows (label,
# drift in log-odds per epoch, epochs recorded, GRESO's skip, lengthsched's refill), each against verl as it ships
# under the same drift. Modes: max_inflight_gen_batches.
VERL_DAPO_MODES = ((1,), (2,))
#: How the stealing manager's driver runs (verl_stealing's defaults: StealOptions.poll_interval, the stealing client's
#: estimated round trip).
VERL_STEALING = {"snapshot_seconds": StealOptions.poll_interval, "resubmit_seconds": RESUBMIT_ESTIMATE_SECONDS}
#: steal's class options that turn stealing and moves off (its placement and per-replica queues alone).
NO_STEALING = {"ROOM": 0.0, "MIGRATE_CHUNK": None}
# (label, drift, epochs recorded, GRESO's skip, lengthsched's refill by need, the v1 manager: None where verl's own
# AgentLoopManagerTQ dispatches, "longest" where lengthsched.integrations.verl_v1's manager plans each batch longest
# predicted first, each request routed to the fewest in flight as verl's router does, "steal" where its stealing
# manager plans each batch with steal's placement and its driver steals (steal_observed at VERL_STEALING), "placed"
# where the same placement and queues run with nothing stolen or moved (steal with NO_STEALING: what the
# placement alone is worth); realistic predictions for all)
VERL_DAPO_RUNS = (
    ("verl's dynamic sampling as it ships", 0.0, 1, False, False, None),
    ("verl + verl_selective's refill (the same data)", 0.0, 1, False, True, None),
    ("verl + verl_selective's skip (one earlier epoch recorded; changes the data)", 0.0, 1, True, False, None),
    ("verl + verl_selective's skip and refill (one earlier epoch recorded; changes the data)", 0.0, 1, True, True,
     None),
    ("verl + the v1 manager longest predicted first (not its default under the filter)", 0.0, 1, False, False,
     "longest"),
    ("verl + the v1 manager longest predicted first + verl_selective's refill", 0.0, 1, False, True, "longest"),
    ("verl + the v1 stealing manager (steal's placement and batch order; snapshots every 0.25 s, 0.05 s to "
     "resubmit)", 0.0, 1, False, False, "steal"),
    ("verl + the v1 stealing manager + verl_selective's refill", 0.0, 1, False, True, "steal"),
    ("verl + the v1 stealing manager's placement alone (nothing stolen or moved; an analysis row)", 0.0, 1, False,
     False, "placed"),
    ("verl + the v1 stealing manager's placement alone + verl_selective's refill (an analysis row)", 0.0, 1, False,
     True, "placed"),
    ("verl's dynamic sampling as it ships, the policy learning (drift 0.5, four epochs recorded)", 0.5, 4, False,
     False, None),
    ("verl + verl_selective's refill, the policy learning (drift 0.5; the same data)", 0.5, 4, False, True, None),
    ("verl + verl_selective's skip and refill, the policy learning (drift 0.5, four epochs recorded; changes the "
     "data)", 0.5, 4, True, True, None),
)


def _verl_dapo_unit(args) -> dict:
    """One setting and mode of verl_dapo_skip: per VERL_DAPO_RUNS row, [[kept tokens per second after each of
    HORIZON_MARKS steps], [filtered share of the generated tokens after each], [surplus share (passed, thrown
    away) after each], skipped share of the prompts reached, skipped prompts that would have passed per kept
    group]."""
    from simulate.difficulty import pass_rates

    workload, prompts, replicas, factor, seed, cost_text, (inflight,) = args
    need = HORIZON_STEPS * prompts * 6  # verl refills two per drop: a step draws up to ~3x its batch
    groups, realistic, _, _, common = _rollout_setting(workload, need, replicas, factor, seed, cost_text)
    rates = pass_rates(groups, seed=seed)
    shared = dict(batch=prompts, oversample=1.0, steps=HORIZON_STEPS, partial=False, in_flight=10**9,
                  filter_seed=seed, refill=True, refill_rule="verl", refill_cap=inflight * prompts,
                  refill_poll=VERL_POLL_SECONDS, router="least_loaded", **common)
    verdicts = _verdicts(rates, len(groups[0].lengths), seed, VERL_DAPO_RUNS)
    out = {}
    for label, drift, epochs, skip, need, order in VERL_DAPO_RUNS:
        valid = verdicts[drift, epochs]
        policy, planned, patch = "vllm", {}, {}
        if order == "steal":  # verl_v1's stealing manager, as verl_stealing's defaults run it
            policy, planned = "steal_observed", {"run": partial(run_verl_stealing, **VERL_STEALING),
                                                 "predicted": realistic}
        elif order == "placed":  # its placement and queues, nothing stolen or moved (no snapshots to decide from)
            policy, patch = "steal", NO_STEALING
            planned = {"run": partial(run_verl_stealing, resubmit_seconds=VERL_STEALING["resubmit_seconds"]),
                       "predicted": realistic}
        elif order is not None:
            planned = {"run": partial(run_verl_planned, order=order), "predicted": realistic}
        with patched(POLICIES[policy].cls, **patch):
            r, runs = _after_epochs(groups, rates, valid, shared | {"refill_need": need} | planned, epochs=epochs,
                                    drift=drift, seed=seed, order=None, skip=skip, policy=policy)
        seconds, kept, filtered, surplus, decoded = _at_marks(r, "seconds", "kept_tokens", "filtered_tokens",
                                                              "dropped_tokens", "decoded_tokens")
        _, reached, lost = _kept_after_skip(r, runs, valid)
        out[label] = [(kept / seconds).tolist(), (filtered / np.maximum(1, decoded)).tolist(),
                      (surplus / np.maximum(1, decoded)).tolist(),
                      float(np.mean(~runs[:reached])) if reached else 0.0, lost]
    return out


VERL_DAPO_COLUMNS = ["max_inflight_gen_batches", "run", "settings"] + [
    f"kept tokens/s x verl after {m} steps" for m in HORIZON_MARKS] + [
    f"lowest after {HORIZON_MARKS[-1]}", f"slower by > 0.1% after {HORIZON_MARKS[-1]}",
    f"filtered share of generated after {HORIZON_MARKS[-1]}", f"surplus share after {HORIZON_MARKS[-1]}",
    "skipped share of prompts reached", "skipped prompts that would have passed, per kept group"]


def verl_dapo_rows(settings: list) -> list:
    """verl_dapo_skip's rows from its settings ([workload, prompts, replicas, pool, [inflight], {run: [...]}],
    several draws pooled); each run against verl as it ships under the same drift."""
    rows = []
    for mode, label, mine, ratio in _against_base(settings, VERL_DAPO_RUNS):
        rows.append([mode[0], label, len(mine), *ratio.mean(axis=0).tolist(), float(ratio[:, -1].min()),
                     int(np.sum(ratio[:, -1] < 0.999))]
                    + [float(np.mean([out[label][i][-1] for out in mine])) for i in (1, 2)]
                    + [float(np.mean([out[label][i] for out in mine])) for i in (3, 4)])
    return rows


def verl_dapo_skip(quick: bool) -> tuple[str, dict]:
    """lengthsched's refill and GRESO's skip inside verl's v1 dynamic sampling over HORIZON_STEPS steps, read after
    each of HORIZON_MARKS (rollout_partial's settings of 64 prompts, one draw, --seed)."""
    text, out = _difficulty_section(_verl_dapo_unit, VERL_DAPO_MODES, (1,), verl_dapo_rows, VERL_DAPO_COLUMNS,
                                    f"verl's dynamic sampling (v1 sync trainer) over {HORIZON_STEPS} steps "
                                    f"({_cost_label()}, seed {ROLLOUT_SEED}, rollout_partial's settings of 64 "
                                    "prompts, vLLM + verl's router): kept tokens per modelled second x verl as it "
                                    "ships after so many steps", quick, grid=HORIZON_GRID, steps=HORIZON_STEPS)
    return text, out | {"marks": list(HORIZON_MARKS)}


PARTIAL_COLUMNS = ["over-sampling", "partial rollout", "run", "settings", "kept tokens/s x vllm + verl (1.0)",
                   "lowest", "long tail only", "x vllm + verl, same over-sampling", "worst", "slower by > 0.1%",
                   "on-policy kept tokens/s x vllm + verl (1.0)", "stale share of kept tokens", "highest",
                   "most steps a kept group waited", "dropped share of generated", "kept / drawn mean length",
                   "lowest", "filtered share of generated", "groups short of B", "mean age of kept tokens (steps)"]


def partial_rows(settings: list, runs=PARTIAL_RUNS) -> list:
    """The rows of rollout_partial's table from its settings ([over-sampling, partial rollout (a bool, or a
    staleness limit "K wait" / "K drop"), workload, prompts, replicas, pool, {run: (seconds, kept tokens,
    stale share, dropped share, kept length ratio, recomputed tokens, most steps waited, ...)}]): per mode
    and run (of ``runs``), kept tokens per second against vLLM + verl without over-sampling on the same
    setting, and against vLLM + verl in the same mode. A setting may carry its draw as an eighth item
    (settings of several seeds pooled: means over all of them)."""
    base_label = runs[0][0]

    def speed(runs, label):
        return runs[label][1] / runs[label][0]

    def key(x):  # a setting, and its draw where several runs' settings are pooled (combine_draws.py)
        return tuple(x[2:6]) + tuple(x[7:8])

    reference = {key(x): speed(x[6], base_label) for x in settings if (x[0], x[1]) == (1.0, False)}
    rows = []
    for mode in dict.fromkeys((x[0], x[1]) for x in settings):
        mine = [x for x in settings if (x[0], x[1]) == mode]
        for label, *_ in runs:
            if label not in mine[0][6]:
                continue
            ratio = np.array([speed(x[6], label) / reference[key(x)] for x in mine])
            same = np.array([speed(x[6], label) / speed(x[6], base_label) for x in mine])
            tail = np.array([r for x, r in zip(mine, ratio) if x[2] == "long tail"])
            stale = np.array([x[6][label][2] for x in mine])
            dropped = np.array([x[6][label][3] for x in mine])
            length = np.array([x[6][label][4] for x in mine])
            carry = f"yes, {mode[1]}" if isinstance(mode[1], str) else "yes" if mode[1] else "no"
            rows.append([mode[0], carry, label, len(mine), float(ratio.mean()), float(ratio.min()),
                         float(tail.mean()) if len(tail) else float("nan"), float(same.mean()), float(same.min()),
                         int(np.sum(same < 1 / 1.001)), float((ratio * (1 - stale)).mean()), float(stale.mean()),
                         float(stale.max()), max(x[6][label][6] for x in mine), float(dropped.mean()),
                         float(length.mean()), float(length.min()),
                         float(np.mean([x[6][label][7] if len(x[6][label]) > 7 else 0.0 for x in mine])),
                         int(sum(x[6][label][8] if len(x[6][label]) > 8 else 0 for x in mine)),
                         float(np.mean([x[6][label][9] for x in mine])) if len(mine[0][6][label]) > 9
                         else float("nan")])
    return rows


# rollout_staleness: over-sampled steps with partial rollout under a staleness limit (run_oversampled_steps'
# max_carry, carry_limit): the modes, and the runs (as PARTIAL_RUNS)
STALENESS_MODES = ((1.0, False), (1.5, False), (1.5, True), (1.5, "1 wait"), (1.5, "1 drop"), (1.5, "2 wait"),
                   (1.5, "2 drop"))
STALENESS_RUNS = (PARTIAL_RUNS[0], PARTIAL_RUNS[4])


def rollout_staleness(quick: bool) -> tuple[str, list]:
    """Partial rollout under a staleness limit: a group may wait at most K steps between its first
    submission and the step that keeps it; "wait", the step does not end before the groups that old finish;
    "drop", they are thrown away instead of carried once more. Kept tokens per modelled second against vLLM
    + verl without over-sampling, and the kept tokens' age (what AReaL and verl's fully-async trainer bound)."""
    grid, modes, steps = PARTIAL_GRID, STALENESS_MODES, PARTIAL_STEPS
    if quick:
        grid, modes, steps = [("castillo", 16, 2, 4), ("long tail", 16, 2, 4)], ((1.0, False), (1.5, "1 wait")), 3
    units = [(w, b, r, f, ROLLOUT_SEED, ROLLOUT_COST, m, None) for m in modes for w, b, r, f in grid]
    results = _pool_map(partial(_rollout_partial_unit, steps=steps, runs=STALENESS_RUNS), units)
    settings = [[u[6][0], u[6][1], _workload_label(u[0]), u[1], u[2], f"{u[3]} x L_max",
                 {label: list(v) for label, v in out.items()}] for u, out in zip(units, results)]
    rows = partial_rows(settings, STALENESS_RUNS)
    text = table(f"Partial rollout under a staleness limit ({_cost_label()}, seed {ROLLOUT_SEED}, L_max 4096, G = 16, "
                 f"{steps} steps of B groups kept, B x over-sampling submitted; 'K wait': a step waits for and keeps "
                 "every group submitted K steps ago, 'K drop': such a group is thrown away instead of carried "
                 "again): kept tokens per modelled second x vLLM + verl's without over-sampling, and x vLLM + "
                 "verl's in the same mode", PARTIAL_COLUMNS, rows)
    return text, {"rows": rows, "settings": settings, "steps": steps}


ASYNC_STEPS = 8  # learner steps per run
ASYNC_SHARES = (0.25, 0.5, 1.0)  # the learner's seconds per step, as a share of the synchronous rollout's mean
ASYNC_UPDATE_SECONDS = 1.0  # every engine paused while the weights are sent (Qwen3-1.7B: 3.4 GB)
# (label, engine, max_staleness or None for synchronous steps run by run_rollout, router or policy, concurrent
# groups as a multiple of the batch (None: AReaL's default, the batch), predictions)
ASYNC_RUNS = (
    ("sync: sglang, each request to the next server (AReaL, max_staleness 0)", "sglang", 0, "round_robin", None,
     None),
    ("sync: steal_sglang (lengthsched, realistic predictions)", "sglang", None, "steal_sglang", None, "realistic"),
    ("async: sglang, max_staleness 1 (AReaL)", "sglang", 1, "round_robin", None, None),
    ("async: sglang, max_staleness 2 (AReaL)", "sglang", 2, "round_robin", None, None),
    ("async: sglang, max_staleness 4 (AReaL)", "sglang", 4, "round_robin", None, None),
    ("async: sglang, max_staleness 2, 2 x batch in flight", "sglang", 2, "round_robin", 2, None),
    ("async: sglang, max_staleness 2, half the batch in flight", "sglang", 2, "round_robin", 0.5, None),
    ("async: sglang, max_staleness 2, a quarter of the batch in flight", "sglang", 2, "round_robin", 0.25, None),
    ("async: sglang, max_staleness 2, least predicted work (lengthsched)", "sglang", 2, "least_work", None,
     "realistic"),
    ("sync: vllm + verl routing", "vllm", None, "vllm", None, None),
    ("sync: steal (lengthsched, realistic predictions)", "vllm", None, "steal", None, "realistic"),
    ("async: vllm, max_staleness 1", "vllm", 1, "round_robin", None, None),
    ("async: vllm, max_staleness 2", "vllm", 2, "round_robin", None, None),
    ("async: steal_sglang, max_staleness 1, groups placed as steal places them, stolen (lengthsched)", "sglang", 1,
     "placed+steal", None, "realistic"),
    ("async: steal_sglang, max_staleness 2, groups placed as steal places them, stolen (lengthsched)", "sglang", 2,
     "placed+steal", None, "realistic"),
    ("async: steal, max_staleness 1, groups placed as steal places them, stolen (lengthsched, vLLM's engines)",
     "vllm", 1, "placed+steal", None, "realistic"),
)
# lengthsched inside AReaL's loop, each against AReaL's loop on the same engines at the same staleness bound
ASYNC_PAIRS = (
    ("async: steal_sglang, max_staleness 1, groups placed as steal places them, stolen (lengthsched)",
     "async: sglang, max_staleness 1 (AReaL)"),
    ("async: steal_sglang, max_staleness 2, groups placed as steal places them, stolen (lengthsched)",
     "async: sglang, max_staleness 2 (AReaL)"),
    ("async: steal_sglang, max_staleness 2, groups placed as steal places them, stolen (lengthsched)",
     "async: sglang, max_staleness 2, least predicted work (lengthsched)"),
    ("async: steal, max_staleness 1, groups placed as steal places them, stolen (lengthsched, vLLM's engines)",
     "async: vllm, max_staleness 1"),
)
ASYNC_COLUMNS = ["share", "run", "settings", "tokens/s x sync sglang", "worst", "on-policy tokens/s x",
                 "stale share", "mean lag", "learner idle", "seconds per step x", "trained length x drawn"]


def _against(reference: str) -> list[str]:
    """ASYNC_COLUMNS with the tokens per second measured against ``reference`` instead of synchronous SGLang."""
    return [c if c != "tokens/s x sync sglang" else f"tokens/s x {reference}" for c in ASYNC_COLUMNS]


def _async_unit(args, runs=ASYNC_RUNS, steps=ASYNC_STEPS):
    """One setting: every run of ``runs`` for ``steps`` learner steps whose seconds are ``share`` x the mean
    rollout of the synchronous SGLang steps, plus ASYNC_UPDATE_SECONDS per update. Per run: (seconds, trained
    tokens, stale share, mean lag, learner idle share, interrupted requests, recomputed tokens, uneven idle
    share)."""
    from simulate.asynchronous import run_async_rollout

    prompts = args[1]
    most = max(r[2] or 0 for r in runs)
    groups, known, kw, train = _async_setup(args, steps, (steps + most) * prompts, "sglang")
    out = {"train seconds": train}
    for label, engine, eta, how, concurrent, pred, *extra in runs:
        if eta is None:  # synchronous steps: each batch's rollout, then the learner and the update
            out[label] = _sync_row(groups, how, known[pred], train, kw)
            continue
        most_in_flight = None if concurrent is None else max(1, int(concurrent * prompts))
        router, _, steal = how.partition("+")  # "placed+steal": the router, and lengthsched's stealing on top
        predicted = _default_planner(kw["max_new_tokens"]) if pred == "online" else known[pred]
        r = run_async_rollout(groups, max_staleness=eta, train_seconds=train, update_seconds=ASYNC_UPDATE_SECONDS,
                              policy=engine, router=router, predicted=predicted, max_concurrent=most_in_flight,
                              steal=steal == "steal", **(extra[0] if extra else {}), **kw)
        out[label] = _async_row(r)
    return out


# lengthsched.integrations.areal inside AReaL's loop: each group placed by the integration's StreamPlacer (router
# "stream", its prefill cap PREFILL_SHARE) from the predicted tokens each server has in flight, no stealing (AReaL
# cannot move one request), against AReaL's round robin at the same staleness bound; with the realistic
# predictions and with the integration's default predictor (online, from max_new_tokens / 2, learning from the groups
# back); on SGLang's engines and vLLM's; for what stealing would add, steal_sglang over steal's placement
# (async_rl's row); and with 4 trainer ranks, each routing its own share of the groups by itself (AReaL's SPMD
# mode: one engine per rank). _async_unit's runs, each with run_async_rollout's extra arguments.
# The integration as it ships at a staleness bound of 1 or more (router "stream" in the run's how): whole groups
# (at 0 its install keeps AReaL's order, the round robin's runs). AREAL_EXTRA, the placer's spread
# estimate (ways None), was its default until 2026-11-30: async_areal's and async_areal_epochs' integration rows
# were recorded with it and keep it.
AREAL_WHOLE = {k: v for k, v in AREAL_INTEGRATION.items() if k != "router"}
AREAL_EXTRA = {**AREAL_WHOLE, "ways": None}
AREAL_RUNS = (
    ("AReaL: sglang, max_staleness 1 (round robin)", "sglang", 1, "round_robin", None, None),
    ("AReaL + lengthsched.integrations.areal, max_staleness 1", "sglang", 1, "stream", None, "realistic",
     AREAL_EXTRA),
    ("AReaL + lengthsched.integrations.areal, max_staleness 1, no trained predictor (online, from max_new_tokens / 2)",
     "sglang", 1, "stream", None, "online", AREAL_EXTRA),
    ("AReaL: sglang, max_staleness 2 (round robin)", "sglang", 2, "round_robin", None, None),
    ("AReaL + lengthsched.integrations.areal, max_staleness 2", "sglang", 2, "stream", None, "realistic",
     AREAL_EXTRA),
    ("AReaL: vllm, max_staleness 1 (round robin)", "vllm", 1, "round_robin", None, None),
    ("AReaL + lengthsched.integrations.areal, vllm, max_staleness 1", "vllm", 1, "stream", None, "realistic",
     AREAL_EXTRA),
    ("steal_sglang, max_staleness 1, groups placed as steal places them, stolen (not in the integration)", "sglang",
     1, "placed+steal", None, "realistic"),
    ("AReaL: sglang, max_staleness 1, 4 trainer ranks each routing its own groups (round robin)", "sglang", 1,
     "round_robin", None, None, {"ranks": 4}),
    ("AReaL + lengthsched.integrations.areal, max_staleness 1, on each of 4 trainer ranks", "sglang", 1, "stream",
     None, "realistic", {**AREAL_EXTRA, "ranks": 4}),
)
AREAL_PAIRS = (
    (AREAL_RUNS[1][0], AREAL_RUNS[0][0]),
    (AREAL_RUNS[2][0], AREAL_RUNS[0][0]),
    (AREAL_RUNS[4][0], AREAL_RUNS[3][0]),
    (AREAL_RUNS[6][0], AREAL_RUNS[5][0]),
    (AREAL_RUNS[7][0], AREAL_RUNS[1][0]),
    (AREAL_RUNS[9][0], AREAL_RUNS[8][0]),
    (AREAL_RUNS[8][0], AREAL_RUNS[0][0]),
)
AREAL_COLUMNS = _against("AReaL at max_staleness 1")


# async_areal_ways: the integration with whole groups (install(..., ways=1), its default since 2026-11-30) instead
# of its placer's spread estimate, on async_areal's settings; the estimate's rows are async_areal's own (the same
# settings and draws).
AREAL_WAYS_RUNS = (
    AREAL_RUNS[0],
    ("AReaL + lengthsched.integrations.areal, whole groups (ways=1), max_staleness 1", "sglang", 1, "stream", None,
     "realistic", AREAL_WHOLE),
    ("AReaL + lengthsched.integrations.areal, whole groups (ways=1), max_staleness 1, no trained predictor (online)",
     "sglang", 1, "stream", None, "online", AREAL_WHOLE),
    AREAL_RUNS[5],
    ("AReaL + lengthsched.integrations.areal, whole groups (ways=1), vllm, max_staleness 1", "vllm", 1, "stream",
     None, "realistic", AREAL_WHOLE),
    AREAL_RUNS[8],
    ("AReaL + lengthsched.integrations.areal, whole groups (ways=1), max_staleness 1, on each of 4 trainer ranks",
     "sglang", 1, "stream", None, "realistic", {**AREAL_WHOLE, "ranks": 4}),
)
AREAL_WAYS_PAIRS = tuple((AREAL_WAYS_RUNS[i][0], AREAL_WAYS_RUNS[j][0]) for i, j in ((1, 0), (2, 0), (4, 3), (6, 5)))


def _areal_title(what: str, bound: int):
    """The title (a function of the steps) of an AReaL section: ``what``, its settings, against AReaL at
    ``bound``."""
    return lambda steps: (f"{what} ({_cost_label()}, seed {ROLLOUT_SEED}, L_max 4096, G = 16, {steps} learner steps "
                          "of B groups, the learner's seconds per step = share x the mean synchronous SGLang rollout, "
                          f"each update pauses every engine {ASYNC_UPDATE_SECONDS:g} s): trained tokens per modelled "
                          f"second x AReaL's at max_staleness {bound}")


def async_areal_ways(quick: bool) -> tuple[str, list]:
    """lengthsched.integrations.areal with whole groups (ways=1) against AReaL's round robin, on async_areal's
    settings."""
    return _async_section(
        quick, partial(_async_unit, runs=AREAL_WAYS_RUNS), AREAL_WAYS_RUNS, AREAL_WAYS_PAIRS, AREAL_COLUMNS,
        _areal_title("lengthsched.integrations.areal with whole groups (ways=1) inside AReaL's loop", 1),
        "lengthsched.integrations.areal with whole groups, per setting against AReaL's loop")


# async_areal_sync: the integration at AReaL's default max_head_offpolicyness 0 (each version's groups from its own
# weights: nothing of the next batch starts before the update, its learner still takes groups as they finish),
# whole groups (its default) against its spread estimate, with the realistic predictions and without a trained
# predictor, on async_areal's settings (their draws; the runs differ in the bound).
_K0 = "max_staleness 0 (AReaL's default max_head_offpolicyness)"
AREAL_SYNC_RUNS = (
    (f"AReaL: sglang, {_K0} (round robin)", "sglang", 0, "round_robin", None, None),
    ("AReaL + lengthsched.integrations.areal, whole groups (ways=1), max_staleness 0", "sglang", 0, "stream", None,
     "realistic", AREAL_WHOLE),
    ("AReaL + lengthsched.integrations.areal, spread estimate (ways=None), max_staleness 0", "sglang", 0, "stream",
     None, "realistic", AREAL_EXTRA),
    ("AReaL + lengthsched.integrations.areal, whole groups (ways=1), max_staleness 0, no trained predictor (online)",
     "sglang", 0, "stream", None, "online", AREAL_WHOLE),
    ("AReaL + lengthsched.integrations.areal, spread estimate (ways=None), max_staleness 0, no trained predictor "
     "(online)", "sglang", 0, "stream", None, "online", AREAL_EXTRA),
)
AREAL_SYNC_PAIRS = tuple((AREAL_SYNC_RUNS[i][0], AREAL_SYNC_RUNS[j][0])
                         for i, j in ((1, 0), (2, 0), (1, 2), (3, 0), (4, 0), (3, 4)))
AREAL_SYNC_COLUMNS = _against("AReaL at max_staleness 0")


def async_areal_sync(quick: bool) -> tuple[str, list]:
    """lengthsched.integrations.areal at AReaL's default max_head_offpolicyness 0: whole groups and the spread
    estimate against AReaL's round robin, on async_areal's settings."""
    return _async_section(
        quick, partial(_async_unit, runs=AREAL_SYNC_RUNS), AREAL_SYNC_RUNS, AREAL_SYNC_PAIRS, AREAL_SYNC_COLUMNS,
        _areal_title("lengthsched.integrations.areal at AReaL's default max_head_offpolicyness 0", 0),
        "lengthsched.integrations.areal at max_staleness 0, per setting against AReaL's loop and the estimate")


# async_areal_bound2: whole groups at a staleness bound of 2 (what install's AUTO gives there), against AReaL's round
# robin and the spread estimate at 2 (async_areal's runs, the same draws), with and without a trained predictor.
AREAL_BOUND2_RUNS = (
    AREAL_RUNS[3],
    AREAL_RUNS[4],
    ("AReaL + lengthsched.integrations.areal, whole groups (ways=1), max_staleness 2", "sglang", 2, "stream", None,
     "realistic", AREAL_WHOLE),
    ("AReaL + lengthsched.integrations.areal, whole groups (ways=1), max_staleness 2, no trained predictor (online)",
     "sglang", 2, "stream", None, "online", AREAL_WHOLE),
)
AREAL_BOUND2_PAIRS = tuple((AREAL_BOUND2_RUNS[i][0], AREAL_BOUND2_RUNS[j][0])
                           for i, j in ((1, 0), (2, 0), (2, 1), (3, 0)))
AREAL_BOUND2_COLUMNS = _against("AReaL at max_staleness 2")


def async_areal_bound2(quick: bool) -> tuple[str, list]:
    """lengthsched.integrations.areal with whole groups at a staleness bound of 2 against AReaL's round robin and
    the spread estimate there, on async_areal's settings."""
    return _async_section(
        quick, partial(_async_unit, runs=AREAL_BOUND2_RUNS), AREAL_BOUND2_RUNS, AREAL_BOUND2_PAIRS,
        AREAL_BOUND2_COLUMNS, _areal_title("lengthsched.integrations.areal with whole groups at max_staleness 2", 2),
        "lengthsched.integrations.areal at max_staleness 2, per setting against AReaL's loop and the estimate")


def async_areal(quick: bool) -> tuple[str, list]:
    """lengthsched.integrations.areal inside AReaL's loop (each group placed by predicted work, no stealing)
    against AReaL's round robin, on async_rl's settings."""
    return _async_section(
        quick, partial(_async_unit, runs=AREAL_RUNS), AREAL_RUNS, AREAL_PAIRS, AREAL_COLUMNS,
        lambda steps: f"lengthsched.integrations.areal inside AReaL's loop ({_cost_label()}, seed {ROLLOUT_SEED}, "
                      f"L_max 4096, G = 16, {steps} learner steps of B groups, the learner's seconds per step = "
                      "share x the mean synchronous SGLang rollout, each update pauses every engine "
                      f"{ASYNC_UPDATE_SECONDS:g} s): trained tokens per modelled second x AReaL's at max_staleness 1",
        "lengthsched.integrations.areal, per setting against AReaL's loop")


# async_areal_epochs: what each AReaL rank knows. AReaL's sampler deals the prompts to its trainer ranks afresh every
# epoch, so the integration's online predictor on a rank has seen about one prompt in D of the epoch's before. Each
# setting: AREAL_EPOCHS epochs of the same AREAL_EPOCH_STEPS x B prompts (fresh completions, a fresh order each
# epoch, group g on rank g mod D), the learner's seconds AREAL_EPOCH_SHARE x the mean synchronous SGLang rollout,
# max_staleness 1, SGLang's engines. Runs: (label, ranks, router, predictions, the ranks pool what they learn):
# predictions None (round robin), "realistic" (a trained prompt-level predictor, log-normal sigma 0.5, the same
# error every epoch), "alone" (the integration's default online predictor on each rank, fed its own groups),
# "one" (one online predictor fed every rank's groups: what a single process would know; not a deployment),
# "oracle" (every completion's own length) and "constant" (CONSTANT_PREDICTION tokens for every completion).
AREAL_EPOCHS = 3
AREAL_EPOCH_STEPS = 4
AREAL_EPOCH_SHARE = 0.5
AREAL_EPOCH_RUNS = tuple(run for ranks in (4, 8) for run in (
    (f"AReaL on {ranks} ranks (round robin)", ranks, "round_robin", None, False),
    (f"+ integration on each of {ranks} ranks, online predictor learning alone", ranks, "stream", "alone", False),
    (f"+ integration on each of {ranks} ranks, online predictors pooled through share_dir", ranks, "stream", "alone",
     True),
    (f"+ integration on each of {ranks} ranks, one online predictor fed every rank's groups (not a deployment)",
     ranks, "stream", "one", False),
    (f"+ integration on each of {ranks} ranks, a trained prompt-level predictor (realistic)", ranks, "stream",
     "realistic", False))) + (
    ("+ integration on each of 4 ranks, every completion's own length (oracle)", 4, "stream", "oracle", False),
    (f"+ integration on each of 4 ranks, {CONSTANT_PREDICTION} tokens for every completion (constant)", 4, "stream",
     "constant", False))


def epoch_columns(epochs: int) -> list[str]:
    """The columns of async_areal_epochs' table with ``epochs`` epochs."""
    return ["run", "settings"] + [c for e in [*(f"epoch {i + 1}" for i in range(epochs)), "all"]
                                  for c in (f"{e}: tokens/s x AReaL", f"{e}: lowest", f"{e}: slower")]


AREAL_EPOCH_COLUMNS = epoch_columns(AREAL_EPOCHS)


def epoch_stream(workload: str, prompts: int, epochs: int, seed: int) -> tuple[list, np.ndarray]:
    """(groups, realistic predictions per completion) of ``epochs`` epochs of the same ``prompts`` prompts: each
    epoch their completions drawn afresh (rollout_groups' ``epoch``) and dealt in a fresh order (a shuffled
    sampler's); the realistic prediction of a prompt is its first epoch's (the trained predictor does not learn)."""
    first, realistic, _, _ = rollout_groups(workload, prompts, seed)
    known = {g.prompt_id: realistic[i * len(g.lengths)] for i, g in enumerate(first)}
    rng = np.random.default_rng([seed, 2026])
    stream = []
    for epoch in range(epochs):
        drawn = first if epoch == 0 else rollout_groups(workload, prompts, seed, epoch=epoch)[0]
        stream += [drawn[i] for i in rng.permutation(len(drawn))]
    return stream, np.concatenate([np.full(len(g.lengths), known[g.prompt_id]) for g in stream])


def _areal_epochs_unit(args, epochs: int = AREAL_EPOCHS, per_epoch: int = AREAL_EPOCH_STEPS,
                       runs=AREAL_EPOCH_RUNS):
    """One setting of async_areal_epochs: per run, per epoch [modelled seconds, trained tokens] (an epoch: its
    ``per_epoch`` learner steps, the last epoch one fewer: at max_staleness 1 the stream's last batch is in flight
    when the run ends), and the learner's seconds per step."""
    from simulate.asynchronous import run_async_rollout, run_sync_steps

    workload, prompts, replicas, factor, seed, cost_text = args
    lmax = 4096
    stream, realistic = epoch_stream(workload, per_epoch * prompts, epochs, seed)
    kw = dict(batch=prompts, replicas=replicas, budget_tokens=factor * lmax, max_new_tokens=lmax,
              cost=_rollout_cost(cost_text), max_num_seqs=ROLLOUT_MAX_SEQS)
    reference = run_sync_steps(stream, "sglang", router="least_loaded", train_seconds=0.0, steps=per_epoch, **kw)
    train = AREAL_EPOCH_SHARE * float(np.mean([r.seconds for r in reference.rollouts]))
    out = {"train seconds": train}
    steps = epochs * per_epoch - 1
    known = {None: None, "realistic": realistic, "oracle": np.concatenate([g.lengths for g in stream]),
             "constant": np.full(len(realistic), CONSTANT_PREDICTION)}
    for label, ranks, router, pred, share in runs:
        # the online predictors learn as the run goes: fresh ones per run
        predicted = (_default_planner(lmax) if pred == "one" else
                     [_default_planner(lmax) for _ in range(ranks)] if pred == "alone" else known[pred])
        r = run_async_rollout(stream, max_staleness=1, steps=steps, train_seconds=train, policy="sglang",
                              update_seconds=ASYNC_UPDATE_SECONDS, router=router, predicted=predicted, ranks=ranks,
                              share_learning=share, **(AREAL_EXTRA if router == "stream" else {}), **kw)
        ends = [0.0] + [r.steps[min(steps, (e + 1) * per_epoch) - 1].update_end for e in range(epochs)]
        out[label] = [[ends[e + 1] - ends[e], int(sum(x.tokens for x in r.steps[e * per_epoch:(e + 1) * per_epoch]))]
                      for e in range(epochs)]
    return out


def areal_epoch_rows(settings: list, runs=AREAL_EPOCH_RUNS) -> list:
    """Per run and epoch (and the whole run): the settings' mean and lowest trained tokens per modelled second over
    AReaL's round robin on as many ranks, and the settings slower than it by more than 0.1%. ``settings``:
    [workload, prompts, replicas, pool, {label: per epoch [seconds, tokens]}]."""
    rows = []
    for label, ranks, *_ in runs:
        ref = next(r[0] for r in runs if r[1] == ranks)
        row = [label, len(settings)]
        epochs = len(settings[0][4][label])
        for e in [*range(epochs), None]:
            def speed(o, name, e=e):
                parts = o[name] if e is None else [o[name][e]]
                return sum(t for _, t in parts) / sum(sec for sec, _ in parts)

            ratio = [speed(s[4], label) / speed(s[4], ref) for s in settings]
            row += [float(np.mean(ratio)), float(np.min(ratio)), int(sum(x < 0.999 for x in ratio))]
        rows.append(row)
    return rows


def async_areal_epochs(quick: bool) -> tuple[str, list]:
    """lengthsched.integrations.areal on several AReaL ranks over epochs of the same prompts: the online predictor
    learning alone on each rank, pooled through share_dir, one fed everything, a trained one."""
    grid, epochs, per_epoch = PARTIAL_GRID, AREAL_EPOCHS, AREAL_EPOCH_STEPS
    if quick:
        grid, epochs, per_epoch = [("castillo", 16, 2, 4), ("long tail", 16, 2, 4)], 2, 2
    units = [(w, b, r, f, ROLLOUT_SEED, ROLLOUT_COST) for w, b, r, f in grid]
    results = _pool_map(partial(_areal_epochs_unit, epochs=epochs, per_epoch=per_epoch), units)
    settings = [[_workload_label(u[0]), u[1], u[2], f"{u[3]} x L_max", out] for u, out in zip(units, results)]
    rows = areal_epoch_rows(settings)
    text = table(f"lengthsched.integrations.areal on several AReaL trainer ranks over {epochs} epochs of the same "
                 f"{per_epoch} x B prompts ({_cost_label()}, seed {ROLLOUT_SEED}, L_max 4096, G = 16, max_staleness "
                 f"1, SGLang's engines, the learner's seconds per step {AREAL_EPOCH_SHARE:g} x the mean synchronous "
                 "SGLang rollout; each epoch the prompts dealt to the ranks afresh): trained tokens per modelled "
                 "second x AReaL's round robin on as many ranks, per epoch ('slower': settings slower by more than "
                 "0.1%)", epoch_columns(epochs), rows)
    return text, {"rows": rows, "settings": settings, "epochs": epochs, "steps_per_epoch": per_epoch}


def _async_section(quick: bool, unit, runs: tuple, pairs: tuple, columns: list, title, paired_title: str):
    """An asynchronous section: ``unit`` (:func:`_async_unit` or :func:`_verl_unit` with ``runs``) on every
    setting (:func:`_async_settings`), its table (``title(steps)``, ``columns``) and its paired table (``pairs``)."""
    settings, steps = _async_settings(unit, quick)
    rows = async_rows(settings, runs)
    text = table(title(steps), async_columns(columns, rows), rows)
    text += "\n" + table(paired_title, PAIRED_COLUMNS, paired_rows(settings, pairs))
    return text, {"rows": rows, "settings": settings, "steps": steps}


def _async_setup(args, steps: int, groups_needed: int, engine: str):
    """(groups, predictions by name, the runs' keyword arguments (run_rollout's with the batch and steps), the
    learner's seconds per step) of one setting ``args`` of the async sections: the learner takes ``share`` x
    the mean rollout of the synchronous steps on ``engine``'s engines with verl's routing."""
    from simulate.asynchronous import run_sync_steps

    workload, prompts, replicas, factor, seed, cost_text, share = args
    groups, realistic, _, _, common = _rollout_setting(workload, groups_needed, replicas, factor, seed, cost_text)
    kw = dict(batch=prompts, steps=steps, **common)
    reference = run_sync_steps(groups, engine, router="least_loaded", train_seconds=0.0, **kw).rollouts
    train = share * float(np.mean([r.seconds for r in reference]))
    return groups, {"realistic": realistic, None: None}, kw, train


def _sync_row(groups, how: str, predicted, train: float, kw: dict, **extra) -> tuple:
    """Synchronous steps of ``how`` (vllm and sglang behind verl's routing), as an async section's row."""
    from simulate.asynchronous import run_sync_steps

    done = run_sync_steps(groups, how, router="least_loaded" if how in ("vllm", "sglang") else None,
                          predicted=predicted, train_seconds=train, update_seconds=ASYNC_UPDATE_SECONDS, **extra, **kw)
    return (done.seconds, done.tokens, 0.0, 0.0, done.learner_idle_share, 0, done.recomputed_tokens,
            done.uneven_share)


def _async_row(r) -> tuple:
    """An AsyncRollout as an async section's row."""
    return (r.seconds, r.consumed_tokens, r.stale_share, r.mean_lag, r.learner_idle_share, r.interrupted,
            r.recomputed_tokens, r.uneven_share)


def async_rows(settings: list, runs=ASYNC_RUNS) -> list:
    """Per (share, run): settings, mean tokens/s over the reference's (the first run), the worst, mean
    on-policy tokens/s over the reference's, mean stale share, mean lag, mean learner idle share, mean
    seconds per step over the reference's, mean trained tokens over the reference's (which trains the
    stream's first groups: the trained groups' length over the drawn ones'), and where every run recorded it
    (results since 2026-11-28) the mean share of the replicas' seconds one sat idle while another ran.
    ``settings``: [share, workload, prompts, replicas, pool, {label: row}]."""
    rows = []
    ref = runs[0][0]
    uneven = all(len(row) > 7 for s in settings for row in s[5].values() if isinstance(row, list | tuple))
    for share in dict.fromkeys(s[0] for s in settings):
        mine = [s[5] for s in settings if s[0] == share]
        for label, *_ in runs:
            speed = [(o[label][1] / o[label][0]) / (o[ref][1] / o[ref][0]) for o in mine]
            fresh = [(1 - o[label][2]) * o[label][1] / o[label][0] / (o[ref][1] / o[ref][0]) for o in mine]
            rows.append([share, label, len(mine), float(np.mean(speed)), float(np.min(speed)), float(np.mean(fresh)),
                         float(np.mean([o[label][2] for o in mine])), float(np.mean([o[label][3] for o in mine])),
                         float(np.mean([o[label][4] for o in mine])),
                         float(np.mean([o[label][0] / o[ref][0] for o in mine])),
                         float(np.mean([o[label][1] / o[ref][1] for o in mine]))]
                        + ([float(np.mean([o[label][7] for o in mine]))] if uneven else []))
    return rows


PAIRED_COLUMNS = ["share", "run", "against", "settings", "tokens/s x against", "lowest", "highest",
                  "slower by > 0.1%", "on-policy tokens/s x against", "lowest on-policy", "stale share +"]


def paired_rows(settings: list, pairs: tuple) -> list:
    """Per (share, pair): each setting's tokens per second of the pair's run over its baseline's (the same stream
    and learner), their mean, lowest and highest, the settings slower by more than 0.1%, the same for on-policy
    tokens per second (mean, lowest), and the mean change in stale share. ``pairs``: (run, baseline) labels;
    ``settings`` as :func:`async_rows` reads them."""
    rows = []
    for share in dict.fromkeys(s[0] for s in settings):
        mine = [s[5] for s in settings if s[0] == share]
        for run, base in pairs:
            speed = np.array([(o[run][1] / o[run][0]) / (o[base][1] / o[base][0]) for o in mine])
            fresh = np.array([((1 - o[run][2]) * o[run][1] / o[run][0]) / ((1 - o[base][2]) * o[base][1] / o[base][0])
                              for o in mine])
            rows.append([share, run, base, len(mine), float(speed.mean()), float(speed.min()), float(speed.max()),
                         int(np.sum(speed < 0.999)), float(fresh.mean()), float(fresh.min()),
                         float(np.mean([o[run][2] - o[base][2] for o in mine]))])
    return rows


def async_columns(columns: list, rows: list) -> list:
    """``columns`` (ASYNC_COLUMNS or VERL_COLUMNS) for :func:`async_rows`' ``rows``, with the uneven idle
    where they have it."""
    return columns + ["uneven idle"] if rows and len(rows[0]) > len(columns) else columns


def _async_settings(unit, quick: bool) -> tuple[list, int]:
    """``unit`` (:func:`_async_unit` or :func:`_verl_unit`) on every setting of PARTIAL_GRID at every learner
    share (a small grid and 3 steps with ``quick``): the settings as async_rows reads them, and the steps."""
    grid, shares, steps = PARTIAL_GRID, ASYNC_SHARES, ASYNC_STEPS
    if quick:
        grid, shares, steps = [("castillo", 16, 2, 4), ("long tail", 16, 2, 4)], (0.5,), 3
    units = [(w, b, r, f, ROLLOUT_SEED, ROLLOUT_COST, share) for share in shares for w, b, r, f in grid]
    results = _pool_map(partial(unit, steps=steps), units)
    settings = [[u[6], _workload_label(u[0]), u[1], u[2], f"{u[3]} x L_max", {k: (list(v) if isinstance(v, tuple)
                                                                                 else v) for k, v in out.items()}]
                for u, out in zip(units, results)]
    return settings, steps


def async_rl(quick: bool) -> tuple[str, list]:
    """Asynchronous RL (AReaL): generation goes on while the learner trains, within a staleness bound, against
    synchronous steps (AReaL with max_staleness 0, lengthsched's steal), the learner's time a share of the
    synchronous rollout's."""
    return _async_section(
        quick, _async_unit, ASYNC_RUNS, ASYNC_PAIRS, ASYNC_COLUMNS,
        lambda steps: f"Asynchronous RL ({_cost_label()}, seed {ROLLOUT_SEED}, L_max 4096, G = 16, {steps} learner "
                      "steps of B groups; the learner's seconds per step = share x the mean synchronous SGLang "
                      f"rollout, each update pauses every engine {ASYNC_UPDATE_SECONDS:g} s): trained tokens per "
                      "modelled second x the synchronous SGLang loop's",
        "lengthsched inside AReaL's loop, per setting against AReaL's loop")


# verl's fully asynchronous recipe (simulate.run_verl_async, verl 0.9.1 unless the row says b178a3c) against
# synchronous steps on vLLM's engines: (label, kind, engine, arguments, predictions); kind "sync"
# (run_sync_steps: the policy in arguments), "verl" (run_verl_async) or "areal" (run_async_rollout). verl's
# defaults: staleness_threshold 0.1, trigger_parameter_sync_step 4, partial rollout, 16 groups in flight per
# server.
VERL_RUNS = (
    ("sync: vllm + verl routing", "sync", "vllm", {"how": "vllm"}, None),
    ("sync: steal (lengthsched, realistic predictions)", "sync", "vllm", {"how": "steal"}, "realistic"),
    ("stream: vllm + verl routing, 4 local updates as groups finish", "sync", "vllm",
     {"how": "vllm", "local_steps": 4}, None),
    ("stream: steal, 4 local updates as groups finish (lengthsched, realistic predictions)", "sync", "vllm",
     {"how": "steal", "local_steps": 4}, "realistic"),
    ("verl fully async: threshold 0, one update per version", "verl", "vllm",
     {"staleness_threshold": 0.0, "local_steps": 1}, None),
    ("verl fully async: threshold 0, 4 local updates (streamed, on-policy)", "verl", "vllm",
     {"staleness_threshold": 0.0}, None),
    ("verl fully async: threshold 0.1 (verl's default)", "verl", "vllm", {"staleness_threshold": 0.1}, None),
    ("verl fully async at b178a3c: threshold 0.1 (round robin, resumed requests re-routed)", "verl", "vllm",
     {"staleness_threshold": 0.1, "version": "b178a3c"}, None),
    ("verl fully async at b178a3c: threshold 0.1, no partial rollout (the update waits)", "verl", "vllm",
     {"staleness_threshold": 0.1, "partial_rollout": False, "version": "b178a3c"}, None),
    ("verl fully async: threshold 0.5", "verl", "vllm", {"staleness_threshold": 0.5}, None),
    ("verl fully async: threshold 1", "verl", "vllm", {"staleness_threshold": 1.0}, None),
    ("verl fully async: threshold 0.5, least predicted work (lengthsched)", "verl", "vllm",
     {"staleness_threshold": 0.5, "router": "least_work"}, "realistic"),
    ("verl fully async: threshold 0, 4 local updates + lengthsched (groups placed as steal places them, stolen)",
     "verl", "vllm", {"staleness_threshold": 0.0, "router": "placed", "steal": True}, "realistic"),
    ("verl fully async: threshold 0.1 + lengthsched (groups placed as steal places them, stolen)", "verl", "vllm",
     {"staleness_threshold": 0.1, "router": "placed", "steal": True}, "realistic"),
    ("verl fully async: threshold 0.1 + lengthsched, 0.05 s to resubmit a stolen request", "verl", "vllm",
     {"staleness_threshold": 0.1, "router": "placed", "steal": True, "resubmit_seconds": 0.05}, "realistic"),
    ("verl fully async: threshold 0.1, verl's routing + lengthsched's stealing", "verl", "vllm",
     {"staleness_threshold": 0.1, "steal": True}, "realistic"),
    ("verl fully async: threshold 0.1, groups placed as steal places them (no stealing)", "verl", "vllm",
     {"staleness_threshold": 0.1, "router": "placed"}, "realistic"),
    ("verl fully async: threshold 0.5 + lengthsched (groups placed as steal places them, stolen)", "verl", "vllm",
     {"staleness_threshold": 0.5, "router": "placed", "steal": True}, "realistic"),
    ("verl fully async: threshold 0, 4 local updates, batch in flight", "verl", "vllm",
     {"staleness_threshold": 0.0, "max_concurrent": 1.0}, None),
    ("async: vllm, max_staleness 1 (AReaL)", "areal", "vllm", {"max_staleness": 1}, None),
)
VERL_COLUMNS = _against("sync vllm + verl")
_INSIDE = "(groups placed as steal places them, stolen)"
# lengthsched inside verl's recipe, each against the recipe at the same threshold (and at 0, the streamed steal)
VERL_PAIRS = (
    (f"verl fully async: threshold 0, 4 local updates + lengthsched {_INSIDE}",
     "verl fully async: threshold 0, 4 local updates (streamed, on-policy)"),
    (f"verl fully async: threshold 0, 4 local updates + lengthsched {_INSIDE}",
     "stream: steal, 4 local updates as groups finish (lengthsched, realistic predictions)"),
    (f"verl fully async: threshold 0.1 + lengthsched {_INSIDE}", "verl fully async: threshold 0.1 (verl's default)"),
    ("verl fully async: threshold 0.1 + lengthsched, 0.05 s to resubmit a stolen request",
     "verl fully async: threshold 0.1 (verl's default)"),
    ("verl fully async: threshold 0.1, verl's routing + lengthsched's stealing",
     "verl fully async: threshold 0.1 (verl's default)"),
    ("verl fully async: threshold 0.1, groups placed as steal places them (no stealing)",
     "verl fully async: threshold 0.1 (verl's default)"),
    (f"verl fully async: threshold 0.5 + lengthsched {_INSIDE}", "verl fully async: threshold 0.5"),
)


def _default_planner(max_new_tokens: int):
    """The predictor lengthsched.integrations.verl's RolloutPlanner builds without a trained one (prediction
    "online" of the async sections): OnlineLengthPredictor from response_length / 2, learning from every group that
    comes back (a fresh one per run)."""
    from lengthsched.integrations.verl import RolloutPlanner

    return RolloutPlanner(max_new_tokens=max_new_tokens).predictor


def _verl_unit(args, runs=VERL_RUNS, steps=ASYNC_STEPS):
    """One setting: every run of ``runs`` for ``steps`` weight versions, the learner's seconds per version
    ``share`` x the mean rollout of the synchronous vLLM + verl steps, plus ASYNC_UPDATE_SECONDS per update;
    per run the tuple of :func:`_async_unit`. A ``max_concurrent`` argument is a multiple of the batch."""
    from simulate.asynchronous import run_async_rollout, run_verl_async

    prompts = args[1]
    groups, known, kw, train = _async_setup(args, steps, (steps + 2) * prompts, "vllm")
    out = {"train seconds": train}
    for label, kind, engine, extra, pred in runs:
        extra = dict(extra)
        if kind == "sync":
            out[label] = _sync_row(groups, extra.pop("how"), known[pred], train, kw, **extra)
            continue
        if "max_concurrent" in extra:
            extra["max_concurrent"] = max(1, int(extra["max_concurrent"] * prompts))
        run = run_verl_async if kind == "verl" else run_async_rollout
        predicted = _default_planner(kw["max_new_tokens"]) if pred == "online" else known[pred]
        r = run(groups, train_seconds=train, update_seconds=ASYNC_UPDATE_SECONDS, policy=engine, predicted=predicted,
                **extra, **kw)
        out[label] = _async_row(r)
    return out


def async_verl(quick: bool) -> tuple[str, list]:
    """verl's fully asynchronous recipe (streamed local updates, a bound on the groups started per version,
    partial rollout) against synchronous steps on vLLM's engines (vLLM + verl, lengthsched's steal) and
    AReaL's loop, the learner's time a share of the synchronous rollout's."""
    return _async_section(
        quick, _verl_unit, VERL_RUNS, VERL_PAIRS, VERL_COLUMNS,
        lambda steps: f"verl's fully asynchronous recipe ({_cost_label()}, seed {ROLLOUT_SEED}, L_max 4096, G = 16, "
                      f"{steps} weight versions of B groups; the learner's seconds per version = share x the mean "
                      f"synchronous vLLM + verl rollout, each update pauses every engine {ASYNC_UPDATE_SECONDS:g} s): "
                      "trained tokens per modelled second x the synchronous vLLM + verl loop's",
        "lengthsched inside verl's recipe, per setting against the recipe")


# lengthsched inside verl's recipe as lengthsched.integrations.verl_async runs it: its StealDriver decides from
# snapshots (steal_observed) polled every 0.25 s (StealOptions' default), a moved request resubmitted in about
# 0.05 s, each group placed by the integration's own StreamPlacer (router "stream": its spread re-estimated at every
# group from the groups placed so far, no wider than PREFILL_SHARE allows, by the coordinator's loads); against the
# same with exact knowledge of the engines and steal's spread (the async_verl rows), slower polls, without the
# prefill cap, with the placement as the simulator modelled it before (router "placed": the spread decided once
# from the groups first in flight), and without a trained predictor. INTEGRATION: the settings the CLI's rows of
# the recipe with lengthsched inside run too.
DRIVER_RUNS = (
    ("verl fully async: threshold 0.1 (verl's default)", "verl", "vllm", {"staleness_threshold": 0.1}, None),
    ("verl fully async: threshold 0.1 + lengthsched, 0.05 s to resubmit a stolen request", "verl", "vllm",
     {"staleness_threshold": 0.1, "router": "placed", "steal": True, "resubmit_seconds": 0.05}, "realistic"),
    ("verl fully async: threshold 0.1 + lengthsched.integrations.verl_async (snapshots every 0.25 s, 0.05 s to "
     "resubmit)", "verl", "vllm", {"staleness_threshold": 0.1, **INTEGRATION}, "realistic"),
    ("verl fully async: threshold 0.1 + lengthsched.integrations.verl_async, snapshots every 1 s", "verl", "vllm",
     {"staleness_threshold": 0.1, **INTEGRATION, "snapshot_seconds": 1.0}, "realistic"),
    ("verl fully async: threshold 0, 4 local updates (streamed, on-policy)", "verl", "vllm",
     {"staleness_threshold": 0.0}, None),
    ("verl fully async: threshold 0 + lengthsched.integrations.verl_async (snapshots every 0.25 s, 0.05 s to "
     "resubmit)", "verl", "vllm", {"staleness_threshold": 0.0, **INTEGRATION}, "realistic"),
    ("verl fully async: threshold 0.1 + lengthsched.integrations.verl_async, spread as steal spreads a step's "
     "groups (no prefill cap)", "verl", "vllm", {"staleness_threshold": 0.1, **INTEGRATION, "prefill_share": None},
     "realistic"),
    ("verl fully async: threshold 0.1 + lengthsched.integrations.verl_async, its spread decided once from the groups "
     "first in flight (router 'placed')", "verl", "vllm", {"staleness_threshold": 0.1, **INTEGRATION,
                                                           "router": "placed"}, "realistic"),
    ("verl fully async: threshold 0.1 + lengthsched.integrations.verl_async without a trained predictor (its online "
     "predictor from response_length / 2, learning from the groups back)", "verl", "vllm",
     {"staleness_threshold": 0.1, **INTEGRATION}, "online"),
)
DRIVER_PAIRS = (
    (DRIVER_RUNS[1][0], DRIVER_RUNS[0][0]),
    (DRIVER_RUNS[2][0], DRIVER_RUNS[0][0]),
    (DRIVER_RUNS[3][0], DRIVER_RUNS[0][0]),
    (DRIVER_RUNS[6][0], DRIVER_RUNS[0][0]),
    (DRIVER_RUNS[2][0], DRIVER_RUNS[1][0]),
    (DRIVER_RUNS[2][0], DRIVER_RUNS[6][0]),
    (DRIVER_RUNS[2][0], DRIVER_RUNS[7][0]),
    (DRIVER_RUNS[8][0], DRIVER_RUNS[0][0]),
    (DRIVER_RUNS[8][0], DRIVER_RUNS[2][0]),
    (DRIVER_RUNS[5][0], DRIVER_RUNS[4][0]),
)
DRIVER_COLUMNS = _against("the recipe at threshold 0.1")


def _verl_title(what: str):
    """The title (a function of the steps) of a section on lengthsched inside verl's recipe: ``what``, its
    settings, against the recipe at threshold 0.1."""
    return lambda steps: (f"{what} ({_cost_label()}, seed {ROLLOUT_SEED}, L_max 4096, G = 16, {steps} weight "
                          "versions of B groups, the learner's seconds per version = share x the mean synchronous "
                          f"vLLM + verl rollout, each update pauses every engine {ASYNC_UPDATE_SECONDS:g} s): trained "
                          "tokens per modelled second x the recipe's at threshold 0.1")


def async_verl_driver(quick: bool) -> tuple[str, list]:
    """lengthsched inside verl's recipe as its integration (lengthsched.integrations.verl_async) runs it:
    stealing decided from snapshots polled every 0.25 s (and 1 s), against the same decided from the engines'
    exact state and against the recipe, on async_verl's settings."""
    return _async_section(
        quick, partial(_verl_unit, runs=DRIVER_RUNS), DRIVER_RUNS, DRIVER_PAIRS, DRIVER_COLUMNS,
        _verl_title("lengthsched.integrations.verl_async inside verl's recipe"),
        "lengthsched.integrations.verl_async, per setting against the recipe and against exact knowledge")


# async_verl_ways: lengthsched.integrations.verl_async with whole groups (+lengthsched.ways=1, as
# lengthsched.integrations.areal places them by default) instead of its placer's spread estimate (its default), on
# async_verl's settings, with and without a trained predictor and at threshold 0; the estimate's rows are
# async_verl_driver's (the same settings and draws).
_WHOLE = "whole groups (+lengthsched.ways=1)"
VERL_WAYS_RUNS = (
    DRIVER_RUNS[0],
    DRIVER_RUNS[2],
    (f"verl fully async: threshold 0.1 + lengthsched.integrations.verl_async, {_WHOLE}", "verl", "vllm",
     {"staleness_threshold": 0.1, **INTEGRATION, "ways": 1}, "realistic"),
    DRIVER_RUNS[8],
    (f"verl fully async: threshold 0.1 + lengthsched.integrations.verl_async, {_WHOLE}, without a trained "
     "predictor (online)", "verl", "vllm", {"staleness_threshold": 0.1, **INTEGRATION, "ways": 1}, "online"),
    DRIVER_RUNS[4],
    DRIVER_RUNS[5],
    (f"verl fully async: threshold 0 + lengthsched.integrations.verl_async, {_WHOLE}", "verl", "vllm",
     {"staleness_threshold": 0.0, **INTEGRATION, "ways": 1}, "realistic"),
)
VERL_WAYS_PAIRS = tuple((VERL_WAYS_RUNS[i][0], VERL_WAYS_RUNS[j][0])
                        for i, j in ((2, 0), (2, 1), (4, 0), (4, 3), (7, 5), (7, 6)))


def async_verl_ways(quick: bool) -> tuple[str, list]:
    """lengthsched.integrations.verl_async with whole groups (ways=1) against its spread estimate and the
    recipe, on async_verl's settings."""
    return _async_section(
        quick, partial(_verl_unit, runs=VERL_WAYS_RUNS), VERL_WAYS_RUNS, VERL_WAYS_PAIRS, DRIVER_COLUMNS,
        _verl_title("lengthsched.integrations.verl_async with whole groups inside verl's recipe"),
        "lengthsched.integrations.verl_async with whole groups, per setting against the recipe and the estimate")


def _ratio_summary(units, ratios) -> list:
    """[settings, mean, mean over several replicas, worst, slower by > 0.1%] of ``ratios`` (one per
    setting of ``units``: (workload, prompts, replicas, factor, seed, cost) as run), then their mean
    per seed, in the order the seeds appear."""
    ratios = np.asarray(ratios, dtype=np.float64)
    multi = np.array([x for u, x in zip(units, ratios) if u[2] > 1])
    seeds = list(dict.fromkeys(u[4] for u in units))
    return ([len(ratios), float(ratios.mean()), float(multi.mean()), float(ratios.max()), int(np.sum(ratios > 1.001))]
            + [float(np.mean([x for u, x in zip(units, ratios) if u[4] == s])) for s in seeds])


# steal's variants (lengthsched.runtime.dispatch.WorkStealing attributes), each against vLLM FCFS + verl
VARIANTS = (
    ("steal (the default)", "steal", {}),
    ("steal, no moves of running requests", "steal", {"MIGRATE_CHUNK": None}),
    ("steal, no stealing and no moves (its placement alone)", "steal", {"ROOM": 0.0, "MIGRATE_CHUNK": None}),
    ("steal, only requests that never started move", "steal", {"STEAL_STARTED": False}),
    ("steal, longest predicted first per replica", "steal", {"ORDER": "longest"}),
    ("steal_observed: steal decided from snapshots (StealCoordinator, what a framework can run)", "steal_observed", {}),
    ("steal_observed, a snapshot every 32 steps at most", "steal_observed", {"SNAPSHOT_STEPS": 32}),
    ("steal_observed, a snapshot every 128 steps at most", "steal_observed", {"SNAPSHOT_STEPS": 128}),
    ("vllm_priority + verl routing (longest predicted first, no stealing)", "vllm_priority", None),
)


def _rollout_variants_unit(args, variants=VARIANTS):
    """One setting: vLLM FCFS + verl, then each of ``variants`` (label, policy, class attributes or None
    for the policy as it is behind verl's routing) with the realistic predictions (seconds, recomputed
    tokens); a variant's attributes are set on its policy's class and restored."""
    from lengthsched.runtime import POLICIES

    groups, realistic, _, _, common = _rollout_setting(*args)
    base = run_rollout(groups, "vllm", router="least_loaded", **common)
    out = {"base": (base.seconds, base.recomputed_tokens)}
    for label, policy, attrs in variants:
        with patched(POLICIES[policy].cls, **(attrs or {})):
            r = run_rollout(groups, policy, router=None if attrs is not None else "least_loaded", predicted=realistic,
                            **common)
        out[label] = (r.seconds, r.recomputed_tokens)
    return out


def rollout_variants(quick: bool) -> tuple[str, list]:
    """What steal's gain comes from: steal without stealing, stealing only requests that never
    started (what a framework moves without carrying partial generations), each replica's queue
    longest predicted first, and vLLM priority scheduling, on four draws of the rollout grid."""
    grid, seeds = ROLLOUT_GRID, WAYS_SEEDS
    if quick:
        grid, seeds = [("castillo", 64, 4, 2), ("long tail", 64, 4, 4)], (11,)
    units = [(w, b, r, f, s, ROLLOUT_COST) for s in seeds for w, b, r, f in grid]
    results = _pool_map(_rollout_variants_unit, units)
    rows = []
    base_rec = sum(out["base"][1] for out in results)
    for label, *_ in VARIANTS:
        summary = _ratio_summary(units, [out[label][0] / out["base"][0] for out in results])
        rows.append([label] + summary[:5]
                    + [float(sum(out[label][1] for out in results) / base_rec) if base_rec else "-"] + summary[5:])
    draws = ", ".join(map(str, seeds))
    return table(f"What steal's gain comes from ({_cost_label()}; the rollout grid, seeds {draws}, "
                 "realistic predictions): makespan x vLLM FCFS + verl routing",
                 ["variant", "settings", "mean", "mean, several replicas", "worst", "slower by > 0.1%",
                  "recomputed tokens x vllm (all settings)"] + [f"mean, seed {s}" for s in seeds], rows), rows


# steal_sglang's parts (StealSGLang attributes) and slime with the integration's plan, each against slime as it ships
# (SGLang + its cache-aware router, 512 x R in flight): what a slime client could gain from each mechanism
SGLANG_VARIANTS = (
    ("steal_sglang (placement, steals, moves)", "steal_sglang", {}),
    ("steal_sglang, only requests that never started move (no aborts of running ones)", "steal_sglang",
     {"STEAL_STARTED": False}),
    ("steal_sglang, no moves of running requests", "steal_sglang", {"MIGRATE_CHUNK": None}),
    ("steal_sglang, its placement alone (no stealing, no moves)", "steal_sglang", {"ROOM": 0.0, "MIGRATE_CHUNK": None}),
    ("slime + lengthsched's plan (lengthsched.integrations.slime: client window, steals)", "plan", None),
    ("slime + lengthsched's plan, client window without steals", "plan", {"steals": False}),
    ("slime + lengthsched's plan, every sample sent at once (no client window)", "plan", {"window": 0.0}),
)


def _sglang_variants_unit(args):
    """One setting: slime's makespan, then each SGLANG_VARIANTS run's (modelled seconds)."""
    from lengthsched.runtime import POLICIES

    groups, realistic, _, _, common = _rollout_setting(*args)
    cap = SLIME_CONCURRENCY * args[2]
    out = {"slime": run_rollout(groups, "sglang", router="cache_aware", in_flight=cap, **common).seconds}
    for label, policy, attrs in SGLANG_VARIANTS:
        if policy == "plan":
            out[label] = run_slime_planned(groups, realistic, in_flight=cap, **common, **(attrs or {}))[0].seconds
            continue
        with patched(POLICIES[policy].cls, **attrs):
            out[label] = run_rollout(groups, policy, predicted=realistic, **common).seconds
    return out


def rollout_sglang_variants(quick: bool) -> tuple[str, list]:
    """What a slime user could gain from each part of steal_sglang (placement, steals of requests that never
    started, moves of running ones) and from the slime integration's plan, over slime as it ships, on the
    multi-replica settings of four draws of the rollout grid (on one replica they are all slime's engine)."""
    grid, seeds = [u for u in ROLLOUT_GRID if u[2] > 1], WAYS_SEEDS
    if quick:
        grid, seeds = [("castillo", 64, 4, 2), ("long tail", 64, 4, 4)], (11,)
    units = [(w, b, r, f, s, ROLLOUT_COST) for s in seeds for w, b, r, f in grid]
    results = _pool_map(_sglang_variants_unit, units)
    rows = []
    for label, *_ in SGLANG_VARIANTS:
        summary = _ratio_summary(units, [out[label] / out["slime"] for out in results])
        rows.append([label] + summary[:2] + summary[3:5] + summary[5:])
    draws = ", ".join(map(str, seeds))
    return table(f"steal_sglang's parts and the slime integration's plan ({_cost_label()}; the rollout grid's "
                 f"multi-replica settings, seeds {draws}, realistic predictions): makespan x slime's as it ships",
                 ["run", "settings", "mean", "worst", "slower by > 0.1%"] + [f"mean, seed {s}" for s in seeds],
                 rows), {"rows": rows, "settings": [[*u[:5], out] for u, out in zip(units, results)]}


# steal when a moved request waits before its target can run it (WorkStealing.RESUBMIT_SECONDS: the
# framework's abort and resubmission; verl 0.9.1's fully-async client sleeps 1 s before it resubmits an
# aborted request), with and without moves of running requests; steal_observed as verl_stealing runs it
# (a snapshot per poll of the driver, every poll_interval modelled seconds): with verl's 1 s wait, and with
# the round trip of the stealing client, which resubmits moved attempts at once (0.05 s)
RESUBMIT_VARIANTS = (
    ("steal (resubmitted at once: the simulator's default)", "steal", {}),
    ("steal, 0.05 s to resubmit", "steal", {"RESUBMIT_SECONDS": 0.05}),
    ("steal, 0.25 s to resubmit", "steal", {"RESUBMIT_SECONDS": 0.25}),
    ("steal, 1 s to resubmit (verl 0.9.1's client)", "steal", {"RESUBMIT_SECONDS": 1.0}),
    ("steal without moves of running requests, 0.25 s", "steal", {"RESUBMIT_SECONDS": 0.25, "MIGRATE_CHUNK": None}),
    ("steal without moves of running requests, 1 s", "steal", {"RESUBMIT_SECONDS": 1.0, "MIGRATE_CHUNK": None}),
    ("steal_observed, a snapshot every 1 s, 1 s to resubmit, moves", "steal_observed",
     {"RESUBMIT_SECONDS": 1.0, "SNAPSHOT_SECONDS": 1.0}),
    ("steal_observed, a snapshot every 1 s, 1 s, no moves (verl's client; verl_stealing's defaults until "
     "2026-11-27)", "steal_observed", {"RESUBMIT_SECONDS": 1.0, "SNAPSHOT_SECONDS": 1.0, "MIGRATE_CHUNK": None}),
    ("steal_observed, a snapshot every 1 s, 0.05 s, no moves", "steal_observed",
     {"RESUBMIT_SECONDS": 0.05, "SNAPSHOT_SECONDS": 1.0, "MIGRATE_CHUNK": None}),
    ("steal_observed, a snapshot every 1 s, 0.05 s, moves", "steal_observed",
     {"RESUBMIT_SECONDS": 0.05, "SNAPSHOT_SECONDS": 1.0}),
    ("steal_observed, a snapshot every 0.25 s, 0.05 s, no moves", "steal_observed",
     {"RESUBMIT_SECONDS": 0.05, "SNAPSHOT_SECONDS": 0.25, "MIGRATE_CHUNK": None}),
    ("steal_observed, a snapshot every 0.25 s, 0.05 s, moves", "steal_observed",
     {"RESUBMIT_SECONDS": 0.05, "SNAPSHOT_SECONDS": 0.25}),
    ("steal_observed, a snapshot every 0.1 s, 0.05 s, moves", "steal_observed",
     {"RESUBMIT_SECONDS": 0.05, "SNAPSHOT_SECONDS": 0.1}),
)


def rollout_resubmit(quick: bool) -> tuple[str, list]:
    """What a delay between a request's abort and its resubmission costs steal: the multi-replica
    settings of the rollout grid and the steps at scale (one draw, --seed)."""
    grids = {"grid": [u for u in ROLLOUT_GRID if u[2] > 1], "scale": SCALE_GRID}
    if quick:
        grids = {"grid": [("castillo", 64, 4, 2)], "scale": [("long tail", 64, 16, 4)]}
    rows = []
    for name, grid in grids.items():
        units = [(w, b, r, f, ROLLOUT_SEED, ROLLOUT_COST) for w, b, r, f in grid]
        results = _pool_map(partial(_rollout_variants_unit, variants=RESUBMIT_VARIANTS), units)
        for label, *_ in RESUBMIT_VARIANTS:
            summary = _ratio_summary(units, [out[label][0] / out["base"][0] for out in results])
            rows.append([name, label] + [summary[0], summary[1], summary[3], summary[4]])
    return table(f"What the resubmission delay costs steal ({_cost_label()}, seed {ROLLOUT_SEED}, realistic "
                 "predictions; grid: the rollout grid's settings with 4-8 replicas; scale: --sections "
                 "rollout_scale's): makespan x vLLM FCFS + verl routing",
                 ["settings", "variant", "n", "mean", "worst", "slower by > 0.1%"], rows), rows


# Multi-turn (agentic) steps: sessions of 2-5 turns, tool calls between them (simulate.run_multiturn)
MULTITURN_GRID = [(w, b, r, f, tool) for w in ("castillo", "long tail") for b, r in ((64, 4), (256, 8))
                  for f in (2, 4, 16) for tool in (0.5, 2.0)]
MULTITURN_CONTEXT = 8192  # tokens: the longest conversation (prompt, 4096 generated, tool answers); pools are x this


def _multiturn_unit(args, runs=None) -> dict:
    """One setting of rollout_multiturn (``runs``: MULTITURN_RUNS) or rollout_multiturn_slime (MULTITURN_SLIME_RUNS):
    per run, realistic predictions where it takes some (makespan, lower bound, cache hits, later turns, moved turns,
    preemptions, recomputed tokens)."""
    from simulate import split_turns
    from simulate.multiturn import run_multiturn_row

    workload, prompts, replicas, factor, tool, seed, cost_text = args
    groups, realistic, oracle, _ = rollout_groups(workload, prompts, seed)
    turns = split_turns(groups, tool_seconds=tool, tool_sigma=0.5, seed=seed)
    known = {"given": realistic, "oracle": oracle, None: None}
    out = {}
    for label, policy, options, pred in MULTITURN_RUNS if runs is None else runs:
        r = run_multiturn_row(policy, options, groups, turns, known[pred], replicas=replicas,
                              budget_tokens=factor * MULTITURN_CONTEXT, max_new_tokens=4096,
                              cost=_rollout_cost(cost_text))
        out[label] = (r.seconds, r.lower_bound_seconds, r.cache_hits + r.host_hits, r.later_turns, r.moved_turns,
                      r.preemptions, r.recomputed_tokens)
    return out


def _multiturn_tables(units: list, results: list, labels: list[str]) -> tuple[list, list]:
    """Summary rows (per run: settings, mean, best and worst makespan x the first run's, settings slower by more
    than 0.1%, mean seconds / LB, later turns cached, later turns moved) and per-setting rows."""
    base_label = labels[0]
    rows, settings = [], []
    for label in labels:
        ratios = np.array([out[label][0] / out[base_label][0] for out in results])
        to_bound = np.array([out[label][0] / out[label][1] for out in results])
        hits = sum(out[label][2] for out in results) / max(1, sum(out[label][3] for out in results))
        moved = sum(out[label][4] for out in results) / max(1, sum(out[label][3] for out in results))
        rows.append([label, len(ratios), float(ratios.mean()), float(ratios.min()), float(ratios.max()),
                     int(np.sum(ratios > 1.001)), float(to_bound.mean()), float(hits), float(moved)])
    for u, out in zip(units, results):
        base = out[base_label][0]
        settings.append([u[0], u[1], u[2], u[3], u[4], base, out[base_label][1] / base]
                        + [out[label][0] / base for label in labels[1:]])
    return rows, settings


def _multiturn_runs(quick: bool, runs: tuple) -> tuple[list[str], list, list]:
    """The multi-turn grid (quick: two of its settings), seed and cost of the run, under ``runs``: their labels,
    the summary rows and the per-setting rows (:func:`_multiturn_tables`)."""
    grid = [("castillo", 64, 4, 2, 0.5), ("long tail", 64, 4, 16, 2.0)] if quick else MULTITURN_GRID
    units = [(*u, ROLLOUT_SEED, ROLLOUT_COST) for u in grid]
    results = _pool_map(partial(_multiturn_unit, runs=runs), units)
    labels = [label for label, *_ in runs]
    return (labels, *_multiturn_tables(units, results, labels))


MULTITURN_SUMMARY_COLUMNS = ["row", "settings", "mean", "best", "worst", "slower by > 0.1%", "mean seconds / LB",
                             "later turns cached", "later turns moved"]


def rollout_multiturn(quick: bool) -> tuple[str, dict]:
    """Multi-turn steps (simulate.run_multiturn): CASTILLO and long-tail sessions cut into 2-5 turns, tool calls
    of log-normal seconds (median 0.5 or 2 s, log-sd 0.5) answering 30-600 tokens, on 4 or 8 replicas with verl's
    sticky session routing; what vLLM's priority scheduling and steal make of them, each against vLLM FCFS."""
    labels, rows, settings = _multiturn_runs(quick, MULTITURN_RUNS)
    if not quick and ROLLOUT_COST is None and ROLLOUT_SEED == 11 and ROLLOUT_MAX_SEQS is None:
        _multiturn_figure(settings, ROOT / "docs" / "figures" / "multiturn.png")
    text = table(f"Multi-turn steps ({_cost_label()}, seed {ROLLOUT_SEED}; sessions of 2-5 turns, tools of median "
                 "0.5 or 2 s answering 30-600 tokens; pools 2, 4 and 16 x 8192 tokens; verl's sticky session "
                 "routing): makespan x vLLM FCFS", MULTITURN_SUMMARY_COLUMNS, rows)
    text += "\n\n" + table("Per setting: makespan x vLLM FCFS (LB: the lower bound, x the same)",
                            ["workload", "prompts", "replicas", "pool x 8192", "tool median s", "vllm seconds",
                             "LB"] + labels[1:], settings)
    return text, {"rows": rows, "settings": settings}


def rollout_multiturn_slime(quick: bool) -> tuple[str, dict]:
    """Multi-turn steps on SGLang's engines, as slime runs them (simulate.multiturn.MULTITURN_SLIME_RUNS): the
    rollout_multiturn grid, slime as it ships (SGLang's router on every turn) against sticky sessions,
    lengthsched.integrations.slime's plan with and without its client window, steal_sglang, and vLLM's engines."""
    from simulate.multiturn import MULTITURN_SLIME_RUNS

    labels, rows, settings = _multiturn_runs(quick, MULTITURN_SLIME_RUNS)
    text = table(f"Multi-turn steps on SGLang's engines ({_cost_label()}, seed {ROLLOUT_SEED}; the rollout_multiturn "
                 "grid): makespan x SGLang behind its router (slime as it ships)", MULTITURN_SUMMARY_COLUMNS, rows)
    text += "\n\n" + table("Per setting: makespan x slime as it ships (LB: the lower bound, x the same)",
                            ["workload", "prompts", "replicas", "pool x 8192", "tool median s", "slime seconds",
                             "LB"] + labels[1:], settings)
    return text, {"rows": rows, "settings": settings}


def _multiturn_figure(settings: list, path) -> None:
    """Makespan / vLLM + verl's of every multi-turn setting, per run (one dot per setting, one colour per workload;
    hollow dots: tools of median 2 s)."""
    from simulate.plots import pyplot, save_figure

    plt = pyplot()
    labels = [label for label, *_ in MULTITURN_RUNS[1:]]
    fig, ax = plt.subplots(figsize=(11, 5.2))
    rng = np.random.default_rng(0)
    for workload, color in (("castillo", "#1f77b4"), ("long tail", "#ff7f0e")):
        for tool, fill in ((0.5, True), (2.0, False)):
            mine = [row for row in settings if row[0] == workload and row[4] == tool]
            for i in range(len(labels)):
                ys = [row[7 + i] for row in mine]
                ax.scatter(i + rng.uniform(-0.25, 0.25, len(ys)), ys, s=14, alpha=0.7,
                           facecolors=color if fill else "none", edgecolors=color,
                           label=f"{workload}, tools {tool:g} s" if i == 0 else None)
    for i in range(len(labels)):
        ax.plot([i - 0.35, i + 0.35], [np.mean([row[7 + i] for row in settings])] * 2, color="black", linewidth=1.5,
                label="mean over the settings" if i == 0 else None)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
    short = [label.split(" (")[0] for label in labels]
    ax.set_xticks(range(len(labels)), short, rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("modelled makespan / vLLM FCFS + verl's sticky routing")
    ax.set_title(f"Multi-turn steps: one dot per setting (64 x 16 on 4 and 256 x 16 on 8 replicas, pools 2-16 x 8192; "
                 f"{_cost_label()})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


#: rollout_multiturn_offload's runs (MULTITURN_RUNS' format): what KV offloading to host memory does to the
#: multi-turn comparison (conversations evicted under pressure come back by a load instead of a prefill).
MULTITURN_OFFLOAD_RUNS = (
    ("vllm + verl's sticky routing (the baseline)", "vllm", {}, None),
    ("vllm + verl's sticky routing, KV offloading", "vllm", {"kv_offload": True}, None),
    ("vllm + a cache-aware router on every turn, KV offloading", "vllm", {"router": "cache_aware", "kv_offload": True},
     None),
    ("steal, every turn, KV offloading", "steal", {"kv_offload": True}, "given"),
)


def rollout_multiturn_offload(quick: bool) -> tuple[str, dict]:
    """The rollout_multiturn grid with every replica keeping what it evicts in host memory
    (run_multiturn(kv_offload=True)): vLLM + verl with and without it, the cache-aware router and steal with it."""
    labels, rows, settings = _multiturn_runs(quick, MULTITURN_OFFLOAD_RUNS)
    text = table(f"Multi-turn steps with KV offloading ({_cost_label()}, seed {ROLLOUT_SEED}; the rollout_multiturn "
                 "grid): makespan x vLLM FCFS + verl's sticky routing without offloading", MULTITURN_SUMMARY_COLUMNS,
                 rows)
    text += "\n\n" + table("Per setting: makespan x vLLM FCFS + verl without offloading (LB: the lower bound)",
                            ["workload", "prompts", "replicas", "pool x 8192", "tool median s", "vllm seconds",
                             "LB"] + labels[1:], settings)
    return text, {"rows": rows, "settings": settings}


def multiturn_speed(quick: bool) -> tuple[str, list]:
    """Wall time of one simulated multi-turn step of 256 prompts x 16 on 8 replicas (2-5 turns, tools of median
    0.5 s), per MULTITURN_RUNS run, one core."""
    from simulate import run_multiturn, split_turns

    pin_one_core()
    rows = []
    for workload in ("castillo", "long tail"):
        groups, realistic, oracle, _ = rollout_groups(workload, 64 if quick else 256, ROLLOUT_SEED)
        turns = split_turns(groups, tool_seconds=0.5, tool_sigma=0.5, seed=ROLLOUT_SEED)
        known = {"given": realistic, "oracle": oracle, None: None}
        for factor in ((4,) if quick else (2, 16)):
            for label, policy, options, pred in MULTITURN_RUNS:
                times = []
                for _ in range(1 if quick else 3):
                    start = time.perf_counter()
                    run_multiturn(groups, turns, policy, replicas=8, budget_tokens=factor * MULTITURN_CONTEXT,
                                  max_new_tokens=4096, predicted=known[pred], **options)
                    times.append(time.perf_counter() - start)
                rows.append([workload, f"{factor} x 8192", label, turns.count, statistics.median(times)])
    unpin()
    worst = max(r[4] for r in rows)
    return table(f"Simulating one multi-turn step of {64 if quick else 256} prompts x 16 on 8 replicas (2-5 turns, "
                 f"tools of median 0.5 s): wall seconds per run on one core (median of {1 if quick else 3}); the "
                 f"slowest takes {worst:.2f} s", ["workload", "pool", "run", "turns", "wall seconds"], rows), rows


# The first step of a run with lengthsched's verl integrations and no trained predictor: their default
# (OnlineLengthPredictor, RolloutPlanner) predicts response_length / 2 for every completion until it has seen a
# length. COLD_START_LENGTH is that at L_max 4096.
COLD_START_LENGTH = 2048
COLD_START_RUNS = (
    ("steal, realistic prompt-level predictions (the grid's row)", "realistic", False),
    (f"steal, every completion predicted {COLD_START_LENGTH} (placed by it: the integrations until 2026-11-29)",
     "cold", False),
    (f"steal over verl's spread, every completion predicted {COLD_START_LENGTH} (the verl integrations' first "
     "step since 2026-11-29)", "cold", True),
    (f"steal, every completion predicted {CONSTANT_PREDICTION} (the grid's constant row)", "constant", False),
    ("steal over verl's spread, realistic predictions", "realistic", True),
    ("steal, first epoch: the default predictor after one step of other prompts (these never seen)", "unseen",
     False),
    ("steal, second epoch: the default predictor after one epoch of these prompts", "history", False),
)


def _default_predictor_after(seen, key: str = "", lmax: int = 4096):
    """The integrations' default predictor (lengthsched.integrations.verl.RolloutPlanner's without a trained one,
    which the slime integration's planner also builds) after one rollout step of the groups ``seen`` (their
    prompts keyed ``key + prompt_id``), at the next step."""
    predictor = _default_planner(lmax)
    for g in seen:
        for n in g.lengths:
            predictor.observe(key + g.prompt_id, int(n))
    predictor.set_step(1 if seen else 0)
    return predictor


def _seen_before(workload: str, prompts: int, seed: int, groups) -> dict:
    """The steps the default predictor saw before a grid setting's step in the cold-start sections: "unseen", a
    step of other prompts (another draw, keyed apart: this step's prompts never seen); "history", these prompts
    one epoch earlier."""
    return {"unseen": (rollout_groups(workload, prompts, seed + 1000)[0], "other:"),
            "history": (rollout_groups(workload, prompts, seed, size=len(groups[0].lengths), epoch=1)[0], "")}


def _per_completion(predictor, groups, lmax: int = 4096) -> np.ndarray:
    """What ``predictor`` says of each group's prompt, per completion (the same for siblings, >= 1 token), as
    the verl integrations' planner asks it (once per group, rounded and capped at L_max)."""
    from lengthsched.integrations.rollout import predict_lengths

    said = predict_lengths(predictor, [g.prompt_id for g in groups], max_new_tokens=lmax)
    return np.concatenate([np.full(len(g.lengths), max(1, int(x))) for g, x in zip(groups, said)])


def _cold_start_unit(args) -> dict:
    """One setting of rollout_cold_start: makespan of each COLD_START_RUNS row over vLLM + verl's."""
    groups, realistic, _, constant, common = _rollout_setting(*args)
    base = run_rollout(groups, "vllm", router="least_loaded", **common).seconds
    known = {"realistic": realistic, "constant": constant, "cold": np.full(len(realistic), COLD_START_LENGTH)}
    for name, (seen, key) in _seen_before(args[0], args[1], args[4], groups).items():
        known[name] = _per_completion(_default_predictor_after(seen, key), groups)
    spread = route(groups, "least_loaded", common["replicas"])
    return {label: run_rollout(groups, "steal", predicted=known[pred], placement=spread if over else None,
                               **common).seconds / base for label, pred, over in COLD_START_RUNS}


def rollout_cold_start(quick: bool) -> tuple[str, list]:
    """The first step without a trained predictor: steal placing by a made-up length everywhere against steal
    over verl's spread (what the verl integrations now do until the predictor has seen a length), on the
    rollout grid (one draw, --seed)."""
    grid = [("castillo", 64, 4, 2), ("long tail", 16, 4, 16)] if quick else ROLLOUT_GRID
    units = [(w, b, r, f, ROLLOUT_SEED, ROLLOUT_COST) for w, b, r, f in grid]
    results = _pool_map(_cold_start_unit, units)
    rows = []
    for label, *_ in COLD_START_RUNS:
        summary = _ratio_summary(units, [out[label] for out in results])
        worst = units[int(np.argmax([out[label] for out in results]))][:4]
        rows.append([label] + summary[:5] + [" ".join(map(str, worst))])
    text = table(f"The first step without a trained predictor ({_cost_label()}, seed {ROLLOUT_SEED}, the rollout "
                 "grid): makespan x vLLM FCFS + verl routing", ["run", "settings", "mean", "several replicas",
                                                                "worst", "slower by > 0.1%", "worst setting"], rows)
    per = [[*u[:4], *(round(out[label], 4) for label, *_ in COLD_START_RUNS)] for u, out in zip(units, results)]
    return text, {"rows": rows, "settings": per}


# slime's first step and first epoch with lengthsched.integrations.slime and no trained predictor (its default
# OnlineLengthPredictor): (label, prediction, run_slime_planned's keyword arguments). "cold": COLD_START_LENGTH for
# every completion (rollout_max_response_len / 2, the default predictor before it has seen a length), as an array
# the planner trusts; "default": the default predictor itself, told nothing (the integration leaves the step to
# slime's router); "unseen": the default predictor after one step of other prompts (this step's prompts never seen:
# each predicted the mean log length seen, the first epoch); "history": the default predictor after one epoch of
# these prompts (the second epoch).
SLIME_COLD_RUNS = (
    ("slime + the plan, realistic prompt-level predictions (a trained predictor)", "realistic", {}),
    (f"first step, planned on {COLD_START_LENGTH} everywhere (the integration until 2026-11-29)", "cold", {}),
    (f"first step, verl's spread on {COLD_START_LENGTH}, every sample sent at once (the best planned first step "
     "found)", "cold", {"placement": "spread", "window": 0.0}),
    ("first step as the integration ships since 2026-11-29 (slime's router until the predictor has seen a length)",
     "default", {}),
    ("first epoch: the default predictor after one step of other prompts (these never seen)", "unseen", {}),
    ("second epoch: the default predictor after one epoch of these prompts", "history", {}),
)


def _slime_cold_unit(args) -> dict:
    """One setting of slime_cold_start: makespan of each SLIME_COLD_RUNS row over slime as it ships."""
    workload, prompts, replicas, factor, seed, _ = args
    groups, realistic, _, _, common = _rollout_setting(*args)
    cap = SLIME_CONCURRENCY * replicas
    base = run_rollout(groups, "sglang", router="cache_aware", in_flight=cap, **common).seconds
    seen = _seen_before(workload, prompts, seed, groups)
    known = {"realistic": lambda: realistic, "cold": lambda: np.full(len(realistic), COLD_START_LENGTH),
             "default": lambda: _default_predictor_after([]),
             "unseen": lambda: _default_predictor_after(*seen["unseen"]),
             "history": lambda: _default_predictor_after(*seen["history"])}
    return {label: run_slime_planned(groups, known[pred](), in_flight=cap, **extra, **common)[0].seconds / base
            for label, pred, extra in SLIME_COLD_RUNS}


def slime_cold_start(quick: bool) -> tuple[str, dict]:
    """slime with lengthsched.integrations.slime and no trained predictor: its first step planned on a made-up
    length, the best planned alternative, what the integration does now (slime's router until the predictor has
    seen a length), and its first and second epochs, against slime as it ships, on the rollout grid's settings
    with several replicas (one draw, --seed)."""
    grid = [("castillo", 64, 4, 4), ("long tail", 16, 4, 16)] if quick else [u for u in ROLLOUT_GRID if u[2] > 1]
    units = [(w, b, r, f, ROLLOUT_SEED, ROLLOUT_COST) for w, b, r, f in grid]
    results = _pool_map(_slime_cold_unit, units)
    rows = []
    for label, *_ in SLIME_COLD_RUNS:
        ratios = [out[label] for out in results]
        summary = _ratio_summary(units, ratios)
        worst = units[int(np.argmax(ratios))][:4]
        rows.append([label, summary[0], summary[1], summary[3], summary[4],
                     int(np.sum(np.asarray(ratios) < 0.999)), " ".join(map(str, worst))])
    text = table(f"slime without a trained predictor ({_cost_label()}, seed {ROLLOUT_SEED}, the rollout grid's "
                 "settings with several replicas): makespan x slime as it ships (SGLang + its cache-aware router, "
                 f"{SLIME_CONCURRENCY} x R in flight)",
                 ["run", "settings", "mean", "worst", "slower by > 0.1%", "faster by > 0.1%", "worst setting"], rows)
    per = [[*u[:4], *(round(out[label], 4) for label, *_ in SLIME_COLD_RUNS)] for u, out in zip(units, results)]
    return text, {"rows": rows, "settings": per}


SEER_CHUNKS = (128, 512, 2048)  # tokens per chunk of Seer's divided rollout (seer_divided's CHUNK)
FREE_CHUNK = 128  # the chunk of the free-loads bound: the best of SEER_CHUNKS when loads cost nothing
SEER_TIGHT_POOLS = (2, 4)  # pools (x L_max) of the long-tail settings rollout_seer also reports alone


def _long_tail_tight(unit) -> bool:
    """Whether a grid setting is the long tail in a tight pool (SEER_TIGHT_POOLS) on several replicas, where
    Seer's divided rollout is strongest."""
    return unit[0] == "long tail" and unit[3] in SEER_TIGHT_POOLS and unit[2] > 1


def _faster_than_steal(results, label) -> list[bool]:
    """Per setting, whether run ``label`` is faster than steal by more than 0.1%."""
    return [out[label] < out["steal"] * (1 - 1e-3) for out in results]


def _rollout_seer_unit(args):
    """One setting: vLLM FCFS + verl, Seer-like without and with its divided rollout (each chunk
    size; its KV loads priced over the host link as stalls of the step and asynchronously, and free for
    FREE_CHUNK), and steal with the realistic predictions: the default (running requests moved to
    idle replicas, their KV recomputed), without moves, and with the moved KV loaded through a global
    pool (priced, free, asynchronous) (seconds)."""
    from lengthsched.runtime.dispatch import SeerDivided, WorkStealing

    groups, realistic, _, _, common = _rollout_setting(*args)
    free = _free_host_link(common)
    out = {"base": run_rollout(groups, "vllm", router="least_loaded", **common).seconds,
           "seer": run_rollout(groups, "seer", **common).seconds,
           "steal": run_rollout(groups, "steal", predicted=realistic, **common).seconds}
    for c in SEER_CHUNKS:
        with patched(SeerDivided, CHUNK=c, LOADS="stall"):
            out[f"divided {c}"] = run_rollout(groups, "seer_divided", **common).seconds
        with patched(SeerDivided, CHUNK=c, LOADS="async"):
            out[f"divided {c}, async KV"] = run_rollout(groups, "seer_divided", **common).seconds
    # free loads as stalls of no seconds (an asynchronous load, even free, still waits for the next step)
    with patched(SeerDivided, CHUNK=FREE_CHUNK, LOADS="stall"):
        out["divided, free KV"] = run_rollout(groups, "seer_divided", **free).seconds
    with patched(WorkStealing, MIGRATE_CHUNK=None):
        out["steal, no moves"] = run_rollout(groups, "steal", predicted=realistic, **common).seconds
    with patched(WorkStealing, MIGRATE_KV=True):
        out["steal, KV loaded"] = run_rollout(groups, "steal", predicted=realistic, **common).seconds
        out["steal, free KV"] = run_rollout(groups, "steal", predicted=realistic, **free).seconds
    with patched(WorkStealing, MIGRATE_KV=True, LOADS="async"):
        out["steal, KV loaded async"] = run_rollout(groups, "steal", predicted=realistic, **common).seconds
    return out


def rollout_seer(quick: bool) -> tuple[str, list]:
    """Seer's divided rollout (requests move between replicas every CHUNK tokens, their KV through a
    global pool, each load priced over the host link, and free as an upper bound) against the
    Seer-like anchor without it and steal (with and without moves of running requests), on four
    draws of the rollout grid."""
    grid, seeds = ROLLOUT_GRID, WAYS_SEEDS
    if quick:
        grid, seeds = [("long tail", 64, 4, 4), ("castillo", 64, 4, 2)], (11,)
    units = [(w, b, r, f, s, ROLLOUT_COST) for s in seeds for w, b, r, f in grid]
    results = _pool_map(_rollout_seer_unit, units)
    from lengthsched.runtime.dispatch import WorkStealing

    names = ([("seer", "seer (no migration)")]
             + [(f"divided {c}", f"seer_divided, {c}-token chunks (KV loads priced)") for c in SEER_CHUNKS]
             + [(f"divided {c}, async KV", f"seer_divided, {c}-token chunks, KV loads asynchronous")
                for c in SEER_CHUNKS]
             + [("divided, free KV", f"seer_divided, {FREE_CHUNK}-token chunks, KV loads free (upper bound)")]
             + [("steal", f"steal (the default: running requests moved to idle replicas every "
                          f"{WorkStealing.MIGRATE_CHUNK} tokens, KV recomputed)"),
                ("steal, no moves", "steal without moves of running requests"),
                ("steal, KV loaded", "steal, the moved KV loaded through a global pool (priced)"),
                ("steal, KV loaded async", "steal, the moved KV loaded through a global pool, asynchronously"),
                ("steal, free KV", "steal, the moved KV loaded through a global pool, free (upper bound)")])
    # where Seer's divided rollout is strongest: the long tail in tight pools, on several replicas
    tight = [i for i, u in enumerate(units) if _long_tail_tight(u)]
    rows = []
    for label, name in names:
        ratios = [out[label] / out["base"] for out in results]
        summary = _ratio_summary(units, ratios)
        faster = _faster_than_steal(results, label)
        beats, beats_tight = ("-", "-") if label == "steal" else (int(sum(faster)), int(sum(faster[i] for i in tight)))
        rows.append([name] + summary[:5] + [beats, float(np.mean([ratios[i] for i in tight])), beats_tight]
                    + summary[5:])
    draws = ", ".join(map(str, seeds))
    pools = " and ".join(map(str, SEER_TIGHT_POOLS))
    return table(f"Seer's divided rollout ({_cost_label()}; the rollout grid, seeds {draws}; Seer uses no length "
                 "predictions, steal the realistic ones): makespan x vLLM FCFS + verl routing",
                 ["policy", "settings", "mean", "mean, several replicas", "worst", "slower by > 0.1%",
                  "settings faster than steal by > 0.1%",
                  f"mean, long tail at {pools} x L_max, several replicas ({len(tight)})",
                  "faster than steal there"] + [f"mean, seed {s}" for s in seeds], rows), rows


# The long-tail workload's trace has no prompt lengths: its prompts take no prefill and no KV, so spreading
# a group over every replica costs nothing there. rollout_prompts gives the same completions real prompts.
PROMPT_WORKLOADS = ("long tail", "long tail + castillo prompts", "long tail + 512-token prompts")
PROMPTS_RUNS = (("seer", "seer", False), ("seer_divided", "seer_divided", False), ("steal", "steal", True))


def _rollout_prompts_unit(args):
    """One setting: seconds of vLLM FCFS + verl routing ("base") and of each of PROMPTS_RUNS (Seer without
    and with its divided rollout, no predictions; steal with the realistic ones)."""
    groups, realistic, _, _, common = _rollout_setting(*args)
    out = {"base": run_rollout(groups, "vllm", router="least_loaded", **common).seconds}
    for label, policy, predicted in PROMPTS_RUNS:
        out[label] = run_rollout(groups, policy, predicted=realistic if predicted else None, **common).seconds
    return out


def rollout_prompts(quick: bool) -> tuple[str, list]:
    """The long tail in tight pools (2 and 4 x L_max on several replicas, and 4 x L_max at scale) with
    the prompts its trace lacks: none (as published), each group a bundled CASTILLO prompt's length, or
    512 tokens; Seer with and without its divided rollout and steal, on four draws."""
    grids = {"grid": [u for u in ROLLOUT_GRID if _long_tail_tight(u)],
             "scale": [u for u in SCALE_GRID if u[0] == "long tail" and u[3] == 4]}
    seeds = WAYS_SEEDS
    if quick:
        grids, seeds = {"grid": [("long tail", 64, 4, 4)], "scale": []}, (11,)
    rows = []
    for scope, grid in grids.items():
        for workload in PROMPT_WORKLOADS:
            units = [(workload, b, r, f, s, ROLLOUT_COST) for s in seeds for _, b, r, f in grid]
            if not units:
                continue
            results = _pool_map(_rollout_prompts_unit, units)
            for label, *_ in PROMPTS_RUNS:
                ratios = [out[label] / out["base"] for out in results]
                faster = "-" if label == "steal" else int(sum(_faster_than_steal(results, label)))
                summary = _ratio_summary(units, ratios)
                rows.append([scope, workload, label, summary[0], summary[1], summary[3], summary[4], faster])
    return table(f"The long tail with prompts ({_cost_label()}; tight pools on several replicas, seeds "
                 f"{', '.join(map(str, seeds))}; Seer uses no length predictions, steal the realistic ones): "
                 "makespan x vLLM FCFS + verl routing",
                 ["settings", "prompts", "policy", "n", "mean", "worst", "slower by > 0.1%",
                  "faster than steal by > 0.1%"], rows), rows


# How much of a setting's number is luck: steal places groups on replicas by their predicted work, and
# predictions a token apart can give another placement. rollout_luck reruns every multi-replica setting
# with each completion's prediction moved by -1, 0 or +1 token (LUCK_DRAWS draws), steal with the moved
# predictions, steal with them but the placement of the unmoved ones (what is left is its runtime), and
# vLLM priority scheduling with them (verl's spread: no placement to move).
LUCK_DRAWS = 8
LUCK_WORKLOADS = ("castillo", "long tail", "long tail + castillo prompts")
LUCK_RUNS = ("steal", "steal, placement fixed", "vllm_priority")


def nudged(predicted, draw: int) -> np.ndarray:
    """``predicted`` (tokens per completion) with each value moved by -1, 0 or +1 token (at least 1),
    uniformly and independently, by ``numpy.random.default_rng(draw)``: predictions no predictor could
    tell apart from the originals."""
    pred = np.asarray(predicted, dtype=np.int64)
    return np.maximum(1, pred + np.random.default_rng(draw).integers(-1, 2, size=len(pred)))


def _rollout_luck_unit(args):
    """One setting: vLLM FCFS + verl ("base", seconds), then lists over the draws of rollout_luck (draw 0:
    the predictions as published) of steal's seconds ("steal"), steal's with the published placement
    ("steal, placement fixed") and vLLM priority + verl's ("vllm_priority")."""
    import simulate.rollout as rollout_module

    *setting, draws = args
    groups, realistic, _, _, common = _rollout_setting(*setting)
    out = {"base": run_rollout(groups, "vllm", router="least_loaded", **common).seconds,
           "steal": [], "steal, placement fixed": [], "vllm_priority": []}
    place = rollout_module.place_ways
    published = np.asarray(realistic, dtype=np.float64)

    def fixed(work, sizes, replicas, ways):  # the placement of the published predictions
        return place(published, sizes, replicas, ways)

    for draw in range(draws + 1):
        pred = np.asarray(realistic) if draw == 0 else nudged(realistic, draw)
        out["steal"].append(run_rollout(groups, "steal", predicted=pred, **common).seconds)
        if draw == 0:  # the published predictions give the published placement: the run above
            out["steal, placement fixed"].append(out["steal"][0])
        else:
            with patched(rollout_module, place_ways=fixed):
                out["steal, placement fixed"].append(run_rollout(groups, "steal", predicted=pred, **common).seconds)
        out["vllm_priority"].append(run_rollout(groups, "vllm_priority", router="least_loaded", predicted=pred,
                                                **common).seconds)
    return out


def rollout_luck(quick: bool) -> tuple[str, list]:
    """Every multi-replica setting of the rollout grid (seed --seed) with predictions moved by at most one
    token (LUCK_DRAWS draws): how far steal's makespan moves with its placement, and how far it and vLLM
    priority scheduling move otherwise."""
    shapes = list(dict.fromkeys((b, r, f) for _, b, r, f in ROLLOUT_GRID if r > 1))
    grid = [(w, b, r, f) for w in LUCK_WORKLOADS for b, r, f in shapes]
    draws = LUCK_DRAWS
    if quick:
        grid, draws = [("castillo", 64, 4, 4), ("long tail", 64, 4, 4)], 2
    units = [(w, b, r, f, ROLLOUT_SEED, ROLLOUT_COST, draws) for w, b, r, f in grid]
    results = _pool_map(_rollout_luck_unit, units)
    rows, summary = [], []
    for (w, b, r, f), out in zip(grid, results):
        row = [w, b, r, f"{f} x L_max"]
        for label in LUCK_RUNS:
            x = np.asarray(out[label]) / out["base"]
            row += [float(x[0]), float(x.mean()), float(x.min()), float(x.max())]
        rows.append(row)
    for w in dict.fromkeys(u[0] for u in grid):
        mine = [out for u, out in zip(grid, results) if u[0] == w]
        for label in LUCK_RUNS:
            x = np.array([np.asarray(out[label]) / out["base"] for out in mine])  # settings x draws
            summary.append([w, label, len(mine), float(x[:, 0].mean()), float(x.mean()),
                            float((x.max(axis=1) - x.min(axis=1)).mean()), float((x.max(axis=1) - x.min(axis=1)).max()),
                            int(np.sum(x[:, 0] > 1.001)), int(np.sum(x.max(axis=1) > 1.001)),
                            int(np.sum(x.max(axis=1) > 1.01)), float(np.mean(x > 1.001)), float(x.max())])
    title = (f"How much is luck ({_cost_label()}; the rollout grid's settings with several replicas, seed "
             f"{ROLLOUT_SEED}, realistic predictions and {draws} draws of them moved by at most one token each): "
             "makespan x vLLM FCFS + verl routing")
    text = "\n\n".join([
        table(title + ", summary",
              ["workload", "run", "settings", "mean (published)", "mean (every draw)", "mean worst - best",
               "largest worst - best", "slower by > 0.1% (published)", "slower by > 0.1% in some draw",
               "slower by > 1% in some draw", "share of draws slower by > 0.1%", "worst"], summary),
        table(title, ["workload", "prompts", "replicas", "budget"]
              + [f"{label}: {col}" for label in LUCK_RUNS for col in ("published", "mean", "best", "worst")], rows)])
    return text, {"rows": rows, "summary": summary, "draws": draws}


# steal's order on each replica: its placement's (the default) against longest predicted first, longest
# first only where groups are spread (ways > 1; whole groups keep the placement order) and longest first
# only where whole groups are placed (ways == 1, crowded steps), on four draws of the grid, of the steps at
# scale, of the long tail with CASTILLO prompt lengths and (with --groups-file) of held-out prompts.
ORDER_RUNS = (("placement order (the default)", "placement"), ("longest predicted first", "longest"),
              ("longest first where groups are spread", "longest_spread"),
              ("longest first where whole groups are placed", "longest_crowded"))


def _workload_label(workload: str) -> str:
    """A rollout workload's name for tables: a --groups-file's file name instead of its path."""
    return "held-out " + Path(workload[5:]).name if workload.startswith("file:") else workload


def _rollout_order_unit(args):
    """One setting: each of ORDER_RUNS's makespan over vLLM FCFS + verl's (realistic predictions)."""
    from lengthsched.runtime.dispatch import WorkStealing

    groups, realistic, _, _, common = _rollout_setting(*args)
    base = run_rollout(groups, "vllm", router="least_loaded", **common).seconds
    out = {}
    for label, order in ORDER_RUNS:
        with patched(WorkStealing, ORDER=order):
            out[label] = run_rollout(groups, "steal", predicted=realistic, **common).seconds / base
    return out


def rollout_order(quick: bool) -> tuple[str, list]:
    """steal with each replica's queue in placement order (the default), longest predicted first, or
    longest first only where groups are spread or only where whole groups are placed, on four draws of
    several workloads (see ORDER_RUNS): the summary, each draw's mean, each order's largest move against
    the default, and every setting's ratios."""
    scopes = {"grid": ROLLOUT_GRID, "scale": SCALE_GRID,
              "long tail + castillo prompts": [(long_tail_workload("castillo"), b, r, f)
                                               for w, b, r, f in ROLLOUT_GRID if w == "long tail"]}
    if GROUPS_FILE is not None:
        scopes["held-out prompts"] = [("file:" + GROUPS_FILE, b, r, f)
                                      for w, b, r, f in ROLLOUT_GRID if w == "castillo"]
    seeds = WAYS_SEEDS
    if quick:
        scopes, seeds = {"grid": [("castillo", 64, 4, 4), ("long tail", 64, 4, 2)]}, (11,)
    rows, per_draw, moves, settings = [], [], [], []
    default = ORDER_RUNS[0][0]
    for scope, grid in scopes.items():
        units = [(w, b, r, f, s, ROLLOUT_COST) for s in seeds for w, b, r, f in grid]
        results = _pool_map(_rollout_order_unit, units)
        settings += [[scope, _workload_label(unit[0]), *unit[1:5], [out[label] for label, _ in ORDER_RUNS]]
                     for unit, out in zip(units, results)]
        for label, _ in ORDER_RUNS:
            ratios = [out[label] for out in results]
            summary = _ratio_summary(units, ratios)
            rows.append([scope, label] + summary[:5] + [int(np.sum(np.array(ratios) > 1.01))])
            per_draw.append([scope, label] + summary[5:])
            if label != default:  # the setting this order moves most against the default's order
                gaps = [out[label] - out[default] for out in results]
                i = int(np.argmax(np.abs(gaps)))
                w, b, r, f, seed, _ = units[i]
                moves.append([scope, label, float(np.mean(np.abs(gaps))), f"{_workload_label(w)}, {b} x 16 on {r} at "
                              f"{f} x L_max, seed {seed}", results[i][default], results[i][label]])
    text = table(f"steal's order on each replica ({_cost_label()}; seeds {', '.join(map(str, seeds))}, realistic "
                 "predictions): makespan x vLLM FCFS + verl routing",
                 ["settings", "order", "n", "mean", "mean, several replicas", "worst", "slower by > 0.1%",
                  "slower by > 1%"], rows)
    text += "\n\n" + table("steal's order on each replica, per draw: mean makespan x vLLM FCFS + verl routing",
                            ["settings", "order"] + [f"seed {s}" for s in seeds], per_draw)
    text += "\n\n" + table(f"steal's order on each replica against the {default}: per setting, the mean and the "
                            "largest move of the makespan x vLLM FCFS + verl routing",
                            ["settings", "order", "mean |move|", "largest move at", "default", "this order"], moves)
    return text, {"rows": rows, "per_draw": per_draw, "moves": moves, "settings": settings}


# The RL frameworks' own routers and engines (simulate.ROUTERS), each framework as it ships, against
# vLLM FCFS + verl's routing and against steal.
# slime's --sglang-server-concurrency default: its client keeps 512 x engines requests in flight (one asyncio
# semaphore for the rollout, slime/rollout/sglang_rollout.py GenerateState) and sends the next sample, in
# submission order, to SGLang's router when one finishes
SLIME_CONCURRENCY = 512
ROUTER_RUNS = (  # (label, policy, router, predictions); router "name@k": k x replicas requests in flight at most
    ("vllm + verl routing", "vllm", "least_loaded", None),
    ("OpenRLHF: vllm + group round robin", "vllm", "group_round_robin", None),
    ("TRL: vllm + contiguous chunks", "vllm", "contiguous_chunks", None),
    ("slime: sglang + cache-aware router", "sglang", f"cache_aware@{SLIME_CONCURRENCY}", None),
    ("sglang + cache-aware router, all routed at once", "sglang", "cache_aware", None),
    ("sglang + verl routing", "sglang", "least_loaded", None),
    ("vllm + cache-aware router", "vllm", "cache_aware", None),
    ("slime + lengthsched's plan (lengthsched.integrations.slime)", "sglang", f"plan@{SLIME_CONCURRENCY}",
     "realistic"),
    ("slime + lengthsched's plan, groups longest first on one replica too", "sglang",
     f"plan_longest@{SLIME_CONCURRENCY}", "realistic"),
    ("slime + lengthsched's plan, groups in batch order", "sglang", f"plan_batch@{SLIME_CONCURRENCY}", "realistic"),
    ("slime + lengthsched's plan, every sample sent at once (no client window)", "sglang",
     f"plan_at_once@{SLIME_CONCURRENCY}", "realistic"),
    ("steal over SGLang engines", "steal_sglang", None, "realistic"),
    ("steal", "steal", None, "realistic"),
)


def _rollout_router_unit(args):
    """One setting: every run of ROUTER_RUNS's makespan (seconds), or None where the engine refuses the pool."""
    return {label: (None if v is None else v[0]) for label, v in _rollout_unit(args, ROUTER_RUNS).items()}


def rollout_routers(quick: bool) -> tuple[str, list]:
    """The RL frameworks' routers as they ship (verl, OpenRLHF, TRL, slime) on four draws of the grid
    and on one of the steps at scale: each one's makespan over vLLM FCFS + verl's, and what steal
    gains over each framework's own (steal's makespan over the framework's, per setting)."""
    scopes = {"grid": [(u, s) for s in WAYS_SEEDS for u in ROLLOUT_GRID],
              "scale": [(u, 11) for u in SCALE_GRID]}
    if quick:
        scopes = {"grid": [(("castillo", 64, 4, 4), 11), (("long tail", 64, 4, 2), 11)]}
    rows, settings, over_slime = [], [], []
    for scope, grid in scopes.items():
        units = [(w, b, r, f, seed, ROLLOUT_COST) for (w, b, r, f), seed in grid]
        results = _pool_map(_rollout_router_unit, units)
        settings += [[scope, _workload_label(u[0]), *u[1:5], [out[label] for label, *_ in ROUTER_RUNS]]
                     for u, out in zip(units, results)]
        # multi-replica settings whose B x G requests (G = 16, rollout_groups' default) exceed slime's in-flight cap
        # (there slime routes the rest as requests finish)
        over_cap = sum(1 for u in units if u[1] * 16 > SLIME_CONCURRENCY * u[2] and u[2] > 1)
        for label, *_ in ROUTER_RUNS:
            both = [(u, out[label], out["vllm + verl routing"], out["steal"]) for u, out in zip(units, results)
                    if out[label] is not None]
            ratios = [x / base for _, x, base, _ in both]
            summary = _ratio_summary([u for u, *_ in both], ratios)
            gain = np.array([st / x for _, x, _, st in both])
            rows.append([scope, label, len(units) - len(both)] + summary[:5]
                        + [float(gain.mean()), float(gain.min()), float(gain.max()), int(np.sum(gain > 1.001)),
                           over_cap])
        for label in SLIME_ROWS[1:]:  # what slime's users get from each SGLang-engine run, over slime as it ships
            both = [(u, out[label], out[SLIME_ROWS[0]]) for u, out in zip(units, results)
                    if out[label] is not None and out[SLIME_ROWS[0]] is not None]
            summary = _ratio_summary([u for u, *_ in both], [x / slime for _, x, slime in both])
            over_slime.append([scope, label, len(both)] + summary[1:5])
    text = table(f"The RL frameworks' routers and engines as they ship ({_cost_label()}; grid: seeds "
                 f"{', '.join(map(str, WAYS_SEEDS))}; scale: seed 11): makespan x vLLM FCFS + verl routing, and "
                 "steal's makespan x each run's (steal with realistic prompt-level predictions)",
                 ["settings", "run", "fails", "n", "mean x vllm + verl", "mean, several replicas", "worst",
                  "slower by > 0.1%", "steal x this: mean", "best", "worst", "settings steal is slower",
                  f"multi-replica settings over slime's {SLIME_CONCURRENCY} per engine"], rows)
    text += "\n" + table("slime's engines (SGLang) run otherwise: makespan x slime's as it ships (its cache-aware "
                         "router and in-flight cap), same settings", ["settings", "run", "n", "mean x slime",
                                                                       "mean, several replicas", "worst",
                                                                       "slower by > 0.1%"], over_slime)
    return text, {"rows": rows, "settings": settings, "over_slime": over_slime}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "simulate.json"))
    parser.add_argument("--sections",
                        default="target,seconds,seconds_batches,rollout,rollout_online,rollout_speed,rollout_headroom,rollout_watermark,"
                                "paper,batches,"
                                "speed,scaling")
    parser.add_argument("--cost", default=None,
                        help="a fitted step-cost JSON (lengthsched.cost.StepCost.to_json, e.g. "
                             "benchmarks/results/stepcost_h100_qwen3-8b.json) for the rollout sections "
                             "instead of the default Qwen3-1.7B on the unfitted H100 preset")
    parser.add_argument("--groups-file", default=None,
                        help="a CASTILLO JSON file of held-out prompts for --sections rollout_heldout (e.g. "
                             "../shared/data/castillo/preproc_ShareGPT_validate_Qwen--Qwen2.5-7B-Instruct-1M.json; "
                             "not shipped: its prompts have no clear license)")
    parser.add_argument("--max-num-seqs", type=int, default=None,
                        help="requests each engine replica runs at once at most in the rollout sections (vLLM's "
                             "max_num_seqs; verl sets 1024); default: no cap, the KV pool alone limits them")
    parser.add_argument("--long-tail-prompts", default=None,
                        help="give the long-tail workload's groups prompts (its trace has none: 0 tokens) in the "
                             "rollout grid and the steps at scale: 'castillo' (each group a bundled CASTILLO "
                             "prompt's length) or a number of tokens")
    parser.add_argument("--valid-share", type=float, default=None,
                        help="rollout_partial: a dynamic-sampling filter that keeps this share of the finished groups "
                             "(each at random), with more over-sampling (1.5 and 2)")
    parser.add_argument("--seed", type=int, default=11,
                        help="the seed of the rollout sections' prompts, completions and prediction errors "
                             "(default 11, the published grid)")
    args = parser.parse_args(argv)
    global ROLLOUT_COST, GROUPS_FILE, ROLLOUT_SEED, ROLLOUT_MAX_SEQS, PARTIAL_VALID
    if args.valid_share is not None and not 0 < args.valid_share <= 1:
        parser.error(f"argument --valid-share: got {args.valid_share}; expected a share in (0, 1]")
    PARTIAL_VALID = args.valid_share
    if args.seed < 0:
        parser.error(f"argument --seed: got {args.seed}; expected a seed >= 0")
    if args.max_num_seqs is not None and args.max_num_seqs < 1:
        parser.error(f"argument --max-num-seqs: got {args.max_num_seqs}; expected at least 1")
    ROLLOUT_MAX_SEQS = args.max_num_seqs
    ROLLOUT_SEED = args.seed
    if args.long_tail_prompts is not None:
        try:
            workload = long_tail_workload(args.long_tail_prompts)
        except InvalidArgument as exc:
            parser.error(f"argument --long-tail-prompts: got {args.long_tail_prompts!r}; expected {exc.expected}")
        if "rollout_prompts" in args.sections.split(","):
            parser.error("argument --long-tail-prompts: rollout_prompts gives the long tail its own prompts")
        for grid in (ROLLOUT_GRID, SCALE_GRID):  # in place: the sections read these lists
            grid[:] = [(workload if u[0] == "long tail" else u[0], *u[1:]) for u in grid]
    if args.groups_file is not None:
        try:  # a bad file fails here, before any section runs
            castillo_file_groups(args.groups_file, 16, limit=1)
        except InvalidArgument as exc:
            parser.error(f"argument --groups-file: got {args.groups_file!r}; expected {exc.expected}")
        GROUPS_FILE = str(args.groups_file)
    if args.cost is not None:
        ROLLOUT_COST = Path(args.cost).read_text(encoding="utf-8")
        _rollout_cost(ROLLOUT_COST)  # a bad file fails here, before any section runs
    results = {"machine": machine(), "command": " ".join(["bench_simulate.py"] + (argv or sys.argv[1:])),
               "cost": args.cost}
    texts = []
    sections = {"target": target, "seconds": seconds, "seconds_batches": seconds_batches, "rollout": rollout,
                "rollout_online": rollout_online, "rollout_speed": rollout_speed,
                "rollout_speed_compressed": rollout_speed_compressed, "rollout_headroom": rollout_headroom,
                "rollout_prompt_headroom": rollout_prompt_headroom,
                "rollout_classes": rollout_classes, "rollout_heldout": rollout_heldout,
                "rollout_watermark": rollout_watermark, "rollout_offload": rollout_offload,
                "rollout_ways": rollout_ways,
                "rollout_variants": rollout_variants, "rollout_seer": rollout_seer, "rollout_scale": rollout_scale,
                "rollout_prompts": rollout_prompts, "rollout_luck": rollout_luck, "rollout_order": rollout_order,
                "rollout_resubmit": rollout_resubmit, "rollout_routers": rollout_routers,
                "rollout_sglang_variants": rollout_sglang_variants, "rollout_hedged": rollout_hedged,
                "rollout_oversampling": rollout_oversampling,
                "rollout_partial": rollout_partial, "rollout_staleness": rollout_staleness, "async_rl": async_rl,
                "async_verl": async_verl, "async_verl_driver": async_verl_driver, "async_verl_ways": async_verl_ways,
                "async_areal_sync": async_areal_sync, "async_areal_bound2": async_areal_bound2,
                "rollout_cold_start": rollout_cold_start, "slime_cold_start": slime_cold_start,
                "slime_dynamic_sampling": slime_dynamic_sampling, "slime_difficulty": slime_difficulty,
                "slime_difficulty_drift": slime_difficulty_drift, "slime_order_horizon": slime_order_horizon,
                "verl_dapo_skip": verl_dapo_skip, "rollout_multiturn": rollout_multiturn, "async_areal": async_areal,
                "async_areal_epochs": async_areal_epochs, "async_areal_ways": async_areal_ways,
                "rollout_multiturn_slime": rollout_multiturn_slime,
                "rollout_multiturn_offload": rollout_multiturn_offload,
                "multiturn_speed": multiturn_speed, "paper": paper,
                "batches": batches, "speed": speed,
                "scaling": scaling}
    for name in args.sections.split(","):
        start = time.perf_counter()
        text, rows = sections[name](args.quick)
        results[name] = (rows if isinstance(rows, dict) else {"rows": rows}) | {
            "seconds": round(time.perf_counter() - start, 1)}
        texts.append(text)
    report(results, texts, args.out, "the speed section pinned to one core, the others on all cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
