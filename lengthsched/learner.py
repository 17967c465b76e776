"""The learner's cost of scoring groups: naive G rows against one shared-prefix packed sequence
(Prefix Grouper), and training micro-batches sized by it.

For a group of G completions of lengths l_i after a prompt of P tokens:

- tokens processed (activations scale with them): naive ``G * P + sum(l)``, grouped ``P + sum(l)``;
- linear FLOPs (forward): ``2 * N * tokens`` for N parameters (every token passes every weight once);
- attention FLOPs (forward): ``4 * layers * width * pairs``, ``width`` = heads x head dim, where
  ``pairs`` counts (query, key) pairs that attend: naive ``sum_i (P + l_i)(P + l_i + 1) / 2``, grouped
  ``P (P + 1) / 2 + sum_i (l_i P + l_i (l_i + 1) / 2)`` (the prompt attends to itself once).

The grouped / naive ratio tends to 1 / G as the prompt dominates. Backward costs about twice the
forward in both layouts, so the ratios hold for a training step. ``sampler.prefix_grouper`` runs
the grouped forward.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import InvalidArgument, as_lengths, check_int
from .hfconfig import load_config
from .packing import pack_micro_groups

__all__ = ["LearnerShapes", "LearnerCost", "learner_cost", "learner_tokens", "learner_micro_batches"]


@dataclass(frozen=True)
class LearnerShapes:
    """What the learner's FLOPs depend on: ``num_parameters``, ``num_layers``, attention ``width``
    (query heads x head dim)."""

    num_parameters: int
    num_layers: int
    width: int

    @classmethod
    def from_hf_config(cls, config: Any) -> LearnerShapes:
        """From a ``config.json`` path, a model directory, a dict, or a bundled preset name."""
        from .hfconfig import PRESET_DIR, preset_names, read_shapes

        if isinstance(config, str) and not os.path.exists(config) and config in preset_names():
            config = PRESET_DIR / f"{config}.json"
        cfg = load_config(config)
        text = cfg.get("text_config", cfg)
        heads = int(text["num_attention_heads"])
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
        shapes = read_shapes(cfg)
        return cls(shapes.num_parameters, shapes.num_layers, heads * head_dim)


@dataclass(frozen=True)
class LearnerCost:
    """Forward cost of scoring one group: ``tokens``, ``linear_flops``, ``attention_flops``."""

    tokens: int
    linear_flops: float
    attention_flops: float

    @property
    def flops(self) -> float:
        return self.linear_flops + self.attention_flops


def learner_tokens(prompt_tokens: int, lengths: Any, *, grouped: bool) -> int:
    """Tokens the learner's forward processes for one group: ``P + sum(l)`` grouped, ``G * P + sum(l)`` naive."""
    p = check_int("prompt_tokens", prompt_tokens, minimum=0)
    ls = as_lengths("lengths", lengths, minimum=1)
    return int((p if grouped else p * len(ls)) + ls.sum())


def _pairs(p: int, ls: np.ndarray, grouped: bool) -> float:
    ls = ls.astype(np.float64)
    if grouped:
        return p * (p + 1) / 2 + float(np.sum(ls * p + ls * (ls + 1) / 2))
    n = p + ls
    return float(np.sum(n * (n + 1) / 2))


def learner_cost(shapes: LearnerShapes, prompt_tokens: int, lengths: Any, *, grouped: bool) -> LearnerCost:
    """Forward FLOPs and tokens of scoring one group (see the module docstring)."""
    if not isinstance(shapes, LearnerShapes):
        raise InvalidArgument("shapes", type(shapes).__name__, "a LearnerShapes (LearnerShapes.from_hf_config)")
    tokens = learner_tokens(prompt_tokens, lengths, grouped=grouped)
    ls = as_lengths("lengths", lengths, minimum=1)
    attention = 4.0 * shapes.num_layers * shapes.width * _pairs(int(prompt_tokens), ls, grouped)
    return LearnerCost(tokens, 2.0 * shapes.num_parameters * tokens, attention)


def learner_micro_batches(groups: Sequence[tuple[int, Sequence[int]]], token_budget: int, *, grouped: bool,
                          eps: float = 0.05) -> list[list[int]]:
    """Training micro-batches of whole groups whose learner tokens fit ``token_budget`` (tokens).

    ``groups[j] = (prompt tokens, completion lengths)``. Each micro-batch is filled as full as
    possible by the subset-sum FPTAS of :mod:`lengthsched.packing` (within ``eps`` of the best
    fill), then the next from what is left. Grouped scoring needs fewer tokens per group, so more
    groups fit a micro-batch and fewer micro-batches are needed. Raises ``BudgetTooSmall`` when one
    group alone exceeds the budget."""
    if not groups:
        raise InvalidArgument("groups", [], "at least one (prompt tokens, lengths) pair")
    sizes = [learner_tokens(p, ls, grouped=grouped) for p, ls in groups]
    return [list(r.items) for r in pack_micro_groups(sizes, token_budget, eps=eps)]
