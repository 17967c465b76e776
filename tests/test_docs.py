"""The examples in the README and docs run as written, and the benchmark script still works."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.parametrize("path", [p for p in DOCS if python_blocks(p)], ids=lambda p: p.name)
def test_python_examples_run(path):
    for block in python_blocks(path):
        exec(compile(block, str(path), "exec"), {})  # noqa: S102 - our own documentation


def test_readme_names_the_commands_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = 'pip install -e ".[dev]" && pytest'
    assert command in readme and command in ci


def test_benchmark_script_runs_quick(tmp_path):
    out = tmp_path / "planning.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_planning.py"), "--quick",
                             "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "### FPTAS time" in result.stdout
    data = json.loads(out.read_text())
    assert {"machine", "plan_group", "fptas", "quality"} <= set(data)
