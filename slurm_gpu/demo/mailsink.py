"""A loopback SMTP server for the demo: every message it accepts is saved as an ``.eml`` file.

The demo cluster's ``[mail]`` points at it, so the demo's e-mails take the same SMTP path a site's
mail relay would see, and the reader can open them in any mail client afterwards.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any

from slurm_gpu.errors import UsageError

_UNSAFE = re.compile(r"[^A-Za-z0-9@._-]+")


class _SaveHandler:
    """aiosmtpd handler: write the raw message, as received, to ``NNNN-<recipient>.eml``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.saved: list[Path] = []
        self._lock = threading.Lock()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        rcpt = _UNSAFE.sub("_", ",".join(envelope.rcpt_tos))[:80] or "unknown"
        data = envelope.original_content or b""
        with self._lock:
            path = self.directory / f"{len(self.saved) + 1:04d}-{rcpt}.eml"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            self.saved.append(path)
        return "250 Message accepted for delivery"


class EmlSink:
    """Start with ``start()``, stop with ``stop()``; ``saved`` lists the files written so far."""

    def __init__(self, directory: str | Path, *, host: str = "127.0.0.1", port: int = 8025):
        self.directory = Path(directory)
        self.host = host
        self.port = port
        self._handler = _SaveHandler(self.directory)
        self._controller: Any = None

    @property
    def saved(self) -> list[Path]:
        return list(self._handler.saved)

    def start(self) -> None:
        """Listen on ``host:port``. Raises ``UsageError`` when aiosmtpd is missing or the port
        is taken."""
        try:
            from aiosmtpd.controller import Controller
        except ImportError:
            raise UsageError(
                "the demo's SMTP sink needs aiosmtpd",
                hint="install the test extra: pip install -e '.[test]'",
            ) from None
        self.directory.mkdir(parents=True, exist_ok=True)
        controller = Controller(self._handler, hostname=self.host, port=self.port)
        try:
            controller.start()
        except (OSError, RuntimeError) as exc:
            raise UsageError(
                f"cannot listen on {self.host}:{self.port} for the demo's e-mails ({exc})",
                hint="is another demo running? or set [mail] smtp_port to a free port",
            ) from None
        self._controller = controller

    def stop(self) -> None:
        if self._controller is not None:
            self._controller.stop()
            self._controller = None
