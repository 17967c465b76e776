"""sGPO over a training run in the simulator: how each way of sizing groups spends rollout seconds, and what
learning signal it gets for them, while the policy's success on each prompt changes from epoch to epoch.

GRPO learns from a group only when its completions' rewards differ (an *informative* group: some solved, some
not); a group that is all right or all wrong has zero advantages and costs its rollout for nothing. sGPO sizes each
prompt's group near 1/p (p its success rate), so a group expects about one success. Four ways of sizing, on the
same prompts, the same success rates and the same draws:

- ``fixed``: every prompt at G (the trainer's ``rollout.n``);
- ``offline``: a profiling pass of ``profile_samples`` completions per prompt before training (its rollout seconds
  counted), then :func:`lengthsched.sgpo.plan_budget`'s sizes for the whole run, its dropped prompts left out of
  the data (``lengthsched budget --verl-data``);
- ``online``: :class:`lengthsched.sgpo.OnlineBudget` (``lengthsched.sgpo`` in verl's v1 trainer): G until a prompt
  was seen, then sizes from its own latest groups, a dropped prompt at ``g_min``;
- ``oracle``: sizes from each prompt's true success rate of the epoch (plan_budget's rule, dropped prompts left
  out): what sizing could do knowing p; it rests on knowledge no trainer has.

The policy's success on a prompt moves in logit space by a per-prompt rate each epoch (drawn; zero for some
prompts, so both the stuck and the learnt are there). **Learning itself is not modelled**: the rates are the same
under every sizing, while a sizing that finds more informative groups would in truth learn faster. Completion
lengths are CASTILLO's (a prompt's siblings resampled), independent of success (in reasoning RL wrong answers run
longer: not modelled). Each epoch's prompts go in batches of ``batch_prompts`` (the same shuffled order for every
sizing; a sizing that drops prompts runs fewer steps) through :func:`simulate.run_rollout` (its policy, replicas
and pools, prompt-level predictions with log-normal error 0.5), and an epoch's seconds are its steps' summed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lengthsched.errors import InvalidArgument, check_int
from lengthsched.sgpo import BudgetConfig, BudgetPlan, OnlineBudget, ProfileRecord, plan_budget, prompt_decision

from .rollout import run_rollout
from .workloads import Group, castillo_groups

__all__ = ["SGPO_SIZINGS", "SgpoEpoch", "SgpoTraining", "TrainingPrompt", "drifting_prompts", "prompts_from_profile",
           "run_sgpo_training"]

#: The ways of sizing groups :func:`run_sgpo_training` compares (the module docstring).
SGPO_SIZINGS = ("fixed", "offline", "online", "oracle")


@dataclass(frozen=True)
class TrainingPrompt:
    """A prompt of a simulated training run: its ``id``, ``prompt_len`` (tokens), ``lengths`` (tokens: the pool its
    completions are drawn from), ``logit`` (the policy's log-odds of solving it at epoch 0) and ``rate`` (how much
    that log-odds grows per epoch)."""

    id: str
    prompt_len: int
    lengths: np.ndarray
    logit: float
    rate: float

    def success(self, epoch: int) -> float:
        """The probability that a completion solves it in ``epoch``."""
        return 1.0 / (1.0 + math.exp(-(self.logit + self.rate * epoch)))


def _check_learn(learn: Any) -> None:
    """``learn`` (log-odds a prompt's success gains per epoch, times U(0, 1)) checked: a finite number >= 0."""
    if not (isinstance(learn, (int, float)) and math.isfinite(learn) and learn >= 0):
        raise InvalidArgument("learn", learn, "a finite log-odds per epoch >= 0")


def drifting_prompts(n: int, *, max_new_tokens: int = 4096, learn: float = 1.0, seed: int = 0) -> list[TrainingPrompt]:
    """``n`` prompts with CASTILLO's completion lengths (each prompt's siblings, clipped to ``max_new_tokens``) and
    success rates at epoch 0 drawn from Beta(0.4, 0.6) (mass near 0 and 1: the mix of a math set under a policy
    that solves some prompts always and some never; clipped to [0.001, 0.999]); each prompt's log-odds grows by
    ``learn`` x U(0, 1) per epoch (0: a policy that does not change)."""
    n = check_int("n", n, minimum=1)
    _check_learn(learn)
    rng = np.random.default_rng(seed)
    pool = castillo_groups(32, max_new_tokens=max_new_tokens, seed=seed)
    picks = rng.choice(len(pool), size=n, replace=n > len(pool))
    p0 = np.clip(rng.beta(0.4, 0.6, size=n), 1e-3, 1 - 1e-3)
    rates = learn * rng.random(n)
    return [TrainingPrompt(f"p{i}", pool[j].prompt_len, pool[j].lengths, float(np.log(p / (1 - p))), float(r))
            for i, (j, p, r) in enumerate(zip(picks, p0, rates))]


@dataclass(frozen=True)
class SgpoEpoch:
    """One epoch (or the profiling pass) of a sizing: ``groups`` run, ``completions``, generated ``tokens``, rollout
    ``seconds`` (modelled, its steps summed), ``steps``, ``informative`` groups (rewards not all alike),
    ``informative_completions`` (theirs: the completions with a non-zero advantage) and ``advantage_mass``: the sum
    of the absolute advantages GRPO gives its completions when it divides by the group's standard deviation (a
    group with k of g solved: 2 sqrt(k (g - k)), about the size of the policy gradient it gives)."""

    groups: int
    completions: int
    tokens: int
    seconds: float
    steps: int
    informative: int
    informative_completions: int
    advantage_mass: float = 0.0


@dataclass(frozen=True)
class SgpoTraining:
    """A sizing over a run: its ``epochs``, the ``profiling`` pass (offline only) and the totals."""

    sizing: str
    epochs: list[SgpoEpoch]
    profiling: SgpoEpoch | None = None
    sizes: list[list[int]] = field(default_factory=list, repr=False)  # per epoch, each prompt's group (0: left out)

    def _total(self, name: str) -> float:
        return sum(getattr(e, name) for e in self.epochs) + (getattr(self.profiling, name) if self.profiling else 0)

    @property
    def seconds(self) -> float:
        """Rollout seconds of the whole run, profiling included."""
        return self._total("seconds")

    @property
    def completions(self) -> int:
        return int(self._total("completions"))

    @property
    def tokens(self) -> int:
        return int(self._total("tokens"))

    @property
    def informative(self) -> int:
        """Informative groups over the training epochs (the profiling pass trains nothing)."""
        return sum(e.informative for e in self.epochs)

    @property
    def informative_completions(self) -> int:
        """Completions of informative groups over the training epochs."""
        return sum(e.informative_completions for e in self.epochs)

    @property
    def advantage_mass(self) -> float:
        """The sum of absolute GRPO advantages over the training epochs (:class:`SgpoEpoch`)."""
        return sum(e.advantage_mass for e in self.epochs)

    def _per_hour(self, value: float) -> float:
        """``value`` per rollout hour of the whole run, profiling included (0 for a run of no seconds)."""
        return 3600.0 * value / self.seconds if self.seconds else 0.0

    @property
    def advantage_mass_per_hour(self) -> float:
        """:attr:`advantage_mass` per rollout hour, profiling included."""
        return self._per_hour(self.advantage_mass)

    @property
    def informative_per_hour(self) -> float:
        """Informative groups per rollout hour, profiling included."""
        return self._per_hour(self.informative)

    @property
    def informative_completions_per_hour(self) -> float:
        """Completions of informative groups per rollout hour, profiling included."""
        return self._per_hour(self.informative_completions)

    def against(self, baseline: SgpoTraining) -> dict[str, float | None]:
        """This run's ``groups`` (informative groups), ``completions`` (theirs) and ``advantage_mass`` per rollout
        hour as multiples of ``baseline``'s (a fixed G's, say); None where the baseline has none."""
        pairs = {"groups": (self.informative_per_hour, baseline.informative_per_hour),
                 "completions": (self.informative_completions_per_hour, baseline.informative_completions_per_hour),
                 "advantage_mass": (self.advantage_mass_per_hour, baseline.advantage_mass_per_hour)}
        return {name: mine / theirs if theirs else None for name, (mine, theirs) in pairs.items()}


def _unit(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng([seed, *key])


def _draw(prompt: TrainingPrompt, index: int, size: int, epoch: int, seed: int, stream: int) -> tuple[np.ndarray,
                                                                                                     np.ndarray]:
    """(lengths, solved) of ``size`` completions of prompt ``index`` in ``epoch``: the k-th completion is the same draw
    under every sizing that runs at least k + 1 (``stream`` 0: training, 1: profiling)."""
    rng, us, picks = _unit(seed, stream, epoch, index), [], []
    for _ in range(-(-max(size, 1) // 64)):  # blocks of 64 draws of each: any size's draws prefix a larger one's
        us.append(rng.random(64))
        picks.append(rng.integers(0, len(prompt.lengths), size=64))
    u, pick = np.concatenate(us)[:size], np.concatenate(picks)[:size]
    return prompt.lengths[pick].astype(np.int64), (u < prompt.success(epoch)).astype(np.int64)


def _run_steps(prompts: Sequence[TrainingPrompt], order: np.ndarray, sizes: Sequence[int], epoch: int, *, seed: int,
               stream: int, batch_prompts: int | None, batch_completions: int | None,
               rollout: dict, masked_to: int | None = None) -> tuple[SgpoEpoch, dict[int, np.ndarray]]:
    """The epoch's groups (each prompt in ``order`` with its size; 0: left out) in steps of ``batch_prompts`` prompts
    (or of prompts until ``batch_completions`` completions) through :func:`run_rollout`; returns its totals and each
    prompt's outcomes. ``masked_to``: each group also runs one-token completions up to that many (slime's masked
    samples), predicted 1 token; they count in the seconds and tokens, not as completions."""
    from .report import predictions_for

    ran = [i for i in order if sizes[i] > 0]
    batches: list[list[int]] = []
    held = 0  # completions of the step being filled
    for i in ran:  # a step: batch_prompts prompts, or prompts until batch_completions completions
        if not batches or (len(batches[-1]) >= batch_prompts if batch_prompts is not None
                           else held >= batch_completions):
            batches.append([])
            held = 0
        batches[-1].append(i)
        held += sizes[i]
    outcomes: dict[int, np.ndarray] = {}
    seconds, tokens, steps, informative, useful, mass = 0.0, 0, 0, 0, 0, 0.0
    for batch in batches:
        groups, predicted = [], []
        for i in batch:
            lengths, solved = _draw(prompts[i], i, sizes[i], epoch, seed, stream)
            group = Group(prompts[i].id, prompts[i].prompt_len, lengths)
            guess = predictions_for("prompt:0.5", group, i, seed)
            if masked_to is not None and masked_to > sizes[i]:
                stubs = masked_to - sizes[i]
                group = Group(prompts[i].id, prompts[i].prompt_len, np.concatenate([lengths, np.ones(stubs, int)]))
                guess = np.concatenate([guess, np.ones(stubs)])
            groups.append(group)
            predicted.append(guess)
            outcomes[i] = solved
            k = int(solved.sum())
            if 0 < k < len(solved):
                informative += 1
                useful += len(solved)
                mass += 2.0 * math.sqrt(k * (len(solved) - k))
        result = run_rollout(groups, predicted=np.concatenate(predicted), seed=seed, **rollout)
        seconds += result.seconds
        tokens += int(sum(int(g.lengths.sum()) for g in groups))
        steps += 1
    return SgpoEpoch(len(ran), int(sum(sizes[i] for i in ran)), tokens, seconds, steps, informative, useful,
                     mass), outcomes


def prompts_from_profile(profile: Sequence[ProfileRecord], *, max_new_tokens: int, learn: float = 0.0,
                         default_length: int = 512, seed: int = 0) -> list[TrainingPrompt]:
    """Training prompts from a profile (``lengthsched budget``'s): each prompt's success rate at epoch 0 is its
    profiled one, shrunk towards one half so that no prompt is certain ((solved + 0.5) / (samples + 1): a prompt
    solved 0 of 8 times gets 1/18); its completions are drawn from its profiled lengths (clipped to
    ``max_new_tokens``), or where it has none from a log-normal around ``default_length`` with CASTILLO's spread
    within a prompt; its log-odds grow by ``learn`` x U(0, 1) per epoch (seeded)."""
    from .workloads import castillo_spread

    if not profile:
        raise InvalidArgument("profile", [], "at least one profiled prompt")
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, minimum=1)
    default_length = check_int("default_length", default_length, minimum=1)
    _check_learn(learn)
    rng = np.random.default_rng(seed)
    spread = castillo_spread()
    out = []
    for r in profile:
        p = (sum(r.outcomes) + 0.5) / (len(r.outcomes) + 1)
        if r.lengths:
            lengths = np.asarray(r.lengths, dtype=np.int64)
        else:
            lengths = np.rint(default_length * np.exp(spread * rng.standard_normal(32))).astype(np.int64)
        out.append(TrainingPrompt(r.id, r.prompt_tokens, np.clip(lengths, 1, max_new_tokens),
                                  float(np.log(p / (1 - p))), float(learn * rng.random())))
    return out


def run_sgpo_training(prompts: Sequence[TrainingPrompt], sizing: str, *, epochs: int = 4, group_size: int = 16,
                      config: BudgetConfig | None = None, profile_samples: int | Sequence[int] = 8,
                      plan: BudgetPlan | None = None, memory: int | None = 2,
                      batch_prompts: int | None = 64, batch_completions: int | None = None, policy: str = "steal",
                      replicas: int = 4, budget_tokens: int, max_new_tokens: int, seed: int = 0,
                      masked_to: int | None = None) -> SgpoTraining:
    """Run ``epochs`` epochs of ``prompts`` with groups sized by ``sizing`` (:data:`SGPO_SIZINGS`; the module
    docstring). ``group_size``: G (fixed; unseen prompts online); ``config``: sGPO's rules (g_min, g_max, rule,
    drop_above, unsolved_fraction, seed); ``profile_samples``: completions per prompt of the offline profiling pass
    (one number, or one per prompt); ``plan``: the offline sizes instead of a plan from the simulated profiling pass
    (a user's own, :func:`lengthsched.sgpo.plan_budget`; a prompt it does not name runs ``group_size``), the pass
    still run for its seconds; ``memory``: groups the online budget remembers per prompt. Each step:
    ``batch_prompts`` prompts (verl's ``data.train_batch_size``), or with ``batch_completions`` instead, prompts
    until that many completions (a trainer that raises its batch as sGPO shrinks the groups, to keep the engines as
    busy), through :func:`simulate.run_rollout` with ``policy`` on ``replicas`` engines of ``budget_tokens`` KV each,
    completions up to ``max_new_tokens`` (the prompts' lengths should be clipped alike: :func:`drifting_prompts`,
    :func:`prompts_from_profile`). ``masked_to``: slime's way (``lengthsched.integrations.slime``,
    ``lengthsched_sgpo``): every prompt is drawn ``masked_to`` times (``--n-samples-per-prompt``) and the samples
    beyond its group's size run for one token; sizes, ``group_size`` and ``config.g_max`` must not exceed it."""
    if sizing not in SGPO_SIZINGS:
        raise InvalidArgument("sizing", sizing, "one of " + ", ".join(SGPO_SIZINGS))
    if not prompts:
        raise InvalidArgument("prompts", [], "at least one prompt")
    epochs = check_int("epochs", epochs, minimum=1)
    group_size = check_int("group_size", group_size, minimum=1)
    samples = [profile_samples] * len(prompts) if isinstance(profile_samples, (int, np.integer)) \
        else list(profile_samples)
    if len(samples) != len(prompts):
        raise InvalidArgument("profile_samples", f"{len(samples)} values", f"one number, or {len(prompts)}: one per "
                                                                           "prompt")
    samples = [check_int("profile_samples", k, minimum=1) for k in samples]
    if plan is not None and not isinstance(plan, BudgetPlan):
        raise InvalidArgument("plan", type(plan).__name__, "a lengthsched.sgpo.BudgetPlan or None")
    if (batch_prompts is None) == (batch_completions is None):
        raise InvalidArgument("batch_completions", batch_completions, "None with batch_prompts, or a number of "
                                                                      "completions with batch_prompts=None")
    if batch_prompts is not None:
        batch_prompts = check_int("batch_prompts", batch_prompts, minimum=1)
    else:
        batch_completions = check_int("batch_completions", batch_completions, minimum=1)
    cfg = config or BudgetConfig(baseline_group_size=group_size)
    if masked_to is not None:
        masked_to = check_int("masked_to", masked_to, minimum=1)
        if max(group_size, cfg.g_max) > masked_to:
            raise InvalidArgument("masked_to", masked_to, f"at least group_size ({group_size}) and config.g_max "
                                                          f"({cfg.g_max}): every group is drawn masked_to times")
    rollout = dict(policy=policy, replicas=replicas, budget_tokens=budget_tokens, max_new_tokens=max_new_tokens)
    steps = dict(batch_prompts=batch_prompts, batch_completions=batch_completions, rollout=rollout,
                 masked_to=masked_to)
    n = len(prompts)
    profiling = None
    online = OnlineBudget(cfg, memory=memory) if sizing == "online" else None
    fixed_sizes: list[int] | None = None
    if sizing == "offline":
        order = _unit(seed, 9).permutation(n)
        profiling, seen = _run_steps(prompts, order, samples, 0, seed=seed, stream=1,
                                     **{**steps, "masked_to": None})  # a pass of its own, nothing masked
        profiling = SgpoEpoch(profiling.groups, profiling.completions, profiling.tokens, profiling.seconds,
                              profiling.steps, 0, 0)  # it trains nothing
        if plan is None:
            plan = plan_budget([ProfileRecord(p.id, tuple(int(o) for o in seen[i])) for i, p in enumerate(prompts)],
                               cfg)
        decided = {d.id: d.group_size for d in plan.prompts}
        fixed_sizes = [decided.get(p.id, group_size) for p in prompts]
    done, sizes_by_epoch = [], []
    for epoch in range(epochs):
        if sizing == "fixed":
            sizes = [group_size] * n
        elif sizing == "offline":
            sizes = fixed_sizes
        elif sizing == "online":
            sizes = online.group_sizes([p.id for p in prompts], group_size)
        else:
            sizes = [g if kept else 0 for kept, _, g in (prompt_decision(p.success(epoch), f"{p.id}:{epoch}", cfg)
                                                         for p in prompts)]
        order = _unit(seed, 7, epoch).permutation(n)
        result, outcomes = _run_steps(prompts, order, sizes, epoch, seed=seed, stream=0, **steps)
        if online is not None:
            for i, solved in outcomes.items():
                online.observe(prompts[i].id, solved)
        done.append(result)
        sizes_by_epoch.append(list(sizes))
    return SgpoTraining(sizing, done, profiling, sizes_by_epoch)
