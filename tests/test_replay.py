"""benchmarks/gpu_replay.py: the simulated steps it replays, the shapes it runs and its estimator
(docs/benchmarks.md, "Modelled seconds against measured ones"), and RolloutResult.step_logs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lengthsched.runtime.timing import default_cost
from simulate import run_rollout
from simulate.workloads import Group

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_replay  # noqa: E402


def _quick_replay(*args: str) -> subprocess.CompletedProcess:
    """benchmarks/gpu_replay.py --device cpu --quick ARGS (the code path only: a tiny model on the CPU)."""
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_replay.py"), "--device", "cpu", "--quick",
                           *args], capture_output=True, text=True, timeout=600)


def _groups(n: int = 12, size: int = 8, seed: int = 0) -> tuple[list[Group], np.ndarray]:
    rng = np.random.default_rng(seed)
    groups = [Group(lengths=rng.integers(20, 900, size=size), prompt_len=int(rng.integers(30, 300)), prompt_id=f"p{i}")
              for i in range(n)]
    pred = np.concatenate([np.full(size, int(np.median(g.lengths))) for g in groups])
    return groups, pred


@pytest.mark.parametrize("policy, router", [("vllm", "least_loaded"), ("vllm_priority", "group_round_robin"),
                                            ("seer", None), ("steal", None)])
def test_step_logs_are_what_each_replica_is_priced_for(policy, router):
    """Every replica's StepLog, priced by the rollout's cost, is its modelled seconds; its prefill
    tokens add up to the result's."""
    groups, pred = _groups()
    cost = default_cost()
    r = run_rollout(groups, policy, router=router, replicas=3, budget_tokens=3000, max_new_tokens=1024,
                    predicted=pred, cost=cost)
    assert len(r.step_logs) == 3
    for log, seconds in zip(r.step_logs, r.replica_seconds):
        assert log.seconds(cost) == pytest.approx(seconds, rel=1e-9)
    assert sum(int(log.prefill_tokens.sum()) for log in r.step_logs) == r.prefill_tokens


def test_expand_gives_every_step_its_shape_and_price():
    groups, pred = _groups(seed=1)
    cost = default_cost()
    r = run_rollout(groups, "vllm", replicas=2, budget_tokens=2500, max_new_tokens=1024, predicted=pred, cost=cost)
    for log in r.step_logs:
        steps = gpu_replay.expand(log, cost)
        assert len(steps["rows"]) == int(log.steps.sum())
        assert steps["seconds"].sum() == pytest.approx(log.seconds(cost), rel=1e-9)
        for name in ("prefill_tokens", "prefill_context", "loaded_tokens"):
            assert steps[name].sum() == getattr(log, name).sum()
        # a run of steps reads `rows` more KV tokens each step
        first = np.concatenate([[0], np.cumsum(log.steps)[:-1]])
        assert np.array_equal(steps["kv"][first], log.kv_first)
        long = np.flatnonzero(log.steps > 1)
        if long.size:
            i = long[0]
            assert steps["kv"][first[i] + 1] - steps["kv"][first[i]] == log.rows[i]


def test_a_step_that_only_loads_kv_is_kept_as_modelled_not_replayed():
    """A synchronous KV load from host memory is priced in a step's seconds but no forward pass runs it:
    expand's compute_seconds leave it out (a step that only loads has none, so it is never drawn: drawing
    it crashed a replay of seer_divided on an H100), and the rollout's step seconds are the compute."""
    from types import SimpleNamespace

    cost = default_cost()
    log = SimpleNamespace(steps=np.array([3, 1, 2]), rows=np.array([4, 0, 5]), kv_first=np.array([400, 0, 900]),
                          prefill_tokens=np.array([0, 0, 64]), prefill_context=np.array([0, 0, 64 * 65 // 2]),
                          loaded_tokens=np.array([0, 3000, 500]))
    steps = gpu_replay.expand(log, cost)
    loads = np.array([0, 0, 0, cost.load_seconds(3000), cost.load_seconds(500), 0])
    assert steps["compute_seconds"] == pytest.approx(steps["seconds"] - loads, rel=1e-12)
    assert steps["compute_seconds"][3] == 0 < steps["seconds"][3]
    assert gpu_replay.replay_shape(0, 0, 0, 0) == ("prefill", 0, 0, 0, 1, True)  # nothing to run


@settings(max_examples=200, deadline=None)
@given(tokens=st.integers(1, 8192), share=st.floats(0.0, 1.0), rows=st.integers(0, 64), kv=st.integers(0, 10**6))
def test_replay_shape_matches_the_token_pairs(tokens, share, rows, kv):
    """Prefill tokens run as p sequences whose token pairs match the logged ones (between one token per
    sequence and one causal sequence), within the rounding of a piece's length."""
    one = tokens * (tokens + 1) // 2
    context = int(tokens + share * (one - tokens))
    kind, r, n, chunk, pieces, exact = gpu_replay.replay_shape(rows, kv if rows else 0, tokens, context)
    if rows:
        assert kind == "mixed" and r == rows and n == max(1, round(kv / rows))
        total = chunk
    else:
        assert kind == "prefill" and r == 0 and chunk == 0
        total = n
    assert exact and 1 <= pieces <= tokens and total % pieces == 0 and tokens <= total < tokens + pieces
    s = total // pieces
    pairs = pieces * s * (s + 1) // 2
    assert pairs == pytest.approx(context, rel=0.5, abs=tokens)
    if rows:
        assert gpu_replay.replay_shape(rows, kv, 0, 0) == ("decode", rows, max(1, round(kv / rows)), 0, 1, True)


def test_replay_shape_flags_a_chunk_after_a_cached_prefix():
    assert gpu_replay.replay_shape(0, 0, 100, 100 * 101 // 2 + 5000) == ("prefill", 0, 100, 0, 1, False)
    assert gpu_replay.replay_shape(4, 400, 100, 100 * 101 // 2 + 1) == ("mixed", 4, 100, 100, 1, False)


def test_estimator_is_exact_when_the_model_is_off_by_one_factor():
    """If every step measures c times its modelled seconds, each replica's estimate is c times its
    modelled seconds whatever was drawn, and the measured ratios between policies are the modelled ones
    (the bootstrap interval collapses on them)."""
    runs = [{"policy": "a", "seconds": 10.0, "replica_seconds": [10.0, 8.0], "preemptions": 0,
             "recomputed_tokens": 0, "lower_bound_seconds": 5.0, "steps": []},
            {"policy": "b", "seconds": 9.0, "replica_seconds": [7.0, 9.0], "preemptions": 0,
             "recomputed_tokens": 0, "lower_bound_seconds": 5.0, "steps": []}]
    rng = np.random.default_rng(0)
    draws = [[{"replica": int(rng.integers(2)), "modelled": m, "measured": 2.5 * m, "exact": True}
              for m in rng.uniform(0.001, 0.02, size=30)] for _ in runs]
    draws[1][0]["replica"], draws[1][1]["replica"] = 0, 1  # both replicas drawn
    assert gpu_replay.estimate(runs[0], draws[0]) == pytest.approx([25.0, 20.0])
    report = gpu_replay.report(runs, draws, seed=0, resamples=50)["policies"]
    assert report[1]["measured_vs_baseline"] == pytest.approx(0.9) == report[1]["modelled_vs_baseline"]
    assert report[1]["measured_vs_baseline_95"] == pytest.approx([0.9, 0.9])
    assert report[0]["measured_over_modelled"]["median"] == pytest.approx(2.5)
    # a replica with no draw keeps the pooled ratio
    only = [d for d in draws[0] if d["replica"] == 0]
    assert gpu_replay.estimate(runs[0], only) == pytest.approx([25.0, 20.0])
    # seconds with no step to run (a wait for a KV load, a resubmission's round trip) are kept as modelled
    waiting = {**runs[0], "replica_step_seconds": [9.0, 8.0]}
    assert gpu_replay.estimate(waiting, draws[0]) == pytest.approx([1.0 + 22.5, 20.0])


def test_gpu_replay_script_runs_on_cpu_quick(tmp_path):
    """The replay's code path (no GPU evidence): every policy simulated, steps drawn and timed, the report
    written with each policy's modelled and measured makespan; a bad --policies is one usage line."""
    out = tmp_path / "replay.json"
    result = _quick_replay("--policies", "vllm:least_loaded,steal", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["card"] == "cpu" and "not GPU evidence" in report["note"] and report["draws_per_policy"] == 20
    base, steal = report["policies"]
    assert (base["policy"], steal["policy"]) == ("vllm + least_loaded", "steal")
    assert base["measured_vs_baseline"] == 1.0 and base["modelled_vs_baseline"] == 1.0
    assert steal["draws"] == 20 and steal["measured_seconds"] > 0 and len(steal["measured_vs_baseline_95"]) == 2
    # the report keeps what the estimate needs: each replica's modelled seconds and every draw
    for entry, (_, draws) in zip(report["policies"], report["samples"]):
        run = {"replica_seconds": entry["modelled_replica_seconds"],
               "replica_step_seconds": entry["modelled_replica_step_seconds"]}
        assert max(entry["modelled_replica_seconds"]) == pytest.approx(entry["modelled_seconds"])
        assert gpu_replay.estimate(run, draws).tolist() == pytest.approx(entry["measured_replica_seconds"])
    assert len(report["samples"]) == 2 and all(d["measured"] > 0 and d["modelled"] > 0
                                               for _, draws in report["samples"] for d in draws)
    bad = _quick_replay("--policies", "vllm:nowhere", "--out", str(tmp_path / "bad.json"))
    assert bad.returncode == 2 and "'nowhere' is not a router" in bad.stderr and not (tmp_path / "bad.json").exists()
    bad = _quick_replay("--long-tail-prompts", "castillo", "--out", str(tmp_path / "bad.json"))
    assert bad.returncode == 2 and "only with --workload 'long tail'" in bad.stderr
    assert not (tmp_path / "bad.json").exists()


def _fake_run(name: str, replica_steps: list[np.ndarray]) -> dict:
    """A run as :func:`gpu_replay.simulate` returns it, with the given compute seconds per step on each replica."""
    steps = [{"compute_seconds": np.asarray(s, dtype=np.float64), "seconds": np.asarray(s, dtype=np.float64),
              "rows": np.arange(len(s))} for s in replica_steps]
    secs = [float(np.sum(s)) for s in replica_steps]
    return {"policy": name, "seconds": max(secs), "replica_seconds": secs, "preemptions": 0, "recomputed_tokens": 0,
            "lower_bound_seconds": 1.0, "steps": steps}


def test_allocate_shares_the_draws_equally_between_the_replicas_with_steps():
    assert gpu_replay.allocate(np.array([5.0, 1.0, 0.0, 2.0]), 10).tolist() == [4, 3, 0, 3]
    assert gpu_replay.allocate(np.array([5.0, 1.0, 2.0]), 2).tolist() == [1, 1, 0]
    assert gpu_replay.allocate(np.array([0.0, 0.0]), 5).tolist() == [0, 0]
    assert gpu_replay.allocate(np.array([1.0]), 0).tolist() == [0]


def test_draw_plan_draws_the_same_steps_where_two_policies_ran_the_same_replica():
    """Common random numbers: a replica with the same steps in two runs is drawn alike (whatever the
    other replicas ran); the draws interleave the replicas and fall on steps in proportion to their
    seconds."""
    rng = np.random.default_rng(3)
    shared = rng.uniform(0.001, 0.01, 500)
    a = _fake_run("a", [shared, rng.uniform(0.001, 0.01, 300), rng.uniform(0.001, 0.01, 200)])
    b = _fake_run("b", [shared, rng.uniform(0.001, 0.01, 900), rng.uniform(0.001, 0.01, 50)])
    pa, pb = gpu_replay.draw_plan(a, 90, seed=11), gpu_replay.draw_plan(b, 90, seed=11)
    assert len(pa) == len(pb) == 90
    assert [i for r, i in pa if r == 0] == [i for r, i in pb if r == 0]
    assert [i for r, i in pa if r == 1] != [i for r, i in pb if r == 1]
    assert {r for r, _ in pa[:3]} == {0, 1, 2} and [sum(r == k for r, _ in pa) for k in range(3)] == [30, 30, 30]
    assert gpu_replay.draw_plan(a, 90, seed=12) != pa
    # proportional to seconds within a replica: a step 100x longer than the others is drawn most
    heavy = _fake_run("h", [np.r_[np.full(99, 0.001), 0.1]])
    picks = [i for _, i in gpu_replay.draw_plan(heavy, 400, seed=0)]
    assert 0.4 < picks.count(99) / 400 < 0.6  # its share of the seconds is 0.1 / 0.199


def test_two_policies_with_the_same_steps_measure_alike_and_the_interval_collapses():
    """Where the model is off by a factor that varies from step to step, two runs with the same steps get
    the same estimate and a ratio of exactly 1 (the draws and the bootstrap resamples are common); a run
    that differs on one replica is estimated apart there only."""
    rng = np.random.default_rng(5)
    reps = [rng.uniform(0.001, 0.01, 400) for _ in range(4)]
    a, b = _fake_run("a", reps), _fake_run("b", reps)
    c = _fake_run("c", reps[:3] + [rng.uniform(0.001, 0.01, 450)])
    factor = {id(s): 1.5 + 1.5 * rng.random(len(s)) for s in reps}  # measured / modelled, step by step
    last = 1.5 + 1.5 * rng.random(450)

    def measure(run, plan):
        out = []
        for r, i in plan:
            s = run["steps"][r]["compute_seconds"]
            f = last if len(s) == 450 else factor[id(reps[r])]
            out.append({"replica": r, "modelled": float(s[i]), "measured": float(s[i] * f[i]), "exact": True})
        return out

    runs = [a, b, c]
    draws = [measure(run, gpu_replay.draw_plan(run, 200, seed=11)) for run in runs]
    rows = gpu_replay.report(runs, draws, seed=11, resamples=200)["policies"]
    assert rows[1]["measured_vs_baseline"] == 1.0 and rows[1]["measured_vs_baseline_95"] == [1.0, 1.0]
    assert rows[2]["measured_replica_seconds"][:3] == rows[0]["measured_replica_seconds"][:3]
    assert rows[2]["measured_replica_seconds"][3] != rows[0]["measured_replica_seconds"][3]


def test_the_estimator_check_runs_and_reports_both_samplers(tmp_path):
    """benchmarks/bench_replay_estimator.py (the CPU check of the replay's sampler) runs on a small step
    and reports, per sampler and policy, the estimate's error against the truth it made up."""
    out = tmp_path / "est.json"
    args = ["--factors", "4", "--prompts", "16", "--replicas", "2", "--draws", "40", "--trials", "3",
            "--resamples", "50", "--out", str(out)]
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_replay_estimator.py"), *args],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    (setting,) = json.loads(out.read_text())["settings"]
    assert {(r["sampler"], r["policy"]) for r in setting["rows"]} == {
        (s, p) for s in ("iid", "stratified") for p in ("steal", "steal_longest")}
    for r in setting["rows"]:
        assert r["rmse"] >= r["sd"] >= 0 and 0 <= r["coverage"] <= 1 and r["interval_width"] >= 0
        assert r["true_ratio"] > 0


def test_gpu_replay_runs_slime_with_and_without_the_plan_on_cpu_quick(tmp_path):
    """--policies sglang:cache_aware@512,sglang:slime_plan@512 (gpu_replay_slime.sh's): slime as it ships
    (its in-flight cap) and slime with lengthsched.integrations.slime, each the simulator's own run of the
    setting; slime_plan is refused for another engine, a bad @K is a usage line."""
    from bench_simulate import _rollout_setting

    from lengthsched.cost import StepCost
    from lengthsched.memory import ModelMemory
    from simulate import run_slime_planned

    out = tmp_path / "slime.json"
    result = _quick_replay("--policies", "sglang:cache_aware@512,sglang:slime_plan@512", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    slime, planned = report["policies"]
    assert (slime["policy"], planned["policy"]) == ("sglang + cache_aware@512", "sglang + slime_plan@512")
    groups, realistic, _, _, common = _rollout_setting("castillo", 16, 2, 2, 11, None)
    # the quick run's tiny model prices the steps with its own cost: the ratio of the two runs is what carries
    common["cost"] = StepCost.from_gpu(ModelMemory.from_preset("qwen3-1.7b"), "h100")
    direct, _ = run_slime_planned(groups, realistic, in_flight=512 * 2, **common)
    capped = run_rollout(groups, "sglang", router="cache_aware", in_flight=512 * 2, **common)
    assert direct.seconds != capped.seconds and planned["modelled_seconds"] != slime["modelled_seconds"]
    assert planned["draws"] == slime["draws"] == 20 and planned["measured_seconds"] > 0
    # the script's runs are the simulator's, to the last digit, under the same cost
    from types import SimpleNamespace

    args = SimpleNamespace(workload="castillo", prompts=16, replicas=2, factor=2, seed=11, predictions="realistic",
                           policies="sglang:cache_aware@512,sglang:slime_plan@512")
    runs = gpu_replay.simulate(args, common["cost"])
    assert [r["seconds"] for r in runs] == [capped.seconds, direct.seconds]
    for policies, message in (("vllm:slime_plan", "runs slime's engines only"), ("sglang:cache_aware@0", "ROUTER@K")):
        bad = _quick_replay("--policies", policies, "--out", str(tmp_path / "bad.json"))
        assert bad.returncode == 2 and message in bad.stderr and not (tmp_path / "bad.json").exists()


def test_gpu_replay_runs_a_multi_turn_step_on_cpu_quick(tmp_path):
    """--turns LO-HI (gpu_replay_multiturn.sh's): the simulator's multi-turn runs of the setting, POLICY+ following
    later turns, POLICY:cache_aware behind a cache-aware router, each run_multiturn's step to the last digit; a
    policy the multi-turn model lacks, a router it lacks or on a stealing policy, or a bad --turns is a usage
    line."""
    from types import SimpleNamespace

    from bench_simulate import MULTITURN_CONTEXT, _rollout_setting

    from lengthsched.cost import StepCost
    from lengthsched.memory import ModelMemory
    from simulate import run_multiturn, split_turns

    out = tmp_path / "multiturn.json"
    result = _quick_replay("--turns", "2-4", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [p["policy"] for p in report["policies"]] == ["vllm", "vllm_priority+", "steal", "steal+",
                                                         "vllm + cache_aware"]
    assert report["setting"]["turns"] == [2, 4] and report["setting"]["pool"] == "2 x 8192"
    groups, realistic, _, _, common = _rollout_setting("castillo", 16, 2, 2, 11, None)
    cost = StepCost.from_gpu(ModelMemory.from_preset("qwen3-1.7b"), "h100")
    args = SimpleNamespace(workload="castillo", prompts=16, replicas=2, factor=2, seed=11, predictions="realistic",
                           policies="vllm,steal+,vllm:cache_aware", turns=(2, 4), tool_seconds=0.5)
    runs = gpu_replay.simulate(args, cost)
    turns = split_turns(groups, turns=(2, 4), tool_seconds=0.5, tool_sigma=0.5, seed=11)
    kwargs = dict(replicas=2, budget_tokens=2 * MULTITURN_CONTEXT, max_new_tokens=4096, cost=cost)
    assert runs[0]["seconds"] == run_multiturn(groups, turns, "vllm", **kwargs).seconds
    assert runs[1]["seconds"] == run_multiturn(groups, turns, "steal", predicted=realistic, **kwargs).seconds
    assert runs[2]["seconds"] == run_multiturn(groups, turns, "vllm", router="cache_aware", **kwargs).seconds
    assert sum(len(s["rows"]) for s in runs[1]["steps"]) > 0
    for extra, message in ((("--policies", "seer"), "with --turns"),
                           (("--policies", "vllm:least_loaded"), "ROUTER one of"),
                           (("--policies", "steal:cache_aware"), "ROUTER one of"),
                           (("--turns", "3-1"), "--turns")):
        bad = _quick_replay(*extra, *(() if "--turns" in extra else ("--turns", "2")), "--out",
                            str(tmp_path / "bad.json"))
        assert bad.returncode == 2 and message in bad.stderr and not (tmp_path / "bad.json").exists()
