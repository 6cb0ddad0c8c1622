"""The words of findings: ``templates/findings/<CODE>.j2``, each with a ``title`` and a
``text`` block, rendered with the finding's evidence as ``ev``.

This module only renders: the caller (a composition root) builds the jinja2 ``Environment``
with a loader for the site's template directory, so the analysis itself reads no file.
"""

from __future__ import annotations

from typing import Any

import jinja2

from slurm_gpu.analysis.findings import Finding


def _hms(seconds: Any) -> str:
    if seconds is None:
        return "n/a"
    total = round(float(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    hms = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{hms}" if days else hms


def _gib(nbytes: Any) -> str:
    return "n/a" if nbytes is None else f"{float(nbytes) / 1024**3:.1f} GiB"


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):.0f} %"


def _hours(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):.2f}"


FILTERS = {"hms": _hms, "gib": _gib, "pct": _pct, "hours": _hours}


def environment(loader: jinja2.BaseLoader) -> jinja2.Environment:
    """A jinja2 environment for finding templates: plain text, strict about unknown names."""
    env = jinja2.Environment(
        loader=loader,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=False,
    )
    env.filters.update(FILTERS)
    return env


def template_name(code: str) -> str:
    """The template file of a finding code."""
    return f"{code}.j2"


def wording(env: jinja2.Environment, finding: Finding) -> tuple[str, str]:
    """(title, text) of a finding. Raises ``jinja2.TemplateNotFound`` for a code without one."""
    template = env.get_template(template_name(finding.code.value))
    ctx = template.new_context(
        {
            "ev": dict(finding.evidence),
            "subject": finding.subject,
            "code": finding.code.value,
            "cause": finding.cause,
            "severity": finding.severity.value,
            "profiler": finding.profiler_command,
        }
    )
    title = "".join(template.blocks["title"](ctx)).strip()
    text = "".join(template.blocks["text"](ctx)).strip()
    return title, text
