"""The memory model against hand-computed values (docs/model.md section 3)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import unit_memory
from hypothesis import given
from hypothesis import strategies as st

from lengthsched import BudgetTooSmall, ConfigError, InvalidArgument, KVCompression, ModelMemory, parse_bytes
from lengthsched.hfconfig import PRESET_DIR, preset_names

QWEN3_1_7B_PARAMS = (
    151936 * 2048  # embeddings, tied with the LM head
    + 28 * (
        2048 * 2048 + 2 * 2048 * 1024 + 2048 * 2048  # q, k, v, o
        + 2 * 128  # q_norm, k_norm
        + 3 * 2048 * 6144  # gate, up, down
        + 2 * 2048  # two RMSNorms
    )
    + 2048  # final norm
)


def qwen3(**options) -> ModelMemory:
    return ModelMemory.from_preset("qwen3-1.7b", **options)


def test_qwen3_1_7b_hand_computed():
    m = qwen3()
    assert m.kv_bytes_per_token == 114_688 == 2 * 28 * 8 * 128 * 2
    assert m.kv_bytes(1000) == 114_688_000
    assert m.num_parameters == QWEN3_1_7B_PARAMS == 1_720_574_976
    assert m.weights_bytes == 2 * QWEN3_1_7B_PARAMS
    # fp32 logits + bf16 (2 hidden + q + k + v + 2 intermediate)
    assert m.activation_bytes_per_sequence == 4 * 151936 + 2 * (2 * 2048 + 2048 + 2 * 1024 + 2 * 6144)
    assert m.activation_bytes(8) == 8 * m.activation_bytes_per_sequence


def test_dtypes_scale_weights_and_kv():
    assert qwen3(kv_dtype="fp8").kv_bytes_per_token == 57_344
    assert qwen3(dtype="float32").kv_bytes_per_token == 229_376
    assert qwen3(dtype="int4", kv_dtype="bf16").weights_bytes == QWEN3_1_7B_PARAMS // 2
    with pytest.raises(InvalidArgument, match="argument 'kv_dtype': got 'fp9'"):
        qwen3(kv_dtype="fp9")


@pytest.mark.parametrize(
    "preset,kv_bytes,params_billion",
    [
        ("llama-3.1-8b", 2 * 32 * 8 * 128 * 2, 8.03),
        ("qwen3-8b", 2 * 36 * 8 * 128 * 2, 8.19),
        ("qwen2.5-7b-instruct", 2 * 28 * 4 * 128 * 2, 7.62),
        ("mistral-7b-v0.1", 2 * 32 * 8 * 128 * 2, 7.24),
        ("deepseek-v3", 61 * (512 + 64) * 2, 671.0),  # MLA latent; published 671B (without MTP)
        ("deepseek-v2-lite", 27 * (512 + 64) * 2, 15.7),  # published 15.7B
    ],
)
def test_presets_match_published_sizes(preset, kv_bytes, params_billion):
    m = ModelMemory.from_preset(preset)
    assert m.kv_bytes_per_token == kv_bytes
    assert m.num_parameters / 1e9 == pytest.approx(params_billion, rel=2e-3)


def test_mla_without_latent_cache_holds_full_heads():
    m = ModelMemory.from_preset("deepseek-v3", mla_latent_cache=False)
    assert m.kv_bytes_per_token == 61 * 128 * ((128 + 64) + 128) * 2


def test_sliding_window_caps_kv():
    m = ModelMemory.from_preset("mistral-7b-v0.1")
    assert m.kv_bytes(100) == 100 * m.kv_bytes_per_token
    assert m.kv_bytes(5000) == 4096 * m.kv_bytes_per_token
    assert m.describe()["sliding_windows"] == [4096]


def tiny_config(**extra):
    cfg = dict(model_type="llama", num_hidden_layers=4, hidden_size=64, num_attention_heads=4,
               num_key_value_heads=2, intermediate_size=128, vocab_size=100)
    cfg.update(extra)
    return cfg


def test_layer_types_mix_windowed_and_full_layers():
    cfg = tiny_config(sliding_window=8, layer_types=["sliding_attention", "full_attention"] * 2)
    m = ModelMemory.from_hf_config(cfg)
    per_layer = 2 * 2 * 16 * 2
    assert m.kv_bytes(5) == 4 * per_layer * 5
    assert m.kv_bytes(20) == 2 * per_layer * 8 + 2 * per_layer * 20


def test_qwen2_max_window_layers_and_gemma2_pattern():
    qwen2 = ModelMemory.from_hf_config(tiny_config(model_type="qwen2", sliding_window=8,
                                                   use_sliding_window=True, max_window_layers=3))
    assert qwen2.layer_windows == (None, None, None, 8)
    gemma2 = ModelMemory.from_hf_config(tiny_config(model_type="gemma2", sliding_window=8))
    assert gemma2.layer_windows == (8, None, 8, None)
    off = ModelMemory.from_hf_config(tiny_config(sliding_window=8, use_sliding_window=False))
    assert off.layer_windows == (None,) * 4


def test_config_from_path_directory_and_text_config(tmp_path):
    cfg = tiny_config()
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llava", "text_config": cfg}))
    a = ModelMemory.from_hf_config(tmp_path)
    b = ModelMemory.from_hf_config(tmp_path / "config.json")
    c = ModelMemory.from_hf_config(cfg)
    assert a.kv_bytes_per_token == b.kv_bytes_per_token == c.kv_bytes_per_token == 4 * 2 * 2 * 16 * 2


@pytest.mark.parametrize(
    "cfg,message",
    [
        ({"hidden_size": 64}, "required field 'num_hidden_layers'"),
        (tiny_config(num_hidden_layers=-2), "field 'num_hidden_layers' is -2"),
        (tiny_config(hidden_size="64"), "field 'hidden_size' is '64'"),
        (tiny_config(layer_types=["full_attention"]), "field 'layer_types'"),
        (tiny_config(kv_lora_rank=16), "required field 'qk_rope_head_dim'"),
    ],
)
def test_malformed_config_names_the_field(cfg, message):
    with pytest.raises(ConfigError, match=message):
        ModelMemory.from_hf_config(cfg)


def test_unreadable_config_paths(tmp_path):
    with pytest.raises(ConfigError, match="is not a config.json"):
        ModelMemory.from_hf_config(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read"):
        ModelMemory.from_hf_config(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        ModelMemory.from_hf_config(bad)
    with pytest.raises(ConfigError, match="argument 'config'"):
        ModelMemory.from_hf_config(42)
    with pytest.raises(InvalidArgument, match="argument 'model': got 'gpt-9'"):
        ModelMemory.from_preset("gpt-9")


def test_block_rounding_and_prompt_sharing():
    m = qwen3(block_size=16)
    c = m.kv_bytes_per_token
    assert m.kv_bytes(17) == 32 * c
    # Shared prompt of 20 tokens: one whole block shared, the 4-token tail copied per sequence.
    assert m.prompt_kv_bytes(20) == 16 * c
    assert m.sequence_kv_bytes(1, 20) == 16 * c
    assert m.sequence_kv_bytes(13, 20) == 32 * c
    copied = qwen3(prompt_kv="copied")
    assert copied.prompt_kv_bytes(20) == 0
    assert copied.sequence_kv_bytes(5, 20) == 25 * c


@given(prompt=st.integers(0, 500), generated=st.lists(st.integers(0, 300), min_size=1, max_size=8))
def test_group_kv_matches_model_md_formula(prompt, generated):
    m = qwen3()
    c = m.kv_bytes_per_token
    assert m.group_kv_bytes(generated, prompt) == c * prompt + c * sum(generated)
    copied = qwen3(prompt_kv="copied")
    assert copied.group_kv_bytes(generated, prompt) == c * len(generated) * prompt + c * sum(generated)


def test_compression_caps_retained_tokens():
    comp = KVCompression(budget=4, interval=2)
    assert [comp.retained(n) for n in range(11)] == [0, 1, 2, 3, 4, 5, 6, 5, 6, 5, 6]
    m = unit_memory(compression=comp)
    assert m.sequence_kv_bytes(1000, 0) <= comp.max_retained
    assert m.sequence_kv_bytes(np.arange(8), 0).tolist() == [0, 1, 2, 3, 4, 5, 6, 5]
    with pytest.raises(InvalidArgument, match="argument 'interval'"):
        KVCompression(budget=4, interval=0)


def test_max_slots_is_the_exact_inverse():
    m = qwen3()
    prompt, max_new, g = 300, 2048, 7
    per_seq = m.activation_bytes_per_sequence + max_new * m.kv_bytes_per_token
    budget = m.weights_bytes + prompt * m.kv_bytes_per_token + g * per_seq
    assert m.max_slots(budget, prompt_tokens=prompt, max_new_tokens=max_new) == g
    assert m.max_slots(budget - 1, prompt_tokens=prompt, max_new_tokens=max_new) == g - 1
    assert m.max_slots(budget, prompt_tokens=prompt, max_new_tokens=max_new // 2) > g


def test_kv_token_budget():
    m = qwen3()
    budget = m.weights_bytes + 100 * m.kv_bytes_per_token + m.activation_bytes(4) + 5000 * m.kv_bytes_per_token
    assert m.kv_token_budget(budget, prompt_tokens=100, batch=4) == 5000


def test_budget_too_small_says_what_is_needed():
    m = qwen3()
    with pytest.raises(BudgetTooSmall, match=r"argument 'budget_bytes': got 1000000; expected at least \d+ bytes"):
        m.max_slots(10**6, prompt_tokens=10, max_new_tokens=100)
    with pytest.raises(BudgetTooSmall):
        m.kv_token_budget(m.weights_bytes, prompt_tokens=0, batch=1)


def test_bad_token_counts():
    m = qwen3()
    with pytest.raises(InvalidArgument, match="argument 'tokens': got -1"):
        m.kv_bytes(-1)
    with pytest.raises(InvalidArgument, match="argument 'tokens'"):
        m.kv_bytes([1, -5])
    with pytest.raises(InvalidArgument, match="argument 'prompt_tokens'"):
        m.prompt_kv_bytes(2.5)
    with pytest.raises(InvalidArgument, match="argument 'prompt_kv'"):
        qwen3(prompt_kv="mirrored")


def test_parse_bytes():
    assert parse_bytes("10GiB") == 10 * 2**30
    assert parse_bytes("500 MB") == 500 * 10**6
    assert parse_bytes("1.5e9") == 1_500_000_000
    assert parse_bytes(123) == 123
    for bad in ("ten", "5 parsecs", "0", "-3GB"):
        with pytest.raises(InvalidArgument, match="argument 'budget'"):
            parse_bytes(bad)


def test_every_preset_loads():
    assert len(preset_names()) >= 6
    for name in preset_names():
        cfg = json.loads((PRESET_DIR / f"{name}.json").read_text())
        assert cfg["_source"].startswith("https://huggingface.co/")
        assert ModelMemory.from_preset(name).kv_bytes_per_token > 0


def test_compression_parses_from_the_command_lines_text():
    assert KVCompression.parse("512:32") == KVCompression(512, 32)
    for bad in ("512", "a:b", "0:8", "8:-1", ""):
        with pytest.raises(InvalidArgument, match="kv_compression"):
            KVCompression.parse(bad)
    with pytest.raises(InvalidArgument, match="'cache'"):
        KVCompression.parse("1:2:3", name="cache")


def test_kv_compression_of_takes_none_a_cache_or_its_text():
    cache = KVCompression(512, 32)
    assert KVCompression.of(None) is None and KVCompression.of(cache) is cache
    assert KVCompression.of("512:32", "flag") == cache
    for bad in (544, ("512", "32"), "512"):
        with pytest.raises(InvalidArgument, match="argument 'flag'"):
            KVCompression.of(bad, "flag")
