"""Training data for the length predictor: loaders, labels in policy tokens, hashed splits.

Every source is turned into one table (a :class:`datasets.Dataset`) with these columns:

``id``             stable prompt id (str); the split is a hash of it, so a prompt is never in two splits
``source``         where the row came from, e.g. ``castillo/Mbpp``, ``gsm8k``, ``lmsys``
``prompt``         the prompt text (str)
``prefix``         the first ``k`` generated tokens of a completion, as text ("" when k = 0)
``prefix_tokens``  how many policy tokens the prefix holds (k, or fewer where the text was shorter)
``prompt_tokens``  prompt length in policy tokens
``lengths``        total lengths of the completion(s) this row describes, in policy tokens; a row may
                   hold several samples of the same prompt (CASTILLO holds 10), which makes the target
                   a distribution
``remaining``      ``lengths - prefix_tokens``: what the predictor learns (tokens still to generate)

Formats (``FORMATS``) and what they need:

``castillo``  CASTILLO JSON (``prompt_id``, ``prompt_text``, ``input_size``, ``output_sizes``; for k > 0 also
              ``longest_response`` / ``shortest_response``). Counts are already in the policy's tokens
              (Qwen2.5-7B-Instruct), so no tokenizer is needed at k = 0.
``lmsys``     LMSYS-Chat-1M schema (``conversation_id``, ``model``, ``conversation`` [{role, content}],
              ``turn``, ``language``): the first user message and the first reply; parquet or JSON lines
              files, or the hub name ``lmsys/lmsys-chat-1m`` where the machine can reach the hub.
``gsm8k``     ``question`` / ``answer``.
``sharegpt``  ``id`` and ``conversations`` [{from: human|gpt, value}]: the first human turn and its reply.
``dolly``     ``instruction`` / ``context`` / ``response``.
``plain``     JSON lines with ``prompt`` and ``response`` or ``response_length`` (tokens), optional ``id``,
              ``prefix`` (text already generated) and ``prompt_tokens``: a user's own rollout logs. A
              ``step`` (the rollout step) may be present: training ignores it; the online evaluation
              (``lengthsched eval-predictor --online``) replays a prompt's steps as its history.

The k-token prefix of a text response is cut with the label (policy) tokenizer. With a response
length only (``response_length``, CASTILLO samples without text) no prefix exists; such rows are
kept at k = 0 and dropped at k > 0 (the completion's first tokens are unknown).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lengthsched.errors import InvalidArgument, LengthschedError

__all__ = [
    "FORMATS",
    "LMSYS_HUB_NAME",
    "DataError",
    "DataSpec",
    "LabelConfig",
    "CASTILLO_CAP",
    "load_source",
    "load_sources",
    "detect_format",
    "split_of",
    "assign_splits",
    "folds",
    "COLUMNS",
]

LMSYS_HUB_NAME = "lmsys/lmsys-chat-1m"
CASTILLO_CAP = 14999  # CASTILLO's sanitize rule: a sample this long hit max_new_tokens (runaway text)
COLUMNS = ("id", "source", "prompt", "prefix", "prefix_tokens", "prompt_tokens", "lengths", "remaining")


class DataError(LengthschedError, ValueError):
    """A dataset file that cannot be used: missing, unreadable, wrong schema, or empty after filters."""


# Fields a format must have (any one of the alternatives in a tuple); the first record is checked.
_REQUIRED: dict[str, tuple[Any, ...]] = {
    "castillo": ("prompt_id", "prompt_text", "input_size", "output_sizes"),
    "lmsys": ("conversation_id", "conversation"),
    "gsm8k": ("question", "answer"),
    "sharegpt": ("conversations",),
    "dolly": ("instruction", "response"),
    "plain": ("prompt", ("response", "response_length")),
}
FORMATS = tuple(_REQUIRED)


@dataclass(frozen=True)
class LabelConfig:
    """How labels are made.

    ``tokenizer``: the POLICY model's tokenizer (a ``transformers`` tokenizer object); lengths of text
    responses and the k-token prefix are counted in its tokens. ``k``: generated tokens the predictor
    sees (0 = prompt only). ``l_max``: the longest remaining length (tokens) a label may have;
    ``over_l_max`` says what a longer one does: ``error`` (default), ``clip`` to l_max, or ``drop`` the row.
    """

    tokenizer: Any = None
    k: int = 0
    l_max: int = 4096
    over_l_max: str = "error"

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, (int, np.integer)) or self.k < 0:
            raise InvalidArgument("k", self.k, "an integer >= 0 (generated tokens the predictor sees)")
        if isinstance(self.l_max, bool) or not isinstance(self.l_max, (int, np.integer)) or self.l_max < 1:
            raise InvalidArgument("l_max", self.l_max, "an integer >= 1 (tokens)")
        if self.over_l_max not in ("error", "clip", "drop"):
            raise InvalidArgument("over_l_max", self.over_l_max, "one of error, clip, drop")


@dataclass(frozen=True)
class DataSpec:
    """One data source: a path (file, directory of files, glob) or a hub name, its format and filters.

    ``fmt`` None detects the format from the first record. Filters (applied where the format has the
    field): ``models`` (LMSYS ``model``), ``languages`` (LMSYS ``language``), ``first_turn`` (LMSYS
    ``turn == 1``; every format uses the first exchange only), ``min_length`` / ``max_length`` (total
    completion tokens; a multi-sample row is kept when its mean is in range), ``limit`` (rows kept, in file
    order, after filters), ``streaming`` (hub names: iterate without downloading the whole dataset).
    """

    path: str
    fmt: str | None = None
    models: tuple[str, ...] = ()
    languages: tuple[str, ...] = ()
    first_turn: bool = True
    min_length: int = 1
    max_length: int | None = None
    limit: int | None = None
    streaming: bool = False

    @classmethod
    def parse(cls, text: str, **filters: Any) -> DataSpec:
        """``FORMAT:PATH`` or ``PATH`` (format detected), e.g. ``gsm8k:data/train.jsonl``."""
        fmt, sep, rest = text.partition(":")
        if sep and fmt in FORMATS:
            return cls(rest, fmt, **filters)
        return cls(text, None, **filters)


def _hash_unit(key: str, salt: str) -> float:
    digest = hashlib.blake2b(f"{salt}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


def split_of(prompt_id: str, test_fraction: float, validation_fraction: float = 0.0, seed: int = 0,
             fold: int = 0) -> str:
    """``train``, ``validation`` or ``test`` for a prompt id: a hash, so the same on every machine and
    run, and the same for every row (sample, prefix) of one prompt.

    The prompt's hash ``u`` is uniform in [0, 1); the test set is the slice
    ``[fold * test_fraction, (fold + 1) * test_fraction)``, so folds ``0 .. ceil(1 / test_fraction) - 1``
    are disjoint and together hold every prompt (cross-fitting: train once per fold). Validation takes
    the first ``validation_fraction`` of what is left, counted from the end of the test slice."""
    u = _hash_unit(str(prompt_id), f"lengthsched-split-{seed}")
    start = fold * test_fraction
    if test_fraction > 0 and int(u // test_fraction) == fold:  # the slices partition [0, 1) exactly
        return "test"
    rest = (u - start - test_fraction) % 1.0  # in [0, 1 - test_fraction) for every prompt not in the test slice
    if rest < validation_fraction * (1.0 - test_fraction):
        return "validation"
    return "train"


def folds(test_fraction: float) -> int:
    """How many disjoint test slices (``fold`` values) a test fraction gives: ``ceil(1 / test_fraction)``."""
    return max(1, math.ceil(1.0 / test_fraction - 1e-9)) if test_fraction > 0 else 1


def assign_splits(train_ids: Iterable[str], eval_ids: Iterable[str] | None, *, test_fraction: float,
                  validation_fraction: float, seed: int = 0, fold: int = 0) -> dict[str, str]:
    """The split of every prompt id. With no eval pool, a hashed ``test_fraction`` of the training
    pool is held out (the ``fold``-th slice, see :func:`split_of`). With an eval pool, its prompts are
    test, except prompts in both pools, which the hash sends half to test and half to training (``fold``
    0 or 1 picks which half). A prompt id never lands in two splits."""
    for name, value in (("test_fraction", test_fraction), ("validation_fraction", validation_fraction)):
        if not 0.0 <= value < 1.0:
            raise InvalidArgument(name, value, "a fraction in [0, 1)")
    n = folds(test_fraction if eval_ids is None else 0.5)
    if isinstance(fold, bool) or not isinstance(fold, (int, np.integer)) or not 0 <= fold < n:
        raise InvalidArgument("test_fold", fold, f"an integer in [0, {n - 1}]: the test set is one of {n} hashed "
                              f"slices of the prompts" + (" (prompts in both pools split in halves)"
                                                          if eval_ids is not None else ""))
    train_set, out = set(train_ids), {}
    if eval_ids is None:
        for pid in train_set:
            out[pid] = split_of(pid, test_fraction, validation_fraction, seed, fold)
        return out
    eval_set = set(eval_ids)
    for pid in eval_set - train_set:
        out[pid] = "test"
    for pid in train_set - eval_set:
        out[pid] = split_of(pid, 0.0, validation_fraction, seed)
    for pid in train_set & eval_set:
        out[pid] = split_of(pid, 0.5, validation_fraction, seed, fold)
    return out


# ---------------------------------------------------------------------------------------- reading


def _expand(path: str) -> list[str]:
    p = Path(path)
    if p.is_dir():
        files = sorted(str(f) for f in p.iterdir() if f.suffix in (".json", ".jsonl", ".parquet") and f.is_file())
    elif any(ch in path for ch in "*?["):
        files = sorted(str(f) for f in Path().glob(path)) if not p.is_absolute() else \
            sorted(str(f) for f in Path(p.anchor).glob(str(p.relative_to(p.anchor))))
    else:
        files = [path]
    if not files:
        raise DataError(f"data {path!r}: no .json, .jsonl or .parquet files found")
    for f in files:
        if not Path(f).is_file():
            raise DataError(f"data {f!r}: no such file (pass a file, a directory, a glob, or the hub name "
                            f"{LMSYS_HUB_NAME!r})")
    return files


def _looks_like_hub_name(path: str) -> bool:
    return not Path(path).exists() and path.count("/") == 1 and not path.startswith((".", "/")) \
        and not any(path.endswith(s) for s in (".json", ".jsonl", ".parquet"))


def _open_raw(spec: DataSpec):
    """A ``datasets`` dataset (or iterable dataset) of the source's raw records."""
    import datasets  # the heavy import stays out of `import predictor_training.data`

    datasets.disable_progress_bars()
    if _looks_like_hub_name(spec.path):
        try:
            return datasets.load_dataset(spec.path, split="train", streaming=spec.streaming)
        except (ConnectionError, OSError) as exc:
            raise DataError(
                f"data {spec.path!r}: cannot load it from the Hugging Face hub ({exc.__class__.__name__}: "
                f"{str(exc).splitlines()[0][:160]}); without network access, download it elsewhere and pass "
                f"local parquet or JSON lines files in the same schema (LMSYS-Chat-1M is gated: accept its "
                f"license and use your token where the hub is reachable)") from None
    files = _expand(spec.path)
    kind = "parquet" if all(f.endswith(".parquet") for f in files) else "json"
    try:
        return datasets.load_dataset(kind, data_files=files, split="train", streaming=spec.streaming)
    except Exception as exc:  # pyarrow / json errors come in many classes
        raise DataError(f"data {spec.path!r}: cannot read it as {kind} ({exc.__class__.__name__}: "
                        f"{str(exc).splitlines()[0][:200] if str(exc) else ''})") from None


def detect_format(record: dict[str, Any], path: str = "") -> str:
    """The format whose required fields the record has (raises :class:`DataError` if none fits)."""
    for fmt, required in _REQUIRED.items():
        if all(_has(record, r) for r in required):
            return fmt
    raise DataError(f"data {path!r}: unknown schema with fields {sorted(record)[:12]}; expected one of: "
                    + "; ".join(f"{fmt} ({', '.join(_name(r) for r in req)})" for fmt, req in _REQUIRED.items()))


def _has(record: dict[str, Any], req: Any) -> bool:
    return any(record.get(r) is not None for r in req) if isinstance(req, tuple) else req in record


def _name(req: Any) -> str:
    return " or ".join(req) if isinstance(req, tuple) else req


def _check_fields(record: dict[str, Any], fmt: str, path: str) -> None:
    for req in _REQUIRED[fmt]:
        if not _has(record, req):
            raise DataError(f"data {path!r}: field {_name(req)!r} missing for format {fmt!r} "
                            f"(the record has {sorted(record)[:12]})")


# ------------------------------------------------------------------------------------ per format
# Each returns (id, prompt, response text or None, list of total lengths or None, prompt tokens or None,
# prefix text or None) for one raw record, or None to skip the record.

Row = tuple[str, str, "str | None", "list[int] | None", "int | None", "str | None"]


def _castillo(rec: dict[str, Any], spec: DataSpec, k: int) -> Iterator[Row]:
    sizes = [int(s) for s in rec["output_sizes"]]
    if not sizes or max(sizes) >= CASTILLO_CAP:
        return  # a runaway sample at the 15000-token cap (CASTILLO's own sanitize rule)
    pid, prompt, ptok = str(rec["prompt_id"]), rec["prompt_text"], int(rec["input_size"])
    if k == 0:
        yield pid, prompt, None, sizes, ptok, None
        return
    # Only the longest and the shortest sample have text: each is one row with its own length.
    for key, size in (("longest_response", max(sizes)), ("shortest_response", min(sizes))):
        text = rec.get(key)
        if text:
            yield pid, prompt, text, [size], ptok, None


def _lmsys(rec: dict[str, Any], spec: DataSpec, k: int) -> Iterator[Row]:
    if spec.models and rec.get("model") not in spec.models:
        return
    if spec.languages and rec.get("language") not in spec.languages:
        return
    if spec.first_turn and rec.get("turn") not in (None, 1):
        return
    yield from _first_exchange(str(rec["conversation_id"]), rec["conversation"], "role", "content",
                               ("user",), ("assistant",))


def _sharegpt(rec: dict[str, Any], spec: DataSpec, k: int) -> Iterator[Row]:
    yield from _first_exchange(str(rec.get("id", "")), rec["conversations"], "from", "value",
                               ("human", "user"), ("gpt", "assistant", "chatgpt", "bard"))


def _first_exchange(cid: str, turns: Any, role_key: str, text_key: str, users: tuple[str, ...],
                    bots: tuple[str, ...]) -> Iterator[Row]:
    turns = list(turns or [])
    for i in range(len(turns) - 1):
        a, b = turns[i], turns[i + 1]
        if a.get(role_key) in users and b.get(role_key) in bots:
            if a.get(text_key) and b.get(text_key):
                yield cid or _digest(a[text_key]), a[text_key], b[text_key], None, None, None
            return


def _gsm8k(rec: dict[str, Any], spec: DataSpec, k: int) -> Iterator[Row]:
    yield _digest(rec["question"]), rec["question"], rec["answer"], None, None, None


def _dolly(rec: dict[str, Any], spec: DataSpec, k: int) -> Iterator[Row]:
    ctx = rec.get("context") or ""
    prompt = rec["instruction"] + ("\nContext: " + ctx if ctx else "")  # CASTILLO's own Dolly prompt form
    yield _digest(prompt), prompt, rec["response"], None, None, None


def _plain(rec: dict[str, Any], spec: DataSpec, k: int) -> Iterator[Row]:
    prompt = rec["prompt"]
    pid = str(rec["id"]) if rec.get("id") is not None else _digest(prompt)
    ptok = rec.get("prompt_tokens")
    if rec.get("response") is not None:
        yield pid, prompt, rec["response"], None, ptok, rec.get("prefix")
        return
    n = rec["response_length"]
    lengths = [int(x) for x in n] if isinstance(n, (list, tuple)) else [int(n)]
    yield pid, prompt, None, lengths, ptok, rec.get("prefix")


_READERS: dict[str, Callable[[dict[str, Any], DataSpec, int], Iterator[Row]]] = {
    "castillo": _castillo, "lmsys": _lmsys, "gsm8k": _gsm8k, "sharegpt": _sharegpt, "dolly": _dolly,
    "plain": _plain,
}


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _source_name(spec: DataSpec, fmt: str, rec: dict[str, Any]) -> str:
    if fmt == "castillo":
        return f"castillo/{rec.get('dataset', '?')}"
    return fmt


# ------------------------------------------------------------------------------------ labelling


def _count(tokenizer: Any, texts: list[str]) -> list[int]:
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def _label_rows(rows: list[tuple[str, str, Row]], labels: LabelConfig, path: str) -> dict[str, list[Any]]:
    """Count tokens, cut prefixes, make ``remaining``; one batch of rows (``(source, fmt, row)``)."""
    tok, k = labels.tokenizer, labels.k
    need_tok = any(r[2] is not None or r[4] is None or r[5] is not None for _, _, r in rows)
    if need_tok and tok is None:
        raise InvalidArgument("label_tokenizer", None, f"a tokenizer for {path!r}: its responses or prompts are "
                              "text without token counts, which must be counted in the policy model's tokens")
    out: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    # Response texts: total length (+1 for EOS, the convention of CASTILLO's counts) and the prefix.
    texts = [r[2] for _, _, r in rows]
    text_ids: list[list[int] | None] = [None] * len(rows)
    idx = [i for i, t in enumerate(texts) if t is not None]
    if idx:
        enc = tok([texts[i] for i in idx], add_special_tokens=False)["input_ids"]
        for i, ids in zip(idx, enc):
            text_ids[i] = ids
    prompt_missing = [i for i, (_, _, r) in enumerate(rows) if r[4] is None]
    prompt_counts = dict(zip(prompt_missing, _count(tok, [rows[i][2][1] for i in prompt_missing]))) \
        if prompt_missing else {}
    given_prefix = [i for i, (_, _, r) in enumerate(rows) if r[5] is not None]
    prefix_counts = dict(zip(given_prefix, _count(tok, [rows[i][2][5] for i in given_prefix]))) \
        if given_prefix else {}
    for i, (source, _fmt, (pid, prompt, _text, lengths, ptok, prefix)) in enumerate(rows):
        ids = text_ids[i]
        if lengths is None:
            lengths = [len(ids) + 1]  # + EOS
        if prefix is not None:  # the log says what was generated already: k is its length
            n_prefix = prefix_counts[i]
        elif k == 0:
            prefix, n_prefix = "", 0
        elif ids is None:
            continue  # a length without text: the first k tokens are unknown
        else:
            n_prefix = min(k, len(ids))
            prefix = tok.decode(ids[:n_prefix], skip_special_tokens=True)
        remaining = [n - n_prefix for n in lengths]
        if min(remaining) < 1:
            remaining = [r for r in remaining if r >= 1]  # finished inside the prefix: no longer running
            if not remaining:
                continue
        if max(remaining) > labels.l_max:
            if labels.over_l_max == "error":
                raise DataError(f"data {path!r}: prompt {pid!r} has a remaining length of {max(remaining)} tokens, "
                                f"above l_max={labels.l_max}; raise --l-max or pass --over-l-max clip|drop")
            if labels.over_l_max == "drop":
                continue
            remaining = [min(r, labels.l_max) for r in remaining]
        out["id"].append(pid)
        out["source"].append(source)
        out["prompt"].append(prompt)
        out["prefix"].append(prefix)
        out["prefix_tokens"].append(int(n_prefix))
        out["prompt_tokens"].append(int(ptok) if ptok is not None else prompt_counts[i])
        out["lengths"].append([int(n) for n in lengths])
        out["remaining"].append([int(r) for r in remaining])
    return out


def load_source(spec: DataSpec, labels: LabelConfig, *, batch_size: int = 512):
    """The labelled rows of one source as a :class:`datasets.Dataset` with :data:`COLUMNS`.

    Raises :class:`DataError` for a missing file, an unreadable one, a schema that does not fit, or a
    source with no rows left after the filters."""
    import datasets

    if spec.fmt is not None and spec.fmt not in FORMATS:
        raise InvalidArgument("format", spec.fmt, "one of " + ", ".join(FORMATS))
    if spec.limit is not None and spec.limit < 1:
        raise InvalidArgument("limit", spec.limit, "an integer >= 1 (rows)")
    raw = _open_raw(spec)
    fmt = spec.fmt
    pending: list[tuple[str, str, Row]] = []
    columns: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    kept = 0

    def flush() -> None:
        nonlocal pending
        if pending:
            part = _label_rows(pending, labels, spec.path)
            for c in COLUMNS:
                columns[c].extend(part[c])
            pending = []

    for rec in raw:
        if fmt is None:
            fmt = detect_format(rec, spec.path)
        _check_fields(rec, fmt, spec.path)
        for row in _READERS[fmt](rec, spec, labels.k):
            lengths = row[3]
            if lengths is not None and not _in_range(float(np.mean(lengths)), spec):
                continue
            pending.append((_source_name(spec, fmt, rec), fmt, row))
            kept += 1
        if len(pending) >= batch_size:
            flush()
        if spec.limit is not None and kept >= spec.limit:
            break
    flush()
    if spec.max_length is not None or spec.min_length > 1:  # text lengths are known only after counting
        keep = [i for i, n in enumerate(columns["lengths"]) if _in_range(float(np.mean(n)), spec)]
        columns = {c: [v[i] for i in keep] for c, v in columns.items()}
    if spec.limit is not None:
        columns = {c: v[: spec.limit] for c, v in columns.items()}
    if not columns["id"]:
        raise DataError(f"data {spec.path!r}: no rows left after the filters (format {fmt}, k={labels.k}, "
                        f"lengths {spec.min_length}..{spec.max_length or 'any'})")
    return datasets.Dataset.from_dict(columns, features=_features())


def _in_range(n: float, spec: DataSpec) -> bool:
    return n >= spec.min_length and (spec.max_length is None or n <= spec.max_length)


def _features():
    import datasets

    v = datasets.Value
    return datasets.Features({
        "id": v("string"), "source": v("string"), "prompt": v("string"), "prefix": v("string"),
        "prefix_tokens": v("int32"), "prompt_tokens": v("int32"),
        "lengths": datasets.Sequence(v("int32")), "remaining": datasets.Sequence(v("int32")),
    })


def load_sources(specs: Sequence[DataSpec], labels: LabelConfig):
    """All sources concatenated into one :class:`datasets.Dataset`."""
    import datasets

    if not specs:
        raise InvalidArgument("data", [], "at least one data file or hub name")
    parts = [load_source(s, labels) for s in specs]
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def write_jsonl(path: str | os.PathLike, records: Iterable[dict[str, Any]]) -> None:
    """Write JSON lines atomically (used by the CLI and the tests' generated files)."""
    from lengthsched.io import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
