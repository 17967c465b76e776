"""simulate: a discrete-event simulator of group sampling policies (docs/model.md section 4).

``run_group(lengths, policy, ...)`` simulates one group; ``run_batch`` several groups sharing a
budget; ``run_rollout`` an RL rollout step (many groups on several engine replicas); :data:`POLICIES` names every policy. Workloads (real CASTILLO groups, single-length traces
with a group model, JSON-lines trace files) are in :mod:`simulate.workloads`; the comparison
report behind ``lengthsched simulate`` in :mod:`simulate.report`.
"""

# The runtime (engine, policies, registry) lives in lengthsched.runtime; re-exported here.
from lengthsched.runtime import POLICIES, Engine, Problem, SimPolicy, SimulationError, Timeline, make_policy
from .rollout import ROUTERS, RolloutResult, route, run_rollout
from .run import SimResult, lower_bound, retained_kv_curve, run_batch, run_group

__all__ = [
    "Engine",
    "POLICIES",
    "Problem",
    "SimPolicy",
    "SimResult",
    "SimulationError",
    "Timeline",
    "lower_bound",
    "make_policy",
    "run_batch",
    "run_group",
    "run_rollout",
    "RolloutResult",
    "ROUTERS",
    "route",
    "retained_kv_curve",
]
