"""lengthsched.integrations.verl_stealing: snapshots of vLLM's output processor, the vLLM request ids, the
abort-and-resubmit loop through verl's fully-async client, and the stealing manager.

The fakes follow vLLM 0.24.0 (``v1/engine/output_processor.py``: ``request_states`` keyed by internal ids
``f"{external}-{8 chars}"``, ``RequestState.external_req_id``, ``detokenizer.num_output_tokens()``,
``abort_requests(request_ids, internal)``; ``v1/engine/async_llm.py``: ``abort(request_id, internal=False)``)
and verl 0.9.1 (``vLLMHttpServer.generate`` / ``abort_request``, ``FullyAsyncLLMServerClient``'s resume loop).
Where verl is importable, the batch also runs through verl's real ``FullyAsyncLLMServerClient``.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from test_verl import VERL, Config, FakeAgentLoopManager, Remote, requires_verl, rollout_batch, trainer_config

from lengthsched import InvalidArgument
from lengthsched.integrations import StealCoordinator
from lengthsched.integrations import verl as lv
from lengthsched.integrations import verl_stealing as vs

PROMPT = 4  # prompt tokens of every row: [row key, 0, 0, 0]


# ----------------------------------------------------------------------------- vLLM 0.24.0 stand-ins
class FakeDetokenizer:
    """``IncrementalDetokenizer`` without a tokenizer: ``token_ids``, ``num_output_tokens()``."""

    def __init__(self):
        self.token_ids: list[int] = []

    def num_output_tokens(self) -> int:
        return len(self.token_ids)


class FakeRequestState:
    """``RequestState``: ``request_id`` (internal), ``external_req_id``, ``prompt_token_ids``,
    ``detokenizer``, ``queue``."""

    def __init__(self, request_id, external_req_id, prompt_token_ids, max_tokens, queue):
        self.request_id, self.external_req_id = request_id, external_req_id
        self.prompt_token_ids, self.prompt_len = list(prompt_token_ids), len(prompt_token_ids)
        self.detokenizer, self.max_tokens_param, self.queue = FakeDetokenizer(), max_tokens, queue

    def make_request_output(self, new_token_ids, pooling_output, finish_reason, stop_reason, kv_transfer_params=None):
        finished = finish_reason is not None
        out = SimpleNamespace(token_ids=list(self.detokenizer.token_ids), logprobs=None, num_preempted=0,
                              finish_reason=finish_reason)
        return SimpleNamespace(request_id=self.external_req_id, outputs=[out], finished=finished)


class FakeOutputProcessor:
    """``OutputProcessor``: ``request_states`` by internal id, ``external_req_ids``, ``abort_requests``."""

    def __init__(self):
        self.request_states: dict[str, FakeRequestState] = {}
        self.external_req_ids: defaultdict[str, list[str]] = defaultdict(list)

    def add_request(self, state: FakeRequestState) -> None:
        self.request_states[state.request_id] = state
        self.external_req_ids[state.external_req_id].append(state.request_id)

    def abort_requests(self, request_ids, internal: bool) -> list[str]:
        internal_ids = []
        for rid in request_ids:
            if internal:
                internal_ids.append(rid)
            else:
                internal_ids.extend(self.external_req_ids.pop(rid, []))
        out = []
        for rid in internal_ids:
            state = self.request_states.pop(rid, None)
            if state is not None:
                out.append(rid)
                state.queue.put_nowait(state.make_request_output([], None, "abort", None))
        return out

    def finish(self, state: FakeRequestState, reason: str) -> None:
        self.request_states.pop(state.request_id, None)
        ids = self.external_req_ids[state.external_req_id]
        ids.remove(state.request_id)
        if not ids:
            del self.external_req_ids[state.external_req_id]
        state.queue.put_nowait(state.make_request_output([], None, reason, None))


class FakeAsyncLLM:
    """An ``AsyncLLM`` stepped by the test: FCFS admission up to ``max_num_seqs``, one token per running
    request per :meth:`step`; a request stops at its row's true length (counting the tokens its prompt
    carries beyond the first ``PROMPT``) or at ``max_tokens``."""

    def __init__(self, true_length, max_num_seqs: int):
        self.output_processor = FakeOutputProcessor()
        self.true_length, self.max_num_seqs = true_length, max_num_seqs
        self.waiting: list[FakeRequestState] = []
        self.running: list[FakeRequestState] = []
        self.started: list[str] = []  # external ids in admission order
        self.aborts: list[str] = []

    async def generate(self, prompt, sampling_params, request_id, *, priority=0, lora_request=None):
        queue: asyncio.Queue = asyncio.Queue()
        state = FakeRequestState(f"{request_id}-{uuid.uuid4().hex[:8]}", request_id, prompt["prompt_token_ids"],
                                 sampling_params.max_tokens, queue)
        self.output_processor.add_request(state)
        self.waiting.append(state)
        while True:
            out = await queue.get()
            yield out
            if out.finished:
                return

    async def abort(self, request_id, internal: bool = False) -> None:
        self.aborts.append(request_id)
        for rid in self.output_processor.abort_requests([request_id] if isinstance(request_id, str) else request_id,
                                                        internal):
            self.waiting = [s for s in self.waiting if s.request_id != rid]
            self.running = [s for s in self.running if s.request_id != rid]

    def step(self) -> None:
        while self.waiting and len(self.running) < self.max_num_seqs:
            self.running.append(self.waiting.pop(0))
            self.started.append(self.running[-1].external_req_id)
        for state in list(self.running):
            state.detokenizer.token_ids.append(7)
            done = state.prompt_len - PROMPT + state.detokenizer.num_output_tokens()
            if done >= self.true_length(state.prompt_token_ids) or \
                    state.detokenizer.num_output_tokens() >= state.max_tokens_param:
                self.running.remove(state)
                self.output_processor.finish(state, "length")


class FakeVLLMHttpServer:
    """verl 0.9.1's ``vLLMHttpServer`` (vllm_async_server.py), the parts used here: ``generate(prompt_ids,
    sampling_params, request_id, image_data=None, video_data=None, audio_data=None, mm_processor_kwargs=None,
    priority=0, kv_transfer_params=None)`` (max_tokens from the sampling params, ``engine.generate``, the last
    output, ``stop_reason`` "aborted" for an abort), ``abort_request`` as verl writes it, ``clear_kv_cache``."""

    def __init__(self, engine: FakeAsyncLLM, node_rank: int = 0):
        self.engine, self.node_rank, self.cleared = engine, node_rank, 0

    async def generate(self, prompt_ids, sampling_params, request_id, image_data=None, video_data=None,
                       audio_data=None, mm_processor_kwargs=None, priority=0, kv_transfer_params=None):
        max_tokens = sampling_params.pop("max_tokens")
        params = SimpleNamespace(max_tokens=max(1, max_tokens), **sampling_params)
        final = None
        async for output in self.engine.generate({"prompt_token_ids": prompt_ids}, params, request_id,
                                                 priority=priority):
            final = output
        out = final.outputs[0]
        return SimpleNamespace(token_ids=out.token_ids, log_probs=None, routed_experts=None, num_preempted=0,
                               stop_reason="aborted" if out.finish_reason == "abort" else "completed",
                               extra_fields={"global_steps": None})

    async def clear_kv_cache(self):
        self.cleared += 1

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True) -> dict[str, Any]:
        # verl 0.9.1's body: the external id looked up among internal ids; abort_requests without `internal`.
        try:
            req_state = self.engine.output_processor.request_states.get(request_id)
            if req_state is None:
                return {"aborted": False, "error": f"Request {request_id} not found"}
            req_state.queue.put_nowait(req_state.make_request_output([], None, "abort", None))
            self.engine.output_processor.abort_requests([request_id])
            return {"aborted": True, "request_id": request_id}
        except Exception as e:  # noqa: BLE001 - verl's own catch-all
            return {"aborted": False, "request_id": request_id, "error": str(e)}


class FakeLLMServerClient:
    """verl 0.9.1's ``LLMServerClient`` (llm_server.py): the router gets its declared fields at acquire;
    ``generate`` is one attempt, sent to the server as ``_vllm_request_id(request_id)``, a fresh uuid."""

    def __init__(self, config, load_balancer_handle=None, **kwargs):
        self.config, self._load_balancer = config, load_balancer_handle

    async def _acquire_server(self, request_id: str, **extra):
        declared = await self._load_balancer.require_acquire_fields.remote()
        fields = {name: extra[name] for name in declared if name in extra}
        return await self._load_balancer.acquire_server.remote(request_id=request_id, **fields)

    def _vllm_request_id(self, request_id: str) -> str:
        return uuid.uuid4().hex

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, video_data=None,
                       audio_data=None, mm_processor_kwargs=None, **kwargs):
        server_id, server = await self._acquire_server(request_id, prompt_ids=prompt_ids, **kwargs)
        try:
            priority = kwargs.pop("priority", 0)
            extra = {"priority": priority} if priority != 0 else {}
            return await server.generate.remote(request_id=self._vllm_request_id(request_id), prompt_ids=prompt_ids,
                                                sampling_params=dict(sampling_params), **extra)
        finally:
            self._load_balancer.release_server.remote(server_id=server_id, request_id=request_id)


class FakeFullyAsyncLLMServerClient(FakeLLMServerClient):
    """verl 0.9.1's ``FullyAsyncLLMServerClient`` (llm_server.py): an "aborted" attempt (``super().generate``)
    is resubmitted with prompt + tokens so far and ``max_tokens`` reduced by them, after a wait (verl
    sleeps 1 s; ``retry_delay`` here, each wait counted in ``waits``)."""

    retry_delay = 0.0

    def __init__(self, config, load_balancer_handle=None, only_hybrid: bool = False, **kwargs):
        super().__init__(config, load_balancer_handle, **kwargs)
        self.waits = 0

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, video_data=None,
                       audio_data=None, mm_processor_kwargs=None, **kwargs):
        sampling_params, tokens = dict(sampling_params), []
        budget = sampling_params["max_tokens"]
        while True:
            output = await super().generate(request_id=request_id, prompt_ids=prompt_ids + tokens,
                                            sampling_params=sampling_params, **kwargs)
            tokens.extend(output.token_ids)
            sampling_params["max_tokens"] = budget - len(tokens)
            if len(tokens) >= budget:
                return SimpleNamespace(token_ids=tokens, stop_reason="length")
            if output.stop_reason not in ("aborted", "abort"):
                return SimpleNamespace(token_ids=tokens, stop_reason=output.stop_reason)
            self.waits += 1
            await asyncio.sleep(self.retry_delay)


def true_length_of(lengths):
    return lambda prompt_ids: lengths[prompt_ids[0]]


def per_turn_length_of(lengths, tool: int = -1, tool_tokens: int = 3):
    """Each turn of a multi-turn session generates its row's length (``lengths[k]``: tokens, or a list of them per
    turn): what its prompt holds up to the last tool answer (``tool_tokens`` of token ``tool`` each, an id no row
    key takes) counts as prompt, what follows (tokens carried by a moved attempt) as generated."""
    def length(prompt_ids):
        at = [i for i, t in enumerate(prompt_ids) if t == tool]
        per = lengths[prompt_ids[0]]
        turn = per if isinstance(per, int) else per[min(len(at) // tool_tokens, len(per) - 1)]
        return (at[-1] if at else PROMPT - 1) + 1 - PROMPT + turn
    return length


def cluster(lengths, max_num_seqs: int, replicas: int, true_length=None):
    servers_cls = vs.make_vllm_server_class(FakeVLLMHttpServer)
    length = true_length_of(lengths) if true_length is None else true_length
    engines = [FakeAsyncLLM(length, max_num_seqs) for _ in range(replicas)]
    servers = [servers_cls(e) for e in engines]
    router = lv.PlannedLoadBalancer({f"10.0.0.{r}:8000": Remote(s) for r, s in enumerate(servers)})
    return engines, servers, router


async def drive(lengths, placement, *, max_num_seqs=2, replicas=2, steal=True, real_client=False, poll_every=4,
                chunk=None):
    """A batch of rows (row k: true length ``lengths[k]``, planned on ``placement[k]``, priority
    ``k * replicas + placement[k]``) through the stealing client, the router and stepped engines, the
    driver polling every ``poll_every`` steps. Returns (steps, outputs by row, driver, engines, waits): the
    waits are the client's sleeps before a resubmission (verl's 1 s; counted, not slept, for verl's real
    client)."""
    if real_client:
        from verl.workers.rollout import llm_server

        counting = CountingAsyncio()
        llm_server.asyncio = counting
        try:
            out = await _drive(llm_server.FullyAsyncLLMServerClient, lengths, placement, max_num_seqs, replicas,
                               steal, poll_every, chunk)
        finally:
            llm_server.asyncio = asyncio
        return *out[:4], len(counting.sleeps)
    out = await _drive(FakeFullyAsyncLLMServerClient, lengths, placement, max_num_seqs, replicas, steal, poll_every,
                       chunk)
    return *out[:4], out[4].waits


class CountingAsyncio:
    """``asyncio`` for verl's ``llm_server`` module, whose ``sleep`` is counted and yields once instead of
    waiting."""

    def __init__(self):
        self.sleeps: list[float] = []

    def __getattr__(self, name):
        return getattr(asyncio, name)

    async def sleep(self, delay, result=None):
        self.sleeps.append(delay)
        await asyncio.sleep(0)
        return result


async def _drive(base, lengths, placement, max_num_seqs, replicas, steal, poll_every, chunk):
    engines, servers, router = cluster(lengths, max_num_seqs, replicas)
    config = trainer_config(response_length=512)
    client = vs.make_stealing_client_class(base)(config=config, load_balancer_handle=Remote(router))
    handles = await vs._call(Remote(router), "get_server_handles")
    driver = vs.StealDriver(StealCoordinator(replicas, pool_tokens=100_000, chunk=chunk), Remote(router), handles,
                            poll_interval=0.01)
    priorities = [k * replicas + r for k, r in enumerate(placement)]
    for k, (r, p) in enumerate(zip(placement, priorities)):
        driver.submit(p, r, predicted=100.0, prompt_tokens=PROMPT, group=k)
    tasks = [asyncio.ensure_future(client.generate(uuid.uuid4().hex, prompt_ids=[k, 0, 0, 0],
                                                   sampling_params={"max_tokens": 512}, priority=p))
             for k, p in enumerate(priorities)]
    steps = 0
    while not all(t.done() for t in tasks):
        for _ in range(20):
            await asyncio.sleep(0)
        if steal and steps % poll_every == 0:
            await driver.poll_once()
        if any(e.running or e.waiting for e in engines):
            for e in engines:
                e.step()
            steps += 1
        else:
            await asyncio.sleep(0.01)  # a resubmission on its way
        assert steps < 10_000
    if steal:
        await driver.poll_once()  # the last rows' completions: reported by the servers' snapshots
    return steps, [t.result() for t in tasks], driver, engines, client


# ----------------------------------------------------------------------------- the snapshot reader
def test_the_snapshot_reads_external_ids_and_generated_tokens_from_vllms_output_processor():
    engine = FakeAsyncLLM(lambda ids: 100, max_num_seqs=1)

    async def go():
        gens = [engine.generate({"prompt_token_ids": [0] * 5}, SimpleNamespace(max_tokens=50), rid).__anext__()
                for rid in ("a", "b")]
        tasks = [asyncio.ensure_future(g) for g in gens]
        await asyncio.sleep(0)
        for _ in range(3):
            engine.step()
        assert set(engine.output_processor.request_states) != {"a", "b"}  # keyed by internal ids
        assert vs.engine_snapshot(engine) == {"a": 3, "b": 0}  # b waits for a seat: it has generated nothing
        assert vs.engine_prompt_tokens(engine) == {"a": 5, "b": 5}
        result = await vs.abort_engine_request(engine, "a")
        assert result == {"aborted": True, "request_id": "a", "generated": 3} and engine.aborts == ["a"]
        assert (await tasks[0]).outputs[0].finish_reason == "abort"
        assert (await vs.abort_engine_request(engine, "a"))["aborted"] is False  # gone
        assert vs.engine_snapshot(engine) == {"b": 0}
        for t in tasks[1:]:
            t.cancel()

    asyncio.run(go())
    # Pooling states (no detokenizer) are left out; two internal requests of one id report the larger.
    states = {"x-1": SimpleNamespace(external_req_id="x", detokenizer=SimpleNamespace(num_output_tokens=lambda: 4)),
              "x-2": SimpleNamespace(external_req_id="x", detokenizer=SimpleNamespace(num_output_tokens=lambda: 9)),
              "p-1": SimpleNamespace(external_req_id="p", detokenizer=None),
              "old": SimpleNamespace(detokenizer=SimpleNamespace(num_output_tokens=lambda: 2))}
    assert vs.engine_snapshot(SimpleNamespace(output_processor=SimpleNamespace(request_states=states))) == \
        {"x": 9, "old": 2}
    # prompt tokens: RequestState.prompt_len, else its prompt_token_ids' length; neither: left out
    states["x-1"].prompt_len, states["old"].prompt_token_ids = 30, [1, 2, 3]
    assert vs.engine_prompt_tokens(SimpleNamespace(output_processor=SimpleNamespace(request_states=states))) == \
        {"x": 30, "old": 3}
    with pytest.raises(InvalidArgument, match="argument 'engine'"):
        vs.engine_snapshot(object())
    with pytest.raises(InvalidArgument, match="argument 'request_id'"):
        asyncio.run(vs.abort_engine_request(engine, ""))


def test_verls_own_abort_request_misses_vllms_internal_ids_and_the_server_class_fixes_it():
    async def go():
        engine = FakeAsyncLLM(lambda ids: 100, max_num_seqs=4)
        plain, ours = FakeVLLMHttpServer(engine), vs.make_vllm_server_class(FakeVLLMHttpServer)(engine)
        task = asyncio.ensure_future(ours.generate([0] * 4, {"max_tokens": 50}, "req-1"))
        await asyncio.sleep(0)
        engine.step()
        assert (await plain.abort_request("req-1"))["aborted"] is False  # verl 0.9.1 under vLLM 0.24 ids
        assert await ours.lengthsched_snapshot() == {"generated": {"req-1": 1}, "prompts": {"req-1": 4},
                                                     "finished": []}
        assert await ours.abort_request("req-1", reset_prefix_cache=False) == \
            {"aborted": True, "request_id": "req-1", "generated": 1}
        out = await task
        assert out.stop_reason == "aborted" and out.token_ids == [7] and ours.cleared == 0
        assert await ours.lengthsched_snapshot() == {"generated": {}, "prompts": {}, "finished": []}  # aborted
        done = asyncio.ensure_future(ours.generate([0] * 4, {"max_tokens": 2}, "req-2"))
        await asyncio.sleep(0)
        engine.step()
        engine.step()
        assert (await done).stop_reason == "completed"
        assert await ours.lengthsched_snapshot() == {"generated": {}, "prompts": {}, "finished": ["req-2"]}
        assert (await ours.abort_request("req-2"))["aborted"] is False and ours.cleared == 0
        follower = vs.make_vllm_server_class(FakeVLLMHttpServer)(engine, node_rank=1)
        assert await follower.lengthsched_snapshot() == {"generated": {}, "prompts": {}, "finished": []}
        assert (await follower.abort_request("x"))["aborted"] is False

    asyncio.run(go())


# ----------------------------------------------------------------------------- request ids
def test_vllm_request_ids_carry_the_row_key_and_the_clients_request_id():
    a, b = vs.vllm_request_id(17, "det-3"), vs.vllm_request_id(17, "det-3")
    assert a != b and a.startswith("ls:17~det-3~")  # one per attempt
    assert vs.parse_vllm_request_id(a) == ("17", "det-3")
    assert vs.parse_vllm_request_id(vs.vllm_request_id("k", "a~b")) == ("k", "a~b")
    for other in (uuid.uuid4().hex, "ls:", "ls:k", "ls:~x~y", 5):
        assert vs.parse_vllm_request_id(other) is None
    with pytest.raises(InvalidArgument, match="argument 'key'"):
        vs.vllm_request_id("a~b", "r")
    with pytest.raises(InvalidArgument, match="argument 'request_id'"):
        vs.vllm_request_id(1, None)


def test_the_stealing_client_names_each_attempt_by_the_rows_priority():
    engines, servers, router = cluster({0: 3}, max_num_seqs=1, replicas=1)
    client = vs.make_stealing_client_class(FakeFullyAsyncLLMServerClient)(trainer_config(),
                                                                         load_balancer_handle=Remote(router))
    sent = []
    original = servers[0].generate

    async def spy(prompt_ids, sampling_params, request_id, *args, **kwargs):
        sent.append(request_id)
        return await original(prompt_ids, sampling_params, request_id, *args, **kwargs)

    servers[0].generate = spy

    async def go():
        task = asyncio.ensure_future(client.generate("rid", prompt_ids=[0] * 4, sampling_params={"max_tokens": 9},
                                                     priority=6))
        plain = asyncio.ensure_future(client.generate("plain", prompt_ids=[0] * 4, sampling_params={"max_tokens": 9}))
        while not (task.done() and plain.done()):
            await asyncio.sleep(0)
            engines[0].step()
        return task.result(), plain.result()

    out, _ = asyncio.run(go())
    assert vs.parse_vllm_request_id(sent[0]) == ("6", "rid") and len(out.token_ids) == 3
    assert vs.parse_vllm_request_id(sent[1]) is None  # no priority: verl's uuid


# ----------------------------------------------------------------------------- a batch through abort + resubmit
LONG, SHORT = 60, 6
LENGTHS = {k: n for k, n in enumerate([LONG] * 6 + [SHORT] * 2)}
PLACED = [0] * 6 + [1] * 2  # every long row planned on replica 0


def _check_batch(real_client: bool) -> None:
    alone, *_ = asyncio.run(drive(LENGTHS, PLACED, steal=False))
    steps, outs, driver, engines, waits = asyncio.run(drive(LENGTHS, PLACED, real_client=real_client))
    # Every row finishes once, with its own length, whatever moved.
    assert [len(o.token_ids) for o in outs] == [LENGTHS[k] for k in range(len(LENGTHS))]
    assert all(o.stop_reason == "completed" for o in outs)
    moves = driver.stats.applied
    assert moves and all((m.source, m.target, m.kind) == (0, 1, "steal") for m in moves)
    # Replica 1 drained its two short rows and took replica 0's waiting long rows (aborted there).
    moved = {m.request for m in moves}
    started_on_1 = {vs.parse_vllm_request_id(rid)[0] for rid in engines[1].started}
    assert {str(p) for p in moved} <= started_on_1 and len(started_on_1) > 2
    assert len(engines[0].aborts) >= len(moves)  # each applied move aborted its request on replica 0
    assert driver.coordinator.in_flight(0) == [] and driver.coordinator.in_flight(1) == []
    assert waits == 0  # each move resubmitted at once, not after verl's 1 s wait
    assert steps < 0.8 * alone


def test_a_batch_moves_waiting_rows_to_the_replica_that_drained_and_every_row_finishes_once():
    _check_batch(real_client=False)


@requires_verl
def test_a_batch_through_verls_real_fully_async_client():
    _check_batch(real_client=True)


def _one_request(real_client: bool, abort):
    """One row (true length 12) on a one-replica fake cluster; after 3 steps ``abort(server, vllm id)``
    aborts its attempt. Returns (output, the client's waits before a resubmission, vLLM ids sent)."""

    async def go(base):
        engines, servers, router = cluster({0: 12}, max_num_seqs=1, replicas=1)
        client = vs.make_stealing_client_class(base)(config=trainer_config(response_length=512),
                                                     load_balancer_handle=Remote(router))
        task = asyncio.ensure_future(client.generate("rid", prompt_ids=[0] * PROMPT,
                                                     sampling_params={"max_tokens": 20}, priority=3))
        steps = 0
        while not task.done():
            for _ in range(20):
                await asyncio.sleep(0)
            if steps == 3:
                await abort(servers[0], engines[0].running[0].external_req_id)
            engines[0].step()
            steps += 1
            assert steps < 1000
        return task.result(), client, engines[0]

    if not real_client:
        out, client, engine = asyncio.run(go(FakeFullyAsyncLLMServerClient))
        return out, client.waits, engine.started
    from verl.workers.rollout import llm_server

    counting = llm_server.asyncio = CountingAsyncio()
    try:
        out, _, engine = asyncio.run(go(llm_server.FullyAsyncLLMServerClient))
    finally:
        llm_server.asyncio = asyncio
    return out, len(counting.sleeps), engine.started


@pytest.mark.parametrize("real_client", [False, pytest.param(True, marks=requires_verl)])
def test_a_moved_attempt_is_resubmitted_at_once_and_other_aborts_wait_as_verl_does(real_client):
    async def move(server, vllm_id):  # the StealDriver's abort, through the server class
        assert (await server.abort_request(vllm_id, reset_prefix_cache=False))["aborted"]

    async def verls_own(server, vllm_id):  # an abort the server class did not make (verl's pause_generation)
        await server.engine.abort(vllm_id)

    for abort, waits in ((move, 0), (verls_own, 1)):
        out, counted, started = _one_request(real_client, abort)
        assert len(out.token_ids) == 12 and out.stop_reason == "completed"
        assert counted == waits and len(started) == 2  # two attempts: before and after the abort
        assert [vs.parse_vllm_request_id(v) for v in started] == [("3", "rid")] * 2
        assert "lengthsched_moved" not in getattr(out, "extra_fields", {})


def test_the_server_tags_only_the_attempts_it_aborted_for_a_move():
    engines, servers, _ = cluster({0: 5}, max_num_seqs=1, replicas=1)

    async def go():
        a = asyncio.ensure_future(servers[0].generate([0] * PROMPT, {"max_tokens": 9}, "a"))
        b = asyncio.ensure_future(servers[0].generate([0] * PROMPT, {"max_tokens": 9}, "b"))
        await asyncio.sleep(0)
        engines[0].step()
        assert (await servers[0].abort_request("a", reset_prefix_cache=False))["aborted"]
        assert not (await servers[0].abort_request("gone"))["aborted"]  # not found: nothing kept for it
        await engines[0].abort("b")  # not through the server class
        return await a, await b

    a, b = asyncio.run(go())
    assert a.stop_reason == b.stop_reason == "aborted" and len(a.token_ids) == 1
    assert a.extra_fields[vs.MOVED] is True and vs.MOVED not in b.extra_fields
    assert servers[0]._lengthsched_moving == set() and servers[0].cleared == 0


def test_resume_moved_merges_the_attempts_and_stops_at_the_budget():
    answers = [
        SimpleNamespace(token_ids=[1, 2], log_probs=[-1.0, -2.0], routed_experts=np.array([[1], [2]]), num_preempted=1,
                        stop_reason="aborted", extra_fields={vs.MOVED: True, "num_cached_tokens": 4, "global_steps": 7,
                                                             "min_global_steps": 7}),
        SimpleNamespace(token_ids=[3], log_probs=[-3.0], routed_experts=np.array([[0], [0], [3]]), num_preempted=0,
                        stop_reason="completed", extra_fields={"num_cached_tokens": 0, "global_steps": 8,
                                                               "min_global_steps": 8}),
    ]
    calls = []

    async def attempt(request_id, *, prompt_ids, sampling_params, **kwargs):
        calls.append((request_id, list(prompt_ids), dict(sampling_params), kwargs))
        sampling_params.pop("max_tokens")  # a server may consume its copy
        return answers[len(calls) - 1]

    out = asyncio.run(vs.resume_moved(attempt, "r", [9, 9], {"max_tokens": 5, "temperature": 1.0}, priority=2))
    assert [c[1] for c in calls] == [[9, 9], [9, 9, 1, 2]]
    assert [c[2]["max_tokens"] for c in calls] == [5, 3] and all(c[3] == {"priority": 2} for c in calls)
    assert out.token_ids == [1, 2, 3] and out.log_probs == [-1.0, -2.0, -3.0] and out.num_preempted == 1
    assert out.routed_experts.tolist() == [[1], [2], [3]] and out.stop_reason == "completed"
    assert out.extra_fields == {"num_cached_tokens": 4, "global_steps": 8, "min_global_steps": 7}
    # a moved attempt that spent the budget is not resubmitted: verl's loop ends it as "length"
    calls.clear()
    answers[0] = SimpleNamespace(token_ids=[1, 2], log_probs=None, routed_experts=None, num_preempted=None,
                                 stop_reason="aborted", extra_fields={vs.MOVED: True})
    out = asyncio.run(vs.resume_moved(attempt, "r", [9], {"max_tokens": 2}))
    assert len(calls) == 1 and out.stop_reason == "aborted" and vs.MOVED not in out.extra_fields


def test_the_stealing_client_needs_a_resume_loop_over_an_attempt():
    with pytest.raises(InvalidArgument, match="argument 'base'.*FullyAsyncLLMServerClient"):
        vs.make_stealing_client_class(FakeLLMServerClient.__mro__[-1])
    with pytest.raises(InvalidArgument, match="argument 'base'"):
        vs.make_stealing_client_class(FakeLLMServerClient)  # its parent is object: no attempt to wrap
    client_cls = vs.make_stealing_client_class(FakeFullyAsyncLLMServerClient)
    assert client_cls.__mro__[1] is FakeFullyAsyncLLMServerClient and client_cls.__mro__[3] is FakeLLMServerClient


def test_running_rows_move_to_an_idle_replica_with_their_tokens():
    lengths = {k: n for k, n in enumerate([300, 300, 5])}
    steps, outs, driver, engines, waits = asyncio.run(drive(lengths, [0, 0, 1], max_num_seqs=4, chunk=16,
                                                            poll_every=2))
    assert [len(o.token_ids) for o in outs] == [300, 300, 5]
    moves = [m for m in driver.stats.applied if m.kind == "move"]
    assert moves and all(m.generated >= 16 and m.target == 1 for m in moves) and waits == 0
    alone, *_ = asyncio.run(drive(lengths, [0, 0, 1], max_num_seqs=4, steal=False))
    # The engines here do not slow with rows, so a move gains nothing; it costs the step or two between
    # the abort and the resubmission's admission on the target.
    assert alone <= steps <= alone + 2


# ----------------------------------------------------------------------------- the driver's arguments and edges
def test_the_driver_names_bad_arguments_and_cancels_moves_it_cannot_make():
    _, servers, router = cluster({0: 5}, 2, 2)
    coord = StealCoordinator(2, pool_tokens=1000, chunk=None)
    with pytest.raises(InvalidArgument, match="argument 'coordinator'"):
        vs.StealDriver(object(), router, servers)
    with pytest.raises(InvalidArgument, match="argument 'router'"):
        vs.StealDriver(coord, object(), servers)
    with pytest.raises(InvalidArgument, match="argument 'servers'"):
        vs.StealDriver(coord, router, servers[:1])
    with pytest.raises(InvalidArgument, match="argument 'poll_interval'"):
        vs.StealDriver(coord, router, servers, poll_interval=0)
    driver = vs.StealDriver(coord, router, servers)
    with pytest.raises(InvalidArgument, match="argument 'request'"):
        driver.submit("a~b", 0, 10)
    with pytest.raises(InvalidArgument, match="argument 'replica'"):
        driver.submit("a", 2, 10)

    async def go():
        # Two rows sent to replica 0 and not yet on its engine: replica 1 steals one; the driver cannot
        # abort a request it never saw, so the move is cancelled and the row stays.
        driver.submit("a", 0, 10)
        driver.submit("b", 0, 10)
        assert await driver.poll_once() == [] and driver.stats.cancelled == 1
        assert coord.replica_of("b") == 0 and coord.waiting(0) == ["a", "b"]
        with pytest.raises(InvalidArgument, match="argument 'snapshot'"):
            driver._observed(0, {"running": {}})
        driver.start()
        with pytest.raises(InvalidArgument, match="argument 'start'"):
            driver.start()
        await asyncio.sleep(0.05)
        stats = await driver.stop()
        assert stats.polls >= 2 and stats.errors == 0
        driver.finish("a")
        driver.finish("b")
        assert coord.in_flight(0) == []

    asyncio.run(go())


def test_a_failed_poll_is_logged_and_polling_goes_on(caplog):
    _, servers, router = cluster({0: 5}, 2, 2)
    broken = SimpleNamespace(lengthsched_snapshot=lambda: {"generated": None})
    driver = vs.StealDriver(StealCoordinator(2, pool_tokens=1000), router, [servers[0], broken], poll_interval=0.005)

    async def go():
        driver.start()
        await asyncio.sleep(0.05)
        return await driver.stop()

    stats = asyncio.run(go())
    assert stats.errors >= 2 and "a poll failed" in caplog.text


# ----------------------------------------------------------------------------- configuration and the manager
@pytest.mark.parametrize(("steal", "name"), [
    (None, "lengthsched.steal"),
    ({"poll_interval": 1.0}, "lengthsched.steal"),
    ({"pool_tokens": 0}, "lengthsched.steal.pool_tokens"),
    ({"pool_tokens": 10, "poll_interval": -1}, "lengthsched.steal.poll_interval"),
    ({"pool_tokens": 10, "chunk": 0}, "lengthsched.steal.chunk"),
    ({"pool_tokens": 10, "share": 2}, "lengthsched.steal.share"),
    ({"pool_tokens": 10, "room": 0}, "lengthsched.steal.room"),
    ({"pool_tokens": 10, "pool": 3}, "lengthsched.steal"),
    ({"pool_tokens": 10, "kv_compression": "256"}, "lengthsched.steal.kv_compression"),
])
def test_steal_options_name_bad_settings(steal, name):
    config = trainer_config(**({} if steal is None else {"steal": steal}))
    with pytest.raises(InvalidArgument) as err:
        vs.steal_options(config)
    assert err.value.name == name


def test_steal_options_from_the_config():
    options = vs.steal_options(trainer_config(steal={"pool_tokens": 4096, "poll_interval": 0.5, "chunk": None}))
    assert options == vs.StealOptions(pool_tokens=4096, poll_interval=0.5, chunk=None)
    coord = options.coordinator(3)
    assert coord.replicas == 3 and coord.pool_tokens == 4096 and coord.chunk is None
    # by default running requests move every MOVE_CHUNK tokens and the driver polls every 0.25 s (the
    # stealing client resubmits a move at once); chunk null keeps them where they run
    default = vs.steal_options(trainer_config(steal={"pool_tokens": 4096}))
    assert (default.chunk, default.poll_interval) == (128, 0.25) and default.coordinator(2).chunk == 128
    assert vs.steal_options(trainer_config(steal={"pool_tokens": 4096, "chunk": 64})).coordinator(2).chunk == 64
    # turns: verl's multi_turn switch unless the section says otherwise
    assert default.turns is False
    multi = trainer_config(steal={"pool_tokens": 4096})
    multi["actor_rollout_ref"]["rollout"]["multi_turn"] = {"enable": True}
    assert vs.steal_options(multi).turns is True
    multi["lengthsched"]["steal"]["turns"] = False
    assert vs.steal_options(multi).turns is False
    with pytest.raises(InvalidArgument, match="lengthsched.steal.turns"):
        vs.steal_options(trainer_config(steal={"pool_tokens": 4096, "turns": "yes"}))
    # a compressed KV cache on the engines: the coordinator's room counts budget + interval a request at most
    sparse = vs.steal_options(trainer_config(steal={"pool_tokens": 4096, "kv_compression": "256:32"}))
    assert sparse.kv_compression == "256:32" and sparse.coordinator(2).kv_cap == 288
    assert default.kv_compression is None and default.coordinator(2).kv_cap is None


def test_with_turns_a_finished_turn_keeps_its_row_and_the_next_turn_is_followed_with_the_tokens_before():
    _, servers, router = cluster({0: 5}, 2, 2)
    with pytest.raises(InvalidArgument, match="argument 'turns'"):
        vs.StealDriver(StealCoordinator(2, 1000), router, servers, turns=1)
    for turns in (True, False):
        coord = StealCoordinator(2, pool_tokens=10_000, chunk=None)
        driver = vs.StealDriver(coord, router, servers, turns=turns)

        def see(replica, generated, finished=(), prompts=None, driver=driver, coord=coord):  # one replica's part
            snap = {"generated": generated, "finished": list(finished), "prompts": prompts or {}}
            driver._ended(snap)  # as poll_once: the finished attempts first
            seen = driver._observed(replica, snap)
            coord.observe(replica, seen)
            return seen

        driver.submit(7, 0, 100.0, prompt_tokens=4, group="g")
        first = vs.vllm_request_id(7, "session", 0)
        see(0, {first: 30})
        assert coord.generated_of(7) == 30
        see(0, {}, [first])  # the first turn ends
        assert coord.replica_of(7) is None
        if not turns:  # the row is done: a later request under its key is not followed
            assert not driver._rows and not driver._attempts
            see(1, {vs.vllm_request_id(7, "session", 0): 3})
            assert coord.replica_of(7) is None and driver.stats.turns == 0
            continue
        assert list(driver._rows) == ["7"]  # kept, between turns: nothing of it waits anywhere
        assert see(0, {}) == {}
        second = vs.vllm_request_id(7, "session", 0)  # the next turn: the conversation is its prompt
        assert see(1, {second: 3}, prompts={second: 4 + 30 + 12}) == {7: 33}  # the prompt, turn one, a tool's 12
        assert driver._rows["7"].prompt == 16  # the first prompt and the tool's answer: a move recomputes them too
        assert coord.replica_of(7) == 1 and coord.generated_of(7) == 33
        assert (driver.stats.turns, driver.stats.resumed) == (1, 0)
        moved = vs.vllm_request_id(7, "session", 8)  # a move's attempt carries the turn's 8 tokens so far
        assert see(1, {moved: 2}) == {7: 40}
        assert driver._attempts == {moved: "7"}  # its current attempt only, read again without parsing its id
        assert see(1, {moved: 3}) == {7: 41}
        see(1, {}, [moved])
        assert coord.replica_of(7) is None and driver._rows["7"].done == 41 and not driver._attempts
        driver.finish(7)  # its prompt is heard finish
        assert not driver._rows
        see(0, {vs.vllm_request_id(7, "session", 0): 1})
        assert coord.replica_of(7) is None and driver.stats.turns == 1



def test_a_round_ends_every_replicas_finished_attempts_before_it_reads_what_runs():
    """A session's next turn may show on one replica in the round whose snapshot of another reports its last turn
    finished: the turn ends first, so the new one is taken up with the tokens before it."""
    class Server:
        def __init__(self):
            self.snap = {"generated": {}, "finished": []}

        def lengthsched_snapshot(self):
            return self.snap

        def abort_request(self, request_id, reset_prefix_cache=True):  # nothing here moves
            return {"aborted": False, "request_id": request_id}

    servers = [Server(), Server()]
    driver = vs.StealDriver(StealCoordinator(2, 10_000, chunk=None), SimpleNamespace(reroute=lambda *a: None),
                            servers, turns=True)
    driver.submit(3, 1, 50.0)
    first = vs.vllm_request_id(3, "s", 0)
    servers[1].snap = {"generated": {first: 20}, "finished": []}
    asyncio.run(driver.poll_once())
    servers[0].snap = {"generated": {vs.vllm_request_id(3, "s", 0): 2}, "finished": []}  # the next turn, on 0
    servers[1].snap = {"generated": {}, "finished": [first]}
    asyncio.run(driver.poll_once())
    coord = driver.coordinator
    assert (coord.replica_of(3), coord.generated_of(3), driver.stats.turns) == (0, 22, 1)


class Worker:
    """An agent-loop worker running verl's single-turn loop (a request id per row, the row's priority) on
    its client; rows' prompts are ``[row, 0, 0, 0]``."""

    def __init__(self, client):
        self.client = client

    async def generate_sequences(self, batch):
        ntb = batch.non_tensor_batch
        outs = await asyncio.gather(*[
            self.client.generate(uuid.uuid4().hex, prompt_ids=[int(ntb["row"][i]), 0, 0, 0],
                                 sampling_params={"max_tokens": 512}, priority=int(ntb["priority"][i]))
            for i in range(len(batch))])
        mask = np.zeros((len(batch), 512), dtype=np.int64)
        for i, out in enumerate(outs):
            mask[i, :len(out.token_ids)] = 1
        from test_verl import FakeBatch

        return FakeBatch(dict(ntb), {"response_mask": mask}, {})


class ToolWorker:
    """verl's ``AgentLoopWorker`` running a two-turn tool loop per row, as ``ToolAgentLoop`` talks to the client:
    each turn a ``generate`` of the conversation so far under one request id, naming no priority, a tool's answer of
    three tokens (token -1) between the turns; each session in a task of its own."""

    def __init__(self, config, llm_client, teacher_client=None, reward_loop_worker_handles=None):
        self.llm_client = llm_client

    async def _run_agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
        request_id, conversation, made = uuid.uuid4().hex, [int(kwargs["row"]), 0, 0, 0], 0
        for turn in range(2):
            if turn:
                conversation += [-1, -1, -1]
            out = await self.llm_client.generate(request_id=request_id, prompt_ids=list(conversation),
                                                 sampling_params={"max_tokens": 512})
            conversation += out.token_ids
            made += len(out.token_ids)
        return made

    async def generate_sequences(self, batch):
        ntb = batch.non_tensor_batch
        made = await asyncio.gather(*[self._run_agent_loop({}, {}, agent_name="tool_agent", row=ntb["row"][i],
                                                           priority=int(ntb["priority"][i]))
                                      for i in range(len(batch))])
        mask = np.zeros((len(batch), 512), dtype=np.int64)
        for i, n in enumerate(made):
            mask[i, :n] = 1
        from test_verl import FakeBatch

        return FakeBatch(dict(ntb), {"response_mask": mask}, {})


def run_stealing_manager(lengths: dict, replicas: int = 2, multi_turn: bool = False, **lengthsched: Any):
    """One batch through the stealing manager (configured by ``lengthsched``) over ``replicas`` stepped
    fake engines: (manager class, the plain client, the manager, its output). ``multi_turn``: verl's switch on and
    the rows run :class:`ToolWorker`'s two-turn loop (as ``lv.make_worker_class`` makes it), ``lengths`` per turn."""
    engines, servers, router = cluster(lengths, max_num_seqs=2, replicas=replicas,
                                       true_length=per_turn_length_of(lengths) if multi_turn else None)
    config = trainer_config(response_length=512, **lengthsched)
    if multi_turn:
        config["actor_rollout_ref"]["rollout"]["multi_turn"] = {"enable": True}
    client_cls = vs.make_stealing_client_class(FakeFullyAsyncLLMServerClient)
    manager_cls = vs.make_stealing_agent_loop_manager_class(lv.make_agent_loop_manager_class(FakeAgentLoopManager),
                                                            client_cls)
    plain = SimpleNamespace(config=config, _load_balancer=Remote(router))
    manager = manager_cls(config, plain)
    assert isinstance(manager.llm_client, client_cls) and manager.llm_client._load_balancer is plain._load_balancer
    worker = lv.make_worker_class(ToolWorker)(config, manager.llm_client) if multi_turn else Worker(manager.llm_client)
    manager.agent_loop_workers = [Remote(worker)]
    batch = rollout_batch(False, 1)
    batch.non_tensor_batch["row"] = np.arange(24)

    async def go():
        task = asyncio.ensure_future(manager.generate_sequences(batch))
        while not task.done():
            await asyncio.sleep(0.0005)
            for e in engines:
                e.step()
        return task.result()

    out = asyncio.run(go())
    assert out.batch["response_mask"].sum(-1).tolist() == [lengths[k] * (2 if multi_turn else 1) for k in range(24)]
    return manager_cls, plain, manager, out


def test_the_legacy_stealing_manager_steers_every_turn_of_a_tool_loop():
    """verl's legacy trainer with a multi-turn tool loop: the manager's worker class gives every turn its row's
    priority, so each turn reaches its engine under the row's key, and the driver (turns: verl's multi_turn switch)
    follows the turns."""
    lengths = {k: 40 if k % 6 == 0 else 4 for k in range(24)}
    _, _, manager, out = run_stealing_manager(lengths, multi_turn=True, placement="groups",
                                              steal={"pool_tokens": 100_000, "poll_interval": 0.001})
    driver = manager.lengthsched_driver
    assert driver.turns and driver.stats.turns > 0 and driver.stats.errors == 0  # the second turns taken up
    # every turn let go (the driver, made for this batch, goes with it: its rows wait for no further turn)
    assert driver.coordinator.loads() == [0.0, 0.0] and all(row.between for row in driver._rows.values())


def test_the_stealing_manager_swaps_the_client_runs_a_driver_per_batch_and_reports_its_moves():
    lengths = {k: 40 if k % 6 == 0 else 4 for k in range(24)}  # one long prompt (4 samples), five short ones
    manager_cls, plain, manager, out = run_stealing_manager(lengths, placement="groups", steal={
        "pool_tokens": 100_000, "poll_interval": 0.001})
    timing = out.meta_info["timing"]
    assert {"lengthsched/steals", "lengthsched/moves", "lengthsched/steal_cancelled"} <= set(timing)
    driver = manager.lengthsched_driver
    assert driver.stats.polls > 0 and driver._task is None
    assert timing["lengthsched/steals"] + timing["lengthsched/moves"] == len(driver.stats.applied)
    assert manager.lengthsched_planner().placement == "groups"  # as the config says
    with pytest.raises(InvalidArgument, match="lengthsched.steal"):
        manager_cls(trainer_config(), plain)
    # without a lengthsched.placement the stealing manager plans with steal's placement and the steal pool
    default = manager_cls(trainer_config(steal={"pool_tokens": 300}), plain).lengthsched_planner()
    assert default.placement == "ways" and default.pool_tokens == 300


def test_the_stealing_manager_steals_over_length_classes_in_placement_order():
    """A batch planned in length classes (lengthsched.placement=classes, or auto with agreeing history)
    runs as the simulator's steal_classes: the classes' placement, each replica's rows in batch order,
    the driver stealing; auto before any length is known plans verl's spread."""
    lengths = {k: 40 if k % 6 == 0 else 4 for k in range(24)}
    _, _, manager, out = run_stealing_manager(lengths, placement="classes", steal={"pool_tokens": 100_000,
                                                                                  "poll_interval": 0.001})
    plan = manager.lengthsched_planner().last_plan
    assert (plan.placement, plan.order) == ("classes", "batch")
    assert manager.lengthsched_driver is not None and "lengthsched/steals" in out.meta_info["timing"]
    # on one replica nothing is placed or stolen: its rows longest predicted first, as steal_classes runs it
    _, _, manager, _ = run_stealing_manager(lengths, replicas=1, placement="classes",
                                            steal={"pool_tokens": 100_000, "poll_interval": 0.001})
    plan = manager.lengthsched_planner().last_plan
    assert (plan.placement, plan.order, plan.replicas) == ("classes", "longest", 1)
    _, _, manager, out = run_stealing_manager(lengths, placement="auto", order="longest",
                                              steal={"pool_tokens": 100_000, "poll_interval": 0.001})
    plan = manager.lengthsched_planner().last_plan
    # no lengths known yet (the default predictor, told nothing): verl's spread; order as asked
    assert (plan.placement, plan.order) == ("spread", "longest")


def test_the_verl_classes_need_verl_only_when_asked_for():
    for name in ("LengthschedStealingAgentLoopManager", "StealingLLMServerClient"):
        if VERL:
            assert getattr(vs, name).__module__ == "lengthsched.integrations.verl_stealing"
        else:
            with pytest.raises(ImportError, match="verl is not installed"):
                getattr(vs, name)
    with pytest.raises(AttributeError):
        vs.NoSuchThing  # noqa: B018


def test_register_vllm_server_and_the_replica_class_with_fakes():
    registry = SimpleNamespace(entries={}, register=lambda name, loader: registry.entries.__setitem__(name, loader))
    vs.register_vllm_server(registry)
    assert set(registry.entries) == {"vllm"} and callable(registry.entries["vllm"])

    class Replica:
        def __init__(self, replica_rank, config):
            self.server_class = "verl's"

    server_cls = vs.make_vllm_server_class(FakeVLLMHttpServer)
    replica = vs.make_vllm_replica_class(Replica, server_cls, remote=lambda cls: ("remote", cls))(0, Config({}))
    assert replica.server_class == ("remote", server_cls)


@requires_verl
def test_fakes_match_verls_and_vllms_signatures():
    import verl
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient

    def names(f):
        return list(inspect.signature(f).parameters)

    assert names(FakeFullyAsyncLLMServerClient.__init__) == names(FullyAsyncLLMServerClient.__init__)
    assert names(FakeFullyAsyncLLMServerClient.generate) == names(inspect.unwrap(FullyAsyncLLMServerClient.generate))
    assert names(FakeFullyAsyncLLMServerClient._acquire_server) == names(LLMServerClient._acquire_server)
    assert names(FakeFullyAsyncLLMServerClient._vllm_request_id) == names(LLMServerClient._vllm_request_id)
    source = inspect.getsource(FullyAsyncLLMServerClient.generate)
    assert "prompt_ids=prompt_ids + final_output.token_ids" in source and '("aborted", "abort")' in source
    assert "request_id=self._vllm_request_id(request_id)" in inspect.getsource(LLMServerClient.generate)
    # The vLLM server needs vLLM to import: its code is read as text.
    server = (Path(verl.__file__).parent / "workers" / "rollout" / "vllm_rollout" / "vllm_async_server.py").read_text()
    assert "async def abort_request(self, request_id: str, reset_prefix_cache: bool = True)" in server
    assert "request_states.get(request_id)" in server and "abort_requests([request_id])" in server
    assert "self.server_class = ray.remote(vLLMHttpServer)" in server
    assert names(FakeVLLMHttpServer.generate)[1:] == ["prompt_ids", "sampling_params", "request_id", "image_data",
                                                      "video_data", "audio_data", "mm_processor_kwargs", "priority",
                                                      "kv_transfer_params"]
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    assert names(RolloutReplicaRegistry.register) == ["name", "loader"]
    assert issubclass(vs.StealingLLMServerClient, FullyAsyncLLMServerClient)


def test_the_setup_hook_registers_the_server_class_when_verls_replica_module_is_imported(tmp_path, monkeypatch):
    """What Ray's worker_process_setup_hook does in each worker (verl's v1 trainer builds its replicas before it
    loads the manager): the registration waits for verl's replica module and runs right after it is imported."""
    import sys

    assert vs.SETUP_HOOK == f"{vs.__name__}.setup_hook" and vs.REPLICA_MODULE == "verl.workers.rollout.replica"
    package = tmp_path / "lsched_fake_verl"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "replica.py").write_text("class RolloutReplicaRegistry:\n    _registry = {'vllm': 'verl'}\n"
                                        "    @classmethod\n    def register(cls, name, loader):\n"
                                        "        cls._registry[name] = loader\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(vs, "REPLICA_MODULE", "lsched_fake_verl.replica")
    try:
        vs.setup_hook()
        assert "lsched_fake_verl.replica" not in sys.modules  # nothing imported by the hook itself
        from lsched_fake_verl.replica import RolloutReplicaRegistry

        assert RolloutReplicaRegistry._registry["vllm"] != "verl" and callable(RolloutReplicaRegistry._registry["vllm"])
    finally:
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, vs._InstallOnImport)]
        for name in ("lsched_fake_verl.replica", "lsched_fake_verl"):
            sys.modules.pop(name, None)


@requires_verl
def test_the_setup_hook_names_verls_replica_module():
    import os
    import subprocess
    import sys

    code = ("from lengthsched.integrations import verl_stealing as vs; vs.setup_hook(); "
            "from verl.workers.rollout.replica import RolloutReplicaRegistry as R; "
            "print(R._registry['vllm'].__qualname__)")
    root = str(Path(__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": root})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "register_vllm_server" in out.stdout
