"""The memory model of docs/model.md section 3: ``M = W + A(b) + KV``.

All sizes are bytes and all lengths are tokens. One :class:`ModelMemory` describes a model as an
engine deploys it (weight and KV dtypes, block size, whether the prompt KV is shared, when a
finished sequence's KV is freed, an optional compressed-KV budget) and answers both the forward
questions (bytes of a KV state, of a policy's peak) and the inverse ones (how many slots or KV
tokens fit a budget).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from fractions import Fraction
from typing import Any

import numpy as np

from .errors import BudgetTooSmall, InvalidArgument, LengthschedError, check_int
from .hfconfig import PRESET_DIR, load_config, preset_names, read_shapes

__all__ = ["ModelMemory", "KVCompression", "PromptKV", "FreeKV", "DTYPE_BYTES", "parse_bytes", "ROLLOUT_DECODE_ROWS",
           "rollout_pool_tokens", "held_token_steps"]

DTYPE_BYTES: dict[str, Fraction] = {
    "float64": Fraction(8), "fp64": Fraction(8),  # CPU reference runs (the sampler's equality tests)
    "float32": Fraction(4), "fp32": Fraction(4),
    "bfloat16": Fraction(2), "bf16": Fraction(2), "float16": Fraction(2), "fp16": Fraction(2),
    "float8": Fraction(1), "fp8": Fraction(1), "float8_e4m3fn": Fraction(1), "float8_e5m2": Fraction(1),
    "int8": Fraction(1), "int4": Fraction(1, 2),
}


def _dtype_bytes(name: str, value: Any) -> Fraction:
    if not isinstance(value, str) or value.lower() not in DTYPE_BYTES:
        raise InvalidArgument(name, value, "one of " + ", ".join(sorted(DTYPE_BYTES)))
    return DTYPE_BYTES[value.lower()]


class PromptKV(str, Enum):
    """How the prompt KV is held for the G completions of a group."""

    SHARED = "shared"  # once (engines share only whole prompt blocks; the partial one is copied)
    COPIED = "copied"  # once per live sequence


class FreeKV(str, Enum):
    """When a finished sequence's KV is released."""

    FINISH = "finish"  # right after its last step (custom sampler, paged engines)
    BATCH_END = "batch_end"  # when its whole padded batch ends (``generate`` with padding)


def _enum(enum: type[Enum], name: str, value: Any) -> Any:
    try:
        return enum(value)
    except ValueError:
        raise InvalidArgument(name, value, "one of " + ", ".join(repr(e.value) for e in enum)) from None


@dataclass(frozen=True)
class KVCompression:
    """A compressed KV cache (Sparse-RL / R-KV style), applied to each sequence's generated tokens.

    The cache grows to ``budget + interval`` retained tokens, is then compressed back to ``budget``,
    and grows again; so at most ``budget + interval`` generated tokens are held. The shared prompt
    KV is not compressed.
    """

    budget: int
    interval: int

    def __post_init__(self) -> None:
        check_int("budget", self.budget, minimum=1)
        check_int("interval", self.interval, minimum=1)

    @property
    def max_retained(self) -> int:
        """Most generated tokens one sequence ever holds (tokens)."""
        return self.budget + self.interval

    @classmethod
    def parse(cls, text: str, name: str = "kv_compression") -> KVCompression:
        """``"512:32"`` -> ``KVCompression(budget=512, interval=32)`` (the command lines' ``--kv-compression``);
        a bad text raises :class:`InvalidArgument` naming ``name``."""
        budget, sep, interval = str(text).partition(":")
        try:
            if not sep:
                raise ValueError
            return cls(int(budget), int(interval))
        except (ValueError, InvalidArgument):
            raise InvalidArgument(name, text, "BUDGET:INTERVAL, two positive token counts (e.g. 512:32)") from None

    @classmethod
    def of(cls, value: KVCompression | str | None, name: str = "kv_compression") -> KVCompression | None:
        """A cache from what a caller or a config gave: None (a full cache) as None, a :class:`KVCompression`
        as it is, a text by :meth:`parse`; anything else raises :class:`InvalidArgument` naming ``name``."""
        if value is None or isinstance(value, cls):
            return value
        if not isinstance(value, str):
            raise InvalidArgument(name, value, "a lengthsched.KVCompression, 'BUDGET:INTERVAL' or None (a full cache)")
        return cls.parse(value, name)

    def retained(self, generated: Any) -> Any:
        """Generated tokens held after ``generated`` tokens were produced (scalar or array)."""
        n = np.asarray(generated, dtype=np.int64)
        over = n > self.max_retained
        out = np.where(over, self.budget + (n - self.budget - 1) % self.interval + 1, n)
        return int(out) if out.ndim == 0 else out


def held_token_steps(lengths: Any, kv_cap: int | None = None) -> Any:
    """KV token-steps a completion of each of ``lengths`` holds of its own tokens over its steps: the
    sum over a = 1..l of min(a, ``kv_cap``) (l (l + 1) / 2 without a cap; ``kv_cap``: a compressed
    cache's most, ``KVCompression.max_retained``). The KV its rows read of their own tokens is
    ``held_token_steps(l - 1, kv_cap)`` (the a-th token reads the a - 1 before it). Integer arrays give
    integers, float arrays floats."""
    n = np.asarray(lengths)
    half = (lambda x: x // 2) if np.issubdtype(n.dtype, np.integer) else (lambda x: x / 2)
    area = half(n * (n + 1))
    if kv_cap is None:
        return area
    return np.where(n > kv_cap, half(kv_cap * (kv_cap + 1)) + (n - kv_cap) * kv_cap, area)


@dataclass(frozen=True)
class ModelMemory:
    """Bytes of weights, decode activations and KV of one model as an engine holds it.

    Build it with :meth:`from_hf_config` (or :meth:`from_preset`); the fields are the derived
    per-layer sizes so that exotic models can also be described by hand.

    Fields: ``layer_kv_bytes`` bytes cached per token in each layer; ``layer_windows`` sliding
    window of each layer in tokens (None = full attention); ``weights_bytes`` W;
    ``activation_bytes_per_sequence`` the per-sequence slope of A(b): fp32 logits over the
    vocabulary plus the widest per-layer decode activations (an estimate; override it when you
    have measured it); ``block_size`` tokens per KV block (vLLM 16, SGLang 1).
    """

    name: str
    layer_kv_bytes: tuple[int, ...]
    layer_windows: tuple[int | None, ...]
    weights_bytes: int
    activation_bytes_per_sequence: int
    num_parameters: int = 0
    dtype: str = "bfloat16"
    kv_dtype: str = "bfloat16"
    block_size: int = 1
    prompt_kv: PromptKV = PromptKV.SHARED
    free_kv: FreeKV = FreeKV.FINISH
    compression: KVCompression | None = None
    _groups: tuple[tuple[int | None, int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        layers = tuple(check_int("layer_kv_bytes", b, minimum=1) for b in self.layer_kv_bytes)
        if not layers or len(self.layer_windows) != len(layers):
            raise InvalidArgument(
                "layer_windows", self.layer_windows, f"one window (or None) per layer, {len(layers)} layers"
            )
        windows = tuple(None if w is None else check_int("layer_windows", w, minimum=1) for w in self.layer_windows)
        for name in ("weights_bytes", "activation_bytes_per_sequence", "num_parameters"):
            check_int(name, getattr(self, name), minimum=0)
        check_int("block_size", self.block_size, minimum=1)
        _dtype_bytes("dtype", self.dtype)
        _dtype_bytes("kv_dtype", self.kv_dtype)
        if self.compression is not None and not isinstance(self.compression, KVCompression):
            raise InvalidArgument("compression", self.compression, "a KVCompression or None")
        object.__setattr__(self, "prompt_kv", _enum(PromptKV, "prompt_kv", self.prompt_kv))
        object.__setattr__(self, "free_kv", _enum(FreeKV, "free_kv", self.free_kv))
        groups: dict[int | None, int] = {}
        for b, w in zip(layers, windows):
            groups[w] = groups.get(w, 0) + b
        object.__setattr__(self, "_groups", tuple(sorted(groups.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))))

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_hf_config(
        cls,
        config: str | os.PathLike | Mapping[str, Any],
        dtype: str = "bfloat16",
        *,
        kv_dtype: str | None = None,
        block_size: int = 1,
        prompt_kv: str = "shared",
        free_kv: str = "finish",
        compression: KVCompression | None = None,
        mla_latent_cache: bool = True,
        weights_bytes: int | None = None,
        activation_bytes_per_sequence: int | None = None,
    ) -> ModelMemory:
        """Build the memory model of a Hugging Face causal LM from its ``config.json``.

        ``config``: a dict, a path to ``config.json`` or a model directory. ``dtype``: weights and
        activations; ``kv_dtype``: the KV cache (defaults to ``dtype``; ``fp8``/``int8`` = 1 byte,
        quantisation scales not counted). ``weights_bytes`` overrides the parameter count x dtype.
        """
        shapes = read_shapes(load_config(config), mla_latent_cache=mla_latent_cache)
        w_bytes = _dtype_bytes("dtype", dtype)
        kv_bytes = _dtype_bytes("kv_dtype", kv_dtype or dtype)
        return cls(
            name=shapes.name,
            layer_kv_bytes=tuple(math.ceil(e * kv_bytes) for e in shapes.layer_kv_elements),
            layer_windows=shapes.layer_windows,
            weights_bytes=math.ceil(shapes.num_parameters * w_bytes) if weights_bytes is None else weights_bytes,
            activation_bytes_per_sequence=(
                4 * shapes.vocab_size + math.ceil(shapes.activation_elements * w_bytes)
                if activation_bytes_per_sequence is None
                else activation_bytes_per_sequence
            ),
            num_parameters=shapes.num_parameters,
            dtype=dtype,
            kv_dtype=kv_dtype or dtype,
            block_size=block_size,
            prompt_kv=prompt_kv,
            free_kv=free_kv,
            compression=compression,
        )

    @classmethod
    def from_preset(cls, name: str, dtype: str = "bfloat16", **options: Any) -> ModelMemory:
        """Like :meth:`from_hf_config` for a config bundled in ``lengthsched/presets``."""
        if name not in preset_names():
            raise InvalidArgument("model", name,
                                  "an existing config.json path or a preset: " + ", ".join(preset_names()))
        return cls.from_hf_config(PRESET_DIR / f"{name}.json", dtype, **options)

    @classmethod
    def from_name(cls, model: str, dtype: str = "bfloat16", **options: Any) -> ModelMemory:
        """From a ``config.json`` path, a model directory, or a bundled preset name."""
        if isinstance(model, (str, os.PathLike)) and os.path.exists(model):
            return cls.from_hf_config(model, dtype, **options)
        return cls.from_preset(model, dtype, **options)

    def replace(self, **changes: Any) -> ModelMemory:
        """A copy with some fields changed (validated like the constructor)."""
        return dataclasses.replace(self, **changes)

    # ----------------------------------------------------------------- forward questions
    @property
    def kv_bytes_per_token(self) -> int:
        """c: bytes one token occupies in the KV cache over all layers (bytes)."""
        return sum(b for _, b in self._groups)

    def _own_bytes(self, tokens: np.ndarray) -> np.ndarray:
        """Bytes of a sequence that holds ``tokens`` tokens of its own (block rounded, windowed)."""
        total = np.zeros(tokens.shape, dtype=np.int64)
        bsz = self.block_size
        for window, per_token in self._groups:
            held = tokens if window is None else np.minimum(tokens, window)
            total += per_token * (-(-held // bsz) * bsz)
        return total

    def kv_bytes(self, tokens: Any) -> Any:
        """Bytes one sequence holds for ``tokens`` cached tokens (int or array of ints).

        Rounded up to whole blocks; sliding-window layers hold at most their window.
        """
        n = _tokens("tokens", tokens)
        out = self._own_bytes(n)
        return int(out) if out.ndim == 0 else out

    def prompt_kv_bytes(self, prompt_tokens: int) -> int:
        """Bytes of prompt KV held once for the whole group (bytes).

        Shared prompt: its whole blocks (the partial last block is copied into each sequence, see
        :meth:`sequence_kv_bytes`). Copied prompt: 0 here, the copies are per sequence.
        """
        p = check_int("prompt_tokens", prompt_tokens, minimum=0)
        if self.prompt_kv is PromptKV.COPIED:
            return 0
        return int(self._own_bytes(np.asarray(p - p % self.block_size, dtype=np.int64)))

    def sequence_kv_bytes(self, generated: Any, prompt_tokens: int) -> Any:
        """Bytes one live sequence holds on its own after generating ``generated`` tokens.

        Its generated tokens (capped by the compression budget if any), plus its own copy of the
        prompt (copied mode) or of the prompt's partial last block (shared mode, block size > 1).
        """
        n = _tokens("generated", generated)
        p = check_int("prompt_tokens", prompt_tokens, minimum=0)
        if self.compression is not None:
            n = np.asarray(self.compression.retained(n), dtype=np.int64)
        prefix = p if self.prompt_kv is PromptKV.COPIED else p % self.block_size
        out = self._own_bytes(n + prefix)
        return int(out) if out.ndim == 0 else out

    def group_kv_bytes(self, generated: Any, prompt_tokens: int) -> int:
        """KV bytes of a group whose live sequences have generated ``generated`` tokens each."""
        seqs = np.atleast_1d(self.sequence_kv_bytes(generated, prompt_tokens))
        return self.prompt_kv_bytes(prompt_tokens) + int(seqs.sum())

    def activation_bytes(self, batch: int) -> int:
        """A(b): decode workspace of a batch of ``batch`` sequences (bytes, estimate)."""
        return check_int("batch", batch, minimum=0) * self.activation_bytes_per_sequence

    def total_bytes(self, kv_bytes: int, batch: int) -> int:
        """M = W + A(batch) + kv_bytes (bytes)."""
        return self.weights_bytes + self.activation_bytes(batch) + check_int("kv_bytes", kv_bytes, minimum=0)

    def reservation_bytes(self, tokens: Any, prompt_tokens: int) -> Any:
        """Bytes one sequence costs when ``tokens`` generated tokens are reserved for it.

        Its KV at that length plus its share of the activation workspace; this is the size the
        planner packs into a budget.
        """
        return self.sequence_kv_bytes(tokens, prompt_tokens) + self.activation_bytes_per_sequence

    def peak(self, policy: str, lengths: Any, **kwargs: Any) -> PolicyPeak:  # noqa: F821
        """Peak memory of a sampling policy of docs/model.md section 4; see :func:`lengthsched.peaks.policy_peak`."""
        from .peaks import policy_peak

        return policy_peak(self, policy, lengths, **kwargs)

    # ----------------------------------------------------------------- inverse questions
    def free_bytes(self, budget_bytes: int, prompt_tokens: int) -> int:
        """Bytes of a budget left for sequences once weights and the shared prompt are held."""
        budget = check_int("budget_bytes", budget_bytes, minimum=1)
        return budget - self.weights_bytes - self.prompt_kv_bytes(prompt_tokens)

    def max_slots(self, budget_bytes: int, *, prompt_tokens: int, max_new_tokens: int) -> int:
        """Most sequences that decode together in ``budget_bytes`` when each may reach ``max_new_tokens``.

        Raises :class:`BudgetTooSmall` when not even one fits.
        """
        check_int("max_new_tokens", max_new_tokens, minimum=1)
        per_seq = int(self.reservation_bytes(max_new_tokens, prompt_tokens))
        free = self.free_bytes(budget_bytes, prompt_tokens)
        if free < per_seq:
            self._too_small(budget_bytes, prompt_tokens, per_seq, f"one sequence of {max_new_tokens} tokens")
        return free // per_seq

    def kv_token_budget(self, budget_bytes: int, *, prompt_tokens: int, batch: int) -> int:
        """T: KV tokens (beyond the shared prompt, c bytes each) a budget holds next to a batch of ``batch``."""
        check_int("batch", batch, minimum=1)
        room = self.free_bytes(budget_bytes, prompt_tokens) - self.activation_bytes(batch)
        c = self.kv_bytes_per_token
        if room < c:
            self._too_small(budget_bytes, prompt_tokens, self.activation_bytes(batch) + c, "one KV token")
        return room // c

    def _too_small(self, budget: int, prompt_tokens: int, need: int, what: str) -> None:
        fixed = self.weights_bytes + self.prompt_kv_bytes(prompt_tokens)
        raise BudgetTooSmall(
            "budget_bytes",
            budget,
            f"at least {fixed + need} bytes = weights {self.weights_bytes} + shared prompt KV "
            f"{fixed - self.weights_bytes} + {need} for {what} ({self.name})",
        )

    def describe(self) -> dict:
        """A JSON-ready summary (what the CLI prints)."""
        return {
            "name": self.name,
            "num_parameters": self.num_parameters,
            "weights_bytes": self.weights_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "activation_bytes_per_sequence": self.activation_bytes_per_sequence,
            "dtype": self.dtype,
            "kv_dtype": self.kv_dtype,
            "block_size": self.block_size,
            "prompt_kv": self.prompt_kv.value,
            "free_kv": self.free_kv.value,
            "sliding_windows": sorted({w for w in self.layer_windows if w is not None}),
            "compression": None if self.compression is None else dataclasses.asdict(self.compression),
        }


def _tokens(name: str, value: Any) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype == bool or arr.dtype.kind not in "iu" or (arr.size and arr.min() < 0):
        if arr.ndim == 0:
            check_int(name, value, minimum=0)  # raises with the scalar in the message
            return np.asarray(int(value), dtype=np.int64)
        raise InvalidArgument(name, value, "integers >= 0 (tokens)")
    return arr.astype(np.int64)


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str | int, name: str = "budget") -> int:
    """Parse ``"10GiB"``, ``"512 MB"``, ``"1.5e9"`` or an int into bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        return check_int(name, text, minimum=1)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise InvalidArgument(name, text, "a byte count such as 24GiB, 500MB or 1e9")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value < 1:
        raise InvalidArgument(name, text, "a byte count >= 1")
    return int(value)


#: Decode rows whose activations an engine replica of a rollout step keeps beside its KV pool (an engine sizes
#: its activation memory for a batch of decode rows; the simulator's rollout steps and ``lengthsched
#: plan-rollout --budget`` keep 256 rows' worth, verl's example config allows 1024 running requests).
ROLLOUT_DECODE_ROWS = 256


def rollout_pool_tokens(memory: ModelMemory, budget_bytes: int, decode_rows: int = ROLLOUT_DECODE_ROWS,
                        given: Any = None) -> int:
    """KV tokens of one engine replica's pool in a rollout step (prompts are held inside it): its memory
    ``budget_bytes`` less the weights and the activations of ``decode_rows`` decode rows. A memory too
    small for a pool raises :class:`InvalidArgument` naming ``budget`` (shown as ``given``, e.g. the
    ``--budget`` the user typed)."""
    try:
        return memory.kv_token_budget(budget_bytes, prompt_tokens=0, batch=decode_rows)
    except LengthschedError as exc:
        raise InvalidArgument("budget", budget_bytes if given is None else given,
                              f"room for {memory.name}'s weights, the activations of {decode_rows} decode rows "
                              f"and a KV pool ({exc})") from None
