"""simulate.run_oversampled_steps (slime's over-sampling and partial rollout, step after step) and
RolloutResult.generated_at (what an abort leaves)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthsched import InvalidArgument
from simulate import run_oversampled_steps, run_rollout
from simulate.workloads import Group

COMMON = dict(budget_tokens=2048, max_new_tokens=512)


def _stream(n, size=4, seed=0, low=5, high=400):
    rng = np.random.default_rng(seed)
    return [Group(f"p{i}", int(rng.integers(8, 60)), rng.integers(low, high, size=size)) for i in range(n)]


@pytest.mark.parametrize("policy,kw", [("vllm", {"router": "least_loaded"}), ("steal", {})])
def test_generated_at_counts_every_token_decoded_by_then(policy, kw):
    groups = _stream(12, size=4, seed=3)
    r = run_rollout(groups, policy, replicas=2, record=True, **COMMON, **kw)
    full = np.concatenate(r.collected_lengths)
    assert r.generated_at(0.0).sum() == 0
    assert (r.generated_at(r.seconds) == full).all()
    times = np.linspace(0.0, r.seconds, 13)
    counts = [r.generated_at(t) for t in times]
    assert all((a <= b).all() for a, b in zip(counts, counts[1:]))
    finish = r.group_finish_seconds()
    sizes = [len(c) for c in r.collected_lengths]
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    at = float(np.median(finish))
    now = r.generated_at(at)
    for g, (a, n) in enumerate(zip(starts, sizes)):
        if finish[g] <= at:  # a finished group holds all of its tokens
            assert (now[a:a + n] == full[a:a + n]).all()
    with pytest.raises(InvalidArgument, match="record"):
        run_rollout(groups, policy, replicas=2, **COMMON, **kw).generated_at(1.0)
    with pytest.raises(InvalidArgument, match="seconds"):
        r.generated_at(-1.0)


def test_without_over_sampling_every_step_is_a_whole_rollout():
    stream = _stream(9, seed=1)
    out = run_oversampled_steps(stream, "vllm", batch=3, oversample=1, steps=3, replicas=2, **COMMON)
    for k, step in enumerate(out.steps):
        alone = run_rollout(stream[3 * k:3 * k + 3], "vllm", replicas=2, **COMMON)
        assert step.seconds == pytest.approx(alone.seconds)
        assert sorted(step.kept) == [3 * k, 3 * k + 1, 3 * k + 2]
        assert step.stale_tokens == step.dropped_tokens == step.carried_in == step.carried_out == 0
    assert out.kept_length_ratio == pytest.approx(1.0)
    assert out.stale_share == out.dropped_share == 0.0


def test_partial_rollout_carries_aborted_groups_with_their_tokens():
    stream = _stream(40, seed=2, high=500)
    out = run_oversampled_steps(stream, "vllm", batch=4, oversample=1.5, steps=5, replicas=2, router="least_loaded",
                                **COMMON)
    first, later = out.steps[0], out.steps[1:]
    assert first.submitted == 6 and first.carried_in == 0 and first.stale_tokens == 0
    assert all(s.carried_in == 2 and s.submitted == 6 for s in later)  # the aborted two come back first
    kept = [g for s in out.steps for g in s.kept]
    assert len(kept) == len(set(kept)) == 20
    lengths = np.array([g.lengths for g in stream])
    assert sum(s.kept_tokens for s in out.steps) == lengths[kept].sum()
    # every token was decoded once: what was kept, and what the buffer still holds
    assert sum(s.decoded_tokens for s in out.steps) == out.kept_tokens + out.carried_tokens
    assert out.stale_share > 0 and out.dropped_share == 0
    assert set(out.carried).isdisjoint(kept) and len(out.carried) == 2
    assert out.fresh_tokens_per_second == pytest.approx(out.kept_tokens_per_second * (1 - out.stale_share))
    assert out.max_wait >= 1 and first.waited == 0


def test_siblings_predict_what_a_resumed_sample_has_left():
    """resume="siblings": a carried sample that outran its prediction is predicted from its finished
    siblings and its own progress (the online predictor's truncated predictive), never as less than
    "left" (max(1, predicted - generated)), which takes it for nearly done."""
    seen = {}

    def run(groups, policy, *, predicted, **kw):
        seen.setdefault(len(seen), (groups, np.asarray(predicted)))
        return run_rollout(groups, policy, predicted=predicted, **kw)

    rng = np.random.default_rng(7)
    stream = [Group(f"p{i}", 20, np.array([150, 160, 140, 500]) if i == 0 else rng.integers(200, 300, size=4))
              for i in range(12)]
    pred = np.full(48, 50)
    got = {}
    for resume in ("left", "siblings"):
        seen.clear()
        run_oversampled_steps(stream, "steal", batch=3, oversample=1.5, steps=2, predicted=pred, resume=resume,
                              run=run, replicas=1, **COMMON)
        groups, predicted = seen[1]
        starts = np.concatenate(([0], np.cumsum([len(g.lengths) for g in groups])[:-1]))
        got[resume] = {g.prompt_id: predicted[a:a + len(g.lengths)]
                       for g, a in zip(groups, starts) if "#" in g.prompt_id}
    assert got["left"].keys() == got["siblings"].keys() and "p0#3" in got["left"]
    assert all((got["left"][k] == 1).all() for k in got["left"])  # every resumed one outran its 50 tokens
    assert all((got["siblings"][k] >= got["left"][k]).all() for k in got["left"])
    assert any((got["siblings"][k] > 1).any() for k in got["left"])
    with pytest.raises(InvalidArgument, match="resume"):
        run_oversampled_steps(stream, "vllm", batch=3, oversample=1.5, steps=1, resume="guess", replicas=1, **COMMON)


def test_without_partial_rollout_the_aborted_work_is_lost():
    stream = _stream(40, seed=2, high=500)
    out = run_oversampled_steps(stream, "vllm", batch=4, oversample=1.5, steps=5, partial=False, replicas=2,
                                **COMMON)
    assert all(s.carried_in == 0 and s.submitted == 6 for s in out.steps)
    assert sum(s.decoded_tokens for s in out.steps) == out.kept_tokens + sum(s.dropped_tokens for s in out.steps)
    assert out.stale_share == 0 and out.dropped_share > 0 and out.carried == ()
    assert out.kept_length_ratio < 1  # the aborted groups are the long ones


def test_a_step_ends_at_its_batch_th_group_sooner_than_the_whole_rollout():
    stream = _stream(12, seed=4, high=500)
    pred = np.concatenate([g.lengths for g in stream])
    out = run_oversampled_steps(stream, "steal", batch=4, oversample=1.5, steps=2, predicted=pred, replicas=2,
                                keep_results=True, **COMMON)
    assert all(s.seconds <= r.seconds + 1e-12 for s, r in zip(out.steps, out.results))
    assert out.steps[0].seconds < out.results[0].seconds


@settings(deadline=None)
@given(seed=st.integers(0, 10**6), size=st.integers(1, 4), batch=st.integers(1, 4),
       oversample=st.sampled_from([1.0, 1.25, 1.5, 2.0]), partial=st.booleans(),
       policy=st.sampled_from(["vllm", "steal"]), replicas=st.integers(1, 3),
       resume=st.sampled_from(["left", "siblings"]), valid=st.sampled_from([None, 0.6, 1.0]),
       limit=st.sampled_from([None, (1, "wait"), (1, "drop"), (2, "wait"), (2, "drop")]))
def test_tokens_are_conserved_over_the_steps(seed, size, batch, oversample, partial, policy, replicas, resume, valid,
                                             limit):
    stream = _stream(60, size=size, seed=seed, high=300)
    noise = np.exp(np.random.default_rng(seed).normal(0, 0.5, 60 * size))
    pred = np.maximum(1, np.rint(np.concatenate([g.lengths for g in stream]) * noise)).astype(int)
    carry = {} if limit is None or not partial else {"max_carry": limit[0], "carry_limit": limit[1]}
    out = run_oversampled_steps(stream, policy, batch=batch, oversample=oversample, steps=3, partial=partial,
                                predicted=pred, resume=resume, valid=valid, filter_seed=seed, replicas=replicas,
                                **carry, **COMMON)
    kept = [g for s in out.steps for g in s.kept]
    assert len(kept) == len(set(kept))
    if carry.get("carry_limit") == "wait":  # a step keeps every group that old, B or more
        assert len(kept) >= 3 * batch - out.shortfall and out.max_wait <= carry["max_carry"]
    else:
        assert len(kept) == 3 * batch - out.shortfall
    if carry:
        assert out.max_wait <= carry["max_carry"]
        assert all(s.token_age <= carry["max_carry"] * s.stale_tokens for s in out.steps)
    assert out.shortfall == 0 or valid == 0.6
    lost = sum(s.dropped_tokens + s.filtered_tokens for s in out.steps)
    assert sum(s.decoded_tokens for s in out.steps) == out.kept_tokens + out.carried_tokens + lost
    assert all(0 <= s.stale_tokens <= s.kept_tokens for s in out.steps)
    assert (sum(s.dropped_tokens for s in out.steps) == 0) if partial and carry.get("carry_limit") != "drop" else (
        partial or (out.carried_tokens == 0 and out.stale_share == 0))


def test_a_dynamic_sampling_filter_drops_finished_groups_and_the_step_waits_for_the_batch_th_that_passes():
    """valid: a group that fails the filter is thrown away when it finishes (its tokens filtered, never
    carried), the step ends at its batch-th finished group that passes; too few passing groups keep fewer."""
    stream = _stream(30, seed=5, high=400)
    fails = np.array([i % 3 == 0 for i in range(30)])
    out = run_oversampled_steps(stream, "vllm", batch=4, oversample=1.5, steps=3, valid=~fails, replicas=2,
                                router="least_loaded", keep_results=True, **COMMON)
    plain = run_oversampled_steps(stream, "vllm", batch=4, oversample=1.5, steps=1, replicas=2,
                                  router="least_loaded", keep_results=True, **COMMON)
    kept = [g for s in out.steps for g in s.kept]
    assert not any(fails[kept]) and len(kept) == 12 - out.shortfall
    assert sum(s.filtered_tokens for s in out.steps) > 0 and out.filtered_share > 0
    first = out.steps[0]
    finish = out.results[0].group_finish_seconds()  # step 1 has no carried group: one part per group
    passing = sorted(f for f, g in zip(finish, range(6)) if not fails[g])
    assert first.seconds == pytest.approx(passing[3] if len(passing) >= 4 else max(finish))
    assert plain.steps[0].seconds <= first.seconds  # without the filter the 4th finish comes no later
    few = run_oversampled_steps(stream, "vllm", batch=4, oversample=1, steps=1, valid=~fails, replicas=2, **COMMON)
    assert few.shortfall == 2 and len(few.steps[0].kept) == 2  # 2 of the first 4 groups fail
    for bad in (0.0, 1.5, [True, False]):
        with pytest.raises(InvalidArgument, match="valid"):
            run_oversampled_steps(stream, "vllm", batch=4, oversample=1, steps=1, valid=bad, replicas=1, **COMMON)


def test_bad_arguments_name_themselves():
    stream = _stream(6)
    for kw, name in [(dict(batch=0), "batch"), (dict(oversample=0.5), "oversample"), (dict(steps=0), "steps"),
                     (dict(batch=4, steps=2), "stream"), (dict(predicted=[1.0, 2.0]), "predicted")]:
        args = dict(batch=2, oversample=1.5, steps=1) | kw
        with pytest.raises(InvalidArgument, match=name):
            run_oversampled_steps(stream, "vllm", **args, replicas=1, **COMMON)
    mixed = stream[:2] + [Group("odd", 5, np.array([3, 4]))]
    with pytest.raises(InvalidArgument, match="stream"):
        run_oversampled_steps(mixed, "vllm", batch=1, oversample=1, steps=1, replicas=1, **COMMON)


def test_a_replica_that_got_nothing_still_has_a_timeline():
    """With record=True every replica keeps a timeline, the idle ones too (group_finish_seconds reads them all)."""
    r = run_rollout([Group("p", 10, np.array([30]))], "vllm", replicas=3, record=True, **COMMON)
    assert r.group_finish_seconds().tolist() == [r.seconds]
    assert r.generated_at(r.seconds).tolist() == [30]


@pytest.mark.parametrize("limit", ["wait", "drop"])
@pytest.mark.parametrize("max_carry", [1, 2])
def test_a_staleness_limit_bounds_how_long_a_kept_group_waited(limit, max_carry):
    """max_carry: no kept group waited more than max_carry steps; "wait" keeps every group that old (the step
    ends no sooner than its last such group), "drop" throws away the ones that would be carried once more."""
    rng = np.random.default_rng(0)
    stream = [Group(f"p{i}", int(rng.integers(8, 60)), np.r_[500 if i % 4 == 0 else rng.integers(5, 40),
                                                               rng.integers(5, 40, size=3)]) for i in range(60)]
    free = run_oversampled_steps(stream, "vllm", batch=3, oversample=2, steps=6, replicas=2, router="least_loaded",
                                 **COMMON)
    assert free.max_wait > max_carry  # the limit binds here
    out = run_oversampled_steps(stream, "vllm", batch=3, oversample=2, steps=6, replicas=2, router="least_loaded",
                                max_carry=max_carry, carry_limit=limit, keep_results=True, **COMMON)
    assert out.max_wait <= max_carry
    assert out.mean_token_age < free.mean_token_age
    kept = [g for s in out.steps for g in s.kept]
    assert len(kept) == len(set(kept))
    lost = sum(s.dropped_tokens for s in out.steps)
    assert sum(s.decoded_tokens for s in out.steps) == out.kept_tokens + out.carried_tokens + lost
    if limit == "wait":
        assert lost == 0 and sum(s.expired for s in out.steps) == 0 and sum(s.forced for s in out.steps) > 0
        assert all(len(s.kept) >= 3 for s in out.steps)
    else:
        assert lost > 0 and sum(s.expired for s in out.steps) > 0 and sum(s.forced for s in out.steps) == 0
        assert all(len(s.kept) == 3 for s in out.steps)


def test_token_age_counts_the_steps_since_each_kept_token_was_generated():
    """Without partial rollout every kept token is 0 steps old; with it, the age summed over the kept tokens is
    at most (steps waited) x (stale tokens) per step and at least the stale tokens."""
    stream = _stream(40, seed=2, high=500)
    plain = run_oversampled_steps(stream, "vllm", batch=4, oversample=1.5, steps=5, partial=False, replicas=2,
                                  **COMMON)
    assert plain.mean_token_age == 0.0 and all(s.token_age == 0 for s in plain.steps)
    out = run_oversampled_steps(stream, "vllm", batch=4, oversample=1.5, steps=5, replicas=2, **COMMON)
    for s in out.steps:
        assert s.stale_tokens <= s.token_age <= s.waited * s.stale_tokens
    assert out.mean_token_age >= out.stale_share > 0


def test_a_staleness_limit_needs_partial_rollout_and_a_known_rule():
    stream = _stream(12)
    for kw, name in [(dict(max_carry=0), "max_carry"), (dict(max_carry=1, partial=False), "max_carry"),
                     (dict(max_carry=1, carry_limit="never"), "carry_limit")]:
        with pytest.raises(InvalidArgument, match=name):
            run_oversampled_steps(stream, "vllm", batch=2, oversample=1.5, steps=1, replicas=1, **kw, **COMMON)


def test_a_run_in_another_order_is_listed_in_the_callers():
    """RolloutResult.in_order: run_slime_planned submits the groups in its planner's order; listed back in the
    caller's order, each group's lengths, finish and tokens by a time are its own."""
    from simulate import run_slime_planned, run_slime_planned_in_order

    groups = _stream(10, size=3, seed=6)
    pred = np.concatenate([np.full(3, int(g.lengths.max())) for g in groups])
    run, order = run_slime_planned(groups, pred, replicas=2, in_flight=None, record=True, **COMMON)
    assert not np.array_equal(order, np.arange(10))  # the planner reordered them
    mine = run.in_order(order)
    for g, got in zip(groups, mine.collected_lengths):
        assert np.array_equal(np.sort(got), np.sort(g.lengths))
    assert np.array_equal(mine.group_finish_seconds()[order], run.group_finish_seconds())
    at = 0.5 * run.seconds
    sizes = np.array([len(g.lengths) for g in groups])
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    back = np.concatenate([mine.generated_at(at)[starts[i]:starts[i] + sizes[i]] for i in order])
    assert np.array_equal(back, run.generated_at(at))
    assert np.array_equal(np.concatenate([mine.placement[starts[i]:starts[i] + sizes[i]] for i in order]),
                          run.placement)
    assert mine.seconds == run.seconds and mine.recomputed_tokens == run.recomputed_tokens
    with pytest.raises(InvalidArgument, match="order"):
        run.in_order(np.zeros(10, dtype=int))
    direct = run_slime_planned_in_order(groups, predicted=pred, replicas=2, record=True, **COMMON)
    assert np.array_equal(direct.group_finish_seconds(), mine.group_finish_seconds())
    with pytest.raises(InvalidArgument, match="policy"):
        run_slime_planned_in_order(groups, "vllm", predicted=pred, replicas=2, **COMMON)


@pytest.mark.parametrize("partial", [False, True])
def test_slime_with_the_integration_runs_the_over_sampled_steps(partial):
    """run=run_slime_planned_in_order: slime's over-sampling (and partial rollout) with the integration's planner
    planning every step, the resumed samples by what the siblings say they have left."""
    from simulate import run_slime_planned_in_order

    stream = _stream(40, seed=2, high=500)
    pred = np.concatenate([np.full(4, int(np.median(g.lengths))) for g in stream])
    out = run_oversampled_steps(stream, "sglang", batch=4, oversample=1.5, steps=4, partial=partial, predicted=pred,
                                run=run_slime_planned_in_order, replicas=2, **COMMON)
    kept = [g for s in out.steps for g in s.kept]
    assert len(kept) == len(set(kept)) == 16
    lost = sum(s.dropped_tokens for s in out.steps)
    assert sum(s.decoded_tokens for s in out.steps) == out.kept_tokens + out.carried_tokens + lost
    assert (out.stale_share > 0 and lost == 0) if partial else (out.stale_share == 0 and lost > 0)


# ------------------------------------------------------------------------------ slime's dynamic sampling (Refill)
def _replayed_releases(refill, finish_if_run, groups_of_unit):
    """slime's rule (generate_rollout_async) replayed from each unit's finish: the release time of every unit."""
    units = len(refill.passes)
    released = np.full(units, np.inf)
    submitted = dropped = kept = 0
    events = []  # (finish time, unit) of the units submitted and not yet counted

    def release(now):
        nonlocal submitted
        while kept < refill.batch and submitted - dropped < refill.batch and submitted < units:
            for u in range(submitted, min(units, submitted + refill.chunk)):
                released[u] = now
                events.append((max(now, finish_if_run[u]) if groups_of_unit[u] else now, u))
            submitted = min(units, submitted + refill.chunk)

    release(0.0)
    while events:
        events.sort()
        now, u = events.pop(0)
        if refill.passes[u]:
            kept += 1
        else:
            dropped += 1
        release(now)
    return released


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(2, 14), batch=st.integers(1, 5), chunk=st.integers(1, 6),
       share=st.sampled_from([0.3, 0.6, 1.0]), replicas=st.integers(1, 3), cap=st.integers(4, 40))
def test_a_refill_submits_a_chunk_whenever_the_filter_leaves_too_few(seed, n, batch, chunk, share, replicas, cap):
    """Refill: the first chunk at 0 s; another exactly when a unit that fails finishes and leaves those submitted
    and not dropped below batch, none after batch units passed; units never submitted never run."""
    from simulate.rollout import Refill

    stream = _stream(n, seed=seed, high=300)
    passes = tuple(bool(x) for x in np.random.default_rng(seed).random(n) < share)
    refill = Refill(batch=batch, chunk=max(chunk, batch), passes=passes)
    r = run_rollout(stream, "sglang", router="cache_aware", replicas=replicas, in_flight=cap, refill=refill,
                    record=True, **COMMON)
    released = r.released_seconds
    assert released[0] == 0.0 and np.all(np.diff(released[np.isfinite(released)]) >= 0)
    finish = r.group_finish_seconds()
    ran = np.isfinite(released)
    assert np.all(np.isinf(finish[~ran])) and np.all(np.isfinite(finish[ran]))
    sizes = [len(g.lengths) for g in stream]
    starts = np.cumsum([0] + sizes[:-1])
    assert all((r.placement[a:a + k] < 0).all() != bool(x) for a, k, x in zip(starts, sizes, ran))
    assert np.all(finish[ran] >= released[ran])
    replayed = _replayed_releases(refill, finish, [1] * n)
    assert np.array_equal(np.isfinite(replayed), ran)
    assert np.allclose(replayed[ran], released[ran])
    # every unit passing, one chunk for all: the run without a Refill
    whole = Refill(batch=n, chunk=n, passes=(True,) * n)
    plain = run_rollout(stream, "sglang", router="cache_aware", replicas=replicas, in_flight=cap, **COMMON)
    again = run_rollout(stream, "sglang", router="cache_aware", replicas=replicas, in_flight=cap, refill=whole,
                        **COMMON)
    assert again.seconds == plain.seconds and np.array_equal(again.placement, plain.placement)


def _replayed_verl_releases(refill, finish_if_run):
    """verl's v1 sync rule (ReplayBuffer.sample) replayed from each unit's finish: batch units at 0 s, two more per
    dropped unit while fewer than batch passed, one at a time, at most refill.cap in flight."""
    units = len(refill.passes)
    released = np.full(units, np.inf)
    submitted = done = kept = 0
    credit = refill.batch
    events = []

    def wanted():  # lengthsched's refill (by_need): the groups in flight fall short of what is missing, in expectation
        if refill.by_need is None:
            return True
        share = (refill.by_need[0] + kept + 1) / (refill.by_need[1] + done + 2)
        inflight = submitted - done
        return inflight == 0 or share * inflight < refill.batch - kept - 1e-9

    def release(now):
        nonlocal submitted, credit
        while (kept < refill.batch and submitted < units and credit > 0
               and (refill.cap is None or submitted - done < refill.cap) and wanted()):
            released[submitted] = now
            events.append((max(now, finish_if_run[submitted]), submitted))
            submitted += 1
            credit -= 1

    def count(u):
        nonlocal done, kept, credit
        done += 1
        if refill.passes[u]:
            kept += 1
        else:
            credit += 2

    release(0.0)
    while events:
        events.sort()
        if refill.poll is None:
            now, u = events.pop(0)
            count(u)
        else:  # verl's poll: every group finished by the next poll counted there, then the rule decides
            now = math.ceil(events[0][0] / refill.poll - 1e-9) * refill.poll
            while events and events[0][0] <= now + 1e-9:
                count(events.pop(0)[1])
        release(now)
    return released


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(2, 14), batch=st.integers(1, 5), extra=st.sampled_from([None, 0, 3]),
       share=st.sampled_from([0.3, 0.6, 1.0]), replicas=st.integers(1, 3),
       by_need=st.sampled_from([None, (0, 0), (3, 10), (9, 10)]), poll=st.sampled_from([None, 0.5, 2.0]))
def test_verls_refill_submits_two_for_every_drop_within_its_cap_and_drains(seed, n, batch, extra, share, replicas,
                                                                           by_need, poll):
    """Refill(rule="verl"): batch units at 0 s, then one unit at a time while the credit (two per dropped unit)
    lasts and fewer than cap are in flight, none once batch passed; every unit submitted runs to its end. With
    by_need (lengthsched's refill) only while those in flight are expected to pass fewer than are missing; with a
    poll only at the polls, from what finished before each."""
    from simulate.rollout import Refill

    stream = _stream(n, seed=seed, high=300)
    passes = tuple(bool(x) for x in np.random.default_rng(seed).random(n) < share)
    refill = Refill(batch=batch, chunk=1, passes=passes, rule="verl", cap=None if extra is None else batch + extra,
                    by_need=by_need, poll=poll)
    r = run_rollout(stream, "vllm", router="least_loaded", replicas=replicas, in_flight=10**6, refill=refill,
                    record=True, **COMMON)
    released, finish = r.released_seconds, r.group_finish_seconds()
    ran = np.isfinite(released)
    assert ran[:min(batch, n)].all() and (released[:min(batch, n)] == 0).all()
    assert np.all(np.isfinite(finish[ran])) and np.all(np.isinf(finish[~ran]))
    assert r.seconds == pytest.approx(float(finish[ran].max()), rel=1e-9)  # drained: the step ends with its last
    replayed = _replayed_verl_releases(refill, finish)
    if poll is not None:  # every later submission at a poll
        assert np.allclose(np.round(released[ran] / poll), released[ran] / poll)
    assert np.array_equal(np.isfinite(replayed), ran)
    assert np.allclose(replayed[ran], released[ran])
    dropped_before_last = sum(not passes[u] for u in np.flatnonzero(ran))
    assert ran.sum() <= batch + 2 * dropped_before_last


def test_verls_dapo_steps_keep_the_batch_drain_and_throw_the_surplus_away():
    stream = _stream(200, seed=3, high=400)
    valid = np.random.default_rng(3).random(200) < 0.4
    out = run_oversampled_steps(stream, "vllm", batch=6, oversample=1.0, steps=4, partial=False, valid=valid,
                                refill=True, refill_rule="verl", refill_cap=12, in_flight=10**6,
                                router="least_loaded", keep_results=True, **COMMON)
    for step, result in zip(out.steps, out.results):
        assert len(step.kept) == 6 and step.shortfall == 0
        assert step.seconds == pytest.approx(result.seconds, rel=1e-9)  # the step waits for everything submitted
        assert step.decoded_tokens == step.kept_tokens + step.filtered_tokens + step.dropped_tokens
    kept = [g for s in out.steps for g in s.kept]
    assert all(valid[g] for g in kept) and len(set(kept)) == len(kept)
    assert sum(s.dropped_tokens for s in out.steps) > 0  # some surplus passed and was thrown away
    for bad in (dict(partial=True), dict(oversample=1.5), dict(refill=False)):
        options = dict(partial=False, oversample=1.0, refill=True) | bad
        with pytest.raises(InvalidArgument, match="refill_rule"):
            run_oversampled_steps(stream, "vllm", batch=6, steps=1, valid=valid, refill_rule="verl",
                                  in_flight=10**6, router="least_loaded", **options, **COMMON)
    from simulate.rollout import Refill
    with pytest.raises(InvalidArgument, match="rule"):
        Refill(2, 1, (True,) * 3, rule="openrlhf")
    with pytest.raises(InvalidArgument, match="cap"):
        Refill(4, 1, (True,) * 6, rule="verl", cap=3)
    for bad in ((1, 0), (1, 2, 3)):
        with pytest.raises(InvalidArgument, match="by_need"):
            Refill(4, 1, (True,) * 6, rule="verl", by_need=bad)
    with pytest.raises(InvalidArgument, match="by_need"):
        Refill(4, 1, (True,) * 6, by_need=(0, 0))  # slime's rule has no such refill
    with pytest.raises(InvalidArgument, match="poll"):
        Refill(4, 1, (True,) * 6, poll=2.0)  # slime submits as groups finish
    with pytest.raises(InvalidArgument, match="refill_poll"):
        run_oversampled_steps(stream, "vllm", batch=6, steps=1, oversample=1.0, valid=valid, refill=True,
                              refill_poll=2.0, in_flight=10**6, router="least_loaded", **COMMON)
    polled = run_oversampled_steps(stream, "vllm", batch=6, oversample=1.0, steps=2, partial=False, valid=valid,
                                   refill=True, refill_rule="verl", refill_cap=12, refill_poll=2.0, in_flight=10**6,
                                   router="least_loaded", **COMMON)
    assert all(s.seconds % 2.0 == 0 and len(s.kept) == 6 for s in polled.steps)  # verl sees the end at a poll
    with pytest.raises(InvalidArgument, match="refill_need"):
        run_oversampled_steps(stream, "vllm", batch=6, steps=1, oversample=1.0, valid=valid, refill=True,
                              refill_need=True, in_flight=10**6, router="least_loaded", **COMMON)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10**6), replicas=st.integers(1, 3), need=st.booleans(), poll=st.sampled_from([None, 2.0]))
def test_verls_manager_in_its_dynamic_sampling_loop_batch_order_is_verl_and_longest_orders_each_batch(seed, replicas,
                                                                                                      need, poll):
    """run_verl_planned: the v1 manager's plan inside verl's loop. In batch order (priorities rising in the order
    verl hands the prompts over) with verl's least-loaded routing it is verl's own run, step for step (longest first:
    the next test); only vLLM's engines."""
    import functools

    from simulate.rollout import run_verl_planned

    stream = _stream(120, seed=seed, high=400)
    valid = np.random.default_rng(seed).random(120) < 0.5
    predicted = np.repeat(np.random.default_rng(seed + 1).integers(1, 400, 120), len(stream[0].lengths))
    shared = dict(batch=5, oversample=1.0, steps=3, partial=False, valid=valid, refill=True, refill_rule="verl",
                  refill_cap=10, refill_need=need, refill_poll=poll, in_flight=10**6, router="least_loaded",
                  replicas=replicas, **COMMON)
    plain = run_oversampled_steps(stream, "vllm", **shared)
    same = run_oversampled_steps(stream, "vllm", predicted=predicted, run=functools.partial(run_verl_planned,
                                                                                            order="batch"), **shared)
    assert [dataclasses.astuple(a) for a in plain.steps] == [dataclasses.astuple(b) for b in same.steps]
    with pytest.raises(InvalidArgument, match="policy"):
        run_oversampled_steps(stream, "sglang", predicted=predicted, run=run_verl_planned, **shared)


def test_verls_manager_plans_every_batch_verl_hands_over_at_once_longest_first(monkeypatch):
    import lengthsched.integrations.rollout as lr
    from simulate.rollout import Refill, run_verl_planned

    calls = []
    real = lr.plan_rollout

    def recording(keys, predicted, **kwargs):
        made = real(keys, predicted, **kwargs)
        calls.append((list(dict.fromkeys(keys)), [int(predicted[i]) for i in made.submission_order()]))
        return made

    monkeypatch.setattr(lr, "plan_rollout", recording)
    stream = _stream(40, seed=5, high=400)
    passes = tuple(bool(x) for x in np.random.default_rng(5).random(40) < 0.4)
    predicted = np.repeat(np.random.default_rng(6).integers(1, 400, 40), len(stream[0].lengths))
    refill = Refill(batch=6, chunk=1, passes=passes, rule="verl", cap=12, poll=2.0)
    result = run_verl_planned(stream, predicted=predicted, refill=refill, replicas=2, in_flight=10**6,
                              router="least_loaded", record=True, **COMMON)
    released = np.asarray(result.released_seconds)
    assert calls[0][0] == list(range(6))  # the step's batch, planned together
    batches = [sorted(np.flatnonzero(released == t).tolist()) for t in sorted(set(released[np.isfinite(released)]))]
    assert [sorted(units) for units, _ in calls] == batches  # one plan per poll that released prompts
    assert len(calls) > 1 and all(sent == sorted(sent, reverse=True) for _, sent in calls)  # longest first
    with pytest.raises(InvalidArgument, match="refill"):
        run_verl_planned(stream, predicted=predicted, refill=Refill(6, 2, passes), replicas=2, in_flight=10**6,
                         router="least_loaded", **COMMON)
    with pytest.raises(InvalidArgument, match="predicted"):
        run_verl_planned(stream, predicted=predicted[:-1], refill=refill, replicas=2, in_flight=10**6,
                         router="least_loaded", **COMMON)
    with pytest.raises(InvalidArgument, match="router"):  # the manager's spread requests need verl's router
        run_verl_planned(stream, predicted=predicted, refill=refill, replicas=2, in_flight=10**6, **COMMON)
    with pytest.raises(InvalidArgument, match="refill"):  # a plan leaving a request to no router
        size = len(stream[0].lengths)
        run_rollout(stream, "vllm", placement=np.zeros(len(predicted), dtype=np.int64), in_flight=10**6, replicas=2,
                    router="group_round_robin", refill=Refill(6, 1, passes, rule="verl", plan=lambda u, loads: (
                        np.arange(u.start * size, u.stop * size), np.full(len(u) * size, -1))), **COMMON)


def test_need_refill_submits_what_the_pass_share_says_is_missing():
    from lengthsched.filtering import need_refill

    assert need_refill(0, 5, 1, 2) == 0 and need_refill(-1, 0, 0, 0) == 0  # nothing missing
    assert need_refill(3, 0, 0, 0) == 6  # share 1/2 before anything finished: twice what is missing
    assert need_refill(3, 4, 0, 0) == 2  # four in flight expected to pass two
    assert need_refill(2, 8, 8, 8) == 0  # share 0.9: eight in flight are expected to pass 7.2
    assert need_refill(1, 40, 0, 98) == 60  # share 0.01: a hundred expected to be needed, forty already running
    assert need_refill(2, 0, 98, 98) == 3  # share 0.99: two are expected to pass 1.98
    assert need_refill(1, 0, 0, 0) == 2 and need_refill(1, 1, 0, 0) == 1


def test_lengthsched_refill_in_verls_steps_draws_fewer_and_throws_less_away():
    stream = _stream(400, seed=4, high=400)
    valid = np.random.default_rng(4).random(400) < 0.4
    runs = {need: run_oversampled_steps(stream, "vllm", batch=8, oversample=1.0, steps=5, partial=False, valid=valid,
                                        refill=True, refill_rule="verl", refill_cap=8, refill_need=need,
                                        in_flight=10**6, router="least_loaded", **COMMON) for need in (False, True)}
    for out in runs.values():
        assert all(len(s.kept) == 8 for s in out.steps)
    submitted = {need: sum(s.submitted for s in out.steps) for need, out in runs.items()}
    surplus = {need: sum(s.dropped_tokens for s in out.steps) for need, out in runs.items()}
    assert submitted[True] < submitted[False] and surplus[True] < surplus[False]


def test_a_refill_needs_slimes_semaphore_and_one_unit_per_group():
    from simulate.rollout import Refill

    stream = _stream(4)
    with pytest.raises(InvalidArgument, match="refill"):
        run_rollout(stream, "sglang", refill=Refill(2, 2, (True,) * 4), **COMMON)
    with pytest.raises(InvalidArgument, match="refill"):
        run_rollout(stream, "sglang", in_flight=8, refill=Refill(2, 2, (True,) * 3), **COMMON)
    with pytest.raises(InvalidArgument, match="refill"):
        run_rollout(stream, "sglang", in_flight=8, refill=Refill(2, 2, (True,) * 4, plan=lambda u, loads: None),
                    **COMMON)
    with pytest.raises(InvalidArgument, match="owners"):
        Refill(2, 2, (True,) * 2, owners=(0, 2))
    with pytest.raises(InvalidArgument, match="chunk"):
        Refill(2, 0, (True,) * 2)


def test_over_sampled_steps_with_refill_submit_more_where_the_filter_drops_groups():
    """refill=True: no step keeps fewer than batch while the stream lasts; a step submits whole chunks (its
    carried groups first); groups it never submitted are the next step's; with every group passing and enough
    over-sampling nothing changes."""
    stream = _stream(120, seed=3, high=400)
    fails = np.array([i % 3 == 0 for i in range(120)])
    common = dict(batch=4, oversample=1.0, steps=4, valid=~fails, replicas=2, router="cache_aware", in_flight=16,
                  **COMMON)
    old = run_oversampled_steps(stream, "sglang", partial=False, **common)
    new = run_oversampled_steps(stream, "sglang", partial=False, refill=True, keep_results=True, **common)
    assert old.shortfall > 0 and new.shortfall == 0
    assert all(s.submitted % 4 == 0 and s.submitted >= 8 for s in new.steps)  # at least one more chunk each
    drawn = sum(s.submitted for s in new.steps)
    seen = sorted(g for s in new.steps for g in s.kept) + [g for g in range(drawn) if fails[g]]
    assert set(seen) <= set(range(drawn))  # only groups of the stream's first `drawn` were used
    assert len([g for s in new.steps for g in s.kept]) == 16 and not any(fails[g] for s in new.steps for g in s.kept)
    for step, result in zip(new.steps, new.results):  # the step ends at its 4th finished group that passes
        finish = result.group_finish_seconds()
        assert np.isfinite(finish).sum() == step.submitted
    with_partial = run_oversampled_steps(stream, "sglang", partial=True, refill=True, **common)
    assert with_partial.shortfall == 0 and len({g for s in with_partial.steps for g in s.kept}) == 16
    everyone = dict(common, valid=None, oversample=1.5)
    a = run_oversampled_steps(stream, "sglang", partial=True, **everyone)
    b = run_oversampled_steps(stream, "sglang", partial=True, refill=True, **everyone)
    assert a.steps == b.steps
    with pytest.raises(InvalidArgument, match="carry_limit"):
        run_oversampled_steps(stream, "sglang", partial=True, refill=True, max_carry=1, carry_limit="wait", **common)


def test_slime_with_the_integration_plans_each_batch_when_slime_takes_it():
    """run_slime_planned(refill=): each chunk placed when submitted, from what the client still has per engine;
    one chunk for all the groups is the plan without dynamic sampling."""
    from simulate import run_slime_planned
    from simulate.rollout import Refill

    stream = _stream(12, seed=9, high=300)
    pred = np.concatenate([np.full(len(g.lengths), int(np.median(g.lengths))) for g in stream])
    common = dict(replicas=3, budget_tokens=1500, max_new_tokens=512, in_flight=20)
    plain, order = run_slime_planned(stream, pred, **common)
    whole, same = run_slime_planned(stream, pred, refill=Refill(12, 12, (True,) * 12), **common)
    assert whole.seconds == pytest.approx(plain.seconds, rel=1e-12) and np.array_equal(same, np.arange(12))
    fails = tuple(i % 2 == 0 for i in range(12))
    seen = []
    import lengthsched.integrations.slime as ls_slime

    real = ls_slime.SlimePlanner.plan

    def spy(self, groups, replicas, prompt_lens=None, loads=None):
        seen.append(None if loads is None else list(loads))
        return real(self, groups, replicas, prompt_lens=prompt_lens, loads=loads)

    ls_slime.SlimePlanner.plan = spy
    try:
        run, _ = run_slime_planned(stream, pred, placement="groups", refill=Refill(3, 3, fails), **common)
    finally:
        ls_slime.SlimePlanner.plan = real
    chunks = int(np.isfinite(run.released_seconds).sum()) // 3
    assert chunks >= 2 and len(seen) == chunks  # planned once per chunk slime took
    assert seen[0] == [0.0, 0.0, 0.0] and any(sum(x) > 0 for x in seen[1:])  # later chunks: from the engines' load
    sizes = [len(g.lengths) for g in stream]
    starts = np.cumsum([0] + sizes[:-1])
    for u in range(chunks * 3):  # whole groups ("groups"), each on one engine
        assert len(set(run.placement[starts[u]:starts[u] + sizes[u]].tolist())) == 1


def _ordered_spy(calls):
    """A run for run_oversampled_steps that records the prompt ids of each step's groups, in submission order."""
    def run(groups, policy, **kwargs):
        calls.append([g.prompt_id for g in groups])
        return run_rollout(groups, policy, **kwargs)
    return run


@settings(deadline=None, max_examples=25)
@given(seed=st.integers(0, 10**6), batch=st.integers(1, 4), oversample=st.sampled_from([1.0, 1.5]),
       partial=st.booleans(), refill=st.booleans())
def test_a_filter_history_hands_each_batch_over_likely_kept_first_and_learns_what_the_filter_did(seed, batch,
                                                                                                  oversample,
                                                                                                  partial, refill):
    """Every batch of ceil(batch x oversample) candidates likely-kept first (ties in stream order), the groups
    never submitted back in the stream or buffer (nothing lost or kept twice), and the history told of every
    group that finished in its step: kept, or dropped by the filter."""
    from lengthsched.filtering import FilterHistory
    from simulate.oversampling import submitted_per_step

    stream = _stream(80, size=3, seed=seed, high=300)
    fails = np.random.default_rng(seed).random(80) < 0.3
    history = FilterHistory()
    history.observe_many([g.prompt_id for g in stream], (~fails).tolist())  # one earlier epoch, the same outcomes
    before = history.groups
    calls = []
    extra = dict(in_flight=8, router="cache_aware") if refill else dict(router="least_loaded")
    out = run_oversampled_steps(stream, "sglang" if refill else "vllm", batch=batch, oversample=oversample, steps=3,
                                partial=partial, valid=~fails, refill=refill, filter_history=history,
                                run=_ordered_spy(calls), replicas=2, **extra, **COMMON)
    size = submitted_per_step(batch, oversample)
    index = {g.prompt_id: i for i, g in enumerate(stream)}
    for ids in calls if not partial else []:  # without carried groups every candidate is one group of the run
        for start in range(0, len(ids), size):
            block = [fails[index[p]] for p in ids[start:start + size]]
            assert block == sorted(block)  # the likely-kept (kept last epoch) first
    kept = [g for s in out.steps for g in s.kept]
    assert len(kept) == len(set(kept)) and not any(fails[g] for g in kept)
    assert len(kept) == 3 * batch - out.shortfall
    assert history.kept - (before - int(fails.sum())) == len(kept)  # every kept group told as kept
    assert history.groups - history.kept - int(fails.sum()) >= sum(s.filtered_tokens > 0 for s in out.steps)


def test_an_empty_filter_history_changes_nothing_where_every_prompt_is_new():
    from lengthsched.filtering import FilterHistory

    stream = _stream(60, seed=5, high=400)
    fails = np.array([i % 4 == 0 for i in range(60)])
    common = dict(batch=3, oversample=1.0, steps=4, valid=~fails, replicas=2, router="cache_aware", in_flight=12,
                  partial=True, refill=True, **COMMON)
    plain = run_oversampled_steps(stream, "sglang", **common)
    history = FilterHistory()
    ordered = run_oversampled_steps(stream, "sglang", filter_history=history, **common)
    assert plain.steps == ordered.steps
    assert history.groups == sum(len(s.kept) for s in plain.steps) + history.groups - history.kept
    assert history.kept == sum(len(s.kept) for s in plain.steps) and history.groups > history.kept


def test_each_batch_of_candidates_is_ordered_on_its_own():
    from lengthsched.filtering import FilterHistory
    from simulate.oversampling import _pass_order

    stream = _stream(7)
    history = FilterHistory(memory=None)
    history.observe_many(["p0", "p1", "p2", "p5"], [False, True, False, True])
    # batches of 3: [0, 1, 2] -> 1 first; [3, 4, 5] -> 5 (kept) before 3, 4 (unseen, the share); [6]
    assert _pass_order(list(range(7)), 3, history, stream) == [1, 0, 2, 5, 3, 4, 6]


def test_slime_with_the_integration_orders_each_batch_by_the_filter_history():
    """run_slime_planned(filter_history=): the planner hands each batch over likely-kept first (its own keys mapped
    back to the prompt ids the history knows), its submit order breaking ties."""
    import lengthsched.integrations.slime as ls_slime
    from lengthsched.filtering import FilterHistory
    from simulate import run_slime_planned
    from simulate.rollout import Refill

    stream = _stream(12, seed=9, high=300)
    pred = np.concatenate([np.full(len(g.lengths), int(np.median(g.lengths))) for g in stream])
    history = FilterHistory()
    history.observe_many([g.prompt_id for g in stream], [i % 2 == 1 for i in range(12)])  # the odd ones kept
    seen = []
    real = ls_slime.SlimePlanner.plan

    def spy(self, groups, replicas, prompt_lens=None, loads=None):
        out = real(self, groups, replicas, prompt_lens=prompt_lens, loads=loads)
        seen.append([g[0].index for g in out if g])
        return out

    ls_slime.SlimePlanner.plan = spy
    try:
        run_slime_planned(stream, pred, placement="groups", submit="batch", replicas=2, budget_tokens=1500,
                          max_new_tokens=512, in_flight=20, refill=Refill(6, 6, (True,) * 12),
                          filter_history=history)
        run_slime_planned(stream, pred, placement="groups", submit="batch", replicas=2, budget_tokens=1500,
                          max_new_tokens=512, in_flight=20, filter_history=history)
    finally:
        ls_slime.SlimePlanner.plan = real
    assert seen[0] == [1, 3, 5, 0, 2, 4]  # the first batch of 6: the kept ones first, each part in batch order
    assert seen[-1] == [1, 3, 5, 7, 9, 11, 0, 2, 4, 6, 8, 10]  # one batch of all twelve


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10**6), replicas=st.integers(1, 3), need=st.booleans(), poll=st.sampled_from([None, 2.0]),
       policy=st.sampled_from(["steal", "steal_observed"]))
def test_verls_stealing_manager_in_its_dynamic_sampling_loop_runs_every_request_it_is_given(seed, replicas, need,
                                                                                           poll, policy):
    """run_verl_stealing: the v1 stealing manager inside verl's loop submits what verl's rule asks for (the same
    units as verl's own run while no step has ended differently: here the first step's batch), every request it
    submits finishes, and each step keeps its batch of groups that pass."""
    from simulate.rollout import run_verl_stealing

    stream = _stream(120, seed=seed, high=400)
    valid = np.random.default_rng(seed).random(120) < 0.5
    predicted = np.repeat(np.random.default_rng(seed + 1).integers(1, 400, 120), len(stream[0].lengths))
    shared = dict(batch=5, oversample=1.0, steps=3, partial=False, valid=valid, refill=True, refill_rule="verl",
                  refill_cap=10, refill_need=need, refill_poll=poll, in_flight=10**6, router="least_loaded",
                  replicas=replicas, keep_results=True, **COMMON)
    out = run_oversampled_steps(stream, policy, predicted=predicted, run=run_verl_stealing, **shared)
    for step, result in zip(out.steps, out.results):
        assert len(step.kept) == 5 and all(valid[g] for g in step.kept)
        submitted = np.isfinite(np.asarray(result.released_seconds))
        # verl drains what it submitted (and sees the end at its next poll)
        assert step.seconds == pytest.approx(result.seconds if poll is None else math.ceil(result.seconds / poll)
                                             * poll, rel=1e-9)
        assert (result.placement >= 0).sum() == sum(len(stream[0].lengths) for _ in np.flatnonzero(submitted))
    assert len({g for s in out.steps for g in s.kept}) == 15


def test_verls_stealing_manager_plans_each_batch_beside_the_work_still_running(monkeypatch):
    import lengthsched.integrations.rollout as lr
    from simulate.rollout import Refill, run_verl_stealing

    calls = []
    real = lr.plan_rollout

    def recording(keys, predicted, **kwargs):
        calls.append((list(dict.fromkeys(keys)), kwargs))
        return real(keys, predicted, **kwargs)

    monkeypatch.setattr(lr, "plan_rollout", recording)
    stream = _stream(40, seed=5, high=400)
    passes = tuple(bool(x) for x in np.random.default_rng(5).random(40) < 0.4)
    predicted = np.repeat(np.random.default_rng(6).integers(1, 400, 40), len(stream[0].lengths))
    refill = Refill(batch=6, chunk=1, passes=passes, rule="verl", cap=12)  # refills as groups finish
    result = run_verl_stealing(stream, "steal", predicted=predicted, refill=refill, replicas=3, **COMMON)
    released = np.asarray(result.released_seconds)
    batches = [sorted(np.flatnonzero(released == t).tolist()) for t in sorted(set(released[np.isfinite(released)]))]
    assert [sorted(units) for units, _ in calls] == batches and len(calls) > 1  # one plan per release
    for units, kwargs in calls:
        assert (kwargs["placement"], kwargs["order"], kwargs["budget_tokens"]) == ("ways", "batch", COMMON[
            "budget_tokens"])
        assert list(kwargs["prompt_lens"]) == [stream[u].prompt_len for u in units for _ in stream[u].lengths]
    assert not np.any(calls[0][1]["loads"]) and any(np.any(kwargs["loads"]) for _, kwargs in calls[1:])
    # (a later batch is placed beside the predicted tokens of the earlier ones still running)
    submitted = np.flatnonzero(np.isfinite(released))
    assert (result.placement >= 0).sum() == len(submitted) * len(stream[0].lengths)
    # lengthsched.placement=spread: row i of each batch to replica i mod R, placed without the loads
    calls.clear()
    spread = run_verl_stealing(stream, "steal", predicted=predicted, refill=refill, replicas=3, placement="spread",
                               **COMMON)
    assert calls and all(kwargs["placement"] == "spread" and kwargs["loads"] is None for _, kwargs in calls)
    assert (spread.placement >= 0).sum() == (result.placement >= 0).sum()
    for bad, kwargs in ((dict(policy="vllm"), {}), (dict(refill=Refill(6, 2, passes)), {}),
                        ({}, dict(router="cache_aware")), ({}, dict(in_flight=3)), ({}, dict(placement="classes"))):
        args = dict(policy="steal", refill=refill) | bad
        with pytest.raises(InvalidArgument, match=next(iter(bad or kwargs))):
            run_verl_stealing(stream, args.pop("policy"), predicted=predicted, **args, replicas=3, **kwargs, **COMMON)
    plan = Refill(6, 1, passes, rule="verl", plan=lambda units, loads: (np.zeros(0, dtype=np.int64),) * 2)
    with pytest.raises(InvalidArgument, match="refill"):  # a stealing policy runs a plan, not a router's cap
        run_rollout(stream, "steal", replicas=2, in_flight=10**6, refill=plan, **COMMON)
    with pytest.raises(InvalidArgument, match="refill"):
        run_rollout(stream, "steal", replicas=2, refill=Refill(6, 1, passes, rule="verl"), **COMMON)
    leaves = Refill(6, 1, passes, rule="verl", plan=lambda units, loads: (
        np.arange(units.start * 4, units.stop * 4), np.full(len(units) * 4, -1)))
    with pytest.raises(InvalidArgument, match="refill"):  # every request needs its replica
        run_rollout(stream, "steal", replicas=2, refill=leaves, **COMMON)
