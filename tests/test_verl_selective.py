"""lengthsched.integrations.verl_selective: GRESO's skip inside verl's own dynamic sampling (the v1 trainer's DAPO
group filter).

Two layers. :class:`PromptSelector` and the replay-buffer class over a fake of verl 0.9.1's sync ``ReplayBuffer``
(its constructor's keywords, ``_dapo_classification_cache``, ``_dapo_filtered_keys`` and a ``sample`` that evicts
dropped groups and refills twice as many, as ``replay_buffer.py`` does); and, where verl's v1 trainer imports (CI's
verl stage, with TransferQueue), verl's real path: ``PPOTrainer._build_replay_buffer`` loading the buffer by name,
the trainer's ``_add_batch_to_generate`` / ``_fetch_one_gen_batch`` / ``_submit_batch_to_rollout`` and the real
``ReplayBuffer.sample`` loop, TransferQueue faked in memory and generation faked by a manager that finishes every
group at once. The world: prompts that are always solved, never solved, or always split (kept by the filter).
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import json
import uuid
from collections import defaultdict

import numpy as np
import pytest

from lengthsched import InvalidArgument
from lengthsched.filtering import SelectiveRollout, dropped_side, read_filter_state
from lengthsched.integrations import verl as lv
from lengthsched.integrations import verl_selective as vsel
from lengthsched.integrations.verl import prompt_key

N = 4  # completions per prompt


def _v1_importable() -> bool:
    try:
        importlib.import_module("verl.trainer.ppo.v1.replay_buffer")
        importlib.import_module("verl.trainer.ppo.v1.trainer_sync")
    except Exception:  # noqa: BLE001 - verl or TransferQueue absent
        return False
    return True


V1 = _v1_importable()
requires_v1 = pytest.mark.skipif(not V1, reason="verl 0.9.1's v1 trainer is not importable "
                                                "(pip install 'lengthsched[verl]', with TransferQueue)")


def world(mixed: int = 6, easy: int = 9, hard: int = 9) -> list[tuple[list[dict], str]]:
    """Chat prompts and what the policy does with each: ``mixed`` ones are always half solved (the filter keeps
    them), ``easy`` ones always solved, ``hard`` ones never (the filter drops both)."""
    kinds = ["mixed"] * mixed + ["easy"] * easy + ["hard"] * hard
    order = np.random.default_rng(5).permutation(len(kinds))
    return [([{"role": "user", "content": f"{kinds[i]} problem {i}"}], kinds[i]) for i in order]


def rewards(kind: str) -> list[float]:
    return {"mixed": [1.0, 0.0] * (N // 2), "easy": [1.0] * N, "hard": [0.0] * N}[kind]


class _Kinds:
    """The kind of a prompt, by its key (the kind is the first word of its text)."""

    def __getitem__(self, key: str) -> str:
        return json.loads(key)[0]["content"].split()[0]


KIND = _Kinds()


# ----------------------------------------------------------------------------- the selector
def test_a_prompt_dropped_on_one_side_is_skipped_and_one_never_dropped_runs():
    selector = vsel.PromptSelector(SelectiveRollout(p_easy=0.05, p_hard=0.05, min_p=0.05, seed=1), skip=True)
    for _ in range(4):
        selector.history.observe("solved", False, "easy")
        selector.history.observe("unsolved", False, "hard")
    selector.history.observe("split", True)
    source = itertools.cycle(["solved", "unsolved", "split"])
    handed = [selector.draw(lambda: {"uid": [str(uuid.uuid4())], "raw_prompt": [next(source)]}, vsel.fetch_ids)
              for _ in range(30)]
    prompts = [h["raw_prompt"][0] for h in handed]
    # streaks of 4 at p = 0.05: skipped with probability 0.99 (GRESO's floor), so nearly every fetch handed over
    # is the split prompt, and every draw of the others counted as skipped
    assert prompts.count("split") >= 28
    assert selector.handed == 30 and selector.forced == 0
    assert selector.skipped == 60 - (30 - prompts.count("split"))


def test_after_max_draws_skipped_fetches_the_last_is_handed_over_and_counted_forced():
    selector = vsel.PromptSelector(SelectiveRollout(p_easy=0.05, min_p=0.05), max_draws=3, skip=True)
    for _ in range(4):
        selector.history.observe("solved", False, "easy")
    selector.rule.FLOOR = 0.0  # this test's rule skips a streak surely
    fetches = []

    def fetch():
        fetches.append(str(uuid.uuid4()))
        return {"uid": [fetches[-1]], "raw_prompt": ["solved"]}

    batch = selector.draw(fetch, vsel.fetch_ids)
    assert len(fetches) == 3 and batch["uid"] == [fetches[-1]]
    assert (selector.skipped, selector.forced, selector.handed) == (2, 1, 1)


def test_observe_records_kept_all_right_and_all_wrong_groups_once_by_uid():
    selector = vsel.PromptSelector(solved_reward=1.0)
    for uid, key in (("u1", "a"), ("u2", "b"), ("u3", "c"), ("u4", "d")):
        selector.draw(lambda uid=uid, key=key: {"uid": [uid], "raw_prompt": [key]}, vsel.fetch_ids)
    assert selector.observe("u1", None) and selector.observe("u2", 1.0) and selector.observe("u3", 0.0)
    assert selector.observe("u4", 0.99)  # below solved_reward: all wrong
    assert not selector.observe("u1", None)  # once
    assert not selector.observe("never handed over", 1.0)  # e.g. a group verl re-issued after a resume
    easy, hard = selector.history.streaks(["a", "b", "c", "d"])
    assert easy.tolist() == [0, 1, 0, 0] and hard.tolist() == [0, 0, 1, 1]
    assert (selector.history.groups, selector.history.kept, selector.observed) == (4, 1, 4)


def test_end_step_adapts_the_rule_saves_the_history_and_reports_the_step(tmp_path):
    path = str(tmp_path / "filter.json")
    selector = vsel.PromptSelector.from_options({"history_path": path, "p_easy": 0.5, "p_hard": 0.5, "seed": 4})
    for i in range(10):
        selector.draw(lambda i=i: {"uid": [f"u{i}"], "raw_prompt": [f"p{i}"]}, vsel.fetch_ids)
        selector.observe(f"u{i}", 1.0 if i < 5 else None)  # half all right, none all wrong
    metrics = selector.end_step()
    # all-right share 0.5 >= 0.25 / 3: explore less; all-wrong share 0 < 0.5 / 3: explore more
    assert metrics["lengthsched/selective/p_easy"] == pytest.approx(0.49)
    assert metrics["lengthsched/selective/p_hard"] == pytest.approx(0.51)
    assert metrics["lengthsched/selective/easy_share"] == 0.5 and metrics["lengthsched/selective/hard_share"] == 0
    assert metrics["lengthsched/selective/handed"] == 10 and metrics["lengthsched/selective/prompts_known"] == 10
    assert not any("share" in k for k in selector.end_step())  # nothing observed since: no shares, no adaptation
    # a resumed run starts from the saved history and the adapted rule (the rule's settings given then are moot)
    resumed = vsel.PromptSelector.from_options({"history_path": path, "p_easy": 0.9})
    assert resumed.rule.p_easy == pytest.approx(0.49) and resumed.history.to_dict() == selector.history.to_dict()
    assert json.loads((tmp_path / "filter.json").read_text())["selective"]["seed"] == 4


def test_bad_settings_name_the_setting_the_value_and_what_was_expected(tmp_path):
    cases = [({"p_esy": 0.5}, "sampler_kwargs.p_esy"), ({"p_easy": 2}, "sampler_kwargs.p_easy"),
             ({"max_draws": 0}, "sampler_kwargs.max_draws"), ({"solved_reward": "yes"}, "sampler_kwargs.solved_reward"),
             ({"history_path": ""}, "sampler_kwargs.history_path"), (["p_easy"], "sampler_kwargs")]
    for options, name in cases:
        with pytest.raises(InvalidArgument, match=name.replace(".", r"\.")):
            vsel.PromptSelector.from_options(options)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InvalidArgument, match=r"sampler_kwargs\.history_path.*JSON"):
        vsel.PromptSelector.from_options({"history_path": str(tmp_path / "bad.json")})
    with pytest.raises(InvalidArgument, match="raw_prompt"):
        vsel.fetch_ids({"uid": ["u"]})
    with pytest.raises(InvalidArgument, match="ids"):
        vsel.PromptSelector().draw(lambda: None, lambda _: (["u1", "u2"], ["k"]))


def test_the_shared_side_rule_and_state_file():
    assert dropped_side([1.0, 1.0]) == "easy" and dropped_side([0, -1]) == "hard"
    assert dropped_side([1.0, 0.0]) is None and dropped_side([]) is None and dropped_side([True]) is None
    assert dropped_side([0.7], solved=0.8) == "hard"
    assert read_filter_state(None, "x", selective=True) == (None, None)


# ----------------------------------------------------------------------------- over a fake of verl's buffer
class FakeReplayBuffer:
    """verl 0.9.1's sync ``ReplayBuffer`` (replay_buffer.py) reduced to what the skip touches: its constructor,
    ``_dapo_classification_cache``, ``_dapo_filtered_keys`` (every finished group classified once: the shared
    reward, or None) and ``sample`` (evict the dropped, refill twice as many, until ``batch_size`` are kept)."""

    def __init__(self, trainer_mode, trainer_config, max_off_policy_threshold, max_off_policy_strategy, sampler_kwargs,
                 poll_interval=2.0, refill_fn=None, filter_groups_metric=None, train_batch_size=None,
                 gen_batch_size=None, max_inflight_gen_batches=1, sync_refill_failed_groups=False):
        self.kwargs = dict(trainer_mode=trainer_mode, filter_groups_metric=filter_groups_metric,
                           train_batch_size=train_batch_size, gen_batch_size=gen_batch_size,
                           max_inflight_gen_batches=max_inflight_gen_batches,
                           sync_refill_failed_groups=sync_refill_failed_groups, sampler_kwargs=sampler_kwargs)
        self.refill_fn, self.filter_groups_metric = refill_fn, filter_groups_metric
        self.finished: dict[str, list[float]] = {}  # uid -> its trajectories' rewards
        self._dapo_classification_cache: dict[str, dict] = defaultdict(dict)
        # the status sets of verl's snapshot: here every group finishes when submitted, none is pending or running
        self.pending_keys, self.running_keys, self.failure_keys = defaultdict(set), defaultdict(set), defaultdict(set)

    @property
    def finished_keys(self) -> dict[str, set]:
        return {"train": set(self.finished)}

    def _dapo_filtered_keys(self, partition_id):
        cache = self._dapo_classification_cache[partition_id]
        for uid in self.finished.keys() - cache.keys():
            values = self.finished[uid]
            cache[uid] = float(values[0]) if len(values) > 1 and float(np.std(values)) == 0.0 else None
        return {uid for uid, value in cache.items() if value is not None}

    def sample(self, global_steps, partition_id, batch_size):
        while True:
            dropped = self._dapo_filtered_keys(partition_id)
            for uid in dropped:
                del self.finished[uid], self._dapo_classification_cache[partition_id][uid]
            if len(self.finished) >= batch_size:
                batch = sorted(self.finished)[:batch_size]
                self.finished.clear()
                self._dapo_classification_cache[partition_id].clear()
                return batch, {"training/filter_groups/evicted_samples": len(dropped)}
            self.refill_fn(max(2 * len(dropped), 1))


class FakeTrainer:
    """verl's v1 PPOTrainer reduced to the skip's contract: ``config``, ``_resolve_filter_groups_metric`` (as
    verl's), ``_fetch_one_gen_batch`` (one prompt, a fresh uid) and ``_add_prompts_to_generate`` (the refill_fn:
    here every group is generated at once, its rewards by the prompt's kind)."""

    def __init__(self, prompts, buffer_factory, sampler_kwargs=None, filter_enabled=True):
        self.config = {"trainer": {"v1": {"trainer_mode": "sync", "sampler": {"sync_refill_failed_groups": False}}},
                       "algorithm": {"filter_groups": {"enable": filter_enabled, "metric": "acc",
                                                       "max_inflight_gen_batches": 1}},
                       "data": {"train_batch_size": 3, "gen_batch_size": 1}}
        self.config = _AttrDict(self.config)
        self.data = itertools.cycle(prompts)
        self.generated: list[str] = []
        self.key_of: dict[str, str] = {}  # uid -> prompt key
        self.replay_buffer = buffer_factory(
            trainer_mode="sync", trainer_config={}, max_off_policy_threshold=8, max_off_policy_strategy="drop",
            sampler_kwargs=sampler_kwargs or {}, refill_fn=self._add_prompts_to_generate)

    def _resolve_filter_groups_metric(self):
        groups = self.config.algorithm.filter_groups
        return str(groups.metric) if groups.enable else None

    def _fetch_one_gen_batch(self):
        prompt, _kind = next(self.data)
        return {"uid": [str(uuid.uuid4())], "raw_prompt": [prompt]}

    def _add_prompts_to_generate(self, num_prompts):
        for _ in range(num_prompts):
            batch = self._fetch_one_gen_batch()
            key = prompt_key(batch["raw_prompt"][0])
            self.generated.append(key)
            self.key_of[batch["uid"][0]] = key
            self.replay_buffer.finished[batch["uid"][0]] = rewards(KIND[key])
        return num_prompts


class _AttrDict(dict):
    """A config node read as verl reads its DictConfig: ``node.key`` and ``node.get(key, default)``."""

    def __init__(self, data):
        super().__init__({k: _AttrDict(v) if isinstance(v, dict) else v for k, v in data.items()})

    __getattr__ = dict.__getitem__


def run_steps(trainer, steps: int, batch: int = 3) -> list[list[str]]:
    """``steps`` training steps as verl's sync trainer runs them: submit a batch, then sample until it is kept."""
    trained = []
    for step in range(1, steps + 1):
        trainer._add_prompts_to_generate(batch)
        uids, _metrics = trainer.replay_buffer.sample(step, "train", batch)
        trained.append(uids)
    return trained


def test_the_fakes_have_verls_signatures():
    if not V1:
        pytest.skip("verl's v1 trainer is not importable")
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
    for name in ("__init__", "sample", "_dapo_filtered_keys"):
        ours, verls = (inspect.signature(getattr(cls, name)).parameters.values() for cls in (FakeReplayBuffer,
                                                                                            ReplayBuffer))
        assert [(p.name, p.default) for p in ours] == [(p.name, p.default) for p in verls], name


def test_the_buffer_gets_the_filter_settings_verl_gives_its_own_and_the_skip_cuts_the_groups_generated():
    selective_cls = vsel.make_selective_replay_buffer_class(FakeReplayBuffer, sync=True)
    prompts = world()
    plain = FakeTrainer(prompts, lambda **kw: FakeReplayBuffer(
        **kw, **vsel.builtin_buffer_kwargs(FakeTrainer(prompts, lambda **_: None), sync=True)))
    skipping = FakeTrainer(prompts, selective_cls, {"skip": True, "seed": 2, "refill": "verl"})  # the skip alone
    buffer = skipping.replay_buffer
    assert isinstance(buffer, FakeReplayBuffer) and buffer.kwargs == {
        "trainer_mode": "sync", "filter_groups_metric": "acc", "train_batch_size": 3, "gen_batch_size": 1,
        "max_inflight_gen_batches": 1, "sync_refill_failed_groups": False,
        "sampler_kwargs": {"skip": True, "seed": 2, "refill": "verl"}}
    steps = 24  # 24 prompts, 6 of them kept: 12 passes over the data, the streaks long enough to skip on
    trained_plain, trained_skipping = run_steps(plain, steps), run_steps(skipping, steps)
    selector = buffer.lengthsched_selector
    # the filter works as before: every trained group is one it keeps
    for trainer, trained in ((plain, trained_plain), (skipping, trained_skipping)):
        assert all(len(uids) == 3 for uids in trained)
        assert {KIND[trainer.key_of[uid]] for uids in trained for uid in uids} == {"mixed"}
    # every group generated was observed once (the last step's kept groups included), by its prompt
    assert selector.observed == len(skipping.generated) == selector.handed
    assert selector.history.groups == selector.observed and len(selector.history) == 24
    # fewer groups generated for the same steps: the always-solved and never-solved prompts get skipped
    assert selector.skipped > 0
    assert len(skipping.generated) < 0.8 * len(plain.generated)
    dropped_plain = sum(KIND[k] != "mixed" for k in plain.generated) / len(plain.generated)
    dropped_skipping = sum(KIND[k] != "mixed" for k in skipping.generated) / len(skipping.generated)
    assert dropped_skipping < dropped_plain


def test_the_refill_by_need_submits_fewer_than_verls_two_per_drop_and_skips_nothing():
    selective_cls = vsel.make_selective_replay_buffer_class(FakeReplayBuffer, sync=True)
    prompts = world()
    runs = {refill: FakeTrainer(prompts, selective_cls, {"skip": False, "refill": refill}) for refill in vsel.REFILLS}
    trained = {refill: run_steps(trainer, 12) for refill, trainer in runs.items()}
    for refill, trainer in runs.items():
        selector = trainer.replay_buffer.lengthsched_selector
        assert selector.skipped == 0 and selector.handed == len(trainer.generated)  # every prompt drawn runs
        assert {KIND[trainer.key_of[uid]] for uids in trained[refill] for uid in uids} == {"mixed"}
        assert (selector.withheld > 0) == (refill == "need")
    assert len(runs["need"].generated) < len(runs["verl"].generated)


def test_the_refill_asks_verl_for_what_is_missing_at_the_historys_pass_share():
    selector = vsel.PromptSelector()
    assert selector.refill_count(10, 3, 0) == 6  # nothing seen: share 1/2, twice what is missing
    selector.history.observe_many(["a"] * 8, [True] * 8)  # share 0.9
    assert selector.refill_count(10, 3, 0) == 4 and selector.refill_count(10, 3, 4) == 0
    assert selector.refill_count(2, 30, 0) == 2  # never more than verl asked
    assert selector.withheld == (10 - 6) + (10 - 4) + 10
    verl = vsel.PromptSelector(refill="verl")
    assert verl.refill_count(10, 3, 0) == 10 and verl.withheld == 0
    with pytest.raises(InvalidArgument, match="refill"):
        vsel.PromptSelector(refill="half")
    with pytest.raises(InvalidArgument, match=r"sampler_kwargs\.skip"):
        vsel.PromptSelector.from_options({"skip": "no"})


def test_each_training_sample_reports_the_step_and_validation_does_not():
    trainer = FakeTrainer(world(), vsel.make_selective_replay_buffer_class(FakeReplayBuffer, sync=True))
    trainer._add_prompts_to_generate(3)
    _, metrics = trainer.replay_buffer.sample(1, "train", 3)
    assert metrics["training/filter_groups/evicted_samples"] >= 0  # verl's own metrics kept
    assert metrics["lengthsched/selective/handed"] >= 3 and "lengthsched/selective/p_easy" in metrics
    assert "lengthsched/selective/withheld" in metrics
    before = trainer.replay_buffer.lengthsched_selector.rule.p_easy
    trainer._add_prompts_to_generate(3)
    _, metrics = trainer.replay_buffer.sample(1, "val", 3)
    assert not any(k.startswith("lengthsched/") for k in metrics)
    assert trainer.replay_buffer.lengthsched_selector.rule.p_easy == before


def test_without_verls_filter_the_buffer_refuses_to_start():
    with pytest.raises(InvalidArgument, match=r"algorithm\.filter_groups\.enable"):
        FakeTrainer(world(), vsel.make_selective_replay_buffer_class(FakeReplayBuffer, sync=True),
                    filter_enabled=False)


def test_the_classes_need_verl_and_the_module_imports_without_it():
    assert "verl" not in vsel.__dict__ and hasattr(vsel, "selective_replay_buffer")
    with pytest.raises(AttributeError):
        vsel.NotAThing  # noqa: B018
    if not V1:
        with pytest.raises(ImportError, match="lengthsched\\[verl\\]"):
            vsel.SelectiveReplayBuffer  # noqa: B018


# ----------------------------------------------------------------------------- verl's real v1 trainer and buffer
class MemoryTQ:
    """TransferQueue's client functions that verl's v1 trainer and replay buffer call (``kv_list``,
    ``kv_batch_put``, ``kv_batch_get``, ``kv_clear``), in memory: tags per key and partition, values per key."""

    def __init__(self):
        self.tags: dict[str, dict[str, dict]] = defaultdict(dict)
        self.values: dict[str, dict[str, dict]] = defaultdict(dict)
        self.on_poll = None  # called before every listing of all partitions (the replay buffer's poll)

    def kv_list(self, partition_id=None):
        if partition_id is None and self.on_poll is not None:
            self.on_poll()
        if partition_id is not None:
            return {partition_id: dict(self.tags.get(partition_id, {}))}
        return {p: dict(items) for p, items in self.tags.items()}

    def kv_batch_put(self, keys, partition_id, tags=None, fields=None):
        for i, key in enumerate(keys):
            self.tags[partition_id][key] = dict(tags[i]) if tags is not None else {}
            if fields is not None:
                self.values[partition_id][key] = fields[i] if not isinstance(fields, dict) else {
                    f: v[i] for f, v in fields.items()}

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        rows = [self.values[partition_id][key] for key in keys]
        names = select_fields or (list(rows[0]) if rows else [])
        return {name: [row[name] for row in rows] for name in names}

    def kv_clear(self, partition_id, keys):
        for key in keys:
            self.tags[partition_id].pop(key, None)
            self.values[partition_id].pop(key, None)


class PollingAgentLoopManager:
    """Generation that finishes each submitted group one to three of the replay buffer's polls later (in turn), its
    prompt running until then; finished, its ``N`` trajectories are in the queue (``{uid}_{session}_0``, reward
    ``rm_scores`` by the prompt's kind) and the prompt is marked finished. So verl's loop sees groups in flight when
    it refills, and drains them."""

    def __init__(self, tq):
        self.tq, self.generated, self.running = tq, [], []  # running: [polls left, uid, key]
        self.key_of: dict[str, str] = {}
        self.fail_every, self.done = 0, 0  # every fail_every-th group to finish fails (0: none)
        tq.on_poll = self.poll

    def generate_sequences(self, batch):
        for uid, prompt in zip(list(batch["uid"]), list(batch["raw_prompt"])):
            key = prompt_key(prompt)
            self.generated.append(key)
            self.key_of[uid] = key
            self.tq.tags["train"][uid] = {**self.tq.tags["train"][uid], "status": "running"}
            self.running.append([1 + len(self.generated) % 3, uid, key])

    def poll(self):
        import torch
        for item in self.running:
            item[0] -= 1
        for _, uid, key in [item for item in self.running if item[0] <= 0]:
            tags = self.tq.tags["train"]
            self.done += 1
            if self.fail_every and self.done % self.fail_every == 0:
                tags[uid] = {**tags[uid], "status": "failure"}  # no trajectory: verl keeps it sampleable
                continue
            for session, reward in enumerate(rewards(KIND[key])):
                tags[f"{uid}_{session}_0"] = {"status": "finished"}
                self.tq.values["train"][f"{uid}_{session}_0"] = {"rm_scores": torch.tensor([0.0, reward])}
            tags[uid] = {**tags[uid], "status": "finished"}
        self.running = [item for item in self.running if item[0] > 0]


class Dataloader:
    """What the trainer iterates: one prompt per fetch (verl forces ``gen_batch_size`` 1 under the filter) as
    verl's ``collate_fn`` gives it, the same order every pass."""

    def __init__(self, prompts):
        self.prompts = prompts

    def __iter__(self):
        import torch
        for prompt, _kind in self.prompts:
            yield {"input_ids": torch.zeros(1, 2, dtype=torch.long),
                   "raw_prompt": np.array([np.array(prompt, dtype=object)], dtype=object)}


def real_trainer(monkeypatch, tq, custom: bool, prompts, sampler_kwargs=None, inflight: int = 1):
    """verl's real ``PPOTrainerSync`` without its workers: the config its replay buffer and prompt path read
    (``inflight``: ``max_inflight_gen_batches``), ``_build_replay_buffer`` run as verl runs it (loading ours by name
    where ``custom``)."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1 import replay_buffer, trainer_base
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    monkeypatch.setattr(replay_buffer, "tq", tq)
    monkeypatch.setattr(trainer_base, "tq", tq)
    sampler = {"max_off_policy_threshold": 8, "max_off_policy_strategy": "drop", "sync_refill_failed_groups": False,
               "custom_sampler": dict(lv.SELECTIVE_SAMPLER) if custom else {"path": None, "name": None},
               "sampler_kwargs": sampler_kwargs or {}}
    config = OmegaConf.create({
        "trainer": {"v1": {"trainer_mode": "sync", "sync": {}, "sampler": sampler}},
        "algorithm": {"filter_groups": {"enable": True, "metric": "reward", "max_num_gen_batches": 0,
                                        "max_inflight_gen_batches": inflight}},
        "reward": {"reward_model": {"enable": False, "enable_resource_pool": False}},
        "data": {"train_batch_size": 3, "gen_batch_size": 1}})
    trainer = object.__new__(PPOTrainerSync)
    trainer.config, trainer.trainer_mode, trainer.global_steps = config, "sync", 1
    trainer.train_dataloader, trainer.train_dataloader_it = Dataloader(prompts), None
    trainer.agent_loop_manager = PollingAgentLoopManager(tq)
    trainer.replay_buffer = trainer._build_replay_buffer()
    trainer.replay_buffer.poll_interval = 0.0
    return trainer


def run_real(trainer, steps: int) -> list[list[str]]:
    """verl's sync step, its rollout half: ``prepare_step`` (a batch submitted), then ``replay_buffer.sample``."""
    trained = []
    for step in range(1, steps + 1):
        trainer.global_steps = step
        trainer.prepare_step()
        batch, metrics = trainer.replay_buffer.sample(global_steps=step, partition_id="train", batch_size=3)
        trained.append(sorted({key.split("_")[0] for key in batch.keys}))
        trainer.last_metrics = metrics
    return trained


@requires_v1
def test_verls_real_trainer_loads_the_buffer_by_name_and_its_filter_runs_as_before(monkeypatch):
    """verl's real trainer path and sync buffer: plain verl, lengthsched's default (its refill alone: the same
    data), and the refill with GRESO's skip; every step trains three groups the filter keeps, each run draws fewer."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
    prompts = world(mixed=12, easy=6, hard=6)  # half kept: verl's two per drop asks for more than the batch needs
    trainers, trained = {}, {}
    runs = (("verl", False, None), ("refill", True, {}), ("both", True, {"skip": True, "seed": 2}))
    for name, custom, options in runs:
        # each run on its own queue (real_trainer points verl's modules at it), built and run before the next
        trainers[name] = real_trainer(monkeypatch, MemoryTQ(), custom, prompts, options, inflight=4)
        trained[name] = run_real(trainers[name], 24)
    generated = {name: trainer.agent_loop_manager.generated for name, trainer in trainers.items()}
    for name, trainer in trainers.items():
        assert all(len(t) == 3 for t in trained[name])
        assert {KIND[trainer.agent_loop_manager.key_of[uid]] for t in trained[name] for uid in t} == {"mixed"}
    buffer = trainers["both"].replay_buffer
    assert type(buffer).__name__ == "SelectiveReplayBuffer" and isinstance(buffer, ReplayBuffer)
    # the settings verl gives its own buffer, read from the trainer
    assert (buffer.filter_groups_metric, buffer.train_batch_size, buffer.gen_batch_size,
            buffer.max_inflight_gen_batches) == ("reward", 3, 1, 4)
    refill, both = (trainers[name].replay_buffer.lengthsched_selector for name in ("refill", "both"))
    assert refill.skipped == 0 and refill.withheld > 0 and refill.handed == len(generated["refill"])
    assert both.skipped > 0 and both.handed == len(generated["both"])
    assert both.observed == both.history.groups > 0 and len(both.history) == len(prompts)
    assert {"easy", "hard"} <= {side for outcomes in both.history.to_dict()["outcomes"].values()
                                for side in outcomes}
    assert len(generated["both"]) < len(generated["refill"]) < len(generated["verl"])
    assert len(generated["both"]) < 0.8 * len(generated["verl"])
    assert "lengthsched/selective/withheld" in trainers["both"].last_metrics


@requires_v1
def test_groups_that_fail_or_are_trained_unclassified_are_forgotten(monkeypatch):
    """A group that fails (no trajectory: verl's sync buffer keeps it sampleable and may train it) never gets a
    verdict; the buffer forgets its uid when verl clears or trains it, so after every step nothing is left."""
    trainer = real_trainer(monkeypatch, MemoryTQ(), True, world(mixed=12, easy=6, hard=6), {}, inflight=4)
    trainer.agent_loop_manager.fail_every = 5
    run_real(trainer, 12)
    selector = trainer.replay_buffer.lengthsched_selector
    assert trainer.agent_loop_manager.done >= 5 and selector.observed < selector.handed  # some failed unclassified
    assert selector._keys == {}  # everything verl cleared or trained was forgotten
    assert selector.forget(["never handed"]) == 0


@requires_v1
def test_the_factory_builds_verls_async_buffer_for_the_async_trainers():
    from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

    class Trainer(FakeTrainer):
        pass

    trainer = Trainer.__new__(Trainer)
    trainer.config = _AttrDict({"trainer": {"v1": {"sampler": {"sync_refill_failed_groups": False}}},
                                "algorithm": {"filter_groups": {"enable": True, "metric": "acc"}},
                                "data": {"train_batch_size": 3}})
    buffer = vsel.selective_replay_buffer(trainer_mode="separate_async", trainer_config={}, max_off_policy_threshold=4,
                                          max_off_policy_strategy="drop", sampler_kwargs={},
                                          refill_fn=trainer._add_prompts_to_generate)
    assert isinstance(buffer, ReplayBufferAsync) and type(buffer).__name__ == "SelectiveReplayBufferAsync"
    assert buffer.filter_groups_metric == "acc" and buffer.train_batch_size is None  # verl gives async no sizes
    with pytest.raises(InvalidArgument, match=r"algorithm\.filter_groups\.enable"):  # no trainer: no filter settings
        vsel.selective_replay_buffer(trainer_mode="colocate_async", trainer_config={}, max_off_policy_threshold=4,
                                     max_off_policy_strategy="drop", sampler_kwargs={}, refill_fn=lambda n: n)
