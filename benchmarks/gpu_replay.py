"""Replay simulated rollout steps on one GPU: do the policies' modelled seconds hold on measured steps?

The rollout comparisons of ``bench_simulate.py`` are in modelled seconds (``lengthsched.cost``).
This script takes the steps the simulator says each policy runs in one rollout setting (every
replica's :class:`~lengthsched.runtime.StepLog`, ``RolloutResult.step_logs``), draws a sample of them
with probability proportional to their modelled seconds (stratified by replica, with random numbers
common to the policies: :func:`draw_plan`), runs each drawn step's shape on the GPU
with a model of the preset's shapes and random weights (``gpu_cost.Stepper``: static KV buffers,
one CUDA graph per shape, CUDA-event timing), and estimates each replica's measured seconds as
its modelled step seconds times the mean of measured / modelled over its drawn steps (the
Hansen-Hurwitz estimator of a total under sampling proportional to size: unbiased, and tight
when the model is off by a similar factor on every step), plus its seconds with no step to run (waits
for a KV load or a resubmission, kept as modelled). The makespan is the slowest replica's;
a bootstrap over the drawn steps (within each replica) gives 95% intervals of each policy's measured
makespan relative to the baseline's (the first policy).

How a logged step is run: ``rows`` decode rows, each after ``kv / rows`` tokens of context (the
step's KV read spread evenly; the simulator's rows differ in context, the sum is what it prices);
its prefill tokens ``T`` attending ``C`` token pairs as ``p`` sequences of ``T / p`` tokens each,
``p`` chosen so that the pairs match ``C`` (prompts prefilled together attend their own tokens);
where ``C`` exceeds one causal sequence of ``T`` (a chunk after a cached prefix) the replay runs
one sequence and attends fewer pairs than the model prices (counted in the report); KV loads from
host memory are not run: a step is drawn and scaled by its compute alone (priced without its load),
and a synchronous load's seconds, like an asynchronous load's waits, are kept as modelled (of the
policies replayed, only ``seer_divided`` moves KV: its requests come back with their KV every 512
tokens). What is not replayed at all: the engine's scheduler and sampler on the host, which the
model does not price either.

    python benchmarks/gpu_replay.py                          # cuda, bf16, the default setting and policies
    python benchmarks/gpu_replay.py --device cpu --quick     # tiny model, small setting: the code path only

Results go to ``--out`` (rewritten atomically after every round of draws, so a run cut off keeps
what it measured).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from common import ROOT, machine, write_json
from gpu_cost import Stepper, build_model, model_config, preset_for

from lengthsched.cost import StepCost
from lengthsched.errors import InvalidArgument
from lengthsched.memory import ModelMemory

DEFAULT_POLICIES = "vllm:least_loaded,vllm_priority:least_loaded,seer,steal"
#: --turns: vLLM FCFS (the baseline), vLLM priority with every turn's session priority, steal blind to later turns
#: and following them, vLLM FCFS behind a cache-aware router (SGLang's rule: later turns rebalanced by load).
MULTITURN_DEFAULT = "vllm,vllm_priority+,steal,steal+,vllm:cache_aware"


def expand(log, cost: StepCost) -> dict[str, np.ndarray]:
    """Every step of a :class:`StepLog` as its own row (a run of ``steps`` steps with the same rows reads
    ``rows`` more KV tokens each step and prefills on its first step only) with its modelled seconds
    (``seconds``) and the part of them the replay runs (``compute_seconds``: the step priced without
    its synchronous KV load from host memory, which no forward pass measures; a step that only loads
    has none)."""
    n = np.asarray(log.steps, dtype=np.int64)
    run = np.repeat(np.arange(len(n)), n)
    offset = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    first = offset == 0
    rows = np.asarray(log.rows, dtype=np.int64)[run]
    kv = np.asarray(log.kv_first, dtype=np.int64)[run] + offset * rows
    out = {"rows": rows, "kv": kv}
    for name in ("prefill_tokens", "prefill_context", "loaded_tokens"):
        out[name] = np.where(first, np.asarray(getattr(log, name), dtype=np.int64)[run], 0)
    out["seconds"] = price(out, cost)
    out["compute_seconds"] = price({**out, "loaded_tokens": np.zeros_like(out["loaded_tokens"])}, cost)
    return out


def price(steps: dict[str, np.ndarray], cost: StepCost) -> np.ndarray:
    """Modelled seconds of every step of :func:`expand`'s rows under ``cost``."""
    ones = np.ones(len(steps["rows"]), dtype=np.int64)
    return np.asarray(cost.segment_seconds(ones, steps["rows"], steps["kv"], steps["prefill_tokens"],
                                           steps["prefill_context"], steps["loaded_tokens"]), dtype=np.float64)


def replay_shape(rows: int, kv: int, tokens: int, context: int) -> tuple[str, int, int, int, int, bool]:
    """(kind, rows, context per row or prefill tokens, chunk, pieces, exact) of the step to run for a
    logged step: see the module docstring. ``exact``: the run attends the pairs the log prices (up to
    rounding); False where the log's pairs exceed one causal sequence of its tokens."""
    pieces, exact = 1, True
    if tokens:
        one = tokens * (tokens + 1) // 2
        exact = context <= one
        if context < one:  # p sequences of s tokens: p s (s + 1) / 2 = context with p s = tokens
            s = max(1, round(2 * context / tokens - 1))
            pieces = max(1, min(tokens, round(tokens / s)))
        tokens = pieces * math.ceil(tokens / pieces)
    if rows and tokens:
        return "mixed", rows, max(1, round(kv / rows)), tokens, pieces, exact
    if rows:
        return "decode", rows, max(1, round(kv / rows)), 0, 1, exact
    return "prefill", 0, tokens, 0, pieces, exact


#: The "router" of slime with lengthsched.integrations.slime (simulate.run_slime_planned; sglang only).
SLIME_PLAN = "slime_plan"


def parse_policies(text: str) -> list[tuple[str, str | None]]:
    out = []
    for item in text.split(","):
        name, _, router = item.strip().partition(":")
        if not name:
            raise InvalidArgument("--policies", text, "comma-separated POLICY or POLICY:ROUTER")
        out.append((name, router or None))
    return out


def split_router(router: str | None) -> tuple[str | None, int | None]:
    """``ROUTER@K`` -> (ROUTER, K): a framework keeping K requests per replica in flight (slime: 512)."""
    if router is None or "@" not in router:
        return router, None
    base, _, per = router.partition("@")
    if not per.isdigit() or int(per) < 1:
        raise InvalidArgument("--policies", router, "ROUTER@K with K >= 1 requests per replica in flight")
    return base, int(per)


def check_policies(ap, text: str, turns: bool = False) -> None:
    """--policies names rollout policies of the registry and routers of simulate.ROUTERS or slime_plan (sglang
    only), each optionally ROUTER@K (else a usage error); with ``turns``, policies of
    simulate.MULTITURN_POLICIES, each optionally POLICY+ (it follows later turns), and for the engine policies a
    router of simulate.multiturn.MULTITURN_ROUTERS (POLICY:ROUTER)."""
    from lengthsched.runtime import POLICIES
    from simulate import MULTITURN_POLICIES, ROUTERS
    from simulate.multiturn import MULTITURN_ROUTERS

    if turns:
        for name, router in parse_policies(text):
            base = name.rstrip("+")
            if base not in MULTITURN_POLICIES or (router is not None and (router not in MULTITURN_ROUTERS
                                                                        or base.startswith("steal"))):
                ap.error(f"--policies {text!r} with --turns: {name!r}; expected POLICY or POLICY+ (following later "
                         f"turns) with POLICY one of {', '.join(MULTITURN_POLICIES)}, an engine policy optionally "
                         f"POLICY:ROUTER with ROUTER one of {', '.join(MULTITURN_ROUTERS)}")
        return
    try:
        items = parse_policies(text)
        routers = [split_router(router) for _, router in items]
    except InvalidArgument as exc:
        ap.error(str(exc))
    for (name, _), (router, _) in zip(items, routers):
        if name not in POLICIES or not POLICIES[name].rollout:
            ap.error(f"--policies {text!r}: {name!r} is not a rollout policy; expected one of "
                     + ", ".join(sorted(n for n, spec in POLICIES.items() if spec.rollout)))
        if router is not None and router not in ROUTERS + (SLIME_PLAN,):
            ap.error(f"--policies {text!r}: {router!r} is not a router; expected one of "
                     f"{', '.join(ROUTERS + (SLIME_PLAN,))}")
        if router == SLIME_PLAN and name != "sglang":
            ap.error(f"--policies {text!r}: {SLIME_PLAN} runs slime's engines only (sglang:{SLIME_PLAN})")


def simulate(args, cost: StepCost, fitted: StepCost | None = None) -> list[dict]:
    """Each policy's rollout of the setting: makespan, replica seconds and every step, expanded (with
    ``fitted``, also the makespan of the same steps priced by it, ``fitted_seconds``). With ``args.turns``
    (LO, HI), a multi-turn step (``simulate.run_multiturn``: sessions of LO-HI turns, tools of median
    ``args.tool_seconds``, a pool of ``args.factor`` x 8192 tokens; a policy named POLICY+ follows later turns)."""
    from bench_simulate import MULTITURN_CONTEXT, _rollout_setting

    from simulate import run_multiturn, run_rollout, run_slime_planned, split_turns

    groups, realistic, oracle, constant, common = _rollout_setting(args.workload, args.prompts, args.replicas,
                                                                   args.factor, args.seed, None)
    common["cost"] = cost
    pred = {"realistic": realistic, "oracle": oracle, "constant": constant, "none": None}[args.predictions]
    spec_turns = getattr(args, "turns", None)
    turns = None if spec_turns is None else split_turns(groups, turns=spec_turns, tool_seconds=args.tool_seconds,
                                                         tool_sigma=0.5, seed=args.seed)
    runs = []
    for name, spec in parse_policies(args.policies):
        router, per = split_router(spec)
        cap = None if per is None else per * args.replicas
        if turns is not None:  # a multi-turn step; POLICY+ follows later turns
            base, follow = name.rstrip("+"), name.endswith("+")
            r = run_multiturn(groups, turns, base, replicas=args.replicas, max_new_tokens=common["max_new_tokens"],
                              budget_tokens=args.factor * MULTITURN_CONTEXT, cost=cost,
                              predicted=None if base in ("vllm", "sglang") else pred, follow_turns=follow,
                              router=router or "sticky")
        elif router == SLIME_PLAN:  # slime with lengthsched.integrations.slime: its plan and client queues
            if pred is None:
                raise InvalidArgument("--predictions", "none", f"predictions for {SLIME_PLAN} (it plans from them)")
            r, _ = run_slime_planned(groups, pred, in_flight=cap, **common)
        else:
            r = run_rollout(groups, name, router=router, predicted=pred, in_flight=cap, **common)
        steps = [expand(log, cost) for log in r.step_logs]
        runs.append({"policy": name + (f" + {spec}" if spec else ""), "seconds": r.seconds,
                     "replica_seconds": list(r.replica_seconds),
                     "replica_step_seconds": [float(s["compute_seconds"].sum()) for s in steps],
                     "preemptions": r.preemptions,
                     "recomputed_tokens": r.recomputed_tokens, "tokens": r.tokens,
                     "lower_bound_seconds": r.lower_bound_seconds, "steps": steps})
        if fitted is not None:
            runs[-1]["fitted_seconds"] = max(float(price(s, fitted).sum()) for s in steps)
        print(f"{runs[-1]['policy']}: modelled {r.seconds:.3f} s, {sum(len(s['rows']) for s in steps)} steps, "
              f"{r.preemptions} preemptions", flush=True)
    return runs


def allocate(totals: np.ndarray, draws: int) -> np.ndarray:
    """Draws per replica: ``draws`` shared equally by the replicas with steps (``totals``, their modelled
    step seconds, above 0), the remainder to the lower replicas. Equal shares make a replica's share
    independent of the others' (two policies with the same steps on a replica draw as many there) and
    give every replica that may end the step the same precision."""
    live = np.flatnonzero(np.asarray(totals, dtype=np.float64) > 0)
    n = np.zeros(len(totals), dtype=np.int64)
    if draws > 0 and len(live):
        n[live] = draws // len(live)
        n[live[:draws % len(live)]] += 1
    return n


def draw_plan(run: dict, draws: int, seed: int) -> list[tuple[int, int]]:
    """The (replica, step) pairs to replay for one policy, ``draws`` of them in the order to run them.

    Stratified by replica: each replica gets an equal share of the draws (:func:`allocate`), and within it
    steps are drawn with probability proportional to their modelled seconds (what the Hansen-Hurwitz
    estimate of :func:`estimate` needs), by inverse transform of uniforms that depend on the seed and
    the replica alone: common random numbers, so that two policies whose replica ran the same steps
    draw the same ones there (and, with the measurements shared per shape, estimate it the same),
    and policies whose replicas ran similar steps draw similar ones. The order interleaves the replicas
    (the k-th draw of a replica with n draws at (k + 1/2) / n), so that a run cut off by its time budget
    has drawn every replica in about its share."""
    totals = np.array([float(s["compute_seconds"].sum()) for s in run["steps"]])
    counts = allocate(totals, draws)
    keyed = []
    for r, (s, n) in enumerate(zip(run["steps"], counts)):
        if n == 0:
            continue
        cdf = np.cumsum(s["compute_seconds"]) / totals[r]
        u = np.random.default_rng([seed, r]).random(draws)[:n]
        picks = np.minimum(np.searchsorted(cdf, u, side="right"), len(cdf) - 1)
        keyed += [((k + 0.5) / n, r, int(i)) for k, i in enumerate(picks)]
    return [(r, i) for _, r, i in sorted(keyed)]


def stratified_resamples(draws: list[dict], replicas: int, seed: int, resamples: int) -> np.ndarray:
    """Bootstrap indices into ``draws`` (resamples x draws): each replica's draws resampled among
    themselves (the strata of :func:`draw_plan`), by uniforms that depend on the seed and the replica
    alone, so that two policies with the same draws on a replica resample them alike and the
    interval of their ratio reflects only where they differ."""
    boot = np.zeros((resamples, len(draws)), dtype=np.int64)
    replica = np.array([d["replica"] for d in draws], dtype=np.int64)
    for r in range(replicas):
        pos = np.flatnonzero(replica == r)
        if len(pos):  # column j's uniforms depend on (seed, replica, j) alone, not on how many were drawn
            u = np.column_stack([np.random.default_rng([seed, 1, r, j]).random(resamples) for j in range(len(pos))])
            boot[:, pos] = pos[np.minimum((u * len(pos)).astype(np.int64), len(pos) - 1)]
    return boot


def estimate(run: dict, draws: list[dict], boot: np.ndarray | None = None) -> np.ndarray:
    """Per-replica measured seconds estimated from the draws (see the module docstring), shape
    (replicas,); with ``boot`` (resamples x draws indices into ``draws``), shape (resamples, replicas).
    Only a replica's step seconds (``replica_step_seconds``, default all of them: the steps' compute,
    :func:`expand`'s ``compute_seconds``) are scaled by its drawn ratio; the rest of its modelled seconds
    (waits with no step to run: an asynchronous KV load still in flight, a resubmission's round trip;
    synchronous KV loads from host memory inside steps) is kept as modelled. A replica with no draw scales
    by the policy's pooled ratio."""
    modelled = np.asarray(run["replica_seconds"], dtype=np.float64)
    stepped = np.asarray(run.get("replica_step_seconds", modelled), dtype=np.float64)
    if not draws:
        return modelled if boot is None else np.tile(modelled, (len(boot), 1))
    ratio = np.array([d["measured"] / d["modelled"] for d in draws])
    replica = np.array([d["replica"] for d in draws], dtype=np.int64)
    idx = np.arange(len(draws))[None, :] if boot is None else np.asarray(boot)
    r, rep = ratio[idx], replica[idx]  # (resamples, draws)
    k = len(modelled)
    flat = (rep + k * np.arange(len(idx))[:, None]).ravel()
    sums = np.bincount(flat, weights=r.ravel(), minlength=k * len(idx)).reshape(len(idx), k)
    counts = np.bincount(flat, minlength=k * len(idx)).reshape(len(idx), k)
    pooled = r.mean(axis=1, keepdims=True)
    est = (modelled - stepped) + stepped * np.where(counts > 0, sums / np.maximum(counts, 1), pooled)
    return est[0] if boot is None else est


def report(runs: list[dict], draws: list[list[dict]], seed: int, resamples: int = 1000) -> dict:
    """Each policy's modelled and measured makespan, both relative to the first policy's, with a 95%
    bootstrap interval of the measured ratio (the draws of both policies resampled within each replica,
    alike where they are alike: :func:`stratified_resamples`); the fitted cost's
    makespan where the runs carry it (:func:`simulate`'s ``fitted_seconds``)."""
    base = runs[0]
    base_measured = float(estimate(base, draws[0]).max())

    def boot_of(run: dict, mine: list[dict]) -> np.ndarray:
        return estimate(run, mine, stratified_resamples(mine, len(run["replica_seconds"]), seed, resamples))

    base_boot = boot_of(base, draws[0])
    rows = []
    for run, mine in zip(runs, draws):
        per_replica = estimate(run, mine)
        measured = float(per_replica.max())
        entry = {"policy": run["policy"], "modelled_seconds": run["seconds"], "measured_seconds": measured,
                 "measured_replica_seconds": per_replica.tolist(), "modelled_replica_seconds": run["replica_seconds"],
                 "modelled_replica_step_seconds": run.get("replica_step_seconds", run["replica_seconds"]),
                 "draws": len(mine),
                 "modelled_vs_baseline": run["seconds"] / base["seconds"],
                 "measured_vs_baseline": measured / base_measured,
                 "preemptions": run["preemptions"], "recomputed_tokens": run["recomputed_tokens"],
                 "lower_bound_seconds": run["lower_bound_seconds"],
                 "inexact_draws": sum(not d["exact"] for d in mine)}
        if mine:
            r = np.array([d["measured"] / d["modelled"] for d in mine])
            entry["measured_over_modelled"] = {"mean": float(r.mean()), "median": float(np.median(r)),
                                               "p10": float(np.quantile(r, 0.1)), "p90": float(np.quantile(r, 0.9))}
        if "fitted_seconds" in run:
            entry["fitted_modelled_seconds"] = run["fitted_seconds"]
        if mine and draws[0] and run is not base:
            boot = boot_of(run, mine).max(axis=1)
            ratio = boot / base_boot.max(axis=1)
            entry["measured_vs_baseline_95"] = [float(np.quantile(ratio, 0.025)), float(np.quantile(ratio, 0.975))]
        rows.append(entry)
    if "fitted_seconds" in base:
        for entry in rows:
            entry["fitted_vs_baseline"] = entry["fitted_modelled_seconds"] / rows[0]["fitted_modelled_seconds"]
    return {"policies": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None, help="bfloat16 (default on cuda) or float32 (default on cpu)")
    ap.add_argument("--model", default="qwen3-1.7b", help="a preset of lengthsched/presets (its shapes, random "
                                                          "weights); the rollout is priced with its H100 preset")
    ap.add_argument("--quick", action="store_true", help="tiny model, 16 prompts on 2 replicas, 20 draws per policy: "
                                                         "checks the code path only")
    ap.add_argument("--workload", default="castillo", help="castillo or 'long tail' (bench_simulate's grid)")
    ap.add_argument("--long-tail-prompts", default=None,
                    help="give the long tail's groups prompts (its trace has none): 'castillo' (each group a "
                         "bundled CASTILLO prompt's length) or a number of tokens")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--factor", type=int, default=2, help="KV pool per replica in L_max (4096 tokens); with "
                                                         "--turns in 8192 tokens (the longest conversation)")
    ap.add_argument("--turns", default=None, help="LO-HI: a multi-turn step instead (simulate.run_multiturn: every "
                                                  "completion cut into LO-HI turns, a tool call between two; "
                                                  "--policies then POLICY or POLICY+ of "
                                                  "simulate.MULTITURN_POLICIES, + following later turns, "
                                                  "POLICY:cache_aware an engine policy behind a cache-aware router; "
                                                  "default " + MULTITURN_DEFAULT + ")")
    ap.add_argument("--tool-seconds", type=float, default=0.5, help="with --turns, the tools' median seconds")
    ap.add_argument("--seed", type=int, default=11, help="the grid's draw (bench_simulate --seed)")
    ap.add_argument("--predictions", default="realistic", choices=("realistic", "oracle", "constant", "none"))
    ap.add_argument("--policies", default=DEFAULT_POLICIES,
                    help="POLICY[:ROUTER[@K]], comma-separated; the first is the baseline; @K: K requests per "
                         "replica in flight (slime's 512); ROUTER slime_plan: slime with "
                         "lengthsched.integrations.slime (sglang:slime_plan@512)")
    ap.add_argument("--fitted", default=str(ROOT / "benchmarks" / "results" / "stepcost_h100_qwen3-1.7b.json"),
                    help="a fitted StepCost JSON: its modelled seconds of the same steps are reported too ('' none)")
    ap.add_argument("--draws", type=int, default=400, help="steps drawn per policy at most")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs")
    ap.add_argument("--budget-seconds", type=float, default=300.0, help="stop drawing after this long")
    ap.add_argument("--out", default=None, help="report JSON (default benchmarks/results/replay_<card>.json)")
    args = ap.parse_args(argv)
    start = time.monotonic()
    if args.turns is not None:
        from simulate.multiturn_report import parse_range

        try:
            args.turns = parse_range("turns", args.turns, 1)
        except InvalidArgument as exc:
            ap.error(f"--turns {args.turns!r}: {exc}")
        if args.tool_seconds <= 0:
            ap.error(f"--tool-seconds {args.tool_seconds}: expected seconds > 0")
        if args.policies == DEFAULT_POLICIES:
            args.policies = MULTITURN_DEFAULT
    check_policies(ap, args.policies, turns=args.turns is not None)
    if args.long_tail_prompts is not None:
        from bench_simulate import long_tail_workload

        if args.workload != "long tail":
            ap.error(f"--long-tail-prompts {args.long_tail_prompts!r}: only with --workload 'long tail'")
        try:
            args.workload = long_tail_workload(args.long_tail_prompts)
        except InvalidArgument as exc:
            ap.error(f"--long-tail-prompts {args.long_tail_prompts!r}: expected {exc.expected}")
    if args.quick:
        args.prompts, args.replicas, args.draws = 16, 2, min(args.draws, 20)

    import torch
    import transformers

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device (use --device cpu --quick to check the code path)")
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    preset = preset_for(card) if device.type == "cuda" else "h100"
    dtype_name = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype_name]
    slug = preset if device.type == "cuda" else "cpu"
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"replay_{slug}.json")
    preset_cfg, cfg, name = model_config(ap, args.model, args.quick)
    memory = ModelMemory.from_hf_config({**cfg, "_name_or_path": name}, dtype_name)
    cost = StepCost.from_gpu(memory, "h100", config=cfg)  # what the rollout grid prices with
    fitted = None
    if args.fitted and not args.quick:
        fitted = StepCost.from_json(Path(args.fitted).read_text(encoding="utf-8"))

    runs = simulate(args, cost, fitted)
    plans = [draw_plan(run, args.draws, args.seed) for run in runs]  # per policy: (replica, step), in order
    shapes = {}
    for run, plan in zip(runs, plans):
        for rep, i in plan:
            s = run["steps"][rep]
            shapes[(rep, i, run["policy"])] = replay_shape(int(s["rows"][i]), int(s["kv"][i]),
                                                           int(s["prefill_tokens"][i]), int(s["prefill_context"][i]))
    max_tokens = max(r * c + t if k != "prefill" else c for k, r, c, t, _, _ in shapes.values())

    torch.manual_seed(args.seed)
    model = build_model(torch, cfg, dtype, device)
    print(f"{card}: {name}-shaped model, {dtype_name}; KV buffer {max_tokens} tokens; "
          f"{len(shapes)} drawn steps", flush=True)
    stepper = Stepper(torch, model, cfg, device, max_tokens, warmup=args.warmup, reps=args.reps,
                      graphs=not args.eager, seed=args.seed)
    timed: dict[tuple, dict] = {}  # one measurement per distinct shape
    draws: list[list[dict]] = [[] for _ in runs]
    results = {"machine": machine(), "card": card, "device": str(device), "dtype": dtype_name,
               "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
               "model": "tiny-qwen3 (--quick)" if args.quick else f"{name} shapes, random weights",
               "command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:])),
               "setting": {"workload": args.workload, "prompts": args.prompts, "group": 16,
                           "replicas": args.replicas, "seed": args.seed, "predictions": args.predictions,
                           "pool": f"{args.factor} x L_max" if args.turns is None else f"{args.factor} x 8192",
                           **({} if args.turns is None else {"turns": list(args.turns),
                                                             "tool_seconds": args.tool_seconds})},
               "cost": f"{cost.model} on the {cost.gpu} preset", "fitted": args.fitted or None,
               "note": "CPU run: checks the code path, not GPU evidence" if device.type != "cuda" else None}
    deadline = start + args.budget_seconds
    stopped = None
    with torch.inference_mode():
        for k in range(args.draws):  # round robin over the policies: a cut-off run stays balanced
            if time.monotonic() > deadline:
                stopped = f"time budget reached after {k} draws per policy"
                break
            for p, (run, plan) in enumerate(zip(runs, plans)):
                rep, i = plan[k]
                kind, rows, n, chunk, pieces, exact = shape = shapes[(rep, i, run["policy"])]
                key = shape[:5]
                if key not in timed:
                    timed[key] = stepper.step(kind, rows, n, chunk, pieces)
                s = run["steps"][rep]
                draws[p].append({"replica": rep, "step": i, "kind": kind, "rows": rows, "context": n, "chunk": chunk,
                                 "pieces": pieces, "exact": exact, "modelled": float(s["compute_seconds"][i]),
                                 "measured": timed[key]["seconds"], "cuda_graph": timed[key]["cuda_graph"]})
            if (k + 1) % 20 == 0 or k + 1 == args.draws:
                results.update(report(runs, draws, args.seed), draws_per_policy=k + 1,
                               distinct_shapes=len(timed), seconds_total=round(time.monotonic() - start, 1))
                write_json(out, {**results, "samples": [[run["policy"], d] for run, d in zip(runs, draws)]})
                line = "; ".join(f"{e['policy']} {e['measured_vs_baseline']:.3f} "
                                 f"(modelled {e['modelled_vs_baseline']:.3f})" for e in results["policies"])
                print(f"{k + 1} draws each, {len(timed)} shapes, {time.monotonic() - start:.0f} s: {line}", flush=True)
    stepper.close()
    results.update(report(runs, draws, args.seed), stopped=stopped, draws_per_policy=len(draws[0]),
                   distinct_shapes=len(timed),
                   seconds_total=round(time.monotonic() - start, 1))
    write_json(out, {**results, "samples": [[run["policy"], d] for run, d in zip(runs, draws)]})
    for e in results["policies"]:
        ci = e.get("measured_vs_baseline_95")
        print(f"{e['policy']:>28}: modelled {e['modelled_seconds']:.3f} s ({e['modelled_vs_baseline']:.3f}), "
              f"measured {e['measured_seconds']:.3f} s ({e['measured_vs_baseline']:.3f}"
              + (f", 95% {ci[0]:.3f}-{ci[1]:.3f}" if ci else "") + f"), {e['draws']} draws", flush=True)
    print(f"wrote {out} ({results['seconds_total']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
