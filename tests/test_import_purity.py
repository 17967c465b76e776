"""``import lengthsched`` (and every submodule) must not import torch, transformers or ortools, nor
its sibling packages (simulate, predictor_training, sampler: the CLI finds them lazily);
``import simulate`` must need nothing beyond numpy and lengthsched until a report is made;
``import lengthsched.integrations`` (the engine adapters) must not import vLLM or SGLang either."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CORE_BLOCKED = ("torch", "transformers", "ortools", "scipy", "datasets", "matplotlib", "tqdm")
SIBLINGS = ("simulate", "predictor_training", "sampler")
ENGINES = ("vllm", "sglang", "areal")


def imports_cleanly(package: str, blocked: tuple[str, ...]) -> subprocess.CompletedProcess:
    code = textwrap.dedent(
        f"""
        import importlib, pkgutil, sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {blocked!r}:
                    raise ImportError("blocked heavy import: " + name)
                return None

        sys.meta_path.insert(0, Block())
        package = importlib.import_module({package!r})
        for info in pkgutil.walk_packages(package.__path__, {package!r} + "."):
            importlib.import_module(info.name)
        leaked = sorted(m for m in sys.modules if m.split(".")[0] in {blocked!r})
        assert not leaked, leaked
        print("ok")
        """
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)


@pytest.mark.parametrize(
    ("package", "blocked"),
    [("lengthsched", CORE_BLOCKED + SIBLINGS), ("simulate", CORE_BLOCKED),
     ("lengthsched.integrations", CORE_BLOCKED + ENGINES + SIBLINGS)],
    ids=["lengthsched", "simulate", "lengthsched.integrations"],
)
def test_packages_import_nothing_heavy(package, blocked):
    result = imports_cleanly(package, blocked)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
