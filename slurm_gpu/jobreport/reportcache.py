"""``gpueff``'s cached reports: the key that says whether a stored rendering is still what
``gpueff`` would print, and the read of the cache that answers the common case.

The collector renders each stored job's terminal report (``slurm_gpu.jobreport.prerender``)
into the store's ``job_reports`` table, once without and once with colour. ``gpueff JOBID`` on
the caller's own settled job then prints that text: one indexed SQLite read instead of
importing the report model, the finding tables and jinja2 and rendering (``docs/gpueff.md``,
"Speed"). This module is on that path, so it imports the standard library only.

A stored text is used only when its ``render_key`` equals the reader's: the key covers the
release, every template file that could take part (the site's ``[gpueff] template_dir`` first,
then the built-in ``templates/gpueff`` and ``templates/findings``: names, sizes and
modification times), the source files of the code that turns stored rows into text, and the
settings that change the text (``[gpueff] min_elapsed_s`` and ``template_dir``). Editing a
template, upgrading, or pointing ``--config`` at other settings therefore makes ``gpueff``
render afresh, never print a stale text.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable, Sequence
from typing import Protocol

from slurm_gpu.store.urls import readonly_uri

#: Changes when what a cached row holds changes meaning.
CACHE_FORMAT = 1

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Package directories and modules whose code turns stored rows into the report's text.
_CODE_DIRS = ("jobreport", "analysis", "store")
_CODE_FILES = ("records.py", "__init__.py")


class _GpueffSettings(Protocol):
    @property
    def min_elapsed_s(self) -> float: ...

    @property
    def template_dir(self) -> str: ...


def _dir_fingerprint(path: str, suffix: str) -> Iterable[str]:
    """``name:size:mtime_ns`` of every file ending in ``suffix`` in ``path``, sorted; one
    ``path:absent`` entry when it cannot be listed."""
    try:
        entries = sorted((e.name, e.stat()) for e in os.scandir(path) if e.name.endswith(suffix))
    except OSError:
        return (f"{path}:absent",)
    return (f"{path}/{name}:{st.st_size}:{st.st_mtime_ns}" for name, st in entries)


def render_key(gpueff: _GpueffSettings) -> str:
    """The key of everything that decides the text of a job's report, as a short string.

    ``gpueff`` is the ``[gpueff]`` settings section. Costs one directory listing per template
    and code directory (about 0.1–0.5 ms)."""
    from slurm_gpu import __version__
    from slurm_gpu.resources import data_path

    templates = data_path("templates")
    parts = [
        f"format={CACHE_FORMAT}",
        f"version={__version__}",
        f"min_elapsed_s={gpueff.min_elapsed_s!r}",
        f"template_dir={gpueff.template_dir}",
    ]
    if gpueff.template_dir:
        parts += _dir_fingerprint(gpueff.template_dir, ".j2")
    parts += _dir_fingerprint(os.path.join(templates, "gpueff"), ".j2")
    parts += _dir_fingerprint(os.path.join(templates, "findings"), ".j2")
    for sub in _CODE_DIRS:
        parts += _dir_fingerprint(os.path.join(_PACKAGE_DIR, sub), ".py")
    for name in _CODE_FILES:
        try:
            st = os.stat(os.path.join(_PACKAGE_DIR, name))
            parts.append(f"{name}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            parts.append(f"{name}:absent")
    blob = "\n".join(parts).encode()
    # Not a security boundary (a matching key only ever selects the caller's own job's text),
    # so two fast checksums instead of importing hashlib.
    return f"{CACHE_FORMAT}-{zlib.crc32(blob):08x}{zlib.adler32(blob):08x}-{len(blob)}"


def read_cached(
    path: str, typed_ids: Sequence[str], caller_uid: int, key: str, *, colour: bool
) -> list[str] | None:
    """The cached texts of ``typed_ids``, in order, from the SQLite store at ``path``; ``None``
    unless every one of them is the caller's own job (any job for root, whom Slurm shows every
    job) with a text rendered under ``key``.

    Rows exist only for settled jobs (the collector writes them for those), and the row is
    deleted with its job's other rows when the job is stored again. As in
    ``service.answer_from_store``, a plain id that is also an array's id is not answered here.
    Never raises: any problem (no such table yet, a locked or unreadable file) is ``None``, and
    the caller takes the full path, which reports real errors properly."""
    if not typed_ids:
        return None
    import sqlite3  # here: the report-file path imports this module for render_key alone

    wanted = list(dict.fromkeys(typed_ids))
    column = "r.colour" if colour else "r.plain"
    marks = ",".join("?" * len(wanted))
    try:
        conn = sqlite3.connect(readonly_uri(path), uri=True, timeout=5.0)
    except sqlite3.Error:
        return None
    try:
        rows = conn.execute(
            f"SELECT r.typed_id, r.render_key, {column}, j.job_id, j.array_job_id "
            "FROM job_reports r JOIN jobs j ON j.job_id = r.job_id "
            f"WHERE r.typed_id IN ({marks}) AND (j.uid = ? OR ? = 0)",
            (*wanted, caller_uid, caller_uid),
        ).fetchall()
        texts: dict[str, str] = {}
        for typed, row_key, text, job_id, array_job_id in rows:
            if row_key != key or typed in texts or (array_job_id is not None and typed == job_id):
                return None
            texts[typed] = text
        if len(texts) != len(wanted):
            return None
        plain = [t for t in wanted if "_" not in t and "+" not in t]
        if plain:
            # A plain id that is also an array's id names the whole array: accounting's.
            (arrays,) = conn.execute(
                f"SELECT count(*) FROM jobs WHERE array_job_id IN ({','.join('?' * len(plain))})",
                plain,
            ).fetchone()
            if arrays:
                return None
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    return [texts[t] for t in typed_ids]


def read_cached_pg(
    conninfo: str, typed_ids: Sequence[str], caller_uid: int, key: str, *, colour: bool
) -> list[str] | None:
    """As ``read_cached``, from a PostgreSQL store through libpq (``slurm_gpu.store.libpq``),
    connected as the caller's own role: row-level security applies on top of the uid test."""
    if not typed_ids:
        return None
    from slurm_gpu.store import libpq

    wanted = list(dict.fromkeys(typed_ids))
    column = "r.colour" if colour else "r.plain"
    marks = ",".join(f"${i + 1}" for i in range(len(wanted)))
    n = len(wanted)
    rows = libpq.query(
        conninfo,
        f"SELECT r.typed_id, r.render_key, {column}, j.job_id, j.array_job_id, "
        "(SELECT count(*) FROM jobs a WHERE a.array_job_id = r.typed_id) "
        "FROM job_reports r JOIN jobs j ON j.job_id = r.job_id "
        f"WHERE r.typed_id IN ({marks}) AND (j.uid = ${n + 1} OR ${n + 1} = 0)",
        [*wanted, str(caller_uid)],
    )
    if rows is None:
        return None
    texts: dict[str, str] = {}
    for typed, row_key, text, job_id, array_job_id, arrays in rows:
        if row_key != key or typed is None or text is None or typed in texts:
            return None
        # A plain id that is also an array's id names the whole array: accounting's.
        if (array_job_id is not None and typed == job_id) or arrays != "0":
            return None
        texts[typed] = text
    if len(texts) != len(wanted):
        return None
    return [texts[t] for t in typed_ids]
