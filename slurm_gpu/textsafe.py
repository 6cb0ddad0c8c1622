"""Cleaning of strings that users control, where they enter the program.

Job names, comments, working directories, host names and GPU names read from a user-writable
file reach terminals (escape sequences), HTML (markup) and mail headers (CR/LF). Each is cleaned
once, where it is read, by ``clean_user_text``: control characters (C0 including ESC and CR/LF,
DEL, C1) and the Unicode bidirectional overrides and isolates (which reorder what a reader sees)
are replaced, and the length is bounded. HTML escaping stays the templates' job (jinja2
autoescape); this removes what no escaping makes safe everywhere.

A URL from the configuration is shown to people (``config show``, ``doctor``, errors, the live
view's header) by ``without_password``, which hides the password of its user part.
"""

from __future__ import annotations

import re

#: Default bound on a cleaned string, in characters.
MAX_LEN = 1024

#: C0 controls (tab kept out too: it breaks column layouts), DEL, C1 controls, and the bidi
#: embedding/override/isolate characters (U+202A-U+202E, U+2066-U+2069) plus the line and
#: paragraph separators that some terminals and mail readers treat as a newline.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")

#: What an unsafe character becomes (U+FFFD, visibly "something was here").
REPLACEMENT = "\ufffd"


def clean_user_text(value: str, max_len: int = MAX_LEN) -> str:
    """``value`` with unsafe characters replaced and at most ``max_len`` characters ("…" ends
    a cut string)."""
    if len(value) > max_len:
        value = value[: max(0, max_len - 1)] + "…"
    return _UNSAFE.sub(REPLACEMENT, value)


def clean_command_message(stderr: str, max_len: int = 200) -> str:
    """What a command (``squeue``, ``scontrol``) printed on failing, for a one-line error: its
    non-empty lines stripped and joined by "; " (the newline each ends with is not an unsafe
    character to mark), then ``clean_user_text``; "no message" when it printed nothing."""
    lines = [line.strip() for line in stderr.splitlines()]
    return clean_user_text("; ".join(line for line in lines if line) or "no message", max_len)


def clean_optional(value: str | None, max_len: int = MAX_LEN) -> str | None:
    """``clean_user_text`` that passes None through."""
    return None if value is None else clean_user_text(value, max_len)


def without_password(url: str) -> str:
    """``url`` with the password of its user part shown as ``***`` (``config show``,
    ``doctor``, logs); anything else, and a string that is no URL, unchanged."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, tail = rest.partition("/")
    user, at, host = authority.rpartition("@")
    if not at or ":" not in user:
        return url
    return f"{scheme}://{user.split(':', 1)[0]}:***@{host}{slash}{tail}"


def has_password(url: str) -> bool:
    """Whether ``url`` carries a password in its user part."""
    return without_password(url) != url
