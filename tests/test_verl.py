"""lengthsched.integrations.verl: the planner, the router, the agent-loop manager and the config helper.

Two layers. Without verl (CI, this project's venv): fakes built from verl 0.9.1's signatures and
behaviour (the manager's ``generate_sequences``, ``LLMServerClient.generate``, a vLLM server that
records what it is sent) carry a whole rollout batch from the manager to the engines. Where verl
0.9.1 is importable (``pip install 'lengthsched[verl]'``: it installs on a CPU next to the CPU build
of torch), the same checks run against verl's real classes (``AgentLoopManager``,
``LLMServerClient``, ``DataProto``, the router plugin loader, the Hydra config), with only the Ray
actors and the inference servers faked, and the fakes' signatures are compared with verl's.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import lengthsched as ls
from lengthsched import InvalidArgument, OnlineLengthPredictor
from lengthsched.integrations import plan_rollout
from lengthsched.integrations import verl as lv
from lengthsched.integrations import verl_stealing as vs
from lengthsched.online import state_key

ROOT = Path(__file__).resolve().parent.parent
QWEN = ls.ModelMemory.from_preset("qwen3-1.7b")
C = 114_688  # Qwen3-1.7B KV bytes per token


def _verl_importable() -> bool:
    try:
        importlib.import_module("verl.experimental.agent_loop.agent_loop")
        importlib.import_module("verl.workers.rollout.router")
    except Exception:  # noqa: BLE001 - verl absent, or installed without the modules its router needs
        return False
    return True


VERL = _verl_importable()
requires_verl = pytest.mark.skipif(not VERL, reason="verl 0.9.1 is not importable (pip install 'lengthsched[verl]')")


# ----------------------------------------------------------------------------- Ray and verl stand-ins
class _Done:
    """An awaitable that is already resolved (what awaiting a finished Ray ObjectRef gives)."""

    def __init__(self, value: Any):
        self.value = value

    def __await__(self):
        return self.value
        yield  # unreachable: makes this a generator


class Remote:
    """A Ray actor handle: ``handle.method.remote(*args, **kwargs)`` runs the method at once (as Ray
    runs it whether or not the caller awaits: verl's release is fire-and-forget) and returns an
    awaitable of its result."""

    def __init__(self, obj: Any):
        self._obj = obj

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._obj, name)

        def remote(*args: Any, **kwargs: Any) -> Any:
            out = method(*args, **kwargs)
            return out if inspect.isawaitable(out) else _Done(out)

        return SimpleNamespace(remote=remote)


class FakeVLLMServer:
    """verl 0.9.1's vLLM server actor (workers/rollout/vllm_rollout/vllm_async_server.py):
    ``generate(prompt_ids, sampling_params, request_id, image_data=None, video_data=None,
    audio_data=None, mm_processor_kwargs=None, priority=0, kv_transfer_params=None)``. It records
    each request in arrival order and answers with a completion of the prompt's true length."""

    def __init__(self, name: str, true_length):
        self.name, self.true_length = name, true_length
        self.requests: list[dict] = []

    def generate(self, prompt_ids, sampling_params, request_id, image_data=None, video_data=None, audio_data=None,
                 mm_processor_kwargs=None, priority=0, kv_transfer_params=None):
        self.requests.append({"prompt_ids": list(prompt_ids), "priority": priority, "request_id": request_id})
        return SimpleNamespace(token_ids=[7] * self.true_length(prompt_ids), log_probs=None, extra_fields={},
                               num_preempted=0, routed_experts=None, stop_reason="stop")

    def admission_order(self) -> list[dict]:
        """Requests in the order vLLM's priority queue starts them: (priority, arrival)."""
        return [r for _, r in sorted(enumerate(self.requests), key=lambda x: (x[1]["priority"], x[0]))]


class FakeLLMServerClient:
    """verl 0.9.1's ``LLMServerClient.generate(request_id, *, prompt_ids, sampling_params, ...,
    **kwargs)`` (workers/rollout/llm_server.py): the router gets the fields it declares from the
    keyword arguments (``priority`` among them); the server gets ``priority`` when it is non-zero and
    the rollout is vLLM, and a fresh request id."""

    def __init__(self, config: Any, load_balancer_handle: Any = None, **kwargs: Any):
        self.config, self._load_balancer = config, load_balancer_handle

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, video_data=None,
                       audio_data=None, mm_processor_kwargs=None, **kwargs):
        declared = await self._load_balancer.require_acquire_fields.remote()
        offered = dict(prompt_ids=prompt_ids, sampling_params=sampling_params, image_data=image_data,
                       video_data=video_data, audio_data=audio_data, mm_processor_kwargs=mm_processor_kwargs, **kwargs)
        fields = {name: offered[name] for name in declared if name in offered}
        server_id, server = await self._load_balancer.acquire_server.remote(request_id=request_id, **fields)
        try:
            priority = kwargs.pop("priority", 0)
            rollout = self.config.actor_rollout_ref.rollout.name
            extra = {"priority": priority} if priority != 0 and rollout == "vllm" else {}
            return await server.generate.remote(request_id=uuid.uuid4().hex, prompt_ids=prompt_ids,
                                                sampling_params=sampling_params, **extra)
        finally:  # the release fields the router declares (verl's _release_server)
            released = await self._load_balancer.require_release_fields.remote()
            pool = {"request_id": request_id}
            self._load_balancer.release_server.remote(server_id=server_id,
                                                      **{k: pool[k] for k in released if k in pool})


class FakeBatch:
    """The parts of verl's ``DataProto`` the manager uses: ``non_tensor_batch`` (numpy arrays per
    row), ``batch`` (``response_mask`` per row), ``meta_info``, ``chunk`` and ``concat``."""

    def __init__(self, non_tensor_batch: dict, batch: dict | None = None, meta_info: dict | None = None):
        self.non_tensor_batch, self.batch, self.meta_info = non_tensor_batch, batch or {}, meta_info or {}

    def __len__(self) -> int:
        return len(next(iter(self.non_tensor_batch.values())))

    def chunk(self, chunks: int) -> list[FakeBatch]:
        size = -(-len(self) // chunks)
        return [FakeBatch({k: v[i:i + size] for k, v in self.non_tensor_batch.items()}, meta_info=dict(self.meta_info))
                for i in range(0, len(self), size)]

    @staticmethod
    def concat(parts: list[FakeBatch]) -> FakeBatch:
        ntb = {k: np.concatenate([p.non_tensor_batch[k] for p in parts]) for k in parts[0].non_tensor_batch}
        batch = {k: np.concatenate([p.batch[k] for p in parts]) for k in parts[0].batch}
        return FakeBatch(ntb, batch, dict(parts[0].meta_info))


class FakeAgentLoopManager:
    """verl 0.9.1's ``AgentLoopManager`` (experimental/agent_loop/agent_loop.py): ``__init__(config,
    llm_client, teacher_client=None, reward_loop_worker_handles=None)``; ``generate_sequences``
    fills ``priority`` with ``arange`` only when the column is missing, splits the batch over its
    workers and concatenates what they return."""

    def __init__(self, config, llm_client, teacher_client=None, reward_loop_worker_handles=None):
        self.config, self.llm_client = config, llm_client
        self.agent_loop_workers: list = []

    async def generate_sequences(self, prompts):
        if "priority" not in prompts.non_tensor_batch:
            prompts.non_tensor_batch["priority"] = np.arange(len(prompts), dtype=np.int64)
        chunks = prompts.chunk(len(self.agent_loop_workers))
        outputs = await asyncio.gather(*[worker.generate_sequences.remote(chunk)
                                         for worker, chunk in zip(self.agent_loop_workers, chunks)])
        output = FakeBatch.concat(outputs)
        output.meta_info = {"timing": {}}
        return output


class Worker:
    """An agent-loop worker running verl's single-turn loop: each row's ``priority`` (``int(priority)``,
    as ``SingleTurnAgentLoop.run`` does) goes to ``client.generate`` with a fresh request id; the
    output carries each row's ``response_mask``. ``real`` builds verl ``DataProto`` outputs."""

    def __init__(self, client: Any, width: int, real: bool = False):
        self.client, self.width, self.real = client, width, real

    async def generate_sequences(self, batch):
        rows = range(len(batch))
        outs = await asyncio.gather(*[
            self.client.generate(uuid.uuid4().hex, prompt_ids=list(batch.non_tensor_batch["prompt_ids"][i]),
                                 sampling_params={}, priority=int(batch.non_tensor_batch["priority"][i]))
            for i in rows])
        mask = np.zeros((len(batch), self.width), dtype=np.int64)
        for i, out in enumerate(outs):
            mask[i, :len(out.token_ids)] = 1
        if not self.real:
            return FakeBatch(dict(batch.non_tensor_batch), {"response_mask": mask}, {})
        import torch
        from verl.protocol import DataProto

        n = len(batch)
        tensors = {"prompts": torch.ones(n, 4, dtype=torch.long), "response_mask": torch.as_tensor(mask),
                   "attention_mask": torch.cat([torch.ones(n, 4, dtype=torch.long), torch.as_tensor(mask)], dim=1)}
        metrics = [{"generate_sequences": 0.1, "tool_calls": 0.0, "compute_score": 0.0, "num_preempted": 0}] * n
        return DataProto.from_dict(tensors=tensors, non_tensors=dict(batch.non_tensor_batch),
                                   meta_info={"metrics": metrics})


class Config(dict):
    """A trainer config with attribute access, like the OmegaConf DictConfig verl passes around."""

    def __getattr__(self, name: str) -> Any:
        value = self[name]
        return Config(value) if isinstance(value, dict) else value


def trainer_config(response_length: int = 512, name: str = "vllm", **lengthsched: Any) -> Any:
    data = {"actor_rollout_ref": {"model": {}, "rollout": {"name": name, "response_length": response_length,
                                                           "full_determinism": False}}}
    if lengthsched:
        data["lengthsched"] = lengthsched
    if VERL:
        from omegaconf import OmegaConf

        return OmegaConf.create(data)
    return Config(data)


# A step of 6 prompts x 4 samples; each prompt's completions have the true lengths below (tokens).
TRUE = {f"q{k}": n for k, n in enumerate([400, 60, 300, 50, 200, 80])}
G = 4


def rollout_batch(real: bool, step: int, validate: bool = False) -> Any:
    uids = np.repeat(np.array([f"s{step}-u{k}" for k in range(len(TRUE))], dtype=object), G)
    prompts = [[{"role": "user", "content": q}] for q in TRUE for _ in range(G)]
    raw = np.empty(len(prompts), dtype=object)
    raw[:] = prompts
    ids = np.empty(len(prompts), dtype=object)
    ids[:] = [[k + 1] for k in range(len(TRUE)) for _ in range(G)]
    ntb = {"uid": uids, "raw_prompt": raw, "prompt_ids": ids}
    meta = {"global_steps": step, "validate": validate}
    if not real:
        return FakeBatch(ntb, meta_info=meta)
    import torch
    from verl.protocol import DataProto

    return DataProto.from_dict(tensors={"input_ids": torch.zeros(len(prompts), 2, dtype=torch.long)}, non_tensors=ntb,
                               meta_info=meta)


def true_length(prompt_ids) -> int:
    return list(TRUE.values())[prompt_ids[0] - 1]


def run_pipeline(real: bool, replicas: int = 3, steps: int = 2, placement: str | None = None):
    """A manager (ours over verl's or the fake base) with ``replicas`` fake vLLM servers behind our
    router and verl's client; returns the manager, the servers and the per-step outputs."""
    servers = {f"10.0.0.{r}:8000": FakeVLLMServer(f"s{r}", true_length) for r in range(replicas)}
    router = lv.PlannedLoadBalancer({sid: Remote(s) for sid, s in servers.items()})
    config = trainer_config(response_length=512, **({} if placement is None else {"placement": placement}))
    if real:
        from verl.workers.rollout.llm_server import LLMServerClient

        client = LLMServerClient(config=config, load_balancer_handle=Remote(router))
        manager_cls = lv.LengthschedAgentLoopManager
    else:
        client = FakeLLMServerClient(config, load_balancer_handle=Remote(router))
        manager_cls = lv.make_agent_loop_manager_class(FakeAgentLoopManager)
    manager = manager_cls(config, client)
    manager.agent_loop_workers = [Remote(Worker(client, width=512, real=real)) for _ in range(2)]
    outputs, requests = [], []
    for step in range(1, steps + 1):
        for s in servers.values():
            s.requests.clear()
        batch = rollout_batch(real, step)
        out = manager.generate_sequences(batch) if real else asyncio.run(manager.generate_sequences(batch))
        outputs.append((batch, out))
        requests.append({sid: list(s.requests) for sid, s in servers.items()})
    return manager, router, servers, outputs, requests


# ----------------------------------------------------------------------------- the pipeline
def _check_pipeline(real: bool) -> None:
    manager, router, servers, outputs, requests = run_pipeline(real, placement="groups")
    planner = manager.lengthsched_planner()
    assert planner.steps == 2  # both training batches fed the predictor
    for (batch, out), sent in zip(outputs, requests):
        priority = np.asarray(batch.non_tensor_batch["priority"])
        assert priority.dtype == np.int64 and len(set(priority.tolist())) == len(priority)
        # Every group's samples went to one replica: the one its priority names.
        by_prompt: dict[int, set[str]] = {}
        for sid, reqs in sent.items():
            for r in reqs:
                by_prompt.setdefault(r["prompt_ids"][0], set()).add(sid)
        assert all(len(s) == 1 for s in by_prompt.values()) and len(by_prompt) == len(TRUE)
        assert router.get_total_inflight() == 0
        assert out.meta_info["timing"]["lengthsched/replicas"] == 3
    # Step 2 knows every prompt's length from step 1: groups balanced by work (q0's 400 alone on one
    # replica: the optimal makespan) and on each replica the longest predicted starts first, its
    # priority forwarded to vLLM.
    plan = planner.last_plan
    true_work = [0] * plan.replicas
    for key, replica in zip(plan.group_keys, plan.group_replica):
        true_work[replica] += G * list(TRUE.values())[int(key.split("-u")[1])]
    assert max(true_work) == G * 400 and sum(true_work) == G * sum(TRUE.values())  # optimal: q0 alone is the max
    assert 1.0 <= outputs[1][1].meta_info["timing"]["lengthsched/predicted_work_max_over_mean"] < 1.2
    for sid, reqs in requests[1].items():
        started = [true_length(r["prompt_ids"]) for r in servers[sid].admission_order()]
        assert started == sorted(started, reverse=True) and len(started) > 0
        zeros = [r for r in reqs if r["priority"] == 0]
        assert len(zeros) <= 1  # priority 0 is vLLM's default, which verl does not send
    assert router.planned == 2 * len(TRUE) * G and router.unplanned == 0


def test_manager_plans_routes_and_forwards_priorities_through_verls_path_fakes():
    _check_pipeline(real=False)


def test_by_default_the_plan_spreads_groups_as_verl_does_and_orders_each_replica_longest_first():
    manager, router, servers, outputs, requests = run_pipeline(real=False)
    plan = manager.lengthsched_planner().last_plan
    assert plan.placement == "spread" and plan.replica == tuple(i % 3 for i in range(len(TRUE) * G))
    for sent in requests:
        by_prompt: dict[int, set[str]] = {}
        for sid, reqs in sent.items():
            for r in reqs:
                by_prompt.setdefault(r["prompt_ids"][0], set()).add(sid)
        assert all(len(s) == 3 for s in by_prompt.values())  # G = 4 samples over the 3 replicas
        assert sorted(len(reqs) for reqs in sent.values()) == [8, 8, 8]
    for sid in servers:  # step 2 knows every prompt's length: the longest starts first on every replica
        started = [true_length(r["prompt_ids"]) for r in servers[sid].admission_order()]
        assert started == sorted(started, reverse=True) and len(started) == 8
    assert router.planned == 2 * len(TRUE) * G and router.unplanned == 0
    with pytest.raises(InvalidArgument, match="placement"):
        lv.planner_from_config(trainer_config(placement="lpt"))


@requires_verl
def test_manager_plans_routes_and_forwards_priorities_through_verls_real_classes():
    _check_pipeline(real=True)


def test_validation_batches_are_planned_but_do_not_feed_the_predictor():
    manager, *_ = run_pipeline(real=False, steps=1)
    planner = manager.lengthsched_planner()
    batch = rollout_batch(False, 9, validate=True)
    asyncio.run(manager.generate_sequences(batch))
    assert planner.steps == 1 and "priority" in batch.non_tensor_batch


def test_without_the_planner_verls_priorities_spread_a_group():
    # verl's own priorities (arange) through our router: request k to replica k mod R, as verl's
    # least-loaded router spreads a group; the plan is what keeps a group together.
    servers = {f"s{r}": FakeVLLMServer(f"s{r}", true_length) for r in range(3)}
    router = lv.PlannedLoadBalancer({sid: Remote(s) for sid, s in servers.items()})
    client = FakeLLMServerClient(trainer_config(), load_balancer_handle=Remote(router))
    manager = FakeAgentLoopManager(trainer_config(), client)
    manager.agent_loop_workers = [Remote(Worker(client, width=512))]
    asyncio.run(manager.generate_sequences(rollout_batch(False, 1)))
    assert all({r["prompt_ids"][0] for r in s.requests} == set(range(1, 7)) for s in servers.values())


# ----------------------------------------------------------------------------- the router
def test_router_routes_by_priority_sticks_to_sessions_and_balances_the_rest():
    handles = {"a": "A", "b": "B", "c": "C"}
    lb = lv.PlannedLoadBalancer(handles, {"router_class": lv.ROUTER_CLASS}, max_cache_size=2)
    assert lb.require_acquire_fields() == ["priority"] and lb.require_release_fields() == ["request_id"]
    assert lb.acquire_server("r1", priority=4) == ("b", "B")  # 4 mod 3
    assert lb.acquire_server("r1", priority=0) == ("b", "B")  # a second turn stays where the first went
    assert lb.acquire_server("r2", priority=np.int64(6)) == ("a", "A")
    assert lb.get_inflight_count("b") == 2 and lb.get_total_inflight() == 3
    # Unplanned (no priority, negative): the least loaded, first on ties.
    assert lb.acquire_server("r3") == ("c", "C") and lb.acquire_server("r4", priority=-1)[0] in ("a", "c")
    lb.release_server("b")
    lb.release_server("b")
    lb.release_server("b")  # never below zero
    assert lb.get_inflight_count("b") == 0
    assert lb.get_status()["planned"] == 2 and lb.get_status()["unplanned"] == 2
    # The LRU keeps max_cache_size sessions; a removed server's sessions go elsewhere.
    assert lb.acquire_server("r1", priority=4)[0] == "b"  # r1 was evicted (cache of 2): routed again
    lb.remove_servers(["b"])
    assert lb.get_all_servers() == ["a", "c"] and lb.acquire_server("r1", priority=5)[0] == "c"  # 5 mod 2
    lb.add_servers({"d": "D"})
    assert lb.get_all_servers() == ["a", "c", "d"]
    assert lb.clear_sticky_cache()["cleared_entries"] > 0
    empty = lv.PlannedLoadBalancer({})
    with pytest.raises(RuntimeError, match="No available servers in load balancer"):
        empty.acquire_server("x", priority=1)
    with pytest.raises(InvalidArgument, match="argument 'servers'"):
        lv.PlannedLoadBalancer(["a"])


def test_cache_aware_routing_keeps_siblings_and_turns_together_while_balanced_and_rebalances_otherwise():
    """routing: cache_aware (SGLang's router's rule): a first request goes where the first with the same prompt went,
    a later turn back to its previous server while that turn's prompt is more than 0.3 of its own, both only while
    the loads are balanced; else the server with the fewest in flight. A rerouted request goes where it was sent."""
    lb = lv.PlannedLoadBalancer({"a": "A", "b": "B", "c": "C"}, {"routing": "cache_aware", "balance_abs_threshold": 2,
                                                                 "balance_rel_threshold": 1.5})
    prompt, other = list(range(100)), list(range(1, 101))
    assert [lb.acquire_server(f"s{i}", prompt_ids=prompt)[0] for i in range(3)] == ["a", "a", "a"]  # siblings
    assert lb.acquire_server("t0", prompt_ids=other)[0] == "b"  # another prompt: the fewest in flight
    assert lb.acquire_server("s3", prompt_ids=prompt)[0] == "c"  # a: 3, c: 0 is imbalanced (3 - 0 > 2, 3 > 0)
    for _ in range(3):
        lb.release_server("a", request_id=None)
    # s0's second turn: its first prompt (100 tokens) is 0.5 of 200 -> back to a; s1's (100 of 400) -> the fewest
    assert lb.acquire_server("s0", prompt_ids=list(range(200)))[0] == "a"
    assert lb.acquire_server("s1", prompt_ids=list(range(400)))[0] == "a"  # the fewest (a tie: the first), its own
    assert lb.rebalanced == 0
    assert lb.acquire_server("s2", prompt_ids=list(range(1000)))[0] == "b"  # 100 of 1000: a has 2, b 1
    assert lb.rebalanced == 1
    assert lb.reroute("s0", 2) == "c" and lb.acquire_server("s0", prompt_ids=list(range(5000)))[0] == "c"
    # planned requests keep the plan, whatever the rule
    assert lb.acquire_server("p", priority=4, prompt_ids=prompt)[0] == "b"
    assert lb.get_status()["routing"] == "cache_aware"
    assert lb.clear_sticky_cache()["cleared_entries"] > 0 and not lb._homes and not lb._tokens
    sticky = lv.PlannedLoadBalancer({"a": "A", "b": "B"})
    assert sticky.acquire_server("x")[0] == "a" and sticky.acquire_server("x", prompt_ids=[1] * 999)[0] == "a"
    for kwargs, name in ((dict(routing="random"), "routing"), (dict(cache_threshold=0.5), "cache_threshold"),
                         (dict(routing="cache_aware", cache_threshold=2), "cache_threshold"),
                         (dict(routing="cache_aware", balance_abs_threshold=-1), "balance_abs_threshold"),
                         (dict(routing="cache_aware", balance_rel_threshold=0.5), "balance_rel_threshold")):
        with pytest.raises(InvalidArgument, match=f"argument '{name}'"):
            lv.PlannedLoadBalancer({"a": "A"}, **kwargs)
    with pytest.raises(InvalidArgument, match="argument 'routing'"):
        lv.PlannedLoadBalancer({"a": "A"}, {"routing": "sgl"})


class SlowVLLMServer(FakeVLLMServer):
    """A server whose requests take time (so that they overlap in flight, as on real engines)."""

    async def generate(self, prompt_ids, sampling_params, request_id, priority=0, **kwargs):
        self.requests.append({"prompt_ids": list(prompt_ids), "priority": priority, "request_id": request_id})
        await asyncio.sleep(0.001 * self.true_length(prompt_ids) / 100)
        return SimpleNamespace(token_ids=[7] * self.true_length(prompt_ids), log_probs=None, extra_fields={},
                               num_preempted=0, routed_experts=None, stop_reason="stop")


@pytest.mark.parametrize("real", [False, pytest.param(True, marks=pytest.mark.skipif(not VERL, reason="verl"))])
def test_behind_verls_fully_async_recipe_the_router_balances_requests_without_a_plan(caplog, real):
    """verl 0.9.1's fully asynchronous recipe hands each prompt's n rows to a worker without a priority
    column (FullyAsyncAgentLoopManager.generate_sequences_single), so SingleTurnAgentLoop sends every
    request with priority 0: decoded as a plan, all would go to replica 0. Requests in flight that share
    a priority are not a plan's: they go to the fewest in flight, as verl's own router sends them; a
    priority is free again once its request was released (the id verl passes at release). ``real``:
    through verl's own FullyAsyncLLMServerClient, the recipe's client."""
    servers = {f"s{r}": SlowVLLMServer(f"s{r}", true_length) for r in range(4)}
    router = lv.PlannedLoadBalancer({sid: Remote(s) for sid, s in servers.items()})
    if real:
        from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient

        client = FullyAsyncLLMServerClient(config=trainer_config(), load_balancer_handle=Remote(router))
    else:
        client = FakeLLMServerClient(trainer_config(), load_balancer_handle=Remote(router))

    async def prompt(k: int, n: int = G):  # one prompt's n samples, all in flight together
        await asyncio.gather(*[client.generate(uuid.uuid4().hex, prompt_ids=[k], sampling_params={}, priority=0)
                               for _ in range(n)])

    with caplog.at_level("WARNING", logger="lengthsched.integrations.verl"):
        asyncio.run(prompt(1, n=8))
    assert [len(s.requests) for s in servers.values()] == [2, 2, 2, 2]  # not [8, 0, 0, 0]
    status = router.get_status()
    assert status["total_inflight"] == 0 and (status["planned"], status["unplanned"], status["collisions"]) == (1, 7, 7)
    assert sum("share priority 0" in r.getMessage() for r in caplog.records) == 1  # one warning
    asyncio.run(prompt(2, n=1))  # alone in flight: its 0 reads as a plan's again (replica 0)
    assert len(servers["s0"].requests) == 3 and router.get_status()["planned"] == 2


@pytest.mark.parametrize("real", [False, pytest.param(True, marks=pytest.mark.skipif(not VERL, reason="verl"))])
def test_cache_aware_routing_reads_the_prompt_ids_verls_client_passes(real):
    """routing: cache_aware through verl's client (``real``: verl 0.9.1's own LLMServerClient, which serializes the
    fields a router declares): every request's prompt_ids reach the router; siblings' first requests go together, a
    session's second turn returns to its server, and another prompt goes to the fewest in flight."""
    servers = {f"s{r}": SlowVLLMServer(f"s{r}", true_length) for r in range(2)}
    router = lv.PlannedLoadBalancer({sid: Remote(s) for sid, s in servers.items()}, {"routing": "cache_aware"})
    if real:
        from verl.workers.rollout.llm_server import LLMServerClient

        client = LLMServerClient(config=trainer_config(), load_balancer_handle=Remote(router))
    else:
        client = FakeLLMServerClient(trainer_config(), load_balancer_handle=Remote(router))

    async def session(rid: str, prompt: list[int]):  # two turns of one request id, a tool's answer between them
        await client.generate(rid, prompt_ids=prompt, sampling_params={})
        await client.generate(rid, prompt_ids=prompt + [9] * 5, sampling_params={})

    async def step():
        await asyncio.gather(session("a0", [1, 5, 5]), session("a1", [1, 5, 5]), session("b0", [2, 6, 6]))

    asyncio.run(step())
    assert router._tokens == {"a0": 8, "a1": 8, "b0": 8}
    by_server = {sid: sorted(r["prompt_ids"][0] for r in s.requests) for sid, s in servers.items()}
    assert by_server == {"s0": [1, 1, 1, 1], "s1": [2, 2]} and router.rebalanced == 0
    assert router.get_total_inflight() == 0


def test_the_router_sends_a_request_a_steal_coordinator_moved_to_its_new_replica():
    """A StealCoordinator's Move, applied through reroute: verl's fully-async client resubmits the
    aborted request through acquire_server with the same request id, and it lands on the target."""
    from lengthsched.integrations import StealCoordinator

    lb = lv.PlannedLoadBalancer({"a": "A", "b": "B"})
    coord = StealCoordinator(2, pool_tokens=10_000, chunk=None)
    for rank, rid in enumerate(("r0", "r1", "r2")):
        server, _ = lb.acquire_server(rid, priority=2 * rank)  # all planned on replica 0
        coord.submit(rid, lb.get_all_servers().index(server), predicted=100)
    coord.observe(0, {"r0": 5, "r1": 0, "r2": 0})
    (move,) = coord.decide()  # replica 1 has nothing: it takes the back of replica 0's waiting requests
    assert (move.request, move.source, move.target) == ("r2", 0, 1)
    lb.release_server("a", request_id="r2")  # the abort ends its first attempt
    assert lb.reroute("r2", move.target) == "b"
    assert lb.acquire_server("r2", priority=4) == ("b", "B")  # the resubmission
    assert lb.acquire_server("r1", priority=2) == ("a", "A")  # the others stay
    with pytest.raises(InvalidArgument, match="argument 'replica'"):
        lb.reroute("r2", 2)


# ----------------------------------------------------------------------------- the planner
def test_planner_groups_by_uid_and_predicts_per_prompt():
    planner = lv.RolloutPlanner(ls.ConstantLengthPredictor(100), max_new_tokens=64)
    batch = rollout_batch(False, 1)
    plan, keys = planner.plan_batch(batch, replicas=2)
    assert plan.predicted == (64,) * 24  # capped at the response length
    assert len(plan.group_keys) == 6 and sorted(plan.replica_work) == [3 * 4 * 64] * 2
    assert keys[0] == lv.prompt_key([{"role": "user", "content": "q0"}]) == '[{"content": "q0", "role": "user"}]'
    assert batch.non_tensor_batch["priority"].tolist() == list(plan.priority)
    assert lv.prompt_key("text") == "text" and lv.prompt_key(np.array([{"a": 1}], dtype=object)) == '[{"a": 1}]'
    assert planner.observe(keys, [5] * 24) == 0  # a constant predictor learns nothing
    with pytest.raises(InvalidArgument, match="argument 'lengths'"):
        planner.observe(keys, [5] * 23)
    online = lv.RolloutPlanner(max_new_tokens=512)
    assert online.predictor.default_length == 256
    with pytest.raises(InvalidArgument, match="argument 'non_tensor_batch'"):
        planner.plan({"raw_prompt": np.array(["x"])}, 1)
    with pytest.raises(InvalidArgument, match="argument 'predictor'"):
        lv.RolloutPlanner(object())
    wrong_count = lv.RolloutPlanner(SimpleNamespace(predict=lambda queries: SimpleNamespace(lengths=[1.0])))
    with pytest.raises(InvalidArgument, match="argument 'predictor'"):
        wrong_count.plan(rollout_batch(False, 1).non_tensor_batch, 1)


def test_batch_prompt_tokens_counts_ids_or_estimates_from_the_chat_messages():
    ids = np.empty(2, dtype=object)
    ids[:] = [[1, 2, 3], [4]]
    assert lv.batch_prompt_tokens({"raw_prompt_ids": ids}, 2) == [3, 1]
    raw = np.empty(3, dtype=object)
    raw[:] = [[{"role": "user", "content": "x" * 40}], [{"role": "system", "content": "abc"},
                                                        {"role": "user", "content": "d" * 9}], "y" * 9]
    # characters / 4 (rounded up) + 4 tokens per message; a plain string has no template
    assert lv.batch_prompt_tokens({"raw_prompt": raw}, 3) == [10 + 4, 3 + 8, 3]
    assert lv.batch_prompt_tokens({"uid": np.arange(3)}, 3) == [0, 0, 0]
    assert lv.batch_prompt_tokens({"raw_prompt": raw}, 2) == [0, 0]  # not one per row: unknown
    with pytest.raises(InvalidArgument, match="argument 'rows'"):
        lv.batch_prompt_tokens({}, -1)


def test_planner_with_steals_placement():
    """placement='ways' (the simulator's steal placement, for the stealing manager): plan_rollout's with
    each row's prompt tokens and the pool; it needs pool_tokens, which the config gives as
    lengthsched.pool_tokens or lengthsched.steal.pool_tokens."""
    batch = rollout_batch(False, 1)
    ntb = batch.non_tensor_batch
    planner = lv.RolloutPlanner(ls.ConstantLengthPredictor(100), max_new_tokens=512, placement="ways",
                                pool_tokens=300)
    plan, _ = planner.plan(ntb, replicas=3)
    expected = plan_rollout(ntb["uid"].tolist(), [100] * 24, replicas=3, placement="ways",
                            prompt_lens=lv.batch_prompt_tokens(ntb, 24), budget_tokens=300)
    assert plan.placement == "ways" and plan.replica == expected.replica and plan.priority == expected.priority
    # steal starts each replica's requests in placement order: the ranks follow the batch, so vLLM's
    # priority scheduling starts them as FCFS would
    assert plan.order == "batch"
    for r in range(3):
        assert list(plan.rows_on(r)) == sorted(plan.rows_on(r))
    longest = lv.RolloutPlanner(ls.ConstantLengthPredictor(100), placement="ways", pool_tokens=300, order="longest")
    assert longest.plan(ntb, replicas=3)[0].order == "longest"
    with pytest.raises(InvalidArgument, match="argument 'pool_tokens'"):
        lv.RolloutPlanner(placement="ways")
    with pytest.raises(InvalidArgument, match="argument 'placement'"):
        lv.RolloutPlanner(placement="nope")
    with pytest.raises(InvalidArgument, match="argument 'order'"):
        lv.RolloutPlanner(order="shortest")
    from_steal = lv.planner_from_config(trainer_config(placement="ways", steal={"pool_tokens": 300}))
    assert from_steal.placement == "ways" and from_steal.pool_tokens == 300
    assert lv.planner_from_config(trainer_config(placement="ways", pool_tokens=200)).pool_tokens == 200
    assert lv.planner_from_config(trainer_config(steal={"pool_tokens": 300})).placement == "spread"
    by_default = lv.planner_from_config(trainer_config(steal={"pool_tokens": 300}), default_placement="ways")
    assert by_default.placement == "ways" and by_default.pool_tokens == 300
    with pytest.raises(InvalidArgument, match="argument 'pool_tokens'"):
        lv.planner_from_config(trainer_config(placement="ways"))


def test_the_default_placement_is_verls_spread_until_the_default_predictor_has_seen_a_length():
    """Without a trained predictor every row is predicted default_length, a made-up number: the planner built
    from a config that names no placement (or auto) plans verl's spread until the predictor was told a length,
    then its placement; a placement the config names, or a predictor it gives, holds from the first batch."""
    ntb = rollout_batch(False, 1).non_tensor_batch
    planner = lv.planner_from_config(trainer_config(steal={"pool_tokens": 300}), default_placement="ways")
    assert not planner.informed and planner.uninformed_placement == "spread"
    assert planner.plan(ntb, replicas=3)[0].placement == "spread"
    keys = planner.predict(ntb)[1]
    planner.observe(keys, [40] * len(keys))
    assert planner.informed and planner.observed == len(keys)
    assert planner.plan(ntb, replicas=3)[0].placement == "ways"
    auto = lv.planner_from_config(trainer_config(placement="auto", steal={"pool_tokens": 300}),
                                  default_placement="ways")
    assert auto.plan(ntb, replicas=3)[0].placement == "spread"
    named = lv.planner_from_config(trainer_config(placement="ways", steal={"pool_tokens": 300}))
    assert named.uninformed_placement is None and named.plan(ntb, replicas=3)[0].placement == "ways"
    given = lv.RolloutPlanner(ls.ConstantLengthPredictor(100), placement="ways", pool_tokens=300,
                              uninformed_placement="spread")
    assert given.informed and given.plan(ntb, replicas=3)[0].placement == "ways"
    bare = lv.RolloutPlanner(ls.OnlineLengthPredictor(), placement="ways", pool_tokens=300,
                             uninformed_placement="spread")  # a given predictor that says it knows nothing
    assert not bare.informed and bare.plan(ntb, replicas=3)[0].placement == "spread"
    with pytest.raises(InvalidArgument, match="argument 'uninformed_placement'"):
        lv.RolloutPlanner(uninformed_placement="ways")


def test_planner_with_length_classes_and_the_recommendation(tmp_path):
    """placement='classes' is plan_rollout's length classes with each row's prompt tokens, the pool,
    the response length and the cost; 'auto' plans classes for a batch whose every prompt was seen in
    an earlier training step with siblings that agreed (what recommend_rollout_policy picks
    steal_classes for), else its fallback."""
    from lengthsched.cost import StepCost
    from lengthsched.placement import CLASSES_MAX_SPREAD, recommend_rollout_policy, sibling_spread

    batch = rollout_batch(False, 1)
    ntb = batch.non_tensor_batch
    predictor = ls.OnlineLengthPredictor(default_length=100)
    planner = lv.RolloutPlanner(predictor, max_new_tokens=512, placement="classes", pool_tokens=2000)
    plan, keys = planner.plan(ntb, replicas=2)
    per_prompt = planner.predictor.predict(list(dict.fromkeys(keys))).lengths
    expected = plan_rollout(ntb["uid"].tolist(), np.repeat(np.round(per_prompt).astype(int), G), replicas=2,
                            placement="classes", prompt_lens=lv.batch_prompt_tokens(ntb, 24), budget_tokens=2000,
                            max_new_tokens=512)
    assert plan.placement == "classes" and plan.order == "longest" and plan.replica == expected.replica
    for kwargs, name in (({"pool_tokens": 2000}, "max_new_tokens"), ({"max_new_tokens": 512}, "pool_tokens"),
                         ({"pool_tokens": 2000, "max_new_tokens": 512, "cost": 3}, "cost"),
                         ({"pool_tokens": 2000, "max_new_tokens": 512, "cost": str(tmp_path / "none.json")}, "cost")):
        for placement in ("classes", "auto"):
            with pytest.raises(InvalidArgument, match=f"argument '{name}'"):
                lv.RolloutPlanner(placement=placement, **kwargs)
    with pytest.raises(InvalidArgument, match="argument 'placement'"):
        lv.RolloutPlanner(placement="auto", pool_tokens=2000, max_new_tokens=512, fallback="classes")
    fitted = StepCost.from_model("qwen3-8b", "H100")
    (tmp_path / "cost.json").write_text(fitted.to_json(), encoding="utf-8")
    from_file = lv.RolloutPlanner(max_new_tokens=512, placement="classes", pool_tokens=2000,
                                  cost=str(tmp_path / "cost.json"))
    assert from_file.cost == fitted

    auto = lv.RolloutPlanner(max_new_tokens=512, placement="auto", pool_tokens=2000)
    assert auto.plan(ntb, replicas=2)[0].placement == "spread"  # nothing seen yet: the fallback
    agree = {key: [n, n + 5, n - 5, n + 10] for key, n in zip(dict.fromkeys(keys), TRUE.values())}
    rows = [agree[k][i % G] for i, k in enumerate(keys)]
    auto.observe(keys, rows)
    assert recommend_rollout_policy(list(agree.values())) == "steal_classes"
    assert auto.placement_for(keys) == "classes"
    assert auto.plan(ntb, replicas=2)[0].placement == "classes"
    assert auto.placement_for(keys + ["unseen prompt"]) == "spread"  # one prompt without history
    disagree = lv.RolloutPlanner(max_new_tokens=512, placement="auto", pool_tokens=2000, fallback="ways")
    disagree.observe(keys, [[10, 900, 40, 300][i % G] for i in range(len(keys))])
    assert sibling_spread(list(disagree.history.values())) > CLASSES_MAX_SPREAD
    plan = disagree.plan(ntb, replicas=2)[0]
    assert plan.placement == "ways" and plan.order == "batch"
    # the latest step with two or more completions of a prompt is what counts
    disagree.observe(keys, rows)
    assert disagree.placement_for(keys) == "classes"

    from_config = lv.planner_from_config(trainer_config(placement="auto", pool_tokens=2000))
    assert (from_config.placement, from_config.fallback, from_config.max_new_tokens) == ("auto", "spread", 512)
    stealing = lv.planner_from_config(trainer_config(placement="auto", steal={"pool_tokens": 2000},
                                                     cost=str(tmp_path / "cost.json"), order="longest"),
                                      default_placement="ways")
    assert (stealing.fallback, stealing.pool_tokens, stealing.order, stealing.cost) == ("ways", 2000, "longest", fitted)
    by_default = lv.planner_from_config(trainer_config(), default_order="batch")
    assert (by_default.order, by_default.default_order) == (None, "batch")
    assert [by_default.order_for(p, r) for p, r in (("ways", 1), ("classes", 2), ("classes", 1))] == \
        ["batch", "batch", "longest"]  # as steal and steal_classes order their queues
    named = lv.planner_from_config(trainer_config(order="batch"), default_order="batch")
    assert named.order_for("classes", 1) == "batch"  # an order the config names holds everywhere
    crowded = lv.planner_from_config(trainer_config(order="longest_crowded"), default_order="batch")
    assert crowded.order_for("ways", 4) == "longest_crowded"  # the plan resolves it: longest where groups are whole
    # the stealing manager's classes plan on one replica: longest predicted first (steal_classes' order
    # where nothing can be stolen); on two, in batch order
    one = lv.RolloutPlanner(max_new_tokens=512, placement="classes", pool_tokens=2000, default_order="batch")
    assert one.plan(ntb, replicas=1)[0].order == "longest" and one.plan(ntb, replicas=2)[0].order == "batch"
    with pytest.raises(InvalidArgument, match="argument 'default_order'"):
        lv.RolloutPlanner(default_order="shortest")


@pytest.fixture
def predictors(monkeypatch):
    """A module ``lengthsched_test_predictors`` with a predictor factory ``make``."""
    monkeypatch.setitem(sys.modules, "lengthsched_test_predictors",
                        SimpleNamespace(make=lambda: ls.ConstantLengthPredictor(32)))


def test_a_planner_resumed_from_its_state_file_plans_and_learns_as_the_one_that_wrote_it(tmp_path):
    path = tmp_path / "planner.json"
    config = trainer_config(placement="auto", pool_tokens=4 * 4096, state_path=str(path))
    first = lv.planner_from_config(config)
    assert first.state_path == str(path) and not path.exists()
    uids = np.repeat(np.array(["u0", "u1", "u2"], dtype=object), 4)
    batch = {"uid": uids, "raw_prompt": np.array([f"question {u}" for u in uids], dtype=object)}
    _, keys = first.plan(batch, replicas=2)
    first.observe(keys, [300, 310, 290, 305, 80, 85, 82, 90, 1200, 1150, 1300, 1250])  # written at once
    saved = path.read_text()
    resumed = lv.planner_from_config(config)  # a run restarted from a checkpoint
    assert (resumed.steps, resumed.observed, resumed.history) == (first.steps, first.observed, first.history)
    a, b = first.plan(batch, replicas=2)[0], resumed.plan(batch, replicas=2)[0]
    assert a == b and a.placement == "classes"  # the history that auto reads came back too
    for planner in (first, resumed):
        planner.observe(keys, [400] * 12, step=5)
    assert first.plan(batch, replicas=2)[0] == resumed.plan(batch, replicas=2)[0]
    assert json.loads(path.read_text())["steps"] == 5 != json.loads(saved)["steps"]
    first.observe(keys[:4], [410] * 4, step=5)  # more of step 5 (an asynchronous rollout): saved within a minute
    assert json.loads(path.read_text())["observed"] == first.observed - 4
    path.write_text("{not json")
    with pytest.raises(InvalidArgument, match="state_path"):
        lv.planner_from_config(config)
    path.write_text(json.dumps({"format": lv.PLANNER_STATE_FORMAT, "steps": 1}))
    with pytest.raises(InvalidArgument, match="state_path"):
        lv.planner_from_config(config)
    with pytest.raises(InvalidArgument, match="state_path"):
        lv.RolloutPlanner(state_path=3)
    fresh = lv.RolloutPlanner()
    with pytest.raises(InvalidArgument, match="path"):
        fresh.save_state()  # no state_path, no path
    fresh.save_state(tmp_path / "other.json")  # a trained predictor would save no predictor state; the default does
    assert json.loads((tmp_path / "other.json").read_text())["predictor"]["format"] == "lengthsched.online-state/1"


def test_planners_take_in_what_the_others_learnt_from_their_state_files(tmp_path):
    paths = [tmp_path / f"rank{k}.json" for k in range(3)]
    planners = [lv.RolloutPlanner(max_new_tokens=4096, state_path=path) for path in paths]
    planners[0].observe(["q0"] * 4, [900, 950, 1000, 1100], step=1)  # each rank learns its own prompts
    planners[1].observe(["q1"] * 4, [40, 50, 45, 55], step=1)
    assert not paths[2].exists()
    taken = planners[2].merge_states(paths)  # its own file is not there yet: skipped, as any missing one
    assert taken == 2 and set(planners[2].history) == {"q0", "q1"}
    asked = {"uid": ["a", "b"], "raw_prompt": ["q0", "q1"]}
    mine = planners[2].predict(asked)[2]
    theirs = [planners[0].predict(asked)[2][0], planners[1].predict(asked)[2][1]]
    # the empirical prior's centre is the first file's (rank 2 had seen nothing): the same as rank 0's, far from
    # rank 1's, yet rank 1's four siblings carry its prompt
    assert mine[0] == theirs[0] and mine[1] == pytest.approx(theirs[1], rel=0.15) and mine[0] > 10 * mine[1]
    assert (planners[2].steps, planners[2].observed) == (0, 0)  # its own counts stay its own
    assert planners[0].merge_states(paths[:1]) == 0  # its own statistics coming back change nothing
    paths[2].write_text("{not json")
    with pytest.raises(InvalidArgument, match="state_path"):
        planners[0].merge_states(paths)
    paths[2].write_text(json.dumps({**planners[1].state(), "predictor": {"format": "other"}}))
    with pytest.raises(InvalidArgument, match="state_path"):
        planners[0].merge_states(paths[2:])


def test_a_planners_partial_state_carries_only_the_prompts_asked_for_and_cannot_be_resumed_from(tmp_path):
    planner = lv.RolloutPlanner(max_new_tokens=4096)
    long_text = "Question: " + "z" * 300
    planner.observe(["q0"] * 2 + [long_text] * 2 + ["q2"] * 2, [900, 950, 40, 50, 300, 320], step=1)
    part = planner.state(prompts=[long_text, "q2", "unknown"])
    assert part["partial"] is True and planner.state()["partial"] is False
    assert sorted(part["history"]) == sorted(part["predictor"]["prompts"]) == sorted([state_key(long_text), "q2"])
    path = tmp_path / "part.json"
    path.write_text(json.dumps(part))
    with pytest.raises(InvalidArgument, match="partial"):
        lv.RolloutPlanner(state_path=path)  # a rank resumes from its whole file only
    other = lv.RolloutPlanner(max_new_tokens=4096)
    assert other.merge_states([path]) == 2 and set(other.history) == {state_key(long_text), "q2"}

    class Trained:  # a predictor whose state_dict takes no prompts: its whole state goes into the partial one
        def predict(self, prompts, **kwargs):
            return OnlineLengthPredictor(default_length=7).predict(prompts)

        def state_dict(self):
            return {"weights": 1}

    assert lv.RolloutPlanner(Trained()).state(prompts=["x"])["predictor"] == {"weights": 1}


def test_a_planner_resumed_from_a_whole_state_replays_the_partial_states_written_after_it(tmp_path):
    planner = lv.RolloutPlanner(max_new_tokens=4096)
    planner.observe(["q0"] * 2 + ["q1"] * 2, [900, 950, 40, 50], step=1)
    planner.save_state(tmp_path / "whole.json")
    paths = []
    for step, (key, lengths) in enumerate([("q1", [60, 70]), ("q2", [300, 320]), ("q0", [10, 20])], start=2):
        planner.observe([key] * 2, lengths, step=step)
        paths.append(tmp_path / f"part{step}.json")
        paths[-1].write_text(json.dumps(planner.state(prompts=[key])))
    resumed = lv.RolloutPlanner(max_new_tokens=4096, state_path=tmp_path / "whole.json")
    assert resumed.replay_states(paths) == 3
    assert resumed.state() == planner.state()  # steps, rows, history and every prompt's statistics
    with pytest.raises(InvalidArgument, match="state_path"):  # older than where it stands now
        resumed.replay_states(paths[:1])
    paths[0].write_text("{not json")
    with pytest.raises(InvalidArgument, match="state_path"):
        lv.RolloutPlanner(max_new_tokens=4096, state_path=tmp_path / "whole.json").replay_states(paths)


def test_a_planners_state_file_holds_a_digest_of_each_long_prompt_not_its_text(tmp_path):
    path = tmp_path / "planner.json"
    config = trainer_config(placement="auto", pool_tokens=4 * 4096, state_path=str(path))
    first = lv.planner_from_config(config)
    texts = [f"A long question number {i}: " + "words " * 100 for i in range(3)]
    uids = np.repeat(np.array(["u0", "u1", "u2"], dtype=object), 4)
    batch = {"uid": uids, "raw_prompt": np.array([texts[int(u[1])] for u in uids], dtype=object)}
    _, keys = first.plan(batch, replicas=2)
    first.observe(keys, [300, 310, 290, 305, 80, 85, 82, 90, 1200, 1150, 1300, 1250])
    saved = path.read_text()
    assert not any(t in saved for t in texts) and saved.count("blake2b:") == 6  # history and predictor
    resumed = lv.planner_from_config(config)
    a, b = first.plan(batch, replicas=2)[0], resumed.plan(batch, replicas=2)[0]
    assert a == b and a.placement == "classes"  # auto found every long prompt's history again


def test_planner_from_config_loads_a_predictor_factory(predictors):
    config = trainer_config(response_length=128, predictor="lengthsched.predictor:ConstantLengthPredictor")
    with pytest.raises(TypeError):  # the class needs its length: give a factory
        lv.planner_from_config(config)
    planner = lv.planner_from_config(trainer_config(response_length=128, predictor="lengthsched_test_predictors:make"))
    assert isinstance(planner.predictor, ls.ConstantLengthPredictor) and planner.max_new_tokens == 128
    assert isinstance(lv.planner_from_config(trainer_config()).predictor, ls.OnlineLengthPredictor)
    with pytest.raises(InvalidArgument, match="argument 'lengthsched.predictor'"):
        lv.planner_from_config(trainer_config(predictor="no.such.module:thing"))


def test_the_legacy_manager_refuses_the_v1_trainers_batches_and_names_the_manager_to_use():
    client = FakeLLMServerClient(trainer_config(), load_balancer_handle=None)
    manager = lv.make_agent_loop_manager_class(FakeAgentLoopManager)(trainer_config(), client)
    with pytest.raises(TypeError, match="trainer.use_v1=False.*verl_v1.LengthschedAgentLoopManagerTQ"):
        asyncio.run(manager.generate_sequences({"uid": ["u0"], "raw_prompt": ["q"]}))  # a TensorDict's columns
    # online sGPO needs the v1 trainer (the legacy one repeats every prompt rollout.n times): refused, not ignored
    with pytest.raises(InvalidArgument, match="'lengthsched.sgpo'.*legacy trainer.*trainer.use_v1=true"):
        lv.make_agent_loop_manager_class(FakeAgentLoopManager)(trainer_config(sgpo={"g_max": 16}), client)
    lv.make_agent_loop_manager_class(FakeAgentLoopManager)(trainer_config(sgpo={"enable": False}), client)


def test_the_manager_needs_verl_only_when_asked_for():
    if VERL:
        assert lv.LengthschedAgentLoopManager.__module__ == "lengthsched.integrations.verl"
    else:
        with pytest.raises(ImportError, match=r"verl is not installed: pip install 'lengthsched\[verl\]'"):
            lv.LengthschedAgentLoopManager  # noqa: B018 - the attribute access is the test
    with pytest.raises(AttributeError):
        lv.NoSuchThing  # noqa: B018


# ----------------------------------------------------------------------------- configuration
def test_verl_rollout_config_by_hand():
    # One group: 16 completions, 8 slots, each reserving 2048 tokens, prompt 512; 8 groups per replica.
    plan = ls.plan_group([2048] * 16, slots=8, max_new_tokens=2048, prompt_tokens=512)
    config = lv.verl_rollout_config(plan, QWEN, gpu_memory_bytes="80GiB", groups_per_replica=8,
                                    predictor="lengthsched_test_predictors:make")
    r = config.rollout
    # KV: per group 512 shared prompt tokens + 8 live x 2048 (16-token blocks: 2048 each), x 8 groups,
    # + the null block = (8 x (512 + 8 x 2048) + 16) x 114688 bytes.
    assert config.setup.kv_bytes == (8 * (512 + 8 * 2048) + 16) * C == 15_503_982_592
    assert r["engine_kwargs"] == {"vllm": {"kv_cache_memory_bytes": 15_503_982_592}}
    assert r["max_num_seqs"] == 64 and r["scheduling_policy"] == "priority" and r["enable_prefix_caching"] is True
    assert r["gpu_memory_utilization"] == config.setup.fraction and r["max_model_len"] == 2560
    assert r["agent"] == {"agent_loop_manager_class": lv.MANAGER_TQ_CLASS}
    assert r["router_config_path"] == "lengthsched_router.yaml"
    assert config.router_yaml == "router_class: lengthsched.integrations.verl.PlannedLoadBalancer\n"
    assert config.overrides() == [
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.scheduling_policy=priority",
        "actor_rollout_ref.rollout.max_num_seqs=64",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={config.setup.fraction}",
        "actor_rollout_ref.rollout.enable_prefix_caching=true",
        "actor_rollout_ref.rollout.max_model_len=2560",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=15503982592",
        f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={lv.MANAGER_TQ_CLASS}",
        "actor_rollout_ref.rollout.router_config_path=lengthsched_router.yaml",
        "trainer.use_v1=true",
        "+lengthsched.predictor=lengthsched_test_predictors:make",
    ]
    # verl 0.9.1 runs its v1 trainer by default; the legacy one (and its manager) on request.
    # verl_selective's replay buffer (the v1 trainer's custom sampler), by the names verl loads it with
    selective = lv.verl_rollout_config(plan, QWEN, gpu_memory_bytes="80GiB", groups_per_replica=8, selective=True)
    assert selective.overrides()[-2:] == [
        "trainer.v1.sampler.custom_sampler.path=pkg://lengthsched.integrations.verl_selective",
        "trainer.v1.sampler.custom_sampler.name=selective_replay_buffer"]
    from lengthsched.integrations import verl_selective

    assert callable(getattr(verl_selective, lv.SELECTIVE_SAMPLER["name"]))
    # the v1 manager's online sGPO: its section, checked here (a state file is not read)
    sgpo = lv.verl_rollout_config(plan, QWEN, gpu_memory_bytes="80GiB", groups_per_replica=8,
                                  sgpo={"g_max": 16, "state_path": "/no/such/dir/sgpo.json"})
    assert sgpo.overrides()[-3:] == ["+lengthsched.sgpo.enable=true", "+lengthsched.sgpo.g_max=16",
                                     "+lengthsched.sgpo.state_path=/no/such/dir/sgpo.json"]
    assert lv.verl_rollout_config(plan, QWEN, gpu_memory_bytes="80GiB", sgpo=True).extra["lengthsched"] == {
        "sgpo": {"enable": True}}
    with pytest.raises(InvalidArgument, match="lengthsched.sgpo.g_min"):
        lv.verl_rollout_config(plan, QWEN, gpu_memory_bytes="80GiB", sgpo={"g_min": 1})
    legacy = lv.verl_rollout_config(plan, QWEN, gpu_memory_bytes="80GiB", groups_per_replica=8, trainer="legacy")
    assert legacy.rollout["agent"] == {"agent_loop_manager_class": lv.MANAGER_CLASS}
    assert legacy.overrides()[-1] == "trainer.use_v1=false"
    tp2 = lv.verl_rollout_config(plan, QWEN, gpu_memory_bytes="80GiB", groups_per_replica=8, tensor_parallel_size=2)
    assert tp2.rollout["engine_kwargs"]["vllm"]["kv_cache_memory_bytes"] == 15_503_982_592 // 2
    assert tp2.rollout["tensor_model_parallel_size"] == 2
    sg = lv.verl_rollout_config(plan, QWEN, gpu_memory_bytes="80GiB", groups_per_replica=2, engine="sglang")
    assert sg.rollout["engine_kwargs"] == {"sglang": {"max_total_tokens": 2 * (512 + 8 * 2048)}}
    assert "scheduling_policy" not in sg.rollout and sg.rollout["max_num_seqs"] == 16
    assert sg.rollout["gpu_memory_utilization"] == sg.setup.engine_kwargs["mem_fraction_static"]


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"engine": "tgi"}, "engine"),
    ({"groups_per_replica": 0}, "groups_per_replica"),
    ({"router_config_path": ""}, "router_config_path"),
    ({"predictor": 3}, "predictor"),
    ({"gpu_memory_bytes": "1GiB"}, "gpu_memory_bytes"),
    ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
    ({"trainer": "v0"}, "trainer"),
    ({"steal": True, "engine": "sglang"}, "steal"),
    ({"steal": 1}, "steal"),
    ({"selective": True, "trainer": "legacy"}, "selective"),
    ({"selective": "yes"}, "selective"),
    ({"sgpo": True, "trainer": "legacy"}, "sgpo"),
    ({"sgpo": "yes"}, "sgpo"),
])
def test_verl_rollout_config_names_bad_arguments(kwargs, name):
    plan = ls.plan_group([2048] * 4, slots=2, max_new_tokens=2048, prompt_tokens=512)
    with pytest.raises(InvalidArgument) as err:
        lv.verl_rollout_config(plan, QWEN, **{"gpu_memory_bytes": "80GiB", **kwargs})
    assert err.value.name == name
    with pytest.raises(InvalidArgument, match="argument 'plan'"):
        lv.verl_rollout_config([1, 2], QWEN, gpu_memory_bytes="80GiB")


def test_example_verl_config_prints_the_overrides(tmp_path):
    script = ROOT / "examples" / "verl_config.py"
    router = tmp_path / "router.yaml"
    result = subprocess.run([sys.executable, str(script), "--group-size", "8", "--slots", "4", "--router-yaml",
                             str(router)], capture_output=True, text=True, check=False, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "actor_rollout_ref.rollout.scheduling_policy=priority" in result.stdout
    assert router.read_text() == (ROOT / "examples" / "verl_router.yaml").read_text().splitlines()[-1] + "\n"
    steal = subprocess.run([sys.executable, str(script), "--steal", "--router-yaml", str(router)],
                           capture_output=True, text=True, check=False, cwd=ROOT)
    assert steal.returncode == 0, steal.stderr
    assert f"++ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={vs.SETUP_HOOK}" in steal.stdout
    assert f"agent_loop_manager_class={lv.STEALING_MANAGER_TQ_CLASS}" in steal.stdout
    launch = (ROOT / "examples" / "verl_grpo_lengthsched.sh").read_text()
    assert "NOT run" in launch and "examples/verl_config.py" in launch and '"${FLAGS[@]}"' in launch
    assert "FLAGS+=(--selective)" in launch
    selective = subprocess.run([sys.executable, str(script), "--steal", "--selective", "--router-yaml", str(router)],
                               capture_output=True, text=True, check=False, cwd=ROOT)
    assert selective.returncode == 0, selective.stderr
    assert f"trainer.v1.sampler.custom_sampler.path={lv.SELECTIVE_SAMPLER['path']}" in selective.stdout
    legacy = subprocess.run([sys.executable, str(script), "--selective", "--trainer", "legacy", "--router-yaml",
                             str(router)], capture_output=True, text=True, check=False, cwd=ROOT)
    assert legacy.returncode == 2 and "'selective'" in legacy.stderr and "Traceback" not in legacy.stderr
    assert "FLAGS+=(--sgpo" in launch
    sgpo = subprocess.run([sys.executable, str(script), "--sgpo", "--sgpo-state", "budget.json", "--router-yaml",
                           str(router)], capture_output=True, text=True, check=False, cwd=ROOT)
    assert sgpo.returncode == 0 and "+lengthsched.sgpo.state_path=budget.json" in sgpo.stdout, sgpo.stderr
    alone = subprocess.run([sys.executable, str(script), "--sgpo-state", "budget.json", "--router-yaml", str(router)],
                           capture_output=True, text=True, check=False, cwd=ROOT)
    assert alone.returncode == 2 and "--sgpo-state PATH only with --sgpo" in alone.stderr
    empty = subprocess.run([sys.executable, str(script), "--sgpo", "--sgpo-state", "", "--router-yaml", str(router)],
                           capture_output=True, text=True, check=False, cwd=ROOT)
    assert empty.returncode == 2 and "--sgpo-state PATH" in empty.stderr
    assert subprocess.run(["bash", "-n", str(ROOT / "examples" / "verl_grpo_lengthsched.sh")]).returncode == 0


# ----------------------------------------------------------------------------- verl's own code
@requires_verl
def test_router_loads_through_verls_plugin_path_and_follows_its_protocol(tmp_path):
    from verl.workers.rollout.router import RequestLoadBalancer, _load_router_yaml, _resolve_router_class

    path = tmp_path / "router.yaml"
    path.write_text(lv.verl_rollout_config(ls.plan_group([64], slots=1, max_new_tokens=64), QWEN,
                                           gpu_memory_bytes="80GiB").router_yaml)
    config = _load_router_yaml(str(path))
    cls = _resolve_router_class(config["router_class"])
    assert cls is lv.PlannedLoadBalancer
    lb = cls({"a": 1, "b": 2}, config)  # _create_plugin_extension: ray.remote(cls).remote(servers, yaml_config)
    protocol = [name for name in vars(RequestLoadBalancer) if not name.startswith("_")]
    assert set(protocol) <= set(dir(lb))
    for name in protocol:
        theirs = inspect.signature(getattr(RequestLoadBalancer, name)).parameters
        ours = inspect.signature(getattr(cls, name)).parameters
        assert [p for p in theirs if p not in ("self", "extra")] == \
            [p for p in ours if p not in ("self", "priority", "prompt_ids")]  # (acquire fields it declares)
    aware_yaml = lv.verl_rollout_config(ls.plan_group([64], slots=1, max_new_tokens=64), QWEN, gpu_memory_bytes="80GiB",
                                        routing="cache_aware").router_yaml
    path.write_text(aware_yaml)
    aware = cls({"a": 1, "b": 2}, _load_router_yaml(str(path)))
    assert aware.routing == "cache_aware" and aware.require_acquire_fields() == ["priority", "prompt_ids"]
    with pytest.raises(InvalidArgument, match="argument 'routing'"):
        lv.verl_rollout_config(ls.plan_group([64], slots=1, max_new_tokens=64), QWEN, gpu_memory_bytes="80GiB",
                               routing="sgl")


@requires_verl
def test_rollout_config_composes_with_verls_hydra_config(predictors):
    import verl
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    plan = ls.plan_group([2048] * 16, slots=8, max_new_tokens=2048, prompt_tokens=512)
    config = lv.verl_rollout_config(plan, QWEN, gpu_memory_bytes="80GiB", groups_per_replica=8,
                                    predictor="lengthsched_test_predictors:make")
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=config.overrides())
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)  # verl's own RolloutConfig validation
    assert rollout.scheduling_policy == "priority" and rollout.max_num_seqs == 64
    assert rollout.engine_kwargs["vllm"] == {"kv_cache_memory_bytes": 15_503_982_592}
    assert rollout.agent.agent_loop_manager_class == lv.MANAGER_TQ_CLASS and cfg.trainer.use_v1 is True
    assert isinstance(lv.planner_from_config(cfg).predictor, ls.ConstantLengthPredictor)
    legacy = lv.verl_rollout_config(plan, QWEN, gpu_memory_bytes="80GiB", trainer="legacy")
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=legacy.overrides())
    assert cfg.trainer.use_v1 is False and cfg.actor_rollout_ref.rollout.agent.agent_loop_manager_class == \
        lv.MANAGER_CLASS
    # Stealing: the trainer's stealing manager, the pool in tokens, and (v1) Ray's setup hook in verl's runtime_env.
    for trainer, manager in lv.STEALING_TRAINERS.items():
        steal = lv.verl_rollout_config(plan, QWEN, gpu_memory_bytes="80GiB", groups_per_replica=8, steal=True,
                                       trainer=trainer)
        with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"),
                                   version_base=None):
            cfg = compose(config_name="ppo_trainer", overrides=steal.overrides())
        assert cfg.actor_rollout_ref.rollout.agent.agent_loop_manager_class == manager
        assert cfg.lengthsched.steal.pool_tokens == 135_168  # 8 x (512 + 8 x 2048) tokens
        assert vs.steal_options(cfg).pool_tokens == 135_168
        hook = cfg.ray_kwargs.ray_init.runtime_env.get("worker_process_setup_hook")
        assert hook == (vs.SETUP_HOOK if trainer == "v1" else None)
        assert cfg.ray_kwargs.ray_init.runtime_env.py_executable is None  # verl's own key kept
    # The v1 manager's online sGPO: its section reaches the composed config and reads as the manager reads it.
    from lengthsched.integrations import verl_v1

    sgpo = lv.verl_rollout_config(plan, QWEN, gpu_memory_bytes="80GiB", sgpo={"g_max": 16, "rule": "pow2"})
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=sgpo.overrides())
    online = verl_v1.online_sgpo(cfg)
    assert online.budget.config.g_max == 16 and online.budget.config.rule == "pow2" and online.state_path is None


@requires_verl
def test_fakes_match_verls_signatures():
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
    from verl.workers.rollout.llm_server import LLMServerClient

    def names(f):
        return list(inspect.signature(f).parameters)

    assert names(FakeAgentLoopManager.__init__) == names(AgentLoopManager.__init__)
    assert names(FakeAgentLoopManager.generate_sequences) == names(AgentLoopManager.generate_sequences)
    assert names(FakeLLMServerClient.generate) == names(inspect.unwrap(LLMServerClient.generate))
    assert names(FakeLLMServerClient.__init__)[:3] == names(LLMServerClient.__init__)[:3]
    for loop in (SingleTurnAgentLoop, ToolAgentLoop):  # both hand the row's priority on
        assert "priority" in inspect.signature(loop.run).parameters
    source = inspect.getsource(AgentLoopManager.generate_sequences)
    assert 'if "priority" not in prompts.non_tensor_batch' in source  # verl keeps the planner's column
    import verl

    # Importing the vLLM server needs vLLM; its signature is read as text.
    server = (Path(verl.__file__).parent / "workers" / "rollout" / "vllm_rollout" / "vllm_async_server.py").read_text()
    assert "priority: int = 0," in server and "priority=priority," in server
    assert names(FakeVLLMServer.generate)[1:] == ["prompt_ids", "sampling_params", "request_id", "image_data",
                                                  "video_data", "audio_data", "mm_processor_kwargs", "priority",
                                                  "kv_transfer_params"]
    assert "def generate(\n        self,\n        prompt_ids: list[int],\n        sampling_params" in server


def test_plan_priorities_reach_vllm_under_verls_nonzero_rule():
    # verl forwards only non-zero priorities to vLLM; plan_rollout's rank-0 row on replica 0 has
    # priority 0, vLLM's default, so the engine sees the plan's order either way.
    plan = plan_rollout(["a"] * 3 + ["b"] * 3, [5, 9, 1, 4, 4, 4], replicas=2)
    zero = [i for i, p in enumerate(plan.priority) if p == 0]
    assert len(zero) == 1 and plan.replica[zero[0]] == 0 and plan.rank[zero[0]] == 0


# ----------------------------------------------------------------------------- sessions' priorities (multi-turn)
def test_the_worker_gives_every_request_of_a_session_its_priority_and_the_manager_runs_that_worker():
    """verl 0.9.1's ToolAgentLoop names no priority on any turn: LengthschedAgentLoopWorker (verl's worker with
    SessionPriorities) gives each request its session's, concurrent sessions apart; the planning manager runs
    that worker unless its base names one."""
    sent = []

    class Client:
        async def generate(self, request_id, **kwargs):
            await asyncio.sleep(0)
            sent.append((request_id, kwargs.get("priority")))

    class BaseWorker:  # verl's AgentLoopWorker: the client as llm_client, one session per _run_agent_loop
        def __init__(self, config, llm_client, teacher_client=None, reward_loop_worker_handles=None):
            self.llm_client = llm_client

        async def _run_agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
            for turn in range(2):  # as ToolAgentLoop
                await self.llm_client.generate(request_id=f"{kwargs['priority']}-{turn}", prompt_ids=[1],
                                               sampling_params={})

    worker = lv.make_worker_class(BaseWorker)(trainer_config(), Client())
    assert isinstance(worker.llm_client, lv.SessionPriorityClient)

    async def go():
        await asyncio.gather(*[worker._run_agent_loop({}, {}, agent_name="tool_agent", priority=p) for p in (4, 9)])
    asyncio.run(go())
    assert sorted(sent) == [("4-0", 4), ("4-1", 4), ("9-0", 9), ("9-1", 9)]

    made = lv.make_agent_loop_manager_class(FakeAgentLoopManager, worker_class="our workers")
    assert made(trainer_config(), None).agent_loop_workers_class == "our workers"

    class Custom(FakeAgentLoopManager):
        agent_loop_workers_class = "yours"

    assert lv.make_agent_loop_manager_class(Custom, worker_class="ours")(trainer_config(), None) \
        .agent_loop_workers_class == "yours"
    assert lv.make_agent_loop_manager_class(FakeAgentLoopManager)(trainer_config(), None) \
        .__dict__.get("agent_loop_workers_class") is None  # none given: verl's


@requires_verl
def test_verls_real_worker_runs_a_tool_loop_whose_every_turn_carries_the_sessions_priority(monkeypatch):
    """verl's real AgentLoopWorker._run_agent_loop (the legacy trainer's and the fully-async recipe's) under
    LengthschedAgentLoopWorker: it makes the registered multi-turn loop with the worker's client, and every turn
    reaches the client with the session's priority; the planning managers run this worker."""
    from test_verl_v1 import ToolLikeAgentLoop  # noqa: F401 - registered by name below
    from verl.experimental.agent_loop import agent_loop as verl_agent_loop

    monkeypatch.setitem(verl_agent_loop._agent_loop_registry, "lengthsched_test_tool_agent",
                        {"_target_": "test_verl_v1.ToolLikeAgentLoop"})
    worker_cls = lv.LengthschedAgentLoopWorker
    assert issubclass(worker_cls, verl_agent_loop.AgentLoopWorker) and worker_cls is lv.LengthschedAgentLoopWorker
    sent = []

    class Client:
        async def generate(self, request_id, **kwargs):
            sent.append((request_id, kwargs.get("priority"), len(kwargs["prompt_ids"])))
            return SimpleNamespace(token_ids=[7] * 5)

    def light_init(self, config, llm_client, teacher_client=None, reward_loop_worker_handles=None):
        self.config, self.llm_client = config, llm_client
        self.tokenizer = self.processor = self.hf_model_type = self.dataset_cls = None
        self.tools = []

    async def postprocess(self, output, validate, **kwargs):
        return output

    monkeypatch.setattr(verl_agent_loop.AgentLoopWorker, "__init__", light_init)
    monkeypatch.setattr(verl_agent_loop.AgentLoopWorker, "_agent_loop_postprocess", postprocess)
    config = trainer_config()
    config["data"] = {}
    worker = worker_cls(config, Client())
    trajectory = {"step": 1, "sample_index": 0, "rollout_n": 0, "validate": False}

    async def go():
        await asyncio.gather(*[worker._run_agent_loop({}, dict(trajectory, sample_index=i), trace=False,
                                                      agent_name="lengthsched_test_tool_agent", index=i, priority=p)
                               for i, p in enumerate((12, 30))])
    asyncio.run(go())
    by_priority = {p: sorted(n for _, q, n in sent if q == p) for p in (12, 30)}
    assert by_priority == {12: [4, 12], 30: [4, 12]}  # two turns each: the prompt, then it with 5 tokens and a tool's 3
    manager = lv.LengthschedAgentLoopManager.__new__(lv.LengthschedAgentLoopManager)
    verl_init = verl_agent_loop.AgentLoopManager.__init__
    monkeypatch.setattr(verl_agent_loop.AgentLoopManager, "__init__",
                        lambda self, *a, **k: verl_init(self, config, None))
    manager.__init__(config, None)
    assert manager.agent_loop_workers_class.__ray_actor_class__ is worker_cls  # a Ray actor of our worker
