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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lengthsched.errors import InvalidArgument

from .attention import register_attention

__all__ = ["GROUPED_ATTENTION_NAME", "GroupLayout", "grouped_logprobs", "naive_logprobs", "register_grouped"]

GROUPED_ATTENTION_NAME = "lengthsched_prefix_grouper"


@dataclass(frozen=True)
class GroupLayout:
    """Segment of every packed position: 0 = the prompt, i + 1 = completion i (prompt first, then the
    completions one after another)."""

    segments: torch.Tensor  # (T,) long

    @property
    def prompt_len(self) -> int:
        return int((self.segments == 0).sum())

    @property
    def lengths(self) -> list[int]:
        return torch.bincount(self.segments)[1:].tolist()

    @property
    def index(self) -> torch.Tensor:
        """(completions, longest) packed position of each completion token; -1 past a completion's end."""
        lengths, p = self.lengths, self.prompt_len
        width = max(lengths)
        idx = torch.full((len(lengths), width), -1, dtype=torch.long, device=self.segments.device)
        start = p
        for i, n in enumerate(lengths):
            idx[i, :n] = torch.arange(start, start + n, device=self.segments.device)
            start += n
        return idx

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
    """Attention of the packed sequence without a T x T mask: the prompt attends to itself causally;
    the completions (padded to the longest, one row each) attend to the prompt's keys, read once for
    all rows, and causally to their own keys; one softmax over both parts."""
    layout: GroupLayout | None = kwargs.get("lengthsched_group")
    if layout is None:
        raise InvalidArgument("lengthsched_group", None, "the GroupLayout passed to model(...)")
    if sliding_window is not None or kwargs.get("softcap") is not None:
        raise InvalidArgument("model", type(module).__name__,
                              "plain causal attention (no sliding window, no soft-capping)")
    if query.shape[0] != 1:
        raise InvalidArgument("query", tuple(query.shape), "one packed sequence (batch 1)")
    _, h, t, d = query.shape
    kv_heads = key.shape[1]
    g = h // kv_heads
    scale = scaling if scaling is not None else 1.0 / math.sqrt(d)
    p, lengths = layout.prompt_len, layout.lengths
    n, width = len(lengths), max(lengths)
    q, k, v = query[0], key[0], value[0]  # (heads, T, dim)
    # the prompt: causal attention over itself
    pq = q[:, :p].reshape(kv_heads, g * p, d) * scale
    pk, pv = k[:, :p], v[:, :p]
    causal = torch.ones((p, p), dtype=torch.bool, device=q.device).tril()
    ps = (pq @ pk.transpose(-1, -2)).view(kv_heads, g, p, p).masked_fill(~causal, float("-inf"))
    prompt_out = (torch.softmax(ps, -1) @ pv.unsqueeze(1)).reshape(h, p, d)
    # the completions, one padded row each
    index = layout.index  # (n, width) packed position of each completion token, -1 beyond its length
    valid = index >= 0
    safe = index.clamp(min=0)
    cq = q[:, safe].permute(1, 0, 2, 3) * scale  # (n, heads, width, dim)
    ck, cv = k[:, safe].permute(1, 0, 2, 3), v[:, safe].permute(1, 0, 2, 3)  # (n, kv, width, dim)
    cqf = cq.reshape(n, kv_heads, g * width, d)
    rows_q = cqf.transpose(0, 1).reshape(kv_heads, n * g * width, d)
    prefix_scores = (rows_q @ pk.transpose(-1, -2)).reshape(kv_heads, n, g * width, p).transpose(0, 1)
    own_scores = cqf @ ck.transpose(-1, -2)  # (n, kv, g*width, width)
    own_ok = torch.ones((width, width), dtype=torch.bool, device=q.device).tril().unsqueeze(0) & valid.unsqueeze(1)
    own_ok = own_ok.unsqueeze(1).expand(n, g, width, width).reshape(n, 1, g * width, width)
    own_scores = own_scores.masked_fill(~own_ok, float("-inf"))
    probs = torch.softmax(torch.cat([prefix_scores, own_scores], -1), -1)
    if dropout and module.training:
        probs = torch.nn.functional.dropout(probs, p=dropout)
    prefix_probs = probs[..., :p].transpose(0, 1).reshape(kv_heads, n * g * width, p)
    comp_out = (prefix_probs @ pv).reshape(kv_heads, n, g * width, d).transpose(0, 1) + probs[..., p:] @ cv
    comp_out = comp_out.reshape(n, h, width, d)
    out = query.new_zeros((h, t, d))
    out[:, :p] = prompt_out
    out[:, index[valid]] = comp_out.permute(1, 0, 2, 3)[:, valid]
    return out.unsqueeze(0).transpose(1, 2).contiguous(), None


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


def _logits_at(model: Any, keep: torch.Tensor, **inputs: Any) -> torch.Tensor:
    """The model's logits at the sequence positions ``keep`` only (``(batch, len(keep), vocab)``).

    Models whose forward takes ``logits_to_keep`` (transformers' causal LMs) apply the LM head to
    those positions alone: with a vocabulary of 150k tokens the logits of the prompt positions would
    otherwise dominate the learner's memory. Other models run in full and are sliced."""
    import inspect

    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        return model(**inputs, logits_to_keep=keep).logits
    return model(**inputs).logits[:, keep]


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
    # token 0 of every completion is predicted at the prompt's last position, token j at its own j - 1:
    # only those positions need logits (the prompt's other positions predict nothing the learner uses)
    keep, start = [], p
    for c in comps:
        keep += [p - 1] + list(range(start, start + len(c) - 1))
        start += len(c)
    previous = model.config._attn_implementation
    model.set_attn_implementation(register_grouped())
    try:
        logits = _logits_at(model, torch.tensor(keep, device=dev), input_ids=ids, position_ids=positions,
                            use_cache=False, lengthsched_group=GroupLayout(segments))[0]
    finally:
        model.set_attn_implementation(previous)
    out, row = [], 0
    for c in comps:
        out.append(_token_logprobs(logits[row: row + len(c)], torch.tensor(c, device=dev)))
        row += len(c)
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
    # the logits of positions p - 1 .. width - 2 (every completion token's predictor), not the prompt's
    logits = _logits_at(model, torch.arange(p - 1, width - 1, device=dev), input_ids=ids, attention_mask=mask,
                        use_cache=False)
    return [_token_logprobs(logits[i, : len(c)], torch.tensor(c, device=dev)) for i, c in enumerate(comps)]
