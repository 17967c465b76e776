"""The one registry of sampling policies: name -> :class:`PolicySpec` (what it is, what it supports).

Every other list of policies derives from :data:`POLICIES`: the simulator's vectorised
(``simulate.fast``) and compiled (``simulate.compiled``) paths, the reference sampler's policies,
the analytic peaks of :mod:`lengthsched.peaks`. A spec is callable: ``POLICIES[name](problem)``
builds the policy object for one :class:`~lengthsched.runtime.policies.Problem`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgument
from .baselines import (
    AdaptivePlacement,
    LengthClasses,
    PlacedLongestFirst,
    SGLangLike,
    SGLangPriority,
    VLLMLike,
    VLLMPriority,
)
from .dispatch import SeerDivided, SeerLike, StealClasses, StealLongest, StealObserved, StealSGLang, WorkStealing
from .policies import DynamicSlots, FixedSlots, FullGroup, GrowthAware, LengthAware, MicroGroups, Problem, SimPolicy

__all__ = ["PolicySpec", "POLICIES", "make_policy", "policy_names"]


@dataclass(frozen=True)
class PolicySpec:
    """One sampling policy and what it supports.

    ``budget``: it runs within a KV token budget (the engine then checks it never exceeds it);
    ``needs_budget``: it cannot run without one; ``slots``: it honours a cap on live sequences;
    ``fast`` / ``compiled``: ``simulate.fast`` (numpy over groups) / ``simulate.compiled`` (Numba)
    give the same results as the event engine; ``sampler``: the reference sampler runs it;
    ``unbiased``: it collects exactly the completions it launched (False for the stop-at-G control);
    ``peaks``: its name in :func:`lengthsched.peaks.policy_peak` (analytic steps and peak memory);
    ``places_groups``: in a rollout over several replicas it places the groups itself (a router is ignored);
    ``rollout``: ``simulate.run_rollout`` runs it (it counts prompts in the KV pool);
    ``dispatch``: a rollout policy that moves work between replicas as they free up (a global queue,
    or stealing), so ``simulate.run_rollout`` runs its replicas on one clock; on one engine
    (``run_group`` / ``run_batch``, the sampler) it runs alone over its own queue;
    ``compressed``: it runs with a compressed KV cache (``Problem.kv_cap``, ``run_group(compression=)``),
    counting each sequence's KV up to the cache's most (the SGLang models still reserve uncompressed
    lengths; of the rollout policies that place or dispatch requests, ``steal``, ``steal_longest``,
    ``steal_observed``, ``steal_sglang``, ``seer``, ``seer_divided``, the ``placed_*`` policies and
    ``steal_classes`` (their classes planned on the capped KV): every policy registered here; the flag
    keeps a policy that cannot count a cache from being run with one).
    """

    name: str
    cls: type[SimPolicy]
    summary: str
    options: tuple[tuple[str, Any], ...] = ()
    budget: bool = True
    needs_budget: bool = False
    slots: bool = True
    fast: bool = False
    compiled: bool = False
    sampler: bool = True
    unbiased: bool = True
    peaks: str | None = None
    places_groups: bool = False
    rollout: bool = False
    dispatch: bool = False
    compressed: bool = False

    def __call__(self, problem: Problem) -> SimPolicy:
        return self.cls(problem, **dict(self.options))

    @property
    def resubmits(self) -> bool:
        """Whether in a rollout it moves requests between replicas by aborting and resubmitting them (the
        policies that steal: ``simulate.run_rollout``'s ``resubmit_seconds`` delays their moves)."""
        return bool(getattr(self.cls, "STEALS", False))

    @property
    def loads(self) -> str:
        """How a rollout times the KV it loads from a global pool (a request moved with its KV): "async"
        (the request waits for its load while the others decode) or "stall" (the load is charged to the
        step that admits it); the class's ``LOADS``, "stall" for a policy that moves no KV."""
        return getattr(self.cls, "LOADS", "stall")

    @property
    def polls(self) -> bool:
        """Whether it decides from snapshots of the replicas taken at intervals, as a framework polls them
        (``simulate.run_rollout``'s ``snapshot_seconds`` sets the interval)."""
        return hasattr(self.cls, "SNAPSHOT_SECONDS")


def _specs(*specs: PolicySpec) -> dict[str, PolicySpec]:
    return {s.name: s for s in specs}


POLICIES: dict[str, PolicySpec] = _specs(
    PolicySpec("full", FullGroup, "all G decode together as one padded batch", (("padded", True),),
               budget=False, slots=False, fast=True, peaks="full", compressed=True),
    PolicySpec("full_freed", FullGroup, "all G together, each freed when it finishes", (("padded", False),),
               budget=False, slots=False, fast=True, compressed=True),
    PolicySpec("micro", MicroGroups, "rounds of g as padded batches", fast=True, peaks="micro", compressed=True),
    PolicySpec("fixed_slot", FixedSlots, "g slots refilled in index order", fast=True, peaks="continuous",
               compressed=True),
    PolicySpec("dynamic_slot", DynamicSlots, "g slots from an endless stream, stop at G (biased control)",
               unbiased=False, compressed=True),
    PolicySpec("length_aware", LengthAware, "FPTAS plan on predicted lengths, SJF refill", peaks="length_aware",
               compressed=True),
    PolicySpec("length_aware_lpt", LengthAware, "FPTAS plan, longest-first refill", (("refill", "lpt"),),
               compressed=True),
    PolicySpec("length_aware_fcfs", LengthAware, "FPTAS plan, index-order refill", (("refill", "fcfs"),),
               compressed=True),
    PolicySpec("growth_aware", GrowthAware, "admit while the predicted KV curve fits, SJF", needs_budget=True,
               compressed=True),
    PolicySpec("growth_aware_lpt", GrowthAware, "growth-aware admission, longest first", (("refill", "lpt"),),
               needs_budget=True, compressed=True),
    PolicySpec("growth_aware_fcfs", GrowthAware, "growth-aware admission, index order", (("refill", "fcfs"),),
               needs_budget=True, compressed=True),
    PolicySpec("vllm", VLLMLike, "vLLM-like: blocks of 16, FCFS, preempt the newest", needs_budget=True,
               compiled=True, rollout=True, compressed=True),
    PolicySpec("vllm_priority", VLLMPriority, "vLLM V1 priority scheduling, longest predicted first",
               needs_budget=True, rollout=True, compressed=True),
    PolicySpec("placed_lpt", PlacedLongestFirst, "groups placed on replicas by predicted work; vLLM priority "
               "scheduling, longest predicted first", needs_budget=True, places_groups=True, rollout=True,
               compressed=True),
    PolicySpec("placed_classes", LengthClasses, "completions placed on replicas in length classes by predicted "
               "length (the longest together); vLLM priority scheduling, longest predicted first", needs_budget=True,
               places_groups=True, rollout=True, compressed=True),
    PolicySpec("placed_adaptive", AdaptivePlacement, "vLLM FCFS; groups spread over replicas unless their prompts "
               "would crowd the pool, then placed whole by predicted work", needs_budget=True, places_groups=True,
               rollout=True, compressed=True),
    PolicySpec("sglang", SGLangLike, "SGLang-like: decaying reservation, retract the least advanced",
               needs_budget=True, compiled=True, rollout=True, compressed=True),
    PolicySpec("sglang_priority", SGLangPriority, "SGLang priority scheduling and retraction, longest predicted "
               "first", needs_budget=True, rollout=True, compressed=True),
    PolicySpec("seer", SeerLike, "Seer-like: global queue, one probe per group, then longest finished group "
               "first", needs_budget=True, places_groups=True, rollout=True, dispatch=True, compressed=True),
    PolicySpec("seer_divided", SeerDivided, "Seer-like with its divided rollout: requests go back to the global "
               f"queue every {SeerDivided.CHUNK} tokens and continue on any replica, their KV loaded through a global "
               "pool (priced over the host link, loads overlapping the decoding)",
               needs_budget=True, places_groups=True, rollout=True, dispatch=True, compressed=True),
    PolicySpec("steal", WorkStealing, "each group over as many replicas as the pools hold its prompts (whole groups "
               "in crowded steps), vLLM FCFS per replica, drained replicas steal waiting requests and take running "
               "ones", needs_budget=True, places_groups=True, rollout=True, dispatch=True, compressed=True),
    PolicySpec("steal_longest", StealLongest, "steal with each replica's queue longest predicted first: faster on "
               "average, worse worst cases", needs_budget=True, places_groups=True, rollout=True, dispatch=True,
               compressed=True),
    PolicySpec("steal_classes", StealClasses, "steal over placed_classes's placement (length classes by predicted "
               "length): for predictions learnt from an earlier epoch where siblings agree",
               needs_budget=True, places_groups=True, rollout=True, dispatch=True, compressed=True),
    PolicySpec("steal_sglang", StealSGLang, "steal over SGLang engines (SGLang's reservation and retraction per "
               "replica): what the placement and stealing give a framework that keeps SGLang, as slime does",
               needs_budget=True, places_groups=True, rollout=True, dispatch=True, compressed=True),
    PolicySpec("steal_observed", StealObserved, "steal decided from snapshots a framework can take "
               "(lengthsched.integrations.StealCoordinator): what a framework that aborts and resubmits gets",
               needs_budget=True, places_groups=True, rollout=True, dispatch=True, compressed=True),
    PolicySpec("reserve_max", FixedSlots, "reserve L_max per request, never preempt", (("name", "reserve_max"),),
               fast=True, compressed=True),
)


def policy_names(**supports: bool) -> tuple[str, ...]:
    """Names of the policies whose specs have every given flag, e.g. ``policy_names(fast=True)``."""
    fields = PolicySpec.__dataclass_fields__
    unknown = [k for k in supports if k not in fields or fields[k].type not in ("bool", bool)]
    if unknown:
        raise InvalidArgument("supports", unknown, "flags of PolicySpec: budget, needs_budget, slots, fast, "
                                                   "compiled, sampler, unbiased, places_groups, rollout, dispatch, "
                                                   "compressed")
    return tuple(n for n, s in POLICIES.items() if all(getattr(s, k) == v for k, v in supports.items()))


def make_policy(name: str, problem: Problem) -> SimPolicy:
    """The policy ``name`` (one of :data:`POLICIES`) for ``problem``."""
    if name not in POLICIES:
        raise InvalidArgument("policy", name, "one of " + ", ".join(POLICIES))
    return POLICIES[name](problem)
