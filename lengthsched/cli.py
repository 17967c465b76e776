"""The ``lengthsched`` command. Subcommands register here; each prints one readable line and exits
non-zero on bad input (exit 2) instead of a traceback."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from importlib import import_module
from typing import Any, Callable, Sequence

from .errors import InvalidArgument, LengthschedError
from .hfconfig import preset_names
from .io import atomic_write_text, read_lengths_input
from .memory import ModelMemory, parse_bytes
from .options import BudgetOptions, ModelOptions, PlanOptions, add_arguments, from_args
from .plan import Plan, plan_group

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


def _cmd_budget(opts: BudgetOptions) -> int:
    from .sgpo import BudgetConfig, plan_budget, read_profile

    if opts.profile in (None, "-"):
        lines, source = sys.stdin.read().splitlines(), "<stdin>"
    else:
        try:
            with open(opts.profile, encoding="utf-8") as handle:
                lines, source = handle.read().splitlines(), opts.profile
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidArgument("profile", opts.profile, f"a readable JSON lines file ({exc.__class__.__name__})") \
                from None
    fields = {f.name for f in dataclasses.fields(BudgetConfig)}
    cfg = BudgetConfig(**{k: v for k, v in dataclasses.asdict(opts).items() if k in fields})
    profile = read_profile(lines, source)
    plan = plan_budget(profile, cfg)
    result = plan.to_dict()
    epochs = []
    if opts.simulate:
        from simulate.epoch import compare_epochs

        policies = [p.strip() for p in opts.simulate.split(",") if p.strip()]
        epochs = compare_epochs(profile, plan, policies, max_new_tokens=opts.max_new_tokens, slots=opts.slots,
                                budget_tokens=opts.kv_budget, seed=opts.seed)
        result["epochs"] = [{"policy": r["policy"], "steps_ratio": r["steps_ratio"],
                             "adaptive": dataclasses.asdict(r["adaptive"]) if r["adaptive"] else None,
                             "fixed": dataclasses.asdict(r["fixed"])} for r in epochs]
    text = json.dumps(result, indent=1)
    if opts.output:
        atomic_write_text(opts.output, text + "\n")
    if opts.json:
        print(text)
        return 0
    kept = plan.kept
    reasons: dict[str, int] = {}
    for p in plan.prompts:
        reasons[p.reason] = reasons.get(p.reason, 0) + 1
    sizes: dict[int, int] = {}
    for p in kept:
        sizes[p.group_size] = sizes.get(p.group_size, 0) + 1
    print(f"{len(plan.prompts)} prompts profiled: " + ", ".join(f"{n} {r}" for r, n in sorted(reasons.items())))
    print(f"kept {len(kept)}; group sizes " + ", ".join(f"G={g}: {n}" for g, n in sorted(sizes.items())))
    for i in range(cfg.phases):
        phase = plan.phase(i)
        if phase:
            print(f"phase {i}: {len(phase)} prompts, success rate {phase[-1].success_rate:.2f}..{phase[0].success_rate:.2f}")
    print(f"tokens: profiling {plan.profiling_tokens:,.0f} + training {plan.training_tokens:,.0f} = "
          f"{plan.total_tokens:,.0f}; fixed G={cfg.baseline_group_size} baseline {plan.baseline_tokens:,.0f}; "
          f"{plan.savings:.2f}x less")
    for r in epochs:
        a, f = r["adaptive"], r["fixed"]
        print(f"epoch under {r['policy']}: {a.steps if a else 0:,} decode steps ({a.completions if a else 0} "
              f"completions) vs {f.steps:,} ({f.completions}) with G={cfg.baseline_group_size}: "
              f"{r['steps_ratio']:.3f}")
    return 0


# Subcommands, found lazily: ``lengthsched`` imports none of its sibling packages (simulate,
# predictor_training, sampler); a command's options dataclass and its function are imported by
# name ("module:attribute") when the parser is built or the command runs. A group (``cost``)
# names a table {subcommand: (options, function)} of its own.
COMMANDS: dict[str, tuple[str, str] | str] = {
    "plan": ("lengthsched.options:PlanOptions", "lengthsched.cli:_cmd_plan"),
    "simulate": ("simulate.options:SimulateOptions", "simulate.cli:run_simulate"),
    "budget": ("lengthsched.options:BudgetOptions", "lengthsched.cli:_cmd_budget"),
    "cost": "lengthsched.cost_cli:COST_COMMANDS",
    "train": ("predictor_training.options:TrainOptions", "predictor_training.cli:run_train"),
    "predict": ("predictor_training.options:PredictOptions", "predictor_training.cli:run_predict"),
    "eval-predictor": ("predictor_training.options:EvalOptions", "predictor_training.cli:run_eval"),
    "sample": ("sampler.options:SampleOptions", "sampler.cli:run_sample"),
}


def _load(spec: str) -> Any:
    """The object named ``"module:attribute"``."""
    module, _, attr = spec.partition(":")
    return getattr(import_module(module), attr)


def _table(entry: tuple[str, str] | str) -> dict[str, tuple[type, Callable[[Any], int] | str]]:
    """A group's {subcommand: (options class, function)}; for a plain command {"": (class, "module:fn")}."""
    if isinstance(entry, str):
        return _load(entry)
    return {"": (_load(entry[0]), entry[1])}


def _summary(cls: type) -> str:
    return (cls.__doc__ or "").strip().splitlines()[0]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lengthsched", description="Length-aware scheduling for GRPO group rollouts.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, entry in COMMANDS.items():
        table = _table(entry)
        if "" in table:
            add_arguments(sub.add_parser(name, help=_summary(table[""][0]), description=table[""][0].__doc__),
                          table[""][0])
            continue
        about = "; ".join(f"{subname}: {_summary(cls)}" for subname, (cls, _) in table.items())
        inner = sub.add_parser(name, help=about, description=about).add_subparsers(
            dest="subcommand", required=True, parser_class=_Parser)
        for subname, (cls, _) in table.items():
            add_arguments(inner.add_parser(subname, help=_summary(cls), description=cls.__doc__), cls)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    table = _table(COMMANDS[args.command])
    cls, run = table[getattr(args, "subcommand", None) or ""]
    run = _load(run) if isinstance(run, str) else run
    label = " ".join(filter(None, (args.command, getattr(args, "subcommand", None))))
    try:
        return run(from_args(cls, args))
    except (LengthschedError, OSError, ImportError) as exc:
        print(f"lengthsched {label}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
