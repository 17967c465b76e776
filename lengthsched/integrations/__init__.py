"""Engine adapters: run a lengthsched plan on vLLM or SGLang through request priorities.

Importing this package imports neither engine (nor torch): the adapters build the arguments and
call methods on engine objects the caller created. A group of G completions of one prompt
becomes G requests (n=1 each; the engine's prefix cache shares the prompt KV) whose priorities
follow the plan's admission order, so the engine starts them in the order the plan does; the
memory helpers turn a KV budget (bytes) and the plan's slot count into engine arguments.

- vLLM: :func:`vllm_priorities`, :func:`vllm_requests`, :func:`generate_group_vllm`,
  :func:`agenerate_group_vllm`, :func:`vllm_setup` (``gpu_memory_utilization``,
  ``max_num_seqs``, ``scheduling_policy="priority"``). Lower priority values run first.
- SGLang: :func:`sglang_priorities`, :func:`sglang_requests`, :func:`sglang_calls`,
  :func:`generate_group_sglang`, :func:`agenerate_group_sglang`, :func:`sglang_setup`
  (``mem_fraction_static``, ``max_running_requests``, ``enable_priority_scheduling``).
- Shared: :func:`request_order`, :func:`request_ranks`, :func:`engine_memory` (vLLM block-16 /
  SGLang token-granular KV), :func:`plan_kv_bytes`, :func:`plan_concurrency`,
  :func:`default_overhead_bytes`, :class:`EngineSetup`, :class:`GroupRequests`.

These paths were tested against the engines' documented argument shapes with fake engine
objects, not against a real engine (see docs/howto-vllm.md and docs/howto-sglang.md).
"""

from .base import (
    ENGINE_BLOCK_SIZES,
    ENGINE_FIXED_OVERHEAD_BYTES,
    EngineSetup,
    GroupRequests,
    default_overhead_bytes,
    engine_memory,
    plan_concurrency,
    plan_kv_bytes,
    request_order,
    request_ranks,
)
from .sglang_adapter import (
    SGLANG_NO_PRIORITY_PREEMPTION,
    agenerate_group_sglang,
    generate_group_sglang,
    sglang_calls,
    sglang_priorities,
    sglang_requests,
    sglang_setup,
)
from .vllm_adapter import (
    VLLM_NULL_BLOCKS,
    agenerate_group_vllm,
    generate_group_vllm,
    vllm_priorities,
    vllm_requests,
    vllm_setup,
)

__all__ = [
    "ENGINE_BLOCK_SIZES",
    "ENGINE_FIXED_OVERHEAD_BYTES",
    "SGLANG_NO_PRIORITY_PREEMPTION",
    "VLLM_NULL_BLOCKS",
    "EngineSetup",
    "GroupRequests",
    "agenerate_group_sglang",
    "agenerate_group_vllm",
    "default_overhead_bytes",
    "engine_memory",
    "generate_group_sglang",
    "generate_group_vllm",
    "plan_concurrency",
    "plan_kv_bytes",
    "request_order",
    "request_ranks",
    "sglang_calls",
    "sglang_priorities",
    "sglang_requests",
    "sglang_setup",
    "vllm_priorities",
    "vllm_requests",
    "vllm_setup",
]
