"""The options of ``lengthsched sample`` (a frozen dataclass; the CLI flags are derived from it).
Importing this module imports neither torch nor transformers."""

from __future__ import annotations

from dataclasses import dataclass

from lengthsched.options import _opt
from lengthsched.refill import RefillRule
from lengthsched.runtime.registry import policy_names

__all__ = ["SampleOptions", "TINY_MODEL", "RANDOM_MODELS", "CONFIG_MODELS", "SAMPLE_POLICIES", "PREDICTING_POLICIES",
           "UNPREDICTED_POLICIES",
           "MAX_GROUP_SIZE"]

TINY_MODEL = "tiny-qwen3"
#: Qwen3 models of the public shapes of Qwen/Qwen3-0.6B and Qwen/Qwen3-1.7B with random weights, built
#: from a config (offline): gibberish text, real compute and memory (for GPU benchmarks without weights).
RANDOM_MODELS = ("random-qwen3-0.6b", "random-qwen3-1.7b")
#: Every model name built from a config instead of loaded (``sampler.cli.load_model``).
CONFIG_MODELS = (TINY_MODEL, *RANDOM_MODELS)
#: The policies the reference sampler runs (``--policy`` choices).
SAMPLE_POLICIES = policy_names(sampler=True)
#: Those that plan with predicted lengths; without a predictor or ``--lengths`` every completion is
#: predicted at ``--max-new-tokens`` (so length_aware schedules in index order, as fixed_slot does).
PREDICTING_POLICIES = tuple(n for n in SAMPLE_POLICIES if n.startswith(("length_aware", "growth_aware", "placed_"))
                            or n.endswith("_priority"))
#: Those that use no predictions at all (a predictor has no effect on them).
UNPREDICTED_POLICIES = tuple(n for n in ("full", "full_freed", "micro", "fixed_slot", "dynamic_slot", "vllm", "sglang",
                                         "reserve_max") if n in SAMPLE_POLICIES)
#: The largest group ``lengthsched sample`` takes: it keeps every completion's tokens and state in one
#: process and decodes one step at a time (G = 20000 of 4 tokens already takes minutes on a CPU).
MAX_GROUP_SIZE = 65536


@dataclass(frozen=True)
class SampleOptions:
    """Generate one GRPO group on a real model with a sampling policy; print steps, memory and speed."""

    model: str = _opt(TINY_MODEL, f"a Hugging Face causal LM name or local directory; {TINY_MODEL} is a small "
                                  "randomly initialised Qwen3-shaped model built from a config (offline, "
                                  f"gibberish text, real compute); {' and '.join(RANDOM_MODELS)} are random-weight "
                                  "Qwen3 models of the real shapes of Qwen/Qwen3-0.6B and Qwen/Qwen3-1.7B (offline, "
                                  "byte tokenizer, gibberish text; real compute and memory)")
    prompt: str = _opt("Write a short poem about the sea.", "the prompt text")
    group_size: int = _opt(8, f"G, completions of the prompt (at most {MAX_GROUP_SIZE})", aliases=("-G",))
    max_new_tokens: int = _opt(64, "L_max: most tokens per completion (stop token included)")
    policy: str = _opt("length_aware", "the sampling policy (length-aware ones plan with --predictor or --lengths; "
                                       "without either they have no predictions and say so)",
                       choices=list(SAMPLE_POLICIES))
    slots: int | None = _opt(4, "most completions decoding at once")
    budget: str | None = _opt(None, "memory for the group: weights + activations + KV, e.g. 10GiB")
    lengths: str | None = _opt(None, "trace replay: comma-separated lengths (tokens), one per completion; each "
                                     "completion ends exactly there, and length-aware policies plan with them")
    predictor: str | None = _opt(None, "a predictor directory from `lengthsched train` for length-aware policies")
    refill: str = _opt("sjf", "refill rule of length_aware", choices=[r.value for r in RefillRule])
    copy_prompt_kv: bool = _opt(False, "hold a copy of the prompt KV per sequence (the baseline) instead of once")
    kv_compression: str | None = _opt(None, "a compressed KV cache (Sparse-RL's sparse rollouts), BUDGET:INTERVAL "
                                            "in tokens (e.g. 512:32): each sequence keeps its BUDGET most attended "
                                            "generated tokens every INTERVAL, and --budget admits by that "
                                            "(token-granular policies, a shared prompt KV)")
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
