"""Length-predictor benchmarks: accuracy per dataset against the baselines and the noise ceiling,
k = 0 against k > 0, prediction latency per batch, training throughput.

    python benchmarks/bench_predictor.py --data-dir ../shared/data   # full run (about an hour on 2 cores)
    python benchmarks/bench_predictor.py --quick                     # smoke run on the bundled sample

A predictor is trained per policy model, as a user would. "castillo": the pretrained MiniLM encoder
(``--encoder minilm``) on CASTILLO, whose lengths are Qwen2.5-7B-Instruct completions in its own
tokens: the three ``train`` files plus a hashed half of every ``validate`` file; the other half of
each ``validate`` file is the test set; at k = 0 and at k = ``--k`` (the longest and shortest
samples, the only ones with text). "human": the same on GSM8K (train -> test) and the Dolly subset
(validate -> test), whose responses are human-written and counted in the encoder's tokenizer (no
policy tokenizer is available offline): a second, different "policy". Markdown tables go to
stdout, raw numbers to ``--out`` (default benchmarks/results/predictor.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from common import ROOT, machine, report, table

from predictor_training.evaluate import predictor_predictions, score_by_source
from predictor_training.predictor import BertLengthPredictor
from predictor_training.training import TrainOptions, load_splits, train

SAMPLE = ROOT / "predictor_training" / "data"
CASTILLO = ("Apps_validate", "BigCodeBench_train", "BigCodeBench_validate", "DS1000_train", "DS1000_validate",
            "DollyDataset_validate", "Mbpp_train", "Mbpp_validate", "ShareGPT_validate")


def _castillo(data: Path, split: str) -> list[str]:
    return [str(data / "castillo" / f"preproc_{n}_Qwen--Qwen2.5-7B-Instruct-1M.json") for n in CASTILLO
            if n.endswith(split)]


def sources(args: argparse.Namespace, which: str) -> tuple[str, str]:
    if args.quick:
        sample = str(SAMPLE / ("castillo_sample.json" if which == "castillo" else "gsm8k_sample.jsonl"))
        return sample, sample
    d = Path(args.data_dir)
    if which == "castillo":
        return ",".join(_castillo(d, "_train") + _castillo(d, "_validate")), ",".join(_castillo(d, "_validate"))
    return (f"gsm8k:{d / 'gsm8k_train.jsonl'},dolly:{d / 'dolly15k_subset_castillo_validate.json'}",
            f"gsm8k:{d / 'gsm8k_test.jsonl'},dolly:{d / 'dolly15k_subset_castillo_test.json'}")


def options(args: argparse.Namespace, k: int, which: str = "castillo") -> TrainOptions:
    data, eval_data = sources(args, which)
    common = dict(data=data, eval_data=eval_data, out=str(Path(args.work) / f"{which}-k{k}"), k=k, l_max=4096,
                  over_l_max="clip", seed=0, head=args.head)
    if args.quick:
        return pretrained(args, TrainOptions(**common, encoder="tiny", label_tokenizer="minilm", epochs=2,
                                             batch_size=16, learning_rate=1e-3, max_length=96, prefix_max_tokens=32),
                          k, which)
    opts = TrainOptions(**common, encoder="minilm", epochs=args.epochs if k == 0 else args.k_epochs,
                        batch_size=args.batch_size, learning_rate=args.learning_rate, max_length=args.max_length,
                        prefix_max_tokens=48, limit=args.limit if which == "human" else None, num_proc=2)
    return pretrained(args, opts, k, which)


def pretrained(args: argparse.Namespace, opts: TrainOptions, k: int, which: str) -> TrainOptions:
    """With ``--pretrain human`` the CASTILLO k = 0 models start from the GSM8K + Dolly predictor
    (``init_from``) instead of the bare encoder, in their own directories."""
    if args.pretrain != "human" or which != "castillo" or k != 0:
        return opts
    return dataclasses.replace(opts, init_from=options(args, 0, "human").out, out=f"{opts.out}-from-human")


def crossfit_options(args: argparse.Namespace, fold: int, seed: int) -> TrainOptions:
    """The k = 0 CASTILLO recipe on test half ``fold`` (0 or 1) of the validate prompts with training
    seed ``seed``; the split seed stays 0, so the models of one fold share their test prompts. Fold 0
    with seed 0 is the ``castillo`` section's model."""
    base = options(args, 0)
    if (fold, seed) == (0, 0):
        return base
    return dataclasses.replace(base, seed=seed, split_seed=0, test_fold=fold, out=f"{base.out}-f{fold}-s{seed}")


ACCURACY_HEADER = ["source", "method", "pairs", "MAE", "RMSE", "SMAPE %", "tau-b", "spearman", "within 10",
                   "within 1 bucket", "cover q0.9"]


def accuracy_rows(summary: dict) -> list[list]:
    rows = []
    ev = summary["evaluation"]
    for source in sorted(ev["model"], key=lambda s: (s == "all", s)):
        for method in ("model", "tfidf", "linear", "constant", "ceiling"):
            m = ev.get(method, {}).get(source)
            if m:
                rows.append([source, method, int(m["n"]), round(m["mae"], 1), round(m["rmse"], 1), round(m["smape"], 1),
                             m["kendall_tau_b"], m["spearman"], m["within_10"], m["within_1_bucket"],
                             m.get("coverage@0.9", float("nan"))])
    return rows


def k_comparison(args: argparse.Namespace, model0: BertLengthPredictor, summary_k: dict) -> tuple[str, list]:
    """The k = 0 model (prompt only, minus the k generated tokens) and the k > 0 model on the same rows."""
    opts = options(args, args.k)
    label = _label_tokenizer(opts)
    test = load_splits(opts, label)["test"].to_dict()
    model_k = BertLengthPredictor.from_pretrained(opts.out)
    rows = []
    for name, pred in (("k=0 model, prompt only", predictor_predictions(model0, test, prompt_only=True)),
                       (f"k={args.k} model", predictor_predictions(model_k, test))):
        res = score_by_source(pred, test["remaining"], test["source"], opts.l_max)
        for source, m in sorted(res.items(), key=lambda kv: (kv[0] == "all", kv[0])):
            rows.append([source, name, int(m["n"]), round(m["mae"], 1), m["kendall_tau_b"], m["spearman"],
                         m.get("coverage@0.9", float("nan"))])
    text = table(f"Remaining length after the first k={args.k} tokens (CASTILLO longest and shortest samples, "
                 f"the only ones with text; test half of the validate files)",
                 ["source", "predictor", "samples", "MAE", "tau-b", "spearman", "cover q0.9"], rows)
    return text, rows


def versus_tfidf(opts: TrainOptions, resamples: int) -> tuple[str, list]:
    """How much better than TF-IDF + ridge the predictor in ``opts.out`` ranks, per dataset: the
    tau-b difference with a 95% paired bootstrap interval over test prompts."""
    from predictor_training.evaluate import DEFAULT_LEVELS, TfidfBaseline, tau_difference

    label = _label_tokenizer(opts)
    splits = load_splits(opts, label)
    train_rows, test = splits["train"].to_dict(), splits["test"].to_dict()
    model = predictor_predictions(BertLengthPredictor.from_pretrained(opts.out), test).point
    tfidf = TfidfBaseline().fit(train_rows).predict(test, DEFAULT_LEVELS, opts.l_max).point
    res = tau_difference(model, tfidf, test["remaining"], test["source"], resamples=resamples)
    rows = [[source, round(r["diff"], 3), round(r["low"], 3), round(r["high"], 3), r["p_not_better"]]
            for source, r in sorted(res.items(), key=lambda kv: (kv[0] == "all", kv[0]))]
    return table(f"{Path(opts.out).name}: tau-b of the model minus TF-IDF + ridge, 95% paired bootstrap over test "
                 f"prompts ({resamples} resamples)", ["source", "difference", "low", "high", "P(not better)"],
                 rows), rows


def crossfit(args: argparse.Namespace, seeds: int, resamples: int) -> tuple[list[str], dict]:
    """Every CASTILLO validate prompt tested once: the recipe trained on each hashed half of the
    validate files (``test_fold`` 0 and 1) and tested on the other, ``seeds`` models per half (an
    ensemble: the geometric mean of their point predictions), against TF-IDF + ridge fitted on the same
    training split. The per-prompt predictions are kept in ``WORK/crossfit_predictions.json`` (``--reuse``
    reads them back), then scored and bootstrapped over all prompts of both halves."""
    from lengthsched.io import atomic_write_text
    from predictor_training.evaluate import (
        DEFAULT_LEVELS,
        Predictions,
        TfidfBaseline,
        noise_ceiling,
        score_by_source,
        tau_difference,
    )

    cached = Path(args.work) / "crossfit_predictions.json"
    if args.reuse and cached.is_file():
        rows = json.loads(cached.read_text())
    else:
        rows = {"id": [], "source": [], "fold": [], "remaining": [], "tfidf": [],
                **{f"seed{s}": [] for s in range(seeds)}}
        for fold in (0, 1):
            opts = crossfit_options(args, fold, 0)
            label = _label_tokenizer(opts)
            splits = load_splits(opts, label)
            test = splits["test"].to_dict()
            rows["tfidf"] += TfidfBaseline().fit(splits["train"].to_dict()).predict(
                test, DEFAULT_LEVELS, opts.l_max).point.tolist()
            for seed in range(seeds):
                model = BertLengthPredictor.from_pretrained(crossfit_options(args, fold, seed).out)
                rows[f"seed{seed}"] += predictor_predictions(model, test).point.tolist()
            for name in ("id", "source", "remaining"):
                rows[name] += list(test[name])
            rows["fold"] += [fold] * len(test["id"])
        atomic_write_text(cached, json.dumps(rows) + "\n")
    l_max = options(args, 0).l_max
    excluded = _seen_in_pretraining(args) if args.pretrain else set()
    keep = [i for i, pid in enumerate(rows["id"]) if pid not in excluded]
    rows = {name: [values[i] for i in keep] for name, values in rows.items()}
    truth, sources = rows["remaining"], rows["source"]
    ensemble = np.exp(np.mean([np.log(rows[f"seed{s}"]) for s in range(seeds)], axis=0))
    methods = {"model (seed 0)": np.asarray(rows["seed0"]), f"ensemble of {seeds}": ensemble,
               "tfidf": np.asarray(rows["tfidf"])}
    scores = {name: score_by_source(Predictions(pred, {}), truth, sources, l_max) for name, pred in methods.items()}
    scores["ceiling"] = noise_ceiling(truth, sources, l_max)
    ordered = sorted(scores["tfidf"], key=lambda src: (src == "all", src))
    score_rows = [[src, name, int(m[src]["n"]), round(m[src]["mae"], 1), m[src]["kendall_tau_b"], m[src]["spearman"]]
                  for src in ordered for name, m in scores.items() if src in m]
    diffs = {name: tau_difference(methods[name], methods["tfidf"], truth, sources, resamples=resamples)
             for name in ("model (seed 0)", f"ensemble of {seeds}")}
    diff_rows = [[src, name, round(d[src]["diff"], 3), round(d[src]["low"], 3), round(d[src]["high"], 3),
                  d[src]["p_not_better"]] for src in ordered for name, d in diffs.items()]
    folds_n = [sum(f == k for f in rows["fold"]) for k in (0, 1)]
    start = "pretrained on GSM8K + Dolly, " if args.pretrain else ""
    dropped = f"; {len(excluded)} prompts also in the pretraining data left out" if args.pretrain else ""
    texts = [table(f"Cross-fitted accuracy on every CASTILLO validate prompt (k = 0, {start}{args.max_length} input "
                   f"tokens; test halves of {folds_n[0]} and {folds_n[1]} prompts, each predicted by models trained on "
                   f"the other half{dropped}; ceiling = a sibling sample)",
                   ["source", "method", "pairs", "MAE", "tau-b", "spearman"], score_rows),
             table(f"Cross-fitted tau-b minus TF-IDF + ridge, 95% paired bootstrap over all validate prompts "
                   f"({resamples} resamples)", ["source", "predictor", "difference", "low", "high", "P(not better)"],
                   diff_rows)]
    return texts, {"scores": scores, "versus_tfidf": diff_rows, "prompts_per_fold": folds_n, "seeds": seeds,
                   "left_out_as_seen_in_pretraining": sorted(excluded)}


def _seen_in_pretraining(args: argparse.Namespace) -> set[str]:
    """Ids of the CASTILLO validate prompts that the pretraining data (GSM8K + Dolly, whole files) also
    holds: the same text, or the same first 60 characters (case and spacing ignored), which catches
    Dolly's near-duplicates. They are left out of the cross-fitted test so that no test prompt was seen,
    with any label, in training."""
    import re

    from predictor_training.data import LabelConfig, load_sources
    from predictor_training.training import split_specs

    def key(text: str) -> str:
        return re.sub(r"\s+", " ", text).strip().lower()[:60]

    human, castillo = options(args, 0, "human"), options(args, 0)
    labels = LabelConfig(tokenizer=None, k=0, l_max=castillo.l_max, over_l_max="clip")
    pool = load_sources(split_specs(human.data, dataclasses.replace(human, limit=None), "data"),
                        dataclasses.replace(labels, tokenizer=_label_tokenizer(human)))
    seen = {key(p) for p in pool["prompt"]}
    tested = load_sources(split_specs(castillo.eval_data, castillo, "eval_data"), labels)
    return {pid for pid, p in zip(tested["id"], tested["prompt"]) if key(p) in seen}


def _label_tokenizer(opts: TrainOptions):
    """The tokenizer that counts a recipe's labels and cuts its prefixes."""
    from predictor_training.encoders import load_tokenizer

    return load_tokenizer(opts.label_tokenizer or opts.encoder, "label_tokenizer")


def _train_job(opts: TrainOptions, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    return train(opts, progress=False)


def train_all(args: argparse.Namespace, jobs: list[TrainOptions]) -> dict[str, dict]:
    """Train the independent predictors (``--jobs`` at a time, each in its own process), or read their
    summaries with ``--reuse``; returns summaries by output directory."""
    done, todo = {}, []
    for opts in {o.out: o for o in jobs}.values():
        summary = Path(opts.out) / "training_summary.json"
        if args.reuse and summary.is_file():
            done[opts.out] = json.loads(summary.read_text())
        else:
            todo.append(opts)
    if args.jobs > 1 and len(todo) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        threads = max(1, (os.cpu_count() or 1) // args.jobs)
        with ProcessPoolExecutor(min(args.jobs, len(todo)), mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {o.out: pool.submit(_train_job, o, threads) for o in todo}
            for out, f in futures.items():
                done[out] = f.result()
                print(f"trained {out} in {done[out]['wall_seconds']:.0f} s", file=sys.stderr)
    else:
        for o in todo:
            done[o.out] = train(o, progress=False)
            print(f"trained {o.out} in {done[o.out]['wall_seconds']:.0f} s", file=sys.stderr)
    return done


def latency(predictor: BertLengthPredictor, prompts: list[str], device: str) -> list[list]:
    out = []
    for batch in (32, 256):
        chunk = (prompts * (batch // max(1, len(prompts)) + 1))[:batch]
        predictor.batch_size = batch
        predictor.predict(chunk[:8])  # warm up
        times = []
        for _ in range(5):
            start = time.perf_counter()
            predictor.predict(chunk, quantiles=[0.9])
            times.append(time.perf_counter() - start)
        med = statistics.median(times)
        out.append([device, batch, round(1000 * med, 1), round(batch / med, 1)])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny encoder on the bundled sample")
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--work", default="/tmp/lengthsched-bench-predictor" + ("-quick" if "--quick" in sys.argv else ""),
                    help="where the predictors are trained")
    ap.add_argument("--epochs", type=float, default=3.0, help="epochs of the k = 0 models")
    ap.add_argument("--k-epochs", type=float, default=1.0, help="epochs of the k > 0 model")
    ap.add_argument("--max-length", type=int, default=160, help="encoder input tokens")
    ap.add_argument("--learning-rate", type=float, default=8e-5)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--limit", type=int, default=1500, help="rows per GSM8K / Dolly file")
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--head", default="regression")
    ap.add_argument("--sections", default="castillo,longer,k,human,latency",
                    help="castillo (k = 0), crossfit (k = 0 on both halves of the validate prompts, --seeds models "
                         "each), longer (the k = 0 model continued with longer inputs), k (k > 0 and the "
                         "comparison), human (GSM8K + Dolly), latency")
    ap.add_argument("--pretrain", choices=["human"], default=None,
                    help="start the CASTILLO k = 0 models from the GSM8K + Dolly predictor (trained first) instead "
                         "of the bare encoder")
    ap.add_argument("--seeds", type=int, default=3, help="crossfit: models per half (the ensemble)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="predictors trained at once, each in its own process (a GPU has room for several)")
    ap.add_argument("--resamples", type=int, default=None, help="bootstrap resamples (default 1000; --quick 100)")
    ap.add_argument("--longer", default=None,
                    help="stages of the 'longer' section, TOKENS:LR,...: each continues the previous model "
                         "(--init-from) for one epoch with that many input tokens (default 320:3e-5,512:2e-5; "
                         "--quick: 96:1e-3)")
    ap.add_argument("--reuse", action="store_true",
                    help="use predictors already trained in --work (their training_summary.json) instead of training")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / ("predictor-quick.json" if "--quick"
                                                                              in sys.argv else "predictor.json")))
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    texts, results = [], {"machine": machine(), "command": " ".join(["python", *sys.argv])}

    wanted = set(args.sections.split(","))
    resamples = args.resamples or (100 if args.quick else 1000)
    unknown = wanted - {"castillo", "crossfit", "longer", "k", "human", "latency"}
    if unknown:
        ap.error(f"--sections: unknown {sorted(unknown)}")
    # the predictors that depend on no other one, trained first (--jobs at a time)
    independent = ([options(args, 0)] if wanted & {"castillo", "crossfit", "longer", "k", "latency"} else []) + \
        ([crossfit_options(args, f, s) for f in (0, 1) for s in range(args.seeds)] if "crossfit" in wanted else []) + \
        ([options(args, args.k)] if "k" in wanted else []) + \
        ([options(args, 0, "human")] if "human" in wanted and not args.quick else [])
    first = [options(args, 0, "human")] if args.pretrain == "human" else []
    summaries = train_all(args, first)  # what the others start from
    summaries.update(train_all(args, [o for o in independent if o not in first]))
    if "castillo" in wanted:
        s0 = summaries[options(args, 0).out]
        results["k0"] = s0
        texts.append(table("Accuracy on held-out CASTILLO prompts, k = 0 (Qwen2.5-7B-Instruct tokens; pairs = every "
                           "sample of every test prompt; ceiling = a sibling sample of the same prompt)",
                           ACCURACY_HEADER, accuracy_rows(s0)))
        text, results["k0_vs_tfidf"] = versus_tfidf(options(args, 0), resamples)
        texts.append(text)
    if "crossfit" in wanted:
        cf_texts, results["crossfit"] = crossfit(args, args.seeds, resamples)
        texts += cf_texts
    if "longer" in wanted:
        previous = options(args, 0)
        stages = args.longer or ("96:1e-3" if args.quick else "320:3e-5,512:2e-5")
        results["longer"] = []
        for stage in stages.split(","):
            tokens, lr = stage.split(":")
            opts = dataclasses.replace(previous, init_from=previous.out, max_length=int(tokens), epochs=1.0,
                                       learning_rate=float(lr), out=f"{options(args, 0).out}-{tokens}")
            summary = train_all(args, [opts])[opts.out]
            results["longer"].append(summary)
            texts.append(table(f"Accuracy on held-out CASTILLO prompts, k = 0, continued for one epoch with "
                               f"{tokens} input tokens (learning rate {lr}) from {Path(previous.out).name}",
                               ACCURACY_HEADER, accuracy_rows(summary)))
            text, rows = versus_tfidf(opts, resamples)
            results.setdefault("longer_vs_tfidf", []).append(rows)
            texts.append(text)
            previous = opts
    if "k" in wanted:
        sk = summaries[options(args, args.k).out]
        results["k"] = sk
        model0 = BertLengthPredictor.from_pretrained(options(args, 0).out)
        text, rows = k_comparison(args, model0, sk)
        results["k_comparison"] = rows
        texts.append(text)
    if "human" in wanted and not args.quick:
        sh = summaries[options(args, 0, "human").out]
        results["human"] = sh
        texts.append(table("Accuracy on GSM8K and Dolly test prompts, k = 0 (human-written answers counted in the "
                           "encoder's tokenizer; one sample per prompt, so no ceiling)",
                           ACCURACY_HEADER, accuracy_rows(sh)))
    shown = [results.get("k0"), *results.get("longer", []), results.get("k"), results.get("human")]
    shown += [summaries[out] for out in dict.fromkeys(o.out for o in first + independent)
              if summaries[out] not in shown]
    train_rows = [[f"{Path(s['options']['out']).name}", s["options"]["encoder"], s["device"], s["train_rows"],
                   s["steps"], round(s["train_seconds"], 1), round(s["train_samples_per_second"], 2)]
                  for s in shown if s]
    results["trainings"] = train_rows
    texts.append(table("Training throughput" + (f" ({args.jobs} trainings at once)" if args.jobs > 1 else ""),
                       ["model", "encoder", "device", "rows", "steps", "seconds", "rows / s"], train_rows))

    import torch

    if "latency" in wanted:
        prompts = _test_prompts(options(args, 0))
        lat = []
        devices = [("cpu", None)] + ([("cuda", None), ("cuda", torch.bfloat16)] if torch.cuda.is_available() else [])
        for device, dtype in devices:
            predictor = BertLengthPredictor.from_pretrained(options(args, 0).out, device=device, dtype=dtype)
            name = device if device == "cpu" else f"cuda: {torch.cuda.get_device_name()}"
            lat += latency(predictor, prompts, name + (" bfloat16" if dtype is not None else ""))
        results["latency"] = lat
        texts.append(table(f"Prediction latency (median of 5, k = 0 model, {options(args, 0).max_length} input "
                           f"tokens, test prompts, quantile 0.9 included)",
                           ["device", "batch", "ms / batch", "prompts / s"], lat))
    report(results, texts, args.out, f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    return 0


def _test_prompts(opts: TrainOptions) -> list[str]:
    label = _label_tokenizer(opts)
    return list(load_splits(opts, label)["test"]["prompt"])[:256]


if __name__ == "__main__":
    sys.exit(main())
