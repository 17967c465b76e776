"""``lengthsched plan-rollout``: plan one RL rollout step from predicted lengths, for a rollout engine or
router that is not written in Python (or that only wants the numbers).

The step is B groups (one prompt each, G completions) to run on R engine replicas. The plan is
:func:`lengthsched.integrations.plan_rollout`'s: every completion's replica and its engine priority
(``rank x R + replica``: on every replica a lower value starts first, and ``priority mod R`` is the
replica), each group's replica (-1 where it is spread), and each replica's predicted work. The
default placement is ``ways``, what the simulator's ``steal`` places by (``simulate.DEFAULT_POLICY``):
each group over as many replicas as their KV pools hold its prompt, whole groups once the step's
predicted tokens fill every pool :data:`~lengthsched.integrations.rollout.CROWDED_POOLS` times over.
Stealing at run time (a drained replica taking what waits elsewhere) is the engine's or the
framework's part: :class:`lengthsched.integrations.ClientQueues` and
:class:`lengthsched.integrations.StealCoordinator` do it in Python.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from .errors import InvalidArgument
from .integrations.rollout import RolloutPlan, plan_rollout
from .io import atomic_write_text, read_json_objects
from .memory import parse_bytes, rollout_pool_tokens
from .options import PlanRolloutOptions

__all__ = ["StepGroup", "read_step", "plan_step", "run_plan_rollout", "format_rollout_plan", "rollout_plan_dict"]

STEP_KEYS = ("key", "predicted", "size", "prompt_tokens")
MAX_GROUP_SIZE = 2**20  # completions of one group: a guard against a typo that would fill the memory


@dataclasses.dataclass(frozen=True)
class StepGroup:
    """One group of a step: its ``key``, its completions' predicted lengths (tokens) and its prompt's
    length (tokens)."""

    key: Any
    predicted: tuple[int, ...]
    prompt_tokens: int


def _count(value: Any, what: str, where: str, minimum: int, *, whole: bool = True) -> int:
    """``value`` as tokens or a count: a finite number >= ``minimum`` (``whole``: an integer; else rounded)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value \
        and value not in (float("inf"), float("-inf")) and value >= minimum
    if not ok or (whole and isinstance(value, float) and not value.is_integer()):
        kind = "an integer" if whole else "a number"
        raise InvalidArgument("step", where, f"'{what}' {kind} >= {minimum} (got {value!r})")
    return int(round(value))


def read_step(source: str) -> list[StepGroup]:
    """The groups of a step file (JSON lines, :class:`~lengthsched.options.PlanRolloutOptions`' ``step``;
    ``-``: standard input). A bad line raises :class:`InvalidArgument` naming the file and line."""
    groups: list[StepGroup] = []
    keys: set = set()
    for number, record in read_json_objects(source, "step"):
        where = f"line {number} of {'<stdin>' if source == '-' else source}"  # the line first: long paths are cut
        unknown = sorted(set(record) - set(STEP_KEYS))
        if unknown:
            raise InvalidArgument("step", where, f"only the keys {', '.join(STEP_KEYS)} (unknown: "
                                                 f"{', '.join(map(repr, unknown))})")
        if "predicted" not in record:
            raise InvalidArgument("step", where, "a 'predicted' length (tokens) or list of lengths")
        pred = record["predicted"]
        if isinstance(pred, list):
            if "size" in record and record["size"] != len(pred):
                raise InvalidArgument("step", where, f"'size' equal to the {len(pred)} predicted lengths listed "
                                                     f"(got {record['size']!r})")
            lengths = tuple(_count(x, "predicted", where, 0, whole=False) for x in pred)
        else:
            if "size" not in record:
                raise InvalidArgument("step", where, "a 'size' (completions of the group) beside one 'predicted' "
                                                     "length, or a list of lengths")
            size = _count(record["size"], "size", where, 1)
            if size > MAX_GROUP_SIZE:
                raise InvalidArgument("step", where, f"'size' at most {MAX_GROUP_SIZE:,} completions (got {size:,})")
            lengths = (_count(pred, "predicted", where, 0, whole=False),) * size
        if not lengths:
            raise InvalidArgument("step", where, "at least one completion")
        key = record.get("key", number)
        if not isinstance(key, (str, int)) or isinstance(key, bool):
            raise InvalidArgument("step", where, f"a string or integer 'key' (got {key!r})")
        if key in keys:
            raise InvalidArgument("step", where, f"a key no other group has (got {key!r} again)")
        keys.add(key)
        groups.append(StepGroup(key, lengths, _count(record.get("prompt_tokens", 0), "prompt_tokens", where, 0)))
    if not groups:
        raise InvalidArgument("step", "<stdin>" if source == "-" else source, "at least one group (a JSON object "
                                                                               "per line)")
    return groups


def plan_step(groups: list[StepGroup], replicas: int, *, placement: str = "ways", pool_tokens: int | None = None,
              max_new_tokens: int | None = None, order: str | None = None,
              loads: list[float] | None = None) -> RolloutPlan:
    """:func:`~lengthsched.integrations.plan_rollout` on ``groups`` (rows in group order, then completion
    order); ``loads``: predicted tokens each replica already has."""
    keys = [g.key for g in groups for _ in g.predicted]
    pred = [x for g in groups for x in g.predicted]
    prompts = [g.prompt_tokens for g in groups for _ in g.predicted]
    extra: dict[str, Any] = {}
    if placement in ("ways", "classes"):
        if pool_tokens is None:
            raise InvalidArgument("pool_tokens", None, f"each replica's KV pool in tokens (placement {placement!r} "
                                                       "needs it: --pool-tokens, or --budget with --model)")
        extra = {"prompt_lens": prompts, "budget_tokens": pool_tokens}
    if placement == "classes":
        extra["max_new_tokens"] = max_new_tokens if max_new_tokens is not None else max(1, max(pred))
    if loads is not None:
        extra["loads"] = loads
    return plan_rollout(keys, pred, replicas=replicas, placement=placement, order=order, **extra)


def _pool(opts: PlanRolloutOptions) -> int | None:
    if opts.pool_tokens is not None and opts.budget is not None:
        raise InvalidArgument("budget", opts.budget, "either --budget or --pool-tokens, not both")
    if opts.pool_tokens is not None:
        if opts.pool_tokens < 1:
            raise InvalidArgument("pool_tokens", opts.pool_tokens, "a KV pool of at least 1 token")
        return opts.pool_tokens
    if opts.budget is None:
        return None
    from .cli import DEFAULT_MODEL, load_memory

    memory = load_memory(dataclasses.replace(opts, model=opts.model or DEFAULT_MODEL))
    return rollout_pool_tokens(memory, parse_bytes(opts.budget, "budget"), given=opts.budget)


def _loads(text: str | None) -> list[float] | None:
    """``--loads``: comma-separated token counts (checked against the replicas by plan_rollout)."""
    if text is None:
        return None
    try:
        return [float(x) for x in str(text).split(",")]
    except ValueError:
        raise InvalidArgument("loads", text, "comma-separated predicted tokens, one per replica") from None


def rollout_plan_dict(plan: RolloutPlan, groups: list[StepGroup], pool_tokens: int | None) -> dict[str, Any]:
    """The plan as JSON-ready data: per completion (``rows``, in the input's order) its group's key, its
    index in the group, replica, priority, rank and predicted length (tokens); per group its replica
    (-1: spread) and the replicas it is on; per replica its predicted work (tokens), completions, groups
    and the prompt tokens it holds (each prompt once per replica that runs one of its completions); and
    the submission order (row indices, ascending priority)."""
    rows, on, index = [], [], 0
    for g in groups:
        here = set()
        for j in range(len(g.predicted)):
            rows.append({"key": g.key, "completion": j, "replica": plan.replica[index],
                         "priority": plan.priority[index], "rank": plan.rank[index],
                         "predicted": plan.predicted[index]})
            here.add(plan.replica[index])
            index += 1
        on.append(sorted(here))
    span = range(plan.replicas)
    return {"replicas": plan.replicas, "placement": plan.placement, "order": plan.order, "pool_tokens": pool_tokens,
            "groups": [{"key": g.key, "completions": len(g.predicted), "prompt_tokens": g.prompt_tokens,
                        "replica": plan.group_replica[i], "on": on[i]} for i, g in enumerate(groups)],
            "replica_work": list(plan.replica_work),
            "replica_completions": [sum(1 for r in plan.replica if r == k) for k in span],
            "replica_groups": [sum(1 for rs in on if k in rs) for k in span],
            "replica_prompt_tokens": [sum(g.prompt_tokens for g, rs in zip(groups, on) if k in rs) for k in span],
            "submission_order": list(plan.submission_order()), "rows": rows}


def format_rollout_plan(data: dict[str, Any]) -> str:
    """A table of :func:`rollout_plan_dict`'s data: one line per replica, then how to use the plan."""
    groups = data["groups"]
    work = int(sum(data["replica_work"]))
    spread = sorted({len(g["on"]) for g in groups})
    pool = data["pool_tokens"]
    head = (f"{len(groups)} groups, {sum(g['completions'] for g in groups):,} completions ({work:,} predicted "
            f"tokens, prompts {sum(g['prompt_tokens'] for g in groups):,} tokens) on {data['replicas']} replicas"
            + (f" with pools of {pool:,} KV tokens" if pool else "")
            + f": placement {data['placement']} (each group on {'/'.join(map(str, spread))} "
            f"replica{'s' if spread != [1] else ''}), each replica's order {data['order']}")
    mean = work / data["replicas"]
    table = [["replica", "groups", "completions", "predicted tokens", "x mean", "prompt tokens held"]
             + (["(predicted + prompts) / pool"] if pool else [])]
    for r in range(data["replicas"]):
        w, held = data["replica_work"][r], data["replica_prompt_tokens"][r]
        table.append([str(r), str(data["replica_groups"][r]), f"{data['replica_completions'][r]:,}", f"{w:,}",
                      f"{w / mean:.3f}" if mean else "-", f"{held:,}"] + ([f"{(w + held) / pool:.2f}"] if pool else []))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = [head, ""] + ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in table]
    lines += ["", "each completion's replica and priority: --json (rows); on every replica a lower priority starts "
                  "first and priority mod replicas is the replica (vLLM's priority scheduling and "
                  "lengthsched.integrations.decode_replica read it); an engine that admits first come, first "
                  "served starts them in the plan's order when they are submitted in submission_order"]
    return "\n".join(lines)


def run_plan_rollout(opts: PlanRolloutOptions) -> int:
    groups = read_step(opts.step)
    if opts.replicas is None or opts.replicas < 1:
        raise InvalidArgument("replicas", opts.replicas, "at least 1 engine replica")
    if opts.max_new_tokens is not None and opts.max_new_tokens < 1:
        raise InvalidArgument("max_new_tokens", opts.max_new_tokens, "at least 1 token")
    pool = _pool(opts)
    largest = max((g.prompt_tokens for g in groups), default=0)
    if pool is not None and pool <= largest:  # no replica could hold even that prompt with one generated token
        name = "pool_tokens" if opts.pool_tokens is not None else "budget"
        raise InvalidArgument(name, opts.pool_tokens if opts.pool_tokens is not None else opts.budget,
                              f"a KV pool of more than the largest prompt ({largest:,} tokens; the pool would hold "
                              f"{pool:,})")
    plan = plan_step(groups, opts.replicas, placement=opts.placement, pool_tokens=pool,
                     max_new_tokens=opts.max_new_tokens, order=opts.order, loads=_loads(opts.loads))
    data = rollout_plan_dict(plan, groups, pool)
    text = json.dumps(data, indent=1)
    print(text if opts.json else format_rollout_plan(data))
    if opts.output is not None:  # after printing: a failed write does not lose the plan
        atomic_write_text(opts.output, text + "\n")
    return 0

