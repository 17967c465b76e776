"""The length-predictor protocol that engines, the simulator and the planner call.

A predictor answers, for each query (a prompt, and optionally the first tokens a completion has
already generated), how many tokens the completion still has to generate, and optionally
quantiles of that number, which the planner uses to reserve memory. The trained BERT predictor
(``predictor_training``) implements the same protocol; the oracles here are for simulation and
tests.
"""

from __future__ import annotations

import copy
import hashlib
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .errors import InvalidArgument, as_lengths, check_int, check_positive_float

__all__ = [
    "LengthPrediction",
    "LengthPredictor",
    "OracleLengthPredictor",
    "NoisyOracleLengthPredictor",
    "ConstantLengthPredictor",
    "copy_predictor",
]


@dataclass(frozen=True)
class LengthPrediction:
    """Predicted remaining tokens per query, and optional quantiles of it (q -> tokens)."""

    lengths: np.ndarray
    quantiles: Mapping[float, np.ndarray] = field(default_factory=dict)

    def quantile(self, q: float) -> np.ndarray:
        """The predicted q-quantile of the remaining length (tokens), as requested from ``predict``."""
        if q not in self.quantiles:
            raise InvalidArgument("q", q, "one of the quantiles requested: "
                                  + ", ".join(map(str, sorted(self.quantiles))))
        return self.quantiles[q]


@runtime_checkable
class LengthPredictor(Protocol):
    """Anything with this ``predict`` plugs into the planner and the simulator."""

    def predict(
        self,
        prompts: Sequence[Any],
        prefixes: Sequence[Any] | None = None,
        *,
        quantiles: Sequence[float] = (),
    ) -> LengthPrediction:
        """Predict remaining tokens for each ``prompts[i]`` after ``prefixes[i]`` (the token ids
        generated so far, or their count; None = nothing yet). Returns one value per prompt."""
        ...


def copy_predictor(predictor: Any) -> Any:
    """A copy of ``predictor`` that learns on its own (``observe`` changes only the copy), sharing the
    models it holds: an attribute that is itself a predictor (an online predictor's prior, a trained
    network, say) is not duplicated."""
    models = {id(v): v for v in vars(predictor).values() if hasattr(v, "predict")} if hasattr(predictor, "__dict__") \
        else {}
    return copy.deepcopy(predictor, models)


def _prefix_lengths(prompts: Sequence[Any], prefixes: Sequence[Any] | None) -> np.ndarray:
    if prefixes is None:
        return np.zeros(len(prompts), dtype=np.int64)
    if len(prefixes) != len(prompts):
        raise InvalidArgument("prefixes", f"{len(prefixes)} prefixes", f"{len(prompts)}, one per prompt")
    out = np.zeros(len(prompts), dtype=np.int64)
    for i, prefix in enumerate(prefixes):
        if prefix is None:
            continue
        if isinstance(prefix, (int, np.integer)) and not isinstance(prefix, bool) and prefix >= 0:
            out[i] = prefix
        elif hasattr(prefix, "__len__") and not isinstance(prefix, (str, bytes)):
            out[i] = len(prefix)
        else:
            raise InvalidArgument("prefixes", prefix, "token ids, a token count >= 0, or None")
    return out


def _check_quantiles(quantiles: Sequence[float]) -> list[float]:
    return [check_positive_float("quantiles", q, maximum=1.0 - 1e-12) for q in quantiles]


class OracleLengthPredictor:
    """Knows the true length of every completion: ``lengths[prompt]`` (a mapping, or a sequence
    indexed by completion number). Remaining = true length - prefix length, never below 0."""

    def __init__(self, lengths: Mapping[Hashable, int] | Sequence[int]):
        if isinstance(lengths, Mapping):
            self._truth = {k: check_int("lengths", v, minimum=1) for k, v in lengths.items()}
        else:
            self._truth = dict(enumerate(int(v) for v in as_lengths("lengths", lengths, minimum=1)))

    def _true_remaining(self, prompts: Sequence[Any], prefixes: Sequence[Any] | None) -> np.ndarray:
        missing = [p for p in prompts if p not in self._truth]
        if missing:
            raise InvalidArgument("prompts", missing[:3], "keys the oracle was built with")
        true = np.array([self._truth[p] for p in prompts], dtype=np.int64)
        return np.maximum(true - _prefix_lengths(prompts, prefixes), 0)

    def predict(self, prompts: Sequence[Any], prefixes: Sequence[Any] | None = None, *,
                quantiles: Sequence[float] = ()) -> LengthPrediction:
        remaining = self._true_remaining(prompts, prefixes)
        return LengthPrediction(remaining, {q: remaining.copy() for q in _check_quantiles(quantiles)})


def _stable_hash(key: Any) -> int:
    """A process-independent 63-bit hash of ``repr(key)`` (Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little") >> 1


#: The largest ``sigma`` of :class:`NoisyOracleLengthPredictor` (log-normal error of log length).
MAX_SIGMA = 5.0
#: The largest length a noisy prediction takes (2**53 tokens): the error is capped in log space.
MAX_PREDICTED_TOKENS = 2**53
_LOG_MAX_PREDICTED = math.log(MAX_PREDICTED_TOKENS)


class NoisyOracleLengthPredictor(OracleLengthPredictor):
    """The oracle with multiplicative log-normal error: remaining * exp(sigma * z), z ~ N(0, 1).

    z is drawn from a random stream seeded by (seed, prompt), so a prompt always gets the same
    error whatever else is asked and in whatever order. Quantiles are calibrated to this error
    model: the q-quantile is the prediction times exp(sigma * Phi^-1(q)). Predictions are rounded
    to whole tokens, at least 1 while the completion is unfinished. ``sigma`` is at most
    :data:`MAX_SIGMA` (5: one standard deviation is already a factor of 150), and the error is
    capped in log space at :data:`MAX_PREDICTED_TOKENS`, so a prediction is never a negative or
    overflowed integer.
    """

    def __init__(self, lengths: Mapping[Hashable, int] | Sequence[int], sigma: float, seed: int = 0):
        super().__init__(lengths)
        self.sigma = check_positive_float("sigma", sigma, maximum=MAX_SIGMA)
        self.seed = check_int("seed", seed, minimum=0)

    def _noise(self, prompts: Sequence[Any]) -> np.ndarray:
        return np.array([np.random.default_rng([self.seed, _stable_hash(p)]).standard_normal() for p in prompts])

    def predict(self, prompts: Sequence[Any], prefixes: Sequence[Any] | None = None, *,
                quantiles: Sequence[float] = ()) -> LengthPrediction:
        remaining = self._true_remaining(prompts, prefixes)
        raw = remaining * np.exp(np.minimum(self.sigma * self._noise(prompts), _LOG_MAX_PREDICTED))
        point = self._tokens(remaining, np.rint(raw))
        out = {}
        for q in _check_quantiles(quantiles):
            scale = math.exp(self.sigma * NormalDist().inv_cdf(q))  # sigma <= 5: at most exp(36)
            out[q] = self._tokens(remaining, np.ceil(raw * scale))
        return LengthPrediction(point, out)

    @staticmethod
    def _tokens(remaining: np.ndarray, value: np.ndarray) -> np.ndarray:
        """Whole tokens in [1, MAX_PREDICTED_TOKENS]; 0 where nothing remains."""
        return np.where(remaining > 0, np.clip(value, 1, MAX_PREDICTED_TOKENS), 0).astype(np.int64)


class ConstantLengthPredictor:
    """Predicts the same remaining length for every query (a no-information baseline)."""

    def __init__(self, length: int):
        self.length = check_int("length", length, minimum=1)

    def predict(self, prompts: Sequence[Any], prefixes: Sequence[Any] | None = None, *,
                quantiles: Sequence[float] = ()) -> LengthPrediction:
        remaining = np.maximum(self.length - _prefix_lengths(prompts, prefixes), 1)
        return LengthPrediction(remaining, {q: remaining.copy() for q in _check_quantiles(quantiles)})
