"""TRL integration: GRPOTrainer's rollout_func backed by the reference sampler, and a real GRPO run.

A budgeted run must train exactly like the full-group run: same completions, same losses, same
gradients, same weights (float64, so that nothing depends on the batch a row was decoded in), with
less KV held, inside the budget.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from lengthsched.errors import InvalidArgument
from sampler import InfiniteSampler
from sampler.core import model_memory
from sampler.trl import (
    SamplerRollout,
    _runs,
    make_rollout_func,
    rollout_group_id,
    run_toy_grpo,
    toy_budget_bytes,
    toy_model,
    toy_tokenizer,
    toy_trainer,
)

ROOT = Path(__file__).resolve().parent.parent
G, L, PROMPT_TOKENS = 8, 16, 4  # the toy's prompts "a+b=" are 4 tokens


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """A tiny model on a shared 2-core machine runs much faster on one thread."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def runs():
    full = run_toy_grpo("full", steps=2, group_size=G, max_new_tokens=L, dtype="float64")
    budget = toy_budget_bytes(full.model, kv_tokens=2 * L, prompt_tokens=PROMPT_TOKENS, group_size=G)
    budgeted = run_toy_grpo("length_aware", steps=2, group_size=G, max_new_tokens=L, dtype="float64",
                            budget_bytes=budget)
    return full, budgeted, budget


def test_budgeted_run_trains_exactly_like_the_full_group(runs):
    full, budgeted, _ = runs
    assert len(full.completions) == 2 and all(len(step) == 2 * G for step in full.completions)
    assert budgeted.completions == full.completions
    assert len(full.losses) == 2
    assert budgeted.losses == pytest.approx(full.losses, abs=1e-10, rel=0)
    assert budgeted.grad_norms == pytest.approx(full.grad_norms, abs=1e-10, rel=0)
    assert budgeted.rewards == full.rewards
    for a, b in zip(full.model.parameters(), budgeted.model.parameters()):
        assert torch.equal(a, b)
    assert any(0 < len(c) < L for step in full.completions for c in step)  # lengths vary: EOS is sampled


def test_budgeted_run_holds_less_kv_inside_the_budget(runs):
    full, budgeted, budget = runs
    memory = model_memory(full.model)
    assert memory.total_bytes(full.peak_kv_bytes, G) > budget  # the full group does not fit
    assert budgeted.peak_kv_bytes < full.peak_kv_bytes
    assert memory.total_bytes(budgeted.peak_kv_bytes, G) <= budget
    assert budgeted.decode_steps > full.decode_steps  # the price: more, smaller decode steps


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    rollout = make_rollout_func(policy="micro", slots=3)
    return toy_trainer(rollout, tmp_path_factory.mktemp("grpo"), group_size=4, max_new_tokens=12)


def test_rollout_returns_what_trl_expects(trainer):
    rollout = trainer.rollout_func
    prompts = ["1+2="] * 4 + ["4+4="] * 4  # TRL's RepeatSampler order: each prompt G times in a row
    out = rollout(prompts, trainer)
    assert set(out) == {"prompt_ids", "completion_ids", "logprobs"}
    assert len(out["prompt_ids"]) == len(out["completion_ids"]) == len(out["logprobs"]) == len(prompts)
    tok = trainer.processing_class
    for i, prompt in enumerate(prompts):
        assert out["prompt_ids"][i] == tok(prompt)["input_ids"]
        ids, lps = out["completion_ids"][i], out["logprobs"][i]
        assert 1 <= len(ids) <= 12 and len(lps) == len(ids)
        assert all(isinstance(t, int) for t in ids) and all(lp <= 0.0 for lp in lps)
        assert ids[-1] == tok.eos_token_id or len(ids) == 12
        assert tok.eos_token_id not in ids[:-1]
    call = rollout.calls[-1]
    assert [g.size for g in call.groups] == [4, 4]
    assert len({g.group_id for g in call.groups}) == 2
    assert out["completion_ids"][:4] != out["completion_ids"][4:]
    again = rollout(prompts, trainer)  # same generation, same streams: reproducible
    assert again["completion_ids"] == out["completion_ids"]
    trainer._step += 1  # a later generation draws other streams
    try:
        later = rollout(prompts, trainer)
    finally:
        trainer._step -= 1
    assert later["completion_ids"] != out["completion_ids"]
    assert rollout.calls[-1].groups[0].group_id == rollout_group_id("train", trainer._step + 1, 0)


def test_rollout_samples_the_trainers_current_weights(trainer):
    rollout = trainer.rollout_func
    prompts = ["2+3="] * 4
    before = rollout(prompts, trainer)["logprobs"]
    model = trainer.accelerator.unwrap_model(trainer.model)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)  # an in-place update, as the optimizer makes
    try:
        after = rollout(prompts, trainer)["logprobs"]
    finally:
        model.load_state_dict(saved)
    assert after != before
    assert rollout.sampler_for(trainer).model is model


def test_groups_fold_back_across_processes():
    # one process: whole groups; a process whose slice starts mid-group gets the group's tail first
    assert _runs(["a"] * 4 + ["b"] * 4, 4, 0) == [(0, 4, 0), (4, 8, 1)]
    assert _runs(["a", "a", "b", "b", "b"], 3, 1) == [(0, 2, 0), (2, 5, 1)]
    with pytest.raises(InvalidArgument, match="argument 'prompts'.*repeated num_generations=4"):
        _runs(["a", "a", "b", "b"], 4, 0)


@pytest.mark.parametrize("kwargs, name", [
    ({"policy": "nope"}, "policy"),
    ({"policy": "dynamic_slot", "slots": 2}, "policy"),
    ({"policy": "micro"}, "slots"),
    ({"policy": "growth_aware"}, "budget_bytes"),
    ({"policy": "length_aware", "budget_bytes": 0}, "budget_bytes"),
    ({"policy": "fixed_slot", "slots": 0}, "slots"),
    ({"refill": "random"}, "refill"),
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"seed": -1}, "seed"),
    ({"predictor": 7}, "predictor"),
])
def test_bad_arguments_name_the_argument(kwargs, name):
    with pytest.raises(InvalidArgument, match=f"argument '{name}'"):
        make_rollout_func(**kwargs)


def test_a_sampler_or_model_must_be_the_trainers(trainer):
    other = toy_model(toy_tokenizer())
    with pytest.raises(InvalidArgument, match="argument 'slots'"):
        make_rollout_func(InfiniteSampler(other, policy="micro", slots=2), slots=2)
    stale = make_rollout_func(InfiniteSampler(other, policy="micro", slots=2))
    with pytest.raises(InvalidArgument, match="argument 'model_or_sampler'.*stale weights"):
        stale(["1+1="] * 4, trainer)
    with pytest.raises(InvalidArgument, match="argument 'model_or_sampler'"):
        make_rollout_func("Qwen/Qwen3-0.6B")
    model = trainer.accelerator.unwrap_model(trainer.model)
    own = make_rollout_func(model, policy="micro", slots=2)
    assert len(own(["1+1="] * 4, trainer)["completion_ids"]) == 4


def test_unsupported_trainer_settings_are_refused(trainer):
    trainer.args.min_p = 0.1
    try:
        with pytest.raises(InvalidArgument, match="argument 'args.min_p'"):
            trainer.rollout_func(["1+1="] * 4, trainer)
    finally:
        trainer.args.min_p = None


def test_missing_trl_is_one_clear_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)
    with pytest.raises(ImportError, match=r"trl is not installed: .*pip install trl==1\.16\.0"):
        make_rollout_func(policy="micro", slots=2)
    assert isinstance(SamplerRollout(policy="micro", slots=2), SamplerRollout)  # the rollout itself needs no trl


def test_grpo_benchmark_runs_quick(tmp_path):
    out = tmp_path / "grpo.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_grpo.py"), "--quick", "--in-process",
                             "--out", str(out)],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert {"machine", "config", "runs", "steps"} <= set(data)
    assert all(run["identical_completions"] for run in data["runs"][1:])
    assert "### Loss per step" in result.stdout
