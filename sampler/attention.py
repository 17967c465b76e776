"""Shared-prefix attention as a registered ``transformers`` attention function.

The model runs with ``use_cache=False`` and our :class:`~sampler.kv.KVStore` passed to
``model(...)`` as the keyword ``lengthsched_kv``; ``transformers`` hands it to every attention
layer, where this function:

- in ``prefill`` mode (batch 1, the prompt): keeps the prompt's K/V as the layer's prompt KV and
  returns causal attention over the prompt;
- in ``extend`` mode (one row per slot in ``store.rows``, q new tokens per row): writes the new
  K/V into each slot's own KV after what it already holds, and attends every query to
  [shared prompt KV ; the slot's own KV up to and including itself].

The shared prompt is attended by reference: the queries of all rows are folded into one matrix per
KV head and multiplied with the prompt's keys once (``(kv, rows * q, dim) x (kv, dim, P)``), so the
prompt KV exists once however many slots read it, and is read once per step. The scores of both
parts are normalised by one softmax over their concatenation, which is exactly attention over the
concatenated keys (cascade / shared-prefix attention); nothing of the prompt is copied. Grouped-query
attention is handled by folding the query heads of one KV head together instead of repeating K/V.

Only plain causal softmax attention is supported (Qwen2/3, Llama, Mistral without sliding
windows); a layer with a sliding window or logit soft-capping raises a clear error.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from lengthsched.errors import InvalidArgument

from .kv import KVStore

__all__ = ["ATTENTION_NAME", "register", "register_attention", "shared_prefix_attention"]

ATTENTION_NAME = "lengthsched_shared_prefix"
_registered: set[str] = set()


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """The mask function of our attention functions: they build their masks themselves."""
    return None


def register_attention(name: str, fn: Any) -> str:
    """Register ``fn`` as the attention function ``name`` with an empty mask function of the same
    name (without one, transformers would build a mask for an implementation it does not know)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if name not in _registered:
        AttentionInterface.register(name, fn)
        AttentionMaskInterface.register(name, _no_mask)
        _registered.add(name)
    return name


def register() -> str:
    """Register the shared-prefix attention under :data:`ATTENTION_NAME`; returns the name."""
    return register_attention(ATTENTION_NAME, shared_prefix_attention)


def _fold(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """(B, H, q, D) -> (B, kv_heads, (H / kv_heads) * q, D): the query heads that share a KV head."""
    b, h, n, d = q.shape
    return q.reshape(b, kv_heads, (h // kv_heads) * n, d)


def shared_prefix_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                            sliding_window: int | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    store: KVStore | None = kwargs.get("lengthsched_kv")
    if store is None:
        raise InvalidArgument("lengthsched_kv", None, "the sampler's KVStore passed to model(...)")
    if sliding_window is not None or kwargs.get("softcap") is not None:
        raise InvalidArgument("model", type(module).__name__,
                              "plain causal attention (no sliding window, no soft-capping) for the reference sampler")
    layer = module.layer_idx
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    b, h, n, d = query.shape
    kv_heads = key.shape[1]
    if store.mode == "prefill":
        store.set_prompt(layer, key, value)
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key.repeat_interleave(h // kv_heads, dim=1), value.repeat_interleave(h // kv_heads, dim=1),
            is_causal=True, scale=scale)
        return out.transpose(1, 2).contiguous(), None

    rows = store.rows
    if len(rows) != b:
        raise InvalidArgument("rows", len(rows), f"{b}, one slot per batch row")
    starts = []
    for i, slot in enumerate(rows):  # write the new K/V after what the slot holds
        kv = store.slots[slot]
        start = kv.written
        kv.data[layer, 0, :, start:start + n] = key[i]
        kv.data[layer, 1, :, start:start + n] = value[i]
        if layer == store.layers - 1:
            kv.written = start + n
        starts.append(start)
    lengths = [s + n for s in starts]
    own_len = max(lengths)
    own_k = key.new_zeros((b, kv_heads, own_len, d))
    own_v = value.new_zeros((b, kv_heads, own_len, d))
    for i, slot in enumerate(rows):
        data = store.slots[slot].data
        own_k[i, :, : lengths[i]] = data[layer, 0, :, : lengths[i]]
        own_v[i, :, : lengths[i]] = data[layer, 1, :, : lengths[i]]

    q = _fold(query, kv_heads) * scale  # (B, kv, g*n, D)
    own_scores = q @ own_k.transpose(-1, -2)  # (B, kv, g*n, L)
    # query j of row i (the (start_i + j)-th own token) sees own positions <= start_i + j
    pos = torch.arange(own_len, device=query.device)
    limit = torch.tensor(starts, device=query.device).view(b, 1) + torch.arange(n, device=query.device).view(1, n)
    allowed = (pos.view(1, 1, own_len) <= limit.view(b, n, 1))  # (B, n, L)
    allowed = allowed.unsqueeze(1).expand(b, h // kv_heads, n, own_len).reshape(b, 1, (h // kv_heads) * n, own_len)
    own_scores = own_scores.masked_fill(~allowed, float("-inf"))
    shared = store.shared_len
    if shared:
        pk = store.prompt_k[layer][0, :, :shared]  # (kv, P, D), read in place
        pv = store.prompt_v[layer][0, :, :shared]
        m = q.shape[2]
        # Every row's queries against the one prompt: fold the rows into the query dimension, so it is
        # one (kv, B*g*n, D) x (kv, D, P) product per KV head, with no copy of the prompt KV.
        rows_q = q.transpose(0, 1).reshape(kv_heads, b * m, d)
        prefix_scores = (rows_q @ pk.transpose(-1, -2)).reshape(kv_heads, b, m, shared).transpose(0, 1)
        probs = torch.softmax(torch.cat([prefix_scores, own_scores], dim=-1), dim=-1)
        prefix_probs = probs[..., :shared].transpose(0, 1).reshape(kv_heads, b * m, shared)
        prefix_out = (prefix_probs @ pv).reshape(kv_heads, b, m, d).transpose(0, 1)
        own_probs = probs[..., shared:]
        out = prefix_out + own_probs @ own_v
    else:
        own_probs = torch.softmax(own_scores, dim=-1)
        out = own_probs @ own_v
    if store.compression is not None:
        store.add_scores(layer, rows, own_probs, lengths)
    out = out.reshape(b, h, n, d)
    return out.transpose(1, 2).contiguous(), None
