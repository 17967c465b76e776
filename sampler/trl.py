"""TRL integration: ``GRPOTrainer(rollout_func=...)`` generating every group with the reference sampler.

TRL's ``GRPOTrainer`` (pinned: trl 1.16.0) takes an experimental ``rollout_func(prompts, trainer) ->
dict`` in place of its own generation. It receives the prompts of this process's generation batch as
the ``RepeatSampler`` drew them: each prompt repeated ``num_generations`` (G) times in a row. It must
return, one row per received prompt, ``prompt_ids``, ``completion_ids`` and ``logprobs`` (lists of
token ids / floats); TRL pads them, decodes the completions for the reward functions and scores
them with the trainer's model for the loss.

:func:`make_rollout_func` builds such a function. It folds the repeated prompts back into groups,
runs :meth:`~sampler.core.InfiniteSampler.sample_group` once per group (micro groups, continuous
refill, the length-aware plan, under a memory budget: any sampler policy but the biased
``dynamic_slot`` control) and returns what TRL expects:

- **Weights.** The sampler runs the trainer's own model object (``trainer.model`` unwrapped), which
  the optimizer updates in place, so every rollout samples from the current weights; no copy, no
  sync. A model or sampler passed to the factory must be that same object (checked at each call).
  Sharded models (FSDP, DeepSpeed ZeRO-3) are not supported: the sampler needs the whole weights.
- **Random streams.** Completion j of a group draws from its own stream seeded by (seed, group id,
  j) (:mod:`sampler.sampling`), so its tokens do not depend on the schedule: the ``full`` policy (all
  G decoded at once) and a budgeted ``length_aware`` run give the same completions, hence the same
  training. The group id is :func:`rollout_group_id` of the generation (``train``: the trainer's
  micro-step counter at generation time; ``eval``: the count of evaluation rollouts so far) and the
  group's place in the global generation batch: distinct across steps and groups, and the same in
  a rerun with the same seed. The seed is ``seed`` or ``trainer.args.seed``.
- **Sampling settings.** ``max_new_tokens``, ``temperature``, ``top_p``, ``top_k`` default to the
  trainer's (``max_completion_length``, ...); completions end at ``trainer.eos_token_ids`` (the ids
  TRL's own generation stops at); ``logprobs`` are of the sampling distribution after those controls.
  Settings the sampler cannot honour (``min_p``, ``repetition_penalty``, ``generation_kwargs``,
  images) raise :class:`~lengthsched.errors.InvalidArgument`.
- **Tokenisation.** TRL's own (``trainer._tokenize_prompts``: the chat template for conversational
  prompts, tools, ``chat_template_kwargs``), or ``tokenizer`` when given, applied with the same
  rule from the trainer's public ``chat_template``, ``tools`` and ``chat_template_kwargs``.

For TRL's own vLLM generation (``use_vllm=True``) see
:func:`lengthsched.integrations.trl_vllm.make_vllm_rollout_func`: the plan's priorities through the
trainer's vLLM engine instead of this reference sampler.

The rest of this module is a verifiable toy task for an end-to-end GRPO run on a CPU, fully offline
(a word-level tokenizer trained with ``tokenizers``, a tiny Qwen3 built from a config, one-digit
sums rewarded when the completion contains the answer): :func:`run_toy_grpo`, used by
``benchmarks/bench_grpo.py``, the tests and docs/howto-trl.md.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lengthsched.errors import InvalidArgument, check_int
from lengthsched.integrations.trl_vllm import fold_groups, tokenize_like_trl

__all__ = [
    "TRL_VERSION",
    "GroupRecord",
    "RolloutCall",
    "SamplerRollout",
    "ToyRun",
    "make_rollout_func",
    "rollout_group_id",
    "run_toy_grpo",
    "toy_budget_bytes",
    "toy_dataset",
    "toy_model",
    "toy_reward",
    "toy_tokenizer",
    "toy_trainer",
]

TRL_VERSION = "1.16.0"  # the version the contract below was read from and tested with
_INSTALL = f"pip install trl=={TRL_VERSION} (the trl extra: pip install 'lengthsched[trl]')"


def require_trl() -> Any:
    """Import ``trl``, or raise one clear line saying how to install it."""
    try:
        import trl
    except ImportError as exc:
        raise ImportError(f"{exc.name or 'trl'} is not installed: the TRL rollout needs it ({_INSTALL})") from None
    return trl


def rollout_group_id(mode: str, generation: int, group: int) -> int:
    """The sampler's group id for group ``group`` of generation ``generation`` in ``mode``
    (``train``/``eval``): 62 bits of BLAKE2b of ``"mode:generation:group"``, stable across processes."""
    digest = hashlib.blake2b(f"{mode}:{generation}:{group}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


@dataclass(frozen=True)
class GroupRecord:
    """One group the rollout sampled: ``group`` is its number in the global generation batch,
    ``size`` the completions sampled (G, or fewer where processes split a group), ``result`` the
    sampler's :class:`~sampler.core.SampleResult` (without per-step records)."""

    mode: str
    generation: int
    group: int
    group_id: int
    size: int
    result: Any = field(repr=False)


@dataclass(frozen=True)
class RolloutCall:
    """One call of the rollout by the trainer: its groups, the optimizer step it ran at and its wall
    time (tokenisation and sampling)."""

    mode: str
    global_step: int
    groups: list[GroupRecord]
    wall_seconds: float

    @property
    def peak_kv_bytes(self) -> int:
        """Groups run one after another, so the call's peak KV is its largest group's."""
        return max((g.result.peak_kv_bytes for g in self.groups), default=0)


_UNSUPPORTED = (("min_p", None), ("repetition_penalty", 1.0))


class SamplerRollout:
    """A ``rollout_func`` for TRL's ``GRPOTrainer`` backed by :class:`~sampler.core.InfiniteSampler`
    (see the module docstring; built by :func:`make_rollout_func`). ``calls`` keeps one
    :class:`RolloutCall` per call (``keep_history=False`` keeps none)."""

    def __init__(self, model_or_sampler: Any = None, tokenizer: Any = None, *, policy: str | None = None,
                 slots: int | None = None, budget_bytes: int | None = None, predictor: Any = None,
                 refill: str = "sjf", share_prompt_kv: bool = True, max_new_tokens: int | None = None,
                 temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
                 seed: int | None = None, keep_history: bool = True):
        from .core import InfiniteSampler
        from .sampling import SamplingParams

        self._sampler = None
        self._model = None
        if isinstance(model_or_sampler, InfiniteSampler):
            given = {"policy": policy, "slots": slots, "budget_bytes": budget_bytes, "predictor": predictor}
            for name, value in given.items():
                if value is not None:
                    raise InvalidArgument(name, value, "None with an InfiniteSampler (it carries its own settings)")
            self._sampler, self._model = model_or_sampler, model_or_sampler.model
            policy = model_or_sampler.policy
        policy = policy or "length_aware"
        options = {"policy": policy, "slots": slots, "budget_bytes": budget_bytes, "predictor": predictor,
                   "refill": refill, "share_prompt_kv": share_prompt_kv}
        if self._sampler is None and model_or_sampler is not None:
            if not hasattr(model_or_sampler, "config") or not hasattr(model_or_sampler, "parameters"):
                raise InvalidArgument("model_or_sampler", type(model_or_sampler).__name__,
                                      "the trainer's model, an InfiniteSampler on it, or None (the trainer's model)")
            self._model = model_or_sampler
        if policy == "dynamic_slot":
            raise InvalidArgument("policy", policy, "a policy that returns all G completions of a group "
                                  "(dynamic_slot keeps the first G to finish: biased to short completions)")
        self._options = options
        if self._sampler is None:
            _check_policy(policy, slots, budget_bytes, refill)
            if self._model is not None:  # every option checked now, not at the first training step
                InfiniteSampler(self._model, **options)
            elif predictor is not None and not hasattr(predictor, "predict"):
                raise InvalidArgument("predictor", type(predictor).__name__, "an object with predict() "
                                      "(the lengthsched.LengthPredictor protocol)")
        for name, value in (("max_new_tokens", max_new_tokens), ("top_k", top_k)):
            if value is not None:
                check_int(name, value, minimum=0 if name == "top_k" else 1)
        SamplingParams(max_new_tokens=max_new_tokens or 1, top_k=top_k or 0,
                       temperature=1.0 if temperature is None else float(temperature),
                       top_p=1.0 if top_p is None else float(top_p))
        if seed is not None:
            check_int("seed", seed, minimum=0)
        self.tokenizer = tokenizer
        self.max_new_tokens, self.temperature, self.top_p, self.top_k = max_new_tokens, temperature, top_p, top_k
        self.seed = seed
        self.keep_history = bool(keep_history)
        self.calls: list[RolloutCall] = []
        self._eval_calls = 0

    # ------------------------------------------------------------------ the trainer's state
    def sampler_for(self, trainer: Any) -> Any:
        """The sampler on the trainer's current model (built once; the same object every step)."""
        from .core import InfiniteSampler

        model = trainer.accelerator.unwrap_model(trainer.model)
        if self._model is not None and self._model is not model:
            raise InvalidArgument("model_or_sampler", type(self._model).__name__,
                                  "the trainer's own model object (trainer.model): another copy would sample from "
                                  "stale weights")
        if self._sampler is None or self._sampler.model is not model:
            self._sampler = InfiniteSampler(model, tokenizer=getattr(trainer, "processing_class", None),
                                            **self._options)
        return self._sampler

    def _params(self, trainer: Any) -> dict:
        args = trainer.args
        for name, neutral in _UNSUPPORTED:
            value = getattr(args, name, neutral)
            if value is not None and value != neutral:
                raise InvalidArgument(f"args.{name}", value, f"{neutral} (the sampler does not implement {name})")
        if getattr(args, "generation_kwargs", None):
            raise InvalidArgument("args.generation_kwargs", args.generation_kwargs,
                                  "None (the sampler takes max_new_tokens, temperature, top_p and top_k only)")
        return {
            "max_new_tokens": self.max_new_tokens or args.max_completion_length,
            "temperature": args.temperature if self.temperature is None else self.temperature,
            "top_p": (args.top_p if args.top_p is not None else 1.0) if self.top_p is None else self.top_p,
            "top_k": (args.top_k or 0) if self.top_k is None else self.top_k,
            "seed": args.seed if self.seed is None else self.seed,
            "stop_token_ids": list(getattr(trainer, "eos_token_ids", None) or [trainer.processing_class.eos_token_id]),
        }

    def _tokenize(self, prompts: list, trainer: Any) -> list[list[int]]:
        """TRL's tokenisation (``lengthsched.integrations.trl_vllm.tokenize_like_trl``): the trainer's
        own ``_tokenize_prompts``, or with ``tokenizer`` the same rule from the trainer's public
        ``chat_template``, ``tools`` and ``chat_template_kwargs``."""
        return tokenize_like_trl(prompts, trainer, self.tokenizer)

    # ------------------------------------------------------------------ the rollout
    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, list]:
        started = time.perf_counter()
        prompts = list(prompts)
        if not prompts:
            raise InvalidArgument("prompts", prompts, "at least one prompt")
        sampler = self.sampler_for(trainer)
        model = sampler.model
        mode = "train" if model.training else "eval"
        G = trainer.num_generations if mode == "train" else trainer.num_generations_eval
        if mode == "train":
            generation = int(getattr(trainer, "_step", trainer.state.global_step))
        else:
            generation, self._eval_calls = self._eval_calls, self._eval_calls + 1
        params = self._params(trainer)
        runs = _runs(prompts, G, trainer.accelerator.process_index * len(prompts))
        tokenized = self._tokenize(prompts, trainer)  # all of them: TRL aligns per-prompt tools with the batch
        ids = [tokenized[start] for start, _, _ in runs]
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        records = []
        was_training = model.training
        model.eval()  # no dropout while sampling; TRL decided train/eval above from the same flag
        try:
            for (start, stop, group), prompt_ids in zip(runs, ids):
                group_id = rollout_group_id(mode, generation, group)
                res = sampler.sample_group(prompt_ids, stop - start, group_id=group_id, record_steps=False, **params)
                out["prompt_ids"] += [list(prompt_ids) for _ in res.completions]
                out["completion_ids"] += res.completions
                out["logprobs"] += res.logprobs
                records.append(GroupRecord(mode, generation, group, group_id, stop - start, res))
        finally:
            model.train(was_training)
        if self.keep_history:
            self.calls.append(RolloutCall(mode, int(trainer.state.global_step), records,
                                          time.perf_counter() - started))
        return out

    @property
    def peak_kv_bytes(self) -> int:
        """The largest KV any group held over the kept calls (measured by the sampler)."""
        return max((c.peak_kv_bytes for c in self.calls), default=0)

    @property
    def sampling_seconds(self) -> float:
        """Wall time of the kept calls (tokenisation and sampling)."""
        return sum(c.wall_seconds for c in self.calls)


def _check_policy(policy: str, slots: int | None, budget_bytes: int | None, refill: str) -> None:
    """Raise now, not at the first training step, when the policy lacks the slots or budget it needs."""
    from lengthsched.refill import parse_rule
    from lengthsched.runtime import Problem, make_policy, policy_names

    parse_rule(refill)
    training = policy_names(sampler=True, unbiased=True)  # not the biased stop-at-G control
    if policy not in training and policy != "dynamic_slot":
        raise InvalidArgument("policy", policy, "one of " + ", ".join(training))
    if slots is not None:
        check_int("slots", slots, minimum=1)
    if budget_bytes is not None:
        check_int("budget_bytes", budget_bytes, minimum=1)
    problem = Problem(lengths=np.ones(1, dtype=np.int64), max_new_tokens=1, slots=slots,
                      budget_tokens=None if budget_bytes is None else 1, refill=refill)
    try:
        make_policy(policy, problem)
    except InvalidArgument as exc:
        name = "budget_bytes" if exc.name == "budget_tokens" else exc.name
        raise InvalidArgument(name, exc.value, exc.expected.replace("budget_tokens", "budget_bytes")) from None


def _runs(prompts: list, group_size: int, offset: int) -> list[tuple[int, int, int]]:
    """(start, stop, group) of each group in ``prompts``: position ``offset + i`` of the global
    generation batch belongs to group ``(offset + i) // G``; every prompt of a group must be equal
    (``lengthsched.integrations.trl_vllm.fold_groups``)."""
    return fold_groups(prompts, group_size, offset)


def make_rollout_func(model_or_sampler: Any = None, tokenizer: Any = None, *, policy: str | None = None,
                      slots: int | None = None, budget_bytes: int | None = None, predictor: Any = None,
                      refill: str = "sjf", share_prompt_kv: bool = True, max_new_tokens: int | None = None,
                      temperature: float | None = None, top_p: float | None = None, top_k: int | None = None,
                      seed: int | None = None, keep_history: bool = True) -> SamplerRollout:
    """A ``rollout_func`` for ``trl.GRPOTrainer`` that samples every group with the reference sampler.

    ``model_or_sampler``: None (the trainer's model, the usual choice), the trainer's model itself,
    or an :class:`~sampler.core.InfiniteSampler` on it (its own policy settings). ``policy`` (None:
    ``length_aware``), ``slots``, ``budget_bytes`` (weights + activations + KV, as :class:`InfiniteSampler` counts
    them), ``predictor``, ``refill``, ``share_prompt_kv``: the sampler's. Sampling settings left
    None come from ``trainer.args``; ``seed`` None is ``trainer.args.seed``. ``tokenizer`` None
    tokenises as TRL does. Bad arguments raise :class:`~lengthsched.errors.InvalidArgument` here;
    a missing ``trl`` raises ImportError naming the install command.
    """
    require_trl()
    return SamplerRollout(model_or_sampler, tokenizer, policy=policy, slots=slots, budget_bytes=budget_bytes,
                          predictor=predictor, refill=refill, share_prompt_kv=share_prompt_kv,
                          max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                          seed=seed, keep_history=keep_history)


# ====================================================================== the toy task
_TOY_SPECIALS = ["[PAD]", "[EOS]", "[UNK]"]


def toy_tokenizer() -> Any:
    """A character-level ``PreTrainedTokenizerFast`` trained with ``tokenizers`` (WordLevel) on the
    toy's text: digits, ``+``, ``=`` and ``[PAD]``, ``[EOS]``, ``[UNK]`` (15 ids). Offline."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    corpus = [f"{a}+{b}={a + b}" for a in range(10) for b in range(10)]
    tok.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=_TOY_SPECIALS))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", eos_token="[EOS]", unk_token="[UNK]")


def toy_model(tokenizer: Any, *, dtype: Any = None, seed: int = 0, hidden_size: int = 64, layers: int = 2) -> Any:
    """A randomly initialised Qwen3 causal LM (``layers`` layers, 4 query heads, 2 KV heads of 16 dims)
    over ``tokenizer``'s vocabulary, built from a config (no download); ``dtype`` e.g. torch.float64."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=hidden_size // 4, max_position_embeddings=256, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(config)
    return model.to(dtype) if dtype is not None else model


def toy_dataset(n: int = 64, seed: int = 0) -> Any:
    """``n`` prompts ``"a+b="`` (one-digit sums below 10) with their ``answer`` digit, as a
    ``datasets.Dataset`` (columns ``prompt``, ``answer``)."""
    from datasets import Dataset

    check_int("n", n, minimum=1)
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a = rng.randrange(10)
        b = rng.randrange(10 - a)
        rows.append({"prompt": f"{a}+{b}=", "answer": str(a + b)})
    return Dataset.from_list(rows)


def toy_reward(completions: list[str], answer: list[str], **kwargs: Any) -> list[float]:
    """1.0 when the completion contains the answer digit, else 0.0 (a TRL reward function)."""
    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]


def toy_budget_bytes(model: Any, *, kv_tokens: int, prompt_tokens: int, group_size: int) -> int:
    """The ``budget_bytes`` of :class:`InfiniteSampler` that leaves ``kv_tokens`` KV tokens beyond the
    shared prompt next to the weights, the prompt KV and a batch of ``group_size`` (the inverse of
    ``ModelMemory.kv_token_budget``)."""
    from .core import model_memory

    memory = model_memory(model)
    tokens = check_int("kv_tokens", kv_tokens, minimum=1)
    return memory.total_bytes(memory.prompt_kv_bytes(prompt_tokens) + tokens * memory.kv_bytes_per_token, group_size)


@dataclass
class ToyRun:
    """One toy GRPO run: per optimizer step the loss, mean reward, gradient norm and the completions
    (token ids, in the order of the generation batch); the sampler's peak KV bytes and its sampling
    time; the training wall time and the process's peak resident memory over the run
    (``None`` where the kernel's peak counter cannot be reset)."""

    policy: str
    budget_bytes: int | None
    losses: list[float]
    rewards: list[float]
    grad_norms: list[float]
    completions: list[list[list[int]]]
    peak_kv_bytes: int
    sampling_seconds: float
    wall_seconds: float
    peak_rss_bytes: int | None
    preemptions: int
    decode_steps: int
    model: Any = field(default=None, repr=False)

    def summary(self) -> dict:
        """JSON-ready fields (no model)."""
        return {k: v for k, v in self.__dict__.items() if k != "model"}


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # Linux: resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def _peak_rss() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def toy_trainer(rollout: Any, output_dir: str | Path, *, steps: int = 2, group_size: int = 8,
                prompts_per_step: int = 2, max_new_tokens: int = 16, dtype: str = "float32", seed: int = 0,
                learning_rate: float = 1e-2, hidden_size: int = 64, layers: int = 2,
                grpo_kwargs: dict | None = None) -> Any:
    """A ``trl.GRPOTrainer`` on the toy task (CPU, no logging, nothing saved to ``output_dir``) whose
    groups come from ``rollout``: ``group_size`` completions of ``prompts_per_step`` prompts per
    optimizer step, for ``steps`` steps; model and data order seeded by ``seed``. ``grpo_kwargs``:
    further ``GRPOConfig`` fields (e.g. ``use_vllm=True`` with a vLLM rollout)."""
    import warnings

    import torch
    from transformers import PrinterCallback

    trl = require_trl()
    dtypes = {"float32": torch.float32, "float64": torch.float64}
    if dtype not in dtypes:
        raise InvalidArgument("dtype", dtype, "float32 or float64")
    check_int("steps", steps, minimum=1)
    check_int("group_size", group_size, minimum=2)
    check_int("prompts_per_step", prompts_per_step, minimum=1)
    tokenizer = toy_tokenizer()
    model = toy_model(tokenizer, dtype=dtypes[dtype], seed=seed, hidden_size=hidden_size, layers=layers)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*rollout_func.*experimental")
        warnings.filterwarnings("ignore", message=".*gradient_checkpointing.* is deprecated", category=FutureWarning)
        args = trl.GRPOConfig(
            output_dir=str(output_dir), report_to="none", use_cpu=True, bf16=False, seed=seed,
            per_device_train_batch_size=group_size * prompts_per_step, num_generations=group_size,
            max_completion_length=max_new_tokens, max_steps=steps, learning_rate=learning_rate, logging_steps=1,
            save_strategy="no", gradient_checkpointing=False, disable_tqdm=True, dataloader_num_workers=0,
            **(grpo_kwargs or {}))
        trainer = trl.GRPOTrainer(model=model, reward_funcs=toy_reward, args=args, processing_class=tokenizer,
                                  train_dataset=toy_dataset(max(64, steps * prompts_per_step), seed),
                                  rollout_func=rollout)
    trainer.remove_callback(PrinterCallback)  # the logs are in trainer.state.log_history, not printed
    return trainer


def run_toy_grpo(policy: str = "full", *, steps: int = 2, group_size: int = 8, prompts_per_step: int = 2,
                 max_new_tokens: int = 16, budget_bytes: int | None = None, slots: int | None = None,
                 predictor: Any = None, dtype: str = "float32", seed: int = 0, learning_rate: float = 1e-2,
                 hidden_size: int = 64, layers: int = 2, threads: int | None = 1) -> ToyRun:
    """Train the toy model with ``trl.GRPOTrainer`` (:func:`toy_trainer`) for ``steps`` optimizer
    steps, every group sampled by :func:`make_rollout_func` with ``policy`` (``full``: all G at once,
    the reference).

    Everything is built offline and seeded by ``seed`` (model, data order, completion streams), so
    two runs that sample the same completions train identically. ``dtype``: float32 or float64.
    ``threads``: torch's intra-op threads during the run (restored after; None leaves them): one
    thread keeps a tiny model's timings steady on a shared machine.
    """
    import tempfile
    import warnings

    import torch

    rollout = make_rollout_func(policy=policy, slots=slots, budget_bytes=budget_bytes, predictor=predictor)
    previous = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*gradient_checkpointing.* is deprecated", category=FutureWarning)
        trainer = toy_trainer(rollout, tmp, steps=steps, group_size=group_size, prompts_per_step=prompts_per_step,
                              max_new_tokens=max_new_tokens, dtype=dtype, seed=seed, learning_rate=learning_rate,
                              hidden_size=hidden_size, layers=layers)
        if threads is not None:
            torch.set_num_threads(check_int("threads", threads, minimum=1))
        reset = _reset_peak_rss()
        started = time.perf_counter()
        try:
            trainer.train()
        finally:
            wall = time.perf_counter() - started
            torch.set_num_threads(previous)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    groups = [g for c in rollout.calls for g in c.groups]
    return ToyRun(
        policy=policy, budget_bytes=budget_bytes, losses=[float(h["loss"]) for h in logs],
        rewards=[float(h["reward"]) for h in logs], grad_norms=[float(h["grad_norm"]) for h in logs],
        completions=[[c for g in call.groups for c in g.result.completions] for call in rollout.calls],
        peak_kv_bytes=rollout.peak_kv_bytes, sampling_seconds=rollout.sampling_seconds, wall_seconds=wall,
        peak_rss_bytes=_peak_rss() if reset else None, preemptions=sum(g.result.preemptions for g in groups),
        decode_steps=sum(g.result.steps for g in groups), model=trainer.model)
