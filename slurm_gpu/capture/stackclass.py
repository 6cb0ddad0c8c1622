"""What one sampled Python stack was doing: a class (input wait, compute, a collective, ...)
and the frame that decided it. Pure: no I/O beyond reading the class table's file.

The table is data (``share/stacks/classes.toml``, extended by the site's ``[stacks]
classes_path``): classes with a priority, rules that match frames by file substring, function
name and an optional outer frame (``under``), and roles that mark processes that are not the
job's main processes. ``docs/stacks.md`` describes the format.

Only what a rule names leaves this module: the class and the deciding frame as
``<file stem>.<function>`` (``dataloader.__next__``), cleaned as user text (a user names their
files and functions). Arguments, locals and file contents are never read (py-spy is not asked
for them) and never kept.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurm_gpu.textsafe import clean_user_text

#: Fallback class of a stack no rule matches, when its thread was running.
OTHER = "other"
#: Fallback class of a stack no rule matches, when py-spy saw its thread idle (blocked in the
#: kernel: ``time.sleep``, a read, a lock), and a class of the default table.
SLEEP_IDLE = "sleep_idle"
#: Roles a ``[[role]]`` entry may give (see the table's header).
ROLES = ("worker", "launcher", "child")
#: Longest deciding-frame name kept, characters.
DECIDING_MAX_LEN = 64
#: Most classes a table may have (the record keeps one count per class).
MAX_CLASSES = 32
#: Most rules (classes' and roles' together) a table may have.
MAX_RULES = 2000
#: Most bytes read from a class-table file.
TABLE_MAX_BYTES = 1 << 20

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


class TableError(ValueError):
    """A class table that cannot be used (the message names the file and the entry)."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame of a sampled stack."""

    file: str
    """The frame's file path as the interpreter has it (``/usr/lib/python3.11/queue.py``)."""
    function: str
    """Its function's name, qualified (``Queue.get``) or not (``get``)."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One pattern: a frame whose file contains ``file`` (empty: any), whose function is in
    ``functions`` (empty: any) and, when ``under`` is set, with a frame further out whose file
    contains ``under``."""

    target: str
    """The class (``[[rule]]``) or role (``[[role]]``) it gives."""
    file: str = ""
    functions: frozenset[str] = frozenset()
    under: str = ""
    framework: str = ""

    def matches(self, frames: Sequence[Frame], i: int) -> bool:
        """Whether frame ``i`` of ``frames`` (innermost first) matches."""
        f = frames[i]
        if self.functions and short_function(f.function) not in self.functions:
            return False
        if self.file and self.file not in f.file:
            return False
        return not self.under or any(self.under in g.file for g in frames[i + 1 :])


@dataclass(frozen=True, slots=True)
class ClassTable:
    """The classes in priority order and their rules, and the roles' rules."""

    classes: tuple[str, ...]
    """Class names, most important first; ``other`` is always last and ``sleep_idle``
    always present (the fallbacks)."""
    rules: tuple[tuple[Rule, ...], ...]
    """Per class (in ``classes`` order), its rules, the site's first."""
    roles: tuple[Rule, ...] = ()


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one stack was doing."""

    cls: str
    deciding: str
    """``<file stem>.<function>`` of the frame that decided, cleaned; empty for a fallback."""


def short_function(name: str) -> str:
    """The function's own name: py-spy gives the qualified name on Python 3.11 and later
    (``Queue.get``, ``_MultiProcessingDataLoaderIter.__next__``); rules name the last part."""
    return name.rpartition(".")[2] or name


def frame_name(frame: Frame) -> str:
    """``<file stem>.<function>``, cleaned and bounded: what the record may keep of a frame."""
    stem = os.path.basename(frame.file.replace("\\", "/"))
    if stem.endswith(".py"):
        stem = stem[:-3]
    func = short_function(frame.function)
    name = f"{stem}.{func}" if stem else func
    return clean_user_text(name, DECIDING_MAX_LEN)


def classify(frames: Sequence[Frame], active: bool | None, table: ClassTable) -> Verdict:
    """The class of one stack (innermost frame first): the first class, in priority order,
    with a rule matching one of its frames (the innermost such frame decides); else
    ``sleep_idle`` for an idle thread and ``other`` for a running one (``active`` unknown:
    ``other``)."""
    for cls, rules in zip(table.classes, table.rules, strict=True):
        for i in range(len(frames)):
            for rule in rules:
                if rule.matches(frames, i):
                    return Verdict(cls, frame_name(frames[i]))
    return Verdict(SLEEP_IDLE if active is False else OTHER, "")


def role_of(frames: Sequence[Frame], table: ClassTable) -> str | None:
    """The role a process's main-thread stack gives it (``worker``, ``launcher``, ``child``),
    or ``None`` for a main process."""
    for rule in table.roles:
        for i in range(len(frames)):
            if rule.matches(frames, i):
                return rule.target
    return None


# --------------------------------------------------------------------------- loading


def _str(entry: Mapping[str, Any], key: str, where: str) -> str:
    value = entry.get(key, "")
    if not isinstance(value, str) or len(value) > 256:
        raise TableError(f"{where}: {key} must be a string of at most 256 characters")
    return value


def _rule(entry: Any, where: str, target_key: str) -> Rule:
    if not isinstance(entry, dict):
        raise TableError(f"{where}: expected a table")
    unknown = set(entry) - {target_key, "file", "function", "under", "framework"}
    if unknown:
        raise TableError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    target = _str(entry, target_key, where)
    funcs = entry.get("function", [])
    if isinstance(funcs, str):
        funcs = [funcs]
    if not isinstance(funcs, list) or not all(isinstance(f, str) for f in funcs):
        raise TableError(f"{where}: function must be a string or a list of strings")
    rule = Rule(
        target=target,
        file=_str(entry, "file", where),
        functions=frozenset(funcs),
        under=_str(entry, "under", where),
        framework=_str(entry, "framework", where),
    )
    if not rule.file and not rule.functions:
        raise TableError(f"{where}: a rule needs a file or a function")
    return rule


def parse_table(docs: Iterable[tuple[str, Mapping[str, Any]]]) -> ClassTable:
    """A table from parsed TOML documents ``(where, document)``, the first document's rules
    tried first within a class. ``TableError`` for an unknown key, a bad name, a rule of an
    undeclared class or a table over ``MAX_CLASSES`` classes or ``MAX_RULES`` rules."""
    priority: dict[str, int] = {}
    rules: dict[str, list[Rule]] = {}
    roles: list[Rule] = []
    pending: list[tuple[str, Rule]] = []
    for where, doc in docs:
        unknown = set(doc) - {"class", "rule", "role"}
        if unknown:
            raise TableError(f"{where}: unknown section {sorted(unknown)[0]!r}")
        for n, entry in enumerate(doc.get("class", [])):
            at = f"{where}: class #{n + 1}"
            if not isinstance(entry, dict) or set(entry) - {"name", "priority", "description"}:
                raise TableError(f"{at}: expected name, priority and description")
            name = entry.get("name")
            prio = entry.get("priority")
            if not isinstance(name, str) or not _NAME.match(name) or name == OTHER:
                raise TableError(f"{at}: name must match [a-z][a-z0-9_]* and not be 'other'")
            if not isinstance(prio, int) or isinstance(prio, bool):
                raise TableError(f"{at}: priority must be an integer")
            priority.setdefault(name, prio)
            rules.setdefault(name, [])
        for n, entry in enumerate(doc.get("rule", [])):
            at = f"{where}: rule #{n + 1}"
            pending.append((at, _rule(entry, at, "class")))
        for n, entry in enumerate(doc.get("role", [])):
            role = _rule(entry, f"{where}: role #{n + 1}", "name")
            if role.target not in ROLES:
                raise TableError(f"{where}: role #{n + 1}: name must be one of {', '.join(ROLES)}")
            roles.append(role)
    priority.setdefault(SLEEP_IDLE, max(priority.values(), default=0) + 1)
    rules.setdefault(SLEEP_IDLE, [])
    for at, rule in pending:
        if rule.target not in rules:
            raise TableError(f"{at}: class {rule.target!r} is not declared")
        rules[rule.target].append(rule)
    if len(priority) + 1 > MAX_CLASSES:
        raise TableError(f"at most {MAX_CLASSES} classes")
    if sum(map(len, rules.values())) + len(roles) > MAX_RULES:
        raise TableError(f"at most {MAX_RULES} rules")
    order = sorted(priority, key=lambda c: (priority[c], c))
    return ClassTable(
        classes=(*order, OTHER),
        rules=(*(tuple(rules[c]) for c in order), ()),
        roles=tuple(roles),
    )


def default_table_path() -> str:
    """The class table shipped with slurm-gpu."""
    from slurm_gpu.resources import data_path

    return os.path.join(data_path("share"), "stacks", "classes.toml")


def read_toml(path: str) -> dict[str, Any]:
    """One table file, at most ``TABLE_MAX_BYTES``; ``TableError`` naming it otherwise."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(TABLE_MAX_BYTES + 1)
    except OSError as exc:
        raise TableError(f"{path}: cannot read ({exc.strerror})") from None
    if len(data) > TABLE_MAX_BYTES:
        raise TableError(f"{path}: larger than {TABLE_MAX_BYTES} bytes")
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise TableError(f"{path}: not TOML ({exc})") from None


def load_table(site_path: str = "", *, default_path: str | None = None) -> ClassTable:
    """The shipped table extended by the site's file (``site_path``; its rules first)."""
    docs = []
    if site_path:
        docs.append((site_path, read_toml(site_path)))
    base = default_path or default_table_path()
    docs.append((base, read_toml(base)))
    return parse_table(docs)
