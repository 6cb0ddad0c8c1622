"""The per-job spool on a compute node: paths, formats, readers and atomic writers.

Layout (``JobSpool``)::

    <spool_dir>/<job_id>/              root, 0700 (the spool root too)
        <host>.jsonl                   samples: a header line, then one line per reading time
        <host>.pid                     the sampler's pid and start time
        <host>.state                   checkpoint: aggregates + byte offset into the jsonl
        <host>.record                  the sealed NodeRecord (atomic rename), root 0600
    <spool_dir>-live/<job_id>/<host>.json
                                       small live summary: root's, group the job user's
                                       private group, 0440 (``livefile``)

Spool lines (JSON Lines, one object per line, ``\\n``-terminated), version 2 (columnar)::

    {"schema": "slurm-gpu/spool", "version": 2, "job_id": "42", "hostname": "n1", "uid": 1001,
     "interval_s": 10.0, "source": "nvml", "gpus": [GpuInfo...], "started_s": 1763719200.0,
     "sample_fields": ["available", "utilization_pct", ...], "host_fields": ["cpu_time_s", ...]}
    {"t": 1763719210.0, "g": [[value per sample field], ... one array per GPU in header order],
     "h": [value per host field]}

The field names are written once, in the header; a GPU's array holds every ``GpuSample``
field but ``uuid`` and ``time_s`` in the order of ``sample_fields`` (processes as
``[pid, used_memory_bytes]`` pairs), ``h`` the ``HostSample`` fields in the order of
``host_fields`` and is left out when the host could not be read. Version 1 (one object per
GPU sample, fields at their default left out) is still read, and a writer appending to a
version 1 file goes on in version 1. A reader rejects an unknown schema or version with
``SpoolFormatError`` and ignores a truncated last line (a crash mid-write), reporting
``truncated=True``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import operator
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import ne
from typing import Any

from slurm_gpu.capture import fastjson
from slurm_gpu.capture.recordcodec import (
    from_jsonable,
    timeline_from_columns,
    timeline_to_columns,
    to_jsonable,
)

# Paths, atomic writes and pid files live in ``spoolpaths`` (light, for the epilog); they are
# re-exported here so that ``slurm_gpu.capture.spool`` stays the one module the other parts import.
from slurm_gpu.capture.spoolpaths import _JOB_ID_RE, _write_all
from slurm_gpu.capture.spoolpaths import FILE_MODE as FILE_MODE
from slurm_gpu.capture.spoolpaths import JOB_DIR_MODE as JOB_DIR_MODE
from slurm_gpu.capture.spoolpaths import LIVE_GROUP_MODE as LIVE_GROUP_MODE
from slurm_gpu.capture.spoolpaths import LIVE_MAX_BYTES as LIVE_MAX_BYTES
from slurm_gpu.capture.spoolpaths import LIVE_MODE as LIVE_MODE
from slurm_gpu.capture.spoolpaths import JobSpool as JobSpool
from slurm_gpu.capture.spoolpaths import check_hostname as check_hostname
from slurm_gpu.capture.spoolpaths import check_job_id as check_job_id
from slurm_gpu.capture.spoolpaths import process_start_ticks as process_start_ticks
from slurm_gpu.capture.spoolpaths import read_pidfile as read_pidfile
from slurm_gpu.capture.spoolpaths import write_atomic as write_atomic
from slurm_gpu.capture.spoolpaths import write_pidfile as write_pidfile
from slurm_gpu.errors import SpoolFormatError
from slurm_gpu.records import GpuInfo, GpuProcess, GpuSample, HostSample, NodeRecord

SPOOL_SCHEMA = "slurm-gpu/spool"
#: Version 2 writes each GPU sample as an array of values in the header's field order;
#: version 1 (an object per sample) is still read.
SPOOL_VERSION = 2
SPOOL_VERSIONS_READ = (1, 2)
RECORD_SCHEMA = "slurm-gpu/node-record"
#: Version 2 stores the timeline as columns (``recordcodec.timeline_to_columns``); version 1
#: (a list of point objects) is still read.
RECORD_VERSION = 2
RECORD_VERSIONS_READ = (1, 2)
STATE_SCHEMA = "slurm-gpu/sampler-state"
STATE_VERSION = 1


# --------------------------------------------------------------------------- spool lines

#: GpuSample fields a spool line carries (uuid and time come from the header and the line),
#: with their defaults (version 1 leaves out a field at its default).
_SAMPLE_FIELDS = tuple(
    (f.name, f.default) for f in dataclasses.fields(GpuSample) if f.name not in ("uuid", "time_s")
)
#: The order of a GPU's values in a version 2 line, as this version writes it.
SAMPLE_FIELDS = tuple(name for name, _default in _SAMPLE_FIELDS)
#: The order of the host values in a version 2 line, as this version writes it.
HOST_FIELDS = tuple(f.name for f in dataclasses.fields(HostSample) if f.name != "time_s")
_REQUIRED = {
    cls: frozenset(
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.name not in ("uuid", "time_s")
    )
    for cls in (GpuSample, HostSample)
}


@dataclass(frozen=True, slots=True)
class SpoolHeader:
    """The first line of a spool file."""

    job_id: str
    hostname: str
    uid: int | None
    interval_s: float
    source: str
    gpus: tuple[GpuInfo, ...]
    started_s: float
    version: int = SPOOL_VERSION
    """Format of the reading lines that follow (one of ``SPOOL_VERSIONS_READ``)."""
    sample_fields: tuple[str, ...] = SAMPLE_FIELDS
    """Version 2: the ``GpuSample`` field at each position of a GPU's array; empty in 1."""
    host_fields: tuple[str, ...] = HOST_FIELDS
    """Version 2: the ``HostSample`` field at each position of ``h``; empty in 1."""


@dataclass(frozen=True, slots=True)
class Reading:
    """One spool line: every GPU's sample and the host sample at one time."""

    time_s: float
    gpus: tuple[GpuSample, ...]
    host: HostSample | None


def encode_header(header: SpoolHeader) -> bytes:
    """The header line (with its newline) of a spool in ``header.version``."""
    body = {"schema": SPOOL_SCHEMA, "version": header.version, **to_jsonable(header)}
    if header.version == 1:
        del body["sample_fields"], body["host_fields"]
    return (json.dumps(body, separators=(",", ":")) + "\n").encode()


def decode_header(line: bytes) -> SpoolHeader:
    """Parse a header line of any version in ``SPOOL_VERSIONS_READ``; ``SpoolFormatError``
    otherwise, or when a version 2 header names a field this version does not know."""
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise SpoolFormatError(f"spool header is not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != SPOOL_SCHEMA:
        raise SpoolFormatError(
            "not a slurm-gpu spool file", hint=f"the first line must have schema {SPOOL_SCHEMA}"
        )
    version = data.get("version")
    if version not in SPOOL_VERSIONS_READ or isinstance(version, bool):
        raise SpoolFormatError(
            f"spool version {version!r} is not supported (this reader knows "
            f"{', '.join(map(str, SPOOL_VERSIONS_READ))})",
            hint="upgrade slurm-gpu on this host to read it",
        )
    del data["schema"]
    if version == 1:
        data["sample_fields"] = data["host_fields"] = []
    else:
        for key, known, cls in (
            ("sample_fields", SAMPLE_FIELDS, GpuSample),
            ("host_fields", HOST_FIELDS, HostSample),
        ):
            names = data.get(key)
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise SpoolFormatError(f"spool header: {key} must be a list of field names")
            if not set(names) <= set(known) or len(set(names)) != len(names):
                raise SpoolFormatError(
                    f"spool header: {key} names fields this reader does not know",
                    hint="upgrade slurm-gpu on this host to read it",
                )
            if not _REQUIRED[cls] <= set(names):
                raise SpoolFormatError(f"spool header: {key} lacks a required field")
    try:
        return from_jsonable(SpoolHeader, data)
    except (ValueError, TypeError) as exc:
        raise SpoolFormatError(f"bad spool header: {exc}") from None


def _values_of(names: Sequence[str]) -> Callable[[Any], tuple[Any, ...]]:
    """A C-level getter of the attributes ``names`` as one tuple (``attrgetter`` returns a
    bare value for one name)."""
    if len(names) > 1:
        return operator.attrgetter(*names)
    return lambda obj: tuple(getattr(obj, n) for n in names)


def _process_pair(obj: Any) -> list[Any]:
    # The C encoder calls this for every object it does not know: in a version 2 line only
    # the GpuProcess entries of ``processes`` (the rest are tuples, numbers, None and bools).
    if type(obj) is GpuProcess:
        return [obj.pid, obj.used_memory_bytes]
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


LineEncoder = Callable[[float, Sequence[GpuSample], HostSample | None], bytes]


def _make_dumps(default: Callable[[Any], Any]) -> Callable[[Any], str]:
    # The C encoder made once, instead of at every ``JSONEncoder.encode`` call, and without
    # the circular-reference check (a spool line is a tree built here): the same text as
    # ``json.dumps(body, separators=(",", ":"), default=default)``.
    c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
    if c_make_encoder is None:
        return json.JSONEncoder(separators=(",", ":"), default=default).encode
    encoder = c_make_encoder(
        None,  # markers: no circular check
        default,
        json.encoder.encode_basestring_ascii,
        None,  # indent
        ":",
        ",",
        False,  # sort_keys
        False,  # skipkeys
        True,  # allow_nan
    )
    join = "".join

    def dumps(obj: Any) -> str:
        return join(encoder(obj, 0))

    return dumps


_dumps = _make_dumps(json.JSONEncoder().default)
_dumps_v2 = _make_dumps(_process_pair)


def _columnar_encoder(sample_fields: Sequence[str], host_fields: Sequence[str]) -> LineEncoder:
    """Version 2 lines in the given field orders."""
    sample_values = _values_of(sample_fields)
    host_values = _values_of(host_fields)
    dumps = _dumps_v2

    def encode(time_s: float, gpus: Sequence[GpuSample], host: HostSample | None) -> bytes:
        # Every GPU's values in one C call each, written by the C encoder: no Python per
        # field and no dict per sample (the field names are in the header).
        body: dict[str, Any] = {"t": time_s, "g": list(map(sample_values, gpus))}
        if host is not None:
            body["h"] = host_values(host)
        return (dumps(body) + "\n").encode()

    return encode


#: One version 2 spool line (with its newline) in ``SAMPLE_FIELDS``/``HOST_FIELDS`` order.
#: GPU samples must follow the header's GPU order.
encode_reading: LineEncoder = _columnar_encoder(SAMPLE_FIELDS, HOST_FIELDS)


# Version 1: an object per GPU sample, fields at their default left out.
_SAMPLE_DEFAULTS = tuple(default for _name, default in _SAMPLE_FIELDS)
_sample_values = operator.attrgetter(*SAMPLE_FIELDS)
_host_values = operator.attrgetter(*HOST_FIELDS)
_PROCESSES = SAMPLE_FIELDS.index("processes")


def _process_dicts(procs: Sequence[Any]) -> list[dict[str, Any]]:
    return [
        {"pid": p.pid}
        if p.used_memory_bytes is None
        else {"pid": p.pid, "used_memory_bytes": p.used_memory_bytes}
        for p in procs
    ]


def _sample_dict(sample: GpuSample) -> dict[str, Any]:
    # The fields are taken in one C call and the ones at their default (None, True, ())
    # dropped by compress/map/ne, all in C. ``value != default`` keeps the same fields as
    # ``value is not default and value != default`` for these defaults.
    values = _sample_values(sample)
    d = dict(compress(zip(SAMPLE_FIELDS, values, strict=True), map(ne, values, _SAMPLE_DEFAULTS)))
    if values[_PROCESSES]:
        d["processes"] = _process_dicts(values[_PROCESSES])
    return d


def encode_reading_v1(time_s: float, gpus: Sequence[GpuSample], host: HostSample | None) -> bytes:
    """One version 1 spool line (an object per GPU sample, defaults left out), for a writer
    that appends to a spool begun in version 1."""
    body: dict[str, Any] = {"t": time_s, "g": list(map(_sample_dict, gpus))}
    if host is not None:
        body["h"] = dict(zip(HOST_FIELDS, _host_values(host), strict=True))
    return (_dumps(body) + "\n").encode()


def line_encoder(header: SpoolHeader) -> LineEncoder:
    """The encoder of reading lines that fit ``header`` (its version and field orders)."""
    if header.version == 1:
        return encode_reading_v1
    if header.sample_fields == SAMPLE_FIELDS and header.host_fields == HOST_FIELDS:
        return encode_reading
    return _columnar_encoder(header.sample_fields, header.host_fields)


def _row(values: Any, names: Sequence[str], what: str) -> dict[str, Any]:
    if not isinstance(values, list) or len(values) != len(names):
        raise ValueError(f"{what}: expected a list of {len(names)} values")
    return dict(zip(names, values, strict=True))


def _process_object(pair: Any) -> dict[str, Any]:
    if not isinstance(pair, list) or len(pair) != 2:
        raise ValueError("processes: expected [pid, used_memory_bytes] pairs")
    return {"pid": pair[0], "used_memory_bytes": pair[1]}


def _sample_from_row(values: Any, header: SpoolHeader, uuid: str, time_s: float) -> GpuSample:
    d = _row(values, header.sample_fields, "GPU sample")
    procs = d.get("processes")
    if isinstance(procs, list):
        d["processes"] = [_process_object(p) for p in procs]
    d["uuid"], d["time_s"] = uuid, time_s
    return from_jsonable(GpuSample, d)


def decode_reading(line: bytes, header: SpoolHeader) -> Reading:
    """Parse one spool line of ``header``'s version; ``SpoolFormatError`` when it does not
    fit the header."""
    try:
        data = json.loads(line)
        t = float(data["t"])
        raw = data["g"]
        if len(raw) != len(header.gpus):
            raise ValueError("GPU count differs from the header")
        host: HostSample | None = None
        if header.version == 1:
            gpus = tuple(
                from_jsonable(GpuSample, {**d, "uuid": info.uuid, "time_s": t})
                for d, info in zip(raw, header.gpus, strict=True)
            )
            if "h" in data:
                host = from_jsonable(HostSample, {**data["h"], "time_s": t})
        else:
            gpus = tuple(
                _sample_from_row(values, header, info.uuid, t)
                for values, info in zip(raw, header.gpus, strict=True)
            )
            if "h" in data:
                h = _row(data["h"], header.host_fields, "host sample")
                host = from_jsonable(HostSample, {**h, "time_s": t})
    except (ValueError, KeyError, TypeError) as exc:
        raise SpoolFormatError(f"bad spool line: {exc}") from None
    return Reading(time_s=t, gpus=gpus, host=host)


class SpoolWriter:
    """Appends to a spool file: the header once, then a line per reading, flushed each time.

    fsync only happens at ``sync()`` (checkpoints) to keep the per-reading cost low. A file
    that already has a header (a sampler restarted for the same job) is continued in that
    header's format, so that one file never mixes versions.
    """

    def __init__(self, path: str, header: SpoolHeader) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, FILE_MODE)
        try:
            os.fchmod(self._fd, FILE_MODE)
            if os.fstat(self._fd).st_size == 0:
                _write_all(self._fd, encode_header(header))
            else:
                # Not readable as a header (torn, foreign): appended to as before.
                with contextlib.suppress(SpoolFormatError):
                    header, _offset = read_header(path)
        except BaseException:
            os.close(self._fd)
            raise
        self._encode = line_encoder(header)

    def append(self, time_s: float, gpus: Sequence[GpuSample], host: HostSample | None) -> None:
        """Write one line. Raises ``OSError`` (ENOSPC, EIO); a partial line may then remain,
        which readers ignore when it is the last."""
        line = self._encode(time_s, gpus, host)
        written = os.write(self._fd, line)
        if written != len(line):
            _write_all(self._fd, line[written:])  # a short write: the rest, or the error

    def sync(self) -> int:
        """fsync and return the file size: the offset a checkpoint may resume from."""
        os.fsync(self._fd)
        return os.fstat(self._fd).st_size

    def size(self) -> int:
        """Bytes written so far (no fsync)."""
        return os.fstat(self._fd).st_size

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


@dataclass(frozen=True, slots=True)
class SpoolContents:
    header: SpoolHeader
    readings: tuple[Reading, ...]
    truncated: bool
    """The last line was incomplete or unparsable and was ignored."""


def iter_readings(
    path: str, header: SpoolHeader, offset: int
) -> Iterator[tuple[Reading | None, int]]:
    """Yield (reading, end offset) for complete lines from ``offset``; a final incomplete or
    corrupt line yields (None, offset of its start) and stops."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        pos = offset
        for line in fh:
            if not line.endswith(b"\n"):
                yield None, pos
                return
            try:
                reading = decode_reading(line, header)
            except SpoolFormatError:
                # A torn write followed by a later line can leave garbage mid-file; skip it.
                pos += len(line)
                continue
            pos += len(line)
            yield reading, pos


def read_header(path: str) -> tuple[SpoolHeader, int]:
    """The header and the offset of the first reading line."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline()
    except OSError as exc:
        raise SpoolFormatError(f"{path}: cannot read ({exc.strerror})") from None
    if not first.endswith(b"\n"):
        raise SpoolFormatError(f"{path}: no complete header line")
    return decode_header(first), len(first)


def read_spool(path: str) -> SpoolContents:
    """Read a whole spool file (tests and tools; the epilog reads only the tail)."""
    header, offset = read_header(path)
    readings = []
    truncated = False
    for reading, _end in iter_readings(path, header, offset):
        if reading is None:
            truncated = True
        else:
            readings.append(reading)
    return SpoolContents(header=header, readings=tuple(readings), truncated=truncated)


# --------------------------------------------------------------------------- sealed record


def encode_record(record: NodeRecord) -> bytes:
    """The sealed record file's bytes (current version: columnar timeline)."""
    body: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if f.name == "stacks" and value is None:
            # Left out when off: such a record is byte for byte what earlier releases wrote,
            # and a collector of an earlier release still reads it.
            continue
        if f.name == "timeline":
            # Columns when the per-GPU tuples are rectangular (always, from the aggregator);
            # otherwise the row form, which the reader also takes.
            columns = timeline_to_columns(value)
            body[f.name] = columns if columns is not None else to_jsonable(value)
        else:
            body[f.name] = to_jsonable(value)
    wrapped = {"schema": RECORD_SCHEMA, "version": RECORD_VERSION, "record": body}
    return json.dumps(wrapped, separators=(",", ":")).encode()


def decode_record(data: bytes, *, where: str = "record") -> NodeRecord:
    """Parse a sealed record of any version in ``RECORD_VERSIONS_READ``; ``SpoolFormatError``
    when it is not one."""
    try:
        body = fastjson.loads(data)
    except ValueError as exc:
        raise SpoolFormatError(f"{where}: not JSON ({exc})") from None
    if not isinstance(body, dict) or body.get("schema") != RECORD_SCHEMA:
        raise SpoolFormatError(f"{where}: not a slurm-gpu node record")
    version = body.get("version")
    if version not in RECORD_VERSIONS_READ or isinstance(version, bool):
        raise SpoolFormatError(
            f"{where}: node record version {version!r} is not supported (this "
            f"reader knows {', '.join(map(str, RECORD_VERSIONS_READ))})",
            hint="upgrade slurm-gpu on the collector host",
        )
    try:
        raw = body.get("record")
        if isinstance(raw, dict) and isinstance(raw.get("timeline"), dict):
            # Columnar timeline (version 2): decoded by its specialised reader, the rest of
            # the record by the generic one.
            timeline = timeline_from_columns(raw["timeline"])
            record = from_jsonable(NodeRecord, {**raw, "timeline": []})
            return dataclasses.replace(record, timeline=timeline)
        return from_jsonable(NodeRecord, raw)
    except (ValueError, TypeError) as exc:
        raise SpoolFormatError(f"{where}: bad node record: {exc}") from None


def write_record(path: str, record: NodeRecord) -> None:
    """Seal: write the record atomically, root 0600. Raises ``OSError``."""
    write_atomic(path, encode_record(record), mode=FILE_MODE)


def read_record(path: str) -> NodeRecord:
    """Read a sealed record; ``SpoolFormatError`` when unreadable, corrupt or of an unknown
    version."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise SpoolFormatError(f"{path}: cannot read ({exc.strerror})") from None
    return decode_record(data, where=path)


@dataclass(frozen=True, slots=True)
class SealedRecord:
    job_id: str
    hostname: str
    path: str


def list_sealed(spool_dir: str) -> list[SealedRecord]:
    """Every sealed ``<job_id>/<host>.record`` under ``spool_dir``, oldest job id first.

    Entries that are not job directories are skipped; a missing spool dir gives an empty list.
    """
    out: list[SealedRecord] = []
    try:
        jobs = os.listdir(spool_dir)
    except OSError:
        return out
    for job in sorted((j for j in jobs if _JOB_ID_RE.match(j)), key=int):
        job_dir = os.path.join(spool_dir, job)
        try:
            names = os.listdir(job_dir)
        except OSError:
            continue
        for name in sorted(names):
            if name.endswith(".record") and not name.startswith("."):
                out.append(SealedRecord(job, name[: -len(".record")], os.path.join(job_dir, name)))
    return out


# --------------------------------------------------------------------------- checkpoint


def write_state(
    path: str, aggregates: dict[str, Any] | str, offset: int, notes: Sequence[str]
) -> None:
    """Write the sampler checkpoint atomically. ``offset`` is the jsonl size the aggregates
    include (readings after it must be folded on recovery). ``aggregates`` is the
    aggregator's state, or already its JSON text (``NodeAggregator.state_json``)."""
    body: dict[str, Any] = {
        "schema": STATE_SCHEMA,
        "version": STATE_VERSION,
        "offset": offset,
        "notes": list(notes),
    }
    if isinstance(aggregates, str):
        text = json.dumps(body, separators=(",", ":"))[:-1] + ',"aggregates":' + aggregates + "}"
    else:
        text = json.dumps({**body, "aggregates": aggregates}, separators=(",", ":"))
    write_atomic(path, text.encode(), mode=FILE_MODE)


def _read_versioned(path: str, schema: str, version: int, what: str) -> dict[str, Any]:
    """A small JSON file of ``schema`` at ``version``; ``SpoolFormatError`` naming ``what``
    when it is unreadable, not JSON, another kind of file or another version."""
    try:
        with open(path, "rb") as fh:
            body = json.loads(fh.read())
    except OSError as exc:
        raise SpoolFormatError(f"{path}: cannot read ({exc.strerror})") from None
    except ValueError as exc:
        raise SpoolFormatError(f"{path}: not JSON ({exc})") from None
    if not isinstance(body, dict) or body.get("schema") != schema:
        raise SpoolFormatError(f"{path}: not a {what}")
    if body.get("version") != version:
        raise SpoolFormatError(f"{path}: {what} version {body.get('version')!r} unknown")
    return body


def read_state(path: str) -> tuple[dict[str, Any], int, list[str]]:
    """(aggregates, offset, notes) from a checkpoint; ``SpoolFormatError`` if bad."""
    body = _read_versioned(path, STATE_SCHEMA, STATE_VERSION, "sampler checkpoint")
    try:
        return dict(body["aggregates"]), int(body["offset"]), [str(n) for n in body["notes"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise SpoolFormatError(f"{path}: bad checkpoint: {exc}") from None
