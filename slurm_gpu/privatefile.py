"""New private files at paths an administrator names on the command line.

``slurm-gpu store export --out FILE``, ``slurm-gpu mail --dry-run DIR`` and ``slurm-gpu police
--mail-dir DIR`` run as root and write every user's jobs. Opening the given name with
``open(path, "w")`` follows a link a user left there (``/tmp/out.csv -> /etc/shadow``:
root truncates and overwrites its target) and creates the file with the umask (0644: every
user reads every user's jobs). Here a file is only ever created, never reused: ``O_CREAT|
O_EXCL`` (which also refuses a link in the last component, dangling or not), ``O_NOFOLLOW``,
mode 0600 set on the descriptor whatever the umask. In a directory argument the directory is
opened once without following a link (made 0700 when missing) and files are created inside
it by descriptor, so a name swapped after the check cannot redirect them.
"""

from __future__ import annotations

import contextlib
import os

#: Mode of every file made here: the caller's alone.
PRIVATE_MODE = 0o600
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def create_private(name: str, *, dir_fd: int | None = None) -> int:
    """A write descriptor of a new file ``name`` (relative to ``dir_fd`` when given), mode
    0600. Raises ``FileExistsError`` when anything (a file, a link) has that name, and
    ``OSError`` otherwise."""
    fd = os.open(name, _CREATE, PRIVATE_MODE, dir_fd=dir_fd)
    try:
        os.fchmod(fd, PRIVATE_MODE)  # the umask may only have narrowed it; say it exactly
    except OSError:
        os.close(fd)
        raise
    return fd


def open_out_dir(path: str) -> int:
    """A descriptor of directory ``path`` (made 0700 when missing), its last component not
    followed if it is a link. Raises ``OSError`` (``ELOOP``/``ENOTDIR`` for a link or a
    file in its place)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    return os.open(path, _DIR)


#: First characters that make a spreadsheet read a cell as a formula (or strip them).
FORMULA_LEADS = ("=", "+", "-", "@", "\t", "\r")


def neutralise_cell(value: str) -> str:
    """``value`` with a ``'`` in front when a spreadsheet would take it for a formula
    (OWASP's CSV injection rule); other text unchanged."""
    return "'" + value if value.startswith(FORMULA_LEADS) else value
