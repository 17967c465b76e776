"""verl's v1 trainer: plan every batch of prompts it dispatches, route each completion to its replica.

verl 0.9.1's v1 trainer (``trainer.use_v1=True``; ``trainer/main_ppo.py``, ``TaskRunnerV1``) builds
the agent-loop manager that ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` names
(default ``trainer/ppo/v1/agent_loop_tq.py``, ``AgentLoopManagerTQ``) with ``cls.create(config=,
llm_client=, teacher_client=, reward_loop_worker_handles=)``. It differs from the legacy trainer's
(:mod:`lengthsched.integrations.verl`) in what this module has to work with:

- ``generate_sequences(batch)`` gets **one row per prompt** (a ``TensorDict``: ``uid``,
  ``raw_prompt``, ..., and the batch-wide ``global_steps`` and ``validate``), splits it over the
  agent-loop workers (``AgentLoopWorkerTQ``) with ``ray.get`` and returns nothing: each worker runs
  a prompt's ``n`` sessions (the row's ``__rollout_n__``, else ``rollout.n``, or ``val_kwargs.n``
  when validating) and puts what they generate into TransferQueue, from where the trainer's replay
  buffer takes it. The trainer calls it once a step, and again for every refill under DAPO's filter
  (``ReplayBuffer``'s ``refill_fn``) or for the next step's prompts in its asynchronous modes.
- Each session passes the prompt's columns to the agent loop as keyword arguments, so a ``priority``
  column reaches ``SingleTurnAgentLoop.run(priority=)``, ``LLMServerClient.generate(priority=)``, the
  router's ``acquire_server`` and (vLLM, non-zero) the engine, **the same priority for all of a prompt's
  completions**. verl itself sets none (every request carries the agent loop's default 0). verl's
  multi-turn ``ToolAgentLoop.run`` takes the priority but passes none to ``generate``: its turns would reach
  the router and the engine without one. ``LengthschedAgentLoopWorkerTQ`` gives every request of a session
  that names no priority its session's (:class:`~lengthsched.integrations.verl.SessionPriorities`), so each
  turn of a tool loop is routed and queued as its plan says, and keeps its replica's prefix cache.

This module supplies ``LengthschedAgentLoopManagerTQ`` (made on first access from verl's
``AgentLoopManagerTQ``: needs verl), which, before verl dispatches a batch:

- plans it with the legacy manager's :class:`~lengthsched.integrations.verl.RolloutPlanner` (the
  same ``lengthsched`` config section: predictor, placement, order, pools), each prompt's row
  repeated its ``n`` times, priorities above those of every earlier batch (``base``), and with
  ``groups`` and ``ways`` from the predicted tokens still running on each replica (the groups
  dispatched earlier and not yet finished: refills and asynchronous steps land beside them);
- writes each prompt's priority (the lowest of its rows') into a ``priority`` column, and tells
  :class:`~lengthsched.integrations.verl.PlannedLoadBalancer` (:meth:`~PlannedLoadBalancer.expect`)
  where each of that priority's requests goes, so the shared priority does not read as a collision:
  the plan's replica for ``groups``, ``ways`` and ``classes``; for ``spread`` (the default) the
  replica with the fewest requests in flight, as verl's own router sends it (a refill arrives while
  the replicas are unevenly loaded: the plan's fixed "row i to replica i mod R" was up to 4.8% slower
  in the simulator's model of verl's loop). With verl's own router the priorities still order each
  vLLM engine's queue (``scheduling_policy=priority``) and a warning says a placement is lost;
- under DAPO's filter (``algorithm.filter_groups.enable``) ranks each batch in verl's order unless the
  config names an order: longest predicted first was 1.6% slower than verl there over 20 modelled steps
  (``simulate.run_verl_planned``; docs/benchmarks.md, "verl's own dynamic sampling"), since verl drains
  every group it submits and the short groups' verdicts trigger its refills;
- collects the lengths its workers (``LengthschedAgentLoopWorkerTQ``, verl's worker that also
  remembers how many tokens each finished session generated) saw since the last call, and feeds
  the training prompts' lengths to the planner under the step they were dispatched in.

``LengthschedStealingAgentLoopManagerTQ`` (:func:`make_tq_stealing_manager_class`) adds work stealing between
the vLLM replicas: each completion its own row priority (:data:`PRIORITIES`), one
:class:`~lengthsched.integrations.verl_stealing.StealDriver` across the trainer's dispatches, and Ray's
``worker_process_setup_hook`` (:func:`lengthsched.integrations.verl_stealing.setup_hook`) to register the vLLM
server class with snapshots before the v1 trainer builds its servers.

Importing this module imports neither verl, Ray nor torch.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidArgument, check_int
from ..filtering import SOLVED_REWARD, check_solved_reward
from ..io import atomic_write_bytes
from ..sgpo import OnlineBudget, online_budget_from_options, reach_steps, write_online_budget
from .verl import (
    MANAGER_TQ_CLASS,
    SESSION_PRIORITY,
    STEALING_MANAGER_TQ_CLASS,
    VERL_VERSION,
    ManagerPlanning,
    SessionPriorities,
    SessionPriorityClient,
    _options,
    _setting,
    batch_prompt_tokens,
    prompt_key,
    sgpo_options,
)
from .verl_stealing import LoopThread, RunDriver, steal_options, stealing_client

__all__ = ["MANAGER_TQ_CLASS", "PRIORITIES", "ROLLOUT_N", "ROLLOUT_N_ORDERS", "RUNNING_STEPS", "SESSION_PRIORITY",
           "SGPO_KEYS", "SGPO_OPTIONS", "SGPO_RULE", "STEALING_MANAGER_TQ_CLASS", "OnlineSGPO", "SessionPriorityClient",
           "adaptive_rollout_rows", "filter_groups", "generated_tokens", "make_tq_agent_loop_manager_class",
           "make_tq_stealing_manager_class", "make_tq_worker_class", "online_sgpo", "write_adaptive_rollout_data"]
# (SESSION_PRIORITY, SessionPriorityClient: verl's, named here too)

log = logging.getLogger(__name__)

#: The stealing manager's per-prompt column: the priority of each of its sessions (read by the worker).
PRIORITIES = "lengthsched_priorities"


def generated_tokens(output: Any) -> int:
    """Tokens the model generated in one verl ``AgentLoopOutput`` (the sum of its ``response_mask``: 1 for
    the model's tokens, 0 for a tool's), or the length of its ``response_ids`` where it has no mask."""
    mask = getattr(output, "response_mask", None)
    if mask is not None:
        return int(sum(int(m) for m in mask))
    return len(getattr(output, "response_ids", ()) or ())


def _finite(score: Any) -> float | None:
    """A session's ``reward_score`` as one finite number, else None (missing, NaN, infinite, or not a number: the
    online sGPO learns nothing from it)."""
    try:
        value = float(score)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def make_tq_worker_class(base: type) -> type:
    """``LengthschedAgentLoopWorkerTQ``: ``base`` (the class under verl's ``AgentLoopWorkerTQ`` actor,
    ``AgentLoopWorkerTQ.__ray_actor_class__``) that also remembers, per prompt, the tokens each of its
    sessions generated (:func:`generated_tokens` of the session's last output) and the reward verl's agent loop gave
    it (the last output's ``reward_score``; None where verl scores later, with a colocated reward model, or where it
    is not one finite number), and hands the
    finished prompts' lengths and rewards over once when the manager asks (``lengthsched_take``). A prompt counts as
    finished when all its sessions settled, failed ones included (their lengths and rewards are missing). A prompt
    with a :data:`PRIORITIES` column (the stealing manager's) runs session ``i`` with priority ``PRIORITIES[i]`` instead
    of the prompt's ``priority`` (verl passes a prompt's columns to all its sessions alike); the column itself
    goes no further. Every request of a session carries the session's priority, the turns of a multi-turn loop
    included (:class:`~lengthsched.integrations.verl.SessionPriorities`)."""

    class LengthschedAgentLoopWorkerTQ(SessionPriorities, base):  # type: ignore[misc, valid-type]
        """verl's AgentLoopWorkerTQ that reports its prompts' lengths (lengthsched.integrations.verl_v1)."""

        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self._lengthsched_running: dict[Hashable, tuple[list[int], list[float | None]]] = {}
            self._lengthsched_done: list[tuple[Hashable, list[int], list[float | None]]] = []

        async def _run_prompt(self, prompt: dict, sampling_params: dict, trajectory: dict,
                              trace: bool = False) -> None:
            uid = prompt.get("uid")
            self._lengthsched_running.setdefault(uid, ([], []))
            try:
                await super()._run_prompt(prompt, sampling_params, trajectory=trajectory, trace=trace)
            finally:
                self._lengthsched_done.append((uid, *self._lengthsched_running.pop(uid, ([], []))))

        async def _agent_loop_postprocess(self, output: Any, validate: Any, **kwargs: Any) -> None:
            outputs = output if isinstance(output, list) else [output]
            running = self._lengthsched_running.get(kwargs.get("uid"))
            if outputs and running is not None:
                running[0].append(generated_tokens(outputs[-1]))
            out = await super()._agent_loop_postprocess(output, validate, **kwargs)
            if outputs and running is not None:  # verl's _compute_score set it on the last output (or left None)
                running[1].append(_finite(getattr(outputs[-1], "reward_score", None)))
            return out

        async def _run_agent_loop(self, sampling_params: dict, trajectory: dict, **kwargs: Any) -> Any:
            priorities = kwargs.pop(PRIORITIES, None)  # the stealing manager's: one per session
            session = kwargs.get("session_id")
            if priorities is not None and isinstance(session, (int, np.integer)) and 0 <= session < len(priorities):
                kwargs["priority"] = int(priorities[session])
            return await super()._run_agent_loop(sampling_params, trajectory, **kwargs)  # SessionPriorities next

        def lengthsched_take(self) -> list[tuple[Hashable, list[int], list[float | None]]]:
            """The prompts finished since the last call: ``(uid, tokens per session, reward per session)``."""
            done, self._lengthsched_done = self._lengthsched_done, []
            return done

    LengthschedAgentLoopWorkerTQ.__module__ = __name__
    return LengthschedAgentLoopWorkerTQ


#: Training steps after which a prompt dispatched and never heard finish is forgotten (``lengthsched.running_steps``;
#: null: never): verl's asynchronous modes let a prompt run a step or two past its own, far less than this.
RUNNING_STEPS = 8


@dataclass
class _Dispatched:
    """A prompt the manager dispatched and has not heard finish: its prompt key, the step it was dispatched
    in (None: unknown), whether it is a validation prompt, its predicted tokens on each replica, its rows'
    priorities in the plan, and its key in the online sGPO budget (None: not kept there)."""

    key: str
    step: int | None
    validate: bool
    work: np.ndarray
    priorities: tuple[int, ...] = ()  # its rows' priorities, lowest first
    sgpo_key: str | None = None


def _lowest(plan: Any, prompt_rows: list[list[int]], base: int) -> list[int]:
    """Each prompt's priority: the lowest of its rows' (``prompt_rows[k]``: row indices of ``plan``, lowest priority
    first), ``base`` for a prompt that runs nothing."""
    return [int(plan.priority[rows[0]]) if rows else base for rows in prompt_rows]


def filter_groups(config: Any) -> bool:
    """Whether a verl trainer config turns DAPO's group filter on (``algorithm.filter_groups.enable``)."""
    return bool(_setting(config, "algorithm.filter_groups.enable"))


#: The options of the planning manager's online sGPO (``lengthsched.sgpo``): :class:`~lengthsched.sgpo.BudgetConfig`'s
#: rules (``g_min``, ``g_max``, ``rule``, ``target``, ``drop_above``, ``unsolved_fraction``, ``seed``), ``memory``
#: (groups remembered per prompt), ``keep_steps`` (a resume's reach in steps; default :func:`sgpo_keep_steps`),
#: ``solved_reward``, ``state_path``, ``key`` (:data:`SGPO_KEYS`) and ``enable``.
SGPO_OPTIONS = ("enable", "g_min", "g_max", "rule", "target", "drop_above", "unsolved_fraction", "seed", "memory",
                "keep_steps", "solved_reward", "state_path", "key")
#: The online sGPO's rule unless ``lengthsched.sgpo.rule`` names another: the smallest group whose rewards differ
#: with probability ``target`` (0.9). sGPO's ``pow2`` (about 1/p) found fewer informative groups per rollout hour
#: than a fixed G = 16 where a step keeps its prompt count (0.95-1.05x), ``informative`` 1.06-1.13x
#: (``simulate.sgpo_training``; docs/benchmarks.md, "sGPO over a training run").
SGPO_RULE = "informative"
#: What a prompt is known by across epochs: its text (:func:`~lengthsched.integrations.verl.prompt_key`; the default),
#: or the data set's ``index`` column (verl's ``RLHFDataset`` copies ``extra_info.index`` there, and 0 where a row has
#: none): for data whose prompt text changes between epochs (a random template), with unique indices.
SGPO_KEYS = ("prompt", "index")


@dataclass
class OnlineSGPO:
    """The planning manager's online sGPO (:func:`online_sgpo`): the budget and how rewards and prompts reach it."""

    budget: OnlineBudget
    solved_reward: float = SOLVED_REWARD
    state_path: str | None = None
    key: str = "prompt"

    def status(self) -> dict[str, Any]:
        """What it knows: prompts and groups observed, the share of completions solved, and the last training
        batch's decisions by reason."""
        budget = self.budget
        return {"prompts": len(budget), "groups": budget.groups, "samples": budget.samples,
                "solved_share": budget.solved / budget.samples if budget.samples else None,
                "last_batch": dict(budget.reasons)}


def sgpo_keep_steps(config: Any) -> int:
    """How many of its latest steps the online sGPO budget keeps beyond its memory, so that a run resumed from its
    latest checkpoint decides as it did then (:class:`~lengthsched.sgpo.OnlineBudget`, ``keep_steps``):
    ``lengthsched.sgpo.keep_steps`` where set, else ``trainer.save_freq`` + 1 (verl resumes, by default, from the
    latest ``global_step_*`` checkpoint, saved every ``save_freq`` steps; the budget file lags its steps by one
    collection), 0 where verl saves no checkpoints (``save_freq`` <= 0 or unset)."""
    return reach_steps((sgpo_options(config) or {}).get("keep_steps"), _setting(config, "trainer.save_freq"),
                       "lengthsched.sgpo.keep_steps")


def online_sgpo(config: Any) -> OnlineSGPO | None:
    """The online sGPO of a verl trainer config's ``lengthsched.sgpo`` section (None without one, or with
    ``enable: false``): each training prompt's ``__rollout_n__`` from its own latest groups' rewards
    (:class:`~lengthsched.sgpo.OnlineBudget`; the planning manager's docstring says how). Errors name the setting."""
    options = sgpo_options(config, SGPO_OPTIONS)
    if options is None:
        return None
    key = options.get("key", "prompt")
    if key not in SGPO_KEYS:
        raise InvalidArgument("lengthsched.sgpo.key", key, " or ".join(map(repr, SGPO_KEYS)))
    solved = check_solved_reward("lengthsched.sgpo.solved_reward", options.get("solved_reward", SOLVED_REWARD))
    budget, path = online_budget_from_options(options, lambda name: f"lengthsched.sgpo.{name}", rule=SGPO_RULE,
                                              why_two="verl's GRPO gives a group of one its raw score as advantage "
                                                      "(compute_grpo_outcome_advantage: mean 0, std 1)",
                                              save_every=_setting(config, "trainer.save_freq"))
    return OnlineSGPO(budget, solved, path, key)


def _index_key(value: Any) -> str | None:
    """A row's ``index`` as a key: an integral float as its integer (3.0 is "3"), None for a missing one."""
    if value is None:
        return None
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        value = int(value)
    return str(value)


def _rows(batch: Any, name: str) -> list[Any] | None:
    """Column ``name`` of a verl TensorDict (or a mapping of columns) as a list, None where it is missing."""
    if name not in batch.keys():
        return None
    value = batch[name]
    if hasattr(value, "tolist"):
        value = value.tolist()
    return [v.item() if isinstance(v, np.generic) else v for v in value]


def _scalar(batch: Any, name: str, default: Any) -> Any:
    """The batch-wide value ``name`` (verl's ``NonTensorData``: ``global_steps``, ``validate``)."""
    if name not in batch.keys():
        return default
    value = batch[name]
    return getattr(value, "data", value)


def make_tq_agent_loop_manager_class(base: type, worker_class: Any = None, *,
                                     get: Callable[[Any], Any] | None = None,
                                     assign: Callable[[Any, str, list], None] | None = None) -> type:
    """``LengthschedAgentLoopManagerTQ``: ``base`` (verl's ``AgentLoopManagerTQ``) whose ``generate_sequences``
    plans each batch of prompts (the module docstring says how) before verl dispatches it.

    ``worker_class``: the agent-loop worker actor class to run (verl: ``ray.remote`` of
    :func:`make_tq_worker_class`); None keeps the base's. ``get``: resolves what a Ray actor method's
    ``.remote()`` returns (verl: ``ray.get``; the base manager is synchronous). ``assign``: writes a per-row
    column into the batch (verl: ``tensordict_utils.assign_non_tensor_stack``; default item assignment).
    The number of replicas comes from ``lengthsched.replicas`` or else the router.
    """
    resolve = get if get is not None else (lambda ref: ref)
    put = assign if assign is not None else (lambda batch, name, values: batch.__setitem__(name, values))

    class LengthschedAgentLoopManagerTQ(ManagerPlanning, base):  # type: ignore[misc, valid-type]
        """verl's AgentLoopManagerTQ with a lengthsched plan per batch (lengthsched.integrations.verl_v1)."""

        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            if worker_class is not None:
                self.agent_loop_workers_class = worker_class
            if filter_groups(self.config):  # longest first lost under DAPO's filter (module docstring)
                self.lengthsched_default_order = "batch"
            #: Prompts dispatched and not yet heard finish, by uid.
            self.lengthsched_running: dict[Hashable, _Dispatched] = {}
            self._lengthsched_base = 0  # the next batch's lowest priority
            self._lengthsched_warned: set[str] = set()
            #: sGPO's group sizes from the trainer's rewards (``lengthsched.sgpo``), None without.
            self.lengthsched_sgpo = online_sgpo(self.config)
            self._lengthsched_sgpo_unsaved = False  # the budget changed since it was read or last written
            self._lengthsched_sgpo_started = False  # the first training batch forgets what later steps recorded

        def _lengthsched_warn(self, what: str, message: str, *args: Any) -> None:
            if what not in self._lengthsched_warned:
                self._lengthsched_warned.add(what)
                log.warning(message, *args)

        def lengthsched_replicas(self) -> int:
            """Replicas to plan for: ``lengthsched.replicas`` or the router's server count."""
            known = self.lengthsched_known_replicas()
            if known is not None:
                return known
            return max(1, len(resolve(self.lengthsched_router().get_all_servers.remote())))

        def lengthsched_collect(self) -> int:
            """Hear which prompts finished since the last call (from every worker), feed the training prompts'
            lengths to the planner under the step each was dispatched in, and stop counting their work on
            the replicas. Returns the prompts heard finish."""
            finished: list[tuple[Hashable, list[int], list[float | None]]] = []
            for worker in getattr(self, "agent_loop_workers", None) or []:
                if not hasattr(worker, "lengthsched_take"):
                    self._lengthsched_warn("worker", "the agent-loop workers do not report lengths (%s): the planner "
                                                     "learns nothing and counts no running work",
                                           type(worker).__name__)
                    continue
                finished.extend(resolve(worker.lengthsched_take.remote()))
            by_step: dict[int | None, tuple[list[str], list[int]]] = {}
            gone: list[_Dispatched] = []
            for uid, lengths, scores in finished:
                prompt = self.lengthsched_running.pop(uid, None)
                if prompt is not None:
                    gone.append(prompt)
                if prompt is not None and prompt.sgpo_key is not None:
                    self.lengthsched_sgpo_observe(prompt.sgpo_key, scores, prompt.step, str(uid))
                if prompt is None or prompt.validate or not lengths:
                    continue
                keys, seen = by_step.setdefault(prompt.step, ([], []))
                keys.extend([prompt.key] * len(lengths))
                seen.extend(int(n) for n in lengths)
            planner = self.lengthsched_planner()
            for step in sorted(by_step, key=lambda s: -1 if s is None else s):
                planner.observe(*by_step[step], step=step)
            self.lengthsched_forget(gone)
            sgpo = self.lengthsched_sgpo
            if sgpo is not None and sgpo.state_path is not None and self._lengthsched_sgpo_unsaved:
                write_online_budget(sgpo.state_path, sgpo.budget)
                self._lengthsched_sgpo_unsaved = False
            return len(finished)

        def lengthsched_sgpo_observe(self, key: str, scores: list[float | None], step: int | None = None,
                                     uid: str | None = None) -> None:
            """Record a training prompt's group in the online sGPO budget: the rewards verl's agent loop gave its
            sessions (a failed session has none; a session scored None, as where a colocated reward model scores
            after the rollout, teaches nothing, and a warning says so once), tagged with its ``uid`` (verl
            re-issues a prompt in flight at a checkpoint under its uid: the first batch after a resume forgets
            it)."""
            known = [s for s in scores if s is not None]
            if len(known) < len(scores):
                self._lengthsched_warn("sgpo scores", "lengthsched.sgpo: sessions came back without a finite "
                                                      "reward_score (verl scores after the rollout with a colocated "
                                                      "reward model: reward.reward_model.enable without "
                                                      "enable_resource_pool; or the score was not one finite "
                                                      "number); their prompts' group sizes learn nothing from them")
            if known:
                self.lengthsched_sgpo.budget.observe_rewards(key, known, self.lengthsched_sgpo.solved_reward, step,
                                                             tag=uid)
                self._lengthsched_sgpo_unsaved = True

        def lengthsched_sgpo_sizes(self, prompts: Any, uids: list,
                                   counts: list[int]) -> tuple[list[int], list[str | None]]:
            """Give each training prompt its online sGPO group size in the ``__rollout_n__`` column (``counts``: what
            it would run otherwise: a prompt never seen runs that many; one with 0 runs none and is not kept);
            returns the sizes and each prompt's key in the budget (None for one that runs none)."""
            sgpo = self.lengthsched_sgpo
            raw = _rows(prompts, "raw_prompt")
            if raw is None:
                self._lengthsched_warn("sgpo text", "lengthsched.sgpo: the batch has no 'raw_prompt' column: prompts "
                                                    "are known by their uid, new every step, so nothing is learnt")
            keys = [prompt_key(p) for p in raw] if raw is not None else [str(u) for u in uids]
            if sgpo.key == "index":
                index = _rows(prompts, "index")
                index = [None] * len(uids) if index is None else [_index_key(i) for i in index]
                seen = Counter(index)
                shared = [i is None or seen[i] > 1 for i in index]
                if any(shared):  # those rows by their text (verl gives index 0 to rows without extra_info.index)
                    self._lengthsched_warn("sgpo key", "lengthsched.sgpo.key=index: %d rows of a batch have no "
                                                       "'index' or share one (verl's RLHFDataset gives 0 to rows "
                                                       "without extra_info.index); they are known by their text",
                                           sum(shared))
                keys = [k if s_ else i for k, i, s_ in zip(keys, index, shared)]
            run = [k for k, n in enumerate(counts) if n]
            sizes = list(counts)
            for k, g in zip(run, sgpo.budget.group_sizes([keys[k] for k in run], [counts[k] for k in run])):
                sizes[k] = g
            self.lengthsched_column(prompts, ROLLOUT_N, sizes)
            log.info("lengthsched.sgpo: %d prompts, %d completions (%s)", len(run), sum(sizes),
                     ", ".join(f"{n} {reason}" for reason, n in sorted(sgpo.budget.reasons.items())))
            return sizes, [keys[k] if n else None for k, n in enumerate(counts)]

        def lengthsched_sgpo_status(self) -> dict[str, Any] | None:
            """What the online sGPO knows (:meth:`OnlineSGPO.status`); None without one."""
            return None if self.lengthsched_sgpo is None else self.lengthsched_sgpo.status()

        def lengthsched_expire(self, step: int | None) -> int:
            """Forget the prompts dispatched more than ``lengthsched.running_steps`` (default
            :data:`RUNNING_STEPS`) training steps before ``step`` and never heard finish: a worker that died (or a
            session that never settled) would keep their predicted work counted on the replicas for the rest of
            the run. They count as finished for :meth:`lengthsched_forget` (the stealing driver lets their rows
            go); their lengths, should they come, are not learnt. A warning names them. Returns how many."""
            limit = _options(self.config).get("running_steps", RUNNING_STEPS)
            limit = None if limit is None else check_int("lengthsched.running_steps", limit, minimum=1)
            if step is None or limit is None:
                return 0
            stale = [uid for uid, prompt in self.lengthsched_running.items()
                     if prompt.step is not None and step - prompt.step > limit]
            if stale:
                gone = [self.lengthsched_running.pop(uid) for uid in stale]
                log.warning("lengthsched: %d prompts dispatched more than %d steps before step %d were never heard "
                            "finish (a worker that died?); their work no longer counts on the replicas", len(stale),
                            limit, step)
                self.lengthsched_forget(gone)
            return len(stale)

        def lengthsched_forget(self, prompts: list[_Dispatched]) -> None:
            """Hook: ``prompts`` were heard finish (every session settled). Nothing to do here."""

        def lengthsched_loads(self, replicas: int) -> np.ndarray:
            """Predicted tokens of the prompts still running, per replica."""
            loads = np.zeros(replicas, dtype=np.int64)
            for prompt in self.lengthsched_running.values():
                if len(prompt.work) == replicas:
                    loads += prompt.work
            return loads

        def lengthsched_plan(self, prompts: Any) -> Any:
            """Plan a batch of prompts and write each prompt's ``priority``; returns the plan (None for an empty
            batch). The router is told where each priority's requests go."""
            uids = _rows(prompts, "uid")
            if not uids:
                return None
            if len(set(uids)) != len(uids):
                raise InvalidArgument("uid", f"{len(uids) - len(set(uids))} repeated", "one row per prompt, "
                                                                                       "each with its own uid")
            validate = bool(_scalar(prompts, "validate", False))
            step = _scalar(prompts, "global_steps", None)
            step = None if step is None else check_int("global_steps", step, minimum=0)
            rollout = self.config.actor_rollout_ref.rollout
            default_n = rollout.val_kwargs.n if validate else rollout.n
            counts = _rows(prompts, ROLLOUT_N) or [default_n] * len(uids)
            counts = [check_int(ROLLOUT_N, n, minimum=0) for n in counts]
            sgpo_keys: list[str | None] = [None] * len(uids)
            if self.lengthsched_sgpo is not None and not validate:
                if not self._lengthsched_sgpo_started and step is not None:
                    self._lengthsched_sgpo_started = True
                    budget = self.lengthsched_sgpo.budget
                    if not budget.reaches(max(0, step - 1)):
                        log.warning("lengthsched.sgpo: resumed at step %d, further back than the budget keeps (groups "
                                    "up to step %d were let go; lengthsched.sgpo.keep_steps sets the reach): some "
                                    "prompts are sized from fewer of their groups", step, budget.pruned_through)
                    gone = budget.forget_after(max(0, step - 1))
                    # verl's async trainers re-issue the prompts in flight at the checkpoint under their uids:
                    # a group of one of them that finished after the checkpoint is forgotten too
                    gone += budget.forget_tags(str(u) for u in uids)
                    self._lengthsched_sgpo_unsaved |= gone > 0
                    if gone:  # a run resumed from its checkpoint at step - 1 (or a fresh run at step 1)
                        log.info("lengthsched.sgpo: the first batch is for step %d; %d groups recorded for later "
                                 "steps were forgotten (%s)", step, gone, self.lengthsched_sgpo.state_path)
                counts, sgpo_keys = self.lengthsched_sgpo_sizes(prompts, uids, counts)
            if not sum(counts):
                return None
            raw = _rows(prompts, "raw_prompt")
            expanded: dict[str, Any] = {"uid": np.asarray([u for u, n in zip(uids, counts) for _ in range(n)],
                                                          dtype=object)}
            if raw is not None:
                rows = np.empty(sum(counts), dtype=object)
                rows[:] = [p for p, n in zip(raw, counts) for _ in range(n)]
                expanded["raw_prompt"] = rows
            replicas = self.lengthsched_replicas()
            base = -(-self._lengthsched_base // replicas) * replicas
            planner = self.lengthsched_planner()
            self.lengthsched_expire(step)
            plan, keys = planner.plan(expanded, replicas, loads=self.lengthsched_loads(replicas), base=base)
            self._lengthsched_base = max(plan.priority) + 1
            group_rows: dict[int, list[int]] = {}
            for row, group in enumerate(plan.group):
                group_rows.setdefault(group, []).append(row)
            group_of = {key: g for g, key in enumerate(plan.group_keys)}
            prompt_rows: list[list[int]] = []  # each prompt's rows in the plan, lowest priority first
            for uid, n, sgpo_key in zip(uids, counts, sgpo_keys):
                rows = sorted(group_rows[group_of[uid]], key=lambda i: plan.priority[i]) if n else []
                prompt_rows.append(rows)
                if rows:
                    work = np.zeros(replicas, dtype=np.int64)  # (spread: as the plan spread it; the router balances)
                    np.add.at(work, [plan.replica[i] for i in rows], [plan.predicted[i] for i in rows])
                    self.lengthsched_running[uid] = _Dispatched(keys[rows[0]], step, validate, work,
                                                                tuple(int(plan.priority[i]) for i in rows), sgpo_key)
            self.lengthsched_publish(prompts, plan, prompt_rows, base)
            return plan

        def lengthsched_publish(self, prompts: Any, plan: Any, prompt_rows: list[list[int]], base: int) -> None:
            """Write each prompt's ``priority`` (the lowest of its rows', ``prompt_rows[k]``: row indices of
            ``plan``; ``base`` for a prompt that runs nothing) and tell the router where that priority's requests
            go."""
            # spread: to the fewest in flight as each is sent, as verl's router does (refills come while the
            # replicas are unevenly loaded); other placements: the plan's replicas
            routes = {int(plan.priority[rows[0]]): [None if plan.placement == "spread" else int(plan.replica[i])
                                                    for i in rows] for rows in prompt_rows if rows}
            self.lengthsched_column(prompts, "priority", _lowest(plan, prompt_rows, base))
            router = self.lengthsched_router()
            if router is not None and hasattr(router, "expect"):
                resolve(router.expect.remote(routes))
            elif plan.replicas > 1:
                self._lengthsched_warn("router", "the router is not lengthsched's PlannedLoadBalancer "
                                                 "(rollout.router_config_path): the plan orders each engine's queue "
                                                 "but does not place the completions")

        def lengthsched_column(self, prompts: Any, name: str, values: list) -> None:
            """Write a per-row column into a batch of prompts (verl: ``assign_non_tensor_stack``)."""
            put(prompts, name, values)

        def generate_sequences(self, prompts: Any) -> None:
            self.lengthsched_collect()
            self.lengthsched_plan(prompts)
            return super().generate_sequences(prompts)

    LengthschedAgentLoopManagerTQ.__module__ = __name__
    return LengthschedAgentLoopManagerTQ


def make_tq_stealing_manager_class(base: type, client_class: type) -> type:
    """``LengthschedStealingAgentLoopManagerTQ``: ``base`` (the planning manager of
    :func:`make_tq_agent_loop_manager_class`, running ``LengthschedAgentLoopWorkerTQ``) with work stealing between
    the vLLM replicas, as :mod:`~lengthsched.integrations.verl_stealing`'s manager does in the legacy trainer:

    - swaps the client verl hands it for ``client_class`` (the stealing client,
      :func:`~lengthsched.integrations.verl_stealing.make_stealing_client_class` of verl's
      ``FullyAsyncLLMServerClient``) on the same router, before its workers are made;
    - plans with ``steal``'s placement (``ways``, each replica's pool ``lengthsched.steal.pool_tokens``) and batch
      order unless the config names others;
    - gives **every completion its own priority**: the plan's row priorities go into a :data:`PRIORITIES` column
      (one list per prompt), which the worker applies session by session, so each request keeps its row's
      replica (the priority's residue, which :class:`~lengthsched.integrations.verl.PlannedLoadBalancer` routes by)
      and its place in its engine's queue, and the driver knows each request by its row (``priority`` still holds
      the prompt's lowest, for a worker that does not read the column);
    - runs **one** :class:`~lengthsched.integrations.verl_stealing.StealDriver` across the trainer's dispatches
      (verl's v1 ``generate_sequences`` returns before the sessions end, and a refill or the next step's prompts
      arrive while earlier ones still run), on an event loop of its own
      (:class:`~lengthsched.integrations.verl_stealing.LoopThread`): each dispatch submits its rows (replica,
      predicted length, prompt tokens, the prompt's uid as group) before verl sends them; a row leaves the driver
      when its server reports it complete, or when its prompt is heard finish (a session that failed before it
      reached an engine); a new driver takes over when the router's servers change
      (:func:`~lengthsched.integrations.verl_stealing.driver_for`).

    verl's v1 trainer builds its vLLM servers before it loads this manager, so the server class with snapshots must
    be registered earlier, in the trainer's Ray actor: Ray's ``worker_process_setup_hook`` =
    :data:`~lengthsched.integrations.verl_stealing.SETUP_HOOK` (``++ray_kwargs.ray_init.runtime_env
    .worker_process_setup_hook=...``); without it the first dispatch stops with an error that says so. Options: the
    ``lengthsched.steal`` section (:func:`~lengthsched.integrations.verl_stealing.steal_options`). What it did so
    far: :meth:`lengthsched_status`; :meth:`lengthsched_close` stops the driver and its loop.
    """

    class LengthschedStealingAgentLoopManagerTQ(RunDriver, base):  # type: ignore[misc, valid-type]
        """verl's AgentLoopManagerTQ with a plan per batch and work stealing (lengthsched.integrations.verl_v1)."""

        lengthsched_default_placement = "ways"  # steal's placement unless the config names another
        lengthsched_default_order = "batch"  # steal's order: each replica's rows as placed

        def __init__(self, *args: Any, **kwargs: Any):
            args = list(args)
            config = kwargs["config"] if "config" in kwargs else args[0]
            self.lengthsched_steal = steal_options(config)
            engine = _setting(config, "actor_rollout_ref.rollout.name")
            if engine not in (None, "vllm"):
                raise InvalidArgument("actor_rollout_ref.rollout.name", engine,
                                      "'vllm': lengthsched's stealing reads vLLM servers' snapshots")
            if "llm_client" in kwargs:
                kwargs["llm_client"] = stealing_client(kwargs["llm_client"], client_class)
            else:
                args[1] = stealing_client(args[1], client_class)
            super().__init__(*args, **kwargs)
            self.lengthsched_loop: LoopThread | None = None
            self._lengthsched_keep_driver()

        def lengthsched_on_loop(self, coro: Any) -> Any:
            """Run ``coro`` on the driver's event loop (started on first use) and wait for its result."""
            if self.lengthsched_loop is None:
                self.lengthsched_loop = LoopThread()
            return self.lengthsched_loop.run(coro)

        def lengthsched_publish(self, prompts: Any, plan: Any, prompt_rows: list[list[int]], base: int) -> None:
            self.lengthsched_column(prompts, "priority", _lowest(plan, prompt_rows, base))
            self.lengthsched_column(prompts, PRIORITIES, [[int(plan.priority[i]) for i in r] for r in prompt_rows])
            columns = {name: _rows(prompts, name) for name in ("raw_prompt_ids", "raw_prompt")}
            tokens = batch_prompt_tokens({k: v for k, v in columns.items() if v is not None}, len(prompt_rows))
            uids = _rows(prompts, "uid")
            rows = [(int(plan.priority[i]), float(plan.predicted[i]), tokens[k], uids[k])
                    for k, r in enumerate(prompt_rows) for i in r]
            self.lengthsched_on_loop(self._lengthsched_submit(rows))

        async def _lengthsched_submit(self, rows: list[tuple[int, float, int, Hashable]]) -> None:
            await self._lengthsched_current_driver(self.llm_client._load_balancer, self.lengthsched_steal)
            driver = self.lengthsched_driver
            replicas = driver.coordinator.replicas
            for priority, predicted, tokens, group in rows:  # where the router sends it: the priority's residue
                driver.submit(priority, priority % replicas, predicted, prompt_tokens=tokens, group=group)

        def lengthsched_forget(self, prompts: list[_Dispatched]) -> None:
            priorities = [p for prompt in prompts for p in prompt.priorities]
            if priorities and self.lengthsched_driver is not None:
                self.lengthsched_on_loop(self._lengthsched_finish(priorities))

        async def _lengthsched_finish(self, priorities: list[int]) -> None:
            for priority in priorities:  # rows their servers reported complete are gone already
                self.lengthsched_driver.finish(priority)

        def generate_sequences(self, prompts: Any) -> None:
            out = super().generate_sequences(prompts)
            if self.lengthsched_driver is not None:
                log.info("lengthsched: %s", self.lengthsched_status())
            return out

        def lengthsched_status(self) -> dict[str, Any]:
            """What the stealing did so far (:meth:`~lengthsched.integrations.verl_stealing.RunDriver
            .lengthsched_driver_status`)."""
            return self.lengthsched_driver_status()

        def lengthsched_close(self) -> None:
            """Stop the driver and its event loop (idempotent); a later dispatch starts them again."""
            loop, self.lengthsched_loop = self.lengthsched_loop, None
            driver, self.lengthsched_driver = self.lengthsched_driver, None
            self.lengthsched_servers = []
            if loop is not None:
                if driver is not None:
                    loop.run(driver.stop())
                loop.close()

    LengthschedStealingAgentLoopManagerTQ.__module__ = __name__
    return LengthschedStealingAgentLoopManagerTQ


_MADE: dict[str, type] = {}


#: verl 0.9.1's per-prompt group size: ``AgentLoopWorkerTQ._run_prompt`` pops it from each prompt's row (else
#: ``rollout.n``) and runs that many sessions ("user can dynamically adjust n for each sample here, e.g. according to
#: task difficulty"); GRPO's advantages group by the prompt's ``uid`` (``compute_grpo_outcome_advantage``), and the
#: trainer pads a batch to its mini-batch multiple (``upsample_batch_to_divisible_size``), so groups of any size train.
ROLLOUT_N = "__rollout_n__"
#: :func:`adaptive_rollout_rows`' orders: the data set's, or the plan's curriculum (easiest phase first).
ROLLOUT_N_ORDERS = ("data", "curriculum")


def adaptive_rollout_rows(ids: Sequence[Any], plan: Any, *, default_n: int,
                          order: str = "data") -> tuple[list[int], list[int]]:
    """sGPO's adaptive group sizes for verl's v1 trainer: which rows of a verl data set to keep, in what order, and
    each kept row's :data:`ROLLOUT_N`. ``ids``: each row's prompt id (matched as text with the profile's ids);
    ``plan``: a :class:`lengthsched.sgpo.BudgetPlan` (``lengthsched budget``). A profiled row the plan keeps gets its
    group size; one it drops (trivial, or unsolved and not sampled) is left out; a row the profile does not name
    keeps ``default_n`` (verl's ``rollout.n``). A group of one is refused (a plan with ``g_min`` 1, or ``default_n``
    1): verl's GRPO would train on its raw score. ``order``: ``"data"`` (the rows' own order) or ``"curriculum"`` (the
    plan's phases, easiest first, each in the plan's order, then the rows it does not name; verl keeps it with
    ``data.shuffle=False``). Returns (row indices, group sizes)."""
    from ..sgpo import BudgetPlan

    if not isinstance(plan, BudgetPlan):
        raise InvalidArgument("plan", type(plan).__name__, "a lengthsched.sgpo.BudgetPlan")
    default_n = check_int("default_n", default_n, minimum=1)
    if order not in ROLLOUT_N_ORDERS:
        raise InvalidArgument("order", order, " or ".join(map(repr, ROLLOUT_N_ORDERS)))
    decided = {p.id: p for p in plan.prompts}
    keys = [str(i) for i in ids]
    if decided and keys and not any(k in decided for k in keys):
        raise InvalidArgument("ids", f"{len(keys)} rows ({keys[0]!r}, ...)",
                              f"ids that name the profile's prompts ({next(iter(decided))!r}, ...)")
    rows = [i for i, k in enumerate(keys) if k not in decided or decided[k].kept]
    if order == "curriculum":
        rank = {p.id: (p.phase, j) for j, p in enumerate(q for i in range(plan.config.phases) for q in plan.phase(i))}
        rows.sort(key=lambda i: rank.get(keys[i], (plan.config.phases, i)))
    sizes = [decided[keys[i]].group_size if keys[i] in decided else default_n for i in rows]
    if sizes and min(sizes) < 2:
        one = next(keys[i] for i, n in zip(rows, sizes) if n < 2)
        raise InvalidArgument("g_min" if keys and one in decided else "default_n", 1,
                              f"group sizes >= 2 (prompt {one!r} gets 1): verl's GRPO gives a group of one its raw "
                              f"score as advantage (compute_grpo_outcome_advantage: mean 0, std 1)")
    return rows, sizes


def write_adaptive_rollout_data(source: str | os.PathLike, output: str | os.PathLike, plan: Any, *,
                                id_key: str = "extra_info.index", default_n: int, order: str = "data") -> dict:
    """:func:`adaptive_rollout_rows` on a verl data set: read the parquet file ``source`` (verl's ``data.train_files``),
    keep and order its rows by ``plan``, give each its :data:`ROLLOUT_N` and write them to ``output`` (atomically;
    every other column as it was). ``id_key``: the column holding each row's prompt id, a dotted path into struct
    columns (verl's preprocessing scripts put it in ``extra_info.index``). Needs pyarrow (``datasets``, which verl
    reads its files with, brings it). Returns counts: ``rows`` read, ``kept``, ``dropped`` (by the plan),
    ``unprofiled`` (kept at ``default_n``) and ``profiled_missing`` (profiled prompts no row names)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - pyarrow comes with datasets (the train extra) and verl
        raise InvalidArgument("source", str(source), "pyarrow installed to read and write parquet (pip install "
                                                     "'lengthsched[train]' or verl)") from None
    try:
        table = pq.read_table(source)
    except (OSError, pa.ArrowException) as exc:
        raise InvalidArgument("source", str(source), f"a readable parquet file ({exc.__class__.__name__})") from None
    head, *path = id_key.split(".")
    if head not in table.column_names:
        raise InvalidArgument("id_key", id_key, f"a column of {source} ({', '.join(table.column_names)})")
    ids = []
    for value in table.column(head).to_pylist():
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        ids.append(value)
    if any(v is None for v in ids):
        bad = next(i for i, v in enumerate(ids) if v is None)
        raise InvalidArgument("id_key", id_key, f"a value in every row (row {bad} of {source} has none)")
    rows, sizes = adaptive_rollout_rows(ids, plan, default_n=default_n, order=order)
    table = table.take(pa.array(rows, type=pa.int64()))
    if ROLLOUT_N in table.column_names:
        table = table.drop_columns([ROLLOUT_N])
    table = table.append_column(ROLLOUT_N, pa.array(sizes, type=pa.int64()))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    atomic_write_bytes(output, sink.getvalue().to_pybytes())
    decided = {p.id: p for p in plan.prompts}
    named = {str(i) for i in ids}
    return {"rows": len(ids), "kept": len(rows), "dropped": sum(1 for i in ids if str(i) in decided
                                                                  and not decided[str(i)].kept),
            "unprofiled": sum(1 for i in ids if str(i) not in decided),
            "profiled_missing": sum(1 for k in decided if k not in named)}


def __getattr__(name: str) -> Any:
    """``LengthschedAgentLoopManagerTQ``, ``LengthschedAgentLoopWorkerTQ`` and
    ``LengthschedStealingAgentLoopManagerTQ`` are made from verl's classes on first access (verl loads the manager
    by name: ``agent.agent_loop_manager_class``), so importing this module needs no verl."""
    if name not in ("LengthschedAgentLoopManagerTQ", "LengthschedAgentLoopWorkerTQ",
                    "LengthschedStealingAgentLoopManagerTQ"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _MADE:
        try:
            v1 = importlib.import_module("verl.trainer.ppo.v1.agent_loop_tq")
            tensordict_utils = importlib.import_module("verl.utils.tensordict_utils")
            ray = importlib.import_module("ray")
        except ImportError as exc:
            raise ImportError(f"verl is not installed: pip install 'lengthsched[verl]' (verl=={VERL_VERSION}): "
                              f"{exc}") from None
        if "LengthschedAgentLoopManagerTQ" not in _MADE:
            worker = make_tq_worker_class(v1.AgentLoopWorkerTQ.__ray_actor_class__)
            _MADE["LengthschedAgentLoopWorkerTQ"] = worker
            _MADE["LengthschedAgentLoopManagerTQ"] = make_tq_agent_loop_manager_class(
                v1.AgentLoopManagerTQ, ray.remote(worker), get=lambda ref: ray.get(ref),
                assign=tensordict_utils.assign_non_tensor_stack)
        if name == "LengthschedStealingAgentLoopManagerTQ":
            from . import verl_stealing

            _MADE[name] = make_tq_stealing_manager_class(_MADE["LengthschedAgentLoopManagerTQ"],
                                                         verl_stealing.StealingLLMServerClient)
    return _MADE[name]
