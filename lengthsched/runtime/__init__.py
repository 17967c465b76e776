"""The decide / execute / account runtime shared by the simulator and the reference sampler.

- :class:`Engine`: time and memory in tokens and decode steps, driven by a public stepping API
  (``start``, ``decide``, ``next_event``, ``advance`` / ``step``, ``finish``);
- the policies (:mod:`.policies`, :mod:`.baselines`) and the one registry :data:`POLICIES`
  (name -> :class:`PolicySpec`, with what each policy supports);
- :func:`kv_budget_tokens`: bytes at the edges, KV tokens inside.

numpy only, like the rest of ``lengthsched``.
"""

from .baselines import SGLangLike, VLLMLike
from .budget import decode_batch, kv_budget_tokens
from .engine import Engine, SimulationError, StepLog, Timeline
from .policies import Problem, SimPolicy, overflow_wakeup, slot_cap
from .registry import POLICIES, PolicySpec, make_policy, policy_names

__all__ = [
    "Engine",
    "POLICIES",
    "PolicySpec",
    "Problem",
    "SGLangLike",
    "SimPolicy",
    "SimulationError",
    "StepLog",
    "Timeline",
    "VLLMLike",
    "decode_batch",
    "kv_budget_tokens",
    "make_policy",
    "overflow_wakeup",
    "policy_names",
    "slot_cap",
]
