"""``BertLengthPredictor``: a trained predictor directory behind the ``lengthsched`` predictor protocol."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lengthsched.errors import InvalidArgument
from lengthsched.predictor import LengthPrediction

from .model import LengthPredictorModel, collate, distribution_quantiles, encode_pairs, features

__all__ = ["BertLengthPredictor", "LABEL_TOKENIZER_DIR"]

LABEL_TOKENIZER_DIR = "label_tokenizer"


class BertLengthPredictor:
    """Predicts remaining completion lengths (tokens) from prompts and optional generated prefixes.

    Implements :class:`lengthsched.predictor.LengthPredictor`: ``predict(prompts, prefixes,
    quantiles=...)`` returns the predicted median of the remaining length (tokens, >= 1, <= l_max) and
    the requested quantiles (rounded up, so a reservation by a quantile is conservative). Inference
    is batched (``batch_size`` rows, sorted by input length to pad little) on ``device`` (default:
    CUDA when available, else CPU).

    A prefix may be text, the policy model's token ids (decoded with the saved label tokenizer), or a
    bare count of generated tokens (then only the count is used). Prompt lengths in policy tokens are
    counted with the label tokenizer (the encoder's tokenizer when none was saved) unless given.
    """

    def __init__(self, model: LengthPredictorModel, tokenizer: Any, label_tokenizer: Any = None,
                 device: str | None = None, batch_size: int = 64):
        import torch

        if batch_size < 1:
            raise InvalidArgument("batch_size", batch_size, "an integer >= 1 (rows per forward pass)")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = model.to(self.device).eval()
        self.config = model.config
        self.tokenizer = tokenizer
        self.label_tokenizer = label_tokenizer if label_tokenizer is not None else tokenizer
        self.batch_size = batch_size

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str | None = None, batch_size: int = 64,
                        dtype: Any = None) -> BertLengthPredictor:
        """Load a directory written by ``lengthsched train`` (or :func:`save`)."""
        from transformers import AutoTokenizer

        p = Path(path)
        if not (p / "config.json").is_file():
            raise InvalidArgument("model", str(path), "a directory written by `lengthsched train` (with config.json)")
        config = json.loads((p / "config.json").read_text())
        if config.get("model_type") != "lengthsched-length-predictor":
            raise InvalidArgument("model", str(path), f"a length predictor directory (config model_type is "
                                  f"{config.get('model_type')!r}, expected 'lengthsched-length-predictor')")
        model = LengthPredictorModel.from_pretrained(str(p), **({"dtype": dtype} if dtype is not None else {}))
        tok = AutoTokenizer.from_pretrained(str(p))
        label = AutoTokenizer.from_pretrained(str(p / LABEL_TOKENIZER_DIR)) \
            if (p / LABEL_TOKENIZER_DIR).is_dir() else None
        return cls(model, tok, label, device=device, batch_size=batch_size)

    def save(self, path: str | Path) -> None:
        """Write the model, its tokenizer and the label tokenizer into ``path``."""
        p = Path(path)
        self.model.save_pretrained(str(p))
        self.tokenizer.save_pretrained(str(p))
        if self.label_tokenizer is not self.tokenizer:
            self.label_tokenizer.save_pretrained(str(p / LABEL_TOKENIZER_DIR))

    # -------------------------------------------------------------------------------- inputs

    def _prefix_text_and_count(self, prefixes: Sequence[Any] | None, n: int) -> tuple[list[str], np.ndarray]:
        if prefixes is None:
            return [""] * n, np.zeros(n, dtype=np.int64)
        if len(prefixes) != n:
            raise InvalidArgument("prefixes", f"{len(prefixes)} prefixes", f"{n}, one per prompt")
        texts, counts = [], np.zeros(n, dtype=np.int64)
        for i, x in enumerate(prefixes):
            if x is None:
                texts.append("")
            elif isinstance(x, str):
                texts.append(x)
                counts[i] = len(self.label_tokenizer(x, add_special_tokens=False)["input_ids"]) if x else 0
            elif isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 0:
                texts.append("")
                counts[i] = int(x)
            elif hasattr(x, "__len__"):
                ids = [int(t) for t in x]
                texts.append(self.label_tokenizer.decode(ids, skip_special_tokens=True))
                counts[i] = len(ids)
            else:
                raise InvalidArgument("prefixes", x, "text, the policy's token ids, a token count >= 0, or None")
        return texts, counts

    def _prompt_texts(self, prompts: Sequence[Any]) -> list[str]:
        out = []
        for p in prompts:
            if not isinstance(p, str):
                raise InvalidArgument("prompts", p, "prompt text (str)")
            out.append(p)
        return out

    # ----------------------------------------------------------------------------- inference

    def raw_outputs(self, prompts: Sequence[str], prefixes: Sequence[Any] | None = None,
                    prompt_tokens: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The head's parameters per query (float64, see :func:`distribution_quantiles`) and the prefix
        counts (policy tokens)."""
        import torch

        texts = self._prompt_texts(prompts)
        n = len(texts)
        prefix_texts, prefix_counts = self._prefix_text_and_count(prefixes, n)
        if prompt_tokens is None:
            prompt_tokens = [len(ids) for ids in self.label_tokenizer(texts, add_special_tokens=False,
                                                                      verbose=False)["input_ids"]] if n else []
        elif len(prompt_tokens) != n:
            raise InvalidArgument("prompt_tokens", f"{len(prompt_tokens)} counts", f"{n}, one per prompt")
        if n == 0:
            return np.zeros((0, self.config.n_outputs)), prefix_counts
        enc = encode_pairs(self.tokenizer, texts, prefix_texts, max_length=self.config.input_tokens,
                           prefix_max_tokens=self.config.prefix_max_tokens)
        feats = features(prompt_tokens, prefix_counts)
        rows = [{"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
                 "features": feats[i]} for i in range(n)]
        order = np.argsort([len(r["input_ids"]) for r in rows], kind="stable")
        out = np.zeros((n, self.config.n_outputs))
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        with torch.inference_mode():
            for start in range(0, n, self.batch_size):
                idx = order[start: start + self.batch_size]
                batch = {k: v.to(self.device) for k, v in collate([rows[i] for i in idx], pad).items()}
                out[idx] = self.model(**batch)["logits"].double().cpu().numpy()
        return out, prefix_counts

    def predict(self, prompts: Sequence[Any], prefixes: Sequence[Any] | None = None, *,
                quantiles: Sequence[float] = (), prompt_tokens: Sequence[int] | None = None) -> LengthPrediction:
        """Predicted remaining tokens (the median) and the requested quantiles, per prompt."""
        levels = [float(q) for q in quantiles]
        for q in levels:
            if not 0.0 < q < 1.0:
                raise InvalidArgument("quantiles", q, "levels strictly between 0 and 1")
        raw, _ = self.raw_outputs(prompts, prefixes, prompt_tokens)
        qs = distribution_quantiles(self.config, raw, [0.5, *levels]) if len(raw) else np.zeros((0, 1 + len(levels)))
        cap = self.config.l_max
        point = np.clip(np.rint(qs[:, 0]), 1, cap).astype(np.int64)
        return LengthPrediction(point, {q: np.clip(np.ceil(qs[:, j + 1]), 1, cap).astype(np.int64)
                                        for j, q in enumerate(levels)})
