"""Online sGPO inside AReaL: each prompt's group drawn at the size its own rewards call for.

AReaL 1.0.4 (inclusionAI/AReaL, read at 4aef98d) runs every prompt's ``gconfig.n_samples`` episodes at once
(``GroupedRolloutWorkflow``, ``areal/infra/remote_inf_engine.py``: ``asyncio.gather``, the results that are not None
concatenated) and hands the learner a list of trajectories, one per prompt, "a dict of tensors with shape
[batch_size, seqlen, ...], where batch_size can vary per trajectory" (``areal/infra/dist_rollout.py``: the data
parallel heads redistribute whole trajectories). Only its normalisation assumes the fixed size: ``PPOActor``
(``areal/trainer/ppo/actor.py``) concatenates the trajectories (``batched_call``) and ``Normalization``
(``areal/utils/data.py``) takes its ``group`` levels over consecutive slices of ``group_size`` rows. So a prompt's
group can be any size if the group normalisation follows the trajectories. This module does both halves:

- ``SGPOWorkflow`` (made from AReaL's ``RolloutWorkflow`` on first access; :func:`make_sgpo_workflow_class`) wraps the
  workflow that draws one completion (``RLVRWorkflow``, say) and runs each prompt's group itself, of the size an
  :class:`~lengthsched.sgpo.OnlineBudget` decides from the rewards of the prompt's earlier groups (sGPO's rules,
  default ``informative``; a prompt never seen gets ``n``), through AReaL's own ``GroupedRolloutWorkflow`` (its
  gather and concatenation), and learns from each group's ``rewards`` as it comes back (a completion solved the
  prompt when its reward is at least ``solved_reward``). AReaL must not group it again: ``gconfig.n_samples`` 1
  (an error says so otherwise). With :func:`lengthsched.integrations.areal.install`'s router in the engine, each
  group is placed as one group of its size (:data:`~lengthsched.integrations.areal.GROUP`).
- :func:`normalize_per_trajectory` makes a rank's ``PPOActor`` take the ``group`` levels of its ``reward_norm`` and
  ``adv_norm`` over each trajectory's rows (AReaL's arithmetic, :class:`TrajectoryGroupNorm`), not over fixed slices.

The budget's steps are AReaL's weight versions: a group dispatched under version ``v`` is step ``v + 1``. Only the
data-parallel heads run workflows, and AReaL's sampler deals the prompts to them afresh every epoch, so a head alone
would know the earlier groups of about one prompt in ``heads``. ``share_dir`` (a directory every head sees, under
AReaL's ``cluster.fileroot``, say) pools them: each head appends every group it observes to its own journal there
(``sgpo-rank{rank}.jsonl``, one JSON line a group: :class:`BudgetJournal`) and reads the lines the other heads
appended as its weight version changes. A head starting at version ``v`` > 0 (a resumed run) rebuilds its budget
from every journal (the groups in step order) but the groups dispatched at version ``v`` or later (the run draws
those prompts again), and rewrites its own journal without them; at version 0 (a fresh run) it empties its own
journal and reads the others' from version 1 on (by then every head has emptied its own). Without ``share_dir`` each
head learns alone and nothing is kept across restarts.

Costs: a head's journal grows by about 100 bytes a group (a run of 10,000 steps of 64 prompts: 64 MB over the heads),
and a resumed head reads all of it once. Not run on a cluster: tested with fakes of AReaL's engine and workflows and,
where ``areal`` imports (CI's verl environment), inside its real ``RemoteInfEngine`` and ``GroupedRolloutWorkflow``,
the normalisation against its real ``Normalization`` (its ``PPOActor`` module does not import there: it needs AReaL's
logging stack; the wrapper is tested on a fake of its ``compute_advantages``).

Importing this module imports neither AReaL nor torch.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import re
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from ..errors import InvalidArgument, check_int
from ..filtering import SOLVED_REWARD, check_solved_reward
from ..io import atomic_write_text
from ..online import state_key
from ..sgpo import ONLINE_REASONS, BudgetConfig, OnlineBudget
from .areal import AREAL_VERSION, GROUP

__all__ = ["JOURNAL_PREFIX", "BudgetJournal", "SGPOGroups", "TrajectoryGroupNorm", "data_key", "group_stats",
           "make_sgpo_workflow_class", "normalize_per_trajectory"]

#: A head's journal in ``share_dir``: ``sgpo-rank{rank}.jsonl``.
JOURNAL_PREFIX = "sgpo-rank"
_JOURNAL = re.compile(re.escape(JOURNAL_PREFIX) + r"(\d+)\.jsonl")

log = logging.getLogger(__name__)


def data_key(data: Any) -> str:
    """A prompt key of an AReaL dataset row (what its RL datasets give a workflow): its ``messages`` (what
    ``RLVRWorkflow`` reads by default), else its ``prompt``, else its ``input_ids``, as JSON (the same row in a later
    epoch gets the same key)."""
    if isinstance(data, dict):
        for name in ("messages", "prompt", "input_ids"):
            if name in data:
                value = data[name]
                if hasattr(value, "tolist"):
                    value = value.tolist()
                try:
                    return json.dumps(value, sort_keys=True, ensure_ascii=False)
                except (TypeError, ValueError):
                    return str(value)
    raise InvalidArgument("data", type(data).__name__, "a dataset row with 'messages', 'prompt' or 'input_ids' (else "
                                                       "give SGPOWorkflow a key function of the row)")


def _take(budget: OnlineBudget, record: dict[str, Any]) -> None:
    """A journal's group record observed by ``budget``, under the step it was recorded for."""
    budget.observe(record["key"], [1] * record["solved"] + [0] * (record["samples"] - record["solved"]),
                   record.get("step"))


class BudgetJournal:
    """The groups the data-parallel heads observed, pooled through ``share_dir`` (the module docstring): this head's
    journal ``share_dir/sgpo-rank{rank}.jsonl``, one JSON line a group (``seq``, ``key``, ``solved``, ``samples``,
    ``step``), appended as it observes them; the other heads' read from where this one stopped (whole lines only; a
    rewritten journal is read again from its start, the lines already seen, by ``seq``, passed over). Writing never
    fails a request: a line that cannot be written is logged."""

    def __init__(self, share_dir: str | os.PathLike, rank: int):
        if not isinstance(share_dir, (str, os.PathLike)) or not str(share_dir) or \
                (os.path.exists(share_dir) and not os.path.isdir(share_dir)):
            raise InvalidArgument("share_dir", share_dir, "a directory every data-parallel head can read and write, "
                                                          "or None")
        self.rank = check_int("rank", rank, minimum=0)
        os.makedirs(share_dir, exist_ok=True)
        self.share_dir = str(share_dir)
        self.path = os.path.join(self.share_dir, f"{JOURNAL_PREFIX}{self.rank}.jsonl")
        self.seq = 0  # the last seq this head wrote (it goes on after a restart)
        self.reading = False  # whether the other heads' journals are read (not before version 1 in a fresh run)
        self._at: dict[int, tuple[int, int]] = {}  # other rank -> (inode, bytes read up to the last whole line)
        self._seen: dict[int, int] = {}  # other rank -> the last seq taken from it
        self.written = 0  # lines written by this head
        self.taken = 0  # lines taken from the other heads
        self.failed = 0  # lines that could not be written

    def _journals(self) -> dict[int, str]:
        out = {}
        for name in os.listdir(self.share_dir):
            m = _JOURNAL.fullmatch(name)
            if m:
                out[int(m[1])] = os.path.join(self.share_dir, name)
        return out

    @staticmethod
    def _lines(path: str, start: int = 0) -> tuple[list[dict[str, Any]], int]:
        """The records of ``path``'s whole lines from byte ``start``, and the byte after the last whole line (a line
        still being written, or one a crash cut, is left for later). A line that is not a record is left out with a
        warning."""
        try:
            with open(path, "rb") as handle:
                handle.seek(start)
                raw = handle.read()
        except OSError:
            return [], start
        end = raw.rfind(b"\n") + 1
        records = []
        for line in raw[:end].splitlines():
            try:
                rec = json.loads(line)
                if not (isinstance(rec, dict) and type(rec.get("seq")) is int and isinstance(rec.get("key"), str)
                        and type(rec.get("solved")) is int and type(rec.get("samples")) is int
                        and 0 <= rec["solved"] <= rec["samples"] and rec["samples"] >= 1
                        and (rec.get("step") is None or type(rec["step"]) is int and rec["step"] >= 0)):
                    raise ValueError("not a group record")
            except ValueError as exc:
                log.warning("lengthsched: left out a line of %s (%s)", path, exc)
                continue
            records.append(rec)
        return records, start + end

    def start(self, budget: OnlineBudget, version: int) -> int:
        """Begin at weight version ``version``: at 0 (a fresh run) empty this head's journal and read the others'
        from version 1 on (:meth:`read`); after that (a resumed run) rebuild ``budget`` from every journal, in step
        order, but those dispatched at ``version`` or later (the resumed run draws them again: the budget is exactly
        what it was then, whatever its memory), and rewrite this head's journal without them. Returns the groups
        taken."""
        version = check_int("version", version, minimum=0)
        own, _ = self._lines(self.path) if os.path.exists(self.path) else ([], 0)
        self.seq = max((r["seq"] for r in own), default=0)
        if version == 0:
            self._rewrite([])
            return 0
        records = []
        for rank, path in sorted(self._journals().items()):
            got, end = self._lines(path)
            records += [(r.get("step") is None, r.get("step") or 0, rank, r["seq"], r) for r in got
                        if r.get("step") is None or r["step"] <= version]  # what the run generated up to then
            if rank != self.rank:
                with contextlib.suppress(OSError):
                    self._at[rank] = (os.stat(path).st_ino, end)
                self._seen[rank] = max((r["seq"] for r in got), default=0)
        records.sort(key=lambda t: t[:4])
        for *_, r in records:
            _take(budget, r)
        self._rewrite([r for r in own if r.get("step") is None or r["step"] <= version])
        self.reading = True
        return len(records)

    def _rewrite(self, records: list[dict[str, Any]]) -> None:
        try:
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in records))
        except OSError as exc:
            log.warning("lengthsched: could not rewrite %s (%s)", self.path, exc)

    def append(self, key: str, solved: int, samples: int, step: int | None) -> None:
        """Add one group this head observed to its journal."""
        self.seq += 1
        line = json.dumps({"seq": self.seq, "key": key, "solved": solved, "samples": samples, "step": step}) + "\n"
        try:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(line)
            self.written += 1
        except OSError as exc:
            self.failed += 1
            log.warning("lengthsched: could not add a group to %s (%s); the other heads will not learn it", self.path,
                        exc)

    def read(self, budget: OnlineBudget) -> int:
        """Take into ``budget`` the groups the other heads appended since the last read. Returns how many."""
        if not self.reading:
            return 0
        taken = 0
        for rank, path in sorted(self._journals().items()):
            if rank == self.rank:
                continue
            try:
                stat = os.stat(path)
            except OSError:
                continue
            inode, size = stat.st_ino, stat.st_size
            seen_inode, offset = self._at.get(rank, (inode, 0))
            if inode != seen_inode or size < offset:  # rewritten (a resume or a fresh start): from its start
                offset = 0
            got, end = self._lines(path, offset)
            self._at[rank] = (inode, end)
            last = self._seen.get(rank, 0)
            for r in got:
                if r["seq"] <= last:
                    continue
                _take(budget, r)
                last = r["seq"]
                taken += 1
            self._seen[rank] = last
        self.taken += taken
        return taken


class SGPOGroups:
    """The group sizes of ``SGPOWorkflow`` (numpy only; AReaL-independent): per prompt, the size its
    :class:`~lengthsched.sgpo.OnlineBudget` decides, and what each group's rewards teach it.

    ``n``: the size of a prompt never observed (the group size the run would use without sGPO). ``config``: the
    budget's rules (:class:`~lengthsched.sgpo.BudgetConfig`; default rule ``informative``; ``g_min`` at least 2:
    a group of one has no advantage under group normalisation); ``memory``: groups per prompt that decide (None:
    all). ``solved_reward``: a reward at or above it solved the
    prompt. ``key``: a dataset row's prompt key (default :func:`data_key`). ``share_dir``, ``rank``: the heads' pool
    (:class:`BudgetJournal`; ``rank`` defaults to torchrun's ``RANK``).
    """

    def __init__(self, n: int, *, config: BudgetConfig | None = None, memory: int | None = 2,
                 solved_reward: float = SOLVED_REWARD, key: Callable[[Any], Hashable] = data_key,
                 share_dir: str | os.PathLike | None = None, rank: int | None = None):
        self.n = check_int("n", n, minimum=2)
        if config is None:
            config = BudgetConfig(rule="informative")
        if not isinstance(config, BudgetConfig):
            raise InvalidArgument("config", type(config).__name__, "a lengthsched.sgpo.BudgetConfig or None")
        if config.g_min < 2:
            raise InvalidArgument("config.g_min", config.g_min, ">= 2: a group of one has no advantage (AReaL's group "
                                                               "normalisation gives it 0)")
        self.budget = OnlineBudget(config, memory=memory)
        self.solved_reward = check_solved_reward("solved_reward", solved_reward)
        if not callable(key):
            raise InvalidArgument("key", type(key).__name__, "a function of a dataset row giving its prompt key")
        self.key = key
        if rank is None:
            found = os.environ.get("RANK", "0")
            if not found.isdigit():
                raise InvalidArgument("rank (from the environment's RANK)", found, "a whole number >= 0")
            rank = int(found)
        self.journal = None if share_dir is None else BudgetJournal(share_dir, rank)
        self.version: int | None = None  # the weight version last seen (None: not started)
        self.groups = 0  # groups decided
        self.completions = 0  # completions they asked for
        self.learnt = 0  # groups observed
        self.reasons: dict[str, int] = {}  # decisions by reason, all groups so far
        self._unlearnt = False

    def decide(self, data: Any, version: int) -> tuple[str, int, int, str]:
        """(prompt key, group size, budget step, reason: :data:`~lengthsched.sgpo.ONLINE_REASONS`) of a dataset
        row's group dispatched under weight ``version`` (the step is ``version + 1``). The first call starts the
        journal (:meth:`BudgetJournal.start`); a newer version reads the other heads' groups."""
        version = check_int("version", version, minimum=0)
        if self.version is None:
            if self.journal is not None:
                taken = self.journal.start(self.budget, version)
                if taken:
                    log.info("lengthsched: sGPO budget rebuilt from %d groups in %s at version %d", taken,
                             self.journal.share_dir, version)
            self.version = version
        elif version != self.version:
            self.version = version
            if self.journal is not None:
                if version >= 1:
                    self.journal.reading = True
                self.journal.read(self.budget)
        key = state_key(str(self.key(data)))
        g, reason = self.budget.decide(key, self.n)
        self.groups += 1
        self.completions += g
        self.reasons[reason] = self.reasons.get(reason, 0) + 1
        return key, g, version + 1, reason

    def observe(self, key: str, result: Any, step: int) -> None:
        """Learn from a group's trajectory (AReaL's concatenated dict: its ``rewards``, one per completion back);
        None (no completion back) teaches nothing; a result without ``rewards`` (an agent workflow's interactions)
        is not learnt, with a warning the first time."""
        if result is None:
            return
        rewards = result.get("rewards") if isinstance(result, dict) else None
        if rewards is None or isinstance(rewards, dict):
            if not self._unlearnt:
                self._unlearnt = True
                log.warning("lengthsched: a group came back without a 'rewards' tensor (an agent workflow's "
                            "interactions?); sGPO does not learn from such groups")
            return
        values = _flat(rewards)
        if not values:
            return
        solved = sum(1 for r in values if r >= self.solved_reward)
        self.budget.observe_rewards(key, values, self.solved_reward, step)
        self.learnt += 1
        if self.journal is not None:
            self.journal.append(key, solved, len(values), step)

    def status(self) -> dict[str, Any]:
        """Groups decided and the completions they asked for, their decisions by reason, groups learnt, prompts
        known, and the journal's lines written, taken from other heads and not written."""
        out = {"groups": self.groups, "completions": self.completions, "reasons": dict(self.reasons),
               "learnt": self.learnt, "prompts": len(self.budget), "version": self.version}
        if self.journal is not None:
            out.update(written=self.journal.written, taken=self.journal.taken, failed=self.journal.failed)
        return out


def _flat(values: Any) -> list[float]:
    """A tensor's, an array's or a list's numbers, flattened."""
    if hasattr(values, "detach"):
        values = values.detach()
    if hasattr(values, "tolist"):
        values = values.tolist()
    if not isinstance(values, (list, tuple)):
        return [float(values)]
    out: list[float] = []
    for v in values:
        out += _flat(v) if isinstance(v, (list, tuple)) else [float(v)]
    return out


def group_stats(size: int, reason: str) -> dict[str, float]:
    """A group's statistics as ``SGPOWorkflow`` records them (AReaL averages each over a step's groups): its size
    (``sgpo_group_size``, completions) and, for each of :data:`~lengthsched.sgpo.ONLINE_REASONS`, 1 where it was
    the reason for the size, else 0 (``sgpo_unseen``, ``sgpo_informative``, ``sgpo_trivial``, ``sgpo_unsolved``,
    ``sgpo_unsolved_sampled``: the share of the step's groups)."""
    stats = {"sgpo_group_size": float(size)}
    for name in ONLINE_REASONS:
        stats["sgpo_" + re.sub(r"\W+", "_", name)] = float(name == reason)
    return stats


def _areal_stats(stats: dict[str, float]) -> None:
    """Record ``stats`` as AReaL's workflows record theirs: into ``stats_tracker`` under the workflow's scope
    (``rollout``, or ``eval-rollout``); nothing outside a workflow context (a test calling the workflow itself)."""
    tracker = importlib.import_module("areal.utils.stats_tracker")
    context = importlib.import_module("areal.infra.workflow_context")
    try:
        scope = context.stat_scope()
    except LookupError:
        return
    tracker.get(scope).scalar(**stats)


def make_sgpo_workflow_class(base: type, grouped: type,
                             record: Callable[[dict[str, float]], None] | None = None) -> type:
    """``SGPOWorkflow``, made from AReaL's ``RolloutWorkflow`` (``base``) and ``GroupedRolloutWorkflow``
    (``grouped``; tests pass fakes); ``record``: called with each group's statistics (:func:`group_stats`). The
    module attribute ``SGPOWorkflow`` is this with AReaL's classes, recording into AReaL's ``stats_tracker``."""

    class SGPOWorkflow(base):  # type: ignore[misc, valid-type]
        """AReaL's rollout workflow for online sGPO: each prompt's group of the size its budget decides
        (:class:`SGPOGroups`: ``n``, ``config``, ``memory``, ``solved_reward``, ``key``, ``share_dir``, ``rank``),
        run by AReaL's ``GroupedRolloutWorkflow`` over ``workflow`` (a ``RolloutWorkflow`` drawing one completion,
        e.g. ``RLVRWorkflow``), learnt from as it comes back. Pass it to ``trainer.train(workflow=...)`` with
        ``gconfig.n_samples: 1``, and call :func:`normalize_per_trajectory` on the trainer first. :attr:`groups` is
        its :class:`SGPOGroups` (``status()``)."""

        def __init__(self, workflow: Any, *, n: int, **options: Any):
            if not hasattr(workflow, "arun_episode"):
                raise InvalidArgument("workflow", type(workflow).__name__, "an AReaL RolloutWorkflow drawing one "
                                                                           "completion of a prompt (arun_episode)")
            self.workflow = workflow
            self.groups = SGPOGroups(n, **options)
            self._running: set[int] = set()

        async def arun_episode(self, engine: Any, data: Any) -> Any:
            if id(data) in self._running:
                raise InvalidArgument("gconfig.n_samples", "more than 1 (AReaL ran this workflow twice at once for one "
                                      "prompt)", "1 with SGPOWorkflow, which runs each prompt's group itself")
            version = getattr(engine, "get_version", None)
            if not callable(version):
                raise InvalidArgument("engine", type(engine).__name__, "an AReaL InferenceEngine (get_version: the "
                                                                       "weight version counts the budget's steps)")
            self._running.add(id(data))
            try:
                key, g, step, reason = self.groups.decide(data, int(version()))
                if record is not None:
                    record(group_stats(g, reason))
                token = GROUP.set((object(), g))  # the router places the group's requests as one group of g
                try:
                    result = await grouped(self.workflow, g, log).arun_episode(engine, data)
                finally:
                    GROUP.reset(token)
            finally:
                self._running.discard(id(data))
            try:  # learning never costs AReaL the group (a NaN reward, a journal that cannot be written)
                self.groups.observe(key, result, step)
            except (InvalidArgument, OSError, ValueError, TypeError) as exc:
                log.warning("lengthsched: sGPO did not learn from a group: %s", exc)
            return result

    return SGPOWorkflow


class TrajectoryGroupNorm:
    """AReaL's ``Normalization`` (``norm``) with its ``group`` levels taken over each trajectory's rows, of any
    number, instead of consecutive slices of ``group_size``: ``sizes`` holds the rows of each trajectory of the
    batch being normalised, in order (:func:`normalize_per_trajectory` sets it). Every other part is AReaL's: its
    ``batch`` levels (all-reduced across ranks), masks, ``leave-one-out`` mean, unbiased std, ``eps``, and its
    one-row cases, through its own ``_compute_mean`` and ``_compute_std``."""

    def __init__(self, norm: Any, sizes: list[int]):
        self.norm = norm
        self.sizes = sizes
        for name in ("mean_level", "std_level", "mean_leave1out", "std_unbiased", "eps"):
            setattr(self, name, getattr(norm, name))

    def _slices(self, rows: int) -> list[slice]:
        if sum(self.sizes) != rows:
            raise InvalidArgument("sizes", f"{sum(self.sizes)} rows in {len(self.sizes)} trajectories",
                                  f"{rows}, the rows being normalised (lengthsched sets them as compute_advantages "
                                  "starts)")
        out, at = [], 0
        for size in self.sizes:
            out.append(slice(at, at + size))
            at += size
        return out

    def __call__(self, x: Any, loss_mask: Any = None, high_precision: bool = True, reduce_group: Any = None) -> Any:
        import torch  # only inside AReaL's learner

        norm = type(self.norm)
        eps = self.eps
        if loss_mask is not None and loss_mask.sum().item() == 0:
            return x.float()
        slices = self._slices(x.size(0)) if "group" in (self.mean_level, self.std_level) else []
        def by_trajectory(one_row: Callable[..., Any], alone: bool, compute: Callable[..., Any]) -> Any:
            """A group level: ``compute(rows, mask, slice)`` of each trajectory's rows (``one_row`` of a trajectory
            of one row where ``alone``, as AReaL special-cases a group of one)."""
            out = torch.zeros_like(x)
            for s in slices:
                xx, m = x[s], None if loss_mask is None else loss_mask[s]
                if xx.size(0) == 1 and alone:
                    value = one_row((1, *xx.shape[1:]), dtype=torch.float64 if high_precision else torch.float32,
                                    device=xx.device)
                else:
                    value = compute(xx, m, s)
                out[s] = value.expand_as(xx)
            return out

        if self.mean_level == "batch":
            mean = norm._compute_mean(x, loss_mask, high_precision=high_precision, leave_one_out=self.mean_leave1out,
                                      all_reduce=True, reduce_group=reduce_group).expand_as(x)
        elif self.mean_level == "group":
            mean = by_trajectory(torch.zeros, self.mean_leave1out, lambda xx, m, s: norm._compute_mean(
                xx, m, high_precision=high_precision, leave_one_out=self.mean_leave1out, all_reduce=False,
                reduce_group=None))
        else:
            mean = torch.zeros_like(x)
        centred = x - mean
        if loss_mask is not None:
            centred = centred * loss_mask
        if self.std_level == "batch":
            std = norm._compute_std(x, loss_mask, mean, unbiased=self.std_unbiased, high_precision=high_precision,
                                    all_reduce=True, reduce_group=reduce_group).expand_as(x)
        elif self.std_level == "group":
            std = by_trajectory(torch.ones, self.std_unbiased, lambda xx, m, s: norm._compute_std(
                xx, m, mean[s], unbiased=self.std_unbiased, high_precision=high_precision, all_reduce=False,
                reduce_group=reduce_group))
        else:
            std = torch.ones_like(x)
            eps = 0.0
        return (centred / (std + eps)).float()


def _ppo_actor(obj: Any) -> Any:
    """The ``PPOActor`` of a trainer (``trainer.actor.actor``), of an engine (``FSDPPPOActor.actor``), or itself."""
    for candidate in (obj, getattr(obj, "actor", None), getattr(getattr(obj, "actor", None), "actor", None)):
        if candidate is not None and all(hasattr(candidate, a) for a in ("reward_norm", "adv_norm",
                                                                         "compute_advantages")):
            return candidate
    raise InvalidArgument("actor", type(obj).__name__, "an AReaL PPOTrainer, its actor engine (FSDPPPOActor, ...) or "
                                                       "their PPOActor (reward_norm, adv_norm, compute_advantages)")


def normalize_per_trajectory(actor: Any) -> Any:
    """Make AReaL's ``PPOActor`` (of ``actor``: a ``PPOTrainer``, its actor engine, or the ``PPOActor``) take the
    ``group`` levels of its ``reward_norm`` and ``adv_norm`` over each trajectory's rows (:class:`TrajectoryGroupNorm`)
    where they have one: each ``compute_advantages`` call first records its trajectories' rows. Needed with
    ``SGPOWorkflow`` (a trajectory is one prompt's group, of its own size); with groups of one size the arithmetic is
    AReaL's own. Calling it again changes nothing. Returns the ``PPOActor``. SPMD mode (the actor in this process)."""
    ppo = _ppo_actor(actor)
    if getattr(ppo, "_lengthsched_sizes", None) is not None:
        return ppo
    sizes: list[int] = []
    for name in ("reward_norm", "adv_norm"):
        norm = getattr(ppo, name)
        if norm is not None and "group" in (norm.mean_level, norm.std_level):
            setattr(ppo, name, TrajectoryGroupNorm(norm, sizes))
    original = ppo.compute_advantages

    def compute_advantages(data: Sequence[dict[str, Any]], *args: Any, **kwargs: Any) -> Any:
        sizes[:] = [int(t["input_ids"].shape[0]) for t in data]
        return original(data, *args, **kwargs)

    ppo.compute_advantages = compute_advantages
    ppo._lengthsched_sizes = sizes
    return ppo


_MADE: dict[str, type] = {}


def __getattr__(name: str) -> Any:
    """``SGPOWorkflow`` is made from AReaL's classes on first access (AReaL checks a workflow is its
    ``RolloutWorkflow``), so importing this module needs no AReaL."""
    if name != "SGPOWorkflow":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _MADE:
        try:
            api = importlib.import_module("areal.api")
            engine = importlib.import_module("areal.infra.remote_inf_engine")
        except ImportError as exc:
            raise ImportError(f"AReaL is not installed: pip install areal=={AREAL_VERSION} ({exc})") from None
        _MADE[name] = make_sgpo_workflow_class(api.RolloutWorkflow, engine.GroupedRolloutWorkflow, _areal_stats)
    return _MADE[name]
