"""The ``lengthsched`` command: the bundled example, JSON output, atomic files, one-line errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lengthsched import Plan
from lengthsched.cli import main
from lengthsched.io import atomic_write_bytes, atomic_write_text


def run(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_runs_the_bundled_example(capsys):
    code, out, err = run(["plan"], capsys)
    assert code == 0 and err == ""
    assert "10 completions, slots mode, 4 slots" in out
    assert "expected steps" in out and "lower bound" in out
    assert "peak reserved" in out  # the example names a model


def test_plan_json_round_trips(tmp_path, capsys):
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("5, 3\n8 2\n")
    code, out, _ = run(["plan", str(lengths), "--slots", "2", "--json"], capsys)
    assert code == 0
    plan = Plan.from_json(out)
    assert plan.expected_steps == 10 and plan.lower_bound == 9


def test_plan_reads_stdin_and_writes_output_atomically(tmp_path, capsys, monkeypatch):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps({"lengths": [40, 10, 30], "prompt_tokens": 20})))
    target = tmp_path / "plan.json"
    code, out, _ = run(["plan", "-", "--budget", "4GiB", "--max-new-tokens", "64", "--output", str(target)], capsys)
    assert code == 0 and "budget mode" in out
    plan = Plan.from_json(target.read_text())
    assert plan.prompt_tokens == 20 and plan.budget_bytes == 4 * 2**30 and plan.model == "Qwen/Qwen3-1.7B"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_plan_says_when_it_clips_lengths_to_max_new_tokens(capsys, monkeypatch):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("10 200 300"))
    code, out, err = run(["plan", "-", "--slots", "2", "--max-new-tokens", "100"], capsys)
    assert code == 0 and "2 of 3 lengths above max_new_tokens 100 are planned as 100" in err
    monkeypatch.setattr(sys, "stdin", io.StringIO("10 20"))
    code, out, err = run(["plan", "-", "--slots", "2", "--max-new-tokens", "100"], capsys)
    assert code == 0 and "note" not in err


@pytest.mark.parametrize("text", ["[652, 1e400]", "652 799 inf", "652 799 nan"])
def test_plan_refuses_a_length_that_is_not_a_number_in_one_line(text, capsys, monkeypatch):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    code, out, err = run(["plan", "-", "--slots", "2"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "argument 'lengths'" in err, err


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["plan", "--slots", "0"], "argument 'slots' (--slots): got 0"),
        (["plan", "--budget", "lots"], "argument 'budget' (--budget): got 'lots'"),
        (["plan", "--budget", "1GiB"], "argument 'budget' (--budget): got '1GiB'"),
        (["plan", "--model", "gpt-9", "--slots", "2"], "argument 'model' (--model): got 'gpt-9'"),
        (["plan", "/no/such/file", "--slots", "2"], "argument 'lengths': got '/no/such/file'"),
        (["plan", "--eps", "0"], "argument 'eps'"),
    ],
)
def test_errors_are_one_line_and_exit_2(args, fragment, capsys, tmp_path):
    target = tmp_path / "plan.json"
    code, out, err = run(args + ["--output", str(target)], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and fragment in err and err.startswith("lengthsched plan: error:")
    assert not target.exists(), "nothing is written on failure"


def test_bad_lengths_file(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_text("4 -2 7")
    code, _, err = run(["plan", str(bad), "--slots", "2"], capsys)
    assert code == 2 and "argument 'lengths'" in err and "found -2" in err
    bad.write_text('{"lengths": [1, 2')
    code, _, err = run(["plan", str(bad), "--slots", "2"], capsys)
    assert code == 2 and "valid JSON" in err


def test_errors_name_the_flag_the_user_gave(tmp_path, capsys):
    """Errors raised deep inside a command name the flag the value came from, in one line."""
    profile = tmp_path / "profile.jsonl"
    profile.write_text('{"id": "a", "outcomes": [1, 0]}\n')
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"prompt_id": "a", "prompt_tokens": 10, "lengths": [1, 2]}\n{"prompt_id": "b", "lengths": "x"}\n')
    data = tmp_path / "data.jsonl"
    data.write_text("{}\n")
    trace.with_name("lengths.txt").write_text("10 20 30")
    for args, fragment in (
            (["budget", str(profile), "--simulate", "fixed_slot,bogus", "--slots", "4"], "argument 'simulate'"),
            (["budget", str(profile), "--simulate", "fixed_slot"], "--slots or --kv-budget with --simulate"),
            (["simulate", "--workload", str(trace)], "--workload: " + str(trace) + " line 2: field 'lengths'"),
            (["train", "--data", f"bogusfmt:{data}"], "unknown 'bogusfmt'"),
            (["plan", str(trace.with_name("lengths.txt")), "--slots", "2", "--dtype", "float32"],
             "--dtype only with --budget or --model"),
            (["sample", "-G", "4", "--policy", "vllm"], "argument 'budget' (--budget)")):
        code, _, err = run(args, capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and fragment in err, (args, err)


def test_argparse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--refill", "random"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice" in err


def test_console_script_is_installed(tmp_path):
    exe = shutil.which("lengthsched", path=str(Path(sys.executable).parent))
    assert exe, "pip install -e . puts the lengthsched console script next to python"
    result = subprocess.run([exe, "plan", "--slots", "3", "--json"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert Plan.from_json(result.stdout).slots == 3


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "plan.json"
    target.write_text("old")

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_atomic_write_bytes_writes_exactly_and_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "figure.png"
    data = bytes(range(256)) * 3  # not text: every byte value, CR and LF included
    atomic_write_bytes(target, data)
    assert target.read_bytes() == data

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full") as caught:
        atomic_write_bytes(target, b"new")
    assert str(target) in str(caught.value)  # the path asked for, not the hidden temporary file
    assert target.read_bytes() == data
    assert [p.name for p in tmp_path.iterdir()] == ["figure.png"]


def test_a_figure_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from simulate.plots import pyplot, save_figure

    plt = pyplot()
    target = tmp_path / "kv.png"
    target.write_bytes(b"old figure")
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    monkeypatch.setattr(os, "replace", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        save_figure(fig, target)
    assert target.read_bytes() == b"old figure" and [p.name for p in tmp_path.iterdir()] == ["kv.png"]
    assert not plt.get_fignums()  # closed either way
    monkeypatch.undo()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    save_figure(fig, target)
    assert target.read_bytes().startswith(b"\x89PNG")
    save_figure(plt.subplots()[0], tmp_path / "kv.svg")  # the format follows the suffix
    assert b"<svg" in (tmp_path / "kv.svg").read_bytes()[:400]


def test_atomic_write_gives_normal_permissions(tmp_path):
    target = tmp_path / "fresh.json"
    atomic_write_text(target, "x")
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def test_output_to_a_directory_is_one_line(tmp_path, capsys):
    code, out, err = run(["plan", "--slots", "2", "--output", str(tmp_path)], capsys)
    assert code == 2 and err.count("\n") == 1 and "is a directory" in err
