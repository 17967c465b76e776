"""Prefix Grouper: the packed shared-prefix forward equals the naive G-row forward (float64)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lengthsched.errors import InvalidArgument
from sampler.prefix_grouper import GroupLayout, grouped_logprobs, naive_logprobs

PROMPT = [5, 17, 33, 2, 41, 9, 60]
COMPLETIONS = [[8, 1, 77], [3], [50, 51, 52, 53, 54, 12], [19, 19]]


def _float64_norms(model):
    """transformers' RMSNorm computes in float32 even in a float64 model; summing the prompt's gradient
    once (grouped) or per row (naive) then rounds differently (about 1e-7). For an exact comparison
    the norms compute in the model's dtype, which is the same function."""
    import types

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(forward, module)
    return model


def tiny(kind: str):
    torch.manual_seed(0)
    common = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128)
    if kind == "qwen3":
        return _float64_norms(transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=8, **common)).double())
    return _float64_norms(transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).double())


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_logprobs_and_every_gradient_equal_the_naive_forward(kind):
    model = tiny(kind)
    weights = [torch.linspace(0.5, 1.5, len(c), dtype=torch.float64) for c in COMPLETIONS]
    grouped = grouped_logprobs(model, PROMPT, COMPLETIONS)
    sum(w @ g for w, g in zip(weights, grouped)).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    naive = naive_logprobs(model, PROMPT, COMPLETIONS)
    sum(w @ g for w, g in zip(weights, naive)).backward()
    for g, n in zip(grouped, naive):
        assert g.shape == n.shape and torch.allclose(g, n, rtol=0, atol=1e-10)
    for name, p in model.named_parameters():
        assert torch.allclose(grads[name], p.grad, rtol=0, atol=1e-10), name
    assert model.config._attn_implementation != "lengthsched_prefix_grouper"


def test_completions_do_not_see_each_other():
    model = tiny("qwen3")
    with torch.no_grad():
        base = grouped_logprobs(model, PROMPT, COMPLETIONS)
        changed = grouped_logprobs(model, PROMPT, [COMPLETIONS[0], [90, 91, 92, 93], *COMPLETIONS[2:]])
    for i in (0, 2, 3):  # equal up to rounding (the LM head's matmul shape changes with the packed length)
        assert torch.allclose(base[i], changed[i], rtol=0, atol=1e-12)


def test_lm_head_runs_on_completion_positions_only():
    """The LM head sees one position per completion token (not the prompt's), in both learners; a
    model without ``logits_to_keep`` gives the same log-probabilities from full logits."""
    model = tiny("qwen3")
    seen = []
    hook = model.lm_head.register_forward_hook(lambda mod, args, out: seen.append(tuple(args[0].shape[:2])))
    with torch.no_grad():
        grouped = grouped_logprobs(model, PROMPT, COMPLETIONS)
        naive = naive_logprobs(model, PROMPT, COMPLETIONS)
    hook.remove()
    longest = max(len(c) for c in COMPLETIONS)
    assert seen == [(1, sum(len(c) for c in COMPLETIONS)), (len(COMPLETIONS), longest)]

    class FullLogits(torch.nn.Module):  # a causal LM whose forward has no logits_to_keep
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config = inner, inner.config

        def forward(self, input_ids, attention_mask=None, use_cache=None):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, use_cache=use_cache)

    with torch.no_grad():
        full = naive_logprobs(FullLogits(model), PROMPT, COMPLETIONS)
    for a, b, g in zip(full, naive, grouped):
        assert torch.allclose(a, b, rtol=0, atol=1e-12) and torch.allclose(a, g, rtol=0, atol=1e-10)


def test_layout_mask_and_errors():
    seg = torch.tensor([0, 0, 1, 1, 2])
    m = GroupLayout(seg).mask()
    assert m.tolist() == [[True, False, False, False, False],
                          [True, True, False, False, False],
                          [True, True, True, False, False],
                          [True, True, True, True, False],
                          [True, True, False, False, True]]
    model = tiny("qwen3")
    with pytest.raises(InvalidArgument, match="completions"):
        grouped_logprobs(model, PROMPT, [[1], []])
    with pytest.raises(InvalidArgument, match="prompt_ids"):
        grouped_logprobs(model, [], [[1]])
    with pytest.raises(InvalidArgument, match="128 positions"):
        grouped_logprobs(model, PROMPT * 20, [[1]])


def test_learner_token_counts():
    from lengthsched import learner_tokens

    lengths = [len(c) for c in COMPLETIONS]
    assert learner_tokens(len(PROMPT), lengths, grouped=True) == 7 + 12
    assert learner_tokens(len(PROMPT), lengths, grouped=False) == 4 * 7 + 12
    with pytest.raises(InvalidArgument, match="lengths"):
        learner_tokens(7, [], grouped=True)
