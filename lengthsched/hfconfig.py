"""Read the shapes the memory model needs from a Hugging Face ``config.json``.

Pure Python: no ``transformers`` import. Covers dense decoders (Llama, Qwen2/2.5/3, Mistral),
sliding-window layers (Mistral v0.1, Qwen2 ``max_window_layers``, Gemma 2/3, any config with
``layer_types``), mixture-of-experts MLPs (DeepSeek, Qwen-MoE, Mixtral) and DeepSeek's multi-head
latent attention (MLA). Multimodal configs are read from their ``text_config``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError

__all__ = ["ModelShapes", "load_config", "read_shapes", "PRESET_DIR", "preset_names"]

PRESET_DIR = Path(__file__).with_name("presets")


def preset_names() -> list[str]:
    """Names of the model configs bundled with the package (``lengthsched/presets``)."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


@dataclass(frozen=True)
class ModelShapes:
    """The shapes of a decoder that decide its memory (all counts, no bytes)."""

    name: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_parameters: int
    # Elements cached per token in each layer (K and V together, or the MLA latent).
    layer_kv_elements: tuple[int, ...]
    # Sliding window of each layer in tokens; None for full attention.
    layer_windows: tuple[int | None, ...]
    # Elements of the largest per-sequence decode activations (see ModelMemory docs).
    activation_elements: int


def load_config(config: str | os.PathLike | Mapping[str, Any]) -> dict:
    """Return a config dict from a dict, a ``config.json`` path or a model directory."""
    if isinstance(config, Mapping):
        cfg = dict(config)
    elif isinstance(config, (str, os.PathLike)):
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ConfigError(
                f"argument 'config': {str(config)!r} is not a config.json file or a directory with one"
            )
        try:
            cfg = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"argument 'config': cannot read {str(path)!r} as JSON: {exc}") from exc
        if not isinstance(cfg, dict):
            raise ConfigError(f"argument 'config': {str(path)!r} holds {type(cfg).__name__}, expected a JSON object")
    else:
        raise ConfigError(
            f"argument 'config': got {type(config).__name__}; expected a dict or a path to config.json"
        )
    text = cfg.get("text_config")
    if isinstance(text, Mapping) and "num_hidden_layers" not in cfg:
        cfg = {**{k: v for k, v in cfg.items() if k != "text_config"}, **text}
    return cfg


def _get_int(cfg: Mapping[str, Any], key: str, default: Any = ..., minimum: int = 1) -> int:
    value = cfg.get(key, default)
    if value is ...:
        raise ConfigError(f"config: required field '{key}' is missing")
    if value is None and default is not ...:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"config: field '{key}' is {value!r}; expected an integer >= {minimum}")
    return value


def _windows(cfg: Mapping[str, Any], num_layers: int) -> tuple[int | None, ...]:
    window = _get_int(cfg, "sliding_window", None)
    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise ConfigError(
                f"config: field 'layer_types' has {layer_types!r}; expected a list of {num_layers} layer types"
            )
        chunk = _get_int(cfg, "attention_chunk_size", None)
        sizes = {"sliding_attention": window, "chunked_attention": chunk}
        return tuple(sizes.get(t) for t in layer_types)
    if window is None or cfg.get("use_sliding_window") is False:
        return (None,) * num_layers
    model_type = str(cfg.get("model_type", ""))
    if model_type == "gemma2":  # even layers slide (transformers Gemma2DecoderLayer)
        return tuple(window if i % 2 == 0 else None for i in range(num_layers))
    if model_type.startswith("gemma3"):
        pattern = _get_int(cfg, "sliding_window_pattern", 6)
        return tuple(window if (i + 1) % pattern else None for i in range(num_layers))
    if "max_window_layers" in cfg and cfg.get("use_sliding_window"):  # Qwen2 family
        first = _get_int(cfg, "max_window_layers", minimum=0)
        return tuple(window if i >= first else None for i in range(num_layers))
    return (window,) * num_layers


def _moe_layers(cfg: Mapping[str, Any], num_layers: int) -> tuple[list[bool], int, int, int]:
    """Which layers are MoE, and (experts, expert width, always-on width) of those layers."""
    dense = [False] * num_layers
    if cfg.get("n_routed_experts"):  # DeepSeek V2/V3
        experts = _get_int(cfg, "n_routed_experts")
        width = _get_int(cfg, "moe_intermediate_size")
        shared = _get_int(cfg, "n_shared_experts", 0, minimum=0) * width
        first = _get_int(cfg, "first_k_dense_replace", 0, minimum=0)
        freq = _get_int(cfg, "moe_layer_freq", 1)
        return [i >= first and i % freq == 0 for i in range(num_layers)], experts, width, shared
    if cfg.get("num_experts"):  # Qwen2-MoE / Qwen3-MoE
        experts = _get_int(cfg, "num_experts")
        width = _get_int(cfg, "moe_intermediate_size")
        shared = _get_int(cfg, "shared_expert_intermediate_size", 0, minimum=0)
        step = _get_int(cfg, "decoder_sparse_step", 1)
        only_dense = set(cfg.get("mlp_only_layers") or [])
        moe = [(i not in only_dense) and (i + 1) % step == 0 for i in range(num_layers)]
        return moe, experts, width, shared
    if cfg.get("num_local_experts"):  # Mixtral
        return [True] * num_layers, _get_int(cfg, "num_local_experts"), _get_int(cfg, "intermediate_size"), 0
    return dense, 0, 0, 0


def read_shapes(cfg: Mapping[str, Any], *, mla_latent_cache: bool = True) -> ModelShapes:
    """Derive :class:`ModelShapes` from a config dict (see :func:`load_config`).

    ``mla_latent_cache``: for MLA models, cache the compressed latent (``kv_lora_rank +
    qk_rope_head_dim`` elements per token and layer, as vLLM and SGLang do) rather than the
    decompressed per-head K and V (as plain ``transformers`` does).
    """
    layers = _get_int(cfg, "num_hidden_layers")
    hidden = _get_int(cfg, "hidden_size")
    heads = _get_int(cfg, "num_attention_heads")
    vocab = _get_int(cfg, "vocab_size")
    kv_heads = _get_int(cfg, "num_key_value_heads", heads)
    head_dim = cfg.get("head_dim") or (hidden // heads)
    if not isinstance(head_dim, int) or head_dim < 1:
        raise ConfigError(f"config: field 'head_dim' is {head_dim!r}; expected an integer >= 1")
    intermediate = _get_int(cfg, "intermediate_size", 4 * hidden)
    model_type = str(cfg.get("model_type", ""))

    if cfg.get("kv_lora_rank"):  # DeepSeek multi-head latent attention
        kv_rank = _get_int(cfg, "kv_lora_rank")
        rope = _get_int(cfg, "qk_rope_head_dim")
        nope = _get_int(cfg, "qk_nope_head_dim")
        v_dim = _get_int(cfg, "v_head_dim")
        q_rank = _get_int(cfg, "q_lora_rank", None)
        q_out = heads * (nope + rope)
        q_params = hidden * q_out if q_rank is None else hidden * q_rank + q_rank + q_rank * q_out
        attn = (q_params + hidden * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v_dim)
                + heads * v_dim * hidden)
        per_token = kv_rank + rope if mla_latent_cache else heads * (nope + rope) + heads * v_dim
        qkv_width = q_out + kv_rank + rope
    else:
        q_out, kv_out = heads * head_dim, kv_heads * head_dim
        attn = hidden * q_out + 2 * hidden * kv_out + q_out * hidden
        if cfg.get("attention_bias") or model_type == "qwen2":
            attn += q_out + 2 * kv_out
        if model_type.startswith("qwen3"):  # per-head RMSNorm on q and k
            attn += 2 * head_dim
        per_token = 2 * kv_out
        qkv_width = q_out + 2 * kv_out

    moe, experts, width, shared = _moe_layers(cfg, layers)
    total = 0
    for is_moe in moe:
        mlp = 3 * hidden * (experts * width + shared) + hidden * experts if is_moe else 3 * hidden * intermediate
        if is_moe and cfg.get("shared_expert_intermediate_size"):
            mlp += hidden  # Qwen-MoE shared-expert gate
        total += attn + mlp + 2 * hidden
    embed = vocab * hidden
    tied = bool(cfg.get("tie_word_embeddings", False))
    total += embed + (0 if tied else embed) + hidden

    active_mlp = intermediate
    if any(moe):
        active_mlp = max(intermediate, _get_int(cfg, "num_experts_per_tok", 1) * width + shared)
    name = cfg.get("_name_or_path") or cfg.get("name") or model_type or "model"
    return ModelShapes(
        name=str(name),
        num_layers=layers,
        hidden_size=hidden,
        vocab_size=vocab,
        num_parameters=total,
        layer_kv_elements=(per_token,) * layers,
        layer_windows=_windows(cfg, layers),
        activation_elements=2 * hidden + qkv_width + 2 * active_mlp,
    )
