"""Accuracy of length predictors, the baselines they must beat, and the noise ceiling.

A test row may hold several samples of one prompt (CASTILLO holds 10). Every metric is computed over
(prediction, sample) pairs: each sample of a prompt is scored against that prompt's prediction. The
noise ceiling scores each sample against a SIBLING sample of the same prompt (sample j predicted by
sample j+1), i.e. how well a perfect per-prompt predictor that only sees one draw can do.

Metrics (lengths in tokens): MAE, RMSE, SMAPE (percent, 2|p-y|/(p+y)), Kendall tau-b and Spearman
rho (scipy), accuracy within +-10 tokens, the share in the same log-spaced bucket and within one
bucket (32 log buckets from 1 to l_max), and the coverage of each predicted quantile (share of
samples at or below it; a calibrated q-quantile covers q).

Baselines, fitted on the training split: ``constant`` (the median remaining length), ``linear``
(least squares of log remaining length on log prompt and prefix length), ``tfidf`` (TF-IDF of prompt
and prefix words + ridge regression on log mean remaining length, scikit-learn). Each baseline's
quantiles come from the quantiles of its training residuals in log space.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lengthsched.errors import InvalidArgument, check_int

__all__ = ["METRICS", "Predictions", "score", "score_by_source", "noise_ceiling", "ConstantBaseline",
           "LinearBaseline", "TfidfBaseline", "BASELINES", "predictor_predictions", "reference_results", "format_table",
           "format_legend", "verdict", "log_bucket_edges", "tau_difference"]

METRICS = ("n", "mae", "rmse", "smape", "kendall_tau_b", "spearman", "within_10", "same_bucket",
           "within_1_bucket")
DEFAULT_LEVELS = (0.1, 0.5, 0.9)


def log_bucket_edges(l_max: int, n: int = 32) -> np.ndarray:
    """``n`` log-spaced buckets over 1..l_max tokens (the edges the bucket metrics use)."""
    edges = np.unique(np.round(np.geomspace(1, l_max + 1, n + 1)))
    edges[-1] = np.inf
    return edges


@dataclass
class Predictions:
    """Point predictions (tokens) per row and optional quantiles (level -> tokens per row)."""

    point: np.ndarray
    quantiles: dict[float, np.ndarray] = field(default_factory=dict)


def _pairs(truth: Sequence[Sequence[int]], values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    counts = np.array([len(t) for t in truth])
    return np.repeat(np.asarray(values, dtype=np.float64), counts), \
        np.concatenate([np.asarray(t, dtype=np.float64) for t in truth])


def score(pred: Predictions, truth: Sequence[Sequence[int]], l_max: int) -> dict[str, float]:
    """All :data:`METRICS` plus ``coverage@q`` for each quantile of ``pred``, over (prediction, sample)
    pairs. ``truth[i]`` lists the samples (remaining tokens) of row i."""
    from scipy import stats

    if len(pred.point) != len(truth):
        raise InvalidArgument("predictions", len(pred.point), f"{len(truth)} rows, one per truth row")
    if len(truth) == 0:
        raise InvalidArgument("truth", 0, "at least one row")
    p, y = _pairs(truth, pred.point)
    err = p - y
    edges = log_bucket_edges(l_max)
    bp, by = np.searchsorted(edges, p, "right"), np.searchsorted(edges, y, "right")
    constant = np.ptp(p) == 0 or np.ptp(y) == 0
    out = {
        "n": float(len(y)),
        "mae": float(np.mean(np.abs(err))),
        "rmse": float(np.sqrt(np.mean(err ** 2))),
        "smape": float(100 * np.mean(2 * np.abs(err) / np.maximum(np.abs(p) + np.abs(y), 1e-12))),
        "kendall_tau_b": 0.0 if constant else float(stats.kendalltau(p, y, variant="b").statistic),
        "spearman": 0.0 if constant else float(stats.spearmanr(p, y).statistic),
        "within_10": float(np.mean(np.abs(err) <= 10)),
        "same_bucket": float(np.mean(bp == by)),
        "within_1_bucket": float(np.mean(np.abs(bp - by) <= 1)),
    }
    for q, values in sorted(pred.quantiles.items()):
        qp, qy = _pairs(truth, values)
        out[f"coverage@{q:g}"] = float(np.mean(qy <= qp))
    return out


def score_by_source(pred: Predictions, truth: Sequence[Sequence[int]], sources: Sequence[str],
                    l_max: int) -> dict[str, dict[str, float]]:
    """:func:`score` per source and over ``all`` rows."""
    src = np.asarray(sources)
    out = {}
    for name in sorted(set(sources)):
        idx = np.flatnonzero(src == name)
        sub = Predictions(pred.point[idx], {q: v[idx] for q, v in pred.quantiles.items()})
        out[name] = score(sub, [truth[i] for i in idx], l_max)
    if len(out) > 1:
        out["all"] = score(pred, truth, l_max)
    return out


def noise_ceiling(truth: Sequence[Sequence[int]], sources: Sequence[str], l_max: int) -> dict[str, dict[str, float]]:
    """Each sample predicted by a sibling sample of the same prompt (rows with >= 2 samples only)."""
    keep = [i for i, t in enumerate(truth) if len(t) >= 2]
    if not keep:
        return {}
    src = np.asarray(sources)[keep]
    out = {}
    for name in sorted(set(src)) + (["all"] if len(set(src)) > 1 else []):
        rows = [truth[keep[j]] for j in range(len(keep)) if name == "all" or src[j] == name]
        p = np.concatenate([np.roll(np.asarray(t, dtype=np.float64), -1) for t in rows])
        y = [[v] for t in rows for v in t]
        out[name] = score(Predictions(p), y, l_max)
    return out


def tau_difference(a: np.ndarray, b: np.ndarray, truth: Sequence[Sequence[int]], sources: Sequence[str], *,
                   resamples: int = 1000, seed: int = 0) -> dict[str, dict[str, float]]:
    """Kendall tau-b of predictions ``a`` minus that of ``b`` on the same rows, per source and over
    ``all``, with a 95% paired bootstrap interval that resamples whole prompts (rows), so the samples
    of one prompt stay together: ``{"diff", "low", "high", "p_not_better"}`` (the share of resamples
    where ``a`` does not rank better). Whether a predictor beats a baseline "clearly" is then a
    statement about the interval, not about two point estimates."""
    from scipy import stats

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if not (len(a) == len(b) == len(truth) == len(sources)):
        raise InvalidArgument("a", len(a), f"{len(truth)} predictions, one per truth row, as many in b and sources")
    resamples = check_int("resamples", resamples, minimum=1)
    rng = np.random.default_rng(seed)
    src = np.asarray(sources)

    def tau(values: np.ndarray, idx: np.ndarray) -> float:
        p, y = _pairs([truth[i] for i in idx], values[idx])
        return 0.0 if np.ptp(p) == 0 or np.ptp(y) == 0 else float(stats.kendalltau(p, y, variant="b").statistic)

    out = {}
    for name in sorted(set(sources)) + (["all"] if len(set(sources)) > 1 else []):
        idx = np.arange(len(src)) if name == "all" else np.flatnonzero(src == name)
        diffs = np.empty(resamples)
        for r in range(resamples):
            pick = idx[rng.integers(len(idx), size=len(idx))]
            diffs[r] = tau(a, pick) - tau(b, pick)
        low, high = np.quantile(diffs, [0.025, 0.975])
        out[name] = {"diff": tau(a, idx) - tau(b, idx), "low": float(low), "high": float(high),
                     "p_not_better": float(np.mean(diffs <= 0))}
    return out


# ------------------------------------------------------------------------------------ baselines


def _log_target(remaining: Sequence[Sequence[int]]) -> np.ndarray:
    return np.log(np.array([np.mean(r) for r in remaining], dtype=np.float64).clip(min=1))


class _ResidualQuantiles:
    """Quantiles from training residuals in log space: q-quantile = exp(fit + residual quantile)."""

    def _fit_residuals(self, fitted_log: np.ndarray, remaining: Sequence[Sequence[int]]) -> None:
        samples = np.concatenate([np.log(np.asarray(r, dtype=np.float64).clip(min=1)) for r in remaining])
        self._resid = samples - np.repeat(fitted_log, [len(r) for r in remaining])

    def _predictions(self, fitted_log: np.ndarray, levels: Sequence[float], l_max: int) -> Predictions:
        point = np.clip(np.rint(np.exp(fitted_log)), 1, l_max)
        qs = {q: np.clip(np.ceil(np.exp(fitted_log + np.quantile(self._resid, q))), 1, l_max) for q in levels}
        return Predictions(point, qs)


class ConstantBaseline(_ResidualQuantiles):
    """The training median of all remaining-length samples, for every query."""

    name = "constant"

    def fit(self, rows: dict[str, list[Any]]) -> ConstantBaseline:
        samples = np.concatenate([np.asarray(r, dtype=np.float64) for r in rows["remaining"]])
        self._log = float(np.log(max(np.median(samples), 1.0)))
        self._fit_residuals(np.full(len(rows["remaining"]), self._log), rows["remaining"])
        return self

    def predict(self, rows: dict[str, list[Any]], levels: Sequence[float], l_max: int) -> Predictions:
        return self._predictions(np.full(len(rows["prompt"]), self._log), levels, l_max)


class LinearBaseline(_ResidualQuantiles):
    """Least squares of log mean remaining length on log1p(prompt tokens) and log1p(prefix tokens)."""

    name = "linear"

    @staticmethod
    def _x(rows: dict[str, list[Any]]) -> np.ndarray:
        return np.column_stack([np.ones(len(rows["prompt"])), np.log1p(np.asarray(rows["prompt_tokens"], float)),
                                np.log1p(np.asarray(rows["prefix_tokens"], float))])

    def fit(self, rows: dict[str, list[Any]]) -> LinearBaseline:
        x, y = self._x(rows), _log_target(rows["remaining"])
        self._coef = np.linalg.lstsq(x, y, rcond=None)[0]
        self._fit_residuals(x @ self._coef, rows["remaining"])
        return self

    def predict(self, rows: dict[str, list[Any]], levels: Sequence[float], l_max: int) -> Predictions:
        return self._predictions(self._x(rows) @ self._coef, levels, l_max)


class TfidfBaseline(_ResidualQuantiles):
    """TF-IDF (words and bigrams of prompt + prefix) and ridge regression on log mean remaining length."""

    name = "tfidf"

    def __init__(self, alpha: float = 1.0):
        self.alpha = alpha

    @staticmethod
    def _text(rows: dict[str, list[Any]]) -> list[str]:
        return [p + ("\n" + x if x else "") for p, x in zip(rows["prompt"], rows["prefix"])]

    def fit(self, rows: dict[str, list[Any]]) -> TfidfBaseline:
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import Ridge

        y = _log_target(rows["remaining"])
        texts = self._text(rows)
        small = len(texts) < 50  # tiny training sets: keep rare and one-letter words too
        self._vec = TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2), min_df=1 if small else 2,
                                    max_features=100_000, token_pattern=r"(?u)\b\w+\b" if small else r"(?u)\b\w\w+\b")
        try:
            x = self._vec.fit_transform(texts)
        except ValueError:  # no word at all in the training texts: nothing to regress on
            self._vec, self._mean = None, float(np.mean(y))
            self._fit_residuals(np.full(len(y), self._mean), rows["remaining"])
            return self
        self._ridge = Ridge(alpha=self.alpha).fit(x, y)
        self._fit_residuals(self._ridge.predict(x), rows["remaining"])
        return self

    def predict(self, rows: dict[str, list[Any]], levels: Sequence[float], l_max: int) -> Predictions:
        if self._vec is None:
            return self._predictions(np.full(len(rows["prompt"]), self._mean), levels, l_max)
        return self._predictions(self._ridge.predict(self._vec.transform(self._text(rows))), levels, l_max)


BASELINES: dict[str, Callable[[], Any]] = {"constant": ConstantBaseline, "linear": LinearBaseline,
                                            "tfidf": TfidfBaseline}


def predictor_predictions(predictor: Any, rows: dict[str, list[Any]], levels: Sequence[float] = DEFAULT_LEVELS,
                          *, prompt_only: bool = False) -> Predictions:
    """A :class:`BertLengthPredictor` (or any predictor with ``prompt_tokens``) on table rows.

    ``prompt_only`` asks without the prefix and subtracts the prefix length afterwards: the k = 0
    model's answer to the k > 0 question, for comparing the two on the same samples."""
    prefixes = None if prompt_only else [x if x else n for x, n in zip(rows["prefix"], rows["prefix_tokens"])]
    res = predictor.predict(list(rows["prompt"]), prefixes, quantiles=list(levels),
                            prompt_tokens=list(rows["prompt_tokens"]))
    shift = np.asarray(rows["prefix_tokens"], dtype=np.int64) if prompt_only else 0
    return Predictions(np.maximum(res.lengths - shift, 1).astype(np.float64),
                       {q: np.maximum(res.quantiles[q] - shift, 1).astype(np.float64) for q in levels})


def reference_results(fit_rows: dict[str, list[Any]] | None, test_rows: dict[str, list[Any]], l_max: int,
                      levels: Sequence[float] = DEFAULT_LEVELS) -> dict[str, dict[str, dict[str, float]]]:
    """What a predictor is compared with on ``test_rows``: every baseline fitted on ``fit_rows`` (none
    without them) and the noise ceiling (where rows hold several samples), per source."""
    truth, sources = test_rows["remaining"], test_rows["source"]
    results = {}
    if fit_rows is not None:
        for name, make in BASELINES.items():
            results[name] = score_by_source(make().fit(fit_rows).predict(test_rows, levels, l_max), truth, sources,
                                            l_max)
    ceiling = noise_ceiling(truth, sources, l_max)
    if ceiling:
        results["ceiling"] = ceiling
    return results


#: One line per column of :func:`format_table` (and per row kind), for the legend under the table.
LEGEND = {
    "n": "n: (prediction, sample) pairs scored; a prompt with several samples counts once per sample",
    "mae": "mae / rmse: mean absolute / root mean square error, tokens (lower is better)",
    "smape": "smape: symmetric error 2|p-y|/(p+y), percent (lower is better)",
    "kendall_tau_b": "tau_b / spearman: rank agreement of predictions and true lengths, -1..1 (higher is better; "
                     "what a scheduler needs)",
    "within_10": "within_10: share within +-10 tokens",
    "same_bucket": "same_bucket / within_1_bucket: share in the same / a neighbouring log-spaced length bucket",
    "coverage": "coverage@q: share of samples at or below the predicted q-quantile (calibrated: q)",
    "methods": "rows: the model; constant (the training median), linear (log length on log prompt/prefix length), "
               "tfidf (words + ridge): baselines fitted on the training split; ceiling: a sibling sample as the "
               "prediction (the noise ceiling)",
}


def format_legend(results: dict[str, dict[str, dict[str, float]]]) -> str:
    """The legend of :func:`format_table`'s columns and rows."""
    has_cov = any(k.startswith("coverage@") for m in results.values() for s in m.values() for k in s)
    keys = ["methods", "n", "mae", "smape", "kendall_tau_b", "within_10", "same_bucket"] + \
        (["coverage"] if has_cov else [])
    return "\n".join("  " + LEGEND[k] for k in keys)


def verdict(results: dict[str, dict[str, dict[str, float]]], model: str) -> str:
    """One line: whether ``model`` beat every baseline (``constant``, ``linear``, ``tfidf``) on MAE and on
    Kendall tau-b over all test rows."""
    baselines = [b for b in BASELINES if b in results]
    if model not in results or not baselines:
        return f"{model}: no baselines to compare with (they need training data: --train-data)"
    source = "all" if "all" in results[model] else next(iter(results[model]))
    mine = results[model][source]
    lost = []
    for b in baselines:
        theirs = results[b].get(source)
        if theirs is None:
            continue
        if not mine["mae"] < theirs["mae"]:
            lost.append(f"{b} on mae ({mine['mae']:.1f} vs {theirs['mae']:.1f})")
        if not mine["kendall_tau_b"] > theirs["kendall_tau_b"]:
            lost.append(f"{b} on tau_b ({mine['kendall_tau_b']:.3f} vs {theirs['kendall_tau_b']:.3f})")
    if not lost:
        best = min(results[b][source]["mae"] for b in baselines if source in results[b])
        return (f"verdict: {model} beats every baseline ({', '.join(baselines)}) on mae and tau_b over {source} "
                f"test rows (mae {mine['mae']:.1f} vs the best baseline's {best:.1f})")
    return f"verdict: {model} does NOT beat every baseline over {source} test rows: behind " + "; ".join(lost)


def format_table(results: dict[str, dict[str, dict[str, float]]], columns: Sequence[str] | None = None) -> str:
    """``results[method][source] -> metrics`` as an aligned text table, one line per (source, method)."""
    cols = list(columns or ("n", "mae", "rmse", "smape", "kendall_tau_b", "spearman", "within_10", "same_bucket",
                            "within_1_bucket"))
    extra = sorted({k for m in results.values() for s in m.values() for k in s if k.startswith("coverage@")})
    cols += extra
    head = f"{'source':<22} {'method':<16} " + " ".join(f"{c.replace('kendall_tau_b', 'tau_b'):>10}" for c in cols)
    lines = [head]
    sources = sorted({s for m in results.values() for s in m}, key=lambda s: (s == "all", s))
    for s in sources:
        for method, per in results.items():
            if s in per:
                vals = " ".join(f"{per[s].get(c, float('nan')):>10.0f}" if c == "n"
                                else f"{per[s].get(c, float('nan')):>10.3f}" for c in cols)
                lines.append(f"{s:<22} {method:<16} {vals}")
    return "\n".join(lines)
