"""Sparse rollouts: the sampler with a compressed KV cache, its memory against the model, and the
whole Sparse-RL step (sparse sampling, dense scoring, corrected loss)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from lengthsched import KVCompression
from lengthsched.errors import InvalidArgument
from sampler import InfiniteSampler, model_memory
from sampler.cli import tiny_qwen3
from sampler.correction import grpo_advantages, sparse_grpo_loss
from sampler.kv import KVStore
from sampler.prefix_grouper import grouped_logprobs

PROMPT = list(range(40, 60))
LENGTHS = [60, 50, 40, 30, 20, 10]


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3()


def run(model, compression, **kw):
    return InfiniteSampler(model, policy="fixed_slot", slots=4, kv_compression=compression, **kw).sample_group(
        PROMPT, 6, max_new_tokens=60, seed=0, force_lengths=LENGTHS, stop_token_ids=[256])


def test_a_budget_above_every_length_changes_nothing(model):
    dense = run(model, None)
    roomy = run(model, KVCompression(budget=100, interval=8))
    assert roomy.completions == dense.completions and roomy.peak_kv_bytes == dense.peak_kv_bytes


def test_compressed_memory_follows_the_memory_model(model):
    comp = KVCompression(budget=12, interval=4)
    res = run(model, comp)
    dense = run(model, None)
    assert all(r.kv_bytes == r.model_kv_bytes for r in res.records)
    c = model_memory(model).kv_bytes_per_token
    # at most budget + interval generated tokens per sequence, 4 slots, plus the prompt once
    assert res.peak_kv_bytes <= (len(PROMPT) + 4 * comp.max_retained) * c < dense.peak_kv_bytes
    assert res.steps == dense.steps and res.lengths == LENGTHS
    assert res.completions != dense.completions  # the sparse sampler is a different policy


def test_compression_keeps_the_most_attended_tokens_in_order():
    store = KVStore(1, 1, 2, torch.float64, torch.device("cpu"), compression=KVCompression(3, 2))
    store.set_prompt(0, torch.zeros(1, 1, 4, 2, dtype=torch.float64), torch.zeros(1, 1, 4, 2, dtype=torch.float64))
    store.open_slot(0)
    store.make_room(0, 6)
    kv = store.slots[0]
    kv.data[0, 0, 0, :5, 0] = torch.arange(5, dtype=torch.float64)
    kv.written = 5  # the KV of 5 generated tokens; the 6th was just sampled
    kv.scores[0, :5] = torch.tensor([0.5, 3.0, 0.1, 2.0, 0.2])
    store.reserve(0, 6)  # 6 > budget + interval = 5: compress to the budget (3), then room for the 6th
    assert kv.written == 3 and kv.capacity == 4 == KVCompression(3, 2).retained(6)
    assert kv.data[0, 0, 0, :3, 0].tolist() == [0.0, 1.0, 3.0]  # the three most attended, in order


def test_bad_compression_settings(model):
    with pytest.raises(InvalidArgument, match="kv_compression"):
        InfiniteSampler(model, policy="fixed_slot", slots=2, kv_compression=(8, 2))
    with pytest.raises(InvalidArgument, match="kv_compression"):
        InfiniteSampler(model, policy="fixed_slot", slots=2, share_prompt_kv=False, kv_compression=KVCompression(8, 2))


def test_a_sparse_rl_step_end_to_end(model):
    """Sample with the compressed cache (pi_sparse), score with the dense model (pi_old) through the
    shared-prefix forward, and take a corrected GRPO step: the loss is finite, tokens the two
    policies disagree on get weights other than 1, and the gradient reaches the model."""
    sparse = InfiniteSampler(model, policy="fixed_slot", slots=4, kv_compression=KVCompression(12, 4)).sample_group(
        PROMPT, 6, max_new_tokens=40, seed=1, stop_token_ids=[256])  # free sampling: replay would mask EOS
    lengths = sparse.lengths
    with torch.no_grad():
        dense_lp = grouped_logprobs(model, PROMPT, sparse.completions)
    width = max(lengths)
    pad = lambda rows: torch.stack([torch.nn.functional.pad(torch.as_tensor(r, dtype=torch.float32),  # noqa: E731
                                                            (0, width - len(r))) for r in rows])
    mask = pad([[1.0] * n for n in lengths]).bool()
    logp_sparse, logp_old = pad(sparse.logprobs), pad([x.tolist() for x in dense_lp])
    early = mask.clone()
    early[:, 16:] = False  # before the first compression (budget + interval tokens) both policies agree
    assert torch.allclose(logp_old[early], logp_sparse[early], atol=1e-4)
    new = grouped_logprobs(model, PROMPT, sparse.completions)
    logp_new = torch.stack([torch.nn.functional.pad(x, (0, width - len(x))) for x in new])
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0]), group_size=3)
    loss, corr = sparse_grpo_loss(logp_new, logp_old, logp_sparse, adv, mask)
    loss.backward()
    assert torch.isfinite(loss) and corr.kl > 0
    assert (corr.weights[corr.kept] != 1).any()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0
    model.zero_grad()


@pytest.mark.parametrize("policy, slots", [("fixed_slot", 3), ("length_aware", 2), ("full", None), ("micro", 2)])
def test_the_simulator_knows_the_retained_kv_trajectory(model, policy, slots):
    """The sampler's measured compressed KV, step by step, is the simulator's retained curve."""
    from simulate import run_group
    from simulate.run import retained_kv_curve

    comp = KVCompression(budget=7, interval=3)
    res = InfiniteSampler(model, policy=policy, slots=slots, kv_compression=comp).sample_group(
        PROMPT, 6, max_new_tokens=60, seed=0, force_lengths=LENGTHS, predicted_lengths=LENGTHS,
        stop_token_ids=[256])
    sim = run_group(LENGTHS, policy, max_new_tokens=60, prompt_len=len(PROMPT), slots=slots, predicted=LENGTHS,
                    compression=comp)
    curve = retained_kv_curve(sim.timeline, comp, sim.steps)
    c = model_memory(model).kv_bytes_per_token
    for r in res.records:
        assert r.kv_bytes == (len(PROMPT) + curve[r.step]) * c
    dense = run_group(LENGTHS, policy, max_new_tokens=60, prompt_len=len(PROMPT), slots=slots, predicted=LENGTHS)
    # the engine counts each sequence's ceiling (min(generated, budget + interval)): at or above the sparse KV
    assert sim.peak_retained_kv_tokens == max(curve) <= sim.peak_kv_tokens < dense.peak_kv_tokens
    assert res.peak_kv_bytes == (len(PROMPT) + sim.peak_retained_kv_tokens) * c


@pytest.mark.parametrize("policy", ["micro", "fixed_slot", "length_aware", "growth_aware"])
def test_the_sampler_admits_by_the_compressed_kv(model, policy):
    """A budget of 30 KV tokens cannot hold one 60-token completion uncompressed; compressed to at most
    10 generated tokens a sequence it runs three at once, as the simulator's schedule, within the bytes."""
    from simulate import run_group

    comp = KVCompression(budget=7, interval=3)
    mem = model_memory(model)
    budget_bytes = mem.weights_bytes + mem.prompt_kv_bytes(len(PROMPT)) + mem.activation_bytes(6) \
        + 30 * mem.kv_bytes_per_token
    with pytest.raises(InvalidArgument, match="budget_bytes"):
        InfiniteSampler(model, policy=policy, budget_bytes=budget_bytes).sample_group(
            PROMPT, 6, max_new_tokens=60, seed=0, force_lengths=LENGTHS, predicted_lengths=LENGTHS)
    res = InfiniteSampler(model, policy=policy, budget_bytes=budget_bytes, kv_compression=comp).sample_group(
        PROMPT, 6, max_new_tokens=60, seed=0, force_lengths=LENGTHS, predicted_lengths=LENGTHS, stop_token_ids=[256])
    sim = run_group(LENGTHS, policy, max_new_tokens=60, prompt_len=len(PROMPT), budget_tokens=30, predicted=LENGTHS,
                    compression=comp)
    assert res.steps == sim.steps and res.lengths == LENGTHS
    assert res.peak_kv_tokens == sim.peak_kv_tokens <= 30 and sim.max_live == 3
    c = mem.kv_bytes_per_token
    assert all(r.kv_bytes <= (len(PROMPT) + 30) * c for r in res.records)
