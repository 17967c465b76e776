"""verl: lengthsched inside verl's own dynamic sampling (the v1 trainer's DAPO group filter): a refill that submits
what the batch needs instead of two prompts per dropped group, and GRESO's skip.

verl 0.9.1's v1 sync trainer with ``algorithm.filter_groups.enable`` drops every finished group whose trajectories
agree (all right or all wrong) and, for each, submits two more prompts while fewer than ``train_batch_size`` groups
were kept; then it waits for every group still running and throws the surplus away. Two prompts per drop submit more
than the batch needs whenever most groups pass, and the step waits for all of them. This module's replay buffer
refills instead only while the groups in flight are expected to pass fewer than the batch still needs
(:func:`~lengthsched.filtering.need_refill`, the pass share of the groups the filter has classified so far): the
same data, fewer groups generated and thrown away. GRESO (arXiv 2506.02177) also skips, before the rollout, the
prompts whose latest groups the filter dropped all right or all wrong: they would most likely be dropped again.
lengthsched has the rule (:class:`~lengthsched.filtering.SelectiveRollout` over a
:class:`~lengthsched.filtering.FilterHistory`); the skip changes which prompts the learner sees. Modelled on verl
0.9.1's code (the wheel's sources; tested with fakes and, where verl installs, against its real trainer path and
replay buffers with TransferQueue faked in memory; not run on a GPU cluster). Files under
``verl/trainer/ppo/v1/``:

- ``trainer_base.py``, ``PPOTrainer._init_dataloader``: with ``algorithm.filter_groups.enable`` the dataloader
  fetches one prompt at a time (``data.gen_batch_size`` is forced to 1), and ``_fetch_one_gen_batch`` gives each
  fetch a fresh ``uid`` (a uuid: the same prompt gets a new one every time it is drawn);
- ``replay_buffer.py``, ``ReplayBuffer._dapo_filtered_keys``: every finished group is classified once, by the
  value its trajectories share of ``algorithm.filter_groups.metric`` (``"reward"``: each trajectory's summed
  ``rm_scores``; another name: ``reward_extra_info[name]``), or None where they differ (the group is kept);
  ``sample`` evicts the groups with a shared value and, in the sync trainer, adds two refill credits for each,
  spent through ``refill_fn`` (the trainer's ``_add_prompts_to_generate``) within ``max_inflight_gen_batches`` x
  ``train_batch_size`` prompts in flight, until ``train_batch_size`` groups are kept; then it drains what runs and
  discards the surplus. The async trainers' ``ReplayBufferAsync`` refills as many as it evicted;
- ``PPOTrainer._build_replay_buffer``: ``trainer.v1.sampler.custom_sampler.{path,name}`` replaces the replay
  buffer; a custom one gets ``trainer_mode``, ``trainer_config``, the off-policy settings, ``sampler_kwargs``
  (``trainer.v1.sampler.sampler_kwargs``) and ``refill_fn``, but not the filter's settings (its metric, the
  batch sizes, ``max_inflight_gen_batches``).

This module supplies:

- :class:`PromptSelector` (numpy only): what the buffer decides. :meth:`~PromptSelector.draw` fetches until a
  fetch holds a prompt the rule runs (at most ``max_draws`` fetches, then it hands over the last: a skipped prompt
  is spent for this pass over the data, as GRESO's dataloader spends it), :meth:`~PromptSelector.observe` records
  what the filter did with a group, :meth:`~PromptSelector.refill_count` cuts verl's refill to the need,
  :meth:`~PromptSelector.end_step` adapts the rule after each training step and saves the history;
- :func:`selective_replay_buffer`: the custom sampler verl loads by name. It builds verl's own replay buffer
  (``ReplayBuffer`` for ``trainer.v1.trainer_mode=sync``, ``ReplayBufferAsync`` otherwise) with the filter
  settings verl gives its built-in one (read from the trainer, so the filter classifies and evicts exactly as it
  would without lengthsched), records every group its filter classifies, wraps the trainer's
  ``_fetch_one_gen_batch`` with :meth:`PromptSelector.draw` and, in the sync buffer, its ``refill_fn`` with
  :meth:`PromptSelector.refill_count`, and adds ``lengthsched/selective/*`` metrics to every training step's.
  ``SelectiveReplayBuffer`` and ``SelectiveReplayBufferAsync`` (made from verl's classes on first access) are
  the two classes.

Settings (``trainer.v1.sampler.sampler_kwargs``, each added with Hydra's ``+``): ``skip`` (default false: the
data as verl draws it; true: GRESO's skip, which changes what the learner sees), ``refill`` (``"need"``, the
default, or ``"verl"``: two per drop, as verl does; the async buffers always refill as verl does),
``history_path`` (a JSON file the history and the rule's state are read from at start and written to,
atomically, after every training step, so a run resumed from a checkpoint keeps them; default none: the history
lives as long as the run), ``p_easy``, ``p_hard``, ``target``, ``step``, ``min_p``, ``max_p``, ``seed`` (the
rule's, see :class:`~lengthsched.filtering.SelectiveRollout`; GRESO's defaults), ``solved_reward`` (a shared
metric value at or above it is an all-right group; default :data:`~lengthsched.filtering.SOLVED_REWARD`, 0.5)
and ``max_draws`` (default :data:`~lengthsched.filtering.SKIP_DRAWS`, 8). The trainer needs
``trainer.use_v1=True`` and ``algorithm.filter_groups.enable=True``: without the filter there is nothing to learn
from.

What it uses of verl beyond its documented hooks (checked against verl 0.9.1's real classes by
``tests/test_verl_selective.py`` in CI's verl stage): the trainer is ``refill_fn.__self__``;
``PPOTrainer._resolve_filter_groups_metric`` and ``_fetch_one_gen_batch``; the buffer's
``_dapo_filtered_keys``, ``_dapo_classification_cache``, ``_clear_groups``, ``_materialize_batch`` and its status
sets (``finished_keys``, ``failure_keys``, ``pending_keys``, ``running_keys``). A prompt's key is
:func:`~lengthsched.integrations.verl.prompt_key` of its ``raw_prompt`` (the planner's key).

Importing this module imports neither verl, Ray nor torch.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from ..errors import InvalidArgument, check_int
from ..filtering import (
    SKIP_DRAWS,
    SOLVED_REWARD,
    FilterHistory,
    SelectiveRollout,
    check_solved_reward,
    dropped_side,
    need_refill,
    read_filter_state,
    write_filter_state,
)
from .verl import VERL_VERSION, prompt_key

__all__ = ["OPTIONS", "REFILLS", "SAMPLER_KWARGS", "PromptSelector", "builtin_buffer_kwargs",
           "make_selective_replay_buffer_class", "selective_replay_buffer"]

log = logging.getLogger(__name__)

#: Where verl reads the settings of a custom replay buffer from (the argument named in errors).
SAMPLER_KWARGS = "trainer.v1.sampler.sampler_kwargs"

#: The settings :meth:`PromptSelector.from_options` reads; any other key in ``sampler_kwargs`` is an error.
OPTIONS = ("skip", "refill", "history_path", "p_easy", "p_hard", "target", "step", "min_p", "max_p", "seed",
           "solved_reward", "max_draws")

#: What the ``refill`` setting accepts: lengthsched's refill by need (the default) or verl's own two per drop.
REFILLS = ("need", "verl")

_RULE_OPTIONS = ("p_easy", "p_hard", "target", "step", "min_p", "max_p", "seed")

T = TypeVar("T")


class PromptSelector:
    """GRESO's skip for a trainer that fetches prompts and learns what its filter did with each group by a uid.

    ``rule`` (default a fresh :class:`~lengthsched.filtering.SelectiveRollout`) decides from ``history`` (default
    a fresh :class:`~lengthsched.filtering.FilterHistory`) whether a prompt runs where ``skip`` (default false:
    every prompt runs, the history is still kept). ``refill``: ``"need"`` (:meth:`refill_count` cuts the
    trainer's refill to what the batch needs) or ``"verl"`` (as asked). ``solved_reward``: a dropped group whose
    rewards all agree on a value at or above it was all right (``"easy"``), below it all wrong (``"hard"``).
    ``max_draws``: the most fetches :meth:`draw` makes for one it hands over. ``path``: where :meth:`end_step`
    writes the history and the rule (None: nowhere).

    Counters (cumulative): ``skipped`` prompts drawn and not handed over, ``forced`` fetches handed over after
    ``max_draws`` skips although the rule would skip them, ``handed`` prompts handed over, ``observed`` groups
    whose filter verdict was recorded, ``withheld`` prompts the trainer asked to refill and :meth:`refill_count`
    did not submit."""

    def __init__(self, rule: SelectiveRollout | None = None, history: FilterHistory | None = None, *,
                 solved_reward: float = SOLVED_REWARD, max_draws: int = SKIP_DRAWS, path: str | None = None,
                 skip: bool = False, refill: str = "need"):
        if rule is not None and not isinstance(rule, SelectiveRollout):
            raise InvalidArgument("rule", type(rule).__name__, "a lengthsched.SelectiveRollout or None")
        if history is not None and not isinstance(history, FilterHistory):
            raise InvalidArgument("history", type(history).__name__, "a lengthsched.FilterHistory or None")
        solved_reward = check_solved_reward("solved_reward", solved_reward)
        if path is not None and (not isinstance(path, str) or not path):
            raise InvalidArgument("path", path, "a file path (the filter's history, JSON) or None")
        if not isinstance(skip, (bool, np.bool_)):
            raise InvalidArgument("skip", skip, "true or false (whether GRESO's rule skips prompts)")
        if refill not in REFILLS:
            raise InvalidArgument("refill", refill, " or ".join(map(repr, REFILLS)))
        self.skip, self.refill = bool(skip), refill
        self.rule = SelectiveRollout() if rule is None else rule
        self.history = FilterHistory() if history is None else history
        self.solved_reward = solved_reward
        self.max_draws = check_int("max_draws", max_draws, minimum=1)
        self.path = path
        self.skipped = self.forced = self.handed = self.observed = self.withheld = 0
        self._keys: dict[Hashable, Hashable] = {}  # uid -> prompt key, handed over and not yet observed
        self._last = (0, 0, 0, 0)  # skipped, forced, handed, withheld at the last end_step

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None, argument: str = SAMPLER_KWARGS) -> PromptSelector:
        """The selector ``options`` describe (:data:`OPTIONS`; ``argument`` names where they came from in errors),
        starting from the history and rule saved at ``history_path`` where that file exists (the rule's settings
        given here then do not apply: a resumed run keeps its adapted rule)."""
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise InvalidArgument(argument, type(options).__name__, "a mapping of settings")
        options = {key: options[key] for key in options}
        unknown = sorted(str(k) for k in options if k not in OPTIONS)
        if unknown:
            raise InvalidArgument(f"{argument}.{unknown[0]}", options[unknown[0]],
                                  "one of the settings " + ", ".join(OPTIONS))
        path = options.get("history_path")
        if path is not None and (not isinstance(path, str) or not path):
            raise InvalidArgument(f"{argument}.history_path", path, "a file path (the filter's history, JSON)")
        history, rule = read_filter_state(path, f"{argument}.history_path", selective=True)
        if rule is None:
            try:
                rule = SelectiveRollout(**{k: options[k] for k in _RULE_OPTIONS if k in options})
            except InvalidArgument as exc:
                raise InvalidArgument(f"{argument}.{exc.name}", exc.value, exc.expected) from None
        try:
            return cls(rule, history, solved_reward=options.get("solved_reward", SOLVED_REWARD),
                       max_draws=options.get("max_draws", SKIP_DRAWS), path=path, skip=options.get("skip", False),
                       refill=options.get("refill", "need"))
        except InvalidArgument as exc:
            raise InvalidArgument(f"{argument}.{exc.name}", exc.value, exc.expected) from None

    def draw(self, fetch: Callable[[], T], ids: Callable[[T], tuple[Sequence[Hashable], Sequence[Hashable]]]) -> T:
        """Fetch (``fetch()``) until a fetch holds a prompt :attr:`rule` runs, at most :attr:`max_draws` times, and
        return that fetch (after ``max_draws`` skipped ones, the last). ``ids(fetch)``: its rows' uids and prompt
        keys. A fetch of several prompts runs whole when any of them runs (a trainer submits whole fetches)."""
        for n in range(1, self.max_draws + 1):
            batch = fetch()
            uids, keys = ids(batch)
            if len(uids) != len(keys):
                raise InvalidArgument("ids", f"{len(uids)} uids, {len(keys)} keys", "one prompt key per uid")
            if not self.skip or not len(keys) or bool(np.any(self.rule.select(self.history, list(keys)))):
                break
            if n == self.max_draws:
                self.forced += 1
                break
            self.skipped += len(keys)
        self.handed += len(keys)
        self._keys.update(zip(uids, keys))
        return batch

    def observe(self, uid: Hashable, shared: Any) -> bool:
        """Record what the filter did with the group of ``uid``: ``shared`` None, it kept it; else the value of
        the filter's metric every trajectory shared, it dropped it (all right where ``shared`` is at least
        :attr:`solved_reward`). Returns False (nothing recorded) for a uid :meth:`draw` did not hand over, or one
        already observed."""
        key = self._keys.pop(uid, None)
        if key is None:
            return False
        kept = shared is None
        self.history.observe(key, kept, None if kept else dropped_side([shared], self.solved_reward))
        self.observed += 1
        return True

    def forget(self, uids: Iterable[Hashable]) -> int:
        """Drop what :meth:`draw` remembered of ``uids`` whose groups left without a verdict (a failed group, or one
        trained or cleared before it was classified), so the uids of a long run do not pile up; returns how many
        were dropped."""
        return sum(self._keys.pop(uid, None) is not None for uid in uids)

    def refill_count(self, asked: int, missing: int, inflight: int) -> int:
        """How many of the ``asked`` prompts verl's filter would refill to submit, when ``missing`` more groups must
        pass for the batch and ``inflight`` run: all of them with ``refill="verl"``; else at most what
        :func:`~lengthsched.filtering.need_refill` says at the history's pass share (the rest counted as
        withheld)."""
        asked = check_int("asked", asked, minimum=0)
        count = asked if self.refill == "verl" else min(asked, need_refill(missing, inflight, self.history.kept,
                                                                          self.history.groups))
        self.withheld += asked - count
        return count

    def end_step(self) -> dict[str, float]:
        """After a training step: the rule adapted to what the filter did since the last call
        (:meth:`SelectiveRollout.adapt`), the history written to :attr:`path`, and the step's metrics (prompts
        skipped, fetches forced and prompts handed over since the last call; the rule's ``p_easy`` and
        ``p_hard``; prompts the history knows; where groups were observed, their shares dropped all right and
        all wrong)."""
        shares = self.rule.adapt(self.history)
        now = (self.skipped, self.forced, self.handed, self.withheld)
        skipped, forced, handed, withheld = (a - b for a, b in zip(now, self._last))
        self._last = now
        if self.path is not None:
            write_filter_state(self.path, self.history, self.rule)
        metrics = {"lengthsched/selective/skipped": float(skipped), "lengthsched/selective/forced": float(forced),
                   "lengthsched/selective/handed": float(handed), "lengthsched/selective/withheld": float(withheld),
                   "lengthsched/selective/p_easy": self.rule.p_easy,
                   "lengthsched/selective/p_hard": self.rule.p_hard,
                   "lengthsched/selective/prompts_known": float(len(self.history))}
        if shares is not None:
            metrics["lengthsched/selective/easy_share"], metrics["lengthsched/selective/hard_share"] = shares
            log.info("lengthsched: %d prompts skipped this step (%d so far); dropped groups all right %.3f, all "
                     "wrong %.3f; p_easy %.2f, p_hard %.2f", skipped, self.skipped, *shares, self.rule.p_easy,
                     self.rule.p_hard)
        return metrics


def fetch_ids(batch: Any) -> tuple[list[Hashable], list[str]]:
    """The uids and prompt keys of one of verl's fetched batches (a TensorDict with ``uid`` and ``raw_prompt``)."""
    try:
        uids, prompts = list(batch["uid"]), list(batch["raw_prompt"])
    except (KeyError, TypeError) as exc:
        raise InvalidArgument("batch", type(batch).__name__, f"a verl batch with 'uid' and 'raw_prompt' ({exc})") \
            from None
    return uids, [prompt_key(p) for p in prompts]


def builtin_buffer_kwargs(trainer: Any, sync: bool) -> dict[str, Any]:
    """What verl 0.9.1's ``PPOTrainer._build_replay_buffer`` passes its built-in replay buffer and withholds from a
    custom one: the filter's metric (``trainer._resolve_filter_groups_metric()``, which also checks that the
    rollout computes it), ``sync_refill_failed_groups``, and for the sync buffer the batch sizes and
    ``max_inflight_gen_batches``, computed as verl computes them."""
    config = trainer.config
    sampler = config.trainer.v1.sampler
    metric = trainer._resolve_filter_groups_metric()
    refill_failed = bool(sampler.get("sync_refill_failed_groups", False))
    out: dict[str, Any] = {"filter_groups_metric": metric, "sync_refill_failed_groups": refill_failed}
    if sync:
        filter_groups = config.algorithm.get("filter_groups", None)
        train_batch_size = config.data.train_batch_size
        out.update(train_batch_size=train_batch_size,
                   gen_batch_size=1 if metric is not None or refill_failed
                   else (config.data.get("gen_batch_size", None) or train_batch_size),
                   max_inflight_gen_batches=filter_groups.get("max_inflight_gen_batches", 1)
                   if metric is not None else 1)
    return out


def make_selective_replay_buffer_class(base: type, sync: bool) -> type:
    """``base`` (verl's ``ReplayBuffer`` or ``ReplayBufferAsync``) with a :class:`PromptSelector` (from
    ``sampler_kwargs``): it records every group its filter classifies, wraps the trainer's ``_fetch_one_gen_batch``
    with :meth:`PromptSelector.draw` (GRESO's skip, where on), in the sync buffer its ``refill_fn`` with
    :meth:`PromptSelector.refill_count` (the refill by need), and adds the selector's metrics to every training
    ``sample``. ``sync``: whether verl would build ``base`` for the sync trainer (which decides the settings it is
    given, :func:`builtin_buffer_kwargs`, and whether the refill is cut)."""

    class SelectiveReplayBuffer(base):  # type: ignore[misc, valid-type]
        """verl's replay buffer with lengthsched's refill by need and GRESO's skip (verl_selective)."""

        def __init__(self, **kwargs: Any):
            self.lengthsched_selector = PromptSelector.from_options(kwargs.get("sampler_kwargs"))
            trainer = getattr(kwargs.get("refill_fn"), "__self__", None)
            if trainer is not None and hasattr(trainer, "_resolve_filter_groups_metric"):
                kwargs = {**builtin_buffer_kwargs(trainer, sync), **kwargs}
            if kwargs.get("filter_groups_metric") is None:
                raise InvalidArgument("algorithm.filter_groups.enable", False,
                                      "True: the buffer's refill and skip learn from the groups verl's "
                                      "dynamic-sampling filter drops")
            super().__init__(**kwargs)
            self.lengthsched_batch: int | None = None  # the batch the running sample() collects
            if trainer is not None:
                fetch = trainer._fetch_one_gen_batch
                trainer._fetch_one_gen_batch = lambda: self.lengthsched_selector.draw(fetch, fetch_ids)
            if sync and self.refill_fn is not None:
                verl_refill = self.refill_fn
                self.refill_fn = lambda asked: self.lengthsched_refill(verl_refill, asked)

        def lengthsched_refill(self, verl_refill: Callable[[int], Any], asked: int) -> int:
            """verl's refill of ``asked`` prompts (two per dropped group), cut to what
            :meth:`PromptSelector.refill_count` says the batch needs: the groups missing are the batch less those
            finished and not evicted (this poll's snapshot), the groups in flight those pending or running."""
            if self.lengthsched_batch is None:
                return verl_refill(asked)
            done = len(self.finished_keys["train"] | self.failure_keys["train"])
            inflight = len(self.pending_keys["train"]) + len(self.running_keys["train"])
            count = self.lengthsched_selector.refill_count(asked, self.lengthsched_batch - done, inflight)
            return verl_refill(count) if count else 0

        def _clear_groups(self, partition_id: str, uids: set[str]) -> None:
            super()._clear_groups(partition_id, uids)
            self.lengthsched_selector.forget(uids)  # evicted: classified already, or failed (no verdict)

        def _materialize_batch(self, partition_id: str, selected_prompt_uids: list[str],
                               partition_snapshot: dict) -> Any:
            self.lengthsched_selector.forget(selected_prompt_uids)  # trained (a failed group never classified)
            return super()._materialize_batch(partition_id, selected_prompt_uids, partition_snapshot)

        def _dapo_filtered_keys(self, partition_id: str) -> Any:
            cache = self._dapo_classification_cache[partition_id]
            before = set(cache)
            out = super()._dapo_filtered_keys(partition_id)
            if partition_id != "val":
                for uid in cache.keys() - before:
                    self.lengthsched_selector.observe(uid, cache[uid])
            return out

        def sample(self, global_steps: int, partition_id: str, batch_size: int) -> Any:
            self.lengthsched_batch = batch_size if partition_id != "val" else None
            try:
                batch, metrics = super().sample(global_steps, partition_id, batch_size)
            finally:
                self.lengthsched_batch = None
            if partition_id != "val":
                metrics.update(self.lengthsched_selector.end_step())
            return batch, metrics

    SelectiveReplayBuffer.__name__ = SelectiveReplayBuffer.__qualname__ = (
        "SelectiveReplayBuffer" if sync else "SelectiveReplayBufferAsync")
    SelectiveReplayBuffer.__module__ = __name__
    return SelectiveReplayBuffer


_MADE: dict[str, type] = {}
_CLASSES = {"SelectiveReplayBuffer": ("ReplayBuffer", True), "SelectiveReplayBufferAsync": ("ReplayBufferAsync", False)}


def __getattr__(name: str) -> Any:
    """``SelectiveReplayBuffer`` / ``SelectiveReplayBufferAsync``, made from verl's replay buffers on first access
    (so importing this module needs no verl)."""
    if name not in _CLASSES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _MADE:
        try:
            module = importlib.import_module("verl.trainer.ppo.v1.replay_buffer")
        except ImportError as exc:
            raise ImportError(f"verl is not installed: pip install 'lengthsched[verl]' (verl=={VERL_VERSION}, with "
                              f"TransferQueue for its v1 trainer): {exc}") from None
        base, sync = _CLASSES[name]
        _MADE[name] = make_selective_replay_buffer_class(getattr(module, base), sync)
    return _MADE[name]


def selective_replay_buffer(**kwargs: Any) -> Any:
    """verl's custom replay buffer with GRESO's skip: ``trainer.v1.sampler.custom_sampler.path=
    pkg://lengthsched.integrations.verl_selective`` and ``...custom_sampler.name=selective_replay_buffer``.
    Builds ``SelectiveReplayBuffer`` for ``trainer_mode`` ``"sync"`` and ``SelectiveReplayBufferAsync`` for the
    async trainers, as verl picks its own two."""
    return __getattr__("SelectiveReplayBuffer" if kwargs.get("trainer_mode") == "sync"
                       else "SelectiveReplayBufferAsync")(**kwargs)
