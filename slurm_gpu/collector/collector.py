"""The collector: sealed node records + Slurm accounting -> (analysis) -> the store.

One pass (``Collector.run_once``):

1. lists the sealed records in the spool and reads them batch by batch, each batch just before
   its accounting query (with an inbox, all first); a record that cannot be read is moved to
   ``<state_dir>/quarantine/`` with a log line, the others go on;
2. groups them by job and asks accounting about the jobs in batches (one query per batch);
3. keeps for a later pass every job that is not ready: accounting not settled yet (still
   RUNNING or COMPLETING, or TRES not recorded: slurmdbd gets them seconds after the end),
   or a multi-node job whose other nodes have not sealed yet. After ``settle_timeout_s`` /
   ``node_wait_s`` it ingests what exists and says so (``missing_hosts``);
4. runs the optional analysis hook and writes the batch to the store in one transaction
   (with the report step, in parts of at most ``REPORT_PART_JOBS`` jobs, one transaction
   each, and step 5's report hand-over and moves after each part's commit);
5. only after the commit, hands the stored jobs' ``gpueff`` reports to the report step
   (``reports``; its worker renders them while the pass goes on), moves the job's files to
   ``<state_dir>/done/`` (kept ``done_retention_s`` for debugging, then deleted), then, once
   the batch is stored and when an ``admin_comment`` publisher is given, writes each stored
   GPU job's JS1 summary into Slurm's AdminComment (a failure there is counted, never undoes
   the commit);
6. asks accounting for GPU jobs that ended recently and stores those that left no record at
   all with telemetry ``missing`` (hooks not installed, or the sampler never started).

A crash at any point loses nothing (records leave the spool only after their commit) and
duplicates nothing (a job is keyed by id; re-ingesting replaces its rows). Only one collector
runs at a time (``CollectorLock``, taken by the caller).

With an ``inbox`` (the PostgreSQL record inbox, ``slurm_gpu.store.inbox``) the records pushed
there by the nodes join those of the spool: each is checked as a file is (its digest, then the
record's own checks), a bad one moves to the inbox's quarantine table, and the rows of a stored
job are deleted in the very transaction that stores it (``Store.write_batch``'s ``also``):
committed together or not at all. Their bytes are kept in ``done/`` before that commit, like an
ingested file, so a node whose record comes late joins the job's other nodes.

``done/`` is flat: a node's files are ``done/<job>.<host>.record`` (and ``.jsonl``,
``.state``), renamed there from the spool. Collectors before 2026-11-27 made one directory
per job, ``done/<job>/<host>.record``; those are still read (a late node's record joins them)
and pruned. Creating a directory costs about as much as the rest of moving a job's files
(``docs/performance.md``).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import logging
import os
import shutil
import stat
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

from slurm_gpu.accounting.base import is_settled
from slurm_gpu.collector import crosscheck, safefs
from slurm_gpu.collector.donefiles import (
    _DROP_SUFFIXES,
    _KEEP_SUFFIXES,
    _has_record,
    _id_key,
    _index_record,
    _spool_job_dirs,
    _touch,
    done_name,
)
from slurm_gpu.collector.ports import (
    Accounting,
    Analyse,
    CommentPublisher,
    Inbox,
    InboxRowLike,
    RecordReader,
    ReportPublisher,
    SealedLike,
)
from slurm_gpu.collector.sealedfiles import (
    MAX_RECORD_BYTES,
    _closing,
    _InboxSealed,
    _open_parent,
    _regular_names,
    _SpoolModule,
    _why,
)
from slurm_gpu.collector.statedir import open_state_dir
from slurm_gpu.collector.steps import _parts, analysed_bundle, publish_stored, telemetry_status
from slurm_gpu.collector.tally import CollectorOptions, CollectReport, PassTally
from slurm_gpu.collector.tidy import DirRemover
from slurm_gpu.errors import AccountingError, SpoolFormatError
from slurm_gpu.gcpace import fewer_collections
from slurm_gpu.records import JobRecord, NodeRecord
from slurm_gpu.store import (
    TELEMETRY_MISSING,
    JobBundle,
    Store,
)

log = logging.getLogger("slurm_gpu.collector")


_MISSING_STATE = "missing-pass.json"
#: Jobs per store transaction when the pass renders reports (``Collector.reports``): an
#: accounting batch (``batch_size``, 500) is committed in parts of at most this many jobs, and
#: each part's reports go to the report worker right after its commit, so that the worker
#: renders while the collector stores the next part, and the end of the pass waits only for
#: the last part's reports instead of a whole batch's (4 of the worker's units of 32).
REPORT_PART_JOBS = 128


def _short(host: str) -> str:
    return host.split(".", 1)[0]


@dataclass
class _Pending:
    job_id: str
    files: list[SealedLike]
    nodes: list[NodeRecord]


class Collector:
    """Ingests the spool into the store. The caller holds ``CollectorLock``."""

    def __init__(
        self,
        *,
        store: Store,
        accounting: Accounting,
        spool_dir: str,
        state_dir: str,
        options: CollectorOptions | None = None,
        analyse: Analyse | None = None,
        reader: RecordReader | None = None,
        clock: Callable[[], float] = time.time,
        admin_comment: CommentPublisher | None = None,
        reports: ReportPublisher | None = None,
        uses_hooks: Callable[[JobRecord], bool] | None = None,
        inbox: Inbox | None = None,
    ) -> None:
        self.store = store
        self.uses_hooks = uses_hooks
        """Whether a job's partition takes its telemetry from the hooks (``None``: every
        job's does); the missing-telemetry pass leaves the others to the pull pass."""
        self.accounting = accounting
        self.spool_dir = spool_dir
        self.state_dir = state_dir
        self.options = options or CollectorOptions()
        self.analyse = analyse
        self.reader = reader or _SpoolModule((spool_dir, state_dir))
        self.clock = clock
        self.admin_comment = admin_comment
        self.reports = reports
        self.inbox = inbox
        self.done_dir = os.path.join(state_dir, "done")
        self.quarantine_dir = os.path.join(state_dir, "quarantine")
        self._state_fd: int | None = None
        self._done_index: dict[str, list[str]] = {}
        """Per job id, the names of its records in flat ``done/`` when the pass began."""
        self._tidy = DirRemover(spool_dir)
        """Removes the emptied spool job directories while the pass goes on (``tidy``)."""

    # ----------------------------------------------------------------- the pass

    def run_once(
        self,
        job_id: str | None = None,
        *,
        missing_pass: bool = True,
        only: Collection[str] | None = None,
    ) -> CollectReport:
        """One pass over the spool (only ``job_id``'s records, or those of the jobs in
        ``only``, when given).

        Raises ``ConfigError`` when the state directory, ``done/`` or ``quarantine/`` is not
        root's alone (``statedir``), ``StoreError`` when the store cannot be written (nothing
        leaves the spool then). Accounting failures are reported in ``CollectReport.errors``.
        """
        self._state_fd = open_state_dir(self.state_dir)
        # The pass keeps every record it read until it ends: fewer garbage collections
        # (``gcpace``) instead of full ones over that growing heap.
        with fewer_collections():
            try:
                for name in ("done", "quarantine"):
                    self._check_private(name)
                wanted = set(only) if only is not None else None
                if job_id is not None:
                    wanted = {job_id} if wanted is None else wanted & {job_id}
                return self._run(
                    wanted, missing_pass=missing_pass and job_id is None and only is None
                )
            finally:
                try:
                    if self.reports is not None:
                        self.reports.flush()  # the pass ends when its report files are written
                finally:
                    self._tidy.close()  # and when its emptied job directories are removed
                os.close(self._state_fd)
                self._state_fd = None

    def _check_private(self, name: str) -> None:
        """Refuse to run when ``<state_dir>/<name>`` exists but is not a private directory
        (a symlink planted there would make root write or delete elsewhere)."""
        try:
            fd = safefs.open_private_dir(name, dir_fd=self._state_fd_now())
        except FileNotFoundError:
            return
        except OSError as exc:
            from slurm_gpu.errors import ConfigError

            raise ConfigError(
                f"refusing to use {os.path.join(self.state_dir, name)}: {_why(exc)}",
                key="paths.state_dir",
                hint="remove it; the collector makes it again as a directory of root (0700)",
            ) from None
        os.close(fd)

    def _state_fd_now(self) -> int:
        if self._state_fd is None:
            raise RuntimeError("the state directory is opened by run_once")
        return self._state_fd

    def _run(self, wanted: set[str] | None, *, missing_pass: bool) -> CollectReport:
        acc = PassTally()
        now = self.clock()
        self._done_index = self._prune_done(now)
        size = max(1, self.options.batch_size)
        pending: dict[str, _Pending] = {}
        batches: Iterator[list[str]]
        if self.inbox is None:
            # Each batch's records read just before the batch is stored: the report worker
            # starts on the first part while the rest of the spool is read.
            batches = self._spool_batches(wanted, acc, pending, size)
        else:
            # The inbox's rows are matched against every file of the spool: all read first.
            pending.update(self._read_spool(wanted, acc))
            self._read_inbox(self.inbox, wanted, pending, acc)
            ids = sorted(pending, key=_id_key)
            batches = iter([ids[i : i + size] for i in range(0, len(ids), size)])
        for chunk in batches:
            try:
                self._batch(chunk, pending, now, acc)
            finally:
                # The batch's records are stored or left for a later pass: the rest of the
                # pass needs only their job ids. Kept, they would grow the heap that every
                # full garbage collection of the pass scans (``gcpace``).
                for jid in chunk:
                    pending[jid].nodes = []
        if missing_pass:
            self._missing_pass(now, set(pending), acc)
        return acc.report()

    def _batch(
        self, chunk: list[str], pending: dict[str, _Pending], now: float, acc: PassTally
    ) -> None:
        """One accounting batch: its query, then its jobs prepared, stored in parts and
        published."""
        try:
            jobs = self.accounting.get_jobs(chunk)
        except AccountingError as exc:
            msg = f"accounting query for {len(chunk)} job(s) failed: {exc}"
            log.error("%s; they stay in the spool", msg)
            acc.errors.append(msg)
            return
        bundles = []
        for jid in chunk:
            bundle = self._prepare(pending[jid], jobs.get(jid), now, acc)
            if bundle is not None:
                bundles.append(bundle)
        if self.inbox is not None:
            bundles = self._keep_inbox_records(bundles, pending)
        if not bundles:
            return
        stored: list[JobBundle] = []
        try:
            for part in _parts(bundles, self._part_jobs()):
                self._store(part, pending, now, acc)
                stored += part
        finally:
            # AdminComment once per batch, after its parts are stored and moved (those
            # stored before a store error too: they have left the spool).
            if stored:
                publish_stored(stored, self.admin_comment, None, acc)

    def _part_jobs(self) -> int:
        """Jobs per store transaction: with the report step, ``REPORT_PART_JOBS`` (each part's
        reports go to the report worker as soon as it is committed, while the next part is
        stored, and only the last part's wait at the end of the pass); without it, the whole
        batch."""
        return REPORT_PART_JOBS if self.reports is not None else max(1, self.options.batch_size)

    def _store(
        self, bundles: list[JobBundle], pending: dict[str, _Pending], now: float, acc: PassTally
    ) -> None:
        """Commit ``bundles`` in one transaction, then hand their reports over and move their
        files to ``done/``."""
        keys = [
            f.row.key
            for b in bundles
            for f in pending[b.job.job_id].files
            if isinstance(f, _InboxSealed)
        ]
        # The inbox rows of these jobs go in the transaction that stores them.
        also = None
        if self.inbox is not None and keys:
            also = functools.partial(self.inbox.take, keys=keys)
        self.store.write_batch(bundles, collected_at_s=now, also=also)
        # Committed. The reports first: handed to the report worker, they are rendered on
        # the other core while the files below move to done/ (the reports are read from
        # the store, not from the spool).
        if self.reports is not None:
            self.reports.publish([b.job for b in bundles])
        # Only now may the files leave the spool.
        for b in bundles:
            try:
                self._finish(pending[b.job.job_id])
            except OSError as exc:
                # Stored; the files stay in the spool and the next pass stores the job
                # again (idempotently) and retries the move.
                log.error(
                    "job %s stored, but its files stay in the spool: %s",
                    b.job.job_id,
                    _why(exc),
                )
            acc.ingested.append(b.job.job_id)
            log.info(
                "job %s stored: %s telemetry, %d node record(s)",
                b.job.job_id,
                b.telemetry,
                len(b.nodes),
            )

    # ----------------------------------------------------------------- spool

    def _read_spool(self, only: set[str] | None, acc: PassTally) -> dict[str, _Pending]:
        """Every sealed record of the spool, read (``_spool_batches`` in one batch)."""
        pending: dict[str, _Pending] = {}
        collections.deque(self._spool_batches(only, acc, pending, 0), maxlen=0)
        return pending

    def _spool_batches(
        self, only: set[str] | None, acc: PassTally, pending: dict[str, _Pending], size: int
    ) -> Iterator[list[str]]:
        """Read the spool's sealed records into ``pending``, job by job in id order (a record
        that cannot be read is quarantined), and yield the ids of every ``size`` jobs with a
        readable record as soon as they are read (``size`` 0: all of them at the end): the
        batches that sorting every job read would give, without reading them all first."""
        listed: dict[str, list[SealedLike]] = {}
        for sealed in self.reader.list_sealed(self.spool_dir):
            if only is None or sealed.job_id in only:
                listed.setdefault(sealed.job_id, []).append(sealed)
        batch: list[str] = []
        for job_id in sorted(listed, key=_id_key):
            for sealed in listed[job_id]:
                try:
                    record = self.reader.read_record(sealed.path)
                    if record.job_id != sealed.job_id:
                        raise SpoolFormatError(
                            f"{sealed.path}: record of job {record.job_id} in the directory of "
                            f"job {sealed.job_id}"
                        )
                except (SpoolFormatError, ValueError, TypeError, KeyError) as exc:
                    self._quarantine(sealed, str(exc), acc)
                    continue
                except FileNotFoundError:
                    continue  # vanished since the listing (a concurrent cleanup): nothing to do
                p = pending.get(job_id)
                if p is None:
                    p = pending[job_id] = _Pending(job_id, [], [])
                    batch.append(job_id)
                p.files.append(sealed)
                p.nodes.append(record)
            if size and len(batch) >= size:
                yield batch
                batch = []
        if batch:
            yield batch

    def _read_inbox(
        self, inbox: Inbox, only: set[str] | None, pending: dict[str, _Pending], acc: PassTally
    ) -> None:
        """Add the records waiting in the PostgreSQL inbox to ``pending``. Per job and host
        the newest row counts (as a file shipped again replaces the older one); the older
        rows, and rows that fail a check, go to the inbox's quarantine."""
        from slurm_gpu.capture import spool
        from slurm_gpu.store.inbox import record_digest

        newest: dict[tuple[str, str], InboxRowLike] = {}
        for row in inbox.pending(only):  # oldest first
            earlier = newest.get((row.job_id, row.host))
            if earlier is not None:
                self._quarantine_row(earlier, "superseded by a newer record of this job and host")
                acc.quarantined.append(f"postgresql inbox: {earlier.job_id}/{earlier.host}")
            newest[(row.job_id, row.host)] = row
        for row in newest.values():
            where = f"postgresql inbox: {row.job_id}/{row.host}"
            sealed = _InboxSealed(row.job_id, row.host, where, row)
            p = pending.get(row.job_id)
            if p is not None and any(_short(n.hostname) == _short(row.host) for n in p.nodes):
                # The same node's record also came as a file: the file is taken this pass,
                # the row waits for the next (then a late record of a stored job).
                continue
            try:
                if row.data is None:
                    raise SpoolFormatError(f"{where}: larger than the collector reads")
                if record_digest(row.data) != row.digest:
                    raise SpoolFormatError(f"{where}: its bytes do not match its SHA-256")
                record = spool.decode_record(row.data, where=where)
                if record.job_id != row.job_id:
                    raise SpoolFormatError(
                        f"{where}: record of job {record.job_id} pushed as job {row.job_id}"
                    )
            except (SpoolFormatError, ValueError, TypeError, KeyError) as exc:
                self._quarantine(sealed, str(exc), acc)
                continue
            p = pending.setdefault(row.job_id, _Pending(row.job_id, [], []))
            p.files.append(sealed)
            p.nodes.append(record)

    def _quarantine_row(self, row: InboxRowLike, reason: str) -> None:
        from slurm_gpu.errors import StoreError

        assert self.inbox is not None
        try:
            self.inbox.quarantine(row, reason)
        except StoreError as exc:
            log.error("job %s: inbox record of %s not quarantined: %s", row.job_id, row.host, exc)
            return
        log.warning(
            "job %s: inbox record of %s moved to record_quarantine: %s",
            row.job_id,
            row.host,
            reason,
        )

    def _keep_inbox_records(
        self, bundles: list[JobBundle], pending: dict[str, _Pending]
    ) -> list[JobBundle]:
        """Write the inbox records of ``bundles`` to ``done/<job>.<host>.record`` before the
        commit that deletes their rows (a copy written for a commit that then fails is
        rewritten by the next pass). A job whose copy cannot be written is left in the inbox
        for the next pass: storing it would lose the record for a late node's re-store."""
        kept = []
        state = self._state_fd_now()
        for b in bundles:
            rows = [f for f in pending[b.job.job_id].files if isinstance(f, _InboxSealed)]
            try:
                if rows:
                    with _closing(
                        safefs.open_private_dir("done", dir_fd=state, create=True)
                    ) as dest:
                        for f in rows:
                            assert f.row.data is not None  # checked when read
                            # Not fsynced, as durable as a file inbox's record moved to done/
                            # (a rename): a killed collector loses nothing of it, and an fsync
                            # per job would cost more than the rest of its ingest.
                            safefs.write_replace(
                                done_name(b.job.job_id, f.hostname, ".record"),
                                f.row.data,
                                dir_fd=dest,
                                sync=False,
                            )
            except OSError as exc:
                log.error(
                    "job %s: not stored this pass, its inbox records could not be kept in %s: %s",
                    b.job.job_id,
                    self.done_dir,
                    _why(exc),
                )
                continue
            kept.append(b)
        return kept

    def _quarantine(self, sealed: SealedLike, reason: str, acc: PassTally) -> None:
        """Move a record that cannot be ingested to ``<state_dir>/quarantine/`` with its reason
        next to it; every name is opened relative to a directory descriptor, never followed.
        A record of the PostgreSQL inbox moves to its quarantine table instead."""
        if isinstance(sealed, _InboxSealed):
            self._quarantine_row(sealed.row, reason)
            acc.quarantined.append(sealed.path)
            return
        base = f"{sealed.job_id}.{os.path.basename(sealed.path)}"
        try:
            parent, name = _open_parent(sealed.path, (self.spool_dir, self.state_dir))
            with (
                _closing(parent) as src,
                _closing(
                    safefs.open_private_dir("quarantine", dir_fd=self._state_fd_now(), create=True)
                ) as q,
            ):
                dest, n = base, 1
                while safefs.lstat_at(dest, dir_fd=q) is not None:
                    dest, n = f"{base}.{n}", n + 1
                # A reason left by a pass killed before the move is replaced, not followed.
                safefs.write_replace(dest + ".reason", (reason + "\n").encode(), dir_fd=q)
                safefs.move(name, src_fd=src, dst_fd=q, dst_name=dest, max_bytes=MAX_RECORD_BYTES)
        except OSError as exc:
            log.error("job %s: cannot quarantine %s: %s", sealed.job_id, sealed.path, _why(exc))
            return
        dest = os.path.join(self.quarantine_dir, dest)
        acc.quarantined.append(dest)
        log.warning(
            "job %s: corrupt record %s moved to %s: %s", sealed.job_id, sealed.path, dest, reason
        )

    # ----------------------------------------------------------------- one job

    def _prepare(
        self, p: _Pending, job: JobRecord | None, now: float, acc: PassTally
    ) -> JobBundle | None:
        newest_end = max(n.ended_s for n in p.nodes)
        if job is None:
            if now - newest_end < self.options.settle_timeout_s:
                acc.no_accounting.append(p.job_id)
                log.info("job %s: not in accounting yet; will retry", p.job_id)
                return None
            for sealed in p.files:
                self._quarantine(
                    sealed,
                    f"accounting does not know job {p.job_id} "
                    f"{self.options.settle_timeout_s:.0f} s after its record was sealed",
                    acc,
                )
            return None
        if not is_settled(job):
            if now - newest_end < self.options.settle_timeout_s:
                acc.unsettled.append(p.job_id)
                log.info("job %s: accounting not settled (%s); will retry", p.job_id, job.state)
                return None
            log.warning(
                "job %s: accounting still not settled (%s) after %.0f s; storing it as it is",
                p.job_id,
                job.state,
                now - newest_end,
            )
        if not self._agrees(p, job, acc):
            return None
        # Records of this job stored by an earlier pass and already moved to done/ (a pass
        # killed half-way through moving a multi-node job's records, or a node's record that
        # arrived late): storing the job again must keep them, not replace the job with the
        # nodes left in the spool.
        p.nodes.extend(self._stored_nodes(p, job))
        seen = {_short(n.hostname) for n in p.nodes}
        missing = tuple(h for h in job.nodelist if _short(h) not in seen)
        if missing:
            since = max(newest_end, job.end_s or newest_end)
            if now - since < self.options.node_wait_s:
                acc.waiting.append(p.job_id)
                log.info("job %s: waiting for the record of %s", p.job_id, ",".join(missing))
                return None
            acc.partial.append(p.job_id)
            log.warning(
                "job %s: no record from %s after %.0f s; storing the other nodes",
                p.job_id,
                ",".join(missing),
                now - since,
            )
        return analysed_bundle(
            job, p.nodes, missing, self.analyse, self.options.analysis_version, acc
        )

    def _agrees(self, p: _Pending, job: JobRecord, acc: PassTally) -> bool:
        """Cross-check accounting against the job's sealed records (``crosscheck``).

        Records of an earlier run of a requeued job on a node this run did not use are
        quarantined alone. Any other disagreement (owner uid, a host outside the node list)
        quarantines all of the job's records and keeps the job out of the store: storing it
        would show telemetry under the wrong owner. Returns whether the job may be stored.
        """
        earlier = [i for i, n in enumerate(p.nodes) if crosscheck.is_earlier_run(job, n)]
        if earlier and len(earlier) < len(p.nodes):
            for i in earlier:
                self._quarantine(
                    p.files[i],
                    f"record of an earlier run of job {p.job_id} on {p.nodes[i].hostname}, "
                    "a node its last run did not use",
                    acc,
                )
            p.files = [f for i, f in enumerate(p.files) if i not in earlier]
            p.nodes = [n for i, n in enumerate(p.nodes) if i not in earlier]
        reason = crosscheck.disagreement(job, p.nodes)
        if reason is None:
            return True
        log.warning(
            "job %s: accounting disagrees with its records: %s; not stored", p.job_id, reason
        )
        acc.accounting_mismatch.append(p.job_id)
        for sealed in p.files:
            self._quarantine(sealed, f"accounting disagrees with the record: {reason}", acc)
        return False

    def _stored_nodes(self, p: _Pending, job: JobRecord) -> list[NodeRecord]:
        """Records in ``done/`` (``<job>.<host>.record``, or ``<job>/<host>.record`` as
        collectors before 2026-11-27 kept them) of hosts that ``p`` has none for, from this run
        of the job: a record that ended before the job (re)started belongs to an earlier run of
        a requeued job and is left out."""
        have = {_short(n.hostname) for n in p.nodes}
        paths = [os.path.join(self.done_dir, n) for n in sorted(self._done_index.get(p.job_id, ()))]
        old = os.path.join(self.done_dir, p.job_id)
        try:
            parent, name = _open_parent(old, (self.state_dir,))
            with _closing(parent), _closing(safefs.open_dir(name, dir_fd=parent)) as fd:
                paths += [os.path.join(old, n) for n in _regular_names(fd, old)]
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.error("job %s: stored records in %s not read: %s", p.job_id, old, _why(exc))
        out = []
        for path in paths:
            name = os.path.basename(path)
            if not name.endswith(".record"):
                continue
            host = name[: -len(".record")]
            if os.path.dirname(path) == self.done_dir:
                host = host[len(p.job_id) + 1 :]
            if _short(host) in have:
                continue
            try:
                record = self.reader.read_record(path)
            except (OSError, SpoolFormatError, ValueError, TypeError, KeyError) as exc:
                log.warning("job %s: ingested record %s unreadable (%s)", p.job_id, path, exc)
                continue
            if record.job_id != p.job_id or _short(record.hostname) in have:
                continue
            if job.start_s is not None and record.ended_s < job.start_s:
                continue  # an earlier run of a requeued job
            have.add(_short(record.hostname))
            out.append(record)
        return out

    def _finish(self, p: _Pending) -> None:
        """Move an ingested job's files to ``done/`` as ``<job>.<host><suffix>`` (the record
        last, each file's time set to now: ``done/`` is pruned by it) and tidy its spool dir.

        Every name is resolved relative to a directory descriptor without following a
        symlink: ``done/`` must be a private directory of root, and the spool's job directory
        must be a real directory. Records of the PostgreSQL inbox have no files to move (their
        rows went with the commit). Raises ``OSError``."""
        files = [f for f in p.files if not isinstance(f, _InboxSealed)]
        if not files:
            return
        state = self._state_fd_now()
        top = os.open(self.spool_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        with (
            _closing(top),
            _closing(safefs.open_private_dir("done", dir_fd=state, create=True)) as dest,
            _closing(safefs.open_dir(p.job_id, dir_fd=top)) as src,
        ):
            for sealed in files:
                # The record goes last: a crash before it leaves the record in the spool, and
                # the next pass re-ingests (idempotently) and finishes the move.
                host = sealed.hostname
                for suffix in _DROP_SUFFIXES:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(host + suffix, dir_fd=src)
                for suffix in _KEEP_SUFFIXES:
                    kept = done_name(p.job_id, host, suffix)
                    with contextlib.suppress(FileNotFoundError):
                        safefs.move(host + suffix, src_fd=src, dst_fd=dest, dst_name=kept)
                        _touch(kept, dest)
                name = os.path.basename(sealed.path)
                kept = done_name(p.job_id, name[: -len(".record")], ".record")
                safefs.move(
                    name, src_fd=src, dst_fd=dest, dst_name=kept, max_bytes=MAX_RECORD_BYTES
                )
                _touch(kept, dest)
        # Only when empty (other nodes' files may still be arriving), and on the remover's
        # thread: a removal can wait for the disk (``tidy``).
        self._tidy.remove(p.job_id)

    def _prune_done(self, now: float) -> dict[str, list[str]]:
        """Delete the files (and the job directories of earlier collectors) in ``done/`` older
        than ``done_retention_s``, through ``done/``'s descriptor: a symlink in ``done/`` is
        removed (the link, not its target), and ``rmtree`` runs only in its descriptor-based
        form, which never follows one. Returns, per job id, the names of the records left
        in flat ``done/`` (``_stored_nodes`` reads them)."""
        index: dict[str, list[str]] = {}
        if not shutil.rmtree.avoids_symlink_attacks:
            log.error("done/ not pruned: this platform's rmtree can follow symlinks")
            return self._done_records()
        try:
            done = safefs.open_private_dir("done", dir_fd=self._state_fd_now())
        except FileNotFoundError:
            return index
        except OSError as exc:
            log.error("%s not pruned: %s", self.done_dir, _why(exc))
            return index
        with _closing(done):
            with os.scandir(done) as it:
                names = [e.name for e in it]
            for name in names:
                try:
                    st = os.stat(name, dir_fd=done, follow_symlinks=False)
                    if stat.S_ISLNK(st.st_mode):
                        log.warning(
                            "removed the symlink %s/%s (never followed)", self.done_dir, name
                        )
                        os.unlink(name, dir_fd=done)
                    elif now - st.st_mtime <= self.options.done_retention_s:
                        if stat.S_ISREG(st.st_mode):
                            _index_record(index, name)
                        continue
                    elif stat.S_ISDIR(st.st_mode):
                        shutil.rmtree(name, dir_fd=done)
                    else:
                        os.unlink(name, dir_fd=done)
                except OSError as exc:
                    log.warning("%s/%s not pruned: %s", self.done_dir, name, _why(exc))
        return index

    def _done_records(self) -> dict[str, list[str]]:
        """``_prune_done``'s index without pruning."""
        index: dict[str, list[str]] = {}
        try:
            done = safefs.open_private_dir("done", dir_fd=self._state_fd_now())
        except OSError:
            return index
        with _closing(done), os.scandir(done) as it:
            for e in it:
                if e.is_file(follow_symlinks=False):
                    _index_record(index, e.name)
        return index

    # ----------------------------------------------------------------- missing telemetry

    def _missing_pass(self, now: float, in_spool: set[str], acc: PassTally) -> None:
        opts = self.options
        end = now - opts.missing_grace_s
        start = now - opts.missing_lookback_s
        state = self._state_fd_now()
        try:
            raw = safefs.read_bounded(_MISSING_STATE, dir_fd=state, max_bytes=4096)
            checked = float(json.loads(raw)["checked_until_s"])
            # Re-look a grace period back: accounting may have learnt of late ends since.
            start = max(start, checked - opts.missing_grace_s)
        except (OSError, ValueError, KeyError, TypeError):
            pass
        if end <= start:
            return
        try:
            jobs = self.accounting.jobs_between(start, end)
        except AccountingError as exc:
            msg = f"accounting query for recently ended GPU jobs failed: {exc}"
            log.error(msg)
            acc.errors.append(msg)
            return
        spool_dirs = _spool_job_dirs(self.spool_dir)
        candidates = {
            j.job_id: j
            for j in jobs
            if j.alloc_tres.gpus
            and is_settled(j)
            and j.end_s is not None
            and start <= j.end_s < end
            and j.job_id not in in_spool
            and (self.uses_hooks is None or self.uses_hooks(j))
            and not _has_record(self.spool_dir, j.job_id, spool_dirs)
        }
        if candidates:
            stored = self.store.existing_job_ids(candidates)
            bundles = [
                JobBundle(job=j, nodes=(), telemetry=TELEMETRY_MISSING, missing_hosts=j.nodelist)
                for jid, j in sorted(candidates.items(), key=lambda kv: _id_key(kv[0]))
                if jid not in stored
            ]
            size = max(1, opts.batch_size)
            for i in range(0, len(bundles), size):
                self.store.write_batch(bundles[i : i + size], collected_at_s=now)
                if self.reports is not None:
                    self.reports.publish([b.job for b in bundles[i : i + size]])
            for b in bundles:
                acc.missing.append(b.job.job_id)
                log.warning(
                    "job %s: GPU job without telemetry (hooks not installed on %s, or the "
                    "sampler never started); stored as missing",
                    b.job.job_id,
                    ",".join(b.job.nodelist) or "its nodes",
                )
        safefs.write_replace(
            _MISSING_STATE, json.dumps({"checked_until_s": end}).encode(), dir_fd=state
        )


__all__ = [
    "Accounting",
    "Analyse",
    "CollectReport",
    "Collector",
    "CollectorOptions",
    "CommentPublisher",
    "RecordReader",
    "analysed_bundle",
    "publish_stored",
    "telemetry_status",
]
