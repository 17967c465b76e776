"""``import lengthsched`` (and every submodule) must not import torch, transformers or ortools."""

from __future__ import annotations

import subprocess
import sys
import textwrap

HEAVY = ("torch", "transformers", "ortools", "scipy", "datasets")


def test_lengthsched_imports_nothing_heavy():
    code = textwrap.dedent(
        f"""
        import importlib, pkgutil, sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {HEAVY!r}:
                    raise ImportError("blocked heavy import: " + name)
                return None

        sys.meta_path.insert(0, Block())
        import lengthsched
        for info in pkgutil.walk_packages(lengthsched.__path__, "lengthsched."):
            importlib.import_module(info.name)
        leaked = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
        assert not leaked, leaked
        print("ok", len(list(pkgutil.walk_packages(lengthsched.__path__))))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")
