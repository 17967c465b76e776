"""Shared fixtures, the exact oracles of the planning tests, the Hypothesis profiles and the markers.

Markers (registered in pyproject.toml; ``--strict-markers`` rejects any other) are assigned here, by
what a test does, so that test bodies stay as they are:

- ``torch``: needs PyTorch / transformers (a model, a tokenizer, the predictor pipeline, the
  sampler). Found from the source: a module that imports (or ``importorskip``) torch, transformers,
  trl or datasets at module level, or a test (or a helper or fixture of its module it uses) that does;
  plus :data:`TORCH_TESTS`, tests that reach torch through a spawned script or the CLI.
- ``subprocess``: spawns a process (a CLI entry point, a benchmark, a shell block of the docs).
  Found from the source: the test, or a helper or fixture of its module it uses, calls ``subprocess``.
- ``slow``: takes more than about a second on two cores (measured with ``--durations``): the
  :data:`SLOW_MODULES` and :data:`SLOW_TESTS` lists.

The fast lane (README) is ``pytest -m "not slow" --hypothesis-profile=dev``; CI runs everything with
the "ci" profile (the default here).
"""

from __future__ import annotations

import ast
import functools
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from lengthsched import ModelMemory

settings.register_profile(
    "ci", max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("thorough", max_examples=1000, deadline=None)
# The fast lane's profile: a quick look at every property, not CI's search (select it with
# --hypothesis-profile=dev or HYPOTHESIS_PROFILE=dev).
settings.register_profile(
    "dev", max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

MARKERS = ("slow", "torch", "subprocess")

#: Whole modules that are slow (every test in them, or the few they hold, take seconds).
SLOW_MODULES: frozenset[str] = frozenset()

#: Slow tests, as "module.py::test_name" (every parametrization) or "module.py::test_name[id]".
SLOW_TESTS: frozenset[str] = frozenset()

#: Tests that need torch without importing it themselves (a spawned script or CLI command does).
TORCH_TESTS = frozenset({
    "test_benchmarks.py::test_predictor_benchmark_runs_quick",
    "test_benchmarks.py::test_predictor_benchmark_crossfit_from_human_quick",
    "test_benchmarks.py::test_sampler_benchmark_runs_quick",
    "test_benchmarks.py::test_companions_benchmark_runs_quick",
    "test_benchmarks.py::test_cost_benchmark_cpu_section_runs_quick",
    "test_cost.py::test_gpu_cost_script_runs_on_cpu_quick",
    # pages whose runnable blocks train, predict or sample
    *(f"test_docs.py::test_page_runs[{page}]" for page in (
        "README.md", "companions.md", "howto-trl.md", "predictor.md", "quickstart.md", "sampler.md")),
})

_TORCH_ROOTS = ("torch", "transformers", "trl", "datasets", "accelerate")


def _imports_torch(node: ast.AST) -> bool:
    """``import torch`` / ``from transformers import ...`` / ``pytest.importorskip("torch")`` directly in node."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Import) and any(a.name.split(".")[0] in _TORCH_ROOTS for a in sub.names):
            return True
        if isinstance(sub, ast.ImportFrom) and (sub.module or "").split(".")[0] in _TORCH_ROOTS:
            return True
        if (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "importorskip"
                and sub.args and isinstance(sub.args[0], ast.Constant) and sub.args[0].value in _TORCH_ROOTS):
            return True
    return False


def _spawns(node: ast.AST) -> bool:
    return any(isinstance(sub, ast.Name) and sub.id == "subprocess"
               or isinstance(sub, ast.Attribute) and sub.attr in ("Popen", "system", "spawnv")
               for sub in ast.walk(node))


@functools.cache
def _module_facts(path: Path) -> tuple[bool, frozenset[str], frozenset[str]]:
    """(module-level torch, functions that reach torch, functions that spawn), each function followed
    through the module's own helpers it calls and fixtures it takes."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top_torch = any(_imports_torch(stmt) for stmt in tree.body
                    if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
    funcs = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def closure(name: str, direct) -> bool:
        seen, todo = set(), [name]
        while todo:
            n = todo.pop()
            if n in seen or n not in funcs:
                continue
            seen.add(n)
            node = funcs[n]
            if direct(node):
                return True
            todo += [a.arg for a in node.args.args]  # fixtures of this module
            todo += [c.func.id for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)]
        return False

    torch = frozenset(n for n in funcs if closure(n, _imports_torch))
    spawn = frozenset(n for n in funcs if closure(n, _spawns))
    return top_torch, torch, spawn


def _listed(names: frozenset[str], item: pytest.Item) -> bool:
    module = item.path.name
    base = getattr(item, "originalname", None) or item.name
    return module in names or f"{module}::{base}" in names or f"{module}::{item.name}" in names


#: What the marking saw before any -m/-k deselection (tests/test_lanes.py reads it).
LANES = pytest.StashKey[dict]()


def pytest_collection_modifyitems(config, items):
    used: set[str] = set()
    for item in items:
        top_torch, torch_funcs, spawn_funcs = _module_facts(item.path)
        name = getattr(item, "originalname", None) or item.name
        if top_torch or name in torch_funcs or _listed(TORCH_TESTS, item):
            item.add_marker(pytest.mark.torch)
        if name in spawn_funcs:
            item.add_marker(pytest.mark.subprocess)
        if item.path.name in SLOW_MODULES or _listed(SLOW_TESTS, item):
            item.add_marker(pytest.mark.slow)
        used |= {item.path.name, f"{item.path.name}::{name}", f"{item.path.name}::{item.name}"}
    config.stash[LANES] = {
        "modules": {item.path.name for item in items},
        "count": {m: sum(1 for item in items if item.get_closest_marker(m)) for m in MARKERS} | {"all": len(items)},
        "unused": {entry for entry in SLOW_MODULES | SLOW_TESTS | TORCH_TESTS
                   if entry.split("::")[0] in {item.path.name for item in items} and entry not in used},
    }


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
