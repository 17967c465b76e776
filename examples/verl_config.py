#!/usr/bin/env python3
"""Print the verl rollout settings that run a lengthsched plan: Hydra overrides and the router YAML.

Runs anywhere lengthsched does (numpy only; no verl, no GPU): it only computes settings. The
launch script examples/verl_grpo_lengthsched.sh passes its output to verl's trainer on a GPU
cluster (NOT run where lengthsched is developed). Written against verl 0.9.1 and vLLM 0.33.0.

Each replica runs --groups-per-replica groups of G completions at once, each group planned with
--slots slots (every completion may reach --max-new-tokens); the KV pool is what those plans hold
at their peak (kv_cache_memory_bytes, per GPU), or --kv-budget. --steal names the trainer's
stealing manager (with its pool, and for the v1 trainer Ray's setup hook that registers the vLLM
server class with snapshots); --selective the v1 trainer's replay buffer from
lengthsched.integrations.verl_selective (its refill by need under algorithm.filter_groups, which you turn on);
--sgpo the v1 manager's online sGPO (each training prompt's group size from its latest groups' rewards).

    python examples/verl_config.py --preset qwen3-1.7b --group-size 16 --slots 8 --groups-per-replica 8
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lengthsched as ls
from lengthsched.integrations.verl import verl_rollout_config


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="qwen3-1.7b", help="a lengthsched ModelMemory preset")
    parser.add_argument("--group-size", "-G", type=int, default=16, help="completions per prompt (rollout.n)")
    parser.add_argument("--slots", type=int, default=8, help="completions of one group running at once")
    parser.add_argument("--groups-per-replica", type=int, default=8, help="groups a replica runs at once")
    parser.add_argument("--prompt-tokens", type=int, default=512, help="data.max_prompt_length (tokens)")
    parser.add_argument("--max-new-tokens", type=int, default=2048, help="rollout.response_length (tokens)")
    parser.add_argument("--gpu-memory", default="80GiB", help="memory of one GPU")
    parser.add_argument("--kv-budget", default=None,
                        help="KV pool of a replica (whole model, bytes); default: what the plans hold at their peak")
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="rollout.tensor_model_parallel_size")
    parser.add_argument("--engine", choices=("vllm", "sglang"), default="vllm")
    parser.add_argument("--router-yaml", default="lengthsched_router.yaml", help="where to write the router file")
    parser.add_argument("--trainer", choices=("v1", "legacy"), default="v1",
                        help="verl's trainer: v1 (verl 0.9.1's default) or legacy (trainer.use_v1=false)")
    parser.add_argument("--steal", action="store_true",
                        help="the trainer's stealing manager (vLLM): replicas that drain take waiting requests")
    parser.add_argument("--selective", action="store_true",
                        help="the v1 trainer's replay buffer from lengthsched.integrations.verl_selective: under "
                             "algorithm.filter_groups it refills only what the batch still needs")
    parser.add_argument("--sgpo", action="store_true",
                        help="the v1 manager's online sGPO: each training prompt's group size (__rollout_n__) from "
                             "the rewards of its latest groups")
    parser.add_argument("--sgpo-state", default=None,
                        help="with --sgpo: where the budget is kept across restarts (JSON; "
                             "lengthsched.sgpo.state_path)")
    parser.add_argument("--routing", choices=("sticky", "cache_aware"), default="sticky",
                        help="the router's rule for what no plan places: sticky (verl's) or cache_aware (SGLang's "
                             "router's rule: for multi-turn agent loops, later turns rebalanced by load)")
    args = parser.parse_args(argv)
    if args.sgpo_state is not None and (not args.sgpo or not args.sgpo_state):
        parser.error("--sgpo-state PATH only with --sgpo (it is where the online sGPO keeps its budget)")

    memory = ls.ModelMemory.from_preset(args.preset)
    plan = ls.plan_group([args.max_new_tokens] * args.group_size, slots=args.slots,
                         max_new_tokens=args.max_new_tokens, prompt_tokens=args.prompt_tokens)
    try:
        config = verl_rollout_config(plan, memory, gpu_memory_bytes=args.gpu_memory, kv_budget_bytes=args.kv_budget,
                                     groups_per_replica=args.groups_per_replica, engine=args.engine,
                                     tensor_parallel_size=args.tensor_parallel_size,
                                     router_config_path=args.router_yaml,
                                     max_model_len=args.prompt_tokens + args.max_new_tokens, trainer=args.trainer,
                                     steal=args.steal, selective=args.selective, routing=args.routing,
                                     sgpo={"state_path": args.sgpo_state} if args.sgpo_state else args.sgpo)
    except ls.InvalidArgument as exc:  # one readable line and exit status 2, as the lengthsched CLI does
        parser.error(str(exc))
    Path(args.router_yaml).write_text(config.router_yaml, encoding="utf-8")
    print("\n".join(config.overrides()))


if __name__ == "__main__":
    main()
