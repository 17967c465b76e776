"""Sparse-RL off-policy correction (float64): exact reduction to GRPO, veto, bounds, Monte Carlo."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from lengthsched.errors import InvalidArgument
from sampler.correction import correction_weights, grpo_advantages, grpo_loss, sparse_grpo_loss


def batch(seed=0, n=6, t=9):
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand((n, t), generator=g, dtype=torch.float64) * 3
    logp_new = (logp_old + 0.05 * torch.randn((n, t), generator=g, dtype=torch.float64)).requires_grad_(True)
    mask = torch.ones((n, t), dtype=torch.bool)
    mask[1, 6:] = False
    mask[4, 3:] = False
    adv = grpo_advantages(torch.rand(n, generator=g, dtype=torch.float64), group_size=3)
    return logp_new, logp_old, mask, adv


def test_identical_policies_give_the_plain_grpo_loss_bit_for_bit():
    logp_new, logp_old, mask, adv = batch()
    loss, corr = sparse_grpo_loss(logp_new, logp_old, logp_old.clone(), adv, mask)
    assert torch.equal(corr.weights[mask], torch.ones(int(mask.sum()), dtype=torch.float64))
    assert corr.rejected_sequences == 0 and corr.masked_tokens == 0 and corr.kl == 0.0 and corr.mean_weight == 1.0
    plain = grpo_loss(logp_new, logp_old, adv, mask)
    assert torch.equal(loss, plain)
    (ga,) = torch.autograd.grad(loss, logp_new)
    (gb,) = torch.autograd.grad(plain, logp_new)
    assert torch.equal(ga, gb)


def test_one_vetoed_token_removes_exactly_its_sequence():
    logp_new, logp_old, mask, adv = batch(1)
    logp_sparse = logp_old + 0.02 * torch.randn(logp_old.shape, generator=torch.Generator().manual_seed(5),
                                                dtype=torch.float64)
    logp_sparse[2, 4] = logp_old[2, 4] + 12.0  # pi_old / pi_sparse = e^-12 < 1e-4: the sparse sampler's fluke
    loss, corr = sparse_grpo_loss(logp_new, logp_old, logp_sparse, adv, mask)
    assert corr.rejected.tolist() == [False, False, True, False, False, False]
    assert not corr.kept[2].any() and torch.all(corr.weights[2] == 0)
    (grad,) = torch.autograd.grad(loss, logp_new)
    assert torch.all(grad[2] == 0) and torch.any(grad[0] != 0)
    keep = [0, 1, 3, 4, 5]
    ref, _ = sparse_grpo_loss(logp_new[keep], logp_old[keep], logp_sparse[keep], adv[keep], mask[keep])
    assert torch.allclose(loss, ref, rtol=1e-14, atol=0)


def test_weights_are_detached_bounded_and_normalised():
    logp_new, logp_old, mask, adv = batch(2)
    logp_sparse = (logp_old + torch.randn(logp_old.shape, generator=torch.Generator().manual_seed(3),
                                          dtype=torch.float64)).requires_grad_(True)
    corr = correction_weights(logp_old, logp_sparse, mask, cap=1.5, band=(0.1, 10.0))
    assert not corr.weights.requires_grad
    kept = corr.kept
    assert torch.all(corr.weights[~kept] == 0)
    assert corr.weights[kept].mean().item() == pytest.approx(1.0, abs=1e-12)
    assert torch.all(corr.weights[kept] <= 1.5 / corr.mean_weight + 1e-12)
    ratio = torch.exp(logp_old - logp_sparse.detach())
    assert corr.masked_tokens == int((mask & ~corr.rejected.unsqueeze(1) & ((ratio < 0.1) | (ratio > 10))).sum())
    with pytest.raises(InvalidArgument, match="veto"):
        correction_weights(logp_old, logp_old, veto=2.0)
    with pytest.raises(InvalidArgument, match="logp_sparse"):
        correction_weights(logp_old, logp_old[:, :3])


def test_weighting_reduces_the_error_of_an_expectation_under_the_dense_policy():
    """Tokens drawn from a sparse sampler q; the capped, normalised weights estimate E_p[f] for the
    dense p with a smaller error than the plain average over q's samples."""
    g = torch.Generator().manual_seed(0)
    vocab = 12
    logits = torch.randn(vocab, generator=g, dtype=torch.float64)
    p = torch.softmax(logits, 0)
    q = torch.softmax(logits + 0.4 * torch.randn(vocab, generator=g, dtype=torch.float64), 0)
    f = torch.linspace(0, 1, vocab, dtype=torch.float64) ** 2
    truth = float((p * f).sum())
    err_plain, err_weighted = [], []
    for _ in range(200):
        x = torch.multinomial(q, 400, replacement=True, generator=g).view(1, -1)
        corr = correction_weights(torch.log(p)[x], torch.log(q)[x], band=None)
        err_plain.append(abs(float(f[x].mean()) - truth))
        err_weighted.append(abs(float((corr.weights * f[x]).mean()) - truth))
    mean_plain = sum(err_plain) / len(err_plain)
    mean_weighted = sum(err_weighted) / len(err_weighted)
    assert mean_weighted < 0.6 * mean_plain


def test_advantages_per_group():
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0], dtype=torch.float64), group_size=3)
    assert torch.allclose(adv[3:], torch.zeros(3, dtype=torch.float64))
    assert adv[:3].sum().abs() < 1e-12 and adv[0] > 0 > adv[1]
    with pytest.raises(InvalidArgument, match="rewards"):
        grpo_advantages(torch.ones(5), group_size=3)
