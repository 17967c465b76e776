"""Train and use the BERT-family length predictor of ``lengthsched`` (needs the ``train`` extra:
torch, transformers, datasets, accelerate, scikit-learn, scipy).

``BertLengthPredictor.from_pretrained(dir)`` implements ``lengthsched.predictor.LengthPredictor``;
``train(TrainOptions(...))`` / ``lengthsched train`` fine-tune one; ``predictor_training.evaluate``
scores predictors against the baselines and the noise ceiling. Heavy modules import lazily.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BertLengthPredictor", "TrainOptions", "train", "DataSpec", "LabelConfig", "load_source",
           "load_sources"]

_WHERE = {"BertLengthPredictor": "predictor", "TrainOptions": "options", "train": "training", "DataSpec": "data",
          "LabelConfig": "data", "load_source": "data", "load_sources": "data"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module 'predictor_training' has no attribute {name!r}")
