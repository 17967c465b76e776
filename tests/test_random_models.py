"""The Qwen3 models built from a config: the random-weight presets have the public shapes of
Qwen3-0.6B / 1.7B (checked on the config and on the meta device: nothing is allocated), a
scaled-down copy runs the sampler, and unknown names still fail with the loader's clear error."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from lengthsched.errors import InvalidArgument
from sampler import InfiniteSampler
from sampler.cli import (
    ByteTokenizer,
    load_model,
    qwen3_config,
    qwen3_from_config,
    tiny_qwen3,
)
from sampler.options import CONFIG_MODELS, RANDOM_MODELS, TINY_MODEL

# config.json of Qwen/Qwen3-0.6B and Qwen/Qwen3-1.7B
PUBLIC = {
    "random-qwen3-0.6b": {"hidden_size": 1024, "intermediate_size": 3072},
    "random-qwen3-1.7b": {"hidden_size": 2048, "intermediate_size": 6144},
}
COMMON = {"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
          "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
PARAMETERS = {"random-qwen3-0.6b": 596_049_920, "random-qwen3-1.7b": 1_720_574_976}  # "0.6B" and "1.7B", tied


def rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return params.get("rope_theta", getattr(config, "rope_theta", None))


@pytest.mark.parametrize("name", RANDOM_MODELS)
def test_presets_have_the_public_shapes(name):
    config = qwen3_config(name)
    for key, value in {**COMMON, **PUBLIC[name]}.items():
        assert getattr(config, key) == value, key
    assert rope_theta(config) == 1e6
    assert not config.use_sliding_window and set(config.layer_types) == {"full_attention"}
    assert config.eos_token_id == ByteTokenizer.eos_token_id < config.vocab_size  # byte ids are valid inputs


@pytest.mark.parametrize("name", RANDOM_MODELS)
def test_presets_build_on_the_meta_device(name):
    model = qwen3_from_config(qwen3_config(name), torch.bfloat16, "meta")  # shapes only, no memory
    assert sum(p.numel() for p in model.parameters()) == PARAMETERS[name]
    assert model.dtype == torch.bfloat16 and model.device.type == "meta" and not model.training
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.get_default_dtype() == torch.float32  # restored


def test_names_and_tiny_model():
    assert CONFIG_MODELS == (TINY_MODEL, *RANDOM_MODELS)
    model = tiny_qwen3()
    assert model.config.vocab_size == ByteTokenizer.vocab_size and model.config.num_hidden_layers == 4
    assert model.dtype == torch.float32
    again = tiny_qwen3()  # seeded
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))


def test_scaled_down_preset_runs_the_sampler():
    # the 1.7B preset with its vocabulary, heads and head_dim, but 2 layers and a narrow MLP / hidden size
    config = qwen3_config("random-qwen3-1.7b", num_hidden_layers=2, hidden_size=64, intermediate_size=64)
    model = qwen3_from_config(config, torch.bfloat16, "cpu")
    assert model.dtype == torch.bfloat16 and torch.get_default_dtype() == torch.float32
    res = InfiniteSampler(model, policy="fixed_slot", slots=2).sample_group(
        ByteTokenizer().encode("hello"), 3, max_new_tokens=6, seed=0, force_lengths=[2, 6, 4],
        stop_token_ids=[ByteTokenizer.eos_token_id])
    assert res.lengths == [2, 6, 4] and res.peak_kv_bytes == res.peak_model_kv_bytes
    assert all(0 <= t < config.vocab_size for c in res.completions for t in c)


def test_unknown_names_fail_clearly(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read at import: no network wait
    with pytest.raises(InvalidArgument, match="without network access pass a local model directory.*random-qwen3-1.7b"):
        load_model("random-qwen3-7b", "float32", "cpu")
    with pytest.raises(InvalidArgument, match="random-qwen3-0.6b"):
        qwen3_config("qwen3-0.6b")
