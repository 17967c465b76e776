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
  :data:`SLOW_MODULES`, :data:`SLOW_TESTS` and :data:`SLOW_FIXTURES` lists.

The fast lane (README) is ``pytest -m "not slow"``, which loads the light Hypothesis profile "dev"
unless a profile is named; CI runs everything with the "ci" profile (the default here).
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


def pytest_configure(config):
    # The fast lane (-m "not slow") takes the light profile unless one is named (HYPOTHESIS_PROFILE or
    # --hypothesis-profile); a plain `pytest`, as in CI, keeps "ci".
    named = os.environ.get("HYPOTHESIS_PROFILE") or config.getoption("hypothesis_profile", None)
    if not named and "not slow" in (config.getoption("markexpr", "") or ""):
        settings.load_profile("dev")

MARKERS = ("slow", "torch", "subprocess")

#: Whole modules that are slow (every test in them, or the few they hold, take seconds).
SLOW_MODULES = frozenset({
    "test_benchmarks.py",  # each runs a benchmark script --quick: 10 to 50 s
    "test_sparse_rollouts.py",  # sparse rollouts of a random model, each 20 to 60 s
})

#: Slow tests, as "module.py::test_name" (every parametrization) or "module.py::test_name[id]".
SLOW_TESTS = frozenset({
    "test_cost.py::test_gpu_cost_script_runs_on_cpu_quick",
    "test_cost.py::test_gpu_cost_script_compiles_the_forward_on_cpu_quick",
    "test_replay.py::test_gpu_replay_script_runs_on_cpu_quick",
    "test_replay.py::test_gpu_replay_runs_slime_with_and_without_the_plan_on_cpu_quick",
    "test_replay.py::test_gpu_replay_runs_a_multi_turn_step_on_cpu_quick",
    # A hub name without network: each waits 20-50 s for the Hugging Face hub client to give up.
    "test_predictor_training.py::test_cli_wrong_schema_and_offline_hub_encoder",
    "test_sampler_cli.py::test_errors_are_one_line[argv3-without network access pass a local model directory]",
    "test_cli_predictor_sampler.py::test_train_names_the_encoder_flag",
    "test_predictor_data.py::test_hub_name_offline_says_what_to_pass_instead",
    "test_docs.py::test_page_runs",  # each page's commands, in processes: seconds to minutes a page
    "test_import_purity.py::test_packages_import_nothing_heavy",
    "test_cli_predictor_sampler.py::test_a_predictor_under_a_policy_that_uses_none_says_so",
    "test_cli_predictor_sampler.py::test_length_aware_without_predictions_says_it_has_none",
    "test_cli_predictor_sampler.py::test_sample_notes_predictions_clipped_to_max_new_tokens",
    "test_cli_predictor_sampler.py::test_train_verbose_shows_the_trainer_and_overwrite_replaces",
    "test_online.py::test_a_running_sibling_never_lowers_the_prediction_of_a_fresh_one",
    "test_online.py::test_cli_online_bad_input_names_the_flag[args5-drift_steps]",
    "test_online.py::test_cli_online_prints_tables_and_json",
    "test_online.py::test_drift_experiment_follows_growth_where_a_frozen_predictor_falls_behind",
    "test_online.py::test_evaluate_online_with_priors_and_trace_history",
    "test_online.py::test_predictions_exceed_progress_and_quantiles_are_ordered_with_laws",
    "test_online.py::test_the_benchmark_runs_quick",
    "test_online.py::test_the_online_path_never_imports_torch",
    "test_online.py::test_quantiles_are_monotone_and_above_the_point_and_the_total_exceeds_progress",
    "test_predictor_training.py::test_tau_difference_bootstraps_whole_prompts",
    "test_prefix_grouper.py::test_logprobs_and_every_gradient_equal_the_naive_forward",
    "test_predictor_training.py::test_a_k_token_predictor_drives_the_sampler_probe",
    "test_predictor_training.py::test_resume_continues_from_the_last_checkpoint",
    "test_random_models.py::test_scaled_down_preset_runs_the_sampler",
    "test_runtime.py::test_an_online_predictor_learns_from_finished_siblings_during_the_run",
    "test_runtime.py::test_decisions_never_depend_on_a_length_not_yet_revealed",  # 15 s even at 20 examples
    "test_sampler.py::test_an_online_predictor_makes_the_same_decisions_in_sampler_and_simulator",
    "test_sampler.py::test_completions_do_not_depend_on_the_policy",
    "test_sampler.py::test_memory_is_freed_when_a_completion_finishes",
    "test_sampler.py::test_replay_invariants_on_random_groups",
    "test_sampler.py::test_sampling_controls_and_stop_tokens",
    "test_sampler.py::test_step_records_say_what_each_step_computed_and_how_long_it_took",
    "test_sampler.py::test_the_prompt_kv_is_held_once_when_shared",
    "test_sampler.py::test_token_conditioned_prediction_probes_k_tokens_then_plans",
    "test_sampler.py::test_trace_replay_matches_the_simulator_step_for_step",
    "test_sampler_cli.py::test_offline_default_says_it_is_a_random_model",
    "test_sampler_cli.py::test_replay_json_and_output_file",
    "test_seconds.py::test_the_compiled_path_gives_the_engines_seconds",
    "test_simulate_cli.py::test_plot_writes_figures",
    "test_simulate_cli_new_user.py::test_plot_titles_give_the_budget_in_gib",
    "test_simulate_compiled.py::test_engine_many_equals_the_event_engine",
    "test_trl.py::test_grpo_benchmark_runs_quick",
    "test_trl.py::test_vllm_rollout_generates_through_trls_colocated_engine_in_the_plans_order",
})

#: Fixtures that take seconds to build, as "module.py::fixture": every test using one is slow (marking only
#: the first user would move the cost to the next).
SLOW_FIXTURES = frozenset({
    "test_predictor_training.py::trained",  # trains a predictor: tens of seconds
    "test_online.py::clean_evaluation",  # evaluate_online over 300 groups with bootstrap
    "test_online.py::mixed_evaluation",
    "test_trl.py::runs",  # two toy GRPO runs
})

#: Tests that need torch without importing it themselves (a spawned script or CLI command does).
TORCH_TESTS = frozenset({
    "test_benchmarks.py::test_predictor_benchmark_runs_quick",
    "test_benchmarks.py::test_predictor_benchmark_crossfit_from_human_quick",
    "test_benchmarks.py::test_sampler_benchmark_runs_quick",
    "test_benchmarks.py::test_companions_benchmark_runs_quick",
    "test_benchmarks.py::test_cost_benchmark_cpu_section_runs_quick",
    "test_cost.py::test_gpu_cost_script_runs_on_cpu_quick",
    "test_cost.py::test_gpu_cost_script_compiles_the_forward_on_cpu_quick",
    "test_replay.py::test_gpu_replay_script_runs_on_cpu_quick",
    "test_replay.py::test_gpu_replay_runs_slime_with_and_without_the_plan_on_cpu_quick",
    "test_replay.py::test_gpu_replay_runs_a_multi_turn_step_on_cpu_quick",
    "test_docs.py::test_reference_pages_match_the_code",  # documents predictor_training.model
    "test_runtime.py::test_every_list_of_policies_derives_from_the_registry",  # imports sampler.core
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
        fixtures = {f"{item.path.name}::{f}" for f in getattr(item, "fixturenames", ())}
        if item.path.name in SLOW_MODULES or _listed(SLOW_TESTS, item) or fixtures & SLOW_FIXTURES:
            item.add_marker(pytest.mark.slow)
        used |= {item.path.name, f"{item.path.name}::{name}", f"{item.path.name}::{item.name}"} | fixtures
    config.stash[LANES] = {
        "modules": {item.path.name for item in items},
        "count": {m: sum(1 for item in items if item.get_closest_marker(m)) for m in MARKERS} | {"all": len(items)},
        "unused": {entry for entry in SLOW_MODULES | SLOW_TESTS | SLOW_FIXTURES | TORCH_TESTS
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
