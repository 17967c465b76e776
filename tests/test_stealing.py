"""StealCoordinator: the simulator's steal decisions from what a framework observes, and a toy cluster of
vLLM-like engines driven through abort-and-resubmit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthsched.errors import InvalidArgument
from lengthsched.integrations import MOVE_CHUNK, Move, StealCoordinator


def test_a_drained_replica_steals_the_back_of_the_fullest_waiting_queue():
    c = StealCoordinator(2, pool_tokens=10_000, chunk=None)
    for j in range(6):
        c.submit(f"r{j}", 1, predicted=100)
    c.submit("a", 0, predicted=100)
    c.observe(1, {"r0": 5, "r1": 5, "r2": 0, "r3": 0, "r4": 0, "r5": 0})  # r0, r1 run; the rest wait
    c.observe(0, {"a": 7})
    c.observe(1, {"r0": 9, "r1": 9, "r2": 0, "r3": 0, "r4": 0, "r5": 0})
    c.observe(0, {})  # a finished: replica 0 has nothing waiting and room
    moves = c.decide()
    assert moves == [Move("r4", 1, 0, 0, "steal"), Move("r5", 1, 0, 0, "steal")]  # half of 400 waiting, from the back
    assert c.replica_of("r5") == 0 and c.waiting(0) == ["r4", "r5"] and c.waiting(1) == ["r2", "r3"]
    assert c.decide() == []  # replica 0 now has requests waiting
    assert c.steals == 2 and c.moves == 0


def test_a_snapshot_of_ids_never_submitted_says_so_once(caplog):
    """An engine that reports its own request ids (not those given to submit) would silently end every request
    the coordinator knows there: a warning says so, once."""
    c = StealCoordinator(2, pool_tokens=10_000)
    c.submit("r0", 0, predicted=100)
    c.submit("r1", 0, predicted=100)
    with caplog.at_level("WARNING", logger="lengthsched.integrations.stealing"):
        c.observe(0, {"engine-id-7": 3})
        c.observe(1, {"engine-id-8": 3})
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "none of the 1 requests in the snapshot was submitted there" in warned[0]
    assert c.in_flight(0) == []  # taken as finished, as the warning says
    caplog.clear()
    with caplog.at_level("WARNING", logger="lengthsched.integrations.stealing"):
        c.submit("r2", 1, predicted=100)
        c.observe(1, {"r2": 4})  # known ids: no warning
    assert not caplog.records


def test_a_preempted_request_moves_with_its_tokens_and_counts_what_it_has_left():
    c = StealCoordinator(2, pool_tokens=10_000, chunk=None)
    c.submit("p", 1, predicted=400)
    c.submit("q", 1, predicted=100)
    c.submit("x", 1, predicted=100)
    c.observe(1, {"p": 300, "q": 0, "x": 10})  # p and x ran
    c.observe(1, {"p": 300, "q": 0, "x": 20})  # p stopped growing: preempted; q never started
    assert c.waiting(1) == ["p", "q"]
    moves = c.decide()  # waiting work: p 100 to go, q 100: half is one request from the back
    assert moves == [Move("q", 1, 0, 0, "steal")]
    c.observe(0, {"q": 0})
    c.observe(0, {"q": 3})
    c.observe(1, {"p": 300, "x": 30})
    assert c.decide() == [Move("p", 1, 0, 300, "steal")]  # replica 0 drained again (q runs): p moves with 300 tokens


def test_an_idle_replica_takes_a_running_request_at_a_chunk_boundary_while_one_stays():
    c = StealCoordinator(3, pool_tokens=100_000)
    assert c.chunk == MOVE_CHUNK == 128
    for j, pred in enumerate([1000, 3000, 2000, 500]):
        c.submit(j, 0, predicted=pred)
    c.observe(0, {0: 1, 1: 1, 2: 1, 3: 1})
    assert c.decide() == []  # nothing crossed a chunk
    c.observe(0, {0: 130, 1: 130, 2: 130, 3: 120})  # 0, 1, 2 crossed 128; 3 did not
    moves = c.decide()
    assert moves == [Move(1, 0, 1, 130, "move"), Move(2, 0, 2, 130, "move")]  # most to go first, one per idle replica
    c.observe(0, {0: 140, 3: 135})
    c.observe(1, {1: 131})
    c.observe(2, {2: 131})
    c.observe(0, {0: 260, 3: 140})
    assert c.decide() == []  # no replica is idle
    c.observe(1, {})  # request 1 finished there: replica 1 idle; 0 crossed a chunk, 3 has not since
    c.observe(0, {0: 270, 3: 258})  # 3 crossed 256 now; request 0 crossed at 256 before the last decision
    assert c.decide() == [Move(3, 0, 1, 258, "move")]


def test_a_replica_whose_running_requests_fill_its_pool_does_not_steal():
    c = StealCoordinator(2, pool_tokens=1000, chunk=None)
    c.submit("big", 0, predicted=900, prompt_tokens=50, group="g")
    c.submit("big2", 0, predicted=60, prompt_tokens=50, group="g")  # the group's prompt is held once
    c.submit("w", 1, predicted=100)
    c.submit("w2", 1, predicted=100)
    c.observe(0, {"big": 5, "big2": 5})
    c.observe(1, {"w": 0, "w2": 0})
    c.observe(0, {"big": 10, "big2": 10})
    assert c.decide() == []  # 900 + 60 + 50 of 1000: no room
    c.observe(0, {"big": 20})  # big2 finished: 900 + 50 < 1000
    assert c.decide() == [Move("w2", 1, 0, 0, "steal")]


def test_with_a_compressed_cache_the_room_counts_what_each_request_holds():
    """kv_cap (Sparse-RL's budget + interval): the same replica as above has room, its long request holding at
    most 300 tokens (300 + 60 + 50 of 1,000), so it steals; kv_cap is checked."""
    c = StealCoordinator(2, pool_tokens=1000, chunk=None, kv_cap=300)
    c.submit("big", 0, predicted=900, prompt_tokens=50, group="g")
    c.submit("big2", 0, predicted=60, prompt_tokens=50, group="g")
    c.submit("w", 1, predicted=100)
    c.submit("w2", 1, predicted=100)
    c.observe(0, {"big": 5, "big2": 5})
    c.observe(1, {"w": 0, "w2": 0})
    c.observe(0, {"big": 10, "big2": 10})
    assert c.decide() == [Move("w2", 1, 0, 0, "steal")]
    with pytest.raises(InvalidArgument, match="kv_cap"):
        StealCoordinator(2, pool_tokens=1000, kv_cap=0)


def test_snapshots_ignore_unknown_and_moved_requests_and_drop_finished_ones():
    c = StealCoordinator(2, pool_tokens=1000, chunk=None)
    c.submit("a", 0, predicted=10)
    c.submit("b", 0, predicted=10)
    c.observe(0, {"a": 1, "b": 0, "someone else's": 4})
    assert c.in_flight(0) == ["a", "b"] and c.waiting(0) == ["b"]
    assert c.decide() == [Move("b", 0, 1, 0, "steal")]
    c.observe(0, {"a": 2, "b": 0})  # taken before the abort landed
    assert c.replica_of("b") == 1
    c.observe(0, {"b": 0})  # a finished; b is ignored here
    assert c.replica_of("a") is None and c.in_flight(0) == []
    c.finish("b")
    assert c.replica_of("b") is None


@pytest.mark.parametrize("call, name", [
    (lambda c: c.submit("x", 2, predicted=1), "replica"),
    (lambda c: c.submit("x", 0, predicted=-1), "predicted"),
    (lambda c: c.submit("x", 0, predicted=1, prompt_tokens=-3), "prompt_tokens"),
    (lambda c: c.observe(0, [("x", 1)]), "generated"),
    (lambda c: c.observe(0, {"x": -1}), "generated"),
    (lambda c: c.waiting(5), "replica"),
])
def test_bad_arguments_are_named(call, name):
    c = StealCoordinator(2, pool_tokens=100)
    with pytest.raises(InvalidArgument, match=f"'{name}'"):
        call(c)


@pytest.mark.parametrize("kwargs, name", [({"replicas": 0}, "replicas"), ({"pool_tokens": 0}, "pool_tokens"),
                                          ({"chunk": 0}, "chunk"), ({"share": 1.5}, "share"), ({"room": 0}, "room")])
def test_bad_settings_are_named(kwargs, name):
    args = {"replicas": 2, "pool_tokens": 100} | kwargs
    with pytest.raises(InvalidArgument, match=f"'{name}'"):
        StealCoordinator(**args)


# ---------------------------------------------------------------------------------------------- toy cluster
class ToyEngine:
    """A vLLM-like engine in steps: FCFS admission while the pool holds every running request's prompt
    and tokens plus one, the newest running request preempted (back to the front of the queue, its
    tokens kept) when the next step does not fit; a step takes 1 + per_row x rows time units."""

    def __init__(self, pool: int, per_row: float = 0.05):
        self.pool, self.per_row, self.waiting, self.running, self.clock = pool, per_row, [], [], 0.0
        self.prompt, self.length, self.generated = {}, {}, {}

    def add(self, rid, prompt: int, length: int, generated: int = 0) -> None:
        self.prompt[rid], self.length[rid], self.generated[rid] = prompt, length, generated
        self.waiting.append(rid)

    def abort(self, rid) -> int:
        if rid in self.waiting:
            self.waiting.remove(rid)
        else:
            self.running.remove(rid)
        del self.prompt[rid], self.length[rid]
        return self.generated.pop(rid)

    def _kv(self, extra=()) -> int:
        return sum(self.prompt[j] + self.generated[j] + 1 for j in [*self.running, *extra])

    def step(self) -> list:
        while self.waiting and self._kv([self.waiting[0]]) <= self.pool:
            self.running.append(self.waiting.pop(0))
        while self.running and self._kv() > self.pool:
            self.waiting.insert(0, self.running.pop())  # preempt the newest
        self.clock += 1.0 + self.per_row * len(self.running)
        done = []
        for j in list(self.running):
            self.generated[j] += 1
            if self.generated[j] >= self.length[j]:
                self.running.remove(j)
                done.append(j)
                del self.prompt[j], self.length[j], self.generated[j]
        return done

    def snapshot(self) -> dict:
        return dict(self.generated)


def run_cluster(lengths, placement, replicas, pool, predicted, coordinator=None, poll=5.0, prompt=16, per_row=0.05):
    """Time units until every request finished, and the moves made."""
    engines = [ToyEngine(pool, per_row) for _ in range(replicas)]
    for j, (n, r) in enumerate(zip(lengths, placement)):
        engines[r].add(j, prompt, int(n))
        if coordinator is not None:
            coordinator.submit(j, r, predicted[j], prompt_tokens=prompt)
    finished, moves, next_poll = {}, [], poll
    while len(finished) < len(lengths):
        busy = [r for r in range(replicas) if engines[r].waiting or engines[r].running]
        r = min(busy, key=lambda k: engines[k].clock) if busy else None
        if coordinator is not None and (r is None or engines[r].clock >= next_poll):
            for k, eng in enumerate(engines):
                if eng.clock < next_poll:  # an idle replica waits for the poll
                    eng.clock = next_poll
                coordinator.observe(k, eng.snapshot())
            for m in coordinator.decide():
                carried = engines[m.source].abort(m.request)
                assert carried == m.generated
                engines[m.target].add(m.request, prompt, int(lengths[m.request]), carried)
                moves.append(m)
            next_poll += poll
            continue
        for j in engines[r].step():
            assert j not in finished  # each request finishes once, with exactly its length of tokens
            finished[j] = engines[r].clock
            if coordinator is not None:
                coordinator.finish(j)
    return max(finished.values()), moves


def test_on_a_lopsided_step_the_coordinator_moves_work_and_the_step_ends_sooner():
    lengths = [800] * 6 + [40] * 6
    placement = [0] * 6 + [1] * 6  # verl's spread would mix them; here replica 0 got every long one
    predicted = [300.0] * 12  # a prompt-level prediction: the same for every sibling
    # steps that slow down with their rows (what makes a move worth it: a request alone is faster)
    common = dict(pool=100_000, predicted=predicted, per_row=0.5)
    alone, _ = run_cluster(lengths, placement, 2, **common)
    c = StealCoordinator(2, pool_tokens=100_000)
    stolen, moves = run_cluster(lengths, placement, 2, coordinator=c, **common)
    assert moves and all(m.kind == "move" and (m.source, m.target) == (0, 1) for m in moves)
    assert all(m.generated > 0 and m.generated % MOVE_CHUNK < 10 for m in moves)  # moved near a chunk end
    assert stolen < alone * 0.95


def test_under_a_short_pool_waiting_requests_are_stolen_by_the_replica_that_drains():
    lengths = [300] * 16 + [20] * 16
    placement = [0] * 16 + [1] * 16
    predicted = [100.0] * 32
    alone, _ = run_cluster(lengths, placement, 2, pool=2_000, predicted=predicted)
    c = StealCoordinator(2, pool_tokens=2_000, chunk=None)
    stolen, moves = run_cluster(lengths, placement, 2, pool=2_000, predicted=predicted, coordinator=c)
    assert {m.kind for m in moves} == {"steal"} and moves[0].source == 0
    assert all(m.generated > 0 for m in moves)  # requests that had run (preempted) move with their tokens
    assert stolen < alone * 0.8


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 400), min_size=2, max_size=40), st.integers(1, 4), st.integers(0, 2**31 - 1),
       st.sampled_from([None, 16, 128]))
def test_every_request_finishes_once_with_its_own_length_whatever_moves(lengths, replicas, seed, chunk):
    rng = np.random.default_rng(seed)
    placement = rng.integers(0, replicas, len(lengths)).tolist()
    predicted = (np.asarray(lengths) * np.exp(rng.normal(0, 0.5, len(lengths)))).tolist()
    c = StealCoordinator(replicas, pool_tokens=1_200, chunk=chunk)
    _, moves = run_cluster(lengths, placement, replicas, pool=1_200, predicted=predicted, coordinator=c, poll=3.0)
    assert all(m.source != m.target for m in moves)
    assert c.in_flight(0) == [] and c.steals + c.moves == len(moves)
