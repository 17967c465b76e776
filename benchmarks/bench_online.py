"""Online length prediction (lengthsched.online) on real sibling groups: siblings, history, drift.

Run from the repository root:

    python benchmarks/bench_online.py            # every CASTILLO validate prompt (about 3.5 minutes on 2 cores)
    python benchmarks/bench_online.py --quick    # 20 prompts per dataset, fewer resamples and steps (seconds)
    python benchmarks/bench_online.py --sections speed --out benchmarks/results/online_speed.json   # timing

Results: benchmarks/results/online.json (``--out``); the tables go to docs/online.md.

Data: the bundled CASTILLO file (lengthsched/data/castillo_qwen2.5-7b_lengths.jsonl), its
``validate`` prompts (the test-like split; 1,422 prompts x 10 completion lengths of
Qwen2.5-7B-Instruct). Section ``siblings``: :func:`predictor_training.online_eval.evaluate_online`,
cross-fitted on hashed halves of the prompts, with three priors: ``none`` (the running mean of all
lengths observed), ``regression`` (log length on log prompt tokens, fitted on the other half) and
``bert`` (the trained MiniLM predictor's cross-fitted predictions kept in
benchmarks/results/crossfit_h200_pretrain.json: the geometric mean of seeds 0 and 1 per prompt,
each made by models that never saw the prompt; the 6 prompts that run saw in pretraining and the
prompts it lacks, the 10 with a sample at CASTILLO's 15,000-token cap, are left out of that prior's
rows; ``none`` runs again on the same 1,406 prompts to compare MAE). The model: the per-prompt spread
law and the prior's mixture law fitted on the other half (``fit_spreads(..., laws=True)``), the
forgetting rate fitted on the other half's history (``fit_forgetting``), and the history rows once
more at the predictor's default forgetting 0.5. Section ``drift``:
:func:`predictor_training.online_eval.drift_experiment`, 20 simulated RL steps with +3% mean length
per step, every prompt alike and with per-prompt growth spread 0.02 (growth_i = 0.03 + 0.02 z).
Section ``speed`` (timing, so not in the default sections): what one poll of a rollout step costs, the
predictor fitted on every validate prompt answering for the running completions of 256 prompts x 16
(``--quick``: 64) with some siblings finished and the others part-way, median of ``--repeats`` calls; and
its residual-law lookup (``log_sf``, most of a call's time) against np.interp on the same table (the
lookup before it read the evenly spaced table by index), both measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from common import ROOT, machine, median_ms, report, run_sections, table

from lengthsched import OnlineLengthPredictor
from lengthsched.io import DATA_DIR
from lengthsched.online import _TABLE_Z
from predictor_training.online_eval import (
    check_targets,
    drift_experiment,
    evaluate_online,
    limit_groups,
    load_groups,
    load_prior,
)

CASTILLO = DATA_DIR / "castillo_qwen2.5-7b_lengths.jsonl"
BERT = ROOT / "benchmarks" / "results" / "crossfit_h200_pretrain.json"
BERT_RUN = ROOT / "benchmarks" / "results" / "predictor_h200_pretrain.json"  # lists the prompts seen in pretraining
SIBLINGS = (0, 1, 2, 4, 5, -1)
QUICK_PROMPTS = 20  # --quick: a check that every path runs (its numbers mean little)


def _groups(args) -> dict:
    groups = load_groups(CASTILLO, splits=["validate"])
    return limit_groups(groups, QUICK_PROMPTS) if args.quick else groups


def _bert_prior(groups: dict) -> tuple[dict, dict] | None:
    if not BERT.is_file():
        return None
    prior = load_prior(BERT)
    seen = set()
    if BERT_RUN.is_file():
        seen = set(json.loads(BERT_RUN.read_text())["crossfit"].get("left_out_as_seen_in_pretraining", []))
    kept = {p: g for p, g in groups.items() if p in prior and p not in seen}
    return prior, kept


def _row_cells(r: dict, ceiling: dict | None) -> list:
    ci = "-" if r["tau_b_ci"] is None else f"{r['tau_b_ci'][0]:.3f}..{r['tau_b_ci'][1]:.3f}"
    return [r["order"], r["siblings"], "yes" if r["history"] else "no", r["tau_b"], ci, r["mae"],
            r["coverage"], "-" if ceiling is None else ceiling["tau_b"], "-" if ceiling is None else ceiling["mae"],
            "-" if ceiling is None else ceiling["statistic"], r["pairs"]]


def _main_table(ev: dict, title: str) -> str:
    rows, ceilings = [], {}
    for r in ev["rows"]:
        if r["method"] == "ceiling":
            ceilings[(r["order"], r["siblings"], r["history"])] = r
    for r in ev["rows"]:
        if r["method"] != "ceiling":
            rows.append(_row_cells(r, ceilings.get((r["order"], r["siblings"], r["history"]))))
    return table(title, ["order", "siblings", "history", "tau-b", "tau-b 95%", "MAE", "cov q0.9", "ceiling tau-b",
                         "ceiling MAE", "ceiling statistic", "pairs"], rows)


def section_siblings(args) -> tuple[str, dict]:
    groups = _groups(args)
    boot = 20 if args.quick else args.bootstrap
    evaluations = {}
    for prior in ("none", "regression"):
        evaluations[prior] = evaluate_online(groups, siblings=SIBLINGS, prior=prior, bootstrap=boot, seed=args.seed)
    bert = _bert_prior(groups)
    if bert is not None:
        evaluations["bert"] = evaluate_online(bert[1], siblings=SIBLINGS, prior=bert[0], bootstrap=boot,
                                              seed=args.seed, prior_name="bert")
        # the same prompts as bert's rows (the predictor's data leaves out prompts with a sample at
        # CASTILLO's 15,000-token cap): MAE compares like with like
        evaluations["none, bert's prompts"] = evaluate_online(bert[1], siblings=SIBLINGS, prior="none", bootstrap=0,
                                                              seed=args.seed, prior_name="none, bert's prompts")
    # the history rows at the predictor's default forgetting (0.5) instead of the rate fitted on the fit half
    evaluations["none, forgetting 0.5"] = evaluate_online(groups, siblings=SIBLINGS, history=(True,), bootstrap=0,
                                                          seed=args.seed, options={"forgetting": 0.5},
                                                          prior_name="none, forgetting 0.5")
    n = len(groups)
    texts = [_main_table(evaluations["none"], f"Online predictor, prior none: {n} CASTILLO validate prompts x 10 "
                                              "samples, cross-fitted")]
    compare = []
    for name, ev in evaluations.items():
        for r in ev["rows"]:
            if r["method"] != "ceiling" and ((r["order"] in ("-", "finish") and r["siblings"] in ("0", "1", "5")
                                              and not r["history"]) or (r["siblings"] == "0" and r["history"])):
                compare.append([name, ev["protocol"]["prompts"], r["order"], r["siblings"],
                                "yes" if r["history"] else "no", r["tau_b"], r["mae"], r["coverage"]])
    texts.append(table("The three priors (finish order; k = 0 without history is the prior alone)",
                       ["prior", "prompts", "order", "siblings", "history", "tau-b", "MAE", "cov q0.9"], compare))
    fitted = [[name, ", ".join(f"{f['forgetting']:g}" for f in ev["fitted"]),
               ", ".join(f"{f['within_sigma']:.3f}" for f in ev["fitted"]),
               ", ".join(str(len(f.get("prior_offsets", [0]))) for f in ev["fitted"])]
              for name, ev in evaluations.items()]
    texts.append(table("Fitted on each half (forgetting: fitted on the fit half's history unless set)",
                       ["evaluation", "forgetting", "pooled within sigma", "prior components"], fitted))
    history = [[name, r["order"], r["siblings"], r["tau_b"], r["mae"], r["coverage"]]
               for name in ("none", "none, forgetting 0.5") for r in evaluations[name]["rows"]
               if r["method"] == "online" and r["history"]]
    texts.append(table("History: the fitted forgetting against the default 0.5 (prior none)",
                       ["evaluation", "order", "siblings", "tau-b", "MAE", "cov q0.9"], history))
    targets = [t for name, ev in evaluations.items() if name not in ("none, bert's prompts", "none, forgetting 0.5")
               for t in check_targets(ev)]
    texts.append(table("Targets (siblings)", ["target", "prior", "value", "met"],
                       [[t["target"], t["prior"], t["value"] if not isinstance(t["value"], list)
                         else f"{t['value'][0]:.3f}..{t['value'][1]:.3f}", "met" if t["met"] else "NOT met"]
                        for t in targets]))
    return "\n".join(texts), {"evaluations": evaluations, "targets": targets}


def _drift_tables(d: dict, label: str) -> str:
    summary = [[c["name"], c["mean_relative_mae_after_burn_in"], c["mean_no_drift_relative_mae_after_burn_in"],
                c["mean_ratio_after_burn_in"], c["max_ratio_after_burn_in"], c["vs_best_no_drift"],
                c["per_step"][-1]["mae"], c["per_step"][-1]["drift_per_step"]] for c in d["configs"]]
    text = table(f"Drift ({label}): relative MAE = MAE / mean length, steps >= {d['protocol']['burn_in']}",
                 ["configuration", "rel. MAE", "rel. MAE no drift", "mean ratio", "max ratio", "vs best no-drift",
                  "MAE last step", "drift / step (log)"], summary)
    return text


def section_drift(args) -> tuple[str, dict]:
    groups = _groups(args)
    steps = 4 if args.quick else args.steps
    runs = {}
    for name, spread in (("uniform", 0.0), ("per-prompt", 0.02)):
        runs[name] = drift_experiment(groups, steps=steps, growth=args.growth, growth_spread=spread, seed=args.seed,
                                      burn_in=min(3, steps - 1))
    texts = [_drift_tables(runs["uniform"], f"+{args.growth:g} per step, every prompt alike"),
             _drift_tables(runs["per-prompt"], f"+{args.growth:g} + 0.02 z per step and prompt")]
    pick = {c["name"]: c for c in runs["per-prompt"]["configs"]}
    best, frozen = pick.get("forgetting 0.5, drift"), pick["frozen after step 0"]
    if best is not None:
        texts.append(table("MAE per step (per-prompt growth): forgetting 0.5 with drift, and frozen after step 0",
                           ["step", "mean length", "MAE", "MAE no drift", "ratio", "frozen MAE", "frozen ratio"],
                           [[a["step"], a["mean_length"], a["mae"], a["no_drift_mae"], a["ratio"], f["mae"],
                             f["ratio"]] for a, f in zip(best["per_step"], frozen["per_step"])]))
    targets = [t | {"run": name} for name, d in runs.items() for t in check_targets(drift=d)]
    texts.append(table("Targets (drift)", ["run", "target", "value", "met"],
                       [[t["run"], t["target"], t["value"], "met" if t["met"] else "NOT met"] for t in targets]))
    return "\n".join(texts), {"runs": runs, "targets": targets}


SPEED_PROMPTS, SPEED_SIBLINGS = 256, 16  # a rollout step's poll: prompts x completions each


def _median_ms(call, repeats: int) -> float:
    return round(median_ms(call, repeats), 3)


def _interp_log_sf(table: np.ndarray):
    """The residual law's lookup by np.interp (a binary search per value) over the same table."""
    top = _TABLE_Z[-1]

    def log_sf(z):
        z = np.asarray(z, dtype=np.float64)
        inside = np.interp(z, _TABLE_Z, table, left=0.0, right=table[-1])
        return np.where(z > top, table[-1] - 0.5 * (np.minimum(z, 1e150) ** 2 - top * top), inside)
    return log_sf


def section_speed(args) -> tuple[str, dict]:
    groups = {k: g.lengths.tolist() for k, g in load_groups(CASTILLO, splits=["validate"]).items()}
    predictor = OnlineLengthPredictor.fit(groups)
    rng = np.random.default_rng(args.seed)
    keys = list(groups)
    n = 64 if args.quick else SPEED_PROMPTS
    prompts, prefixes, completions = [], [], []
    for i in rng.choice(len(keys), n, replace=False):
        lengths = groups[keys[i]]
        finished = int(rng.integers(0, 9))  # siblings heard finish; the others are running
        for j in range(finished):
            predictor.observe(keys[i], lengths[j % len(lengths)])
        for j in range(finished, SPEED_SIBLINGS):
            total = lengths[j % len(lengths)]
            prompts.append(keys[i])
            prefixes.append(int(rng.integers(0, total)))
            completions.append((keys[i], j))

    def poll():
        return predictor.predict(prompts, prefixes, quantiles=(0.9,), completions=completions)

    repeats = 3 if args.quick else args.repeats
    residuals = predictor.residuals
    z = rng.normal(0.0, 3.0, (60, 64, 16))  # one block of the predictive's grid (queries x points x components)
    reference = _interp_log_sf(residuals._log_sf)
    difference = float(np.max(np.abs(residuals.log_sf(z) - reference(z))))
    lookup = {"table": _median_ms(lambda: residuals.log_sf(z), 10 * repeats),
              "np.interp": _median_ms(lambda: reference(z), 10 * repeats)}
    table_answer = poll()
    table_ms = _median_ms(poll, repeats)
    residuals.log_sf = reference  # the same predictor answering with the np.interp lookup
    try:
        interp_answer = poll()
        interp_ms = _median_ms(poll, repeats)
    finally:
        del residuals.log_sf
    agree = max(float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))))
                for a, b in ((table_answer.lengths, interp_answer.lengths),
                             (table_answer.quantile(0.9), interp_answer.quantile(0.9))))
    rows = [["log_sf, one block of 61,440 values", lookup["np.interp"], lookup["table"],
             round(lookup["np.interp"] / lookup["table"], 2), f"{difference:.1e} (log)"],
            [f"predict, {len(prompts)} running completions of {n} prompts x {SPEED_SIBLINGS}, q0.9", interp_ms,
             table_ms, round(interp_ms / table_ms, 2), f"{agree:g} tokens"]]
    text = table(f"Online predictor speed (median of {repeats} calls, 10x that for log_sf; ms)",
                 ["call", "np.interp lookup", "table by index", "ratio", "largest difference"], rows)
    return text, {"prompts": n, "siblings": SPEED_SIBLINGS, "queries": len(prompts), "repeats": repeats,
                  "log_sf_ms": lookup, "log_sf_max_difference": difference,
                  "predict_ms": {"np.interp": interp_ms, "table": table_ms},
                  "predict_max_difference_tokens": agree}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_PROMPTS} prompts per dataset, 20 resamples, 4 drift steps")
    parser.add_argument("--sections", default="siblings,drift",
                        help="comma-separated sections: siblings, drift, speed (timing: not in the default)")
    parser.add_argument("--repeats", type=int, default=7, help="speed: timed calls per measurement (median)")
    parser.add_argument("--bootstrap", type=int, default=1000, help="resamples of prompts for tau-b's interval")
    parser.add_argument("--steps", type=int, default=20, help="drift: simulated RL steps")
    parser.add_argument("--growth", type=float, default=0.03, help="drift: growth of the mean length per step")
    parser.add_argument("--seed", type=int, default=0, help="seed of the halves, reveal order, history and draws")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "online.json"), help="results JSON")
    args = parser.parse_args(argv)
    texts, results = run_sections(parser, args, {"siblings": section_siblings, "drift": section_drift,
                                                 "speed": section_speed})
    results = {"machine": machine(), "command": " ".join([Path(sys.argv[0]).name] + (argv or sys.argv[1:])),
               **results}
    report(results, texts, args.out, "speed is timing on this machine; the other sections are data" if "speed" in
           results else "data, not timing: the numbers do not depend on this machine")
    return 0


if __name__ == "__main__":
    sys.exit(main())
