"""The methods ``dataclasses`` generates, compiled once and kept beside the byte code.

``@dataclass`` writes each method it adds (``__init__``, ``__repr__``, ``__eq__``,
``__hash__``, and ``__setattr__``/``__delattr__`` for a frozen class) as Python source and
compiles it with ``exec`` when the class is defined: at every start of every process, since
byte code (``.pyc``) keeps the module's own code, not code a module generates while it runs.
The package defines its records as frozen dataclasses (about 60 on ``gpueff``'s path for a
running job), and compiling their methods was about half of that path's import time
(``docs/performance.md``).

``install`` makes the ``exec`` that ``dataclasses`` calls look the source up in a table kept
beside the module's ``.pyc`` (``__pycache__/NAME.TAG.methods``: the generated source text
mapped to its compiled code, ``marshal``), and compile only what it does not find there. The
text is the key, so a class changed since the table was written misses and is compiled as
before; nothing else changes: the same code object is executed in the same namespaces. Only
this package's modules are looked up (``PREFIX``); every other ``exec`` passes straight through.

The tables are written with the byte code by ``python -m slurm_gpu.precompile`` (``build``):
after installing, as the account that owns the install (README, "Install"). A table is
trusted exactly as far as the source beside it: it is read only when it is a regular file
(never a link) owned by the owner of the module's ``.py`` file or by root, writable by nobody
else, at most ``MAX_TABLE_BYTES``, with this interpreter's byte-code magic in its header;
anything else is ignored (the methods are compiled, as without a table). Imports the standard
library only.
"""

from __future__ import annotations

import _thread
import builtins
import marshal
import os
import stat
import sys
from types import CodeType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

#: Modules whose generated methods are looked up: this package's.
PREFIX = "slurm_gpu."
#: Largest table read, in bytes (the largest module's is about 0.2 MiB).
MAX_TABLE_BYTES = 8 << 20
#: A table's header: this name, then the interpreter's byte-code magic.
_HEAD = b"slurm-gpu methods\n"

_real_exec = builtins.exec
_tables: dict[str, dict[str, CodeType]] = {}
_lock = _thread.allocate_lock()  # not threading: the hooks need not import it
_counts = {"hits": 0, "misses": 0}
#: While ``build`` runs: every module's generated sources and their code, found or compiled.
_recorded: dict[str, dict[str, CodeType]] | None = None


def _magic() -> bytes:
    """The byte-code magic of this interpreter (what a ``.pyc`` starts with)."""
    external = sys.modules.get("_frozen_importlib_external")
    magic = getattr(external, "MAGIC_NUMBER", None)
    if isinstance(magic, bytes):
        return magic
    import importlib.util

    return importlib.util.MAGIC_NUMBER


def table_path(module_file: str) -> str:
    """Where the table of the module whose source is ``module_file`` lives."""
    directory, base = os.path.split(module_file)
    stem = base.rsplit(".", 1)[0]
    tag = sys.implementation.cache_tag or "none"
    return os.path.join(directory, "__pycache__", f"{stem}.{tag}.methods")


def _read_table(module_file: str) -> dict[str, CodeType]:
    """The module's table; empty when there is none or it is not to be trusted."""
    try:
        owner = os.stat(module_file).st_uid
        fd = os.open(table_path(module_file), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        st = os.fstat(fd)
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_uid not in (owner, 0)
            or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            or st.st_size > MAX_TABLE_BYTES
        ):
            return {}
        chunks, left = [], MAX_TABLE_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    except OSError:
        return {}
    finally:
        os.close(fd)
    head = _HEAD + _magic()
    if len(data) > MAX_TABLE_BYTES or not data.startswith(head):
        return {}
    try:
        table = marshal.loads(data[len(head) :])
    except (EOFError, ValueError, TypeError):
        return {}
    if not isinstance(table, dict):
        return {}
    return {k: v for k, v in table.items() if isinstance(k, str) and isinstance(v, CodeType)}


def _table_for(module_name: str, module_file: str) -> dict[str, CodeType]:
    table = _tables.get(module_name)
    if table is None:
        with _lock:
            table = _tables.get(module_name)
            if table is None:
                table = {} if _recorded is not None else _read_table(module_file)
                _tables[module_name] = table
    return table


def _exec(source: Any, globals_: Any = None, locals_: Any = None, /) -> None:
    """``exec`` as ``dataclasses`` calls it, with this package's generated methods taken from
    their module's table when it has them."""
    name = globals_.get("__name__") if isinstance(globals_, dict) else None
    file = globals_.get("__file__") if isinstance(globals_, dict) else None
    if (
        not isinstance(source, str)
        or not isinstance(name, str)
        or not isinstance(file, str)
        or not name.startswith(PREFIX)
    ):
        _real_exec(source, globals_, locals_)
        return
    table = _table_for(name, file)
    code = table.get(source)
    if code is None:
        # As ``exec`` compiles a string: file name "<string>".
        code = compile(source, "<string>", "exec")
        _counts["misses"] += 1
    else:
        _counts["hits"] += 1
    if _recorded is not None:
        _recorded.setdefault(name, {})[source] = code
    _real_exec(code, globals_, locals_)


def install() -> None:
    """Route ``dataclasses``' ``exec`` through the tables (idempotent)."""
    import dataclasses

    if getattr(dataclasses, "exec", None) is not _exec:
        # A module global named ``exec`` is found before the builtin by the module's code.
        setattr(dataclasses, "exec", _exec)  # noqa: B010 (mypy: no such attribute declared)


def counts() -> tuple[int, int]:
    """(generated methods found in a table, compiled) in this process so far."""
    return _counts["hits"], _counts["misses"]


def _write_table(path: str, table: dict[str, CodeType]) -> None:
    """Write ``table`` to ``path`` by a new file renamed over it (readers see the old or the
    new table whole), in a ``__pycache__`` that only this account can write (made when
    missing)."""
    import contextlib

    directory = os.path.dirname(path)
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o755)
    st = os.lstat(directory)
    if (
        not stat.S_ISDIR(st.st_mode)
        or st.st_uid != os.geteuid()
        or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        # Another account could swap the name between the check and the rename.
        raise PermissionError(f"{directory} is not a directory only this account can write")
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.fchmod(fd, 0o644)  # whatever the umask: the table is read by every user
        data = _HEAD + _magic() + marshal.dumps(table)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)


def build(package: str = "slurm_gpu") -> tuple[int, int]:
    """Import every module of ``package`` (ignoring the ones whose optional dependencies are
    missing) and write the table of each that defines dataclasses. Returns (tables written,
    methods in them). Meant for a fresh interpreter: a module imported before it began is not
    recorded."""
    import importlib
    import pkgutil

    global _recorded
    install()
    _recorded = {}
    _tables.clear()
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue  # a program, not a module: importing it could run it
        try:
            importlib.import_module(info.name)
        except (Exception, SystemExit):  # an optional dependency missing: no table for it
            continue
    recorded, _recorded = _recorded, None
    files = {name: m.__file__ for name, m in sys.modules.items() if name in recorded}
    written = methods = 0
    for name, table in sorted(recorded.items()):
        file = files.get(name)
        if not isinstance(file, str):
            continue
        _write_table(table_path(file), table)
        written += 1
        methods += len(table)
    return written, methods
