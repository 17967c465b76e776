"""Shared-prefix forward for the learner (Prefix Grouper, arXiv 2506.05433).

The learner scores the G completions of one prompt. The naive forward runs G rows of
[prompt ; completion i] and encodes the prompt G times. The grouped forward packs ONE sequence
[prompt ; c_1 ; c_2 ; ... ; c_G]: the prompt attends causally to itself once, every completion
attends to [prompt ; itself] (causally) and never to another completion, and the positions of every
completion restart right after the prompt (P, P + 1, ...), so each completion sees exactly what it
sees in its own row. The attention runs through a function registered with ``transformers``
(``AttentionInterface``), not a fork of the model, so it works for any causal LM with plain
softmax attention, and autograd flows through it: log-probs and gradients equal the naive
forward's (tested in float64 to 1e-10).

Token counts: the grouped forward processes P + sum(l_i) tokens instead of G * P + sum(l_i); see
:mod:`lengthsched.learner`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from lengthsched.errors import InvalidArgument

from .attention import register_attention

__all__ = ["GROUPED_ATTENTION_NAME", "GroupLayout", "grouped_logprobs", "naive_logprobs", "register_grouped"]

GROUPED_ATTENTION_NAME = "lengthsched_prefix_grouper"


@dataclass(frozen=True)
class GroupLayout:
    """Segment of every packed position: 0 = the prompt, i + 1 = completion i."""

    segments: torch.Tensor  # (T,) long

    def mask(self) -> torch.Tensor:
        """(T, T) boolean: may query q attend to key k."""
        seg = self.segments
        t = seg.shape[0]
        idx = torch.arange(t, device=seg.device)
        causal = idx.view(1, t) <= idx.view(t, 1)
        key_in_prompt = (seg == 0).view(1, t)
        same = seg.view(t, 1) == seg.view(1, t)
        query_in_completion = (seg != 0).view(t, 1)
        # prompt keys: causal for prompt queries, all of them for completion queries; own segment: causal
        return (key_in_prompt & (causal | query_in_completion)) | (same & causal)


def grouped_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      sliding_window: int | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    layout: GroupLayout | None = kwargs.get("lengthsched_group")
    if layout is None:
        raise InvalidArgument("lengthsched_group", None, "the GroupLayout passed to model(...)")
    if sliding_window is not None or kwargs.get("softcap") is not None:
        raise InvalidArgument("model", type(module).__name__, "plain causal attention (no sliding window, no soft-capping)")
    b, h, t, d = query.shape
    kv_heads = key.shape[1]
    scale = scaling if scaling is not None else 1.0 / math.sqrt(d)
    k = key.repeat_interleave(h // kv_heads, dim=1)
    v = value.repeat_interleave(h // kv_heads, dim=1)
    scores = (query @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~layout.mask().view(1, 1, t, t), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if dropout and module.training:
        probs = torch.nn.functional.dropout(probs, p=dropout)
    return (probs @ v).transpose(1, 2).contiguous(), None


def register_grouped() -> str:
    """Register the grouped attention under :data:`GROUPED_ATTENTION_NAME`; returns the name."""
    return register_attention(GROUPED_ATTENTION_NAME, grouped_attention)


def _check(prompt_ids: Sequence[int], completions: Sequence[Sequence[int]]) -> tuple[list[int], list[list[int]]]:
    prompt = [int(x) for x in prompt_ids]
    if not prompt:
        raise InvalidArgument("prompt_ids", prompt_ids, "at least one token")
    comps = [[int(x) for x in c] for c in completions]
    if not comps or any(len(c) == 0 for c in comps):
        raise InvalidArgument("completions", [len(c) for c in comps], "at least one completion, each non-empty")
    return prompt, comps


def _token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits, -1) \
        .gather(-1, targets.view(-1, 1)).view(-1)


def grouped_logprobs(model: Any, prompt_ids: Sequence[int], completions: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """Per-token log-probabilities of each completion given the prompt, from ONE packed forward.

    Differentiable (gradients flow into the model's parameters). Returns ``G`` tensors, the i-th of
    length ``len(completions[i])``: log p(c_i[j] | prompt, c_i[:j])."""
    prompt, comps = _check(prompt_ids, completions)
    dev = next(model.parameters()).device
    p = len(prompt)
    ids = torch.tensor(prompt + [t for c in comps for t in c], device=dev).view(1, -1)
    positions = torch.cat([torch.arange(p)] + [p + torch.arange(len(c)) for c in comps]).to(dev).view(1, -1)
    segments = torch.cat([torch.zeros(p, dtype=torch.long)] +
                         [torch.full((len(c),), i + 1, dtype=torch.long) for i, c in enumerate(comps)]).to(dev)
    context = getattr(model.config, "max_position_embeddings", None)
    longest = p + max(len(c) for c in comps)
    if context is not None and longest > context:
        raise InvalidArgument("completions", longest, f"prompt + completion within the model's {context} positions")
    previous = model.config._attn_implementation
    model.set_attn_implementation(register_grouped())
    try:
        logits = model(input_ids=ids, position_ids=positions, use_cache=False,
                       lengthsched_group=GroupLayout(segments)).logits[0]
    finally:
        model.set_attn_implementation(previous)
    out, start = [], p
    for c in comps:
        # token 0 of every completion is predicted at the prompt's last position; token j at its own j - 1
        rows = torch.cat([logits[p - 1: p], logits[start: start + len(c) - 1]])
        out.append(_token_logprobs(rows, torch.tensor(c, device=dev)))
        start += len(c)
    return out


def naive_logprobs(model: Any, prompt_ids: Sequence[int], completions: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """The reference: G rows of [prompt ; completion i] (right-padded) in the model's own attention."""
    prompt, comps = _check(prompt_ids, completions)
    dev = next(model.parameters()).device
    p = len(prompt)
    width = p + max(len(c) for c in comps)
    ids = torch.zeros((len(comps), width), dtype=torch.long, device=dev)
    mask = torch.zeros_like(ids)
    for i, c in enumerate(comps):
        ids[i, : p + len(c)] = torch.tensor(prompt + c, device=dev)
        mask[i, : p + len(c)] = 1
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    return [_token_logprobs(logits[i, p - 1: p + len(c) - 1], torch.tensor(c, device=dev)) for i, c in enumerate(comps)]
