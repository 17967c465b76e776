"""``lengthsched sample``: the offline default, trace replay, JSON output and one-line errors."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from lengthsched.cli import main


def test_offline_default_says_it_is_a_random_model(capsys):
    assert main(["sample", "-G", "4", "--max-new-tokens", "12", "--slots", "2"]) == 0
    out = capsys.readouterr().out
    assert "tiny-qwen3 (random weights built from a config" in out and "decode steps" in out
    assert "memory model" in out


def test_replay_json_and_output_file(tmp_path, capsys):
    target = tmp_path / "group.json"
    assert main(["sample", "-G", "3", "--max-new-tokens", "20", "--lengths", "5,9,2", "--policy", "length_aware",
                 "--slots", "2", "--json", "--output", str(target)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["lengths"] == [5, 9, 2] and summary["peak_kv_bytes"] == summary["peak_model_kv_bytes"]
    assert summary["steps"] == 9  # slots {2, 5} then 9 in the other: the plan's makespan
    saved = json.loads(target.read_text())
    assert [len(c) for c in saved["completions"]] == [5, 9, 2] and len(saved["logprobs"][1]) == 9


@pytest.mark.parametrize("argv, message", [
    (["sample", "-G", "3", "--lengths", "1,2"], "one per completion"),
    (["sample", "--budget", "1KiB", "--policy", "length_aware"], "argument 'budget'"),
    (["sample", "-G", "0"], "group_size"),
    (["sample", "--model", "nobody/no-such-model"], "without network access pass a local model directory"),
])
def test_errors_are_one_line(argv, message, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
