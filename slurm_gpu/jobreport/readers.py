"""The real backends behind ``gpueff``: accounting as the caller, the store, the live spool.

Composition helpers for the CLI. Each import happens inside the function that needs it, and a
SQLite store is read with the standard library: ``gpueff`` never imports SQLAlchemy for it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Final

from slurm_gpu.config import Settings
from slurm_gpu.errors import StoreError, StoreNotReadyError
from slurm_gpu.jobreport import adapter
from slurm_gpu.jobreport.model import Telemetry
from slurm_gpu.records import JobRecord

#: The report draws only GPU utilization from a stored timeline (its sparklines): the store
#: decodes that column alone (``slurm_gpu.store.codec.decode_timeline``).
TIMELINES: Final = "utilization"


def open_store_reader(url: str) -> Any:
    """A read-only view of the store with ``get_job(job_id, timelines=...)``.

    A plain SQLite file is read through ``sqlite_reader`` (the standard library, no
    SQLAlchemy import: 0.4 s saved per ``gpueff``), opened ``mode=ro`` so that any user who may
    read the file can. Other URLs (PostgreSQL) open ``Store``, which never migrates here: a
    store behind this release is the admin's to upgrade. Raises ``StoreError``.
    """
    from slurm_gpu.store.sqlite_reader import SqliteReader, sqlite_path

    path = sqlite_path(url)
    if path is not None:
        return SqliteReader.open(path)
    from slurm_gpu.store.store import Store

    return Store.open(url, migrate=False)


def make_accounting(settings: Settings, *, controller: bool = True) -> Any:
    """The configured accounting source, asking as the calling user, opened at first use;
    ``controller``: the controller is asked first, and a job it shows running is answered by
    ``squeue`` alone (``jobreport.early.open_for_gpueff``)."""
    return LazyAccounting(settings, controller=controller)


class LazyAccounting:
    """``AccountingSource`` that opens the configured source at its first call.

    ``gpueff`` on the caller's own settled job never asks accounting (``service``'s owner
    path), so it should not pay for importing the adapter (``subprocess``, the parser) either.
    It asks without the fields the report does not show (``QOS``), and runs ``sacct``'s
    accounting and text queries at once.
    """

    def __init__(self, settings: Settings, *, controller: bool = True) -> None:
        self._settings = settings
        self._controller = controller
        self._source: Any = None
        self.name: str = settings.accounting.backend

    def _open(self) -> Any:
        if self._source is None:
            from slurm_gpu.jobreport.early import open_for_gpueff

            self._source = open_for_gpueff(self._settings, controller=self._controller)
        return self._source

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        """See ``AccountingSource.get_jobs``."""
        jobs: dict[str, JobRecord] = self._open().get_jobs(job_ids)
        return jobs

    def jobs_between(
        self, start_s: float, end_s: float, users: Sequence[str] | None = None
    ) -> list[JobRecord]:
        """See ``AccountingSource.jobs_between``."""
        jobs: list[JobRecord] = self._open().jobs_between(start_s, end_s, users)
        return jobs


class StoreAndSpoolReader:
    """``TelemetryReader`` over the store (ended jobs) and the live spool (running jobs).

    ``read_stored`` reads the stored jobs an id may name, so that ``service`` can decide
    whether the store alone answers (the caller's own settled job); ``prefetch`` and
    ``prefetch_user`` read ahead and word the findings while accounting is asked. What was
    read is only returned by ``final``, for a job the service decided to report.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        spark_points: int = adapter.SPARK_POINTS,
        cache_templates: bool = False,
        store: Any = None,
        wording: adapter.Wording | None = None,
        answer_uncollected: bool = False,
    ) -> None:
        """``store`` and ``wording``: an open store reader and a findings wording to use
        instead of opening them (the caller keeps and closes the store).
        ``answer_uncollected`` (``gpueff``): ``final`` answers an ended job the store does not
        hold, or a store closed to the caller without their report file, as "not collected
        yet" (``Telemetry.uncollected``, with the node's last live summary where this host
        has it) rather than ``None`` or the store's error; the mail program keeps the default
        and waits for the record."""
        self._answer_uncollected = answer_uncollected
        self._settings = settings
        self._spark_points = spark_points
        self._cache_templates = cache_templates
        self._owns_store = store is None
        self._store: Any = store
        self._wording: adapter.Wording | None = wording
        self._read: set[str] = set()
        self._stored: dict[str, Any] = {}
        self._ahead: dict[str, Telemetry] = {}

    def _words(self) -> adapter.Wording:
        if self._wording is None:
            self._wording = adapter.findings_wording(
                self._settings.gpueff.template_dir, cache=self._cache_templates
            )
        return self._wording

    def _open_store(self) -> Any:
        if self._store is None:
            self._store = open_store_reader(self._settings.store_url)
        return self._store

    def _keep(self, stored: Sequence[Any]) -> None:
        for s in stored:
            self._stored[s.job.job_id] = s

    def _word_all(self) -> None:
        words = self._words()
        for job_id, s in self._stored.items():
            if job_id not in self._ahead:
                self._ahead[job_id] = adapter.telemetry_from_stored(
                    s, words, spark_points=self._spark_points
                )

    def _read_ids(self, ids: Sequence[str]) -> None:
        todo = [i for i in dict.fromkeys(ids) if i not in self._read]
        if not todo:
            return
        store = self._open_store()
        if hasattr(store, "jobs_for_ids"):
            self._keep(store.jobs_for_ids(todo, timelines=TIMELINES))
        else:  # SQLAlchemy store: the plain ids (opening it already overlapped the import)
            found = (store.get_job(i, timelines=TIMELINES) for i in todo if i.isdigit())
            self._keep([s for s in found if s is not None])
        self._read.update(todo)

    def read_stored(self, queries: Sequence[str]) -> tuple[JobRecord, ...]:
        """The stored jobs these accounting queries may name (their stored accounting). Best
        effort: ``()`` when the store cannot be read; ``final`` raises the error if it
        matters."""
        try:
            self._read_ids(queries)
        except Exception:  # the accounting path follows, and final() reports the error
            self._stored.clear()
            return ()
        return tuple(s.job for s in self._stored.values())

    def prefetch(self, ids: Sequence[str]) -> None:
        """Read and word the stored jobs these accounting queries may name. Best effort: an
        error is left for ``final`` to raise, if a job accounting returns needs the store."""
        try:
            self._read_ids(ids)
            self._word_all()
        except Exception:  # read-ahead only: final() raises the error if it matters
            self._stored.clear()
            self._ahead.clear()

    def prefetch_user(self, user: str, since_s: float, until_s: float, limit: int) -> None:
        """Read and word ``user``'s newest ``limit`` stored jobs of the period (SQLite stores;
        others are only opened). Best effort, like ``prefetch``."""
        try:
            store = self._open_store()
            if hasattr(store, "user_jobs"):
                self._keep(
                    store.user_jobs(user, since_s, until_s, limit=limit, timelines=TIMELINES)
                )
                self._word_all()
        except Exception:  # read-ahead only: final() raises the error if it matters
            self._stored.clear()
            self._ahead.clear()

    def _priced(self, tel: Telemetry | None) -> Telemetry | None:
        """``tel`` with the site's ``[energy]`` rates, which price the job's energy, and the
        web page's address (``[web] base_url``)."""
        if tel is None:
            return None
        return replace(
            tel, energy_settings=self._settings.energy, page_base_url=self._settings.web.base_url
        )

    def final(self, job: JobRecord) -> Telemetry | None:
        """The stored record of an ended job, with its findings; ``None`` if not stored."""
        return self._priced(self._final(job))

    def _final(self, job: JobRecord) -> Telemetry | None:
        ahead = self._ahead.get(job.job_id)
        if ahead is not None:
            return ahead
        stored = self._stored.get(job.job_id)
        if stored is None:
            try:
                stored = self._open_store().get_job(job.job_id, timelines=TIMELINES)
            except StoreNotReadyError:
                # Not created or behind this release: the site's state, not this job's (the
                # mail program waits for it like for a record).
                raise
            except StoreError as exc:
                # A store closed to this user: their own job's GPU part from the file the
                # collector wrote for them alone; without one, for gpueff, the job is not
                # collected yet (the collector writes every collected job's file) or, where
                # no files are written, not readable here: one job's answer, never the whole
                # command's error, so a listing goes on with the other jobs.
                own = self._from_report_file(job)
                if own is None:
                    if not self._answer_uncollected:
                        raise
                    return self._not_collected(job, closed=exc)
                self._ahead[job.job_id] = own
                return own
        if stored is None:
            return self._not_collected(job) if self._answer_uncollected else None
        tel = adapter.telemetry_from_stored(stored, self._words(), spark_points=self._spark_points)
        self._ahead[job.job_id] = tel
        return tel

    def _not_collected(self, job: JobRecord, closed: StoreError | None = None) -> Telemetry | None:
        """The GPU part of an ended job the store does not hold (``closed``: the store could
        not be read): the node's last live summary where this host still has it (the epilog
        removes it), and a note when the store was closed and no report files are written;
        ``None`` when there is nothing to add to "not collected yet"."""
        from dataclasses import replace

        notes: tuple[str, ...] = ()
        if closed is not None and not self._settings.gpueff.cache_reports:
            notes = (
                f"The store is not readable here ({closed.message}): if the job was "
                "collected, ask the site to set [gpueff] cache_reports.",
            )
        local = self._live_local(job)
        if local is None and not notes:
            return None
        if local is None:
            return Telemetry(gpus=(), live=False, notes=notes, uncollected=True)
        return replace(local, notes=(*local.notes, *notes), uncollected=True)

    def _from_report_file(self, job: JobRecord) -> Telemetry | None:
        """The telemetry of the caller's own job from their report file (``reportfiles``),
        else ``None``. The kernel lets only the file's user (and root) open it. The file's
        render key need not be the current one: its text is then out of date (a template
        edited, an upgrade) and is not printed, but the numbers it holds are still the job's,
        and are rendered afresh here; a telemetry this release cannot decode is ``None``."""
        import os

        from slurm_gpu.jobreport.reportfiles import read_reports, reports_root

        uid = os.getuid()
        if job.uid != uid or not self._settings.gpueff.cache_reports:
            return None
        s = self._settings
        root = reports_root(s.paths.state_dir, s.gpueff.reports_dir)
        found = read_reports(root, uid, [job.job_id_display], None)
        if not found or not isinstance(found[0].get("telemetry"), dict):
            return None
        try:
            return telemetry_from_dict(found[0]["telemetry"])
        except (KeyError, TypeError, ValueError):
            return None

    def live(self, job: JobRecord) -> Telemetry | None:
        """A running job's live numbers: its live summaries on this host's file system (a
        node of the job), else Prometheus (``[live] prometheus_url``: a login node), else
        a ``Telemetry`` without GPUs whose note says why there are none here.

        Called only for a job accounting returned to the caller (``service.report_for``), so
        Prometheus is asked about that one job id and nothing else."""
        local = self._live_local(job)
        if local is not None:
            return self._priced(local)
        return self._priced(self._live_prometheus(job))

    def _live_prometheus(self, job: JobRecord) -> Telemetry:
        from slurm_gpu.errors import ConfigError
        from slurm_gpu.prometheus.client import PrometheusClient, PrometheusUnavailableError
        from slurm_gpu.prometheus.livejobs import live_jobs as prometheus_jobs

        live = self._settings.live
        if not live.prometheus_url:
            return _no_live(
                "Live numbers are not available from this host: the job's live summary is on "
                "its node, and no Prometheus is configured ([live] prometheus_url)."
            )
        try:
            client = PrometheusClient(
                live.prometheus_url,
                live.prometheus_timeout_s,
                password_file=live.prometheus_password_file,
            )
            parts = prometheus_jobs(client, job_id=job.job_id)
        except (PrometheusUnavailableError, ValueError) as exc:
            return _no_live(f"Live numbers are not available from this host: {exc}.")
        except ConfigError as exc:
            # The password file of a Prometheus behind a password: root's, so an ordinary
            # user's report goes on without live numbers and says why.
            return _no_live(f"Live numbers are not available from this host: {exc.message}.")
        tel = adapter.telemetry_from_prometheus(
            parts, job.nodelist, now_s=time.time(), stale_after_s=live.stale_after_s
        )
        if tel is None:
            return _no_live(
                "Live numbers are not available from this host: Prometheus holds no fresh "
                "series of this job (it started moments ago, or its nodes are not scraped)."
            )
        return tel

    def _live_local(self, job: JobRecord) -> Telemetry | None:
        """The live summaries of a running job readable on this host; ``None`` if none."""
        from slurm_gpu.capture.livefile import read_live
        from slurm_gpu.capture.spoolpaths import JobSpool
        from slurm_gpu.errors import SpoolFormatError

        summaries = []
        # The live root is 0711: the user cannot list it, but can open their own job's
        # <host>.json (root's, group their private group, 0440) when they know the host, which
        # sacct told us. read_live reads at most LIVE_MAX_BYTES without following links.
        for host in job.nodelist:
            try:
                path = JobSpool(self._settings.paths.spool_dir, job.job_id, host).live
                summaries.append(clean_live(read_live(path)))
            except SpoolFormatError:
                continue  # not on this host's file system, not written yet, or not ours
        if not summaries:
            return None
        # An ended job's summaries stopped with it: their age counts to its end, not to now
        # (but a summary dated after now is a clock's error, whenever the job ended).
        clock_s = time.time()
        return adapter.telemetry_from_live(
            summaries,
            job.nodelist,
            now_s=clock_s if job.end_s is None else job.end_s,
            stale_after_s=self._settings.live.stale_after_s,
            clock_s=clock_s,
        )

    def close(self) -> None:
        """Release the store's connections, if this reader opened it."""
        if self._store is not None and self._owns_store:
            self._store.close()


def _no_live(note: str) -> Telemetry:
    """A running job's GPU part when no live number can be read here: ``note`` says why."""
    return Telemetry(gpus=(), live=True, notes=(note,))


#: Longest string kept from a live summary (host names, GPU UUIDs and names), characters.
LIVE_TEXT_MAX = 256


def clean_live(value: Any) -> Any:
    """A live summary with every string cleaned where it enters (``textsafe``): the file is
    written by root, but a summary left by an older release was the user's own to edit, and
    its host and GPU names reach an admin's terminal."""
    from slurm_gpu.textsafe import clean_user_text

    if isinstance(value, str):
        return clean_user_text(value, LIVE_TEXT_MAX)
    if isinstance(value, dict):
        return {clean_user_text(str(k), LIVE_TEXT_MAX): clean_live(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_live(v) for v in value]
    return value


def telemetry_from_dict(d: dict[str, Any]) -> Telemetry:
    """``model.Telemetry`` back from ``dataclasses.asdict`` after a JSON round trip (lists
    for tuples). Raises ``KeyError``/``TypeError`` for a mapping of another shape."""
    from slurm_gpu.jobreport.model import (
        FindingView,
        GpuLine,
        LiveActionView,
        RecommendationView,
    )

    return Telemetry(
        gpus=tuple(GpuLine(**{**g, "spark_pct": tuple(g.get("spark_pct", ()))}) for g in d["gpus"]),
        live=bool(d["live"]),
        updated_s=d.get("updated_s"),
        findings=tuple(
            FindingView(
                **{
                    **f,
                    "evidence": tuple(tuple(e) for e in f.get("evidence", ())),
                    "evidence_keys": tuple(f.get("evidence_keys", ())),
                    "people_evidence": (
                        None
                        if f.get("people_evidence") is None
                        else tuple(tuple(e) for e in f["people_evidence"])
                    ),
                }
            )
            for f in d.get("findings", ())
        ),
        recommendations=tuple(
            RecommendationView(**{**r, "sbatch_lines": tuple(r.get("sbatch_lines", ()))})
            for r in d.get("recommendations", ())
        ),
        notes=tuple(d.get("notes", ())),
        live_actions=tuple(LiveActionView(**a) for a in d.get("live_actions", ())),
    )


def make_reader(settings: Settings) -> StoreAndSpoolReader:
    """The reader ``gpueff`` uses outside tests (compiled finding templates cached)."""
    return StoreAndSpoolReader(settings, cache_templates=True, answer_uncollected=True)
