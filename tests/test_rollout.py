"""simulate.run_rollout: B prompts x G completions on R replicas, routers, and the priority policies."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthsched import InvalidArgument
from lengthsched.runtime import POLICIES, policy_names
from simulate import ROUTERS, route, run_batch, run_group, run_rollout
from simulate.rollout import STEAL_ORDERS
from simulate.workloads import Group, castillo_groups


def _groups(sizes, seed=0, prompt=30):
    rng = np.random.default_rng(seed)
    return [Group(f"p{i}", prompt + i, rng.integers(5, 120, size=n)) for i, n in enumerate(sizes)]


def test_routers_place_requests_as_verl_and_openrlhf_do():
    groups = _groups([4, 4, 4])
    assert route(groups, "least_loaded", 3).tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2]
    assert route(groups, "group_round_robin", 2).tolist() == [0] * 4 + [1] * 4 + [0] * 4
    predicted = np.array([100] * 4 + [10] * 4 + [90] * 4)
    placed = route(groups, "least_loaded", 2, predicted, places_groups=True)
    assert len({tuple(placed[i * 4:(i + 1) * 4]) for i in range(3)}) >= 2  # whole groups, spread
    assert all(len(set(placed[i * 4:(i + 1) * 4])) == 1 for i in range(3))
    assert placed[0] != placed[8]  # the two heavy groups on different replicas
    with pytest.raises(InvalidArgument, match="router"):
        route(groups, "random", 2)


def test_trl_cuts_the_prompts_into_contiguous_chunks_the_first_ones_longer():
    """trl vllm-serve's chunk_list: chunk_list([1..6], 4) = [[1, 2], [3, 4], [5], [6]], whole groups (n = G)."""
    groups = _groups([2, 3, 2, 2, 1, 2])
    assert route(groups, "contiguous_chunks", 4).tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 3, 3]
    assert route(groups, "contiguous_chunks", 1).tolist() == [0] * 12


def test_sglangs_cache_aware_router_keeps_siblings_together_until_the_loads_drift_apart():
    from simulate import cache_aware_placement

    # the router's own thresholds (64, 1.5): 16 siblings never unbalance 4 replicas: whole groups, round robin
    assert cache_aware_placement([16] * 8, 4, balance_abs_threshold=64, balance_rel_threshold=1.5).tolist() == \
        np.repeat(np.arange(8) % 4, 16).tolist()
    # slime's (10, 1.2): 11 siblings on replica 0, then loads [11, 0, 0, 0] are imbalanced: the least loaded takes
    # the next three; at [11, 1, 1, 1] they are balanced again and the sibling goes home (0); [12, 1, 1, 1] is not
    first = cache_aware_placement([16, 16], 4)[:16].tolist()
    assert first == [0] * 11 + [1, 2, 3, 0, 1]
    assert route(_groups([16, 16]), "cache_aware", 4).tolist()[:16] == first
    assert cache_aware_placement([5, 5], 1).tolist() == [0] * 10


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=12), replicas=st.integers(1, 6),
       limit=st.integers(0, 20), rel=st.sampled_from([1.0, 1.2, 1.5, 3.0]))
def test_the_cache_aware_router_sends_a_sibling_home_or_to_a_least_loaded_replica(sizes, replicas, limit, rel):
    from simulate import cache_aware_placement

    placed = cache_aware_placement(sizes, replicas, balance_abs_threshold=limit, balance_rel_threshold=rel)
    load = np.zeros(replicas, dtype=np.int64)
    k = 0
    for n in sizes:
        home = placed[k]
        assert load[home] == load.min()  # a prompt the router has not seen: the least-loaded replica
        for _ in range(n):
            imbalanced = load.max() - load.min() > limit and load.max() > load.min() * rel
            r = placed[k]
            assert (r == home and not imbalanced) or load[r] == load.min()
            load[r] += 1
            k += 1
            if rel == 1.0:  # then only the absolute gap counts, and it never exceeds limit + 1
                assert load.max() - load.min() <= limit + 1
    assert k == len(placed) == sum(sizes)


def test_the_cache_aware_router_checks_its_thresholds():
    from simulate import cache_aware_placement

    with pytest.raises(InvalidArgument, match="balance_rel_threshold"):
        cache_aware_placement([4], 2, balance_rel_threshold=0)
    with pytest.raises(InvalidArgument, match="balance_abs_threshold"):
        cache_aware_placement([4], 2, balance_abs_threshold=-1)
    with pytest.raises(InvalidArgument, match="replicas"):
        cache_aware_placement([4], 0)
    with pytest.raises(InvalidArgument, match="sizes"):
        cache_aware_placement([4, -1], 2)
    assert cache_aware_placement([], 3).tolist() == []


def test_a_prompt_is_held_from_its_first_admission_to_its_last_finish_on_a_replica():
    """Engine.hold_prompts: a group's prompt KV enters the pool (and is prefilled) with its first admitted
    completion and leaves when every completion of the group claimed there has finished."""
    from lengthsched.runtime import Engine

    eng = Engine([3, 5, 4], budget_tokens=100, context=[10, 10, 7])
    eng.hold_prompts([0, 0, 1], [10, 7])
    for job in range(3):
        eng.claim(job)
    assert eng.kv_tokens() == 0 and eng.load_need(0) == 10
    eng.admit(0)
    assert eng.prefill_need(1) == 0 and eng.load_need(1) == 0  # the sibling shares the held prompt
    eng.advance(1, False)
    assert eng.kv_tokens() == 10 + 1 and eng.step_log().prefill_tokens.tolist() == [10]
    eng.admit(2)
    eng.advance(3, False)  # job 0 finished; job 1 (group 0) never started: the prompt stays
    assert list(eng.held_groups()) == [0, 1] and eng.kv_tokens() == 10 + 7 + 2
    assert eng.evict_idle() == 10 and list(eng.held_groups()) == [1]  # nothing of group 0 is live
    eng.admit(1)  # prefilled again
    eng.advance(5, False)  # job 2 finished: group 1's prompt leaves
    assert list(eng.held_groups()) == [0] and eng.prompt_loads == 3
    eng.advance(8, False)
    assert eng.kv_tokens() == 0 and not list(eng.held_groups())


def test_one_replica_with_a_roomy_pool_is_vllm_on_the_batch():
    groups = _groups([5, 3])
    r = run_rollout(groups, "vllm", budget_tokens=4000, max_new_tokens=128)
    b = run_batch(groups, "vllm", budget_tokens=4000, max_new_tokens=128)
    assert (r.steps, r.preemptions, r.recomputed_tokens) == (b.steps, b.preemptions, b.recomputed_tokens)
    prompts = sum(g.prompt_len - g.prompt_len % 16 for g in groups)  # whole blocks; the tails are per sequence
    assert r.prompt_loads == 2 and b.peak_kv_tokens < max(r.peak_kv_tokens) <= b.peak_kv_tokens + prompts
    assert r.replica_seconds == (r.seconds,) and r.slowest_share == 1.0
    for policy in ("seer", "steal"):  # on one replica they are engines of their own: every completion collected
        one = run_rollout(groups, policy, budget_tokens=4000, max_new_tokens=128, predicted=np.full(8, 50))
        assert [list(x) for x in one.collected_lengths] == [list(g.lengths) for g in groups]


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=6), replicas=st.integers(1, 4),
       policy=st.sampled_from(["vllm", "vllm_priority", "placed_lpt", "placed_classes", "placed_adaptive", "sglang",
                               "sglang_priority", "seer", "steal", "steal_sglang"]),
       router=st.sampled_from(ROUTERS), room=st.integers(0, 600), seed=st.integers(0, 3), separate=st.booleans())
def test_a_rollout_collects_everything_and_never_beats_its_bound(sizes, replicas, policy, router, room, seed,
                                                                 separate):
    """Also under the separate-attention step price (its bound is the overlapped form's, looser)."""
    from lengthsched.runtime.timing import default_cost

    cost = default_cost().replace(separate_attention=True) if separate else None
    groups = _groups(sizes, seed)
    flat = np.concatenate([g.lengths for g in groups])
    budget = int(flat.max()) + max(g.prompt_len for g in groups) + 48 + room
    predicted = np.maximum(1, (flat * np.exp(np.random.default_rng(seed).normal(0, 0.5, len(flat))))).astype(int)
    try:
        r = run_rollout(groups, policy, replicas=replicas, router=router, budget_tokens=budget, max_new_tokens=128,
                        predicted=predicted, cost=cost)
    except Exception as exc:  # sglang's reservation can refuse a tight pool, as run_group does
        assert policy in ("sglang", "steal_sglang") and "nothing live" in str(exc)
        return
    assert r.seconds == max(r.replica_seconds) and len(r.replica_seconds) == replicas
    assert max(r.peak_kv_tokens) <= budget and set(r.placement.tolist()) <= set(range(replicas))
    assert [list(x) for x in r.collected_lengths] == [list(g.lengths) for g in groups]
    assert r.seconds >= r.lower_bound_seconds * (1 - 1e-12)
    assert r.tokens == int(flat.sum()) and r.tokens_per_second > 0


def test_priority_scheduling_admits_the_longest_predicted_first():
    lengths = [10, 50, 20, 40]
    r = run_group(lengths, "vllm_priority", budget_tokens=64, max_new_tokens=64, predicted=lengths, record=True)
    starts = {job: first for job, _, first, _, kind in r.timeline.segments}
    assert starts[1] == 1  # the longest predicted runs from the first step
    fcfs = run_group(lengths, "vllm", budget_tokens=64, max_new_tokens=64, record=True)
    assert {job: f for job, _, f, _, _ in fcfs.timeline.segments}[0] == 1  # FCFS starts in index order


def test_bad_rollout_inputs_name_the_argument():
    groups = _groups([3, 3])
    for kwargs, name in ((dict(replicas=0), "replicas"), (dict(router="x"), "router"),
                         (dict(predicted=[1, 2]), "predicted"), (dict(budget_tokens=10), "budget_tokens"),
                         (dict(policy="dynamic_slot"), "policy"), (dict(policy="nope"), "policy"),
                         (dict(policy="growth_aware"), "policy")):
        args = dict(policy="vllm", budget_tokens=2000, max_new_tokens=128) | kwargs
        with pytest.raises(InvalidArgument, match=name):
            run_rollout(groups, **args)
    with pytest.raises(InvalidArgument, match="groups"):
        run_rollout([], "vllm", budget_tokens=100, max_new_tokens=10)


def test_the_registry_names_the_rollout_policies():
    assert {"vllm", "vllm_priority", "sglang", "sglang_priority", "seer", "placed_lpt", "steal"} <= set(POLICIES)
    assert policy_names(places_groups=True) == ("placed_lpt", "placed_classes", "placed_adaptive", "seer",
                                                "seer_divided", "steal", "steal_longest", "steal_classes",
                                                "steal_sglang", "steal_observed")
    assert policy_names(rollout=True) == ("vllm", "vllm_priority", "placed_lpt", "placed_classes", "placed_adaptive",
                                          "sglang", "sglang_priority", "seer", "seer_divided", "steal",
                                          "steal_longest", "steal_classes", "steal_sglang", "steal_observed")


def test_spreading_groups_costs_prompt_memory_when_the_pool_is_small():
    """verl spreads every group over the replicas, so each replica loads every prompt; placing whole
    groups loads each once."""
    groups = castillo_groups(16, max_new_tokens=1024, limit=32, seed=3)
    common = dict(replicas=4, budget_tokens=2 * 1024 + max(g.prompt_len for g in groups), max_new_tokens=1024)
    spread = run_rollout(groups, "vllm", router="least_loaded", **common)
    whole = run_rollout(groups, "vllm", router="group_round_robin", **common)
    assert whole.prompt_loads < spread.prompt_loads and whole.prefill_tokens < spread.prefill_tokens


def test_a_rollout_with_an_online_predictor_learns_per_replica_and_leaves_the_callers_alone():
    from lengthsched import OnlineLengthPredictor

    groups = _groups([6, 6, 6, 6], seed=4)
    online = OnlineLengthPredictor(prior={g.prompt_id: 60 for g in groups}, within_sigma=0.3, prior_sigma=0.5)
    for policy, router in (("vllm_priority", "least_loaded"), ("placed_lpt", None), ("steal", None)):
        r = run_rollout(groups, policy, replicas=2, router=router, budget_tokens=2000, max_new_tokens=128,
                        predicted=online)
        assert [list(x) for x in r.collected_lengths] == [list(g.lengths) for g in groups]
        assert r.seconds >= r.lower_bound_seconds
    assert not online._prompts or all(s.n == 0 for s in online._prompts.values())  # copies learnt, not it


def test_the_recommended_policy_spreads_like_verl_unless_prompts_would_crowd_the_pool():
    from simulate import DEFAULT_POLICY

    assert DEFAULT_POLICY == "steal" and POLICIES[DEFAULT_POLICY].places_groups
    groups = castillo_groups(16, max_new_tokens=1024, limit=32, seed=3)
    prompts = sum(g.prompt_len for g in groups)
    roomy = dict(replicas=4, budget_tokens=8 * prompts, max_new_tokens=1024)
    ours = run_rollout(groups, DEFAULT_POLICY, **roomy)
    verl = run_rollout(groups, "vllm", router="least_loaded", **roomy)
    assert ours.seconds == verl.seconds and ours.placement.tolist() == verl.placement.tolist()
    tight = dict(replicas=4, budget_tokens=prompts // 8 + 2 * 1024, max_new_tokens=1024)
    ours = run_rollout(groups, DEFAULT_POLICY, **tight)
    assert ours.prompt_loads < run_rollout(groups, "vllm", router="least_loaded", **tight).prompt_loads
    assert ours.seconds < run_rollout(groups, "vllm", router="least_loaded", **tight).seconds
    one = run_group([5, 9, 3], DEFAULT_POLICY, budget_tokens=64, max_new_tokens=16)  # alone: vLLM's engine
    assert one.steps == run_group([5, 9, 3], "vllm", budget_tokens=64, max_new_tokens=16).steps


def test_a_replica_that_drains_steals_the_work_another_cannot_start():
    """Whole groups placed by (wrong) predictions: the replica given the long group cannot start all of
    it; the other drains and steals what waits, so the step ends sooner than with the placement kept."""
    groups = [Group("long", 200, np.full(8, 400)), Group("short", 200, np.full(8, 20))]
    wrong = np.array([20] * 8 + [400] * 8)  # the long group predicted short and vice versa
    common = dict(replicas=2, budget_tokens=1400, max_new_tokens=400, predicted=wrong)
    kept = run_rollout(groups, "placed_lpt", **common)
    stolen = run_rollout(groups, "steal", **common)
    assert len(set(kept.placement[:8].tolist())) == 1  # placed whole and kept there
    assert len(set(stolen.placement[:8].tolist())) == 2  # some of the long group finished on the other replica
    assert stolen.seconds < kept.seconds
    assert [list(x) for x in stolen.collected_lengths] == [list(g.lengths) for g in groups]


def test_seer_sends_one_probe_per_group_first():
    groups = _groups([4, 4, 4, 4], seed=2)
    r = run_rollout(groups, "seer", replicas=2, budget_tokens=260, max_new_tokens=128, record=True)
    probes = {0, 4, 8, 12}
    seen = set()
    for t in r.timelines:  # lanes are handed out in admission order
        order = [job for _, lane, job in sorted((f, lane, job) for job, lane, f, _, _ in t.segments)]
        seen |= set(order)
        mine = [i for i, job in enumerate(order) if job in probes]
        rest = [i for i, job in enumerate(order) if job not in probes]
        assert not mine or not rest or max(mine) < min(rest)  # its probes start before its other requests
    assert probes <= seen and {j for j in range(16)} == seen


@settings(max_examples=25, deadline=None)
@given(policy=st.sampled_from(["steal", "steal_longest", "steal_observed", "steal_classes", "steal_sglang", "seer",
                               "seer_divided",
                               "vllm_priority", "sglang_priority", "placed_adaptive", "placed_classes"]),
       seed=st.integers(0, 50), replicas=st.integers(1, 3), offload=st.booleans())
def test_decisions_never_depend_on_lengths_not_yet_revealed(policy, seed, replicas, offload):
    """Lengthen every completion that has not finished by some time t: the runs agree on every run of
    every completion that started before t (a policy sees predictions and what happened, never the
    future), with preempted requests recomputed or their KV loaded back asynchronously."""
    rng = np.random.default_rng(seed)
    groups = [Group(f"p{i}", int(rng.integers(20, 60)), rng.integers(5, 100, size=4)) for i in range(4)]
    predicted = np.full(16, 50)
    common = dict(replicas=replicas, budget_tokens=400, max_new_tokens=256, predicted=predicted, record=True,
                  kv_offload=offload)
    from lengthsched.runtime.dispatch import SeerDivided

    chunk, SeerDivided.CHUNK = SeerDivided.CHUNK, 16  # seer_divided moves requests in these short steps too
    try:
        a = run_rollout(groups, policy, **common)
        b = _lengthened_after_median_finish(groups, policy, a, common)
    finally:
        SeerDivided.CHUNK = chunk
    cut = b[1]

    def started_before(result):
        out = set()
        for r, t in enumerate(result.timelines):
            for job, _, first, _, _ in t.segments:
                start = float(result.seconds_started(r, first))
                if start < cut - 1e-9:
                    out.add((r, job, first))
        return out

    assert started_before(a) == started_before(b[0])


def _lengthened_after_median_finish(groups, policy, a, common):
    """The run with every completion that finished after the median finish of ``a`` 50 tokens longer;
    (that run, the median finish in seconds)."""
    finish = {}
    for r, t in enumerate(a.timelines):
        for job, _, _first, last, kind in t.segments:
            if kind == "run":
                finish[job] = float(a.seconds_at(r, last))
    cut = float(np.median(list(finish.values())))
    later = [job for job, s in finish.items() if s > cut]
    longer = [Group(g.prompt_id, g.prompt_len, g.lengths.copy()) for g in groups]
    for job in later:
        longer[job // 4].lengths[job % 4] += 50
    return run_rollout(longer, policy, **common), cut


def test_sglang_priority_serves_and_keeps_the_longest_predicted():
    lengths = [10, 60, 20, 50]
    r = run_group(lengths, "sglang_priority", budget_tokens=150, max_new_tokens=64, predicted=lengths, record=True)
    starts = {job: first for job, _, first, _, _ in r.timeline.segments}
    assert starts[1] == 1 and starts[3] == 1  # the two longest predicted go first
    cut = [job for job, _, _, _, kind in r.timeline.segments if kind == "preempted"]
    assert all(lengths[j] <= min(lengths[k] for k in (1, 3)) for j in cut)  # the lowest priority is retracted
    assert sorted(r.collected_lengths.tolist()) == sorted(lengths)


def test_a_given_placement_is_run_as_given_and_checked():
    groups = _groups([4, 3, 5], seed=3)
    common = dict(replicas=3, budget_tokens=2000, max_new_tokens=200)
    verl = route(groups, "least_loaded", 3)
    default = run_rollout(groups, "vllm", **common)
    assert run_rollout(groups, "vllm", placement=verl, **common).seconds == default.seconds
    mine = np.array([0] * 4 + [1] * 3 + [2] * 5)
    given_ = run_rollout(groups, "vllm", placement=mine, **common)
    assert given_.router == "given" and given_.placement.tolist() == mine.tolist()
    assert given_.seconds == run_rollout(groups, "vllm", router="group_round_robin", **common).seconds
    for bad in (mine[:-1], np.r_[mine[:-1], 3], mine.astype(float), np.r_[mine[:-1], -1]):
        with pytest.raises(InvalidArgument, match="placement"):
            run_rollout(groups, "vllm", placement=bad, **common)
    for policy in ("seer", "placed_lpt"):
        with pytest.raises(InvalidArgument, match="placement.*places or dispatches"):
            run_rollout(groups, policy, placement=mine, **common)


@pytest.mark.parametrize("policy", ["steal", "steal_observed", "steal_classes"])
def test_the_stealing_policies_steal_over_a_given_placement(policy):
    """steal and its variants run over a given placement instead of their own (what an integration does over a
    plan's spread): their own placement given back reproduces the run; verl's spread given is stolen over, so
    it is no slower here than vLLM over the same spread, and every completion is collected once."""
    groups = _groups([8, 8, 8, 8, 8, 8], seed=5)
    pred = np.concatenate([np.full(len(g.lengths), int(np.median(g.lengths))) for g in groups])
    common = dict(replicas=3, budget_tokens=2500, max_new_tokens=400, predicted=pred)
    own = run_rollout(groups, policy, **common)
    again = run_rollout(groups, policy, placement=own.placement, **common)
    assert again.router == "given" and again.seconds == own.seconds
    assert again.placement.tolist() == own.placement.tolist()
    verl = route(groups, "least_loaded", 3)
    over = run_rollout(groups, policy, placement=verl, **common)
    assert over.router == "given" and over.placement.tolist() == verl.tolist()
    assert sorted(np.concatenate(over.collected_lengths).tolist()) == sorted(
        np.concatenate([g.lengths for g in groups]).tolist())
    plain = run_rollout(groups, "vllm", placement=verl, budget_tokens=2500, max_new_tokens=400, replicas=3)
    assert over.seconds <= plain.seconds * 1.05


@settings(max_examples=15, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=2, max_size=6), replicas=st.integers(2, 4),
       room=st.sampled_from([300, 2000]), policy=st.sampled_from(["vllm", "vllm_priority"]), seed=st.integers(0, 50))
def test_the_oracle_placement_search_reproduces_and_never_loses_to_its_starts(sizes, replicas, room, policy, seed):
    """search_placement's placement, run again, gives its seconds; they are no worse than verl's spread
    or than the best of its starts, and it stays within its simulation budget."""
    from simulate.headroom import search_placement

    groups = _groups(sizes, seed=seed)
    common = dict(replicas=replicas, budget_tokens=room, max_new_tokens=200)
    found = search_placement(groups, policy=policy, evaluations=30, seed=seed, **common)
    oracle = np.concatenate([g.lengths for g in groups])
    again = run_rollout(groups, policy, placement=found.placement, predicted=oracle, **common)
    assert again.seconds == pytest.approx(found.seconds, rel=1e-12)
    assert found.seconds <= found.start_seconds * (1 + 1e-12)
    assert found.seconds <= run_rollout(groups, policy, predicted=oracle, **common).seconds * (1 + 1e-12)
    assert found.evaluations <= 30
    assert found.start in ("spread", "groups", "time", "classes 0", "classes 0.5", "classes 1")
    assert again.seconds >= again.lower_bound_seconds * (1 - 1e-9)


def test_the_oracle_placement_search_runs_a_compressed_cache():
    """search_placement(compression=): every replica simulated with the cache, so its placement run again with the
    same cache gives its seconds, no worse than verl's spread with it."""
    from lengthsched import KVCompression
    from simulate.headroom import search_placement

    groups = _groups([5, 6, 4, 6], seed=3)
    common = dict(replicas=3, budget_tokens=400, max_new_tokens=200)
    comp = KVCompression(32, 8)
    found = search_placement(groups, policy="vllm", evaluations=30, seed=3, compression=comp, **common)
    again = run_rollout(groups, "vllm", placement=found.placement, compression=comp, **common)
    assert again.seconds == pytest.approx(found.seconds, rel=1e-12)
    assert found.seconds <= run_rollout(groups, "vllm", compression=comp, **common).seconds * (1 + 1e-12)
    assert found.seconds < search_placement(groups, policy="vllm", evaluations=30, seed=3, **common).seconds


def test_the_placement_search_checks_its_arguments():
    from simulate.headroom import search_placement

    groups = _groups([3, 3])
    with pytest.raises(InvalidArgument, match="policy"):
        search_placement(groups, replicas=2, budget_tokens=2000, max_new_tokens=200, policy="steal")
    with pytest.raises(InvalidArgument, match="evaluations"):
        search_placement(groups, replicas=2, budget_tokens=2000, max_new_tokens=200, evaluations=-1)
    with pytest.raises(InvalidArgument, match="budget_tokens"):
        search_placement(groups, replicas=2, budget_tokens=10, max_new_tokens=200)


def test_the_admission_watermark_trades_recomputation_for_time():
    """WorkStealing.WATERMARK: admit only while the running requests' predicted peak KV stays under
    W x the pool. Off, steal is unchanged; at 1.0 with the true lengths nothing is preempted in a pool
    where vLLM's eager admission preempts; every completion is collected either way."""
    from lengthsched.runtime.dispatch import WorkStealing

    groups = castillo_groups(8, limit=12, seed=4)
    oracle = np.concatenate([g.lengths for g in groups])
    common = dict(replicas=2, budget_tokens=3 * 2048, max_new_tokens=2048, predicted=oracle)
    eager = run_rollout(groups, "steal", **common)
    assert WorkStealing.WATERMARK is None and eager.preemptions > 0
    try:
        WorkStealing.WATERMARK = 1.0
        safe = run_rollout(groups, "steal", **common)
        WorkStealing.WATERMARK = 2.0
        between = run_rollout(groups, "steal", **common)
    finally:
        WorkStealing.WATERMARK = None
    assert safe.preemptions == 0 and safe.recomputed_tokens == 0
    assert safe.recomputed_tokens <= between.recomputed_tokens <= eager.recomputed_tokens
    assert [x.tolist() for x in safe.collected_lengths] == [g.lengths.tolist() for g in groups]
    assert run_rollout(groups, "steal", **common).seconds == eager.seconds


def test_the_bound_counts_a_steps_fixed_cost_on_every_replica_that_runs_it():
    """Two long completions and many short ones on 2 replicas: each replica holding a long one runs its
    1,000 steps, so the bound is above both 'the mean share' and 'the longest alone' - and still below
    the best placement the oracle search finds and every policy."""
    from lengthsched.runtime.timing import default_cost, lower_bound_seconds
    from simulate import search_placement

    groups = [Group("long", 0, np.array([1000, 1000])), *(Group(f"s{i}", 0, np.full(4, 300)) for i in range(50))]
    common = dict(replicas=2, budget_tokens=64 * 1024, max_new_tokens=1024)
    r = run_rollout(groups, "vllm", **common)
    flat = np.concatenate([g.lengths for g in groups])
    cost = default_cost()
    share = lower_bound_seconds(cost, flat, context=0, steps=1000) / 2
    alone = lower_bound_seconds(cost, flat[:1], context=0, steps=1000)
    assert r.lower_bound_seconds > max(share, alone) * 1.01
    best = search_placement(groups, evaluations=40, **common)
    assert r.lower_bound_seconds <= best.seconds
    for policy in ("vllm", "vllm_priority", "steal", "seer", "placed_lpt"):
        assert run_rollout(groups, policy, predicted=flat, **common).seconds >= r.lower_bound_seconds


def _replica_bound(cost, flat, owner, prompt_lens, budget, mine):
    """Seconds no schedule of the completions ``mine`` on one replica beats: its steps are at least its
    longest completion and its KV area (own tokens, prompts held while their longest runs) over the pool."""
    from lengthsched.runtime.timing import lower_bound_seconds

    if not len(mine):
        return 0.0
    groups = np.unique(owner[mine])
    longest = {g: int(flat[mine][owner[mine] == g].max()) for g in groups}
    area = int((flat[mine] * (flat[mine] + 1) // 2).sum()) + sum(int(prompt_lens[g]) * longest[g] for g in groups)
    steps = max(int(flat[mine].max()), -(-area // budget))
    return lower_bound_seconds(cost, flat[mine], context=prompt_lens[owner[mine]], steps=steps,
                               prompt_lens=[int(prompt_lens[g]) for g in groups])


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 400), min_size=1, max_size=6), prompts=st.lists(st.integers(0, 300), min_size=3,
                                                                                           max_size=3),
       replicas=st.integers(1, 3), room=st.integers(0, 2000), data=st.data())
def test_the_packing_bound_is_below_the_best_assignment_of_its_per_replica_bounds(lengths, prompts, replicas, room,
                                                                                 data):
    """The packing relaxation (:func:`simulate.rollout._packing_bound`) never exceeds the exact minimum,
    over every assignment of completions to replicas (enumerated), of the slowest replica's own bound."""
    import itertools

    from lengthsched.runtime.timing import default_cost
    from simulate.rollout import _packing_bound

    flat = np.array(lengths, dtype=np.int64)
    owner = np.array(data.draw(st.lists(st.integers(0, 2), min_size=len(flat), max_size=len(flat))), dtype=np.int64)
    prompt_lens = np.array(prompts, dtype=np.int64)
    budget = int(flat.max()) + int(prompt_lens.max()) + room
    cost = default_cost()
    longest = np.zeros(3, dtype=np.int64)
    np.maximum.at(longest, owner, flat)
    present = np.isin(np.arange(3), owner)
    bound = _packing_bound(cost, flat, prompt_lens[owner], prompt_lens[present], (prompt_lens * longest)[present],
                           budget, replicas)
    exact = min(max(_replica_bound(cost, flat, owner, prompt_lens, budget, np.flatnonzero(np.array(a) == r))
                    for r in range(replicas))
                for a in itertools.product(range(replicas), repeat=len(flat)))
    assert 0 < bound <= exact * (1 + 1e-9)


def test_the_packing_bound_is_exact_for_equal_completions_on_a_roomy_pool():
    """n equal completions on R replicas with room for everything: every replica runs L steps and a
    share n / R of the work, which the greedy finds exactly (for the best of its roofline weights)."""
    from lengthsched.runtime.timing import default_cost
    from simulate.rollout import _packing_bound

    cost = default_cost()
    n, length, replicas = 24, 500, 4
    flat = np.full(n, length)
    got = _packing_bound(cost, flat, np.zeros(n), np.zeros(0), np.zeros(0), 10**9, replicas)
    parts = cost.lower_bound_parts(length, length * (length - 1) / 2)
    expected = max((parts["step_seconds"] + mu * parts["step_memory_seconds"]) * length
                   + n * (mu * parts["memory_seconds"] + (1 - mu) * parts["compute_seconds"]) / replicas
                   for mu in np.linspace(0, 1, 5))
    assert expected * (1 - 1e-6) <= got <= expected * (1 + 1e-12)  # within the bisection's tolerance, never above


def test_the_bound_holds_prompts_while_their_longest_completion_runs():
    """One replica, long prompts, a pool of two prompts: a prompt's KV held while its group runs makes
    the KV area (and so the steps) larger than the completions' own tokens do, and the bound counts it."""
    from lengthsched.runtime.timing import default_cost, lower_bound_seconds

    groups = [Group(f"p{i}", 1000, np.full(4, 100)) for i in range(8)]
    common = dict(budget_tokens=2 * 1000 + 800, max_new_tokens=128)
    r = run_rollout(groups, "vllm", **common)
    flat = np.concatenate([g.lengths for g in groups])
    own = lower_bound_seconds(default_cost(), flat, context=1000, steps=-(-int((flat * (flat + 1) // 2).sum())
                                                                          // common["budget_tokens"]),
                              prompt_lens=[1000] * 8)
    assert r.lower_bound_seconds > own * 1.2 and r.seconds >= r.lower_bound_seconds


def test_placing_by_length_class_gathers_the_longest_completions():
    """Two long completions among many short ones on two replicas: the length classes put both long
    ones on one replica (its steps are cheap: few rows) and the short ones on the other, which verl's
    spread cannot (each replica then runs 1,000 steps with half the work)."""
    from lengthsched.runtime.timing import default_cost
    from simulate import place_by_length_class

    groups = [Group("long", 0, np.array([1000, 1000])), *(Group(f"s{i}", 0, np.full(4, 300)) for i in range(50))]
    flat = np.concatenate([g.lengths for g in groups])
    common = dict(replicas=2, budget_tokens=64 * 1024, max_new_tokens=1024)
    classes = place_by_length_class(groups, 2, flat, common["budget_tokens"], default_cost())
    assert classes[0] == classes[1] and set(classes[2:].tolist()) == {1 - classes[0]}
    order = np.argsort(-flat, kind="stable")
    assert np.all(np.diff(classes[order]) >= 0)  # contiguous classes, longest first
    gathered = run_rollout(groups, "vllm", placement=classes, **common)
    spread = run_rollout(groups, "vllm", **common)
    assert gathered.seconds < 0.95 * spread.seconds and gathered.seconds >= gathered.lower_bound_seconds
    with pytest.raises(InvalidArgument, match="lam"):
        place_by_length_class(groups, 2, flat, 1024, default_cost(), lam=2)
    with pytest.raises(InvalidArgument, match="lengths"):
        place_by_length_class(groups, 2, flat[:3], 1024, default_cost())


def test_the_length_class_policy_places_by_its_predictions_only():
    """placed_classes plans on the predicted lengths (lengthsched.placement.plan_length_classes): with
    the true lengths it gathers the two long completions and beats verl's spread; given a placement it
    refuses (it places requests itself); its placement is the same whatever the true lengths are."""
    from lengthsched.placement import plan_length_classes
    from lengthsched.runtime.timing import default_cost

    groups = [Group("long", 0, np.array([1000, 1000])), *(Group(f"s{i}", 0, np.full(4, 300)) for i in range(50))]
    flat = np.concatenate([g.lengths for g in groups])
    common = dict(replicas=2, budget_tokens=64 * 1024, max_new_tokens=1024)
    r = run_rollout(groups, "placed_classes", predicted=flat, **common)
    assert r.placement[0] == r.placement[1] and set(r.placement[2:].tolist()) == {1 - r.placement[0]}
    assert r.router == "placed" and r.seconds < 0.95 * run_rollout(groups, "vllm", **common).seconds
    owner = np.repeat(np.arange(len(groups)), [len(g.lengths) for g in groups])
    planned = plan_length_classes(flat, owner, np.zeros(len(groups), dtype=np.int64), replicas=2,
                                  budget_tokens=common["budget_tokens"], cost=default_cost())
    assert r.placement.tolist() == planned.tolist()
    other = [Group(g.prompt_id, g.prompt_len, g.lengths[::-1] // 2 + 1) for g in groups]  # same predictions
    assert run_rollout(other, "placed_classes", predicted=flat, **common).placement.tolist() == planned.tolist()
    with pytest.raises(InvalidArgument, match="placement"):
        run_rollout(groups, "placed_classes", placement=np.zeros(len(flat), dtype=np.int64), **common)
    with pytest.raises(InvalidArgument, match="group"):
        plan_length_classes(flat, owner[:-1], np.zeros(len(groups)), replicas=2, budget_tokens=4096,
                            cost=default_cost())


def _replicas_run_on(result):
    """Per completion, the replicas it ran on (from the recorded timelines)."""
    where: dict[int, set[int]] = {}
    for r, t in enumerate(result.timelines):
        for job, *_ in t.segments:
            where.setdefault(job, set()).add(r)
    return where


def test_stealing_only_requests_that_never_started_leaves_partial_generations_in_place():
    """WorkStealing.STEAL_STARTED: on (the default) a drained replica also takes preempted requests,
    which move with their generated tokens; off, only requests that never ran move (what a framework
    gets by aborting and resubmitting without carrying partial generations)."""
    from lengthsched.runtime.dispatch import WorkStealing

    rng = np.random.default_rng(2)
    groups = [Group(f"p{i}", 30, rng.integers(20, 400, size=8)) for i in range(6)]
    common = dict(replicas=2, budget_tokens=1200, max_new_tokens=400,
                  predicted=np.repeat(rng.integers(50, 300, size=6), 8), record=True)
    moved = run_rollout(groups, "steal", **common)
    assert WorkStealing.STEAL_STARTED is True
    assert any(len(rs) > 1 for rs in _replicas_run_on(moved).values())  # started on one, finished on another
    try:
        WorkStealing.STEAL_STARTED = False
        kept = run_rollout(groups, "steal", **common)
    finally:
        WorkStealing.STEAL_STARTED = True
    assert all(len(rs) == 1 for rs in _replicas_run_on(kept).values())
    assert [x.tolist() for x in kept.collected_lengths] == [g.lengths.tolist() for g in groups]
    assert run_rollout(groups, "steal", **common).seconds == moved.seconds


def test_steal_can_order_each_replicas_queue_longest_predicted_first():
    """steal_longest (WorkStealing.ORDER = "longest"): each replica starts its requests longest predicted
    first (ties in placement order); with equal predictions that is the placement order, steal's; on one
    replica it is steal."""
    from lengthsched.runtime.dispatch import WorkStealing

    groups = [Group(f"p{i}", 16, np.full(4, 40 + 10 * i)) for i in range(6)]
    predicted = np.repeat(np.array([30, 90, 60, 120, 10, 75]), 4)
    common = dict(replicas=2, budget_tokens=160, max_new_tokens=200, record=True)
    ordered = run_rollout(groups, "steal_longest", predicted=predicted, **common)
    try:
        WorkStealing.ORDER = "longest"
        patched = run_rollout(groups, "steal", predicted=predicted, **common)
    finally:
        WorkStealing.ORDER = "placement"
    assert (ordered.seconds, ordered.placement.tolist()) == (patched.seconds, patched.placement.tolist())
    assert ordered.seconds != run_rollout(groups, "steal", predicted=predicted, **common).seconds
    equal = run_rollout(groups, "steal_longest", predicted=np.full(24, 50), **common)
    assert equal.seconds == run_rollout(groups, "steal", predicted=np.full(24, 50), **common).seconds
    one = dict(common, replicas=1)
    assert (run_rollout(groups, "steal_longest", predicted=predicted, **one).seconds
            == run_rollout(groups, "steal", predicted=predicted, **one).seconds)
    try:  # a misspelt order is an error naming the attribute, not the placement order in silence
        WorkStealing.ORDER = "longest-first"
        with pytest.raises(InvalidArgument, match="argument 'ORDER': got 'longest-first'; expected one of "
                                                  "'placement', 'longest', 'longest_spread', 'longest_crowded'"):
            run_rollout(groups, "steal", predicted=predicted, **common)
    finally:
        WorkStealing.ORDER = "placement"
    for r, t in enumerate(ordered.timelines):
        first = sorted((start, lane, job) for job, lane, start, _, _ in t.segments)
        starts = [job for _, _, job in first]
        placed = [j for j in range(24) if ordered.placement[j] == r or r in _replicas_run_on(ordered)[j]]
        assert predicted[starts[0]] == max(predicted[j] for j in placed)


def test_steal_orders_longest_first_in_crowded_steps_only():
    """WorkStealing.ORDER = "longest_crowded": longest predicted first where the step's predicted tokens crowd
    the pools so that whole groups are placed (spread_ways gives 1), the placement order where groups are
    spread; "longest_spread" the other way round."""
    from lengthsched.integrations.rollout import spread_ways
    from lengthsched.runtime.dispatch import WorkStealing

    rng = np.random.default_rng(4)
    groups = [Group(f"p{i}", 24, rng.integers(20, 200, size=4)) for i in range(12)]
    predicted = np.repeat(rng.integers(20, 200, size=12), 4)
    runs = {}
    for pool in (300, 20_000):  # crowded: whole groups; roomy: each group over both replicas
        ways = spread_ways([24] * 12, pool, 2, WorkStealing.PROMPT_SHARE, work_tokens=float(predicted.sum()),
                           crowded=WorkStealing.CROWDED_POOLS)
        for order in STEAL_ORDERS:
            try:
                WorkStealing.ORDER = order
                r = run_rollout(groups, "steal", replicas=2, budget_tokens=pool, max_new_tokens=256,
                                predicted=predicted)
            finally:
                WorkStealing.ORDER = "placement"
            runs[pool, order] = (ways, r.seconds, r.placement.tolist())
    assert runs[300, "placement"][0] == 1 and runs[20_000, "placement"][0] == 2
    assert runs[300, "longest_crowded"] == runs[300, "longest"] != runs[300, "placement"]
    assert runs[20_000, "longest_crowded"] == runs[20_000, "placement"]
    assert runs[300, "longest_spread"] == runs[300, "placement"]


@pytest.mark.parametrize("policy", ["vllm", "vllm_priority", "sglang", "sglang_priority", "steal", "seer",
                                    "placed_classes", "placed_adaptive"])
def test_max_num_seqs_caps_the_requests_each_replica_runs_at_once(policy):
    """run_rollout(max_num_seqs=k): no replica runs more than k requests at once (lanes are handed out
    from the free ones, so a replica's lanes count its peak); every completion is still collected."""
    groups = _groups([8, 8, 8, 8], seed=5, prompt=20)
    common = dict(replicas=2, budget_tokens=4000, max_new_tokens=128,
                  predicted=np.concatenate([g.lengths for g in groups]))
    free = run_rollout(groups, policy, record=True, **common)
    capped = run_rollout(groups, policy, record=True, max_num_seqs=3, **common)
    assert max(1 + max(lane for _, lane, *_ in t.segments) for t in free.timelines) > 3
    assert max(1 + max(lane for _, lane, *_ in t.segments) for t in capped.timelines) <= 3
    assert [x.tolist() for x in capped.collected_lengths] == [g.lengths.tolist() for g in groups]
    assert capped.seconds >= capped.lower_bound_seconds
    assert run_rollout(groups, policy, max_num_seqs=None, **common).seconds == free.seconds
    if policy != "seer":  # Seer's dispatcher keeps vLLM's 256 when no cap is given
        assert run_rollout(groups, policy, max_num_seqs=1000, **common).seconds == free.seconds
    with pytest.raises(InvalidArgument, match="max_num_seqs"):
        run_rollout(groups, policy, max_num_seqs=0, **common)


def test_seers_divided_rollout_moves_requests_every_chunk_with_their_kv():
    """seer_divided: a request that runs past CHUNK tokens goes back to the global queue at each chunk's
    end and may continue on another replica, its KV loaded there, not recomputed; with chunks as long
    as max_new_tokens nothing moves and it is seer."""
    from lengthsched.runtime.dispatch import SeerDivided

    rng = np.random.default_rng(3)
    groups = [Group(f"p{i}", 20, rng.integers(10, 400, size=6)) for i in range(6)]
    common = dict(replicas=3, budget_tokens=6000, max_new_tokens=400, record=True)
    seer = run_rollout(groups, "seer", **common)
    chunk = SeerDivided.CHUNK
    try:
        SeerDivided.CHUNK = 400
        assert run_rollout(groups, "seer_divided", **common).seconds == seer.seconds
        SeerDivided.CHUNK = 64
        divided = run_rollout(groups, "seer_divided", **common)
    finally:
        SeerDivided.CHUNK = chunk
    assert [x.tolist() for x in divided.collected_lengths] == [g.lengths.tolist() for g in groups]
    moved = [j for j, rs in _replicas_run_on(divided).items() if len(rs) > 1]
    assert moved  # some requests ran on two replicas
    assert divided.preemptions == 0 and divided.recomputed_tokens == 0  # roomy pools: moves only, KV loaded
    assert divided.loaded_tokens > 0  # and priced over the host link
    for t in divided.timelines:  # no run of a request is longer than a chunk
        assert all(last - first + 1 <= 64 for _, _, first, last, _ in t.segments)


def test_a_request_whose_kv_is_transferred_prefills_nothing_of_its_own():
    from lengthsched.runtime import Engine

    eng = Engine([50, 50], budget_tokens=10_000)
    eng.tail[0] = eng.tail[1] = 7
    eng.done[0] = eng.done[1] = 20
    eng.transferred.add(0)
    assert eng.prefill_need(0) == 0 and eng.prefill_need(1) == 27
    eng.admit(0)
    eng.admit(1)
    assert eng.recomputed_tokens == 20 and not eng.transferred  # only job 1 recomputes
    eng.advance(1, pads=False)
    steps, rows, _, prefilled, _, loaded, _ = eng.log_entry()  # job 1 prefills its 27 tokens, job 0 loads them
    assert (steps, rows, prefilled, loaded) == (1, 2, 27, 27) and eng.loaded_tokens == 27
    # the load is priced by the cost's host link, in the step that admits the request
    from lengthsched.cost import StepCost

    cost = StepCost.from_model("qwen3-8b", "h100")
    log = eng.step_log()
    assert log.loaded_tokens.tolist() == [27]
    free = type(log)(log.steps, log.rows, log.kv_first, log.prefill_tokens, log.prefill_context)  # no load
    assert log.seconds(cost) == pytest.approx(free.seconds(cost) + cost.load_seconds(27), rel=1e-12)


def _loading_engine(steps_per_load, *, slots=None):
    """An engine with asynchronous loads (each ``steps_per_load`` decode steps long): jobs 0 and 1 (50
    tokens each) preempted after 20 and 10 tokens with their KV kept in host memory, job 2 running."""
    from lengthsched.runtime import Engine

    eng = Engine([50, 50, 50], budget_tokens=10_000, slots=slots)
    eng.offload = True
    eng.load_steps = lambda engine, tokens: steps_per_load
    for job in (0, 1, 2):
        eng.admit(job)
    eng.advance(10, pads=False)
    eng.preempt(1)
    eng.advance(20, pads=False)
    eng.preempt(0)
    return eng


def test_an_asynchronous_load_holds_its_kv_while_the_others_decode():
    """Engine.load_steps (vLLM's OffloadingConnector: load_kv_async): an admitted request whose KV is in host
    memory holds it and waits for its load, not decoding and not preemptible, while the others decode
    undelayed; it runs from the step after its load finished (at the earliest the step after next), its
    finish delayed by as much; loads go one after another over the host link; no step is charged for them."""
    eng = _loading_engine(2.5)
    assert eng.transferred == {0, 1} and eng.kv_tokens() == 20  # job 2's 20 tokens
    eng.admit(0)  # 20 tokens: the link is busy from step 20 to 22.5
    eng.admit(1)  # 10 tokens: queued behind it, 22.5 to 25
    assert eng.loading == {0: 23, 1: 25} and eng.next_load() == 23
    assert list(eng.running) == [2] and eng.kv_tokens() == 20 + 20 + 10  # their KV is held
    assert eng.loaded_tokens == 30 and eng.recomputed_tokens == 0
    assert eng.next_event() == 23
    eng.advance(23, pads=False)
    assert list(eng.running) == [2, 0] and eng.age(0) == 20 and eng.loading == {1: 25}
    assert eng.kv_tokens() == 23 + 20 + 10
    eng.advance(25, pads=False)
    assert list(eng.running) == [2, 0, 1] and eng.age(1) == 10
    while eng.next_finish() is not None:
        eng.advance(eng.next_event(), pads=False)
    assert eng.finished_at == [53, 65, 50]  # job 0 resumed at step 24 (30 to go), job 1 at 26 (40 to go)
    assert eng.step_log().loaded_tokens.sum() == 0  # the loads overlapped the decoding
    with pytest.raises(Exception, match="admitted while live, loading"):
        eng2 = _loading_engine(2.5)
        eng2.admit(0)
        eng2.admit(0)


def test_an_asynchronous_load_waits_for_a_slot_and_an_idle_wait_is_priced():
    """A load that finishes while the running cap is full waits for a slot (vLLM: a request back from
    WAITING_FOR_REMOTE_KVS is scheduled within max_num_seqs); steps in which nothing decodes and loads are
    under way cost the loads they wait for (StepLog.loaded_tokens)."""
    from lengthsched.runtime import Engine

    eng = Engine([50, 50, 50], budget_tokens=10_000, slots=2)
    eng.offload, eng.load_steps = True, (lambda engine, tokens: 0.5)
    eng.admit(0)
    eng.admit(2)
    eng.advance(20, pads=False)
    eng.preempt(0)
    eng.admit(0)  # it loads (one slot is free) ...
    eng.admit(1)  # ... and job 1 takes that slot meanwhile
    assert eng.loading == {0: 21} and list(eng.running) == [2, 1]
    eng.advance(21, pads=False)
    assert eng.loading == {0: 21} and list(eng.running) == [2, 1]  # loaded, waiting for a slot
    assert eng.next_event() == 50  # job 2's finish, not the load that already finished
    eng.advance(50, pads=False)
    assert list(eng.running) == [1, 0] and eng.age(0) == 20
    idle = _loading_engine(4.0)
    idle.advance(idle.next_event(), pads=False)  # job 2 finishes at 50
    idle.admit(1)
    assert not idle.running and idle.loading == {1: 54}
    assert idle.next_event() == 54
    idle.advance(54, pads=False)
    steps, rows, _, _, _, loaded, _ = idle.log_entry()
    assert (steps, rows, loaded) == (4, 0, 10) and list(idle.running) == [1]


def test_a_request_resumed_with_whole_chunks_has_not_ended_a_chunk():
    """chunk_ended (seer_divided's and steal's moves every CHUNK tokens): a request that comes back with a
    whole number of chunks generated (its KV loaded, so it goes live inside a step) ends its next chunk
    after CHUNK more steps, not at once; before this, seer_divided with asynchronous loads moved such a
    request again before it decoded a token, for ever."""
    from lengthsched.runtime.dispatch import chunk_ended, next_chunk_end

    eng = _loading_engine(0.5)
    eng.done[0] = 16  # as if it had generated a whole chunk of 16 before
    eng.admit(0)
    eng.advance(eng.next_event(), pads=False)
    assert 0 in eng.running and eng.age(0) == 16 and eng.run_steps(0) == 0
    assert chunk_ended(eng, 16) == [] and next_chunk_end(eng, 16, None) == eng.t + 11  # job 2 (age 21) first
    eng.advance(eng.t + 16, pads=False)
    assert eng.age(0) == 32 and 0 in chunk_ended(eng, 16)


def test_kv_offload_modes_time_the_loads_asynchronously_or_as_stalls():
    """run_rollout(kv_offload=True) is "async" (vLLM's OffloadingConnector): the loads overlap the decoding
    (the step log charges only the steps that wait for nothing but loads); "stall" charges every load to the
    step that admits it; both load the same requests' KV and recompute none; other values are errors."""
    groups = [Group(f"p{i}", 32, np.array([600, 20, 600, 20] if i % 2 == 0 else [300, 20, 400, 20]))
              for i in range(8)]
    common = dict(replicas=2, budget_tokens=1_500, max_new_tokens=600, router="least_loaded")
    default = run_rollout(groups, "vllm", kv_offload=True, **common)
    modes = {m: run_rollout(groups, "vllm", kv_offload=m, **common) for m in ("async", "stall")}
    assert default.seconds == modes["async"].seconds
    for result in modes.values():
        assert result.recomputed_tokens == 0 and result.loaded_tokens > 0
        assert [x.tolist() for x in result.collected_lengths] == [g.lengths.tolist() for g in groups]
    stalled = sum(int(log.loaded_tokens.sum()) for log in modes["stall"].step_logs)
    waited = sum(int(log.loaded_tokens.sum()) for log in modes["async"].step_logs)
    assert stalled == modes["stall"].loaded_tokens and waited < modes["async"].loaded_tokens
    for bad in ("yes", "free", 1, None):
        with pytest.raises(InvalidArgument) as err:
            run_rollout(groups, "vllm", kv_offload=bad, **common)
        assert err.value.name == "kv_offload"


@settings(max_examples=30, deadline=None)
@given(policy=st.sampled_from(["vllm", "vllm_priority", "sglang_priority", "seer", "steal", "steal_observed"]),
       seed=st.integers(0, 200), replicas=st.integers(1, 3), budget=st.sampled_from([300, 500, 1_000]))
def test_asynchronous_loads_collect_every_completion_within_the_pool(policy, seed, replicas, budget):
    """With KV offloading (asynchronous loads) every completion is collected with its own length, no
    replica's KV ever exceeds its pool (loading requests' KV included: the engines enforce it), and an
    engine that moves nothing between replicas recomputes nothing."""
    rng = np.random.default_rng(seed)
    groups = [Group(f"p{i}", int(rng.integers(10, 60)), rng.integers(5, 200, size=4)) for i in range(5)]
    common = dict(replicas=replicas, budget_tokens=budget, max_new_tokens=256, predicted=np.full(20, 60))
    try:
        result = run_rollout(groups, policy, kv_offload=True, **common)
    except InvalidArgument as err:  # a pool too small for the policy's admission check
        assert err.name == "budget_tokens"
        return
    assert [x.tolist() for x in result.collected_lengths] == [g.lengths.tolist() for g in groups]
    assert all(peak <= budget for peak in result.peak_kv_tokens)
    if not POLICIES[policy].resubmits:
        assert result.recomputed_tokens == 0


def test_steal_moves_running_requests_to_idle_replicas():
    """WorkStealing.MIGRATE_CHUNK (128 by default): at the end of each chunk a running request may move
    to a replica that sits idle, its generated tokens recomputed there (MIGRATE_KV False, the default)
    or its KV loaded there (MIGRATE_KV); the long requests that verl's spread put on one replica then
    share the other, and the step ends sooner."""
    from lengthsched.runtime.dispatch import WorkStealing

    assert (WorkStealing.MIGRATE_CHUNK, WorkStealing.MIGRATE_KV) == (128, False)
    groups = [Group(f"p{i}", 16, np.array([400, 10, 400, 10])) for i in range(3)]  # replica 0 gets every 400
    common = dict(replicas=2, budget_tokens=20_000, max_new_tokens=400, predicted=np.full(12, 100), record=True)
    try:
        WorkStealing.MIGRATE_CHUNK = None
        kept = run_rollout(groups, "steal", **common)
        WorkStealing.MIGRATE_CHUNK, WorkStealing.MIGRATE_KV = 64, True
        moved = run_rollout(groups, "steal", **common)
        WorkStealing.MIGRATE_KV = False
        recomputed = run_rollout(groups, "steal", **common)
    finally:
        WorkStealing.MIGRATE_CHUNK, WorkStealing.MIGRATE_KV = 128, False
    default = run_rollout(groups, "steal", **common)
    assert all(len(rs) == 1 for rs in _replicas_run_on(kept).values())
    assert any(len(rs) > 1 for rs in _replicas_run_on(moved).values())
    assert moved.recomputed_tokens == 0 and moved.preemptions == 0 and moved.loaded_tokens > 0
    assert [x.tolist() for x in moved.collected_lengths] == [g.lengths.tolist() for g in groups]
    assert moved.seconds < kept.seconds
    # without a global KV pool the moved requests recompute what they had generated
    assert recomputed.recomputed_tokens > 0 and recomputed.recomputed_tokens % 64 == 0 and not recomputed.loaded_tokens
    assert moved.seconds <= recomputed.seconds < kept.seconds
    assert default.recomputed_tokens > 0 and default.recomputed_tokens % 128 == 0
    assert default.seconds < kept.seconds


def lopsided_groups() -> list:
    """8 prompts x 4 on a 32-token prompt: the even prompts have two 600-token completions, every other
    completion is 20 tokens (verl's spread puts every long completion on one of two replicas)."""
    return [Group(f"p{i}", 32, np.array([600, 20, 600, 20] if i % 2 == 0 else [20, 20, 20, 20])) for i in range(8)]


def assert_rejected(groups, common, name, policy, bads, other, mention) -> None:
    """run_rollout(..., name=bad) with ``policy`` is an error naming ``name`` for every ``bads``; so is a
    good value (1.0) with ``other``, a policy it does not apply to, whose message mentions ``mention``."""
    for bad in bads:
        with pytest.raises(InvalidArgument) as err:
            run_rollout(groups, policy, **{name: bad}, **common)
        assert err.value.name == name
    with pytest.raises(InvalidArgument) as err:
        run_rollout(groups, other, **{name: 1.0}, **common)
    assert err.value.name == name and mention in str(err.value)


def test_steal_from_snapshots_tracks_steal_and_collects_everything():
    """steal_observed: steal's placement, with every steal and move decided by a StealCoordinator from
    per-replica snapshots (what a framework sees). On a lopsided step it gains most of what steal gains
    (here 0.755 of vLLM + verl against steal's 0.682 under the short pool: it learns that a request
    waits one snapshot late); every completion is collected with its own length."""
    groups = lopsided_groups()
    predicted = np.full(32, 150)
    for budget in (2_000, 40_000):
        common = dict(replicas=2, budget_tokens=budget, max_new_tokens=600, predicted=predicted)
        base = run_rollout(groups, "vllm", router="least_loaded", **common).seconds
        steal = run_rollout(groups, "steal", **common).seconds
        observed = run_rollout(groups, "steal_observed", **common)
        assert [x.tolist() for x in observed.collected_lengths] == [g.lengths.tolist() for g in groups]
        assert observed.seconds <= base * (0.8 if budget == 2_000 else 1.0) and observed.seconds <= steal * 1.15
    # snapshots every 64 steps at most: decisions come later, every completion is still collected
    from lengthsched.runtime.dispatch import StealObserved

    short = dict(common, budget_tokens=2_000)
    every = run_rollout(groups, "steal_observed", **short)
    try:
        StealObserved.SNAPSHOT_STEPS = 64
        sparse = run_rollout(groups, "steal_observed", **short)
    finally:
        StealObserved.SNAPSHOT_STEPS = None
    assert [x.tolist() for x in sparse.collected_lengths] == [g.lengths.tolist() for g in groups]
    assert sparse.seconds != every.seconds
    # or every 0.05 modelled seconds at most (a framework's poll interval)
    try:
        StealObserved.SNAPSHOT_SECONDS = 0.05
        polled = run_rollout(groups, "steal_observed", **short)
        StealObserved.SNAPSHOT_SECONDS = 1e-12  # shorter than any step: a snapshot at every decision
        assert run_rollout(groups, "steal_observed", **short).seconds == every.seconds
    finally:
        StealObserved.SNAPSHOT_SECONDS = None
    assert [x.tolist() for x in polled.collected_lengths] == [g.lengths.tolist() for g in groups]
    assert polled.seconds != every.seconds
    # on its own it is vLLM FCFS, like steal
    from simulate import run_group

    g = groups[0].lengths
    assert run_group(g, "steal_observed", budget_tokens=2_000, max_new_tokens=600).seconds == \
        run_group(g, "vllm", budget_tokens=2_000, max_new_tokens=600).seconds


@pytest.mark.parametrize("seed", [67, 151, 206, 236])
def test_steal_observed_starts_what_waits_where_its_moves_emptied_a_replica(seed, monkeypatch):
    """The coordinator takes a request that grew since the previous snapshot for a running one, so when a
    request was preempted since then it may move every running request of that replica to idle ones,
    leaving the preempted one waiting on an empty engine: it starts at once, as the engine's next step
    would start it (these draws, found by a search over small lopsided rollouts with snapshots 8 or 64
    steps apart, each stopped with 'nothing live and nothing admitted' before)."""
    from lengthsched.runtime.dispatch import StealObserved

    rng = np.random.default_rng(seed)
    replicas = int(rng.integers(3, 9))
    n = int(rng.integers(2, 3 * replicas))
    groups = [Group(f"p{i}", int(rng.integers(8, 40)),
                    np.where(rng.random(4) < 0.3, rng.integers(200, 400, size=4), rng.integers(5, 40, size=4)))
              for i in range(n)]
    monkeypatch.setattr(StealObserved, "SNAPSHOT_STEPS", [None, 8, 64][seed % 3])
    monkeypatch.setattr(StealObserved, "MIGRATE_CHUNK", 16)
    budget = int(rng.integers(500, 1500))
    out = run_rollout(groups, "steal_observed", replicas=replicas, budget_tokens=budget, max_new_tokens=400,
                      predicted=np.full(4 * n, 100), resubmit_seconds=float(rng.choice([0.0, 0.01])))
    assert [x.tolist() for x in out.collected_lengths] == [g.lengths.tolist() for g in groups]


@pytest.mark.parametrize("policy", ["steal", "steal_observed"])
def test_a_resubmitted_request_runs_on_its_target_only_after_the_delay(policy, monkeypatch):
    """WorkStealing.RESUBMIT_SECONDS: a stolen or moved request travels that long (the framework's abort
    and resubmission) before its target can run it: every request sent at t seconds next runs on its
    target at t + the delay or later, every completion is collected once with its length, a delay longer
    than the step makes the step at least that long, and off (0, the default) the step is as before."""
    from lengthsched.runtime.dispatch import WorkStealing

    groups = lopsided_groups()  # verl's spread puts every long completion on one replica
    common = dict(replicas=2, budget_tokens=2_000, max_new_tokens=600, predicted=np.full(32, 150), record=True)
    at_once = run_rollout(groups, policy, **common)
    assert WorkStealing.RESUBMIT_SECONDS == 0.0
    delay = 0.25 * at_once.seconds
    sent = []  # (job, target, seconds) of every move
    send = WorkStealing._send

    def spy(self, job, src, target, **kw):
        sent.append((job, target, self.now))
        send(self, job, src, target, **kw)

    monkeypatch.setattr(WorkStealing, "_send", spy)
    monkeypatch.setattr(WorkStealing, "RESUBMIT_SECONDS", delay)
    late = run_rollout(groups, policy, **common)
    monkeypatch.setattr(WorkStealing, "_send", send)
    monkeypatch.setattr(WorkStealing, "RESUBMIT_SECONDS", 100.0)  # longer than the whole step
    stranded = run_rollout(groups, policy, **common)
    monkeypatch.undo()
    for result in (late, stranded):
        assert [x.tolist() for x in result.collected_lengths] == [g.lengths.tolist() for g in groups]
    moves = sent[:]
    assert moves  # the drained replica still takes work
    for job, target, t in moves:
        runs = [f for j, _, f, _, _ in late.timelines[target].segments if j == job and f >= 1]
        starts = [late.seconds_started(target, f) for f in runs]  # when the step began (after any idle wait)
        assert any(x >= t + delay - 1e-9 for x in starts) and not any(t <= x < t + delay - 1e-9 for x in starts)
    assert late.seconds > at_once.seconds
    assert stranded.seconds >= 100.0
    assert run_rollout(groups, policy, **common).seconds == at_once.seconds


def test_run_rollout_takes_the_resubmission_delay_for_the_policies_that_move_requests():
    """run_rollout(resubmit_seconds=D) is WorkStealing.RESUBMIT_SECONDS = D for that run only (the class is
    left alone); a policy that moves nothing by resubmission, or a bad delay, is an error naming it."""
    from lengthsched.runtime.dispatch import WorkStealing

    groups = lopsided_groups()
    common = dict(replicas=2, budget_tokens=2_000, max_new_tokens=600, predicted=np.full(32, 150))
    for policy in ("steal", "steal_observed"):
        default = run_rollout(groups, policy, **common).seconds
        assert run_rollout(groups, policy, resubmit_seconds=0.0, **common).seconds == default
        delayed = run_rollout(groups, policy, resubmit_seconds=0.2, **common).seconds
        try:
            WorkStealing.RESUBMIT_SECONDS = 0.2
            assert run_rollout(groups, policy, **common).seconds == delayed > default
        finally:
            WorkStealing.RESUBMIT_SECONDS = 0.0
    assert WorkStealing.RESUBMIT_SECONDS == 0.0
    assert_rejected(groups, common, "resubmit_seconds", "steal", (-1.0, float("nan"), "1", True), "vllm", "steal")


@pytest.mark.parametrize("policy, kw", [("vllm", {"router": "least_loaded"}), ("vllm_priority", {}), ("steal", {}),
                                        ("steal_observed", {}), ("seer", {})])
def test_kv_offload_loads_preempted_requests_back_instead_of_recomputing_them(policy, kw):
    """run_rollout(kv_offload=True): a preempted request's KV waits in its replica's host memory and is
    loaded when it runs there again (priced over the host link), so an engine that only preempts
    recomputes nothing; what steal moves to another replica still recomputes there. Every completion is
    collected with its own length either way."""
    groups = [Group(f"p{i}", 32, np.array([600, 20, 600, 20] if i % 2 == 0 else [300, 20, 400, 20]))
              for i in range(8)]
    common = dict(replicas=2, budget_tokens=1_500, max_new_tokens=600, predicted=np.full(32, 150), **kw)
    plain = run_rollout(groups, policy, **common)
    kept = run_rollout(groups, policy, kv_offload=True, **common)
    for result in (plain, kept):
        assert [x.tolist() for x in result.collected_lengths] == [g.lengths.tolist() for g in groups]
    assert plain.preemptions > 0 and plain.recomputed_tokens > 0 and plain.loaded_tokens == 0
    assert kept.loaded_tokens > 0 and kept.seconds != plain.seconds
    if getattr(POLICIES[policy].cls, "STEALS", False):  # moves between replicas recompute where they land
        assert kept.recomputed_tokens < plain.recomputed_tokens
    else:
        assert kept.recomputed_tokens == 0
    assert run_rollout(groups, policy, kv_offload=False, **common).seconds == plain.seconds
    with pytest.raises(InvalidArgument) as err:
        run_rollout(groups, policy, kv_offload="yes", **common)
    assert err.value.name == "kv_offload"


def test_offloaded_kv_stays_on_its_replica():
    """Engine.offload: preempting puts the request's KV in host memory (Engine.transferred, loaded at its
    next admission there); handing the request to another engine, or lifting it off to move it, leaves
    that KV behind (the request recomputes where it lands)."""
    from lengthsched.runtime import Engine
    from lengthsched.runtime.dispatch import hand_over, lift

    def running(offload):
        eng = Engine([50, 50], budget_tokens=1_000)
        eng.offload = offload
        for job in (0, 1):
            eng.claim(job)
            eng.admit(job)
        eng.advance(eng.t + 5, False)
        return eng

    src, dst = running(True), Engine([50, 50], budget_tokens=1_000)
    src.preempt(0)
    assert src.transferred == {0} and src.done[0] == 5
    hand_over(0, src, dst)
    assert src.transferred == set() and dst.transferred == set() and dst.done[0] == 5
    lift(src, 1)
    assert src.transferred == set() and src.preemptions == 1
    plain = running(False)
    plain.preempt(0)
    assert plain.transferred == set()


def test_run_rollout_takes_steal_observeds_snapshot_interval():
    """run_rollout(snapshot_seconds=S) is StealObserved.SNAPSHOT_SECONDS = S for that run only; a policy
    that decides without snapshots, or a bad interval, is an error naming it."""
    from lengthsched.runtime.dispatch import StealObserved

    groups = lopsided_groups()
    common = dict(replicas=2, budget_tokens=2_000, max_new_tokens=600, predicted=np.full(32, 150))
    every = run_rollout(groups, "steal_observed", **common).seconds
    polled = run_rollout(groups, "steal_observed", snapshot_seconds=0.05, **common).seconds
    try:
        StealObserved.SNAPSHOT_SECONDS = 0.05
        assert run_rollout(groups, "steal_observed", **common).seconds == polled != every
    finally:
        StealObserved.SNAPSHOT_SECONDS = None
    assert run_rollout(groups, "steal_observed", **common).seconds == every
    assert_rejected(groups, common, "snapshot_seconds", "steal_observed", (0.0, -1.0, float("nan"), "1"), "steal",
                    "steal_observed")


def test_replica_engine_times_its_loads_one_way_and_names_bad_modes():
    """replica_engine: offloaded loads (``offload``) and loads from a global pool (``transfers``) are timed
    asynchronously when either asks for it (one callable per engine), as stalls otherwise; a bad mode or an
    asynchronous engine without a cost is an InvalidArgument naming the argument."""
    from lengthsched.cost import StepCost
    from lengthsched.runtime.replicas import prompt_blocks, replica_engine

    flat, owner, prompt_lens = np.array([30, 40]), np.array([0, 0]), np.array([20])
    tails, prompt_kv = prompt_blocks(prompt_lens, 16)
    args = (flat, owner, tails, prompt_kv, prompt_lens, 2_000, None, False, 16)
    cost = StepCost.from_model("qwen3-1.7b", "h100")
    assert replica_engine(*args).load_steps is None
    assert replica_engine(*args, "stall", cost).load_steps is None and replica_engine(*args, "stall", cost).offload
    for offload, transfers in (("async", "stall"), (None, "async"), ("stall", "async")):
        eng = replica_engine(*args, offload, cost, transfers=transfers)
        assert eng.load_steps is not None and eng.offload == (offload is not None)
    for kwargs, name in ((dict(offload="free"), "offload"), (dict(transfers="free"), "transfers"),
                         (dict(transfers="async"), "cost")):
        with pytest.raises(InvalidArgument) as err:
            replica_engine(*args, **kwargs)
        assert err.value.name == name


def _running_at_once(result) -> int:
    """The most requests running at once over all replicas (from the timelines, in modelled seconds)."""
    events = []
    for r, t in enumerate(result.timelines):
        for _, _, first, last, _ in t.segments:
            events += [(float(result.seconds_started(r, first)), 1), (float(result.seconds_at(r, last)), -1)]
    peak = now = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):  # a finish frees its slot before a start
        now += step
        peak = max(peak, now)
    return peak


@pytest.mark.parametrize("policy", ["vllm", "sglang"])
@pytest.mark.parametrize("router", ["least_loaded", "cache_aware"])
def test_an_in_flight_cap_as_large_as_the_step_routes_everything_at_once(policy, router):
    """in_flight >= the step's requests: the framework's queue never holds one back, so the run is the
    router's placement of the whole step run as before (the same seconds and placement)."""
    groups = _groups([6, 5, 7, 4], seed=2, prompt=25)
    common = dict(replicas=3, router=router, budget_tokens=700, max_new_tokens=128)
    free = run_rollout(groups, policy, **common)
    for cap in (22, 100):
        capped = run_rollout(groups, policy, in_flight=cap, **common)
        assert capped.seconds == pytest.approx(free.seconds, rel=1e-12)
        assert capped.placement.tolist() == free.placement.tolist()
        assert capped.steps == free.steps and capped.recomputed_tokens == free.recomputed_tokens


@pytest.mark.parametrize("policy", ["vllm", "sglang"])
def test_one_request_in_flight_runs_the_step_one_request_at_a_time(policy):
    """in_flight=1: each request is sent when the last one finished, to the least loaded replica (all
    idle: the first), so the step is one replica running one request at a time."""
    groups = _groups([3, 4, 2], seed=4, prompt=15)
    one = run_rollout(groups, policy, replicas=3, budget_tokens=600, max_new_tokens=128, in_flight=1, record=True)
    alone = run_rollout(groups, policy, replicas=1, budget_tokens=600, max_new_tokens=128, max_num_seqs=1)
    assert one.placement.tolist() == [0] * 9
    assert one.seconds == pytest.approx(alone.seconds, rel=1e-12)
    assert _running_at_once(one) == 1


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, 8), min_size=1, max_size=6), replicas=st.integers(1, 4),
       cap=st.integers(1, 12), policy=st.sampled_from(["vllm", "sglang"]),
       router=st.sampled_from(["least_loaded", "cache_aware"]), seed=st.integers(0, 50))
def test_a_framework_never_has_more_requests_running_than_it_keeps_in_flight(sizes, replicas, cap, policy, router,
                                                                               seed):
    groups = _groups(sizes, seed=seed, prompt=10)
    r = run_rollout(groups, policy, replicas=replicas, router=router, budget_tokens=500, max_new_tokens=128,
                    in_flight=cap, record=True)
    assert [x.tolist() for x in r.collected_lengths] == [g.lengths.tolist() for g in groups]
    assert _running_at_once(r) <= cap
    assert r.seconds >= r.lower_bound_seconds * (1 - 1e-12)


def test_requests_routed_as_others_finish_go_to_the_replica_with_the_fewest_in_flight():
    """Two replicas, two requests in flight: the third request goes where the first finish freed a
    slot, not round robin (the whole step routed at once would send it to replica 0)."""
    groups = [Group("a", 10, np.array([100, 10, 50]))]
    r = run_rollout(groups, "vllm", replicas=2, budget_tokens=500, max_new_tokens=128, in_flight=2)
    assert r.placement.tolist() == [0, 1, 1]
    assert run_rollout(groups, "vllm", replicas=2, budget_tokens=500, max_new_tokens=128).placement.tolist() == \
        [0, 1, 0]
    # SGLang's cache-aware router keeps a group at home while the loads differ by at most 10
    assert run_rollout(groups, "sglang", replicas=2, router="cache_aware", budget_tokens=500, max_new_tokens=128,
                       in_flight=2).placement.tolist() == [0, 0, 0]


def test_an_in_flight_cap_is_checked():
    groups = _groups([4, 4])
    common = dict(replicas=2, budget_tokens=500, max_new_tokens=128)
    with pytest.raises(InvalidArgument, match="in_flight"):
        run_rollout(groups, "vllm", in_flight=0, **common)
    with pytest.raises(InvalidArgument, match="in_flight.*steal"):
        run_rollout(groups, "steal", in_flight=4, **common)
    with pytest.raises(InvalidArgument, match="in_flight.*group_round_robin"):
        run_rollout(groups, "vllm", router="group_round_robin", in_flight=4, **common)
    with pytest.raises(InvalidArgument, match="placement"):
        run_rollout(groups, "vllm", placement=np.full(8, 2, dtype=np.int64), in_flight=4, **common)


@pytest.mark.parametrize("policy", ["vllm", "sglang"])
def test_a_given_placement_sent_as_slots_free_keeps_every_request_where_it_was_placed(policy):
    """placement with in_flight: a client that sends each request to its planned replica when the cap
    frees a slot. Every request runs where it was placed; a cap as large as the step runs the same as
    the placement given at once; a cap of 1 runs the requests one at a time in submission order."""
    groups = _groups([6, 5, 7, 4], seed=2, prompt=25)
    common = dict(replicas=3, budget_tokens=700, max_new_tokens=128)
    placed = np.array([g % 3 for g, group in enumerate(groups) for _ in group.lengths], dtype=np.int64)
    at_once = run_rollout(groups, policy, placement=placed, **common)
    big = run_rollout(groups, policy, placement=placed, in_flight=100, **common)
    assert big.router == "given" and big.placement.tolist() == placed.tolist()
    assert big.seconds == pytest.approx(at_once.seconds, rel=1e-12) and big.steps == at_once.steps
    capped = run_rollout(groups, policy, placement=placed, in_flight=5, record=True, **common)
    assert capped.placement.tolist() == placed.tolist() and _running_at_once(capped) <= 5
    assert [x.tolist() for x in capped.collected_lengths] == [g.lengths.tolist() for g in groups]
    one = run_rollout(groups, policy, placement=placed, in_flight=1, record=True, **common)
    assert _running_at_once(one) == 1
    assert one.seconds > capped.seconds


def test_steal_over_sglang_engines_runs_sglangs_scheduler_on_every_replica():
    """steal_sglang: on one replica SGLang's FCFS exactly (its reservation, its retractions); on several,
    steal's placement and stealing with SGLang's admission on each replica, so it never admits what
    SGLang would refuse: no replica's running requests and their reservations exceed the pool."""
    groups = _groups([6, 5, 7, 4], seed=3, prompt=25)
    flat = np.concatenate([g.lengths for g in groups])
    common = dict(budget_tokens=500, max_new_tokens=128, predicted=flat)
    one, sglang = run_rollout(groups, "steal_sglang", **common), run_rollout(groups, "sglang", **common)
    assert one.seconds == pytest.approx(sglang.seconds, rel=1e-12)
    assert (one.steps, one.preemptions, one.recomputed_tokens) == (sglang.steps, sglang.preemptions,
                                                                   sglang.recomputed_tokens)
    many = run_rollout(groups, "steal_sglang", replicas=3, record=True, **common)
    assert [x.tolist() for x in many.collected_lengths] == [g.lengths.tolist() for g in groups]
    assert many.router == "dispatch" and max(many.peak_kv_tokens) <= 500
    steal = run_rollout(groups, "steal", replicas=3, **common)
    assert many.seconds != steal.seconds  # another engine on the same placement


@settings(max_examples=15, deadline=None)
@given(policy=st.sampled_from(["vllm", "sglang"]), router=st.sampled_from(["least_loaded", "cache_aware"]),
       seed=st.integers(0, 50), replicas=st.integers(1, 3), cap=st.integers(1, 10))
def test_a_framework_routing_as_requests_finish_never_sees_lengths_not_yet_revealed(policy, router, seed, replicas,
                                                                                   cap):
    """With in_flight, when and where a request is sent depends on finishes only: lengthen every completion
    that had not finished by the median finish, and every run that started before then is the same."""
    rng = np.random.default_rng(seed)
    groups = [Group(f"p{i}", int(rng.integers(20, 60)), rng.integers(5, 100, size=4)) for i in range(4)]
    common = dict(replicas=replicas, router=router, budget_tokens=400, max_new_tokens=256, record=True,
                  in_flight=cap)
    a = run_rollout(groups, policy, **common)
    b, cut = _lengthened_after_median_finish(groups, policy, a, common)

    def started_before(result):
        return {(r, job, first) for r, t in enumerate(result.timelines) for job, _, first, _, _ in t.segments
                if float(result.seconds_started(r, first)) < cut - 1e-9}

    assert started_before(a) == started_before(b)


def test_a_replica_that_sat_idle_reports_when_its_steps_ended_and_began():
    """seconds_at(r, s): when step s ended; seconds_started(r, s): when it began, which after an idle wait is
    the moment the replica woke, not the end of the step before. Here the cache-aware router keeps group a
    on replica 0, so replica 1 waits until a's short request finishes and frees the slot b takes."""
    groups = [Group("a", 10, np.array([100, 10])), Group("b", 10, np.array([50]))]
    r = run_rollout(groups, "vllm", replicas=2, router="cache_aware", budget_tokens=500, max_new_tokens=128,
                    in_flight=2, record=True)
    assert r.placement.tolist() == [0, 0, 1]
    freed = float(r.seconds_at(0, 10))  # a's short request ends with step 10 of replica 0
    ends, secs = r.clocks[1]
    assert ends[:2].tolist() == [0, 0] and secs[1] == freed  # replica 1 idle from 0 until then
    assert float(r.seconds_at(1, 0)) == 0.0 and float(r.seconds_started(1, 1)) == freed
    run = next(seg for seg in r.timelines[1].segments if seg[0] == 2)
    assert float(r.seconds_started(1, run[2])) == freed and float(r.seconds_at(1, run[3])) == r.replica_seconds[1]


def test_the_live_router_counts_requests_in_flight_and_checks_finishes():
    from simulate import LiveRouter

    verl = LiveRouter("least_loaded", 3)
    assert [verl.select(g) for g in (0, 0, 0, 1)] == [0, 1, 2, 0]  # all sent at once: round robin
    verl.finished(1)
    assert verl.select(5) == 1 and verl.load == [2, 1, 1]
    slime = LiveRouter("cache_aware", 2)
    assert [slime.select(0) for _ in range(11)] == [0] * 11  # balanced enough: the group stays home
    assert slime.select(0) == 1  # 11 against 0: more than 10 apart and above 1.2 x, to the least loaded
    with pytest.raises(InvalidArgument, match="count"):
        slime.finished(1, 2)
    with pytest.raises(InvalidArgument, match="replica"):
        slime.finished(2)
    with pytest.raises(InvalidArgument, match="router"):
        LiveRouter("group_round_robin", 2)


def test_client_queues_send_within_each_window_and_let_an_empty_queue_steal():
    """ClientQueues: a replica is sent its queue's front while the predicted tokens it holds stay within
    the window (one request at least); a replica whose queue is empty takes the back of the queue with the
    most predicted work, never a request some replica could still take from its own queue."""
    from lengthsched.integrations.rollout import ClientQueues

    need = [100, 100, 100, 50, 50, 50]  # prompt + predicted completion (tokens)
    work = [90, 90, 90, 40, 40, 40]
    q = ClientQueues(2, 200, steals=True)
    for job in range(6):
        q.enter(job, 0, need[job], work[job])  # all planned on replica 0
    # replica 0 takes 0 and 1 (100 + 100 <= 200); replica 1 steals from the back: 5, 4, 3 (50 each),
    # then it is full (150 + 100 > 200) and request 2 waits
    assert sorted(q.send()) == sorted([(0, 0), (1, 0), (5, 1), (4, 1), (3, 1)])
    assert [list(x) for x in q.queues] == [[2], []] and q.send() == []
    q.finished(0, 100)
    assert q.send() == [(2, 0)]
    # without steals the other replica takes nothing, and one request is always allowed
    q = ClientQueues(2, 20, steals=False)
    for job in range(6):
        q.enter(job, 0, need[job], work[job])
    assert q.send() == [(0, 0)]
    assert q.drop(3) and not q.drop(3) and [list(x) for x in q.queues] == [[1, 2, 4, 5], []]
    with pytest.raises(InvalidArgument, match="replica"):
        q.enter(9, 2, 1, 1)
    with pytest.raises(InvalidArgument, match="limit_tokens"):
        ClientQueues(2, 0)


class _PlainClientQueues:
    """ClientQueues' decisions written as plainly as possible (O(R^2) per call): the specification the
    class's incremental send is checked against."""

    def __init__(self, replicas, limit, steals):
        self.limit, self.steals = limit, steals
        self.queues = [[] for _ in range(replicas)]
        self.work, self.load, self.need = [0.0] * replicas, [0.0] * replicas, {}

    def take(self, r, steal):
        if steal:
            waiting = [q for q in range(len(self.queues)) if self.queues[q]]
            if self.queues[r] or not waiting:
                return None
            source, end = max(waiting, key=lambda q: (self.work[q], -q)), -1
        elif self.queues[r]:
            source, end = r, 0
        else:
            return None
        item = self.queues[source][end]
        need, work = self.need[item]
        if self.load[r] > 0 and self.load[r] + need > self.limit:
            return None
        self.queues[source].pop(end)
        self.work[source] -= work
        self.load[r] += need
        return item

    def send(self):
        out = []
        for steal in (False, True) if self.steals else (False,):
            moved = True
            while moved:
                moved = False
                for r in range(len(self.queues)):
                    item = self.take(r, steal)
                    if item is not None:
                        out.append((item, r))
                        moved = True
        return out


@settings(max_examples=200, deadline=None)
@given(replicas=st.integers(1, 5), limit=st.sampled_from([50, 120, 400]), steals=st.booleans(),
       ops=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10**6)), min_size=1, max_size=40))
def test_client_queues_send_decides_as_the_plain_specification(replicas, limit, steals, ops):
    """Whatever requests enter, finish or are dropped, ClientQueues.send returns exactly the pairs, in the
    order, of the plain O(R^2) loop (rounds over the replicas' own queues, then steals in turn)."""
    from lengthsched.integrations.rollout import ClientQueues

    fast, plain = ClientQueues(replicas, limit, steals=steals), _PlainClientQueues(replicas, limit, steals)
    needs, flight, next_id = {}, [], 0
    for op, x in ops:
        if op <= 1:  # a few requests enter
            for k in range(1 + x % 4):
                r, work = (x >> (2 + k)) % replicas, [10, 40, 90, 200][(x >> (5 + k)) % 4]
                fast.enter(next_id, r, work + 20, work)
                plain.queues[r].append(next_id)
                plain.work[r] += work
                plain.need[next_id] = needs[next_id] = (work + 20, work)
                next_id += 1
        elif op == 2 and flight:  # a request sent earlier finishes
            item, r = flight.pop(x % len(flight))
            fast.finished(r, needs[item][0])
            plain.load[r] -= needs[item][0]
        elif op == 3 and next_id:  # a queued request is dropped (an aborted rollout)
            item = x % next_id
            where = [r for r, q in enumerate(plain.queues) if item in q]
            assert fast.drop(item) == bool(where)
            if where:
                plain.queues[where[0]].remove(item)
                plain.work[where[0]] -= needs[item][1]
        sent = fast.send()
        assert sent == plain.send()
        flight += sent
    assert [list(q) for q in fast.queues] == plain.queues
    assert fast.load == pytest.approx(plain.load) and fast.queued_work == pytest.approx(plain.work)


@pytest.mark.parametrize("policy", ["vllm", "sglang"])
def test_a_client_window_without_steals_as_large_as_the_step_is_the_placement_sent_as_slots_free(policy):
    groups = _groups([6, 5, 7, 4], seed=2, prompt=25)
    common = dict(replicas=3, budget_tokens=700, max_new_tokens=128)
    placed = np.array([g % 3 for g, group in enumerate(groups) for _ in group.lengths], dtype=np.int64)
    for cap in (5, None):
        plain = run_rollout(groups, policy, placement=placed, in_flight=cap or 100, **common)
        window = run_rollout(groups, policy, placement=placed, in_flight=cap, client_window=1e6, client_steals=False,
                             **common)
        assert window.seconds == pytest.approx(plain.seconds, rel=1e-12)
        assert window.placement.tolist() == placed.tolist()


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, 8), min_size=1, max_size=6), replicas=st.integers(1, 4),
       cap=st.one_of(st.none(), st.integers(1, 12)), share=st.floats(0.05, 4.0), steals=st.booleans(),
       policy=st.sampled_from(["vllm", "sglang"]), seed=st.integers(0, 50))
def test_a_client_window_collects_every_completion(sizes, replicas, cap, share, steals, policy, seed):
    groups = _groups(sizes, seed=seed, prompt=10)
    rng = np.random.default_rng(seed)
    placed = rng.integers(0, replicas, sum(sizes))
    r = run_rollout(groups, policy, replicas=replicas, budget_tokens=500, max_new_tokens=128, placement=placed,
                    in_flight=cap, client_window=share, client_steals=steals, record=True)
    assert [x.tolist() for x in r.collected_lengths] == [g.lengths.tolist() for g in groups]
    if cap is not None:
        assert _running_at_once(r) <= cap
    if not steals:
        assert r.placement.tolist() == placed.tolist()
    assert r.seconds >= r.lower_bound_seconds * (1 - 1e-12)


def test_a_client_window_is_checked():
    groups = _groups([4, 4])
    common = dict(replicas=2, budget_tokens=500, max_new_tokens=128)
    placed = np.zeros(8, dtype=np.int64)
    with pytest.raises(InvalidArgument, match="client_window"):
        run_rollout(groups, "vllm", client_window=1.0, **common)
    with pytest.raises(InvalidArgument, match="client_window"):
        run_rollout(groups, "vllm", placement=placed, client_window=0.0, **common)
    with pytest.raises(InvalidArgument, match="client_window"):
        run_rollout(groups, "vllm_priority", placement=placed, client_window=1.0, **common)


def test_client_queues_steal_only_what_the_planned_replica_has_no_room_for():
    """A request entering the queue of a replica with room goes to that replica, even when another
    replica's queue is empty: a steal takes only what waits because its own replica is full."""
    from lengthsched.integrations.rollout import ClientQueues

    q = ClientQueues(3, 1000, steals=True)
    q.enter("a", 2, 100, 90)
    assert q.send() == [("a", 2)]
    q.enter("b", 2, 950, 900)  # replica 2 holds 100: 1,050 > 1,000, so replica 0 (empty queue) steals it
    assert q.send() == [("b", 0)]


@pytest.mark.parametrize("policy, router", [("vllm", "least_loaded"), ("vllm", "group_round_robin"),
                                            ("seer", None), ("steal", None), ("steal_sglang", None)])
def test_group_finish_seconds_end_at_the_makespan_and_follow_each_groups_longest(policy, router):
    """group_finish_seconds: per group, when its last completion finished (wherever it ran); the latest is
    the makespan. In a pool that holds every request from the first step, a group whose longest
    completion is longer finishes no earlier. Without record=True it says what it needs."""
    groups = _groups([4, 3, 5, 4, 2, 6], seed=5)
    pred = np.concatenate([g.lengths for g in groups]).astype(float)
    roomy = dict(replicas=2, budget_tokens=100_000, max_new_tokens=128, predicted=pred)
    r = run_rollout(groups, policy, router=router, record=True, **roomy)
    finish = r.group_finish_seconds()
    assert finish.shape == (6,) and finish.max() == pytest.approx(r.seconds, rel=1e-12)
    assert np.all(finish > 0)
    if router == "least_loaded":  # verl's spread, all admitted at once: finish order = longest's order
        longest = [int(np.max(c)) for c in r.collected_lengths]
        for a in range(6):
            for b in range(6):
                if longest[a] < longest[b]:
                    assert finish[a] <= finish[b] + 1e-12
    tight = run_rollout(groups, policy, router=router, record=True, replicas=2, budget_tokens=300, max_new_tokens=128,
                        predicted=pred)
    assert tight.group_finish_seconds().max() == pytest.approx(tight.seconds, rel=1e-12)
    with pytest.raises(InvalidArgument, match="record"):
        run_rollout(groups, policy, router=router, **roomy).group_finish_seconds()


@pytest.mark.parametrize("policy", ["sglang", "steal_sglang"])
def test_an_sglang_engine_that_ran_dry_admits_under_its_initial_ratio_again(policy, monkeypatch):
    """SGLang's scheduler resets ``new_token_ratio`` to ``init_new_token_ratio`` whenever it has nothing to
    run (``self_check_during_idle``): a replica that ran dry and gets work later (sent by a capped client,
    or stolen) reserves for it from the initial ratio again, not from where the decay had gone."""
    from lengthsched.runtime.baselines import SGLangLike
    from lengthsched.runtime.dispatch import StealSGLang

    calls = []
    original = SGLangLike.idle_reset

    def spy(self, eng):
        calls.append((eng, eng.t, len(eng.running), len(eng.collected)))
        original(self, eng)
        assert self.ratio(eng.t) == self.init_ratio and self.ratio(eng.t + 10) < self.init_ratio

    monkeypatch.setattr(SGLangLike, "idle_reset", spy)
    monkeypatch.setattr(StealSGLang, "idle_reset", spy)
    groups = _groups([6, 5, 7, 4], seed=2, prompt=25)
    if policy == "sglang":  # the cache-aware router keeps groups home: a replica runs dry at step 115, then more
        r = run_rollout(groups, policy, replicas=3, router="cache_aware", budget_tokens=700, max_new_tokens=128,
                        in_flight=5)
    else:
        r = run_rollout(groups, policy, replicas=3, budget_tokens=500, max_new_tokens=128,
                        predicted=np.concatenate([g.lengths for g in groups]))
    assert [x.tolist() for x in r.collected_lengths] == [g.lengths.tolist() for g in groups]
    assert calls and all(running == 0 for _, _, running, _ in calls)  # only when nothing runs
    assert len({id(eng) for eng, *_ in calls}) == 3  # every replica runs dry at its end
    later = [(t, before, len(eng.collected)) for eng, t, _, before in calls if t > 0 and len(eng.collected) > before]
    if policy == "sglang":
        assert later and later[0][0] == 115  # it ran dry mid-step and ran more afterwards
