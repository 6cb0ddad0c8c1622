"""Build the e-mail after a job: text + HTML (multipart/alternative) with inline PNG charts.

Structure of a message with charts::

    multipart/alternative
      text/plain
      multipart/related
        text/html           (<img src="cid:...">)
        image/png           (Content-ID, inline)

Mail clients drop SVG and external images, so charts are PNG parts referenced by Content-ID.

Every user-controlled string (job name, paths, comments) reaches the HTML through jinja2's
autoescape, and the headers through ``email.message.EmailMessage`` whose policy refuses CR and
LF in a header value; the subject is also cleaned here, so a job named
``x\\r\\nBcc: evil@example.org`` produces a harmless subject and no extra recipient.
"""

from __future__ import annotations

import email.policy
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid

from slurm_gpu.errors import MailError
from slurm_gpu.jobreport import fmt
from slurm_gpu.jobreport.charts import Chart
from slurm_gpu.jobreport.model import JobReport
from slurm_gpu.jobreport.templating import environment

#: SMTP policy (CRLF line endings) that also refuses header values with line breaks.
POLICY = email.policy.SMTP.clone(raise_on_defect=True, max_line_length=78)

#: Subject length kept; RFC 5322 recommends lines under 78 characters.
SUBJECT_MAX = 150

#: One plain address or user name (the MailProg's own check, plus a dotted domain).
_ADDRESS_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._%+\-]*(@[A-Za-z0-9.\-]+\.[A-Za-z]{2,})?")


@dataclass(frozen=True, slots=True)
class MailContext:
    """What the templates need beyond the reports."""

    docs_url: str = ""
    gpueff_command: str = "gpueff"
    site_name: str = "the cluster"


def clean_subject(text: str) -> str:
    """A subject line without control characters (CR, LF, TAB, ESC …), at most ``SUBJECT_MAX``."""
    flat = re.sub(r"[\x00-\x1f\x7f-\x9f]+", " ", text)
    flat = re.sub(r"\s+", " ", flat).strip()
    if len(flat) > SUBJECT_MAX:
        flat = flat[: SUBJECT_MAX - 1].rstrip() + "…"
    return flat


def recipient_address(user: str, domain: str) -> str:
    """``user`` as an address: kept when it has a domain, else ``user@domain`` when one is set.

    Raises ``MailError`` for anything that is not a plain address (spaces, commas, angle
    brackets, line breaks): Slurm passes ``--mail-user`` through unchecked.
    """
    user = user.strip()
    if not _ADDRESS_RE.fullmatch(user):
        raise MailError(
            f"refusing recipient {fmt.clean(user)!r}: not a plain e-mail address or user name",
            hint="--mail-user must be a single address such as alice@example.org",
        )
    if "@" not in user and domain:
        return f"{user}@{domain}"
    return user


def subject_for(reports: Sequence[JobReport], original: str = "") -> str:
    """The subject: Slurm's own (cleaned) with the GPU verdict, or a digest summary."""
    if len(reports) == 1:
        r = reports[0]
        head = original or f"Slurm Job_id={r.job_id_display} Name={r.job_name} {r.state}"
        if r.has_gpu_numbers and r.duty_mean_pct is not None:
            head += f" - GPUs {r.duty_mean_pct:.0f}% busy"
        return clean_subject(head)
    wasted = sum(r.gpu_hours_wasted or 0.0 for r in reports)
    first = reports[0]
    if first.array_job_id and all(r.array_job_id == first.array_job_id for r in reports):
        what = f"array {first.array_job_id}: {len(reports)} tasks"
    else:
        what = f"{len(reports)} jobs"
    return clean_subject(f"Slurm GPU digest, {what}, {fmt.hours(wasted)} GPU-hours idle")


def _is_html_template(name: str | None) -> bool:
    """Autoescape every HTML template (the text part must stay unescaped)."""
    return bool(name and ".html" in name)


class MessageBuilder:
    """Renders ``templates/mail`` (or a site's override) into ``EmailMessage`` objects."""

    def __init__(
        self,
        *,
        from_address: str,
        context: MailContext,
        template_dir: str = "",
        charts: Callable[[JobReport], Sequence[Chart]] | None = None,
    ) -> None:
        self._from = from_address
        self._ctx = context
        self._charts = charts
        self._html = environment(
            "mail",
            override_dir=template_dir,
            autoescape=lambda name: bool(name and ".html" in name),
        )

    def build(
        self,
        reports: Sequence[JobReport],
        *,
        to: str,
        original_subject: str = "",
        now_s: float | None = None,
    ) -> EmailMessage:
        """One message about one job (``len(reports) == 1``) or a digest of several."""
        if not reports:
            raise ValueError("a message needs at least one report")
        digest = len(reports) > 1
        charts: list[Chart] = []
        chart_cids: dict[str, list[Chart]] = {}
        if self._charts is not None:
            for r in reports[:1] if digest else reports:
                made = list(self._charts(r))
                chart_cids[r.job_id] = made
                charts.extend(made)
        values = {
            "reports": reports,
            "r": reports[0],
            "digest": digest,
            "ctx": self._ctx,
            "charts": chart_cids,
            "total_idle_gpu_hours": sum(r.gpu_hours_wasted or 0.0 for r in reports),
            "total_gpu_hours": sum(r.gpu_hours_allocated for r in reports),
            "total_energy_j": sum(r.energy_j or 0.0 for r in reports) or None,
        }
        text = self._html.get_template("job.txt.j2").render(**values)
        html = self._html.get_template("job.html.j2").render(**values)

        msg = EmailMessage(policy=POLICY)
        try:
            msg["From"] = self._from
            msg["To"] = Address(addr_spec=to) if "@" in to else to
            msg["Subject"] = subject_for(reports, original_subject)
        except (ValueError, TypeError) as exc:
            raise MailError(f"cannot build the message headers: {exc}") from None
        msg["Date"] = format_datetime(datetime.fromtimestamp(now_s or time.time(), UTC))
        msg["Message-ID"] = make_msgid(domain=self._from.rpartition("@")[2] or None)
        msg["Auto-Submitted"] = "auto-generated"
        msg["X-Slurm-Job-Id"] = ",".join(r.job_id_display for r in reports[:20])
        msg.set_content(text)
        msg.add_alternative(html, subtype="html")
        if charts:
            html_part = msg.get_body(("html",))
            assert isinstance(html_part, EmailMessage)
            for chart in charts:
                html_part.add_related(
                    chart.png,
                    maintype="image",
                    subtype="png",
                    cid=f"<{chart.cid}>",
                    filename=f"{chart.cid.split('@')[0]}.png",
                    disposition="inline",
                )
        return msg
