"""lengthsched.integrations.areal_sgpo: online sGPO inside AReaL (groups of each prompt's own size, their group
normalisation over each trajectory, the data-parallel heads' budgets pooled through journals).

The fakes follow AReaL 1.0.4's ``GroupedRolloutWorkflow`` (gather a prompt's episodes, concatenate those not None)
and its ``Normalization`` / ``PPOActor.compute_advantages`` (the batch concatenated, then normalised). Where ``areal``
imports (CI's verl environment) the workflow runs inside AReaL's real ``GroupedRolloutWorkflow`` and
``RemoteInfEngine``, and the normalisation is checked against AReaL's own in float64."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_areal import PROMPTS, FakeRemoteInfEngine, real_areal, real_engine, request, requires_areal

from lengthsched import InvalidArgument
from lengthsched.integrations import areal as la
from lengthsched.integrations import areal_sgpo as sg
from lengthsched.sgpo import BudgetConfig, OnlineBudget


class FakeGrouped:
    """AReaL's GroupedRolloutWorkflow: ``group_size`` episodes of one prompt at once, the ones not None concatenated
    along the rows."""

    def __init__(self, workflow, group_size, logger):
        assert group_size >= 1
        self.workflow, self.group_size = workflow, group_size

    async def arun_episode(self, engine, data):
        results = await asyncio.gather(*[self.workflow.arun_episode(engine, data) for _ in range(self.group_size)])
        valid = [r for r in results if r is not None]
        if not valid:
            return None
        return {k: np.concatenate([r[k] for r in valid]) for k in valid[0]}


SGPOWorkflow = sg.make_sgpo_workflow_class(object, FakeGrouped)


class Versioned(FakeRemoteInfEngine):
    """The fake engine with AReaL's weight version."""

    version = 0

    def get_version(self):
        return self.version


# prompt i: solved always (i % 3 == 0), never (1), every other completion (2)
def kind(i):
    return ("trivial", "unsolved", "half")[i % 3]


class OneCompletion:
    """RLVRWorkflow's shape: one request through the engine, one reward (row i of PROMPTS: ``kind(i)``)."""

    def __init__(self):
        self.drawn = {}

    async def arun_episode(self, engine, data):
        i = data["i"]
        resp = await engine.agenerate(request(PROMPTS[i]))
        k = self.drawn[i] = self.drawn.get(i, 0) + 1
        reward = {"trivial": 1.0, "unsolved": 0.0, "half": float(k % 2)}[kind(i)]
        return {"input_ids": np.ones((1, 3)) * len(resp.output_tokens), "rewards": np.array([reward])}


def rows(n):
    return [{"messages": [{"role": "user", "content": f"prompt {i}"}], "i": i} for i in range(n)]


def run_epoch(workflow, engine, data):
    async def go():
        return await asyncio.gather(*[workflow.arun_episode(engine, d) for d in data])

    return asyncio.run(go())


# ----------------------------------------------------------------------------- group sizes from the rewards
def test_each_prompts_group_takes_the_size_its_rewards_call_for_and_the_rows_follow():
    engine = Versioned(2, {p: 40 for p in PROMPTS})
    wf = SGPOWorkflow(OneCompletion(), n=8)
    data = rows(9)
    first = run_epoch(wf, engine, data)
    assert [len(t["rewards"]) for t in first] == [8] * 9  # nothing seen: the run's own n
    assert wf.groups.reasons == {"unseen": 9} and wf.groups.learnt == 9
    engine.version = 1
    second = run_epoch(wf, engine, data)
    sizes = [len(t["rewards"]) for t in second]
    # trivial and unsolved prompts get g_min (2); half-solved ones the smallest informative group (p = 0.5: 5)
    assert sizes == [{"trivial": 2, "unsolved": 2, "half": 5}[kind(i)] for i in range(9)]
    assert wf.groups.completions == 72 + sum(sizes)
    assert [t["input_ids"].shape[0] for t in second] == sizes  # every row a completion of the group
    budget = wf.groups.budget
    assert budget.success_rate(sg.state_key(sg.data_key(data[0]))) == 1.0
    assert budget.newest_step == 2  # version 1 is step 2


def test_the_router_places_each_sgpo_group_as_one_group_of_its_size():
    engine = Versioned(3, {p: 40 + 300 * (i % 2) for i, p in enumerate(PROMPTS)})
    router = la.install(engine, pool_tokens=100_000, group_size=1, ways=1)  # n_samples 1: the workflow groups
    wf = SGPOWorkflow(OneCompletion(), n=4)
    data = rows(9)
    run_epoch(wf, engine, data)
    engine.version = 1
    second = run_epoch(wf, engine, data)
    sizes = [len(t["rewards"]) for t in second]
    assert router.groups == router.groups_back == 18 and router.loads == [0.0, 0.0, 0.0]
    assert router.planner.observed == 36 + sum(sizes)  # every completion learnt, in groups of their own size
    for p in PROMPTS[:9]:  # whole groups: each group's requests on one server (the second epoch after the first)
        sent = [addr for _, addr, q in engine.sent if q == p]
        assert len(set(sent[:4])) == 1 and len(set(sent[4:])) == 1


def test_each_group_records_its_size_and_why_as_arealss_workflows_record_their_statistics():
    recorded = []
    wf = sg.make_sgpo_workflow_class(object, FakeGrouped, recorded.append)(OneCompletion(), n=4)
    engine = Versioned(1, {p: 40 for p in PROMPTS})
    run_epoch(wf, engine, rows(3))
    engine.version = 1
    run_epoch(wf, engine, rows(3))
    assert [r["sgpo_group_size"] for r in recorded] == [4, 4, 4, 2, 2, 5]
    assert [r["sgpo_unseen"] for r in recorded] == [1, 1, 1, 0, 0, 0]
    assert [r["sgpo_trivial"] + r["sgpo_unsolved"] + r["sgpo_informative"] for r in recorded[3:]] == [1, 1, 1]
    assert set(sg.group_stats(8, "unsolved, sampled")) == {
        "sgpo_group_size", "sgpo_unseen", "sgpo_informative", "sgpo_trivial", "sgpo_unsolved", "sgpo_unsolved_sampled"}
    assert sg.group_stats(8, "unsolved, sampled")["sgpo_unsolved_sampled"] == 1.0


def test_without_the_workflows_group_the_router_keeps_its_own_size():
    engine = Versioned(2, {p: 40 for p in PROMPTS})
    router = la.install(engine, pool_tokens=100_000, group_size=3, ways=1)

    async def go():
        token = la.GROUP.set(("g", 2))
        try:
            await asyncio.gather(*[engine.agenerate(request(PROMPTS[0])) for _ in range(2)])
        finally:
            la.GROUP.reset(token)
        await asyncio.gather(*[engine.agenerate(request(PROMPTS[1])) for _ in range(3)])

    asyncio.run(go())
    assert router.groups == router.groups_back == 2 and router.planner.observed == 5


def test_areal_grouping_the_workflow_again_is_refused_with_the_setting_to_change():
    engine = Versioned(1, {p: 40 for p in PROMPTS})
    wf = SGPOWorkflow(OneCompletion(), n=4)
    twice = FakeGrouped(wf, 2, None)  # gconfig.n_samples 2: AReaL wraps the sGPO workflow in its own grouping
    with pytest.raises(InvalidArgument, match="gconfig.n_samples"):
        asyncio.run(twice.arun_episode(engine, rows(1)[0]))


def test_what_teaches_nothing_teaches_nothing(caplog):
    class Agent:
        async def arun_episode(self, engine, data):
            return {"c1": SimpleNamespace(reward=1.0)} if data["i"] else None

    class Grouped(FakeGrouped):
        async def arun_episode(self, engine, data):
            results = [await self.workflow.arun_episode(engine, data) for _ in range(self.group_size)]
            return None if results[0] is None else {k: v for r in results for k, v in r.items()}

    wf = sg.make_sgpo_workflow_class(object, Grouped)(Agent(), n=2)
    engine = Versioned(1, {})
    with caplog.at_level(logging.WARNING, logger="lengthsched.integrations.areal_sgpo"):
        run_epoch(wf, engine, rows(3))
    assert wf.groups.learnt == 0 and len(wf.groups.budget) == 0
    assert sum("without a 'rewards' tensor" in r.message for r in caplog.records) == 1  # once


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"n": 1}, "n"), ({"n": 4, "config": BudgetConfig(g_min=1, rule="informative")}, "config.g_min"),
    ({"n": 4, "config": "informative"}, "config"), ({"n": 4, "key": "messages"}, "key"),
    ({"n": 4, "solved_reward": float("nan")}, "solved_reward"), ({"n": 4, "memory": 0}, "memory"),
])
def test_bad_settings_name_the_argument(kwargs, name):
    with pytest.raises(InvalidArgument) as err:
        sg.SGPOGroups(**kwargs)
    assert err.value.name == name


def test_a_workflow_and_an_engine_that_are_not_areals_are_refused(tmp_path):
    with pytest.raises(InvalidArgument, match="workflow"):
        SGPOWorkflow(object(), n=4)
    wf = SGPOWorkflow(OneCompletion(), n=4)
    with pytest.raises(InvalidArgument, match="get_version"):
        asyncio.run(wf.arun_episode(FakeRemoteInfEngine(1, {}), rows(1)[0]))
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidArgument, match="share_dir"):
        sg.SGPOGroups(4, share_dir=tmp_path / "file")
    with pytest.raises(InvalidArgument, match="data"):
        sg.data_key(["no", "row"])


def test_the_prompt_key_is_the_rows_messages_prompt_or_ids():
    assert sg.data_key({"messages": [{"content": "a"}], "answer": 1}) == json.dumps([{"content": "a"}])
    assert sg.data_key({"prompt": "why"}) == '"why"'
    assert sg.data_key({"input_ids": np.array([1, 2])}) == "[1, 2]"


# ----------------------------------------------------------------------------- the heads' journals
def head(share, rank, n=8):
    return sg.SGPOGroups(n, share_dir=share, rank=rank)


def learn(groups, i, version, solved, samples):
    key, g, step, _ = groups.decide(rows(i + 1)[i], version)
    groups.observe(key, {"rewards": np.array([1.0] * solved + [0.0] * (samples - solved))}, step)
    return g


def test_heads_learn_the_prompts_the_other_heads_saw(tmp_path):
    a, b = head(tmp_path, 0), head(tmp_path, 1)
    assert learn(a, 0, 0, 8, 8) == 8 and learn(b, 1, 0, 0, 8) == 8  # step 1: each head its own prompt
    assert learn(a, 1, 0, 0, 8) == 8  # in a fresh run the others are read from version 1 on
    assert learn(b, 0, 1, 4, 8) == 2  # version 1: b takes a's groups; prompt 0 was trivial (g_min)
    assert learn(a, 1, 1, 0, 8) == 2  # a knows prompt 1 unsolved from b and from itself
    assert a.journal.taken == 2 and b.journal.taken == 2 and a.status()["written"] == 3
    lines = [json.loads(x) for x in (tmp_path / "sgpo-rank1.jsonl").read_text().splitlines()]
    assert [(r["seq"], r["solved"], r["samples"], r["step"]) for r in lines] == [(1, 0, 8, 1), (2, 4, 8, 2)]


def test_a_resumed_head_rebuilds_from_every_journal_and_forgets_what_came_after_the_checkpoint(tmp_path):
    a, b = head(tmp_path, 0), head(tmp_path, 1)
    learn(a, 0, 0, 8, 8)
    learn(b, 1, 0, 0, 8)
    for version in (1, 2, 3):  # prompt 2 half solved, then the run goes on past its checkpoint at step 2
        learn(a, 2, version, 4, 8)
        learn(b, 0, version, 0 if version == 3 else 8, 8)
    resumed = head(tmp_path, 0)
    resumed.decide(rows(1)[0], 2)  # AReaL resumes with the version of its checkpoint: groups of version >= 2 go
    reference = OnlineBudget(BudgetConfig(rule="informative"))
    for key_i, solved, step in [(0, 8, 1), (1, 0, 1), (2, 4, 2), (0, 8, 2)]:  # what the heads saw up to step 2
        reference.observe(sg.state_key(sg.data_key(rows(3)[key_i])), [1] * solved + [0] * (8 - solved), step)
    assert resumed.budget.to_dict()["prompts"] == reference.to_dict()["prompts"]
    own = [json.loads(x) for x in (tmp_path / "sgpo-rank0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in own] == [1, 2]  # rewritten without the groups after the checkpoint
    learn(resumed, 2, 2, 4, 8)
    assert json.loads((tmp_path / "sgpo-rank0.jsonl").read_text().splitlines()[-1])["seq"] == 5  # seq goes on
    b2 = head(tmp_path, 1)
    b2.decide(rows(1)[0], 2)
    assert b2.budget.to_dict()["prompts"] != {}  # b's own rebuild takes a's rewritten journal
    b.decide(rows(1)[0], 4)  # a head that did not restart reads a's rewritten journal: only what is new (seq 5)
    assert b.journal.taken == 5  # 4 before, then seq 5 alone (seq 1-2 again in the rewritten file: passed over)


def test_a_fresh_run_empties_its_own_journal(tmp_path):
    old = head(tmp_path, 0)
    learn(old, 0, 0, 8, 8)
    learn(old, 0, 1, 8, 8)
    fresh = head(tmp_path, 0)
    assert learn(fresh, 0, 0, 8, 8) == 8  # version 0: a new run, nothing remembered
    assert [json.loads(x)["seq"] for x in (tmp_path / "sgpo-rank0.jsonl").read_text().splitlines()] == [3]


def test_a_line_being_written_is_read_when_it_is_whole(tmp_path):
    a, b = head(tmp_path, 0), head(tmp_path, 1)
    learn(b, 0, 0, 0, 8)
    learn(a, 0, 1, 8, 8)
    with open(tmp_path / "sgpo-rank0.jsonl", "a") as f:
        f.write('{"seq": 2, "key": "x", "solved": 1,')
    learn(b, 1, 1, 0, 8)
    assert b.journal.taken == 1
    with open(tmp_path / "sgpo-rank0.jsonl", "a") as f:
        f.write(' "samples": 2, "step": 2}\n')
    learn(b, 1, 2, 0, 8)
    assert b.journal.taken == 2 and b.budget.success_rate("x") == 0.5


def test_a_journal_that_cannot_be_written_never_fails_a_request(tmp_path, monkeypatch, caplog):
    a = head(tmp_path, 0)
    real_open = open

    def failing(path, *args, **kwargs):
        if str(path).endswith(".jsonl") and args and args[0] == "a":
            raise OSError("disk full")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", failing)
    with caplog.at_level(logging.WARNING, logger="lengthsched.integrations.areal_sgpo"):
        learn(a, 0, 0, 8, 8)
    assert a.status()["failed"] == 1 and a.learnt == 1 and "disk full" in caplog.text


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 3), st.integers(0, 4), st.integers(1, 4)),
                min_size=1, max_size=25), st.integers(1, 4))
def test_every_heads_groups_reach_every_head_once(tmp_path_factory, events, final):
    share = tmp_path_factory.mktemp("share")
    heads = [head(share, 0), head(share, 1)]
    versions = [0, 0]
    for h in heads:  # both start with the run, at version 0
        h.decide(rows(1)[0], 0)
    seen = []
    for rank, i, solved, bump in events:
        versions[rank] = min(versions[rank] + (bump == 1), 5)
        learn(heads[rank], i, versions[rank], min(solved, 4), 4)
        seen.append((i, min(solved, 4)))
    for h in heads:
        h.decide(rows(1)[0], 6)  # a later version: each reads the rest
    for h in heads:
        assert h.budget.groups == len(seen)  # every group once, its own and the other's


# ----------------------------------------------------------------------------- group normalisation per trajectory
class AReaLNorm:
    """AReaL 1.0.4's Normalization (areal/utils/data.py) without torch.distributed: its group levels over fixed
    slices of group_size rows, and its _compute_mean / _compute_std."""

    def __init__(self, mean_level="group", std_level="group", group_size=1, mean_leave1out=False, std_unbiased=True,
                 eps=1e-5):
        self.mean_level, self.std_level, self.group_size = mean_level, std_level, group_size
        self.mean_leave1out, self.std_unbiased, self.eps = mean_leave1out, std_unbiased, eps

    def __call__(self, x, loss_mask=None, high_precision=True, reduce_group=None):
        return sg.TrajectoryGroupNorm(self, [self.group_size] * (x.size(0) // self.group_size))(x, loss_mask)

    @staticmethod
    def _compute_mean(x, mask, high_precision, leave_one_out, all_reduce, reduce_group):
        x = x.to(torch.float64)
        dim = tuple(range(len(x.shape)))
        if mask is None:
            factor = torch.tensor(float(np.prod(x.shape)), dtype=torch.float64)
            x_masked, x_sum = x, x.sum(dim=dim, keepdim=True)
        else:
            mask = mask.to(torch.float64)
            x_masked = x * mask
            factor, x_sum = mask.sum(dim, keepdim=True), x_masked.sum(dim=dim, keepdim=True)
        if leave_one_out:
            if factor.item() <= 1:
                return torch.zeros_like(x_sum)
            loo = x_sum.expand_as(x) - x_masked
            if mask is None:
                return loo / (factor - 1)
            return torch.where(mask > 0, loo / torch.clamp(factor - mask, min=1.0), (x_sum / factor).expand_as(x))
        return torch.zeros_like(x_sum) if factor.item() == 0 else x_sum / factor

    @staticmethod
    def _compute_std(x, mask, mean, unbiased, high_precision, all_reduce, reduce_group):
        x, mean = x.to(torch.float64), mean.to(torch.float64)
        dim = tuple(range(len(x.shape)))
        if mask is None:
            factor = torch.tensor(float(np.prod(x.shape)), dtype=torch.float64)
            sq = ((x - mean) ** 2).sum(dim=dim, keepdim=True)
        else:
            mask = mask.to(torch.float64)
            factor = mask.sum(dim, keepdim=True)
            sq = ((x * mask - mean * mask) ** 2).sum(dim=dim, keepdim=True)
        if unbiased:
            return torch.ones_like(sq) if factor.item() <= 1 else (sq / (factor - 1)).sqrt()
        return torch.ones_like(sq) if factor.item() == 0 else (sq / factor).sqrt()


def test_groups_of_their_own_size_are_normalised_each_over_its_rows():
    x = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    sizes = [2, 5, 2]
    out = sg.TrajectoryGroupNorm(AReaLNorm(), sizes)(x)
    at = 0
    for size in sizes:
        g = x[at:at + size]
        expected = (g - g.mean()) / (g.std(unbiased=True) + 1e-5)
        assert torch.allclose(out[at:at + size].double(), expected.float().double())
        at += size
    with pytest.raises(InvalidArgument, match="sizes"):
        sg.TrajectoryGroupNorm(AReaLNorm(), [2, 2])(x)


class FakePPOActor:
    """PPOActor.compute_advantages: the trajectories concatenated, the rewards normalised by reward_norm."""

    def __init__(self, reward_norm, adv_norm=None):
        self.reward_norm, self.adv_norm = reward_norm, adv_norm

    def compute_advantages(self, data):
        rewards = torch.cat([torch.as_tensor(t["rewards"]) for t in data])
        return self.reward_norm(rewards)


def test_the_actor_normalises_each_trajectory_as_one_group_and_patching_twice_changes_nothing():
    actor = FakePPOActor(AReaLNorm(group_size=1), AReaLNorm("batch", "batch"))
    trainer = SimpleNamespace(actor=SimpleNamespace(actor=actor))
    assert sg.normalize_per_trajectory(trainer) is actor
    assert isinstance(actor.reward_norm, sg.TrajectoryGroupNorm) and isinstance(actor.adv_norm, AReaLNorm)
    sg.normalize_per_trajectory(actor)
    assert not isinstance(actor.reward_norm.norm, sg.TrajectoryGroupNorm)
    data = [{"input_ids": torch.ones(n, 4), "rewards": torch.tensor(r, dtype=torch.float64)}
            for n, r in [(2, [1.0, 0.0]), (3, [1.0, 1.0, 0.0])]]
    out = actor.compute_advantages(data)
    assert out[:2].tolist() == pytest.approx([0.7071, -0.7071], abs=1e-3)
    assert out[2:].tolist() == pytest.approx([0.5773, 0.5773, -1.1547], abs=1e-3)
    with pytest.raises(InvalidArgument, match="actor"):
        sg.normalize_per_trajectory(SimpleNamespace())


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.integers(1, 6), st.sampled_from(["group", "batch", None]),
       st.sampled_from(["group", "batch", None]), st.booleans(), st.booleans(), st.integers(0, 2**31 - 1))
def test_with_groups_of_one_size_it_is_arealsown_arithmetic(size, groups, mean_level, std_level, loo, unbiased, seed):
    """Against the group loop of AReaL's Normalization.__call__, written out here as AReaL has it."""
    rng = np.random.default_rng(seed)
    x = torch.tensor(rng.normal(size=(size * groups, 3)))
    mask = torch.tensor(rng.integers(0, 2, size=(size * groups, 3)), dtype=torch.float64)
    norm = AReaLNorm(mean_level, std_level, size, loo, unbiased)
    ours = sg.TrajectoryGroupNorm(norm, [size] * groups)(x, mask)
    if mask.sum() == 0:
        return
    # AReaL's loop: for i in range(bs // group_size), slices of group_size
    mean = torch.zeros_like(x)
    for i in range(groups):
        s = slice(i * size, (i + 1) * size)
        if mean_level == "group":
            mean[s] = (torch.zeros((1, 3), dtype=torch.float64) if size == 1 and loo else
                       AReaLNorm._compute_mean(x[s], mask[s], True, loo, False, None)).expand_as(x[s])
    if mean_level == "batch":
        mean = AReaLNorm._compute_mean(x, mask, True, loo, True, None).expand_as(x)
    std = torch.ones_like(x)
    eps = 1e-5
    if std_level == "group":
        for i in range(groups):
            s = slice(i * size, (i + 1) * size)
            std[s] = (torch.ones((1, 3), dtype=torch.float64) if size == 1 and unbiased else
                      AReaLNorm._compute_std(x[s], mask[s], mean[s], unbiased, True, False, None)).expand_as(x[s])
    elif std_level == "batch":
        std = AReaLNorm._compute_std(x, mask, mean, unbiased, True, True, None).expand_as(x)
    else:
        eps = 0.0
    expected = (((x - mean) * mask) / (std + eps)).float()
    assert torch.equal(ours, expected)


# ----------------------------------------------------------------------------- AReaL's real classes
@requires_areal
def test_inside_areals_real_grouped_workflow_engine_and_normalisation(monkeypatch, tmp_path):
    real_rie = real_areal()
    policy = asyncio.get_event_loop_policy()
    try:
        from areal.api import ModelRequest, RolloutWorkflow
        from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig, NormConfig
        from areal.engine.sglang_remote import SGLangBackend
        from areal.utils.data import Normalization

        made = sg.SGPOWorkflow  # made from AReaL's classes on first access
    finally:
        asyncio.set_event_loop_policy(policy)
    assert issubclass(made, RolloutWorkflow)

    config = InferenceEngineConfig(experiment_name="t", trial_name="t", consumer_batch_size=6,
                                   max_head_offpolicyness=1)
    engine = real_engine(real_rie, monkeypatch, config, SGLangBackend(), {p: 30 for p in PROMPTS})
    router = la.install(engine, pool_tokens=10_000, group_size=1, ways=1)

    class OneSample(RolloutWorkflow):
        drawn: dict = {}

        async def arun_episode(self, engine, data):
            req = ModelRequest(rid=os.urandom(8).hex(), input_ids=list(PROMPTS[data["i"]]),
                               gconfig=GenerationHyperparameters(max_new_tokens=100, n_samples=1))
            resp = await engine.agenerate(req)
            k = self.drawn[data["i"]] = self.drawn.get(data["i"], 0) + 1
            reward = {"trivial": 1.0, "unsolved": 0.0, "half": float(k % 2)}[kind(data["i"])]
            return {"input_ids": torch.ones(1, len(resp.output_tokens), dtype=torch.int32),
                    "rewards": torch.tensor([reward])}

    wf = made(OneSample(), n=4, share_dir=tmp_path, rank=0)
    data = rows(6)
    run_epoch(wf, engine, data)
    engine.set_version(1)
    trajectories = run_epoch(wf, engine, data)
    sizes = [int(t["rewards"].shape[0]) for t in trajectories]
    assert sizes == [{"trivial": 2, "unsolved": 2, "half": 5}[kind(i)] for i in range(6)]
    assert router.groups_back == 12 and router.loads == [0.0, 0.0, 0.0]
    from areal.utils import stats_tracker  # each group's size went where AReaL's workflows put their statistics

    sizes_recorded = [v for k, v in stats_tracker.get("rollout").stats.items() if k.endswith("sgpo_group_size")]
    assert sizes_recorded == [[4.0] * 6 + [float(g) for g in sizes]]
    # AReaL's own normalisation of each group alone, and ours over the concatenated batch
    rewards = torch.cat([t["rewards"] for t in trajectories]).double()
    cfg = NormConfig(mean_level="group", std_level="group", group_size=4)
    ours = sg.TrajectoryGroupNorm(Normalization(cfg), sizes)(rewards)
    at = 0
    for size in sizes:
        alone = Normalization(NormConfig(mean_level="group", std_level="group", group_size=size))(rewards[at:at + size])
        assert torch.equal(ours[at:at + size], alone)
        at += size
    # with one size for every group: AReaL's Normalization itself, every level
    x = torch.randn(12, 5, dtype=torch.float64)
    mask = (torch.rand(12, 5) > 0.3).double()
    for mean_level in ("group", "batch", None):
        for std_level in ("group", "batch", None):
            for loo in (False, True):
                cfg = NormConfig(mean_level=mean_level, std_level=std_level, group_size=3, mean_leave1out=loo)
                assert torch.equal(sg.TrajectoryGroupNorm(Normalization(cfg), [3] * 4)(x, mask),
                                   Normalization(cfg)(x, mask))
