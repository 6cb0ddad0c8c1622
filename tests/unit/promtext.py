"""A strict parser of Prometheus' text exposition format (0.0.4), for the tests.

Stricter than Prometheus itself where the format leaves room: every sample must follow the
``# HELP`` and ``# TYPE`` of its family, a family appears once, a series once, counters end
in ``_total``, label names and metric names match the format's grammar, label values use only
the three escapes the format defines.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


class ExpositionError(ValueError):
    pass


@dataclass
class Family:
    name: str
    type: str
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)


def _labels(text: str, lineno: int) -> tuple[dict[str, str], str]:
    """Parse ``{a="x",b="y"}`` at the start of ``text``; return labels and the rest."""
    assert text.startswith("{")
    i, labels = 1, {}
    while True:
        if text[i] == "}":
            return labels, text[i + 1 :]
        m = re.match(r"[a-zA-Z_][a-zA-Z0-9_]*", text[i:])
        if not m:
            raise ExpositionError(f"line {lineno}: bad label name at {text[i:]!r}")
        name = m.group(0)
        i += len(name)
        if text[i : i + 2] != '="':
            raise ExpositionError(f'line {lineno}: expected =" after {name}')
        i += 2
        value = []
        while True:
            c = text[i]
            if c == "\\":
                nxt = text[i + 1]
                if nxt not in ("\\", '"', "n"):
                    raise ExpositionError(f"line {lineno}: bad escape \\{nxt}")
                value.append("\n" if nxt == "n" else nxt)
                i += 2
            elif c == '"':
                i += 1
                break
            elif c == "\n":
                raise ExpositionError(f"line {lineno}: raw newline in a label value")
            else:
                value.append(c)
                i += 1
        if name in labels:
            raise ExpositionError(f"line {lineno}: label {name} twice")
        labels[name] = "".join(value)
        if text[i] == ",":
            i += 1
        elif text[i] != "}":
            raise ExpositionError(f"line {lineno}: expected , or }} after a label")


def parse(text: str) -> dict[str, Family]:
    """Families by name; ``ExpositionError`` on anything the format does not allow."""
    if not text.endswith("\n"):
        raise ExpositionError("the exposition must end with a line feed")
    families: dict[str, Family] = {}
    helps: dict[str, str] = {}
    current: Family | None = None
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for lineno, line in enumerate(text[:-1].split("\n"), 1):
        if line.startswith("# HELP "):
            name, _, doc = line[7:].partition(" ")
            if not NAME.match(name) or name in helps:
                raise ExpositionError(f"line {lineno}: bad or repeated HELP {name}")
            helps[name] = doc
            continue
        if line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            if name in families or kind not in TYPES or helps.get(name) is None:
                raise ExpositionError(f"line {lineno}: bad TYPE line {line!r}")
            if kind == "counter" and not name.endswith("_total"):
                raise ExpositionError(f"line {lineno}: counter {name} lacks _total")
            current = families[name] = Family(name, kind, helps[name])
            continue
        if line.startswith("#") or not line:
            raise ExpositionError(f"line {lineno}: unexpected {line!r}")
        m = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line)
        if not m:
            raise ExpositionError(f"line {lineno}: no metric name")
        name, rest = m.group(0), line[m.end() :]
        if current is None or name != current.name:
            raise ExpositionError(f"line {lineno}: sample {name} outside its family")
        labels: dict[str, str] = {}
        if rest.startswith("{"):
            labels, rest = _labels(rest, lineno)
        if not rest.startswith(" "):
            raise ExpositionError(f"line {lineno}: no space before the value")
        parts = rest[1:].split(" ")
        if len(parts) not in (1, 2):
            raise ExpositionError(f"line {lineno}: bad value part {rest!r}")
        value = float(parts[0])
        if math.isnan(value):
            raise ExpositionError(f"line {lineno}: NaN")
        key = (name, tuple(sorted(labels.items())))
        if key in seen:
            raise ExpositionError(f"line {lineno}: series repeated")
        seen.add(key)
        current.samples.append((labels, value))
    return families
