"""Jinja2 environments for the user-facing templates (terminal and e-mail).

Templates live in the project's ``templates/`` directory; a site may point a config key
(``gpueff.template_dir``, ``mail.template_dir``) at a directory holding files of the same
names, which then win over the built-in ones, file by file.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jinja2

from slurm_gpu.analysis import energy as energy_fmt
from slurm_gpu.errors import ConfigError
from slurm_gpu.jobreport import fmt
from slurm_gpu.resources import data_dir

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
        "energy_summary": energy_fmt.summary_text,
        "co2": energy_fmt.co2_text,
        "energy_total": fmt.energy_total,
        "energy_unit": fmt.energy_unit,
        "hours": fmt.hours,
        "bar": fmt.bar,
        "spark": fmt.sparkline,
        "clean": fmt.clean,
        "live_action": fmt.live_action,
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
    takes. The compiled code is kept in ``<tmp>/slurm-gpu-jinja2-<uid>``, which only its
    owner may use (``private_cache_dir``). An entry is used only when the checksum of the
    template source, the jinja2 version and the Python version match, so an edited template
    is compiled afresh. ``None`` (no cache) when running as root, or when the directory is
    unsafe or cannot be made.

    Root gets no cache: the temporary directory is shared with every account (and named by
    ``TMPDIR``, which the caller sets), and jinja2's own default directory logic chmods its
    ``<tmp>/_jinja2-cache-<uid>`` through the name, so a symbolic link planted there would
    make root chmod the link's target (where ``fs.protected_symlinks`` is 0). Root's commands
    are rare enough to compile their templates each time.
    """
    if os.geteuid() == 0:
        return None
    directory = private_cache_dir()
    if directory is None:
        return None
    return _QuietBytecodeCache(directory, pattern="slurm-gpu-%s.cache")


def private_cache_dir() -> str | None:
    """``<tmp>/slurm-gpu-jinja2-<euid>``, created mode 0700, if it is a real directory (not a
    link) owned by the caller with mode 0700; else ``None``. Nothing is ever changed through
    the name: a directory someone else made, or made differently, is simply not used. In a
    sticky temporary directory only its owner can rename or remove it afterwards."""
    uid = os.geteuid()
    path = os.path.join(tempfile.gettempdir(), f"slurm-gpu-jinja2-{uid}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or stat.S_IMODE(st.st_mode) != 0o700:
        return None
    return path


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
