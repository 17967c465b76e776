"""TRL's vLLM generation with a lengthsched plan: a ``rollout_func`` for ``GRPOTrainer(use_vllm=True)``.

Modelled on TRL 1.16.0's own code (``trl/trainer/grpo_trainer.py``, ``trl/generation/vllm_generation.py``,
``trl/generation/vllm_client.py``) and vLLM 0.33.0's (see :mod:`.vllm_adapter`); tested with the vLLM
engine faked at its API boundary (``LLM.generate``, ``VLLMClient.generate``), not run on a GPU.

What TRL does without it: ``VLLMGeneration.generate`` sends this process's rows (each prompt
repeated G times in a row) to vLLM with one priority for all; in colocate mode it builds
``vllm.LLM`` itself (``_init_vllm``) with ``gpu_memory_utilization``, ``max_model_len`` and
``max_num_seqs = per_device_train_batch_size x tp x steps_per_generation`` and no
``scheduling_policy`` (so FCFS); in server mode the main process sends the unique prompts with
``n=G`` to ``vllm serve``'s ``/v1/completions``.

What :class:`VLLMRollout` does instead: it folds the rows into groups, predicts every completion's
length (default: :class:`~lengthsched.OnlineLengthPredictor`, fed with the finished lengths of
earlier steps, so a prompt seen before is predicted from its history), plans the rows with
:func:`~lengthsched.integrations.plan_rollout` (the project's rollout policy on one engine:
longest predicted first), and generates through the trainer's own engine
(``trainer.vllm_generation``):

- colocate: one ``llm.generate(rows in the plan's order, SamplingParams(n=1, ...), priority=[...])``;
- server: one ``n=1`` request per completion with its ``priority`` in the request body
  (``VLLMClient.generate(..., generation_kwargs={"priority": p})``: TRL puts generation kwargs in
  the JSON body, and vLLM's ``CompletionRequest.priority`` reads it), sent concurrently in the
  plan's order from the main process, the results broadcast to every process as TRL does.

Sampling settings are the trainer's (``trainer.vllm_generation``: temperature, top_p, top_k, min_p,
repetition_penalty, max_completion_length, logprobs, generation_kwargs). KV sizing cannot be
changed on a running engine: :func:`trl_vllm_config` turns a :func:`vllm_setup` into
``GRPOConfig`` fields, engine overrides and ``vllm serve`` flags, and
:func:`trl_vllm_engine_args` hands the overrides (``scheduling_policy="priority"``,
``kv_cache_memory_bytes``, ``max_num_active_seqs``) to the ``vllm.LLM`` TRL builds in colocate mode.

Importing this module imports neither TRL, vLLM nor torch.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgument, check_int
from .base import EngineSetup
from .rollout import RolloutPlan, observe_lengths, plan_rollout, predict_lengths
from .vllm_adapter import vllm_serve_args, warn_unless_priority_policy

__all__ = [
    "TRL_VERSION",
    "TRLVLLMConfig",
    "VLLMRollout",
    "VLLMRolloutCall",
    "fold_groups",
    "make_vllm_rollout_func",
    "tokenize_like_trl",
    "trl_vllm_config",
    "trl_vllm_engine_args",
]

TRL_VERSION = "1.16.0"  # the version the contract below was read from and tested with
# Engine arguments TRL 1.16.0 gives no GRPOConfig field for; trl_vllm_engine_args passes them.
_ENGINE_OVERRIDES = ("scheduling_policy", "kv_cache_memory_bytes", "max_num_active_seqs", "max_num_seqs",
                     "enable_prefix_caching")
# TRL's own cap on concurrent requests to a vLLM server (vllm_client._DEFAULT_GENERATION_CONCURRENCY).
_DEFAULT_CONCURRENCY = 64


# ----------------------------------------------------------------------------- groups and tokens
def fold_groups(prompts: Sequence[Any], group_size: int, offset: int = 0) -> list[tuple[int, int, int]]:
    """(start, stop, group) of each group in ``prompts``, as TRL's ``RepeatSampler`` lays them out
    (each prompt ``group_size`` times in a row): position ``offset + i`` of the global generation
    batch belongs to group ``(offset + i) // group_size`` (``offset``: this process's first row,
    ``process_index x len(prompts)``); every prompt of a group must be equal."""
    group_size = check_int("group_size", group_size, minimum=1)
    offset = check_int("offset", offset, minimum=0)
    runs: list[tuple[int, int, int]] = []
    for i, prompt in enumerate(prompts):
        group = (offset + i) // group_size
        if runs and runs[-1][2] == group:
            start = runs[-1][0]
            if prompt != prompts[start]:
                raise InvalidArgument("prompts", f"prompt {i} differs from prompt {start} of its group",
                                      f"each prompt repeated num_generations={group_size} times in a row "
                                      "(TRL's RepeatSampler order)")
            runs[-1] = (start, i + 1, group)
        else:
            runs.append((i, i + 1, group))
    return runs


def _is_conversational(prompt: Any) -> bool:
    """TRL's test (``trl.data_utils.is_conversational``): a list of messages with ``role``."""
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], Mapping) and "role" in prompt[0]


def tokenize_like_trl(prompts: Sequence[Any], trainer: Any, tokenizer: Any = None) -> list[list[int]]:
    """Token ids of ``prompts`` as TRL 1.16.0 tokenises them for its own generation.

    Without ``tokenizer``: the trainer's own ``_tokenize_prompts`` (chat template, tools, per-
    environment tools, ``chat_template_kwargs``), multimodal prompts refused. With ``tokenizer``
    (or a trainer without that method): the same rule from TRL's public attributes: text prompts
    ``tokenizer(text=prompts)``; conversational prompts ``tokenizer.apply_chat_template(prompts,
    tools=trainer.tools or None, chat_template=trainer.chat_template, add_generation_prompt=True,
    tokenize=True, return_dict=True, **trainer.chat_template_kwargs)``.
    """
    prompts = list(prompts)
    if not prompts:
        raise InvalidArgument("prompts", prompts, "at least one prompt")
    if tokenizer is None and callable(getattr(trainer, "_tokenize_prompts", None)):
        ids, images, fields = trainer._tokenize_prompts(prompts)
        if images is not None or fields:
            raise InvalidArgument("prompts", "multimodal prompts", "text prompts (this rollout sends token ids only)")
        return [[int(t) for t in row] for row in ids]
    tok = tokenizer if tokenizer is not None else getattr(trainer, "processing_class", None)
    if tok is None:
        raise InvalidArgument("tokenizer", None, "a tokenizer, or a trainer with processing_class")
    if not _is_conversational(prompts[0]):
        return [[int(t) for t in row] for row in tok(text=prompts)["input_ids"]]
    tokenized = tok.apply_chat_template(
        conversation=prompts, tools=getattr(trainer, "tools", None) or None,
        chat_template=getattr(trainer, "chat_template", None), add_generation_prompt=True, tokenize=True,
        return_dict=True, **(getattr(trainer, "chat_template_kwargs", None) or {}))
    return [[int(t) for t in row] for row in tokenized["input_ids"]]


# ----------------------------------------------------------------------------- engine configuration
@dataclass(frozen=True)
class TRLVLLMConfig:
    """A :func:`vllm_setup` as TRL takes it: ``grpo_kwargs`` for ``GRPOConfig``
    (``vllm_gpu_memory_utilization``, ``vllm_max_model_length``, ``vllm_tensor_parallel_size``),
    ``engine_kwargs`` TRL has no field for (give them to :func:`trl_vllm_engine_args` in colocate
    mode), ``serve_args`` the ``vllm serve`` flags for server mode (all of the setup's arguments)."""

    grpo_kwargs: dict[str, Any]
    engine_kwargs: dict[str, Any]
    serve_args: list[str]


def trl_vllm_config(setup: EngineSetup) -> TRLVLLMConfig:
    """Split a vLLM :class:`EngineSetup` into what ``GRPOConfig`` takes and what it does not.

    TRL 1.16.0 sets ``max_num_seqs`` itself in colocate mode (per_device_train_batch_size x tp x
    steps_per_generation), so build the setup with ``concurrency_arg="max_num_active_seqs"``: the
    plan's concurrency then caps admission below TRL's ``max_num_seqs``.
    """
    if not isinstance(setup, EngineSetup) or setup.engine != "vllm":
        raise InvalidArgument("setup", type(setup).__name__, "a vLLM EngineSetup (from vllm_setup)")
    kwargs = setup.engine_kwargs
    grpo = {"vllm_gpu_memory_utilization": kwargs["gpu_memory_utilization"],
            "vllm_max_model_length": kwargs["max_model_len"],
            "vllm_tensor_parallel_size": kwargs.get("tensor_parallel_size", 1)}
    engine = {k: kwargs[k] for k in _ENGINE_OVERRIDES if k in kwargs}
    return TRLVLLMConfig(grpo_kwargs=grpo, engine_kwargs=engine, serve_args=vllm_serve_args(kwargs))


@contextlib.contextmanager
def trl_vllm_engine_args(engine_kwargs: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """While the block runs, the ``vllm.LLM`` that TRL 1.16.0 builds in colocate mode
    (``VLLMGeneration._init_vllm`` calls the module-level name ``LLM`` of
    ``trl.generation.vllm_generation``) also gets ``engine_kwargs`` (they win over TRL's values).
    Build the trainer inside it::

        with trl_vllm_engine_args(config.engine_kwargs):
            trainer = GRPOTrainer(..., args=GRPOConfig(use_vllm=True, **config.grpo_kwargs), rollout_func=...)

    The name is restored on exit. Raises ImportError without TRL or vLLM.
    """
    if not isinstance(engine_kwargs, Mapping):
        raise InvalidArgument("engine_kwargs", type(engine_kwargs).__name__, "a mapping of vLLM engine arguments")
    overrides = dict(engine_kwargs)
    try:
        module = importlib.import_module("trl.generation.vllm_generation")
    except ImportError as exc:
        raise ImportError(f"trl is not installed: pip install trl=={TRL_VERSION} ({exc})") from None
    original = getattr(module, "LLM", None)
    if original is None:
        raise ImportError("vLLM is not installed: TRL's colocate mode builds vllm.LLM (pip install vllm)")

    def build(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **{**kwargs, **overrides})

    module.LLM = build
    try:
        yield overrides
    finally:
        module.LLM = original


# ----------------------------------------------------------------------------- the rollout
@dataclass(frozen=True)
class VLLMRolloutCall:
    """One call of the rollout: ``mode`` (train/eval), ``generation`` (the trainer's micro-step
    counter, or the count of evaluation calls), ``backend`` (colocate/server), the ``plan`` of the
    rows it planned (all processes' rows in server mode), per planned row its ``predicted`` and
    generated ``lengths`` (tokens), and the wall time (seconds)."""

    mode: str
    generation: int
    backend: str
    plan: RolloutPlan = field(repr=False)
    predicted: tuple[int, ...] = field(repr=False)
    lengths: tuple[int, ...] = field(repr=False)
    wall_seconds: float = 0.0


class VLLMRollout:
    """A ``rollout_func`` for ``trl.GRPOTrainer(use_vllm=True)`` that generates through the trainer's
    vLLM engine in the plan's order with per-request priorities (see the module docstring; built by
    :func:`make_vllm_rollout_func`).

    ``predictor``: a ``LengthPredictor`` given the decoded prompt text of each group (one query
    per group: a prompt-only predictor); one with ``observe`` (the default
    :class:`~lengthsched.OnlineLengthPredictor`, capped at ``max_completion_length``) is fed every
    completion's length after each training call. ``tokenizer``: None tokenises as TRL does.
    ``max_concurrent_requests``: server mode's concurrent HTTP requests. ``calls`` keeps a
    :class:`VLLMRolloutCall` per call unless ``keep_history=False``.
    """

    def __init__(self, predictor: Any = None, *, tokenizer: Any = None,
                 max_concurrent_requests: int = _DEFAULT_CONCURRENCY, keep_history: bool = True):
        if predictor is not None and not hasattr(predictor, "predict"):
            raise InvalidArgument("predictor", type(predictor).__name__,
                                  "an object with predict() (the lengthsched.LengthPredictor protocol)")
        self.predictor = predictor
        self.tokenizer = tokenizer
        self.max_concurrent_requests = check_int("max_concurrent_requests", max_concurrent_requests, minimum=1)
        self.keep_history = bool(keep_history)
        self.calls: list[VLLMRolloutCall] = []
        self._eval_calls = 0
        self._steps = 0
        self._server_policy_checked = False

    # ------------------------------------------------------------------ the trainer's state
    def predictor_for(self, max_new_tokens: int) -> Any:
        """The predictor; the default online one is built at the first call, capped at the trainer's
        ``max_completion_length`` (``max_new_tokens``, tokens) and starting from half of it."""
        if self.predictor is None:
            from ..online import OnlineLengthPredictor

            limit = check_int("max_new_tokens", max_new_tokens, minimum=1)
            self.predictor = OnlineLengthPredictor(default_length=max(1, limit // 2), max_new_tokens=limit)
        return self.predictor

    @staticmethod
    def _generation(trainer: Any) -> Any:
        vg = getattr(trainer, "vllm_generation", None)
        if vg is None or not getattr(trainer, "use_vllm", True):
            raise InvalidArgument("trainer", type(trainer).__name__,
                                  "a GRPOTrainer built with use_vllm=True (it generates through "
                                  "trainer.vllm_generation)")
        if vg.mode == "colocate" and int(getattr(vg, "tensor_parallel_size", 1)) != 1:
            raise InvalidArgument("vllm_tensor_parallel_size", vg.tensor_parallel_size,
                                  "1 in colocate mode (each process sends its own rows)")
        return vg

    @staticmethod
    def _sampling_kwargs(vg: Any) -> dict[str, Any]:
        """TRL 1.16.0's colocate sampling parameters (``VLLMGeneration.generate``), n=1."""
        kwargs = {"n": 1, "repetition_penalty": vg.repetition_penalty, "temperature": vg.temperature,
                  "top_p": vg.top_p, "top_k": vg.top_k, "min_p": 0.0 if vg.min_p is None else vg.min_p,
                  "max_tokens": vg.max_completion_length, "logprobs": vg.logprobs}
        kwargs.update(vg.generation_kwargs or {})
        if kwargs.get("n", 1) != 1:
            raise InvalidArgument("args.generation_kwargs", {"n": kwargs["n"]},
                                  "no n: every completion is its own request (n=1)")
        return kwargs

    # ------------------------------------------------------------------ engines
    def _colocate(self, vg: Any, ids: list[list[int]], plan: RolloutPlan) -> list[tuple[list[int], list[float]]]:
        import vllm

        kwargs = self._sampling_kwargs(vg)
        regex = getattr(vg, "structured_outputs_regex", None)
        if regex is not None or isinstance(kwargs.get("structured_outputs"), Mapping):
            from vllm.sampling_params import StructuredOutputsParams

            params = {"regex": regex} if regex is not None else kwargs["structured_outputs"]
            kwargs["structured_outputs"] = StructuredOutputsParams(**params)
        params = vllm.SamplingParams(**kwargs)
        llm = vg.llm
        warn_unless_priority_policy(llm, stacklevel=4)
        sleeping = bool(getattr(vg, "enable_sleep_mode", False))
        if sleeping and getattr(vg, "_llm_weights_sleeping", False):  # TRL: level-2 sleep dropped the weights
            vg.sync_weights()
        if sleeping:
            llm.wake_up(tags=["kv_cache"])
        order = plan.submission_order()
        try:
            outputs = llm.generate([{"prompt_token_ids": ids[row]} for row in order], sampling_params=params,
                                   use_tqdm=False, priority=[plan.priority[row] for row in order])
        finally:
            if sleeping:
                llm.sleep(level=2)
                vg._llm_weights_sleeping = True
        results: list[Any] = [None] * len(ids)
        for row, out in zip(order, outputs):
            completion = out.outputs[0]
            tokens = [int(t) for t in completion.token_ids]
            results[row] = (tokens, _sampled_logprobs(tokens, completion.logprobs))
        return results

    def _server(self, vg: Any, ids: list[list[int]], plan: RolloutPlan) -> list[tuple[list[int], list[float]]]:
        client = vg.vllm_client
        self._check_server_policy(client)
        kwargs = self._sampling_kwargs(vg)
        extra = {k: v for k, v in kwargs.items() if k not in ("n", "repetition_penalty", "temperature", "top_p",
                                                              "top_k", "min_p", "max_tokens", "logprobs")}

        def send(row: int) -> tuple[list[int], list[float]]:
            out = client.generate(prompts=[ids[row]], n=1, repetition_penalty=kwargs["repetition_penalty"],
                                  temperature=kwargs["temperature"], top_p=kwargs["top_p"], top_k=kwargs["top_k"],
                                  min_p=kwargs["min_p"], max_tokens=kwargs["max_tokens"], logprobs=kwargs["logprobs"],
                                  structured_outputs_regex=getattr(vg, "structured_outputs_regex", None),
                                  generation_kwargs={**extra, "priority": int(plan.priority[row])})
            tokens = [int(t) for t in out["completion_ids"][0]]
            lps = out.get("logprobs")
            return tokens, [] if lps is None else [float(lp[0]) for lp in lps[0]]

        order = plan.submission_order()
        results: list[Any] = [None] * len(ids)
        with ThreadPoolExecutor(max_workers=min(self.max_concurrent_requests, len(order))) as pool:
            for row, result in zip(order, pool.map(send, order)):  # submitted in the plan's order
                results[row] = result
        return results

    def _check_server_policy(self, client: Any) -> None:
        """Warn once when the server says it runs another scheduling policy than ``priority``."""
        if self._server_policy_checked:
            return
        self._server_policy_checked = True
        try:
            info = client.get_server_info()
        except Exception:  # noqa: BLE001 - older servers have no such endpoint: nothing to check
            return
        config = info.get("scheduler_config") if isinstance(info, Mapping) else None
        policy = config.get("policy") if isinstance(config, Mapping) else None
        if policy is not None:
            warn_unless_priority_policy(_PolicyOnly(str(policy)), stacklevel=5)

    # ------------------------------------------------------------------ the rollout
    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, list]:
        started = time.perf_counter()
        prompts = list(prompts)
        if not prompts:
            raise InvalidArgument("prompts", prompts, "at least one prompt")
        vg = self._generation(trainer)
        mode = "train" if trainer.model.training else "eval"
        G = trainer.num_generations if mode == "train" else trainer.num_generations_eval
        if mode == "train":
            generation = int(getattr(trainer, "_step", trainer.state.global_step))
        else:
            generation, self._eval_calls = self._eval_calls, self._eval_calls + 1
        accelerator = trainer.accelerator
        runs = fold_groups(prompts, G, accelerator.process_index * len(prompts))
        ids = tokenize_like_trl(prompts, trainer, self.tokenizer)
        tok = self.tokenizer if self.tokenizer is not None else trainer.processing_class
        texts = {group: tok.decode(ids[start]) for start, _, group in runs}
        rows = [(ids[i], group, texts[group]) for start, stop, group in runs for i in range(start, stop)]
        server = vg.mode == "server"
        share = server and accelerator.num_processes > 1
        if share:
            from accelerate.utils import broadcast_object_list, gather_object

            rows = gather_object(rows)
        payload = None
        if not server or accelerator.is_main_process:
            payload = self._generate(vg, rows, mode, server)
        if share:
            box = [payload]
            broadcast_object_list(box, from_process=0)
            payload = box[0]
            mine = slice(accelerator.process_index * len(prompts), (accelerator.process_index + 1) * len(prompts))
        else:
            mine = slice(0, len(prompts))
        plan, predicted, results = payload
        out = {"prompt_ids": [list(r[0]) for r in rows[mine]],
               "completion_ids": [r[0] for r in results[mine]],
               "logprobs": [r[1] for r in results[mine]]}
        if self.keep_history:
            self.calls.append(VLLMRolloutCall(mode, generation, vg.mode, plan, tuple(predicted),
                                              tuple(len(r[0]) for r in results), time.perf_counter() - started))
        return out

    def _generate(self, vg: Any, rows: list, mode: str, server: bool) -> tuple[RolloutPlan, list[int], list]:
        """Predict, plan and generate ``rows`` (ids, group, prompt text); feed the predictor after a
        training call. Returns the plan, the per-row predictions and the per-row results."""
        predictor = self.predictor_for(int(vg.max_completion_length))
        groups = list(dict.fromkeys(r[1] for r in rows))
        text_of = {r[1]: r[2] for r in rows}
        per_group = dict(zip(groups, predict_lengths(predictor, [text_of[g] for g in groups],
                                                     max_new_tokens=int(vg.max_completion_length))))
        predicted = [int(per_group[r[1]]) for r in rows]
        plan = plan_rollout([r[1] for r in rows], predicted, replicas=1)
        ids = [r[0] for r in rows]
        results = self._server(vg, ids, plan) if server else self._colocate(vg, ids, plan)
        if mode == "train":
            self._steps += 1
            observe_lengths(predictor, [r[2] for r in rows], [len(res[0]) for res in results], step=self._steps)
        return plan, predicted, results

    @property
    def predicted_vs_generated(self) -> list[tuple[int, int]]:
        """(predicted, generated) tokens of every row of the kept calls."""
        return [pair for call in self.calls for pair in zip(call.predicted, call.lengths)]


class _PolicyOnly:
    """A stand-in engine whose ``vllm_config.scheduler_config.policy`` is a server's reported policy."""

    def __init__(self, policy: str):
        scheduler = type("SchedulerConfig", (), {"policy": policy})()
        self.vllm_config = type("VllmConfig", (), {"scheduler_config": scheduler})()


def _sampled_logprobs(tokens: list[int], logprobs: Any) -> list[float]:
    """Per generated token, the log-prob of the sampled token from vLLM's per-position dicts
    (token id -> ``Logprob(logprob, rank, ...)``; with ``logprobs=0`` the dict holds the sampled
    token only). Empty when vLLM returned none."""
    if logprobs is None:
        return []
    out = []
    for token, entry in zip(tokens, logprobs):
        item = entry.get(token) if isinstance(entry, Mapping) else None
        if item is None and isinstance(entry, Mapping) and entry:
            item = min(entry.values(), key=lambda x: getattr(x, "rank", 0) or 0)
        value = getattr(item, "logprob", item)
        out.append(float("nan") if value is None else float(value))
    return out


def make_vllm_rollout_func(predictor: Any = None, *, tokenizer: Any = None,
                           max_concurrent_requests: int = _DEFAULT_CONCURRENCY,
                           keep_history: bool = True) -> VLLMRollout:
    """A ``rollout_func`` for ``trl.GRPOTrainer`` built with ``use_vllm=True`` (colocate or server)
    that generates through the trainer's vLLM engine in a lengthsched plan's order with per-request
    priorities (:class:`VLLMRollout`). Size the engine with :func:`trl_vllm_config` and
    :func:`trl_vllm_engine_args`; bad arguments raise :class:`~lengthsched.errors.InvalidArgument`."""
    return VLLMRollout(predictor, tokenizer=tokenizer, max_concurrent_requests=max_concurrent_requests,
                       keep_history=keep_history)

