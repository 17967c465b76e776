"""Difficulty: which groups a dynamic-sampling filter drops, tied to how long they run.

DAPO's dynamic sampling (slime's ``check_reward_nonzero_std``, verl's ``filter_groups``) drops a group whose
rewards all agree: every completion right (an easy prompt) or every one wrong (a hard one). In RL on
reasoning tasks hard prompts also run long, so the groups dropped are not a random share of the work: the
long ones are dropped more often, and the time spent on them is lost. ``run_oversampled_steps(valid=)``
takes one flag per group; this module draws those flags from a model of difficulty instead of at random:

- each prompt has a probability ``p`` that a completion is rewarded (correct), drawn from a Beta law;
- ``p`` is tied to the prompt's median completion length through a Gaussian copula: the normal score of
  ``p`` is ``correlation`` x the normal score of the prompt's rank by median length plus independent noise
  (``correlation`` < 0: longer prompts are harder);
- each completion of a group is rewarded independently with probability ``p`` (within a group, reward and
  length are independent), and the group passes the filter when its rewards are not all equal.

:data:`DEFAULT_DIFFICULTY` is fitted (:func:`fit_difficulty`) to GPT-3's labelled solutions of the 1,319
GSM8K test questions (``data/gsm8k_gpt3_solutions.csv.gz``: four solutions per question, by four models,
each with its length in words and whether it is correct): the Beta law by maximum likelihood on the number
of correct solutions per question (beta-binomial, 4 trials), the copula's correlation so that the simulated
rank correlation between that number and the solutions' mean log length matches the data's (-0.38; the
questions none of the four solved run 1.63 x as long as those all four solved). Four solutions from four
different models are not a group of one policy: the law's spread is wider than one model's, and the data
says nothing about reasoning models, whose long wrong answers may tie length to difficulty more strongly.
Pass your own :class:`Difficulty` where you know your task's.

Across epochs the same prompts draw their rewards again from the same chances, unless the policy learns:
:func:`learnt_rates` raises every prompt's log-odds by a drift per epoch (each prompt at its own log-normal
speed; a sensitivity knob, fitted to nothing), and :func:`run_epochs` records the filter's verdicts of earlier
epochs (with their sides: all right or all wrong) in a :class:`lengthsched.FilterHistory`, GRESO's skip
(:class:`lengthsched.SelectiveRollout`) applied in them when given.
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lengthsched import InvalidArgument
from lengthsched.errors import check_int

__all__ = ["DEFAULT_DIFFICULTY", "Difficulty", "fit_difficulty", "pass_rates", "rewarded", "filter_passes",
           "filter_sides", "observe_sides", "record_epoch", "selective_stream", "learnt_rates", "run_epochs"]

DIFFICULTY_FILE = Path(__file__).with_name("data") / "gsm8k_gpt3_solutions.csv.gz"


@dataclass(frozen=True)
class Difficulty:
    """A law of prompt difficulty: a completion of a prompt is rewarded with probability ``p``,
    ``p ~ Beta(alpha, beta)`` over prompts, tied to the prompt's median completion length (tokens) by a
    Gaussian copula of ``correlation`` (in (-1, 1); negative: the longer, the harder; 0: independent)."""

    alpha: float
    beta: float
    correlation: float

    def __post_init__(self) -> None:
        for name in ("alpha", "beta"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not np.isfinite(value) or value <= 0:
                raise InvalidArgument(name, value, "a finite number > 0 (a Beta law's shape)")
        c = self.correlation
        if not isinstance(c, (int, float)) or isinstance(c, bool) or not np.isfinite(c) or not -1 < c < 1:
            raise InvalidArgument("correlation", c, "a number in (-1, 1)")

    @property
    def mean(self) -> float:
        """The mean probability that a completion is rewarded."""
        return self.alpha / (self.alpha + self.beta)

    def pass_share(self, group_size: int) -> float:
        """The expected share of groups of ``group_size`` completions whose rewards are not all equal (those
        DAPO's filter keeps): ``1 - E[p^G + (1 - p)^G]`` under the Beta law."""
        from scipy.special import betaln

        g = check_int("group_size", group_size, minimum=1)
        a, b = self.alpha, self.beta
        same = np.exp(betaln(a + g, b) - betaln(a, b)) + np.exp(betaln(a, b + g) - betaln(a, b))
        return float(1.0 - same)


#: Fitted to GSM8K's labelled GPT-3 solutions by :func:`fit_difficulty` (``fit_difficulty()`` reproduces it to
#: the digits given; tests/test_difficulty.py checks).
DEFAULT_DIFFICULTY = Difficulty(alpha=0.709, beta=1.163, correlation=-0.52)


def _read(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(words, correct), each questions x solutions, from a file of ``DIFFICULTY_FILE``'s format."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            header = handle.readline().strip().split(",")
            rows = [line.strip().split(",") for line in handle if line.strip()]
    except OSError as exc:
        raise InvalidArgument("path", str(path), f"a readable CSV of solution words and correctness ({exc})") from exc
    words = [i for i, h in enumerate(header) if h.endswith("_words")]
    correct = [i for i, h in enumerate(header) if h.endswith("_correct")]
    if not words or len(words) != len(correct) or not rows:
        raise InvalidArgument("path", str(path), "a header of <solver>_words,<solver>_correct columns and rows")
    data = np.array(rows, dtype=np.float64)
    return data[:, words], data[:, correct]


def fit_difficulty(path: str | Path | None = None, *, draws: int = 200_000, seed: int = 0) -> Difficulty:
    """Fit a :class:`Difficulty` to labelled solutions (``path``: a CSV with ``<solver>_words`` and
    ``<solver>_correct`` columns, one row per question; None: the bundled GSM8K file): the Beta law by
    maximum likelihood on the number of correct solutions per question (beta-binomial), the copula's
    correlation by bisection so that ``draws`` simulated questions (seed ``seed``; their solutions' log
    lengths as noisy as the data's within a question) give the data's Spearman correlation between that
    number and the mean log length."""
    from scipy import optimize, stats

    draws = check_int("draws", draws, minimum=1000)
    words, correct = _read(DIFFICULTY_FILE if path is None else path)
    n = correct.shape[1]
    k = correct.sum(axis=1).astype(np.int64)
    fit = optimize.minimize(lambda t: -stats.betabinom.logpmf(k, n, np.exp(t[0]), np.exp(t[1])).sum(), [0.0, 0.0],
                            method="Nelder-Mead", options={"xatol": 1e-6, "fatol": 1e-9})
    alpha, beta = (float(x) for x in np.exp(fit.x))
    logs = np.log(np.maximum(words, 1.0))
    mean = logs.mean(axis=1)
    target = float(stats.spearmanr(k, mean)[0])
    within = float(logs.std(axis=1, ddof=1).mean())  # a solution's log length about its question's
    between = float(np.sqrt(max(mean.var() - within ** 2 / n, 1e-12)))
    rng = np.random.default_rng(seed)
    z_len, z_own, noise = rng.standard_normal(draws), rng.standard_normal(draws), rng.standard_normal((draws, n))
    u = rng.random((draws, n))
    observed = z_len * between + noise.mean(axis=1) * within

    def simulated(rho: float) -> float:
        p = stats.beta.ppf(stats.norm.cdf(rho * z_len + np.sqrt(1 - rho ** 2) * z_own), alpha, beta)
        return float(stats.spearmanr((u < p[:, None]).sum(axis=1), observed)[0])

    lo, hi = -0.99, 0.99  # simulated() increases with rho
    for _ in range(20):
        mid = (lo + hi) / 2
        if simulated(mid) > target:
            hi = mid
        else:
            lo = mid
    return Difficulty(alpha=alpha, beta=beta, correlation=(lo + hi) / 2)


def pass_rates(groups: Sequence[Any], difficulty: Difficulty = DEFAULT_DIFFICULTY, *, seed: int = 0) -> np.ndarray:
    """Per group of ``groups`` (objects with ``lengths``: each prompt's completions), the probability ``p``
    that one of its completions is rewarded, drawn (seed ``seed``) from ``difficulty``: the Beta law, tied to
    the group's median length by the copula (ranks among ``groups``; ties share their mean rank). Draw them
    once per prompt and keep them across epochs: a prompt's difficulty is its own."""
    from scipy import stats

    if not isinstance(difficulty, Difficulty):
        raise InvalidArgument("difficulty", type(difficulty).__name__, "a simulate.difficulty.Difficulty")
    groups = list(groups)
    if not groups:
        return np.zeros(0, dtype=np.float64)
    medians = np.array([np.median(np.asarray(g.lengths, dtype=np.float64)) if len(g.lengths) else 0.0
                        for g in groups])
    rng = np.random.default_rng(check_int("seed", seed, minimum=0))
    z_len = stats.norm.ppf((stats.rankdata(medians) - 0.5) / len(groups))
    rho = difficulty.correlation
    z = rho * z_len + np.sqrt(1.0 - rho ** 2) * rng.standard_normal(len(groups))
    return np.asarray(stats.beta.ppf(stats.norm.cdf(z), difficulty.alpha, difficulty.beta), dtype=np.float64)


def rewarded(rates: Any, group_size: int, *, seed: int = 0, epoch: int = 0) -> np.ndarray:
    """Per group, how many of its ``group_size`` completions are rewarded: binomial draws of ``rates`` (per
    group, in [0, 1]), from a stream of its own per (``seed``, ``epoch``): another epoch of the same prompts
    draws again from the same rates."""
    rates = np.asarray(rates, dtype=np.float64)
    if rates.ndim != 1 or not np.all((rates >= 0) & (rates <= 1)):
        raise InvalidArgument("rates", f"{rates.size} values", "one probability in [0, 1] per group")
    g = check_int("group_size", group_size, minimum=1)
    rng = np.random.default_rng([check_int("seed", seed, minimum=0), check_int("epoch", epoch, minimum=0), 7])
    return rng.binomial(g, rates).astype(np.int64)


def filter_passes(rates: Any, group_size: int, *, seed: int = 0, epoch: int = 0) -> np.ndarray:
    """Per group, whether DAPO's dynamic-sampling filter keeps it (its ``group_size`` rewards not all equal),
    the rewards drawn by :func:`rewarded`: what ``simulate.run_oversampled_steps(valid=)`` takes."""
    k = rewarded(rates, group_size, seed=seed, epoch=epoch)
    return (k > 0) & (k < group_size)


def filter_sides(rates: Any, group_size: int, *, seed: int = 0, epoch: int = 0) -> list[str | None]:
    """Per group, why DAPO's filter drops it: ``"easy"`` (every completion rewarded), ``"hard"`` (none), or None
    (it passes), the rewards drawn by :func:`rewarded` (the same draws as :func:`filter_passes`)."""
    k = rewarded(rates, group_size, seed=seed, epoch=epoch)
    return ["easy" if x == group_size else "hard" if x == 0 else None for x in k.tolist()]


def record_epoch(history: Any, groups: Sequence[Any], rates: Any, group_size: int, *, seed: int = 0,
                 epoch: int = 0) -> np.ndarray:
    """Draw one epoch of the filter's verdicts on ``groups`` (:func:`filter_sides`) and record each in ``history``
    (a :class:`lengthsched.FilterHistory`, keyed by ``prompt_id``, with the side of every dropped group), as
    ``lengthsched.integrations.slime.dynamic_sampling_filter`` records them; returns whether each group passed."""
    sides = filter_sides(rates, group_size, seed=seed, epoch=epoch)
    observe_sides(history, groups, sides)
    return np.array([side is None for side in sides], dtype=bool)


def observe_sides(history: Any, groups: Sequence[Any], sides: Sequence[str | None]) -> None:
    """Record in ``history`` (keyed by ``prompt_id``) what the filter did with each of ``groups``: ``sides`` as
    :func:`filter_sides` gives them (None: kept; ``"easy"`` or ``"hard"``: dropped, and why)."""
    history.observe_many([g.prompt_id for g in groups], [side is None for side in sides], sides)


def selective_stream(groups: Sequence[Any], history: Any, rule: Any) -> np.ndarray:
    """Which of ``groups`` run (True) and which ``rule`` (a :class:`lengthsched.SelectiveRollout`) skips by what
    ``history`` holds for their prompts: GRESO's skip as the dataloader serves an epoch's prompts (the rule's
    exploration probabilities as they are; it adapts between epochs, not within one)."""
    return rule.select(history, [g.prompt_id for g in groups])


def learnt_rates(rates: Any, epoch: int, *, drift: float = 0.0, spread: float = 0.5, seed: int = 0) -> np.ndarray:
    """``rates`` (each prompt's chance of a rewarded completion at epoch 0) after ``epoch`` epochs of a policy
    that learns: each prompt's log-odds grow by ``drift x s`` per epoch, ``s`` its own learning speed, log-normal
    with median 1 and ``spread`` the standard deviation of its log, drawn once per prompt (seed ``seed``). ``drift``
    0 (the default) leaves them as they are, the model the benchmarks use unless they say otherwise. Not fitted to
    anything: a sensitivity knob. Log-odds are taken on rates clipped to [1e-9, 1 - 1e-9], and no rate is ever
    lowered (a prompt at 1 stays at 1; one at 0 stays practically unsolvable, its log-odds starting at -20.7)."""
    rates = np.asarray(rates, dtype=np.float64)
    if rates.ndim != 1 or not np.all((rates >= 0) & (rates <= 1)):
        raise InvalidArgument("rates", f"{rates.size} values", "one probability in [0, 1] per group")
    epoch = check_int("epoch", epoch, minimum=0)
    for name, value in (("drift", drift), ("spread", spread)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not np.isfinite(value) or value < 0:
            raise InvalidArgument(name, value, "a finite number >= 0 (log-odds per epoch)" if name == "drift" else
                                  "a finite number >= 0 (the sd of the log learning speed)")
    if drift == 0 or epoch == 0:
        return rates.copy()
    speed = np.exp(spread * np.random.default_rng([check_int("seed", seed, minimum=0), 11]).standard_normal(rates.size))
    from scipy.special import expit, logit

    p = np.clip(rates, 1e-9, 1 - 1e-9)
    return np.maximum(rates, expit(logit(p) + epoch * drift * speed))


def run_epochs(groups: Sequence[Any], rates: Any, group_size: int, epochs: int, history: Any, *, rule: Any = None,
               drift: float = 0.0, spread: float = 0.5, seed: int = 0) -> np.ndarray:
    """The filter's verdicts over ``epochs`` epochs of ``groups`` before the one a benchmark runs, recorded in
    ``history`` (:func:`record_epoch`'s way, epoch ``e``'s rates :func:`learnt_rates` ``(rates, e, drift=...)``).
    With ``rule`` (a :class:`lengthsched.SelectiveRollout`) every epoch first skips by what ``history`` holds then
    (a skipped prompt is not generated, so nothing is recorded for it: its streak stands), and the rule adapts
    after each epoch (GRESO adapts after every step; one epoch is the grain here). Returns, per epoch and group,
    whether it ran (an ``epochs x len(groups)`` boolean array)."""
    groups = list(groups)
    epochs = check_int("epochs", epochs, minimum=0)
    keys = [g.prompt_id for g in groups]
    ran = np.ones((epochs, len(groups)), dtype=bool)
    for e in range(epochs):
        if rule is not None:
            ran[e] = rule.select(history, keys)
        sides = filter_sides(learnt_rates(rates, e, drift=drift, spread=spread, seed=seed), group_size, seed=seed,
                             epoch=e)
        on = np.flatnonzero(ran[e])
        observe_sides(history, [groups[i] for i in on], [sides[i] for i in on])
        if rule is not None:
            rule.adapt(history)
    return ran
