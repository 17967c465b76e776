"""The options of ``lengthsched train``, ``predict`` and ``eval-predictor`` (frozen dataclasses; the
CLI flags are derived from them). Importing this module imports neither torch nor transformers, so
``lengthsched --help`` stays light."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from lengthsched.errors import InvalidArgument
from lengthsched.options import _opt  # one helper makes every CLI option of the project

__all__ = ["TrainOptions", "PredictOptions", "EvalOptions", "HEADS", "check_device", "resolve_device", "check_train",
           "check_out"]

HEADS = ("regression", "quantile", "buckets-exact", "buckets-log")  # see predictor_training.model


@dataclass(frozen=True)
class TrainOptions:
    """Train a length predictor (BERT-family encoder + length head) and evaluate it on held-out prompts."""

    data: str | None = _opt(None, "training data, comma-separated: FILE, DIR, GLOB or FORMAT:PATH (formats: "
                                  "castillo, lmsys, gsm8k, sharegpt, dolly, plain), or lmsys/lmsys-chat-1m",
                            required=True)
    eval_data: str | None = _opt(None, "evaluation data, same syntax (default: a hashed --test-fraction of --data); "
                                       "prompts in both are split half and half by hash")
    out: str = _opt("predictor", "output directory: the predictor, checkpoints/, training_summary.json and "
                                 "train.log (refused if it holds a predictor already, unless --overwrite or "
                                 "--resume)")
    overwrite: bool = _opt(False, "replace the predictor in --out when it holds one already")
    encoder: str = _opt("minilm", "minilm (pretrained, offline), tiny (built from a config), or a Hugging Face "
                                  "name / local directory")
    head: str = _opt("regression", "length head", choices=list(HEADS))
    init_from: str | None = _opt(None, "continue from a predictor trained earlier (a directory written by "
                                       "`lengthsched train`): its encoder, head and tokenizers; --encoder is then "
                                       "ignored, --head and --l-max must match it (e.g. retrain on fresh rollout "
                                       "logs as the policy changes)")
    k: int = _opt(0, "generated tokens the predictor sees (token-conditioned prediction), policy tokens")
    l_max: int = _opt(4096, "longest remaining length a label may have, tokens")
    over_l_max: str = _opt("error", "a label above --l-max", choices=["error", "clip", "drop"])
    label_tokenizer: str | None = _opt(None, "the POLICY model's tokenizer (name or directory) that counts labels "
                                             "and cuts prefixes (default: the encoder's tokenizer)")
    max_length: int = _opt(256, "encoder tokens per input (prompt truncated from the left)")
    prefix_max_tokens: int = _opt(64, "encoder tokens kept of the k-token prefix")
    epochs: float = _opt(3.0, "training epochs")
    max_steps: int | None = _opt(None, "stop after this many optimizer steps (overrides --epochs)")
    batch_size: int = _opt(16, "rows per device per step")
    learning_rate: float = _opt(5e-5, "peak learning rate (linear decay, warmup)")
    weight_decay: float = _opt(0.01, "AdamW weight decay")
    warmup_ratio: float = _opt(0.06, "share of steps spent warming up")
    test_fraction: float = _opt(0.1, "hashed share of prompts held out for the test (without --eval-data)")
    validation_fraction: float = _opt(0.1, "hashed share of training prompts for early stopping (0: none)")
    eval_steps: int | None = _opt(None, "validate every N steps (default: every epoch)")
    patience: int = _opt(3, "early stopping: validations without improvement before stopping")
    resume: bool = _opt(False, "resume from the last checkpoint in OUT/checkpoints")
    seed: int = _opt(0, "seed of initialisation, shuffling and (without --split-seed) the hashed splits")
    split_seed: int | None = _opt(None, "seed of the hashed splits (default: --seed); fix it to train several "
                                        "seeds on one split (an ensemble)")
    test_fold: int = _opt(0, "which hashed slice of the prompts is the test set: 0 .. ceil(1 / --test-fraction) - 1, "
                             "or 0 / 1 for the halves of prompts in both --data and --eval-data; train once per "
                             "fold to test on every prompt (cross-fitting)")
    models: str | None = _opt(None, "LMSYS filter: comma-separated model names, e.g. vicuna-13b")
    languages: str | None = _opt(None, "LMSYS filter: comma-separated languages, e.g. English")
    all_turns: bool = _opt(False, "LMSYS: keep rows whose turn is not 1")
    min_tokens: int = _opt(1, "drop completions shorter than this (mean of a prompt's samples), tokens")
    max_tokens: int | None = _opt(None, "drop completions longer than this (mean of a prompt's samples), tokens")
    limit: int | None = _opt(None, "rows kept per source (after filters)")
    streaming: bool = _opt(False, "hub sources: stream instead of downloading the whole dataset")
    num_proc: int = _opt(1, "processes for tokenisation (datasets.map)")
    tiny_hidden: int = _opt(64, "tiny encoder: hidden size")
    tiny_layers: int = _opt(2, "tiny encoder: layers")
    cpu: bool = _opt(False, "train on the CPU even when a GPU is present")
    json: bool = _opt(False, "print the summary as JSON instead of a table")
    verbose: bool = _opt(False, "show the Trainer's progress and log lines and the tokenizer notices here instead "
                                "of only in OUT/train.log")


@dataclass(frozen=True)
class PredictOptions:
    """Predict remaining completion lengths with a trained predictor (JSON lines out)."""

    input: str | None = _opt(None, "prompts: a text file (one prompt per line) or JSON lines with 'prompt' and "
                                   "optional 'prefix' (text or the policy's token ids) and 'prompt_tokens'; "
                                   "'-' or nothing reads stdin", positional=True)
    model: str | None = _opt(None, "a directory written by `lengthsched train`", required=True)
    quantiles: str = _opt("0.9", "comma-separated quantile levels to report besides the median")
    batch_size: int = _opt(64, "prompts per forward pass")
    device: str | None = _opt(None, "cpu, cuda, cuda:1, ... (default: cuda when available)")
    output: str | None = _opt(None, "also write the JSON lines to this file (atomically)")


@dataclass(frozen=True)
class EvalOptions:
    """Evaluate trained predictors against the baselines and the noise ceiling, per dataset."""

    model: str | None = _opt(None, "comma-separated predictor directories (e.g. a k=0 and a k>0 model)")
    data: str | None = _opt(None, "evaluation data, same syntax as `train --data` (default: the first model's "
                                  "own held-out test split, rebuilt from its training_summary.json)")
    train_data: str | None = _opt(None, "data to fit the baselines on (default: the first model's training split "
                                        "when --data is not given; no baselines otherwise)")
    label_tokenizer: str | None = _opt(None, "the policy model's tokenizer for text responses (default: the one "
                                             "saved with the model, else its encoder's)")
    k: int | None = _opt(None, "label the data at this k (default: the first model's k)")
    over_l_max: str = _opt("clip", "a label above the model's l_max", choices=["error", "clip", "drop"])
    prompt_only: bool = _opt(False, "ask every model without the prefix and subtract its length (a k=0 model "
                                    "is always asked this way)")
    limit: int | None = _opt(None, "rows kept per source (with --online: prompts kept per dataset, the first in "
                                   "the file)")
    json: bool = _opt(False, "print JSON instead of a table")
    output: str | None = _opt(None, "also write the JSON results to this file (atomically)")
    online: str | None = _opt(None, "evaluate the online predictor (lengthsched.online: siblings and history, no "
                                    "PyTorch) instead of trained models, on this JSON-lines file of sibling groups: "
                                    "CASTILLO lines or rollout traces (prompt_id, prompt_tokens, lengths, optional "
                                    "step and split); cross-fitted on hashed halves of the prompts (docs/online.md)")
    online_prior: str = _opt("none", "--online: the prior: none (running mean of all lengths seen), regression "
                                     "(log length on log prompt tokens, fitted on the other half) or a JSON file "
                                     "{prompt_id: tokens} (or columns id, seed0, seed1, ...: their geometric mean)")
    split: str | None = _opt(None, "--online: keep lines whose 'split' is one of these (comma-separated), e.g. "
                                   "validate")
    siblings: str = _opt("0,1,2,4,5,-1", "--online: comma-separated numbers of siblings revealed (-1: all but one)")
    bootstrap: int = _opt(200, "--online: resamples of prompts for the 95% interval of tau-b (0: none)")
    drift_steps: int = _opt(0, "--online: also run the drift experiment over this many simulated RL steps (0: "
                               "skip)")
    growth: float = _opt(0.03, "--online: the drift experiment's growth of the mean length per step")
    seed: int = _opt(0, "--online: seed of the halves, the random reveal order, the history split and the drift "
                        "draws")


_DEVICE = re.compile(r"(cpu|cuda|cuda:\d+|mps)")
DEVICE_CHOICES = "one of cpu, cuda, cuda:N (N a GPU index), mps"


def check_device(device: str | None, flag: str = "device") -> str | None:
    """``device`` if it is spelled as torch names a device (checked without importing torch)."""
    if device is not None and not _DEVICE.fullmatch(device):
        raise InvalidArgument(flag, device, DEVICE_CHOICES)
    return device


def resolve_device(device: str | None, flag: str = "device") -> str:
    """The device to run on: ``device`` when this machine has it (else a one-line error), else cuda
    when available, else cpu. Imports torch."""
    import torch

    check_device(device, flag)
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            raise InvalidArgument(flag, device, f"a device this machine has: CUDA is not available in this PyTorch "
                                                f"build (torch {torch.__version__}); pass --device cpu")
        if not torch.cuda.is_available():
            raise InvalidArgument(flag, device, "a device this machine has: no CUDA GPU is visible; pass --device cpu")
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise InvalidArgument(flag, device, f"a device this machine has: cuda:0 .. cuda:"
                                                f"{torch.cuda.device_count() - 1}")
    elif device == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise InvalidArgument(flag, device, "a device this machine has: MPS is not available here; pass "
                                                "--device cpu")
    return device


def check_train(opts: TrainOptions) -> None:
    """The numbers of ``opts`` in range (without importing torch); errors name the flag."""
    import math

    if not opts.data:
        raise InvalidArgument("data", opts.data, "at least one training source (--data)")
    for name, lo in (("k", 0), ("l_max", 1), ("batch_size", 1), ("patience", 1), ("num_proc", 1),
                     ("tiny_hidden", 8), ("tiny_layers", 1), ("max_length", 2), ("prefix_max_tokens", 0),
                     ("seed", 0), ("split_seed", 0), ("test_fold", 0), ("eval_steps", 1), ("max_steps", 1),
                     ("min_tokens", 0), ("max_tokens", 1), ("limit", 1)):
        v = getattr(opts, name)
        if v is not None and v < lo:
            raise InvalidArgument(name, v, f"an integer >= {lo}")
    for name in ("seed", "split_seed"):  # numpy and torch seeds are 32-bit
        if getattr(opts, name) is not None and getattr(opts, name) >= 2**32:
            raise InvalidArgument(name, getattr(opts, name), f"an integer 0 .. {2**32 - 1}")
    if not (opts.epochs > 0 and math.isfinite(opts.epochs)):
        raise InvalidArgument("epochs", opts.epochs, "a number > 0")
    if not (opts.learning_rate > 0 and math.isfinite(opts.learning_rate)):
        raise InvalidArgument("learning_rate", opts.learning_rate, "a number > 0")
    for name in ("weight_decay", "warmup_ratio"):
        v = getattr(opts, name)
        if not (0 <= v and math.isfinite(v)) or (name == "warmup_ratio" and v >= 1):
            raise InvalidArgument(name, v, "a number >= 0" + (" and < 1" if name == "warmup_ratio" else ""))
    for name in ("test_fraction", "validation_fraction"):
        if not 0 <= getattr(opts, name) < 1:
            raise InvalidArgument(name, getattr(opts, name), "a share >= 0 and < 1")
    if opts.k > opts.l_max:
        raise InvalidArgument("k", opts.k, f"at most --l-max {opts.l_max}")


def check_out(opts: TrainOptions) -> None:
    """``--out`` is a directory path that holds no predictor yet (or ``--overwrite`` / ``--resume``)."""
    out = Path(opts.out)
    if out.exists() and not out.is_dir():
        raise InvalidArgument("out", opts.out, "a directory path (a file is in the way)")
    if (out / "config.json").is_file() and not (opts.overwrite or opts.resume):
        raise InvalidArgument("out", opts.out, "a directory without a predictor: it holds one already (pass "
                                                 "--overwrite to replace it, --resume to continue its training, or "
                                                 "another --out)")
