"""Runners of ``lengthsched train``, ``predict`` and ``eval-predictor`` (torch is imported only here,
when one of them runs; ``eval-predictor --online`` never imports it)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import shutil
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lengthsched.errors import InvalidArgument
from lengthsched.io import atomic_write_text

from .options import EvalOptions, PredictOptions, TrainOptions, check_device, check_out, check_train, resolve_device

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


def _check_sources(text: str | None, flag: str, hint: str = "") -> None:
    """Every local source of ``text`` (comma-separated, as ``--data`` takes) exists: checked without
    importing torch or datasets (hub names are checked when they are loaded)."""
    from .data import FORMATS, DataError, DataSpec, _expand, _looks_like_hub_name

    if text is None:
        return
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise InvalidArgument(flag, text, "at least one data file, directory, glob or hub name")
    for part in parts:
        spec = DataSpec.parse(part)
        if _looks_like_hub_name(spec.path):
            continue
        try:
            _expand(spec.path)
        except DataError as exc:
            fmt, sep, rest = part.partition(":")
            # FORMAT:PATH with an unknown format (a drive letter, C:, is one character; a URL has //)
            if sep and spec.fmt is None and len(fmt) > 1 and fmt.isidentifier() and not rest.startswith("//"):
                raise InvalidArgument(flag, part, f"FORMAT:PATH with a known format (unknown {fmt!r}; formats: "
                                                  f"{', '.join(FORMATS)}), or a file, directory or glob") from None
            reason = str(exc).split(": ", 1)[-1]
            raise InvalidArgument(flag, spec.path, f"an existing data file, directory or glob: {reason}{hint}") \
                from None


def _check_predictor_dir(path: str, flag: str) -> None:
    """``path`` looks like a directory written by ``lengthsched train`` (checked without torch)."""
    if not (Path(path) / "config.json").is_file():
        what = "no such directory" if not Path(path).exists() else "no config.json in it"
        raise InvalidArgument(flag, path, f"a directory written by `lengthsched train` (with config.json; {what})")


@contextlib.contextmanager
def _log_into(path: Path, verbose: bool) -> Iterator[None]:
    """Without ``verbose``: what the Trainer prints (its raw loss dicts, warnings) and the transformers /
    datasets / accelerate log lines (tokenizer notices) go to the file ``path`` instead of the terminal."""
    if verbose:
        yield
        return
    with open(path, "a", encoding="utf-8") as handle:
        handler = logging.StreamHandler(handle)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
        saved = []
        for name in ("transformers", "datasets", "accelerate", "torch"):
            logger = logging.getLogger(name)
            saved.append((logger, logger.handlers[:], logger.propagate))
            logger.handlers[:] = [handler]
            logger.propagate = False
        try:
            with contextlib.redirect_stdout(handle), contextlib.redirect_stderr(handle), warnings.catch_warnings():
                warnings.simplefilter("default")
                yield
        finally:
            for logger, handlers, propagate in saved:
                logger.handlers[:] = handlers
                logger.propagate = propagate


def run_train(opts: TrainOptions) -> int:
    # every argument, file and path checked before torch is imported (seconds) and anything is trained
    check_train(opts)
    check_out(opts)
    _check_sources(opts.data, "data")
    _check_sources(opts.eval_data, "eval_data")
    if opts.init_from:
        _check_predictor_dir(opts.init_from, "init_from")
    _need_train_extra()
    from .training import format_summary, train

    out = Path(opts.out)
    log = out / "train.log"
    created = not out.exists()
    if not opts.verbose:
        out.mkdir(parents=True, exist_ok=True)
        if sys.stderr.isatty():  # a person waits: say where the log went (an error stays one line)
            print(f"training; the Trainer's log goes to {log} (--verbose shows it here)", file=sys.stderr,
                  flush=True)
    terminal = sys.stderr  # the Trainer's output goes to the log: one bar of steps stays on the terminal
    try:
        with _log_into(log, opts.verbose):
            summary = train(opts, progress=sys.stderr.isatty() and opts.verbose,
                            bar=terminal if terminal.isatty() and not opts.verbose else None)
    except BaseException:
        # Nothing half-written: a directory this run made that holds only its log goes again.
        if created and out.is_dir() and {p.name for p in out.iterdir()} <= {"train.log"}:
            shutil.rmtree(out, ignore_errors=True)
        raise
    if summary:
        text = json.dumps(summary["evaluation"], indent=1) if opts.json else format_summary(summary)
        print(text + ("" if opts.json or opts.verbose else f"\nlog: {log}"))
    return 0


_MAX_PROMPT_TOKENS = 10**9


def _whole(value: Any) -> int | None:
    """``value`` as an int when it is a JSON integer (or a float holding one), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def _check_query(rec: dict[str, Any], where: str) -> None:
    """The fields of one JSON-lines query: ``prompt`` text, ``prompt_tokens`` a count, ``prefix`` text,
    a count of generated tokens or a list of token ids (each checked against the vocabulary later)."""
    if not isinstance(rec.get("prompt"), str):
        raise InvalidArgument(f"{where}: prompt", rec.get("prompt"), "a JSON object with a 'prompt' string")
    if rec.get("prompt_tokens") is not None:
        n = _whole(rec["prompt_tokens"])
        if n is None or not 0 <= n <= _MAX_PROMPT_TOKENS:
            raise InvalidArgument(f"{where}: prompt_tokens", rec["prompt_tokens"],
                                  f"an integer 0 .. {_MAX_PROMPT_TOKENS} (the prompt's length in policy tokens)")
        rec["prompt_tokens"] = n
    prefix = rec.get("prefix")
    if prefix is None or isinstance(prefix, str):
        return
    expected = "text, a list of the policy's token ids (integers >= 0), or a count of generated tokens >= 0"
    if isinstance(prefix, list):
        ids = [_whole(t) for t in prefix]
        bad = next((i for i, t in enumerate(ids) if t is None or t < 0), None)
        if bad is not None:
            raise InvalidArgument(f"{where}: prefix[{bad}]", prefix[bad], f"a token id >= 0 ({expected})")
        rec["prefix"] = ids
        return
    n = _whole(prefix)
    if n is None or n < 0:
        raise InvalidArgument(f"{where}: prefix", prefix, expected)
    rec["prefix"] = n


def _read_queries(source: str | None) -> list[tuple[str, dict[str, Any]]]:
    """(where: "input FILE line N", query) per non-blank line of ``source``."""
    name = "<stdin>" if source in (None, "-") else source
    if source in (None, "-") and sys.stdin is not None and sys.stdin.isatty():
        print("lengthsched predict: note: reading prompts from stdin (end with Ctrl-D)", file=sys.stderr)
    try:
        text = sys.stdin.read() if source in (None, "-") else Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument("input", name, f"a readable text file ({exc.__class__.__name__})") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"input {name} line {n}"
        if line.lstrip().startswith("{"):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidArgument("input", f"{name} line {n}", f"a JSON object per line ({exc.msg})") from None
            if not isinstance(rec, dict):
                raise InvalidArgument("input", f"{name} line {n}", "a JSON object per line")
            _check_query(rec, where)
            out.append((where, rec))
        else:
            out.append((where, {"prompt": line}))
    if not out:
        raise InvalidArgument("input", name, "at least one prompt (one per line, or JSON lines with 'prompt')")
    return out


def read_prompts(source: str | None) -> list[dict[str, Any]]:
    """Queries from a text file (one prompt per line) or JSON lines (``prompt``, optional ``prefix``,
    ``prompt_tokens``); ``-`` or None reads stdin. Each field is checked: a bad one raises
    :class:`InvalidArgument` naming the file, the line and the field."""
    return [rec for _, rec in _read_queries(source)]


def _levels(text: str) -> list[float]:
    try:
        levels = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise InvalidArgument("quantiles", text, "comma-separated numbers strictly between 0 and 1") from None
    for q in levels:
        if not 0.0 < q < 1.0:
            raise InvalidArgument("quantiles", q, "levels strictly between 0 and 1")
    return levels


def _check_token_ids(queries: list[tuple[str, dict[str, Any]]], vocab: int) -> None:
    """Prefix token ids within the policy tokenizer's vocabulary (known once the predictor is loaded)."""
    for where, rec in queries:
        prefix = rec.get("prefix")
        if isinstance(prefix, list):
            bad = next((i for i, t in enumerate(prefix) if t >= vocab), None)
            if bad is not None:
                raise InvalidArgument(f"{where}: prefix[{bad}]", prefix[bad],
                                      f"a token id of the predictor's policy tokenizer, 0 .. {vocab - 1}")


def run_predict(opts: PredictOptions) -> int:
    # arguments and the input checked before torch is imported (seconds)
    if not opts.model:
        raise InvalidArgument("model", opts.model, "a predictor directory (--model DIR from `lengthsched train`)")
    _check_predictor_dir(opts.model, "model")
    check_device(opts.device)
    if opts.batch_size < 1:
        raise InvalidArgument("batch_size", opts.batch_size, "an integer >= 1 (prompts per forward pass)")
    levels = _levels(opts.quantiles)
    queries = _read_queries(opts.input)
    _need_train_extra(quiet=True)
    from .predictor import BertLengthPredictor

    device = resolve_device(opts.device)
    predictor = BertLengthPredictor.from_pretrained(opts.model, device=device, batch_size=opts.batch_size)
    _check_token_ids(queries, len(predictor.label_tokenizer))
    recs = [q for _, q in queries]
    counts = [q.get("prompt_tokens") for q in recs]
    res = predictor.predict([q["prompt"] for q in recs],
                            [q.get("prefix") for q in recs] if any("prefix" in q for q in recs) else None,
                            quantiles=levels, prompt_tokens=None if None in counts else counts)
    lines = []
    for i in range(len(recs)):
        rec = {"index": i, "remaining_tokens": int(res.lengths[i])}
        rec.update({f"q{q:g}": int(res.quantiles[q][i]) for q in levels})
        lines.append(json.dumps(rec))
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)  # the result first: a failing --output loses nothing
    sys.stdout.flush()
    l_max = predictor.config.l_max
    capped = int((res.lengths >= l_max).sum()) + sum(int((res.quantiles[q] >= l_max).sum()) for q in levels)
    if capped:
        print(f"lengthsched predict: note: {capped} predicted value(s) reached the model's l_max ({l_max} tokens) "
              f"and were clipped there: the remaining length may be longer", file=sys.stderr)
    if opts.output:
        atomic_write_text(opts.output, text)
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
    if opts.json:
        print(text)
    else:
        parts = [format_online(evaluation)] + ([format_drift(drift)] if drift else []) + \
            ["targets (the issue's)\n\n" + format_targets(targets)]
        print("\n\n".join(parts))
    sys.stdout.flush()
    if opts.output:  # after the result is printed: a failing write loses nothing
        atomic_write_text(opts.output, text + "\n")
    return 0


def _saved_training_options(summary_path: Path) -> dict[str, Any]:
    """The training options saved next to a predictor, its data sources checked from here (an older
    summary may hold paths relative to the directory where training ran)."""
    try:
        saved = json.loads(summary_path.read_text(encoding="utf-8"))["options"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise InvalidArgument("data", None, f"evaluation data (--data), since {summary_path} cannot be read "
                                              f"({exc.__class__.__name__})") from None
    hint = (f"; {summary_path} names the training data as given where training ran: pass --data (and "
            f"--train-data for the baselines) to evaluate from here")
    _check_sources(saved.get("data"), "data", hint)
    _check_sources(saved.get("eval_data"), "data", hint)
    return saved


def run_eval(opts: EvalOptions) -> int:
    if opts.limit is not None and opts.limit < 1:
        raise InvalidArgument("limit", opts.limit, "an integer >= 1 (rows kept per source), or leave it out")
    if opts.online is not None:
        return run_online_eval(opts)
    defaults = {f.name: f.default for f in dataclasses.fields(EvalOptions)}
    for name in _ONLINE_ONLY:
        default = defaults[name]
        if getattr(opts, name) != default:
            raise InvalidArgument(name, getattr(opts, name),
                                  f"the default ({default}) without --online")
    if not opts.model:
        raise InvalidArgument("model", opts.model, "one or more predictor directories (--model DIR[,DIR])")
    if opts.k is not None and opts.k < 0:
        raise InvalidArgument("k", opts.k, "an integer >= 0 (generated tokens)")
    # every path checked before torch is imported (seconds)
    dirs = [d.strip() for d in opts.model.split(",") if d.strip()]
    if not dirs:
        raise InvalidArgument("model", opts.model, "one or more predictor directories (--model DIR[,DIR])")
    for d in dirs:
        _check_predictor_dir(d, "model")
    _check_sources(opts.data, "data")
    _check_sources(opts.train_data, "train_data")
    saved = None
    if opts.data is None:
        summary_path = Path(dirs[0]) / "training_summary.json"
        if not summary_path.is_file():
            raise InvalidArgument("data", None, f"evaluation data (--data), since {summary_path} is missing")
        saved = _saved_training_options(summary_path)
    _need_train_extra(quiet=True)
    from .data import LabelConfig, load_sources
    from .encoders import load_tokenizer
    from .evaluate import (
        format_legend,
        format_table,
        predictor_predictions,
        reference_results,
        score_by_source,
        verdict,
    )
    from .predictor import BertLengthPredictor
    from .training import load_splits, split_specs

    predictors = [BertLengthPredictor.from_pretrained(d) for d in dirs]
    first = predictors[0]
    k = first.config.k if opts.k is None else opts.k
    label_tok = load_tokenizer(opts.label_tokenizer, "label_tokenizer") if opts.label_tokenizer \
        else first.label_tokenizer
    if saved is not None:
        fields = {f.name for f in dataclasses.fields(TrainOptions)}
        train_opts = TrainOptions(**{**{n: v for n, v in saved.items() if n in fields}, "k": k,
                                     "over_l_max": opts.over_l_max, **({"limit": opts.limit} if opts.limit else {})})
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
    names = []
    for d, p in zip(dirs, predictors):
        name = f"{Path(d).name or d} (k={p.config.k})"
        # a k = 0 model never saw a prefix: it answers from the prompt, minus what was generated already
        pred = predictor_predictions(p, test, prompt_only=opts.prompt_only or p.config.k == 0)
        results[name] = score_by_source(pred, test["remaining"], test["source"], l_max)
        names.append(name)
    results.update(reference_results(fit, test, l_max))
    text = json.dumps(results, indent=1)
    if opts.json:
        print(text)
    else:
        print("\n".join([format_table(results), "", format_legend(results), ""] + [verdict(results, n) for n in names]))
    sys.stdout.flush()
    if opts.output:  # after the result is printed: a failing write loses nothing
        atomic_write_text(opts.output, text + "\n")
    return 0
