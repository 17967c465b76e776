"""Evaluation of :class:`lengthsched.online.OnlineLengthPredictor` on real sibling groups (numpy + scipy;
no torch, so ``lengthsched eval-predictor --online`` runs on any machine).

Data (:func:`load_groups`): JSON lines, one group of sibling completions per line, in the CASTILLO
format (``dataset``, ``split``, ``prompt_id``, ``prompt_tokens``, ``lengths``) or the simulator's
rollout-log trace format (``prompt_id``, ``prompt_tokens``, ``lengths``, optional ``predicted``), each
with an optional integer ``step`` (the rollout step; default 0) and ``split``. Several lines of one
prompt at different steps are its history.

Protocol of :func:`evaluate_online` (cross-fitted): the prompts are split in two halves by a hash of
their id; the laws (the per-prompt spread law and the prior's mixture law, ``prior_sigma`` /
``prior_bias``; with ``laws=False`` one spread and the pooled residual law), the forgetting rate
(:func:`~lengthsched.online.fit_forgetting` on the fit half's history, unless ``options`` sets it)
and the regression prior are fitted on one half and the other half is evaluated, then the other way
round; the two evaluations are pooled. In each group of a prompt's current step, ``k`` siblings are
revealed and the others predicted:

- order ``finish``: the ``k`` shortest are revealed (GRPO sees siblings finish shortest first); the
  others are observed as running with progress ``t`` = the k-th shortest length and each is asked
  about as itself (``completions=``: its progress ``t`` bounds it, its siblings' progress is
  evidence); predicted total = t + predicted remaining;
- order ``random``: ``k`` random siblings (seeded) are revealed; the others are predicted from the
  start (no progress);
- ``k = -1``: all but one.

Without history every (prompt, step) group is evaluated alone. With history the rollout is replayed
step by step: a group is evaluated after the prompt's earlier steps were observed (with ``step=``);
a prompt with a single step (CASTILLO) is split at random (seeded) into an earlier step 0 holding
half its samples (``len // 2``) and the current step 1 holding the rest, so with 10 samples the
history is 5 samples and siblings are revealed among the other 5.

Metrics over the predicted (prompt, sibling) pairs, pooled: Kendall tau-b (scipy) and MAE of the
predicted TOTAL length (progress + predicted remaining) against the true length, and the coverage of
the predicted q0.9 (share of true lengths <= progress + predicted q0.9 of the remaining); a 95%
bootstrap interval of tau-b over prompts. Reference rows: ``prior`` (k = 0 without history: the
prior alone) and ``ceiling`` (the raw statistic of the finished samples known: in ``random`` order
and for ``k = 0`` with history their mean, one sample itself; in ``finish`` order the revealed
minimum, i.e. the first sibling to finish).

:func:`drift_experiment` simulates RL steps on the groups, each step's lengths a bootstrap of the
prompt's samples times ``(1 + growth) ** step``, and reports the MAE of predictions made with no
sibling revealed, from history only, per step, for several forgetting rates, with and without the
drift estimate, against a predictor frozen after step 0 and against the same run without growth.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lengthsched.errors import InvalidArgument, as_lengths, check_int, check_positive_float
from lengthsched.io import read_json_objects
from lengthsched.online import OnlineLengthPredictor, fit_forgetting, fit_spreads

__all__ = ["PromptGroup", "load_groups", "load_prior", "limit_groups", "evaluate_online", "drift_experiment",
           "regression_prior", "check_targets", "format_online", "format_drift", "format_targets", "TARGETS"]

ORDERS = ("finish", "random")
QUANTILE = 0.9
#: The issue's targets: tau-b after one finished sibling and with five, the q0.9 coverage band, and
#: the drifted MAE relative to the no-drift MAE.
TARGETS = {"tau_one": 0.80, "tau_five": 0.85, "coverage": (0.87, 0.93), "drift_ratio": 1.10}


@dataclass
class PromptGroup:
    """One prompt's sibling lengths (tokens) per rollout step, its prompt length (tokens, or None) and
    its split / source labels."""

    prompt_id: str
    steps: dict[int, np.ndarray]
    prompt_tokens: int | None = None
    split: str | None = None
    source: str = ""

    @property
    def lengths(self) -> np.ndarray:
        """Every sample, earlier steps first."""
        return np.concatenate([self.steps[s] for s in sorted(self.steps)])


# ---------------------------------------------------------------------------------------------- data
def _bad(argument: str, path: str, line: int, what: str) -> InvalidArgument:
    return InvalidArgument(argument, f"{path} line {line}", what)


def load_groups(path: str | Path, *, splits: Iterable[str] | None = None, argument: str = "data",
                ) -> dict[str, PromptGroup]:
    """Groups from a JSON-lines file in the CASTILLO or rollout-trace format (see the module docstring):
    ``{prompt_id: PromptGroup}`` in file order. ``splits``: keep only lines whose ``split`` is one of
    these. Lines of one prompt at the same step are merged. A bad line raises
    :class:`~lengthsched.errors.InvalidArgument` naming ``argument``, the path and the line number."""
    name = str(path)
    wanted = None if splits is None else set(splits)
    groups: dict[str, PromptGroup] = {}
    for number, rec in read_json_objects(path, argument):
        if "prompt_id" not in rec or isinstance(rec["prompt_id"], (dict, list)) or rec["prompt_id"] is None:
            raise _bad(argument, name, number, "a 'prompt_id' (string or number)")
        if "lengths" not in rec:
            raise _bad(argument, name, number, "a 'lengths' list (sampled completion lengths, tokens)")
        try:
            lengths = as_lengths("lengths", rec["lengths"], minimum=1)
            step = check_int("step", rec.get("step", 0), minimum=0)
            tokens = rec.get("prompt_tokens")
            tokens = None if tokens is None else check_int("prompt_tokens", tokens, minimum=0)
            if rec.get("predicted") is not None:
                predicted = as_lengths("predicted", rec["predicted"], minimum=1)
                if len(predicted) != len(lengths):
                    raise InvalidArgument("predicted", f"{len(predicted)} values", f"{len(lengths)}, one per length")
        except InvalidArgument as exc:
            raise _bad(argument, name, number, f"field '{exc.name}': {exc.expected}, got {exc.value!r:.60}") \
                from None
        split = rec.get("split")
        if split is not None and not isinstance(split, str):
            raise _bad(argument, name, number, "'split' a string such as train or validate")
        if wanted is not None and split not in wanted:
            continue
        pid = str(rec["prompt_id"])
        group = groups.get(pid)
        if group is None:
            group = groups[pid] = PromptGroup(pid, {}, tokens, split, str(rec.get("dataset", "")))
        elif tokens is not None and group.prompt_tokens is not None and tokens != group.prompt_tokens:
            raise _bad(argument, name, number, f"the same 'prompt_tokens' on every line of prompt {pid!r} "
                                               f"({group.prompt_tokens} earlier)")
        old = group.steps.get(step)
        group.steps[step] = lengths if old is None else np.concatenate([old, lengths])
    if not groups:
        raise InvalidArgument(argument, name, "at least one group" + ("" if wanted is None else
                                                                       f" with split in {sorted(wanted)}"))
    return groups


def limit_groups(groups: Mapping[str, PromptGroup], limit: int) -> dict[str, PromptGroup]:
    """The first ``limit`` prompts of each source (dataset), in order."""
    limit = check_int("limit", limit, minimum=1)
    counts: dict[str, int] = {}
    out = {}
    for pid, g in groups.items():
        counts[g.source] = counts.get(g.source, 0) + 1
        if counts[g.source] <= limit:
            out[pid] = g
    return out


def load_prior(path: str | Path, *, argument: str = "prior") -> dict[str, float]:
    """A prior mapping prompt_id -> tokens from a JSON file: ``{prompt_id: tokens}``, or columns
    ``{"id": [...], "seed0": [...], "seed1": [...], ...}`` (per-prompt predictions of several seeds, as
    ``benchmarks/bench_predictor.py`` keeps its cross-fitted predictions): the geometric mean of the
    ``seed*`` columns."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgument(argument, str(path), f"a readable JSON file ({exc.__class__.__name__})") from None
    if isinstance(data, dict) and isinstance(data.get("id"), list):
        seeds = sorted(k for k in data if k.startswith("seed") and isinstance(data[k], list))
        if not seeds or any(len(data[k]) != len(data["id"]) for k in seeds):
            raise InvalidArgument(argument, str(path), "columns 'id' and 'seed0', 'seed1', ... of equal length")
        try:
            values = np.exp(np.mean(np.log(np.array([data[k] for k in seeds], dtype=np.float64)), axis=0))
        except (TypeError, ValueError):
            raise InvalidArgument(argument, str(path), "numbers in the seed columns") from None
        out = {str(i): float(v) for i, v in zip(data["id"], values)}
    elif isinstance(data, dict):
        out = {}
        for k, v in data.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise InvalidArgument(argument, f"{path}: {k!r}: {v!r:.40}", "a number of tokens per prompt_id")
            out[str(k)] = float(v)
    else:
        raise InvalidArgument(argument, str(path), "a JSON object {prompt_id: tokens} or columns id, seed0, ...")
    bad = [k for k, v in out.items() if not (math.isfinite(v) and v > 0)]
    if bad or not out:
        raise InvalidArgument(argument, str(path), "positive, finite predictions (tokens)"
                              + (f"; bad: {bad[:3]}" if bad else ""))
    return out


def _as_groups(groups: Any) -> dict[str, PromptGroup]:
    """Accept ``{prompt: PromptGroup}``, ``{prompt: lengths}`` or ``{prompt: {step: lengths}}``."""
    if not isinstance(groups, Mapping) or not groups:
        raise InvalidArgument("groups", type(groups).__name__, "a non-empty mapping prompt -> lengths, "
                                                               "{step: lengths} or PromptGroup")
    out = {}
    for pid, g in groups.items():
        if isinstance(g, PromptGroup):
            out[str(pid)] = g
        elif isinstance(g, Mapping):
            if not g:
                raise InvalidArgument("groups", {pid: g}, "at least one step per prompt")
            out[str(pid)] = PromptGroup(str(pid), {check_int("step", s, minimum=0): as_lengths("groups", v, minimum=1)
                                                   for s, v in g.items()})
        else:
            out[str(pid)] = PromptGroup(str(pid), {0: as_lengths("groups", g, minimum=1)})
    return out


def _hash_unit(key: str, salt: str) -> float:
    digest = hashlib.blake2b(f"{salt}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0 ** 64


def _hash_int(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


# ---------------------------------------------------------------------------------------------- priors
def regression_prior(groups: Mapping[str, PromptGroup]) -> tuple[float, float]:
    """``(a, b)`` of the least-squares line ``log length ~ a + b log prompt_tokens`` over every sample
    of ``groups`` (prompt_tokens below 1 count as 1)."""
    xs, ys = [], []
    for g in groups.values():
        if g.prompt_tokens is None:
            raise InvalidArgument("prior", "regression", f"prompt_tokens for every prompt ({g.prompt_id!r} has none)")
        lengths = g.lengths
        xs.append(np.full(len(lengths), math.log(max(g.prompt_tokens, 1))))
        ys.append(np.log(lengths))
    x, y = np.concatenate(xs), np.concatenate(ys)
    if np.ptp(x) == 0:
        return float(y.mean()), 0.0
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


def _prior_lengths(spec: Any, fit: Mapping[str, PromptGroup], prompts: Mapping[str, PromptGroup]) -> dict | None:
    """Prior tokens per prompt of ``prompts`` (None: the empirical running mean)."""
    if isinstance(spec, str) and spec == "none":
        return None
    if isinstance(spec, str) and spec == "regression":
        a, b = regression_prior(fit)
        for g in prompts.values():
            if g.prompt_tokens is None:
                raise InvalidArgument("prior", "regression", f"prompt_tokens for every prompt ({g.prompt_id!r} "
                                                             "has none)")
        return {p: math.exp(a + b * math.log(max(g.prompt_tokens, 1))) for p, g in prompts.items()}
    if isinstance(spec, Mapping):
        missing = [p for p in prompts if p not in spec]
        if missing:
            raise InvalidArgument("prior", f"a mapping without {missing[:3]}", "a prediction (tokens) for every prompt")
        out = {p: float(spec[p]) for p in prompts}
        bad = [p for p, v in out.items() if not (math.isfinite(v) and v > 0)]
        if bad:
            raise InvalidArgument("prior", {p: out[p] for p in bad[:3]}, "positive, finite predictions (tokens)")
        return out
    raise InvalidArgument("prior", spec, "'none', 'regression' or a mapping prompt_id -> tokens")


def _spreads(fit: Mapping[str, PromptGroup], prior: dict | None, laws: bool = True) -> dict[str, Any]:
    """Spreads fitted on the fit half: one group per (prompt, step) with >= 2 samples. Without a prior
    the prior's law is measured around the fit half's mean log length (what the empirical running
    mean converges to), as ``OnlineLengthPredictor.fit`` does. ``laws``: the per-prompt spread law and
    the prior's mixture law (``fit_spreads(..., laws=True)``), else one spread and the pooled residual
    law."""
    keys = [(p, s) for p, g in fit.items() for s, v in g.steps.items() if len(v) >= 2]
    if not keys:
        raise InvalidArgument("groups", f"{len(fit)} prompts in the fit half", "groups of at least 2 samples")
    samples = [fit[p].steps[s] for p, s in keys]
    if prior is None:
        centre = math.exp(float(np.mean(np.log(np.concatenate(samples)))))
        out = fit_spreads(samples, [centre] * len(samples), laws=laws)
        out.pop("prior_bias")  # the empirical prior takes no bias
        return out
    return fit_spreads(samples, [prior[p] for p, _ in keys], laws=laws)


# ---------------------------------------------------------------------------------------------- evaluation
@dataclass
class _Episode:
    """One group at one step: observed as history, or evaluated (siblings revealed, others predicted)."""

    step: int
    key: Hashable  # the predictor's prompt key
    prompt: str
    lengths: np.ndarray
    evaluate: bool
    history: list = field(default_factory=list)  # earlier samples of the prompt (for the ceiling)


def _timeline(groups: Mapping[str, PromptGroup], history: bool, seed: int) -> list[_Episode]:
    out = []
    for pid, g in groups.items():
        steps = sorted(g.steps)
        if not history:
            out += [_Episode(s, (pid, s), pid, g.steps[s], True) for s in steps]
        elif len(steps) > 1:
            seen: list = []
            for i, s in enumerate(steps):
                out.append(_Episode(s, pid, pid, g.steps[s], i > 0, list(seen)))
                seen += g.steps[s].tolist()
        else:
            lengths = g.steps[steps[0]]
            if len(lengths) < 2:
                continue
            perm = np.random.default_rng([seed, 7, _hash_int(pid)]).permutation(len(lengths))
            half = len(lengths) // 2
            out.append(_Episode(0, pid, pid, lengths[perm[:half]], False))
            out.append(_Episode(1, pid, pid, lengths[perm[half:]], True, lengths[perm[:half]].tolist()))
    out.sort(key=lambda e: e.step)
    return out


def _replay(timeline: list[_Episode], predictor: OnlineLengthPredictor, order: str, k: int, seed: int,
            quantile: float) -> dict[str, np.ndarray]:
    """Reveal ``k`` siblings (``-1``: all but one) of every evaluated episode, predict the others and
    observe everything step by step. Returns per predicted sibling: prompt, true length, predicted
    total, predicted q total, and the ceiling's statistic."""
    rows: dict[str, list] = {"prompt": [], "true": [], "point": [], "upper": [], "ceiling": []}
    by_step: dict[int, list[_Episode]] = {}
    for ep in timeline:
        by_step.setdefault(ep.step, []).append(ep)
    for step in sorted(by_step):
        predictor.set_step(max(step, predictor.step))
        queries, pending = [], []
        for ep in by_step[step]:
            n = len(ep.lengths)
            kk = n - 1 if k < 0 else k
            if not ep.evaluate or kk >= n:
                continue
            if order == "finish":
                idx = np.argsort(ep.lengths, kind="stable")
            else:
                idx = np.random.default_rng([seed, 11, _hash_int(ep.prompt), ep.step]).permutation(n)
            shown, hidden = idx[:kk], idx[kk:]
            progress = int(ep.lengths[shown[-1]]) if (order == "finish" and kk) else 0
            for j in shown:
                predictor.observe(ep.key, int(ep.lengths[j]), completion=int(j), step=ep.step)
            if progress:
                for j in hidden:
                    predictor.observe(ep.key, progress, finished=False, completion=int(j), step=ep.step)
            known = ep.history + ep.lengths[shown].tolist()
            if order == "finish" and kk:
                stat = float(ep.lengths[shown].min())
            else:
                stat = float(np.mean(known)) if known else math.nan
            # a running sibling is asked about as itself: its own progress bounds it, and is no
            # evidence about its siblings' law (they are all at the same progress: one query)
            queries.append((ep.key, progress, int(hidden[0]) if progress else None))
            pending.append((ep, hidden, progress, stat))
        if queries:
            res = predictor.predict([q[0] for q in queries], [q[1] for q in queries], quantiles=[quantile],
                                    completions=[q[2] for q in queries])
            upper = res.quantile(quantile)
            for i, (ep, hidden, progress, stat) in enumerate(pending):
                m = len(hidden)
                rows["prompt"] += [ep.prompt] * m
                rows["true"].append(ep.lengths[hidden])
                rows["point"].append(np.full(m, progress + int(res.lengths[i])))
                rows["upper"].append(np.full(m, progress + int(upper[i])))
                rows["ceiling"].append(np.full(m, stat))
        for ep in by_step[step]:  # every sample of the step is history from now on
            observed = _observed_set(ep, order, k, seed) if ep.evaluate else set()
            for j, length in enumerate(ep.lengths):
                if j not in observed:
                    predictor.observe(ep.key, int(length), completion=j, step=ep.step)
    out = {name: np.concatenate(v) if v else np.zeros(0) for name, v in rows.items() if name != "prompt"}
    out["prompt"] = np.asarray(rows["prompt"], dtype=object)
    return out


def _observed_set(ep: _Episode, order: str, k: int, seed: int) -> set[int]:
    """The samples of an evaluated episode already observed as finished (the revealed ones)."""
    n = len(ep.lengths)
    kk = n - 1 if k < 0 else k
    if kk >= n:
        return set()
    if order == "finish":
        idx = np.argsort(ep.lengths, kind="stable")
    else:
        idx = np.random.default_rng([seed, 11, _hash_int(ep.prompt), ep.step]).permutation(n)
    return {int(j) for j in idx[:kk]}


def _kendall(x: np.ndarray, y: np.ndarray) -> float:
    from scipy import stats

    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0
    return float(stats.kendalltau(x, y, variant="b").statistic)


def _metrics(prompts: np.ndarray, true: np.ndarray, pred: np.ndarray, upper: np.ndarray | None, bootstrap: int,
             seed: int) -> dict[str, Any]:
    out = {"tau_b": _kendall(pred, true), "mae": float(np.mean(np.abs(pred - true))),
           "coverage": None if upper is None else float(np.mean(true <= upper)), "pairs": int(len(true)),
           "prompts": int(len(set(prompts.tolist()))), "tau_b_ci": None}
    if bootstrap and len(true) > 1:
        ids, inverse = np.unique(prompts.astype(str), return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        starts = np.searchsorted(inverse[order], np.arange(len(ids) + 1))
        rng = np.random.default_rng([seed, 13])
        taus = []
        for _ in range(bootstrap):
            pick = rng.integers(0, len(ids), len(ids))
            idx = np.concatenate([order[starts[i]:starts[i + 1]] for i in pick])
            taus.append(_kendall(pred[idx], true[idx]))
        out["tau_b_ci"] = [float(np.quantile(taus, 0.025)), float(np.quantile(taus, 0.975))]
    return out


def _halves(groups: Mapping[str, PromptGroup], fit_fraction: float, seed: int) -> list[tuple[dict, dict]]:
    a = {p: g for p, g in groups.items() if _hash_unit(p, f"lengthsched-online-{seed}") < fit_fraction}
    b = {p: g for p, g in groups.items() if p not in a}
    if not a or not b:
        raise InvalidArgument("groups", f"{len(groups)} prompts", "enough prompts for both halves of the cross-fit "
                                                                  f"(fit_fraction {fit_fraction})")
    return [(a, b), (b, a)]


def _siblings_label(k: int) -> str:
    return "n-1" if k < 0 else str(k)


def evaluate_online(groups: Mapping[str, Any], *, fit_fraction: float = 0.5, seed: int = 0,
                    siblings: Sequence[int] = (0, 1, 2, 4, 5, -1), orders: Sequence[str] = ORDERS,
                    history: Sequence[bool] = (False, True), prior: Any = "none",
                    options: Mapping[str, Any] | None = None, bootstrap: int = 200,
                    quantile: float = QUANTILE, prior_name: str | None = None, laws: bool = True,
                    ) -> dict[str, Any]:
    """Cross-fitted evaluation of the online predictor (the protocol is the module docstring's).

    ``groups``: ``{prompt_id: PromptGroup}`` (from :func:`load_groups`), ``{prompt_id: lengths}`` or
    ``{prompt_id: {step: lengths}}``. ``siblings``: how many siblings are revealed (``-1``: all but
    one). ``prior``: ``"none"`` (the empirical running mean), ``"regression"`` (log length on log
    prompt tokens, fitted on the fit half) or a mapping prompt_id -> tokens. ``options``: extra
    :class:`OnlineLengthPredictor` arguments (e.g. ``forgetting``; without it the rate is fitted on
    the fit half's history by :func:`~lengthsched.online.fit_forgetting`). ``bootstrap``: resamples of prompts
    for the 95% interval of tau-b (0: none). ``prior_name``: how the tables name a mapping prior.
    ``laws``: fit the per-prompt spread law and the prior's mixture law (the default), else the
    single-spread model with the pooled residual law.

    Returns ``{"rows": [...], "fitted": [...], "protocol": {...}}``; a row holds prior, order,
    siblings, history, method (``online``, ``prior``, ``ceiling``), statistic, tau_b, tau_b_ci, mae,
    coverage (q0.9; None for the ceiling), pairs and prompts."""
    groups = _as_groups(groups)
    fit_fraction = check_positive_float("fit_fraction", fit_fraction, maximum=1.0)
    if fit_fraction >= 1.0:
        raise InvalidArgument("fit_fraction", fit_fraction, "a number in (0, 1)")
    seed = check_int("seed", seed, minimum=0)
    bootstrap = check_int("bootstrap", bootstrap, minimum=0)
    quantile = check_positive_float("quantile", quantile, maximum=1.0 - 1e-9)
    ks = [check_int("siblings", k, minimum=-1) for k in siblings]
    if not ks:
        raise InvalidArgument("siblings", siblings, "at least one count of revealed siblings (-1: all but one)")
    orders = list(orders)
    if not orders or any(o not in ORDERS for o in orders):
        raise InvalidArgument("orders", orders, "some of " + ", ".join(ORDERS))
    history = [bool(h) for h in history]
    if not history:
        raise InvalidArgument("history", history, "False and/or True")
    options = dict(options or {})
    if not (isinstance(prior, str) and prior in ("none", "regression")) and not isinstance(prior, Mapping):
        raise InvalidArgument("prior", prior, "'none', 'regression' or a mapping prompt_id -> tokens")
    prior_name = prior if isinstance(prior, str) else (prior_name or "mapping")
    halves = _halves(groups, fit_fraction, seed)
    setups = []
    for fit, test in halves:
        tokens = _prior_lengths(prior, fit, {**fit, **test})
        spreads = {**_spreads(fit, None if tokens is None else {p: tokens[p] for p in fit}, laws), **options}
        if "forgetting" not in options and any(history):  # the rate fitted on the fit half's history
            histories: dict = {}
            for ep in _timeline(fit, True, seed):
                histories.setdefault(ep.key, {})[ep.step] = ep.lengths
            prior_map = None if tokens is None else {p: tokens[p] for p in histories}
            spreads["forgetting"] = fit_forgetting(histories, prior_map, **spreads)[0]
        setups.append((fit, test, tokens, spreads))

    def run(order: str, k: int, hist: bool) -> dict[str, np.ndarray]:
        parts = []
        for fit, test, tokens, spreads in setups:
            timeline = _timeline(test, hist, seed)
            prior_map = None if tokens is None else {ep.key: tokens[ep.prompt] for ep in timeline}
            predictor = OnlineLengthPredictor(prior_map, **spreads)
            if tokens is None:  # the empirical prior starts from the fit half's lengths, as in a running job
                for p, g in fit.items():
                    for length in g.lengths:
                        predictor.observe(("fit", p), int(length))
            parts.append(_replay(timeline, predictor, order, k, seed, quantile))
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}

    rows = []
    for hist in history:
        sizes = {len(ep.lengths) for _, test, _, _ in setups for ep in _timeline(test, hist, seed) if ep.evaluate}
        for k in ks:
            if k < 0 and len(sizes) == 1 and (min(sizes) - 1) in ks:
                continue  # all but one is one of the explicit counts (5 | 5 with history): the same row
            for order in (["-"] if k == 0 else orders):
                data = run("random" if order == "-" else order, k, hist)
                if not len(data["true"]):
                    continue
                base = {"prior": prior_name, "order": order, "siblings": _siblings_label(k), "history": hist}
                method = "prior" if (k == 0 and not hist) else "online"
                rows.append({**base, "method": method, "statistic": "predictor",
                             **_metrics(data["prompt"], data["true"], data["point"], data["upper"], bootstrap, seed)})
                if k == 0 and not hist:
                    continue
                stat = ("first finished (min)" if order == "finish" else
                        "mean of history + revealed" if hist else ("the sibling" if k == 1 else "mean of revealed"))
                ok = np.isfinite(data["ceiling"])
                rows.append({**base, "method": "ceiling", "statistic": stat,
                             **_metrics(data["prompt"][ok], data["true"][ok], data["ceiling"][ok], None, bootstrap,
                                        seed)})
    fitted = [{"fit_prompts": len(fit), "eval_prompts": len(test),
               **{k: v for k, v in spreads.items() if k != "residual_quantiles"}}
              for fit, test, _, spreads in setups]
    protocol = {"fit_fraction": fit_fraction, "seed": seed, "siblings": ks, "orders": orders, "history": history,
                "prior": prior_name, "options": options, "bootstrap": bootstrap, "quantile": quantile, "laws": laws,
                "prompts": len(groups), "samples": int(sum(len(g.lengths) for g in groups.values()))}
    return {"rows": rows, "fitted": fitted, "protocol": protocol}


# ---------------------------------------------------------------------------------------------- drift
def drift_experiment(groups: Mapping[str, Any], *, steps: int = 20, growth: float = 0.03,
                     forgettings: Sequence[float] = (1.0, 0.7, 0.5, 0.3), growth_spread: float = 0.0,
                     group_size: int | None = None, prior: Any = "none", burn_in: int = 3, seed: int = 0,
                     prior_name: str | None = None) -> dict[str, Any]:
    """Simulated RL steps on real groups: at step ``s`` each prompt draws ``group_size`` completions
    (default: as many as it has samples) by bootstrap from its samples (its last step's), times
    ``(1 + growth_i) ** s``, rounded, at least 1, where ``growth_i = growth + growth_spread * z_i``,
    ``z_i ~ N(0, 1)`` per prompt (``growth_spread = 0``: every prompt drifts alike). Each step first
    predicts every completion with no sibling revealed (history only), then observes them all with
    ``step=s``.

    Configurations: each forgetting rate with and without ``drift=True``, and ``frozen`` (forgetting
    1, observed at step 0 only, never updated after). Each runs twice on the same draws: with
    ``growth`` and without (growth 0). Reported per step: MAE (tokens), the relative MAE (MAE / mean
    true length) and its ratio to the no-growth run's (1: drift costs nothing). ``burn_in``: the
    first steps left out of the summary (``max_ratio_after_burn_in``). The spreads are fitted on
    all the groups (they are the model's two spreads and residual shape; the experiment is about
    following drift; a ``regression`` prior too)."""
    groups = _as_groups(groups)
    steps = check_int("steps", steps, minimum=2)
    growth = float(growth)
    if not math.isfinite(growth) or growth <= -1:
        raise InvalidArgument("growth", growth, "a number > -1 (relative growth of lengths per step)")
    spread = float(growth_spread)
    if not math.isfinite(spread) or spread < 0:
        raise InvalidArgument("growth_spread", growth_spread, "a number >= 0")
    rates = [check_positive_float("forgettings", f, maximum=1.0) for f in forgettings]
    burn_in = check_int("burn_in", burn_in, minimum=0)
    if burn_in >= steps:
        raise InvalidArgument("burn_in", burn_in, f"fewer than steps={steps}")
    seed = check_int("seed", seed, minimum=0)
    base = {p: g.steps[max(g.steps)] for p, g in groups.items()}
    if group_size is not None:
        group_size = check_int("group_size", group_size, minimum=1)
    pids = list(base)
    tokens = _prior_lengths(prior, groups, groups)
    spreads = _spreads({p: PromptGroup(p, {0: v}) for p, v in base.items()}, tokens)
    draws = []  # draws[s][i]: unscaled lengths of prompt i at step s (the same for both runs)
    for s in range(steps):
        draws.append([np.random.default_rng([seed, 17, s, i]).choice(base[p], size=group_size or len(base[p]))
                      for i, p in enumerate(pids)])

    rates_per_prompt = growth + spread * np.random.default_rng([seed, 19]).standard_normal(len(pids))
    if np.any(rates_per_prompt <= -1):
        raise InvalidArgument("growth_spread", growth_spread, "a spread that keeps every prompt's growth > -1")

    def run(config: dict, g: np.ndarray) -> list[dict[str, float]]:
        predictor = OnlineLengthPredictor(tokens, **{**spreads, **config["options"]})
        per_step = []
        for s in range(steps):
            scale = (1.0 + g) ** s  # per prompt
            lengths = [np.maximum(1, np.rint(d * sc)).astype(np.int64) for d, sc in zip(draws[s], scale)]
            if not (config["frozen"] and s > 0):
                predictor.set_step(s)
            point = predictor.predict(pids).lengths
            true = np.concatenate(lengths)
            pred = np.repeat(point.astype(np.float64), [len(x) for x in lengths])
            mae = float(np.mean(np.abs(pred - true)))
            per_step.append({"step": s, "mae": mae, "relative_mae": mae / float(np.mean(true)),
                             "mean_length": float(np.mean(true)),
                             "drift_per_step": predictor.drift_per_step})
            if config["frozen"] and s > 0:
                continue
            for p, x in zip(pids, lengths):
                for length in x:
                    predictor.observe(p, int(length), step=s)
        return per_step

    configs = [{"name": f"forgetting {f:g}" + (", drift" if d else ""), "forgetting": f, "drift": d, "frozen": False,
                "options": {"forgetting": f, "drift": d}} for f in rates for d in (False, True)]
    configs.append({"name": "frozen after step 0", "forgetting": 1.0, "drift": False, "frozen": True,
                    "options": {"forgetting": 1.0, "drift": False}})
    out = []
    for c in configs:
        grown, flat = run(c, rates_per_prompt), run(c, np.zeros(len(pids)))
        for a, b in zip(grown, flat):
            a["no_drift_mae"] = b["mae"]
            a["no_drift_relative_mae"] = b["relative_mae"]
            a["ratio"] = a["relative_mae"] / b["relative_mae"] if b["relative_mae"] > 0 else math.nan
        after = [a["ratio"] for a in grown[burn_in:]]
        out.append({k: v for k, v in c.items() if k != "options"} | {
            "per_step": grown, "max_ratio_after_burn_in": float(max(after)),
            "mean_ratio_after_burn_in": float(np.mean(after)),
            "mean_relative_mae_after_burn_in": float(np.mean([a["relative_mae"] for a in grown[burn_in:]])),
            "mean_no_drift_relative_mae_after_burn_in": float(np.mean([a["no_drift_relative_mae"]
                                                                       for a in grown[burn_in:]]))})
    best_flat = min(c["mean_no_drift_relative_mae_after_burn_in"] for c in out if not c["frozen"])
    for c in out:
        c["vs_best_no_drift"] = c["mean_relative_mae_after_burn_in"] / best_flat
    protocol = {"steps": steps, "growth": growth, "growth_spread": spread, "forgettings": rates,
                "group_size": group_size, "prior": prior if isinstance(prior, str) else (prior_name or "mapping"),
                "burn_in": burn_in, "seed": seed, "prompts": len(pids),
                "spreads": {k: v for k, v in spreads.items() if k != "residual_quantiles"}}
    return {"configs": out, "protocol": protocol}


# ---------------------------------------------------------------------------------------------- targets, tables
def check_targets(evaluation: Mapping[str, Any] | None = None, drift: Mapping[str, Any] | None = None,
                  ) -> list[dict[str, Any]]:
    """The issue's targets (:data:`TARGETS`) checked against results of :func:`evaluate_online` and
    :func:`drift_experiment`: tau-b after one finished sibling and with five (order ``finish``, no
    history); the q0.9 coverage of every row with siblings revealed, per order, and of the rows with
    none (the prior alone, and history only); the drift ratio of the best configuration. One dict per
    target and prior: target, prior, value (a range for coverage), met."""
    out = []
    if evaluation is not None:
        rows = [r for r in evaluation["rows"] if r["method"] in ("online", "prior")]
        prior = evaluation["protocol"]["prior"]
        for k, key, label in (("1", "tau_one", "tau-b >= 0.80 after one finished sibling"),
                              ("5", "tau_five", "tau-b >= 0.85 with five finished siblings")):
            hit = [r for r in rows if r["order"] == "finish" and r["siblings"] == k and not r["history"]]
            if hit:
                out.append({"target": label, "prior": prior, "value": hit[0]["tau_b"],
                            "met": hit[0]["tau_b"] >= TARGETS[key]})
        lo, hi = TARGETS["coverage"]
        groups = [(f"every k >= 1, {order} order, with and without history", lambda r, o=order: r["order"] == o)
                  for order in ORDERS]
        groups.append(("k = 0 (the prior alone; history only)", lambda r: r["siblings"] == "0"))
        for label, keep in groups:
            values = [r["coverage"] for r in rows if keep(r) and r["coverage"] is not None]
            if values:
                out.append({"target": f"q0.9 coverage in [{lo}, {hi}] at {label}",
                            "prior": prior, "value": [min(values), max(values)],
                            "met": all(lo <= v <= hi for v in values)})
    if drift is not None:
        best = min((c for c in drift["configs"] if not c["frozen"]), key=lambda c: c["max_ratio_after_burn_in"])
        out.append({"target": f"drifted relative MAE within 10% of no-drift after step {drift['protocol']['burn_in']}"
                              f" (best: {best['name']})", "prior": drift["protocol"]["prior"],
                    "value": best["max_ratio_after_burn_in"],
                    "met": best["max_ratio_after_burn_in"] <= TARGETS["drift_ratio"]})
    return out


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return "nan" if not math.isfinite(v) else f"{v:.{digits}f}"
    return str(v)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    cells = [header] + [[_fmt(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), rule] + [line(r) for r in cells[1:]])


def format_online(evaluation: Mapping[str, Any]) -> str:
    """The rows of :func:`evaluate_online` as a Markdown table."""
    p = evaluation["protocol"]
    head = (f"online predictor, prior {p['prior']}: {p['prompts']} prompts, {p['samples']} samples, cross-fitted "
            f"(fit fraction {p['fit_fraction']}, seed {p['seed']}); tau-b, MAE (tokens) and q{p['quantile']:g} "
            f"coverage over predicted (prompt, sibling) pairs; 95% bootstrap interval of tau-b over prompts")
    body = []
    for r in evaluation["rows"]:
        ci = "-" if r["tau_b_ci"] is None else f"{r['tau_b_ci'][0]:.3f}..{r['tau_b_ci'][1]:.3f}"
        body.append([r["order"], r["siblings"], "yes" if r["history"] else "no", r["method"], r["statistic"],
                     r["tau_b"], ci, r["mae"], r["coverage"], r["pairs"]])
    return head + "\n\n" + _table(["order", "siblings", "history", "method", "statistic", "tau-b", "tau-b 95%",
                                   "MAE", f"cov q{p['quantile']:g}", "pairs"], body)


def format_drift(drift: Mapping[str, Any]) -> str:
    """The summary of :func:`drift_experiment` as a Markdown table, and the MAE per step of the best
    configuration next to the frozen predictor."""
    p = drift["protocol"]
    spread = f" (per prompt: growth + {p['growth_spread']:g} z)" if p.get("growth_spread") else ""
    head = (f"drift: {p['prompts']} prompts, {p['steps']} steps, lengths x{1 + p['growth']:g} per step{spread}, prior "
            f"{p['prior']}; relative MAE = MAE / mean length; ratio = relative MAE with growth / without "
            f"(same draws); means and max over steps >= {p['burn_in']}")
    body = [[c["name"], c["mean_relative_mae_after_burn_in"], c["mean_no_drift_relative_mae_after_burn_in"],
             c["mean_ratio_after_burn_in"], c["max_ratio_after_burn_in"], c["vs_best_no_drift"],
             c["per_step"][-1]["mae"], c["per_step"][-1]["drift_per_step"]] for c in drift["configs"]]
    text = head + "\n\n" + _table(["configuration", "rel. MAE", "rel. MAE no drift", "mean ratio", "max ratio",
                                   "vs best no-drift", "MAE last step", "drift/step (log)"], body)
    best = min((c for c in drift["configs"] if not c["frozen"]), key=lambda c: c["max_ratio_after_burn_in"])
    frozen = next(c for c in drift["configs"] if c["frozen"])
    steps = [[a["step"], a["mean_length"], a["mae"], a["no_drift_mae"], a["ratio"], f["mae"], f["ratio"]]
             for a, f in zip(best["per_step"], frozen["per_step"])]
    text += (f"\n\nper step: {best['name']} (best) against the frozen predictor\n\n" +
             _table(["step", "mean length", "MAE", "MAE no drift", "ratio", "frozen MAE", "frozen ratio"], steps))
    return text


def format_targets(targets: Sequence[Mapping[str, Any]]) -> str:
    """The :func:`check_targets` list as a Markdown table."""
    body = [[t["target"], t["prior"], t["value"] if not isinstance(t["value"], list)
             else f"{t['value'][0]:.3f}..{t['value'][1]:.3f}", "met" if t["met"] else "NOT met"] for t in targets]
    return _table(["target", "prior", "value", "met"], body)
