"""The BERT-family length predictor: an encoder (``AutoModel``) with a length head.

Input: ``[CLS] prompt [SEP] prefix [SEP]`` in the encoder's tokenizer (token type 0 for the prompt, 1
for the prefix), plus two numbers the encoder cannot see after truncation: log(1 + prompt tokens) and
log(1 + prefix tokens), both in POLICY tokens. When the pair is longer than ``max_length`` the prompt
is truncated from the LEFT and the prefix is kept whole (up to ``prefix_max_tokens``): the prefix is
the strongest signal once k > 0, and the end of a prompt is where the actual question usually sits
(system text and pasted context come first).

Heads (``head``), all on the remaining length y >= 1 (tokens):

``regression``    a log-normal: mean mu and spread s of log y, trained by Gaussian negative log
                  likelihood; point = exp(mu) (the median), quantiles exp(mu + s * z_q).
``quantile``      log y at fixed levels (``quantile_levels``), monotone by construction, trained by
                  the pinball loss; other levels are interpolated in log space and held at the end
                  levels outside them.
``buckets-exact`` one class per exact remaining length 1..``exact_buckets`` (the reference design uses
                  1024; the last class means "that many or more"), cross-entropy.
``buckets-log``   ``log_buckets`` log-spaced classes from 1 to ``l_max``, cross-entropy.

Bucket heads give a distribution; its quantiles interpolate log-linearly inside a bucket. Every
head predicts the median as the point (the minimiser of absolute error) and any quantile asked for.
With several samples of one prompt (CASTILLO holds 10) the loss averages over all of them, so the
head learns the distribution, not one draw.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel

from lengthsched.errors import InvalidArgument

from .options import HEADS

__all__ = ["HEADS", "LengthPredictorConfig", "LengthPredictorModel", "encode_pairs", "bucket_edges",
           "distribution_quantiles"]

DEFAULT_LEVELS = (0.1, 0.25, 0.5, 0.75, 0.9)
_FEATURE_SCALE = 8.0  # log(1 + tokens) / 8 keeps the two numeric features near [0, 1.2]


class LengthPredictorConfig(PretrainedConfig):
    """Everything that defines a predictor besides its weights (saved as ``config.json``).

    ``encoder``: the encoder's config as a dict (``AutoConfig.to_dict()``); ``k``: generated tokens the
    predictor was trained to see; ``l_max``: the longest remaining length (tokens) it predicts;
    ``input_tokens`` / ``prefix_max_tokens``: encoder tokens of the input / of the prefix part;
    ``label_tokenizer``: a note of which tokenizer counted the labels (the policy's).
    """

    model_type = "lengthsched-length-predictor"

    def __init__(self, encoder: dict[str, Any] | None = None, head: str = "regression", k: int = 0,
                 l_max: int = 4096, quantile_levels: Sequence[float] = DEFAULT_LEVELS, exact_buckets: int = 1024,
                 log_buckets: int = 32, input_tokens: int = 256, prefix_max_tokens: int = 128, pool: str = "mean",
                 dropout: float = 0.1, label_tokenizer: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        if head not in HEADS:
            raise InvalidArgument("head", head, "one of " + ", ".join(HEADS))
        if pool not in ("mean", "cls"):
            raise InvalidArgument("pool", pool, "mean or cls")
        levels = sorted({float(q) for q in quantile_levels} | {0.5})
        if any(not 0.0 < q < 1.0 for q in levels):
            raise InvalidArgument("quantile_levels", list(quantile_levels), "levels strictly between 0 and 1")
        if input_tokens < 8 or prefix_max_tokens < 0 or prefix_max_tokens > input_tokens - 4:
            raise InvalidArgument("max_length", (input_tokens, prefix_max_tokens),
                                  "max_length >= 8 and 0 <= prefix_max_tokens <= max_length - 4 (encoder tokens)")
        self.encoder = dict(encoder or {})
        self.head = head
        self.k = int(k)
        self.l_max = int(l_max)
        self.quantile_levels = levels
        self.exact_buckets = int(min(exact_buckets, l_max))
        self.log_buckets = int(log_buckets)
        self.input_tokens = int(input_tokens)  # not `max_length`: transformers reserves it for generation
        self.prefix_max_tokens = int(prefix_max_tokens)
        self.pool = pool
        self.dropout = float(dropout)
        self.label_tokenizer = label_tokenizer

    @property
    def n_outputs(self) -> int:
        if self.head == "regression":
            return 2
        if self.head == "quantile":
            return len(self.quantile_levels)
        return len(bucket_edges(self)) - 1


def bucket_edges(config: LengthPredictorConfig) -> np.ndarray:
    """Bucket edges in tokens: class c holds remaining lengths in [edges[c], edges[c+1])."""
    if config.head == "buckets-exact":
        edges = np.arange(1, config.exact_buckets + 1, dtype=np.float64)
        return np.append(edges, float(config.l_max) + 1)
    if config.head == "buckets-log":
        edges = np.unique(np.round(np.geomspace(1, config.l_max + 1, config.log_buckets + 1)))
        edges[-1] = config.l_max + 1
        return edges.astype(np.float64)
    raise InvalidArgument("head", config.head, "a bucket head (buckets-exact or buckets-log)")


class LengthPredictorModel(PreTrainedModel):
    """Encoder + length head; ``forward`` returns ``{"loss", "logits"}`` for ``transformers.Trainer``.

    ``labels``: (batch, samples) remaining lengths in tokens, ``label_mask`` 1 where a sample exists.
    ``features``: (batch, 2) = log1p(prompt tokens) / 8, log1p(prefix tokens) / 8.
    """

    config_class = LengthPredictorConfig
    base_model_prefix = "predictor"
    _supports_sdpa = True

    def __init__(self, config: LengthPredictorConfig):
        super().__init__(config)
        if not config.encoder:
            raise InvalidArgument("encoder", config.encoder, "the encoder's config as a dict")
        enc = dict(config.encoder)
        self.encoder = AutoModel.from_config(AutoConfig.for_model(**enc))
        hidden = self.encoder.config.hidden_size
        self.head = nn.Sequential(nn.Dropout(config.dropout), nn.Linear(hidden + 2, hidden), nn.GELU(),
                                  nn.Dropout(config.dropout), nn.Linear(hidden, config.n_outputs))
        if config.head in ("buckets-exact", "buckets-log"):
            self.register_buffer("edges", torch.tensor(bucket_edges(config)), persistent=False)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear) and any(module is m for m in self.head.modules()):
            nn.init.normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)

    def init_head_from_targets(self, remaining: Sequence[Sequence[int]]) -> None:
        """Start the head at the training targets' marginal distribution (so step 0 already predicts
        like the best constant, and training only has to learn what the input adds)."""
        y = np.log(np.concatenate([np.asarray(r, dtype=np.float64) for r in remaining]).clip(min=1))
        last = self.head[-1]
        with torch.no_grad():
            last.weight.mul_(0.1)
            if self.config.head == "regression":
                last.bias.copy_(torch.tensor([np.median(y), _inv_softplus(max(np.std(y), 0.05))]))
            elif self.config.head == "quantile":
                qs = np.quantile(y, self.config.quantile_levels)
                steps = np.maximum(np.diff(qs), 1e-3)
                last.bias.copy_(torch.tensor(np.concatenate([[qs[0]], [_inv_softplus(d) for d in steps]])))
            else:
                edges = bucket_edges(self.config)
                counts = np.bincount(np.searchsorted(edges, np.exp(y), side="right") - 1,
                                     minlength=len(edges) - 1)[: len(edges) - 1]
                last.bias.copy_(torch.tensor(np.log((counts + 0.5) / (counts.sum() + 0.5 * len(counts)))))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, features: torch.Tensor,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                label_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None and getattr(self.encoder.config, "type_vocab_size", 0) > 1:
            kwargs["token_type_ids"] = token_type_ids
        hidden = self.encoder(**kwargs).last_hidden_state
        if self.config.pool == "cls":
            pooled = hidden[:, 0]
        else:
            m = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1)
        raw = self.head(torch.cat([pooled, features.to(pooled.dtype)], dim=-1))
        out = self._shape(raw)
        result = {"logits": out}
        if labels is not None:
            mask = label_mask if label_mask is not None else torch.ones_like(labels)
            result["loss"] = self._loss(out, labels.to(out.dtype), mask.to(out.dtype))
        return result

    def _shape(self, raw: torch.Tensor) -> torch.Tensor:
        """Raw head outputs -> parameters: (mu, s) | monotone log quantiles | logits."""
        if self.config.head == "regression":
            return torch.stack([raw[:, 0], nn.functional.softplus(raw[:, 1]) + 1e-3], dim=-1)
        if self.config.head == "quantile":
            return torch.cat([raw[:, :1], raw[:, :1] + torch.cumsum(nn.functional.softplus(raw[:, 1:]), -1)], -1)
        return raw

    def _loss(self, out: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n = mask.sum().clamp(min=1)
        if self.config.head == "regression":
            logy = torch.log(y.clamp(min=1))
            mu, s = out[:, :1], out[:, 1:]
            nll = torch.log(s) + 0.5 * ((logy - mu) / s) ** 2
            return (nll * mask).sum() / n
        if self.config.head == "quantile":
            logy = torch.log(y.clamp(min=1)).unsqueeze(-1)  # (B, S, 1)
            levels = torch.tensor(self.config.quantile_levels, dtype=out.dtype, device=out.device)
            diff = logy - out.unsqueeze(1)  # (B, S, Q)
            pinball = torch.maximum(levels * diff, (levels - 1) * diff).mean(-1)
            return (pinball * mask).sum() / n
        cls = torch.searchsorted(self.edges.to(y.dtype), y.clamp(min=1).contiguous(), right=True) - 1
        cls = cls.clamp(0, out.shape[-1] - 1)
        logp = torch.log_softmax(out, -1)
        nll = -torch.gather(logp, 1, cls.long())  # (B, S)
        return (nll * mask).sum() / n


def _inv_softplus(x: float) -> float:
    return float(x + math.log(-math.expm1(-x)))


def distribution_quantiles(config: LengthPredictorConfig, out: np.ndarray, levels: Sequence[float]) -> np.ndarray:
    """Quantiles (tokens, float) of the predicted remaining length: (batch, len(levels)).

    ``out`` is the model's ``logits`` (after ``_shape``) as float64 numpy."""
    levels = np.asarray(levels, dtype=np.float64)
    if config.head == "regression":
        from scipy.special import ndtri  # scipy: the normal quantile function, vectorised

        return np.exp(out[:, :1] + out[:, 1:2] * ndtri(levels)[None, :])
    if config.head == "quantile":
        known = np.asarray(config.quantile_levels)
        return np.exp(np.stack([np.interp(levels, known, row) for row in out]))
    edges = bucket_edges(config)
    z = out - out.max(-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(-1, keepdims=True)
    cdf = np.cumsum(p, -1)
    res = np.empty((len(out), len(levels)))
    loge = np.log(edges)
    for j, q in enumerate(levels):
        c = np.minimum((cdf < q).sum(-1), p.shape[-1] - 1)
        below = np.where(c > 0, cdf[np.arange(len(out)), c - 1], 0.0)
        frac = np.clip((q - below) / np.maximum(p[np.arange(len(out)), c], 1e-300), 0.0, 1.0)
        res[:, j] = np.exp(loge[c] + frac * (loge[c + 1] - loge[c]))
    return res


def encode_pairs(tokenizer: Any, prompts: Sequence[str], prefixes: Sequence[str], *, max_length: int,
                 prefix_max_tokens: int) -> dict[str, list[list[int]]]:
    """``[CLS] prompt [SEP] prefix [SEP]`` ids, token types and masks (no padding); the prompt is cut
    from the left so the prefix always fits (see the module docstring for why)."""
    p_ids = tokenizer(list(prompts), add_special_tokens=False, verbose=False)["input_ids"]
    x_ids = tokenizer([x or "" for x in prefixes], add_special_tokens=False, verbose=False)["input_ids"]
    cls = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    sep = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    if cls is None or sep is None:
        raise InvalidArgument("tokenizer", type(tokenizer).__name__, "a tokenizer with cls/sep (or bos/eos) tokens")
    out: dict[str, list[list[int]]] = {"input_ids": [], "token_type_ids": [], "attention_mask": []}
    for p, x in zip(p_ids, x_ids):
        x = x[:prefix_max_tokens]
        room = max_length - 2 - (len(x) + 1 if x else 0)
        p = p[len(p) - room:] if len(p) > room else p
        ids = [cls, *p, sep] + ([*x, sep] if x else [])
        out["input_ids"].append(ids)
        out["token_type_ids"].append([0] * (len(p) + 2) + [1] * (len(ids) - len(p) - 2))
        out["attention_mask"].append([1] * len(ids))
    return out


def features(prompt_tokens: Sequence[int], prefix_tokens: Sequence[int]) -> np.ndarray:
    """The two numeric inputs: log1p of prompt and prefix length (policy tokens), scaled."""
    return np.stack([np.log1p(np.asarray(prompt_tokens, dtype=np.float64)),
                     np.log1p(np.asarray(prefix_tokens, dtype=np.float64))], -1) / _FEATURE_SCALE


def collate(batch: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad a list of encoded rows (from :func:`encode_pairs` plus ``features`` and optional ``remaining``)."""
    n = max(len(r["input_ids"]) for r in batch)
    ids = torch.full((len(batch), n), pad_id, dtype=torch.long)
    tt = torch.zeros((len(batch), n), dtype=torch.long)
    am = torch.zeros((len(batch), n), dtype=torch.long)
    for i, r in enumerate(batch):
        m = len(r["input_ids"])
        ids[i, :m] = torch.tensor(r["input_ids"])
        tt[i, :m] = torch.tensor(r["token_type_ids"])
        am[i, :m] = 1
    out = {"input_ids": ids, "token_type_ids": tt, "attention_mask": am,
           "features": torch.tensor(np.asarray([r["features"] for r in batch]), dtype=torch.float32)}
    if "remaining" in batch[0]:
        s = max(len(r["remaining"]) for r in batch)
        y = torch.ones((len(batch), s))
        mask = torch.zeros((len(batch), s))
        for i, r in enumerate(batch):
            y[i, : len(r["remaining"])] = torch.tensor(r["remaining"], dtype=torch.float32)
            mask[i, : len(r["remaining"])] = 1
        out["labels"], out["label_mask"] = y, mask
    return out


# Known to the Auto classes, so that AutoConfig / AutoTokenizer read a predictor directory quietly.
AutoConfig.register(LengthPredictorConfig.model_type, LengthPredictorConfig, exist_ok=True)
