"""The exposition written as a file for node_exporter's textfile collector.

The file names every running job's user, account and job id, so it is not for other users:
mode 0600 (root's alone), or 0640 with the group of the account node_exporter runs as
(Debian's ``prometheus-node-exporter`` runs as ``prometheus``, and its textfile collector
must read the file). Written atomically: a temporary file in the same directory, created
0600, its group and mode set before the rename, so no reader ever sees a partial file or a
wider mode.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

#: The file's mode without a group to share it with, and with one.
PRIVATE_MODE = 0o600
GROUP_MODE = 0o640


def write_private(data: bytes, path: str, gid: int | None = None) -> None:
    """Write ``data`` to ``path`` atomically, mode 0600, or 0640 with group ``gid``.
    Raises ``OSError``."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".slurm-gpu-", suffix=".prom.tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            if gid is not None:
                os.fchown(fh.fileno(), -1, gid)
            os.fchmod(fh.fileno(), PRIVATE_MODE if gid is None else GROUP_MODE)
            fh.write(data)
            fh.flush()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
