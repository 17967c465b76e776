"""What the vLLM and SGLang adapters share: request order and priorities, the group's requests,
the engine's view of memory, and the memory fraction arithmetic.

Units: lengths and token counts in tokens, memory in bytes. Nothing here imports an engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import BudgetTooSmall, InvalidArgument, as_lengths, check_int
from ..memory import FreeKV, ModelMemory, PromptKV, parse_bytes
from ..plan import Plan, _peak_sum
from ..schedule import Schedule

__all__ = [
    "ENGINE_BLOCK_SIZES",
    "ENGINE_FIXED_OVERHEAD_BYTES",
    "EngineSetup",
    "GroupRequests",
    "default_overhead_bytes",
    "engine_memory",
    "plan_concurrency",
    "plan_kv_bytes",
    "request_order",
    "request_ranks",
]

# Tokens per KV block the memory arithmetic assumes when the engine's own is not known: vLLM's
# CacheConfig.DEFAULT_BLOCK_SIZE (vllm/config/cache.py, 0.33.0; an attention backend may prefer
# another, see vllm/platforms/interface.py update_block_size_for_backend) and SGLang's page size 1
# (server_args page_size None -> 1 for the default backends, 0.5.23; some backends rewrite it).
# Read the engine's real size back (vllm_block_size, sglang_page_size) and pass it as block_size.
ENGINE_BLOCK_SIZES = {"vllm": 16, "sglang": 1}

# Memory an engine uses beyond weights, KV and the decode activations of its batch (bytes): CUDA
# context, CUDA graphs, the start-up profiling run's prefill activations, allocator fragmentation.
# An estimate that was NOT measured here (no GPU); read the engine's start-up log on your GPU and
# pass ``overhead_bytes`` instead.
ENGINE_FIXED_OVERHEAD_BYTES = 2 * 2**30

def request_order(plan_or_lengths: Any) -> tuple[int, ...]:
    """Completion indices in the order an engine should start them.

    A :class:`~lengthsched.Plan`: its ``admission_order`` (the refill rule's order under the
    plan's units). Predicted lengths (tokens): shortest first, ties by completion index.
    """
    if isinstance(plan_or_lengths, Plan):
        return tuple(plan_or_lengths.admission_order)
    lengths = as_lengths("plan_or_lengths", plan_or_lengths, minimum=1)
    return tuple(int(j) for j in np.argsort(lengths, kind="stable"))


def request_ranks(plan_or_lengths: Any) -> tuple[int, ...]:
    """Per completion (index order), its rank in :func:`request_order` (0 starts first)."""
    if isinstance(plan_or_lengths, Plan):
        return plan_or_lengths.priorities()
    order = request_order(plan_or_lengths)
    ranks = [0] * len(order)
    for rank, job in enumerate(order):
        ranks[job] = rank
    return tuple(ranks)


def ranked_priorities(plan_or_lengths: Any, *, low_values_first: bool, base: int) -> tuple[int, ...]:
    """Per completion, ``base + rank`` (engines that run low values first) or ``base + G - 1 - rank``."""
    base = check_int("base", base)
    ranks = request_ranks(plan_or_lengths)
    top = len(ranks) - 1
    return tuple(base + (r if low_values_first else top - r) for r in ranks)


@dataclass(frozen=True)
class GroupRequests:
    """The G requests of one group (n=1 each), listed in submission order (the plan's order).

    ``order[i]`` is the completion index of request i; ``priorities``, ``prompts`` and
    ``sampling_params`` are per request, in the same order.
    """

    order: tuple[int, ...]
    priorities: tuple[int, ...]
    prompts: tuple[Any, ...]
    sampling_params: tuple[Any, ...]

    def __len__(self) -> int:
        return len(self.order)

    def by_completion(self, outputs: Sequence[Any]) -> list[Any]:
        """Engine outputs given in submission order, put back in completion-index order."""
        outputs = list(outputs)
        if len(outputs) != len(self.order):
            raise InvalidArgument("outputs", outputs, f"{len(self.order)} outputs, one per request")
        back: list[Any] = [None] * len(outputs)
        for job, out in zip(self.order, outputs):
            back[job] = out
        return back


def build_requests(
    prompt: Any,
    plan_or_lengths: Any,
    sampling_params: Any,
    priorities: Sequence[int],
    *,
    single: Callable[[Any], bool],
    n_of: Callable[[Any], Any],
) -> GroupRequests:
    """One request per completion. ``sampling_params`` is one object for all, or a list/tuple of
    one per completion (index order), e.g. with per-completion seeds; ``single`` says which, and
    ``n_of`` reads the samples-per-request count, which must be 1."""
    order = request_order(plan_or_lengths)
    n = len(order)
    if single(sampling_params):
        params = [sampling_params] * n
    elif isinstance(sampling_params, (list, tuple)) and len(sampling_params) == n and all(map(single, sampling_params)):
        params = list(sampling_params)
    else:
        raise InvalidArgument("sampling_params", sampling_params,
                              f"one sampling-parameters object, or a list of {n}, one per completion")
    for p in params:
        count = n_of(p)
        if count != 1:
            raise InvalidArgument("sampling_params", count,
                                  "n=1: each completion is its own request (the prompt KV is shared by prefix caching)")
    return GroupRequests(
        order=order,
        priorities=tuple(priorities[j] for j in order),
        prompts=(prompt,) * n,
        sampling_params=tuple(params[j] for j in order),
    )


def token_ids(value: Any) -> list[int] | None:
    """``value`` as a list of token ids if it is a non-empty sequence of ints >= 0, else None."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (list, tuple, np.ndarray)):
        return None
    try:
        return [int(t) for t in as_lengths("prompt", value, minimum=0)]
    except InvalidArgument:
        return None


# ----------------------------------------------------------------------------- memory
def engine_memory(memory: ModelMemory, engine: str, *, block_size: int | None = None) -> ModelMemory:
    """``memory`` as ``engine`` holds KV: blocks of ``block_size`` tokens (default
    ``ENGINE_BLOCK_SIZES[engine]``: vLLM 16, SGLang 1; pass the size the engine reports), the prompt
    KV shared by the group (vLLM prefix caching shares whole blocks only, SGLang's radix cache whole
    pages), KV freed when a sequence finishes."""
    if not isinstance(memory, ModelMemory):
        raise InvalidArgument("memory", memory, "a lengthsched.ModelMemory")
    if engine not in ENGINE_BLOCK_SIZES:
        raise InvalidArgument("engine", engine, "one of " + ", ".join(sorted(ENGINE_BLOCK_SIZES)))
    size = ENGINE_BLOCK_SIZES[engine] if block_size is None else check_int("block_size", block_size, minimum=1)
    return memory.replace(block_size=size, prompt_kv=PromptKV.SHARED, free_kv=FreeKV.FINISH)


def check_plan(plan: Any) -> Plan:
    """``plan`` if it is a :class:`~lengthsched.Plan`, else :class:`InvalidArgument` naming ``plan``."""
    if not isinstance(plan, Plan):
        raise InvalidArgument("plan", plan, "a lengthsched.Plan (from plan_group)")
    return plan


def plan_kv_bytes(plan: Plan, memory: ModelMemory) -> int:
    """KV bytes the plan holds at its peak under ``memory``: the shared prompt plus every live
    completion at its reserved length (at least its predicted one), block rounded.

    An engine that allocates KV on demand (vLLM, SGLang) and admits in the plan's order never
    needs more while every completion stays within its reservation.
    """
    check_plan(plan)
    if not isinstance(memory, ModelMemory):
        raise InvalidArgument("memory", memory, "a lengthsched.ModelMemory")
    held = np.maximum(np.asarray(plan.reserve_lengths), np.asarray(plan.lengths))
    sizes = np.asarray(memory.sequence_kv_bytes(held, plan.prompt_tokens), dtype=np.int64)
    return memory.prompt_kv_bytes(plan.prompt_tokens) + _peak_sum(_expected_schedule(plan), sizes)


def plan_concurrency(plan: Plan) -> int:
    """Most completions the plan runs in one step when its predictions are right: ``slots`` in
    slots mode (for G >= slots); in budget mode what the reservations let in at the peak. The
    engine's cap on running requests (``max_num_seqs``, ``max_running_requests``)."""
    return _expected_schedule(check_plan(plan)).max_live


def _expected_schedule(plan: Plan) -> Schedule:
    """The plan run on its own predicted lengths, from the starts it records."""
    lengths = np.asarray(plan.lengths, dtype=np.int64)
    return Schedule(lengths, np.asarray(plan.expected_starts, dtype=np.int64),
                    np.zeros(len(lengths), dtype=np.int64), np.asarray(plan.admission_order, dtype=np.int64))


def default_overhead_bytes(memory: ModelMemory, slots: int) -> int:
    """Non-KV, non-weight memory of an engine decoding ``slots`` sequences (bytes): the decode
    activations of the memory model (fp32 logits and the widest layer, per sequence) plus
    :data:`ENGINE_FIXED_OVERHEAD_BYTES`. An estimate; measure it and pass ``overhead_bytes``."""
    return memory.activation_bytes(check_int("slots", slots, minimum=1)) + ENGINE_FIXED_OVERHEAD_BYTES


def fraction_up(numerator: int, denominator: int, digits: int = 4) -> float:
    """numerator / denominator rounded up to ``digits`` decimals (an engine given it gets at least that)."""
    scale = 10**digits
    return -(-numerator * scale // denominator) / scale


@dataclass(frozen=True)
class EngineSetup:
    """Engine arguments and request priorities for running one planned group on an engine.

    ``engine_kwargs`` go to ``vllm.LLM(model, **engine_kwargs)`` or
    ``sglang.Engine(model_path=..., **engine_kwargs)``. ``priorities[j]`` is the priority of
    completion j in the engine's own convention; ``order`` lists completions in submission order.
    Memory (bytes): ``gpu_memory_bytes`` of one GPU, ``weights_bytes`` W and ``kv_bytes`` the KV
    pool of the whole model (split over ``tensor_parallel_size`` GPUs: :attr:`kv_bytes_per_gpu`),
    ``overhead_bytes`` activations, CUDA graphs and the rest on each GPU; ``fraction`` is the
    per-GPU memory fraction passed to the engine.
    """

    engine: str
    engine_kwargs: dict[str, Any]
    priorities: tuple[int, ...]
    order: tuple[int, ...]
    gpu_memory_bytes: int
    weights_bytes: int
    kv_bytes: int
    kv_tokens: int
    overhead_bytes: int
    fraction: float
    memory: ModelMemory = field(repr=False)
    tensor_parallel_size: int = 1

    @property
    def kv_bytes_per_gpu(self) -> int:
        """The KV pool on each GPU (bytes): ``kv_bytes`` split evenly over the tensor-parallel GPUs,
        rounded up (KV heads are sharded across them; a model with fewer KV heads than GPUs
        replicates heads and needs more than this)."""
        return -(-self.kv_bytes // self.tensor_parallel_size)

    @property
    def weights_bytes_per_gpu(self) -> int:
        """The weights on each GPU (bytes), split evenly over the tensor-parallel GPUs, rounded up."""
        return -(-self.weights_bytes // self.tensor_parallel_size)


def engine_setup(
    plan: Plan,
    memory: ModelMemory,
    engine: str,
    *,
    gpu_memory_bytes: Any,
    kv_budget_bytes: Any,
    overhead_bytes: Any,
    priorities: Sequence[int],
    fraction_includes_overhead: bool,
    engine_kwargs: Callable[[ModelMemory, int, float, int], dict[str, Any]],
    block_size: int | None = None,
    reserved_blocks: int = 0,
    tensor_parallel_size: int = 1,
    concurrency: int | None = None,
) -> EngineSetup:
    """The :class:`EngineSetup` of ``plan`` on ``engine``, validated.

    The KV pool is ``kv_budget_bytes`` or, by default, :func:`plan_kv_bytes` plus
    ``reserved_blocks`` blocks the engine keeps out of use (whole model). Per GPU, with W and the
    pool split over ``tensor_parallel_size`` GPUs, the memory fraction is (W + KV pool) / tp
    [+ overhead], over the GPU's memory, rounded up to 4 decimals; ``engine_kwargs(memory, kv
    pool, fraction, running cap)`` builds the engine's arguments (and may raise); the running cap
    is ``concurrency`` or :func:`plan_concurrency`. Raises :class:`~lengthsched.BudgetTooSmall` when a GPU's share of
    W + KV pool plus the overhead exceeds its memory.
    """
    check_plan(plan)
    mem = engine_memory(memory, engine, block_size=block_size)
    gpu = parse_bytes(gpu_memory_bytes, "gpu_memory_bytes")
    if kv_budget_bytes is None:
        kv = plan_kv_bytes(plan, mem) + reserved_blocks * mem.kv_bytes(mem.block_size)
    else:
        kv = parse_bytes(kv_budget_bytes, "kv_budget_bytes")
    running = plan_concurrency(plan) if concurrency is None else check_int("concurrency", concurrency, minimum=1)
    tp = check_int("tensor_parallel_size", tensor_parallel_size, minimum=1)
    if overhead_bytes is None:
        overhead = default_overhead_bytes(mem, running)
    else:
        overhead = check_int("overhead_bytes", overhead_bytes, minimum=0)
    weights, pool = -(-mem.weights_bytes // tp), -(-kv // tp)
    need = weights + pool + overhead
    if need > gpu:
        per_gpu = f" per GPU of {tp}" if tp > 1 else ""
        raise BudgetTooSmall(
            "gpu_memory_bytes", gpu,
            f"at least {need} bytes = weights {weights} + KV pool {pool} + overhead {overhead}{per_gpu} "
            f"({mem.name}, {engine})",
        )
    fraction = fraction_up(need if fraction_includes_overhead else need - overhead, gpu)
    return EngineSetup(
        engine=engine, engine_kwargs=engine_kwargs(mem, kv, fraction, running), priorities=tuple(priorities),
        order=request_order(plan), gpu_memory_bytes=gpu, weights_bytes=mem.weights_bytes, kv_bytes=kv,
        kv_tokens=kv // mem.kv_bytes_per_token, overhead_bytes=overhead, fraction=fraction, memory=mem,
        tensor_parallel_size=tp,
    )
