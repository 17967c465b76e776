"""``lengthsched sample``: one group on a real model, with the policy's steps, memory and speed."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from lengthsched.errors import InvalidArgument
from lengthsched.io import atomic_write_text
from lengthsched.memory import parse_bytes

from .options import TINY_MODEL, SampleOptions

__all__ = ["run_sample", "tiny_qwen3", "ByteTokenizer", "load_model"]


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255, EOS = 256: the offline tiny model's tokenizer."""

    eos_token_id = 256
    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


def tiny_qwen3(dtype: Any = None, seed: int = 0) -> Any:
    """A randomly initialised Qwen3-shaped causal LM (4 layers, hidden 256, 8 heads, 4 KV heads of
    32 dims, byte vocabulary) built from a config: no download. Its text is gibberish; its compute
    and memory are real."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=ByteTokenizer.vocab_size, hidden_size=256, intermediate_size=768,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
                         max_position_embeddings=8192, eos_token_id=ByteTokenizer.eos_token_id,
                         tie_word_embeddings=True)
    model = Qwen3ForCausalLM(config).eval()
    return model.to(dtype) if dtype is not None else model


def load_model(name: str, dtype: str, device: str | None) -> tuple[Any, Any]:
    """(model, tokenizer) for a name, a directory, or :data:`TINY_MODEL`."""
    import torch

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if name == TINY_MODEL:
        return tiny_qwen3(torch_dtype).to(dev), ByteTokenizer()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch_dtype).to(dev).eval()
    except (OSError, ValueError) as exc:
        hint = "" if Path(name).exists() else f"; without network access pass a local model directory, or {TINY_MODEL}"
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


def run_sample(opts: SampleOptions) -> int:
    from lengthsched.errors import check_int

    check_int("group_size", opts.group_size, minimum=1)
    forced = _lengths(opts.lengths, opts.group_size)
    budget = None if opts.budget is None else parse_bytes(opts.budget)
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"{exc.name} is not installed: the sampler needs the sampler extra "
                          "(pip install torch==2.13.0 'lengthsched[sampler]' for a CPU-only machine)") from None
    transformers.utils.logging.disable_progress_bar()
    from .core import InfiniteSampler

    predictor = None
    if opts.predictor:
        from predictor_training.predictor import BertLengthPredictor

        predictor = BertLengthPredictor.from_pretrained(opts.predictor)
    model, tokenizer = load_model(opts.model, opts.dtype, opts.device)
    sampler = InfiniteSampler(model, policy=opts.policy, slots=opts.slots, budget_bytes=budget, predictor=predictor,
                              refill=opts.refill, share_prompt_kv=not opts.copy_prompt_kv, tokenizer=tokenizer)
    prompt = _encode(tokenizer, opts.prompt)
    eos = getattr(tokenizer, "eos_token_id", None)
    res = sampler.sample_group(prompt, opts.group_size, max_new_tokens=opts.max_new_tokens,
                               temperature=opts.temperature, top_p=opts.top_p, top_k=opts.top_k, seed=opts.seed,
                               force_lengths=forced, predicted_lengths=forced,
                               stop_token_ids=None if eos is None else [eos])
    summary = {
        "model": opts.model, "device": str(next(model.parameters()).device), "dtype": opts.dtype,
        "policy": res.policy, "group_size": opts.group_size, "prompt_tokens": res.prompt_tokens,
        "steps": res.steps, "tokens": res.tokens, "wall_seconds": res.wall_seconds,
        "tokens_per_second": res.tokens_per_second, "peak_kv_bytes": res.peak_kv_bytes,
        "peak_model_kv_bytes": res.peak_model_kv_bytes, "cuda_peak_bytes": res.cuda_peak_bytes,
        "preemptions": res.preemptions, "recomputed_tokens": res.recomputed_tokens, "lengths": res.lengths,
    }
    if opts.output:
        atomic_write_text(opts.output, json.dumps({**summary, "completions": res.completions, "texts": res.texts,
                                                   "logprobs": res.logprobs}) + "\n")
    if opts.json:
        print(json.dumps(summary))
        return 0
    note = " (random weights built from a config: real compute, gibberish text)" if opts.model == TINY_MODEL else ""
    lengths = sorted(res.lengths)
    print(f"model {opts.model}{note} on {summary['device']}, {opts.dtype}; policy {res.policy}, G={opts.group_size}, "
          f"prompt {res.prompt_tokens} tokens")
    print(f"decode steps {res.steps}; tokens {res.tokens} (lengths min {lengths[0]}, median "
          f"{lengths[len(lengths) // 2]}, max {lengths[-1]}); {res.tokens_per_second:.1f} tokens/s "
          f"({res.wall_seconds:.2f} s)")
    cuda = "" if res.cuda_peak_bytes is None else f"; CUDA peak allocated {res.cuda_peak_bytes / 2**20:.1f} MiB"
    print(f"peak KV held {res.peak_kv_bytes / 2**20:.3f} MiB (memory model {res.peak_model_kv_bytes / 2**20:.3f} MiB)"
          f"; preemptions {res.preemptions}{cuda}")
    if res.texts:
        print(f"completion 0: {res.texts[0][:120]!r}")
    sys.stdout.flush()
    return 0
