"""vLLM: a lengthsched plan as request priorities, and a budget as engine arguments.

vLLM (checked against its docs for releases 0.9 to 0.29 and its main-branch source; not run
here, no GPU):

- ``scheduling_policy="priority"`` orders the waiting queue by ``(priority, arrival_time)``:
  the LOWER value is served first, ties by arrival. A request with priority != 0 is rejected
  when the engine runs the default ``"fcfs"`` policy.
- ``LLM.generate(prompts, sampling_params, priority=[...])`` takes one priority per prompt;
  ``AsyncLLM.generate(prompt, sampling_params, request_id, priority=...)`` one per request.
- When KV blocks run out, the priority policy preempts (and later recomputes) the running
  request with the largest ``(priority, arrival_time)``: the one latest in the plan.
- ``SamplingParams(n=G)`` would fan out G children with ONE priority, so a group is sent as G
  requests of the same prompt with n=1; prefix caching (on by default in V1) shares the prompt's
  full 16-token blocks, which is what :func:`~lengthsched.integrations.engine_memory` models.
- ``gpu_memory_utilization`` is the fraction of the GPU's total memory the instance may use for
  weights, activations (measured by a profiling run at start-up), CUDA graphs and the KV cache;
  ``max_num_seqs`` caps the sequences in one step; ``block_size`` (16 on CUDA) is tokens per KV
  block; recent releases also take ``kv_cache_memory_bytes``, which fixes the KV pool in bytes
  and then ignores ``gpu_memory_utilization`` for it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from typing import Any

from ..errors import BudgetTooSmall, InvalidArgument, check_int
from ..memory import ModelMemory
from ..plan import Plan
from . import base as _base
from .base import EngineSetup, GroupRequests

__all__ = ["VLLM_NULL_BLOCKS", "agenerate_group_vllm", "generate_group_vllm", "vllm_priorities", "vllm_requests", "vllm_setup"]

# Blocks vLLM's block pool keeps out of use (the null block), counted in the KV pool.
VLLM_NULL_BLOCKS = 1


def vllm_priorities(plan_or_lengths: Any, *, base: int = 0) -> tuple[int, ...]:
    """Per completion (index order), its vLLM priority: ``base + rank`` in the plan's order, so
    the completion the plan starts first has the lowest value and vLLM serves it first.

    ``plan_or_lengths``: a :class:`~lengthsched.Plan`, or predicted lengths (tokens; shortest
    first, ties by index). ``base`` offsets a group's priorities (e.g. several groups in one call).
    """
    return _base.ranked_priorities(plan_or_lengths, low_values_first=True, base=base)


def _vllm_prompt(prompt: Any) -> Any:
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, Mapping) and ("prompt" in prompt or "prompt_token_ids" in prompt):
        return dict(prompt)
    ids = _base.token_ids(prompt)
    if ids:
        return {"prompt_token_ids": ids}
    raise InvalidArgument("prompt", prompt,
                          "a non-empty string, a list of token ids, or a vLLM prompt dict (TextPrompt / TokensPrompt)")


def vllm_requests(prompt: Any, plan_or_lengths: Any, sampling_params: Any, *, base: int = 0) -> GroupRequests:
    """The group as G vLLM requests (n=1 each) in the plan's order, with their priorities.

    ``prompt``: a string, token ids (sent as ``{"prompt_token_ids": ...}``) or a vLLM prompt dict.
    ``sampling_params``: one ``vllm.SamplingParams`` with n=1 for all, or a list of one per
    completion (index order; e.g. a ``seed`` per completion so outputs do not depend on the order).
    """
    if sampling_params is None:
        raise InvalidArgument("sampling_params", None, "a vllm.SamplingParams (n=1), or a list of one per completion")
    return _base.build_requests(
        _vllm_prompt(prompt), plan_or_lengths, sampling_params, vllm_priorities(plan_or_lengths, base=base),
        single=lambda p: p is not None and not isinstance(p, (list, tuple)),
        n_of=lambda p: getattr(p, "n", 1),
    )


def generate_group_vllm(
    llm: Any, prompt: Any, plan_or_lengths: Any, sampling_params: Any, *, base: int = 0, **generate_kwargs: Any
) -> list[Any]:
    """Generate one group with ``llm.generate(prompts, sampling_params, priority=[...])`` and
    return the ``RequestOutput`` of each completion in completion-index order.

    ``llm`` is a ``vllm.LLM`` built with ``scheduling_policy="priority"`` (see :func:`vllm_setup`).
    """
    reqs = vllm_requests(prompt, plan_or_lengths, sampling_params, base=base)
    outputs = llm.generate(list(reqs.prompts), list(reqs.sampling_params), priority=list(reqs.priorities),
                           **generate_kwargs)
    return reqs.by_completion(outputs)


async def agenerate_group_vllm(
    engine: Any, prompt: Any, plan_or_lengths: Any, sampling_params: Any, *,
    request_id: str | None = None, base: int = 0,
) -> list[Any]:
    """The same on an ``AsyncLLM``: G concurrent ``engine.generate(prompt, params, request_id,
    priority=p)`` streams, submitted in the plan's order; returns each completion's final output
    in completion-index order. Request ids are ``f"{request_id}-{completion index}"``
    (``request_id`` must be unique among the engine's live requests; default: a random one)."""
    reqs = vllm_requests(prompt, plan_or_lengths, sampling_params, base=base)
    if request_id is None:
        request_id = f"lengthsched-{uuid.uuid4().hex[:12]}"
    elif not isinstance(request_id, str) or not request_id:
        raise InvalidArgument("request_id", request_id, "a non-empty string")

    async def one(i: int) -> Any:
        final = None
        async for out in engine.generate(reqs.prompts[i], reqs.sampling_params[i], f"{request_id}-{reqs.order[i]}",
                                         priority=reqs.priorities[i]):
            final = out
        return final

    return reqs.by_completion(await asyncio.gather(*(one(i) for i in range(len(reqs)))))


def vllm_setup(
    plan: Plan,
    memory: ModelMemory,
    *,
    gpu_memory_bytes: int | str,
    kv_budget_bytes: int | str | None = None,
    overhead_bytes: int | None = None,
    max_model_len: int | None = None,
    block_size: int = 16,
    pin_kv_cache: bool = False,
    priority_base: int = 0,
) -> EngineSetup:
    """vLLM engine arguments and request priorities that run ``plan`` in a memory budget.

    Args:
        plan: the group's :class:`~lengthsched.Plan`; the most completions it runs at once
            (:func:`plan_concurrency`: its ``slots`` in slots mode) becomes ``max_num_seqs``.
        memory: the model's :class:`~lengthsched.ModelMemory` (any block size; vLLM's block-16
            rounding and prompt sharing are applied here).
        gpu_memory_bytes: total memory of one GPU (bytes, or a string such as ``"80GiB"``).
        kv_budget_bytes: the KV pool (bytes: shared prompt + live sequences). Default: the
            plan's peak at its reserved lengths under block-16 rounding (:func:`plan_kv_bytes`)
            plus vLLM's null block (one block the pool never hands out).
        overhead_bytes: activations, CUDA graphs, CUDA context, fragmentation (bytes). Default:
            :func:`default_overhead_bytes` (the memory model's decode activations of ``slots``
            sequences + 2 GiB, an estimate).
        max_model_len: longest prompt + completion the engine accepts (tokens). Default: the
            plan's ``prompt_tokens + max_new_tokens``. vLLM refuses to start when its KV pool
            cannot hold one sequence of this length; so does this function.
        block_size: vLLM KV block size (tokens).
        pin_kv_cache: also pass ``kv_cache_memory_bytes`` (recent vLLM only) so the pool is
            exactly ``kv_budget_bytes`` whatever the profiling run measures.
        priority_base: added to every priority.

    ``gpu_memory_utilization = ceil4((W + KV pool + overhead) / gpu_memory_bytes)`` (rounded up
    to 4 decimals). Raises :class:`~lengthsched.BudgetTooSmall` when that exceeds the GPU.
    """
    _base.check_plan(plan)
    if max_model_len is not None:
        max_model_len = check_int("max_model_len", max_model_len, minimum=1)
    model_len = plan.prompt_tokens + plan.max_new_tokens if max_model_len is None else max_model_len

    def kwargs(mem: ModelMemory, kv: int, fraction: float, running: int) -> dict[str, Any]:
        need = mem.kv_bytes(model_len) + VLLM_NULL_BLOCKS * mem.kv_bytes(mem.block_size)
        if need > kv:
            raise BudgetTooSmall("kv_budget_bytes", kv,
                                 f"at least {need} bytes: vLLM's KV pool must hold one sequence of "
                                 f"max_model_len={model_len} tokens next to its null block")
        out = {"scheduling_policy": "priority", "gpu_memory_utilization": fraction, "max_num_seqs": running,
               "block_size": mem.block_size, "enable_prefix_caching": True, "max_model_len": model_len}
        return out | ({"kv_cache_memory_bytes": kv} if pin_kv_cache else {})

    return _base.engine_setup(plan, memory, "vllm", gpu_memory_bytes=gpu_memory_bytes, kv_budget_bytes=kv_budget_bytes,
                        overhead_bytes=overhead_bytes, priorities=vllm_priorities(plan, base=priority_base),
                        fraction_includes_overhead=True, engine_kwargs=kwargs, block_size=block_size,
                        reserved_blocks=VLLM_NULL_BLOCKS)
