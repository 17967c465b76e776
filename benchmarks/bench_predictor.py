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
        return TrainOptions(**common, encoder="tiny", label_tokenizer="minilm", epochs=2, batch_size=16,
                            learning_rate=1e-3, max_length=96, prefix_max_tokens=32)
    return TrainOptions(**common, encoder="minilm", epochs=args.epochs if k == 0 else 1, batch_size=16,
                        learning_rate=8e-5, max_length=args.max_length, prefix_max_tokens=48,
                        limit=args.limit if which == "human" else None, num_proc=2)


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
    from predictor_training.encoders import load_tokenizer

    label = load_tokenizer(opts.label_tokenizer or opts.encoder, "label_tokenizer")
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
    from predictor_training.encoders import load_tokenizer
    from predictor_training.evaluate import DEFAULT_LEVELS, TfidfBaseline, tau_difference

    label = load_tokenizer(opts.label_tokenizer or opts.encoder, "label_tokenizer")
    splits = load_splits(opts, label)
    train_rows, test = splits["train"].to_dict(), splits["test"].to_dict()
    model = predictor_predictions(BertLengthPredictor.from_pretrained(opts.out, device="cpu"), test).point
    tfidf = TfidfBaseline().fit(train_rows).predict(test, DEFAULT_LEVELS, opts.l_max).point
    res = tau_difference(model, tfidf, test["remaining"], test["source"], resamples=resamples)
    rows = [[source, round(r["diff"], 3), round(r["low"], 3), round(r["high"], 3), r["p_not_better"]]
            for source, r in sorted(res.items(), key=lambda kv: (kv[0] == "all", kv[0]))]
    return table(f"{Path(opts.out).name}: tau-b of the model minus TF-IDF + ridge, 95% paired bootstrap over test "
                 f"prompts ({resamples} resamples)", ["source", "difference", "low", "high", "P(not better)"],
                 rows), rows


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
    ap.add_argument("--epochs", type=float, default=3.0)
    ap.add_argument("--max-length", type=int, default=160)
    ap.add_argument("--limit", type=int, default=1500, help="rows per GSM8K / Dolly file")
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--head", default="regression")
    ap.add_argument("--sections", default="castillo,longer,k,human,latency",
                    help="castillo (k = 0), longer (the k = 0 model continued with longer inputs), k (k > 0 and "
                         "the comparison), human (GSM8K + Dolly), latency")
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

    def trained(opts: TrainOptions) -> dict:
        summary = Path(opts.out) / "training_summary.json"
        if args.reuse and summary.is_file():
            return json.loads(summary.read_text())
        return train(opts, progress=False)

    wanted = set(args.sections.split(","))
    resamples = 100 if args.quick else 1000
    unknown = wanted - {"castillo", "longer", "k", "human", "latency"}
    if unknown:
        ap.error(f"--sections: unknown {sorted(unknown)}")
    if "castillo" in wanted:
        s0 = trained(options(args, 0))
        results["k0"] = s0
        texts.append(table("Accuracy on held-out CASTILLO prompts, k = 0 (Qwen2.5-7B-Instruct tokens; pairs = every "
                           "sample of every test prompt; ceiling = a sibling sample of the same prompt)",
                           ACCURACY_HEADER, accuracy_rows(s0)))
        text, results["k0_vs_tfidf"] = versus_tfidf(options(args, 0), resamples)
        texts.append(text)
    if "longer" in wanted:
        previous = options(args, 0)
        stages = args.longer or ("96:1e-3" if args.quick else "320:3e-5,512:2e-5")
        results["longer"] = []
        for stage in stages.split(","):
            tokens, lr = stage.split(":")
            opts = dataclasses.replace(previous, init_from=previous.out, max_length=int(tokens), epochs=1.0,
                                       learning_rate=float(lr), out=f"{options(args, 0).out}-{tokens}")
            summary = trained(opts)
            results["longer"].append(summary)
            texts.append(table(f"Accuracy on held-out CASTILLO prompts, k = 0, continued for one epoch with "
                               f"{tokens} input tokens (learning rate {lr}) from {Path(previous.out).name}",
                               ACCURACY_HEADER, accuracy_rows(summary)))
            text, rows = versus_tfidf(opts, resamples)
            results.setdefault("longer_vs_tfidf", []).append(rows)
            texts.append(text)
            previous = opts
    if "k" in wanted:
        sk = trained(options(args, args.k))
        results["k"] = sk
        model0 = BertLengthPredictor.from_pretrained(options(args, 0).out, device="cpu")
        text, rows = k_comparison(args, model0, sk)
        results["k_comparison"] = rows
        texts.append(text)
    if "human" in wanted and not args.quick:
        sh = trained(options(args, 0, "human"))
        results["human"] = sh
        texts.append(table("Accuracy on GSM8K and Dolly test prompts, k = 0 (human-written answers counted in the "
                           "encoder's tokenizer; one sample per prompt, so no ceiling)",
                           ACCURACY_HEADER, accuracy_rows(sh)))
    train_rows = [[f"{Path(s['options']['out']).name}", s["options"]["encoder"], s["device"], s["train_rows"], s["steps"],
                   round(s["train_seconds"], 1), round(s["train_samples_per_second"], 2)]
                  for s in (results.get("k0"), *results.get("longer", []), results.get("k"), results.get("human"))
                  if s]
    texts.append(table("Training throughput", ["model", "encoder", "device", "rows", "steps", "seconds",
                                               "rows / s"], train_rows))

    import torch

    if "latency" in wanted:
        prompts = _test_prompts(options(args, 0))
        lat = []
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        for device in devices:
            lat += latency(BertLengthPredictor.from_pretrained(options(args, 0).out, device=device), prompts, device)
        results["latency"] = lat
        texts.append(table("Prediction latency (median of 5, k = 0 model, test prompts, quantile 0.9 included)",
                           ["device", "batch", "ms / batch", "prompts / s"], lat))
    report(results, texts, args.out, f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    return 0


def _test_prompts(opts: TrainOptions) -> list[str]:
    from predictor_training.encoders import load_tokenizer

    label = load_tokenizer(opts.label_tokenizer or opts.encoder, "label_tokenizer")
    return list(load_splits(opts, label)["test"]["prompt"])[:256]


if __name__ == "__main__":
    sys.exit(main())
