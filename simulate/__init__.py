"""simulate: a discrete-event simulator of group sampling policies (docs/model.md section 4).

``run_group(lengths, policy, ...)`` simulates one group; ``run_batch`` several groups sharing a
budget; ``run_rollout`` an RL rollout step (many groups on several engine replicas);
:data:`POLICIES` names every policy. Workloads (real CASTILLO groups, single-length traces with a
group model, JSON-lines trace files) are in :mod:`simulate.workloads`; the comparison report behind
``lengthsched simulate`` in :mod:`simulate.report`.
"""

# The runtime (engine, policies, registry) lives in lengthsched.runtime; re-exported here.
from lengthsched.runtime import POLICIES, Engine, Problem, SimPolicy, SimulationError, Timeline, make_policy

from .rollout import ROUTERS, RolloutResult, route, run_rollout
from .run import SimResult, lower_bound, retained_kv_curve, run_batch, run_group

#: The recommended policy (a name in ``lengthsched.runtime.POLICIES``, usable by ``run_group``,
#: ``run_batch`` and ``run_rollout``): the one that is never slower than vLLM FCFS with verl's routing
#: in modelled seconds over the rollout grid of docs/benchmarks.md ("Rollout steps": 48 settings; 3.3%
#: faster on average, up to 5x where prompts would crowd the pools) and runs where that baseline
#: cannot. It misses the issue's goal of 10% on average: see docs/benchmarks.md.
DEFAULT_POLICY = "placed_adaptive"

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
    "DEFAULT_POLICY",
    "RolloutResult",
    "ROUTERS",
    "route",
    "retained_kv_curve",
]
