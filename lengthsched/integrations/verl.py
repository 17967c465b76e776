"""verl: plan every rollout batch, route each group to its planned replica, forward priorities.

Modelled on verl 0.9.1's own code (the wheel's sources; tested against its real classes where verl
installs, see tests/test_verl.py and docs/howto-verl.md; not run on a GPU cluster). Files are
under ``verl/``:

- ``trainer/ppo/ray_trainer.py`` gives every prompt a ``uid``, repeats it ``rollout.n`` times in
  a row (``repeat(interleave=True)``) and calls ``async_rollout_manager.generate_sequences`` of the
  class named by ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` (default
  ``experimental/agent_loop/agent_loop.py``, ``AgentLoopManager``).
- ``AgentLoopManager.generate_sequences`` fills ``non_tensor_batch["priority"]`` with
  ``arange(len(batch))`` only when the column is missing, then splits the batch over its agent-loop
  workers; each row's ``priority`` reaches ``SingleTurnAgentLoop.run``, which passes it to
  ``LLMServerClient.generate(..., priority=...)`` (``workers/rollout/llm_server.py``), and
  ``ToolAgentLoop.run``, which passes none to ``generate`` on any turn (``LengthschedAgentLoopWorker``
  gives each of them its session's: :class:`SessionPriorityClient`).
- ``LLMServerClient.generate`` passes its keyword arguments, ``priority`` included, to
  ``_acquire_server``, which hands the fields the router declares in ``require_acquire_fields``
  to ``acquire_server`` of the router actor; then it forwards ``priority`` to the vLLM server
  (``workers/rollout/vllm_rollout/vllm_async_server.py``: ``AsyncLLM.generate(..., priority=)``)
  when it is non-zero and the rollout is vLLM; SGLang servers never get it.
- The default router (``workers/rollout/router.py``, ``GlobalRequestLoadBalancer``) sends each
  new request to a server with the fewest requests in flight (random among ties): one group's
  samples spread over the replicas. ``rollout.router_config_path`` names a YAML whose
  ``router_class`` replaces it (``_create_plugin_extension``: ``ray.remote(cls).remote(servers,
  yaml_config)``).
- vLLM runs ``rollout.scheduling_policy`` (default ``"fcfs"``: priorities ignored),
  ``max_num_seqs``, ``gpu_memory_utilization``, ``enable_prefix_caching``, ``max_model_len``, and
  ``engine_kwargs.vllm`` last, over all of them (``vllm_async_server.py``, ``launch_server``).

This module supplies:

- :class:`RolloutPlanner`: per batch, groups rows by ``uid``, predicts each group's length
  (default :class:`~lengthsched.OnlineLengthPredictor`, fed with the finished lengths of earlier
  steps), plans with :func:`~lengthsched.integrations.plan_rollout` (by default each group's samples
  spread over the replicas as verl's router spreads them, ``lengthsched.placement=groups`` for whole
  groups placed by predicted work, ``ways``, ``classes`` and ``auto`` as :class:`RolloutPlanner` says;
  longest predicted first on each, batch order for ``ways``) and writes the plan's priorities into
  ``non_tensor_batch["priority"]``;
- ``LengthschedAgentLoopManager`` (made on first access, from verl's ``AgentLoopManager``: needs
  verl): runs the planner before verl's own ``generate_sequences``, so verl forwards the planned
  priorities, and feeds the planner afterwards; its workers are ``LengthschedAgentLoopWorker`` (verl's
  ``AgentLoopWorker`` whose every request of a session carries the session's priority, multi-turn loops'
  turns included: :class:`SessionPriorities`);
- :class:`PlannedLoadBalancer`: a router (verl's ``RequestLoadBalancer`` protocol, plain Python)
  that reads the replica from a request's priority (``priority mod replicas``) and sends it there,
  sticky per request id (multi-turn), least-loaded for requests without a planned priority;
- :func:`verl_rollout_config`: a plan and a memory budget as verl rollout settings and Hydra
  overrides.

Importing this module imports neither verl, Ray nor torch.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidArgument, as_lengths, check_int
from ..io import atomic_write_text
from ..memory import ModelMemory
from ..online import state_key
from ..placement import recommend_rollout_policy
from ..plan import Plan
from .base import EngineSetup, check_plan, engine_memory, plan_concurrency, plan_kv_bytes
from .rollout import (
    RolloutPlan,
    check_order,
    check_placement,
    decode_replica,
    observe_lengths,
    plan_rollout,
    predict_lengths,
)
from .sglang_adapter import sglang_setup
from .vllm_adapter import VLLM_NULL_BLOCKS, vllm_setup

__all__ = [
    "CHARS_PER_TOKEN",
    "MANAGER_CLASS",
    "MANAGER_TQ_CLASS",
    "ManagerPlanning",
    "PLANNER_STATE_FORMAT",
    "SAVE_SECONDS",
    "ROUTER_CLASS",
    "SELECTIVE_SAMPLER",
    "VERL_VERSION",
    "PlannedLoadBalancer",
    "RolloutPlanner",
    "SESSION_PRIORITY",
    "SessionPriorities",
    "SessionPriorityClient",
    "TOKENS_PER_MESSAGE",
    "TRAINERS",
    "VerlRolloutConfig",
    "batch_prompt_tokens",
    "make_agent_loop_manager_class",
    "make_worker_class",
    "prompt_key",
    "verl_rollout_config",
]

VERL_VERSION = "0.9.1"  # the version the contract above was read from and tested with
#: The format name of :meth:`RolloutPlanner.state` (``lengthsched.state_path``'s file).
PLANNER_STATE_FORMAT = "lengthsched.planner-state/1"
#: Within one rollout step, the planner's state file is rewritten at most this often (seconds).
SAVE_SECONDS = 60.0
MANAGER_CLASS = "lengthsched.integrations.verl.LengthschedAgentLoopManager"  # the legacy trainer's
#: The v1 trainer's (verl 0.9.1's default, ``trainer.use_v1=True``): :mod:`lengthsched.integrations.verl_v1`.
MANAGER_TQ_CLASS = "lengthsched.integrations.verl_v1.LengthschedAgentLoopManagerTQ"
#: verl's trainers and the manager each needs (``verl_rollout_config``'s ``trainer``).
TRAINERS = {"v1": MANAGER_TQ_CLASS, "legacy": MANAGER_CLASS}
#: The stealing managers (``verl_rollout_config(..., steal=True)``): the legacy trainer's
#: (:mod:`lengthsched.integrations.verl_stealing`) and the v1 trainer's (:mod:`lengthsched.integrations.verl_v1`).
STEALING_MANAGER_CLASS = "lengthsched.integrations.verl_stealing.LengthschedStealingAgentLoopManager"
STEALING_MANAGER_TQ_CLASS = "lengthsched.integrations.verl_v1.LengthschedStealingAgentLoopManagerTQ"
STEALING_TRAINERS = {"v1": STEALING_MANAGER_TQ_CLASS, "legacy": STEALING_MANAGER_CLASS}
#: Ray's ``worker_process_setup_hook`` the v1 trainer needs for stealing (:func:`~.verl_stealing.setup_hook`).
STEAL_SETUP_HOOK = "lengthsched.integrations.verl_stealing.setup_hook"
#: The v1 trainer's custom replay buffer of :mod:`~lengthsched.integrations.verl_selective` (its refill by need under
#: ``algorithm.filter_groups``): ``trainer.v1.sampler.custom_sampler.{path,name}``.
SELECTIVE_SAMPLER = {"path": "pkg://lengthsched.integrations.verl_selective", "name": "selective_replay_buffer"}
ROUTER_CLASS = "lengthsched.integrations.verl.PlannedLoadBalancer"
# verl's router LRU size (workers/rollout/router.py, DEFAULT_ROUTING_CACHE_SIZE).
_STICKY_ENTRIES = 10000
#: How :class:`PlannedLoadBalancer` routes what no plan places (its ``routing``): ``sticky`` (verl's: a request id
#: seen before goes back where it went) or ``cache_aware`` (SGLang's router's rule, see the class).
ROUTINGS = ("sticky", "cache_aware")
#: ``cache_aware``'s defaults: sglang-router's ``cache_threshold`` and slime's balance thresholds (10 requests and
#: 1.2x, ``simulate.rollout.SLIME_BALANCE_ABS`` / ``SLIME_BALANCE_REL``: what the simulator measured).
CACHE_AWARE_DEFAULTS = {"cache_threshold": 0.3, "balance_abs_threshold": 10, "balance_rel_threshold": 1.2}

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- the router
class PlannedLoadBalancer:
    """A verl 0.9.1 router (the ``RequestLoadBalancer`` protocol of ``workers/rollout/router.py``)
    that sends a request to the replica its priority names.

    ``servers``: server id -> actor handle, in replica order (verl passes the replicas' addresses
    in rank order). ``config``: the router YAML as a dict (verl's plugin path passes it; unused).
    A request whose ``priority`` is a non-negative integer goes to server ``priority mod
    len(servers)`` (:func:`~lengthsched.integrations.decode_replica`, the encoding of
    :func:`~lengthsched.integrations.plan_rollout`); any other request to a server with the fewest
    requests in flight (the first such, so it is deterministic). A request id seen before goes
    where it went (multi-turn conversations keep their prefix cache), unless that server left.
    Plain Python: verl wraps it in ``ray.remote``.

    ``routing`` (or the YAML's ``routing:``; :data:`ROUTINGS`): ``sticky`` (the default, as above) or
    ``cache_aware``, SGLang's router's rule for what no plan places (verl's own manager, the fully asynchronous
    recipe, a session's later turns): the router reads each request's ``prompt_ids`` (verl passes them when a
    router asks, ``require_acquire_fields``); a session's first request goes where the first request with the same
    prompt went (its group's siblings together, sharing the prompt's KV), a later turn (a request id seen before)
    back to its previous turn's server if that request's prompt was more than ``cache_threshold`` of this one's
    (the cached prefix is worth it), in both cases only while the servers' requests in flight are balanced (not
    both ``max - min > balance_abs_threshold`` and ``max > balance_rel_threshold x min``); otherwise to the
    server with the fewest in flight. In the simulator's multi-turn steps (``simulate.run_multiturn(...,
    router="cache_aware")``, docs/benchmarks.md "Multi-turn steps") that was 2.2-6.2% faster than verl's sticky
    routing on average, as much as stealing that follows the turns, with no predictions and no aborts, though
    slower in 5-8 of 24 settings (up to 3.7%). A request that :meth:`reroute` sent somewhere goes there whatever
    the rule says. Defaults: :data:`CACHE_AWARE_DEFAULTS`; ``rebalanced`` counts the later turns not sent back.

    A plan gives every row its own priority, so a priority that a request still in flight holds
    is not a plan's: that request goes to the fewest in flight too (counted in ``collisions``, one
    warning). verl's fully asynchronous recipe (``verl/experimental/fully_async_policy``, 0.9.1)
    sets no priorities (every request carries ``SingleTurnAgentLoop``'s default 0) and builds its
    own agent-loop manager, so behind it this router balances by requests in flight, as verl's own
    does, instead of sending every request to replica 0. It reads each request's id at release
    (``require_release_fields``) to know which priorities are in flight.
    """

    def __init__(self, servers: Mapping[str, Any], config: Mapping[str, Any] | None = None, *,
                 max_cache_size: int = _STICKY_ENTRIES, full_determinism: bool = False, routing: str | None = None,
                 cache_threshold: float | None = None, balance_abs_threshold: int | None = None,
                 balance_rel_threshold: float | None = None):
        if not isinstance(servers, Mapping):
            raise InvalidArgument("servers", type(servers).__name__, "a mapping server id -> actor handle")
        self.config = dict(config or {})
        given = {"routing": routing, "cache_threshold": cache_threshold, "balance_abs_threshold": balance_abs_threshold,
                 "balance_rel_threshold": balance_rel_threshold}
        option = {name: self.config.get(name) if value is None else value for name, value in given.items()}
        self.routing = "sticky" if option["routing"] is None else option["routing"]
        if self.routing not in ROUTINGS:
            raise InvalidArgument("routing", self.routing, "one of " + ", ".join(ROUTINGS))
        for name in CACHE_AWARE_DEFAULTS:
            if option[name] is None:
                option[name] = CACHE_AWARE_DEFAULTS[name]
            elif self.routing != "cache_aware":
                raise InvalidArgument(name, option[name], "routing: cache_aware too (it tunes that rule)")
        threshold = option["cache_threshold"]
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
            raise InvalidArgument("cache_threshold", threshold, "a share of the request's prompt in [0, 1]")
        self.cache_threshold = float(threshold)
        self.balance_abs_threshold = check_int("balance_abs_threshold", option["balance_abs_threshold"], minimum=0)
        rel = option["balance_rel_threshold"]
        if isinstance(rel, bool) or not isinstance(rel, (int, float)) or not rel >= 1:
            raise InvalidArgument("balance_rel_threshold", rel, "a ratio >= 1")
        self.balance_rel_threshold = float(rel)
        self.rebalanced = 0  # later turns (cache_aware) sent to the fewest in flight instead of back
        self._tokens: OrderedDict[str, int] = OrderedDict()  # request id -> its last prompt's tokens (cache_aware)
        self._homes: OrderedDict[int, str] = OrderedDict()  # a first prompt's hash -> its first server (cache_aware)
        self._rerouted: set[str] = set()  # request ids reroute() sent somewhere: they go there
        self._servers: dict[str, Any] = dict(servers)
        self._inflight: dict[str, int] = {sid: 0 for sid in self._servers}
        self._sticky: OrderedDict[str, str] = OrderedDict()
        self._max_cache_size = check_int("max_cache_size", max_cache_size, minimum=1)
        self.planned = 0  # requests routed by their priority
        self.unplanned = 0  # requests routed to the least loaded server
        self.collisions = 0  # of those, requests whose priority another request in flight held
        self._holding: dict[str, int] = {}  # request id in flight -> its priority
        self._live: dict[int, int] = {}  # priority -> requests in flight holding it
        # priority -> replicas of the requests still to come that carry it (expect(); None: the least loaded)
        self._routes: OrderedDict[int, list[int | None]] = OrderedDict()

    def require_acquire_fields(self) -> list[str]:
        """The ``generate()`` keywords this router reads at acquire time: ``priority`` (and ``prompt_ids`` with
        ``routing: cache_aware``)."""
        return ["priority", "prompt_ids"] if self.routing == "cache_aware" else ["priority"]

    def require_release_fields(self) -> list[str]:
        """The request id at release: which priorities are still in flight."""
        return ["request_id"]

    def acquire_server(self, request_id: str, priority: Any = None, prompt_ids: Any = None) -> tuple[str, Any]:
        """``(server id, handle)`` for a request: sticky, else the planned replica, else the least
        loaded (with ``routing: cache_aware``, ``prompt_ids`` decide the sticky and the unplanned ones: see the
        class). Raises RuntimeError when no server is registered (verl's text, which its fully-async client
        retries on)."""
        tokens = None
        if self.routing == "cache_aware" and prompt_ids is not None:
            tokens = len(prompt_ids)
        sid = self._sticky.get(request_id)
        if sid is not None and sid in self._inflight:
            if tokens is not None and request_id not in self._rerouted:
                sid = self._back_or_balance(request_id, sid, tokens)
            self._remember(request_id, sid)
        else:
            if not self._inflight:
                raise RuntimeError("No available servers in load balancer")
            ids = list(self._inflight)
            replica = decode_replica(priority, len(ids))
            routes = self._routes.get(int(priority)) if replica is not None else None
            if routes:
                replica = routes.pop(0)
                replica = None if replica is None else replica % len(ids)
                if not routes:
                    del self._routes[int(priority)]
            elif replica is not None and self._live.get(int(priority)):
                self.collisions += 1
                if self.collisions == 1:
                    log.warning("requests in flight share priority %d: priorities that do not come from "
                                "lengthsched's plan (verl's fully asynchronous recipe sets none); routing such "
                                "requests to the server with the fewest in flight", int(priority))
                replica = None
            if replica is None:
                self.unplanned += 1
                sid = self._first_server(prompt_ids) if tokens is not None else self._fewest()
            else:
                self.planned += 1
                sid = ids[replica]
            self._remember(request_id, sid)
        self._rerouted.discard(request_id)
        if tokens is not None:
            _keep_newest(self._tokens, request_id, tokens, self._max_cache_size)
        self._inflight[sid] += 1
        if decode_replica(priority, 1) is not None:  # a priority it holds while in flight
            self._release_priority(request_id)
            self._holding[request_id] = int(priority)
            self._live[int(priority)] = self._live.get(int(priority), 0) + 1
        return sid, self._servers[sid]

    def _fewest(self) -> str:
        """The server with the fewest requests in flight (the first such)."""
        return min(self._inflight, key=self._inflight.__getitem__)

    def _balanced(self) -> bool:
        """Whether the servers' requests in flight are balanced (SGLang's router's test, negated)."""
        loads = self._inflight.values()
        high, low = max(loads), min(loads)
        return not (high - low > self.balance_abs_threshold and high > low * self.balance_rel_threshold)

    def _back_or_balance(self, request_id: str, sid: str, tokens: int) -> str:
        """A later request of ``request_id`` (``tokens`` prompt tokens), last on ``sid``: back there while its last
        prompt is more than ``cache_threshold`` of this one and the loads are balanced, else the fewest in flight."""
        last = self._tokens.get(request_id)
        if (last is None or last > self.cache_threshold * max(tokens, 1)) and self._balanced():
            return sid
        target = self._fewest()
        if target != sid:
            self.rebalanced += 1
        return target

    def _first_server(self, prompt_ids: Any) -> str:
        """A session's first request: where the first request with the same prompt went while the loads are
        balanced, else the fewest in flight (which becomes that prompt's server if it has none)."""
        key = hash(tuple(prompt_ids) if isinstance(prompt_ids, (list, tuple))
                   else tuple(np.asarray(prompt_ids).ravel().tolist()))
        home = self._homes.get(key)
        if home not in self._inflight:  # none yet, or its server left: this request's server becomes it
            home = None
        sid = home if home is not None and self._balanced() else self._fewest()
        _keep_newest(self._homes, key, sid if home is None else home, self._max_cache_size)
        return sid

    def expect(self, routes: Mapping[int, Sequence[int | None]]) -> int:
        """Requests to come that share a priority, and where each goes: ``routes`` maps a priority to the
        replicas (indices in :meth:`get_all_servers`) of the requests that will carry it, one each in the
        order they arrive. verl's v1 trainer gives all the completions of a prompt the prompt's priority
        (:mod:`lengthsched.integrations.verl_v1` says so here before it dispatches them); without this
        they would count as requests sharing a priority. A request whose priority has no route left is
        routed as before. A replica None sends its request to the server with the fewest in flight (as verl's
        own router does), the priority still ordering the engine's queue. Keeps the newest ``max_cache_size``
        priorities. Returns the requests expected."""
        if not isinstance(routes, Mapping):
            raise InvalidArgument("routes", type(routes).__name__, "a mapping priority -> replica indices")
        count = 0
        for priority, replicas in routes.items():
            priority = check_int("routes priority", priority, minimum=0)
            if isinstance(replicas, (str, bytes)) or not isinstance(replicas, Sequence):
                raise InvalidArgument(f"routes[{priority}]", replicas, "a sequence of replica indices")
            taken = [None if r is None else check_int(f"routes[{priority}]", r, minimum=0) for r in replicas]
            self._routes[priority] = taken
            self._routes.move_to_end(priority)
            count += len(taken)
        while len(self._routes) > self._max_cache_size:
            self._routes.popitem(last=False)
        return count

    def _release_priority(self, request_id: Any) -> None:
        held = self._holding.pop(request_id, None)
        if held is not None:
            self._live[held] -= 1
            if not self._live[held]:
                del self._live[held]

    def reroute(self, request_id: str, replica: int) -> str:
        """Send ``request_id``'s next acquire to the server of ``replica`` (index in
        :meth:`get_all_servers`): where a :class:`~lengthsched.integrations.StealCoordinator` moved it.
        verl's ``FullyAsyncLLMServerClient`` resubmits an aborted request (its prompt plus the tokens
        generated so far) through ``acquire_server`` with the same request id, so it lands there.
        Returns the server id."""
        ids = list(self._inflight)
        replica = check_int("replica", replica, minimum=0)
        if replica >= len(ids):
            raise InvalidArgument("replica", replica, f"a replica index below {len(ids)} (registered servers)")
        self._remember(request_id, ids[replica])
        self._rerouted.add(request_id)
        return ids[replica]

    def _remember(self, request_id: str, server_id: str) -> None:
        """``request_id`` goes to ``server_id`` from now on (the newest of at most max_cache_size)."""
        _keep_newest(self._sticky, request_id, server_id, self._max_cache_size)

    def release_server(self, server_id: str, request_id: str | None = None) -> None:
        """One request on ``server_id`` finished (``request_id``: which; its priority is free again)."""
        if self._inflight.get(server_id, 0) > 0:
            self._inflight[server_id] -= 1
        self._release_priority(request_id)

    def add_servers(self, servers: Mapping[str, Any]) -> None:
        """Register servers (appended to the replica order)."""
        for sid, handle in servers.items():
            self._servers[sid] = handle
            self._inflight.setdefault(sid, 0)

    def remove_servers(self, server_ids: Sequence[str]) -> None:
        """Unregister servers; their sticky requests go elsewhere next time."""
        for sid in server_ids:
            self._servers.pop(sid, None)
            self._inflight.pop(sid, None)

    def get_server_handles(self) -> list[Any]:
        """The registered servers' handles, in replica order (a
        :class:`~lengthsched.integrations.verl_stealing.StealDriver` polls and aborts through them)."""
        return [self._servers[sid] for sid in self._inflight]

    def get_all_servers(self) -> list[str]:
        """Registered server ids, in replica order (the order priorities are decoded against)."""
        return list(self._inflight)

    def get_inflight_count(self, server_id: str) -> int:
        """Requests in flight on ``server_id``."""
        return self._inflight.get(server_id, 0)

    def get_total_inflight(self) -> int:
        """Requests in flight on all servers."""
        return sum(self._inflight.values())

    def clear_sticky_cache(self) -> dict:
        """Forget where request ids went (verl calls this at phase switches; with ``cache_aware`` also where each
        prompt went and each request's last prompt length: the engines' prefix caches start again)."""
        cleared = len(self._sticky)
        self._sticky.clear()
        self._tokens.clear()
        self._homes.clear()
        self._rerouted.clear()
        return {"cleared_entries": cleared, "server_loads": dict(self._inflight)}

    def get_status(self) -> dict:
        """Loads and routing counts, for debugging."""
        return {"servers": dict(self._inflight), "total_inflight": self.get_total_inflight(),
                "active_servers": len(self._inflight), "registered_handles": list(self._servers),
                "planned": self.planned, "unplanned": self.unplanned, "collisions": self.collisions,
                "routing": self.routing, "rebalanced": self.rebalanced}


def _keep_newest(cache: OrderedDict, key: Any, value: Any, size: int) -> None:
    """``cache[key] = value`` as its newest entry, the oldest dropped beyond ``size`` entries (an LRU)."""
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > size:
        cache.popitem(last=False)


# ----------------------------------------------------------------------------- the planner
def prompt_key(prompt: Any) -> str:
    """A stable text key of a verl ``raw_prompt`` (a string, or a list of chat messages, possibly as
    a numpy object array): the same prompt in a later epoch gets the same key, so an online
    predictor learns from its history. It is also the query given to the predictor."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, np.ndarray):
        prompt = prompt.tolist()
    try:
        return json.dumps(prompt, sort_keys=True, default=str, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument("raw_prompt", type(prompt).__name__, "a string or JSON-like chat messages") from exc


#: The planner's placements that need each replica's KV pool (``pool_tokens``).
_POOL_PLACEMENTS = ("ways", "classes", "auto")


def _read_state(path: str | os.PathLike) -> tuple[int, int, dict[str, list[int]], Any, dict[str, Any]]:
    """(steps, rows observed, history, the predictor's state or None, the file's other entries) of a planner
    state file (:meth:`RolloutPlanner.save_state`); InvalidArgument naming ``state_path`` for anything else."""
    try:
        with open(path, encoding="utf-8") as handle:
            saved = json.load(handle)
        if not isinstance(saved, dict) or saved.get("format") != PLANNER_STATE_FORMAT:
            raise ValueError(f"not of format {PLANNER_STATE_FORMAT!r}")
        steps = check_int("steps", saved.pop("steps"), minimum=0)
        observed = check_int("observed", saved.pop("observed"), minimum=0)
        history = {state_key(str(k)): [check_int("history", n, minimum=1) for n in v]
                   for k, v in saved.pop("history").items()}
        return steps, observed, history, saved.pop("predictor", None), saved
    except (OSError, ValueError, KeyError, TypeError, AttributeError, InvalidArgument) as exc:
        raise InvalidArgument("state_path", str(path), f"a JSON file of the planner's state ({exc})") from None


class RolloutPlanner:
    """Plans verl rollout batches and learns from their lengths (numpy only; verl-independent).

    ``predictor``: a ``LengthPredictor`` asked once per group with :func:`prompt_key` of its
    ``raw_prompt``; default :class:`~lengthsched.OnlineLengthPredictor` (``default_length`` tokens
    before anything is known, capped at ``max_new_tokens``). A predictor with ``observe`` is fed
    every row's response length after each training batch (not after validation batches, whose
    sampling differs), one rollout step per batch.

    ``placement``: :func:`plan_rollout`'s, ``spread`` (verl's routing, the default), ``groups`` (whole
    groups by predicted work), ``ways`` (the simulator's ``steal`` placement, for a rollout that
    steals: :mod:`lengthsched.integrations.verl_stealing`), ``classes`` (length classes, the
    simulator's ``placed_classes``, or ``steal_classes`` under the stealing manager: worth it only
    where the predictions know each completion's length, as one earlier epoch of the same prompts
    does where siblings agree), or ``auto`` (the
    simulator's recommendation, :func:`lengthsched.placement.recommend_rollout_policy`: ``classes``
    for a batch whose every prompt was seen in an earlier training step with siblings that agreed,
    their spread at most :data:`lengthsched.placement.CLASSES_MAX_SPREAD`; else ``fallback``).
    ``ways``, ``classes`` and ``auto`` need ``pool_tokens`` (each replica's KV pool in tokens, prompts
    included) and read each row's prompt length with :func:`batch_prompt_tokens`; ``classes`` and
    ``auto`` also need ``max_new_tokens`` and judge their candidates with ``cost`` (a
    :class:`lengthsched.cost.StepCost` or the path of its JSON; default Qwen3-1.7B on the H100
    preset: pass your model's, fitted where you can, ``lengthsched cost fit``). ``order``: how each
    replica's rows are ranked (:func:`plan_rollout`'s); None: ``default_order``, except for a
    ``classes`` plan on one replica, ranked longest predicted first (nothing is placed or stolen
    there: the simulator's ``steal_classes`` orders its one replica so); ``default_order`` None: the
    placement's default.
    ``fallback``: ``auto``'s placement without agreeing history (``spread``; the stealing manager's
    ``ways``). ``uninformed_placement``: the placement while the predictions say nothing (:attr:`informed`:
    the default predictor before it was told any length, every row predicted ``default_length``); None:
    ``placement`` throughout. :func:`planner_from_config` sets ``spread`` where the config names no placement
    (or ``auto``): placing by predicted work on a made-up length everywhere may put whole groups where verl's
    spread is faster, by up to 21% in the simulator (docs/benchmarks.md, "The first step without a trained
    predictor").
    ``state_path``: a JSON file of what the planner learns (:meth:`state`), read when the planner is made (where it
    exists) and written atomically after an :meth:`observe` that starts a rollout step (every one, where each
    step's lengths come in one batch), else at most every :data:`SAVE_SECONDS` (an asynchronous rollout that
    feeds each group as it finishes); None: nothing is saved.
    """

    def __init__(self, predictor: Any = None, *, max_new_tokens: int | None = None, default_length: int | None = None,
                 placement: str = "spread", pool_tokens: int | None = None, order: str | None = None,
                 cost: Any = None, fallback: str = "spread", default_order: str | None = None,
                 uninformed_placement: str | None = None, state_path: str | os.PathLike | None = None):
        if placement != "auto":
            check_placement(placement)
        if uninformed_placement not in (None, "spread", "groups"):
            raise InvalidArgument("uninformed_placement", uninformed_placement,
                                  "None, 'spread' or 'groups' (placements that need no pool)")
        self.uninformed_placement = uninformed_placement
        self.placement = placement
        self.fallback = check_placement(fallback, ("spread", "groups", "ways"))
        self.order = check_order(order)
        self.default_order = check_order(default_order, "default_order")
        if placement in _POOL_PLACEMENTS or pool_tokens is not None:
            pool_tokens = check_int("pool_tokens", pool_tokens, minimum=1)
        self.pool_tokens = pool_tokens
        if max_new_tokens is not None:
            max_new_tokens = check_int("max_new_tokens", max_new_tokens, minimum=1)
        elif placement in ("classes", "auto"):
            raise InvalidArgument("max_new_tokens", None, f"the longest a completion may be (tokens): placement="
                                                          f"{placement!r} needs it (verl's rollout.response_length)")
        if isinstance(cost, (str, os.PathLike)):
            from ..cost import StepCost

            cost = StepCost.from_file(cost)
        elif cost is not None and not hasattr(cost, "segment_seconds"):
            raise InvalidArgument("cost", type(cost).__name__, "a lengthsched.cost.StepCost, the path of its JSON, "
                                                               "or None")
        self.cost = cost
        #: Per prompt key (its :func:`~lengthsched.online.state_key`: a long prompt's digest), its completions'
        #: lengths (tokens, at least 1) in the latest training step that had two or more of them: what ``auto``
        #: reads.
        self.history: dict[Hashable, list[int]] = {}
        #: Rows whose lengths the predictor was told so far (:meth:`observe`).
        self.observed = 0
        if predictor is None:
            from ..online import OnlineLengthPredictor

            length = default_length if default_length is not None else max(1, (max_new_tokens or 1024) // 2)
            predictor = OnlineLengthPredictor(default_length=check_int("default_length", length, minimum=1),
                                              max_new_tokens=max_new_tokens)
        elif not hasattr(predictor, "predict"):
            raise InvalidArgument("predictor", type(predictor).__name__,
                                  "an object with predict() (the lengthsched.LengthPredictor protocol)")
        self.predictor = predictor
        self.max_new_tokens = max_new_tokens
        self.steps = 0
        self.last_plan: RolloutPlan | None = None
        if state_path is not None and (not isinstance(state_path, (str, os.PathLike)) or not str(state_path)):
            raise InvalidArgument("state_path", state_path, "a file path for what the planner learns (JSON), or None")
        self.state_path = state_path
        self._saved: tuple[int | None, float] = (None, 0.0)  # (steps, time.monotonic()) of the latest save
        if state_path is not None and os.path.exists(state_path):
            self.load_state(state_path)

    def state(self, prompts: Iterable[Hashable] | None = None) -> dict[str, Any]:
        """What the planner has learnt, JSON-ready (``format`` :data:`PLANNER_STATE_FORMAT`): rollout steps and rows
        observed, the sibling lengths ``auto`` reads, and the predictor's ``state_dict()`` where it has one (the
        default :class:`~lengthsched.OnlineLengthPredictor` does; a trained predictor learns nothing here).
        ``prompts``: only what it knows of these prompt keys (``partial`` then True: for other planners'
        :meth:`merge_states`, never :meth:`load_state`), the predictor's ``state_dict(prompts=...)`` where it
        takes them, else its whole state."""
        saver = getattr(self.predictor, "state_dict", None)
        if prompts is None:
            history, learnt = self.history, saver() if callable(saver) else None
        else:
            keys = list(dict.fromkeys(state_key(k) for k in prompts))
            history = {k: self.history[k] for k in keys if k in self.history}
            learnt = None
            if callable(saver):
                learnt = saver(prompts=keys) if "prompts" in inspect.signature(saver).parameters else saver()
        return {"format": PLANNER_STATE_FORMAT, "steps": self.steps, "observed": self.observed,
                "partial": prompts is not None, "history": {str(k): v for k, v in history.items()},
                "predictor": learnt}

    def save_state(self, path: str | os.PathLike | None = None) -> None:
        """:meth:`state` written to ``path`` (default ``state_path``) as JSON, atomically."""
        path = self.state_path if path is None else path
        if path is None:
            raise InvalidArgument("path", None, "a file path (or a planner made with state_path)")
        atomic_write_text(path, json.dumps(self.state()) + "\n")

    def load_state(self, path: str | os.PathLike) -> None:
        """Resume from what :meth:`save_state` wrote at ``path`` (a run restarted from a checkpoint): steps, rows
        observed, history and the predictor's state (loaded where the predictor can take it). A file that is not
        such JSON is an :class:`InvalidArgument` naming ``state_path``; the planner is then unchanged."""
        steps, observed, history, learnt, rest = _read_state(path)
        if rest.get("partial"):
            raise InvalidArgument("state_path", str(path), "a whole planner state (this one is partial: written "
                                                           "for other planners' merge_states)")
        loader = getattr(self.predictor, "load_state_dict", None)
        if learnt is not None and callable(loader):
            try:
                loader(learnt)
            except InvalidArgument as exc:
                raise InvalidArgument("state_path", str(path), f"a JSON file of the planner's state ({exc})") from None
        self.steps, self.observed, self.history = steps, observed, history

    def replay_states(self, paths: Iterable[str | os.PathLike]) -> int:
        """Bring the planner forward by later states of its own, oldest first: files of :meth:`state` (partial or
        whole) written after the state it resumed from, as a restarted AReaL rank replays the change files it
        wrote after its whole file (:class:`~lengthsched.integrations.areal.GroupRouter`). Each file's steps and
        rows observed become the planner's, and its history and its prompts' predictor statistics replace these
        (``replay_state_dict`` where the predictor has one; a predictor without it learns nothing to replay). A
        file that is not a planner's state, or whose steps are behind the planner's, is an
        :class:`InvalidArgument` naming ``state_path`` (the files before it replayed). Returns the files
        replayed."""
        replay = getattr(self.predictor, "replay_state_dict", None)
        done = 0
        for path in paths:
            steps, observed, history, learnt, _ = _read_state(path)
            if steps < self.steps:
                raise InvalidArgument("state_path", str(path), f"a state of step {self.steps} or later (the "
                                                               f"planner's; this one is of step {steps})")
            if learnt is not None and callable(replay):
                try:
                    replay(learnt)
                except InvalidArgument as exc:
                    raise InvalidArgument("state_path", str(path), f"a JSON file of the planner's state ({exc})") \
                        from None
            self.steps, self.observed = steps, observed
            self.history.update(history)
            done += 1
        return done

    def merge_states(self, paths: Iterable[str | os.PathLike]) -> int:
        """Take in what other planners learnt from the state files they write (:meth:`save_state`): other
        trainer ranks', each learning from its own share of the prompts, which changes every epoch. The
        predictor merges each file's predictor state (``merge_state_dict``, where it has one: the default
        :class:`~lengthsched.OnlineLengthPredictor` keeps, per prompt, whichever statistics are the more recent);
        the sibling lengths ``auto`` reads are taken for prompts this planner has none of. Steps and rows
        observed stay this planner's. A file may be partial (:meth:`state` of some prompts: what another rank
        learnt since it last wrote one). A file not there yet is skipped (a rank that has not written); one that is
        not a planner's state is an :class:`InvalidArgument` naming ``state_path`` (the files before it are
        merged). Returns the prompts whose predictor statistics were taken."""
        return sum(self.merge_state_file(path)[0] for path in paths if os.path.exists(path))

    def merge_state_file(self, path: str | os.PathLike) -> tuple[int, int]:
        """:meth:`merge_states` of one file that is there: (prompts whose predictor statistics were taken, the
        steps the file's planner had observed when it wrote it)."""
        steps, _, history, learnt, _ = _read_state(path)
        merge = getattr(self.predictor, "merge_state_dict", None)
        taken = 0
        if learnt is not None and callable(merge):
            try:
                taken = int(merge(learnt))
            except InvalidArgument as exc:
                raise InvalidArgument("state_path", str(path), f"a JSON file of a planner's state ({exc})") from None
        for key, lengths in history.items():
            self.history.setdefault(key, lengths)
        return taken, steps

    def plan(self, non_tensor_batch: Mapping[str, Any], replicas: int,
             loads: Any = None, base: int = 0) -> tuple[RolloutPlan, list[str]]:
        """The plan of a batch's rows (``uid`` per row; ``raw_prompt`` per row, else the uid is the
        key) on ``replicas``, and each row's prompt key. An optional ``generated`` column gives the
        tokens a row generated before (a partial rollout resumed): its predicted work is then what is
        left, ``max(1, predicted - generated)`` (the plan's ``predicted``), unless an optional ``left``
        column says it (tokens to go; 0: not given for that row), as the slime integration does from
        its predictor's own model of what is left after the row's progress. ``loads``: predicted tokens each
        replica already has (:func:`~lengthsched.integrations.plan_rollout`'s; ``groups`` and ``ways`` place
        from them). ``base``: added to every priority (:func:`~lengthsched.integrations.plan_rollout`'s)."""
        uids, keys, work = self.predict(non_tensor_batch)
        placement = self.placement_for(keys)
        extra: dict[str, Any] = {}
        if placement in ("ways", "classes"):
            extra = {"prompt_lens": batch_prompt_tokens(non_tensor_batch, len(uids)), "budget_tokens": self.pool_tokens}
        if placement == "classes":
            extra.update(max_new_tokens=self.max_new_tokens, cost=self.cost)
        generated = non_tensor_batch.get("generated")
        if generated is not None:
            done = as_lengths("generated", np.asarray(generated).reshape(-1), minimum=0, allow_empty=True)
            if len(done) != len(uids):
                raise InvalidArgument("generated", f"{len(done)} values", f"{len(uids)}, one per row")
            work = [max(1, w - int(g)) for w, g in zip(work, done)]
        left = non_tensor_batch.get("left")
        if left is not None:
            told = as_lengths("left", np.asarray(left).reshape(-1), minimum=0, allow_empty=True)
            if len(told) != len(uids):
                raise InvalidArgument("left", f"{len(told)} values", f"{len(uids)}, one per row")
            work = [int(t) if t > 0 else w for w, t in zip(work, told)]
        if loads is not None and placement in ("groups", "ways"):
            extra["loads"] = loads
        plan = plan_rollout(uids, work, replicas=replicas, placement=placement, base=base,
                            order=self.order_for(placement, replicas), **extra)
        self.last_plan = plan
        return plan, keys

    def predict(self, non_tensor_batch: Mapping[str, Any]) -> tuple[list[Hashable], list[str], list[int]]:
        """Per row of a batch (``uid`` per row; ``raw_prompt`` per row, else the uid is the key): its group
        id, its prompt key (:func:`prompt_key`) and its group's predicted length (tokens; the predictor is
        asked once per group)."""
        if "uid" not in non_tensor_batch:
            raise InvalidArgument("non_tensor_batch", sorted(non_tensor_batch), "a 'uid' column (verl's group id)")
        uids = [u.item() if isinstance(u, np.generic) else u for u in np.asarray(non_tensor_batch["uid"]).tolist()]
        prompts = non_tensor_batch.get("raw_prompt")
        keys = [prompt_key(p) for p in prompts] if prompts is not None else [str(u) for u in uids]
        if len(keys) != len(uids):
            raise InvalidArgument("raw_prompt", f"{len(keys)} rows", f"{len(uids)} rows, one per uid")
        first: dict[Hashable, int] = {}
        for i, u in enumerate(uids):
            first.setdefault(u, i)
        per_group = dict(zip(first, predict_lengths(self.predictor, [keys[i] for i in first.values()],
                                                    max_new_tokens=self.max_new_tokens)))
        return uids, keys, [int(per_group[u]) for u in uids]

    def order_for(self, placement: str, replicas: int) -> str | None:
        """How a plan with ``placement`` on ``replicas`` ranks each replica's rows: ``order`` when given,
        else ``"longest"`` for ``classes`` on one replica, else ``default_order`` (None: the
        placement's default in :func:`plan_rollout`)."""
        if self.order is not None:
            return self.order
        if placement == "classes" and replicas == 1:
            return "longest"
        return self.default_order

    @property
    def informed(self) -> bool:
        """Whether the predictions say anything: the predictor's own ``informed`` (an
        :class:`~lengthsched.OnlineLengthPredictor`, the default, is not before it has a prior or was told a
        length: every row is then predicted ``default_length``, a made-up number); True for a predictor
        without that attribute (a trained one)."""
        return bool(getattr(self.predictor, "informed", True))

    def placement_for(self, keys: Sequence[Hashable]) -> str:
        """The placement of a batch whose rows have prompt ``keys``: ``uninformed_placement`` while the
        predictions say nothing (:attr:`informed`); else the planner's, or for ``auto`` ``classes`` when every
        prompt was seen in an earlier training step and :func:`lengthsched.placement.recommend_rollout_policy`
        picks length classes (``steal_classes``) from their siblings' lengths there, else ``fallback``."""
        if not self.informed and self.uninformed_placement is not None:
            return self.uninformed_placement
        if self.placement != "auto":
            return self.placement
        prompts = list(dict.fromkeys(state_key(k) for k in keys))
        if not prompts or any(k not in self.history for k in prompts):
            return self.fallback
        return "classes" if recommend_rollout_policy([self.history[k] for k in prompts]) == "steal_classes" \
            else self.fallback

    def plan_batch(self, batch: Any, replicas: int) -> tuple[RolloutPlan, list[str]]:
        """:meth:`plan` on ``batch.non_tensor_batch`` (a verl ``DataProto``), writing the plan's
        priorities into its ``"priority"`` column (int64), where verl's manager keeps them."""
        plan, keys = self.plan(batch.non_tensor_batch, replicas)
        batch.non_tensor_batch["priority"] = np.asarray(plan.priority, dtype=np.int64)
        return plan, keys

    def observe(self, keys: Sequence[str], lengths: Sequence[int], step: int | None = None) -> int:
        """Feed one training batch's response lengths (tokens, per row) to the predictor as the next
        rollout step, or as rollout step ``step`` (at least the latest: an asynchronous rollout feeds each
        group as it comes back, under the weight version it belongs to). Returns the rows fed (0 for a
        predictor without ``observe``)."""
        if len(keys) != len(lengths):
            raise InvalidArgument("lengths", f"{len(lengths)} values", f"{len(keys)} values, one per key")
        if step is None:
            self.steps += 1
        else:
            self.steps = max(self.steps, check_int("step", step, minimum=0))
        fed = observe_lengths(self.predictor, keys, lengths, step=self.steps)
        self.observed += fed
        by_prompt: dict[Hashable, list[int]] = {}
        for key, length in zip(keys, lengths):
            by_prompt.setdefault(key, []).append(length)
        for key, seen in by_prompt.items():
            if len(seen) >= 2:
                self.history[state_key(key)] = [max(1, int(n)) for n in seen]
        now = time.monotonic()
        if self.state_path is not None and (self.steps != self._saved[0] or now - self._saved[1] >= SAVE_SECONDS):
            self.save_state()
            self._saved = (self.steps, now)
        return fed


#: Characters per token and tokens per chat message (its template) of :func:`batch_prompt_tokens`' estimate.
CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4


def batch_prompt_tokens(non_tensor_batch: Mapping[str, Any], rows: int) -> list[int]:
    """Each row's prompt length in tokens: ``raw_prompt_ids`` where the batch has them (exact), else an
    estimate from ``raw_prompt`` (verl's dataset keeps the chat messages there, not token ids):
    :data:`CHARS_PER_TOKEN` characters a token of text plus :data:`TOKENS_PER_MESSAGE` tokens per
    message for the chat template; zeros when the batch has neither (then the prompts are taken to be
    free, and the ``ways`` placement spreads every group as verl does)."""
    rows = check_int("rows", rows, minimum=0)
    ids = non_tensor_batch.get("raw_prompt_ids")
    if ids is not None and len(ids) == rows:
        return [len(p) for p in ids]
    prompts = non_tensor_batch.get("raw_prompt")
    if prompts is None or len(prompts) != rows:
        return [0] * rows
    out = []
    for p in prompts:
        if isinstance(p, np.ndarray):
            p = p.tolist()
        if isinstance(p, str):
            out.append(-(-len(p) // CHARS_PER_TOKEN))
            continue
        messages = list(p) if isinstance(p, (list, tuple)) else [p]
        chars = sum(len(str(m.get("content", ""))) if isinstance(m, Mapping) else len(str(m)) for m in messages)
        out.append(-(-chars // CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(messages))
    return out


def response_lengths(output: Any) -> list[int]:
    """Tokens the model generated per row of a verl output batch: the sum of ``response_mask``
    (1 for LLM tokens, 0 for tool tokens and padding: agent_loop.py ``_postprocess``)."""
    mask = output.batch["response_mask"]
    sums = mask.sum(-1)
    return [int(x) for x in np.asarray(getattr(sums, "cpu", lambda: sums)())]


def load_object(spec: Any, argument: str, form: str, blank: str | None = None) -> Any:
    """``"package.module:name"`` or ``"package.module.name"`` -> the object. A spec that cannot be imported
    raises :class:`InvalidArgument` naming ``argument`` and expecting an importable ``form``; one that is
    not a non-empty string expects ``blank`` (default ``form``)."""
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidArgument(argument, spec, blank or form)
    module, _, name = spec.partition(":") if ":" in spec else spec.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise InvalidArgument(argument, spec, f"an importable {form} ({exc})") from None


def _section(config: Any, name: str) -> Any:
    """``config[name]`` of a verl config node (a DictConfig, a mapping or an object), None where it lacks it."""
    try:
        return config.get(name, None) if hasattr(config, "get") else getattr(config, name, None)
    except Exception:  # noqa: BLE001 - a struct config without the key
        return None


def _setting(config: Any, path: str) -> Any:
    """The value at the dotted ``path`` of a verl config (e.g. ``"algorithm.filter_groups.enable"``), None where a
    part of the path is missing."""
    node = config
    for name in path.split("."):
        node = _section(node, name)
        if node is None:
            return None
    return node


def _number(config: Any, path: str, default: float | None = None) -> float | None:
    """The number at the dotted ``path`` of a verl config (e.g. ``"actor_rollout_ref.rollout.response_length"``),
    ``default`` where a part of the path is missing or the value is not a number."""
    node = _setting(config, path)
    if node is None:
        return default
    try:
        return float(node)
    except (TypeError, ValueError):
        return default


def _options(config: Any) -> dict[str, Any]:
    """The ``lengthsched`` section of a verl trainer config (a DictConfig or a mapping), as a dict."""
    section = config.get("lengthsched", None) if hasattr(config, "get") else None
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise InvalidArgument("lengthsched", type(section).__name__, "a mapping of lengthsched options")
    return {key: section[key] for key in section}


def sgpo_options(config: Any, known: Sequence[str] | None = None) -> dict[str, Any] | None:
    """The ``lengthsched.sgpo`` section of a verl trainer config as a dict, None where it is missing or says
    ``enable: false``; with ``known``, an option not among them is an error
    (:func:`lengthsched.integrations.verl_v1.online_sgpo` checks the options' values)."""
    section = _options(config).get("sgpo")
    if section is None:
        return None
    if not isinstance(section, Mapping):
        raise InvalidArgument("lengthsched.sgpo", type(section).__name__, "a mapping of online sGPO options")
    options = {name: section[name] for name in section}
    unknown = sorted(set(options) - set(known)) if known is not None else []
    if unknown:
        raise InvalidArgument("lengthsched.sgpo", unknown, "options among " + ", ".join(known))
    if not isinstance(options.get("enable", True), bool):
        raise InvalidArgument("lengthsched.sgpo.enable", options["enable"], "true or false")
    return options if options.get("enable", True) else None


def refuse_sgpo(config: Any, why: str) -> None:
    """An error naming ``lengthsched.sgpo`` where a manager that cannot vary a prompt's group size is given the online
    sGPO section (``why``: what stops it), rather than a section silently ignored; ``enable: false`` passes."""
    if sgpo_options(config) is not None:
        raise InvalidArgument("lengthsched.sgpo", "set", f"no such section with this manager ({why}); online sGPO "
                                                         "runs in verl's v1 trainer (trainer.use_v1=true, "
                                                         "lengthsched.integrations.verl_v1)")


def planner_from_config(config: Any, default_placement: str = "spread",
                        default_order: str | None = None) -> RolloutPlanner:
    """A :class:`RolloutPlanner` from a verl trainer config: ``lengthsched.predictor``
    ('module:callable' returning a LengthPredictor, or absent for the online predictor),
    ``lengthsched.default_length`` (tokens), capped at ``actor_rollout_ref.rollout.response_length``,
    ``lengthsched.placement`` (``spread``, ``groups``, ``ways``, ``classes`` or ``auto``; default
    ``default_placement``, which is also ``auto``'s fallback), ``lengthsched.pool_tokens`` (each
    replica's KV pool in tokens, for ``ways``, ``classes`` and ``auto``; else
    ``lengthsched.steal.pool_tokens``), ``lengthsched.order`` (``longest`` or ``batch``; default
    ``default_order``, None: the placement's), ``lengthsched.cost`` (the path of a step-cost JSON,
    for ``classes`` and ``auto``) and ``lengthsched.state_path`` (a JSON file the planner's learning is read from
    when it is made and written to after every training batch, atomically: a run resumed from a checkpoint keeps
    what it learnt)."""
    options = _options(config)
    predictor = options.get("predictor")
    if predictor is not None:
        made = load_object(predictor, "lengthsched.predictor", "'module:callable'",
                           "'module:callable' returning a LengthPredictor")
        predictor = made() if isinstance(made, type) or (callable(made) and not hasattr(made, "predict")) else made
    limit = _number(config, "actor_rollout_ref.rollout.response_length")
    limit = None if limit is None else int(limit)
    pool = options.get("pool_tokens")
    steal = options.get("steal")
    if pool is None and isinstance(steal, Mapping):
        pool = steal.get("pool_tokens")
    placement = options.get("placement", default_placement)
    chosen = options.get("placement") not in (None, "auto")  # the config names a placement itself
    return RolloutPlanner(predictor, max_new_tokens=limit, default_length=options.get("default_length"),
                          placement=placement, pool_tokens=pool if placement in _POOL_PLACEMENTS else None,
                          order=options.get("order"), default_order=default_order, cost=options.get("cost"),
                          fallback=default_placement, uninformed_placement=None if chosen else "spread",
                          state_path=options.get("state_path"))


class ManagerPlanning:
    """What the planning agent-loop managers share (verl's legacy one here, the v1 trainer's in
    :mod:`lengthsched.integrations.verl_v1`): the planner, built once from the trainer config's ``lengthsched``
    section, and the router. Needs ``self.config`` and ``self.llm_client`` (verl's ``AgentLoopManager`` sets them)."""

    #: The placement when the config names none (the stealing manager plans with steal's, "ways").
    lengthsched_default_placement = "spread"
    #: The order when the config names none (None: the placement's; the stealing manager: "batch").
    lengthsched_default_order: str | None = None

    def lengthsched_planner(self) -> RolloutPlanner:
        """The planner (built once from the trainer config)."""
        planner = getattr(self, "_lengthsched_planner", None)
        if planner is None:
            planner = self._lengthsched_planner = planner_from_config(
                self.config, default_placement=self.lengthsched_default_placement,
                default_order=self.lengthsched_default_order)
        return planner

    def lengthsched_router(self) -> Any:
        """The router's actor handle (``llm_client._load_balancer``, the one private attribute of verl 0.9.1
        this uses), None where the client has none."""
        return getattr(self.llm_client, "_load_balancer", None)

    def lengthsched_known_replicas(self) -> int | None:
        """Replicas to plan for where the router need not be asked: ``lengthsched.replicas`` from the trainer
        config, or 1 without a router; None: the router's server count (``get_all_servers``)."""
        configured = _options(self.config).get("replicas")
        if configured is not None:
            return check_int("lengthsched.replicas", configured, minimum=1)
        return 1 if self.lengthsched_router() is None else None


#: The priority of the agent-loop session the current asyncio task runs (None outside one): a
#: :class:`SessionPriorities` worker sets it around each session; :class:`SessionPriorityClient` gives it to the
#: session's requests that name none (verl 0.9.1's ``ToolAgentLoop`` names none on any turn).
SESSION_PRIORITY: ContextVar[int | None] = ContextVar("lengthsched_session_priority", default=None)


class SessionPriorityClient:
    """verl's LLM client (``LLMServerClient`` or a subclass) as a worker's agent loops see it: ``generate`` without
    a ``priority`` takes its session's (:data:`SESSION_PRIORITY`, where one is set), so every turn of a multi-turn
    loop reaches the router and the engine with the priority its plan gave the session; everything else is the
    client's own (attributes read and set through to it)."""

    def __init__(self, client: Any):
        object.__setattr__(self, "lengthsched_client", client)

    async def generate(self, *args: Any, **kwargs: Any) -> Any:
        if "priority" not in kwargs:
            priority = SESSION_PRIORITY.get()
            if priority is not None:
                kwargs["priority"] = priority
        return await self.lengthsched_client.generate(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "lengthsched_client"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.lengthsched_client, name, value)


class SessionPriorities:
    """Mixin of an agent-loop worker class (before verl's ``AgentLoopWorker`` or ``AgentLoopWorkerTQ``): its agent
    loops get the worker's client as a :class:`SessionPriorityClient`, and each session (``_run_agent_loop``) runs
    with :data:`SESSION_PRIORITY` set to its ``priority`` keyword (the row's; verl runs each session in a task of its
    own, so concurrent sessions keep theirs)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if not isinstance(self.llm_client, SessionPriorityClient):
            self.llm_client = SessionPriorityClient(self.llm_client)

    async def _run_agent_loop(self, sampling_params: dict, trajectory: dict, **kwargs: Any) -> Any:
        priority = kwargs.get("priority")
        token = SESSION_PRIORITY.set(None if priority is None else int(priority))
        try:
            return await super()._run_agent_loop(sampling_params, trajectory, **kwargs)
        finally:
            SESSION_PRIORITY.reset(token)


def _use_workers(manager: Any, worker_class: Any) -> None:
    """Before verl's ``AgentLoopManager.__init__``: make ``manager`` run ``worker_class`` (a Ray actor class; None:
    verl's), unless its class names its own (verl's ``__init__`` keeps an ``agent_loop_workers_class`` that is set)."""
    if worker_class is not None and not hasattr(manager, "agent_loop_workers_class"):
        manager.agent_loop_workers_class = worker_class


def make_worker_class(base: type) -> type:
    """``LengthschedAgentLoopWorker``: ``base`` (verl's ``AgentLoopWorker``, the legacy trainer's and the fully-async
    recipe's) with :class:`SessionPriorities`: every request of a session carries the session's priority."""

    class LengthschedAgentLoopWorker(SessionPriorities, base):  # type: ignore[misc, valid-type]
        """verl's AgentLoopWorker whose sessions' requests all carry their priority (lengthsched.integrations.verl)."""

    LengthschedAgentLoopWorker.__module__ = __name__
    return LengthschedAgentLoopWorker


def make_agent_loop_manager_class(base: type, auto_await: Any = None, worker_class: Any = None) -> type:
    """``LengthschedAgentLoopManager``: ``base`` (verl's ``AgentLoopManager``) whose
    ``generate_sequences`` plans the batch first (:class:`RolloutPlanner`, built from the trainer
    config's ``lengthsched`` section), lets verl run it with the planned priorities, then feeds the
    planner the response lengths (training batches) and adds ``lengthsched/*`` timings.

    The number of replicas comes from ``lengthsched.replicas`` or else the router
    (``llm_client._load_balancer.get_all_servers``, the one private attribute of verl 0.9.1 this
    uses). ``auto_await``: verl's decorator (``verl.utils.ray_utils.auto_await``), so that the
    method can be called with or without ``await`` as verl's own is. ``worker_class``: the agent-loop worker actor
    class to run (verl: ``ray.remote`` of ``LengthschedAgentLoopWorker``) unless ``base`` names its own; None keeps
    verl's.
    """
    wrap = auto_await if auto_await is not None else (lambda f: f)

    class LengthschedAgentLoopManager(ManagerPlanning, base):  # type: ignore[misc, valid-type]
        """verl's AgentLoopManager with a lengthsched plan per batch (lengthsched.integrations.verl)."""

        def __init__(self, *args: Any, **kwargs: Any):
            _use_workers(self, worker_class)
            super().__init__(*args, **kwargs)
            refuse_sgpo(self.config, "the legacy trainer repeats every prompt rollout.n times")

        async def lengthsched_replicas(self) -> int:
            """Replicas to plan for: ``lengthsched.replicas`` or the router's server count."""
            known = self.lengthsched_known_replicas()
            return known if known is not None else max(1, len(await self.lengthsched_router().get_all_servers.remote()))

        async def lengthsched_run(self, prompts: Any, plan: RolloutPlan) -> Any:
            """Run the planned batch: verl's ``generate_sequences`` (a hook: the stealing manager of
            :mod:`lengthsched.integrations.verl_stealing` runs its driver around it)."""
            return await super().generate_sequences(prompts)

        @wrap
        async def generate_sequences(self, prompts: Any) -> Any:
            if not hasattr(prompts, "non_tensor_batch"):  # a TensorDict of prompts: verl's v1 trainer
                raise TypeError(f"{type(self).__name__} plans the legacy trainer's batches (trainer.use_v1=False); "
                                f"verl 0.9.1's default v1 trainer needs agent_loop_manager_class={MANAGER_TQ_CLASS}")
            planner = self.lengthsched_planner()
            plan, keys = planner.plan_batch(prompts, await self.lengthsched_replicas())
            output = await self.lengthsched_run(prompts, plan)
            if not prompts.meta_info.get("validate", False):
                planner.observe(keys, response_lengths(output))
            work = np.asarray(plan.replica_work, dtype=np.float64)
            timing = output.meta_info.setdefault("timing", {})
            timing["lengthsched/replicas"] = plan.replicas
            timing["lengthsched/predicted_work_max_over_mean"] = float(work.max() / work.mean()) if work.sum() else 1.0
            return output

    LengthschedAgentLoopManager.__module__ = __name__
    return LengthschedAgentLoopManager


_MADE: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    """``LengthschedAgentLoopManager`` and ``LengthschedAgentLoopWorker`` are made from verl's ``AgentLoopManager``
    and ``AgentLoopWorker`` on first access (verl loads the manager by name: ``agent.agent_loop_manager_class``; Ray
    finds the worker class by name in its workers), so importing this module needs no verl."""
    if name not in ("LengthschedAgentLoopManager", "LengthschedAgentLoopWorker"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _MADE:
        try:
            agent_loop = importlib.import_module("verl.experimental.agent_loop.agent_loop")
            ray_utils = importlib.import_module("verl.utils.ray_utils")
            ray = importlib.import_module("ray")
        except ImportError as exc:
            raise ImportError(f"verl is not installed: pip install 'lengthsched[verl]' (verl=={VERL_VERSION}): "
                              f"{exc}") from None
        if "LengthschedAgentLoopWorker" not in _MADE:
            _MADE["LengthschedAgentLoopWorker"] = make_worker_class(agent_loop.AgentLoopWorker)
        if name == "LengthschedAgentLoopManager":
            _MADE[name] = make_agent_loop_manager_class(agent_loop.AgentLoopManager, ray_utils.auto_await,
                                                        ray.remote(_MADE["LengthschedAgentLoopWorker"]))
    return _MADE[name]


# ----------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class VerlRolloutConfig:
    """verl rollout settings for a plan: ``rollout`` (nested, under ``actor_rollout_ref.rollout``),
    ``extra`` (top-level sections: ``trainer``, ``lengthsched``), ``router_yaml`` (the text of the router
    file ``rollout.router_config_path`` names) and the engine :class:`EngineSetup` they came from."""

    rollout: dict[str, Any]
    extra: dict[str, Any]
    router_yaml: str
    setup: EngineSetup

    def overrides(self) -> list[str]:
        """Hydra command-line overrides for ``python -m verl.trainer.main_ppo``: keys verl's schema
        lacks (``engine_kwargs.<engine>.*``, ``agent.agent_loop_manager_class``, ``lengthsched.*``)
        get a ``+`` (``trainer.*`` does not: verl has that section; ``ray_kwargs.*`` gets ``++``, set or
        added)."""
        out: list[str] = []
        known_sections = ("engine_kwargs", "agent")
        for key, value in _flatten(self.rollout):
            new = key.split(".")[0] in known_sections and key.count(".") >= 1
            out.append(f"{'+' if new else ''}actor_rollout_ref.rollout.{key}={_hydra_value(value)}")
        for key, value in _flatten(self.extra):
            # trainer.* is in verl's schema; ray_kwargs.ray_init.runtime_env is too, and may hold the key already
            prefix = "" if key.startswith("trainer.") else "++" if key.startswith("ray_kwargs.") else "+"
            out.append(f"{prefix}{key}={_hydra_value(value)}")
        return out


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            out += _flatten(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def _hydra_value(value: Any) -> str:
    if value is True or value is False:
        return str(value).lower()
    if value is None:
        return "null"
    return str(value)


def verl_rollout_config(
    plan: Plan,
    memory: ModelMemory,
    *,
    gpu_memory_bytes: int | str,
    kv_budget_bytes: int | str | None = None,
    groups_per_replica: int = 1,
    engine: str = "vllm",
    tensor_parallel_size: int = 1,
    overhead_bytes: int | None = None,
    max_model_len: int | None = None,
    router_config_path: str = "lengthsched_router.yaml",
    predictor: str | None = None,
    trainer: str = "v1",
    steal: bool = False,
    selective: bool = False,
    routing: str = "sticky",
    sgpo: bool | Mapping[str, Any] = False,
) -> VerlRolloutConfig:
    """verl 0.9.1 rollout settings that run ``plan`` (one group's plan) ``groups_per_replica``
    times at once on every replica, in a memory budget.

    The running cap is ``groups_per_replica x plan_concurrency(plan)`` (``rollout.max_num_seqs``,
    which verl passes to vLLM's ``max_num_seqs`` and SGLang's ``max_running_requests``); the KV pool
    (whole model, bytes) is ``kv_budget_bytes`` or ``groups_per_replica x plan_kv_bytes`` (+ vLLM's
    null block), given to vLLM per GPU as ``engine_kwargs.vllm.kv_cache_memory_bytes`` and to SGLang
    as ``engine_kwargs.sglang.max_total_tokens``; ``rollout.gpu_memory_utilization`` is the
    per-GPU fraction of :func:`vllm_setup` / :func:`sglang_setup` (for SGLang verl passes it as
    ``mem_fraction_static``). vLLM also gets ``scheduling_policy="priority"`` and prefix caching;
    SGLang gets no priority settings, as verl 0.9.1 does not forward priorities to it (the
    router still places its groups). Both get the manager (``agent.agent_loop_manager_class``) and
    the router (``router_config_path``, whose text is ``router_yaml``); ``predictor`` goes to
    ``lengthsched.predictor`` ('module:callable'). ``trainer``: verl's trainer (one of :data:`TRAINERS`),
    ``"v1"`` (verl 0.9.1's default: ``trainer.use_v1=true`` and :data:`MANAGER_TQ_CLASS`) or ``"legacy"``
    (``trainer.use_v1=false`` and :data:`MANAGER_CLASS`). ``steal``: the trainer's stealing manager instead
    (:data:`STEALING_TRAINERS`; vLLM only) with ``lengthsched.steal.pool_tokens`` = the KV pool in tokens (less
    vLLM's null block, at the model's bytes per token), and for the v1 trainer Ray's ``worker_process_setup_hook``
    (:data:`STEAL_SETUP_HOOK`, ``ray_kwargs.ray_init.runtime_env``), which registers the vLLM server class with
    snapshots before verl builds its replicas. ``selective``: the v1 trainer's replay buffer from
    :mod:`~lengthsched.integrations.verl_selective` (:data:`SELECTIVE_SAMPLER`; its refill by need under DAPO's
    ``algorithm.filter_groups``, which the caller turns on; with ``steal`` the combination the simulator ranks
    first there). ``routing``: :class:`PlannedLoadBalancer`'s (:data:`ROUTINGS`), written into ``router_yaml``:
    ``cache_aware`` for agent loops (the class says why). ``sgpo``: the v1 manager's online sGPO
    (:func:`lengthsched.integrations.verl_v1.online_sgpo`: each training prompt's group size from its latest groups'
    rewards), True for its defaults or a mapping of its ``lengthsched.sgpo`` options (checked here).
    """
    check_plan(plan)
    if trainer not in TRAINERS:
        raise InvalidArgument("trainer", trainer, "'v1' (verl 0.9.1's default trainer) or 'legacy' (trainer.use_v1="
                                                  "false)")
    if engine not in ("vllm", "sglang"):
        raise InvalidArgument("engine", engine, "vllm or sglang")
    if not isinstance(steal, bool) or (steal and engine != "vllm"):
        raise InvalidArgument("steal", steal, "True (engine 'vllm': stealing reads vLLM's snapshots) or False")
    if not isinstance(selective, bool) or (selective and trainer != "v1"):
        raise InvalidArgument("selective", selective, "True (trainer 'v1': its custom replay buffer) or False")
    groups = check_int("groups_per_replica", groups_per_replica, minimum=1)
    if not isinstance(router_config_path, str) or not router_config_path:
        raise InvalidArgument("router_config_path", router_config_path, "a path for the router YAML")
    if predictor is not None and (not isinstance(predictor, str) or not predictor):
        raise InvalidArgument("predictor", predictor, "'module:callable' returning a LengthPredictor, or None")
    running = groups * plan_concurrency(plan)
    mem = engine_memory(memory, engine)
    reserved = VLLM_NULL_BLOCKS * mem.kv_bytes(mem.block_size) if engine == "vllm" else 0
    if kv_budget_bytes is None:
        kv_budget_bytes = groups * plan_kv_bytes(plan, mem) + reserved
    if engine == "vllm":
        setup = vllm_setup(plan, memory, gpu_memory_bytes=gpu_memory_bytes, kv_budget_bytes=kv_budget_bytes,
                           overhead_bytes=overhead_bytes, max_model_len=max_model_len,
                           tensor_parallel_size=tensor_parallel_size, concurrency=running)
        kw = setup.engine_kwargs
        rollout: dict[str, Any] = {
            "name": "vllm", "scheduling_policy": "priority", "max_num_seqs": running,
            "gpu_memory_utilization": kw["gpu_memory_utilization"], "enable_prefix_caching": True,
            "max_model_len": kw["max_model_len"], "tensor_model_parallel_size": setup.tensor_parallel_size,
            "engine_kwargs": {"vllm": {"kv_cache_memory_bytes": kw["kv_cache_memory_bytes"]}},
        }
    else:
        setup = sglang_setup(plan, memory, gpu_memory_bytes=gpu_memory_bytes, kv_budget_bytes=kv_budget_bytes,
                             overhead_bytes=overhead_bytes, pin_kv_cache=True,
                             tensor_parallel_size=tensor_parallel_size, concurrency=running)
        kw = setup.engine_kwargs
        rollout = {
            "name": "sglang", "max_num_seqs": running, "gpu_memory_utilization": kw["mem_fraction_static"],
            "tensor_model_parallel_size": setup.tensor_parallel_size,
            "engine_kwargs": {"sglang": {"max_total_tokens": kw["max_total_tokens"]}},
        }
    rollout["agent"] = {"agent_loop_manager_class": (STEALING_TRAINERS if steal else TRAINERS)[trainer]}
    rollout["router_config_path"] = router_config_path
    extra: dict[str, Any] = {"trainer": {"use_v1": trainer == "v1"}}
    if selective:
        extra["trainer"]["v1"] = {"sampler": {"custom_sampler": dict(SELECTIVE_SAMPLER)}}
    options: dict[str, Any] = {}
    if predictor is not None:
        options["predictor"] = predictor
    if steal:
        options["steal"] = {"pool_tokens": int(setup.kv_tokens - reserved // mem.kv_bytes_per_token)}
        if trainer == "v1":
            extra["ray_kwargs"] = {"ray_init": {"runtime_env": {"worker_process_setup_hook": STEAL_SETUP_HOOK}}}
    if sgpo is not False:
        if not (sgpo is True or isinstance(sgpo, Mapping)) or trainer != "v1":
            raise InvalidArgument("sgpo", sgpo, "True or a mapping of lengthsched.sgpo options, with trainer 'v1' "
                                                "(its worker hands the rewards over)")
        from .verl_v1 import online_sgpo

        section = {"enable": True, **(dict(sgpo) if isinstance(sgpo, Mapping) else {})}
        online_sgpo({"lengthsched": {"sgpo": {k: v for k, v in section.items() if k != "state_path"}}})  # checked
        options["sgpo"] = section
    if options:
        extra["lengthsched"] = options
    if routing not in ROUTINGS:
        raise InvalidArgument("routing", routing, "one of " + ", ".join(ROUTINGS) + " (PlannedLoadBalancer's)")
    router_yaml = f"router_class: {ROUTER_CLASS}\n" + ("" if routing == "sticky" else f"routing: {routing}\n")
    return VerlRolloutConfig(rollout=rollout, extra=extra, router_yaml=router_yaml, setup=setup)

