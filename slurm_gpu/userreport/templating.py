"""Jinja2 environments for the user-facing templates (terminal and e-mail).

Templates live in the project's ``templates/`` directory; a site may point a config key
(``gpueff.template_dir``, ``mail.template_dir``) at a directory holding files of the same
names, which then win over the built-in ones, file by file.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jinja2

from slurm_gpu.errors import ConfigError
from slurm_gpu.resources import data_dir
from slurm_gpu.userreport import fmt

#: The project's built-in templates (``<repo>/templates``).
BUILTIN_DIR = data_dir("templates")


def filters() -> dict[str, Callable[..., Any]]:
    """The formatting filters every template can use."""
    return {
        "duration": fmt.duration,
        "size": fmt.size,
        "pct": fmt.pct,
        "watts": fmt.watts,
        "energy": fmt.energy,
        "hours": fmt.hours,
        "bar": fmt.bar,
        "spark": fmt.sparkline,
        "clean": fmt.clean,
    }


class _QuietBytecodeCache(jinja2.FileSystemBytecodeCache):
    """jinja2's per-user cache of compiled templates; one that cannot be read or written is
    skipped, never an error (the template is then compiled as without a cache)."""

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except OSError:
            bucket.reset()

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        with contextlib.suppress(OSError):
            super().dump_bytecode(bucket)


def compiled_cache() -> jinja2.BytecodeCache | None:
    """A cache of compiled templates for short-lived commands (``gpueff``), or ``None``.

    Compiling the report templates costs about 20 ms per run, a sixth of what ``gpueff``
    takes. jinja2's file cache keeps the compiled code in ``<tmp>/_jinja2-cache-<uid>``,
    which it creates mode 0700 and refuses to use unless it is the caller's own 0700
    directory (another user cannot plant code in it). An entry is used only when the
    checksum of the template source, the jinja2 version and the Python version match, so an
    edited template is compiled afresh. ``None`` (no cache) when the directory is unsafe or
    cannot be made.
    """
    try:
        return _QuietBytecodeCache(pattern="slurm-gpu-%s.cache")
    except (OSError, RuntimeError):
        return None


def environment(
    subdir: str,
    *,
    override_dir: str = "",
    autoescape: bool | Callable[[str | None], bool] = False,
    extra_filters: Mapping[str, Callable[..., Any]] | None = None,
    cache: bool = False,
) -> jinja2.Environment:
    """An environment loading ``<override_dir>`` first, then ``templates/<subdir>``; with
    ``cache``, compiled templates are kept in ``compiled_cache()``.

    Raises ``ConfigError`` when ``override_dir`` is given but is not a directory.
    """
    paths: list[str] = []
    if override_dir:
        if not Path(override_dir).is_dir():
            raise ConfigError(
                f"template override directory {override_dir} does not exist",
                hint="create it or leave the template_dir setting empty",
            )
        paths.append(override_dir)
    paths.append(str(BUILTIN_DIR / subdir))
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(paths),
        autoescape=autoescape,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        bytecode_cache=compiled_cache() if cache else None,
    )
    env.filters.update(filters())
    if extra_filters:
        env.filters.update(extra_filters)
    return env
