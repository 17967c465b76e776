"""Shared fixtures and the exact oracles of the planning tests."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from lengthsched import ModelMemory

settings.register_profile(
    "ci", max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("thorough", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def unit_memory(**changes) -> ModelMemory:
    """One byte per KV token, no weights, no activations: bytes == tokens (docs/model.md examples)."""
    base = dict(name="unit", layer_kv_bytes=(1,), layer_windows=(None,), weights_bytes=0,
                activation_bytes_per_sequence=0)
    base.update(changes)
    return ModelMemory(**base)


@pytest.fixture
def unit() -> ModelMemory:
    return unit_memory()


def subset_sum_optimum(sizes, capacity: int, max_items: int) -> int:
    """Best fill of at most ``max_items`` items within ``capacity``, proven by CP-SAT."""
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    x = [model.new_bool_var(f"x{i}") for i in range(len(sizes))]
    fill = sum(int(s) * v for s, v in zip(sizes, x))
    model.add(fill <= capacity)
    model.add(sum(x) <= max_items)
    model.maximize(fill)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 20
    assert solver.solve(model) == cp_model.OPTIMAL
    return int(round(solver.objective_value))


def lengths_array(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)
