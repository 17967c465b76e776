"""lengthsched.integrations.verl_async: each group of verl's fully asynchronous recipe placed by predicted work,
one StealDriver for the run (across weight updates), and installing both into the recipe.

The fakes follow verl 0.9.1's recipe (``experimental/fully_async_policy/fully_async_rollouter.py``:
``FullyAsyncAgentLoopManager.generate_sequences_single`` sends one prompt's rows to an agent-loop worker;
the rollouter keeps up to ``max_concurrent_samples`` groups in flight; a weight update aborts every request
in flight and ``FullyAsyncLLMServerClient`` resubmits each with its tokens) and the vLLM fakes of
test_verl_stealing. Where verl is importable, :func:`install` also runs against the recipe's real module.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import uuid
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_verl import VERL, Config, FakeBatch, Remote, requires_verl, trainer_config
from test_verl_stealing import FakeFullyAsyncLLMServerClient, cluster

from lengthsched import InvalidArgument
from lengthsched.integrations import StealCoordinator, spread_ways
from lengthsched.integrations import verl_async as va
from lengthsched.integrations import verl_stealing as vs


# ----------------------------------------------------------------------------- the placer
def test_whole_groups_go_to_the_least_loaded_replica_with_unique_priorities_naming_it():
    placer = va.StreamPlacer(1000, ways=1)
    replica, priority = placer.place([50.0] * 4, 10, 3, loads=[300.0, 100.0, 200.0])
    base = va.StreamPlacer.ROW_BASE * 3  # far above the priorities verl gives a validation batch (0 to n - 1)
    assert replica.tolist() == [1] * 4  # whole group, least predicted work in flight
    assert priority.tolist() == [base + k * 3 + 1 for k in range(4)]
    replica, priority = placer.place([10.0] * 2, 10, 3, loads=[0.0, 500.0, 0.0])
    assert replica.tolist() == [0, 0]
    assert priority.tolist() == [base + 12, base + 15]  # row numbers go on: unique for the run
    assert (priority % 3 == replica).all() and placer.groups == 2 and placer.rows == 6


def test_the_spread_follows_the_groups_in_flight_and_their_prompts():
    # prompts of 1,000 tokens, 64 groups in flight, 8 replicas: a tight pool holds few prompts -> whole groups
    tight = va.StreamPlacer(8_000, concurrency=64)
    roomy = va.StreamPlacer(4_000_000, concurrency=64, prefill_share=None)
    capped = va.StreamPlacer(4_000_000, concurrency=64)  # PREFILL_SHARE: prompts re-prefilled <= 0.1 of the work
    short = va.StreamPlacer(4_000_000, concurrency=64)
    for placer in (tight, roomy, capped):
        assert placer.ways_for(8) == 8  # nothing seen yet: verl's spread
        placer.place([500.0] * 16, 1000, 8, loads=[0.0] * 8)
    short.place([500.0] * 16, 100, 8, loads=[0.0] * 8)
    assert tight.ways_for(8) == spread_ways([1000] * 64, 8_000, 8, work_tokens=64 * 8000.0) == 1
    assert roomy.ways_for(8) == spread_ways([1000] * 64, 4_000_000, 8, work_tokens=64 * 8000.0) == 8
    # a group of 8,000 predicted tokens whose prompt is 1,000: one more replica would re-prefill 12.5% > 10%
    assert capped.ways_for(8) == 1 + int(0.1 * 8000 / 1000) == 1
    assert short.ways_for(8) == min(8, 1 + int(0.1 * 8000 / 100)) == 8  # a short prompt spreads as verl does
    assert spread_ways([1000] * 4, 4_000_000, 8, work_tokens=4 * 8000.0, prefill_share=0.3) == 3
    with pytest.raises(InvalidArgument, match="work_tokens"):
        spread_ways([1000], 4_000_000, 8, prefill_share=0.1)
    with pytest.raises(InvalidArgument, match="prefill_share"):
        va.StreamPlacer(100, prefill_share=0.0)
    # a spread group continues the round robin where the last group stopped
    replica, _ = roomy.place([1.0] * 3, 1000, 8)
    assert replica.tolist() == [0, 1, 2]
    replica, _ = roomy.place([1.0] * 3, 1000, 8)
    assert replica.tolist() == [3, 4, 5]
    assert va.StreamPlacer(100, ways=4).ways_for(2) == 2


def test_a_fixed_spread_widens_until_the_groups_in_flight_reach_every_replica():
    # whole groups with 4 in flight on 8 replicas would leave 4 idle: 2 replicas a group; None: 16 per replica
    assert [va.StreamPlacer(10, ways=1, concurrency=c).ways_for(8) for c in (1, 3, 4, 8, 64, None)] == \
        [8, 3, 2, 1, 1, 1]
    assert va.StreamPlacer(10, ways=3, concurrency=8).ways_for(8) == 3
    assert va.StreamPlacer(10, ways=3, concurrency=2).ways_for(8) == 4
    placer = va.StreamPlacer(10, ways=1, concurrency=2)
    replica, _ = placer.place([5.0] * 4, 1, 8, loads=[0.0] * 8)
    assert placer.last_ways == 4 and len(set(replica.tolist())) == 4


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 5000), min_size=1, max_size=12), st.integers(0, 3000)),
                min_size=1, max_size=12), st.integers(1, 6), st.integers(1, 200_000),
       st.one_of(st.none(), st.integers(1, 8)))
def test_every_row_is_placed_on_a_replica_its_priority_names_and_no_priority_repeats(groups, replicas, pool, ways):
    placer = va.StreamPlacer(pool, ways=ways, concurrency=8)
    loads = np.zeros(replicas)
    seen = set()
    for lengths, prompt in groups:
        replica, priority = placer.place([float(x) for x in lengths], prompt, replicas, loads=loads.tolist())
        assert len(replica) == len(lengths) and ((0 <= replica) & (replica < replicas)).all()
        assert (priority % replicas == replica).all() and not seen & set(priority.tolist())
        seen |= set(priority.tolist())
        if placer.last_ways == 1:
            assert len(set(replica.tolist())) == 1
        np.add.at(loads, replica, lengths)


def test_the_placer_names_bad_arguments():
    with pytest.raises(InvalidArgument, match="pool_tokens"):
        va.StreamPlacer(0)
    with pytest.raises(InvalidArgument, match="ways"):
        va.StreamPlacer(10, ways=0)
    placer = va.StreamPlacer(10)
    with pytest.raises(InvalidArgument, match="predicted"):
        placer.place([], 1, 2)
    with pytest.raises(InvalidArgument, match="predicted"):
        placer.place([float("nan")], 1, 2)
    with pytest.raises(InvalidArgument, match="loads"):
        placer.place([1.0], 1, 2, loads=[1.0])


def test_the_recipes_concurrency_and_learner_batch_come_from_its_config():
    config = Config({"actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 32}, "rollout": {"name": "vllm"}},
                     "async_training": {"require_batches": 2, "trigger_parameter_sync_step": 4,
                                        "staleness_threshold": 0.1, "concurrent_samples_per_replica": 16}})
    assert va.learner_groups_of(config) == 256
    assert va.concurrency_of(config, 4) == 64  # 4 x 16, below 256 x 1.1
    assert va.concurrency_of(config, 64) == int(256 * 1.1)
    assert va.learner_groups_of(Config({})) is None and va.concurrency_of(Config({}), 3) == 48
    assert va.concurrency_of(Config({"lengthsched": {"concurrency": 5}}), 3) == 5
    with pytest.raises(InvalidArgument, match="lengthsched.concurrency"):
        va.concurrency_of(Config({"lengthsched": {"concurrency": 0}}), 3)


def test_vllm_ids_carry_the_tokens_of_earlier_attempts_and_the_coordinator_reports_its_loads():
    vid = vs.vllm_request_id(12, "rid~x", carried=37)
    assert vs.parse_vllm_request_id(vid) == ("12", "rid~x") and vs.carried_tokens(vid) == 37
    assert vs.carried_tokens(vs.vllm_request_id(12, "rid")) is None  # made without it
    assert vs.carried_tokens(uuid.uuid4().hex) is None
    with pytest.raises(InvalidArgument, match="carried"):
        vs.vllm_request_id(1, "r", carried=-1)
    coordinator = StealCoordinator(2, 1000)
    coordinator.submit("a", 0, 100.0, group="g")
    coordinator.submit("b", 0, 50.0, group="g")
    coordinator.submit("c", 1, 7.0)
    assert coordinator.loads() == [150.0, 7.0]
    coordinator.finish("a")
    assert coordinator.loads() == [50.0, 7.0]


# ----------------------------------------------------------------------------- the recipe, faked
class FakeFullyAsyncAgentLoopManager:
    """verl 0.9.1's ``FullyAsyncAgentLoopManager``: ``AgentLoopManager.__init__(config, llm_client,
    teacher_client=None, reward_loop_worker_handles=None)``; ``generate_sequences_single`` sends the group to
    the next agent-loop worker (round robin) and returns its output."""

    def __init__(self, config, llm_client, teacher_client=None, reward_loop_worker_handles=None):
        self.config, self.llm_client = config, llm_client
        self.agent_loop_workers: list = []

    async def generate_sequences_single(self, prompts):
        worker = self.agent_loop_workers[getattr(self, "_worker_index", 0)]
        self._worker_index = (getattr(self, "_worker_index", 0) + 1) % len(self.agent_loop_workers)
        return await worker.generate_sequences.remote(prompts)


class Worker:
    """An agent-loop worker running verl's single-turn loop: each row's ``priority`` (0 where the batch has
    none, as ``SingleTurnAgentLoop`` defaults) to ``client.generate`` with a fresh request id; prompts
    ``[row, 0, 0, 0]``."""

    def __init__(self, client):
        self.client = client

    async def generate_sequences(self, batch):
        ntb = batch.non_tensor_batch
        priorities = ntb.get("priority", np.zeros(len(batch), dtype=np.int64))
        outs = await asyncio.gather(*[
            self.client.generate(uuid.uuid4().hex, prompt_ids=[int(ntb["row"][i]), 0, 0, 0],
                                 sampling_params={"max_tokens": 512}, priority=int(priorities[i]))
            for i in range(len(batch))])
        mask = np.zeros((len(batch), 512), dtype=np.int64)
        for i, out in enumerate(outs):
            mask[i, :len(out.token_ids)] = 1
        return FakeBatch({}, {"response_mask": mask}, {})


def group_batch(k: int, g: int, prompt: str):
    """Group ``k`` of the stream: ``g`` rows (rows k*g ...) of one prompt, as the rollouter hands them over."""
    raw = np.empty(g, dtype=object)
    raw[:] = [[{"role": "user", "content": prompt}]] * g
    return FakeBatch({"uid": np.array([f"uid_sample_{k}"] * g, dtype=object), "raw_prompt": raw,
                      "row": np.arange(k * g, (k + 1) * g)})


def run_stream(lengths_of_group, *, replicas=2, concurrency=3, lengthsched=True, sync_at=(), seats=2,
               prompts=None, base=FakeFullyAsyncLLMServerClient, add_at=None, **options):
    """A stream of groups (group k's true lengths ``lengths_of_group[k]``) through the recipe's manager (with
    lengthsched installed, or verl's own: the fully-async client and a router that balances by requests in
    flight; ``base``: the fully-async client class, verl's real one where it is importable) over stepped fake
    vLLM engines, ``concurrency`` groups in flight as the rollouter keeps them; at
    each step in ``sync_at`` every request in flight is aborted as a weight update does; at step ``add_at`` a
    replica joins (the router's ``add_servers``, as the recipe adds a hybrid replica). Returns (steps,
    outputs per group, manager, engines, client, the groups' batches: the manager wrote their priorities)."""
    g = len(lengths_of_group[0])
    lengths = {k * g + i: n for k, group in enumerate(lengths_of_group) for i, n in enumerate(group)}
    engines, servers, router = cluster(lengths, max_num_seqs=seats, replicas=replicas)
    config = trainer_config(response_length=512, **({"steal": {"pool_tokens": 100_000, "poll_interval": 0.001},
                                                       **options} if lengthsched else {}))
    plain = base(config=config, load_balancer_handle=Remote(router))
    if lengthsched:
        client_cls = vs.make_stealing_client_class(base)
        manager = va.make_fully_async_manager_class(FakeFullyAsyncAgentLoopManager, client_cls)(config, plain)
    else:
        manager = FakeFullyAsyncAgentLoopManager(config, plain)
    manager.agent_loop_workers = [Remote(Worker(manager.llm_client)), Remote(Worker(manager.llm_client))]
    prompts = prompts or [f"prompt {k}" for k in range(len(lengths_of_group))]

    batches = [group_batch(k, g, prompts[k]) for k in range(len(lengths_of_group))]

    async def go():
        pending = list(range(len(lengths_of_group)))
        active: dict[int, asyncio.Task] = {}
        done: dict[int, FakeBatch] = {}
        steps, synced = 0, set()
        while pending or active:
            while pending and len(active) < concurrency:
                k = pending.pop(0)
                active[k] = asyncio.ensure_future(manager.generate_sequences_single(batches[k]))
            await asyncio.sleep(0.0005)
            for k in [k for k, t in active.items() if t.done()]:
                done[k] = active.pop(k).result()
            if steps == add_at and len(engines) == replicas:  # a hybrid replica joins
                extra_engines, extra_servers, _ = cluster(lengths, max_num_seqs=seats, replicas=1)
                engines.append(extra_engines[0])
                servers.append(extra_servers[0])
                router.add_servers({"10.0.1.0:8000": Remote(extra_servers[0])})
            if steps in sync_at and steps not in synced:  # a weight update: every request in flight aborted
                synced.add(steps)  # (vLLM's pause_generation)
                for server in servers:
                    for state in list(server.engine.waiting) + list(server.engine.running):
                        await server.engine.abort(state.external_req_id)
            if any(e.running or e.waiting for e in engines):
                for e in engines:
                    e.step()
                steps += 1
            assert steps < 20_000
        if lengthsched:
            await manager.lengthsched_driver.stop()
        return steps, [done[k] for k in range(len(lengths_of_group))]

    steps, outs = asyncio.run(go())
    for k, out in enumerate(outs):  # every row finishes once, with its own length, whatever moved
        assert out.batch["response_mask"].sum(-1).tolist() == list(lengths_of_group[k])
    return steps, outs, manager, engines, manager.llm_client, batches


def replicas_of_rows(engines):
    """Per row key (priority), the replicas its attempts started on."""
    out: dict[int, set] = {}
    for r, e in enumerate(engines):
        for vid in e.started:
            parsed = vs.parse_vllm_request_id(vid)
            if parsed:
                out.setdefault(int(parsed[0]), set()).add(r)
    return out


def test_each_group_is_placed_whole_by_predicted_work_and_the_driver_runs_for_the_whole_stream():
    groups = [[30, 30, 30, 30]] * 6
    steps, outs, manager, engines, client, batches = run_stream(
        groups, ways=1, steal={"pool_tokens": 100_000, "poll_interval": 0.001, "chunk": None})
    status = manager.lengthsched_status()
    assert status["groups"] == 6 and status["ways"] == 1 and status["restarts"] == 0 and status["replicas"] == 2
    assert status["polls"] > 0 and status["errors"] == 0
    # every group placed whole (its rows' priorities name one replica), the groups on both replicas; a row
    # that started anywhere else was stolen there
    placed = [set((b.non_tensor_batch["priority"] % 2).tolist()) for b in batches]
    assert all(len(s) == 1 for s in placed) and set().union(*placed) == {0, 1}
    where, moved = replicas_of_rows(engines), {m.request: m.target for m in manager.lengthsched_driver.stats.applied}
    for b, home in zip(batches, placed):
        for p in b.non_tensor_batch["priority"].tolist():
            assert where[p] == home or (p in moved and where[p] <= home | {moved[p]})
    assert manager.lengthsched_driver.coordinator.loads() == [0.0, 0.0]  # everything finished, nothing left
    assert manager.lengthsched_planner.steps == 0  # no learner batch size in the config: one rollout step


def test_a_replica_that_drains_steals_the_waiting_rows_of_a_long_group():
    # group 0 is long: placed whole on one replica, its rows wait there for seats; the other replica drains
    # its short groups and steals them.
    groups = [[80, 80, 80, 80], [3, 3, 3, 3], [3, 3, 3, 3]]
    plain_steps, *_ = run_stream(groups, lengthsched=False, concurrency=3)
    steps, _, manager, engines, client, _ = run_stream(groups, concurrency=3, ways=1)
    status = manager.lengthsched_status()
    assert status["steals"] > 0 and status["cancelled"] >= 0
    assert client.waits == 0  # moved attempts resubmitted at once
    # without polls (one at the start) nothing is stolen: the long group runs two at a time on one replica
    still, _, idle, *_ = run_stream(groups, concurrency=3, ways=1, steal={"pool_tokens": 100_000,
                                                                           "poll_interval": 1000.0})
    assert idle.lengthsched_status()["steals"] == 0 and steps < 0.7 * still
    # verl's spread puts two long rows on each replica from the start, which wins on these engines (they have
    # no KV pool, where a whole group holds its prompt once: what placing whole groups buys); stealing gets
    # within the rows' wait for a poll and a replica to drain
    assert plain_steps <= steps <= 1.15 * plain_steps


def test_a_replica_that_joins_steals_the_requests_in_flight_the_new_driver_took_over():
    """The recipe adds a hybrid replica (router.add_servers): the next group starts a new driver over three
    replicas, which takes over the requests in flight of the first two; the new replica, empty, steals rows
    of groups placed before it joined, and every row still finishes once with its own length."""
    groups = [[60, 60, 60, 60]] * 4 + [[5, 5, 5, 5]] * 4
    steps, _, manager, engines, client, batches = run_stream(groups, concurrency=4, ways=1, add_at=3)
    status = manager.lengthsched_status()
    assert status["restarts"] == 1 and status["replicas"] == 3 and status["adopted"] > 0
    early = {p for b in batches[:4] for p in b.non_tensor_batch["priority"].tolist()}  # placed before it joined
    joined = {int(vs.parse_vllm_request_id(vid)[0]) for vid in engines[2].started}
    assert joined & early  # the new replica ran rows it took over
    assert manager.lengthsched_driver.coordinator.loads() == [0.0, 0.0, 0.0]  # every row let go


def test_a_driver_takes_over_another_drivers_requests_by_server():
    """StealDriver.adopt: the requests on servers that stayed keep their progress, attempt and prediction on
    their replica's new index; those on a server that left stay in the rows, out of the coordinator's view
    until a snapshot shows them."""
    lengths = {k: 50 for k in range(6)}
    engines, servers, router = cluster(lengths, max_num_seqs=1, replicas=2)
    old = vs.StealDriver(StealCoordinator(2, 10_000), router, servers)
    for k in range(6):
        old.submit(k, k % 2, 40.0 + k, prompt_tokens=7, group=k // 3)
    old.coordinator.observe(0, {0: 12, 2: 0, 4: 0})
    engines3, servers3, _ = cluster(lengths, max_num_seqs=1, replicas=3)
    new = vs.StealDriver(StealCoordinator(3, 10_000), router, servers3)
    assert new.adopt(old, [2, None]) == 3  # old replica 0 is replica 2 here; old replica 1's server left
    assert [new.coordinator.replica_of(k) for k in range(6)] == [2, None, 2, None, 2, None]
    assert new.coordinator.generated_of(0) == 12 and new.coordinator.loads() == [0.0, 0.0, 40.0 + 42.0 + 44.0]
    assert sorted(new._rows) == [str(k) for k in range(6)]  # the others come back into view when seen
    assert new.adopt(old, [2, None]) == 0  # nothing twice
    with pytest.raises(InvalidArgument, match="replicas"):
        new.adopt(old, [0])
    with pytest.raises(InvalidArgument, match="replicas"):
        new.adopt(old, [3, None])
    with pytest.raises(InvalidArgument, match="other"):
        new.adopt("driver", [0, 1])


@pytest.mark.parametrize("real_client", [False, pytest.param(True, marks=requires_verl)])
def test_a_weight_update_aborts_every_request_and_the_driver_follows_them_back_with_their_progress(real_client,
                                                                                                  monkeypatch):
    groups = [[40, 40, 40, 40], [40, 40, 40, 40]]
    base, counting = FakeFullyAsyncLLMServerClient, None
    if real_client:
        from test_verl_stealing import CountingAsyncio
        from verl.workers.rollout import llm_server

        base, counting = llm_server.FullyAsyncLLMServerClient, CountingAsyncio()
        monkeypatch.setattr(llm_server, "asyncio", counting)  # verl's 1 s waits counted, not slept
    steps, _, manager, engines, client, _ = run_stream(groups, concurrency=2, sync_at=(10, 25), base=base,
                                                    steal={"pool_tokens": 100_000, "poll_interval": 0.001,
                                                           "chunk": None})
    status = manager.lengthsched_status()
    waits = len(counting.sleeps) if real_client else client.waits
    assert waits >= 8  # verl's own aborts wait before they resubmit (1 s in verl)
    assert status["resumed"] > 0 and status["errors"] == 0
    # the resubmitted attempts' vLLM ids carry the tokens of the earlier attempts
    carried = [vs.carried_tokens(vid) for e in engines for vid in e.started]
    assert all(c is not None for c in carried) and max(carried) >= 10 and carried.count(0) == 8


def test_a_batch_of_several_groups_places_each_in_turn_and_validation_priorities_are_left_alone():
    lengths = {k: 6 for k in range(8)}
    engines, servers, router = cluster(lengths, max_num_seqs=8, replicas=2)
    config = trainer_config(response_length=512, ways=1, steal={"pool_tokens": 100_000, "poll_interval": 0.001})
    plain = FakeFullyAsyncLLMServerClient(config=config, load_balancer_handle=Remote(router))
    client_cls = vs.make_stealing_client_class(FakeFullyAsyncLLMServerClient)
    manager = va.make_fully_async_manager_class(FakeFullyAsyncAgentLoopManager, client_cls)(config, plain)
    manager.agent_loop_workers = [Remote(Worker(manager.llm_client))]
    two = group_batch(0, 4, "a")
    other = group_batch(1, 4, "b")
    for key in two.non_tensor_batch:
        two.non_tensor_batch[key] = np.concatenate([two.non_tensor_batch[key], other.non_tensor_batch[key]])
    validation = FakeBatch({"row": np.arange(4), "priority": np.arange(4, dtype=np.int64)})  # verl's 0..n-1

    async def go():
        task = asyncio.ensure_future(manager.generate_sequences_single(two))
        await asyncio.sleep(0.001)
        check = asyncio.ensure_future(Worker(manager.llm_client).generate_sequences(validation))
        while not (task.done() and check.done()):
            await asyncio.sleep(0.0005)
            for e in engines:
                e.step()
        await manager.lengthsched_driver.stop()
        return task.result(), check.result()

    out, checked = asyncio.run(go())
    assert out.batch["response_mask"].sum(-1).tolist() == [6] * 8
    assert checked.batch["response_mask"].sum(-1).tolist() == [6] * 4
    placed = two.non_tensor_batch["priority"] % 2
    assert len(set(placed[:4])) == 1 and len(set(placed[4:])) == 1 and placed[0] != placed[4]  # one group each
    assert manager.lengthsched_status()["groups"] == 2 and manager.lengthsched_groups_back == 2
    assert not manager.lengthsched_driver.stats.applied  # nothing taken for a row: the driver knows only its own


def test_the_manager_names_bad_settings():
    client_cls = vs.make_stealing_client_class(FakeFullyAsyncLLMServerClient)
    manager_cls = va.make_fully_async_manager_class(FakeFullyAsyncAgentLoopManager, client_cls)
    plain = SimpleNamespace(config=None, _load_balancer=None)
    with pytest.raises(InvalidArgument, match="lengthsched.steal"):
        manager_cls(trainer_config(), plain)
    with pytest.raises(InvalidArgument, match="actor_rollout_ref.rollout.name"):
        manager_cls(trainer_config(name="sglang", steal={"pool_tokens": 10}), plain)
    with pytest.raises(InvalidArgument, match="lengthsched.ways"):
        manager_cls(trainer_config(steal={"pool_tokens": 10}, ways=0), plain)
    with pytest.raises(InvalidArgument, match="lengthsched.prefill_share"):
        manager_cls(trainer_config(steal={"pool_tokens": 10}, prefill_share=-0.5), plain)
    with pytest.raises(InvalidArgument, match="'lengthsched.sgpo'.*repeats every prompt"):  # v1 trainer only
        manager_cls(trainer_config(steal={"pool_tokens": 10}, sgpo={}), plain)
    assert manager_cls(trainer_config(steal={"pool_tokens": 10}, prefill_share=None), plain) \
        ._lengthsched_prefill_share is None  # null: no cap
    made = manager_cls(trainer_config(steal={"pool_tokens": 10}), plain)
    assert isinstance(made.llm_client, client_cls) and made.lengthsched_status()["groups"] == 0


# ----------------------------------------------------------------------------- installing
def fake_recipe(name: str = "fake_recipe") -> ModuleType:
    module = ModuleType(name)
    module.FullyAsyncAgentLoopManager = FakeFullyAsyncAgentLoopManager
    module.FullyAsyncLLMServerClient = FakeFullyAsyncLLMServerClient
    return module


def fake_registry():
    registry = SimpleNamespace(entries={})
    registry.register = lambda name, loader: registry.entries.__setitem__(name, loader)
    return registry


def test_install_replaces_the_recipes_manager_and_client_once_and_registers_the_vllm_server(monkeypatch):
    monkeypatch.setattr(va, "_MADE", {})
    module, registry = fake_recipe(), fake_registry()
    assert va.install(module, registry, worker_class=None) is module  # None: the fake manager's workers
    manager, client = module.FullyAsyncAgentLoopManager, module.FullyAsyncLLMServerClient
    assert issubclass(manager, FakeFullyAsyncAgentLoopManager) and issubclass(client, FakeFullyAsyncLLMServerClient)
    assert manager.__name__ == "LengthschedFullyAsyncAgentLoopManager" and set(registry.entries) == {"vllm"}
    va.install(module, registry, worker_class=None)  # idempotent: not a subclass of itself
    assert module.FullyAsyncAgentLoopManager is manager and module.FullyAsyncLLMServerClient is client
    with pytest.raises(InvalidArgument, match="argument 'module'"):
        va.install(ModuleType("not_the_recipe"), registry, worker_class=None)


def test_install_on_import_patches_the_module_when_it_is_imported(tmp_path, monkeypatch):
    package = tmp_path / "lsched_fake_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "recipe.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    assert va.install_on_import("lsched_fake_pkg.recipe", seen.append) is False
    assert va.install_on_import("lsched_fake_pkg.recipe", seen.append) is False  # one finder, not two
    assert not seen
    import lsched_fake_pkg.recipe as recipe  # noqa: PLC0415 - the import is what is tested

    assert seen == [recipe] and recipe.VALUE == 1
    assert not any(isinstance(f, vs._InstallOnImport) for f in sys.meta_path)  # used once, gone
    assert va.install_on_import("lsched_fake_pkg.recipe", seen.append) is True and seen == [recipe, recipe]
    for name in ("lsched_fake_pkg.recipe", "lsched_fake_pkg"):
        sys.modules.pop(name, None)


def test_main_runs_the_recipes_entry_with_the_setup_hook(tmp_path, monkeypatch):
    """``python -m lengthsched.integrations.verl_async ARGS`` runs the recipe's entry as ``python -m`` would
    (Hydra finds its config beside the file only so), with the hook added to ARGS and the recipe's module
    patched when the entry imports it (a fake package here; verl's real entry composes its config with the
    hook: docs/howto-verl.md)."""
    package = tmp_path / "lsched_main_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "record.py").write_text("argv = []\nmanager = None\n")
    (package / "recipe.py").write_text("class FullyAsyncAgentLoopManager:\n    pass\n\n\n"
                                       "class FullyAsyncLLMServerClient:\n    pass\n")
    (package / "entry.py").write_text(
        "import sys\n\nfrom lsched_main_pkg import record, recipe\n\n"
        "if __name__ == '__main__':\n"
        "    record.argv = list(sys.argv[1:])\n"
        "    record.manager = recipe.FullyAsyncAgentLoopManager.__name__\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(va, "RECIPE_MODULE", "lsched_main_pkg.recipe")
    monkeypatch.setattr(va, "ENTRY_MODULE", "lsched_main_pkg.entry")
    monkeypatch.setattr(va, "_MADE", {})
    monkeypatch.setattr(vs, "register_vllm_server", lambda registry=None: None)
    monkeypatch.setattr(vs, "make_stealing_client_class", lambda base: base)  # the fake client has no parent
    monkeypatch.setattr(va, "_verl_worker", lambda: None)  # the fake recipe's manager keeps its workers
    monkeypatch.setattr(sys, "argv", ["x"])
    try:
        va.main(["trainer.total_epochs=1"])
        from lsched_main_pkg import record

        assert record.argv == ["trainer.total_epochs=1",
                               f"++ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={va.SETUP_HOOK}"]
        assert record.manager == "LengthschedFullyAsyncAgentLoopManager"
        va.main(["++ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=my.hook"])
        assert record.argv == ["++ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=my.hook"]
    finally:
        for name in [n for n in sys.modules if n.startswith("lsched_main_pkg")]:
            del sys.modules[name]
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, vs._InstallOnImport)]
    assert va.SETUP_HOOK == f"{va.__name__}.setup_hook" and callable(va.setup_hook)
    monkeypatch.setattr(va, "ENTRY_MODULE", "no_such_package_here.entry")
    with pytest.raises(ImportError, match="not importable"):
        va.main([])


def test_the_manager_class_needs_verl_only_when_asked_for(monkeypatch):
    if VERL:
        pytest.skip("verl is importable here: the real-verl test covers it")
    monkeypatch.setattr(va, "_MADE", {})
    with pytest.raises(ImportError, match="not importable"):
        va.LengthschedFullyAsyncAgentLoopManager  # noqa: B018
    with pytest.raises(AttributeError):
        va.NoSuchThing  # noqa: B018


@requires_verl
def test_install_against_verls_real_recipe(monkeypatch):
    import importlib

    module = importlib.import_module(va.RECIPE_MODULE)
    for name in ("FullyAsyncAgentLoopManager", "FullyAsyncLLMServerClient"):
        monkeypatch.setattr(module, name, getattr(module, name))  # restored after the test
    original_manager, original_client = module.FullyAsyncAgentLoopManager, module.FullyAsyncLLMServerClient
    monkeypatch.setattr(va, "_MADE", {})
    va.install(module, fake_registry())
    assert issubclass(module.FullyAsyncAgentLoopManager, original_manager)
    assert issubclass(module.FullyAsyncLLMServerClient, original_client)
    assert va.LengthschedFullyAsyncAgentLoopManager is module.FullyAsyncAgentLoopManager
    # the contract read from verl 0.9.1: the rollouter reads both names as module globals when it starts
    source = inspect.getsource(module.FullyAsyncRollouter.__ray_actor_class__._init_async_rollout_manager) \
        if hasattr(module.FullyAsyncRollouter, "__ray_actor_class__") else \
        (Path(module.__file__).read_text())
    assert "FullyAsyncAgentLoopManager.create(" in source and "client_cls=FullyAsyncLLMServerClient" in source
    assert list(inspect.signature(original_manager.generate_sequences_single).parameters) == ["self", "prompts"]
    text = Path(module.__file__).read_text()
    for key in ('"concurrent_samples_per_replica", 16', "config.async_training.require_batches",
                "config.actor_rollout_ref.actor.ppo_mini_batch_size * self.require_batches",
                "self.config.async_training.trigger_parameter_sync_step"):
        assert key in text


@pytest.mark.slow
@requires_verl
def test_the_setup_hook_installs_lengthsched_in_rays_actors():
    """Ray runs the job's worker_process_setup_hook in every worker process: an actor that imports the recipe's
    module (as the rollouter's does) finds lengthsched's manager and client there, also an actor with a
    runtime_env of its own (Ray merges it with the job's). Starts a local Ray (minutes on two cores)."""
    ray = pytest.importorskip("ray")
    root = str(Path(__file__).resolve().parents[1])
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
             runtime_env={"worker_process_setup_hook": va.SETUP_HOOK, "env_vars": {"PYTHONPATH": root}})
    try:
        @ray.remote(num_cpus=0)  # two at once on a one-CPU node
        class Probe:
            def names(self):
                import importlib

                module = importlib.import_module(va.RECIPE_MODULE)
                return module.FullyAsyncAgentLoopManager.__name__, module.FullyAsyncLLMServerClient.__name__

        expected = ("LengthschedFullyAsyncAgentLoopManager", "StealingLLMServerClient")
        assert ray.get(Probe.remote().names.remote()) == expected
        own = Probe.options(runtime_env={"env_vars": {"PYTHONPATH": root, "LENGTHSCHED_PROBE": "1"}}).remote()
        assert ray.get(own.names.remote()) == expected
    finally:
        ray.shutdown()


def test_the_example_launch_script_names_the_integration_and_parses():
    import subprocess

    root = Path(__file__).resolve().parents[1]
    script = root / "examples" / "verl_fully_async_lengthsched.sh"
    text = script.read_text()
    assert "NOT run" in text and "python -m lengthsched.integrations.verl_async" in text
    assert "router_class: lengthsched.integrations.verl.PlannedLoadBalancer" in text
    assert "+lengthsched.steal.pool_tokens=" in text
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
