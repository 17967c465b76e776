"""Workloads: groups of completion lengths to simulate.

- :func:`castillo_groups`: REAL groups, the primary workload. CASTILLO sampled 10 completions
  per prompt from Qwen2.5-7B-Instruct; a group of G > 10 resamples those 10 lengths with
  replacement (G <= 10 takes G of them without replacement), from its own random stream.
- :func:`castillo_file_groups`: the same from a CASTILLO file of your own (a split or a dataset
  that is not bundled).
- :func:`trace_groups`: one-length-per-prompt traces (LMSYS-Chat vicuna-13b, Azure conversation
  2023) turned into groups by a documented group model: the trace length is the prompt's median
  length and the G lengths are ``median * exp(sigma * z)``, z ~ N(0, 1), with sigma the median
  within-prompt standard deviation of log length in CASTILLO (:func:`castillo_spread`).
- :func:`load_trace` / :func:`write_trace`: a JSON-lines trace format for a user's own rollout
  logs, one group per line: ``{"prompt_id": ..., "prompt_tokens": P, "lengths": [...],
  "predicted": [...], "step": S}`` (``predicted`` and ``step``, the rollout step the group was
  drawn in, optional: the same prompt in several steps is its history, which
  ``lengthsched.OnlineLengthPredictor`` learns from).

Lengths above ``max_new_tokens`` are clipped to it (a completion stops at L_max), except in
:func:`load_trace`, which rejects them: a logged length above the limit means a wrong limit.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from lengthsched import InvalidArgument, LengthschedError
from lengthsched.errors import as_lengths, check_int
from lengthsched.io import DATA_DIR as CORE_DATA_DIR
from lengthsched.io import atomic_write_text

__all__ = [
    "Group",
    "TraceError",
    "WORKLOADS",
    "castillo_groups",
    "castillo_file_groups",
    "castillo_prompt_tokens", "castillo_spread", "castillo_validate_lengths", "prompt_lengths",
    "trace_groups",
    "load_trace",
    "write_trace",
    "make_workload",
    "history_predictions",
]

DATA_DIR = Path(__file__).with_name("data")
CASTILLO_FILE = CORE_DATA_DIR / "castillo_qwen2.5-7b_lengths.jsonl"
CASTILLO_CAP = 15001  # CASTILLO's marker of a sample that hit its 15,000-token limit


class TraceError(LengthschedError):
    """A trace file line is malformed; the message names the file, the line and the field."""


@dataclass(frozen=True)
class Group:
    """One prompt's group: ``lengths`` (tokens) of its G completions, ``prompt_len`` (tokens),
    optional ``predicted`` lengths, and where it came from."""

    prompt_id: str
    prompt_len: int
    lengths: np.ndarray
    predicted: np.ndarray | None = None
    source: str = ""
    step: int | None = None  # the rollout step it was drawn in (rollout logs), if known


@lru_cache(maxsize=1)
def _castillo_rows() -> tuple[dict, ...]:
    with open(CASTILLO_FILE, encoding="utf-8") as handle:
        return tuple(json.loads(line) for line in handle)


def castillo_validate_lengths() -> list[list[int]]:
    """The sibling lengths (tokens) of every bundled CASTILLO prompt of the validate split."""
    return [list(r["lengths"]) for r in _castillo_rows() if r.get("split") == "validate"]


def castillo_prompt_tokens() -> np.ndarray:
    """The prompt lengths (tokens) of every bundled CASTILLO prompt (train and validate), in file order:
    real prompts of code and instruction tasks (median 172 tokens) to give a trace without prompt
    lengths (:func:`trace_groups` ``prompt_tokens``)."""
    return np.array([int(r["prompt_tokens"]) for r in _castillo_rows()], dtype=np.int64)


def castillo_spread() -> float:
    """Median over CASTILLO prompts of the standard deviation of log completion length."""
    spreads = [np.std(np.log(r["lengths"])) for r in _castillo_rows() if max(r["lengths"]) < CASTILLO_CAP]
    return float(np.median(spreads))


def _resample(rng: np.random.Generator, lengths: Sequence[int], size: int) -> np.ndarray:
    pool = np.asarray(lengths, dtype=np.int64)
    return rng.choice(pool, size=size, replace=size > len(pool))


def castillo_groups(
    group_size: int = 32,
    *,
    max_new_tokens: int = 4096,
    datasets: Iterable[str] | None = None,
    splits: Iterable[str] | None = None,
    limit: int | None = None,
    seed: int = 0,
    epoch: int = 0,
) -> list[Group]:
    """Real groups from CASTILLO (bundled), lengths clipped to ``max_new_tokens``.

    ``datasets``: any of Apps, BigCodeBench, DS1000, Mbpp, DollyDataset (default all);
    ``splits``: train / validate (default both); ``limit``: at most this many prompts, drawn at
    random (seeded) from those selected. ``epoch``: the same prompts (they depend on ``seed`` only)
    with their completions drawn afresh, as RL revisits its prompts every epoch (0: the default
    draw; a policy that changes between epochs is not modelled).
    """
    group_size = check_int("group_size", group_size, minimum=1)
    max_new = check_int("max_new_tokens", max_new_tokens, minimum=1)
    rows = list(_castillo_rows())
    known = sorted({r["dataset"] for r in rows})
    if datasets is not None:
        wanted = set(datasets)
        if not wanted or wanted - set(known):
            raise InvalidArgument("datasets", sorted(wanted), "names among " + ", ".join(known))
        rows = [r for r in rows if r["dataset"] in wanted]
    if splits is not None:
        wanted = set(splits)
        if not wanted or wanted - {"train", "validate"}:
            raise InvalidArgument("splits", sorted(wanted), "train and/or validate")
        rows = [r for r in rows if r["split"] in wanted]
    return _sample_groups(rows, group_size, max_new, limit, seed, epoch)


def _epoch_stream(seed: int, kind: int, index: int, epoch: int) -> np.random.Generator:
    """The random stream of one prompt's completions in ``epoch`` (checked by the caller; epoch 0
    keeps the original draw)."""
    return np.random.default_rng([seed, kind, index] + ([epoch] if epoch else []))


def _sample_groups(rows: Sequence[dict], group_size: int, max_new: int, limit: int | None, seed: int,
                   epoch: int = 0) -> list[Group]:
    """Groups of ``group_size`` from rows with ``prompt_id``, ``prompt_tokens``, ``lengths``,
    ``dataset`` and ``split``: ``limit`` rows drawn at random (seeded), each resampled from its own
    random stream (see the module docstring), one per ``epoch``."""
    epoch = check_int("epoch", epoch, minimum=0)
    order = np.random.default_rng([seed, 0]).permutation(len(rows))
    if limit is not None:
        order = order[: check_int("limit", limit, minimum=1)]
    groups = []
    for i in order:
        r = rows[int(i)]
        lengths = np.minimum(_resample(_epoch_stream(seed, 1, int(i), epoch), r["lengths"], group_size), max_new)
        groups.append(Group(r["prompt_id"], int(r["prompt_tokens"]), lengths,
                            source=f"castillo/{r['dataset']}/{r['split']}"))
    return groups


def castillo_file_groups(
    path: str | os.PathLike,
    group_size: int = 32,
    *,
    max_new_tokens: int = 4096,
    limit: int | None = None,
    seed: int = 0,
    epoch: int = 0,
) -> list[Group]:
    """Real groups from a CASTILLO file of your own, as :func:`castillo_groups` draws them from the
    bundled one: ``path`` is one of CASTILLO's preprocessed files (a JSON list, one object per
    prompt with ``prompt_id``, ``input_size`` in tokens, ``output_sizes``: the lengths of its
    sampled completions in tokens, and optionally ``dataset``), e.g. a split or a dataset that is
    not bundled (CASTILLO's ShareGPT prompts have no clear license, so they are not shipped:
    evaluate on them locally). Lengths are clipped to ``max_new_tokens``."""
    group_size = check_int("group_size", group_size, minimum=1)
    max_new = check_int("max_new_tokens", max_new_tokens, minimum=1)
    file = Path(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidArgument("path", str(path), f"a readable CASTILLO JSON file ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument("path", str(path), f"a CASTILLO JSON file (not JSON: {exc})") from None
    if not isinstance(data, list) or not data:
        raise InvalidArgument("path", str(path), "a JSON list of CASTILLO prompts (one object per prompt)")
    rows = []
    for k, item in enumerate(data):
        where = f"{file.name}, prompt {k}"
        if not isinstance(item, dict) or not {"prompt_id", "input_size", "output_sizes"} <= set(item):
            raise InvalidArgument("path", where, "an object with prompt_id, input_size and output_sizes")
        lengths = as_lengths(f"output_sizes ({where})", item["output_sizes"], minimum=1)
        prompt = check_int(f"input_size ({where})", item["input_size"], minimum=0)
        rows.append({"prompt_id": str(item["prompt_id"])[:16], "prompt_tokens": prompt, "lengths": lengths,
                     "dataset": str(item.get("dataset", file.stem)), "split": "file"})
    return _sample_groups(rows, group_size, max_new, limit, seed, epoch)


@lru_cache(maxsize=2)
def _trace(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(prompt tokens, generated tokens) per request of a bundled single-length trace."""
    if name == "lmsys":
        with gzip.open(DATA_DIR / "lmsys_vicuna13b_lengths.txt.gz", "rt") as handle:
            generated = np.array([int(x) for x in handle.read().split()], dtype=np.int64)
        return np.zeros_like(generated), generated  # no prompt lengths in this trace
    with gzip.open(DATA_DIR / "azure_conv_2023_lengths.csv.gz", "rt") as handle:
        data = np.loadtxt(handle, delimiter=",", skiprows=1, dtype=np.int64)
    return data[:, 0], data[:, 1]


def trace_groups(
    name: str,
    group_size: int = 32,
    *,
    max_new_tokens: int = 4096,
    spread: float | None = None,
    limit: int | None = 500,
    seed: int = 0,
    epoch: int = 0,
    prompt_tokens: Sequence[int] | None = None,
) -> list[Group]:
    """Groups from a single-length trace (``lmsys`` or ``azure``) by the log-normal group model.

    ``spread``: sigma of log length within a group (default :func:`castillo_spread`). ``epoch``: the
    same prompts with fresh completions, as for :func:`castillo_groups`. ``prompt_tokens``: prompt
    lengths (tokens) each group draws its own from, at random (seeded by ``seed`` and the group's
    request in the trace, the same in every epoch), instead of the trace's: the ``lmsys`` trace has
    none (its prompts take 0 tokens), so its groups then cost a prompt's prefill and KV as real
    prompts do (e.g. :func:`castillo_prompt_tokens`).
    """
    if name not in ("lmsys", "azure"):
        raise InvalidArgument("name", name, "'lmsys' or 'azure'")
    drawn = None
    if prompt_tokens is not None:
        drawn = np.asarray(prompt_tokens)
        if drawn.ndim != 1 or not len(drawn) or not np.issubdtype(drawn.dtype, np.integer) or (drawn < 0).any():
            raise InvalidArgument("prompt_tokens", prompt_tokens, "a non-empty sequence of integers >= 0 (tokens)")
    group_size = check_int("group_size", group_size, minimum=1)
    max_new = check_int("max_new_tokens", max_new_tokens, minimum=1)
    sigma = castillo_spread() if spread is None else float(spread)
    if not math.isfinite(sigma) or sigma < 0:
        raise InvalidArgument("spread", spread, "a number >= 0 (sigma of log length)")
    prompts, generated = _trace(name)
    epoch = check_int("epoch", epoch, minimum=0)
    order = np.random.default_rng([seed, 0]).permutation(len(generated))
    if limit is not None:
        order = order[: check_int("limit", limit, minimum=1)]
    groups = []
    for i in order:
        z = _epoch_stream(seed, 2, int(i), epoch).standard_normal(group_size)
        lengths = np.clip(np.rint(generated[i] * np.exp(sigma * z)), 1, max_new).astype(np.int64)
        prompt = prompts[i] if drawn is None else drawn[np.random.default_rng([seed, 3, int(i)]).integers(len(drawn))]
        groups.append(Group(f"{name}-{int(i)}", int(prompt), lengths, source=f"{name} (sigma {sigma:.3f})"))
    return groups


def _field(path: str, line: int, record: dict, name: str, check, required: bool = True) -> Any:
    if name not in record:
        if required:
            raise TraceError(f"{path} line {line}: field '{name}' is missing")
        return None
    try:
        return check(record[name])
    except InvalidArgument as exc:
        raise TraceError(f"{path} line {line}: field '{name}': {exc.expected}, got {record[name]!r:.60}") from None


def load_trace(path: str | os.PathLike, *, max_new_tokens: int | None = None) -> list[Group]:
    """Read a JSON-lines trace; errors name the file, the line and the field."""
    path = str(path)
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read the trace ({exc.__class__.__name__}: {exc})") from None
    groups = []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path} line {number}: not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise TraceError(f"{path} line {number}: expected a JSON object, got {type(record).__name__}")
        lengths = _field(path, number, record, "lengths", lambda v: as_lengths("lengths", v, minimum=1))
        prompt_len = _field(path, number, record, "prompt_tokens", lambda v: check_int("prompt_tokens", v, minimum=0))
        prompt_id = _field(path, number, record, "prompt_id", lambda v: str(v))
        predicted = _field(path, number, record, "predicted", lambda v: as_lengths("predicted", v, minimum=1),
                           required=False)
        if predicted is not None and len(predicted) != len(lengths):
            raise TraceError(f"{path} line {number}: field 'predicted' has {len(predicted)} values for "
                             f"{len(lengths)} lengths")
        step = _field(path, number, record, "step", lambda v: check_int("step", v, minimum=0), required=False)
        if max_new_tokens is not None and lengths.max() > max_new_tokens:
            raise TraceError(f"{path} line {number}: field 'lengths' has {int(lengths.max())} > "
                             f"max_new_tokens={max_new_tokens}")
        groups.append(Group(prompt_id, prompt_len, lengths, predicted, source=path, step=step))
    if not groups:
        raise TraceError(f"{path}: the trace holds no groups")
    return groups


def write_trace(path: str | os.PathLike, groups: Sequence[Group]) -> None:
    """Write groups as a JSON-lines trace (atomically)."""
    lines = []
    for g in groups:
        record = {"prompt_id": g.prompt_id, "prompt_tokens": int(g.prompt_len),
                  "lengths": [int(x) for x in g.lengths]}
        if g.predicted is not None:
            record["predicted"] = [int(x) for x in g.predicted]
        if g.step is not None:
            record["step"] = int(g.step)
        lines.append(json.dumps(record))
    atomic_write_text(path, "\n".join(lines) + "\n")


WORKLOADS = ("castillo", "lmsys", "azure")


def prompt_lengths(value: Any) -> np.ndarray | None:
    """The prompt lengths (tokens) a ``--prompt-tokens`` value names: None (the workload's own), "castillo"
    (:func:`castillo_prompt_tokens`), or a number of tokens >= 1 (every prompt that long)."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip() == "castillo":
        return castillo_prompt_tokens()
    try:
        tokens = int(str(value).strip())
    except ValueError:
        tokens = 0
    if tokens < 1 or str(tokens) != str(value).strip():
        raise InvalidArgument("prompt_tokens", value, "'castillo' (the bundled CASTILLO prompts' lengths) or a "
                                                      "number of tokens >= 1")
    return np.array([tokens], dtype=np.int64)


def make_workload(name: str, group_size: int, *, max_new_tokens: int, limit: int | None, seed: int,
                  spread: float | None = None, epoch: int = 0, prompt_tokens: Any = None) -> list[Group]:
    """A named workload (:data:`WORKLOADS`) or a trace file path. ``epoch``: the same prompts with
    fresh completions (:func:`castillo_groups`; a trace file holds one draw: 0 only). ``prompt_tokens``
    (lmsys and azure only, :func:`prompt_lengths`): each group's prompt length drawn from these instead of
    the trace's (the lmsys trace has none: its prompts take 0 tokens)."""
    drawn = prompt_lengths(prompt_tokens)
    if drawn is not None and name not in ("lmsys", "azure"):
        raise InvalidArgument("prompt_tokens", prompt_tokens, "no prompt lengths for the workload "
                                                              f"{name!r}: it has its own (lmsys and azure only)")
    if name == "castillo":
        if spread is not None:
            raise InvalidArgument("spread", spread, "no spread for the real CASTILLO groups")
        return castillo_groups(group_size, max_new_tokens=max_new_tokens, limit=limit, seed=seed, epoch=epoch)
    if name in ("lmsys", "azure"):
        return trace_groups(name, group_size, max_new_tokens=max_new_tokens, spread=spread, limit=limit, seed=seed,
                            epoch=epoch, prompt_tokens=drawn)
    if not Path(name).exists():
        raise InvalidArgument("workload", name, "castillo, lmsys, azure or a trace .jsonl path")
    if check_int("epoch", epoch, minimum=0):
        raise InvalidArgument("epoch", epoch, f"0 for a trace file ({name} holds one draw of each group's "
                                              "completions: no earlier epoch to learn from)")
    groups = load_trace(name, max_new_tokens=max_new_tokens)
    return groups if limit is None else groups[:limit]


def history_predictions(groups: Sequence[Group], before: Sequence[Group], prior: Any, *,
                        max_new_tokens: int) -> np.ndarray:
    """Per completion of ``groups`` (flattened in group order; tokens, >= 1), what
    :class:`lengthsched.OnlineLengthPredictor` predicts at the start of a rollout step after it saw
    every completion of the same prompts one epoch earlier: ``before`` (the same prompts, e.g.
    ``castillo_groups(..., epoch=1)``; its laws fitted on them), ``prior`` (per prompt id, a
    prompt-level prediction in tokens, its prior). The same number for every sibling: nothing of
    this step is revealed yet."""
    from lengthsched import OnlineLengthPredictor

    max_new = check_int("max_new_tokens", max_new_tokens, minimum=1)
    ids = [g.prompt_id for g in groups]
    if sorted(ids) != sorted(g.prompt_id for g in before):
        raise InvalidArgument("before", f"{len(before)} groups", f"the step's {len(groups)} prompts one epoch "
                                                                 "earlier (the same prompt ids)")
    if not isinstance(prior, dict) or any(i not in prior for i in ids):
        raise InvalidArgument("prior", type(prior).__name__, "a mapping prompt id -> tokens for every prompt")
    predictor = OnlineLengthPredictor.fit({g.prompt_id: g.lengths.tolist() for g in before}, prior=prior,
                                          max_new_tokens=max_new)
    for g in before:
        for length in g.lengths.tolist():
            predictor.observe(g.prompt_id, int(length))
    predictor.set_step(1)
    asked = [g.prompt_id for g in groups for _ in g.lengths]
    return np.maximum(1, np.round(predictor.predict(asked).lengths)).astype(np.int64)
