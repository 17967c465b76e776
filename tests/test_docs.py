"""The README and every page of docs/ run as written, and the generated reference pages match the code.

A page's ```sh and ```python blocks run in document order in one fresh directory, so a page may
train a predictor in one block and load it in the next. Shell blocks run under
``bash -euo pipefail`` with the repository's top-level folders linked in (paths such as
``predictor_training/data/castillo_sample.json`` work as in a clone); Python blocks run in this
process and share one namespace per page. Installation lines (``pip install``, ``python3 -m venv``)
and ``pytest`` are what CI itself runs, so they are not run again. A block whose first line starts
with ``# not run by the tests:`` says why (a GPU, a download, data that is not bundled, a benchmark
that rewrites its recorded results) and is skipped.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```(sh|python)\n(.*?)^```", flags=re.S | re.M)
SETUP = re.compile(r"^\s*(pip install|python3? -m venv|pytest\b)")
NOT_RUN = "# not run by the tests:"


def blocks(path: Path) -> list[tuple[str, str]]:
    return BLOCK.findall(path.read_text(encoding="utf-8"))


def skipped(code: str) -> bool:
    return code.lstrip().startswith(NOT_RUN)


@pytest.mark.parametrize("path", [p for p in PAGES if blocks(p)], ids=lambda p: p.name)
def test_page_runs(path, tmp_path, monkeypatch):
    for entry in ROOT.iterdir():
        if entry.is_dir() and not entry.name.startswith("."):
            (tmp_path / entry.name).symlink_to(entry)
    monkeypatch.chdir(tmp_path)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", MPLBACKEND="Agg",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    namespace: dict = {}
    for kind, code in blocks(path):
        if skipped(code):
            continue
        if kind == "python":
            exec(compile(code, str(path), "exec"), namespace)  # noqa: S102 - our own documentation
            continue
        script = "\n".join(line for line in code.splitlines() if not SETUP.match(line))
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"{path.name}:\n{script}\n--- stderr ---\n{result.stderr[-3000:]}"


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_skipped_blocks_say_why(path):
    for _, code in blocks(path):
        if skipped(code):
            reason = code.lstrip()[len(NOT_RUN):].splitlines()[0].strip()
            assert len(reason) > 10, f"{path.name}: a skipped block needs its reason on the first line"


def test_commands_are_in_runnable_blocks():
    # Commands shown as indented code or in bare fences would escape test_page_runs.
    hidden = re.compile(r"^(    |```\n)(lengthsched |python benchmarks/|python -m |echo .*\| lengthsched)", flags=re.M)
    for path in PAGES:
        text = BLOCK.sub("", path.read_text(encoding="utf-8"))
        assert not hidden.search(text), f"{path.name}: put commands in ```sh blocks"


def test_code_blocks_use_the_fences_the_tests_know():
    # ```py, ```bash, ```console ... would be shown but never run: only ```sh and ```python are.
    for path in PAGES:
        for fence in re.findall(r"^```(\w+)", path.read_text(encoding="utf-8"), flags=re.M):
            assert fence in ("sh", "python", "text", "toml", "json"), f"{path.name}: ```{fence} block"


def test_readme_names_the_commands_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    install = 'pip install torch==2.13.0 && pip install -e ".[dev]"'
    assert f"{install} && pytest" in readme
    # CI installs, lints, then tests (its second stage, the verl tests, is built in between)
    assert install in ci and "ruff check . && pytest" in ci.split(install, 1)[1] and "ruff check ." in readme
    verl_stage = ("tests/test_verl.py tests/test_verl_async.py tests/test_verl_stealing.py \\\n"
                  "  tests/test_verl_selective.py")
    assert verl_stage in readme and verl_stage in ci  # the README names CI's second stage as CI runs it


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the pages are generated with Python 3.11 "
                    "(signatures and argparse output differ slightly between versions)")
def test_reference_pages_match_the_code():
    from lengthsched.refdocs import PAGES as REFERENCE

    for page, make in REFERENCE.items():
        assert (ROOT / "docs" / page).read_text(encoding="utf-8") == make(), (
            f"docs/{page} is out of date: run python -m lengthsched.refdocs docs")
