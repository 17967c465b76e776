"""lengthsched: length-aware scheduling for GRPO group rollouts (the pure planning core).

Import cost and dependencies are kept to numpy: this package is meant to be imported into
rollout engines. Heavy parts (OR-Tools for exact optima, torch for the predictor and sampler)
are optional and imported lazily by the functions that need them.

Main entry points:

- :class:`ModelMemory` -- bytes of weights, activations and KV; slots that fit a budget.
- :mod:`lengthsched.partition` -- FPTAS, LPT, Karmarkar-Karp, CP-SAT exact, lower bound.
- :mod:`lengthsched.packing` -- memory-feasible micro groups (cardinality-constrained subset sum).
- :mod:`lengthsched.refill` -- runtime refill rules (SJF, LPT, FCFS, plan order).
- :func:`plan_group` -> :class:`Plan` -- the plan an engine consumes (JSON round trip).
- :mod:`lengthsched.schedule` -- decide / execute / account a plan step by step.
- :mod:`lengthsched.predictor` -- the length-predictor protocol and oracles.
- :class:`OnlineLengthPredictor` -- lengths from the prompt's finished and running siblings and its
  earlier rollout steps (:mod:`lengthsched.online`).
- :class:`FilterHistory` -- what a dynamic-sampling filter did with each prompt's groups, and the order
  that hands the likely-kept first; :class:`SelectiveRollout`, GRESO's skip of the prompts it keeps
  dropping (:mod:`lengthsched.filtering`).
"""

from . import packing, partition, refill
from .errors import BudgetTooSmall, ConfigError, InvalidArgument, LengthschedError
from .filtering import FilterHistory, SelectiveRollout, order_by_pass
from .learner import LearnerCost, LearnerShapes, learner_cost, learner_micro_batches, learner_tokens
from .memory import FreeKV, KVCompression, ModelMemory, PromptKV, parse_bytes
from .online import OnlineLengthPredictor
from .packing import MicroGroupBudget, SubsetFill, pack_micro_groups, subset_sum
from .partition import Partition
from .peaks import Policy, PolicyPeak, policy_peak
from .plan import Plan, plan_group
from .predictor import (
    ConstantLengthPredictor,
    LengthPrediction,
    LengthPredictor,
    NoisyOracleLengthPredictor,
    OracleLengthPredictor,
)
from .refill import RefillQueue, RefillRule, make_refill_queue
from .schedule import GroupScheduler, Schedule, execute, held_bytes

__version__ = "0.1.0"

__all__ = [
    "BudgetTooSmall",
    "ConfigError",
    "ConstantLengthPredictor",
    "FilterHistory",
    "FreeKV",
    "GroupScheduler",
    "InvalidArgument",
    "KVCompression",
    "LengthPrediction",
    "LengthPredictor",
    "LengthschedError",
    "MicroGroupBudget",
    "ModelMemory",
    "NoisyOracleLengthPredictor",
    "OnlineLengthPredictor",
    "OracleLengthPredictor",
    "Partition",
    "Plan",
    "Policy",
    "PolicyPeak",
    "PromptKV",
    "RefillQueue",
    "RefillRule",
    "Schedule",
    "SelectiveRollout",
    "SubsetFill",
    "execute",
    "held_bytes",
    "make_refill_queue",
    "order_by_pass",
    "pack_micro_groups",
    "packing",
    "parse_bytes",
    "learner_tokens",
    "learner_cost",
    "learner_micro_batches",
    "LearnerShapes",
    "LearnerCost",
    "partition",
    "plan_group",
    "policy_peak",
    "refill",
    "subset_sum",
]
