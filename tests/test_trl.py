"""TRL integration: GRPOTrainer's rollout_func backed by the reference sampler, and a real GRPO run.

A budgeted run must train exactly like the full-group run: same completions, same losses, same
gradients, same weights (float64, so that nothing depends on the batch a row was decoded in), with
less KV held, inside the budget.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
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


# ====================================================================== TRL's tokenisation, honoured
def _add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def _chat_trainer(tokenizer, **overrides):
    """What TRL 1.16.0's ``_tokenize_prompts`` reads from a trainer, with a chat template, a training
    template of its own (``trainer.chat_template``), tools and ``chat_template_kwargs``."""
    from types import SimpleNamespace

    fields = {"processing_class": tokenizer, "_is_vlm": False, "environment_factories": None,
              "chat_template": "{% for m in messages %}{{ m['content'] }}{{ m['content'] }}{% endfor %}"
                               "{% if tools %}+{% endif %}{% if flag %}={% endif %}",
              "tools": [_add], "chat_template_kwargs": {"flag": True}}
    return SimpleNamespace(**{**fields, **overrides})


def test_fallback_tokenisation_honours_chat_template_tools_and_kwargs():
    import trl

    from lengthsched.integrations.trl_vllm import tokenize_like_trl

    tok = toy_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if tools %}+{% endif %}"
    trainer = _chat_trainer(tok)
    prompts = [[{"role": "user", "content": "1+2"}], [{"role": "user", "content": "3+4"}]]
    theirs, _, _ = trl.GRPOTrainer._tokenize_prompts(trainer, prompts)  # TRL 1.16.0's own code
    assert tok.decode(theirs[0]) == "1+21+2+="  # the training template, the tools and the kwargs all count
    assert tokenize_like_trl(prompts, trainer, tokenizer=tok) == [list(x) for x in theirs]
    assert tokenize_like_trl(prompts, trainer) == [list(x) for x in theirs]  # TRL's method itself
    # The reference sampler's rollout takes the same fallback when given a tokenizer.
    sampler_rollout = SamplerRollout(policy="micro", slots=2, tokenizer=tok)
    assert sampler_rollout._tokenize(prompts, trainer) == [list(x) for x in theirs]
    plain = _chat_trainer(tok, chat_template=None, tools=None, chat_template_kwargs={})
    assert tok.decode(tokenize_like_trl(prompts, plain, tokenizer=tok)[0]) == "1+2"
    assert tokenize_like_trl(["1+2="], plain, tokenizer=tok) == [tok("1+2=")["input_ids"]]
    with pytest.raises(InvalidArgument, match="argument 'prompts'"):
        tokenize_like_trl([], plain)


# ====================================================================== the vLLM rollout
class FakeVLLMOutput:
    def __init__(self, prompt_ids, token_ids):
        from types import SimpleNamespace

        self.prompt_token_ids = prompt_ids
        # logprobs=0: one dict per position holding the sampled token's Logprob (vllm/logprobs.py).
        self.outputs = [SimpleNamespace(token_ids=token_ids,
                                        logprobs=[{t: SimpleNamespace(logprob=-0.25, rank=1)} for t in token_ids])]


def fake_length(prompt_ids) -> int:
    """The fake engine's completion length for a prompt (tokens): 2..9, fixed per prompt."""
    return 2 + sum(prompt_ids) % 8


class FakeVLLM:
    """``vllm.LLM`` as TRL 1.16.0 uses it in colocate mode (``VLLMGeneration``): built with keyword
    engine arguments; ``generate(prompts, sampling_params=None, *, use_tqdm=True, lora_request=None,
    priority=None, tokenization_kwargs=None, mm_processor_kwargs=None)`` (vLLM 0.33.0);
    ``llm_engine.vllm_config`` / ``model_config`` / the weight loader TRL's sync calls;
    ``reset_prefix_cache``. Completions: digit tokens then EOS, of :func:`fake_length`."""

    instances: list[FakeVLLM] = []
    eos = 1

    def __init__(self, model=None, **engine_args):
        from types import SimpleNamespace

        self.engine_args = engine_args
        self.calls: list[dict] = []
        loader = SimpleNamespace(load_weights=lambda weights: None)
        self.llm_engine = SimpleNamespace(
            vllm_config=SimpleNamespace(scheduler_config=SimpleNamespace(policy=engine_args.get("scheduling_policy",
                                                                                                "fcfs")),
                                        cache_config=SimpleNamespace(block_size=16)),
            model_config=SimpleNamespace(max_model_len=engine_args.get("max_model_len") or 256),
            model_executor=SimpleNamespace(driver_worker=SimpleNamespace(model_runner=SimpleNamespace(model=loader))))
        FakeVLLM.instances.append(self)

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None, priority=None,
                 tokenization_kwargs=None, mm_processor_kwargs=None):
        self.calls.append({"prompts": prompts, "sampling_params": sampling_params, "priority": priority})
        limit = sampling_params.max_tokens
        outs = []
        for p in prompts:
            n = min(fake_length(p["prompt_token_ids"]), limit)
            outs.append(FakeVLLMOutput(p["prompt_token_ids"], [5] * (n - 1) + [self.eos]))
        return outs

    def reset_prefix_cache(self):
        return True


class FakeSamplingParams:
    """``vllm.SamplingParams(**kwargs)``: keeps what it was given."""

    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


@pytest.fixture
def fake_vllm(monkeypatch):
    """vLLM faked at its API boundary: ``vllm.SamplingParams`` and the ``LLM`` TRL builds; TRL told
    that vLLM is installed; the distributed variables TRL sets restored afterwards."""
    import types

    import trl.generation.vllm_generation as vg

    module = types.ModuleType("vllm")
    module.SamplingParams = FakeSamplingParams
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(vg, "is_vllm_available", lambda *a, **k: True)
    monkeypatch.setattr(vg, "LLM", FakeVLLM, raising=False)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(name, os.environ.get(name, "0" if name != "MASTER_ADDR" else "localhost"))
    monkeypatch.setenv("MASTER_PORT", "29577")
    monkeypatch.setenv("WORLD_SIZE", "1")
    FakeVLLM.instances.clear()
    FakeVLLM.eos = toy_tokenizer().eos_token_id
    return vg


class TablePredictor:
    """Predicts :func:`fake_length` from the prompt text (tokenised with the toy tokenizer)."""

    def __init__(self):
        self.tok = toy_tokenizer()
        self.queries: list[str] = []

    def predict(self, prompts, prefixes=None, *, quantiles=()):
        from lengthsched import LengthPrediction

        self.queries += list(prompts)
        return LengthPrediction(np.array([fake_length(self.tok(p)["input_ids"]) for p in prompts]))


def test_vllm_rollout_generates_through_trls_colocated_engine_in_the_plans_order(fake_vllm, tmp_path):
    import lengthsched as ls
    from lengthsched.integrations import PriorityIgnoredWarning, vllm_setup
    from lengthsched.integrations.trl_vllm import make_vllm_rollout_func, trl_vllm_config, trl_vllm_engine_args

    memory = model_memory(toy_model(toy_tokenizer()))
    plan = ls.plan_group([12] * 4, slots=2, max_new_tokens=12, prompt_tokens=PROMPT_TOKENS)
    setup = vllm_setup(plan, memory, gpu_memory_bytes="16GiB", overhead_bytes=0, concurrency=4,
                       concurrency_arg="max_num_active_seqs")
    config = trl_vllm_config(setup)
    predictor = TablePredictor()
    rollout = make_vllm_rollout_func(predictor)
    with trl_vllm_engine_args(config.engine_kwargs):
        trainer = toy_trainer(rollout, tmp_path, steps=2, group_size=4, max_new_tokens=12,
                              grpo_kwargs={"use_vllm": True, "vllm_mode": "colocate", **config.grpo_kwargs})
    assert fake_vllm.LLM is FakeVLLM  # restored
    (llm,) = FakeVLLM.instances
    # TRL's own engine arguments, plus the plan's: priority scheduling, the KV pool in bytes, admission cap.
    assert llm.engine_args["scheduling_policy"] == "priority"
    assert llm.engine_args["kv_cache_memory_bytes"] == setup.kv_bytes and llm.engine_args["max_num_active_seqs"] == 4
    assert llm.engine_args["gpu_memory_utilization"] == setup.fraction
    assert llm.engine_args["max_num_seqs"] == 8  # TRL's: per_device_train_batch_size x tp x steps_per_generation
    assert llm.engine_args["max_model_len"] == PROMPT_TOKENS + 12
    trainer.train()
    assert len(llm.calls) == 2 and len(rollout.calls) == 2
    for call, record in zip(llm.calls, rollout.calls):
        assert call["sampling_params"].n == 1 and call["sampling_params"].max_tokens == 12
        assert call["priority"] == sorted(call["priority"]) == list(range(8))  # submitted in the plan's order
        lengths = [fake_length(p["prompt_token_ids"]) for p in call["prompts"]]
        assert lengths == sorted(lengths, reverse=True)  # longest predicted first
        assert record.backend == "colocate" and record.predicted == record.lengths  # the table was right
    assert len(predictor.queries) == 4  # one query per group, two groups per call
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(np.isfinite(h["loss"]) for h in logs)
    # An engine TRL built without the plan's arguments runs FCFS: the rollout warns, and still works.
    FakeVLLM.instances.clear()
    fcfs_trainer = toy_trainer(make_vllm_rollout_func(TablePredictor()), tmp_path / "fcfs", steps=1, group_size=4,
                               max_new_tokens=12, grpo_kwargs={"use_vllm": True, "vllm_mode": "colocate"})
    with pytest.warns(PriorityIgnoredWarning):
        out = fcfs_trainer.rollout_func(["1+2="] * 4, fcfs_trainer)
    assert len(out["completion_ids"]) == 4 and out["logprobs"][0] == [-0.25] * len(out["completion_ids"][0])


def test_vllm_rollout_default_predictor_learns_from_history(fake_vllm, tmp_path):
    from lengthsched.integrations import PriorityIgnoredWarning
    from lengthsched.integrations.trl_vllm import make_vllm_rollout_func

    rollout = make_vllm_rollout_func()
    trainer = toy_trainer(rollout, tmp_path, steps=1, group_size=4, max_new_tokens=12,
                          grpo_kwargs={"use_vllm": True, "vllm_mode": "colocate"})
    prompts = ["1+2="] * 4 + ["7+1="] * 4 + ["4+4="] * 4
    with pytest.warns(PriorityIgnoredWarning):  # TRL built this engine without the plan's arguments: FCFS
        first = rollout(prompts, trainer)
        second = rollout(prompts, trainer)
    tok = trainer.processing_class
    assert len(set(rollout.calls[0].predicted)) == 1  # nothing known yet: one default length for all
    truth = [fake_length(tok(p)["input_ids"]) for p in prompts]
    assert [len(c) for c in first["completion_ids"]] == truth == [len(c) for c in second["completion_ids"]]
    later = rollout.calls[1].predicted  # from the first call's lengths: ordered as the truth
    assert sorted(range(12), key=lambda i: (-later[i], i)) == sorted(range(12), key=lambda i: (-truth[i], i))
    (llm,) = FakeVLLM.instances
    started = [fake_length(p["prompt_token_ids"]) for p in llm.calls[1]["prompts"]]
    assert started == sorted(started, reverse=True)


class FakeVLLMClient:
    """TRL 1.16.0's ``VLLMClient.generate(prompts, features=None, n=1, repetition_penalty=1.0,
    temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, max_tokens=16, logprobs=0,
    structured_outputs_regex=None, generation_kwargs=None)`` (trl/generation/vllm_client.py): it
    posts the sampling parameters and ``generation_kwargs`` in one JSON body to ``/v1/completions``;
    here the body is recorded and a completion of :func:`fake_length` comes back."""

    def __init__(self, policy="priority"):
        import threading

        self.bodies: list[dict] = []
        self.policy = policy
        self.lock = threading.Lock()

    def get_server_info(self):
        return {"scheduler_config": {"policy": self.policy}}

    def generate(self, prompts, features=None, n=1, repetition_penalty=1.0, temperature=1.0, top_p=1.0, top_k=0,
                 min_p=0.0, max_tokens=16, logprobs=0, structured_outputs_regex=None, generation_kwargs=None):
        body = {"prompt": prompts, "n": n, "temperature": temperature, "max_tokens": max_tokens, "logprobs": logprobs,
                **(generation_kwargs or {})}
        with self.lock:
            self.bodies.append(body)
        ids = [[5] * (min(fake_length(p), max_tokens) - 1) + [1] for p in prompts for _ in range(n)]
        return {"prompt_ids": prompts, "completion_ids": ids, "logprobs": [[[-0.5] for _ in c] for c in ids],
                "logprob_token_ids": [[[t] for t in c] for c in ids]}


def test_fake_vllm_client_has_trls_signature():
    from trl.generation.vllm_client import VLLMClient

    assert list(inspect.signature(FakeVLLMClient.generate).parameters) == \
        list(inspect.signature(VLLMClient.generate).parameters)


def _server_trainer(client, tok, *, temperature=1.0):
    from types import SimpleNamespace

    vg = SimpleNamespace(mode="server", vllm_client=client, repetition_penalty=1.0, temperature=temperature,
                         top_p=1.0, top_k=0, min_p=0.0, max_completion_length=12, logprobs=0, generation_kwargs={},
                         structured_outputs_regex=None, tensor_parallel_size=1)
    return SimpleNamespace(vllm_generation=vg, use_vllm=True, model=SimpleNamespace(training=True), num_generations=4,
                           num_generations_eval=4, _step=3, state=SimpleNamespace(global_step=1),
                           accelerator=SimpleNamespace(process_index=0, num_processes=1, is_main_process=True),
                           processing_class=tok)


def test_vllm_rollout_server_mode_sends_one_request_per_completion_with_its_priority():
    from lengthsched.integrations import PriorityIgnoredWarning
    from lengthsched.integrations.trl_vllm import make_vllm_rollout_func

    tok = toy_tokenizer()
    client = FakeVLLMClient()
    rollout = make_vllm_rollout_func(TablePredictor(), max_concurrent_requests=1)  # one at a time: in order
    trainer = _server_trainer(client, tok)
    prompts = ["1+2="] * 4 + ["3+4="] * 4
    out = rollout(prompts, trainer)
    assert len(client.bodies) == 8 and all(b["n"] == 1 and b["max_tokens"] == 12 for b in client.bodies)
    assert [b["priority"] for b in client.bodies] == list(range(8))  # vLLM reads it from the body
    lengths = [fake_length(b["prompt"][0]) for b in client.bodies]
    assert lengths == sorted(lengths, reverse=True)
    assert [len(c) for c in out["completion_ids"]] == [fake_length(tok(p)["input_ids"]) for p in prompts]
    assert out["prompt_ids"][0] == tok("1+2=")["input_ids"] and out["logprobs"][0][0] == -0.5
    assert rollout.calls[-1].backend == "server"
    with pytest.warns(PriorityIgnoredWarning, match="'fcfs'"):
        make_vllm_rollout_func(TablePredictor())(prompts, _server_trainer(FakeVLLMClient("fcfs"), tok))


def test_trl_vllm_config_and_engine_args():
    import trl.generation.vllm_generation as vg

    import lengthsched as ls
    from lengthsched.integrations import vllm_setup
    from lengthsched.integrations.trl_vllm import trl_vllm_config, trl_vllm_engine_args

    plan = ls.plan_group([600] * 8, slots=4, max_new_tokens=1024, prompt_tokens=256)
    setup = vllm_setup(plan, ls.ModelMemory.from_preset("qwen3-1.7b"), gpu_memory_bytes="80GiB",
                       concurrency_arg="max_num_active_seqs", max_num_seqs=64)
    config = trl_vllm_config(setup)
    assert config.grpo_kwargs == {"vllm_gpu_memory_utilization": setup.fraction, "vllm_max_model_length": 1280,
                                  "vllm_tensor_parallel_size": 1}
    assert config.engine_kwargs == {"scheduling_policy": "priority", "kv_cache_memory_bytes": setup.kv_bytes,
                                    "max_num_active_seqs": 4, "max_num_seqs": 64, "enable_prefix_caching": True}
    assert "--scheduling-policy" in config.serve_args and "--max-num-active-seqs" in config.serve_args
    with pytest.raises(InvalidArgument, match="argument 'setup'"):
        trl_vllm_config(None)
    if getattr(vg, "LLM", None) is None:  # this machine: TRL without vLLM
        with pytest.raises(ImportError, match="vLLM is not installed"):
            with trl_vllm_engine_args({}):
                pass
    with pytest.raises(InvalidArgument, match="argument 'engine_kwargs'"):
        with trl_vllm_engine_args(["scheduling_policy"]):
            pass


@pytest.mark.parametrize("kwargs, name", [
    ({"predictor": 3}, "predictor"),
    ({"max_concurrent_requests": 0}, "max_concurrent_requests"),
])
def test_vllm_rollout_bad_arguments_name_the_argument(kwargs, name):
    from lengthsched.integrations.trl_vllm import make_vllm_rollout_func

    with pytest.raises(InvalidArgument, match=f"argument '{name}'"):
        make_vllm_rollout_func(**kwargs)


def test_vllm_rollout_needs_trls_vllm_generation():
    from types import SimpleNamespace

    from lengthsched.integrations.trl_vllm import fold_groups, make_vllm_rollout_func

    with pytest.raises(InvalidArgument, match="argument 'trainer'.*use_vllm=True"):
        make_vllm_rollout_func()(["1+1="] * 4, SimpleNamespace(use_vllm=False))
    tp2 = _server_trainer(FakeVLLMClient(), toy_tokenizer())
    tp2.vllm_generation.mode, tp2.vllm_generation.tensor_parallel_size = "colocate", 2
    with pytest.raises(InvalidArgument, match="argument 'vllm_tensor_parallel_size'"):
        make_vllm_rollout_func()(["1+1="] * 4, tp2)
    n2 = _server_trainer(FakeVLLMClient(), toy_tokenizer())
    n2.vllm_generation.generation_kwargs = {"n": 2}
    with pytest.raises(InvalidArgument, match="argument 'args.generation_kwargs'"):
        make_vllm_rollout_func(TablePredictor())(["1+1="] * 4, n2)
    assert fold_groups(["a", "b", "b"], 2, 1) == [(0, 1, 0), (1, 3, 1)]
