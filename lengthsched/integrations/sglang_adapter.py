"""SGLang: a lengthsched plan as request priorities, and a budget as engine arguments.

Modelled on SGLang 0.5.23's own code (the wheel's sources were read, not run: no GPU here). Files
are under ``python/sglang/srt/``:

- ``enable_priority_scheduling=True`` sorts the waiting queue by ``priority * priority_sign``,
  then queue entry time (``managers/schedule_policy.py``, ``_sort_by_priority_and_fcfs``); the sign
  makes LARGER values run first unless ``schedule_low_priority_values_first=True``, which this
  adapter asks for (vLLM's convention) unless told otherwise.
- Priority scheduling requires ``schedule_policy`` ``"fcfs"`` or ``"lof"``
  (``arg_groups/validation_hook.py``); :func:`sglang_setup` sets ``"fcfs"``. Under it the
  scheduler does not run the in-batch prefix check (``SchedulePolicy._compute_prefix_matches``,
  cache-aware policies only), so G copies of one prompt admitted in the same prefill batch each
  prefill the whole prompt: :func:`agenerate_group_sglang` first sends one ``max_new_tokens=1``
  request so the radix cache holds the prompt, then the G requests.
- Priorities are signed 64-bit (``managers/tokenizer_manager.py``, ``_set_default_priority``); a
  request without one gets ``sys.maxsize`` (low values first) or ``-sys.maxsize - 1``
  (``managers/scheduler.py``, ``_set_or_validate_priority``). An arriving request preempts running
  ones whose priority it beats by more than ``priority_scheduling_preemption_threshold``
  (``schedule_policy.py``, ``preempt_to_schedule``): against a request without a priority the
  difference is about 2**63, beyond any threshold. :func:`sglang_setup` therefore passes
  ``disable_priority_preemption=True``: priorities order admission and never preempt.
- ``retraction_policy="priority"`` (default ``"length"``) makes decode retraction, when the KV pool
  runs out, take the lowest-priority running requests first (``managers/schedule_batch.py``,
  ``_get_decode_retraction_order``): the ones latest in the plan, as vLLM's priority victim rule.
  It requires priority scheduling.
- ``Engine.generate`` / ``async_generate(prompt=None, sampling_params=None, input_ids=None, ...,
  rid=None, session_params=None, priority=None, ...)`` take ONE ``priority: Optional[int]`` per
  call, also for a batch of prompts (``entrypoints/engine.py``); so a group is sent as G
  concurrent ``async_generate`` calls, one per completion.
- ``mem_fraction_static`` is the fraction of GPU memory for weights and the KV pool; activations
  and CUDA graphs live in the rest. ``max_running_requests`` caps the running batch;
  ``max_total_tokens`` fixes the KV pool in tokens. ``page_size`` is left unset: some attention
  backends rewrite it (``arg_groups/overrides.py``, ``_mla_backend_page_constraints``: FlashMLA,
  TRT-LLM MLA/MHA, CuteDSL MLA, HPC-Ops to 32/64); read the resolved one with
  :func:`sglang_page_size` (``Engine.get_server_info()["page_size"]``).
- The ``sampling_seed`` sampling parameter only takes effect with
  ``enable_deterministic_inference=True`` (``sampling/sampling_batch_info.py`` builds the seed
  tensor only then); otherwise it is ignored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from ..errors import BudgetTooSmall, InvalidArgument, check_int
from ..memory import ModelMemory
from ..plan import Plan
from . import base as _base
from .base import EngineSetup, GroupRequests

__all__ = [
    "SGLANG_RETRACTION_POLICIES",
    "agenerate_group_sglang",
    "generate_group_sglang",
    "sglang_calls",
    "sglang_page_size",
    "sglang_priorities",
    "sglang_requests",
    "sglang_setup",
]

# SGLang's retraction_policy choices (arg_groups/fields/schedule.py, 0.5.23); None leaves it unset.
SGLANG_RETRACTION_POLICIES = ("priority", "length")
# Keyword arguments of async_generate that shape only the output, left out of the prefix warm-up.
_OUTPUT_ONLY = ("stream", "rid", "return_logprob", "logprob_start_len", "top_logprobs_num", "token_ids_logprob",
                "return_hidden_states", "return_routed_experts", "routed_experts_start_len")


def sglang_priorities(plan_or_lengths: Any, *, low_values_first: bool = True, base: int = 0) -> tuple[int, ...]:
    """Per completion (index order), its SGLang priority in the plan's order.

    ``low_values_first=True`` (the engine runs with ``schedule_low_priority_values_first``):
    ``base + rank``. ``False`` (SGLang's default, larger first): ``base + G - 1 - rank``. Either
    way the completion the plan starts first is served first.
    """
    return _base.ranked_priorities(plan_or_lengths, low_values_first=bool(low_values_first), base=base)


def _sglang_prompt(prompt: Any) -> Any:
    if isinstance(prompt, str) and prompt:
        return prompt
    ids = _base.token_ids(prompt)
    if ids:
        return ids
    raise InvalidArgument("prompt", prompt, "a non-empty string or a list of token ids")


def sglang_requests(
    prompt: Any, plan_or_lengths: Any, sampling_params: Any, *, low_values_first: bool = True, base: int = 0
) -> GroupRequests:
    """The group as G SGLang requests (n=1 each) in the plan's order, with their priorities.

    ``prompt``: a string or token ids. ``sampling_params``: one SGLang sampling-parameters dict
    (``{"max_new_tokens": ..., "temperature": ...}``) for all, or a list of one per completion
    (index order).
    """
    return _base.build_requests(
        _sglang_prompt(prompt), plan_or_lengths, sampling_params,
        sglang_priorities(plan_or_lengths, low_values_first=low_values_first, base=base),
        single=lambda p: isinstance(p, Mapping),
        n_of=lambda p: p.get("n", 1),
    )


def sglang_calls(requests: GroupRequests) -> list[dict[str, Any]]:
    """Keyword arguments of one ``Engine.async_generate`` (or ``generate``) call per request:
    ``prompt=`` (text) or ``input_ids=`` (token ids), ``sampling_params=``, ``priority=``."""
    calls = []
    for prompt, params, priority in zip(requests.prompts, requests.sampling_params, requests.priorities):
        key = "prompt" if isinstance(prompt, str) else "input_ids"
        calls.append({key: prompt, "sampling_params": dict(params), "priority": priority})
    return calls


def _warm_up_call(call: dict[str, Any], generate_kwargs: dict[str, Any]) -> dict[str, Any]:
    """One ``max_new_tokens=1`` request of the group's prompt at its first priority; the keyword
    arguments that select a cache (``lora_path``, images ...) go with it, output-only ones do not."""
    key = "prompt" if "prompt" in call else "input_ids"
    extra = {k: v for k, v in generate_kwargs.items() if k not in _OUTPUT_ONLY}
    return {key: call[key], "sampling_params": {"max_new_tokens": 1}, "priority": call["priority"], **extra}


async def agenerate_group_sglang(
    engine: Any, prompt: Any, plan_or_lengths: Any, sampling_params: Any, *,
    low_values_first: bool = True, base: int = 0, warm_prefix: bool = True, **generate_kwargs: Any,
) -> list[Any]:
    """Generate one group as G concurrent ``engine.async_generate(prompt=..., sampling_params=...,
    priority=...)`` calls created in the plan's order; returns each completion's output dict in
    completion-index order. ``low_values_first`` must match the engine's
    ``schedule_low_priority_values_first``.

    ``warm_prefix`` (default): first await one ``max_new_tokens=1`` request of the prompt at the
    group's first priority, so that the radix cache holds the prompt before the G requests arrive
    (under ``fcfs`` SGLang 0.5.23 does not share a prompt inside one prefill batch; see the module
    docstring). Its output is dropped.
    """
    reqs = sglang_requests(prompt, plan_or_lengths, sampling_params, low_values_first=low_values_first, base=base)
    calls = sglang_calls(reqs)
    if warm_prefix:
        await engine.async_generate(**_warm_up_call(calls[0], generate_kwargs))
    pending = [engine.async_generate(**call, **generate_kwargs) for call in calls]
    return reqs.by_completion(await asyncio.gather(*pending))


def generate_group_sglang(
    engine: Any, prompt: Any, plan_or_lengths: Any, sampling_params: Any, *,
    low_values_first: bool = True, base: int = 0, warm_prefix: bool = True, **generate_kwargs: Any,
) -> list[Any]:
    """Blocking form of :func:`agenerate_group_sglang` (prefix warm-up included), run on the
    engine's event loop (``engine.loop``, as ``sglang.Engine.generate`` does) or a new one."""
    coro = agenerate_group_sglang(engine, prompt, plan_or_lengths, sampling_params, low_values_first=low_values_first,
                                  base=base, warm_prefix=warm_prefix, **generate_kwargs)
    loop = getattr(engine, "loop", None)
    return asyncio.run(coro) if loop is None else loop.run_until_complete(coro)


def sglang_page_size(engine_or_info: Any) -> int | None:
    """The KV page size the running engine resolved (tokens), or None when it cannot be read:
    ``Engine.get_server_info()["page_size"]`` (SGLang 0.5.23 returns the resolved server
    arguments there), or that mapping itself. Pass it as ``page_size`` to :func:`sglang_setup`."""
    info = engine_or_info
    if not isinstance(info, Mapping):
        getter = getattr(engine_or_info, "get_server_info", None)
        info = getter() if callable(getter) else None
    size = info.get("page_size") if isinstance(info, Mapping) else None
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        return None
    return size


def sglang_setup(
    plan: Plan,
    memory: ModelMemory,
    *,
    gpu_memory_bytes: int | str,
    kv_budget_bytes: int | str | None = None,
    overhead_bytes: int | None = None,
    low_values_first: bool = True,
    retraction_policy: str | None = "priority",
    page_size: int | None = None,
    pin_kv_cache: bool = False,
    tensor_parallel_size: int = 1,
    concurrency: int | None = None,
    priority_base: int = 0,
) -> EngineSetup:
    """SGLang engine arguments and request priorities that run ``plan`` in a memory budget.

    The arguments are those of :func:`~lengthsched.integrations.vllm_setup` (bytes, or strings
    such as ``"80GiB"``), with SGLang's meaning: the plan's concurrency becomes
    ``max_running_requests``; ``memory`` is taken with a shared prompt; the default KV pool is
    :func:`plan_kv_bytes`; ``overhead_bytes`` (activations, CUDA graphs, context; default
    :func:`default_overhead_bytes`) is what SGLang keeps outside ``mem_fraction_static``. Besides:

        low_values_first: set ``schedule_low_priority_values_first`` (vLLM's convention) and
            give the first completion the lowest value; ``False`` keeps SGLang's default.
        retraction_policy: ``"priority"`` (default: retract the latest in the plan first),
            ``"length"`` (SGLang's default), or None (not passed, for releases without it).
        page_size: the engine's page size (tokens) for the arithmetic; NOT passed (some
            attention backends rewrite it). Default 1; read it with :func:`sglang_page_size`.
        pin_kv_cache: also pass ``max_total_tokens`` = KV pool / bytes per token, so the pool is
            exactly the budget (for full-attention models; sliding-window models use other pools).
        tensor_parallel_size: GPUs the model is sharded over (passed as ``tp_size``); weights and
            KV pool split evenly.
        concurrency: ``max_running_requests`` (default :func:`plan_concurrency`).

    Always passed: ``enable_priority_scheduling``, ``schedule_policy="fcfs"`` and
    ``disable_priority_preemption=True`` (see the module docstring).
    ``mem_fraction_static = ceil4((W + KV pool) / tp / gpu_memory_bytes)`` (rounded up to 4
    decimals). Raises :class:`~lengthsched.BudgetTooSmall` when a GPU's share of W + KV pool plus
    the overhead exceeds it.
    """
    _base.check_plan(plan)
    low_values_first = bool(low_values_first)
    if retraction_policy is not None and retraction_policy not in SGLANG_RETRACTION_POLICIES:
        raise InvalidArgument("retraction_policy", retraction_policy,
                              "one of " + ", ".join(SGLANG_RETRACTION_POLICIES) + ", or None (not passed)")
    if page_size is not None:
        page_size = check_int("page_size", page_size, minimum=1)
    tp = check_int("tensor_parallel_size", tensor_parallel_size, minimum=1)

    def kwargs(mem: ModelMemory, kv: int, fraction: float, running: int) -> dict[str, Any]:
        if kv < mem.kv_bytes(mem.block_size):
            raise BudgetTooSmall("kv_budget_bytes", kv, f"at least {mem.kv_bytes(mem.block_size)} bytes (one KV page)")
        out: dict[str, Any] = {"enable_priority_scheduling": True,
                               "schedule_low_priority_values_first": low_values_first, "schedule_policy": "fcfs",
                               "disable_priority_preemption": True, "mem_fraction_static": fraction,
                               "max_running_requests": running}
        if retraction_policy is not None:
            out["retraction_policy"] = retraction_policy
        if pin_kv_cache:
            out["max_total_tokens"] = kv // mem.kv_bytes_per_token
        if tp > 1:
            out["tp_size"] = tp
        return out

    return _base.engine_setup(plan, memory, "sglang", gpu_memory_bytes=gpu_memory_bytes,
                              kv_budget_bytes=kv_budget_bytes, overhead_bytes=overhead_bytes,
                              priorities=sglang_priorities(plan, low_values_first=low_values_first, base=priority_base),
                              fraction_includes_overhead=False, engine_kwargs=kwargs, block_size=page_size,
                              tensor_parallel_size=tp, concurrency=concurrency)
