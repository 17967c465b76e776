"""``lengthsched plan-rollout``: one rollout step's plan from a JSON-lines file, for engines outside Python."""

from __future__ import annotations

import io
import json

import pytest

from lengthsched.cli import main
from lengthsched.integrations import decode_replica, plan_rollout
from lengthsched.rollout_cli import read_step


def _step(tmp_path, groups, name="step.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(g) + "\n" for g in groups))
    return str(path)


GROUPS = [{"key": f"p{i}", "predicted": 100 + 137 * i % 900, "size": 4, "prompt_tokens": 50 + 11 * i}
          for i in range(12)]


def test_the_json_plan_is_plan_rollouts_with_every_completion_placed_and_ordered(tmp_path, capsys):
    step = _step(tmp_path, GROUPS)
    out = tmp_path / "plan.json"
    assert main(["plan-rollout", step, "--replicas", "3", "--pool-tokens", "1000", "--json", "--output",
                 str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == data  # the file holds what was printed
    keys = [g["key"] for g in GROUPS for _ in range(4)]
    pred = [g["predicted"] for g in GROUPS for _ in range(4)]
    prompts = [g["prompt_tokens"] for g in GROUPS for _ in range(4)]
    plan = plan_rollout(keys, pred, replicas=3, placement="ways", prompt_lens=prompts, budget_tokens=1000)
    rows = data["rows"]
    assert [r["replica"] for r in rows] == list(plan.replica) and [r["priority"] for r in rows] == list(plan.priority)
    assert [(r["key"], r["completion"]) for r in rows] == [(g["key"], j) for g in GROUPS for j in range(4)]
    assert all(decode_replica(r["priority"], 3) == r["replica"] for r in rows)
    assert sorted(data["submission_order"], key=lambda i: rows[i]["priority"]) == data["submission_order"]
    assert sorted(data["submission_order"]) == list(range(len(rows)))
    for k in range(3):
        mine = [r for r in rows if r["replica"] == k]
        assert data["replica_work"][k] == sum(r["predicted"] for r in mine)
        assert data["replica_completions"][k] == len(mine)
        held = {r["key"] for r in mine}
        assert data["replica_groups"][k] == len(held)
        assert data["replica_prompt_tokens"][k] == sum(g["prompt_tokens"] for g in GROUPS if g["key"] in held)
    for g, entry in zip(GROUPS, data["groups"]):
        on = sorted({r["replica"] for r in rows if r["key"] == g["key"]})
        assert entry["on"] == on and entry["replica"] == (on[0] if len(on) == 1 else -1)
    # a pool this small against 12 x 4 completions: the step is crowded, whole groups (steal's rule)
    assert {len(g["on"]) for g in data["groups"]} == {1} and data["order"] == "batch"


def test_the_table_says_how_groups_were_placed_and_what_each_replica_holds(tmp_path, capsys):
    step = _step(tmp_path, GROUPS)
    assert main(["plan-rollout", step, "--replicas", "2", "--budget", "40GiB", "--model", "qwen3-1.7b"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("12 groups, 48 completions (") and "on 2 replicas with pools of " in out
    assert "placement ways (each group on 2 replicas)" in out  # a roomy pool: verl's spread
    lines = out.splitlines()
    assert lines[2].split()[:3] == ["replica", "groups", "completions"]
    assert [line.split()[0] for line in lines[3:5]] == ["0", "1"]
    assert "submission_order" in out
    for placement in ("groups", "spread", "classes"):
        assert main(["plan-rollout", step, "--replicas", "2", "--placement", placement, "--pool-tokens", "4000",
                     "--order", "longest"]) == 0
        assert f"placement {placement}" in capsys.readouterr().out


def test_a_list_of_predictions_per_group_and_stdin(tmp_path, capsys, monkeypatch):
    text = "\n".join(json.dumps(g) for g in [{"predicted": [10, 20.4, 30]}, {"key": "b", "predicted": [5], "size": 1,
                                                                              "prompt_tokens": 3}]) + "\n\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    assert main(["plan-rollout", "-", "--replicas", "2", "--placement", "spread", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(r["key"], r["predicted"]) for r in data["rows"]] == [(1, 10), (1, 20), (1, 30), ("b", 5)]
    assert [r["replica"] for r in data["rows"]] == [0, 1, 0, 1] and data["pool_tokens"] is None


@pytest.mark.parametrize("line, expected", [
    ({"predicted": 5}, "'size'"),
    ({"size": 4}, "'predicted'"),
    ({"predicted": [1, 2], "size": 3}, "'size' equal to the 2"),
    ({"predicted": -1, "size": 2}, "'predicted' a number >= 0"),
    ({"predicted": 10, "size": 2.5}, "'size' an integer >= 1"),
    ({"predicted": 10, "size": True}, "'size' an integer >= 1"),
    ({"predicted": [], "size": 0}, "at least one completion"),
    ({"predicted": [1], "prompt_tokens": -2}, "'prompt_tokens' an integer >= 0"),
    ({"predicted": [1], "key": [1]}, "a string or integer 'key'"),
    ({"predicted": [1], "tokens": 3}, "unknown: 'tokens'"),
    ({"predicted": 5, "size": 10**12}, "'size' at most 1,048,576"),
])
def test_a_bad_line_is_one_line_naming_the_file_and_line(tmp_path, capsys, line, expected):
    step = _step(tmp_path, [{"key": "a", "predicted": [4]}, line])
    assert main(["plan-rollout", step, "--replicas", "2", "--placement", "spread"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "got 'line 2 of " in err and expected in err


def test_bad_options_are_one_line_naming_the_flag(tmp_path, capsys):
    step = _step(tmp_path, GROUPS)
    for args, flag in ((["--replicas", "0", "--placement", "spread"], "--replicas"),
                       (["--replicas", "2"], "--pool-tokens"),
                       (["--replicas", "2", "--pool-tokens", "0"], "--pool-tokens"),
                       (["--replicas", "2", "--pool-tokens", "10", "--budget", "4GiB"], "--budget"),
                       (["--replicas", "2", "--budget", "1GiB", "--model", "qwen3-8b"], "--budget"),
                       (["--replicas", "2", "--pool-tokens", "5", "--placement", "spread"], "more than the largest "
                                                                                              "prompt")):
        assert main(["plan-rollout", step] + args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and flag in err, err
    dup = _step(tmp_path, [{"key": "a", "predicted": [1]}, {"key": "a", "predicted": [2]}], "dup.jsonl")
    empty = _step(tmp_path, [], "empty.jsonl")
    for path, expected in ((dup, "no other group has"), (empty, "at least one group")):
        assert main(["plan-rollout", path, "--replicas", "2", "--placement", "spread"]) == 2
        assert expected in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:  # --replicas is required (argparse says so)
        main(["plan-rollout", step])
    assert stop.value.code == 2 and "--replicas" in capsys.readouterr().err


def test_read_step_keys_default_to_line_numbers():
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write('{"predicted": 3, "size": 2}\n\n{"predicted": [1]}\n')
    groups = read_step(f.name)
    assert [(g.key, g.predicted, g.prompt_tokens) for g in groups] == [(1, (3, 3), 0), (3, (1,), 0)]


def test_loads_place_a_further_batch_away_from_busy_replicas(tmp_path, capsys):
    step = _step(tmp_path, [{"key": k, "predicted": 100, "size": 2} for k in "abc"])
    assert main(["plan-rollout", step, "--replicas", "3", "--placement", "groups", "--loads", "0,500,50",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [g["replica"] for g in data["groups"]] == [0, 2, 0]  # 200 to 0, 200 to 2 (50), 200 to 0 (200 < 250)
    assert data["replica_work"] == [400, 0, 200]  # this batch only
    for loads in ("1,2", "a,b,c", "1,-2,3"):
        assert main(["plan-rollout", step, "--replicas", "3", "--placement", "groups", "--loads", loads]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--loads" in err
    assert main(["plan-rollout", step, "--replicas", "3", "--placement", "spread", "--loads", "1,2,3"]) == 2
    assert "only 'groups' and 'ways'" in capsys.readouterr().err
