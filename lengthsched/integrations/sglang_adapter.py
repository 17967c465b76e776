"""SGLang: a lengthsched plan as request priorities, and a budget as engine arguments.

SGLang (checked against its main-branch source and its server-argument docs, 0.5 series; not
run here, no GPU):

- ``enable_priority_scheduling=True`` (``--enable-priority-scheduling``) sorts the waiting queue
  by priority, then arrival. By default the LARGER value runs first;
  ``schedule_low_priority_values_first=True`` flips it to vLLM's convention (lower first), which
  is what :func:`sglang_setup` asks for unless told otherwise.
- Priorities are applied by the ``fcfs`` (and ``lof``) schedule policies only; the cache-aware
  ones (``lpm``, ``dfs-weight``) sort by prefix instead, so :func:`sglang_setup` sets
  ``schedule_policy="fcfs"``. The radix cache still shares the prompt's KV (every token:
  ``page_size=1``).
- With priority scheduling on, an arriving request whose priority beats a running one by more
  than ``priority_scheduling_preemption_threshold`` (default 10) preempts it. A plan submits its
  group in order, so that would only happen when requests reach the scheduler out of order; the
  setup raises the threshold so that priorities order admission and never preempt.
- ``Engine.generate(prompt=..., sampling_params=..., priority=...)`` and ``async_generate`` take
  ONE ``priority: Optional[int]`` per call, also for a batch of prompts; and ``generate`` blocks
  until its call is done. So a group is sent as G concurrent ``async_generate`` calls, one per
  completion, each with its own priority (the HTTP ``/generate`` body takes ``"priority"`` the
  same way).
- ``mem_fraction_static`` is the fraction of GPU memory for static allocation (weights and the
  KV pool); activations and CUDA graphs live in the rest. ``max_running_requests`` caps the
  running batch; ``max_total_tokens`` fixes the KV pool in tokens.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from ..errors import BudgetTooSmall, InvalidArgument
from ..memory import ModelMemory
from ..plan import Plan
from . import base as _base
from .base import EngineSetup, GroupRequests

__all__ = [
    "SGLANG_NO_PRIORITY_PREEMPTION",
    "agenerate_group_sglang",
    "generate_group_sglang",
    "sglang_calls",
    "sglang_priorities",
    "sglang_requests",
    "sglang_setup",
]

# A priority_scheduling_preemption_threshold no priority difference of a plan reaches.
SGLANG_NO_PRIORITY_PREEMPTION = 2**31 - 1


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


async def agenerate_group_sglang(
    engine: Any, prompt: Any, plan_or_lengths: Any, sampling_params: Any, *,
    low_values_first: bool = True, base: int = 0, **generate_kwargs: Any,
) -> list[Any]:
    """Generate one group as G concurrent ``engine.async_generate(prompt=..., sampling_params=...,
    priority=...)`` calls created in the plan's order; returns each completion's output dict in
    completion-index order. ``low_values_first`` must match the engine's
    ``schedule_low_priority_values_first``."""
    reqs = sglang_requests(prompt, plan_or_lengths, sampling_params, low_values_first=low_values_first, base=base)
    calls = [engine.async_generate(**call, **generate_kwargs) for call in sglang_calls(reqs)]
    return reqs.by_completion(await asyncio.gather(*calls))


def generate_group_sglang(
    engine: Any, prompt: Any, plan_or_lengths: Any, sampling_params: Any, *,
    low_values_first: bool = True, base: int = 0, **generate_kwargs: Any,
) -> list[Any]:
    """Blocking form of :func:`agenerate_group_sglang`, run on the engine's event loop
    (``engine.loop``, as ``sglang.Engine.generate`` does) or a new one."""
    coro = agenerate_group_sglang(engine, prompt, plan_or_lengths, sampling_params,
                                  low_values_first=low_values_first, base=base, **generate_kwargs)
    loop = getattr(engine, "loop", None)
    return asyncio.run(coro) if loop is None else loop.run_until_complete(coro)


def sglang_setup(
    plan: Plan,
    memory: ModelMemory,
    *,
    gpu_memory_bytes: int | str,
    kv_budget_bytes: int | str | None = None,
    overhead_bytes: int | None = None,
    low_values_first: bool = True,
    pin_kv_cache: bool = False,
    priority_base: int = 0,
) -> EngineSetup:
    """SGLang engine arguments and request priorities that run ``plan`` in a memory budget.

    The arguments are those of :func:`~lengthsched.integrations.vllm_setup` (bytes, or strings
    such as ``"80GiB"``), with SGLang's meaning: the plan's concurrency becomes
    ``max_running_requests``; ``memory`` is taken with token-granular KV (page size 1) and a shared
    prompt; the default KV pool is :func:`plan_kv_bytes`; ``overhead_bytes`` (activations, CUDA
    graphs, context; default :func:`default_overhead_bytes`) is what SGLang keeps outside
    ``mem_fraction_static``. Besides:

        low_values_first: set ``schedule_low_priority_values_first`` (vLLM's convention) and
            give the first completion the lowest value; ``False`` keeps SGLang's default.
        pin_kv_cache: also pass ``max_total_tokens`` = KV pool / bytes per token, so the pool is
            exactly the budget (for full-attention models; sliding-window models use other pools).

    ``mem_fraction_static = ceil4((W + KV pool) / gpu_memory_bytes)`` (rounded up to 4
    decimals). Raises :class:`~lengthsched.BudgetTooSmall` when W + KV pool + overhead exceeds
    the GPU.
    """
    _base.check_plan(plan)
    low_values_first = bool(low_values_first)

    def kwargs(mem: ModelMemory, kv: int, fraction: float, running: int) -> dict[str, Any]:
        if kv < mem.kv_bytes_per_token:
            raise BudgetTooSmall("kv_budget_bytes", kv, f"at least {mem.kv_bytes_per_token} bytes (one KV token)")
        out = {"enable_priority_scheduling": True, "schedule_low_priority_values_first": low_values_first,
               "schedule_policy": "fcfs", "priority_scheduling_preemption_threshold": SGLANG_NO_PRIORITY_PREEMPTION,
               "mem_fraction_static": fraction, "max_running_requests": running, "page_size": mem.block_size}
        return out | ({"max_total_tokens": kv // mem.kv_bytes_per_token} if pin_kv_cache else {})

    return _base.engine_setup(plan, memory, "sglang", gpu_memory_bytes=gpu_memory_bytes, kv_budget_bytes=kv_budget_bytes,
                        overhead_bytes=overhead_bytes,
                        priorities=sglang_priorities(plan, low_values_first=low_values_first, base=priority_base),
                        fraction_includes_overhead=False, engine_kwargs=kwargs)
