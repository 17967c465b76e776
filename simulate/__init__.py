"""simulate: a discrete-event simulator of group sampling policies (docs/model.md section 4).

``run_group(lengths, policy, ...)`` simulates one group; ``run_batch`` several groups sharing a
budget; ``run_rollout`` an RL rollout step (many groups on several engine replicas);
``run_oversampled_steps`` over-sampled steps one after another (slime's partial rollout);
``run_multiturn`` a multi-turn (agentic) rollout step: sessions of several turns with tool calls
between them, sticky routing and the engines' prefix cache (:mod:`simulate.multiturn`);
``run_async_rollout`` asynchronous RL (AReaL's loop: generation goes on while the learner trains,
within a staleness bound); ``run_verl_async`` verl's fully asynchronous recipe (streamed local updates,
a bound on the groups started per weight version);
``search_placement`` the best placement of a rollout's requests a search finds with the true
lengths (an oracle: what placement could buy); :mod:`simulate.sgpo_training` sGPO's ways of sizing
groups (fixed, profiled, online, oracle) over a training run whose success rates drift;
:data:`POLICIES` names every policy. Workloads (real CASTILLO groups, single-length traces with a
group model, JSON-lines trace files) are in :mod:`simulate.workloads`; the comparison report behind
``lengthsched simulate`` in :mod:`simulate.report`.
"""

# The runtime (engine, policies, registry) lives in lengthsched.runtime; re-exported here.
from lengthsched.runtime import POLICIES, Engine, Problem, SimPolicy, SimulationError, Timeline, make_policy

from .asynchronous import ASYNC_ROUTERS, AsyncRollout, AsyncStep, run_async_rollout, run_verl_async
from .headroom import PlacementSearch, search_placement
from .multiturn import MULTITURN_POLICIES, MultiTurnResult, Turns, run_multiturn, split_turns
from .oversampling import OversampledSteps, StepRecord, run_oversampled_steps
from .rollout import (
    ROUTERS,
    LiveRouter,
    RolloutResult,
    cache_aware_placement,
    place_by_length_class,
    place_by_time,
    route,
    run_rollout,
    run_slime_planned,
    run_slime_planned_in_order,
    run_verl_planned,
    run_verl_stealing,
)
from .run import SimResult, lower_bound, retained_kv_curve, run_batch, run_group

#: The recommended policy (a name in ``lengthsched.runtime.POLICIES``, usable by ``run_group``,
#: ``run_batch`` and ``run_rollout``): the fastest on average over the rollout grid of
#: docs/benchmarks.md ("Rollout steps": 90 settings, modelled seconds), ahead of vLLM FCFS with
#: verl's routing, vLLM and SGLang priority scheduling and the Seer-like anchor. It is slower than
#: vLLM + verl on a few settings and misses the goal of 10% on average: see docs/benchmarks.md.
#: On one engine (``run_group``, ``run_batch``) it is vLLM's FCFS engine. With the previous epoch's
#: completions of the same prompts, ``lengthsched.placement.recommend_rollout_policy`` says whether
#: ``steal_classes`` (``steal`` over length classes) should run instead.
DEFAULT_POLICY = "steal"

__all__ = [
    "Engine",
    "POLICIES",
    "Problem",
    "SimPolicy",
    "SimResult",
    "SimulationError",
    "Timeline",
    "lower_bound",
    "make_policy",
    "run_batch",
    "run_group",
    "run_rollout",
    "run_multiturn",
    "split_turns",
    "Turns",
    "MultiTurnResult",
    "MULTITURN_POLICIES",
    "run_slime_planned",
    "run_slime_planned_in_order",
    "run_verl_planned",
    "run_verl_stealing",
    "run_oversampled_steps",
    "OversampledSteps",
    "StepRecord",
    "run_async_rollout",
    "run_verl_async",
    "AsyncRollout",
    "AsyncStep",
    "ASYNC_ROUTERS",
    "DEFAULT_POLICY",
    "RolloutResult",
    "ROUTERS",
    "route",
    "LiveRouter",
    "cache_aware_placement",
    "place_by_length_class",
    "place_by_time",
    "retained_kv_curve",
    "PlacementSearch",
    "search_placement",
]
