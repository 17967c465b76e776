"""Off-policy correction for rollouts sampled with a sparse (compressed-KV) policy (Sparse-RL,
arXiv 2601.10079): pure functions on tensors.

A sparse rollout is sampled by pi_sparse (the policy reading a compressed KV cache) but trained as if
it came from the dense old policy pi_old. Per token, with log-probs of both for the sampled token:

- ``log_ratio = log pi_old - log pi_sparse``, ``ratio = exp(log_ratio)``;
- a sequence is REJECTED (all of its tokens leave the loss) when any of its valid tokens has
  ``ratio < veto`` (1e-4 in the released code): the sparse sampler produced a token the dense
  policy would essentially never produce;
- a token is MASKED when its ratio falls outside ``band`` (default 0.1 .. 10);
- the remaining tokens get ``weight = min(ratio, cap)`` (cap 1.5), normalised to mean 1 over the
  kept tokens, and DETACHED (a weight corrects the sampling distribution; it is not optimised);
- the clipped GRPO surrogate ``-mean_kept(weight * min(r A, clip(r, 1 - eps, 1 + eps) A))`` with
  ``r = pi_theta / pi_old``, averaged over kept tokens.

Shapes: (sequences, tokens) for per-token tensors, ``mask`` 1 on real tokens (0 on padding);
advantages per sequence (sequences,) or per token. With identical dense and sparse log-probs,
every weight is exactly 1, nothing is rejected and the loss is the plain GRPO loss bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lengthsched.errors import InvalidArgument

__all__ = ["SparseCorrection", "correction_weights", "grpo_advantages", "grpo_loss", "sparse_grpo_loss"]


@dataclass(frozen=True)
class SparseCorrection:
    """Weights (detached, 0 on dropped tokens), the kept-token mask, and the metrics: rejected
    sequences, masked tokens, mean weight before normalisation, and the KL of the sparse sampler from
    the dense policy estimated on the sampled tokens (``mean((ratio - 1) - log ratio)``, the k3
    estimator of KL(pi_sparse || pi_old))."""

    weights: torch.Tensor
    kept: torch.Tensor
    rejected: torch.Tensor  # (sequences,) bool
    masked_tokens: int
    mean_weight: float
    kl: float

    @property
    def rejected_sequences(self) -> int:
        return int(self.rejected.sum())


def _check(logp_old: torch.Tensor, logp_sparse: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if logp_old.shape != logp_sparse.shape or logp_old.dim() != 2:
        raise InvalidArgument("logp_sparse", tuple(logp_sparse.shape),
                              f"a (sequences, tokens) tensor shaped like logp_old {tuple(logp_old.shape)}")
    if mask is None:
        return torch.ones_like(logp_old, dtype=torch.bool)
    if mask.shape != logp_old.shape:
        raise InvalidArgument("mask", tuple(mask.shape), f"the shape of the log-probs {tuple(logp_old.shape)}")
    return mask.bool()


def correction_weights(logp_old: torch.Tensor, logp_sparse: torch.Tensor, mask: torch.Tensor | None = None, *,
                       veto: float = 1e-4, cap: float = 1.5, band: tuple[float, float] | None = (0.1, 10.0)
                       ) -> SparseCorrection:
    """The per-token correction of sparse rollouts (see the module docstring)."""
    if not 0 < veto < 1:
        raise InvalidArgument("veto", veto, "a ratio in (0, 1), e.g. 1e-4")
    if not cap >= 1:
        raise InvalidArgument("cap", cap, "a ratio >= 1, e.g. 1.5")
    if band is not None and not (0 < band[0] <= 1 <= band[1]):
        raise InvalidArgument("band", band, "(low, high) with 0 < low <= 1 <= high, or None")
    valid = _check(logp_old, logp_sparse, mask)
    with torch.no_grad():
        log_ratio = (logp_old - logp_sparse).detach()
        ratio = torch.exp(log_ratio)
        rejected = ((ratio < veto) & valid).any(dim=1)
        kept = valid & ~rejected.unsqueeze(1)
        in_band = torch.ones_like(kept) if band is None else (ratio >= band[0]) & (ratio <= band[1])
        masked = int((kept & ~in_band).sum())
        kept = kept & in_band
        capped = torch.clamp(ratio, max=cap)
        n = kept.sum()
        mean = (capped * kept).sum() / n.clamp(min=1)
        weights = torch.where(kept, capped / mean, torch.zeros_like(capped)) if n else torch.zeros_like(capped)
        kl = float(((ratio - 1 - log_ratio) * kept).sum() / n.clamp(min=1))
    return SparseCorrection(weights, kept, rejected, masked, float(mean), kl)


def grpo_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """Group-normalised advantages: (reward - group mean) / (group std + eps), groups of
    ``group_size`` consecutive sequences."""
    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size:
        raise InvalidArgument("rewards", tuple(rewards.shape), f"a 1-D tensor of whole groups of {group_size}")
    r = rewards.view(-1, group_size)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True, unbiased=False) + eps)).view(-1)


def _surrogate(logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, clip: float) -> torch.Tensor:
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    r = torch.exp(logp_new - logp_old.detach())
    return torch.minimum(r * adv, torch.clamp(r, 1 - clip, 1 + clip) * adv)


def grpo_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor | None = None, *, clip: float = 0.2) -> torch.Tensor:
    """The plain clipped GRPO surrogate, averaged over valid tokens (negated: a loss to minimise)."""
    valid = _check(logp_old, logp_new, mask)
    term = _surrogate(logp_new, logp_old, advantages, clip)
    return -(term * valid).sum() / valid.sum().clamp(min=1)


def sparse_grpo_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, logp_sparse: torch.Tensor,
                     advantages: torch.Tensor, mask: torch.Tensor | None = None, *, clip: float = 0.2,
                     veto: float = 1e-4, cap: float = 1.5, band: tuple[float, float] | None = (0.1, 10.0)
                     ) -> tuple[torch.Tensor, SparseCorrection]:
    """The clipped GRPO surrogate on sparse rollouts, weighted by :func:`correction_weights`, averaged
    over kept tokens; returns (loss, correction)."""
    corr = correction_weights(logp_old, logp_sparse, mask, veto=veto, cap=cap, band=band)
    term = _surrogate(logp_new, logp_old, advantages, clip)
    kept = corr.kept
    return -(corr.weights * term * kept).sum() / kept.sum().clamp(min=1), corr
