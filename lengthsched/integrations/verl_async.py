"""lengthsched inside verl's fully asynchronous recipe: each group placed by predicted work, stealing for the run.

verl 0.9.1's fully asynchronous recipe (``verl/experimental/fully_async_policy``) streams prompts: its
rollouter hands one prompt's ``rollout.n`` rows at a time to ``FullyAsyncAgentLoopManager
.generate_sequences_single``, up to ``max_concurrent_samples`` groups in flight, while the learner trains
on earlier ones; every ``trigger_parameter_sync_step`` learner steps the weights are synced, which aborts
every request in flight (``abort_all_requests``: vLLM's ``pause_generation``) and the recipe's
``FullyAsyncLLMServerClient`` resubmits each after 1 s with the tokens it had (partial rollout). Its
router sends every request to the server with the fewest in flight, so a group's samples spread over the
replicas and each replica prefills and holds the group's prompt.

The simulator put lengthsched's placement and stealing inside that loop (``simulate.run_verl_async(...,
router="placed", steal=True)``) and found 4-5% more tokens per second than the recipe at its default
staleness threshold with a learner a quarter or half as slow as the rollout, from tight KV pools where
a whole group holds its prompt once (docs/benchmarks.md, verl section). This module builds it, on verl
0.9.1's code (read from its wheel; tested with fakes built from it and, where verl installs, against its
real classes; not run on a cluster or a GPU):

- :class:`StreamPlacer` (numpy only): places one group at a time as the simulator's ``placed`` router
  does: over ``ways`` replicas (:func:`~lengthsched.integrations.rollout.spread_ways` over the groups the
  recipe keeps in flight, estimated from the groups seen: ``concurrency`` of them with the mean prompt
  and predicted work; 1 is whole groups), its runs onto the replicas with the least predicted tokens in
  flight (:func:`~lengthsched.integrations.rollout.place_ways` with ``loads``), and gives every row a
  priority unique for the run whose residue modulo the replicas is its replica (what
  :class:`~lengthsched.integrations.verl.PlannedLoadBalancer` routes by);
- ``LengthschedFullyAsyncAgentLoopManager`` (made from verl's ``FullyAsyncAgentLoopManager`` on first
  access, :func:`make_fully_async_manager_class`): its ``generate_sequences_single`` predicts the group's
  length (:class:`~lengthsched.integrations.verl.RolloutPlanner`'s predictor, by default the online
  predictor learning from every group that comes back, one rollout step per weight version), places it,
  writes the ``priority`` column and submits its rows to one
  :class:`~lengthsched.integrations.verl_stealing.StealDriver` that runs for the whole run (started with
  the first group, restarted when the router's servers change); it swaps the client verl hands it for
  the stealing client (moved requests resubmitted at once, vLLM ids that carry each request's row and
  progress, so a request resumed after a weight update is followed);
- :func:`install` puts both into the recipe: ``_init_async_rollout_manager`` reads
  ``FullyAsyncAgentLoopManager`` and ``FullyAsyncLLMServerClient`` as module globals of
  ``fully_async_rollouter`` when the rollouter starts, in the rollouter's Ray actor, so they are replaced
  there; it also registers the vLLM replica class with snapshots
  (:func:`~lengthsched.integrations.verl_stealing.register_vllm_server`). :func:`setup_hook` is a Ray
  ``worker_process_setup_hook`` that installs them in every worker process (when the recipe's module is
  imported there); ``python -m lengthsched.integrations.verl_async <verl overrides>`` runs verl's
  ``fully_async_main`` with the hook set.

Settings: the trainer config's ``lengthsched`` section as for the stealing manager (``steal.pool_tokens``
required: each replica's KV pool in tokens; ``steal.poll_interval``, ``steal.chunk``, ``predictor``,
``default_length``) plus ``ways`` (fix the spread instead of estimating it) and ``concurrency`` (groups in
flight; default the recipe's ``max_concurrent_samples``: replicas x ``async_training
.concurrent_samples_per_replica``, at most ``ppo_mini_batch_size x require_batches x
(staleness_threshold + 1) x trigger_parameter_sync_step``). The router must be
:class:`~lengthsched.integrations.verl.PlannedLoadBalancer` (``rollout.router_config_path``), the
rollout vLLM (SGLang servers expose no snapshots).

Importing this module imports neither verl, Ray nor torch.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import logging
import runpy
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidArgument, check_int, check_positive_float
from .rollout import PREFILL_SHARE, place_ways, spread_ways
from .verl import (
    VERL_VERSION,
    _number,
    _options,
    _setting,
    _use_workers,
    batch_prompt_tokens,
    planner_from_config,
    refuse_sgpo,
    response_lengths,
)
from .verl_stealing import RunDriver, StealDriver, on_import, steal_options, stealing_client

__all__ = [
    "ASYNC_MANAGER_CLASS",
    "RECIPE_MODULE",
    "SETUP_HOOK",
    "StreamPlacer",
    "concurrency_of",
    "install",
    "learner_groups_of",
    "make_fully_async_manager_class",
    "setup_hook",
]

RECIPE_MODULE = "verl.experimental.fully_async_policy.fully_async_rollouter"
ENTRY_MODULE = "verl.experimental.fully_async_policy.fully_async_main"  # the recipe's entry point (Hydra main)
ASYNC_MANAGER_CLASS = "lengthsched.integrations.verl_async.LengthschedFullyAsyncAgentLoopManager"
SETUP_HOOK = "lengthsched.integrations.verl_async.setup_hook"
#: The recipe's default groups in flight per replica (``async_training.concurrent_samples_per_replica``).
CONCURRENT_PER_REPLICA = 16
_MISSING = f"verl's fully asynchronous recipe is not importable: pip install 'lengthsched[verl]' (verl=={VERL_VERSION})"

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- placing a stream of groups
class StreamPlacer:
    """Places a stream of groups, one at a time, as the simulator's ``placed`` router (numpy only).

    ``pool_tokens``: each replica's KV pool in tokens (prompts included). ``concurrency``: groups in
    flight at a time (the recipe's ``max_concurrent_samples``); with ``ways`` None each group is spread
    over :func:`~lengthsched.integrations.rollout.spread_ways` replicas of ``concurrency`` groups with the
    mean prompt and the mean predicted work of the groups placed so far (the simulator decides it once
    from the groups first in flight; this follows a stream whose prompts change), at most ``1 +
    prefill_share x`` predicted work / prompt tokens (:data:`~lengthsched.integrations.rollout.PREFILL_SHARE`:
    every replica a group spreads over prefills its prompt again, for every group of the stream; None: no
    cap). ``ways``: a fixed spread instead (1: whole groups), but with fewer groups in flight than replicas
    at least ``ceil(replicas / concurrency)`` (whole groups, 4 in flight on 8 replicas, left half of them idle:
    6.9% fewer trained tokens per second than AReaL's round robin in the model, CASTILLO 64 x 16, pools of
    16 x L_max). A group spread over every replica continues a
    round robin from where the last one stopped (the simulator starts each at replica 0: the same where the
    group size is a multiple of the replicas).

    :meth:`place` returns each row's replica and a priority ``(ROW_BASE + row number) x replicas +
    replica``: unique for the run (verl's router takes a priority held by a request in flight for someone
    else's), apart from the small priorities verl gives validation batches (0 to n - 1: the driver, which
    keys rows by priority, must not take a validation request for a row), and increasing, so that an engine
    that schedules by priority starts rows in the order they came.
    """

    #: Row numbers start here (see the class docstring); priorities stay below 2**63 up to 2**31 replicas.
    ROW_BASE = 2**32

    def __init__(self, pool_tokens: int, *, concurrency: int | None = None, ways: int | None = None,
                 prefill_share: float | None = PREFILL_SHARE):
        self.pool_tokens = check_int("pool_tokens", pool_tokens, minimum=1)
        self.prefill_share = None if prefill_share is None else check_positive_float("prefill_share", prefill_share)
        self.concurrency = None if concurrency is None else check_int("concurrency", concurrency, minimum=1)
        self.ways = None if ways is None else check_int("ways", ways, minimum=1)
        self.groups = 0  # groups placed
        self.rows = 0  # rows placed (the next row number)
        self._prompt_sum = 0.0  # tokens, over the groups placed
        self._work_sum = 0.0  # predicted tokens, over the groups placed
        self.last_ways: int | None = None

    def ways_for(self, replicas: int) -> int:
        """Over how many replicas the next group is spread (see the class docstring)."""
        replicas = check_int("replicas", replicas, minimum=1)
        c = self.concurrency if self.concurrency is not None else replicas * CONCURRENT_PER_REPLICA
        if self.ways is not None:  # at least enough replicas per group for the groups in flight to reach them all
            return min(max(self.ways, -(-replicas // c)), replicas)
        if not self.groups:
            return replicas
        prompt = int(round(self._prompt_sum / self.groups))
        work = self._work_sum / self.groups * c
        if work <= 0:
            return spread_ways([prompt] * c, self.pool_tokens, replicas)
        return spread_ways([prompt] * c, self.pool_tokens, replicas, work_tokens=work,
                           prefill_share=self.prefill_share)

    def place(self, predicted: Sequence[float], prompt_tokens: int, replicas: int,
              loads: Sequence[float] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One group: ``predicted`` (tokens per row, the group's rows in order), its prompt (tokens),
        the ``replicas`` and their ``loads`` (predicted tokens in flight on each; None: idle). Returns
        (replica per row, priority per row), int64."""
        pred = np.asarray(predicted, dtype=np.float64).reshape(-1)
        if pred.size == 0 or not np.all(np.isfinite(pred)) or np.any(pred < 0):
            raise InvalidArgument("predicted", f"{pred.size} values", "one finite length >= 0 per row of the group")
        prompt_tokens = check_int("prompt_tokens", prompt_tokens, minimum=0)
        replicas = check_int("replicas", replicas, minimum=1)
        self._prompt_sum += prompt_tokens
        self._work_sum += float(pred.sum())
        self.groups += 1
        ways = self.last_ways = self.ways_for(replicas)
        replica = place_ways(pred, [pred.size], replicas, ways, loads=loads)
        if ways >= replicas:  # verl's spread: start where the last group stopped, as a round robin would
            replica = (replica + self.rows) % replicas
        priority = (self.ROW_BASE + self.rows + np.arange(pred.size, dtype=np.int64)) * replicas + replica
        self.rows += pred.size
        return replica.astype(np.int64), priority.astype(np.int64)


def learner_groups_of(config: Any) -> int | None:
    """Groups per weight version in verl's recipe: ``ppo_mini_batch_size x async_training.require_batches
    x trigger_parameter_sync_step`` (None when the config lacks them)."""
    mini = _number(config, "actor_rollout_ref.actor.ppo_mini_batch_size")
    if mini is None:
        return None
    batches = _number(config, "async_training.require_batches", 1.0)
    trigger = _number(config, "async_training.trigger_parameter_sync_step", 1.0)
    return max(1, int(mini * batches * trigger))


def concurrency_of(config: Any, replicas: int) -> int:
    """The recipe's ``max_concurrent_samples`` (groups in flight) for ``replicas``: replicas x
    ``async_training.concurrent_samples_per_replica`` (default 16), at most :func:`learner_groups_of` x
    (``staleness_threshold`` + 1); ``lengthsched.concurrency`` overrides it."""
    replicas = check_int("replicas", replicas, minimum=1)
    configured = _options(config).get("concurrency")
    if configured is not None:
        return check_int("lengthsched.concurrency", configured, minimum=1)
    per = _number(config, "async_training.concurrent_samples_per_replica", CONCURRENT_PER_REPLICA)
    out = int(replicas * per)
    version = learner_groups_of(config)
    if version is not None:
        out = min(out, int(version * (_number(config, "async_training.staleness_threshold", 1.0) + 1)))
    return max(1, out)


# ----------------------------------------------------------------------------- the manager
def make_fully_async_manager_class(base: type, client_class: type, worker_class: Any = None) -> type:
    """``LengthschedFullyAsyncAgentLoopManager``: ``base`` (verl 0.9.1's ``FullyAsyncAgentLoopManager``)
    whose ``generate_sequences_single`` (one prompt's rows) places the group by predicted work
    (:class:`StreamPlacer`), writes the rows' ``priority`` (the router sends each row to its replica), and
    submits the rows to a :class:`~lengthsched.integrations.verl_stealing.StealDriver` running for the whole
    run; when the group is back it lets the driver go of its rows and feeds the predictor their lengths
    (as rollout step = groups seen / :func:`learner_groups_of`). ``client_class``: the stealing client
    (:func:`~lengthsched.integrations.verl_stealing.make_stealing_client_class` of verl's
    ``FullyAsyncLLMServerClient``), which replaces a client of another class at construction (its router
    and ``only_hybrid`` kept). ``worker_class``: the agent-loop worker actor class to run unless ``base`` names its
    own (:func:`install`: ``ray.remote`` of :mod:`~lengthsched.integrations.verl`'s ``LengthschedAgentLoopWorker``,
    whose sessions' requests, a multi-turn loop's turns included, all carry their priority); None keeps verl's.
    Validation batches (``generate_sequences``) run as verl runs them.
    """

    class LengthschedFullyAsyncAgentLoopManager(RunDriver, base):  # type: ignore[misc, valid-type]
        """verl's fully-async agent-loop manager with lengthsched's placement and stealing."""

        def __init__(self, config, llm_client, *args: Any, **kwargs: Any):
            refuse_sgpo(config, "the fully asynchronous recipe repeats every prompt rollout.n times")
            self.lengthsched_steal = steal_options(config)
            engine = _setting(config, "actor_rollout_ref.rollout.name")
            if engine not in (None, "vllm"):
                raise InvalidArgument("actor_rollout_ref.rollout.name", engine,
                                      "'vllm': lengthsched's stealing reads vLLM servers' snapshots (install the "
                                      "integration only for vLLM rollouts)")
            options = _options(config)
            ways = options.get("ways")
            self.lengthsched_ways = None if ways is None else check_int("lengthsched.ways", ways, minimum=1)
            share = options.get("prefill_share", PREFILL_SHARE)  # present and null: no cap
            self._lengthsched_prefill_share = None if share is None else check_positive_float(
                "lengthsched.prefill_share", share)
            _use_workers(self, worker_class)
            super().__init__(config, stealing_client(llm_client, client_class), *args, **kwargs)
            self.lengthsched_planner = planner_from_config(config)
            self.lengthsched_placer: StreamPlacer | None = None
            self._lengthsched_keep_driver()
            self.lengthsched_groups_back = 0
            self._lengthsched_version = learner_groups_of(config)

        async def lengthsched_driver_for(self) -> StealDriver:
            """The driver for the router's current servers (started with the first group; a new one when
            the servers change, as the recipe's dynamic resources add and remove hybrid replicas, which
            takes over the old one's requests in flight on the servers that stayed: an added replica can
            steal them at once; those on a removed server come back into view where verl resubmits them)."""
            lock = self.__dict__.setdefault("_lengthsched_lock", asyncio.Lock())
            async with lock:  # groups start concurrently: one driver
                return await self._lengthsched_driver_for()

        async def _lengthsched_driver_for(self) -> StealDriver:
            if await self._lengthsched_current_driver(self.llm_client._load_balancer, self.lengthsched_steal):
                concurrency = concurrency_of(self.config, len(self.lengthsched_servers))
                if self.lengthsched_placer is None:
                    self.lengthsched_placer = StreamPlacer(
                        self.lengthsched_steal.pool_tokens, ways=self.lengthsched_ways, concurrency=concurrency,
                        prefill_share=self._lengthsched_prefill_share)
                else:
                    self.lengthsched_placer.concurrency = concurrency
            return self.lengthsched_driver

        async def generate_sequences_single(self, prompts: Any) -> Any:
            driver = await self.lengthsched_driver_for()
            ntb = prompts.non_tensor_batch
            uids, keys, work = self.lengthsched_planner.predict(ntb)
            tokens = batch_prompt_tokens(ntb, len(uids))
            replicas = driver.coordinator.replicas
            replica = np.zeros(len(uids), dtype=np.int64)
            priority = np.zeros(len(uids), dtype=np.int64)
            for group in dict.fromkeys(uids):  # the recipe hands over one group; a batch of several, each in turn
                rows = [i for i, u in enumerate(uids) if u == group]
                replica[rows], priority[rows] = self.lengthsched_placer.place(
                    [work[i] for i in rows], max(tokens[i] for i in rows), replicas, loads=driver.coordinator.loads())
                for i in rows:
                    driver.submit(int(priority[i]), int(replica[i]), float(work[i]), prompt_tokens=tokens[i],
                                  group=uids[i])
            ntb["priority"] = priority
            try:
                output = await super().generate_sequences_single(prompts)
            finally:  # the driver that took the rows over, if the servers changed meanwhile, lets them go too
                for d in dict.fromkeys([driver, self.lengthsched_driver]):
                    for p in priority:
                        d.finish(int(p))
            self.lengthsched_groups_back += len(set(uids))
            version = self._lengthsched_version  # groups per weight version: one rollout step of the predictor
            step = self.lengthsched_groups_back // version if version else 0
            self.lengthsched_planner.observe(keys, response_lengths(output), step=step)
            return output

        def lengthsched_status(self) -> dict[str, Any]:
            """What lengthsched did so far: groups placed, the last spread, and the driver's
            (:meth:`~lengthsched.integrations.verl_stealing.RunDriver.lengthsched_driver_status`)."""
            placer = self.lengthsched_placer
            return {"groups": placer.groups if placer else 0, "ways": placer.last_ways if placer else None,
                    **self.lengthsched_driver_status()}

    LengthschedFullyAsyncAgentLoopManager.__module__ = __name__
    return LengthschedFullyAsyncAgentLoopManager


# ----------------------------------------------------------------------------- installing it into the recipe
_VERL_WORKER = object()  # install's default worker class (see there)


def _verl_worker() -> Any:
    """``ray.remote`` of :mod:`~lengthsched.integrations.verl`'s ``LengthschedAgentLoopWorker`` (needs verl and Ray)."""
    from . import verl as lv

    return importlib.import_module("ray").remote(lv.LengthschedAgentLoopWorker)


def install(module: Any = None, registry: Any = None, worker_class: Any = _VERL_WORKER) -> Any:
    """Replace ``FullyAsyncAgentLoopManager`` and ``FullyAsyncLLMServerClient`` in verl's recipe module
    (``module``; default :data:`RECIPE_MODULE`, imported) by lengthsched's manager and stealing client,
    and register the vLLM replica class with snapshots in ``registry`` (default verl's
    ``RolloutReplicaRegistry``). The rollouter reads both globals when it starts
    (``_init_async_rollout_manager``), so this must run in the rollouter's process before it starts
    (:func:`setup_hook`). ``worker_class``: the agent-loop worker actor class the manager runs (default
    ``ray.remote`` of :mod:`~lengthsched.integrations.verl`'s ``LengthschedAgentLoopWorker``, made from verl's: every
    request of a session, a multi-turn loop's turns included, carries its priority; None: verl's own). Idempotent;
    returns the module."""
    from . import verl_stealing as vs

    if module is None:
        try:
            module = importlib.import_module(RECIPE_MODULE)
        except ImportError as exc:
            raise ImportError(f"{_MISSING}: {exc}") from None
    for name in ("FullyAsyncAgentLoopManager", "FullyAsyncLLMServerClient"):
        if not isinstance(getattr(module, name, None), type):
            raise InvalidArgument("module", getattr(module, "__name__", module),
                                  f"verl's fully_async_rollouter module (a class {name})")
    if getattr(module.FullyAsyncAgentLoopManager, "_lengthsched_installed", False):
        return module
    if worker_class is _VERL_WORKER:
        worker_class = _verl_worker()
    client = vs.make_stealing_client_class(module.FullyAsyncLLMServerClient)
    manager = make_fully_async_manager_class(module.FullyAsyncAgentLoopManager, client, worker_class)
    manager._lengthsched_installed = True
    _MADE["LengthschedFullyAsyncAgentLoopManager"] = manager
    module.FullyAsyncAgentLoopManager, module.FullyAsyncLLMServerClient = manager, client
    vs.register_vllm_server(registry)
    log.info("lengthsched installed in %s", getattr(module, "__name__", module))
    return module


def install_on_import(name: str | None = None, then: Any = None) -> bool:
    """``then(module)`` (default :func:`install`) on module ``name`` (default :data:`RECIPE_MODULE`) now if it
    is imported, else right after it is (:func:`~lengthsched.integrations.verl_stealing.on_import`). Returns True
    when it ran now."""
    return on_import(RECIPE_MODULE if name is None else name, install if then is None else then)


def setup_hook() -> None:
    """A Ray ``worker_process_setup_hook`` (name it by :data:`SETUP_HOOK` in the job's ``runtime_env``:
    verl's ``run_ppo`` merges ``ray_kwargs.ray_init.runtime_env`` into its own): :func:`install` in the
    worker process when verl's recipe module is imported there. Imports nothing heavy itself."""
    install_on_import()


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m lengthsched.integrations.verl_async <Hydra overrides>``: verl's
    ``fully_async_main`` with :func:`setup_hook` as the job's ``worker_process_setup_hook`` (added unless
    the overrides set one) and :func:`install` in this process."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not any("worker_process_setup_hook" in a for a in args):
        args.append(f"++ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={SETUP_HOOK}")
    install_on_import()  # the entry imports the recipe module: patched as it is
    if importlib.util.find_spec(ENTRY_MODULE.rpartition(".")[0]) is None:
        raise ImportError(_MISSING)
    sys.argv = [sys.argv[0], *args]
    # as ``python -m`` runs it: Hydra finds the recipe's config directory beside the entry's file only then
    runpy.run_module(ENTRY_MODULE, run_name="__main__", alter_sys=True)


# ----------------------------------------------------------------------------- the class made from verl on access
_MADE: dict[str, type] = {}


def __getattr__(name: str) -> Any:
    """``LengthschedFullyAsyncAgentLoopManager``, made from verl's recipe on first access (installing it)."""
    if name != "LengthschedFullyAsyncAgentLoopManager":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _MADE:
        install()
    return _MADE[name]


if __name__ == "__main__":
    main()
