"""Train and use the BERT-family length predictor of ``lengthsched`` (needs the ``train`` extra:
torch, transformers, datasets, accelerate, scikit-learn, scipy).

``BertLengthPredictor.from_pretrained(dir)`` implements ``lengthsched.predictor.LengthPredictor``;
``train(TrainOptions(...))`` / ``lengthsched train`` fine-tune one; ``predictor_training.evaluate``
scores predictors against the baselines and the noise ceiling. Heavy modules import lazily.
"""

from __future__ import annotations

from lengthsched.lazy import lazy_getattr

__all__ = ["BertLengthPredictor", "TrainOptions", "train", "DataSpec", "LabelConfig", "load_source",
           "load_sources"]

_WHERE = {"BertLengthPredictor": "predictor", "TrainOptions": "options", "train": "training", "DataSpec": "data",
          "LabelConfig": "data", "load_source": "data", "load_sources": "data"}


__getattr__ = lazy_getattr(__name__, _WHERE)
