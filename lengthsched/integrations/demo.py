"""The engine-independent half of examples/vllm_priority.py and examples/sglang_priority.py.

A group generated twice on a real engine: in completion-index order (what FCFS does), then in a
plan's order, with wall time, the decode steps the lengthsched model gives for each order, and
(where the engine reports them) engine steps. Importing this module imports no engine, torch or
transformers; :func:`prepare` imports transformers and torch when an example script calls it, and
the scripts pass a function that runs one group on their engine.
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import check_int
from ..memory import ModelMemory, parse_bytes
from ..plan import Plan, plan_group
from ..predictor import NoisyOracleLengthPredictor, OracleLengthPredictor
from ..schedule import execute
from .base import EngineSetup, engine_memory
from .sglang_adapter import sglang_setup
from .vllm_adapter import vllm_setup

__all__ = [
    "DEFAULT_PROMPT",
    "DemoRun",
    "Prepared",
    "compare_orders",
    "example_parser",
    "format_runs",
    "import_engine",
    "list_steps",
    "placeholder_plan",
    "plan_slots",
    "prepare",
    "run_and_print",
]

DEFAULT_PROMPT = "Solve step by step: a train travels 180 km in 2.5 hours. What is its average speed in m/s?"


def import_engine(name: str, install: str) -> Any:
    """Import the engine package ``name``, or exit with a message saying how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise SystemExit(f"this example needs {name} on a GPU machine ({install}): {exc}") from exc


def example_parser(description: str) -> argparse.ArgumentParser:
    """The command line both example scripts share (``--model``, ``--group-size``, ``--budget`` ...)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Qwen/Qwen3-1.7B", help="Hugging Face model id or local directory")
    parser.add_argument("--group-size", "-G", type=int, default=32, help="completions per group (G)")
    parser.add_argument("--budget", default="8GiB",
                        help="lengthsched memory budget for the group: weights + activations + KV (e.g. 8GiB)")
    parser.add_argument("--max-new-tokens", type=int, default=2048, help="L_max (tokens)")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--gpu-memory", default=None, help="total memory of the GPU (default: ask torch.cuda)")
    parser.add_argument("--overhead", default=None,
                        help="activations + CUDA graphs + context, bytes (default: lengthsched's estimate)")
    parser.add_argument("--sigma", type=float, default=0.3, help="noise of the noisy-oracle predictor (0: oracle)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def plan_slots(memory: ModelMemory, budget: Any, *, group_size: int, prompt_tokens: int, max_new_tokens: int) -> int:
    """Slots for the group: the most sequences that fit ``budget`` (bytes) when each may reach
    ``max_new_tokens``, at most the group size."""
    fit = memory.max_slots(parse_bytes(budget), prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens)
    return min(check_int("group_size", group_size, minimum=1), fit)


def placeholder_plan(*, group_size: int, slots: int, max_new_tokens: int, prompt_tokens: int) -> Plan:
    """A slots-mode plan before any prediction exists. In slots mode every completion reserves
    ``max_new_tokens``, so engine arguments built from it (``vllm_setup``, ``sglang_setup``) are
    the same as from the real plan of the group: the engine can be started first."""
    n = check_int("group_size", group_size, minimum=1)
    return plan_group([max_new_tokens] * n, slots=slots, max_new_tokens=max_new_tokens, prompt_tokens=prompt_tokens)


@dataclass(frozen=True)
class Prepared:
    """What an example needs before it starts its engine: the prompt's token ids, the memory
    model as the engine holds KV, the slot count and the engine setup."""

    prompt_ids: list[int]
    memory: ModelMemory
    slots: int
    setup: EngineSetup


def prepare(args: argparse.Namespace, engine: str) -> Prepared:
    """Tokenize the prompt and read the model's config with transformers, size the slots from
    ``--budget`` and build the engine setup. Imports transformers and torch (GPU machines with
    the engine installed have both); the example scripts are the only callers."""
    import torch
    from transformers import AutoConfig, AutoTokenizer

    prompt_ids = list(AutoTokenizer.from_pretrained(args.model)(args.prompt).input_ids)
    memory = engine_memory(ModelMemory.from_hf_config(AutoConfig.from_pretrained(args.model).to_dict()), engine)
    slots = plan_slots(memory, args.budget, group_size=args.group_size, prompt_tokens=len(prompt_ids),
                       max_new_tokens=args.max_new_tokens)
    gpu = parse_bytes(args.gpu_memory, "gpu_memory") if args.gpu_memory else int(torch.cuda.mem_get_info()[1])
    plan = placeholder_plan(group_size=args.group_size, slots=slots, max_new_tokens=args.max_new_tokens,
                            prompt_tokens=len(prompt_ids))
    overhead = None if args.overhead is None else parse_bytes(args.overhead, "overhead")
    setup = (vllm_setup if engine == "vllm" else sglang_setup)(plan, memory, gpu_memory_bytes=gpu,
                                                               overhead_bytes=overhead)
    print(f"G={args.group_size}, prompt {len(prompt_ids)} tokens, {slots} slots, KV pool {setup.kv_bytes} bytes, "
          f"{engine} kwargs {setup.engine_kwargs}")
    return Prepared(prompt_ids, memory, slots, setup)


@dataclass(frozen=True)
class DemoRun:
    """One generation of the group: wall time (seconds), engine steps (None when the engine does
    not report them), true lengths (tokens), and the decode steps of its order under the
    lengthsched model (:func:`list_steps`)."""

    name: str
    wall_s: float
    engine_steps: int | None
    lengths: tuple[int, ...]
    model_steps: int


def _timed(run_group: Callable[[Any], tuple[Sequence[int], int | None]],
           order: Any) -> tuple[list[int], float, int | None]:
    start = time.perf_counter()
    lengths, steps = run_group(order)
    return [int(x) for x in lengths], time.perf_counter() - start, steps


def compare_orders(
    run_group: Callable[[Any], tuple[Sequence[int], int | None]],
    *,
    group_size: int,
    slots: int,
    max_new_tokens: int,
    prompt_tokens: int,
    sigma: float,
    seed: int = 0,
) -> tuple[DemoRun, DemoRun, Plan]:
    """Run the group in index order, predict its lengths from that run (a noisy oracle with
    ``sigma``, or the oracle when ``sigma == 0``), plan, and run it in the plan's order.

    ``run_group(plan_or_lengths)`` generates the group on the engine through an adapter and
    returns (true lengths of the completions in index order, engine steps or None).
    """
    n = check_int("group_size", group_size, minimum=1)
    true, wall, steps = _timed(run_group, [1] * n)  # equal predictions: completion-index order
    base = DemoRun("index order (FCFS)", wall, steps, tuple(true), list_steps(true, range(n), slots, max_new_tokens))
    oracle = OracleLengthPredictor(true) if sigma == 0 else NoisyOracleLengthPredictor(true, sigma=sigma, seed=seed)
    predicted = oracle.predict(list(range(n))).lengths
    plan = plan_group(predicted, slots=slots, max_new_tokens=max_new_tokens, prompt_tokens=prompt_tokens)
    true_planned, wall, steps = _timed(run_group, plan)
    planned_steps = list_steps(true_planned, plan.admission_order, slots, max_new_tokens)
    return base, DemoRun("lengthsched priorities", wall, steps, tuple(true_planned), planned_steps), plan


def list_steps(lengths: Sequence[int], order: Sequence[int], slots: int, max_new_tokens: int) -> int:
    """Decode steps of ``slots`` slots that take completions in ``order`` whenever one frees (what
    an engine's priority queue does), for true ``lengths`` (tokens, completion-index order)."""
    in_order = [int(lengths[j]) for j in order]
    queue = plan_group(in_order, slots=slots, max_new_tokens=max(max_new_tokens, *in_order), refill="fcfs",
                       grouping="none")
    return execute(queue, in_order).steps


def format_runs(runs: Sequence[DemoRun]) -> str:
    """The comparison table the example scripts print."""
    lines = [f"{'run':<24} {'wall s':>8} {'engine steps':>13} {'model steps':>12}"]
    for r in runs:
        steps = "n/a" if r.engine_steps is None else str(r.engine_steps)
        lines.append(f"{r.name:<24} {r.wall_s:8.2f} {steps:>13} {r.model_steps:>12}")
    if len(runs) == 2:
        same = sum(a == b for a, b in zip(runs[0].lengths, runs[1].lengths))
        lines.append(f"completions of equal length in both runs: {same}/{len(runs[0].lengths)}")
    return "\n".join(lines)


def run_and_print(run_group: Callable[[Any], tuple[Sequence[int], int | None]], args: argparse.Namespace,
                  prepared: Prepared) -> tuple[DemoRun, DemoRun, Plan]:
    """:func:`compare_orders` with the example's arguments, then print :func:`format_runs`."""
    base, planned, plan = compare_orders(run_group, group_size=args.group_size, slots=prepared.slots,
                                         max_new_tokens=args.max_new_tokens, prompt_tokens=len(prepared.prompt_ids),
                                         sigma=args.sigma, seed=args.seed)
    print(format_runs([base, planned]))
    return base, planned, plan
