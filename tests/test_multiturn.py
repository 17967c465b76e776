"""simulate.run_multiturn: sessions of several turns with tool calls between them, and the engine's prefix cache of
conversations (Engine.cache_conversation)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthsched import InvalidArgument
from lengthsched.runtime import Engine
from simulate import Turns, run_multiturn, run_rollout, split_turns
from simulate.multiturn import MULTITURN_POLICIES
from simulate.workloads import Group


def _groups(sizes, seed=0, prompt=40, low=5, high=300):
    rng = np.random.default_rng(seed)
    return [Group(f"p{i}", prompt + 7 * i, rng.integers(low, high, size=n)) for i, n in enumerate(sizes)]


def _one_turn_each(groups) -> Turns:
    lengths = [np.array([x]) for g in groups for x in g.lengths]
    empty = [np.zeros(0, dtype=np.int64)] * len(lengths)
    return Turns(tuple(lengths), tuple(empty), tuple(np.zeros(0) for _ in lengths))


@pytest.mark.parametrize("policy", MULTITURN_POLICIES)
@pytest.mark.parametrize("budget", [1200, 4000])
def test_sessions_of_one_turn_are_the_single_turn_rollout(policy, budget):
    """One turn per session and no prefix cache: the step run_rollout simulates, to the last digit (the same
    engines, placement and decisions on one clock)."""
    groups = _groups([6, 6, 6, 6], seed=3)
    predicted = np.concatenate([np.full(6, int(np.median(g.lengths))) for g in groups])
    kwargs = dict(replicas=3, budget_tokens=budget, max_new_tokens=400, predicted=predicted)
    single = run_rollout(groups, policy, router="least_loaded" if policy != "steal" else None, **kwargs)
    multi = run_multiturn(groups, _one_turn_each(groups), policy, prefix_cache=False, **kwargs)
    assert multi.seconds == pytest.approx(single.seconds, rel=1e-12)
    assert multi.replica_seconds == pytest.approx(single.replica_seconds, rel=1e-12)
    assert (multi.preemptions, multi.recomputed_tokens, multi.prefill_tokens) == \
        (single.preemptions, single.recomputed_tokens, single.prefill_tokens)
    assert multi.later_turns == multi.moved_turns == multi.cache_hits == 0
    assert multi.lower_bound_seconds == pytest.approx(single.lower_bound_seconds)
    assert multi.lower_bound_seconds <= multi.seconds


def test_a_later_turn_waits_for_its_tool_and_finds_its_conversation_cached():
    """One session: 40 tokens, a 2 s tool answering 50 tokens, 30 tokens. The step lasts at least the tool; with the
    prefix cache the second turn prefills only the tool's answer and the conversation's last partial block."""
    groups = [Group("p", 100, np.array([70]))]
    turns = Turns((np.array([40, 30]),), (np.array([50]),), (np.array([2.0]),))
    kwargs = dict(replicas=1, budget_tokens=4096, max_new_tokens=100)
    cached = run_multiturn(groups, turns, "vllm", **kwargs)
    cold = run_multiturn(groups, turns, "vllm", prefix_cache=False, **kwargs)
    assert cached.later_turns == 1 and cached.cache_hits == 1 and cold.cache_hits == 0
    # the first turn holds prompt tail 4 (100 = 6 blocks of 16 + 4) + 40 tokens: 2 whole blocks cached (32 tokens)
    assert cached.cache_hit_tokens == 32
    # without the cache the prompt left the pool with the first turn (its 96 tokens of whole blocks prefilled again)
    assert cold.prefill_tokens - cached.prefill_tokens == 32 + 96
    assert cached.prefill_tokens == 100 + (4 + 40 + 50 - 32)
    assert 2.0 < cached.seconds < cold.seconds
    assert cached.lower_bound_seconds > 2.0 and cached.lower_bound_seconds <= cached.seconds


def test_the_step_is_never_shorter_than_its_slowest_tool_chain():
    groups = _groups([4, 4], seed=1)
    turns = split_turns(groups, turns=(3, 3), tool_seconds=1.5, tool_sigma=0.0, seed=2)
    out = run_multiturn(groups, turns, "vllm", replicas=2, budget_tokens=3000, max_new_tokens=400)
    assert out.seconds >= 2 * 1.5
    assert out.later_turns == 2 * 8 and out.tokens == sum(int(g.lengths.sum()) for g in groups)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), budget=st.sampled_from([900, 1500, 6000]),
       policy=st.sampled_from(MULTITURN_POLICIES), follow=st.booleans(), cache=st.booleans(), offload=st.booleans())
def test_every_turn_runs_within_the_pool_and_the_bound_holds(seed, budget, policy, follow, cache, offload):
    """The engines enforce each pool (prompts, live requests and cached conversations); every turn finishes; the
    bound is below the makespan; a stealing run that does not follow turns never moves a later one."""
    groups = _groups([5, 3, 4], seed=seed, high=200)
    turns = split_turns(groups, turns=(1, 4), tool_tokens=(5, 80), tool_seconds=0.3, seed=seed)
    rng = np.random.default_rng(seed)
    predicted = np.concatenate([np.full(len(g.lengths), int(rng.integers(20, 200))) for g in groups])
    out = run_multiturn(groups, turns, policy, replicas=2, budget_tokens=budget, max_new_tokens=400,
                        predicted=predicted, follow_turns=follow, prefix_cache=cache, kv_offload=offload)
    assert out.lower_bound_seconds <= out.seconds * (1 + 1e-9)
    assert out.later_turns == turns.count - len(turns.lengths)
    assert out.cache_hits + out.host_hits <= out.later_turns and (cache or out.cache_hits + out.host_hits == 0)
    assert offload or out.host_hits == 0
    if not policy.startswith("steal") or not follow:
        assert out.moved_turns == 0


def test_the_bound_counts_each_turns_conversation_and_each_tool_answer():
    """A session of two 150-token turns after a 100-token prompt, its tool answering 3,000 tokens: every decode row of
    the second turn reads the answer, and the answer is prefilled before it; the bound's session path counts both
    (it counted neither before), and it stays below the makespan."""
    from simulate.run import _cost

    groups = [Group("p", 100, np.array([300]))]
    for answer in (1, 3000):
        turns = Turns((np.array([150, 150]),), (np.array([answer]),), (np.array([0.01]),))
        out = run_multiturn(groups, turns, "vllm", replicas=1, budget_tokens=8192, max_new_tokens=300)
        kv = 300 * 100 + 300 * 299 // 2 + 150 * answer
        path = _cost(None).lower_bound_seconds(steps=300, decode_tokens=300, kv_tokens_read=kv, prefill_tokens=answer,
                                               prefill_context=answer * (100 + 150) + answer * (answer + 1) // 2)
        assert path + 0.01 <= out.lower_bound_seconds * (1 + 1e-12) and out.lower_bound_seconds <= out.seconds
    # on a tight multi-replica step the conversations are most of the KV area: the bound at least half the makespan
    groups = _groups([8, 8, 8, 8], seed=5, prompt=200, low=50, high=400)
    turns = split_turns(groups, turns=(2, 5), tool_tokens=(100, 600), tool_seconds=0.05, seed=5)
    out = run_multiturn(groups, turns, "vllm", replicas=2, budget_tokens=4096, max_new_tokens=400)
    assert 0.5 * out.seconds <= out.lower_bound_seconds <= out.seconds


def test_making_room_for_a_turn_does_not_count_the_prompt_it_is_about_to_use():
    """A pool full of cached conversations and the idle prompt of the waiting turn's own group: making room evicted
    that prompt, counted it as room and kept the conversations, though the turn's admission needs the prompt again;
    the turn waited for ever (the engine raised; found by a property check of the bound at tight pools). Now the
    conversations make up the room without it."""
    groups = [Group("p", 239, np.array([5, 12, 1, 15, 8, 8, 1]))]
    none = np.zeros(0, dtype=np.int64)
    turns = Turns((np.array([5]), np.array([1, 2, 1, 8]), np.array([1]), np.array([4, 6, 5]), np.array([1, 2, 5]),
                   np.array([1, 2, 4, 1]), np.array([1])),
                  (none, np.array([19, 46, 738]), none, np.array([92, 775]), np.array([7, 6]), np.array([826, 17, 5]),
                   none),
                  (np.zeros(0), np.array([1.421, 6.95, 4.019]), np.zeros(0), np.array([10.512, 6.415]),
                   np.array([12.963, 0.309]), np.array([1.574, 5.78, 9.055]), np.zeros(0)))
    for budget in (1745, 2000):
        for replicas in (1, 2, 4):
            out = run_multiturn(groups, turns, "vllm", replicas=replicas, budget_tokens=budget, max_new_tokens=2000)
            assert out.lower_bound_seconds <= out.seconds and out.later_turns == 10
    eng = Engine([3, 5, 4, 2], budget_tokens=100, context=[10, 10, 7, 7])
    eng.hold_prompts([0, 0, 1, 1], [10, 7])
    for job in range(4):
        eng.claim(job)
    eng.admit(0)
    eng.admit(2)
    eng.advance(3, False)
    eng.advance(4, False)  # jobs 0 and 2 finished; their siblings 1 and 3 wait: both prompts held, idle
    eng.cache_conversation(3, 48)  # and a cached conversation (job 3's later turn, say)
    assert list(eng.held_groups()) == [0, 1] and eng.conversation_kv_held == 48
    # making 10 tokens of room for job 1: both idle prompts go, but job 1's own (group 0's, 10 tokens) frees nothing
    # for it, so the conversation goes as well
    assert eng.evict_idle(10, keep=1) == 10 + 7 + 48 and not list(eng.held_groups())
    assert eng.conversation_kv_held == 0 and eng.load_need(1) == 10


def _piled_up():
    """Two prompts whose sessions alternate long and short second turns: each group spread over both replicas,
    every long second turn lands on replica 0 (sticky turns) and waits there for memory."""
    lengths = np.array([1200, 20] * 3)
    groups = [Group("a", 32, lengths), Group("b", 32, lengths)]
    turns = Turns(tuple(np.array([10, x - 10]) for _ in groups for x in lengths), tuple([np.array([16])] * 12),
                  tuple([np.array([0.2])] * 12))
    return groups, turns, dict(replicas=2, budget_tokens=3 * 1280, max_new_tokens=1300, predicted=np.full(12, 600))


def test_stealing_that_follows_turns_moves_later_turns_that_wait():
    """Sessions alternate long and short second turns, so every long one lands on replica 0 (each group spread
    over both replicas, sticky turns) and waits there for memory; the stealing that follows turns takes some to
    replica 1 and ends sooner than the one that sees first turns only (the same as vLLM with verl's routing)."""
    groups, turns, kwargs = _piled_up()
    placed = run_multiturn(groups, turns, "steal", follow_turns=False, **kwargs)
    followed = run_multiturn(groups, turns, "steal", **kwargs)
    verl = run_multiturn(groups, turns, "vllm", **kwargs)
    assert placed.moved_turns == 0 and followed.moved_turns > 0
    assert placed.seconds == pytest.approx(verl.seconds)
    assert followed.seconds < 0.8 * placed.seconds


def test_split_turns_cuts_every_length_and_draws_tools():
    groups = _groups([8, 8], seed=5, low=1, high=50)
    turns = split_turns(groups, turns=(2, 5), tool_tokens=(10, 100), tool_seconds=0.5, tool_sigma=0.5, seed=1)
    flat = np.concatenate([g.lengths for g in groups])
    assert [int(x.sum()) for x in turns.lengths] == flat.tolist()
    for total, ls, tt, ts in zip(flat, turns.lengths, turns.tool_tokens, turns.tool_seconds):
        assert min(2, total) <= len(ls) <= min(5, total) and ls.min() >= 1
        assert len(tt) == len(ts) == len(ls) - 1
        assert ((tt >= 10) & (tt <= 100)).all() and (ts > 0).all()
    again = split_turns(groups, turns=(2, 5), tool_tokens=(10, 100), tool_seconds=0.5, tool_sigma=0.5, seed=1)
    assert all((a == b).all() for a, b in zip(turns.lengths, again.lengths))


@pytest.mark.parametrize("kwargs, name", [
    (dict(turns=(3, 2)), "turns"), (dict(turns=(0, 2)), "turns"), (dict(tool_tokens=(9, 1)), "tool_tokens"),
    (dict(tool_seconds=0.0), "tool_seconds"), (dict(tool_sigma=-1.0), "tool_sigma"), (dict(seed=-1), "seed")])
def test_split_turns_names_a_bad_argument(kwargs, name):
    with pytest.raises(InvalidArgument, match=name):
        split_turns(_groups([2]), **kwargs)


def test_run_multiturn_names_a_bad_argument():
    groups = _groups([2, 2])
    turns = split_turns(groups, seed=0)
    kwargs = dict(replicas=1, budget_tokens=4000, max_new_tokens=400)
    with pytest.raises(InvalidArgument, match="policy"):
        run_multiturn(groups, turns, "seer", **kwargs)
    with pytest.raises(InvalidArgument, match="turns"):
        run_multiturn(groups, [np.array([3])], "vllm", **kwargs)
    with pytest.raises(InvalidArgument, match="turns"):
        run_multiturn(groups, split_turns(_groups([2, 2], seed=9), seed=0), "vllm", **kwargs)
    with pytest.raises(InvalidArgument, match="turns"):
        run_multiturn(groups[:1], turns, "vllm", **kwargs)
    with pytest.raises(InvalidArgument, match="budget_tokens"):
        run_multiturn(groups, turns, "vllm", replicas=1, budget_tokens=300, max_new_tokens=400)
    with pytest.raises(InvalidArgument, match="predicted"):
        run_multiturn(groups, turns, "vllm", predicted=object.__new__(type("P", (), {"predict": None})), **kwargs)
    with pytest.raises(InvalidArgument, match="turns"):
        Turns((np.array([3, 0]),), (np.array([1]),), (np.array([1.0]),))
    with pytest.raises(InvalidArgument, match="turns"):
        Turns((np.array([3, 2]),), (np.array([], dtype=np.int64),), (np.array([1.0]),))
    with pytest.raises(InvalidArgument, match="turns"):
        Turns((np.array([3, 2]),), (np.array([4]),), (np.array([np.inf]),))


def test_engine_caches_conversations_in_the_pool_and_evicts_the_oldest_first():
    eng = Engine([5, 5, 5], tails=[40, 20, 33], block_size=16, budget_tokens=10_000)
    eng.cache_conversation(0, 40)  # 3 blocks held, 2 whole blocks hit
    eng.cache_conversation(1, 20)  # 2 blocks held, 1 hit
    assert eng.conversation_kv_held == 80 and eng.kv_tokens() == 80
    assert (eng.cached_hit(0), eng.cached_hit(1), eng.cached_hit(2)) == (32, 16, 0)
    assert eng.reused_blocks(0) == 3 and eng.prefill_need(0) == 40 - 32
    assert eng.evict_idle(10, keep=0) == 32 and eng.conversation_kv_held == 48  # job 1's, not the kept one
    eng.cache_conversation(2, 33)
    assert eng.evict_idle(1) == 48  # the oldest first: job 0's
    assert list(eng._conv) == [2]
    eng.admit(2)  # a hit: 32 tokens not prefilled, its cached blocks become its own
    assert eng.cache_hits == 1 and eng.cache_hit_tokens == 32 and eng.conversation_kv_held == 0
    eng.advance(1, False)
    assert eng.step_log().prefill_tokens.tolist() == [1]
    assert eng.evict_idle() == 0


def test_with_offloading_an_evicted_conversation_is_loaded_back_instead_of_prefilled():
    """Engine.offload_conversations (run_multiturn's kv_offload): a conversation evicted under pressure goes to host
    memory; the later turn admitted there loads its whole blocks (charged to the admitting step) and prefills the
    rest; a conversation dropped because its turn runs elsewhere leaves host memory too."""
    eng = Engine([5, 5], tails=[40, 20], block_size=16, budget_tokens=10_000)
    eng.offload_conversations = True
    eng.cache_conversation(0, 40)
    eng.cache_conversation(1, 20)
    assert eng.evict_idle(1) == 48 and eng.conversation_kv_held == 32 and eng.host_hit(0) == 32
    assert eng.host_hit(1) == 0 and eng.prefill_need(0) == 40 - 32  # job 1 still on the GPU; job 0 from the host
    eng.admit(0)
    assert (eng.host_hits, eng.host_hit_tokens, eng.cache_hits, eng.loaded_tokens) == (1, 32, 0, 32)
    eng.advance(1, False)
    log = eng.step_log()
    assert log.prefill_tokens.tolist() == [8] and log.loaded_tokens.tolist() == [32]
    eng.evict_idle()
    eng.drop_cached(1)  # its turn runs elsewhere
    assert eng.host_hit(1) == 0 and not eng._host_conv


def test_kv_offloading_turns_evicted_conversations_into_host_hits():
    """run_multiturn(kv_offload=True): in a tight pool, most later turns that lost their conversation to eviction
    load it back; the run is never worse for the cache (hits counted together) and names a bad flag."""
    groups = _groups([8, 8, 8], seed=7, high=400)
    turns = split_turns(groups, turns=(2, 4), tool_tokens=(10, 60), tool_seconds=0.3, seed=7)
    kwargs = dict(replicas=2, budget_tokens=1500, max_new_tokens=500)
    plain = run_multiturn(groups, turns, "vllm", **kwargs)
    offload = run_multiturn(groups, turns, "vllm", kv_offload=True, **kwargs)
    assert plain.host_hits == 0 and offload.host_hits > 0
    assert offload.cache_hits + offload.host_hits > plain.cache_hits
    assert offload.prefill_tokens < plain.prefill_tokens
    cold = run_multiturn(groups, turns, "vllm", kv_offload=True, prefix_cache=False, **kwargs)
    assert cold.host_hits == cold.cache_hits == 0  # only preempted requests' KV goes to host memory then
    with pytest.raises(InvalidArgument, match="kv_offload"):
        run_multiturn(groups, turns, "vllm", kv_offload="yes", **kwargs)


def test_steal_observed_submits_later_turns_to_its_coordinator_only_when_it_follows_them():
    """steal_observed decides from snapshots through a StealCoordinator: told of first turns only, it never moves a
    later turn; told of every turn, it takes long later turns that wait to the other replica, as steal does."""
    groups, turns, kwargs = _piled_up()
    blind = run_multiturn(groups, turns, "steal_observed", follow_turns=False, **kwargs)
    followed = run_multiturn(groups, turns, "steal_observed", **kwargs)
    polled = run_multiturn(groups, turns, "steal_observed", snapshot_seconds=0.25, **kwargs)
    assert blind.moved_turns == 0 and followed.moved_turns > 0 and polled.moved_turns > 0
    assert followed.seconds < 0.8 * blind.seconds and polled.seconds < 0.9 * blind.seconds
    with pytest.raises(InvalidArgument, match="snapshot_seconds"):
        run_multiturn(groups, turns, "steal", snapshot_seconds=0.25, **kwargs)
    with pytest.raises(InvalidArgument, match="snapshot_seconds"):
        run_multiturn(groups, turns, "steal_observed", snapshot_seconds=0.0, **kwargs)


def test_steal_observed_takes_a_later_turn_only_after_a_snapshot_shows_it():
    """In pools that hold every session nothing waits: the driver's coordinator, which learns of a later turn from
    the first snapshot that shows it on its engine (running by then), steals none, though replicas whose sessions
    sit in tool calls look idle while later turns arrive elsewhere; it makes only the moves of running turns to
    idle replicas that steal, which sees the engines, makes (the same step)."""
    groups = _groups([8, 8, 8, 8], seed=4, high=400)
    turns = split_turns(groups, turns=(3, 5), tool_tokens=(10, 50), tool_seconds=0.2, seed=4)
    predicted = np.concatenate([np.full(8, int(np.median(g.lengths))) for g in groups])
    kwargs = dict(replicas=4, budget_tokens=200_000, max_new_tokens=400, predicted=predicted)
    observed = run_multiturn(groups, turns, "steal_observed", **kwargs)
    engines = run_multiturn(groups, turns, "steal", **kwargs)
    assert observed.later_turns > 50 and observed.preemptions == 0
    assert observed.moved_turns == engines.moved_turns and observed.seconds == pytest.approx(engines.seconds)


def test_a_running_cap_limits_each_replica():
    """max_num_seqs: each replica runs at most that many turns at once (vLLM's max_num_seqs), so the step is slower
    than with the pool alone; a bad cap is an error naming it."""
    groups = _groups([6, 6], seed=2)
    turns = split_turns(groups, turns=(2, 3), tool_seconds=0.1, seed=2)
    kwargs = dict(replicas=2, budget_tokens=50_000, max_new_tokens=400)
    free = run_multiturn(groups, turns, "vllm", **kwargs)
    capped = run_multiturn(groups, turns, "vllm", max_num_seqs=1, **kwargs)
    two = run_multiturn(groups, turns, "vllm", max_num_seqs=2, **kwargs)
    assert capped.seconds > two.seconds > free.seconds and capped.seconds > 1.2 * free.seconds
    with pytest.raises(InvalidArgument, match="max_num_seqs"):
        run_multiturn(groups, turns, "vllm", max_num_seqs=0, **kwargs)


def _two_groups_one_busy(first_turn: int):
    """Group a's two sessions start on replica 0 (its home under SGLang's router): a1 runs a first turn of
    ``first_turn`` tokens, a 0.01 s tool answering 20 tokens, then 30 tokens; a2 one long turn that keeps replica 0
    busy. Group b's one short session starts on replica 1 and is done before a1's tool returns."""
    groups = [Group("a", 100, np.array([first_turn + 30, 1500])), Group("b", 100, np.array([5]))]
    turns = Turns((np.array([first_turn, 30]), np.array([1500]), np.array([5])),
                  (np.array([20]), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)),
                  (np.array([0.01]), np.zeros(0), np.zeros(0)))
    return groups, turns, dict(replicas=2, budget_tokens=20_000, max_new_tokens=1600)


def test_sglangs_router_sends_a_turn_home_only_while_the_prompt_is_most_of_its_text():
    """SGLang's router sees requests, not answers: turn 2 matches only its prompt. With a short first turn (prompt
    100 of 150 tokens) it returns to its group's replica and finds its conversation cached; after a long one (100
    of 520) it goes to the least loaded replica, moved, and prefills its conversation there. verl's sticky routing
    keeps it home either way."""
    for first, home in ((30, True), (400, False)):
        groups, turns, kwargs = _two_groups_one_busy(first)
        routed = run_multiturn(groups, turns, "sglang", router="cache_aware", **kwargs)
        sticky = run_multiturn(groups, turns, "sglang", **kwargs)
        assert routed.router == "cache_aware" and sticky.router == "sticky"
        assert sticky.moved_turns == 0 and sticky.cache_hits == 1
        assert (routed.moved_turns, routed.cache_hits) == ((0, 1) if home else (1, 0))
        if not home:
            assert routed.prefill_tokens > sticky.prefill_tokens


def test_sglang_counts_cached_conversations_as_free_when_it_admits():
    """One session on one SGLang engine: the second turn reserves its whole max_new_tokens, which fits only if the
    cached conversation's 40 tokens count as free (SGLang's evictable tokens); they are not evicted (the request
    takes them over), so the turn finds its conversation."""
    groups = [Group("p", 100, np.array([70]))]
    turns = Turns((np.array([40, 30]),), (np.array([50]),), (np.array([2.0]),))
    out = run_multiturn(groups, turns, "sglang", replicas=1, budget_tokens=260, max_new_tokens=100)
    assert out.cache_hits == 1 and out.cache_hit_tokens == 40


def test_run_slime_multiturn_is_slime_as_it_ships_until_its_predictor_has_seen_a_length():
    """With an online predictor that has seen nothing the integration leaves the step to slime (SGLang's router on
    every turn); with predictions each session runs every turn on its planned engine, through the client window."""
    from lengthsched import OnlineLengthPredictor
    from simulate.multiturn import run_slime_multiturn

    groups = _groups([6, 6, 6, 6], seed=4)
    turns = split_turns(groups, turns=(2, 3), tool_tokens=(5, 40), tool_seconds=0.2, seed=4)
    kwargs = dict(replicas=3, budget_tokens=2500, max_new_tokens=400)
    cold = run_slime_multiturn(groups, turns, OnlineLengthPredictor(), **kwargs)
    slime = run_multiturn(groups, turns, "sglang", router="cache_aware", **kwargs)
    assert cold.seconds == slime.seconds and cold.router == "cache_aware"
    predicted = np.concatenate([np.full(6, int(np.median(g.lengths))) for g in groups])
    planned = run_slime_multiturn(groups, turns, predicted, window=0.2, **kwargs)  # about two sessions an engine
    at_once = run_slime_multiturn(groups, turns, predicted, window=0, **kwargs)
    assert planned.router == at_once.router == "placed"
    assert planned.moved_turns == at_once.moved_turns == 0
    assert planned.tokens == at_once.tokens == slime.tokens
    assert planned.seconds != at_once.seconds  # the window held sessions back
    one = run_slime_multiturn(groups, turns, predicted, replicas=1, budget_tokens=2500, max_new_tokens=400)
    assert one.seconds == run_multiturn(groups, turns, "sglang", replicas=1, budget_tokens=2500,
                                        max_new_tokens=400).seconds


def test_run_multiturn_names_a_bad_routing_argument():
    groups = _groups([2, 2])
    turns = split_turns(groups, seed=0)
    kwargs = dict(replicas=2, budget_tokens=4000, max_new_tokens=400)
    with pytest.raises(InvalidArgument, match="router"):
        run_multiturn(groups, turns, "vllm", router="round_robin", **kwargs)
    with pytest.raises(InvalidArgument, match="router"):
        run_multiturn(groups, turns, "steal", router="cache_aware", **kwargs)
    with pytest.raises(InvalidArgument, match="placement"):
        run_multiturn(groups, turns, "steal_sglang", placement=[0, 1, 0, 1], **kwargs)
    with pytest.raises(InvalidArgument, match="placement"):
        run_multiturn(groups, turns, "sglang", placement=[0, 1, 0], **kwargs)
    with pytest.raises(InvalidArgument, match="router"):
        run_multiturn(groups, turns, "sglang", placement=[0, 1, 0, 1], router="cache_aware", **kwargs)
    with pytest.raises(InvalidArgument, match="client_window"):
        run_multiturn(groups, turns, "sglang", client_window=2.0, **kwargs)
    with pytest.raises(InvalidArgument, match="client_window"):
        run_multiturn(groups, turns, "sglang", placement=[0, 1, 0, 1], client_window=-1.0, **kwargs)
    from simulate.multiturn import run_slime_multiturn
    with pytest.raises(InvalidArgument, match="router"):
        run_slime_multiturn(groups, turns, np.full(4, 50), router="sticky", **kwargs)
