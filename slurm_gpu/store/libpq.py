"""A minimal read-only PostgreSQL client over libpq (``ctypes``), for ``gpueff``'s fast path.

``gpueff JOBID`` on the caller's own finished job prints the report the collector rendered
into ``job_reports``. On SQLite that is one ``sqlite3`` read; importing psycopg for the same
read costs about 0.2 s of CPU (measured on the test machine), more than ``seff`` takes in all.
libpq itself connects over the local socket in milliseconds, so this module loads it with
``ctypes`` and runs one parameterised query. It is used only where it can answer; anything
unexpected (no libpq, a failed connection, an error) returns ``None`` and the caller takes the
full path, which reports real problems properly. Row-level security applies as for any client:
the connection is the caller's own role.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

_CONNECTION_OK = 0
_PGRES_TUPLES_OK = 2

#: The system's libpq (Debian: libpq5, which the PostgreSQL client depends on). Without it
#: the fast path is skipped: psycopg's binary wheel carries a copy, but that is psycopg's.
_CANDIDATES = ("libpq.so.5", "libpq.so")


def _load() -> ctypes.CDLL | None:
    for name in _CANDIDATES:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def query(
    conninfo: str, sql: str, params: Sequence[str], *, timeout_s: int = 5
) -> list[list[str | None]] | None:
    """Rows of ``sql`` (``$1``-style text parameters) as text, or ``None`` on any failure.

    ``conninfo`` is a libpq URI; ``connect_timeout`` bounds the connection."""
    lib = _load()
    if lib is None:
        return None
    lib.PQconnectdb.restype = ctypes.c_void_p
    lib.PQconnectdb.argtypes = [ctypes.c_char_p]
    lib.PQstatus.argtypes = [ctypes.c_void_p]
    lib.PQfinish.argtypes = [ctypes.c_void_p]
    lib.PQexecParams.restype = ctypes.c_void_p
    lib.PQexecParams.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_char_p),
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int,
    ]
    lib.PQresultStatus.argtypes = [ctypes.c_void_p]
    lib.PQntuples.argtypes = [ctypes.c_void_p]
    lib.PQnfields.argtypes = [ctypes.c_void_p]
    lib.PQgetisnull.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.PQgetvalue.restype = ctypes.c_char_p
    lib.PQgetvalue.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.PQclear.argtypes = [ctypes.c_void_p]
    sep = "&" if "?" in conninfo else "?"
    conn = lib.PQconnectdb(f"{conninfo}{sep}connect_timeout={int(timeout_s)}".encode())
    if not conn:
        return None
    try:
        if lib.PQstatus(conn) != _CONNECTION_OK:
            return None
        values = (ctypes.c_char_p * max(1, len(params)))(*(p.encode() for p in params))
        res = lib.PQexecParams(conn, sql.encode(), len(params), None, values, None, None, 0)
        if not res:
            return None
        try:
            if lib.PQresultStatus(res) != _PGRES_TUPLES_OK:
                return None
            rows: list[list[str | None]] = []
            for r in range(lib.PQntuples(res)):
                row: list[str | None] = []
                for c in range(lib.PQnfields(res)):
                    if lib.PQgetisnull(res, r, c):
                        row.append(None)
                    else:
                        row.append(lib.PQgetvalue(res, r, c).decode())
                rows.append(row)
            return rows
        finally:
            lib.PQclear(res)
    finally:
        lib.PQfinish(conn)
