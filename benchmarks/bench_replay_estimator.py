"""How precisely ``gpu_replay.py`` estimates measured makespans from a sample of steps: a CPU check of
its sampler, no GPU involved.

The replay draws a few hundred of a rollout's tens of thousands of steps per policy, times them on a
GPU and scales each replica's modelled seconds by the mean measured / modelled ratio of its draws.
Here the "measured" seconds of every step are known, made up from a ratio that varies with the step as
the H100's did (``ratio``: 2.36x for decode steps below 32 rows, 1.9x up to 64, 1.56x above, 15% more
for steps that prefill), so each estimate can be compared with the truth. Two samplers, each over
``--trials`` seeds: ``iid``, the replay's sampler until 2026-11-27 (draws over all of a policy's steps
with probability proportional to their modelled seconds; bootstrap over all draws), and
``stratified``, today's (:func:`gpu_replay.draw_plan`: equal draws per replica, common random numbers
across policies; bootstrap within replicas, common too). Reported per policy: the mean and standard
deviation of the estimated ratio to the baseline, its root mean square error against the true ratio,
the mean width of the 95% bootstrap interval and how often it covers the truth.

    python benchmarks/bench_replay_estimator.py --factors 16 4 --out benchmarks/results/replay_estimator.json
"""

from __future__ import annotations

import argparse
import time
import types

import gpu_replay
import numpy as np
from common import ROOT, machine, write_json

from lengthsched.cost import StepCost


def ratio(steps: dict) -> np.ndarray:
    """A measured / modelled ratio per step, shaped like the H100 replays' (by decode rows; prefill)."""
    rows = steps["rows"]
    base = np.where(rows < 32, 2.36, np.where(rows < 64, 1.9, 1.56))
    return base * np.where(steps["prefill_tokens"] > 0, 1.15, 1.0)


def iid_plan(run: dict, draws: int, rng) -> list[tuple[int, int]]:
    """The sampler gpu_replay used until 2026-11-27: draws over all steps, proportional to seconds."""
    secs = np.concatenate([s["compute_seconds"] for s in run["steps"]])
    owner = np.concatenate([np.full(len(s["seconds"]), i) for i, s in enumerate(run["steps"])])
    local = np.concatenate([np.arange(len(s["seconds"])) for s in run["steps"]])
    pick = rng.choice(len(secs), size=draws, p=secs / secs.sum())
    return [(int(owner[i]), int(local[i])) for i in pick]


def measure(run: dict, plan: list[tuple[int, int]]) -> list[dict]:
    """The draws of ``plan`` as the replay records them, "measured" from each step's ``ratio`` (set by
    :func:`compare`)."""
    out = []
    for r, i in plan:
        s = run["steps"][r]
        m = float(s["compute_seconds"][i])
        out.append({"replica": r, "modelled": m, "measured": m * float(s["ratio"][i]), "exact": True})
    return out


def compare(factor: int, prompts: int, replicas: int, draws: int, trials: int, resamples: int) -> dict:
    args = types.SimpleNamespace(workload="castillo", prompts=prompts, replicas=replicas, factor=factor, seed=11,
                                 predictions="realistic", policies="vllm:least_loaded,steal,steal_longest")
    runs = gpu_replay.simulate(args, StepCost.from_model("qwen3-1.7b", "h100"))
    for run in runs:  # ratio() once per step, not per draw
        for s in run["steps"]:
            s["ratio"] = ratio(s)
    truth = [max(float((s["compute_seconds"] * s["ratio"]).sum()) for s in run["steps"]) for run in runs]
    rows = []
    for sampler in ("iid", "stratified"):
        est, width, cover = [[] for _ in runs], [[] for _ in runs], [0] * len(runs)
        for seed in range(trials):
            rng = np.random.default_rng(seed)
            if sampler == "iid":
                draws_ = [measure(run, iid_plan(run, draws, rng)) for run in runs]
                idx = rng.integers(draws, size=(resamples, draws))
                base = gpu_replay.estimate(runs[0], draws_[0], idx).max(axis=1)
                boots = [gpu_replay.estimate(run, d, rng.integers(draws, size=(resamples, draws))).max(axis=1) / base
                         for run, d in zip(runs, draws_)]
                intervals = [np.quantile(b, [0.025, 0.975]) for b in boots]
            else:
                draws_ = [measure(run, gpu_replay.draw_plan(run, draws, seed)) for run in runs]
                rep = gpu_replay.report(runs, draws_, seed, resamples=resamples)["policies"]
                intervals = [e.get("measured_vs_baseline_95", [1.0, 1.0]) for e in rep]
            base_est = gpu_replay.estimate(runs[0], draws_[0]).max()
            for p, (run, d) in enumerate(zip(runs, draws_)):
                if p == 0:
                    continue
                true = truth[p] / truth[0]
                est[p].append(gpu_replay.estimate(run, d).max() / base_est)
                lo, hi = intervals[p]
                width[p].append(hi - lo)
                cover[p] += int(lo <= true <= hi)
        for p in range(1, len(runs)):
            e = np.array(est[p])
            true = truth[p] / truth[0]
            rows.append({"sampler": sampler, "policy": runs[p]["policy"], "true_ratio": true,
                         "modelled_ratio": runs[p]["seconds"] / runs[0]["seconds"], "mean": float(e.mean()),
                         "sd": float(e.std()), "rmse": float(np.sqrt(np.mean((e - true) ** 2))),
                         "interval_width": float(np.mean(width[p])), "coverage": cover[p] / trials})
    return {"setting": f"CASTILLO {prompts} x 16 on {replicas} replicas, pool {factor} x L_max, seed 11",
            "draws": draws, "trials": trials, "resamples": resamples, "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--factors", type=int, nargs="+", default=[16, 4], help="pools, in L_max per replica")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--draws", type=int, default=400, help="steps drawn per policy (the replay's default)")
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--resamples", type=int, default=300)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "replay_estimator.json"))
    args = ap.parse_args(argv)
    start = time.monotonic()
    settings = [compare(f, args.prompts, args.replicas, args.draws, args.trials, args.resamples) for f in args.factors]
    for s in settings:
        print(f"\n{s['setting']}: {s['draws']} draws per policy, {s['trials']} trials")
        print("| sampler | policy | true ratio | mean | sd | rmse | 95% interval width | coverage |")
        print("|---|---|---|---|---|---|---|---|")
        for r in s["rows"]:
            print(f"| {r['sampler']} | {r['policy']} | {r['true_ratio']:.4f} | {r['mean']:.4f} | {r['sd']:.4f} | "
                  f"{r['rmse']:.4f} | {r['interval_width']:.4f} | {r['coverage']:.2f} |")
    write_json(args.out, {"machine": machine(), "command": "bench_replay_estimator.py " + " ".join(
        argv if argv is not None else __import__("sys").argv[1:]), "seconds": round(time.monotonic() - start, 1),
        "settings": settings})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
