"""Engine and framework adapters: run a lengthsched plan on vLLM or SGLang through request
priorities, and plug the planner into verl and TRL's vLLM generation.

Importing this package imports neither engine, framework nor torch: the adapters build the
arguments and call methods on objects the caller created. A group of G completions of one prompt
becomes G requests (n=1 each; the engine's prefix cache shares the prompt KV) whose priorities
follow the plan's admission order, so the engine starts them in the order the plan does; the
memory helpers turn a KV budget (bytes) and the plan's slot count into engine arguments. Every
claim about an engine is modelled on its code (vLLM 0.33.0, SGLang 0.5.23, TRL 1.16.0, verl 0.9.1,
AReaL 1.0.4; each module's docstring names the files).

- vLLM: :func:`vllm_priorities`, :func:`vllm_requests`, :func:`generate_group_vllm`,
  :func:`agenerate_group_vllm`, :func:`vllm_setup` (``kv_cache_memory_bytes``,
  ``gpu_memory_utilization``, ``max_num_seqs`` or ``max_num_active_seqs``,
  ``scheduling_policy="priority"``), :func:`vllm_block_size`, :func:`vllm_scheduling_policy`,
  :func:`vllm_serve_args`. Lower priority values run first; an FCFS engine ignores priorities
  (:class:`PriorityIgnoredWarning`).
- SGLang: :func:`sglang_priorities`, :func:`sglang_requests`, :func:`sglang_calls`,
  :func:`generate_group_sglang`, :func:`agenerate_group_sglang` (prefix warm-up first),
  :func:`sglang_setup` (``mem_fraction_static``, ``max_running_requests``,
  ``enable_priority_scheduling``, ``disable_priority_preemption``, ``retraction_policy``),
  :func:`sglang_page_size`.
- A rollout step on replicas: :func:`plan_rollout` -> :class:`RolloutPlan` (rows spread over the
  replicas as verl routes them, or whole groups placed by predicted work; longest predicted first
  per replica, the replica encoded in the priority); the parts of the simulator's ``steal`` for a
  framework that runs its own dispatch: :func:`spread_ways` and :func:`place_ways`
  (the placement), :func:`steal_requests` (what a drained replica takes) and :func:`move_requests`
  (which running requests move to a replica that sits idle); :class:`StealCoordinator` makes both
  decisions from snapshots a framework can take, as :class:`Move` s to abort and resubmit;
  :class:`ClientQueues` holds a client's requests per replica and sends them as each replica's window
  allows, a drained replica taking another's queued ones (steals without aborts: the slime integration).
- verl: :mod:`lengthsched.integrations.verl` (``LengthschedAgentLoopManager``,
  :class:`PlannedLoadBalancer`, :func:`verl_rollout_config`); stealing inside verl's rollout:
  :mod:`lengthsched.integrations.verl_stealing` (``LengthschedStealingAgentLoopManager``, the vLLM
  server's snapshots, :class:`StealDriver`); inside verl's fully asynchronous recipe:
  :mod:`lengthsched.integrations.verl_async` (``LengthschedFullyAsyncAgentLoopManager``: each group
  placed by predicted work, one driver stealing for the whole run; ``install``, ``setup_hook``); verl's default
  (v1) trainer: :mod:`lengthsched.integrations.verl_v1` (``LengthschedAgentLoopManagerTQ`` and, with stealing,
  ``LengthschedStealingAgentLoopManagerTQ``, which needs ``verl_stealing.setup_hook`` as Ray's
  ``worker_process_setup_hook``).
  Inside verl's own dynamic sampling (the v1 trainer's DAPO filter): :mod:`lengthsched.integrations.verl_selective`
  (``selective_replay_buffer``, the custom replay buffer verl loads by name: a refill by what the batch needs
  instead of two prompts per dropped group, and GRESO's skip on request;
  :class:`~lengthsched.integrations.verl_selective.PromptSelector`).
- slime: :mod:`lengthsched.integrations.slime` (its ``--rollout-function-path`` and
  ``--custom-generate-function-path`` hooks: every batch planned, each sample sent to its planned
  SGLang engine; modelled on slime at commit 624b824, tested against a fake slime).
- AReaL: :mod:`lengthsched.integrations.areal` (``install`` on a rank's ``RemoteSGLangEngine`` /
  ``RemotevLLMEngine``: each group placed on the servers by predicted work when its first request comes,
  :class:`~lengthsched.integrations.areal.GroupRouter`; modelled on AReaL 1.0.4, tested against its real
  ``RemoteInfEngine`` in CI); online sGPO there: :mod:`lengthsched.integrations.areal_sgpo` (``SGPOWorkflow``:
  each prompt's group of the size its rewards call for; ``normalize_per_trajectory``: AReaL's group
  normalisation over each group's own rows).
- TRL with vLLM: :func:`make_vllm_rollout_func`, :func:`trl_vllm_config`,
  :func:`trl_vllm_engine_args` (:mod:`lengthsched.integrations.trl_vllm`).
- Shared: :func:`request_order`, :func:`request_ranks`, :func:`engine_memory` (vLLM blocks /
  SGLang pages), :func:`plan_kv_bytes`, :func:`plan_concurrency`, :func:`default_overhead_bytes`,
  :class:`EngineSetup`, :class:`GroupRequests`.

These paths were tested with the engines faked at their API boundary and, for verl and AReaL, against
their real classes with the engine calls faked below them; none was run on a GPU here (see
docs/howto-vllm.md, howto-sglang.md, howto-verl.md, howto-trl.md, howto-slime.md, howto-areal.md).
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
from .rollout import (
    MOVE_CHUNK,
    ORDERS,
    PLACEMENTS,
    STEAL_SHARE,
    ClientQueues,
    RolloutPlan,
    decode_replica,
    move_requests,
    place_groups,
    place_ways,
    plan_rollout,
    spread_ways,
    steal_requests,
)
from .sglang_adapter import (
    SGLANG_RETRACTION_POLICIES,
    agenerate_group_sglang,
    generate_group_sglang,
    sglang_calls,
    sglang_page_size,
    sglang_priorities,
    sglang_requests,
    sglang_setup,
)
from .stealing import Move, StealCoordinator
from .trl_vllm import make_vllm_rollout_func, trl_vllm_config, trl_vllm_engine_args
from .verl import PlannedLoadBalancer, verl_rollout_config
from .verl_stealing import StealDriver
from .vllm_adapter import (
    VLLM_CONCURRENCY_ARGS,
    VLLM_KV_POOLS,
    VLLM_NULL_BLOCKS,
    PriorityIgnoredWarning,
    agenerate_group_vllm,
    generate_group_vllm,
    vllm_block_size,
    vllm_priorities,
    vllm_requests,
    vllm_scheduling_policy,
    vllm_serve_args,
    vllm_setup,
)

__all__ = [
    "ENGINE_BLOCK_SIZES",
    "ENGINE_FIXED_OVERHEAD_BYTES",
    "SGLANG_RETRACTION_POLICIES",
    "VLLM_CONCURRENCY_ARGS",
    "VLLM_KV_POOLS",
    "VLLM_NULL_BLOCKS",
    "EngineSetup",
    "GroupRequests",
    "PlannedLoadBalancer",
    "PriorityIgnoredWarning",
    "RolloutPlan",
    "agenerate_group_sglang",
    "agenerate_group_vllm",
    "decode_replica",
    "default_overhead_bytes",
    "engine_memory",
    "generate_group_sglang",
    "generate_group_vllm",
    "make_vllm_rollout_func",
    "place_groups",
    "place_ways",
    "spread_ways",
    "steal_requests",
    "STEAL_SHARE",
    "move_requests",
    "MOVE_CHUNK",
    "ClientQueues",
    "Move",
    "StealCoordinator",
    "StealDriver",
    "PLACEMENTS",
    "ORDERS",
    "plan_concurrency",
    "plan_kv_bytes",
    "plan_rollout",
    "request_order",
    "request_ranks",
    "sglang_calls",
    "sglang_page_size",
    "sglang_priorities",
    "sglang_requests",
    "sglang_setup",
    "trl_vllm_config",
    "trl_vllm_engine_args",
    "verl_rollout_config",
    "vllm_block_size",
    "vllm_priorities",
    "vllm_requests",
    "vllm_scheduling_policy",
    "vllm_serve_args",
    "vllm_setup",
]
