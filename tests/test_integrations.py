"""The vLLM and SGLang adapters (lengthsched.integrations), against the engines' code (vLLM 0.33.0,
SGLang 0.5.23): small fake engines with the real signatures record every call and list-schedule
requests the way the engines' queues order them (vLLM V1 ignores priorities under FCFS; SGLang
takes one priority per call). A test checks the fakes' signatures against the real classes
wherever an engine is importable. No engine, no GPU (see docs/howto-vllm.md, howto-sglang.md)."""

from __future__ import annotations

import asyncio
import heapq
import inspect
import py_compile
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lengthsched as ls
from lengthsched import BudgetTooSmall, InvalidArgument
from lengthsched.integrations import (
    ENGINE_FIXED_OVERHEAD_BYTES,
    PriorityIgnoredWarning,
    agenerate_group_sglang,
    agenerate_group_vllm,
    decode_replica,
    default_overhead_bytes,
    engine_memory,
    generate_group_sglang,
    generate_group_vllm,
    plan_concurrency,
    plan_kv_bytes,
    plan_rollout,
    request_order,
    request_ranks,
    sglang_calls,
    sglang_page_size,
    sglang_priorities,
    sglang_requests,
    sglang_setup,
    vllm_block_size,
    vllm_priorities,
    vllm_requests,
    vllm_scheduling_policy,
    vllm_serve_args,
    vllm_setup,
)
from lengthsched.integrations.demo import (
    compare_orders,
    format_runs,
    placeholder_plan,
    plan_slots,
)
from lengthsched.integrations.rollout import CROWDED_POOLS, place_ways, spread_ways, steal_requests

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = [ROOT / "examples" / "vllm_priority.py", ROOT / "examples" / "sglang_priority.py"]
GIB = 2**30
QWEN = ls.ModelMemory.from_preset("qwen3-1.7b")
C = 114_688  # Qwen3-1.7B KV bytes per token: 28 layers x 8 KV heads x 128 x (K and V) x 2 bytes
W = 3_441_149_952  # its bf16 weights: 1_720_574_976 parameters x 2 bytes

lengths_st = st.lists(st.integers(1, 400), min_size=1, max_size=20)


# ----------------------------------------------------------------------------- fake engines
def list_schedule(keys: list[Any], durations: list[int], slots: int) -> list[int]:
    """An engine's waiting queue sorted by ``keys`` feeding ``slots`` running slots: the start step
    of each request (a slot freed at the end of step t takes the next request at step t + 1)."""
    free = [0] * slots
    starts = [0] * len(keys)
    for i in sorted(range(len(keys)), key=lambda i: keys[i]):
        t = heapq.heappop(free)
        starts[i] = t + 1
        heapq.heappush(free, t + durations[i])
    return starts


@dataclass
class FakeSamplingParams:
    """The fields of ``vllm.SamplingParams`` the adapter reads (``seed`` picks the fake's length)."""

    max_tokens: int = 16
    n: int = 1
    seed: int | None = None


@dataclass
class FakeOutput:
    prompt: Any
    params: Any
    priority: int
    start: int
    finished: bool = True


def vllm_config(policy: str = "fcfs", block_size: int = 16) -> SimpleNamespace:
    """The parts of a ``VllmConfig`` the adapter reads (vllm/config/scheduler.py, cache.py, 0.33.0)."""
    return SimpleNamespace(scheduler_config=SimpleNamespace(policy=policy),
                           cache_config=SimpleNamespace(block_size=block_size))


class FakeLLM:
    """``vllm.LLM`` of vLLM 0.33.0 (vllm/entrypoints/llm.py): ``LLM(model, **engine args)`` and
    ``generate(prompts, sampling_params=None, *, use_tqdm=True, lora_request=None, priority=None,
    tokenization_kwargs=None, mm_processor_kwargs=None)``; outputs in prompt order. Requests arrive
    in list order; ``scheduling_policy="priority"`` serves the lowest ``(priority, arrival)`` first,
    the default ``"fcfs"`` serves by arrival and ignores priorities without an error (V1's
    FCFSRequestQueue). The engine reports its config at ``llm_engine.vllm_config``."""

    def __init__(self, model: str, *, scheduling_policy: str = "fcfs", gpu_memory_utilization: float = 0.92,
                 max_num_seqs: int = 128, max_num_active_seqs: int | None = None, block_size: int | None = None,
                 enable_prefix_caching: bool | None = None, max_model_len: int | None = None,
                 kv_cache_memory_bytes: int | None = None, tensor_parallel_size: int = 1,
                 true_lengths: list[int] | None = None, backend_block_size: int = 16):
        assert 0 < gpu_memory_utilization <= 1
        assert max_num_active_seqs is None or max_num_active_seqs <= max_num_seqs  # vllm/config/scheduler.py
        self.model, self.policy = model, scheduling_policy
        self.running_cap = max_num_active_seqs or max_num_seqs
        self.true_lengths = true_lengths
        self.calls: list[dict] = []
        # The backend's preferred size unless the user set one (platforms/interface.py).
        self.llm_engine = SimpleNamespace(vllm_config=vllm_config(scheduling_policy, block_size or backend_block_size))

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None, priority=None,
                 tokenization_kwargs=None, mm_processor_kwargs=None):
        self.calls.append({"prompts": prompts, "sampling_params": sampling_params, "priority": priority})
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        priority = [0] * len(prompts) if priority is None else priority
        if len(priority) != len(prompts) or len(params) != len(prompts):
            raise ValueError("priority and sampling_params must have one entry per prompt")
        durations = [1 if self.true_lengths is None or p.seed is None else self.true_lengths[p.seed] for p in params]
        keys = [(p, i) if self.policy == "priority" else (i,) for i, p in enumerate(priority)]
        starts = list_schedule(keys, durations, self.running_cap)
        return [FakeOutput(q, p, r, s) for q, p, r, s in zip(prompts, params, priority, starts)]


class FakeAsyncLLM:
    """``vllm.AsyncLLM.generate(prompt, sampling_params, request_id, *, prompt_text=None,
    lora_request=None, tokenization_kwargs=None, trace_headers=None, priority=0,
    data_parallel_rank=None, session_id=None, kv_hints=None, reasoning_ended=None,
    reasoning_parser_kwargs=None)`` (vllm/v1/engine/async_llm.py, 0.33.0): an async generator of
    outputs, the last one finished."""

    def __init__(self, policy: str = "priority"):
        self.calls: list[dict] = []
        self.vllm_config = vllm_config(policy)

    async def generate(self, prompt, sampling_params, request_id, *, prompt_text=None, lora_request=None,
                       tokenization_kwargs=None, trace_headers=None, priority=0, data_parallel_rank=None,
                       session_id=None, kv_hints=None, reasoning_ended=None, reasoning_parser_kwargs=None):
        self.calls.append({"prompt": prompt, "params": sampling_params, "request_id": request_id, "priority": priority})
        await asyncio.sleep(0)
        yield FakeOutput(prompt, sampling_params, priority, 0, finished=False)
        yield FakeOutput(prompt, sampling_params, priority, 0, finished=True)


class FakeSGLangEngine:
    """``sglang.Engine`` of SGLang 0.5.23 (python/sglang/srt/entrypoints/engine.py):
    ``Engine(model_path, **server args)``; ``generate`` and ``async_generate(prompt=None,
    sampling_params=None, input_ids=None, ..., rid=None, session_params=None, priority=None, ...)``
    take ONE ``priority: Optional[int]`` per call and return a dict with ``meta_info``;
    ``get_server_info()`` reports the resolved server arguments (``page_size``)."""

    def __init__(self, model_path: str, *, mem_fraction_static: float | None = None,
                 max_running_requests: int | None = None, enable_priority_scheduling: bool = False,
                 schedule_low_priority_values_first: bool = False, schedule_policy: str = "fcfs",
                 disable_priority_preemption: bool = False, priority_scheduling_preemption_threshold: int = 10,
                 retraction_policy: str = "length", page_size: int | None = None,
                 max_total_tokens: int | None = None, tp_size: int = 1, event_loop: bool = False,
                 backend_page_size: int = 1):
        assert mem_fraction_static is None or 0 < mem_fraction_static < 1
        assert retraction_policy in ("length", "priority")
        if retraction_policy == "priority" and not enable_priority_scheduling:  # arg_groups/validation_hook.py
            raise ValueError("--retraction-policy priority requires --enable-priority-scheduling")
        if enable_priority_scheduling and schedule_policy not in ("fcfs", "lof"):
            raise ValueError("To use priority scheduling, schedule_policy must be 'fcfs' or 'lof'.")
        self.low_first = schedule_low_priority_values_first
        self.max_running_requests = max_running_requests
        self.page_size = page_size or backend_page_size
        self.calls: list[dict] = []
        if event_loop:
            self.loop = asyncio.new_event_loop()

    def get_server_info(self) -> dict:
        return {"page_size": self.page_size, "max_total_num_tokens": 1 << 20}

    def _record(self, prompt, sampling_params, input_ids, priority, lora_path=None) -> dict:
        if priority is not None and not isinstance(priority, int):
            raise TypeError("GenerateReqInput.priority is Optional[int]: one priority per call")
        self.calls.append({"prompt": prompt, "input_ids": input_ids, "sampling_params": sampling_params,
                           "priority": priority, "lora_path": lora_path})
        return {"text": "", "meta_info": {"completion_tokens": sampling_params.get("seed", 0), "priority": priority}}

    def generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False, lora_path=None,
                 stream=False, rid=None, session_params=None, priority=None):
        return self._record(prompt, sampling_params, input_ids, priority, lora_path)

    async def async_generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False,
                             lora_path=None, stream=False, rid=None, session_params=None, priority=None):
        await asyncio.sleep(0)
        return self._record(prompt, sampling_params, input_ids, priority, lora_path)

    def group_calls(self) -> list[dict]:
        """The calls after the prefix warm-up (the first call when it asked for one token)."""
        warm = self.calls and self.calls[0]["sampling_params"] == {"max_new_tokens": 1}
        return self.calls[1:] if warm else self.calls

    def start_order(self) -> list[int]:
        """Indices into :meth:`group_calls` in the order the waiting queue serves them: priority
        (larger first unless ``schedule_low_priority_values_first``), then arrival."""
        sign = 1 if self.low_first else -1
        calls = self.group_calls()
        return sorted(range(len(calls)), key=lambda i: (sign * calls[i]["priority"], i))


def per_completion_params(n: int) -> list[FakeSamplingParams]:
    return [FakeSamplingParams(max_tokens=400, seed=j) for j in range(n)]


# ----------------------------------------------------------------------------- priorities
@settings(max_examples=60)
@given(lengths=lengths_st, base=st.integers(-5, 5))
def test_priorities_of_lengths_run_shortest_first_ties_by_index(lengths, base):
    prio = vllm_priorities(lengths, base=base)
    assert sorted(prio) == [base + r for r in range(len(lengths))]  # a permutation: strictly ordered
    for i in range(len(lengths)):
        for j in range(len(lengths)):
            if (lengths[i], i) < (lengths[j], j):
                assert prio[i] < prio[j]
    assert list(request_order(lengths)) == sorted(range(len(lengths)), key=lambda j: (lengths[j], j))
    high_first = sglang_priorities(lengths, low_values_first=False, base=base)
    assert sorted(range(len(lengths)), key=lambda j: -high_first[j]) == list(request_order(lengths))
    assert sglang_priorities(lengths, base=base) == prio


@settings(max_examples=40)
@given(lengths=lengths_st, slots=st.integers(1, 5), refill=st.sampled_from(["sjf", "lpt", "fcfs"]))
def test_priorities_follow_the_plan_and_an_engine_reproduces_its_starts(lengths, slots, refill):
    plan = ls.plan_group(lengths, slots=slots, max_new_tokens=400, refill=refill)
    prio = vllm_priorities(plan)
    assert prio == plan.priorities() == request_ranks(plan)
    assert sorted(range(len(lengths)), key=lambda j: prio[j]) == list(plan.admission_order)
    # A priority engine with max_num_seqs = plan.slots starts every completion when the plan does.
    llm = FakeLLM("m", scheduling_policy="priority", max_num_seqs=plan.slots, true_lengths=list(plan.lengths))
    outputs = generate_group_vllm(llm, "p", plan, per_completion_params(len(lengths)))
    assert [o.start for o in outputs] == list(plan.expected_starts)
    assert [o.params.seed for o in outputs] == list(range(len(lengths)))  # back in completion order
    # The same through SGLang's larger-first default.
    engine = FakeSGLangEngine("m", enable_priority_scheduling=True)
    generate_group_sglang(engine, "p", plan, [{"seed": j} for j in range(len(lengths))], low_values_first=False)
    calls = engine.group_calls()
    assert [calls[i]["sampling_params"]["seed"] for i in engine.start_order()] == list(plan.admission_order)


def test_sjf_plan_starts_shortest_predicted_first():
    plan = ls.plan_group([5, 3, 8, 2], slots=2, max_new_tokens=8)  # docs/model.md section 8 lengths
    assert plan.admission_order == (3, 1, 2, 0) and vllm_priorities(plan) == (3, 1, 2, 0)
    assert vllm_priorities(plan, base=10) == (13, 11, 12, 10)
    assert sglang_priorities(plan, low_values_first=False) == (0, 2, 1, 3)


# ----------------------------------------------------------------------------- vLLM call shapes
def test_generate_group_vllm_sends_g_requests_of_one_prompt_in_plan_order():
    plan = ls.plan_group([5, 3, 8, 2], slots=2, max_new_tokens=8)
    llm = FakeLLM("m", scheduling_policy="priority", max_num_seqs=2, true_lengths=[5, 3, 8, 2])
    outputs = generate_group_vllm(llm, [11, 12, 13], plan, per_completion_params(4), use_tqdm=False)
    (call,) = llm.calls
    assert call["prompts"] == [{"prompt_token_ids": [11, 12, 13]}] * 4  # n=1 each: prefix caching shares it
    assert [p.seed for p in call["sampling_params"]] == [3, 1, 2, 0]  # submitted in the plan's order
    assert call["priority"] == [0, 1, 2, 3]
    assert [o.start for o in outputs] == [4, 1, 3, 1] == list(plan.expected_starts)
    shared = FakeSamplingParams(max_tokens=8)
    generate_group_vllm(llm, "text prompt", [5, 3, 8, 2], shared)
    assert llm.calls[-1]["prompts"] == ["text prompt"] * 4 and llm.calls[-1]["sampling_params"] == [shared] * 4


def test_fcfs_vllm_ignores_priorities_without_error_and_the_adapter_warns():
    # vLLM 0.33.0 V1: no check rejects a non-zero priority under "fcfs" (that was V0's); the
    # FCFSRequestQueue serves by arrival. The adapter warns, and still submits in the plan's order,
    # so inside one call FCFS starts every completion when the plan does.
    plan = ls.plan_group([5, 3, 8, 2], slots=2, max_new_tokens=8)
    llm = FakeLLM("m", max_num_seqs=2, true_lengths=[5, 3, 8, 2])  # scheduling_policy defaults to fcfs
    assert vllm_scheduling_policy(llm) == "fcfs"
    with pytest.warns(PriorityIgnoredWarning, match="scheduling_policy='fcfs'"):
        outputs = generate_group_vllm(llm, "p", plan, per_completion_params(4))
    assert llm.calls[0]["priority"] == [0, 1, 2, 3]  # passed on, ignored by the engine
    assert [o.start for o in outputs] == list(plan.expected_starts)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a priority engine: no warning
        generate_group_vllm(FakeLLM("m", scheduling_policy="priority"), "p", plan, per_completion_params(4))
        generate_group_vllm(SimpleNamespace(generate=lambda *a, **k: [None] * 2), "p", [1, 2], FakeSamplingParams())
    with pytest.warns(PriorityIgnoredWarning):
        asyncio.run(agenerate_group_vllm(FakeAsyncLLM(policy="fcfs"), "p", [5, 3], FakeSamplingParams()))


def test_agenerate_group_vllm_streams_one_request_per_completion():
    engine = FakeAsyncLLM()
    outputs = asyncio.run(agenerate_group_vllm(engine, "p", [5, 3, 8], FakeSamplingParams(), request_id="g7"))
    assert [c["request_id"] for c in engine.calls] == ["g7-1", "g7-0", "g7-2"]
    assert [c["priority"] for c in engine.calls] == [0, 1, 2]
    assert all(o.finished for o in outputs) and [o.priority for o in outputs] == [1, 0, 2]
    asyncio.run(agenerate_group_vllm(engine, "p", [5, 3], FakeSamplingParams()))
    first, second = (c["request_id"] for c in engine.calls[3:])
    assert first.startswith("lengthsched-") and first.endswith("-1") and second == first[:-1] + "0"


def test_vllm_requests_shape():
    reqs = vllm_requests({"prompt": "x"}, [4, 1], [FakeSamplingParams(seed=0), FakeSamplingParams(seed=1)])
    assert reqs.order == (1, 0) and reqs.priorities == (0, 1) and reqs.prompts == ({"prompt": "x"},) * 2
    assert [p.seed for p in reqs.sampling_params] == [1, 0]
    assert reqs.by_completion(["out1", "out0"]) == ["out0", "out1"]


# ----------------------------------------------------------------------------- SGLang call shapes
@pytest.mark.parametrize("event_loop", [False, True], ids=["asyncio.run", "engine.loop"])
def test_generate_group_sglang_warms_the_prefix_then_one_call_per_completion(event_loop):
    engine = FakeSGLangEngine("m", enable_priority_scheduling=True, schedule_low_priority_values_first=True,
                              event_loop=event_loop)
    outputs = generate_group_sglang(engine, "Why?", [5, 3, 8, 2], [{"max_new_tokens": 8, "seed": j} for j in range(4)],
                                    lora_path="adapter", stream=False)
    # SGLang 0.5.23 under fcfs does not share a prompt inside one prefill batch: one 1-token request
    # of the prompt at the group's first priority goes first, with the cache-selecting kwargs only.
    warm = engine.calls[0]
    assert warm["prompt"] == "Why?" and warm["sampling_params"] == {"max_new_tokens": 1} and warm["priority"] == 0
    assert warm["lora_path"] == "adapter"
    calls = engine.group_calls()
    assert len(engine.calls) == 5 and len(calls) == 4
    assert [c["prompt"] for c in calls] == ["Why?"] * 4 and all(c["input_ids"] is None for c in calls)
    assert [c["sampling_params"]["seed"] for c in calls] == [3, 1, 0, 2]  # created in the plan's order
    assert [c["priority"] for c in calls] == [0, 1, 2, 3]
    assert [o["meta_info"]["completion_tokens"] for o in outputs] == [0, 1, 2, 3]  # back in completion order
    assert [calls[i]["sampling_params"]["seed"] for i in engine.start_order()] == [3, 1, 0, 2]
    cold = FakeSGLangEngine("m", enable_priority_scheduling=True)
    asyncio.run(agenerate_group_sglang(cold, [7, 8], [2, 1], {"max_new_tokens": 4}, warm_prefix=False,
                                       low_values_first=False))
    assert len(cold.calls) == 2 and cold.calls[0]["input_ids"] == [7, 8] and cold.calls[0]["priority"] == 1
    if event_loop:
        engine.loop.close()


def test_sglang_calls_send_token_ids_as_input_ids():
    reqs = sglang_requests([7, 8, 9], [2, 1], {"max_new_tokens": 4}, low_values_first=False)
    assert sglang_calls(reqs) == [
        {"input_ids": [7, 8, 9], "sampling_params": {"max_new_tokens": 4}, "priority": 1},
        {"input_ids": [7, 8, 9], "sampling_params": {"max_new_tokens": 4}, "priority": 0},
    ]
    engine = FakeSGLangEngine("m")
    engine.generate(**sglang_calls(reqs)[0])  # the blocking call takes the same keywords
    assert engine.calls[0]["priority"] == 1


# ----------------------------------------------------------------------------- memory
def test_engine_memory_rounds_to_vllm_blocks_and_sglang_tokens():
    vllm_mem, sglang_mem = engine_memory(QWEN, "vllm"), engine_memory(QWEN, "sglang")
    assert QWEN.block_size == 1 and vllm_mem.block_size == 16 and sglang_mem.block_size == 1
    assert [vllm_mem.kv_bytes(n) for n in (1, 16, 17, 32, 33)] == [16 * C, 16 * C, 32 * C, 32 * C, 48 * C]
    assert sglang_mem.kv_bytes(17) == 17 * C
    # A 300-token prompt: 18 whole blocks (288 tokens) shared, 12 tokens copied into each sequence.
    assert vllm_mem.prompt_kv_bytes(300) == 288 * C and sglang_mem.prompt_kv_bytes(300) == 300 * C
    assert vllm_mem.sequence_kv_bytes(0, 300) == 16 * C and vllm_mem.sequence_kv_bytes(4, 300) == 16 * C
    assert vllm_mem.sequence_kv_bytes(5, 300) == 32 * C
    assert engine_memory(QWEN, "vllm", block_size=32).kv_bytes(17) == 32 * C
    assert engine_memory(QWEN.replace(prompt_kv="copied", free_kv="batch_end"), "vllm").prompt_kv.value == "shared"


@settings(max_examples=50)
@given(n=st.integers(0, 5000))
def test_vllm_kv_is_whole_blocks(n):
    assert engine_memory(QWEN, "vllm").kv_bytes(n) == -(-n // 16) * 16 * C


def test_vllm_setup_by_hand_on_qwen3_1_7b():
    # 4 completions, 2 slots, each reserving max_new_tokens = 2048; prompt 300 tokens.
    plan = ls.plan_group([652, 799, 1473, 768], slots=2, max_new_tokens=2048, prompt_tokens=300)
    setup = vllm_setup(plan, QWEN, gpu_memory_bytes="80GiB", overhead_bytes=GIB)
    # KV pool: 288 shared prompt tokens + 2 live x (2048 + 12 copied prompt tokens -> 2064, 129 blocks)
    # + 16 for vLLM's null block = 4432 tokens x 114688 bytes.
    assert setup.kv_bytes == (288 + 2 * 2064 + 16) * C == 508_297_216 and setup.kv_tokens == 4432
    assert setup.weights_bytes == W and setup.overhead_bytes == GIB and setup.gpu_memory_bytes == 80 * GIB
    # (3_441_149_952 + 508_297_216 + 1_073_741_824) / 85_899_345_920 = 0.058477..., rounded up.
    assert setup.fraction == 0.0585
    # The pool in exact bytes (the plan's unit) by default, the fraction for vLLM's start-up free-memory
    # check, and no block_size: the attention backend keeps its own (vllm/platforms/interface.py, 0.33.0).
    assert setup.engine_kwargs == {
        "scheduling_policy": "priority", "gpu_memory_utilization": 0.0585, "max_num_seqs": 2,
        "enable_prefix_caching": True, "max_model_len": 2348, "kv_cache_memory_bytes": 508_297_216,
    }
    assert setup.priorities == plan.priorities() and setup.order == plan.admission_order
    llm = FakeLLM("Qwen/Qwen3-1.7B", **setup.engine_kwargs)  # vLLM 0.33.0's keyword names
    assert vllm_block_size(llm) == 16
    fallback = vllm_setup(plan, QWEN, gpu_memory_bytes=80 * GIB, overhead_bytes=GIB, kv_pool="utilization")
    assert "kv_cache_memory_bytes" not in fallback.engine_kwargs
    assert fallback.engine_kwargs["gpu_memory_utilization"] == 0.0585
    # Default overhead: the memory model's decode activations of 2 sequences + 2 GiB.
    assert default_overhead_bytes(QWEN, 2) == 2 * 648_704 + ENGINE_FIXED_OVERHEAD_BYTES
    assert vllm_setup(plan, QWEN, gpu_memory_bytes=80 * GIB).overhead_bytes == 2 * 648_704 + 2 * GIB


def test_vllm_setup_reads_the_engines_block_size_back():
    plan = ls.plan_group([652, 799, 1473, 768], slots=2, max_new_tokens=2048, prompt_tokens=300)
    llm = FakeLLM("m", **vllm_setup(plan, QWEN, gpu_memory_bytes=80 * GIB).engine_kwargs, backend_block_size=32)
    assert vllm_block_size(llm) == 32  # the backend chose 32; the setup did not force 16
    setup = vllm_setup(plan, QWEN, gpu_memory_bytes=80 * GIB, overhead_bytes=GIB, block_size=vllm_block_size(llm))
    # 32-token blocks: 288 shared prompt tokens (9 blocks), each live completion 2048 + 12 -> 65 blocks
    # (2080 tokens), the null block 32: the same plan needs more KV.
    assert setup.kv_bytes == (288 + 2 * 2080 + 32) * C and setup.memory.block_size == 32
    assert "block_size" not in setup.engine_kwargs
    assert vllm_block_size(SimpleNamespace()) is None and vllm_scheduling_policy(object()) is None
    assert vllm_block_size(FakeAsyncLLM()) == 16 and vllm_scheduling_policy(FakeAsyncLLM()) == "priority"


def test_vllm_setup_concurrency_as_max_num_active_seqs_and_tensor_parallel():
    plan = ls.plan_group([652, 799, 1473, 768], slots=2, max_new_tokens=2048, prompt_tokens=300)
    active = vllm_setup(plan, QWEN, gpu_memory_bytes=80 * GIB, overhead_bytes=GIB,
                        concurrency_arg="max_num_active_seqs", max_num_seqs=64)
    # vLLM 0.33.0: max_num_active_seqs caps admission into RUNNING and keeps the runner sized for max_num_seqs.
    assert active.engine_kwargs["max_num_active_seqs"] == 2 and active.engine_kwargs["max_num_seqs"] == 64
    FakeLLM("m", **active.engine_kwargs)
    only_active = vllm_setup(plan, QWEN, gpu_memory_bytes=80 * GIB, concurrency_arg="max_num_active_seqs")
    assert "max_num_seqs" not in only_active.engine_kwargs
    with pytest.raises(InvalidArgument, match="argument 'max_num_seqs'"):
        vllm_setup(plan, QWEN, gpu_memory_bytes=80 * GIB, concurrency_arg="max_num_active_seqs", max_num_seqs=1)
    # Two GPUs: weights and pool split evenly; kv_cache_memory_bytes is per GPU.
    tp2 = vllm_setup(plan, QWEN, gpu_memory_bytes=80 * GIB, overhead_bytes=GIB, tensor_parallel_size=2)
    assert tp2.kv_bytes == 508_297_216 and tp2.kv_bytes_per_gpu == 254_148_608
    assert tp2.engine_kwargs["kv_cache_memory_bytes"] == 254_148_608 and tp2.engine_kwargs["tensor_parallel_size"] == 2
    # (1_720_574_976 + 254_148_608 + 1_073_741_824) / 85_899_345_920 = 0.035489..., rounded up.
    assert tp2.fraction == 0.0355 and tp2.weights_bytes_per_gpu == W // 2
    assert vllm_setup(plan, QWEN, gpu_memory_bytes=80 * GIB, concurrency=6).engine_kwargs["max_num_seqs"] == 6


def test_vllm_serve_args_are_the_engine_kwargs_as_flags():
    assert vllm_serve_args({"scheduling_policy": "priority", "kv_cache_memory_bytes": 100,
                            "enable_prefix_caching": True, "enforce_eager": False, "quantization": None}) == [
        "--scheduling-policy", "priority", "--kv-cache-memory-bytes", "100", "--enable-prefix-caching",
        "--no-enforce-eager"]


def test_sglang_setup_by_hand_on_qwen3_1_7b():
    plan = ls.plan_group([652, 799, 1473, 768], slots=2, max_new_tokens=2048, prompt_tokens=300)
    setup = sglang_setup(plan, QWEN, gpu_memory_bytes=80 * GIB, overhead_bytes=GIB, pin_kv_cache=True)
    # KV pool, token-granular: 300 shared prompt tokens + 2 live x 2048 = 4396 tokens x 114688 bytes.
    assert setup.kv_bytes == 4396 * C == 504_168_448
    # mem_fraction_static = (W + KV pool) / total = 3_945_318_400 / 85_899_345_920 = 0.045929..., rounded up.
    assert setup.fraction == 0.046
    # No page_size (backends rewrite it); preemption by priority disabled rather than a large threshold
    # (priorities are int64 and an unset one is +-sys.maxsize: SGLang 0.5.23 managers/scheduler.py);
    # decode retraction by priority (managers/schedule_batch.py).
    assert setup.engine_kwargs == {
        "enable_priority_scheduling": True, "schedule_low_priority_values_first": True, "schedule_policy": "fcfs",
        "disable_priority_preemption": True, "retraction_policy": "priority", "mem_fraction_static": 0.046,
        "max_running_requests": 2, "max_total_tokens": 4396,
    }
    engine = FakeSGLangEngine("Qwen/Qwen3-1.7B", **setup.engine_kwargs, backend_page_size=64)
    assert sglang_page_size(engine) == 64 and sglang_page_size({"page_size": 16}) == 16
    assert sglang_page_size(SimpleNamespace()) is None
    paged = sglang_setup(plan, QWEN, gpu_memory_bytes=80 * GIB, overhead_bytes=GIB, page_size=sglang_page_size(engine))
    # 64-token pages: 256 shared prompt tokens (4 pages), each live completion 2048 + 44 -> 33 pages.
    assert paged.kv_bytes == (256 + 2 * 2112) * C and "page_size" not in paged.engine_kwargs
    high_first = sglang_setup(plan, QWEN, gpu_memory_bytes=80 * GIB, low_values_first=False, retraction_policy=None)
    assert high_first.engine_kwargs["schedule_low_priority_values_first"] is False
    assert "retraction_policy" not in high_first.engine_kwargs
    assert high_first.priorities == tuple(3 - r for r in plan.priorities())
    with pytest.raises(ValueError, match="requires --enable-priority-scheduling"):
        FakeSGLangEngine("m", retraction_policy="priority")  # why sglang_setup passes both
    assert sglang_setup(plan, QWEN, gpu_memory_bytes=80 * GIB, tensor_parallel_size=2).engine_kwargs["tp_size"] == 2


def test_plan_kv_bytes_is_the_peak_of_reserved_kv_over_the_plans_steps():
    predicted = [652, 799, 1473, 768, 709, 778, 855, 675, 1053, 696]
    mem = engine_memory(QWEN, "vllm")
    plan = ls.plan_group(predicted, budget_bytes=4 * GIB, memory=mem, prompt_tokens=300, max_new_tokens=4096,
                         reserve_lengths=[int(1.3 * x) for x in predicted])
    starts, held = np.asarray(plan.expected_starts), np.maximum(plan.reserve_lengths, plan.lengths)
    ends = starts + np.asarray(plan.lengths) - 1
    steps = range(1, int(ends.max()) + 1)
    per_step = [sum(mem.sequence_kv_bytes(int(h), 300) for s, e, h in zip(starts, ends, held) if s <= t <= e)
                for t in steps]
    assert plan_kv_bytes(plan, mem) == mem.prompt_kv_bytes(300) + max(per_step)
    live = max(int(np.sum((starts <= t) & (t <= ends))) for t in steps)
    assert plan_concurrency(plan) == live < plan.slots == len(predicted)  # the budget, not G, caps it
    setup = vllm_setup(plan, QWEN, gpu_memory_bytes=80 * GIB)
    assert setup.kv_bytes == plan_kv_bytes(plan, mem) + 16 * C and setup.engine_kwargs["max_num_seqs"] == live
    assert setup.overhead_bytes == default_overhead_bytes(mem, live)
    assert sglang_setup(plan, QWEN, gpu_memory_bytes=80 * GIB).engine_kwargs["max_running_requests"] == live


def test_budgets_that_do_not_fit_say_so():
    plan = ls.plan_group([652, 799], slots=2, max_new_tokens=2048, prompt_tokens=300)
    with pytest.raises(BudgetTooSmall) as err:
        vllm_setup(plan, QWEN, gpu_memory_bytes=4 * GIB, overhead_bytes=GIB)
    assert err.value.name == "gpu_memory_bytes" and "weights 3441149952" in err.value.expected
    with pytest.raises(BudgetTooSmall) as err:
        vllm_setup(plan, QWEN, gpu_memory_bytes=80 * GIB, kv_budget_bytes=100 * C)
    assert err.value.name == "kv_budget_bytes" and "max_model_len=2348" in err.value.expected
    vllm_setup(plan, QWEN, gpu_memory_bytes=80 * GIB, kv_budget_bytes=100 * C, max_model_len=64)
    with pytest.raises(BudgetTooSmall) as err:
        sglang_setup(plan, QWEN, gpu_memory_bytes=80 * GIB, kv_budget_bytes=C - 1)
    assert err.value.name == "kv_budget_bytes"


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: vllm_priorities([]), "plan_or_lengths"),
        (lambda: vllm_priorities([3, 0]), "plan_or_lengths"),
        (lambda: vllm_priorities("abc"), "plan_or_lengths"),
        (lambda: sglang_priorities([1.5, 2]), "plan_or_lengths"),
        (lambda: vllm_priorities([1, 2], base=0.5), "base"),
        (lambda: vllm_requests("p", [1, 2], None), "sampling_params"),
        (lambda: vllm_requests("p", [1, 2], FakeSamplingParams(n=2)), "sampling_params"),
        (lambda: vllm_requests("p", [1, 2], [FakeSamplingParams()]), "sampling_params"),
        (lambda: vllm_requests("", [1, 2], FakeSamplingParams()), "prompt"),
        (lambda: vllm_requests(42, [1, 2], FakeSamplingParams()), "prompt"),
        (lambda: vllm_requests({"text": "x"}, [1, 2], FakeSamplingParams()), "prompt"),
        (lambda: sglang_requests([1, -2], [1, 2], {}), "prompt"),
        (lambda: sglang_requests("p", [1, 2], {"n": 2}), "sampling_params"),
        (lambda: sglang_requests("p", [1, 2], "temperature=1"), "sampling_params"),
        (lambda: vllm_requests("p", [1, 2], FakeSamplingParams()).by_completion([1]), "outputs"),
        (lambda: engine_memory(QWEN, "tgi"), "engine"),
        (lambda: engine_memory("qwen3-1.7b", "vllm"), "memory"),
        (lambda: engine_memory(QWEN, "vllm", block_size=0), "block_size"),
        (lambda: vllm_setup([1, 2], QWEN, gpu_memory_bytes=GIB), "plan"),
        (lambda: sglang_setup(None, QWEN, gpu_memory_bytes=GIB), "plan"),
        (lambda: plan_kv_bytes(ls.plan_group([1], slots=1, max_new_tokens=4), None), "memory"),
        (lambda: vllm_setup(ls.plan_group([1], slots=1, max_new_tokens=4), QWEN, gpu_memory_bytes="lots"),
         "gpu_memory_bytes"),
        (lambda: vllm_setup(ls.plan_group([1], slots=1, max_new_tokens=4), QWEN, gpu_memory_bytes=GIB,
                            overhead_bytes=-1), "overhead_bytes"),
        (lambda: vllm_setup(ls.plan_group([1], slots=1, max_new_tokens=4), QWEN, gpu_memory_bytes=GIB,
                            max_model_len=0), "max_model_len"),
        (lambda: sglang_setup(ls.plan_group([1], slots=1, max_new_tokens=4), QWEN, gpu_memory_bytes=GIB,
                              kv_budget_bytes="-3"), "kv_budget_bytes"),
        (lambda: plan_slots(QWEN, 8 * GIB, group_size=0, prompt_tokens=10, max_new_tokens=10), "group_size"),
        (lambda: asyncio.run(agenerate_group_vllm(FakeAsyncLLM(), "p", [1], FakeSamplingParams(), request_id="")),
         "request_id"),
        (lambda: vllm_setup(ls.plan_group([1], slots=1, max_new_tokens=4), QWEN, gpu_memory_bytes=GIB,
                            kv_pool="gpu"), "kv_pool"),
        (lambda: vllm_setup(ls.plan_group([1], slots=1, max_new_tokens=4), QWEN, gpu_memory_bytes=GIB,
                            concurrency_arg="slots"), "concurrency_arg"),
        (lambda: vllm_setup(ls.plan_group([1], slots=1, max_new_tokens=4), QWEN, gpu_memory_bytes=GIB,
                            max_num_seqs=8), "max_num_seqs"),
        (lambda: vllm_setup(ls.plan_group([1], slots=1, max_new_tokens=4), QWEN, gpu_memory_bytes=GIB,
                            tensor_parallel_size=0), "tensor_parallel_size"),
        (lambda: vllm_setup(ls.plan_group([1], slots=1, max_new_tokens=4), QWEN, gpu_memory_bytes=GIB,
                            block_size=0), "block_size"),
        (lambda: vllm_setup(ls.plan_group([1], slots=1, max_new_tokens=4), QWEN, gpu_memory_bytes=GIB,
                            concurrency=0), "concurrency"),
        (lambda: sglang_setup(ls.plan_group([1], slots=1, max_new_tokens=4), QWEN, gpu_memory_bytes=GIB,
                              retraction_policy="newest"), "retraction_policy"),
        (lambda: sglang_setup(ls.plan_group([1], slots=1, max_new_tokens=4), QWEN, gpu_memory_bytes=GIB,
                              page_size=0), "page_size"),
        (lambda: vllm_serve_args(["--x"]), "engine_kwargs"),
        (lambda: plan_rollout([], []), "group_keys"),
        (lambda: plan_rollout(["a", "b"], [1]), "predicted"),
        (lambda: plan_rollout(["a"], [-1]), "predicted"),
        (lambda: plan_rollout(["a"], [1], replicas=0), "replicas"),
        (lambda: plan_rollout(["a"], [1], replicas=2, base=3), "base"),
        (lambda: plan_rollout([["a"]], [1]), "group_keys"),
        (lambda: plan_rollout(["a"], [1]).rows_on(1), "replica"),
        (lambda: plan_rollout(["a"], [1], placement="lpt"), "placement"),
    ],
)
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(InvalidArgument) as err:
        call()
    assert err.value.name == name and err.value.expected
    assert f"argument '{name}'" in str(err.value)


# ----------------------------------------------------------------------------- a rollout step on replicas
@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=12), replicas=st.integers(1, 4),
       placement=st.sampled_from(["spread", "groups"]), data=st.data())
def test_plan_rollout_places_as_the_simulator_and_orders_each_replica_longest_first(sizes, replicas, placement,
                                                                                     data):
    from simulate.rollout import route
    from simulate.workloads import Group

    predicted = [data.draw(st.lists(st.integers(0, 500), min_size=n, max_size=n)) for n in sizes]
    keys = [f"uid-{g}" for g, n in enumerate(sizes) for _ in range(n)]
    flat = [x for group in predicted for x in group]
    plan = plan_rollout(keys, flat, replicas=replicas, placement=placement)
    assert plan.placement == placement
    # The placement of simulate.run_rollout: verl's routing (vllm_priority + least_loaded) or placed_lpt.
    groups = [Group(str(g), 10, np.ones(n, dtype=np.int64)) for g, n in enumerate(sizes)]
    simulated = route(groups, "least_loaded", replicas, np.asarray(flat), places_groups=placement == "groups")
    assert list(plan.replica) == list(simulated)
    assert len(set(plan.priority)) == len(keys)  # unique: verl's full_determinism request ids use them
    for row in range(len(keys)):
        if placement == "groups":
            assert plan.replica[row] == plan.group_replica[plan.group[row]]  # a group never spreads
        else:
            assert plan.replica[row] == row % replicas
            assert plan.group_replica[plan.group[row]] in (plan.replica[row], -1)
        assert decode_replica(plan.priority[row], replicas) == plan.replica[row]
    for r in range(replicas):
        rows = plan.rows_on(r)
        assert [(-flat[i], i) for i in rows] == sorted((-flat[i], i) for i in rows)  # longest predicted first
        assert plan.replica_work[r] == sum(flat[i] for i in rows)
    assert sorted(plan.submission_order()) == list(range(len(keys)))
    assert [plan.priority[i] for i in plan.submission_order()] == sorted(plan.priority)


def test_a_spread_plan_runs_in_the_simulator_as_vllm_priority_with_verls_routing():
    """The spread plan's placement and per-replica order are those simulate.run_rollout gives
    vllm_priority under least_loaded routing: the same makespan when the plan is run as given."""
    from simulate import run_rollout
    from simulate.workloads import castillo_groups

    groups = castillo_groups(8, limit=12, seed=2)
    flat = np.concatenate([np.full(len(g.lengths), int(np.median(g.lengths))) for g in groups])
    keys = [g.prompt_id for g in groups for _ in g.lengths]
    plan = plan_rollout(keys, flat, replicas=3)
    common = dict(replicas=3, budget_tokens=4 * 2048, max_new_tokens=2048, predicted=flat)
    routed = run_rollout(groups, "vllm_priority", router="least_loaded", **common)
    given = run_rollout(groups, "vllm_priority", placement=np.asarray(plan.replica), **common)
    assert given.seconds == routed.seconds


def test_plan_rollout_by_hand():
    # Two groups of 3 (uids a, b; rows interleaved) on 2 replicas: work a = 60, b = 30.
    plan = plan_rollout(["a", "b", "a", "b", "a", "b"], [10, 5, 30, 20, 20, 5], replicas=2, base=4,
                        placement="groups")
    assert plan.group_keys == ("a", "b") and plan.group == (0, 1, 0, 1, 0, 1)
    assert plan.group_replica == (0, 1) and plan.replica_work == (60, 30)
    # Replica 0 runs a's rows 2 (30), 4 (20), 0 (10): ranks 0, 1, 2 -> priorities 4 + 2 x rank + 0.
    assert plan.priority == (8, 7, 4, 5, 6, 9)
    assert plan.rows_on(0) == (2, 4, 0) and plan.rows_on(1) == (3, 1, 5)
    assert decode_replica(plan.priority[3], 2) == 1 and decode_replica(-1, 2) is None
    assert decode_replica(np.int64(7), 2) == 1 and decode_replica(None, 2) is None and decode_replica(True, 2) is None
    one = plan_rollout(["a", "a", "b"], [3, 9, 1])
    assert one.priority == (1, 0, 2) and one.replicas == 1
    # Spread (the default): rows 0, 2, 4 on replica 0 (10, 30, 20), rows 1, 3, 5 on replica 1 (5, 20, 5).
    spread = plan_rollout(["a", "b", "a", "b", "a", "b"], [10, 5, 30, 20, 20, 5], replicas=2)
    assert spread.replica == (0, 1, 0, 1, 0, 1) and spread.group_replica == (0, 1)
    assert spread.rows_on(0) == (2, 4, 0) and spread.rows_on(1) == (3, 1, 5) and spread.replica_work == (60, 30)
    mixed = plan_rollout(["a", "a", "b"], [3, 9, 1], replicas=2)
    assert mixed.group_replica == (-1, 0) and mixed.replica == (0, 1, 0)


# ----------------------------------------------------------------------------- the fakes against the engines
def _accepts(fake, real, names):
    """Every keyword in ``names`` is a parameter of both callables."""
    fake_params, real_params = inspect.signature(fake).parameters, inspect.signature(real).parameters
    missing = [n for n in names if n not in real_params]
    assert not missing, f"{real.__qualname__} lacks {missing}"
    assert all(n in fake_params for n in names)


def test_fake_vllm_matches_vllm_signatures():
    vllm = pytest.importorskip("vllm")
    from vllm.v1.engine.async_llm import AsyncLLM

    _accepts(FakeLLM.generate, vllm.LLM.generate, ["prompts", "sampling_params", "use_tqdm", "priority"])
    _accepts(FakeAsyncLLM.generate, AsyncLLM.generate, ["prompt", "sampling_params", "request_id", "priority"])
    from vllm.config import CacheConfig, SchedulerConfig

    for name in ("kv_cache_memory_bytes", "block_size", "gpu_memory_utilization"):
        assert name in CacheConfig.__dataclass_fields__
    for name in ("policy", "max_num_seqs", "max_num_active_seqs"):
        assert name in SchedulerConfig.__dataclass_fields__


def test_fake_sglang_matches_sglang_signatures():
    pytest.importorskip("sglang")
    from sglang.srt.entrypoints.engine import Engine

    _accepts(FakeSGLangEngine.async_generate, Engine.async_generate,
             ["prompt", "sampling_params", "input_ids", "lora_path", "stream", "rid", "priority"])
    _accepts(FakeSGLangEngine.generate, Engine.generate, ["prompt", "sampling_params", "input_ids", "priority"])


# ----------------------------------------------------------------------------- examples
@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_compiles_and_prints_help_without_the_engine(script, tmp_path):
    py_compile.compile(str(script), cfile=str(tmp_path / "out.pyc"), doraise=True)
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "--model" in result.stdout and "--group-size" in result.stdout and "--budget" in result.stdout


def test_demo_compares_index_order_with_the_plan_on_a_fake_engine():
    true = [40, 5, 30, 5, 20, 5, 10, 5]
    slots = plan_slots(engine_memory(QWEN, "vllm"), 8 * GIB, group_size=len(true), prompt_tokens=30,
                       max_new_tokens=64)
    assert slots == len(true)  # 8 GiB holds all 8 at 64 tokens each next to 3.4 GB of weights
    assert placeholder_plan(group_size=8, slots=2, max_new_tokens=64, prompt_tokens=30).reserve_lengths == (64,) * 8
    llm = FakeLLM("m", scheduling_policy="priority", max_num_seqs=2, true_lengths=true)

    def run_group(order):
        outputs = generate_group_vllm(llm, "p", order, per_completion_params(len(true)))
        return [true[o.params.seed] for o in outputs], max(o.start + true[o.params.seed] - 1 for o in outputs)

    base, planned, plan = compare_orders(run_group, group_size=len(true), slots=2, max_new_tokens=64,
                                         prompt_tokens=30, sigma=0)
    assert base.lengths == planned.lengths == tuple(true)
    assert base.engine_steps == base.model_steps and planned.engine_steps == planned.model_steps == plan.expected_steps
    assert "lengthsched priorities" in format_runs([base, planned]) and "8/8" in format_runs([base, planned])


def test_plan_rollout_places_length_classes_as_the_simulator_does():
    """placement='classes': the rows' replicas are lengthsched.runtime.replicas.plan_classes' (the
    simulator's placed_classes), each replica's rows longest predicted first; the extra arguments are
    required and named; verl's planner does not take it yet."""
    from lengthsched.integrations import plan_rollout
    from lengthsched.integrations.rollout import decode_replica
    from lengthsched.integrations.verl import RolloutPlanner
    from lengthsched.runtime.replicas import plan_classes
    from lengthsched.runtime.timing import default_cost

    rng = np.random.default_rng(3)
    medians = rng.integers(50, 1500, size=12)
    keys = [f"p{g}" for g in range(12) for _ in range(8)]
    predicted = np.repeat(medians, 8)
    prompts = np.repeat(rng.integers(20, 400, size=12), 8)
    common = dict(replicas=3, budget_tokens=16 * 2048, max_new_tokens=2048)
    plan = plan_rollout(keys, predicted, placement="classes", prompt_lens=prompts, **common)
    expected = plan_classes(predicted, np.repeat(np.arange(12), 8), prompts[::8], cost=default_cost(), **common)
    assert list(plan.replica) == expected.tolist() and plan.placement == "classes"
    for r in range(3):
        rows = plan.rows_on(r)
        assert [int(predicted[i]) for i in rows] == sorted((int(predicted[i]) for i in rows), reverse=True)
        assert all(decode_replica(plan.priority[i], 3) == r for i in rows)
    for missing in ("prompt_lens", "budget_tokens", "max_new_tokens"):
        args = dict(prompt_lens=prompts, **common) | {missing: None}
        with pytest.raises(InvalidArgument, match=f"'{missing}'"):
            plan_rollout(keys, predicted, placement="classes", **args)
    with pytest.raises(InvalidArgument, match="'prompt_lens'"):
        plan_rollout(keys, predicted, placement="classes", prompt_lens=prompts[:5], **common)
    with pytest.raises(InvalidArgument, match="'pool_tokens'"):  # verl's planner plans classes given the pool
        RolloutPlanner(placement="classes", max_new_tokens=512)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 8), min_size=1, max_size=12), replicas=st.integers(1, 6),
       pool=st.integers(600, 40_000), data=st.data())
def test_plan_rollout_ways_is_steals_placement(sizes, replicas, pool, data):
    """placement='ways': the placement of the simulator's steal (spread_ways over the groups' prompts and
    the step's predicted work, then place_ways), whatever the order of the batch's rows: a group's rows
    get the replicas they would get with the rows grouped, in batch order within the group."""
    predicted = [data.draw(st.lists(st.integers(0, 3000), min_size=n, max_size=n)) for n in sizes]
    prompts = data.draw(st.lists(st.integers(0, 500), min_size=len(sizes), max_size=len(sizes)))
    grouped = [g for g, n in enumerate(sizes) for _ in range(n)]
    flat = [x for group in predicted for x in group]
    work = float(sum(flat))
    ways = spread_ways(prompts, pool, replicas, work_tokens=work or None)
    expected = place_ways(np.asarray(flat, dtype=np.float64), sizes, replicas, ways)
    common = dict(replicas=replicas, placement="ways", budget_tokens=pool)
    plan = plan_rollout([f"uid-{g}" for g in grouped], flat, prompt_lens=[prompts[g] for g in grouped], **common)
    assert plan.placement == "ways" and list(plan.replica) == list(expected)  # the batch grouped, as verl sends it
    assert plan.group_spread() == tuple(min(n, ways, replicas) for n in sizes)  # over how many replicas each group
    # rows in any order: the groups taken in order of first appearance, each group's rows in batch order
    order = data.draw(st.permutations(range(len(flat))))
    plan = plan_rollout([f"uid-{grouped[i]}" for i in order], [flat[i] for i in order],
                        prompt_lens=[prompts[grouped[i]] for i in order], **common)
    first = list(dict.fromkeys(grouped[i] for i in order))
    rows = [[row for row, i in enumerate(order) if grouped[i] == g] for g in first]
    again = place_ways(np.asarray([flat[order[row]] for rs in rows for row in rs], dtype=np.float64),
                       [len(rs) for rs in rows], replicas, ways)
    assert [plan.replica[row] for rs in rows for row in rs] == list(again)
    longest = plan_rollout([f"uid-{grouped[i]}" for i in order], [flat[i] for i in order],
                           prompt_lens=[prompts[grouped[i]] for i in order], order="longest", **common)
    assert plan.order == "batch" and longest.order == "longest" and longest.replica == plan.replica
    # longest first in crowded steps only (steal's ORDER "longest_crowded"): where ways places whole groups
    crowded = plan_rollout([f"uid-{grouped[i]}" for i in order], [flat[i] for i in order],
                           prompt_lens=[prompts[grouped[i]] for i in order], order="longest_crowded", **common)
    like = longest if ways == 1 and replicas > 1 else plan
    assert (crowded.order, crowded.replica, crowded.priority) == (like.order, like.replica, like.priority)
    for r in range(replicas):
        rows = plan.rows_on(r)
        assert list(rows) == sorted(rows)  # steal's order: as placed, the batch's
        assert all(decode_replica(plan.priority[i], replicas) == r for i in rows)
        rows = longest.rows_on(r)
        assert [(-longest.predicted[i], i) for i in rows] == sorted((-longest.predicted[i], i) for i in rows)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=8), replicas=st.integers(2, 4),
       data=st.data())
def test_a_further_batch_is_placed_from_what_the_replicas_already_have(sizes, replicas, data):
    """plan_rollout(..., loads=): whole groups (placement groups, or ways in a crowded step) go greedily,
    largest first, to the replica with the least predicted tokens counting its load; all-zero loads are
    idle replicas (the plan without loads); spread and classes refuse loads."""
    keys = [g for g, n in enumerate(sizes) for _ in range(n)]
    pred = [data.draw(st.integers(1, 500)) for _ in keys]
    loads = data.draw(st.lists(st.integers(0, 3000), min_size=replicas, max_size=replicas))
    plan = plan_rollout(keys, pred, replicas=replicas, placement="groups", loads=loads)
    # replay the greedy: each group, largest first (ties: first in the batch), to the least loaded
    work = [sum(p for k, p in zip(keys, pred) if k == g) for g in range(len(sizes))]
    have = [float(x) for x in loads]
    for g in sorted(range(len(sizes)), key=lambda g: -work[g]):
        if any(loads):
            r = have.index(min(have))
            assert plan.group_replica[g] == r
            have[r] += work[g]
    assert sum(plan.replica_work) == sum(pred)  # this batch only
    given = np.array(loads, dtype=np.float64)
    plan_rollout(keys, pred, replicas=replicas, placement="groups", loads=given)
    assert given.tolist() == loads  # the caller's loads are not changed
    idle = plan_rollout(keys, pred, replicas=replicas, placement="groups")
    assert plan_rollout(keys, pred, replicas=replicas, placement="groups", loads=[0] * replicas) == idle
    crowded = plan_rollout(keys, [4000] * len(keys), replicas=replicas, placement="ways",
                           prompt_lens=[10] * len(keys), budget_tokens=100, loads=loads)
    assert min(crowded.group_replica) >= 0  # whole groups
    if any(loads):
        least = min(range(replicas), key=lambda r: (loads[r], r))
        biggest = max(range(len(sizes)), key=lambda g: (sizes[g], -g))  # the most predicted work
        assert crowded.group_replica[biggest] == least  # goes first, to the least loaded
    for placement in ("spread", "classes"):
        with pytest.raises(InvalidArgument, match="'loads'"):
            plan_rollout(keys, pred, replicas=replicas, placement=placement, loads=[1] * replicas,
                         prompt_lens=[10] * len(keys), budget_tokens=1000, max_new_tokens=512)
    for bad in ([1] * (replicas + 1), [-1] + [0] * (replicas - 1), [float("nan")] * replicas):
        with pytest.raises(InvalidArgument, match="'loads'"):
            plan_rollout(keys, pred, replicas=replicas, placement="groups", loads=bad)


def test_plan_rollout_ways_names_what_it_needs():
    keys, pred = ["a", "a", "b", "b"], [10, 20, 30, 40]
    for missing in ("prompt_lens", "budget_tokens"):
        args = {"prompt_lens": [5, 5, 7, 7], "budget_tokens": 100} | {missing: None}
        with pytest.raises(InvalidArgument, match=f"'{missing}'"):
            plan_rollout(keys, pred, replicas=2, placement="ways", **args)
    with pytest.raises(InvalidArgument, match="'budget_tokens'"):
        plan_rollout(keys, pred, replicas=2, placement="ways", prompt_lens=[5, 5, 7, 7], budget_tokens=0)
    with pytest.raises(InvalidArgument, match="'ways'"):  # the message lists every placement
        plan_rollout(keys, pred, replicas=2, placement="nowhere")
    with pytest.raises(InvalidArgument, match="argument 'order'.*'batch'"):
        plan_rollout(keys, pred, replicas=2, order="shortest")
    # any placement ranks in either order: batch order keeps each replica's rows as the batch has them
    batch = plan_rollout(keys, pred, replicas=2, placement="groups", order="batch")
    assert batch.order == "batch" and batch.replica[0] != batch.replica[2]
    assert batch.rows_on(batch.replica[0]) == (0, 1) and batch.rows_on(batch.replica[2]) == (2, 3)
    assert plan_rollout(keys, pred, replicas=2, placement="groups").rows_on(batch.replica[0]) == (1, 0)
    # pools that hold every prompt: verl's spread; a step that fills every pool 6 times over: whole groups
    assert plan_rollout(keys, pred, replicas=2, placement="ways", prompt_lens=[5, 5, 7, 7],
                        budget_tokens=100).replica == (0, 1, 0, 1)
    whole = plan_rollout(keys, [600] * 4, replicas=2, placement="ways", prompt_lens=[5, 5, 7, 7], budget_tokens=100)
    assert whole.group_replica[0] != -1 and whole.group_replica[1] != -1
    # longest_crowded: longest first where every group is whole (groups), batch order where spread
    assert plan_rollout(keys, pred, replicas=2, placement="groups", order="longest_crowded").order == "longest"
    assert plan_rollout(keys, pred, replicas=2, order="longest_crowded").order == "batch"


# ---------------------------------------------------------------------------------- spreading ways


def test_spread_ways_spreads_as_widely_as_the_pools_hold_the_prompts():
    # 8 replicas, prompts of 64 x 1,000 tokens: all of them fit a pool of 64,000 tokens
    assert spread_ways([1000] * 64, 64_000, 8) == 8
    assert spread_ways([1000] * 64, 32_000, 8) == 4  # half of the prompts per replica fit
    assert spread_ways([1000] * 64, 9_000, 8) == 1  # not even an eighth: whole groups
    assert spread_ways([1000] * 64, 32_000, 8, share=0.25) == 1
    assert spread_ways([], 100, 4) == 4 and spread_ways([0, 0], 100, 4) == 4  # no prompt tokens
    assert spread_ways([1000] * 64, 10**9, 1) == 1
    # a step whose predicted tokens fill every pool 6 times over (the default CROWDED_POOLS): whole groups
    assert CROWDED_POOLS == 6
    assert spread_ways([1000] * 64, 64_000, 8, work_tokens=6 * 8 * 64_000) == 1
    assert spread_ways([1000] * 64, 64_000, 8, work_tokens=6 * 8 * 64_000 - 1) == 8
    assert spread_ways([1000] * 64, 64_000, 8, work_tokens=4 * 8 * 64_000, crowded=4) == 1
    assert spread_ways([0] * 64, 64_000, 8, work_tokens=10**12) == 8  # no prompt to save: verl's spread
    for bad, name in (({"share": 0}, "share"), ({"share": float("nan")}, "share"), ({"share": True}, "share"),
                      ({"crowded": 0}, "crowded"), ({"work_tokens": -1}, "work_tokens"),
                      ({"work_tokens": float("inf")}, "work_tokens"), ({"work_tokens": "many"}, "work_tokens"),
                      ({"budget_tokens": 0}, "budget_tokens"), ({"replicas": 0}, "replicas"),
                      ({"prompt_tokens": [-1]}, "prompt_tokens")):
        args = {"prompt_tokens": [10], "budget_tokens": 100, "replicas": 2, **bad}
        with pytest.raises(InvalidArgument, match=f"'{name}'"):
            spread_ways(**args)


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.integers(0, 20), min_size=1, max_size=30), replicas=st.integers(1, 9),
       ways=st.integers(1, 10), seed=st.integers(0, 10**6))
def test_place_ways_puts_each_group_on_that_many_replicas_in_near_equal_runs(sizes, replicas, ways, seed):
    total = sum(sizes)
    pred = np.random.default_rng(seed).integers(0, 4000, total).astype(float)
    placed = place_ways(pred, sizes, replicas, ways)
    assert placed.shape == (total,) and placed.dtype == np.int64
    assert total == 0 or (placed.min() >= 0 and placed.max() < replicas)
    if ways >= replicas:  # exactly verl's spread: the baseline's own placement
        assert placed.tolist() == [i % replicas for i in range(total)]
        return
    start = 0
    for n in sizes:
        mine = placed[start:start + n]
        start += n
        if n == 0:
            continue
        counts = np.bincount(mine, minlength=replicas)
        used = counts[counts > 0]
        assert len(used) == min(ways, n) and used.max() - used.min() <= 1
        assert sum(1 for a, b in zip(mine[:-1], mine[1:]) if a != b) == len(used) - 1  # contiguous runs


def test_place_ways_balances_predicted_work_greedily_and_checks_its_input():
    # four groups of 4 on 4 replicas, 2 ways each: the greedy evens the predicted work out
    pred = np.repeat([400.0, 300.0, 200.0, 100.0], 4)
    placed = place_ways(pred, [4, 4, 4, 4], 4, 2)
    loads = np.bincount(placed, weights=pred, minlength=4)
    assert sorted(loads.tolist()) == [1000.0, 1000.0, 1000.0, 1000.0]
    whole = place_ways(pred, [4, 4, 4, 4], 4, 1)
    assert [len(set(whole[i:i + 4].tolist())) for i in range(0, 16, 4)] == [1, 1, 1, 1]
    with pytest.raises(InvalidArgument, match="'predicted'"):
        place_ways(pred[:-1], [4, 4, 4, 4], 4, 2)
    with pytest.raises(InvalidArgument, match="'predicted'"):
        place_ways(-pred, [4, 4, 4, 4], 4, 2)
    with pytest.raises(InvalidArgument, match="'ways'"):
        place_ways(pred, [4, 4, 4, 4], 4, 0)
    with pytest.raises(InvalidArgument, match="'group_sizes'"):
        place_ways(pred, [4, -4], 4, 2)


def test_a_drained_replica_steals_half_the_fullest_blocked_queues_work_from_its_back():
    predicted = {0: 100, 1: 100, 2: 100, 3: 100, 4: 500, 5: 50, 6: 50, 7: 300}
    queues = [[], [0, 1, 2, 3], [4, 5, 6], [7]]  # front first
    # replica 1 waits 400 predicted tokens, replica 2 600 but is not blocked, replica 3 300
    assert steal_requests(queues, 0, [False, True, False, True], predicted) == (1, [2, 3])
    assert steal_requests(queues, 0, [False, True, True, True], predicted) == (2, [4, 5, 6])  # 600: 500 + 50 + 50
    assert steal_requests(queues, 0, [False, True, True, True], predicted, share=0.1) == (2, [5, 6])  # 60: 50 + 50
    assert steal_requests(queues, 1, [False, True, False, True], predicted) == (3, [7])  # never itself
    assert steal_requests(queues, 0, [False, False, False, False], predicted) == (None, [])
    assert steal_requests([[], []], 0, [False, True], predicted) == (None, [])  # blocked but nothing waits


def test_stealing_counts_what_a_preempted_request_has_left_and_can_leave_it_in_place():
    predicted = [100, 100, 400, 100]
    generated = [0, 0, 350, 0]  # request 2 was preempted after 350 tokens: 50 left
    queues = [[], [2, 0, 1, 3]]
    assert steal_requests(queues, 0, [False, True], predicted, generated) == (1, [1, 3])  # 350 waiting: half
    assert steal_requests(queues, 0, [False, True], predicted, generated, share=1.0) == (1, [2, 0, 1, 3])
    assert steal_requests(queues, 0, [False, True], predicted, generated, share=1.0, started=False) == (1, [0, 1, 3])
    assert steal_requests([[], [2]], 0, [False, True], predicted, generated, started=False) == (None, [])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 500), min_size=1, max_size=30), st.floats(0.01, 1.0), st.integers(0, 2**31 - 1))
def test_a_steal_is_the_shortest_back_run_of_the_victims_queue_that_reaches_its_share(lengths, share, seed):
    rng = np.random.default_rng(seed)
    queue = rng.permutation(len(lengths)).tolist()
    victim, taken = steal_requests([[], queue], 0, [False, True], lengths, share=share)
    assert victim == 1 and taken == queue[len(queue) - len(taken):]  # a run from the back, in queue order
    work = sum(lengths)
    assert sum(lengths[j] for j in taken) >= share * work - 1e-9 or taken == queue
    assert sum(lengths[j] for j in taken[1:]) < share * work  # one fewer would not reach it


def test_steal_requests_checks_its_arguments():
    with pytest.raises(InvalidArgument, match="thief"):
        steal_requests([[], [1]], 2, [False, True], [1, 1])
    with pytest.raises(InvalidArgument, match="blocked"):
        steal_requests([[], [1]], 0, [True], [1, 1])
    with pytest.raises(InvalidArgument, match="share"):
        steal_requests([[], [1]], 0, [False, True], [1, 1], share=1.5)


def test_running_requests_move_to_idle_replicas_most_tokens_to_go_first_while_one_stays():
    from lengthsched.integrations import MOVE_CHUNK, move_requests
    from lengthsched.runtime.dispatch import WorkStealing

    assert MOVE_CHUNK == WorkStealing.MIGRATE_CHUNK == 128
    predicted = [1000, 300, 900, 128, 2000]
    generated = {0: 256, 1: 128, 2: 128, 3: 128, 4: 1920}  # to go: 744, 172, 772, 0, 80
    assert move_requests([0, 1, 2, 3], [5, 2], predicted, generated, running=6) == [(2, 2), (0, 5)]
    assert move_requests([0, 1, 2], [7, 5, 6], predicted, generated, running=3) == [(2, 5), (0, 6)]  # one stays
    assert move_requests([4, 3], [1], predicted, generated, running=2) == [(4, 1)]  # overran: still moves
    assert move_requests([0], [1], predicted, generated, running=1) == []  # its last request stays
    assert move_requests([], [1], predicted, generated, running=4) == []
    assert move_requests([0, 2], [], predicted, generated, running=4) == []
    ties = move_requests([3, 1], [0, 1], [10, 10, 10, 10], [0, 0, 0, 0], running=5)
    assert ties == [(1, 0), (3, 1)]  # equal tokens to go: lower id first
    with pytest.raises(InvalidArgument, match="'running'"):
        move_requests([0, 1], [1], predicted, generated, running=1)
    with pytest.raises(InvalidArgument, match="'running'"):
        move_requests([0], [1], predicted, generated, running=-1)
