"""HTTP basic authentication to a Prometheus that asks for it (its ``--web.config.file``).

The user is named in ``live.prometheus_url`` (``http://user@host:9090``); the password is in
``live.prometheus_password_file``, or in the URL itself (``http://user:password@host:9090``)
when the configuration file is readable by root alone (``slurm-gpu doctor`` fails a password
in a file every user reads, as for ``store.url``). The password file is read as privileged code
reads its configuration (``slurm_gpu.trust``): a regular file, root's, that no other account
can write or replace; at most ``MAX_PASSWORD_BYTES``. Imports the standard library and
``trust`` only.
"""

from __future__ import annotations

import base64
import os
import urllib.parse

from slurm_gpu.errors import ConfigError
from slurm_gpu.trust import require_trusted_fd

#: Largest password file read, bytes.
MAX_PASSWORD_BYTES = 4096
#: The setting that names the password file (messages name it).
PASSWORD_FILE_KEY = "live.prometheus_password_file"


def split_credentials(url: str) -> tuple[str, str | None, str | None]:
    """``url`` without its user part, and the user and password it named (percent-decoded),
    ``None`` for what it did not name."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url, None, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, sep, password = userinfo.partition(":")
    bare = urllib.parse.urlunsplit(parts._replace(netloc=hostport))
    return (
        bare,
        urllib.parse.unquote(user),
        urllib.parse.unquote(password) if sep else None,
    )


def read_password_file(path: str) -> str:
    """The password in ``path`` (its first line, without the line end); ``ConfigError`` when
    the file is not trusted, cannot be read, or is empty."""
    try:
        fd = require_trusted_fd(path, key=PASSWORD_FILE_KEY)
    except ConfigError:
        if os.geteuid() != 0:
            raise ConfigError(
                f"{path} is not readable by this account",
                key=PASSWORD_FILE_KEY,
                hint="a Prometheus behind a password answers the administrators' commands "
                "(run as root); ask your administrators",
            ) from None
        raise
    try:
        data = os.read(fd, MAX_PASSWORD_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {path} ({exc.strerror})", key=PASSWORD_FILE_KEY) from None
    finally:
        os.close(fd)
    if len(data) > MAX_PASSWORD_BYTES:
        raise ConfigError(
            f"{path} is longer than {MAX_PASSWORD_BYTES} bytes",
            key=PASSWORD_FILE_KEY,
            hint="the file holds the password alone, on one line",
        )
    password = data.decode("utf-8", "replace").split("\n", 1)[0].rstrip("\r")
    if not password:
        raise ConfigError(
            f"{path} holds no password",
            key=PASSWORD_FILE_KEY,
            hint="write the password on the file's first line",
        )
    return password


def basic_header(user: str, password: str) -> str:
    """The ``Authorization`` header's value for ``user`` and ``password``."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return f"Basic {token}"
