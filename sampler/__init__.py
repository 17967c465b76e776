"""Reference sampler: Infinite Sampling on a real ``transformers`` causal LM, consuming the plans and
running the simulator's policies (needs the ``sampler`` extra: torch, transformers)."""

from .core import SAMPLER_POLICIES, InfiniteSampler, SampleResult, StepRecord, model_memory
from .sampling import SamplingParams, completion_seed

__all__ = ["InfiniteSampler", "SampleResult", "StepRecord", "SAMPLER_POLICIES", "SamplingParams",
           "completion_seed", "model_memory"]
