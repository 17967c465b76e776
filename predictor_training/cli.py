"""Runners of ``lengthsched train``, ``predict`` and ``eval-predictor`` (torch is imported only here,
when one of them runs; ``eval-predictor --online`` never imports it)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from lengthsched.errors import InvalidArgument
from lengthsched.io import atomic_write_text

from .options import EvalOptions, PredictOptions, TrainOptions

__all__ = ["run_train", "run_predict", "run_eval", "run_online_eval", "read_prompts"]


def _need_train_extra(quiet: bool = False) -> None:
    try:
        import datasets  # noqa: F401
        import torch  # noqa: F401
        import transformers
    except ImportError as exc:
        raise ImportError(f"{exc.name} is not installed: the predictor needs the train extra "
                          "(pip install torch==2.13.0 'lengthsched[train]' for a CPU-only machine)") from None
    if quiet:  # predict / eval print results, not weight-loading progress bars
        transformers.utils.logging.disable_progress_bar()


def run_train(opts: TrainOptions) -> int:
    _need_train_extra()
    from .training import format_summary, train

    summary = train(opts, progress=sys.stderr.isatty())
    if summary:
        print(json.dumps(summary["evaluation"], indent=1) if opts.json else format_summary(summary))
    return 0


def read_prompts(source: str | None) -> list[dict[str, Any]]:
    """Queries from a text file (one prompt per line) or JSON lines (``prompt``, optional ``prefix``,
    ``prompt_tokens``); ``-`` or None reads stdin."""
    name = "<stdin>" if source in (None, "-") else source
    try:
        text = sys.stdin.read() if source in (None, "-") else Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument("input", name, f"a readable text file ({exc.__class__.__name__})") from None
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise InvalidArgument("input", name, "at least one prompt (one per line, or JSON lines with 'prompt')")
    out = []
    for n, line in enumerate(lines, 1):
        if line.lstrip().startswith("{"):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidArgument("input", f"{name}:{n}", f"a JSON object per line ({exc.msg})") from None
            if not isinstance(rec.get("prompt"), str):
                raise InvalidArgument("input", f"{name}:{n}", "a JSON object with a 'prompt' string")
            out.append(rec)
        else:
            out.append({"prompt": line})
    return out


def _levels(text: str) -> list[float]:
    try:
        levels = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise InvalidArgument("quantiles", text, "comma-separated numbers strictly between 0 and 1") from None
    for q in levels:
        if not 0.0 < q < 1.0:
            raise InvalidArgument("quantiles", q, "levels strictly between 0 and 1")
    return levels


def run_predict(opts: PredictOptions) -> int:
    if not opts.model:
        raise InvalidArgument("model", opts.model, "a predictor directory (--model DIR from `lengthsched train`)")
    levels = _levels(opts.quantiles)
    queries = read_prompts(opts.input)
    _need_train_extra(quiet=True)
    from .predictor import BertLengthPredictor

    predictor = BertLengthPredictor.from_pretrained(opts.model, device=opts.device, batch_size=opts.batch_size)
    counts = [q.get("prompt_tokens") for q in queries]
    res = predictor.predict([q["prompt"] for q in queries],
                            [q.get("prefix") for q in queries] if any("prefix" in q for q in queries) else None,
                            quantiles=levels, prompt_tokens=None if None in counts else counts)
    lines = []
    for i in range(len(queries)):
        rec = {"index": i, "remaining_tokens": int(res.lengths[i])}
        rec.update({f"q{q:g}": int(res.quantiles[q][i]) for q in levels})
        lines.append(json.dumps(rec))
    text = "\n".join(lines) + "\n"
    if opts.output:
        atomic_write_text(opts.output, text)
    sys.stdout.write(text)
    return 0


_ONLINE_ONLY = ("online_prior", "split", "siblings", "bootstrap", "drift_steps", "growth", "seed")


def run_online_eval(opts: EvalOptions) -> int:
    """``eval-predictor --online DATA``: the online predictor's cross-fitted evaluation (and the drift
    experiment with ``--drift-steps``), without torch."""
    from .online_eval import (
        check_targets,
        drift_experiment,
        evaluate_online,
        format_drift,
        format_online,
        format_targets,
        limit_groups,
        load_groups,
        load_prior,
    )

    for name in ("model", "data", "train_data", "label_tokenizer"):
        if getattr(opts, name):
            raise InvalidArgument(name, getattr(opts, name), "nothing with --online (the online predictor needs no "
                                                             "trained model nor labelled data)")
    if opts.k is not None or opts.prompt_only:
        raise InvalidArgument("k" if opts.k is not None else "prompt_only", opts.k if opts.k is not None else True,
                              "nothing with --online")
    splits = None if opts.split is None else [s.strip() for s in opts.split.split(",") if s.strip()]
    if splits is not None and not splits:
        raise InvalidArgument("split", opts.split, "comma-separated split names, e.g. validate")
    groups = load_groups(opts.online, splits=splits, argument="online")
    if opts.limit is not None:
        groups = limit_groups(groups, opts.limit)
    try:
        siblings = [int(t) for t in opts.siblings.split(",") if t.strip()]
    except ValueError:
        raise InvalidArgument("siblings", opts.siblings, "comma-separated integers >= -1") from None
    if not siblings or min(siblings) < -1:
        raise InvalidArgument("siblings", opts.siblings, "comma-separated integers >= -1 (-1: all but one)")
    prior: Any = opts.online_prior
    if prior not in ("none", "regression"):
        prior = load_prior(prior, argument="online_prior")
    name = Path(opts.online_prior).name
    evaluation = evaluate_online(groups, siblings=siblings, prior=prior, bootstrap=opts.bootstrap, seed=opts.seed,
                                 prior_name=name)
    drift = None
    if opts.drift_steps:
        if opts.drift_steps < 2:
            raise InvalidArgument("drift_steps", opts.drift_steps, "0 (skip) or at least 2 steps")
        drift = drift_experiment(groups, steps=opts.drift_steps, growth=opts.growth, prior=prior, seed=opts.seed,
                                 burn_in=min(3, opts.drift_steps - 1), prior_name=name)
    targets = check_targets(evaluation, drift)
    results = {"evaluation": evaluation, "drift": drift, "targets": targets}
    text = json.dumps(results, indent=1)
    if opts.output:
        atomic_write_text(opts.output, text + "\n")
    if opts.json:
        print(text)
    else:
        parts = [format_online(evaluation)] + ([format_drift(drift)] if drift else []) + \
            ["targets (the issue's)\n\n" + format_targets(targets)]
        print("\n\n".join(parts))
    return 0


def run_eval(opts: EvalOptions) -> int:
    if opts.online is not None:
        return run_online_eval(opts)
    defaults = {f.name: f.default for f in dataclasses.fields(EvalOptions)}
    for name in _ONLINE_ONLY:
        default = defaults[name]
        if getattr(opts, name) != default:
            raise InvalidArgument(name, getattr(opts, name), f"the default ({default}) without --online")
    if not opts.model:
        raise InvalidArgument("model", opts.model, "one or more predictor directories (--model DIR[,DIR])")
    _need_train_extra(quiet=True)
    from .data import LabelConfig, load_sources
    from .encoders import load_tokenizer
    from .evaluate import format_table, predictor_predictions, reference_results, score_by_source
    from .predictor import BertLengthPredictor
    from .training import load_splits, split_specs

    dirs = [d.strip() for d in opts.model.split(",") if d.strip()]
    predictors = [BertLengthPredictor.from_pretrained(d) for d in dirs]
    first = predictors[0]
    k = first.config.k if opts.k is None else opts.k
    label_tok = load_tokenizer(opts.label_tokenizer, "label_tokenizer") if opts.label_tokenizer \
        else first.label_tokenizer
    if opts.data is None:
        summary_path = Path(dirs[0]) / "training_summary.json"
        if not summary_path.is_file():
            raise InvalidArgument("data", None, f"evaluation data (--data), since {summary_path} is missing")
        saved = json.loads(summary_path.read_text())["options"]
        train_opts = TrainOptions(**{**saved, "k": k, "over_l_max": opts.over_l_max,
                                     **({"limit": opts.limit} if opts.limit else {})})
        splits = load_splits(train_opts, label_tok)
        test, fit = splits["test"].to_dict(), splits["train"].to_dict()
    else:
        base = TrainOptions(data=opts.data, limit=opts.limit)
        labels = LabelConfig(tokenizer=label_tok, k=k, l_max=first.config.l_max, over_l_max=opts.over_l_max)
        test = load_sources(split_specs(opts.data, base, "data"), labels).to_dict()
        fit = load_sources(split_specs(opts.train_data, base, "train_data"), labels).to_dict() \
            if opts.train_data else None
    l_max = first.config.l_max
    results: dict[str, Any] = {}
    for d, p in zip(dirs, predictors):
        name = Path(d).name or d
        # a k = 0 model never saw a prefix: it answers from the prompt, minus what was generated already
        pred = predictor_predictions(p, test, prompt_only=opts.prompt_only or p.config.k == 0)
        results[f"{name} (k={p.config.k})"] = score_by_source(pred, test["remaining"], test["source"], l_max)
    results.update(reference_results(fit, test, l_max))
    text = json.dumps(results, indent=1)
    if opts.output:
        atomic_write_text(opts.output, text + "\n")
    print(text if opts.json else format_table(results))
    return 0
