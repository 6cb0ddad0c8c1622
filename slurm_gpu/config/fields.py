"""How a setting is declared: its default, a one-line doc and its constraints."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def setting(default: Any, doc: str, **constraints: Any) -> Any:
    """A setting: its default, a one-line doc, and constraints (min, max, choices)."""
    if isinstance(default, list | dict):
        frozen = tuple(default) if isinstance(default, list) else default
        return field(default_factory=lambda: frozen, metadata={"doc": doc, **constraints})
    return field(default=default, metadata={"doc": doc, **constraints})
