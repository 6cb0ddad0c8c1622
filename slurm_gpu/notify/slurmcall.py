"""What slurmctld gives its ``MailProg``, read by position and cleaned where it enters.

slurmctld (``_mail_proc`` in ``src/slurmctld/agent.c``, 22.05 and later) runs
``MailProg -s SUBJECT USER``: exactly three arguments, where SUBJECT holds the job's name and
USER is ``--mail-user`` verbatim, both chosen by the job's owner. So nothing here is parsed as
an option: the rendered wrapper puts the (root-owned) configuration path in front, and the
rest must be ``-s``, a subject and one recipient, in that order. A recipient that is not one
plain address or user name (or a comma-separated list of them, which mail programs accept) is
refused, never handed on: ``--config=/home/eve/x.toml`` is data, and as data it is not an
address.

The environment is reduced to Slurm's job variables (``SLURM_*``), each value cleaned and
bounded, plus a fixed ``PATH``; nothing else of the caller's environment reaches the mail
program, its libraries or the fallback mail program.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slurm_gpu.errors import UsageError
from slurm_gpu.textsafe import clean_user_text

#: The ``PATH`` the mail program and the fallback mail program run with (slurmctld gives none).
SAFE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"

#: One address or user name: it starts with a letter or digit (so it can never read as an
#: option), and holds no space, comma, angle bracket, quote, pipe or slash (mail(1) treats
#: ``|cmd`` and ``/file`` recipients as a command to run or a file to write).
ADDRESS_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._%+\-]*(@[A-Za-z0-9][A-Za-z0-9.\-]*)?")

#: Longest recipient argument kept, in characters (RFC 5321 bounds an address at 254).
RECIPIENT_MAX = 1000

#: Longest subject kept, in characters (Slurm's own are under 200).
SUBJECT_MAX = 512

#: Names of the environment variables kept, and how many of them.
_ENV_NAME_RE = re.compile(r"SLURM_[A-Z0-9_]{1,64}")
ENV_MAX_VARS = 64
ENV_VALUE_MAX = 1024


@dataclass(frozen=True, slots=True)
class MailProgCall:
    """One call as the rendered wrapper makes it: ``CONFIG -s SUBJECT USER``."""

    config_path: str
    subject: str
    """Cleaned of control characters and bounded (``SUBJECT_MAX``)."""
    recipient: str
    """Exactly as Slurm passed it; check ``valid_recipient`` before any use."""
    legacy: bool = False
    """Called as ``--config CONFIG -s SUBJECT USER`` by a wrapper rendered before this form."""


def parse_mailprog_argv(argv: Sequence[str]) -> MailProgCall:
    """Split ``CONFIG -s SUBJECT USER`` by position; ``UsageError`` for anything else.

    The wrapper of an older release passed ``--config CONFIG`` first; that form is read by
    position too (the flag is fixed text in the root-owned wrapper, never from Slurm).
    """
    args = list(argv)
    legacy = len(args) == 5 and args[0] == "--config"
    if legacy:
        args = args[1:]
    if len(args) != 4 or args[1] != "-s" or not args[0].startswith("/"):
        raise UsageError(
            f"expected CONFIG -s SUBJECT USER (as slurmctld calls MailProg), got {len(argv)} "
            "argument(s)",
            hint="run the mail program only through the rendered wrapper "
            "(share/mailprog/render); for admin work use `slurm-gpu mail`",
        )
    return MailProgCall(
        config_path=args[0],
        subject=clean_user_text(args[2], SUBJECT_MAX),
        recipient=args[3],
        legacy=legacy,
    )


def valid_recipient(text: str) -> bool:
    """Whether ``text`` is one address or user name, or a comma-separated list of them."""
    if not text or len(text) > RECIPIENT_MAX:
        return False
    # Refused outright, whatever the pattern: a newline or CR would split the mail program's
    # argv or headers further down (``fullmatch``, since ``$`` matches before a final "\n").
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in text):
        return False
    return all(ADDRESS_RE.fullmatch(part) for part in text.split(","))


def shown(text: str) -> str:
    """``text`` made safe for one log line (control characters replaced, at most 80)."""
    return clean_user_text(text, 80)


def job_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """Slurm's job variables of ``environ`` (``SLURM_*``), values cleaned and bounded, and the
    fixed ``PATH``: the whole environment the mail program keeps and passes on."""
    kept: dict[str, str] = {}
    for name in sorted(environ):
        if len(kept) >= ENV_MAX_VARS:
            break
        if _ENV_NAME_RE.fullmatch(name):
            kept[name] = clean_user_text(environ[name], ENV_VALUE_MAX)
    kept["PATH"] = SAFE_PATH
    return kept
