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


def test_a_compressed_cache_runs_more_at_once(capsys):
    """--kv-compression: a budget of 30 KV tokens runs one 24-token completion at a time dense, two
    compressed to 8 + 4 tokens; both finish every completion; a bad value is one line."""
    from sampler import model_memory
    from sampler.cli import tiny_qwen3

    mem = model_memory(tiny_qwen3())
    base = ["sample", "-G", "4", "--max-new-tokens", "24", "--lengths", "24,24,24,24", "--policy", "micro",
            "--slots", "4", "--json"]
    assert main(base) == 0
    prompt = json.loads(capsys.readouterr().out)["prompt_tokens"]
    budget = mem.weights_bytes + mem.prompt_kv_bytes(prompt) + mem.activation_bytes(4) + 30 * mem.kv_bytes_per_token
    assert main(base + ["--budget", str(budget)]) == 0
    dense = json.loads(capsys.readouterr().out)
    assert main(base + ["--budget", str(budget), "--kv-compression", "8:4"]) == 0
    sparse = json.loads(capsys.readouterr().out)
    assert (dense["steps"], sparse["steps"]) == (96, 48) and sparse["lengths"] == dense["lengths"] == [24] * 4
    # twice the sequences in the same KV: each holds at most 12 generated tokens where one held 24
    assert sparse["kv_compression"] == "8:4" and sparse["peak_kv_bytes"] == dense["peak_kv_bytes"]
    assert main(base + ["--kv-compression", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "argument 'kv_compression'" in err
