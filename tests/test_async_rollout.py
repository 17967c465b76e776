"""simulate.run_async_rollout: AReaL's asynchronous loop (generation goes on while the learner trains)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthsched import InvalidArgument
from simulate import ASYNC_ROUTERS, run_async_rollout, run_rollout, run_verl_async
from simulate.asynchronous import PREDICTED_ROUTERS, run_sync_steps
from simulate.workloads import Group

COMMON = dict(budget_tokens=2048, max_new_tokens=512)


def _stream(n, size=4, seed=0, low=5, high=400):
    rng = np.random.default_rng(seed)
    return [Group(f"p{i}", int(rng.integers(8, 60)), rng.integers(low, high, size=size)) for i in range(n)]


@pytest.mark.parametrize("policy", ["vllm", "sglang"])
def test_staleness_zero_is_synchronous_rl(policy):
    """max_staleness 0: each step generates its batch alone, then trains and updates: the step's
    rollout, exactly as run_rollout simulates it (each request to the next replica), plus the learner."""
    stream = _stream(12, seed=4)
    out = run_async_rollout(stream, batch=4, steps=3, max_staleness=0, train_seconds=0.7, update_seconds=0.2,
                            policy=policy, replicas=2, **COMMON)
    alone = [run_rollout(stream[4 * k:4 * k + 4], policy, router="least_loaded", replicas=2, **COMMON).seconds
             for k in range(3)]
    assert out.seconds == pytest.approx(sum(alone) + 3 * 0.9)
    assert [sorted(s.groups) for s in out.steps] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert out.mean_lag == out.stale_share == 0.0 and out.interrupted == 0 and out.trained_length_ratio == 1.0
    for step in out.steps:
        assert step.train_start == pytest.approx(step.ready_seconds)  # the learner waited for the batch
        assert step.train_end - step.train_start == pytest.approx(0.7)
        assert step.update_end - step.train_end == pytest.approx(0.2)
        assert step.tokens == sum(int(stream[g].lengths.sum()) for g in step.groups)
    assert out.learner_idle_share == pytest.approx(1 - 2.1 / out.seconds)
    sync = run_sync_steps(stream, policy, router="least_loaded", batch=4, steps=3, train_seconds=0.7,
                          update_seconds=0.2, replicas=2, **COMMON)  # the same loop, step by step
    assert [r.seconds for r in sync.rollouts] == alone and sync.seconds == pytest.approx(out.seconds)
    assert sync.tokens == out.consumed_tokens and sync.learner_idle_share == pytest.approx(out.learner_idle_share)
    with pytest.raises(InvalidArgument, match="groups"):
        run_sync_steps(stream, policy, batch=4, steps=4, train_seconds=0.7, replicas=2, **COMMON)
    # every replica idles while the learner trains and the weights go out (nothing to run then), no more
    # than the whole run
    assert 2 * 3 * 0.9 - 1e-9 <= out.idle_seconds <= 2 * out.seconds
    # of it, the replicas sat idle while the other ran exactly as long as each rollout's tail
    tails = sum(r.seconds - s for r in sync.rollouts for s in r.replica_seconds)
    assert out.uneven_seconds == pytest.approx(tails) and 0 < tails < out.idle_seconds - 2 * 3 * 0.9 + 1e-9
    assert out.uneven_share == pytest.approx(sync.uneven_share) == pytest.approx(tails / (2 * out.seconds))


def test_asynchronous_generation_overlaps_training_and_its_tokens_lag():
    stream = _stream(40, seed=5)
    kw = dict(batch=4, steps=6, train_seconds=0.5, update_seconds=0.1, replicas=2, **COMMON)
    sync = run_async_rollout(stream, max_staleness=0, **kw)
    lagged = run_async_rollout(stream, max_staleness=2, **kw)
    assert lagged.seconds < sync.seconds  # the engines no longer wait for the learner
    assert lagged.interrupted > 0 and lagged.recomputed_tokens > 0  # updates abort requests in flight
    assert 0 < lagged.stale_share < 1 and lagged.mean_lag > 0
    for step in lagged.steps:
        assert sum(step.lag_tokens) == step.tokens == sum(int(stream[g].lengths.sum()) for g in step.groups)
        assert step.train_start >= step.ready_seconds - 1e-12
    starts = [s.train_start for s in lagged.steps]
    ends = [s.update_end for s in lagged.steps]
    assert all(b >= a for a, b in zip(ends, starts[1:]))  # one step after another on the learner
    consumed = [g for s in lagged.steps for g in s.groups]
    assert len(consumed) == len(set(consumed)) == 24
    assert lagged.tokens_per_second == pytest.approx(lagged.consumed_tokens / lagged.seconds)
    drawn = sum(int(g.lengths.sum()) for g in stream[:24])
    assert lagged.drawn_tokens == drawn and lagged.trained_length_ratio == pytest.approx(lagged.consumed_tokens / drawn)


@settings(deadline=None)
@given(eta=st.integers(0, 3), batch=st.integers(1, 4), concurrent=st.sampled_from([None, 1, 3, 8]),
       router=st.sampled_from(ASYNC_ROUTERS), policy=st.sampled_from(["vllm", "sglang"]),
       train=st.sampled_from([0.0, 0.2, 2.0]), seed=st.integers(0, 50))
def test_submissions_respect_the_staleness_and_concurrency_bounds(eta, batch, concurrent, router, policy, train, seed):
    """At every submission, (max_staleness + version + 1) x batch bounds the groups submitted so far and
    max_concurrent the groups in flight (AReaL's StalenessManager.get_capacity)."""
    steps = 3
    stream = _stream((steps + eta) * batch + 2, seed=seed, high=300)
    predicted = np.concatenate([g.lengths for g in stream]) if router in PREDICTED_ROUTERS else None
    out = run_async_rollout(stream, batch=batch, steps=steps, max_staleness=eta, train_seconds=train,
                            update_seconds=0.05, max_concurrent=concurrent, router=router, predicted=predicted,
                            policy=policy, replicas=2, **COMMON)
    cap = batch if concurrent is None else concurrent
    submitted = np.asarray(out.group_submitted)
    assert len(submitted) == (steps + eta) * batch
    finished = np.asarray(out.group_finished)
    sent = submitted[~np.isnan(submitted)]
    assert np.isnan(submitted[len(sent):]).all() and (np.diff(sent) >= 0).all()  # in stream order
    updates = [s.update_end for s in out.steps]
    for at in sent:
        version = sum(1 for u in updates if u <= at + 1e-12)
        assert np.sum(submitted <= at + 1e-12) <= (eta + version + 1) * batch
        in_flight = np.sum((submitted <= at + 1e-12) & ~(finished <= at + 1e-12))
        assert in_flight <= cap
    for s in out.steps:
        assert all(finished[g] <= s.ready_seconds + 1e-12 for g in s.groups)
        assert max(finished[g] for g in s.groups) == pytest.approx(s.ready_seconds)
    for a, b in zip(out.steps, out.steps[1:]):  # the learner takes the groups in the order they finished
        assert max(finished[g] for g in a.groups) <= min(finished[g] for g in b.groups) + 1e-12
    for s in out.steps:
        assert sum(s.lag_tokens) == s.tokens
    assert out.consumed_tokens == sum(int(stream[g].lengths.sum()) for s in out.steps for g in s.groups)


def test_least_work_routes_by_predicted_tokens():
    stream = _stream(20, seed=7)
    predicted = np.concatenate([g.lengths for g in stream])
    kw = dict(batch=4, steps=3, max_staleness=1, train_seconds=0.3, replicas=3, **COMMON)
    out = run_async_rollout(stream, router="least_work", predicted=predicted, **kw)
    assert len(out.steps) == 3 and out.router == "least_work"


def test_bad_arguments_name_themselves():
    stream = _stream(8)
    kw = dict(batch=2, steps=2, max_staleness=1, train_seconds=0.1, **COMMON)
    with pytest.raises(InvalidArgument, match="groups"):
        run_async_rollout(stream[:5], **kw)  # (2 + 1) x 2 = 6 needed
    with pytest.raises(InvalidArgument, match="max_staleness"):
        run_async_rollout(stream, **{**kw, "max_staleness": -1})
    with pytest.raises(InvalidArgument, match="train_seconds"):
        run_async_rollout(stream, **{**kw, "train_seconds": -1.0})
    with pytest.raises(InvalidArgument, match="update_seconds"):
        run_async_rollout(stream, update_seconds=float("nan"), **kw)
    with pytest.raises(InvalidArgument, match="policy"):
        run_async_rollout(stream, policy="steal", **kw)
    with pytest.raises(InvalidArgument, match="router"):
        run_async_rollout(stream, router="group_round_robin", **kw)
    with pytest.raises(InvalidArgument, match="predicted"):
        run_async_rollout(stream, router="least_work", **kw)
    with pytest.raises(InvalidArgument, match="predicted"):
        run_async_rollout(stream, predicted=np.ones(32), **kw)
    with pytest.raises(InvalidArgument, match="predicted"):
        run_async_rollout(stream, router="least_work", predicted=np.ones(3), **kw)
    with pytest.raises(InvalidArgument, match="max_concurrent"):
        run_async_rollout(stream, max_concurrent=0, **kw)
    with pytest.raises(InvalidArgument, match="batch"):
        run_async_rollout(stream, **{**kw, "batch": 0})


# --- verl's fully asynchronous recipe (simulate.run_verl_async) ---


@pytest.mark.parametrize("policy", ["vllm", "sglang"])
@pytest.mark.parametrize("partial", [True, False])
def test_verl_without_staleness_or_streaming_is_synchronous_rl(policy, partial):
    """staleness_threshold 0, one local update per version, every group of a batch in flight at once: each
    version's rollout alone (each request to the server with the fewest in flight), then the learner."""
    stream = _stream(12, seed=4)
    out = run_verl_async(stream, batch=4, steps=3, staleness_threshold=0.0, local_steps=1, max_concurrent=4,
                         partial_rollout=partial, train_seconds=0.7, update_seconds=0.2, policy=policy, replicas=2,
                         version="0.9.1" if partial else "b178a3c", **COMMON)
    sync = run_sync_steps(stream, policy, router="least_loaded", batch=4, steps=3, train_seconds=0.7,
                          update_seconds=0.2, replicas=2, **COMMON)
    assert out.seconds == pytest.approx(sync.seconds)
    assert [sorted(s.groups) for s in out.steps] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert out.stale_share == 0.0 and out.interrupted == 0
    assert out.design == ("verl" if partial else "verl b178a3c")
    assert out.local_steps == 1 and out.partial_rollout is partial and out.max_staleness == 0.0


@pytest.mark.parametrize("policy", ["vllm", "sglang"])
def test_verl_streams_local_updates_without_staleness(policy):
    """With a threshold of 0 every version's groups come from its own weights; training each slice as it
    arrives overlaps the rollout's tail, so the run is never slower than one update per version."""
    stream = _stream(24, seed=9)
    kw = dict(batch=8, steps=3, staleness_threshold=0.0, train_seconds=1.5, update_seconds=0.1, policy=policy,
              replicas=2, max_concurrent=8, **COMMON)
    whole = run_verl_async(stream, local_steps=1, **kw)
    for k in (2, 4, 8):
        streamed = run_verl_async(stream, local_steps=k, **kw)
        assert streamed.seconds <= whole.seconds + 1e-9
        assert streamed.stale_share == 0.0 and streamed.interrupted == 0
        assert [sorted(s.groups) for s in streamed.steps] == [sorted(s.groups) for s in whole.steps]
        for s in streamed.steps:
            assert s.trained_seconds == pytest.approx(1.5)  # k updates of 1.5 / k seconds
            assert s.train_end - s.train_start >= s.trained_seconds - 1e-9
    assert run_verl_async(stream, local_steps=4, **kw).seconds < whole.seconds  # here it gains


@settings(deadline=None)
@given(threshold=st.sampled_from([0.0, 0.1, 0.5, 1.0, 2.0]), batch=st.sampled_from([2, 4]),
       local=st.sampled_from([1, 2]), mode=st.sampled_from(["0.9.1", "b178a3c", "b178a3c drain"]),
       concurrent=st.sampled_from([None, 1, 3]), policy=st.sampled_from(["vllm", "sglang"]),
       train=st.sampled_from([0.0, 0.2, 2.0]), seed=st.integers(0, 50))
def test_verl_submissions_respect_its_count_and_concurrency(threshold, batch, local, mode, concurrent, policy,
                                                             train, seed):
    """At every start, the groups started since the last update plus those carried over (in flight or
    finished and not trained on) stay within (1 + threshold) x batch (verl's staleness_samples against
    max_required_samples; a group started during an update counts towards the next version), the groups in
    flight within max_concurrent; at b178a3c nothing starts while an update is under way, and without
    partial rollout nothing is interrupted."""
    version, _, drain = mode.partition(" ")
    partial = not drain
    steps = 3
    bound = int(batch * (1 + threshold))
    stream = _stream(steps * batch + bound + 1, seed=seed, high=300)
    out = run_verl_async(stream, batch=batch, steps=steps, staleness_threshold=threshold, local_steps=local,
                         partial_rollout=partial, max_concurrent=concurrent, train_seconds=train, update_seconds=0.05,
                         policy=policy, replicas=2, version=version, **COMMON)
    cap = min(16 * 2, bound) if concurrent is None else concurrent
    assert out.max_concurrent == cap
    submitted, finished = np.asarray(out.group_submitted), np.asarray(out.group_finished)
    sent = submitted[~np.isnan(submitted)]
    assert np.isnan(submitted[len(sent):]).all() and (np.diff(sent) >= 0).all()
    updates = [s.update_end for s in out.steps]
    for at in sent:
        v = sum(1 for u in updates if u <= at)
        since = updates[v - 1] if v else -1.0
        consumed = {g for s in out.steps[:v] for g in s.groups}
        carried = sum(1 for g in range(len(submitted)) if submitted[g] < since and g not in consumed)
        started = np.sum((submitted >= since) & (submitted <= at))
        assert carried + started <= bound
        assert np.sum((submitted <= at) & ~(finished <= at)) <= cap
        if version == "b178a3c":
            for s in out.steps:  # not between the last local update's end and the new weights
                assert not (s.train_end < at < s.update_end)
    if not partial:
        assert out.interrupted == 0
    for a, b in zip(out.steps, out.steps[1:]):  # the learner takes the groups in the order they finished
        assert max(finished[g] for g in a.groups) <= min(finished[g] for g in b.groups) + 1e-12
    for s in out.steps:
        assert len(s.groups) == batch and sum(s.lag_tokens) == s.tokens
        assert s.trained_seconds == pytest.approx(train)
    if threshold == 0.0:
        assert out.stale_share == 0.0


def test_verl_staleness_overlaps_generation_and_partial_rollout_interrupts():
    stream = _stream(60, seed=5)
    kw = dict(batch=8, steps=5, local_steps=2, train_seconds=1.0, update_seconds=0.1, replicas=2, **COMMON)
    fresh = run_verl_async(stream, staleness_threshold=0.0, **kw)
    stale = run_verl_async(stream, staleness_threshold=1.0, **kw)
    drained = run_verl_async(stream, staleness_threshold=1.0, partial_rollout=False, version="b178a3c", **kw)
    assert stale.seconds < fresh.seconds and 0 < stale.stale_share < 1
    assert stale.interrupted > 0 and drained.interrupted == 0
    assert drained.stale_share > 0


def test_verl_bad_arguments_name_themselves():
    stream = _stream(12)
    kw = dict(batch=4, steps=2, staleness_threshold=0.5, train_seconds=0.1, **COMMON)
    with pytest.raises(InvalidArgument, match="groups"):
        run_verl_async(stream[:9], **kw)  # (2 - 1) x 4 + 6 = 10 needed
    with pytest.raises(InvalidArgument, match="staleness_threshold"):
        run_verl_async(stream, **{**kw, "staleness_threshold": -0.1})
    with pytest.raises(InvalidArgument, match="local_steps"):
        run_verl_async(stream, local_steps=3, **kw)
    with pytest.raises(InvalidArgument, match="partial_rollout"):
        run_verl_async(stream, partial_rollout="yes", **kw)
    with pytest.raises(InvalidArgument, match="partial_rollout"):
        run_verl_async(stream, partial_rollout=False, **kw)  # 0.9.1 truncates instead: not modelled
    with pytest.raises(InvalidArgument, match="version"):
        run_verl_async(stream, version="0.8", **kw)
    with pytest.raises(InvalidArgument, match="policy"):
        run_verl_async(stream, policy="steal", **kw)
    with pytest.raises(InvalidArgument, match="max_concurrent"):
        run_verl_async(stream, max_concurrent=0, **kw)


@pytest.mark.parametrize("policy", ["vllm", "sglang"])
def test_streamed_synchronous_steps_are_verl_at_threshold_zero(policy):
    """run_sync_steps(local_steps=L): each local update as soon as its slice of the batch finished, as verl's
    recipe at a threshold of 0 trains (every group of a batch in flight at once: the same rollouts); never
    slower than one update after the rollout, the same with a learner that takes no time."""
    stream = _stream(24, seed=9)
    kw = dict(batch=8, steps=3, train_seconds=1.5, update_seconds=0.1, replicas=2, **COMMON)
    streamed = run_sync_steps(stream, policy, router="least_loaded", local_steps=4, **kw)
    verl = run_verl_async(stream, staleness_threshold=0.0, local_steps=4, max_concurrent=8, policy=policy, **kw)
    assert streamed.seconds == pytest.approx(verl.seconds)
    assert streamed.uneven_share == pytest.approx(verl.uneven_share) and verl.uneven_share > 0
    whole = run_sync_steps(stream, policy, router="least_loaded", **kw)
    assert streamed.seconds <= whole.seconds + 1e-9 and streamed.tokens == whole.tokens
    assert streamed.learner_idle_share == pytest.approx(1 - 3 * 1.5 / streamed.seconds)
    for at, r in zip(streamed.trained_at, streamed.rollouts):
        assert r.seconds + 1.5 / 4 - 1e-9 <= at <= r.seconds + 1.5 + 1e-9
    free = {**kw, "train_seconds": 0.0}
    assert run_sync_steps(stream, policy, router="least_loaded", local_steps=4, **free).seconds == pytest.approx(
        run_sync_steps(stream, policy, router="least_loaded", **free).seconds)
    with pytest.raises(InvalidArgument, match="local_steps"):
        run_sync_steps(stream, policy, local_steps=3, **kw)


def test_verl_routes_the_aborted_requests_again_when_they_resume(monkeypatch):
    """verl at b178a3c sends an aborted request again under a new request id: the router places it afresh
    (round robin, its server manager), ahead of new groups; verl 0.9.1 (a sticky request id) and AReaL's loop
    keep it on its engine."""
    import simulate.asynchronous as module

    moves = []
    real = module.hand_over

    def spy(job, src, dst, **kw):
        moves.append((job, src, dst))
        return real(job, src, dst, **kw)

    monkeypatch.setattr(module, "hand_over", spy)
    stream = _stream(40, seed=5)
    kw = dict(batch=8, steps=4, train_seconds=0.2, update_seconds=0.1, replicas=3, **COMMON)
    out = run_verl_async(stream, staleness_threshold=1.0, local_steps=2, version="b178a3c", **kw)
    assert out.interrupted > 0 and moves
    assert any(src is not dst for _, src, dst in moves)  # some land on another engine
    for s in out.steps:
        assert sum(s.lag_tokens) == s.tokens == sum(int(stream[g].lengths.sum()) for g in s.groups)
    moves.clear()
    run_async_rollout(stream, max_staleness=1, **kw)
    current = run_verl_async(stream, staleness_threshold=1.0, local_steps=2, **kw)
    assert current.interrupted > 0 and not moves


def test_the_uneven_idle_counts_a_replica_idle_while_another_runs():
    """simulate.asynchronous._uneven: replica-seconds of idle intervals when not every replica is idle."""
    from simulate.asynchronous import _uneven

    assert _uneven([], 2) == 0.0
    assert _uneven([(0.0, 1.0)], 2) == pytest.approx(1.0)  # the other ran throughout
    assert _uneven([(0.0, 1.0), (0.0, 1.0)], 2) == pytest.approx(0.0)  # both idle: an update, say
    assert _uneven([(0.0, 2.0), (1.0, 3.0)], 2) == pytest.approx(2.0)  # [0, 1) and [2, 3) alone
    assert _uneven([(0.0, 2.0), (1.0, 3.0)], 3) == pytest.approx(4.0)  # a third replica ran throughout
    assert _uneven([(0.0, 1.0), (1.0, 2.0), (2.0, 2.0)], 1) == pytest.approx(0.0)  # one replica: never uneven


@settings(max_examples=20, deadline=None)
@given(threshold=st.sampled_from([0.0, 0.25, 1.0]), replicas=st.integers(1, 3), seed=st.integers(0, 30))
def test_the_uneven_idle_is_part_of_the_idle_and_none_on_one_replica(threshold, replicas, seed):
    stream = _stream(40, seed=seed)
    r = run_verl_async(stream, batch=4, steps=4, staleness_threshold=threshold, local_steps=2, train_seconds=0.3,
                       update_seconds=0.1, replicas=replicas, **COMMON)
    assert -1e-9 <= r.uneven_seconds <= r.idle_seconds + 1e-9
    assert 0.0 <= r.uneven_share <= 1.0
    if replicas == 1:
        assert r.uneven_seconds == pytest.approx(0.0, abs=1e-9)


def _predicted(stream, seed=0, sigma=0.5):
    """Prompt-level predictions: each group's median times a log-normal error, the same for its siblings."""
    rng = np.random.default_rng(seed)
    return np.concatenate([np.full(len(g.lengths), max(1, round(float(np.median(g.lengths)) * rng.lognormal(0, sigma))))
                           for g in stream])


@pytest.mark.parametrize("policy", ["vllm", "sglang"])
@pytest.mark.parametrize("threshold", [0.0, 0.5])
def test_stealing_on_one_replica_is_the_engine_alone(policy, threshold):
    """One replica has nobody to steal from and nowhere to move a request: steal=True is the engine's own
    loop, second for second (steal_sglang is SGLang's FCFS there, steal vLLM's)."""
    stream = _stream(30, seed=3)
    kw = dict(batch=4, steps=4, staleness_threshold=threshold, local_steps=2, train_seconds=0.4,
              update_seconds=0.1, policy=policy, replicas=1, **COMMON)
    plain = run_verl_async(stream, **kw)
    stolen = run_verl_async(stream, steal=True, predicted=_predicted(stream), **kw)
    assert stolen.seconds == pytest.approx(plain.seconds) and stolen.consumed_tokens == plain.consumed_tokens
    assert stolen.policy == ("steal" if policy == "vllm" else "steal_sglang") and plain.policy == policy
    if policy == "vllm":  # decided from snapshots (a driver's polls): nothing to decide on one replica either
        observed = run_verl_async(stream, steal=True, predicted=_predicted(stream), snapshot_seconds=0.25, **kw)
        assert observed.seconds == pytest.approx(plain.seconds) and observed.policy == "steal_observed"
    areal = dict(batch=4, steps=3, max_staleness=int(threshold > 0), train_seconds=0.4, policy=policy, **COMMON)
    assert run_async_rollout(stream, steal=True, predicted=_predicted(stream), replicas=1, **areal).seconds == \
        pytest.approx(run_async_rollout(stream, replicas=1, **areal).seconds)
    two = run_async_rollout(stream, steal=True, predicted=_predicted(stream), replicas=2, router="placed", **areal)
    for s in two.steps:  # AReaL's loop steals too; every token of a trained group counted once
        assert sum(s.lag_tokens) == s.tokens == sum(int(stream[g].lengths.sum()) for g in s.groups)


@settings(max_examples=30, deadline=None)
@given(threshold=st.sampled_from([0.0, 0.1, 1.0]),
       router=st.sampled_from(["least_loaded", "placed", "stream", "round_robin"]),
       policy=st.sampled_from(["vllm", "sglang"]), resubmit=st.sampled_from([0.0, 0.05, 0.5]),
       version=st.sampled_from(["0.9.1", "b178a3c"]), seed=st.integers(0, 40),
       snapshot=st.sampled_from([None, None, 0.25, 1.0]))
def test_stealing_keeps_the_recipes_bounds_and_every_token(threshold, router, policy, resubmit, version, seed,
                                                           snapshot):
    """With stealing on top of any router the recipe's count and concurrency bounds hold, every trained group
    finished before its step, every token is trained once with its lag counted, and the router's count of
    requests in flight never goes wrong (a LiveRouter raises on a finish it did not count)."""
    batch, steps = 4, 3
    bound = int(batch * (1 + threshold))
    stream = _stream(steps * batch + bound + 1, seed=seed, high=400)
    out = run_verl_async(stream, batch=batch, steps=steps, staleness_threshold=threshold, local_steps=2,
                         train_seconds=0.3, update_seconds=0.05, policy=policy, replicas=3, router=router,
                         version=version, steal=True, resubmit_seconds=resubmit, predicted=_predicted(stream, seed),
                         budget_tokens=1024, max_new_tokens=512,
                         snapshot_seconds=snapshot if policy == "vllm" else None)
    submitted, finished = np.asarray(out.group_submitted), np.asarray(out.group_finished)
    updates = [s.update_end for s in out.steps]
    for at in submitted[~np.isnan(submitted)]:
        assert np.sum((submitted <= at) & ~(finished <= at)) <= out.max_concurrent
    trained = [g for s in out.steps for g in s.groups]
    assert len(trained) == len(set(trained)) == steps * batch
    for s, end in zip(out.steps, updates):
        assert all(finished[g] <= s.ready_seconds + 1e-12 for g in s.groups)
        assert sum(s.lag_tokens) == s.tokens == sum(int(stream[g].lengths.sum()) for g in s.groups)
        assert s.update_end == end
    if threshold == 0.0:
        assert out.stale_share == 0.0
    assert out.consumed_tokens == sum(int(stream[g].lengths.sum()) for g in trained)


def test_stealing_moves_work_off_a_crowded_replica(monkeypatch):
    """Whole groups placed by their predictions leave one replica with the groups predicted short that run
    long: stealing takes its waiting requests and moves its running ones to the replicas that drained, so the
    same stream finishes sooner, every request it sent elsewhere leaving a replica for another."""
    from lengthsched.runtime.dispatch import WorkStealing

    rng = np.random.default_rng(2)
    stream = [Group(f"p{i}", 400, rng.integers(300, 500, size=8)) for i in range(24)]
    predicted = np.concatenate([np.full(8, 100 if i % 3 == 0 else 400) for i in range(24)])
    kw = dict(batch=12, steps=2, staleness_threshold=0.0, local_steps=1, train_seconds=0.5, update_seconds=0.1,
              policy="vllm", replicas=3, router="placed", predicted=predicted, budget_tokens=4096, max_new_tokens=512)
    plain = run_verl_async(stream, **kw)
    sent = []
    real = WorkStealing._send

    def spy(self, job, src, target, **kw_):
        sent.append((self.engines.index(src), target))
        return real(self, job, src, target, **kw_)

    monkeypatch.setattr(WorkStealing, "_send", spy)
    stolen = run_verl_async(stream, steal=True, **kw)
    assert stolen.seconds < plain.seconds
    assert stolen.consumed_tokens == plain.consumed_tokens
    assert sent and all(a != b for a, b in sent)


def test_stealing_from_snapshots_follows_what_the_driver_is_told():
    """steal_observed inside verl's recipe (what lengthsched.integrations.verl_async runs): a coordinator told
    where the router sent each request, deciding from snapshots, moves work a replica that drained can take,
    and gains as stealing from the engines' exact state does (within a little) on a stream whose whole groups
    are placed on predictions that miss."""
    rng = np.random.default_rng(5)
    stream = [Group(f"p{i}", 200, rng.integers(50, 900, size=8)) for i in range(40)]
    predicted = np.concatenate([np.full(8, 400) for _ in range(40)])
    kw = dict(batch=12, steps=3, staleness_threshold=0.1, local_steps=1, train_seconds=0.5, update_seconds=0.1,
              policy="vllm", replicas=3, router="placed", predicted=predicted, budget_tokens=6000,
              max_new_tokens=1024)
    plain = run_verl_async(stream, **kw)
    exact = run_verl_async(stream, steal=True, resubmit_seconds=0.05, **kw)
    observed = run_verl_async(stream, steal=True, resubmit_seconds=0.05, snapshot_seconds=0.25, **kw)
    assert observed.policy == "steal_observed" and observed.consumed_tokens == plain.consumed_tokens
    assert observed.seconds < plain.seconds and exact.seconds < plain.seconds
    assert observed.seconds <= 1.05 * exact.seconds


def test_the_placed_router_keeps_groups_whole_in_crowded_pools():
    """router='placed' sends each group as steal places a step's groups: whole groups where the predicted
    tokens in flight fill the pools CROWDED_POOLS times over, and verl's spread where everything fits."""
    from simulate.asynchronous import _Placed

    router = _Placed(3, np.full(12, 10.0), np.array([0, 4, 8]), [4, 4, 4], ways=1)
    assert [router.select(j, 0) for j in range(4)] == [0, 0, 0, 0]
    assert [router.select(j, 1) for j in range(4, 8)] == [1, 1, 1, 1]
    router.finished(0, [0, 1, 2, 3])
    assert [router.select(j, 2) for j in range(8, 12)] == [0, 0, 0, 0]  # the least predicted work in flight
    spread = _Placed(3, np.full(6, 10.0), np.array([0]), [6], ways=3)
    assert sorted(spread.select(j, 0) for j in range(6)) == [0, 0, 1, 1, 2, 2]
    router.moved(8, 0, 2)
    assert router.work == [30.0, 40.0, 10.0]


def test_the_prefill_share_caps_how_widely_the_placed_router_spreads_a_group(monkeypatch):
    """prefill_share: a group spreads over at most 1 + share x predicted tokens / prompt tokens replicas (its
    prompt prefilled again on each replica beyond the first); long prompts in roomy pools are placed whole."""
    import simulate.asynchronous as sa

    stream = [Group(f"p{i}", 600, np.full(8, 300)) for i in range(30)]
    seen = []
    real = sa.place_ways

    def spy(pred, sizes, replicas, ways, loads=None):
        seen.append(ways)
        return real(pred, sizes, replicas, ways, loads=loads)

    monkeypatch.setattr(sa, "place_ways", spy)
    kw = dict(batch=8, steps=2, staleness_threshold=0.0, local_steps=1, train_seconds=0.2, policy="vllm", replicas=4,
              router="placed", predicted=np.full(240, 300.0), budget_tokens=400_000, max_new_tokens=512)
    spread = run_verl_async(stream, **kw)
    assert set(seen) == {4}  # roomy pools: verl's spread
    seen.clear()
    capped = run_verl_async(stream, prefill_share=0.25, **kw)
    assert set(seen) == {1 + int(0.25 * 8 * 300 / 600)} == {2}  # each extra replica re-prefills 600 of 2,400 tokens
    assert capped.consumed_tokens == spread.consumed_tokens


def _spy_stream(monkeypatch):
    """Records every StreamPlacer.place call (predicted, prompt, loads, replicas returned) and every request the
    async loop's _Placed router sends (job, replica)."""
    import simulate.asynchronous as sa
    from lengthsched.integrations.verl_async import StreamPlacer

    calls, sent = [], []
    place, select = StreamPlacer.place, sa._Placed.select

    def spy_place(self, predicted, prompt_tokens, replicas, loads=None):
        out = place(self, predicted, prompt_tokens, replicas, loads=loads)
        calls.append((np.array(predicted), prompt_tokens, None if loads is None else list(loads), out[0].tolist(),
                      self.last_ways))
        return out

    def spy_select(self, job, group):
        r = select(self, job, group)
        sent.append((job, r))
        return r

    monkeypatch.setattr(StreamPlacer, "place", spy_place)
    monkeypatch.setattr(sa._Placed, "select", spy_select)
    return calls, sent


def test_the_stream_router_places_each_group_with_the_integrations_placer(monkeypatch):
    """router='stream': each group, when its first request is routed, goes through
    lengthsched.integrations.verl_async.StreamPlacer (the integration's code): in stream order, with the group's
    predictions and prompt and the router's count of predicted tokens in flight as loads, and every request of
    the group goes where the placer put it."""
    calls, sent = _spy_stream(monkeypatch)
    stream = _stream(20, size=6, seed=3, high=500)
    predicted = _predicted(stream, 3)
    out = run_verl_async(stream, batch=4, steps=3, staleness_threshold=0.5, train_seconds=0.3, update_seconds=0.05,
                         replicas=3, router="stream", predicted=predicted, prefill_share=0.1, budget_tokens=1500,
                         max_new_tokens=512)
    started = int(np.sum(~np.isnan(np.asarray(out.group_submitted))))
    assert len(calls) == started
    assert calls[0][2] == [0.0, 0.0, 0.0] and any(sum(c[2]) > 0 for c in calls[1:])  # the groups in flight
    firsts = {}
    for g, (pred, prompt, loads, placed, ways) in enumerate(calls):
        assert prompt == stream[g].prompt_len
        np.testing.assert_array_equal(pred, predicted[6 * g:6 * g + 6])
        assert len(loads) == 3 and min(loads) >= 0.0 and 1 <= ways <= 3
        assert len(set(placed)) <= ways
        firsts[g] = placed
    for job, r in sent:  # requests aborted by an update are routed again where they were (verl 0.9.1)
        g, k = divmod(job, 6)
        assert r == firsts[g][k]


def test_the_stream_router_reads_the_drivers_loads_where_snapshots_drive_stealing(monkeypatch):
    """With snapshot_seconds the stream router places by the driver's coordinator (its loads()), as the
    integration does; stealing then moves requests, and every token is still trained once."""
    calls, _ = _spy_stream(monkeypatch)
    stream = _stream(20, size=6, seed=5, high=500)
    kw = dict(batch=4, steps=3, staleness_threshold=0.5, train_seconds=0.3, update_seconds=0.05, replicas=3,
              predicted=_predicted(stream, 5), budget_tokens=1500, max_new_tokens=512, steal=True,
              resubmit_seconds=0.05)
    out = run_verl_async(stream, router="stream", snapshot_seconds=0.25, prefill_share=0.1, **kw)
    assert out.policy == "steal_observed" and calls
    assert calls[0][2] == [0.0, 0.0, 0.0]  # nothing in flight yet
    assert any(sum(c[2]) > 0 for c in calls[1:])  # the coordinator counts the groups placed before
    trained = [g for s in out.steps for g in s.groups]
    assert len(trained) == len(set(trained)) == 12


def test_the_stream_router_is_the_placed_router_on_a_steady_stream():
    """On a stream of alike groups (one prompt length, one prediction, G a multiple of the replicas) the
    integration's placer, re-estimating its spread at every group, makes the placed router's decision: the same
    run to the last token and second, with and without stealing."""
    stream = [Group(f"p{i}", 40, np.random.default_rng(i).integers(5, 600, size=8)) for i in range(24)]
    kw = dict(batch=4, steps=3, staleness_threshold=0.5, train_seconds=0.3, update_seconds=0.05, replicas=4,
              predicted=np.full(24 * 8, 250.0), max_new_tokens=1024)
    for budget in (1200, 20_000):  # whole groups in crowded pools; verl's spread in roomy ones
        for steal in (False, True):
            a = run_verl_async(stream, router="placed", budget_tokens=budget, steal=steal, **kw)
            b = run_verl_async(stream, router="stream", budget_tokens=budget, steal=steal, **kw)
            assert (b.seconds, b.consumed_tokens, b.recomputed_tokens) == (a.seconds, a.consumed_tokens,
                                                                           a.recomputed_tokens)


class _Recording:
    """A predictor that predicts ``value`` tokens for every prompt and records what it is asked and told."""

    def __init__(self, value):
        self.value, self.asked, self.told = value, [], []

    def predict(self, prompts, prefixes=None):
        from lengthsched import LengthPrediction

        self.asked.append(list(prompts))
        return LengthPrediction(np.full(len(prompts), float(self.value)))

    def observe(self, prompt, length, *, step=None):
        self.told.append((prompt, length, step))


@pytest.mark.parametrize("steal,snapshot,router", [(False, None, "stream"), (True, None, "stream"),
                                                   (True, 0.25, "stream"), (True, 0.25, "placed"),
                                                   (False, None, "least_work")])
def test_a_predictor_is_asked_per_group_as_submitted_and_told_the_lengths_when_back(steal, snapshot, router):
    """predicted may be a predictor, as lengthsched.integrations.verl_async's planner uses one: asked once per
    group (by prompt) when the group is submitted, told every length of a group when the whole group is back,
    as rollout step = groups back // batch. Predicting a constant, it runs as the same constant given per
    completion."""
    stream = _stream(20, size=6, seed=7, high=500)
    kw = dict(batch=4, steps=3, staleness_threshold=0.5, train_seconds=0.3, update_seconds=0.05, replicas=3,
              router=router, budget_tokens=1500, max_new_tokens=512, steal=steal, snapshot_seconds=snapshot,
              resubmit_seconds=0.05 if steal else 0.0)
    pred = _Recording(180)
    out = run_verl_async(stream, predicted=pred, **kw)
    fixed = run_verl_async(stream, predicted=np.full(120, 180.0), **kw)
    assert (out.seconds, out.consumed_tokens, out.recomputed_tokens) == (fixed.seconds, fixed.consumed_tokens,
                                                                         fixed.recomputed_tokens)
    submitted = np.asarray(out.group_submitted)
    started = np.flatnonzero(~np.isnan(submitted))
    assert pred.asked == [[stream[g].prompt_id] for g in started]  # in submission order, one prompt each
    back = [g for g in np.argsort(np.asarray(out.group_finished), kind="stable") if np.isfinite(out.group_finished[g])]
    told = [(p, n) for p, n, _ in pred.told]
    assert told[:6 * len(back)] == [(stream[g].prompt_id, int(n)) for g in back for n in stream[g].lengths]
    steps = [step for _, _, step in pred.told]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] == len(pred.told) // 6 // 4


def test_the_online_predictor_learns_the_streams_lengths(monkeypatch):
    """Without a trained predictor (the online one from a default of response_length / 2), the groups placed
    after the first ones come back are predicted near the stream's typical length, not the default."""
    import simulate.asynchronous as sa
    from lengthsched import OnlineLengthPredictor

    stream = _stream(24, size=6, seed=9, low=50, high=150)
    online = OnlineLengthPredictor(default_length=256, max_new_tokens=512)
    seen = []
    real = sa.predict_lengths

    def spy(predictor, queries, **kw):
        out = real(predictor, queries, **kw)
        seen.append(int(out[0]))
        return out

    monkeypatch.setattr(sa, "predict_lengths", spy)
    run_verl_async(stream, batch=4, steps=3, staleness_threshold=0.5, train_seconds=0.3, replicas=2,
                   router="stream", predicted=online, budget_tokens=1500, max_new_tokens=512)
    assert seen[0] == 256  # nothing known yet
    assert all(40 <= n <= 160 for n in seen[-4:])  # the running mean of what came back


def test_stealing_bad_arguments_name_themselves():
    stream = _stream(12)
    kw = dict(batch=4, steps=2, staleness_threshold=0.5, train_seconds=0.1, **COMMON)
    with pytest.raises(InvalidArgument, match="predicted"):
        run_verl_async(stream, steal=True, **kw)
    with pytest.raises(InvalidArgument, match="predicted"):
        run_verl_async(stream, router="placed", **kw)
    with pytest.raises(InvalidArgument, match="steal"):
        run_verl_async(stream, steal="yes", predicted=_predicted(stream), **kw)
    with pytest.raises(InvalidArgument, match="resubmit_seconds"):
        run_verl_async(stream, resubmit_seconds=0.5, **kw)
    with pytest.raises(InvalidArgument, match="resubmit_seconds"):
        run_verl_async(stream, steal=True, resubmit_seconds=-1.0, predicted=_predicted(stream), **kw)
    with pytest.raises(InvalidArgument, match="predicted"):
        run_async_rollout(stream, batch=4, steps=2, max_staleness=1, train_seconds=0.1, steal=True, **COMMON)
    with pytest.raises(InvalidArgument, match="prefill_share"):
        run_verl_async(stream, prefill_share=0.1, steal=True, predicted=_predicted(stream), **kw)  # not 'placed'
    with pytest.raises(InvalidArgument, match="prefill_share"):
        run_verl_async(stream, router="placed", prefill_share=-1.0, predicted=_predicted(stream), **kw)
    with pytest.raises(InvalidArgument, match="predicted"):
        run_verl_async(stream, router="stream", **kw)
    with pytest.raises(InvalidArgument, match="prefill_share"):
        run_verl_async(stream, router="stream", prefill_share=0.0, predicted=_predicted(stream), **kw)
    with pytest.raises(InvalidArgument, match="snapshot_seconds"):
        run_verl_async(stream, snapshot_seconds=0.25, **kw)  # without steal
    with pytest.raises(InvalidArgument, match="snapshot_seconds"):
        run_verl_async(stream, steal=True, snapshot_seconds=0.0, predicted=_predicted(stream), **kw)
    with pytest.raises(InvalidArgument, match="snapshot_seconds"):
        run_async_rollout(stream, batch=4, steps=2, max_staleness=1, train_seconds=0.1, steal=True, policy="sglang",
                          snapshot_seconds=0.25, predicted=_predicted(stream), **COMMON)


def test_each_rank_routes_its_own_groups_from_its_own_counts(monkeypatch):
    """ranks=2 (AReaL's SPMD mode, one engine per trainer rank): group g goes through rank g mod 2's own placer
    (lengthsched.integrations.areal on every rank), whose loads count only the predicted tokens that rank sent;
    every request of a group goes where its rank's placer put it, and every trained group is trained once."""
    calls, sent = _spy_stream(monkeypatch)
    stream = _stream(24, size=6, seed=7, high=500)
    predicted = _predicted(stream, 7)
    kw = dict(batch=4, steps=3, max_staleness=1, train_seconds=0.3, update_seconds=0.05, replicas=3,
              predicted=predicted, budget_tokens=1500, max_new_tokens=512, router="stream", prefill_share=0.1)
    out = run_async_rollout(stream, ranks=2, **kw)
    firsts = {g: placed for g, (_, _, _, placed, _) in enumerate(calls)}
    for job, r in sent:
        g, k = divmod(job, 6)
        assert r == firsts[g][k]
    # rank 0 placed groups 0, 2, 4, ...: its loads when it placed group 2 count group 0 only (or less, if back)
    load_at_2 = sum(calls[2][2])
    assert load_at_2 <= float(np.sum(predicted[0:6])) + 1e-9
    assert calls[1][2] == [0.0, 0.0, 0.0]  # rank 1's first group: that rank has sent nothing yet (rank 0 has)
    trained = [g for s in out.steps for g in s.groups]
    assert len(trained) == len(set(trained)) == 12


def test_each_rank_runs_its_own_round_robin():
    """Round robin per rank: rank k's starts at server k x replicas // ranks, and group g is rank g mod ranks's."""
    from simulate.asynchronous import _Ranks, _RoundRobin

    owner = np.repeat(np.arange(4), 3)
    ranks = _Ranks.of([_RoundRobin(3, k * 3 // 2) for k in range(2)], owner)
    picked = [ranks.select(j, int(owner[j])) for j in range(12)]
    assert picked == [0, 1, 2, 1, 2, 0, 0, 1, 2, 1, 2, 0]
    single = _RoundRobin(3)
    assert _Ranks.of([single], owner) is single  # one rank: the loop's own router


@pytest.mark.parametrize("kwargs", [dict(steal=True, router="placed"), dict(router="least_loaded"),
                                    dict(router="placed"), dict(router="stream", steal=True)])
def test_ranks_need_a_router_each_rank_can_run_alone(kwargs):
    stream = _stream(12, seed=2)
    with pytest.raises(InvalidArgument) as err:
        run_async_rollout(stream, batch=4, steps=2, max_staleness=1, train_seconds=0.3, replicas=2, ranks=2,
                          predicted=_predicted(stream, 2), **kwargs, **COMMON)
    assert err.value.name == "ranks"


class _RankRecording:
    """An OnlineLengthPredictor that records the prompts it was asked about and told of."""

    def __init__(self, **kwargs):
        from lengthsched import OnlineLengthPredictor

        self.inner = OnlineLengthPredictor(default_length=100, **kwargs)
        self.asked, self.told, self.merged = [], [], 0

    def predict(self, prompts, **kwargs):
        self.asked += list(prompts)
        return self.inner.predict(prompts, **kwargs)

    def observe(self, prompt, length, **kwargs):
        self.told.append(prompt)
        self.inner.observe(prompt, length, **kwargs)

    @property
    def step(self):
        return self.inner.step

    def state_dict(self):
        return self.inner.state_dict()

    def merge_state_dict(self, state):
        self.merged += 1
        return self.inner.merge_state_dict(state)


def _epochs(prompts=8, epochs=3, size=4, seed=5):
    """Epochs of the same prompts (fresh lengths around each prompt's own median, a fresh order each epoch)."""
    rng = np.random.default_rng(seed)
    medians = np.exp(rng.uniform(3.0, 6.0, size=prompts))
    out = []
    for _ in range(epochs):
        for i in rng.permutation(prompts):
            out.append(Group(f"p{i}", 20, np.maximum(1, (medians[i] * np.exp(0.1 * rng.standard_normal(size)))
                                                     .astype(np.int64))))
    return out


def test_each_ranks_predictor_learns_its_own_groups_and_pooling_shares_them():
    """A learning predictor per rank (lengthsched.integrations.areal on each rank): rank k's predictor is asked
    for and told of groups k, k + ranks, ... only, its steps its own groups back over its share of the batch; with
    share_learning each rank merges the others' latest states as its steps start, and by the last epoch it knows
    prompts that only other ranks served before."""
    stream = _epochs()
    kw = dict(batch=4, steps=5, max_staleness=1, train_seconds=0.2, update_seconds=0.05, replicas=2, router="stream",
              budget_tokens=1500, max_new_tokens=512, ranks=2)
    for share in (False, True):
        mine = [_RankRecording(), _RankRecording()]
        run_async_rollout(stream, predicted=mine, share_learning=share, **kw)
        for k, q in enumerate(mine):
            ids = {g.prompt_id for g in stream[k::2][:12]}
            assert set(q.asked) <= ids and set(q.told) <= ids and len(q.told) % 4 == 0
            assert (q.merged > 0) == share
        known = [set(q.inner.state_dict()["prompts"]) for q in mine]
        if share:
            assert known[0] == known[1]  # both took in what the other learnt
        else:
            assert known[0] == set(mine[0].told) and known[1] == set(mine[1].told)


def test_one_rank_with_a_list_of_one_predictor_is_the_predictor_itself():
    from lengthsched import OnlineLengthPredictor

    stream = _epochs(epochs=2)
    kw = dict(batch=4, steps=3, max_staleness=1, train_seconds=0.2, replicas=2, router="stream", budget_tokens=1500,
              max_new_tokens=512)
    alone = run_async_rollout(stream, predicted=OnlineLengthPredictor(default_length=100), **kw)
    listed = run_async_rollout(stream, predicted=[OnlineLengthPredictor(default_length=100)], **kw)
    assert alone.seconds == listed.seconds and alone.steps == listed.steps


def test_per_rank_predictors_and_pooling_refuse_what_does_not_fit():
    from lengthsched import OnlineLengthPredictor

    stream = _epochs(epochs=2)
    kw = dict(batch=4, steps=3, max_staleness=1, train_seconds=0.2, replicas=2, budget_tokens=1500,
              max_new_tokens=512)
    two = [OnlineLengthPredictor(), OnlineLengthPredictor()]
    with pytest.raises(InvalidArgument) as err:
        run_async_rollout(stream, predicted=two, router="stream", ranks=3, **kw)
    assert err.value.name == "predicted"
    with pytest.raises(InvalidArgument) as err:
        run_async_rollout(stream, predicted=OnlineLengthPredictor(), router="stream", ranks=2, share_learning=True,
                          **kw)
    assert err.value.name == "share_learning"

    class Plain:  # learns, but cannot save or merge what it learnt
        def predict(self, prompts, **kwargs):
            return OnlineLengthPredictor(default_length=100).predict(prompts, **kwargs)

        def observe(self, *args, **kwargs):
            pass

    with pytest.raises(InvalidArgument) as err:
        run_async_rollout(stream, predicted=[Plain(), Plain()], router="stream", ranks=2, share_learning=True, **kw)
    assert err.value.name == "share_learning"


def test_a_fixed_spread_keeps_each_group_on_as_many_replicas(monkeypatch):
    """ways=1 with router 'stream' (install(..., ways=1)): every request of a group goes to one replica, the one
    with the least predicted tokens in flight when its first request came; ways with another router is refused."""
    calls, sent = _spy_stream(monkeypatch)
    stream = _stream(16, size=6, seed=3, high=500)
    kw = dict(batch=4, steps=3, max_staleness=1, train_seconds=0.3, replicas=3, predicted=_predicted(stream, 3),
              budget_tokens=10**9, max_new_tokens=512)
    run_async_rollout(stream, router="stream", ways=1, **kw)
    by_group: dict = {}
    for job, r in sent:
        by_group.setdefault(job // 6, set()).add(r)
    assert by_group and all(len(rs) == 1 for rs in by_group.values())
    spread: dict = {}
    calls.clear()
    sent.clear()
    run_async_rollout(stream, router="stream", **kw)  # a roomy pool: the placer's estimate spreads them
    for job, r in sent:
        spread.setdefault(job // 6, set()).add(r)
    assert any(len(rs) > 1 for rs in spread.values())
    few: dict = {}  # 2 groups in flight on 3 replicas: each group on 2 (the placer widens it), none left idle
    sent.clear()
    run_async_rollout(stream, router="stream", ways=1, **{**kw, "max_concurrent": 2, "batch": 2})
    for job, r in sent:
        few.setdefault(job // 6, set()).add(r)
    assert all(len(rs) == 2 for rs in few.values())
    for bad in (dict(router="stream", ways=0), dict(router="least_work", ways=1)):
        with pytest.raises(InvalidArgument) as err:
            run_async_rollout(stream, **{**kw, **bad})
        assert err.value.name == "ways"


def test_verl_with_a_fixed_spread_sends_each_group_to_as_many_replicas(monkeypatch):
    """run_verl_async(..., router="stream", ways=1) (the integration's +lengthsched.ways=1): every request of a
    group is routed to one replica (stealing may move it after), in every weight version; ways with verl's own
    router is refused."""
    calls, sent = _spy_stream(monkeypatch)
    stream = _stream(16, size=6, seed=3, high=500)
    kw = dict(batch=4, steps=3, staleness_threshold=0.5, train_seconds=0.3, replicas=3, budget_tokens=10**9,
              max_new_tokens=512, predicted=_predicted(stream, 3))
    run_verl_async(stream, router="stream", ways=1, steal=True, **kw)
    by_group: dict = {}
    for job, r in sent:
        by_group.setdefault(job // 6, set()).add(r)
    assert len(by_group) >= 10 and all(len(rs) == 1 for rs in by_group.values())
    assert {w for *_, w in calls} == {1}
    sent.clear()
    run_verl_async(stream, router="stream", steal=True, **kw)  # roomy pools: the estimate spreads them
    assert any(len({r for job, r in sent if job // 6 == g}) > 1 for g in by_group)
    with pytest.raises(InvalidArgument) as err:
        run_verl_async(stream, ways=1, **kw)
    assert err.value.name == "ways"
