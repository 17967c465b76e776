"""lengthsched.integrations.verl_v1: the planning agent-loop manager of verl's v1 trainer.

Two layers, as in test_verl.py. Without verl: fakes of verl 0.9.1's ``AgentLoopManagerTQ`` (one row per prompt,
split over the workers) and ``AgentLoopWorkerTQ`` (a prompt's ``n`` sessions, each through the LLM client with the
prompt's columns, ``priority`` among them) carry batches from the manager through our router to fake vLLM servers.
Where verl's v1 trainer imports (CI's verl stage), verl's real ``AgentLoopManagerTQ.generate_sequences`` (TensorDict
chunking, ``ray.get`` resolved in one event loop) and the real worker's ``generate_sequences`` / ``_run_prompt``
(rows to prompt dicts, ``__rollout_n__``, TransferQueue status tags faked in memory) run under our classes, with only
the agent loop itself and the servers faked.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from test_verl import VERL, Config, FakeLLMServerClient, FakeVLLMServer, Remote
from test_verl_selective import V1, requires_v1  # verl's v1 trainer imports (its agent_loop_tq among them)

from lengthsched import InvalidArgument
from lengthsched.integrations import verl as lv
from lengthsched.integrations import verl_stealing as vs
from lengthsched.integrations import verl_v1 as vv1

# Six prompts; each one's completions have the true lengths below (tokens).
TRUE = {f"q{k}": n for k, n in enumerate([400, 60, 300, 50, 200, 80])}
G = 4
TOOL = [-1, -1, -1]  # a tool's answer between two turns of the fake multi-turn loop (token -1 marks it)


def true_length(prompt_ids) -> int:
    return list(TRUE.values())[prompt_ids[0] - 1]


def config(trainer: dict | None = None, **lengthsched: Any) -> Any:
    """The trainer config the manager and verl's v1 worker read (test_verl.trainer_config's, with ``rollout.n``;
    ``trainer``: its ``trainer`` section)."""
    rollout = {"name": "vllm", "response_length": 512, "full_determinism": False, "n": G, "val_kwargs": {"n": 2},
               "temperature": 1.0, "top_p": 1.0, "top_k": -1, "calculate_log_probs": False,
               "agent": {"default_agent_loop": "single_turn_agent"}}
    data: dict[str, Any] = {"actor_rollout_ref": {"model": {}, "rollout": rollout}}
    if trainer is not None:
        data["trainer"] = trainer
    if lengthsched:
        data["lengthsched"] = lengthsched
    if VERL:
        from omegaconf import OmegaConf

        return OmegaConf.create(data)
    return Config(data)


def resolve(ref: Any) -> Any:
    """What ``ray.get`` gives for the fakes' handles (an awaitable of the result)."""
    async def wait():
        return await ref
    return asyncio.run(wait())


# ----------------------------------------------------------------------------- the fakes
class FakeBatch(dict):
    """verl's v1 prompt batch (a TensorDict): per-row columns, and the batch-wide ``global_steps`` and
    ``validate``; ``chunk`` as ``TensorDict.chunk``."""

    SCALARS = ("global_steps", "validate")

    def __len__(self) -> int:
        return len(self["uid"])

    def chunk(self, parts: int) -> list[FakeBatch]:
        size = -(-len(self) // parts)
        return [FakeBatch({k: (v if k in self.SCALARS else v[i:i + size]) for k, v in self.items()})
                for i in range(0, len(self), size)]


def prompt_batch(step: int, prompts: list[str] | None = None, validate: bool = False,
                 counts: list[int] | None = None, index: list[int] | None = None) -> FakeBatch:
    names = prompts if prompts is not None else list(TRUE)
    batch = FakeBatch(uid=[f"s{step}-{q}-{uuid.uuid4().hex[:6]}" for q in names],
                      raw_prompt=[[{"role": "user", "content": q}] for q in names],
                      prompt_ids=[[list(TRUE).index(q) + 1] for q in names], global_steps=step, validate=validate)
    if counts is not None:
        batch["__rollout_n__"] = list(counts)
    if index is not None:  # verl's RLHFDataset: the row's extra_info.index
        batch["index"] = list(index)
    return batch


class FakeAgentLoopManagerTQ:
    """verl 0.9.1's ``AgentLoopManagerTQ`` (trainer/ppo/v1/agent_loop_tq.py): ``generate_sequences`` splits the
    prompts over the workers and waits only for them to take the prompts (``ray.get``), not for the results."""

    def __init__(self, config, llm_client, teacher_client=None, reward_loop_worker_handles=None):
        self.agent_loop_workers_class = "AgentLoopWorkerTQ"
        self.config, self.llm_client = config, llm_client
        self.agent_loop_workers: list = []

    run = staticmethod(resolve)  # what ray.get is for these fakes (the live harness runs them on its loop)

    def generate_sequences(self, prompts) -> None:
        for worker, chunk in zip(self.agent_loop_workers, prompts.chunk(len(self.agent_loop_workers))):
            self.run(worker.generate_sequences.remote(chunk))


class FakeWorkerTQ:
    """verl 0.9.1's ``AgentLoopWorkerTQ``: ``generate_sequences`` takes the prompts and returns (the sessions run
    in the background: here when the test calls ``finish``); ``_run_prompt`` runs ``__rollout_n__`` (else
    ``rollout.n`` / ``val_kwargs.n``) sessions through ``_run_agent_loop`` (the prompt's columns and the session id
    as keyword arguments), each a single-turn loop (``int(priority)``, a fresh request id) whose output goes to
    ``_agent_loop_postprocess``, and settles them all, a failed session included. ``agent_name`` "tool_agent"
    runs verl's ``ToolAgentLoop`` as it talks to the client: ``TURNS`` turns of one request id, each a
    ``generate`` of the conversation so far (the prompt, the earlier turns' tokens and a tool's answer of
    :data:`TOOL` tokens) that names no priority; the session's tokens are its turns' together."""

    agent_name = "single_turn_agent"
    TURNS = 2
    #: The reward of (prompt name, session id), as verl's ``_compute_score`` sets it on the output in
    #: ``_agent_loop_postprocess`` (None: no reward, as with a colocated reward model); unset: no reward at all.
    score: Any = None

    def __init__(self, config, llm_client, teacher_client=None, reward_loop_worker_handles=None):
        self.config, self.llm_client = config, llm_client
        self.pending: list[tuple[dict, dict]] = []
        self.stored: list[tuple[str, int]] = []  # (uid, session) put into the queue
        self.fail: set[str] = set()  # prompt names whose first session fails

    async def generate_sequences(self, batch) -> None:
        for i in range(len(batch)):
            prompt = {k: (v if k in FakeBatch.SCALARS else v[i]) for k, v in batch.items()}
            validate = prompt.pop("validate")
            self.pending.append((prompt, {"validate": validate}))

    async def _run_prompt(self, prompt, sampling_params, trajectory, trace=False) -> None:
        rollout = self.config.actor_rollout_ref.rollout
        n = prompt.pop("__rollout_n__", rollout.n if not trajectory["validate"] else rollout.val_kwargs.n)

        async def session(i: int) -> None:
            if i == 0 and prompt["raw_prompt"][0]["content"] in self.fail:
                raise RuntimeError("the engine died")
            await self._run_agent_loop(sampling_params, trajectory=trajectory, trace=trace, session_id=i,
                                       agent_name=self.agent_name, **prompt)

        await asyncio.gather(*[session(i) for i in range(n)], return_exceptions=True)

    async def _run_agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
        if agent_name == "tool_agent":
            request_id, conversation, mask = uuid.uuid4().hex, list(kwargs["prompt_ids"]), []
            for turn in range(self.TURNS):
                if turn:
                    conversation += TOOL
                    mask += [0] * len(TOOL)
                out = await self.llm_client.generate(request_id=request_id, prompt_ids=conversation,
                                                     sampling_params=dict(sampling_params))
                conversation += out.token_ids
                mask += [1] * len(out.token_ids)
            output = SimpleNamespace(response_ids=conversation[len(kwargs["prompt_ids"]):], response_mask=mask)
        else:
            out = await self.llm_client.generate(uuid.uuid4().hex, prompt_ids=kwargs["prompt_ids"],
                                                 sampling_params=dict(sampling_params),
                                                 priority=int(kwargs.get("priority", 0)))
            output = SimpleNamespace(response_ids=out.token_ids, response_mask=[1] * len(out.token_ids))
        return await self._agent_loop_postprocess(output, trajectory["validate"], **kwargs)

    async def _agent_loop_postprocess(self, output, validate, **kwargs) -> None:
        if self.score is not None:  # verl's _compute_score: the reward goes on the (last) output
            output.reward_score = self.score(kwargs["raw_prompt"][0]["content"], kwargs["session_id"])
        self.stored.append((kwargs["uid"], kwargs["session_id"]))

    def finish(self) -> None:
        """Run every prompt taken so far to the end."""
        pending, self.pending = self.pending, []

        async def run():
            for prompt, trajectory in pending:
                await self._run_prompt(prompt, {}, trajectory=trajectory)
        asyncio.run(run())


Worker = vv1.make_tq_worker_class(FakeWorkerTQ)
Manager = vv1.make_tq_agent_loop_manager_class(FakeAgentLoopManagerTQ, "our workers", get=resolve)


def pipeline(replicas: int = 3, workers: int = 2, router: Any = None, trainer: dict | None = None,
             **lengthsched: Any):
    """Our manager over the fake base with ``replicas`` fake vLLM servers behind ``router`` (default ours)."""
    servers = {f"10.0.0.{r}:8000": FakeVLLMServer(f"s{r}", true_length) for r in range(replicas)}
    router = router if router is not None else lv.PlannedLoadBalancer({sid: Remote(s) for sid, s in servers.items()})
    cfg = config(trainer, **lengthsched)
    client = FakeLLMServerClient(cfg, load_balancer_handle=Remote(router))
    manager = Manager(cfg, client)
    local = [Worker(cfg, client) for _ in range(workers)]
    manager.agent_loop_workers = [Remote(w) for w in local]
    return manager, router, servers, local


def finish(workers) -> None:
    for worker in workers:
        worker.finish()


def sent_by_prompt(servers) -> dict[int, list[str]]:
    """Per prompt (its id), the servers its requests went to."""
    where: dict[int, list[str]] = defaultdict(list)
    for sid, server in servers.items():
        for request in server.requests:
            where[request["prompt_ids"][0]].append(sid)
    return where


# ----------------------------------------------------------------------------- the fakes' checks
def test_by_default_each_prompt_gets_one_priority_longest_first_and_verls_least_loaded_routing():
    manager, router, servers, workers = pipeline()
    assert manager.agent_loop_workers_class == "our workers"
    for step in (1, 2):
        for server in servers.values():
            server.requests.clear()
        batch = prompt_batch(step)
        manager.generate_sequences(batch)
        plan = manager.lengthsched_planner().last_plan
        assert plan.placement == "spread" and len(plan) == len(TRUE) * G
        # Each prompt's priority is the lowest of its G rows'; all of its completions carry it.
        for uid, priority in zip(batch["uid"], batch["priority"]):
            rows = [i for i, g in enumerate(plan.group) if plan.group_keys[g] == uid]
            assert priority == min(plan.priority[i] for i in rows)
        assert len(set(batch["priority"])) == len(TRUE) and min(batch["priority"]) >= (step - 1) * len(TRUE) * G
        finish(workers)
        sent = [r for s in servers.values() for r in s.requests]
        assert len(sent) == len(TRUE) * G and {r["priority"] for r in sent} <= set(batch["priority"]) | {0}
    # spread: the router sends every request to the server with the fewest in flight (the fakes finish each at
    # once: the first server), as verl's router does; no priority counts as shared.
    assert router.unplanned == 2 * len(TRUE) * G and router.planned == 0 and router.collisions == 0
    # The lengths came back through the workers: in step 2 the longest predicted starts first.
    assert manager.lengthsched_planner().observed == len(TRUE) * G
    started = [true_length(r["prompt_ids"]) for r in servers["10.0.0.0:8000"].admission_order()]
    assert started == sorted(started, reverse=True) and len(started) == len(TRUE) * G


def test_under_dapos_filter_the_default_order_is_verls_batch_order():
    made = config()
    made["algorithm"] = {"filter_groups": {"enable": True}}
    client = FakeLLMServerClient(made, load_balancer_handle=Remote(lv.PlannedLoadBalancer({"a": Remote(None)})))
    manager = Manager(made, client)
    assert vv1.filter_groups(made) and not vv1.filter_groups(config())
    assert manager.lengthsched_planner().order_for("spread", 4) == "batch"
    made["lengthsched"] = {"order": "longest"}  # the config's own order wins
    assert Manager(made, client).lengthsched_planner().order_for("spread", 4) == "longest"


def test_whole_groups_are_balanced_by_the_lengths_learned_in_the_step_before():
    manager, router, servers, workers = pipeline(placement="groups")
    manager.generate_sequences(prompt_batch(1))
    finish(workers)
    for server in servers.values():
        server.requests.clear()
    manager.generate_sequences(prompt_batch(2))
    planner = manager.lengthsched_planner()
    assert planner.observed == len(TRUE) * G and planner.steps == 1 and planner.last_plan.placement == "groups"
    finish(workers)
    where = sent_by_prompt(servers)
    assert all(len(set(sids)) == 1 and len(sids) == G for sids in where.values())
    work = {sid: sum(G * true_length([p]) for p, sids in where.items() if sids[0] == sid) for sid in servers}
    assert max(work.values()) == G * 400  # q0 alone: the optimal makespan
    for server in servers.values():
        started = [true_length(r["prompt_ids"]) for r in server.admission_order()]
        assert started == sorted(started, reverse=True)
    assert router.collisions == 0 and router.unplanned == 0


def test_a_refill_is_placed_beside_the_work_still_running_and_queued_behind_it():
    manager, router, servers, workers = pipeline(placement="groups")
    manager.generate_sequences(prompt_batch(1))
    finish(workers)
    first = prompt_batch(2, ["q0", "q2"])  # about 1600 and 1200 tokens, still running when the refill comes
    manager.generate_sequences(first)
    loads = manager.lengthsched_loads(3)
    predicted = manager.lengthsched_planner().last_plan.replica_work
    assert sorted(loads.tolist()) == [0] + sorted(w for w in predicted if w) and min(predicted[:1]) > 1000
    refill = prompt_batch(2, ["q3", "q5"])
    manager.generate_sequences(refill)
    # Both refill prompts go to the idle replica (about 200 + 320 tokens), not round the replicas.
    idle = int(np.argmin(loads))
    plan = manager.lengthsched_planner().last_plan
    assert set(plan.replica) == {idle}
    assert min(refill["priority"]) > max(first["priority"])  # an engine's queue serves the earlier batch first
    finish(workers)
    assert manager.lengthsched_loads(3).sum() > 0  # heard only at the next call (or collect)
    assert manager.lengthsched_collect() == 4 and manager.lengthsched_loads(3).tolist() == [0, 0, 0]
    manager.generate_sequences(prompt_batch(3, ["q1"]))
    last = manager.lengthsched_planner().last_plan
    assert sorted(manager.lengthsched_loads(3).tolist()) == [0, 0, sum(last.replica_work)] and 200 < sum(
        last.replica_work) < 300  # q1: 4 x 60 tokens, predicted from step 1
    assert manager.lengthsched_planner().steps == 2


def test_prompts_a_dead_worker_never_reports_are_forgotten_after_running_steps(caplog):
    """A worker that died never reports its prompts: their predicted work would count on the replicas for the rest
    of the run. lengthsched.running_steps (default RUNNING_STEPS) steps after their dispatch they are forgotten, with
    one warning, and the next batch is planned on empty replicas; null keeps them."""
    manager, router, servers, workers = pipeline(placement="groups")
    manager.generate_sequences(prompt_batch(1))
    finish(workers)
    manager.generate_sequences(prompt_batch(2, ["q0", "q2"]))
    for worker in workers:  # the worker died: its prompts never run, never report
        worker.pending.clear()
    assert manager.lengthsched_loads(3).sum() > 0
    manager.generate_sequences(prompt_batch(2 + vv1.RUNNING_STEPS, ["q3"]))  # not yet: exactly RUNNING_STEPS later
    assert len(manager.lengthsched_running) == 3
    with caplog.at_level("WARNING", logger="lengthsched.integrations.verl_v1"):
        manager.generate_sequences(prompt_batch(3 + vv1.RUNNING_STEPS, ["q5"]))
    assert sorted(u.split("-")[1] for u in manager.lengthsched_running) == ["q3", "q5"]  # q0 and q2 forgotten
    assert sum("never heard finish" in r.getMessage() for r in caplog.records) == 1
    left = sum(p.work for p in manager.lengthsched_running.values())
    assert manager.lengthsched_loads(3).tolist() == left.tolist() and left.sum() < 1000  # q3 and q5: no q0 (1600)
    kept, _, _, kept_workers = pipeline(placement="groups", running_steps=None)
    kept.generate_sequences(prompt_batch(1, ["q0"]))
    kept_workers[0].pending.clear()
    kept_workers[1].pending.clear()
    kept.generate_sequences(prompt_batch(100, ["q1"]))
    assert len(kept.lengthsched_running) == 2
    bad, _, _, _ = pipeline(running_steps=0)
    with pytest.raises(InvalidArgument, match="lengthsched.running_steps"):
        bad.generate_sequences(prompt_batch(1, ["q0"]))


def test_per_prompt_group_sizes_validation_and_failed_sessions():
    manager, router, servers, workers = pipeline()
    batch = prompt_batch(1, ["q0", "q1", "q2"], counts=[2, 0, 5])
    manager.generate_sequences(batch)
    finish(workers)
    where = sent_by_prompt(servers)
    assert {p: len(s) for p, s in where.items()} == {1: 2, 3: 5}
    assert router.unplanned == 7 and router.collisions == 0
    assert manager.lengthsched_collect() == 3 and manager.lengthsched_planner().observed == 7
    # Validation prompts are planned (val_kwargs.n each) but teach the planner nothing.
    manager.generate_sequences(prompt_batch(1, ["q3"], validate=True))
    finish(workers)
    assert sum(len(s) for s in sent_by_prompt(servers).values()) == 9
    manager.lengthsched_collect()
    assert manager.lengthsched_planner().observed == 7 and not manager.lengthsched_running
    # A prompt whose session failed still finishes: its other sessions' lengths are learned, its work forgotten.
    workers[0].fail.add("q4")
    manager.generate_sequences(prompt_batch(2, ["q4", "q5"]))
    finish(workers)
    manager.lengthsched_collect()
    assert manager.lengthsched_planner().observed == 7 + (G - 1) + G and not manager.lengthsched_running
    with pytest.raises(InvalidArgument, match="uid"):
        twice = prompt_batch(3, ["q0", "q1"])
        twice["uid"] = ["same", "same"]
        manager.generate_sequences(twice)
    with pytest.raises(InvalidArgument, match="__rollout_n__"):
        manager.generate_sequences(prompt_batch(3, ["q0"], counts=[-1]))


# Online sGPO: each prompt's share of solved completions (session i of prompt q solves it when i < SOLVED[q] x n).
SOLVED = {"q0": 0.25, "q1": 1.0, "q2": 0.0, "q3": 0.5, "q4": 0.25, "q5": None}  # q5: no reward reaches the loop


def text_key(name: str) -> str:
    """A fake prompt's key in the online sGPO budget: its text (verl's raw_prompt as lengthsched keys it)."""
    return lv.prompt_key([{"role": "user", "content": name}])


def solved_by_share(name: str, session: int, n: int = G) -> float | None:
    share = SOLVED[name]
    return None if share is None else float(session < share * n)


def test_online_sgpo_sizes_each_prompts_next_group_from_the_rewards_of_its_last(tmp_path, caplog):
    """lengthsched.sgpo: the manager writes each training prompt's __rollout_n__ from its earlier groups' rewards
    (which its workers hand over with the lengths); unseen prompts run rollout.n, validation is untouched, a prompt
    whose sessions bring no reward learns nothing (one warning), and the budget survives a restart."""
    state = tmp_path / "sgpo.json"
    sgpo = {"g_max": 16, "unsolved_fraction": 0.0, "state_path": str(state)}
    manager, router, servers, workers = pipeline(sgpo=sgpo)
    for w in workers:
        w.score = solved_by_share
    first = prompt_batch(1, index=list(range(6)))
    manager.generate_sequences(first)
    assert list(first["__rollout_n__"]) == [G] * 6  # nothing seen yet: rollout.n
    finish(workers)
    with caplog.at_level("WARNING", logger="lengthsched.integrations.verl_v1"):
        manager.lengthsched_collect()
        manager.lengthsched_collect()
    assert sum("without a finite reward_score" in r.getMessage() for r in caplog.records) == 1
    assert json.loads(state.read_text())["groups"] == 5  # q5 learnt nothing
    for server in servers.values():
        server.requests.clear()
    second = prompt_batch(2, index=list(range(6)))
    manager.generate_sequences(second)
    # The default rule ("informative", target 0.9): 1/4 solved: 9 (1 - 0.25^9 - 0.75^9 >= 0.9); 1/2 solved: 5;
    # trivial and unsolved: g_min 2; q5 unseen: rollout.n
    expected = [9, 2, 2, 5, 9, G]
    assert list(second["__rollout_n__"]) == expected
    assert manager.lengthsched_sgpo_status()["last_batch"] == {"informative": 3, "trivial": 1, "unsolved": 1,
                                                               "unseen": 1}
    assert len(manager.lengthsched_planner().last_plan) == sum(expected)
    finish(workers)
    assert {p: len(s) for p, s in sent_by_prompt(servers).items()} == dict(zip(range(1, 7), expected))
    # Validation batches run val_kwargs.n and teach the budget nothing.
    manager.lengthsched_collect()
    groups = manager.lengthsched_sgpo.budget.groups
    val = prompt_batch(2, ["q0"], validate=True, index=[0])
    manager.generate_sequences(val)
    assert "__rollout_n__" not in val
    finish(workers)
    manager.lengthsched_collect()
    assert manager.lengthsched_sgpo.budget.groups == groups == 10
    # A restarted trainer reads the budget back and decides alike.
    again, _, _, _ = pipeline(sgpo=sgpo)
    third = prompt_batch(3, index=list(range(6)))
    again.generate_sequences(third)
    # q0 has solved 2 of 13 now (its 1 of 4, then 1 of 9): 14; q3 4 of 9: 5
    assert list(third["__rollout_n__"]) == manager.lengthsched_sgpo.budget.group_sizes(
        [text_key(q) for q in TRUE], G) == [14, 2, 2, 5, 14, G]
    assert again.lengthsched_sgpo_status()["groups"] == 10
    # The data's own sizes (an offline plan's) hold for prompts not seen yet; a row with 0 runs none.
    fresh, _, _, _ = pipeline(sgpo={"unsolved_fraction": 0.0})
    own = prompt_batch(1, ["q0", "q1"], counts=[8, 0], index=[0, 1])
    fresh.generate_sequences(own)
    assert list(own["__rollout_n__"]) == [8, 0]
    assert pipeline()[0].lengthsched_sgpo_status() is None  # no section: no online sGPO
    assert pipeline(sgpo={"enable": False})[0].lengthsched_sgpo is None


def test_online_sgpo_learns_from_the_sessions_that_did_not_fail(caplog):
    manager, _, _, workers = pipeline(sgpo={"rule": "pow2"})
    for w in workers:
        w.score = solved_by_share
        w.fail.add("q3")  # its first session fails: the other three are learnt, and no reward is said missing
    with caplog.at_level("WARNING", logger="lengthsched.integrations.verl_v1"):
        manager.generate_sequences(prompt_batch(1, ["q3"], index=[3]))
        finish(workers)
        manager.lengthsched_collect()
    assert not caplog.records
    assert manager.lengthsched_sgpo.budget.success_rate(text_key("q3")) == pytest.approx(1 / 3)  # sessions 1-3: one
    assert manager.lengthsched_sgpo.budget.samples == G - 1


def test_online_sgpo_knows_prompts_by_their_text_or_by_their_index_where_asked(caplog):
    manager, _, _, workers = pipeline(sgpo={"unsolved_fraction": 0.0})
    for w in workers:
        w.score = solved_by_share
    manager.generate_sequences(prompt_batch(1, ["q1", "q2"], index=[0, 0]))  # verl's index 0 for rows without one
    finish(workers)
    manager.lengthsched_collect()
    assert manager.lengthsched_sgpo.budget.success_rate(text_key("q1")) == 1.0  # by its text, by default
    assert manager.lengthsched_sgpo.budget.success_rate("0") is None
    # key: index (prompt texts that change between epochs): a unique index is the key, rows without one or sharing
    # one are known by their text, row by row (one warning); an integral float index is its integer.
    by_index, _, _, workers = pipeline(sgpo={"unsolved_fraction": 0.0, "key": "index"})
    for w in workers:
        w.score = solved_by_share
    by_index.generate_sequences(prompt_batch(1, ["q1", "q2"], index=[10.0, 11]))
    finish(workers)
    by_index.lengthsched_collect()
    budget = by_index.lengthsched_sgpo.budget
    assert budget.success_rate("10") == 1.0 and budget.success_rate("11") == 0.0  # q1 and q2, by their index
    moved = prompt_batch(2, ["q1", "q2"], index=[11, 10])  # the same texts under each other's index
    by_index.generate_sequences(moved)
    assert list(moved["__rollout_n__"]) == [2, 2] and budget.reasons == {"trivial": 1, "unsolved": 1}
    finish(workers)
    by_index.lengthsched_collect()
    with caplog.at_level("WARNING", logger="lengthsched.integrations.verl_v1"):
        same = prompt_batch(3, ["q0", "q3", "q5"], index=[0, 0, 10])
        by_index.generate_sequences(same)
        by_index.generate_sequences(prompt_batch(3, ["q4"]))  # no index column at all
    assert sum("share one" in r.getMessage() for r in caplog.records) == 1
    keys = [by_index.lengthsched_running[u].sgpo_key for u in same["uid"]]
    # index 10 holds q1's 4 of 4 (step 1) and q2's 0 of 2 (step 2): 4 of 6, 6 completions by the default rule
    assert keys == [text_key("q0"), text_key("q3"), "10"] and list(same["__rollout_n__"]) == [G, G, 6]
    finish(workers)
    by_index.lengthsched_collect()
    assert budget.success_rate(text_key("q3")) == 0.5


@pytest.mark.parametrize("options, match", [
    ({"g_min": 1}, "lengthsched.sgpo.g_min.*group of one"), ({"g_max": 1}, "lengthsched.sgpo.g_max"),
    ({"rule": "log"}, "lengthsched.sgpo.rule"), ({"memory": 0}, "lengthsched.sgpo.memory"),
    ({"target": 1.0}, "lengthsched.sgpo.target"),
    ({"key": "uid"}, "lengthsched.sgpo.key"), ({"solved_reward": "high"}, "lengthsched.sgpo.solved_reward"),
    ({"group": 4}, "'lengthsched.sgpo'.*options among"), ({"enable": "yes"}, "lengthsched.sgpo.enable"),
    ({"state_path": ""}, "lengthsched.sgpo.state_path")])
def test_online_sgpo_options_are_checked_when_the_manager_is_made(options, match):
    with pytest.raises(InvalidArgument, match=match):
        pipeline(sgpo=options)


def test_online_sgpo_resumed_at_a_checkpoint_forgets_the_steps_it_generates_again(tmp_path):
    """The budget is saved at every collection, not with verl's checkpoints: a run resumed at step k would count the
    groups of steps k + 1 ... twice. The first training batch (for step k + 1) forgets them; a fresh run (its first
    batch for step 1) forgets every group another run recorded."""
    state = tmp_path / "sgpo.json"
    manager, _, _, workers = pipeline(sgpo={"rule": "pow2", "unsolved_fraction": 0.0, "state_path": str(state)})
    for w in workers:
        w.score = solved_by_share
    for step in (1, 2, 3):
        manager.generate_sequences(prompt_batch(step, ["q0", "q1"]))
        finish(workers)
    manager.lengthsched_collect()
    assert json.loads(state.read_text())["groups"] == 6
    resumed, _, _, _ = pipeline(sgpo={"rule": "pow2", "unsolved_fraction": 0.0, "state_path": str(state)})
    resumed.generate_sequences(prompt_batch(3, ["q0"]))  # resumed from the checkpoint of step 2
    budget = resumed.lengthsched_sgpo.budget  # (memory 2: step 1's groups had gone already, step 3's go now)
    assert budget._visits[budget._key(text_key("q0"))] == 2 and budget.groups == 4
    assert [g[2] for g in budget._groups[budget._key(text_key("q0"))]] == [2]
    # The file follows what the resumed run learns, even where it ends with as many groups as the file had.
    again = pipeline(sgpo={"rule": "pow2", "unsolved_fraction": 0.0, "state_path": str(state)})
    again_manager, again_workers = again[0], again[3]
    for w in again_workers:
        w.score = lambda name, session: 1.0  # this time q0 and q1 are always solved
    again_manager.generate_sequences(prompt_batch(3, ["q0", "q1"]))  # forgets step 3's two groups, runs two
    finish(again_workers)
    again_manager.lengthsched_collect()
    saved = json.loads(state.read_text())
    assert saved["groups"] == 6 and saved["prompts"][text_key("q0")]["groups"][-1] == [G, G, 3]
    fresh, _, _, _ = pipeline(sgpo={"rule": "pow2", "unsolved_fraction": 0.0, "state_path": str(state)})
    batch = prompt_batch(1, ["q0", "q1"])
    fresh.generate_sequences(batch)
    assert fresh.lengthsched_sgpo.budget.groups == 0 and list(batch["__rollout_n__"]) == [G, G]


def test_online_sgpo_resumed_within_verls_save_interval_decides_as_it_did_at_the_checkpoint(tmp_path, caplog):
    """With trainer.save_freq set, the budget keeps the groups of its latest save_freq + 1 steps beyond its memory:
    a run resumed from its latest checkpoint sizes each prompt from the groups it had then, not from what the lost
    steps pushed out (memory 1 here: the lost steps' groups replaced the checkpoint's)."""
    state = tmp_path / "sgpo.json"
    options = {"rule": "pow2", "unsolved_fraction": 0.0, "memory": 1, "state_path": str(state)}
    solved = {1: 1.0, 2: 0.25, 3: 1.0, 4: 1.0}  # the share of q0's sessions that solve it, by step

    def run(trainer):
        manager, _, _, workers = pipeline(trainer=trainer, sgpo=options)
        for step in (1, 2, 3, 4):  # checkpoints at steps 2 and 4 (save_freq 2); the run dies before step 4's
            for w in workers:
                w.score = lambda name, session, p=solved[step]: float(session < p * G)
            manager.generate_sequences(prompt_batch(step, ["q0"]))
            finish(workers)
        manager.lengthsched_collect()  # (the collection of step 4: by step 5's dispatch or a validation)
        resumed, _, _, _ = pipeline(trainer=trainer, sgpo=options)
        batch = prompt_batch(3, ["q0"])
        resumed.generate_sequences(batch)  # resumed from the checkpoint of step 2: step 2's group decides
        return resumed.lengthsched_sgpo.budget, int(batch["__rollout_n__"][0])

    budget, size = run({"save_freq": 2})
    # step 2's group: 2 sessions (q0 always solved at step 1: g_min), one solved; pow2 sizes p = 1/2 at g_min again
    assert budget.keep_steps == 3 and budget.success_rate(text_key("q0")) == 0.5 and size == 2
    assert json.loads(state.read_text())["keep_steps"] == 3
    state.unlink()
    with caplog.at_level("WARNING", logger="lengthsched.integrations.verl_v1"):
        budget, size = run(None)  # no checkpoints: no reach; the lost steps pushed step 2's group out
    assert budget.keep_steps == 0 and budget.success_rate(text_key("q0")) is None and size == G
    assert any("further back than the budget keeps" in r.getMessage() for r in caplog.records)
    assert vv1.sgpo_keep_steps(config({"save_freq": -1}, sgpo={})) == 0  # verl saves none
    assert vv1.sgpo_keep_steps(config({"save_freq": 5}, sgpo={"keep_steps": 1})) == 1  # set: as set
    assert vv1.sgpo_keep_steps(config({"save_freq": 5}, sgpo={})) == 6
    with pytest.raises(InvalidArgument, match="'lengthsched.sgpo.keep_steps'"):
        pipeline(sgpo={"keep_steps": -1})


def test_online_sgpo_forgets_a_prompt_verl_reissues_after_a_resume(tmp_path):
    """verl's asynchronous v1 trainers save the prompts in flight at a checkpoint and re-issue them on resume under
    their uids (trainer_base._reissue_inflight_prompts). A group of one of them that finished after the checkpoint
    was recorded under its dispatch step, which forget_after keeps: the budget forgets it by its uid."""
    state = tmp_path / "sgpo.json"
    options = {"rule": "pow2", "unsolved_fraction": 0.0, "state_path": str(state)}
    manager, _, _, workers = pipeline(sgpo=options)
    for w in workers:
        w.score = solved_by_share
    manager.generate_sequences(prompt_batch(1, ["q0", "q1"]))
    finish(workers)
    in_flight = prompt_batch(2, ["q0"])  # still running at the checkpoint of step 2 ...
    manager.generate_sequences(in_flight)
    finish(workers)
    manager.generate_sequences(prompt_batch(3, ["q1"]))  # ... heard finish at step 3's dispatch, then the stop
    assert json.loads(state.read_text())["groups"] == 3
    resumed, _, _, _ = pipeline(sgpo=options)
    again = prompt_batch(3, ["q0"])
    again["uid"] = list(in_flight["uid"])  # verl re-issues it under its uid, for step 3
    resumed.generate_sequences(again)
    budget = resumed.lengthsched_sgpo.budget
    assert [g[2] for g in budget._groups[budget._key(text_key("q0"))]] == [1]  # its step-2 group is gone
    assert budget._visits[budget._key(text_key("q0"))] == 1 and budget.groups == 2


def test_online_sgpo_refuses_a_state_file_that_is_not_its_own_or_cannot_be_written(tmp_path):
    path = tmp_path / "state.json"
    path.write_text("{}")
    with pytest.raises(InvalidArgument, match="'lengthsched.sgpo.state_path'"):
        pipeline(sgpo={"state_path": str(path)})
    with pytest.raises(InvalidArgument, match="'lengthsched.sgpo.state_path'.*a directory that exists"):
        pipeline(sgpo={"state_path": str(tmp_path / "no" / "state.json")})  # refused when made, not at step 2


def test_a_reward_that_is_not_one_finite_number_teaches_nothing(caplog):
    assert [vv1._finite(x) for x in (1, 0.5, None, float("nan"), float("inf"), "x", [1, 2], np.float32(2))] == [
        1.0, 0.5, None, None, None, None, None, 2.0]
    manager, _, _, workers = pipeline(sgpo={"rule": "pow2"})
    for w in workers:
        w.score = lambda name, session: float("nan") if session == 0 else solved_by_share(name, session)
    with caplog.at_level("WARNING", logger="lengthsched.integrations.verl_v1"):
        manager.generate_sequences(prompt_batch(1, ["q3"]))
        finish(workers)
        manager.lengthsched_collect()  # no error: the NaN session is left out, with one warning
    assert sum("finite reward_score" in r.getMessage() for r in caplog.records) == 1
    assert manager.lengthsched_sgpo.budget.samples == G - 1 and not manager.lengthsched_running


@requires_v1
def test_sgpos_group_sizes_reach_verls_batches_through_its_own_data_loading(tmp_path):
    """lengthsched budget's plan written into a verl data set (``write_adaptive_rollout_data``) comes back through
    verl's own loading (``datasets.load_dataset("parquet")`` as ``RLHFDataset`` reads ``data.train_files``, and its
    real ``collate_fn``) as each row's ``__rollout_n__``, and the manager runs that many sessions per prompt."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    from verl.utils.dataset.rl_dataset import collate_fn

    from lengthsched.sgpo import plan_budget, read_profile

    rows = [{"prompt": [{"role": "user", "content": q}], "extra_info": {"index": q}} for q in TRUE]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    profile = ['{"id": "q0", "outcomes": [1, 0, 0, 0]}', '{"id": "q1", "outcomes": [1, 1, 1, 1]}',
               '{"id": "q2", "outcomes": [1, 1, 0, 0]}', '{"id": "q3", "outcomes": [1, 0, 0, 0, 0, 0, 0, 0]}']
    plan = plan_budget(read_profile(profile))
    counts = vv1.write_adaptive_rollout_data(tmp_path / "train.parquet", tmp_path / "out.parquet", plan, default_n=G)
    assert counts["kept"] == len(TRUE) - 1  # q1 (solved every time) dropped
    loaded = datasets.load_dataset("parquet", data_files=str(tmp_path / "out.parquet"))["train"]
    batch = collate_fn([dict(r) for r in loaded])
    names = [info["index"] for info in batch["extra_info"]]
    sizes = [int(n) for n in batch["__rollout_n__"]]
    assert sizes == [4, 2, 8, G, G] and names == ["q0", "q2", "q3", "q4", "q5"]
    manager, _, servers, workers = pipeline()
    manager.generate_sequences(prompt_batch(1, names, counts=sizes))
    finish(workers)
    assert {p: len(s) for p, s in sent_by_prompt(servers).items()} == {
        list(TRUE).index(q) + 1: n for q, n in zip(names, sizes)}


class VerlRouter:
    """verl's default router: no ``expect``; each request to the server with the fewest in flight."""

    def __init__(self, servers):
        self.inner = lv.PlannedLoadBalancer(servers)

    def __getattr__(self, name):
        if name == "expect":
            raise AttributeError(name)
        return getattr(self.inner, name)


def test_behind_verls_own_router_the_priorities_order_and_a_warning_says_the_placement_is_lost(caplog):
    servers = {f"10.0.0.{r}:8000": FakeVLLMServer(f"s{r}", true_length) for r in range(2)}
    router = VerlRouter({sid: Remote(s) for sid, s in servers.items()})
    manager, _, servers, workers = pipeline(replicas=2, router=router)
    with caplog.at_level(logging.WARNING, logger="lengthsched.integrations.verl_v1"):
        manager.generate_sequences(prompt_batch(1))
        manager.generate_sequences(prompt_batch(2))
    assert sum("does not place" in r.getMessage() for r in caplog.records) == 1
    # Workers that do not report lengths: one warning, nothing learned, nothing counted as running.
    plain = pipeline(replicas=2)[0]
    plain.agent_loop_workers = [Remote(FakeWorkerTQ(config(), None))]
    with caplog.at_level(logging.WARNING, logger="lengthsched.integrations.verl_v1"):
        plain.lengthsched_collect()
        plain.lengthsched_collect()
    assert sum("do not report" in r.getMessage() for r in caplog.records) == 1


def test_the_router_takes_routes_for_shared_priorities_in_arrival_order():
    router = lv.PlannedLoadBalancer({"a": 1, "b": 2, "c": 3})
    assert router.expect({7: [2, 0, 2]}) == 3
    sent = [router.acquire_server(f"r{i}", priority=7)[0] for i in range(4)]
    # Three routes, then a fourth request with the priority that requests in flight hold: the fewest in flight.
    assert sent[:3] == ["c", "a", "c"] and sent[3] == "b"
    assert router.planned == 3 and router.collisions == 1
    assert router.expect({10: [None, None]}) == 2  # None: the fewest in flight, no collision
    assert [router.acquire_server(f"s{i}", priority=10)[0] for i in range(2)] == ["a", "b"]  # a, b: 1 each
    assert router.unplanned == 3 and router.collisions == 1
    for bad, name in [({-1: [0]}, "routes priority"), ({1: "ab"}, "routes\\[1\\]"), ({1: [0.5]}, "routes\\[1\\]"),
                      ([1, 2], "routes")]:
        with pytest.raises(InvalidArgument, match=name):
            router.expect(bad)
    small = lv.PlannedLoadBalancer({"a": 1, "b": 2}, max_cache_size=2)
    small.expect({1: [1], 3: [1], 5: [1]})  # the oldest priority's routes are dropped
    assert small.acquire_server("x", priority=1)[0] == "b"  # 1 mod 2 without a route
    assert small.acquire_server("y", priority=3)[0] == "b" and small.acquire_server("z", priority=5)[0] == "b"


def test_generated_tokens_and_the_classes_need_verl_only_when_asked_for():
    assert vv1.generated_tokens(SimpleNamespace(response_mask=[1, 1, 0, 1], response_ids=[5] * 4)) == 3
    assert vv1.generated_tokens(SimpleNamespace(response_ids=[5] * 6)) == 6
    with pytest.raises(AttributeError):
        vv1.SomethingElse  # noqa: B018 - the attribute access is the test
    if not V1:
        with pytest.raises(ImportError, match="lengthsched\\[verl\\]"):
            vv1.LengthschedAgentLoopManagerTQ  # noqa: B018


# ----------------------------------------------------------------------------- verl's real classes
@requires_v1
def test_the_fakes_have_verls_signatures():
    import inspect

    from verl.trainer.ppo.v1 import agent_loop_tq

    def names(f):  # Ray's actor wrapper adds a tracing context
        return [p for p in inspect.signature(f).parameters if p != "_ray_trace_ctx"]

    worker = agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__
    assert names(FakeAgentLoopManagerTQ.__init__) == names(agent_loop_tq.AgentLoopManager.__init__)
    manager = agent_loop_tq.AgentLoopManagerTQ
    assert names(FakeAgentLoopManagerTQ.generate_sequences) == names(manager.generate_sequences)
    assert names(FakeWorkerTQ.__init__) == names(agent_loop_tq.AgentLoopWorker.__init__)
    for name in ("generate_sequences", "_run_prompt", "_agent_loop_postprocess", "_run_agent_loop"):
        assert names(getattr(FakeWorkerTQ, name)) == names(getattr(worker, name)), name


class AsyncTQ:
    """TransferQueue's async tag put, in memory (what ``AgentLoopWorkerTQ._run_prompt`` calls)."""

    def __init__(self):
        self.tags: dict[str, dict] = defaultdict(dict)

    async def async_kv_put(self, key, partition_id, tag=None, **kwargs):
        self.tags[partition_id][key] = dict(tag or {})


class RealV1(SimpleNamespace):
    """verl's real v1 manager and worker classes under ours (:func:`real_tq`): ``manager``, ``workers``, ``servers``,
    ``router``, ``stored`` (uid, session) put into the queue, ``tq``, ``batch(step, names)`` (a real TensorDict, each
    row's ``index`` its prompt's), ``settle()`` (every session to its end) and ``loop``."""


def real_tq(monkeypatch, cfg, score=None) -> RealV1:
    """verl's real ``AgentLoopManagerTQ.generate_sequences`` and ``AgentLoopWorkerTQ.generate_sequences`` /
    ``_run_prompt`` run under our classes; the agent loop makes SingleTurnAgentLoop's request, and the postprocess
    records the session and, with ``score(prompt name, session)``, sets the output's ``reward_score`` as verl's
    ``_compute_score`` does."""
    import ray
    import torch
    from verl.trainer.ppo.v1 import agent_loop_tq
    from verl.utils import tensordict_utils as tu
    from verl.workers.rollout.llm_server import LLMServerClient

    base_worker = agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__
    loop = asyncio.new_event_loop()
    tq = AsyncTQ()
    monkeypatch.setattr(agent_loop_tq, "tq", tq)

    async def wait(refs):
        return [await ref for ref in refs] if isinstance(refs, list) else await refs

    monkeypatch.setattr(ray, "get", lambda refs: loop.run_until_complete(wait(refs)))

    def light_init(self, config, llm_client, teacher_client=None, reward_loop_worker_handles=None):
        self.config, self.llm_client, self.background_tasks = config, llm_client, set()

    async def agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
        # SingleTurnAgentLoop.run's request, then verl's postprocess with the loop's output.
        out = await self.llm_client.generate(uuid.uuid4().hex, prompt_ids=[int(kwargs["index"]) + 1],
                                             sampling_params=sampling_params, priority=int(kwargs["priority"]))
        output = SimpleNamespace(response_ids=out.token_ids, response_mask=[1] * len(out.token_ids), reward_score=None)
        return await self._agent_loop_postprocess(output, trajectory["validate"], **kwargs)

    stored: list[tuple[str, int]] = []

    async def postprocess(self, output, validate, **kwargs):
        if score is not None:
            output.reward_score = score(list(TRUE)[int(kwargs["index"])], kwargs["session_id"])
        stored.append((kwargs["uid"], kwargs["session_id"]))

    monkeypatch.setattr(base_worker, "__init__", light_init)
    monkeypatch.setattr(base_worker, "_run_agent_loop", agent_loop)
    monkeypatch.setattr(base_worker, "_agent_loop_postprocess", postprocess)

    servers = {f"10.0.0.{r}:8000": FakeVLLMServer(f"s{r}", true_length) for r in range(3)}
    router = lv.PlannedLoadBalancer({sid: Remote(s) for sid, s in servers.items()})
    client = LLMServerClient(config=cfg, load_balancer_handle=Remote(router))
    manager = vv1.LengthschedAgentLoopManagerTQ(cfg, client)
    workers = [vv1.LengthschedAgentLoopWorkerTQ(cfg, client) for _ in range(2)]
    manager.agent_loop_workers = [Remote(w) for w in workers]

    def batch(step: int, names: list[str]):
        raw = np.empty(len(names), dtype=object)
        raw[:] = [[{"role": "user", "content": q}] for q in names]
        made = tu.get_tensordict({"input_ids": torch.zeros(len(names), 2, dtype=torch.long), "raw_prompt": raw,
                                  "index": np.array([list(TRUE).index(q) for q in names]),
                                  "uid": np.array([uuid.uuid4().hex for _ in names], dtype=object)})
        tu.assign_non_tensor_data(made, "global_steps", step)
        return made

    def settle():
        for w in workers:
            loop.run_until_complete(wait(list(w.background_tasks)))

    return RealV1(manager=manager, workers=workers, servers=servers, router=router, stored=stored, tq=tq,
                  batch=batch, settle=settle, loop=loop)


@requires_v1
def test_verls_real_manager_and_worker_run_under_ours(monkeypatch):
    from verl.trainer.ppo.v1 import agent_loop_tq
    from verl.utils.import_utils import load_class_from_fqn

    base_worker = agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__
    manager_cls, worker_cls = vv1.LengthschedAgentLoopManagerTQ, vv1.LengthschedAgentLoopWorkerTQ
    # TaskRunnerV1.init_agent_loop_manager loads the class rollout.agent.agent_loop_manager_class names so.
    assert load_class_from_fqn(vv1.MANAGER_TQ_CLASS, "AgentLoopManager") is manager_cls
    assert issubclass(manager_cls, agent_loop_tq.AgentLoopManagerTQ) and issubclass(worker_cls, base_worker)
    real = real_tq(monkeypatch, config(placement="groups"))
    manager, servers, router, stored = real.manager, real.servers, real.router, real.stored
    assert manager.agent_loop_workers_class.__ray_actor_class__ is worker_cls
    try:
        first = real.batch(1, list(TRUE))
        assert manager.generate_sequences(first) is None
        real.settle()
        assert len(stored) == len(TRUE) * G and router.planned == len(TRUE) * G and router.collisions == 0
        assert all(tag["status"] == "finished" for tag in real.tq.tags["train"].values())
        assert [int(p) for p in first["priority"]] == sorted(int(p) for p in first["priority"])
        for server in servers.values():
            server.requests.clear()
        manager.generate_sequences(real.batch(2, list(TRUE)))
        real.settle()
        planner = manager.lengthsched_planner()
        assert planner.observed == len(TRUE) * G and planner.last_plan.placement == "groups"
        where = defaultdict(set)
        for sid, server in servers.items():
            for request in server.requests:
                where[request["prompt_ids"][0]].add(sid)
        assert all(len(s) == 1 for s in where.values()) and len(where) == len(TRUE)
        assert router.collisions == 0 and router.unplanned == 0
    finally:
        real.loop.close()


@requires_v1
def test_online_sgpo_sizes_reach_verls_real_worker(monkeypatch):
    """The rewards verl's postprocess sets reach the manager through our worker; the next batch's ``__rollout_n__``
    (a real TensorDict column) is popped by verl's real ``_run_prompt``, which runs that many sessions, and the
    budget is keyed by the batch's ``index`` column."""
    real = real_tq(monkeypatch, config(sgpo={"unsolved_fraction": 0.0, "rule": "pow2"}), score=solved_by_share)
    try:
        real.manager.generate_sequences(real.batch(1, list(TRUE)))
        real.settle()
        real.stored.clear()
        second = real.batch(2, list(TRUE))
        real.manager.generate_sequences(second)
        real.settle()
        expected = [4, 2, 2, 2, 4, G]  # sGPO's pow2: about 1/p; trivial, unsolved and 1/2 solved: g_min 2
        assert [int(n) for n in vv1._rows(second, vv1.ROLLOUT_N)] == expected
        sessions = defaultdict(int)
        for uid, _ in real.stored:
            sessions[uid] += 1
        assert [sessions[u] for u in vv1._rows(second, "uid")] == expected
        assert real.manager.lengthsched_sgpo.budget.success_rate(text_key("q0")) == 0.25
    finally:
        real.loop.close()


# ----------------------------------------------------------------------------- stealing in the v1 trainer
class LiveWorkerTQ(FakeWorkerTQ):
    """The fake worker whose ``generate_sequences`` starts each prompt's sessions as tasks and returns, as verl's
    v1 worker does ("fire-and-forget"): they run on the harness's loop beside the stepped engines."""

    def __init__(self, config, llm_client, teacher_client=None, reward_loop_worker_handles=None):
        super().__init__(config, llm_client, teacher_client, reward_loop_worker_handles)
        self.tasks: list[asyncio.Task] = []

    async def generate_sequences(self, batch) -> None:
        for i in range(len(batch)):
            prompt = {k: (v if k in FakeBatch.SCALARS else v[i]) for k, v in batch.items()}
            trajectory = {"validate": prompt.pop("validate")}
            self.tasks.append(asyncio.ensure_future(self._run_prompt(prompt, {"max_tokens": 512}, trajectory)))


class Live:
    """verl's v1 rollout, live: the stealing manager (over the fake v1 base) dispatches batches synchronously, as
    ``TaskRunnerV1`` calls it, while the workers' sessions, the stealing client, our router, the vLLM servers with
    snapshots over stepped engines (test_verl_stealing's: ``max_num_seqs`` running at a time, one token each per step)
    and the manager's driver all run on one event loop in a thread of their own (the manager's :class:`LoopThread`,
    shared), the engines stepped every 0.5 ms.
    ``lengths[k]``: the true length of prompt ``k``'s completions (its ``prompt_ids`` are ``[k, 0, 0, 0]``)."""

    def __init__(self, lengths: dict[int, int], *, replicas: int = 2, max_num_seqs: int = 2, snapshots: bool = True,
                 multi_turn: bool = False, sync_at: tuple[int, ...] = (), **lengthsched: Any):
        from test_verl_stealing import FakeFullyAsyncLLMServerClient, FakeVLLMHttpServer, cluster, per_turn_length_of

        self.lengths, self.multi_turn, self.sync_at = lengths, multi_turn, set(sync_at)
        self.engines, servers, self.router = cluster(lengths, max_num_seqs=max_num_seqs, replicas=replicas,
                                                     true_length=per_turn_length_of(lengths) if multi_turn else None)
        if not snapshots:  # verl's own server class: what the v1 trainer builds without the setup hook
            plain = [FakeVLLMHttpServer(e) for e in self.engines]
            self.router = lv.PlannedLoadBalancer({f"10.0.0.{r}:8000": Remote(s) for r, s in enumerate(plain)})
        self.manager_cls = self.make_manager_class(FakeFullyAsyncLLMServerClient)
        self.config = config(**lengthsched)
        if multi_turn:  # verl's switch for tool loops (the stealing driver follows their turns)
            self.config["actor_rollout_ref"]["rollout"]["multi_turn"] = {"enable": True}
        self.plain = SimpleNamespace(config=self.config, _load_balancer=Remote(self.router))
        self.manager = self.manager_cls(config=self.config, llm_client=self.plain, teacher_client=None,
                                        reward_loop_worker_handles=None)
        # the loop and the stepper only once the manager is made (a config it refuses leaves no thread running)
        self.shared = vs.LoopThread("test-cluster")
        self.steps = 0
        self._stop = False
        self.shared.run(self._start_stepper())
        self.manager.lengthsched_loop = self.shared  # one loop for everything (the driver's own otherwise)
        self.workers = [self.make_worker() for _ in range(2)]
        self.manager.agent_loop_workers = [Remote(w) for w in self.workers]

    def get(self, ref: Any) -> Any:
        """``ray.get``: the result of a fake actor call, awaited on the cluster's loop."""
        return self.shared.run(_awaited(ref))

    def make_manager_class(self, fully_async_client: type) -> type:
        get = self.get

        class LiveBase(FakeAgentLoopManagerTQ):
            run = staticmethod(get)

        return vv1.make_tq_stealing_manager_class(vv1.make_tq_agent_loop_manager_class(LiveBase, "live", get=get),
                                                  vs.make_stealing_client_class(fully_async_client))

    def make_worker(self) -> Any:
        worker = vv1.make_tq_worker_class(LiveWorkerTQ)(self.config, self.manager.llm_client)
        if self.multi_turn:
            worker.agent_name = "tool_agent"
        return worker

    def tasks(self) -> list:
        """The sessions' tasks started so far (verl's worker keeps those still running)."""
        return [t for w in self.workers for t in w.tasks]

    async def _start_stepper(self) -> None:
        async def step():
            while not self._stop:
                for _ in range(20):
                    await asyncio.sleep(0)
                if self.steps in self.sync_at:  # verl's async trainers at a weight sync: every request aborted
                    self.sync_at.discard(self.steps)  # (abort_replicas; the fully-async client resubmits them)
                    for e in self.engines:
                        for state in list(e.waiting) + list(e.running):
                            await e.abort(state.external_req_id)
                if any(e.running or e.waiting for e in self.engines):
                    for e in self.engines:
                        e.step()
                    self.steps += 1
                await asyncio.sleep(0.0005)
        self._stepper = asyncio.ensure_future(step())

    def batch(self, step: int, prompts: list[int], fail: str | None = None) -> FakeBatch:
        made = FakeBatch(uid=[f"s{step}-p{k}-{uuid.uuid4().hex[:6]}" for k in prompts],
                         raw_prompt=[[{"role": "user", "content": f"p{k}"}] for k in prompts],
                         prompt_ids=[[k, 0, 0, 0] for k in prompts], global_steps=step, validate=False)
        if fail is not None:
            for w in self.workers:
                w.fail.add(fail)
        return made

    def settle(self) -> int:
        """Wait for every session started so far; then the driver's last poll. Returns the engine steps so far."""
        async def wait():
            await asyncio.gather(*self.tasks())
            driver = self.manager.lengthsched_driver
            if driver is not None:
                await driver.poll_once()
        self.shared.run(wait())
        return self.steps

    def close(self) -> None:
        self._stop = True
        self.shared.run(_awaited(self._stepper))
        self.manager.lengthsched_close()


async def _awaited(ref: Any) -> Any:
    return [await r for r in ref] if isinstance(ref, list) else await ref


def stored_lengths(live: Live) -> dict[int, list[int]]:
    """Per prompt, the tokens each of its stored sessions generated (what the workers handed the manager)."""
    out: dict[int, list[int]] = defaultdict(list)
    for w in live.workers:
        for uid, lengths, _ in w._lengthsched_done:
            out[int(uid.split("-")[1][1:])].extend(lengths)
    return out


def test_the_v1_stealing_manager_runs_online_sgpos_group_sizes_row_by_row():
    """With lengthsched.sgpo the stealing manager plans each prompt's own number of rows: one priority per session
    (the PRIORITIES column as long as its __rollout_n__), every session run and reported, the driver left empty."""
    lengths = {0: 12, 1: 4, 2: 4, 3: 6}
    solved = {"p0": 0.25, "p1": 1.0, "p2": 0.0, "p3": 0.5}
    live = Live(lengths, placement="groups", steal={"pool_tokens": 100_000, "poll_interval": 0.001},
                sgpo={"rule": "pow2", "unsolved_fraction": 0.0})
    try:
        for w in live.workers:
            w.score = lambda name, session: float(session < solved[name] * G)
        manager = live.manager
        manager.generate_sequences(live.batch(1, list(lengths)))
        live.settle()
        second = live.batch(2, list(lengths))
        manager.generate_sequences(second)
        sizes = list(second[vv1.ROLLOUT_N])
        assert sizes == [4, 2, 2, 2]  # 1/4 solved: 4; trivial, unsolved and 1/2 solved: g_min
        assert [len(p) for p in second[vv1.PRIORITIES]] == sizes
        live.settle()
        done = defaultdict(int)  # what the workers will hand over: each session's length
        for w in live.workers:
            for uid, ran, _ in w._lengthsched_done:
                done[uid] += len(ran)
        assert [done[u] for u in second["uid"]] == sizes
        manager.lengthsched_collect()
        assert not manager.lengthsched_driver._rows and not manager.lengthsched_running
        assert manager.lengthsched_sgpo_status()["groups"] == 8
    finally:
        live.close()


def test_the_v1_stealing_manager_gives_each_completion_its_row_and_steals_across_dispatches():
    lengths = {0: 40, 1: 4, 2: 4, 3: 4, 4: 4, 5: 4}  # prompt 0's four completions are long
    steal = {"pool_tokens": 100_000, "poll_interval": 0.001}
    live = Live(lengths, placement="groups", steal=steal)
    try:
        manager = live.manager
        # verl's plain client swapped for the stealing one, on the same router
        assert type(manager.llm_client).__name__ == "StealingLLMServerClient"
        assert manager.llm_client._load_balancer is live.plain._load_balancer
        first = live.batch(1, list(lengths))
        assert manager.generate_sequences(first) is None
        driver = manager.lengthsched_driver
        plan = manager.lengthsched_planner().last_plan
        assert (plan.placement, plan.order) == ("groups", "batch")
        # Every session has its own priority: the plan's rows, each prompt's lowest first; its requests keep it.
        rows = {uid: sorted(int(plan.priority[i]) for i, g in enumerate(plan.group) if plan.group_keys[g] == uid)
                for uid in first["uid"]}
        assert [list(p) for p in first[vv1.PRIORITIES]] == [rows[u] for u in first["uid"]]
        assert list(first["priority"]) == [rows[u][0] for u in first["uid"]]
        live.settle()
        seen = {vs.parse_vllm_request_id(s.external_req_id)[0] for e in live.engines
                for s in e.output_processor.request_states.values()}
        assert not seen  # all done
        keys = [vs.parse_vllm_request_id(rid)[0] for e in live.engines for rid in e.started]
        assert set(keys) == {str(p) for r in rows.values() for p in r}  # every row's own key reached an engine
        assert live.router.collisions == 0 and live.router.planned >= len(lengths) * G
        # The long prompt's group sat on one replica; the other drained and took its waiting completions.
        assert driver.stats.steals + driver.stats.moves > 0 and not driver._rows
        assert stored_lengths(live) == {k: [n] * G for k, n in lengths.items()}  # nothing lost or cut
        # The next dispatch: the same driver goes on; the lengths learned; a session failing before it reaches an
        # engine leaves a row the driver counts as waiting until its prompt is heard finish.
        second = live.batch(2, [1, 2], fail="p2")
        manager.generate_sequences(second)
        assert manager.lengthsched_driver is driver and manager.lengthsched_planner().observed == len(lengths) * G
        live.settle()
        failed = second[vv1.PRIORITIES][1]  # p2's rows
        assert list(driver._rows) == [str(failed[0])]  # session 0 of p2 failed before it was sent
        manager.lengthsched_collect()
        assert not driver._rows and not manager.lengthsched_running
        status = manager.lengthsched_status()
        assert status["replicas"] == 2 and status["steals"] == driver.stats.steals and status["restarts"] == 0
    finally:
        live.close()
    assert live.manager.lengthsched_loop is None and driver._task is None


def test_stealing_in_the_v1_trainer_finishes_the_step_sooner():
    lengths = {0: 20, 1: 20, 2: 20}  # three groups of four on two replicas: two groups on one of them
    steps = {}
    for name, poll in (("steal", 0.001), ("none", 1000.0)):  # polled once at the start only: nothing to steal
        live = Live(lengths, max_num_seqs=1, placement="groups", steal={"pool_tokens": 100_000,
                                                                         "poll_interval": poll})
        try:
            live.manager.generate_sequences(live.batch(1, list(lengths)))
            steps[name] = live.settle()
            assert stored_lengths(live) == {k: [n] * G for k, n in lengths.items()}
        finally:
            live.close()
    # Without stealing one replica runs its eight completions one at a time (160 steps), the other its four (80);
    # the replica that drained takes waiting ones (about 120 steps).
    assert steps["none"] == 160 and steps["steal"] < 0.85 * steps["none"], steps


def test_the_v1_stealing_manager_needs_vllm_the_steal_section_and_servers_with_snapshots():
    with pytest.raises(InvalidArgument, match="lengthsched.steal"):
        Live({0: 4}).close()
    made = config(steal={"pool_tokens": 1000})
    made["actor_rollout_ref"]["rollout"]["name"] = "sglang"
    live = Live({0: 4}, steal={"pool_tokens": 1000})
    try:
        with pytest.raises(InvalidArgument, match="rollout.name"):
            live.manager_cls(made, live.plain)
        # Without the setup hook verl's v1 trainer builds its own server class: the first dispatch says what to add.
        assert live.manager.lengthsched_planner().placement == "ways"  # steal's placement by default
    finally:
        live.close()
    plain = Live({0: 4, 1: 4}, snapshots=False, steal={"pool_tokens": 1000})
    try:
        with pytest.raises(RuntimeError, match="worker_process_setup_hook=lengthsched.integrations.verl_stealing"):
            plain.manager.generate_sequences(plain.batch(1, [0, 1]))
    finally:
        plain.close()


def test_the_v1_worker_runs_each_session_with_its_own_priority():
    calls = []

    class Base:
        async def _run_agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
            calls.append(kwargs)

        async def _agent_loop_postprocess(self, output, validate, **kwargs):
            return None

    worker = object.__new__(vv1.make_tq_worker_class(Base))
    run = worker._run_agent_loop

    async def go():
        await run({}, {}, agent_name="a", session_id=1, priority=3, **{vv1.PRIORITIES: [8, 10, 12]})
        await run({}, {}, agent_name="a", session_id=0, priority=3)  # no column: the prompt's priority
        await run({}, {}, agent_name="a", session_id=5, priority=3, **{vv1.PRIORITIES: [8]})  # none for it
    asyncio.run(go())
    assert [c["priority"] for c in calls] == [10, 3, 3] and all(vv1.PRIORITIES not in c for c in calls)


def real_v1(monkeypatch, agent_loop: Any = None) -> type:
    """A ``Live`` over verl's real v1 classes: the stealing manager loaded as verl loads it, its real
    AgentLoopManagerTQ and AgentLoopWorkerTQ (generate_sequences, _run_prompt: the TensorDict, its non-tensor columns
    to the sessions' keyword arguments) and its real fully-async client; TransferQueue, the engines and the agent loop
    are fakes: ``agent_loop`` replaces the worker's ``_run_agent_loop`` (None: verl's own runs, which instantiates
    the registered agent loop with the worker's client)."""
    import torch
    from verl.trainer.ppo.v1 import agent_loop_tq
    from verl.utils import tensordict_utils as tu
    from verl.utils.import_utils import load_class_from_fqn

    manager_cls = load_class_from_fqn(vv1.STEALING_MANAGER_TQ_CLASS, "AgentLoopManager")
    assert manager_cls is vv1.LengthschedStealingAgentLoopManagerTQ
    assert issubclass(manager_cls, vv1.LengthschedAgentLoopManagerTQ)
    base_worker = agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__
    monkeypatch.setattr(agent_loop_tq, "tq", AsyncTQ())

    def light_init(self, config, llm_client, teacher_client=None, reward_loop_worker_handles=None):
        self.config, self.llm_client, self.background_tasks = config, llm_client, set()
        self.tokenizer = self.processor = self.hf_model_type = self.dataset_cls = None
        self.tools = []

    async def postprocess(self, output, validate, **kwargs):
        return None

    monkeypatch.setattr(base_worker, "__init__", light_init)
    if agent_loop is not None:
        monkeypatch.setattr(base_worker, "_run_agent_loop", agent_loop)
    monkeypatch.setattr(base_worker, "_agent_loop_postprocess", postprocess)

    class RealLive(Live):
        def make_manager_class(self, fully_async_client: type) -> type:
            return manager_cls

        def make_worker(self) -> Any:
            return vv1.LengthschedAgentLoopWorkerTQ(self.config, self.manager.llm_client)

        def tasks(self) -> list:
            return [t for w in self.workers for t in w.background_tasks]

        def batch(self, step: int, prompts: list[int], fail: str | None = None) -> Any:
            raw = np.empty(len(prompts), dtype=object)
            raw[:] = [[{"role": "user", "content": f"p{k}"}] for k in prompts]
            made = tu.get_tensordict({"input_ids": torch.zeros(len(prompts), 2, dtype=torch.long), "raw_prompt": raw,
                                      "index": np.array(prompts),
                                      "uid": np.array([uuid.uuid4().hex for _ in prompts], dtype=object)})
            tu.assign_non_tensor_data(made, "global_steps", step)
            return made

    return RealLive


@requires_v1
def test_verls_real_v1_classes_run_the_stealing_manager(monkeypatch):
    """verl's real v1 classes under the stealing manager (:func:`real_v1`), the agent loop one request per
    session."""
    import ray
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient

    sessions: list[tuple[str, int, int, bool, int]] = []

    async def agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
        out = await self.llm_client.generate(uuid.uuid4().hex, prompt_ids=[int(kwargs["index"]), 0, 0, 0],
                                             sampling_params=dict(sampling_params, max_tokens=512),
                                             priority=int(kwargs["priority"]))
        sessions.append((kwargs["uid"], kwargs["session_id"], int(kwargs["priority"]), vv1.PRIORITIES in kwargs,
                         len(out.token_ids)))
        output = SimpleNamespace(response_ids=out.token_ids, response_mask=[1] * len(out.token_ids))
        return await self._agent_loop_postprocess(output, trajectory["validate"], **kwargs)

    RealLive = real_v1(monkeypatch, agent_loop)
    lengths = {0: 20, 1: 20, 2: 20}
    live = RealLive(lengths, max_num_seqs=1, placement="groups", steal={"pool_tokens": 100_000,
                                                                        "poll_interval": 0.001})
    monkeypatch.setattr(ray, "get", live.get)
    try:
        assert isinstance(live.manager.llm_client, FullyAsyncLLMServerClient)
        batch = live.batch(1, list(lengths))
        assert live.manager.generate_sequences(batch) is None
        steps = live.settle()
        plan = live.manager.lengthsched_planner().last_plan
        # each session ran with its own row's priority; the column went no further than the worker
        assert sorted(p for _, _, p, _, _ in sessions) == sorted(int(p) for p in plan.priority)
        assert not any(column for _, _, _, column, _ in sessions)
        assert sorted((u, i) for u, i, _, _, _ in sessions) == sorted((u, i) for u in batch["uid"] for i in range(G))
        assert all(n == 20 for *_, n in sessions) and live.router.collisions == 0
        driver = live.manager.lengthsched_driver
        assert driver.stats.steals > 0 and not driver._rows and steps < 0.85 * 160
    finally:
        live.close()


# ----------------------------------------------------------------------------- multi-turn agent loops
def test_every_request_of_a_session_carries_its_priority_even_where_the_agent_loop_names_none():
    """verl's ToolAgentLoop passes no priority to generate(): the worker's client gives each request its session's
    (a context variable per session task: concurrent sessions keep their own); a priority named is kept."""
    sent = []

    class Client:
        tokenizer = None

        async def generate(self, request_id, **kwargs):
            await asyncio.sleep(0)
            sent.append((request_id, kwargs.get("priority")))

    class Base:
        def __init__(self, config, llm_client):
            self.llm_client = llm_client

        async def _run_agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
            for turn in range(3):  # as ToolAgentLoop: no priority on any turn
                await self.llm_client.generate(request_id=f"{kwargs['session_id']}-{turn}", prompt_ids=[1],
                                               sampling_params={})
            await self.llm_client.generate(f"{kwargs['session_id']}-named", prompt_ids=[1], sampling_params={},
                                           priority=99)

        async def _agent_loop_postprocess(self, output, validate, **kwargs):
            return None

    inner = Client()
    worker = vv1.make_tq_worker_class(Base)(None, inner)
    assert isinstance(worker.llm_client, vv1.SessionPriorityClient) and worker.llm_client.lengthsched_client is inner
    worker.llm_client.tokenizer = "tok"  # verl's worker sets attributes on its client: they reach the client
    assert inner.tokenizer == "tok" and worker.llm_client.tokenizer == "tok"

    async def go():
        await asyncio.gather(*[worker._run_agent_loop({}, {}, agent_name="tool_agent", session_id=i, priority=3,
                                                      **{vv1.PRIORITIES: [20, 21, 22]}) for i in range(3)])
        assert vv1.SESSION_PRIORITY.get() is None  # reset after each session
        await worker.llm_client.generate("outside", prompt_ids=[1], sampling_params={})
    asyncio.run(go())
    got = dict(sent)
    assert all(got[f"{i}-{t}"] == 20 + i for i in range(3) for t in range(3))
    assert all(got[f"{i}-named"] == 99 for i in range(3)) and got["outside"] is None


def test_the_stealing_driver_follows_the_turns_of_multi_turn_sessions():
    """With verl's multi_turn switch on, every turn of a tool loop reaches its engine named by its session's row, on
    the replica the plan gave it unless the driver moved it; a finished turn does not finish the row: the next turn
    is followed where it appears, with the tokens of the turns before; the rows go when their prompts are heard
    finish."""
    lengths = {0: 30, 1: 6, 2: 6}  # tokens per turn; two turns a session
    live = Live(lengths, max_num_seqs=2, placement="groups", multi_turn=True,
                steal={"pool_tokens": 100_000, "poll_interval": 0.001})
    try:
        manager = live.manager
        batch = live.batch(1, list(lengths))
        manager.generate_sequences(batch)
        driver = manager.lengthsched_driver
        assert driver.turns and manager.lengthsched_steal.turns
        live.settle()
        rows = {str(p) for ps in batch[vv1.PRIORITIES] for p in ps}
        keys = [vs.parse_vllm_request_id(rid) for e in live.engines for rid in e.started]
        assert all(k is not None for k in keys) and {k[0] for k in keys} == rows  # every turn named by its row
        assert len(keys) >= 2 * len(rows)  # two turns each (more attempts where one moved)
        moved = {str(m.request) for m in driver.stats.applied}
        for row in rows - moved:  # a session nobody moved kept its replica for both turns
            assert len({r for r, e in enumerate(live.engines) for rid in e.started
                        if vs.parse_vllm_request_id(rid)[0] == row}) == 1
        assert stored_lengths(live) == {k: [2 * n] * G for k, n in lengths.items()}
        assert driver.stats.turns > 0 and driver.stats.errors == 0
        assert driver.coordinator.loads() == [0.0, 0.0]  # every turn let go ...
        assert set(driver._rows) == rows  # ... the rows kept until their prompts are heard finish
        manager.lengthsched_collect()
        assert not driver._rows and manager.lengthsched_status()["turns"] == driver.stats.turns
    finally:
        live.close()


def test_following_the_turns_lets_a_drained_replica_take_a_long_later_turn():
    """Prompt 0's second turns are long and sit on one replica: the driver that follows the turns sees them wait
    and the other replica, drained, takes some (steals whose progress holds the first turn's tokens); the driver
    that does not (``turns: false``) sees none of them, and no stealing at all is slower still."""
    lengths = {0: [2, 40], 1: [6, 6], 2: [6, 6]}  # tokens per turn
    steps, drivers = {}, {}
    for name, steal in (("turns", {"turns": True}), ("first turn only", {"turns": False}),
                        ("none", {"poll_interval": 1000.0})):  # polled once at the start: nothing to steal
        live = Live(lengths, max_num_seqs=2, placement="groups", multi_turn=True,
                    steal={"pool_tokens": 100_000, "poll_interval": 0.001, **steal})
        try:
            live.manager.generate_sequences(live.batch(1, list(lengths)))
            steps[name], drivers[name] = live.settle(), live.manager.lengthsched_driver
            assert stored_lengths(live) == {0: [42] * G, 1: [12] * G, 2: [12] * G}
        finally:
            live.close()
    later = [m for m in drivers["turns"].stats.applied if m.kind == "steal" and m.generated >= 2]
    assert later and drivers["turns"].stats.turns == 3 * G
    assert drivers["first turn only"].stats.turns == 0
    assert steps["turns"] <= steps["first turn only"] < steps["none"], steps


class ToolLikeAgentLoop:
    """An agent loop as verl's ``ToolAgentLoop`` talks to its client: made by verl's worker with
    ``server_manager=`` its client, ``run`` sends ``TURNS`` turns of one request id, each the conversation so far
    (the prompt, the turns before and a tool's answer) with no priority."""

    TURNS = 2

    def __init__(self, trainer_config, server_manager, **kwargs):
        self.server_manager = server_manager

    async def run(self, sampling_params, **kwargs):
        request_id, conversation, mask = uuid.uuid4().hex, [int(kwargs["index"]), 0, 0, 0], []
        for turn in range(self.TURNS):
            if turn:
                conversation += TOOL
                mask += [0] * len(TOOL)
            out = await self.server_manager.generate(request_id=request_id, prompt_ids=list(conversation),
                                                     sampling_params=dict(sampling_params, max_tokens=512))
            conversation += out.token_ids
            mask += [1] * len(out.token_ids)
        return SimpleNamespace(response_ids=conversation[4:], response_mask=mask)


@requires_v1
def test_verls_own_agent_loop_runner_gives_every_turn_of_a_tool_loop_its_sessions_priority(monkeypatch):
    """verl's real worker runs a registered multi-turn loop (its ``_run_agent_loop``: the loop made with the worker's
    client, ``run`` with the session's columns) under the stealing manager with verl's multi_turn switch on: every
    turn reaches its engine named by its session's row, and the driver follows the turns."""
    import ray
    from verl.experimental.agent_loop import agent_loop as verl_agent_loop

    monkeypatch.setitem(verl_agent_loop._agent_loop_registry, "lengthsched_test_tool_agent",
                        {"_target_": f"{__name__}.ToolLikeAgentLoop"})
    RealLive = real_v1(monkeypatch)
    lengths = {0: [2, 30], 1: [6, 6], 2: [6, 6]}
    live = RealLive(lengths, max_num_seqs=2, placement="groups", multi_turn=True,
                    steal={"pool_tokens": 100_000, "poll_interval": 0.001})
    live.config["data"] = {}
    live.config["actor_rollout_ref"]["rollout"]["agent"]["default_agent_loop"] = "lengthsched_test_tool_agent"
    monkeypatch.setattr(ray, "get", live.get)
    try:
        batch = live.batch(1, list(lengths))
        live.manager.generate_sequences(batch)
        live.settle()
        plan = live.manager.lengthsched_planner().last_plan
        keys = [vs.parse_vllm_request_id(rid) for e in live.engines for rid in e.started]
        assert all(k is not None for k in keys) and {k[0] for k in keys} == {str(int(p)) for p in plan.priority}
        assert len(keys) >= 2 * len(plan.priority)  # both turns of every session, each named by its row
        driver = live.manager.lengthsched_driver
        assert driver.stats.turns > 0 and driver.stats.errors == 0 and live.router.collisions == 0
        done = {uid: n for w in live.workers for uid, n, _ in w._lengthsched_done}
        assert sorted(sum(v) for v in done.values()) == sorted(sum(lengths[k]) * G for k in lengths)
    finally:
        live.close()


def test_the_v1_stealing_manager_follows_requests_that_verls_async_trainers_abort_at_a_weight_sync():
    """verl's colocate_async trainer aborts every request at each weight sync (abort_replicas) and its fully-async
    client resubmits them with their tokens: the driver takes each up again where it reappears, at the progress its
    id carries, and keeps stealing; every session still ends with its own length."""
    lengths = {0: 40, 1: 8, 2: 8}
    live = Live(lengths, max_num_seqs=2, placement="groups", sync_at=(6, 20),
                steal={"pool_tokens": 100_000, "poll_interval": 0.001})
    try:
        live.manager.llm_client.retry_delay = 0.02  # verl's client waits (1 s) before it resubmits: 20 polls here
        live.manager.generate_sequences(live.batch(1, list(lengths)))
        live.settle()
        driver = live.manager.lengthsched_driver
        assert not live.sync_at  # both syncs happened
        assert stored_lengths(live) == {k: [n] * G for k, n in lengths.items()}
        status = live.manager.lengthsched_status()
        assert status["resumed"] > 0 and status["errors"] == 0 and status["steals"] + status["moves"] > 0
        carried = [vs.carried_tokens(vid) for e in live.engines for vid in e.started]
        assert max(c for c in carried if c is not None) > 0  # resubmissions carried their tokens
        assert driver.coordinator.loads() == [0.0, 0.0]
    finally:
        live.close()
