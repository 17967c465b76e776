"""The benchmark scripts still run (quick mode); their numbers live in docs/benchmarks.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_simulator_benchmark_runs_quick(tmp_path):
    out = tmp_path / "simulate.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_simulate.py"), "--quick",
                             "--sections", "target,paper,batches", "--out", str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    assert {"target", "paper", "batches"} <= set(data)
    assert "steps / micro" in result.stdout


def test_planning_benchmark_runs_quick(tmp_path):
    out = tmp_path / "planning.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_planning.py"), "--quick",
                             "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "### FPTAS time" in result.stdout
    data = json.loads(out.read_text())
    assert {"machine", "plan_group", "fptas", "quality"} <= set(data)


def test_predictor_benchmark_runs_quick(tmp_path):
    out = tmp_path / "predictor.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_predictor.py"), "--quick",
                             "--work", str(tmp_path / "work"), "--out", str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "### Prediction latency" in result.stdout and "### Remaining length after the first k=32" in result.stdout
    data = json.loads(out.read_text())
    assert {"machine", "k0", "longer", "k", "k_comparison", "latency"} <= set(data)
    assert data["longer"][0]["options"]["init_from"] == data["k0"]["options"]["out"]
    assert data["k0_vs_tfidf"][-1][0] == "all" and len(data["longer_vs_tfidf"]) == 1
    assert {"model", "tfidf", "linear", "constant", "ceiling"} <= set(data["k0"]["evaluation"])


def run_quick(script: str, out) -> dict:
    """Run ``benchmarks/<script> --quick --out OUT`` and return its JSON results."""
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--out", str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


def test_sampler_benchmark_runs_quick(tmp_path):
    data = run_quick("bench_sampler.py", tmp_path / "sampler.json")
    assert {"machine", "device", "policies", "prompt_kv", "generate", "learner"} <= set(data)
    for row in data["policies"]["rows"]:  # the sampler's steps and peak KV are the simulator's and the model's
        assert row["steps"] == row["sim_steps"] and row["peak_kv_bytes"] == row["model_peak_kv_bytes"]


def test_companions_benchmark_runs_quick(tmp_path):
    data = run_quick("bench_companions.py", tmp_path / "companions.json")
    assert {"machine", "sgpo", "sparse", "learner"} <= set(data)
    dense, *compressed = data["sparse"]
    assert all(c["peak_kv_bytes"] < dense["peak_kv_bytes"] for c in compressed)
