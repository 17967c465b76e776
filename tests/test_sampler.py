"""The reference sampler on a tiny Qwen3 built from a config (CPU): exact attention, schedule
independence, KV bytes against the memory model, replay against the simulator, clear errors."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lengthsched.errors import InvalidArgument, LengthschedError
from sampler import InfiniteSampler, model_memory
from sampler.attention import register
from sampler.kv import KVStore
from sampler.sampling import SamplingParams, draw, make_generator, processed_logprobs
from simulate import run_group

PROMPT = list(range(10, 30))  # 20 tokens
FORCED = [7, 12, 3, 20, 9, 15, 4, 11, 30, 25]


def tiny(dtype=torch.float32, seed: int = 0, kind: str = "qwen3"):
    torch.manual_seed(seed)
    common = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, eos_token_id=3)
    if kind == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=16, **common))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    return model.eval().to(dtype)


@pytest.fixture(scope="module")
def model():
    return tiny()


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
@pytest.mark.parametrize("share, block", [(True, 1), (False, 1), (True, 16), (True, 4)])
def test_shared_prefix_attention_equals_the_plain_forward(kind, share, block):
    """float64: prefill + incremental steps of slots at different progress (and a multi-token
    recompute) give the logits of the ordinary full-sequence forward."""
    m = tiny(torch.float64, kind=kind)
    prompt = torch.tensor([PROMPT[:7]])
    gens = [torch.tensor([5, 9, 11, 40, 2]), torch.tensor([8, 1, 60])]
    with torch.no_grad():
        refs = [m(torch.cat([prompt[0], g]).view(1, -1)).logits[0, 6:] for g in gens]
        previous = m.config._attn_implementation
        m.set_attn_implementation(register())
        store = KVStore(2, 2, 16, torch.float64, torch.device("cpu"), block_size=block, share_prompt=share)
        out = m(prompt, position_ids=torch.arange(7).view(1, -1), use_cache=False, lengthsched_kv=store).logits
        assert torch.allclose(out[0, -1], refs[0][0], rtol=0, atol=1e-10)
        store.mode = "extend"
        store.open_slot(0)
        store.open_slot(1)
        for step in range(5):
            rows = [s for s in (0, 1) if step < len(gens[s])]
            for s in rows:
                store.reserve(s, step + 1)
            store.rows = rows
            logits = m(torch.stack([gens[s][step] for s in rows]).view(-1, 1),
                       position_ids=torch.tensor([[7 + step]] * len(rows)), use_cache=False,
                       lengthsched_kv=store).logits
            for i, s in enumerate(rows):
                assert torch.allclose(logits[i, -1], refs[s][step + 1], rtol=0, atol=1e-10)
        store.close_slot(1)  # a recompute: all of a slot's tokens in one forward
        store.open_slot(1)
        store.reserve(1, 3)
        store.rows = [1]
        logits = m(gens[1].view(1, -1), position_ids=(7 + torch.arange(3)).view(1, -1), use_cache=False,
                   lengthsched_kv=store).logits
        assert torch.allclose(logits[0], refs[1][1:], rtol=0, atol=1e-10)
        m.set_attn_implementation(previous)


def test_the_prompt_kv_is_held_once_when_shared():
    m = tiny(torch.float64)
    bpt = model_memory(m).kv_bytes_per_token
    assert bpt == 2 * 2 * 2 * 16 * 8  # layers x K,V x kv heads x head dim x float64
    shared = InfiniteSampler(m, policy="fixed_slot", slots=4).sample_group(PROMPT, 4, max_new_tokens=6, seed=0,
                                                                           force_lengths=[6] * 4, stop_token_ids=[3])
    copied = InfiniteSampler(m, policy="fixed_slot", slots=4, share_prompt_kv=False).sample_group(
        PROMPT, 4, max_new_tokens=6, seed=0, force_lengths=[6] * 4, stop_token_ids=[3])
    assert shared.peak_kv_bytes == (20 + 4 * 6) * bpt
    assert copied.peak_kv_bytes == 4 * (20 + 6) * bpt
    assert shared.completions == copied.completions  # same tokens either way (float64)
    for res in (shared, copied):
        assert all(r.kv_bytes == r.model_kv_bytes for r in res.records)


POLICY_ARGS = {"full": {}, "full_freed": {}, "micro": {"slots": 3}, "fixed_slot": {"slots": 3},
               "length_aware": {"slots": 3}, "length_aware_lpt": {"slots": 3}}


def test_completions_do_not_depend_on_the_policy(model):
    """fp32 on CPU: every policy samples the same G completions as the full group."""
    predicted = [5, 40, 12, 30, 8, 25, 16, 20]
    results = {p: InfiniteSampler(model, policy=p, **kw).sample_group(
        PROMPT, 8, max_new_tokens=40, temperature=1.0, top_p=0.95, top_k=50, seed=7,
        predicted_lengths=predicted if p.startswith("length") else None) for p, kw in POLICY_ARGS.items()}
    base = results["full"]
    assert len(set(map(len, base.completions))) > 1 or base.lengths[0] == 40
    for name, res in results.items():
        assert res.completions == base.completions, name
        assert np.allclose(np.concatenate(res.logprobs), np.concatenate(base.logprobs), atol=1e-4), name
        assert res.indices == list(range(8))
    assert results["fixed_slot"].peak_kv_bytes < results["full"].peak_kv_bytes


@pytest.mark.parametrize("policy, kwargs", [
    ("full", {}), ("full_freed", {}), ("micro", {"slots": 3}), ("fixed_slot", {"slots": 3}),
    ("length_aware", {"slots": 3}), ("length_aware", {"budget": 48}), ("growth_aware", {"budget": 48}),
    ("vllm", {"budget": 48}), ("vllm", {"budget": 70}), ("sglang", {"budget": 70}), ("reserve_max", {"budget": 90}),
    ("dynamic_slot", {"slots": 3}),
])
def test_trace_replay_matches_the_simulator_step_for_step(model, policy, kwargs):
    mem = model_memory(model)
    budget = kwargs.get("budget")
    budget_bytes = None if budget is None else (mem.weights_bytes + mem.prompt_kv_bytes(20) + mem.activation_bytes(10)
                                                + budget * mem.kv_bytes_per_token)
    sampler = InfiniteSampler(model, policy=policy, slots=kwargs.get("slots"), budget_bytes=budget_bytes)
    res = sampler.sample_group(PROMPT, 10, max_new_tokens=40, seed=3, force_lengths=FORCED, predicted_lengths=FORCED)
    sim = run_group(FORCED, policy, max_new_tokens=40, prompt_len=20, slots=kwargs.get("slots"), budget_tokens=budget,
                    predicted=FORCED, seed=3)
    assert res.steps == sim.steps
    assert res.peak_kv_tokens == sim.peak_kv_tokens
    assert res.preemptions == sim.preemptions and res.recomputed_tokens == sim.recomputed_tokens
    assert sorted(res.lengths) == sorted(sim.collected_lengths.tolist())
    if policy != "dynamic_slot":
        assert res.lengths == FORCED
    # measured KV bytes equal the memory model at every step, and the engine's token count too
    block = 16 if policy == "vllm" else 1
    mem_b = model_memory(model, block)
    for r in res.records:
        assert r.kv_bytes == r.model_kv_bytes
        assert r.kv_bytes == mem_b.prompt_kv_bytes(20) + r.kv_tokens * mem_b.kv_bytes_per_token


def test_memory_is_freed_when_a_completion_finishes(model):
    res = InfiniteSampler(model, policy="full_freed").sample_group(PROMPT, 4, max_new_tokens=30, seed=0,
                                                                   force_lengths=[5, 10, 20, 30])
    c = model_memory(model).kv_bytes_per_token
    by_step = {r.step: r for r in res.records}
    assert by_step[5].kv_bytes == (20 + 5 + 5 + 5 + 5) * c  # the 5-token completion still holds its KV at step 5
    assert by_step[6].kv_bytes == (20 + 6 + 6 + 6) * c and by_step[6].live == 3  # and is gone at step 6
    padded = InfiniteSampler(model, policy="full").sample_group(PROMPT, 4, max_new_tokens=30, seed=0,
                                                                force_lengths=[5, 10, 20, 30])
    assert {r.step: r for r in padded.records}[6].kv_bytes == (20 + 4 * 6) * c  # a padded row keeps growing
    assert padded.completions == res.completions


def test_sampling_controls_and_stop_tokens(model):
    greedy = InfiniteSampler(model, policy="fixed_slot", slots=2).sample_group(PROMPT, 3, max_new_tokens=12,
                                                                               temperature=0.0, seed=0)
    assert greedy.completions[0] == greedy.completions[1] == greedy.completions[2]
    assert all(lp == 0.0 for lp in greedy.logprobs[0])
    res = InfiniteSampler(model, policy="fixed_slot", slots=4).sample_group(
        PROMPT, 6, max_new_tokens=30, seed=5, stop_token_ids=list(range(0, 97, 4)))
    for toks in res.completions:  # a completion ends with its first stop token, or at max_new_tokens
        stops = [i for i, t in enumerate(toks) if t % 4 == 0]
        assert (stops and stops[0] == len(toks) - 1) or (not stops and len(toks) == 30)
    logits = torch.randn(3, 97, dtype=torch.float64)
    lp = processed_logprobs(logits, SamplingParams(max_new_tokens=5, temperature=0.7, top_k=10, top_p=0.8))
    assert torch.all(torch.isfinite(lp).sum(-1) <= 10)
    assert torch.allclose(torch.logsumexp(lp, -1), torch.zeros(3, dtype=torch.float64))
    ref = torch.softmax(logits / 0.7, -1)
    kept = torch.isfinite(lp[0])
    assert ref[0][kept].min() >= ref[0][~kept].max()  # top-k / top-p keep the most likely tokens
    gen_a, gen_b = make_generator(1, 2, 3), make_generator(1, 2, 3)
    assert [draw(lp[0], gen_a) for _ in range(5)] == [draw(lp[0], gen_b) for _ in range(5)]


def test_bad_input_fails_before_any_compute(model):
    s = InfiniteSampler(model, policy="fixed_slot", slots=2)
    with pytest.raises(InvalidArgument, match="group_size"):
        s.sample_group(PROMPT, 0, max_new_tokens=5)
    with pytest.raises(InvalidArgument, match="context of 256"):
        s.sample_group([5] * 250, 2, max_new_tokens=10)
    with pytest.raises(InvalidArgument, match="prompt_ids"):
        s.sample_group([], 2, max_new_tokens=5)
    with pytest.raises(InvalidArgument, match="policy"):
        InfiniteSampler(model, policy="magic")
    with pytest.raises(LengthschedError, match="budget_bytes"):
        InfiniteSampler(model, policy="length_aware", budget_bytes=1000).sample_group(PROMPT, 4, max_new_tokens=10)
    mem = model_memory(model)
    small = mem.weights_bytes + mem.prompt_kv_bytes(20) + mem.activation_bytes(4) + 5 * mem.kv_bytes_per_token
    with pytest.raises(InvalidArgument, match="room for one whole sequence"):
        InfiniteSampler(model, policy="vllm", budget_bytes=small).sample_group(PROMPT, 4, max_new_tokens=10)
    with pytest.raises(InvalidArgument, match="slots"):
        InfiniteSampler(model, policy="fixed_slot").sample_group(PROMPT, 4, max_new_tokens=10)
    with pytest.raises(InvalidArgument, match="force_lengths"):
        s.sample_group(PROMPT, 2, max_new_tokens=5, force_lengths=[3, 9])
    with pytest.raises(InvalidArgument, match="temperature"):
        s.sample_group(PROMPT, 2, max_new_tokens=5, temperature=-1)
    assert model.config._attn_implementation != "lengthsched_shared_prefix"  # the model is left as it was


class _Recording:
    """An oracle that records what it was asked (prompts, prefixes)."""

    def __init__(self, lengths):
        from lengthsched import OracleLengthPredictor

        self.oracle = OracleLengthPredictor(lengths)
        self.calls = []

    def predict(self, prompts, prefixes=None, *, quantiles=()):
        self.calls.append((list(prompts), None if prefixes is None else [list(p) for p in prefixes]))
        return self.oracle.predict(prompts, prefixes, quantiles=quantiles)


@pytest.mark.parametrize("extra", [{"slots": 3}, {"budget": 60}])
def test_token_conditioned_prediction_probes_k_tokens_then_plans(extra):
    """length_aware with probe_tokens=k: every completion decodes k tokens, is evicted, the predictor
    sees those tokens, the plan runs; completions are unchanged (float64) and the cost is counted."""
    m = tiny(torch.float64)
    k = 4
    budget_bytes = None
    if "budget" in extra:
        mem = model_memory(m)
        budget_bytes = (mem.weights_bytes + mem.prompt_kv_bytes(20) + mem.activation_bytes(10)
                        + extra["budget"] * mem.kv_bytes_per_token)
    pred = _Recording(FORCED)
    res = InfiniteSampler(m, policy="length_aware", slots=extra.get("slots"), budget_bytes=budget_bytes,
                          predictor=pred, probe_tokens=k).sample_group(PROMPT, 10, max_new_tokens=40, seed=2,
                                                                       force_lengths=FORCED)
    full = InfiniteSampler(m, policy="full_freed").sample_group(PROMPT, 10, max_new_tokens=40, seed=2,
                                                                force_lengths=FORCED)
    assert res.completions == full.completions and res.lengths == FORCED
    (queries, prefixes), = pred.calls
    long_ones = [j for j, n in enumerate(FORCED) if n > k]
    assert queries == long_ones and all(p == full.completions[j][:k] for j, p in zip(long_ones, prefixes))
    assert res.preemptions == len(long_ones) and res.recomputed_tokens == k * len(long_ones)
    assert res.policy == "length_aware"
    assert all(r.kv_bytes == r.model_kv_bytes for r in res.records)
    with pytest.raises(InvalidArgument, match="probe_tokens"):
        InfiniteSampler(m, policy="fixed_slot", slots=2, probe_tokens=4)


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st

REPLAY_POLICIES = ["full", "full_freed", "micro", "fixed_slot", "length_aware", "length_aware_lpt", "growth_aware",
                   "vllm", "sglang", "reserve_max"]
_TINY = {}


def _tiny_once():
    if "m" not in _TINY:
        _TINY["m"] = tiny()
    return _TINY["m"]


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(1, 14), min_size=1, max_size=6), policy=st.sampled_from(REPLAY_POLICIES),
       slots=st.integers(1, 4), extra=st.integers(0, 20), prompt=st.integers(1, 24), seed=st.integers(0, 3))
def test_replay_invariants_on_random_groups(lengths, policy, slots, extra, prompt, seed):
    """Any group, policy, slot count, budget and prompt length: the sampler's steps, peak KV tokens,
    preemptions and collected lengths are the simulator's; measured KV bytes equal the memory model at
    every step; the tokens are those of the full group."""
    m = _tiny_once()
    budget_policies = {"growth_aware", "vllm", "sglang", "reserve_max"}
    uses_budget = policy in budget_policies or (policy.startswith("length_aware") and extra % 2 == 1)
    prompt_ids = [(7 * i) % 90 + 5 for i in range(prompt)]
    tail = prompt % 16 if policy == "vllm" else 0
    budget = 16 + tail + extra + 16 if uses_budget else None  # >= one sequence of max_new_tokens (16) and its tail
    mem = model_memory(m, 16 if policy == "vllm" else 1)
    budget_bytes = None if budget is None else (mem.weights_bytes + mem.prompt_kv_bytes(prompt)
                                                + mem.activation_bytes(min(len(lengths), slots if policy in (
                                                    "micro", "fixed_slot", "length_aware", "length_aware_lpt")
                                                    else len(lengths)))
                                                + budget * mem.kv_bytes_per_token)
    use_slots = None if policy in budget_policies or policy.startswith("full") else slots
    sampler = InfiniteSampler(m, policy=policy, slots=use_slots, budget_bytes=budget_bytes)
    res = sampler.sample_group(prompt_ids, len(lengths), max_new_tokens=16, seed=seed, force_lengths=lengths,
                               predicted_lengths=lengths)
    budget_tokens = None if budget_bytes is None else mem.kv_token_budget(
        budget_bytes, prompt_tokens=prompt, batch=min(len(lengths), use_slots or len(lengths)))
    sim = run_group(lengths, policy, max_new_tokens=16, prompt_len=prompt, slots=use_slots,
                    budget_tokens=budget_tokens, predicted=lengths, seed=seed)
    assert (res.steps, res.peak_kv_tokens, res.preemptions, res.recomputed_tokens) == \
        (sim.steps, sim.peak_kv_tokens, sim.preemptions, sim.recomputed_tokens)
    assert res.lengths == list(lengths)
    assert all(r.kv_bytes == r.model_kv_bytes for r in res.records)
    full = InfiniteSampler(m, policy="full_freed").sample_group(prompt_ids, len(lengths), max_new_tokens=16,
                                                               seed=seed, force_lengths=lengths)
    assert res.completions == full.completions


def test_step_records_say_what_each_step_computed_and_how_long_it_took(model, tmp_path):
    """Every step records its decode rows, the KV they read, the tokens it recomputed and its wall
    seconds; the records are calibration samples for lengthsched.cost, priced by any StepCost."""
    from lengthsched.cost import StepCost, read_samples
    from lengthsched.io import atomic_write_text

    forced = [30, 28, 26, 24]
    memory = model_memory(model)
    budget = memory.weights_bytes + memory.prompt_kv_bytes(len(PROMPT)) + memory.activation_bytes(4) \
        + 64 * memory.kv_bytes_per_token
    res = InfiniteSampler(model, policy="vllm", budget_bytes=budget).sample_group(
        PROMPT, 4, max_new_tokens=32, force_lengths=forced, stop_token_ids=[3])
    assert res.preemptions > 0
    assert len(res.records) == res.steps and all(r.seconds > 0 for r in res.records)
    assert sum(r.prefill_tokens for r in res.records) == res.recomputed_tokens
    first = res.records[0]
    assert first.decode_rows == 0  # the first tokens come from the prompt's logits, no forward
    later = res.records[1]
    # The prompt's whole blocks are read once; each row reads its copy of the partial block and the
    # token it generated at step 1 (the one it feeds).
    tail = len(PROMPT) % 16
    assert later.kv_tokens_read == len(PROMPT) - tail + (1 + tail) * later.decode_rows
    assert res.step_seconds == pytest.approx(sum(r.seconds for r in res.records))
    path = tmp_path / "steps.jsonl"
    atomic_write_text(path, "".join(__import__("json").dumps(s) + "\n" for s in res.step_samples()))
    samples = read_samples(path)
    idle = sum(r.decode_rows + r.prefill_tokens == 0 for r in res.records)
    assert idle >= 1 and len(samples["seconds"]) == res.steps - idle  # no forward, nothing to fit: left out
    assert np.all(samples["decode_rows"] + samples["prefill_tokens"] > 0)
    cost = StepCost.from_gpu(memory, "h100", config=model.config.to_dict())
    assert res.model_seconds(cost) > 0


@settings(max_examples=12, deadline=None)
@given(lengths=st.lists(st.integers(1, 14), min_size=2, max_size=6),
       policy=st.sampled_from(["length_aware", "growth_aware", "growth_aware_lpt"]), extra=st.integers(0, 20),
       prior=st.integers(2, 14))
def test_an_online_predictor_makes_the_same_decisions_in_sampler_and_simulator(lengths, policy, extra, prior):
    """A predictor that learns from finished siblings during the run (OnlineLengthPredictor) is told the
    same events and asked the same questions by the sampler and the simulator: replay gives the same
    steps, preemptions and recomputation."""
    from lengthsched import OnlineLengthPredictor

    m = _tiny_once()
    prompt_ids = [(7 * i) % 90 + 5 for i in range(9)]
    budget = 16 + extra + 16
    mem = model_memory(m)
    budget_bytes = (mem.weights_bytes + mem.prompt_kv_bytes(9) + mem.activation_bytes(len(lengths))
                    + budget * mem.kv_bytes_per_token)

    def fresh():
        return OnlineLengthPredictor(prior=prior, within_sigma=0.3, prior_sigma=0.8, max_new_tokens=16)

    res = InfiniteSampler(m, policy=policy, budget_bytes=budget_bytes, predictor=fresh()).sample_group(
        prompt_ids, len(lengths), max_new_tokens=16, force_lengths=lengths)
    budget_tokens = mem.kv_token_budget(budget_bytes, prompt_tokens=9, batch=len(lengths))
    sim = run_group(lengths, policy, max_new_tokens=16, prompt_len=9, budget_tokens=budget_tokens,
                    predicted=fresh(), prompt_id=tuple(prompt_ids))
    assert (res.steps, res.peak_kv_tokens, res.preemptions, res.recomputed_tokens) == \
        (sim.steps, sim.peak_kv_tokens, sim.preemptions, sim.recomputed_tokens)
    assert res.lengths == list(lengths)
