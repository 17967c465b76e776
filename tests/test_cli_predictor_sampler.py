"""``lengthsched train / predict / eval-predictor / sample`` as a new user meets them (issue 17): every bad
input one line naming the flag (or the file, line and field) with exit 2, checked before torch is
imported; a train table that explains itself; notices where something has no effect or is clipped."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from lengthsched.cli import build_parser, main
from predictor_training.cli import run_predict
from predictor_training.data import write_jsonl
from predictor_training.options import PredictOptions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPICS = ["rivers", "stars", "bread", "trains", "music", "chess", "rain", "glass", "salt", "owls"]


def rows(n: int, seed: int) -> list[dict]:
    """Long-answer prompts (~400 tokens, above the predictor's l_max of 64) and short ones (~20)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        long = i % 2 == 0
        topic = TOPICS[rng.integers(len(TOPICS))]
        out.append({"id": f"{seed}-{i}", "prompt": f"write a detailed essay about {topic}" if long else
                    f"answer briefly about {topic}", "prompt_tokens": int(rng.integers(5, 60)),
                    "response_length": [int((400 if long else 20) * np.exp(0.1 * rng.standard_normal()))
                                        for _ in range(2)]})
    return out


TRAIN_ARGS = ["--encoder", "tiny", "--max-steps", "6", "--batch-size", "16", "--learning-rate", "2e-3",
              "--max-length", "24", "--prefix-max-tokens", "4", "--l-max", "64", "--over-l-max", "clip",
              "--tiny-hidden", "16", "--validation-fraction", "0"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny predictor trained from the CLI with a RELATIVE --data path (in its own directory); the
    captured stdout and stderr of that run."""
    home = tmp_path_factory.mktemp("train-home")
    write_jsonl(home / "train.jsonl", rows(64, 1))
    mp = pytest.MonkeyPatch()
    mp.chdir(home)
    try:
        import contextlib
        import io

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["train", "--data", "train.jsonl", "--out", "model", "--test-fraction", "0.25", *TRAIN_ARGS])
    finally:
        mp.undo()
    assert rc == 0, err.getvalue()
    return home, home / "model", out.getvalue(), err.getvalue()


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(argv, capsys, *needles):
    code, _, err = run(argv, capsys)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


# ----------------------------------------------------------------------------------- 1. predict input


@pytest.mark.parametrize("line, field, value", [
    ({"prompt": "a", "prompt_tokens": -3}, "prompt_tokens", "-3"),
    ({"prompt": "a", "prompt_tokens": "abc"}, "prompt_tokens", "'abc'"),
    ({"prompt": "a", "prompt_tokens": 2.5}, "prompt_tokens", "2.5"),
    ({"prompt": "a", "prompt_tokens": True}, "prompt_tokens", "True"),
    ({"prompt": "a", "prefix": [3, -1]}, "prefix[1]", "-1"),
    ({"prompt": "a", "prefix": [3, 1.5]}, "prefix[1]", "1.5"),
    ({"prompt": "a", "prefix": [3, "x"]}, "prefix[1]", "'x'"),
    ({"prompt": "a", "prefix": [10**12]}, "prefix[0]", "1000000000000"),
    ({"prompt": "a", "prefix": {"ids": [1]}}, "prefix", "{'ids': [1]}"),
    ({"prompt": "a", "prefix": -4}, "prefix", "-4"),
    ({"prompt": 7}, "prompt", "7"),
])
def test_predict_rejects_bad_json_fields_naming_file_line_field_and_value(trained, tmp_path, capsys, line, field,
                                                                         value):
    _, model, _, _ = trained
    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps({"prompt": "fine", "prompt_tokens": 4}) + "\n" + json.dumps(line) + "\n")
    err = one_line_error(["predict", str(queries), "--model", str(model)], capsys,
                         f"{queries} line 2: {field}", f"got {value}", "expected")
    assert "-9223372036854775808" not in err


def test_predict_rejects_token_ids_outside_the_vocabulary(trained, tmp_path, capsys):
    _, model, _, _ = trained
    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps({"prompt": "a", "prefix": [1, 2, 99_999_999]}) + "\n")
    one_line_error(["predict", str(queries), "--model", str(model)], capsys, f"{queries} line 1: prefix[2]",
                   "got 99999999", "a token id of the predictor's policy tokenizer, 0 .. ")


def test_predict_takes_valid_fields_and_notes_predictions_clipped_at_l_max(trained, tmp_path, capsys):
    _, model, _, _ = trained
    queries = tmp_path / "q.jsonl"
    write_jsonl(queries, [{"prompt": "write a detailed essay about salt", "prompt_tokens": 9.0, "prefix": [5, 6]},
                          {"prompt": "answer briefly about salt", "prompt_tokens": 9, "prefix": "It is"},
                          {"prompt": "answer briefly about owls", "prefix": 3}])
    code, out, err = run(["predict", str(queries), "--model", str(model), "--quantiles", "0.999"], capsys)
    assert code == 0, err
    lines = [json.loads(x) for x in out.splitlines()]
    assert [r["index"] for r in lines] == [0, 1, 2]
    assert all(1 <= r["remaining_tokens"] <= 64 and r["q0.999"] <= 64 for r in lines)
    assert max(r["q0.999"] for r in lines) == 64  # a 0.999 quantile of a 64-token-capped model reaches the cap
    assert "reached the model's l_max (64 tokens) and were clipped there" in err


def test_predict_prints_its_result_even_when_writing_the_output_fails(trained, tmp_path, capsys):
    _, model, _, _ = trained
    queries = tmp_path / "q.txt"
    queries.write_text("answer briefly about salt\n")
    with pytest.raises((OSError, ValueError)):
        run_predict(PredictOptions(input=str(queries), model=str(model), output=str(tmp_path / "no" / "p.jsonl")))
    assert json.loads(capsys.readouterr().out.splitlines()[0])["index"] == 0


# ------------------------------------------------------------------------------- 2. numbers of train


@pytest.mark.parametrize("flag, value", [("--seed", "-1"), ("--seed", "4294967296"), ("--split-seed", "-2"),
                                         ("--test-fold", "-1"), ("--eval-steps", "0"), ("--limit", "0"),
                                         ("--warmup-ratio", "1.5")])
def test_train_rejects_out_of_range_numbers_before_torch(flag, value, tmp_path, capsys):
    (tmp_path / "x.jsonl").write_text('{"prompt": "a", "response_length": 3}\n')
    name = flag[2:].replace("-", "_")
    one_line_error(["train", "--data", str(tmp_path / "x.jsonl"), "--out", str(tmp_path / "m"), flag, value],
                   capsys, f"argument '{name}'", f"got {value}")
    assert not (tmp_path / "m").exists()


# ------------------------------------------------------------------------------------------ 3. device


@pytest.mark.parametrize("command", ["predict", "sample"])
def test_a_misspelled_device_is_one_line(trained, command, capsys):
    _, model, _, _ = trained
    argv = ["predict", "--model", str(model)] if command == "predict" else ["sample"]
    one_line_error([*argv, "--device", "bogus"], capsys, "argument 'device'", "'bogus'",
                   "one of cpu, cuda, cuda:N")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("command", ["predict", "sample"])
def test_cuda_without_cuda_is_one_line(trained, command, tmp_path, capsys, monkeypatch):
    _, model, _, _ = trained
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("hello\n"))
    argv = ["predict", "--model", str(model)] if command == "predict" else ["sample", "-G", "2",
                                                                            "--max-new-tokens", "3"]
    err = one_line_error([*argv, "--device", "cuda:0"], capsys, "argument 'device'", "'cuda:0'", "--device cpu")
    assert "CUDA is not available in this PyTorch build" in err or "no CUDA GPU is visible" in err


# --------------------------------------------------------------------------------------- 4. huge G


def test_sample_bounds_the_group_size_with_what_it_would_need(capsys):
    err = one_line_error(["sample", "-G", "100000000", "--max-new-tokens", "4"], capsys, "argument 'group_size'",
                         "got 100000000", "at most 65,536", "GiB of host memory")
    assert "400,000,000 tokens" in err


# ------------------------------------------------------------------------------- 5. the flag's name


def test_sample_names_the_predictor_flag(tmp_path, capsys):
    err = one_line_error(["sample", "--predictor", str(tmp_path / "missing")], capsys, "argument 'predictor'")
    assert "'model'" not in err
    (tmp_path / "empty").mkdir()
    err = one_line_error(["sample", "--predictor", str(tmp_path / "empty")], capsys, "argument 'predictor'",
                         "no config.json")


def test_sample_names_the_predictor_flag_for_a_directory_that_is_not_a_predictor(tmp_path, capsys):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text('{"model_type": "bert"}')
    err = one_line_error(["sample", "--predictor", str(tmp_path / "other"), "-G", "2", "--max-new-tokens", "3"],
                         capsys, "argument 'predictor'", "length predictor directory")
    assert "'model'" not in err


def test_train_names_the_encoder_flag(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write_jsonl(tmp_path / "d.jsonl", rows(8, 3))
    err = one_line_error(["train", "--data", str(tmp_path / "d.jsonl"), "--encoder", "bogus-no-such-encoder",
                          "--out", str(tmp_path / "m")], capsys, "argument 'encoder'", "bogus-no-such-encoder")
    assert "label_tokenizer" not in err


# ------------------------------------------------------------------------ 6. accepted without complaint


def test_eval_predictor_rejects_limit_zero(trained, capsys):
    _, model, _, _ = trained
    one_line_error(["eval-predictor", "--model", str(model), "--limit", "0"], capsys, "argument 'limit'", "got 0")


def test_train_refuses_to_overwrite_a_predictor_unless_asked(trained, capsys):
    home, model, _, _ = trained
    before = (model / "config.json").read_bytes()
    one_line_error(["train", "--data", str(home / "train.jsonl"), "--out", str(model), *TRAIN_ARGS], capsys,
                   "argument 'out'", "holds one already", "--overwrite")
    assert (model / "config.json").read_bytes() == before


def test_sample_notes_predictions_clipped_to_max_new_tokens(trained, capsys):
    _, model, _, _ = trained
    code, out, err = run(["sample", "--predictor", str(model), "-G", "2", "--max-new-tokens", "2", "--slots", "1",
                          "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["policy"] == "length_aware"
    assert "2 of 2 predicted lengths were above --max-new-tokens 2 and were clipped to it" in err


# ------------------------------------------------------------------------------------- 7. --policy


def test_sample_policy_lists_its_choices_and_rejects_others(capsys):
    from sampler.core import SAMPLER_POLICIES

    sample = build_parser()._subparsers._group_actions[0].choices["sample"]
    policy = next(a for a in sample._actions if a.dest == "policy")
    assert list(policy.choices) == list(SAMPLER_POLICIES)
    assert "fixed_slot" in policy.help and "length_aware" in policy.help
    with pytest.raises(SystemExit) as exc:
        main(["sample", "--policy", "magic"])
    assert exc.value.code == 2 and "invalid choice: 'magic'" in capsys.readouterr().err


def test_length_aware_without_predictions_says_it_has_none(capsys):
    code, _, err = run(["sample", "-G", "2", "--max-new-tokens", "3", "--policy", "length_aware", "--slots", "1"],
                       capsys)
    assert code == 0
    assert "--policy length_aware plans with predicted lengths and has none here" in err and "fixed_slot" in err
    code, _, err = run(["sample", "-G", "2", "--max-new-tokens", "3", "--policy", "length_aware", "--slots", "1",
                        "--lengths", "1,3"], capsys)
    assert code == 0 and "note" not in err


# --------------------------------------------------------------------- 8. no torch before the checks


@pytest.mark.parametrize("argv", [
    ["train", "--data", "missing.jsonl", "--encoder", "tiny"],
    ["train", "--data", "x.jsonl", "--seed", "-1"],
    ["predict", "--model", "missing-dir"],
    ["predict", "--model", "MODEL", "BAD"],
    ["eval-predictor", "--model", "missing-dir"],
    ["eval-predictor", "--model", "MODEL", "--data", "missing.jsonl"],
    ["sample", "--predictor", "missing-dir"],
    ["sample", "--device", "bogus"],
])
def test_bad_arguments_are_rejected_without_importing_torch(trained, tmp_path, argv):
    _, model, _, _ = trained
    (tmp_path / "x.jsonl").write_text('{"prompt": "a", "response_length": 3}\n')
    (tmp_path / "BAD").write_text('{"prompt": "a", "prompt_tokens": -3}\n')
    argv = [str(model) if a == "MODEL" else a for a in argv]
    code = (f"import sys\nfrom lengthsched.cli import main\nrc = main({argv!r})\n"
            "print(rc, 'torch' in sys.modules, 'transformers' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env=env)
    assert done.stdout.split() == ["2", "False", "False"], done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------------ 9. eval from another directory


def test_eval_predictor_works_outside_the_training_directory(trained, tmp_path, capsys, monkeypatch):
    _, model, _, _ = trained
    saved = json.loads((model / "training_summary.json").read_text())["options"]
    assert saved["data"] == str(model.parent / "train.jsonl")  # saved absolute
    monkeypatch.chdir(tmp_path)
    code, out, err = run(["eval-predictor", "--model", str(model), "--json"], capsys)
    assert code == 0, err
    assert "constant" in json.loads(out)


def test_eval_predictor_says_which_flag_to_pass_for_an_old_relative_summary(trained, tmp_path, capsys, monkeypatch):
    _, model, _, _ = trained
    old = tmp_path / "old"
    shutil.copytree(model, old, ignore=shutil.ignore_patterns("checkpoints"))
    summary = json.loads((old / "training_summary.json").read_text())
    summary["options"]["data"] = "train.jsonl"  # as summaries were saved before
    (old / "training_summary.json").write_text(json.dumps(summary))
    monkeypatch.chdir(tmp_path)
    one_line_error(["eval-predictor", "--model", str(old)], capsys, "argument 'data'", "'train.jsonl'",
                   "pass --data")


# --------------------------------------------------------------------------------- 10. the train table


def test_train_prints_a_table_with_a_legend_and_a_verdict(trained):
    _, model, out, err = trained
    assert "{'loss'" not in out + err and "{'train_runtime'" not in out + err
    assert "source" in out and "method" in out and "tau_b" in out
    assert "mae / rmse: mean absolute / root mean square error, tokens" in out
    assert "constant (the training median)" in out
    verdict = next(line for line in out.splitlines() if line.startswith("verdict:"))
    assert "beats every baseline" in verdict or "does NOT beat every baseline" in verdict
    assert "log: model/train.log" in out  # --out as given (relative here)
    assert "loss" in (model / "train.log").read_text()


def test_train_verbose_shows_the_trainer_and_overwrite_replaces(trained, tmp_path, capsys):
    home, model, _, _ = trained
    target = tmp_path / "m"
    shutil.copytree(model, target, ignore=shutil.ignore_patterns("checkpoints"))
    code, out, err = run(["train", "--data", str(home / "train.jsonl"), "--out", str(target), "--overwrite",
                          "--verbose", "--test-fraction", "0.25", *TRAIN_ARGS], capsys)
    assert code == 0, err
    assert "'loss'" in out + err  # the Trainer's own lines, on the terminal with --verbose
    assert "verdict:" in out
    assert (target / "train.log").read_text() == (model / "train.log").read_text()  # nothing went to the log


def test_a_predictor_under_a_policy_that_uses_none_says_so(trained, capsys):
    _, model, _, _ = trained
    code, _, err = run(["sample", "--predictor", str(model), "-G", "2", "--max-new-tokens", "3", "--policy",
                        "fixed_slot", "--slots", "1"], capsys)
    assert code == 0 and "--predictor has no effect under --policy fixed_slot" in err


@pytest.mark.parametrize("argv, name, value", [
    (["--budget", "1KiB"], "budget", "'1KiB'"),
    (["-G", "2", "--lengths", "2,9", "--max-new-tokens", "4"], "lengths", "'2,9'"),
])
def test_sample_errors_name_the_flag_not_the_library_argument(argv, name, value, capsys):
    err = one_line_error(["sample", *argv], capsys, f"argument '{name}'", f"got {value}")
    assert "budget_bytes" not in err and "force_lengths" not in err
