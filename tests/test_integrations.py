"""The vLLM and SGLang adapters (lengthsched.integrations), against the engines' documented
argument shapes: small fake engines record every call and list-schedule requests the way the
engines' priority queues order them. No engine, no GPU (see docs/howto-vllm.md, howto-sglang.md)."""

from __future__ import annotations

import asyncio
import heapq
import py_compile
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lengthsched as ls
from lengthsched import BudgetTooSmall, InvalidArgument
from lengthsched.integrations import (
    ENGINE_FIXED_OVERHEAD_BYTES,
    SGLANG_NO_PRIORITY_PREEMPTION,
    agenerate_group_vllm,
    default_overhead_bytes,
    engine_memory,
    generate_group_sglang,
    generate_group_vllm,
    plan_concurrency,
    plan_kv_bytes,
    request_order,
    request_ranks,
    sglang_calls,
    sglang_priorities,
    sglang_requests,
    sglang_setup,
    vllm_priorities,
    vllm_requests,
    vllm_setup,
)
from lengthsched.integrations.demo import (
    compare_orders,
    format_runs,
    placeholder_plan,
    plan_slots,
)

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


class FakeLLM:
    """``vllm.LLM`` as documented: ``LLM(model, **engine args)`` and ``generate(prompts,
    sampling_params=None, *, use_tqdm=True, lora_request=None, priority=None,
    tokenization_kwargs=None)``; outputs in prompt order. Priority scheduling serves the lowest
    ``(priority, arrival)`` first; a non-zero priority under ``fcfs`` is an error, as in vLLM."""

    def __init__(self, model: str, *, scheduling_policy: str = "fcfs", gpu_memory_utilization: float = 0.9,
                 max_num_seqs: int = 128, block_size: int | None = None, enable_prefix_caching: bool | None = None,
                 max_model_len: int | None = None, kv_cache_memory_bytes: int | None = None,
                 true_lengths: list[int] | None = None):
        assert 0 < gpu_memory_utilization <= 1
        self.model, self.policy, self.max_num_seqs = model, scheduling_policy, max_num_seqs
        self.true_lengths = true_lengths
        self.calls: list[dict] = []

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None, priority=None,
                 tokenization_kwargs=None):
        self.calls.append({"prompts": prompts, "sampling_params": sampling_params, "priority": priority})
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        priority = [0] * len(prompts) if priority is None else priority
        if len(priority) != len(prompts) or len(params) != len(prompts):
            raise ValueError("priority and sampling_params must have one entry per prompt")
        if self.policy != "priority" and any(priority):
            raise ValueError(f"Got priority {max(priority)} but Priority scheduling is not enabled.")
        durations = [1 if self.true_lengths is None or p.seed is None else self.true_lengths[p.seed] for p in params]
        starts = list_schedule([(p, i) for i, p in enumerate(priority)], durations, self.max_num_seqs)
        return [FakeOutput(q, p, r, s) for q, p, r, s in zip(prompts, params, priority, starts)]


class FakeAsyncLLM:
    """``vllm.AsyncLLM.generate(prompt, sampling_params, request_id, *, priority=0, ...)``: an
    async generator of outputs, the last one finished."""

    def __init__(self):
        self.calls: list[dict] = []

    async def generate(self, prompt, sampling_params, request_id, *, lora_request=None, trace_headers=None,
                       priority=0, data_parallel_rank=None):
        self.calls.append({"prompt": prompt, "params": sampling_params, "request_id": request_id, "priority": priority})
        await asyncio.sleep(0)
        yield FakeOutput(prompt, sampling_params, priority, 0, finished=False)
        yield FakeOutput(prompt, sampling_params, priority, 0, finished=True)


class FakeSGLangEngine:
    """``sglang.Engine`` as documented: ``Engine(model_path, **server args)``; ``generate`` and
    ``async_generate(prompt=None, sampling_params=None, input_ids=None, ..., priority=None)`` take
    ONE ``priority: Optional[int]`` per call and return a dict with ``meta_info``."""

    def __init__(self, model_path: str, *, mem_fraction_static: float | None = None,
                 max_running_requests: int | None = None, enable_priority_scheduling: bool = False,
                 schedule_low_priority_values_first: bool = False, schedule_policy: str = "fcfs",
                 priority_scheduling_preemption_threshold: int = 10, page_size: int = 1,
                 max_total_tokens: int | None = None, event_loop: bool = False):
        assert mem_fraction_static is None or 0 < mem_fraction_static < 1
        self.low_first = schedule_low_priority_values_first
        self.max_running_requests = max_running_requests
        self.calls: list[dict] = []
        if event_loop:
            self.loop = asyncio.new_event_loop()

    def _record(self, prompt, sampling_params, input_ids, priority) -> dict:
        if priority is not None and not isinstance(priority, int):
            raise TypeError("GenerateReqInput.priority is Optional[int]: one priority per call")
        self.calls.append({"prompt": prompt, "input_ids": input_ids, "sampling_params": sampling_params,
                           "priority": priority})
        return {"text": "", "meta_info": {"completion_tokens": sampling_params.get("seed", 0), "priority": priority}}

    def generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False, stream=False,
                 rid=None, priority=None):
        return self._record(prompt, sampling_params, input_ids, priority)

    async def async_generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False,
                             stream=False, rid=None, priority=None):
        await asyncio.sleep(0)
        return self._record(prompt, sampling_params, input_ids, priority)

    def start_order(self) -> list[int]:
        """Call indices in the order the waiting queue serves them: priority (larger first unless
        ``schedule_low_priority_values_first``), then arrival."""
        sign = 1 if self.low_first else -1
        return sorted(range(len(self.calls)), key=lambda i: (sign * self.calls[i]["priority"], i))


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
    assert [engine.calls[i]["sampling_params"]["seed"] for i in engine.start_order()] == list(plan.admission_order)


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


def test_vllm_rejects_priorities_without_the_priority_policy():
    llm = FakeLLM("m")  # scheduling_policy defaults to fcfs, as in vLLM
    with pytest.raises(ValueError, match="Priority scheduling is not enabled"):
        generate_group_vllm(llm, "p", [5, 3], FakeSamplingParams())


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
def test_generate_group_sglang_one_call_per_completion(event_loop):
    engine = FakeSGLangEngine("m", enable_priority_scheduling=True, schedule_low_priority_values_first=True,
                              event_loop=event_loop)
    outputs = generate_group_sglang(engine, "Why?", [5, 3, 8, 2], [{"max_new_tokens": 8, "seed": j} for j in range(4)])
    assert [c["prompt"] for c in engine.calls] == ["Why?"] * 4 and all(c["input_ids"] is None for c in engine.calls)
    assert [c["sampling_params"]["seed"] for c in engine.calls] == [3, 1, 0, 2]  # created in the plan's order
    assert [c["priority"] for c in engine.calls] == [0, 1, 2, 3]
    assert [o["meta_info"]["completion_tokens"] for o in outputs] == [0, 1, 2, 3]  # back in completion order
    assert [engine.calls[i]["sampling_params"]["seed"] for i in engine.start_order()] == [3, 1, 0, 2]
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
    assert setup.engine_kwargs == {
        "scheduling_policy": "priority", "gpu_memory_utilization": 0.0585, "max_num_seqs": 2, "block_size": 16,
        "enable_prefix_caching": True, "max_model_len": 2348,
    }
    assert setup.priorities == plan.priorities() and setup.order == plan.admission_order
    pinned = vllm_setup(plan, QWEN, gpu_memory_bytes=80 * GIB, overhead_bytes=GIB, pin_kv_cache=True)
    assert pinned.engine_kwargs["kv_cache_memory_bytes"] == 508_297_216
    FakeLLM("Qwen/Qwen3-1.7B", **pinned.engine_kwargs)  # the keyword names vLLM documents
    # Default overhead: the memory model's decode activations of 2 sequences + 2 GiB.
    assert default_overhead_bytes(QWEN, 2) == 2 * 648_704 + ENGINE_FIXED_OVERHEAD_BYTES
    assert vllm_setup(plan, QWEN, gpu_memory_bytes=80 * GIB).overhead_bytes == 2 * 648_704 + 2 * GIB


def test_sglang_setup_by_hand_on_qwen3_1_7b():
    plan = ls.plan_group([652, 799, 1473, 768], slots=2, max_new_tokens=2048, prompt_tokens=300)
    setup = sglang_setup(plan, QWEN, gpu_memory_bytes=80 * GIB, overhead_bytes=GIB, pin_kv_cache=True)
    # KV pool, token-granular: 300 shared prompt tokens + 2 live x 2048 = 4396 tokens x 114688 bytes.
    assert setup.kv_bytes == 4396 * C == 504_168_448
    # mem_fraction_static = (W + KV pool) / total = 3_945_318_400 / 85_899_345_920 = 0.045929..., rounded up.
    assert setup.fraction == 0.046
    assert setup.engine_kwargs == {
        "enable_priority_scheduling": True, "schedule_low_priority_values_first": True, "schedule_policy": "fcfs",
        "priority_scheduling_preemption_threshold": SGLANG_NO_PRIORITY_PREEMPTION, "mem_fraction_static": 0.046,
        "max_running_requests": 2, "page_size": 1, "max_total_tokens": 4396,
    }
    FakeSGLangEngine("Qwen/Qwen3-1.7B", **setup.engine_kwargs)  # the server-argument names SGLang documents
    high_first = sglang_setup(plan, QWEN, gpu_memory_bytes=80 * GIB, low_values_first=False)
    assert high_first.engine_kwargs["schedule_low_priority_values_first"] is False
    assert high_first.priorities == tuple(3 - r for r in plan.priorities())


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
    ],
)
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(InvalidArgument) as err:
        call()
    assert err.value.name == name and err.value.expected
    assert f"argument '{name}'" in str(err.value)


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
