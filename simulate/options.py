"""The frozen options of ``lengthsched simulate`` (the CLI flags are derived from them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lengthsched.memory import DTYPE_BYTES
from lengthsched.refill import RefillRule

__all__ = ["SimulateOptions", "DEFAULT_POLICIES"]

# The comparison table's default rows: every policy of docs/model.md section 4 once.
DEFAULT_POLICIES = ("full", "full_freed", "micro", "fixed_slot", "dynamic_slot", "length_aware", "growth_aware",
                    "growth_aware_lpt", "growth_aware_fcfs", "vllm", "sglang", "reserve_max")


def _opt(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


@dataclass(frozen=True)
class SimulateOptions:
    """Simulate sampling policies on a workload and compare steps, memory, preemptions and bias."""

    model: str = _opt("qwen3-1.7b", "a config.json path, a model directory, or a bundled preset name")
    dtype: str = _opt("bfloat16", "weights and activations dtype", choices=sorted(DTYPE_BYTES))
    kv_dtype: str | None = _opt(None, "KV cache dtype, default --dtype", choices=sorted(DTYPE_BYTES))
    budget: str = _opt("5GiB", "memory for one group: weights + activations of G sequences + KV (e.g. 24GiB)")
    group_size: int | None = _opt(None, "G, completions per prompt (default: 32 for castillo, lmsys and azure; a "
                                        "trace file keeps its groups' logged sizes: --group-size with one is only "
                                        "checked against them)")
    max_new_tokens: int = _opt(4096, "L_max in tokens; longer lengths in the workload are clipped to it, and so "
                                     "are longer predictions (a notice on stderr says how many)")
    workload: str = _opt("castillo", "castillo (real groups), lmsys or azure (single-length traces with the "
                                     "log-normal group model), or a trace .jsonl path")
    groups: int = _opt(200, "how many groups (prompts) to simulate")
    spread: float | None = _opt(None, "sigma of log length within a group for lmsys/azure "
                                      "(default: fitted to CASTILLO)")
    predictor: str = _opt("oracle", "predicted lengths: oracle, noisy:SIGMA (log-normal error, 0 < SIGMA <= 5), "
                                    "constant:TOKENS, "
                                    "trace (the trace's 'predicted'), or online / online:TOKENS (learns from "
                                    "each group's finished siblings, from a constant prior)")
    quantile: float = _opt(0.9, "predicted quantile that length_aware reserves")
    policies: str = _opt(",".join(DEFAULT_POLICIES), "comma-separated policies to compare, each once "
                                                      "(lengthsched.runtime.POLICIES)")
    slots: int | None = _opt(None, "also cap how many sequences decode at once")
    gpu: str = _opt("h100", "GPU preset that prices every step in seconds (lengthsched cost show)",
                    choices=["a100", "h100", "h200", "l40s", "b200"])
    cost: str | None = _opt(None, "a fitted step-cost JSON (lengthsched cost fit) instead of the --gpu preset")
    prefill_chunk: int = _opt(8192, "most tokens prefilled in one step (vLLM's max_num_batched_tokens)")
    refill: str = _opt("sjf", "refill rule of length_aware", choices=[r.value for r in RefillRule])
    seed: int = _opt(0, "seed of the workload sampling, the noisy predictor and the dynamic-slot stream (>= 0)")
    workers: int = _opt(0, "processes to use (0: all cores)")
    sweep: str | None = _opt(None, "sweep one setting instead: group_size=8,16,32 | budget=4GiB,6GiB | "
                                   "spread=0.05,0.2 | sigma=0,0.25,0.5 (noisy predictor error) | "
                                   "max_new_tokens=1024,4096")
    json: bool = _opt(False, "print JSON instead of a table")
    plot: str | None = _opt(None, "write PNG figures into this directory")
    output: str | None = _opt(None, "also write the JSON results to this file (atomically)")
