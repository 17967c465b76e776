#!/usr/bin/env python3
"""One GRPO group on SGLang, without and with a lengthsched plan's request priorities.

For a GPU machine with SGLang installed (pip install "sglang[all]"; written against SGLang
0.5.23). NOT run where lengthsched is developed (no GPU there): the adapter is tested with fake
engines that have SGLang 0.5.23's signatures (tests/test_integrations.py), and only --help of this
script runs in the tests.

1. The model's config (transformers, installed with SGLang) gives a ModelMemory with
   token-granular KV (page size 1); --budget (weights + activations + KV for the group) gives
   the slot count: the most sequences that fit when each may reach --max-new-tokens.
2. sglang_setup builds the engine arguments: enable_priority_scheduling,
   schedule_low_priority_values_first, schedule_policy="fcfs", disable_priority_preemption,
   retraction_policy="priority", max_running_requests = slots, mem_fraction_static for weights +
   KV pool. page_size is not set (some attention backends rewrite it); the script reads it back.
3. Baseline: the G completions as G concurrent requests in completion-index order.
4. Planned: predicted lengths (a noisy oracle made from the baseline's lengths, --sigma; put
   your predictor here) -> plan_group -> generate_group_sglang (shortest predicted first).

generate_group_sglang sends one max_new_tokens=1 request of the prompt before each group: under
fcfs SGLang does not share a prompt between requests of the same prefill batch. Completions get
per-completion seeds only with --sampling-seed, which also starts the engine with
enable_deterministic_inference=True: without it SGLang 0.5.23 ignores "sampling_seed"
(sglang/srt/sampling/sampling_batch_info.py), so the two runs sample different completions.
Prints wall time and the decode steps of each order under the lengthsched model (SGLang reports
no step count through this API).

    python examples/sglang_priority.py --model Qwen/Qwen3-1.7B --group-size 32 --budget 8GiB
"""

from __future__ import annotations

from typing import Any

from lengthsched.integrations import generate_group_sglang, sglang_page_size
from lengthsched.integrations.demo import (
    example_parser,
    import_engine,
    prepare,
    run_and_print,
)


def main(argv: list[str] | None = None) -> None:
    parser = example_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--sampling-seed", type=int, default=None,
                        help='send "sampling_seed": this + completion index, with enable_deterministic_inference '
                             '(slower; without it SGLang ignores the seed)')
    args = parser.parse_args(argv)
    sgl = import_engine("sglang", 'pip install "sglang[all]"')
    prepared = prepare(args, "sglang")
    deterministic = {} if args.sampling_seed is None else {"enable_deterministic_inference": True}
    engine = sgl.Engine(model_path=args.model, **prepared.setup.engine_kwargs, **deterministic)
    page = sglang_page_size(engine)
    if page is not None and page != prepared.memory.block_size:
        print(f"note: the engine uses {page}-token pages, the plan assumed {prepared.memory.block_size}; "
              f"pass page_size={page} to sglang_setup for exact KV arithmetic")
    params = [{"max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
              | ({} if args.sampling_seed is None else {"sampling_seed": args.sampling_seed + j})
              for j in range(args.group_size)]

    def run_group(order: Any) -> tuple[list[int], None]:
        outputs = generate_group_sglang(engine, prepared.prompt_ids, order, params)
        return [int(o["meta_info"]["completion_tokens"]) for o in outputs], None

    try:
        run_and_print(run_group, args, prepared)
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
