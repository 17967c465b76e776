"""Work stealing inside verl's agent-loop rollout: snapshots, request ids, aborts and the poll loop.

:class:`~lengthsched.integrations.StealCoordinator` decides, from per-replica snapshots of the tokens
each request in flight has generated, which requests to abort on one replica and resubmit (prompt plus
the tokens so far) on another. This module is the glue that runs it inside verl 0.9.1's agent-loop
rollout on vLLM 0.24.0 (the version verl 0.9.1's ``vllm`` extra pins). Modelled on these files of the
released wheels (tested with fakes built from them and, for the client, against verl's real
``FullyAsyncLLMServerClient``; not run on a verl cluster, a vLLM engine or a GPU):

- vLLM 0.24.0 ``vllm/v1/engine/output_processor.py``: ``OutputProcessor.request_states`` maps the
  *internal* request id to a ``RequestState``; ``RequestState.external_req_id`` is the id the caller
  gave, and ``RequestState.detokenizer.num_output_tokens()`` the tokens generated so far (updated at
  every engine step, also while the request is preempted, when it stops growing);
  ``OutputProcessor.abort_requests(request_ids, internal)`` (``internal`` has no default) aborts every
  internal request of an external id and puts a final output with ``finish_reason=ABORT`` and all
  tokens so far (cumulative outputs) in the request's queue.
- vLLM 0.24.0 ``vllm/v1/engine/input_processor.py``: ``assign_request_id`` makes the internal id
  ``f"{external}-{8 random characters}"`` (unless ``VLLM_DISABLE_REQUEST_ID_RANDOMIZATION``).
- vLLM 0.24.0 ``vllm/v1/engine/async_llm.py``: ``AsyncLLM.abort(request_id, internal=False)`` aborts
  by external id in the output processor and the engine core.
- verl 0.9.1 ``workers/rollout/vllm_rollout/vllm_async_server.py``: ``vLLMHttpServer`` (a Ray actor per
  replica node; ``self.engine`` is the ``AsyncLLM`` on node rank 0) calls ``engine.generate(...,
  request_id=request_id)`` with the id the client sent and answers ``stop_reason="aborted"`` with the
  tokens so far when vLLM aborted it. Its ``abort_request(request_id, reset_prefix_cache=True)`` looks
  the *external* id up in ``request_states`` and calls ``abort_requests([request_id])`` without
  ``internal``: against vLLM 0.24 it finds no request (and would raise TypeError if it did), so it
  answers ``{"aborted": False}``; nothing in verl 0.9.1 calls it. The server class made here replaces
  it with one that aborts through ``AsyncLLM.abort``. ``vLLMReplica`` builds its server actors from
  ``self.server_class = ray.remote(vLLMHttpServer)``; ``workers/rollout/replica.py``'s
  ``RolloutReplicaRegistry.register(name, loader)`` chooses the replica class per rollout name.
- verl 0.9.1 ``workers/rollout/llm_server.py``: ``LLMServerClient.generate`` acquires a server from the
  router (``_acquire_server(request_id, **kwargs)``, ``priority`` among the fields), then sends the
  request with the id ``_vllm_request_id(request_id)`` (a fresh uuid per attempt unless
  ``full_determinism``); ``FullyAsyncLLMServerClient.generate`` loops: when an attempt comes back
  ``"aborted"`` it waits 1 s and calls the base ``generate`` again with ``prompt_ids + tokens so far``
  and ``max_tokens`` reduced by them, through the router (so :meth:`PlannedLoadBalancer.reroute
  <lengthsched.integrations.verl.PlannedLoadBalancer.reroute>` decides where it lands). The plain
  ``LLMServerClient``, which ``ray_trainer.py`` hands the manager, returns an aborted attempt as the
  final (truncated) answer: stealing needs the fully-async client, which the manager made here installs,
  with a layer under its resume loop that resubmits the attempts the driver moved at once (the 1 s wait
  stays for verl's own aborts).
- verl 0.9.1 ``trainer/ppo/ray_trainer.py`` loads the manager class named by
  ``rollout.agent.agent_loop_manager_class`` *before* ``LLMServerManager.create`` builds the replicas,
  which is when :data:`LengthschedStealingAgentLoopManager` registers its vLLM replica class.

The pieces, all importable without verl, Ray, vLLM or torch (the verl-derived classes are made on
first access, like ``LengthschedAgentLoopManager``):

- :func:`engine_snapshot`, :func:`engine_prompt_tokens` and :func:`abort_engine_request`: read and abort through a
  vLLM ``AsyncLLM``;
- :func:`make_vllm_server_class` (``LengthschedVLLMHttpServer``: verl's server plus
  ``lengthsched_snapshot()`` and a working ``abort_request``), :func:`make_vllm_replica_class`,
  :func:`register_vllm_server`;
- the request ids: :func:`vllm_request_id` / :func:`parse_vllm_request_id` and
  :func:`make_stealing_client_class` (``StealingLLMServerClient``: verl's fully-async client whose vLLM
  ids carry the row's key and the client's request id, and which resubmits a moved attempt at once:
  :func:`resume_moved`, :data:`MOVED`);
- :class:`StealDriver`: the asyncio loop that polls the servers, feeds the coordinator and applies its
  moves (``router.reroute`` + ``server.abort_request(vllm_id, reset_prefix_cache=False)``);
- :func:`make_stealing_agent_loop_manager_class` (``LengthschedStealingAgentLoopManager``): the
  planning manager of :mod:`lengthsched.integrations.verl` that runs a driver around every batch,
  configured by the trainer config's ``lengthsched.steal`` section.

What the coordinator sees differs from the simulator's ``steal_observed`` in ways the docs list
(docs/howto-verl.md): snapshots every ``poll_interval`` seconds, the round trip of a resubmission, and
a moved request's prompt recomputed where it lands. The simulator prices the round trip
(``WorkStealing.RESUBMIT_SECONDS``) and the polls (``StealObserved.SNAPSHOT_SECONDS``): with verl's
1 s wait, moving running requests costs more than it gains; with the stealing client's immediate
resubmission they gain, hence :class:`StealOptions`' defaults (moves every 128 tokens, polls every
0.25 s).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.abc
import importlib.util
import inspect
import logging
import sys
import threading
import uuid
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import InvalidArgument, check_int, check_positive_float
from ..memory import KVCompression
from .rollout import MOVE_CHUNK, STEAL_SHARE
from .stealing import Move, StealCoordinator
from .verl import STEAL_SETUP_HOOK, STEALING_MANAGER_CLASS, _setting, batch_prompt_tokens

__all__ = [
    "MOVED",
    "REPLICA_MODULE",
    "RESUBMIT_ESTIMATE_SECONDS",
    "SETUP_HOOK",
    "STEALING_MANAGER_CLASS",
    "VLLM_VERSION",
    "LoopThread",
    "RunDriver",
    "StealDriver",
    "StealOptions",
    "abort_engine_request",
    "carried_tokens",
    "driver_for",
    "engine_prompt_tokens",
    "engine_snapshot",
    "make_stealing_agent_loop_manager_class",
    "make_stealing_client_class",
    "make_vllm_replica_class",
    "make_vllm_server_class",
    "on_import",
    "parse_vllm_request_id",
    "register_vllm_server",
    "resume_moved",
    "setup_hook",
    "steal_options",
    "stealing_client",
    "vllm_request_id",
]

VLLM_VERSION = "0.24.0"  # the vLLM verl 0.9.1 pins (its "vllm" extra): the output processor read here
MOVED = "lengthsched_moved"  # extra_fields key of an attempt the server aborted for a StealDriver move
#: Seconds a moved request takes to land on its target with the stealing client (the driver's abort, the answer
#: back to the client, the router, the new request: a few Ray calls): an estimate, not measured; the simulator's
#: ``resubmit_seconds`` when it models this integration.
RESUBMIT_ESTIMATE_SECONDS = 0.05
KEPT_MOVES = 100_000  # DriverStats.applied keeps the latest this many moves
REPLICA_MODULE = "verl.workers.rollout.replica"  # verl's RolloutReplicaRegistry lives here
SETUP_HOOK = STEAL_SETUP_HOOK  # Ray's worker_process_setup_hook that registers the server class (v1 trainer)
_PREFIX = "ls:"  # vLLM request ids made by the stealing client start with it
_SEP = "~"

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- reading and aborting vLLM
def _request_states(engine: Any) -> Mapping:
    processor = getattr(engine, "output_processor", None)
    states = getattr(processor, "request_states", None)
    if not isinstance(states, Mapping):
        raise InvalidArgument("engine", type(engine).__name__,
                              "a vLLM AsyncLLM (engine.output_processor.request_states: a mapping)")
    return states


def engine_snapshot(engine: Any) -> dict[str, int]:
    """``{request id: tokens generated so far}`` for every request in flight in a vLLM v1 ``AsyncLLM``
    (``engine.output_processor.request_states``, vLLM 0.24.0 ``v1/engine/output_processor.py``).

    The id is the one the caller gave (``RequestState.external_req_id``; the state's ``request_id``
    where that attribute is absent, as in vLLM before internal ids), the count
    ``RequestState.detokenizer.num_output_tokens()``: tokens of this request only, not those its prompt
    carries. States without a detokenizer (pooling requests) are left out; several internal requests of
    one id (parallel sampling) report the most advanced. A read of a dict on the engine's event loop: call
    it there (verl's server actor runs on it)."""
    return _engine_reading(engine)[0]


def engine_prompt_tokens(engine: Any) -> dict[str, int]:
    """``{request id: prompt tokens}`` for every request in flight in a vLLM v1 ``AsyncLLM`` (the requests of
    :func:`engine_snapshot`): ``RequestState.prompt_len``, or the length of its ``prompt_token_ids`` where that
    attribute is absent (requests with neither are left out). A multi-turn session's later turn carries the
    conversation so far in its prompt, an attempt resubmitted after a move its tokens too."""
    return _engine_reading(engine)[1]


def _engine_reading(engine: Any) -> tuple[dict[str, int], dict[str, int]]:
    """:func:`engine_snapshot` and :func:`engine_prompt_tokens` in one pass over the requests in flight that
    generate tokens (a detokenizer), by the caller's id (``external_req_id``, else the state's id)."""
    generated: dict[str, int] = {}
    prompts: dict[str, int] = {}
    for internal, state in list(_request_states(engine).items()):
        detokenizer = getattr(state, "detokenizer", None)
        if detokenizer is None:
            continue
        rid = getattr(state, "external_req_id", None) or internal
        generated[rid] = max(generated.get(rid, 0), int(detokenizer.num_output_tokens()))
        n = getattr(state, "prompt_len", None)
        if n is None:
            ids = getattr(state, "prompt_token_ids", None)
            n = None if ids is None else len(ids)
        if n is not None:
            prompts[rid] = int(n)
    return generated, prompts


async def abort_engine_request(engine: Any, request_id: str) -> dict[str, Any]:
    """Abort the request the caller named ``request_id`` in a vLLM v1 ``AsyncLLM`` through
    ``AsyncLLM.abort(request_id)`` (external id; vLLM 0.24.0 ``v1/engine/async_llm.py``): its
    ``generate()`` ends with a final output, ``finish_reason="abort"``, holding the tokens so far.

    Returns verl's answer shape, ``{"aborted": bool, "request_id": ...}``, with ``"generated"`` (tokens
    of this request when it was aborted: what the caller gets back) when it was found, ``"error"`` when
    not (it finished, or has not reached the engine yet)."""
    if not isinstance(request_id, str) or not request_id:
        raise InvalidArgument("request_id", request_id, "a non-empty vLLM request id")
    generated = engine_snapshot(engine).get(request_id)
    if generated is None:
        return {"aborted": False, "request_id": request_id, "error": f"Request {request_id} not found"}
    await engine.abort(request_id)
    return {"aborted": True, "request_id": request_id, "generated": generated}


# ----------------------------------------------------------------------------- verl's server, with snapshots
def make_vllm_server_class(base: type) -> type:
    """``LengthschedVLLMHttpServer``: ``base`` (verl 0.9.1's ``vLLMHttpServer``) with

    - ``lengthsched_snapshot()`` -> ``{"generated": {vllm id: tokens}, "prompts": {vllm id: prompt tokens},
      "finished": [vllm ids]}``: the requests in flight (:func:`engine_snapshot`, :func:`engine_prompt_tokens`)
      and those whose ``generate`` returned a completed answer since the previous call (not aborted ones: their
      client resubmits them). Nodes other than rank 0 hold no engine and answer empty;
    - ``abort_request(request_id, reset_prefix_cache=True)``: verl's signature and answer, through
      :func:`abort_engine_request` (verl's own finds nothing under vLLM 0.24's internal ids, see the
      module docstring); ``reset_prefix_cache`` clears the KV cache as verl's does. The attempt it
      aborts returns ``stop_reason="aborted"`` with ``extra_fields[MOVED] = True``
      (:data:`MOVED`), which the stealing client resubmits without verl's 1 s wait; aborts made any
      other way (verl's own ``pause_generation``) come back untagged.
    """

    class LengthschedVLLMHttpServer(base):  # type: ignore[misc, valid-type]
        """verl's vLLM server actor with request snapshots for lengthsched's StealDriver."""

        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self._lengthsched_done: list[str] = []  # completed since the last snapshot
            self._lengthsched_moving: set[str] = set()  # aborted by abort_request, not yet returned

        async def generate(self, prompt_ids, sampling_params, request_id, *args, **kwargs):
            output = await super().generate(prompt_ids, sampling_params, request_id, *args, **kwargs)
            if getattr(output, "stop_reason", None) != "aborted":
                self._lengthsched_done.append(request_id)
            elif request_id in self._lengthsched_moving:
                self._lengthsched_moving.discard(request_id)
                output.extra_fields[MOVED] = True  # the stealing client resubmits it at once
            return output

        async def lengthsched_snapshot(self) -> dict[str, Any]:
            finished, self._lengthsched_done = self._lengthsched_done, []
            if getattr(self, "node_rank", 0) != 0:
                return {"generated": {}, "prompts": {}, "finished": finished}
            generated, prompts = _engine_reading(self.engine)
            return {"generated": generated, "prompts": prompts, "finished": finished}

        async def abort_request(self, request_id: str, reset_prefix_cache: bool = True) -> dict[str, Any]:
            if getattr(self, "node_rank", 0) != 0:
                return {"aborted": False, "request_id": request_id}
            self._lengthsched_moving.add(request_id)  # before the abort: generate() may return at once
            result = await abort_engine_request(self.engine, request_id)
            if not result["aborted"]:
                self._lengthsched_moving.discard(request_id)
            elif reset_prefix_cache:
                await self.clear_kv_cache()
            return result

    LengthschedVLLMHttpServer.__module__ = __name__
    return LengthschedVLLMHttpServer


def make_vllm_replica_class(base: type, server_class: type, remote: Any = None) -> type:
    """``LengthschedVLLMReplica``: ``base`` (verl 0.9.1's ``vLLMReplica``) whose server actors are
    ``server_class`` (``remote(server_class)``; default ``ray.remote``, imported when the class is made)."""
    if remote is None:
        remote = importlib.import_module("ray").remote

    class LengthschedVLLMReplica(base):  # type: ignore[misc, valid-type]
        """verl's vLLM replica whose server actors expose lengthsched snapshots."""

        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.server_class = remote(server_class)

    LengthschedVLLMReplica.__module__ = __name__
    return LengthschedVLLMReplica


def register_vllm_server(registry: Any = None) -> None:
    """Make verl build its vLLM replicas as ``LengthschedVLLMReplica`` (``RolloutReplicaRegistry
    .register("vllm", loader)``, verl 0.9.1 ``workers/rollout/replica.py``). Call it in the trainer
    process before ``LLMServerManager.create``; the loader imports verl's vLLM server (needs vLLM)
    only when verl asks for the class. ``registry``: default verl's."""
    if registry is None:
        registry = importlib.import_module("verl.workers.rollout.replica").RolloutReplicaRegistry
    registry.register("vllm", lambda: _lazy("LengthschedVLLMReplica"))


# ----------------------------------------------------------------------------- running code when a module is imported
class _InstallOnImport(importlib.abc.MetaPathFinder):
    """Runs ``then(module)`` right after ``name`` is imported (once), whoever imports it."""

    def __init__(self, name: str, then: Any):
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once; and the search below must not find this finder
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _ThenLoader(spec.loader, self.then)
        return spec


class _ThenLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, then: Any):
        self.loader, self.then = loader, then

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        self.then(module)


def on_import(name: str, then: Any) -> bool:
    """``then(module)`` on module ``name`` now if it is imported, else right after it is, whoever imports it (a
    finder on ``sys.meta_path``, removed once used; one per name). Returns True when it ran now."""
    if name in sys.modules:
        then(sys.modules[name])
        return True
    if not any(isinstance(f, _InstallOnImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _InstallOnImport(name, then))
    return False


def setup_hook() -> None:
    """A Ray ``worker_process_setup_hook`` (name it by :data:`SETUP_HOOK` in the job's ``runtime_env``: verl's
    ``run_ppo`` merges ``ray_kwargs.ray_init.runtime_env`` into its own): :func:`register_vllm_server` in every
    worker process, right after verl's replica module (:data:`REPLICA_MODULE`) is imported there. verl's v1 trainer
    needs it: its ``TaskRunnerV1`` actor builds the replicas (``trainer.init()``) before it loads the agent-loop
    manager, so the registration that loading the stealing manager does comes too late there (the legacy trainer
    loads the manager first). Imports nothing heavy itself."""
    on_import(REPLICA_MODULE, lambda module: register_vllm_server(module.RolloutReplicaRegistry))


# ----------------------------------------------------------------------------- request ids
def vllm_request_id(key: Any, request_id: str, carried: int | None = None) -> str:
    """The vLLM request id of one attempt of a request: ``ls:{key}~{request_id}~{random}``, where ``key``
    names the row for the coordinator (the manager uses the row's unique priority) and ``request_id`` is
    the client's (the router's sticky key). Unique per attempt, as verl's fresh uuids are. ``carried``:
    tokens of the request's earlier attempts that this attempt's prompt carries (the random part then
    reads ``{carried}.{random}``; :func:`carried_tokens` reads it back), so that a driver counts a
    request resumed after any abort (a move, or verl's own at a weight update) at its whole progress."""
    key = str(key)
    if not key or _SEP in key:
        raise InvalidArgument("key", key, f"a non-empty row key without {_SEP!r}")
    if not isinstance(request_id, str):
        raise InvalidArgument("request_id", request_id, "the client's request id (a string)")
    tail = uuid.uuid4().hex if carried is None else f"{check_int('carried', carried, minimum=0)}.{uuid.uuid4().hex}"
    return f"{_PREFIX}{key}{_SEP}{request_id}{_SEP}{tail}"


def parse_vllm_request_id(vllm_id: str) -> tuple[str, str] | None:
    """``(key, client request id)`` of a :func:`vllm_request_id`; None for any other id (requests sent
    by other clients, which the driver leaves alone)."""
    if not isinstance(vllm_id, str) or not vllm_id.startswith(_PREFIX):
        return None
    key, sep, rest = vllm_id[len(_PREFIX):].partition(_SEP)
    request_id, sep2, _ = rest.rpartition(_SEP)
    if not (key and sep and sep2):
        return None
    return key, request_id


def carried_tokens(vllm_id: str) -> int | None:
    """The tokens of earlier attempts a :func:`vllm_request_id` made with ``carried`` says its prompt
    carries; None when the id does not say (made without it, or not a lengthsched id)."""
    if parse_vllm_request_id(vllm_id) is None:
        return None
    count, dot, _ = vllm_id.rpartition(_SEP)[2].partition(".")
    return int(count) if dot and count.isdigit() else None


def _moved(output: Any) -> bool:
    extra = getattr(output, "extra_fields", None)
    return getattr(output, "stop_reason", None) in ("aborted", "abort") and isinstance(extra, Mapping) \
        and bool(extra.get(MOVED))


def _merged(output: Any, later: Any) -> Any:
    """``output`` with ``later`` (the next attempt of the same request) appended, as verl 0.9.1's
    ``FullyAsyncLLMServerClient.generate`` merges its attempts: tokens, log-probs and routed experts
    appended, preemptions added, the later stop reason and extra fields (the first attempt's
    ``num_cached_tokens`` and ``min_global_steps`` kept)."""
    new = list(later.token_ids)
    first_extra = dict(getattr(output, "extra_fields", None) or {})
    output.token_ids = list(output.token_ids) + new
    if getattr(later, "log_probs", None) is not None:
        output.log_probs = list(output.log_probs or []) + list(later.log_probs)
    routed = getattr(later, "routed_experts", None)
    if routed is not None and new:
        output.routed_experts = routed if getattr(output, "routed_experts", None) is None else \
            np.concatenate([output.routed_experts, routed[-len(new):]])
    if getattr(later, "num_preempted", None) is not None:
        output.num_preempted = (getattr(output, "num_preempted", None) or 0) + later.num_preempted
    output.stop_reason = later.stop_reason
    extra = dict(getattr(later, "extra_fields", None) or {})
    for key in ("num_cached_tokens", "min_global_steps"):
        if first_extra.get(key) is not None:
            extra[key] = first_extra[key]
    output.extra_fields = extra
    return output


async def resume_moved(attempt: Any, request_id: str, prompt_ids: Sequence[int], sampling_params: Mapping[str, Any],
                       **kwargs: Any) -> Any:
    """One attempt, ``attempt(request_id, prompt_ids=..., sampling_params=..., **kwargs)`` (verl's
    ``LLMServerClient.generate``), resubmitted at once, with its tokens so far appended to the prompt and
    its ``max_tokens`` (or ``max_new_tokens``) reduced by them, for as long as the server aborted it for a
    move (:data:`MOVED`); the attempts merged as verl's fully-async client merges them. Any other answer
    (completed, or aborted by verl itself) is returned as it came, for verl's loop (which waits 1 s before
    it resubmits an abort)."""
    key = next((k for k in ("max_tokens", "max_new_tokens") if sampling_params.get(k) is not None), None)
    budget = None if key is None else int(sampling_params[key])
    params = dict(sampling_params)  # each attempt gets a copy: a server may pop from it
    output = await attempt(request_id, prompt_ids=prompt_ids, sampling_params=dict(params), **kwargs)
    while _moved(output):
        if budget is not None:
            left = budget - len(output.token_ids)
            if left <= 0:  # the budget is spent: verl's loop ends it as "length"
                break
            params[key] = left
        later = await attempt(request_id, prompt_ids=list(prompt_ids) + list(output.token_ids),
                              sampling_params=dict(params), **kwargs)
        output = _merged(output, later)
    if isinstance(getattr(output, "extra_fields", None), dict):
        output.extra_fields.pop(MOVED, None)
    return output


def make_stealing_client_class(base: type) -> type:
    """``StealingLLMServerClient``: ``base`` (verl 0.9.1's ``FullyAsyncLLMServerClient``, which resubmits
    an aborted attempt with its tokens through the router, after a 1 s wait) whose

    - vLLM request ids are :func:`vllm_request_id` of the request's ``priority`` (the field the router
      reads, seen in ``_acquire_server`` just before ``_vllm_request_id`` in the same ``generate``
      call), its request id and the tokens of earlier attempts the attempt's prompt carries (its prompt
      length less the request's own, seen in ``generate``); a request without a priority keeps verl's id;
    - attempts aborted for a move (:data:`MOVED`, set by ``LengthschedVLLMHttpServer.abort_request``)
      are resubmitted at once (:func:`resume_moved`), not after verl's 1 s wait, which the simulator
      found eats most of what stealing gains (docs/benchmarks.md, "Resubmission delay").

    The second part sits between ``base`` and its parent (verl's ``LLMServerClient``, whose
    ``generate`` is one attempt): ``base``'s resume loop calls ``super().generate`` for every attempt,
    which lands in the resume-at-once layer. Its merge keeps the first attempt's ``min_global_steps``
    and the last one's ``global_steps``; verl's loop, which sees one answer for a run of moves, records
    that answer's ``global_steps`` as both its minimum and maximum (the weights do not change within a
    synchronous rollout step)."""
    parent = base.__mro__[1] if len(base.__mro__) > 2 else None
    if parent is None or not callable(getattr(parent, "generate", None)) or \
            not callable(getattr(base, "generate", None)):
        raise InvalidArgument("base", getattr(base, "__name__", base),
                              "verl's FullyAsyncLLMServerClient: a client class whose parent's generate() is "
                              "one attempt (verl's LLMServerClient)")

    class _ResumeMovedAtOnce(parent):  # type: ignore[misc, valid-type]
        async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
            return await resume_moved(super().generate, request_id, prompt_ids, sampling_params, **kwargs)

    class StealingLLMServerClient(base, _ResumeMovedAtOnce):  # type: ignore[misc, valid-type]
        """verl's fully-async client with vLLM request ids a StealDriver can map back to rows, resubmitting
        the attempts it moved at once."""

        async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
            prompts = self.__dict__.setdefault("_lengthsched_prompts", {})
            prompts[request_id] = len(prompt_ids)  # the request's own prompt: later attempts carry more
            try:
                return await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params,
                                              **kwargs)
            finally:
                prompts.pop(request_id, None)

        async def _acquire_server(self, request_id: str, **extra: Any):
            priority = extra.get("priority")
            keys = self.__dict__.setdefault("_lengthsched_keys", {})
            if priority is None:
                keys.pop(request_id, None)
            else:
                first = self.__dict__.get("_lengthsched_prompts", {}).get(request_id)
                ids = extra.get("prompt_ids")
                carried = None if first is None or ids is None else max(0, len(ids) - first)
                keys[request_id] = (int(priority), carried)
            return await super()._acquire_server(request_id, **extra)

        def _vllm_request_id(self, request_id: str) -> str:
            key = self.__dict__.get("_lengthsched_keys", {}).pop(request_id, None)
            if key is None:
                return super()._vllm_request_id(request_id)
            return vllm_request_id(key[0], request_id, key[1])

    StealingLLMServerClient.__module__ = __name__
    return StealingLLMServerClient


# ----------------------------------------------------------------------------- the driver
async def _call(handle: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    """``handle.method(...)`` on a Ray actor handle (``.remote``, awaited) or a plain object."""
    fn = getattr(handle, method)
    remote = getattr(fn, "remote", None)
    out = remote(*args, **kwargs) if remote is not None else fn(*args, **kwargs)
    return await out if inspect.isawaitable(out) else out


def _generated(snap: Any) -> Mapping[str, int]:
    """A server's snapshot's ``generated`` (:class:`InvalidArgument` for anything not shaped like one)."""
    if not isinstance(snap, Mapping) or not isinstance(snap.get("generated"), Mapping):
        raise InvalidArgument("snapshot", snap, "{'generated': {vllm id: tokens}, 'finished': [vllm ids]}")
    return snap["generated"]


@dataclass
class _Row:
    request: Hashable
    replica: int
    predicted: float = 0.0  # as submitted (tokens)
    prompt: int = 0  # prompt tokens, as submitted
    group: Hashable = None
    seen: bool = False  # its current attempt appeared in a snapshot
    carried: int = 0  # tokens of earlier (aborted) attempts, in its prompt now
    client_id: str | None = None  # the client's request id (the router's key)
    vllm_id: str | None = None  # its current attempt on the engine
    done: int = 0  # tokens its earlier turns generated (as last seen; StealDriver with turns)
    last: int = 0  # tokens of its current turn as last seen (carried included)
    between: bool = False  # a turn ended and the next has not appeared yet


@dataclass
class DriverStats:
    """What a :class:`StealDriver` did: polls, moves applied (the latest kept; all counted by kind), moves
    cancelled (the abort found nothing,
    or the request had not reached its engine yet), polls that failed (logged), requests resumed (back
    in a snapshot after the coordinator had let them go)."""

    polls: int = 0
    #: The latest moves applied (at most :data:`KEPT_MOVES`: a driver may run for a whole training run).
    applied: deque[Move] = field(default_factory=lambda: deque(maxlen=KEPT_MOVES))
    cancelled: int = 0
    errors: int = 0
    resumed: int = 0  # requests seen again after leaving every snapshot (verl's own aborts), submitted again
    turns: int = 0  # later turns of multi-turn sessions seen (StealDriver with turns), submitted where they appear
    steals: int = 0  # moves applied of each kind, all of them
    moves: int = 0


class StealDriver:
    """Runs a :class:`StealCoordinator` against verl's vLLM servers and router, in asyncio.

    ``router``: the :class:`~lengthsched.integrations.verl.PlannedLoadBalancer` (a Ray actor handle or
    the object); ``servers``: the server of each replica, in the router's order (handles of
    ``LengthschedVLLMHttpServer`` or objects with its ``lengthsched_snapshot`` and ``abort_request``).

    Hooks: :meth:`submit` each request (its key: the one in its vLLM ids, :func:`vllm_request_id`)
    before or when it is sent, :meth:`finish` when its answer is in (optional: snapshots report finished
    requests). :meth:`start` polls every ``poll_interval`` seconds until :meth:`stop`; :meth:`poll_once`
    is one round: every server's snapshot, ``coordinator.observe`` per replica (tokens of aborted
    attempts added), ``coordinator.decide()``, and for each move ``router.reroute(client request id,
    target)`` then ``source.abort_request(vllm id, reset_prefix_cache=False)``; the fully-async client
    resubmits it (prompt plus tokens) through the router, to the target. A move whose abort finds nothing
    is cancelled (``coordinator.cancel``) and the route restored. A request submitted and not yet seen by
    its engine counts as waiting there, and cannot move before it is seen. A request that left every
    snapshot (the coordinator let it go as finished) and comes back, as verl's fully-async client brings
    back the requests its weight updates abort, is submitted again where it appears, at the progress its
    vLLM id carries (:func:`carried_tokens`), so a driver can run for a whole asynchronous run.

    ``turns``: the rows are multi-turn sessions (an agent loop with tools: every turn a request of its own,
    with the session's priority, see ``verl.SESSION_PRIORITY``). A finished attempt then ends a *turn*,
    not the row: the coordinator lets it go, the row stays until :meth:`finish`, and the session's next turn is
    submitted again where it appears (its prompt grew by the turns before; the router sends it to the replica
    the conversation was on), its progress the tokens of the earlier turns (as last seen) plus its own, against
    the session's predicted length. The caller must :meth:`finish` every row (its managers do: when the
    prompt is heard finish). Without ``turns`` (the default) a finished attempt finishes the row.
    """

    def __init__(self, coordinator: StealCoordinator, router: Any, servers: Sequence[Any], *,
                 poll_interval: float = 0.25, turns: bool = False):
        if not isinstance(coordinator, StealCoordinator):
            raise InvalidArgument("coordinator", type(coordinator).__name__, "a StealCoordinator")
        if not hasattr(router, "reroute"):
            raise InvalidArgument("router", type(router).__name__,
                                  "a router with reroute(request_id, replica) (PlannedLoadBalancer or its handle)")
        servers = list(servers) if isinstance(servers, Sequence) and not isinstance(servers, str) else None
        if servers is None or len(servers) != coordinator.replicas:
            raise InvalidArgument("servers", servers, f"one server per replica ({coordinator.replicas})")
        self.coordinator, self.router, self.servers = coordinator, router, servers
        self.poll_interval = check_positive_float("poll_interval", poll_interval)
        if not isinstance(turns, bool):
            raise InvalidArgument("turns", turns, "True (rows are multi-turn sessions) or False")
        self.turns = turns
        self.stats = DriverStats()
        self._rows: dict[str, _Row] = {}
        self._attempts: dict[str, str] = {}  # each row's current attempt (vLLM id) -> its key: read without parsing
        self._task: asyncio.Task | None = None

    # ------------------------------------------------------------------ hooks
    def submit(self, request: Hashable, replica: int, predicted: float, *, prompt_tokens: int = 0,
               group: Hashable = None) -> None:
        """``request`` goes to ``replica`` (the coordinator's :meth:`~StealCoordinator.submit`)."""
        key = str(request)
        if not key or _SEP in key:
            raise InvalidArgument("request", request, f"a request key whose text is non-empty and has no {_SEP!r}")
        self.coordinator.submit(request, replica, predicted, prompt_tokens=prompt_tokens, group=group)
        self._rows[key] = _Row(request, self.coordinator.replica_of(request), float(predicted), int(prompt_tokens),
                               group)

    def finish(self, request: Hashable) -> None:
        """``request``'s answer is in."""
        row = self._rows.pop(str(request), None)
        if row is not None:
            self._forget_attempt(row)
        self.coordinator.finish(request)

    def adopt(self, other: StealDriver, replicas: Sequence[int | None]) -> int:
        """Take over the requests ``other`` (a driver stopped because the router's servers changed) had in
        flight: ``replicas[r]`` is the replica here of ``other``'s replica ``r`` (None: its server left, and
        its requests with it: verl resubmits them elsewhere, and they come back into view when they appear in a
        snapshot here). Each keeps its predicted length, prompt, group, the tokens its earlier attempts carried
        and its current attempt, so it can be stolen or moved at once; a request ``other`` had let go (it left
        every snapshot, as a weight update's aborts do) is submitted again where it next appears. Returns how
        many requests were taken over onto a replica here."""
        if not isinstance(other, StealDriver):
            raise InvalidArgument("other", type(other).__name__, "a StealDriver")
        replicas = list(replicas)
        if len(replicas) != other.coordinator.replicas:
            raise InvalidArgument("replicas", replicas, f"one entry per replica of the other driver "
                                                        f"({other.coordinator.replicas})")
        for r in replicas:
            if r is not None and not 0 <= check_int("replicas", r, minimum=0) < self.coordinator.replicas:
                raise InvalidArgument("replicas", replicas, f"replicas below {self.coordinator.replicas} or None")
        adopted = 0
        for key, row in other._rows.items():
            if key in self._rows:
                continue
            where = other.coordinator.replica_of(row.request)
            target = None if where is None else replicas[where]
            if target is None:  # out of view until a snapshot shows it (``_observed``: resumed)
                self._rows[key] = replace(row, seen=False, vllm_id=None)
                continue
            self.coordinator.submit(row.request, target, row.predicted, prompt_tokens=row.prompt, group=row.group,
                                    generated=other.coordinator.generated_of(row.request))
            self._rows[key] = replace(row, replica=target)
            if row.vllm_id is not None:
                self._attempts[row.vllm_id] = key
            adopted += 1
        return adopted

    # ------------------------------------------------------------------ the loop
    def start(self) -> None:
        """Poll in a task of the running event loop until :meth:`stop`."""
        if self._task is not None and not self._task.done():
            raise InvalidArgument("start", "already running", "stop() before start() again")
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> DriverStats:
        """Stop polling (a round under way is cancelled between its awaits); returns :attr:`stats`."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        return self.stats

    async def _run(self) -> None:
        while True:
            try:
                await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a failed round must not fail the rollout; it is logged and counted
                self.stats.errors += 1
                log.exception("lengthsched StealDriver: a poll failed")
            await asyncio.sleep(self.poll_interval)

    async def poll_once(self) -> list[Move]:
        """One round (see the class docstring); returns the moves applied."""
        snaps = await asyncio.gather(*[_call(s, "lengthsched_snapshot") for s in self.servers])
        self.stats.polls += 1
        for snap in snaps:  # every replica's finished attempts first: a request (a session's next turn, a moved
            self._ended(snap)  # attempt) may appear on one replica in the round its last attempt ended on another
        unseen = [row for row in self._rows.values() if not row.seen]
        for replica, snap in enumerate(snaps):
            self.coordinator.observe(replica, self._observed(replica, snap, unseen))
        applied = []
        for move in self.coordinator.decide():
            if await self._apply(move):
                applied.append(move)
        self.stats.applied.extend(applied)
        self.stats.steals += sum(m.kind == "steal" for m in applied)
        self.stats.moves += sum(m.kind == "move" for m in applied)
        return applied

    def _ended(self, snap: Mapping[str, Any]) -> None:
        """The attempts a snapshot reports finished: their rows finish (with ``turns``: their turns end)."""
        _generated(snap)
        for vid in snap.get("finished", ()):
            parsed = parse_vllm_request_id(vid)
            row = self._rows.get(parsed[0]) if parsed else None
            if row is not None and row.vllm_id in (None, vid):
                if self.turns:
                    self._turn_ended(row)
                else:
                    self.finish(row.request)

    def _observed(self, replica: int, snap: Mapping[str, Any], unseen: list[_Row] | None = None,
                  ) -> dict[Hashable, int]:
        """What ``replica``'s snapshot says of the rows in flight (its finished attempts are :meth:`_ended`'s, done
        first for every replica): each row's tokens so far (the coordinator's ``observe``), rows it takes up again
        submitted where they appear. ``unseen``: the rows not seen at the start of the round (None: read from the
        rows). A later turn's prompt
        (the snapshot's ``prompts``, where given) sets its row's prompt tokens: the first prompt and the tools'
        answers, so the coordinator's estimate of its replica's KV (the room a steal needs) holds the whole
        conversation."""
        prompts = snap.get("prompts")
        out: dict[Hashable, int] = {}
        for vid, tokens in _generated(snap).items():
            key = self._attempts.get(vid)
            if key is None:  # an attempt not seen before (or someone else's request): its id says whose
                parsed = parse_vllm_request_id(vid)
                row = self._rows.get(parsed[0]) if parsed else None
                if row is None:
                    continue
                carried = carried_tokens(vid)
                if carried is not None:
                    row.carried = carried
                prompt = prompts.get(vid) if isinstance(prompts, Mapping) else None
                if prompt is not None and row.between:  # a later turn: the conversation less what it generated
                    row.prompt = max(row.prompt, int(prompt) - row.carried - row.done)
                self._forget_attempt(row)
                row.client_id, row.vllm_id = parsed[1], vid
                self._attempts[vid] = parsed[0]
            else:
                row = self._rows[key]  # an attempt is forgotten with its row (finish, _turn_ended, _apply)
            row.seen = True
            row.last = row.carried + check_int("generated", tokens, minimum=0)
            out[row.request] = row.done + row.last
            if self.coordinator.replica_of(row.request) is None:
                # The coordinator took it for finished (it left every snapshot: verl's own abort at a weight
                # update, resubmitted by its client after a wait), or its session's next turn began; it is
                # back, here, with its progress.
                self.coordinator.submit(row.request, replica, row.predicted, prompt_tokens=row.prompt,
                                        group=row.group, generated=out[row.request])
                row.replica = replica
                if row.between:
                    row.between = False
                    self.stats.turns += 1
                else:
                    self.stats.resumed += 1
        for row in self._rows.values() if unseen is None else unseen:  # sent, not yet on its engine: it waits there
            if not row.seen and row.request not in out and self.coordinator.replica_of(row.request) == replica:
                out[row.request] = row.done + row.carried
        return out

    def _forget_attempt(self, row: _Row) -> None:
        """``row`` has no current attempt any more (it ended, or was aborted for a move)."""
        if row.vllm_id is not None:
            self._attempts.pop(row.vllm_id, None)
            row.vllm_id = None

    def _turn_ended(self, row: _Row) -> None:
        """A turn of the multi-turn session ``row`` finished: the coordinator lets it go; the row waits for the
        next turn (or :meth:`finish`), its tokens so far kept."""
        self.coordinator.finish(row.request)
        row.done += row.last
        row.last = row.carried = 0
        self._forget_attempt(row)
        row.seen, row.between = False, True

    async def _apply(self, move: Move) -> bool:
        row = self._rows.get(str(move.request))
        if row is None or row.vllm_id is None or not row.seen:
            self.coordinator.cancel(move)
            self.stats.cancelled += 1
            return False
        await _call(self.router, "reroute", row.client_id, move.target)
        result = await _call(self.servers[move.source], "abort_request", row.vllm_id, reset_prefix_cache=False)
        if not (isinstance(result, Mapping) and result.get("aborted")):
            await _call(self.router, "reroute", row.client_id, move.source)
            self.coordinator.cancel(move)
            self.stats.cancelled += 1
            return False
        row.carried += int(result.get("generated", max(0, move.generated - row.done - row.carried)))
        self._forget_attempt(row)
        row.replica, row.seen = move.target, False
        return True


# ----------------------------------------------------------------------------- configuration and the manager
@dataclass(frozen=True)
class StealOptions:
    """The trainer config's ``lengthsched.steal`` section: ``pool_tokens`` (KV tokens of one replica's
    pool, required), ``poll_interval`` (seconds between the driver's polls, default 0.25), ``chunk``
    (tokens between moves of running requests, default :data:`~.rollout.MOVE_CHUNK`, 128; null: running
    requests never move), ``share`` and ``room`` (:class:`StealCoordinator`'s), ``turns`` (the rows are
    multi-turn sessions, :class:`StealDriver`'s; default: ``actor_rollout_ref.rollout.multi_turn.enable``),
    ``kv_compression`` (``"BUDGET:INTERVAL"`` where the engines run a compressed KV cache: the room to steal
    counts each request at most budget + interval generated tokens; default none).

    The defaults are what the simulator found fastest with this module's client, which resubmits a
    moved request at once (``steal_observed`` with a snapshot every 0.25 s and 0.05 s per resubmission:
    0.966 of vLLM + verl on the grid's multi-replica settings, 0.932 on steps of 512-1024 prompts on 16-32
    replicas, against 0.986 and 0.963 with verl's own client, which waits 1 s, polled every second and
    without moves, the defaults until 2026-11-27; docs/benchmarks.md, "Resubmission delay"). The
    driver's poll costs the manager 2.4-13 ms of one core for 4,096-16,384 requests in flight (the coordinator's
    share 1-4 ms, up to 9 ms when a replica drains; ``bench_planning.py --sections coordinator``). With a
    client that waits before it resubmits, set ``chunk`` to null: moves of running requests then lose
    more than they gain."""

    pool_tokens: int
    poll_interval: float = 0.25
    chunk: int | None = MOVE_CHUNK
    share: float = STEAL_SHARE
    room: float = 1.0
    turns: bool = False
    kv_compression: str | None = None

    def coordinator(self, replicas: int) -> StealCoordinator:
        """A coordinator for ``replicas`` with these settings."""
        cap = KVCompression.of(self.kv_compression, "lengthsched.steal.kv_compression")
        return StealCoordinator(replicas, self.pool_tokens, chunk=self.chunk, share=self.share, room=self.room,
                                kv_cap=None if cap is None else cap.max_retained)


def steal_options(config: Any) -> StealOptions:
    """:class:`StealOptions` from a verl trainer config (its ``lengthsched.steal`` section; a mapping)."""
    section = config.get("lengthsched", None) if hasattr(config, "get") else None
    steal = section.get("steal", None) if hasattr(section, "get") else None
    if not hasattr(steal, "get") or steal.get("pool_tokens", None) is None:
        raise InvalidArgument("lengthsched.steal", steal,
                              "a section with pool_tokens (KV tokens per replica): +lengthsched.steal.pool_tokens=N")
    known = {"pool_tokens", "poll_interval", "chunk", "share", "room", "turns", "kv_compression"}
    unknown = sorted(set(steal) - known)
    if unknown:
        raise InvalidArgument("lengthsched.steal", unknown, f"options among {sorted(known)}")
    chunk = steal.get("chunk", MOVE_CHUNK)  # present and null: running requests never move
    options = StealOptions(
        pool_tokens=check_int("lengthsched.steal.pool_tokens", steal.get("pool_tokens"), minimum=1),
        poll_interval=check_positive_float("lengthsched.steal.poll_interval",
                                           steal.get("poll_interval", StealOptions.poll_interval)),
        chunk=None if chunk is None else check_int("lengthsched.steal.chunk", chunk, minimum=1),
        share=check_positive_float("lengthsched.steal.share", steal.get("share", STEAL_SHARE), maximum=1.0),
        room=check_positive_float("lengthsched.steal.room", steal.get("room", 1.0)),
        turns=_turns(config, steal.get("turns", None)),
        kv_compression=_kv_compression(steal.get("kv_compression", None)),
    )
    return options


def _kv_compression(text: Any) -> str | None:
    """``lengthsched.steal.kv_compression`` checked (``"BUDGET:INTERVAL"``), or None where it is not set."""
    text = None if text is None else str(text)
    KVCompression.of(text, "lengthsched.steal.kv_compression")
    return text


def _turns(config: Any, turns: Any) -> bool:
    """``lengthsched.steal.turns``, or where it is not set whether verl runs multi-turn agent loops
    (``actor_rollout_ref.rollout.multi_turn.enable``)."""
    if turns is None:
        return bool(_setting(config, "actor_rollout_ref.rollout.multi_turn.enable"))
    if not isinstance(turns, bool):
        raise InvalidArgument("lengthsched.steal.turns", turns, "true or false (rows are multi-turn sessions)")
    return turns


def stealing_client(client: Any, client_class: type) -> Any:
    """``client`` (the LLM client verl hands a manager) as ``client_class`` (the stealing client,
    :func:`make_stealing_client_class`): the same router (``_load_balancer``), config and ``only_hybrid``; a client
    of that class already is returned as it is."""
    if isinstance(client, client_class):
        return client
    return client_class(config=client.config, load_balancer_handle=client._load_balancer,
                        only_hybrid=getattr(client, "_only_hybrid", False))


async def driver_for(router: Any, options: StealOptions, driver: StealDriver | None,
                     servers: Sequence[str]) -> tuple[StealDriver, list[str], int | None]:
    """The :class:`StealDriver` for ``router``'s current servers (``get_all_servers``): ``driver`` while they are
    still ``servers``; else a new one, started, over every server the router has now (``options``' coordinator and
    polls), which took over ``driver``'s requests in flight on the servers that stayed (:meth:`StealDriver.adopt`;
    ``driver`` is stopped): an added replica can steal them at once, and those on a server that left come back into
    view where verl resubmits them. Returns ``(driver, the router's servers, requests taken over)``, the last None
    when ``driver`` stays. Raises RuntimeError when the router has no server (verl's text) or a server has no
    ``lengthsched_snapshot`` (verl built its own vLLM server class: :func:`register_vllm_server` came too late, as
    in the v1 trainer without :func:`setup_hook`)."""
    current = list(await _call(router, "get_all_servers"))
    if not current:
        raise RuntimeError("No available servers in load balancer")
    if driver is not None and current == list(servers):
        return driver, current, None
    handles = list(await _call(router, "get_server_handles"))
    missing = [r for r, handle in enumerate(handles) if not hasattr(handle, "lengthsched_snapshot")]
    if missing:
        raise RuntimeError(f"the vLLM servers of replicas {missing} are verl's own (no lengthsched_snapshot): verl "
                           f"built them before lengthsched registered its server class; add "
                           f"++ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={SETUP_HOOK}")
    new = StealDriver(options.coordinator(len(current)), router, handles, poll_interval=options.poll_interval,
                      turns=options.turns)
    adopted = 0
    if driver is not None:
        await driver.stop()
        index = {sid: r for r, sid in enumerate(current)}
        adopted = new.adopt(driver, [index.get(sid) for sid in servers])
        log.warning("lengthsched: the router's servers changed (%d -> %d): a new StealDriver, %d requests in flight "
                    "taken over", len(servers), len(current), adopted)
    new.start()
    return new, current, adopted


class RunDriver:
    """Mixin of the managers that keep one :class:`StealDriver` for a whole run (verl_async's and verl_v1's
    stealing managers): ``lengthsched_driver`` (None before the first batch), ``lengthsched_servers`` (the
    router's servers it polls), ``lengthsched_restarts`` (new drivers started because those changed) and
    ``lengthsched_adopted`` (requests in flight they took over). Call :meth:`_lengthsched_keep_driver` from
    ``__init__``."""

    def _lengthsched_keep_driver(self) -> None:
        self.lengthsched_driver: StealDriver | None = None
        self.lengthsched_servers: list[str] = []
        self.lengthsched_restarts = 0
        self.lengthsched_adopted = 0

    async def _lengthsched_current_driver(self, router: Any, options: StealOptions) -> bool:
        """Make ``lengthsched_driver`` the driver for ``router``'s current servers (:func:`driver_for`); True where
        it is a new one (the first, or one after the servers changed)."""
        old = self.lengthsched_driver
        driver, servers, adopted = await driver_for(router, options, old, self.lengthsched_servers)
        if adopted is None:
            return False
        if old is not None:
            self.lengthsched_restarts += 1
            self.lengthsched_adopted += adopted
        self.lengthsched_driver, self.lengthsched_servers = driver, servers
        return True

    def lengthsched_driver_status(self) -> dict[str, Any]:
        """Replicas polled, the driver's steals, moves, cancelled moves, resumed requests, later turns seen, polls
        and failed polls, its restarts and the requests in flight the new drivers took over."""
        stats = self.lengthsched_driver.stats if self.lengthsched_driver is not None else None
        return {"replicas": len(self.lengthsched_servers),
                **{name: getattr(stats, name) if stats else 0
                   for name in ("steals", "moves", "cancelled", "resumed", "turns", "polls", "errors")},
                "restarts": self.lengthsched_restarts, "adopted": self.lengthsched_adopted}


class LoopThread:
    """An asyncio event loop of its own, in a daemon thread, for a caller with none running: verl's v1 trainer
    calls its agent-loop manager synchronously, and a :class:`StealDriver` there polls between (and across) its
    calls. :meth:`run` runs a coroutine on the loop and waits for its result; :meth:`close` stops the loop."""

    def __init__(self, name: str = "lengthsched-steal"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        """The result of coroutine ``coro`` run on the loop (its exception raised here); ``timeout`` in seconds."""
        if self.loop.is_closed() or threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("LoopThread.run: the loop is closed, or this is its own thread (await instead)")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        """Stop the loop and its thread (idempotent). Stop what runs on it first."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def make_stealing_agent_loop_manager_class(base: type, client_class: type) -> type:
    """``LengthschedStealingAgentLoopManager``: ``base`` (a planning manager made by
    :func:`lengthsched.integrations.verl.make_agent_loop_manager_class`) that

    - swaps the client verl hands it for ``client_class`` (:func:`make_stealing_client_class` of verl's
      ``FullyAsyncLLMServerClient``) on the same router, before its agent-loop workers are made;
    - plans with ``steal``'s placement (``placement="ways"``, each replica's pool ``pool_tokens``) unless
      the config names a ``lengthsched.placement``: verl's spread with stealing is what the simulator
      measured slower (docs/benchmarks.md, "How widely to spread a group");
    - ranks each replica's rows in batch order (``order="batch"``) unless the config names a
      ``lengthsched.order``: vLLM's priority scheduling then starts them as ``steal`` does, in placement
      order (with ``placement=classes``, or ``auto`` where the prompts' history says so, the
      simulator's ``steal_classes``, whose rows on ONE replica are ranked longest predicted first);
    - around verl's ``generate_sequences`` of every batch runs a :class:`StealDriver`: every row submitted
      under its priority (its planned replica, predicted length, ``uid`` as group, its prompt tokens from
      :func:`~lengthsched.integrations.verl.batch_prompt_tokens`), polling until the batch is done; the router must be a
      :class:`~lengthsched.integrations.verl.PlannedLoadBalancer` (``get_server_handles``, ``reroute``);
    - adds ``lengthsched/steals``, ``lengthsched/moves`` and ``lengthsched/steal_cancelled`` to the step's
      timings. Options: :func:`steal_options` (the ``lengthsched.steal`` section).
    """

    class LengthschedStealingAgentLoopManager(base):  # type: ignore[misc, valid-type]
        """lengthsched's planning manager with work stealing between the vLLM replicas."""

        def __init__(self, config, llm_client, *args: Any, **kwargs: Any):
            self.lengthsched_steal = steal_options(config)
            super().__init__(config, stealing_client(llm_client, client_class), *args, **kwargs)
            self.lengthsched_driver: StealDriver | None = None

        lengthsched_default_placement = "ways"  # steal's placement unless the config names another
        lengthsched_default_order = "batch"  # steal's order: each replica's rows as placed

        async def lengthsched_run(self, prompts: Any, plan: Any) -> Any:
            router = self.llm_client._load_balancer
            servers = await _call(router, "get_server_handles")
            driver = StealDriver(self.lengthsched_steal.coordinator(plan.replicas), router, servers,
                                 poll_interval=self.lengthsched_steal.poll_interval, turns=self.lengthsched_steal.turns)
            ntb = prompts.non_tensor_batch
            uids = np.asarray(ntb["uid"]).tolist()
            for i, tokens in enumerate(batch_prompt_tokens(ntb, len(uids))):
                driver.submit(int(plan.priority[i]), plan.replica[i], plan.predicted[i], prompt_tokens=tokens,
                              group=uids[i])
            self.lengthsched_driver = driver
            driver.start()
            try:
                output = await super().lengthsched_run(prompts, plan)
            finally:
                stats = await driver.stop()
            timing = output.meta_info.setdefault("timing", {})
            timing["lengthsched/steals"] = stats.steals
            timing["lengthsched/moves"] = stats.moves
            timing["lengthsched/steal_cancelled"] = stats.cancelled
            return output

    LengthschedStealingAgentLoopManager.__module__ = __name__
    return LengthschedStealingAgentLoopManager


# ----------------------------------------------------------------------------- classes made from verl on access
_MADE: dict[str, type] = {}


def _import(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"verl is not installed (or its vLLM server needs vLLM {VLLM_VERSION}): pip install "
                          f"'lengthsched[verl]': {exc}") from None


def _lazy(name: str) -> type:
    if name in _MADE:
        return _MADE[name]
    if name == "LengthschedVLLMHttpServer":
        made = make_vllm_server_class(_import("verl.workers.rollout.vllm_rollout.vllm_async_server").vLLMHttpServer)
    elif name == "LengthschedVLLMReplica":
        made = make_vllm_replica_class(_import("verl.workers.rollout.vllm_rollout.vllm_async_server").vLLMReplica,
                                       _lazy("LengthschedVLLMHttpServer"))
    elif name == "StealingLLMServerClient":
        made = make_stealing_client_class(_import("verl.workers.rollout.llm_server").FullyAsyncLLMServerClient)
    else:  # LengthschedStealingAgentLoopManager
        from . import verl as lv

        made = make_stealing_agent_loop_manager_class(lv.LengthschedAgentLoopManager, _lazy("StealingLLMServerClient"))
        register_vllm_server()
    _MADE[name] = made
    return made


def __getattr__(name: str) -> Any:
    """The verl-derived classes, made on first access (verl loads the manager by name):
    ``LengthschedStealingAgentLoopManager`` (also registers ``LengthschedVLLMReplica`` for ``vllm``),
    ``StealingLLMServerClient``, ``LengthschedVLLMHttpServer`` and ``LengthschedVLLMReplica`` (need vLLM)."""
    if name not in ("LengthschedStealingAgentLoopManager", "StealingLLMServerClient", "LengthschedVLLMHttpServer",
                    "LengthschedVLLMReplica"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _lazy(name)
