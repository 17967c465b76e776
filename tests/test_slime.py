"""lengthsched.integrations.slime: the planner, and slime's two hooks against a fake slime.

The fake mirrors what the hooks touch in slime at commit 624b824: ``slime.rollout.sglang_rollout``'s
``generate`` (POSTs to ``http://{args.sglang_router_ip}:{args.sglang_router_port}/generate``) and
``generate_rollout`` (takes ``data_source.get_samples(args.over_sampling_batch_size)`` and runs each
group's samples, in the order the groups came, through ``--custom-generate-function-path``),
``slime.utils.async_utils.run`` and ``slime.utils.http_utils.get`` (the router's ``/workers``, an
engine's ``/get_server_info``).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import subprocess
import sys
import types
from enum import Enum
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthsched import InvalidArgument, SelectiveRollout
from lengthsched.integrations import slime as ls_slime
from lengthsched.integrations.slime import REPLICA_KEY, SlimePlanner, engine_address
from lengthsched.predictor import OracleLengthPredictor
from simulate import run_rollout, run_slime_planned
from simulate.workloads import Group


class Status(Enum):
    PENDING = "pending"
    COMPLETED = "completed"
    ABORTED = "aborted"


def sample(prompt, index=0):
    return SimpleNamespace(prompt=prompt, tokens=[], metadata={}, index=index, response_length=0,
                           status=Status.PENDING)


def batch(prompts, g=4):
    return [[sample(p, i * g + j) for j in range(g)] for i, p in enumerate(prompts)]


# ------------------------------------------------------------------------------------------ the planner
def test_the_planner_places_every_sample_and_hands_the_groups_over_longest_first():
    lengths = {"a": 100, "b": 900, "c": 400, "d": 50, "e": 700, "f": 300}
    planner = SlimePlanner(placement="groups", predictor=OracleLengthPredictor(lengths), max_new_tokens=1024)
    groups = batch(list(lengths))
    out = planner.plan(groups, replicas=3)
    assert [g[0].prompt for g in out] == ["b", "e", "c", "f", "a", "d"]
    assert all(s.metadata[REPLICA_KEY] in (0, 1, 2) for g in out for s in g)
    # whole groups, balanced by predicted work: each replica gets a third or so of 2,450 x 4 tokens
    assert all(len({s.metadata[REPLICA_KEY] for s in g}) == 1 for g in out)
    work = np.zeros(3)
    for g in out:
        work[g[0].metadata[REPLICA_KEY]] += lengths[g[0].prompt] * len(g)
    assert work.max() <= 4 * 900 and planner.last_plan.replicas == 3
    # batch order when asked, and by default on one engine (nothing to place there)
    kept = SlimePlanner(placement="groups", submit="batch", predictor=OracleLengthPredictor(lengths))
    assert [g[0].prompt for g in kept.plan(batch(list(lengths)), 3)] == list(lengths)
    assert [g[0].prompt for g in planner.plan(batch(list(lengths)), 1)] == list(lengths)
    longest = SlimePlanner(placement="groups", submit="longest", predictor=OracleLengthPredictor(lengths))
    assert [g[0].prompt for g in longest.plan(batch(list(lengths)), 1)] == ["b", "e", "c", "f", "a", "d"]


def test_a_resumed_sample_that_outran_its_prediction_is_not_taken_for_nearly_done():
    """With a predictor that learns online (the planner's default), a resumed sample is planned by what the
    predictor says is left after its progress, having seen its group's finished samples in a copy (the
    planner's own predictor is left as it was); a resumed group is submitted by what it has left; the
    verl planner's "left" column is what carries it, checked."""
    from lengthsched import OnlineLengthPredictor

    online = OnlineLengthPredictor({"a": 300, "b": 400, "c": 350}, prior_sigma=0.5, within_sigma=0.2)
    before = online.predict(["a", "b", "c"]).lengths.tolist()
    planner = SlimePlanner(placement="groups", submit="longest", predictor=online)
    groups = batch(["a", "b", "c"], g=3)
    for s, n, status in zip(groups[0], (900, 100, 700), (Status.COMPLETED, Status.ABORTED, Status.ABORTED)):
        s.status, s.tokens, s.response_length = status, list(range(20 + n)), n  # a runs far past its 300
    out = planner.plan(groups, replicas=2)
    assert [g[0].prompt for g in out] == ["a", "b", "c"]  # by what it has left (the one at 100), not by 300
    assert out[0][1].metadata[ls_slime.WORK_KEY] > 400
    resumed = out[0][2]
    assert resumed.metadata[ls_slime.WORK_KEY] > 100  # not max(1, 300 - 700) = 1
    assert online.predict(["a", "b", "c"]).lengths.tolist() == before

    class Model:  # a prior the copy must share, not duplicate (a trained network, say)
        copies = 0

        def predict(self, prompts, prefixes=None, quantiles=()):
            from lengthsched.predictor import LengthPrediction

            return LengthPrediction(np.full(len(prompts), 300), {})

        def __deepcopy__(self, memo):
            Model.copies += 1
            return self

    shared = SlimePlanner(placement="groups", predictor=OnlineLengthPredictor(Model(), prior_sigma=0.5))
    again = batch(["a", "b"], g=2)
    again[0][0].status, again[0][0].tokens, again[0][0].response_length = Status.COMPLETED, list(range(420)), 400
    again[0][1].status, again[0][1].tokens, again[0][1].response_length = Status.ABORTED, list(range(520)), 500
    shared.plan(again, replicas=2)
    assert Model.copies == 0 and again[0][1].metadata[ls_slime.WORK_KEY] > 1
    plain = SlimePlanner(placement="groups", submit="longest",
                         predictor=OnlineLengthPredictor({"a": 300, "b": 400, "c": 350}, prior_sigma=0.5,
                                                         within_sigma=0.2))
    alone = batch(["a", "b", "c"], g=3)
    alone[0][2].status, alone[0][2].tokens, alone[0][2].response_length = Status.ABORTED, list(range(720)), 700
    plain.plan(alone, replicas=2)  # no finished sibling: only its own progress
    assert 1 < alone[0][2].metadata[ls_slime.WORK_KEY] < resumed.metadata[ls_slime.WORK_KEY]
    rows = {"uid": np.array([0, 0]), "raw_prompt": np.array(["a", "a"], dtype=object),
            "generated": np.array([0, 700]), "left": np.array([0, 123])}
    plan, _ = plain.planner.plan(rows, 1)
    assert plan.predicted[1] == 123 and plan.predicted[0] > 200
    for bad in (np.array([5]), np.array([1, -2])):
        with pytest.raises(InvalidArgument, match="left"):
            plain.planner.plan(rows | {"left": bad}, 1)


def test_ways_spreads_a_group_where_the_pools_hold_its_prompt_and_reads_the_given_prompt_lengths():
    lengths = {"a": 300, "b": 200}
    planner = SlimePlanner(placement="ways", pool_tokens=40_000, predictor=OracleLengthPredictor(lengths))
    out = planner.plan(batch(["a", "b"], g=8), replicas=4, prompt_lens=[100, 100])
    assert {len({s.metadata[REPLICA_KEY] for s in g}) for g in out} == {4}  # each group over every replica
    with pytest.raises(InvalidArgument, match="prompt_lens"):
        planner.plan(batch(["a", "b"]), 2, prompt_lens=[1])


def test_a_resumed_partial_sample_is_planned_by_what_it_has_left():
    """slime's partial rollout resumes an aborted sample from its tokens (prompt + partial response): the
    planner reads the prompt's length without the response, predicts max(1, predicted - generated) for it,
    and counts the partial response in its tokens in flight."""
    lengths = {"a": 600, "b": 500}
    planner = SlimePlanner(placement="groups", submit="batch", predictor=OracleLengthPredictor(lengths))
    groups = batch(["a", "b"], g=2)
    for s in groups[0]:  # group a: prompt of 40 tokens, 550 and 700 generated before the abort
        s.status = Status.ABORTED
    groups[0][0].tokens, groups[0][0].response_length = list(range(40 + 550)), 550
    groups[0][1].tokens, groups[0][1].response_length = list(range(40 + 700)), 700
    for s in groups[1]:
        s.tokens = list(range(30))  # fresh, tokenized: prompt only
    out = planner.plan(groups, replicas=2)
    a, b = out
    assert [s.metadata[ls_slime.WORK_KEY] for s in a] == [50, 1]  # 600 - 550, and at least one token
    assert [s.metadata[ls_slime.NEED_KEY] for s in a] == [40 + 550 + 50, 40 + 700 + 1]
    assert [s.metadata[ls_slime.WORK_KEY] for s in b] == [500, 500]
    assert [s.metadata[ls_slime.NEED_KEY] for s in b] == [530, 530]
    # group a has 51 tokens left, b 1,000: whole groups on different engines
    assert a[0].metadata[REPLICA_KEY] != b[0].metadata[REPLICA_KEY]
    # untokenized fresh samples beside resumed ones: the prompts are estimated from their text, the
    # resumed ones still planned by what they have left
    mixed = batch(["a", "b"], g=2)
    mixed[0][0].tokens, mixed[0][0].response_length = list(range(590)), 550
    planner.plan(mixed, replicas=2)
    assert mixed[0][0].metadata[ls_slime.WORK_KEY] == 50 and mixed[0][1].metadata[ls_slime.WORK_KEY] == 600
    assert mixed[0][0].metadata[ls_slime.NEED_KEY] == 50 + 550 + mixed[0][1].metadata[ls_slime.NEED_KEY] - 600
    with pytest.raises(InvalidArgument, match="generated"):  # the verl planner's column, checked
        planner.planner.plan({"uid": np.array([0, 0]), "raw_prompt": np.array(["a", "a"], dtype=object),
                              "generated": np.array([1])}, 2)
    with pytest.raises(InvalidArgument, match="generated"):
        planner.planner.plan({"uid": np.array([0, 0]), "raw_prompt": np.array(["a", "a"], dtype=object),
                              "generated": np.array([1, -3])}, 2)


def test_a_further_batch_of_a_rollout_is_placed_from_what_the_engines_still_have(monkeypatch):
    """slime's dynamic sampling takes more groups while earlier ones run: the data source plans them from
    each engine's outstanding predicted tokens in the client (ClientQueues.outstanding), so whole groups
    go to the engines with the least left; with no client queues (no window) engines count as idle."""
    from lengthsched.integrations import ClientQueues

    lengths = {"a": 400, "b": 300, "c": 200}
    planner = SlimePlanner(placement="groups", submit="batch", predictor=OracleLengthPredictor(lengths))
    queues = ClientQueues(3, 10_000)
    queues.enter("old", 0, 5000, 4800)  # engine 0 still has a big sample queued, engine 1 one in flight
    queues.enter("sent", 1, 900, 800)
    assert queues.send()[0] == ("old", 0) and queues.outstanding() == [5000.0, 900.0, 0.0]
    monkeypatch.setattr(ls_slime, "_QUEUES", queues)
    source = ls_slime.PlannedDataSource(SimpleNamespace(get_samples=lambda n: batch(list(lengths), g=2)), planner, 3)
    out = source.get_samples(3)
    where = {g[0].prompt: g[0].metadata[REPLICA_KEY] for g in out}
    # a (800 tokens) to idle engine 2; b (600) to engine 2 again (800 < 900); c (400) to engine 1 (900 < 1400)
    assert where == {"a": 2, "b": 2, "c": 1}
    monkeypatch.setattr(ls_slime, "_QUEUES", None)
    idle = {g[0].prompt: g[0].metadata[REPLICA_KEY] for g in source.get_samples(3)}
    assert idle["a"] != idle["b"] and 0 in idle.values()  # idle engines: engine 0 gets a group again


def test_the_planner_learns_each_prompts_length_from_the_rollouts_it_observes():
    planner = SlimePlanner(placement="groups", default_length=500, max_new_tokens=4096)
    first = planner.plan(batch(["x", "y", "z"]), replicas=2)
    assert [g[0].prompt for g in first] == ["x", "y", "z"]  # nothing known: all alike, batch order
    for g, n in zip(first, (100, 3000, 800)):
        for s in g:
            s.response_length, s.status = n, Status.COMPLETED
    first[0][0].status = Status.ABORTED  # an aborted sample teaches nothing
    assert planner.observe(first) == 11
    again = planner.plan(batch(["x", "y", "z"]), replicas=2)
    assert [g[0].prompt for g in again] == ["y", "z", "x"]


def test_until_the_default_predictor_has_seen_a_length_batches_go_unplanned_through_slimes_router():
    planner = SlimePlanner(placement="groups", max_new_tokens=4096)
    assert planner.uninformed == "router" and not planner.planning
    stale = batch(["x", "y", "z"])
    stale[1][0].metadata.update({REPLICA_KEY: 1, ls_slime.WORK_KEY: 9, ls_slime.NEED_KEY: 30})  # an old plan's
    first = planner.plan(stale, replicas=2)
    assert [g[0].prompt for g in first] == ["x", "y", "z"] and planner.last_plan is None
    assert all(s.metadata == {} for g in first for s in g)  # no engine named: generate() uses the router
    for g, n in zip(first, (100, 3000, 800)):
        for s in g:
            s.response_length, s.status = n, Status.COMPLETED
    planner.observe(first)
    assert planner.planning
    again = planner.plan(batch(["x", "y", "z"]), replicas=2)
    assert [g[0].prompt for g in again] == ["y", "z", "x"] and all(REPLICA_KEY in s.metadata for g in again for s in g)
    # a length you give, or uninformed="plan", plans the first batch on the made-up length
    for told in (SlimePlanner(placement="groups", default_length=700),
                 SlimePlanner(placement="groups", uninformed="plan")):
        assert told.uninformed == "plan" and told.planning
        assert all(REPLICA_KEY in s.metadata for g in told.plan(batch(["x", "y"]), 2) for s in g)
    # a trained predictor is informed from the start; "router" with a length given keeps the router
    assert SlimePlanner(placement="groups", predictor=OracleLengthPredictor({"x": 5})).planning
    assert not SlimePlanner(placement="groups", default_length=700, uninformed="router").planning
    with pytest.raises(InvalidArgument, match="uninformed"):
        SlimePlanner(placement="groups", uninformed="spread")


def test_the_planner_checks_its_arguments():
    with pytest.raises(InvalidArgument, match="placement"):
        SlimePlanner(placement="classes")
    with pytest.raises(InvalidArgument, match="submit"):
        SlimePlanner(placement="groups", submit="random")
    with pytest.raises(InvalidArgument, match="pool_tokens"):
        SlimePlanner(placement="ways")
    with pytest.raises(InvalidArgument, match="replicas"):
        SlimePlanner(placement="groups").plan(batch(["a"]), 0)
    assert SlimePlanner(placement="groups").plan([[], []], 2) == [[], []]


def test_engine_addresses():
    assert engine_address("http://10.0.0.2:30000") == ("10.0.0.2", 30000)
    assert engine_address("10.0.0.2:30001/") == ("10.0.0.2", 30001)
    assert engine_address("http://[fe80::1]:30000") == ("fe80::1", 30000)
    assert ls_slime.engine_host("fe80::1") == "[fe80::1]" and ls_slime.engine_host("node-3") == "node-3"
    with pytest.raises(InvalidArgument, match="'url'"):
        engine_address("http://10.0.0.2")


# ------------------------------------------------------------------------------------------ slime's hooks
class FakeSlime:
    """The parts of slime the hooks call, recording every POST (the URL it went to) and the order in
    which the samples were generated."""

    def __init__(self, engines, lengths, server_info=None, seconds_per_token=0.0, abort_after=None):
        self.engines, self.lengths, self.server_info = engines, lengths, server_info
        self.posts: list[tuple[str, str]] = []  # (url, prompt)
        self.gets: list[str] = []
        self.seconds_per_token = seconds_per_token  # > 0: generate sleeps, and the samples run concurrently
        self.abort_after = abort_after  # seconds after which the rollout is aborted (slime's GenerateState.aborted)
        self.state = SimpleNamespace(aborted=False)
        self.running: dict[str, int] = {}  # per engine URL, samples in its generate now
        self.held: dict[str, int] = {}  # per engine URL, their predicted tokens (prompt + completion)
        self.peak: dict[str, int] = {}  # per engine URL, the most predicted tokens held by two or more at once
        self.params: list[tuple[str, int]] = []  # (prompt, max_new_tokens) of every POST
        self.reward = None  # (prompt, sample index) -> reward: what slime's reward model gives a generated sample
        self.filtering = False  # True: generate_rollout runs args.dynamic_sampling_filter_path on every group

    def install(self, monkeypatch):
        fake = self
        modules = {name: types.ModuleType(name) for name in
                   ("slime", "slime.rollout", "slime.rollout.sglang_rollout", "slime.utils",
                    "slime.utils.async_utils", "slime.utils.http_utils")}

        async def get(url):
            fake.gets.append(url)
            if url.endswith("/workers"):
                return {"workers": [{"url": u} for u in fake.engines]}
            if url.endswith("/get_server_info") and fake.server_info is not None:
                return fake.server_info
            raise RuntimeError(f"404 {url}")

        def run(coro):
            return asyncio.run(coro)

        async def generate(args, smp, sampling_params):  # slime's: POST to the router address in args
            url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
            fake.posts.append((url, smp.prompt))
            need = smp.metadata.get(ls_slime.NEED_KEY, 0)
            fake.running[url] = fake.running.get(url, 0) + 1
            fake.held[url] = fake.held.get(url, 0) + need
            fake.peak[url] = max(fake.peak.get(url, 0), fake.held[url] if fake.running[url] > 1 else 0)
            await asyncio.sleep(fake.lengths[smp.prompt] * fake.seconds_per_token)
            fake.running[url] -= 1
            fake.held[url] -= need
            cap = sampling_params.get("max_new_tokens", args.rollout_max_response_len)
            fake.params.append((smp.prompt, cap))
            smp.response_length = min(fake.lengths[smp.prompt], cap)
            smp.status = Status.COMPLETED
            return smp

        async def generate_and_rm(args, smp, custom):  # slime's: the generate hook, then the reward model
            params = {"max_new_tokens": args.rollout_max_response_len}
            await custom.generate(args, smp, params)
            if fake.reward is not None and getattr(smp, "reward", None) is None:
                smp.reward = fake.reward(smp.prompt, smp.index)

        def generate_rollout(args, rollout_id, data_source, evaluation=False):
            if evaluation:
                return SimpleNamespace(data={"eval": []})
            groups = data_source.get_samples(args.over_sampling_batch_size)
            custom = importlib.import_module(args.custom_generate_module)

            async def all_groups():  # slime's semaphore admits the samples in submission order
                if not fake.seconds_per_token:
                    for g in groups:
                        for smp in g:
                            await generate_and_rm(args, smp, custom)
                    return
                tasks = [asyncio.create_task(generate_and_rm(args, smp, custom))
                         for g in groups for smp in g]  # one task per sample, created in submission order
                if fake.abort_after is not None:
                    await asyncio.sleep(fake.abort_after)
                    fake.state.aborted = True
                await asyncio.gather(*tasks)

            asyncio.run(all_groups())
            kept = groups
            if fake.filtering:  # slime drops the groups its filter (--dynamic-sampling-filter-path) drops
                module, name = args.dynamic_sampling_filter_path.rsplit(".", 1)
                check = getattr(importlib.import_module(module), name)
                kept = [g for g in groups if ls_slime._filter_kept(check(args, g))]
            return SimpleNamespace(samples=sorted(kept, key=lambda g: g[0].index))

        modules["slime.utils.http_utils"].get = get
        modules["slime.utils.async_utils"].run = run
        modules["slime.rollout.sglang_rollout"].generate = generate
        modules["slime.rollout.sglang_rollout"].generate_rollout = generate_rollout
        modules["slime.rollout.sglang_rollout"].GenerateState = lambda args: fake.state  # slime's singleton
        modules["slime.rollout"].sglang_rollout = modules["slime.rollout.sglang_rollout"]
        for name, module in modules.items():
            monkeypatch.setitem(sys.modules, name, module)
        ls_slime.reset()


class Source:
    """A slime data source: ``get_samples`` hands out the next groups."""

    def __init__(self, prompts, g=4):
        self.prompts, self.g, self.added = prompts, g, []

    def get_samples(self, n):
        return batch(self.prompts[:n], self.g)

    def add_samples(self, groups):
        self.added.append(groups)


def slime_args(**extra):
    base = dict(sglang_router_ip="10.0.0.1", sglang_router_port=3000, over_sampling_batch_size=4,
                rollout_max_response_len=4096, custom_generate_module="lengthsched.integrations.slime")
    return SimpleNamespace(**{**base, **extra})


ENGINES = ["http://10.0.0.9:30001", "http://10.0.0.8:30000", "http://10.0.0.8:30002"]


def test_each_sample_goes_to_the_engine_its_plan_named_and_the_planner_learns(monkeypatch):
    lengths = {"p0": 100, "p1": 2000, "p2": 700, "p3": 1200}
    fake = FakeSlime(ENGINES, lengths)
    fake.install(monkeypatch)
    args = slime_args(lengthsched_placement="groups", lengthsched_default_length=300)
    source = Source(list(lengths))
    out = ls_slime.generate_rollout(args, 0, source)
    planner = ls_slime.planner_for(args)
    engines = sorted(ENGINES)  # a fixed index per engine
    by_prompt = {s.prompt: s.metadata[REPLICA_KEY] for g in out.samples for s in g}
    assert len(fake.posts) == 16
    for url, prompt in fake.posts:
        host, port = engine_address(engines[by_prompt[prompt]])
        assert url == f"http://{host}:{port}/generate"
    assert fake.gets == ["http://10.0.0.1:3000/workers"]
    assert [g[0].index for g in out.samples] == [0, 4, 8, 12]  # slime sorts its output back
    # the second rollout knows the lengths: submitted longest first, placed by predicted work
    fake.posts.clear()
    ls_slime.generate_rollout(args, 1, source)
    assert [p for _, p in fake.posts[::4]] == ["p1", "p3", "p2", "p0"]
    assert ls_slime.planner_for(args) is planner and planner.planner.steps == 2


def test_the_first_rollout_goes_through_the_router_until_the_planner_has_seen_lengths(monkeypatch):
    lengths = {"p0": 100, "p1": 2000, "p2": 700, "p3": 1200}
    fake = FakeSlime(ENGINES, lengths)
    fake.install(monkeypatch)
    args = slime_args(lengthsched_placement="groups")  # no default length, no lengthsched_uninformed: "router"
    source = Source(list(lengths))
    ls_slime.generate_rollout(args, 0, source)
    assert [u for u, _ in fake.posts] == ["http://10.0.0.1:3000/generate"] * 16
    assert ls_slime.planner_for(args).planning  # it saw the first rollout's lengths
    fake.posts.clear()
    ls_slime.generate_rollout(args, 1, source)
    assert {u for u, _ in fake.posts} <= {f"http://{h}:{p}/generate" for h, p in map(engine_address, ENGINES)}
    assert [p for _, p in fake.posts[::4]] == ["p1", "p3", "p2", "p0"]  # planned: longest predicted first
    ls_slime.reset()
    assert ls_slime.planner_for(slime_args(lengthsched_placement="groups", lengthsched_uninformed="plan")).planning
    ls_slime.reset()
    with pytest.raises(InvalidArgument, match="uninformed"):
        ls_slime.planner_for(slime_args(lengthsched_placement="groups", lengthsched_uninformed="never"))


def test_unplanned_samples_and_evaluation_go_through_the_router(monkeypatch):
    fake = FakeSlime(ENGINES, {"q": 10})
    fake.install(monkeypatch)
    args = slime_args()
    asyncio.run(ls_slime.generate(args, sample("q"), {}))  # no rollout in progress, no plan
    planned = sample("q")
    planned.metadata[REPLICA_KEY] = 1
    asyncio.run(ls_slime.generate(args, planned, {}, evaluation=True))
    assert [u for u, _ in fake.posts] == ["http://10.0.0.1:3000/generate"] * 2
    assert ls_slime.generate_rollout(args, 0, Source(["q"]), evaluation=True).data == {"eval": []}
    assert fake.gets == []


def test_your_own_generate_function_runs_every_turn_on_the_planned_engine(monkeypatch):
    """lengthsched_generate_function_path: a multi-turn agent's generate function is called in place of
    slime's with the planned engine's address in args (each of its turns posts there), with evaluation=
    where its signature takes it; unplanned samples keep the router's address."""
    lengths = {"p0": 100, "p1": 2000, "p2": 700, "p3": 1200}
    fake = FakeSlime(ENGINES, lengths)
    fake.install(monkeypatch)
    calls = []

    async def agent(args, smp, sampling_params, evaluation=False):  # two turns, each a POST to args' address
        from slime.rollout import sglang_rollout

        calls.append((smp.prompt, evaluation))
        for _ in range(2):
            smp = await sglang_rollout.generate(args, smp, sampling_params)
        return smp

    async def plain(args, smp, sampling_params):
        calls.append((smp.prompt, "plain"))
        from slime.rollout import sglang_rollout

        return await sglang_rollout.generate(args, smp, sampling_params)

    module = types.ModuleType("my_agent")
    module.agent, module.plain, module.constant = agent, plain, 3
    monkeypatch.setitem(sys.modules, "my_agent", module)
    args = slime_args(lengthsched_placement="groups", lengthsched_generate_function_path="my_agent.agent",
                      lengthsched_uninformed="plan")
    out = ls_slime.generate_rollout(args, 0, Source(list(lengths)))
    engines = sorted(ENGINES)
    by_prompt = {s.prompt: s.metadata[REPLICA_KEY] for g in out.samples for s in g}
    assert len(fake.posts) == 32 and len(calls) == 16 and {e for _, e in calls} == {False}
    for url, prompt in fake.posts:  # both turns of every sample on its planned engine
        host, port = engine_address(engines[by_prompt[prompt]])
        assert url == f"http://{host}:{port}/generate"
    fake.posts.clear()
    asyncio.run(ls_slime.generate(args, sample("p0"), {}, evaluation=True))  # evaluation: through the router
    assert calls[-1] == ("p0", True) and {u for u, _ in fake.posts} == {"http://10.0.0.1:3000/generate"}
    ls_slime.reset()
    plain_args = slime_args(lengthsched_generate_function_path="my_agent.plain")
    asyncio.run(ls_slime.generate(plain_args, sample("p1"), {}, evaluation=True))
    assert calls[-1] == ("p1", "plain")  # no evaluation parameter: not passed
    for bad in ("my_agent.missing", "no_such_module_xyz.generate", "my_agent.constant", "generate"):
        ls_slime.reset()
        with pytest.raises(InvalidArgument, match="lengthsched_generate_function_path"):
            asyncio.run(ls_slime.generate(slime_args(lengthsched_generate_function_path=bad), sample("p0"), {}))


def test_with_multi_turn_every_turn_goes_through_slimes_router_and_the_planner_learns(monkeypatch):
    """lengthsched_multi_turn: true: nothing is planned (no sample names an engine, no engine is asked its pool),
    every turn of the agent's generate function posts to slime's router, and the planner learns the lengths all
    the same; a value that is not a boolean is an error naming the key."""
    lengths = {"p0": 100, "p1": 2000, "p2": 700, "p3": 1200}
    fake = FakeSlime(ENGINES, lengths)
    fake.install(monkeypatch)

    async def agent(args, smp, sampling_params):  # two turns, each a POST to args' address
        from slime.rollout import sglang_rollout

        for _ in range(2):
            smp = await sglang_rollout.generate(args, smp, sampling_params)
        return smp

    module = types.ModuleType("my_turns")
    module.agent = agent
    monkeypatch.setitem(sys.modules, "my_turns", module)
    args = slime_args(lengthsched_placement="groups", lengthsched_generate_function_path="my_turns.agent",
                      lengthsched_uninformed="plan", lengthsched_multi_turn=True,
                      custom_generate_function_path="lengthsched.integrations.slime.generate")
    for rollout in range(2):
        fake.posts.clear()
        out = ls_slime.generate_rollout(args, rollout, Source(list(lengths)))
        assert [u for u, _ in fake.posts] == ["http://10.0.0.1:3000/generate"] * 32
        assert all(REPLICA_KEY not in s.metadata for g in out.samples for s in g)
    assert ls_slime.planner_for(args).planner.steps == 2
    assert fake.gets == ["http://10.0.0.1:3000/workers"] * 2
    ls_slime.reset()
    with pytest.raises(InvalidArgument, match="lengthsched_multi_turn"):
        ls_slime.generate_rollout(slime_args(lengthsched_multi_turn="yes"), 0, Source(list(lengths)))


def test_the_pool_size_comes_from_the_config_or_the_engine_else_whole_groups(monkeypatch, caplog):
    info = {"version": "0.5", "internal_states": [{"max_total_num_tokens": 123_456}]}
    fake = FakeSlime(ENGINES, {"a": 10})
    fake.server_info = info
    fake.install(monkeypatch)
    assert ls_slime.planner_for(slime_args(), sorted(ENGINES)).planner.pool_tokens == 123_456
    assert fake.gets == [f"{sorted(ENGINES)[0]}/get_server_info"]
    ls_slime.reset()
    assert ls_slime.planner_for(slime_args(lengthsched_pool_tokens=5000), ENGINES).planner.pool_tokens == 5000
    ls_slime.reset()
    fake.server_info = None  # the engine does not answer: whole groups, with a warning
    fake.gets.clear()
    with caplog.at_level(logging.WARNING, logger="lengthsched.integrations.slime"):
        planner = ls_slime.planner_for(slime_args(), ENGINES)
    assert planner.placement == "groups" and "lengthsched_pool_tokens" in caplog.text
    assert [u.rsplit("/", 1)[1] for u in fake.gets] == ["get_server_info", "server_info"]  # both names tried
    assert "/server_info: 404" in caplog.text
    ls_slime.reset()
    with pytest.raises(InvalidArgument, match="lengthsched_pool_tokens"):
        ls_slime.planner_for(slime_args(lengthsched_pool_tokens=0), ENGINES)
    ls_slime.reset()
    fake.engines = []
    with pytest.raises(InvalidArgument, match="workers"):
        ls_slime.generate_rollout(slime_args(), 0, Source(["a"]))


def test_an_engines_pool_is_one_dp_ranks_pool_times_its_dp_size():
    """SGLang's server info carries the first scheduler's max_total_num_tokens at the top level (one
    data-parallel rank's pool) beside its server arguments (dp_size); older answers only per scheduler."""
    pool = ls_slime.engine_pool_tokens
    assert pool({"max_total_num_tokens": 270_336, "dp_size": 8, "internal_states": [{}] * 8}) == 8 * 270_336
    assert pool({"max_total_num_tokens": 326_223, "dp_size": 1}) == 326_223
    assert pool({"internal_states": [{"max_total_num_tokens": 1000}]}) == 1000
    for bad in (None, [], {}, {"max_total_num_tokens": 0}, {"max_total_num_tokens": True},
                {"max_total_num_tokens": "9"}):
        assert pool(bad) is None
    assert pool({"max_total_num_tokens": 10, "dp_size": 0}) == 10  # a nonsense dp_size counts as 1


def test_importing_the_module_imports_neither_slime_nor_torch():
    code = ("import sys, lengthsched.integrations.slime; "
            "print(sorted(m for m in ('slime', 'torch', 'httpx', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_a_client_window_holds_each_engines_samples_and_lets_a_drained_engine_take_the_others(monkeypatch):
    """With a KV pool known, the client sends an engine its planned samples while their predicted tokens fit
    lengthsched_window pools (one at least; here 2,000 tokens: one long sample, or many short ones). The
    engines that drain take the others' queued samples, so every sample runs once, and some not where
    planned."""
    lengths = {"long-a": 3000, "long-b": 2900, "s1": 100, "s2": 120, "s3": 90, "s4": 110}
    fake = FakeSlime(ENGINES, lengths, seconds_per_token=2e-5)
    fake.install(monkeypatch)
    predictor = OracleLengthPredictor(lengths)
    monkeypatch.setattr(ls_slime, "_PLANNER", SlimePlanner(placement="groups", pool_tokens=4000, predictor=predictor,
                                                           max_new_tokens=4096))
    args = slime_args(lengthsched_window=0.5, over_sampling_batch_size=6)  # a window of 2,000 tokens
    out = ls_slime.generate_rollout(args, 0, Source(list(lengths), g=3))
    samples = [s for g in out.samples for s in g]
    assert all(s.status is Status.COMPLETED for s in samples) and len(fake.posts) == 18
    assert 0 < max(fake.peak.values()) <= 2000  # two or more at once only within the window
    engines = sorted(ENGINES)
    ran = {}
    for url, prompt in fake.posts:
        ran.setdefault(prompt, []).append(url)
    planned = {s.prompt: engines[s.metadata[REPLICA_KEY]] for s in samples}
    moved = [p for p, urls in ran.items() for u in urls if u != f"{planned[p]}/generate"]
    assert moved  # a drained engine took queued samples planned elsewhere
    assert ls_slime._QUEUES is None and not ls_slime._WAITING  # nothing left behind


def test_samples_waiting_in_the_client_when_slime_aborts_come_back_aborted(monkeypatch):
    lengths = {"a": 4000, "b": 4000}
    fake = FakeSlime(ENGINES[:2], lengths, seconds_per_token=1e-4, abort_after=0.05)
    fake.install(monkeypatch)
    monkeypatch.setattr(ls_slime, "_WAKE_SECONDS", 0.01)
    monkeypatch.setattr(ls_slime, "_PLANNER", SlimePlanner(placement="groups", pool_tokens=4000,
                                                           predictor=OracleLengthPredictor(lengths)))
    out = ls_slime.generate_rollout(slime_args(lengthsched_window=1.0, over_sampling_batch_size=2), 0,
                                    Source(["a", "b"], g=2))
    status = [s.status for g in out.samples for s in g]
    assert status.count(Status.COMPLETED) == 2 and status.count(Status.ABORTED) == 2  # one ran per engine
    assert len(fake.posts) == 2 and ls_slime._QUEUES is None and not ls_slime._WAITING


def test_over_sampled_rollouts_are_planned_only_when_asked_then_whole_groups_shortest_first():
    """A dynamic-sampling filter, or an over-sampling batch above the rollout batch: the rollout ends at its
    B-th group that passes; the planner's defaults become groups / shortest; what the YAML names is kept."""
    assert not ls_slime.oversampled(slime_args(rollout_batch_size=32, over_sampling_batch_size=32))
    assert ls_slime.oversampled(slime_args(rollout_batch_size=32, over_sampling_batch_size=48))
    assert ls_slime.oversampled(slime_args(dynamic_sampling_filter_path="slime.rollout.filter_hub.f"))
    assert not ls_slime.oversampled(slime_args(dynamic_sampling_filter_path=None))
    over = slime_args(dynamic_sampling_filter_path="f", lengthsched_pool_tokens=5000)
    planner = ls_slime.planner_for(over)
    assert (planner.placement, planner.submit, planner.planner.pool_tokens) == ("groups", "shortest", 5000)
    assert ls_slime._client_queues(over, planner, 3).limit == ls_slime.WINDOW * 5000
    ls_slime.reset()
    named = slime_args(dynamic_sampling_filter_path="f", lengthsched_pool_tokens=5000, lengthsched_placement="ways",
                       lengthsched_submit="batch", lengthsched_window=0)
    planner = ls_slime.planner_for(named)
    assert (planner.placement, planner.submit) == ("ways", "batch")
    assert ls_slime._client_queues(named, planner, 3) is None
    ls_slime.reset()
    plain = ls_slime.planner_for(slime_args(lengthsched_pool_tokens=5000))
    assert (plain.placement, plain.submit) == ("ways", "auto")
    ls_slime.reset()


def test_an_over_sampled_rollout_runs_as_slime_runs_it_unless_the_yaml_says_plan(monkeypatch):
    lengths = {"p0": 100, "p1": 2000, "p2": 700, "p3": 1200}
    fake = FakeSlime(ENGINES, lengths)
    fake.install(monkeypatch)
    args = slime_args(lengthsched_placement="groups", lengthsched_default_length=300,
                      dynamic_sampling_filter_path="my.filter")
    source = Source(list(lengths))
    for rollout in range(2):  # slime's router both times; the planner learns the lengths all the same
        fake.posts.clear()
        ls_slime.generate_rollout(args, rollout, source)
        assert [u for u, _ in fake.posts] == ["http://10.0.0.1:3000/generate"] * 16
    assert ls_slime.planner_for(args).planner.steps == 2
    ls_slime.reset()
    fake.gets.clear()  # left to slime's router, nothing asks an engine for its pool
    ls_slime.generate_rollout(slime_args(dynamic_sampling_filter_path="my.filter"), 0, source)
    assert fake.gets == ["http://10.0.0.1:3000/workers"]
    ls_slime.reset()
    fake.posts.clear()
    planned = slime_args(lengthsched_placement="groups", lengthsched_default_length=300,
                         dynamic_sampling_filter_path="my.filter", lengthsched_oversampled="plan")
    ls_slime.generate_rollout(planned, 0, source)
    assert all(u != "http://10.0.0.1:3000/generate" for u, _ in fake.posts)
    ls_slime.reset()
    with pytest.raises(InvalidArgument, match="lengthsched_oversampled"):
        ls_slime.generate_rollout(slime_args(lengthsched_oversampled="sometimes"), 0, source)


def test_shortest_first_hands_the_groups_over_shortest_predicted_first():
    lengths = {"a": 100, "b": 900, "c": 400}
    planner = SlimePlanner(placement="groups", submit="shortest", predictor=OracleLengthPredictor(lengths))
    assert [g[0].prompt for g in planner.plan(batch(list(lengths)), replicas=1)] == ["a", "c", "b"]


def test_with_a_compressed_cache_a_samples_tokens_in_flight_count_what_its_engine_holds(monkeypatch):
    """lengthsched_kv_compression (the engines' Sparse-RL cache): NEED_KEY, what the client window counts, is the
    prompt plus at most budget + interval generated tokens (a resumed sample's partial response included); the
    predicted work, and so the placement, stays whole."""
    lengths = {"a": 600, "b": 100}
    plain = SlimePlanner(placement="groups", submit="batch", predictor=OracleLengthPredictor(lengths))
    sparse = SlimePlanner(placement="groups", submit="batch", predictor=OracleLengthPredictor(lengths),
                          kv_compression="256:32")
    assert sparse.kv_cap == 288 and plain.kv_cap is None
    groups = {}
    for name, planner in (("plain", plain), ("sparse", sparse)):
        groups[name] = batch(["a", "b"], g=2)
        for g in groups[name]:
            for smp in g:
                smp.tokens = list(range(30))  # tokenized prompts of 30 tokens
        groups[name][0][1].tokens, groups[name][0][1].response_length = list(range(30 + 250)), 250  # resumed
        planner.plan(groups[name], replicas=2)
    need = {k: [smp.metadata[ls_slime.NEED_KEY] for g in v for smp in g] for k, v in groups.items()}
    work = {k: [smp.metadata[ls_slime.WORK_KEY] for g in v for smp in g] for k, v in groups.items()}
    assert need["plain"] == [630, 630, 130, 130] and need["sparse"] == [30 + 288, 30 + 288, 130, 130]
    assert work["plain"] == work["sparse"] == [600, 350, 100, 100]
    assert [smp.metadata[REPLICA_KEY] for g in groups["plain"] for smp in g] == \
        [smp.metadata[REPLICA_KEY] for g in groups["sparse"] for smp in g]
    # from slime's YAML; a bad text names the key
    monkeypatch.setattr(ls_slime, "_PLANNER", None)
    args = slime_args(lengthsched_placement="groups", lengthsched_kv_compression="512:32")
    assert ls_slime.planner_for(args).kv_cap == 544
    monkeypatch.setattr(ls_slime, "_PLANNER", None)
    with pytest.raises(InvalidArgument, match="lengthsched_kv_compression"):
        ls_slime.planner_for(slime_args(lengthsched_placement="groups", lengthsched_kv_compression="512"))
    with pytest.raises(InvalidArgument, match="kv_compression"):
        SlimePlanner(placement="groups", kv_compression=288)
    monkeypatch.setattr(ls_slime, "_PLANNER", None)


def test_the_window_is_configured_by_slimes_args(monkeypatch):
    planner = SlimePlanner(placement="ways", pool_tokens=1000)
    assert ls_slime._client_queues(slime_args(), planner, 3).limit == ls_slime.WINDOW * 1000
    assert ls_slime._client_queues(slime_args(lengthsched_window=0), planner, 3) is None
    assert ls_slime._client_queues(slime_args(lengthsched_steal=False), planner, 3).steals is False
    assert ls_slime._client_queues(slime_args(), SlimePlanner(placement="groups"), 3) is None  # no pool known
    assert ls_slime._client_queues(slime_args(), planner, 1) is None  # one engine: nothing to steal from
    with pytest.raises(InvalidArgument, match="lengthsched_window"):
        ls_slime._client_queues(slime_args(lengthsched_window=-1), planner, 3)


# ------------------------------------------------------------------------------------------ in the model
def _groups(sizes, seed=0, prompt=20):
    rng = np.random.default_rng(seed)
    return [Group(f"g{i}", prompt, rng.integers(10, 300, n)) for i, n in enumerate(sizes)]


def test_the_model_of_slime_with_the_plan_runs_the_planners_placement_on_sglang():
    groups = _groups([6, 5, 7, 4, 8], seed=3)
    pred = np.concatenate([np.full(len(g.lengths), np.floor(np.median(g.lengths))) for g in groups])
    common = dict(replicas=3, budget_tokens=900, max_new_tokens=512)
    result, order = run_slime_planned(groups, pred, in_flight=None, placement="groups", window=0, **common)
    assert sorted(order.tolist()) == list(range(5))
    medians = [np.floor(np.median(groups[i].lengths)) for i in order]
    assert medians == sorted(medians, reverse=True)  # handed to slime longest predicted first
    # the same as SGLang running that placement on the groups in that order
    again = run_rollout([groups[i] for i in order], "sglang", placement=result.placement, **common)
    assert result.seconds == pytest.approx(again.seconds, rel=1e-12)
    assert [x.tolist() for x in result.collected_lengths] == [groups[i].lengths.tolist() for i in order]
    # with slime's cap the requests wait their turn and still run where they were placed
    capped, _ = run_slime_planned(groups, pred, in_flight=4, placement="groups", window=0, **common)
    assert capped.placement.tolist() == result.placement.tolist() and capped.seconds >= result.seconds
    # by default through the integration's client window (WINDOW pools per engine, steals)
    windowed, _ = run_slime_planned(groups, pred, in_flight=None, placement="groups", **common)
    starts = np.cumsum([0] + [len(g.lengths) for g in groups])
    reordered = np.concatenate([pred[starts[i]:starts[i + 1]] for i in order])
    again = run_rollout([groups[i] for i in order], "sglang", placement=result.placement, in_flight=None,
                        predicted=reordered, client_window=ls_slime.WINDOW, **common)
    assert windowed.seconds == pytest.approx(again.seconds, rel=1e-12)
    with pytest.raises(InvalidArgument, match="predicted"):
        run_slime_planned(groups, pred[:-1], in_flight=None, **common)


def test_the_model_with_the_planners_own_predictor_leaves_an_uninformed_step_to_slimes_router():
    from lengthsched import OnlineLengthPredictor

    groups = _groups([6, 5, 7, 4, 8], seed=4)
    common = dict(replicas=3, budget_tokens=900, max_new_tokens=512, in_flight=12)
    told_nothing = OnlineLengthPredictor(default_length=256, max_new_tokens=512)
    result, order = run_slime_planned(groups, told_nothing, **common)
    slime = run_rollout(groups, "sglang", router="cache_aware", **common)
    assert order.tolist() == list(range(5)) and result.seconds == slime.seconds
    assert result.placement.tolist() == slime.placement.tolist()
    # informed, it plans as the same predictions given per completion would (keyed by prompt_id)
    learnt = OnlineLengthPredictor(default_length=256, max_new_tokens=512)
    for g in groups[:3]:
        for n in g.lengths:
            learnt.observe(g.prompt_id, int(n))
    learnt.set_step(1)
    said = learnt.predict([g.prompt_id for g in groups]).lengths
    per_completion = np.concatenate([np.full(len(g.lengths), round(x)) for g, x in zip(groups, said)])
    planned, order = run_slime_planned(groups, learnt, **common)
    same, same_order = run_slime_planned(groups, per_completion, **common)
    assert order.tolist() == same_order.tolist() and planned.placement.tolist() == same.placement.tolist()
    assert planned.seconds == pytest.approx(same.seconds, rel=1e-12)


@settings(max_examples=20, deadline=None)
@given(sizes=st.lists(st.integers(1, 8), min_size=1, max_size=7), replicas=st.integers(1, 4),
       cap=st.one_of(st.none(), st.integers(1, 20)), placement=st.sampled_from(["ways", "groups", "spread"]),
       seed=st.integers(0, 40))
def test_slime_with_the_plan_collects_every_completion_where_the_planner_put_it(sizes, replicas, cap, placement,
                                                                               seed):
    groups = _groups(sizes, seed=seed)
    rng = np.random.default_rng(seed)
    pred = np.concatenate([np.full(n, float(rng.integers(5, 400))) for n in sizes])
    result, order = run_slime_planned(groups, pred, replicas=replicas, budget_tokens=1500, max_new_tokens=512,
                                      in_flight=cap, placement=placement)
    assert sorted(order.tolist()) == list(range(len(groups)))
    assert [x.tolist() for x in result.collected_lengths] == [groups[i].lengths.tolist() for i in order]
    assert result.placement.min() >= 0 and result.placement.max() < replicas
    assert result.seconds >= result.lower_bound_seconds * (1 - 1e-12)


class BufferedSource:
    """slime 624b824's ``RolloutDataSourceWithBuffer`` as the buffer filter meets it: ``get_samples`` takes the
    buffer's groups through ``buffer_filter(args, None, buffer, n)`` first, then fresh ones; ``add_samples``
    appends the aborted groups (partial rollout)."""

    def __init__(self, args, prompts, g=2):
        self.args, self.buffer, self.fresh, self.g = args, [], iter(prompts), g

    def get_samples(self, n):
        taken = ls_slime.buffer_filter(self.args, None, self.buffer, n)
        return taken + [[sample(next(self.fresh), j) for j in range(self.g)] for _ in range(n - len(taken))]

    def add_samples(self, groups):
        self.buffer.extend(groups)


def test_the_buffer_filter_is_pop_first_without_a_limit_and_drops_groups_carried_past_it(caplog):
    """buffer_filter: slime's pop_first (the first groups, removed from the buffer), counting on each group how
    many times it came back; with lengthsched_max_carry K a group taken a (K+1)-th time is thrown away and the
    next one taken instead: the rule of simulate.run_oversampled_steps(..., max_carry=K, carry_limit="drop")."""
    buffer = batch(["a", "b", "c"], g=2)
    args = SimpleNamespace()
    first = ls_slime.buffer_filter(args, None, buffer, 2)
    assert [g[0].prompt for g in first] == ["a", "b"] and [g[0].prompt for g in buffer] == ["c"]
    assert all(s.metadata[ls_slime.CARRIED_KEY] == 1 for g in first for s in g)
    assert ls_slime.buffer_filter(args, None, buffer, 0) == [] and len(buffer) == 1
    for limit in (1, 2):
        source = BufferedSource(SimpleNamespace(lengthsched_max_carry=limit), (f"p{i}" for i in range(100)))
        submitted = []
        with caplog.at_level(logging.INFO, logger=ls_slime.__name__):
            for step in range(6):  # the group "p0" never finishes: aborted and returned to the buffer every step
                groups = source.get_samples(3)
                assert len(groups) == 3  # what the buffer does not give comes fresh
                submitted += [step for g in groups if g[0].prompt == "p0"]
                source.add_samples([g for g in groups if g[0].prompt == "p0"])
        assert submitted == list(range(limit + 1))  # first submitted, then carried `limit` times, then dropped
        assert "dropped 1 group(s) carried more than" in caplog.text and source.buffer == []
        caplog.clear()
    for bad in (0, "2", 1.5):
        with pytest.raises(InvalidArgument, match="lengthsched_max_carry"):
            ls_slime.buffer_filter(SimpleNamespace(lengthsched_max_carry=bad), None, batch(["a"]), 1)


# ------------------------------------------------------------------------ the dynamic-sampling filter's history
def _install_filters(monkeypatch, calls):
    """slime's filter hub (DAPO's check_reward_nonzero_std, answering a DynamicFilterOutput) and a user's legacy
    filter answering a bool."""
    hub = types.ModuleType("slime.rollout.filter_hub.dynamic_sampling_filters")

    def check_reward_nonzero_std(args, samples, **kwargs):
        calls.append(("slime", [s.prompt for s in samples], kwargs))
        rewards = [s.reward for s in samples]
        return SimpleNamespace(keep=bool(np.std(rewards) > 1e-6), reason=None)

    hub.check_reward_nonzero_std = check_reward_nonzero_std
    mine = types.ModuleType("my_filters")
    mine.at_least_one = lambda args, samples, **kw: any(s.reward for s in samples)
    for name, module in (("slime.rollout.filter_hub", types.ModuleType("slime.rollout.filter_hub")),
                         ("slime.rollout.filter_hub.dynamic_sampling_filters", hub), ("my_filters", mine)):
        monkeypatch.setitem(sys.modules, name, module)


def _rewarded(prompt, rewards):
    group = batch([prompt], g=len(rewards))[0]
    for s, r in zip(group, rewards):
        s.reward = r
    return group


def test_the_dynamic_sampling_filter_runs_the_named_filter_and_records_what_it_kept(monkeypatch):
    calls = []
    FakeSlime(ENGINES, {}).install(monkeypatch)
    _install_filters(monkeypatch, calls)
    args = slime_args(dynamic_sampling_filter_path="lengthsched.integrations.slime.dynamic_sampling_filter",
                      lengthsched_pool_tokens=5000)
    out = ls_slime.dynamic_sampling_filter(args, _rewarded("easy", [1, 1, 1, 1]), extra=1)
    assert out.keep is False and calls == [("slime", ["easy"] * 4, {"extra": 1})]  # slime's answer, unchanged
    assert ls_slime.dynamic_sampling_filter(args, _rewarded("mixed", [1, 0, 1, 0])).keep is True
    history = ls_slime.planner_for(args).history
    assert (history.groups, history.kept) == (2, 1)
    p = history.pass_probability(["easy", "mixed", "unseen"])
    assert p[1] > p[2] > p[0]
    ls_slime.reset()
    mine = slime_args(lengthsched_dynamic_sampling_filter_path="my_filters.at_least_one",
                      lengthsched_pool_tokens=5000)
    assert ls_slime.dynamic_sampling_filter(mine, _rewarded("hard", [0, 0, 0, 0])) is False  # a legacy bool
    assert ls_slime.planner_for(mine).history.pass_probability(["hard"])[0] < 0.5
    ls_slime.reset()
    for path in ("lengthsched.integrations.slime.dynamic_sampling_filter", "my_filters.nothing"):
        with pytest.raises(InvalidArgument, match="lengthsched_dynamic_sampling_filter_path"):
            ls_slime.dynamic_sampling_filter(slime_args(lengthsched_dynamic_sampling_filter_path=path),
                                             _rewarded("x", [0, 1]))


def test_the_planner_orders_a_batch_likely_kept_first_only_when_asked():
    lengths = {"a": 100, "b": 900, "c": 400, "d": 700}
    planner = SlimePlanner(placement="groups", predictor=OracleLengthPredictor(lengths), filter_order=True)
    assert [g[0].prompt for g in planner.plan(batch(list(lengths)), replicas=2)] == ["b", "d", "c", "a"]  # no history
    planner.history.observe_many(["b", "c"], [False, True])
    assert [g[0].prompt for g in planner.plan(batch(list(lengths)), replicas=2)] == ["c", "d", "a", "b"]
    off = SlimePlanner(placement="groups", predictor=OracleLengthPredictor(lengths), history=planner.history)
    assert [g[0].prompt for g in off.plan(batch(list(lengths)), replicas=2)] == ["b", "d", "c", "a"]
    unplanned = SlimePlanner(placement="groups", filter_order=True, history=planner.history)  # router mode
    assert not unplanned.planning
    assert [g[0].prompt for g in unplanned.plan(batch(list(lengths)), replicas=2)] == ["c", "a", "d", "b"]
    with pytest.raises(InvalidArgument, match="history"):
        SlimePlanner(placement="groups", history={"b": 0.1})


def test_an_over_sampled_rollout_left_to_slimes_router_is_handed_over_likely_kept_first(monkeypatch):
    lengths = {"p0": 100, "p1": 2000, "p2": 700, "p3": 1200}
    fake = FakeSlime(ENGINES, lengths)
    fake.install(monkeypatch)
    args = slime_args(dynamic_sampling_filter_path="lengthsched.integrations.slime.dynamic_sampling_filter")
    source = Source(list(lengths))
    ls_slime.generate_rollout(args, 0, source)
    assert [p for _, p in fake.posts[::4]] == ["p0", "p1", "p2", "p3"]  # nothing known: the data source's order
    ls_slime.planner_for(args).history.observe_many(["p0", "p2", "p1"], [False, False, True])  # what the filter did
    fake.posts.clear()
    ls_slime.generate_rollout(args, 1, source)
    assert [u for u, _ in fake.posts] == ["http://10.0.0.1:3000/generate"] * 16  # still slime's router
    assert [p for _, p in fake.posts[::4]] == ["p1", "p3", "p0", "p2"]
    ls_slime.reset()
    off = slime_args(dynamic_sampling_filter_path="lengthsched.integrations.slime.dynamic_sampling_filter",
                     lengthsched_filter_order=False)  # records only
    ls_slime.planner_for(off).history.observe_many(["p0", "p2", "p1"], [False, False, True])
    fake.posts.clear()
    ls_slime.generate_rollout(off, 0, source)
    assert [p for _, p in fake.posts[::4]] == ["p0", "p1", "p2", "p3"]
    ls_slime.reset()
    assert ls_slime.planner_for(slime_args()).filter_order  # the default, acting once the history knows something
    ls_slime.reset()
    # with partial rollout the aborted groups come back with their tokens: the order would only defer their work
    assert not ls_slime.planner_for(slime_args(partial_rollout=True)).filter_order
    ls_slime.reset()
    assert ls_slime.planner_for(slime_args(partial_rollout=True, lengthsched_filter_order=True)).filter_order
    ls_slime.reset()
    assert ls_slime.planner_for(slime_args(partial_rollout=False)).filter_order
    ls_slime.reset()
    with pytest.raises(InvalidArgument, match="lengthsched_filter_order"):
        ls_slime.planner_for(slime_args(lengthsched_filter_order="yes"))


def test_what_the_planner_learnt_of_the_lengths_is_read_back_by_a_resumed_run(monkeypatch, tmp_path):
    lengths = {"p0": 100, "p1": 2000, "p2": 700, "p3": 1200}
    fake = FakeSlime(ENGINES, lengths)
    fake.install(monkeypatch)
    path = tmp_path / "planner.json"
    args = slime_args(lengthsched_state_path=str(path))
    source = Source(list(lengths))
    ls_slime.generate_rollout(args, 0, source)
    ls_slime.generate_rollout(args, 1, source)
    learnt = ls_slime.planner_for(args).planner
    assert path.exists() and learnt.informed and learnt.observed > 0
    said = learnt.predict({"uid": np.array(list(lengths), dtype=object)})[2]
    ls_slime.reset()  # a run resumed from its checkpoint: a new process, a new planner
    resumed = ls_slime.planner_for(args).planner
    assert resumed.informed and (resumed.steps, resumed.observed) == (learnt.steps, learnt.observed)
    assert resumed.predict({"uid": np.array(list(lengths), dtype=object)})[2] == said
    ls_slime.reset()
    path.write_text("{not json")
    with pytest.raises(InvalidArgument, match="state_path"):
        ls_slime.planner_for(args)
    ls_slime.reset()


def test_the_filters_history_is_saved_after_every_rollout_and_read_back_by_a_resumed_run(monkeypatch, tmp_path):
    lengths = {"p0": 100, "p1": 2000, "p2": 700, "p3": 1200}
    fake = FakeSlime(ENGINES, lengths)
    fake.install(monkeypatch)
    _install_filters(monkeypatch, [])
    path = tmp_path / "history.json"
    args = slime_args(dynamic_sampling_filter_path="lengthsched.integrations.slime.dynamic_sampling_filter",
                      lengthsched_filter_history_path=str(path))
    source = Source(list(lengths))
    ls_slime.generate_rollout(args, 0, source)
    for prompt, rewards in (("p0", [1, 1, 1, 1]), ("p1", [0, 1, 0, 1]), ("p2", [0, 0, 0, 0])):
        ls_slime.dynamic_sampling_filter(args, _rewarded(prompt, rewards))
    ls_slime.generate_rollout(args, 1, source)
    assert path.exists()
    before = ls_slime.planner_for(args).history.pass_probability(["p0", "p1", "p2", "p3"])
    ls_slime.reset()  # a run resumed from its checkpoint: a new process, a new planner
    fake.posts.clear()
    ls_slime.generate_rollout(args, 2, source)
    assert ls_slime.planner_for(args).history.pass_probability(["p0", "p1", "p2", "p3"]).tolist() == pytest.approx(
        before.tolist())
    assert [p for _, p in fake.posts[::4]] == ["p1", "p3", "p0", "p2"]  # ordered from the first rollout on
    ls_slime.reset()
    path.write_text("{not json")
    with pytest.raises(InvalidArgument, match="lengthsched_filter_history_path"):
        ls_slime.planner_for(args)
    ls_slime.reset()
    with pytest.raises(InvalidArgument, match="lengthsched_filter_history_path"):
        ls_slime.planner_for(slime_args(lengthsched_filter_history_path=3))


class Cycle(Source):
    """A slime data source that hands out its prompts in turn, round and round."""

    def __init__(self, prompts, g=4):
        super().__init__(prompts, g)
        self.at = 0

    def get_samples(self, n):
        out = [self.prompts[(self.at + i) % len(self.prompts)] for i in range(n)]
        self.at += n
        return batch(out, self.g)


class SkipHard(SelectiveRollout):
    """GRESO's rule made certain: every prompt whose latest group was dropped all wrong is skipped."""

    def select(self, history, keys):
        return history.streaks(keys)[1] == 0


def test_the_filter_hook_records_whether_a_dropped_group_was_all_right_or_all_wrong(monkeypatch):
    FakeSlime(ENGINES, {}).install(monkeypatch)
    _install_filters(monkeypatch, [])
    args = slime_args(lengthsched_pool_tokens=5000)
    for prompt, rewards in (("easy", [1, 1, 1, 1]), ("hard", [0, 0, 0, 0]), ("neg", [-1, -1, -1, -1]),
                            ("mixed", [1, 0, 1, 0])):
        ls_slime.dynamic_sampling_filter(args, _rewarded(prompt, rewards))
    history = ls_slime.planner_for(args).history
    assert (history.groups, history.kept, history.easy, history.hard) == (4, 1, 1, 2)
    assert [x.tolist() for x in history.streaks(["easy", "hard", "neg", "mixed"])] == [[1, 0, 0, 0], [0, 1, 1, 0]]
    ls_slime.reset()
    strict = slime_args(lengthsched_pool_tokens=5000, lengthsched_solved_reward=2)  # a reward of 1 is not solved
    ls_slime.dynamic_sampling_filter(strict, _rewarded("easy", [1, 1, 1, 1]))
    assert ls_slime.planner_for(strict).history.hard == 1
    ls_slime.reset()
    group = _rewarded("dict", [0, 0, 0, 0])
    for s in group:  # slime's Sample: the reward read through get_reward_value (here a dict by reward_key)
        s.reward = {"acc": 1.0}
        s.get_reward_value = lambda args, s=s: s.reward[args.reward_key]
    ls_slime.dynamic_sampling_filter(slime_args(reward_key="acc", lengthsched_pool_tokens=5000,
                                                lengthsched_dynamic_sampling_filter_path="my_filters.at_least_one"),
                                     group)
    assert ls_slime.planner_for(slime_args()).history.easy == 0  # at_least_one kept it: no side
    ls_slime.reset()
    with pytest.raises(InvalidArgument, match="lengthsched_solved_reward"):
        ls_slime.dynamic_sampling_filter(slime_args(lengthsched_solved_reward="high"), _rewarded("x", [0, 0]))


def test_selective_rollout_skips_prompts_the_filter_keeps_dropping_and_fills_the_batch(monkeypatch, tmp_path):
    lengths = {f"p{i}": 100 * (i + 1) for i in range(6)}
    fake = FakeSlime(ENGINES, lengths)
    fake.install(monkeypatch)
    _install_filters(monkeypatch, [])
    path = tmp_path / "history.json"
    args = slime_args(dynamic_sampling_filter_path="lengthsched.integrations.slime.dynamic_sampling_filter",
                      lengthsched_selective_rollout=True, lengthsched_filter_history_path=str(path),
                      lengthsched_filter_order=False)
    planner = ls_slime.planner_for(args)
    assert isinstance(planner.selective, SelectiveRollout)
    planner.selective = SkipHard(p_easy=0.5, p_hard=0.5)
    for prompt, rewards in (("p1", [0, 0, 0, 0]), ("p2", [1, 0, 1, 0]), ("p4", [0, 0, 0, 0])):
        ls_slime.dynamic_sampling_filter(args, _rewarded(prompt, rewards))
    source = Cycle(list(lengths))
    ls_slime.generate_rollout(args, 0, source)  # slime asks for 4 groups: p1 and p4 skipped, p5 and p0 drawn
    assert [p for _, p in fake.posts[::4]] == ["p0", "p2", "p3", "p5"]  # slime's router, the source's order
    assert planner.skipped == 2 and len(fake.posts) == 16
    saved = json.loads(path.read_text())
    assert saved["selective"]["p_hard"] != 0.5 or saved["selective"]["p_easy"] != 0.5  # adapted after the rollout
    # a group partial rollout carries (it holds generated tokens) is never skipped
    carried = batch(["p1"])[0]
    for s in carried:
        s.response_length, s.tokens = 50, list(range(60))
    assert planner.select_groups([carried, batch(["p4"])[0]]) == [True, False]
    ls_slime.reset()  # a resumed run reads the rule's state back with the history
    again = ls_slime.planner_for(args)
    assert again.selective.to_dict()["p_hard"] == saved["selective"]["p_hard"]
    assert again.history.streaks(["p1"])[1].tolist() == [1]
    ls_slime.reset()
    assert ls_slime.planner_for(slime_args()).selective is None  # off by default
    ls_slime.reset()
    with pytest.raises(InvalidArgument, match="lengthsched_selective_rollout"):
        ls_slime.planner_for(slime_args(lengthsched_selective_rollout="yes"))
    with pytest.raises(InvalidArgument, match="selective"):
        SlimePlanner(placement="groups", selective=0.5)


def test_a_batch_whose_every_prompt_is_skipped_is_handed_over_short_not_drawn_for_ever():
    planner = SlimePlanner(placement="groups", selective=SkipHard())
    planner.history.observe("p0", False, "hard")
    source = ls_slime._SelectiveSource(Cycle(["p0"]), planner)
    assert source.get_samples(2) == [] and planner.skipped == 2 * ls_slime.SKIP_DRAWS


# ------------------------------------------------------------------------------------------ online sGPO
REWARDS = {"easy": lambda i: 1.0, "hard": lambda i: 0.0, "mixed": lambda i: float(i % 2)}


def sgpo_args(**extra):
    """slime's args with online sGPO on and the hooks it needs (4 samples per prompt, GRPO normalised by mean and
    standard deviation)."""
    return slime_args(**{**dict(lengthsched_sgpo=True, n_samples_per_prompt=4, lengthsched_placement="groups",
                                lengthsched_default_length=300, custom_generate_function_path=ls_slime.GENERATE_PATH,
                                custom_reward_post_process_path=ls_slime.REWARD_POST_PROCESS_PATH,
                                advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=True,
                                lengthsched_sgpo_unsolved_fraction=0.0), **extra})


def sgpo_fake(monkeypatch):
    fake = FakeSlime(ENGINES, {"easy": 300, "hard": 1500, "mixed": 800})
    fake.install(monkeypatch)
    fake.reward = lambda prompt, index: REWARDS[prompt](index)
    return fake


def test_online_sgpo_in_slime_generates_what_each_group_needs_and_masks_the_rest(monkeypatch, tmp_path):
    """lengthsched_sgpo: slime draws n_samples_per_prompt samples of a prompt; the integration sizes each group from
    the prompt's earlier rewards and sends the samples beyond its size for one token, with a reward of 0 and
    remove_sample (slime masks their loss); the planner neither plans nor learns them; the reward post-process
    normalises each group over the samples generated."""
    fake = sgpo_fake(monkeypatch)
    state = tmp_path / "sgpo.json"
    args = sgpo_args(lengthsched_sgpo_state_path=str(state))
    source = Source(["easy", "hard", "mixed"])
    first = ls_slime.generate_rollout(args, 0, source)
    assert not any(ls_slime._stub(x) for g in first.samples for x in g)  # nothing known: slime's 4 each
    sgpo = ls_slime.sgpo_for(args)
    assert sgpo.budget.groups == 3 and json.loads(state.read_text())["newest_step"] == 1
    fake.params.clear()
    out = ls_slime.generate_rollout(args, 1, source).samples
    by_prompt = {g[0].prompt: g for g in out}
    # easy (always solved) and hard (never): g_min = 2; mixed: informative wants 5, capped at slime's 4
    assert [sum(not ls_slime._stub(x) for x in by_prompt[p]) for p in ("easy", "hard", "mixed")] == [2, 2, 4]
    assert sorted(fake.params) == sorted([(p, 4096) for p, n in (("easy", 2), ("hard", 2), ("mixed", 4))
                                          for _ in range(n)] + [("easy", 1)] * 2 + [("hard", 1)] * 2)
    for g in out:
        live = [x for x in g if not ls_slime._stub(x)]
        for x in g[len(live):]:
            assert x.remove_sample and x.reward == 0.0 and x.response_length == 1  # not the reward model's 1.0
            assert x.metadata[REPLICA_KEY] == live[0].metadata[REPLICA_KEY]  # beside its prompt's cache
            assert x.metadata[ls_slime.WORK_KEY] == 1
    plan = ls_slime.planner_for(args).last_plan
    assert len(plan.replica) == 8  # the planner planned the 8 samples generated in full
    assert ls_slime.planner_for(args).observe(out) == 8  # and learns from them only
    flat = [x for g in out for x in g]
    raw, rewards = ls_slime.reward_post_process(args, flat)
    assert raw == [x.reward for x in flat]
    mixed = np.array([0.0, 1.0, 0.0, 1.0])
    expected = {"easy": [0.0] * 4, "hard": [0.0] * 4, "mixed": ((mixed - mixed.mean()) / (mixed.std(ddof=1) + 1e-6))}
    assert rewards == pytest.approx([v for g in out for v in expected[g[0].prompt]], abs=1e-12)
    saved = json.loads(state.read_text())
    assert saved["groups"] == 6 and saved["prompts"]["easy"]["groups"][-1] == [2, 2, 2]  # solved 2 of 2, step 2


def test_online_sgpo_in_slime_learns_from_the_groups_the_filter_drops_and_the_filter_sees_the_group_it_made(
        monkeypatch):
    calls = []
    fake = sgpo_fake(monkeypatch)
    fake.filtering = True
    _install_filters(monkeypatch, calls)
    args = sgpo_args(dynamic_sampling_filter_path=ls_slime.FILTER_PATH)
    source = Source(["easy", "hard", "mixed"])
    out = ls_slime.generate_rollout(args, 0, source).samples
    assert [g[0].prompt for g in out] == ["mixed"]  # DAPO's filter dropped the all-right and the all-wrong
    budget = ls_slime.sgpo_for(args).budget
    assert budget.success_rate("easy") == 1.0 and budget.success_rate("hard") == 0.0  # learnt all the same
    calls.clear()
    ls_slime.generate_rollout(args, 1, source)
    assert sorted(len(prompts) for _, prompts, _ in calls) == [2, 2, 4]  # the stubs are not shown to the filter


def test_online_sgpo_in_slime_resumed_from_a_checkpoint_forgets_the_rollouts_it_runs_again(monkeypatch, tmp_path,
                                                                                             caplog):
    sgpo_fake(monkeypatch)
    state = tmp_path / "sgpo.json"
    args = sgpo_args(lengthsched_sgpo_state_path=str(state), save_interval=2)
    source = Source(["easy", "hard", "mixed"])
    for rollout in range(3):
        ls_slime.generate_rollout(args, rollout, source)
    assert ls_slime.sgpo_for(args).budget.keep_steps == 3  # --save-interval + 1
    assert json.loads(state.read_text())["groups"] == 9
    ls_slime.reset()  # a new process, resumed after rollout 0 (its checkpoint)
    ls_slime.generate_rollout(args, 1, source)
    budget = ls_slime.sgpo_for(args).budget
    assert budget.groups == 6 and budget.newest_step == 2  # rollouts 1 and 2 forgotten, rollout 1 run again
    assert [g[2] for g in budget._groups["easy"]] == [1, 2]
    ls_slime.reset()  # the same resume where the budget keeps no reach (memory 1, no --save-interval)
    state.unlink()
    short = sgpo_args(lengthsched_sgpo_state_path=str(state), lengthsched_sgpo_memory=1)
    for rollout in range(3):
        ls_slime.generate_rollout(short, rollout, source)
    ls_slime.reset()
    with caplog.at_level("WARNING", logger="lengthsched.integrations.slime"):
        ls_slime.generate_rollout(short, 1, source)
    assert any("further back than the budget keeps" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("extra, match", [
    ({"custom_generate_function_path": None}, "--custom-generate-function-path"),
    ({"custom_reward_post_process_path": "my.post"}, "--custom-reward-post-process-path"),
    ({"custom_convert_samples_to_train_data_path": "my.convert"}, "--custom-convert-samples-to-train-data-path"),
    ({"dynamic_sampling_filter_path": "my.filter"}, "--dynamic-sampling-filter-path"),
    ({"n_samples_per_prompt": 1}, "n_samples_per_prompt"),
    ({"lengthsched_sgpo_g_max": 8}, "lengthsched_sgpo_g_max.*at most n_samples_per_prompt"),
    ({"lengthsched_sgpo_g_min": 1}, "lengthsched_sgpo_g_min"),
    ({"lengthsched_sgpo_rule": "half"}, "lengthsched_sgpo_rule"),
    ({"lengthsched_sgpo_keep_steps": -1}, "lengthsched_sgpo_keep_steps"),
    ({"lengthsched_sgpo_state_path": "/no/such/dir/sgpo.json"}, "lengthsched_sgpo_state_path"),
    ({"lengthsched_sgpo": "yes"}, "lengthsched_sgpo"),
    ({"lengthsched_generate_function_path": "my_agent.agent"}, "lengthsched_generate_function_path"),
    ({"group_rm": True}, "'group_rm'"),
    ({"lengthsched_sgpo_enable": False}, "lengthsched_sgpo_enable.*on/off: lengthsched_sgpo"),
    ({"lengthsched_sgpo_solved_reward": 0.9}, "lengthsched_sgpo_solved_reward.*lengthsched_solved_reward"),
])
def test_online_sgpo_in_slime_checks_its_settings_and_the_hooks_it_needs(extra, match):
    ls_slime.reset()
    with pytest.raises(InvalidArgument, match=match):
        ls_slime.sgpo_for(sgpo_args(**extra))
    ls_slime.reset()


def test_online_sgpo_in_slime_takes_null_memory_as_every_group_and_null_elsewhere_as_the_default():
    ls_slime.reset()
    sgpo = ls_slime.sgpo_for(sgpo_args(lengthsched_sgpo_memory=None, lengthsched_sgpo_target=None))
    assert sgpo.budget.memory is None and sgpo.budget.config.target == 0.9
    ls_slime.reset()
    assert ls_slime.sgpo_for(sgpo_args()).budget.memory == 2
    ls_slime.reset()


def test_the_reward_post_process_is_slimes_per_group_and_leaves_the_rest_alone():
    """Without stubs and with equal groups it gives slime's own normalisation (reshape by n_samples_per_prompt,
    mean, std with n - 1, + 1e-6); groups are taken by group_index where the samples have one; estimators slime does
    not normalise get the raw rewards."""
    rng = np.random.default_rng(0)
    groups = batch(["a", "b", "c"], g=4)
    values = rng.random(12)
    flat = [x for g in groups for x in g]
    for x, v in zip(flat, values):
        x.reward = float(v)
    args = SimpleNamespace(advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=True,
                           n_samples_per_prompt=4)
    raw, rewards = ls_slime.reward_post_process(args, flat)
    blocks = values.reshape(-1, 4)
    centred = blocks - blocks.mean(axis=1, keepdims=True)
    assert rewards == pytest.approx((centred / (blocks.std(axis=1, ddof=1, keepdims=True) + 1e-6)).ravel().tolist())
    args.grpo_std_normalization = False
    assert ls_slime.reward_post_process(args, flat)[1] == pytest.approx(centred.ravel().tolist())
    for k, x in enumerate(flat):  # by group_index: the groups interleaved
        x.group_index = k % 3
    by_index = ls_slime.reward_post_process(args, flat)[1]
    for k in range(3):
        members = values[k::3]
        assert by_index[k::3] == pytest.approx((members - members.mean()).tolist())
    args.advantage_estimator = "ppo"
    assert ls_slime.reward_post_process(args, flat) == (raw, raw)
    args.advantage_estimator, args.n_samples_per_prompt = "grpo", 5
    for x in flat:
        x.group_index = None
    with pytest.raises(InvalidArgument, match="'samples'"):
        ls_slime.reward_post_process(args, flat)


def test_a_group_the_filter_dropped_and_slime_kept_anyway_is_learnt_once(monkeypatch):
    """slime's check_reward_nonzero_std_with_fallback answers keep=False with keep_when_insufficient, and slime keeps
    the group when it is short of groups: it is then both in the rollout's output and among the groups the filter
    hook saw dropped; online sGPO records it once."""
    sgpo_fake(monkeypatch)
    args = sgpo_args()
    sgpo = ls_slime.sgpo_for(args)
    sgpo.start(0)
    group = _rewarded("easy", [1.0, 1.0, 1.0, 1.0])
    for x in group:
        x.status = Status.COMPLETED
    sgpo.dropped.append(list(group))  # what dynamic_sampling_filter appends (a new list, the same samples)
    ls_slime._learn(args, ls_slime.planner_for(args), sgpo, SimpleNamespace(samples=[group]), 0)
    assert sgpo.budget.groups == 1 and sgpo.budget._visits["easy"] == 1 and not sgpo.dropped
