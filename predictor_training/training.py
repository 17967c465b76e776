"""Fine-tune the length predictor with ``transformers.Trainer`` and evaluate it against the baselines.

One call of :func:`train` (or ``lengthsched train``): load and label the data, split it by hashed
prompt id, build the encoder, train with checkpoints / resume / early stopping, save the predictor
into ``out`` and write ``training_summary.json`` with the held-out accuracy of the model, the
baselines and the noise ceiling. The same command runs on several GPUs under ``torchrun`` or
``accelerate launch`` (the Trainer handles the distribution; only rank 0 evaluates and writes).
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lengthsched.errors import InvalidArgument
from lengthsched.io import atomic_write_text

from .data import FORMATS, DataError, DataSpec, LabelConfig, _looks_like_hub_name, assign_splits, load_sources
from .encoders import load_encoder_config, load_encoder_weights, load_tokenizer, tiny_encoder_config, train_wordpiece
from .evaluate import (
    DEFAULT_LEVELS,
    format_legend,
    format_table,
    predictor_predictions,
    reference_results,
    score_by_source,
    verdict,
)
from .model import LengthPredictorConfig, LengthPredictorModel, collate, encode_pairs, features
from .options import TrainOptions, check_out, check_train
from .predictor import BertLengthPredictor

__all__ = ["TrainOptions", "train", "load_splits", "split_specs", "SUMMARY_FILE"]

SUMMARY_FILE = "training_summary.json"


def split_specs(text: str | None, opts: TrainOptions, what: str) -> list[DataSpec]:
    """Comma-separated sources -> :class:`DataSpec` list with the options' filters."""
    if text is None:
        return []
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise InvalidArgument(what, text, "at least one data file, directory, glob or hub name")
    filters = dict(models=tuple(_csv(opts.models)), languages=tuple(_csv(opts.languages)),
                   first_turn=not opts.all_turns, min_length=opts.min_tokens, max_length=opts.max_tokens,
                   limit=opts.limit, streaming=opts.streaming)
    return [DataSpec.parse(p, **filters) for p in parts]


def _csv(text: str | None) -> list[str]:
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def _check(opts: TrainOptions) -> None:
    check_train(opts)
    check_out(opts)


def _absolute_sources(text: str | None) -> str | None:
    """``--data`` / ``--eval-data`` with every local path made absolute (hub names kept), so that the
    saved summary still finds the data from another working directory."""
    if text is None:
        return None
    parts = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        fmt, sep, rest = part.partition(":")
        prefix, path = (fmt + sep, rest) if sep and fmt in FORMATS else ("", part)
        local = Path(path).exists() or (any(ch in path for ch in "*?[") and not _looks_like_hub_name(path))
        parts.append(prefix + (os.path.abspath(path) if local else path))
    return ",".join(parts)


def _saved_options(opts: TrainOptions) -> dict[str, Any]:
    """The options as saved in the summary: paths absolute, so that ``eval-predictor --model DIR``
    works from any directory."""
    saved = asdict(opts)
    saved["data"], saved["eval_data"] = _absolute_sources(opts.data), _absolute_sources(opts.eval_data)
    for name in ("out", "init_from", "label_tokenizer"):
        if saved[name] and Path(saved[name]).exists():
            saved[name] = os.path.abspath(saved[name])
    return saved


def load_splits(opts: TrainOptions, label_tokenizer: Any) -> dict[str, Any]:
    """Train / validation / test tables (``datasets.Dataset``) split by hashed prompt id."""
    labels = LabelConfig(tokenizer=label_tokenizer, k=opts.k, l_max=opts.l_max, over_l_max=opts.over_l_max)
    train_pool = load_sources(split_specs(opts.data, opts, "data"), labels)
    eval_specs = split_specs(opts.eval_data, opts, "eval_data")
    eval_pool = load_sources(eval_specs, labels) if eval_specs else None
    where = assign_splits(train_pool["id"], None if eval_pool is None else eval_pool["id"],
                          test_fraction=opts.test_fraction, validation_fraction=opts.validation_fraction,
                          seed=opts.seed if opts.split_seed is None else opts.split_seed, fold=opts.test_fold)
    out = {"train": train_pool.filter(lambda r: where[r["id"]] == "train"),
           "validation": train_pool.filter(lambda r: where[r["id"]] == "validation"),
           "test": (eval_pool or train_pool).filter(lambda r: where[r["id"]] == "test")}
    for name in ("train", "test") + (("validation",) if opts.validation_fraction > 0 else ()):
        if len(out[name]) == 0:
            hint = {"train": "add training data or lower --test-fraction",
                    "test": "raise --test-fraction or pass --eval-data",
                    "validation": "raise --validation-fraction or pass 0 to train without early stopping"}[name]
            raise DataError(f"split {name!r} is empty ({len(train_pool)} training-pool rows): {hint}")
    return out


def _encode(ds: Any, tokenizer: Any, config: LengthPredictorConfig, num_proc: int) -> Any:
    def fn(batch: dict[str, list[Any]]) -> dict[str, Any]:
        enc = encode_pairs(tokenizer, batch["prompt"], batch["prefix"], max_length=config.input_tokens,
                           prefix_max_tokens=config.prefix_max_tokens)
        enc.pop("attention_mask")
        enc["features"] = features(batch["prompt_tokens"], batch["prefix_tokens"]).tolist()
        return enc

    keep = {"remaining"}
    return ds.map(fn, batched=True, num_proc=num_proc if num_proc > 1 else None,
                  remove_columns=[c for c in ds.column_names if c not in keep])


def _step_bar(stream: Any):
    """A ``TrainerCallback`` drawing one tqdm bar of optimizer steps on ``stream`` (the terminal, while
    the Trainer's own output goes to the log file)."""
    from tqdm.auto import tqdm
    from transformers import TrainerCallback

    class StepBar(TrainerCallback):
        bar = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc="training", unit="step",
                            file=stream)

        def on_step_end(self, args, state, control, **kwargs):
            if self.bar is not None:
                self.bar.update(state.global_step - self.bar.n)

        def on_train_end(self, args, state, control, **kwargs):
            if self.bar is not None:
                self.bar.close()
                self.bar = None

    return StepBar()


def train(opts: TrainOptions, progress: bool = True, bar: Any = None) -> dict[str, Any]:
    """Train, save the predictor into ``opts.out`` and return the summary (also written as JSON).
    ``progress``: the Trainer's own tqdm bars (where its output goes); ``bar``: a text stream that gets
    one bar of optimizer steps (the CLI passes the terminal when the Trainer's output goes to its log)."""
    import torch
    from transformers import EarlyStoppingCallback, Trainer, TrainingArguments, set_seed
    from transformers.trainer_utils import get_last_checkpoint

    _check(opts)
    started = time.perf_counter()
    set_seed(opts.seed)
    out = Path(opts.out)
    ckpt_dir = out / "checkpoints"
    last = get_last_checkpoint(str(ckpt_dir)) if opts.resume and ckpt_dir.is_dir() else None
    if opts.resume and last is None:
        raise InvalidArgument("resume", str(ckpt_dir), "a checkpoint-N directory from an earlier run with --out")

    previous = _previous(opts) if opts.init_from else None
    tiny = opts.encoder == "tiny" and previous is None
    if previous is not None and not opts.label_tokenizer:
        label_name = previous.model.config.label_tokenizer
        label_tok = previous.label_tokenizer if label_name != "counts in the data" else None
    else:
        label_name = opts.label_tokenizer or (None if tiny else opts.encoder)
        label_tok = load_tokenizer(label_name, "label_tokenizer" if opts.label_tokenizer else "encoder") \
            if label_name else None
    splits = load_splits(opts, label_tok)

    if previous is not None:
        tokenizer = previous.tokenizer
        encoder_cfg = dict(previous.model.config.encoder)
    elif tiny:
        tokenizer = load_tokenizer(last, "encoder") if last else \
            train_wordpiece(list(splits["train"]["prompt"]) + [x for x in splits["train"]["prefix"] if x])
        encoder_cfg = tiny_encoder_config(len(tokenizer), opts.max_length, opts.tiny_hidden, opts.tiny_layers)
    else:
        tokenizer = load_tokenizer(opts.encoder)
        encoder_cfg = load_encoder_config(opts.encoder)
    config = LengthPredictorConfig(encoder=encoder_cfg, head=opts.head, k=opts.k, l_max=opts.l_max,
                                   input_tokens=opts.max_length, prefix_max_tokens=opts.prefix_max_tokens,
                                   label_tokenizer=label_name or "counts in the data")
    limit = encoder_cfg.get("max_position_embeddings")
    if limit and opts.max_length > limit:
        raise InvalidArgument("max_length", opts.max_length, f"at most {limit}, the encoder's position limit")
    model = LengthPredictorModel(config)
    if previous is not None:
        model.load_state_dict(previous.model.state_dict())  # encoder and head as trained before
    elif not tiny:
        missing = model.encoder.load_state_dict(load_encoder_weights(opts.encoder), strict=False)
        if missing.missing_keys:
            raise InvalidArgument("encoder", opts.encoder, f"an encoder whose weights fit its config "
                                  f"(missing {missing.missing_keys[:3]})")
    if previous is None:
        model.init_head_from_targets(splits["train"]["remaining"])

    enc = {name: _encode(ds, tokenizer, config, opts.num_proc) for name, ds in splits.items() if len(ds)}
    has_val = "validation" in enc
    per_epoch = max(1, math.ceil(len(enc["train"]) / opts.batch_size))
    strategy = "steps" if opts.eval_steps else "epoch"
    args = TrainingArguments(
        output_dir=str(ckpt_dir),
        per_device_train_batch_size=opts.batch_size,
        per_device_eval_batch_size=max(opts.batch_size, 32),
        num_train_epochs=opts.epochs,
        max_steps=opts.max_steps if opts.max_steps is not None else -1,
        learning_rate=opts.learning_rate,
        weight_decay=opts.weight_decay,
        warmup_steps=int(opts.warmup_ratio * (opts.max_steps or per_epoch * opts.epochs)),
        lr_scheduler_type="linear",
        eval_strategy=strategy if has_val else "no",
        save_strategy=strategy,
        eval_steps=opts.eval_steps,
        save_steps=opts.eval_steps or 500,
        save_total_limit=2,
        load_best_model_at_end=has_val,
        metric_for_best_model="loss" if has_val else None,
        greater_is_better=False if has_val else None,
        logging_steps=max(1, min(50, per_epoch // 2)),
        report_to="none",
        seed=opts.seed,
        data_seed=opts.seed,
        remove_unused_columns=False,
        label_names=["labels", "label_mask"],
        disable_tqdm=not progress,
        use_cpu=opts.cpu or not torch.cuda.is_available(),
    )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    trainer = Trainer(
        model=model, args=args, train_dataset=enc["train"], eval_dataset=enc.get("validation"),
        data_collator=functools.partial(collate, pad_id=pad), processing_class=tokenizer,
        callbacks=([EarlyStoppingCallback(early_stopping_patience=opts.patience)] if has_val else [])
        + ([_step_bar(bar)] if bar is not None else []),
    )
    result = trainer.train(resume_from_checkpoint=last)
    if not trainer.is_world_process_zero():
        return {}

    keep_label = opts.label_tokenizer or (previous is not None and label_tok is not None)
    predictor = BertLengthPredictor(trainer.model, tokenizer, label_tok if keep_label else None,
                                    device=str(trainer.args.device))
    summary = {
        "options": _saved_options(opts),
        "train_rows": len(splits["train"]), "validation_rows": len(splits["validation"]),
        "test_rows": len(splits["test"]),
        "steps": int(result.global_step), "train_seconds": float(result.metrics.get("train_runtime", 0.0)),
        "train_samples_per_second": float(result.metrics.get("train_samples_per_second", 0.0)),
        "best_checkpoint": trainer.state.best_model_checkpoint,
        "torch": torch.__version__, "device": str(trainer.args.device),
        "evaluation": evaluate_all(predictor, splits["train"], splits["test"], opts.l_max),
    }
    _save_atomically(predictor, out, summary)
    summary["wall_seconds"] = time.perf_counter() - started
    return summary


def _previous(opts: TrainOptions) -> BertLengthPredictor:
    """The predictor ``--init-from`` names, checked against the options that must agree with it."""
    try:
        previous = BertLengthPredictor.from_pretrained(opts.init_from, device="cpu")
    except InvalidArgument as exc:
        raise InvalidArgument("init_from", opts.init_from, exc.expected) from None
    config = previous.model.config
    for name, mine, theirs in (("head", opts.head, config.head), ("l_max", opts.l_max, config.l_max)):
        if mine != theirs:
            raise InvalidArgument(name, mine, f"{theirs!r}, the value of the predictor in --init-from "
                                              f"{opts.init_from!r} (its head's outputs depend on it)")
    return previous


def evaluate_all(predictor: Any, train_rows: Any, test_rows: Any, l_max: int,
                 levels: Sequence[float] = DEFAULT_LEVELS) -> dict[str, Any]:
    """Model, baselines (fitted on ``train_rows``) and noise ceiling on ``test_rows``, per source."""
    tr, te = train_rows.to_dict(), test_rows.to_dict()
    truth, sources = te["remaining"], te["source"]
    results = {"model": score_by_source(predictor_predictions(predictor, te, levels), truth, sources, l_max)}
    results.update(reference_results(tr, te, l_max, levels))
    return results


def _save_atomically(predictor: BertLengthPredictor, out: Path, summary: dict[str, Any]) -> None:
    """Write into a staging directory, then move the files into ``out`` with ``config.json`` and the
    summary last: an interrupted save leaves the previous predictor loadable."""
    out.mkdir(parents=True, exist_ok=True)
    stage = out / f".staging-{uuid.uuid4().hex}"
    try:
        predictor.save(stage)
        atomic_write_text(stage / "training_summary.json", json.dumps(summary, indent=2, default=str) + "\n")
        names = sorted(p.name for p in stage.iterdir())
        last = ["config.json", "training_summary.json"]
        for name in [n for n in names if n not in last] + [n for n in last if n in names]:
            target = out / name
            if target.is_dir() and (stage / name).is_dir():
                shutil.rmtree(target)
            os.replace(stage / name, target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def format_summary(summary: dict[str, Any]) -> str:
    ev = summary["evaluation"]
    head = (f"trained {summary['steps']} steps on {summary['train_rows']} rows "
            f"({summary['train_samples_per_second']:.1f} rows/s, {summary['device']}); "
            f"test {summary['test_rows']} rows; saved to {summary['options']['out']}")
    return "\n".join([head, "", format_table(ev), "", format_legend(ev), "", verdict(ev, "model")])
