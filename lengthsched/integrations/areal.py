"""lengthsched inside AReaL: each group placed on AReaL's inference servers by predicted work.

AReaL 1.0.4 (inclusionAI/AReaL, read at 4aef98d; the wheel on PyPI is the same code): in its SPMD mode every
trainer rank holds a ``RemoteSGLangEngine`` or ``RemotevLLMEngine``, a thin shell over a ``RemoteInfEngine``
(``areal/infra/remote_inf_engine.py``) whose ``agenerate`` sends each request of a rollout to one server: a
request whose ``rid`` it has routed before goes where that rid went ("A single rid shares the same server to
allow KV cache reuse": a multi-turn workflow's later turns; the last ``RID_CACHE_SIZE`` = 128 rids are kept),
any other to ``choose_server()``, the next server in a round robin (``routing_strategy="round_robin"``, the only
one implemented). ``GroupedRolloutWorkflow`` runs a prompt's ``group_size`` episodes at once
(``asyncio.gather``), and each episode of ``RLVRWorkflow`` asks with a fresh rid (``uuid4``), so a group's
samples go to the servers in turn: every server prefills and holds the prompt, and no server's share of the
work is balanced by anything but the count.

The simulator put lengthsched's placement inside AReaL's loop (``simulate.run_async_rollout(...,
router="stream")``, the :class:`~lengthsched.integrations.verl_async.StreamPlacer` this module runs) and found
more tokens per second than AReaL's round robin at the same staleness bound, most where the KV pools are tight
and the learner is short (docs/benchmarks.md, "lengthsched.integrations.areal inside AReaL's loop"). This module
builds it, without stealing (AReaL has no abort of one request to resubmit it elsewhere: its weight updates
pause every server and resume each request where it was):

- :class:`GroupRouter` (numpy only): places each group when its first request comes, by its predicted length
  (a :class:`~lengthsched.integrations.verl.RolloutPlanner`'s predictor, by default the online predictor
  learning from every group that comes back), with a :class:`StreamPlacer` over the predicted tokens each
  server has in flight from this rank (by default each group whole on one server, :data:`WAYS`); the group's
  other requests take the rest of its places; when the
  whole group is back its lengths go to the predictor (rollout step: groups back // ``batch``, one step per
  weight version as the simulator counts it);
- :func:`install` puts a router into a rank's engine: its ``agenerate`` asks the router for a request with a
  new rid and records the answer where AReaL looks first (``rid_to_address``, in AReaL's own bounded order),
  then runs AReaL's ``agenerate`` unchanged (retries, pauses for weight updates, resumption on the same server).

A group is recognised by its prompt: the requests of one prompt take the places of the group placed for it, in
the order they come. Single-turn workflows (``RLVRWorkflow``, ``VisionRLVRWorkflow``) are what it is built for; in
a multi-turn workflow the first turns are placed and the later ones go where AReaL sends them (their rid's
server), and the router stops feeding the predictor (a turn's length is not the session's), saying so once.
Each rank routes its own requests from its own counts (AReaL's round robin is per rank too). Not for the
single-controller mode (the engines live in remote workers) and not run on a cluster; tested with a fake built
from AReaL's code and, where ``areal`` imports, against its real ``RemoteInfEngine``.

Importing this module imports neither AReaL nor torch.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import re
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InvalidArgument, check_int
from ..io import atomic_write_text
from .rollout import PREFILL_SHARE
from .verl import RolloutPlanner, _keep_newest, _number
from .verl_async import StreamPlacer

__all__ = ["AREAL_VERSION", "AUTO", "EVERY_SERVER", "GROUP", "GroupRouter", "KEEP_CHANGES", "RID_CACHE_SIZE",
           "SHARE_PREFIX", "WAYS", "WHOLE_EVERY", "install", "prompt_text"]

#: The AReaL version this integration is written against (``pip install areal==1.0.4``).
AREAL_VERSION = "1.0.4"
#: AReaL's ``RID_CACHE_SIZE``: the rids whose server its engine remembers (the oldest forgotten first).
RID_CACHE_SIZE = 128
#: Servers a group spreads over by default (:class:`GroupRouter`'s ``ways``): 1, whole groups. The model of
#: AReaL's loop trained 7.5%, 6.6% and 0.9% more tokens per second than AReaL's round robin this way (learner a
#: quarter, half and a whole rollout), against 5.1%, 4.7% and 0.6% with the placer's spread estimate (None), the
#: default before 2026-11-30 (docs/benchmarks.md, "Whole groups inside AReaL's loop").
WAYS = 1
#: A spread over every server (:class:`GroupRouter`'s ``ways``): each group's requests go to the servers in turn,
#: continuing where the last group stopped, as AReaL's own round robin sends them (the model's runs are identical
#: to AReaL's). :func:`install` uses it where AReaL bounds the staleness at 0 (its default
#: ``max_head_offpolicyness``): there whole groups trained 3.3%, 2.8% and 2.2% fewer tokens per second than
#: AReaL's round robin (learner a quarter, half and a whole rollout; slower in 28 of 32 settings), the spread
#: estimate 0.5%, 0.4% and 0.3% fewer (docs/benchmarks.md, "At AReaL's default staleness bound of 0").
EVERY_SERVER = 2**31 - 1
#: ``ways`` of :func:`install` that picks the spread from AReaL's ``max_head_offpolicyness``: :data:`WAYS` where it
#: is 1 or more, :data:`EVERY_SERVER` at 0.
AUTO = "auto"
#: The name of each rank's file in a ``share_dir`` (:class:`GroupRouter`): ``rank{rank}.json``, its changes
#: ``rank{rank}-{since}-{step}.json``.
SHARE_PREFIX = "rank"
#: The change files a rank keeps in a ``share_dir`` (its latest; a rank further behind reads the whole file).
KEEP_CHANGES = 16
#: A rank rewrites its whole file in a ``share_dir`` with its first change file and then every ``WHOLE_EVERY``
#: (:class:`GroupRouter`'s default ``whole_every``; the change files written since the whole file are always
#: kept): a restart resumes from the whole file and replays the change files after it, and a reader that lacks a
#: rank's changes reads its whole file and then the change files after it.
WHOLE_EVERY = 8
_CHANGES = re.compile(re.escape(SHARE_PREFIX) + r"(\d+)-(\d+|new)-(\d+)\.json")
_WHOLE = re.compile(re.escape(SHARE_PREFIX) + r"(\d+)\.json")
#: The group a request belongs to, where a workflow says so: (a token naming the group, its size in completions), set
#: around the group's episodes (asyncio copies it into every task they start). :func:`install`'s wrapper reads it: the
#: group's requests take the places of one group of that size
#: (:class:`~lengthsched.integrations.areal_sgpo.SGPOWorkflow`, whose groups vary in size). None (the default): a
#: request is matched to its group by its prompt, and a group has the router's ``group_size``.
GROUP: contextvars.ContextVar[tuple[Hashable, int] | None] = contextvars.ContextVar("lengthsched_areal_group",
                                                                                  default=None)
#: Prompts whose key :func:`install`'s wrapper keeps (a group's requests share one; the key is made once per group).
KEY_CACHE = 4096


log = logging.getLogger(__name__)
_NAMED = object()  # marks a group named by its workflow (GROUP) among the open groups, beside prompt keys


def _continues(files: list[tuple[int, str | None, str]], base: int) -> bool:
    """Whether a rank's change files (step, since, name) written after its step ``base`` each continue the one
    before, the first from ``base``."""
    after = [f for f in files if f[0] > base]
    return all(f[1] == link for f, link in zip(after, [str(base)] + [str(f[0]) for f in after[:-1]]))


@dataclass
class _Group:
    """A placed group: its prompt key, predicted tokens per place, the places not yet taken ((place, replica), in
    order) and the lengths of its requests back."""

    key: Hashable
    predicted: np.ndarray
    free: deque = field(default_factory=deque)
    lengths: dict = field(default_factory=dict)  # rid -> tokens generated
    spoiled: bool = False  # a request failed: its lengths are not fed to the predictor


class GroupRouter:
    """Routes one AReaL rank's requests: each group placed by predicted work when its first request comes
    (numpy only; AReaL-independent).

    ``pool_tokens``: each server's KV pool in tokens (prompts included), which the placer's spread reads.
    ``group_size``: completions per prompt (AReaL's ``gconfig.n_samples``, the ``group_size`` its trainer
    submits with). ``planner``: a :class:`~lengthsched.integrations.verl.RolloutPlanner` (its predictor and what
    it learns; ``state_path`` to keep it across restarts); None: one with the online predictor,
    ``max_new_tokens`` its cap (AReaL's ``gconfig.max_new_tokens``). ``concurrency``: groups in flight on all
    ranks together (AReaL's ``max_concurrent_rollouts``: every rank's prompts share the servers' pools), which
    the placer's spread estimate reads; ``ways``: how many servers a group spreads over, by default 1 (whole
    groups, each onto the server with the least predicted tokens in flight from this rank: the most trained
    tokens per second in the model of AReaL's loop at a staleness bound of 1 or more; with fewer groups
    in flight than servers each group takes enough servers for all to get work, :class:`StreamPlacer`; its
    :func:`install` picks it from AReaL's staleness bound, :data:`AUTO`), :data:`EVERY_SERVER` (every group over
    every server in turn, AReaL's own order); None: the placer's estimate from ``concurrency`` and the pool
    (spread where the pools are roomy), capped by
    ``prefill_share`` (:data:`~lengthsched.integrations.rollout.PREFILL_SHARE`; None: no cap). ``batch``: groups
    per learner step on this rank (AReaL's ``consumer_batch_size`` over the ranks), which counts the predictor's
    rollout steps (on from the steps a resumed planner had: a restarted rank goes on sharing at its next step).

    ``share_dir``: a directory all ranks see (on AReaL's shared ``cluster.fileroot``, say) through which the ranks
    pool what their predictors learn. AReaL's sampler deals the prompts to the ranks afresh every epoch, so a
    rank alone knows the earlier epochs of about one prompt in ``ranks`` and predicts the rest from nothing.
    As each rollout step starts the rank writes the statistics of the prompts it observed since its last step,
    alone (``rank{rank}-{since}-{step}.json``, a partial :meth:`RolloutPlanner.state`; its latest
    :data:`KEEP_CHANGES` kept, and those since its whole file), with its first one and then every ``whole_every``
    (default :data:`WHOLE_EVERY`) its planner's whole
    state (``share_dir/rank{rank}.json``, :attr:`state_path`: a restarted rank resumes from it and replays its
    change files written after it, :meth:`RolloutPlanner.replay_states`), and then it merges what the other ranks
    wrote since (:meth:`merge`; :meth:`RolloutPlanner.merge_states`): their change files where it has read every
    one before, else their whole files and the change files after them (the first time, after a restart, or
    after falling more than ``KEEP_CHANGES`` steps behind). A step's merge then reads the prompts the ranks
    observed in a step, not every prompt seen so far (8 ranks, 100,000 prompts: about 1 ms on one core instead
    of 4.2 s for the seven 14 MB whole files), and a rank writes its 14 MB once in 8 steps (``whole_every``: once
    in that many; more makes a restart and a reader's first read replay more change files). ``rank``: this rank's
    number there (any number unique to the submitting process). None: each rank learns alone.

    :meth:`route` gives a new request its server; :meth:`finished` and :meth:`failed` say it is back;
    :meth:`later_turn` that a request continued a routed one (a multi-turn workflow). :attr:`loads`: the
    predicted tokens of the requests routed to each server and not back; :attr:`taken`: prompts whose statistics
    came from other ranks' files.
    """

    #: Routed rids remembered to tell a later turn from a new request (AReaL remembers 128).
    SEEN_RIDS = 65536

    def __init__(self, pool_tokens: int, *, group_size: int, planner: RolloutPlanner | None = None,
                 max_new_tokens: int | None = None, concurrency: int | None = None, ways: int | None = WAYS,
                 prefill_share: float | None = PREFILL_SHARE, batch: int | None = None,
                 share_dir: str | os.PathLike | None = None, rank: int = 0, whole_every: int | None = None):
        self.group_size = check_int("group_size", group_size, minimum=1)
        #: Change files between two writes of this rank's whole file (default :data:`WHOLE_EVERY`).
        self.whole_every = WHOLE_EVERY if whole_every is None else check_int("whole_every", whole_every, minimum=1)
        if planner is not None and not isinstance(planner, RolloutPlanner):
            raise InvalidArgument("planner", type(planner).__name__,
                                  "a lengthsched.integrations.verl.RolloutPlanner (its predictor), or None")
        self.rank = check_int("rank", rank, minimum=0)
        self.share_dir = None
        if share_dir is not None:
            if not isinstance(share_dir, (str, os.PathLike)) or not str(share_dir) or \
                    (os.path.exists(share_dir) and not os.path.isdir(share_dir)):
                raise InvalidArgument("share_dir", share_dir, "a directory every rank can read and write, or None")
            if planner is not None and planner.state_path is not None:
                raise InvalidArgument("planner", f"state_path={str(planner.state_path)!r}",
                                      "a planner without state_path with share_dir (the router writes the rank's "
                                      "file there)")
            os.makedirs(share_dir, exist_ok=True)
            self.share_dir = str(share_dir)
        #: The rank's whole file in ``share_dir`` (None without one); the router writes it, not the planner.
        self.state_path = None if self.share_dir is None else os.path.join(self.share_dir,
                                                                            f"{SHARE_PREFIX}{self.rank}.json")
        if planner is None:
            planner = RolloutPlanner(max_new_tokens=max_new_tokens)
        self.planner = planner
        self._replayed = 0  # own change files replayed on a restart
        # the step of this rank's whole file in share_dir (None: none): its change files after it are never removed
        self._whole_at: int | None = None
        if self.state_path is not None and os.path.exists(self.state_path):  # a restarted rank
            planner.load_state(self.state_path)
            self._whole_at = planner.steps
            self._replay_own()
        self.taken = 0  # prompts whose statistics came from other ranks' files
        self._merged_at = planner.steps  # the planner's step when the others' files were last read
        self._step_base = planner.steps  # a resumed planner's steps: this router's steps count on from them
        self._mtimes: dict[str, int] = {}  # other ranks' whole files read: path -> modification time (ns) then
        self._read: dict[int, int] = {}  # per other rank, the step of its latest change file read
        self._changed: dict[Hashable, None] = {}  # prompt keys observed since this rank's last change file
        self._since: int | None = None  # the step of this rank's last change file (None: none since it started)
        self._unsaved = None  # change files written since the whole file (None: no whole file written yet)
        self._whole_steps: dict[str, int] = {}  # other ranks' whole files read: path -> the steps they held then
        self._bad: dict[str, int | None] = {}  # other ranks' files that could not be read: path -> mtime (ns) then
        self.whole_reads = 0  # other ranks' whole files read
        self.change_reads = 0  # and their change files
        self.whole_writes = 0  # this rank's whole file written
        self.placer = StreamPlacer(pool_tokens, concurrency=concurrency, ways=ways, prefill_share=prefill_share)
        self.batch = None if batch is None else check_int("batch", batch, minimum=1)
        self.loads: list[float] = []
        self._open: dict[Hashable, deque[_Group]] = {}  # per prompt key, its groups with places left, oldest first
        self._of: dict[str, tuple[_Group, int, int]] = {}  # rid routed and not back -> (group, place, replica)
        self.groups = 0  # groups placed
        self.groups_back = 0  # groups whose every request came back
        self.routed = 0  # requests routed
        self.later_turns = 0  # requests that continued a routed rid (left to AReaL)
        self.multi_turn = False
        self._seen: OrderedDict[str, None] = OrderedDict()  # the latest SEEN_RIDS rids routed

    @property
    def ways(self) -> int | None:
        """The spread asked for (its placer's ``ways``; the placer widens it where few groups are in flight)."""
        return self.placer.ways

    def route(self, rid: str, key: Hashable, prompt_tokens: int, servers: int, *, group: Hashable | None = None,
              size: int | None = None) -> int:
        """The server (an index below ``servers``) of a new request ``rid`` whose prompt is ``key`` (the same
        for a group's requests: :func:`prompt_text`) of ``prompt_tokens`` tokens: the next place of the oldest
        group of that prompt with places left, else of a group placed now (predicted, then placed by the
        :class:`StreamPlacer` over :attr:`loads`). The request's predicted tokens count on that server until it
        is back. ``group``: a token naming the request's group where its workflow says (:data:`GROUP`): the
        requests with that token share one group, of ``size`` completions (None: :attr:`group_size`)."""
        servers = check_int("servers", servers, minimum=1)
        prompt_tokens = check_int("prompt_tokens", prompt_tokens, minimum=0)
        size = self.group_size if size is None else check_int("size", size, minimum=1)
        if rid in self._of:
            raise InvalidArgument("rid", rid, "a request id not routed already (one not back yet has its server)")
        if len(self.loads) != servers:  # the first request, or the servers changed: the counts start again
            self.loads = [0.0] * servers
            self._open.clear()
        slot = key if group is None else (_NAMED, group)
        waiting = self._open.get(slot)
        if not waiting:
            waiting = self._open.setdefault(slot, deque())
            waiting.append(self._place(key, prompt_tokens, servers, size))
        group_ = waiting[0]
        place, replica = group_.free.popleft()
        if not group_.free:
            waiting.popleft()
            if not waiting:
                del self._open[slot]
        self._of[rid] = (group_, place, replica)
        _keep_newest(self._seen, rid, None, self.SEEN_RIDS)
        self.loads[replica] += float(group_.predicted[place])
        self.routed += 1
        return replica

    def _place(self, key: Hashable, prompt_tokens: int, servers: int, size: int) -> _Group:
        _, _, work = self.planner.predict({"uid": [0], "raw_prompt": [key]})
        predicted = np.full(size, float(max(1, work[0])))
        replica, _ = self.placer.place(predicted, prompt_tokens, servers, loads=self.loads)
        self.groups += 1
        return _Group(key, predicted, deque(enumerate(int(r) for r in replica)))

    def seen(self, rid: str) -> bool:
        """Whether ``rid`` was routed here (among the latest :attr:`SEEN_RIDS`): a request with it continues
        that one (AReaL forgets all but its latest 128 rids, and then routes a later turn round robin)."""
        return rid in self._seen

    def finished(self, rid: str, tokens: int) -> None:
        """Request ``rid`` is back with ``tokens`` generated; when its whole group is, the predictor learns the
        group's lengths (unless a request of it failed or the workflow is multi-turn)."""
        tokens = check_int("tokens", tokens, minimum=0)
        group = self._back(rid)
        if group is not None:
            group.lengths[rid] = tokens
            self._close(group)

    def failed(self, rid: str) -> None:
        """Request ``rid`` raised instead of coming back: its server's count lets it go, and its group's lengths
        are not learned."""
        group = self._back(rid)
        if group is not None:
            group.spoiled = True
            group.lengths[rid] = 0
            self._close(group)

    def later_turn(self, rid: str) -> None:
        """A request continued rid ``rid`` (AReaL sends it where the rid went): the workflow is multi-turn, so
        from now on nothing is fed to the predictor."""
        self.later_turns += 1
        if not self.multi_turn:
            self.multi_turn = True
            log.warning("lengthsched: a request continued rid %s: a multi-turn workflow; its later turns go where "
                        "AReaL sends them and the predictor is no longer fed (a turn is not a session)", rid)

    def _back(self, rid: str) -> _Group | None:
        entry = self._of.pop(rid, None)
        if entry is None:  # not routed here (a later turn, or routed before the servers changed)
            return None
        group, place, replica = entry
        if replica < len(self.loads):
            self.loads[replica] = max(0.0, self.loads[replica] - float(group.predicted[place]))
        return group

    def _close(self, group: _Group) -> None:
        if len(group.lengths) < len(group.predicted):
            return
        self.groups_back += 1
        if group.spoiled or self.multi_turn:
            return
        step = self._step_base + self.groups_back // self.batch if self.batch else None
        try:
            self.planner.observe([group.key] * len(group.lengths), list(group.lengths.values()), step=step)
        except OSError as exc:  # learnt, but its state file not written: the request it came back with is fine
            log.warning("lengthsched: could not write %s (%s); tried again at the next group", self.planner.state_path,
                        exc)
        if self.share_dir is None:
            return
        self._changed[group.key] = None
        if self.planner.steps > self._merged_at:
            self._merged_at = self.planner.steps
            self.write_changes()
            self.merge()

    def write_changes(self) -> None:
        """Write the statistics of the prompts this rank observed since its last change file to a new one,
        ``rank{rank}-{since}-{step}.json`` (``since``: the step of the last, ``new`` for the first since the
        router was made), with its first one and then every :attr:`whole_every` its whole file, and remove its
        change files older than the latest :data:`KEEP_CHANGES` that its whole file holds (those written after it
        stay, while the whole file cannot be written, for a restart and for readers to chain). Done as each rollout
        step starts; a file that cannot be written is logged, its prompts go into the next one."""
        if self.share_dir is None:
            return
        step = self.planner.steps
        since = "new" if self._since is None else str(self._since)
        path = os.path.join(self.share_dir, f"{SHARE_PREFIX}{self.rank}-{since}-{step}.json")
        try:
            atomic_write_text(path, json.dumps(self.planner.state(prompts=list(self._changed))) + "\n")
        except OSError as exc:
            log.warning("lengthsched: could not write %s (%s); its prompts go into the next one", path, exc)
            return
        self._changed.clear()
        self._since = step
        self._unsaved = None if self._unsaved is None else self._unsaved + 1
        if self._unsaved is None or self._unsaved >= self.whole_every:
            try:
                self.planner.save_state(self.state_path)
                self._unsaved, self._whole_at = 0, step
                self.whole_writes += 1
            except OSError as exc:  # its change files since the last one are kept (below): tried at the next step
                log.warning("lengthsched: could not write %s (%s); tried again at the next step", self.state_path,
                            exc)
        for old, _, name in self._own_changes()[:-KEEP_CHANGES]:
            if self._whole_at is not None and old <= self._whole_at:  # what the whole file holds: never one after it
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(self.share_dir, name))

    def _listing(self) -> tuple[dict[int, str], dict[int, list[tuple[int, str | None, str]]]]:
        """The ranks' files in ``share_dir``: per rank its whole file's name, and its change files as (step, since
        or None for ``new``, name), by step."""
        whole: dict[int, str] = {}
        changes: dict[int, list[tuple[int, str | None, str]]] = {}
        for name in os.listdir(self.share_dir):
            m = _WHOLE.fullmatch(name)
            if m:
                whole[int(m[1])] = name
            m = _CHANGES.fullmatch(name)
            if m:
                changes.setdefault(int(m[1]), []).append((int(m[3]), None if m[2] == "new" else m[2], name))
        for files in changes.values():
            files.sort()
        return whole, changes

    def _own_changes(self) -> list[tuple[int, str | None, str]]:
        """This rank's change files in ``share_dir``: (step, since or None for ``new``, name), by step."""
        return self._listing()[1].get(self.rank, [])

    def _replay_own(self) -> None:
        """A restarted rank, resumed from its whole file: replay its change files written after it, oldest first,
        as long as each continues the one before (a bad one ends the replay with a warning)."""
        chain, link = [], str(self.planner.steps)
        for step, since, name in self._own_changes():
            if step > self.planner.steps and since == link:
                chain.append(os.path.join(self.share_dir, name))
                link = str(step)
        for path in chain:
            try:
                self._replayed += self.planner.replay_states([path])
            except InvalidArgument as exc:
                log.warning("lengthsched: stopped replaying this rank's changes: %s", exc)
                break

    def merge(self) -> int:
        """Take in what the other ranks learnt since last read (their prompts change every epoch, as a shuffled
        sampler deals them anew): done as each rollout step of this rank starts, after its own files are written.
        From each other rank its change files written since (``rank{k}-{since}-{step}.json``), oldest first, where
        they continue the last one read; else (the first read, a restarted rank, a rank more than
        :data:`KEEP_CHANGES` steps ahead of the last read, a change file missing or bad) its whole file (unless
        read before as it is now) and then every change file written after it, oldest first (statistics a rank
        took under its own step count are compared by it, so files are read in the order they were written); a
        rank without change files (an older lengthsched), its whole file when rewritten. A file that cannot be
        read or is not a planner's state is left out with a warning (not read again until rewritten; a bad change
        file sends the next merge back to the whole file and the change files after it): sharing never fails a
        request. Returns the prompts whose statistics were taken."""
        if self.share_dir is None:
            return 0
        whole, changes = self._listing()
        taken = 0
        for rank in sorted((set(whole) | set(changes)) - {self.rank}):
            files = changes.get(rank, [])
            if not files:  # a rank that writes no change files: its whole file, when rewritten
                taken += self._merge_whole(whole.get(rank))[0]
                continue
            last = self._read.get(rank)
            fresh = [f for f in files if last is None or f[0] > last]
            if not fresh:
                continue
            if last is None or not _continues(files, last):  # a gap: the whole file first
                reads = self.whole_reads
                got, base = self._merge_whole(whole.get(rank))
                if self.whole_reads == reads and base is not None and not _continues(files, base):
                    # read before as it is now by its time stamp, yet the change files after it do not continue it
                    # (a clock too coarse to tell a rewrite): read again
                    got, base = self._merge_whole(whole.get(rank), always=True)
                taken += got
                fresh = [f for f in files if base is None or f[0] > base]
                if base is not None:
                    self._read[rank] = base
            bad = False
            for step, _, name in fresh:  # oldest first: each one newer than the one before
                got = self._merge_file(name)
                if got is None:  # unreadable: read around it, and from the whole file again at the next merge
                    bad = True
                    continue
                taken += got[0]
                self.change_reads += 1
                self._read[rank] = step
            if bad:
                self._read.pop(rank, None)
        self.taken += taken
        return taken

    def _merge_whole(self, name: str | None, always: bool = False) -> tuple[int, int | None]:
        """Merge another rank's whole file ``name`` unless read before as it is now (and not ``always``): (the
        prompts taken, the steps its rank had observed when it wrote it, or None where there is no file or it
        cannot be read)."""
        if name is None:
            return 0, None
        path = os.path.join(self.share_dir, name)
        try:
            mtime = os.stat(path).st_mtime_ns
        except FileNotFoundError:
            return 0, None
        if not always and self._mtimes.get(path) == mtime:
            return 0, self._whole_steps.get(path)
        self._mtimes[path] = mtime
        got = self._merge_file(name, mtime)
        if got is None:
            self._whole_steps.pop(path, None)
            return 0, None
        self.whole_reads += 1
        self._whole_steps[path] = got[1]
        return got

    def _merge_file(self, name: str, stamp: int | None = None) -> tuple[int, int] | None:
        """(The prompts taken, the file's steps) from another rank's file ``name`` (``stamp``: its modification
        time in ns where the caller read it); None where it cannot be read (with a warning the first time: a bad
        file is not read again until it is rewritten) or is gone."""
        path = os.path.join(self.share_dir, name)
        if stamp is None:
            try:
                stamp = os.stat(path).st_mtime_ns
            except OSError:
                return None
        if self._bad.get(path) == stamp:
            return None
        try:
            return self.planner.merge_state_file(path)
        except InvalidArgument as exc:
            if not os.path.exists(path):  # removed since listed (its rank keeps only its latest)
                return None
            self._bad[path] = stamp
            log.warning("lengthsched: left out another rank's file: %s", exc)
            return None

    def status(self) -> dict[str, Any]:
        """What the router did so far: groups placed and back, requests routed, later turns left to AReaL, the last
        spread, the predicted tokens in flight per server, whether the workflow turned out multi-turn, and the
        prompts whose statistics came from other ranks (``share_dir``)."""
        return {"groups": self.groups, "groups_back": self.groups_back, "routed": self.routed,
                "later_turns": self.later_turns, "ways": self.placer.last_ways, "loads": list(self.loads),
                "multi_turn": self.multi_turn, "in_flight": len(self._of), "taken_from_ranks": self.taken,
                "whole_reads": self.whole_reads, "change_reads": self.change_reads, "whole_writes": self.whole_writes,
                "replayed": self._replayed}


def prompt_text(request: Any) -> str:
    """A prompt key of an AReaL ``ModelRequest``: its ``input_ids`` decoded by its ``tokenizer`` where it has one
    (the text a trained predictor reads; the same prompt in a later epoch gets the same key), else the ids
    themselves, comma-separated."""
    ids = list(getattr(request, "input_ids", None) or [])
    tokenizer = getattr(request, "tokenizer", None)
    if tokenizer is not None and hasattr(tokenizer, "decode"):
        return str(tokenizer.decode(ids))
    return ",".join(str(int(i)) for i in ids)


def _inner(engine: Any) -> Any:
    """The ``RemoteInfEngine`` of ``engine`` (itself, or the one a ``RemoteSGLangEngine`` / ``RemotevLLMEngine``
    delegates to)."""
    inner = getattr(engine, "_engine", engine)
    for name in ("rid_to_address", "rid_queue", "addresses", "agenerate"):
        if not hasattr(inner, name):
            raise InvalidArgument("engine", type(engine).__name__,
                                  "an initialized AReaL RemoteInfEngine, RemoteSGLangEngine or RemotevLLMEngine (SPMD "
                                  f"mode; {type(inner).__name__} has no {name!r})")
    return inner


def install(engine: Any, *, pool_tokens: int, group_size: int, planner: RolloutPlanner | None = None,
            max_new_tokens: int | None = None, data_parallel_size: int = 1, concurrency: int | None = None,
            ways: int | str | None = AUTO, prefill_share: float | None = PREFILL_SHARE, batch: int | None = None,
            key: Callable[[Any], Hashable] = prompt_text, share_dir: str | os.PathLike | None = None,
            rank: int | None = None, whole_every: int | None = None) -> GroupRouter:
    """Route ``engine``'s requests (a rank's initialized ``RemoteSGLangEngine``, ``RemotevLLMEngine`` or
    ``RemoteInfEngine``, AReaL 1.0.4's SPMD mode) by a :class:`GroupRouter`, returned: its ``agenerate`` gives
    every request with a new rid the router's server (recorded in ``rid_to_address`` and ``rid_queue`` as AReaL
    records its own choice, so AReaL's ``agenerate``, which runs unchanged, sends it there and sends the rid's
    later requests there too) and tells the router when it is back (or failed). ``pool_tokens``,
    ``group_size``, ``planner``, ``max_new_tokens``, ``ways``, ``prefill_share``: :class:`GroupRouter`'s, but
    ``ways`` :data:`AUTO` by default: whole groups (:data:`WAYS`) where the engine config's
    ``max_head_offpolicyness`` is 1 or more (or not there), every server in turn (:data:`EVERY_SERVER`, AReaL's
    own spread: the router then only learns) at 0, AReaL's default, where placing groups lost in the model.
    ``concurrency`` defaults to the engine config's ``max_concurrent_rollouts`` (else ``consumer_batch_size``),
    all ranks' groups in flight, and ``batch`` to its ``consumer_batch_size`` over ``data_parallel_size`` (the
    trainer's data-parallel ranks: this rank's share of a learner step, as AReaL divides it). ``key``: a
    request's prompt key (default :func:`prompt_text`), asked once per prompt while its ids are among the latest
    :data:`KEY_CACHE`. ``share_dir``: :class:`GroupRouter`'s (the ranks pool what they learn there), ``rank``
    this process's number there (default: the ``RANK`` torchrun sets, else 0), ``whole_every`` its whole file's
    rewrites. Installing twice replaces the first router."""
    inner = _inner(engine)
    ranks = check_int("data_parallel_size", data_parallel_size, minimum=1)
    config = getattr(inner, "config", None)
    if concurrency is None:  # all ranks' groups (their prompts share the servers' pools), AReaL's own default
        found = _number(config, "max_concurrent_rollouts") or _number(config, "consumer_batch_size")
        concurrency = None if found is None else int(found)
    if batch is None:
        total = _number(config, "consumer_batch_size")
        batch = None if total is None else max(1, int(total) // ranks)
    if not callable(key):
        raise InvalidArgument("key", type(key).__name__, "a function of an AReaL ModelRequest giving its prompt key")
    if ways == AUTO:
        bound = _number(config, "max_head_offpolicyness")
        ways = EVERY_SERVER if bound is not None and bound < 1 else WAYS
        if ways == EVERY_SERVER:
            log.info("lengthsched: max_head_offpolicyness is 0: each group's requests go to the servers in turn, as "
                     "AReaL sends them (placing groups lost at 0 in the model; it gains with 1 or more)")
    elif isinstance(ways, str):
        raise InvalidArgument("ways", ways, f"{AUTO!r}, a whole number >= 1 (servers a group spreads over) or None "
                                            "(the placer's estimate)")
    if rank is None:
        found = os.environ.get("RANK", "0")
        if not found.isdigit():
            raise InvalidArgument("rank (from the environment's RANK)", found, "a whole number >= 0 (torchrun's rank)")
        rank = int(found)
    router = GroupRouter(pool_tokens, group_size=group_size, planner=planner, max_new_tokens=max_new_tokens,
                         concurrency=concurrency, ways=ways, prefill_share=prefill_share, batch=batch,
                         share_dir=share_dir, rank=rank, whole_every=whole_every)
    original = inner.__dict__.get("_lengthsched_agenerate") or inner.agenerate

    async def agenerate(req: Any) -> Any:
        rid = req.rid
        if rid in inner.rid_to_address or router.seen(rid):  # AReaL sends it where the rid went (if it still knows)
            router.later_turn(rid)
            return await original(req)
        servers: Sequence[str] = inner.addresses
        named = GROUP.get()
        replica = router.route(rid, key_of(req), len(req.input_ids), len(servers),
                               group=None if named is None else named[0], size=None if named is None else named[1])
        _remember(inner, rid, servers[replica])
        try:
            response = await original(req)
        except BaseException:
            router.failed(rid)
            raise
        router.finished(rid, len(response.output_tokens))
        return response

    keys: OrderedDict[tuple, Hashable] = OrderedDict()  # prompt ids -> key, the latest KEY_CACHE (one per group)

    def key_of(req: Any) -> Hashable:
        ids = tuple(req.input_ids)
        found = keys[ids] if ids in keys else key(req)
        _keep_newest(keys, ids, found, KEY_CACHE)
        return found

    inner._lengthsched_agenerate = original
    inner.agenerate = agenerate
    inner.lengthsched_router = router
    return router


def _remember(inner: Any, rid: str, address: str) -> None:
    """Record ``rid``'s server as AReaL's ``agenerate`` records its own choice: the oldest rid forgotten when
    ``RID_CACHE_SIZE`` are kept."""
    if len(inner.rid_queue) >= RID_CACHE_SIZE:
        oldest = inner.rid_queue.pop(0)
        inner.rid_to_address.pop(oldest, None)
    inner.rid_to_address[rid] = address
    inner.rid_queue.append(rid)
