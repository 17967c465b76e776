"""Over-sampled rollout steps, one after another, with slime's partial rollout.

An RL framework that over-samples submits more groups than a step keeps and ends the step at the
``batch``-th finished group; the rest are aborted. What happens to them is the framework's choice:
slime (``slime/rollout/sglang_rollout.py`` at 624b824, ``generate_rollout_async`` and ``abort``)
drops them unless ``--partial-rollout`` is set, which returns every aborted group to the data
buffer with the tokens its samples generated, and the next step takes the buffer's groups first
(``RolloutDataSourceWithBuffer.get_samples``, ``pop_first``): a sample that had finished is kept as
it is (``generate_and_rm`` returns a ``COMPLETED`` or ``TRUNCATED`` sample unchanged), one that had
not resumes from its prompt and partial response, which the engine prefills again (the weights
changed between the steps; SGLang's cache is flushed at the update), and generates what it has left.

:func:`run_oversampled_steps` runs such steps one after another on :func:`simulate.run_rollout`:
each step submits ``ceil(batch x oversample)`` groups (the carried ones first, then fresh ones from
the stream), ends at its ``batch``-th finished group, and carries or drops the rest. A resumed
sample whose partial response differs from its siblings' cannot share their prompt's KV: each is
its own request with its prompt and partial response as its context (a one-completion group in the
model); the samples of a carried group that never started stay one group with the shared prompt.
With a compressed KV cache (``compression`` in ``kwargs``, Sparse-RL's sparse rollouts) a resumed sample is
instead a one-completion group with the shared prompt that resumes with its partial response
(:func:`simulate.run_rollout`'s ``resumed``): prefilled again at its admission, then held with what it generates,
at most the cache's ``max_retained`` tokens together (a compressed partial response is no part of a prompt's KV
that the sample could keep whole). With a cache that never binds, the two models agree.
The unit of comparison is the kept tokens per modelled second (what the learner receives for the
rollout time), next to what the carried tokens cost: the share of the kept tokens generated in an
earlier step, by an older policy (slime's ``--mask-offpolicy-in-partial-rollout`` masks them).

A dynamic-sampling filter (``valid``: DAPO drops groups whose rewards all agree) throws away a
group that fails it when it finishes; the step then ends at its ``batch``-th group that passed. With
``refill=True`` the step submits as slime's dynamic sampling does (:class:`simulate.rollout.Refill`): another
``ceil(batch x oversample)`` groups whenever the filter has dropped so many that those submitted and not dropped
fall below ``batch``, so a step keeps ``batch`` groups while the stream lasts; without it a step submits its
groups once and keeps fewer when too few pass (what a framework that does not refill mid-step gets).

Which groups the filter drops is given (``valid``): at random, or drawn from a model of prompt difficulty tied
to length (:mod:`simulate.difficulty`: hard prompts run long and fail together). Not modelled: the learner's
time between steps, and a policy whose lengths and difficulty drift between steps (the stream's are fixed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lengthsched import InvalidArgument
from lengthsched.errors import as_lengths, check_int, check_positive_float
from lengthsched.filtering import FilterHistory, order_by_pass

from .rollout import REFILL_RULES, Refill, RolloutResult, _Releases, next_poll, run_rollout
from .workloads import Group

#: With ``refill``, the most chunks of fresh groups a step is offered (it submits them only as slime's dynamic
#: sampling asks for them; the rest stay in the stream).
REFILL_CHUNKS = 8
#: What ``run_oversampled_steps``' ``resume`` accepts.
RESUME = ("left", "siblings")
#: What ``run_oversampled_steps``' ``carry_limit`` accepts: what happens to a group ``max_carry`` steps old.
CARRY_LIMITS = ("drop", "wait")


def submitted_per_step(batch: int, oversample: float) -> int:
    """Groups an over-sampled step submits to keep ``batch``: ``ceil(batch x oversample)`` (carried ones
    included)."""
    return math.ceil(batch * oversample - 1e-9)


@dataclass(frozen=True)
class StepRecord:
    """One over-sampled step. ``seconds``: modelled seconds to its ``batch``-th finished group (the
    step's end); ``submitted`` / ``carried_in``: groups it submitted, and how many of them an earlier
    step carried; ``kept``: the groups it kept (their indices in the stream), in finish order;
    ``kept_tokens``: their completions' tokens; ``decoded_tokens``: tokens the replicas generated
    in this step up to its end (kept or not; recomputation not counted); ``stale_tokens``: the kept
    tokens generated in an earlier step; ``dropped_tokens``: tokens generated and thrown away (the
    aborted groups' without partial rollout); ``carried_out``: groups left for the next step;
    ``recomputed_tokens``: tokens prefilled again in this step (preemptions and moves within the
    step, and the partial responses of resumed samples: every one the step took, or with a compressed cache
    those it admitted); ``waited``: the most steps a kept group
    waited since it was first submitted (0: submitted in this step); ``filtered_tokens``: the tokens of
    the groups a dynamic-sampling filter dropped when they finished (all of them, whenever generated);
    ``shortfall``: groups the step kept fewer than ``batch`` (the filter passed too few of those it
    submitted: slime submits more in the middle of the step, ``run_oversampled_steps(..., refill=True)``; with
    it, only where the stream ran out);
    ``token_age``: the kept tokens' ages summed, in steps (a token generated in the step that kept it is 0
    steps old, one generated the step before 1, ...); ``forced``: groups the step waited for because they
    had reached ``max_carry`` (``carry_limit="wait"``), kept or filtered; ``expired``: groups it dropped
    because carrying them would exceed ``max_carry`` (``carry_limit="drop"``; their tokens are in
    ``dropped_tokens``)."""

    seconds: float
    submitted: int
    carried_in: int
    kept: tuple[int, ...]
    kept_tokens: int
    decoded_tokens: int
    stale_tokens: int
    dropped_tokens: int
    carried_out: int
    recomputed_tokens: int
    waited: int = 0
    filtered_tokens: int = 0
    shortfall: int = 0
    token_age: int = 0
    forced: int = 0
    expired: int = 0


@dataclass(frozen=True)
class OversampledSteps:
    """Over-sampled steps run one after another (:func:`run_oversampled_steps`). ``steps``: one
    :class:`StepRecord` each; ``mean_length``: the mean completion length (tokens) of every group
    the steps drew from the stream, to which the kept groups' mean is compared; ``carried``: the
    groups (indices in the stream) left in the buffer after the last step, holding
    ``carried_tokens`` generated tokens (partial rollout)."""

    policy: str
    batch: int
    oversample: float
    partial: bool
    group_size: int
    steps: tuple[StepRecord, ...]
    mean_length: float
    carried: tuple[int, ...] = ()
    carried_tokens: int = 0
    results: tuple[RolloutResult | None, ...] = field(default=(), repr=False)

    @property
    def seconds(self) -> float:
        """Modelled seconds of all the steps."""
        return float(sum(s.seconds for s in self.steps))

    @property
    def kept_tokens(self) -> int:
        return int(sum(s.kept_tokens for s in self.steps))

    @property
    def kept_tokens_per_second(self) -> float:
        """Kept tokens (what the learner receives) per modelled second of rollout."""
        return self.kept_tokens / self.seconds if self.seconds else 0.0

    @property
    def stale_share(self) -> float:
        """The share of the kept tokens generated in an earlier step than the one that kept them."""
        return float(sum(s.stale_tokens for s in self.steps)) / self.kept_tokens if self.kept_tokens else 0.0

    @property
    def fresh_tokens_per_second(self) -> float:
        """Kept tokens generated in the step that kept them (on-policy: what is left to train on where the
        stale ones are masked, slime's ``--mask-offpolicy-in-partial-rollout``) per modelled second."""
        fresh = self.kept_tokens - sum(s.stale_tokens for s in self.steps)
        return fresh / self.seconds if self.seconds else 0.0

    def _of_decoded(self, name: str) -> float:
        """The steps' ``name`` tokens over all tokens generated."""
        decoded = sum(s.decoded_tokens for s in self.steps)
        return float(sum(getattr(s, name) for s in self.steps)) / decoded if decoded else 0.0

    @property
    def filtered_share(self) -> float:
        """Tokens of the groups the filter dropped, over all tokens generated."""
        return self._of_decoded("filtered_tokens")

    @property
    def shortfall(self) -> int:
        """Groups the steps kept fewer than ``batch`` each, in all (a filter that passed too few)."""
        return int(sum(s.shortfall for s in self.steps))

    @property
    def mean_token_age(self) -> float:
        """The kept tokens' mean age in steps: how many policy updates old a kept token is when the learner
        gets it, on average (0 without partial rollout; what AReaL's and verl's staleness limits bound)."""
        return float(sum(s.token_age for s in self.steps)) / self.kept_tokens if self.kept_tokens else 0.0

    @property
    def max_wait(self) -> int:
        """The most steps a kept group waited between its first submission and the step that kept it."""
        return max((s.waited for s in self.steps), default=0)

    @property
    def dropped_share(self) -> float:
        """Tokens generated and thrown away with the aborted groups, over all tokens generated."""
        return self._of_decoded("dropped_tokens")

    @property
    def kept_length_ratio(self) -> float:
        """The kept groups' mean completion length over the mean of every group drawn (1: no length
        bias in what the learner receives; below 1: the short groups are over-represented)."""
        kept = sum(len(s.kept) for s in self.steps)
        return self.kept_tokens / kept / self.group_size / self.mean_length if kept and self.mean_length else 0.0


def run_oversampled_steps(stream: Sequence[Any], policy: str, *, batch: int, oversample: float, steps: int,
                          partial: bool = True, predicted: Any = None, resume: str = "siblings",
                          prior_sigma: float = 0.5, valid: Any = None, filter_seed: int = 0,
                          max_carry: int | None = None, carry_limit: str = "drop", refill: bool = False,
                          run: Callable[..., RolloutResult] | None = None, keep_results: bool = False,
                          filter_history: FilterHistory | None = None, refill_rule: str = "slime",
                          refill_cap: int | None = None, refill_need: bool = False, refill_poll: float | None = None,
                          **kwargs: Any) -> OversampledSteps:
    """Run ``steps`` rollout steps of slime's over-sampling: each submits ``ceil(batch x oversample)``
    groups (with ``partial``, the groups the last step aborted first, in their order, then fresh
    ones from ``stream``), ends at its ``batch``-th finished group and aborts the rest (see the
    module docstring). ``stream``: groups (:class:`simulate.Group`, all of one size G), drawn in
    order; it must hold enough for every step (``steps x ceil(batch x oversample)`` at most).
    ``predicted``: per completion of the stream, flattened (a prompt-level predictor's: the same for
    siblings), or None. ``resume``: what a carried group's unfinished samples are predicted to have
    left: ``"siblings"`` (the default), the median of what :class:`lengthsched.OnlineLengthPredictor`
    predicts from the group's finished samples and the sample's own progress
    (:func:`lengthsched.online.resumed_remaining`: its prior the prediction with log-normal error
    ``prior_sigma``, the siblings' spread that of the groups kept so far), which does not take a
    sample that outran its prediction for nearly done (what :mod:`lengthsched.integrations.slime`
    does with its default predictor); ``"left"``, ``max(1, predicted - generated)`` tokens.
    ``valid``: a dynamic-sampling filter (slime's ``--dynamic-sampling-filter-path``, DAPO's drop of
    groups whose rewards all agree): None, every finished group is kept; a share in (0, 1], each
    stream group passes with that probability (drawn with ``filter_seed``, whatever its length); or one
    bool per stream group. A group the filter drops when it finishes is thrown away (slime does not
    return it to the buffer) and the step ends at its ``batch``-th finished group that passed; a step
    whose groups pass too few keeps fewer (``StepRecord.shortfall``) unless ``refill``. ``max_carry`` (with
    ``partial``): a staleness limit, the most steps a group may wait between its first submission and the
    step that keeps it (None: no limit; 1: a
    kept token is at most one policy update old). ``carry_limit`` says how it is kept: ``"drop"`` (the
    default), a group that would be carried once more is thrown away with its tokens; ``"wait"``, a step
    does not end before every group submitted ``max_carry`` steps ago has finished (those groups are kept,
    then the first others to finish up to ``batch``; more than ``batch`` when more are that old), which the
    benchmarks find slower and no fresher on average (docs/benchmarks.md) (AReaL's
    ``max_head_offpolicyness`` and verl's fully-async ``staleness_threshold`` bound the same age by
    throttling submissions, which these synchronous steps do not model). ``refill``: slime's dynamic sampling
    as slime runs it (:class:`simulate.rollout.Refill`, needs ``in_flight`` in ``kwargs``): a step submits
    ``ceil(batch x oversample)`` groups (slime's ``--over-sampling-batch-size``; the carried ones first), and
    another as many whenever the groups submitted less those the filter dropped fall below ``batch``, until
    ``batch`` groups that pass have finished; the groups it never submitted stay in the stream (or the buffer)
    for the next step. Each step is offered its carried groups and up to :data:`REFILL_CHUNKS` chunks of fresh
    ones (the stream permitting); without it (the default) a step submits ``ceil(batch x oversample)`` groups
    and keeps fewer than ``batch`` when too few of them pass. Not with ``carry_limit="wait"``. ``run``:
    how one step runs (default :func:`simulate.run_rollout` with ``policy``; called as ``run(groups,
    policy, predicted=..., record=True, **kwargs)``, it must return the groups in the order given);
    ``kwargs`` go to it (``replicas``, ``budget_tokens``,
    ``max_new_tokens``, ``router``, ``cost``, ``in_flight``, ``compression``, ...); with ``compression`` (a
    ``lengthsched.KVCompression``) a resumed sample's partial response is held in the cache (``run`` is then
    called with ``resumed=``, what each completion resumes with; see the module docstring). ``oversample`` 1 is a
    step that waits for every group it submitted (nothing carried). ``filter_history``: a
    :class:`lengthsched.filtering.FilterHistory` (keyed by the groups' ``prompt_id``) that orders every batch a
    step takes likely-kept first (each ``ceil(batch x oversample)`` candidates in turn, carried ones included, by
    :func:`lengthsched.filtering.order_by_pass`; ties in the order given), as
    :mod:`lengthsched.integrations.slime` orders the batches it hands slime with ``lengthsched_filter_order``,
    and learns what the filter did with every group that finished before its step ended (kept or dropped),
    as that integration's ``dynamic_sampling_filter`` records it; None: batches in stream order.
    ``refill_rule="verl"`` (with ``refill``, without ``partial``, ``oversample`` 1): verl 0.9.1's v1 sync trainer's
    dynamic sampling instead of slime's (:class:`simulate.rollout.Refill`'s ``rule``: ``batch`` groups, then two for
    every dropped one while fewer than ``batch`` passed, at most ``refill_cap`` groups in flight, None: no bound);
    its step ends when every group it submitted has finished (verl drains them), keeps ``batch`` of those that
    passed, the first submitted (verl takes them in its uids' set order, unrelated to length), and throws the surplus
    away (counted in ``dropped_tokens``). ``refill_need`` (with ``refill_rule="verl"``):
    lengthsched's refill inside verl's allowance (:class:`simulate.rollout.Refill`'s ``by_need``: a group only while
    those in flight are expected to pass fewer than the batch still needs, the pass share counted over the run's
    finished groups). ``refill_poll`` (with ``refill_rule="verl"``): verl's poll interval in seconds (its replay
    buffer refills, and sees the step's last group finish, only at its polls; :class:`simulate.rollout.Refill`'s
    ``poll``); None: at once. Returns :class:`OversampledSteps`."""
    batch = check_int("batch", batch, minimum=1)
    steps = check_int("steps", steps, minimum=1)
    oversample = check_positive_float("oversample", oversample)
    if oversample < 1:
        raise InvalidArgument("oversample", oversample, "at least 1 (groups submitted per group kept)")
    stream = list(stream)
    if not stream:
        raise InvalidArgument("stream", "no groups", "at least one group")
    size = len(stream[0].lengths)
    if any(len(g.lengths) != size for g in stream):
        raise InvalidArgument("stream", "groups of several sizes", f"every group of {size} completions")
    if predicted is not None:
        predicted = as_lengths("predicted", predicted, minimum=1)
        if predicted.shape != (len(stream) * size,):
            raise InvalidArgument("predicted", f"{predicted.size} values",
                                  f"{len(stream) * size} values, one per completion of the stream")
        predicted = predicted.reshape(len(stream), size)
    if resume not in RESUME:
        raise InvalidArgument("resume", resume, " or ".join(map(repr, RESUME)))
    passes = _passes(valid, len(stream), filter_seed)
    if max_carry is not None:
        max_carry = check_int("max_carry", max_carry, minimum=1)
        if not partial:
            raise InvalidArgument("max_carry", max_carry, "None without partial rollout (nothing is carried)")
    if carry_limit not in CARRY_LIMITS:
        raise InvalidArgument("carry_limit", carry_limit, " or ".join(map(repr, CARRY_LIMITS)))
    prior_sigma = check_positive_float("prior_sigma", prior_sigma)
    refill = bool(refill)
    if refill and max_carry is not None and carry_limit == "wait":
        raise InvalidArgument("carry_limit", carry_limit, "'drop' with refill (a step waits for no group it may "
                                                          "not have submitted)")
    if refill_rule not in REFILL_RULES:
        raise InvalidArgument("refill_rule", refill_rule, " or ".join(map(repr, REFILL_RULES)))
    verl = refill_rule == "verl"
    if verl and (not refill or partial or oversample != 1):
        raise InvalidArgument("refill_rule", refill_rule, "'slime' unless refill=True, partial=False and oversample 1 "
                                                          "(verl's v1 sync trainer refills without partial rollout)")
    if refill_poll is not None and not verl:
        raise InvalidArgument("refill_poll", refill_poll, "None unless refill_rule='verl'")
    if refill_need and not verl:
        raise InvalidArgument("refill_need", refill_need, "False unless refill_rule='verl'")
    compressed = kwargs.get("compression") is not None  # a resumed sample holds its partial response capped
    run_kept = run_finished = 0  # verl: the groups the run's earlier steps finished, and of them passed
    submit = submitted_per_step(batch, oversample)
    run = run_rollout if run is None else run
    lengths = np.array([np.asarray(g.lengths, dtype=np.int64) for g in stream])
    generated = np.zeros_like(lengths)  # tokens each sample of the stream holds
    old = np.zeros_like(lengths)  # of them, generated before the current step
    born = np.zeros_like(lengths)  # the steps in which each sample's tokens were generated, summed over its tokens
    carried: list[int] = []
    fresh = 0
    records, results = [], []
    kept_groups: list[np.ndarray] = []  # every group kept so far (complete: what the framework has seen)
    first = np.zeros(len(stream), dtype=np.int64)  # the step each group was first submitted in
    for step in range(steps):
        take = carried if refill else carried[:submit]  # with refill every carried group is a candidate
        carried = [] if refill else carried[submit:]
        carried_in = len(take)
        need = submit - len(take)
        if fresh + need > len(stream):
            raise InvalidArgument("stream", f"{len(stream)} groups",
                                  f"at least {fresh + need} for {steps} steps of {submit} groups")
        if refill:  # the candidates: up to REFILL_CHUNKS chunks of fresh groups after the carried ones
            need = min(len(stream) - fresh, max(need, REFILL_CHUNKS * submit - len(take)))
        take = take + list(range(fresh, fresh + need))
        first[fresh:fresh + need] = step
        fresh += need
        drawn_in = take  # in the buffer's and the stream's order (what goes back is in it)
        if filter_history is not None:
            take = _pass_order(take, submit, filter_history, stream)
        old[take] = generated[take]
        left = None
        if predicted is not None:
            left = np.maximum(1, predicted[take] - old[take])
            if resume == "siblings":
                left = _sibling_predictions(take, predicted, lengths, old, left, kept_groups, prior_sigma, kwargs)
        parts, owners, samples, pred, resumed_tokens = _step_groups(stream, take, lengths, generated, left,
                                                                    resume=compressed)
        finish = np.full(len(take), 0.0)  # a group whose samples all finished earlier: at once
        extra = {} if resumed_tokens is None or not resumed_tokens.any() else {"resumed": resumed_tokens}
        if refill:
            extra["refill"] = Refill(batch, submit, tuple(bool(passes[g]) for g in take), owners=tuple(owners),
                                     rule=refill_rule, cap=refill_cap,
                                     by_need=(run_kept, run_finished) if refill_need else None,
                                     poll=refill_poll)
        result = run(parts, policy, predicted=pred, record=True, **extra, **kwargs) if parts else None
        if keep_results:
            results.append(result)
        if refill:  # when each candidate was submitted (inf: never; what it did not submit goes back)
            if result is None:
                releases = _Releases(extra["refill"], np.zeros(0, dtype=np.int64))
                releases.release(0.0)
                finish = releases.seconds
            else:
                finish = np.asarray(result.released_seconds, dtype=np.float64).copy()
            k = int(np.isfinite(finish).sum())  # the candidates submitted: a prefix, whole batches
            back = set(take[k:])  # ordered within batches, so these are drawn_in's last ones
            carried = [g for g in drawn_in[:carried_in] if g in back]
            fresh -= sum(g in back for g in drawn_in[carried_in:])
            take, finish = take[:k], finish[:k]
            keep = owners < k
            owners, samples = owners[keep], [x for x, y in zip(samples, keep) if y]
            parts_ran = np.flatnonzero(keep)
        if result is not None:
            found = result.group_finish_seconds()
            np.maximum.at(finish, owners, found[parts_ran] if refill else found)
        was, full = old[take], lengths[take]
        # partial responses prefilled again (with a cache the run counts those it admitted)
        resumed = 0 if compressed else int(was[(was > 0) & (was < full)].sum())
        order = np.argsort(finish, kind="stable")
        due = np.zeros(len(take), dtype=bool)  # groups the step must finish (carry_limit="wait")
        if max_carry is not None and carry_limit == "wait":
            due = step - first[take] >= max_carry
        good = order[passes[np.asarray(take)][order]]  # the groups that pass, in finish order
        if verl:  # verl samples the batch from all it drained, in an order unrelated to length (uuid keys in a set)
            good = np.sort(good)
        others = good[~due[good]]
        slots = max(0, batch - int(due[good].sum()))
        kept_local = np.concatenate([good[due[good]], others[:slots]])
        kept_local = kept_local[np.lexsort((kept_local, finish[kept_local]))]  # in finish order, as `order`
        end = float(finish[others[slots - 1]]) if 0 < slots <= len(others) else (
            float(finish.max()) if slots else 0.0)
        if due.any():
            end = max(end, float(finish[due].max()))
        if verl:  # verl drains every group it submitted before it samples the batch (seen at its next poll)
            end = float(finish.max()) if len(finish) else 0.0
            if refill_poll is not None:
                end = next_poll(end, refill_poll)
            run_kept += int(passes[np.asarray(take, dtype=np.int64)].sum())
            run_finished += len(take)
        filtered = [take[i] for i in order if not passes[take[i]] and finish[i] <= end]
        before = generated[take].sum()
        if result is not None and samples:
            at = tuple(np.concatenate(samples).T)  # (stream group, sample) of every completion run
            made = result.generated_at(end)
            if refill:  # the completions of the parts submitted, in the run's flattened order
                sizes = np.array([len(p.lengths) for p in parts], dtype=np.int64)
                starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
                made = np.concatenate([made[a:a + n] for a, n in zip(starts[parts_ran], sizes[parts_ran])])
            new = old[at] + made
            born[at] += (new - generated[at]) * step
            generated[at] = new
        decoded = int(generated[take].sum() - before)
        kept = [take[i] for i in kept_local]
        kept_groups += [lengths[g] for g in kept]
        if filter_history is not None:  # what the filter said of every group that finished in the step
            filter_history.observe_many([stream[g].prompt_id for g in kept + filtered],
                                        [True] * len(kept) + [False] * len(filtered))
        kept_set = set(kept) | set(filtered)
        rest = [g for g in take if g not in kept_set]
        kept_tokens = int(lengths[kept].sum())
        stale = int(old[kept].sum())
        dropped = 0
        expired = []
        if partial:
            if max_carry is not None and carry_limit == "drop":
                expired = [g for g in rest if step + 1 - first[g] > max_carry]
                rest = [g for g in rest if step + 1 - first[g] <= max_carry]
                dropped = int(generated[expired].sum()) if expired else 0
            # slime's buffer appends the aborted groups after those it still held (refill: never submitted)
            carried = carried + rest if refill else rest + carried
        else:
            dropped = int((generated[rest] - old[rest]).sum())
        records.append(StepRecord(seconds=end, submitted=len(take), carried_in=carried_in,
                                  kept=tuple(kept), kept_tokens=kept_tokens, decoded_tokens=decoded,
                                  stale_tokens=stale, dropped_tokens=dropped,
                                  carried_out=len(carried) if partial else 0,
                                  recomputed_tokens=resumed + (0 if result is None else int(result.recomputed_tokens)),
                                  waited=int(step - first[kept].min()) if kept else 0,
                                  filtered_tokens=int(lengths[filtered].sum()) if filtered else 0,
                                  shortfall=max(0, batch - len(kept)),
                                  token_age=int(kept_tokens * step - born[kept].sum()) if kept else 0,
                                  forced=int(due.sum()), expired=len(expired)))
    drawn = lengths[:fresh]
    return OversampledSteps(policy=policy, batch=batch, oversample=oversample, partial=partial, group_size=size,
                            steps=tuple(records), mean_length=float(drawn.mean()), carried=tuple(carried),
                            carried_tokens=int(generated[carried].sum()) if carried else 0, results=tuple(results))


def _pass_order(take: list[int], size: int, history: FilterHistory, stream: Sequence[Any]) -> list[int]:
    """``take`` with every batch of ``size`` candidates ordered likely-kept first (stable)."""
    out = []
    for start in range(0, len(take), size):
        block = take[start:start + size]
        p = history.pass_probability([stream[g].prompt_id for g in block])
        out += [block[i] for i in order_by_pass(p)]
    return out


def _passes(valid: Any, count: int, seed: int) -> np.ndarray:
    """Whether each of ``count`` stream groups passes the dynamic-sampling filter (``valid``: None, a share,
    or one bool per group; see :func:`run_oversampled_steps`)."""
    if valid is None:
        return np.ones(count, dtype=bool)
    if isinstance(valid, (int, float)) and not isinstance(valid, bool):
        share = check_positive_float("valid", valid, maximum=1.0)
        return np.random.default_rng(check_int("filter_seed", seed, minimum=0)).random(count) < share
    flags = np.asarray(valid)
    if flags.shape != (count,) or flags.dtype != bool:
        raise InvalidArgument("valid", f"{flags.size} values of {flags.dtype}",
                              f"None, a share in (0, 1], or {count} booleans, one per stream group")
    return flags


def _sibling_predictions(take, predicted, lengths, generated, left, kept_groups, prior_sigma, kwargs):
    """``left`` with every carried group's unfinished samples predicted from its finished ones and their
    own progress (:func:`lengthsched.online.resumed_remaining`; see :func:`run_oversampled_steps`'
    ``resume``), the siblings' spread that of the groups kept so far."""
    from lengthsched.online import resumed_remaining
    from lengthsched.placement import sibling_spread

    carried = [i for i, g in enumerate(take) if generated[take[i]].any()]
    if not carried:
        return left
    spread = sibling_spread(kept_groups) if kept_groups else None
    going = [np.flatnonzero(generated[take[i]] < lengths[take[i]]) for i in carried]
    got = resumed_remaining([float(predicted[take[i]][0]) for i in carried],
                            [lengths[take[i]][generated[take[i]] >= lengths[take[i]]] for i in carried],
                            [generated[take[i]][j] for i, j in zip(carried, going)],
                            within_sigma=max(0.01, float(spread)) if spread else None, prior_sigma=prior_sigma,
                            max_new_tokens=kwargs.get("max_new_tokens"))
    left = left.copy()
    for i, j, x in zip(carried, going, got):
        left[i, j] = x
    return left


def _step_groups(stream, take, lengths, generated, left, resume=False):
    """The groups one step submits, as the model runs them: per taken group, its samples that never
    started as one group (the shared prompt), each sample with a partial response as its own
    one-completion group (prompt and partial response prefilled at its admission), nothing for its
    finished samples. ``left``: per taken group and sample, its predicted tokens to go (or None).
    ``resume`` (a compressed cache): a partial response is not part of its group's prompt but what its
    completion resumes with (``run_rollout``'s ``resumed``: held with what it generates, capped together).
    Returns (groups, owner of each (index into ``take``), the (stream group, sample) of each group's
    completions, predictions flattened or None, the tokens each completion resumes with, flattened (None
    without ``resume``))."""
    parts, owners, samples, pred, had = [], [], [], [], []
    for local, g in enumerate(take):
        source = stream[g]
        done, full = generated[g], lengths[g]
        fresh = np.flatnonzero(done == 0)
        resumed = np.flatnonzero((done > 0) & (done < full))
        units = ([(fresh, 0)] if len(fresh) else []) + [(np.array([i]), int(done[i])) for i in resumed]
        for idx, partial_tokens in units:
            parts.append(Group(prompt_id=source.prompt_id if partial_tokens == 0 else f"{source.prompt_id}#{idx[0]}",
                               prompt_len=int(source.prompt_len) + (0 if resume else partial_tokens),
                               lengths=full[idx] - done[idx], source=source.source))
            owners.append(local)
            samples.append(np.stack([np.full(len(idx), g), idx], axis=1))
            had.append(done[idx])
            if left is not None:
                pred.append(left[local][idx])
    return (parts, np.array(owners, dtype=np.int64), samples,
            None if left is None else np.concatenate(pred),
            np.concatenate(had).astype(np.int64) if resume and had else None)
