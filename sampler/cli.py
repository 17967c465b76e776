"""``lengthsched sample``: one group on a real model, with the policy's steps, memory and speed.

Models: a Hugging Face causal LM name or local directory, or a Qwen3 built from a config with random
weights, offline (:data:`~sampler.options.CONFIG_MODELS`): ``tiny-qwen3`` (4 layers, hidden 256, a
byte vocabulary; what the tests and CPU benchmarks run), ``random-qwen3-0.6b`` and
``random-qwen3-1.7b`` (exactly the public shapes of Qwen/Qwen3-0.6B and Qwen/Qwen3-1.7B: 28
layers, 16 query heads, 8 KV heads of 128 dims, vocabulary 151936, tied embeddings). The random
models' text is gibberish; their compute, KV and memory are those of the real models. They use the
byte tokenizer (:class:`ByteTokenizer`: ids 0..255 and EOS 256, valid ids of either vocabulary)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from lengthsched.errors import InvalidArgument
from lengthsched.io import atomic_write_text
from lengthsched.memory import KVCompression, parse_bytes
from lengthsched.runtime import POLICIES

from .options import (
    CONFIG_MODELS,
    MAX_GROUP_SIZE,
    PREDICTING_POLICIES,
    SAMPLE_POLICIES,
    TINY_MODEL,
    UNPREDICTED_POLICIES,
    SampleOptions,
)

__all__ = ["run_sample", "tiny_qwen3", "qwen3_config", "qwen3_from_config", "ByteTokenizer", "load_model"]


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255, EOS = 256: the offline tiny model's tokenizer."""

    eos_token_id = 256
    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


# The shapes of the Qwen3 models built from a config (random weights). The random-* entries are the
# public config.json of Qwen/Qwen3-0.6B and Qwen/Qwen3-1.7B (rope_theta 1e6, 40960 positions, RMSNorm
# eps 1e-6, tied embeddings, no sliding window); only the EOS id is the byte tokenizer's.
_QWEN3_COMMON: dict[str, Any] = {
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6,
}
_QWEN3_SHAPES: dict[str, dict[str, Any]] = {
    TINY_MODEL: {"vocab_size": ByteTokenizer.vocab_size, "hidden_size": 256, "intermediate_size": 768,
                 "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32,
                 "max_position_embeddings": 8192},
    "random-qwen3-0.6b": {**_QWEN3_COMMON, "hidden_size": 1024, "intermediate_size": 3072},
    "random-qwen3-1.7b": {**_QWEN3_COMMON, "hidden_size": 2048, "intermediate_size": 6144},
}


def qwen3_config(name: str, **overrides: Any) -> Any:
    """The ``Qwen3Config`` of a model built from a config (:data:`~sampler.options.CONFIG_MODELS`);
    ``overrides`` replace fields (a scaled-down copy for tests). Allocates nothing."""
    from transformers import Qwen3Config

    if name not in _QWEN3_SHAPES:
        raise InvalidArgument("model", name, "one of " + ", ".join(CONFIG_MODELS))
    fields = {**_QWEN3_SHAPES[name], "tie_word_embeddings": True, "use_sliding_window": False,
              "sliding_window": None, "eos_token_id": ByteTokenizer.eos_token_id, **overrides}
    return Qwen3Config(**fields)


def qwen3_from_config(config: Any, dtype: Any = None, device: Any = None, seed: int = 0) -> Any:
    """A ``Qwen3ForCausalLM`` of ``config`` with random weights (seeded), in eval mode, created directly on
    ``device`` in ``dtype`` (torch's default dtype is set for the construction and restored): no float32
    copy and no host-to-device transfer of a large model."""
    import torch
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        with torch.device(device if device is not None else "cpu"):
            model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def tiny_qwen3(dtype: Any = None, seed: int = 0) -> Any:
    """A randomly initialised Qwen3-shaped causal LM (4 layers, hidden 256, 8 heads, 4 KV heads of
    32 dims, byte vocabulary) built from a config: no download. Its text is gibberish; its compute
    and memory are real."""
    return qwen3_from_config(qwen3_config(TINY_MODEL), dtype, seed=seed)


def load_model(name: str, dtype: str, device: str | None) -> tuple[Any, Any]:
    """(model, tokenizer) for a Hugging Face name, a directory, or one of
    :data:`~sampler.options.CONFIG_MODELS` (random weights built from a config, with :class:`ByteTokenizer`).
    ``device`` (default: cuda when available) must be one this machine has."""
    import torch

    from predictor_training.options import resolve_device

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    dev = torch.device(resolve_device(device))
    if name in CONFIG_MODELS:
        return qwen3_from_config(qwen3_config(name), torch_dtype, dev), ByteTokenizer()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch_dtype).to(dev).eval()
    except (OSError, ValueError) as exc:
        hint = "" if Path(name).exists() else (f"; without network access pass a local model directory, or one of "
                                               f"{', '.join(CONFIG_MODELS)} (random weights)")
        raise InvalidArgument("model", name, f"a loadable causal LM ({exc.__class__.__name__}: "
                              f"{str(exc).splitlines()[0][:140] if str(exc) else ''}){hint}") from None
    return model, tokenizer


def _encode(tokenizer: Any, text: str) -> list[int]:
    if isinstance(tokenizer, ByteTokenizer):
        return tokenizer.encode(text)
    if getattr(tokenizer, "chat_template", None):
        return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                  tokenize=True, return_dict=False))
    return tokenizer(text, add_special_tokens=True)["input_ids"]


def _lengths(text: str | None, group_size: int) -> list[int] | None:
    if text is None:
        return None
    try:
        out = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise InvalidArgument("lengths", text, "comma-separated integers (tokens)") from None
    if len(out) != group_size:
        raise InvalidArgument("lengths", f"{len(out)} lengths", f"{group_size}, one per completion (-G)")
    return out


class _ClipCounter:
    """A predictor that counts the predictions above ``cap`` (the policies clip them to
    --max-new-tokens), so that the command can say how many were clipped."""

    def __init__(self, predictor: Any, cap: int):
        self._predictor, self._cap = predictor, cap
        self.clipped = self.total = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._predictor, name)

    def predict(self, *args: Any, **kwargs: Any) -> Any:
        import numpy as np

        out = self._predictor.predict(*args, **kwargs)
        lengths = np.asarray(out.lengths)
        self.clipped += int((lengths > self._cap).sum())
        self.total += int(lengths.size)
        return out


#: The sampler's argument names that differ from the flags of ``lengthsched sample``: (the flag's
#: field, the option that holds the value the user typed).
_FLAG_OF = {"budget_bytes": ("budget", "budget"), "force_lengths": ("lengths", "lengths"),
            "kv_compression": ("kv_compression", "kv_compression"),
            "predicted_lengths": ("lengths", "lengths"), "prompt_ids": ("prompt", "prompt")}


def _note(text: str) -> None:
    print(f"lengthsched sample: note: {text}", file=sys.stderr)


def _check_group_size(group_size: int, max_new_tokens: int) -> None:
    """G within what one process holds: every completion's tokens, log-probabilities and state."""
    from lengthsched.errors import check_int

    check_int("group_size", group_size, minimum=1)
    if group_size > MAX_GROUP_SIZE:
        need = group_size * (1024 + 64 * max(int(max_new_tokens), 1))  # ~1 KiB of state + 64 B per token held
        raise InvalidArgument("group_size", group_size,
                              f"at most {MAX_GROUP_SIZE:,} completions: the sampler holds every completion's "
                              f"tokens, log-probabilities and state in this process (G={group_size:,} would need "
                              f"about {need / 2**30:,.0f} GiB of host memory, {group_size * max_new_tokens:,} tokens) "
                              f"and decodes the group step by step; model such groups with `lengthsched simulate`")


def run_sample(opts: SampleOptions) -> int:
    # every argument checked before torch is imported (seconds)
    from lengthsched.errors import check_int
    from predictor_training.options import check_device

    if opts.policy not in SAMPLE_POLICIES:  # argparse checks it too; this is for run_sample(SampleOptions(...))
        raise InvalidArgument("policy", opts.policy, "one of " + ", ".join(SAMPLE_POLICIES))
    check_int("max_new_tokens", opts.max_new_tokens, minimum=1)
    _check_group_size(opts.group_size, opts.max_new_tokens)
    forced = _lengths(opts.lengths, opts.group_size)
    budget = None if opts.budget is None else parse_bytes(opts.budget)
    if budget is None and POLICIES[opts.policy].needs_budget:
        raise InvalidArgument("budget", None, f"a KV budget (--budget, e.g. 4GiB) for policy '{opts.policy}'")
    compression = KVCompression.of(opts.kv_compression)
    check_device(opts.device)
    if opts.predictor and not (Path(opts.predictor) / "config.json").is_file():
        what = "no such directory" if not Path(opts.predictor).exists() else "no config.json in it"
        raise InvalidArgument("predictor", opts.predictor, f"a directory written by `lengthsched train` ({what})")
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"{exc.name} is not installed: the sampler needs the sampler extra "
                          "(pip install torch==2.13.0 'lengthsched[sampler]' for a CPU-only machine)") from None
    transformers.utils.logging.disable_progress_bar()
    from predictor_training.options import resolve_device

    from .core import InfiniteSampler

    device = resolve_device(opts.device)  # one this machine has, before any work
    notes: list[str] = []
    if opts.policy in PREDICTING_POLICIES and not opts.predictor and forced is None:
        notes.append(f"--policy {opts.policy} plans with predicted lengths and has none here (no --predictor, "
                     f"no --lengths): every completion is predicted at --max-new-tokens {opts.max_new_tokens}, "
                     "so it schedules in index order"
                     + (" (as fixed_slot does)" if opts.policy.startswith("length_aware") else ""))
    elif opts.predictor and opts.policy in UNPREDICTED_POLICIES:
        notes.append(f"--predictor has no effect under --policy {opts.policy}, which uses no predictions "
                     f"(length-aware ones: {', '.join(PREDICTING_POLICIES)})")
    cost = None
    if opts.cost:
        from lengthsched.cost import StepCost

        try:
            with open(opts.cost, encoding="utf-8") as handle:
                cost = StepCost.from_json(handle.read())
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidArgument("cost", opts.cost, f"a readable step-cost JSON file ({exc.__class__.__name__})") \
                from None
    predictor = None
    if opts.predictor:
        from predictor_training.predictor import BertLengthPredictor

        try:
            predictor = _ClipCounter(BertLengthPredictor.from_pretrained(opts.predictor), opts.max_new_tokens)
        except InvalidArgument as exc:  # the library names its argument 'model'; the user typed --predictor
            raise InvalidArgument("predictor", opts.predictor, exc.expected) from None
    model, tokenizer = load_model(opts.model, opts.dtype, device)
    try:
        sampler = InfiniteSampler(model, policy=opts.policy, slots=opts.slots, budget_bytes=budget,
                                  predictor=predictor, refill=opts.refill, share_prompt_kv=not opts.copy_prompt_kv,
                                  tokenizer=tokenizer, kv_compression=compression)
        prompt = _encode(tokenizer, opts.prompt)
        eos = getattr(tokenizer, "eos_token_id", None)
        res = sampler.sample_group(prompt, opts.group_size, max_new_tokens=opts.max_new_tokens,
                                   temperature=opts.temperature, top_p=opts.top_p, top_k=opts.top_k, seed=opts.seed,
                                   force_lengths=forced, predicted_lengths=forced,
                                   stop_token_ids=None if eos is None else [eos])
    except InvalidArgument as exc:  # the library's argument names -> the flags the user typed
        if exc.name in _FLAG_OF:
            name, value = _FLAG_OF[exc.name]
            raise type(exc)(name, getattr(opts, value), exc.expected) from None
        raise
    summary = {
        "model": opts.model, "device": str(next(model.parameters()).device), "dtype": opts.dtype,
        "policy": res.policy, "group_size": opts.group_size, "prompt_tokens": res.prompt_tokens,
        "steps": res.steps, "tokens": res.tokens, "wall_seconds": res.wall_seconds,
        "tokens_per_second": res.tokens_per_second, "peak_kv_bytes": res.peak_kv_bytes,
        "peak_model_kv_bytes": res.peak_model_kv_bytes, "cuda_peak_bytes": res.cuda_peak_bytes,
        "preemptions": res.preemptions, "recomputed_tokens": res.recomputed_tokens, "lengths": res.lengths,
        "step_seconds": res.step_seconds, "model_seconds": None if cost is None else res.model_seconds(cost),
        "kv_compression": opts.kv_compression,
    }
    if opts.json:
        print(json.dumps(summary))
    else:
        print(_format_summary(opts, summary, res, cost))
    sys.stdout.flush()
    for note in notes:  # after the result: an error before it stays one line
        _note(note)
    if predictor is not None and predictor.clipped:
        _note(f"{predictor.clipped} of {predictor.total} predicted lengths were above --max-new-tokens "
              f"{opts.max_new_tokens} and were clipped to it")
    # written after the result is printed: a failing path loses nothing
    if opts.steps_out:
        atomic_write_text(opts.steps_out, "".join(json.dumps(row) + "\n" for row in res.step_samples()))
    if opts.output:
        atomic_write_text(opts.output, json.dumps({**summary, "completions": res.completions, "texts": res.texts,
                                                   "logprobs": res.logprobs}) + "\n")
    return 0


def _format_summary(opts: SampleOptions, summary: dict[str, Any], res: Any, cost: Any) -> str:
    note = " (random weights built from a config: real compute, gibberish text)" if opts.model in CONFIG_MODELS else ""
    lengths = sorted(res.lengths)
    lines = [f"model {opts.model}{note} on {summary['device']}, {opts.dtype}; policy {res.policy}, "
             f"G={opts.group_size}, prompt {res.prompt_tokens} tokens",
             f"decode steps {res.steps}; tokens {res.tokens} (lengths min {lengths[0]}, median "
             f"{lengths[len(lengths) // 2]}, max {lengths[-1]}); {res.tokens_per_second:.1f} tokens/s "
             f"({res.wall_seconds:.2f} s)"]
    cuda = "" if res.cuda_peak_bytes is None else f"; CUDA peak allocated {res.cuda_peak_bytes / 2**20:.1f} MiB"
    sparse = "" if opts.kv_compression is None else f"; KV compressed to BUDGET:INTERVAL {opts.kv_compression}"
    lines.append(f"peak KV held {res.peak_kv_bytes / 2**20:.3f} MiB (memory model "
                 f"{res.peak_model_kv_bytes / 2**20:.3f} MiB); preemptions {res.preemptions}{cuda}{sparse}")
    modelled = "" if cost is None else (f"; modelled {summary['model_seconds']:.3f} s ({cost.model} on {cost.gpu}, "
                                        f"{summary['model_seconds'] / max(res.step_seconds, 1e-12) - 1:+.1%})")
    lines.append(f"decode steps measured {res.step_seconds:.3f} s{modelled}")
    if res.texts:
        lines.append(f"completion 0: {res.texts[0][:120]!r}")
    return "\n".join(lines)
