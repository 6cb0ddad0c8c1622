"""``SacctSource``: job metadata from the ``sacct`` command (every Slurm version).

Two queries per batch, because ``sacct --parsable2`` has no quoting and some fields hold text
that the job's owner chose (the job name, the comment, the working directory, which Slurm
accepts with any byte but NUL, newlines and the delimiter included):

* the **accounting query** (``FIELDS``) asks only for fields that no user can type: ids, state,
  exit codes, user and uid, account, partition, QOS, CPUs, nodes, TRES, memory, times, the
  node list and AdminComment (which only an administrator or SlurmUser can set). Nothing a
  user wrote can appear in its output, so its framing cannot be forged. A record is
  ``<id> DELIM … DELIM <id> \\n`` (``JobIDRaw`` first and last) and must have exactly the
  fields asked for; anything else is skipped and counted, never read into another field.
* the **text query** (``TEXT_FIELDS``, ``--allocations``) asks for the user-written strings of
  the same jobs, framed with a delimiter drawn at random for that query (so that a name cannot
  hold it), and is accepted only when it matches the accounting query exactly: the same job
  ids in the same order, and exactly five delimiters per record (``verify_text``). Otherwise
  the strings of that batch are dropped (empty name, no comment or directory), never the
  accounting fields; one retry of both queries covers a job that changed between them.

Every string from the text query is cleaned where it enters (``slurm_gpu.textsafe``): control
characters and bidi overrides replaced, length bounded.

Times come as epoch seconds (``SLURM_TIME_FORMAT=%s``); durations and limits come raw
(``ElapsedRaw``, ``TimelimitRaw``) with the formatted fields as a fallback.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from slurm_gpu.accounting.batchscript import MAX_OUTPUT_BYTES as MAX_SCRIPT_OUTPUT
from slurm_gpu.accounting.batchscript import directives_of, split_scripts
from slurm_gpu.accounting.hostlist import expand_hostlist
from slurm_gpu.accounting.jobids import parse_job_id
from slurm_gpu.accounting.runner import CommandRunner, SubprocessRunner
from slurm_gpu.accounting.tres import mem_bytes, parse_mem, parse_tres
from slurm_gpu.accounting.usertext import (
    COMMENT_MAX_LEN,
    JOB_NAME_MAX_LEN,
    SUBMIT_LINE_MAX_LEN,
    WORK_DIR_MAX_LEN,
)
from slurm_gpu.errors import AccountingError
from slurm_gpu.records import JobRecord, JobStep
from slurm_gpu.textsafe import clean_user_text

#: Delimiter of the accounting query (which holds no user text).
DELIM = "\x1f|\x1f"

#: Fields of the accounting query, in order. None of them holds text a job's owner chose.
#: ``JobIDRaw`` is repeated last as the record terminator.
FIELDS: tuple[str, ...] = (
    "JobIDRaw",
    "JobID",
    "State",
    "ExitCode",
    "DerivedExitCode",
    "User",
    "UID",
    "Account",
    "Partition",
    "QOS",
    "AllocCPUS",
    "NNodes",
    "ReqMem",
    "AllocTRES",
    "ReqTRES",
    "MaxRSS",
    "TotalCPU",
    "ElapsedRaw",
    "Elapsed",
    "TimelimitRaw",
    "Timelimit",
    "Submit",
    "Start",
    "End",
    "NodeList",
    "AdminComment",
    "NTasks",
    "Reason",
    "JobIDRaw",
)

#: Fields of the text query: the strings a job's owner chose, between ``JobIDRaw`` twice.
TEXT_FIELDS: tuple[str, ...] = (
    "JobIDRaw",
    "JobName",
    "Comment",
    "WorkDir",
    "SubmitLine",
    "JobIDRaw",
)
#: Pieces one record of the text query splits into on its delimiter, less the last id.
_TEXT_PIECES = len(TEXT_FIELDS) - 1

#: Fields a caller may leave out (``SacctSource(omit=...)``); the record then says ``None`` for
#: them. ``QOS`` costs sacct one more table request to slurmdbd (about 90 ms on the test
#: cluster) to turn the QOS id into its name, and the user report does not show it.
OMITTABLE: frozenset[str] = frozenset({"QOS"})


def fields_without(omit: Iterable[str] = ()) -> tuple[str, ...]:
    """``FIELDS`` less ``omit`` (each one of ``OMITTABLE``; ``ValueError`` otherwise)."""
    unknown = set(omit) - OMITTABLE
    if unknown:
        raise ValueError(f"cannot omit sacct fields {sorted(unknown)}; only {sorted(OMITTABLE)}")
    return tuple(f for f in FIELDS if f not in set(omit))


def text_delimiter() -> str:
    """A delimiter for one text query: 16 random hex digits between unit separators. A job
    name written before the query cannot contain it (2^64 guesses)."""
    return "\x1f" + os.urandom(8).hex() + "\x1f"


_RAW_ID_RE = re.compile(r"\d+(?:\.[A-Za-z0-9_+\-]+)?")
_UNKNOWN = frozenset({"", "Unknown", "None", "(null)", "N/A"})


@dataclass(frozen=True, slots=True)
class UserText:
    """The strings a job's owner chose, as the text query gave them (not yet cleaned)."""

    job_name: str
    comment: str
    work_dir: str
    submit_line: str = ""


@dataclass(frozen=True, slots=True)
class ParseResult:
    """Records parsed from one accounting query, keyed by raw job id.

    ``skipped``: records that had to be skipped (malformed, or refused: see ``rejected``).
    ``rejected``: raw job id -> why that job's record was refused (e.g. a node list naming
    more than ``hostlist.MAX_HOSTS`` hosts); the other jobs of the batch are unaffected.
    ``text_verified``: whether the user strings were attached (the text query matched).
    """

    jobs: dict[str, JobRecord] = field(default_factory=dict)
    skipped: int = 0
    rejected: dict[str, str] = field(default_factory=dict)
    text_verified: bool = False


# --------------------------------------------------------------------------- framing


def split_records(
    text: str, fields: Sequence[str] = FIELDS, delimiter: str = DELIM
) -> tuple[list[list[str]], int]:
    """Split sacct output into records of exactly ``len(fields)`` fields each.

    A record is ``<id> delimiter … delimiter <id> \\n``: its end is the first
    ``delimiter <the same id> \\n`` after its start, so a newline inside a field is harmless. A
    record with more or fewer fields than asked is skipped, never re-fitted. Returns
    ``(records, skipped)``. Never raises.
    """
    records: list[list[str]] = []
    skipped = 0
    pos = 0
    n = len(text)
    dlen = len(delimiter)
    want = len(fields)
    while pos < n:
        if text[pos] == "\n":
            pos += 1
            continue
        first_end = text.find(delimiter, pos)
        raw_id = text[pos:first_end] if first_end >= 0 else ""
        if first_end < 0 or not _RAW_ID_RE.fullmatch(raw_id):
            skipped += 1
            pos = _next_line(text, pos)
            continue
        terminator = delimiter + raw_id + "\n"
        end = text.find(terminator, first_end)
        if end < 0:
            tail = delimiter + raw_id
            if text.endswith(tail) and len(text) - len(tail) >= first_end:
                end = len(text) - len(tail)
                next_pos = n
            else:
                skipped += 1
                pos = _next_line(text, pos)
                continue
        else:
            next_pos = end + len(terminator)
        body = text[first_end + dlen : end] if end > first_end else ""
        pieces = [raw_id, *body.split(delimiter), raw_id] if end > first_end else [raw_id, raw_id]
        if len(pieces) == want:
            records.append(pieces)
        else:
            skipped += 1
        pos = next_pos
    return records, skipped


def _next_line(text: str, pos: int) -> int:
    nl = text.find("\n", pos)
    return len(text) if nl < 0 else nl + 1


def verify_text(text: str, job_ids: Sequence[str], delimiter: str) -> dict[str, UserText] | None:
    """The user strings of the text query, keyed by raw job id, or ``None`` when the output
    does not match ``job_ids`` (the job-level raw ids of the accounting query, in its order,
    a requeued job once per run).

    The output must be exactly ``id D name D comment D workdir D id \\n`` for each id in turn:
    split on ``delimiter`` it has 4 pieces per record plus one, and every piece between two
    records is ``<id>\\n<next id>``. A delimiter inside a field adds a piece and fails the
    check, so no field can move a boundary into another job's record. With several runs of a
    job the last one wins, as in the accounting query.
    """
    if not job_ids:
        return {}
    pieces = text.split(delimiter)
    count = len(job_ids)
    per = _TEXT_PIECES
    if len(pieces) != per * count + 1 or pieces[0] != job_ids[0]:
        return None
    out: dict[str, UserText] = {}
    for i, job_id in enumerate(job_ids):
        junction = pieces[per * i + per]
        if i + 1 < count:
            if junction != f"{job_id}\n{job_ids[i + 1]}":
                return None
        elif junction not in (job_id, job_id + "\n"):
            return None
        name, comment, work_dir, submit_line = pieces[per * i + 1 : per * i + per]
        out[job_id] = UserText(
            job_name=name, comment=comment, work_dir=work_dir, submit_line=submit_line
        )
    return out


# --------------------------------------------------------------------------- field parsing


def _opt_str(value: str) -> str | None:
    return None if value in _UNKNOWN else value


def _opt_int(value: str) -> int | None:
    value = value.strip()
    if value.lstrip("-").isdigit():
        return int(value)
    return None


def _epoch(value: str) -> float | None:
    """Epoch seconds, or ``None`` for ``Unknown``/``None``/``0`` (never happened)."""
    number = _opt_int(value)
    if number is None or number <= 0:
        return None
    return float(number)


def parse_duration(value: str) -> float | None:
    """Parse sacct durations: ``[D-]HH:MM:SS``, ``MM:SS.mmm``, ``HH:MM:SS.mmm``; ``None`` for
    ``UNLIMITED``, ``Partition_Limit``, empty or malformed."""
    value = value.strip()
    if not value or value in _UNKNOWN or not value[0].isdigit():
        return None
    days = 0
    if "-" in value:
        day_text, value = value.split("-", 1)
        if not day_text.isdigit():
            return None
        days = int(day_text)
    parts = value.split(":")
    try:
        numbers = [float(p) for p in parts]
    except ValueError:
        return None
    if len(numbers) == 3:
        h, m, s = numbers
    elif len(numbers) == 2:
        h, (m, s) = 0.0, numbers
    elif len(numbers) == 1:
        # A bare number of minutes (Timelimit without separators).
        h, m, s = 0.0, numbers[0], 0.0
    else:
        return None
    return days * 86400 + h * 3600 + m * 60 + s


def parse_state(value: str) -> tuple[str, int | None]:
    """``CANCELLED by 1001`` -> ``("CANCELLED", 1001)``; ``COMPLETED`` -> ``(…, None)``."""
    parts = value.split()
    if not parts:
        return "UNKNOWN", None
    state = parts[0].rstrip("+")
    uid = None
    if len(parts) >= 3 and parts[1].lower() == "by":
        uid = _opt_int(parts[2])
    return state, uid


def parse_exit(value: str) -> tuple[int | None, int | None]:
    """``rc:sig`` -> ``(rc, sig)``; ``None`` parts where sacct printed nothing usable."""
    rc, _, sig = value.partition(":")
    return _opt_int(rc), _opt_int(sig)


def _time_limit_s(raw: str, formatted: str) -> int | None:
    minutes = _opt_int(raw)
    if minutes is not None:
        # Slurm stores INFINITE (0xffffffff) and NO_VAL (0xfffffffe) as huge numbers.
        return minutes * 60 if 0 <= minutes < 0xFFFFFFFE else None
    seconds = parse_duration(formatted)
    return int(seconds) if seconds is not None else None


def _req_mem_bytes(
    req_mem: str, req_tres_mem: int | None, cpus: int | None, nodes: int | None
) -> int | None:
    """The job's total requested memory.

    ReqTRES ``mem=`` is already the job total, so it wins. Otherwise ``ReqMem`` is read: the
    ``Mc``/``Mn`` suffixes of Slurm before 21.08 mean per CPU / per node and are multiplied out;
    since 21.08 sacct prints the job's total there without a suffix (a 4-node job with
    ``--mem=78.125G`` reads ``ReqMem=312.50G``), which is taken as it is.
    """
    if req_tres_mem:
        return req_tres_mem
    parsed = parse_mem(req_mem, default_unit="M")
    if parsed is None or parsed[0] == 0:
        return None
    size, per = parsed
    if per == "c":
        return size * cpus if cpus else None
    if per == "n":
        return size * (nodes or 1)
    return size


def _split_display_id(display: str) -> tuple[str | None, str | None, str | None, int | None]:
    """``JobID`` -> ``(array_job_id, array_task_id, het_job_id, het_offset)``."""
    base = display.split(".", 1)[0]
    if "_" in base:
        job, task = base.split("_", 1)
        # The ``%N`` throttle of a pending range is a limit, not part of the id.
        return job, task.strip("[]").split("%", 1)[0], None, None
    if "+" in base:
        job, offset = base.split("+", 1)
        return None, None, job, _opt_int(offset)
    return None, None, None, None


@dataclass
class _Run:
    row: dict[str, str]
    steps: list[dict[str, str]] = field(default_factory=list)


def _decode(data: bytes | str) -> str:
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


def parse_sacct_output(
    stdout: bytes | str,
    fields: Sequence[str] = FIELDS,
    *,
    text: bytes | str | None = None,
    text_delimiter: str = DELIM,
) -> ParseResult:
    """Parse the accounting query (run with ``build_argv`` asking for ``fields``) into
    ``JobRecord``s, with the user strings of ``text`` (the text query, framed with
    ``text_delimiter``) when it passes ``verify_text``; without it, or when it does not pass,
    every job has an empty name and no comment or working directory.

    Steps fold into their job: MaxRSS is the largest over the steps, TotalCPU is the job line's
    (which sacct already sums over the steps) or, when that is empty, the sum of the steps;
    each step is also kept (``JobRecord.steps``: its CPUs, GPUs, state, exit code, elapsed and
    TotalCPU, all from the accounting query, never its user-chosen name).
    When a requeued job appears more than once (``--duplicates``), the last run wins and
    ``restarts`` counts the earlier ones. A record that cannot be read is skipped (and, with
    a reason, listed in ``rejected``); the others are unaffected. Never raises.
    """
    records, skipped = split_records(_decode(stdout), fields)
    runs: dict[str, list[_Run]] = {}
    order: list[str] = []
    for values in records:
        row = dict(zip(fields[:-1], values[:-1], strict=True))
        raw_id = row["JobIDRaw"]
        if "." in raw_id:
            job_raw = raw_id.split(".", 1)[0]
            if job_raw in runs:
                runs[job_raw][-1].steps.append(row)
            continue
        order.append(raw_id)
        runs.setdefault(raw_id, []).append(_Run(row=row))
    texts = verify_text(_decode(text), order, text_delimiter) if text is not None else None
    jobs: dict[str, JobRecord] = {}
    rejected: dict[str, str] = {}
    for raw_id, job_runs in runs.items():
        try:
            user_text = texts.get(raw_id) if texts is not None else None
            jobs[raw_id] = _to_record(job_runs[-1], restarts=len(job_runs) - 1, text=user_text)
        except AccountingError as exc:
            skipped += 1
            rejected[raw_id] = exc.message
        except (ValueError, KeyError, IndexError, OverflowError) as exc:
            skipped += 1
            rejected[raw_id] = f"unreadable accounting record: {type(exc).__name__}"
    return ParseResult(
        jobs=jobs, skipped=skipped, rejected=rejected, text_verified=texts is not None
    )


def _to_record(run: _Run, *, restarts: int, text: UserText | None) -> JobRecord:
    row = run.row
    state, cancelled_by = parse_state(row["State"])
    exit_code, exit_signal = parse_exit(row["ExitCode"])
    derived, _ = parse_exit(row["DerivedExitCode"])
    alloc_tres = parse_tres(row["AllocTRES"])
    req_tres = parse_tres(row["ReqTRES"])
    alloc_cpus = _opt_int(row["AllocCPUS"])
    nodes = _opt_int(row["NNodes"])
    rss_values = [v for v in (mem_bytes(s["MaxRSS"]) for s in [row, *run.steps]) if v is not None]
    total_cpu = parse_duration(row["TotalCPU"])
    if not total_cpu and run.steps:
        step_cpu = [parse_duration(s["TotalCPU"]) for s in run.steps]
        known = [v for v in step_cpu if v is not None]
        total_cpu = sum(known) if known else total_cpu
    elapsed = _opt_int(row["ElapsedRaw"])
    if elapsed is None:
        elapsed = int(parse_duration(row["Elapsed"]) or 0)
    array_job, array_task, het_job, het_offset = _split_display_id(row["JobID"])
    display = row["JobID"].split("%", 1)[0] + "]" if "%" in row["JobID"] else row["JobID"]
    # A node list that cannot be expanded (or names more than MAX_HOSTS hosts) refuses this
    # job's record only: the collector keeps its files and says why.
    nodelist = expand_hostlist(row["NodeList"])
    return JobRecord(
        job_id=row["JobIDRaw"],
        job_id_display=display,
        array_job_id=array_job,
        array_task_id=array_task,
        het_job_id=het_job,
        het_job_offset=het_offset,
        user=row["User"],
        uid=_opt_int(row["UID"]),
        account=_opt_str(row["Account"]),
        partition=_opt_str(row["Partition"]),
        qos=_opt_str(row.get("QOS", "")),
        job_name=clean_user_text(text.job_name, JOB_NAME_MAX_LEN) if text else "",
        work_dir=_opt_text(text.work_dir, WORK_DIR_MAX_LEN) if text else None,
        nodelist=nodelist,
        state=state,
        cancelled_by_uid=cancelled_by,
        exit_code=exit_code,
        exit_signal=exit_signal,
        derived_exit_code=derived,
        alloc_tres=alloc_tres,
        req_tres=req_tres,
        alloc_cpus=alloc_cpus,
        req_mem_bytes=_req_mem_bytes(row["ReqMem"], req_tres.mem_bytes, alloc_cpus, nodes),
        max_rss_bytes=max(rss_values) if rss_values else None,
        total_cpu_s=total_cpu,
        elapsed_s=elapsed,
        time_limit_s=_time_limit_s(row["TimelimitRaw"], row["Timelimit"]),
        submit_s=_epoch(row["Submit"]),
        start_s=_epoch(row["Start"]),
        end_s=_epoch(row["End"]),
        restarts=restarts,
        comment=_opt_text(text.comment, COMMENT_MAX_LEN) if text else None,
        admin_comment=_opt_str(row["AdminComment"]),
        mail_user=None,
        mail_type=None,
        steps=tuple(_to_step(step) for step in run.steps),
        reason=_opt_str(row.get("Reason", "")),
        submit_line=_opt_text(text.submit_line, SUBMIT_LINE_MAX_LEN) if text else None,
    )


def _to_step(row: Mapping[str, str]) -> JobStep:
    """One step line of the accounting query (fields no user can type; never the step name)."""
    state, cancelled_by = parse_state(row["State"])
    exit_code, exit_signal = parse_exit(row["ExitCode"])
    elapsed = _opt_int(row["ElapsedRaw"])
    if elapsed is None:
        elapsed = int(parse_duration(row["Elapsed"]) or 0)
    return JobStep(
        step_id=row["JobIDRaw"].split(".", 1)[1],
        cpus=_opt_int(row["AllocCPUS"]),
        gpus=parse_tres(row["AllocTRES"]).gpus,
        nodes=_opt_int(row["NNodes"]),
        state=state,
        exit_code=exit_code,
        exit_signal=exit_signal,
        elapsed_s=elapsed,
        total_cpu_s=parse_duration(row["TotalCPU"]),
        tasks=_opt_int(row.get("NTasks", "")),
        end_s=_epoch(row["End"]),
        cancelled_by_uid=cancelled_by,
    )


def _opt_text(value: str, max_len: int) -> str | None:
    """A user string: ``None`` for sacct's "nothing" spellings, else cleaned and bounded."""
    return None if value in _UNKNOWN else clean_user_text(value, max_len)


# --------------------------------------------------------------------------- the source


def build_argv(
    sacct_path: str,
    *,
    job_ids: Sequence[str] = (),
    start_s: float | None = None,
    end_s: float | None = None,
    users: Sequence[str] | None = None,
    fields: Sequence[str] = FIELDS,
    delimiter: str = DELIM,
    allocations: bool = False,
) -> list[str]:
    """The sacct command line for one query, asking for ``fields`` framed by ``delimiter``;
    ``allocations``: job lines only, no steps (the text query)."""
    argv = [
        sacct_path,
        "--parsable2",
        "--noheader",
        f"--delimiter={delimiter}",
        "--duplicates",
        "--format=" + ",".join(fields),
    ]
    if allocations:
        argv.append("--allocations")
    if job_ids:
        argv.append("--jobs=" + ",".join(job_ids))
    if start_s is not None:
        argv.append(f"--starttime={_sacct_time(start_s)}")
    if end_s is not None:
        argv.append(f"--endtime={_sacct_time(end_s)}")
    if users:
        argv.append("--user=" + ",".join(users))
    elif not job_ids:
        argv.append("--allusers")
    return argv


def _sacct_time(epoch_s: float) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(int(epoch_s)))


#: Environment for every sacct call: epoch times (``--format`` already overrides any
#: ``SACCT_FORMAT`` a user set).
SACCT_ENV: Mapping[str, str] = {"SLURM_TIME_FORMAT": "%s", "LC_ALL": "C.UTF-8"}

#: Display ids ``sacct --batch-script`` accepts: a job, an array task or a het component.
_SCRIPT_ID_RE = re.compile(r"\d+(?:_\d+|\+\d+)?")
#: ``sacct --batch-script`` calls (one per user of a batch) run at once.
_SCRIPT_CALLS_AT_ONCE = 4

#: Runs of the query pair when the text query does not match the accounting query (a job
#: that changed between the two: a new run, an array task that started).
_ATTEMPTS = 2


class SacctSource:
    """``AccountingSource`` backed by the ``sacct`` command.

    ``runner`` runs the command (tests inject recorded output); ``batch_size`` bounds the
    number of job ids in one call; ``omit`` leaves fields of ``OMITTABLE`` out of every query
    (their record fields are ``None``), for callers that do not use them (``gpueff``: QOS).
    Each batch is two sacct calls: the accounting query and the text query (module docstring).
    ``overlap_text``: run the two at once, for a caller a person waits on (``gpueff``: one
    slurmdbd round trip of wall time instead of two, about 0.1 s each); by default the text
    query follows the accounting query and is skipped when it returned nothing, so the
    collector's empty windows cost one process.
    ``batch_scripts``: also read each job's ``#SBATCH`` lines (``batchscript``) with one
    ``sacct --batch-script`` call per user of the batch (one user's script can then name only
    that user's jobs); a failed or empty answer leaves ``batch_directives`` ``None``.
    """

    name = "sacct"

    def __init__(
        self,
        *,
        sacct_path: str = "sacct",
        timeout_s: float = 60.0,
        batch_size: int = 500,
        runner: CommandRunner | None = None,
        omit: Iterable[str] = (),
        overlap_text: bool = False,
        batch_scripts: bool = False,
    ) -> None:
        self.fields = fields_without(omit)
        self.overlap_text = overlap_text
        self.batch_scripts = batch_scripts
        self.sacct_path = sacct_path
        self.timeout_s = timeout_s
        self.batch_size = max(1, batch_size)
        self.runner: CommandRunner = runner or SubprocessRunner()
        self.last_skipped = 0
        """Malformed or refused records skipped by the last query (for the collector's log)."""
        self.last_rejected: dict[str, str] = {}
        """Raw job id -> why its record was refused, for the last query."""
        self.last_text_dropped = 0
        """Jobs of the last query whose user strings were dropped (text query did not match)."""

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, JobRecord]:
        """See ``AccountingSource.get_jobs``: two sacct calls per ``batch_size`` ids."""
        queries = list(dict.fromkeys(parse_job_id(j).query for j in job_ids))
        out: dict[str, JobRecord] = {}
        results = [self._query(job_ids=chunk) for chunk in _chunks(queries, self.batch_size)]
        for result in results:
            out.update(result.jobs)
        self._note(results)
        return out

    def jobs_between(
        self, start_s: float, end_s: float, users: Sequence[str] | None = None
    ) -> list[JobRecord]:
        """See ``AccountingSource.jobs_between``."""
        result = self._query(start_s=start_s, end_s=end_s, users=users)
        self._note([result])
        return sorted(result.jobs.values(), key=lambda j: (j.submit_s or 0.0, int(j.job_id)))

    def _note(self, results: Sequence[ParseResult]) -> None:
        self.last_skipped = sum(r.skipped for r in results)
        self.last_rejected = {k: v for r in results for k, v in r.rejected.items()}
        self.last_text_dropped = sum(len(r.jobs) for r in results if not r.text_verified)

    def _query(
        self,
        *,
        job_ids: Sequence[str] = (),
        start_s: float | None = None,
        end_s: float | None = None,
        users: Sequence[str] | None = None,
    ) -> ParseResult:
        """The accounting query, then the text query for the same selection; both again once
        when the text does not match."""

        def argv(fields: Sequence[str], delimiter: str = DELIM, text: bool = False) -> list[str]:
            return build_argv(
                self.sacct_path,
                job_ids=job_ids,
                start_s=start_s,
                end_s=end_s,
                users=users,
                fields=fields,
                delimiter=delimiter,
                allocations=text,
            )

        result = ParseResult()
        for _ in range(_ATTEMPTS):
            delimiter = text_delimiter()
            text_argv = argv(TEXT_FIELDS, delimiter, text=True)
            if self.overlap_text:
                main, text = self._run_pair(argv(self.fields), text_argv)
            else:
                main = self._run(argv(self.fields))
                if not split_records(_decode(main), self.fields)[0]:
                    return parse_sacct_output(main, self.fields)  # nothing to name: one call
                text = self._run(text_argv)
            result = parse_sacct_output(main, self.fields, text=text, text_delimiter=delimiter)
            if result.text_verified:
                break
        if self.batch_scripts and result.jobs:
            self._attach_directives(result.jobs)
        return result

    def _attach_directives(self, jobs: dict[str, JobRecord]) -> None:
        """Set ``batch_directives`` on the jobs whose script accounting keeps (in place).

        Jobs whose steps show no batch step (``srun``, ``salloc``) are not asked about. The
        per-user calls run ``_SCRIPT_CALLS_AT_ONCE`` at a time: on a batch of many users each
        costs a slurmdbd round trip (0.09 s on the test cluster)."""
        by_user: dict[str, list[str]] = {}
        for raw_id, job in jobs.items():
            if job.steps and not any(st.step_id == "batch" for st in job.steps):
                continue
            if not _SCRIPT_ID_RE.fullmatch(job.job_id_display):
                continue  # "121_[4-49]": array tasks that never started (sacct refuses it)
            by_user.setdefault(job.user, []).append(raw_id)
        calls = [
            {jobs[r].job_id_display: r for r in chunk}
            for raw_ids in by_user.values()
            for chunk in _chunks(raw_ids, self.batch_size)
        ]
        if not calls:
            return
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(_SCRIPT_CALLS_AT_ONCE, len(calls))) as pool:
            answers = list(pool.map(self._scripts, calls))
        for shown, scripts in zip(calls, answers, strict=True):
            for display, directives in scripts.items():
                raw = shown[display]
                jobs[raw] = replace(jobs[raw], batch_directives=directives)

    def _scripts(self, shown: dict[str, str]) -> dict[str, str]:
        """Display id -> the directives of its script, for one call's jobs (display id -> raw
        id); ``{}`` when the call fails: the style stays unknown and the advice uses the usual
        forms. sacct heads each script with the display id (``158_2`` for an array task,
        whose raw id would select the whole array)."""
        argv = [self.sacct_path, "--batch-script", "--jobs=" + ",".join(shown)]
        try:
            done = self.runner(
                argv, env=SACCT_ENV, timeout_s=self.timeout_s, max_stdout=MAX_SCRIPT_OUTPUT
            )
        except AccountingError:
            return {}
        if done.returncode != 0:
            # sacct gives up on the whole list for one id it refuses ("Bad job array element
            # specified"): ask each half, so one odd job costs a few calls, not the batch.
            if len(shown) == 1 or "job" not in done.stderr.lower():
                return {}
            items = list(shown.items())
            half = len(items) // 2
            return {**self._scripts(dict(items[:half])), **self._scripts(dict(items[half:]))}
        out = {}
        for display, script in split_scripts(_decode(done.stdout), list(shown)).items():
            directives = directives_of(script)
            if directives is not None:
                out[display] = directives
        return out

    def _run_pair(self, main_argv: list[str], text_argv: list[str]) -> tuple[bytes, bytes]:
        """Both queries at once: the text query in the background, the accounting query here.
        The accounting query's error wins; the text query is always waited for, so no sacct is
        left running."""
        from slurm_gpu.background import InBackground

        text = InBackground(lambda: self._run(text_argv), name="sacct-text")
        try:
            main = self._run(main_argv)
        except BaseException:
            with contextlib.suppress(BaseException):
                text.result()
            raise
        return main, text.result()

    def _run(self, argv: list[str]) -> bytes:
        done = self.runner(argv, env=SACCT_ENV, timeout_s=self.timeout_s)
        if done.returncode != 0:
            raise AccountingError(
                f"sacct failed (exit {done.returncode}): {_telling_line(done.stderr)}",
                stderr=done.stderr,
                hint=_hint_for(done.stderr),
            )
        return done.stdout


def _chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


#: Words of the line that names why a Slurm command failed, in the order they are looked
#: for: Slurm often prints a consequence first ("If munged is up, restart with
#: --num-threads=10") and the cause on a later line.
_CAUSE_WORDS = ("munge encode failed", "munge decode failed", "connection refused")

#: The prefix each of sacct's error lines carries, left out of the message that names sacct.
_PREFIX = re.compile(r"^sacct: (?:error|fatal): ")


def _telling_line(stderr: str) -> str:
    """The line of ``stderr`` that names the cause (``_CAUSE_WORDS``), else its first one;
    sacct's own prefix left out, cleaned for a terminal (``clean_user_text``)."""
    lines = [_PREFIX.sub("", line.strip()) for line in stderr.splitlines() if line.strip()]
    found = next((ln for w in _CAUSE_WORDS for ln in lines if w in ln.lower()), None)
    return clean_user_text(found or (lines[0] if lines else "no message"), 300)


def _hint_for(stderr: str) -> str:
    lowered = stderr.lower()
    if "munge" in lowered:
        return (
            "munged on this host is not running or not answering, so no Slurm command can "
            "authenticate; the site's admins must start it (systemctl status munge)"
        )
    if "connection refused" in lowered or "unable to connect" in lowered or "slurmdbd" in lowered:
        return "slurmdbd is not answering: check that it runs (sacctmgr ping) and retry"
    if "invalid" in lowered and "field" in lowered:
        return "this sacct does not know a field we ask for; report the Slurm version"
    if "configuration" in lowered:
        return "sacct cannot read slurm.conf: check SLURM_CONF and the Slurm client install"
    return "run the sacct command by hand to see what is wrong"
