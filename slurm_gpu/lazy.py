"""Lazy package exports: a package names where each public name lives, and the module is
imported on first use. Keeps ``import slurm_gpu.store`` (or ``.analysis``) from pulling
SQLAlchemy (or the whole engine) into commands that need one small piece."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any


@functools.cache
def optional_module(name: str) -> ModuleType | None:
    """The module ``name``, imported on the first call (later calls reuse it); ``None`` where
    it is not installed. For accelerators a path may use without depending on them."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


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
