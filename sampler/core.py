"""``InfiniteSampler``: generate a GRPO group on a real transformer under a sampling policy.

One group = one prompt and G completions. The prompt is prefilled once; every completion reads
its KV by reference (``share_prompt_kv=True``) or holds a copy (the baseline). The policy is the
simulator's own policy object (``lengthsched.runtime.make_policy``) driven through the runtime's
:class:`~lengthsched.runtime.Engine` by its public stepping API: it admits completions into slots,
refills a finished slot at the next step, preempts (the preempted completion keeps its tokens and
recomputes its KV when it is admitted again) and releases padded rows, exactly as in a
simulation. The sampler executes
one batched decode step at a time:

1. the policy decides (admissions for the coming step, preemptions, releases);
2. a newly admitted completion draws its first token from the prompt's last logits (no forward);
   one readmitted after a preemption recomputes its KV in a forward of its own tokens; every other
   live row (padded rows too, which decode EOS as a padded batch does) is in one batched forward
   of its last token at its own position (prompt length + tokens it holds);
3. each running completion samples from its own random stream (seed, group id, index);
4. memory is counted: the bytes of KV tensors held (measured), next to the memory model's figure.

Time and memory follow the model of docs/model.md: a completion of length l is live for l steps; at the end
of a step a sequence holds KV for every token it generated (the newest one's position allocated).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from lengthsched.errors import InvalidArgument, as_lengths, check_int
from lengthsched.memory import KVCompression, ModelMemory
from lengthsched.runtime import POLICIES, Engine, Problem, SimPolicy, kv_budget_tokens, make_policy

from .attention import register
from .kv import KVStore
from .sampling import SamplingParams, draw, make_generator, processed_logprobs

__all__ = ["InfiniteSampler", "SampleResult", "StepRecord", "SAMPLER_POLICIES", "model_memory"]

# The policies of the registry that run on the sampler (all of them); vllm rounds KV to blocks of 16
# and shares only the prompt's whole blocks, as the simulator models it.
SAMPLER_POLICIES = tuple(name for name, spec in POLICIES.items() if spec.sampler)

_TORCH_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16",
                 torch.float16: "float16"}


@dataclass(frozen=True)
class StepRecord:
    """One decode step: ``live`` rows (padded ones included), ``running`` completions, ``kv_bytes``
    of KV tensors held at the end of the step before finished sequences are freed (measured),
    ``model_kv_bytes`` the memory model's figure for the same state, ``kv_tokens`` the engine's
    count of KV tokens beyond the shared prompt; then what the step computed and its measured time
    (the samples a step-cost model is calibrated on: ``lengthsched.cost``)."""

    step: int
    live: int
    running: int
    kv_bytes: int
    model_kv_bytes: int
    kv_tokens: int
    # What the step did and how long it took: rows in the batched decode forward, KV tokens it
    # read (see _GroupRun.account), tokens prefilled (recomputation after a preemption), and the
    # measured wall seconds of the step (admit + decode + account; after a CUDA sync on a GPU).
    decode_rows: int = 0
    kv_tokens_read: int = 0
    prefill_tokens: int = 0
    seconds: float = 0.0
    prefill_context: int = 0  # (query, key) pairs the prefilled tokens attend: the prompt and each other


@dataclass
class SampleResult:
    """A generated group. ``completions[i]`` are the token ids of completion i (index order; for the
    dynamic-slot control, the first G that finished), ``logprobs[i]`` the log-probability of each
    token under the sampling distribution, ``lengths`` their lengths (tokens, stop token included)."""

    policy: str
    completions: list[list[int]]
    logprobs: list[list[float]]
    indices: list[int]
    steps: int
    peak_kv_bytes: int
    peak_model_kv_bytes: int
    peak_kv_tokens: int
    preemptions: int
    recomputed_tokens: int
    discarded_tokens: int
    decoded_tokens: int
    prompt_tokens: int
    wall_seconds: float
    cuda_peak_bytes: int | None
    records: list[StepRecord] = field(default_factory=list, repr=False)
    texts: list[str] | None = field(default=None, repr=False)

    @property
    def lengths(self) -> list[int]:
        return [len(c) for c in self.completions]

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def tokens_per_second(self) -> float:
        """Collected completion tokens per second of wall time (prefill included)."""
        return self.tokens / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def step_seconds(self) -> float:
        """Measured seconds of the decode steps (the sum over :attr:`records`; the prompt's prefill
        and the policy's planning excluded)."""
        return float(sum(r.seconds for r in self.records))

    def model_seconds(self, cost: Any) -> float:
        """What the step-cost model ``cost`` (a ``lengthsched.cost.StepCost``) says the same steps
        take: each record priced by its decode rows, KV tokens read and prefilled tokens. Put it next
        to :attr:`step_seconds` (measured) to see the model's error on this run."""
        if not self.records:
            return 0.0
        cols = np.array([(r.decode_rows, r.kv_tokens_read, r.prefill_tokens, r.prefill_context)
                         for r in self.records], dtype=np.int64)
        return float(np.sum(cost.seconds(cols[:, 0], cols[:, 1], cols[:, 2], cols[:, 3])))

    def step_samples(self) -> list[dict]:
        """The measured steps as calibration samples (``lengthsched cost fit`` reads them as JSON lines). A step
        that ran no forward (neither decode rows nor prefilled tokens: the first, whose tokens come from the
        prompt's logits) is left out: it has no modelled work, only the bookkeeping's seconds."""
        return [{"decode_rows": r.decode_rows, "kv_tokens_read": r.kv_tokens_read, "prefill_tokens": r.prefill_tokens,
                 "prefill_context": r.prefill_context, "seconds": r.seconds} for r in self.records
                if r.decode_rows + r.prefill_tokens > 0]


class _Probe(SimPolicy):
    """Decode the first ``k`` tokens of every completion, ``cap`` at a time, then evict it (it keeps its
    tokens); completions that end within k tokens are simply collected."""

    name = "probe"

    def __init__(self, problem: Problem, k: int, cap: int):
        super().__init__(problem)
        self.k, self.cap, self.next = k, cap, 0

    def decide(self, eng: Engine) -> None:
        for job in list(eng.running):
            if eng.age(job) >= self.k:
                eng.preempt(job)
        while eng.live < self.cap and self.next < eng.n:
            eng.admit(self.next)
            self.next += 1

    def pending(self, eng: Engine) -> int:
        return eng.n - self.next


def model_memory(model: Any, block_size: int = 1, share_prompt_kv: bool = True,
                 compression: KVCompression | None = None) -> ModelMemory:
    """The ``lengthsched`` memory model of ``model`` as this sampler holds it (its dtype, its block size)."""
    dtype = next(model.parameters()).dtype
    if dtype not in _TORCH_DTYPES:
        raise InvalidArgument("model", str(dtype), "a model in float32, float64, bfloat16 or float16")
    name = _TORCH_DTYPES[dtype]
    return ModelMemory.from_hf_config(model.config.to_dict(), name, kv_dtype=name, block_size=block_size,
                                      prompt_kv="shared" if share_prompt_kv else "copied", compression=compression,
                                      weights_bytes=sum(p.numel() * p.element_size() for p in model.parameters()))


def _shape(model: Any) -> tuple[int, int, int]:
    cfg = model.config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return cfg.num_hidden_layers, kv_heads, head_dim


class InfiniteSampler:
    """Generate groups of completions on ``model`` (a ``transformers`` causal LM) under ``policy``.

    ``policy``: a simulator policy name (:data:`SAMPLER_POLICIES`): ``full`` (padded group),
    ``micro``, ``fixed_slot``, ``dynamic_slot`` (the biased negative control), ``length_aware``
    (plan by the FPTAS from predicted lengths, SJF refill; ``refill`` picks the rule),
    ``growth_aware``, ``vllm``, ``sglang``, ``reserve_max``, ... ``slots``: most sequences decoding at
    once. ``budget_bytes``: memory for the group (weights, activations and KV, as ``lengthsched``'s
    memory model counts them); converted to a KV token budget. ``predictor``: a
    ``lengthsched.LengthPredictor`` asked once per group (prompts: the prompt text when a
    ``tokenizer`` is given, else completion indices) for point predictions and the ``quantile``
    reserved. ``share_prompt_kv=False`` copies the prompt KV into every sequence (the baseline).

    ``probe_tokens`` k > 0 (default: the predictor's own ``config.k``, 0 without one): token-conditioned
    prediction for the length-aware policies. Every completion first decodes k tokens (in rounds
    that fit the slots and the budget); it is then evicted, keeping its tokens; the predictor is asked
    for its remaining length from the prompt and those k tokens; the plan is made from k + that; and
    the completions resume by it, recomputing the KV of their k tokens (counted as preemptions and
    recomputed tokens, and the probe's steps as decode steps).
    """

    def __init__(self, model: Any, *, policy: str = "fixed_slot", slots: int | None = None,
                 budget_bytes: int | None = None, predictor: Any = None, refill: str = "sjf",
                 share_prompt_kv: bool = True, tokenizer: Any = None, quantile: float = 0.9, eps: float = 0.05,
                 probe_tokens: int | None = None, kv_compression: KVCompression | None = None):
        if policy not in SAMPLER_POLICIES:
            raise InvalidArgument("policy", policy, "one of " + ", ".join(SAMPLER_POLICIES))
        if slots is not None:
            check_int("slots", slots, minimum=1)
        if budget_bytes is not None:
            check_int("budget_bytes", budget_bytes, minimum=1)
        if not hasattr(model, "config") or not hasattr(model, "set_attn_implementation"):
            raise InvalidArgument("model", type(model).__name__, "a transformers causal language model")
        if predictor is not None and not hasattr(predictor, "predict"):
            raise InvalidArgument("predictor", type(predictor).__name__, "an object with predict() "
                                  "(the lengthsched.LengthPredictor protocol)")
        self.model = model
        self.policy = policy
        self.slots = slots
        self.budget_bytes = budget_bytes
        self.predictor = predictor
        self.refill = refill
        self.share_prompt_kv = bool(share_prompt_kv)
        self.tokenizer = tokenizer
        self.quantile = quantile
        self.eps = eps
        self.layers, self.kv_heads, self.head_dim = _shape(model)
        if kv_compression is not None:
            if not isinstance(kv_compression, KVCompression):
                raise InvalidArgument("kv_compression", kv_compression, "a lengthsched.KVCompression(budget, interval)")
            if not share_prompt_kv or POLICIES[policy].cls.block_size > 1:
                raise InvalidArgument("kv_compression", kv_compression, "a shared prompt KV and token-granular KV "
                                      "(not with share_prompt_kv=False or the block-16 vllm policy)")
        self.kv_compression = kv_compression
        k = probe_tokens
        if k is None:  # a token-conditioned predictor says how many tokens it wants to see
            k = int(getattr(getattr(predictor, "config", None), "k", 0) or 0) if predictor is not None else 0
        self.probe_tokens = check_int("probe_tokens", k, minimum=0)
        if self.probe_tokens and (predictor is None or not policy.startswith("length_aware")):
            raise InvalidArgument("probe_tokens", self.probe_tokens, "0 unless a predictor is given and the policy is "
                                  "length_aware (the probe feeds the predictor the first tokens of every completion)")

    # ------------------------------------------------------------------------------ checks
    def _check(self, prompt_ids: Any, group_size: int, params: SamplingParams,
               force_lengths: Any, predicted_lengths: Any) -> tuple[list[int], np.ndarray | None, np.ndarray | None]:
        check_int("group_size", group_size, minimum=1)
        if isinstance(prompt_ids, torch.Tensor):
            prompt_ids = prompt_ids.view(-1).tolist()
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise InvalidArgument("prompt_ids", prompt_ids, "at least one token")
        vocab = self.model.config.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise InvalidArgument("prompt_ids", max(prompt), f"token ids in [0, {vocab})")
        context = getattr(self.model.config, "max_position_embeddings", None)
        if context is not None and len(prompt) + params.max_new_tokens > context:
            raise InvalidArgument("prompt_ids", f"{len(prompt)} tokens + max_new_tokens {params.max_new_tokens}",
                                  f"at most the model's context of {context} positions")
        forced = None
        if force_lengths is not None:
            forced = as_lengths("force_lengths", force_lengths, minimum=1)
            if len(forced) != group_size:
                raise InvalidArgument("force_lengths", len(forced), f"{group_size} lengths, one per completion")
            if forced.max() > params.max_new_tokens:
                raise InvalidArgument("force_lengths", int(forced.max()),
                                      f"at most max_new_tokens={params.max_new_tokens}")
            if not params.stop_token_ids:
                raise InvalidArgument("stop_token_ids", (), "a stop token to force at the target length")
        predicted = None
        if predicted_lengths is not None:
            predicted = as_lengths("predicted_lengths", predicted_lengths, minimum=1)
            if len(predicted) != group_size:
                raise InvalidArgument("predicted_lengths", len(predicted), f"{group_size}, one per completion")
        return prompt, forced, predicted

    def _stop_ids(self, stop_token_ids: Sequence[int] | None) -> tuple[int, ...]:
        if stop_token_ids is not None:
            return tuple(int(t) for t in stop_token_ids)
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            eos = getattr(self.model.config, "eos_token_id", None)
        if eos is None:
            return ()
        return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)

    def _queries(self, prompt: list[int], group_size: int) -> list:
        """What the predictor is asked about: the prompt (its tokens, for a predictor that learns
        online and must recognise the prompt again; else its text with a tokenizer), or indices."""
        if hasattr(self.predictor, "observe"):
            return [tuple(prompt)] * group_size
        if self.tokenizer is not None:
            return [self.tokenizer.decode(prompt)] * group_size
        return list(range(group_size))

    def _predictions(self, prompt: list[int], group_size: int, predicted: np.ndarray | None):
        if predicted is not None or self.predictor is None or self.probe_tokens:
            return predicted, None  # with a probe, the predictor is asked after the first k tokens
        out = self.predictor.predict(self._queries(prompt, group_size), quantiles=[self.quantile])
        return (np.maximum(1, np.asarray(out.lengths, dtype=np.int64)),
                np.maximum(1, np.asarray(out.quantile(self.quantile), dtype=np.int64)))

    # ------------------------------------------------------------------------------ run
    def sample_group(self, prompt_ids: Any, group_size: int, *, max_new_tokens: int, temperature: float = 1.0,
                     top_p: float = 1.0, top_k: int = 0, seed: int = 0, group_id: int = 0,
                     force_lengths: Any = None, predicted_lengths: Any = None,
                     stop_token_ids: Sequence[int] | None = None, record_steps: bool = True) -> SampleResult:
        """Generate ``group_size`` completions of ``prompt_ids`` (token ids). Lengths in tokens.

        ``force_lengths``: trace replay: completion i ends exactly at ``force_lengths[i]`` tokens (its
        stop token forced there and masked before). ``predicted_lengths``: the length-aware
        policies' predictions (else the sampler's predictor; else none). Every argument is checked
        before any compute.
        """
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=float(temperature), top_p=float(top_p),
                                top_k=top_k, stop_token_ids=self._stop_ids(stop_token_ids))
        prompt, forced, predicted = self._check(prompt_ids, group_size, params, force_lengths, predicted_lengths)
        check_int("seed", seed, minimum=0)
        check_int("group_id", group_id, minimum=0)
        P, G, L = len(prompt), group_size, params.max_new_tokens
        sim_name = self.policy
        block = POLICIES[sim_name].cls.block_size  # the vLLM models round KV to blocks of 16
        memory = model_memory(self.model, block, self.share_prompt_kv, self.kv_compression)
        tail = P if not self.share_prompt_kv else P % block  # prompt tokens each sequence holds itself
        kv_cap = None if self.kv_compression is None else self.kv_compression.max_retained  # admit by the sparse KV
        budget_tokens = self._budget_tokens(memory, P, G, (L if kv_cap is None else min(L, kv_cap)) + tail)
        point, reserve = self._predictions(prompt, G, predicted)
        truth = forced if forced is not None else np.full(G, L, dtype=np.int64)

        def stream(index: int) -> int:  # extra completions of the dynamic-slot control
            if forced is None:
                return L
            return int(forced[np.random.default_rng([seed, index]).integers(G)])

        online = hasattr(self.predictor, "observe") and predicted is None  # told of siblings as they finish
        problem = Problem(lengths=truth, max_new_tokens=L, prompt_len=P, slots=self.slots,
                          budget_tokens=budget_tokens, predicted=point, reserve=reserve, refill=self.refill,
                          eps=self.eps, stream=stream, predictor=self.predictor if online else None,
                          prompt_ids=tuple(self._queries(prompt, G)) if online else None, quantile=self.quantile,
                          kv_cap=kv_cap)
        policy = make_policy(sim_name, problem)  # raises on a missing slots / budget before any compute
        device = next(self.model.parameters()).device
        dtype = next(self.model.parameters()).dtype
        store = KVStore(self.layers, self.kv_heads, self.head_dim, dtype, device, block_size=block,
                        share_prompt=self.share_prompt_kv, compression=self.kv_compression)
        eng = Engine(truth, tails=[tail] * G if tail else None, block_size=block,
                     slots=self.slots if policy.respects_slots else None, budget_tokens=budget_tokens,
                     enforce_budget=policy.promises_budget and self.share_prompt_kv, kv_cap=kv_cap)
        first_policy, then = policy, None
        if self.probe_tokens and predicted is None:
            first_policy, then = self._probe_phase(problem, eng, prompt, budget_tokens, sim_name)
        previous = self.model.config._attn_implementation
        self.model.set_attn_implementation(register())
        cuda = device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        started = time.perf_counter()
        try:
            with torch.inference_mode():
                records, state, policy = self._run(first_policy, eng, store, prompt, params, forced, seed, group_id,
                                                   memory, then)
        finally:
            self.model.set_attn_implementation(previous)
        if cuda:
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - started
        return self._result(policy, eng, records, state, P, wall,
                            torch.cuda.max_memory_allocated(device) if cuda else None, record_steps)

    def _result(self, policy: SimPolicy, eng: Engine, records: list, state: tuple, P: int, wall: float,
                cuda_peak: int | None, record_steps: bool) -> SampleResult:
        """The collected completions (index order) and what the run measured."""
        collected = sorted(eng.collected)
        tokens, logps = state
        texts = None
        if self.tokenizer is not None:
            texts = [self.tokenizer.decode(tokens[j], skip_special_tokens=True) for j in collected]
        return SampleResult(
            policy=policy.name, completions=[tokens[j] for j in collected], logprobs=[logps[j] for j in collected],
            indices=collected, steps=eng.t, peak_kv_bytes=max((r.kv_bytes for r in records), default=0),
            peak_model_kv_bytes=max((r.model_kv_bytes for r in records), default=0), peak_kv_tokens=eng.peak_kv,
            preemptions=eng.preemptions, recomputed_tokens=eng.recomputed_tokens,
            discarded_tokens=eng.discarded_tokens, decoded_tokens=eng.decoded_tokens, prompt_tokens=P,
            wall_seconds=wall, cuda_peak_bytes=cuda_peak, records=records if record_steps else [], texts=texts)

    def _budget_tokens(self, memory: ModelMemory, P: int, G: int, one_sequence: int) -> int | None:
        """The group's KV token budget (None without ``budget_bytes``); raises if it cannot hold one
        whole sequence (``one_sequence`` tokens: max_new_tokens, or what a compressed cache keeps of
        it, and the prompt tail it holds)."""
        if self.budget_bytes is None:
            return None
        tokens = kv_budget_tokens(memory, self.budget_bytes, prompt_tokens=P, group_size=G, slots=self.slots)
        if tokens < one_sequence:
            raise InvalidArgument("budget_bytes", self.budget_bytes,
                                  f"room for one whole sequence: {one_sequence} KV tokens beyond the prompt "
                                  f"(max_new_tokens or the compressed cache's most, and the prompt tail), "
                                  f"the budget leaves {tokens}")
        return tokens

    def _forward(self, store: KVStore, rows: list[int], ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        store.rows = rows
        return self.model(input_ids=ids, position_ids=positions, use_cache=False, lengthsched_kv=store,
                          logits_to_keep=1).logits[:, -1]

    def _probe_phase(self, problem: Problem, eng: Engine, prompt: list[int], budget_tokens: int | None,
                     name: str):
        """The probe policy, and the callback that predicts from the probed tokens and starts the plan."""
        k, G, L = self.probe_tokens, problem.n, problem.max_new_tokens
        if k >= L:
            raise InvalidArgument("probe_tokens", k, f"fewer than max_new_tokens={L}")
        cap = min(G, self.slots or G, (budget_tokens // int(problem.held(k))) if budget_tokens is not None else G)
        probe = _Probe(problem, k, max(1, cap))

        def then(tokens: dict[int, list[int]]):
            point = np.full(G, L, dtype=np.int64)
            reserve = np.full(G, L, dtype=np.int64)
            live = [j for j in range(G) if not eng.finished_at[j]]
            for j in range(G):
                if eng.finished_at[j]:
                    point[j] = reserve[j] = len(tokens[j])
            if live:
                text = self.tokenizer.decode(prompt) if self.tokenizer is not None else None
                queries = [text] * len(live) if text is not None else live
                out = self.predictor.predict(queries, [tokens[j] for j in live], quantiles=[self.quantile])
                done = np.array([len(tokens[j]) for j in live], dtype=np.int64)
                point[live] = done + np.maximum(1, np.asarray(out.lengths, dtype=np.int64))
                reserve[live] = done + np.maximum(1, np.asarray(out.quantile(self.quantile), dtype=np.int64))
            main = make_policy(name, replace(problem, predicted=np.minimum(point, L), reserve=np.minimum(reserve, L)))
            eng.start(main)
            for j in range(G):
                if eng.finished_at[j]:
                    main.sched.take(j)  # ended inside the probe: nothing left to schedule
            return main

        return probe, then

    def _run(self, policy, eng: Engine, store: KVStore, prompt: list[int], params: SamplingParams,
             forced: np.ndarray | None, seed: int, group_id: int, memory: ModelMemory, then: Any = None):
        """Drive ``policy`` through the engine, one real decode step at a time (see the module doc)."""
        run = _GroupRun(self, eng, store, prompt, params, forced, seed, group_id, memory)
        eng.start(policy)
        while True:
            more = eng.decide(policy)
            run.close_freed()  # preempted or released
            if not more:
                if then is not None and not eng.stopped:  # the probe is over: predict and plan, then run it
                    policy, then = then(run.tokens), None
                    continue
                break
            fresh, step_rows = run.split_rows()
            started = run.clock()
            prefill, context = run.admit(fresh)
            run.decode(step_rows)
            run.account(policy, started, step_rows, prefill_tokens=prefill, prefill_context=context)
        return run.records, (run.tokens, run.logps), policy


class _GroupRun:
    """The state of one group being generated, and the three parts of a step: admit (first tokens
    and recomputation), decode (one batched forward of the live rows), account (KV, records, time)."""

    def __init__(self, sampler: InfiniteSampler, eng: Engine, store: KVStore, prompt: list[int],
                 params: SamplingParams, forced: np.ndarray | None, seed: int, group_id: int, memory: ModelMemory):
        self.sampler, self.eng, self.store, self.params, self.forced = sampler, eng, store, params, forced
        self.seed, self.group_id, self.memory = seed, group_id, memory
        self.device = store.device
        self.P = len(prompt)
        self.cuda = self.device.type == "cuda"
        self.stops = set(params.stop_token_ids)
        self.pad = params.stop_token_ids[0] if params.stop_token_ids else 0
        self.tokens: dict[int, list[int]] = {}
        self.logps: dict[int, list[float]] = {}
        self.gens: dict[int, torch.Generator] = {}
        self.records: list[StepRecord] = []
        store.mode = "prefill"
        started = self.clock()
        ids = torch.tensor([prompt], device=self.device)
        self.first = sampler._forward(store, [], ids, torch.arange(self.P, device=self.device).view(1, self.P))
        store.mode = "extend"
        self.first_lp = processed_logprobs(self.first, params)[0].cpu()
        self.first_raw = self.first[0].cpu()
        self.prefill_seconds = self.clock() - started  # the prompt's prefill, before step 1

    def clock(self) -> float:
        """Wall time (seconds), after the GPU's queued work is done."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def split_rows(self) -> tuple[list[int], list[int]]:
        """(rows admitted for the coming step, live rows that already hold their KV)."""
        slots, origin = self.store.slots, self.eng.origin
        return sorted(j for j in origin if j not in slots), sorted(j for j in origin if j in slots)

    def close_freed(self) -> None:
        """Drop the KV of every slot whose sequence is no longer live (finished, preempted, released)."""
        for job in [j for j in self.store.slots if j not in self.eng.origin]:
            self.store.close_slot(job)

    def sample(self, job: int, row_lp: torch.Tensor, raw: torch.Tensor | None) -> None:
        """Draw ``job``'s next token from its own stream (forced to stop at its length in replay)."""
        params, forced, eng = self.params, self.forced, self.eng
        toks = self.tokens[job]
        n = len(toks) + 1  # the token drawn now is the n-th
        lp = row_lp
        if forced is not None:
            target = int(eng.length[job])  # spawned completions of the dynamic-slot control too
            if n == target:  # replay: the stop token is forced here
                tok = self.pad
                base = torch.log_softmax(raw.double() / max(params.temperature, 1e-6), -1) if raw is not None \
                    else row_lp
                toks.append(tok)
                self.logps[job].append(float(base[tok]))
                eng.finish(job, eng.t + 1)
                return
            lp = row_lp.clone()
            lp[list(self.stops)] = float("-inf")  # no early end before the target
            lp = lp - torch.logsumexp(lp, -1)
        tok = draw(lp, self.gens[job])
        toks.append(tok)
        self.logps[job].append(float(lp[tok]))
        if tok in self.stops or n >= params.max_new_tokens:
            eng.finish(job, eng.t + 1)

    def admit(self, fresh: list[int]) -> tuple[int, int]:
        """Open the KV of newly admitted rows: a new completion draws its first token from the
        prompt's last logits (no forward); one readmitted after a preemption recomputes its KV in a
        forward of its own tokens, then draws its next. Returns the tokens prefilled (recomputed)
        and the (query, key) pairs they attend (the prompt, causally each other)."""
        store, device, prefill, context = self.store, self.device, 0, 0
        for job in fresh:
            store.open_slot(job)
            if job not in self.gens:
                self.gens[job] = make_generator(self.seed, self.group_id, job)
                self.tokens[job], self.logps[job] = [], []
            if not self.tokens[job]:
                self.sample(job, self.first_lp, self.first_raw)
                continue
            done = self.tokens[job]
            n = len(done)  # before sample() appends the next token to the same list
            prefill += n
            context += n * self.P + n * (n + 1) // 2
            store.make_room(job, len(done))
            logits = self.sampler._forward(store, [job], torch.tensor([done], device=device),
                                           (self.P + torch.arange(len(done), device=device)).view(1, -1))
            self.sample(job, processed_logprobs(logits, self.params)[0].cpu(), logits[0].cpu())
        return prefill, context

    def decode(self, rows: list[int]) -> None:
        """One batched forward of every live row's last token at its own position (padded rows feed
        the pad token, as a padded batch does); running rows sample their next token."""
        if not rows:
            return
        eng, device = self.eng, self.device
        inputs, positions = [], []
        for j in rows:
            inputs.append(self.tokens[j][-1] if j in eng.running else self.pad)
            positions.append(self.P + (eng.t - eng.origin[j]) - 1)  # the fed token is the age-th
        logits = self.sampler._forward(self.store, rows, torch.tensor(inputs, device=device).view(-1, 1),
                                       torch.tensor(positions, device=device).view(-1, 1))
        running_rows = [i for i, j in enumerate(rows) if j in eng.running]
        if running_rows:
            lp = processed_logprobs(logits[running_rows], self.params).cpu()
            raw = logits[running_rows].cpu()
            for k, i in enumerate(running_rows):
                self.sample(rows[i], lp[k], raw[k])

    def account(self, policy: SimPolicy, started: float, rows: list[int], *, prefill_tokens: int,
                prefill_context: int) -> None:
        """Allocate the KV of every live row's newest token, record the step (measured bytes next to
        the memory model's; measured seconds next to what the step did), advance the engine one
        step and free what finished. ``rows``: the rows of the batched decode forward."""
        eng, store = self.eng, self.store
        nxt = eng.t + 1
        for j in eng.origin:  # every live row now holds KV for each token it generated
            store.reserve(j, nxt - eng.origin[j])
        ages = [nxt - eng.origin[j] for j in eng.origin]
        # KV the decode forward read: each row's prompt tail and the tokens it generated before this step
        # (the one it feeds included), the shared prompt once (the shared-prefix attention reads it once).
        own = sum(nxt - eng.origin[j] - 1 + store.tail for j in rows)
        kv_read = own + (store.shared_len if rows else 0)
        seconds = self.clock() - started
        self.records.append(StepRecord(nxt, len(eng.origin), len(eng.running), store.held_bytes(),
                                       self.memory.group_kv_bytes(ages, self.P), eng.kv_tokens(nxt),
                                       decode_rows=len(rows), kv_tokens_read=kv_read,
                                       prefill_tokens=prefill_tokens, seconds=seconds,
                                       prefill_context=prefill_context))
        eng.step(policy.pads)
        self.close_freed()  # finished (freed at once unless the policy pads)
