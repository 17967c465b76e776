"""``lengthsched simulate --prompts B --replicas R``: one rollout step, every policy and router."""

from __future__ import annotations

import json
import re

import pytest

from lengthsched.cli import main

SMALL = ["simulate", "--prompts", "8", "--replicas", "2", "--group-size", "8", "--max-new-tokens", "1024",
         "--model", "qwen3-1.7b", "--budget", "4GiB"]


def test_a_rollout_step_table_names_the_fastest_and_its_gain_over_vllm_with_verl_routing(capsys):
    assert main(SMALL) == 0
    out = capsys.readouterr().out
    assert out.startswith("8 prompts x G=8 from castillo (median prompt ") and "on 2 replicas of" in out
    rows = [line.split()[0] for line in out.splitlines()[2:] if line and not line.startswith((" ", "verdict"))]
    for policy in ("vllm", "vllm_priority", "sglang", "sglang_priority", "seer", "placed_adaptive", "steal",
                   "steal_observed"):
        assert policy in rows
    assert "vllm + group_round_robin" in out and "vllm + least_loaded" in out
    assert "sglang + cache_aware" in out and "vllm + contiguous_chunks" in out  # slime's and TRL 1.9's, by default
    verdict = next(line for line in out.splitlines() if line.startswith("verdict: fastest: "))
    assert "vllm + least_loaded" in verdict or "no policy beat" in verdict
    assert verdict.startswith("verdict: fastest: steal") or "the recommended steal" in verdict
    assert "lengthsched.integrations.StealCoordinator; steal_observed simulates it" in verdict
    assert "inside verl: lengthsched.integrations.verl_stealing" in verdict
    assert "(what vllm_priority + least_loaded simulates)" in verdict
    for column in ("seconds", "x vllm+verl", "s/LB", "tok/s", "slowest", "preempt", "recomputed", "prompt loads"):
        assert f"  {column}: " in out  # a legend line for every column


def test_a_rollout_step_as_json_and_defaults_that_look_like_an_rl_step(capsys):
    assert main(SMALL + ["--json", "--policies", "vllm,steal", "--routers", "least_loaded"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {(r["policy"], r["router"]) for r in data["rows"]} == {("vllm", "least_loaded"), ("steal", "dispatch")}
    assert data["options"]["replicas"] == 2 and data["verdict"].startswith("verdict: ")
    from simulate.options import SimulateOptions, resolve

    step = resolve(SimulateOptions(prompts=64))
    assert (step.replicas, step.group_size, step.model, step.budget, step.predictor) == (4, 16, "qwen3-8b", "40GiB",
                                                                                         "prompt:0.5")


@pytest.mark.parametrize("extra, flag", [
    (["--sweep", "group_size=4,8"], "sweep"), (["--slots", "0"], "slots"), (["--policies", "micro"], "policies"),
    (["--predictor", "noisy:0.5"], "predictor"), (["--routers", "random"], "routers"), (["--prompts", "0"], "prompts"),
    (["--budget", "1GiB"], "budget"), (["--predictor", "history:x"], "predictor"),
    (["--predictor", "history:-1"], "predictor"), (["--resubmit-seconds", "-1"], "resubmit_seconds"),
    (["--resubmit-seconds", "nan"], "resubmit_seconds"), (["--prompt-tokens", "300"], "prompt_tokens"),
    (["--workload", "lmsys", "--prompt-tokens", "0"], "prompt_tokens"),
    (["--workload", "lmsys", "--prompt-tokens", "many"], "prompt_tokens"),
    (["--draws", "-1"], "draws"), (["--draws", "2", "--predictor", "oracle"], "draws"),
    (["--draws", "2", "--predictor", "prompt:0"], "draws"), (["--draws", "2", "--predictor", "constant:300"], "draws"),
])
def test_bad_rollout_options_are_one_line_naming_the_flag(capsys, extra, flag):
    assert main(SMALL + extra) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"'{flag}'" in err


def test_the_lmsys_trace_says_its_prompts_take_no_tokens_and_prompt_tokens_gives_them_some(capsys):
    """The lmsys trace has no prompt lengths: a rollout step on it says so on stderr (0-token prompts flatter
    the policies that spread groups); --prompt-tokens gives every group a prompt, which then loads on the
    replicas (the notice gone)."""
    step = SMALL + ["--workload", "lmsys", "--json", "--policies", "vllm", "--routers", "least_loaded"]
    assert main(step) == 0
    captured = capsys.readouterr()
    assert "the lmsys trace has no prompt lengths" in captured.err and captured.err.count("\n") == 1
    bare = json.loads(captured.out)["rows"][0]
    assert main(step + ["--prompt-tokens", "512"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    given = json.loads(captured.out)["rows"][0]
    assert given["seconds"] > bare["seconds"]
    assert main(step + ["--prompt-tokens", "castillo"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["seconds"] > bare["seconds"]


def test_rollout_figures_have_a_gantt_per_replica_and_kv_over_time(tmp_path, capsys):
    assert main(SMALL + ["--plot", str(tmp_path), "--policies", "vllm,steal"]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["rollout_gantt_steal.png", "rollout_gantt_vllm.png", "rollout_kv.png"]


def test_routers_without_a_rollout_step_say_they_have_no_effect(capsys):
    assert main(["simulate", "--groups", "2", "--routers", "least_loaded"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'routers'" in err and "--prompts or --replicas" in err


@pytest.mark.parametrize("flag,value", [
    ("--steps", "3"), ("--partial-rollout", None), ("--max-carry", "1"), ("--carry-limit", "drop"),
    ("--valid-share", "0.7"), ("--max-staleness", "1"), ("--train-seconds", "2"), ("--update-seconds", "2"),
    ("--max-concurrent", "4"), ("--oversample", "1.5"), ("--in-flight", "8"), ("--draws", "2"),
    ("--staleness-threshold", "0.1"), ("--local-steps", "2"), ("--slime-refill", None), ("--difficulty", None),
    ("--filter-order", None), ("--selective", None),
])
def test_every_rollout_flag_without_a_rollout_step_is_one_line(flag, value, capsys):
    """simulate.report.ROLLOUT_ONLY: a flag only a rollout step uses, given without --prompts or --replicas,
    is an error naming it, not a silent no-op."""
    from simulate.report import ROLLOUT_ONLY

    name = flag[2:].replace("-", "_")
    assert name in dict(ROLLOUT_ONLY)
    assert main(["simulate", "--groups", "2", flag] + ([value] if value else [])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"'{name}'" in err and "--prompts or --replicas" in err


@pytest.mark.parametrize("extra", [["--train-seconds", "2"], ["--update-seconds", "2"], ["--max-concurrent", "4"],
                                   ["--staleness-threshold", "0.1"], ["--local-steps", "2"]])
def test_asynchronous_settings_without_max_staleness_are_one_line(extra, capsys):
    assert main(["simulate", *ASYNC, "--oversample", "1.5", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-staleness" in err


def test_headroom_reports_the_oracle_placement_apart_from_the_policies(capsys):
    assert main(SMALL + ["--headroom", "--policies", "vllm,steal", "--routers", "least_loaded"]) == 0
    out = capsys.readouterr().out
    oracle = [line for line in out.splitlines() if line.startswith("oracle (not a policy): vllm + oracle placement")]
    assert len(oracle) == 1
    verdict = next(line for line in out.splitlines() if line.startswith("verdict: "))
    assert "with every length known in advance (oracle)" in verdict and not verdict.startswith("verdict: fastest: "
                                                                                                "vllm + oracle")
    assert main(SMALL + ["--headroom", "--json", "--policies", "vllm", "--routers", "least_loaded"]) == 0
    data = json.loads(capsys.readouterr().out)
    base = next(r for r in data["rows"] if (r["policy"], r["router"]) == ("vllm", "least_loaded"))
    found = data["oracle_placement"]
    assert found["router"] == "oracle placement" and found["seconds"] <= base["seconds"] * (1 + 1e-12)
    assert found["seconds"] >= found["lower_bound_seconds"] * (1 - 1e-9)
    assert main(SMALL + ["--json", "--policies", "vllm", "--routers", "least_loaded"]) == 0
    assert json.loads(capsys.readouterr().out)["oracle_placement"] is None
    # with a compressed cache the placement is searched with it, and beats vLLM + verl with the same cache
    assert main(SMALL + ["--headroom", "--json", "--policies", "vllm", "--routers", "least_loaded",
                         "--kv-compression", "64:16"]) == 0
    data = json.loads(capsys.readouterr().out)
    base = next(r for r in data["rows"] if (r["policy"], r["router"]) == ("vllm", "least_loaded"))
    assert data["oracle_placement"]["seconds"] <= base["seconds"] * (1 + 1e-12) and "KV compressed" in data["setting"]


def test_headroom_without_a_rollout_step_is_an_error_naming_it(capsys):
    assert main(["simulate", "--groups", "2", "--headroom"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'headroom'" in err and "--prompts or --replicas" in err


def test_slots_cap_each_replica_of_a_rollout_step(capsys):
    """--slots in a rollout step: each replica runs at most that many requests at once (vLLM's
    max_num_seqs); the setting line says so and the run differs from the uncapped one."""
    assert main(SMALL + ["--json", "--policies", "vllm", "--routers", "least_loaded", "--slots", "2"]) == 0
    capped = json.loads(capsys.readouterr().out)
    assert main(SMALL + ["--json", "--policies", "vllm", "--routers", "least_loaded"]) == 0
    free = json.loads(capsys.readouterr().out)
    assert "at most 2 requests running per replica" in capped["setting"] and "at most" not in free["setting"]
    assert capped["rows"][0]["seconds"] > free["rows"][0]["seconds"]


def test_history_predictions_show_and_recommend_what_one_earlier_epoch_says(capsys, tmp_path):
    """--predictor history: the step's prompts one epoch earlier (fresh completions) teach the online
    predictor; the table gains steal_classes and the verdict names recommend_rollout_policy's pick
    with the siblings' spread. CASTILLO siblings agree: steal_classes; the long tail's do not: steal."""
    from lengthsched.placement import CLASSES_MAX_SPREAD, recommend_rollout_policy, sibling_spread
    from simulate.options import SimulateOptions
    from simulate.rollout_report import compare_rollout, rollout_step
    from simulate.workloads import castillo_groups

    assert main(SMALL + ["--predictor", "history"]) == 0
    out = capsys.readouterr().out
    assert "predictor history (learnt from one earlier epoch of the same prompts, 8 fresh completions each; " \
           "sibling spread" in out
    rows = [line.split()[0] for line in out.splitlines()[2:] if line and not line.startswith((" ", "verdict"))]
    assert "steal_classes" in rows and "steal" in rows
    verdict = next(line for line in out.splitlines() if line.startswith("verdict: "))
    assert "steal_classes" in verdict and "siblings agree" in verdict and f"against {CLASSES_MAX_SPREAD}" in verdict
    assert "lengthsched.placement=auto" in verdict

    opts = SimulateOptions(prompts=8, replicas=2, group_size=8, max_new_tokens=1024, model="qwen3-1.7b",
                           budget="4GiB", predictor="history")
    step = rollout_step(opts)
    before = castillo_groups(8, max_new_tokens=1024, limit=8, seed=0, epoch=1)
    assert [g.prompt_id for g in before] == [g.prompt_id for g in step.groups]
    assert all((a == b.lengths).all() for a, b in zip(step.history, before))  # the earlier epoch, not this one
    assert any((a != g.lengths).any() for a, g in zip(step.history, step.groups))
    assert step.recommended == recommend_rollout_policy(list(step.history)) == "steal_classes"
    for start in range(0, 64, 8):  # one prediction per prompt, the same for its siblings
        assert len(set(step.predicted[start:start + 8].tolist())) == 1
    # what the online predictor learnt from the earlier epoch, from the prompt-level prior of prompt:0.5
    # (the simulated predictor of each prompt's median, as --predictor prompt:0.5 gives)
    import dataclasses

    import numpy as np

    import simulate.rollout_report as rr
    from simulate.report import prompt_prediction
    from simulate.workloads import history_predictions

    prior = {g.prompt_id: prompt_prediction(g, 0.5, 0, i) for i, g in enumerate(step.groups)}
    assert (history_predictions(step.groups, before, prior, max_new_tokens=1024) == step.predicted).all()
    # nothing of this step but its prior is used: lengths changed around each median move nothing
    real = rr.workload_groups

    def shuffled(o, limit, epoch=0):
        groups = real(o, limit, epoch)
        if epoch:
            return groups
        out = []
        for g in groups:
            x = np.sort(g.lengths)
            x[:3], x[-3:] = 1, 1024
            out.append(dataclasses.replace(g, lengths=x))
        return out

    rr.workload_groups = shuffled
    try:
        assert (rollout_step(opts).predicted == step.predicted).all()
    finally:
        rr.workload_groups = real
    # a --plot draws the recommended policy
    comparison = compare_rollout(dataclasses.replace(opts, policies="vllm,steal_classes"))
    assert comparison.step.recommended == "steal_classes"
    paths = rr.rollout_figures(comparison, tmp_path)
    assert sorted(p.name for p in paths) == ["rollout_gantt_steal_classes.png", "rollout_gantt_vllm.png",
                                             "rollout_kv.png"]

    # siblings that disagree (the long-tail model): steal
    assert main(SMALL + ["--workload", "lmsys", "--spread", "1.0", "--predictor", "history:0.3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "the recommended steal (" in data["verdict"] or data["verdict"].startswith("verdict: fastest: steal ")
    assert "siblings disagree" in data["verdict"]
    assert sibling_spread([[10, 900, 40, 300]]) > CLASSES_MAX_SPREAD


def test_history_is_a_rollout_predictor_and_needs_a_named_workload(capsys, tmp_path):
    assert main(["simulate", "--groups", "2", "--predictor", "history"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'predictor'" in err and "is for a rollout step" in err
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"prompt_id": "a", "prompt_tokens": 10, "lengths": [5, 6, 7]}\n', encoding="utf-8")
    assert main(["simulate", "--prompts", "1", "--replicas", "1", "--workload", str(trace), "--group-size", "3",
                 "--predictor", "history"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'predictor'" in err and "needs a named workload" in err


def test_a_resubmission_delay_slows_what_steal_moves_and_nothing_else(capsys):
    """--resubmit-seconds D: the requests steal moves between replicas wait D seconds before their new
    replica can run them (a framework's abort and resubmission); the setting line says so, steal's rows
    change, vLLM's do not; without a rollout step it is an error naming the flag."""
    step = ["simulate", "--prompts", "16", "--replicas", "4", "--group-size", "8", "--max-new-tokens", "1024",
            "--model", "qwen3-1.7b", "--budget", "4GiB", "--json", "--policies", "vllm,steal",
            "--routers", "least_loaded"]
    assert main(step) == 0
    at_once = json.loads(capsys.readouterr().out)
    assert main(step + ["--resubmit-seconds", "0.5"]) == 0
    late = json.loads(capsys.readouterr().out)
    assert "resubmitted after 0.5 s" in late["setting"] and "resubmitted" not in at_once["setting"]
    rows = {run["options"]["resubmit_seconds"]: {r["policy"]: r["seconds"] for r in run["rows"]}
            for run in (at_once, late)}
    assert rows[0.5]["vllm"] == rows[0.0]["vllm"] and rows[0.5]["steal"] > rows[0.0]["steal"]
    assert "each move waits 0.5 s here" in late["verdict"] and "each move waits" not in at_once["verdict"]
    assert main(["simulate", "--groups", "2", "--resubmit-seconds", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'resubmit_seconds'" in err and "--prompts or --replicas" in err


def test_kv_offload_loads_preempted_requests_back_in_every_replica(capsys):
    """--kv-offload: every replica loads a preempted request's KV back from host memory instead of
    recomputing it; the setting line says so, vLLM's recomputed tokens drop to none; without a rollout
    step it is an error naming the flag."""
    step = ["simulate", "--prompts", "16", "--replicas", "2", "--group-size", "8", "--max-new-tokens", "1024",
            "--model", "qwen3-1.7b", "--budget", "3.6GiB", "--json", "--policies", "vllm,steal",
            "--routers", "least_loaded"]
    assert main(step) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(step + ["--kv-offload"]) == 0
    kept = json.loads(capsys.readouterr().out)
    assert "offloaded to host memory" in kept["setting"] and "offloaded" not in plain["setting"]
    recomputed = [{r["policy"]: r["recomputed_tokens"] for r in run["rows"]} for run in (plain, kept)]
    assert recomputed[0]["vllm"] > 0 and recomputed[1]["vllm"] == 0
    loaded = [{r["policy"]: r["loaded_tokens"] for r in run["rows"]} for run in (plain, kept)]
    assert loaded[0] == {"vllm": 0, "steal": 0} and loaded[1]["vllm"] > 0
    assert main([a for a in step if a != "--json"] + ["--kv-offload"]) == 0  # the table shows what was loaded
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if line.startswith("policy"))
    assert header.split()[-4:] == ["recomputed", "loaded", "prompt", "loads"] and "  loaded: KV tokens" in text
    assert main([a for a in step if a != "--json"]) == 0
    text = capsys.readouterr().out  # nothing loaded: no column, no legend line
    header = next(line for line in text.splitlines() if line.startswith("policy"))
    assert "loaded" not in header.split() and "  loaded: " not in text
    assert main(["simulate", "--groups", "2", "--kv-offload"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'kv_offload'" in err and "--prompts or --replicas" in err


def test_poll_seconds_spaces_steal_observeds_snapshots_and_nothing_else(capsys):
    """--poll-seconds S: steal_observed decides from snapshots at least S seconds apart, as a framework
    polls (verl_stealing: 0.25 s); the setting line says so, vLLM's row does not change; without a
    rollout step, or with a bad interval, it is an error naming the flag."""
    step = ["simulate", "--prompts", "16", "--replicas", "4", "--group-size", "8", "--max-new-tokens", "1024",
            "--model", "qwen3-1.7b", "--budget", "3.6GiB", "--json", "--policies", "vllm,steal_observed",
            "--routers", "least_loaded"]
    assert main(step) == 0
    every = json.loads(capsys.readouterr().out)
    assert main(step + ["--poll-seconds", "0.25", "--resubmit-seconds", "0.05"]) == 0
    polled = json.loads(capsys.readouterr().out)
    assert "steal_observed polling every 0.25 s" in polled["setting"] and "polling" not in every["setting"]
    rows = [{r["policy"]: r["seconds"] for r in run["rows"]} for run in (every, polled)]
    assert rows[0]["vllm"] == rows[1]["vllm"] and rows[0]["steal_observed"] != rows[1]["steal_observed"]
    for bad in (["simulate", "--groups", "2", "--poll-seconds", "1"], step + ["--poll-seconds", "0"]):
        assert main(bad) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "'poll_seconds'" in err


def test_draws_rerun_every_policy_on_fresh_prediction_errors(capsys):
    """--draws N: every row's ratio to vLLM FCFS + verl on the step as run (first) and on N more draws of the
    prompt-level errors (seeds --seed + 1 ..), the prompts and completions unchanged; the table lists each
    policy's median, best, worst and how often it was slower; the verdict gives the recommendation's."""
    import numpy as np

    from simulate import run_rollout
    from simulate.options import SimulateOptions
    from simulate.rollout_report import rollout_step, step_predictions

    args = ["--policies", "vllm,vllm_priority,steal", "--routers", "least_loaded", "--prompts", "16"]
    assert main(SMALL + args + ["--json", "--draws", "2", "--workers", "2"]) == 0  # the draws on two processes
    data = json.loads(capsys.readouterr().out)
    rows = {(r["policy"], r["router"]): r for r in data["rows"]}
    base = rows[("vllm", "least_loaded")]
    assert base["draws"] == [1.0, 1.0, 1.0]
    assert "each policy also on 2 more draws of the predictions' errors (seeds 1-2)" in data["setting"]
    opts = SimulateOptions(prompts=16, replicas=2, group_size=8, max_new_tokens=1024, model="qwen3-1.7b",
                           budget="4GiB", policies="vllm,vllm_priority,steal", routers="least_loaded")
    step = rollout_step(opts)
    common = dict(replicas=2, budget_tokens=step.pool, max_new_tokens=1024, cost=step.cost)
    vllm = run_rollout(step.groups, "vllm", router="least_loaded", **common).seconds
    for seed, at in ((0, 0), (2, 2)):
        predicted = step_predictions(step.opts, step.groups, None, seed)
        if seed == 0:
            assert np.array_equal(predicted, step.predicted)
        else:  # fresh errors, one prediction per prompt
            assert not np.array_equal(predicted, step.predicted) and len(set(predicted[:8].tolist())) == 1
        priority = run_rollout(step.groups, "vllm_priority", router="least_loaded", predicted=predicted,
                               **common).seconds
        assert rows[("vllm_priority", "least_loaded")]["draws"][at] == pytest.approx(priority / vllm, rel=1e-12)
    assert rows[("steal", "dispatch")]["draws"][0] == pytest.approx(rows[("steal", "dispatch")]["seconds"]
                                                                     / base["seconds"], rel=1e-12)
    assert "over 3 draws of the predictions' errors it is a median" in data["verdict"]
    assert main(SMALL + args + ["--json", "--draws", "2", "--workers", "1"]) == 0  # the draws on one process
    alone = json.loads(capsys.readouterr().out)
    assert [r["draws"] for r in alone["rows"]] == [r["draws"] for r in data["rows"]]
    many = {}
    for workers in ("1", "2"):  # four draws: enough for the process pool (simulate.report.run_units)
        assert main(SMALL + args + ["--json", "--draws", "4", "--workers", workers]) == 0
        many[workers] = [r["draws"] for r in json.loads(capsys.readouterr().out)["rows"]]
    assert many["1"] == many["2"] and all(len(d) == 5 for d in many["1"])
    assert [d[:3] for d in many["1"]] == [r["draws"] for r in data["rows"]]  # the same first draws

    assert main(SMALL + args + ["--draws", "2"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    at = lines.index("over 3 draws of the predictions' errors (the step above and 2 more), x vllm+verl of the same "
                     "draw:")
    listed = lines[at + 1:at + 4]
    assert {line.split()[0] for line in listed} == {"vllm", "vllm_priority", "steal"}
    assert all("median" in line and "best" in line and "worst" in line and "of 3" in line for line in listed)
    assert main(SMALL + args) == 0
    assert "draws of the predictions' errors" not in capsys.readouterr().out


def test_draws_without_a_rollout_step_is_an_error_naming_it(capsys):
    assert main(["simulate", "--groups", "2", "--draws", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'draws'" in err and "--prompts or --replicas" in err


def test_the_verdict_says_when_steal_places_whole_groups_that_one_step_is_one_draw(capsys):
    """Where the step's predicted tokens fill every pool CROWDED_POOLS times over, steal places each group
    whole (every completion of a group on one replica), and the verdict says that the step is one draw of a
    lottery and how to see more (--draws); where steal spreads groups, or with --draws, it does not."""
    import numpy as np

    from simulate import run_rollout
    from simulate.options import SimulateOptions
    from simulate.rollout_report import rollout_step

    args = ["--policies", "vllm,steal", "--routers", "least_loaded"]
    hint = "steal places whole groups in this step"
    for prompts, crowded in (("64", True), ("8", False)):
        opts = SimulateOptions(prompts=int(prompts), replicas=2, group_size=8, max_new_tokens=1024,
                               model="qwen3-1.7b", budget="4GiB", policies="vllm,steal", routers="least_loaded")
        step = rollout_step(opts)
        assert step.whole_groups is crowded
        placed = run_rollout(step.groups, "steal", replicas=2, budget_tokens=step.pool, max_new_tokens=1024,
                             predicted=step.predicted, cost=step.cost).placement
        by_group = np.asarray(placed).reshape(len(step.groups), 8)
        # steal may later move a few requests; its placement is whole groups where crowded
        whole = np.mean([len(set(row)) == 1 for row in by_group])
        assert (whole > 0.9) if crowded else (whole < 0.5)
        assert main(SMALL[:2] + [prompts] + SMALL[3:] + args) == 0
        verdict = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("verdict: "))
        assert (hint in verdict and "--draws N" in verdict) is crowded
    assert main(SMALL[:2] + ["64"] + SMALL[3:] + args + ["--draws", "2"]) == 0
    verdict = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("verdict: "))
    assert hint not in verdict and "over 3 draws of the predictions' errors" in verdict


def test_in_flight_keeps_the_frameworks_cap_behind_the_routers_that_route_one_at_a_time(capsys):
    """--in-flight K: vllm and sglang behind least_loaded and cache_aware send at most K x R requests at once
    and route the rest as requests finish (slime: 512); other rows do not change; the setting line says
    so; without a rollout step, or below 1, it is an error naming the flag."""
    step = ["simulate", "--prompts", "16", "--replicas", "2", "--group-size", "8", "--max-new-tokens", "1024",
            "--model", "qwen3-1.7b", "--budget", "3.6GiB", "--json", "--policies", "vllm,sglang,steal",
            "--routers", "least_loaded,cache_aware,group_round_robin"]
    assert main(step) == 0
    free = json.loads(capsys.readouterr().out)
    assert main(step + ["--in-flight", "4"]) == 0
    capped = json.loads(capsys.readouterr().out)
    assert "at most 4 requests per replica in flight" in capped["setting"] and "in flight" not in free["setting"]
    rows = [{(r["policy"], r["router"]): r["seconds"] for r in run["rows"]} for run in (free, capped)]
    for key in rows[0]:
        if key[0] in ("vllm", "sglang") and key[1] in ("least_loaded", "cache_aware"):
            assert rows[1][key] > rows[0][key]  # 8 of 128 requests at once: slower
        else:
            assert rows[1][key] == rows[0][key]
    for bad in (["simulate", "--groups", "2", "--in-flight", "4"], step + ["--in-flight", "0"]):
        assert main(bad) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "'in_flight'" in err


def test_slime_plan_is_slime_with_the_integrations_plan_next_to_slime_as_it_ships(capsys):
    """--routers slime_plan: one row, sglang behind lengthsched.integrations.slime's plan and client queues
    (simulate.run_slime_planned on the same step, slime's in-flight cap included), and the verdict compares
    it with slime as it ships (sglang + cache_aware); no other policy runs behind it."""
    import numpy as np

    from simulate import run_slime_planned
    from simulate.options import SimulateOptions
    from simulate.rollout_report import rollout_step

    args = ["--prompts", "16", "--replicas", "2", "--group-size", "8", "--max-new-tokens", "1024",
            "--model", "qwen3-1.7b", "--budget", "3.6GiB", "--policies", "vllm,sglang,steal",
            "--routers", "least_loaded,cache_aware,slime_plan"]
    for capped in ([], ["--in-flight", "4"]):
        assert main(["simulate", "--json"] + args + capped) == 0
        out = json.loads(capsys.readouterr().out)
        rows = {(r["policy"], r["router"]): r for r in out["rows"]}
        assert [k for k in rows if k[1] == "slime_plan"] == [("sglang", "slime_plan")]
        step = rollout_step(SimulateOptions(prompts=16, replicas=2, group_size=8, max_new_tokens=1024,
                                            model="qwen3-1.7b", budget="3.6GiB", policies="vllm,sglang,steal",
                                            routers="least_loaded,cache_aware,slime_plan",
                                            in_flight=4 if capped else None))
        direct, order = run_slime_planned(step.groups, step.predicted, replicas=2, budget_tokens=step.pool,
                                          max_new_tokens=1024, in_flight=8 if capped else None, cost=step.cost)
        assert sorted(order.tolist()) == list(range(16))
        assert rows[("sglang", "slime_plan")]["seconds"] == direct.seconds
        planned, slime = rows[("sglang", "slime_plan")]["seconds"], rows[("sglang", "cache_aware")]["seconds"]
        assert f"lengthsched.integrations.slime's plan and client queues take {planned:.2f} s, " \
               f"{planned / slime:.3f} x slime's" in out["verdict"]
        assert ("4 requests per engine in flight" in out["verdict"]) == bool(capped)
        assert np.isfinite(planned) and planned > 0
    with pytest.raises(Exception, match="sglang only"):
        step.run("vllm", "slime_plan")
    assert main(["simulate"] + args[:-1] + ["least_loaded,plan"]) == 2
    assert "slime_plan" in capsys.readouterr().err


def test_oversample_ends_the_step_at_the_last_kept_group_and_reports_the_kept_lengths(capsys):
    """--oversample 1.5: prompts x 1.5 groups submitted; every row reports the seconds to its --prompts-th
    finished group (no later than its makespan) and the kept groups' mean length over all submitted;
    slime's plan (groups reordered) too; out-of-range values and use without a rollout step are one line."""
    import numpy as np

    from simulate import run_rollout
    from simulate.options import SimulateOptions
    from simulate.rollout_report import rollout_step

    args = ["--prompts", "8", "--replicas", "2", "--group-size", "8", "--max-new-tokens", "1024",
            "--model", "qwen3-1.7b", "--budget", "3.6GiB", "--policies", "vllm,sglang,steal",
            "--routers", "least_loaded,slime_plan", "--oversample", "1.5"]
    assert main(["simulate", "--json"] + args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["setting"].startswith("12 prompts x G=8")
    assert "keeps the first 8 groups to finish of the 12" in out["setting"]
    rows = {(r["policy"], r["router"]): r for r in out["rows"]}
    assert ("sglang", "slime_plan") in rows
    for r in rows.values():
        assert 0 < r["seconds_to_kept"] <= r["seconds"] + 1e-9 and 0 < r["kept_length_ratio"] < 2
    step = rollout_step(SimulateOptions(prompts=8, replicas=2, group_size=8, max_new_tokens=1024, model="qwen3-1.7b",
                                        budget="3.6GiB", oversample=1.5))
    r = run_rollout(step.groups, "vllm", replicas=2, router="least_loaded", budget_tokens=step.pool,
                    max_new_tokens=1024, cost=step.cost, record=True)
    finish = r.group_finish_seconds()
    means = np.array([np.mean(g.lengths) for g in step.groups])
    base = rows[("vllm", "least_loaded")]
    assert base["seconds_to_kept"] == pytest.approx(np.sort(finish)[7], rel=1e-12)
    assert base["kept_length_ratio"] == pytest.approx(means[np.argsort(finish, kind="stable")[:8]].mean()
                                                      / means.mean(), rel=1e-12)
    assert "over-sampled, the step ends at its last kept group" in out["verdict"]
    assert main(["simulate"] + args) == 0
    text = capsys.readouterr().out
    assert "  to kept: " in text and "  kept len: " in text
    for bad in ("0.5", "11", "nan"):
        assert main(["simulate"] + args[:-1] + [bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--oversample" in err
    assert main(["simulate", "--groups", "2", "--oversample", "1.25"]) == 2
    assert "--prompts or --replicas" in capsys.readouterr().err


def test_steps_run_over_sampled_steps_one_after_another(capsys):
    """--oversample 1.5 --steps 3 [--partial-rollout]: every run over the same stream of steps
    (simulate.run_oversampled_steps), vLLM + verl without over-sampling as the reference row; kept tokens
    per second, stale and dropped shares; the flags that need the others, or look at one step, are one line."""
    from simulate import run_oversampled_steps
    from simulate.options import SimulateOptions
    from simulate.rollout_report import STEPS_RESUME, rollout_step

    args = ["--prompts", "4", "--replicas", "2", "--group-size", "4", "--max-new-tokens", "1024",
            "--model", "qwen3-1.7b", "--budget", "3.6GiB", "--policies", "vllm,sglang,steal",
            "--routers", "least_loaded,slime_plan", "--oversample", "1.5", "--steps", "3"]
    for partial in (False, True):
        flags = args + (["--partial-rollout"] if partial else [])
        assert main(["simulate", "--json"] + flags) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["setting"].startswith("3 over-sampled rollout steps of 4 prompts kept x G=4 (6 submitted each")
        reference, *rows = out["rows"]
        assert (reference["policy"], reference["router"], reference["oversample"]) == ("vllm", "least_loaded", 1.0)
        assert reference["stale_share"] == reference["dropped_share"] == 0 and reference["kept_length_ratio"] == 1
        ran = {(r["policy"], r["router"]): r for r in rows if r["error"] is None}
        assert set(ran) == {("vllm", "least_loaded"), ("sglang", "least_loaded"), ("steal", "dispatch"),
                            ("sglang", "slime_plan")}  # slime with the integration, step after step
        step = rollout_step(SimulateOptions(prompts=4, replicas=2, group_size=4, max_new_tokens=1024,
                                            model="qwen3-1.7b", budget="3.6GiB", oversample=1.5, steps=3))
        assert len(step.groups) == 18  # 3 steps x 6 submitted
        mine = run_oversampled_steps(step.groups, "steal", batch=4, oversample=1.5, steps=3, partial=partial,
                                     predicted=step.predicted, resume=STEPS_RESUME, replicas=2,
                                     budget_tokens=step.pool, max_new_tokens=1024, cost=step.cost)
        got = ran[("steal", "dispatch")]
        assert got["kept_tokens_per_second"] == pytest.approx(mine.kept_tokens_per_second, rel=1e-12)
        assert got["stale_share"] == pytest.approx(mine.stale_share) and got["partial_rollout"] is partial
        assert (got["dropped_share"] == 0) if partial else (got["stale_share"] == 0 and got["dropped_share"] > 0)
        assert out["verdict"].startswith("verdict: over 3 over-sampled steps (1.5x, ")
        assert ("older policy's" in out["verdict"]) is partial
        assert main(["simulate"] + flags) == 0
        text = capsys.readouterr().out
        assert "(reference, no over-sampling)" in text and "  kept tok/s: " in text and "  stale: " in text
    for bad, name in ((["--steps", "0"], "--steps"), (["--draws", "2"], "--draws"), (["--headroom"], "--headroom")):
        assert main(["simulate"] + args + bad) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and name in err
    assert main(["simulate"] + args[:-4] + ["--steps", "3"]) == 2
    assert "--oversample too" in capsys.readouterr().err
    assert main(["simulate"] + args[:-2] + ["--partial-rollout"]) == 2
    assert "--steps N too" in capsys.readouterr().err


def test_a_rollout_step_on_a_trace_file_keeps_its_group_sizes(tmp_path, capsys):
    """A trace file's groups keep their logged sizes: a rollout step on one takes no default group size
    (16 would contradict them), and --steps says how many steps the trace holds."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"prompt_id": f"p{i}", "prompt_tokens": 20, "lengths": [50 + i, 60, 70, 80]})
                             + "\n" for i in range(10)))
    args = ["simulate", "--workload", str(trace), "--prompts", "4", "--replicas", "2", "--budget", "4GiB",
            "--model", "qwen3-1.7b", "--max-new-tokens", "1024", "--policies", "vllm,steal"]
    assert main(args + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["setting"].startswith("4 prompts x G=4 from")
    assert main(args + ["--oversample", "1.5", "--steps", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "at most 1 with" in err and "holds 10 groups (each step submits 6)" in err
    assert main(args + ["--group-size", "8"]) == 2  # given, and wrong: still an error
    assert "--group-size" in capsys.readouterr().err


def test_valid_share_filters_the_over_sampled_steps(capsys):
    """--valid-share Q (with --steps): a dynamic-sampling filter in every row, the reference included; the
    filtered share is a column and a JSON field, a shortfall is said; Q outside (0, 1] or without --steps
    is one line."""
    args = ["simulate", "--prompts", "4", "--replicas", "2", "--group-size", "4", "--max-new-tokens", "1024",
            "--model", "qwen3-1.7b", "--budget", "3.6GiB", "--policies", "vllm,steal", "--routers", "least_loaded",
            "--oversample", "2", "--steps", "3", "--partial-rollout", "--valid-share", "0.6"]
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "a dynamic-sampling filter keeps 0.6 of the finished groups" in out["setting"]
    assert all(r["filtered_share"] > 0 for r in out["rows"])
    assert out["rows"][0]["shortfall"] > 0 and "the reference keeps only the groups that pass" in out["verdict"]
    assert main(args) == 0
    assert "  filtered: " in capsys.readouterr().out
    for bad in (["--valid-share", "0"], ["--valid-share", "1.5"]):
        assert main(args[:-2] + bad) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--valid-share" in err
    assert main(args[:-7] + ["--oversample", "2", "--valid-share", "0.5"]) == 2
    assert "--steps N too" in capsys.readouterr().err


def test_slime_refill_adds_batches_inside_the_steps_sent_through_the_cap(capsys):
    """--slime-refill (with --steps and --in-flight): the rows through the in-flight cap keep --prompts groups a
    step (slime submits more while the filter drops them), the reference (verl, no over-sampling) keeps fewer;
    without --in-flight it is one line."""
    args = ["simulate", "--prompts", "4", "--replicas", "2", "--group-size", "4", "--max-new-tokens", "1024",
            "--model", "qwen3-1.7b", "--budget", "3.6GiB", "--policies", "sglang", "--routers", "cache_aware",
            "--oversample", "1", "--steps", "3", "--valid-share", "0.6", "--in-flight", "16"]
    assert main(args + ["--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    assert main(args + ["--slime-refill", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "slime's dynamic sampling" in out["setting"]
    slime = [r for r in out["rows"] if r["router"] == "cache_aware"][0]
    assert slime["shortfall"] == 0 and [r for r in before["rows"] if r["router"] == "cache_aware"][0]["shortfall"] > 0
    assert out["rows"][0]["shortfall"] > 0  # the reference is verl's: no batch added inside a step
    assert main(args[:-2] + ["--slime-refill"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'slime_refill'" in err and "--in-flight" in err


# a small over-sampled step under the difficulty model's filter, slime's row only
DIFFICULTY_STEP = ("simulate", "--prompts", "6", "--replicas", "2", "--group-size", "4", "--max-new-tokens", "1024",
                   "--model", "qwen3-1.7b", "--budget", "3.6GiB", "--policies", "sglang", "--routers", "cache_aware",
                   "--oversample", "1.5", "--steps", "3", "--in-flight", "16", "--slime-refill", "--difficulty")


def test_difficulty_draws_the_filter_from_the_model_and_filter_order_orders_the_batches(capsys):
    """--difficulty (with --steps): DAPO's filter drawn from the difficulty model in every row (the setting says
    the share it keeps); --filter-order orders the over-sampled rows' batches by one earlier epoch, not the
    reference's; either without what it needs is one line."""
    args = list(DIFFICULTY_STEP)
    assert main(args + ["--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert "drawn from the difficulty model" in plain["setting"] and "likely-kept first" not in plain["setting"]
    assert all(r["filtered_share"] > 0 for r in plain["rows"])
    assert main(args + ["--filter-order", "--json"]) == 0
    ordered = json.loads(capsys.readouterr().out)
    assert "likely-kept first" in ordered["setting"] and "flatter" not in ordered["setting"]
    assert ordered["rows"][0] == plain["rows"][0]  # the reference is not over-sampled: nothing to order
    # with partial rollout a short run flatters the order (it defers what it puts last): the setting says so
    assert main(args + ["--filter-order", "--partial-rollout", "--json"]) == 0
    assert "3 steps flatter that order" in json.loads(capsys.readouterr().out)["setting"]
    assert main(args) == 0
    assert "  filtered: " in capsys.readouterr().out
    for bad, name in ((args + ["--valid-share", "0.5"], "'difficulty'"),
                      ([a for a in args if a != "--difficulty"] + ["--filter-order"], "'filter_order'"),
                      (args[:-8] + ["--difficulty"], "'difficulty'"),
                      ([a if a != "4" else "1" for a in args], "'group_size'")):
        assert main(bad) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and name in err


def test_selective_skips_prompts_the_filter_dropped_an_epoch_earlier_in_the_over_sampled_rows(capsys):
    """--selective (with --difficulty): the over-sampled rows run without the prompts GRESO's rule skipped (the
    setting says how many, and how many of them would have passed), the reference runs them all; without
    --difficulty, or with --max-staleness, it is one line."""
    args = list(DIFFICULTY_STEP)
    assert main(args + ["--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(args + ["--selective", "--json"]) == 0
    skipped = json.loads(capsys.readouterr().out)
    assert "skip" not in plain["setting"]
    assert re.search(r"skip \d+ of the \d+ prompts as GRESO does .*; \d+ of them would have passed",
                     skipped["setting"])
    assert skipped["rows"][0] == plain["rows"][0]  # the reference runs every prompt
    assert skipped["rows"][1] != plain["rows"][1]
    for bad, name in (([a for a in args if a != "--difficulty"] + ["--selective"], "'selective'"),
                      (args[:-8] + ["--steps", "3", "--selective", "--max-staleness", "1"], "'selective'")):
        assert main(bad) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and name in err


VERL_DYNAMIC = ["simulate", "--prompts", "6", "--replicas", "2", "--group-size", "4", "--max-new-tokens", "1024",
                "--model", "qwen3-1.7b", "--budget", "3.6GiB", "--steps", "3", "--difficulty",
                "--verl-dynamic-sampling"]


def test_verl_dynamic_sampling_compares_verl_as_it_ships_with_the_refill_and_the_skip(capsys):
    """--verl-dynamic-sampling (with --steps and a filter): verl's v1 dynamic sampling as the reference, the refill
    by need, verl_v1's stealing manager alone and with the refill (and with --selective the skip) as rows, each run as
    run_oversampled_steps with verl's rule gives it; every step keeps --prompts groups; what it cannot combine with
    is one line."""
    import numpy as np

    from simulate import run_oversampled_steps
    from simulate.difficulty import filter_passes, pass_rates
    from simulate.options import SimulateOptions
    from simulate.rollout_report import VERL_POLL_SECONDS, compare_rollout

    cli = main
    assert cli(VERL_DYNAMIC + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "verl's dynamic sampling" in out["setting"] and "poll every 2 s" in out["setting"]
    assert [(r["policy"], r["router"]) for r in out["rows"]] == [
        ("vllm", "least_loaded"), ("vllm", "least_loaded + verl_selective refill"),
        ("steal_observed", "verl_v1 stealing manager"),
        ("steal_observed", "verl_v1 stealing manager + verl_selective refill")]
    assert all(r["shortfall"] == 0 and r["error"] is None for r in out["rows"])
    assert "snapshots every 0.25 s, 0.05 s to resubmit" in out["setting"]
    assert "x verl as it ships" in out["verdict"] and "surplus" in out["verdict"]
    assert cli(VERL_DYNAMIC + ["--selective", "--json"]) == 0
    skipping = json.loads(capsys.readouterr().out)
    assert skipping["rows"][:4] == out["rows"] and len(skipping["rows"]) == 5
    assert re.search(r"skips \d+ of the \d+ prompts as GRESO does", skipping["setting"])
    # the reference is run_oversampled_steps with verl's rule (and poll) on the step's stream
    comparison = compare_rollout(SimulateOptions(prompts=6, replicas=2, group_size=4, max_new_tokens=1024,
                                                 model="qwen3-1.7b", budget="3.6GiB", steps=3, difficulty=True,
                                                 verl_dynamic_sampling=True))
    step, seed = comparison.step, comparison.options["seed"]
    valid = filter_passes(pass_rates(step.groups, seed=seed), 4, seed=seed, epoch=1)
    verl = run_oversampled_steps(step.groups, "vllm", batch=6, oversample=1.0, steps=3, partial=False,
                                 predicted=np.asarray(step.predicted), valid=valid, filter_seed=seed, refill=True,
                                 refill_rule="verl", refill_cap=6, refill_poll=VERL_POLL_SECONDS, in_flight=10**9,
                                 router="least_loaded", replicas=2, budget_tokens=step.pool, max_new_tokens=1024,
                                 cost=step.cost, seed=seed)
    assert comparison.rows[0].steps.kept_tokens_per_second == pytest.approx(verl.kept_tokens_per_second)
    # the stealing manager's row is run_verl_stealing inside the same loop, at the driver's defaults
    from functools import partial

    from simulate.rollout import run_verl_stealing

    stealing = run_oversampled_steps(step.groups, "steal_observed", batch=6, oversample=1.0, steps=3, partial=False,
                                     predicted=np.asarray(step.predicted), valid=valid, filter_seed=seed, refill=True,
                                     refill_rule="verl", refill_cap=6, refill_poll=VERL_POLL_SECONDS, in_flight=10**9,
                                     run=partial(run_verl_stealing, snapshot_seconds=0.25, resubmit_seconds=0.05),
                                     replicas=2, budget_tokens=step.pool, max_new_tokens=1024, cost=step.cost,
                                     seed=seed)
    assert comparison.rows[2].steps.kept_tokens_per_second == pytest.approx(stealing.kept_tokens_per_second)
    assert cli(VERL_DYNAMIC) == 0
    text = capsys.readouterr().out
    assert "(reference: verl as it ships)" in text and "  surplus: " in text and "  stale: " not in text
    for extra, name in ((["--partial-rollout"], "'partial_rollout'"), (["--oversample", "1.5"], "'oversample'"),
                        (["--in-flight", "16"], "'in_flight'"), (["--policies", "steal"], "'policies'"),
                        (["--filter-order"], "'filter_order'")):
        assert cli(VERL_DYNAMIC + extra) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and name in err
    assert cli([a for a in VERL_DYNAMIC if a != "--difficulty"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'verl_dynamic_sampling'" in err


def test_max_carry_bounds_the_kept_tokens_age(capsys):
    """--max-carry K [--carry-limit wait|drop] (with --partial-rollout): no kept group waited more than K steps
    in any over-sampled row (the reference carries nothing), the kept tokens' mean age is a column and a JSON
    field, the verdict says what "drop" threw away; K without --partial-rollout, or below 1, is one line."""
    args = ["simulate", "--prompts", "4", "--replicas", "2", "--group-size", "4", "--max-new-tokens", "1024",
            "--model", "qwen3-1.7b", "--budget", "3.6GiB", "--policies", "vllm,steal", "--routers", "least_loaded",
            "--oversample", "2", "--steps", "4", "--partial-rollout"]
    assert main(args + ["--json"]) == 0
    free = {(r["policy"], r["router"]): r for r in json.loads(capsys.readouterr().out)["rows"][1:]}
    assert max(r["most_steps_waited"] for r in free.values()) > 1  # the limit binds
    for limit in ("wait", "drop"):
        assert main(args + ["--max-carry", "1", "--carry-limit", limit, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert "a group carried 1 step " in out["setting"]
        for r in out["rows"][1:]:
            assert r["most_steps_waited"] <= 1 and r["mean_token_age"] <= 1
            assert (r["dropped_share"] > 0) if limit == "drop" else (r["dropped_share"] == 0)
        assert ("groups past --max-carry" in out["verdict"]) is (limit == "drop")
    assert main(args + ["--max-carry", "1"]) == 0
    assert "  age: " in capsys.readouterr().out
    assert main(args + ["--max-carry", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-carry" in err
    with pytest.raises(SystemExit) as stop:  # argparse's choices
        main(args + ["--carry-limit", "never"])
    assert stop.value.code == 2 and "--carry-limit" in capsys.readouterr().err
    assert main(args[:-1] + ["--max-carry", "1"]) == 2
    assert "--partial-rollout too" in capsys.readouterr().err
    assert main(args + ["--carry-limit", "wait"]) == 2  # no limit to keep
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--carry-limit" in err and "--max-carry K too" in err
    assert main(args + ["--oversample", "1"]) == 2  # nothing is carried
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--partial-rollout" in err and "--oversample above 1" in err


ASYNC = ["--prompts", "4", "--replicas", "2", "--group-size", "4", "--max-new-tokens", "1024", "--model", "qwen3-1.7b",
         "--budget", "3.6GiB", "--steps", "3"]


def test_max_staleness_with_a_compressed_cache_runs_every_row_that_takes_one(capsys):
    """--max-staleness with --kv-compression: every asynchronous and synchronous row runs the cache (it was
    ignored before), steal_sglang's included; the numbers are those of run_async_rollout(compression=) on the
    same stream. --turns with --kv-compression runs every multi-turn row with the cache."""
    from lengthsched import KVCompression
    from simulate import run_async_rollout
    from simulate.options import OPTION_DEFAULTS, SimulateOptions
    from simulate.rollout_report import rollout_step

    common = ["simulate", "--json", *ASYNC, "--max-staleness", "1", "--train-seconds", "0.5"]
    assert main(common) == 0
    dense = {r["run"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert main(common + ["--kv-compression", "64:16"]) == 0
    out = json.loads(capsys.readouterr().out)
    sparse = {r["run"]: r for r in out["rows"]}
    assert "KV compressed (64:16): each request holds and reads at most 80 generated tokens" in out["setting"]
    assert set(sparse) == set(dense) and "left out" not in out["setting"]
    assert all(r["seconds"] for r in sparse.values())
    assert sum(sparse[r]["seconds"] for r in sparse) < sum(dense[r]["seconds"] for r in sparse)
    step = rollout_step(SimulateOptions(prompts=16, replicas=2, group_size=4, max_new_tokens=1024,
                                        model="qwen3-1.7b", budget="3.6GiB"))  # (3 steps + K 1) x 4 prompts
    run = run_async_rollout(step.groups, batch=4, steps=3, max_staleness=1, train_seconds=0.5,
                            update_seconds=OPTION_DEFAULTS["update_seconds"],
                            policy="vllm", replicas=2, budget_tokens=step.pool, max_new_tokens=1024, cost=step.cost,
                            compression=KVCompression(64, 16))
    assert sparse["async: vllm, K=1, round robin (AReaL)"]["seconds"] == pytest.approx(run.seconds, rel=1e-12)
    assert main(["simulate", "--prompts", "4", "--replicas", "2", "--turns", "2", "--kv-compression", "64:16",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "KV compressed (64:16): each turn holds and reads at most 80 of the tokens it generates" in out["setting"]
    assert all(r.get("seconds") and r["cache_hits"] == 0 for r in out["rows"])  # no conversation stays cached


def test_max_staleness_compares_areal_asynchronous_loops_with_synchronous_steps(capsys):
    """--steps 3 --max-staleness 0,2: AReaL's loop at each bound on SGLang's and vLLM's engines, routing by
    least predicted work, and the project's synchronous steps, against AReaL's synchronous loop on SGLang;
    the numbers are those of simulate.run_async_rollout on the same stream."""
    from simulate import run_async_rollout, run_rollout, run_verl_async
    from simulate.asynchronous import run_sync_steps
    from simulate.options import SimulateOptions
    from simulate.rollout_report import rollout_step

    assert main(["simulate", "--json", *ASYNC, "--max-staleness", "0,2", "--train-seconds", "0.5",
                 "--update-seconds", "0.25"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["setting"].startswith("3 learner steps of 4 prompts x G=4")
    assert out["train_seconds"] == 0.5
    rows = {r["run"]: r for r in out["rows"]}
    ref = out["rows"][0]
    assert ref["run"] == out["reference"] == "sync: sglang, K=0, round robin (AReaL)" and ref["x_sync"] == 1
    assert set(rows) == {"sync: sglang, K=0, round robin (AReaL)", "async: sglang, K=2, round robin (AReaL)",
                         "async: sglang, K=2, least predicted work (lengthsched)",
                         "sync: vllm, K=0, round robin (AReaL)", "async: vllm, K=2, round robin (AReaL)",
                         "async: vllm, K=2, least predicted work (lengthsched)",
                         "async: sglang, K=2, groups placed (lengthsched.integrations.areal)",
                         "async: vllm, K=2, groups placed (lengthsched.integrations.areal)",
                         "async: steal_sglang, K=2, groups placed, stolen (lengthsched)",
                         "async: steal, K=2, groups placed, stolen (lengthsched)",
                         "sync: steal_sglang (lengthsched: each batch placed and stolen, then the learner)",
                         "sync: steal (lengthsched: each batch placed and stolen, then the learner)",
                         "stream: steal (lengthsched: each batch placed and stolen, 4 local updates as its groups "
                         "finish)",
                         "stream: vllm, S=0, 4 local updates (verl 0.9.1 fully async)",
                         "async: vllm, S=0.1, 4 local updates (verl 0.9.1 fully async)",
                         "stream: steal_observed, S=0, 4 local updates (verl 0.9.1 fully async + "
                         "lengthsched.integrations.verl_async: groups placed, stolen)",
                         "async: steal_observed, S=0.1, 4 local updates (verl 0.9.1 fully async + "
                         "lengthsched.integrations.verl_async: groups placed, stolen)"}
    # the stream: (3 steps + K 2) x 4 prompts, as one rollout step of 20 prompts draws them
    stream = rollout_step(SimulateOptions(prompts=20, replicas=2, group_size=4, max_new_tokens=1024,
                                          model="qwen3-1.7b", budget="3.6GiB"))
    kw = dict(batch=4, steps=3, train_seconds=0.5, update_seconds=0.25, replicas=2, budget_tokens=stream.pool,
              max_new_tokens=1024, cost=stream.cost)
    again = run_async_rollout(stream.groups, max_staleness=2, policy="vllm", **kw)
    mine = rows["async: vllm, K=2, round robin (AReaL)"]
    assert mine["seconds"] == pytest.approx(again.seconds)
    assert mine["stale_share"] == pytest.approx(again.stale_share) and mine["stale_share"] > 0
    steal = sum(run_rollout(stream.groups[4 * k:4 * k + 4], "steal", predicted=stream.predicted[16 * k:16 * k + 16],
                            replicas=2, budget_tokens=stream.pool, max_new_tokens=1024, cost=stream.cost).seconds
                for k in range(3))
    row = rows["sync: steal (lengthsched: each batch placed and stolen, then the learner)"]
    assert row["seconds"] == pytest.approx(steal + 3 * 0.75) and row["stale_share"] == 0
    assert row["trained_length_ratio"] == 1
    assert mine["trained_length_ratio"] == pytest.approx(again.trained_length_ratio)
    verl = run_verl_async(stream.groups, staleness_threshold=0.1, local_steps=4, policy="vllm", **kw)
    row = rows["async: vllm, S=0.1, 4 local updates (verl 0.9.1 fully async)"]
    assert row["seconds"] == pytest.approx(verl.seconds) and row["stale_share"] == pytest.approx(verl.stale_share)
    assert row["uneven_share"] == pytest.approx(verl.uneven_share)
    assert rows["stream: vllm, S=0, 4 local updates (verl 0.9.1 fully async)"]["stale_share"] == 0
    placed = run_async_rollout(stream.groups, max_staleness=2, policy="sglang", router="stream", prefill_share=0.1,
                               ways=1, predicted=stream.predicted, **kw)  # integrations.areal: whole groups
    row = rows["async: sglang, K=2, groups placed (lengthsched.integrations.areal)"]
    assert row["seconds"] == pytest.approx(placed.seconds) and row["stale_share"] == pytest.approx(placed.stale_share)
    areal = run_async_rollout(stream.groups, max_staleness=2, policy="sglang", router="placed", steal=True,
                              predicted=stream.predicted, **kw)
    row = rows["async: steal_sglang, K=2, groups placed, stolen (lengthsched)"]
    assert row["seconds"] == pytest.approx(areal.seconds) and row["stale_share"] == pytest.approx(areal.stale_share)
    inside = run_verl_async(stream.groups, staleness_threshold=0.1, local_steps=4, policy="vllm", router="placed",
                            steal=True, predicted=stream.predicted, snapshot_seconds=0.25, resubmit_seconds=0.05,
                            prefill_share=0.1, **kw)
    row = rows["async: steal_observed, S=0.1, 4 local updates (verl 0.9.1 fully async + "
               "lengthsched.integrations.verl_async: groups placed, stolen)"]
    assert row["seconds"] == pytest.approx(inside.seconds) and row["stale_share"] == pytest.approx(inside.stale_share)
    streamed = run_sync_steps(stream.groups[:12], "steal", predicted=stream.predicted[:48], local_steps=4, **kw)
    row = rows["stream: steal (lengthsched: each batch placed and stolen, 4 local updates as its groups finish)"]
    assert row["seconds"] == pytest.approx(streamed.seconds) and row["stale_share"] == 0
    assert row["uneven_share"] == pytest.approx(streamed.uneven_share)
    for r in out["rows"]:
        assert r["tokens_per_second"] == pytest.approx(r["trained_tokens"] / r["seconds"])
        assert r["on_policy_x_sync"] == pytest.approx((1 - r["stale_share"]) * r["x_sync"])
    assert "most trained tokens per second" in out["verdict"]
    assert main(["simulate", *ASYNC, "--max-staleness", "1"]) == 0
    text = capsys.readouterr().out
    assert "verdict: most trained tokens per second" in text and "interrupted:" in text and "uneven:" in text
    assert "half the synchronous rollout's mean" in text  # the default learner


@pytest.mark.parametrize("extra,needle", [
    (["--max-staleness", "-1"], "max_staleness"),
    (["--max-staleness", "1,1"], "max_staleness"),
    (["--max-staleness", "a"], "max_staleness"),
    (["--max-staleness", "1", "--oversample", "1.5"], "oversample"),
    (["--max-staleness", "1", "--draws", "2"], "draws"),
    (["--max-staleness", "1", "--train-seconds", "-1"], "train_seconds"),
    (["--max-staleness", "1", "--update-seconds", "-0.5"], "update_seconds"),
    (["--max-staleness", "1", "--max-concurrent", "0"], "max_concurrent"),
    (["--max-staleness", "1", "--policies", "vllm"], "policies"),
    (["--max-staleness", "1", "--routers", "least_loaded"], "routers"),
    (["--max-staleness", "1", "--resubmit-seconds", "1"], "resubmit_seconds"),
    (["--max-staleness", "1", "--staleness-threshold", "-0.1"], "staleness_threshold"),
    (["--max-staleness", "1", "--staleness-threshold", "nan"], "staleness_threshold"),
    (["--max-staleness", "1", "--staleness-threshold", "0.1,0.1"], "staleness_threshold"),
    (["--max-staleness", "1", "--staleness-threshold", "x"], "staleness_threshold"),
    (["--max-staleness", "1", "--local-steps", "3"], "local_steps"),
    (["--max-staleness", "1", "--local-steps", "0"], "local_steps"),
])
def test_max_staleness_bad_flags_are_one_line(extra, needle, capsys):
    assert main(["simulate", *ASYNC, *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err


def test_max_staleness_needs_steps(capsys):
    args = [a for a in ASYNC if a not in ("--steps", "3")]
    assert main(["simulate", *args, "--max-staleness", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--steps" in err


def test_staleness_threshold_picks_verls_rows(capsys):
    """--staleness-threshold 0,0.5 --local-steps 2: verl's recipe at those thresholds with 2 local updates."""
    assert main(["simulate", "--json", *ASYNC, "--max-staleness", "0", "--staleness-threshold", "0,0.5",
                 "--local-steps", "2", "--train-seconds", "0.5"]) == 0
    labels = [r["run"] for r in json.loads(capsys.readouterr().out)["rows"]]
    assert {"stream: vllm, S=0, 2 local updates (verl 0.9.1 fully async)",
            "async: vllm, S=0.5, 2 local updates (verl 0.9.1 fully async)"} <= set(labels)
    assert not any("S=0.1" in label for label in labels)


TURNS = ["simulate", "--prompts", "6", "--replicas", "2", "--group-size", "8", "--max-new-tokens", "1024",
         "--model", "qwen3-1.7b", "--budget", "4.2GiB", "--turns", "2-4", "--tool-tokens", "20-200"]


def test_turns_compare_the_multi_turn_runs_and_name_the_fastest(capsys, tmp_path):
    """--turns: one row per MULTITURN_RUNS run on the same sessions, each run_multiturn's step; the verdict names the
    fastest run that needs no oracle, with its gain over vLLM + verl's sticky routing; the JSON file holds it all."""
    from simulate import run_multiturn, split_turns
    from simulate.multiturn import MULTITURN_RUNS
    from simulate.multiturn_report import MULTITURN_LEGEND
    from simulate.options import SimulateOptions
    from simulate.rollout_report import rollout_step

    out_file = tmp_path / "turns.json"
    assert main(TURNS + ["--output", str(out_file)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("one multi-turn rollout step: 6 prompts x G=8 from castillo")
    assert "sessions of 2-4 turns" in out
    for label, *_ in MULTITURN_RUNS:
        assert label in out
    for column in MULTITURN_LEGEND:
        assert f"  {column}: " in out
    data = json.loads(out_file.read_text())
    rows = data["rows"]
    assert [row["run"] for row in rows] == [label for label, *_ in MULTITURN_RUNS]
    assert rows[0]["x_vllm"] == 1.0
    assert [row["oracle"] for row in rows] == [pred == "oracle" for *_, pred in MULTITURN_RUNS]
    fastest = min((row for row in rows if not row["oracle"]), key=lambda row: row["seconds"])
    if fastest["seconds"] < rows[0]["seconds"] * (1 - 1e-9):
        gain = rows[0]["seconds"] / fastest["seconds"] - 1
        assert data["verdict"] == (f"fastest: {fastest['run']}, {fastest['seconds']:.2f} s, {gain:.1%} faster than "
                                   f"{rows[0]['run']} ({rows[0]['seconds']:.2f} s)")
    else:
        assert data["verdict"].endswith("no run is faster")
    assert f"verdict: {data['verdict']}" in out
    # the runs are simulate.run_multiturn's on the step rollout_step makes of the same flags
    step = rollout_step(SimulateOptions(prompts=6, replicas=2, group_size=8, max_new_tokens=1024, model="qwen3-1.7b",
                                        budget="4.2GiB"))
    turns = split_turns(step.groups, turns=(2, 4), tool_tokens=(20, 200), tool_seconds=0.5, tool_sigma=0.5, seed=0)
    steal = run_multiturn(step.groups, turns, "steal", replicas=2, budget_tokens=step.pool, max_new_tokens=1024,
                          predicted=step.predicted, cost=step.cost)
    assert rows[5]["seconds"] == pytest.approx(steal.seconds) and rows[5]["moved_turns"] == steal.moved_turns


def test_turns_with_kv_offload_keep_evicted_conversations_in_host_memory(capsys, tmp_path):
    """--turns with --kv-offload: every run keeps what its replicas evict in host memory (run_multiturn(kv_offload=
    True)), the setting says so, and the rows' host hits are run_multiturn's."""
    from simulate import split_turns
    from simulate.multiturn import MULTITURN_RUNS, run_multiturn_row
    from simulate.options import SimulateOptions
    from simulate.rollout_report import rollout_step

    out_file = tmp_path / "offload.json"
    assert main(TURNS + ["--kv-offload", "--output", str(out_file)]) == 0
    assert "evicted KV kept in host memory (--kv-offload)" in capsys.readouterr().out
    rows = json.loads(out_file.read_text())["rows"]
    step = rollout_step(SimulateOptions(prompts=6, replicas=2, group_size=8, max_new_tokens=1024, model="qwen3-1.7b",
                                        budget="4.2GiB"))
    turns = split_turns(step.groups, turns=(2, 4), tool_tokens=(20, 200), tool_seconds=0.5, tool_sigma=0.5, seed=0)
    _, policy, options, pred = MULTITURN_RUNS[0]
    verl = run_multiturn_row(policy, options, step.groups, turns, None, replicas=2, budget_tokens=step.pool,
                             max_new_tokens=1024, cost=step.cost, kv_offload=True)
    assert rows[0]["seconds"] == pytest.approx(verl.seconds) and rows[0]["host_hits"] == verl.host_hits
    assert rows[1]["host_hits"] == 0  # no prefix cache: nothing of a conversation to offload


def test_turns_with_slime_compare_its_runs_on_sglang_and_name_the_fastest_there(capsys, tmp_path):
    """--framework slime: one row per MULTITURN_SLIME_RUNS run, each run_multiturn_row's step, against slime as it
    ships (SGLang's router on every turn); the verdict names the fastest on SGLang's engines and the fastest on
    vLLM's beside it."""
    from simulate import split_turns
    from simulate.multiturn import MULTITURN_SLIME_RUNS, run_multiturn_row
    from simulate.options import SimulateOptions
    from simulate.rollout_report import rollout_step

    out_file = tmp_path / "slime.json"
    assert main(TURNS + ["--framework", "slime", "--output", str(out_file)]) == 0
    out = capsys.readouterr().out
    assert "slime's rollout on SGLang" in out
    data = json.loads(out_file.read_text())
    rows = data["rows"]
    assert [row["run"] for row in rows] == [label for label, *_ in MULTITURN_SLIME_RUNS]
    assert rows[0]["x_reference"] == 1.0 and "x_vllm" not in rows[0]
    assert [row["policy"] for row in rows] == [p if p != "slime" else "sglang" for _, p, *_ in MULTITURN_SLIME_RUNS]
    assert rows[0]["router"] == "cache_aware" and rows[2]["router"] == "placed"
    sglang = [row for row in rows if "sglang" in row["policy"]]
    fastest = min(sglang, key=lambda row: row["seconds"])
    assert data["verdict"].startswith("on SGLang's engines, fastest: ")
    assert (fastest["run"] in data["verdict"]) or data["verdict"].split(";")[0].endswith("no run is faster")
    assert "; on vLLM's: " in data["verdict"] and f"verdict: {data['verdict']}" in out
    step = rollout_step(SimulateOptions(prompts=6, replicas=2, group_size=8, max_new_tokens=1024, model="qwen3-1.7b",
                                        budget="4.2GiB"))
    turns = split_turns(step.groups, turns=(2, 4), tool_tokens=(20, 200), tool_seconds=0.5, tool_sigma=0.5, seed=0)
    _, policy, options, _ = MULTITURN_SLIME_RUNS[2]
    planned = run_multiturn_row(policy, options, step.groups, turns, step.predicted, replicas=2,
                                budget_tokens=step.pool, max_new_tokens=1024, cost=step.cost)
    assert rows[2]["seconds"] == pytest.approx(planned.seconds)


@pytest.mark.parametrize("extra, name", [
    (["--turns", "0"], "turns"), (["--turns", "4-2"], "turns"), (["--turns", "two"], "turns"),
    (["--framework", "slime"], "framework"),
    (["--turns", "2", "--tool-tokens", "9-3"], "tool_tokens"),
    (["--turns", "2", "--tool-seconds", "0"], "tool_seconds"),
    (["--turns", "2", "--tool-sigma", "-1"], "tool_sigma"), (["--tool-seconds", "2"], "tool_seconds"),
    (["--tool-tokens", "5"], "tool_tokens"), (["--turns", "2", "--policies", "vllm"], "policies"),
    (["--turns", "2", "--steps", "2", "--oversample", "1"], "oversample"),
    (["--turns", "2", "--predictor", "history"], "predictor"),
    (["--turns", "2-3", "--tool-tokens", "3000-3000", "--budget", "3.8GiB"], "budget")])
def test_bad_multi_turn_settings_are_one_line(extra, name, capsys):
    assert main(SMALL + extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("lengthsched simulate: error: ") and f"argument '{name}'" in err and err.count("\n") == 1


def test_turns_without_a_rollout_step_are_an_error(capsys):
    assert main(["simulate", "--turns", "2-5"]) == 2
    assert "--prompts or --replicas with it" in capsys.readouterr().err


def test_over_sampled_steps_with_a_compressed_cache(capsys):
    """--steps --oversample --partial-rollout with --kv-compression: every row runs the cache (the reference
    too), the header says a resumed sample's partial response is held in it, and the cache buys kept tokens per
    second over the dense steps."""
    args = SMALL + ["--budget", "3.6GiB", "--json", "--steps", "3", "--oversample", "1.5", "--partial-rollout",
                    "--policies", "vllm,steal,sglang", "--routers", "least_loaded,slime_plan", "--in-flight", "8"]
    assert main(args) == 0
    dense = {(r["policy"], r["router"]): r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert main(args + ["--kv-compression", "64:16"]) == 0
    data = json.loads(capsys.readouterr().out)
    sparse = {(r["policy"], r["router"]): r for r in data["rows"]}
    assert "KV compressed (64:16)" in data["setting"] and "a resumed sample's partial response" in data["setting"]
    assert set(sparse) == set(dense) and ("sglang", "slime_plan") in sparse
    for key, row in sparse.items():
        assert "error" not in row or not row["error"], (key, row)
        assert row["kept_tokens_per_second"] > dense[key]["kept_tokens_per_second"], key
    # one over-sampled step
    assert main(SMALL + ["--json", "--oversample", "1.5", "--policies", "vllm,steal", "--kv-compression", "64:16"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "KV compressed (64:16)" in data["setting"] and "over-sampled" in data["setting"]
    assert all(r.get("seconds") for r in data["rows"])
    # verl's dynamic sampling (no partial rollout), its stealing manager's rows included
    assert main(SMALL + ["--json", "--steps", "2", "--verl-dynamic-sampling", "--valid-share", "0.6",
                         "--kv-compression", "64:16"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "KV compressed (64:16)" in data["setting"] and len(data["rows"]) == 4
    assert all(r.get("kept_tokens_per_second") and not r.get("error") for r in data["rows"])


def test_a_rollout_step_with_a_compressed_cache(capsys, monkeypatch):
    """--kv-compression in a rollout step: the rows that run one by default, the cache in the header, fewer
    seconds than dense; what cannot run one is a one-line error naming its flag."""
    args = SMALL + ["--budget", "3.6GiB", "--json", "--routers", "least_loaded"]
    assert main(args + ["--policies", "vllm,steal"]) == 0
    dense = {r["policy"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert main(args + ["--kv-compression", "64:16"]) == 0
    data = json.loads(capsys.readouterr().out)
    sparse = {r["policy"]: r for r in data["rows"]}
    from simulate.options import COMPRESSED_ROLLOUT_POLICIES

    assert set(sparse) == set(COMPRESSED_ROLLOUT_POLICIES) >= {"vllm", "vllm_priority", "sglang", "sglang_priority",
                                                               "steal", "steal_longest", "steal_observed", "seer",
                                                               "seer_divided", "placed_adaptive", "steal_sglang"}
    assert "KV compressed (64:16): each request holds and reads at most 80 generated tokens" in data["setting"]
    for policy in ("vllm", "steal"):
        assert sparse[policy]["seconds"] < dense[policy]["seconds"]
    # slime's in-flight cap and its planned client run under the cache too
    assert main(SMALL + ["--kv-compression", "64:16", "--in-flight", "16", "--policies", "sglang,vllm", "--routers",
                         "cache_aware,slime_plan", "--json"]) == 0
    rows = {(r["policy"], r["router"]) for r in json.loads(capsys.readouterr().out)["rows"] if r.get("seconds")}
    assert {("sglang", "slime_plan"), ("vllm", "cache_aware"), ("sglang", "cache_aware")} <= rows
    for extra, flag in ((["--kv-compression", "64"], "kv_compression"),):
        options = SMALL + (["--kv-compression", "64:16"] if extra[0] != "--kv-compression" else []) + extra
        assert main(options) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"argument '{flag}'" in err, err
    # a policy registered without a cache's count (none is, today) is refused by name
    import dataclasses

    from lengthsched.runtime.registry import POLICIES

    monkeypatch.setitem(POLICIES, "steal_sglang", dataclasses.replace(POLICIES["steal_sglang"], compressed=False))
    assert main(SMALL + ["--kv-compression", "64:16", "--policies", "vllm,steal_sglang"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "argument 'policies'" in err and "steal_sglang" in err, err
