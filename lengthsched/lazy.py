"""Lazy package exports: the torch-based packages name their public objects without importing torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_getattr"]


def lazy_getattr(package: str, where: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``package.<where[name]>`` when ``name`` is first used."""

    def __getattr__(name: str) -> Any:
        if name in where:
            return getattr(importlib.import_module(f".{where[name]}", package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
