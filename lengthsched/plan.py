"""``plan_group``: predicted lengths in, a :class:`Plan` that any engine can consume out.

Two modes (docs/model.md sections 4 and 6):

- slots mode (``slots=k``): the group is split into k slot queues by a balanced partition of the
  predicted lengths (the FPTAS by default); a slot runs its queue back to back in refill-rule
  order and takes work from the busiest queue when its own is empty.
- budget mode (``budget_bytes`` + ``memory``): every completion reserves the bytes of its reserved
  length (``reserve_lengths``, e.g. a predicted quantile; default ``max_new_tokens``) plus its
  activation share. Or, in KV tokens (``budget_tokens``, no memory model: what a runtime that
  already converted its budget plans with), every completion reserves its reserved length in
  tokens. The group is packed into memory-feasible micro groups by the
  cardinality-constrained subset-sum FPTAS and admitted micro group by micro group, in refill-rule
  order within one, as reservations free (``slots`` then caps how many decode at once).

The plan records what it expects under its own predictions: the admission order, the start step of
every completion, the step count, and a lower bound that no schedule can beat.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import partition as _partition
from .errors import BudgetTooSmall, InvalidArgument, as_lengths, check_int, check_positive_float
from .memory import ModelMemory
from .packing import pack_micro_groups
from .refill import RefillRule, parse_rule
from .schedule import execute

__all__ = ["Plan", "plan_group", "GROUPINGS", "PLAN_FORMAT"]

PLAN_FORMAT = "lengthsched.plan/1"
GROUPINGS = ("fptas", "lpt", "karmarkar_karp", "exact", "none")


@dataclass(frozen=True)
class Plan:
    """How to generate one group. Lengths are tokens, steps are decode steps, sizes are bytes.

    ``units`` are the slot queues (slots mode) or the micro groups (budget mode), each listed in
    the order the refill rule takes them. ``expected_*`` fields are the plan run on its own
    predicted ``lengths``.
    """

    mode: str
    refill: str
    grouping: str
    lengths: tuple[int, ...]
    reserve_lengths: tuple[int, ...]
    max_new_tokens: int
    prompt_tokens: int
    slots: int
    units: tuple[tuple[int, ...], ...]
    admission_order: tuple[int, ...]
    expected_starts: tuple[int, ...]
    expected_steps: int
    lower_bound: int
    eps: float
    capacity_bytes: int | None = None
    reservation_bytes: tuple[int, ...] | None = None
    peak_reserved_bytes: int | None = None
    budget_bytes: int | None = None
    model: str | None = None
    # Budget mode in KV tokens (plan_group(budget_tokens=...)): capacity and reservations in tokens.
    capacity_tokens: int | None = None
    reservation_tokens: tuple[int, ...] | None = None

    @property
    def capacity(self) -> int | None:
        """What the reservations are packed into: ``capacity_bytes`` or ``capacity_tokens`` (None in slots mode)."""
        return self.capacity_bytes if self.capacity_bytes is not None else self.capacity_tokens

    @property
    def reservations(self) -> tuple[int, ...] | None:
        """Per completion, what it reserves in the unit of :attr:`capacity` (None in slots mode)."""
        return self.reservation_bytes if self.reservation_bytes is not None else self.reservation_tokens

    @property
    def ratio(self) -> float:
        """expected_steps / lower_bound: >= 1 for every schedule that stays within the budget."""
        return self.expected_steps / self.lower_bound

    @property
    def slot_queues(self) -> tuple[tuple[int, ...], ...]:
        """The slot queues (slots mode)."""
        if self.mode != "slots":
            raise InvalidArgument("mode", self.mode, "'slots' for slot_queues; use micro_groups")
        return self.units

    @property
    def micro_groups(self) -> tuple[tuple[int, ...], ...]:
        """The memory-feasible micro groups (budget mode)."""
        if self.mode != "budget":
            raise InvalidArgument("mode", self.mode, "'budget' for micro_groups; use slot_queues")
        return self.units

    def priorities(self) -> tuple[int, ...]:
        """Per completion, its rank in the admission order (0 = first): engine request priorities."""
        ranks = [0] * len(self.lengths)
        for rank, job in enumerate(self.admission_order):
            ranks[job] = rank
        return tuple(ranks)

    def to_dict(self) -> dict[str, Any]:
        out = {"format": PLAN_FORMAT}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                value = [list(v) if isinstance(v, tuple) else v for v in value]
            out[f.name] = value
        return out

    def to_json(self, indent: int | None = None) -> str:
        """The plan as JSON (``Plan.from_json`` restores an equal plan)."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes) -> Plan:
        """Parse :meth:`to_json` output; raises :class:`InvalidArgument` naming the bad field."""
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument("text", str(text)[:40], f"JSON of a plan ({exc})") from exc
        if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
            raise InvalidArgument("format", data.get("format") if isinstance(data, dict) else data, repr(PLAN_FORMAT))
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name not in data:
                if f.default is dataclasses.MISSING:
                    raise InvalidArgument(f.name, None, "a value (field missing from the plan JSON)")
                continue
            kwargs[f.name] = _field_from_json(f.name, data[f.name])
        plan = cls(**kwargs)
        plan.check()
        return plan

    def check(self) -> None:
        """Raise if the plan is inconsistent (every completion exactly once, lengths agree)."""
        n = len(self.lengths)
        if self.mode not in ("slots", "budget"):
            raise InvalidArgument("mode", self.mode, "'slots' or 'budget'")
        parse_rule(self.refill)
        if self.grouping not in GROUPINGS + ("greedy",):
            raise InvalidArgument("grouping", self.grouping, "one of " + ", ".join(GROUPINGS + ("greedy",)))
        flat = sorted(j for unit in self.units for j in unit)
        if flat != list(range(n)) or sorted(self.admission_order) != list(range(n)):
            raise InvalidArgument("units", self.units, f"each completion 0..{n - 1} exactly once")
        for name in ("reserve_lengths", "expected_starts"):
            if len(getattr(self, name)) != n:
                raise InvalidArgument(name, getattr(self, name), f"{n} values, one per completion")
        in_bytes = self.capacity_bytes is not None and self.reservation_bytes is not None
        in_tokens = self.capacity_tokens is not None and self.reservation_tokens is not None
        if (self.mode == "budget") != (in_bytes or in_tokens) or (in_bytes and in_tokens):
            raise InvalidArgument("capacity_bytes", self.capacity_bytes, "set (with reservation_bytes), or "
                                  "capacity_tokens with reservation_tokens, in budget mode only")


_INT_TUPLES = {"lengths", "reserve_lengths", "admission_order", "expected_starts", "reservation_bytes",
               "reservation_tokens"}
_INTS = {"max_new_tokens", "prompt_tokens", "slots", "expected_steps", "lower_bound",
         "capacity_bytes", "peak_reserved_bytes", "budget_bytes", "capacity_tokens"}
_OPTIONAL = {"capacity_bytes", "reservation_bytes", "peak_reserved_bytes", "budget_bytes", "model", "capacity_tokens",
             "reservation_tokens"}


def _field_from_json(name: str, value: Any) -> Any:
    if value is None and name in _OPTIONAL:
        return None
    if name in _INT_TUPLES:
        minimum = 1 if name in ("lengths", "reserve_lengths", "expected_starts") else 0
        return tuple(int(v) for v in as_lengths(name, value, minimum=minimum, allow_empty=True))
    if name == "units":
        if not isinstance(value, list):
            raise InvalidArgument(name, value, "a list of lists of completion indices")
        return tuple(tuple(int(v) for v in as_lengths(name, u, allow_empty=True)) for u in value)
    if name in _INTS:
        return check_int(name, value, minimum=0)
    if name == "eps":
        return check_positive_float(name, value, maximum=1.0)
    if not isinstance(value, str):
        raise InvalidArgument(name, value, "a string")
    return value


def _ordered(unit: tuple[int, ...], rule: RefillRule, lengths: np.ndarray) -> tuple[int, ...]:
    """A unit listed in the order its refill rule takes it (``plan`` keeps the algorithm's order)."""
    keys = {
        RefillRule.SJF: lambda j: (lengths[j], j),
        RefillRule.LPT: lambda j: (-lengths[j], j),
        RefillRule.FCFS: lambda j: j,
    }
    key = keys.get(rule)
    return tuple(int(j) for j in (unit if key is None else sorted(unit, key=key)))


def _slot_partition(grouping: str, lengths: np.ndarray, k: int,
                    eps: float) -> tuple[tuple[tuple[int, ...], ...], str, int]:
    """Slot queues, the algorithm that made them, and a lower bound on the slot makespan."""
    if grouping == "none":
        return (tuple(range(len(lengths))),), "none", _partition.lower_bound(lengths, k)
    if grouping == "fptas":
        try:
            part = _partition.fptas(lengths, k, eps)
        except _partition.StateLimitExceeded:
            part = _partition.best_heuristic(lengths, k)  # still reported against the lower bound
    else:
        part = getattr(_partition, grouping)(lengths, k)
    return part.parts, part.algorithm, part.lower_bound


def _budget_lower_bound(memory: ModelMemory | None, lengths: np.ndarray, capacity: int, prompt_tokens: int) -> int:
    """Steps >= (sum over completions of bytes x steps held) / capacity, and >= the longest one.
    Without ``memory`` the capacity is in KV tokens and a sequence of age a holds a tokens."""
    ages = np.arange(int(lengths.max()) + 1)
    per_age = ages if memory is None else np.asarray(memory.reservation_bytes(ages, prompt_tokens), dtype=np.int64)
    area = np.cumsum(per_age) - per_age[0]  # area[l] = bytes held summed over ages 1..l
    return max(int(lengths.max()), -(-int(area[lengths].sum()) // capacity))


def _byte_reservations(memory: ModelMemory | None, budget_bytes: int, reserve: np.ndarray,
                       prompt_tokens: int) -> tuple[int, np.ndarray]:
    """(capacity, per-completion reservation), both in bytes, for budget mode in bytes."""
    if memory is None:
        raise InvalidArgument("memory", None, "a ModelMemory when budget_bytes is given")
    capacity = memory.free_bytes(budget_bytes, prompt_tokens)
    res_bytes = np.asarray(memory.reservation_bytes(reserve, prompt_tokens), dtype=np.int64)
    if int(res_bytes.max()) > capacity:
        worst = int(np.argmax(res_bytes))
        raise BudgetTooSmall(
            "budget_bytes", budget_bytes,
            f"at least {int(budget_bytes) - capacity + int(res_bytes[worst])} bytes to hold completion "
            f"{worst} with {int(reserve[worst])} reserved tokens next to weights and prompt ({memory.name})",
        )
    return capacity, res_bytes


def _budget_units(grouping: str, pred: np.ndarray, reservations: np.ndarray, capacity: int, k: int, eps: float,
                  memory: ModelMemory | None, prompt_tokens: int) -> tuple[tuple[tuple[int, ...], ...], str, int]:
    """Micro groups packed into ``capacity`` (bytes, or KV tokens when ``memory`` is None), the
    algorithm that made them and the budget lower bound on steps."""
    if int(reservations.max()) > capacity:  # only reachable in tokens: bytes were checked with their message
        worst = int(np.argmax(reservations))
        raise BudgetTooSmall("budget_tokens", capacity,
                             f"at least {int(reservations[worst])} KV tokens to hold completion {worst}'s reservation")
    if grouping == "none":
        units, algorithm = (tuple(range(len(pred))),), "none"
    else:
        rounds = pack_micro_groups(reservations, capacity, max_items=k, eps=eps)
        units = tuple(r.items for r in rounds)
        algorithm = "greedy" if any(r.algorithm == "greedy" for r in rounds) else "fptas"
    return units, algorithm, _budget_lower_bound(memory, pred, capacity, prompt_tokens)


def plan_group(
    lengths: Any,
    *,
    max_new_tokens: int,
    slots: int | None = None,
    budget_bytes: int | None = None,
    memory: ModelMemory | None = None,
    prompt_tokens: int = 0,
    eps: float = 0.05,
    refill: str = "sjf",
    reserve_lengths: Any = None,
    grouping: str = "fptas",
    budget_tokens: int | None = None,
) -> Plan:
    """Plan one group of completions from their predicted lengths.

    Args:
        lengths: predicted length of each completion (tokens, integers >= 1; values above
            ``max_new_tokens`` are clipped to it, since no completion can be longer).
        max_new_tokens: L_max (tokens).
        slots: most completions decoding at once. Alone: slots mode.
        budget_bytes: total memory for the group (weights + activations + KV, bytes); needs
            ``memory``. Budget mode.
        memory: the :class:`ModelMemory`; with ``slots`` alone it fills ``peak_reserved_bytes``.
        budget_tokens: budget mode in KV tokens instead of bytes: the KV tokens (beyond the
            shared prompt) the group may hold; each completion reserves its reserved length in
            tokens. Excludes ``budget_bytes``; ``memory`` (optional) then only fills
            ``peak_reserved_bytes``. Convert a byte budget with ``ModelMemory.kv_token_budget``.
        prompt_tokens: P (tokens), for the memory model.
        eps: approximation parameter of the FPTAS (0 < eps <= 1).
        refill: ``sjf``, ``lpt``, ``fcfs`` or ``plan`` (see :mod:`lengthsched.refill`).
        reserve_lengths: tokens reserved per completion (e.g. a predicted quantile); default
            ``max_new_tokens``. A completion that outgrows it keeps running (see ``execute``).
        grouping: ``fptas`` (default), ``lpt``, ``karmarkar_karp``, ``exact`` (CP-SAT, slots
            mode) or ``none`` (one shared queue: plain list scheduling by the refill rule).
    """
    max_new = check_int("max_new_tokens", max_new_tokens, minimum=1)
    pred = np.minimum(as_lengths("lengths", lengths, minimum=1), max_new)
    n = len(pred)
    if reserve_lengths is None:
        reserve = np.full(n, max_new, dtype=np.int64)
    else:
        reserve = np.minimum(as_lengths("reserve_lengths", reserve_lengths, minimum=1), max_new)
        if len(reserve) != n:
            raise InvalidArgument("reserve_lengths", reserve_lengths, f"{n} values, one per completion")
    rule = parse_rule(refill)
    eps = check_positive_float("eps", eps, maximum=1.0)
    prompt_tokens = check_int("prompt_tokens", prompt_tokens, minimum=0)
    if grouping not in GROUPINGS:
        raise InvalidArgument("grouping", grouping, "one of " + ", ".join(GROUPINGS))
    if budget_tokens is not None:
        if budget_bytes is not None:
            raise InvalidArgument("budget_tokens", budget_tokens, "None when budget_bytes is given (one budget)")
        budget_tokens = check_int("budget_tokens", budget_tokens, minimum=1)
    if slots is None and budget_bytes is None and budget_tokens is None:
        raise InvalidArgument("slots", None, "slots, or budget_bytes with memory, or budget_tokens")
    k = n if slots is None else min(check_int("slots", slots, minimum=1), n)
    if memory is not None and not isinstance(memory, ModelMemory):
        raise InvalidArgument("memory", memory, "a lengthsched.ModelMemory")
    capacity = res_bytes = res_tokens = None
    if budget_bytes is None and budget_tokens is None:
        mode = "slots"
        units, algorithm, lower = _slot_partition(grouping, pred, k, eps)
    else:
        mode = "budget"
        if grouping not in ("fptas", "none"):
            raise InvalidArgument("grouping", grouping, "'fptas' or 'none' in budget mode")
        if budget_tokens is not None:
            capacity, reservations = budget_tokens, reserve
            res_tokens = reserve
        else:
            capacity, reservations = _byte_reservations(memory, budget_bytes, reserve, prompt_tokens)
            res_bytes = reservations
        units, algorithm, lower = _budget_units(grouping, pred, reservations, capacity, k, eps,
                                                None if budget_tokens is not None else memory, prompt_tokens)
        if slots is not None:
            lower = max(lower, _partition.lower_bound(pred, k))
    units = tuple(_ordered(u, rule, pred) for u in units)
    draft = Plan(
        mode=mode, refill=rule.value, grouping=algorithm,
        lengths=tuple(int(x) for x in pred), reserve_lengths=tuple(int(x) for x in reserve),
        max_new_tokens=max_new, prompt_tokens=prompt_tokens, slots=k, units=units,
        admission_order=(), expected_starts=(), expected_steps=0, lower_bound=1, eps=eps,
        capacity_bytes=None if res_bytes is None else int(capacity),
        reservation_bytes=None if res_bytes is None else tuple(int(x) for x in res_bytes),
        capacity_tokens=None if res_tokens is None else int(capacity),
        reservation_tokens=None if res_tokens is None else tuple(int(x) for x in res_tokens),
        budget_bytes=None if budget_bytes is None else int(budget_bytes),
        model=None if memory is None else memory.name,
    )
    # memory: completions predicted past their reservation grow (in tokens they grow without one)
    schedule = execute(draft, memory=None if budget_tokens is not None else memory)
    peak = None
    if memory is not None:
        live_res = np.asarray(memory.reservation_bytes(np.maximum(reserve, pred), prompt_tokens), dtype=np.int64)
        peak = memory.weights_bytes + memory.prompt_kv_bytes(prompt_tokens) + _peak_sum(schedule, live_res)
    return dataclasses.replace(
        draft,
        admission_order=tuple(int(j) for j in schedule.admission_order),
        expected_starts=tuple(int(s) for s in schedule.starts),
        expected_steps=schedule.steps,
        lower_bound=int(lower),
        peak_reserved_bytes=peak,
    )


def _peak_sum(schedule: Any, sizes: np.ndarray) -> int:
    """Largest total of ``sizes`` over the completions live in one step."""
    times = np.concatenate((schedule.starts, schedule.ends + 1))
    deltas = np.concatenate((sizes, -sizes))
    order = np.lexsort((deltas, times))  # frees before admissions in the same step
    return int(np.cumsum(deltas[order]).max())
