"""The ``lengthsched`` command. Subcommands register here; each prints one readable line and exits
non-zero on bad input (exit 2) instead of a traceback, and one line with exit 130 on Ctrl-C.

What :func:`main` does for every command, so that no command has to: output paths (see
:func:`lengthsched.options.check_outputs`) are checked before the command runs, and an
:class:`InvalidArgument` that names an option field is printed with the flag the user typed
(``argument 'max_new_tokens' (--max-new-tokens): ...``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from importlib import import_module
from typing import Any

from .errors import InvalidArgument, LengthschedError
from .hfconfig import preset_names
from .io import atomic_write_text, read_lengths_input
from .memory import ModelMemory, parse_bytes
from .options import (
    BudgetOptions,
    ModelOptions,
    PlanOptions,
    add_arguments,
    check_outputs,
    flag_name,
    from_args,
    reads_stdin,
)
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


#: Keys a JSON object given to ``plan`` may carry (``source`` is a note printed above the table).
PLAN_INPUT_KEYS = ("lengths", "reserve_lengths", "prompt_tokens", "max_new_tokens", "slots", "budget", "model",
                   "source")


def _note(command: str, text: str) -> None:
    print(f"lengthsched {command}: note: {text}", file=sys.stderr)


def _cmd_plan(opts: PlanOptions) -> int:
    data = read_lengths_input(opts.lengths)
    name = "<stdin>" if opts.lengths == "-" else (opts.lengths or "the bundled example")
    unknown = sorted(set(data) - set(PLAN_INPUT_KEYS))
    if unknown:
        raise InvalidArgument("lengths", name, f"a JSON object with only the keys {', '.join(PLAN_INPUT_KEYS)} "
                                               f"(unknown: {', '.join(map(repr, unknown))})")
    pick = lambda name: getattr(opts, name) if getattr(opts, name) is not None else data.get(name)  # noqa: E731
    budget = pick("budget")
    slots = pick("slots")
    note = None
    if opts.budget is not None and opts.slots is None and data.get("slots") is not None:
        # --budget asks for budget mode: the input's slots (a slots-mode setting) is not a cap unless asked for
        note = (f"the input's slots ({data['slots']}) is not used under --budget; pass --slots {data['slots']} "
                "to cap the decoding completions too")
        slots = None
    if slots is None and budget is None:
        raise InvalidArgument("slots", None, "--slots or --budget (or 'slots' / 'budget' in the input)")
    lengths = data["lengths"]
    max_new = pick("max_new_tokens")
    model = pick("model") or (DEFAULT_MODEL if budget is not None else None)
    if model is None:  # slots mode without a model: no memory model for these to shape
        _only_with(opts, ("dtype", "kv_dtype", "block_size", "prompt_kv", "free_kv"),
                   "--budget or --model (they describe the model's memory; --slots alone plans no memory)")
    try:
        memory = None if model is None else load_memory(dataclasses.replace(opts, model=model))
        budget_bytes = None if budget is None else parse_bytes(budget)
        plan = plan_group(
            lengths,
            max_new_tokens=max_new if max_new is not None else _longest(lengths),
            slots=slots,
            budget_bytes=budget_bytes,
            memory=memory,
            prompt_tokens=pick("prompt_tokens") or 0,
            eps=opts.eps,
            refill=opts.refill,
            reserve_lengths=data.get("reserve_lengths"),
            grouping=opts.grouping,
        )
    except InvalidArgument as exc:
        key = "budget" if exc.name == "budget_bytes" else exc.name  # the library's name for what the user gave
        if key in PLAN_INPUT_KEYS and key != "lengths" and getattr(opts, key, None) is None and key in data:
            # the value came from the input file, not from a flag: say where it is
            raise type(exc)(f"{key}' in '{name}", data[key], exc.expected) from None
        if key != exc.name:
            raise type(exc)(key, budget, exc.expected) from None
        raise
    if note:
        _note("plan", note)
    clipped = sum(1 for x in lengths if x > plan.max_new_tokens) if max_new is not None else 0
    if clipped:  # plan_group caps every length at L_max; say so, as simulate does
        _note("plan", f"{clipped} of {len(lengths)} lengths above max_new_tokens {plan.max_new_tokens} are planned "
                      f"as {plan.max_new_tokens}")
    text = plan.to_json(indent=2)
    print(text if opts.json else format_plan(plan, data.get("source")))
    if opts.output is not None:  # after printing: a failed write does not lose the plan
        atomic_write_text(opts.output, text + "\n")
    return 0


def _longest(lengths: Any) -> int:
    try:
        return int(max(lengths))
    except (TypeError, ValueError, OverflowError):  # OverflowError: an infinite length
        raise InvalidArgument("lengths", lengths, "a non-empty list of token counts") from None


def _only_with(opts: Any, names: tuple[str, ...], what: str) -> None:
    """An error naming the first of ``names`` whose option differs from its default: it is set only with ``what``."""
    defaults = {f.name: f.default for f in dataclasses.fields(opts)}
    for name in names:
        if getattr(opts, name) != defaults[name]:
            raise InvalidArgument(name, getattr(opts, name), f"{flag_name(name)} only with {what}")


def _cmd_budget(opts: BudgetOptions) -> int:
    from .errors import check_int
    from .sgpo import BudgetConfig, plan_budget, read_profile

    if not opts.simulate:  # these set the simulated epoch only
        _only_with(opts, ("slots", "kv_budget"), "--simulate POLICIES (it sets the simulated epoch)")
    if (opts.verl_data is None) != (opts.verl_output is None):  # the data set to read and where to write it
        name = "verl_data" if opts.verl_data is None else "verl_output"
        raise InvalidArgument(name, None, f"{flag_name(name)} too: --verl-data names the data set read and "
                                          "--verl-output where the planned one is written")
    if opts.verl_data is None:  # these shape the verl data set only
        _only_with(opts, ("verl_id", "verl_order"), "--verl-data (it shapes the data set written)")
    check_int("max_new_tokens", opts.max_new_tokens, minimum=1)
    if opts.train_epochs is None:  # these set the simulated training run only
        _only_with(opts, ("learn", "replicas", "replica_pool", "step_prompts", "step_completions"),
                   "--train-epochs N (it sets the simulated training run)")
    if opts.rule != "informative":
        _only_with(opts, ("target",), "--rule informative (it sizes groups there)")
    if opts.profile is None and sys.stdin is not None and sys.stdin.isatty():
        raise InvalidArgument("profile", None, "a profile JSON-lines file (or '-' to type it on stdin)")
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
        try:
            epochs = compare_epochs(profile, plan, policies, max_new_tokens=opts.max_new_tokens, slots=opts.slots,
                                    budget_tokens=opts.kv_budget, seed=opts.seed)
        except InvalidArgument as exc:  # the simulator's names for the flags' values
            if exc.name == "policy":
                raise InvalidArgument("simulate", exc.value, exc.expected) from None
            if exc.name in ("slots", "budget_tokens") and opts.slots is None and opts.kv_budget is None:
                raise InvalidArgument("slots", None, f"--slots or --kv-budget with --simulate {opts.simulate} "
                                                     f"({exc.expected})") from None
            raise
        result["epochs"] = [{"policy": r["policy"], "steps_ratio": r["steps_ratio"],
                             "adaptive": dataclasses.asdict(r["adaptive"]) if r["adaptive"] else None,
                             "fixed": dataclasses.asdict(r["fixed"])} for r in epochs]
    training = _budget_training(opts, profile, plan, cfg) if opts.train_epochs is not None else []
    if training:
        result["training"] = training
    verl = None
    if opts.verl_data is not None:  # before printing: a data set the plan cannot be written into is an error
        from .integrations.verl_v1 import write_adaptive_rollout_data

        try:
            verl = write_adaptive_rollout_data(opts.verl_data, opts.verl_output, plan, id_key=opts.verl_id,
                                               default_n=cfg.baseline_group_size, order=opts.verl_order)
        except InvalidArgument as exc:  # the library's names for the flags' values
            flag = {"source": "verl_data", "id_key": "verl_id", "ids": "verl_id",
                    "default_n": "baseline_group_size"}.get(exc.name, exc.name)
            raise InvalidArgument(flag, exc.value, exc.expected) from None
        result["verl_data"] = {"source": opts.verl_data, "output": opts.verl_output, **verl}
    text = json.dumps(result, indent=1)
    table = _format_budget(plan, cfg, epochs, training)
    if verl is not None:
        table += (f"\nverl data: {verl['kept']:,} of {verl['rows']:,} rows written to {opts.verl_output} with "
                  f"__rollout_n__ ({verl['dropped']:,} dropped by the plan, {verl['unprofiled']:,} unprofiled at "
                  f"G={cfg.baseline_group_size}; {verl['profiled_missing']:,} profiled prompts in no row)")
    print(text if opts.json else table)
    if opts.output is not None:  # after printing: a failed write does not lose the plan
        atomic_write_text(opts.output, text + "\n")
    return 0


def _budget_training(opts: Any, profile: list, plan: Any, cfg: Any) -> list[dict[str, Any]]:
    """``lengthsched budget --train-epochs``: each sizing over a simulated training run (``simulate.sgpo_training``)
    on the profile's prompts, its rates taken as the truth; one dict per sizing, fixed G first."""
    from .errors import check_int

    epochs = check_int("train_epochs", opts.train_epochs, minimum=1)
    replicas = check_int("replicas", opts.replicas, minimum=1)
    pool = check_int("replica_pool", opts.replica_pool, minimum=1)
    check_int("step_prompts", opts.step_prompts, minimum=1)
    if opts.step_completions is not None:
        check_int("step_completions", opts.step_completions, minimum=1)
        _only_with(opts, ("step_prompts",), "steps of a prompt count, not with --step-completions (a step filled to "
                                            "a number of completions)")
    from simulate import DEFAULT_POLICY
    from simulate.sgpo_training import SGPO_SIZINGS, prompts_from_profile, run_sgpo_training

    prompts = prompts_from_profile(profile, max_new_tokens=opts.max_new_tokens, learn=opts.learn,
                                   default_length=cfg.default_length, seed=opts.seed)
    step = dict(batch_prompts=None, batch_completions=opts.step_completions) if opts.step_completions else \
        dict(batch_prompts=opts.step_prompts)
    runs = {s: run_sgpo_training(prompts, s, epochs=epochs, group_size=cfg.baseline_group_size, config=cfg,
                                 profile_samples=[len(r.outcomes) for r in profile], plan=plan,
                                 policy=DEFAULT_POLICY, replicas=replicas, budget_tokens=pool * opts.max_new_tokens,
                                 max_new_tokens=opts.max_new_tokens, seed=opts.seed, **step)
            for s in SGPO_SIZINGS}
    fixed = runs["fixed"]
    return [{"sizing": s, "epochs": epochs, "policy": DEFAULT_POLICY, "replicas": replicas,
             "seconds": r.seconds, "profiling_seconds": r.profiling.seconds if r.profiling else 0.0,
             "completions": r.completions, "tokens": r.tokens, "informative": r.informative,
             "informative_completions": r.informative_completions, "informative_per_hour": r.informative_per_hour,
             "informative_completions_per_hour": r.informative_completions_per_hour,
             "advantage_mass_per_hour": r.advantage_mass_per_hour,
             **{f"x_fixed_{name}": x for name, x in r.against(fixed).items()}}
            for s, r in runs.items()]


def _format_budget(plan: Any, cfg: Any, epochs: list[dict[str, Any]], training: list[dict[str, Any]] = ()) -> str:
    """The table of ``lengthsched budget``."""
    kept = plan.kept
    reasons: dict[str, int] = {}
    for p in plan.prompts:
        reasons[p.reason] = reasons.get(p.reason, 0) + 1
    sizes: dict[int, int] = {}
    for p in kept:
        sizes[p.group_size] = sizes.get(p.group_size, 0) + 1
    lines = [f"{len(plan.prompts)} prompts profiled: " + ", ".join(f"{n} {r}" for r, n in sorted(reasons.items())),
             f"kept {len(kept)}; group sizes " + ", ".join(f"G={g}: {n}" for g, n in sorted(sizes.items()))]
    for i in range(cfg.phases):
        phase = plan.phase(i)
        if phase:
            lines.append(f"phase {i}: {len(phase)} prompts, success rate "
                         f"{phase[-1].success_rate:.2f}..{phase[0].success_rate:.2f}")
    lines.append(f"tokens: profiling {plan.profiling_tokens:,.0f} + training {plan.training_tokens:,.0f} = "
                 f"{plan.total_tokens:,.0f}; fixed G={cfg.baseline_group_size} baseline {plan.baseline_tokens:,.0f}; "
                 f"{plan.savings:.2f}x less")
    for r in epochs:
        a, f = r["adaptive"], r["fixed"]
        lines.append(f"epoch under {r['policy']}: {a.steps if a else 0:,} decode steps ({a.completions if a else 0} "
                     f"completions) vs {f.steps:,} ({f.completions}) with G={cfg.baseline_group_size}: "
                     f"{r['steps_ratio']:.3f}")
    if training:
        t = training[0]
        lines.append(f"training run, {t['epochs']} epochs on {t['replicas']} replicas under {t['policy']} (modelled "
                     "rollout seconds, the profile's success rates as the truth; informative: rewards not all alike; "
                     "|advantage|: the sum of GRPO's std-normalised absolute advantages):")
        names = {"fixed": f"fixed G={cfg.baseline_group_size}", "offline": "this plan (profiling counted)",
                 "online": f"online (the run's own rewards, rule {cfg.rule})", "oracle": "true rates (oracle)"}

        def ratio(x: float | None) -> str:
            return "-" if x is None else f"x{x:.2f}"

        for r in training:
            lines.append(f"  {names[r['sizing']]}: {r['seconds']:,.1f} s, {r['completions']:,} completions, "
                         f"{r['informative']:,} informative groups ({r['informative_per_hour']:,.0f}/h, "
                         f"{ratio(r['x_fixed_groups'])}), their completions {r['informative_completions']:,} "
                         f"({r['informative_completions_per_hour']:,.0f}/h, {ratio(r['x_fixed_completions'])}), "
                         f"|advantage| {r['advantage_mass_per_hour']:,.0f}/h ({ratio(r['x_fixed_advantage_mass'])})")
    return "\n".join(lines)


# Subcommands, found lazily: ``lengthsched`` imports none of its sibling packages (simulate,
# predictor_training, sampler); a command's options dataclass and its function are imported by
# name ("module:attribute") when the parser is built or the command runs. A group (``cost``)
# names a table {subcommand: (options, function)} of its own.
COMMANDS: dict[str, tuple[str, str] | str] = {
    "plan": ("lengthsched.options:PlanOptions", "lengthsched.cli:_cmd_plan"),
    "simulate": ("simulate.options:SimulateOptions", "simulate.cli:run_simulate"),
    "budget": ("lengthsched.options:BudgetOptions", "lengthsched.cli:_cmd_budget"),
    "plan-rollout": ("lengthsched.options:PlanRolloutOptions", "lengthsched.rollout_cli:run_plan_rollout"),
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


EPILOG = """examples:
  lengthsched plan                                 plan the bundled example group (10 completions, 4 slots)
  lengthsched plan lengths.txt --budget 24GiB --model qwen3-8b
                                                   plan your predicted lengths under a memory budget
  lengthsched plan-rollout step.jsonl --replicas 4 --budget 40GiB --model qwen3-8b
                                                   place a rollout step's groups on 4 engine replicas
  lengthsched simulate --groups 20                 compare the sampling policies on real CASTILLO groups
  lengthsched budget profile.jsonl                 adaptive group sizes from a difficulty profile
  lengthsched cost show --model qwen3-8b --gpu h100
                                                   modelled step times of one model on one GPU
  lengthsched COMMAND --help                       every flag of a command, with its default

Bad input prints one line naming the flag and exits with status 2; Ctrl-C exits with 130.
Reference: docs/cli.md; start with docs/quickstart.md."""


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(prog="lengthsched", description="Length-aware scheduling for GRPO group rollouts.",
                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"lengthsched {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, entry in COMMANDS.items():
        table = _table(entry)
        if "" in table:
            add_arguments(sub.add_parser(name, help=_summary(table[""][0]), description=table[""][0].__doc__),
                          table[""][0])
            continue
        about = "; ".join(f"{subname}: {_summary(cls).rstrip('.')}" for subname, (cls, _) in table.items())
        inner = sub.add_parser(name, help=about, description=about).add_subparsers(
            dest="subcommand", required=True, parser_class=_Parser)
        for subname, (cls, _) in table.items():
            add_arguments(inner.add_parser(subname, help=_summary(cls), description=cls.__doc__), cls)
    return parser


def _with_flag(exc: InvalidArgument, cls: type) -> str:
    """The message of ``exc``, naming the flag as well when its argument is an option field of ``cls``
    (a positional field is named as it is: it has no flag)."""
    field = next((f for f in dataclasses.fields(cls) if f.name == exc.name), None) \
        if dataclasses.is_dataclass(cls) else None
    text = str(exc)
    if field is None or field.metadata.get("positional"):
        return text
    return text.replace(f"argument '{exc.name}'", f"argument '{exc.name}' ({flag_name(exc.name)})", 1)


def main(argv: Sequence[str] | None = None) -> int:
    label = ""
    try:
        args = build_parser().parse_args(argv)
        table = _table(COMMANDS[args.command])
        cls, run = table[getattr(args, "subcommand", None) or ""]
        run = _load(run) if isinstance(run, str) else run
        label = " ".join(filter(None, (args.command, getattr(args, "subcommand", None))))
        try:
            opts = from_args(cls, args)
            check_outputs(opts)  # before the run: a long run must not be lost to an unwritable path
            if sys.stdin is not None and sys.stdin.isatty():  # never wait on a terminal without saying so
                for name in reads_stdin(opts):
                    _note(label, f"reading {name.upper()} from stdin (type it, then Ctrl-D; or pass a file)")
            return run(opts)
        except InvalidArgument as exc:
            print(f"lengthsched {label}: error: {_with_flag(exc, cls)}", file=sys.stderr)
            return 2
        except (LengthschedError, OSError, ImportError) as exc:
            print(f"lengthsched {label}: error: {exc}", file=sys.stderr)
            return 2
    except KeyboardInterrupt:
        print(f"lengthsched{' ' + label if label else ''}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
