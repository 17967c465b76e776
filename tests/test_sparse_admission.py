"""Admission by a compressed KV cache (Sparse-RL): a sequence holds at most ``budget + interval``
generated tokens, the engine counts that ceiling, and the token-granular policies admit by it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthsched import KVCompression
from lengthsched.errors import InvalidArgument
from lengthsched.runtime import Engine, Problem, make_policy
from lengthsched.runtime.policies import slot_cap
from simulate import run_batch, run_group
from simulate.run import lower_bound, retained_kv_curve
from simulate.workloads import Group

# The policies that promise a budget and run a compressed cache (the SGLang models keep their own reservations).
BUDGETED = ["micro", "fixed_slot", "reserve_max", "length_aware", "length_aware_lpt", "growth_aware",
            "growth_aware_fcfs", "sglang", "sglang_priority", "vllm", "vllm_priority", "steal"]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), block=st.sampled_from([1, 4, 16]), cap=st.integers(1, 40),
       tails=st.booleans())
def test_the_engines_capped_counts_are_those_of_each_sequence(seed, block, cap, tails):
    """The engine's running sums with kv_cap (rows growing and rows at the cap, the steps they reach it) give what
    each live row holds and reads, summed: at every event, now and at later steps, through admissions of fresh and
    resumed rows, preemptions and finishes."""
    rng = np.random.default_rng(seed)
    n = 12
    lengths = rng.integers(1, 90, n)
    tail = rng.integers(0, block, n) if tails and block > 1 else np.zeros(n, dtype=np.int64)
    eng = Engine(lengths, tails=tail if tails and block > 1 else None, block_size=block, kv_cap=cap)
    eng.done = [int(x) for x in np.where(rng.random(n) < 0.3, rng.integers(1, 60, n), 0)]
    eng.length = [max(int(a), d + 1) for a, d in zip(lengths, eng.done)]

    def brute(at):
        ages = {j: at - o for j, o in eng.origin.items()}
        held = {j: int(tail[j]) + min(a, cap) for j, a in ages.items()}
        return (sum(-(-h // block) for h in held.values()), sum(min(a, cap) for a in ages.values()),
                sum(a < cap for a in ages.values()))

    for _ in range(40):
        waiting = [j for j in range(n) if j not in eng.origin and not eng.finished_at[j]]
        for j in rng.permutation(waiting)[:int(rng.integers(0, 3))]:
            eng.admit(int(j))
        if eng.running and rng.random() < 0.2:
            eng.preempt(int(rng.choice(list(eng.running))))
        if not eng.origin:
            if not waiting:
                break
            continue
        for ahead in (0, 1, 3, 17, 60):
            blocks, held, _ = brute(eng.t + ahead)
            assert eng.held_generated(eng.t + ahead) == held
            if block > 1:  # (with blocks of one token and no tails the engine counts tokens, not blocks)
                assert eng.blocks(eng.t + ahead) == blocks
        _, _, growing = brute(eng.t)
        assert eng.growing() == growing
        if block > 1:
            want = {}
            for j, o in eng.origin.items():
                age = eng.t - o
                s = (-(int(tail[j]) + min(age, cap))) % block + 1
                if age + s - 1 < cap:
                    want[s] = want.get(s, 0) + 1
            assert eng.first_block_needs() == sorted(want.items())
        nxt = eng.next_finish()
        eng.advance(min(nxt, eng.t + int(rng.integers(1, 30))), pads=False)
    log = eng.step_log()
    assert (log.growth <= log.rows).all()


def test_the_engine_counts_each_sequence_up_to_its_cap():
    eng = Engine([50, 50, 50], kv_cap=10)
    eng.admit(0)
    eng.advance(4, pads=False)
    eng.admit(1)
    eng.advance(12, pads=False)
    eng.admit(2)
    ages = {0: 12, 1: 8}
    assert eng.held_generated() == sum(min(a, 10) for a in ages.values()) == eng.kv_tokens()
    assert eng.growing() == 2  # job 0 holds its cap; job 1 and the newly admitted job 2 grow
    for at in (13, 15, 30):  # job 2 starts at step 13
        want = min(at, 10) + min(at - 4, 10) + min(at - 12, 10)
        assert eng.kv_tokens(at) == want
    uncapped = Engine([50, 50], kv_cap=None)
    uncapped.admit(0)
    uncapped.advance(20, pads=False)
    assert uncapped.kv_tokens() == uncapped.sum_ages() == 20 and uncapped.growing() == 1


def test_blocks_count_the_capped_tokens_and_the_tail():
    eng = Engine([60, 60, 60], tails=[5, 5, 0], block_size=16, kv_cap=20)
    eng.admit(0)
    eng.advance(3, pads=False)
    eng.admit(1)
    eng.advance(30, pads=False)
    eng.admit(2)
    for at in (30, 31, 40, 50):
        held = [5 + min(at, 20), 5 + min(at - 3, 20), min(at - 30, 20)]
        assert eng.blocks(at) == sum(-(-h // 16) for h in held)
        assert eng.kv_tokens(at) == 16 * eng.blocks(at)
    # jobs 0 and 1 hold 25 tokens (2 blocks) for ever; job 2 (0 tokens) needs a block at once, then at 16
    assert eng.first_block_needs() == [(1, 1)]
    eng.advance(40, pads=False)
    assert eng.first_block_needs() == [(7, 1)]  # it holds 10: its 17th token opens a block, and 17 < 20


def test_a_cap_is_checked_and_a_policy_that_cannot_count_one_refuses_it(monkeypatch):
    """Every registered policy runs a compressed cache; one registered without ``compressed`` (the flag that keeps a
    policy that cannot count a cache from running with one) is refused naming compression, in both modes."""
    import dataclasses

    from lengthsched.runtime.registry import POLICIES
    from simulate import run_rollout

    with pytest.raises(InvalidArgument, match="kv_cap"):
        Engine([10], kv_cap=0)
    assert all(spec.compressed for spec in POLICIES.values())
    monkeypatch.setitem(POLICIES, "steal_sglang", dataclasses.replace(POLICIES["steal_sglang"], compressed=False))
    with pytest.raises(InvalidArgument, match="compression.*steal_sglang"):
        run_group([10, 20], "steal_sglang", budget_tokens=64, max_new_tokens=32, compression=KVCompression(8, 4))
    with pytest.raises(InvalidArgument, match="compression.*steal_sglang"):
        run_rollout([Group("p", 0, np.array([10, 20]))], "steal_sglang", replicas=2, budget_tokens=64,
                    max_new_tokens=32, compression=KVCompression(8, 4))
    for policy in ("seer", "seer_divided", "placed_lpt", "placed_adaptive"):  # on one engine: vLLM's, capped
        kw = dict(budget_tokens=64, max_new_tokens=32)  # four blocks of 16: two of 30 tokens, or four capped at 12
        dense = run_group([30, 30, 30, 30], policy, **kw)
        run = run_group([30, 30, 30, 30], policy, compression=KVCompression(8, 4), **kw)
        assert run.peak_kv_tokens <= 64 and run.preemptions == 0 < dense.preemptions, policy
    with pytest.raises(InvalidArgument, match="compression"):
        run_group([10, 20], "micro", budget_tokens=64, max_new_tokens=32, compression=(8, 4))


def test_slots_and_budget_checks_count_what_a_sequence_holds():
    assert slot_cap("micro", slots=None, budget_tokens=4096, max_new_tokens=1024) == 4
    assert slot_cap("micro", slots=None, budget_tokens=4096, max_new_tokens=1024, kv_cap=288) == 14
    assert slot_cap("micro", slots=6, budget_tokens=4096, max_new_tokens=1024, kv_cap=288) == 6
    with pytest.raises(InvalidArgument, match="budget_tokens"):
        run_group([900, 20], "micro", budget_tokens=500, max_new_tokens=1024)
    one = run_group([900, 20], "micro", budget_tokens=500, max_new_tokens=1024, compression=KVCompression(256, 32))
    assert one.steps == 920 and one.max_live == 1  # 500 // 288: one at a time
    two = run_group([900, 20], "micro", budget_tokens=600, max_new_tokens=1024, compression=KVCompression(256, 32))
    assert two.steps == 900 and two.max_live == 2 and two.peak_kv_tokens <= 600


def test_the_lower_bound_counts_the_capped_area():
    lengths = np.array([10, 30])
    # KV-steps held: uncapped 55 + 465 = 520; capped at 8: (36 + 2 * 8) + (36 + 22 * 8) = 264
    assert lower_bound(lengths, slots=None, budget_tokens=20) == 30  # the longest dominates
    assert lower_bound(lengths, slots=None, budget_tokens=10) == 52
    assert lower_bound(lengths, slots=None, budget_tokens=10, kv_cap=8) == 30
    assert lower_bound(lengths, slots=None, budget_tokens=5, kv_cap=8) == 53  # ceil(264 / 5)
    assert lower_bound(lengths, slots=None, budget_tokens=5, kv_cap=100) == 104  # a cap above every length


def test_a_compressed_cache_admits_more_and_finishes_sooner():
    rng = np.random.default_rng(3)
    lengths = np.minimum(rng.lognormal(6.5, 0.8, 32).astype(np.int64) + 1, 2048)
    for policy in ("micro", "fixed_slot", "length_aware", "growth_aware", "vllm", "vllm_priority"):
        dense = run_group(lengths, policy, budget_tokens=4 * 2048, max_new_tokens=2048, predicted=lengths)
        sparse = run_group(lengths, policy, budget_tokens=4 * 2048, max_new_tokens=2048, predicted=lengths,
                           compression=KVCompression(256, 32))
        assert sparse.steps < dense.steps and sparse.seconds < dense.seconds
        # more at once, or (vLLM admits greedily either way) fewer preemptions
        assert sparse.max_live > dense.max_live or sparse.preemptions < dense.preemptions
        assert sparse.peak_retained_kv_tokens <= sparse.peak_kv_tokens <= 4 * 2048
        assert sorted(sparse.collected_lengths.tolist()) == sorted(lengths.tolist())


def test_run_batch_takes_a_compression():
    groups = [Group("a", 30, np.array([300, 40, 200])), Group("b", 10, np.array([120, 500]))]
    dense = run_batch(groups, "length_aware", budget_tokens=600, max_new_tokens=512)
    sparse = run_batch(groups, "length_aware", budget_tokens=600, max_new_tokens=512, compression=KVCompression(64, 16))
    assert sparse.steps < dense.steps and sparse.peak_kv_tokens <= 600


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=24), st.integers(1, 120), st.integers(1, 40),
       st.integers(0, 3), st.sampled_from(BUDGETED), st.integers(0, 10**6))
def test_compressed_runs_keep_the_budget_and_the_bound(lengths, cap_budget, interval, room, policy, seed):
    lengths = np.asarray(lengths, dtype=np.int64)
    comp = KVCompression(cap_budget, interval)
    held = min(int(lengths.max()), comp.max_retained)
    L = int(lengths.max())
    # The policies that reserve max_new_tokens need budget // min(L, cap) >= 1; the SGLang models L + 2 tokens
    # more; vLLM's blocks of 16 the prompt's partial block (7 tokens) and the capped length, rounded up.
    one = -(-(7 + held) // 16) * 16 if policy.startswith(("vllm", "steal")) else held
    budget = one * (1 + room) + (L + 2 if policy.startswith("sglang") else 0)
    predicted = np.maximum(1, (lengths * np.random.default_rng(seed).lognormal(0, 0.5, len(lengths))).astype(int))
    res = run_group(lengths, policy, budget_tokens=budget, max_new_tokens=L, predicted=predicted, compression=comp,
                    prompt_len=7)
    assert res.peak_kv_tokens <= budget
    curve = retained_kv_curve(res.timeline, comp, res.steps)
    assert curve.max() == res.peak_retained_kv_tokens <= res.peak_kv_tokens
    assert res.steps >= res.lower_bound and res.seconds >= res.lower_bound_seconds * (1 - 1e-12)
    assert sorted(res.collected_lengths.tolist()) == sorted(lengths.tolist())
    if comp.max_retained >= L:  # a cap above every length changes nothing
        dense = run_group(lengths, policy, budget_tokens=budget, max_new_tokens=L, predicted=predicted, prompt_len=7)
        assert (res.steps, res.seconds, res.preemptions) == (dense.steps, dense.seconds, dense.preemptions)


def _brute_delay(ages, left_live, start, left, cap, budget):
    """The fewest steps d to wait so that the live sequences' capped predicted curves plus the newcomer's
    stay within ``budget`` at every step u = d + 1 .. d + left (the definition, step by step)."""
    horizon = int(left_live.max())
    for d in range(horizon + 1):
        if all(sum(min(a + u, cap) for a, r in zip(ages, left_live) if r >= u) + min(start + u - d, cap) <= budget
               for u in range(d + 1, min(d + left, horizon) + 1)):
            return d
    return None


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 40)), min_size=1, max_size=6),
       st.integers(0, 20), st.integers(1, 40), st.integers(1, 60), st.integers(1, 200))
def test_the_capped_delay_is_the_first_feasible_start(live, start, left, cap, budget):
    ages = np.array([a for a, _ in live], dtype=np.int64)
    left_live = np.array([r for _, r in live], dtype=np.int64)
    if min(start + left, cap) > budget:
        return
    policy = make_policy("growth_aware", Problem(lengths=np.ones(1, dtype=np.int64), max_new_tokens=1,
                                                 budget_tokens=budget, kv_cap=cap))
    assert policy._capped_delay(ages, left_live, start, left, cap) == _brute_delay(ages, left_live, start, left, cap,
                                                                                   budget)


def test_rows_read_the_capped_kv_step_by_step():
    """The step log with a cap: split where a row reaches it, each run's reads growing by the rows still below
    it; expanded step by step it is the brute-force read (context + min(generated before the step, cap))."""
    eng = Engine([30, 30, 12], kv_cap=10, context=[5, 5, 7])
    origins = {}
    for job, at in ((0, 0), (1, 4), (2, 25)):
        while eng.t < at:
            eng.advance(min(at, eng.next_finish()), pads=False)
        eng.admit(job)
        origins[job] = at
    while eng.origin:
        eng.advance(eng.next_finish(), pads=False)
    log = eng.step_log()
    expanded = np.concatenate([kv + g * np.arange(n) for n, kv, g in zip(log.steps, log.kv_first, log.growth)])
    lengths = {0: 30, 1: 30, 2: 12}
    context = {0: 5, 1: 5, 2: 7}
    brute = [sum(context[j] + min(t - 1 - origins[j], 10) for j in origins if origins[j] < t <= origins[j] + lengths[j])
             for t in range(1, eng.t + 1)]
    assert expanded.tolist() == brute
    assert (log.growth < log.rows).any() and (log.growth == log.rows).any()  # some runs have rows at the cap


def _rollout_groups(rng, prompts, size, longest):
    return [Group(f"p{i}", int(rng.integers(0, 300)),
                  np.minimum(np.maximum(1, rng.lognormal(np.log(longest / 4), 1.0, size).astype(np.int64)), longest))
            for i in range(prompts)]


def test_a_rollout_step_with_a_compressed_cache():
    from simulate import run_rollout

    groups = _rollout_groups(np.random.default_rng(5), 32, 8, 2048)
    comp = KVCompression(256, 32)
    for policy in ("vllm", "vllm_priority", "sglang", "steal"):
        for router in ("least_loaded", "group_round_robin"):
            dense = run_rollout(groups, policy, replicas=4, router=router, budget_tokens=3 * 2048, max_new_tokens=2048)
            sparse = run_rollout(groups, policy, replicas=4, router=router, budget_tokens=3 * 2048,
                                 max_new_tokens=2048, compression=comp)
            assert sparse.lower_bound_seconds <= sparse.seconds < dense.seconds
            assert sparse.lower_bound_seconds < dense.lower_bound_seconds  # capped reads and KV area
            assert max(sparse.peak_kv_tokens) <= 3 * 2048
            assert [sorted(x.tolist()) for x in sparse.collected_lengths] == [sorted(g.lengths.tolist())
                                                                             for g in groups]
    # a cap above every length changes nothing
    same = run_rollout(groups, "vllm", replicas=4, budget_tokens=3 * 2048, max_new_tokens=2048,
                       compression=KVCompression(4096, 8))
    dense = run_rollout(groups, "vllm", replicas=4, budget_tokens=3 * 2048, max_new_tokens=2048)
    assert (same.seconds, same.preemptions, same.lower_bound_seconds) == (dense.seconds, dense.preemptions,
                                                                          dense.lower_bound_seconds)
    # a bad cache is named
    with pytest.raises(InvalidArgument, match="compression"):
        run_rollout(groups, "vllm", replicas=4, budget_tokens=3 * 2048, max_new_tokens=2048, compression=(256, 32))
    # behind a framework's in-flight cap (slime's), routed one at a time, and from a client's queues
    for policy, router in (("vllm", "least_loaded"), ("sglang", "cache_aware")):
        kw = {"replicas": 4, "router": router, "budget_tokens": 3 * 2048, "max_new_tokens": 2048, "in_flight": 64}
        dense, sparse = run_rollout(groups, policy, **kw), run_rollout(groups, policy, compression=comp, **kw)
        assert sparse.lower_bound_seconds <= sparse.seconds < dense.seconds
    placement = np.arange(sum(len(g.lengths) for g in groups)) % 4
    windowed = run_rollout(groups, "sglang", replicas=4, budget_tokens=3 * 2048, max_new_tokens=2048,
                           placement=placement, client_window=1.0, in_flight=64, compression=comp,
                           predicted=np.concatenate([g.lengths for g in groups]))
    assert windowed.lower_bound_seconds <= windowed.seconds and max(windowed.peak_kv_tokens) <= 3 * 2048


def test_a_client_window_counts_the_compressed_kv_a_request_holds():
    """Behind a client window (run_rollout(client_window=)) a request counts its prompt plus at most the cache's
    budget + interval predicted tokens: eight completions of 2,000 tokens (prompt 100) fit a window of one pool
    of 4,096 tokens at once with a 256 + 32 cache (8 x 388 tokens), so the window holds nothing back: the run is
    the same as without a window; counting the whole predictions (2,100 each) would send one at a time."""
    from simulate import run_rollout

    groups = [Group("p", 100, np.full(8, 2000))]
    kw = dict(replicas=1, budget_tokens=4096, max_new_tokens=2048, placement=np.zeros(8, dtype=np.int64),
              predicted=np.full(8, 2000), compression=KVCompression(256, 32), in_flight=8)
    windowed, free = run_rollout(groups, "vllm", client_window=1.0, **kw), run_rollout(groups, "vllm", **kw)
    assert (windowed.seconds, windowed.steps) == (free.seconds, free.steps) and windowed.preemptions == 0
    assert windowed.steps == 2000  # all eight at once
    dense = {k: v for k, v in kw.items() if k != "compression"}
    one_by_one = run_rollout(groups, "vllm", client_window=1.0, **dense)
    assert one_by_one.steps > 2 * 2000 and one_by_one.preemptions == 0  # a dense window sends one, then the next


def test_an_offloaded_request_loads_back_the_compressed_kv_it_held():
    eng = Engine([100, 100], kv_cap=10)
    eng.offload = True
    eng.admit(0)
    eng.advance(30, pads=False)
    eng.preempt(0)  # 30 tokens generated, 10 held
    eng.admit(0)
    assert eng.loaded_tokens == 10 == eng.loaded_kv(0) < eng.own_kv(0) == 30 and eng.recomputed_tokens == 0
    from simulate import run_rollout

    groups = _rollout_groups(np.random.default_rng(5), 32, 8, 2048)
    for mode in (True, "stall"):
        for policy in ("vllm", "steal"):
            kw = {"replicas": 4, "budget_tokens": 3 * 2048, "max_new_tokens": 2048, "kv_offload": mode}
            dense = run_rollout(groups, policy, **kw)
            sparse = run_rollout(groups, policy, compression=KVCompression(256, 32), **kw)
            assert sparse.lower_bound_seconds <= sparse.seconds < dense.seconds
            assert sparse.loaded_tokens < dense.loaded_tokens and max(sparse.peak_kv_tokens) <= 3 * 2048


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 6), st.integers(1, 64), st.integers(8, 400), st.integers(1, 4),
       st.sampled_from(["vllm", "vllm_priority", "sglang", "sglang_priority", "steal", "steal_longest",
                        "steal_observed"]),
       st.sampled_from(["least_loaded", "group_round_robin", "contiguous_chunks"]))
def test_compressed_rollouts_keep_their_bound(seed, replicas, interval, cap_budget, room, policy, router):
    from simulate import run_rollout

    rng = np.random.default_rng(seed)
    groups = _rollout_groups(rng, int(rng.integers(1, 12)), int(rng.integers(1, 9)), 600)
    comp = KVCompression(cap_budget, interval)
    longest = max(int(g.lengths.max()) for g in groups)
    budget = (316 + min(longest, comp.max_retained) + 16) * room + (600 + 2 if policy.startswith("sglang") else 0)
    res = run_rollout(groups, policy, replicas=replicas, router=router, budget_tokens=budget, max_new_tokens=600,
                      compression=comp, predicted=np.concatenate([g.lengths for g in groups]))
    assert res.lower_bound_seconds <= res.seconds * (1 + 1e-12)
    assert max(res.peak_kv_tokens) <= budget


def test_the_memory_curve_has_a_corner_where_a_sequence_reaches_the_cap():
    """Timeline.kv with a cap: a point where each sequence stops growing, so the curve drawn straight between
    points is the KV held (job 0 from step 0, job 1 from step 5, both capped at 10 generated tokens)."""
    eng = Engine([50, 30], kv_cap=10, record=True)
    eng.admit(0)
    eng.advance(5, pads=False)
    eng.admit(1)
    while eng.origin:
        eng.advance(eng.next_finish(), pads=False)
    assert eng.timeline.kv == [(0, 0), (5, 5), (10, 15), (15, 20), (35, 20), (35, 10), (50, 10), (50, 0)]


def test_steals_crowding_rule_weighs_whole_predictions_unless_told_to_weigh_what_the_cache_holds():
    """steal_ways with a compressed cache: by default the crowding rule (whole groups once the step's predicted
    tokens fill CROWDED_POOLS pools a replica) weighs whole predictions, so the cache changes no spread; with
    WorkStealing.CROWD_HELD each prediction counts at most the cache's budget + interval."""
    from lengthsched.runtime.dispatch import WorkStealing
    from simulate.rollout import steal_ways

    groups = [Group(f"p{i}", 200, np.full(16, 2000)) for i in range(32)]
    pred = np.full(32 * 16, 2000.0)
    # 32 x 16 x 2,000 tokens over 4 replicas = 62 pools of 2,048 each: crowded, whole groups
    assert steal_ways(groups, pred, 2048, 4, 4096)[1] == 1 == steal_ways(groups, pred, 2048, 4, 4096, kv_cap=288)[1]
    saved = WorkStealing.CROWD_HELD
    try:
        WorkStealing.CROWD_HELD = True  # 32 x 16 x 288 / 4 = 18 pools: crowded still; at 8,192 tokens a pool not
        assert steal_ways(groups, pred, 2048, 4, 4096, kv_cap=288)[1] == 1
        assert steal_ways(groups, pred, 8192, 4, 4096)[1] == 1  # without a cache: 15.6 pools, crowded
        assert steal_ways(groups, pred, 8192, 4, 4096, kv_cap=288)[1] > 1
    finally:
        WorkStealing.CROWD_HELD = saved


def test_asynchronous_loops_run_a_compressed_cache(monkeypatch):
    """run_async_rollout and run_verl_async take compression= (as run_rollout): in a tight pool every engine that
    runs one is faster with it and never holds more than its pool; a cap above every length changes nothing;
    steal on SGLang's engines (steal_sglang) runs one too; run_sync_steps passes it to run_rollout."""
    import simulate.asynchronous as asy

    built = []

    def recording(*args, **kwargs):
        eng = _engine(*args, **kwargs)
        built.append(eng)
        return eng

    _engine = asy._engine
    monkeypatch.setattr(asy, "_engine", recording)
    rng = np.random.default_rng(3)
    groups = [Group(f"p{i}", int(rng.integers(50, 300)), rng.integers(50, 2000, 8)) for i in range(40)]
    pred = np.concatenate([np.full(8, int(np.median(g.lengths))) for g in groups])
    comp = KVCompression(256, 32)
    kw = dict(batch=8, steps=3, train_seconds=1.0, replicas=2, budget_tokens=2 * 2048, max_new_tokens=2048)
    runs = [(asy.run_async_rollout, dict(policy="sglang", max_staleness=1)),
            (asy.run_async_rollout, dict(policy="vllm", max_staleness=1)),
            (asy.run_async_rollout, dict(policy="vllm", max_staleness=1, router="placed", steal=True, predicted=pred)),
            (asy.run_async_rollout, dict(policy="vllm", max_staleness=1, router="placed", steal=True, predicted=pred,
                                         snapshot_seconds=0.25)),
            (asy.run_async_rollout, dict(policy="sglang", max_staleness=2, router="stream", predicted=pred)),
            (asy.run_verl_async, dict(policy="vllm", staleness_threshold=0.5, local_steps=2)),
            (asy.run_verl_async, dict(policy="vllm", staleness_threshold=0.5, local_steps=2, steal=True,
                                      predicted=pred, router="placed"))]
    for run, extra in runs:
        dense = run(groups, **kw, **extra)
        built.clear()
        sparse = run(groups, **kw, **extra, compression=comp)
        assert sparse.seconds < dense.seconds, extra
        assert built and max(eng.peak_kv for eng in built) <= 2 * 2048
        assert sparse.consumed_tokens > 0 and sparse.steps and len(sparse.steps) == len(dense.steps)
        wide = run(groups, **kw, **extra, compression=KVCompression(4096, 8))  # holds every length whole
        assert (wide.seconds, wide.recomputed_tokens, wide.preemptions) == (dense.seconds, dense.recomputed_tokens,
                                                                            dense.preemptions)
    built.clear()
    on_sglang = asy.run_async_rollout(groups, **kw, policy="sglang", max_staleness=1, router="placed", steal=True,
                                      predicted=pred, compression=comp)
    assert on_sglang.consumed_tokens > 0 and max(eng.peak_kv for eng in built) <= 2 * 2048
    sync = {c: asy.run_sync_steps(groups, "steal", batch=8, steps=3, train_seconds=1.0, predicted=pred, replicas=2,
                                  budget_tokens=4096, max_new_tokens=2048, compression=c) for c in (None, comp)}
    assert sync[comp].seconds < sync[None].seconds


def test_sglang_admits_a_resumed_request_by_the_compressed_kv_it_will_hold():
    """A request that comes back with more tokens than the pool (retracted, or aborted by a weight update in an
    asynchronous loop) holds at most the cap once recomputed: SGLang's admission counts that, not all its tokens
    (found by a random asynchronous run with a pool of 560 tokens and a cap of 159, which stalled: 'nothing live
    and nothing admitted')."""
    problem = Problem(lengths=np.array([400, 400]), max_new_tokens=400, budget_tokens=120, kv_cap=20)
    pol = make_policy("sglang", problem)
    eng = Engine([400, 400], kv_cap=20)
    eng.start(pol)
    pol.waiting = []  # the test admits by hand
    eng.admit(0)
    eng.advance(300, pads=False)
    eng.preempt(0)  # 300 tokens generated: far more than the pool, 20 held
    pol.waiting.append(0)
    pol.decide(eng)
    assert list(eng.running) == [0] and eng.kv_tokens(eng.t + 1) <= 120


def test_seers_anchors_and_the_placing_policies_run_a_compressed_cache():
    """seer, seer_divided (its global pool carries the compressed KV: fewer tokens loaded),
    placed_lpt and placed_adaptive take compression=: faster than dense in a tight pool, within every pool, above
    their bound; so do placed_classes and steal_classes, their classes planned on the capped KV (without it the
    class plan refused pools that only the cache makes room in); and steal_sglang, its room to steal counted
    uncompressed (SGLang reserves whole lengths)."""
    from simulate import run_rollout

    groups = _rollout_groups(np.random.default_rng(9), 24, 8, 2048)
    pred = np.concatenate([np.full(len(g.lengths), max(1, int(np.median(g.lengths)))) for g in groups])
    comp = KVCompression(256, 32)
    kw = dict(replicas=4, budget_tokens=3 * 2048, max_new_tokens=2048, predicted=pred)
    for policy in ("seer", "seer_divided", "placed_lpt", "placed_adaptive", "placed_classes", "steal_classes"):
        dense, sparse = run_rollout(groups, policy, **kw), run_rollout(groups, policy, compression=comp, **kw)
        assert sparse.lower_bound_seconds <= sparse.seconds < dense.seconds, policy
        assert max(sparse.peak_kv_tokens) <= 3 * 2048
        assert [sorted(x.tolist()) for x in sparse.collected_lengths] == [sorted(g.lengths.tolist()) for g in groups]
        if policy == "seer_divided":  # every load is a request's compressed KV: its tail and at most 288 tokens
            assert 0 < sparse.loaded_tokens < dense.loaded_tokens
    dense = run_rollout(groups, "steal_sglang", **kw)
    sparse = run_rollout(groups, "steal_sglang", compression=comp, **kw)
    assert sparse.lower_bound_seconds <= sparse.seconds < dense.seconds and max(sparse.peak_kv_tokens) <= 3 * 2048
    # a pool of 400 tokens: no completion of up to 2,048 fits whole, every one with the cache (prompts < 300)
    tight = dict(kw, budget_tokens=400 + 288)
    for policy in ("placed_classes", "steal_classes"):
        run = run_rollout(groups, policy, compression=comp, **tight)
        assert max(run.peak_kv_tokens) <= 688 and run.lower_bound_seconds <= run.seconds


def test_length_classes_and_their_estimates_count_a_compressed_cache():
    """estimate_seconds, length_classes and plan_length_classes take kv_cap: a cap above every length changes
    nothing; a tight one lowers each replica's bound (its KV area and reads)."""
    from lengthsched.placement import estimate_seconds, length_classes, plan_length_classes
    from lengthsched.runtime.timing import default_cost

    rng = np.random.default_rng(4)
    lengths = rng.integers(50, 3000, 64).astype(np.float64)
    group = np.repeat(np.arange(8), 8)
    prompts = rng.integers(50, 300, 8)
    cost = default_cost()
    kw = dict(replicas=4, budget_tokens=4096, cost=cost)
    placed = length_classes(lengths, prompts[group], **kw)
    assert np.array_equal(placed, length_classes(lengths, prompts[group], kv_cap=10_000, **kw))
    full = estimate_seconds(placed, lengths, group, prompts, **kw)
    assert np.array_equal(full, estimate_seconds(placed, lengths, group, prompts, kv_cap=10_000, **kw))
    capped = estimate_seconds(placed, lengths, group, prompts, kv_cap=288, **kw)
    assert np.all(capped <= full) and np.any(capped < full)
    assert np.array_equal(plan_length_classes(lengths, group, prompts, **kw),
                          plan_length_classes(lengths, group, prompts, kv_cap=10_000, **kw))


def test_steal_observeds_coordinator_counts_the_compressed_cache():
    """steal_observed decides through a StealCoordinator: with a cache its room counts the cap, as steal's does
    (Problem.kv_cap reaches the coordinator), and a compressed step still collects every completion."""
    from lengthsched.runtime.dispatch import StealObserved
    from simulate import run_rollout
    from simulate.rollout import observe_board

    problem = Problem(lengths=np.array([10, 20]), max_new_tokens=32, budget_tokens=100, kv_cap=12)
    pols = [StealObserved(problem), StealObserved(problem)]
    coord = observe_board(pols, 100)
    assert coord.kv_cap == 12 and all(pol.coord is coord for pol in pols)
    groups = _rollout_groups(np.random.default_rng(12), 16, 8, 2048)
    run = run_rollout(groups, "steal_observed", replicas=3, budget_tokens=2 * 2048, max_new_tokens=2048,
                      compression=KVCompression(256, 32))
    assert [sorted(x.tolist()) for x in run.collected_lengths] == [sorted(g.lengths.tolist()) for g in groups]
    assert max(run.peak_kv_tokens) <= 2 * 2048


def test_steals_room_counts_the_cap_and_steal_sglangs_counts_whole_lengths():
    """The predicted peak a stealing replica compares with its pool: capped at the cache's most for steal (vLLM's
    engine holds that), whole for steal_sglang (SGLang's admission reserves whole remaining lengths)."""
    from lengthsched.runtime.dispatch import StealSGLang, WorkStealing

    problem = Problem(lengths=np.array([500, 300]), max_new_tokens=512, budget_tokens=4096, kv_cap=100,
                      predicted=np.array([500, 300]))
    for cls, expected in ((WorkStealing, 100 + 100), (StealSGLang, 500 + 300)):
        pol = cls(problem)
        eng = Engine([500, 300], kv_cap=100)
        eng.start(pol)
        pol.waiting = []
        eng.admit(0)
        eng.admit(1)
        eng.advance(10, pads=False)
        assert pol._predicted_peak(eng) == expected, cls.__name__
        # a watermark's admission counts a request as the room does (capped for steal, whole for steal_sglang)
        assert pol._admission_need(eng, 1) == expected - (100 if cls is WorkStealing else 500), cls.__name__


def _resumed_step(seed=0, prompts=12, size=4):
    """A step whose completions partly resume (what they had, what they have left, predictions of what is left)."""
    rng = np.random.default_rng(seed)
    groups = [Group(f"p{i}", int(rng.integers(20, 200)), rng.integers(30, 700, size)) for i in range(prompts)]
    left = np.concatenate([g.lengths for g in groups])
    had = np.where(rng.random(len(left)) < 0.4, rng.integers(1, 600, len(left)), 0)
    return groups, left, had, np.maximum(1, np.round(left * 1.2)).astype(np.int64)


@pytest.mark.parametrize("replicas", [1, 3])
def test_every_rollout_policy_resumes_partial_responses_under_a_cache(replicas):
    """run_rollout(resumed=): every policy collects what each completion had left, counts only that, and
    recomputes every partial response it resumed; with a cache no pool is overrun."""
    from lengthsched.runtime.registry import POLICIES
    from simulate import run_rollout

    groups, left, had, pred = _resumed_step()
    comp = KVCompression(128, 16)
    for policy in (p for p, s in POLICIES.items() if s.rollout):
        kw = dict(replicas=replicas, budget_tokens=2500, max_new_tokens=2048, predicted=pred, record=True)
        resumed = run_rollout(groups, policy, compression=comp, resumed=had, **kw)
        fresh = run_rollout(groups, policy, compression=comp, **kw)
        assert (resumed.generated_at(resumed.seconds) == left).all(), policy
        assert resumed.tokens == fresh.tokens == int(left.sum()), policy
        assert resumed.recomputed_tokens >= int(had.sum()), policy
        assert max(resumed.peak_kv_tokens) <= 2500, policy
        assert resumed.lower_bound_seconds <= resumed.seconds, policy
        assert resumed.lower_bound_seconds == fresh.lower_bound_seconds, policy  # what is generated here


def test_a_resumed_request_holds_its_partial_response_capped_and_prefills_it():
    """One request resuming with 1,000 tokens and 50 to go: dense it holds prompt + 1,050 tokens; with a 144-token
    cache prompt + 144; both prefill the partial response again (recomputed) and take longer than without it."""
    from simulate import run_rollout

    group = [Group("p", 100, np.array([50]))]
    kw = dict(replicas=1, budget_tokens=4096, max_new_tokens=2048, predicted=[50])
    plain = run_rollout(group, "vllm", **kw)
    dense = run_rollout(group, "vllm", resumed=[1000], **kw)
    capped = run_rollout(group, "vllm", resumed=[1000], compression=KVCompression(128, 16), **kw)
    block = 16  # vLLM's
    assert plain.peak_kv_tokens[0] == -(-(100 + 50) // block) * block
    assert dense.peak_kv_tokens[0] == -(-(100 + 1050) // block) * block
    assert capped.peak_kv_tokens[0] == -(-(100 + 144) // block) * block
    assert dense.recomputed_tokens == capped.recomputed_tokens == 1000
    assert dense.prefill_tokens == capped.prefill_tokens == plain.prefill_tokens + 1000
    assert plain.seconds < capped.seconds < dense.seconds  # the cap reads less KV at every step
    assert dense.tokens == capped.tokens == 50 and dense.steps == plain.steps


def test_resumed_tokens_are_checked():
    from lengthsched import OnlineLengthPredictor
    from simulate import run_rollout

    groups, left, had, pred = _resumed_step(prompts=2)
    kw = dict(replicas=1, budget_tokens=4096, max_new_tokens=2048, predicted=pred)
    for bad in (had[:-1], np.where(had > 0, -1, 0)):
        with pytest.raises(InvalidArgument, match="resumed"):
            run_rollout(groups, "vllm", resumed=bad, **kw)
    with pytest.raises(InvalidArgument, match="lengths"):  # what it had and has left beyond max_new_tokens
        run_rollout(groups, "vllm", resumed=np.full(len(left), 1900), **kw)
    with pytest.raises(InvalidArgument, match="predicted"):
        run_rollout(groups, "vllm", resumed=had, **{**kw, "predicted": OnlineLengthPredictor()})


def test_over_sampled_steps_resume_under_a_cache():
    """slime's partial rollout with a compressed cache: a cache that never binds, in a pool where nothing is
    preempted, gives the dense steps (to the last bit of a float; a resumed sample's partial response is then
    held as the dense model holds it, as part of its context); a binding one is faster; in a tight pool the two
    models part (a preempted resumed sample frees its partial response with the cache)."""
    from simulate import run_oversampled_steps

    rng = np.random.default_rng(3)
    stream = [Group(str(i), int(rng.integers(20, 300)), rng.integers(20, 1500, 8)) for i in range(80)]
    flat = np.concatenate([g.lengths for g in stream])
    pred = np.round(flat * np.exp(rng.normal(0, 0.3, len(flat)))).clip(1, 2048).astype(np.int64)
    for policy in ("vllm", "sglang", "steal"):
        kw = dict(batch=8, oversample=1.5, steps=4, partial=True, predicted=pred, replicas=2,
                  budget_tokens=10**6, max_new_tokens=2048)
        dense = run_oversampled_steps(stream, policy, **kw)
        loose = run_oversampled_steps(stream, policy, compression=KVCompression(2048, 16), **kw)
        tight = run_oversampled_steps(stream, policy, compression=KVCompression(128, 16), **kw)
        assert [s.seconds for s in loose.steps] == pytest.approx([s.seconds for s in dense.steps], rel=1e-12), policy
        assert [s.recomputed_tokens for s in loose.steps] == [s.recomputed_tokens for s in dense.steps], policy
        assert [s.kept for s in loose.steps] == [s.kept for s in dense.steps], policy
        assert dense.stale_share > 0  # samples did resume
        assert tight.seconds < dense.seconds, policy
    kw["budget_tokens"] = 12000
    dense = run_oversampled_steps(stream, "vllm", **kw)
    capped = run_oversampled_steps(stream, "vllm", compression=KVCompression(128, 16), **kw)
    assert capped.seconds < dense.seconds
    assert sum(s.recomputed_tokens for s in capped.steps) < sum(s.recomputed_tokens for s in dense.steps)


def test_slimes_planned_client_resumes_partial_responses_in_its_order():
    """run_slime_planned reorders a step's groups: what each completion resumes with follows it."""
    from simulate.rollout import run_slime_planned_in_order

    groups, left, had, pred = _resumed_step(seed=1)
    kw = dict(predicted=pred, replicas=3, budget_tokens=3000, max_new_tokens=2048, in_flight=30, record=True,
              compression=KVCompression(256, 32))
    result = run_slime_planned_in_order(groups, resumed=had, **kw)
    assert (result.generated_at(result.seconds) == left).all()
    assert result.recomputed_tokens >= int(had.sum()) and max(result.peak_kv_tokens) <= 3000
    # a completion that resumes with more than max_new_tokens allows is refused whatever the order
    with pytest.raises(InvalidArgument, match="lengths"):
        run_slime_planned_in_order(groups, resumed=np.where(left > 0, 2040, 0), **kw)
    with pytest.raises(InvalidArgument, match="resumed"):  # checked before the plan reorders it
        run_slime_planned_in_order(groups, resumed=["a"] * len(left), **kw)


def test_multi_turn_steps_run_a_compressed_cache():
    """run_multiturn(compression=): a turn's own tokens capped, its conversation whole and prefilled again (no
    conversation cached). A cap that never binds, with no prefix cache, gives the dense step without one, for every
    policy; a binding cap keeps the pools and the bound (a lower one: capped reads) and caches no conversation."""
    from simulate.multiturn import MULTITURN_POLICIES, run_multiturn, split_turns
    from simulate.workloads import make_workload

    L = 2048
    groups = make_workload("castillo", 8, max_new_tokens=L, limit=24, seed=11)
    turns = split_turns(groups, seed=1, tool_seconds=0.05)
    pred = np.concatenate([g.lengths for g in groups])
    for policy in MULTITURN_POLICIES:
        kw = dict(replicas=2, budget_tokens=2 * L, max_new_tokens=L, predicted=pred)
        dense = run_multiturn(groups, turns, policy, prefix_cache=False, **kw)
        loose = run_multiturn(groups, turns, policy, prefix_cache=False, compression=KVCompression(L, 16), **kw)
        assert loose.seconds == pytest.approx(dense.seconds, rel=1e-12), policy
        assert (loose.prefill_tokens, loose.preemptions) == (dense.prefill_tokens, dense.preemptions), policy
        kw["budget_tokens"] = 8 * L  # room for the dense engines' prefix cache to keep conversations
        capped = run_multiturn(groups, turns, policy, compression=KVCompression(64, 16), **kw)
        cached = run_multiturn(groups, turns, policy, **kw)
        assert capped.cache_hits == 0 < cached.cache_hits, policy
        assert capped.lower_bound_seconds <= capped.seconds, policy
        assert capped.lower_bound_seconds < cached.lower_bound_seconds, policy  # the capped reads and KV area
    with pytest.raises(InvalidArgument, match="compression"):
        run_multiturn(groups, turns, "vllm", compression=(64, 16), **kw)
