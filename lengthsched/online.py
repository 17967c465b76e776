"""Online length prediction from siblings and history (numpy only).

GRPO draws G completions of one prompt, reveals their lengths as they finish and revisits every
prompt each epoch. :class:`OnlineLengthPredictor` keeps, per prompt, a belief over the prompt's mean
log length ``mu`` and its sibling spread ``sigma`` (log tokens):

- **prior**: any ``LengthPredictor`` (the trained BERT predictor, a constant, a regression on the
  prompt length), a number, or a mapping prompt -> tokens, asked once per prompt; ``mu`` is the
  prior's log plus an error whose law is a mixture of normals (one normal of spread ``prior_sigma``
  by default; fitted on data by :meth:`OnlineLengthPredictor.fit`: real prompts' mean log lengths
  are skewed). Without a prior the running mean of everything observed (decayed with
  ``forgetting`` across rollout steps) serves (empirical Bayes), and before any observation
  ``default_length``;
- **spread**: ``sigma`` is one value ``within_sigma`` by default, or per prompt, drawn from a
  discrete law fitted on data (prompts differ several-fold in how much their siblings scatter), and
  learnt from the prompt's own siblings;
- **siblings**: a completion's log length is ``mu + sigma * e``, ``e`` standard normal (or an
  empirical residual law with a single spread). Finished siblings are exact observations: given the
  prior's mixture component and ``sigma`` the update is normal-normal conjugate, so the belief is a
  mixture of normals in closed form (sufficient statistics: count, sum and sum of squares; O(1) per
  observation);
- **running siblings** are censored: a completion that has generated k tokens and not finished has
  log length > log(k + 1). The belief is then computed exactly on a grid of ``mu`` per ``sigma``
  (the closed-form belief times each running sibling's survival probability). A completion's own
  progress (``predict(..., completions=...)``) is not evidence about its siblings' law in its own
  prediction: it truncates its predictive instead;
- **history**: observations of the same prompt in earlier rollout steps, weighted by
  ``forgetting ** (steps ago)``, so a policy whose lengths drift under RL is followed; with
  ``drift=True`` a global per-step drift of log length is estimated from prompts seen in
  consecutive steps and added to older observations;
- **per completion**: the predictive of its total length is the mixture over the belief of the
  sibling law, truncated to more than what it has already generated; quantiles of its remaining
  length come from it.

``predict(prompts, prefixes, *, quantiles, completions)`` follows the ``LengthPredictor`` protocol (a
prefix is the completion's progress: token ids or a count) and is vectorised over the queries.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np

from .errors import InvalidArgument, check_int, check_positive_float
from .predictor import LengthPrediction, _check_quantiles, _prefix_lengths

__all__ = ["OnlineLengthPredictor", "fit_spreads", "fit_forgetting", "resumed_remaining"]

_SINGLE_POINTS = 81  # grid of mu when censored siblings are present and the spread is one value
_POINTS_PER_SPREAD = 40  # the same per spread value of a spread law
_PREDICTIVE_POINTS = 64  # grid of log total length bracketing the predictive's quantiles
_BISECTIONS = 14  # bisection steps on the exact mixture inside a bracket
_CHUNK = 4_000_000  # elements of one [queries, grid, components] block of the predictive
_SPREADS = 16  # values of a fitted spread law
_COMPONENTS = 4  # normals of a fitted prior law

_NORMAL = NormalDist()


def _inv_cdf(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-12, 1 - 1e-12)
    return np.frompyfunc(_NORMAL.inv_cdf, 1, 1)(p).astype(np.float64)


@dataclass
class _Prompt:
    """The belief's sufficient statistics for one prompt (log lengths)."""

    prior_mean: float | None  # None: the empirical running mean (no prior)
    step: int = 0
    n: int = 0  # finished siblings of the current step
    total: float = 0.0  # their sum of log lengths
    squares: float = 0.0  # their sum of squared log lengths
    hist_weight: float = 0.0  # decayed weights of earlier steps' observations
    hist_total: float = 0.0  # weighted sum of their log lengths
    hist_squares: float = 0.0  # weighted sum over earlier steps of n_s * (step mean)^2
    hist_groups: float = 0.0  # weighted count of earlier steps with observations
    hist_ss: float = 0.0  # within-step sums of squares of earlier steps (spread evidence)
    hist_dof: float = 0.0  # their degrees of freedom
    hist_steps: float = 0.0  # weighted sum of their steps (for the drift correction)
    hist_steps_y: float = 0.0  # weighted sum of step * log length
    hist_steps_sq: float = 0.0  # weighted sum of step ** 2
    running: dict[Hashable, int] = field(default_factory=dict)  # completion -> tokens generated so far


#: The format name of :meth:`OnlineLengthPredictor.state_dict`.
STATE_FORMAT = "lengthsched.online-state/1"
#: String prompts longer than this many characters are kept, and saved, under a digest of their text
#: (:func:`state_key`): a state file then holds a 40-character key per prompt, not the prompt.
KEY_CHARS = 64


def state_key(prompt: Hashable) -> Hashable:
    """The key a prompt's statistics are kept and saved under: a string of more than :data:`KEY_CHARS` characters
    becomes ``"blake2b:"`` and the hex digest (128 bits) of its UTF-8 text; any other prompt is its own key."""
    if isinstance(prompt, str) and len(prompt) > KEY_CHARS:
        return "blake2b:" + hashlib.blake2b(prompt.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    return prompt
# The per-prompt statistics saved, in order (all of _Prompt's but the running completions).
_STATE_FIELDS = ("prior_mean", "step", "n", "total", "squares", "hist_weight", "hist_total", "hist_squares",
                 "hist_groups", "hist_ss", "hist_dof", "hist_steps", "hist_steps_y", "hist_steps_sq")


def _parse_state(state: Mapping[str, Any]) -> tuple[int, list[float], dict[str, _Prompt]]:
    """(step, [sum_log, count, drift_sum, drift_weight], per prompt its statistics) of a
    :meth:`OnlineLengthPredictor.state_dict`; InvalidArgument naming the part that is wrong."""
    if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
        raise InvalidArgument("state", type(state).__name__ if not isinstance(state, Mapping) else
                              state.get("format"), f"a mapping of format {STATE_FORMAT!r} (state_dict())")
    try:
        step = check_int("state step", state["step"], minimum=0)
        sums = [float(state[k]) for k in ("sum_log", "count", "drift_sum", "drift_weight")]
        prompts = {}
        for key, values in dict(state["prompts"]).items():
            if not isinstance(key, str) or len(values) != len(_STATE_FIELDS):
                raise InvalidArgument("state prompts", key, f"a string key with {len(_STATE_FIELDS)} values")
            prior = None if values[0] is None else float(values[0])
            rest = [check_int("state prompt step", values[1], minimum=0), check_int("state n", values[2], minimum=0)]
            prompts[state_key(key)] = _Prompt(prior, *rest, *(float(v) for v in values[3:]))  # text saved before
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidArgument("state", type(exc).__name__, f"the parts state_dict() writes ({exc})") from None
    if not all(math.isfinite(x) for x in sums):
        raise InvalidArgument("state", sums, "finite sums")
    return step, sums, prompts


_GRID = np.linspace(0.0005, 0.9995, 1999)  # probabilities at which an empirical residual law is kept
_TABLE_Z = np.linspace(-40.0, 40.0, 32001)  # standardised residuals at which log-survivals are tabulated
_TABLE_STEP = (_TABLE_Z[-1] - _TABLE_Z[0]) / (len(_TABLE_Z) - 1)  # its uniform spacing (looked up by index)
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
    kept as its quantile function on a fixed grid and its tabulated log-survival."""

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
        self._slope = np.append(np.diff(self._log_sf), 0.0)  # per table cell, for linear interpolation

    @property
    def normal(self) -> bool:
        return self.values is None

    def log_sf(self, z: np.ndarray) -> np.ndarray:
        """log P(Z > z), vectorised (table lookup; beyond the table the normal tail's slope)."""
        z = np.asarray(z, dtype=np.float64)
        # The table's z are evenly spaced: the cell is an index, not a search (np.interp's binary search
        # was a third of the online predictor's time). NaN stays NaN (its fraction is NaN).
        cell = np.clip((z - _TABLE_Z[0]) * (1.0 / _TABLE_STEP), 0.0, len(_TABLE_Z) - 1.0)
        with np.errstate(invalid="ignore"):
            index = cell.astype(np.intp)
        out = self._log_sf.take(index, mode="clip") + (cell - index) * self._slope.take(index, mode="clip")
        top = _TABLE_Z[-1]
        over = z > top
        if over.any():  # beyond the table: the normal tail's slope
            out = np.where(over, self._log_sf[-1] - 0.5 * (np.minimum(z, 1e150) ** 2 - top * top), out)
        under = z < _TABLE_Z[0]
        if under.any():
            out = np.where(under, 0.0, out)
        return out

    def inv(self, p: np.ndarray) -> np.ndarray:
        if self.values is None:
            return _inv_cdf(p)
        return np.interp(np.clip(p, _GRID[0], _GRID[-1]), _GRID, self.values)


def _logsumexp(a: np.ndarray, axis: int) -> np.ndarray:
    top = np.max(a, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    return np.squeeze(top, axis=axis) + np.log(np.sum(np.exp(a - top), axis=axis))


def _fit_spread_law(logs: Sequence[np.ndarray], points: int = _SPREADS, iterations: int = 400,
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The law of a prompt's sibling spread ``sigma`` (sd of log length), as weights on ``points``
    log-spaced values: the nonparametric maximum likelihood (EM) of the groups' within sums of
    squares, ``SS_g ~ sigma^2 chi^2(n_g - 1)``."""
    dof = np.array([len(g) - 1 for g in logs], dtype=np.float64)
    ss = np.array([float(((g - g.mean()) ** 2).sum()) for g in logs])
    sd = np.sqrt(ss / dof)
    positive = sd[sd > 0]
    lo = max(0.005, 0.5 * float(np.quantile(positive, 0.01))) if len(positive) else 0.005
    hi = max(2.0 * float(np.quantile(sd, 0.99)), 2.0 * lo)
    values = np.exp(np.linspace(math.log(lo), math.log(hi), points))
    loglik = -dof[:, None] * np.log(values)[None, :] - ss[:, None] / (2.0 * values[None, :] ** 2)
    loglik -= loglik.max(axis=1, keepdims=True)
    lik = np.exp(loglik)
    weights = np.full(points, 1.0 / points)
    for _ in range(iterations):
        post = lik * weights
        post /= post.sum(axis=1, keepdims=True)
        weights = post.mean(axis=0)
    return values, weights


def _fit_prior_law(errors: np.ndarray, noise: np.ndarray, components: int = _COMPONENTS, iterations: int = 300,
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A mixture of ``components`` normals (offsets, scales, weights) for the prior's error on a
    prompt's mean log length, fitted by EM to the groups' errors ``errors`` observed with sampling
    noise of variance ``noise`` (per group; taken out of the scales)."""
    x = np.asarray(errors, dtype=np.float64)
    v = np.asarray(noise, dtype=np.float64)
    k = max(1, min(components, len(x) // 20))
    floor = max(0.02, 0.05 * float(np.std(x)))
    offsets = np.quantile(x, (np.arange(k) + 0.5) / k)
    scales = np.full(k, max(float(np.std(x)) / k, floor))
    weights = np.full(k, 1.0 / k)
    for _ in range(iterations):
        var = scales[None, :] ** 2 + v[:, None]
        logr = np.log(weights)[None, :] - 0.5 * np.log(var) - (x[:, None] - offsets[None, :]) ** 2 / (2 * var)
        logr -= logr.max(axis=1, keepdims=True)
        r = np.exp(logr)
        r /= r.sum(axis=1, keepdims=True)
        mass = r.sum(axis=0) + 1e-12
        weights = mass / mass.sum()
        offsets = (r * x[:, None]).sum(axis=0) / mass
        spread = (r * ((x[:, None] - offsets[None, :]) ** 2 - v[:, None])).sum(axis=0) / mass
        scales = np.sqrt(np.maximum(spread, floor ** 2))
    return offsets, scales, weights


def fit_spreads(groups: Iterable[Sequence[int]], prior_lengths: Iterable[float] | None = None, *,
                laws: bool = False) -> dict[str, Any]:
    """Spreads of the log-normal model from groups of sibling lengths (tokens, >= 2 per group).

    ``within_sigma``: pooled within-group standard deviation of log length (unbiased);
    ``residual_quantiles``: the empirical law of the standardised residuals around the pooled spread
    (the predictive's shape with one spread: real sibling lengths are far from normal in their
    tails). With ``prior_lengths`` (one prediction per group, tokens): ``prior_sigma``, the spread of
    the prior's error on a group's mean log length, its sampling noise (within^2 / n) taken out; and
    ``prior_bias``, the mean of that error (add it to the prior's log).

    ``laws=True`` fits the per-prompt model instead of the pooled residual law (``residual_quantiles``
    is None): ``spread_values`` / ``spread_weights``, the law of a prompt's own spread (EM on the
    groups' within sums of squares), and with ``prior_lengths`` ``prior_offsets`` / ``prior_scales``
    / ``prior_weights``, a mixture of normals for the prior's error (after ``prior_bias``), fitted
    with each group mean's sampling noise taken out. Returns a dict of constructor arguments."""
    logs = [np.log(np.asarray(g, dtype=np.float64)) for g in groups]
    if not logs or any(len(g) < 2 or np.any(~np.isfinite(g)) for g in logs):
        raise InvalidArgument("groups", f"{len(logs)} groups", "groups of at least 2 lengths >= 1 token each")
    ss = sum(float(((g - g.mean()) ** 2).sum()) for g in logs)
    dof = sum(len(g) - 1 for g in logs)
    within = max(math.sqrt(ss / dof), 1e-3)
    out: dict[str, Any] = {"within_sigma": within}
    if laws:
        values, weights = _fit_spread_law(logs)
        out |= {"residual_quantiles": None, "spread_values": values.tolist(), "spread_weights": weights.tolist()}
        mean_var = float((weights * values ** 2).sum())
    else:
        # Residuals from each group's own mean are narrower by sqrt((n - 1) / n): undo it.
        z = np.concatenate([(g - g.mean()) * math.sqrt(len(g) / (len(g) - 1)) for g in logs]) / within
        out["residual_quantiles"] = np.quantile(z, _GRID).tolist()
        mean_var = within ** 2
    if prior_lengths is not None:
        prior = np.log(np.asarray(list(prior_lengths), dtype=np.float64))
        if len(prior) != len(logs) or np.any(~np.isfinite(prior)):
            raise InvalidArgument("prior_lengths", f"{len(prior)} values", f"{len(logs)} positive predictions, "
                                                                            "one per group")
        err = np.array([g.mean() for g in logs]) - prior
        noise = np.array([mean_var / len(g) for g in logs])
        out["prior_bias"] = float(err.mean())
        out["prior_sigma"] = math.sqrt(max(float(err.var(ddof=1)) - float(noise.mean()), 1e-4)) \
            if len(err) > 1 else 0.5
        if laws and len(err) > 1:
            offsets, scales, weights = _fit_prior_law(err - out["prior_bias"], noise)
            out |= {"prior_offsets": offsets.tolist(), "prior_scales": scales.tolist(),
                    "prior_weights": weights.tolist()}
    return out


def _law(name: str, values: Sequence[float] | None, weights: Sequence[float] | None, positive: bool,
         ) -> tuple[np.ndarray, np.ndarray] | None:
    if values is None and weights is None:
        return None
    if values is None or weights is None:
        raise InvalidArgument(name, "one of values and weights", "both (from fit_spreads(..., laws=True)) or neither")
    v = np.asarray(values, dtype=np.float64).ravel()
    w = np.asarray(weights, dtype=np.float64).ravel()
    if (not len(v) or len(v) != len(w) or np.any(~np.isfinite(v)) or np.any(~np.isfinite(w)) or np.any(w < 0)
            or w.sum() <= 0 or (positive and np.any(v <= 0))):
        raise InvalidArgument(name, f"{len(v)} values, {len(w)} weights",
                              "equally many finite values" + (" > 0" if positive else "") + " and weights >= 0")
    return v, w / w.sum()


class OnlineLengthPredictor:
    """Predicts a completion's length from its prompt's prior, its finished and running siblings, and
    the prompt's earlier rollout steps (see the module docstring). Tokens everywhere; beliefs in log
    tokens.

    ``prior``: a ``LengthPredictor``, a number of tokens, a mapping prompt -> tokens (a prompt it does not name
    starts from the running mean, as without a prior), or None.
    ``prior_sigma``: spread of the prior's error in log space; ``prior_bias``: its mean (added to
    the prior's log). ``prior_offsets`` / ``prior_scales`` / ``prior_weights``: a mixture of normals
    for that error instead of N(0, prior_sigma^2) (from :func:`fit_spreads` with ``laws=True``).
    ``within_sigma``: spread of siblings' log lengths around their prompt's mean; ``spread_values`` /
    ``spread_weights``: a law of that spread per prompt instead (learnt from each prompt's siblings).
    ``forgetting`` in (0, 1]: weight of an observation from k rollout steps ago is forgetting**k (the
    empirical prior's running mean decays alike). ``spread_forgetting``: the same for the evidence
    about a prompt's spread (its earlier steps' scatter around their own step means, which a drift of
    the mean leaves alone; 1: kept whole).
    ``drift``: estimate a global per-step drift of log length and apply it to older observations.
    ``default_length``: the prior mean before anything is known (no prior, nothing observed).
    ``max_new_tokens``: cap of every prediction (a completion cannot be longer).
    ``residual_quantiles``: the shape of a sibling's standardised log length with one spread (from
    :func:`fit_spreads`; default normal); the predictive and the censored updates use it, the
    finished siblings' updates stay normal. Not with a spread law (its residuals are normal).
    """

    def __init__(self, prior: Any = None, *, prior_sigma: float = 0.6, prior_bias: float = 0.0,
                 within_sigma: float = 0.2, forgetting: float = 0.5, spread_forgetting: float = 1.0,
                 drift: bool = False,
                 default_length: int = 512, max_new_tokens: int | None = None,
                 residual_quantiles: Sequence[float] | None = None,
                 spread_values: Sequence[float] | None = None, spread_weights: Sequence[float] | None = None,
                 prior_offsets: Sequence[float] | None = None, prior_scales: Sequence[float] | None = None,
                 prior_weights: Sequence[float] | None = None):
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
        self.spread_forgetting = check_positive_float("spread_forgetting", spread_forgetting, maximum=1.0)
        self.drift = bool(drift)
        self.default_length = check_int("default_length", default_length, minimum=1)
        self.max_new_tokens = None if max_new_tokens is None else check_int("max_new_tokens", max_new_tokens,
                                                                            minimum=1)
        spread = _law("spread_values", spread_values, spread_weights, positive=True)
        if spread is not None and residual_quantiles is not None:
            raise InvalidArgument("residual_quantiles", "with a spread law", "None: with spread_values the "
                                                                              "residuals given the spread are normal")
        self.residuals = _Residuals(residual_quantiles)
        if prior_offsets is None and prior_scales is None and prior_weights is None:
            law = None
        else:
            if prior_scales is None or prior_offsets is None or prior_weights is None:
                raise InvalidArgument("prior_offsets", "part of a prior law", "prior_offsets, prior_scales and "
                                                                              "prior_weights together, or none")
            law = _law("prior_offsets", prior_offsets, prior_weights, positive=False)
            scales = np.asarray(prior_scales, dtype=np.float64).ravel()
            if len(scales) != len(law[0]) or np.any(~np.isfinite(scales)) or np.any(scales <= 0):
                raise InvalidArgument("prior_scales", f"{len(scales)} values", f"{len(law[0])} positive scales")
        # The prior x spread components (flattened): offset and scale of the prior's error, spread, log weight.
        offsets, scales, pw = (np.zeros(1), np.array([self.prior_sigma]), np.ones(1)) if law is None else \
            (law[0], scales, law[1])
        sv, sw = (np.array([self.within_sigma]), np.ones(1)) if spread is None else spread
        self._c_offset = np.repeat(offsets, len(sv))
        self._c_scale = np.repeat(scales, len(sv))
        self._c_sigma = np.tile(sv, len(offsets))
        with np.errstate(divide="ignore"):
            self._c_logw = np.log(np.repeat(pw, len(sv)) * np.tile(sw, len(offsets)))
        self._spread_values, self._n_prior = sv, len(offsets)
        self._simple = law is None and spread is None  # the one-normal, one-spread model (closed-form belief)
        self._prior_law = None if law is None else (offsets.tolist(), scales.tolist(), law[1].tolist())
        self._spread_law = None if spread is None else (sv.tolist(), sw.tolist())
        self._offsets: dict[float, float] = {}  # predictive quantiles of a prompt with nothing known, around its prior
        self.step = 0
        self._prompts: dict[Hashable, _Prompt] = {}
        self._sum_log = 0.0  # every finished observation, decayed across steps, for the empirical prior
        self._count = 0.0
        self._drift_sum = 0.0  # step-to-step changes of prompts' mean log length (drift estimate)
        self._drift_weight = 0.0

    # ------------------------------------------------------------------ construction
    @classmethod
    def fit(cls, groups: Mapping[Hashable, Sequence[int]], prior: Any = None, **options: Any) -> OnlineLengthPredictor:
        """A predictor whose laws are learnt from training ``groups`` (prompt -> sibling lengths,
        tokens): the per-prompt spread law always; the prior's error law (``prior_bias``,
        ``prior_sigma`` and the mixture) on these prompts, around the ``prior`` or, without one,
        around the groups' mean log length (where the empirical running mean settles). ``options`` as
        the constructor (explicit values win)."""
        if not isinstance(groups, Mapping) or not groups:
            raise InvalidArgument("groups", type(groups).__name__, "a non-empty mapping prompt -> sibling lengths")
        keys = list(groups)
        if prior is not None:
            probe = cls(prior, default_length=options.get("default_length", 512))
            priors = np.exp(probe._prior_means(keys))
        else:
            centre = float(np.mean(np.concatenate([np.log(np.asarray(groups[k], dtype=np.float64)) for k in keys])))
            priors = np.full(len(keys), math.exp(centre))
        spreads = fit_spreads([groups[k] for k in keys], priors, laws=True)
        if prior is None:
            spreads.pop("prior_bias")  # the empirical prior takes no bias
        return cls(prior, **{**spreads, **options})

    # ------------------------------------------------------------------ observations
    @property
    def informed(self) -> bool:
        """Whether its predictions rest on anything: a prior, or a length it was told. Before that every
        prompt is predicted ``default_length`` (a made-up number a placement should not act on)."""
        return self.prior is not None or self._count > 0

    def set_step(self, step: int) -> None:
        """Start rollout step ``step`` (>= the current one): observations from now on belong to it."""
        step = check_int("step", step, minimum=0)
        if step < self.step:
            raise InvalidArgument("step", step, f"at least the current step {self.step}")
        if step > self.step:
            decay = self.forgetting ** (step - self.step)
            self._sum_log *= decay
            self._count *= decay
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
        state.squares += y * y
        weight = self.forgetting ** (self.step - step)  # an observation of an earlier step counts decayed
        self._sum_log += weight * y
        self._count += weight

    # ------------------------------------------------------------------ saving what it learnt
    def state_dict(self, prompts: Iterable[Hashable] | None = None) -> dict[str, Any]:
        """What it has learnt, as JSON-ready data (``format`` ``lengthsched.online-state/1``): the current step, the
        running sums behind the empirical prior and the drift estimate, and per prompt its sufficient statistics
        (prompts must be strings; one of more than :data:`KEY_CHARS` characters saved under its digest,
        :func:`state_key`). Not its settings (the constructor's arguments: make the predictor the same
        way, then :meth:`load_state_dict`), nor the progress of completions still running. A predictor loaded
        from it predicts exactly as this one does.

        ``prompts``: only these prompts' statistics (those it knows; ``partial`` is then True): what changed
        since another predictor last took this one's state in, for :meth:`merge_state_dict` (a partial state
        cannot be loaded)."""
        if prompts is None:
            chosen = self._prompts
        else:
            keys = dict.fromkeys(state_key(p) for p in prompts)
            chosen = {k: self._prompts[k] for k in keys if k in self._prompts}
        bad = next((k for k in chosen if not isinstance(k, str)), None)
        if bad is not None:
            raise InvalidArgument("prompt", bad, "string prompt keys (the state is saved as JSON)")
        return {"format": STATE_FORMAT, "step": self.step, "sum_log": self._sum_log, "count": self._count,
                "drift_sum": self._drift_sum, "drift_weight": self._drift_weight, "partial": prompts is not None,
                "prompts": {k: [getattr(v, f) for f in _STATE_FIELDS] for k, v in chosen.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace what it has learnt with ``state`` (from :meth:`state_dict`, of every prompt); InvalidArgument
        naming the part that is wrong, the predictor unchanged."""
        if isinstance(state, Mapping) and state.get("partial"):
            raise InvalidArgument("state", "a partial state", "a state_dict() of every prompt (a partial one, "
                                                              "state_dict(prompts=...), is for merge_state_dict)")
        step, sums, prompts = _parse_state(state)
        self.step = step
        self._sum_log, self._count, self._drift_sum, self._drift_weight = sums
        self._prompts = prompts

    def replay_state_dict(self, state: Mapping[str, Any]) -> None:
        """Bring it forward by a later state of its own (:meth:`state_dict` written after the state it was loaded
        from; partial, ``state_dict(prompts=...)``, or whole): a restarted trainer rank replaying the changes it
        wrote after its whole state. The state's step and running sums become this predictor's, and each of its
        prompts' statistics replace this one's (the progress of running completions kept); a whole state is
        :meth:`load_state_dict`. InvalidArgument naming the part that is wrong (a step behind this predictor's
        among them), the predictor unchanged."""
        if not (isinstance(state, Mapping) and state.get("partial")):
            self.load_state_dict(state)
            return
        step, sums, prompts = _parse_state(state)
        if step < self.step:
            raise InvalidArgument("state step", step, f"at least this predictor's step {self.step} (a later state "
                                                      "of its own)")
        self.step = step
        self._sum_log, self._count, self._drift_sum, self._drift_weight = sums
        for key, theirs in prompts.items():
            mine = self._prompts.get(key)
            if mine is not None:
                theirs.running = mine.running
            self._prompts[key] = theirs

    def merge_state_dict(self, state: Mapping[str, Any]) -> int:
        """Take in what another predictor learnt (its :meth:`state_dict`): another trainer rank's, say, whose
        share of the prompts differs from this one's in every epoch. Each prompt the other saw more recently
        takes the other's statistics: the step of its latest observation is later, or the same with more
        evidence (finished siblings of that step plus the decayed weight of earlier ones); a prompt this one
        saw more recently, or as recently with as much evidence (its own statistics come back from a predictor
        that took them in), keeps its own, and the progress of its running completions in any case. A step
        ahead of this predictor's is taken as this one's (ranks count their steps apart; a prompt is not
        observed at a step ahead of its predictor; the same statistics taken in again change nothing). A prompt
        the other only predicted (no sibling finished there: no evidence, whatever its step) is never taken.
        The empirical prior's sums and the drift estimate stay this predictor's own, unless it has seen nothing
        yet. Both must be made alike (the same constructor arguments; not checked). ``state`` may be partial
        (``state_dict(prompts=...)``). Returns how many prompts took the other's statistics; InvalidArgument
        naming the part that is wrong, the predictor unchanged."""
        _, sums, prompts = _parse_state(state)
        taken = 0
        for key, theirs in prompts.items():
            if theirs.n == 0 and theirs.hist_weight <= 0:  # asked for, never observed there: it knows nothing
                continue
            mine = self._prompts.get(key)
            if mine is not None and (theirs.step, theirs.n + theirs.hist_weight) <= (mine.step,
                                                                                      mine.n + mine.hist_weight):
                continue
            theirs.step = min(theirs.step, self.step)
            if mine is not None and all(getattr(theirs, f) == getattr(mine, f) for f in _STATE_FIELDS):
                continue  # what it took before, its step ahead again
            if mine is not None:
                theirs.running = mine.running
            self._prompts[key] = theirs
            taken += 1
        if self._count == 0 and sums[1] > 0:
            self._sum_log, self._count, self._drift_sum, self._drift_weight = sums
        return taken

    def _state(self, prompt: Hashable) -> _Prompt:
        key = state_key(prompt)
        state = self._prompts.get(key)
        if state is None:
            state = _Prompt(prior_mean=self._start_means([prompt])[0], step=self.step)
            self._prompts[key] = state
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
        s = state.step
        between = state.total ** 2 / state.n if state.n else 0.0
        keep = self.spread_forgetting ** (step - state.step)
        state.hist_ss = (state.hist_ss + max(state.squares - between, 0.0)) * keep
        state.hist_dof = (state.hist_dof + max(state.n - 1, 0)) * keep
        state.hist_groups = (state.hist_groups + (1 if state.n else 0)) * decay
        state.hist_weight = (state.hist_weight + state.n) * decay
        state.hist_total = (state.hist_total + state.total) * decay
        state.hist_squares = (state.hist_squares + between) * decay
        state.hist_steps = (state.hist_steps + state.n * s) * decay
        state.hist_steps_y = (state.hist_steps_y + state.total * s) * decay
        state.hist_steps_sq = (state.hist_steps_sq + state.n * s * s) * decay
        state.n, state.total, state.squares, state.step = 0, 0.0, 0.0, step
        state.running.clear()

    def _prior_means(self, prompts: Sequence[Hashable], partial: bool = False) -> np.ndarray:
        """Prior mean log length of each prompt (the prior's prediction, bias-corrected). A mapping prior that
        does not know a prompt: NaN with ``partial`` (the prompt then starts from the running mean, as without a
        prior), else an error naming ``prior``."""
        prior = self.prior
        if prior is None:
            return np.full(len(prompts), self._empirical_mean())
        known = np.ones(len(prompts), dtype=bool)
        if isinstance(prior, Mapping):
            known = np.array([p in prior for p in prompts], dtype=bool)
            if not partial and not known.all():
                raise InvalidArgument("prior", [p for p, k in zip(prompts, known) if not k][:3],
                                      "a mapping that knows every prompt given here")
            values = np.array([float(prior[p]) if k else np.nan for p, k in zip(prompts, known)])
        elif hasattr(prior, "predict"):
            values = np.asarray(prior.predict(list(prompts)).lengths, dtype=np.float64)
        else:
            values = np.full(len(prompts), float(prior))
        if np.any(~np.isfinite(values[known])) or np.any(values[known] <= 0):
            raise InvalidArgument("prior", values[known][:3].tolist(), "positive, finite predictions (tokens)")
        return np.log(values) + self.prior_bias

    def _start_means(self, prompts: Sequence[Hashable]) -> list[float | None]:
        """Each new prompt's prior mean log length, or None where it starts from the running mean (no prior, or a
        mapping prior that does not name it): asked once per prompt, batched."""
        if self.prior is None:
            return [None] * len(prompts)
        return [None if math.isnan(m) else float(m) for m in self._prior_means(prompts, partial=True)]

    def _empirical_mean(self) -> float:
        return self._sum_log / self._count if self._count > 0 else math.log(self.default_length)

    def _centre(self, state: _Prompt) -> float:
        return self._empirical_mean() if state.prior_mean is None else state.prior_mean

    @property
    def drift_per_step(self) -> float:
        """The estimated drift of log length per rollout step (0 without ``drift``)."""
        if not self.drift or not self._drift_weight:
            return 0.0
        return self._drift_sum / self._drift_weight

    # ------------------------------------------------------------------ beliefs
    def _data(self, state: _Prompt) -> np.ndarray:
        """The likelihood's statistics of the prompt's log lengths, history (decayed, drift-corrected)
        and this step's finished siblings: about the mean, the weight N, the weighted sum T, the
        weighted sum of n_s * (step mean)^2 Q and the weighted count of steps E; about the spread, the
        within-step sums of squares SS and their degrees of freedom D. [N, T, Q, E, SS, D]."""
        between = state.total ** 2 / state.n if state.n else 0.0
        n = state.hist_weight + state.n
        t = state.hist_total + state.total
        q = state.hist_squares + between
        e = state.hist_groups + (1 if state.n else 0)
        ss = state.hist_ss + max(state.squares - between, 0.0)
        dof = state.hist_dof + max(state.n - 1, 0)
        if state.hist_weight and self.drift:
            d, s = self.drift_per_step, state.step
            ages = s * state.hist_weight - state.hist_steps  # sum of w * (s - s_i)
            ages_y = s * state.hist_total - state.hist_steps_y
            ages_sq = s * s * state.hist_weight - 2 * s * state.hist_steps + state.hist_steps_sq
            t += d * ages
            q += 2 * d * ages_y + d * d * ages_sq
        return np.array([n, t, q, e, ss, dof])

    def _components(self, centre: np.ndarray, data: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The belief of each prompt (rows; ``data`` its :meth:`_data` rows) as a mixture over the prior
        x spread components (columns): mean and variance of ``mu`` given the component, and the
        component's normalised log weight (its prior weight times the marginal likelihood of the
        data). Closed form (conjugacy)."""
        n, t, q, e, ss_within, dof = (data[:, i] for i in range(6))
        m0 = centre[:, None] + self._c_offset[None, :]
        b2 = self._c_scale[None, :] ** 2
        s2 = self._c_sigma[None, :] ** 2
        n_ = n[:, None]
        precision = 1.0 / b2 + n_ / s2
        var = 1.0 / precision
        mean = var * (m0 / b2 + t[:, None] / s2)
        safe = np.maximum(n_, 1e-12)
        ybar = t[:, None] / safe
        ss = np.maximum(q[:, None] - t[:, None] ** 2 / safe, 0.0) + ss_within[:, None]
        pred = b2 + s2 / safe
        loglik = (-(dof + e - 1.0)[:, None] * np.log(self._c_sigma[None, :]) - ss / (2 * s2)
                  - 0.5 * np.log(pred) - (ybar - m0) ** 2 / (2 * pred))
        logw = self._c_logw[None, :] + np.where(n_ > 0, loglik, 0.0)
        logw = logw - _logsumexp(logw, axis=1)[:, None]
        return mean, var, logw

    def belief(self, prompt: Hashable) -> tuple[float, float]:
        """(mean, variance) of the prompt's mean log length now, from the prior, its history and
        its finished siblings (running siblings are added by :meth:`predict`)."""
        state = self._state(prompt)
        if state.step < self.step:
            self._roll(state, self.step)
        return self._belief(state)

    def _belief(self, state: _Prompt) -> tuple[float, float]:
        data = self._data(state)
        n, t = data[0], data[1]
        centre = self._centre(state)
        if self._simple:
            w2, b2 = self.within_sigma ** 2, self.prior_sigma ** 2
            precision = 1.0 / b2 + n / w2
            return (centre / b2 + t / w2) / precision, 1.0 / precision
        mean, var, logw = self._components(np.array([centre]), data[None, :])
        w = np.exp(logw[0])
        m = float((w * mean[0]).sum())
        return m, float((w * (var[0] + mean[0] ** 2)).sum() - m * m)

    def _grid(self, mean: np.ndarray, var: np.ndarray, logw: np.ndarray, cuts: np.ndarray, counts: np.ndarray,
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The exact posterior of (mu, sigma) of one prompt on a grid: its closed-form belief (a mixture
        of normals over the components) times the survival of every running sibling (``cuts``: log of
        progress + 1, ``counts`` siblings each). Returns grid points (mu, sigma, log weight), flat."""
        k, spreads = self._n_prior, self._spread_values
        points = _SINGLE_POINTS if len(spreads) == 1 else _POINTS_PER_SPREAD
        mean, var, logw = (a.reshape(k, len(spreads)) for a in (mean, var, logw))
        mus, sigmas, logws = [], [], []
        for j, sigma in enumerate(spreads):
            alive = logw[:, j] > logw.max() - 30.0
            if not alive.any():
                continue
            m, v, lw = mean[alive, j], var[alive, j], logw[alive, j]
            sd = np.sqrt(v)
            lo, hi = float((m - 6 * sd).min()), float((m + 6 * sd).max())
            if len(cuts):
                hi = max(hi, float(cuts.max()) + 4 * sigma)

            def density(mu: np.ndarray, m=m, v=v, lw=lw, sigma=sigma) -> np.ndarray:
                dens = _logsumexp(lw[None, :] - 0.5 * np.log(v)[None, :] - (mu[:, None] - m[None, :]) ** 2
                                  / (2 * v[None, :]), axis=1)
                if len(cuts):
                    dens = dens + (counts[None, :] * self.residuals.log_sf((cuts[None, :] - mu[:, None]) / sigma)
                                   ).sum(axis=1)
                return dens

            mu = np.linspace(lo, hi, points)
            dens = density(mu)
            if len(cuts):  # the censored posterior may be far narrower than the range: zoom in on its mass
                keep = np.nonzero(dens > dens.max() - 30.0)[0]
                step = mu[1] - mu[0]
                lo2, hi2 = mu[keep[0]] - step, mu[keep[-1]] + step
                if hi2 - lo2 < 0.5 * (hi - lo):
                    mu = np.linspace(lo2, hi2, points)
                    dens = density(mu)
            mus.append(mu)
            sigmas.append(np.full(points, sigma))
            logws.append(dens + math.log(mu[1] - mu[0]))
        mu, sigma, lw = np.concatenate(mus), np.concatenate(sigmas), np.concatenate(logws)
        return mu, sigma, lw - _logsumexp(lw, axis=0)

    def _quantiles(self, loc: np.ndarray, scale: np.ndarray, logw: np.ndarray, cut: np.ndarray,
                   levels: Sequence[float]) -> dict[float, np.ndarray]:
        """Quantiles of log total length for rows of mixtures (``loc``, ``scale``, ``logw``: [rows,
        components], the sibling law's location and scale per component) truncated to ``> cut`` (-inf:
        no truncation): P(Y > y | Y > cut) = sum_c w_c P(e > (y - loc_c) / scale_c) / (the same at cut),
        read off a grid of y. Vectorised over rows."""
        rows = len(loc)
        out = {q: np.empty(rows) for q in levels}
        if not rows:
            return out
        finite = np.isfinite(cut)
        if loc.shape[1] == 1 and self.residuals.normal and not finite.any():  # one normal: exact
            for q in levels:
                out[q] = loc[:, 0] + scale[:, 0] * float(_inv_cdf(np.array([q]))[0])
            return out
        with np.errstate(invalid="ignore"):
            shifted = logw + np.where(finite[:, None], self.residuals.log_sf((cut[:, None] - loc) / scale), 0.0)
        # Components below e^-30 of the heaviest one (after truncation) cannot move a quantile: every term
        # of the predictive above the cut is at most the component's truncated weight. Keep the others.
        alive = shifted > (shifted.max(axis=1, keepdims=True) - 30.0)
        width = int(alive.sum(axis=1).max())
        if width < loc.shape[1]:
            keep = np.argsort(~alive, axis=1, kind="stable")[:, :width]
            loc, scale, logw, shifted = (np.take_along_axis(a, keep, axis=1) for a in (loc, scale, logw, shifted))
        start = _logsumexp(shifted, axis=1)  # log P(Y > cut)
        alive = shifted > (shifted.max(axis=1, keepdims=True) - 30.0)
        big = np.where(alive, scale, 0.0).max(axis=1)
        lo = np.where(finite, cut, np.where(alive, loc - 7 * scale, np.inf).min(axis=1))
        hi = np.where(alive, loc + 7 * scale, -np.inf).max(axis=1)
        hi = np.where(finite, np.maximum(hi, cut + 7 * big), hi)
        grid = np.linspace(0.0, 1.0, _PREDICTIVE_POINTS)
        per = max(1, _CHUNK // max(1, _PREDICTIVE_POINTS * loc.shape[1]))
        for a in range(0, rows, per):
            b = min(rows, a + per)
            y = lo[a:b, None] + (hi[a:b] - lo[a:b])[:, None] * grid[None, :]
            terms = logw[a:b, None, :] + self.residuals.log_sf((y[:, :, None] - loc[a:b, None, :])
                                                               / scale[a:b, None, :])
            log_sf = np.minimum.accumulate(_logsumexp(terms, axis=2), axis=1)  # log P(Y > y), decreasing
            for q in levels:
                target = start[a:b] + math.log1p(-q)  # P(Y > y | Y > cut) = 1 - q
                # bracket on the grid, then bisection on the exact mixture (the grid alone is coarse)
                above = np.clip((log_sf > target[:, None]).sum(axis=1), 1, _PREDICTIVE_POINTS - 1)
                left, right = y[np.arange(b - a), above - 1], y[np.arange(b - a), above]
                for _ in range(_BISECTIONS):
                    mid = 0.5 * (left + right)
                    value = _logsumexp(logw[a:b] + self.residuals.log_sf((mid[:, None] - loc[a:b]) / scale[a:b]),
                                       axis=1)
                    high = value > target
                    left, right = np.where(high, mid, left), np.where(high, right, mid)
                out[q][a:b] = 0.5 * (left + right)
        return out

    def _prior_offsets(self, levels: Sequence[float]) -> dict[float, float]:
        """Predictive quantiles of a prompt with nothing known, around its prior mean (cached)."""
        missing = [q for q in levels if q not in self._offsets]
        if missing:
            mean, var, logw = self._components(np.zeros(1), np.zeros((1, 6)))
            if self.residuals.normal:
                got = self._quantiles(mean, np.sqrt(var + self._c_sigma[None, :] ** 2), logw, np.array([-np.inf]),
                                      missing)
            else:
                mu, sigma, lw = self._grid(mean[0], var[0], logw[0], np.zeros(0), np.zeros(0))
                got = self._quantiles(mu[None], sigma[None], lw[None], np.array([-np.inf]), missing)
            self._offsets.update({q: float(v[0]) for q, v in got.items()})
        return {q: self._offsets[q] for q in levels}

    # ------------------------------------------------------------------ the protocol
    def predict(self, prompts: Sequence[Hashable], prefixes: Sequence[Any] | None = None, *,
                quantiles: Sequence[float] = (), completions: Sequence[Hashable] | None = None,
                ) -> LengthPrediction:
        """Remaining tokens of a completion of each ``prompts[i]`` that has generated ``prefixes[i]``
        (token ids or a count; None = nothing yet): the median of its predictive, truncated to more
        than it has generated, and the requested quantiles of it. ``completions[i]`` (optional; None
        = a fresh one): the completion asked about, so that its own observed progress
        (``observe(..., finished=False, completion=c)``) is not counted as a sibling's evidence but
        as its own lower bound (the larger of it and the prefix). Vectorised over the queries."""
        qs = _check_quantiles(quantiles)
        done = _prefix_lengths(prompts, prefixes)
        if completions is not None and len(completions) != len(prompts):
            raise InvalidArgument("completions", f"{len(completions)} ids", f"{len(prompts)}, one per prompt")
        keys = [state_key(p) for p in prompts]
        first: dict[Hashable, Hashable] = {}  # per key, a prompt with it (what the prior reads)
        for k, p in zip(keys, prompts):
            first.setdefault(k, p)
        unseen = [k for k in first if k not in self._prompts]
        if unseen:  # one batched call to the prior for every new prompt
            for k, m in zip(unseen, self._start_means([first[k] for k in unseen])):
                self._prompts[k] = _Prompt(prior_mean=m, step=self.step)
        levels = sorted({0.5, *qs})
        rows_of: dict[Hashable, list[int]] = {}
        for i, k in enumerate(keys):
            rows_of.setdefault(k, []).append(i)
        log_total = {q: np.empty(len(prompts)) for q in levels}
        own = np.zeros(len(prompts), dtype=np.int64)  # each query's own observed progress (if running)
        offsets = None
        closed: list[tuple[Hashable, list[int]]] = []  # prompts without informative running siblings
        exact: list[tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]] = []  # grid posteriors
        for p, rows in rows_of.items():
            state = self._prompts[p]
            if state.step < self.step:
                self._roll(state, self.step)
            if completions is not None:
                for i in rows:
                    own[i] = state.running.get(completions[i], 0) if completions[i] is not None else 0
                    done[i] = max(done[i], own[i])
            informative = {c: k for c, k in state.running.items() if k > 0}
            if not informative and state.hist_weight + state.n == 0:
                empty = [i for i in rows if done[i] == 0]
                if empty:
                    offsets = offsets or self._prior_offsets(levels)
                    for q in levels:
                        log_total[q][empty] = self._centre(state) + offsets[q]
                rows = [i for i in rows if done[i] > 0]
                if not rows:
                    continue
            if not informative and self.residuals.normal:
                closed.append((p, rows))
                continue
            # censored siblings (or a non-normal residual law): the grid posterior, without each
            # query's own censored observation
            mean, var, logw = self._components(np.array([self._centre(state)]), self._data(state)[None, :])
            cuts, counts = np.unique(np.log(np.array(list(informative.values()), dtype=np.float64) + 1.0),
                                     return_counts=True)
            mu, sigma, lw = self._grid(mean[0], var[0], logw[0], cuts, counts.astype(np.float64))
            groups: dict[int, list[int]] = {}
            for i in rows:
                groups.setdefault(int(own[i]) if completions is not None and
                                  informative.get(completions[i], 0) > 0 else 0, []).append(i)
            for k, members in groups.items():
                w = lw
                if k > 0:  # take the query's own censored observation out of the belief
                    w = lw - self.residuals.log_sf((math.log(k + 1.0) - mu) / sigma)
                    w = w - _logsumexp(w, axis=0)
                exact.append((mu, sigma, w, members))
        if closed:
            prompts_c = [p for p, _ in closed]
            data = np.array([self._data(self._prompts[p]) for p in prompts_c], dtype=np.float64).reshape(-1, 6)
            centre = np.array([self._centre(self._prompts[p]) for p in prompts_c])
            mean, var, logw = self._components(centre, data)
            index = np.repeat(np.arange(len(closed)), [len(r) for _, r in closed])
            rows = np.concatenate([np.asarray(r, dtype=np.int64) for _, r in closed])
            cut = np.where(done[rows] > 0, np.log(done[rows] + 1.0), -np.inf)
            got = self._quantiles(mean[index], np.sqrt(var + self._c_sigma[None, :] ** 2)[index], logw[index], cut,
                                  levels)
            for q in levels:
                log_total[q][rows] = got[q]
        if exact:
            width = max(len(mu) for mu, _, _, _ in exact)
            count = sum(len(m) for _, _, _, m in exact)
            loc, scale, lw = np.zeros((count, width)), np.ones((count, width)), np.full((count, width), -np.inf)
            rows, r = np.empty(count, dtype=np.int64), 0
            for mu, sigma, w, members in exact:
                for i in members:
                    loc[r, :len(mu)], scale[r, :len(mu)], lw[r, :len(mu)] = mu, sigma, w
                    rows[r] = i
                    r += 1
            cut = np.where(done[rows] > 0, np.log(done[rows] + 1.0), -np.inf)
            got = self._quantiles(loc, scale, lw, cut, levels)
            for q in levels:
                log_total[q][rows] = got[q]

        def remaining(q: float, rounding) -> np.ndarray:
            total = np.exp(log_total[q])
            if self.max_new_tokens is not None:
                total = np.minimum(total, self.max_new_tokens)
            return np.maximum(1, rounding(total - done)).astype(np.int64)

        return LengthPrediction(remaining(0.5, np.rint), {q: remaining(q, np.ceil) for q in qs})

    def __repr__(self) -> str:
        spread = f"within_sigma={self.within_sigma:.3f}" if self._spread_law is None else \
            f"a spread law over {len(self._spread_values)} values"
        return (f"OnlineLengthPredictor(prior={type(self.prior).__name__}, prior_sigma={self.prior_sigma:.3f}, "
                f"{spread}, forgetting={self.forgetting}, drift={self.drift}, "
                f"{len(self._prompts)} prompts, step {self.step})")


def fit_forgetting(histories: Mapping[Hashable, Mapping[int, Sequence[int]]], prior: Any = None, *,
                   rates: Sequence[float] = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3), **options: Any,
                   ) -> tuple[float, dict[float, float]]:
    """The forgetting rate that best predicts each step of a prompt from its earlier ones: for each
    rate, :class:`OnlineLengthPredictor` (``prior``, ``options``) replays ``histories`` (prompt ->
    {step: lengths}) step by step and scores every length of a step that has an earlier one by its
    log predictive density before the step is observed (normal sibling residuals). Returns the best
    rate and the mean log score of each. A policy whose lengths drift gets a smaller rate; lengths
    that do not drift, 1 (or near)."""
    if not isinstance(histories, Mapping) or not histories:
        raise InvalidArgument("histories", type(histories).__name__, "a non-empty mapping prompt -> {step: lengths}")
    rates = [check_positive_float("rates", r, maximum=1.0) for r in rates]
    if not rates:
        raise InvalidArgument("rates", rates, "at least one forgetting rate in (0, 1]")
    steps = sorted({check_int("step", s, minimum=0) for h in histories.values() for s in h})
    scores = {}
    for rate in rates:
        predictor = OnlineLengthPredictor(prior, **{**options, "forgetting": rate})
        total, count = 0.0, 0
        seen: set = set()
        for step in steps:
            predictor.set_step(step)
            asked = [p for p, h in histories.items() if step in h and p in seen]
            if asked:
                states = [predictor._state(p) for p in asked]
                for state in states:
                    if state.step < step:
                        predictor._roll(state, step)
                centre = np.array([predictor._centre(st) for st in states])
                mean, var, logw = predictor._components(centre, np.array([predictor._data(st) for st in states]))
                scale2 = var + predictor._c_sigma[None, :] ** 2
                for i, p in enumerate(asked):
                    y = np.log(np.asarray(histories[p][step], dtype=np.float64))
                    dens = (logw[i][None, :] - 0.5 * np.log(2 * math.pi * scale2[i])[None, :]
                            - (y[:, None] - mean[i][None, :]) ** 2 / (2 * scale2[i][None, :]))
                    total += float(_logsumexp(dens, axis=1).sum())
                    count += len(y)
            for p, h in histories.items():
                if step in h:
                    for length in h[step]:
                        predictor.observe(p, int(length), step=step)
                    seen.add(p)
        if not count:
            raise InvalidArgument("histories", f"{len(histories)} prompts", "some prompt seen in two steps or more")
        scores[rate] = total / count
    return max(scores, key=scores.get), scores


def resumed_remaining(priors: Sequence[float], finished: Sequence[Sequence[int]], progress: Sequence[Sequence[int]],
                      *, within_sigma: float | None = None, prior_sigma: float = 0.5,
                      max_new_tokens: int | None = None) -> list[np.ndarray]:
    """Tokens each unfinished sample of a group still has to generate when a partial rollout resumes
    the group (slime's ``--partial-rollout`` returns an aborted group with the samples that finished and
    the others' partial responses): per group i, the median of what :class:`OnlineLengthPredictor`
    predicts for a sample that has generated ``progress[i][j]`` tokens, given the group's prediction
    ``priors[i]`` (tokens, a prompt-level prediction with log-normal error ``prior_sigma``) and the
    lengths of its samples that finished, ``finished[i]`` (tokens). A sample that outran its prediction
    is not taken for nearly done (``max(1, prediction - generated)`` would say 1 token): its own
    progress truncates the predictive, and finished siblings move the group's belief.
    ``within_sigma``: the siblings' spread of log length (None: the predictor's default; a
    framework knows it from the groups it kept, :func:`lengthsched.placement.sibling_spread`).
    Returns one array per group, one value (>= 1) per ``progress`` entry."""
    if not (len(priors) == len(finished) == len(progress)):
        raise InvalidArgument("priors", f"{len(priors)} groups", f"{len(progress)}, as many as finished and progress")
    from .integrations.rollout import remaining_after

    options: dict[str, Any] = {} if within_sigma is None else {
        "within_sigma": check_positive_float("within_sigma", within_sigma)}
    prior = {i: check_positive_float("priors", float(p)) for i, p in enumerate(priors)}
    online = OnlineLengthPredictor(prior, prior_sigma=prior_sigma, max_new_tokens=max_new_tokens, **options)
    return remaining_after(online, range(len(priors)), finished, progress, max_new_tokens=max_new_tokens)
