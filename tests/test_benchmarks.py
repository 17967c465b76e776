"""The benchmark scripts still run (quick mode); their numbers live in docs/benchmarks.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_simulator_benchmark_runs_quick(tmp_path):
    out = tmp_path / "simulate.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_simulate.py"), "--quick",
                             "--sections", "target,paper,batches", "--out", str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert {"target", "paper", "batches"} <= set(data)
    assert "steps / micro" in result.stdout


def test_simulator_benchmark_rollout_sections_take_a_fitted_cost(tmp_path):
    out = tmp_path / "rollout.json"
    cost = ROOT / "benchmarks" / "results" / "stepcost_h100_qwen3-8b.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_simulate.py"), "--quick",
                             "--sections", "rollout,rollout_headroom,rollout_speed", "--cost", str(cost), "--out",
                             str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "Qwen3-8B, step cost fitted on H100 steps (--cost)" in result.stdout
    data = json.loads(out.read_text())
    assert data["cost"] == str(cost)
    assert {row[2] for row in data["rollout_speed"]["rows"]} >= {"steal", "placed_classes", "seer"}
    rows = data["rollout_headroom"]["rows"]
    assert [row[2] for row in rows] == [4, 1]  # replicas
    for row in rows:
        lower_bound, steal, fcfs, priority, best = row[5], row[6], row[9], row[10], row[11]
        assert lower_bound <= best <= min(fcfs, priority) and fcfs <= 1.0 + 1e-12 and steal <= 1.0 + 1e-12


def test_simulator_benchmark_rollout_speed_times_every_rollout_policy():
    """The issue's speed target is for every policy: rollout_speed times each policy of the registry that
    runs rollout steps, with the predictions the grid gives it (realistic or none)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_simulate import ROLLOUT_RUNS, SPEED_EXTRA

    from lengthsched.runtime.registry import POLICIES

    timed = {policy for _, policy, _, pred in ROLLOUT_RUNS + SPEED_EXTRA if pred in ("realistic", None)}
    assert timed == {name for name, spec in POLICIES.items() if spec.rollout}


def test_simulator_benchmark_times_every_policy_with_a_compressed_cache(tmp_path):
    data = _quick_section(tmp_path, "rollout_speed_compressed")
    assert {row[2] for row in data["rows"]} >= {"steal", "placed_classes", "steal_classes", "seer", "steal_sglang"}
    assert all(row[3] > 0 for row in data["rows"])


def _quick_section(tmp_path, section: str) -> dict:
    """Run one bench_simulate section in quick mode; its JSON. bench_simulate becomes importable."""
    out = tmp_path / f"{section}.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_simulate.py"), "--quick",
                             "--sections", section, "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    sys.path.insert(0, str(ROOT / "benchmarks"))
    return json.loads(out.read_text())[section]


def test_simulator_benchmark_rollout_ways_matches_steal(tmp_path):
    """rollout_ways (quick): steal's own rule (share 1.0) is, setting by setting, the run with the k it
    picks; k = R is verl's spread; the section leaves steal's class as it found it."""
    from simulate import run_rollout

    data = _quick_section(tmp_path, "rollout_ways")
    from bench_simulate import _rollout_setting

    assert len(data["rows"]) == 2
    for row in data["rows"]:
        seed, workload, prompts, replicas, budget = row[:5]
        groups, realistic, _, _, common = _rollout_setting(workload, prompts, replicas, int(budget.split()[0]), seed,
                                                           None)
        steal = run_rollout(groups, "steal", predicted=realistic, **common).seconds / row[6]
        work = float(np.sum(realistic)) / replicas / common["budget_tokens"]
        assert row[-1] == pytest.approx(work)
        k = 1 if work >= 8.0 else int(max(1, min(replicas, np.floor(replicas * 1.0 / row[5]))))
        assert row[6 + k] == pytest.approx(steal, rel=1e-12)
        assert all(v is None for v in row[7 + replicas:15])
    assert {row[-1] >= 8.0 for row in data["rows"]} == {True, False}  # both branches of steal's rule
    labels = [r[0] for r in data["summary"]]
    assert "share 1.0, whole groups from 6 pools of predicted tokens per replica (steal's)" in labels
    assert "best k per setting (oracle)" in labels
    best = data["summary"][labels.index("best k per setting (oracle)")]
    assert all(best[2] <= r[2] + 1e-12 for r in data["summary"])


def test_simulator_benchmark_rollout_hedged_scores_choices_of_k_without_the_true_lengths(tmp_path):
    """rollout_hedged (quick): the rule's row is steal as it runs; no choice beats the true-length best k;
    the scenarios are drawn from the predictions alone (changing the true lengths changes none of them)."""
    import dataclasses

    from simulate import run_rollout

    data = _quick_section(tmp_path, "rollout_hedged")
    from bench_simulate import _rollout_setting, _scenario_groups

    rows = {r[0]: r for r in data["rows"]}
    oracle = rows["best k per setting (oracle: the true lengths)"]
    assert all(oracle[2] <= r[2] + 1e-12 for r in data["rows"]) and len(rows) == 2 + 3 * 2
    ratios = []
    for seed, workload, prompts, replicas, budget, rule_k, chosen in data["settings"]:
        assert chosen["steal's rule (spread_ways)"] == rule_k and all(1 <= k <= replicas for k in chosen.values())
        groups, realistic, _, _, common = _rollout_setting(workload, prompts, replicas, int(budget.split()[0]), seed,
                                                           None)
        base = run_rollout(groups, "vllm", router="least_loaded", **common).seconds
        ratios.append(run_rollout(groups, "steal", predicted=realistic, **common).seconds / base)
        other = [dataclasses.replace(g, lengths=g.lengths + 7) for g in groups]
        a = _scenario_groups(groups, realistic, np.random.default_rng(5), 0.3)
        b = _scenario_groups(other, realistic, np.random.default_rng(5), 0.3)
        assert all(np.array_equal(x.lengths, y.lengths) for x, y in zip(a, b))
    assert rows["steal's rule (spread_ways)"][2] == pytest.approx(float(np.mean(ratios)), rel=1e-12)


def test_simulator_benchmark_rollout_partial_compares_kept_tokens_per_second(tmp_path):
    """rollout_partial (quick): over-sampled steps one after another; the reference row (vLLM + verl, no
    over-sampling) is 1, nothing is stale or dropped without over-sampling, and a setting's numbers are
    those of simulate.run_oversampled_steps run again here."""
    from simulate import run_oversampled_steps

    data = _quick_section(tmp_path, "rollout_partial")
    from bench_simulate import PARTIAL_RUNS, _rollout_setting

    rows = {(r[0], r[1], r[2]): r for r in data["rows"]}
    base = rows[(1.0, "no", PARTIAL_RUNS[0][0])]
    assert base[4] == base[5] == base[7] == base[8] == base[10] == 1.0 and base[9] == base[11] == base[14] == 0
    assert all(r[11] == r[14] == r[13] == 0 for key, r in rows.items() if key[0] == 1.0)
    assert all(r[14] == 0.0 for key, r in rows.items() if key[1] == "yes")  # carried, not dropped
    assert all(r[10] <= r[4] + 1e-12 for r in rows.values())  # on-policy kept tokens: a part of the kept
    assert all(r[7] == 1.0 for key, r in rows.items() if key[2] == PARTIAL_RUNS[0][0])
    over, carry, workload, prompts, replicas, budget, runs = data["settings"][-1]
    steps = data["steps"]
    groups, realistic, _, _, common = _rollout_setting(workload, steps * int(np.ceil(prompts * over)), replicas,
                                                       int(budget.split()[0]), 11, None)
    r = run_oversampled_steps(groups, "steal", batch=prompts, oversample=over, steps=steps, partial=carry,
                              predicted=realistic, resume="left", **common)
    assert runs["steal"][:3] == pytest.approx([r.seconds, r.kept_tokens, r.stale_share], rel=1e-12)


def test_simulator_benchmark_rollout_oversampling_keeps_the_first_groups_to_finish(tmp_path):
    """rollout_oversampling (quick): B x 1.25 groups submitted, the step ends at the B-th finished group:
    no later than the full makespan; vLLM + verl is the reference; the kept groups are the first B to
    finish (recomputed here from the same runs)."""
    from simulate import run_rollout

    data = _quick_section(tmp_path, "rollout_oversampling")
    from bench_simulate import OVERSAMPLE_RUNS, _rollout_setting

    base = [r for r in data["rows"] if r[1] == OVERSAMPLE_RUNS[0][0]][0]
    assert base[3] == base[6] == 1.0 and base[5] == 0
    assert all(0 < r[7] <= 1.0 and 0 < r[9] <= r[8] for r in data["rows"])
    over, workload, prompts, replicas, budget, runs = data["settings"][0]
    groups, _, _, _, common = _rollout_setting(workload, int(round(prompts * over)), replicas,
                                               int(budget.split()[0]), 11, None)
    r = run_rollout(groups, "vllm", router="least_loaded", record=True, **common)
    finish = r.group_finish_seconds()
    kept = np.argsort(finish, kind="stable")[:prompts]
    means = np.array([np.mean(g.lengths) for g in groups])
    assert runs[OVERSAMPLE_RUNS[0][0]] == pytest.approx([np.sort(finish)[prompts - 1], r.seconds,
                                                         means[kept].mean() / means.mean()], rel=1e-12)


def test_simulator_benchmark_rollout_variants_scores_steal_and_restores_it(tmp_path):
    """rollout_variants (quick): the default row is steal as it runs, the variants differ from it, and
    steal's class attributes are left as the section found them."""
    from lengthsched.runtime.dispatch import WorkStealing
    from simulate import run_rollout

    rows = {row[0]: row for row in _quick_section(tmp_path, "rollout_variants")["rows"]}
    from bench_simulate import _rollout_setting

    ratios = []
    for workload, prompts, replicas, factor in [("castillo", 64, 4, 2), ("long tail", 64, 4, 4)]:
        groups, realistic, _, _, common = _rollout_setting(workload, prompts, replicas, factor, 11, None)
        ratios.append(run_rollout(groups, "steal", predicted=realistic, **common).seconds
                      / run_rollout(groups, "vllm", router="least_loaded", **common).seconds)
    assert rows["steal (the default)"][2] == pytest.approx(np.mean(ratios), rel=1e-12)
    assert rows["steal, no stealing and no moves (its placement alone)"][2] > rows["steal (the default)"][2]
    assert len({row[2] for row in rows.values()}) == len(rows)
    from bench_simulate import _rollout_variants_unit

    unit = _rollout_variants_unit(("castillo", 64, 4, 2, 11, None))  # in this process: attributes restored
    assert (WorkStealing.ROOM, WorkStealing.STEAL_STARTED, WorkStealing.ORDER) == (1.0, True, "placement")
    assert (WorkStealing.MIGRATE_CHUNK, WorkStealing.MIGRATE_KV) == (128, False)
    from lengthsched.runtime.dispatch import StealObserved

    assert StealObserved.SNAPSHOT_STEPS is None and "SNAPSHOT_STEPS" not in vars(WorkStealing)
    assert unit["steal (the default)"][0] / unit["base"][0] == pytest.approx(ratios[0], rel=1e-12)


def test_simulator_benchmark_rollout_seer_scores_each_chunk_and_restores_it(tmp_path):
    from lengthsched.runtime.dispatch import SeerDivided, WorkStealing

    rows = _quick_section(tmp_path, "rollout_seer")["rows"]
    from bench_simulate import SEER_CHUNKS, _rollout_seer_unit

    assert [r[0] for r in rows] == (["seer (no migration)"]
                                    + [f"seer_divided, {c}-token chunks (KV loads priced)" for c in SEER_CHUNKS]
                                    + [f"seer_divided, {c}-token chunks, KV loads asynchronous" for c in SEER_CHUNKS]
                                    + ["seer_divided, 128-token chunks, KV loads free (upper bound)",
                                       "steal (the default: running requests moved to idle replicas every 128 tokens, "
                                       "KV recomputed)", "steal without moves of running requests",
                                       "steal, the moved KV loaded through a global pool (priced)",
                                       "steal, the moved KV loaded through a global pool, asynchronously",
                                       "steal, the moved KV loaded through a global pool, free (upper bound)"])
    unit = _rollout_seer_unit(("long tail", 64, 4, 4, 11, None))
    assert SeerDivided.CHUNK == 512 and (WorkStealing.MIGRATE_CHUNK, WorkStealing.MIGRATE_KV) == (128, False)
    assert (SeerDivided.LOADS, WorkStealing.LOADS) == ("async", "stall")
    assert set(unit) == ({"base", "seer", "steal", "steal, no moves", "steal, KV loaded", "steal, free KV",
                          "steal, KV loaded async", "divided, free KV"}
                         | {f"divided {c}" for c in SEER_CHUNKS} | {f"divided {c}, async KV" for c in SEER_CHUNKS})
    assert unit["divided, free KV"] < unit["divided 128"]  # the loads cost time
    assert unit["divided 128, async KV"] != unit["divided 128"]  # and are timed otherwise asynchronously
    assert len({unit[f"divided {c}"] for c in SEER_CHUNKS}) > 1  # the chunk matters on this step
    # seer_divided's defaults are the 512-token chunks with asynchronous loads
    from bench_simulate import _rollout_setting

    from simulate import run_rollout

    groups, _, _, _, common = _rollout_setting("long tail", 64, 4, 4, 11, None)
    assert run_rollout(groups, "seer_divided", **common).seconds == unit["divided 512, async KV"]
    # the long tail in tight pools on several replicas, alone: in quick mode that one setting
    by_name = {r[0]: r for r in rows}
    divided = by_name["seer_divided, 512-token chunks, KV loads asynchronous"]
    assert divided[7] == pytest.approx(unit["divided 512, async KV"] / unit["base"], rel=1e-12)
    assert divided[8] == int(unit["divided 512, async KV"] < unit["steal"] * (1 - 1e-3))
    assert divided[6] >= divided[8] and by_name[rows[8][0]][6] == by_name[rows[8][0]][8] == "-"  # steal's own row


def test_simulator_benchmark_rollout_scale_scores_its_runs(tmp_path):
    """rollout_scale (quick: 64 prompts x 16 on 16 replicas): one row per run of SCALE_RUNS, each the run
    it names (steal, steal_observed and the baseline rerun here), the recommendation the classes on
    CASTILLO's agreeing siblings, and the wall seconds each simulation took."""
    from simulate import run_rollout

    data = _quick_section(tmp_path, "rollout_scale")
    from bench_simulate import SCALE_COLUMNS, SCALE_RUNS, _rollout_setting

    rows = {row[4]: row for row in data["rows"]}
    assert [row[4] for row in data["rows"]] == [run[0] for run in SCALE_RUNS]
    assert {"seer_divided", "steal_observed", "recommended (previous epoch)"} <= set(rows)
    assert all(len(row) == len(SCALE_COLUMNS) and row[-1] > 0 for row in data["rows"])
    groups, realistic, _, _, common = _rollout_setting("castillo", 64, 16, 4, 11, None)
    base = run_rollout(groups, "vllm", router="least_loaded", **common).seconds
    assert rows["vllm + verl routing"][5] == pytest.approx(base, rel=1e-12)
    for label in ("steal", "steal_observed"):
        seconds = run_rollout(groups, label, predicted=realistic, **common).seconds
        assert rows[label][5] == pytest.approx(seconds, rel=1e-12)
        assert rows[label][6] == pytest.approx(seconds / base, rel=1e-12)
    assert rows["recommended (previous epoch)"][5] == rows["steal_classes (previous epoch)"][5]
    assert [row[0] for row in data["summary"]] == [run[0] for run in SCALE_RUNS]


def test_simulator_benchmark_rollout_routers_scores_each_framework_as_run_rollout_does(tmp_path):
    """rollout_routers (quick): one row per ROUTER_RUNS entry, each its makespans over vLLM + verl's and
    steal's over its own, as run_rollout gives them on the quick settings."""
    from simulate import run_rollout

    data = _quick_section(tmp_path, "rollout_routers")
    from bench_simulate import ROUTER_RUNS, _rollout_setting

    rows = {row[1]: row for row in data["rows"]}
    assert [row[1] for row in data["rows"]] == [run[0] for run in ROUTER_RUNS]
    ratios, gains = [], []
    for unit in (("castillo", 64, 4, 4), ("long tail", 64, 4, 2)):
        groups, realistic, _, _, common = _rollout_setting(*unit, 11, None)
        base = run_rollout(groups, "vllm", router="least_loaded", **common).seconds
        slime = run_rollout(groups, "sglang", router="cache_aware", in_flight=512 * 4, **common).seconds
        steal = run_rollout(groups, "steal", predicted=realistic, **common).seconds
        ratios.append(slime / base)
        gains.append(steal / slime)
    row = rows["slime: sglang + cache-aware router"]
    assert row[2] == 0 and row[3] == 2
    assert row[4] == pytest.approx(np.mean(ratios), rel=1e-12) and row[6] == pytest.approx(max(ratios), rel=1e-12)
    assert row[8] == pytest.approx(np.mean(gains), rel=1e-12) and row[9] == pytest.approx(min(gains), rel=1e-12)
    assert rows["steal"][8] == rows["steal"][9] == 1.0
    assert rows["vllm + verl routing"][4] == 1.0 and rows["vllm + verl routing"][7] == 0
    # the slime-plan rows are simulate.run_slime_planned's runs, and the second table divides by slime's
    from simulate import run_slime_planned

    planned = []
    for unit in (("castillo", 64, 4, 4), ("long tail", 64, 4, 2)):
        groups, realistic, _, _, common = _rollout_setting(*unit, 11, None)
        slime = run_rollout(groups, "sglang", router="cache_aware", in_flight=512 * 4, **common).seconds
        planned.append(run_slime_planned(groups, realistic, in_flight=512 * 4, **common)[0].seconds / slime)
    over = {row[1]: row for row in data["over_slime"]}
    label = "slime + lengthsched's plan (lengthsched.integrations.slime)"
    assert over[label][2] == 2 and over[label][3] == pytest.approx(np.mean(planned), rel=1e-12)
    assert over[label][5] == pytest.approx(max(planned), rel=1e-12)


def test_simulator_benchmark_rollout_sglang_variants_divide_by_slime(tmp_path):
    """rollout_sglang_variants (quick): one row per SGLANG_VARIANTS entry; the full steal_sglang row is
    run_rollout's steal_sglang over slime's makespan; the section leaves StealSGLang as it found it."""
    from lengthsched.runtime.dispatch import StealSGLang
    from simulate import run_rollout

    before = (StealSGLang.STEAL_STARTED, StealSGLang.MIGRATE_CHUNK, StealSGLang.ROOM)
    data = _quick_section(tmp_path, "rollout_sglang_variants")
    from bench_simulate import SGLANG_VARIANTS, _rollout_setting

    assert [row[0] for row in data["rows"]] == [v[0] for v in SGLANG_VARIANTS]
    ratios = []
    for unit in (("castillo", 64, 4, 2), ("long tail", 64, 4, 4)):
        groups, realistic, _, _, common = _rollout_setting(*unit, 11, None)
        slime = run_rollout(groups, "sglang", router="cache_aware", in_flight=512 * 4, **common).seconds
        ratios.append(run_rollout(groups, "steal_sglang", predicted=realistic, **common).seconds / slime)
    row = data["rows"][0]
    assert row[1] == 2 and row[2] == pytest.approx(np.mean(ratios), rel=1e-12)
    assert (StealSGLang.STEAL_STARTED, StealSGLang.MIGRATE_CHUNK, StealSGLang.ROOM) == before


def test_simulator_benchmark_rollout_prompt_headroom_plans_on_the_group_medians(tmp_path):
    """rollout_prompt_headroom (quick): per setting, each run planned on every group's true median and run on
    the true lengths, over vLLM + verl; 'best of these' is their minimum; vLLM priority with verl's spread
    is run_rollout's with the medians as predictions; on one replica the FCFS search is vLLM + verl itself."""
    from simulate import run_rollout

    data = _quick_section(tmp_path, "rollout_prompt_headroom")
    from bench_simulate import _rollout_setting

    rows = {(row[0], row[2]): row for row in data["rows"]}
    for replicas in (4, 1):
        row = rows[("castillo", replicas)]
        assert row[11] == min(row[6:11])
        groups, _, _, _, common = _rollout_setting("castillo", 16, replicas, 4, 11, None)
        med = np.concatenate([np.full(len(g.lengths), max(1, int(round(float(np.median(g.lengths))))))
                              for g in groups])
        base = run_rollout(groups, "vllm", **common).seconds
        assert row[4] == base
        assert row[9] == run_rollout(groups, "vllm_priority", predicted=med, **common).seconds / base
    assert rows[("castillo", 1)][6] == 1.0
    assert [s[0] for s in data["summary"]] == ["every setting", "several replicas", "CASTILLO, several replicas",
                                               "one replica"]


def test_simulator_benchmark_rollout_offload_reports_each_run_against_vllm(tmp_path):
    """rollout_offload (quick): one row per OFFLOAD_RUNS entry; steal's row is steal / vLLM + verl as
    run_rollout gives them; the offloaded vLLM row (asynchronous loads) is run_rollout(kv_offload=True) and
    recomputes nothing; with the loads free the same tokens load and the step is faster than with them
    charged as stalls; a stalled run's stall share is its loads' seconds over its replicas' seconds."""
    from lengthsched.runtime.timing import default_cost
    from simulate import run_rollout

    rows = _quick_section(tmp_path, "rollout_offload")["rows"]
    from bench_simulate import OFFLOAD_RUNS, _rollout_setting

    assert [r[0] for r in rows] == [label for label, *_ in OFFLOAD_RUNS]
    by = {r[0]: r for r in rows}
    groups, realistic, _, _, common = _rollout_setting("castillo", 16, 4, 2, 11, None)
    base = run_rollout(groups, "vllm", router="least_loaded", **common)
    steal = run_rollout(groups, "steal", predicted=realistic, **common)
    assert by["steal"][2] == pytest.approx(steal.seconds / base.seconds, rel=1e-12)
    assert base.recomputed_tokens  # this step preempts: the rows below compare something
    assert by["vllm + verl routing, KV offloaded"][6] == 0.0
    assert by["steal"][6] == pytest.approx(steal.recomputed_tokens / base.recomputed_tokens, rel=1e-12)
    for run in ("vllm + verl routing, KV offloaded", "steal, KV offloaded"):
        priced, free = by[run + ", loads as stalls"], by[run + ", free loads"]
        assert free[7] == priced[7] > 0 and free[2] < priced[2]  # the same loads, free: sooner
        assert free[8] == free[9] == by[run][8] == "-" and 0 < priced[8] == priced[9] < 1  # one setting
    offloaded = run_rollout(groups, "vllm", router="least_loaded", kv_offload=True, **common)
    assert by["vllm + verl routing, KV offloaded"][2] == pytest.approx(offloaded.seconds / base.seconds, rel=1e-12)
    stalled = run_rollout(groups, "vllm", router="least_loaded", kv_offload="stall", **common)
    stalls = sum(float(np.sum(default_cost().load_seconds(log.loaded_tokens))) for log in stalled.step_logs)
    assert by["vllm + verl routing, KV offloaded, loads as stalls"][8] == pytest.approx(
        stalls / sum(stalled.replica_seconds))


def test_simulator_benchmark_rollout_resubmit_scores_each_delay_and_restores_steal(tmp_path):
    """rollout_resubmit (quick): per grid, one row per RESUBMIT_VARIANTS entry; the first is steal as it
    runs; the delay rows differ from it; steal's and steal_observed's attributes are left as found."""
    from lengthsched.runtime.dispatch import StealObserved, WorkStealing
    from simulate import run_rollout

    rows = _quick_section(tmp_path, "rollout_resubmit")["rows"]
    from bench_simulate import RESUBMIT_VARIANTS, _rollout_setting

    labels = [label for label, *_ in RESUBMIT_VARIANTS]
    assert [(r[0], r[1]) for r in rows] == [(g, label) for g in ("grid", "scale") for label in labels]
    groups, realistic, _, _, common = _rollout_setting("castillo", 64, 4, 2, 11, None)
    steal = run_rollout(groups, "steal", predicted=realistic, **common).seconds
    base = run_rollout(groups, "vllm", router="least_loaded", **common).seconds
    assert rows[0][3] == pytest.approx(steal / base, rel=1e-12)
    grid = {r[1]: r[3] for r in rows if r[0] == "grid"}
    assert grid[labels[3]] > grid[labels[0]]  # a 1 s wait costs time
    assert WorkStealing.RESUBMIT_SECONDS == 0.0 and WorkStealing.MIGRATE_CHUNK == 128
    assert "RESUBMIT_SECONDS" not in vars(StealObserved) and StealObserved.SNAPSHOT_STEPS is None
    assert StealObserved.SNAPSHOT_SECONDS is None


def test_simulator_benchmark_runs_the_rollout_grid_on_a_groups_file(tmp_path):
    from simulate.workloads import _castillo_rows

    rows = [r for r in _castillo_rows() if r["dataset"] == "DollyDataset"][:40]
    groups = tmp_path / "preproc_DollyDataset.json"
    groups.write_text(json.dumps([{"prompt_id": r["prompt_id"], "input_size": r["prompt_tokens"],
                                   "output_sizes": r["lengths"], "dataset": "DollyDataset"} for r in rows]))
    out = tmp_path / "heldout.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_simulate.py"), "--quick",
                             "--sections", "rollout_heldout", "--groups-file", str(groups), "--out", str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())["rollout_heldout"]
    assert data["file"] == groups.name and {row[0] for row in data["rows"]} == {"DollyDataset (held out)"}
    assert {row[4] for row in data["rows"]} >= {"steal", "vllm + verl routing", "seer"}
    missing = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_simulate.py"), "--quick",
                              "--sections", "rollout_heldout", "--out", str(out)], capture_output=True, text=True,
                             timeout=600)
    assert missing.returncode != 0 and "--groups-file" in missing.stderr
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_simulate.py"), "--quick", "--sections",
                          "rollout_heldout", "--groups-file", str(tmp_path / "nope.json"), "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "error: argument --groups-file: got" in bad.stderr and "a readable CASTILLO JSON file" in bad.stderr


def test_planning_benchmark_runs_quick(tmp_path):
    out = tmp_path / "planning.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_planning.py"), "--quick",
                             "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "### FPTAS time" in result.stdout
    data = json.loads(out.read_text())
    assert {"machine", "plan_group", "fptas", "quality"} <= set(data) and "coordinator" not in data


def test_planning_benchmark_times_a_steal_coordinators_poll(tmp_path):
    """--sections coordinator: one row per case, a steady poll decides nothing, a drain steals; a bad
    section is one readable error."""
    out = tmp_path / "coordinator.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_planning.py"), "--quick",
                             "--sections", "coordinator", "--out", str(out)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(out.read_text())["coordinator"]
    assert row[:3] == [4, 64, 256] and row[3] > 0 and row[4] > 0 and row[5] > 0
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_planning.py"), "--quick",
                          "--sections", "fptas,nope"], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "--sections" in bad.stderr and "coordinator" in bad.stderr


def test_planning_benchmark_times_what_sharing_ranks_read_and_write(tmp_path):
    """--sections share: one row per case; a change file is smaller than the whole file, a rank's own writing per
    step is its change file and an eighth of its whole file, and merging the others' changes is cheaper than
    merging their whole files."""
    out = tmp_path / "share.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_planning.py"), "--quick",
                             "--sections", "share", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(out.read_text())["share"]
    assert row[:3] == [500, 4, 8] and row[4] / 1e3 < row[3] and all(x > 0 for x in row[5:])
    assert row[7] == pytest.approx(row[6] + row[5] / 8) and row[7] < row[5] + row[6]
    assert row[10] < row[9] and row[11] == pytest.approx(row[9] / row[10])


def test_predictor_benchmark_runs_quick(tmp_path):
    out = tmp_path / "predictor.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_predictor.py"), "--quick",
                             "--work", str(tmp_path / "work"), "--out", str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "### Prediction latency" in result.stdout and "### Remaining length after the first k=32" in result.stdout
    data = json.loads(out.read_text())
    assert {"machine", "k0", "longer", "k", "k_comparison", "latency"} <= set(data)
    assert data["longer"][0]["options"]["init_from"] == data["k0"]["options"]["out"]
    assert data["k0_vs_tfidf"][-1][0] == "all" and len(data["longer_vs_tfidf"]) == 1
    assert {"model", "tfidf", "linear", "constant", "ceiling"} <= set(data["k0"]["evaluation"])


def test_predictor_benchmark_crossfit_from_human_quick(tmp_path):
    """Cross-fitting tests every prompt of the eval file once (each half by models trained on the
    other), the k = 0 models start from the GSM8K + Dolly predictor, prompts seen in pretraining are
    left out of the scores."""
    out, work = tmp_path / "predictor.json", tmp_path / "work"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_predictor.py"), "--quick", "--work",
                             str(work), "--out", str(out), "--sections", "crossfit", "--pretrain", "human", "--seeds",
                             "2", "--jobs", "2"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "### Cross-fitted tau-b minus TF-IDF" in result.stdout
    cf = json.loads(out.read_text())["crossfit"]
    preds = json.loads((work / "crossfit_predictions.json").read_text())
    assert len(set(preds["id"])) == len(preds["id"]) and set(preds["fold"]) == {0, 1}
    assert sum(cf["prompts_per_fold"]) + len(cf["left_out_as_seen_in_pretraining"]) == len(preds["id"])
    assert set(cf["left_out_as_seen_in_pretraining"]) <= set(preds["id"])
    assert {"model (seed 0)", "ensemble of 2", "tfidf", "ceiling"} <= set(cf["scores"])
    for fold, seed in ((0, 0), (1, 1)):
        name = "castillo-k0-from-human" + ("" if (fold, seed) == (0, 0) else f"-f{fold}-s{seed}")
        opts = json.loads((work / name / "training_summary.json").read_text())["options"]
        assert opts["init_from"] == str(work / "human-k0") and opts["test_fold"] == fold and opts["seed"] == seed
        assert opts["split_seed"] in (None, 0)


def run_quick(script: str, out) -> dict:
    """Run ``benchmarks/<script> --quick --out OUT`` and return its JSON results."""
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--out", str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


def test_sampler_benchmark_runs_quick(tmp_path):
    data = run_quick("bench_sampler.py", tmp_path / "sampler.json")
    assert {"machine", "device", "policies", "prompt_kv", "generate", "learner"} <= set(data)
    for row in data["policies"]["rows"]:  # the sampler's steps and peak KV are the simulator's and the model's
        assert row["steps"] == row["sim_steps"] and row["peak_kv_bytes"] == row["model_peak_kv_bytes"]


def test_companions_benchmark_runs_quick(tmp_path):
    data = run_quick("bench_companions.py", tmp_path / "companions.json")
    assert {"machine", "sgpo", "sgpo_online", "sgpo_targets", "sgpo_masked", "sgpo_policies", "sparse", "sparse_budget",
            "sparse_admission", "sparse_rollout", "sparse_window", "sparse_crowding", "sparse_sglang_room",
            "sparse_async", "sparse_oversample", "sparse_multiturn", "learner"} <= set(data)
    online = {(c["step"], c["sizing"]): c for c in data["sgpo_online"]}  # two step shapes x five sizings, one seed
    assert len(online) == 10 and all(c["seconds"] > 0 and c["informative"] <= c["completions"] for c in online.values())
    for step in {s for s, _ in online}:  # the first epoch online is the fixed one; only offline profiles
        assert online[step, "online"]["epoch_seconds"][0] == online[step, "fixed"]["epoch_seconds"][0]
        assert online[step, "offline"]["profiling_seconds"] > 0 == online[step, "online"]["profiling_seconds"]
    targets = data["sgpo_targets"]  # pow2 and one informative target, two step shapes, against the fixed G
    assert len(targets) == 4 and all(c["x_fixed_groups"] > 0 < c["x_fixed_completions"] for c in targets)
    masked = {c["sizing"]: c for c in data["sgpo_masked"]}  # slime's way against verl's, one seed
    assert len(masked) == 4 and all(c["seconds"] > 0 and c["informative"] <= c["completions"] for c in masked.values())
    same = [c for c in masked.values() if c["n_samples_per_prompt"] == 16]  # the masked samples cost seconds only
    assert same[0]["completions"] == same[1]["completions"] and same[0]["seconds"] >= same[1]["seconds"] * 0.99
    policies = data["sgpo_policies"]  # three sizings x two step shapes, each under every policy
    assert len(policies) == 6 and all(set(c["seconds"]) == {"vllm", "steal", "seer"} for c in policies)
    # measured: the sampler runs the simulator's schedule, more at once with a cache (a budget of 2 x L_max)
    budget = data["sparse_budget"]
    assert all(row["steps"] == row["sim_steps"] for row in budget)
    assert budget[0]["budget"] is None and all(row["most_at_once"] > budget[0]["most_at_once"] for row in budget[1:])
    dense, *compressed = data["sparse"]
    assert all(c["peak_kv_bytes"] < dense["peak_kv_bytes"] for c in compressed)
    # the simulated compressed cache: a policy reserving L_max runs more at once; the rollout keeps its bound
    admission = {(c["policy"], c["cache"] is None): c for c in data["sparse_admission"]}
    assert admission[("fixed_slot", False)]["max_live"] > admission[("fixed_slot", True)]["max_live"]
    assert all(c["lower_bound_seconds"] <= c["seconds"] for c in data["sparse_rollout"])
    window = data["sparse_window"]  # every run of the client-window section, each setting, a positive ratio
    assert window and all(len(c["x_vllm_dense"]) == 4 and min(c["x_vllm_dense"].values()) > 0 for c in window)
    room = data["sparse_sglang_room"]  # steal_sglang's two rooms with a cache, x SGLang + verl with it
    assert room and all(c["whole_x_sglang"] > 0 < c["capped_x_sglang"] for c in room)
    runs = data["sparse_async"]  # every asynchronous run dense and with the cache, trained tokens per second
    assert runs and all(c["dense_tokens_per_second"] > 0 < c["cache_tokens_per_second"] for c in runs)
    assert len({c["run"] for c in runs}) == 6 and "sync: steal, then the learner" in {c["run"] for c in runs}
    steps = data["sparse_oversample"]  # slime's over-sampled steps dense and with the cache, kept tokens per second
    assert len({c["run"] for c in steps}) == 4 and all(
        c["dense_kept_tokens_per_second"] > 0 < c["cache_kept_tokens_per_second"] for c in steps)
    assert any(c["cache_stale_share"] > 0 for c in steps)  # partial responses resumed under the cache
    turns = data["sparse_multiturn"]  # multi-turn steps dense, without a prefix cache and with the cache
    assert len({c["run"] for c in turns}) == 3 and all(
        c["cache_lower_bound_seconds"] <= c["cache_seconds"] and c["dense_seconds"] > 0 for c in turns)
    crowding = data["sparse_crowding"]  # only the settings where the two crowding rules spread differently
    assert crowding and all(c["ways_whole"] != c["ways_held"] and c["whole_x_vllm"] > 0 < c["held_x_vllm"]
                            for c in crowding)


def test_cost_benchmark_cpu_section_runs_quick(tmp_path):
    """Section cpu of bench_cost.py: the reference sampler's measured CPU steps, fitted and checked on
    held-out steps (a random half, held-out runs, another model's parameters) and whole runs."""
    import math

    out = tmp_path / "cost_cpu.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_cost.py"), "--sections", "cpu",
                             "--quick", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "### Held-out steps" in result.stdout and "### Fitted parameters" in result.stdout
    data = json.loads(out.read_text())
    assert {"machine", "command", "cpu", "section_seconds"} <= set(data)
    cpu = data["cpu"]
    assert cpu["dtype"] == "float32" and cpu["threads"] == 1 and len(cpu["models"]) >= 2

    def finite(stats):
        return stats["n"] > 0 and all(math.isfinite(stats[k]) and stats[k] >= 0 for k in ("median", "p90", "max"))

    for name, m in cpu["models"].items():
        assert m["forward_steps"] > 0 and m["prior"]["gpu"] == "cpu" and m["prior"]["model"] == name
        for kind in ("random", "by_run"):
            assert finite(m[kind]["held_out"]) and finite(m[kind]["prior_held_out"]), (name, kind)
            p = m[kind]["parameters"]
            assert p["overhead_seconds"] >= 0
            assert 0 < p["bandwidth_efficiency"] <= 1 and 0 < p["compute_efficiency"] <= 1
        assert finite(m["by_run"]["total_held_out"])
        assert all(finite(t["held_out"]) for t in m["transfer"].values())
    for kind in ("random", "by_run", "transfer"):
        assert finite(cpu["pooled"][kind]["prior"]) and finite(cpu["pooled"][kind]["fitted"])
    runs = cpu["runs"]
    assert {r["split"] for r in runs} == {"train", "test"}
    assert any(r["preemptions"] > 0 and r["recorded_prefill_tokens"] > 0 for r in runs)  # recomputation steps
    for r in runs:
        assert r["forward_step_seconds"] > 0 and math.isfinite(r["fitted_by_run_total_error"])
        assert len(r["step_samples"]) == r["steps"]


def test_simulator_benchmark_length_classes_need_lengths_per_completion(tmp_path):
    """rollout_classes (quick): on 64 prompts x 16 on 4 replicas with room for everything, the length
    classes planned on the true lengths beat vLLM + verl, planned on the realistic prompt-level
    predictions they lose; the previous epoch's predictions are within ~10% of each group's median."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_simulate import CLASS_PREDICTIONS, previous_epoch_prediction, rollout_groups

    out = tmp_path / "classes.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_simulate.py"), "--quick",
                             "--sections", "rollout_classes", "--out", str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())["rollout_classes"]["rows"]
    assert [row[:4] for row in rows] == [["castillo", 64, 4, "16 x L_max"], ["castillo", 16, 1, "4 x L_max"]]
    labels = [label for label, _ in CLASS_PREDICTIONS]
    classes = {label: rows[0][4 + 2 * i] for i, label in enumerate(labels)}
    assert classes["true lengths"] < 0.95 < 1.05 < classes["prompt-level, sigma 0.5 (realistic)"]
    groups, realistic, _, _ = rollout_groups("castillo", 64, 11)
    predicted, before = previous_epoch_prediction("castillo", 64, 11, groups, realistic)
    assert [g.prompt_id for g in before] == [g.prompt_id for g in groups]
    medians = np.concatenate([np.full(len(g.lengths), np.median(g.lengths)) for g in groups])
    assert np.std(np.log(predicted / medians)) < 0.15 < np.std(np.log(realistic / medians))


def test_simulator_benchmark_rollout_prompts_gives_the_long_tail_prompts(tmp_path):
    """rollout_prompts (quick: the long tail, 64 prompts x 16 on 4 replicas at 4 x L_max): one row per
    prompt workload and run, each the ratio of the run it names to vLLM + verl; the completions are the
    long tail's in every workload, only the prompts differ."""
    from lengthsched import InvalidArgument
    from simulate import run_rollout

    rows = _quick_section(tmp_path, "rollout_prompts")["rows"]
    from bench_simulate import PROMPT_WORKLOADS, PROMPTS_RUNS, _rollout_setting

    assert [(r[0], r[1], r[2]) for r in rows] == [("grid", w, label) for w in PROMPT_WORKLOADS
                                                  for label, *_ in PROMPTS_RUNS]
    bare, with_prompts = (_rollout_setting(w, 64, 4, 4, 11, None) for w in PROMPT_WORKLOADS[:2])
    assert all(g.prompt_len == 0 for g in bare[0]) and min(g.prompt_len for g in with_prompts[0]) > 0
    assert all(np.array_equal(a.lengths, b.lengths) for a, b in zip(bare[0], with_prompts[0]))
    groups, realistic, _, _, common = with_prompts
    base = run_rollout(groups, "vllm", router="least_loaded", **common).seconds
    steal = run_rollout(groups, "steal", predicted=realistic, **common).seconds
    divided = run_rollout(groups, "seer_divided", **common).seconds
    by = {(r[1], r[2]): r for r in rows}
    assert by[(PROMPT_WORKLOADS[1], "steal")][4] == pytest.approx(steal / base, rel=1e-12)
    assert by[(PROMPT_WORKLOADS[1], "seer_divided")][4] == pytest.approx(divided / base, rel=1e-12)
    assert by[(PROMPT_WORKLOADS[1], "seer_divided")][7] == int(divided < steal * (1 - 1e-3))
    assert by[(PROMPT_WORKLOADS[1], "steal")][7] == "-"
    with pytest.raises(InvalidArgument, match="argument 'workload'"):
        _rollout_setting("long tail + prompts", 16, 4, 4, 11, None)


def test_simulator_benchmark_long_tail_prompts_option_checks_its_value(tmp_path):
    """--long-tail-prompts takes 'castillo' or a number of tokens, and not with rollout_prompts (which gives the
    long tail its own prompts): each mistake is one usage line and no file."""
    out = tmp_path / "x.json"
    expected = "expected 'castillo' (the bundled CASTILLO prompts' lengths) or a number of tokens >= 1"
    for value, sections, message in (("abc", "rollout", expected), ("0", "rollout", expected),
                                     ("128", "rollout_prompts", "rollout_prompts gives the long tail its own prompts")):
        result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_simulate.py"), "--quick",
                                 "--sections", sections, "--long-tail-prompts", value, "--out", str(out)],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 2 and message in result.stderr and not out.exists()


def test_simulator_benchmark_rollout_luck_moves_predictions_by_a_token(tmp_path):
    """rollout_luck (quick: two settings, two draws): per setting steal, steal with the published placement
    and vLLM priority, each as published / mean / best / worst over the draws, relative to vLLM + verl; draw 0
    is the published prediction, the others move each completion's by at most one token; the placement
    patch is undone."""
    import simulate.rollout as rollout_module
    from simulate import run_rollout

    data = _quick_section(tmp_path, "rollout_luck")
    from bench_simulate import LUCK_RUNS, _rollout_luck_unit, _rollout_setting, nudged

    rows, summary = data["rows"], data["summary"]
    assert [row[:4] for row in rows] == [["castillo", 64, 4, "4 x L_max"], ["long tail", 64, 4, "4 x L_max"]]
    assert [(r[0], r[1]) for r in summary] == [(w, label) for w in ("castillo", "long tail") for label in LUCK_RUNS]
    groups, realistic, _, _, common = _rollout_setting("castillo", 64, 4, 4, 11, None)
    base = run_rollout(groups, "vllm", router="least_loaded", **common).seconds
    steal = run_rollout(groups, "steal", predicted=realistic, **common).seconds
    assert rows[0][4] == pytest.approx(steal / base, rel=1e-12) == rows[0][8]  # published: the same placement
    for row in rows:
        for i in range(4, 16, 4):  # published, mean, best, worst
            assert row[i + 2] <= row[i + 1] <= row[i + 3] and row[i + 2] <= row[i] <= row[i + 3]
    for draw in (1, 2):
        moved = nudged(realistic, draw)
        assert np.all(np.abs(moved - realistic) <= 1) and moved.min() >= 1 and np.any(moved != realistic)
        assert np.array_equal(moved, nudged(realistic, draw))
    place = rollout_module.place_ways
    out = _rollout_luck_unit(("castillo", 16, 4, 4, 11, None, 1))
    assert rollout_module.place_ways is place
    assert len(out["steal"]) == len(out["vllm_priority"]) == 2 and out["steal"][0] == out["steal, placement fixed"][0]


def test_simulator_benchmark_rollout_online_isolates_what_learning_changes(tmp_path):
    """rollout_online (quick: 16 prompts on 4 replicas at 16 x L_max): vLLM FCFS once, every other policy with
    the prompt-level predictions frozen, the online predictor's own starting predictions frozen, and the
    online predictor learning; the frozen start is what the learning predictor predicts before it sees
    anything, so the last two rows differ only by what it learns."""
    from lengthsched import OnlineLengthPredictor
    from lengthsched.online import fit_spreads
    from simulate import run_rollout
    from simulate.workloads import castillo_validate_lengths

    rows = _quick_section(tmp_path, "rollout_online")["rows"]
    from bench_simulate import _rollout_cost, rollout_groups

    names = [(r[3], r[4]) for r in rows]
    assert names[0] == ("vllm", "prompt-only") and rows[0][6] == 1.0
    for policy in ("vllm_priority", "placed_lpt", "steal"):
        assert [n for p, n in names if p == policy] == ["prompt-only", "online's start, frozen", "online"]
    groups, flat, _, _ = rollout_groups("castillo", 16, 11, lmax=4096)
    starts = np.cumsum([0] + [len(g.lengths) for g in groups[:-1]])
    prior = {g.prompt_id: int(flat[s]) for g, s in zip(groups, starts)}
    online = OnlineLengthPredictor(prior=prior, prior_sigma=0.5, **fit_spreads(castillo_validate_lengths()))
    start = np.maximum(1, np.asarray(online.predict([g.prompt_id for g in groups for _ in g.lengths]).lengths))
    common = dict(replicas=4, budget_tokens=16 * 4096, max_new_tokens=4096, cost=_rollout_cost(None))
    frozen = run_rollout(groups, "steal", predicted=start, **common).seconds
    learning = run_rollout(groups, "steal", predicted=online, **common).seconds
    by = {(r[3], r[4]): r[5] for r in rows}
    assert by[("steal", "online's start, frozen")] == pytest.approx(frozen, rel=1e-12)
    assert by[("steal", "online")] == pytest.approx(learning, rel=1e-12)


def test_simulator_benchmark_rollout_order_compares_steals_orders(tmp_path):
    """rollout_order (quick: CASTILLO 64 x 16 on 4 at 4 x L_max, where steal places whole groups, and the long
    tail 64 x 16 on 4 at 2 x L_max, where it spreads them): one row per order, each the mean / worst of
    steal's makespan over vLLM + verl; "longest_spread" runs longest first where groups are spread only,
    "longest_crowded" where whole groups are placed only."""
    from lengthsched.runtime.dispatch import WorkStealing
    from simulate import run_rollout

    data = _quick_section(tmp_path, "rollout_order")
    rows = data["rows"]
    from bench_simulate import ORDER_RUNS, _rollout_setting
    from common import patched

    assert [(r[0], r[1], r[2]) for r in rows] == [("grid", label, 2) for label, _ in ORDER_RUNS]
    ratios = {}
    for setting in (("castillo", 64, 4, 4), ("long tail", 64, 4, 2)):
        groups, realistic, _, _, common = _rollout_setting(*setting, 11, None)
        base = run_rollout(groups, "vllm", router="least_loaded", **common).seconds
        for order in ("placement", "longest", "longest_spread", "longest_crowded"):
            with patched(WorkStealing, ORDER=order):
                ratios[setting[0], order] = run_rollout(groups, "steal", predicted=realistic, **common).seconds / base
    assert WorkStealing.ORDER == "placement"
    assert ratios["castillo", "longest_spread"] == ratios["castillo", "placement"] != ratios["castillo", "longest"]
    assert ratios["long tail", "longest_spread"] == ratios["long tail", "longest"] != ratios["long tail", "placement"]
    assert ratios["castillo", "longest_crowded"] == ratios["castillo", "longest"]
    assert ratios["long tail", "longest_crowded"] == ratios["long tail", "placement"]
    by = {r[1]: r for r in rows}
    for label, order in ORDER_RUNS:
        mine = [ratios[w, order] for w in ("castillo", "long tail")]
        assert by[label][3] == pytest.approx(np.mean(mine), rel=1e-12) and by[label][5] == pytest.approx(max(mine))
    # per draw (one seed here: the mean), every setting's ratios, and the largest move against the default
    assert [(r[1], r[2]) for r in data["per_draw"]] == [(label, pytest.approx(by[label][3])) for label, _ in ORDER_RUNS]
    assert [s[1:6] for s in data["settings"]] == [["castillo", 64, 4, 4, 11], ["long tail", 64, 4, 2, 11]]
    for label, order in ORDER_RUNS[1:]:
        move = next(m for m in data["moves"] if m[1] == label)
        gaps = {w: ratios[w, order] - ratios[w, "placement"] for w in ("castillo", "long tail")}
        widest = max(gaps, key=lambda w: abs(gaps[w]))
        assert move[2] == pytest.approx(np.mean(np.abs(list(gaps.values()))))
        assert move[3].startswith(widest) and move[5] - move[4] == pytest.approx(gaps[widest])


def test_simulator_benchmark_rollout_staleness_bounds_the_wait_and_pools_draws(tmp_path):
    """rollout_staleness (quick): partial rollout under a staleness limit of one step; no kept group waited more,
    a kept token is at most one step old, nothing is thrown away while waiting; combine_draws.py pools two
    draws' settings into the section's rows (one draw twice: the same means, twice the settings) and names a
    file without the section in one line."""
    data = _quick_section(tmp_path, "rollout_staleness")
    from bench_simulate import STALENESS_RUNS
    from combine_draws import combine, figure

    limited = [r for r in data["rows"] if r[1] == "yes, 1 wait"]
    assert {r[2] for r in limited} == {label for label, *_ in STALENESS_RUNS}
    assert all(r[13] <= 1 and 0 <= r[19] <= 1 and r[14] == 0.0 for r in limited)
    path = tmp_path / "rollout_staleness.json"
    path.write_text(json.dumps({"rollout_staleness": data}))
    twice = combine("rollout_staleness", [str(path), str(path)])
    assert [r[3] for r in twice] == [2 * r[3] for r in data["rows"]]
    assert [r[4] for r in twice] == pytest.approx([r[4] for r in data["rows"]], rel=1e-12)
    figure(twice, str(tmp_path / "staleness.png"), "two draws")
    assert (tmp_path / "staleness.png").stat().st_size > 0 and not list(tmp_path.glob(".*.tmp"))
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "combine_draws.py"), "rollout_partial",
                             str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and result.stderr.count("\n") == 1 and "rollout_partial section" in result.stderr
    from combine_draws import groups_of

    assert groups_of(["rollout_partial", "a", "b", "rollout_staleness", "c"]) == [
        ("rollout_partial", ["a", "b"]), ("rollout_staleness", ["c"])]
    for bad in (["a.json"], ["rollout_partial"]):
        with pytest.raises(SystemExit, match="combine_draws.py: error"):
            groups_of(bad)
    both = tmp_path / "both.png"  # two sections, one figure: the runs they share
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "combine_draws.py"), "rollout_staleness",
                             str(path), "rollout_staleness", str(path), "--figure", str(both)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert both.stat().st_size > 0 and result.stdout.count("### rollout_staleness over 1 draws pooled") == 2


def test_simulator_benchmark_async_rl_against_synchronous_steps(tmp_path):
    """async_rl (quick): AReaL's loop at each staleness bound against synchronous steps; the reference row is 1,
    synchronous rows train only fresh tokens, every asynchronous one some stale ones and at least the
    reference's tokens per second here; combine_draws.py pools it (one draw twice: the same means) and refuses
    a figure of it in one line."""
    data = _quick_section(tmp_path, "async_rl")
    from bench_simulate import ASYNC_RUNS
    from combine_draws import combine

    rows = {r[1]: r for r in data["rows"]}
    assert set(rows) == {label for label, *_ in ASYNC_RUNS} and all(r[2] == 2 for r in rows.values())
    reference = rows[ASYNC_RUNS[0][0]]
    assert reference[3] == reference[4] == reference[5] == reference[9] == reference[10] == 1.0
    outs = [s[5] for s in data["settings"]]
    for label, _, eta, *_ in ASYNC_RUNS:
        r = rows[label]
        if eta is None or eta == 0:  # the stream's first groups, whole: as long as drawn
            assert r[6] == r[7] == 0.0 and r[5] == pytest.approx(r[3]) and r[10] == 1.0
        else:
            assert 0 < r[6] < 1 and r[7] > 0 and r[3] > 1.0
        speed = [(o[label][1] / o[label][0]) / (o[ASYNC_RUNS[0][0]][1] / o[ASYNC_RUNS[0][0]][0]) for o in outs]
        assert r[3] == pytest.approx(np.mean(speed)) and r[4] == pytest.approx(min(speed))
        assert r[5] == pytest.approx(np.mean([(1 - o[label][2]) * x for o, x in zip(outs, speed)]))
        assert 0 <= r[8] < 1
    path = tmp_path / "async_rl.json"
    path.write_text(json.dumps({"async_rl": data}))
    twice = combine("async_rl", [str(path), str(path)])
    assert [r[2] for r in twice] == [2 * r[2] for r in data["rows"]]
    assert [r[3] for r in twice] == pytest.approx([r[3] for r in data["rows"]], rel=1e-12)
    from bench_simulate import ASYNC_PAIRS

    paired = combine("async_rl", [str(path)], paired=True)  # lengthsched inside AReaL's loop against it
    assert [(r[1], r[2]) for r in paired] == list(ASYNC_PAIRS) and all(r[3] == 2 for r in paired)
    for r in paired:
        assert r[5] <= r[4] <= r[6] and r[4] == pytest.approx(
            np.mean([(o[r[1]][1] / o[r[1]][0]) / (o[r[2]][1] / o[r[2]][0]) for o in outs]))
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "combine_draws.py"), "async_rl", str(path),
                             "--figure", str(tmp_path / "x.png")], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and result.stderr.count("\n") == 1 and "--figure" in result.stderr


def _check_paired(tmp_path, section: str, data: dict, pairs) -> None:
    """combine_draws.py pools ``section``'s quick ``data`` into its ``pairs``, each the mean over the settings of
    the first run's tokens per second over the second's, between its lowest and highest."""
    from combine_draws import combine

    path = tmp_path / f"{section}.json"
    path.write_text(json.dumps({section: data}))
    outs = [s[5] for s in data["settings"]]
    paired = combine(section, [str(path)], paired=True)
    assert [(r[1], r[2]) for r in paired] == list(pairs)
    for r in paired:
        assert r[5] <= r[4] <= r[6] and r[4] == pytest.approx(
            np.mean([(o[r[1]][1] / o[r[1]][0]) / (o[r[2]][1] / o[r[2]][0]) for o in outs]))


def test_simulator_benchmark_async_areal_quick(tmp_path):
    """async_areal (quick): lengthsched.integrations.areal inside AReaL's loop; the reference row (AReaL at
    max_staleness 1) is 1, each row's means are its settings', every paired row compares the two runs it names, and
    combine_draws.py pools it with its pairs."""
    data = _quick_section(tmp_path, "async_areal")
    from bench_simulate import AREAL_PAIRS, AREAL_RUNS

    rows = {r[1]: r for r in data["rows"]}
    assert set(rows) == {label for label, *_ in AREAL_RUNS} and all(r[2] == 2 for r in rows.values())
    assert rows[AREAL_RUNS[0][0]][3] == rows[AREAL_RUNS[0][0]][4] == 1.0
    outs = [s[5] for s in data["settings"]]
    for label, *_ in AREAL_RUNS:
        speed = [(o[label][1] / o[label][0]) / (o[AREAL_RUNS[0][0]][1] / o[AREAL_RUNS[0][0]][0]) for o in outs]
        assert rows[label][3] == pytest.approx(np.mean(speed)) and 0 < rows[label][6] < 1  # stale tokens: K >= 1
    _check_paired(tmp_path, "async_areal", data, AREAL_PAIRS)


def test_simulator_benchmark_async_areal_ways_quick(tmp_path):
    """async_areal_ways (quick): the integration with whole groups against AReaL's round robin; its reference and
    AReaL's rows are async_areal's own runs, and combine_draws.py pools its pairs."""
    data = _quick_section(tmp_path, "async_areal_ways")
    from bench_simulate import AREAL_RUNS, AREAL_WAYS_PAIRS, AREAL_WAYS_RUNS

    assert all(AREAL_RUNS[i] in AREAL_WAYS_RUNS for i in (0, 5, 8))
    assert all(run[6]["ways"] == 1 for run in AREAL_WAYS_RUNS if run[3] == "stream")
    rows = {r[1]: r for r in data["rows"]}
    assert set(rows) == {label for label, *_ in AREAL_WAYS_RUNS} and rows[AREAL_RUNS[0][0]][3] == 1.0
    _check_paired(tmp_path, "async_areal_ways", data, AREAL_WAYS_PAIRS)


def test_simulator_benchmark_async_verl_ways_quick(tmp_path):
    """async_verl_ways (quick): verl's integration with whole groups against the recipe and its spread estimate;
    the recipe's and the estimate's rows are async_verl_driver's own runs, every whole-groups run fixes ways=1, and
    combine_draws.py pools its pairs."""
    data = _quick_section(tmp_path, "async_verl_ways")
    from bench_simulate import DRIVER_RUNS, VERL_WAYS_PAIRS, VERL_WAYS_RUNS

    assert all(DRIVER_RUNS[i] in VERL_WAYS_RUNS for i in (0, 2, 4, 5, 8))
    whole = [run for run in VERL_WAYS_RUNS if run not in DRIVER_RUNS]
    assert len(whole) == 3 and all(run[3]["ways"] == 1 and run[3]["router"] == "stream" for run in whole)
    rows = {r[1]: r for r in data["rows"]}
    assert set(rows) == {label for label, *_ in VERL_WAYS_RUNS} and rows[DRIVER_RUNS[0][0]][3] == 1.0
    _check_paired(tmp_path, "async_verl_ways", data, VERL_WAYS_PAIRS)


def test_simulator_benchmark_async_areal_sync_quick(tmp_path):
    """async_areal_sync (quick): the integration at max_staleness 0, whole groups and the estimate against AReaL's
    round robin at 0 (itself 1, no stale token anywhere), and combine_draws.py pools its pairs."""
    data = _quick_section(tmp_path, "async_areal_sync")
    from bench_simulate import AREAL_SYNC_PAIRS, AREAL_SYNC_RUNS

    assert all(run[2] == 0 for run in AREAL_SYNC_RUNS)
    assert {run[6]["ways"] for run in AREAL_SYNC_RUNS[1:]} == {1, None}
    rows = {r[1]: r for r in data["rows"]}
    assert set(rows) == {label for label, *_ in AREAL_SYNC_RUNS} and rows[AREAL_SYNC_RUNS[0][0]][3] == 1.0
    assert all(r[6] == 0 for r in rows.values())  # stale share: none at 0
    _check_paired(tmp_path, "async_areal_sync", data, AREAL_SYNC_PAIRS)


def test_simulator_benchmark_async_areal_bound2_quick(tmp_path):
    """async_areal_bound2 (quick): whole groups at max_staleness 2 against AReaL's round robin and the estimate there
    (async_areal's own runs), and combine_draws.py pools its pairs."""
    data = _quick_section(tmp_path, "async_areal_bound2")
    from bench_simulate import AREAL_BOUND2_PAIRS, AREAL_BOUND2_RUNS, AREAL_RUNS

    assert AREAL_BOUND2_RUNS[:2] == AREAL_RUNS[3:5] and all(run[2] == 2 for run in AREAL_BOUND2_RUNS)
    assert all(run[6]["ways"] == 1 for run in AREAL_BOUND2_RUNS[2:])
    rows = {r[1]: r for r in data["rows"]}
    assert set(rows) == {label for label, *_ in AREAL_BOUND2_RUNS} and rows[AREAL_BOUND2_RUNS[0][0]][3] == 1.0
    _check_paired(tmp_path, "async_areal_bound2", data, AREAL_BOUND2_PAIRS)


def test_simulator_benchmark_async_areal_epochs_quick(tmp_path):
    """async_areal_epochs (quick): the integration on several AReaL ranks over epochs of the same prompts; each
    run's per-epoch and whole-run ratios are against AReaL's round robin on as many ranks (itself 1), each epoch
    trains its steps' tokens, the stream deals the same prompts every epoch in a fresh order, and
    combine_draws.py pools it."""
    data = _quick_section(tmp_path, "async_areal_epochs")
    from bench_simulate import AREAL_EPOCH_RUNS, epoch_columns, epoch_stream
    from combine_draws import combine

    epochs = data["epochs"]
    assert len(data["rows"][0]) == len(epoch_columns(epochs)) and [r[0] for r in data["rows"]] == [
        r[0] for r in AREAL_EPOCH_RUNS]
    outs = [s[4] for s in data["settings"]]
    for row, (label, ranks, *_) in zip(data["rows"], AREAL_EPOCH_RUNS):
        ref = next(r[0] for r in AREAL_EPOCH_RUNS if r[1] == ranks)
        for e in range(epochs):
            ratio = [(o[label][e][1] / o[label][e][0]) / (o[ref][e][1] / o[ref][e][0]) for o in outs]
            assert row[2 + 3 * e] == pytest.approx(np.mean(ratio)) and row[3 + 3 * e] == pytest.approx(min(ratio))
        whole = [sum(t for _, t in o[label]) / sum(x for x, _ in o[label])
                 / (sum(t for _, t in o[ref]) / sum(x for x, _ in o[ref])) for o in outs]
        assert row[-3] == pytest.approx(np.mean(whole))
        if label == ref:
            assert row[2:] == [1.0, 1.0, 0] * (epochs + 1)
    stream, realistic = epoch_stream("castillo", 6, 3, 11)
    ids = [g.prompt_id for g in stream]
    assert len(ids) == 18 and all(sorted(ids[6 * e:6 * e + 6]) == sorted(ids[:6]) for e in range(3))
    assert ids[:6] != ids[6:12] and len(realistic) == sum(len(g.lengths) for g in stream)
    path = tmp_path / "epochs.json"
    path.write_text(json.dumps({"async_areal_epochs": data}))
    assert combine("async_areal_epochs", [str(path)]) == data["rows"]


def test_simulator_benchmark_async_verl_against_synchronous_steps(tmp_path):
    """async_verl (quick): verl's recipe at each threshold against synchronous steps on vLLM's engines; the
    reference row is 1; rows at threshold 0 and the synchronous ones (streamed or not) train only fresh tokens,
    the streamed ones at least the unstreamed ones' tokens per second; combine_draws.py pools it."""
    data = _quick_section(tmp_path, "async_verl")
    from bench_simulate import VERL_RUNS
    from combine_draws import combine

    rows = {r[1]: r for r in data["rows"]}
    assert set(rows) == {label for label, *_ in VERL_RUNS} and all(r[2] == 2 for r in rows.values())
    reference = rows[VERL_RUNS[0][0]]
    assert reference[3] == reference[4] == reference[5] == reference[9] == reference[10] == 1.0
    for label, kind, _, extra, _ in VERL_RUNS:
        r = rows[label]
        if kind == "sync" or extra.get("staleness_threshold") == 0.0:
            assert r[6] == r[7] == 0.0 and r[5] == pytest.approx(r[3]) and r[10] == 1.0
        else:
            assert 0 < r[6] < 1 and r[3] > 1.0
    assert rows["stream: vllm + verl routing, 4 local updates as groups finish"][3] >= reference[3]
    assert rows["stream: vllm + verl routing, 4 local updates as groups finish"][3] == pytest.approx(
        rows["verl fully async: threshold 0, 4 local updates, batch in flight"][3])  # the same loop
    path = tmp_path / "async_verl.json"
    path.write_text(json.dumps({"async_verl": data}))
    twice = combine("async_verl", [str(path), str(path)])
    assert [r[3] for r in twice] == pytest.approx([r[3] for r in data["rows"]], rel=1e-12)
    # lengthsched inside the recipe against the recipe, setting by setting (each setting twice: two "draws")
    from bench_simulate import VERL_PAIRS, paired_rows

    paired = combine("async_verl", [str(path), str(path)], paired=True)
    assert [(r[1], r[2]) for r in paired] == list(VERL_PAIRS) and all(r[3] == 4 for r in paired)
    for r in paired:
        assert r[5] <= r[4] <= r[6] and 0 <= r[7] <= 4 and r[9] <= r[8] + 1e-12
        by_setting = [(o[5][r[1]][1] / o[5][r[1]][0]) / (o[5][r[2]][1] / o[5][r[2]][0]) for o in data["settings"]]
        assert r[4] == pytest.approx(np.mean(by_setting)) and r[7] == 2 * sum(x < 0.999 for x in by_setting)
    same = paired_rows(data["settings"], ((VERL_RUNS[0][0], VERL_RUNS[0][0]),))
    assert same[0][4:7] == [1.0, 1.0, 1.0] and same[0][7] == 0 and same[0][10] == 0.0


def test_slime_dynamic_sampling_quick(tmp_path):
    """slime_dynamic_sampling (quick): per mode one row per run of DYNAMIC_RUNS and one for the previous model; the
    ratios are kept tokens per second over slime's in the same mode, as run_oversampled_steps gives them."""
    data = _quick_section(tmp_path, "slime_dynamic_sampling")
    import bench_simulate as bench

    from simulate.oversampling import run_oversampled_steps

    labels = [label for label, _ in bench.DYNAMIC_RUNS]
    modes = {tuple(s[4]) for s in data["settings"]}
    assert len(data["rows"]) == len(modes) * (len(labels) + 1)
    assert all(row[3] in labels or row[3].startswith("slime, previous model") for row in data["rows"])
    w, b, r, f, mode, out = data["settings"][0]
    over, carry, valid = mode
    need = bench.DYNAMIC_STEPS * int(np.ceil(b * over - 1e-9)) * 2
    groups, realistic, _, _, common = bench._rollout_setting(w, min(need, 3598), r, f, bench.ROLLOUT_SEED, None)
    slime = run_oversampled_steps(groups, "sglang", batch=b, oversample=over, steps=bench.DYNAMIC_STEPS,
                                  partial=carry, in_flight=bench.SLIME_CONCURRENCY * r, valid=valid,
                                  filter_seed=bench.ROLLOUT_SEED, refill=True, router="cache_aware", **common)
    assert out[labels[0]][0] == pytest.approx(slime.kept_tokens_per_second)
    first = [row for row in data["rows"] if (row[0], row[1] == "yes") == (over, carry)]
    assert first[0][5] == 1.0 and first[1][5] == pytest.approx(out[labels[1]][0] / out[labels[0]][0])


def test_slime_difficulty_quick(tmp_path):
    """slime_difficulty (quick): one row per run of DIFFICULTY_RUNS; the reference is slime under the difficulty
    model's filter as run_oversampled_steps gives it; an empty history changes nothing (the first epoch);
    combine_draws.py pools two copies of a draw into the same rows."""
    data = _quick_section(tmp_path, "slime_difficulty")
    import bench_simulate as bench
    from combine_draws import combine

    from simulate.difficulty import filter_passes, pass_rates
    from simulate.oversampling import run_oversampled_steps

    labels = [label for label, *_ in bench.DIFFICULTY_RUNS]
    assert [row[2] for row in data["rows"]] == labels
    w, b, r, f, (over, carry), out = data["settings"][0]
    need = bench.DYNAMIC_STEPS * int(np.ceil(b * over - 1e-9)) * 2
    groups, _, _, _, common = bench._rollout_setting(w, need, r, f, bench.ROLLOUT_SEED, None)
    flags = filter_passes(pass_rates(groups, seed=bench.ROLLOUT_SEED), len(groups[0].lengths),
                          seed=bench.ROLLOUT_SEED, epoch=1)
    slime = run_oversampled_steps(groups, "sglang", batch=b, oversample=over, steps=bench.DYNAMIC_STEPS,
                                  partial=carry, in_flight=bench.SLIME_CONCURRENCY * r, valid=flags, refill=True,
                                  router="cache_aware", **common)
    assert out[labels[0]][0] == pytest.approx(slime.kept_tokens_per_second)
    assert out[labels[3]] == out[labels[0]]  # no history yet: slime's own order
    assert data["rows"][0][4] == 1.0 and data["rows"][2][4] == pytest.approx(out[labels[2]][0] / out[labels[0]][0])
    path = tmp_path / "slime_difficulty.json"
    assert combine("slime_difficulty", [str(path), str(path)]) == [
        row[:3] + [row[3] * 2] + row[4:7] + [row[7] * 2] + row[8:] for row in data["rows"]]


def test_slime_difficulty_drift_quick(tmp_path):
    """slime_difficulty_drift (quick): per drift and epochs recorded, one row per run of DRIFT_RUNS against slime in
    the same epoch; slime's number is run_oversampled_steps' under that epoch's filter; only the skipping rows skip,
    and they skip more with more epochs recorded; combine_draws.py pools two copies of a draw into the same rows."""
    data = _quick_section(tmp_path, "slime_difficulty_drift")
    import bench_simulate as bench
    from combine_draws import combine

    from simulate.difficulty import filter_passes, learnt_rates, pass_rates
    from simulate.oversampling import run_oversampled_steps

    rows = data["rows"]
    assert len(rows) == len(bench.DRIFTS) * len(bench.HISTORY_EPOCHS) * len(bench.DRIFT_RUNS)
    assert [row[4] for row in rows[:4]] == list(bench.DRIFT_RUNS)
    assert all(row[6] == 1.0 for row in rows[::4])  # slime against itself
    assert all(row[9] == 0.0 and row[10] == 0.0 for i, row in enumerate(rows) if i % 4 < 2)  # nothing skipped
    skips = {(row[2], row[3]): row[9] for row in rows if "selective" in row[4]}
    assert all(skips[(d, 4)] > skips[(d, 1)] > 0 for d in bench.DRIFTS)
    w, b, r, f, (over, carry), out = data["settings"][0]
    need = bench.DYNAMIC_STEPS * int(np.ceil(b * over - 1e-9)) * 2
    groups, _, _, _, common = bench._rollout_setting(w, need, r, f, bench.ROLLOUT_SEED, None)
    rates = learnt_rates(pass_rates(groups, seed=bench.ROLLOUT_SEED), 4, drift=0.5, seed=bench.ROLLOUT_SEED)
    flags = filter_passes(rates, len(groups[0].lengths), seed=bench.ROLLOUT_SEED, epoch=4)
    slime = run_oversampled_steps(groups, "sglang", batch=b, oversample=over, steps=bench.DYNAMIC_STEPS,
                                  partial=carry, in_flight=bench.SLIME_CONCURRENCY * r, valid=flags, refill=True,
                                  router="cache_aware", **common)
    assert out[f"0.5|4|{bench.DRIFT_RUNS[0]}"][0] == pytest.approx(slime.kept_tokens_per_second)
    path = tmp_path / "slime_difficulty_drift.json"
    assert combine("slime_difficulty_drift", [str(path), str(path)]) == [
        row[:5] + [row[5] * 2] + row[6:8] + [row[8] * 2] + row[9:] for row in rows]


def test_slime_order_horizon_quick(tmp_path):
    """slime_order_horizon (quick): one row per run of HORIZON_RUNS, each against slime under the same drift; a
    mark's kept tokens per second is what a run of that many steps gives (a step does not depend on the steps after
    it), checked against run_oversampled_steps for slime and for the order after the first mark;
    combine_draws.py pools two copies of a draw into the same rows."""
    data = _quick_section(tmp_path, "slime_order_horizon")
    import bench_simulate as bench
    from combine_draws import combine

    from lengthsched.filtering import FilterHistory
    from simulate.difficulty import filter_passes, pass_rates, run_epochs
    from simulate.oversampling import run_oversampled_steps

    rows, labels = data["rows"], [label for label, *_ in bench.HORIZON_RUNS]
    assert [row[2] for row in rows] == labels and data["marks"] == list(bench.HORIZON_MARKS)
    bases = [i for i, (label, *_) in enumerate(bench.HORIZON_RUNS) if label.startswith("slime as it ships")]
    assert len(bases) == 2 and all(rows[i][4:8] == [1.0] * 4 for i in bases)  # slime against itself, per drift
    w, b, r, f, (over, carry), out = data["settings"][0]
    need = bench.HORIZON_STEPS * int(np.ceil(b * over - 1e-9)) * 3
    groups, _, _, _, common = bench._rollout_setting(w, need, r, f, bench.ROLLOUT_SEED, None)
    size, seed = len(groups[0].lengths), bench.ROLLOUT_SEED
    rates = pass_rates(groups, seed=seed)
    flags = filter_passes(rates, size, seed=seed, epoch=1)
    shared = dict(batch=b, oversample=over, steps=bench.HORIZON_MARKS[0], partial=carry, valid=flags, refill=True,
                  in_flight=bench.SLIME_CONCURRENCY * r, filter_seed=seed, router="cache_aware", **common)
    slime = run_oversampled_steps(groups, "sglang", **shared)
    history = FilterHistory()
    run_epochs(groups, rates, size, 1, history, seed=seed)
    ordered = run_oversampled_steps(groups, "sglang", filter_history=history, **shared)
    assert out[labels[0]][0][0] == pytest.approx(slime.kept_tokens_per_second)
    assert out[labels[1]][0][0] == pytest.approx(ordered.kept_tokens_per_second)
    assert rows[1][4] == pytest.approx(ordered.kept_tokens_per_second / slime.kept_tokens_per_second)
    assert out[labels[0]][1][0] == pytest.approx(slime.filtered_share)
    path = tmp_path / "slime_order_horizon.json"
    assert combine("slime_order_horizon", [str(path), str(path)]) == [
        row[:3] + [row[3] * 2] + row[4:9] + [row[9] * 2] + row[10:] for row in rows]


def test_verl_dapo_skip_quick(tmp_path):
    """verl_dapo_skip (quick): one row per run of VERL_DAPO_RUNS, each against verl as it ships under the same drift;
    verl's run after the first mark is run_oversampled_steps with verl's rule; combine_draws.py pools two copies of
    a draw into the same rows."""
    data = _quick_section(tmp_path, "verl_dapo_skip")
    import bench_simulate as bench
    from combine_draws import combine

    from simulate.difficulty import filter_passes, pass_rates
    from simulate.oversampling import run_oversampled_steps

    rows, labels = data["rows"], [label for label, *_ in bench.VERL_DAPO_RUNS]
    assert [row[1] for row in rows] == labels and data["marks"] == list(bench.HORIZON_MARKS)
    bases = [i for i, (label, *_) in enumerate(bench.VERL_DAPO_RUNS) if "as it ships" in label]
    assert len(bases) == 2 and all(rows[i][3:7] == [1.0] * 4 for i in bases)  # verl against itself, per drift
    skips = [i for i, (_, _, _, skip, *_) in enumerate(bench.VERL_DAPO_RUNS) if skip]
    assert all(rows[i][-2] > 0 for i in skips) and all(rows[i][-2] == 0 for i in range(len(rows)) if i not in skips)
    w, b, r, f, (inflight,), out = data["settings"][0]
    groups, _, _, _, common = bench._rollout_setting(w, bench.HORIZON_STEPS * b * 6, r, f, bench.ROLLOUT_SEED, None)
    seed = bench.ROLLOUT_SEED
    flags = filter_passes(pass_rates(groups, seed=seed), len(groups[0].lengths), seed=seed, epoch=1)
    verl = run_oversampled_steps(groups, "vllm", batch=b, oversample=1.0, steps=bench.HORIZON_MARKS[0],
                                 partial=False, valid=flags, refill=True, refill_rule="verl", refill_cap=inflight * b,
                                 refill_poll=bench.VERL_POLL_SECONDS, in_flight=10**9, filter_seed=seed,
                                 router="least_loaded", **common)
    assert out[labels[0]][0][0] == pytest.approx(verl.kept_tokens_per_second)
    assert out[labels[0]][1][0] == pytest.approx(verl.filtered_share)
    need = run_oversampled_steps(groups, "vllm", batch=b, oversample=1.0, steps=bench.HORIZON_MARKS[0],
                                 partial=False, valid=flags, refill=True, refill_rule="verl", refill_cap=inflight * b,
                                 refill_need=True, refill_poll=bench.VERL_POLL_SECONDS, in_flight=10**9,
                                 filter_seed=seed, router="least_loaded", **common)
    assert out[labels[1]][0][0] == pytest.approx(need.kept_tokens_per_second)
    path = tmp_path / "verl_dapo_skip.json"
    assert combine("verl_dapo_skip", [str(path), str(path)]) == [
        row[:2] + [row[2] * 2] + row[3:8] + [row[8] * 2] + row[9:] for row in rows]


def test_slime_cold_start_quick(tmp_path):
    """slime_cold_start (quick): one row per run of SLIME_COLD_RUNS; the per-setting ratios are the runs'
    makespans over slime as it ships, as run_slime_planned gives them; the first step as the integration ships
    (its default predictor told nothing) is slime's own step exactly."""
    data = _quick_section(tmp_path, "slime_cold_start")
    import bench_simulate as bench

    from simulate import run_rollout, run_slime_planned

    labels = [label for label, *_ in bench.SLIME_COLD_RUNS]
    assert [row[0] for row in data["rows"]] == labels
    first = data["settings"][0]
    groups, realistic, _, _, common = bench._rollout_setting(*first[:4], bench.ROLLOUT_SEED, None)
    cap = bench.SLIME_CONCURRENCY * first[2]
    base = run_rollout(groups, "sglang", router="cache_aware", in_flight=cap, **common).seconds
    planned = run_slime_planned(groups, realistic, in_flight=cap, **common)[0].seconds
    assert first[4] == round(planned / base, 4)
    shipped = 4 + [pred for _, pred, _ in bench.SLIME_COLD_RUNS].index("default")
    assert all(row[shipped] == 1.0 for row in data["settings"])
    for row in data["rows"]:
        assert row[1] == len(data["settings"]) and row[4] + row[5] <= row[1] and row[3] >= row[2] - 1e-12


def test_rollout_cold_start_quick(tmp_path):
    """rollout_cold_start (quick): one row per run of COLD_START_RUNS, the per-setting ratios are the runs'
    makespans over vLLM + verl's as run_rollout gives them, and stealing over verl's spread with the made-up
    length is never slower than verl's spread with vLLM by more than 0.1% there."""
    data = _quick_section(tmp_path, "rollout_cold_start")
    import bench_simulate as bench

    from simulate import run_rollout

    assert [row[0] for row in data["rows"]] == [label for label, *_ in bench.COLD_START_RUNS]
    first = data["settings"][0]
    groups, realistic, _, _, common = bench._rollout_setting(*first[:4], bench.ROLLOUT_SEED, None)
    base = run_rollout(groups, "vllm", router="least_loaded", **common).seconds
    assert first[4] == round(run_rollout(groups, "steal", predicted=realistic, **common).seconds / base, 4)
    spread_cold = [label for label, pred, over in bench.COLD_START_RUNS if pred == "cold" and over][0]
    column = 4 + [label for label, *_ in bench.COLD_START_RUNS].index(spread_cold)
    assert all(row[column] <= 1.001 for row in data["settings"])


def test_rollout_multiturn_quick(tmp_path):
    """rollout_multiturn (quick): one row per MULTITURN_RUNS row against vLLM FCFS with verl's sticky routing; a
    setting's ratios are run_multiturn's makespans, the baseline against itself 1; only steal that follows turns
    moves later turns."""
    data = _quick_section(tmp_path, "rollout_multiturn")
    import bench_simulate as bench

    from simulate import run_multiturn, split_turns

    rows = data["rows"]
    assert [row[0] for row in rows] == [label for label, *_ in bench.MULTITURN_RUNS]
    assert rows[0][2:5] == [1.0, 1.0, 1.0] and rows[0][8] == 0.0
    moves = [row[8] for row in rows]
    followed = [i for i, (_, policy, options, _) in enumerate(bench.MULTITURN_RUNS)
                if (policy.startswith("steal") and options.get("follow_turns", True)) or "router" in options]
    assert moves[5] > 0 and all(m == 0 for i, m in enumerate(moves) if i not in followed)
    w, b, r, f, tool, base, bound, *ratios = data["settings"][0]
    groups, realistic, _, _ = bench.rollout_groups(w, b, bench.ROLLOUT_SEED)
    turns = split_turns(groups, tool_seconds=tool, tool_sigma=0.5, seed=bench.ROLLOUT_SEED)
    kwargs = dict(replicas=r, budget_tokens=f * bench.MULTITURN_CONTEXT, max_new_tokens=4096)
    verl = run_multiturn(groups, turns, "vllm", **kwargs)
    followed = run_multiturn(groups, turns, "steal", predicted=realistic, **kwargs)
    assert base == pytest.approx(verl.seconds) and bound == pytest.approx(verl.lower_bound_seconds / verl.seconds)
    assert ratios[4] == pytest.approx(followed.seconds / verl.seconds)


def test_rollout_multiturn_slime_quick(tmp_path):
    """rollout_multiturn_slime (quick): one row per MULTITURN_SLIME_RUNS row against slime as it ships (SGLang's
    router on every turn); a setting's ratios are run_multiturn_row's makespans; only the routed and stealing runs
    move later turns, the integration's pinned sessions never."""
    data = _quick_section(tmp_path, "rollout_multiturn_slime")
    import bench_simulate as bench

    from simulate import split_turns
    from simulate.multiturn import MULTITURN_SLIME_RUNS, run_multiturn_row

    rows = data["rows"]
    assert [row[0] for row in rows] == [label for label, *_ in MULTITURN_SLIME_RUNS]
    assert rows[0][2:5] == [1.0, 1.0, 1.0] and rows[0][8] > 0  # slime's router sends some later turns elsewhere
    pinned = [i for i, (_, policy, options, _) in enumerate(MULTITURN_SLIME_RUNS)
              if policy == "slime" or (policy in ("sglang", "vllm") and "router" not in options)]
    assert all(rows[i][8] == 0 for i in pinned)
    w, b, r, f, tool, base, bound, *ratios = data["settings"][0]
    groups, realistic, _, _ = bench.rollout_groups(w, b, bench.ROLLOUT_SEED)
    turns = split_turns(groups, tool_seconds=tool, tool_sigma=0.5, seed=bench.ROLLOUT_SEED)
    kwargs = dict(replicas=r, budget_tokens=f * bench.MULTITURN_CONTEXT, max_new_tokens=4096)
    _, policy, options, _ = MULTITURN_SLIME_RUNS[0]
    slime = run_multiturn_row(policy, options, groups, turns, None, **kwargs)
    _, policy, options, _ = MULTITURN_SLIME_RUNS[2]
    planned = run_multiturn_row(policy, options, groups, turns, realistic, **kwargs)
    assert base == pytest.approx(slime.seconds) and ratios[1] == pytest.approx(planned.seconds / slime.seconds)


def test_rollout_multiturn_offload_quick(tmp_path):
    """rollout_multiturn_offload (quick): one row per MULTITURN_OFFLOAD_RUNS row against vLLM + verl without
    offloading; offloading turns evicted conversations into hits (more later turns cached); a setting's ratio is
    run_multiturn's."""
    data = _quick_section(tmp_path, "rollout_multiturn_offload")
    import bench_simulate as bench

    from simulate import run_multiturn, split_turns

    rows = data["rows"]
    assert [row[0] for row in rows] == [label for label, *_ in bench.MULTITURN_OFFLOAD_RUNS]
    assert rows[0][2:5] == [1.0, 1.0, 1.0] and rows[1][7] >= rows[0][7]
    w, b, r, f, tool, base, bound, *ratios = data["settings"][0]
    groups, _, _, _ = bench.rollout_groups(w, b, bench.ROLLOUT_SEED)
    turns = split_turns(groups, tool_seconds=tool, tool_sigma=0.5, seed=bench.ROLLOUT_SEED)
    kwargs = dict(replicas=r, budget_tokens=f * bench.MULTITURN_CONTEXT, max_new_tokens=4096)
    offload = run_multiturn(groups, turns, "vllm", kv_offload=True, **kwargs)
    assert ratios[0] == pytest.approx(offload.seconds / base)


def test_multiturn_speed_quick(tmp_path):
    """multiturn_speed (quick): a wall time for every MULTITURN_RUNS run on each workload, the step's turns counted."""
    data = _quick_section(tmp_path, "multiturn_speed")
    import bench_simulate as bench

    rows = data["rows"]
    assert [row[2] for row in rows] == [label for label, *_ in bench.MULTITURN_RUNS] * 2
    assert {row[0] for row in rows} == {"castillo", "long tail"}
    assert all(row[3] > 64 * 16 and row[4] > 0 for row in rows)
