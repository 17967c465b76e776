"""Per-completion random streams and the sampling distribution (temperature, top-k, top-p).

Completion j of group ``group_id`` draws from its own ``torch.Generator`` seeded by (seed,
group id, j): its tokens depend on its own logits and its own stream only, never on which other
completions share its batch or when it was scheduled. With the same logits, every policy gives
the same completions (the schedule-independence the tests check).

A token is drawn by inverse CDF from ONE uniform number per step: ``u ~ U[0, 1)`` from the stream,
then the first token whose cumulative probability (float64, tokens in index order) exceeds ``u``.
Greedy decoding is ``temperature=0``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from lengthsched.errors import InvalidArgument

__all__ = ["SamplingParams", "completion_seed", "make_generator", "processed_logprobs", "draw"]


@dataclass(frozen=True)
class SamplingParams:
    """``temperature`` (0 = greedy), ``top_k`` (0 = off), ``top_p`` (1 = off), ``max_new_tokens``
    (tokens, EOS included), ``stop_token_ids`` (a completion ends with, and includes, one of them)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise InvalidArgument("max_new_tokens", self.max_new_tokens, "an integer >= 1 (tokens)")
        if not (self.temperature >= 0.0):
            raise InvalidArgument("temperature", self.temperature, "a number >= 0 (0 = greedy)")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidArgument("top_p", self.top_p, "a number in (0, 1]")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidArgument("top_k", self.top_k, "an integer >= 0 (0 = off)")


def completion_seed(seed: int, group_id: int, index: int) -> int:
    """A 63-bit seed for completion ``index`` of group ``group_id`` (stable across processes)."""
    digest = hashlib.blake2b(f"{seed}:{group_id}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def make_generator(seed: int, group_id: int, index: int) -> torch.Generator:
    """The CPU generator of one completion (CPU, so streams are identical on every device)."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(completion_seed(seed, group_id, index))
    return gen


def processed_logprobs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Log-probabilities (float64) of the sampling distribution for each row of ``logits``: after
    temperature, top-k and top-p (in that order, as ``transformers`` applies them); excluded tokens
    get -inf. Greedy rows put all mass on the argmax."""
    x = logits.double()
    if params.temperature == 0.0:
        out = torch.full_like(x, float("-inf"))
        out.scatter_(-1, x.argmax(-1, keepdim=True), 0.0)
        return out
    x = x / params.temperature
    if params.top_k and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass of the tokens ranked above
        drop_sorted = before >= params.top_p  # keep the smallest prefix whose mass reaches top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.log_softmax(x, dim=-1)


def draw(logprobs: torch.Tensor, gen: torch.Generator) -> int:
    """One token from a row of log-probabilities by inverse CDF with one uniform from ``gen``."""
    u = torch.rand((), generator=gen, dtype=torch.float64).item()
    cdf = torch.cumsum(torch.exp(logprobs.detach().double().cpu()), dim=-1)
    idx = int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=torch.float64), right=True)[0])
    idx = min(idx, cdf.shape[-1] - 1)
    while logprobs[idx] == float("-inf"):  # float edge: never return an excluded token
        idx -= 1
    return idx
