"""Which store URLs are plain SQLite files (standard library only: ``gpueff``'s fast path
reads them without SQLAlchemy)."""

from __future__ import annotations

from slurm_gpu.textsafe import has_password

_SQLITE_PREFIXES = ("sqlite:///", "sqlite+pysqlite:///")


def sqlite_path(url: str) -> str | None:
    """The database file of a plain SQLite store URL; ``None`` for any other URL (PostgreSQL,
    in-memory, URI file names, URLs with query options), which keep the SQLAlchemy path."""
    for prefix in _SQLITE_PREFIXES:
        if url.startswith(prefix):
            path = url[len(prefix) :]
            if not path or path == ":memory:" or path.startswith("file:") or "?" in path:
                return None
            return path
    return None


def readonly_uri(path: str) -> str:
    """The ``sqlite3`` URI (``uri=True``) that opens the file at ``path`` read-only: a user
    who may read the file but not write its directory can open it (``docs/store.md``)."""
    from urllib.parse import quote

    return f"file:{quote(path)}?mode=ro"


_PG_PREFIXES = ("postgresql+psycopg://", "postgresql://", "postgres://")


def libpq_conninfo(url: str) -> str | None:
    """The libpq connection URI of a PostgreSQL store URL without a password (users connect
    as themselves: peer or GSSAPI), for ``gpueff``'s fast path; ``None`` for any other URL,
    and for one that carries a password (such a URL is the collector's, not a user's)."""
    for prefix in _PG_PREFIXES:
        if url.startswith(prefix):
            if has_password(url):
                return None
            return "postgresql://" + url[len(prefix) :]
    return None
