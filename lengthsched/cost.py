"""A roofline price for one engine step, in seconds (numpy only).

One engine step runs ``decode_rows`` decode rows (each adds one token and reads its whole KV
context) and ``prefill_tokens`` prefill tokens (first prefill of prompts, prompt tails,
recomputation of preempted sequences). :class:`StepCost` prices it as

    seconds = overhead + max(bytes / (bandwidth * bandwidth_efficiency),
                             flops / (peak_flops * compute_efficiency)) + comm      (0 for an empty step)

per GPU, with (tokens = decode_rows + prefill_tokens; ``tp`` = tensor-parallel degree)

    bytes = (weights_bytes + kv_bytes_per_token * (kv_tokens_read + tokens)
             + activation_bytes_per_token * tokens) / tp
    flops = (2 * active_parameters * tokens + 2 * lm_head_parameters * decode_rows
             + attention_flops_per_kv_token * (kv_tokens_read + prefill_context)) / tp
    comm  = 2 * num_layers * (allreduce_latency_seconds
             + 2 (tp - 1) / tp * hidden_size * dtype_bytes * tokens / link_bandwidth)   (tp > 1 only)

With ``separate_attention`` (a field, False by default), the attention is priced as its own kernels,
apart from the linear layers (as engines run them: the GEMMs, then an attention kernel per layer):

    seconds = overhead + max(linear bytes / bandwidth', linear flops / compute')
              + max(kv_bytes_per_token * kv_tokens_read / bandwidth',
                    attention_flops_per_kv_token * kv_tokens_read / compute')
              + attention_flops_per_kv_token * prefill_context / compute' + comm

(bandwidth' and compute' after the efficiencies; linear bytes and flops are the ones above without
the KV reads and attention FLOPs). The two forms agree where one side dominates the whole step (a
memory-bound decode step, a compute-bound prefill); they differ where memory-bound and compute-bound
work share a step, above all a MIXED step (a prefill chunk beside decode rows, as chunked prefill and
recomputation make them): separate, the decode rows' KV reads no longer hide behind the chunk's GEMMs. Measured
mixed steps on an H100 side with the separate form (docs/benchmarks.md, level (c)). For the same
parameters the separate form never prices a step below the overlapped one.

Units: seconds, bytes, FLOPs, tokens. ``kv_tokens_read`` is the sum over the decode rows of the
context each attends (its own new token included); ``prefill_context`` the same sum over the
prefill tokens (a whole causal prompt of T tokens: T (T + 1) / 2). The KV each new token writes is
charged as ``kv_bytes_per_token`` per token. What is modelled and what is not is listed in
docs/cost.md; in short:

- weights are read once per step that does anything (an untied input-embedding table is not
  counted: it is gathered, not streamed); MoE experts are all charged (true once the batch touches
  them all, an overestimate for a handful of rows); the LM head runs for decode rows only (engines
  compute prompt logits only at a prompt's last token, a cost ignored here);
- activations: each per-layer activation of :class:`~lengthsched.hfconfig.ModelShapes`
  (``activation_elements``) is written once and read once, per token and layer; fp32 logits and
  the sampler are not charged;
- attention FLOPs are ``2 x layers x query heads x (qk head dim + v head dim)`` per attended
  (query, key) pair (QK^T and PV); sliding windows are ignored in FLOPs and bytes (a row past a
  window is charged its whole context, unless the caller caps ``kv_tokens_read``);
- tensor parallelism divides bytes and FLOPs evenly by ``tp`` (hidden-size activations are in fact
  replicated, a small share) and adds two ring all-reduces of the hidden state per layer, not
  overlapped with compute.

The three fitted parameters (``overhead_seconds``, ``bandwidth_efficiency``,
``compute_efficiency``) default to unfitted priors for an optimised engine that replays decode
steps as CUDA graphs (vLLM, SGLang): see :data:`DEFAULT_OVERHEAD_SECONDS`. :meth:`StepCost.fit`
calibrates them on measured steps (:func:`read_samples`, ``lengthsched cost fit``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InvalidArgument, check_int, check_nonnegative_float, check_positive_float
from .hfconfig import PRESET_DIR, _moe_layers, load_config, preset_names, read_shapes
from .io import read_json_objects
from .memory import DTYPE_BYTES, ModelMemory

__all__ = ["StepCost", "GPUSpec", "GPU_PRESETS", "read_samples", "error_stats", "SAMPLE_COLUMNS",
           "DEFAULT_OVERHEAD_SECONDS", "DEFAULT_BANDWIDTH_EFFICIENCY", "DEFAULT_COMPUTE_EFFICIENCY",
           "DEFAULT_ALLREDUCE_LATENCY_SECONDS", "DEFAULT_HOST_EFFICIENCY", "DEFAULT_HOST_LATENCY_SECONDS"]

#: Unfitted prior of the fixed cost of one step (seconds). With CUDA graphs a decode step is one
#: graph replay, so kernel launches cost almost nothing; what stays is the engine's per-step host
#: work that the GPU waits for (scheduling, input preparation, sampling, output processing), a few
#: hundred microseconds in vLLM V1 / SGLang. 0.5 ms is a prior, not a measurement: fit it.
DEFAULT_OVERHEAD_SECONDS = 0.5e-3
#: Unfitted prior: share of the datasheet HBM bandwidth that large weight and KV reads reach.
DEFAULT_BANDWIDTH_EFFICIENCY = 0.75
#: Unfitted prior: share of the datasheet dense bf16 FLOP/s that large GEMMs reach.
DEFAULT_COMPUTE_EFFICIENCY = 0.65
#: Unfitted prior: latency of one small all-reduce over NVLink (seconds), custom all-reduce kernels.
DEFAULT_ALLREDUCE_LATENCY_SECONDS = 8e-6
#: Share of the host link's datasheet bandwidth (per direction) that a request's paged KV reaches when
#: it is loaded from pinned host memory: 52.6-54.3 GB/s (mean 53.5) of PCIe Gen5 x16's 64 GB/s, two runs
#: on an NVIDIA H100 (benchmarks/gpu_kv_transfer.py, Qwen3-1.7B and Qwen3-8B KV, 16-16384 tokens).
DEFAULT_HOST_EFFICIENCY = 0.83
#: Fixed seconds of one KV load from host memory, measured with it (0.21-0.42 ms, mean 0.30).
DEFAULT_HOST_LATENCY_SECONDS = 0.3e-3
#: Host link of the H100 preset (bytes/s per direction): the default of StepCost files written before
#: the field existed (every one of them was fitted on an H100).
_H100_HOST_BANDWIDTH = 64e9

#: Columns of a measured step: the first four are required, ``prefill_context`` defaults to 0.
SAMPLE_COLUMNS = ("decode_rows", "kv_tokens_read", "prefill_tokens", "seconds", "prefill_context")
_FORMAT, _VERSION = "lengthsched.step_cost", 1


@dataclass(frozen=True)
class GPUSpec:
    """Datasheet numbers of one GPU: ``bandwidth`` HBM bytes/s, ``peak_flops`` dense bf16 tensor FLOP/s
    (no sparsity), ``link_bandwidth`` GPU-to-GPU bytes/s per direction (what a ring all-reduce uses),
    ``host_bandwidth`` GPU-to-host bytes/s per direction (PCIe; what a KV load from host memory uses)."""

    name: str
    description: str
    bandwidth: float
    peak_flops: float
    link_bandwidth: float
    host_bandwidth: float


GPU_PRESETS: dict[str, GPUSpec] = {
    # NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column),
    # https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
    "a100": GPUSpec("a100", "NVIDIA A100 80GB SXM",
                    bandwidth=2.039e12,       # "GPU Memory Bandwidth 2,039GB/s"
                    peak_flops=312e12,        # "BFLOAT16 Tensor Core 312 TFLOPS | 624 TFLOPS*" (* sparsity)
                    link_bandwidth=300e9,     # "NVLink: 600GB/s" (bidirectional) / 2
                    host_bandwidth=32e9),     # "PCIe Gen4: 64GB/s" (bidirectional) / 2
    # NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column),
    # https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet
    "h100": GPUSpec("h100", "NVIDIA H100 SXM 80GB",
                    bandwidth=3.35e12,        # "GPU Memory Bandwidth 3.35TB/s"
                    peak_flops=989.4e12,      # "BFLOAT16 Tensor Core 1,979 teraFLOPS*" (* sparsity) / 2
                    link_bandwidth=450e9,     # "NVIDIA NVLink: 900GB/s" (bidirectional) / 2
                    host_bandwidth=64e9),     # "PCIe Gen5: 128GB/s" (bidirectional) / 2
    # NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column), https://www.nvidia.com/en-us/data-center/h200/
    "h200": GPUSpec("h200", "NVIDIA H200 SXM 141GB",
                    bandwidth=4.8e12,         # "GPU Memory Bandwidth 4.8TB/s"
                    peak_flops=989.4e12,      # "BFLOAT16 Tensor Core 1,979 TFLOPS*" (* sparsity) / 2
                    link_bandwidth=450e9,     # "NVIDIA NVLink: 900GB/s" (bidirectional) / 2
                    host_bandwidth=64e9),     # "PCIe Gen5: 128GB/s" (bidirectional) / 2
    # NVIDIA L40S datasheet, https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413
    "l40s": GPUSpec("l40s", "NVIDIA L40S 48GB (PCIe, no NVLink)",
                    bandwidth=864e9,          # "Memory Bandwidth 864GB/s"
                    peak_flops=362.05e12,     # "BF16 Tensor Core 362.05 | 733* TFLOPS" (* sparsity)
                    link_bandwidth=32e9,      # "PCIe Gen4 x16: 64GB/s bidirectional" / 2
                    host_bandwidth=32e9),     # the same PCIe link
    # NVIDIA HGX B200 (1,000 W per GPU), https://www.nvidia.com/en-us/data-center/hgx/ : per-GPU figures
    # of the 8-GPU board, as also listed in NVIDIA's Blackwell datasheet
    "b200": GPUSpec("b200", "NVIDIA B200 (HGX, 1000 W)",
                    bandwidth=8e12,           # "HBM3e ... 8TB/s" per GPU (64 TB/s per 8-GPU board)
                    peak_flops=2.25e15,       # "FP16/BF16 Tensor Core 4.5 PFLOPS*" (* sparsity) / 2
                    link_bandwidth=900e9,     # "NVLink 5: 1.8TB/s" (bidirectional) / 2
                    host_bandwidth=64e9),     # assumed PCIe Gen5 x16 (the HGX page gives no host-link figure)
}


def _gpu(name: Any) -> GPUSpec:
    if not isinstance(name, str) or name.lower() not in GPU_PRESETS:
        raise InvalidArgument("gpu", name, "one of the GPU presets: " + ", ".join(GPU_PRESETS))
    return GPU_PRESETS[name.lower()]


def _tokens(name: str, value: Any) -> np.ndarray:
    """A non-negative finite token count (scalar or array) as float64."""
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):
        raise InvalidArgument(name, value, "numbers >= 0 (tokens)") from None
    if arr.dtype == bool or arr.dtype.kind not in "iuf":
        raise InvalidArgument(name, value, "numbers >= 0 (tokens)")
    out = arr.astype(np.float64)
    if out.size and not (np.all(np.isfinite(out)) and out.min() >= 0):
        raise InvalidArgument(name, value, "finite numbers >= 0 (tokens)")
    return out


def _out(value: np.ndarray, scalar: bool) -> Any:
    return float(value) if scalar else value


def _lin_sum(alpha: np.ndarray, beta: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """sum_{i=lo}^{hi} (alpha + beta i), 0 where hi < lo."""
    count = np.maximum(hi - lo + 1, 0.0)
    return count * alpha + beta * (lo + hi) * count / 2


@dataclass(frozen=True)
class StepCost:
    """The roofline step-cost model of the module docstring; fields are per model and GPU, not per GPU shard.

    Model numbers: ``weights_bytes`` bytes of weights a step reads; ``active_parameters``
    parameters each token multiplies through in the decoder layers (MoE: the routed experts a
    token activates); ``lm_head_parameters`` vocabulary x hidden (the LM head, paid per decode row);
    ``kv_bytes_per_token`` KV bytes per token over all layers; ``attention_flops_per_kv_token``
    FLOPs per attended (query, key) pair over all layers; ``activation_bytes_per_token``
    activation bytes moved per token; ``num_layers``, ``hidden_size``, ``dtype_bytes`` (the
    all-reduce message). GPU numbers: ``gpu``, ``bandwidth`` (bytes/s), ``peak_flops`` (FLOP/s),
    ``link_bandwidth`` (bytes/s per direction). ``tp``: tensor-parallel degree. Fitted:
    ``overhead_seconds``, ``bandwidth_efficiency``, ``compute_efficiency``;
    ``allreduce_latency_seconds`` is a prior, not fitted. ``separate_attention``: price the
    attention apart from the linear layers (the module docstring); kept by :meth:`fit`.
    ``host_bandwidth`` (bytes/s per direction, the GPU preset's PCIe link), ``host_efficiency`` and
    ``host_latency_seconds`` price a KV load from host memory (:meth:`load_seconds`; measured on an
    H100, not fitted).

    Build it with :meth:`from_gpu` or :meth:`from_model`.
    """

    model: str
    gpu: str
    bandwidth: float
    peak_flops: float
    link_bandwidth: float
    weights_bytes: int
    active_parameters: int
    lm_head_parameters: int
    kv_bytes_per_token: int
    attention_flops_per_kv_token: int
    activation_bytes_per_token: int
    num_layers: int
    hidden_size: int
    dtype_bytes: float = 2.0
    tp: int = 1
    overhead_seconds: float = DEFAULT_OVERHEAD_SECONDS
    bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY
    allreduce_latency_seconds: float = DEFAULT_ALLREDUCE_LATENCY_SECONDS
    separate_attention: bool = False
    host_bandwidth: float = _H100_HOST_BANDWIDTH
    host_efficiency: float = DEFAULT_HOST_EFFICIENCY
    host_latency_seconds: float = DEFAULT_HOST_LATENCY_SECONDS

    def __post_init__(self) -> None:
        if not isinstance(self.separate_attention, (bool, np.bool_)):
            raise InvalidArgument("separate_attention", self.separate_attention, "True or False")
        object.__setattr__(self, "separate_attention", bool(self.separate_attention))
        for name in ("model", "gpu"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise InvalidArgument(name, getattr(self, name), "a non-empty string")
        for name in ("bandwidth", "peak_flops", "link_bandwidth", "dtype_bytes", "bandwidth_efficiency",
                     "compute_efficiency", "host_bandwidth", "host_efficiency"):
            object.__setattr__(self, name, check_positive_float(name, getattr(self, name)))
        for name in ("overhead_seconds", "allreduce_latency_seconds", "host_latency_seconds"):
            object.__setattr__(self, name, check_nonnegative_float(name, getattr(self, name)))
        for name in ("weights_bytes", "active_parameters", "lm_head_parameters", "kv_bytes_per_token",
                     "attention_flops_per_kv_token", "activation_bytes_per_token"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), minimum=0))
        for name in ("num_layers", "hidden_size", "tp"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), minimum=1))

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_gpu(cls, memory: ModelMemory, gpu: str = "h100", *, tp: int = 1,
                 config: str | os.PathLike | Mapping[str, Any] | None = None, **overrides: Any) -> StepCost:
        """The unfitted model of ``memory``'s model on a preset ``gpu`` (:data:`GPU_PRESETS`).

        Bytes come from ``memory`` (its dtypes, weights and KV sizes); head counts, hidden size and
        the MoE routing come from the model's ``config.json``: ``config`` (a dict, a path or a
        bundled preset name), by default the bundled preset whose ``_name_or_path`` or file name is
        ``memory.name``. ``tp``: tensor-parallel degree. ``overrides``: any field but ``gpu`` (the
        preset's name, which ``.replace(gpu=...)`` renames), e.g. ``overhead_seconds=1e-3``,
        ``bandwidth=100e9``.
        """
        if not isinstance(memory, ModelMemory):
            raise InvalidArgument("memory", memory, "a ModelMemory")
        spec = _gpu(gpu)
        check_int("tp", tp, minimum=1)
        cfg = load_config(_config_path(config) if config is not None else _bundled_config(memory.name))
        shapes = read_shapes(cfg)
        heads = int(cfg["num_attention_heads"])
        if cfg.get("kv_lora_rank"):  # MLA: attention over the cached latent (absorbed) or the decompressed heads
            rank, rope = int(cfg["kv_lora_rank"]), int(cfg["qk_rope_head_dim"])
            kv_dtype_bytes = DTYPE_BYTES[memory.kv_dtype.lower()]
            if memory.layer_kv_bytes[0] == math.ceil((rank + rope) * kv_dtype_bytes):
                qk_dim, v_dim = rank + rope, rank
            else:
                qk_dim, v_dim = int(cfg["qk_nope_head_dim"]) + rope, int(cfg["v_head_dim"])
        else:
            qk_dim = v_dim = int(cfg.get("head_dim") or shapes.hidden_size // heads)
        embed = shapes.vocab_size * shapes.hidden_size
        tied = bool(cfg.get("tie_word_embeddings", False))
        moe, experts, width, _ = _moe_layers(cfg, shapes.num_layers)
        top_k = int(cfg.get("num_experts_per_tok") or experts)
        inactive = sum(moe) * 3 * shapes.hidden_size * width * max(experts - top_k, 0)
        body = shapes.num_parameters - embed * (1 if tied else 2) - shapes.hidden_size - inactive
        dtype_bytes = float(DTYPE_BYTES[memory.dtype.lower()])
        values = dict(
            model=memory.name, gpu=spec.name, bandwidth=spec.bandwidth, peak_flops=spec.peak_flops,
            link_bandwidth=spec.link_bandwidth, host_bandwidth=spec.host_bandwidth,
            weights_bytes=max(memory.weights_bytes - (0 if tied else math.ceil(embed * dtype_bytes)), 0),
            active_parameters=max(body, 0), lm_head_parameters=embed,
            kv_bytes_per_token=memory.kv_bytes_per_token,
            attention_flops_per_kv_token=2 * shapes.num_layers * heads * (qk_dim + v_dim),
            activation_bytes_per_token=math.ceil(2 * shapes.num_layers * shapes.activation_elements * dtype_bytes),
            num_layers=shapes.num_layers, hidden_size=shapes.hidden_size, dtype_bytes=dtype_bytes, tp=tp,
        )
        unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise InvalidArgument("overrides", unknown, "field names of StepCost: "
                                  + ", ".join(f.name for f in dataclasses.fields(cls)))
        return cls(**{**values, **overrides})

    @classmethod
    def from_model(cls, model: str | os.PathLike, gpu: str = "h100", *, dtype: str = "bfloat16",
                   kv_dtype: str | None = None, tp: int = 1, **overrides: Any) -> StepCost:
        """:meth:`from_gpu` for a bundled preset name, a ``config.json`` path or a model directory."""
        memory = ModelMemory.from_name(model, dtype, kv_dtype=kv_dtype)
        return cls.from_gpu(memory, gpu, tp=tp, config=_config_path(model), **overrides)

    def replace(self, **changes: Any) -> StepCost:
        """A copy with some fields changed (validated like the constructor)."""
        return dataclasses.replace(self, **changes)

    def on_gpu(self, gpu: str) -> StepCost:
        """This model moved to another card: the preset ``gpu``'s datasheet numbers (``bandwidth``,
        ``peak_flops``, ``link_bandwidth``, ``host_bandwidth``) with every fitted number kept
        (overhead, efficiencies, host efficiency and latency) and the model, ``tp`` and form unchanged.

        The way to price a card nobody calibrated on: efficiencies fitted on one Hopper carry to the
        other far better than an unfitted preset. On engine steps measured on an H100 and an H200
        (Qwen3-1.7B and Qwen3-8B shapes; ``benchmarks/bench_cost.py --sections cards``), an H100 fit
        moved to the h200 preset was off by 2.4-4.2% (median |modelled / measured - 1|), an H200 fit
        moved to the h100 preset by 3.2-4.9%, against 1-4% for a fit on the card itself, 9-65% for
        the unfitted preset and 7-24% for the other card's fit left on that card's numbers. Only this
        pair was measured: a move across architectures (A100, L40S, B200) is unchecked.
        """
        spec = _gpu(gpu)
        return self.replace(gpu=spec.name, bandwidth=spec.bandwidth, peak_flops=spec.peak_flops,
                            link_bandwidth=spec.link_bandwidth, host_bandwidth=spec.host_bandwidth)

    # ----------------------------------------------------------------- pricing
    def _terms(self, rows, kv, prefill, context) -> tuple[np.ndarray, ...]:
        """The step's terms at efficiency 1 (seconds): ``(m1, c1, m2, c2, e, comm, active)`` with
        ``seconds = overhead + max(m1 / bw_eff, c1 / comp_eff) + max(m2 / bw_eff, c2 / comp_eff)
        + e / comp_eff + comm`` for active steps. Overlapped attention: (m1, c1) hold everything and
        m2 = c2 = e = 0; separate: (m1, c1) the linear layers, (m2, c2) the decode rows' attention (KV
        reads, FLOPs), e the prefill tokens' attention FLOPs."""
        tokens = rows + prefill
        active = tokens > 0
        to_mem, to_comp = 1.0 / (self.tp * self.bandwidth), 1.0 / (self.tp * self.peak_flops)
        lin_mem = (self.weights_bytes * active + (self.kv_bytes_per_token + self.activation_bytes_per_token)
                   * tokens) * to_mem
        lin_comp = (2.0 * self.active_parameters * tokens + 2.0 * self.lm_head_parameters * rows) * to_comp
        att_mem = self.kv_bytes_per_token * kv * to_mem
        attn = float(self.attention_flops_per_kv_token)
        dec_comp, pre_comp = attn * kv * to_comp, attn * context * to_comp
        comm = np.where(active, self._comm(tokens), 0.0)
        if self.separate_attention:
            return lin_mem, lin_comp, att_mem, dec_comp, pre_comp, comm, active
        zero = np.zeros_like(lin_mem)
        return lin_mem + att_mem, lin_comp + dec_comp + pre_comp, zero, zero, zero, comm, active

    def _comm(self, tokens, steps=1.0):
        """All-reduce seconds of ``steps`` steps (1 by default) that carry ``tokens`` tokens in all."""
        if self.tp == 1:
            return np.zeros_like(tokens * steps)
        message = self.hidden_size * self.dtype_bytes * tokens
        ring = 2 * (self.tp - 1) / self.tp * message / self.link_bandwidth
        return 2 * self.num_layers * (steps * self.allreduce_latency_seconds + ring)

    def seconds(self, decode_rows: Any, kv_tokens_read: Any, prefill_tokens: Any = 0, prefill_context: Any = 0) -> Any:
        """Modelled seconds of engine steps (numpy broadcasting; a float for scalar inputs).

        ``decode_rows`` rows decoding one token each, reading ``kv_tokens_read`` KV tokens in all
        (the sum of their contexts); ``prefill_tokens`` tokens prefilled, attending
        ``prefill_context`` (query, key) pairs in all. A step with no row and no prefill token costs 0.
        """
        return self.breakdown(decode_rows, kv_tokens_read, prefill_tokens, prefill_context)["seconds"]

    def breakdown(self, decode_rows: Any, kv_tokens_read: Any, prefill_tokens: Any = 0,
                  prefill_context: Any = 0) -> dict[str, Any]:
        """The terms of :meth:`seconds`: ``bytes`` and ``flops`` per GPU, ``memory_seconds`` and
        ``compute_seconds`` (after the efficiencies), ``comm_seconds``, ``seconds`` and
        ``compute_bound`` (the compute term is the larger)."""
        args = [_tokens(n, v) for n, v in zip(("decode_rows", "kv_tokens_read", "prefill_tokens", "prefill_context"),
                                              (decode_rows, kv_tokens_read, prefill_tokens, prefill_context))]
        scalar = all(a.ndim == 0 for a in args)
        m1, c1, m2, c2, e, comm, active = self._terms(*args)
        u, v = 1.0 / self.bandwidth_efficiency, 1.0 / self.compute_efficiency
        roof = np.maximum(m1 * u, c1 * v) + np.maximum(m2 * u, c2 * v) + e * v
        total = np.where(active, self.overhead_seconds + roof + comm, 0.0)
        memory, compute = m1 + m2, c1 + c2 + e
        out = {"bytes": memory * self.bandwidth, "flops": compute * self.peak_flops,  # per GPU
               "memory_seconds": memory * u, "compute_seconds": compute * v, "comm_seconds": comm, "seconds": total}
        out = {k: _out(np.asarray(v, dtype=np.float64), scalar) for k, v in out.items()}
        bound = active & (c1 * v > m1 * u)  # separate attention: the linear layers' side
        out["compute_bound"] = bool(bound) if scalar else bound
        return out

    def load_seconds(self, loaded_tokens: Any) -> Any:
        """Seconds a load of ``loaded_tokens`` KV tokens from host memory takes (requests whose KV comes
        from a global pool, as in Seer's divided rollout, or from the replica's own host memory after
        a preemption, as vLLM's CPU offloading keeps it): ``host_latency_seconds + bytes /
        (host_bandwidth x host_efficiency)`` per GPU shard, 0 for no token. :meth:`segment_seconds`
        charges it to the whole step that admits the requests (synchronous: a pessimistic price); the
        rollout simulator times offloaded loads asynchronously instead (only the loaded request waits:
        ``lengthsched.runtime.Engine.load_steps``)."""
        tokens = _tokens("loaded_tokens", loaded_tokens)
        secs = np.where(tokens > 0, self.host_latency_seconds + tokens * self.kv_bytes_per_token
                        / (self.tp * self.host_bandwidth * self.host_efficiency), 0.0)
        return _out(secs, tokens.ndim == 0)

    def segment_seconds(self, steps: Any, rows: Any, kv_first: Any, prefill_tokens: Any = 0,
                        prefill_context: Any = 0, loaded_tokens: Any = 0, growth: Any = None) -> Any:
        """Sum of :meth:`seconds` over ``steps`` consecutive steps of ``rows`` decode rows (vectorised).

        Step i (0-based) reads ``kv_first + i * growth`` KV tokens (``growth``: the rows whose KV read
        grows by one token per step; None: every row, as without a compressed cache);
        ``prefill_tokens`` / ``prefill_context`` happen in the first step only, and so does the
        load of ``loaded_tokens`` KV tokens from host memory (:meth:`load_seconds`). Closed form:
        both roofline terms are linear in i, so the max switches regime at most once; the steps on
        each side of the crossover are summed as arithmetic series (separate attention: the linear
        layers cost the same every step and the attention grows linearly, one series).
        """
        steps_a = _tokens("steps", steps)
        if steps_a.size and np.any(steps_a != np.floor(steps_a)):
            raise InvalidArgument("steps", steps, "whole numbers of steps >= 0")
        rows_a, kv_a = _tokens("rows", rows), _tokens("kv_first", kv_first)
        pf_a, pc_a = _tokens("prefill_tokens", prefill_tokens), _tokens("prefill_context", prefill_context)
        ld_a = _tokens("loaded_tokens", loaded_tokens)
        gr_a = rows_a if growth is None else _tokens("growth", growth)
        scalar = all(a.ndim == 0 for a in (steps_a, rows_a, kv_a, pf_a, pc_a, ld_a, gr_a))
        steps_a, rows_a, kv_a, pf_a, pc_a, ld_a, gr_a = np.broadcast_arrays(steps_a, rows_a, kv_a, pf_a, pc_a, ld_a,
                                                                            gr_a)
        first = np.where(steps_a > 0, self.seconds(rows_a, kv_a, pf_a, pc_a) + self.load_seconds(ld_a), 0.0)
        # Following steps i = 1 .. n: memory m0 + mb i, compute f0 + fb i (seconds, after efficiencies).
        n = np.where(rows_a > 0, np.maximum(steps_a - 1, 0.0), 0.0)
        mem_scale = 1.0 / (self.tp * self.bandwidth * self.bandwidth_efficiency)
        comp_scale = 1.0 / (self.tp * self.peak_flops * self.compute_efficiency)
        c, a = float(self.kv_bytes_per_token), float(self.activation_bytes_per_token)
        if self.separate_attention:  # linear layers: the same every step; attention: linear in the KV read
            linear = np.maximum((self.weights_bytes + (c + a) * rows_a) * mem_scale,
                                2.0 * (self.active_parameters + self.lm_head_parameters) * rows_a * comp_scale)
            per_kv = max(c * mem_scale, float(self.attention_flops_per_kv_token) * comp_scale)
            kv_sum = n * kv_a + gr_a * n * (n + 1) / 2  # sum of kv_first + i growth over i = 1 .. n
            rest = n * (self.overhead_seconds + self._comm(rows_a) + linear) + per_kv * kv_sum
            return _out(first + np.where(n > 0, rest, 0.0), scalar)
        m0 = (self.weights_bytes + c * (kv_a + rows_a) + a * rows_a) * mem_scale
        mb = c * gr_a * mem_scale
        attn = float(self.attention_flops_per_kv_token)
        f0 = ((2.0 * self.active_parameters + 2.0 * self.lm_head_parameters) * rows_a + attn * kv_a) * comp_scale
        fb = attn * gr_a * comp_scale
        d0, dd = m0 - f0, mb - fb  # memory-bound where d0 + dd i >= 0
        with np.errstate(divide="ignore", invalid="ignore"):
            x = -d0 / dd
        # Split point s: [1, s-1] and [s, n] lie on either side of the crossover.
        x = np.nan_to_num(x, nan=0.0)  # only where dd == 0, which uses s_flat
        s_up = np.clip(np.ceil(x), 1, n + 1)  # dd > 0: compute bound before s, memory bound from s
        s_down = np.clip(np.floor(x) + 1, 1, n + 1)  # dd < 0: memory bound before s, compute bound from s
        s_flat = np.where(d0 >= 0, 1.0, n + 1)  # dd == 0: all memory bound (s = 1) or none
        one = np.ones_like(n)
        mem_rising = _lin_sum(f0, fb, one, s_up - 1) + _lin_sum(m0, mb, s_up, n)
        mem_falling = _lin_sum(m0, mb, one, s_down - 1) + _lin_sum(f0, fb, s_down, n)
        flat = _lin_sum(f0, fb, one, s_flat - 1) + _lin_sum(m0, mb, s_flat, n)
        roof = np.where(dd > 0, mem_rising, np.where(dd < 0, mem_falling, flat))
        rest = n * (self.overhead_seconds + self._comm(rows_a)) + roof
        return _out(first + np.where(n > 0, rest, 0.0), scalar)

    def segment_seconds_float(self, steps: int, rows: int, kv_first: int, prefill_tokens: int = 0,
                              prefill_context: int = 0, loaded_tokens: int = 0, growth: int | None = None) -> float:
        """:meth:`segment_seconds` of one run of steps, in plain float arithmetic (no checks, no numpy:
        ~50x faster per call, for simulators that price every event as it happens). Inputs are trusted
        token counts; ``tests/test_cost.py`` checks it equals :meth:`segment_seconds`."""
        if steps <= 0:
            return 0.0
        growth = rows if growth is None else growth
        tp, bw, pk = self.tp, self.bandwidth, self.peak_flops
        c, a, attn = float(self.kv_bytes_per_token), float(self.activation_bytes_per_token), \
            float(self.attention_flops_per_kv_token)
        dense = 2.0 * self.active_parameters
        head = 2.0 * self.lm_head_parameters

        def comm(tokens: float, n: float = 1.0) -> float:
            if tp == 1:
                return 0.0
            ring = 2 * (tp - 1) / tp * (self.hidden_size * self.dtype_bytes * tokens) / self.link_bandwidth
            return 2 * self.num_layers * (n * self.allreduce_latency_seconds + ring)

        tokens = rows + prefill_tokens
        first = (self.host_latency_seconds + loaded_tokens * self.kv_bytes_per_token
                 / (tp * self.host_bandwidth * self.host_efficiency)) if loaded_tokens > 0 else 0.0
        mem_scale = 1.0 / (tp * bw * self.bandwidth_efficiency)
        comp_scale = 1.0 / (tp * pk * self.compute_efficiency)
        if self.separate_attention:
            per_kv = max(c * mem_scale, attn * comp_scale)
            if tokens > 0:
                first += (self.overhead_seconds + max((self.weights_bytes + (c + a) * tokens) * mem_scale,
                                                     (dense * tokens + head * rows) * comp_scale)
                         + per_kv * kv_first + attn * prefill_context * comp_scale + comm(tokens))
            n = float(steps - 1) if rows > 0 else 0.0
            if n <= 0:
                return first
            linear = max((self.weights_bytes + (c + a) * rows) * mem_scale, (dense + head) * rows * comp_scale)
            return (first + n * (self.overhead_seconds + comm(rows) + linear)
                    + per_kv * (n * kv_first + growth * n * (n + 1) / 2))
        if tokens > 0:
            memory = (self.weights_bytes + c * (kv_first + tokens) + a * tokens) / (tp * bw)
            compute = (dense * tokens + head * rows + attn * (kv_first + prefill_context)) / (tp * pk)
            first += self.overhead_seconds + max(memory / self.bandwidth_efficiency,
                                                compute / self.compute_efficiency) + comm(tokens)
        n = float(steps - 1) if rows > 0 else 0.0
        if n <= 0:
            return first
        m0, mb = (self.weights_bytes + c * (kv_first + rows) + a * rows) * mem_scale, c * growth * mem_scale
        f0, fb = ((dense + head) * rows + attn * kv_first) * comp_scale, attn * growth * comp_scale
        d0, dd = m0 - f0, mb - fb

        def lin(alpha: float, beta: float, lo: float, hi: float) -> float:
            count = max(hi - lo + 1, 0.0)
            return count * alpha + beta * (lo + hi) * count / 2

        if dd > 0:
            s = min(max(math.ceil(-d0 / dd), 1.0), n + 1)
            roof = lin(f0, fb, 1.0, s - 1) + lin(m0, mb, s, n)
        elif dd < 0:
            s = min(max(math.floor(-d0 / dd) + 1, 1.0), n + 1)
            roof = lin(m0, mb, 1.0, s - 1) + lin(f0, fb, s, n)
        else:
            s = 1.0 if d0 >= 0 else n + 1
            roof = lin(f0, fb, 1.0, s - 1) + lin(m0, mb, s, n)
        return first + n * (self.overhead_seconds + comm(rows)) + roof

    def lower_bound_seconds(self, *, steps: Any, decode_tokens: Any, kv_tokens_read: Any, prefill_tokens: Any = 0,
                            prefill_context: Any = 0) -> Any:
        """A lower bound on the summed :meth:`seconds` of any ``steps`` steps (at least) that together
        decode ``decode_tokens`` tokens reading ``kv_tokens_read`` KV tokens and prefill ``prefill_tokens``
        tokens attending ``prefill_context`` pairs, however the work is split between steps.

        Each of the ``steps`` steps pays the overhead, reads the weights and (tp > 1) the all-reduce
        latencies; the bytes, FLOPs and all-reduce volume of the tokens are the same whatever the
        split; and a sum of maxima is at least the maximum of the sums:
        ``steps * overhead + max(total bytes / bandwidth, total FLOPs / compute) + comm`` (seconds).
        With ``separate_attention`` the same bound holds (a step is never priced below its overlapped
        price), though looser.
        """
        n = _tokens("steps", steps)
        parts = self.lower_bound_parts(decode_tokens, kv_tokens_read, prefill_tokens, prefill_context)
        scalar = n.ndim == 0 and all(np.ndim(v) == 0 for v in parts.values())
        total = (n * parts["step_seconds"] + np.maximum(n * parts["step_memory_seconds"] + parts["memory_seconds"],
                                                        parts["compute_seconds"]) + parts["comm_seconds"])
        return _out(np.asarray(total, dtype=np.float64), scalar)

    def lower_bound_parts(self, decode_tokens: Any, kv_tokens_read: Any, prefill_tokens: Any = 0,
                          prefill_context: Any = 0) -> dict[str, Any]:
        """The terms of :meth:`lower_bound_seconds` (seconds, after the efficiencies; numpy broadcasting):
        per step, ``step_seconds`` (the overhead and, tp > 1, the all-reduce latencies) and
        ``step_memory_seconds`` (reading the weights); for the tokens, ``memory_seconds`` (KV and
        activation bytes), ``compute_seconds`` (FLOPs) and ``comm_seconds`` (all-reduce volume).
        ``lower_bound_seconds(steps=n, ...) = n * step_seconds + max(n * step_memory_seconds +
        memory_seconds, compute_seconds) + comm_seconds``; both the memory and the compute side grow
        linearly with the tokens, so a lower bound may split the work between replicas."""
        rows, kv = _tokens("decode_tokens", decode_tokens), _tokens("kv_tokens_read", kv_tokens_read)
        pf, pc = _tokens("prefill_tokens", prefill_tokens), _tokens("prefill_context", prefill_context)
        tokens = rows + pf
        mem_scale = 1.0 / (self.tp * self.bandwidth * self.bandwidth_efficiency)
        nbytes = self.kv_bytes_per_token * (kv + tokens) + self.activation_bytes_per_token * tokens
        flops = (2.0 * self.active_parameters * tokens + 2.0 * self.lm_head_parameters * rows
                 + float(self.attention_flops_per_kv_token) * (kv + pc))
        latency = 2 * self.num_layers * self.allreduce_latency_seconds if self.tp > 1 else 0.0
        return {"step_seconds": self.overhead_seconds + latency,
                "step_memory_seconds": self.weights_bytes * mem_scale,
                "memory_seconds": nbytes * mem_scale,
                "compute_seconds": flops / (self.tp * self.peak_flops * self.compute_efficiency),
                "comm_seconds": self._comm(tokens, 0.0)}

    def decode_compute_bound_rows(self, context: Any) -> Any:
        """Fewest decode rows per step from which a pure decode step is compute bound, when every row
        attends ``context`` tokens; ``inf`` where it never is (long contexts: attention reads
        ``kv_bytes_per_token`` bytes per ``attention_flops_per_kv_token`` FLOPs, far below the ridge).
        A float (or array of floats) holding whole numbers. With ``separate_attention``: rows from
        which the linear layers are compute bound (whatever the context: the attention kernels are
        priced on their own)."""
        ctx = _tokens("context", context)
        read = 0.0 if self.separate_attention else ctx
        per_row_mem = (self.kv_bytes_per_token * (read + 1) + self.activation_bytes_per_token) / (
            self.bandwidth * self.bandwidth_efficiency)
        per_row_comp = (2.0 * (self.active_parameters + self.lm_head_parameters)
                        + float(self.attention_flops_per_kv_token) * read) / (self.peak_flops * self.compute_efficiency)
        per_row_mem, per_row_comp = np.broadcast_arrays(per_row_mem, per_row_comp)
        gain = per_row_comp - per_row_mem
        fixed = self.weights_bytes / (self.bandwidth * self.bandwidth_efficiency)
        crossover = fixed / np.where(gain > 0, gain, 1.0)  # rows where the two terms are equal
        rows = np.where(gain > 0, np.maximum(np.ceil(crossover - 1e-9 * np.maximum(crossover, 1.0)), 1.0), np.inf)
        return _out(rows, ctx.ndim == 0)

    # ----------------------------------------------------------------- calibration
    def errors(self, samples: Any) -> np.ndarray:
        """Signed relative errors ``modelled / measured - 1`` of measured steps (see :meth:`fit`)."""
        cols = _columns(samples)
        pred = self.seconds(*(cols[k] for k in ("decode_rows", "kv_tokens_read", "prefill_tokens", "prefill_context")))
        return np.asarray(pred, dtype=np.float64) / cols["seconds"] - 1.0

    def fit(self, samples: Any) -> StepCost:
        """This model with ``overhead_seconds``, ``bandwidth_efficiency`` and ``compute_efficiency`` fitted.

        ``samples``: measured steps with columns :data:`SAMPLE_COLUMNS` (``prefill_context``
        optional): a dict of columns, a list of dicts, a numpy structured array, or an (N, 4|5)
        array in the order decode_rows, kv_tokens_read, prefill_tokens, seconds[, prefill_context].
        Minimises the sum of squared relative errors. Given which steps are memory bound, the model
        is linear in (overhead, 1 / bandwidth_efficiency, 1 / compute_efficiency), so every split of
        the steps by their bytes / FLOPs ratio is solved by weighted least squares and the best
        split (judged by the true, max-based error) is then refined by alternating assignment and
        solve. Bounds: overhead >= 0 and efficiencies <= 1 (the datasheet numbers are peaks; a
        parameter that would cross its bound is pinned to it). A regime with no step keeps this
        model's efficiency (capped at 1). Without steps whose KV reads or activations vary, the
        overhead and the weight-read time are hardly separable; the bound then decides. The fitted
        model keeps this model's form (``separate_attention``); its three terms are fitted the same way.
        """
        cols = _columns(samples)
        t = cols["seconds"]
        memory, compute, memory2, compute2, extra, comm, active = self._terms(
            cols["decode_rows"], cols["kv_tokens_read"], cols["prefill_tokens"], cols["prefill_context"])
        if not np.all(active):
            bad = int(np.flatnonzero(~active)[0])
            raise InvalidArgument("samples", f"row {bad}", "steps with decode_rows + prefill_tokens > 0")
        if t.size < 3:
            raise InvalidArgument("samples", int(t.size), "at least 3 measured steps (3 parameters are fitted)")
        prior = np.array([self.overhead_seconds, 1 / self.bandwidth_efficiency, 1 / self.compute_efficiency])

        def objective(p: np.ndarray) -> float:
            pred = (p[0] + np.maximum(memory * p[1], compute * p[2]) + np.maximum(memory2 * p[1], compute2 * p[2])
                    + extra * p[2] + comm)
            return float(np.sum(((pred - t) / t) ** 2))

        bounds = np.array([0.0, 1.0, 1.0])  # overhead >= 0; 1 / efficiency >= 1 (datasheet numbers are peaks)
        # Separate attention: the decode rows' attention has one bytes / FLOPs ratio for every step, so it
        # is memory bound in all of them or in none; both are tried with each split of the linear layers.
        attention_splits = (True, False) if self.separate_attention else (True,)

        def regimes(p: np.ndarray) -> tuple[np.ndarray, bool]:
            return memory * p[1] >= compute * p[2], bool(np.all(memory2 * p[1] >= compute2 * p[2]))

        def solve(mem: np.ndarray, mem2: bool = True) -> np.ndarray | None:
            m_col = memory * mem + (memory2 if mem2 else 0.0)
            c_col = compute * ~mem + (0.0 if mem2 else compute2) + extra
            design = np.stack([np.ones_like(t), m_col, c_col], axis=1) / t[:, None]
            target = (t - comm) / t
            p = np.maximum(prior, bounds)
            free = [0] + [j for j, col in ((1, m_col), (2, c_col)) if np.any(col > 0)]
            while free:  # active set: a parameter past its bound is pinned there and the rest re-solved
                fixed = [j for j in range(3) if j not in free]
                rhs = target - design[:, fixed] @ p[fixed]
                p[free] = np.linalg.lstsq(design[:, free], rhs, rcond=None)[0]
                out = [j for j in free if p[j] < bounds[j]]
                if not out:
                    break
                p[out] = bounds[out]
                free = [j for j in free if j not in out]
            return p if np.all(np.isfinite(p)) else None

        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(compute > 0, memory / compute, np.inf)
        cuts = np.unique(ratio)
        if cuts.size > 256:
            cuts = np.unique(np.quantile(cuts, np.linspace(0, 1, 256)))
        thresholds = np.concatenate([[-np.inf], (cuts[:-1] + cuts[1:]) / 2, [np.inf]])
        best, best_obj = prior, objective(prior)
        for thr in thresholds:  # memory bound where memory * u >= compute * v, i.e. ratio >= v / u
            for mem2 in attention_splits:
                p = solve(ratio >= thr, mem2)
                if p is not None and objective(p) < best_obj:
                    best, best_obj = p, objective(p)
        for _ in range(50):  # alternate: regimes of the current parameters, then solve
            p = solve(*regimes(best))
            if p is None or objective(p) >= best_obj * (1 - 1e-12):
                break
            best, best_obj = p, objective(p)
        return self.replace(overhead_seconds=float(best[0]), bandwidth_efficiency=float(1 / best[1]),
                            compute_efficiency=float(1 / best[2]))

    def fit_and_validate(self, samples: Any, train_fraction: float = 0.5, seed: int = 0) -> tuple[StepCost, dict]:
        """Fit on a seeded random ``train_fraction`` of the samples and report relative errors.

        Returns the fitted model and a report: ``parameters`` (fitted) and ``prior_parameters``;
        ``train``, ``held_out`` (fitted model) and ``prior_train``, ``prior_held_out`` (this model),
        each ``{n, median, p90, max}`` of absolute relative errors (None where there is no sample);
        ``compute_bound_train``: training steps the fitted model calls compute bound.
        """
        cols = _columns(samples)
        n = cols["seconds"].size
        idle = np.flatnonzero(cols["decode_rows"] + cols["prefill_tokens"] <= 0)
        if idle.size:  # named here, in the order given (fit sees the split's order)
            raise InvalidArgument("samples", f"step {int(idle[0])} (0-based, in the order given)",
                                  "steps with decode_rows + prefill_tokens > 0 (one that ran no forward has no "
                                  "modelled work)")
        frac = check_positive_float("train_fraction", train_fraction, maximum=1.0)
        check_int("seed", seed, minimum=0)
        n_train = int(round(frac * n))
        if n_train < 3:
            raise InvalidArgument("train_fraction", train_fraction,
                                  f"a fraction that leaves at least 3 of the {n} samples for fitting")
        order = np.random.default_rng(seed).permutation(n)
        train = {k: v[order[:n_train]] for k, v in cols.items()}
        held = {k: v[order[n_train:]] for k, v in cols.items()}
        fitted = self.fit(train)
        b = fitted.breakdown(train["decode_rows"], train["kv_tokens_read"], train["prefill_tokens"],
                             train["prefill_context"])
        report = {
            "n_samples": int(n), "train_fraction": frac, "seed": int(seed),
            "parameters": fitted.parameters(), "prior_parameters": self.parameters(),
            "train": error_stats(fitted.errors(train)), "held_out": error_stats(fitted.errors(held)),
            "prior_train": error_stats(self.errors(train)), "prior_held_out": error_stats(self.errors(held)),
            "compute_bound_train": int(np.sum(b["compute_bound"])),
        }
        return fitted, report

    def parameters(self) -> dict[str, float]:
        """The three fitted parameters."""
        return {"overhead_seconds": self.overhead_seconds, "bandwidth_efficiency": self.bandwidth_efficiency,
                "compute_efficiency": self.compute_efficiency}

    # ----------------------------------------------------------------- JSON
    def to_json(self) -> str:
        """Every field as a JSON object with a ``format`` and ``version`` key (:meth:`from_json` reads it)."""
        return json.dumps({"format": _FORMAT, "version": _VERSION, **dataclasses.asdict(self)}, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> StepCost:
        """The model written by :meth:`to_json`; every field is validated as by the constructor."""
        try:
            data = json.loads(text)
        except (TypeError, json.JSONDecodeError) as exc:
            raise InvalidArgument("cost", str(text)[:60], f"a step-cost JSON object ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise InvalidArgument("cost", data, f"a JSON object with \"format\": \"{_FORMAT}\"")
        if data.get("version") != _VERSION:
            raise InvalidArgument("version", data.get("version"), f"{_VERSION} (the version this lengthsched writes)")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        body = {k: v for k, v in data.items() if k not in ("format", "version")}
        unknown = sorted(set(body) - set(fields))
        if unknown:
            raise InvalidArgument("cost", unknown, "only the fields " + ", ".join(fields))
        missing = [n for n, f in fields.items() if f.default is dataclasses.MISSING and n not in body]
        if missing:
            raise InvalidArgument("cost", sorted(body), "every field; missing " + ", ".join(missing))
        return cls(**body)

    @classmethod
    def from_file(cls, path: str | os.PathLike, name: str = "cost") -> StepCost:
        """:meth:`from_json` of the file at ``path`` (``name``: the argument a bad path is reported as)."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, TypeError, UnicodeDecodeError) as exc:
            raise InvalidArgument(name, path, f"a readable step-cost JSON file ({exc.__class__.__name__})") from None
        return cls.from_json(text)

    def describe(self) -> dict[str, Any]:
        """A JSON-ready summary: every field plus the derived per-step weight-read time (seconds)."""
        return {**dataclasses.asdict(self), "weights_read_seconds": self.weights_bytes / (
            self.tp * self.bandwidth * self.bandwidth_efficiency)}


# --------------------------------------------------------------------------- samples
def error_stats(errors: Any) -> dict[str, Any]:
    """``{n, median, p90, max}`` of the absolute values of relative errors (None for an empty set)."""
    e = np.abs(np.asarray(errors, dtype=np.float64))
    if e.size == 0:
        return {"n": 0, "median": None, "p90": None, "max": None}
    return {"n": int(e.size), "median": float(np.median(e)), "p90": float(np.quantile(e, 0.9)), "max": float(e.max())}


def _columns(samples: Any) -> dict[str, np.ndarray]:
    """Measured steps as float64 columns :data:`SAMPLE_COLUMNS` (validated)."""
    required = SAMPLE_COLUMNS[:4]
    expected = ("measured steps: a dict of columns, a list of dicts, a structured array or an (N, 4|5) array "
                "with " + ", ".join(required) + " [, prefill_context]")
    if isinstance(samples, np.ndarray) and samples.dtype.names:
        samples = {name: samples[name] for name in samples.dtype.names}
    if isinstance(samples, Mapping):
        raw = dict(samples)
    elif isinstance(samples, (list, tuple)) and samples and all(isinstance(s, Mapping) for s in samples):
        missing = [k for k in required if not all(k in s for s in samples)]
        if missing:
            raise InvalidArgument("samples", samples, expected + f" (missing {missing[0]!r})")
        raw = {k: [s.get(k, 0) for s in samples] for k in SAMPLE_COLUMNS}
    else:
        try:
            arr = np.asarray(samples, dtype=np.float64)
        except (TypeError, ValueError):
            raise InvalidArgument("samples", samples, expected) from None
        if arr.ndim != 2 or arr.shape[1] not in (4, 5):
            raise InvalidArgument("samples", samples, expected)
        raw = {k: arr[:, j] for j, k in enumerate(SAMPLE_COLUMNS[: arr.shape[1]])}
    missing = [k for k in required if k not in raw]
    if missing:
        raise InvalidArgument("samples", sorted(raw), expected + f" (missing {missing[0]!r})")
    raw.setdefault("prefill_context", 0)
    cols = {k: _tokens(k, raw[k]) for k in SAMPLE_COLUMNS}
    n = cols["seconds"].size
    if cols["seconds"].ndim != 1 or n == 0:
        raise InvalidArgument("seconds", raw["seconds"], "a non-empty 1-D column")
    cols = {k: np.broadcast_to(v, (n,)).copy() if v.ndim == 0 else v for k, v in cols.items()}
    for k, v in cols.items():
        if v.shape != (n,):
            raise InvalidArgument(k, raw[k], f"a 1-D column of {n} values (as 'seconds')")
    if np.any(cols["seconds"] <= 0):
        raise InvalidArgument("seconds", raw["seconds"], "measured times > 0 (seconds)")
    return cols


def read_samples(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Measured steps from a JSON lines file, one object per line with the keys :data:`SAMPLE_COLUMNS`
    (``prefill_context`` optional, other keys ignored, blank lines skipped); returns the columns."""
    rows = []
    for number, row in read_json_objects(path, "samples"):
        where = f" ({path}, line {number})"
        for key in SAMPLE_COLUMNS:
            if key not in row and key != "prefill_context":
                raise InvalidArgument("samples", row, f"the key {key!r}{where}")
            value = row.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 \
                    or (key == "seconds" and value <= 0):
                bound = "> 0" if key == "seconds" else ">= 0"
                raise InvalidArgument("samples", row, f"{key}: a number {bound}{where}")
        rows.append(row)
    if not rows:
        raise InvalidArgument("samples", str(path), "at least one measured step")
    return _columns(rows)


# --------------------------------------------------------------------------- configs
def _config_path(model: Any) -> Any:
    """A config dict/path as given, or the bundled preset's path for a preset name."""
    if isinstance(model, (str, os.PathLike)) and not os.path.exists(model) and str(model) in preset_names():
        return PRESET_DIR / f"{model}.json"
    return model


def _bundled_config(name: str) -> Path:
    for stem in preset_names():
        path = PRESET_DIR / f"{stem}.json"
        if stem == name or json.loads(path.read_text(encoding="utf-8")).get("_name_or_path") == name:
            return path
    raise InvalidArgument("config", None, f"the config.json of model {name!r} (a dict, a path or a preset: "
                          + ", ".join(preset_names()) + ")")
