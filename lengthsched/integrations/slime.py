"""slime: plan every rollout batch and send each sample to the SGLang engine its plan names.

slime (THUDM/slime) generates a rollout with SGLang engines behind SGLang's router. Modelled on slime's
code at commit 624b824 (``slime/rollout/sglang_rollout.py``, ``slime/utils/http_utils.py``,
``slime/utils/arguments.py``; tested with fakes built from them, not run on a slime cluster, an SGLang
engine or a GPU):

- ``generate_rollout(args, rollout_id, data_source, evaluation=False)`` (the default
  ``--rollout-function-path``) runs ``generate_rollout_async``: it takes groups of samples from
  ``data_source.get_samples(args.over_sampling_batch_size)`` until enough are valid, submits one task
  per group (``GenerateState.submit_generate_tasks``, in the order the groups came), and each sample
  waits on ONE semaphore of ``--sglang-server-concurrency`` (512) x engines (``generate_and_rm``), in
  that order, before it is generated; the leftovers are aborted at the end (``abort``, which lists the
  engines with ``GET {router}/workers``).
- Inside the semaphore, ``generate_and_rm`` calls the function named by
  ``--custom-generate-function-path`` (``custom(args, sample, sampling_params[, evaluation])``), else
  ``generate(args, sample, sampling_params)``, which POSTs the sample to
  ``http://{args.sglang_router_ip}:{args.sglang_router_port}/generate``: SGLang's router places it
  (cache-aware by default: a group's samples go where its first went while the loads are balanced).
  A sample that was aborted (partial rollout) is resumed from its tokens by the same ``generate``.
- ``--custom-config-path`` names a YAML whose keys become attributes of ``args`` ("custom function
  arguments"): how this module is configured.

This module supplies, for those two hooks:

- :func:`generate_rollout` (``--rollout-function-path lengthsched.integrations.slime.generate_rollout``):
  runs slime's own ``generate_rollout`` with the data source wrapped (:class:`PlannedDataSource`), so
  every batch of groups it takes is planned before slime submits it: each group's length predicted from
  its prompt (default :class:`~lengthsched.OnlineLengthPredictor`, fed with the finished lengths of
  earlier rollouts, so a prompt seen in an earlier epoch is predicted from its history; until it has seen
  a rollout, the batches go through slime's router unplanned: ``lengthsched_uninformed``), the samples
  placed on the engines by :func:`~lengthsched.integrations.plan_rollout` (default ``"ways"``: the
  simulator's ``steal`` placement, each group over as many engines as the KV pools hold its prompt,
  whole groups in crowded steps), and the groups handed to slime longest predicted first (on several
  engines), so that the semaphore sends them in that order. Evaluation rollouts run slime's unchanged.
- :func:`generate` (``--custom-generate-function-path lengthsched.integrations.slime.generate``):
  holds each planned sample in a client queue per engine (:class:`~lengthsched.integrations.ClientQueues`)
  and sends an engine its next one while the predicted tokens (prompt plus predicted completion) of
  those it was sent and that are not done fit :data:`WINDOW` (2) KV pools; an engine whose queue ran
  empty takes the last sample of the queue with the most predicted work (a steal that needs no abort:
  the sample was never sent). The sample goes straight to its engine (slime's own ``generate`` with the
  engine's host and port in place of the router's); an unplanned one (evaluation) goes through the
  router as slime would. A sample still waiting when slime aborts the rollout comes back ``ABORTED``
  (slime then keeps it for the next rollout with partial rollout on, as its own aborted samples). A
  resumed sample (its ``tokens`` the prompt plus a partial response of ``response_length`` tokens) is
  planned by what it has left to generate, and its partial response counts in its engine's window.
- :func:`dynamic_sampling_filter` (``--dynamic-sampling-filter-path
  lengthsched.integrations.slime.dynamic_sampling_filter``): runs your filter
  (``lengthsched_dynamic_sampling_filter_path``, default slime's DAPO filter ``check_reward_nonzero_std``) and
  records, per prompt, whether it kept each group (:class:`~lengthsched.filtering.FilterHistory`); from the
  next epoch on every batch is handed to slime likely-kept first (``lengthsched_filter_order``), planned or
  left to slime's router; by default only where slime runs without ``--partial-rollout``. A prompt whose groups
  the filter dropped (all right or all wrong) tends to be dropped again, and hard prompts run long: in the
  simulator, with DAPO's filter drawn from a model of difficulty tied to length fitted to GSM8K's labelled
  solutions, the order gave slime 4.1-10.8% more kept tokens per second on average over 20 steps without
  partial rollout, and was 0.4-2.0% slower with it (docs/benchmarks.md, "Over twenty steps"); the first
  epoch, with no history yet, is slime's own.
  With ``lengthsched_selective_rollout: true`` it also skips the prompts the history says will be dropped
  again (GRESO's pre-rollout filter).
- online sGPO (``lengthsched_sgpo: true``; docs/howto-slime.md): each fresh group sized from its prompt's latest
  rewards (:class:`SlimeSGPO`, an :class:`~lengthsched.sgpo.OnlineBudget`); the samples a group does not need
  (:data:`STUB_KEY`) are generated for one token with a reward of 0 and ``remove_sample`` (slime masks their
  loss), and :func:`reward_post_process` (``--custom-reward-post-process-path
  lengthsched.integrations.slime.reward_post_process``: slime's group normalisation per ``group_index``) leaves
  them out of their group's mean and spread. Keys ``lengthsched_sgpo_*`` (:data:`SGPO_OPTIONS`).
- :class:`SlimePlanner`: the planning, numpy only (``import lengthsched.integrations.slime`` imports
  neither slime, torch nor an HTTP client; slime is imported when a hook runs).

Configuration, as keys of slime's ``--custom-config-path`` YAML (all optional):

- ``lengthsched_placement``: ``ways`` (default), ``groups`` (whole groups by predicted work; the default
  of planned over-sampled rollouts) or ``spread`` (sample i of the batch to engine i mod R).
- ``lengthsched_oversampled``: what an over-sampled rollout gets (:func:`oversampled`: a
  ``--dynamic-sampling-filter-path``, or ``--over-sampling-batch-size`` above ``--rollout-batch-size``):
  ``router`` (default) runs slime's own rollout, nothing planned (the predictor still learns from it);
  ``plan`` plans it, by default whole groups (``groups``) handed over shortest predicted first
  (``shortest``) through the client window.

Over-sampled rollouts end at the ``rollout_batch_size``-th group that passes, not when every group submitted
has finished, and slime's dynamic sampling submits another batch each time the filter has dropped so many
that those submitted and not dropped fall short. What pays there is finishing whole groups early, not
balancing the last finish, and slime's cache-aware router already keeps groups whole: in the simulator
(slime's dynamic sampling modelled, ``simulate.rollout.Refill``; docs/benchmarks.md, "slime's dynamic
sampling") the makespan plan was 1.3% slower than slime there (up to 13%), whole groups in batch order 0.5%
faster (up to 5.5% slower), whole groups shortest first 2.0% faster (up to 5.5% slower) with fewer long groups
kept (the kept groups' mean length 0.786 of those drawn against slime's 0.867, without partial rollout): too
little, and too unsafe, to be the default.
- ``lengthsched_pool_tokens``: each engine's KV pool in tokens, prompts included (what ``ways`` needs:
  SGLang logs it at start, "max_total_num_tokens"); without it the planner asks the first engine's
  ``/get_server_info`` (or ``/server_info``) for ``max_total_num_tokens``, times ``dp_size`` (one pool
  per data-parallel rank: :func:`engine_pool_tokens`), and, where that fails, places whole groups
  (``groups``) and logs a warning.
- ``lengthsched_submit``: ``auto`` (default: groups handed to slime longest predicted first on several
  engines, in the data source's order on one; ``shortest`` in planned over-sampled rollouts), ``longest``,
  ``shortest`` or ``batch`` (the data source's order).
- ``lengthsched_default_length``: the default predictor's prediction for every prompt before it has seen a
  rollout (tokens; default half of ``rollout_max_response_len``; afterwards a prompt never seen is predicted
  the mean log length of those seen). Given, the first rollout is planned on it.
- ``lengthsched_uninformed``: what the batches taken before the predictor has seen a length get:
  ``router`` (the default without ``lengthsched_default_length``) sends them unplanned through slime's
  router, as slime does; ``plan`` plans them on the made-up ``lengthsched_default_length``.
- ``lengthsched_window``: each engine's client window in KV pools (default :data:`WINDOW`, 2; 0: every
  sample sent at once, nothing stolen); it needs the pool
  (``lengthsched_pool_tokens`` or the engine's answer), else every sample is sent at once.
  ``lengthsched_steal``: false keeps each sample on its planned engine (the window alone).
- ``lengthsched_kv_compression``: ``"BUDGET:INTERVAL"`` where the engines run a compressed KV cache
  (Sparse-RL's: each sequence keeps at most BUDGET + INTERVAL generated tokens): the client window then counts
  each sample's prompt plus at most that many of its predicted tokens, what the engine holds
  (docs/companions.md). Unset: a full cache.
- ``lengthsched_dynamic_sampling_filter_path``: the filter :func:`dynamic_sampling_filter` runs (default
  :data:`DEFAULT_FILTER_PATH`, slime's ``check_reward_nonzero_std``). ``lengthsched_filter_order``: true hands
  every batch over likely-kept first once the history knows something; false only records. The default follows
  slime's ``--partial-rollout``: true without it, false with it (the groups a step aborts then come back with
  their tokens, so putting the likely-dropped ones last defers their work rather than saving it, and over 20
  steps the order was slower than slime's own; docs/benchmarks.md, "Over twenty steps").
  ``lengthsched_filter_history_path``: a JSON file the history is read from when the planner is made and
  written to (atomically) after every training rollout, so a run resumed from a checkpoint keeps it.
- ``lengthsched_state_path``: the same for what the planner learns of the lengths (the default predictor's
  statistics: :meth:`RolloutPlanner.state <lengthsched.integrations.verl.RolloutPlanner.state>`), so a resumed
  run does not start uninformed.
- ``lengthsched_selective_rollout``: true skips prompts before they run, as GRESO does
  (:class:`~lengthsched.filtering.SelectiveRollout`, needs the filter hook above): a prompt whose latest groups
  the filter dropped all right (or all wrong) ``n`` times in a row is skipped with probability
  ``1 - max(p ** n, 0.01)``, ``p`` adapted after every rollout towards GRESO's target shares; the batch is
  filled from the data source in its place, and a group carried by partial rollout is never skipped. Default
  false: it changes which prompts the learner sees (in the simulator, where prompts do not get easier, a third
  to a half of the prompts it skipped would have passed the filter: 4-6 per 100 groups trained).
  ``lengthsched_solved_reward`` (default 0.5): a reward at or above it is a solved completion, which tells an
  all-right group from an all-wrong one; ``lengthsched_selective_seed`` (default 0) seeds its draws; its state
  is saved with the history.
- ``lengthsched_max_carry``: with ``--partial-rollout`` and ``--buffer-filter-path
  lengthsched.integrations.slime.buffer_filter``, the most rollouts a group may be carried in slime's
  buffer; one carried more is thrown away (:func:`buffer_filter`; default: no limit).
- ``lengthsched_generate_function_path``: your own generate function (a multi-turn agent's, as you would
  give ``--custom-generate-function-path``; ``package.module.function``), called in place of slime's
  ``generate`` with a copy of ``args`` whose ``sglang_router_ip`` / ``sglang_router_port`` are the planned
  engine's, so every request it posts to that address (each turn) goes to that engine; ``evaluation=``
  is passed where its signature has it, as slime passes it.
- ``lengthsched_multi_turn``: true where the generate function posts several requests per sample (the turns of an
  agent loop with tools): then no rollout is planned, slime's router places every turn, and the integration only
  learns the lengths (and orders the batches by the filter history, ``lengthsched_filter_order``). In the
  simulator's multi-turn steps (docs/benchmarks.md, "Multi-turn steps on SGLang's engines") pinning each session to
  its planned engine was 3.7% slower than slime's router on average without the client window and 12.7% with it
  (up to 1.60x): SGLang's router sends a later turn elsewhere when the engines' loads drift apart (a third of the
  later turns), and the window holds sessions back while their tools run. Default false.

What it is worth, in the simulator (docs/benchmarks.md, "slime with the project's plan"): against
slime as it ships (SGLang's engines behind its cache-aware router, its 512 x R in-flight cap), the same
engines fed this plan. What it does not do: move a sample once sent (``steal_sglang`` in the simulator
also moves running requests and steals those queued inside SGLang, which needs aborts by request id that
slime's ``generate`` does not send); plan an over-sampled rollout unless asked (``lengthsched_oversampled:
plan``: then each further batch slime takes is placed from what each engine still has queued and in flight
in the client, :meth:`ClientQueues.outstanding`, with the window on); with ``--sglang-dp-size``
> 1 an engine's pool counts all its data-parallel ranks and the engine is planned as one replica (SGLang
spreads its requests over the ranks); a generate function of your own
(``lengthsched_generate_function_path``) is trusted to post to the address in the ``args`` it is given,
and its sample is planned by one predicted length (all turns together).
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import logging
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from ..errors import InvalidArgument, check_int
from ..filtering import (
    SKIP_DRAWS,
    SOLVED_REWARD,
    FilterHistory,
    SelectiveRollout,
    check_solved_reward,
    dropped_side,
    order_by_pass,
    read_filter_state,
    write_filter_state,
)
from ..memory import KVCompression
from ..sgpo import OnlineBudget, online_budget_from_options, write_online_budget
from .rollout import ClientQueues, RolloutPlan, predict_lengths, remaining_after
from .verl import RolloutPlanner, batch_prompt_tokens, load_object, prompt_key

__all__ = [
    "CARRIED_KEY",
    "NEED_KEY",
    "REPLICA_KEY",
    "SLIME_COMMIT",
    "WINDOW",
    "WORK_KEY",
    "SUBMIT_ORDERS",
    "PlannedDataSource",
    "SlimePlanner",
    "buffer_filter",
    "DEFAULT_FILTER_PATH",
    "dynamic_sampling_filter",
    "engine_address",
    "generate",
    "engine_pool_tokens",
    "generate_rollout",
    "multi_turn",
    "OVERSAMPLED_MODES",
    "oversampled",
    "planner_for",
    "reset",
    "reward_post_process",
    "sgpo_for",
    "SlimeSGPO",
    "STUB_KEY",
]

SLIME_COMMIT = "624b824"  # the slime commit this module was modelled on
REPLICA_KEY = "lengthsched_replica"  # sample.metadata key: the index of the engine the plan chose
WORK_KEY = "lengthsched_predicted"  # sample.metadata key: its predicted completion (tokens)
NEED_KEY = "lengthsched_need"  # sample.metadata key: its prompt plus predicted completion (tokens)
#: Each engine's client window, in KV pools (``lengthsched_window``): an engine is sent its next planned
#: sample while the predicted tokens of those it was sent and are not done stay within WINDOW x its pool.
#: 2 and 3 tied as the best of 1, 1.5, 2 and 3 in the simulator (docs/benchmarks.md, "slime with the
#: project's plan"); on one engine there is no window.
WINDOW = 2.0
_WAKE_SECONDS = 0.5  # how often a sample waiting in the client checks whether slime aborted the rollout
SUBMIT_ORDERS = ("auto", "longest", "shortest", "batch")
UNINFORMED = ("router", "plan")  # SlimePlanner's uninformed: what a batch gets while the predictions say nothing
OVERSAMPLED_MODES = ("router", "plan")  # lengthsched_oversampled: what an over-sampled rollout gets
PLACEMENTS = ("ways", "groups", "spread")

log = logging.getLogger(__name__)


def _sample_generated(sample: Any) -> int:
    """Tokens a sample generated before (slime's partial rollout resumes an aborted sample from its
    ``tokens``, prompt plus partial response): its ``response_length`` where it has tokens, else 0."""
    if not getattr(sample, "tokens", None):
        return 0
    return max(0, int(getattr(sample, "response_length", 0) or 0))


def _sample_prompt_tokens(sample: Any) -> int | None:
    """The prompt's tokens of a sample whose ``tokens`` are set (less a partial response), else None."""
    tokens = getattr(sample, "tokens", None)
    return max(0, len(tokens) - _sample_generated(sample)) if tokens else None


class SlimePlanner:
    """Plans slime's batches of groups (numpy only; slime-independent).

    ``placement``: ``"ways"``, ``"groups"`` or ``"spread"`` (:func:`~lengthsched.integrations.plan_rollout`'s);
    ``pool_tokens``: each engine's KV pool in tokens, prompts included (``"ways"`` needs it);
    ``submit``: ``"longest"`` (the groups returned longest predicted first), ``"batch"`` (as given) or
    ``"auto"`` (the default: longest first on several engines, as given on one, where there is nothing
    to place and the order alone, in the simulator, gained 2% on average but lost up to 18% in a quarter
    of the settings: docs/benchmarks.md, "slime with the project's plan");
    ``max_new_tokens``: the longest a completion may be (slime's ``rollout_max_response_len``);
    ``predictor`` and ``default_length``: as :class:`~lengthsched.integrations.verl.RolloutPlanner`'s
    (default an :class:`~lengthsched.OnlineLengthPredictor` that learns from :meth:`observe`).
    ``uninformed``: what :meth:`plan` does while the predictions say nothing (the default predictor before
    it was told a length: every sample predicted ``default_length``, a made-up number): ``"router"``
    leaves the batch unplanned, so every sample goes through slime's router as slime sends it, until the
    predictor has seen a rollout; ``"plan"`` plans it on the predictions anyway. None (the default):
    ``"plan"`` where ``default_length`` is given (a length you chose is information), else ``"router"``.
    In the simulator, planning the first step on ``response_length / 2`` everywhere was up to 40% slower
    than slime (its client window counts the made-up tokens) and no planned rule was never slower
    (docs/benchmarks.md, "slime's first step without a trained predictor").
    ``history``: what the dynamic-sampling filter did with each prompt's groups
    (:class:`~lengthsched.filtering.FilterHistory`, fed by :func:`dynamic_sampling_filter`; a fresh one by
    default); with ``filter_order`` every batch, planned or not, is returned likely-kept first
    (:meth:`order_by_filter`), the order ``submit`` gives breaking ties. ``selective``: a
    :class:`~lengthsched.filtering.SelectiveRollout` (GRESO's skip, by the same history) that
    :meth:`select_groups` applies to every batch slime takes, or None (nothing skipped).
    ``kv_compression``: the engines' compressed KV cache (Sparse-RL's: a :class:`~lengthsched.KVCompression`
    or its text ``"BUDGET:INTERVAL"``; None: a full cache): a sample's tokens in flight (``NEED_KEY``, what
    the client window counts) are its prompt plus at most ``budget + interval`` generated tokens, what it
    holds there. The placement still weighs the predicted completions whole (they are the decode work; in
    the simulator, weighing the capped tokens in ``ways``' crowding rule was slower: docs/companions.md).
    """

    def __init__(self, *, placement: str = "ways", pool_tokens: int | None = None, submit: str = "auto",
                 max_new_tokens: int | None = None, predictor: Any = None, default_length: int | None = None,
                 uninformed: str | None = None, filter_order: bool = False, history: FilterHistory | None = None,
                 selective: SelectiveRollout | None = None, state_path: str | None = None,
                 kv_compression: KVCompression | str | None = None):
        if placement not in PLACEMENTS:
            raise InvalidArgument("placement", placement, "one of " + ", ".join(PLACEMENTS))
        if submit not in SUBMIT_ORDERS:
            raise InvalidArgument("submit", submit, "one of " + ", ".join(SUBMIT_ORDERS))
        if uninformed is None:
            uninformed = "router" if default_length is None else "plan"
        if uninformed not in UNINFORMED:
            raise InvalidArgument("uninformed", uninformed, "one of " + ", ".join(UNINFORMED))
        if placement == "ways" and pool_tokens is None:
            raise InvalidArgument("pool_tokens", None, "each engine's KV pool in tokens (placement 'ways' needs it; "
                                                       "or placement 'groups')")
        if history is not None and not all(hasattr(history, a) for a in ("pass_probability", "informed", "observe")):
            raise InvalidArgument("history", type(history).__name__, "a lengthsched.filtering.FilterHistory or None")
        self.placement, self.submit, self.uninformed = placement, submit, uninformed
        kv_compression = KVCompression.of(kv_compression, "kv_compression")
        # the most generated tokens a sample holds in its engine's cache (None: all of them)
        self.kv_cap = None if kv_compression is None else kv_compression.max_retained
        if selective is not None and not isinstance(selective, SelectiveRollout):
            raise InvalidArgument("selective", type(selective).__name__, "a lengthsched.SelectiveRollout or None")
        self.filter_order = bool(filter_order)
        self.history = FilterHistory() if history is None else history
        self.selective = selective
        self.skipped = 0  # groups select_groups skipped, every rollout
        self.planner = RolloutPlanner(predictor, max_new_tokens=max_new_tokens, default_length=default_length,
                                      placement=placement, pool_tokens=pool_tokens, order="batch",
                                      state_path=state_path)
        self.last_plan: RolloutPlan | None = None

    @property
    def planning(self) -> bool:
        """Whether :meth:`plan` plans a batch now: always with ``uninformed="plan"``; else once the predictions
        say something (:attr:`RolloutPlanner.informed <lengthsched.integrations.verl.RolloutPlanner.informed>`:
        a trained predictor, or the default one after it was told a length)."""
        return self.uninformed == "plan" or self.planner.informed

    def plan(self, groups: Sequence[Sequence[Any]], replicas: int,
             prompt_lens: Sequence[int] | None = None, loads: Sequence[float] | None = None) -> list[list[Any]]:
        """Plan one batch of ``groups`` (lists of samples with ``prompt``, ``tokens`` and ``metadata``)
        on ``replicas`` engines: every sample's ``metadata[REPLICA_KEY]`` is set to its engine, and the
        groups are returned in submission order (``submit``). Groups of no samples pass through.
        ``prompt_lens``: per group, its prompt's length in tokens; None: ``len(sample.tokens)`` (less
        its ``response_length``) where every sample has tokens, else an estimate from the prompt's text
        (:func:`~lengthsched.integrations.verl.batch_prompt_tokens`: slime's data source leaves
        ``tokens`` empty until ``generate`` tokenizes the prompt). A sample slime's partial rollout
        resumes (``tokens`` set, ``response_length`` > 0) is planned by what it has left: what the
        predictor says is left after its progress, having seen its group's finished samples
        (:meth:`_resumed_left`), a resumed group submitted by the most any of its samples has left; its
        tokens in flight (``NEED_KEY``) count the partial response's KV. ``loads``: predicted tokens each
        engine already has (a batch taken while earlier ones run, as slime's dynamic sampling takes
        them): ``groups`` and ``ways`` place from them."""
        replicas = check_int("replicas", replicas, minimum=1)
        groups = [list(g) for g in groups]
        if prompt_lens is not None:
            prompt_lens = [check_int("prompt_lens", n, minimum=0) for n in prompt_lens]
            if len(prompt_lens) != len(groups):
                raise InvalidArgument("prompt_lens", f"{len(prompt_lens)} values", f"{len(groups)}, one per group")
        index = [i for i, g in enumerate(groups) if g]
        if not index:
            return groups
        if not self.planning:  # nothing known yet: slime's router sends the batch, as slime would
            for g in groups:
                for sample in g:
                    for key in (REPLICA_KEY, WORK_KEY, NEED_KEY):
                        (getattr(sample, "metadata", None) or {}).pop(key, None)
            self.last_plan = None
            log.info("lengthsched: the length predictor has seen no rollout yet: %d group(s) go through slime's "
                     "router unplanned (lengthsched_uninformed: plan, or lengthsched_default_length, plans them)",
                     len(index))
            return self.order_by_filter(groups)
        prompts = [prompt_key(groups[i][0].prompt) for i in index]
        # the samples planned: a group's stubs (online sGPO's, one token each) follow its first planned sample
        runs = {i: [x for x in groups[i] if not _stub(x)] or list(groups[i]) for i in index}
        left = self._resumed_left([runs[i] for i in index], prompts)
        if self.submit in ("longest", "shortest") or (self.submit == "auto" and replicas > 1):
            first = predict_lengths(self.planner.predictor, prompts, max_new_tokens=self.planner.max_new_tokens)
            first = np.array([x.max() if x.any() else f for x, f in zip(left, first)])  # resumed: what is left
            order = np.argsort(first if self.submit == "shortest" else -first, kind="stable")
            index, prompts, left = [index[i] for i in order], [prompts[i] for i in order], [left[i] for i in order]
        live = [groups[i] for i in index]
        planned = [runs[i] for i in index]
        batch: dict[str, Any] = {"uid": np.array([i for i, g in enumerate(planned) for _ in g]),
                                 "raw_prompt": np.array([p for p, g in zip(prompts, planned) for _ in g],
                                                        dtype=object)}
        if prompt_lens is not None:
            ids = [prompt_lens[i] for i in index for _ in runs[i]]
        else:
            ids = [_sample_prompt_tokens(s) for g in planned for s in g]
        if all(n is not None for n in ids):  # exact prompt lengths: batch_prompt_tokens reads only len()
            batch["raw_prompt_ids"] = [range(n) for n in ids]
        generated = [_sample_generated(s) for g in planned for s in g]
        if any(generated):  # resumed partial samples: planned by what they have left to generate
            batch["generated"] = np.array(generated, dtype=np.int64)
            batch["left"] = np.concatenate(left)
        plan, _ = self.planner.plan(batch, replicas, loads=loads)
        rows = iter(zip(plan.replica, plan.predicted, batch_prompt_tokens(batch, len(plan.replica)), generated))
        for g, run in zip(live, planned):
            first = None
            for sample in run:
                replica, work, prompt, done = next(rows)
                held = work + done if self.kv_cap is None else min(work + done, self.kv_cap)
                sample.metadata.update({REPLICA_KEY: int(replica), WORK_KEY: int(work), NEED_KEY: int(prompt + held)})
                first = (replica, prompt) if first is None else first
            ran = {id(x) for x in run}
            for sample in g:
                if id(sample) not in ran:  # a stub: beside its group's first sample (its prompt's cache), one token
                    sample.metadata.update({REPLICA_KEY: int(first[0]), WORK_KEY: 1, NEED_KEY: int(first[1] + 1)})
        self.last_plan = plan
        return self.order_by_filter(live) + [g for g in groups if not g]

    def order_by_filter(self, groups: list[list[Any]]) -> list[list[Any]]:
        """``groups`` likely-kept first by :attr:`history` (:func:`~lengthsched.filtering.order_by_pass`: ties,
        and every group while the history is empty, in the order given) where ``filter_order`` is on, else as
        given. Groups of no samples go last."""
        if not self.filter_order or not self.history.informed:
            return groups
        live = [g for g in groups if g]
        order = order_by_pass(self.history.pass_probability([prompt_key(g[0].prompt) for g in live]))
        return [live[i] for i in order] + [g for g in groups if not g]

    def observe_filter(self, group: Sequence[Any], kept: bool, side: str | None = None) -> None:
        """Record that the dynamic-sampling filter kept (or dropped) ``group`` (its samples' prompt is the key);
        ``side``: why a dropped group was dropped (``"easy"``, ``"hard"``, or None: not known)."""
        samples = _flat(group)
        if samples:
            self.history.observe(prompt_key(samples[0].prompt), bool(kept), None if kept else side)

    def select_groups(self, groups: Sequence[Sequence[Any]]) -> list[bool]:
        """Per group, whether it runs (True) or :attr:`selective` skips its prompt; True for every group without a
        rule, and for a group that already holds generated tokens (partial rollout carries it: its work is
        spent)."""
        groups = list(groups)
        if self.selective is None:
            return [True] * len(groups)
        fresh = [i for i, g in enumerate(groups) if g and not any(_sample_generated(x) for x in _flat(g))]
        runs = [True] * len(groups)
        drawn = self.selective.select(self.history, [prompt_key(_flat(groups[i])[0].prompt) for i in fresh])
        for i, on in zip(fresh, drawn.tolist()):
            runs[i] = on
        self.skipped += runs.count(False)
        return runs

    def _resumed_left(self, groups: list[list[Any]], keys: list[str]) -> list[np.ndarray]:
        """Per group, per sample, what a resumed group's unfinished samples have left to generate: the
        planner's predictor asked with each one's progress (``predict(prompts, prefixes)``: its own model
        of what is left, so a sample that outran its prediction is not taken for nearly done, as
        ``max(1, predicted - generated)`` would take it), after a copy of a predictor that learns online
        saw the group's finished samples (:class:`~lengthsched.OnlineLengthPredictor`: the siblings move
        its belief about the prompt). 0 for the samples of groups nothing of which was generated yet and
        for the finished samples (slime does not generate them again): their work stays the plan's own."""
        resumed = [i for i, g in enumerate(groups) if any(_sample_generated(s) for s in g)]
        left = [np.zeros(len(g), dtype=np.int64) for g in groups]
        if not resumed:
            return left
        done = {i: np.array([_finished(s) for s in groups[i]], dtype=bool) for i in resumed}
        got = remaining_after(self.planner.predictor, [keys[i] for i in resumed],
                              [[int(s.response_length) for s, f in zip(groups[i], done[i]) if f] for i in resumed],
                              [[_sample_generated(s) for s, f in zip(groups[i], done[i]) if not f] for i in resumed],
                              max_new_tokens=self.planner.max_new_tokens)
        for i, values in zip(resumed, got):
            left[i][~done[i]] = values
        return left

    def observe(self, groups: Sequence[Sequence[Any]]) -> int:
        """Feed the response lengths (tokens) of one finished rollout's groups to the predictor, keyed
        by prompt; samples that did not finish (aborted, failed) are left out. Returns the rows fed."""
        keys, lengths = [], []
        for group in groups:
            for sample in _flat(group):
                if _finished(sample) and not _stub(sample):  # a stub's one token says nothing of the prompt
                    keys.append(prompt_key(sample.prompt))
                    lengths.append(int(sample.response_length))
        return self.planner.observe(keys, lengths) if keys else 0


def _finished(sample: Any) -> bool:
    """Whether slime counts a sample as done (``COMPLETED`` or ``TRUNCATED``: its ``generate_and_rm`` returns
    such a sample as it is, also when a partial rollout resubmits its group)."""
    status = getattr(getattr(sample, "status", None), "value", getattr(sample, "status", None))
    return status in ("completed", "truncated")


def _flat(group: Any) -> list[Any]:
    """A group's samples (a custom generate function may return a list of samples per sample)."""
    out = []
    for item in group:
        out.extend(_flat(item) if isinstance(item, (list, tuple)) else [item])
    return out


#: The sample metadata key in which :func:`buffer_filter` counts how many times a group came back from
#: slime's buffer (the steps it was carried).
CARRIED_KEY = "lengthsched_carried"


def buffer_filter(args: Any, rollout_id: Any, buffer: list, num_samples: int) -> list:
    """slime's ``--buffer-filter-path`` (``lengthsched.integrations.slime.buffer_filter``): what slime's
    default ``pop_first`` does (the first ``num_samples`` groups of the buffer, removed from it), with a
    staleness limit for ``--partial-rollout``. Each group taken out of the buffer has been carried once
    more (its samples' ``metadata[CARRIED_KEY]``); with ``args.lengthsched_max_carry`` K (a key of the
    ``--custom-config-path`` YAML), a group that would now be resubmitted after more than K carries is
    thrown away with the tokens it holds, and the next one is taken (slime fills what the buffer does not
    give from the dataset). A kept token is then at most K policy updates old. Without the key nothing is
    dropped. In the simulator (``simulate.run_oversampled_steps(..., max_carry=K, carry_limit="drop")``,
    docs/benchmarks.md, "Partial rollout under a staleness limit") K = 2 kept 98% of the kept tokens per
    second of partial rollout without a limit. ``rollout_id`` is unused: slime passes None (its ``abort``
    stamps ``metadata["start_rollout_id"]`` on a sample with a partial response, but the filter is not told
    the current rollout), hence the count of carries."""
    limit = getattr(args, "lengthsched_max_carry", None)
    if limit is not None:
        limit = check_int("lengthsched_max_carry", limit, minimum=1)
    num_samples = check_int("num_samples", num_samples, minimum=0)
    taken, dropped = [], 0
    while buffer and len(taken) < num_samples:
        group = buffer.pop(0)
        samples = _flat(group)
        for s in samples:
            if getattr(s, "metadata", None) is None:
                s.metadata = {}
        carried = 1 + max((int(s.metadata.get(CARRIED_KEY, 0)) for s in samples), default=0)
        for s in samples:
            s.metadata[CARRIED_KEY] = carried
        if limit is not None and carried > limit:
            dropped += 1
            continue
        taken.append(group)
    if dropped:
        log.info("lengthsched: dropped %d group(s) carried more than %d rollouts (lengthsched_max_carry)", dropped,
                 limit)
    return taken


#: The filter :func:`dynamic_sampling_filter` runs where ``lengthsched_dynamic_sampling_filter_path`` names none:
#: slime's DAPO filter (a group is kept when its rewards are not all equal).
DEFAULT_FILTER_PATH = "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"
_FILTERS: dict[str, Any] = {}  # path -> the filter function loaded


def _filter_kept(output: Any) -> bool:
    """Whether a dynamic filter's answer keeps the group: a ``DynamicFilterOutput``'s ``keep``, or a legacy
    bool (slime's ``call_dynamic_filter`` reads both)."""
    keep = getattr(output, "keep", output)
    return bool(keep.item() if hasattr(keep, "item") else keep)


def dynamic_sampling_filter(args: Any, samples: list, **kwargs: Any) -> Any:
    """slime's ``--dynamic-sampling-filter-path`` (``lengthsched.integrations.slime.dynamic_sampling_filter``): runs
    the filter named by ``args.lengthsched_dynamic_sampling_filter_path`` (a key of the ``--custom-config-path``
    YAML; default :data:`DEFAULT_FILTER_PATH`, slime's DAPO filter) on a finished group and returns its answer
    unchanged, after recording in the planner's :class:`~lengthsched.filtering.FilterHistory` whether it kept
    the group (by the group's prompt). slime calls its filter on every group that finishes, kept or not, so
    the history sees the groups slime drops, which a rollout's output does not hold. With
    ``lengthsched_filter_order: true`` the planner hands slime every batch likely-kept first
    (:meth:`SlimePlanner.order_by_filter`)."""
    path = str(getattr(args, "lengthsched_dynamic_sampling_filter_path", None) or DEFAULT_FILTER_PATH)
    if path == f"{__name__}.dynamic_sampling_filter":
        raise InvalidArgument("lengthsched_dynamic_sampling_filter_path", path,
                              "the filter to run (e.g. slime's check_reward_nonzero_std), not this recorder itself")
    if path not in _FILTERS:
        _FILTERS[path] = _load_function(path, "lengthsched_dynamic_sampling_filter_path")
    if any(_stub(x) for x in _flat(samples)):  # online sGPO's unneeded samples: the filter sees the group it made
        samples = [x for x in _flat(samples) if not _stub(x)]
    output = _FILTERS[path](args, samples, **kwargs)
    kept = _filter_kept(output)
    planner_for(args).observe_filter(samples, kept, None if kept else _dropped_side(args, samples))
    sgpo = _SGPO[0] if _SGPO else None
    if sgpo is not None and not kept:
        sgpo.dropped.append(list(samples))
    return output


def _dropped_side(args: Any, samples: Any) -> str | None:
    """Why the filter dropped ``samples`` (:func:`~lengthsched.filtering.dropped_side` of their rewards, a reward at
    or above ``lengthsched_solved_reward``, default :data:`~lengthsched.filtering.SOLVED_REWARD`, solved)."""
    solved = getattr(args, "lengthsched_solved_reward", None)
    solved = SOLVED_REWARD if solved is None else check_solved_reward("lengthsched_solved_reward", solved)
    return dropped_side((_reward_value(args, sample) for sample in _flat(samples)), solved)


class _SelectiveSource:
    """slime's data source with GRESO's skip (:meth:`SlimePlanner.select_groups`): the groups of the prompts it
    skips are drawn and not handed over, and more are drawn in their place (up to :data:`SKIP_DRAWS` x the groups
    asked), so a batch keeps its size. A skipped prompt is spent for this pass over the data, as GRESO's
    dataloader spends it."""

    def __init__(self, source: Any, planner: SlimePlanner):
        self.source, self.planner = source, planner

    def get_samples(self, num_samples: int) -> list[list[Any]]:
        out: list[list[Any]] = []
        drawn = 0
        while len(out) < num_samples and drawn < SKIP_DRAWS * max(1, num_samples):
            groups = list(self.source.get_samples(num_samples - len(out)))
            if not groups:
                break
            drawn += len(groups)
            out += [g for g, on in zip(groups, self.planner.select_groups(groups)) if on]
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)


class _OrderedSource:
    """slime's data source with every batch ordered by the planner's filter history, nothing planned (an
    over-sampled rollout left to slime's router with ``lengthsched_filter_order`` on)."""

    def __init__(self, source: Any, planner: SlimePlanner):
        self.source, self.planner = source, planner

    def get_samples(self, num_samples: int) -> list[list[Any]]:
        return self.planner.order_by_filter(list(self.source.get_samples(num_samples)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)


class PlannedDataSource:
    """slime's data source with every batch of groups planned by ``planner`` on ``replicas`` engines
    (``get_samples``); everything else passes through to ``source``."""

    def __init__(self, source: Any, planner: SlimePlanner, replicas: int):
        self.source, self.planner, self.replicas = source, planner, check_int("replicas", replicas, minimum=1)

    def get_samples(self, num_samples: int) -> list[list[Any]]:
        """The source's next groups, planned; from the second batch of a rollout on (slime's dynamic
        sampling takes more while the first ones run) against what each engine still has in the
        client's queues and in flight (:meth:`ClientQueues.outstanding`)."""
        queues = _QUEUES
        loads = queues.outstanding() if queues is not None and queues.replicas == self.replicas else None
        return self.planner.plan(self.source.get_samples(num_samples), self.replicas, loads=loads)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)


# ----------------------------------------------------------------------------- slime's hooks
_PLANNER: SlimePlanner | None = None
_ENGINES: list[str] = []  # the engines' base URLs of the rollout in progress, in plan index order
_QUEUES: ClientQueues | None = None  # the client's per-engine queues of the rollout in progress (None: no window)
_WAITING: dict[int, asyncio.Future] = {}  # id(sample) -> the future its engine index is set on


def reset() -> None:
    """Forget the planner, the engines and the client's queues (a new run; tests)."""
    global _PLANNER, _QUEUES
    _PLANNER = None
    _QUEUES = None
    _ENGINES.clear()
    _WAITING.clear()
    _USER_FUNCTIONS.clear()
    _FILTERS.clear()
    _SGPO.clear()


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def engine_pool_tokens(info: Any) -> int | None:
    """An SGLang engine's KV pool in tokens from its ``/get_server_info`` (``/server_info``) answer, or None.
    SGLang merges its server arguments and the first scheduler's ``scheduler_info`` at the top level
    (``http_server.py``): ``max_total_num_tokens`` is one data-parallel rank's pool, so with
    ``--dp-size N`` (top-level ``dp_size``) the engine holds N of them and they are counted together
    (the plan treats an engine as one replica). Older answers carry it only per scheduler, under
    ``internal_states``."""
    if not isinstance(info, dict):
        return None
    for where in [info, *(info.get("internal_states") or [])]:  # top level, or per scheduler
        value = _positive_int(where.get("max_total_num_tokens")) if isinstance(where, dict) else None
        if value is not None:
            return value * (_positive_int(info.get("dp_size")) or 1)
    return None


def _pool_tokens(args: Any, engines: Sequence[str]) -> int | None:
    given = getattr(args, "lengthsched_pool_tokens", None)
    if given is not None:
        return check_int("lengthsched_pool_tokens", given, minimum=1)
    if not engines:
        return None
    from slime.utils.async_utils import run
    from slime.utils.http_utils import get

    failed = []
    for endpoint in ("get_server_info", "server_info"):  # newer SGLang: /server_info, the old name deprecated
        try:
            pool = engine_pool_tokens(run(get(f"{engines[0]}/{endpoint}")))
        except Exception as exc:  # an engine without the endpoint, or unreachable: the caller falls back
            failed.append(f"/{endpoint}: {exc}")
            continue
        if pool is not None:
            return pool
        failed.append(f"/{endpoint}: no max_total_num_tokens")
    log.warning("lengthsched: no KV pool size from %s (%s)", engines[0], "; ".join(failed))
    return None


def oversampled(args: Any) -> bool:
    """Whether slime's rollouts end before every group submitted has finished: a dynamic-sampling filter
    (``--dynamic-sampling-filter-path``: each group it drops may make slime submit another
    ``--over-sampling-batch-size`` groups) or ``--over-sampling-batch-size`` above ``--rollout-batch-size``. A
    rollout then ends at its ``rollout_batch_size``-th group that passes, and the plan's defaults change (see
    the module docstring)."""
    if getattr(args, "dynamic_sampling_filter_path", None):
        return True
    over, batch = getattr(args, "over_sampling_batch_size", None), getattr(args, "rollout_batch_size", None)
    return isinstance(over, int) and isinstance(batch, int) and over > batch


def multi_turn(args: Any) -> bool:
    """``lengthsched_multi_turn`` (default false), checked: the generate function posts several requests per sample
    (the turns of an agent loop), and every one of them is left to slime's router (see the module docstring)."""
    return _flag(args, "lengthsched_multi_turn", False)


def _oversampled_mode(args: Any) -> str:
    """``lengthsched_oversampled`` (default ``router``), checked."""
    mode = getattr(args, "lengthsched_oversampled", None) or "router"
    if mode not in OVERSAMPLED_MODES:
        raise InvalidArgument("lengthsched_oversampled", mode, "one of " + ", ".join(OVERSAMPLED_MODES))
    return mode


def planner_for(args: Any, engines: Sequence[str] = ()) -> SlimePlanner:
    """The planner of this run, made on first use from ``args`` (slime's, with the
    ``lengthsched_*`` keys of its ``--custom-config-path`` YAML) and kept across rollouts, so its
    predictor learns from every rollout's lengths. Where the rollouts are over-sampled (:func:`oversampled`) and
    ``lengthsched_oversampled`` is ``plan``, the defaults are whole groups (``groups``) handed over shortest
    predicted first (``shortest``), the window's pool read as for ``ways``; else ``ways`` and ``auto``."""
    global _PLANNER
    if _PLANNER is None:
        over = oversampled(args)
        placement = getattr(args, "lengthsched_placement", None) or ("groups" if over else "ways")
        # the engine is asked for its pool only where a plan needs it: 'ways', or the window of planned
        # over-sampled rollouts (left to slime's router, they plan nothing)
        asked = placement == "ways" or (over and _oversampled_mode(args) == "plan")
        pool = _pool_tokens(args, engines if asked else ())
        if placement == "ways" and pool is None:
            log.warning("lengthsched: each engine's KV pool is unknown (set lengthsched_pool_tokens): "
                        "placing whole groups by predicted work instead of 'ways'")
            placement = "groups"
        max_new = getattr(args, "rollout_max_response_len", None)
        # the order saves work only where a step throws its aborted groups away; with partial rollout they come
        # back with their tokens and the order defers their work instead (docs/benchmarks.md, "Over twenty steps")
        filter_order = _flag(args, "lengthsched_filter_order", not bool(getattr(args, "partial_rollout", False)))
        history, selective = _load_saved(args)
        _PLANNER = SlimePlanner(placement=placement, pool_tokens=pool,
                                submit=getattr(args, "lengthsched_submit", None) or ("shortest" if over else "auto"),
                                max_new_tokens=max_new, default_length=getattr(args, "lengthsched_default_length",
                                                                               None),
                                uninformed=getattr(args, "lengthsched_uninformed", None) or None,
                                filter_order=filter_order, history=history, selective=selective,
                                state_path=getattr(args, "lengthsched_state_path", None),
                                kv_compression=_kv_compression(args))
    return _PLANNER


def _kv_compression(args: Any) -> KVCompression | None:
    """``lengthsched_kv_compression`` (``"BUDGET:INTERVAL"``, the engines' compressed cache), or None."""
    text = getattr(args, "lengthsched_kv_compression", None)
    return KVCompression.of(None if text in (None, "") else str(text), "lengthsched_kv_compression")


def _history_path(args: Any) -> str | None:
    path = getattr(args, "lengthsched_filter_history_path", None)
    if path is not None and (not isinstance(path, str) or not path):
        raise InvalidArgument("lengthsched_filter_history_path", path, "a file path (the filter's history, JSON)")
    return path


def _load_saved(args: Any) -> tuple[FilterHistory | None, SelectiveRollout | None]:
    """What the planner starts from, read once from ``lengthsched_filter_history_path`` (a run resumed from a
    checkpoint keeps what the filter did with each prompt): the filter history, or None (a fresh one) where the key
    is unset or the file is not there yet; and GRESO's skip where ``lengthsched_selective_rollout`` is true (default
    false): the rule saved with the history where there is one, else a fresh
    :class:`~lengthsched.filtering.SelectiveRollout` (seeded by ``lengthsched_selective_seed``, default 0)."""
    selective = _flag(args, "lengthsched_selective_rollout", False)
    history, saved_rule = read_filter_state(_history_path(args), "lengthsched_filter_history_path", selective)
    if not selective:
        return history, None
    if saved_rule is not None:
        return history, saved_rule
    seed = getattr(args, "lengthsched_selective_seed", None)
    return history, SelectiveRollout(seed=0 if seed is None else check_int("lengthsched_selective_seed", seed,
                                                                          minimum=0))


def _after_rollout(args: Any, planner: SlimePlanner) -> None:
    """After a training rollout: GRESO's exploration adapted to what the filter saw in it, and the filter's
    history (with the rule) written to ``lengthsched_filter_history_path`` (atomically), where set."""
    if planner.selective is not None:
        shares = planner.selective.adapt(planner.history)
        if shares is not None:
            log.info("lengthsched: %d groups skipped so far; this rollout's dropped groups all right %.3f, all wrong "
                     "%.3f; p_easy %.2f, p_hard %.2f", planner.skipped, *shares, planner.selective.p_easy,
                     planner.selective.p_hard)
    path = _history_path(args)
    if path is not None and hasattr(planner.history, "to_dict"):
        write_filter_state(path, planner.history, planner.selective)


# ----------------------------------------------------------------------------- online sGPO
#: sample.metadata key: True for a sample online sGPO does not need (its group's size is smaller than slime's
#: ``n_samples_per_prompt``): generated for one token, its loss masked (``remove_sample``), left out of its group's
#: reward normalisation (:func:`reward_post_process`), of the filter's view and of what the planner learns.
STUB_KEY = "lengthsched_sgpo_stub"
#: sample.metadata key: the size online sGPO gave the sample's group (set once; a group partial rollout carries keeps
#: it).
SIZE_KEY = "lengthsched_sgpo_size"
GENERATE_PATH = f"{__name__}.generate"
REWARD_POST_PROCESS_PATH = f"{__name__}.reward_post_process"
FILTER_PATH = f"{__name__}.dynamic_sampling_filter"
#: The online sGPO's rule unless ``lengthsched_sgpo_rule`` names another (as verl's ``lengthsched.sgpo``:
#: :data:`lengthsched.integrations.verl_v1.SGPO_RULE`).
SGPO_RULE = "informative"
#: The ``--custom-config-path`` keys of slime's online sGPO, each ``lengthsched_sgpo_<option>``.
SGPO_OPTIONS = ("g_min", "g_max", "rule", "target", "drop_above", "unsolved_fraction", "seed", "memory",
                "keep_steps", "state_path")
#: slime's estimators whose rewards it normalises per group (``_post_process_rewards``), and those it also divides
#: by the group's standard deviation (with ``--grpo-std-normalization``).
GROUP_NORMALISED = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
STD_NORMALISED = ("grpo", "gspo", "cispo")


def _stub(sample: Any) -> bool:
    """Whether online sGPO marked ``sample`` as one its group does not need (:data:`STUB_KEY`)."""
    return bool((getattr(sample, "metadata", None) or {}).get(STUB_KEY))


class SlimeSGPO:
    """Online sGPO inside slime (:func:`sgpo_for`): an :class:`~lengthsched.sgpo.OnlineBudget` that sizes each fresh
    group slime's data source hands out (:meth:`size`) and learns from the rewards of the groups that finished
    (:meth:`learn`); groups are recorded under step ``rollout_id + 1``."""

    def __init__(self, budget: OnlineBudget, solved_reward: float = SOLVED_REWARD, state_path: str | None = None):
        self.budget, self.solved_reward, self.state_path = budget, solved_reward, state_path
        self.started = False
        self.dropped: list[list[Any]] = []  # groups the dynamic-sampling filter dropped in the rollout in progress

    def start(self, rollout_id: int) -> None:
        """Before a training rollout: the first one of this process forgets the groups recorded for its rollout and
        later ones (a run resumed from a checkpoint generates them again; a fresh run, from rollout 0, forgets another
        run's)."""
        rollout_id = check_int("rollout_id", rollout_id, minimum=0)
        if not self.started:
            self.started = True
            if not self.budget.reaches(rollout_id):
                log.warning("lengthsched sGPO: resumed at rollout %d, further back than the budget keeps (groups up "
                            "to rollout %d were let go; lengthsched_sgpo_keep_steps sets the reach): some prompts are "
                            "sized from fewer of their groups", rollout_id, self.budget.pruned_through - 1)
            gone = self.budget.forget_after(rollout_id)
            if gone:
                log.info("lengthsched sGPO: the first rollout is %d; %d groups recorded for it and later rollouts "
                         "were forgotten (%s)", rollout_id, gone, self.state_path)
        self.dropped.clear()

    def size(self, groups: Sequence[Sequence[Any]]) -> None:
        """Give each fresh group (none of its samples sized or generated yet) its size: the samples beyond it are
        marked :data:`STUB_KEY` and ``remove_sample``."""
        fresh = [list(_flat(g)) for g in groups]
        fresh = [g for g in fresh if g and not any(SIZE_KEY in (x.metadata or {}) or _sample_generated(x) for x in g)]
        if not fresh:
            return
        sizes = self.budget.group_sizes([prompt_key(g[0].prompt) for g in fresh], [len(g) for g in fresh])
        for g, size in zip(fresh, sizes):
            for k, sample in enumerate(g):
                sample.metadata[SIZE_KEY] = int(size)
                if k >= size:
                    sample.metadata[STUB_KEY] = True
                    sample.remove_sample = True
        log.info("lengthsched sGPO: %d groups, %d of %d samples generated (%s)", len(fresh),
                 sum(min(s, len(g)) for s, g in zip(sizes, fresh)), sum(len(g) for g in fresh),
                 ", ".join(f"{n} {reason}" for reason, n in sorted(self.budget.reasons.items())))

    def learn(self, args: Any, groups: Sequence[Sequence[Any]], rollout_id: int) -> int:
        """Record each finished group's rewards (its samples that were generated and finished, each with a finite
        reward; a reward at or above :attr:`solved_reward` solved the prompt) under step ``rollout_id + 1``; save the
        budget where :attr:`state_path` is set. Returns the groups recorded."""
        recorded = 0
        for group in groups:
            samples = [x for x in _flat(group) if _finished(x) and not _stub(x)]
            rewards = [_reward(args, x) for x in samples]
            rewards = [r for r in rewards if r is not None]
            if rewards:
                self.budget.observe_rewards(prompt_key(samples[0].prompt), rewards, self.solved_reward,
                                            step=rollout_id + 1)
                recorded += 1
        if self.state_path is not None:
            write_online_budget(self.state_path, self.budget)
        return recorded


def _reward_value(args: Any, sample: Any) -> Any:
    """A sample's reward as slime reads it: ``sample.get_reward_value(args)`` (its ``reward``, or the
    ``--reward-key`` entry of it), else ``sample.reward``."""
    return sample.get_reward_value(args) if hasattr(sample, "get_reward_value") else getattr(sample, "reward", None)


def _reward(args: Any, sample: Any) -> float | None:
    """:func:`_reward_value` as a float, None where it is not one finite number."""
    value = _reward_value(args, sample)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    return float(value) if np.isfinite(value) else None


_SGPO: list[SlimeSGPO | None] = []  # [the run's online sGPO, or None where it is off], once made


def sgpo_for(args: Any) -> SlimeSGPO | None:
    """The run's online sGPO, made on first use from ``args`` (``lengthsched_sgpo: true`` and the
    ``lengthsched_sgpo_*`` keys of the ``--custom-config-path`` YAML; the module docstring), None where it is off.
    It needs slime's hooks to be this module's (``--custom-generate-function-path``,
    ``--custom-reward-post-process-path``, and ``--dynamic-sampling-filter-path`` where a filter runs): errors name
    the flag otherwise."""
    if _SGPO:
        return _SGPO[0]
    if not _flag(args, "lengthsched_sgpo", False):
        _SGPO.append(None)
        return None
    n = getattr(args, "n_samples_per_prompt", None)
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise InvalidArgument("n_samples_per_prompt", n, "an integer >= 2 (the largest group online sGPO may give; "
                                                         "lengthsched_sgpo masks the samples a group does not need)")
    hooks = (("--custom-generate-function-path", "custom_generate_function_path", GENERATE_PATH,
              "it sends the samples sGPO does not need for one token"),
             ("--custom-reward-post-process-path", "custom_reward_post_process_path", REWARD_POST_PROCESS_PATH,
              "it leaves them out of their group's reward normalisation"))
    for flag, name, path, why in hooks:
        if getattr(args, name, None) != path:
            raise InvalidArgument(flag, getattr(args, name, None), f"{path} with lengthsched_sgpo ({why})")
    for name, why in (("lengthsched_generate_function_path", "an agent's generate may return several samples per "
                                                             "sample, a shape the one-token stubs would not match"),
                      ("group_rm", "a group reward model would score the generated samples against the one-token "
                                   "stubs")):
        if getattr(args, name, None):
            raise InvalidArgument(name, getattr(args, name), f"unset with lengthsched_sgpo ({why})")
    convert = getattr(args, "custom_convert_samples_to_train_data_path", None)
    if convert:
        raise InvalidArgument("--custom-convert-samples-to-train-data-path", convert,
                              "unset with lengthsched_sgpo (slime then skips the reward post-processing and the "
                              "loss masks that leave the unneeded samples out)")
    filter_path = getattr(args, "dynamic_sampling_filter_path", None)
    if filter_path not in (None, FILTER_PATH):
        raise InvalidArgument("--dynamic-sampling-filter-path", filter_path,
                              f"{FILTER_PATH} with lengthsched_sgpo, your filter as lengthsched_dynamic_sampling_"
                              "filter_path (sGPO learns from the groups the filter drops, the all-right and all-wrong "
                              "ones it sizes down)")
    given = {name[len("lengthsched_sgpo_"):] for name in vars(args) if name.startswith("lengthsched_sgpo_")}
    unknown = sorted(given - set(SGPO_OPTIONS))
    if unknown:
        raise InvalidArgument(f"lengthsched_sgpo_{unknown[0]}", getattr(args, f"lengthsched_sgpo_{unknown[0]}"),
                              "a key among " + ", ".join(f"lengthsched_sgpo_{k}" for k in SGPO_OPTIONS)
                              + " (on/off: lengthsched_sgpo; the solved threshold: lengthsched_solved_reward)")
    # a key given as null is its default, but for memory, where null keeps every group (as in verl)
    options = {key: getattr(args, f"lengthsched_sgpo_{key}") for key in given
               if key == "memory" or getattr(args, f"lengthsched_sgpo_{key}") is not None}
    options.setdefault("g_max", n)
    solved = getattr(args, "lengthsched_solved_reward", None)
    solved = SOLVED_REWARD if solved is None else check_solved_reward("lengthsched_solved_reward", solved)
    budget, path = online_budget_from_options(options, lambda key: f"lengthsched_sgpo_{key}", rule=SGPO_RULE,
                                              why_two="a group of one has no spread to normalise its reward by",
                                              save_every=getattr(args, "save_interval", None))
    if budget.config.g_max > n:
        raise InvalidArgument("lengthsched_sgpo_g_max", budget.config.g_max, f"at most n_samples_per_prompt ({n}): "
                                                                             "slime draws that many samples of every "
                                                                             "prompt")
    _SGPO.append(SlimeSGPO(budget, solved, path))
    return _SGPO[0]


class _SizedSource:
    """slime's data source with each fresh group sized by online sGPO (:meth:`SlimeSGPO.size`)."""

    def __init__(self, source: Any, sgpo: SlimeSGPO):
        self.source, self.sgpo = source, sgpo

    def get_samples(self, num_samples: int) -> list[list[Any]]:
        groups = list(self.source.get_samples(num_samples))
        self.sgpo.size(groups)
        return groups

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)


def reward_post_process(args: Any, samples: list) -> tuple[list, list]:
    """slime's ``--custom-reward-post-process-path`` (``lengthsched.integrations.slime.reward_post_process``):
    slime's own reward post-processing (``RolloutManager._post_process_rewards`` at 624b824) done per group of
    ``group_index`` rather than by reshaping the batch: with ``--advantage-estimator`` grpo, gspo, cispo or
    reinforce_plus_plus_baseline and ``--rewards-normalization``, each reward less its group's mean, divided by the
    group's standard deviation (n - 1 in the denominator, as ``torch.std``) plus 1e-6 for grpo, gspo and cispo with
    ``--grpo-std-normalization``; where slime would not normalise, the raw rewards. The samples online sGPO did not
    need (:data:`STUB_KEY`) are left out of their group's mean and spread and get 0 (their loss is masked
    anyway), so a group of g generated samples is normalised as a group of g; a group of one generated sample gets
    0. Samples without a ``group_index`` are grouped by ``n_samples_per_prompt`` in order. Returns (raw rewards,
    rewards), one per sample, as slime's."""
    samples = _flat(samples)
    raw = [_reward_value(args, x) for x in samples]
    estimator = getattr(args, "advantage_estimator", None)
    if not (estimator in GROUP_NORMALISED and getattr(args, "rewards_normalization", False)):
        return raw, list(raw)
    std = estimator in STD_NORMALISED and bool(getattr(args, "grpo_std_normalization", False))
    groups: dict[Any, list[int]] = {}
    if all(getattr(x, "group_index", None) is not None for x in samples):
        for i, x in enumerate(samples):
            groups.setdefault(x.group_index, []).append(i)
    else:
        n = check_int("n_samples_per_prompt", getattr(args, "n_samples_per_prompt", None), minimum=1)
        if len(samples) % n:
            raise InvalidArgument("samples", len(samples), f"a multiple of n_samples_per_prompt ({n}) where the "
                                                           "samples have no group_index")
        groups = {k: list(range(k, k + n)) for k in range(0, len(samples), n)}
    rewards = [0.0] * len(samples)
    for members in groups.values():
        live = [i for i in members if not _stub(samples[i])]
        values = np.asarray([raw[i] for i in live], dtype=np.float64)
        if len(values) < 2:
            continue  # nothing to compare with: 0 (slime's torch.std of one value is NaN)
        centred = values - values.mean()
        if std:
            centred = centred / (values.std(ddof=1) + 1e-6)
        for i, r in zip(live, centred.tolist()):
            rewards[i] = r
    return raw, rewards


def _flag(args: Any, name: str, default: bool) -> bool:
    """A boolean key of the ``--custom-config-path`` YAML (true / false), checked."""
    value = getattr(args, name, None)
    if value is None:
        return default
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidArgument(name, value, "true or false")
    return bool(value)


def _engines(args: Any) -> list[str]:
    """The engines behind slime's router, as slime's ``abort`` lists them, sorted (a fixed index each)."""
    from slime.utils.async_utils import run
    from slime.utils.http_utils import get

    response = run(get(f"http://{engine_host(args.sglang_router_ip)}:{args.sglang_router_port}/workers"))
    return sorted(str(w["url"]).rstrip("/") for w in response["workers"])


def engine_host(host: str) -> str:
    """``host`` as it goes in a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def engine_address(url: str) -> tuple[str, int]:
    """The (host, port) of an engine's base URL, e.g. ``"http://10.0.0.2:30000"`` -> ``("10.0.0.2", 30000)``."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if not parts.hostname or parts.port is None:
        raise InvalidArgument("url", url, "an engine URL with a host and a port, e.g. http://10.0.0.2:30000")
    return parts.hostname, parts.port


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's ``--rollout-function-path``: slime's own ``generate_rollout`` with every training batch
    planned (:class:`PlannedDataSource`), then the planner fed with the rollout's lengths. Evaluation
    runs slime's unchanged. Pair it with ``--custom-generate-function-path
    lengthsched.integrations.slime.generate``, which sends each sample to its planned engine."""
    from slime.rollout import sglang_rollout

    if evaluation:
        return sglang_rollout.generate_rollout(args, rollout_id, data_source, evaluation=True)
    engines = _engines(args)
    if not engines:
        raise InvalidArgument("workers", engines, "at least one engine registered with slime's router")
    planner = planner_for(args, engines)
    sgpo = sgpo_for(args)
    if planner.selective is not None:
        data_source = _SelectiveSource(data_source, planner)
    if sgpo is not None:
        sgpo.start(rollout_id)
        data_source = _SizedSource(data_source, sgpo)
    if (_oversampled_mode(args) == "router" and oversampled(args)) or multi_turn(args):
        # slime's own rollout (its router places every request); the predictor learns
        source = _OrderedSource(data_source, planner) if planner.filter_order else data_source
        output = sglang_rollout.generate_rollout(args, rollout_id, source, evaluation=False)
        _learn(args, planner, sgpo, output, rollout_id)
        return output
    _ENGINES[:] = engines
    global _QUEUES
    _QUEUES = _client_queues(args, planner, len(engines))
    planned = PlannedDataSource(data_source, planner, len(engines))
    try:
        output = sglang_rollout.generate_rollout(args, rollout_id, planned, evaluation=False)
    finally:
        _ENGINES.clear()
        _QUEUES = None
        _WAITING.clear()
    _learn(args, planner, sgpo, output, rollout_id)
    return output


def _learn(args: Any, planner: SlimePlanner, sgpo: SlimeSGPO | None, output: Any, rollout_id: int) -> None:
    """After a training rollout: the planner learns its lengths (and the filter's history is saved), online sGPO
    the rewards of its groups, those slime kept and those the filter dropped."""
    samples = getattr(output, "samples", output)
    planner.observe(samples)
    _after_rollout(args, planner)
    if sgpo is not None:
        kept = {id(x) for g in samples for x in _flat(g)}  # a group the filter dropped and slime kept (its
        # keep_when_insufficient) is learnt once
        sgpo.learn(args, [*samples, *(g for g in sgpo.dropped if not any(id(x) in kept for x in g))], rollout_id)
        sgpo.dropped.clear()


def _client_queues(args: Any, planner: SlimePlanner, engines: int) -> ClientQueues | None:
    """The client's queues of one rollout: a window of ``lengthsched_window`` (default :data:`WINDOW`) KV
    pools per engine, steals unless ``lengthsched_steal`` is false; None (every sample sent at once) when
    the window is 0, the pool is unknown or there is one engine (nothing to steal from: in the simulator
    the window alone held samples back there, up to 5.7% slower than slime in 26 of 120 settings)."""
    share = getattr(args, "lengthsched_window", None)
    share = WINDOW if share is None else float(share)
    if share < 0:
        raise InvalidArgument("lengthsched_window", share, "a number of KV pools >= 0 (0: no window)")
    pool = planner.planner.pool_tokens
    if share == 0 or pool is None or engines < 2:
        return None
    return ClientQueues(engines, share * pool, steals=_flag(args, "lengthsched_steal", True))


def _pump() -> None:
    """Send what the windows allow: each waiting sample's future gets its engine's index."""
    if _QUEUES is None:
        return
    for key, engine in _QUEUES.send():
        future = _WAITING.pop(key, None)
        if future is not None and not future.done():
            future.set_result(engine)


async def _engine_for(args: Any, sample: Any, replica: int) -> int | None:
    """Queue ``sample`` for its planned engine and wait until a window sends it somewhere (its engine,
    or another whose queue ran empty); None if slime aborts the rollout meanwhile (the sample was never
    sent)."""
    from slime.rollout import sglang_rollout

    key, need, work = id(sample), sample.metadata.get(NEED_KEY, 0), sample.metadata.get(WORK_KEY, 0)
    future = asyncio.get_running_loop().create_future()
    _WAITING[key] = future
    _QUEUES.enter(key, replica, need, work)
    _pump()
    try:
        while not future.done():
            await asyncio.wait({future}, timeout=_WAKE_SECONDS)
            if not future.done() and sglang_rollout.GenerateState(args).aborted:
                _QUEUES.drop(key)
                _WAITING.pop(key, None)
                return None
        return future.result()
    except asyncio.CancelledError:
        if _QUEUES is not None and not _QUEUES.drop(key) and future.done():
            _QUEUES.finished(future.result(), need)  # sent but never run: free its window
        _WAITING.pop(key, None)
        raise


_USER_FUNCTIONS: dict[str, tuple[Any, bool]] = {}  # path -> (function, whether it takes evaluation=)


def _user_generate(args: Any) -> tuple[Any, bool] | None:
    """The generate function named by ``args.lengthsched_generate_function_path`` and whether its signature
    takes ``evaluation`` (loaded and read once), else None."""
    path = getattr(args, "lengthsched_generate_function_path", None)
    if not path:
        return None
    if path not in _USER_FUNCTIONS:
        function = _load_function(str(path), "lengthsched_generate_function_path")
        _USER_FUNCTIONS[path] = (function, "evaluation" in inspect.signature(function).parameters)
    return _USER_FUNCTIONS[path]


def _load_function(path: str, argument: str) -> Any:
    """The function ``path`` (``package.module.function``) names, for the YAML key ``argument``: an error naming
    it where the path does not import or names something that cannot be called."""
    function = load_object(path, argument, "'package.module.function'")
    if not callable(function):
        raise InvalidArgument(argument, path, "an importable 'package.module.function' (a callable)")
    return function


async def _generate(args: Any, sample: Any, sampling_params: dict, evaluation: bool) -> Any:
    """The user's generate function (``lengthsched_generate_function_path``, with ``evaluation=`` where its
    signature takes it, as slime's ``generate_and_rm`` calls one) or slime's ``generate``."""
    user = _user_generate(args)
    if user is None:
        from slime.rollout import sglang_rollout

        return await sglang_rollout.generate(args, sample, sampling_params)
    function, takes_evaluation = user
    if takes_evaluation:
        return await function(args, sample, sampling_params, evaluation=evaluation)
    return await function(args, sample, sampling_params)


async def generate(args: Any, sample: Any, sampling_params: dict, evaluation: bool = False) -> Any:
    """slime's ``--custom-generate-function-path``: slime's ``generate`` (or yours, named by
    ``lengthsched_generate_function_path``) for ``sample``, sent to the engine its plan named
    (``sample.metadata[REPLICA_KEY]``) instead of the router; a sample without a plan (evaluation, or a
    rollout function other than :func:`generate_rollout`) goes through the router."""
    if _stub(sample) and not evaluation:  # online sGPO does not need it: one token, a reward of 0, its loss masked
        sampling_params = {**sampling_params, "max_new_tokens": 1}
        if getattr(sample, "reward", None) is None:
            key = getattr(args, "reward_key", None)
            sample.reward = {key: 0.0} if key else 0.0
    replica = (getattr(sample, "metadata", None) or {}).get(REPLICA_KEY)
    if evaluation or replica is None or not _ENGINES:
        return await _generate(args, sample, sampling_params, evaluation)
    replica = int(replica) % len(_ENGINES)
    queues = _QUEUES
    if queues is not None:
        engine = await _engine_for(args, sample, replica)
        if engine is None:  # slime aborted the rollout while the sample waited in the client
            sample.status = type(sample.status).ABORTED
            return sample
        replica = engine
    try:
        host, port = engine_address(_ENGINES[replica])
        direct = copy.copy(args)  # slime's generate posts to http://{sglang_router_ip}:{sglang_router_port}/generate
        direct.sglang_router_ip, direct.sglang_router_port = engine_host(host), port
        return await _generate(direct, sample, sampling_params, evaluation)
    finally:
        if queues is not None and queues is _QUEUES:
            queues.finished(replica, sample.metadata.get(NEED_KEY, 0))
            _pump()
