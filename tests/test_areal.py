"""lengthsched.integrations.areal: AReaL's requests routed by a GroupRouter (each group placed by predicted work).

The fake follows AReaL 1.0.4's ``RemoteInfEngine.agenerate`` (``areal/infra/remote_inf_engine.py``): a request
whose rid is in ``rid_to_address`` goes there, any other to ``choose_server()`` (a round robin), remembered in
``rid_to_address`` / ``rid_queue`` (the oldest of ``RID_CACHE_SIZE`` forgotten), and the request is sent to that
server (here a coroutine that answers after a while with the prompt's scripted length); and
``GroupedRolloutWorkflow.arun_episode``, which gathers a prompt's ``group_size`` episodes, each with a fresh rid.
Where ``areal`` imports (CI's verl environment), the router also runs inside AReaL's real ``RemoteInfEngine`` and
``GroupedRolloutWorkflow``, the HTTP call replaced by a fake SGLang server.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import re
import tempfile
import uuid
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthsched import InvalidArgument, OnlineLengthPredictor
from lengthsched.integrations import areal as la
from lengthsched.integrations.verl import RolloutPlanner

# AReaL's real classes, where areal is installed (CI's verl environment; not the main one: areal pins torch < 2.11).
# Imported only inside the test that uses them: areal.api.cli_args calls uvloop.install() at import, which would
# change the event loop of every later test in the process (the verl tests' stealing runs on asyncio's order).
requires_areal = pytest.mark.skipif(importlib.util.find_spec("areal") is None,
                                    reason="areal is not installed here (CI's verl environment has it)")


def real_areal():
    """AReaL's remote engine module, imported with asyncio's event-loop policy kept as it was."""
    policy = asyncio.get_event_loop_policy()
    try:
        import areal.infra.remote_inf_engine as rie
    finally:
        asyncio.set_event_loop_policy(policy)
    return rie


class FakeRemoteInfEngine:
    """AReaL 1.0.4's RemoteInfEngine as far as routing goes (its agenerate's choice of server, verbatim in
    logic), its servers answering each request with ``lengths[prompt]`` tokens after that many milliseconds / 10."""

    def __init__(self, servers: int, lengths: dict, *, consumer_batch_size: int = 8,
                 max_concurrent_rollouts: int | None = None, max_head_offpolicyness: int | None = None):
        self.addresses = [f"10.0.0.{i}:3000" for i in range(servers)]
        self.server_idx = 0
        self.rid_to_address: dict[str, str] = {}
        self.rid_queue: list[str] = []
        self.lengths = lengths
        self.sent: list[tuple[str, str, tuple]] = []  # (rid, address, prompt)
        self.config = SimpleNamespace(consumer_batch_size=consumer_batch_size,
                                      max_concurrent_rollouts=max_concurrent_rollouts,
                                      max_head_offpolicyness=max_head_offpolicyness)
        self.fail: set = set()  # prompts whose requests raise

    def choose_server(self) -> str:
        server = self.addresses[self.server_idx]
        self.server_idx = (self.server_idx + 1) % len(self.addresses)
        return server

    async def agenerate(self, req):
        if req.rid in self.rid_to_address:
            server_addr = self.rid_to_address[req.rid]
        else:
            server_addr = self.choose_server()
            if len(self.rid_queue) >= la.RID_CACHE_SIZE:
                oldest_rid = self.rid_queue.pop(0)
                self.rid_to_address.pop(oldest_rid, None)
            self.rid_to_address[req.rid] = server_addr
            self.rid_queue.append(req.rid)
        prompt = tuple(req.input_ids)
        self.sent.append((req.rid, server_addr, prompt))
        n = self.lengths[prompt]
        await asyncio.sleep(n / 10000)
        if prompt in self.fail:
            raise RuntimeError("server error")
        return SimpleNamespace(output_tokens=[7] * n, input_tokens=list(prompt))


class FakeSGLangEngine:
    """AReaL's RemoteSGLangEngine: a shell delegating to its RemoteInfEngine (``_engine``)."""

    def __init__(self, inner):
        self._engine = inner

    async def agenerate(self, req):
        return await self._engine.agenerate(req)


def request(prompt, rid=None):
    return SimpleNamespace(rid=rid or uuid.uuid4().hex, input_ids=list(prompt), tokenizer=None)


async def group_episode(engine, prompt, size):
    """GroupedRolloutWorkflow.arun_episode: ``size`` episodes of one prompt at once, each a fresh rid."""
    return await asyncio.gather(*[engine.agenerate(request(prompt)) for _ in range(size)])


def servers_of(engine, prompt):
    return [addr for _, addr, p in engine.sent if p == prompt]


PROMPTS = [tuple(range(i, i + 5)) for i in range(0, 60, 5)]  # 12 prompts of 5 tokens


def lengths_for(long_every=4):
    return {p: (400 if i % long_every == 0 else 40) for i, p in enumerate(PROMPTS)}


# ----------------------------------------------------------------------------- routing groups
def test_whole_groups_go_to_the_server_with_least_predicted_work_and_loads_return_to_zero():
    fake = FakeRemoteInfEngine(3, lengths_for())
    router = la.install(fake, pool_tokens=10_000, group_size=4, ways=1)

    async def go():
        await asyncio.gather(*[group_episode(fake, p, 4) for p in PROMPTS[:6]])

    asyncio.run(go())
    for p in PROMPTS[:6]:
        assert len(set(servers_of(fake, p))) == 1  # a whole group on one server (AReaL: 3 servers in turn)
    # nothing known yet: every group predicted alike, so the groups go round the servers by count
    assert sorted(servers_of(fake, p)[0] for p in PROMPTS[:6]) == sorted(fake.addresses * 2)
    assert router.loads == [0.0, 0.0, 0.0] and router.status()["in_flight"] == 0
    assert router.groups == router.groups_back == 6 and router.routed == 24


def test_aReaL_round_robin_spreads_every_group_without_lengthsched():
    fake = FakeRemoteInfEngine(4, lengths_for())
    asyncio.run(group_episode(fake, PROMPTS[0], 8))
    assert sorted(servers_of(fake, PROMPTS[0])) == sorted(fake.addresses * 2)  # the baseline the router replaces


def test_the_predictor_learns_each_group_and_the_next_epoch_balances_predicted_work():
    fake = FakeRemoteInfEngine(3, lengths_for(long_every=4))
    planner = RolloutPlanner(OnlineLengthPredictor(default_length=100))
    router = la.install(fake, pool_tokens=10_000, group_size=4, ways=1, planner=planner, batch=6)

    async def epoch():
        await asyncio.gather(*[group_episode(fake, p, 4) for p in PROMPTS[:6]])

    asyncio.run(epoch())
    assert planner.observed == 24 and planner.steps == 1  # 6 groups back = one learner batch
    predicted = planner.predictor.predict([la.prompt_text(request(p)) for p in PROMPTS[:6]]).lengths
    assert predicted[0] > 5 * predicted[1]  # the long prompts (0 and 4) are known long now
    fake.sent.clear()
    placed = []
    for p in PROMPTS[:6]:  # submitted one after another, nothing back in between: the loads decide
        placed.append(router.route(uuid.uuid4().hex, la.prompt_text(request(p)), 5, 3))
        for _ in range(3):
            router.route(uuid.uuid4().hex, la.prompt_text(request(p)), 5, 3)
    assert placed[0] != placed[4]  # the two long groups on different servers
    loads = np.array(router.loads)
    assert loads.max() - loads.min() <= 4 * float(predicted.max()) + 1e-9  # greedy: within the largest group
    assert loads.sum() == pytest.approx(4 * float(predicted.sum()))


def test_ranks_sharing_a_directory_know_the_prompts_other_ranks_saw_in_earlier_epochs(tmp_path, monkeypatch):
    # AReaL's sampler deals the prompts to the ranks afresh every epoch: here rank k gets PROMPTS[k::3] in the first
    # epoch and rank (k + 1) mod 3's in the second
    share = tmp_path / "share"

    def ranks(shared):
        fakes = [FakeRemoteInfEngine(3, lengths_for(long_every=2)) for _ in range(3)]
        return fakes, [la.install(f, pool_tokens=10_000, group_size=4, ways=1, batch=2, rank=k,
                                  share_dir=share if shared else None) for k, f in enumerate(fakes)]

    def epoch(fakes, deal):
        for k, fake in enumerate(fakes):  # one rank after another (each merges the files written before it)
            async def go(k=k, fake=fake):
                for p in PROMPTS[deal(k)::3]:
                    await group_episode(fake, p, 4)
            asyncio.run(go())

    def predicted(router, k):  # rank k's predictions of its second-epoch prompts, in the order served
        keys = [la.prompt_text(request(p)) for p in PROMPTS[(k + 1) % 3::3]]
        return router.planner.predictor.predict(keys).lengths

    for shared in (False, True):
        fakes, routers = ranks(shared)
        epoch(fakes, lambda k: k)
        for router in routers:
            router.merge()  # the files written since (as at the start of the rank's next step)
        for k, router in enumerate(routers):
            guess = predicted(router, k)
            long_ones = np.array([lengths_for(long_every=2)[p] for p in PROMPTS[(k + 1) % 3::3]]) > 100
            if shared:  # the long prompts the other rank saw are known long here
                assert guess[long_ones].min() > 4 * guess[~long_ones].max()
            else:  # alone, a rank knows nothing of them: every new prompt predicted alike
                assert guess.min() == guess.max()
    # each rank's whole file, and what it observed in each of its two steps (its change files)
    assert sorted(x.name for x in share.iterdir()) == sorted(f"rank{k}{part}.json" for k in range(3)
                                                             for part in ("", "-new-1", "-1-2"))
    assert [r.status()["taken_from_ranks"] for r in routers] == [8, 8, 8]  # each took the others' 8 prompts
    assert all(r.merge() == 0 for r in routers)  # nothing rewritten since: no file is read again
    resumed = la.GroupRouter(10_000, group_size=4, batch=2, rank=1, share_dir=share)  # a restarted rank
    assert (resumed.planner.steps, resumed.planner.observed) == (routers[1].planner.steps,
                                                                routers[1].planner.observed)
    monkeypatch.setenv("RANK", "2")
    assert la.install(FakeRemoteInfEngine(2, {}), pool_tokens=100, group_size=2, share_dir=share).rank == 2
    monkeypatch.setenv("RANK", "two")
    with pytest.raises(InvalidArgument, match="RANK"):
        la.install(FakeRemoteInfEngine(2, {}), pool_tokens=100, group_size=2, share_dir=share)
    with pytest.raises(InvalidArgument) as err:
        la.GroupRouter(100, group_size=2, share_dir=share / "rank0.json")  # a file, not a directory
    assert err.value.name == "share_dir"
    with pytest.raises(InvalidArgument) as err:
        la.GroupRouter(100, group_size=2, share_dir=share, planner=RolloutPlanner(state_path=tmp_path / "x.json"))
    assert err.value.name == "planner"


def _share_epochs(share, epochs=3):
    """3 ranks sharing ``share`` over ``epochs`` epochs of PROMPTS (rank k gets PROMPTS[(k + e) % 3::3] in epoch
    e), in step: a group of each rank in turn, one group a step; returns the routers and each rank's predictions
    of every prompt at the end."""
    fakes = [FakeRemoteInfEngine(3, lengths_for(long_every=2)) for _ in range(3)]
    routers = [la.install(f, pool_tokens=10_000, group_size=4, batch=1, rank=k, share_dir=share)
               for k, f in enumerate(fakes)]
    for e in range(epochs):
        for j in range(4):
            for k, fake in enumerate(fakes):
                asyncio.run(group_episode(fake, PROMPTS[(k + e) % 3::3][j], 4))
    keys = [la.prompt_text(request(p)) for p in PROMPTS]
    return routers, [r.planner.predictor.predict(keys).lengths for r in routers]


def test_ranks_read_each_others_changes_not_their_whole_files_and_learn_the_same(tmp_path, monkeypatch, caplog):
    routers, changed = _share_epochs(tmp_path / "changes")
    for r in routers:  # each other rank's whole file once (the first read), then only what it observed in a step
        assert r.status()["whole_reads"] == 2 and r.status()["change_reads"] >= 8
    names = [x.name for x in (tmp_path / "changes").iterdir()]
    assert all(sum(n.startswith(f"rank{k}-") for n in names) == 12 for k in range(3))  # a file per step
    with monkeypatch.context() as m:  # the whole files alone, as before change files (an older lengthsched)
        m.setattr(la, "_CHANGES", re.compile(r"(?!)"))
        m.setattr(la, "WHOLE_EVERY", 1)  # which rewrote its whole file every step
        alone, whole = _share_epochs(tmp_path / "whole")
    assert all(r.status()["change_reads"] == 0 and r.status()["whole_reads"] > 2 for r in alone)
    # ranks in step learn the same either way, to the token (ranks far apart in steps may differ a little: a whole
    # file also relays what its rank took from others, under that rank's step count)
    for a, b in zip(changed, whole):
        assert np.array_equal(a, b)
        long_ones = np.array([lengths_for(long_every=2)[p] for p in PROMPTS]) > 100
        assert a[long_ones].min() > a[~long_ones].max()
    monkeypatch.setattr(la, "KEEP_CHANGES", 2)  # each rank keeps its latest 2: a rank 3 steps behind reads all
    monkeypatch.setattr(la, "WHOLE_EVERY", 2)  # and writes its whole file every 2 change files
    routers, _ = _share_epochs(tmp_path / "few", epochs=1)
    names = [x.name for x in (tmp_path / "few").iterdir()]
    assert all(sum(n.startswith(f"rank{k}-") for n in names) == 2 for k in range(3))
    late = la.GroupRouter(10_000, group_size=4, batch=1, rank=5, share_dir=tmp_path / "few")
    assert late.merge() == 12 and late.status()["whole_reads"] == 3  # every prompt, from the whole files
    assert late.merge() == 0  # nothing new
    fresh = la.GroupRouter(10_000, group_size=4, batch=1, rank=6, share_dir=tmp_path / "few")
    fresh._read = {0: 0, 1: 0, 2: 0}  # as if it had read step 0 of each: steps 1 and 2 are gone
    fresh.merge()
    assert fresh.status()["whole_reads"] == 3
    newest = max((x for x in (tmp_path / "few").iterdir() if x.name.startswith("rank0-")),
                 key=lambda x: int(x.stem.rsplit("-", 1)[1]))
    # with 2 kept, each rank rewrites its whole file every 2 change files: rank 0's is of step 3, and its step 4 is
    # only in its newest change file
    assert [r.status()["whole_writes"] for r in routers] == [2, 2, 2]
    newest.write_text("{not json")  # a bad change file: left out with a warning; its prompt is lost for now
    bad = la.GroupRouter(10_000, group_size=4, batch=1, rank=7, share_dir=tmp_path / "few")
    with caplog.at_level(logging.WARNING, logger="lengthsched.integrations.areal"):
        assert bad.merge() == 11
    assert "left out another rank's file" in caplog.text and bad.status()["whole_reads"] == 3
    assert bad.merge() == 0  # still broken: not read again, nor the whole file read before as it is
    assert caplog.text.count("left out another rank's file") == 1 and bad.status()["whole_reads"] == 3
    last = la.prompt_text(request(PROMPTS[0::3][3]))  # rank 0's group of step 4

    def guess(router):
        return router.planner.predictor.predict([last]).lengths[0]

    before = guess(bad)
    routers[0].planner.save_state(routers[0].state_path)  # rank 0 rewrites its whole file (its step 4 in it)
    assert bad.merge() > 0 and bad.status()["whole_reads"] == 4
    # known now: rank 0's statistics (the prior's sums are each rank's own, hence a token apart)
    assert abs(guess(bad) - guess(routers[0])) <= 1 and abs(guess(bad) - before) > 5


def test_a_restarted_rank_resumes_from_its_whole_file_and_replays_its_change_files_after_it(tmp_path, caplog):
    share = tmp_path / "share"
    fake = FakeRemoteInfEngine(3, lengths_for(long_every=3))
    router = la.install(fake, pool_tokens=10_000, group_size=4, batch=1, share_dir=share)
    for _ in range(2):  # 24 groups, a rollout step each
        for p in PROMPTS:
            asyncio.run(group_episode(fake, p, 4))
    # a change file every step (the latest 16 kept), the whole file with the first and then every 8
    assert router.planner.steps == 24 and router.status()["whole_writes"] == 3
    whole = (share / "rank0.json").read_text()
    assert json.loads(whole)["steps"] == 17
    assert len(list(share.glob("rank0-*.json"))) == la.KEEP_CHANGES
    restarted = la.GroupRouter(10_000, group_size=4, batch=1, share_dir=share)
    assert restarted.status()["replayed"] == 7  # steps 18 to 24
    assert restarted.planner.state() == router.planner.state()  # where it stood, to the last statistic
    keys = [la.prompt_text(request(p)) for p in PROMPTS] + ["a prompt never seen"]
    assert np.array_equal(restarted.planner.predictor.predict(keys).lengths,
                          router.planner.predictor.predict(keys).lengths)
    for k in range(4):  # its steps count on from 24: its next group is step 25, written and shared at once
        restarted.route(f"after-{k}", keys[0], 5, 3)
    for k in range(4):
        restarted.finished(f"after-{k}", 100)
    assert restarted.planner.steps == 25 and (share / "rank0-new-25.json").exists()
    assert restarted.status()["whole_writes"] == 1 and json.loads((share / "rank0.json").read_text())["steps"] == 25
    (share / "rank0-19-20.json").write_text("{not json")  # a bad change file ends the replay there
    (share / "rank0.json").write_text(whole)  # the whole file of step 17 back
    with caplog.at_level(logging.WARNING, logger="lengthsched.integrations.areal"):
        again = la.GroupRouter(10_000, group_size=4, batch=1, share_dir=share)
    assert again.status()["replayed"] == 2 and again.planner.steps == 19
    assert "stopped replaying this rank's changes" in caplog.text


@settings(max_examples=40, deadline=None)
@given(events=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 7), st.integers(1, 3000), st.booleans()),
                       min_size=1, max_size=40),
       keep=st.integers(1, 4), every=st.integers(1, 5))
def test_ranks_sharing_a_directory_lose_nothing_through_gaps_pruning_and_restarts(events, keep, every):
    # 3 ranks run groups of 8 prompts in any order, a rank sometimes restarting (from its whole file and its change
    # files after it), each keeping few change files and rewriting its whole file every few (more or fewer than it
    # keeps: the change files since the whole file stay): once each has merged
    # what is there, every rank knows every prompt any rank observed, and a restarted rank knows what it did
    keys = [f"prompt {i}" for i in range(8)]

    def rank(k, share):
        return la.GroupRouter(10_000, group_size=2, batch=1, rank=k, share_dir=share)

    def evidence(router, key):
        stats = router.planner.predictor.state_dict(prompts=[key])["prompts"].get(key)
        return stats is not None and stats[2] + stats[5] > 0  # finished siblings, or their decayed history

    with tempfile.TemporaryDirectory() as tmp, mock.patch.multiple(la, KEEP_CHANGES=keep, WHOLE_EVERY=every):
        routers = [rank(k, tmp) for k in range(3)]
        seen = [set() for _ in range(3)]
        for n, (k, p, length, restart) in enumerate(events):
            if restart:
                routers[k] = rank(k, tmp)
                assert all(evidence(routers[k], keys[q]) for q in seen[k])  # nothing of its own lost
            for j in range(2):
                routers[k].route(f"{n}-{j}", keys[p], 5, 2)
            for j in range(2):
                routers[k].finished(f"{n}-{j}", length + j)
            seen[k].add(p)
            # the latest `keep`, and those written since the rank's last whole file (fewer than `every`)
            assert len(list(Path(tmp).glob(f"rank{k}-*.json"))) <= max(keep, every - 1)
        for router in routers:
            router.merge()
        for router in routers:
            assert all(evidence(router, keys[q]) for q in set().union(*seen)), (router.rank, router.status())


def test_while_its_whole_file_cannot_be_written_a_rank_keeps_every_change_file_written_after_it(tmp_path, monkeypatch):
    monkeypatch.setattr(la, "KEEP_CHANGES", 2)  # 2 kept
    rank = la.GroupRouter(10_000, group_size=2, batch=1, rank=0, share_dir=tmp_path, whole_every=2)
    real = rank.planner.save_state

    def group(n):
        for j in range(2):
            rank.route(f"{n}-{j}", f"prompt {n}", 5, 2)
        for j in range(2):
            rank.finished(f"{n}-{j}", 100 + 10 * n)

    group(0)  # step 1: its change file and whole file
    rank.planner.save_state = lambda *a, **k: (_ for _ in ()).throw(OSError("disk full"))
    for n in range(1, 7):  # steps 2-7: change files only
        group(n)
    # those its whole file holds go but the latest 2; none written after it (steps 2-7)
    assert sorted(int(x.stem.rsplit("-", 1)[1]) for x in tmp_path.glob("rank0-*.json")) == [2, 3, 4, 5, 6, 7]
    late = la.GroupRouter(10_000, group_size=2, batch=1, rank=1, share_dir=tmp_path)
    assert late.merge() == 7  # every prompt: the whole file of step 1, then the 6 change files after it
    restarted = la.GroupRouter(10_000, group_size=2, batch=1, rank=0, share_dir=tmp_path, whole_every=2)
    assert restarted.status()["replayed"] == 6 and restarted.planner.steps == 7
    rank.planner.save_state = real
    group(7)  # step 8: the whole file again, and the change files it holds go but the latest 2
    assert sorted(int(x.stem.rsplit("-", 1)[1]) for x in tmp_path.glob("rank0-*.json")) == [7, 8]


def test_a_whole_file_rewritten_within_the_clocks_resolution_is_read_again_when_the_changes_do_not_continue(
        tmp_path, monkeypatch):
    monkeypatch.setattr(la, "KEEP_CHANGES", 1)  # each rank keeps its latest change file, and its whole file with it
    writer = la.GroupRouter(10_000, group_size=2, batch=1, rank=0, share_dir=tmp_path, whole_every=1)
    reader = la.GroupRouter(10_000, group_size=2, batch=1, rank=1, share_dir=tmp_path)

    def group(n, key):
        for j in range(2):
            writer.route(f"{n}-{j}", key, 5, 2)
        for j in range(2):
            writer.finished(f"{n}-{j}", 100 + 50 * n)

    group(0, "first")
    assert reader.merge() == 1 and reader.status()["whole_reads"] == 1
    stamp = (tmp_path / "rank0.json").stat().st_mtime_ns
    for n, key in enumerate(["second", "third", "fourth"], start=1):
        group(n, key)
    os.utime(tmp_path / "rank0.json", ns=(stamp, stamp))  # as a clock too coarse to see the rewrites would leave it
    assert reader.merge() == 3 and reader.status()["whole_reads"] == 2  # the three prompts it lacked


def test_sharing_never_fails_a_request(tmp_path, caplog):
    # another rank's file that is not a planner's state is left out with a warning, the good ones are merged; a
    # rank whose own file cannot be written goes on (it learnt; the file is tried again)
    share = tmp_path / "share"
    other = la.GroupRouter(10_000, group_size=2, batch=1, rank=1, share_dir=share)
    other.route("a", "long prompt", 5, 2)
    other.route("b", "long prompt", 5, 2)
    other.finished("a", 900)
    other.finished("b", 1000)  # its step 1 starts: rank1.json written
    (share / "rank7.json").write_text("{not json")
    fake = FakeRemoteInfEngine(2, {PROMPTS[0]: 40})
    router = la.install(fake, pool_tokens=10_000, group_size=2, batch=1, rank=0, share_dir=share)

    def fail(*args, **kwargs):
        raise OSError("disk full")

    router.planner.save_state = fail
    with caplog.at_level(logging.WARNING, logger="lengthsched.integrations.areal"):
        answers = asyncio.run(group_episode(fake, PROMPTS[0], 2))
    assert len(answers) == 2 and router.planner.observed == 2  # the requests came back and were learnt
    assert "disk full" in caplog.text and caplog.text.count("left out another rank's file") == 1
    assert router.taken == 1  # rank 1's prompt, despite rank 7's file
    assert router.merge() == 0 and caplog.text.count("left out") == 1  # not read again until rewritten


def test_by_default_each_group_goes_whole_to_one_server_even_in_a_roomy_pool():
    fake = FakeRemoteInfEngine(4, lengths_for())
    router = la.install(fake, pool_tokens=10**9, group_size=8, concurrency=4)  # the estimate would spread them
    assert la.WAYS == 1

    async def go():
        await asyncio.gather(*[group_episode(fake, p, 8) for p in PROMPTS[:4]])

    asyncio.run(go())
    assert router.status()["ways"] == 1
    assert all(len(set(servers_of(fake, p))) == 1 for p in PROMPTS[:4])
    assert len({servers_of(fake, p)[0] for p in PROMPTS[:4]}) == 4  # four groups, four servers


def test_with_fewer_groups_in_flight_than_servers_each_group_takes_enough_servers_for_all():
    fake = FakeRemoteInfEngine(4, lengths_for())
    router = la.install(fake, pool_tokens=10**9, group_size=8, concurrency=2)  # 2 groups in flight, 4 servers
    asyncio.run(group_episode(fake, PROMPTS[0], 8))
    assert router.status()["ways"] == 2 and len(set(servers_of(fake, PROMPTS[0]))) == 2


def test_the_spread_is_the_placers_and_each_request_takes_one_place():
    fake = FakeRemoteInfEngine(4, lengths_for())
    router = la.install(fake, pool_tokens=10**9, group_size=8, concurrency=4, ways=None)  # roomy: groups spread

    asyncio.run(group_episode(fake, PROMPTS[0], 8))
    ways = router.status()["ways"]
    assert ways == 4 and len(set(servers_of(fake, PROMPTS[0]))) == 4
    assert sorted(servers_of(fake, PROMPTS[0])) == sorted(fake.addresses * 2)


def test_the_sglang_shell_is_unwrapped_and_installing_twice_keeps_one_wrapper():
    inner = FakeRemoteInfEngine(2, lengths_for())
    shell = FakeSGLangEngine(inner)
    la.install(shell, pool_tokens=10_000, group_size=2, ways=1)
    second = la.install(shell, pool_tokens=10_000, group_size=2, ways=1)
    asyncio.run(group_episode(shell, PROMPTS[0], 2))
    assert inner.lengthsched_router is second and second.routed == 2  # the second router, called once per request
    assert len(set(servers_of(inner, PROMPTS[0]))) == 1


def test_the_rid_cache_is_kept_as_areal_keeps_it():
    fake = FakeRemoteInfEngine(2, {PROMPTS[0]: 1})
    la.install(fake, pool_tokens=10_000, group_size=1, ways=1)

    async def go():
        for _ in range(la.RID_CACHE_SIZE + 10):
            await fake.agenerate(request(PROMPTS[0]))

    asyncio.run(go())
    assert len(fake.rid_queue) == la.RID_CACHE_SIZE == len(fake.rid_to_address)
    assert set(fake.rid_queue) == set(fake.rid_to_address)


def test_a_later_turn_goes_where_its_rid_went_and_stops_the_learning(caplog):
    fake = FakeRemoteInfEngine(3, {**lengths_for(), (9, 9, 9): 30})
    planner = RolloutPlanner(OnlineLengthPredictor(default_length=100))
    router = la.install(fake, pool_tokens=10_000, group_size=2, ways=1, planner=planner)

    async def session():
        rid = uuid.uuid4().hex
        first = fake.agenerate(request(PROMPTS[0], rid))
        other = fake.agenerate(request(PROMPTS[0]))
        await asyncio.gather(first, other)
        await fake.agenerate(request((9, 9, 9), rid))  # turn 2: the conversation, the same rid

    with caplog.at_level(logging.WARNING, logger="lengthsched.integrations.areal"):
        asyncio.run(session())
        asyncio.run(group_episode(fake, PROMPTS[1], 2))
    rid_turns = [addr for rid, addr, p in fake.sent if p in (PROMPTS[0], (9, 9, 9))]
    assert rid_turns[0] == rid_turns[1] == rid_turns[2]  # the whole group and the later turn on one server
    assert router.later_turns == 1 and router.multi_turn
    assert planner.observed == 2  # the first group only (back before the later turn); nothing after
    assert sum("multi-turn" in r.message for r in caplog.records) == 1


def test_a_later_turn_is_recognised_after_areal_forgot_its_rid():
    fake = FakeRemoteInfEngine(2, {PROMPTS[0]: 1, (9, 9): 1})
    router = la.install(fake, pool_tokens=10_000, group_size=1, ways=1)
    rid = uuid.uuid4().hex

    async def go():
        await fake.agenerate(request(PROMPTS[0], rid))
        for _ in range(la.RID_CACHE_SIZE):
            await fake.agenerate(request(PROMPTS[0]))
        assert rid not in fake.rid_to_address
        await fake.agenerate(request((9, 9), rid))

    asyncio.run(go())
    assert router.later_turns == 1 and router.groups == la.RID_CACHE_SIZE + 1  # no group placed for the turn


def test_a_failed_request_releases_its_load_raises_and_its_group_is_not_learned():
    fake = FakeRemoteInfEngine(2, lengths_for())
    fake.fail.add(PROMPTS[0])
    planner = RolloutPlanner(OnlineLengthPredictor(default_length=100))
    router = la.install(fake, pool_tokens=10_000, group_size=2, ways=1, planner=planner)
    with pytest.raises(RuntimeError, match="server error"):
        asyncio.run(group_episode(fake, PROMPTS[0], 2))
    asyncio.run(asyncio.sleep(0.01))  # the sibling finishes (gather does not cancel it)
    assert router.loads == [0.0, 0.0] and router.status()["in_flight"] == 0
    assert planner.observed == 0 and router.groups_back == 1


def test_servers_that_change_start_the_counts_again():
    router = la.GroupRouter(10_000, group_size=2, ways=1)
    r = router.route("a", "p", 5, 3)
    assert len(router.loads) == 3 and router.loads[r] > 0
    router.route("b", "q", 5, 2)  # a server left: the counts start again
    assert len(router.loads) == 2
    router.finished("a", 10)  # routed before the change: let go without touching the new counts' servers wrongly
    assert all(x >= 0 for x in router.loads)


def test_concurrency_and_batch_come_from_the_engine_config():
    """The spread is estimated from every rank's groups in flight (their prompts share the servers' pools: with
    this rank's share alone the model's 4-rank rows gained half as much); the batch is this rank's share."""
    fake = FakeRemoteInfEngine(2, lengths_for(), consumer_batch_size=64, max_concurrent_rollouts=128)
    router = la.install(fake, pool_tokens=10_000, group_size=2, data_parallel_size=4)
    assert router.placer.concurrency == 128 and router.batch == 16
    fake = FakeRemoteInfEngine(2, lengths_for(), consumer_batch_size=64)
    router = la.install(fake, pool_tokens=10_000, group_size=2)
    assert router.placer.concurrency == 64 and router.batch == 64  # AReaL: max_concurrent_rollouts or the batch


def test_at_areals_default_bound_of_0_the_requests_go_to_the_servers_in_turn_as_areal_sends_them(caplog):
    """ways AUTO: at max_head_offpolicyness 0 every group over every server in turn (AReaL's own order: placing
    groups lost there in the model), whole groups at 1 or more and where the config does not say."""
    def servers_used(bound, routed=True, **kw):
        fake = FakeRemoteInfEngine(3, lengths_for(), max_head_offpolicyness=bound)
        router = la.install(fake, pool_tokens=10**9, group_size=4, **kw) if routed else None

        async def go():
            for p in PROMPTS[:4]:
                await group_episode(fake, p, 4)
        asyncio.run(go())
        return router, [addr for _, addr, _ in fake.sent]

    with caplog.at_level(logging.INFO, logger="lengthsched.integrations.areal"):
        router, sent = servers_used(0)
    assert router.ways == la.EVERY_SERVER and "max_head_offpolicyness is 0" in caplog.text
    _, areal = servers_used(0, routed=False)  # AReaL alone: its round robin
    assert sent == areal
    for bound in (2, None):
        router, sent = servers_used(bound)
        assert router.ways == la.WAYS == 1 and all(len(set(sent[i:i + 4])) == 1 for i in range(0, 16, 4))
    router, _ = servers_used(0, ways=2)  # an explicit spread wins over the config
    assert router.ways == 2
    with pytest.raises(InvalidArgument) as err:
        servers_used(0, ways="whole")
    assert err.value.name == "ways"


def test_the_prompt_key_is_made_once_per_prompt():
    fake = FakeRemoteInfEngine(2, lengths_for())
    asked = []

    def key(req):
        asked.append(tuple(req.input_ids))
        return la.prompt_text(req)

    la.install(fake, pool_tokens=10_000, group_size=4, ways=1, key=key)
    asyncio.run(group_episode(fake, PROMPTS[0], 4))
    asyncio.run(group_episode(fake, PROMPTS[0], 4))  # the next epoch of the same prompt
    assert asked == [PROMPTS[0]]


def test_prompt_text_decodes_with_the_requests_tokenizer_else_joins_the_ids():
    tok = SimpleNamespace(decode=lambda ids: "text:" + "-".join(map(str, ids)))
    assert la.prompt_text(SimpleNamespace(input_ids=[1, 2], tokenizer=tok)) == "text:1-2"
    assert la.prompt_text(SimpleNamespace(input_ids=[1, 2], tokenizer=None)) == "1,2"


@pytest.mark.parametrize("kwargs, name", [
    ({"group_size": 0}, "group_size"), ({"pool_tokens": 0}, "pool_tokens"), ({"ways": 0}, "ways"),
    ({"planner": object()}, "planner"), ({"data_parallel_size": 0}, "data_parallel_size"), ({"key": 3}, "key"),
    ({"prefill_share": -1.0}, "prefill_share"), ({"batch": 0}, "batch"), ({"rank": -1}, "rank"),
    ({"share_dir": ""}, "share_dir"), ({"whole_every": 0}, "whole_every"),
])
def test_bad_settings_name_the_argument(kwargs, name):
    args = {"pool_tokens": 10_000, "group_size": 2, **kwargs}
    with pytest.raises(InvalidArgument) as err:
        la.install(FakeRemoteInfEngine(2, {}), **args)
    assert err.value.name == name


def test_an_engine_that_is_not_areals_is_refused():
    with pytest.raises(InvalidArgument) as err:
        la.install(SimpleNamespace(agenerate=None), pool_tokens=10_000, group_size=2)
    assert err.value.name == "engine" and "rid_to_address" in str(err.value)


def test_a_rid_routed_twice_before_it_is_back_is_refused():
    router = la.GroupRouter(10_000, group_size=2, ways=1)
    router.route("a", "p", 5, 2)
    with pytest.raises(InvalidArgument) as err:
        router.route("a", "p", 5, 2)
    assert err.value.name == "rid"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6)), min_size=1, max_size=12),
       st.integers(1, 4), st.integers(1, 5))
def test_every_request_gets_one_server_and_the_loads_are_the_predictions_in_flight(groups, servers, size):
    """Groups of ``size`` requests of prompts 0-5 come one after another; routing all, then finishing them in a
    shuffled order: each request's server is a valid index, each group takes exactly its places, and at every
    point the loads are the sum of the predictions of the requests routed and not back."""
    router = la.GroupRouter(10_000, group_size=size)
    rng = np.random.default_rng(len(groups) * 7 + servers)
    routed = []
    for g, (prompt, _) in enumerate(groups):
        for k in range(size):
            rid = f"{g}-{k}"
            r = router.route(rid, f"p{prompt}", 10, servers)
            assert 0 <= r < servers
            routed.append(rid)
    assert router.groups == len(groups)  # one group per prompt's turn: each group's requests take its places
    expected = sum(router.loads)
    for i in rng.permutation(len(routed)):
        group, place, _ = router._of[routed[i]]
        expected -= float(group.predicted[place])
        router.finished(routed[i], int(groups[int(routed[i].split("-")[0])][1]))
        assert sum(router.loads) == pytest.approx(expected, abs=1e-6)
    assert router.loads == pytest.approx([0.0] * servers, abs=1e-6) and router.groups_back == len(groups)


# ----------------------------------------------------------------------------- AReaL's real classes
def real_engine(real_rie, monkeypatch, config, backend, lengths, calls=None):
    """AReaL's real RemoteInfEngine on 3 servers, its HTTP call to them a fake SGLang server answering each prompt
    with ``lengths[prompt]`` tokens (``calls`` gets (server, prompt) per request), never paused."""

    async def fake_http(session, addr, endpoint, payload, method, max_retries, timeout):  # an SGLang server
        prompt = tuple(payload["input_ids"])
        if calls is not None:
            calls.append((addr, prompt))
        n = lengths[prompt]
        await asyncio.sleep(n / 10000)
        return {"meta_info": {"finish_reason": {"type": "stop"}, "output_token_logprobs": [[0.0, 7, None]] * n}}

    async def no_session():
        return None

    monkeypatch.setattr(real_rie, "arequest_with_retry", fake_http)
    monkeypatch.setattr(real_rie.workflow_context, "get_aiohttp_session", no_session)
    engine = real_rie.RemoteInfEngine(config, backend)
    engine.addresses = [f"10.0.0.{i}:3000" for i in range(3)]
    engine.workflow_executor = SimpleNamespace(is_paused=lambda: False)
    return engine


@requires_areal
def test_inside_areals_real_engine_and_grouped_workflow(monkeypatch):
    import torch

    real_rie = real_areal()
    policy = asyncio.get_event_loop_policy()
    try:
        from areal.api import ModelRequest, RolloutWorkflow
        from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig
        from areal.engine.sglang_remote import SGLangBackend
    finally:
        asyncio.set_event_loop_policy(policy)
    assert "uvloop" not in type(asyncio.get_event_loop_policy()).__module__  # the tests' own loop, as before

    calls = []
    config = InferenceEngineConfig(experiment_name="t", trial_name="t", consumer_batch_size=6)
    engine = real_engine(real_rie, monkeypatch, config, SGLangBackend(), lengths_for(), calls)
    planner = RolloutPlanner(OnlineLengthPredictor(default_length=100))
    auto = la.install(engine, pool_tokens=10_000, group_size=4)  # AReaL's default bound, 0: its own spread
    assert config.max_head_offpolicyness == 0 and auto.ways == la.EVERY_SERVER
    router = la.install(engine, pool_tokens=10_000, group_size=4, ways=1, planner=planner)  # replaces it

    class OneSample(RolloutWorkflow):
        async def arun_episode(self, engine, data):
            req = ModelRequest(rid=uuid.uuid4().hex, input_ids=list(data["ids"]),
                               gconfig=GenerationHyperparameters(max_new_tokens=1000, n_samples=1))
            resp = await engine.agenerate(req)
            return {"input_ids": torch.ones(1, len(resp.output_tokens), dtype=torch.int32)}

    grouped = real_rie.GroupedRolloutWorkflow(OneSample(), 4, logging.getLogger("t"))

    async def go():
        return await asyncio.gather(*[grouped.arun_episode(engine, {"ids": p}) for p in PROMPTS[:6]])

    outs = asyncio.run(go())
    assert [int(o["input_ids"].shape[0]) for o in outs] == [4] * 6  # AReaL's workflow got every sample back
    for p in PROMPTS[:6]:
        assert len({addr for addr, q in calls if q == p}) == 1  # whole groups, inside AReaL's own agenerate
    assert router.groups_back == 6 and planner.observed == 24 and router.loads == [0.0, 0.0, 0.0]
    assert len(engine.rid_queue) == 24 and set(engine.rid_to_address.values()) <= set(engine.addresses)
