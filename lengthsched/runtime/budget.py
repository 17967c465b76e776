"""One budget vocabulary: bytes at the edges (what a user and an engine configure), KV tokens inside
(what the runtime, its policies and plans count).

:func:`kv_budget_tokens` is the one conversion, used by the simulator, the reference sampler and
the benchmarks. The activation workspace A(b) is counted for the decode batch b = min(G, slots):
no more than ``slots`` sequences decode in one step under a slot cap, so reserving activations
for all G would leave budget idle; without a cap every completion of the group may decode at once.
"""

from __future__ import annotations

from ..errors import check_int
from ..memory import ModelMemory

__all__ = ["kv_budget_tokens", "decode_batch"]


def decode_batch(group_size: int, slots: int | None = None) -> int:
    """Most sequences that decode in one step: min(G, slots), or G without a slot cap."""
    group_size = check_int("group_size", group_size, minimum=1)
    return group_size if slots is None else min(group_size, check_int("slots", slots, minimum=1))


def kv_budget_tokens(memory: ModelMemory, budget_bytes: int, *, prompt_tokens: int, group_size: int,
                     slots: int | None = None) -> int:
    """KV tokens (beyond the shared prompt) that ``budget_bytes`` of memory hold for a group of
    ``group_size`` completions of a ``prompt_tokens``-token prompt: what is left next to the weights,
    the prompt KV and the activations of :func:`decode_batch` sequences. Raises
    :class:`~lengthsched.BudgetTooSmall` if not even one KV token fits."""
    return memory.kv_token_budget(budget_bytes, prompt_tokens=prompt_tokens, batch=decode_batch(group_size, slots))
