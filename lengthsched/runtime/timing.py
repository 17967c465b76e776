"""Seconds for the runtime: the default step-cost model, the prompts' prefill, and a lower bound.

The engine records what every decode step does (:class:`~lengthsched.runtime.engine.StepLog`); a
:class:`~lengthsched.cost.StepCost` prices it. What the engine does not see is priced here:

- the first prefill of every prompt, once per prompt, in steps of at most ``prefill_chunk``
  tokens before the first decode step (:func:`prompt_prefill_log`);
- the lower bound in seconds (:func:`lower_bound_seconds`): whatever the schedule, every step
  costs at least the overhead and a step reads the weights, so the total is at least
  ``S * overhead + max(total bytes / bandwidth, total FLOPs / compute)`` at the model's
  efficiencies (the sum of maxima is at least the maximum of sums), where ``S`` is the lower
  bound on decode steps and the totals count only the work every schedule must do: each
  completion of length l attends ``context + a - 1`` KV tokens when it produces its a-th token
  (a = 1..l), and every prompt is prefilled once. Recomputation, padding and the steps a policy wastes only add to it.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..memory import held_token_steps
from .engine import StepLog

__all__ = ["DEFAULT_COST", "DEFAULT_PREFILL_CHUNK", "default_cost", "prompt_prefill_log", "prompt_prefill_seconds",
           "lower_bound_seconds"]

#: The model and GPU preset every comparison is priced on unless told otherwise: the main job's
#: model, Qwen3-1.7B in bf16, on one H100 SXM (``lengthsched.cost``'s unfitted preset).
DEFAULT_COST = ("qwen3-1.7b", "h100")

#: Most tokens prefilled in one step: vLLM's ``max_num_batched_tokens`` as an RL rollout server
#: runs it (vLLM 0.x ``EngineArgs.get_batch_defaults``: 8192 for the OpenAI-compatible server on a
#: >= 70 GiB GPU, the mode verl and OpenRLHF drive; 16384 for the offline ``LLM`` class; verl's
#: rollout config also defaults to 8192).
DEFAULT_PREFILL_CHUNK = 8192


@lru_cache(maxsize=8)
def default_cost(model: str = DEFAULT_COST[0], gpu: str = DEFAULT_COST[1]):
    """The unfitted :class:`~lengthsched.cost.StepCost` of a bundled ``model`` preset on a ``gpu`` preset."""
    from ..cost import StepCost

    return StepCost.from_model(model, gpu)


def prompt_prefill_log(prompt_lens, chunk: int | None) -> StepLog:
    """The steps that prefill every prompt once (no decode rows), packed in prompt order into steps
    of at most ``chunk`` tokens (None: one step). A prompt's tokens attend the prompt causally; a
    prompt split over steps has its attended pairs split in proportion."""
    lens = np.asarray(prompt_lens, dtype=np.int64).reshape(-1)
    lens = lens[lens > 0]
    total = int(lens.sum())
    if not total:
        return StepLog(*(np.zeros(0, dtype=np.int64) for _ in range(5)))
    width = total if chunk is None else int(chunk)
    edges = np.arange(0, total + width, width)
    edges[-1] = total
    edges = np.unique(edges)
    # Cumulative attended pairs at every token boundary: within a prompt of P tokens, token k attends k.
    ends = np.cumsum(lens)
    starts = ends - lens

    def pairs_before(x: np.ndarray) -> np.ndarray:
        done = np.clip(x[:, None] - starts[None, :], 0, lens[None, :])
        return (done * (done + 1) // 2).sum(axis=1)

    tokens = np.diff(edges)
    context = np.diff(pairs_before(edges))
    n = len(tokens)
    zeros = np.zeros(n, dtype=np.int64)
    return StepLog(np.ones(n, dtype=np.int64), zeros, zeros.copy(), tokens.astype(np.int64), context.astype(np.int64))


def prompt_prefill_seconds(cost, prompt_lens, chunk: int | None) -> np.ndarray:
    """Seconds of each prompt's first prefill on its own (one group each), under ``cost``: for every
    prompt, the seconds of ``prompt_prefill_log([p], chunk)``, priced for all prompts at once (one
    call of ``cost.segment_seconds`` whatever the number of prompts)."""
    lens = np.asarray(prompt_lens, dtype=np.int64).reshape(-1)
    out = np.zeros(len(lens), dtype=np.float64)
    live = np.flatnonzero(lens > 0)
    if not len(live):
        return out
    p = lens[live]
    width = p if chunk is None else np.full(len(p), int(chunk), dtype=np.int64)
    pieces = -(-p // width)  # the steps of each prompt's prefill
    owner = np.repeat(np.arange(len(p)), pieces)
    first = np.concatenate(([0], np.cumsum(pieces)[:-1]))
    start = (np.arange(int(pieces.sum())) - np.repeat(first, pieces)) * width[owner]
    end = np.minimum(start + width[owner], p[owner])
    tokens = end - start
    context = end * (end + 1) // 2 - start * (start + 1) // 2  # token k of a prompt attends k tokens
    ones = np.ones(len(tokens), dtype=np.int64)
    zeros = np.zeros(len(tokens), dtype=np.int64)
    priced = np.asarray(cost.segment_seconds(ones, zeros, zeros, tokens, context, zeros), dtype=np.float64)
    out[live] = priced[first]
    for i in np.flatnonzero(pieces > 1):  # summed as StepLog.seconds sums them, to the last bit
        out[live[i]] = float(np.sum(priced[first[i]:first[i] + pieces[i]]))
    return out


def lower_bound_seconds(cost, lengths, *, context, steps: int, prompt_lens=(), shared_read: int = 0,
                        prefill: tuple[int, int] = (0, 0), kv_cap: int | None = None) -> float:
    """A lower bound on the modelled seconds of generating completions of ``lengths`` (tokens) by any
    schedule: see the module docstring. ``context``: prompt tokens each completion's decode row
    attends (scalar or per completion); ``steps``: a lower bound on decode steps; ``prompt_lens``:
    the prompts prefilled once; ``shared_read``: KV tokens every step reads once; ``prefill``: (tokens,
    attention pairs) prefilled beyond the prompts (a multi-turn step's tool answers); ``kv_cap``: a
    compressed cache's most generated tokens a row reads (``Engine.kv_cap``)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    ctx = np.broadcast_to(np.asarray(context, dtype=np.int64), lengths.shape)
    prompts = np.asarray(prompt_lens, dtype=np.int64)
    own = held_token_steps(lengths - 1, kv_cap)  # the a-th token reads its a - 1 earlier ones (at most kv_cap)
    kv = int((lengths * ctx + own).sum()) + shared_read * int(steps)
    return float(cost.lower_bound_seconds(steps=int(steps), decode_tokens=int(lengths.sum()), kv_tokens_read=kv,
                                          prefill_tokens=int(prompts.sum()) + int(prefill[0]),
                                          prefill_context=int((prompts * (prompts + 1) // 2).sum()) + int(prefill[1])))
