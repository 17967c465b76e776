"""The examples in the README and docs run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.parametrize("path", [p for p in DOCS if python_blocks(p)], ids=lambda p: p.name)
def test_python_examples_run(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files (a trained predictor) write them here
    namespace: dict = {}  # the blocks of one page build on each other
    for block in python_blocks(path):
        exec(compile(block, str(path), "exec"), namespace)  # noqa: S102 - our own documentation


def test_readme_names_the_commands_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = 'pip install torch==2.13.0 && pip install -e ".[dev]" && pytest'
    assert command in readme and command in ci
