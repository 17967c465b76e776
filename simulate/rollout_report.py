"""``lengthsched simulate --prompts B --replicas R``: one RL rollout step, every policy and router.

The step is B prompts x G completions on R engine replicas, each with the memory ``--budget``
(weights, the activations of a decode batch and a KV pool that holds the prompts too). Every
policy runs on the same completions with the same predictions (``--predictor``); the policies that
do not place requests themselves run once per router (``--routers``). vLLM FCFS with verl's routing
always runs: it is what the headline compares with.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lengthsched import InvalidArgument, LengthschedError, parse_bytes
from lengthsched.errors import check_int
from lengthsched.filtering import FilterHistory, SelectiveRollout
from lengthsched.integrations.rollout import CROWDED_POOLS
from lengthsched.integrations.verl_stealing import RESUBMIT_ESTIMATE_SECONDS, StealOptions
from lengthsched.memory import ROLLOUT_DECODE_ROWS
from lengthsched.memory import rollout_pool_tokens as _pool_tokens
from lengthsched.placement import CLASSES_MAX_SPREAD, recommend_rollout_policy, sibling_spread
from lengthsched.runtime import POLICIES

from .difficulty import DEFAULT_DIFFICULTY, filter_passes, filter_sides, observe_sides, pass_rates, selective_stream
from .options import OPTION_DEFAULTS, ROLLOUT_DEFAULTS, SimulateOptions, resolve
from .oversampling import CARRY_LIMITS, OversampledSteps, run_oversampled_steps, submitted_per_step
from .report import (
    MAX_SIGMA,
    aligned,
    check_compressed_policies,
    check_step_seconds,
    compression_phrase,
    group_sizes,
    legend,
    load_cost,
    load_memory,
    parse_compression,
    parse_policies,
    predictions_for,
    prompt_prediction,
    run_units,
    spec_sigma,
    workload_groups,
)
from .rollout import (
    ROUTERS,
    THROTTLED_POLICIES,
    VERL_POLL_SECONDS,
    LiveRouter,
    RolloutResult,
    run_rollout,
    run_slime_planned_in_order,
    run_verl_stealing,
    steal_ways,
)
from .workloads import WORKLOADS, history_predictions

__all__ = ["RolloutRow", "RolloutStep", "RolloutComparison", "compare_rollout", "format_rollout", "rollout_step",
           "rollout_figures", "rollout_pool_tokens", "ROLLOUT_LEGEND", "BASELINE"]

#: The comparison's reference: vLLM FCFS with verl's routing (each request to the next replica).
BASELINE = ("vllm", "least_loaded")
#: Decode rows a replica keeps activation memory for next to its pool (lengthsched.memory.ROLLOUT_DECODE_ROWS).
DECODE_ROWS = ROLLOUT_DECODE_ROWS
#: The prompt-level prior's log-normal error of ``--predictor history`` (the grid's realistic predictor).
HISTORY_PRIOR_SIGMA = 0.5
#: A ratio to vLLM FCFS + verl above this counts as slower (the benchmarks' "slower by > 0.1%").
SLOWER = 1.001
#: The "router" of slime with :mod:`lengthsched.integrations.slime`: the integration's own plan, its groups
#: handed over longest predicted first and each engine's samples sent through its client queues
#: (:func:`simulate.run_slime_planned`); only the ``sglang`` policy (slime's engines) runs behind it.
PLAN_ROUTER = "slime_plan"
#: The most groups submitted per group kept that ``--oversample`` takes.
MAX_OVERSAMPLE = 10.0
#: What ``--routers`` accepts: the simulator's routers and :data:`PLAN_ROUTER`.
CLI_ROUTERS = ROUTERS + (PLAN_ROUTER,)
#: slime as it ships: SGLang's engines behind SGLang's cache-aware router (the row the plan is compared with).
SLIME = ("sglang", "cache_aware")
#: Steps below which a run with partial rollout flatters --filter-order (it defers the groups it puts last to later
#: steps; docs/benchmarks.md, "Over twenty steps"): the setting line says so.
SHORT_RUN = 20


@dataclass(frozen=True)
class RolloutRow:
    """One policy (with one router) on the step; ``error`` says why it could not run (else None)."""

    policy: str
    router: str
    result: RolloutResult | None
    error: str | None = None
    #: With ``--draws N``: its makespan over vLLM FCFS + verl's on the same draw of the predictions' errors,
    #: the step as run first, then each of the N draws (None where it could not run that draw).
    draws: tuple[float | None, ...] | None = None
    #: With ``--oversample``: (seconds to the ``--prompts``-th finished group, the kept groups' mean completion
    #: length over all submitted groups') (:meth:`RolloutResult.kept_finish`).
    kept: tuple[float, float] | None = None
    #: With ``--steps``: the over-sampled steps it ran (:class:`simulate.OversampledSteps`); ``result`` is None.
    steps: OversampledSteps | None = None

    @property
    def label(self) -> str:
        return self.policy if self.router in ("placed", "dispatch") else f"{self.policy} + {self.router}"

    def to_dict(self) -> dict[str, Any]:
        r = self.result
        out: dict[str, Any] = {"policy": self.policy, "router": self.router, "error": self.error}
        if r is not None:
            out.update(seconds=r.seconds, replica_seconds=list(r.replica_seconds),
                       tokens_per_second=r.tokens_per_second, slowest_share=r.slowest_share, preemptions=r.preemptions,
                       recomputed_tokens=r.recomputed_tokens, loaded_tokens=r.loaded_tokens,
                       prefill_tokens=r.prefill_tokens,
                       prompt_loads=r.prompt_loads, lower_bound_seconds=r.lower_bound_seconds,
                       seconds_over_lower_bound=r.seconds_ratio, steps=r.steps,
                       peak_kv_tokens=list(r.peak_kv_tokens))
        if self.draws is not None:
            out["draws"] = list(self.draws)
        if self.kept is not None:
            out["seconds_to_kept"], out["kept_length_ratio"] = self.kept
        if self.steps is not None:
            o = self.steps
            out.update(seconds=o.seconds, step_seconds=[x.seconds for x in o.steps], kept_tokens=o.kept_tokens,
                       kept_tokens_per_second=o.kept_tokens_per_second,
                       on_policy_tokens_per_second=o.fresh_tokens_per_second, stale_share=o.stale_share,
                       dropped_share=o.dropped_share, kept_length_ratio=o.kept_length_ratio,
                       most_steps_waited=o.max_wait, carried_groups=len(o.carried), oversample=o.oversample,
                       partial_rollout=o.partial, filtered_share=o.filtered_share, shortfall=o.shortfall,
                       mean_token_age=o.mean_token_age)
        return out

    def draw_summary(self) -> tuple[float, float, float, int, int] | None:
        """With draws: (median, best, worst ratio to vLLM FCFS + verl, draws slower than it by more than
        0.1%, draws it ran); else None."""
        ran = [x for x in self.draws or () if x is not None]
        if not ran:
            return None
        return (float(np.median(ran)), min(ran), max(ran), sum(x > SLOWER for x in ran), len(ran))


@dataclass(frozen=True)
class RolloutComparison:
    """Every row on the same step; ``setting``: the header line."""

    options: dict
    setting: str
    pool_tokens: int
    rows: tuple[RolloutRow, ...]
    step: RolloutStep | None = field(default=None, repr=False)  # what the rows ran on
    oracle: RolloutRow | None = None  # --headroom: vLLM FCFS on the placement searched with the true lengths

    @property
    def baseline(self) -> RolloutRow | None:
        return next((r for r in self.rows if (r.policy, r.router) == BASELINE and r.result), None)

    def to_dict(self) -> dict[str, Any]:
        return {"options": self.options, "setting": self.setting, "pool_tokens": self.pool_tokens,
                "rows": [r.to_dict() for r in self.rows], "verdict": rollout_headline(self),
                "oracle_placement": None if self.oracle is None else self.oracle.to_dict()}


def rollout_pool_tokens(opts: SimulateOptions, memory, budget_bytes: int) -> int:
    """KV tokens of each replica's pool: its memory less the weights and the activations of
    :data:`DECODE_ROWS` decode rows (prompts are held inside the pool)."""
    return _pool_tokens(memory, budget_bytes, DECODE_ROWS, given=opts.budget)


def _routers(opts: SimulateOptions) -> list[str]:
    names = [r.strip() for r in str(opts.routers).split(",")]
    if not all(names) or any(r not in CLI_ROUTERS for r in names) or len(set(names)) != len(names):
        raise InvalidArgument("routers", opts.routers, "comma-separated routers among " + ", ".join(CLI_ROUTERS)
                              + ", each once")
    return names


def _runs_behind(policy: str, router: str) -> bool:
    """Whether ``policy`` runs behind ``router`` in a comparison (the slime plan drives SGLang's FCFS engines
    only)."""
    return router != PLAN_ROUTER or policy == "sglang"


def _check_compressed_step(opts: SimulateOptions, policies: Sequence[str]) -> None:
    """``--kv-compression`` in a rollout step: one step (``run_rollout``'s ``compression``), over-sampled steps
    (``--steps``: a resumed sample holds its partial response in the cache), multi-turn steps (``--turns``) or, with
    ``--max-staleness``, asynchronous RL (its own checks), the policies that run a compressed cache
    (:func:`check_compressed_policies`), the headroom's oracle placement too (searched with the cache)."""
    check_compressed_policies(opts, policies, rollout=True)


def check_rollout_options(opts: SimulateOptions) -> SimulateOptions:
    """The resolved options of a rollout step; flags that have no effect on one are errors."""
    opts = resolve(opts)
    check_int("prompts", opts.prompts, minimum=1)
    check_int("replicas", opts.replicas, minimum=1)
    if opts.turns is None:  # the tool flags without --turns are errors
        from .multiturn_report import check_multiturn_options

        check_multiturn_options(opts)
    if opts.sweep is not None:
        raise InvalidArgument("sweep", opts.sweep, "no --sweep with --prompts / --replicas (a rollout step has no "
                                                   "sweep)")
    if opts.slots is not None:  # in a rollout step: each replica's running cap (vLLM's max_num_seqs)
        check_int("slots", opts.slots, minimum=1)
    if opts.in_flight is not None:  # per replica: the framework's client sends at most in_flight x R at once
        check_int("in_flight", opts.in_flight, minimum=1)
    check_step_seconds(opts)
    policies = parse_policies(opts.policies)
    bad = [p for p in policies if not POLICIES[p].rollout]
    if bad:
        raise InvalidArgument("policies", opts.policies, "policies that run rollout steps: "
                              + ", ".join(n for n, s in POLICIES.items() if s.rollout) + f" (not {', '.join(bad)})")
    _routers(opts)
    if parse_compression(opts.kv_compression) is not None:
        _check_compressed_step(opts, policies)
    if str(opts.predictor).startswith(("noisy", "online", "trace")):
        raise InvalidArgument("predictor", opts.predictor, "oracle, prompt:SIGMA, constant:TOKENS or history / "
                                                           "history:SIGMA for a rollout step (per-completion "
                                                           "predictors: run groups instead)")
    sigma = history_sigma(opts.predictor)
    if sigma is not None and opts.workload not in WORKLOADS:
        raise InvalidArgument("predictor", opts.predictor, "a predictor a trace file can give (oracle, prompt:SIGMA, "
                                                           "constant:TOKENS): history draws the prompts' completions "
                                                           "of an earlier epoch afresh, which needs a named workload ("
                                                           + ", ".join(WORKLOADS) + f"), not {opts.workload}")
    check_int("draws", opts.draws, minimum=0)
    if opts.oversample is not None:
        over = opts.oversample
        if not isinstance(over, (int, float)) or isinstance(over, bool) or not (1.0 <= over <= MAX_OVERSAMPLE):
            raise InvalidArgument("oversample", over, f"groups submitted per group kept, 1 to {MAX_OVERSAMPLE:g} "
                                                      "(e.g. 1.25)")
    if opts.verl_dynamic_sampling:
        _check_verl_dynamic(opts)
        opts = dataclasses.replace(opts, oversample=1.0)
    if opts.steps is not None:
        check_int("steps", opts.steps, minimum=1)
        if opts.oversample is None:
            raise InvalidArgument("steps", opts.steps, "--oversample too (--steps runs over-sampled steps one after "
                                                       "another)")
        for name, value in (("draws", opts.draws), ("headroom", opts.headroom), ("plot", opts.plot)):
            if value:
                raise InvalidArgument(name, value, f"no --{name} with --steps (they look at one step)")
    elif opts.partial_rollout:
        raise InvalidArgument("partial_rollout", True, "--steps N too (partial rollout carries groups from one step "
                                                       "to the next)")
    if opts.partial_rollout and opts.oversample == 1:
        raise InvalidArgument("partial_rollout", True, "--oversample above 1 (a step that waits for every group "
                                                       "carries none)")
    if opts.max_carry is not None:
        check_int("max_carry", opts.max_carry, minimum=1)
        if not opts.partial_rollout:
            raise InvalidArgument("max_carry", opts.max_carry, "--partial-rollout too (without it nothing is carried)")
    if opts.carry_limit is not None:
        if opts.carry_limit not in CARRY_LIMITS:
            raise InvalidArgument("carry_limit", opts.carry_limit, " or ".join(CARRY_LIMITS))
        if opts.max_carry is None:
            raise InvalidArgument("carry_limit", opts.carry_limit, "--max-carry K too (the limit it keeps)")
    if opts.max_staleness is None:
        for name in ("train_seconds", "update_seconds", "max_concurrent", "staleness_threshold", "local_steps"):
            value = getattr(opts, name)
            if value != OPTION_DEFAULTS[name]:
                raise InvalidArgument(name, value, "--max-staleness K too (it is a setting of asynchronous RL)")
    if opts.slime_refill and (opts.steps is None or opts.in_flight is None or opts.max_staleness is not None):
        raise InvalidArgument("slime_refill", True, "--steps N and --in-flight M too, without --max-staleness (it "
                                                    "adds slime's batches inside the over-sampled steps sent through "
                                                    "the in-flight cap)")
    if opts.valid_share is not None:
        share = opts.valid_share
        if opts.steps is None:
            raise InvalidArgument("valid_share", share, "--steps N too (the filter drops groups of over-sampled steps)")
        if not isinstance(share, (int, float)) or isinstance(share, bool) or not 0 < share <= 1:
            raise InvalidArgument("valid_share", share, "a share of the finished groups in (0, 1], e.g. 0.7")
    if opts.difficulty and (opts.steps is None or opts.valid_share is not None):
        raise InvalidArgument("difficulty", True, "--steps N too, and no --valid-share (the filter is drawn from the "
                                                  "difficulty model instead of at random)")
    if opts.difficulty and opts.group_size is not None:
        _check_filter_group(opts.group_size)
    if opts.filter_order and not opts.difficulty:
        raise InvalidArgument("filter_order", True, "--difficulty too (the order follows what its filter did with "
                                                    "each prompt one epoch earlier)")
    if opts.selective and not opts.difficulty:
        raise InvalidArgument("selective", True, "--difficulty too (the skip follows what its filter did with each "
                                                 "prompt one epoch earlier)")
    kind, _, arg = str(opts.predictor).partition(":")
    if opts.draws and not ((kind == "prompt" and spec_sigma(arg) > 0) or (sigma is not None and sigma > 0)):
        raise InvalidArgument("draws", opts.draws, "0 with --predictor " + str(opts.predictor) + " (nothing to "
                                                   "redraw: --draws redraws the errors of prompt:SIGMA or of "
                                                   "history's prior, SIGMA > 0)")
    if sigma is not None and opts.policies == ROLLOUT_DEFAULTS["policies"] and "steal_classes" not in policies:
        # with history the project's recommendation may be steal_classes: show it
        opts = dataclasses.replace(opts, policies=opts.policies + ",steal_classes")
    return opts


def _check_verl_dynamic(opts: SimulateOptions) -> None:
    """--verl-dynamic-sampling: the options it needs and those it does not combine with."""
    if opts.steps is None or (opts.valid_share is None and not opts.difficulty):
        raise InvalidArgument("verl_dynamic_sampling", True, "--steps N and a filter (--valid-share or --difficulty) "
                                                             "too (verl refills the groups its filter drops)")
    if opts.oversample not in (None, 1):
        raise InvalidArgument("oversample", opts.oversample, "1 or none with --verl-dynamic-sampling (verl submits "
                                                             "the batch and refills what its filter drops)")
    for name in ("partial_rollout", "slime_refill", "filter_order"):
        if getattr(opts, name):
            raise InvalidArgument(name, True, "off with --verl-dynamic-sampling (verl's v1 sync trainer drains every "
                                              "group it submitted and has no partial rollout or order)")
    for name in ("policies", "routers"):
        if getattr(opts, name) != ROLLOUT_DEFAULTS[name]:
            raise InvalidArgument(name, getattr(opts, name), "the default with --verl-dynamic-sampling (its rows are "
                                                             "vllm behind verl's router, as verl ships and with "
                                                             "lengthsched's refill)")
    if opts.in_flight is not None or opts.max_staleness is not None:
        name = "in_flight" if opts.in_flight is not None else "max_staleness"
        raise InvalidArgument(name, getattr(opts, name), "none with --verl-dynamic-sampling (verl's router sends "
                                                         "every request at once; its synchronous trainer)")


def history_sigma(predictor: Any) -> float | None:
    """The prior's sigma of a ``history`` / ``history:SIGMA`` predictor spec (default
    :data:`HISTORY_PRIOR_SIGMA`), None for any other spec."""
    kind, _, arg = str(predictor).partition(":")
    if kind != "history":
        return None
    sigma = spec_sigma(arg) if arg else HISTORY_PRIOR_SIGMA
    if not (0 <= sigma <= MAX_SIGMA):  # NaN fails too
        raise InvalidArgument("predictor", predictor, f"history or history:SIGMA with 0 <= SIGMA <= {MAX_SIGMA:g} (the "
                                                      "log-normal error of the prompt-level prior)")
    return sigma


@dataclass(frozen=True)
class RolloutStep:
    """What every row of a rollout comparison runs on: the resolved options, the model's memory, each
    replica's memory (bytes) and KV pool (tokens), the groups, their predictions and the step cost."""

    opts: SimulateOptions
    memory: Any
    budget_bytes: int
    pool: int
    groups: list
    predicted: np.ndarray
    cost: Any
    #: With ``--predictor history``: the step's prompts one epoch earlier (groups with fresh completions),
    #: what the predictions learnt from; else None.
    before: tuple | None = field(default=None, repr=False)

    @property
    def history(self) -> tuple | None:
        """With ``--predictor history``: per prompt, its completions' lengths one epoch earlier (tokens);
        else None."""
        return None if self.before is None else tuple(g.lengths for g in self.before)

    @property
    def spread(self) -> float | None:
        """With history, the previous epoch's sibling spread (:func:`lengthsched.placement.sibling_spread`,
        what the recommendation reads); else None."""
        return None if self.history is None else sibling_spread(list(self.history))

    @property
    def whole_groups(self) -> bool:
        """Whether ``steal`` places every group whole on one replica in this step (several replicas, and
        the step's predicted tokens fill every pool ``CROWDED_POOLS`` times over: ``steal_ways`` gives 1,
        as ``run_rollout`` places them), where which replica gets a group the predictions underrated is a
        lottery over their errors."""
        if self.opts.replicas <= 1:
            return False
        _, ways = steal_ways(self.groups, self.predicted, self.pool, self.opts.replicas, self.opts.max_new_tokens)
        return ways == 1

    @property
    def recommended(self) -> str:
        """The policy the project recommends for this step: with history,
        :func:`lengthsched.placement.recommend_rollout_policy` on it; else ``simulate.DEFAULT_POLICY``."""
        from . import DEFAULT_POLICY

        return DEFAULT_POLICY if self.history is None else recommend_rollout_policy(list(self.history))

    def capped(self, policy: str, router: str | None) -> bool:
        """Whether the run of ``policy`` and ``router`` goes through the framework's in-flight cap (``--in-flight``:
        slime's semaphore): the engines whose queues are first come first served behind a live router, and
        :data:`PLAN_ROUTER`."""
        if self.opts.in_flight is None:
            return False
        return router == PLAN_ROUTER or (policy in THROTTLED_POLICIES and router in LiveRouter.ROUTERS)

    def run(self, policy: str, router: str | None, *, record: bool = False, refill: Any = None,
            filter_history: Any = None, in_flight: int | None = None, resumed: Any = None) -> RolloutResult:
        """The step under ``policy`` (placed by ``router`` unless it places requests itself; ``router``
        :data:`PLAN_ROUTER`: slime with :mod:`lengthsched.integrations.slime`, ``policy`` ``sglang``); ``refill``:
        slime's dynamic sampling inside the step (:class:`simulate.rollout.Refill`, a run through the cap);
        ``filter_history``: the integration's planner orders each batch by it (:data:`PLAN_ROUTER` only; the other
        rows get their batches ordered by ``run_oversampled_steps``). ``in_flight``: the requests in flight at most
        over all replicas, in place of ``--in-flight``'s cap (verl's loop: every request sent at once).
        ``resumed``: what each completion resumes with (``run_rollout``'s; over-sampled steps with a cache)."""
        o, spec = self.opts, POLICIES[policy]  # the delay and the polls apply to the policies they describe
        if router == PLAN_ROUTER:
            if policy != "sglang":
                raise InvalidArgument("router", router, f"a router of the simulator ({', '.join(ROUTERS)}) for "
                                                        f"policy {policy!r}: {PLAN_ROUTER} drives sglang only")
            return run_slime_planned_in_order(self.groups, predicted=self.predicted, replicas=o.replicas,
                                              budget_tokens=self.pool, max_new_tokens=o.max_new_tokens,
                                              in_flight=None if o.in_flight is None else o.in_flight * o.replicas,
                                              cost=self.cost, seed=o.seed, prefill_chunk=o.prefill_chunk,
                                              record=record, max_num_seqs=o.slots, kv_offload=o.kv_offload,
                                              refill=refill, filter_history=filter_history,
                                              compression=parse_compression(o.kv_compression), resumed=resumed)
        capped = self.capped(policy, router)
        return run_rollout(self.groups, policy, replicas=o.replicas, router=router, budget_tokens=self.pool,
                           max_new_tokens=o.max_new_tokens, predicted=self.predicted, cost=self.cost, seed=o.seed,
                           prefill_chunk=o.prefill_chunk, record=record, max_num_seqs=o.slots,
                           resubmit_seconds=o.resubmit_seconds if spec.resubmits else None, kv_offload=o.kv_offload,
                           snapshot_seconds=o.poll_seconds if spec.polls else None,
                           in_flight=in_flight if in_flight is not None else o.in_flight * o.replicas if capped
                           else None, refill=refill, compression=parse_compression(o.kv_compression),
                           resumed=resumed)


def rollout_step(opts: SimulateOptions) -> RolloutStep:
    """The :class:`RolloutStep` ``opts`` describe (checked: a flag that has no effect is an error)."""
    opts = check_rollout_options(opts)
    memory = load_memory(opts)
    budget_bytes = parse_bytes(opts.budget, "budget")
    pool = rollout_pool_tokens(opts, memory, budget_bytes)
    submitted = submitted_groups(opts)
    step_opts = dataclasses.replace(opts, groups=submitted)
    groups = workload_groups(step_opts, submitted)
    if opts.steps is not None:  # the stream of the over-sampled steps: enough groups, all of one size
        per_step = submitted_per_step(opts.prompts, opts.oversample)
        if len(groups) < submitted:
            raise InvalidArgument("steps", opts.steps, f"at most {len(groups) // per_step} with {opts.workload}, "
                                                       f"which holds {len(groups)} groups (each step submits "
                                                       f"{per_step})")
        if len({len(g.lengths) for g in groups}) > 1:
            raise InvalidArgument("steps", opts.steps, "a workload whose groups are all of one size "
                                                       f"({opts.workload}'s are {group_sizes(groups)})")
    before = None
    if history_sigma(opts.predictor) is not None:  # the same prompts one epoch earlier, fresh completions
        before = tuple(workload_groups(step_opts, submitted, epoch=1))
    predicted = step_predictions(opts, groups, before, opts.seed)
    return RolloutStep(opts, memory, budget_bytes, pool, groups, predicted, load_cost(opts, memory), before)


def submitted_groups(opts: SimulateOptions) -> int:
    """Groups the step submits: ``--prompts``, times ``--oversample`` (rounded) when given; with ``--steps``,
    the stream the steps draw from (each step submits ``ceil(prompts x oversample)``, carried groups
    included, so the stream holds enough for every step)."""
    if opts.steps is not None:  # with --slime-refill, room for the batches added while the filter drops groups
        more = 1 + math.ceil(1 / _filter_share(opts)) if opts.slime_refill else 1
        if opts.verl_dynamic_sampling:  # verl refills two per drop: a step draws up to about 2 / share of its batch
            more = 1 + math.ceil(2 / _filter_share(opts))
        return opts.steps * submitted_per_step(opts.prompts, opts.oversample) * more
    return opts.prompts if opts.oversample is None else max(opts.prompts, int(round(opts.prompts * opts.oversample)))


def _filter_share(opts: SimulateOptions) -> float:
    """The share of the groups the filter is expected to keep: --valid-share's, the difficulty model's at the
    group size (16 where the workload decides it), or 1 without a filter."""
    if opts.difficulty:
        return DEFAULT_DIFFICULTY.pass_share(opts.group_size or 16)
    return opts.valid_share or 1.0


def _check_filter_group(size: int) -> int:
    """``size`` (completions per group), which --difficulty needs to be at least 2."""
    if size < 2:
        raise InvalidArgument("group_size", size, "at least 2 with --difficulty (DAPO's filter drops a group whose "
                                                  "rewards all agree: one completion always does)")
    return size


def _filter(step: RolloutStep) -> tuple[Any, list | None]:
    """The filter of ``--steps`` (``run_oversampled_steps``' ``valid``) and, with --filter-order or --selective,
    why it dropped each prompt's group one epoch earlier (:func:`simulate.difficulty.filter_sides`; None
    without): from the difficulty model (seed --seed) with --difficulty, else --valid-share's share."""
    o = step.opts
    if not o.difficulty:
        return o.valid_share, None
    size = _check_filter_group(len(step.groups[0].lengths))  # the workload's size where --group-size is not given
    rates = pass_rates(step.groups, seed=o.seed)
    earlier = filter_sides(rates, size, seed=o.seed, epoch=0) if o.filter_order or o.selective else None
    return filter_passes(rates, size, seed=o.seed, epoch=1), earlier


def _earlier_history(step: RolloutStep, earlier: list) -> FilterHistory:
    """A filter history holding what the filter did with each of ``step``'s prompts one epoch earlier (``earlier``:
    :func:`simulate.difficulty.filter_sides`)."""
    history = FilterHistory()
    observe_sides(history, step.groups, earlier)
    return history


def step_predictions(opts: SimulateOptions, groups: list, before: tuple | None, seed: int) -> np.ndarray:
    """Every completion's predicted length (tokens, flattened in group order) under ``opts.predictor``,
    its errors drawn with ``seed``; with ``before`` (the same prompts' groups one epoch earlier), what the
    online predictor knows from them with the prompt-level prior of ``history:SIGMA``."""
    sigma = history_sigma(opts.predictor)
    if sigma is None:
        return np.concatenate([np.asarray(predictions_for(opts.predictor, g, i, seed), dtype=np.int64)
                               for i, g in enumerate(groups)])
    prior = {g.prompt_id: prompt_prediction(g, sigma, seed, i) for i, g in enumerate(groups)}
    return history_predictions(groups, list(before), prior, max_new_tokens=opts.max_new_tokens)


def compare_rollout(opts: SimulateOptions, *, record: bool = False) -> RolloutComparison:
    """Run every policy (and router) of ``opts`` on one rollout step; ``record`` keeps every row's
    timelines (what :func:`rollout_figures` draws)."""
    step = rollout_step(opts)
    opts = step.opts
    runs = [BASELINE]
    for policy in parse_policies(opts.policies):
        for router in ([None] if POLICIES[policy].places_groups else _routers(opts)):
            if (policy, router) != BASELINE and _runs_behind(policy, router):
                runs.append((policy, router))
    if opts.steps is not None:
        return _compare_steps(step, runs)
    rows = []
    kept = opts.prompts if opts.oversample is not None else None
    for policy, router in runs:
        try:
            result = step.run(policy, router, record=record or kept is not None)
            rows.append(RolloutRow(policy, PLAN_ROUTER if router == PLAN_ROUTER else result.router, result,
                                   kept=None if kept is None else result.kept_finish(kept)))
        except LengthschedError as exc:  # a pool too small for a completion, or a policy that gives up
            if (policy, router) == BASELINE and "budget_tokens" in str(exc):
                raise InvalidArgument("budget", opts.budget, f"a larger replica memory: {exc}") from None
            rows.append(RolloutRow(policy, router or "placed", None, str(exc)))
    rows.sort(key=lambda r: (r.result is None, r.result.seconds if r.result else math.inf))
    groups, cost = step.groups, step.cost
    work = int(sum(int(np.sum(g.lengths)) for g in groups))
    prompt = int(np.median([g.prompt_len for g in groups]))
    setting = (f"{len(groups)} prompts x G={len(groups[0].lengths)} from {opts.workload} (median prompt {prompt:,} "
               f"tokens, {work:,} tokens to generate), L_max={opts.max_new_tokens}, on {opts.replicas} replicas of "
               f"{step.memory.name} ({opts.dtype}) with {step.budget_bytes / 2**30:.2f} GiB each = a pool of "
               f"{step.pool:,} KV tokens "
               f"(prompts inside)" + ("" if opts.slots is None else f", at most {opts.slots} requests running per "
                                      "replica (max_num_seqs)")
               + ("" if not opts.resubmit_seconds else f", requests steal moves resubmitted after "
                                                          f"{opts.resubmit_seconds:g} s")
               + ("" if opts.poll_seconds is None else f", steal_observed polling every {opts.poll_seconds:g} s")
               + ("" if opts.in_flight is None else f", at most {opts.in_flight} requests per replica in flight "
                                                    f"behind the least_loaded and cache_aware routers (the rest "
                                                    f"routed as requests finish)")
               + ("" if not opts.kv_offload else ", preempted requests' KV offloaded to host memory and loaded back "
                                                 "(not recomputed)")
               + _cache_phrase(opts)
               + ("" if opts.oversample is None else f", over-sampled: the step keeps the first {opts.prompts} "
                                                     f"groups to finish of the {len(groups)} submitted")
               + f", predictor {opts.predictor}" + ("" if step.history is None else
                                                    f" (learnt from one earlier epoch of the same prompts, "
                                                    f"{len(step.history[0])} fresh completions each; sibling "
                                                    f"spread {step.spread:.3f})")
               + f", seconds modelled for {cost.model} on {cost.gpu}")
    if opts.draws:
        rows = _with_draws(step, rows)
        setting += (f"; each policy also on {opts.draws} more draws of the predictions' errors (seeds "
                    f"{opts.seed + 1}-{opts.seed + opts.draws})")
    oracle = _oracle_row(step) if opts.headroom else None
    return RolloutComparison(dataclasses.asdict(opts), setting, step.pool, tuple(rows), step, oracle)


#: How ``--steps`` predicts a carried sample's remaining tokens (``run_oversampled_steps``' ``resume``).
STEPS_RESUME = "siblings"


#: The runs of --verl-dynamic-sampling: (policy, router shown, lengthsched's refill by need, GRESO's skip); the first
#: is the reference (verl as it ships), the last only with --selective. Policy steal_observed: verl_v1's stealing
#: manager (simulate.run_verl_stealing) in place of verl's AgentLoopManagerTQ and router.
VERL_DYNAMIC_RUNS = (("vllm", "least_loaded", False, False),
                     ("vllm", "least_loaded + verl_selective refill", True, False),
                     ("steal_observed", "verl_v1 stealing manager", False, False),
                     ("steal_observed", "verl_v1 stealing manager + verl_selective refill", True, False),
                     ("vllm", "least_loaded + verl_selective refill and skip", True, True))


def _step_run(step: RolloutStep, router: str | None, *, filter_history: Any = None, at_once: bool = False):
    """A ``run`` for :func:`simulate.run_oversampled_steps`: :meth:`RolloutStep.run` of the groups it is given, with
    their predictions, under ``router`` (``filter_history``: as there; ``at_once``: every request of the step sent at
    once, as verl's loop sends them, in place of ``--in-flight``'s cap)."""

    def run(parts, name, *, predicted, record, refill=None, resumed=None, **_):
        return dataclasses.replace(step, groups=parts, predicted=predicted).run(
            name, router, record=record, refill=refill, filter_history=filter_history,
            in_flight=len(predicted) if at_once else None, resumed=resumed)

    return run


def _stealing_run(step: RolloutStep):
    """A ``run`` for :func:`simulate.run_oversampled_steps`: verl_v1's stealing manager inside verl's loop
    (:func:`simulate.rollout.run_verl_stealing`, ``steal_observed``) with its driver's defaults (a snapshot every
    ``StealOptions.poll_interval`` s, ``RESUBMIT_ESTIMATE_SECONDS`` to resubmit) unless ``--poll-seconds`` /
    ``--resubmit-seconds`` say otherwise."""
    o = step.opts

    def run(parts, name, *, predicted, record, refill=None, **_):
        return run_verl_stealing(parts, name, predicted=predicted, refill=refill, replicas=o.replicas,
                                 budget_tokens=step.pool, max_new_tokens=o.max_new_tokens, cost=step.cost, seed=o.seed,
                                 prefill_chunk=o.prefill_chunk, record=record, max_num_seqs=o.slots,
                                 kv_offload=o.kv_offload, snapshot_seconds=_stealing_poll(o),
                                 resubmit_seconds=_stealing_resubmit(o),
                                 compression=parse_compression(o.kv_compression))

    return run


def _stealing_poll(o: SimulateOptions) -> float:
    return o.poll_seconds if o.poll_seconds is not None else StealOptions.poll_interval


def _stealing_resubmit(o: SimulateOptions) -> float:
    return o.resubmit_seconds if o.resubmit_seconds else RESUBMIT_ESTIMATE_SECONDS


def _running(step: RolloutStep, runs: np.ndarray | None) -> tuple[list, np.ndarray]:
    """The groups of ``step`` whose prompts run (``runs``: per group, False where GRESO's skip skipped it; None:
    all) and their predictions, flattened in group order."""
    if runs is None or step.predicted is None:
        return ([g for g, on in zip(step.groups, runs) if on] if runs is not None else step.groups), step.predicted
    sizes = np.cumsum([len(g.lengths) for g in step.groups])[:-1]
    return ([g for g, on in zip(step.groups, runs) if on],
            np.concatenate([p for p, on in zip(np.split(np.asarray(step.predicted), sizes), runs) if on]))


def _compare_verl_dynamic(step: RolloutStep) -> RolloutComparison:
    """``--verl-dynamic-sampling``: verl's v1 dynamic sampling over ``--steps`` (:func:`simulate.run_oversampled_steps`
    with ``refill_rule="verl"``, its poll, vLLM behind verl's router, nothing capped in flight), as it ships and with
    :mod:`lengthsched.integrations.verl_selective`'s refill by need (and GRESO's skip with ``--selective``)."""
    o = step.opts
    valid, earlier = _filter(step)
    skip = selective_stream(step.groups, _earlier_history(step, earlier), SelectiveRollout(seed=o.seed)) \
        if o.selective else np.ones(len(step.groups), dtype=bool)
    rows = []
    for policy, shown, need, skipping in VERL_DYNAMIC_RUNS[:len(VERL_DYNAMIC_RUNS) if o.selective else -1]:
        groups, predicted = _running(step, skip if skipping else None)
        flags = valid[skip] if skipping else valid
        stealing = policy != "vllm"
        try:
            if stealing and predicted is None:
                raise InvalidArgument("predictor", o.predictor, "predictions for the stealing manager's plan")
            done = run_oversampled_steps(groups, policy, batch=o.prompts, oversample=1.0, steps=o.steps, partial=False,
                                         predicted=predicted, valid=flags, filter_seed=o.seed, refill=True,
                                         run=_stealing_run(step) if stealing else
                                         _step_run(step, "least_loaded", at_once=True),
                                         refill_rule="verl", refill_cap=o.prompts, refill_need=need,
                                         refill_poll=VERL_POLL_SECONDS, max_new_tokens=o.max_new_tokens)
            rows.append(RolloutRow(policy, shown, None, steps=done))
        except LengthschedError as exc:
            if not need and not stealing and "budget_tokens" in str(exc):
                raise InvalidArgument("budget", o.budget, f"a larger replica memory: {exc}") from None
            rows.append(RolloutRow(policy, shown, None, str(exc)))
    reference = rows.pop(0)
    filter_text = (f"a dynamic-sampling filter keeps {o.valid_share:g} of the finished groups, at random"
                   if o.valid_share is not None else
                   f"DAPO's filter drops the groups whose rewards all agree, each prompt's chance of a reward drawn "
                   f"from the difficulty model (it keeps {float(np.mean(valid)):.3f} of this stream's groups)")
    setting = (f"{o.steps} rollout steps of verl's dynamic sampling (its v1 sync trainer with "
               f"algorithm.filter_groups): {o.prompts} prompts x G={len(step.groups[0].lengths)} submitted, two more "
               f"for every group the filter drops while fewer than {o.prompts} passed (at most {o.prompts} in "
               f"flight), every group in flight drained, {o.prompts} of those that passed kept and the surplus thrown "
               f"away, each decision at a poll every {VERL_POLL_SECONDS:g} s; {filter_text}"
               + ("" if not o.selective else
                  f"; the skipping row skips {int((~skip).sum())} of the {len(skip)} prompts as GRESO does (dropped "
                  f"one epoch earlier, each skipped with probability one half; "
                  f"{int((~skip & np.asarray(valid)).sum())} of them would have passed)")
               + f"; from {o.workload}, L_max={o.max_new_tokens}, on {o.replicas} replicas of {step.memory.name} "
               f"({o.dtype}) with {step.budget_bytes / 2**30:.2f} GiB each = a pool of {step.pool:,} KV tokens"
               + _cache_phrase(o) + f", vLLM behind verl's router, predictor {o.predictor}; the stealing manager's "
               f"rows plan each batch verl hands over with steal's placement beside the work still running and steal "
               f"from snapshots every {_stealing_poll(o):g} s, {_stealing_resubmit(o):g} s to resubmit; seconds "
               f"modelled for {step.cost.model} on {step.cost.gpu}")
    return RolloutComparison(dataclasses.asdict(o), setting, step.pool, (reference, *rows), step)


def _compare_steps(step: RolloutStep, runs: list) -> RolloutComparison:
    """``--steps``: every run over the same stream of over-sampled steps (:func:`simulate.run_oversampled_steps`),
    and vLLM FCFS + verl's routing without over-sampling (every submitted group kept) as the reference."""
    o = step.opts
    if o.verl_dynamic_sampling:
        return _compare_verl_dynamic(step)
    valid, earlier = _filter(step)
    runs_flags = None  # --selective: which prompts the over-sampled rows run (the same for every row)
    if o.selective:
        runs_flags = selective_stream(step.groups, _earlier_history(step, earlier), SelectiveRollout(seed=o.seed))
        if not runs_flags.any():
            raise InvalidArgument("selective", True, "a stream with a prompt left to run (every one was skipped)")

    def one(policy, router, oversample, reference=False):
        history = None
        if o.filter_order and not reference:  # what the filter did with each prompt one epoch earlier
            history = _earlier_history(step, earlier)
        groups, predicted, flags = step.groups, step.predicted, valid
        if runs_flags is not None and not reference:
            groups, predicted = _running(step, runs_flags)
            flags = np.asarray(valid)[runs_flags]

        return run_oversampled_steps(groups, policy, batch=o.prompts, oversample=oversample, steps=o.steps,
                                     partial=o.partial_rollout, predicted=predicted, resume=STEPS_RESUME,
                                     run=_step_run(step, router, filter_history=history),
                                     valid=flags, filter_history=history, filter_seed=o.seed,
                                     max_new_tokens=o.max_new_tokens,
                                     max_carry=o.max_carry, carry_limit=o.carry_limit or "drop",
                                     refill=bool(o.slime_refill) and not reference and step.capped(policy, router),
                                     compression=parse_compression(o.kv_compression))

    rows = []
    for i, (policy, router, oversample) in enumerate([(*BASELINE, 1.0)] + [(p, r, o.oversample) for p, r in runs]):
        try:
            done = one(policy, router, oversample, reference=i == 0)
            spec = POLICIES[policy]  # the router a run of it reports (run_rollout's)
            shown = "dispatch" if spec.dispatch else "placed" if spec.places_groups else router
            rows.append(RolloutRow(policy, shown, None, steps=done))
        except LengthschedError as exc:
            if (policy, router) == BASELINE and "budget_tokens" in str(exc):
                raise InvalidArgument("budget", o.budget, f"a larger replica memory: {exc}") from None
            rows.append(RolloutRow(policy, router or "placed", None, str(exc)))
    reference = rows.pop(0)
    rows.sort(key=lambda r: (r.steps is None, -(r.steps.kept_tokens_per_second if r.steps else 0.0)))
    per_step = submitted_per_step(o.prompts, o.oversample)
    setting = (f"{o.steps} over-sampled rollout steps of {o.prompts} prompts kept x G={len(step.groups[0].lengths)} "
               f"({per_step} submitted each, the first {o.prompts} groups to finish kept, the others "
               + ("carried into the next step with their tokens (partial rollout)" if o.partial_rollout else
                  "dropped")
               + ("" if o.max_carry is None else
                  f"; a group carried {o.max_carry} step{'s' if o.max_carry != 1 else ''} "
                  + ("is waited for and kept" if o.carry_limit == "wait" else "is dropped instead of carried again"))
               + ("" if o.valid_share is None else f"; a dynamic-sampling filter keeps {o.valid_share:g} of the "
                                                    "finished groups, at random, in every row")
               + ("" if not o.difficulty else
                  f"; DAPO's filter drops the groups whose rewards all agree, each prompt's chance of a reward drawn "
                  f"from the difficulty model (the long prompts the hard ones; it keeps "
                  f"{float(np.mean(valid)):.3f} of this stream's groups), in every row")
               + ("; the over-sampled rows hand each batch over likely-kept first, by what the filter did with the "
                  "same prompts one epoch earlier" if o.filter_order else "")
               + (f"; with partial rollout {o.steps} steps flatter that order, which defers the groups it puts last "
                  f"to later steps rather than saving them: run --steps {SHORT_RUN} or more" if
                  o.filter_order and o.partial_rollout and o.steps < SHORT_RUN else "")
               + ("" if runs_flags is None else
                  f"; the over-sampled rows skip {int((~runs_flags).sum())} of the {len(runs_flags)} prompts as GRESO "
                  f"does (dropped one epoch earlier, each skipped with probability one half; "
                  f"{int((~runs_flags & np.asarray(valid)).sum())} of them would have passed)")
               + ("; the rows through the in-flight cap submit another batch inside a step whenever too few "
                  "could still pass (slime's dynamic sampling)" if o.slime_refill else "")
               + f") from {o.workload}, L_max={o.max_new_tokens}, on {o.replicas} replicas of "
               f"{step.memory.name} ({o.dtype}) with {step.budget_bytes / 2**30:.2f} GiB each = a pool of "
               f"{step.pool:,} KV tokens" + _cache_phrase(o)
               + ("" if o.kv_compression is None or not o.partial_rollout else
                  " (a resumed sample's partial response among them, prefilled again)")
               + f", predictor {o.predictor}, seconds modelled for {step.cost.model} on {step.cost.gpu}")
    return RolloutComparison(dataclasses.asdict(o), setting, step.pool, (reference, *rows), step)


def _cache_phrase(opts: SimulateOptions) -> str:
    """``--kv-compression`` in a setting's text: what each request holds and reads ("" without a cache)."""
    return "" if opts.kv_compression is None else ", " + compression_phrase(opts.kv_compression)


def _with_draws(step: RolloutStep, rows: list[RolloutRow]) -> list[RolloutRow]:
    """``rows`` with their ratios to vLLM FCFS + verl on the step as run and on ``--draws`` more draws of
    the predictions' errors (the same prompts, completions and options otherwise), the draws on
    ``--workers`` processes."""
    o = step.opts
    at = next(i for i, r in enumerate(rows) if (r.policy, r.router) == BASELINE and r.result)
    runs = [(r.policy, None if r.router in ("placed", "dispatch") else r.router) for r in rows]
    units = [(step, runs, o.seed + draw) for draw in range(1, o.draws + 1)]
    drawn = run_units(units, o.workers, False, "draws", fn=_draw_seconds, unit="draw")
    out = []
    for i, r in enumerate(rows):
        ratios = [r.result.seconds / rows[at].result.seconds if r.result else None]
        for seconds in drawn:
            ratios.append(None if seconds[i] is None or seconds[at] is None else seconds[i] / seconds[at])
        out.append(dataclasses.replace(r, draws=tuple(ratios)))
    return out


def _draw_seconds(unit: tuple) -> list[float | None]:
    """One draw of ``--draws``: (step, [(policy, router)], seed) -> each run's makespan on the step with
    the predictions' errors drawn by ``seed`` (None where it could not run)."""
    step, runs, seed = unit
    drawn = dataclasses.replace(step, predicted=step_predictions(step.opts, step.groups, step.before, seed))
    out: list[float | None] = []
    for policy, router in runs:
        try:
            out.append(drawn.run(policy, router).seconds)
        except LengthschedError:
            out.append(None)
    return out


#: Replica simulations the --headroom search runs after its starting placements.
HEADROOM_EVALUATIONS = 200


def _oracle_row(step: RolloutStep) -> RolloutRow:
    """vLLM FCFS on the placement :func:`simulate.search_placement` finds with the true lengths."""
    from .headroom import search_placement

    o = step.opts
    common = dict(replicas=o.replicas, budget_tokens=step.pool, max_new_tokens=o.max_new_tokens, cost=step.cost,
                  prefill_chunk=o.prefill_chunk, max_num_seqs=o.slots, compression=parse_compression(o.kv_compression))
    try:
        found = search_placement(step.groups, policy="vllm", evaluations=HEADROOM_EVALUATIONS, seed=o.seed, **common)
        result = run_rollout(step.groups, "vllm", placement=found.placement, seed=o.seed, **common)
    except LengthschedError as exc:
        return RolloutRow("vllm", "oracle placement", None, str(exc))
    return RolloutRow("vllm", "oracle placement", result)


#: The rollout table's columns and the legend line of each.
ROLLOUT_COLUMNS: dict[str, str] = {
    "policy": "the scheduling policy (+ the router that placed its requests; none: it places or dispatches them)",
    "seconds": "modelled makespan of the step: the last replica's last token (every step priced by its rows, "
               "the KV they read and the tokens it prefills)",
    "x vllm+verl": "seconds / the seconds of vLLM FCFS with verl's routing (below 1: faster)",
    "s/LB": "seconds over the lower bound in seconds (1 = nothing left to gain)",
    "tok/s": "generated tokens per modelled second, all replicas together",
    "slowest": "the slowest replica's seconds over the mean replica's (1 = balanced)",
    "preempt": "preemptions, all replicas",
    "recomputed": "tokens recomputed after preemptions, all replicas",
    "loaded": "KV tokens loaded back from host memory (--kv-offload) or a global pool instead of recomputed, all "
              "replicas (shown when a policy loaded some)",
    "prompt loads": "prompt prefills: each prompt on each replica that runs one of its completions (again after "
                    "an eviction)",
    "to kept": "with --oversample: modelled seconds to the last kept group (the --prompts-th to finish), where "
               "the over-sampled step ends",
    "kept len": "with --oversample: the kept groups' mean completion length over all submitted groups' (below 1: the "
                "step keeps shorter completions than it drew)",
}
#: The columns only an over-sampled step shows.
OVER_COLUMNS = ("to kept", "kept len")


#: A plain step's legend (no loads, not over-sampled).
ROLLOUT_LEGEND = legend(ROLLOUT_COLUMNS, [c for c in ROLLOUT_COLUMNS if c != "loaded" and c not in OVER_COLUMNS])


def rollout_headline(comparison: RolloutComparison) -> str:
    """The verdict: the fastest policy and its gain over vLLM FCFS + verl routing, and who failed."""
    if _steps_rows(comparison)[1]:
        return _steps_headline(comparison)
    done = [r for r in comparison.rows if r.result is not None]
    failed = [r.label for r in comparison.rows if r.result is None]
    if not done:
        return "verdict: every run failed: " + "; ".join(f"{r.label}: {r.error}" for r in comparison.rows)
    base = comparison.baseline
    best = min(done, key=lambda r: r.result.seconds)
    line = (f"verdict: fastest: {best.label}, {best.result.seconds:.2f} s "
            f"({best.result.seconds_ratio:.2f}x the lower bound)")
    if base is not None and best is not base:
        gain = base.result.seconds / best.result.seconds - 1
        line += (f"; {gain:.1%} faster than vllm + least_loaded (vLLM FCFS, verl's routing: "
                 f"{base.result.seconds:.2f} s)")
    elif base is not None:
        line += "; no policy beat vLLM FCFS with verl's routing on this step"
    from . import DEFAULT_POLICY

    step = comparison.step
    recommended = step.recommended if step is not None else DEFAULT_POLICY
    if step is not None and step.history is not None:
        why = (f"lengthsched.placement.recommend_rollout_policy: the previous epoch's siblings "
               f"{'agree' if recommended == 'steal_classes' else 'disagree'}, spread "
               f"{step.spread:.3f} against {CLASSES_MAX_SPREAD}")
    else:
        why = "simulate.DEFAULT_POLICY, the fastest on average over the benchmark grid"
    ours = next((r for r in done if r.policy == recommended), None)
    if ours is not None and ours is not best and base is not None:
        line += (f"; the recommended {recommended} ({why}): {ours.result.seconds:.2f} s, "
                 f"{ours.result.seconds / base.result.seconds:.3f} x vllm + least_loaded")
    elif ours is not None:
        line += f" (the recommended policy: {why})"
    summary = ours.draw_summary() if ours is not None else None
    if summary is not None and ours is not base:
        median, lo, hi, slower, ran = summary
        line += (f"; over {ran} draws of the predictions' errors it is a median {median:.3f} x vllm + least_loaded "
                 f"({lo:.3f}-{hi:.3f}), slower in {slower} of them"
                 + (": where it places whole groups, its placement is a lottery over what the predictions got wrong"
                    if hi - lo > 0.005 else ""))
    elif (ours is not None and ours is not base and recommended == DEFAULT_POLICY and step is not None
          and step.whole_groups):
        longest = any(r.policy == "steal_longest" for r in done)
        line += ("; steal places whole groups in this step (its predicted tokens fill every pool "
                 f"{CROWDED_POOLS:g} times over), so which replica gets a group the predictions underrated is "
                 "one draw of a lottery: orders and placements trade places from draw to draw"
                 + (" (steal_longest beside steal shows one such trade)" if longest else "")
                 + ", and --draws N reruns the step on N more draws of the predictions' errors")
    if ours is not None and POLICIES[recommended].resubmits:
        observed = ("steal_observed simulates it; inside verl: lengthsched.integrations.verl_stealing"
                    if recommended == DEFAULT_POLICY else
                    "inside verl: lengthsched.integrations.verl_stealing with lengthsched.placement=auto, which "
                    "plans length classes from the prompts' previous step")
        line += (f"; {recommended} moves waiting and running requests between engines with their partial "
                 "generations: a framework runs it by aborting and resubmitting them "
                 f"(lengthsched.integrations.StealCoordinator; {observed}, not yet run on a cluster); the TRL "
                 "integration and verl's plain planning manager send a static plan (what vllm_priority + "
                 "least_loaded simulates)")
        delay = float(comparison.options.get("resubmit_seconds") or 0.0)
        if delay:
            line += (f"; each move waits {delay:g} s here: with verl's own client, which waits 1 s, the moves of "
                     "running requests cost more than they gain on the benchmark grid and at scale; verl_stealing's "
                     "client resubmits its moves at once (docs/benchmarks.md, 'Resubmission delay')")
    over = [r for r in done if r.kept is not None]
    if over and base is not None and base.kept is not None:
        quickest = min(over, key=lambda r: r.kept[0])
        line += (f"; over-sampled, the step ends at its last kept group: {quickest.label} gets there first, "
                 f"{quickest.kept[0]:.2f} s ({quickest.kept[0] / base.kept[0]:.3f} x vllm + least_loaded's "
                 f"{base.kept[0]:.2f} s), keeping groups whose completions are {quickest.kept[1]:.3f} of the "
                 f"submitted groups' mean length (vllm + least_loaded: {base.kept[1]:.3f}; the first to finish "
                 "are the short ones)")
    slime = next((r for r in done if (r.policy, r.router) == SLIME), None)
    planned = next((r for r in done if (r.policy, r.router) == ("sglang", PLAN_ROUTER)), None)
    if slime is not None and planned is not None:
        capped = comparison.options.get("in_flight")
        line += ("; for slime's users (SGLang behind its cache-aware router"
                 + (f", {capped} requests per engine in flight" if capped else ", every request sent at once")
                 + f": {slime.result.seconds:.2f} s), lengthsched.integrations.slime's plan and client queues take "
                 f"{planned.result.seconds:.2f} s, {planned.result.seconds / slime.result.seconds:.3f} x slime's")
    if failed:
        line += f"; could not run: {', '.join(failed)}"
    if ours is None and recommended != DEFAULT_POLICY:
        line += f"; the recommended {recommended} ({why}) was not run (add it to --policies)"
    if str(comparison.options.get("predictor", "")).startswith("oracle"):
        line += "; predictions are the true lengths (oracle): a best case"
    oracle = comparison.oracle
    if oracle is not None and oracle.result is not None and base is not None:
        gain = base.result.seconds / oracle.result.seconds - 1
        line += (f"; with every length known in advance (oracle), a searched placement over vLLM FCFS takes "
                 f"{oracle.result.seconds:.2f} s ({gain:.1%} faster than vllm + least_loaded, "
                 f"{oracle.result.seconds_ratio:.2f}x the lower bound): what placement could buy at most here, as "
                 "far as the search finds")
    return line


#: The columns of ``--steps``' table, and what each means.
STEPS_COLUMNS = {
    "s/step": "modelled seconds per step on average (each step ends at its --prompts-th finished group)",
    "kept tok/s": "tokens of the kept groups' completions per modelled second, over all the steps",
    "x ref": "kept tok/s over the reference's (the first row: vllm + least_loaded, every submitted group kept)",
    "on-policy tok/s": "kept tokens generated in the step that kept them, per modelled second (what is left to "
                       "train on where slime masks the others: --mask-offpolicy-in-partial-rollout)",
    "stale": "the share of the kept tokens an earlier step generated (an older policy's, with --partial-rollout)",
    "dropped": "the share of the generated tokens thrown away with the aborted groups (without --partial-rollout, "
               "or past --max-carry)",
    "kept len": "the kept groups' mean completion length over every drawn group's (below 1: the short groups are "
                "over-represented)",
    "age": "the kept tokens' mean age in steps (policy updates between the step that generated a token and the "
           "one that kept it)",
    "waited": "the most steps a kept group waited between its first submission and the step that kept it",
    "filtered": "with --valid-share or --difficulty: the share of the generated tokens in groups the filter dropped",
}
#: The columns of --verl-dynamic-sampling's table (no partial rollout: nothing is stale or waits).
VERL_STEPS_COLUMNS = {
    "s/step": "modelled seconds per step on average (each step ends at the poll after its last group finished)",
    "kept tok/s": STEPS_COLUMNS["kept tok/s"],
    "x ref": "kept tok/s over the reference's (the first row: verl as it ships, two prompts refilled per drop)",
    "surplus": "the share of the generated tokens in groups that passed the filter and were thrown away (beyond "
               "--prompts)",
    "kept len": STEPS_COLUMNS["kept len"],
    "filtered": STEPS_COLUMNS["filtered"],
}


def _steps_rows(comparison: RolloutComparison) -> tuple[RolloutRow | None, list[RolloutRow]]:
    """``--steps``: (the reference row, the others); (None, []) for a plain step."""
    if not any(r.steps is not None for r in comparison.rows):
        return None, []
    reference = comparison.rows[0]
    return (reference if reference.steps is not None else None), list(comparison.rows[1:])


def _steps_headline(comparison: RolloutComparison) -> str:
    reference, rows = _steps_rows(comparison)
    done = [r for r in rows if r.steps is not None]
    opts = comparison.options
    if not done:
        return "verdict: no policy ran the over-sampled steps"
    best = max(done, key=lambda r: r.steps.kept_tokens_per_second)
    b = best.steps
    if opts.get("verl_dynamic_sampling"):
        line = (f"verdict: over {opts['steps']} steps of verl's dynamic sampling, the most kept tokens per second: "
                f"{best.label}, {b.kept_tokens_per_second:,.0f}")
        if reference is not None:
            r = reference.steps
            line += (f", {b.kept_tokens_per_second / r.kept_tokens_per_second:.3f} x verl as it ships "
                     f"({r.kept_tokens_per_second:,.0f}); it threw away {b.dropped_share:.1%} of what it generated as "
                     f"surplus (verl {r.dropped_share:.1%})")
        failed = [r.label for r in rows if r.steps is None]
        return line + (f"; could not run: {', '.join(failed)}" if failed else "")
    line = (f"verdict: over {opts['steps']} over-sampled steps ({opts['oversample']:g}x, "
            + ("partial rollout" if opts["partial_rollout"] else "aborted groups dropped")
            + f"), the most kept tokens per second: {best.label}, {b.kept_tokens_per_second:,.0f}")
    if reference is not None:
        r = reference.steps
        line += (f", {b.kept_tokens_per_second / r.kept_tokens_per_second:.3f} x vllm + least_loaded without "
                 f"over-sampling ({r.kept_tokens_per_second:,.0f})")
    if opts["partial_rollout"]:
        line += (f"; {b.stale_share:.1%} of its kept tokens were generated by an earlier step, an older policy's "
                 f"(on-policy {b.fresh_tokens_per_second:,.0f} tok/s"
                 + ("" if reference is None else
                    f", {b.fresh_tokens_per_second / reference.steps.kept_tokens_per_second:.3f} x the reference: "
                    "what is left where they are masked")
                 + f"), a kept group waited up to {b.max_wait} step" + ("s" if b.max_wait != 1 else "")
                 + f", a kept token is {b.mean_token_age:.2f} steps old on average")
        if b.dropped_share:
            line += f"; it threw away {b.dropped_share:.1%} of what it generated (groups past --max-carry)"
    else:
        line += (f"; it threw away {b.dropped_share:.1%} of what it generated and kept groups "
                 f"{b.kept_length_ratio:.3f} of the drawn groups' mean length (--partial-rollout carries them instead)")
    if reference is not None and reference.steps.shortfall:
        line += (f"; the reference keeps only the groups that pass the filter of the {opts['prompts']} it submits "
                 f"({reference.steps.shortfall} fewer over the steps)")
    short = [r.label for r in done if r.steps.shortfall]
    if short:
        line += (f"; the filter passed too few groups for {', '.join(short)} (a step kept fewer than "
                 f"{opts['prompts']}: slime would submit more in the middle of the step, which is not modelled; "
                 "raise --oversample)")
    failed = [r.label for r in rows if r.steps is None]
    if failed:
        line += f"; could not run: {', '.join(failed)}"
    return line


def _format_steps(comparison: RolloutComparison) -> str:
    reference, rows = _steps_rows(comparison)
    filtered = comparison.options.get("valid_share") is not None or bool(comparison.options.get("difficulty"))
    verl = bool(comparison.options.get("verl_dynamic_sampling"))
    meanings = VERL_STEPS_COLUMNS if verl else STEPS_COLUMNS
    head = ["run"] + [c for c in meanings if filtered or c != "filtered"]
    table = [head]
    ref = reference.steps.kept_tokens_per_second if reference is not None else None
    for row in ([reference] if reference is not None else []) + rows:
        o = row.steps
        label = row.label + ("" if row is not reference else " (reference: verl as it ships)" if verl
                             else " (reference, no over-sampling)")
        if o is None:
            table.append([label, "fails"] + ["-"] * (len(head) - 2))
            continue
        cells = {"s/step": f"{o.seconds / len(o.steps):.2f}", "kept tok/s": f"{o.kept_tokens_per_second:,.0f}",
                 "x ref": f"{o.kept_tokens_per_second / ref:.3f}" if ref else "-",
                 "on-policy tok/s": f"{o.fresh_tokens_per_second:,.0f}", "stale": f"{o.stale_share:.3f}",
                 "dropped": f"{o.dropped_share:.3f}", "surplus": f"{o.dropped_share:.3f}",
                 "kept len": f"{o.kept_length_ratio:.3f}", "age": f"{o.mean_token_age:.2f}", "waited": str(o.max_wait),
                 "filtered": f"{o.filtered_share:.3f}"}
        table.append([label] + [cells[c] for c in head[1:]])
    lines = [comparison.setting, ""] + aligned(table)
    errors = [f"  {r.label}: {r.error}" for r in rows if r.error]
    if errors:
        lines += ["", "could not run:"] + errors
    lines += ["", _steps_headline(comparison), "", "columns:", legend(meanings, head[1:])]
    return "\n".join(lines)


def format_rollout(comparison: RolloutComparison) -> str:
    """The comparison as an aligned table, fastest first, with the verdict and a legend line per column."""
    if _steps_rows(comparison)[1]:
        return _format_steps(comparison)
    base = comparison.baseline
    oracle = comparison.oracle
    shown = comparison.rows + ((oracle,) if oracle is not None and oracle.result is not None else ())
    loads = any(row.result is not None and row.result.loaded_tokens for row in shown)
    over = any(row.kept is not None for row in comparison.rows)
    head = [c for c in ROLLOUT_COLUMNS if (loads or c != "loaded") and (over or c not in OVER_COLUMNS)]
    table = [head]
    for row in shown:
        r = row.result
        if r is None:
            table.append([row.label, "fails"] + ["-"] * (len(head) - 2))
            continue
        ratio = f"{r.seconds / base.result.seconds:.3f}" if base is not None else "-"
        label = row.label if row is not oracle else "oracle (not a policy): " + row.label
        table.append([label, f"{r.seconds:.2f}", ratio, f"{r.seconds_ratio:.3f}", f"{r.tokens_per_second:,.0f}",
                      f"{r.slowest_share:.3f}", str(r.preemptions), f"{r.recomputed_tokens:,}"]
                     + ([f"{r.loaded_tokens:,}"] if loads else []) + [str(r.prompt_loads)]
                     + (([f"{row.kept[0]:.2f}", f"{row.kept[1]:.3f}"] if row.kept else ["-", "-"]) if over else []))
    lines = [comparison.setting, ""] + aligned(table)
    drawn = [(row, row.draw_summary()) for row in comparison.rows if row.draws is not None]
    if drawn:
        n = max(len(row.draws) for row, _ in drawn)
        lines += ["", f"over {n} draws of the predictions' errors (the step above and {n - 1} more), "
                      "x vllm+verl of the same draw:"]
        width = max(len(row.label) for row, _ in drawn)
        for row, summary in sorted(drawn, key=lambda x: x[1][0] if x[1] else math.inf):
            if summary is None:
                lines.append(f"  {row.label.ljust(width)}  fails on every draw")
                continue
            median, lo, hi, slower, ran = summary
            lines.append(f"  {row.label.ljust(width)}  median {median:.3f}  best {lo:.3f}  worst {hi:.3f}  slower in "
                         f"{slower} of {ran}" + ("" if ran == n else f" (fails on {n - ran})"))
    errors = [f"  {r.label}: {r.error}" for r in comparison.rows + ((oracle,) if oracle else ()) if r.error]
    if errors:
        lines += ["", "could not run:"] + errors
    lines += ["", rollout_headline(comparison), "", "columns:", legend(ROLLOUT_COLUMNS, head)]
    return "\n".join(lines)


def rollout_figures(comparison: RolloutComparison, directory) -> list:
    """Figures of one rollout step: a Gantt per replica (in seconds) for the recommended policy
    (:attr:`RolloutStep.recommended`) and
    for vLLM + verl routing, and the KV held over time of every replica under both. Rows the
    comparison recorded (``compare_rollout(..., record=True)``) are drawn as they are; a missing one
    is run on the comparison's step."""
    from .plots import rollout_gantt, rollout_kv

    step = comparison.step
    directory.mkdir(parents=True, exist_ok=True)
    results = {}
    for policy, router in (BASELINE, (step.recommended, None)):
        row = next((r for r in comparison.rows if r.result is not None and r.policy == policy
                    and (router is None or r.router == router) and r.result.timelines
                    and r.result.timelines[0] is not None), None)
        results[policy] = row.result if row is not None else step.run(policy, router, record=True)
    paths = []
    groups = step.groups
    for policy, result in results.items():
        path = directory / f"rollout_gantt_{policy}.png"
        rollout_gantt(result, path, f"{policy}: {len(groups)} prompts x G={len(groups[0].lengths)} on "
                                    f"{step.opts.replicas} replicas ({result.seconds:.2f} s)")
        paths.append(path)
    path = directory / "rollout_kv.png"
    rollout_kv(results, step.pool, path, f"KV held per replica ({step.pool:,}-token pools, prompts inside)")
    paths.append(path)
    return paths
