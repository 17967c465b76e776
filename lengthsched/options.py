"""Frozen dataclasses are the single source of every CLI option.

Each field's ``metadata`` carries its help text (and ``choices``); :func:`add_arguments` derives
the argparse flags and defaults from the dataclass, and :func:`from_args` builds the dataclass
back, so the library defaults, the CLI and the generated CLI reference cannot drift apart.

Metadata keys a field may carry: ``help``, ``choices``, ``aliases`` (extra flags such as ``-G``),
``positional=True`` (an argument, not a flag), ``required=True`` (the command cannot run without
it: argparse enforces it and the help says so), and ``output="file"`` or ``output="dir"`` (a path
the command writes: :func:`check_outputs` rejects an unwritable one before the command runs; fields
named ``output``, ``steps_out`` (files), ``plot`` and ``out`` (directories) are outputs without it),
and, on a positional field, ``stdin="-"`` (``-`` reads stdin) or ``stdin="-|none"`` (so does leaving
it out): :func:`stdin_fields`; a positional whose help mentions stdin is read so without it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidArgument
from .memory import DTYPE_BYTES, FreeKV, PromptKV
from .plan import GROUPINGS
from .refill import RefillRule

__all__ = ["PlanOptions", "PlanRolloutOptions", "ModelOptions", "BudgetOptions", "add_arguments", "from_args",
           "flag_name", "output_fields", "check_output_path", "check_outputs", "stdin_fields", "reads_stdin"]


def _opt(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


@dataclass(frozen=True)
class ModelOptions:
    """How the model is deployed: the inputs of :meth:`ModelMemory.from_hf_config`."""

    model: str | None = _opt(None, "a config.json path, a model directory, or a bundled preset name "
                                   "(default: the input's 'model'; qwen3-1.7b where a budget needs one)")
    dtype: str = _opt("bfloat16", "weights and activations dtype", choices=sorted(DTYPE_BYTES))
    kv_dtype: str | None = _opt(None, "KV cache dtype, default --dtype", choices=sorted(DTYPE_BYTES))
    block_size: int = _opt(1, "KV block size in tokens (vLLM 16, SGLang 1)")
    prompt_kv: str = _opt("shared", "prompt KV held once (shared) or per sequence (copied)",
                          choices=[e.value for e in PromptKV])
    free_kv: str = _opt("finish", "when a finished sequence's KV is freed", choices=[e.value for e in FreeKV])


@dataclass(frozen=True)
class PlanOptions(ModelOptions):
    """Plan one group from predicted lengths (slot queues or micro groups, expected steps)."""

    lengths: str | None = _opt(
        None,
        "file of predicted lengths: numbers separated by spaces/commas/newlines, a JSON list, or a "
        "JSON object with 'lengths' (and optionally reserve_lengths, prompt_tokens, max_new_tokens, "
        "slots, budget); '-' reads stdin; default: the bundled example group",
        positional=True,
    )
    slots: int | None = _opt(None, "most completions decoding at once (slots mode)")
    budget: str | None = _opt(None, "memory budget for the group, e.g. 24GiB (budget mode; uses --model)")
    prompt_tokens: int | None = _opt(None, "prompt length P in tokens (default: from the input, else 0)")
    max_new_tokens: int | None = _opt(None, "L_max in tokens (default: from the input, else the longest length)")
    eps: float = _opt(0.05, "FPTAS approximation parameter, 0 < eps <= 1")
    refill: str = _opt("sjf", "runtime refill rule", choices=[r.value for r in RefillRule])
    grouping: str = _opt("fptas", "how completions are grouped into slot queues / micro groups",
                         choices=list(GROUPINGS))
    json: bool = _opt(False, "print the plan as JSON instead of a table")
    output: str | None = _opt(None, "also write the plan JSON to this file (atomically)", output="file")


@dataclass(frozen=True)
class BudgetOptions:
    """Adaptive group sizes from a difficulty profile: keep, size and order prompts; compare compute."""

    profile: str | None = _opt(None, "profile JSON lines: {id, outcomes: [0/1...] or solved + samples, lengths, "
                                     "prompt_tokens}; '-' (or nothing, when stdin is a pipe) reads stdin",
                               positional=True, stdin="-")  # nothing on a terminal is an error, not a wait
    g_min: int = _opt(2, "smallest group size")
    g_max: int = _opt(32, "largest group size (also for kept unsolved prompts)")
    rule: str = _opt("pow2", "group size from the success rate p: pow2 (power of two <= 1/p), ceil (ceil 1/p) or "
                             "informative (the smallest group whose rewards differ with probability --target)",
                     choices=["pow2", "ceil", "informative"])
    target: float = _opt(0.9, "with --rule informative: the probability that a group's rewards differ")
    drop_above: float = _opt(0.9, "drop prompts solved more often than this (trivial)")
    unsolved_fraction: float = _opt(0.1, "share of never-solved prompts kept (seeded)")
    phases: int = _opt(3, "curriculum phases, easy to hard")
    baseline_group_size: int = _opt(16, "the fixed group size compared against")
    default_length: int = _opt(512, "expected completion tokens where the profile has no lengths")
    seed: int = _opt(0, "seed of the unsolved-prompt sample and of the simulated epoch's lengths")
    simulate: str | None = _opt(None, "also simulate the epoch (adaptive vs fixed G) under these comma-separated "
                                      "policies, e.g. fixed_slot,length_aware")
    slots: int | None = _opt(None, "slots of the simulated epoch (with --simulate)")
    kv_budget: int | None = _opt(None, "KV token budget of the simulated epoch, tokens beyond the prompt "
                                       "(with --simulate)")
    max_new_tokens: int = _opt(4096, "L_max of the simulated epoch and training run, tokens")
    train_epochs: int | None = _opt(None, "also simulate a training run of this many epochs in modelled rollout "
                                          "seconds: a fixed G (--baseline-group-size), this plan (its profiling "
                                          "pass counted), sGPO online from the run's own rewards, and sGPO on the "
                                          "true rates (oracle); the profile's success rates are the truth")
    learn: float = _opt(0.0, "with --train-epochs: log-odds each prompt's success gains per epoch (x U(0, 1))")
    replicas: int = _opt(4, "with --train-epochs: engine replicas of each rollout step")
    replica_pool: int = _opt(16, "with --train-epochs: each replica's KV pool, x --max-new-tokens tokens")
    step_prompts: int = _opt(64, "with --train-epochs: prompts per rollout step (verl's data.train_batch_size)")
    step_completions: int | None = _opt(None, "with --train-epochs: fill each step to this many completions "
                                              "instead of --step-prompts prompts")
    json: bool = _opt(False, "print the plan as JSON")
    output: str | None = _opt(None, "also write the JSON plan to this file (atomically)", output="file")
    verl_data: str | None = _opt(None, "a verl data set (parquet, verl's data.train_files) to write the plan into, "
                                       "with --verl-output: the rows the plan keeps, each with its group size as "
                                       "__rollout_n__ (what verl's v1 trainer runs per prompt), unprofiled rows at "
                                       "--baseline-group-size")
    verl_output: str | None = _opt(None, "where to write that data set (parquet, atomically)", output="file")
    verl_id: str = _opt("extra_info.index", "the column of --verl-data holding each row's prompt id (matched with "
                                            "the profile's ids as text); a dotted path into struct columns")
    verl_order: str = _opt("data", "the rows' order in --verl-output: data (as read) or curriculum (the plan's "
                                   "phases, easiest first; keep it with verl's data.shuffle=False)",
                           choices=["data", "curriculum"])


@dataclass(frozen=True)
class PlanRolloutOptions(ModelOptions):
    """Plan one RL rollout step: place B groups' completions on R engine replicas and order each replica's."""

    step: str | None = _opt(
        None,
        "JSON lines, one group a line: {\"key\": its prompt's id (default: the line's number), \"predicted\": "
        "one length for every sibling with \"size\": G, or a list of G lengths (tokens), \"prompt_tokens\": "
        "its prompt's length (default 0)}; '-' reads stdin",
        positional=True, required=True, stdin="-")
    replicas: int | None = _opt(None, "engine replicas the step runs on", required=True)
    placement: str = _opt("ways", "how the completions are placed: ways (steal's: each group over as many replicas "
                                  "as the pools hold its prompts, whole groups in crowded steps; needs the pool), "
                                  "groups (whole groups by predicted work), spread (verl's: completion i to "
                                  "replica i mod R), classes (length classes, priced for Qwen3-1.7B on the H100 "
                                  "preset; needs the pool)",
                          choices=["ways", "groups", "spread", "classes"])
    pool_tokens: int | None = _opt(None, "each replica's KV pool in tokens, prompts included (ways and classes; or "
                                         "--budget)")
    budget: str | None = _opt(None, "each replica's memory, e.g. 40GiB: its pool is what is left after --model's "
                                    "weights (default model qwen3-1.7b) and the activations of 256 decode rows "
                                    "(instead of --pool-tokens)")
    max_new_tokens: int | None = _opt(None, "L_max in tokens (classes; default: the longest prediction)")
    order: str | None = _opt(None, "each replica's start order: longest (longest predicted first), batch (the "
                                   "input's order), longest_crowded (longest first where every group is whole); "
                                   "default: batch for ways, longest for the others",
                             choices=["longest", "batch", "longest_crowded"])
    loads: str | None = _opt(None, "comma-separated predicted tokens each replica already has (an earlier batch "
                                   "still running or queued), one per replica: groups and ways place from them "
                                   "(default: idle replicas)")
    json: bool = _opt(False, "print the plan as JSON instead of a table")
    output: str | None = _opt(None, "also write the plan JSON to this file (atomically)", output="file")


def _base_type(annotation: Any) -> type:
    hint = annotation if not isinstance(annotation, str) else eval(annotation, vars(typing))  # noqa: S307
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def flag_name(name: str) -> str:
    """The command-line flag of the option field ``name``: ``max_new_tokens`` -> ``--max-new-tokens``."""
    return "--" + name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one flag per field of the dataclass ``cls`` (``positional`` fields become arguments).

    Every flag's help shows its default (when it is not None / False) and ``(required)`` for a
    field marked ``required=True``, which argparse then enforces.
    """
    for f in dataclasses.fields(cls):
        meta = dict(f.metadata)
        kind = _base_type(f.type)
        meta["help"] = meta.get("help", "").replace("%", "%%")  # argparse formats help with % ("95%" would break it)
        help_text = meta["help"]
        required = bool(meta.get("required"))
        if meta.get("choices"):
            help_text += ": " + ", ".join(meta["choices"])
        if required:
            help_text += " (required)"
        elif f.default is not None and f.default is not False:  # 0 is a default to show, unlike False
            help_text += f" (default: {f.default})"
        if meta.get("positional"):
            parser.add_argument(f.name, nargs=None if required else "?", default=f.default, help=help_text)
        elif kind is bool:
            parser.add_argument(flag_name(f.name), action="store_true", help=meta.get("help"))
        else:
            flags = [*meta.get("aliases", ()), flag_name(f.name)]  # e.g. "-G" for --group-size
            parser.add_argument(*flags, dest=f.name, type=kind, default=f.default, required=required,
                                choices=meta.get("choices"), help=help_text, metavar=f.name.upper())


def from_args(cls: type, args: argparse.Namespace) -> Any:
    """The dataclass ``cls`` built from parsed arguments."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


#: Fields that are output paths by their name alone (``output="file"|"dir"`` metadata overrides).
OUTPUT_NAMES = {"output": "file", "steps_out": "file", "plot": "dir", "out": "dir"}


def output_fields(cls: type) -> dict[str, str]:
    """{field name: ``"file"`` or ``"dir"``} for every field of ``cls`` that names a path it writes."""
    out = {}
    for f in dataclasses.fields(cls):
        kind = f.metadata.get("output", OUTPUT_NAMES.get(f.name))
        if kind in ("file", "dir"):
            out[f.name] = kind
    return out


def _writable_dir(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


def check_output_path(name: str, value: Any, kind: str = "file") -> None:
    """Raise :class:`InvalidArgument` naming ``name`` unless ``value`` can be written as a ``kind``
    (``"file"``: its directory exists and is writable and it is not a directory; ``"dir"``: it is
    a writable directory, or the nearest existing directory above it is writable)."""
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value).strip():
        raise InvalidArgument(name, value, f"a {kind} path to write, not empty")
    path = os.path.abspath(os.fspath(value))
    if kind == "dir":
        probe = path
        while not os.path.exists(probe):
            probe = os.path.dirname(probe)
        if not os.path.isdir(probe):
            raise InvalidArgument(name, value, f"a directory path ({probe!r} is a file, not a directory)")
        if not _writable_dir(probe):
            raise InvalidArgument(name, value, f"a directory path this user can write ({probe!r} is not writable)")
        return
    if os.path.isdir(path):
        raise InvalidArgument(name, value, "a file path to write (it is a directory)")
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise InvalidArgument(name, value, f"a file path in an existing directory ({parent!r} does not exist)")
    if not _writable_dir(parent):
        raise InvalidArgument(name, value, f"a file path in a directory this user can write ({parent!r} is not "
                                           "writable)")


def check_outputs(opts: Any) -> None:
    """Check every output path of the options ``opts`` (see :func:`output_fields`) before a command runs,
    so that a long run is not lost to a path it cannot write. Unset (None) outputs are skipped."""
    for name, kind in output_fields(type(opts)).items():
        value = getattr(opts, name)
        if value is not None:
            check_output_path(name, value, kind)


def stdin_fields(cls: type) -> dict[str, bool]:
    """{positional field name: whether leaving it out also reads stdin} for every positional field of
    ``cls`` that reads stdin (metadata ``stdin``, else a help text that mentions stdin: "'-' or nothing
    reads stdin" counts as both)."""
    out = {}
    for f in dataclasses.fields(cls):
        if not f.metadata.get("positional"):
            continue
        mode = f.metadata.get("stdin")
        if mode is None and "stdin" in f.metadata.get("help", ""):
            mode = "-|none" if "nothing reads stdin" in f.metadata["help"] else "-"
        if mode:
            out[f.name] = mode == "-|none"
    return out


def reads_stdin(opts: Any) -> list[str]:
    """The positional fields of ``opts`` that will be read from stdin as given (``-``, or left out)."""
    return [name for name, when_none in stdin_fields(type(opts)).items()
            if getattr(opts, name) == "-" or (when_none and getattr(opts, name) is None)]
