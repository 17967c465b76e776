"""The ``lengthsched`` command. Subcommands register here; each prints one readable line and exits
non-zero on bad input (exit 2) instead of a traceback."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any, Callable, Sequence

from .errors import InvalidArgument, LengthschedError
from .hfconfig import preset_names
from .io import atomic_write_text, read_lengths_input
from .memory import ModelMemory, parse_bytes
from .options import ModelOptions, PlanOptions, add_arguments, from_args
from .plan import Plan, plan_group

# The simulator is numpy-only at import time; its report imports scipy, tqdm, matplotlib when run.
from simulate.cli import run_simulate  # noqa: E402  (isort: the sibling package after our own)
from simulate.options import SimulateOptions  # noqa: E402
# The predictor commands import torch / transformers only when they run.
from predictor_training.cli import run_eval, run_predict, run_train  # noqa: E402
from predictor_training.options import EvalOptions, PredictOptions, TrainOptions  # noqa: E402
from sampler.cli import run_sample  # noqa: E402
from sampler.options import SampleOptions  # noqa: E402

__all__ = ["main", "build_parser", "load_memory", "DEFAULT_MODEL"]

DEFAULT_MODEL = "qwen3-1.7b"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line instead of usage + message
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def load_memory(opts: ModelOptions) -> ModelMemory:
    """The :class:`ModelMemory` described by ``opts`` (a config path, a directory or a preset)."""
    if opts.model is None:
        raise InvalidArgument("model", None, "a config.json path or a preset: " + ", ".join(preset_names()))
    return ModelMemory.from_name(opts.model, opts.dtype, kv_dtype=opts.kv_dtype, block_size=opts.block_size,
                                 prompt_kv=opts.prompt_kv, free_kv=opts.free_kv)


def _gib(value: int) -> str:
    return f"{value / 2**30:.2f} GiB"


def format_plan(plan: Plan, note: str | None = None) -> str:
    """A human-readable table of a plan."""
    lines = [
        f"{len(plan.lengths)} completions, {plan.mode} mode, {plan.slots} slots, refill {plan.refill}, "
        f"grouping {plan.grouping} (eps {plan.eps})",
        f"expected steps {plan.expected_steps}, lower bound {plan.lower_bound}, ratio {plan.ratio:.3f}",
    ]
    if note:
        lines.insert(0, note)
    if plan.peak_reserved_bytes is not None:
        budget = "" if plan.budget_bytes is None else f" of budget {_gib(plan.budget_bytes)}"
        lines.append(f"model {plan.model}: peak reserved {_gib(plan.peak_reserved_bytes)}{budget}")
    label = "slot" if plan.mode == "slots" else "micro group"
    lines.append(f"{label:>11}  {'predicted tokens':>16}  completions (index:predicted length)")
    for u, unit in enumerate(plan.units):
        total = sum(plan.lengths[j] for j in unit)
        members = " ".join(f"{j}:{plan.lengths[j]}" for j in unit)
        lines.append(f"{u:>11}  {total:>16}  {members}")
    return "\n".join(lines)


def _cmd_plan(opts: PlanOptions) -> int:
    data = read_lengths_input(opts.lengths)
    pick = lambda name: getattr(opts, name) if getattr(opts, name) is not None else data.get(name)  # noqa: E731
    budget = pick("budget")
    slots = pick("slots") if budget is None or opts.slots is not None else None
    if slots is None and budget is None:
        raise InvalidArgument("slots", None, "--slots or --budget (or 'slots' / 'budget' in the input)")
    lengths = data["lengths"]
    max_new = pick("max_new_tokens")
    model = pick("model") or (DEFAULT_MODEL if budget is not None else None)
    memory = None if model is None else load_memory(dataclasses.replace(opts, model=model))
    plan = plan_group(
        lengths,
        max_new_tokens=max_new if max_new is not None else _longest(lengths),
        slots=slots,
        budget_bytes=None if budget is None else parse_bytes(budget),
        memory=memory,
        prompt_tokens=pick("prompt_tokens") or 0,
        eps=opts.eps,
        refill=opts.refill,
        reserve_lengths=data.get("reserve_lengths"),
        grouping=opts.grouping,
    )
    text = plan.to_json(indent=2)
    if opts.output:
        atomic_write_text(opts.output, text + "\n")
    print(text if opts.json else format_plan(plan, data.get("source")))
    return 0


def _longest(lengths: Any) -> int:
    try:
        return int(max(lengths))
    except (TypeError, ValueError):
        raise InvalidArgument("lengths", lengths, "a non-empty list of token counts") from None


COMMANDS: dict[str, tuple[type, Callable[[Any], int]]] = {
    "plan": (PlanOptions, _cmd_plan),
    "simulate": (SimulateOptions, run_simulate),
    "train": (TrainOptions, run_train),
    "predict": (PredictOptions, run_predict),
    "eval-predictor": (EvalOptions, run_eval),
    "sample": (SampleOptions, run_sample),
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lengthsched", description="Length-aware scheduling for GRPO group rollouts.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (cls, _) in COMMANDS.items():
        add_arguments(sub.add_parser(name, help=(cls.__doc__ or "").strip().splitlines()[0],
                                     description=cls.__doc__), cls)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cls, run = COMMANDS[args.command]
    try:
        return run(from_args(cls, args))
    except (LengthschedError, OSError, ImportError) as exc:
        print(f"lengthsched {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
