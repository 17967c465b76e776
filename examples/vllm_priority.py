#!/usr/bin/env python3
"""One GRPO group on vLLM, without and with a lengthsched plan's request priorities.

For a GPU machine with vLLM installed (pip install vllm; written against vLLM 0.33.0). NOT run
where lengthsched is developed (no GPU there): the adapter is tested with fake engines that have
vLLM 0.33.0's signatures (tests/test_integrations.py), and only --help of this script runs in the
tests.

1. The model's config (transformers, installed with vLLM) gives a ModelMemory with vLLM's
   16-token blocks; --budget (weights + activations + KV for the group) gives the slot count:
   the most sequences that fit when each may reach --max-new-tokens.
2. vllm_setup builds the engine arguments: scheduling_policy="priority", max_num_seqs = slots,
   kv_cache_memory_bytes = the plan's KV pool, gpu_memory_utilization for weights + KV pool +
   overhead (vLLM's start-up free-memory check). block_size is not set (the attention backend
   picks it); the script reads it back and says when it is not the 16 the arithmetic assumed.
3. Baseline: the G completions as G requests in completion-index order (what FCFS does).
4. Planned: predicted lengths (a noisy oracle made from the baseline's lengths, --sigma; put
   your predictor here) -> plan_group -> generate_group_vllm (shortest predicted first).

No warm-up request: vLLM registers a prompt's full KV blocks in the prefix cache when it schedules
them, so the G copies sent in one step share them (vllm/v1/core/kv_cache_manager.py). Every
completion has its own seed, so both runs sample the same completions (up to numerical
differences between batch compositions). Prints wall time, engine steps (when vLLM's metrics
report them) and the decode steps of each order under the lengthsched model.

    python examples/vllm_priority.py --model Qwen/Qwen3-1.7B --group-size 32 --budget 8GiB
"""

from __future__ import annotations

from typing import Any

from lengthsched.integrations import generate_group_vllm, vllm_block_size
from lengthsched.integrations.demo import (
    example_parser,
    import_engine,
    prepare,
    run_and_print,
)


def iterations(llm: Any) -> int | None:
    """Engine iterations so far, from vLLM's metrics where this release exposes them."""
    try:
        return next(int(m.count) for m in llm.get_metrics() if m.name == "vllm:iteration_tokens_total")
    except Exception:  # noqa: BLE001 - best effort: older releases have no get_metrics
        return None


def main(argv: list[str] | None = None) -> None:
    args = example_parser(__doc__.split("\n\n")[0]).parse_args(argv)
    vllm = import_engine("vllm", "pip install vllm")
    prepared = prepare(args, "vllm")
    prompt = {"prompt_token_ids": prepared.prompt_ids}
    llm = vllm.LLM(model=args.model, disable_log_stats=False, **prepared.setup.engine_kwargs)
    params = [vllm.SamplingParams(n=1, max_tokens=args.max_new_tokens, temperature=args.temperature,
                                  seed=args.seed * 100_003 + j) for j in range(args.group_size)]
    block = vllm_block_size(llm)
    if block is not None and block != prepared.memory.block_size:
        print(f"note: the engine uses {block}-token KV blocks, the plan assumed {prepared.memory.block_size}; "
              f"pass block_size={block} to vllm_setup for exact KV arithmetic")

    def run_group(order: Any) -> tuple[list[int], int | None]:
        before = iterations(llm)
        outputs = generate_group_vllm(llm, prompt, order, params, use_tqdm=False)
        after = iterations(llm)
        steps = None if before is None or after is None else after - before
        return [len(o.outputs[0].token_ids) for o in outputs], steps

    run_and_print(run_group, args, prepared)


if __name__ == "__main__":
    main()
