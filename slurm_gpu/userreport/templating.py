"""Jinja2 environments for the user-facing templates (terminal and e-mail).

Templates live in the project's ``templates/`` directory; a site may point a config key
(``gpueff.template_dir``, ``mail.template_dir``) at a directory holding files of the same
names, which then win over the built-in ones, file by file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jinja2

from slurm_gpu.errors import ConfigError
from slurm_gpu.userreport import fmt

#: The project's built-in templates (``<repo>/templates``).
BUILTIN_DIR = Path(__file__).resolve().parents[2] / "templates"


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


def environment(
    subdir: str,
    *,
    override_dir: str = "",
    autoescape: bool | Callable[[str | None], bool] = False,
    extra_filters: Mapping[str, Callable[..., Any]] | None = None,
) -> jinja2.Environment:
    """An environment loading ``<override_dir>`` first, then ``templates/<subdir>``.

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
    )
    env.filters.update(filters())
    if extra_filters:
        env.filters.update(extra_filters)
    return env
