"""Reference sampler: Infinite Sampling on a real ``transformers`` causal LM, consuming the plans and
running the simulator's policies (needs the ``sampler`` extra: torch, transformers).

Public names: ``InfiniteSampler``, ``SampleResult``, ``StepRecord``, ``SAMPLER_POLICIES``,
``model_memory``, ``SamplingParams``, ``completion_seed``. Heavy modules import lazily, so
``lengthsched --help`` does not import torch.
"""

from __future__ import annotations

from lengthsched.lazy import lazy_getattr

__all__ = ["InfiniteSampler", "SampleResult", "StepRecord", "SAMPLER_POLICIES", "SamplingParams",
           "completion_seed", "model_memory"]

_WHERE = {"InfiniteSampler": "core", "SampleResult": "core", "StepRecord": "core", "SAMPLER_POLICIES": "core",
          "model_memory": "core", "SamplingParams": "sampling", "completion_seed": "sampling"}


__getattr__ = lazy_getattr(__name__, _WHERE)
