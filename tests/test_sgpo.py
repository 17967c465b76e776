"""Adaptive group sizes from a difficulty profile (lengthsched.sgpo), the budget command, and the
simulated epoch."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lengthsched.cli import main
from lengthsched.errors import InvalidArgument
from lengthsched.sgpo import (
    BudgetConfig,
    OnlineBudget,
    ProfileRecord,
    group_size_for,
    plan_budget,
    prompt_decision,
    read_online_budget,
    read_profile,
    write_online_budget,
)
from simulate.epoch import compare_epochs, epoch_groups, run_epoch


def profile(n=60, k=8, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = float(rng.choice([0.0, 0.05, 0.2, 0.5, 0.8, 1.0]))
        outcomes = tuple(int(x) for x in rng.random(k) < p)
        out.append(ProfileRecord(f"p{i}", outcomes, tuple(int(x) for x in rng.integers(50, 400, size=k)),
                                 int(rng.integers(10, 100))))
    return out


def informative_probability(p: float, g: int) -> float:
    """The probability that a group of g completions, each solving with probability p, has rewards that differ."""
    return 1 - p ** g - (1 - p) ** g


@given(p=st.floats(0.0, 1.0), g_min=st.integers(1, 8), extra=st.integers(0, 64),
       rule=st.sampled_from(["pow2", "ceil", "informative"]), target=st.floats(0.05, 0.99))
def test_group_size_rules(p, g_min, extra, rule, target):
    cfg = BudgetConfig(g_min=g_min, g_max=g_min + extra, rule=rule, target=target)
    g = group_size_for(p, cfg)
    assert cfg.g_min <= g <= cfg.g_max
    if p == 0:
        assert g == cfg.g_max
    elif p == 1 and rule == "informative":  # no group is informative: the smallest
        assert g == cfg.g_min
    elif rule == "informative":  # the smallest group informative with probability target, g_max if none is
        if g < cfg.g_max:
            assert informative_probability(p, g) >= target - 1e-9
        if g > cfg.g_min:
            assert informative_probability(p, g - 1) < target
    elif cfg.g_min < g < cfg.g_max:
        if rule == "pow2":
            assert g & (g - 1) == 0 and g <= 1 / p + 1e-9 < 2 * g
        else:
            assert g - 1 < 1 / p <= g + 1e-9


def test_the_informative_rule_sizes_middling_prompts_up_and_extremes_to_their_bounds():
    cfg = BudgetConfig(g_min=2, g_max=32, rule="informative", target=0.9)
    assert [group_size_for(p, cfg) for p in (0.5, 0.3, 0.1, 0.01, 0.97)] == [5, 7, 22, 32, 32]
    assert group_size_for(0.5, BudgetConfig(rule="pow2")) == 2  # about 1/p: informative half the time
    # drop_above 1 keeps an always-solved prompt: no group of it is informative, so the smallest
    assert prompt_decision(1.0, "a", BudgetConfig(rule="informative", drop_above=1.0)) == (True, "informative", 2)
    with pytest.raises(InvalidArgument, match="target"):
        BudgetConfig(rule="informative", target=1.0)


def test_keep_size_order_and_account():
    prof = profile()
    cfg = BudgetConfig(g_min=2, g_max=32, drop_above=0.9, unsolved_fraction=0.5, phases=3, baseline_group_size=16)
    plan = plan_budget(prof, cfg)
    by_id = {r.id: r for r in prof}
    for d in plan.prompts:
        p = by_id[d.id].success_rate
        assert d.success_rate == p
        if p > 0.9:
            assert not d.kept and d.reason == "trivial"
        elif p == 0:
            assert d.reason in ("unsolved", "unsolved, sampled") and d.kept == (d.reason == "unsolved, sampled")
        else:
            assert d.kept and d.group_size == group_size_for(p, cfg)
    unsolved = [d for d in plan.prompts if p_is_zero(by_id, d)]
    assert 0 < sum(d.kept for d in unsolved) < len(unsolved)  # a seeded sample of them
    assert plan_budget(prof, cfg).prompts == plan.prompts  # stable
    # curriculum: phases run easy to hard and split the kept prompts evenly
    phases = [plan.phase(i) for i in range(3)]
    assert sum(map(len, phases)) == len(plan.kept) and max(map(len, phases)) - min(map(len, phases)) <= 1
    assert all(a[-1].success_rate >= b[0].success_rate for a, b in zip(phases, phases[1:]))
    # accounting by hand
    mean = {r.id: float(np.mean(r.lengths)) for r in prof}
    prof_tokens = sum(len(r.outcomes) * (mean[r.id] + r.prompt_tokens) for r in prof)
    train_tokens = sum(d.group_size * (mean[d.id] + d.prompt_tokens) for d in plan.kept)
    base = sum(16 * (mean[r.id] + r.prompt_tokens) for r in prof)
    assert plan.profiling_tokens == pytest.approx(prof_tokens) and plan.training_tokens == pytest.approx(train_tokens)
    assert plan.baseline_tokens == pytest.approx(base)
    assert plan.savings == pytest.approx(base / (prof_tokens + train_tokens))


def p_is_zero(by_id, d):
    return by_id[d.id].success_rate == 0


def test_bad_profiles_name_the_problem():
    with pytest.raises(InvalidArgument, match="outcomes"):
        ProfileRecord("x", (1, 2))
    with pytest.raises(InvalidArgument, match="lengths"):
        ProfileRecord("x", (1, 0), (5,))
    with pytest.raises(InvalidArgument, match="each prompt id once"):
        plan_budget([ProfileRecord("x", (1,)), ProfileRecord("x", (0,))])
    with pytest.raises(InvalidArgument, match="solved"):
        read_profile(['{"id": "a", "solved": 5, "samples": 4}'])
    with pytest.raises(InvalidArgument, match="profile"):
        read_profile(['{"id": "a"}'])
    with pytest.raises(InvalidArgument, match="rule"):
        BudgetConfig(rule="sqrt")


def test_budget_command(tmp_path, capsys):
    path = tmp_path / "profile.jsonl"
    path.write_text("".join(json.dumps({"id": r.id, "outcomes": list(r.outcomes), "lengths": list(r.lengths),
                                        "prompt_tokens": r.prompt_tokens}) + "\n" for r in profile()))
    assert main(["budget", str(path), "--unsolved-fraction", "0.5", "--output", str(tmp_path / "plan.json")]) == 0
    out = capsys.readouterr().out
    assert "kept" in out and "less" in out and "phase 0" in out
    saved = json.loads((tmp_path / "plan.json").read_text())
    assert saved["format"] == "lengthsched.budget/1" and len(saved["prompts"]) == 60
    assert main(["budget", str(tmp_path / "missing.jsonl")]) == 2
    assert "profile" in capsys.readouterr().err
    # rule informative: the smallest group whose rewards differ with probability --target
    assert main(["budget", str(path), "--rule", "informative", "--target", "0.8", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    cfg = BudgetConfig(rule="informative", target=0.8)
    assert plan["config"]["target"] == 0.8 and all(
        p["group_size"] == group_size_for(p["success_rate"], cfg) for p in plan["prompts"] if p["reason"] ==
        "informative")
    assert main(["budget", str(path), "--target", "0.8"]) == 2  # --target sizes nothing under pow2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "argument 'target'" in err and "--rule informative" in err


def test_a_simulated_epoch_with_adaptive_sizes():
    prof = profile(30)
    plan = plan_budget(prof, BudgetConfig(unsolved_fraction=0.5))
    groups = epoch_groups(prof, {d.id: d.group_size for d in plan.kept}, max_new_tokens=512)
    assert [len(g[2]) for g in groups] == [d.group_size for d in plan.kept]
    assert all(set(g[2].tolist()) <= set(next(r for r in prof if r.id == g[0]).lengths) for g in groups)
    res = run_epoch(groups, "fixed_slot", max_new_tokens=512, slots=4)
    assert res.completions == sum(d.group_size for d in plan.kept) and res.groups == len(plan.kept)
    rows = compare_epochs(prof, plan, ["fixed_slot", "length_aware"], max_new_tokens=512, slots=4)
    for row in rows:
        assert row["adaptive"].steps < row["fixed"].steps
        assert row["steps_ratio"] == row["adaptive"].steps / row["fixed"].steps
    budget_rows = compare_epochs(prof, plan, ["growth_aware", "vllm"], max_new_tokens=512, budget_tokens=2048)
    assert all(r["adaptive"].peak_kv_tokens <= 2048 for r in budget_rows)


def test_budget_command_simulates_the_epoch(tmp_path, capsys):
    path = tmp_path / "profile.jsonl"
    path.write_text("".join(json.dumps({"id": r.id, "outcomes": list(r.outcomes), "lengths": list(r.lengths)}) + "\n"
                            for r in profile(20)))
    assert main(["budget", str(path), "--simulate", "fixed_slot,length_aware", "--slots", "4",
                 "--max-new-tokens", "512", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert [e["policy"] for e in res["epochs"]] == ["fixed_slot", "length_aware"]
    assert all(e["adaptive"]["steps"] < e["fixed"]["steps"] for e in res["epochs"])
    assert main(["budget", str(path), "--simulate", "magic", "--slots", "4"]) == 2


def _verl_data(path, n=8):
    """A verl data set as its preprocessing scripts write one (gsm8k's): prompt messages, the reward's ground truth,
    and ``extra_info.index``, the row's prompt id."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"data_source": "gsm8k", "prompt": [{"role": "user", "content": f"question {i}"}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(i)}, "extra_info": {"split": "train", "index": i}}
            for i in range(n)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return rows


SGPO_PROFILE = [{"id": "0", "outcomes": [1] * 8}, {"id": "1", "outcomes": [1] + [0] * 7},
                {"id": "2", "outcomes": [1, 1, 0, 0]}, {"id": "3", "outcomes": [0] * 8},
                {"id": "4", "outcomes": [1, 1, 1, 0]}, {"id": "99", "outcomes": [1, 0]}]


def test_the_plan_goes_into_verls_data_as_rollout_n(tmp_path, capsys):
    """lengthsched budget --verl-data/--verl-output: the rows the plan keeps, each with its group size as
    __rollout_n__ (verl 0.9.1's v1 worker runs that many sessions for the prompt), read back as verl reads its data
    (datasets' parquet loader); every other column intact; unprofiled rows at --baseline-group-size; curriculum
    order on request."""
    import datasets

    rows = _verl_data(tmp_path / "train.parquet")
    (tmp_path / "profile.jsonl").write_text("\n".join(json.dumps(p) for p in SGPO_PROFILE) + "\n")
    plan = plan_budget(read_profile([json.dumps(p) for p in SGPO_PROFILE]), BudgetConfig(seed=0))
    sizes = {p.id: p.group_size for p in plan.prompts if p.kept}
    assert "0" not in sizes and "3" in sizes  # trivial dropped; unsolved sampled at this seed
    args = ["budget", str(tmp_path / "profile.jsonl"), "--verl-data", str(tmp_path / "train.parquet"),
            "--verl-output", str(tmp_path / "out.parquet"), "--baseline-group-size", "12"]
    assert main(args + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out)["verl_data"]
    assert {k: report[k] for k in ("rows", "kept", "dropped", "unprofiled", "profiled_missing")} == \
        {"rows": 8, "kept": 7, "dropped": 1, "unprofiled": 3, "profiled_missing": 1}
    out = datasets.load_dataset("parquet", data_files=str(tmp_path / "out.parquet"))["train"]
    got = [(r["extra_info"]["index"], r["__rollout_n__"]) for r in out]
    assert got == [(i, sizes.get(str(i), 12)) for i in range(1, 8)]  # the data's order, row 0 dropped
    assert [r["prompt"] for r in out] == [rows[i]["prompt"] for i in range(1, 8)]
    assert [r["reward_model"] for r in out] == [rows[i]["reward_model"] for i in range(1, 8)]
    assert main(args + ["--verl-order", "curriculum"]) == 0
    assert "verl data: 7 of 8 rows written" in capsys.readouterr().out
    order = [r["extra_info"]["index"] for r in datasets.load_dataset(
        "parquet", data_files=str(tmp_path / "out.parquet"))["train"]]
    curriculum = [int(p.id) for i in range(plan.config.phases) for p in plan.phase(i) if p.id != "99"]
    assert order == curriculum + [5, 6, 7]  # easiest phase first, the unprofiled rows last


def test_verl_data_errors_name_the_flag(tmp_path, capsys):
    _verl_data(tmp_path / "train.parquet")
    (tmp_path / "profile.jsonl").write_text("\n".join(json.dumps(p) for p in SGPO_PROFILE) + "\n")
    base = ["budget", str(tmp_path / "profile.jsonl")]
    for extra, flag in ((["--verl-data", str(tmp_path / "train.parquet")], "verl_output"),
                        (["--verl-output", str(tmp_path / "o.parquet")], "verl_data"),
                        (["--verl-order", "curriculum"], "verl_order"),  # no effect without --verl-data
                        (["--verl-id", "uid"], "verl_id"),
                        (["--verl-data", str(tmp_path / "none.parquet"), "--verl-output", str(tmp_path / "o.parquet")],
                         "verl_data"),
                        (["--verl-data", str(tmp_path / "profile.jsonl"), "--verl-output",
                          str(tmp_path / "o.parquet")], "verl_data"),
                        (["--verl-data", str(tmp_path / "train.parquet"), "--verl-output", str(tmp_path / "o.parquet"),
                          "--verl-id", "extra_info.missing"], "verl_id"),
                        (["--verl-data", str(tmp_path / "train.parquet"), "--verl-output", str(tmp_path / "o.parquet"),
                          "--verl-id", "data_source"], "verl_id")):  # a column whose values name no profiled prompt
        assert main(base + extra) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"argument '{flag}'" in err, err
    assert not (tmp_path / "o.parquet").exists()  # nothing written on a failure


def test_adaptive_rollout_rows_checks_its_arguments():
    from lengthsched.integrations.verl_v1 import adaptive_rollout_rows

    plan = plan_budget(read_profile([json.dumps(p) for p in SGPO_PROFILE]))
    rows, sizes = adaptive_rollout_rows([4, "4", 0, 77], plan, default_n=5)  # ids matched as text
    assert rows == [0, 1, 3] and sizes[2] == 5 and sizes[0] == sizes[1] == plan.prompts[4].group_size
    for kwargs, name in ((dict(default_n=0), "default_n"), (dict(default_n=4, order="random"), "order")):
        with pytest.raises(InvalidArgument, match=name):
            adaptive_rollout_rows([1], plan, **kwargs)
    with pytest.raises(InvalidArgument, match="plan"):
        adaptive_rollout_rows([1], {"prompts": []}, default_n=4)
    # verl's GRPO gives a group of one its raw score as advantage: a plan (or a default) that makes one is refused.
    ones = plan_budget(read_profile([json.dumps(p) for p in SGPO_PROFILE]), BudgetConfig(g_min=1))
    assert min(p.group_size for p in ones.kept) == 1
    with pytest.raises(InvalidArgument, match="'g_min'.*group of one"):
        adaptive_rollout_rows([p.id for p in ones.kept], ones, default_n=4)
    with pytest.raises(InvalidArgument, match="'default_n'.*group of one"):
        adaptive_rollout_rows([0, 77], plan, default_n=1)


@given(st.lists(st.integers(0, 12), min_size=1, max_size=30), st.sampled_from(["data", "curriculum"]),
       st.integers(0, 5))
def test_adaptive_rollout_rows_keep_every_row_the_plan_does_not_drop(ids, order, seed):
    """Each row is kept unless its prompt is profiled and dropped; a kept profiled row gets its planned size, an
    unprofiled one the default; "data" keeps the rows' order, "curriculum" puts no later phase before an earlier
    one and the unprofiled rows last; every kept row once."""
    from lengthsched.integrations.verl_v1 import adaptive_rollout_rows

    rng = np.random.default_rng(seed)
    profile = [json.dumps({"id": str(k), "solved": int(s), "samples": 8})
               for k, s in zip(range(0, 12, 2), rng.integers(0, 9, 6))]
    plan = plan_budget(read_profile(profile), BudgetConfig(seed=seed))
    decided = {p.id: p for p in plan.prompts}
    if not any(str(i) in decided for i in ids):
        with pytest.raises(InvalidArgument, match="ids"):
            adaptive_rollout_rows(ids, plan, default_n=7, order=order)
        return
    rows, sizes = adaptive_rollout_rows(ids, plan, default_n=7, order=order)
    want = [i for i, k in enumerate(ids) if str(k) not in decided or decided[str(k)].kept]
    assert sorted(rows) == want and len(set(rows)) == len(rows)
    assert sizes == [decided[str(ids[i])].group_size if str(ids[i]) in decided else 7 for i in rows]
    if order == "data":
        assert rows == want
    else:
        phases = [decided[str(ids[i])].phase if str(ids[i]) in decided else plan.config.phases for i in rows]
        assert phases == sorted(phases)


# ----------------------------------------------------------------------------- online: the trainer's own rewards
def test_online_budget_decides_as_the_profile_would_from_the_groups_it_saw():
    """A prompt's next group from its latest groups' outcomes, by plan_budget's rules: about 1/p, g_min where the
    plan would drop it, the trainer's own size before its first group."""
    cfg = BudgetConfig(g_min=2, g_max=32, unsolved_fraction=0.0)
    online = OnlineBudget(cfg, memory=2)
    prof = profile(80, k=16, seed=3)
    plan = plan_budget(prof, cfg)
    assert online.group_sizes([r.id for r in prof], 16) == [16] * len(prof)
    assert online.reasons == {"unseen": len(prof)}
    for r in prof:
        online.observe(r.id, r.outcomes)
    sizes = online.group_sizes([r.id for r in prof], 16)
    for decided, g in zip(plan.prompts, sizes):
        assert g == (decided.group_size if decided.kept else cfg.g_min), decided
    assert sum(online.reasons.values()) == len(prof) and "unseen" not in online.reasons
    assert online.groups == len(prof) and online.samples == 16 * len(prof) and len(online) == len(prof)
    # The memory forgets: a prompt never solved, then always solved, is trivial once its old group is gone.
    online.observe("drift", [0] * 16)
    online.observe("drift", [1] * 2)
    assert online.success_rate("drift") == pytest.approx(2 / 18) and online.decide("drift", 16) == (8, "informative")
    online.observe("drift", [1] * 2)
    assert online.success_rate("drift") == 1.0 and online.decide("drift", 16) == (2, "trivial")
    # Keys match as text (verl's index column comes as numbers; a saved budget's keys are text).
    online.observe(7, [1, 0, 0, 0])
    assert online.success_rate("7") == 0.25 and online.decide(7, 16) == (4, "informative")


def test_online_budget_looks_hard_at_a_seeded_share_of_unsolved_prompts_a_different_one_each_visit():
    cfg = BudgetConfig(g_min=2, g_max=32, unsolved_fraction=0.25, seed=1)
    online = OnlineBudget(cfg, memory=None)
    keys = [f"hard{i}" for i in range(400)]
    for key in keys:
        online.observe(key, [0] * 4)
    first = online.group_sizes(keys, 16)
    assert set(first) == {2, 32} and online.reasons.keys() == {"unsolved", "unsolved, sampled"}
    assert 0.18 < first.count(32) / len(keys) < 0.32
    assert first == online.group_sizes(keys, 16)  # the same decision until the prompt is seen again
    for key in keys:
        online.observe(key, [0, 0])
    second = online.group_sizes(keys, 16)
    assert 0.18 < second.count(32) / len(keys) < 0.32 and second != first


def test_online_budget_keeps_its_state_across_a_restart_and_checks_its_inputs(tmp_path):
    cfg = BudgetConfig(g_min=2, g_max=16)
    online = OnlineBudget(cfg, memory=3)
    online.observe_rewards("a", [1.0, -1.0, -1.0, -1.0])  # 1 and -1 rewards: solved at >= 0.5
    online.observe_rewards("a", [0.0, 0.0], solved_reward=0.0)  # a threshold of 0: both solved
    online.observe("b" * 300, [0, 0, 1])  # a long prompt text is kept under its digest
    path = tmp_path / "sgpo.json"
    write_online_budget(path, online)
    back = read_online_budget(path, "state", cfg, memory=3)
    assert back.to_dict() == online.to_dict()
    assert back.group_sizes(["a", "b" * 300, "c"], 8) == online.group_sizes(["a", "b" * 300, "c"], 8)
    shorter = read_online_budget(path, "state", BudgetConfig(g_min=4, g_max=16), memory=1)  # the run's rules win
    assert shorter.success_rate("a") == 1.0 and shorter.config.g_min == 4 and shorter.groups == 3
    assert read_online_budget(tmp_path / "none.json", "state").groups == 0
    bad = {"format": "lengthsched.online_budget/1", "prompts": {"a": {"groups": [[3, 2]]}}}  # 3 solved of 2
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(InvalidArgument, match="'lengthsched.sgpo.state_path'.*online sGPO"):
        read_online_budget(tmp_path / "bad.json", "lengthsched.sgpo.state_path")
    (tmp_path / "other.json").write_text("[1, 2]")
    with pytest.raises(InvalidArgument, match="'state'"):
        read_online_budget(tmp_path / "other.json", "state")
    for bad, match in ((lambda: online.observe("a", [2]), "outcomes"), (lambda: online.observe("a", "01"), "outcomes"),
                       (lambda: online.observe_rewards("a", [float("nan")]), "rewards"),
                       (lambda: online.observe_rewards("a", [True]), "rewards"),
                       (lambda: online.observe_rewards("a", [1.0], solved_reward=float("inf")), "solved_reward"),
                       (lambda: online.group_sizes(["a", "b"], [4]), "default_n"),
                       (lambda: online.decide("a", 0), "default_n"), (lambda: OnlineBudget(memory=0), "memory"),
                       (lambda: OnlineBudget({"g_min": 2}), "config")):
        with pytest.raises(InvalidArgument, match=match):
            bad()
    online.observe("a", [])  # an empty group records nothing
    assert online.groups == 3


@given(groups=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.lists(st.integers(0, 1), min_size=1,
                                                                            max_size=40)), max_size=12),
       g_min=st.integers(2, 8), extra=st.integers(0, 40), memory=st.one_of(st.none(), st.integers(1, 4)),
       default=st.integers(1, 64))
def test_online_group_sizes_stay_in_bounds_and_remember_only_the_latest_groups(groups, g_min, extra, memory, default):
    cfg = BudgetConfig(g_min=g_min, g_max=g_min + extra)
    online = OnlineBudget(cfg, memory=memory)
    for key, outcomes in groups:
        online.observe(key, outcomes)
    sizes = online.group_sizes(["a", "b", "c"], default)
    for key, g in zip("abc", sizes):
        mine = [o for k, o in groups if k == key]
        if not mine:
            assert g == default
            continue
        assert cfg.g_min <= g <= cfg.g_max
        kept = mine if memory is None else mine[-memory:]
        assert online.success_rate(key) == pytest.approx(sum(map(sum, kept)) / sum(map(len, kept)))
    assert online.groups == len(groups) and online.samples == sum(len(o) for _, o in groups)


def test_budget_command_simulates_a_training_run_in_rollout_seconds(tmp_path, capsys):
    """--train-epochs: a fixed G, the plan (its profiling pass counted), online and oracle sizing over a simulated
    training run on the profile's prompts; the step flags only with it."""
    path = tmp_path / "profile.jsonl"
    path.write_text("".join(json.dumps({"id": r.id, "outcomes": list(r.outcomes), "lengths": list(r.lengths),
                                        "prompt_tokens": r.prompt_tokens}) + "\n" for r in profile(24)))
    args = ["budget", str(path), "--train-epochs", "2", "--replicas", "2", "--replica-pool", "2",
            "--max-new-tokens", "512", "--step-prompts", "8"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "training run, 2 epochs on 2 replicas under steal" in out and "fixed G=16:" in out and "oracle" in out
    assert "online (the run's own rewards, rule pow2)" in out
    assert main([*args[:-2], "--json", "--step-completions", "64"]) == 0
    training = {t["sizing"]: t for t in json.loads(capsys.readouterr().out)["training"]}
    assert list(training) == ["fixed", "offline", "online", "oracle"]
    assert training["fixed"]["completions"] == 2 * 24 * 16 and training["fixed"]["x_fixed_groups"] == 1.0
    plan = plan_budget(profile(24))
    # the plan's sizes every epoch, and its profiling pass of 8 per prompt in its seconds
    assert training["offline"]["completions"] == 2 * sum(p.group_size for p in plan.prompts) + 8 * 24
    assert training["offline"]["profiling_seconds"] > 0 == training["online"]["profiling_seconds"]
    assert all(t["informative"] <= t["completions"] for t in training.values())
    assert training["fixed"]["x_fixed_advantage_mass"] == 1.0 and training["online"]["advantage_mass_per_hour"] > 0
    for flag, value in (("--learn", "1"), ("--replicas", "8"), ("--step-completions", "64")):
        assert main(["budget", str(path), flag, value]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--train-epochs" in err, err
    assert main(["budget", str(path), "--train-epochs", "0"]) == 2
    assert "argument 'train_epochs'" in capsys.readouterr().err
    assert main([*args, "--step-completions", "64"]) == 2  # --step-prompts 8 as well: one shape of step or the other
    assert "argument 'step_prompts'" in capsys.readouterr().err


def test_online_budget_forgets_what_later_steps_recorded(tmp_path):
    """A run resumed from its checkpoint at step k generates steps k + 1 ... again: forget_after(k) drops the groups
    recorded for them (their counts too); groups recorded without a step stay."""
    online = OnlineBudget(BudgetConfig(), memory=3)
    online.observe("a", [1, 0], step=1)
    online.observe("a", [0, 0, 0, 0], step=2)
    online.observe("a", [1, 1], step=3)
    online.observe("b", [1, 1, 1, 1], step=3)
    online.observe("c", [0, 1])  # no step: kept whatever happens
    back = OnlineBudget.from_dict(json.loads(json.dumps(online.to_dict())))
    assert back.to_dict() == online.to_dict() and back._groups[back._key("a")][0] == (1, 2, 1)
    assert online.forget_after(1) == 3
    assert online.success_rate("a") == 0.5 and online.success_rate("b") is None and online.success_rate("c") == 0.5
    assert (online.groups, online.samples, online.solved, len(online)) == (2, 4, 2, 2)
    assert online._visits[online._key("a")] == 1 and online.forget_after(0) == 1 and online.forget_after(5) == 0
    with pytest.raises(InvalidArgument, match="'step'"):
        online.observe("a", [1], step=-1)


@given(groups=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.lists(st.integers(0, 1), min_size=1,
                                                                            max_size=6), st.integers(0, 3)),
                       max_size=30),
       memory=st.integers(1, 3), keep=st.integers(0, 6), back=st.integers(0, 6), unstepped=st.booleans())
def test_keep_steps_makes_a_resume_within_reach_exact(groups, memory, keep, back, unstepped):
    """A budget that keeps ``keep_steps`` steps, forgetting what came after a step within that reach of the newest,
    decides as a budget that never saw those later groups: the same success rates, visits (the seeded draws) and
    totals; it holds at most the memory plus the groups of the latest ``keep_steps`` steps per prompt, and the rules
    of the run resuming apply to a saved one."""
    seen, step = [], 0
    for key, outcomes, gap in groups:  # steps in the order a run records them, prompts revisited
        step += gap
        seen.append((key, outcomes, None if unstepped and gap == 3 else step))
    kept = OnlineBudget(BudgetConfig(unsolved_fraction=0.5), memory=memory, keep_steps=keep)
    reach = {}  # prompt -> the newest step when it was last observed (it is pruned then)
    for key, outcomes, s in seen:
        kept.observe(key, outcomes, step=s)
        reach[kept._key(key)] = kept.newest_step
    newest = max((s for *_, s in seen if s is not None), default=None)
    for k, remembered in kept._groups.items():
        late = [g for g in remembered if reach[k] is not None and g[2] is not None and g[2] > reach[k] - keep]
        assert len(remembered) <= memory + len(late)
    resumed = OnlineBudget.from_dict(json.loads(json.dumps(kept.to_dict())))
    assert resumed.to_dict() == kept.to_dict() and resumed.newest_step == kept.newest_step == newest
    to = max(0, (newest or 0) - min(back, keep))
    assert resumed.reaches(to)
    resumed.forget_after(to)
    fresh = OnlineBudget(BudgetConfig(unsolved_fraction=0.5), memory=memory)
    for key, outcomes, s in seen:
        if s is None or s <= to:
            fresh.observe(key, outcomes, step=s)
    for key in "abcd":
        assert resumed.success_rate(key) == fresh.success_rate(key)
        assert resumed.decide(key, 16) == fresh.decide(key, 16)
    assert (resumed.groups, resumed.samples, resumed.solved, len(resumed)) == \
           (fresh.groups, fresh.samples, fresh.solved, len(fresh))


def test_keep_steps_through_the_state_file(tmp_path):
    """keep_steps is saved with the budget and replaced by the resuming run's, which lets go of what it does not
    keep; it is checked like the memory."""
    online = OnlineBudget(BudgetConfig(), memory=1, keep_steps=3)
    for step in range(1, 6):
        online.observe("a", [step % 2, 0], step=step)
    assert [g[2] for g in online._groups[online._key("a")]] == [2, 3, 4, 5]  # step 2: the memory as at step 2
    path = tmp_path / "budget.json"
    write_online_budget(path, online)
    assert json.loads(path.read_text())["keep_steps"] == 3
    again = read_online_budget(path, "state", memory=1, keep_steps=3)
    assert again.forget_after(2) == 3 and again.success_rate("a") == 0.0  # step 2's group decides again
    shorter = read_online_budget(path, "state", memory=1, keep_steps=1)
    assert [g[2] for g in shorter._groups[shorter._key("a")]] == [4, 5]
    assert shorter.forget_after(2) == 2 and shorter.success_rate("a") is None  # beyond its reach: nothing left
    with pytest.raises(InvalidArgument, match="'keep_steps'"):
        OnlineBudget(keep_steps=-1)


def test_the_budget_says_how_far_back_a_forget_is_exact():
    """pruned_through: the latest step up to which groups beyond the memory were let go. A forget back to a step
    within keep_steps of the newest may still go past it (after an earlier forget, or with a file written with a
    shorter reach): reaches() says so, and the saved file keeps it."""
    online = OnlineBudget(BudgetConfig(), memory=1, keep_steps=2)
    for key, outcomes, step in (("k", [1, 0], 5), ("k", [1, 1], 8), ("o", [1, 0], 10), ("k", [0, 0], 10)):
        online.observe(key, outcomes, step=step)
    assert online.pruned_through == 8 and online.reaches(8) and not online.reaches(7)  # k's step-5 group let go
    online.forget_after(9)
    assert online.newest_step == 9 and not online.reaches(7)  # within keep_steps of 9, but step 5 is gone
    back = OnlineBudget.from_dict(json.loads(json.dumps(online.to_dict())))
    assert back.pruned_through == 8
    old = online.to_dict()
    del old["pruned_through"], old["keep_steps"]  # a file from before the reach was saved: cut at its newest step
    assert OnlineBudget.from_dict(old).pruned_through == 9
    assert OnlineBudget(memory=None).reaches(0)  # nothing let go: every forget is exact


def test_groups_recorded_with_a_tag_are_forgotten_by_it():
    """forget_tags: the groups a trainer dispatches again after a resume (verl re-issues its in-flight prompts
    under their uids) are forgotten as if never recorded, counts included; tags out of keep_steps' reach are let go,
    unknown ones passed over; tags survive the state file."""
    online = OnlineBudget(BudgetConfig(), memory=2, keep_steps=2)
    online.observe("a", [1, 0], step=1, tag="u1")
    online.observe("a", [0, 0], step=2, tag="u2")
    online.observe("b", [1, 1], step=2, tag="u3")
    never = OnlineBudget(BudgetConfig(), memory=2, keep_steps=2)
    never.observe("a", [1, 0], step=1)
    never.observe("b", [1, 1], step=2)
    back = OnlineBudget.from_dict(json.loads(json.dumps(online.to_dict())))
    assert back.forget_tags(["u2", "nope"]) == 1 and back.forget_tags(["u2"]) == 0
    for key in "ab":
        assert back.success_rate(key) == never.success_rate(key) and back.decide(key, 16) == never.decide(key, 16)
    assert (back.groups, back.samples, back.solved) == (never.groups, never.samples, never.solved)
    for step in range(3, 8):  # later steps: u1's group (step 1) leaves the reach
        online.observe("c", [1, 0], step=step, tag=f"c{step}")
    assert "u1" not in online.to_dict()["tags"] and "c7" in online.to_dict()["tags"]
    online.forget_after(5)
    assert "c6" not in online.to_dict()["tags"]  # forgotten groups take their tags with them
    with pytest.raises(InvalidArgument, match="'tag'"):
        online.observe("a", [1], step=8, tag=7)
