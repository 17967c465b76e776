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
from lengthsched.sgpo import BudgetConfig, ProfileRecord, group_size_for, plan_budget, read_profile
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


@given(p=st.floats(0.0, 1.0), g_min=st.integers(1, 8), extra=st.integers(0, 64), rule=st.sampled_from(["pow2", "ceil"]))
def test_group_size_rules(p, g_min, extra, rule):
    cfg = BudgetConfig(g_min=g_min, g_max=g_min + extra, rule=rule)
    g = group_size_for(p, cfg)
    assert cfg.g_min <= g <= cfg.g_max
    if p == 0:
        assert g == cfg.g_max
    elif cfg.g_min < g < cfg.g_max:
        if rule == "pow2":
            assert g & (g - 1) == 0 and g <= 1 / p + 1e-9 < 2 * g
        else:
            assert g - 1 < 1 / p <= g + 1e-9


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
