"""vLLM: a lengthsched plan as request priorities, and a budget as engine arguments.

Modelled on vLLM 0.33.0's own code (the V1 engine; the wheel's sources were read, not run: no GPU
here). Files are under ``vllm/``:

- ``scheduling_policy="priority"`` (``config/scheduler.py``: ``SchedulerConfig.policy``, default
  ``"fcfs"``) orders the waiting queue by ``(priority, arrival_time)``, the LOWER value first
  (``v1/core/sched/request_queue.py``, ``PriorityRequestQueue``). Under ``"fcfs"`` the
  ``FCFSRequestQueue`` is a deque in arrival order and a request's priority is silently ignored:
  V1 does not reject a non-zero priority (that check was V0's). This adapter warns
  (:class:`PriorityIgnoredWarning`) when it passes priorities to an engine whose policy it can read
  and is not ``"priority"``. Requests are always submitted in the plan's order, so within one
  call an FCFS engine still starts them in that order; what FCFS loses is the order against
  requests of other calls and after a preemption.
- When a running request cannot get a KV block, the scheduler preempts ``max(running,
  key=(priority, arrival_time))`` under the priority policy and ``running[-1]`` (the latest
  admitted) under FCFS (``v1/core/sched/scheduler.py``, ``schedule``); the victim goes back to the
  waiting queue (``_preempt_request``: ``waiting.prepend_request``, which the priority queue turns
  into a heap push) and is recomputed later.
- ``LLM.generate(prompts, sampling_params=None, *, use_tqdm=True, lora_request=None,
  priority=None, tokenization_kwargs=None, mm_processor_kwargs=None)`` takes one priority per prompt
  (``entrypoints/llm.py``); ``AsyncLLM.generate(prompt, sampling_params, request_id, *, ...,
  priority=0, ...)`` one per request (``v1/engine/async_llm.py``).
- ``SamplingParams(n=G)`` fans out G children with ONE priority, so a group is sent as G requests
  of the same prompt with n=1. G copies of a prompt share its KV through the prefix cache even
  when they are scheduled in the same step: ``KVCacheManager.allocate_slots`` registers the full
  blocks of the tokens it schedules (``cache_blocks``) before the scheduler looks at the next
  waiting request, whose ``get_computed_blocks`` then hits them (``v1/core/kv_cache_manager.py``).
  Only whole blocks are shared, which is what :func:`~lengthsched.integrations.engine_memory`
  models. No warm-up request is needed.
- Memory (``config/cache.py``, ``v1/worker/gpu_worker.py``, ``v1/worker/utils.py``):
  ``kv_cache_memory_bytes`` fixes the KV pool of each GPU in bytes (it "ignores
  gpu_memory_utilization" for the pool: ``determine_available_memory`` returns it after the
  profiling run); ``gpu_memory_utilization`` is the fraction of the GPU the instance may use, and
  at start-up the engine checks that this much is free (``request_memory``), so both are passed.
- ``block_size`` left unset lets the attention backends pick a size they all support
  (``platforms/interface.py``, ``update_block_size_for_backend``: only when the user did not set
  it); the engine core reports the final size back to the front end (``v1/engine/core_client.py``
  syncs ``cache_config.block_size``), where :func:`vllm_block_size` reads it. This adapter never
  sets it.
- ``max_num_seqs`` caps the running requests and sizes the model runner (per-request buffers, CUDA
  graph capture); ``max_num_active_seqs`` (<= ``max_num_seqs``) caps only admission into RUNNING
  (``v1/core/sched/scheduler.py``: ``max_num_active_reqs``) and keeps the runner's size.
"""

from __future__ import annotations

import asyncio
import uuid
import warnings
from collections.abc import Mapping
from typing import Any

from ..errors import BudgetTooSmall, InvalidArgument, check_int
from ..memory import ModelMemory
from ..plan import Plan
from . import base as _base
from .base import EngineSetup, GroupRequests

__all__ = [
    "VLLM_CONCURRENCY_ARGS",
    "VLLM_KV_POOLS",
    "VLLM_NULL_BLOCKS",
    "PriorityIgnoredWarning",
    "agenerate_group_vllm",
    "generate_group_vllm",
    "vllm_block_size",
    "vllm_priorities",
    "vllm_requests",
    "vllm_scheduling_policy",
    "vllm_serve_args",
    "vllm_setup",
    "warn_unless_priority_policy",
]

# Blocks vLLM's block pool keeps out of use (the null block: v1/core/block_pool.py), counted in the pool.
VLLM_NULL_BLOCKS = 1
# How vllm_setup sizes the KV pool: exact bytes (kv_cache_memory_bytes) or a GPU fraction only.
VLLM_KV_POOLS = ("bytes", "utilization")
# Which engine argument carries the plan's concurrency.
VLLM_CONCURRENCY_ARGS = ("max_num_seqs", "max_num_active_seqs")


class PriorityIgnoredWarning(UserWarning):
    """Priorities were passed to an engine that does not order requests by them."""


def _vllm_config(engine: Any) -> Any:
    """The ``VllmConfig`` of an ``LLM`` (``llm.llm_engine.vllm_config``), an ``AsyncLLM`` or an
    ``LLMEngine`` (``.vllm_config``), or None."""
    inner = getattr(engine, "llm_engine", engine)
    return getattr(inner, "vllm_config", None)


def vllm_scheduling_policy(engine: Any) -> str | None:
    """The engine's ``scheduler_config.policy`` (``"fcfs"`` or ``"priority"``), or None when it
    cannot be read (vLLM 0.33.0: ``vllm_config.scheduler_config.policy``)."""
    policy = getattr(getattr(_vllm_config(engine), "scheduler_config", None), "policy", None)
    if policy is None:
        return None
    return str(getattr(policy, "value", policy))


def vllm_block_size(engine: Any) -> int | None:
    """The KV block size the running engine uses (tokens), or None when it cannot be read.

    vLLM 0.33.0 resolves it in the engine core (the attention backends' preferred size unless the
    user set one) and syncs it back into the front end's ``vllm_config.cache_config.block_size``
    (``v1/engine/core_client.py``). Pass it as ``block_size`` to :func:`vllm_setup` and
    :func:`~lengthsched.integrations.engine_memory` when it is not 16.
    """
    size = getattr(getattr(_vllm_config(engine), "cache_config", None), "block_size", None)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        return None
    return size


def warn_unless_priority_policy(engine: Any, *, stacklevel: int = 3) -> bool:
    """Warn (:class:`PriorityIgnoredWarning`) when ``engine`` reports a scheduling policy other than
    ``"priority"``: vLLM V1 then ignores request priorities without an error. Returns True when a
    warning was issued; an engine whose policy cannot be read gets none."""
    policy = vllm_scheduling_policy(engine)
    if policy is None or policy == "priority":
        return False
    warnings.warn(
        f"the vLLM engine runs scheduling_policy={policy!r}: it ignores request priorities (vLLM V1 does not "
        "reject them). Requests are still submitted in the plan's order, so within this call FCFS starts them "
        "in that order, but not against other calls or after a preemption. Start the engine with "
        "scheduling_policy='priority' (vllm_setup does).",
        PriorityIgnoredWarning, stacklevel=stacklevel,
    )
    return True


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

    ``llm`` is a ``vllm.LLM`` built with ``scheduling_policy="priority"`` (see :func:`vllm_setup`);
    with another policy a :class:`PriorityIgnoredWarning` is issued and the requests still go in
    the plan's order.
    """
    reqs = vllm_requests(prompt, plan_or_lengths, sampling_params, base=base)
    warn_unless_priority_policy(llm)
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
    (``request_id`` must be unique among the engine's live requests; default: a random one).
    Warns as :func:`generate_group_vllm` does."""
    reqs = vllm_requests(prompt, plan_or_lengths, sampling_params, base=base)
    if request_id is None:
        request_id = f"lengthsched-{uuid.uuid4().hex[:12]}"
    elif not isinstance(request_id, str) or not request_id:
        raise InvalidArgument("request_id", request_id, "a non-empty string")
    warn_unless_priority_policy(engine)

    async def one(i: int) -> Any:
        final = None
        async for out in engine.generate(reqs.prompts[i], reqs.sampling_params[i], f"{request_id}-{reqs.order[i]}",
                                         priority=reqs.priorities[i]):
            final = out
        return final

    return reqs.by_completion(await asyncio.gather(*(one(i) for i in range(len(reqs)))))


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise InvalidArgument(name, value, "one of " + ", ".join(choices))
    return value


def vllm_setup(
    plan: Plan,
    memory: ModelMemory,
    *,
    gpu_memory_bytes: int | str,
    kv_budget_bytes: int | str | None = None,
    overhead_bytes: int | None = None,
    max_model_len: int | None = None,
    block_size: int | None = None,
    kv_pool: str = "bytes",
    concurrency_arg: str = "max_num_seqs",
    max_num_seqs: int | None = None,
    tensor_parallel_size: int = 1,
    concurrency: int | None = None,
    priority_base: int = 0,
) -> EngineSetup:
    """vLLM engine arguments and request priorities that run ``plan`` in a memory budget.

    Args:
        plan: the group's :class:`~lengthsched.Plan`; the most completions it runs at once
            (:func:`plan_concurrency`: its ``slots`` in slots mode) caps the running requests.
        memory: the model's :class:`~lengthsched.ModelMemory` (any block size; vLLM's block
            rounding and prompt sharing are applied here).
        gpu_memory_bytes: total memory of one GPU (bytes, or a string such as ``"80GiB"``).
        kv_budget_bytes: the KV pool of the whole model (bytes: shared prompt + live sequences).
            Default: the plan's peak at its reserved lengths under block rounding
            (:func:`plan_kv_bytes`) plus vLLM's null block (one block the pool never hands out).
        overhead_bytes: activations, CUDA graphs, CUDA context, fragmentation on each GPU (bytes).
            Default: :func:`default_overhead_bytes` (the memory model's decode activations of the
            running batch + 2 GiB, an estimate).
        max_model_len: longest prompt + completion the engine accepts (tokens). Default: the
            plan's ``prompt_tokens + max_new_tokens``. vLLM refuses to start when its KV pool
            cannot hold one sequence of this length; so does this function.
        block_size: the engine's KV block size (tokens) for the arithmetic; NOT passed to the
            engine (setting it would override the attention backend's choice). Default 16;
            read the running engine's with :func:`vllm_block_size`.
        kv_pool: ``"bytes"`` (default) passes ``kv_cache_memory_bytes`` = the pool per GPU, so the
            pool is exactly the plan's bytes whatever the profiling run measures, plus
            ``gpu_memory_utilization`` for the start-up free-memory check; ``"utilization"``
            passes only ``gpu_memory_utilization`` and vLLM sizes the pool from what it measures
            (for releases without ``kv_cache_memory_bytes``).
        concurrency_arg: ``"max_num_seqs"`` (default) or ``"max_num_active_seqs"`` (vLLM 0.33:
            caps admission only and keeps the model runner and CUDA graphs sized for
            ``max_num_seqs``; better when the engine also serves more than this plan, or when a
            framework sets ``max_num_seqs`` itself).
        max_num_seqs: with ``concurrency_arg="max_num_active_seqs"``, the ``max_num_seqs`` to pass
            (>= the plan's concurrency; vLLM rejects ``max_num_active_seqs > max_num_seqs``).
            Default: not passed (vLLM's default applies).
        tensor_parallel_size: GPUs the engine shards the model over; weights and KV pool are
            split evenly (``tensor_parallel_size`` is passed too).
        concurrency: the running cap to pass (default :func:`plan_concurrency`; e.g. several
            groups' worth when the engine runs several planned groups at once).
        priority_base: added to every priority.

    ``gpu_memory_utilization = ceil4(((W + KV pool) / tp + overhead) / gpu_memory_bytes)`` (rounded
    up to 4 decimals). Raises :class:`~lengthsched.BudgetTooSmall` when that exceeds the GPU.
    """
    _base.check_plan(plan)
    kv_pool = _choice("kv_pool", kv_pool, VLLM_KV_POOLS)
    concurrency_arg = _choice("concurrency_arg", concurrency_arg, VLLM_CONCURRENCY_ARGS)
    if max_model_len is not None:
        max_model_len = check_int("max_model_len", max_model_len, minimum=1)
    if max_num_seqs is not None:
        max_num_seqs = check_int("max_num_seqs", max_num_seqs, minimum=1)
        if concurrency_arg != "max_num_active_seqs":
            raise InvalidArgument("max_num_seqs", max_num_seqs,
                                  "None unless concurrency_arg='max_num_active_seqs' (else the plan sets it)")
    tp = check_int("tensor_parallel_size", tensor_parallel_size, minimum=1)
    model_len = plan.prompt_tokens + plan.max_new_tokens if max_model_len is None else max_model_len

    def kwargs(mem: ModelMemory, kv: int, fraction: float, running: int) -> dict[str, Any]:
        need = mem.kv_bytes(model_len) + VLLM_NULL_BLOCKS * mem.kv_bytes(mem.block_size)
        if need > kv:
            raise BudgetTooSmall("kv_budget_bytes", kv,
                                 f"at least {need} bytes: vLLM's KV pool must hold one sequence of "
                                 f"max_model_len={model_len} tokens next to its null block")
        if max_num_seqs is not None and max_num_seqs < running:
            raise InvalidArgument("max_num_seqs", max_num_seqs,
                                  f"at least the plan's concurrency {running} (max_num_active_seqs <= max_num_seqs)")
        out: dict[str, Any] = {"scheduling_policy": "priority", "gpu_memory_utilization": fraction,
                               concurrency_arg: running, "enable_prefix_caching": True, "max_model_len": model_len}
        if max_num_seqs is not None:
            out["max_num_seqs"] = max_num_seqs
        if kv_pool == "bytes":
            out["kv_cache_memory_bytes"] = -(-kv // tp)
        if tp > 1:
            out["tensor_parallel_size"] = tp
        return out

    return _base.engine_setup(plan, memory, "vllm", gpu_memory_bytes=gpu_memory_bytes, kv_budget_bytes=kv_budget_bytes,
                              overhead_bytes=overhead_bytes, priorities=vllm_priorities(plan, base=priority_base),
                              fraction_includes_overhead=True, engine_kwargs=kwargs, block_size=block_size,
                              reserved_blocks=VLLM_NULL_BLOCKS, tensor_parallel_size=tp, concurrency=concurrency)


def vllm_serve_args(engine_kwargs: Mapping[str, Any]) -> list[str]:
    """``engine_kwargs`` (e.g. :attr:`EngineSetup.engine_kwargs`) as ``vllm serve`` flags:
    ``scheduling_policy="priority"`` -> ``--scheduling-policy priority``; ``True`` -> a bare flag,
    ``False`` -> ``--no-...`` (vLLM's boolean flags take both forms)."""
    if not isinstance(engine_kwargs, Mapping):
        raise InvalidArgument("engine_kwargs", type(engine_kwargs).__name__, "a mapping of vLLM engine arguments")
    args: list[str] = []
    for key, value in engine_kwargs.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False:
            args.append("--no-" + flag[2:])
        elif value is not None:
            args += [flag, str(value)]
    return args
