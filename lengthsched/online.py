"""Online length prediction from siblings and history (numpy only).

GRPO draws G completions of one prompt, reveals their lengths as they finish and revisits every
prompt each epoch. :class:`OnlineLengthPredictor` keeps, per prompt, a normal belief over the
prompt's mean log length and updates it in closed form:

- **prior**: any ``LengthPredictor`` (the trained BERT predictor, a constant, a regression on the
  prompt length), a number, or a mapping prompt -> tokens, asked once per prompt; its error in log
  space has spread ``prior_sigma`` (learnt from data by :meth:`OnlineLengthPredictor.fit`). Without a
  prior the running mean of everything observed so far serves (empirical Bayes), and before any
  observation ``default_length``;
- **siblings**: a completion's log length is normal around the prompt's mean with spread
  ``within_sigma`` (learnt). A finished sibling is an exact observation (normal-normal conjugacy:
  precisions add, O(1) per update);
- **running siblings** are censored: a completion that has generated k tokens and not finished has
  log length > log(k + 1). With censored siblings the belief is no longer normal: it is computed
  exactly on a grid of the prompt's mean log length (the normal belief times each running
  sibling's survival probability), and the predictive of a completion is the mixture over that
  grid. The same exact mixture serves every completion with progress of its own, truncated to
  what it has generated (so a long-running completion keeps a finite, ordered tail);
- **history**: observations of the same prompt in earlier rollout steps, weighted by
  ``forgetting ** (steps ago)``, so a policy whose lengths drift under RL is followed; with
  ``drift=True`` a global per-step drift of log length is estimated from prompts seen in
  consecutive steps and added to older observations;
- **per completion**: the predictive of its total length is the belief plus the sibling spread,
  truncated to what it has already generated; quantiles of its remaining length come from that
  truncated log-normal.

``predict(prompts, prefixes)`` follows the ``LengthPredictor`` protocol (a prefix is the
completion's progress: token ids or a count) and is vectorised over the queries.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np

from .errors import InvalidArgument, check_int, check_positive_float
from .predictor import LengthPrediction, _check_quantiles, _prefix_lengths

__all__ = ["OnlineLengthPredictor", "fit_spreads"]

_POSTERIOR_POINTS = 81  # grid of the prompt's mean log length when running siblings are censored
_PREDICTIVE_POINTS = 300  # grid of log total length for the truncated predictive

_NORMAL = NormalDist()


def _inv_cdf(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-12, 1 - 1e-12)
    return np.frompyfunc(_NORMAL.inv_cdf, 1, 1)(p).astype(np.float64)


@dataclass
class _Prompt:
    """The belief's sufficient statistics for one prompt (log lengths)."""

    prior_mean: float
    step: int = 0
    n: int = 0  # finished siblings of the current step
    total: float = 0.0  # their sum of log lengths
    hist_weight: float = 0.0  # decayed weights of earlier steps' observations
    hist_total: float = 0.0  # weighted sum of their log lengths
    hist_steps: float = 0.0  # weighted sum of their steps (for the drift correction)
    running: dict[Hashable, int] = field(default_factory=dict)  # completion -> tokens generated so far


_GRID = np.linspace(0.0005, 0.9995, 1999)  # probabilities at which an empirical residual law is kept
_TABLE_Z = np.linspace(-40.0, 40.0, 32001)  # standardised residuals at which log-survivals are tabulated
_erfc = np.frompyfunc(math.erfc, 1, 1)


def _log_sf_normal(z: np.ndarray) -> np.ndarray:
    """log P(N(0, 1) > z), accurate far into the upper tail (erfc; asymptotic beyond z = 37)."""
    z = np.asarray(z, dtype=np.float64)
    direct = np.log(np.maximum(0.5 * _erfc(np.minimum(z, 37.0) / math.sqrt(2.0)).astype(np.float64), 1e-320))
    far = -0.5 * z * z - np.log(np.maximum(z, 1.0) * math.sqrt(2 * math.pi))
    return np.where(z > 37.0, far, direct)


class _Residuals:
    """The law of a sibling's standardised log length around its prompt's mean: the standard normal,
    or an empirical law learnt from data (heavy-tailed on real completions: a few run far longer),
    kept as its quantile function on a fixed grid (inverse by interpolation) and its tabulated log-survival."""

    def __init__(self, quantiles: Sequence[float] | None = None):
        self.values = None if quantiles is None else np.asarray(quantiles, dtype=np.float64)
        if self.values is not None and (len(self.values) != len(_GRID) or np.any(np.diff(self.values) < 0)):
            raise InvalidArgument("residual_quantiles", f"{len(self.values)} values",
                                  f"{len(_GRID)} non-decreasing quantiles (from fit_spreads)")
        # log P(Z > z) on a fine grid: the empirical law inside its range, normal-shaped tails outside
        # it (scaled to meet it), so far tails stay finite and ordered (no collapse to "1 token left").
        z = _TABLE_Z
        log_sf_normal = _log_sf_normal(z)
        if self.values is None:
            self._log_sf = log_sf_normal
        else:
            lo, hi = self.values[0], self.values[-1]
            inside = np.log(np.maximum(1.0 - np.interp(z, self.values, _GRID), 1e-300))
            upper = math.log(1.0 - _GRID[-1]) + log_sf_normal - float(_log_sf_normal(np.array([hi]))[0])
            below = 1.0 - _GRID[0] * np.exp(_log_sf_normal(-z) - float(_log_sf_normal(np.array([-lo]))[0]))
            self._log_sf = np.where(z > hi, upper, np.where(z < lo, np.log(np.clip(below, 1e-300, 1.0)), inside))

    def log_sf(self, z: np.ndarray) -> np.ndarray:
        """log P(Z > z), vectorised (table lookup)."""
        return np.interp(z, _TABLE_Z, self._log_sf, left=0.0, right=self._log_sf[-1] - (z.max() - _TABLE_Z[-1]) ** 2)

    def inv(self, p: np.ndarray) -> np.ndarray:
        if self.values is None:
            return _inv_cdf(p)
        return np.interp(np.clip(p, _GRID[0], _GRID[-1]), _GRID, self.values)

    def mixed(self, share: np.ndarray) -> _Mixed:
        """The law of (belief error + sibling residual) / its sd, where ``share`` of the variance is the
        belief's (normal) and the rest the sibling's (this law): approximated by mixing the two quantile
        functions in proportion to their standard deviations' shares (exact at share 0 and 1)."""
        return _Mixed(self, np.asarray(share, dtype=np.float64))


class _Mixed:
    """Quantile-mixture of the standard normal and an empirical residual law (see ``_Residuals.mixed``)."""

    def __init__(self, law: _Residuals, share: np.ndarray):
        self.law, self.a = law, np.sqrt(share) / (np.sqrt(share) + np.sqrt(1.0 - share))

    def inv(self, p: np.ndarray) -> np.ndarray:
        return self.a * _inv_cdf(p) + (1.0 - self.a) * self.law.inv(p)


def fit_spreads(groups: Iterable[Sequence[int]], prior_lengths: Iterable[float] | None = None) -> dict[str, Any]:
    """Spreads of the log-normal model from groups of sibling lengths (tokens, >= 2 per group).

    ``within_sigma``: pooled within-group standard deviation of log length (unbiased);
    ``residual_quantiles``: the empirical law of the standardised residuals (the predictive's shape:
    real sibling lengths are far from normal in their tails). With
    ``prior_lengths`` (one prediction per group, tokens): ``prior_sigma``, the spread of the
    prior's error on a group's mean log length, its sampling noise (within^2 / n) taken out; and
    ``prior_bias``, the mean of that error (add it to the prior's log). Returns a dict."""
    logs = [np.log(np.asarray(g, dtype=np.float64)) for g in groups]
    if not logs or any(len(g) < 2 or np.any(~np.isfinite(g)) for g in logs):
        raise InvalidArgument("groups", f"{len(logs)} groups", "groups of at least 2 lengths >= 1 token each")
    ss = sum(float(((g - g.mean()) ** 2).sum()) for g in logs)
    dof = sum(len(g) - 1 for g in logs)
    within = math.sqrt(ss / dof)
    # Residuals from each group's own mean are narrower by sqrt((n - 1) / n): undo it.
    z = np.concatenate([(g - g.mean()) * math.sqrt(len(g) / (len(g) - 1)) for g in logs]) / within
    out: dict[str, Any] = {"within_sigma": within, "residual_quantiles": np.quantile(z, _GRID).tolist()}
    if prior_lengths is not None:
        prior = np.log(np.asarray(list(prior_lengths), dtype=np.float64))
        if len(prior) != len(logs) or np.any(~np.isfinite(prior)):
            raise InvalidArgument("prior_lengths", f"{len(prior)} values", f"{len(logs)} positive predictions, "
                                                                            "one per group")
        err = np.array([g.mean() for g in logs]) - prior
        noise = np.mean([within ** 2 / len(g) for g in logs])
        out["prior_bias"] = float(err.mean())
        out["prior_sigma"] = math.sqrt(max(float(err.var(ddof=1)) - noise, 1e-4)) if len(err) > 1 else 0.5
    return out


class OnlineLengthPredictor:
    """Predicts a completion's length from its prompt's prior, its finished and running siblings, and
    the prompt's earlier rollout steps (see the module docstring). Tokens everywhere; beliefs in log
    tokens.

    ``prior``: a ``LengthPredictor``, a number of tokens, a mapping prompt -> tokens, or None.
    ``prior_sigma``: spread of the prior's error in log space; ``prior_bias``: its mean (added to
    the prior's log). ``within_sigma``: spread of siblings' log lengths around their prompt's mean.
    ``forgetting`` in (0, 1]: weight of an observation from k rollout steps ago is forgetting**k.
    ``drift``: estimate a global per-step drift of log length and apply it to older observations.
    ``default_length``: the prior mean before anything is known (no prior, nothing observed).
    ``max_new_tokens``: cap of every prediction (a completion cannot be longer).
    ``residual_quantiles``: the shape of a sibling's standardised log length (from :func:`fit_spreads`;
    default normal); the predictive quantiles use it, the belief updates stay normal.
    """

    def __init__(self, prior: Any = None, *, prior_sigma: float = 0.6, prior_bias: float = 0.0,
                 within_sigma: float = 0.2, forgetting: float = 0.5, drift: bool = False,
                 default_length: int = 512, max_new_tokens: int | None = None,
                 residual_quantiles: Sequence[float] | None = None):
        if prior is not None and not (hasattr(prior, "predict") or isinstance(prior, Mapping)
                                      or isinstance(prior, (int, float, np.integer, np.floating))):
            raise InvalidArgument("prior", type(prior).__name__, "a LengthPredictor, a number of tokens, a mapping "
                                                                 "prompt -> tokens, or None")
        if isinstance(prior, (int, float, np.integer, np.floating)):
            check_positive_float("prior", prior)
        self.prior = prior
        self.prior_sigma = check_positive_float("prior_sigma", prior_sigma)
        self.prior_bias = float(prior_bias)
        if not math.isfinite(self.prior_bias):
            raise InvalidArgument("prior_bias", prior_bias, "a finite number (log tokens)")
        self.within_sigma = check_positive_float("within_sigma", within_sigma)
        self.forgetting = check_positive_float("forgetting", forgetting, maximum=1.0)
        self.drift = bool(drift)
        self.default_length = check_int("default_length", default_length, minimum=1)
        self.max_new_tokens = None if max_new_tokens is None else check_int("max_new_tokens", max_new_tokens,
                                                                            minimum=1)
        self.residuals = _Residuals(residual_quantiles)
        self.step = 0
        self._prompts: dict[Hashable, _Prompt] = {}
        self._sum_log = 0.0  # every finished observation, for the empirical prior
        self._count = 0
        self._drift_sum = 0.0  # step-to-step changes of prompts' mean log length (drift estimate)
        self._drift_weight = 0.0

    # ------------------------------------------------------------------ construction
    @classmethod
    def fit(cls, groups: Mapping[Hashable, Sequence[int]], prior: Any = None, **options: Any) -> OnlineLengthPredictor:
        """A predictor whose spreads are learnt from training ``groups`` (prompt -> sibling lengths,
        tokens): ``within_sigma`` always; with a ``prior``, its ``prior_sigma`` and ``prior_bias`` on
        these prompts. ``options`` as the constructor (explicit values win)."""
        if not isinstance(groups, Mapping) or not groups:
            raise InvalidArgument("groups", type(groups).__name__, "a non-empty mapping prompt -> sibling lengths")
        keys = list(groups)
        priors = None
        if prior is not None:
            probe = cls(prior, default_length=options.get("default_length", 512))
            priors = np.exp(probe._prior_means(keys))
        spreads = fit_spreads([groups[k] for k in keys], priors)
        return cls(prior, **{**spreads, **options})

    # ------------------------------------------------------------------ observations
    def set_step(self, step: int) -> None:
        """Start rollout step ``step`` (>= the current one): observations from now on belong to it."""
        step = check_int("step", step, minimum=0)
        if step < self.step:
            raise InvalidArgument("step", step, f"at least the current step {self.step}")
        self.step = step

    def observe(self, prompt: Hashable, length: int, *, finished: bool = True, completion: Hashable = None,
                step: int | None = None) -> None:
        """Record that a completion of ``prompt`` finished with ``length`` tokens, or (``finished=False``)
        that ``completion`` has generated ``length`` tokens so far. ``step``: the rollout step (default
        the current one; a later one starts it). O(1)."""
        length = check_int("length", length, minimum=1 if finished else 0)
        if step is not None:
            if check_int("step", step, minimum=0) > self.step:
                self.set_step(step)
        step = self.step if step is None else step
        state = self._state(prompt)
        if step < state.step:
            raise InvalidArgument("step", step, f"at least step {state.step}, the latest seen for this prompt")
        if step > state.step:
            self._roll(state, step)
        if not finished:
            if completion is None:
                raise InvalidArgument("completion", None, "an id of the running completion (finished=False)")
            state.running[completion] = length
            return
        if completion is not None:
            state.running.pop(completion, None)
        y = math.log(length)
        state.n += 1
        state.total += y
        self._sum_log += y
        self._count += 1

    def _state(self, prompt: Hashable) -> _Prompt:
        state = self._prompts.get(prompt)
        if state is None:
            state = _Prompt(prior_mean=float(self._prior_means([prompt])[0]), step=self.step)
            self._prompts[prompt] = state
        return state

    def _roll(self, state: _Prompt, step: int) -> None:
        """Move the prompt's current-step observations into its history, decayed to ``step``."""
        decay = self.forgetting ** (step - state.step)
        if state.n and state.hist_weight > 0:  # a prompt seen in two steps: evidence of drift
            previous = state.hist_total / state.hist_weight
            gap = state.step - state.hist_steps / state.hist_weight
            if gap > 0:
                self._drift_sum += (state.total / state.n - previous) * state.n
                self._drift_weight += gap * state.n
        state.hist_weight = (state.hist_weight + state.n) * decay
        state.hist_total = (state.hist_total + state.total) * decay
        state.hist_steps = (state.hist_steps + state.n * state.step) * decay
        state.n, state.total, state.step = 0, 0.0, step
        state.running.clear()

    def _prior_means(self, prompts: Sequence[Hashable]) -> np.ndarray:
        """Prior mean log length of each prompt (the prior's prediction, bias-corrected)."""
        prior = self.prior
        if prior is None:
            mean = self._sum_log / self._count if self._count else math.log(self.default_length)
            return np.full(len(prompts), mean)
        if isinstance(prior, Mapping):
            missing = [p for p in prompts if p not in prior]
            if missing:
                raise InvalidArgument("prompts", missing[:3], "prompts the prior mapping knows")
            values = np.array([float(prior[p]) for p in prompts])
        elif hasattr(prior, "predict"):
            values = np.asarray(prior.predict(list(prompts)).lengths, dtype=np.float64)
        else:
            values = np.full(len(prompts), float(prior))
        if np.any(~np.isfinite(values)) or np.any(values <= 0):
            raise InvalidArgument("prior", values[:3].tolist(), "positive, finite predictions (tokens)")
        return np.log(values) + self.prior_bias

    @property
    def drift_per_step(self) -> float:
        """The estimated drift of log length per rollout step (0 without ``drift``)."""
        if not self.drift or not self._drift_weight:
            return 0.0
        return self._drift_sum / self._drift_weight

    # ------------------------------------------------------------------ beliefs
    def belief(self, prompt: Hashable) -> tuple[float, float]:
        """(mean, variance) of the prompt's mean log length now, from the prior, its history and
        its finished siblings (running siblings are added by :meth:`predict`)."""
        state = self._state(prompt)
        if state.step < self.step:
            self._roll(state, self.step)
        return self._belief(state)

    def _belief(self, state: _Prompt) -> tuple[float, float]:
        w2 = self.within_sigma ** 2
        precision = 1.0 / self.prior_sigma ** 2 + (state.hist_weight + state.n) / w2
        hist = state.hist_total
        if state.hist_weight and self.drift:
            hist += self.drift_per_step * (state.hist_weight * state.step - state.hist_steps)
        mean = (state.prior_mean / self.prior_sigma ** 2 + (hist + state.total) / w2) / precision
        return mean, 1.0 / precision

    def _grid(self, state: _Prompt) -> tuple[np.ndarray, np.ndarray]:
        """The posterior of the prompt's mean log length on a grid (points, weights): the normal
        belief from prior, history and finished siblings, times the exact censored likelihood of every
        running sibling (P(its log length > log(progress + 1)) under the residual law)."""
        mean, var = self._belief(state)
        sd, w = math.sqrt(var), self.within_sigma
        cuts = np.log(np.array([k for k in state.running.values() if k > 0], dtype=np.float64) + 1.0)
        top = max(mean + 6 * sd, float(cuts.max()) + 4 * w) if len(cuts) else mean + 6 * sd
        mu = np.linspace(mean - 6 * sd, top, _POSTERIOR_POINTS)
        logw = -0.5 * ((mu - mean) / sd) ** 2
        if len(cuts):
            logw = logw + self.residuals.log_sf((cuts[None, :] - mu[:, None]) / w).sum(axis=1)
        weight = np.exp(logw - logw.max())
        return mu, weight / weight.sum()

    def _mixture_totals(self, state: _Prompt, done: np.ndarray, qs: Sequence[float]) -> dict[float, np.ndarray]:
        """Quantiles of log total length of completions of one prompt that are still running after
        ``done`` tokens, under the grid posterior: exact truncation of the mixture predictive."""
        mu, weight = self._grid(state)
        w = self.within_sigma
        cut = np.where(done > 0, np.log(done + 1.0), -np.inf)
        lo = mu[0] - 10 * w
        hi = max(mu[-1], float(cut.max()) if np.isfinite(cut).any() else mu[-1]) + 12 * w
        y = np.linspace(lo, hi, _PREDICTIVE_POINTS)
        terms = np.log(np.maximum(weight, 1e-300))[None, :] + self.residuals.log_sf((y[:, None] - mu[None, :]) / w)
        top = terms.max(axis=1)
        log_sf = top + np.log(np.exp(terms - top[:, None]).sum(axis=1))  # log P(Y > y), decreasing
        log_sf = np.minimum.accumulate(log_sf)
        start = np.where(np.isfinite(cut), np.interp(np.where(np.isfinite(cut), cut, lo), y, log_sf), 0.0)
        out = {}
        for q in qs:
            target = start + math.log1p(-q)  # P(Y > y | Y > cut) = 1 - q
            out[q] = np.interp(-target, -log_sf, y)
        return out

    # ------------------------------------------------------------------ the protocol
    def predict(self, prompts: Sequence[Hashable], prefixes: Sequence[Any] | None = None, *,
                quantiles: Sequence[float] = ()) -> LengthPrediction:
        """Remaining tokens of a completion of each ``prompts[i]`` that has generated ``prefixes[i]``
        (token ids or a count; None = nothing yet): the median of its predictive, truncated to more
        than it has generated, and the requested quantiles of it. Vectorised over the queries."""
        qs = _check_quantiles(quantiles)
        done = _prefix_lengths(prompts, prefixes)
        unseen = [p for p in dict.fromkeys(prompts) if p not in self._prompts]
        if unseen:  # one batched call to the prior for every new prompt
            for p, m in zip(unseen, self._prior_means(unseen)):
                self._prompts[p] = _Prompt(prior_mean=float(m), step=self.step)
        beliefs = {}
        for p in dict.fromkeys(prompts):
            state = self._prompts[p]
            if state.step < self.step:
                self._roll(state, self.step)
            beliefs[p] = self._belief(state)
        mean = np.array([beliefs[p][0] for p in prompts], dtype=np.float64)
        var = np.array([beliefs[p][1] for p in prompts], dtype=np.float64)
        sd = np.sqrt(var + self.within_sigma ** 2)
        # Completions that have generated nothing, of prompts without running siblings: the closed
        # form (normal belief, residual law); every other one is replaced below by the exact path.
        law = self.residuals.mixed(var / (var + self.within_sigma ** 2)) if self.residuals.values is not None \
            else self.residuals
        levels = sorted({0.5, *qs})
        log_total = {q: mean + sd * law.inv(np.full(len(prompts), q)) for q in levels}
        # Completions of a prompt with running siblings, or with progress of their own: the exact
        # (grid) posterior and truncated mixture predictive.
        rows_of: dict[Hashable, list[int]] = {}
        for i, p in enumerate(prompts):
            rows_of.setdefault(p, []).append(i)
        for p, rows in rows_of.items():
            state = self._prompts[p]
            informative = any(k > 0 for k in state.running.values())  # progress 0 tells nothing
            rows = [i for i in rows if informative or done[i] > 0]
            if rows:
                exact = self._mixture_totals(state, done[rows], levels)
                for q in levels:
                    log_total[q][rows] = exact[q]

        def remaining(q: float, rounding) -> np.ndarray:
            total = np.exp(log_total[q])
            if self.max_new_tokens is not None:
                total = np.minimum(total, self.max_new_tokens)
            return np.maximum(1, rounding(total - done)).astype(np.int64)

        return LengthPrediction(remaining(0.5, np.rint), {q: remaining(q, np.ceil) for q in qs})

    def __repr__(self) -> str:
        return (f"OnlineLengthPredictor(prior={type(self.prior).__name__}, prior_sigma={self.prior_sigma:.3f}, "
                f"within_sigma={self.within_sigma:.3f}, forgetting={self.forgetting}, drift={self.drift}, "
                f"{len(self._prompts)} prompts, step {self.step})")
