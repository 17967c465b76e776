"""The command line as a new user meets it (issue 17): Ctrl-C, output paths checked before the run,
--version, examples and defaults in the help, budget and plan inputs, errors naming the flag typed."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lengthsched import Plan
from lengthsched.cli import COMMANDS, _table, build_parser, main
from lengthsched.io import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]


def run(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def write_profile(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.fixture
def profile(tmp_path):
    return write_profile(tmp_path / "profile.jsonl", [
        {"id": "a", "outcomes": [1, 0, 0, 1], "lengths": [30, 40, 50, 60]},
        {"id": "b", "outcomes": [0, 0, 1, 0], "lengths": [70, 80, 90, 100]},
        {"id": "c", "outcomes": [1, 1, 1, 1]},
    ])


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class _IdleTerminal(_Tty):
    """A terminal nobody types into: reading it would wait forever."""

    def read(self, *args):
        raise AssertionError("the command waited on the terminal without saying so")

    readline = read


# 1. Ctrl-C: one line, exit 130 ----------------------------------------------------------------

def test_ctrl_c_is_one_line_and_exit_130(profile, capsys, monkeypatch):
    import lengthsched.sgpo

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(lengthsched.sgpo, "plan_budget", interrupted)
    code, out, err = run(["budget", str(profile)], capsys)
    assert code == 130 and out == "" and err == "lengthsched budget: interrupted\n"


def test_ctrl_c_in_any_command_is_one_line(capsys, monkeypatch):
    import lengthsched.cli as cli

    def interrupted(opts):
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.COMMANDS, "plan", ("lengthsched.options:PlanOptions", interrupted))
    code, _, err = run(["plan"], capsys)
    assert code == 130 and err == "lengthsched plan: interrupted\n"


# 2. Output paths are checked before the run, naming the flag ---------------------------------

def test_plan_rejects_an_empty_output(capsys):
    code, out, err = run(["plan", "--output", ""], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--output" in err and "not empty" in err


@pytest.mark.parametrize("command", [["plan"], ["budget", "PROFILE"]])
def test_an_unwritable_output_is_rejected_before_the_run(command, profile, tmp_path, capsys, monkeypatch):
    import lengthsched.cli as cli
    import lengthsched.sgpo

    def must_not_run(*args, **kwargs):
        raise AssertionError("the command ran before its --output was checked")

    monkeypatch.setattr(cli, "plan_group", must_not_run)
    monkeypatch.setattr(lengthsched.sgpo, "plan_budget", must_not_run)
    args = [str(profile) if a == "PROFILE" else a for a in command]
    missing = tmp_path / "no" / "such" / "dir" / "out.json"
    code, out, err = run(args + ["--output", str(missing)], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "(--output)" in err and "does not exist" in err and ".tmp" not in err


def test_simulate_output_and_plot_are_checked_before_the_run(tmp_path, capsys):
    a_file = tmp_path / "figures"
    a_file.write_text("not a directory")
    code, _, err = run(["simulate", "--groups", "2", "--plot", str(a_file / "sub")], capsys)
    assert code == 2 and "(--plot)" in err and "is a file" in err
    code, _, err = run(["simulate", "--groups", "2", "--output", str(tmp_path / "missing" / "r.json")], capsys)
    assert code == 2 and "(--output)" in err


def test_every_command_marks_its_output_paths():
    """Every option dataclass field that names a path the command writes is checked by main()."""
    from lengthsched.options import output_fields

    seen = {}
    for name, entry in COMMANDS.items():
        for sub, (cls, _) in _table(entry).items():
            seen[" ".join(filter(None, (name, sub)))] = output_fields(cls)
    assert seen["plan"] == {"output": "file"} and seen["budget"] == {"output": "file", "verl_output": "file"}
    assert seen["simulate"] == {"plot": "dir", "output": "file"}
    assert seen["cost fit"] == {"out": "file"}
    assert seen["sample"] == {"steps_out": "file", "output": "file"}
    assert seen["predict"]["output"] == "file" and seen["eval-predictor"]["output"] == "file"
    assert seen["train"]["out"] == "dir"


def test_cost_fit_out_is_checked_before_fitting(tmp_path, capsys):
    samples = tmp_path / "steps.jsonl"
    samples.write_text("not even json\n")
    code, _, err = run(["cost", "fit", str(samples), "--out", str(tmp_path / "missing" / "cost.json")], capsys)
    assert code == 2 and "(--out)" in err and "does not exist" in err


def test_atomic_write_errors_name_the_target_not_the_temporary_file(tmp_path):
    target = tmp_path / "missing" / "plan.json"
    with pytest.raises(FileNotFoundError) as exc:
        atomic_write_text(target, "x")
    assert str(target) in str(exc.value) and ".tmp" not in str(exc.value)
    with pytest.raises(OSError, match="empty path"):
        atomic_write_text("", "x")


def test_the_table_is_printed_before_the_output_is_written(tmp_path, capsys, monkeypatch):
    import lengthsched.cli as cli

    def full(path, text):
        raise OSError(f"cannot write {str(path)!r}: No space left on device")

    monkeypatch.setattr(cli, "atomic_write_text", full)
    code, out, err = run(["plan", "--output", str(tmp_path / "plan.json")], capsys)
    assert code == 2 and "expected steps" in out and "No space left" in err


# 3. --version, examples, defaults, required, no silent wait on a terminal ----------------------

def test_version(capsys):
    from lengthsched import __version__

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"lengthsched {__version__}"


def test_every_commands_help_prints(capsys):
    """--help of every command and subcommand prints (a '%' in a flag's help once made argparse raise)."""
    for name in COMMANDS:
        subs = [name] if "" in _table(COMMANDS[name]) else [f"{name} {sub}" for sub in _table(COMMANDS[name])]
        for command in subs:
            with pytest.raises(SystemExit) as exc:
                main([*command.split(), "--help"])
            assert exc.value.code == 0, command
            assert "usage: lengthsched" in capsys.readouterr().out, command


def test_top_level_help_has_runnable_examples(capsys):
    text = build_parser().format_help()
    assert "examples:" in text and "lengthsched plan" in text and "--help" in text
    # the examples that need no file of the user's run as written
    for example in ("lengthsched plan", "lengthsched cost show --model qwen3-8b --gpu h100"):
        assert example in text
        assert main(example.split()[1:]) == 0, example
    assert "expected steps" in capsys.readouterr().out


def _subparsers(parser):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def test_every_flag_with_a_default_shows_it():
    parser = build_parser()
    commands = {}
    for name, sub in _subparsers(parser).items():
        inner = _subparsers(sub)
        commands.update({f"{name} {k}": v for k, v in inner.items()} if inner else {name: sub})
    missing = []
    for name, sub in commands.items():
        for action in sub._actions:
            if action.nargs == 0 or action.dest == "help":
                continue
            shown = action.default is not None and action.default is not False  # 0 must show, e.g. --seed
            if shown and f"(default: {action.default})" not in (action.help or ""):
                missing.append(f"{name} {action.dest}")
    assert not missing, missing
    assert "(default: 0)" in next(a for a in commands["budget"]._actions if a.dest == "seed").help


def test_required_arguments_are_marked_and_enforced(capsys):
    fit = _subparsers(_subparsers(build_parser())["cost"])["fit"]
    samples = next(a for a in fit._actions if a.dest == "samples")
    assert "(required)" in samples.help
    with pytest.raises(SystemExit) as exc:
        main(["cost", "fit"])
    assert exc.value.code == 2 and "required: samples" in capsys.readouterr().err


def test_budget_without_a_profile_on_a_terminal_says_what_it_needs(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", _IdleTerminal())
    code, out, err = run(["budget"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "argument 'profile'" in err and "stdin" in err


def test_reading_stdin_from_a_terminal_is_announced(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", _Tty('{"id": "a", "outcomes": [1, 0]}\n'))
    code, out, err = run(["budget", "-"], capsys)
    assert code == 0 and "reading PROFILE from stdin" in err
    monkeypatch.setattr(sys, "stdin", _Tty("5 3 8 2"))
    code, out, err = run(["plan", "-", "--slots", "2"], capsys)
    assert code == 0 and "reading LENGTHS from stdin" in err


def test_every_positional_that_reads_stdin_is_announced():
    """main() announces stdin for any command whose positional says it reads stdin (predict too)."""
    from lengthsched.options import stdin_fields

    found = {}
    for name, entry in COMMANDS.items():
        for cls, _ in _table(entry).values():
            found.update({f"{name} {field}": none for field, none in stdin_fields(cls).items()})
    assert found["plan lengths"] is False and found["budget profile"] is False
    assert found["predict input"] is True


def test_budget_reads_a_piped_profile_without_an_argument(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"id": "a", "outcomes": [1, 0]}\n'))
    code, out, err = run(["budget"], capsys)
    assert code == 0 and err == "" and "1 prompts profiled" in out


# 4. budget ------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [2, -1, 0.5, "yes", None, [1]])
def test_budget_rejects_outcomes_other_than_0_and_1(bad, tmp_path, capsys):
    path = write_profile(tmp_path / "p.jsonl", [{"id": "a", "outcomes": [1, 0]}, {"id": "b", "outcomes": [0, bad]}])
    code, out, err = run(["budget", str(path)], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "argument 'outcomes'" in err and f"{path}:2" in err and f"got {bad!r}" in err


def test_budget_accepts_true_and_false_outcomes(tmp_path, capsys):
    path = write_profile(tmp_path / "p.jsonl", [{"id": "a", "outcomes": [True, False]}])
    code, out, _ = run(["budget", str(path), "--json"], capsys)
    assert code == 0 and json.loads(out)["prompts"][0]["success_rate"] == 0.5


@pytest.mark.parametrize("record,name", [
    ({"id": "a", "outcomes": [1, 0], "lengths": ["x", 3]}, "lengths"),
    ({"id": "a", "outcomes": [1, 0], "prompt_tokens": "many"}, "prompt_tokens"),
    ({"id": "a", "solved": "one", "samples": 4}, "solved"),
])
def test_budget_profile_fields_are_errors_not_tracebacks(record, name, tmp_path, capsys):
    path = write_profile(tmp_path / "p.jsonl", [record])
    code, _, err = run(["budget", str(path)], capsys)
    assert code == 2 and f"argument '{name}'" in err and f"{path}:1" in err


@pytest.mark.parametrize("flag", [["--slots", "4"], ["--kv-budget", "1000"]])
def test_budget_simulation_flags_without_simulate_are_rejected(flag, profile, capsys):
    code, out, err = run(["budget", str(profile), *flag], capsys)
    assert code == 2 and out == "" and f"({flag[0]})" in err and "--simulate" in err


def test_budget_max_new_tokens_error_names_the_flag(profile, capsys):
    code, _, err = run(["budget", str(profile), "--simulate", "fixed_slot", "--max-new-tokens", "0"], capsys)
    assert code == 2 and "(--max-new-tokens)" in err and "'lengths'" not in err


# 5. plan ----------------------------------------------------------------------------------------

def test_plan_uses_the_inputs_slots_with_the_inputs_budget(tmp_path, capsys):
    path = tmp_path / "group.json"
    path.write_text(json.dumps({"lengths": [400, 300, 200, 100, 50, 25], "budget": "40GiB", "slots": 2,
                                "max_new_tokens": 512}))
    code, out, _ = run(["plan", str(path), "--json"], capsys)
    assert code == 0
    plan = Plan.from_json(out)
    assert plan.mode == "budget" and plan.slots == 2


def test_plan_says_when_the_inputs_slots_is_not_used(tmp_path, capsys):
    path = tmp_path / "group.json"
    path.write_text(json.dumps({"lengths": [400, 300, 200, 100], "slots": 2, "max_new_tokens": 512}))
    code, out, err = run(["plan", str(path), "--budget", "40GiB", "--json"], capsys)
    assert code == 0 and Plan.from_json(out).slots == 4
    assert "the input's slots (2) is not used under --budget" in err and "--slots 2" in err


def test_plan_rejects_unknown_keys_naming_them_and_the_known_ones(tmp_path, capsys):
    path = tmp_path / "group.json"
    path.write_text(json.dumps({"lengths": [4, 3], "slot": 2}))
    code, out, err = run(["plan", str(path)], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "'slot'" in err and "slots" in err and "reserve_lengths" in err


def test_plan_budget_error_names_the_flag_not_budget_bytes(capsys):
    code, _, err = run(["plan", "--budget", "1GiB", "--slots", "2"], capsys)
    assert code == 2 and "(--budget)" in err and "budget_bytes" not in err


@pytest.mark.parametrize("record,key", [
    ({"lengths": [3, 4], "slots": 0}, "slots"),
    ({"lengths": [3, 4], "budget": "1GiB"}, "budget"),
    ({"lengths": [3, 4], "slots": 2, "prompt_tokens": -5}, "prompt_tokens"),
    ({"lengths": [3, 4], "slots": 2, "model": "gpt-9"}, "model"),
])
def test_plan_errors_on_a_value_from_the_input_name_the_file_not_a_flag(record, key, tmp_path, capsys):
    path = tmp_path / "group.json"
    path.write_text(json.dumps(record))
    code, _, err = run(["plan", str(path)], capsys)
    assert code == 2 and err.count("\n") == 1
    assert f"argument '{key}' in '{path}'" in err and f"--{key.replace('_', '-')}" not in err


def test_an_error_on_a_positional_argument_is_not_given_a_flag(capsys):
    code, _, err = run(["plan", "/no/such/file", "--slots", "2"], capsys)
    assert code == 2 and "argument 'lengths': got" in err and "--lengths" not in err


# 6. docs -----------------------------------------------------------------------------------------

def test_nothing_refers_to_a_design_model_page_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    offenders = []
    for name in tracked:
        if not name.endswith((".md", ".py", ".toml", ".sh", ".cfg", ".txt", ".yaml", ".yml")) or \
                name == "tests/test_cli_new_user.py":
            continue
        path = ROOT / name
        if path.is_file() and ("design/MODEL.md" in path.read_text(encoding="utf-8", errors="replace")
                               or "MODEL.md" in path.read_text(encoding="utf-8", errors="replace")):
            offenders.append(name)
    assert not offenders, offenders
    assert (ROOT / "docs" / "model.md").is_file()
