"""The options of ``lengthsched sample`` (a frozen dataclass; the CLI flags are derived from it).
Importing this module imports neither torch nor transformers."""

from __future__ import annotations

from dataclasses import dataclass

from lengthsched.options import _opt
from lengthsched.refill import RefillRule

__all__ = ["SampleOptions", "TINY_MODEL", "RANDOM_MODELS", "CONFIG_MODELS"]

TINY_MODEL = "tiny-qwen3"
#: Qwen3 models of the public shapes of Qwen/Qwen3-0.6B and Qwen/Qwen3-1.7B with random weights, built
#: from a config (offline): gibberish text, real compute and memory (for GPU benchmarks without weights).
RANDOM_MODELS = ("random-qwen3-0.6b", "random-qwen3-1.7b")
#: Every model name built from a config instead of loaded (``sampler.cli.load_model``).
CONFIG_MODELS = (TINY_MODEL, *RANDOM_MODELS)


@dataclass(frozen=True)
class SampleOptions:
    """Generate one GRPO group on a real model with a sampling policy; print steps, memory and speed."""

    model: str = _opt(TINY_MODEL, f"a Hugging Face causal LM name or local directory; {TINY_MODEL} is a small "
                                  "randomly initialised Qwen3-shaped model built from a config (offline, "
                                  f"gibberish text, real compute); {' and '.join(RANDOM_MODELS)} are random-weight "
                                  "Qwen3 models of the real shapes of Qwen/Qwen3-0.6B and Qwen/Qwen3-1.7B (offline, "
                                  "byte tokenizer, gibberish text; real compute and memory)")
    prompt: str = _opt("Write a short poem about the sea.", "the prompt text")
    group_size: int = _opt(8, "G, completions of the prompt", aliases=("-G",))
    max_new_tokens: int = _opt(64, "L_max: most tokens per completion (stop token included)")
    policy: str = _opt("length_aware", "a simulator policy the sampler runs: full, full_freed, micro, fixed_slot, "
                                       "dynamic_slot, length_aware, growth_aware, vllm, sglang, reserve_max, ...")
    slots: int | None = _opt(4, "most completions decoding at once")
    budget: str | None = _opt(None, "memory for the group: weights + activations + KV, e.g. 10GiB")
    lengths: str | None = _opt(None, "trace replay: comma-separated lengths (tokens), one per completion; each "
                                     "completion ends exactly there, and length-aware policies plan with them")
    predictor: str | None = _opt(None, "a predictor directory from `lengthsched train` for length-aware policies")
    refill: str = _opt("sjf", "refill rule of length_aware", choices=[r.value for r in RefillRule])
    copy_prompt_kv: bool = _opt(False, "hold a copy of the prompt KV per sequence (the baseline) instead of once")
    temperature: float = _opt(1.0, "sampling temperature (0 = greedy)")
    top_p: float = _opt(1.0, "nucleus sampling mass (1 = off)")
    top_k: int = _opt(0, "top-k sampling (0 = off)")
    seed: int = _opt(0, "seed of the per-completion random streams")
    dtype: str = _opt("float32", "model dtype", choices=["float32", "bfloat16", "float16"])
    device: str | None = _opt(None, "cpu, cuda, cuda:1, ... (default: cuda when available)")
    cost: str | None = _opt(None, "a step-cost JSON (lengthsched cost fit) to print the modelled seconds of the "
                                  "same steps next to the measured ones")
    steps_out: str | None = _opt(None, "write every measured step (rows, KV read, prefill tokens, seconds) as JSON "
                                       "lines to this file: samples for lengthsched cost fit")
    json: bool = _opt(False, "print JSON instead of a summary")
    output: str | None = _opt(None, "also write the JSON result (completions included) to this file (atomically)")
