"""The KV the sampler holds: the prompt's KV once, and each slot's own KV, with exact byte counts.

Layout. The prefill writes the prompt's K/V of every layer into ``prompt`` (``(1, kv_heads, P,
head_dim)`` per layer). The first ``shared_len`` prompt tokens are attended by every slot BY
REFERENCE (never copied): ``shared_len = P`` when the prompt KV is shared, 0 when it is copied
(the baseline: every sequence holds its own copy of the prompt), and the prompt's whole blocks
when an engine shares only full blocks. The remaining ``tail = P - shared_len`` prompt tokens are
copied into each slot's own KV when it is admitted.

A slot's own KV is one tensor ``(layers, 2, kv_heads, capacity, head_dim)`` whose capacity is its
tokens rounded up to ``block_size``: the tail copy plus every token it has GENERATED, including the
newest one whose K/V the next forward writes (the position is allocated when the token is sampled,
as a paged engine allocates the slot of the next token). That is the count of docs/model.md
section 3, so ``held_bytes()`` (the sum of ``nbytes`` of the tensors that exist) can be compared
with the ``lengthsched`` memory model step by step. A finished slot's tensor is dropped at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["SlotKV", "KVStore"]


@dataclass
class SlotKV:
    """One sequence's own KV: ``data[layer, 0 | 1, head, position, dim]``; ``written`` positions hold K/V;
    ``scores[layer, position]``: attention the position received (kept only under compression)."""

    data: torch.Tensor
    written: int = 0
    scores: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        return self.data.shape[3]


@dataclass
class KVStore:
    """Per-layer prompt KV and per-slot own KV; ``rows`` says which slots the next forward runs."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    block_size: int = 1
    share_prompt: bool = True
    prompt_k: list[torch.Tensor] = field(default_factory=list)
    prompt_v: list[torch.Tensor] = field(default_factory=list)
    prompt_len: int = 0
    shared_len: int = 0
    slots: dict[int, SlotKV] = field(default_factory=dict)
    mode: str = "prefill"  # "prefill" (batch 1, the prompt) or "extend" (rows of slots, new tokens)
    rows: list[int] = field(default_factory=list)
    compression: Any = None  # a lengthsched.KVCompression: retained generated tokens per sequence

    @property
    def bytes_per_token(self) -> int:
        """K and V of all layers for one token (bytes)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * torch.empty((), dtype=self.dtype).element_size()

    @property
    def tail(self) -> int:
        return self.prompt_len - self.shared_len

    # ---------------------------------------------------------------- prompt
    def set_prompt(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> None:
        if layer == 0:
            self.prompt_k, self.prompt_v = [], []
            self.prompt_len = key.shape[2]
            b = self.block_size
            self.shared_len = (self.prompt_len // b * b if b > 1 else self.prompt_len) if self.share_prompt else 0
        self.prompt_k.append(key.detach())
        self.prompt_v.append(value.detach())

    # ---------------------------------------------------------------- slots
    def _rounded(self, tokens: int) -> int:
        b = self.block_size
        return -(-tokens // b) * b

    def open_slot(self, slot: int) -> None:
        """A new own KV for ``slot`` holding the prompt's tail copy (nothing generated yet)."""
        tail = self.tail
        data = torch.zeros((self.layers, 2, self.kv_heads, self._rounded(tail), self.head_dim), dtype=self.dtype,
                           device=self.device)
        for layer in range(self.layers):
            data[layer, 0, :, :tail] = self.prompt_k[layer][0, :, self.shared_len:]
            data[layer, 1, :, :tail] = self.prompt_v[layer][0, :, self.shared_len:]
        scores = None
        if self.compression is not None:
            scores = torch.zeros((self.layers, data.shape[3]), dtype=torch.float32, device=self.device)
        self.slots[slot] = SlotKV(data, written=tail, scores=scores)

    def held_for(self, generated: int) -> int:
        """Token positions a slot holds after ``generated`` tokens: its prompt tail plus the generated
        tokens retained (all of them without compression), block rounded."""
        kept = generated if self.compression is None else int(self.compression.retained(generated))
        return self._rounded(self.tail + kept)

    def make_room(self, slot: int, tokens: int) -> None:
        """Room for ``tokens`` generated tokens whatever the compression (a recompute writes them all;
        the next :meth:`reserve` compresses again)."""
        kv = self.slots[slot]
        need = self._rounded(self.tail + tokens)
        if need > kv.capacity:
            self._resize(kv, need)

    def _resize(self, kv: SlotKV, need: int) -> None:
        resized = torch.zeros((*kv.data.shape[:3], need, kv.data.shape[4]), dtype=self.dtype, device=self.device)
        resized[:, :, :, : kv.written] = kv.data[:, :, :, : kv.written]
        kv.data = resized
        if kv.scores is not None:
            scores = torch.zeros((self.layers, need), dtype=torch.float32, device=self.device)
            scores[:, : kv.written] = kv.scores[:, : kv.written]
            kv.scores = scores

    def reserve(self, slot: int, generated: int) -> None:
        """Size the slot for ``generated`` tokens (called after sampling): grow it, or first compress
        its written KV to the budget when the compressed cache is full."""
        kv = self.slots[slot]
        need = self.held_for(generated)
        if self.compression is not None and kv.written + 1 > need:
            self.compress(slot, need - 1 - self.tail)
        if need != kv.capacity:
            self._resize(kv, need)

    def compress(self, slot: int, keep: int) -> None:
        """Keep the ``keep`` generated tokens of each layer that received the most attention since
        they were written (R-KV / SnapKV style scores), in their original order; the prompt tail stays."""
        kv = self.slots[slot]
        tail, own = self.tail, kv.written - self.tail
        if own <= keep:
            return
        for layer in range(self.layers):
            idx = torch.topk(kv.scores[layer, tail: tail + own], keep).indices.sort().values + tail
            kv.data[layer, :, :, tail: tail + keep] = kv.data[layer, :, :, idx]
            kv.scores[layer, tail: tail + keep] = kv.scores[layer, idx]
            kv.scores[layer, tail + keep:] = 0
        kv.written = tail + keep

    def add_scores(self, layer: int, rows: list[int], probs: torch.Tensor, lengths: list[int]) -> None:
        """Accumulate the attention each own position received in this forward (summed over heads and
        queries): ``probs`` (rows, kv heads, queries, own positions)."""
        received = probs.detach().float().sum(dim=(1, 2))
        for i, slot in enumerate(rows):
            kv = self.slots[slot]
            kv.scores[layer, : lengths[i]] += received[i, : lengths[i]]

    def close_slot(self, slot: int) -> None:
        """Free the slot's KV (a finished or preempted sequence)."""
        del self.slots[slot]

    def held_bytes(self) -> int:
        """Bytes of KV tensors held now: the shared prompt part once, plus every slot's own tensor."""
        shared = self.shared_len * self.bytes_per_token if self.prompt_k else 0
        return shared + sum(kv.data.nbytes for kv in self.slots.values())
