"""Lazy package exports: a package names where each public name lives, and the module is
imported on first use. Keeps ``import slurm_gpu.store`` (or ``.analysis``) from pulling
SQLAlchemy (or the whole engine) into commands that need one small piece."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(namespace: dict[str, Any], homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the package whose ``globals()`` is ``namespace``: it
    imports ``<package>.<homes[name]>`` on first access and caches the value there."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        namespace[name] = value
        return value

    return __getattr__
