"""Typed errors of slurm-gpu.

Below the CLI nothing prints or exits: code raises one of these, and the CLI maps each class to
one documented exit code and a one-line message with a hint (``slurm_gpu.cli.common``). The
hooks are the exception: they catch everything, log it with the job id, and exit 0.
"""

from __future__ import annotations


class SlurmGpuError(Exception):
    """Base class of every error this project raises on purpose.

    ``hint`` tells the reader what to do next; it is printed after the message.
    """

    exit_code: int = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message

    def lines(self, prog: str) -> str:
        """What an entry point prints for this error: ``prog: message`` and, when there is
        one, ``hint: …``, each ending with a newline."""
        hint = f"hint: {self.hint}\n" if self.hint else ""
        return f"{prog}: {self.message}\n{hint}"


class UsageError(SlurmGpuError):
    """The command line itself is wrong (click also uses exit code 2 for this)."""

    exit_code = 2


class ConfigError(SlurmGpuError):
    """The configuration file is missing, unreadable, or holds a bad value.

    ``key`` is the dotted key (``telemetry.interval_s``) and ``path`` the file, when known.
    """

    exit_code = 3

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        path: str | None = None,
        hint: str | None = None,
    ) -> None:
        where = ""
        if key and path:
            where = f"{path}: {key}: "
        elif path:
            where = f"{path}: "
        elif key:
            where = f"{key}: "
        super().__init__(where + message, hint=hint)
        self.key = key
        self.path = path


class JobNotFoundError(SlurmGpuError):
    """Slurm accounting has no such job, or does not show it to the calling user."""

    exit_code = 4


class AccountingError(SlurmGpuError):
    """Slurm accounting could not be asked (sacct missing, slurmdbd down, timeout).

    ``stderr`` holds what the accounting command printed, when there was one.
    """

    exit_code = 5

    def __init__(self, message: str, *, stderr: str = "", hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.stderr = stderr


class StoreError(SlurmGpuError):
    """The store (SQLite file or PostgreSQL server) cannot be opened, migrated or written."""

    exit_code = 6


class StoreDeniedError(StoreError):
    """This account may not open the store (it is root's and ``[store] admin_group``'s)."""


class StoreNotReadyError(StoreError):
    """The store is not ready for this release yet (not created, or behind its schema); the
    collector's next pass fixes either. The mail program waits for it like for a record."""


class StoreBehindError(StoreNotReadyError):
    """The store's schema is behind this release: the collector migrates it at its next pass."""


class StoreNotCreatedError(StoreNotReadyError):
    """The SQLite store file does not exist yet: no collection has run since installation.
    Readers that wait for a record (the mail program) treat it like a record not stored yet."""


class TelemetryUnavailableError(SlurmGpuError):
    """No GPU telemetry can be read at all (NVML library missing, driver not loaded, no
    virtual GPU directory). A single lost GPU or unsupported field is *not* this error: it is
    reported in the sample as ``available=False`` or ``None``."""

    exit_code = 7


class SpoolFormatError(SlurmGpuError):
    """A spool file or sealed record is corrupt or has a schema version this reader does not
    know. The collector quarantines such files instead of stopping."""

    exit_code = 8


class MailError(SlurmGpuError):
    """A message could not be handed to the SMTP server or the local sendmail."""

    exit_code = 9


#: Exit codes, documented in docs/cli.md; the CLI tests check that the table and the classes
#: agree.
EXIT_CODES: dict[str, int] = {
    "ok": 0,
    "unexpected error": 1,
    "usage": UsageError.exit_code,
    "bad configuration": ConfigError.exit_code,
    "job not found": JobNotFoundError.exit_code,
    "accounting unavailable": AccountingError.exit_code,
    "store unavailable": StoreError.exit_code,
    "telemetry unavailable": TelemetryUnavailableError.exit_code,
    "corrupt spool or record": SpoolFormatError.exit_code,
    "mail not sent": MailError.exit_code,
}
